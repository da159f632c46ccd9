//! Proxima's HTTP data plane.
//!
//! Clients send plain HTTP/1.1 or HTTP/2 (prior knowledge) to the proxy on their node
//! and name the target Service in `x-service` or `Host` ([`target`]). For each request
//! the proxy runs Algorithm 1 of QEdgeProxy (Čilić et al., §III-A): pick an endpoint
//! from the service's QoS pool ([`proxima_core::Router::pick`]), forward the request
//! to it over HTTP/1.1, and feed the measured time to response headers back into the
//! pool ([`proxima_core::Router::record`]). Evicted endpoints are probed in the
//! background ([`run_prober`]) until they meet the SLO again.
//!
//! The source is laid out by role; each folder's module docs say what is in it:
//!
//! * `client/`: client connections: listening, HTTP/1.1 + h2c, graceful shutdown
//!   ([`serve`]), worker threads ([`serve_on_workers`]), a connection's timeouts and
//!   parking, and what a request goes through before it is forwarded (`conn_service`:
//!   admission, RFC 9112's rules for a request's head, the service it names).
//! * `http1/`: the HTTP/1 codec: heads, framing (RFC 9112 §6.3), chunked bodies, the
//!   exchange with pods (`mod.rs`), and the proxy's own HTTP/1.1 server loop for
//!   body-less requests (`serve.rs`). Where a request's or a response's framing is
//!   decided.
//! * `forward.rs` and `forward/`: a request's path: pick, send, measure, and the retry
//!   loop (`forward.rs`), each attempt's verdict (`verdict.rs`), which service a request
//!   names ([`target`]), bodies (`body`, `request_body`, `pump`), header rewriting
//!   (`headers`), error answers (`reply`), gRPC (`grpc`) and tunnels (`tunnel`:
//!   WebSockets, extended CONNECT).
//! * `upstream/`: where a pod connection comes from (`connect`, [`connect_from`]), the
//!   keep-alive pool (`pool`), HTTP/2 to h2c pods (`h2`), and the background probes of
//!   evicted pods (`prober`, [`run_prober`]).
//! * [`Metrics`]: Prometheus metrics; `spans`: the `request` span every log line about
//!   a request carries; `clock`, `spare`: the coarse clock and the per-thread spare
//!   buffers of the hot path.

#![warn(missing_docs)]

mod client;
mod clock;
mod config;
mod forward;
mod http1;
mod metrics;
mod spans;
mod spare;
mod upstream;

use std::sync::Arc;

use proxima_core::Router;
use tokio::sync::Semaphore;

/// The `prometheus` crate the [`Metrics`] are registered with.
pub use prometheus;

#[doc(hidden)]
pub use client::conn_service::refusal_for_differential;
pub use client::give_way::DEFAULT_LIMIT as DEFAULT_YIELD_AFTER;
pub use client::server::serve;
pub use client::workers::{serve_on_workers, WorkerCpus, WorkerOptions, Workers};
pub use config::ProxyConfig;
pub use forward::body::ResponseBody;
pub use forward::target;
pub use forward::target::{parse_target, TargetError, TargetSource};
#[doc(hidden)]
pub use http1::decode_for_fuzzing;
pub use http1::serve::parse_request_for_fuzzing;
#[doc(hidden)]
pub use http1::serve::{parse_request_for_differential, NativeRequest};
#[doc(hidden)]
pub use http1::{exchange_for_differential, PlainMessage};
pub use http1::{H1Error, UpstreamError};
pub use metrics::{Metrics, MetricsOptions};
pub use upstream::connect::connect_from;
pub use upstream::prober::run_prober;

use client::stall::StallMeter;
use upstream::pool::{ConnPool, PoolBounds};

/// The data plane: routing table, metrics, settings and upstream connections, shared by
/// every connection and by the prober.
#[derive(Debug)]
pub struct Proxy {
    router: Arc<Router>,
    metrics: Arc<Metrics>,
    config: ProxyConfig,
    pool: Arc<ConnPool>,
    /// The scheduling lag of the runtime `Proxy::new` ran on (see `client/stall.rs`); worker
    /// threads have their own (`workers.rs`).
    stall: Arc<StallMeter>,
    /// Recent requests that traffic-shaped probes imitate (`qos-pool-probe: traffic`).
    probe_shapes: upstream::prober::TrafficShapes,
    /// Places for requests in flight (`max_concurrent_requests`); see `client/server.rs`.
    admission: Arc<Semaphore>,
    /// Places for open client connections (`max_client_connections`), shared by every
    /// listener and worker that serves this proxy; see `client/server.rs`.
    connections: Arc<Semaphore>,
    /// Tunnels open now (`forward/tunnel.rs`): a shutdown waits for them, up to its grace.
    tunnels: tokio::sync::watch::Sender<usize>,
    /// Set when a shutdown's grace is over: the tunnels still open close.
    cut_tunnels: tokio::sync::watch::Sender<bool>,
    /// Tunnels open now per client address (`max_tunnels_per_client`).
    tunnels_by_client: Arc<forward::tunnel::ClientTunnels>,
}

impl Proxy {
    /// A proxy routing with `router`, counting into `metrics`. Inside a tokio runtime it
    /// also starts the stall meter (a task measuring the proxy's own scheduling lag);
    /// outside one, stalls are not measured.
    pub fn new(router: Arc<Router>, metrics: Arc<Metrics>, config: ProxyConfig) -> Arc<Self> {
        let pool = Arc::new(ConnPool::new(
            config.pool_idle_timeout,
            PoolBounds {
                per_endpoint: config.max_idle_per_endpoint,
                total: config.max_idle_total,
                buffered: config.max_idle_buffered,
            },
            config.upstream_bind,
            config.max_response_headers,
            metrics.pool(),
            (config.h2_max_streams, config.h2_ping_interval),
        ));
        let stall = Arc::new(StallMeter::new());
        StallMeter::spawn(&stall, &router);
        let admission = Arc::new(Semaphore::new(admission_places(&config)));
        let connections = Arc::new(Semaphore::new(
            config
                .max_client_connections
                .clamp(1, Semaphore::MAX_PERMITS),
        ));
        Arc::new(Self {
            router,
            metrics,
            config,
            pool,
            stall,
            probe_shapes: upstream::prober::TrafficShapes::default(),
            admission,
            connections,
            tunnels: tokio::sync::watch::Sender::new(0),
            cut_tunnels: tokio::sync::watch::Sender::new(false),
            tunnels_by_client: Arc::default(),
        })
    }

    /// The proxy's stall total up to `now` (see `client/stall.rs`), from the meter of the
    /// calling worker thread, or the proxy's own off the workers.
    pub(crate) fn stall_total(&self, now: std::time::Instant) -> std::time::Duration {
        client::worker::with_stall(|worker| worker.unwrap_or(&self.stall).total(now))
    }

    /// The routing table it picks from.
    pub fn router(&self) -> &Arc<Router> {
        &self.router
    }

    /// Its metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The settings it was made with.
    pub fn config(&self) -> &ProxyConfig {
        &self.config
    }

    /// Requests holding a place under `max_concurrent_requests`: admitted, and their
    /// response not yet sent or dropped.
    pub fn requests_in_flight(&self) -> usize {
        admission_places(&self.config).saturating_sub(self.admission.available_permits())
    }

    /// Idle upstream keep-alive connections currently pooled.
    pub fn idle_connections(&self) -> usize {
        self.pool.idle_count()
    }

    /// The most idle upstream keep-alive connections currently pooled to one pod.
    pub fn max_idle_connections_per_endpoint(&self) -> usize {
        self.pool.max_idle_per_endpoint()
    }

    /// Idle upstream keep-alive connections currently pooled to `addr`.
    pub fn idle_connections_to(&self, addr: std::net::SocketAddr) -> usize {
        self.pool.idle_to(addr)
    }
}

/// Requests admitted at once: `max_concurrent_requests`, within what a semaphore holds.
fn admission_places(config: &ProxyConfig) -> usize {
    config
        .max_concurrent_requests
        .clamp(1, Semaphore::MAX_PERMITS)
}
