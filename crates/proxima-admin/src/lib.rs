//! The admin HTTP server, on its own port so that it is never mixed with proxied
//! traffic:
//!
//! * `GET /metrics`: Prometheus text of the registry, plus routing-table gauges computed
//!   at scrape time (see [`gauges`]).
//! * `GET /healthz`: `200 ok` while the process serves (liveness).
//! * `GET /readyz`: `503` until discovery has synced once, then `200 ok` (readiness): a
//!   proxy with an empty table would answer every request with an error.
//! * `GET /debug/pools[?service=name.namespace]`: every service's QoS pool and why each
//!   endpoint is in or out, as pretty JSON (see [`proxima_core::explain`]).
//! * `GET /node/ping`, `PUT /node/usage`: this node's name and usage for peer proxies,
//!   when started with [`serve_with_node`] (see [`NodeEndpoints`]).
//!
//! ## Who may ask what
//!
//! `/metrics`, `/healthz` and `/readyz` answer anyone: the kubelet and Prometheus reach
//! them over the node network. `/debug/*` and `/node/*` show pod addresses, node names,
//! zones and node usage, and `PUT /node/usage` changes routing; with [`serve_with_access`]
//! they answer only a client that is on loopback, inside one of the
//! [`AdminAccess::trusted`] networks, or that sends `Authorization: Bearer <token>` with
//! the shared [`AdminAccess::token`] (compared in constant time). Others get `403`.
//! [`serve`] and [`serve_with_node`] trust every client: they are for embedding the admin
//! server in a closed network (the testbed).

#![warn(missing_docs)]

pub mod gauges;
mod handlers;

use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::{Request, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use proxima_core::Router;
use tokio::net::TcpListener;
use tower::ServiceBuilder;
use tower_http::body::Limited;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::timeout::TimeoutLayer;
use tracing::{debug, info, warn};

use crate::gauges::TableGauges;

/// Whether discovery has delivered a first full view. Cheap to clone; all clones share
/// one flag.
#[derive(Clone, Debug, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    /// Not synced yet: `/readyz` answers 503 until [`Readiness::mark_synced`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Discovery has synced: `/readyz` answers 200 from now on.
    pub fn mark_synced(&self) {
        self.0.store(true, Ordering::Release);
    }

    /// Whether discovery has synced (what `/readyz` reports).
    pub fn is_synced(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// What the admin server reports on.
#[derive(Debug)]
pub struct AdminState {
    /// The routing table `/debug/pools` explains and the gauges read.
    pub router: Arc<Router>,
    /// Every metric `/metrics` exposes (the proxy's, the nodes', the table gauges).
    pub registry: prometheus::Registry,
    /// Whether `/readyz` answers 200.
    pub readiness: Readiness,
}

/// The per-node endpoints (implemented by `proxima-nodes`): `GET /node/ping` answers
/// peers' latency probes with this node's usage, `PUT /node/usage` overrides that usage.
pub trait NodeEndpoints: Send + Sync + std::fmt::Debug {
    /// The JSON body of `GET /node/ping`; called on every probe, so it must be cheap.
    fn ping(&self) -> bytes::Bytes;
    /// Handle `PUT /node/usage` with `body`: the JSON reply, or a status and a message.
    fn put_usage(&self, body: &[u8]) -> Result<bytes::Bytes, (hyper::StatusCode, String)>;
}

/// Who may use `/debug/*` and `/node/*` (see the module docs).
#[derive(Clone, Debug, Default)]
pub struct AdminAccess {
    /// The shared token that opens them from anywhere, as `Authorization: Bearer <token>`.
    pub token: Option<String>,
    /// Networks (address and prefix length) trusted besides loopback.
    pub trusted: Vec<(IpAddr, u8)>,
    /// Trust every client (what [`serve`] and [`serve_with_node`] do).
    pub open: bool,
}

impl AdminAccess {
    /// Everyone may ask everything.
    pub fn open() -> Self {
        Self {
            open: true,
            ..Self::default()
        }
    }

    /// Whether a request from `peer` with this `authorization` header may use the
    /// private endpoints.
    pub fn allows(&self, peer: IpAddr, authorization: Option<&[u8]>) -> bool {
        let peer = peer.to_canonical();
        if self.open || peer.is_loopback() {
            return true;
        }
        if self
            .trusted
            .iter()
            .any(|(net, bits)| in_network(peer, *net, *bits))
        {
            return true;
        }
        match (&self.token, authorization) {
            (Some(token), Some(header)) => header
                .strip_prefix(b"Bearer ")
                .is_some_and(|given| same_secret(given, token.as_bytes())),
            _ => false,
        }
    }
}

/// Whether `addr` lies in `net`/`bits` (of the same address family).
pub fn in_network(addr: IpAddr, net: IpAddr, bits: u8) -> bool {
    match (addr, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let bits = u32::from(bits.min(32));
            let mask = u32::MAX.checked_shl(32 - bits).unwrap_or(0);
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let bits = u32::from(bits.min(128));
            let mask = u128::MAX.checked_shl(128 - bits).unwrap_or(0);
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

/// Compare two secrets in time that depends only on their lengths, so that a client
/// cannot find the token byte by byte from response times.
fn same_secret(given: &[u8], expected: &[u8]) -> bool {
    let mut diff = u8::from(given.len() != expected.len());
    for i in 0..given.len().max(expected.len()) {
        let a = given.get(i).copied().unwrap_or(0);
        let b = expected.get(i).copied().unwrap_or(0xff);
        diff |= a ^ b;
    }
    diff == 0
}

/// How long open admin connections may take to finish after shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// A client must send its request headers within this time.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Serve the admin endpoints on `listener` until `shutdown` resolves, then stop
/// accepting and let open requests finish (for at most a few seconds).
///
/// Registers the routing-table gauges in `state.registry`; fails if they are already
/// registered there (one admin server per registry).
pub async fn serve(
    state: Arc<AdminState>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> io::Result<()> {
    serve_with_node(state, None, listener, shutdown).await
}

/// [`serve`], also answering the per-node endpoints from `node` (see [`NodeEndpoints`]).
/// Every client is trusted; see [`serve_with_access`].
pub async fn serve_with_node(
    state: Arc<AdminState>,
    node: Option<Arc<dyn NodeEndpoints>>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> io::Result<()> {
    serve_with_access(state, node, AdminAccess::open(), listener, shutdown).await
}

/// [`serve_with_node`], answering `/debug/*` and `/node/*` only as `access` allows (see
/// the module docs).
pub async fn serve_with_access(
    state: Arc<AdminState>,
    node: Option<Arc<dyn NodeEndpoints>>,
    access: AdminAccess,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> io::Result<()> {
    let access = Arc::new(access);
    TableGauges::register(&state.registry, state.router.clone())
        .map_err(|e| io::Error::other(format!("cannot register the admin gauges: {e}")))?;
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "admin server listening");
    }
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Usually out of file descriptors: back off instead of spinning.
                    warn!("admin server: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let service = {
            let (state, node) = (state.clone(), node.clone());
            let access = access.clone();
            ServiceBuilder::new()
                .map_response(handlers::explain_refusal)
                .layer(RequestBodyLimitLayer::new(handlers::MAX_BODY))
                .layer(TimeoutLayer::with_status_code(
                    StatusCode::REQUEST_TIMEOUT,
                    handlers::REQUEST_TIMEOUT,
                ))
                .service_fn(move |req: Request<Limited<Incoming>>| {
                    let (state, node) = (state.clone(), node.clone());
                    let allowed = access.allows(
                        peer.ip(),
                        req.headers()
                            .get(hyper::header::AUTHORIZATION)
                            .map(|v| v.as_bytes()),
                    );
                    async move {
                        let response = if !allowed && handlers::is_private(req.uri().path()) {
                            handlers::forbidden()
                        } else {
                            handlers::respond(&state, node.as_deref(), req).await
                        };
                        Ok::<_, std::convert::Infallible>(response)
                    }
                })
        };
        let conn = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT)
            .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                debug!(%peer, "admin connection ended with an error: {e}");
            }
        });
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(SHUTDOWN_GRACE) => {
            warn!("admin server: connections still open after {SHUTDOWN_GRACE:?}; closing them");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_endpoints_need_loopback_a_trusted_network_or_the_token() {
        let access = AdminAccess {
            token: Some("s3cret".into()),
            trusted: vec![("10.1.0.0".parse().unwrap(), 16)],
            open: false,
        };
        let far: IpAddr = "192.0.2.7".parse().unwrap();
        assert!(access.allows("127.0.1.3".parse().unwrap(), None));
        assert!(access.allows("::1".parse().unwrap(), None));
        assert!(access.allows("::ffff:127.0.0.1".parse().unwrap(), None));
        assert!(access.allows("10.1.200.3".parse().unwrap(), None));
        assert!(!access.allows("10.2.0.1".parse().unwrap(), None));
        assert!(!access.allows(far, None));
        assert!(access.allows(far, Some(b"Bearer s3cret")));
        for wrong in [
            &b"Bearer s3cre"[..],
            b"Bearer s3cret2",
            b"s3cret",
            b"Bearer ",
            b"",
        ] {
            assert!(!access.allows(far, Some(wrong)), "{wrong:?}");
        }
        assert!(AdminAccess::open().allows(far, None));
        assert!(!AdminAccess::default().allows(far, Some(b"Bearer ")));
    }

    #[test]
    fn networks_of_every_prefix_length() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(in_network(ip("10.9.8.7"), ip("0.0.0.0"), 0));
        assert!(in_network(ip("10.9.8.7"), ip("10.9.8.7"), 32));
        assert!(!in_network(ip("10.9.8.6"), ip("10.9.8.7"), 32));
        assert!(in_network(ip("fd00::1"), ip("fd00::"), 8));
        assert!(!in_network(ip("fd00::1"), ip("10.0.0.0"), 8));
    }
}
