//! This node's network coordinate and the coordinates it knows of other nodes
//! ([`proxima_core::coordinates`] has the algorithm).
//!
//! One [`NodeCoordinates`] is shared by the two sides of peer probing:
//!
//! * the **prober** feeds it every RTT sample with the peer's coordinate from the reply
//!   ([`NodeCoordinates::observe`], which moves this node's coordinate), and the other
//!   nodes' coordinates the peer relayed ([`NodeCoordinates::learn`]); it then publishes
//!   what is known into the router's environment;
//! * the **ping endpoint** answers with this node's coordinate and at most
//!   [`MAX_GOSSIP`] known coordinates of other nodes ([`NodeCoordinates::reply_fields`]).
//!   The relayed ones are taken in turn from a cursor over the known nodes, so that over
//!   successive replies every known node travels, and a reply stays bounded in size
//!   whatever the cluster's size (a Kubernetes node name is at most 253 bytes).
//!
//! So a proxy learns the coordinate of a node it never probes from the peers that do.
//! Each known coordinate is dated on this node's clock from the age the relaying peer
//! gave (peers' wall clocks are never compared); a coordinate older than `max_age` is
//! neither relayed nor used, so a departed node's coordinate dies out.
//!
//! On the wire, coordinates are in milliseconds rounded to the microsecond (what the
//! measurements resolve), which keeps a reply short.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use proxima_core::coordinates::{Coordinate, Rejected, VivaldiClient, VivaldiConfig};
use proxima_core::environment::CoordinateReading;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

/// Most coordinates of other nodes relayed in one ping reply (and read from one).
pub const MAX_GOSSIP: usize = 8;

/// A coordinate as it travels in ping replies (see the module docs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WireCoordinate {
    /// The Euclidean part, ms.
    pub vec_ms: Vec<f64>,
    /// The access-link part, ms.
    pub height_ms: f64,
    /// The node's own estimate of its relative error.
    pub error: f64,
    /// The non-Euclidean correction, ms.
    pub adjustment_ms: f64,
}

/// Seconds to milliseconds, rounded to the microsecond.
fn wire_ms(seconds: f64) -> f64 {
    (seconds * 1e6).round() / 1e3
}

impl From<&Coordinate> for WireCoordinate {
    fn from(c: &Coordinate) -> Self {
        Self {
            vec_ms: c.vec.iter().map(|v| wire_ms(*v)).collect(),
            height_ms: wire_ms(c.height),
            error: (c.error * 1e3).round() / 1e3,
            adjustment_ms: wire_ms(c.adjustment),
        }
    }
}

impl From<&WireCoordinate> for Coordinate {
    fn from(w: &WireCoordinate) -> Self {
        Self {
            vec: w.vec_ms.iter().map(|v| v / 1e3).collect(),
            height: w.height_ms / 1e3,
            error: w.error,
            adjustment: w.adjustment_ms / 1e3,
        }
    }
}

/// Another node's coordinate, relayed in a ping reply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GossipEntry {
    /// The node it belongs to.
    pub node: String,
    /// Its coordinate.
    pub coordinate: WireCoordinate,
    /// How long ago the relaying node learnt it (from that node or from another relay), ms.
    pub age_ms: u64,
}

/// This node's coordinate and those it knows (see the module docs). Shared by the ping
/// endpoint and the prober.
#[derive(Debug)]
pub struct NodeCoordinates {
    name: Option<String>,
    max_age: Duration,
    inner: Mutex<Known>,
}

#[derive(Debug)]
struct Known {
    client: VivaldiClient,
    rng: SmallRng,
    nodes: BTreeMap<String, CoordinateReading>,
    /// The last node relayed; the next reply goes on after it.
    cursor: Option<String>,
}

impl NodeCoordinates {
    /// For the node `name`, starting at the origin; coordinates older than `max_age` are
    /// neither relayed nor published; `seed` seeds the algorithm's random directions.
    pub fn new(name: Option<String>, config: VivaldiConfig, max_age: Duration, seed: u64) -> Self {
        Self {
            name,
            max_age,
            inner: Mutex::new(Known {
                client: VivaldiClient::new(config),
                rng: SmallRng::seed_from_u64(seed),
                nodes: BTreeMap::new(),
                cursor: None,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Known> {
        // The state is consistent after every statement, so a panic elsewhere leaves it usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// This node's coordinate now.
    pub fn own(&self) -> Coordinate {
        self.lock().client.coordinate().clone()
    }

    /// Learn from one probe of `node`: it answered with `peer` (its coordinate) after
    /// `rtt`, at `at`. Moves this node's coordinate and records the peer's. A peer
    /// coordinate or RTT that cannot be used changes nothing.
    pub fn observe(
        &self,
        node: &str,
        peer: &WireCoordinate,
        rtt: Duration,
        at: Instant,
    ) -> Result<(), Rejected> {
        let coordinate = Coordinate::from(peer);
        let mut known = self.lock();
        let Known { client, rng, .. } = &mut *known;
        client.update(node, &coordinate, rtt, rng)?;
        known
            .nodes
            .insert(node.to_string(), CoordinateReading { coordinate, at });
        Ok(())
    }

    /// Take the coordinates a peer relayed in a reply received at `received`: at most
    /// [`MAX_GOSSIP`], each only if usable, not this node's, not too old, and newer than
    /// what is known of that node.
    pub fn learn(&self, entries: &[GossipEntry], received: Instant) {
        let mut known = self.lock();
        let config = known.client.config().clone();
        for entry in entries.iter().take(MAX_GOSSIP) {
            if Some(entry.node.as_str()) == self.name.as_deref()
                || Duration::from_millis(entry.age_ms) > self.max_age
            {
                continue;
            }
            let coordinate = Coordinate::from(&entry.coordinate);
            if coordinate.check(&config).is_err() {
                continue;
            }
            let at = crate::dated(received, Some(entry.age_ms));
            let newer = known.nodes.get(&entry.node).is_none_or(|k| k.at < at);
            if newer {
                known
                    .nodes
                    .insert(entry.node.clone(), CoordinateReading { coordinate, at });
            }
        }
    }

    /// What a ping reply carries at `now`: this node's coordinate and the next known
    /// coordinates of other nodes, at most [`MAX_GOSSIP`].
    pub fn reply_fields(&self, now: Instant) -> (WireCoordinate, Vec<GossipEntry>) {
        let mut known = self.lock();
        let own = WireCoordinate::from(known.client.coordinate());
        let fresh = |r: &CoordinateReading| now.saturating_duration_since(r.at) <= self.max_age;
        let cursor = known.cursor.clone();
        // Names after the cursor first, then from the start again.
        let (later, earlier): (Vec<_>, Vec<_>) = known
            .nodes
            .iter()
            .partition(|(node, _)| cursor.as_deref().is_none_or(|c| node.as_str() > c));
        let gossip: Vec<GossipEntry> = later
            .into_iter()
            .chain(earlier)
            .filter(|(_, r)| fresh(r))
            .take(MAX_GOSSIP)
            .map(|(node, r)| GossipEntry {
                node: node.clone(),
                coordinate: WireCoordinate::from(&r.coordinate),
                age_ms: u64::try_from(now.saturating_duration_since(r.at).as_millis())
                    .unwrap_or(u64::MAX),
            })
            .collect();
        if let Some(last) = gossip.last() {
            known.cursor = Some(last.node.clone());
        }
        (own, gossip)
    }

    /// Every known coordinate of another node, fresh at `now`.
    pub fn known(&self, now: Instant) -> Vec<(String, CoordinateReading)> {
        self.lock()
            .nodes
            .iter()
            .filter(|(_, r)| now.saturating_duration_since(r.at) <= self.max_age)
            .map(|(n, r)| (n.clone(), r.clone()))
            .collect()
    }

    /// Forget every node for which `present` does not hold, and coordinates too old to
    /// be used at `now`.
    pub fn retain(&self, present: impl Fn(&str) -> bool, now: Instant) {
        let mut known = self.lock();
        let max_age = self.max_age;
        known
            .nodes
            .retain(|n, r| present(n) && now.saturating_duration_since(r.at) <= max_age);
        known.client.retain(&present);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    fn coordinate(x_ms: f64) -> WireCoordinate {
        let mut vec_ms = vec![0.0; 8];
        vec_ms[0] = x_ms;
        WireCoordinate {
            vec_ms,
            height_ms: 0.5,
            error: 0.2,
            adjustment_ms: 0.0,
        }
    }

    fn book(name: &str) -> NodeCoordinates {
        NodeCoordinates::new(
            Some(name.into()),
            VivaldiConfig::default(),
            Duration::from_secs(30),
            1,
        )
    }

    #[test]
    fn replies_relay_every_known_node_in_turn_and_at_most_eight_at_once() {
        let me = book("a");
        let now = Instant::now();
        let entries: Vec<GossipEntry> = (0..20)
            .map(|i| GossipEntry {
                node: format!("n{i:02}"),
                coordinate: coordinate(i as f64),
                age_ms: 100,
            })
            .collect();
        for chunk in entries.chunks(MAX_GOSSIP) {
            me.learn(chunk, now);
        }
        assert_eq!(me.known(now).len(), 20);
        let mut seen = HashSet::new();
        for _ in 0..3 {
            let (_, gossip) = me.reply_fields(now);
            assert_eq!(gossip.len(), MAX_GOSSIP);
            seen.extend(gossip.into_iter().map(|g| g.node));
        }
        assert_eq!(seen.len(), 20, "three replies of 8 carry all 20 nodes");
    }

    #[test]
    fn relayed_coordinates_keep_their_age_and_bad_or_stale_ones_are_dropped() {
        let me = book("a");
        let now = Instant::now();
        let bad = WireCoordinate {
            height_ms: f64::NAN,
            ..coordinate(1.0)
        };
        let entry = |node: &str, c: WireCoordinate, age_ms| GossipEntry {
            node: node.into(),
            coordinate: c,
            age_ms,
        };
        me.learn(
            &[
                entry("b", coordinate(5.0), 2_000),
                entry("a", coordinate(7.0), 0),
                entry("c", bad, 0),
                entry("d", coordinate(9.0), 60_000),
            ],
            now,
        );
        let known = me.known(now);
        assert_eq!(known.len(), 1, "{known:?}");
        assert_eq!(known[0].0, "b");
        assert_eq!(known[0].1.at, now - Duration::from_secs(2));
        // An older copy does not replace a newer one.
        me.learn(&[entry("b", coordinate(6.0), 5_000)], now);
        assert_eq!(me.known(now)[0].1.coordinate.vec[0], 0.005);
        let (_, gossip) = me.reply_fields(now + Duration::from_secs(1));
        assert_eq!(gossip[0].age_ms, 3_000);
    }

    #[test]
    fn a_poisoned_peer_coordinate_does_not_move_ours() {
        let me = book("a");
        let now = Instant::now();
        me.observe("b", &coordinate(20.0), Duration::from_millis(20), now)
            .unwrap();
        let before = me.own();
        let poisoned = WireCoordinate {
            vec_ms: vec![f64::INFINITY; 8],
            ..coordinate(0.0)
        };
        assert!(me
            .observe("c", &poisoned, Duration::from_millis(20), now)
            .is_err());
        assert_eq!(me.own(), before);
        assert_eq!(me.known(now).len(), 1, "c is not recorded");
    }

    #[test]
    fn the_wire_form_rounds_to_the_microsecond() {
        let c = Coordinate {
            vec: vec![0.012_345_678; 8],
            height: 0.000_500_4,
            error: 0.123_456,
            adjustment: -0.000_001_4,
        };
        let wire = WireCoordinate::from(&c);
        assert_eq!(wire.vec_ms[0], 12.346);
        assert_eq!(wire.height_ms, 0.5);
        assert_eq!(wire.error, 0.123);
        assert_eq!(wire.adjustment_ms, -0.001);
        let back = Coordinate::from(&wire);
        assert!((back.vec[0] - 0.012_346).abs() < 1e-12);
    }
}
