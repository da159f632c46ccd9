//! Command line arguments of `proxima run`, `proxima demo` and `proxima check` (the
//! commands themselves are dispatched in `main.rs`).
//!
//! Every flag of `run` can also be set through an environment variable (shown in
//! `--help`), which is how a DaemonSet configures the proxy.
//!
//! `--discovery` picks where services come from: `file:PATH` (a YAML topology) or `kube`
//! (the Kubernetes API, configured by the flags under "Kubernetes discovery").

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use http::HeaderName;
use proxima_k8s::{K8sConfig, LabelSelector};
use proxima_proxy::ProxyConfig;

#[derive(Debug, Parser)]
#[command(
    name = "proxima",
    version,
    about = "Latency-aware HTTP proxy for Kubernetes edge clusters",
    long_about = "Proxima runs on every node of an edge cluster. Clients send plain HTTP to the \
proxy on their node and name the target Service in a header (x-service: name[.namespace]) or in \
Host. Proxima forwards each request to a pod of that Service chosen from its QoS pool: the pods \
whose measured response times predict they meet the Service's latency SLO.\n\n\
New here? Run `proxima demo`: it needs no cluster.",
    after_help = "Run `proxima <COMMAND> --help` for the flags of a command."
)]
pub struct Cli {
    #[command(flatten)]
    pub log: LogArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the proxy, its admin server and service discovery.
    #[command(
        after_help = "Examples:\n  proxima run --discovery file:topology.yaml --node-name worker-1\n  \
proxima run --discovery kube --kubeconfig ~/.kube/config --namespaces shop,edge\n\n\
Send requests with:  curl -H 'x-service: NAME.NAMESPACE' localhost:8080/\n\
Inspect pools with:  curl localhost:9901/debug/pools"
    )]
    Run(RunArgs),
    /// Try Proxima without a cluster: emulated pods on this machine, behind the real proxy.
    #[command(
        long_about = "Try Proxima without a cluster. Starts emulated pods (HTTP servers with \
different processing times) on 127.0.0.1, writes their topology to a file that the proxy \
follows (edit it while the demo runs), sends a little traffic, and serves the proxy and its \
admin endpoints as `proxima run` does."
    )]
    Demo(DemoArgs),
    /// Check topology files and report every problem with its line.
    Check(CheckArgs),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Args)]
pub struct LogArgs {
    /// Log line format: `text` for people, `json` for log collectors (one object per line).
    #[arg(
        long,
        env = "PROXIMA_LOG_FORMAT",
        value_enum,
        default_value_t = LogFormat::Text,
        value_name = "FORMAT",
        global = true,
        help_heading = "Logging"
    )]
    pub log_format: LogFormat,

    /// Which log lines to print, in RUST_LOG syntax: a level (error, warn, info, debug,
    /// trace) or per-module levels such as `info,proxima_proxy=debug`.
    #[arg(
        long,
        env = "PROXIMA_LOG",
        default_value = "info",
        value_name = "FILTER",
        global = true,
        help_heading = "Logging"
    )]
    pub log_level: String,
}

/// Discovery: where services and endpoints come from. Parsed from `--discovery`; the
/// one name for this idea in flags, types and docs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Discovery {
    /// `file:PATH`: a YAML topology file, reloaded when it changes.
    File(PathBuf),
    /// `kube`: Services, EndpointSlices and Nodes watched through the Kubernetes API.
    Kube,
}

impl FromStr for Discovery {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once(':') {
            Some(("file", path)) if !path.is_empty() => Ok(Discovery::File(PathBuf::from(path))),
            Some(("file", _)) => {
                Err("`file:` needs a path, e.g. file:/etc/proxima/topology.yaml".into())
            }
            None if s == "kube" => Ok(Discovery::Kube),
            _ => Err(format!(
                "unknown discovery {s:?}: expected file:PATH (a YAML topology file) or \
                 kube (the Kubernetes API; choose namespaces with --namespaces)"
            )),
        }
    }
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Where services and endpoints come from. `file:PATH` follows a YAML topology file,
    /// reloading it when it changes (an invalid edit is logged and ignored). `kube`
    /// watches Services, EndpointSlices and Nodes through the Kubernetes API and routes
    /// the Services annotated `proxima.io/enabled: "true"` (see --service-selector).
    #[arg(long, env = "PROXIMA_DISCOVERY", value_name = "file:PATH|kube")]
    pub discovery: Discovery,

    #[command(flatten)]
    pub serve: ServeArgs,

    #[command(flatten)]
    pub kube: KubeArgs,
}

/// What `run` and `demo` both serve: the proxy's and the admin server's addresses and
/// the data plane's flags. The defaults listen on every interface, as a DaemonSet
/// needs; `demo` overrides them to loopback (see [`DemoArgs`]).
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address the proxy listens on for client requests (HTTP/1.1 and h2c).
    #[arg(
        long,
        env = "PROXIMA_LISTEN",
        default_value = "0.0.0.0:8080",
        value_name = "ADDR"
    )]
    pub listen: SocketAddr,

    /// Address of the admin server: /metrics, /healthz, /readyz, /debug/pools.
    #[arg(
        long,
        env = "PROXIMA_ADMIN",
        default_value = "0.0.0.0:9901",
        value_name = "ADDR"
    )]
    pub admin: SocketAddr,

    #[command(flatten)]
    pub proxy: ProxyArgs,
}

/// Settings of `--discovery kube`; ignored by file discovery.
#[derive(Debug, Default, Args)]
#[command(next_help_heading = "Kubernetes discovery (--discovery kube)")]
pub struct KubeArgs {
    /// Kubeconfig file with the API server and credentials to use. Without it the proxy
    /// reads ~/.kube/config, and inside a pod uses its service account (in-cluster).
    #[arg(long, env = "KUBECONFIG", value_name = "PATH", value_parser = parse_kubeconfig)]
    kubeconfig: Option<PathBuf>,

    /// Watch only these namespaces, comma-separated (e.g. shop,edge). Default: all
    /// namespaces, which needs cluster-wide list/watch of Services and EndpointSlices.
    #[arg(
        long,
        env = "PROXIMA_NAMESPACES",
        value_name = "NS,..",
        value_delimiter = ',',
        value_parser = parse_namespace
    )]
    pub namespaces: Vec<String>,

    /// Also route the Services whose labels match this selector (comma-separated
    /// key=value, key!=value, key or !key, e.g. proxima=on), besides those annotated
    /// proxima.io/enabled: "true"; the annotation "false" opts a Service out.
    #[arg(
        long,
        env = "PROXIMA_SERVICE_SELECTOR",
        value_name = "SELECTOR",
        value_parser = parse_selector
    )]
    pub service_selector: Option<LabelSelector>,

    /// Do not publish Kubernetes Events (reason InvalidAnnotation) about Services with
    /// invalid proxima.io/ annotations; they are still logged. Publishing needs RBAC
    /// create on events.k8s.io events.
    #[arg(long, env = "PROXIMA_NO_EVENTS", value_parser = clap::builder::BoolishValueParser::new())]
    pub no_events: bool,
}

impl KubeArgs {
    /// The kubeconfig to use, if one is named (an empty `KUBECONFIG` names none, as for
    /// kubectl).
    pub fn kubeconfig(&self) -> Option<&Path> {
        self.kubeconfig
            .as_deref()
            .filter(|p| !p.as_os_str().is_empty())
    }

    /// Discovery settings; `node` names this proxy in the Events it publishes.
    pub fn config(&self, node: Option<&str>) -> K8sConfig {
        K8sConfig {
            // Empty entries (`a,,b`, an empty PROXIMA_NAMESPACES) name nothing.
            namespaces: self
                .namespaces
                .iter()
                .filter(|ns| !ns.is_empty())
                .cloned()
                .collect(),
            selector: self.service_selector.clone(),
            publish_events: !self.no_events,
            instance: node.map(str::to_string),
        }
    }
}

#[derive(Debug, Args)]
pub struct ProxyArgs {
    /// Name of the node this proxy runs on (set it from the pod's spec.nodeName); used by
    /// locality-aware strategies and shown in /debug/pools.
    #[arg(long, env = "NODE_NAME", value_name = "NAME")]
    pub node_name: Option<String>,

    /// Request header that names the target service as name[.namespace][:port]; requests
    /// without it are routed by their Host header.
    #[arg(
        long,
        env = "PROXIMA_SERVICE_HEADER",
        default_value = "x-service",
        value_name = "HEADER",
        value_parser = parse_header_name
    )]
    pub service_header: HeaderName,

    /// Namespace of services named without one (`x-service: dps` means dps.<this>).
    #[arg(
        long,
        env = "PROXIMA_DEFAULT_NAMESPACE",
        default_value = proxima_core::ServiceKey::DEFAULT_NAMESPACE,
        value_name = "NAMESPACE"
    )]
    pub default_namespace: String,

    /// Cluster DNS domain, so that Host: name.namespace.svc.<domain> is understood.
    #[arg(
        long,
        env = "PROXIMA_CLUSTER_DOMAIN",
        default_value = "cluster.local",
        value_name = "DOMAIN"
    )]
    pub cluster_domain: String,

    /// Largest total size of a request's headers, in bytes; larger requests get 431.
    #[arg(
        long,
        env = "PROXIMA_MAX_HEADER_BYTES",
        default_value = "16384",
        value_name = "BYTES",
        value_parser = parse_header_bytes
    )]
    pub max_header_bytes: usize,

    /// On SIGTERM or SIGINT, how long requests in flight may take to finish before the
    /// proxy exits (e.g. 30s; a second signal exits at once).
    #[arg(
        long,
        env = "PROXIMA_SHUTDOWN_GRACE",
        default_value = "30s",
        value_name = "DURATION",
        value_parser = parse_duration
    )]
    pub shutdown_grace: Duration,

    /// Data-plane worker threads, each with its own single-threaded runtime sharing the
    /// listener (nginx's `worker_processes`). Default: TOKIO_WORKER_THREADS if set, else
    /// one per CPU. Discovery, the admin server and probes run on a separate runtime.
    #[arg(long, env = "PROXIMA_WORKERS", value_name = "COUNT",
        value_parser = clap::value_parser!(u16).range(1..))]
    pub workers: Option<u16>,

    /// Which CPUs the workers run on: `shared`, any the process may use, placed by the
    /// kernel; or `pinned`, worker n on the n-th of them (nginx's `worker_cpu_affinity
    /// auto`), for a proxy given CPUs of its own.
    #[arg(
        long,
        env = "PROXIMA_WORKER_CPUS",
        value_enum,
        default_value_t = WorkerCpusArg::Shared,
        value_name = "PLACEMENT"
    )]
    pub worker_cpus: WorkerCpusArg,

    /// A worker that has run this long without sleeping, while another worker has not
    /// run for as long, gives its CPU away once, so that a worker queued on the same
    /// CPU is not held until the kernel's next tick. 0 turns it off. Only two or more
    /// unpinned workers, no more than the CPUs, ever yield.
    #[arg(
        long,
        env = "PROXIMA_WORKER_YIELD_AFTER",
        default_value = "500us",
        value_name = "DURATION",
        value_parser = parse_duration
    )]
    pub worker_yield_after: Duration,

    /// How long an idle keep-alive connection to a pod is kept for reuse.
    #[arg(
        long,
        env = "PROXIMA_UPSTREAM_IDLE_TIMEOUT",
        default_value = "60s",
        value_name = "DURATION",
        value_parser = parse_duration
    )]
    pub upstream_idle_timeout: Duration,

    /// Most idle keep-alive connections kept to one pod (as nginx's `keepalive N`);
    /// beyond it the pod's oldest idle connection is closed. 0 turns keep-alive to pods
    /// off. Below the number of requests a pod has in flight at once, connections are
    /// closed on return and opened again a moment later.
    #[arg(
        long,
        env = "PROXIMA_UPSTREAM_MAX_IDLE_PER_ENDPOINT",
        default_value = "256",
        value_name = "COUNT"
    )]
    pub upstream_max_idle_per_endpoint: usize,

    /// Most idle keep-alive connections kept to all pods together; beyond it the oldest
    /// idle connection is closed. 0 turns keep-alive to pods off.
    #[arg(
        long,
        env = "PROXIMA_UPSTREAM_MAX_IDLE",
        default_value = "1024",
        value_name = "COUNT"
    )]
    pub upstream_max_idle: usize,

    /// Of the idle keep-alive connections, most that keep their HTTP/1.1 buffers and task
    /// (about 32 KiB each); beyond it the least recently used are parked: only the socket
    /// is kept, and taking it again costs no TCP handshake. 0 parks every idle connection.
    #[arg(
        long,
        env = "PROXIMA_UPSTREAM_MAX_IDLE_BUFFERED",
        default_value = "64",
        value_name = "COUNT"
    )]
    pub upstream_max_idle_buffered: usize,

    /// Most requests at once on one HTTP/2 connection to a pod whose port speaks h2c (or
    /// fewer, if the pod's SETTINGS_MAX_CONCURRENT_STREAMS says so); beyond it another
    /// connection is opened.
    #[arg(
        long,
        env = "PROXIMA_UPSTREAM_H2_MAX_STREAMS",
        default_value = "100",
        value_name = "COUNT",
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub upstream_h2_max_streams: u32,

    /// How often each HTTP/2 connection to a pod is pinged; one ping unanswered for 5 s
    /// (or this, if shorter) closes it, so that a pod gone silent takes no more requests.
    #[arg(
        long,
        env = "PROXIMA_UPSTREAM_H2_PING_INTERVAL",
        default_value = "10s",
        value_name = "DURATION",
        value_parser = parse_period
    )]
    pub upstream_h2_ping_interval: Duration,

    /// Most first probes of new endpoints in flight at once; more that are due wait for a
    /// later tick (100 ms). Bounds the connections a start or a large rollout opens at
    /// once. Probes of evicted endpoints are not bounded.
    #[arg(
        long,
        env = "PROXIMA_MAX_CONCURRENT_FIRST_PROBES",
        default_value = "32",
        value_name = "COUNT",
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub max_concurrent_first_probes: u32,

    /// Local address to connect to pods from (as HAProxy's `source`): pods, and
    /// anything between, see it as the peer. Background probes and peer latency probes
    /// leave from it too. Default: the kernel chooses.
    #[arg(long, env = "PROXIMA_UPSTREAM_BIND", value_name = "IP")]
    pub upstream_bind: Option<IpAddr>,

    /// Also export a latency histogram per pod (proxima_upstream_duration_seconds with
    /// service and endpoint labels, 16 series per pod). Off by default: per-service
    /// histograms and per-pod counters and gauges keep /metrics small at 1000 pods.
    #[arg(
        long,
        env = "PROXIMA_METRICS_POD_HISTOGRAMS",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub metrics_pod_histograms: bool,

    #[command(flatten)]
    pub limits: LimitArgs,

    #[command(flatten)]
    pub admin: AdminArgs,

    #[command(flatten)]
    pub nodes: NodesArgs,
}

/// Limits and timeouts of client connections (README: "Limits and timeouts").
#[derive(Debug, Args)]
#[command(next_help_heading = "Limits and timeouts")]
pub struct LimitArgs {
    /// Time a new client connection has to send its first request's headers (this
    /// covers telling HTTP/1.1 from HTTP/2, so silent sockets and partial HTTP/2
    /// prefaces are closed), and an HTTP/1.1 client each next request's headers once
    /// their first byte arrived.
    #[arg(
        long,
        env = "PROXIMA_CLIENT_HEADER_TIMEOUT",
        default_value = "30s",
        value_name = "DURATION",
        value_parser = parse_period
    )]
    pub client_header_timeout: Duration,

    /// A client connection with no request in flight for this long is closed
    /// (HTTP/1.1 keep-alive; HTTP/2 after its last stream, with GOAWAY).
    #[arg(
        long,
        env = "PROXIMA_CLIENT_IDLE_TIMEOUT",
        default_value = "60s",
        value_name = "DURATION",
        value_parser = parse_period
    )]
    pub client_idle_timeout: Duration,

    /// While a response body streams, a client connection on which no byte moves for
    /// this long is closed, and the pod connection with it: a client that stopped
    /// reading, a pod that stopped sending, or a client that stopped sending its body.
    #[arg(
        long,
        env = "PROXIMA_BODY_IDLE_TIMEOUT",
        default_value = "60s",
        value_name = "DURATION",
        value_parser = parse_period
    )]
    pub body_idle_timeout: Duration,

    /// An upgraded connection (a WebSocket tunnelled to a pod) on which no byte moves
    /// either way for this long is closed.
    #[arg(
        long,
        env = "PROXIMA_TUNNEL_IDLE_TIMEOUT",
        default_value = "5m",
        value_name = "DURATION",
        value_parser = parse_period
    )]
    pub tunnel_idle_timeout: Duration,

    /// How long a tunnel stays open once its pod has left discovery (deleted, or gone
    /// from the topology file); the pod gets no new tunnels meanwhile.
    #[arg(
        long,
        env = "PROXIMA_TUNNEL_REMOVED_GRACE",
        default_value = "10s",
        value_name = "DURATION",
        value_parser = parse_period
    )]
    pub tunnel_removed_grace: Duration,

    /// Most tunnels (WebSockets) one client address may hold open; beyond it its
    /// upgrades get 429, so that one client cannot take every connection place.
    #[arg(
        long,
        env = "PROXIMA_MAX_TUNNELS_PER_CLIENT",
        default_value = "256",
        value_name = "COUNT"
    )]
    pub max_tunnels_per_client: usize,

    /// Most client connections open at once; beyond it new connections are closed as
    /// soon as they are accepted. `auto`: half of the open-file limit (ulimit -n) left
    /// after 256 descriptors kept for pods, discovery and the admin server (each
    /// proxied request may hold a pod connection too), at least 16.
    #[arg(
        long,
        env = "PROXIMA_MAX_CLIENT_CONNECTIONS",
        default_value = "auto",
        value_name = "COUNT|auto",
        value_parser = parse_connection_budget
    )]
    pub max_client_connections: ConnectionBudget,

    /// Most requests in flight at once, on all connections (HTTP/2 streams included),
    /// from their headers until their response body is sent; beyond it requests get 503
    /// at once, with a JSON body and `retry-after: 1`, instead of queueing.
    #[arg(
        long,
        env = "PROXIMA_MAX_CONCURRENT_REQUESTS",
        default_value = "4096",
        value_name = "COUNT",
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub max_concurrent_requests: u32,

    /// Most header lines in a client request; more get 431 with a JSON body.
    #[arg(
        long,
        env = "PROXIMA_MAX_REQUEST_HEADERS",
        default_value = "200",
        value_name = "COUNT",
        value_parser = parse_header_count
    )]
    pub max_request_headers: usize,

    /// Most header lines in a pod's response; more make the attempt fail with 502.
    #[arg(
        long,
        env = "PROXIMA_MAX_RESPONSE_HEADERS",
        default_value = "500",
        value_name = "COUNT",
        value_parser = parse_header_count
    )]
    pub max_response_headers: usize,

    /// Longest request target (path and query) in bytes; longer ones get 414 with a
    /// JSON body.
    #[arg(
        long,
        env = "PROXIMA_MAX_URI_BYTES",
        default_value = "8192",
        value_name = "BYTES",
        value_parser = parse_uri_bytes
    )]
    pub max_uri_bytes: usize,
}

/// Who may use the admin server's `/debug/*` and `/node/*` endpoints.
#[derive(Debug, Default, Args)]
#[command(next_help_heading = "Admin access")]
pub struct AdminArgs {
    /// Shared token that opens /debug/* and /node/* on the admin port to clients off
    /// loopback (`Authorization: Bearer TOKEN`); the peer prober sends it to other
    /// nodes' proxies, so give every node the same one (e.g. from a Secret).
    /// /metrics, /healthz and /readyz never need it.
    #[arg(
        long,
        env = "PROXIMA_ADMIN_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    pub admin_token: Option<String>,

    /// Networks (CIDR, comma-separated, e.g. 10.0.0.0/8) whose clients may use /debug/*
    /// and /node/* without the token, besides loopback: on a cluster, the node network,
    /// so that peers' /node/ping probes are answered.
    #[arg(
        long,
        env = "PROXIMA_ADMIN_TRUSTED_NETWORKS",
        value_name = "CIDR,..",
        value_delimiter = ',',
        value_parser = parse_cidr
    )]
    pub admin_trusted_networks: Vec<(IpAddr, u8)>,
}

impl AdminArgs {
    /// Who may use the admin server's `/debug/*` and `/node/*`: the token (an empty one
    /// is none) and the trusted networks, besides loopback.
    pub fn access(&self) -> proxima_admin::AdminAccess {
        proxima_admin::AdminAccess {
            token: self.admin_token.clone().filter(|t| !t.is_empty()),
            trusted: self.admin_trusted_networks.clone(),
            open: false,
        }
    }
}

fn parse_cidr(value: &str) -> Result<(IpAddr, u8), String> {
    let (addr, bits) = value.trim().split_once('/').unwrap_or((value.trim(), ""));
    let addr: IpAddr = addr
        .parse()
        .map_err(|_| format!("{value:?} is not a network: expected CIDR such as 10.0.0.0/8"))?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let bits = if bits.is_empty() {
        max
    } else {
        bits.parse::<u8>()
            .ok()
            .filter(|b| *b <= max)
            .ok_or_else(|| format!("{value:?}: the prefix length must be 0 to {max}"))?
    };
    Ok((addr, bits))
}

/// `--max-client-connections`: a number, or derived from the open-file limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionBudget {
    Auto,
    Fixed(usize),
}

/// Descriptors kept out of the `auto` connection budget for everything else.
const RESERVED_FDS: u64 = 256;

impl ConnectionBudget {
    /// The number of connections; `auto` reads the soft open-file limit.
    pub fn resolve(self) -> usize {
        match self {
            ConnectionBudget::Fixed(n) => n,
            ConnectionBudget::Auto => auto_budget(open_file_limit()),
        }
    }
}

impl ConnectionBudget {
    /// Why a fixed budget cannot be held under this process's open-file limit, if it
    /// cannot: every client connection is a descriptor, and pods, discovery and the admin
    /// server need theirs (e.g. 20000 connections where the runtime gives 20000 files).
    pub fn warning(self) -> Option<String> {
        fixed_budget_warning(self, open_file_limit())
    }
}

fn fixed_budget_warning(budget: ConnectionBudget, limit: Option<u64>) -> Option<String> {
    let (ConnectionBudget::Fixed(n), Some(limit)) = (budget, limit) else {
        return None;
    };
    (n as u64).saturating_add(RESERVED_FDS).gt(&limit).then(|| {
        format!(
            "--max-client-connections {n} does not fit the open-file limit of {limit} (ulimit -n): \
             with that many clients the proxy would run out of descriptors for pods, discovery \
             and the admin server; `auto` would allow {}",
            auto_budget(Some(limit))
        )
    })
}

/// The `auto` budget for an open-file limit (`None`: unknown or unlimited).
fn auto_budget(limit: Option<u64>) -> usize {
    match limit {
        Some(limit) => {
            { usize::try_from(limit.saturating_sub(RESERVED_FDS) / 2).unwrap_or(usize::MAX) }
                .clamp(16, 1 << 20)
        }
        None => 1 << 16,
    }
}

/// The soft limit on open files of this process, from /proc (Linux).
fn open_file_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn parse_connection_budget(value: &str) -> Result<ConnectionBudget, String> {
    if value == "auto" {
        return Ok(ConnectionBudget::Auto);
    }
    value
        .parse::<usize>()
        .ok()
        .filter(|n| *n >= 1)
        .map(ConnectionBudget::Fixed)
        .ok_or_else(|| format!("{value:?}: expected `auto` or a number of connections (1 or more)"))
}

fn parse_header_count(value: &str) -> Result<usize, String> {
    parse_count(value, 8..=10_000, "header lines")
}

fn parse_uri_bytes(value: &str) -> Result<usize, String> {
    parse_count(value, 256..=60_000, "bytes")
}

/// A number of `unit` within `range`.
fn parse_count(
    value: &str,
    range: std::ops::RangeInclusive<usize>,
    unit: &str,
) -> Result<usize, String> {
    value
        .parse::<usize>()
        .ok()
        .filter(|n| range.contains(n))
        .ok_or_else(|| {
            format!(
                "{value:?}: expected a number of {unit} from {} to {}",
                range.start(),
                range.end()
            )
        })
}

/// Which CPUs the data-plane workers run on (`--worker-cpus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WorkerCpusArg {
    /// Any CPU the process may use; the kernel places them.
    Shared,
    /// Worker n on the n-th CPU the process may use.
    Pinned,
}

/// Where node CPU and memory usage comes from (`--usage-source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum UsageSource {
    /// metrics-server with --discovery kube (peer reports while it does not answer),
    /// else peer reports.
    Auto,
    /// metrics.k8s.io NodeMetrics ÷ allocatable; needs --discovery kube. Peer reports
    /// stand in while it does not answer.
    MetricsServer,
    /// Each proxy reads its own node's usage from /proc and reports it in its
    /// /node/ping replies.
    Peers,
    /// No usage: resource-aware strategies act as if none were known.
    Off,
}

/// Node-to-node latency and node usage, read by the resource- and proximity-aware
/// strategies (see `proxima_nodes`).
#[derive(Debug, Args)]
#[command(next_help_heading = "Node measurements")]
pub struct NodesArgs {
    /// Admin port of the proxies on other nodes, probed at GET /node/ping (at each
    /// Node's first address) to measure node-to-node latency. A node's
    /// proxima.io/admin-port label overrides it for that node.
    #[arg(
        long,
        env = "PROXIMA_PEER_PORT",
        default_value = "9901",
        value_name = "PORT"
    )]
    pub peer_port: u16,

    /// Time between two rounds of peer probes.
    #[arg(
        long,
        env = "PROXIMA_PEER_PROBE_INTERVAL",
        default_value = "2s",
        value_name = "DURATION",
        value_parser = parse_period
    )]
    pub peer_probe_interval: Duration,

    /// Time limit of one peer probe, connect included; a peer that does not answer in
    /// time counts as a failure (proxima_peer_probe_failures_total).
    #[arg(
        long,
        env = "PROXIMA_PEER_PROBE_TIMEOUT",
        default_value = "1s",
        value_name = "DURATION",
        value_parser = parse_period
    )]
    pub peer_probe_timeout: Duration,

    /// Most peers probed per round: nodes hosting routed pods first, then nodes with
    /// old or no readings, then random ones. Bounds the cost on large clusters; 0
    /// turns peer probing off.
    #[arg(
        long,
        env = "PROXIMA_PEER_SAMPLE",
        default_value = "32",
        value_name = "COUNT"
    )]
    pub peer_sample: usize,

    /// Bytes of pod reports (processing-time estimates, failure verdicts) this proxy's
    /// ping replies carry for its neighbours, and whether it takes in theirs: a pod a
    /// neighbour saw fail is probed before it takes another request here, and a pod not
    /// measured here is predicted from a neighbour's measurement of it. 0 shares nothing.
    #[arg(
        long,
        env = "PROXIMA_PEER_SHARE_BYTES",
        default_value = "4096",
        value_name = "BYTES"
    )]
    pub peer_share_bytes: usize,

    /// Where node CPU and memory usage comes from (for the rap strategy).
    #[arg(
        long,
        env = "PROXIMA_USAGE_SOURCE",
        value_enum,
        default_value_t = UsageSource::Auto,
        value_name = "SOURCE"
    )]
    pub usage_source: UsageSource,

    /// Time between two polls of metrics.k8s.io.
    #[arg(
        long,
        env = "PROXIMA_USAGE_POLL_INTERVAL",
        default_value = "15s",
        value_name = "DURATION",
        value_parser = parse_period
    )]
    pub usage_poll_interval: Duration,

    /// Node latency and usage readings older than this count as missing.
    #[arg(
        long,
        env = "PROXIMA_NODE_READING_MAX_AGE",
        default_value = "30s",
        value_name = "DURATION",
        value_parser = parse_period
    )]
    pub node_reading_max_age: Duration,

    /// Accept PUT /node/usage on the admin port (body {"cpu": 0.5, "ram": 0.3}, or
    /// null to clear) to override the usage this proxy reports for its node. For tests
    /// and testbeds; off by default.
    #[arg(
        long,
        env = "PROXIMA_ALLOW_USAGE_OVERRIDE",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub allow_usage_override: bool,
}

impl ProxyArgs {
    /// Which optional metrics the proxy exports.
    pub fn metrics_options(&self) -> proxima_proxy::MetricsOptions {
        proxima_proxy::MetricsOptions {
            pod_histograms: self.metrics_pod_histograms,
        }
    }

    /// How many data-plane workers to run: `--workers`, else TOKIO_WORKER_THREADS (the
    /// variable tokio's own runtime reads), else one per CPU.
    pub fn worker_count(&self) -> usize {
        if let Some(workers) = self.workers {
            return usize::from(workers);
        }
        std::env::var("TOKIO_WORKER_THREADS")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from))
    }

    /// How the data-plane workers run: `--workers`, `--worker-cpus`,
    /// `--worker-yield-after`.
    pub fn worker_options(&self) -> proxima_proxy::WorkerOptions {
        proxima_proxy::WorkerOptions {
            count: self.worker_count(),
            cpus: match self.worker_cpus {
                WorkerCpusArg::Shared => proxima_proxy::WorkerCpus::Shared,
                WorkerCpusArg::Pinned => proxima_proxy::WorkerCpus::Pinned,
            },
            yield_after: Some(self.worker_yield_after).filter(|d| !d.is_zero()),
        }
    }

    /// The data plane's settings from these flags (the connection budget resolved).
    pub fn config(&self) -> ProxyConfig {
        ProxyConfig {
            service_header: self.service_header.clone(),
            default_namespace: self.default_namespace.clone(),
            cluster_domain: self.cluster_domain.clone(),
            max_header_bytes: self.max_header_bytes,
            shutdown_grace: self.shutdown_grace,
            pool_idle_timeout: self.upstream_idle_timeout,
            max_idle_per_endpoint: self.upstream_max_idle_per_endpoint,
            max_idle_total: self.upstream_max_idle,
            max_idle_buffered: self.upstream_max_idle_buffered,
            h2_max_streams: self.upstream_h2_max_streams,
            h2_ping_interval: self.upstream_h2_ping_interval,
            max_concurrent_first_probes: self.max_concurrent_first_probes as usize,
            upstream_bind: self.upstream_bind,
            client_header_timeout: self.limits.client_header_timeout,
            client_idle_timeout: self.limits.client_idle_timeout,
            body_idle_timeout: self.limits.body_idle_timeout,
            tunnel_idle_timeout: self.limits.tunnel_idle_timeout,
            tunnel_removed_grace: self.limits.tunnel_removed_grace,
            max_tunnels_per_client: self.limits.max_tunnels_per_client,
            max_client_connections: self.limits.max_client_connections.resolve(),
            max_concurrent_requests: self.limits.max_concurrent_requests as usize,
            max_request_headers: self.limits.max_request_headers,
            max_response_headers: self.limits.max_response_headers,
            max_uri_bytes: self.limits.max_uri_bytes,
        }
    }
}

/// Flags of `proxima demo`. It serves as `run` does, but on loopback by default: the
/// demo is for trying Proxima on a workstation, not for exposing it.
#[derive(Debug, Args)]
#[command(
    mut_arg("listen", |arg| arg.default_value("127.0.0.1:8080")),
    mut_arg("admin", |arg| arg.default_value("127.0.0.1:9901"))
)]
pub struct DemoArgs {
    /// Topology to emulate instead of the built-in one (2 services, 5 pods on 3 nodes);
    /// its `emulate.pods` section says which endpoints to emulate and how slow they are.
    #[arg(long, value_name = "PATH")]
    pub topology: Option<PathBuf>,

    /// Where to write the topology the proxy follows, with the emulated pods' addresses.
    #[arg(long, default_value = "proxima-demo.yaml", value_name = "PATH")]
    pub write: PathBuf,

    /// Requests per second the demo sends to each service through the proxy, so that
    /// pools form without any curl (0: none).
    #[arg(long, default_value = "5", value_name = "RATE")]
    pub load: f64,

    #[command(flatten)]
    pub serve: ServeArgs,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Topology files to check.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
}

fn parse_header_name(value: &str) -> Result<HeaderName, String> {
    HeaderName::from_str(value).map_err(|_| format!("{value:?} is not a valid HTTP header name"))
}

fn parse_duration(value: &str) -> Result<Duration, String> {
    proxima_core::settings::parse_duration(value).ok_or_else(|| {
        format!("{value:?} is not a duration: write it with a unit, e.g. 30s or 500ms")
    })
}

/// A duration above zero.
fn parse_period(value: &str) -> Result<Duration, String> {
    match parse_duration(value)? {
        d if d.is_zero() => Err(format!("{value:?}: must be longer than zero")),
        d => Ok(d),
    }
}

fn parse_selector(value: &str) -> Result<LabelSelector, String> {
    value
        .parse()
        .map_err(|e: proxima_k8s::SelectorError| e.to_string())
}

/// Any path; empty is allowed here and means "none" (see [`KubeArgs::kubeconfig`]).
fn parse_kubeconfig(value: &str) -> Result<PathBuf, String> {
    Ok(PathBuf::from(value))
}

/// A namespace name: a DNS label (lower-case letters, digits and `-`, at most 63), or
/// empty (skipped).
fn parse_namespace(value: &str) -> Result<String, String> {
    let value = value.trim();
    if value.is_empty() || proxima_core::is_dns_label(value) {
        Ok(value.to_string())
    } else {
        Err(format!(
            "{value:?} is not a namespace name (lower-case letters, digits and '-')"
        ))
    }
}

fn parse_header_bytes(value: &str) -> Result<usize, String> {
    parse_count(value, 1024..=1 << 20, "bytes")
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn discovery_sources() {
        assert_eq!(
            "file:/etc/topology.yaml".parse::<Discovery>(),
            Ok(Discovery::File("/etc/topology.yaml".into()))
        );
        assert!("file:"
            .parse::<Discovery>()
            .unwrap_err()
            .contains("needs a path"));
        assert_eq!("kube".parse::<Discovery>(), Ok(Discovery::Kube));
        let err = "kube:x".parse::<Discovery>().unwrap_err();
        assert!(
            err.contains("file:PATH") && err.contains("--namespaces"),
            "{err}"
        );
        assert!("topology.yaml".parse::<Discovery>().is_err());
        assert!("kubernetes".parse::<Discovery>().is_err());
    }

    #[test]
    fn kube_flags_become_the_discovery_config() {
        let cli = Cli::try_parse_from([
            "proxima",
            "run",
            "--discovery",
            "kube",
            "--kubeconfig",
            "/etc/proxima/kubeconfig",
            "--namespaces",
            "shop, edge,",
            "--service-selector",
            "proxima=on,tier!=batch",
            "--no-events",
        ])
        .unwrap();
        let Command::Run(args) = cli.command else {
            panic!("expected run");
        };
        assert_eq!(args.discovery, Discovery::Kube);
        assert_eq!(
            args.kube.kubeconfig(),
            Some(Path::new("/etc/proxima/kubeconfig"))
        );
        let config = args.kube.config(Some("worker-1"));
        assert_eq!(config.namespaces, ["shop", "edge"]);
        assert_eq!(
            config.selector.map(|s| s.to_string()).as_deref(),
            Some("proxima=on,tier!=batch")
        );
        assert!(!config.publish_events);
        assert_eq!(config.instance.as_deref(), Some("worker-1"));

        // Defaults: every namespace, annotation opt-in only, Events published.
        let cli =
            Cli::try_parse_from(["proxima", "run", "--discovery", "kube", "--kubeconfig", ""])
                .unwrap();
        let Command::Run(args) = cli.command else {
            panic!("expected run");
        };
        assert_eq!(args.kube.kubeconfig(), None, "empty names no file");
        let config = args.kube.config(None);
        assert!(config.namespaces.is_empty());
        assert!(config.selector.is_none());
        assert!(config.publish_events);
        assert_eq!(config.instance, None);
    }

    #[test]
    fn workers_flag_sets_the_data_plane_threads_and_zero_is_refused() {
        let Command::Run(args) =
            Cli::try_parse_from(["proxima", "run", "--discovery", "kube", "--workers", "3"])
                .unwrap()
                .command
        else {
            panic!("expected run");
        };
        assert_eq!(args.serve.proxy.worker_count(), 3);
        assert!(
            Cli::try_parse_from(["proxima", "run", "--discovery", "kube", "--workers", "0"])
                .is_err()
        );
    }

    #[test]
    fn worker_placement_and_yield_flags_become_the_worker_options() {
        let run = |extra: &[&str]| {
            let mut argv = vec!["proxima", "run", "--discovery", "kube", "--workers", "2"];
            argv.extend_from_slice(extra);
            match Cli::try_parse_from(argv).map(|cli| cli.command) {
                Ok(Command::Run(args)) => Ok(args.serve.proxy.worker_options()),
                Ok(_) => panic!("expected run"),
                Err(e) => Err(e.to_string()),
            }
        };
        let defaults = run(&[]).unwrap();
        assert_eq!(defaults.count, 2);
        assert_eq!(defaults.cpus, proxima_proxy::WorkerCpus::Shared);
        assert_eq!(
            defaults.yield_after,
            Some(proxima_proxy::DEFAULT_YIELD_AFTER)
        );

        let set = run(&["--worker-cpus", "pinned", "--worker-yield-after", "500us"]).unwrap();
        assert_eq!(set.cpus, proxima_proxy::WorkerCpus::Pinned);
        assert_eq!(set.yield_after, Some(Duration::from_micros(500)));

        let off = run(&["--worker-yield-after", "0s"]).unwrap();
        assert_eq!(off.yield_after, None, "zero turns yielding off");

        let wrong = run(&["--worker-cpus", "some"]).unwrap_err();
        assert!(
            wrong.contains("shared") && wrong.contains("pinned"),
            "{wrong}"
        );
        let wrong = run(&["--worker-yield-after", "fast"]).unwrap_err();
        assert!(wrong.contains("not a duration"), "{wrong}");
    }

    #[test]
    fn run_flags_become_the_proxy_config() {
        let cli = Cli::try_parse_from([
            "proxima",
            "run",
            "--discovery",
            "file:t.yaml",
            "--service-header",
            "X-Target",
            "--shutdown-grace",
            "5s",
            "--max-header-bytes",
            "4096",
            "--log-format",
            "json",
        ])
        .unwrap();
        assert_eq!(cli.log.log_format, LogFormat::Json);
        let Command::Run(args) = cli.command else {
            panic!("expected run");
        };
        let config = args.serve.proxy.config();
        assert_eq!(config.service_header, "x-target");
        assert_eq!(config.shutdown_grace, Duration::from_secs(5));
        assert_eq!(config.max_header_bytes, 4096);
        assert_eq!(config.default_namespace, "default");
        assert_eq!(config.client_header_timeout, Duration::from_secs(30));
        assert_eq!(config.max_request_headers, 200);
        assert_eq!(config.max_response_headers, 500);
        assert!(config.max_client_connections >= 16);
        assert_eq!(args.serve.listen, "0.0.0.0:8080".parse().unwrap());
    }

    #[test]
    fn admin_access_flags() {
        assert_eq!(
            parse_cidr("10.0.0.0/8"),
            Ok(("10.0.0.0".parse().unwrap(), 8))
        );
        assert_eq!(parse_cidr("fd00::1"), Ok(("fd00::1".parse().unwrap(), 128)));
        assert!(parse_cidr("10.0.0.0/33").is_err());
        assert!(parse_cidr("ten/8").is_err());
        let cli = Cli::try_parse_from([
            "proxima",
            "run",
            "--discovery",
            "kube",
            "--admin-token",
            "t0k",
            "--admin-trusted-networks",
            "10.0.0.0/8,192.168.1.0/24",
        ])
        .unwrap();
        let Command::Run(args) = cli.command else {
            panic!("expected run");
        };
        let access = args.serve.proxy.admin.access();
        assert_eq!(access.token.as_deref(), Some("t0k"));
        assert_eq!(access.trusted.len(), 2);
        assert!(!access.open);
    }

    #[test]
    fn a_fixed_connection_budget_over_the_open_file_limit_is_reported() {
        let fixed = ConnectionBudget::Fixed(20_000);
        let warning = fixed_budget_warning(fixed, Some(20_000)).expect("does not fit");
        assert!(warning.contains("open-file limit of 20000"), "{warning}");
        assert!(warning.contains("`auto` would allow 9872"), "{warning}");
        assert_eq!(fixed_budget_warning(fixed, Some(1_048_576)), None);
        assert_eq!(fixed_budget_warning(fixed, None), None);
        assert_eq!(
            fixed_budget_warning(ConnectionBudget::Auto, Some(1024)),
            None
        );
    }

    #[test]
    fn the_auto_connection_budget_follows_the_open_file_limit() {
        assert_eq!(auto_budget(Some(1024)), 384);
        assert_eq!(auto_budget(Some(65_536)), 32_640);
        assert_eq!(auto_budget(Some(100)), 16);
        assert_eq!(auto_budget(None), 65_536);
        assert_eq!(ConnectionBudget::Fixed(7).resolve(), 7);
        assert_eq!(parse_connection_budget("auto"), Ok(ConnectionBudget::Auto));
        assert!(parse_connection_budget("0").is_err());
        assert!(parse_header_count("3").is_err());
        assert!(parse_uri_bytes("100000").is_err());
    }

    #[test]
    fn bad_flags_are_rejected_with_a_reason() {
        let err = Cli::try_parse_from([
            "proxima",
            "run",
            "--discovery",
            "file:t",
            "--shutdown-grace",
            "30",
        ])
        .unwrap_err()
        .to_string();
        assert!(err.contains("with a unit"), "{err}");
        let err = Cli::try_parse_from(["proxima", "run", "--discovery", "kube:default"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("expected file:PATH"), "{err}");
        let err = Cli::try_parse_from([
            "proxima",
            "run",
            "--discovery",
            "kube",
            "--service-selector",
            "env in (a,b)",
        ])
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("--service-selector") && err.contains("key=value"),
            "{err}"
        );
        let err = Cli::try_parse_from([
            "proxima",
            "run",
            "--discovery",
            "kube",
            "--namespaces",
            "shop,Edge_1",
        ])
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("--namespaces") && err.contains("not a namespace name"),
            "{err}"
        );
    }

    #[test]
    fn node_measurement_flags() {
        let parse = |extra: &[&str]| {
            let mut argv = vec!["proxima", "run", "--discovery", "file:t.yaml"];
            argv.extend_from_slice(extra);
            Cli::try_parse_from(argv).map(|cli| match cli.command {
                Command::Run(args) => args.serve.proxy.nodes,
                _ => panic!("expected run"),
            })
        };
        let defaults = parse(&[]).unwrap();
        assert_eq!(defaults.peer_port, 9901);
        assert_eq!(defaults.peer_probe_interval, Duration::from_secs(2));
        assert_eq!(defaults.peer_probe_timeout, Duration::from_secs(1));
        assert_eq!(defaults.peer_sample, 32);
        assert_eq!(defaults.peer_share_bytes, 4096);
        assert_eq!(defaults.usage_source, UsageSource::Auto);
        assert_eq!(defaults.usage_poll_interval, Duration::from_secs(15));
        assert_eq!(defaults.node_reading_max_age, Duration::from_secs(30));
        assert!(!defaults.allow_usage_override);

        let set = parse(&[
            "--peer-port",
            "19901",
            "--peer-sample",
            "0",
            "--usage-source",
            "metrics-server",
            "--allow-usage-override",
        ])
        .unwrap();
        assert_eq!(set.peer_port, 19901);
        assert_eq!(set.peer_sample, 0);
        assert_eq!(set.usage_source, UsageSource::MetricsServer);
        assert!(set.allow_usage_override);

        let err = parse(&["--peer-probe-interval", "0s"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("longer than zero"), "{err}");
        let err = parse(&["--usage-source", "prometheus"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("metrics-server"), "{err}");
    }
}
