//! An HTTP/1.1 server for the service's routers that cannot be held open by slow or idle
//! clients until the process runs out of descriptors.
//!
//! - **Connection cap**: at most [`ServeLimits::max_connections`] at once; one more is
//!   answered `503 Service Unavailable` with `Retry-After` and closed at once.
//! - **Per-client cap** (off unless set): at most [`ServeLimits::per_client`] connections from
//!   one address, so one host cannot take every slot. Set it where clients connect directly;
//!   behind a load balancer every connection comes from a few addresses, so leave it off there.
//! - **Header timeout**: a request's headers must arrive within
//!   [`ServeLimits::header_timeout`] (hyper's `header_read_timeout`).
//! - **Connection lifetime**: a keep-alive connection is closed gracefully after
//!   [`ServeLimits::max_connection_age`] (an idle one cannot sit on a slot for ever).
//! - **Accept errors** (out of descriptors) pause accepting briefly instead of spinning.
//!
//! The peer address reaches handlers as axum's `ConnectInfo<SocketAddr>`.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use std::convert::Infallible;
use std::pin::Pin;

use axum::Router;
use axum::extract::ConnectInfo;
use axum::http::Request;
use axum::response::Response;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower::ServiceExt;

use super::receiver;

/// The server's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServeLimits {
    /// Connections open at once.
    pub max_connections: usize,
    /// Time for a request's headers to arrive.
    pub header_timeout: Duration,
    /// Age after which a connection is closed gracefully.
    pub max_connection_age: Duration,
    /// Connections open at once from one address (`None`: no cap of its own).
    pub per_client: Option<usize>,
}

impl Default for ServeLimits {
    /// 4,096 connections (raise the process's descriptor limit, `ulimit -n`, above it, or
    /// lower this), headers within 10 s, connections closed after 5 minutes, no per-client cap.
    fn default() -> ServeLimits {
        ServeLimits {
            max_connections: 4096,
            header_timeout: Duration::from_secs(10),
            max_connection_age: Duration::from_secs(300),
            per_client: None,
        }
    }
}

impl ServeLimits {
    /// Sets the connection cap.
    pub fn max_connections(mut self, n: usize) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// Sets the header timeout.
    pub fn header_timeout(mut self, d: Duration) -> Self {
        self.header_timeout = d;
        self
    }

    /// Caps the connections from one address (at least 1). A browser opens at most six to an
    /// origin; a carrier-grade NAT puts many users behind one address, so leave room.
    pub fn per_client_connections(mut self, n: usize) -> Self {
        self.per_client = Some(n.max(1));
        self
    }

    /// Sets the connection lifetime.
    pub fn max_connection_age(mut self, d: Duration) -> Self {
        self.max_connection_age = d;
        self
    }
}

const OVERLOADED: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Type: text/plain\r\nContent-Length: 40\r\nConnection: close\r\n\r\nthe server is at its connection limit.\r\n";

/// Connections open per client address, for the per-client cap.
#[derive(Debug, Default)]
struct PerClient(Mutex<HashMap<IpAddr, usize>>);

/// One connection counted against its address; uncounted when dropped.
struct ClientSlot {
    clients: Arc<PerClient>,
    ip: IpAddr,
}

impl PerClient {
    fn take(self: &Arc<Self>, ip: IpAddr, cap: usize) -> Option<ClientSlot> {
        let mut open = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let n = open.entry(ip).or_insert(0);
        if *n >= cap {
            return None;
        }
        *n += 1;
        Some(ClientSlot {
            clients: Arc::clone(self),
            ip,
        })
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut open = self
            .clients
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = open.get_mut(&self.ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// Serves `router` on `listener` until `shutdown` completes, then stops accepting and lets
/// the connections in flight finish their current request.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ServeLimits,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    serve_counted(listener, router, limits, shutdown, Hooks::default()).await
}

/// What [`super::Service::serve`] adds to [`serve`].
#[derive(Default)]
pub(crate) struct Hooks {
    /// Called for every connection refused at a cap.
    pub(crate) refused: Option<Arc<dyn Fn() + Send + Sync>>,
    /// The service whose beacon routes are answered directly, without the router (the same
    /// handler the router calls; its routing, boxing and the `ConnectInfo` extension cost
    /// more than the rest of a beacon's HTTP handling).
    pub(crate) beacons: Option<super::Service>,
}

/// One connection's service: the beacon routes directly, everything else through the
/// router with the peer's `ConnectInfo`.
#[derive(Clone)]
struct Connection {
    router: Router,
    peer: SocketAddr,
    beacons: Option<super::Service>,
}

type Answer = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

impl hyper::service::Service<Request<Incoming>> for Connection {
    type Response = Response;
    type Error = Infallible;
    type Future = Answer;

    fn call(&self, mut req: Request<Incoming>) -> Answer {
        if let Some(service) = &self.beacons
            && let Some(kind) = receiver::route_kind(req.uri().path())
        {
            let (service, peer) = (service.clone(), self.peer.ip());
            return Box::pin(async move { Ok(receiver::route(service, kind, peer, req).await) });
        }
        req.extensions_mut().insert(ConnectInfo(self.peer));
        Box::pin(self.router.clone().oneshot(req))
    }
}

pub(crate) async fn serve_counted(
    listener: TcpListener,
    router: Router,
    limits: ServeLimits,
    shutdown: impl Future<Output = ()>,
    hooks: Hooks,
) -> std::io::Result<()> {
    let Hooks { refused, beacons } = hooks;
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let clients = Arc::new(PerClient::default());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            biased;
            () = &mut shutdown => break,
            a = listener.accept() => a,
        };
        let (mut stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed; pausing");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let admitted = Arc::clone(&slots)
            .try_acquire_owned()
            .ok()
            .and_then(|permit| match limits.per_client {
                Some(cap) => clients
                    .take(peer.ip(), cap)
                    .map(|slot| (permit, Some(slot))),
                None => Some((permit, None)),
            });
        let Some((permit, client_slot)) = admitted else {
            if let Some(f) = &refused {
                f();
            }
            tokio::spawn(async move {
                let _ = tokio::time::timeout(Duration::from_secs(1), async {
                    let _ = stream.write_all(OVERLOADED).await;
                    let _ = stream.shutdown().await;
                })
                .await;
            });
            continue;
        };
        let _ = stream.set_nodelay(true);
        let service = Connection {
            router: router.clone(),
            peer,
            beacons: beacons.clone(),
        };
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .keep_alive(true);
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            let age = tokio::time::sleep(limits.max_connection_age);
            tokio::pin!(age);
            let mut closing = false;
            loop {
                tokio::select! {
                    r = &mut conn => {
                        if let Err(e) = r {
                            tracing::debug!(%peer, error = %e, "connection ended");
                        }
                        break;
                    }
                    () = &mut age, if !closing => {
                        closing = true;
                        conn.as_mut().graceful_shutdown();
                    }
                    _ = stop.changed(), if !closing => {
                        closing = true;
                        conn.as_mut().graceful_shutdown();
                    }
                }
            }
            drop(client_slot);
            drop(permit);
        });
    }
    let _ = stop_tx.send(true);
    // Wait for the connections to finish (each has its graceful shutdown).
    let _ = tokio::time::timeout(
        Duration::from_secs(10),
        slots.acquire_many(u32::try_from(limits.max_connections.max(1)).unwrap_or(u32::MAX)),
    )
    .await;
    Ok(())
}
