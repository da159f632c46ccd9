//! `--kube`: discovery from a real Kubernetes API server instead of topology files.
//!
//! The testbed starts its own control plane (etcd and kube-apiserver, no kubelet,
//! scheduler or controllers; [`ControlPlane`], a trimmed copy of `tests/k8s/support.rs`)
//! and publishes the emulated cluster as Kubernetes objects: a Node per node (InternalIP
//! = the node's address, labels `proxima.io/admin-port` and the zone), a Service per
//! scenario service (`proxima.io/enabled: "true"` and every setting, strategy included,
//! as a `proxima.io/<key>` annotation), and one EndpointSlice per listed instance (its
//! gate's address and port, node, zone, ready). Each node's router is fed by its own
//! `proxima_k8s` discovery watching that API server. Instances joining, leaving or
//! failing become EndpointSlice writes and deletions ([`Publisher`]).
//!
//! kube-apiserver refuses loopback addresses in EndpointSlices, so `--kube` runs happen
//! in a private network namespace (as `tests/k8s/netns.rs` does for tests): the binary
//! re-executes itself under `unshare --net --pid` after putting the node addresses
//! `10.251.K.N` on that namespace's `lo` ([`crate::netns`]). Nothing can leave it.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use proxima_k8s::k8s_openapi::api::core::v1::{Namespace, Node, Service};
use proxima_k8s::k8s_openapi::api::discovery::v1::EndpointSlice;
use proxima_k8s::kube::api::{Api, DeleteParams, Patch, PatchParams};
use proxima_k8s::kube::{self, Client};
use serde_json::json;

use crate::TestbedError;

pub use crate::netns::{check_isolated, reexec_isolated, NETNS_ENV};
/// kube-apiserver version the binaries come from (`tests/k8s/provision.sh`).
pub const K8S_VERSION: &str = "1.31.4";
const TOKEN: &str = "proxima-testbed-token";
const MANAGER: &str = "proxima-testbed";
const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// Node address `index` of run block `block` in `--kube` mode: `10.251.block.(index+1)`.
pub fn node_address(block: u8, index: usize) -> IpAddr {
    IpAddr::V4(std::net::Ipv4Addr::new(10, 251, block, (index + 1) as u8))
}

/// A running etcd and kube-apiserver on loopback ports (after `tests/k8s/support.rs`).
/// Dropping it kills both and deletes its directory.
pub struct ControlPlane {
    processes: Processes,
    client: Client,
}

/// The control plane's processes and directory, killed and deleted on drop.
struct Processes {
    dir: PathBuf,
    children: Vec<Child>,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("dir", &self.processes.dir)
            .finish_non_exhaustive()
    }
}

fn k8s_error(what: impl std::fmt::Display) -> TestbedError {
    TestbedError::Net(format!("kubernetes: {what}"))
}

/// The binary `var` names, else `default`; an error naming the provision script.
fn binary(var: &str, default: PathBuf) -> Result<PathBuf, TestbedError> {
    let path = std::env::var_os(var).map(PathBuf::from).unwrap_or(default);
    if path.is_file() {
        Ok(path)
    } else {
        Err(k8s_error(format!(
            "{} not found (set {var} or run tests/k8s/provision.sh: it installs etcd and \
             builds kube-apiserver v{K8S_VERSION})",
            path.display()
        )))
    }
}

fn free_port() -> Result<u16, TestbedError> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(k8s_error)
}

fn spawn_logged(command: &mut Command, log: &Path) -> Result<Child, TestbedError> {
    let file = std::fs::File::create(log).map_err(|e| TestbedError::io(log, e))?;
    let err = file.try_clone().map_err(|e| TestbedError::io(log, e))?;
    command
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(err)
        .spawn()
        .map_err(|e| k8s_error(format!("cannot start {command:?}: {e}")))
}

fn run(command: &mut Command) -> Result<(), TestbedError> {
    let out = command
        .output()
        .map_err(|e| k8s_error(format!("cannot run {command:?}: {e}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(k8s_error(format!(
            "{command:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        )))
    }
}

fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

impl ControlPlane {
    /// Start etcd and kube-apiserver (binaries from `PROXIMA_ETCD`,
    /// `PROXIMA_KUBE_APISERVER`, else `/usr/bin/etcd` and
    /// `${PROXIMA_CACHE:-~/.cache/proxima}/kube-apiserver-v1.31.4`) and wait until the
    /// API server is ready and the `default` namespace exists.
    pub async fn start() -> Result<ControlPlane, TestbedError> {
        let cache = std::env::var_os("PROXIMA_CACHE")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/proxima")))
            .unwrap_or_else(|| PathBuf::from(".cache/proxima"));
        let etcd_bin = binary("PROXIMA_ETCD", PathBuf::from("/usr/bin/etcd"))?;
        let apiserver_bin = binary(
            "PROXIMA_KUBE_APISERVER",
            cache.join(format!("kube-apiserver-v{K8S_VERSION}")),
        )?;
        let dir = std::env::temp_dir().join(format!("proxima-testbed-k8s-{}", std::process::id()));
        let certs = dir.join("certs");
        std::fs::create_dir_all(&certs).map_err(|e| TestbedError::io(&certs, e))?;
        let tokens = dir.join("tokens.csv");
        std::fs::write(&tokens, format!("{TOKEN},admin,admin,system:masters\n"))
            .map_err(|e| TestbedError::io(&tokens, e))?;
        let key = dir.join("sa.key");
        run(Command::new("openssl")
            .args(["genrsa", "-out"])
            .arg(&key)
            .arg("2048"))?;
        run(Command::new("openssl")
            .arg("rsa")
            .arg("-in")
            .arg(&key)
            .args(["-pubout", "-out"])
            .arg(dir.join("sa.pub")))?;

        let (etcd_port, peer_port, api_port) = (free_port()?, free_port()?, free_port()?);
        let mut processes = Processes {
            dir: dir.clone(),
            children: Vec::new(),
        };
        processes.children.push(spawn_logged(
            Command::new(&etcd_bin).args([
                "--name=proxima-testbed".to_string(),
                format!("--data-dir={}", dir.join("etcd").display()),
                format!("--listen-client-urls=http://127.0.0.1:{etcd_port}"),
                format!("--advertise-client-urls=http://127.0.0.1:{etcd_port}"),
                format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"),
                format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"),
                format!("--initial-cluster=proxima-testbed=http://127.0.0.1:{peer_port}"),
            ]),
            &dir.join("etcd.log"),
        )?);
        let deadline = Instant::now() + READY_TIMEOUT;
        while TcpStream::connect(("127.0.0.1", etcd_port)).is_err() {
            if Instant::now() > deadline {
                return Err(k8s_error(format!(
                    "etcd did not listen in time:\n{}",
                    log_tail(&dir.join("etcd.log"))
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        processes.children.push(spawn_logged(
            Command::new(&apiserver_bin).args([
                format!("--etcd-servers=http://127.0.0.1:{etcd_port}"),
                "--bind-address=127.0.0.1".to_string(),
                "--advertise-address=127.0.0.1".to_string(),
                format!("--secure-port={api_port}"),
                format!("--cert-dir={}", certs.display()),
                format!("--token-auth-file={}", tokens.display()),
                format!(
                    "--service-account-key-file={}",
                    dir.join("sa.pub").display()
                ),
                format!(
                    "--service-account-signing-key-file={}",
                    dir.join("sa.key").display()
                ),
                "--service-account-issuer=https://kubernetes.default.svc".to_string(),
                "--authorization-mode=RBAC".to_string(),
                "--service-cluster-ip-range=10.96.0.0/16".to_string(),
                "--profiling=false".to_string(),
            ]),
            &dir.join("kube-apiserver.log"),
        )?);
        let client = processes.wait_until_ready(api_port).await?;
        Ok(ControlPlane { processes, client })
    }

    pub fn client(&self) -> Client {
        self.client.clone()
    }
}

impl Processes {
    /// Wait for the self-signed certificate (its file then holds the certificate and its
    /// CA), write a kubeconfig trusting it, and poll `/readyz` and the `default`
    /// namespace.
    async fn wait_until_ready(&mut self, api_port: u16) -> Result<Client, TestbedError> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let log = self.dir.join("kube-apiserver.log");
        let cert = self.dir.join("certs").join("apiserver.crt");
        let mut client = None;
        let mut last = String::new();
        loop {
            if let Some(Some(status)) = self
                .children
                .last_mut()
                .map(|c| c.try_wait().ok().flatten())
            {
                return Err(k8s_error(format!(
                    "kube-apiserver exited ({status}):\n{}",
                    log_tail(&log)
                )));
            }
            if client.is_none()
                && std::fs::read_to_string(&cert)
                    .is_ok_and(|pem| pem.matches("-----END CERTIFICATE-----").count() >= 2)
            {
                let kubeconfig = self.dir.join("kubeconfig");
                let text = format!(
                    "apiVersion: v1\nkind: Config\nclusters:\n- name: testbed\n  cluster:\n    \
                     server: https://127.0.0.1:{api_port}\n    certificate-authority: {}\nusers:\n- \
                     name: admin\n  user:\n    token: {TOKEN}\ncontexts:\n- name: testbed\n  \
                     context:\n    cluster: testbed\n    user: admin\ncurrent-context: testbed\n",
                    cert.display()
                );
                std::fs::write(&kubeconfig, text).map_err(|e| TestbedError::io(&kubeconfig, e))?;
                client = Some(
                    proxima_k8s::client(Some(&kubeconfig))
                        .await
                        .map_err(k8s_error)?,
                );
            }
            if let Some(c) = &client {
                let get = |uri: &str| http::Request::get(uri).body(Vec::new());
                match c.request_text(get("/readyz").map_err(k8s_error)?).await {
                    Ok(body) if body.trim() == "ok" => {
                        match c
                            .request_text(get("/api/v1/namespaces/default").map_err(k8s_error)?)
                            .await
                        {
                            Ok(_) => return Ok(c.clone()),
                            Err(e) => last = e.to_string(),
                        }
                    }
                    Ok(body) => last = body,
                    Err(e) => last = e.to_string(),
                }
            }
            if Instant::now() > deadline {
                return Err(k8s_error(format!(
                    "kube-apiserver not ready after {READY_TIMEOUT:?} (last: {last}):\n{}",
                    log_tail(&log)
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        // The API server first, then etcd.
        for child in self.children.iter_mut().rev() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A valid Kubernetes object name (RFC 1123 label: what Services and the testbed's
/// Node names must be).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// A node as published.
pub struct NodeObject<'a> {
    pub name: &'a str,
    pub zone: Option<&'a str>,
    pub ip: IpAddr,
    pub admin_port: u16,
}

/// A service as published.
pub struct ServiceObject<'a> {
    pub name: &'a str,
    pub namespace: &'a str,
    pub settings: &'a [(String, String)],
}

/// One listed instance, published as an EndpointSlice of its own (slice ports are
/// per slice, and every instance's gate has its own port).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct SliceObject {
    /// Slice name (unique in the namespace).
    pub name: String,
    pub namespace: String,
    pub service: String,
    /// The instance name: the endpoint's id (`targetRef`), as in file discovery.
    pub instance: String,
    pub addr: SocketAddr,
    pub node: String,
    pub zone: Option<String>,
}

/// Writes one run's objects and remembers which, to delete them at the end.
#[derive(Clone)]
pub struct Publisher {
    client: Client,
    /// EndpointSlices written and not deleted: (namespace, name).
    slices: std::sync::Arc<tokio::sync::Mutex<BTreeSet<SliceObject>>>,
    nodes: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    services: std::sync::Arc<std::sync::Mutex<Vec<(String, String)>>>,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher").finish_non_exhaustive()
    }
}

async fn apply<K>(api: &Api<K>, name: &str, object: serde_json::Value) -> Result<(), TestbedError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.patch(
        name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(object),
    )
    .await
    .map(|_| ())
    .map_err(|e| k8s_error(format!("apply {name}: {e}")))
}

async fn delete<K>(api: &Api<K>, name: &str) -> Result<(), TestbedError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.is_not_found() => Ok(()),
        Err(e) => Err(k8s_error(format!("delete {name}: {e}"))),
    }
}

impl Publisher {
    pub fn new(client: Client) -> Self {
        Self {
            client,
            slices: Default::default(),
            nodes: Default::default(),
            services: Default::default(),
        }
    }

    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// Create (or replace) the Nodes, with their InternalIP in the status.
    pub async fn nodes(&self, nodes: &[NodeObject<'_>]) -> Result<(), TestbedError> {
        let api: Api<Node> = Api::all(self.client.clone());
        for n in nodes {
            let mut labels = BTreeMap::from([(
                proxima_nodes::ADMIN_PORT_LABEL.to_string(),
                n.admin_port.to_string(),
            )]);
            if let Some(zone) = n.zone {
                labels.insert(proxima_k8s::ZONE_LABEL.to_string(), zone.to_string());
            }
            apply(
                &api,
                n.name,
                json!({"apiVersion": "v1", "kind": "Node",
                       "metadata": {"name": n.name, "labels": labels}}),
            )
            .await?;
            api.patch_status(
                n.name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(json!({"apiVersion": "v1", "kind": "Node",
                    "status": {"addresses": [{"type": "InternalIP", "address": n.ip.to_string()}]}})),
            )
            .await
            .map_err(|e| k8s_error(format!("node {} status: {e}", n.name)))?;
            self.nodes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(n.name.to_string());
        }
        Ok(())
    }

    /// Create (or replace) the Services (and their namespaces), opted in, with every
    /// setting as a `proxima.io/<key>` annotation.
    pub async fn services(&self, services: &[ServiceObject<'_>]) -> Result<(), TestbedError> {
        for s in services {
            if s.namespace != "default" {
                let api: Api<Namespace> = Api::all(self.client.clone());
                apply(
                    &api,
                    s.namespace,
                    json!({"apiVersion": "v1", "kind": "Namespace",
                           "metadata": {"name": s.namespace}}),
                )
                .await?;
            }
            let mut annotations = BTreeMap::from([(
                proxima_k8s::ENABLED_ANNOTATION.to_string(),
                "true".to_string(),
            )]);
            for (key, value) in s.settings {
                annotations.insert(format!("proxima.io/{key}"), value.clone());
            }
            let api: Api<Service> = Api::namespaced(self.client.clone(), s.namespace);
            apply(
                &api,
                s.name,
                json!({"apiVersion": "v1", "kind": "Service",
                       "metadata": {"name": s.name, "namespace": s.namespace,
                                    "annotations": annotations},
                       "spec": {"ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}}),
            )
            .await?;
            self.services
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((s.namespace.to_string(), s.name.to_string()));
        }
        Ok(())
    }

    /// Make the published EndpointSlices exactly `wanted`: write the new ones, delete
    /// the ones gone. Calls are serialised, so the last one wins.
    pub async fn slices(&self, wanted: BTreeSet<SliceObject>) -> Result<(), TestbedError> {
        let mut published = self.slices.lock().await;
        for gone in published.difference(&wanted) {
            let api: Api<EndpointSlice> = Api::namespaced(self.client.clone(), &gone.namespace);
            delete(&api, &gone.name).await?;
        }
        for new in wanted.difference(&published) {
            let api: Api<EndpointSlice> = Api::namespaced(self.client.clone(), &new.namespace);
            apply(
                &api,
                &new.name,
                json!({
                    "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                    "metadata": {"name": new.name, "namespace": new.namespace,
                                 "labels": {proxima_k8s::SERVICE_NAME_LABEL: new.service}},
                    "addressType": if new.addr.is_ipv4() { "IPv4" } else { "IPv6" },
                    "ports": [{"name": "http", "port": new.addr.port(), "protocol": "TCP"}],
                    "endpoints": [{
                        "addresses": [new.addr.ip().to_string()],
                        "nodeName": new.node,
                        "zone": new.zone,
                        "targetRef": {"kind": "Pod", "name": new.instance,
                                      "namespace": new.namespace},
                        "conditions": {"ready": true, "serving": true, "terminating": false},
                    }],
                }),
            )
            .await?;
        }
        *published = wanted;
        Ok(())
    }

    /// Delete everything this run published, so that the next run starts clean.
    pub async fn clean(&self) -> Result<(), TestbedError> {
        self.slices(BTreeSet::new()).await?;
        let services =
            std::mem::take(&mut *self.services.lock().unwrap_or_else(|e| e.into_inner()));
        for (namespace, name) in services {
            delete(
                &Api::<Service>::namespaced(self.client.clone(), &namespace),
                &name,
            )
            .await?;
        }
        let nodes = std::mem::take(&mut *self.nodes.lock().unwrap_or_else(|e| e.into_inner()));
        for name in nodes {
            delete(&Api::<Node>::all(self.client.clone()), &name).await?;
        }
        Ok(())
    }
}

/// A client of the API server the nodes' discovery watches (what `--kube` hands to
/// every run).
#[derive(Clone)]
pub struct KubeApi(pub Client);

impl std::fmt::Debug for KubeApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KubeApi")
    }
}
