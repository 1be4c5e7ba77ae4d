//! Shared helpers for the multicdn example programs.
#![forbid(unsafe_code)]
