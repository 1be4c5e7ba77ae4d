//! The edge side of quality caps: a tower layer for the servers that deliver media segments
//! (an origin, a shield, an edge the team runs) that adds `CMSD-Dynamic` with the cap in force
//! to every response, and `Access-Control-Expose-Headers: CMSD-Dynamic` so that a player on
//! another origin may read it.
//!
//! What players do with it (checked against hls.js 1.x and dash.js 5.x):
//!
//! - **dash.js** acts on `mb` only with `streaming.cmsd.enabled` and
//!   `streaming.cmsd.abr.applyMb` set, and keeps the last `mb` it saw until it sees another:
//!   a cap is lifted by sending the top rung's `mb` ([`QualityCap::lift`] does), never by
//!   sending nothing. It applies `mb` only where its throughput rule decides: in the default
//!   dynamic strategy BOLA takes over once the buffer is up, with the representations it saw
//!   when it started, and ignores a cap that arrives meanwhile; run the throughput rule alone
//!   (`streaming.abr.rules.bolaRule.active: false`) where caps must bite. That rule decides
//!   nothing until dash.js has a throughput sample, and its XHR loader drops a sample that
//!   arrives in a single progress event (a whole segment in one read, as on loopback).
//!   After a lift it may hold the lower rung for several segments: its `SwitchHistoryRule`
//!   counts the capped drop as a drop.
//! - **hls.js** ignores CMSD; the shipped snippet `cmsd-hls.js` reads the header on each
//!   fragment and sets `hls.autoLevelCapping` to the highest level that fits (and lifts the
//!   capping when the header's `mb` reaches the top level).
//!
//! ```
//! use multicdn::service::cmsd::QualityCap;
//! use multicdn::steering::video::BitrateLadder;
//!
//! let cap = QualityCap::new("edge-sin-1", BitrateLadder::seed())?;
//! let app: axum::Router = axum::Router::new()
//!     .route("/seg/{n}", axum::routing::get(|| async { "segment bytes" }))
//!     .layer(cap.layer());
//! cap.cap_at("480p")?;      // players drop to 480p
//! assert_eq!(cap.header().as_deref(), Some("\"edge-sin-1\";mb=5000;du"));
//! cap.lift();               // and come back
//! assert_eq!(cap.header().as_deref(), Some("\"edge-sin-1\";mb=25000"));
//! # let _ = app;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::sync::{Arc, PoisonError, RwLock};

use axum::http::{HeaderName, HeaderValue};
use multicdn_steering::video::{BitrateLadder, QualityGovernor, cmsd_dynamic, cmsd_dynamic_lifted};
use tower::layer::util::Stack;
use tower_http::set_header::{MakeHeaderValue, SetResponseHeaderLayer};

/// Why a cap could not be set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CapError {
    /// The node name cannot be written in a structured field (printable ASCII only).
    #[error("node name {0:?} cannot be written in CMSD-Dynamic (printable ASCII only)")]
    Node(String),
    /// The ladder has no rung of that name.
    #[error("the ladder has no rung {rung:?} (it has {known})")]
    UnknownRung {
        /// The name asked for.
        rung: String,
        /// The rungs it has.
        known: String,
    },
}

#[derive(Debug)]
struct CapState {
    node: String,
    ladder: BitrateLadder,
    /// The `CMSD-Dynamic` value in force; `None` before any cap.
    value: Option<HeaderValue>,
}

/// The cap in force at one node, shared by the layer on every route and whoever decides it
/// (an operator, or a [`QualityGovernor`] via [`QualityCap::follow`]). Clones share it.
#[derive(Debug, Clone)]
pub struct QualityCap {
    state: Arc<RwLock<CapState>>,
}

fn value<E>(s: Result<String, E>, node: &str) -> Result<HeaderValue, CapError> {
    s.ok()
        .and_then(|v| HeaderValue::from_str(&v).ok())
        .ok_or_else(|| CapError::Node(node.to_owned()))
}

impl QualityCap {
    /// No cap yet at `node` (named in `CMSD-Dynamic`), over `ladder`.
    pub fn new(node: impl Into<String>, ladder: BitrateLadder) -> Result<QualityCap, CapError> {
        let node = node.into();
        // A node that cannot be written is refused now, not at the first cap.
        value(cmsd_dynamic(&node, 1), &node)?;
        Ok(QualityCap {
            state: Arc::new(RwLock::new(CapState {
                node,
                ladder,
                value: None,
            })),
        })
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, CapState> {
        self.state.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Caps players at the rung named `rung`: `CMSD-Dynamic: "<node>";mb=<its kbps>;du`.
    pub fn cap_at(&self, rung: &str) -> Result<(), CapError> {
        let mut s = self.write();
        let Some(i) = s.ladder.find(rung) else {
            return Err(CapError::UnknownRung {
                rung: rung.to_owned(),
                known: s
                    .ladder
                    .rungs()
                    .iter()
                    .map(|r| r.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        };
        let kbps = s.ladder.rung(i).map_or(0, |r| r.kbps);
        let v = value(cmsd_dynamic(&s.node, kbps), &s.node)?;
        s.value = Some(v);
        Ok(())
    }

    /// Lifts the cap: `CMSD-Dynamic: "<node>";mb=<the top rung's kbps>` from now on (a player
    /// holding the last `mb` it saw lifts only when it sees a new one).
    pub fn lift(&self) {
        let mut s = self.write();
        let top = s.ladder.rungs().first().map_or(0, |r| r.kbps);
        if let Ok(v) = value(cmsd_dynamic_lifted(&s.node, top), &s.node) {
            s.value = Some(v);
        }
    }

    /// Takes the cap `governor` decided (its [`QualityGovernor::headers`]).
    pub fn follow(&self, governor: &QualityGovernor) {
        let v = governor.headers().ok().and_then(|h| {
            h.into_iter()
                .find(|(k, _)| k == "CMSD-Dynamic")
                .and_then(|(_, v)| HeaderValue::from_str(&v).ok())
        });
        self.write().value = v;
    }

    /// The `CMSD-Dynamic` value in force, if any.
    pub fn header(&self) -> Option<String> {
        self.state
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .value
            .as_ref()
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    }

    /// The layer adding the cap to every response of the routes it wraps.
    pub fn layer(&self) -> CmsdLayer {
        Stack::new(
            SetResponseHeaderLayer::overriding(
                HeaderName::from_static("cmsd-dynamic"),
                CmsdValue(self.clone()),
            ),
            SetResponseHeaderLayer::appending(
                HeaderName::from_static("access-control-expose-headers"),
                HeaderValue::from_static("CMSD-Dynamic"),
            ),
        )
    }
}

/// The `CMSD-Dynamic` value of a [`QualityCap`], for tower-http's header layer.
#[derive(Debug, Clone)]
pub struct CmsdValue(QualityCap);

impl<T> MakeHeaderValue<T> for CmsdValue {
    fn make_header_value(&mut self, _: &T) -> Option<HeaderValue> {
        self.0
            .state
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .value
            .clone()
    }
}

/// What [`QualityCap::layer`] returns: `CMSD-Dynamic`, then the expose header.
pub type CmsdLayer = Stack<SetResponseHeaderLayer<CmsdValue>, SetResponseHeaderLayer<HeaderValue>>;
