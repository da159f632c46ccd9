//! The topology file's schema and its translation into the core model.
//!
//! Deserialization (serde, `deny_unknown_fields`) catches syntax, unknown fields and
//! wrong types with serde-saphyr's own positions. [`Document::into_topology`] then checks
//! what types cannot say (addresses, names, duplicates, setting values) and reports each
//! problem with the path of the offending value and its line: the values checked there
//! are read [`Spanned`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::net::{IpAddr, SocketAddr};

use proxima_core::{
    Conditions, Endpoint, EndpointPort, Hints, Node, ServiceKey, ServicePort, ServiceSettings,
    ServiceSpec, TrafficPolicy,
};
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::Deserialize;
use serde_saphyr::{Location, Spanned};

use super::Topology;
use crate::yaml::Path as YamlPath;

/// The whole file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Document {
    #[serde(default)]
    nodes: Vec<NodeDoc>,
    #[serde(default)]
    services: Vec<ServiceDoc>,
    /// Backends for `proxima demo` to emulate; not discovery's business.
    #[serde(default)]
    #[allow(dead_code)]
    emulate: Option<IgnoredAny>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeDoc {
    name: Spanned<String>,
    zone: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, Scalar>,
    #[serde(default)]
    addresses: Vec<IpAddr>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct ServiceDoc {
    name: Spanned<String>,
    namespace: Option<Spanned<String>>,
    #[serde(default)]
    ports: Vec<PortDoc>,
    settings: Option<Spanned<Settings>>,
    /// As `spec.trafficDistribution` of a Service (`PreferClose`, ...).
    traffic_distribution: Option<String>,
    /// As `spec.internalTrafficPolicy`: `Cluster` (default) or `Local`.
    internal_traffic_policy: Option<Spanned<String>>,
    #[serde(default)]
    endpoints: Vec<EndpointDoc>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PortDoc {
    name: Option<Spanned<String>>,
    port: Spanned<u16>,
    /// What the port speaks, as Kubernetes' `appProtocol` says it (`kubernetes.io/h2c`,
    /// `grpc`, `ws`, ...); without it the name decides (see `proxima_core::port_protocol`).
    protocol: Option<String>,
}

impl PortDoc {
    fn name(&self) -> &str {
        self.name.as_ref().map_or("", |n| n.value.as_str())
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct EndpointDoc {
    id: Option<Spanned<String>>,
    address: Spanned<String>,
    ports: Option<Spanned<Vec<PortDoc>>>,
    node: Option<Spanned<String>>,
    zone: Option<String>,
    ready: Option<bool>,
    serving: Option<bool>,
    terminating: Option<bool>,
    #[serde(default)]
    hints: HintsDoc,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct HintsDoc {
    #[serde(default)]
    for_zones: Vec<String>,
    #[serde(default)]
    for_nodes: Vec<String>,
}

/// A scalar YAML value as text: `95`, `2s` and `true` are all settings values.
#[derive(Debug)]
struct Scalar(String);

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ScalarVisitor;
        impl Visitor<'_> for ScalarVisitor {
            type Value = Scalar;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string, number or boolean")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
        }
        d.deserialize_any(ScalarVisitor)
    }
}

/// `settings:` in file order, so problems are reported in the order they were written.
/// (A key written twice is a YAML error, found by serde-saphyr.)
#[derive(Debug, Default)]
struct Settings(Vec<(String, Spanned<Scalar>)>);

impl<'de> Deserialize<'de> for Settings {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct SettingsVisitor;
        impl<'de> Visitor<'de> for SettingsVisitor {
            type Value = Settings;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a mapping of setting keys to values, e.g. { latency-slo: 80ms }")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Settings, E> {
                Ok(Settings::default())
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Settings, A::Error> {
                let mut pairs = Vec::new();
                while let Some(entry) = map.next_entry()? {
                    pairs.push(entry);
                }
                Ok(Settings(pairs))
            }
        }
        d.deserialize_any(SettingsVisitor)
    }
}

/// A problem found after deserialization: the path of the offending value and its line.
#[derive(Debug)]
pub struct PathProblem {
    pub path: String,
    pub line: Option<usize>,
    pub message: String,
}

/// Collects problems while the document is translated.
#[derive(Default)]
struct Problems(Vec<PathProblem>);

impl Problems {
    /// A problem with the value at `path`, written at `at` (where it is used, for a value
    /// that an alias repeats).
    fn add(&mut self, path: YamlPath, at: Location, message: impl Into<String>) {
        self.0.push(PathProblem {
            path: path.into(),
            line: usize::try_from(at.line()).ok().filter(|&line| line > 0),
            message: message.into(),
        });
    }
}

/// Kubernetes object names as used in `name.namespace`: a DNS label.
fn check_dns_label(problems: &mut Problems, path: YamlPath, value: &Spanned<String>) {
    let (at, value) = (value.referenced, &value.value);
    if !proxima_core::is_dns_label(value) {
        problems.add(
            path,
            at,
            format!(
                "invalid name {value:?}: expected a DNS label (lowercase letters, digits and '-', \
                 at most 63 characters, not starting or ending with '-')"
            ),
        );
    }
}

fn check_text(problems: &mut Problems, path: YamlPath, at: Location, what: &str, value: &str) {
    if value.is_empty() || value.chars().any(char::is_whitespace) {
        problems.add(
            path,
            at,
            format!("invalid {what} {value:?}: expected a non-empty word without spaces"),
        );
    }
}

/// A port as read: name, number, protocol.
type PortRead = (String, u16, Option<String>);

fn ports(problems: &mut Problems, path: YamlPath, docs: &[PortDoc]) -> Vec<PortRead> {
    let mut seen = BTreeSet::new();
    for (i, p) in docs.iter().enumerate() {
        if p.port.value == 0 {
            problems.add(
                path.index(i).key("port"),
                p.port.referenced,
                "invalid port 0: expected 1 to 65535",
            );
        }
        if !seen.insert(p.name()) {
            let (what, at) = match &p.name {
                None => (
                    "more than one unnamed port: name them".to_string(),
                    p.port.referenced,
                ),
                Some(n) => (format!("duplicate port name {:?}", n.value), n.referenced),
            };
            problems.add(path.index(i).key("name"), at, what);
        }
    }
    docs.iter()
        .map(|p| (p.name().to_string(), p.port.value, p.protocol.clone()))
        .collect()
}

impl Document {
    /// Translate into the core model, or return every problem found.
    pub fn into_topology(self) -> Result<Topology, Vec<PathProblem>> {
        let mut problems = Problems::default();
        let root = YamlPath::default();

        let mut nodes: Vec<Node> = Vec::with_capacity(self.nodes.len());
        for (i, doc) in self.nodes.into_iter().enumerate() {
            let path = root.key("nodes").index(i);
            let (at, name) = (doc.name.referenced, doc.name.value);
            check_text(&mut problems, path.key("name"), at, "node name", &name);
            if nodes.iter().any(|n| n.name == name) {
                problems.add(path.key("name"), at, format!("duplicate node {name:?}"));
            }
            nodes.push(Node {
                name,
                zone: doc.zone,
                labels: doc.labels.into_iter().map(|(k, v)| (k, v.0)).collect(),
                addresses: doc.addresses,
            });
        }
        let node_zones: HashMap<&str, Option<&str>> = nodes
            .iter()
            .map(|n| (n.name.as_str(), n.zone.as_deref()))
            .collect();

        let mut services: Vec<(ServiceSpec, Vec<Endpoint>)> =
            Vec::with_capacity(self.services.len());
        for (i, doc) in self.services.into_iter().enumerate() {
            let path = root.key("services").index(i);
            check_dns_label(&mut problems, path.key("name"), &doc.name);
            if let Some(namespace) = &doc.namespace {
                check_dns_label(&mut problems, path.key("namespace"), namespace);
            }
            let namespace = doc
                .namespace
                .map_or_else(|| ServiceKey::DEFAULT_NAMESPACE.to_string(), |n| n.value);
            let key = ServiceKey::new(namespace, doc.name.value);
            if services.iter().any(|(s, _)| s.key == key) {
                problems.add(
                    path.key("name"),
                    doc.name.referenced,
                    format!("duplicate service {key}"),
                );
            }
            let service_ports = ports(&mut problems, path.key("ports"), &doc.ports);
            let settings = match &doc.settings {
                Some(pairs) => settings(&mut problems, path.key("settings"), pairs),
                None => ServiceSettings::default(),
            };
            let traffic = traffic(
                &mut problems,
                &path,
                doc.traffic_distribution,
                doc.internal_traffic_policy,
            );

            let mut endpoints: Vec<Endpoint> = Vec::with_capacity(doc.endpoints.len());
            for (j, ep) in doc.endpoints.into_iter().enumerate() {
                let path = path.key("endpoints").index(j);
                // At `id`, or at the address when the id is the address.
                let id_at = ep.id.as_ref().unwrap_or(&ep.address).referenced;
                let Some(endpoint) = endpoint(&mut problems, &path, ep, &node_zones) else {
                    continue;
                };
                if endpoints.iter().any(|e| e.id == endpoint.id) {
                    problems.add(
                        path.key("id"),
                        id_at,
                        format!("duplicate endpoint id {:?} in service {key}", endpoint.id),
                    );
                }
                endpoints.push(endpoint);
            }

            let spec = ServiceSpec {
                key,
                ports: service_ports
                    .into_iter()
                    .map(|(name, port, app_protocol)| ServicePort {
                        name,
                        port,
                        app_protocol,
                    })
                    .collect(),
                settings,
                traffic,
            };
            services.push((spec, endpoints));
        }

        if problems.0.is_empty() {
            Ok(Topology { nodes, services })
        } else {
            Err(problems.0)
        }
    }
}

/// Settings go through the one parser shared with Service annotations. A file is
/// checked strictly: an invalid value rejects the file instead of falling back to the
/// default, and a `<strategy>-<param>` key for a strategy other than the service's is
/// taken for a typo (`latency-sloo`) rather than silently ignored.
fn settings(problems: &mut Problems, path: YamlPath, pairs: &Spanned<Settings>) -> ServiceSettings {
    let (settings, errors) = ServiceSettings::from_pairs(
        pairs
            .value
            .0
            .iter()
            .map(|(k, v)| (k.as_str(), v.value.0.as_str())),
    );
    // The line of a key's value; a key rejected for its relation to another may not be
    // in the file (qos-pool-min-samples past the window): then the mapping's.
    let at = |key: &str| {
        pairs
            .value
            .0
            .iter()
            .find(|(k, _)| k == key)
            .map_or(pairs.referenced, |(_, v)| v.referenced)
    };
    for e in errors {
        // The shared parser reports a key it does not know (a typo such as
        // `latency-sloo`) like a bad value; in a file, say what it is.
        let message = if e.expected.starts_with("a known key") {
            format!("unknown setting `{}`: expected {}", e.key, e.expected)
        } else {
            format!("invalid value {:?}: expected {}", e.value, e.expected)
        };
        problems.add(path.key(&e.key), at(&e.key), message);
    }
    let prefix = format!("{}-", settings.strategy);
    for key in settings.params.keys() {
        if !key.starts_with(&prefix) {
            problems.add(
                path.key(key),
                at(key),
                format!(
                    "unknown setting `{key}`: known keys are latency-slo, slo-percentile, \
                     strategy, timeout, connect-timeout, retries and qos-pool-*; parameters of \
                     strategy `{}` start with `{prefix}`",
                    settings.strategy
                ),
            );
        }
    }
    settings
}

fn traffic(
    problems: &mut Problems,
    path: &YamlPath,
    distribution: Option<String>,
    internal_policy: Option<Spanned<String>>,
) -> TrafficPolicy {
    let internal_local = internal_policy.is_some_and(|policy| match policy.value.as_str() {
        "Cluster" => false,
        "Local" => true,
        other => {
            problems.add(
                path.key("internal-traffic-policy"),
                policy.referenced,
                format!("invalid value {other:?}: expected Cluster or Local"),
            );
            false
        }
    });
    TrafficPolicy {
        traffic_distribution: distribution,
        internal_local,
    }
}

fn endpoint(
    problems: &mut Problems,
    path: &YamlPath,
    doc: EndpointDoc,
    node_zones: &HashMap<&str, Option<&str>>,
) -> Option<Endpoint> {
    let before = problems.0.len();
    let (address_at, address) = (doc.address.referenced, doc.address.value);
    let port_docs = doc.ports.as_ref().map_or(&[][..], |p| &p.value);
    let (ip, ports) = if let Ok(addr) = address.parse::<SocketAddr>() {
        if let Some(port_docs) = doc.ports.as_ref().filter(|p| !p.value.is_empty()) {
            problems.add(
                path.key("ports"),
                port_docs.referenced,
                "the address already has a port: give either `address: ip:port` or \
                 `address: ip` with `ports`",
            );
        }
        if addr.port() == 0 {
            problems.add(
                path.key("address"),
                address_at,
                "invalid port 0: expected 1 to 65535",
            );
        }
        (addr.ip(), vec![(String::new(), addr.port(), None)])
    } else if let Ok(ip) = address.parse::<IpAddr>() {
        if port_docs.is_empty() {
            problems.add(
                path.key("address"),
                address_at,
                format!(
                    "address {address:?} has no port: write `ip:port` or add `ports: [{{ name, port }}]`"
                ),
            );
        }
        (ip, ports(problems, path.key("ports"), port_docs))
    } else {
        problems.add(
            path.key("address"),
            address_at,
            format!(
                "invalid address {address:?}: expected ip:port (e.g. 10.0.0.7:8080 or [fd00::7]:8080) or an ip"
            ),
        );
        return None;
    };

    let (id_at, id) = doc
        .id
        .map_or((address_at, address), |id| (id.referenced, id.value));
    check_text(problems, path.key("id"), id_at, "endpoint id", &id);
    let mut zone = doc.zone;
    if let Some(Spanned {
        value: node,
        referenced: node_at,
        ..
    }) = &doc.node
    {
        match node_zones.get(node.as_str()) {
            // Kubernetes copies the node's zone into the EndpointSlice; do the same.
            Some(node_zone) => zone = zone.or(node_zone.map(str::to_string)),
            None if !node_zones.is_empty() => {
                let mut known: Vec<&str> = node_zones.keys().copied().collect();
                known.sort_unstable();
                problems.add(
                    path.key("node"),
                    *node_at,
                    format!(
                        "unknown node {node:?}: the file's nodes are {}",
                        known.join(", ")
                    ),
                );
            }
            None => {}
        }
    }
    let ready = doc.ready.unwrap_or(true);
    let conditions = Conditions {
        ready,
        // As kube-proxy reads the EndpointSlice API: an unset `serving` means serving
        // (it does not follow `ready`).
        serving: doc.serving.unwrap_or(true),
        terminating: doc.terminating.unwrap_or(false),
    };
    (problems.0.len() == before).then(|| Endpoint {
        id,
        ip,
        ports: ports
            .into_iter()
            .map(|(name, port, app_protocol)| EndpointPort {
                name,
                port,
                app_protocol,
            })
            .collect(),
        node: doc.node.map(|n| n.value),
        zone,
        conditions,
        hints: Hints {
            for_zones: doc.hints.for_zones.into(),
            for_nodes: doc.hints.for_nodes.into(),
        },
    })
}
