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
//! events:
//!   - name: T1
//!     at: 250                   # after 250 requests (all clients), or a time: 5s
//!     do:
//!       - join: api-2
//!       - overload: { instance: api-1, add: 100ms }
//!       - fail: { instance: api-1, remove-after: 1s }
//!       - leave: api-1
//!       - link: { between: [edge-1, "*"], add: 100ms }   # or delay: 30ms (one way)
//!       - usage: { node: edge-2, cpu: 0.95 }             # background usage (RAP)
//! strategies: [qos-pool, round-robin, "proximity:alpha=0.8"]
//! testbed: { discovery-interval: 200ms, peer-probe-interval: 500ms, client-timeout: 30s }
//! variants:                     # optional: run everything once per variant, with
//!   - { name: d3, delay: 3ms }  # `${delay}` replaced by the variant's value
//! ```
//!
//! Parsing is strict (unknown keys are errors) and everything is checked before a run
//! starts: names exist, durations parse, events refer to instances that exist.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use proxima_core::settings::parse_duration;
use proxima_core::ServiceSettings;
use proxima_emulate::ProcessingTime;
use serde::Deserialize;
use serde_yaml::Value;

/// Why a scenario cannot be run.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error("{0}")]
    Yaml(#[from] serde_yaml::Error),
    #[error("{0}")]
    Invalid(String),
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
    link: Option<LinkDoc>,
    usage: Option<UsageEventDoc>,
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
}

// ---------------------------------------------------------------------------------------
// The checked model.

/// A checked scenario (one variant of a file).
#[derive(Clone, Debug)]
pub struct Scenario {
    pub name: String,
    pub description: Option<String>,
    /// The variant this is, empty when the file has none.
    pub variant: String,
    pub seed: u64,
    pub nodes: Vec<NodeSpec>,
    pub latency: LatencySpec,
    pub services: Vec<ServiceSpecDoc>,
    pub clients: Vec<ClientSpec>,
    pub events: Vec<EventSpec>,
    pub strategies: Vec<StrategySpec>,
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

#[derive(Clone, Debug)]
pub struct NodeSpec {
    pub name: String,
    pub zone: Option<String>,
    /// Cores shared by the node's instances; `None`: unlimited.
    pub cores: Option<usize>,
    /// Emulated usage reporting: background CPU and RAM fractions. Present when the
    /// node reports usage (set `usage` or `cores`).
    pub usage: Option<BaseUsage>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BaseUsage {
    pub cpu: f64,
    pub ram: f64,
}

/// One-way delays between nodes.
#[derive(Clone, Debug)]
pub struct LatencySpec {
    /// `delays[from][to]`, indices into [`Scenario::nodes`]; the diagonal is `local`.
    pub one_way: Vec<Vec<Duration>>,
}

impl LatencySpec {
    pub fn one_way(&self, from: usize, to: usize) -> Duration {
        self.one_way[from][to]
    }
}

/// A service and its instances.
#[derive(Clone, Debug)]
pub struct ServiceSpecDoc {
    pub name: String,
    pub namespace: String,
    /// Settings as `key = value` pairs (strategy keys are added per run).
    pub settings: Vec<(String, String)>,
    pub slo: Duration,
    pub instances: Vec<InstanceSpec>,
}

#[derive(Clone, Debug)]
pub struct InstanceSpec {
    pub name: String,
    pub node: usize,
    pub processing: ProcessingTime,
    pub workers: Option<usize>,
    /// Whether it runs (and is listed) from the start; otherwise it `join`s later.
    pub start: bool,
}

#[derive(Clone, Debug)]
pub struct ClientSpec {
    pub name: String,
    pub node: usize,
    pub latency: Duration,
    /// Index into [`Scenario::services`].
    pub service: usize,
    pub requests: Option<u64>,
    pub duration: Option<Duration>,
    pub concurrency: usize,
    /// Open loop: requests per second (at most `concurrency` outstanding).
    pub rate: Option<f64>,
    pub method: http::Method,
    pub path: String,
    pub body: Option<String>,
    /// Longest a request may take before the client gives up on it (counted as a
    /// timeout, never within the SLO); `timeout`, else `testbed.client-timeout`.
    pub timeout: Duration,
}

/// When an event happens.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Trigger {
    /// After this many requests were sent, counted over all clients.
    Requests(u64),
    /// This long after the traffic started.
    Time(Duration),
}

#[derive(Clone, Debug)]
pub struct EventSpec {
    pub name: String,
    pub at: Trigger,
    pub actions: Vec<Action>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Start the instance and list it in discovery.
    Join(String),
    /// Take it out of discovery, then stop it gracefully after the drain time.
    Leave(String),
    /// Kill it (connections refused from now on); take it out of discovery later.
    Fail {
        instance: String,
        remove_after: Duration,
    },
    /// Add to its processing time, or replace its distribution.
    Overload {
        instance: String,
        add: Duration,
        processing: Option<ProcessingTime>,
    },
    /// Change the one-way delay between nodes (`to: None` = every other node), by
    /// setting or adding.
    Link {
        from: usize,
        to: Option<usize>,
        change: LinkChange,
    },
    /// Set a node's background CPU and/or RAM usage.
    Usage {
        node: usize,
        cpu: Option<f64>,
        ram: Option<f64>,
    },
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LinkChange {
    Set(Duration),
    Add(Duration),
}

/// A strategy to run the scenario with: `name[:key=value]...`.
#[derive(Clone, Debug, PartialEq)]
pub struct StrategySpec {
    pub label: String,
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
        let probe = settings
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .chain([("strategy", strategy.as_str())]);
        let (_, errors) = ServiceSettings::from_pairs(probe);
        if let Some(e) = errors.first() {
            return Err(invalid(format!("strategy {spec:?}: {e}")));
        }
        Ok(StrategySpec {
            label: spec.to_string(),
            strategy,
            settings,
        })
    }

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
    /// How often node usage is recomputed, and over which window.
    pub usage_interval: Duration,
    pub usage_window: Duration,
    /// Longest wait for every proxy to know every peer's latency before traffic starts.
    pub warmup_timeout: Duration,
    /// How long a leaving instance keeps serving after it left discovery.
    pub drain: Duration,
    /// Default for every client's `timeout`.
    pub client_timeout: Duration,
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
    pub fn parse(text: &str) -> Result<Self, ScenarioError> {
        // Placeholders may stand where YAML would not accept `${`, so only the
        // `variants` section is read before substitution.
        let value: Value = serde_yaml::from_str(&top_level_section(text, "variants"))?;
        let mut variants = Vec::new();
        if let Some(list) = value.get("variants") {
            let list = list
                .as_sequence()
                .ok_or_else(|| invalid("variants: expected a list of mappings"))?;
            for (i, entry) in list.iter().enumerate() {
                let map = entry
                    .as_mapping()
                    .ok_or_else(|| invalid(format!("variants[{i}]: expected a mapping")))?;
                let mut vars = BTreeMap::new();
                let mut name = None;
                for (k, v) in map {
                    let key = scalar(k)
                        .ok_or_else(|| invalid(format!("variants[{i}]: keys must be text")))?;
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
        let doc: Doc = serde_yaml::from_str(&text).map_err(|e| {
            if name.is_empty() {
                ScenarioError::Yaml(e)
            } else {
                invalid(format!("variant {name}: {e}"))
            }
        })?;
        let mut scenario = check(doc).map_err(|e| match name {
            "" => e,
            _ => invalid(format!("variant {name}: {e}")),
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

/// Check a parsed document and resolve names into indices.
fn check(doc: Doc) -> Result<Scenario, ScenarioError> {
    if doc.nodes.is_empty() {
        return Err(invalid("nodes: at least one node is needed"));
    }
    if doc.nodes.len() > 250 {
        return Err(invalid(
            "nodes: at most 250 nodes (one loopback address each)",
        ));
    }
    let mut node_names = BTreeSet::new();
    let mut nodes = Vec::new();
    for (i, n) in doc.nodes.iter().enumerate() {
        if n.name.is_empty() || !node_names.insert(n.name.clone()) {
            return Err(invalid(format!(
                "nodes[{i}]: empty or duplicate name {:?}",
                n.name
            )));
        }
        let usage = match (&n.usage, n.cores) {
            (Some(u), _) => Some(BaseUsage {
                cpu: fraction(&format!("nodes[{i}].usage.cpu"), u.cpu)?,
                ram: fraction(&format!("nodes[{i}].usage.ram"), u.ram)?,
            }),
            (None, Some(_)) => Some(BaseUsage { cpu: 0.0, ram: 0.0 }),
            (None, None) => None,
        };
        if n.cores == Some(0) {
            return Err(invalid(format!("nodes[{i}].cores: at least 1")));
        }
        nodes.push(NodeSpec {
            name: n.name.clone(),
            zone: n.zone.clone(),
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

    let latency = check_latency(&doc.latency, &nodes, &node_index)?;

    let mut services = Vec::new();
    let mut instance_names = BTreeSet::new();
    for (si, s) in doc.services.iter().enumerate() {
        let at = format!("services[{si}]");
        let mut settings = Vec::new();
        for (k, v) in &s.settings {
            let v =
                scalar(v).ok_or_else(|| invalid(format!("{at}.settings.{k}: expected a value")))?;
            settings.push((k.clone(), v));
        }
        let (parsed, errors) =
            ServiceSettings::from_pairs(settings.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        if let Some(e) = errors.first() {
            return Err(invalid(format!("{at}.settings: {e}")));
        }
        let mut instances = Vec::new();
        for (ii, inst) in s.instances.iter().enumerate() {
            let what = format!("{at}.instances[{ii}]");
            let node = node_index(&what, &inst.node)?;
            let processing = processing(&format!("{what}.processing"), &inst.processing)?;
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
                    return Err(invalid(format!("{what}: duplicate instance name {name:?}")));
                }
                instances.push(InstanceSpec {
                    name,
                    node,
                    processing,
                    workers: inst.workers.map(|w| w.max(1)),
                    start: inst.start.unwrap_or(true),
                });
            }
        }
        services.push(ServiceSpecDoc {
            name: s.name.clone(),
            namespace: s.namespace.clone().unwrap_or_else(|| "default".to_string()),
            settings,
            slo: parsed.latency_slo,
            instances,
        });
    }
    if services.is_empty() {
        return Err(invalid("services: at least one service is needed"));
    }

    let mut clients = Vec::new();
    for (ci, c) in doc.clients.iter().enumerate() {
        let what = format!("clients[{ci}]");
        let node = node_index(&what, &c.node)?;
        let service = services
            .iter()
            .position(|s| s.name == c.service)
            .ok_or_else(|| invalid(format!("{what}: no service {:?}", c.service)))?;
        let duration = c
            .duration
            .as_deref()
            .map(|d| duration(&format!("{what}.duration"), d))
            .transpose()?;
        if c.requests.is_none() && duration.is_none() {
            return Err(invalid(format!("{what}: give `requests` or `duration`")));
        }
        if let Some(rate) = c.rate {
            if !(rate.is_finite() && rate > 0.0) {
                return Err(invalid(format!(
                    "{what}.rate: expected requests per second > 0"
                )));
            }
        }
        let method = c
            .method
            .as_deref()
            .unwrap_or(if c.body.is_some() { "POST" } else { "GET" })
            .parse::<http::Method>()
            .map_err(|_| invalid(format!("{what}.method: not an HTTP method")))?;
        let path = c.path.clone().unwrap_or_else(|| "/".to_string());
        if !path.starts_with('/') {
            return Err(invalid(format!("{what}.path: must start with /")));
        }
        clients.push(ClientSpec {
            name: c
                .name
                .clone()
                .unwrap_or_else(|| format!("client-{}", c.node)),
            node,
            latency: opt_duration(&format!("{what}.latency"), &c.latency, Duration::ZERO)?,
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
            // Filled in from `testbed.client-timeout` below when not given.
            timeout: opt_duration(&format!("{what}.timeout"), &c.timeout, Duration::ZERO)?,
        });
    }
    if clients.is_empty() {
        return Err(invalid("clients: at least one client is needed"));
    }
    let mut client_names = BTreeSet::new();
    for c in &clients {
        if !client_names.insert(c.name.clone()) {
            return Err(invalid(format!("clients: duplicate name {:?}", c.name)));
        }
    }

    let all_instances: Vec<&InstanceSpec> = services.iter().flat_map(|s| &s.instances).collect();
    let instance = |what: &str, name: &str| -> Result<String, ScenarioError> {
        all_instances
            .iter()
            .any(|i| i.name == name)
            .then(|| name.to_string())
            .ok_or_else(|| invalid(format!("{what}: no instance {name:?}")))
    };
    let mut events = Vec::new();
    for (ei, e) in doc.events.iter().enumerate() {
        let what = format!("events[{ei}]");
        let at = match &e.at {
            Value::Number(n) => Trigger::Requests(
                n.as_u64()
                    .ok_or_else(|| invalid(format!("{what}.at: a request count or a duration")))?,
            ),
            Value::String(s) => Trigger::Time(duration(&format!("{what}.at"), s)?),
            _ => return Err(invalid(format!("{what}.at: a request count or a duration"))),
        };
        let mut actions = Vec::new();
        for (ai, a) in e.actions.iter().enumerate() {
            let what = format!("{what}.do[{ai}]");
            let mut found = Vec::new();
            if let Some(name) = &a.join {
                found.push(Action::Join(instance(&what, name)?));
            }
            if let Some(name) = &a.leave {
                found.push(Action::Leave(instance(&what, name)?));
            }
            if let Some(fail) = &a.fail {
                let (name, after) = match fail {
                    FailDoc::Name(n) => (n.clone(), None),
                    FailDoc::Full(f) => (f.instance.clone(), f.remove_after.clone()),
                };
                found.push(Action::Fail {
                    instance: instance(&what, &name)?,
                    remove_after: opt_duration(&what, &after, Duration::from_secs(1))?,
                });
            }
            if let Some(o) = &a.overload {
                found.push(Action::Overload {
                    instance: instance(&what, &o.instance)?,
                    add: opt_duration(&format!("{what}.overload.add"), &o.add, Duration::ZERO)?,
                    processing: match &o.processing {
                        Some(_) => Some(processing(
                            &format!("{what}.overload.processing"),
                            &o.processing,
                        )?),
                        None => None,
                    },
                });
            }
            if let Some(l) = &a.link {
                let from = node_index(&what, &l.between[0])?;
                let to = match l.between[1].as_str() {
                    "*" => None,
                    other => Some(node_index(&what, other)?),
                };
                let change = match (&l.add, &l.delay) {
                    (Some(add), None) => {
                        LinkChange::Add(duration(&format!("{what}.link.add"), add)?)
                    }
                    (None, Some(d)) => LinkChange::Set(duration(&format!("{what}.link.delay"), d)?),
                    _ => {
                        return Err(invalid(format!(
                            "{what}.link: give either `add` or `delay`"
                        )))
                    }
                };
                found.push(Action::Link { from, to, change });
            }
            if let Some(u) = &a.usage {
                let node = node_index(&what, &u.node)?;
                if nodes[node].usage.is_none() {
                    return Err(invalid(format!(
                        "{what}.usage: node {:?} does not report usage (give it `usage` or `cores`)",
                        u.node
                    )));
                }
                found.push(Action::Usage {
                    node,
                    cpu: u.cpu.map(|c| fraction(&what, c)).transpose()?,
                    ram: u.ram.map(|r| fraction(&what, r)).transpose()?,
                });
            }
            if found.len() != 1 {
                return Err(invalid(format!(
                    "{what}: each entry is exactly one of join, leave, fail, overload, link, usage"
                )));
            }
            actions.extend(found);
        }
        events.push(EventSpec {
            name: e.name.clone().unwrap_or_else(|| format!("T{}", ei + 1)),
            at,
            actions,
        });
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
        return Err(invalid(
            "events: request-count triggers must be in increasing order",
        ));
    }

    let mut strategies = Vec::new();
    for s in &doc.strategies {
        strategies.push(match s {
            StrategyDoc::Spec(spec) => StrategySpec::parse(spec)?,
            StrategyDoc::Labelled { label, spec } => StrategySpec::parse(spec)?.labelled(label),
        });
    }

    let d = TestbedSettings::default();
    let t = &doc.testbed;
    let testbed = TestbedSettings {
        discovery_interval: opt_duration(
            "testbed.discovery-interval",
            &t.discovery_interval,
            d.discovery_interval,
        )?,
        peer_probe_interval: opt_duration(
            "testbed.peer-probe-interval",
            &t.peer_probe_interval,
            d.peer_probe_interval,
        )?,
        usage_interval: opt_duration(
            "testbed.usage-interval",
            &t.usage_interval,
            d.usage_interval,
        )?,
        usage_window: opt_duration("testbed.usage-window", &t.usage_window, d.usage_window)?,
        warmup_timeout: opt_duration(
            "testbed.warmup-timeout",
            &t.warmup_timeout,
            d.warmup_timeout,
        )?,
        drain: opt_duration("testbed.drain", &t.drain, d.drain)?,
        client_timeout: opt_duration(
            "testbed.client-timeout",
            &t.client_timeout,
            d.client_timeout,
        )?,
    };
    if testbed.client_timeout.is_zero() {
        return Err(invalid("testbed.client-timeout: must be greater than zero"));
    }
    for (client, doc) in clients.iter_mut().zip(&doc.clients) {
        if doc.timeout.is_none() {
            client.timeout = testbed.client_timeout;
        } else if client.timeout.is_zero() {
            return Err(invalid(format!(
                "clients {:?}: timeout must be greater than zero",
                client.name
            )));
        }
    }
    if testbed.discovery_interval.is_zero()
        || testbed.peer_probe_interval.is_zero()
        || testbed.usage_interval.is_zero()
    {
        return Err(invalid("testbed: intervals must be greater than zero"));
    }

    Ok(Scenario {
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
    })
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
                from: 0,
                to: None,
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
    fn mistakes_are_reported_with_where_they_are() {
        for (from, to, expected) in [
            (
                "node: a, processing",
                "node: zz, processing",
                "no node \"zz\"",
            ),
            ("requests: 10", "path: /x", "give `requests` or `duration`"),
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
}
