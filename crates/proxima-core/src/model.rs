//! The cluster as the router sees it: services, their endpoints (pods) and nodes.
//!
//! These types are what discovery sources (a YAML file, Kubernetes watches) produce and
//! what the [`Router`](crate::Router) consumes through [`Update`]s. They carry no
//! measurement state: that lives in [`EndpointState`](crate::EndpointState) and survives
//! updates that keep an endpoint's identity.

use std::collections::BTreeMap;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::net::{IpAddr, SocketAddr};

use serde::Serialize;

use crate::settings::ServiceSettings;

/// `namespace/name` of a Service.
// `PartialEq` by hand (the same equality as derived): every pick compares the key it
// looks up with the table's; see `same_bytes`. `Hash` by hand with it, as derived.
#[derive(Clone, Debug, Eq, PartialOrd, Ord, Serialize)]
pub struct ServiceKey {
    /// The Service's namespace.
    pub namespace: String,
    /// The Service's name within its namespace.
    pub name: String,
}

impl ServiceKey {
    /// Namespace of a service named without one: in topology and scenario files, in the
    /// demo, and (as `--default-namespace`'s default) in client requests. Kubernetes'
    /// own default, so that the same names work with and without a cluster.
    pub const DEFAULT_NAMESPACE: &'static str = "default";

    /// The key of Service `name` in `namespace`.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl Hash for ServiceKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.namespace.hash(state);
        self.name.hash(state);
    }
}

impl PartialEq for ServiceKey {
    #[inline]
    fn eq(&self, other: &Self) -> bool {
        same_bytes(self.name.as_bytes(), other.name.as_bytes())
            && same_bytes(self.namespace.as_bytes(), other.namespace.as_bytes())
    }
}

/// `a == b`, without a call into libc's `memcmp` for up to 16 bytes (most Service names
/// and namespaces): two loads of each side that together cover every byte (they may
/// overlap). Longer ones compare as slices.
#[inline]
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    fn word(s: &[u8], at: usize) -> u64 {
        let mut w = [0; 8];
        w.copy_from_slice(&s[at..at + 8]);
        u64::from_ne_bytes(w)
    }
    fn half(s: &[u8], at: usize) -> u32 {
        let mut w = [0; 4];
        w.copy_from_slice(&s[at..at + 4]);
        u32::from_ne_bytes(w)
    }
    let n = a.len();
    if n != b.len() {
        return false;
    }
    match n {
        0 => true,
        1..=3 => a[0] == b[0] && a[n / 2] == b[n / 2] && a[n - 1] == b[n - 1],
        4..=7 => half(a, 0) == half(b, 0) && half(a, n - 4) == half(b, n - 4),
        8..=16 => word(a, 0) == word(b, 0) && word(a, n - 8) == word(b, n - 8),
        _ => a == b,
    }
}

/// Whether `name` is an RFC 1123 DNS label, the form of Kubernetes namespace, Service
/// and Node names: 1 to 63 lower-case letters, digits and `-`, not starting or ending
/// with `-`. Files and flags that name Kubernetes objects check names with it, so that
/// what works without a cluster also works with one.
pub fn is_dns_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

impl fmt::Display for ServiceKey {
    /// `name.namespace`, the form clients use in `x-service`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.name, self.namespace)
    }
}

/// One port of a Service. Endpoint ports are matched to it by `name`, as EndpointSlices do.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ServicePort {
    /// Port name; empty for the single unnamed port of a Service.
    pub name: String,
    /// The Service's own port number (what `name:80` refers to).
    pub port: u16,
    /// `appProtocol` (Kubernetes) or `protocol` (topology file), as written.
    pub app_protocol: Option<String>,
}

/// What kube-proxy's topology rules need to know about a Service (used by the
/// `kube-proxy` strategy; the others ignore it).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TrafficPolicy {
    /// `spec.trafficDistribution`, e.g. `PreferClose`, `PreferSameZone`, `PreferSameNode`.
    pub traffic_distribution: Option<String>,
    /// `spec.internalTrafficPolicy == Local`.
    pub internal_local: bool,
}

/// A Service: identity, ports and the operator's routing settings.
#[derive(Clone, Debug, PartialEq)]
pub struct ServiceSpec {
    /// Namespace and name: the service's identity.
    pub key: ServiceKey,
    /// The Service's ports; endpoint ports are matched to them by name.
    pub ports: Vec<ServicePort>,
    /// The `proxima.io/` settings (annotations or the topology file's `settings`).
    pub settings: ServiceSettings,
    /// kube-proxy's topology fields, for the `kube-proxy` strategy.
    pub traffic: TrafficPolicy,
}

impl ServiceSpec {
    /// A service with these ports and settings and no traffic policy.
    pub fn new(key: ServiceKey, ports: Vec<ServicePort>, settings: ServiceSettings) -> Self {
        Self {
            key,
            ports,
            settings,
            traffic: TrafficPolicy::default(),
        }
    }
}

/// EndpointSlice conditions, with the API's meaning: `ready` pods take new traffic;
/// `serving` but `terminating` pods may finish work and are used only when no pod is ready.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Conditions {
    /// May take new traffic.
    pub ready: bool,
    /// May answer requests (true for ready pods and, while they drain, terminating ones).
    pub serving: bool,
    /// Being deleted: used only when no endpoint is ready.
    pub terminating: bool,
}

impl Default for Conditions {
    fn default() -> Self {
        Self {
            ready: true,
            serving: true,
            terminating: false,
        }
    }
}

/// A named port of an endpoint; `name` matches a [`ServicePort::name`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct EndpointPort {
    /// Port name; empty for an unnamed port.
    pub name: String,
    /// Port number on the endpoint's IP.
    pub port: u16,
    /// The EndpointSlice port's `appProtocol` (or the topology file's `protocol`).
    pub app_protocol: Option<String>,
}

/// What a pod port speaks (issue 28): the data plane sends HTTP/2 with prior knowledge
/// to `H2c` ports and HTTP/1.1 to the others; `/debug/pools` shows it and its source.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PortProtocol {
    /// HTTP/1.1 (the default).
    #[default]
    Http1,
    /// HTTP/2 with prior knowledge (cleartext): h2c and gRPC.
    H2c,
    /// HTTP/1.1 that is upgraded to WebSockets.
    WebSocket,
}

/// Where a port's [`PortProtocol`] was read, in order of precedence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProtocolSource {
    /// The endpoint port's `appProtocol`.
    EndpointAppProtocol,
    /// The Service port's `appProtocol`.
    ServiceAppProtocol,
    /// The port's name, by Istio's convention (`grpc`, `h2c`, `http2`, `ws`, alone or
    /// followed by `-suffix`).
    PortName,
    /// Nothing said otherwise: HTTP/1.1.
    Default,
}

/// The protocol of an endpoint port (see [`PortProtocol`]): the endpoint port's
/// `appProtocol`, else its Service port's, else the port's name, else HTTP/1.1. An
/// `appProtocol` that names no HTTP protocol the proxy knows (`https`, `tcp`, ...) is
/// HTTP/1.1, read from where it was written.
pub fn port_protocol(
    endpoint: &EndpointPort,
    service: Option<&ServicePort>,
) -> (PortProtocol, ProtocolSource) {
    if let Some(value) = &endpoint.app_protocol {
        return (
            from_app_protocol(value),
            ProtocolSource::EndpointAppProtocol,
        );
    }
    if let Some(value) = service.and_then(|s| s.app_protocol.as_ref()) {
        return (from_app_protocol(value), ProtocolSource::ServiceAppProtocol);
    }
    match from_port_name(&endpoint.name) {
        Some(protocol) => (protocol, ProtocolSource::PortName),
        None => (PortProtocol::Http1, ProtocolSource::Default),
    }
}

/// `appProtocol` values: Kubernetes' own (`kubernetes.io/h2c`, `kubernetes.io/ws`) and
/// those commonly written (`grpc`, `http2`, `h2c`, `ws`, `websocket`).
fn from_app_protocol(value: &str) -> PortProtocol {
    let value = value.trim().to_ascii_lowercase();
    match value.strip_prefix("kubernetes.io/").unwrap_or(&value) {
        "h2c" | "grpc" | "http2" | "grpc-web" => PortProtocol::H2c,
        "ws" | "websocket" => PortProtocol::WebSocket,
        _ => PortProtocol::Http1,
    }
}

/// Istio's port-name convention: `<protocol>` or `<protocol>-<suffix>`.
fn from_port_name(name: &str) -> Option<PortProtocol> {
    let name = name.to_ascii_lowercase();
    let protocol = name.split_once('-').map_or(name.as_str(), |(p, _)| p);
    match protocol {
        "grpc" | "h2c" | "http2" => Some(PortProtocol::H2c),
        "ws" => Some(PortProtocol::WebSocket),
        "http" => Some(PortProtocol::Http1),
        _ => None,
    }
}

/// EndpointSlice topology hints.
///
/// Boxed slices rather than `Vec`s: every endpoint carries its hints, nearly always
/// none, and two `Vec`s were 16 bytes more of every endpoint's record (issue 29).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Hints {
    /// Zones that should use this endpoint (`forZones`).
    pub for_zones: Box<[String]>,
    /// Nodes that should use this endpoint (`forNodes`).
    pub for_nodes: Box<[String]>,
}

/// Name of an endpoint within a service (pod name, or `ip` when unnamed): updates and
/// removals address endpoints by it. Measurements are kept per name *and* address, so a
/// pod keeps its history across updates that keep its IP, and a pod recreated under the
/// same name with a new IP starts fresh.
pub type EndpointId = String;

/// One pod (instance) of a service.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Endpoint {
    /// Name within the service; see [`EndpointId`].
    pub id: EndpointId,
    /// The pod's IP.
    pub ip: IpAddr,
    /// Its ports; see [`Endpoint::port`].
    pub ports: Vec<EndpointPort>,
    /// Node the pod runs on, if known.
    pub node: Option<String>,
    /// Zone of the pod (or of its node), if known.
    pub zone: Option<String>,
    /// EndpointSlice conditions.
    pub conditions: Conditions,
    /// EndpointSlice topology hints (for the `kube-proxy` strategy).
    pub hints: Hints,
}

impl Endpoint {
    /// An endpoint with a single unnamed port, ready and serving.
    pub fn new(id: impl Into<String>, addr: SocketAddr) -> Self {
        Self {
            id: id.into(),
            ip: addr.ip(),
            ports: vec![EndpointPort {
                name: String::new(),
                port: addr.port(),
                app_protocol: None,
            }],
            node: None,
            zone: None,
            conditions: Conditions::default(),
            hints: Hints::default(),
        }
    }

    /// The same endpoint, placed on `node`.
    pub fn on_node(mut self, node: impl Into<String>) -> Self {
        self.node = Some(node.into());
        self
    }

    /// The same endpoint with these conditions.
    pub fn with_conditions(mut self, conditions: Conditions) -> Self {
        self.conditions = conditions;
        self
    }

    /// The port carrying `port_name`. An endpoint whose only port is unnamed (a topology
    /// file's `address: ip:port`) serves every port name; otherwise an endpoint without
    /// the name is no candidate for it, as for kube-proxy, which builds its endpoints per
    /// service port (a pod that does not declare a Service's named targetPort is listed
    /// with its other ports only).
    pub fn port(&self, port_name: &str) -> Option<u16> {
        self.port_entry(port_name).map(|p| p.port)
    }

    /// The port carrying `port_name`, as [`Endpoint::port`] finds it, with its name and
    /// `appProtocol`.
    pub fn port_entry(&self, port_name: &str) -> Option<&EndpointPort> {
        self.ports
            .iter()
            .find(|p| p.name == port_name)
            .or(match self.ports.as_slice() {
                [only] if only.name.is_empty() => Some(only),
                _ => None,
            })
    }
}

/// A cluster node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Node {
    /// Node name.
    pub name: String,
    /// Zone (`topology.kubernetes.io/zone`), if known.
    pub zone: Option<String>,
    /// The node's labels (`proxima.io/admin-port` sets the port its peers probe).
    pub labels: BTreeMap<String, String>,
    /// The node's addresses; peers probe the first (`/node/ping`).
    pub addresses: Vec<IpAddr>,
}

/// A change to the router's view of the cluster.
///
/// Endpoint updates are keyed by [`EndpointId`]: an endpoint whose id and IP stay keeps
/// its estimator and cooldown state, whatever else changes (conditions, node, port); a
/// new IP under the same id starts with fresh state.
// Updates are discovery events (a few per second at most), moved once into the router;
// boxing the service spec would only add an allocation to every producer.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum Update {
    /// Replace everything; state of endpoints that remain (same service, id and IP) is
    /// kept.
    Reset {
        /// Every node.
        nodes: Vec<Node>,
        /// Every service with its complete endpoint set.
        services: Vec<(ServiceSpec, Vec<Endpoint>)>,
    },
    /// Add or change a node.
    UpsertNode(Node),
    /// Remove the node of this name.
    RemoveNode(String),
    /// Add or change a Service; its endpoints stay as they are.
    UpsertService(ServiceSpec),
    /// Remove a Service and its endpoints.
    RemoveService(ServiceKey),
    /// Replace the full endpoint set of a service.
    SetEndpoints {
        /// The service whose endpoints these are.
        service: ServiceKey,
        /// Its complete endpoint set.
        endpoints: Vec<Endpoint>,
    },
    /// Add or change one endpoint.
    UpsertEndpoint {
        /// The service the endpoint belongs to.
        service: ServiceKey,
        /// The new or changed endpoint.
        endpoint: Endpoint,
    },
    /// Remove one endpoint.
    RemoveEndpoint {
        /// The service the endpoint belongs to.
        service: ServiceKey,
        /// Id of the endpoint to remove.
        id: EndpointId,
    },
}

#[cfg(test)]
mod tests {
    use super::{
        is_dns_label, port_protocol, same_bytes, EndpointPort, PortProtocol, ProtocolSource,
        ServiceKey, ServicePort,
    };

    fn endpoint_port(name: &str, app_protocol: Option<&str>) -> EndpointPort {
        EndpointPort {
            name: name.into(),
            port: 8080,
            app_protocol: app_protocol.map(str::to_string),
        }
    }

    fn service_port(name: &str, app_protocol: Option<&str>) -> ServicePort {
        ServicePort {
            name: name.into(),
            port: 80,
            app_protocol: app_protocol.map(str::to_string),
        }
    }

    #[test]
    fn a_ports_protocol_comes_from_app_protocol_then_its_name() {
        use PortProtocol::*;
        use ProtocolSource::*;
        let cases = [
            // The endpoint port's appProtocol wins over the Service port's and the name.
            (
                endpoint_port("ws", Some("kubernetes.io/h2c")),
                Some(service_port("ws", Some("kubernetes.io/ws"))),
                (H2c, EndpointAppProtocol),
            ),
            (
                endpoint_port("http", None),
                Some(service_port("http", Some("grpc"))),
                (H2c, ServiceAppProtocol),
            ),
            (
                endpoint_port("web", None),
                Some(service_port("web", Some("kubernetes.io/ws"))),
                (WebSocket, ServiceAppProtocol),
            ),
            (
                endpoint_port("grpc", None),
                Some(service_port("grpc", Some("https"))),
                (Http1, ServiceAppProtocol),
            ),
            (
                endpoint_port("x", Some("HTTP2")),
                None,
                (H2c, EndpointAppProtocol),
            ),
            // Istio's names: the protocol alone or followed by a suffix.
            (endpoint_port("grpc", None), None, (H2c, PortName)),
            (endpoint_port("grpc-api", None), None, (H2c, PortName)),
            (endpoint_port("h2c", None), None, (H2c, PortName)),
            (endpoint_port("http2-internal", None), None, (H2c, PortName)),
            (endpoint_port("ws-live", None), None, (WebSocket, PortName)),
            (endpoint_port("http", None), None, (Http1, PortName)),
            (endpoint_port("grpcweb", None), None, (Http1, Default)),
            (endpoint_port("", None), None, (Http1, Default)),
        ];
        for (endpoint, service, expected) in cases {
            assert_eq!(
                port_protocol(&endpoint, service.as_ref()),
                expected,
                "{endpoint:?} {service:?}"
            );
        }
    }

    /// `same_bytes` is slice equality: for every length up to past its word-sized
    /// cases, equal copies and a difference at each position in turn; and different
    /// lengths.
    #[test]
    fn same_bytes_is_slice_equality() {
        for n in 0..=40usize {
            let a: Vec<u8> = (0..n).map(|i| b'a' + (i % 26) as u8).collect();
            assert!(same_bytes(&a, &a.clone()), "length {n}");
            for at in 0..n {
                let mut b = a.clone();
                b[at] = b'-';
                assert!(!same_bytes(&a, &b), "length {n}, difference at {at}");
                assert!(!same_bytes(&b, &a), "length {n}, difference at {at}");
            }
            assert!(!same_bytes(&a, &a[..n.saturating_sub(1)]) || n == 0);
            assert!(!same_bytes(&a, &[a.as_slice(), b"x"].concat()));
        }
        let key = |ns: &str, name: &str| ServiceKey::new(ns, name);
        assert_eq!(key("default", "shop"), key("default", "shop"));
        assert_ne!(key("default", "shop"), key("default", "shoq"));
        assert_ne!(key("default", "shop"), key("defaulu", "shop"));
        // The two parts are compared apart, never as one string.
        assert_ne!(key("ab", "c"), key("a", "bc"));
    }

    #[test]
    fn dns_labels() {
        for ok in ["default", "a", "shop-2", &"a".repeat(63)] {
            assert!(is_dns_label(ok), "{ok:?}");
        }
        for bad in ["", "-a", "a-", "Edge", "a_b", "a.b", "é", &"a".repeat(64)] {
            assert!(!is_dns_label(bad), "{bad:?}");
        }
    }
}
