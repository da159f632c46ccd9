//! `--kube`: discovery from a real Kubernetes API server instead of topology files.
//!
//! The testbed starts its own control plane (etcd and kube-apiserver, no kubelet,
//! scheduler or controllers; [`ControlPlane`], the launcher of `tests/k8s/support.rs`)
//! and publishes the emulated cluster as Kubernetes objects: a Node per node (InternalIP
//! = the node's address, labels `proxima.io/admin-port` and the zone), a Service per
//! scenario service (`proxima.io/enabled: "true"` and every setting, strategy included,
//! as a `proxima.io/<key>` annotation; a `grpc` service's port has `appProtocol: grpc`,
//! so the proxies reach its pods over h2c), and one EndpointSlice per listed instance (its
//! gate's address and port, node, zone, ready). Each node's router is fed by its own
//! `proxima_k8s` discovery watching that API server. Instances joining, leaving or
//! failing become EndpointSlice writes and deletions ([`Publisher`]).
//!
//! kube-apiserver refuses loopback addresses in EndpointSlices, so `--kube` runs happen
//! in a private network namespace (as `tests/k8s/netns.rs` does for tests): the binary
//! re-executes itself under `unshare --net --pid` after putting the node addresses
//! `10.251.K.N` on that namespace's `lo` ([`crate::netns`]). Nothing can leave it.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};

use proxima_k8s::k8s_openapi::api::core::v1::{Namespace, Node, Service};
use proxima_k8s::k8s_openapi::api::discovery::v1::EndpointSlice;
use proxima_k8s::kube::api::{Api, DeleteParams, Patch, PatchParams};
use proxima_k8s::kube::{self, Client};
use serde_json::json;

use crate::TestbedError;

pub use crate::netns::{check_isolated, reexec_isolated, NETNS_ENV};
/// kube-apiserver version the binaries come from (`tests/k8s/provision.sh`).
pub const K8S_VERSION: &str = "1.31.4";
const MANAGER: &str = "proxima-testbed";

/// Node address `index` of run block `block` in `--kube` mode: `10.251.block.(index+1)`.
pub fn node_address(block: u8, index: usize) -> IpAddr {
    IpAddr::V4(std::net::Ipv4Addr::new(10, 251, block, (index + 1) as u8))
}

/// The control plane's launcher, shared with the tests: one place for how etcd and
/// kube-apiserver are started, made ready and cleaned up.
#[path = "../../../tests/k8s/support.rs"]
mod control_plane;

/// A running etcd and kube-apiserver on loopback ports (`tests/k8s/support.rs`'s
/// `Cluster`). Dropping it kills both and deletes its directory.
pub struct ControlPlane {
    cluster: control_plane::Cluster,
    client: Client,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("dir", &self.cluster.dir())
            .finish_non_exhaustive()
    }
}

fn k8s_error(what: impl std::fmt::Display) -> TestbedError {
    TestbedError::Net(format!("kubernetes: {what}"))
}

impl ControlPlane {
    /// Start etcd and kube-apiserver (binaries from `PROXIMA_ETCD`,
    /// `PROXIMA_KUBE_APISERVER`, else `/usr/bin/etcd` and
    /// `${PROXIMA_CACHE:-~/.cache/proxima}/kube-apiserver-v1.31.4`) and wait until the
    /// API server is ready and the `default` namespace exists.
    pub async fn start() -> Result<ControlPlane, TestbedError> {
        let cluster = control_plane::Cluster::launch().await.map_err(k8s_error)?;
        let client = cluster.try_client().await.map_err(k8s_error)?;
        Ok(ControlPlane { cluster, client })
    }

    /// A client of the API server, with admin rights.
    pub fn client(&self) -> Client {
        self.client.clone()
    }
}

/// A node as published.
pub struct NodeObject<'a> {
    /// Node name.
    pub name: &'a str,
    /// Zone, published as the `topology.kubernetes.io/zone` label.
    pub zone: Option<&'a str>,
    /// The node's InternalIP (where its proxy listens).
    pub ip: IpAddr,
    /// Its proxy's admin port, published as the `proxima.io/admin-port` label.
    pub admin_port: u16,
}

/// A service as published.
pub struct ServiceObject<'a> {
    /// Service name.
    pub name: &'a str,
    /// Service namespace.
    pub namespace: &'a str,
    /// `key = value` settings, published as `proxima.io/<key>` annotations.
    pub settings: &'a [(String, String)],
    /// Its port's name and `appProtocol` (`grpc` for a gRPC service: its pods are
    /// reached over h2c).
    pub port: (&'a str, Option<&'a str>),
}

/// One listed instance, published as an EndpointSlice of its own (slice ports are
/// per slice, and every instance's gate has its own port).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct SliceObject {
    /// Slice name (unique in the namespace).
    pub name: String,
    /// Namespace of the slice and its service.
    pub namespace: String,
    /// Name of the service it belongs to.
    pub service: String,
    /// The instance name: the endpoint's id (`targetRef`), as in file discovery.
    pub instance: String,
    /// The instance's address, as the proxies reach it.
    pub addr: SocketAddr,
    /// Node the instance runs on.
    pub node: String,
    /// Zone of that node.
    pub zone: Option<String>,
    /// The name of its service's port (`http`, or `grpc`), which the slice's port
    /// must match.
    pub port_name: String,
}

/// Writes one run's objects and remembers which, to delete them at the end.
#[derive(Clone)]
pub struct Publisher {
    client: Client,
    /// EndpointSlices written and not deleted.
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
    /// A publisher that writes through `client` and has written nothing yet.
    pub fn new(client: Client) -> Self {
        Self {
            client,
            slices: Default::default(),
            nodes: Default::default(),
            services: Default::default(),
        }
    }

    /// The client it writes through.
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
            let (port_name, app_protocol) = s.port;
            let mut port = json!({"name": port_name, "port": 80, "protocol": "TCP"});
            if let Some(app_protocol) = app_protocol {
                port["appProtocol"] = json!(app_protocol);
            }
            apply(
                &api,
                s.name,
                json!({"apiVersion": "v1", "kind": "Service",
                       "metadata": {"name": s.name, "namespace": s.namespace,
                                    "annotations": annotations},
                       "spec": {"ports": [port]}}),
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
                    "ports": [{"name": new.port_name, "port": new.addr.port(), "protocol": "TCP"}],
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
