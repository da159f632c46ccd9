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
//!
//! Where no fresh measurement of a node's latency exists, its RTT can still be predicted
//! from network coordinates ([`crate::coordinates`]): this node's own and the node's, as
//! learnt from peers. [`Environment::rtt_estimate`] gives the measured RTT when there is
//! one and the prediction otherwise, and says which.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::coordinates::Coordinate;

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

/// A node's network coordinate and when it was learnt (on this node's clock).
#[derive(Clone, Debug, PartialEq)]
pub struct CoordinateReading {
    /// The node's coordinate.
    pub coordinate: Coordinate,
    /// When the node stated it; older than [`Environment::max_age`] counts as missing.
    pub at: Instant,
}

/// Where an RTT from [`Environment::rtt_estimate`] comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RttSource {
    /// Measured by this node's prober.
    Measured,
    /// Predicted from this node's and that node's network coordinates.
    Coordinates,
}

/// A coordinate whose node believes its predictions wrong by more than this share is
/// not used: a node that has just started sits at the origin, with the largest error
/// (1.5), and would predict almost zero to everyone. Settled nodes stay well below it
/// (`docs/results/coordinates.md`: median 0.3-0.4 on the testbed's matrices, whose
/// random per-pair delays no embedding fits); a stricter bound left half the pairs
/// without a prediction there for no gain in accuracy.
pub const COORDINATE_MAX_ERROR: f64 = 1.0;

/// Latency and usage per node name (see the module docs).
#[derive(Clone, Debug)]
pub struct Environment {
    /// Latest latency reading per node name, fresh or not (see [`Environment::latency`]).
    pub latency: HashMap<String, LatencyReading>,
    /// Latest usage reading per node name, fresh or not (see [`Environment::usage`]).
    pub usage: HashMap<String, UsageReading>,
    /// Latest network coordinate per node name, fresh or not.
    pub coordinates: HashMap<String, CoordinateReading>,
    /// This node's own coordinate, when it has one.
    pub local_coordinate: Option<Coordinate>,
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
            coordinates: HashMap::new(),
            local_coordinate: None,
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

    /// The RTT from this node to `node`: the fresh measured one when there is one, else
    /// the one predicted by both nodes' coordinates (fresh, and trusted by their nodes:
    /// [`COORDINATE_MAX_ERROR`]).
    pub fn rtt_estimate(&self, node: &str, now: Instant) -> Option<(Duration, RttSource)> {
        if let Some(rtt) = self.latency(node, now) {
            return Some((rtt, RttSource::Measured));
        }
        self.predicted_rtt(node, now)
            .map(|rtt| (rtt, RttSource::Coordinates))
    }

    /// The RTT to `node` predicted by coordinates alone (see [`Self::rtt_estimate`]).
    pub fn predicted_rtt(&self, node: &str, now: Instant) -> Option<Duration> {
        let trusted = |c: &Coordinate| c.error <= COORDINATE_MAX_ERROR;
        let local = self.local_coordinate.as_ref().filter(|c| trusted(c))?;
        let remote = self
            .coordinates
            .get(node)
            .filter(|r| self.fresh(r.at, now) && trusted(&r.coordinate))?;
        Some(local.distance(&remote.coordinate))
    }

    /// Record `node`'s `coordinate` as stated at `at`, replacing the previous one.
    pub fn set_coordinate(&mut self, node: impl Into<String>, coordinate: Coordinate, at: Instant) {
        self.coordinates
            .insert(node.into(), CoordinateReading { coordinate, at });
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
            .chain(self.coordinates.values().map(|r| r.at))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn at(x: f64, error: f64) -> Coordinate {
        Coordinate {
            vec: vec![x, 0.0],
            height: 0.0,
            error,
            adjustment: 0.0,
        }
    }

    #[test]
    fn measured_rtt_wins_while_fresh_then_coordinates_predict() {
        let t0 = Instant::now();
        let mut env = Environment {
            local_coordinate: Some(at(0.0, 0.2)),
            ..Environment::default()
        };
        assert_eq!(env.rtt_estimate("b", t0), None);
        env.set_coordinate("b", at(0.030, 0.2), t0);
        env.set_latency("b", Duration::from_millis(25), t0);
        assert_eq!(
            env.rtt_estimate("b", t0),
            Some((Duration::from_millis(25), RttSource::Measured))
        );
        // The measurement expires; the coordinate, learnt later, is still fresh.
        env.set_coordinate("b", at(0.030, 0.2), t0 + Duration::from_secs(20));
        let later = t0 + Duration::from_secs(40);
        let (rtt, source) = env.rtt_estimate("b", later).unwrap();
        assert_eq!(source, RttSource::Coordinates);
        assert!((rtt.as_secs_f64() - 0.030).abs() < 1e-9, "{rtt:?}");
        // Stale coordinates predict nothing.
        assert_eq!(env.rtt_estimate("b", t0 + Duration::from_secs(60)), None);
    }

    #[test]
    fn coordinates_their_nodes_do_not_trust_predict_nothing() {
        let t0 = Instant::now();
        let mut env = Environment {
            local_coordinate: Some(at(0.0, 1.5)),
            ..Environment::default()
        };
        env.set_coordinate("b", at(0.030, 0.2), t0);
        assert_eq!(env.rtt_estimate("b", t0), None, "this node just started");
        env.local_coordinate = Some(at(0.0, 0.2));
        env.set_coordinate("c", at(0.030, 1.2), t0);
        assert_eq!(env.rtt_estimate("c", t0), None, "that node just started");
        assert!(env.rtt_estimate("b", t0).is_some());
    }
}
