//! Node usage from `metrics.k8s.io` (metrics-server), for RAP's resource-aware choice.
//!
//! Every `interval` (15 s, metrics-server's usual resolution) the source lists
//! `NodeMetrics` (`GET /apis/metrics.k8s.io/v1beta1/nodes`: CPU and memory in use per
//! node, as Kubernetes quantities) and divides them by the Nodes' `status.allocatable`:
//! `cpu = usage.cpu / allocatable.cpu`, `ram = usage.memory / allocatable.memory`. The
//! allocatable values change rarely, so Nodes are listed only every `node_refresh` (from
//! the API server's cache, `resourceVersion=0`) or when a node without one appears.
//! A reading is dated when the list arrived; metrics-server's own window (its
//! `timestamp` and `window` fields, typically 15–60 s) is not added to its age.
//!
//! A cluster without metrics-server answers 404 (no such API group) or 503 (the
//! APIService is registered but its backend is down); 403 means the proxy may not list
//! `nodes.metrics.k8s.io`. Then the source logs once and turns on the peer-report
//! fallback ([`PeerUsage`]), and keeps asking: when metrics-server appears, it takes over
//! again and the fallback is turned off. Other errors (a timeout, a restarting API
//! server) also turn the fallback on until the next good answer. `PodMetrics` are not
//! used: node usage is what the strategies weigh.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::ListParams;
use kube::{Api, Client};
use proxima_core::{Router, Usage};
use serde::Deserialize;
use tracing::{debug, info, warn};

use crate::metrics::NodeGauges;
use crate::prober::PeerUsage;
use crate::quantity;

/// Path of the node metrics list.
pub const NODE_METRICS_PATH: &str = "/apis/metrics.k8s.io/v1beta1/nodes";

/// `metadata` of a metrics object: only the name is needed.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct MetricsMeta {
    /// The object's name: the node's.
    #[serde(default)]
    pub name: Option<String>,
}

/// One `NodeMetrics` object of metrics.k8s.io/v1beta1.
#[derive(Clone, Debug, Deserialize)]
pub struct NodeMetrics {
    /// Names the node.
    #[serde(default)]
    pub metadata: MetricsMeta,
    /// When the usage was measured (RFC 3339), as metrics-server says.
    #[serde(default)]
    pub timestamp: Option<String>,
    /// The window the usage was averaged over (e.g. `10s`).
    #[serde(default)]
    pub window: Option<String>,
    /// `cpu` and `memory` quantities.
    #[serde(default)]
    pub usage: BTreeMap<String, String>,
}

/// A `NodeMetricsList`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct NodeMetricsList {
    /// One object per node that has metrics.
    #[serde(default)]
    pub items: Vec<NodeMetrics>,
}

/// What a node offers to pods: CPU in cores, memory in bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Allocatable {
    /// Allocatable CPU, in cores.
    pub cpu: f64,
    /// Allocatable memory, in bytes.
    pub memory: f64,
}

/// A Node's name and allocatable resources; `None` without a name or valid, positive
/// `cpu` and `memory` quantities.
pub fn allocatable(node: &Node) -> Option<(String, Allocatable)> {
    let name = node.metadata.name.clone()?;
    let alloc = node.status.as_ref()?.allocatable.as_ref()?;
    let positive = |key: &str| {
        quantity::parse(&alloc.get(key)?.0)
            .ok()
            .filter(|v| *v > 0.0)
    };
    Some((
        name,
        Allocatable {
            cpu: positive("cpu")?,
            memory: positive("memory")?,
        },
    ))
}

/// Usage fractions of every node that has metrics and a known allocatable; others are
/// skipped (a node whose metrics cannot be read has no usage, which strategies handle).
pub fn fractions(
    metrics: &NodeMetricsList,
    allocatable: &HashMap<String, Allocatable>,
) -> Vec<(String, Usage)> {
    metrics
        .items
        .iter()
        .filter_map(|m| {
            let name = m.metadata.name.as_ref()?;
            let alloc = allocatable.get(name)?;
            let used = |key: &str| {
                quantity::parse(m.usage.get(key)?)
                    .ok()
                    .filter(|v| *v >= 0.0)
            };
            Some((
                name.clone(),
                Usage {
                    cpu: used("cpu")? / alloc.cpu,
                    ram: used("memory")? / alloc.memory,
                },
            ))
        })
        .collect()
}

/// Why a poll failed.
#[derive(Debug, thiserror::Error)]
pub enum MetricsServerError {
    /// metrics.k8s.io answered that it cannot serve: not installed, not allowed, or
    /// its backend down.
    #[error("metrics.k8s.io is not available ({code} {message}): is metrics-server installed and running, and may this proxy list nodes.metrics.k8s.io?")]
    Unavailable {
        /// The API server's status code (403, 404 or 503).
        code: u16,
        /// Its message.
        message: String,
    },
    /// Any other API error.
    #[error("cannot read node metrics: {0}")]
    Api(#[from] kube::Error),
    /// No answer within the poll's time limit.
    #[error("no answer from the API server within {0:?}")]
    Timeout(Duration),
}

impl MetricsServerError {
    fn from_kube(e: kube::Error) -> Self {
        match e {
            kube::Error::Api(status) if matches!(status.code, 403 | 404 | 503) => {
                MetricsServerError::Unavailable {
                    code: status.code,
                    message: status.message.clone(),
                }
            }
            e => MetricsServerError::Api(e),
        }
    }
}

/// The polling loop (see the module docs).
pub struct MetricsServerSource {
    client: Client,
    router: Arc<Router>,
    gauges: Arc<NodeGauges>,
    peer_usage: PeerUsage,
    interval: Duration,
    timeout: Duration,
    node_refresh: Duration,
    allocatable: HashMap<String, Allocatable>,
    listed_nodes_at: Option<Instant>,
}

/// `exchange` (one poll, or one Node listing) bounded by `timeout`: an aggregated API
/// whose backend is unreachable can keep a request open for minutes.
async fn within<T>(
    timeout: Duration,
    exchange: impl std::future::Future<Output = Result<T, MetricsServerError>>,
) -> Result<T, MetricsServerError> {
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| MetricsServerError::Timeout(timeout))?
}

impl std::fmt::Debug for MetricsServerSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsServerSource")
            .field("interval", &self.interval)
            .field("nodes", &self.allocatable.len())
            .finish_non_exhaustive()
    }
}

impl MetricsServerSource {
    /// Polls every 15 s and re-reads allocatable every 5 min; `peer_usage` is the
    /// fallback switch shared with the [`PeerProber`](crate::PeerProber).
    pub fn new(
        client: Client,
        router: Arc<Router>,
        gauges: Arc<NodeGauges>,
        peer_usage: PeerUsage,
    ) -> Self {
        Self {
            client,
            router,
            gauges,
            peer_usage,
            interval: Duration::from_secs(15),
            timeout: Duration::from_secs(10),
            node_refresh: Duration::from_secs(300),
            allocatable: HashMap::new(),
            listed_nodes_at: None,
        }
    }

    /// Poll metrics.k8s.io every `interval` instead of every 15 s.
    pub fn with_interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// Limit of one poll (metrics and, when due, nodes). An aggregated API whose backend
    /// is unreachable can keep a request open for minutes.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How often Nodes are listed for their allocatable resources.
    pub fn with_node_refresh(mut self, node_refresh: Duration) -> Self {
        self.node_refresh = node_refresh;
        self
    }

    /// The allocatable resources last read, by node name.
    pub fn allocatable(&self) -> &HashMap<String, Allocatable> {
        &self.allocatable
    }

    /// Read node metrics once and publish the usage of every node it covers; returns how
    /// many nodes got a reading.
    pub async fn poll(&mut self) -> Result<usize, MetricsServerError> {
        within(self.timeout, self.poll_unbounded()).await
    }

    async fn poll_unbounded(&mut self) -> Result<usize, MetricsServerError> {
        let request = http::Request::get(NODE_METRICS_PATH)
            .body(Vec::new())
            .map_err(|e| MetricsServerError::Api(kube::Error::HttpError(e)))?;
        let metrics: NodeMetricsList = self
            .client
            .request(request)
            .await
            .map_err(MetricsServerError::from_kube)?;
        let received = Instant::now();
        let unknown = metrics.items.iter().any(|m| {
            m.metadata
                .name
                .as_ref()
                .is_some_and(|n| !self.allocatable.contains_key(n))
        });
        let due = self
            .listed_nodes_at
            .is_none_or(|at| received.saturating_duration_since(at) >= self.node_refresh);
        if due || unknown {
            self.list_nodes().await?;
        }
        let usage = fractions(&metrics, &self.allocatable);
        let count = usage.len();
        self.router.update_environment(|env| {
            for (node, usage) in usage {
                env.set_usage(node, usage, received);
            }
        });
        self.gauges
            .refresh(&self.router.environment(), Instant::now());
        Ok(count)
    }

    /// List the Nodes and keep their allocatable resources; returns how many have them.
    pub async fn refresh_allocatable(&mut self) -> Result<usize, MetricsServerError> {
        within(self.timeout, self.list_nodes()).await
    }

    async fn list_nodes(&mut self) -> Result<usize, MetricsServerError> {
        let nodes = Api::<Node>::all(self.client.clone())
            .list(&ListParams::default().match_any())
            .await
            .map_err(MetricsServerError::from_kube)?;
        self.allocatable = nodes.items.iter().filter_map(allocatable).collect();
        self.listed_nodes_at = Some(Instant::now());
        debug!(
            nodes = self.allocatable.len(),
            "read the nodes' allocatable resources"
        );
        Ok(self.allocatable.len())
    }

    /// Poll every `interval` until `shutdown` resolves (see the module docs for what
    /// happens without metrics-server).
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) {
        let mut ticker = crate::ticker(self.interval);
        tokio::pin!(shutdown);
        // What the last poll found, to log changes rather than every failure.
        let mut last_ok: Option<bool> = None;
        let mut said_unavailable = false;
        loop {
            tokio::select! {
                () = &mut shutdown => return,
                _ = ticker.tick() => {}
            }
            let result = tokio::select! {
                () = &mut shutdown => return,
                result = self.poll() => result,
            };
            match result {
                Ok(nodes) => {
                    if last_ok != Some(true) {
                        info!(nodes, "node usage comes from metrics.k8s.io");
                    }
                    self.peer_usage.set(false);
                    last_ok = Some(true);
                }
                Err(e) => {
                    match &e {
                        MetricsServerError::Unavailable { .. } if !said_unavailable => {
                            said_unavailable = true;
                            warn!("{e}; node usage comes from peer proxies' reports instead");
                        }
                        _ if last_ok != Some(false) => {
                            warn!(
                                "{e}; node usage comes from peer proxies' reports until it answers"
                            );
                        }
                        _ => debug!("{e}"),
                    }
                    self.peer_usage.set(true);
                    last_ok = Some(false);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn node(name: &str, cpu: &str, memory: &str) -> Node {
        serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "status": {
                "capacity": {"cpu": "4", "memory": "16318852Ki", "pods": "110"},
                "allocatable": {"cpu": cpu, "memory": memory, "pods": "110", "ephemeral-storage": "95Gi"},
                "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]
            }
        }))
        .unwrap()
    }

    /// As `kubectl get --raw /apis/metrics.k8s.io/v1beta1/nodes` prints it.
    fn metrics_list() -> NodeMetricsList {
        serde_json::from_value(json!({
            "kind": "NodeMetricsList",
            "apiVersion": "metrics.k8s.io/v1beta1",
            "metadata": {},
            "items": [
                {
                    "metadata": {"name": "edge-1", "creationTimestamp": "2025-01-01T00:00:00Z",
                                  "labels": {"kubernetes.io/hostname": "edge-1"}},
                    "timestamp": "2025-01-01T00:00:00Z",
                    "window": "20.029s",
                    "usage": {"cpu": "1900m", "memory": "3882Mi"}
                },
                {
                    "metadata": {"name": "edge-2"},
                    "timestamp": "2025-01-01T00:00:01Z",
                    "window": "15s",
                    "usage": {"cpu": "146071063n", "memory": "716628Ki"}
                },
                {"metadata": {"name": "no-allocatable"}, "usage": {"cpu": "1", "memory": "1Gi"}},
                {"metadata": {"name": "edge-3"}, "usage": {"cpu": "garbage", "memory": "1Gi"}},
                {"metadata": {}, "usage": {"cpu": "1", "memory": "1Gi"}}
            ]
        }))
        .unwrap()
    }

    #[test]
    fn usage_is_divided_by_allocatable() {
        let nodes = [
            node("edge-1", "3800m", "7764Mi"),
            node("edge-2", "2", "2866512Ki"),
            node("edge-3", "2", "4Gi"),
        ];
        let alloc: HashMap<String, Allocatable> = nodes.iter().filter_map(allocatable).collect();
        assert_eq!(
            alloc["edge-1"],
            Allocatable {
                cpu: 3.8,
                memory: 7764.0 * 1024.0 * 1024.0
            }
        );
        let usage: HashMap<String, Usage> =
            fractions(&metrics_list(), &alloc).into_iter().collect();
        assert_eq!(usage.len(), 2, "{usage:?}");
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(
            close(usage["edge-1"].cpu, 0.5) && close(usage["edge-1"].ram, 0.5),
            "{usage:?}"
        );
        assert!(close(usage["edge-2"].cpu, 0.146_071_063 / 2.0), "{usage:?}");
        assert!(close(usage["edge-2"].ram, 0.25), "{usage:?}");
    }

    #[test]
    fn nodes_without_usable_allocatable_are_skipped() {
        assert!(allocatable(&node("a", "0", "1Gi")).is_none(), "zero CPU");
        assert!(allocatable(&node("a", "2", "lots")).is_none(), "bad memory");
        let bare: Node = serde_json::from_value(json!({"metadata": {"name": "a"}})).unwrap();
        assert!(allocatable(&bare).is_none(), "no status");
        assert!(fractions(&metrics_list(), &HashMap::new()).is_empty());
        let empty: NodeMetricsList =
            serde_json::from_value(json!({"kind": "NodeMetricsList"})).unwrap();
        assert!(empty.items.is_empty());
    }

    #[test]
    fn missing_api_errors_mean_unavailable() {
        let status = |code: u16| {
            kube::Error::Api(Box::new(
                kube::core::Status::failure(
                    "the server could not find the requested resource",
                    "NotFound",
                )
                .with_code(code),
            ))
        };
        for code in [403, 404, 503] {
            assert!(
                matches!(MetricsServerError::from_kube(status(code)), MetricsServerError::Unavailable { code: c, .. } if c == code),
                "{code}"
            );
        }
        assert!(matches!(
            MetricsServerError::from_kube(status(500)),
            MetricsServerError::Api(_)
        ));
    }
}
