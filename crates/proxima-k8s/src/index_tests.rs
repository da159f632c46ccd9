//! Index tests with in-memory k8s-openapi objects: no cluster. Updates are also applied
//! to a real `proxima_core::Router` to check what it ends up routing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;
use kube::runtime::watcher::Event;
use proxima_core::{PortProtocol, PortRef, ProtocolSource, Router, ServiceKey, Update};
use serde_json::{json, Value};

use super::*;
use crate::selector::LabelSelector;

const ENABLED: (&str, &str) = ("proxima.io/enabled", "true");

fn service(ns: &str, name: &str, annotations: &[(&str, &str)], ports: Value) -> core::Service {
    let annotations: serde_json::Map<String, Value> = annotations
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    serde_json::from_value(json!({
        "metadata": {"namespace": ns, "name": name, "uid": format!("uid-{name}"), "annotations": annotations},
        "spec": {"ports": ports},
    }))
    .unwrap()
}

fn web(ns: &str, name: &str, annotations: &[(&str, &str)]) -> core::Service {
    service(
        ns,
        name,
        annotations,
        json!([{"name": "http", "port": 80, "targetPort": 8080}]),
    )
}

fn slice(
    ns: &str,
    name: &str,
    service: &str,
    ports: Value,
    endpoints: Value,
) -> discovery::EndpointSlice {
    serde_json::from_value(json!({
        "metadata": {"namespace": ns, "name": name, "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": ports,
        "endpoints": endpoints,
    }))
    .unwrap()
}

fn http_slice(ns: &str, name: &str, service: &str, endpoints: Value) -> discovery::EndpointSlice {
    slice(
        ns,
        name,
        service,
        json!([{"name": "http", "port": 8080}]),
        endpoints,
    )
}

fn pod(name: &str, ip: &str, node: &str) -> Value {
    json!({"addresses": [ip], "targetRef": {"kind": "Pod", "name": name}, "nodeName": node,
           "conditions": {"ready": true, "serving": true, "terminating": false}})
}

fn with_conditions(mut endpoint: Value, conditions: Value) -> Value {
    endpoint["conditions"] = conditions;
    endpoint
}

fn node(name: &str, zone: &str, ip: &str) -> core::Node {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": zone, "kubernetes.io/hostname": name}},
        "status": {"addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}]},
    }))
    .unwrap()
}

fn key(name: &str) -> ServiceKey {
    ServiceKey::new("default", name)
}

/// An index plus the router it feeds.
struct Harness {
    index: Index,
    router: Arc<Router>,
    problems: Vec<SettingProblem>,
}

impl Harness {
    fn new(config: IndexConfig) -> Self {
        Self {
            index: Index::new(config),
            router: Arc::new(Router::new(None)),
            problems: Vec::new(),
        }
    }

    /// Apply one event (from the cluster-wide stream) and return the updates it made.
    fn apply(&mut self, watched: Watched) -> Vec<Update> {
        self.apply_in(None, watched)
    }

    fn apply_in(&mut self, namespace: Option<&str>, watched: Watched) -> Vec<Update> {
        let changes = self.index.apply(namespace, watched);
        self.problems.extend(changes.problems);
        if !changes.updates.is_empty() {
            let report = self.router.apply(changes.updates.clone(), Instant::now());
            self.problems.extend(self.index.router_warnings(&report));
        }
        changes.updates
    }

    /// Complete an (empty or not) initial list of every stream.
    fn list_all(
        &mut self,
        services: Vec<core::Service>,
        slices: Vec<discovery::EndpointSlice>,
        nodes: Vec<core::Node>,
    ) -> Vec<Update> {
        let mut updates = Vec::new();
        for stream in self.index.streams().to_vec() {
            let ns = stream.namespace.as_deref();
            let events: Vec<Watched> = match stream.kind {
                Kind::Service => relist(&services, Watched::Service),
                Kind::EndpointSlice => relist(&slices, Watched::EndpointSlice),
                Kind::Node => relist(&nodes, Watched::Node),
            };
            for event in events {
                updates.extend(self.apply_in(ns, event));
            }
        }
        updates
    }

    fn synced() -> Self {
        let mut h = Self::new(IndexConfig::default());
        h.list_all(vec![], vec![], vec![]);
        h
    }

    fn endpoint_ids(&self, name: &str) -> Vec<String> {
        self.router.table().services[&key(name)]
            .endpoints
            .iter()
            .map(|e| e.endpoint.id.clone())
            .collect()
    }

    fn routed(&self, name: &str) -> bool {
        self.router.table().services.contains_key(&key(name))
    }

    fn take_problems(&mut self) -> Vec<SettingProblem> {
        std::mem::take(&mut self.problems)
    }
}

fn relist<K: Clone>(objects: &[K], wrap: fn(Event<K>) -> Watched) -> Vec<Watched> {
    let mut events = vec![wrap(Event::Init)];
    events.extend(objects.iter().cloned().map(|o| wrap(Event::InitApply(o))));
    events.push(wrap(Event::InitDone));
    events
}

fn kinds(updates: &[Update]) -> Vec<&'static str> {
    updates
        .iter()
        .map(|u| match u {
            Update::Reset { .. } => "Reset",
            Update::UpsertNode(_) => "UpsertNode",
            Update::RemoveNode(_) => "RemoveNode",
            Update::UpsertService(_) => "UpsertService",
            Update::RemoveService(_) => "RemoveService",
            Update::SetEndpoints { .. } => "SetEndpoints",
            Update::UpsertEndpoint { .. } => "UpsertEndpoint",
            Update::RemoveEndpoint { .. } => "RemoveEndpoint",
        })
        .collect()
}

#[test]
fn nothing_is_routed_until_every_kind_has_listed_then_one_reset() {
    let mut h = Harness::new(IndexConfig::default());
    assert_eq!(h.index.streams().len(), 3);
    let mut updates = Vec::new();
    updates.extend(h.apply(Watched::Service(Event::Init)));
    updates.extend(h.apply(Watched::Service(Event::InitApply(web(
        "default",
        "api",
        &[ENABLED],
    )))));
    updates.extend(h.apply(Watched::Service(Event::InitDone)));
    updates.extend(h.apply(Watched::EndpointSlice(Event::Init)));
    updates.extend(h.apply(Watched::EndpointSlice(Event::InitApply(http_slice(
        "default",
        "api-1",
        "api",
        json!([pod("api-a", "10.0.0.1", "n1")]),
    )))));
    updates.extend(h.apply(Watched::EndpointSlice(Event::InitDone)));
    // An event between lists is kept, not published.
    updates.extend(h.apply(Watched::Service(Event::Apply(web(
        "default",
        "db",
        &[ENABLED],
    )))));
    assert!(updates.is_empty(), "{updates:?}");
    assert!(!h.index.is_synced());

    updates.extend(h.apply(Watched::Node(Event::Init)));
    updates.extend(h.apply(Watched::Node(Event::InitApply(node(
        "n1",
        "zone-a",
        "198.51.100.1",
    )))));
    assert!(updates.is_empty());
    let updates = h.apply(Watched::Node(Event::InitDone));
    assert_eq!(kinds(&updates), ["Reset"]);
    assert!(h.index.is_synced());
    let table = h.router.table();
    assert_eq!(table.services.len(), 2);
    assert_eq!(h.endpoint_ids("api"), ["api-a"]);
    assert!(h.endpoint_ids("db").is_empty());
    let n1 = &table.nodes["n1"];
    assert_eq!(n1.zone.as_deref(), Some("zone-a"));
    assert_eq!(
        n1.addresses,
        ["198.51.100.1".parse::<std::net::IpAddr>().unwrap()]
    );
    assert_eq!(n1.labels["kubernetes.io/hostname"], "n1");
}

#[test]
fn slices_of_a_service_are_joined_and_leave() {
    let mut h = Harness::synced();
    let updates = h.apply(Watched::Service(Event::Apply(web(
        "default",
        "api",
        &[ENABLED],
    ))));
    assert_eq!(kinds(&updates), ["UpsertService", "SetEndpoints"]);
    let a = http_slice(
        "default",
        "api-a",
        "api",
        json!([pod("p1", "10.0.0.1", "n1"), pod("p2", "10.0.0.2", "n1")]),
    );
    let b = http_slice(
        "default",
        "api-b",
        "api",
        json!([pod("p3", "10.0.0.3", "n2")]),
    );
    assert_eq!(
        kinds(&h.apply(Watched::EndpointSlice(Event::Apply(a.clone())))),
        ["SetEndpoints"]
    );
    assert_eq!(
        kinds(&h.apply(Watched::EndpointSlice(Event::Apply(b.clone())))),
        ["SetEndpoints"]
    );
    assert_eq!(h.endpoint_ids("api"), ["p1", "p2", "p3"]);

    // The same object again (a resync) changes nothing.
    assert!(h
        .apply(Watched::EndpointSlice(Event::Apply(b.clone())))
        .is_empty());

    // A slice of another Service does not touch this one.
    let other = http_slice(
        "default",
        "db-a",
        "db",
        json!([pod("d1", "10.0.1.1", "n1")]),
    );
    assert!(h
        .apply(Watched::EndpointSlice(Event::Apply(other)))
        .is_empty());

    // Pod p2 moves from slice a to slice b: one endpoint set, same ids.
    let a2 = http_slice(
        "default",
        "api-a",
        "api",
        json!([pod("p1", "10.0.0.1", "n1")]),
    );
    let b2 = http_slice(
        "default",
        "api-b",
        "api",
        json!([pod("p2", "10.0.0.2", "n1"), pod("p3", "10.0.0.3", "n2")]),
    );
    h.apply(Watched::EndpointSlice(Event::Apply(b2)));
    assert!(
        h.apply(Watched::EndpointSlice(Event::Apply(a2))).is_empty(),
        "p2 was already there"
    );
    assert_eq!(h.endpoint_ids("api"), ["p1", "p2", "p3"]);

    let updates = h.apply(Watched::EndpointSlice(Event::Delete(b)));
    assert_eq!(kinds(&updates), ["SetEndpoints"]);
    assert_eq!(h.endpoint_ids("api"), ["p1"]);
    let table = h.router.table();
    let p1 = &table.services[&key("api")].endpoints[0].endpoint;
    assert_eq!(p1.ip.to_string(), "10.0.0.1");
    assert_eq!(p1.node.as_deref(), Some("n1"));
    assert_eq!(p1.port("http"), Some(8080));
}

#[test]
fn endpoints_keep_measurement_state_across_updates() {
    let mut h = Harness::synced();
    h.apply(Watched::Service(Event::Apply(web(
        "default",
        "api",
        &[ENABLED],
    ))));
    h.apply(Watched::EndpointSlice(Event::Apply(http_slice(
        "default",
        "s",
        "api",
        json!([pod("p1", "10.0.0.1", "n1")]),
    ))));
    let before = h.router.table().services[&key("api")].endpoints[0]
        .state
        .clone();
    h.apply(Watched::EndpointSlice(Event::Apply(http_slice(
        "default",
        "s",
        "api",
        json!([pod("p1", "10.0.0.1", "n2"), pod("p2", "10.0.0.2", "n1")]),
    ))));
    let after = h.router.table().services[&key("api")].endpoints[0]
        .state
        .clone();
    assert!(Arc::ptr_eq(&before, &after));
}

#[test]
fn readiness_flips_and_api_defaults() {
    let mut h = Harness::synced();
    h.apply(Watched::Service(Event::Apply(web(
        "default",
        "api",
        &[ENABLED],
    ))));
    let endpoints = json!([
        pod("p1", "10.0.0.1", "n1"),
        with_conditions(pod("p2", "10.0.0.2", "n1"), json!({})),
        with_conditions(pod("p3", "10.0.0.3", "n1"), json!({"ready": false})),
    ]);
    h.apply(Watched::EndpointSlice(Event::Apply(http_slice(
        "default", "s", "api", endpoints,
    ))));
    let table = h.router.table();
    let route = &table.services[&key("api")];
    let c: Vec<_> = route
        .endpoints
        .iter()
        .map(|e| e.endpoint.conditions)
        .collect();
    // nil ready and serving mean true (serving does not follow ready, as in kube-proxy);
    // nil terminating means false.
    assert_eq!(
        (c[1].ready, c[1].serving, c[1].terminating),
        (true, true, false)
    );
    assert_eq!(
        (c[2].ready, c[2].serving, c[2].terminating),
        (false, true, false)
    );
    assert_eq!(route.eligible(), [0, 1]);

    // p1 fails its readiness probe.
    let endpoints = json!([
        with_conditions(
            pod("p1", "10.0.0.1", "n1"),
            json!({"ready": false, "serving": false})
        ),
        with_conditions(pod("p2", "10.0.0.2", "n1"), json!({})),
        with_conditions(pod("p3", "10.0.0.3", "n1"), json!({"ready": false})),
    ]);
    let updates = h.apply(Watched::EndpointSlice(Event::Apply(http_slice(
        "default", "s", "api", endpoints,
    ))));
    assert_eq!(kinds(&updates), ["SetEndpoints"]);
    assert_eq!(h.router.table().services[&key("api")].eligible(), [1]);
}

#[test]
fn terminating_endpoints_serve_only_when_none_is_ready() {
    let mut h = Harness::synced();
    h.apply(Watched::Service(Event::Apply(web(
        "default",
        "api",
        &[ENABLED],
    ))));
    let terminating = json!({"ready": false, "serving": true, "terminating": true});
    h.apply(Watched::EndpointSlice(Event::Apply(http_slice(
        "default",
        "s",
        "api",
        json!([
            pod("p1", "10.0.0.1", "n1"),
            with_conditions(pod("p2", "10.0.0.2", "n1"), terminating.clone())
        ]),
    ))));
    let table = h.router.table();
    let route = &table.services[&key("api")];
    assert_eq!(route.eligible(), [0]);
    let c = route.endpoints[1].endpoint.conditions;
    assert_eq!((c.ready, c.serving, c.terminating), (false, true, true));

    h.apply(Watched::EndpointSlice(Event::Apply(http_slice(
        "default",
        "s",
        "api",
        json!([
            with_conditions(pod("p1", "10.0.0.1", "n1"), terminating.clone()),
            with_conditions(
                pod("p2", "10.0.0.2", "n1"),
                json!({"ready": false, "serving": false, "terminating": true})
            )
        ]),
    ))));
    let table = h.router.table();
    let route = &table.services[&key("api")];
    assert_eq!(route.eligible(), [0]);
    assert!(route.only_terminating());
}

/// The opted-in Service `api` in `default` with `ports`.
fn opted_in_api(h: &mut Harness, ports: Value) {
    let svc = service("default", "api", &[ENABLED], ports);
    h.apply(Watched::Service(Event::Apply(svc)));
}

#[test]
fn multi_port_services_map_ports_by_name_and_named_target_ports() {
    let mut h = Harness::synced();
    opted_in_api(
        &mut h,
        json!([
            {"name": "http", "port": 80, "targetPort": "web"},
            {"name": "metrics", "port": 9090, "targetPort": 9100},
            {"name": "dns", "port": 53, "protocol": "UDP"},
        ]),
    );
    // As the EndpointSlice controller writes it: ports named after the Service ports.
    h.apply(Watched::EndpointSlice(Event::Apply(slice(
        "default",
        "s1",
        "api",
        json!([{"name": "http", "port": 8080}, {"name": "metrics", "port": 9100}, {"name": "dns", "port": 53, "protocol": "UDP"}]),
        json!([pod("p1", "10.0.0.1", "n1")]),
    ))));
    // Hand-written: the port is named after the Service port's named targetPort.
    h.apply(Watched::EndpointSlice(Event::Apply(slice(
        "default",
        "s2",
        "api",
        json!([{"name": "web", "port": 8081}]),
        json!([pod("p2", "10.0.0.2", "n1")]),
    ))));
    let table = h.router.table();
    let route = &table.services[&key("api")];
    let ports: Vec<(&str, u16)> = route
        .spec
        .ports
        .iter()
        .map(|p| (p.name.as_str(), p.port))
        .collect();
    assert_eq!(
        ports,
        [("http", 80), ("metrics", 9090)],
        "UDP ports are not proxied"
    );
    let p1 = &route.endpoints[0].endpoint;
    assert_eq!(
        (p1.port("http"), p1.port("metrics"), p1.port("dns")),
        (Some(8080), Some(9100), None)
    );
    let p2 = &route.endpoints[1].endpoint;
    assert_eq!((p2.port("http"), p2.port("metrics")), (Some(8081), None));
}

#[test]
fn app_protocols_of_service_and_slice_ports_are_kept() {
    let mut h = Harness::synced();
    opted_in_api(
        &mut h,
        json!([
            {"name": "rpc", "port": 50051, "appProtocol": "kubernetes.io/h2c"},
            {"name": "live", "port": 80},
        ]),
    );
    h.apply(Watched::EndpointSlice(Event::Apply(slice(
        "default",
        "s1",
        "api",
        json!([{"name": "rpc", "port": 50051}, {"name": "live", "port": 8080, "appProtocol": "kubernetes.io/ws"}]),
        json!([pod("p1", "10.0.0.1", "n1")]),
    ))));
    let table = h.router.table();
    let route = &table.services[&key("api")];
    assert_eq!(
        route.spec.ports[0].app_protocol.as_deref(),
        Some("kubernetes.io/h2c")
    );
    let explain = h.router.explain(Instant::now());
    let ports = &explain.services[0].endpoints[0].ports;
    let seen: Vec<_> = ports
        .iter()
        .map(|p| (p.name.as_str(), p.protocol, p.protocol_from))
        .collect();
    assert_eq!(
        seen,
        [
            ("rpc", PortProtocol::H2c, ProtocolSource::ServiceAppProtocol),
            (
                "live",
                PortProtocol::WebSocket,
                ProtocolSource::EndpointAppProtocol
            ),
        ]
    );
}

#[test]
fn an_endpoint_without_the_port_name_is_no_candidate_for_it() {
    let mut h = Harness::synced();
    h.apply(Watched::Service(Event::Apply(service(
        "default",
        "api",
        &[ENABLED],
        json!([{"name": "http", "port": 80}, {"name": "metrics", "port": 9090}]),
    ))));
    // What the EndpointSlice controller writes for a pod that does not declare the
    // Service's named targetPort `http`: only its metrics port.
    h.apply(Watched::EndpointSlice(Event::Apply(slice(
        "default",
        "s1",
        "api",
        json!([{"name": "metrics", "port": 9100}]),
        json!([pod("p1", "10.0.0.1", "n1")]),
    ))));
    h.apply(Watched::EndpointSlice(Event::Apply(slice(
        "default",
        "s2",
        "api",
        json!([{"name": "http", "port": 8080}, {"name": "metrics", "port": 9100}]),
        json!([pod("p2", "10.0.0.2", "n1")]),
    ))));
    let table = h.router.table();
    let p1 = &table.services[&key("api")].endpoints[0].endpoint;
    assert_eq!((p1.port("http"), p1.port("metrics")), (None, Some(9100)));
    let mut rng = <rand::rngs::SmallRng as rand::SeedableRng>::seed_from_u64(7);
    for _ in 0..20 {
        let picked = h
            .router
            .pick(
                &key("api"),
                Some(PortRef::Name("http")),
                Instant::now(),
                &mut rng,
                &[],
            )
            .expect("p2 serves http");
        assert_eq!(picked.addr, "10.0.0.2:8080".parse().unwrap());
    }
}

#[test]
fn one_address_in_two_slices_keeps_the_ports_of_both() {
    let mut h = Harness::synced();
    h.apply(Watched::Service(Event::Apply(service(
        "default",
        "api",
        &[ENABLED],
        json!([{"name": "http", "port": 80}, {"name": "metrics", "port": 9090}]),
    ))));
    // As EndpointSliceMirroring writes an Endpoints object whose subsets differ by port.
    for (name, ports) in [
        ("m-http", json!([{"name": "http", "port": 8080}])),
        ("m-metrics", json!([{"name": "metrics", "port": 9100}])),
    ] {
        h.apply(Watched::EndpointSlice(Event::Apply(slice(
            "default",
            name,
            "api",
            ports,
            json!([{"addresses": ["10.0.0.7"], "conditions": {"ready": true}}]),
        ))));
    }
    let table = h.router.table();
    let route = &table.services[&key("api")];
    assert_eq!(route.endpoints.len(), 1);
    let e = &route.endpoints[0].endpoint;
    assert_eq!(
        (e.port("http"), e.port("metrics")),
        (Some(8080), Some(9100))
    );
}

#[test]
fn rejected_settings_stay_with_the_service_for_debug_pools() {
    let mut h = Harness::synced();
    h.apply(Watched::Service(Event::Apply(web(
        "default",
        "api",
        &[
            ENABLED,
            ("proxima.io/latency-slo", "fast"),
            ("proxima.io/retries", "many"),
            ("proxima.io/strategy", "nope"),
        ],
    ))));
    let explain = h.router.explain(Instant::now());
    let warnings = &explain.services[0].warnings;
    for key in ["latency-slo", "retries", "strategy"] {
        assert!(
            warnings.iter().any(|w| w.contains(&format!("`{key}`"))),
            "{key} missing from {warnings:?}"
        );
    }
}

#[test]
fn unnamed_single_port() {
    let mut h = Harness::synced();
    h.apply(Watched::Service(Event::Apply(service(
        "default",
        "api",
        &[ENABLED],
        json!([{"port": 80}]),
    ))));
    h.apply(Watched::EndpointSlice(Event::Apply(slice(
        "default",
        "s",
        "api",
        json!([{"name": "", "port": 8080}]),
        json!([pod("p1", "10.0.0.1", "n1")]),
    ))));
    let table = h.router.table();
    let route = &table.services[&key("api")];
    assert_eq!(route.spec.ports[0].name, "");
    assert_eq!(route.endpoints[0].endpoint.port(""), Some(8080));
}

#[test]
fn only_opted_in_services_are_routed() {
    let mut h = Harness::synced();
    assert!(h
        .apply(Watched::Service(Event::Apply(web("default", "plain", &[]))))
        .is_empty());
    assert!(h
        .apply(Watched::EndpointSlice(Event::Apply(http_slice(
            "default",
            "plain-1",
            "plain",
            json!([pod("p1", "10.0.0.1", "n1")])
        ))))
        .is_empty());
    assert!(!h.routed("plain"));

    // Annotating it routes it at once, with the slices seen before.
    let updates = h.apply(Watched::Service(Event::Apply(web(
        "default",
        "plain",
        &[ENABLED],
    ))));
    assert_eq!(kinds(&updates), ["UpsertService", "SetEndpoints"]);
    assert_eq!(h.endpoint_ids("plain"), ["p1"]);

    // "false" (or removing the annotation) takes it out again.
    let updates = h.apply(Watched::Service(Event::Apply(web(
        "default",
        "plain",
        &[("proxima.io/enabled", "false")],
    ))));
    assert_eq!(kinds(&updates), ["RemoveService"]);
    assert!(!h.routed("plain"));
    assert!(h.take_problems().is_empty());

    // ExternalName Services have no endpoints to route to.
    let mut external = web("default", "ext", &[ENABLED]);
    external.spec.as_mut().unwrap().type_ = Some("ExternalName".into());
    assert!(h.apply(Watched::Service(Event::Apply(external))).is_empty());
}

#[test]
fn label_selector_opts_in_unless_annotated_false() {
    let opt_in = OptIn {
        selector: Some("proxima=on".parse::<LabelSelector>().unwrap()),
    };
    let mut h = Harness::new(IndexConfig {
        opt_in,
        namespaces: vec![],
    });
    h.list_all(vec![], vec![], vec![]);
    let mut labelled = web("default", "a", &[]);
    labelled.metadata.labels = Some([("proxima".to_string(), "on".to_string())].into());
    h.apply(Watched::Service(Event::Apply(labelled.clone())));
    assert!(h.routed("a"));
    labelled.metadata.annotations =
        Some([("proxima.io/enabled".to_string(), "false".to_string())].into());
    h.apply(Watched::Service(Event::Apply(labelled)));
    assert!(!h.routed("a"));
    h.apply(Watched::Service(Event::Apply(web("default", "b", &[]))));
    assert!(!h.routed("b"));
}

#[test]
fn annotation_changes_update_the_service_only() {
    let mut h = Harness::synced();
    h.apply(Watched::Service(Event::Apply(web(
        "default",
        "api",
        &[ENABLED, ("proxima.io/latency-slo", "80ms")],
    ))));
    h.apply(Watched::EndpointSlice(Event::Apply(http_slice(
        "default",
        "s",
        "api",
        json!([pod("p1", "10.0.0.1", "n1")]),
    ))));
    assert_eq!(
        h.router.table().services[&key("api")]
            .settings()
            .latency_slo,
        Duration::from_millis(80)
    );
    let updates = h.apply(Watched::Service(Event::Apply(web(
        "default",
        "api",
        &[
            ENABLED,
            ("proxima.io/latency-slo", "250ms"),
            ("proxima.io/strategy", "round-robin"),
        ],
    ))));
    assert_eq!(kinds(&updates), ["UpsertService"]);
    let table = h.router.table();
    let route = &table.services[&key("api")];
    assert_eq!(route.settings().latency_slo, Duration::from_millis(250));
    assert_eq!(route.settings().strategy, "round-robin");
    assert_eq!(h.endpoint_ids("api"), ["p1"]);
}

#[test]
fn invalid_annotations_are_reported_once_and_keep_defaults() {
    let mut h = Harness::synced();
    let bad = web(
        "default",
        "api",
        &[
            ENABLED,
            ("proxima.io/latency-slo", "80"),
            ("proxima.io/retries", "many"),
        ],
    );
    h.apply(Watched::Service(Event::Apply(bad.clone())));
    assert!(
        h.routed("api"),
        "an invalid setting never rejects the Service"
    );
    assert_eq!(
        h.router.table().services[&key("api")]
            .settings()
            .latency_slo,
        Duration::from_millis(100)
    );
    let problems = h.take_problems();
    assert_eq!(problems.len(), 1);
    assert_eq!(problems[0].service, key("api"));
    assert_eq!(problems[0].uid.as_deref(), Some("uid-api"));
    let keys: Vec<&str> = problems[0].errors.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(keys, ["latency-slo", "retries"]);
    assert!(problems[0].errors[0].expected.contains("80ms"));

    // Resyncs and re-lists of the same object report nothing new.
    h.apply(Watched::Service(Event::Apply(bad.clone())));
    h.list_all(vec![bad], vec![], vec![]);
    assert!(h.take_problems().is_empty());

    // Fixing one error and changing the other reports only the new one.
    h.apply(Watched::Service(Event::Apply(web(
        "default",
        "api",
        &[
            ENABLED,
            ("proxima.io/latency-slo", "80ms"),
            ("proxima.io/retries", "-1"),
        ],
    ))));
    let problems = h.take_problems();
    assert_eq!(problems.len(), 1);
    assert_eq!(problems[0].errors.len(), 1);
    assert_eq!(problems[0].errors[0].value, "-1");

    // Fixed, then broken again: reported again.
    let fixed = web("default", "api", &[ENABLED, ("proxima.io/retries", "1")]);
    h.apply(Watched::Service(Event::Apply(fixed)));
    assert!(h.take_problems().is_empty());
    h.apply(Watched::Service(Event::Apply(web(
        "default",
        "api",
        &[ENABLED, ("proxima.io/retries", "-1")],
    ))));
    assert_eq!(h.take_problems().len(), 1);
}

#[test]
fn invalid_settings_of_services_not_opted_in_are_not_reported_but_a_bad_enabled_is() {
    let mut h = Harness::synced();
    h.apply(Watched::Service(Event::Apply(web(
        "default",
        "off",
        &[("proxima.io/latency-slo", "x")],
    ))));
    assert!(h.take_problems().is_empty());
    h.apply(Watched::Service(Event::Apply(web(
        "default",
        "typo",
        &[("proxima.io/enabled", "yes")],
    ))));
    assert!(!h.routed("typo"));
    let problems = h.take_problems();
    assert_eq!(problems.len(), 1);
    assert_eq!(problems[0].errors[0].key, "enabled");
    assert!(problems[0].errors[0].expected.contains("\"true\""));
}

#[test]
fn router_warnings_are_reported_once() {
    let mut h = Harness::synced();
    let svc = web(
        "default",
        "api",
        &[ENABLED, ("proxima.io/strategy", "no-such-strategy")],
    );
    h.apply(Watched::Service(Event::Apply(svc)));
    let problems = h.take_problems();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0].errors[0].key, "strategy");
    // Endpoint churn rebuilds the route; the warning is not repeated.
    h.apply(Watched::EndpointSlice(Event::Apply(http_slice(
        "default",
        "s",
        "api",
        json!([pod("p1", "10.0.0.1", "n1")]),
    ))));
    assert!(h.take_problems().is_empty());
}

#[test]
fn a_relist_replaces_what_was_missed_with_a_reset() {
    let mut h = Harness::synced();
    let api = web("default", "api", &[ENABLED]);
    let gone = web("default", "gone", &[ENABLED]);
    let s1 = http_slice(
        "default",
        "s1",
        "api",
        json!([pod("p1", "10.0.0.1", "n1"), pod("p2", "10.0.0.2", "n1")]),
    );
    let n1 = node("n1", "zone-a", "198.51.100.1");
    h.apply(Watched::Service(Event::Apply(api.clone())));
    h.apply(Watched::Service(Event::Apply(gone)));
    h.apply(Watched::EndpointSlice(Event::Apply(s1)));
    h.apply(Watched::Node(Event::Apply(n1.clone())));
    assert!(h.routed("gone"));

    // While the watch was down, "gone" was deleted and p2 left. The re-list says so.
    let mut updates = Vec::new();
    for event in relist(std::slice::from_ref(&api), Watched::Service) {
        updates.extend(h.apply(event));
    }
    assert_eq!(kinds(&updates), ["Reset"]);
    assert!(!h.routed("gone"));
    let s1 = http_slice("default", "s1", "api", json!([pod("p1", "10.0.0.1", "n1")]));
    let mut updates = Vec::new();
    for event in relist(std::slice::from_ref(&s1), Watched::EndpointSlice) {
        updates.extend(h.apply(event));
    }
    assert_eq!(kinds(&updates), ["Reset"]);
    assert_eq!(h.endpoint_ids("api"), ["p1"]);
    assert_eq!(h.router.table().nodes.len(), 1);

    // A re-list that finds nothing new changes nothing.
    assert!(h.list_all(vec![api], vec![s1], vec![n1]).is_empty());
}

#[test]
fn relist_buffers_until_init_done() {
    let mut h = Harness::synced();
    h.apply(Watched::Service(Event::Apply(web(
        "default",
        "api",
        &[ENABLED],
    ))));
    h.apply(Watched::Service(Event::Init));
    assert!(h
        .apply(Watched::Service(Event::InitApply(web(
            "default",
            "new",
            &[ENABLED]
        ))))
        .is_empty());
    assert!(
        h.routed("api") && !h.routed("new"),
        "nothing changes before InitDone"
    );
    h.apply(Watched::Service(Event::InitDone));
    assert!(!h.routed("api") && h.routed("new"));
}

#[test]
fn nodes_are_upserted_when_they_change_and_removed() {
    let mut h = Harness::synced();
    let n1 = node("n1", "zone-a", "198.51.100.1");
    assert_eq!(
        kinds(&h.apply(Watched::Node(Event::Apply(n1.clone())))),
        ["UpsertNode"]
    );
    assert!(
        h.apply(Watched::Node(Event::Apply(n1.clone()))).is_empty(),
        "heartbeat-only change"
    );
    let updates = h.apply(Watched::Node(Event::Apply(node(
        "n1",
        "zone-b",
        "198.51.100.1",
    ))));
    assert_eq!(kinds(&updates), ["UpsertNode"]);
    assert_eq!(h.router.table().nodes["n1"].zone.as_deref(), Some("zone-b"));
    assert_eq!(
        kinds(&h.apply(Watched::Node(Event::Delete(n1.clone())))),
        ["RemoveNode"]
    );
    assert!(h.apply(Watched::Node(Event::Delete(n1))).is_empty());
    assert!(h.router.table().nodes.is_empty());
}

#[test]
fn a_slice_relabelled_to_another_service_moves() {
    let mut h = Harness::synced();
    h.apply(Watched::Service(Event::Apply(web(
        "default",
        "a",
        &[ENABLED],
    ))));
    h.apply(Watched::Service(Event::Apply(web(
        "default",
        "b",
        &[ENABLED],
    ))));
    h.apply(Watched::EndpointSlice(Event::Apply(http_slice(
        "default",
        "s",
        "a",
        json!([pod("p1", "10.0.0.1", "n1")]),
    ))));
    assert_eq!(h.endpoint_ids("a"), ["p1"]);
    let updates = h.apply(Watched::EndpointSlice(Event::Apply(http_slice(
        "default",
        "s",
        "b",
        json!([pod("p1", "10.0.0.1", "n1")]),
    ))));
    assert_eq!(kinds(&updates), ["SetEndpoints", "SetEndpoints"]);
    assert!(h.endpoint_ids("a").is_empty());
    assert_eq!(h.endpoint_ids("b"), ["p1"]);
}

#[test]
fn duplicate_endpoints_count_once_preferring_ready_and_ipv4() {
    let mut h = Harness::synced();
    h.apply(Watched::Service(Event::Apply(web(
        "default",
        "api",
        &[ENABLED],
    ))));
    let mut v6 = http_slice("default", "s6", "api", json!([pod("p1", "fd00::1", "n1")]));
    v6.address_type = "IPv6".into();
    h.apply(Watched::EndpointSlice(Event::Apply(v6)));
    h.apply(Watched::EndpointSlice(Event::Apply(http_slice(
        "default",
        "s4",
        "api",
        json!([pod("p1", "10.0.0.1", "n1")]),
    ))));
    let table = h.router.table();
    let route = &table.services[&key("api")];
    assert_eq!(route.endpoints.len(), 1);
    assert_eq!(route.endpoints[0].endpoint.ip.to_string(), "10.0.0.1");

    // Endpoints without a pod are identified by IP; FQDN slices carry none.
    let mut fqdn = http_slice(
        "default",
        "sf",
        "api",
        json!([{"addresses": ["example.com"]}]),
    );
    fqdn.address_type = "FQDN".into();
    h.apply(Watched::EndpointSlice(Event::Apply(fqdn)));
    h.apply(Watched::EndpointSlice(Event::Apply(http_slice(
        "default",
        "sx",
        "api",
        json!([{"addresses": ["10.0.0.9"]}]),
    ))));
    assert_eq!(h.endpoint_ids("api"), ["10.0.0.9", "p1"]);
}

#[test]
fn topology_fields_reach_the_model() {
    let mut h = Harness::synced();
    let mut svc = web("default", "api", &[ENABLED]);
    let spec = svc.spec.as_mut().unwrap();
    spec.traffic_distribution = Some("PreferClose".into());
    spec.internal_traffic_policy = Some("Local".into());
    h.apply(Watched::Service(Event::Apply(svc)));
    let mut endpoint = pod("p1", "10.0.0.1", "n1");
    endpoint["zone"] = json!("zone-a");
    endpoint["hints"] = json!({"forZones": [{"name": "zone-a"}], "forNodes": [{"name": "n1"}]});
    h.apply(Watched::EndpointSlice(Event::Apply(http_slice(
        "default",
        "s",
        "api",
        json!([endpoint]),
    ))));
    let table = h.router.table();
    let route = &table.services[&key("api")];
    assert_eq!(
        route.spec.traffic.traffic_distribution.as_deref(),
        Some("PreferClose")
    );
    assert!(route.spec.traffic.internal_local);
    let e = &route.endpoints[0].endpoint;
    assert_eq!(e.zone.as_deref(), Some("zone-a"));
    assert_eq!(*e.hints.for_zones, ["zone-a"]);
    assert_eq!(*e.hints.for_nodes, ["n1"]);
}

#[test]
fn configured_namespaces_each_list_on_their_own() {
    let mut h = Harness::new(IndexConfig {
        opt_in: OptIn::default(),
        namespaces: vec!["a".into(), "b".into()],
    });
    assert_eq!(h.index.streams().len(), 5);
    let in_a = web("a", "api", &[ENABLED]);
    let in_b = web("b", "api", &[ENABLED]);
    let in_c = web("c", "api", &[ENABLED]);
    h.list_all(vec![], vec![], vec![]);
    h.apply_in(Some("a"), Watched::Service(Event::Apply(in_a.clone())));
    h.apply_in(Some("b"), Watched::Service(Event::Apply(in_b)));
    h.apply_in(None, Watched::Service(Event::Apply(in_c)));
    let routed = |h: &Harness, ns: &str| {
        h.router
            .table()
            .services
            .contains_key(&ServiceKey::new(ns, "api"))
    };
    assert!(routed(&h, "a") && routed(&h, "b") && !routed(&h, "c"));

    // Namespace a re-lists: b's Services are not its business.
    for event in relist(&[in_a], Watched::Service) {
        h.apply_in(Some("a"), event);
    }
    assert!(routed(&h, "a") && routed(&h, "b"));
    for event in relist::<core::Service>(&[], Watched::Service) {
        h.apply_in(Some("b"), event);
    }
    assert!(routed(&h, "a") && !routed(&h, "b"));
}

#[test]
fn deleting_a_service_removes_it_and_its_endpoints_stay_known() {
    let mut h = Harness::synced();
    let svc = web("default", "api", &[ENABLED]);
    h.apply(Watched::Service(Event::Apply(svc.clone())));
    h.apply(Watched::EndpointSlice(Event::Apply(http_slice(
        "default",
        "s",
        "api",
        json!([pod("p1", "10.0.0.1", "n1")]),
    ))));
    assert_eq!(
        kinds(&h.apply(Watched::Service(Event::Delete(svc.clone())))),
        ["RemoveService"]
    );
    assert!(!h.routed("api"));
    // Recreated (slices usually outlive a quick delete/create): endpoints are back.
    h.apply(Watched::Service(Event::Apply(svc)));
    assert_eq!(h.endpoint_ids("api"), ["p1"]);
}
