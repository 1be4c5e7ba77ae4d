//! An HTTP/1.1 server for the service's routers that cannot be held open by slow or idle
//! clients until the process runs out of descriptors.
//!
//! - **Connection cap**: at most [`ServeLimits::max_connections`] at once; one more is
//!   answered `503 Service Unavailable` with `Retry-After` and closed at once.
//! - **Header timeout**: a request's headers must arrive within
//!   [`ServeLimits::header_timeout`] (hyper's `header_read_timeout`).
//! - **Connection lifetime**: a keep-alive connection is closed gracefully after
//!   [`ServeLimits::max_connection_age`] (an idle one cannot sit on a slot for ever).
//! - **Accept errors** (out of descriptors) pause accepting briefly instead of spinning.
//!
//! The peer address reaches handlers as axum's `ConnectInfo<SocketAddr>`.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

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
}

impl Default for ServeLimits {
    /// 4,096 connections (raise the process's descriptor limit, `ulimit -n`, above it, or
    /// lower this), headers within 10 s, connections closed after 5 minutes.
    fn default() -> ServeLimits {
        ServeLimits {
            max_connections: 4096,
            header_timeout: Duration::from_secs(10),
            max_connection_age: Duration::from_secs(300),
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

    /// Sets the connection lifetime.
    pub fn max_connection_age(mut self, d: Duration) -> Self {
        self.max_connection_age = d;
        self
    }
}

const OVERLOADED: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Type: text/plain\r\nContent-Length: 40\r\nConnection: close\r\n\r\nthe server is at its connection limit.\r\n";

/// Serves `router` on `listener` until `shutdown` completes, then stops accepting and lets
/// the connections in flight finish their current request.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ServeLimits,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    serve_counted(listener, router, limits, shutdown, None).await
}

pub(crate) async fn serve_counted(
    listener: TcpListener,
    router: Router,
    limits: ServeLimits,
    shutdown: impl Future<Output = ()>,
    refused: Option<Arc<dyn Fn() + Send + Sync>>,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
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
        let Ok(permit) = Arc::clone(&slots).try_acquire_owned() else {
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
        let service = TowerToHyperService::new(
            router
                .clone()
                .layer(axum::Extension(ConnectInfo::<SocketAddr>(peer))),
        );
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
