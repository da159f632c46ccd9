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
//! * `server`: listening, HTTP/1.1 + h2c, graceful shutdown ([`serve`]).
//! * [`target`]: which service a request names.
//! * `forward`: the request path: pick, connect, send, retry, measure.
//! * `pool`: upstream connections and their bounded keep-alive pool; [`connect_from`]:
//!   the one way out of a bind address, shared with the peer prober of `proxima_nodes`.
//! * `conn`: client connection timeouts (silent, idle and stalled connections).
//! * `headers`, `request_body`, `body`, `reply`: header rewriting, streaming bodies,
//!   error answers.
//! * [`Metrics`]: Prometheus metrics; `spans`: the `request` span every log line about
//!   a request carries.
//! * `prober`: background probes ([`run_prober`]).
//! * `stall`: the proxy's own scheduling lag, so that its stalls are not held
//!   against the pods.
//! * `workers`: serving on worker threads with a single-threaded runtime each
//!   ([`serve_on_workers`]); `give_way`: a worker busy for a while yields the CPU
//!   once, so a sibling queued on its CPU is not held to the kernel's next tick.

#![warn(missing_docs)]

mod balance;
mod body;
mod clock;
mod config;
mod conn;
mod conn_service;
mod connect;
mod forward;
mod gate;
mod give_way;
mod grpc;
mod h1;
mod headers;
mod metrics;
mod park;
mod pool;
mod prober;
mod pump;
mod reply;
mod request_body;
mod serve_h1;
mod server;
mod spans;
mod spare;
mod stall;
pub mod target;
mod tunnel;
mod upstream_h2;
mod worker;
mod workers;

use std::sync::Arc;

use proxima_core::Router;
use tokio::sync::Semaphore;

/// The `prometheus` crate the [`Metrics`] are registered with.
pub use prometheus;

pub use body::ResponseBody;
pub use config::ProxyConfig;
#[doc(hidden)]
pub use conn_service::refusal_for_differential;
pub use connect::connect_from;
pub use give_way::DEFAULT_LIMIT as DEFAULT_YIELD_AFTER;
#[doc(hidden)]
pub use h1::decode_for_fuzzing;
#[doc(hidden)]
pub use h1::{exchange_for_differential, PlainMessage};
pub use h1::{H1Error, UpstreamError};
pub use metrics::{Metrics, MetricsOptions};
pub use prober::run_prober;
pub use serve_h1::parse_request_for_fuzzing;
#[doc(hidden)]
pub use serve_h1::{parse_request_for_differential, NativeRequest};
pub use server::serve;
pub use target::{parse_target, TargetError, TargetSource};
pub use workers::{serve_on_workers, WorkerCpus, WorkerOptions, Workers};

use pool::{ConnPool, PoolBounds};
use stall::StallMeter;

/// The data plane: routing table, metrics, settings and upstream connections, shared by
/// every connection and by the prober.
#[derive(Debug)]
pub struct Proxy {
    router: Arc<Router>,
    metrics: Arc<Metrics>,
    config: ProxyConfig,
    pool: Arc<ConnPool>,
    /// The scheduling lag of the runtime `Proxy::new` ran on (see `stall.rs`); worker
    /// threads have their own (`workers.rs`).
    stall: Arc<StallMeter>,
    /// Recent requests that traffic-shaped probes imitate (`qos-pool-probe: traffic`).
    probe_shapes: prober::TrafficShapes,
    /// Places for requests in flight (`max_concurrent_requests`); see `server.rs`.
    admission: Arc<Semaphore>,
    /// Places for open client connections (`max_client_connections`), shared by every
    /// listener and worker that serves this proxy; see `server.rs`.
    connections: Arc<Semaphore>,
    /// Tunnels open now (`tunnel.rs`): a shutdown waits for them, up to its grace.
    tunnels: tokio::sync::watch::Sender<usize>,
    /// Set when a shutdown's grace is over: the tunnels still open close.
    cut_tunnels: tokio::sync::watch::Sender<bool>,
    /// Tunnels open now per client address (`max_tunnels_per_client`).
    tunnels_by_client: Arc<tunnel::ClientTunnels>,
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
            probe_shapes: prober::TrafficShapes::default(),
            admission,
            connections,
            tunnels: tokio::sync::watch::Sender::new(0),
            cut_tunnels: tokio::sync::watch::Sender::new(false),
            tunnels_by_client: Arc::default(),
        })
    }

    /// The proxy's stall total up to `now` (see `stall.rs`), from the meter of the
    /// calling worker thread, or the proxy's own off the workers.
    pub(crate) fn stall_total(&self, now: std::time::Instant) -> std::time::Duration {
        worker::with_stall(|worker| worker.unwrap_or(&self.stall).total(now))
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
