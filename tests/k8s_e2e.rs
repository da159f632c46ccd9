//! `proxima run --discovery kube` end to end: a real etcd and kube-apiserver v1.31.4
//! (tests/k8s/provision.sh provides them), the real `proxima` binary, emulated pods
//! (proxima_emulate backends) and a real HTTP client.
//!
//! There is no kubelet or EndpointSlice controller: the test writes Nodes, Services and
//! EndpointSlices itself, as those controllers would when pods start, fail their
//! readiness probe, terminate and go. Every change must reach the proxy's routing within
//! one second of the API write returning (Kubernetes' own endpoint propagation is
//! typically that fast; the watch itself takes milliseconds). The API server rejects
//! loopback addresses in EndpointSlices, so the traffic test runs in its own network
//! namespace (tests/k8s/netns.rs) where the pods listen on 10.250.0.x.
//!
//! Needs the binary: `cargo build -p proxima` first.

#[path = "k8s/harness.rs"]
mod harness;
#[path = "k8s/support.rs"]
mod k8s_support;
#[path = "k8s/netns.rs"]
mod netns;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use http::StatusCode;
use proxima_emulate::{Backend, BackendConfig};
use serde_json::json;

use harness::{eventually, pool_endpoint, pool_ids, Http, Objects, Pod, PodState, Proxima};
use k8s_support::Cluster;

/// The deadline for a change written to the API server to take effect in the proxy.
const PROPAGATION: Duration = Duration::from_secs(1);
/// Deadline for things that wait on timers (connectivity probes, watch backoff).
const SLOW: Duration = Duration::from_secs(60);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

#[test]
fn proxima_follows_the_kubernetes_api() {
    let Some(hosts) = netns::isolated("proxima_follows_the_kubernetes_api") else {
        return;
    };
    runtime().block_on(follows_the_api(hosts));
}

/// The emulated pods of the test, by name.
struct Pods {
    hosts: Vec<IpAddr>,
    running: BTreeMap<String, Backend>,
}

impl Pods {
    /// Pod `web-<i>` on host `i` (10.250.0.i), on node n1 or n2.
    fn pod(&self, i: usize) -> Pod {
        let (node, zone) = if i % 2 == 1 {
            ("n1", "zone-a")
        } else {
            ("n2", "zone-b")
        };
        Pod::new(&format!("web-{i}"), self.hosts[i - 1], node, zone)
    }

    async fn start(&mut self, pod: &Pod, delay: Duration) {
        let backend = Backend::spawn(pod.addr(), BackendConfig::new(&pod.name).delay(delay))
            .await
            .unwrap_or_else(|e| panic!("start pod {} on {}: {e}", pod.name, pod.addr()));
        self.running.insert(pod.name.clone(), backend);
    }

    fn hits(&self, name: &str) -> u64 {
        self.running[name].hits()
    }
}

fn sorted(mut ids: Vec<String>) -> Vec<String> {
    ids.sort();
    ids
}

/// Record and print how long a change took to take effect.
struct Timings(Vec<(String, Duration)>);

impl Timings {
    fn took(&mut self, what: &str, took: Duration) {
        eprintln!("[k8s_e2e] {what}: {took:?}");
        self.0.push((what.to_string(), took));
    }
}

async fn follows_the_api(hosts: Vec<IpAddr>) {
    let test_start = Instant::now();
    let mut cluster = Cluster::start().await;
    eprintln!("[k8s_e2e] control plane up in {:?}", test_start.elapsed());
    let k8s = Objects::new(&cluster.client().await);
    let http = Http::new();
    let mut timings = Timings(Vec::new());
    let mut pods = Pods {
        hosts,
        running: BTreeMap::new(),
    };

    k8s.node("n1", "zone-a").await;
    k8s.node("n2", "zone-b").await;
    for i in 1..=4 {
        let pod = pods.pod(i);
        pods.start(&pod, Duration::ZERO).await;
    }
    k8s.service(
        "web",
        json!({"proxima.io/enabled": "true", "proxima.io/latency-slo": "80ms"}),
    )
    .await;
    k8s.slice("web-a", "web", &[pods.pod(1), pods.pod(2)]).await;
    // A Service that did not opt in, with a live pod of its own.
    let plain_pod = Pod::new("plain-1", pods.hosts[9], "n1", "zone-a");
    pods.start(&plain_pod, Duration::ZERO).await;
    k8s.service("plain", json!({})).await;
    k8s.slice("plain-a", "plain", &[plain_pod]).await;
    // Opted in by a label (--service-selector), and one in a namespace not watched.
    let tagged_pod = Pod::new("tagged-1", pods.hosts[10], "n1", "zone-a");
    pods.start(&tagged_pod, Duration::ZERO).await;
    k8s.service_in("default", "tagged", json!({"proxima": "on"}), json!({}))
        .await;
    k8s.slice("tagged-a", "tagged", &[tagged_pod]).await;
    let elsewhere_pod = Pod::new("elsewhere-1", pods.hosts[11], "n1", "zone-a");
    pods.start(&elsewhere_pod, Duration::ZERO).await;
    k8s.service_in(
        "kube-system",
        "elsewhere",
        json!({}),
        json!({"proxima.io/enabled": "true"}),
    )
    .await;
    k8s.slice_in("kube-system", "elsewhere-a", "elsewhere", &[elsewhere_pod])
        .await;

    // A Service whose port is declared h2c: its pod (serving both) gets HTTP/2.
    let h2_pod = Pod::new("h2-1", pods.hosts[12], "n1", "zone-a");
    pods.start(&h2_pod, Duration::ZERO).await;
    k8s.service_speaking(
        "default",
        "h2",
        json!({}),
        json!({"proxima.io/enabled": "true"}),
        "kubernetes.io/h2c",
    )
    .await;
    k8s.slice("h2-a", "h2", &[h2_pod]).await;

    let mut proxima = Proxima::start(
        cluster.kubeconfig(),
        "n1",
        &[
            "--service-selector",
            "proxima=on",
            "--namespaces",
            "default",
        ],
    )
    .await;
    let (proxy, admin) = (proxima.proxy, proxima.admin);
    eprintln!("[k8s_e2e] proxima ready at {:?}", test_start.elapsed());
    assert_eq!(
        http.status(&format!("http://{admin}/readyz")).await,
        StatusCode::OK
    );
    assert_eq!(
        http.metric(admin, "proxima_kube_api_connected").await,
        Some(1.0)
    );

    // Routing by x-service, to both pods.
    let spread = http.spread(proxy, "web", 30).await;
    assert!(spread.failures.is_empty(), "{:?}", spread.failures);
    assert_eq!(
        spread.by_pod.keys().collect::<Vec<_>>(),
        ["web-1", "web-2"],
        "{spread:?}"
    );
    let reply = http.call(proxy, "web.default").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let pool = http.pool(admin, "web").await.expect("web in /debug/pools");
    assert_eq!(pool["latency_slo_ms"], 80.0);
    assert_eq!(pool["strategy"], "qos-pool");
    assert_eq!(pool_endpoint(&pool, "web-1").unwrap()["node"], "n1");
    assert_eq!(pool_endpoint(&pool, "web-1").unwrap()["zone"], "zone-a");
    // The Service port's appProtocol, read through the API server.
    let port = &pool_endpoint(&pool, "web-1").unwrap()["ports"][0];
    assert_eq!(port["app_protocol"], "http", "{port}");
    assert_eq!(port["protocol_from"], "service-app-protocol", "{port}");
    assert_eq!(port["protocol"], "http1", "{port}");
    let reply = http.call(proxy, "h2").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert!(
        reply.body.contains(r#""version":"HTTP/2.0""#),
        "{}",
        reply.body
    );
    let pool = http.pool(admin, "h2").await.expect("h2 in /debug/pools");
    let port = &pool_endpoint(&pool, "h2-1").unwrap()["ports"][0];
    assert_eq!(port["protocol"], "h2c", "{port}");
    assert_eq!(port["app_protocol"], "kubernetes.io/h2c", "{port}");

    // Not opted in: not routed, although its pod is up.
    let reply = http.call(proxy, "plain").await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND, "{}", reply.body);
    assert_eq!(pods.hits("plain-1"), 0);
    let reply = http.call(proxy, "tagged").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(reply.backend.as_deref(), Some("tagged-1"));
    let reply = http.call(proxy, "elsewhere.kube-system").await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND, "{}", reply.body);
    assert_eq!(pods.hits("elsewhere-1"), 0);

    // A pod joins: traffic reaches it.
    k8s.slice("web-a", "web", &[pods.pod(1), pods.pod(2), pods.pod(3)])
        .await;
    let took = eventually("web-3 serves", PROPAGATION, || async {
        http.call(proxy, "web").await.backend.as_deref() == Some("web-3")
    })
    .await;
    timings.took("endpoint added", took);

    // A pod leaves: no request reaches it, although it still runs.
    k8s.slice("web-a", "web", &[pods.pod(2), pods.pod(3)]).await;
    let took = eventually("web-1 gone from the pool", PROPAGATION, || async {
        http.pool(admin, "web")
            .await
            .is_some_and(|p| sorted(pool_ids(&p)) == ["web-2", "web-3"])
    })
    .await;
    timings.took("endpoint removed", took);
    let before = pods.hits("web-1");
    let spread = http.spread(proxy, "web", 30).await;
    assert!(spread.failures.is_empty(), "{:?}", spread.failures);
    assert_eq!(spread.count("web-1"), 0, "{spread:?}");
    assert_eq!(pods.hits("web-1"), before);

    // A pod fails its readiness probe: no traffic.
    k8s.slice(
        "web-a",
        "web",
        &[pods.pod(2).with_state(PodState::NotReady), pods.pod(3)],
    )
    .await;
    let took = eventually("web-2 not ready", PROPAGATION, || async {
        http.pool(admin, "web").await.is_some_and(|p| {
            pool_endpoint(&p, "web-2").is_some_and(|e| e["ready"] == false && e["in_pool"] == false)
        })
    })
    .await;
    timings.took("endpoint un-ready", took);
    let spread = http.spread(proxy, "web", 30).await;
    assert!(spread.failures.is_empty(), "{:?}", spread.failures);
    assert_eq!(spread.count("web-3"), 30, "{spread:?}");

    // A pod terminates (still serving) while another is ready: the ready one takes it all.
    k8s.slice(
        "web-a",
        "web",
        &[
            pods.pod(2).with_state(PodState::NotReady),
            pods.pod(3).with_state(PodState::Terminating),
            pods.pod(4),
        ],
    )
    .await;
    let took = eventually("web-3 terminating, web-4 serving", PROPAGATION, || async {
        http.pool(admin, "web").await.is_some_and(|p| {
            pool_endpoint(&p, "web-3").is_some_and(|e| e["terminating"] == true)
                && pool_endpoint(&p, "web-4").is_some_and(|e| e["in_pool"] == true)
        })
    })
    .await;
    timings.took("endpoint terminating", took);
    let spread = http.spread(proxy, "web", 30).await;
    assert!(spread.failures.is_empty(), "{:?}", spread.failures);
    assert_eq!(spread.count("web-4"), 30, "{spread:?}");
    // ... and when nothing else is ready, the terminating pod still serves.
    k8s.slice(
        "web-a",
        "web",
        &[
            pods.pod(2).with_state(PodState::NotReady),
            pods.pod(3).with_state(PodState::Terminating),
            pods.pod(4).with_state(PodState::NotReady),
        ],
    )
    .await;
    let took = eventually("only terminating web-3 serves", PROPAGATION, || async {
        http.call(proxy, "web").await.backend.as_deref() == Some("web-3")
    })
    .await;
    timings.took("only a terminating endpoint left", took);
    let pool = http.pool(admin, "web").await.unwrap();
    assert_eq!(pool["only_terminating"], true, "{pool:#}");
    let spread = http.spread(proxy, "web", 10).await;
    assert!(spread.failures.is_empty(), "{:?}", spread.failures);
    assert_eq!(spread.count("web-3"), 10, "{spread:?}");

    // Three fast pods and a slow one (150 ms, over the 80 ms SLO): the QoS pool drops
    // the slow one once it has measured it.
    let slow = pods.pod(5);
    pods.start(&slow, Duration::from_millis(150)).await;
    let four = [pods.pod(2), pods.pod(3), pods.pod(4), pods.pod(5)];
    k8s.slice("web-a", "web", &four).await;
    let took = eventually("four ready pods", PROPAGATION, || async {
        http.pool(admin, "web")
            .await
            .is_some_and(|p| p["eligible"] == 4)
    })
    .await;
    timings.took("endpoints ready again", took);
    eventually("slow web-5 leaves the QoS pool", SLOW, || async {
        http.call(proxy, "web").await;
        http.pool(admin, "web")
            .await
            .is_some_and(|p| pool_endpoint(&p, "web-5").is_some_and(|e| e["in_pool"] == false))
    })
    .await;
    let qos_spread = http.spread(proxy, "web", 40).await;
    assert!(qos_spread.failures.is_empty(), "{:?}", qos_spread.failures);
    assert_eq!(qos_spread.count("web-5"), 0, "{qos_spread:?}");

    // Round robin: every ready pod in turn, the slow one included.
    k8s.service(
        "web",
        json!({"proxima.io/enabled": "true", "proxima.io/latency-slo": "80ms",
               "proxima.io/strategy": "round-robin"}),
    )
    .await;
    let took = eventually("strategy round-robin", PROPAGATION, || async {
        http.pool(admin, "web")
            .await
            .is_some_and(|p| p["strategy"] == "round-robin")
    })
    .await;
    timings.took("strategy annotation changed", took);
    let rr_spread = http.spread(proxy, "web", 40).await;
    assert!(rr_spread.failures.is_empty(), "{:?}", rr_spread.failures);
    for pod in ["web-2", "web-3", "web-4", "web-5"] {
        let n = rr_spread.count(pod);
        assert!((8..=12).contains(&n), "{pod} got {n} of 40: {rr_spread:?}");
    }
    // A strategy plugin, switched live: `local` keeps traffic on this proxy's node (n1:
    // web-3 and web-5), round robin among them (KubeEdge §4.2).
    k8s.service(
        "web",
        json!({"proxima.io/enabled": "true", "proxima.io/latency-slo": "80ms",
               "proxima.io/strategy": "local", "proxima.io/local-fallback": "reject"}),
    )
    .await;
    let took = eventually("strategy local", PROPAGATION, || async {
        http.pool(admin, "web")
            .await
            .is_some_and(|p| p["strategy"] == "local")
    })
    .await;
    timings.took("strategy switched to the local plugin", took);
    let local_spread = http.spread(proxy, "web", 40).await;
    assert!(
        local_spread.failures.is_empty(),
        "{:?}",
        local_spread.failures
    );
    assert_eq!(local_spread.count("web-3"), 20, "{local_spread:?}");
    assert_eq!(local_spread.count("web-5"), 20, "{local_spread:?}");
    eprintln!(
        "[k8s_e2e] 40 requests: qos-pool {:?}, round-robin {:?}, local {:?}",
        qos_spread.by_pod, rr_spread.by_pod, local_spread.by_pod
    );

    // The SLO annotation changes.
    k8s.service(
        "web",
        json!({"proxima.io/enabled": "true", "proxima.io/latency-slo": "200ms",
               "proxima.io/strategy": "round-robin"}),
    )
    .await;
    let took = eventually("latency SLO 200 ms", PROPAGATION, || async {
        http.pool(admin, "web")
            .await
            .is_some_and(|p| p["latency_slo_ms"] == 200.0)
    })
    .await;
    timings.took("latency-slo annotation changed", took);

    // An invalid annotation: an Event on the Service, and routing on defaults.
    k8s.service(
        "web",
        json!({"proxima.io/enabled": "true", "proxima.io/latency-slo": "fast"}),
    )
    .await;
    let took = eventually(
        "defaults after an invalid annotation",
        PROPAGATION,
        || async {
            http.pool(admin, "web")
                .await
                .is_some_and(|p| p["latency_slo_ms"] == 100.0 && p["strategy"] == "qos-pool")
        },
    )
    .await;
    timings.took("invalid annotation -> defaults", took);
    let took = eventually("an InvalidAnnotation Event", SLOW, || async {
        !k8s.events_about("web", proxima_k8s::EVENT_REASON)
            .await
            .is_empty()
    })
    .await;
    timings.took("InvalidAnnotation Event published", took);
    let events = k8s.events_about("web", proxima_k8s::EVENT_REASON).await;
    let note = events[0].note.clone().unwrap_or_default();
    assert!(
        note.contains("proxima.io/latency-slo") && note.contains("fast"),
        "{note}"
    );
    assert_eq!(events[0].type_.as_deref(), Some("Warning"));
    assert_eq!(events[0].reporting_instance.as_deref(), Some("n1"));
    assert!(proxima.has_log("invalid annotation"), "{}", proxima.logs());
    let spread = http.spread(proxy, "web", 20).await;
    assert!(spread.failures.is_empty(), "{:?}", spread.failures);

    // The API server goes away: traffic flows, the proxy stays ready, the metric says so.
    cluster.stop_apiserver();
    let down = Instant::now();
    let took = eventually("proxima_kube_api_connected 0", SLOW, || async {
        http.metric(admin, "proxima_kube_api_connected").await == Some(0.0)
    })
    .await;
    timings.took("API server down -> connected 0", took);
    proxima
        .wait_log("Kubernetes API server unreachable", SLOW)
        .await;
    while down.elapsed() < Duration::from_secs(3) {
        let spread = http.spread(proxy, "web", 10).await;
        assert!(spread.failures.is_empty(), "{:?}", spread.failures);
        assert_eq!(
            http.status(&format!("http://{admin}/readyz")).await,
            StatusCode::OK
        );
    }

    // It comes back: the change made after the restart arrives.
    cluster.start_apiserver().await;
    let took = eventually("proxima_kube_api_connected 1", SLOW, || async {
        http.metric(admin, "proxima_kube_api_connected").await == Some(1.0)
    })
    .await;
    timings.took("API server back -> connected 1", took);
    proxima
        .wait_log_after(
            "Kubernetes API server unreachable",
            "Kubernetes API server reachable",
            SLOW,
        )
        .await;
    let errors = http
        .metric(admin, "proxima_kube_watch_errors_total")
        .await
        .unwrap_or(0.0);
    assert!(errors > 0.0, "watch errors while the API server was down");
    let k8s = Objects::new(&cluster.client().await);
    let six = pods.pod(6);
    pods.start(&six, Duration::ZERO).await;
    k8s.slice(
        "web-a",
        "web",
        &[pods.pod(2), pods.pod(3), pods.pod(4), pods.pod(6)],
    )
    .await;
    // The watches resume after their backoff (0.8 s doubling, at most 30 s).
    let took = eventually("web-6 serves after the restart", SLOW, || async {
        http.call(proxy, "web").await.backend.as_deref() == Some("web-6")
    })
    .await;
    timings.took("endpoint added after the API server restart", took);
    let reply = http.call(proxy, "plain").await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND, "{}", reply.body);
    assert!(proxima.running(), "{}", proxima.logs());

    eprintln!(
        "[k8s_e2e] done in {:?}; time from each API write (or API server stop/start) to \
         its effect in the proxy:",
        test_start.elapsed()
    );
    for (what, took) in &timings.0 {
        eprintln!("[k8s_e2e]   {took:>12.3?}  {what}");
    }
    eprintln!("[k8s_e2e] proxima's log:\n{}", proxima.logs());
    for (_, backend) in std::mem::take(&mut pods.running) {
        backend.shutdown().await;
    }
}

/// `kubectl apply --dry-run=server -k deploy/` passes against a real API server, and the
/// ClusterRole it installs is all `proxima run --discovery kube` needs: the proxy,
/// running with the ServiceAccount's own token, syncs and publishes Events.
#[test]
fn the_deploy_manifests_are_accepted_and_their_rbac_suffices() {
    runtime().block_on(deploy_manifests());
}

async fn deploy_manifests() {
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy");
    assert!(
        deploy.join("kustomization.yaml").is_file(),
        "{} is missing",
        deploy.join("kustomization.yaml").display()
    );
    let cluster = Cluster::start().await;
    let kubectl = |args: &[&str]| -> String {
        let output = cluster
            .kubectl()
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("kubectl {args:?}: {e}"));
        let out = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "kubectl {args:?} failed:\n{out}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        out
    };
    let deploy_dir = deploy.to_str().expect("utf-8 path");

    // Namespaced objects can only be validated in an existing namespace (a dry run
    // creates nothing), so the kustomization's Namespaces are created first.
    let rendered = kubectl(&["kustomize", deploy_dir]);
    let mut namespaces = Vec::new();
    let objects: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&rendered).expect("kustomize renders YAML");
    for object in objects {
        if object["kind"] == "Namespace" {
            namespaces.push(object["metadata"]["name"].as_str().unwrap().to_string());
        }
    }
    assert!(!namespaces.is_empty(), "deploy/ creates its namespace");
    for ns in &namespaces {
        kubectl(&["create", "namespace", ns]);
    }
    let out = kubectl(&["apply", "--dry-run=server", "-k", deploy_dir]);
    eprintln!("[k8s_e2e] kubectl apply --dry-run=server -k deploy/:\n{out}");
    for kind in [
        "serviceaccount/",
        "clusterrole.",
        "clusterrolebinding.",
        "daemonset.apps/",
    ] {
        assert!(out.contains(kind), "no {kind} in:\n{out}");
    }

    // For real now, then run the proxy as the DaemonSet's ServiceAccount.
    kubectl(&["apply", "-k", deploy_dir]);
    let sa = kubectl(&[
        "get",
        "daemonset",
        "-A",
        "-o",
        "jsonpath={.items[0].metadata.namespace}/{.items[0].spec.template.spec.serviceAccountName}",
    ]);
    let (sa_namespace, sa_name) = sa.split_once('/').expect("namespace/serviceaccount");
    let token = kubectl(&[
        "create",
        "token",
        "-n",
        sa_namespace,
        sa_name,
        "--duration=1h",
    ]);
    let kubeconfig = cluster.dir().join("serviceaccount.kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    \
             certificate-authority: {}\nusers:\n- name: sa\n  user:\n    token: {}\ncontexts:\n- \
             name: c\n  context:\n    cluster: c\n    user: sa\ncurrent-context: c\n",
            cluster.server(),
            cluster.certificate().display(),
            token.trim()
        ),
    )
    .expect("write kubeconfig");
    let k8s = Objects::new(&cluster.client().await);
    k8s.service(
        "rbac-check",
        json!({"proxima.io/enabled": "true", "proxima.io/timeout": "soon"}),
    )
    .await;

    let proxima = Proxima::start(&kubeconfig, "n1", &[]).await;
    let http = Http::new();
    assert_eq!(
        http.status(&format!("http://{}/readyz", proxima.admin))
            .await,
        StatusCode::OK
    );
    eventually(
        "an Event published with the ServiceAccount",
        SLOW,
        || async {
            !k8s.events_about("rbac-check", proxima_k8s::EVENT_REASON)
                .await
                .is_empty()
        },
    )
    .await;
    let logs = proxima.logs();
    assert!(
        !logs.contains("forbidden") && !logs.contains("Forbidden"),
        "{logs}"
    );
    // The same binary with --no-events publishes none.
    drop(proxima);
    k8s.service(
        "quiet",
        json!({"proxima.io/enabled": "true", "proxima.io/timeout": "soon"}),
    )
    .await;
    let mut proxima = Proxima::start(&kubeconfig, "n1", &["--no-events"]).await;
    proxima.wait_log("invalid annotation", SLOW).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(k8s
        .events_about("quiet", proxima_k8s::EVENT_REASON)
        .await
        .is_empty());
}
