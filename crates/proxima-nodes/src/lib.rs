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
//! ## Thousands of nodes: network coordinates (not implemented)
//!
//! Past a few hundred nodes most peers are probed rarely, so most latencies would be
//! missing or old. The remedy, as proxy-mity does with Vivaldi (Dabek et al., SIGCOMM
//! 2004), is a synthetic coordinate per node: a point in a low-dimensional Euclidean
//! space plus a "height" for the access link, such that the distance between two
//! coordinates predicts their RTT. Each proxy would keep its own coordinate and a
//! confidence; after every probe it moves its coordinate along the line to the peer's,
//! by an amount proportional to the prediction error weighted by the two confidences.
//! The ping reply would carry the answering node's coordinate and confidence (a few
//! more numbers in [`ping::PingReply`]), and proxies would also gossip the coordinates
//! they hold of others (a bounded, recent subset per reply), so every proxy learns
//! coordinates for every node after a few rounds, with each proxy still probing only its
//! bounded sample. In this design the prober would keep measured EWMAs for the nodes it
//! samples and fill the environment's latency of every other node with the RTT its
//! coordinate predicts (dated by the coordinate's age, so staleness still works), which
//! strategies read as they read measured latency; the sampling tiers stay as they are,
//! and random probes doubling as the coordinate system's training samples.
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

pub mod metrics;
pub mod metrics_server;
pub mod ping;
pub mod prober;
pub mod quantity;
pub mod sample;
pub mod share;
pub mod usage;

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
