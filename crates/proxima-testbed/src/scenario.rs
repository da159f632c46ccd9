//! The scenario file: an emulated cluster, its traffic and what happens to it.
//!
//! ```yaml
//! name: example
//! seed: 1
//! nodes:
//!   - { name: edge-1, zone: a, cores: 2, usage: { ram: 0.4 } }
//!   - { name: edge-2 }
//! latency:                      # between nodes; clients have their own below
//!   unit: one-way               # or rtt: values are round trips, halved per direction
//!   default: 5ms                # any pair not listed
//!   local: 0ms                  # inside a node
//!   pairs: [{ between: [edge-1, edge-2], delay: 20ms }]
//!   matrix: { nodes: [edge-1, edge-2], rows: [[0, 20], [20, 0]] }   # ms; row = from
//! services:
//!   - name: api
//!     protocol: http            # or grpc: its instances' port speaks h2c (default http)
//!     settings: { latency-slo: 80ms, qos-pool-window: 20 }   # as Service annotations
//!     instances:
//!       - { name: api-1, node: edge-1, processing: "normal(5ms, 1ms)", workers: 4 }
//!       - { name: api-2, node: edge-2, processing: 5ms, start: false }   # joins later
//!       - { node: edge-2, count: 3, processing: 5ms }   # api-edge-2-1 .. api-edge-2-3
//! clients:
//!   - name: device
//!     node: edge-1
//!     latency: 0.5ms            # one way, to its node
//!     service: api
//!     requests: 1000            # or duration: 10s
//!     concurrency: 1            # closed loop; with `rate` (req/s) an open loop
//!     method: POST
//!     body: '{"co2": 412}'
//!     timeout: 5s               # give up on a request after this (default:
//!                               # testbed.client-timeout, 30s); counted as a timeout
//!     protocol: http            # http (default), grpc or websocket; see below
//! events:
//!   - name: T1
//!     at: 250                   # after 250 requests (all clients), or a time: 5s
//!     do:
//!       - join: api-2
//!       - overload: { instance: api-1, add: 100ms }
//!       - errors: { instance: api-1, status: 500 }       # answers 500 at once; `off` stops
//!       - fail: { instance: api-1, remove-after: 1s }
//!       - leave: api-1
//!       - link: { between: [edge-1, "*"], add: 100ms }   # or delay: 30ms (one way)
//!       - link: { between: [region:eu, zone:b], add: 50ms }  # groups of nodes
//!       - blackhole: { between: [edge-1, edge-2] }       # drop everything
//!       - reset: { between: [edge-1, "*"] }              # back to `latency`
//!       - reset: { instance: api-1 }                     # undo an overload
//!       - node-down: { node: edge-2, remove-after: 10s } # unreachable (or a name)
//!       - node-up: edge-2
//!       - proxy-restart: edge-2     # a new proxy, knowing nothing, replaces the node's
//!       - usage: { node: edge-2, cpu: 0.95 }             # background usage (RAP)
//! strategies: [qos-pool, round-robin, "proximity:alpha=0.8"]
//! testbed: { discovery-interval: 200ms, peer-probe-interval: 500ms, client-timeout: 30s,
//!            peer-share-bytes: 4096,    # 0: proxies share no pod reports
//!            peer-sample: 32,           # peers each proxy probes per round
//!            peer-coordinates: true }   # false: no network coordinates
//! variants:                     # optional: run everything once per variant, with
//!   - { name: d3, delay: 3ms }  # `${delay}` replaced by the variant's value
//! ```
//!
//! A client's `protocol` says what its requests are, so that the QoS results can be
//! checked for every kind of traffic the proxy balances:
//!
//! * `http`: one request per ticket over a pool of HTTP/1.1 keep-alive connections.
//! * `grpc`: unary gRPC calls (`POST`, default path `/testbed.Echo/Call`, `body` as the
//!   message's payload) all on **one** HTTP/2 connection to the proxy, which balances
//!   them call by call; a call succeeds with `200` and `grpc-status: 0`. Its service
//!   must be `protocol: grpc` (pods on h2c), as a gRPC server's port would be.
//! * `websocket`: every worker holds one WebSocket through the proxy (pinned to the pod
//!   that answered its `101`) and sends `body` (or `ping`) as a message per ticket; a
//!   message's round trip is the response time. Its service must be `http` (the proxy
//!   opens WebSockets over HTTP/1.1 only).
//!
//! The full schema is in `docs/testbed.md`. Checking is strict and reports every
//! problem with its line ([`crate::shape`] first: keys and forms; then names, values,
//! strategies, and events against the run's time span and the topology's state at that
//! time, `check_timeline`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use proxima_core::settings::parse_duration;
use proxima_core::{ServiceKey, ServiceSettings};
use proxima_discovery::yaml;
use proxima_emulate::ProcessingTime;
use proxima_nodes::ProberConfig;
use serde::Deserialize;
use serde_json::Value;

/// Why a scenario cannot be run.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// Not YAML, or not the shape of a scenario; one message, with its place.
    #[error("{0}")]
    Yaml(String),
    /// A value the shape allows but the scenario cannot use (a strategy spec, a variant
    /// name, ...); one message.
    #[error("{0}")]
    Invalid(String),
    /// Every problem found, one message each (`line N: path: what is wrong`).
    #[error("{}", .0.join("\n"))]
    Problems(Vec<String>),
}

impl From<yaml::Error> for ScenarioError {
    fn from(e: yaml::Error) -> Self {
        // Not `#[from]`: a source would print the same message twice in error chains.
        ScenarioError::Yaml(e.to_string())
    }
}

fn invalid(message: impl Into<String>) -> ScenarioError {
    ScenarioError::Invalid(message.into())
}

// ---------------------------------------------------------------------------------------
// The document as written.

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct Doc {
    name: String,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    seed: Option<u64>,
    nodes: Vec<NodeDoc>,
    #[serde(default)]
    latency: LatencyDoc,
    services: Vec<ServiceDoc>,
    clients: Vec<ClientDoc>,
    #[serde(default)]
    events: Vec<EventDoc>,
    #[serde(default)]
    strategies: Vec<StrategyDoc>,
    #[serde(default)]
    testbed: TestbedDoc,
    /// Expanded before parsing (see [`ScenarioFile`]).
    #[serde(default)]
    #[allow(dead_code)]
    variants: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct NodeDoc {
    name: String,
    zone: Option<String>,
    region: Option<String>,
    cores: Option<usize>,
    usage: Option<UsageDoc>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct UsageDoc {
    #[serde(default)]
    ram: f64,
    #[serde(default)]
    cpu: f64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct LatencyDoc {
    unit: Option<String>,
    default: Option<String>,
    local: Option<String>,
    #[serde(default)]
    pairs: Vec<PairDoc>,
    matrix: Option<MatrixDoc>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct PairDoc {
    between: [String; 2],
    delay: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct MatrixDoc {
    nodes: Option<Vec<String>>,
    rows: Vec<Vec<f64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct ServiceDoc {
    name: String,
    namespace: Option<String>,
    protocol: Option<String>,
    #[serde(default)]
    settings: BTreeMap<String, Value>,
    instances: Vec<InstanceDoc>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct InstanceDoc {
    name: Option<String>,
    node: String,
    count: Option<usize>,
    #[serde(default)]
    processing: Option<Value>,
    workers: Option<usize>,
    start: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct ClientDoc {
    name: Option<String>,
    node: String,
    latency: Option<String>,
    service: String,
    requests: Option<u64>,
    duration: Option<String>,
    concurrency: Option<usize>,
    rate: Option<f64>,
    method: Option<String>,
    path: Option<String>,
    body: Option<String>,
    timeout: Option<String>,
    protocol: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct EventDoc {
    name: Option<String>,
    at: Value,
    #[serde(rename = "do")]
    actions: Vec<ActionDoc>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct ActionDoc {
    join: Option<String>,
    leave: Option<String>,
    fail: Option<FailDoc>,
    overload: Option<OverloadDoc>,
    errors: Option<ErrorsDoc>,
    link: Option<LinkDoc>,
    usage: Option<UsageEventDoc>,
    blackhole: Option<BlackholeDoc>,
    reset: Option<ResetDoc>,
    node_down: Option<NodeDownDoc>,
    node_up: Option<String>,
    proxy_restart: Option<String>,
    busy_host: Option<BusyHostDoc>,
}

/// `busy-host: { cores: 1 }` or `busy-host: off`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum BusyHostDoc {
    Off(String),
    Cores { cores: usize },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct BlackholeDoc {
    between: [String; 2],
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct ResetDoc {
    between: Option<[String; 2]>,
    instance: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum NodeDownDoc {
    Name(String),
    Full(NodeDownFull),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct NodeDownFull {
    node: String,
    remove_after: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum FailDoc {
    Name(String),
    Full(FailFull),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct FailFull {
    instance: String,
    remove_after: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct OverloadDoc {
    instance: String,
    add: Option<String>,
    processing: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct ErrorsDoc {
    instance: String,
    /// A status code, or `off`.
    status: Value,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct LinkDoc {
    between: [String; 2],
    add: Option<String>,
    delay: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct UsageEventDoc {
    node: String,
    cpu: Option<f64>,
    ram: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum StrategyDoc {
    Spec(String),
    Labelled { label: String, spec: String },
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct TestbedDoc {
    discovery_interval: Option<String>,
    peer_probe_interval: Option<String>,
    usage_interval: Option<String>,
    usage_window: Option<String>,
    warmup_timeout: Option<String>,
    drain: Option<String>,
    client_timeout: Option<String>,
    peer_share_bytes: Option<usize>,
    peer_sample: Option<usize>,
    peer_coordinates: Option<bool>,
}

// ---------------------------------------------------------------------------------------
// The checked model.

/// A checked scenario (one variant of a file).
#[derive(Clone, Debug)]
pub struct Scenario {
    /// The scenario's name (results go to `target/testbed/<name>` by default).
    pub name: String,
    /// Free text shown in the report.
    pub description: Option<String>,
    /// The variant this is, empty when the file has none.
    pub variant: String,
    /// Seed of the instances' processing-time draws and of each node's peer prober (mixed
    /// with the instance's or node's name), so that runs repeat; default 1.
    pub seed: u64,
    /// The emulated nodes, in file order; other specs refer to them by index.
    pub nodes: Vec<NodeSpec>,
    /// One-way delays between the nodes.
    pub latency: LatencySpec,
    /// The services and their instances.
    pub services: Vec<ServiceSpecDoc>,
    /// The traffic generators.
    pub clients: Vec<ClientSpec>,
    /// What happens during the run, in file order.
    pub events: Vec<EventSpec>,
    /// The file's `strategies`: what to compare when the command line names none.
    pub strategies: Vec<StrategySpec>,
    /// Timing of the testbed's own machinery.
    pub testbed: TestbedSettings,
}

impl Scenario {
    /// Each service's latency SLO and SLO percentile when run with `strategy` (whose
    /// general keys, such as `latency-slo`, override the service's).
    pub fn objectives(&self, strategy: &StrategySpec) -> Vec<(Duration, f64)> {
        self.services
            .iter()
            .map(|s| {
                let pairs = s
                    .settings
                    .iter()
                    .chain(&strategy.settings)
                    .map(|(k, v)| (k.as_str(), v.as_str()));
                let (parsed, _) = ServiceSettings::from_pairs(pairs);
                (parsed.latency_slo, parsed.slo_percentile)
            })
            .collect()
    }
}

/// An emulated node: one proxy, its instances and its clients.
#[derive(Clone, Debug)]
pub struct NodeSpec {
    /// Node name (also the Kubernetes Node name in Kubernetes mode).
    pub name: String,
    /// Zone, for the zone-aware strategies and link changes by `zone:NAME`.
    pub zone: Option<String>,
    /// A group of zones, for link changes by region (`region:NAME`).
    pub region: Option<String>,
    /// Cores shared by the node's instances; `None`: unlimited.
    pub cores: Option<usize>,
    /// Emulated usage reporting: background CPU and RAM fractions. Present when the
    /// node reports usage (set `usage` or `cores`).
    pub usage: Option<BaseUsage>,
}

/// A node's background usage, as fractions of its capacity (0 to 1).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BaseUsage {
    /// Background CPU usage, added to the busy share of the node's cores.
    pub cpu: f64,
    /// Background RAM usage.
    pub ram: f64,
}

/// One-way delays between nodes.
#[derive(Clone, Debug)]
pub struct LatencySpec {
    /// `one_way[from][to]`, indices into [`Scenario::nodes`]; the diagonal is `local`.
    pub one_way: Vec<Vec<Duration>>,
}

impl LatencySpec {
    /// The one-way delay from node `from` to node `to` (indices into [`Scenario::nodes`]).
    pub fn one_way(&self, from: usize, to: usize) -> Duration {
        self.one_way[from][to]
    }
}

/// A service and its instances.
#[derive(Clone, Debug)]
pub struct ServiceSpecDoc {
    /// Service name.
    pub name: String,
    /// Namespace (`default` when the file gives none).
    pub namespace: String,
    /// Settings as `key = value` pairs (strategy keys are added per run).
    pub settings: Vec<(String, String)>,
    /// The service's latency SLO (`latency-slo`, or its default), for the report.
    pub slo: Duration,
    /// What its instances' port speaks.
    pub protocol: ServiceProtocol,
    /// Every instance, including those that `join` later.
    pub instances: Vec<InstanceSpec>,
}

/// An emulated pod: an HTTP server with a processing-time distribution.
#[derive(Clone, Debug)]
pub struct InstanceSpec {
    /// Instance name (its pod and endpoint name).
    pub name: String,
    /// Its node, an index into [`Scenario::nodes`].
    pub node: usize,
    /// How long it takes per request.
    pub processing: ProcessingTime,
    /// Requests processed at once (`workers`); `None`: no limit.
    pub workers: Option<usize>,
    /// Whether it runs (and is listed) from the start; otherwise it `join`s later.
    pub start: bool,
}

/// A traffic generator attached to one node's proxy.
#[derive(Clone, Debug)]
pub struct ClientSpec {
    /// Client name (for the report and its CSV rows).
    pub name: String,
    /// Its node, an index into [`Scenario::nodes`]; it sends to that node's proxy.
    pub node: usize,
    /// One-way delay between the client and its node's proxy.
    pub latency: Duration,
    /// Index into [`Scenario::services`].
    pub service: usize,
    /// Requests to send in all; with `duration` it stops at whichever comes first.
    pub requests: Option<u64>,
    /// How long to send for.
    pub duration: Option<Duration>,
    /// Requests outstanding at once (default 1; 256 with `rate`).
    pub concurrency: usize,
    /// Open loop: requests per second (at most `concurrency` outstanding).
    pub rate: Option<f64>,
    /// HTTP method of every request (default `GET`, or `POST` with a body).
    pub method: http::Method,
    /// Request path (default `/`).
    pub path: String,
    /// Request body, sent as is.
    pub body: Option<String>,
    /// Longest a request may take before the client gives up on it (counted as a
    /// timeout, never within the SLO); `timeout`, else `testbed.client-timeout`.
    pub timeout: Duration,
    /// What the requests are (see the module docs).
    pub protocol: ClientProtocol,
}

/// What a client sends (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ClientProtocol {
    /// HTTP/1.1 requests.
    #[default]
    Http,
    /// Unary gRPC calls on one HTTP/2 connection.
    Grpc,
    /// Messages on WebSockets, one per worker.
    WebSocket,
}

impl ClientProtocol {
    const NAMES: [(&'static str, Self); 3] = [
        ("http", Self::Http),
        ("grpc", Self::Grpc),
        ("websocket", Self::WebSocket),
    ];

    /// The name written in scenarios, reports and CSV files.
    pub fn as_str(self) -> &'static str {
        Self::NAMES
            .iter()
            .find(|(_, p)| *p == self)
            .map_or("", |(n, _)| n)
    }

    /// The path requests go to when the client names none.
    pub fn default_path(self) -> &'static str {
        match self {
            Self::Grpc => "/testbed.Echo/Call",
            Self::Http | Self::WebSocket => "/",
        }
    }

    /// The only method of the protocol's requests (`None`: any).
    fn method(self) -> Option<http::Method> {
        match self {
            Self::Http => None,
            Self::Grpc => Some(http::Method::POST),
            Self::WebSocket => Some(http::Method::GET),
        }
    }
}

/// What a service's instances speak on their port.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ServiceProtocol {
    /// HTTP/1.1 (the port declares nothing).
    #[default]
    Http,
    /// HTTP/2 with prior knowledge: the port is declared `grpc` (`appProtocol`).
    Grpc,
}

impl ServiceProtocol {
    /// The name written in scenarios (and the port's `appProtocol` for `grpc`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Http => "http",
            Self::Grpc => "grpc",
        }
    }
}

/// When an event happens.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Trigger {
    /// After this many requests were sent, counted over all clients.
    Requests(u64),
    /// This long after the traffic started.
    Time(Duration),
}

/// A named event: what happens, and when.
#[derive(Clone, Debug)]
pub struct EventSpec {
    /// Event name, shown in the report and the plots.
    pub name: String,
    /// When it happens.
    pub at: Trigger,
    /// What happens, in order.
    pub actions: Vec<Action>,
}

/// One thing an event does.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Start the instance and list it in discovery.
    Join(String),
    /// Take it out of discovery, then stop it gracefully after the drain time.
    Leave(String),
    /// Kill it (connections refused from now on); take it out of discovery later.
    Fail {
        /// The instance to kill.
        instance: String,
        /// How long after the kill it leaves discovery.
        remove_after: Duration,
    },
    /// Add to its processing time, or replace its distribution.
    Overload {
        /// The instance to slow down.
        instance: String,
        /// Extra processing time per request.
        add: Duration,
        /// A new processing-time distribution instead of the current one.
        processing: Option<ProcessingTime>,
    },
    /// Answer every request at once with this status (a pod failing fast), or normally
    /// again with `None`.
    Errors {
        /// The instance.
        instance: String,
        /// The status to answer with; `None`: answer normally again.
        status: Option<http::StatusCode>,
    },
    /// Change the links between pairs of nodes (both directions of each pair).
    Link {
        /// The node pairs, indices into [`Scenario::nodes`].
        pairs: Vec<(usize, usize)>,
        /// What happens to their links.
        change: LinkChange,
    },
    /// Put the instance's processing time back to the scenario's (undo `overload`).
    ResetInstance(String),
    /// The node becomes unreachable: every link to and from it drops everything, and so
    /// do its clients' links to its proxy (its pods and its proxy are gone for everyone
    /// else). Its instances leave discovery after `remove_after`, if given (as when the
    /// control plane notices a lost node).
    NodeDown {
        /// The node, an index into [`Scenario::nodes`].
        node: usize,
        /// When its instances leave discovery; `None`: they stay listed.
        remove_after: Option<Duration>,
    },
    /// The node is reachable again; its instances that still run are listed again.
    NodeUp(usize),
    /// A new proxy replaces the node's own, as when its DaemonSet pod is replaced: a
    /// fresh router, discovery, prober and admin server that know nothing yet, taking
    /// over the same listening sockets (no client is refused), started as `proxima run`
    /// starts (one round of peer probes before it serves); the old one then drains.
    ProxyRestart(usize),
    /// Keep `cores` of the host's CPUs busy with spinning threads (a CPU hog: the host
    /// load every proxy, gate and pod of the run shares), until the next `busy-host`;
    /// 0 stops them.
    BusyHost {
        /// Threads that spin.
        cores: usize,
    },
    /// Set a node's background CPU and/or RAM usage.
    Usage {
        /// The node, an index into [`Scenario::nodes`].
        node: usize,
        /// New background CPU usage (fraction); `None` leaves it.
        cpu: Option<f64>,
        /// New background RAM usage (fraction); `None` leaves it.
        ram: Option<f64>,
    },
}

/// What a `link` event does to a link.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LinkChange {
    /// Set the one-way delay.
    Set(Duration),
    /// Add to the current one-way delay.
    Add(Duration),
    /// Drop everything (data is held until the link changes again).
    Blackhole,
    /// Back to the scenario's latency, and no blackhole.
    Reset,
}

/// A strategy to run the scenario with: `name[:key=value]...`.
#[derive(Clone, Debug, PartialEq)]
pub struct StrategySpec {
    /// The name the runs and report use: the spec as written, or a variant's label.
    pub label: String,
    /// Strategy name (`strategy` setting).
    pub strategy: String,
    /// Settings added to every service (`<strategy>-<key>`, or a general key).
    pub settings: Vec<(String, String)>,
}

/// Settings keys that are not strategy parameters.
const GENERAL_KEYS: &[&str] = &[
    "latency-slo",
    "slo-percentile",
    "timeout",
    "connect-timeout",
    "retries",
];

impl StrategySpec {
    /// Parse `proximity:alpha=0.8:decay=inverse`; keys become `proximity-alpha`, ...
    /// (general keys such as `latency-slo` and `qos-pool-*` keys stay as they are).
    pub fn parse(spec: &str) -> Result<Self, ScenarioError> {
        let spec = spec.trim();
        let mut parts = spec.split(':');
        let strategy = parts.next().unwrap_or("").trim().to_string();
        if strategy.is_empty() {
            return Err(invalid(format!("strategy {spec:?}: no strategy name")));
        }
        let mut settings = Vec::new();
        for part in parts {
            let (key, value) = part.split_once('=').ok_or_else(|| {
                invalid(format!(
                    "strategy {spec:?}: expected key=value after the name, got {part:?}"
                ))
            })?;
            let key = key.trim();
            let full = if GENERAL_KEYS.contains(&key) || key.starts_with("qos-pool-") {
                key.to_string()
            } else {
                format!("{strategy}-{key}")
            };
            settings.push((full, value.trim().to_string()));
        }
        let registry = proxima_core::StrategyRegistry::default();
        if !registry.names().any(|n| n == strategy) {
            return Err(invalid(format!(
                "strategy {spec:?}: unknown strategy {strategy:?}; one of {}",
                registry.names().collect::<Vec<_>>().join(", ")
            )));
        }
        let with = |extra: Option<(&str, &str)>| {
            let pairs = settings
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .chain(extra)
                .chain([("strategy", strategy.as_str())]);
            let (parsed, mut errors) = ServiceSettings::from_pairs(pairs);
            let (_, built) = registry.build(&parsed);
            errors.extend(built);
            errors
        };
        if let Some(e) = with(None).first() {
            return Err(invalid(format!(
                "strategy {spec:?}: {}={:?} is not valid: expected {}",
                e.key, e.value, e.expected
            )));
        }
        // A parameter the strategy reads is refused with a value no parameter takes;
        // one it does not know is silently ignored, so it is refused here instead.
        for (key, _) in &settings {
            if GENERAL_KEYS.contains(&key.as_str()) || key.starts_with("qos-pool-") {
                continue;
            }
            let junk = "\u{1}";
            let read = with(Some((key.as_str(), junk)))
                .iter()
                .any(|e| e.key == *key);
            if !read {
                return Err(invalid(format!(
                    "strategy {spec:?}: {strategy} has no parameter `{}`",
                    key.strip_prefix(&format!("{strategy}-")).unwrap_or(key)
                )));
            }
        }
        Ok(StrategySpec {
            label: spec.to_string(),
            strategy,
            settings,
        })
    }

    /// The same strategy under another label.
    pub fn labelled(mut self, label: impl Into<String>) -> Self {
        self.label = label.into();
        self
    }
}

impl fmt::Display for StrategySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label)
    }
}

/// Timing of the testbed's own machinery.
#[derive(Clone, Debug)]
pub struct TestbedSettings {
    /// How often each node's file discovery looks at its topology file.
    pub discovery_interval: Duration,
    /// Time between the peer prober's rounds on every node.
    pub peer_probe_interval: Duration,
    /// How often each node's emulated usage is recomputed.
    pub usage_interval: Duration,
    /// The window of busy time a usage reading averages over.
    pub usage_window: Duration,
    /// Longest wait for every proxy to know every peer's latency before traffic starts.
    pub warmup_timeout: Duration,
    /// How long a leaving instance keeps serving after it left discovery.
    pub drain: Duration,
    /// Default for every client's `timeout`.
    pub client_timeout: Duration,
    /// Bytes of pod reports each proxy's ping replies carry (0: proxies share nothing;
    /// see `proxima_core::neighbours`), so that sharing can be shown on and off.
    pub peer_share_bytes: usize,
    /// Peers each proxy probes per round at most (`proxima run --peer-sample`). The
    /// emulation's probes all share the host's cores, so a large cluster probes fewer
    /// per round and leaves the rest to the network coordinates.
    pub peer_sample: usize,
    /// Whether proxies keep network coordinates and exchange them in their ping replies
    /// (false: a proxy knows only the RTTs it probed itself), so that the coordinates
    /// can be shown on and off.
    pub peer_coordinates: bool,
}

impl Default for TestbedSettings {
    fn default() -> Self {
        Self {
            discovery_interval: Duration::from_millis(200),
            peer_probe_interval: Duration::from_millis(500),
            usage_interval: Duration::from_millis(100),
            usage_window: Duration::from_millis(500),
            warmup_timeout: Duration::from_secs(15),
            drain: Duration::from_secs(2),
            client_timeout: Duration::from_secs(30),
            peer_share_bytes: proxima_nodes::share::DEFAULT_BUDGET,
            peer_sample: ProberConfig::default().max_peers_per_round,
            peer_coordinates: true,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Files and variants.

/// A scenario file with its variants expanded lazily.
#[derive(Clone, Debug)]
pub struct ScenarioFile {
    text: String,
    /// `(variant name, variables)`; one unnamed variant without variables when the file
    /// has none.
    variants: Vec<(String, BTreeMap<String, String>)>,
}

impl ScenarioFile {
    /// Read a scenario file and check every variant; the first variant with problems fails
    /// it, with every problem of that variant.
    pub fn parse(text: &str) -> Result<Self, ScenarioError> {
        // Placeholders may stand where YAML would not accept `${`, so only the
        // `variants` section is read before substitution.
        let value: Value = yaml::from_str(&top_level_section(text, "variants"))?;
        let mut variants = Vec::new();
        if let Some(list) = value.get("variants") {
            let list = list
                .as_array()
                .ok_or_else(|| invalid("variants: expected a list of mappings"))?;
            for (i, entry) in list.iter().enumerate() {
                let map = entry
                    .as_object()
                    .ok_or_else(|| invalid(format!("variants[{i}]: expected a mapping")))?;
                let mut vars = BTreeMap::new();
                let mut name = None;
                for (key, v) in map {
                    let key = key.clone();
                    let value = scalar(v).ok_or_else(|| {
                        invalid(format!("variants[{i}].{key}: expected a single value"))
                    })?;
                    if key == "name" {
                        name = Some(value);
                    } else {
                        vars.insert(key, value);
                    }
                }
                let name = name.ok_or_else(|| invalid(format!("variants[{i}]: no name")))?;
                if variants.iter().any(|(n, _)| *n == name) {
                    return Err(invalid(format!("variants: duplicate name {name:?}")));
                }
                variants.push((name, vars));
            }
        }
        if variants.is_empty() {
            variants.push((String::new(), BTreeMap::new()));
        }
        let file = ScenarioFile {
            text: text.to_string(),
            variants,
        };
        // Check every variant now, so that a bad one fails before anything runs.
        for name in file.variant_names() {
            file.variant(&name)?;
        }
        Ok(file)
    }

    /// The names of the file's variants (one empty name when it has none).
    pub fn variant_names(&self) -> Vec<String> {
        self.variants.iter().map(|(n, _)| n.clone()).collect()
    }

    /// The checked scenario of one variant.
    pub fn variant(&self, name: &str) -> Result<Scenario, ScenarioError> {
        let (_, vars) = self
            .variants
            .iter()
            .find(|(n, _)| n == name)
            .ok_or_else(|| invalid(format!("no variant {name:?}")))?;
        let text = substitute(&self.text, vars)?;
        let prefix = |m: String| match name {
            "" => m,
            _ => format!("variant {name}: {m}"),
        };
        let lines = crate::shape::check(&text).map_err(|problems| {
            ScenarioError::Problems(problems.into_iter().map(prefix).collect())
        })?;
        let doc: Doc =
            yaml::from_str(&text).map_err(|e| ScenarioError::Yaml(prefix(e.to_string())))?;
        let mut scenario = check(doc).map_err(|e| {
            let problems = match e {
                ScenarioError::Problems(list) => list,
                other => vec![other.to_string()],
            };
            ScenarioError::Problems(problems.iter().map(|m| prefix(lines.place(m))).collect())
        })?;
        scenario.variant = name.to_string();
        Ok(scenario)
    }
}

/// The lines of the top-level `key:` section of a YAML document (empty if none).
fn top_level_section(text: &str, key: &str) -> String {
    let mut out = String::new();
    let mut inside = false;
    let prefix = format!("{key}:");
    for line in text.lines() {
        let top_level = line
            .chars()
            .next()
            .is_some_and(|c| !c.is_whitespace() && c != '#' && c != '-');
        if top_level {
            inside = line.starts_with(&prefix);
        }
        if inside {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

fn scalar(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// Replace `${name}` by the variable's value; an unknown name is an error.
fn substitute(text: &str, vars: &BTreeMap<String, String>) -> Result<String, ScenarioError> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| invalid("unterminated ${ in the scenario"))?;
        let name = &after[..end];
        let value = vars.get(name).ok_or_else(|| {
            invalid(format!(
                "${{{name}}} is used but no variant defines `{name}`"
            ))
        })?;
        out.push_str(value);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

fn duration(what: &str, value: &str) -> Result<Duration, ScenarioError> {
    parse_duration(value).ok_or_else(|| {
        invalid(format!(
            "{what}: {value:?} is not a duration (use a unit: 500us, 20ms, 1.5s)"
        ))
    })
}

fn opt_duration(
    what: &str,
    value: &Option<String>,
    default: Duration,
) -> Result<Duration, ScenarioError> {
    value.as_deref().map_or(Ok(default), |v| duration(what, v))
}

fn processing(what: &str, value: &Option<Value>) -> Result<ProcessingTime, ScenarioError> {
    match value {
        None => Ok(ProcessingTime::default()),
        Some(v) => {
            let text = scalar(v).ok_or_else(|| invalid(format!("{what}: expected text")))?;
            text.parse::<ProcessingTime>()
                .map_err(|e| invalid(format!("{what}: {e}")))
        }
    }
}

fn fraction(what: &str, value: f64) -> Result<f64, ScenarioError> {
    if value.is_finite() && (0.0..=10.0).contains(&value) {
        Ok(value)
    } else {
        Err(invalid(format!(
            "{what}: expected a fraction such as 0.5, got {value}"
        )))
    }
}

/// A service's `protocol` (default `http`).
fn service_protocol(at: &str, value: Option<&str>) -> Result<ServiceProtocol, ScenarioError> {
    match value.unwrap_or("http") {
        "http" => Ok(ServiceProtocol::Http),
        "grpc" => Ok(ServiceProtocol::Grpc),
        other => Err(invalid(format!(
            "{at}.protocol: {other:?} is not a service protocol: expected http or grpc"
        ))),
    }
}

/// A client's `protocol` (default `http`), which its service must speak: gRPC calls
/// need pods on h2c, WebSockets pods on HTTP/1.1 (the proxy does not open them over h2c).
fn client_protocol(
    what: &str,
    value: Option<&str>,
    service: Option<&ServiceSpecDoc>,
) -> Result<ClientProtocol, ScenarioError> {
    let value = value.unwrap_or("http");
    let Some(&(_, protocol)) = ClientProtocol::NAMES.iter().find(|(n, _)| *n == value) else {
        return Err(invalid(format!(
            "{what}.protocol: {value:?} is not a client protocol: expected http, grpc or websocket"
        )));
    };
    let Some(service) = service else {
        return Ok(protocol);
    };
    let needs = match protocol {
        ClientProtocol::Grpc => ServiceProtocol::Grpc,
        ClientProtocol::WebSocket => ServiceProtocol::Http,
        ClientProtocol::Http => return Ok(protocol),
    };
    if service.protocol != needs {
        return Err(invalid(format!(
            "{what}.protocol: a {value} client needs a service with `protocol: {}`, and \
             service {:?} is {}",
            needs.as_str(),
            service.name,
            service.protocol.as_str()
        )));
    }
    Ok(protocol)
}

/// A client's `method`: default `GET`, or `POST` with a body; gRPC calls are `POST` and
/// WebSocket handshakes `GET`, whatever else is given.
fn client_method(
    what: &str,
    c: &ClientDoc,
    protocol: ClientProtocol,
) -> Result<http::Method, ScenarioError> {
    let default = if c.body.is_some() { "POST" } else { "GET" };
    let method = c
        .method
        .as_deref()
        .unwrap_or(default)
        .parse::<http::Method>()
        .map_err(|_| invalid(format!("{what}.method: not an HTTP method")))?;
    match protocol.method() {
        None => Ok(method),
        Some(only) if c.method.is_none() || method == only => Ok(only),
        Some(only) => Err(invalid(format!(
            "{what}.method: a {} client sends {only}",
            protocol.as_str()
        ))),
    }
}

/// Check a parsed document and resolve names into indices. Every problem found is
/// reported (one message each, `path: what is wrong`); items that depend on a broken
/// one are skipped rather than reported again.
fn check(doc: Doc) -> Result<Scenario, ScenarioError> {
    let problems: std::cell::RefCell<Vec<String>> = Default::default();
    let note = |r: Result<(), ScenarioError>| {
        if let Err(e) = r {
            problems.borrow_mut().push(e.to_string());
        }
    };
    macro_rules! or_note {
        ($e:expr) => {
            match $e {
                Ok(v) => Some(v),
                Err(e) => {
                    note(Err(e));
                    None
                }
            }
        };
    }

    if doc.nodes.is_empty() {
        note(Err(invalid("nodes: at least one node is needed")));
    }
    if doc.nodes.len() > 250 {
        note(Err(invalid(
            "nodes: at most 250 nodes (one loopback address each)",
        )));
    }
    let mut node_names = BTreeSet::new();
    let mut nodes = Vec::new();
    for (i, n) in doc.nodes.iter().enumerate() {
        if n.name.is_empty() || !node_names.insert(n.name.clone()) {
            note(Err(invalid(format!(
                "nodes[{i}].name: empty or duplicate name {:?}",
                n.name
            ))));
        }
        if n.name.contains(':') || n.name == "*" {
            note(Err(invalid(format!(
                "nodes[{i}].name: {:?} cannot be a node name (`*`, `zone:` and `region:` \
                 select groups of nodes in link events)",
                n.name
            ))));
        }
        let usage = match (&n.usage, n.cores) {
            (Some(u), _) => {
                let cpu = or_note!(fraction(&format!("nodes[{i}].usage.cpu"), u.cpu));
                let ram = or_note!(fraction(&format!("nodes[{i}].usage.ram"), u.ram));
                Some(BaseUsage {
                    cpu: cpu.unwrap_or(0.0),
                    ram: ram.unwrap_or(0.0),
                })
            }
            (None, Some(_)) => Some(BaseUsage { cpu: 0.0, ram: 0.0 }),
            (None, None) => None,
        };
        if n.cores == Some(0) {
            note(Err(invalid(format!("nodes[{i}].cores: at least 1"))));
        }
        nodes.push(NodeSpec {
            name: n.name.clone(),
            zone: n.zone.clone(),
            region: n.region.clone(),
            cores: n.cores,
            usage,
        });
    }
    let node_index = |what: &str, name: &str| -> Result<usize, ScenarioError> {
        nodes
            .iter()
            .position(|n| n.name == name)
            .ok_or_else(|| invalid(format!("{what}: no node {name:?}")))
    };

    let latency = or_note!(check_latency(&doc.latency, &nodes, &node_index));

    let mut services = Vec::new();
    let mut instance_names = BTreeSet::new();
    for (si, s) in doc.services.iter().enumerate() {
        let at = format!("services[{si}]");
        let mut settings = Vec::new();
        for (k, v) in &s.settings {
            match scalar(v) {
                Some(v) => settings.push((k.clone(), v)),
                None => note(Err(invalid(format!(
                    "{at}.settings.{k}: expected a single value"
                )))),
            }
        }
        let (parsed, errors) =
            ServiceSettings::from_pairs(settings.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        for e in errors {
            note(Err(invalid(format!(
                "{at}.settings.{}: {:?} is not valid: expected {}",
                e.key, e.value, e.expected
            ))));
        }
        if services.iter().any(|x: &ServiceSpecDoc| x.name == s.name) {
            note(Err(invalid(format!(
                "{at}.name: duplicate service {:?}",
                s.name
            ))));
        }
        let mut instances = Vec::new();
        for (ii, inst) in s.instances.iter().enumerate() {
            let what = format!("{at}.instances[{ii}]");
            let node = or_note!(node_index(&format!("{what}.node"), &inst.node));
            let processing = or_note!(processing(&format!("{what}.processing"), &inst.processing));
            let base = inst
                .name
                .clone()
                .unwrap_or_else(|| format!("{}-{}", s.name, inst.node));
            let count = inst.count.unwrap_or(1);
            let names: Vec<String> = match (inst.count, &inst.name) {
                (None, _) => vec![base],
                (Some(_), _) => (1..=count).map(|k| format!("{base}-{k}")).collect(),
            };
            for name in names {
                if !instance_names.insert(name.clone()) {
                    note(Err(invalid(format!(
                        "{what}: duplicate instance name {name:?}"
                    ))));
                    continue;
                }
                if let (Some(node), Some(processing)) = (node, processing) {
                    instances.push(InstanceSpec {
                        name,
                        node,
                        processing,
                        workers: inst.workers.map(|w| w.max(1)),
                        start: inst.start.unwrap_or(true),
                    });
                }
            }
        }
        let protocol = or_note!(service_protocol(&at, s.protocol.as_deref()));
        services.push(ServiceSpecDoc {
            protocol: protocol.unwrap_or_default(),
            name: s.name.clone(),
            namespace: s
                .namespace
                .clone()
                .unwrap_or_else(|| ServiceKey::DEFAULT_NAMESPACE.to_string()),
            settings,
            slo: parsed.latency_slo,
            instances,
        });
    }
    if doc.services.is_empty() {
        note(Err(invalid("services: at least one service is needed")));
    }

    let before_clients = problems.borrow().len();
    let mut clients = Vec::new();
    for (ci, c) in doc.clients.iter().enumerate() {
        let what = format!("clients[{ci}]");
        let node = or_note!(node_index(&format!("{what}.node"), &c.node));
        let service = or_note!(services
            .iter()
            .position(|s| s.name == c.service)
            .ok_or_else(|| invalid(format!("{what}.service: no service {:?}", c.service))));
        let duration = or_note!(c
            .duration
            .as_deref()
            .map(|d| duration(&format!("{what}.duration"), d))
            .transpose())
        .flatten();
        if c.requests.is_none() && c.duration.is_none() {
            note(Err(invalid(format!(
                "{what}: give `requests` (a count) or `duration` (e.g. 10s)"
            ))));
        }
        if let Some(rate) = c.rate {
            if !(rate.is_finite() && rate > 0.0) {
                note(Err(invalid(format!(
                    "{what}.rate: expected requests per second > 0"
                ))));
            }
        }
        let protocol = or_note!(client_protocol(
            &what,
            c.protocol.as_deref(),
            service.and_then(|s| services.get(s))
        ));
        let method = or_note!(client_method(&what, c, protocol.unwrap_or_default()));
        let path = c
            .path
            .clone()
            .unwrap_or_else(|| protocol.unwrap_or_default().default_path().to_string());
        if !path.starts_with('/') {
            note(Err(invalid(format!("{what}.path: must start with /"))));
        }
        let latency = or_note!(opt_duration(
            &format!("{what}.latency"),
            &c.latency,
            Duration::ZERO
        ));
        // Filled in from `testbed.client-timeout` below when not given.
        let timeout = or_note!(opt_duration(
            &format!("{what}.timeout"),
            &c.timeout,
            Duration::ZERO
        ));
        if c.timeout.is_some() && timeout == Some(Duration::ZERO) {
            note(Err(invalid(format!(
                "{what}.timeout: must be greater than zero"
            ))));
        }
        let name = c
            .name
            .clone()
            .unwrap_or_else(|| format!("client-{}", c.node));
        if clients.iter().any(|x: &ClientSpec| x.name == name) {
            note(Err(invalid(format!(
                "{what}.name: duplicate name {name:?}"
            ))));
        }
        if let (Some(node), Some(service), Some(method), Some(latency), Some(timeout)) =
            (node, service, method, latency, timeout)
        {
            clients.push(ClientSpec {
                protocol: protocol.unwrap_or_default(),
                name,
                node,
                latency,
                service,
                requests: c.requests,
                duration,
                concurrency: c
                    .concurrency
                    .unwrap_or(if c.rate.is_some() { 256 } else { 1 })
                    .max(1),
                rate: c.rate,
                method,
                path,
                body: c.body.clone(),
                timeout,
            });
        }
    }
    if doc.clients.is_empty() {
        note(Err(invalid("clients: at least one client is needed")));
    }

    // Every name given, even of an instance with a problem of its own (reported above).
    let instance = |what: &str, name: &str| -> Result<String, ScenarioError> {
        instance_names
            .contains(name)
            .then(|| name.to_string())
            .ok_or_else(|| invalid(format!("{what}: no instance {name:?}")))
    };
    // `name`, `*` (every node), `zone:NAME` or `region:NAME`.
    let select = |what: &str, selector: &str| -> Result<Vec<usize>, ScenarioError> {
        let chosen: Vec<usize> = if selector == "*" {
            (0..nodes.len()).collect()
        } else if let Some(zone) = selector.strip_prefix("zone:") {
            (0..nodes.len())
                .filter(|&i| nodes[i].zone.as_deref() == Some(zone))
                .collect()
        } else if let Some(region) = selector.strip_prefix("region:") {
            (0..nodes.len())
                .filter(|&i| nodes[i].region.as_deref() == Some(region))
                .collect()
        } else {
            vec![node_index(what, selector)?]
        };
        if chosen.is_empty() {
            return Err(invalid(format!("{what}: {selector:?} selects no node")));
        }
        Ok(chosen)
    };
    let pairs = |what: &str, between: &[String; 2]| -> Result<Vec<(usize, usize)>, ScenarioError> {
        let a = select(&format!("{what}.between[0]"), &between[0])?;
        let b = select(&format!("{what}.between[1]"), &between[1])?;
        let mut out = BTreeSet::new();
        for &x in &a {
            for &y in &b {
                if x != y {
                    out.insert((x.min(y), x.max(y)));
                }
            }
        }
        if out.is_empty() {
            return Err(invalid(format!(
                "{what}.between: {:?} and {:?} make no pair of different nodes",
                between[0], between[1]
            )));
        }
        Ok(out.into_iter().collect())
    };
    let mut events = Vec::new();
    for (ei, e) in doc.events.iter().enumerate() {
        let what = format!("events[{ei}]");
        let at = match &e.at {
            Value::Number(n) => n.as_u64().map(Trigger::Requests),
            Value::String(s) => or_note!(duration(&format!("{what}.at"), s)).map(Trigger::Time),
            _ => None,
        };
        if at.is_none() && !matches!(&e.at, Value::String(_)) {
            note(Err(invalid(format!(
                "{what}.at: a request count (e.g. 250) or a time (e.g. 5s)"
            ))));
        }
        let mut actions = Vec::new();
        for (ai, a) in e.actions.iter().enumerate() {
            let what = format!("{what}.do[{ai}]");
            let mut found: Vec<Result<Action, ScenarioError>> = Vec::new();
            if let Some(name) = &a.join {
                found.push(instance(&format!("{what}.join"), name).map(Action::Join));
            }
            if let Some(name) = &a.leave {
                found.push(instance(&format!("{what}.leave"), name).map(Action::Leave));
            }
            if let Some(fail) = &a.fail {
                let (name, after) = match fail {
                    FailDoc::Name(n) => (n.clone(), None),
                    FailDoc::Full(f) => (f.instance.clone(), f.remove_after.clone()),
                };
                found.push((|| {
                    Ok(Action::Fail {
                        instance: instance(&format!("{what}.fail"), &name)?,
                        remove_after: opt_duration(
                            &format!("{what}.fail.remove-after"),
                            &after,
                            Duration::from_secs(1),
                        )?,
                    })
                })());
            }
            if let Some(o) = &a.overload {
                found.push((|| {
                    let add =
                        opt_duration(&format!("{what}.overload.add"), &o.add, Duration::ZERO)?;
                    let processing = match &o.processing {
                        Some(_) => Some(processing(
                            &format!("{what}.overload.processing"),
                            &o.processing,
                        )?),
                        None => None,
                    };
                    if add.is_zero() && processing.is_none() {
                        return Err(invalid(format!(
                            "{what}.overload: give `add` (e.g. 100ms) and/or `processing`"
                        )));
                    }
                    Ok(Action::Overload {
                        instance: instance(&format!("{what}.overload.instance"), &o.instance)?,
                        add,
                        processing,
                    })
                })());
            }
            if let Some(e) = &a.errors {
                found.push((|| {
                    let status = match &e.status {
                        Value::String(off) if off == "off" => None,
                        Value::Number(n) => Some(
                            n.as_u64()
                                .and_then(|n| u16::try_from(n).ok())
                                .and_then(|n| http::StatusCode::from_u16(n).ok())
                                .filter(|s| s.as_u16() >= 200)
                                .ok_or_else(|| {
                                    invalid(format!(
                                        "{what}.errors.status: a status from 200 to 999"
                                    ))
                                })?,
                        ),
                        _ => {
                            return Err(invalid(format!(
                                "{what}.errors.status: a status code or `off`"
                            )))
                        }
                    };
                    Ok(Action::Errors {
                        instance: instance(&format!("{what}.errors.instance"), &e.instance)?,
                        status,
                    })
                })());
            }
            if let Some(l) = &a.link {
                found.push((|| {
                    let change = match (&l.add, &l.delay) {
                        (Some(add), None) => {
                            LinkChange::Add(duration(&format!("{what}.link.add"), add)?)
                        }
                        (None, Some(d)) => {
                            LinkChange::Set(duration(&format!("{what}.link.delay"), d)?)
                        }
                        _ => {
                            return Err(invalid(format!(
                                "{what}.link: give either `add` or `delay` (one way); \
                                 `reset` undoes a change"
                            )))
                        }
                    };
                    Ok(Action::Link {
                        pairs: pairs(&format!("{what}.link"), &l.between)?,
                        change,
                    })
                })());
            }
            if let Some(b) = &a.blackhole {
                found.push(
                    pairs(&format!("{what}.blackhole"), &b.between).map(|pairs| Action::Link {
                        pairs,
                        change: LinkChange::Blackhole,
                    }),
                );
            }
            if let Some(r) = &a.reset {
                found.push(match (&r.between, &r.instance) {
                    (Some(between), None) => {
                        pairs(&format!("{what}.reset"), between).map(|pairs| Action::Link {
                            pairs,
                            change: LinkChange::Reset,
                        })
                    }
                    (None, Some(name)) => {
                        instance(&format!("{what}.reset.instance"), name).map(Action::ResetInstance)
                    }
                    _ => Err(invalid(format!(
                        "{what}.reset: give either `between: [A, B]` (a link back to its \
                         latency) or `instance: NAME` (processing back to the scenario's)"
                    ))),
                });
            }
            if let Some(d) = &a.node_down {
                let (name, after) = match d {
                    NodeDownDoc::Name(n) => (n.clone(), None),
                    NodeDownDoc::Full(f) => (f.node.clone(), f.remove_after.clone()),
                };
                found.push((|| {
                    Ok(Action::NodeDown {
                        node: node_index(&format!("{what}.node-down"), &name)?,
                        remove_after: after
                            .as_deref()
                            .map(|v| duration(&format!("{what}.node-down.remove-after"), v))
                            .transpose()?,
                    })
                })());
            }
            if let Some(name) = &a.node_up {
                found.push(node_index(&format!("{what}.node-up"), name).map(Action::NodeUp));
            }
            if let Some(name) = &a.proxy_restart {
                found.push(
                    node_index(&format!("{what}.proxy-restart"), name).map(Action::ProxyRestart),
                );
            }
            if let Some(u) = &a.usage {
                found.push((|| {
                    let node = node_index(&format!("{what}.usage.node"), &u.node)?;
                    if nodes[node].usage.is_none() {
                        return Err(invalid(format!(
                            "{what}.usage.node: node {:?} does not report usage (give it \
                             `usage` or `cores`)",
                            u.node
                        )));
                    }
                    Ok(Action::Usage {
                        node,
                        cpu: u
                            .cpu
                            .map(|c| fraction(&format!("{what}.usage.cpu"), c))
                            .transpose()?,
                        ram: u
                            .ram
                            .map(|r| fraction(&format!("{what}.usage.ram"), r))
                            .transpose()?,
                    })
                })());
            }
            if let Some(busy) = &a.busy_host {
                found.push(match busy {
                    BusyHostDoc::Off(off) if off == "off" => Ok(Action::BusyHost { cores: 0 }),
                    BusyHostDoc::Cores { cores } if *cores <= 64 => {
                        Ok(Action::BusyHost { cores: *cores })
                    }
                    _ => Err(invalid(format!(
                        "{what}.busy-host: {{ cores: N }} (0 to 64 spinning threads) or `off`"
                    ))),
                });
            }
            if found.len() != 1 {
                note(Err(invalid(format!(
                    "{what}: each entry is exactly one of {}",
                    ACTION_KEYS.join(", ")
                ))));
                continue;
            }
            if let Some(action) = or_note!(found.remove(0)) {
                actions.push(action);
            }
        }
        if let Some(at) = at {
            events.push(EventSpec {
                name: e.name.clone().unwrap_or_else(|| format!("T{}", ei + 1)),
                at,
                actions,
            });
        }
    }
    // Count-triggered events must come in order: phases are numbered by them.
    let counts: Vec<u64> = events
        .iter()
        .filter_map(|e| match e.at {
            Trigger::Requests(n) => Some(n),
            Trigger::Time(_) => None,
        })
        .collect();
    if counts.windows(2).any(|w| w[0] > w[1]) {
        note(Err(invalid(
            "events: request-count triggers must be in increasing order",
        )));
    }

    // The timeline can be followed when every instance, client and event resolved
    // (a service's settings do not matter to it).
    let resolved = problems.borrow().len() == before_clients
        && services.iter().map(|s| s.instances.len()).sum::<usize>() == instance_names.len();
    let mut strategies = Vec::new();
    for (i, s) in doc.strategies.iter().enumerate() {
        let what = format!("strategies[{i}]");
        let parsed = match s {
            StrategyDoc::Spec(spec) => StrategySpec::parse(spec),
            StrategyDoc::Labelled { label, spec } => {
                StrategySpec::parse(spec).map(|p| p.labelled(label))
            }
        };
        match parsed {
            Ok(p) => strategies.push(p),
            Err(e) => note(Err(invalid(format!("{what}: {e}")))),
        }
    }

    let d = TestbedSettings::default();
    let t = &doc.testbed;
    let drain = opt_duration("testbed.drain", &t.drain, d.drain).unwrap_or_else(|e| {
        note(Err(e));
        d.drain
    });
    let setting = |key: &str, value: &Option<String>, default: Duration| match opt_duration(
        &format!("testbed.{key}"),
        value,
        default,
    ) {
        Ok(v) if v.is_zero() && value.is_some() => {
            note(Err(invalid(format!(
                "testbed.{key}: must be greater than zero"
            ))));
            default
        }
        Ok(v) => v,
        Err(e) => {
            note(Err(e));
            default
        }
    };
    let testbed = TestbedSettings {
        discovery_interval: setting(
            "discovery-interval",
            &t.discovery_interval,
            d.discovery_interval,
        ),
        peer_probe_interval: setting(
            "peer-probe-interval",
            &t.peer_probe_interval,
            d.peer_probe_interval,
        ),
        usage_interval: setting("usage-interval", &t.usage_interval, d.usage_interval),
        usage_window: setting("usage-window", &t.usage_window, d.usage_window),
        warmup_timeout: setting("warmup-timeout", &t.warmup_timeout, d.warmup_timeout),
        drain,
        client_timeout: setting("client-timeout", &t.client_timeout, d.client_timeout),
        peer_share_bytes: t.peer_share_bytes.unwrap_or(d.peer_share_bytes),
        peer_sample: match t.peer_sample {
            Some(0) => {
                note(Err(invalid(
                    "testbed.peer-sample: must be greater than zero",
                )));
                d.peer_sample
            }
            given => given.unwrap_or(d.peer_sample),
        },
        peer_coordinates: t.peer_coordinates.unwrap_or(d.peer_coordinates),
    };
    for (client, doc) in clients.iter_mut().zip(&doc.clients) {
        if doc.timeout.is_none() {
            client.timeout = testbed.client_timeout;
        }
    }

    let mut problems = problems.into_inner();
    let Some(latency) = latency else {
        return Err(problems_error(problems));
    };
    let scenario = Scenario {
        name: doc.name,
        description: doc.description,
        variant: String::new(),
        seed: doc.seed.unwrap_or(1),
        nodes,
        latency,
        services,
        clients,
        events,
        strategies,
        testbed,
    };
    if resolved {
        problems.extend(check_timeline(&scenario, &doc.events));
    }
    if problems.is_empty() {
        Ok(scenario)
    } else {
        Err(problems_error(problems))
    }
}

/// The keys of an event action.
const ACTION_KEYS: &[&str] = &[
    "join",
    "leave",
    "fail",
    "overload",
    "errors",
    "reset",
    "link",
    "blackhole",
    "node-down",
    "node-up",
    "proxy-restart",
    "usage",
    "busy-host",
];

fn problems_error(problems: Vec<String>) -> ScenarioError {
    ScenarioError::Problems(problems)
}

/// Events against the run's time span and against the state of the topology when they
/// happen: nothing after the clients stop, no `join` of a running instance, no `leave`
/// of one that is not running, no `node-up` of a node that is up, and so on. Events are
/// followed in trigger order (count triggers in order, time triggers by time); when a
/// scenario mixes both kinds, in file order, since which comes first depends on speed.
fn check_timeline(scenario: &Scenario, docs: &[EventDoc]) -> Vec<String> {
    let mut problems = Vec::new();
    let all_timed = scenario.clients.iter().all(|c| c.duration.is_some());
    let all_counted = scenario.clients.iter().all(|c| c.requests.is_some());
    // Clients stop at the first of their limits.
    let time_limit = all_timed
        .then(|| scenario.clients.iter().filter_map(|c| c.duration).max())
        .flatten();
    let count_limit: Option<u64> = all_counted.then(|| {
        scenario
            .clients
            .iter()
            .filter_map(|c| c.requests)
            .sum::<u64>()
    });
    for (i, e) in scenario.events.iter().enumerate() {
        match e.at {
            Trigger::Time(t) => {
                if let Some(limit) = time_limit.filter(|l| t >= *l) {
                    problems.push(format!(
                        "events[{i}].at: {} is not before the clients stop (the last \
                         client's duration is {})",
                        fmt_duration(t),
                        fmt_duration(limit)
                    ));
                }
            }
            Trigger::Requests(n) => {
                if let Some(limit) = count_limit.filter(|l| n >= *l) {
                    problems.push(format!(
                        "events[{i}].at: after {n} requests comes after the last one \
                         (the clients send {limit} in all)"
                    ));
                }
            }
        }
    }
    let mixed = scenario
        .events
        .iter()
        .any(|e| matches!(e.at, Trigger::Time(_)))
        && scenario
            .events
            .iter()
            .any(|e| matches!(e.at, Trigger::Requests(_)));
    let mut order: Vec<usize> = (0..scenario.events.len()).collect();
    if !mixed {
        order.sort_by_key(|&i| match scenario.events[i].at {
            Trigger::Requests(n) => Duration::from_nanos(n),
            Trigger::Time(t) => t,
        });
    }

    #[derive(Clone, Copy, PartialEq)]
    enum Pod {
        NotStarted,
        Running,
        Gone,
    }
    let names: Vec<&str> = scenario
        .services
        .iter()
        .flat_map(|s| s.instances.iter().map(|i| i.name.as_str()))
        .collect();
    let mut pods: Vec<Pod> = scenario
        .services
        .iter()
        .flat_map(|s| s.instances.iter())
        .map(|i| {
            if i.start {
                Pod::Running
            } else {
                Pod::NotStarted
            }
        })
        .collect();
    let mut down = vec![false; scenario.nodes.len()];
    let pod = |name: &str| names.iter().position(|n| *n == name);
    let state_name = |p: Pod| match p {
        Pod::NotStarted => "has not started yet (start: false)",
        Pod::Running => "is already running",
        Pod::Gone => "has left or failed",
    };
    for i in order {
        let event = &scenario.events[i];
        for (ai, action) in event.actions.iter().enumerate() {
            let key = docs
                .get(i)
                .and_then(|d| d.actions.get(ai))
                .map_or("", action_key);
            let what = format!("events[{i}].do[{ai}].{key}");
            let when = match event.at {
                Trigger::Requests(n) => format!("after {n} requests"),
                Trigger::Time(t) => format!("at {}", fmt_duration(t)),
            };
            match action {
                Action::Join(name) => {
                    if let Some(k) = pod(name) {
                        if pods[k] == Pod::Running {
                            problems.push(format!(
                                "{what}: {name:?} {} {when}; `join` starts an instance that \
                                 is not running",
                                state_name(pods[k])
                            ));
                        }
                        pods[k] = Pod::Running;
                    }
                }
                Action::Leave(name)
                | Action::Fail { instance: name, .. }
                | Action::Overload { instance: name, .. }
                | Action::Errors { instance: name, .. }
                | Action::ResetInstance(name) => {
                    if let Some(k) = pod(name) {
                        if pods[k] != Pod::Running {
                            problems.push(format!(
                                "{what}: {name:?} {} {when}; `{key}` needs a running instance",
                                state_name(pods[k])
                            ));
                        }
                        if matches!(action, Action::Leave(_) | Action::Fail { .. }) {
                            pods[k] = Pod::Gone;
                        }
                    }
                }
                Action::NodeDown { node, .. } => {
                    if std::mem::replace(&mut down[*node], true) {
                        problems.push(format!(
                            "{what}: node {:?} is already down {when}",
                            scenario.nodes[*node].name
                        ));
                    }
                }
                Action::NodeUp(node) => {
                    if !std::mem::replace(&mut down[*node], false) {
                        problems.push(format!(
                            "{what}: node {:?} is not down {when}; `node-up` follows a \
                             `node-down`",
                            scenario.nodes[*node].name
                        ));
                    }
                }
                Action::ProxyRestart(node) => {
                    if down[*node] {
                        problems.push(format!(
                            "{what}: node {:?} is down {when}; a proxy restarts on a node \
                             that is up",
                            scenario.nodes[*node].name
                        ));
                    }
                }
                Action::Link { .. } | Action::Usage { .. } | Action::BusyHost { .. } => {}
            }
        }
    }
    problems
}

fn action_key(a: &ActionDoc) -> &'static str {
    [
        (a.join.is_some(), "join"),
        (a.leave.is_some(), "leave"),
        (a.fail.is_some(), "fail"),
        (a.overload.is_some(), "overload"),
        (a.errors.is_some(), "errors"),
        (a.reset.is_some(), "reset"),
        (a.link.is_some(), "link"),
        (a.blackhole.is_some(), "blackhole"),
        (a.node_down.is_some(), "node-down"),
        (a.node_up.is_some(), "node-up"),
        (a.proxy_restart.is_some(), "proxy-restart"),
        (a.usage.is_some(), "usage"),
        (a.busy_host.is_some(), "busy-host"),
    ]
    .into_iter()
    .find(|(set, _)| *set)
    .map_or("", |(_, k)| k)
}

fn fmt_duration(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_secs_f64() * 1e3)
    }
}

fn check_latency(
    doc: &LatencyDoc,
    nodes: &[NodeSpec],
    node_index: &dyn Fn(&str, &str) -> Result<usize, ScenarioError>,
) -> Result<LatencySpec, ScenarioError> {
    let scale = match doc.unit.as_deref().unwrap_or("one-way") {
        "one-way" => 1.0,
        "rtt" => 0.5,
        other => {
            return Err(invalid(format!(
                "latency.unit: {other:?} is neither one-way nor rtt"
            )))
        }
    };
    let scaled = |d: Duration| d.mul_f64(scale);
    let default = scaled(opt_duration(
        "latency.default",
        &doc.default,
        Duration::ZERO,
    )?);
    let local = scaled(opt_duration("latency.local", &doc.local, Duration::ZERO)?);
    let n = nodes.len();
    let mut one_way = vec![vec![default; n]; n];
    for (i, row) in one_way.iter_mut().enumerate() {
        row[i] = local;
    }
    if let Some(m) = &doc.matrix {
        let order: Vec<usize> = match &m.nodes {
            Some(names) => names
                .iter()
                .map(|name| node_index("latency.matrix.nodes", name))
                .collect::<Result<_, _>>()?,
            None => (0..n).collect(),
        };
        if m.rows.len() != order.len() || m.rows.iter().any(|r| r.len() != order.len()) {
            return Err(invalid(format!(
                "latency.matrix: expected {k} rows of {k} numbers (ms)",
                k = order.len()
            )));
        }
        for (r, row) in m.rows.iter().enumerate() {
            for (c, ms) in row.iter().enumerate() {
                if !(ms.is_finite() && *ms >= 0.0) {
                    return Err(invalid(format!(
                        "latency.matrix.rows[{r}][{c}]: expected ms >= 0"
                    )));
                }
                if r != c {
                    one_way[order[r]][order[c]] = scaled(Duration::from_secs_f64(ms / 1e3));
                }
            }
        }
    }
    for (i, p) in doc.pairs.iter().enumerate() {
        let what = format!("latency.pairs[{i}]");
        let a = node_index(&what, &p.between[0])?;
        let b = node_index(&what, &p.between[1])?;
        let d = scaled(duration(&what, &p.delay)?);
        one_way[a][b] = d;
        one_way[b][a] = d;
    }
    Ok(LatencySpec { one_way })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: &str = r#"
name: small
nodes: [{ name: a }, { name: b, cores: 2 }]
latency:
  unit: rtt
  default: 40ms
  pairs: [{ between: [a, b], delay: 20ms }]
services:
  - name: api
    settings: { latency-slo: 80ms }
    instances:
      - { name: api-a, node: a, processing: "normal(5ms, 1ms)" }
      - { node: b, count: 2, processing: 1ms, start: false }
clients:
  - { node: a, service: api, requests: 10, method: POST, body: "x" }
events:
  - { at: 5, do: [{ join: api-b-1 }, { link: { between: [a, "*"], add: 10ms } }] }
  - { at: 2s, do: [{ usage: { node: b, cpu: 0.5 } }] }
strategies: [round-robin, { label: P, spec: "proximity:alpha=0.8" }]
"#;

    #[test]
    fn errors_events_take_a_status_or_off() {
        let with = |status: &str| {
            SMALL.replace(
                "- { at: 2s, do: [{ usage: { node: b, cpu: 0.5 } }] }",
                &format!(
                    "- {{ at: 2s, do: [{{ errors: {{ instance: api-a, status: {status} }} }}] }}"
                ),
            )
        };
        let scenario = |text: &str| ScenarioFile::parse(text).and_then(|f| f.variant(""));
        let s = scenario(&with("500")).unwrap();
        assert_eq!(
            s.events[1].actions[0],
            Action::Errors {
                instance: "api-a".into(),
                status: Some(http::StatusCode::INTERNAL_SERVER_ERROR)
            }
        );
        let s = scenario(&with("off")).unwrap();
        assert_eq!(
            s.events[1].actions[0],
            Action::Errors {
                instance: "api-a".into(),
                status: None
            }
        );
        for bad in ["99", "1000", "on", "[500]"] {
            let error = scenario(&with(bad)).unwrap_err().to_string();
            assert!(error.contains("errors.status"), "{bad}: {error}");
        }
    }

    #[test]
    fn a_small_scenario_is_checked_and_resolved() {
        let file = ScenarioFile::parse(SMALL).unwrap();
        assert_eq!(file.variant_names(), [""]);
        let s = file.variant("").unwrap();
        assert_eq!(s.nodes.len(), 2);
        assert_eq!(s.latency.one_way(0, 1), Duration::from_millis(10));
        assert_eq!(s.latency.one_way(1, 1), Duration::ZERO);
        let names: Vec<&str> = s.services[0]
            .instances
            .iter()
            .map(|i| i.name.as_str())
            .collect();
        assert_eq!(names, ["api-a", "api-b-1", "api-b-2"]);
        assert!(!s.services[0].instances[1].start);
        assert_eq!(s.services[0].slo, Duration::from_millis(80));
        assert_eq!(s.clients[0].method, http::Method::POST);
        assert_eq!(s.events[0].at, Trigger::Requests(5));
        assert_eq!(s.events[0].name, "T1");
        assert_eq!(
            s.events[0].actions[1],
            Action::Link {
                pairs: vec![(0, 1)],
                change: LinkChange::Add(Duration::from_millis(10))
            }
        );
        assert_eq!(s.events[1].at, Trigger::Time(Duration::from_secs(2)));
        assert_eq!(s.strategies[1].label, "P");
        assert_eq!(
            s.strategies[1].settings,
            [("proximity-alpha".to_string(), "0.8".to_string())]
        );
        assert_eq!(s.nodes[1].usage, Some(BaseUsage { cpu: 0.0, ram: 0.0 }));
    }

    #[test]
    fn variants_substitute_their_values() {
        let text = format!(
            "{}\nvariants:\n  - {{ name: fast, slo: 10ms }}\n  - {{ name: slow, slo: 90ms }}\n",
            SMALL.replace("latency-slo: 80ms", "latency-slo: ${slo}")
        );
        let file = ScenarioFile::parse(&text).unwrap();
        assert_eq!(file.variant_names(), ["fast", "slow"]);
        assert_eq!(
            file.variant("slow").unwrap().services[0].slo,
            Duration::from_millis(90)
        );
        let broken = SMALL.replace("80ms", "${nope}");
        let e = ScenarioFile::parse(&broken).unwrap_err().to_string();
        assert!(e.contains("nope"), "{e}");
    }

    #[test]
    fn sharing_and_coordinates_turn_on_and_off_per_variant() {
        let text = format!(
            "{SMALL}\ntestbed: {{ peer-share-bytes: ${{share}}, peer-coordinates: ${{coords}} }}\n\
             variants:\n  - {{ name: alone, share: 0, coords: false }}\n  \
             - {{ name: together, share: 4096, coords: true }}\n"
        );
        let file = ScenarioFile::parse(&text).unwrap();
        let alone = file.variant("alone").unwrap().testbed;
        assert_eq!((alone.peer_share_bytes, alone.peer_coordinates), (0, false));
        let together = file.variant("together").unwrap().testbed;
        assert_eq!(
            (together.peer_share_bytes, together.peer_coordinates),
            (4096, true)
        );
        assert!(
            ScenarioFile::parse(SMALL)
                .unwrap()
                .variant("")
                .unwrap()
                .testbed
                .peer_coordinates
        );
    }

    #[test]
    fn mistakes_are_reported_with_where_they_are() {
        for (from, to, expected) in [
            (
                "node: a, processing",
                "node: zz, processing",
                "no node \"zz\"",
            ),
            (
                "requests: 10",
                "path: /x",
                "give `requests` (a count) or `duration`",
            ),
            ("join: api-b-1", "join: ghost", "no instance \"ghost\""),
            ("latency-slo: 80ms", "latency-slo: 80", "latency-slo"),
            ("\"normal(5ms, 1ms)\"", "\"normal(5ms)\"", "processing"),
            ("unit: rtt", "unit: hops", "neither one-way nor rtt"),
            ("name: small", "name: small\nbogus: 1", "bogus"),
        ] {
            let text = SMALL.replace(from, to);
            let e = ScenarioFile::parse(&text).unwrap_err().to_string();
            assert!(e.contains(expected), "{from} -> {to}: {e}");
        }
    }

    #[test]
    fn strategy_specs() {
        let s = StrategySpec::parse("qos-pool:qos-pool-window=20:latency-slo=50ms").unwrap();
        assert_eq!(s.strategy, "qos-pool");
        assert_eq!(s.settings[0].0, "qos-pool-window");
        assert_eq!(s.settings[1].0, "latency-slo");
        let p = StrategySpec::parse("proximity:alpha=1.0:decay=inverse").unwrap();
        assert_eq!(
            p.settings[1],
            ("proximity-decay".to_string(), "inverse".to_string())
        );
        assert!(StrategySpec::parse("proximity:alpha").is_err());
        assert!(StrategySpec::parse("").is_err());
        assert!(StrategySpec::parse("qos-pool:qos-pool-window=0").is_err());
    }

    #[test]
    fn matrices_fill_every_pair() {
        let text = r#"
name: m
nodes: [{ name: a }, { name: b }, { name: c }]
latency: { unit: rtt, matrix: { rows: [[0.3, 10, 20], [10, 0.3, 30], [20, 30, 0.3]] } }
services: [{ name: s, instances: [{ node: a }] }]
clients: [{ node: a, service: s, duration: 1s }]
"#;
        let s = ScenarioFile::parse(text).unwrap().variant("").unwrap();
        assert_eq!(s.latency.one_way(2, 1), Duration::from_millis(15));
        assert_eq!(s.latency.one_way(0, 0), Duration::ZERO);
    }

    /// The problems `check` reports for `text`, one string each.
    fn problems(text: &str) -> Vec<String> {
        match ScenarioFile::parse(text) {
            Ok(_) => vec![],
            Err(ScenarioError::Problems(list)) => list,
            Err(other) => vec![other.to_string()],
        }
    }

    const REGIONS: &str = r#"
name: regions
nodes:
  - { name: a1, zone: za, region: eu }
  - { name: a2, zone: za, region: eu }
  - { name: b1, zone: zb, region: us }
  - { name: c1, zone: zc, region: us }
services:
  - name: api
    settings: { latency-slo: 50ms, slo-percentile: 90 }
    instances:
      - { name: p1, node: a1 }
      - { name: p2, node: b1, start: false }
clients:
  - { node: a1, service: api, duration: 10s }
events:
  - { at: 1s, do: [{ link: { between: [region:eu, region:us], add: 30ms } }] }
  - { at: 2s, do: [{ blackhole: { between: [zone:zb, "*"] } }, { join: p2 }] }
  - { at: 3s, do: [{ reset: { between: [zone:zb, "*"] } }, { overload: { instance: p1, add: 50ms } }] }
  - { at: 4s, do: [{ node-down: { node: c1, remove-after: 1s } }, { reset: { instance: p1 } }] }
  - { at: 5s, do: [{ node-up: c1 }, { fail: p2 }] }
  - { at: 6s, do: [{ proxy-restart: a2 }] }
"#;

    #[test]
    fn link_events_select_nodes_by_zone_and_region() {
        let s = ScenarioFile::parse(REGIONS).unwrap().variant("").unwrap();
        let region = &s.events[0].actions[0];
        assert_eq!(
            *region,
            Action::Link {
                pairs: vec![(0, 2), (0, 3), (1, 2), (1, 3)],
                change: LinkChange::Add(Duration::from_millis(30))
            }
        );
        assert_eq!(
            s.events[1].actions[0],
            Action::Link {
                pairs: vec![(0, 2), (1, 2), (2, 3)],
                change: LinkChange::Blackhole
            }
        );
        assert!(matches!(
            s.events[2].actions[0],
            Action::Link {
                change: LinkChange::Reset,
                ..
            }
        ));
        assert_eq!(
            s.events[3].actions[0],
            Action::NodeDown {
                node: 3,
                remove_after: Some(Duration::from_secs(1))
            }
        );
        assert_eq!(s.events[3].actions[1], Action::ResetInstance("p1".into()));
        assert_eq!(s.events[4].actions[0], Action::NodeUp(3));
        assert_eq!(s.events[5].actions[0], Action::ProxyRestart(1));
        assert_eq!(s.nodes[2].region.as_deref(), Some("us"));
        assert_eq!(
            s.objectives(&StrategySpec::parse("round-robin").unwrap()),
            [(Duration::from_millis(50), 90.0)]
        );
        let stricter = StrategySpec::parse("round-robin:latency-slo=20ms").unwrap();
        assert_eq!(s.objectives(&stricter)[0].0, Duration::from_millis(20));
    }

    #[test]
    fn a_bad_key_names_itself_its_line_and_what_is_accepted() {
        let text = REGIONS.replace("{ fail: p2 }", "{ fail: { instnce: p2 } }");
        let found = problems(&text);
        assert_eq!(found.len(), 1, "{found:?}");
        let p = &found[0];
        assert!(
            p.starts_with("line 21: events[4].do[1].fail.instnce: unknown key"),
            "{p}"
        );
        assert!(p.contains("accepted here: instance, remove-after"), "{p}");
        assert!(!p.contains("untagged"), "{p}");
        // A value of the wrong form says which forms are accepted.
        let text = REGIONS.replace("{ fail: p2 }", "{ fail: [p2] }");
        let p = problems(&text).join("\n");
        assert!(
            p.contains("line 21: events[4].do[1].fail: expected a single value, or a mapping with instance, remove-after"),
            "{p}"
        );
    }

    #[test]
    fn every_problem_is_reported_once_with_its_line() {
        let text = REGIONS
            .replace("{ name: p1, node: a1 }", "{ name: p1, node: nowhere }")
            .replace("duration: 10s", "duration: 10s, colour: red")
            .replace("slo-percentile: 90", "slo-percentile: 190");
        let found = problems(&text);
        // The unknown key stops the shape check, so the rest waits for the next round.
        assert_eq!(found, ["line 15: clients[0].colour: unknown key; accepted here: name, node, latency, service, requests, duration, concurrency, rate, method, path, body, timeout, protocol"]);
        let text = text.replace(", colour: red", "");
        let found = problems(&text);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found[0]
                .starts_with("line 10: services[0].settings.slo-percentile: \"190\" is not valid"),
            "{found:?}"
        );
        assert!(!found[0].contains("default"), "{found:?}");
        assert!(
            found[1].starts_with("line 12: services[0].instances[0].node: no node \"nowhere\""),
            "{found:?}"
        );
        // YAML that does not parse: one message, with its place.
        let found = problems("name: x\nnodes: [a\n");
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("line"), "{found:?}");
        // A missing required key.
        let found = problems("name: x\nnodes: [{ zone: a }]\nservices: []\nclients: []\n");
        assert!(
            found[0].contains("nodes[0]: `name` is required"),
            "{found:?}"
        );
    }

    #[test]
    fn client_protocols_are_read_and_checked_against_their_service() {
        let text = REGIONS
            .replace("- name: api\n", "- name: api\n    protocol: grpc\n")
            .replace(
                "{ node: a1, service: api, duration: 10s }",
                "{ node: a1, service: api, duration: 10s, protocol: grpc, body: hi }",
            );
        let s = ScenarioFile::parse(&text).unwrap().variant("").unwrap();
        assert_eq!(s.services[0].protocol, ServiceProtocol::Grpc);
        let client = &s.clients[0];
        assert_eq!(client.protocol, ClientProtocol::Grpc);
        assert_eq!(client.path, "/testbed.Echo/Call");
        assert_eq!(client.method, http::Method::POST);
        let defaults = ScenarioFile::parse(REGIONS).unwrap().variant("").unwrap();
        assert_eq!(defaults.clients[0].protocol, ClientProtocol::Http);
        assert_eq!(defaults.services[0].protocol, ServiceProtocol::Http);
        for (from, to, expected) in [
            (
                "protocol: grpc\n",
                "protocol: http\n",
                "clients[0].protocol: a grpc client needs a service with `protocol: grpc`, \
                 and service \"api\" is http",
            ),
            (
                "protocol: grpc, body",
                "protocol: websocket, body",
                "a websocket client needs a service with `protocol: http`",
            ),
            (
                "protocol: grpc, body",
                "protocol: ftp, body",
                "\"ftp\" is not a client protocol: expected http, grpc or websocket",
            ),
            (
                "protocol: grpc\n",
                "protocol: h3\n",
                "services[0].protocol: \"h3\" is not a service protocol",
            ),
            (
                "body: hi",
                "body: hi, method: GET",
                "clients[0].method: a grpc client sends POST",
            ),
        ] {
            let found = problems(&text.replace(from, to)).join("\n");
            assert!(found.contains(expected), "{to}: {found}");
            assert!(found.starts_with("line "), "{found}");
        }
    }

    #[test]
    fn events_are_checked_against_the_run_and_the_topology_at_that_time() {
        for (from, to, expected) in [
            (
                "at: 5s, do: [{ node-up: c1 }",
                "at: 12s, do: [{ node-up: c1 }",
                "events[4].at: 12s is not before the clients stop",
            ),
            ("{ join: p2 }", "{ join: p1 }", "\"p1\" is already running"),
            (
                "{ fail: p2 }",
                "{ fail: p1 }, { leave: p1 }",
                "\"p1\" has left or failed",
            ),
            (
                "{ node-up: c1 }",
                "{ node-up: b1 }",
                "node \"b1\" is not down",
            ),
            (
                "{ reset: { instance: p1 } }",
                "{ reset: { instance: p1 } }, { proxy-restart: c1 }",
                "node \"c1\" is down at 4s; a proxy restarts on a node that is up",
            ),
            (
                "{ node-down: { node: c1, remove-after: 1s } }",
                "{ node-up: c1 }",
                "node \"c1\" is not down",
            ),
            (
                "{ reset: { instance: p1 } }",
                "{ reset: { instance: p2, between: [a1, b1] } }",
                "give either",
            ),
            (
                "zone:zb, \"*\"] } }, { join",
                "zone:zz, \"*\"] } }, { join",
                "\"zone:zz\" selects no node",
            ),
            (
                "[region:eu, region:us]",
                "[a1, a1]",
                "make no pair of different nodes",
            ),
            (
                "[{ link: { between: [region:eu, region:us], add: 30ms } }]",
                "[{ overload: { instance: p2, add: 5ms } }]",
                "\"p2\" has not started yet",
            ),
        ] {
            assert!(REGIONS.contains(from), "{from}");
            let text = REGIONS.replace(from, to);
            let found = problems(&text).join("\n");
            assert!(found.contains(expected), "{from} -> {to}: {found}");
            assert!(found.starts_with("line "), "{found}");
        }
        // With request counts: no event after the last request.
        let counted = REGIONS
            .replace("duration: 10s", "requests: 100")
            .replace("at: 5s", "at: 100")
            .replace("at: 4s", "at: 90")
            .replace("at: 3s", "at: 80")
            .replace("at: 2s", "at: 70")
            .replace("at: 1s", "at: 60");
        let found = problems(&counted).join("\n");
        assert!(
            found.contains("events[4].at: after 100 requests comes after the last one"),
            "{found}"
        );
    }

    #[test]
    fn unknown_strategies_and_parameters_are_refused() {
        let e = StrategySpec::parse("qos-pol").unwrap_err().to_string();
        assert!(
            e.contains("unknown strategy \"qos-pol\"") && e.contains("qos-pool"),
            "{e}"
        );
        let e = StrategySpec::parse("proximity:alphaa=0.8")
            .unwrap_err()
            .to_string();
        assert!(e.contains("proximity has no parameter `alphaa`"), "{e}");
        let e = StrategySpec::parse("proximity:alpha=7")
            .unwrap_err()
            .to_string();
        assert!(e.contains("proximity-alpha"), "{e}");
        assert!(StrategySpec::parse("proximity:alpha=0.5:decay=inverse").is_ok());
        assert!(StrategySpec::parse("rap:cpu-threshold=0.8").is_ok());
        let text = REGIONS.replace("events:", "strategies: [round-robin, qos-pol]\nevents:");
        let found = problems(&text).join("\n");
        assert!(
            found.contains("strategies[1]: strategy \"qos-pol\": unknown strategy"),
            "{found}"
        );
    }
}
