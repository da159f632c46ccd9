//! End to end against a real kube-apiserver (tests/k8s/provision.sh provides it): the
//! objects a test writes through the API reach a `Router` through `proxima_k8s::run`.
//!
//! No traffic is sent here, so endpoint addresses are from TEST-NET-2 (198.51.100.0/24):
//! the API server rejects loopback addresses in EndpointSlices.

#[path = "../../../tests/k8s/support.rs"]
mod k8s_support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, Client};
use proxima_core::{PortRef, Router, ServiceKey};
use proxima_k8s::{ApiStatus, K8sConfig, KubeDiscovery, EVENT_REASON};
use serde_json::{json, Value};
use tokio::sync::oneshot;

use k8s_support::Cluster;

/// How long a change written to the API server may take to reach the router. Watch
/// events arrive in milliseconds; the margin is for a loaded 2-core machine.
const PROPAGATION: Duration = Duration::from_secs(5);
const SYNC: Duration = Duration::from_secs(60);

fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "proxima_k8s=debug".into()),
        )
        .with_test_writer()
        .try_init();
}

/// Discovery running in the background against a router.
struct Running {
    router: Arc<Router>,
    status: ApiStatus,
    synced: Arc<AtomicBool>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), proxima_k8s::Error>>,
}

impl Running {
    fn start(client: Client, config: K8sConfig) -> Self {
        let router = Arc::new(Router::new(Some("n1".into())));
        let discovery = KubeDiscovery::new(client, router.clone(), config);
        let status = discovery.status();
        let synced = Arc::new(AtomicBool::new(false));
        let flag = synced.clone();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(discovery.run(
            move || flag.store(true, Ordering::SeqCst),
            async move {
                let _ = stopped.await;
            },
        ));
        Running {
            router,
            status,
            synced,
            stop: Some(stop),
            task,
        }
    }

    fn endpoints(&self, name: &str) -> Option<Vec<(String, bool, bool, bool)>> {
        let table = self.router.table();
        let route = table.services.get(&ServiceKey::new("default", name))?;
        Some(
            route
                .endpoints
                .iter()
                .map(|e| {
                    let c = e.endpoint.conditions;
                    (e.endpoint.id.clone(), c.ready, c.serving, c.terminating)
                })
                .collect(),
        )
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let result = tokio::time::timeout(Duration::from_secs(10), &mut self.task)
            .await
            .expect("discovery stops on shutdown");
        result.expect("discovery task").expect("discovery run");
    }
}

/// Poll until `check` holds, failing after `within` with `what`.
async fn eventually(what: &str, within: Duration, mut check: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    loop {
        if check() {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "timed out after {within:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn apply<K>(api: &Api<K>, name: &str, object: Value)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.patch(
        name,
        &PatchParams::apply("proxima-test").force(),
        &Patch::Apply(object),
    )
    .await
    .unwrap_or_else(|e| panic!("apply {name}: {e}"));
}

fn service(name: &str, annotations: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "default", "annotations": annotations},
        "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
    })
}

fn endpoint(pod: &str, ip: &str, ready: bool, serving: bool, terminating: bool) -> Value {
    json!({
        "addresses": [ip], "nodeName": "n1", "zone": "zone-a",
        "targetRef": {"kind": "Pod", "name": pod, "namespace": "default"},
        "conditions": {"ready": ready, "serving": serving, "terminating": terminating},
    })
}

fn slice(name: &str, service: &str, endpoints: Value) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "default", "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": endpoints,
    })
}

struct Apis {
    services: Api<Service>,
    slices: Api<EndpointSlice>,
    nodes: Api<Node>,
    events: Api<K8sEvent>,
}

impl Apis {
    fn new(client: &Client) -> Self {
        Apis {
            services: Api::namespaced(client.clone(), "default"),
            slices: Api::namespaced(client.clone(), "default"),
            nodes: Api::all(client.clone()),
            events: Api::namespaced(client.clone(), "default"),
        }
    }

    async fn invalid_annotation_events(&self, service: &str) -> Vec<K8sEvent> {
        self.events
            .list(&ListParams::default())
            .await
            .expect("list events")
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(EVENT_REASON))
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(service))
            .collect()
    }

    /// The cluster at the start of each test: node n1, Service `api` (opted in) with two
    /// ready pods, Service `plain` (not opted in) with one.
    async fn populate(&self) {
        apply(
            &self.nodes,
            "n1",
            json!({"apiVersion": "v1", "kind": "Node",
                   "metadata": {"name": "n1", "labels": {"topology.kubernetes.io/zone": "zone-a"}}}),
        )
        .await;
        apply(
            &self.services,
            "api",
            service(
                "api",
                json!({"proxima.io/enabled": "true", "proxima.io/latency-slo": "80ms"}),
            ),
        )
        .await;
        apply(&self.services, "plain", service("plain", json!({}))).await;
        apply(
            &self.slices,
            "api-1",
            slice(
                "api-1",
                "api",
                json!([
                    endpoint("p1", "198.51.100.1", true, true, false),
                    endpoint("p2", "198.51.100.2", true, true, false)
                ]),
            ),
        )
        .await;
        apply(
            &self.slices,
            "plain-1",
            slice(
                "plain-1",
                "plain",
                json!([endpoint("q1", "198.51.100.3", true, true, false)]),
            ),
        )
        .await;
    }
}

fn ids(endpoints: &Option<Vec<(String, bool, bool, bool)>>) -> Vec<&str> {
    endpoints
        .iter()
        .flatten()
        .map(|(id, ..)| id.as_str())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_follows_the_api_server() {
    init_logs();
    let cluster = Cluster::start().await;
    let client = cluster.client().await;
    let apis = Apis::new(&client);
    apis.populate().await;

    let config = K8sConfig {
        publish_events: true,
        instance: Some("n1".into()),
        ..K8sConfig::default()
    };
    let running = Running::start(client.clone(), config);
    eventually("the first sync", SYNC, || {
        running.synced.load(Ordering::SeqCst)
    })
    .await;
    assert!(running.status.synced() && running.status.connected());
    let table = running.router.table();
    assert_eq!(table.nodes["n1"].zone.as_deref(), Some("zone-a"));
    let api = &table.services[&ServiceKey::new("default", "api")];
    assert_eq!(api.settings().latency_slo, Duration::from_millis(80));
    assert_eq!(api.spec.ports[0].port, 80);
    assert_eq!(api.endpoints[0].endpoint.port("http"), Some(8080));
    assert_eq!(api.endpoints[0].endpoint.zone.as_deref(), Some("zone-a"));
    assert_eq!(ids(&running.endpoints("api")), ["p1", "p2"]);
    assert!(
        running.endpoints("plain").is_none(),
        "not opted in: not routed"
    );

    // A pod turns un-ready.
    apply(
        &apis.slices,
        "api-1",
        slice(
            "api-1",
            "api",
            json!([
                endpoint("p1", "198.51.100.1", true, true, false),
                endpoint("p2", "198.51.100.2", false, false, false)
            ]),
        ),
    )
    .await;
    let took = eventually("p2 un-ready", PROPAGATION, || {
        running
            .endpoints("api")
            .is_some_and(|e| e[1] == ("p2".into(), false, false, false))
    })
    .await;
    eprintln!("un-ready propagated in {took:?}");

    // A second slice joins.
    apply(
        &apis.slices,
        "api-2",
        slice(
            "api-2",
            "api",
            json!([endpoint("p3", "198.51.100.4", true, true, false)]),
        ),
    )
    .await;
    eventually("p3 joins", PROPAGATION, || {
        ids(&running.endpoints("api")) == ["p1", "p2", "p3"]
    })
    .await;

    // p1 terminates (still serving), p3's slice goes away.
    apply(
        &apis.slices,
        "api-1",
        slice(
            "api-1",
            "api",
            json!([
                endpoint("p1", "198.51.100.1", false, true, true),
                endpoint("p2", "198.51.100.2", false, false, false)
            ]),
        ),
    )
    .await;
    apis.slices
        .delete("api-2", &DeleteParams::default())
        .await
        .expect("delete slice");
    let took = eventually("p1 terminating, p3 gone", PROPAGATION, || {
        running
            .endpoints("api")
            .is_some_and(|e| e.len() == 2 && e[0] == ("p1".into(), false, true, true))
    })
    .await;
    eprintln!("terminating and slice deletion propagated in {took:?}");
    assert!(running.router.table().services[&ServiceKey::new("default", "api")].only_terminating());

    // Opting `plain` in routes it with the endpoints it already had.
    apply(
        &apis.services,
        "plain",
        service("plain", json!({"proxima.io/enabled": "true"})),
    )
    .await;
    eventually("plain opted in", PROPAGATION, || {
        ids(&running.endpoints("plain")) == ["q1"]
    })
    .await;

    // The Service is deleted.
    apis.services
        .delete("api", &DeleteParams::default())
        .await
        .expect("delete service");
    eventually("api removed", PROPAGATION, || {
        running.endpoints("api").is_none()
    })
    .await;

    // An invalid annotation: the Service is routed on defaults and one Event says why,
    // not one per resync.
    apply(
        &apis.services,
        "plain",
        service(
            "plain",
            json!({"proxima.io/enabled": "true", "proxima.io/latency-slo": "80"}),
        ),
    )
    .await;
    let mut events = Vec::new();
    let deadline = Instant::now() + PROPAGATION;
    while events.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        events = apis.invalid_annotation_events("plain").await;
    }
    assert_eq!(events.len(), 1, "{events:?}");
    let note = events[0].note.clone().unwrap_or_default();
    assert!(
        note.contains("proxima.io/latency-slo") && note.contains("80ms"),
        "{note}"
    );
    assert_eq!(events[0].type_.as_deref(), Some("Warning"));
    assert_eq!(events[0].reporting_instance.as_deref(), Some("n1"));
    // An unrelated change to the Service is an update event with the same bad value.
    let mut with_label = service(
        "plain",
        json!({"proxima.io/enabled": "true", "proxima.io/latency-slo": "80"}),
    );
    with_label["metadata"]["labels"] = json!({"team": "a"});
    apply(&apis.services, "plain", with_label).await;
    apply(
        &apis.slices,
        "plain-1",
        slice(
            "plain-1",
            "plain",
            json!([endpoint("q2", "198.51.100.5", true, true, false)]),
        ),
    )
    .await;
    eventually("q2 replaces q1", PROPAGATION, || {
        ids(&running.endpoints("plain")) == ["q2"]
    })
    .await;
    assert_eq!(apis.invalid_annotation_events("plain").await.len(), 1);
    let settings = running.router.table().services[&ServiceKey::new("default", "plain")]
        .settings()
        .clone();
    assert_eq!(
        settings.latency_slo,
        Duration::from_millis(100),
        "default kept"
    );

    // Nodes change too.
    apis.nodes
        .delete("n1", &DeleteParams::default())
        .await
        .expect("delete node");
    eventually("n1 removed", PROPAGATION, || {
        running.router.table().nodes.is_empty()
    })
    .await;

    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ports_are_mapped_per_slice_and_every_settings_problem_is_shown() {
    init_logs();
    let cluster = Cluster::start().await;
    let client = cluster.client().await;
    let apis = Apis::new(&client);
    apis.populate().await;
    apply(
        &apis.services,
        "multi",
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "multi", "namespace": "default", "annotations": {
                "proxima.io/enabled": "true",
                "proxima.io/latency-slo": "soon",
                "proxima.io/retries": "99",
            }},
            "spec": {"ports": [
                {"name": "http", "port": 80, "targetPort": "web"},
                {"name": "metrics", "port": 9090, "targetPort": 9100},
            ]},
        }),
    )
    .await;
    let with_ports = |name: &str, ports: Value, endpoints: Value| {
        json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": name, "namespace": "default",
                         "labels": {"kubernetes.io/service-name": "multi"}},
            "addressType": "IPv4",
            "ports": ports,
            "endpoints": endpoints,
        })
    };
    // m1 does not declare the `web` targetPort: its slice lists only metrics.
    apply(
        &apis.slices,
        "multi-a",
        with_ports(
            "multi-a",
            json!([{"name": "metrics", "port": 9100, "protocol": "TCP"}]),
            json!([endpoint("m1", "198.51.100.11", true, true, false)]),
        ),
    )
    .await;
    apply(
        &apis.slices,
        "multi-b",
        with_ports(
            "multi-b",
            json!([{"name": "http", "port": 8080, "protocol": "TCP"},
                   {"name": "metrics", "port": 9100, "protocol": "TCP"}]),
            json!([endpoint("m2", "198.51.100.12", true, true, false)]),
        ),
    )
    .await;
    // One address (no pod reference) in two mirrored slices, one port set each.
    for (name, port) in [
        ("multi-m-http", ("http", 8081)),
        ("multi-m-metrics", ("metrics", 9101)),
    ] {
        apply(
            &apis.slices,
            name,
            with_ports(
                name,
                json!([{"name": port.0, "port": port.1, "protocol": "TCP"}]),
                json!([{"addresses": ["198.51.100.13"], "conditions": {"ready": true}}]),
            ),
        )
        .await;
    }

    let running = Running::start(client.clone(), K8sConfig::default());
    eventually("multi with its three endpoints", SYNC, || {
        running.endpoints("multi").is_some_and(|e| e.len() == 3)
    })
    .await;
    let key = ServiceKey::new("default", "multi");
    let mut rng = <rand::rngs::SmallRng as rand::SeedableRng>::seed_from_u64(3);
    let mut http = std::collections::BTreeSet::new();
    let mut metrics = std::collections::BTreeSet::new();
    for _ in 0..200 {
        for (port, seen) in [("http", &mut http), ("metrics", &mut metrics)] {
            let picked = running
                .router
                .pick(
                    &key,
                    Some(PortRef::Name(port)),
                    Instant::now(),
                    &mut rng,
                    &[],
                )
                .expect("a candidate");
            seen.insert(picked.addr.to_string());
        }
    }
    assert_eq!(
        http.into_iter().collect::<Vec<_>>(),
        ["198.51.100.12:8080", "198.51.100.13:8081"],
        "svc:http never goes to a metrics port"
    );
    assert_eq!(
        metrics.into_iter().collect::<Vec<_>>(),
        [
            "198.51.100.11:9100",
            "198.51.100.12:9100",
            "198.51.100.13:9101"
        ],
    );

    let explain = running.router.explain(Instant::now());
    let multi = explain
        .services
        .iter()
        .find(|s| s.service == "multi.default")
        .expect("multi explained");
    for key in ["latency-slo", "retries"] {
        assert!(
            multi
                .warnings
                .iter()
                .any(|w| w.contains(&format!("`{key}`"))),
            "{key} missing from {:?}",
            multi.warnings
        );
    }
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_survives_an_api_server_restart() {
    init_logs();
    let mut cluster = Cluster::start().await;
    let client = cluster.client().await;
    let apis = Apis::new(&client);
    apis.populate().await;

    let running = Running::start(client.clone(), K8sConfig::default());
    eventually("the first sync", SYNC, || {
        running.synced.load(Ordering::SeqCst)
    })
    .await;
    assert_eq!(ids(&running.endpoints("api")), ["p1", "p2"]);

    cluster.stop_apiserver();
    eventually("connectivity lost", SYNC, || !running.status.connected()).await;
    // The router keeps routing on what it knew.
    assert_eq!(ids(&running.endpoints("api")), ["p1", "p2"]);

    cluster.start_apiserver().await;
    // From here: the API server answers again. A change written now is routed once the
    // watches have retried (backoff capped at 1 s ±50%) and resumed or re-listed.
    let back = Instant::now();
    let client = cluster.client().await;
    let apis = Apis::new(&client);
    apply(
        &apis.slices,
        "api-1",
        slice(
            "api-1",
            "api",
            json!([endpoint("p9", "198.51.100.9", true, true, false)]),
        ),
    )
    .await;
    eventually("p9 after the restart", SYNC, || {
        ids(&running.endpoints("api")) == ["p9"]
    })
    .await;
    let routed_after = back.elapsed();
    eprintln!("a change written as the API server came back was routed after {routed_after:?}");
    // Generous for a loaded machine; the 30 s cap of kube-runtime's default backoff (or
    // the 4 s one before) would show here.
    assert!(routed_after < Duration::from_secs(10), "{routed_after:?}");
    eventually("connectivity back", SYNC, || running.status.connected()).await;
    assert!(running.status.watch_errors() > 0);
    apis.services
        .delete("api", &DeleteParams::default())
        .await
        .expect("delete service");
    eventually("api removed after the restart", SYNC, || {
        running.endpoints("api").is_none()
    })
    .await;

    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubeconfig_file_gives_a_working_client_and_namespaces_limit_the_watch() {
    init_logs();
    let cluster = Cluster::start().await;
    let client = proxima_k8s::client(Some(cluster.kubeconfig()))
        .await
        .expect("client from kubeconfig");
    let apis = Apis::new(&client);
    apis.populate().await;
    let other: Api<Service> = Api::namespaced(client.clone(), "kube-system");
    let mut svc = service("elsewhere", json!({"proxima.io/enabled": "true"}));
    svc["metadata"]["namespace"] = json!("kube-system");
    apply(&other, "elsewhere", svc).await;

    let config = K8sConfig {
        namespaces: vec!["default".into()],
        ..K8sConfig::default()
    };
    let running = Running::start(client, config);
    eventually("the first sync", SYNC, || {
        running.synced.load(Ordering::SeqCst)
    })
    .await;
    let table = running.router.table();
    assert!(table
        .services
        .contains_key(&ServiceKey::new("default", "api")));
    assert!(!table
        .services
        .contains_key(&ServiceKey::new("kube-system", "elsewhere")));
    running.stop().await;

    let missing = proxima_k8s::client(Some(std::path::Path::new("/nonexistent/kubeconfig"))).await;
    let Err(error) = missing else {
        panic!("a client from a missing kubeconfig");
    };
    let error = error.to_string();
    assert!(error.contains("/nonexistent/kubeconfig"), "{error}");
}
