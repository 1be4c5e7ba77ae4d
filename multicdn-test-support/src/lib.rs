//! Loopback emulators of what multicdn talks to, for its tests, the quickstart and the tools:
//! one place, as strict as the vendors, so a test that passes here sends what the vendor
//! would accept.
//!
//! - [`EdgeServer`]: a CDN edge fronting the site, with the corner cases a probe must survive
//!   (a marker past the read limit, a hang, a redirect, a host-gated object), every request
//!   recorded, switchable into an incident ([`EdgeMode`]).
//! - [`PurgeApi`]: Fastly's and Cloudflare's purge endpoints on one port. Every route checks
//!   the method, the path, the auth header and the body's shape and limits, and answers a
//!   malformed request as the vendor does (400 with its error envelope); faults can be injected
//!   ([`Fault`]: a refused token, a 429, a 503, a request never answered).
//! - [`Ns1Api`]: NS1's record, data-source and feed endpoints, keeping the records it is sent,
//!   with `X-NSONE-Key` checked and NS1's error bodies.
//!
//! - [`config`]: stateful stubs of Fastly's service configuration and Cloudflare's rulesets,
//!   for the deploy tool.
//!
//! - [`NatsServer`]: not an emulator but the real `nats-server -js`, on its own port and store,
//!   stoppable and restartable mid-test.
//!
//! Every server binds an ephemeral port on 127.0.0.1 and stops when dropped.

#![forbid(unsafe_code)]

mod akamai;
pub mod config;
mod edge;
mod nats;
mod ns1;
mod purge;
mod serve;

pub use akamai::{AKAMAI_MAX_BODY, AkamaiApi, AkamaiPurge};
pub use edge::{EdgeMode, EdgeServer, MARKER, SITE, SeenRequest, page};
pub use nats::NatsServer;
pub use ns1::Ns1Api;
pub use purge::{CLOUDFLARE_MAX_ITEMS, FASTLY_MAX_KEYS, Fault, PurgeApi, PurgeLimits, PurgeStats};
