//! Prometheus metrics of the node measurements.
//!
//! | metric | labels | meaning |
//! |---|---|---|
//! | `proxima_node_rtt_seconds` | node | smoothed round-trip time from this proxy's node to `node` (fresh readings only) |
//! | `proxima_node_cpu_usage` | node | CPU usage of `node` as a fraction of its allocatable CPU (or of all its CPUs, when reported by its proxy) |
//! | `proxima_node_ram_usage` | node | memory usage of `node`, likewise |
//! | `proxima_peer_probe_failures_total` | node | `/node/ping` probes of `node`'s proxy that failed (timeout, refused, bad reply) |
//!
//! The gauges mirror the router's [`Environment`]: [`NodeGauges::refresh`] sets them from
//! its fresh readings and removes the series of readings that went stale, so a scrape
//! never shows a value the strategies would not use. Failure counters of nodes that left
//! the cluster are removed by [`NodeGauges::retain_nodes`].

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Instant;

use prometheus::{GaugeVec, IntCounterVec, Opts, Registry};
use proxima_core::Environment;

/// A gauge per node (label `node`).
fn node_gauge(name: &str, help: &str) -> prometheus::Result<GaugeVec> {
    GaugeVec::new(Opts::new(name, help), &["node"])
}

#[derive(Debug, Default)]
struct Labelled {
    rtt: BTreeSet<String>,
    usage: BTreeSet<String>,
    failures: BTreeSet<String>,
}

/// The node metrics (see the module docs). Share it between the measurement loops.
#[derive(Debug)]
pub struct NodeGauges {
    rtt: GaugeVec,
    cpu: GaugeVec,
    ram: GaugeVec,
    failures: IntCounterVec,
    labelled: Mutex<Labelled>,
}

impl NodeGauges {
    /// Create the metrics and register them in `registry`.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let gauges = Self::new()?;
        registry.register(Box::new(gauges.rtt.clone()))?;
        registry.register(Box::new(gauges.cpu.clone()))?;
        registry.register(Box::new(gauges.ram.clone()))?;
        registry.register(Box::new(gauges.failures.clone()))?;
        Ok(gauges)
    }

    fn new() -> prometheus::Result<Self> {
        Ok(Self {
            rtt: node_gauge(
                "proxima_node_rtt_seconds",
                "Smoothed round-trip time from this proxy's node to the node, measured by \
                 probing the proxy there (fresh readings only).",
            )?,
            cpu: node_gauge(
                "proxima_node_cpu_usage",
                "CPU usage of the node as a fraction of its allocatable CPU (metrics.k8s.io) \
                 or of all its CPUs (reported by its proxy).",
            )?,
            ram: node_gauge(
                "proxima_node_ram_usage",
                "Memory usage of the node as a fraction of its allocatable memory \
                 (metrics.k8s.io) or of its total memory (reported by its proxy).",
            )?,
            failures: IntCounterVec::new(
                Opts::new(
                    "proxima_peer_probe_failures_total",
                    "Probes of the proxy on the node (GET /node/ping on its admin port) \
                     that failed: timeout, connection refused or a bad reply.",
                ),
                &["node"],
            )?,
            labelled: Mutex::new(Labelled::default()),
        })
    }

    fn labelled(&self) -> std::sync::MutexGuard<'_, Labelled> {
        self.labelled.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Count a failed probe of `node`'s proxy.
    pub fn probe_failed(&self, node: &str) {
        self.failures.with_label_values(&[node]).inc();
        self.labelled().failures.insert(node.to_string());
    }

    /// Failed probes of `node` so far.
    pub fn failures(&self, node: &str) -> u64 {
        if self.labelled().failures.contains(node) {
            self.failures.with_label_values(&[node]).get()
        } else {
            0
        }
    }

    /// Set the gauges from `env`'s fresh readings; remove the series of stale ones.
    pub fn refresh(&self, env: &Environment, now: Instant) {
        let mut labelled = self.labelled();
        labelled.rtt = publish_fresh(
            env.latency
                .keys()
                .filter_map(|node| Some((node, env.latency(node, now)?))),
            &labelled.rtt,
            |node, rtt| self.rtt.with_label_values(&[node]).set(rtt.as_secs_f64()),
            |gone| {
                let _ = self.rtt.remove_label_values(&[gone]);
            },
        );
        labelled.usage = publish_fresh(
            env.usage
                .keys()
                .filter_map(|node| Some((node, env.usage(node, now)?))),
            &labelled.usage,
            |node, usage| {
                self.cpu.with_label_values(&[node]).set(usage.cpu);
                self.ram.with_label_values(&[node]).set(usage.ram);
            },
            |gone| {
                let _ = self.cpu.remove_label_values(&[gone]);
                let _ = self.ram.remove_label_values(&[gone]);
            },
        );
    }

    /// Drop the failure counters of nodes for which `keep` is false (nodes that left).
    pub fn retain_nodes(&self, keep: impl Fn(&str) -> bool) {
        let mut labelled = self.labelled();
        labelled.failures.retain(|node| {
            let kept = keep(node);
            if !kept {
                let _ = self.failures.remove_label_values(&[node]);
            }
            kept
        });
    }
}

/// A node's series exist exactly while its reading is fresh: `set` every node of
/// `fresh`, `remove` the series of the nodes in `labelled` that are no longer in it,
/// and return the nodes now labelled.
fn publish_fresh<'n, T>(
    fresh: impl Iterator<Item = (&'n String, T)>,
    labelled: &BTreeSet<String>,
    set: impl Fn(&str, T),
    remove: impl Fn(&str),
) -> BTreeSet<String> {
    let mut now_labelled = BTreeSet::new();
    for (node, reading) in fresh {
        set(node, reading);
        now_labelled.insert(node.clone());
    }
    for gone in labelled.difference(&now_labelled) {
        remove(gone);
    }
    now_labelled
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use prometheus::Encoder;
    use proxima_core::Usage;

    use super::*;

    fn scrape(registry: &Registry) -> String {
        let mut out = Vec::new();
        prometheus::TextEncoder::new()
            .encode(&registry.gather(), &mut out)
            .unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn gauges_follow_fresh_readings() {
        let registry = Registry::new();
        let gauges = NodeGauges::register(&registry).unwrap();
        let t0 = Instant::now();
        let mut env = Environment {
            max_age: Duration::from_secs(10),
            ..Environment::default()
        };
        env.set_latency("n2", Duration::from_millis(40), t0);
        env.set_usage(
            "n2",
            Usage {
                cpu: 0.5,
                ram: 0.25,
            },
            t0,
        );
        env.set_latency("n3", Duration::from_millis(2), t0 + Duration::from_secs(8));
        gauges.probe_failed("n4");
        gauges.probe_failed("n4");
        gauges.refresh(&env, t0 + Duration::from_secs(1));
        let text = scrape(&registry);
        assert!(
            text.contains("proxima_node_rtt_seconds{node=\"n2\"} 0.04"),
            "{text}"
        );
        assert!(
            text.contains("proxima_node_rtt_seconds{node=\"n3\"} 0.002"),
            "{text}"
        );
        assert!(
            text.contains("proxima_node_cpu_usage{node=\"n2\"} 0.5"),
            "{text}"
        );
        assert!(
            text.contains("proxima_node_ram_usage{node=\"n2\"} 0.25"),
            "{text}"
        );
        assert!(
            text.contains("proxima_peer_probe_failures_total{node=\"n4\"} 2"),
            "{text}"
        );
        assert_eq!(gauges.failures("n4"), 2);
        assert_eq!(gauges.failures("n2"), 0);

        // n2's readings expire; n4 leaves the cluster.
        gauges.refresh(&env, t0 + Duration::from_secs(11));
        gauges.retain_nodes(|n| n != "n4");
        let text = scrape(&registry);
        assert!(!text.contains("node=\"n2\""), "{text}");
        assert!(!text.contains("node=\"n4\""), "{text}");
        assert!(
            text.contains("proxima_node_rtt_seconds{node=\"n3\"}"),
            "{text}"
        );
    }
}
