//! What strategies know about nodes beyond the topology: the network latency from this
//! proxy's node to each node, and each node's resource usage.
//!
//! Both are measured elsewhere (proxies probe each other; usage comes from
//! `metrics.k8s.io` or from neighbouring proxies) and published into the router as an
//! [`Environment`] snapshot. Every reading carries the time it was taken; readings older
//! than [`Environment::max_age`] are treated as missing, and every strategy documents
//! what it does without them.
//!
//! What neighbouring proxies report about pods (processing times, failure verdicts) is
//! published alongside, as [`Environment::hearsay`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

/// A smoothed round-trip time to a node.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LatencyReading {
    /// Round-trip time, smoothed by whoever measured it (the peer prober).
    pub rtt: Duration,
    /// When it was measured; older than [`Environment::max_age`] counts as missing.
    pub at: Instant,
}

/// A node's resource usage as fractions of its allocatable capacity (0.0 ..= 1.0+).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Usage {
    /// CPU in use ÷ allocatable CPU.
    pub cpu: f64,
    /// Memory in use ÷ allocatable memory.
    pub ram: f64,
}

/// A node's usage and when it was read.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct UsageReading {
    /// The usage itself.
    pub usage: Usage,
    /// When it was read; older than [`Environment::max_age`] counts as missing.
    pub at: Instant,
}

/// Latency and usage per node name (see the module docs).
#[derive(Clone, Debug)]
pub struct Environment {
    /// Latest latency reading per node name, fresh or not (see [`Environment::latency`]).
    pub latency: HashMap<String, LatencyReading>,
    /// Latest usage reading per node name, fresh or not (see [`Environment::usage`]).
    pub usage: HashMap<String, UsageReading>,
    /// Readings older than this are ignored.
    pub max_age: Duration,
    /// What neighbouring proxies reported about pods (see [`crate::neighbours`]); shared
    /// between snapshots until it changes.
    pub hearsay: Arc<crate::neighbours::Hearsay>,
}

impl Default for Environment {
    fn default() -> Self {
        Self {
            latency: HashMap::new(),
            usage: HashMap::new(),
            max_age: Duration::from_secs(30),
            hearsay: Arc::default(),
        }
    }
}

impl Environment {
    fn fresh(&self, at: Instant, now: Instant) -> bool {
        now.saturating_duration_since(at) <= self.max_age
    }

    /// Fresh round-trip time from this node to `node`.
    pub fn latency(&self, node: &str, now: Instant) -> Option<Duration> {
        self.latency
            .get(node)
            .filter(|r| self.fresh(r.at, now))
            .map(|r| r.rtt)
    }

    /// Fresh resource usage of `node`.
    pub fn usage(&self, node: &str, now: Instant) -> Option<Usage> {
        self.usage
            .get(node)
            .filter(|r| self.fresh(r.at, now))
            .map(|r| r.usage)
    }

    /// Record `rtt` to `node` as measured at `now`, replacing the previous reading.
    pub fn set_latency(&mut self, node: impl Into<String>, rtt: Duration, now: Instant) {
        self.latency
            .insert(node.into(), LatencyReading { rtt, at: now });
    }

    /// Record `usage` of `node` as read at `now`, replacing the previous reading.
    pub fn set_usage(&mut self, node: impl Into<String>, usage: Usage, now: Instant) {
        self.usage
            .insert(node.into(), UsageReading { usage, at: now });
    }

    /// The time of the newest reading: "now" as far as the environment knows, used to
    /// judge staleness where no clock is at hand.
    pub fn newest(&self) -> Option<Instant> {
        self.latency
            .values()
            .map(|r| r.at)
            .chain(self.usage.values().map(|r| r.at))
            .max()
    }

    /// The smallest fresh latency to any other node (proxy-mity's `localrtt` is set just
    /// below it).
    pub fn min_latency(&self, except: Option<&str>, now: Instant) -> Option<Duration> {
        self.latency
            .iter()
            .filter(|(n, r)| Some(n.as_str()) != except && self.fresh(r.at, now))
            .map(|(_, r)| r.rtt)
            .min()
    }
}
