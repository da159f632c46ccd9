//! `--discovery kube`: Kubernetes discovery (`proxima_k8s`) wired into the binary.
//!
//! The discovery task watches Services, EndpointSlices and Nodes and updates the
//! router; the proxy starts serving once the first full list has been applied (see
//! `run`). `/readyz` turns 200 at that first sync and stays 200 while the API server is
//! away: the proxy keeps routing on the last state it saw, which is what its clients
//! need from it (the papers' edge setting, where the control plane may be unreachable).
//! Connectivity is exported as metrics, read from [`ApiStatus`] at scrape time:
//!
//! * `proxima_kube_api_connected`: 1 while the API server answers, else 0;
//! * `proxima_kube_watch_errors_total`: watch failures so far (each is retried).

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntCounter, IntGauge, Registry};
use proxima_admin::Readiness;
use proxima_core::Router;
use proxima_k8s::{ApiStatus, K8sConfig, KubeDiscovery};
use tokio::sync::oneshot;
use tracing::{info, warn};

/// While the first sync has not happened, say so this often.
const WAITING_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Kubernetes discovery's first full list, still to come.
pub struct FirstSync {
    /// Fires once the first full list has reached the router (dropped if discovery
    /// ends before that).
    synced: oneshot::Receiver<()>,
    status: ApiStatus,
}

impl FirstSync {
    /// Wait for the first sync, logging every [`WAITING_LOG_INTERVAL`] why it is taking
    /// long. Returns `false` if discovery ended first.
    pub async fn wait(mut self) -> bool {
        info!("waiting for the first list of Services, EndpointSlices and Nodes");
        let mut ticker = tokio::time::interval(WAITING_LOG_INTERVAL);
        ticker.tick().await;
        loop {
            tokio::select! {
                result = &mut self.synced => return result.is_ok(),
                _ = ticker.tick() => warn!(
                    api_connected = self.status.connected(),
                    watch_errors = self.status.watch_errors(),
                    "still waiting for the first Kubernetes sync; the proxy serves once it completes"
                ),
            }
        }
    }
}

/// The discovery task: runs until `shutdown`; fails only if discovery itself cannot run.
pub type DiscoveryTask = Pin<Box<dyn Future<Output = Result<()>> + Send>>;

/// Build the client (from `kubeconfig`, else `KUBECONFIG`, `~/.kube/config` or the
/// in-cluster service account), register the connectivity metrics in `registry` and
/// prepare the discovery task, which watches as `config` says and marks `readiness` at
/// its first sync. Fails on an unusable configuration (no kubeconfig, bad file); an
/// unreachable API server is not an error here, discovery retries it.
pub async fn start(
    kubeconfig: Option<&Path>,
    config: K8sConfig,
    router: Arc<Router>,
    readiness: Readiness,
    registry: &Registry,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(DiscoveryTask, FirstSync)> {
    // The error's message already includes its cause; `{:#}` would print it twice.
    let client = proxima_k8s::client(kubeconfig)
        .await
        .map_err(|e| anyhow!("{e}"))?;
    let discovery = KubeDiscovery::new(client, router, config);
    let status = discovery.status();
    registry
        .register(Box::new(ApiMetrics::new(status.clone())?))
        .context("cannot register the Kubernetes metrics")?;
    let (synced_tx, synced) = oneshot::channel();
    let on_synced = move || {
        readiness.mark_synced();
        let _ = synced_tx.send(());
    };
    let task = Box::pin(async move {
        discovery
            .run(on_synced, shutdown)
            .await
            .context("Kubernetes discovery")
    });
    Ok((task, FirstSync { synced, status }))
}

/// `proxima_kube_api_connected` and `proxima_kube_watch_errors_total`, refreshed from
/// [`ApiStatus`] whenever the registry is gathered.
struct ApiMetrics {
    status: ApiStatus,
    connected: IntGauge,
    watch_errors: IntCounter,
    /// The counter catches up by a difference; concurrent scrapes must not both add it.
    refresh: Mutex<()>,
}

impl ApiMetrics {
    fn new(status: ApiStatus) -> prometheus::Result<Self> {
        Ok(Self {
            status,
            connected: IntGauge::new(
                "proxima_kube_api_connected",
                "1 while the Kubernetes API server answers, 0 while it is unreachable (the \
                 proxy keeps routing on the last state it saw).",
            )?,
            watch_errors: IntCounter::new(
                "proxima_kube_watch_errors_total",
                "Kubernetes watch failures (each is retried with backoff).",
            )?,
            refresh: Mutex::new(()),
        })
    }
}

impl Collector for ApiMetrics {
    fn desc(&self) -> Vec<&Desc> {
        let mut descs = self.connected.desc();
        descs.extend(self.watch_errors.desc());
        descs
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let _serial = self.refresh.lock().unwrap_or_else(|e| e.into_inner());
        self.connected.set(i64::from(self.status.connected()));
        let seen = self.status.watch_errors();
        let counted = self.watch_errors.get();
        if seen > counted {
            self.watch_errors.inc_by(seen - counted);
        }
        let mut families = self.connected.collect();
        families.extend(self.watch_errors.collect());
        families
    }
}

#[cfg(test)]
mod tests {
    use prometheus::{Encoder, TextEncoder};

    use super::*;

    #[test]
    fn metrics_follow_the_status() {
        let registry = Registry::new();
        registry
            .register(Box::new(ApiMetrics::new(ApiStatus::default()).unwrap()))
            .unwrap();
        let mut text = Vec::new();
        TextEncoder::new()
            .encode(&registry.gather(), &mut text)
            .unwrap();
        let text = String::from_utf8(text).unwrap();
        // A status that has not reached the API server yet.
        assert!(text.contains("proxima_kube_api_connected 0"), "{text}");
        assert!(text.contains("proxima_kube_watch_errors_total 0"), "{text}");
        assert!(
            text.contains("# TYPE proxima_kube_watch_errors_total counter"),
            "{text}"
        );
    }
}
