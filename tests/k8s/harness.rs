//! What the Kubernetes end-to-end tests (tests/k8s_e2e.rs, tests/k8s_rollout.rs) share:
//! the real `proxima` binary run with `--discovery kube`, a plain HTTP client for its
//! proxy and admin ports, and builders for the Nodes, Services and EndpointSlices the
//! tests write (there is no kubelet or EndpointSlice controller: the test is both).
//!
//! Include it with `#[path = "k8s/harness.rs"] mod harness;` next to `k8s/support.rs`.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::future::Future;
use std::io::{BufRead, BufReader};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use kube::api::{ListParams, Patch, PatchParams};
use kube::Api;
use serde_json::{json, Value};

/// Longest wait for anything that has no tighter bound, before failing instead of hanging.
pub const PATIENCE: Duration = Duration::from_secs(60);
/// The port every emulated pod listens on (each pod has its own address).
pub const POD_PORT: u16 = 8080;

// ---- the proxima binary -----------------------------------------------------------

#[path = "../support/binary.rs"]
mod binary;

/// `target/<profile>/proxima`, built by `cargo build -p proxima`.
pub fn proxima_binary() -> PathBuf {
    binary::binary()
}

/// A running `proxima run --discovery kube`, its log collected line by line. Killed
/// when dropped.
pub struct Proxima {
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
    pub proxy: SocketAddr,
    pub admin: SocketAddr,
}

impl Proxima {
    /// Start it on ephemeral loopback ports with `kubeconfig`, as node `node`, and wait
    /// until it says it is ready (after its first sync with the API server).
    pub async fn start(kubeconfig: &Path, node: &str, extra: &[&str]) -> Proxima {
        let mut child = Command::new(proxima_binary())
            .args(["run", "--discovery", "kube", "--kubeconfig"])
            .arg(kubeconfig)
            .args(["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
            .args(extra)
            .env("NODE_NAME", node)
            .env("PROXIMA_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("proxima starts");
        let log = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().expect("stderr");
        std::thread::spawn({
            let log = log.clone();
            move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    log.lock().unwrap().push(line);
                }
            }
        });
        let unbound = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
        let mut proxima = Proxima {
            child,
            log,
            proxy: unbound,
            admin: unbound,
        };
        let ready = proxima.wait_log("proxima is ready", PATIENCE).await;
        proxima.proxy = log_field(&ready, "proxy");
        proxima.admin = log_field(&ready, "admin");
        proxima
    }

    pub fn logs(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    pub fn has_log(&self, needle: &str) -> bool {
        self.log.lock().unwrap().iter().any(|l| l.contains(needle))
    }

    /// The first log line containing `needle`, waiting up to `within` for it.
    pub async fn wait_log(&mut self, needle: &str, within: Duration) -> String {
        self.wait_log_after("", needle, within).await
    }

    /// The first log line containing `needle` that follows a line containing `after`.
    pub async fn wait_log_after(&mut self, after: &str, needle: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            let found = {
                let log = self.log.lock().unwrap();
                let start = log.iter().position(|l| l.contains(after));
                start.and_then(|start| log[start..].iter().find(|l| l.contains(needle)).cloned())
            };
            if let Some(line) = found {
                return line;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                tokio::time::sleep(Duration::from_millis(200)).await;
                panic!(
                    "proxima exited ({status}) before logging {needle:?}:\n{}",
                    self.logs()
                );
            }
            assert!(
                Instant::now() < deadline,
                "no log line with {needle:?} (after one with {after:?}) within {within:?}:\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Proxima {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            eprintln!(
                "---- proxima log ----\n{}\n---- end of proxima log ----",
                self.logs()
            );
        }
    }
}

/// `proxy=127.0.0.1:1234` in a text log line.
fn log_field(line: &str, name: &str) -> SocketAddr {
    let key = format!("{name}=");
    line.split_whitespace()
        .find_map(|word| word.strip_prefix(&key))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} address in {line:?}"))
}

// ---- HTTP ---------------------------------------------------------------------------

/// A keep-alive HTTP/1.1 client (hyper), as an application would use.
#[derive(Clone)]
pub struct Http(Client<HttpConnector, Empty<Bytes>>);

/// One answer: status, the `x-backend` header of the emulated pod, the body.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub backend: Option<String>,
    pub body: String,
}

impl Http {
    pub fn new() -> Self {
        // Idle connections are let go before the admin server's 10 s header-read timeout
        // closes them: reusing one just as the server closes it fails the request.
        Http(
            Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(5))
                .build_http(),
        )
    }

    /// `GET url`, naming `service` in `x-service` if given.
    pub async fn get(&self, url: &str, service: Option<&str>) -> Reply {
        let mut request = Request::get(url);
        if let Some(service) = service {
            request = request.header("x-service", service);
        }
        let request = request.body(Empty::new()).expect("request");
        let response = tokio::time::timeout(PATIENCE, self.0.request(request))
            .await
            .unwrap_or_else(|_| panic!("no answer from {url}"))
            .unwrap_or_else(|e| panic!("GET {url}: {e}"));
        let status = response.status();
        let backend = response
            .headers()
            .get("x-backend")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = response
            .into_body()
            .collect()
            .await
            .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
            .unwrap_or_else(|e| format!("<body failed: {e}>"));
        Reply {
            status,
            backend,
            body,
        }
    }

    /// `GET http://<proxy>/` for `service` through the proxy.
    pub async fn call(&self, proxy: SocketAddr, service: &str) -> Reply {
        self.get(&format!("http://{proxy}/"), Some(service)).await
    }

    /// `n` sequential calls; how many answers came from each pod, and the statuses.
    pub async fn spread(&self, proxy: SocketAddr, service: &str, n: usize) -> Spread {
        let mut spread = Spread::default();
        for _ in 0..n {
            let reply = self.call(proxy, service).await;
            spread
                .sequence
                .push(reply.backend.clone().unwrap_or_default());
            if reply.status == StatusCode::OK {
                *spread
                    .by_pod
                    .entry(reply.backend.unwrap_or_default())
                    .or_default() += 1;
            } else {
                spread
                    .failures
                    .push(format!("{}: {}", reply.status, reply.body));
            }
        }
        spread
    }

    /// `/debug/pools?service=<service>`: the service's entry.
    pub async fn pool(&self, admin: SocketAddr, service: &str) -> Option<Value> {
        let reply = self
            .get(
                &format!("http://{admin}/debug/pools?service={service}"),
                None,
            )
            .await;
        if reply.status != StatusCode::OK {
            return None;
        }
        let json: Value = serde_json::from_str(&reply.body).ok()?;
        json["services"].get(0).cloned()
    }

    /// The value of an unlabelled metric from `/metrics`.
    pub async fn metric(&self, admin: SocketAddr, name: &str) -> Option<f64> {
        let reply = self.get(&format!("http://{admin}/metrics"), None).await;
        reply.body.lines().find_map(|line| {
            let (key, value) = line.split_once(' ')?;
            (key == name).then(|| value.trim().parse().ok()).flatten()
        })
    }

    /// The sum of metric `name` over the label sets that contain every one of `labels`
    /// (e.g. `endpoint="web-2"`).
    pub async fn metric_sum(&self, admin: SocketAddr, name: &str, labels: &[&str]) -> f64 {
        let reply = self.get(&format!("http://{admin}/metrics"), None).await;
        reply
            .body
            .lines()
            .filter_map(|line| {
                let rest = line.strip_prefix(name)?;
                let (set, value) = rest.rsplit_once(' ')?;
                let set_ok = set.is_empty() || set.starts_with('{');
                (set_ok && labels.iter().all(|l| set.contains(l)))
                    .then(|| value.parse::<f64>().ok())
                    .flatten()
            })
            .fold(0.0, |sum, v| sum + v)
    }

    pub async fn status(&self, url: &str) -> StatusCode {
        self.get(url, None).await.status
    }
}

/// Where a run of sequential requests went.
#[derive(Debug, Default)]
pub struct Spread {
    /// Successful answers per pod (`x-backend`).
    pub by_pod: BTreeMap<String, usize>,
    /// The pod of each answer in order ("" when there was none).
    pub sequence: Vec<String>,
    pub failures: Vec<String>,
}

impl Spread {
    pub fn count(&self, pod: &str) -> usize {
        self.by_pod.get(pod).copied().unwrap_or(0)
    }
}

/// The ids of a `/debug/pools` service entry's endpoints.
pub fn pool_ids(pool: &Value) -> Vec<String> {
    pool["endpoints"]
        .as_array()
        .map(|eps| {
            eps.iter()
                .filter_map(|e| e["id"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The `/debug/pools` entry of endpoint `id`.
pub fn pool_endpoint<'a>(pool: &'a Value, id: &str) -> Option<&'a Value> {
    pool["endpoints"].as_array()?.iter().find(|e| e["id"] == id)
}

// ---- waiting ------------------------------------------------------------------------

/// Poll `check` until it returns true, failing after `within`; returns how long it took.
pub async fn eventually<F, Fut>(what: &str, within: Duration, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if check().await {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "{what}: not within {within:?} (a real API server, watched by the real binary)"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

// ---- Kubernetes objects ----------------------------------------------------------------

/// The state of an emulated pod as its EndpointSlice entry says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodState {
    /// Running and passing its readiness probe.
    Ready,
    /// Failing its readiness probe.
    NotReady,
    /// Being deleted: not ready, but still serving until it exits.
    Terminating,
}

/// One pod of a Service: its name, address, node and the node's zone.
#[derive(Clone, Debug)]
pub struct Pod {
    pub name: String,
    pub ip: IpAddr,
    pub node: String,
    /// Copied from the node's `topology.kubernetes.io/zone`, as the EndpointSlice
    /// controller does.
    pub zone: String,
    pub state: PodState,
}

impl Pod {
    pub fn new(name: &str, ip: IpAddr, node: &str, zone: &str) -> Self {
        Pod {
            name: name.to_string(),
            ip,
            node: node.to_string(),
            zone: zone.to_string(),
            state: PodState::Ready,
        }
    }

    pub fn with_state(mut self, state: PodState) -> Self {
        self.state = state;
        self
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::new(self.ip, POD_PORT)
    }

    fn endpoint(&self, namespace: &str) -> Value {
        let (ready, serving, terminating) = match self.state {
            PodState::Ready => (true, true, false),
            PodState::NotReady => (false, false, false),
            PodState::Terminating => (false, true, true),
        };
        json!({
            "addresses": [self.ip.to_string()],
            "nodeName": self.node,
            "zone": self.zone,
            "targetRef": {"kind": "Pod", "name": self.name, "namespace": namespace},
            "conditions": {"ready": ready, "serving": serving, "terminating": terminating},
        })
    }
}

/// The Kubernetes APIs the tests write to (namespace `default` unless named).
pub struct Objects {
    client: kube::Client,
    pub services: Api<Service>,
    pub slices: Api<EndpointSlice>,
    pub nodes: Api<Node>,
    pub events: Api<K8sEvent>,
}

impl Objects {
    pub fn new(client: &kube::Client) -> Self {
        Objects {
            client: client.clone(),
            services: Api::namespaced(client.clone(), "default"),
            slices: Api::namespaced(client.clone(), "default"),
            nodes: Api::all(client.clone()),
            events: Api::namespaced(client.clone(), "default"),
        }
    }

    pub async fn node(&self, name: &str, zone: &str) {
        apply(
            &self.nodes,
            name,
            json!({"apiVersion": "v1", "kind": "Node",
                   "metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": zone}}}),
        )
        .await;
    }

    /// A Service in `default` with port `http` 80 -> `POD_PORT` and these annotations
    /// (replacing any it had: server-side apply by one field manager).
    pub async fn service(&self, name: &str, annotations: Value) {
        self.service_in("default", name, json!({}), annotations)
            .await;
    }

    /// A Service with labels and annotations in `namespace`.
    pub async fn service_in(&self, namespace: &str, name: &str, labels: Value, annotations: Value) {
        // appProtocol as Kubernetes documents it for cleartext HTTP/1.1.
        self.service_speaking(namespace, name, labels, annotations, "http")
            .await;
    }

    /// A Service whose port declares `app_protocol`.
    pub async fn service_speaking(
        &self,
        namespace: &str,
        name: &str,
        labels: Value,
        annotations: Value,
        app_protocol: &str,
    ) {
        apply(
            &Api::<Service>::namespaced(self.client.clone(), namespace),
            name,
            json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": name, "namespace": namespace, "labels": labels,
                             "annotations": annotations},
                "spec": {"ports": [{"name": "http", "port": 80, "targetPort": POD_PORT,
                                    "appProtocol": app_protocol}]},
            }),
        )
        .await;
    }

    /// EndpointSlice `name` of Service `service` in `default` holding exactly `pods`.
    pub async fn slice(&self, name: &str, service: &str, pods: &[Pod]) {
        self.slice_in("default", name, service, pods).await;
    }

    pub async fn slice_in(&self, namespace: &str, name: &str, service: &str, pods: &[Pod]) {
        let endpoints: Vec<Value> = pods.iter().map(|p| p.endpoint(namespace)).collect();
        apply(
            &Api::<EndpointSlice>::namespaced(self.client.clone(), namespace),
            name,
            json!({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": name, "namespace": namespace,
                             "labels": {"kubernetes.io/service-name": service}},
                "addressType": "IPv4",
                "ports": [{"name": "http", "port": POD_PORT, "protocol": "TCP"}],
                "endpoints": endpoints,
            }),
        )
        .await;
    }

    /// Events with `reason` about Service `service`.
    pub async fn events_about(&self, service: &str, reason: &str) -> Vec<K8sEvent> {
        self.events
            .list(&ListParams::default())
            .await
            .expect("list events")
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(service))
            .collect()
    }
}

/// Server-side apply of `object` (force: the test owns every field).
pub async fn apply<K>(api: &Api<K>, name: &str, object: Value)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.patch(
        name,
        &PatchParams::apply("proxima-e2e").force(),
        &Patch::Apply(object),
    )
    .await
    .unwrap_or_else(|e| panic!("apply {name}: {e}"));
}
