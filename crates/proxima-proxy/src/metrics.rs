//! Prometheus metrics of the data plane.
//!
//! | metric | labels | meaning |
//! |---|---|---|
//! | `proxima_requests_total` | service, endpoint, code | requests answered; `code` is the status the client got, or `error` when the proxy answered 502/504 because the pod failed (then `endpoint` is the last one tried). Requests that named no known service have `service=""` and `endpoint=""` so that client input never becomes a label. |
//! | `proxima_request_duration_seconds` | service | client-seen time to response headers |
//! | `proxima_upstream_duration_seconds` | service, endpoint | only with [`MetricsOptions::pod_histograms`] (`--metrics-pod-histograms`): time of the successful attempt, connect included, to response headers (the measurement of Algorithm 1) |
//! | `proxima_slo_total` | service, result=`met`\|`missed` | requests whose client-seen time met the service's latency SLO (failures miss it) |
//! | `proxima_pool_changes_total` | service, change=`evicted`\|`readmitted` | QoS-pool membership changes |
//! | `proxima_upstream_errors_total` | service, endpoint, kind=`connect`\|`reset`\|`timeout`\|`protocol` | failed attempts |
//! | `proxima_retries_total` | service | extra attempts on another endpoint |
//! | `proxima_unanswered_total` | service, why=`overdue`\|`abandoned`\|`outraced` | attempts without response headers past the SLO (`overdue`, stored as a miss at that moment), that the client gave up on (`abandoned`), or dropped because the other copy of a hedged request answered first (`outraced`) |
//! | `proxima_grpc_responses_total` | service, code | pods' answers to gRPC calls by `grpc-status` (`missing`: the answer ended without one, which gRPC clients take as INTERNAL) |
//! | `proxima_retries_refused_total` | service | retries not sent because the service's retry budget was spent (the client got the failure), and hedges not sent for the same reason (the first copy was waited for alone) |
//! | `proxima_picks_total` | service, reason | endpoint choices by [`Reason`] (`hedge`: second copies of late requests) |
//! | `proxima_probes_total` | service, result=`met`\|`missed`\|`error` | background probes of evicted endpoints |
//! | `proxima_upstream_idle_connections` | | idle keep-alive connections to pods kept now (bounded by `--upstream-max-idle-per-endpoint` and `--upstream-max-idle`) |
//! | `proxima_upstream_idle_closed_total` | reason=`endpoint_limit`\|`total_limit`\|`expired` | idle connections the pool closed: over its bound per pod or in total (the oldest goes), or idle past `--upstream-idle-timeout` |
//! | `proxima_requests_shed_total` | | requests answered `503` at once because `--max-concurrent-requests` were in flight (also counted in `proxima_requests_total{service="",code="503"}`) |
//! | `proxima_worker_yields_total` | | times a data-plane worker, busy without a sleep for `--worker-yield-after` while a sibling worker had not run for as long, gave its CPU away once (`give_way.rs`) |
//! | `proxima_client_connections` | | client connections open now |
//! | `proxima_client_connections_parked` | | of those, idle ones parked without a task of their own (`client/park.rs`) |
//! | `proxima_client_connections_closed_total` | reason=`shed`\|`header_timeout`\|`idle`\|`stalled` | client connections the proxy closed: over `--max-client-connections`, no request headers in time, idle, or no byte moved while a body was streaming |
//! | `proxima_tunnels_open` | | upgraded connections (WebSockets) tunnelled to pods now (`forward/tunnel.rs`) |
//! | `proxima_tunnels_total` | outcome=`opened`\|`declined`\|`refused` | upgrade requests: tunnels opened, declined by the pod (its answer passed on), refused by the proxy over `--max-client-connections` |
//! | `proxima_tunnels_closed_total` | reason=`closed`\|`error`\|`idle`\|`removed`\|`shutdown` | tunnels ended: a side closed, a side failed, nothing moved for `--tunnel-idle-timeout`, the pod left discovery, still open at the end of a shutdown's grace |
//!
//! Together with the routing-table gauges of the admin server (`proxima_endpoint_in_pool`,
//! `proxima_endpoint_in_flight`, `proxima_endpoint_estimate_seconds`, computed at scrape
//! time), these make the default metric set scale with the number of pods: latency
//! histograms per service (13 buckets each), and per pod only counters and gauges (the
//! `proxima_requests_total` codes it answered, its failed attempts in
//! `proxima_upstream_errors_total`, created when the first one happens). A histogram per
//! pod costs 16 series per pod, 16,000 at a thousand pods; it is there only with
//! [`MetricsOptions::pod_histograms`].
//!
//! The hot path does not hash label values: label handles are cached per service and
//! per endpoint in copy-on-write maps that are read without locks and extended (under a
//! mutex) only the first time a service or endpoint is seen. Series of services and
//! endpoints that have left the routing table are removed by [`Metrics::forget_missing`].
//!
//! The per-pod counters (`proxima_requests_total` and `proxima_upstream_errors_total` of
//! an endpoint) are plain atomics in [`EndpointMetrics`], one per common status code and
//! per error kind, with the service and endpoint label values stored once per pod (the
//! service's shared by its pods). A prometheus `IntCounter` per series would carry an
//! `Arc`, its label pairs as owned strings and an entry in its vector's hash map (about
//! 1.4 KiB per pod in heaptrack; at 100 Services x 10 pods under load, the heap in use
//! went from 9.4 to 8.2 MB with the atomics, `benches/load/scale.sh`). The
//! [`EndpointCounters`] collector turns the live endpoints into those two families when
//! `/metrics` is scraped, with a series only for a counter that is not zero (as a lazily
//! created `IntCounter` would have), so that pods that never answered a code add nothing
//! to the exposition. The service-level series of `proxima_requests_total` (`endpoint=""`)
//! stay in a prometheus vector that the same collector emits as part of that family.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use arc_swap::ArcSwap;
// The maps read on every request (a service's and a pod's handles) hash with foldhash,
// seeded per process, like the core's table: cheaper than SipHash, and their keys come
// from discovery, not from clients.
use foldhash::HashMap as FastMap;
use prometheus::core::{Collector, Desc};
use prometheus::proto::{Counter, LabelPair, Metric, MetricFamily, MetricType};
use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
};
use proxima_core::{PoolChange, Reason, ServiceKey, Table};

/// Histogram buckets, 1 ms to 10 s: Prometheus' default buckets (5 ms to 10 s) and 1 and
/// 2.5 ms for the fastest services. Each bucket is a series per histogram (100 per
/// hundred services), so there are no more than quantiles per service need; SLO
/// attainment does not depend on them (`proxima_slo_total` counts it exactly).
const BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Status codes with an atomic request counter per endpoint; the others an endpoint
/// answered are counted in a short list under a lock.
const COMMON_CODES: [u16; 18] = [
    200, 201, 202, 204, 206, 301, 302, 304, 400, 401, 403, 404, 409, 429, 500, 502, 503, 504,
];

const REASONS: [Reason; 5] = [
    Reason::Pool,
    Reason::Fallback,
    Reason::Strategy,
    Reason::LastResort,
    Reason::Hedge,
];

/// Why an attempt failed, as counted in `proxima_upstream_errors_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ErrorKind {
    Connect,
    Reset,
    Timeout,
    Protocol,
}

impl ErrorKind {
    const ALL: [ErrorKind; 4] = [
        ErrorKind::Connect,
        ErrorKind::Reset,
        ErrorKind::Timeout,
        ErrorKind::Protocol,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Connect => "connect",
            ErrorKind::Reset => "reset",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Protocol => "protocol",
        }
    }
}

/// Which optional metric families are exported.
#[derive(Clone, Copy, Debug, Default)]
pub struct MetricsOptions {
    /// Export `proxima_upstream_duration_seconds{service,endpoint}`, a latency histogram
    /// per pod (16 series each). Off by default: at a thousand pods it multiplies the
    /// size of `/metrics` several times.
    pub pod_histograms: bool,
}

/// The metrics of every service seen, by key; shared with the [`EndpointCounters`]
/// collector, which renders the per-pod counters from it.
type ServiceMap = ArcSwap<FastMap<ServiceKey, Arc<ServiceMetrics>>>;

const REQUESTS: (&str, &str) = (
    "proxima_requests_total",
    "Requests answered, by service, endpoint and status code (\"error\" when the endpoint failed).",
);
const UPSTREAM_ERRORS: (&str, &str) = (
    "proxima_upstream_errors_total",
    "Failed attempts to endpoints, by kind.",
);
const PROBES: (&str, &str) = (
    "proxima_probes_total",
    "Background probes of endpoints outside the QoS pool, by result.",
);

/// The `result` label values of `proxima_probes_total`, in the order of
/// `ServiceMetrics::probes`.
const PROBE_RESULTS: [&str; 3] = ["met", "missed", "error"];

/// The data plane's Prometheus metrics (see the module docs).
#[derive(Debug)]
pub struct Metrics {
    vecs: Arc<Vecs>,
    services: Arc<ServiceMap>,
    /// The endpoint map of every service that has none yet.
    no_endpoints: Arc<FastMap<Arc<str>, Arc<EndpointMetrics>>>,
    /// Serialises cache extensions and pruning.
    writer: Mutex<()>,
    client_connections: IntGauge,
    parked_connections: IntGauge,
    connections_closed: IntCounterVec,
    pool: PoolMetrics,
    shed: IntCounter,
    handed_over: IntCounter,
    worker_yields: IntCounter,
    tunnels: TunnelMetrics,
}

/// Handles of the tunnel metrics (see the module docs).
#[derive(Debug)]
struct TunnelMetrics {
    open: IntGauge,
    opened: IntCounter,
    declined: IntCounter,
    refused: IntCounter,
    closed: [IntCounter; 5],
}

/// Why a tunnel ended (`proxima_tunnels_closed_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TunnelClose {
    /// A side closed its end.
    Closed,
    /// A side failed (reset, broken pipe).
    Error,
    /// No byte moved for `tunnel_idle_timeout`.
    Idle,
    /// Its pod left discovery and `tunnel_removed_grace` passed.
    Removed,
    /// Still open when a shutdown's grace period was over.
    Shutdown,
}

impl TunnelClose {
    const ALL: [TunnelClose; 5] = [
        TunnelClose::Closed,
        TunnelClose::Error,
        TunnelClose::Idle,
        TunnelClose::Removed,
        TunnelClose::Shutdown,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            TunnelClose::Closed => "closed",
            TunnelClose::Error => "error",
            TunnelClose::Idle => "idle",
            TunnelClose::Removed => "removed",
            TunnelClose::Shutdown => "shutdown",
        }
    }
}

impl TunnelMetrics {
    fn register(registry: &Registry) -> prometheus::Result<Self> {
        let open = IntGauge::new(
            "proxima_tunnels_open",
            "Upgraded connections (WebSockets) tunnelled to pods now.",
        )?;
        registry.register(Box::new(open.clone()))?;
        let outcomes = counter_vec(
            registry,
            "proxima_tunnels_total",
            "Upgrade requests, by outcome (opened, declined by the pod, refused over the connection budget).",
            &["outcome"],
        )?;
        let closed = counter_vec(
            registry,
            "proxima_tunnels_closed_total",
            "Tunnels ended, by reason (closed, error, idle, removed, shutdown).",
            &["reason"],
        )?;
        Ok(Self {
            open,
            opened: outcomes.with_label_values(&["opened"]),
            declined: outcomes.with_label_values(&["declined"]),
            refused: outcomes.with_label_values(&["refused"]),
            closed: TunnelClose::ALL.map(|r| closed.with_label_values(&[r.as_str()])),
        })
    }
}

/// Why the connection pool closed an idle connection
/// (`proxima_upstream_idle_closed_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum IdleCloseReason {
    /// Its pod already had `max_idle_per_endpoint` idle connections.
    EndpointLimit,
    /// The pool already held `max_idle_total`.
    TotalLimit,
    /// Idle for `pool_idle_timeout`.
    Expired,
}

impl IdleCloseReason {
    const ALL: [IdleCloseReason; 3] = [
        IdleCloseReason::EndpointLimit,
        IdleCloseReason::TotalLimit,
        IdleCloseReason::Expired,
    ];

    fn as_str(self) -> &'static str {
        match self {
            IdleCloseReason::EndpointLimit => "endpoint_limit",
            IdleCloseReason::TotalLimit => "total_limit",
            IdleCloseReason::Expired => "expired",
        }
    }
}

/// The connection pool's metrics (handles shared with [`Metrics`]).
#[derive(Clone, Debug)]
pub(crate) struct PoolMetrics {
    idle: IntGauge,
    parked: IntGauge,
    closed: [IntCounter; 3],
    adopted: IntCounter,
}

impl PoolMetrics {
    /// `count` idle connections are kept now, `parked` of them parked.
    pub(crate) fn set_idle(&self, count: usize, parked: usize) {
        self.idle.set(i64::try_from(count).unwrap_or(i64::MAX));
        self.parked.set(i64::try_from(parked).unwrap_or(i64::MAX));
    }

    /// A worker took over another worker's idle socket (`upstream/pool.rs`).
    pub(crate) fn adopted(&self) {
        self.adopted.inc();
    }

    #[cfg(test)]
    pub(crate) fn adopted_count(&self) -> u64 {
        self.adopted.get()
    }

    pub(crate) fn idle_closed(&self, reason: IdleCloseReason) {
        let i = IdleCloseReason::ALL
            .iter()
            .position(|r| *r == reason)
            .unwrap_or(0);
        self.closed[i].inc();
    }
}

/// Why the proxy closed a client connection (`proxima_client_connections_closed_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CloseReason {
    /// Over the connection budget.
    Shed,
    /// No request headers within `client_header_timeout`.
    HeaderTimeout,
    /// No request in flight for `client_idle_timeout`.
    Idle,
    /// No byte moved for `body_idle_timeout` while a body was streaming or an answer
    /// waited for the client to take it.
    Stalled,
}

impl CloseReason {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            CloseReason::Shed => "shed",
            CloseReason::HeaderTimeout => "header_timeout",
            CloseReason::Idle => "idle",
            CloseReason::Stalled => "stalled",
        }
    }
}

/// The metric families kept in prometheus vectors.
#[derive(Debug)]
struct Vecs {
    /// The service-level series of `proxima_requests_total` (`endpoint=""`). Not
    /// registered itself: [`EndpointCounters`] emits them with the per-pod ones.
    requests: IntCounterVec,
    request_duration: HistogramVec,
    /// Only with [`MetricsOptions::pod_histograms`].
    upstream_duration: Option<HistogramVec>,
    slo: IntCounterVec,
    pool_changes: IntCounterVec,
    retries: IntCounterVec,
    retries_refused: IntCounterVec,
    picks: IntCounterVec,
    unanswered: IntCounterVec,
    grpc: IntCounterVec,
}

/// A counter of one label set, created on first use (so that unused label sets do not
/// show up as zero series).
#[derive(Debug)]
struct LazyCounter {
    /// `None`: first used after its service left the table; it counts nowhere.
    cell: OnceLock<Option<IntCounter>>,
}

impl LazyCounter {
    const fn new() -> Self {
        Self {
            cell: OnceLock::new(),
        }
    }
}

/// A service's counters made at its first request (see `ServiceMetrics::counters`).
#[derive(Debug)]
struct ServiceCounters {
    slo_met: LazyCounter,
    slo_missed: LazyCounter,
    retries: LazyCounter,
    retries_refused: LazyCounter,
    picks: [LazyCounter; 5],
    overdue: LazyCounter,
    abandoned: LazyCounter,
    outraced: LazyCounter,
}

/// Cached label handles of one service.
#[derive(Debug)]
pub(crate) struct ServiceMetrics {
    vecs: Arc<Vecs>,
    /// The `service` label value, shared with its endpoints.
    label: Arc<str>,
    /// Created at the service's first request, like the counters: a service only probed
    /// so far (every service at start, and most of them with many idle devices) holds
    /// no histogram, ~0.9 KB with its label and buckets (`None`: first used after the
    /// service was retired).
    request_duration: OnceLock<Option<Histogram>>,
    /// Made at the first request: every service is probed at start, and a service only
    /// probed needs none of them (160 bytes a service inline, 16 an idle endpoint at 10
    /// pods a Service; issue 29).
    counters: OnceLock<Box<ServiceCounters>>,
    /// `proxima_probes_total` by result, in the order of [`PROBE_RESULTS`], rendered by
    /// [`EndpointCounters`]: every service is probed at start, and a prometheus series
    /// (its label strings, its hash-map entry) was ~450 bytes a service, 45 an idle
    /// endpoint at 10 pods a Service (issue 29).
    probes: [AtomicU64; PROBE_RESULTS.len()],
    /// By endpoint id; the key is the endpoint's `endpoint` label value.
    endpoints: ArcSwap<FastMap<Arc<str>, Arc<EndpointMetrics>>>,
    /// Held to change `endpoints`, to retire the service, and to create a series.
    writer: Mutex<()>,
    /// The service has left the table and its series are removed: a request still in
    /// flight must not create them again (they would stay, with nothing to remove them).
    retired: AtomicBool,
}

/// The counters of one endpoint of one service, rendered by [`EndpointCounters`] at
/// scrape time (a zero counter renders no series).
#[derive(Debug)]
pub(crate) struct EndpointMetrics {
    service: Arc<str>,
    endpoint: Arc<str>,
    upstream_duration: Option<Histogram>,
    /// `proxima_requests_total` by status, in the order of [`COMMON_CODES`].
    codes: [AtomicU64; COMMON_CODES.len()],
    /// `proxima_requests_total{code="error"}`.
    error_code: AtomicU64,
    /// `proxima_upstream_errors_total` by kind, in the order of [`ErrorKind::ALL`].
    errors: [AtomicU64; ErrorKind::ALL.len()],
    /// `proxima_requests_total` of the other status codes answered, in the order seen.
    other_codes: Mutex<Vec<(u16, u64)>>,
}

fn counter_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> prometheus::Result<IntCounterVec> {
    let vec = IntCounterVec::new(Opts::new(name, help), labels)?;
    registry.register(Box::new(vec.clone()))?;
    Ok(vec)
}

fn histogram_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> prometheus::Result<HistogramVec> {
    let vec = HistogramVec::new(
        HistogramOpts::new(name, help).buckets(BUCKETS.to_vec()),
        labels,
    )?;
    registry.register(Box::new(vec.clone()))?;
    Ok(vec)
}

impl Metrics {
    /// Create the default metrics and register them on `registry`.
    pub fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        Self::with_options(registry, MetricsOptions::default())
    }

    /// Create the metrics `options` choose and register them on `registry`.
    pub fn with_options(
        registry: &Registry,
        options: MetricsOptions,
    ) -> Result<Self, prometheus::Error> {
        let upstream_duration = if options.pod_histograms {
            Some(histogram_vec(
                registry,
                "proxima_upstream_duration_seconds",
                "Time of the answering attempt to an endpoint, connect included, to response headers.",
                &["service", "endpoint"],
            )?)
        } else {
            None
        };
        let vecs = Vecs {
            requests: IntCounterVec::new(
                Opts::new(REQUESTS.0, REQUESTS.1),
                &["service", "endpoint", "code"],
            )?,
            request_duration: histogram_vec(
                registry,
                "proxima_request_duration_seconds",
                "Client-seen time to response headers.",
                &["service"],
            )?,
            upstream_duration,
            slo: counter_vec(
                registry,
                "proxima_slo_total",
                "Requests that met or missed the service's latency SLO.",
                &["service", "result"],
            )?,
            pool_changes: counter_vec(
                registry,
                "proxima_pool_changes_total",
                "QoS pool membership changes.",
                &["service", "change"],
            )?,
            retries: counter_vec(
                registry,
                "proxima_retries_total",
                "Extra attempts on another endpoint.",
                &["service"],
            )?,
            grpc: counter_vec(
                registry,
                "proxima_grpc_responses_total",
                "Answers to gRPC calls from pods, by grpc-status (`missing`: none).",
                &["service", "code"],
            )?,
            retries_refused: counter_vec(
                registry,
                "proxima_retries_refused_total",
                "Retries not sent because the service's retry budget was spent.",
                &["service"],
            )?,
            picks: counter_vec(
                registry,
                "proxima_picks_total",
                "Endpoint choices by reason.",
                &["service", "reason"],
            )?,
            unanswered: counter_vec(
                registry,
                "proxima_unanswered_total",
                "Attempts still without response headers when the SLO passed (overdue), given up by the client (abandoned), or dropped for a hedge's answer (outraced).",
                &["service", "why"],
            )?,
        };
        let client_connections =
            IntGauge::new("proxima_client_connections", "Client connections open now.")?;
        registry.register(Box::new(client_connections.clone()))?;
        let parked_connections = IntGauge::new(
            "proxima_client_connections_parked",
            "Idle client connections parked without a task of their own.",
        )?;
        registry.register(Box::new(parked_connections.clone()))?;
        let connections_closed = counter_vec(
            registry,
            "proxima_client_connections_closed_total",
            "Client connections the proxy closed, by reason (shed, header_timeout, idle, stalled).",
            &["reason"],
        )?;
        // Every reason from the start (at 0), so that rates and dashboards see the
        // series before the first close.
        for reason in [
            CloseReason::Shed,
            CloseReason::HeaderTimeout,
            CloseReason::Idle,
            CloseReason::Stalled,
        ] {
            connections_closed.with_label_values(&[reason.as_str()]);
        }
        let idle = IntGauge::new(
            "proxima_upstream_idle_connections",
            "Idle keep-alive connections to pods kept for reuse now.",
        )?;
        registry.register(Box::new(idle.clone()))?;
        let parked = IntGauge::new(
            "proxima_upstream_idle_parked_connections",
            "Of the idle keep-alive connections, those parked: the socket kept, its HTTP/1.1 buffers freed.",
        )?;
        registry.register(Box::new(parked.clone()))?;
        let idle_closed = counter_vec(
            registry,
            "proxima_upstream_idle_closed_total",
            "Idle keep-alive connections to pods the pool closed, by reason (endpoint_limit, total_limit, expired).",
            &["reason"],
        )?;
        let adopted = IntCounter::new(
            "proxima_upstream_adopted_total",
            "Idle pod sockets a worker took over from another worker instead of opening a new connection.",
        )?;
        registry.register(Box::new(adopted.clone()))?;
        let pool = PoolMetrics {
            idle,
            parked,
            closed: IdleCloseReason::ALL.map(|r| idle_closed.with_label_values(&[r.as_str()])),
            adopted,
        };
        let handed_over = IntCounter::new(
            "proxima_client_connections_handed_over_total",
            "Client connections a worker accepted and handed to a less loaded worker.",
        )?;
        registry.register(Box::new(handed_over.clone()))?;
        let shed = IntCounter::new(
            "proxima_requests_shed_total",
            "Requests answered 503 at once because the most requests allowed in flight were.",
        )?;
        registry.register(Box::new(shed.clone()))?;
        let worker_yields = IntCounter::new(
            "proxima_worker_yields_total",
            "Times a data-plane worker, busy without a sleep for --worker-yield-after while a sibling worker had not run for as long, gave its CPU away once.",
        )?;
        registry.register(Box::new(worker_yields.clone()))?;
        let tunnels = TunnelMetrics::register(registry)?;
        let services: Arc<ServiceMap> = Arc::new(ArcSwap::from_pointee(FastMap::default()));
        registry.register(Box::new(EndpointCounters::new(
            services.clone(),
            vecs.requests.clone(),
        )?))?;
        Ok(Self {
            vecs: Arc::new(vecs),
            services,
            no_endpoints: Arc::default(),
            writer: Mutex::new(()),
            client_connections,
            parked_connections,
            connections_closed,
            pool,
            shed,
            handed_over,
            worker_yields,
            tunnels,
        })
    }

    /// Count a tunnel opened; the gauge of open ones is the caller's to keep.
    pub(crate) fn tunnel_opened(&self) -> IntGauge {
        self.tunnels.opened.inc();
        self.tunnels.open.clone()
    }

    /// Count an upgrade the pod declined.
    pub(crate) fn tunnel_declined(&self) {
        self.tunnels.declined.inc();
    }

    /// Count an upgrade refused over the connection budget.
    pub(crate) fn tunnel_refused(&self) {
        self.tunnels.refused.inc();
    }

    /// Count a tunnel that ended.
    pub(crate) fn tunnel_closed(&self, reason: TunnelClose) {
        let index = TunnelClose::ALL
            .iter()
            .position(|r| *r == reason)
            .unwrap_or(0);
        self.tunnels.closed[index].inc();
    }

    /// The counter of workers giving their CPU away (`give_way.rs`).
    pub(crate) fn worker_yields(&self) -> IntCounter {
        self.worker_yields.clone()
    }

    /// Count a worker giving its CPU away (`give_way.rs`).
    pub(crate) fn worker_yielded(&self) {
        self.worker_yields.inc();
    }

    /// Count a client connection handed to another worker (`balance.rs`).
    pub(crate) fn handed_over(&self) {
        self.handed_over.inc();
    }

    /// Count a request shed for overload (see `client/server.rs`).
    pub(crate) fn shed(&self) {
        self.shed.inc();
        self.unrouted(http::StatusCode::SERVICE_UNAVAILABLE);
    }

    /// The connection pool's handles.
    pub(crate) fn pool(&self) -> PoolMetrics {
        self.pool.clone()
    }

    /// The gauge of open client connections.
    pub(crate) fn client_connections(&self) -> &IntGauge {
        &self.client_connections
    }

    pub(crate) fn parked_connections(&self) -> &IntGauge {
        &self.parked_connections
    }

    /// Count a client connection the proxy closed.
    pub(crate) fn connection_closed(&self, reason: CloseReason) {
        self.connections_closed
            .with_label_values(&[reason.as_str()])
            .inc();
    }

    /// The cached handles of `key`'s metrics.
    pub(crate) fn service(&self, key: &ServiceKey) -> Arc<ServiceMetrics> {
        if let Some(m) = self.services.load().get(key) {
            return m.clone();
        }
        let _writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let current = self.services.load_full();
        if let Some(m) = current.get(key) {
            return m.clone();
        }
        let label: Arc<str> = key.to_string().into();
        let m = Arc::new(ServiceMetrics {
            vecs: self.vecs.clone(),
            request_duration: OnceLock::new(),
            label,
            counters: OnceLock::new(),
            probes: Default::default(),
            // One empty map shared until the service's first endpoint metrics.
            endpoints: ArcSwap::new(self.no_endpoints.clone()),
            writer: Mutex::new(()),
            retired: AtomicBool::new(false),
        });
        let mut next = FastMap::clone(&current);
        next.insert(key.clone(), m.clone());
        self.services.store(Arc::new(next));
        m
    }

    /// Count a request answered before any service was resolved (400, 431, unknown
    /// service).
    pub(crate) fn unrouted(&self, status: http::StatusCode) {
        self.vecs
            .requests
            .with_label_values(&["", "", status.as_str()])
            .inc();
    }

    pub(crate) fn pool_change(&self, service: &ServiceMetrics, change: PoolChange) {
        let change = match change {
            PoolChange::Evicted => "evicted",
            PoolChange::Readmitted => "readmitted",
        };
        self.vecs
            .pool_changes
            .with_label_values(&[&service.label, change])
            .inc();
    }

    /// Count a probe of `service` with `result`, one of [`PROBE_RESULTS`].
    pub(crate) fn probe(&self, service: &ServiceMetrics, result: &str) {
        let index = PROBE_RESULTS.iter().position(|&r| r == result);
        if let Some(count) = index.and_then(|i| service.probes.get(i)) {
            count.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Drop the cached handles and the series of services and endpoints that are no
    /// longer in `table`.
    pub fn forget_missing(&self, table: &Table) {
        let _writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let current = self.services.load_full();
        let mut next = FastMap::with_capacity_and_hasher(current.len(), Default::default());
        let mut changed = false;
        for (key, service) in current.iter() {
            let Some(route) = table.services.get(key) else {
                changed = true;
                service.remove_all_series();
                continue;
            };
            let live: HashSet<&str> = route
                .endpoints
                .iter()
                .map(|e| e.endpoint.id.as_str())
                .collect();
            service.forget_endpoints(&live);
            next.insert(key.clone(), service.clone());
        }
        if changed {
            self.services.store(Arc::new(next));
        }
    }
}

impl ServiceMetrics {
    pub(crate) fn label(&self) -> &str {
        &self.label
    }

    /// The cached handles of endpoint `id`'s metrics.
    pub(crate) fn endpoint(&self, id: &str) -> Arc<EndpointMetrics> {
        if let Some(m) = self.endpoints.load().get(id) {
            return m.clone();
        }
        let _writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let current = self.endpoints.load_full();
        if let Some(m) = current.get(id) {
            return m.clone();
        }
        let endpoint: Arc<str> = id.into();
        let m = Arc::new(EndpointMetrics {
            upstream_duration: self
                .vecs
                .upstream_duration
                .as_ref()
                .map(|vec| vec.with_label_values(&[&self.label, id])),
            service: self.label.clone(),
            endpoint: endpoint.clone(),
            codes: std::array::from_fn(|_| AtomicU64::new(0)),
            error_code: AtomicU64::new(0),
            errors: std::array::from_fn(|_| AtomicU64::new(0)),
            other_codes: Mutex::new(Vec::new()),
        });
        let mut next = FastMap::clone(&current);
        next.insert(endpoint, m.clone());
        self.endpoints.store(Arc::new(next));
        m
    }

    pub(crate) fn request_duration(&self, d: Duration) {
        let histogram = self.request_duration.get_or_init(|| {
            let _writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
            let vec = &self.vecs.request_duration;
            (!self.retired.load(Ordering::Relaxed)).then(|| vec.with_label_values(&[&self.label]))
        });
        if let Some(histogram) = histogram {
            histogram.observe(d.as_secs_f64());
        }
    }

    /// The counters' cells, made at the first count.
    fn counters(&self) -> &ServiceCounters {
        self.counters.get_or_init(|| {
            Box::new(ServiceCounters {
                slo_met: LazyCounter::new(),
                slo_missed: LazyCounter::new(),
                retries: LazyCounter::new(),
                retries_refused: LazyCounter::new(),
                picks: std::array::from_fn(|_| LazyCounter::new()),
                overdue: LazyCounter::new(),
                abandoned: LazyCounter::new(),
                outraced: LazyCounter::new(),
            })
        })
    }

    pub(crate) fn slo(&self, met: bool) {
        let counters = self.counters();
        let (cell, result) = if met {
            (&counters.slo_met, "met")
        } else {
            (&counters.slo_missed, "missed")
        };
        self.count(cell, &self.vecs.slo, &[&self.label, result]);
    }

    pub(crate) fn retry(&self) {
        self.count(&self.counters().retries, &self.vecs.retries, &[&self.label]);
    }

    /// Count one on `cell`, creating its series on first use unless the service has
    /// been retired (see `retired`).
    fn count(&self, cell: &LazyCounter, vec: &IntCounterVec, labels: &[&str]) {
        let counter = cell.cell.get_or_init(|| {
            let _writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
            (!self.retired.load(Ordering::Relaxed)).then(|| vec.with_label_values(labels))
        });
        if let Some(counter) = counter {
            counter.inc();
        }
    }

    /// An attempt went past the SLO without response headers.
    pub(crate) fn overdue(&self) {
        let labels = [&*self.label, "overdue"];
        self.count(&self.counters().overdue, &self.vecs.unanswered, &labels);
    }

    /// The client gave up on an attempt that was still waiting for response headers.
    pub(crate) fn abandoned(&self) {
        let labels = [&*self.label, "abandoned"];
        self.count(&self.counters().abandoned, &self.vecs.unanswered, &labels);
    }

    /// An attempt still waiting for response headers was dropped because the other copy
    /// of its hedged request answered first.
    pub(crate) fn outraced(&self) {
        let labels = [&*self.label, "outraced"];
        self.count(&self.counters().outraced, &self.vecs.unanswered, &labels);
    }

    /// A pod's answer to a gRPC call had `grpc-status` `code` (`None`: it had none).
    pub(crate) fn grpc_status(&self, code: Option<u8>) {
        let code = code.map_or_else(|| "missing".to_string(), |c| c.to_string());
        let _writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        if !self.retired.load(Ordering::Relaxed) {
            self.vecs
                .grpc
                .with_label_values(&[&self.label, &code])
                .inc();
        }
    }

    /// A retry the retry budget did not allow.
    pub(crate) fn retry_refused(&self) {
        self.count(
            &self.counters().retries_refused,
            &self.vecs.retries_refused,
            &[&self.label],
        );
    }

    pub(crate) fn pick(&self, reason: Reason) {
        let i = REASONS.iter().position(|r| *r == reason).unwrap_or(0);
        self.count(
            &self.counters().picks[i],
            &self.vecs.picks,
            &[&self.label, reason.as_str()],
        );
    }

    /// Count a request of this service the proxy answered before any endpoint was tried
    /// (unknown port, no endpoints), under `endpoint=""`.
    pub(crate) fn answered(&self, status: http::StatusCode) {
        // An error answer, not the common path: the lock keeps a retired service's
        // series from coming back.
        let _writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        if !self.retired.load(Ordering::Relaxed) {
            self.vecs
                .requests
                .with_label_values(&[&self.label, "", status.as_str()])
                .inc();
        }
    }

    fn forget_endpoints(&self, live: &HashSet<&str>) {
        let _writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let current = self.endpoints.load_full();
        if current.keys().all(|id| live.contains(&**id)) {
            return;
        }
        let mut next = FastMap::with_capacity_and_hasher(current.len(), Default::default());
        for (id, m) in current.iter() {
            if live.contains(&**id) {
                next.insert(id.clone(), m.clone());
            } else {
                m.remove_series(&self.vecs);
            }
        }
        self.endpoints.store(Arc::new(next));
    }

    fn remove_all_series(&self) {
        let _writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        self.retired.store(true, Ordering::Relaxed);
        let metrics = &self.vecs;
        for m in self.endpoints.load().values() {
            m.remove_series(metrics);
        }
        let s = &*self.label;
        let _ = metrics.request_duration.remove_label_values(&[s]);
        let _ = metrics.retries.remove_label_values(&[s]);
        for why in ["overdue", "abandoned", "outraced"] {
            let _ = metrics.unanswered.remove_label_values(&[s, why]);
        }
        let _ = metrics.retries_refused.remove_label_values(&[s]);
        for result in ["met", "missed"] {
            let _ = metrics.slo.remove_label_values(&[s, result]);
        }
        for change in ["evicted", "readmitted"] {
            let _ = metrics.pool_changes.remove_label_values(&[s, change]);
        }
        for reason in REASONS {
            let _ = metrics.picks.remove_label_values(&[s, reason.as_str()]);
        }
        for code in ["400", "404", "503"] {
            let _ = metrics.requests.remove_label_values(&[s, "", code]);
        }
        for code in (0..=16)
            .map(|c: u8| c.to_string())
            .chain(["missing".to_string()])
        {
            let _ = metrics.grpc.remove_label_values(&[s, &code]);
        }
    }
}

impl EndpointMetrics {
    pub(crate) fn upstream_duration(&self, d: Duration) {
        if let Some(histogram) = &self.upstream_duration {
            histogram.observe(d.as_secs_f64());
        }
    }

    /// Count a request answered with the pod's `status`.
    pub(crate) fn response(&self, status: http::StatusCode) {
        let code = status.as_u16();
        match COMMON_CODES.iter().position(|&c| c == code) {
            Some(i) => {
                self.codes[i].fetch_add(1, Ordering::Relaxed);
            }
            None => {
                let mut others = self.other_codes.lock().unwrap_or_else(|e| e.into_inner());
                match others.iter_mut().find(|(c, _)| *c == code) {
                    Some((_, count)) => *count += 1,
                    None => others.push((code, 1)),
                }
            }
        }
    }

    /// Count a request the proxy answered because this endpoint failed.
    pub(crate) fn failed_request(&self) {
        self.error_code.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn error(&self, kind: ErrorKind) {
        let i = ErrorKind::ALL.iter().position(|k| *k == kind).unwrap_or(0);
        self.errors[i].fetch_add(1, Ordering::Relaxed);
    }

    /// The series of its counters that are not zero: `proxima_requests_total` into
    /// `requests`, `proxima_upstream_errors_total` into `errors`.
    fn render(&self, requests: &mut Vec<Metric>, errors: &mut Vec<Metric>) {
        let (service, endpoint) = (&*self.service, &*self.endpoint);
        let mut request = |code: &str, count: u64| {
            let labels = [("code", code), ("endpoint", endpoint), ("service", service)];
            requests.push(counter(&labels, count));
        };
        for (code, count) in COMMON_CODES.iter().zip(&self.codes) {
            let count = count.load(Ordering::Relaxed);
            if count > 0 {
                request(&code.to_string(), count);
            }
        }
        let failed = self.error_code.load(Ordering::Relaxed);
        if failed > 0 {
            request("error", failed);
        }
        // Copied out so that requests counting an uncommon code do not wait on the
        // formatting.
        let others = self
            .other_codes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        for (code, count) in others {
            request(&code.to_string(), count);
        }
        for (kind, count) in ErrorKind::ALL.iter().zip(&self.errors) {
            let count = count.load(Ordering::Relaxed);
            if count > 0 {
                let labels = [
                    ("endpoint", endpoint),
                    ("kind", kind.as_str()),
                    ("service", service),
                ];
                errors.push(counter(&labels, count));
            }
        }
    }

    /// Remove its prometheus series from `vecs` (the optional histogram; its counters
    /// are rendered only while it is in its service's map).
    fn remove_series(&self, vecs: &Vecs) {
        if let Some(vec) = &vecs.upstream_duration {
            let _ = vec.remove_label_values(&[&self.service, &self.endpoint]);
        }
    }
}

/// A counter sample; `labels` in the order of their names, as the text format expects
/// (and as prometheus' own vectors store them).
fn counter(labels: &[(&str, &str)], value: u64) -> Metric {
    let mut counter = Counter::default();
    counter.set_value(value as f64);
    let mut metric = Metric::default();
    metric.set_label(
        labels
            .iter()
            .map(|(name, value)| {
                let mut pair = LabelPair::default();
                pair.set_name(name.to_string());
                pair.set_value(value.to_string());
                pair
            })
            .collect(),
    );
    metric.set_counter(counter);
    metric
}

/// The collector of `proxima_requests_total` and `proxima_upstream_errors_total`: the
/// per-pod series from the counters of the live endpoints, and the service-level series
/// of `proxima_requests_total` from their prometheus vector (see the module docs); and
/// of `proxima_probes_total`, from the counters of the live services.
struct EndpointCounters {
    services: Arc<ServiceMap>,
    service_requests: IntCounterVec,
    descs: [Desc; 3],
}

impl std::fmt::Debug for EndpointCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EndpointCounters").finish_non_exhaustive()
    }
}

impl EndpointCounters {
    fn new(services: Arc<ServiceMap>, service_requests: IntCounterVec) -> prometheus::Result<Self> {
        let desc = |(name, help): (&str, &str), labels: &[&str]| {
            Desc::new(
                name.to_string(),
                help.to_string(),
                labels.iter().map(|l| l.to_string()).collect(),
                HashMap::new(),
            )
        };
        Ok(Self {
            services,
            service_requests,
            descs: [
                desc(REQUESTS, &["service", "endpoint", "code"])?,
                desc(UPSTREAM_ERRORS, &["service", "endpoint", "kind"])?,
                desc(PROBES, &["service", "result"])?,
            ],
        })
    }
}

impl Collector for EndpointCounters {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let family = |(name, help): (&str, &str)| {
            let mut family = MetricFamily::default();
            family.set_name(name.to_string());
            family.set_help(help.to_string());
            family.set_field_type(MetricType::COUNTER);
            family
        };
        let mut requests = family(REQUESTS);
        let mut errors = family(UPSTREAM_ERRORS);
        let mut request_series = Vec::new();
        for mut service_level in self.service_requests.collect() {
            request_series.extend(service_level.take_metric());
        }
        let mut error_series = Vec::new();
        let mut probe_series = Vec::new();
        for service in self.services.load().values() {
            for endpoint in service.endpoints.load().values() {
                endpoint.render(&mut request_series, &mut error_series);
            }
            for (result, count) in PROBE_RESULTS.iter().zip(&service.probes) {
                let count = count.load(Ordering::Relaxed);
                if count > 0 {
                    let labels = [("result", *result), ("service", &*service.label)];
                    probe_series.push(counter(&labels, count));
                }
            }
        }
        // The registry sorts the series of each family when it gathers.
        requests.set_metric(request_series);
        errors.set_metric(error_series);
        let mut probes = family(PROBES);
        probes.set_metric(probe_series);
        vec![requests, errors, probes]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proxima_core::{Endpoint, ServiceSettings, ServiceSpec, Update};
    use std::time::Instant;

    fn text(registry: &Registry) -> String {
        let mut out = Vec::new();
        prometheus::Encoder::encode(
            &prometheus::TextEncoder::new(),
            &registry.gather(),
            &mut out,
        )
        .unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn counts_through_cached_handles_and_forgets_removed_endpoints() {
        let registry = Registry::new();
        let options = MetricsOptions {
            pod_histograms: true,
        };
        let metrics = Metrics::with_options(&registry, options).unwrap();
        let key = ServiceKey::new("shop", "api");
        let s = metrics.service(&key);
        assert!(Arc::ptr_eq(&s, &metrics.service(&key)));
        let e = s.endpoint("pod-a");
        assert!(Arc::ptr_eq(&e, &s.endpoint("pod-a")));
        e.response(http::StatusCode::OK);
        e.response(http::StatusCode::OK);
        e.response(http::StatusCode::IM_A_TEAPOT);
        e.failed_request();
        e.error(ErrorKind::Reset);
        e.upstream_duration(Duration::from_millis(3));
        s.request_duration(Duration::from_millis(4));
        s.slo(true);
        s.retry();
        s.overdue();
        s.overdue();
        s.abandoned();
        s.retry_refused();
        s.pick(Reason::Pool);
        s.pick(Reason::LastResort);
        metrics.probe(&s, "met");
        metrics.probe(&s, "met");
        metrics.probe(&s, "error");
        let out = text(&registry);
        for line in [
            r#"proxima_requests_total{code="200",endpoint="pod-a",service="api.shop"} 2"#,
            r#"proxima_requests_total{code="418",endpoint="pod-a",service="api.shop"} 1"#,
            r#"proxima_requests_total{code="error",endpoint="pod-a",service="api.shop"} 1"#,
            r#"proxima_upstream_errors_total{endpoint="pod-a",kind="reset",service="api.shop"} 1"#,
            r#"proxima_upstream_duration_seconds_count{endpoint="pod-a",service="api.shop"} 1"#,
            r#"proxima_request_duration_seconds_bucket{service="api.shop",le="0.005"} 1"#,
            r#"proxima_slo_total{result="met",service="api.shop"} 1"#,
            r#"proxima_retries_total{service="api.shop"} 1"#,
            r#"proxima_unanswered_total{service="api.shop",why="overdue"} 2"#,
            r#"proxima_unanswered_total{service="api.shop",why="abandoned"} 1"#,
            r#"proxima_retries_refused_total{service="api.shop"} 1"#,
            r#"proxima_picks_total{reason="last-resort",service="api.shop"} 1"#,
            r#"proxima_probes_total{result="met",service="api.shop"} 2"#,
            r#"proxima_probes_total{result="error",service="api.shop"} 1"#,
        ] {
            assert!(out.contains(line), "missing {line} in\n{out}");
        }
        // Only label sets that were used exist.
        assert!(!out.contains(r#"result="missed""#), "{out}");

        // pod-a leaves the service: its series go, the service's stay.
        let router = proxima_core::Router::new(None);
        let spec = ServiceSpec::new(key.clone(), vec![], ServiceSettings::default());
        let ep = Endpoint::new("pod-b", "127.0.0.1:1".parse().unwrap());
        router.apply(
            [Update::Reset {
                nodes: vec![],
                services: vec![(spec, vec![ep])],
            }],
            Instant::now(),
        );
        metrics.forget_missing(&router.table());
        let out = text(&registry);
        assert!(!out.contains("pod-a"), "{out}");
        assert!(out.contains(r#"proxima_retries_total{service="api.shop"} 1"#));

        // The service goes: everything about it goes.
        router.apply(
            [Update::Reset {
                nodes: vec![],
                services: vec![],
            }],
            Instant::now(),
        );
        metrics.forget_missing(&router.table());
        assert!(!text(&registry).contains("api.shop"));
        assert!(!Arc::ptr_eq(&s, &metrics.service(&key)));
    }

    #[test]
    fn a_service_gets_its_histogram_at_its_first_request() {
        let registry = Registry::new();
        let metrics = Metrics::new(&registry).unwrap();
        let s = metrics.service(&ServiceKey::new("shop", "api"));
        metrics.probe(&s, "met");
        let histogram = |out: &str| out.contains("proxima_request_duration_seconds_count");
        assert!(!histogram(&text(&registry)), "{}", text(&registry));
        s.request_duration(Duration::from_millis(4));
        let out = text(&registry);
        assert!(
            out.contains(r#"proxima_request_duration_seconds_count{service="api.shop"} 1"#),
            "{out}"
        );
    }

    #[test]
    fn per_pod_histograms_only_when_asked_for() {
        let registry = Registry::new();
        let metrics = Metrics::new(&registry).unwrap();
        let s = metrics.service(&ServiceKey::new("shop", "api"));
        let e = s.endpoint("pod-a");
        e.upstream_duration(Duration::from_millis(3));
        e.response(http::StatusCode::OK);
        s.request_duration(Duration::from_millis(4));
        let out = text(&registry);
        assert!(!out.contains("proxima_upstream_duration_seconds"), "{out}");
        // Per service: one histogram; per pod: only its counters.
        let histogram_lines = out
            .lines()
            .filter(|l| l.starts_with("proxima_request_duration_seconds"))
            .count();
        assert_eq!(histogram_lines, BUCKETS.len() + 3, "{out}");
        let pod_lines: Vec<_> = out
            .lines()
            .filter(|l| !l.starts_with('#') && l.contains("pod-a"))
            .collect();
        assert_eq!(
            pod_lines,
            [r#"proxima_requests_total{code="200",endpoint="pod-a",service="api.shop"} 1"#],
            "{out}"
        );
    }

    /// The lines of `text` about the per-pod counter families, in exposition order.
    fn counter_lines(text: &str) -> Vec<&str> {
        text.lines()
            .filter(|l| {
                l.contains("proxima_requests_total") || l.contains("proxima_upstream_errors_total")
            })
            .collect()
    }

    /// A router whose table has `key` with the endpoints `ids` (on unused addresses).
    fn table_with(key: &ServiceKey, ids: &[&str]) -> proxima_core::Router {
        let router = proxima_core::Router::new(None);
        let spec = ServiceSpec::new(key.clone(), vec![], ServiceSettings::default());
        let endpoints = ids
            .iter()
            .map(|id| Endpoint::new(*id, "127.0.0.1:1".parse().unwrap()))
            .collect();
        router.apply(
            [Update::Reset {
                nodes: vec![],
                services: vec![(spec, endpoints)],
            }],
            Instant::now(),
        );
        router
    }

    #[test]
    fn per_pod_counters_render_as_prometheus_counters_did() {
        let registry = Registry::new();
        let metrics = Metrics::new(&registry).unwrap();
        // The same counts through prometheus' own vectors, as the per-pod series were
        // kept before they became atomics.
        let reference = Registry::new();
        let requests = counter_vec(
            &reference,
            REQUESTS.0,
            REQUESTS.1,
            &["service", "endpoint", "code"],
        )
        .unwrap();
        let errors = counter_vec(
            &reference,
            UPSTREAM_ERRORS.0,
            UPSTREAM_ERRORS.1,
            &["service", "endpoint", "kind"],
        )
        .unwrap();

        let api = metrics.service(&ServiceKey::new("shop", "api"));
        let web = metrics.service(&ServiceKey::new("shop", "web"));
        let (a, b, w) = (
            api.endpoint("pod-a"),
            api.endpoint("pod-b"),
            web.endpoint("w-1"),
        );
        let _idle = web.endpoint("w-2");
        let responses: [(&EndpointMetrics, u16, u64); 7] = [
            (&a, 200, 3),
            (&a, 503, 1),
            (&a, 418, 2),
            (&a, 299, 1),
            (&b, 204, 1),
            (&b, 599, 1),
            (&w, 200, 5),
        ];
        for (endpoint, code, times) in responses {
            for _ in 0..times {
                endpoint.response(http::StatusCode::from_u16(code).unwrap());
            }
            requests
                .with_label_values(&[&endpoint.service, &endpoint.endpoint, &code.to_string()])
                .inc_by(times);
        }
        for (endpoint, times) in [(&a, 1), (&w, 2)] {
            for _ in 0..times {
                endpoint.failed_request();
            }
            requests
                .with_label_values(&[&endpoint.service, &endpoint.endpoint, "error"])
                .inc_by(times);
        }
        for (endpoint, kind, times) in [
            (&a, ErrorKind::Connect, 2),
            (&a, ErrorKind::Timeout, 1),
            (&w, ErrorKind::Reset, 1),
            (&w, ErrorKind::Protocol, 3),
        ] {
            for _ in 0..times {
                endpoint.error(kind);
            }
            errors
                .with_label_values(&[&endpoint.service, &endpoint.endpoint, kind.as_str()])
                .inc_by(times);
        }
        // Service-level series, in the same family.
        metrics.unrouted(http::StatusCode::BAD_REQUEST);
        api.answered(http::StatusCode::NOT_FOUND);
        requests.with_label_values(&["", "", "400"]).inc();
        requests.with_label_values(&["api.shop", "", "404"]).inc();

        let out = text(&registry);
        let expected = text(&reference);
        assert_eq!(counter_lines(&out), counter_lines(&expected), "{out}");
        assert_eq!(
            counter_lines(&out),
            [
                r#"# HELP proxima_requests_total Requests answered, by service, endpoint and status code ("error" when the endpoint failed)."#,
                "# TYPE proxima_requests_total counter",
                r#"proxima_requests_total{code="200",endpoint="pod-a",service="api.shop"} 3"#,
                r#"proxima_requests_total{code="200",endpoint="w-1",service="web.shop"} 5"#,
                r#"proxima_requests_total{code="204",endpoint="pod-b",service="api.shop"} 1"#,
                r#"proxima_requests_total{code="299",endpoint="pod-a",service="api.shop"} 1"#,
                r#"proxima_requests_total{code="400",endpoint="",service=""} 1"#,
                r#"proxima_requests_total{code="404",endpoint="",service="api.shop"} 1"#,
                r#"proxima_requests_total{code="418",endpoint="pod-a",service="api.shop"} 2"#,
                r#"proxima_requests_total{code="503",endpoint="pod-a",service="api.shop"} 1"#,
                r#"proxima_requests_total{code="599",endpoint="pod-b",service="api.shop"} 1"#,
                r#"proxima_requests_total{code="error",endpoint="pod-a",service="api.shop"} 1"#,
                r#"proxima_requests_total{code="error",endpoint="w-1",service="web.shop"} 2"#,
                "# HELP proxima_upstream_errors_total Failed attempts to endpoints, by kind.",
                "# TYPE proxima_upstream_errors_total counter",
                r#"proxima_upstream_errors_total{endpoint="pod-a",kind="connect",service="api.shop"} 2"#,
                r#"proxima_upstream_errors_total{endpoint="pod-a",kind="timeout",service="api.shop"} 1"#,
                r#"proxima_upstream_errors_total{endpoint="w-1",kind="protocol",service="web.shop"} 3"#,
                r#"proxima_upstream_errors_total{endpoint="w-1",kind="reset",service="web.shop"} 1"#,
            ],
            "{out}"
        );
        // The service's pods share its label value.
        assert!(Arc::ptr_eq(&a.service, &b.service));
        assert!(Arc::ptr_eq(&a.service, &api.label));
    }

    #[test]
    fn endpoints_that_counted_nothing_render_nothing() {
        let registry = Registry::new();
        let metrics = Metrics::new(&registry).unwrap();
        let s = metrics.service(&ServiceKey::new("shop", "api"));
        let quiet = s.endpoint("pod-quiet");
        quiet.upstream_duration(Duration::from_millis(1));
        // No series at all yet: the families are left out, HELP and TYPE included.
        let out = text(&registry);
        assert_eq!(counter_lines(&out), Vec::<&str>::new(), "{out}");

        s.endpoint("pod-busy").error(ErrorKind::Connect);
        let out = text(&registry);
        assert!(!out.contains("pod-quiet"), "{out}");
        assert!(!out.contains("proxima_requests_total"), "{out}");
        assert_eq!(
            counter_lines(&out),
            [
                "# HELP proxima_upstream_errors_total Failed attempts to endpoints, by kind.",
                "# TYPE proxima_upstream_errors_total counter",
                r#"proxima_upstream_errors_total{endpoint="pod-busy",kind="connect",service="api.shop"} 1"#,
            ],
            "{out}"
        );
    }

    #[test]
    fn forgotten_endpoints_lose_their_series() {
        let registry = Registry::new();
        let metrics = Metrics::new(&registry).unwrap();
        let key = ServiceKey::new("shop", "api");
        let s = metrics.service(&key);
        let gone = s.endpoint("pod-gone");
        gone.response(http::StatusCode::OK);
        gone.response(http::StatusCode::IM_A_TEAPOT);
        gone.failed_request();
        gone.error(ErrorKind::Timeout);
        s.endpoint("pod-kept").response(http::StatusCode::OK);
        s.answered(http::StatusCode::NOT_FOUND);
        assert!(text(&registry).contains("pod-gone"));

        metrics.forget_missing(&table_with(&key, &["pod-kept"]).table());
        let out = text(&registry);
        assert!(!out.contains("pod-gone"), "{out}");
        // The only errors were pod-gone's: the family is gone with them.
        assert!(!out.contains("proxima_upstream_errors_total"), "{out}");
        assert_eq!(
            counter_lines(&out)[2..],
            [
                r#"proxima_requests_total{code="200",endpoint="pod-kept",service="api.shop"} 1"#,
                r#"proxima_requests_total{code="404",endpoint="",service="api.shop"} 1"#,
            ],
            "{out}"
        );
        // A request still holding the forgotten endpoint counts where nobody looks.
        gone.response(http::StatusCode::OK);
        assert!(!text(&registry).contains("pod-gone"));
        // Back in the table, it starts from zero under a new handle.
        let back = s.endpoint("pod-gone");
        assert!(!Arc::ptr_eq(&gone, &back));
        back.response(http::StatusCode::OK);
        assert!(text(&registry).contains(
            r#"proxima_requests_total{code="200",endpoint="pod-gone",service="api.shop"} 1"#
        ));

        // The service leaves the table: all its series go, the service-level ones too.
        metrics.forget_missing(&table_with(&ServiceKey::new("shop", "other"), &[]).table());
        let out = text(&registry);
        assert_eq!(counter_lines(&out), Vec::<&str>::new(), "{out}");

        // Requests still in flight for it count nowhere: neither the series they had
        // used nor those they use first bring it back.
        s.answered(http::StatusCode::NOT_FOUND);
        s.answered(http::StatusCode::SERVICE_UNAVAILABLE);
        s.slo(true);
        s.slo(false);
        s.retry();
        s.retry_refused();
        s.overdue();
        s.abandoned();
        s.pick(Reason::Pool);
        let out = text(&registry);
        assert!(!out.contains("api.shop"), "{out}");
    }
}
