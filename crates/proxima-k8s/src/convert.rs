//! From Kubernetes objects to Proxima's model ([`proxima_core::model`]).
//!
//! Each object is converted on its own, once per watch event; the [`Index`](crate::Index)
//! then joins a Service with all of its EndpointSlices. The API's documented defaults are
//! applied here:
//!
//! * `conditions.ready` and `serving` nil mean true, `terminating` nil means false, as
//!   kube-proxy reads them (EndpointConditions, discovery.k8s.io/v1). `serving` does not
//!   follow `ready`: a not-ready endpoint without a `serving` condition counts as
//!   serving, which only matters when it is also terminating.
//! * An EndpointSlice port's `name` is the name of the Service port it serves and its
//!   `port` the resolved target port, so ports are matched by name. A slice written by
//!   hand may instead name the port after a Service port's named `targetPort`; such
//!   ports are also offered under the Service port's name.
//! * Only TCP ports count (`protocol` nil means TCP): Proxima proxies HTTP.
//! * An endpoint uses its first address (as kube-proxy does); FQDN slices carry no IPs
//!   and are ignored.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use proxima_core::{
    Conditions, Endpoint, EndpointPort, Hints, Node, ServiceKey, ServicePort, ServiceSettings,
    ServiceSpec, SettingError, TrafficPolicy,
};

use crate::selector::LabelSelector;

/// The annotation that opts a Service in (`"true"`) or out (`"false"`).
pub const ENABLED_ANNOTATION: &str = "proxima.io/enabled";
/// The label the EndpointSlice controller puts on every slice of a Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// The well-known zone label of Nodes.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
const LEGACY_ZONE_LABEL: &str = "failure-domain.beta.kubernetes.io/zone";

/// Which Services Proxima routes: those annotated `proxima.io/enabled: "true"`, and those
/// matching `selector` unless annotated `"false"`.
#[derive(Clone, Debug, Default)]
pub struct OptIn {
    /// Also route Services whose labels match this; `None`: the annotation alone decides.
    pub selector: Option<LabelSelector>,
}

impl OptIn {
    /// Whether a Service with these labels and annotations is routed, and a problem with
    /// its `enabled` annotation if there is one (the selector then decides).
    fn decide(
        &self,
        labels: &BTreeMap<String, String>,
        annotations: &BTreeMap<String, String>,
    ) -> (bool, Option<SettingError>) {
        let by_selector = self.selector.as_ref().is_some_and(|s| s.matches(labels));
        match annotations.get(ENABLED_ANNOTATION).map(|v| v.trim()) {
            Some(v) if v.eq_ignore_ascii_case("true") => (true, None),
            Some(v) if v.eq_ignore_ascii_case("false") => (false, None),
            Some(v) => (
                by_selector,
                Some(SettingError::new("enabled", v, "\"true\" or \"false\"")),
            ),
            None => (by_selector, None),
        }
    }
}

/// A Service as the index keeps it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ServiceInfo {
    pub spec: ServiceSpec,
    pub uid: Option<String>,
    /// Opted in, and not an `ExternalName` Service (which has no endpoints).
    pub routable: bool,
    /// `(service port name, named targetPort)` for ports with a named target.
    pub target_port_names: Vec<(String, String)>,
    /// Problems to report: annotation errors of a routed Service, or an invalid
    /// `enabled` annotation (which is why the Service may not be routed).
    pub errors: Vec<SettingError>,
}

pub(crate) fn service_key(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Option<ServiceKey> {
    Some(ServiceKey::new(meta.namespace.clone()?, meta.name.clone()?))
}

/// Convert a Service; `None` when it lacks a name or namespace.
pub(crate) fn service_info(
    service: &core::Service,
    opt_in: &OptIn,
) -> Option<(ServiceKey, ServiceInfo)> {
    let key = service_key(&service.metadata)?;
    let empty = BTreeMap::new();
    let labels = service.metadata.labels.as_ref().unwrap_or(&empty);
    let annotations = service.metadata.annotations.as_ref().unwrap_or(&empty);
    let (opted_in, enabled_error) = opt_in.decide(labels, annotations);
    let (settings, mut errors) = ServiceSettings::from_annotations(
        annotations.iter().map(|(k, v)| (k.as_str(), v.as_str())),
    );

    let spec = service.spec.clone().unwrap_or_default();
    let external_name = spec.type_.as_deref() == Some("ExternalName");
    let mut ports = Vec::new();
    let mut target_port_names = Vec::new();
    for p in spec
        .ports
        .iter()
        .flatten()
        .filter(|p| is_tcp(p.protocol.as_deref()))
    {
        let Ok(number) = u16::try_from(p.port) else {
            continue;
        };
        let name = p.name.clone().unwrap_or_default();
        if let Some(IntOrString::String(target)) = &p.target_port {
            target_port_names.push((name.clone(), target.clone()));
        }
        ports.push(ServicePort {
            name,
            port: number,
            app_protocol: p.app_protocol.clone(),
        });
    }
    let traffic = TrafficPolicy {
        traffic_distribution: spec.traffic_distribution.clone(),
        internal_local: spec.internal_traffic_policy.as_deref() == Some("Local"),
    };
    let routable = opted_in && !external_name;
    if !routable {
        errors.clear();
    }
    errors.extend(enabled_error);
    // Kept with the settings too, so that `/debug/pools` shows every problem.
    let settings = ServiceSettings {
        problems: errors.clone(),
        ..settings
    };
    let mut spec = ServiceSpec::new(key.clone(), ports, settings);
    spec.traffic = traffic;
    let info = ServiceInfo {
        spec,
        uid: service.metadata.uid.clone(),
        routable,
        target_port_names,
        errors,
    };
    Some((key, info))
}

/// `namespace/name` of an EndpointSlice.
pub(crate) type SliceKey = (String, String);

/// An EndpointSlice as the index keeps it: its Service and its endpoints, each carrying
/// the slice's ports.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct SliceInfo {
    pub service: ServiceKey,
    pub endpoints: Vec<Endpoint>,
}

/// Convert an EndpointSlice; `None` when it has no name, namespace or Service label.
pub(crate) fn slice_info(slice: &discovery::EndpointSlice) -> Option<(SliceKey, SliceInfo)> {
    let meta = &slice.metadata;
    let namespace = meta.namespace.clone()?;
    let name = meta.name.clone()?;
    let service_name = meta.labels.as_ref()?.get(SERVICE_NAME_LABEL)?.clone();
    let service = ServiceKey::new(namespace.clone(), service_name);

    let ports: Vec<EndpointPort> = slice
        .ports
        .iter()
        .flatten()
        .filter(|p| is_tcp(p.protocol.as_deref()))
        .filter_map(|p| {
            Some(EndpointPort {
                name: p.name.clone().unwrap_or_default(),
                port: u16::try_from(p.port?).ok()?,
                app_protocol: p.app_protocol.clone(),
            })
        })
        .collect();
    let endpoints = if slice.address_type == "FQDN" {
        Vec::new()
    } else {
        slice
            .endpoints
            .iter()
            .filter_map(|e| endpoint(e, &ports))
            .collect()
    };
    Some(((namespace, name), SliceInfo { service, endpoints }))
}

fn endpoint(e: &discovery::Endpoint, ports: &[EndpointPort]) -> Option<Endpoint> {
    let ip: IpAddr = e.addresses.first()?.parse().ok()?;
    let c = e.conditions.clone().unwrap_or_default();
    let ready = c.ready.unwrap_or(true);
    let conditions = Conditions {
        ready,
        serving: c.serving.unwrap_or(true),
        terminating: c.terminating.unwrap_or(false),
    };
    let hints = e.hints.clone().unwrap_or_default();
    Some(Endpoint {
        // The pod name keeps a pod's measurements across updates; the IP is the next
        // best identity for endpoints that name no pod.
        id: e
            .target_ref
            .as_ref()
            .and_then(|r| r.name.clone())
            .unwrap_or_else(|| ip.to_string()),
        ip,
        ports: ports.to_vec(),
        node: e.node_name.clone(),
        zone: e.zone.clone(),
        conditions,
        hints: Hints {
            for_zones: hints
                .for_zones
                .into_iter()
                .flatten()
                .map(|z| z.name)
                .collect(),
            for_nodes: hints
                .for_nodes
                .into_iter()
                .flatten()
                .map(|n| n.name)
                .collect(),
        },
    })
}

/// Join a Service with the endpoints of its slices: one entry per endpoint id (a pod in
/// two slices, e.g. dual-stack or while the controller moves it, counts once, preferring
/// the ready and then the IPv4 entry), sorted by id, with named-targetPort aliases added.
///
/// The entries of one id keep the union of their slices' ports (the preferred entry's
/// number wins for a name both have): EndpointSliceMirroring writes an Endpoints object
/// whose subsets differ by port as one slice per port set, so the same address may carry
/// `http` in one slice and `metrics` in another, and each name must lead to its own port.
pub(crate) fn service_endpoints<'a>(
    service: &ServiceInfo,
    slices: impl IntoIterator<Item = &'a SliceInfo>,
) -> Vec<Endpoint> {
    let mut by_id: BTreeMap<String, Endpoint> = BTreeMap::new();
    for endpoint in slices.into_iter().flat_map(|s| s.endpoints.iter()) {
        let rank = |e: &Endpoint| (e.conditions.ready, e.conditions.serving, e.ip.is_ipv4());
        match by_id.get_mut(&endpoint.id) {
            Some(kept) if rank(kept) >= rank(endpoint) => add_missing_ports(kept, endpoint),
            Some(kept) => {
                let mut preferred = endpoint.clone();
                add_missing_ports(&mut preferred, kept);
                *kept = preferred;
            }
            None => {
                by_id.insert(endpoint.id.clone(), endpoint.clone());
            }
        }
    }
    let mut endpoints: Vec<Endpoint> = by_id.into_values().collect();
    for endpoint in &mut endpoints {
        for (service_port, target) in &service.target_port_names {
            let has_service_port = endpoint.ports.iter().any(|p| &p.name == service_port);
            let by_target = endpoint
                .ports
                .iter()
                .find(|p| &p.name == target)
                .map(|p| p.port);
            if let (false, Some(port)) = (has_service_port, by_target) {
                endpoint.ports.push(EndpointPort {
                    name: service_port.clone(),
                    port,
                    app_protocol: None,
                });
            }
        }
    }
    endpoints
}

/// Give `kept` the ports of `other` whose names it lacks.
fn add_missing_ports(kept: &mut Endpoint, other: &Endpoint) {
    for port in &other.ports {
        if !kept.ports.iter().any(|p| p.name == port.name) {
            kept.ports.push(port.clone());
        }
    }
}

/// Convert a Node; `None` when it has no name.
pub(crate) fn node(node: &core::Node) -> Option<Node> {
    let name = node.metadata.name.clone()?;
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let zone = labels
        .get(ZONE_LABEL)
        .or_else(|| labels.get(LEGACY_ZONE_LABEL))
        .cloned();
    // InternalIP first: peers probe a node at its first address, and inside the cluster
    // that is the one to use; ExternalIPs follow in status order.
    let mut typed: Vec<_> = node
        .status
        .iter()
        .flat_map(|s| s.addresses.iter().flatten())
        .filter(|a| a.type_ == "InternalIP" || a.type_ == "ExternalIP")
        .collect();
    typed.sort_by_key(|a| a.type_ != "InternalIP");
    let addresses = typed
        .iter()
        .filter_map(|a| a.address.parse().ok())
        .collect();
    Some(Node {
        name,
        zone,
        labels,
        addresses,
    })
}

fn is_tcp(protocol: Option<&str>) -> bool {
    protocol.is_none_or(|p| p == "TCP")
}
