//! The topology file's schema and its translation into the core model.
//!
//! Deserialization (serde, `deny_unknown_fields`) catches syntax, unknown fields and
//! wrong types with serde_yaml's own positions. [`Document::into_topology`] then checks
//! what types cannot say (addresses, names, duplicates, setting values) and reports each
//! problem with the path of the offending value; the caller turns paths into lines.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::net::{IpAddr, SocketAddr};

use proxima_core::{
    Conditions, Endpoint, EndpointPort, Hints, Node, ServiceKey, ServicePort, ServiceSettings,
    ServiceSpec, TrafficPolicy,
};
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::Deserialize;

use super::locate::YamlPath;
use super::Topology;

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
    name: String,
    zone: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, Scalar>,
    #[serde(default)]
    addresses: Vec<IpAddr>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct ServiceDoc {
    name: String,
    namespace: Option<String>,
    #[serde(default)]
    ports: Vec<PortDoc>,
    #[serde(default)]
    settings: Settings,
    /// As `spec.trafficDistribution` of a Service (`PreferClose`, ...).
    traffic_distribution: Option<String>,
    /// As `spec.internalTrafficPolicy`: `Cluster` (default) or `Local`.
    internal_traffic_policy: Option<String>,
    #[serde(default)]
    endpoints: Vec<EndpointDoc>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PortDoc {
    #[serde(default)]
    name: String,
    port: u16,
    /// What the port speaks, as Kubernetes' `appProtocol` says it (`kubernetes.io/h2c`,
    /// `grpc`, `ws`, ...); without it the name decides (see `proxima_core::port_protocol`).
    protocol: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct EndpointDoc {
    id: Option<String>,
    address: String,
    #[serde(default)]
    ports: Vec<PortDoc>,
    node: Option<String>,
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
#[derive(Debug, Default)]
struct Settings(Vec<(String, String)>);

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
                let mut pairs: Vec<(String, String)> = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    let Scalar(value) = map.next_value()?;
                    if pairs.iter().any(|(k, _)| *k == key) {
                        return Err(de::Error::custom(format!("duplicate setting `{key}`")));
                    }
                    pairs.push((key, value));
                }
                Ok(Settings(pairs))
            }
        }
        d.deserialize_any(SettingsVisitor)
    }
}

/// A problem found after deserialization, at a path in the document.
#[derive(Debug)]
pub struct PathProblem {
    pub path: YamlPath,
    pub message: String,
}

/// Collects problems while the document is translated.
#[derive(Default)]
struct Problems(Vec<PathProblem>);

impl Problems {
    fn add(&mut self, path: YamlPath, message: impl Into<String>) {
        self.0.push(PathProblem {
            path,
            message: message.into(),
        });
    }
}

/// Kubernetes object names as used in `name.namespace`: a DNS label.
fn check_dns_label(problems: &mut Problems, path: YamlPath, value: &str) {
    if !proxima_core::is_dns_label(value) {
        problems.add(
            path,
            format!(
                "invalid name {value:?}: expected a DNS label (lowercase letters, digits and '-', \
                 at most 63 characters, not starting or ending with '-')"
            ),
        );
    }
}

fn check_text(problems: &mut Problems, path: YamlPath, what: &str, value: &str) {
    if value.is_empty() || value.chars().any(char::is_whitespace) {
        problems.add(
            path,
            format!("invalid {what} {value:?}: expected a non-empty word without spaces"),
        );
    }
}

/// A port as read: name, number, protocol.
type PortRead = (String, u16, Option<String>);

fn ports(problems: &mut Problems, path: YamlPath, docs: &[PortDoc]) -> Vec<PortRead> {
    let mut seen = BTreeSet::new();
    for (i, p) in docs.iter().enumerate() {
        if p.port == 0 {
            problems.add(
                path.index(i).key("port"),
                "invalid port 0: expected 1 to 65535",
            );
        }
        if !seen.insert(p.name.as_str()) {
            let what = if p.name.is_empty() {
                "more than one unnamed port: name them".to_string()
            } else {
                format!("duplicate port name {:?}", p.name)
            };
            problems.add(path.index(i).key("name"), what);
        }
    }
    docs.iter()
        .map(|p| (p.name.clone(), p.port, p.protocol.clone()))
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
            check_text(&mut problems, path.key("name"), "node name", &doc.name);
            if nodes.iter().any(|n| n.name == doc.name) {
                problems.add(path.key("name"), format!("duplicate node {:?}", doc.name));
            }
            nodes.push(Node {
                name: doc.name,
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
            let namespace = doc
                .namespace
                .unwrap_or_else(|| ServiceKey::DEFAULT_NAMESPACE.to_string());
            check_dns_label(&mut problems, path.key("name"), &doc.name);
            check_dns_label(&mut problems, path.key("namespace"), &namespace);
            let key = ServiceKey::new(namespace, doc.name);
            if services.iter().any(|(s, _)| s.key == key) {
                problems.add(path.key("name"), format!("duplicate service {key}"));
            }
            let service_ports = ports(&mut problems, path.key("ports"), &doc.ports);
            let settings = settings(&mut problems, path.key("settings"), &doc.settings);
            let traffic = traffic(
                &mut problems,
                &path,
                doc.traffic_distribution,
                doc.internal_traffic_policy,
            );

            let mut endpoints: Vec<Endpoint> = Vec::with_capacity(doc.endpoints.len());
            for (j, ep) in doc.endpoints.into_iter().enumerate() {
                let path = path.key("endpoints").index(j);
                let Some(endpoint) = endpoint(&mut problems, &path, ep, &node_zones) else {
                    continue;
                };
                if endpoints.iter().any(|e| e.id == endpoint.id) {
                    // Points at `id`, or at the endpoint when its id is its address.
                    problems.add(
                        path.key("id"),
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
fn settings(problems: &mut Problems, path: YamlPath, pairs: &Settings) -> ServiceSettings {
    let (settings, errors) =
        ServiceSettings::from_pairs(pairs.0.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    for e in errors {
        // The shared parser reports a key it does not know (a typo such as
        // `latency-sloo`) like a bad value; in a file, say what it is.
        let message = if e.expected.starts_with("a known key") {
            format!("unknown setting `{}`: expected {}", e.key, e.expected)
        } else {
            format!("invalid value {:?}: expected {}", e.value, e.expected)
        };
        problems.add(path.key(&e.key), message);
    }
    let prefix = format!("{}-", settings.strategy);
    for key in settings.params.keys() {
        if !key.starts_with(&prefix) {
            problems.add(
                path.key(key),
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
    internal_policy: Option<String>,
) -> TrafficPolicy {
    let internal_local = match internal_policy.as_deref() {
        None | Some("Cluster") => false,
        Some("Local") => true,
        Some(other) => {
            problems.add(
                path.key("internal-traffic-policy"),
                format!("invalid value {other:?}: expected Cluster or Local"),
            );
            false
        }
    };
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
    let (ip, ports) = if let Ok(addr) = doc.address.parse::<SocketAddr>() {
        if !doc.ports.is_empty() {
            problems.add(
                path.key("ports"),
                "the address already has a port: give either `address: ip:port` or \
                 `address: ip` with `ports`",
            );
        }
        if addr.port() == 0 {
            problems.add(path.key("address"), "invalid port 0: expected 1 to 65535");
        }
        (addr.ip(), vec![(String::new(), addr.port(), None)])
    } else if let Ok(ip) = doc.address.parse::<IpAddr>() {
        if doc.ports.is_empty() {
            problems.add(
                path.key("address"),
                format!(
                    "address {:?} has no port: write `ip:port` or add `ports: [{{ name, port }}]`",
                    doc.address
                ),
            );
        }
        (ip, ports(problems, path.key("ports"), &doc.ports))
    } else {
        problems.add(
            path.key("address"),
            format!(
                "invalid address {:?}: expected ip:port (e.g. 10.0.0.7:8080 or [fd00::7]:8080) or an ip",
                doc.address
            ),
        );
        return None;
    };

    let id = doc.id.unwrap_or_else(|| doc.address.clone());
    check_text(problems, path.key("id"), "endpoint id", &id);
    let mut zone = doc.zone;
    if let Some(node) = &doc.node {
        match node_zones.get(node.as_str()) {
            // Kubernetes copies the node's zone into the EndpointSlice; do the same.
            Some(node_zone) => zone = zone.or(node_zone.map(str::to_string)),
            None if !node_zones.is_empty() => {
                let mut known: Vec<&str> = node_zones.keys().copied().collect();
                known.sort_unstable();
                problems.add(
                    path.key("node"),
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
        node: doc.node,
        zone,
        conditions,
        hints: Hints {
            for_zones: doc.hints.for_zones,
            for_nodes: doc.hints.for_nodes,
        },
    })
}
