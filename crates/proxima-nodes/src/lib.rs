//! Node measurements for the resource- and proximity-aware strategies: node-to-node
//! latency from this node, and each node's CPU and memory usage. Both are published into
//! the router's [`Environment`](proxima_core::Environment), every reading dated; readings
//! older than its `max_age` count as missing, and every strategy works without them.
//!
//! # Latency: proxies probe each other
//!
//! Each node runs a proxy (a DaemonSet), and every proxy serves `GET /node/ping` on its
//! admin port ([`ping`]): a tiny JSON reply with its node name and its node's usage. The
//! [`PeerProber`] ([`prober`]) finds peers in the routing table (each Node's first
//! address, the InternalIP under Kubernetes discovery, and the admin port: `--peer-port`
//! or the node's `proxima.io/admin-port` label), probes a bounded sample of them
//! concurrently every round with a timeout, smooths each round-trip time with an EWMA
//! and publishes it. This node itself is never probed: the strategies give local pods
//! their own `localrtt`.
//!
//! ## Scale: a bounded sample per round
//!
//! A round probes at most `max_peers_per_round` peers (32 by default), chosen by
//! [`sample::select`]: nodes that host endpoints of routed services first (their latency
//! is what strategies read), then nodes whose reading is missing or half-way to expiry,
//! then random ones. A round therefore costs the same at 30 nodes and at 3 000: 32 short
//! HTTP exchanges every 2 s, 16 per second, per proxy, and 16 pings per second to answer
//! on average. The nodes the strategies need stay fresh as long as they number fewer
//! than the bound per `max_age / 2`; the rest of the cluster is measured in rotation.
//!
//! ## Hundreds of nodes: network coordinates
//!
//! Past a few hundred nodes most peers are probed rarely, so most latencies would be
//! missing or old. Each proxy therefore also keeps a network coordinate (Vivaldi,
//! Dabek et al., SIGCOMM 2004, with Serf's refinements; [`proxima_core::coordinates`]):
//! a point in an 8-dimensional space plus a height for the access link, such that the
//! distance between two coordinates predicts their RTT. Every probe the prober already
//! makes trains it: the ping reply carries the answering node's coordinate, and the RTT
//! sample moves this node's own. Replies also relay up to eight coordinates the answering
//! node knows of others, in turn ([`coordinates`]), so every proxy learns a coordinate for
//! every node within a few rounds while still probing only its bounded sample. The
//! prober publishes them into the environment next to the measured latencies;
//! [`Environment::rtt_estimate`](proxima_core::Environment::rtt_estimate) gives the
//! measured RTT where it is fresh and the prediction elsewhere, and the QoS pool's
//! initial estimate reads it. `docs/results/coordinates.md` measures the prediction error
//! on the testbed's generated matrices (`proxima-testbed coordinates`).
//!
//! # Usage: metrics.k8s.io, or the peers' own reports
//!
//! * [`metrics_server::MetricsServerSource`] polls metrics.k8s.io `NodeMetrics` and
//!   divides usage by the Nodes' allocatable resources (quantities parsed by
//!   [`quantity`]).
//! * Without metrics-server, each proxy measures its own node ([`usage::ProcUsage`]: `/proc/stat`
//!   and `/proc/meminfo`) and reports it in its ping replies; the prober publishes what
//!   its peers report, and its own node's value ([`PeerUsage`] switches this fallback
//!   on and off).
//!
//! # Metrics
//!
//! See [`metrics`]: `proxima_node_rtt_seconds`, `proxima_node_cpu_usage`,
//! `proxima_node_ram_usage` and `proxima_peer_probe_failures_total`, all by `node`.

#![warn(missing_docs)]

pub mod coordinates;
pub mod metrics;
pub mod metrics_server;
pub mod ping;
pub mod prober;
pub mod quantity;
pub mod sample;
pub mod share;
pub mod usage;

pub use coordinates::NodeCoordinates;
pub use metrics::NodeGauges;
pub use metrics_server::MetricsServerSource;
pub use ping::{LocalNode, PingReply};
pub use prober::{PeerProber, PeerUsage, ProbeError, ProberConfig, RoundReport};
pub use sample::ADMIN_PORT_LABEL;
pub use usage::{FixedUsage, ProcUsage, UsageSource};

/// A timer for a measurement loop: a late tick is not caught up with a burst, and a zero
/// period (which `tokio::time::interval` rejects with a panic) is raised to 10 ms.
pub(crate) fn ticker(period: std::time::Duration) -> tokio::time::Interval {
    let mut ticker = tokio::time::interval(period.max(std::time::Duration::from_millis(10)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker
}

/// Read the time a reading was taken from its age in a reply (usage, relayed
/// coordinates), on this clock; wall clocks of different nodes are never compared.
pub(crate) fn dated(received: std::time::Instant, age_ms: Option<u64>) -> std::time::Instant {
    age_ms
        .and_then(|ms| received.checked_sub(std::time::Duration::from_millis(ms)))
        .unwrap_or(received)
}
