//! # multicdn-health
//!
//! Observing CDN edges the way that catches real outages: HTTP content probes that fetch a real
//! object through each edge and check its content, observations from several regions meeting
//! in a quorum, hysteresis (fail fast, recover slow), a monitor loop the embedder drives, a
//! drift checker that compares edges, and a cache warmer gated on health.

#![forbid(unsafe_code)]
