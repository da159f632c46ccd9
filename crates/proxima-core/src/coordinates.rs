//! Network coordinates: every node predicts its round-trip time to every other node from
//! a point in a synthetic space, trained by a bounded number of real measurements.
//!
//! This is Vivaldi (Dabek, Cox, Kaashoek, Morris, "Vivaldi: A Decentralized Network
//! Coordinate System", SIGCOMM 2004) with the refinements that Serf and Consul run in
//! production (their `coordinate` package, itself after Ledlie et al., "Network
//! Coordinates in the Wild", NSDI 2007, and Lee et al., "On Suitability of Euclidean
//! Embedding", IEEE/ACM ToN 2010). Written here rather than taken from a crate: the
//! crates on crates.io implement the paper's basic rule only (no adjustment term, no
//! gravity, no latency filter), and the whole algorithm is a page of arithmetic.
//!
//! # The model (paper §2.1–2.2 and §5.4)
//!
//! A [`Coordinate`] is a point `x` in an `n`-dimensional Euclidean space (8 dimensions
//! by default, as Serf) plus a *height* `h` ≥ 0 (§5.4, "height vectors"): the Euclidean
//! part models the core of the network, where latency follows distance, and the height
//! models a node's access link, which every packet to or from the node crosses. The
//! predicted RTT between two nodes is `‖x_i − x_j‖ + h_i + h_j`, plus each side's
//! *adjustment* (below). All values are in seconds.
//!
//! # The update (paper §2.4–2.6, Figure 3)
//!
//! Each measured RTT to a peer whose coordinate is known pulls or pushes this node
//! along the line between the two coordinates, as a spring whose rest length is the RTT
//! (§2.2). The step is adaptive (§2.5): with `e_i`, `e_j` the two nodes' error
//! estimates, the weight `w = e_i / (e_i + e_j)` makes a node that is sure of its place
//! (small `e_i`) move little for a peer that is not, and the timestep is `δ = c_c · w`.
//! The error estimate is an exponentially weighted average of the relative error of each
//! sample (§2.6): `e_s = |predicted − rtt| / rtt`, `e_i ← e_s · c_e · w + e_i · (1 − c_e · w)`.
//! A new node starts at the origin with the largest error, so it moves fast until its
//! predictions get good.
//!
//! The move itself follows the height-vector arithmetic of §5.4: the difference of two
//! coordinates is `[x_i − x_j, h_i + h_j]`, its norm `‖x_i − x_j‖ + h_i + h_j`, and a
//! force moves both parts along that unit vector, so the predicted distance changes by
//! exactly the force. Two nodes at the same point separate in a random direction (the
//! random generator is the caller's, so runs repeat).
//!
//! # Refinements (as Serf)
//!
//! * **Latency filter**: each peer's RTT goes through the median of its last few
//!   samples (3) before it reaches the update, so one delayed reply does not throw the
//!   coordinate.
//! * **Adjustment**: a non-Euclidean correction per node, half the mean of the last 20
//!   residuals `rtt − raw distance`, added to predictions (when the sum stays positive);
//!   it absorbs what the space cannot express, such as triangle-inequality violations.
//! * **Gravity**: after every update a weak pull toward the origin, growing with the
//!   square of the distance (`(d / ρ)²` with `ρ` = 150 s), so that the whole system
//!   does not drift away over months of small errors.
//!
//! # What is refused
//!
//! A peer's coordinate comes from the network. A coordinate that is not finite, of
//! another dimension, with a negative height or error, or with any part beyond
//! [`MAX_SECONDS`] is rejected ([`Rejected`]) before it touches this node's own, and so is
//! an RTT of zero or above [`MAX_SECONDS`]. Should arithmetic still produce a non-finite
//! coordinate, the client starts again from the origin rather than keep it.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use rand::{Rng, RngCore};
use serde::{Deserialize, Serialize};

/// Largest RTT taken as a sample, and largest magnitude of any part of a coordinate, in
/// seconds: no link between two nodes of a cluster takes 10 s, so such a value is an
/// error or an attack.
pub const MAX_SECONDS: f64 = 10.0;

/// Below this two points are taken to coincide (1 µs).
const ZERO: f64 = 1e-6;

/// The parameters of the algorithm; the defaults are Serf's.
#[derive(Clone, Debug, PartialEq)]
pub struct VivaldiConfig {
    /// Dimensions of the Euclidean part.
    pub dimensions: usize,
    /// Error of a node that has no observation yet, and the most it can be.
    pub error_max: f64,
    /// `c_e`: the most one sample changes the error estimate.
    pub ce: f64,
    /// `c_c`: the most one sample moves the coordinate (as a share of the error).
    pub cc: f64,
    /// Residuals averaged into the adjustment (0: no adjustment).
    pub adjustment_window: usize,
    /// Smallest height, seconds (every link has some access delay).
    pub height_min: f64,
    /// RTT samples per peer whose median is used.
    pub latency_filter: usize,
    /// `ρ`: the distance from the origin, seconds, at which gravity is as strong as a
    /// one-second error.
    pub gravity_rho: f64,
}

impl Default for VivaldiConfig {
    fn default() -> Self {
        Self {
            dimensions: 8,
            error_max: 1.5,
            ce: 0.25,
            cc: 0.25,
            adjustment_window: 20,
            height_min: 10e-6,
            latency_filter: 3,
            gravity_rho: 150.0,
        }
    }
}

/// A node's place in the coordinate space (see the module docs). Seconds throughout,
/// except `error`, a relative error.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Coordinate {
    /// The Euclidean part.
    pub vec: Vec<f64>,
    /// The access-link part, ≥ 0.
    pub height: f64,
    /// How wrong this node believes its predictions are (1.0: by 100%).
    pub error: f64,
    /// The non-Euclidean correction added to predictions.
    pub adjustment: f64,
}

/// Why a sample was not used.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum Rejected {
    /// The peer's coordinate is not one this node can use (see the module docs).
    #[error("unusable coordinate: {0}")]
    Coordinate(&'static str),
    /// The RTT is zero or absurdly long.
    #[error("RTT {0:?} out of range")]
    Rtt(Duration),
}

impl Coordinate {
    /// Where a node without observations starts: the origin, least confident.
    pub fn origin(config: &VivaldiConfig) -> Self {
        Self {
            vec: vec![0.0; config.dimensions],
            height: config.height_min,
            error: config.error_max,
            adjustment: 0.0,
        }
    }

    /// Whether this coordinate, e.g. read from a peer, can be used with `config`: why
    /// not otherwise.
    pub fn check(&self, config: &VivaldiConfig) -> Result<(), Rejected> {
        let sane = |v: f64| v.is_finite() && v.abs() <= MAX_SECONDS;
        if self.vec.len() != config.dimensions {
            return Err(Rejected::Coordinate("wrong number of dimensions"));
        }
        if !self.vec.iter().all(|v| sane(*v)) {
            return Err(Rejected::Coordinate("vector not finite or too large"));
        }
        if !sane(self.height) || self.height < 0.0 {
            return Err(Rejected::Coordinate("height negative or too large"));
        }
        if !sane(self.adjustment) {
            return Err(Rejected::Coordinate("adjustment not finite or too large"));
        }
        if !self.error.is_finite() || self.error < 0.0 {
            return Err(Rejected::Coordinate("error negative or not finite"));
        }
        Ok(())
    }

    /// The predicted RTT to `other`: the distance, with both adjustments unless that
    /// would make it negative.
    pub fn distance(&self, other: &Coordinate) -> Duration {
        Duration::from_secs_f64(self.distance_secs(other).clamp(0.0, MAX_SECONDS))
    }

    fn distance_secs(&self, other: &Coordinate) -> f64 {
        let raw = self.raw_distance_secs(other);
        let adjusted = raw + self.adjustment + other.adjustment;
        if adjusted > 0.0 {
            adjusted
        } else {
            raw
        }
    }

    fn raw_distance_secs(&self, other: &Coordinate) -> f64 {
        euclidean(&self.vec, &other.vec) + self.height + other.height
    }

    /// This coordinate moved by `force` seconds away from `other` (toward it when
    /// negative), along the height-vector direction (module docs).
    fn pushed(
        &self,
        force: f64,
        other: &Coordinate,
        min_height: f64,
        rng: &mut dyn RngCore,
    ) -> Self {
        let apart = euclidean(&self.vec, &other.vec);
        let mut moved = self.clone();
        if apart < ZERO {
            // Coincident points have no direction between them: pick one, and leave the
            // heights (which do not tell them apart either).
            let direction = random_unit(self.vec.len(), rng);
            for (v, d) in moved.vec.iter_mut().zip(direction) {
                *v += force * d;
            }
            return moved;
        }
        let norm = apart + self.height + other.height;
        for (v, (a, b)) in moved.vec.iter_mut().zip(self.vec.iter().zip(&other.vec)) {
            *v += force * (a - b) / norm;
        }
        moved.height = (self.height + force * (self.height + other.height) / norm).max(min_height);
        moved
    }

    fn is_finite(&self) -> bool {
        self.vec.iter().all(|v| v.is_finite())
            && self.height.is_finite()
            && self.error.is_finite()
            && self.adjustment.is_finite()
    }
}

fn euclidean(a: &[f64], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y) * (x - y))
        .sum::<f64>()
        .sqrt()
}

fn random_unit(dimensions: usize, rng: &mut dyn RngCore) -> Vec<f64> {
    loop {
        let v: Vec<f64> = (0..dimensions).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        if norm > ZERO {
            return v.into_iter().map(|x| x / norm).collect();
        }
    }
}

/// One node's side of the algorithm: its own coordinate, updated from each (peer
/// coordinate, measured RTT) pair, with the per-peer latency filter and the adjustment
/// window it needs.
#[derive(Clone, Debug)]
pub struct VivaldiClient {
    config: VivaldiConfig,
    coordinate: Coordinate,
    origin: Coordinate,
    residuals: VecDeque<f64>,
    recent_rtts: HashMap<String, VecDeque<f64>>,
}

impl VivaldiClient {
    /// A client at the origin.
    pub fn new(config: VivaldiConfig) -> Self {
        let origin = Coordinate::origin(&config);
        Self {
            coordinate: origin.clone(),
            origin,
            residuals: VecDeque::new(),
            recent_rtts: HashMap::new(),
            config,
        }
    }

    /// The parameters in use.
    pub fn config(&self) -> &VivaldiConfig {
        &self.config
    }

    /// This node's coordinate now.
    pub fn coordinate(&self) -> &Coordinate {
        &self.coordinate
    }

    /// Learn from one RTT measured to `node`, whose coordinate is `peer` (module docs).
    /// A rejected sample changes nothing.
    pub fn update(
        &mut self,
        node: &str,
        peer: &Coordinate,
        rtt: Duration,
        rng: &mut dyn RngCore,
    ) -> Result<&Coordinate, Rejected> {
        peer.check(&self.config)?;
        let seconds = rtt.as_secs_f64();
        if seconds <= 0.0 || seconds > MAX_SECONDS {
            return Err(Rejected::Rtt(rtt));
        }
        let filtered = self.filter(node, seconds);
        self.move_toward_rtt(peer, filtered, rng);
        self.adjust(peer, filtered);
        self.apply_gravity(rng);
        if !self.coordinate.is_finite() {
            self.coordinate = self.origin.clone();
        }
        Ok(&self.coordinate)
    }

    /// Drop what is kept for `node` (it left the cluster).
    pub fn forget(&mut self, node: &str) {
        self.recent_rtts.remove(node);
    }

    /// Keep only the peers for which `keep` holds.
    pub fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.recent_rtts.retain(|node, _| keep(node));
    }

    /// The median of the last few RTTs to `node`, `rtt` included.
    fn filter(&mut self, node: &str, rtt: f64) -> f64 {
        let window = self.config.latency_filter.max(1);
        let samples = self.recent_rtts.entry(node.to_string()).or_default();
        samples.push_back(rtt);
        while samples.len() > window {
            samples.pop_front();
        }
        let mut sorted: Vec<f64> = samples.iter().copied().collect();
        sorted.sort_by(f64::total_cmp);
        sorted[sorted.len() / 2]
    }

    /// The spring step with the adaptive timestep and the error estimate (§2.5–2.6).
    fn move_toward_rtt(&mut self, peer: &Coordinate, rtt: f64, rng: &mut dyn RngCore) {
        let c = &self.config;
        let rtt = rtt.max(ZERO);
        let predicted = self.coordinate.distance_secs(peer);
        let sample_error = (predicted - rtt).abs() / rtt;
        let own = self.coordinate.error;
        let weight = own / (own + peer.error.min(c.error_max)).max(ZERO);
        let error = c.ce * weight * sample_error + own * (1.0 - c.ce * weight);
        let force = c.cc * weight * (rtt - predicted);
        self.coordinate = self.coordinate.pushed(force, peer, c.height_min, rng);
        self.coordinate.error = error.min(c.error_max);
    }

    /// Half the mean residual over the window: each side of a pair takes half of what
    /// the space leaves unexplained.
    fn adjust(&mut self, peer: &Coordinate, rtt: f64) {
        let window = self.config.adjustment_window;
        if window == 0 {
            return;
        }
        self.residuals
            .push_back(rtt - self.coordinate.raw_distance_secs(peer));
        while self.residuals.len() > window {
            self.residuals.pop_front();
        }
        let mean = self.residuals.iter().sum::<f64>() / self.residuals.len() as f64;
        self.coordinate.adjustment = (mean / 2.0).clamp(-MAX_SECONDS, MAX_SECONDS);
    }

    fn apply_gravity(&mut self, rng: &mut dyn RngCore) {
        let from_origin = self.coordinate.raw_distance_secs(&self.origin);
        let force = -(from_origin / self.config.gravity_rho).powi(2);
        let (error, adjustment) = (self.coordinate.error, self.coordinate.adjustment);
        self.coordinate = self
            .coordinate
            .pushed(force, &self.origin, self.config.height_min, rng);
        self.coordinate.error = error;
        self.coordinate.adjustment = adjustment;
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    use super::*;

    /// Points in a plane (a 200 ms × 200 ms map) plus an access link per node
    /// (0.5–5 ms), RTT = distance + both access links: a network Vivaldi with height
    /// vectors can represent exactly.
    fn synthetic(nodes: usize, seed: u64) -> Vec<Vec<f64>> {
        let mut rng = SmallRng::seed_from_u64(seed);
        let places: Vec<(f64, f64, f64)> = (0..nodes)
            .map(|_| {
                (
                    rng.gen_range(0.0..0.2),
                    rng.gen_range(0.0..0.2),
                    rng.gen_range(0.0005..0.005),
                )
            })
            .collect();
        places
            .iter()
            .map(|a| {
                places
                    .iter()
                    .map(|b| ((a.0 - b.0).hypot(a.1 - b.1)) + a.2 + b.2)
                    .collect()
            })
            .collect()
    }

    /// `rounds` rounds in which every node measures `per_round` random peers.
    fn train(rtt: &[Vec<f64>], rounds: usize, per_round: usize, seed: u64) -> Vec<VivaldiClient> {
        let n = rtt.len();
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut clients: Vec<VivaldiClient> = (0..n)
            .map(|_| VivaldiClient::new(VivaldiConfig::default()))
            .collect();
        for _ in 0..rounds {
            for i in 0..n {
                for _ in 0..per_round {
                    let j = (i + rng.gen_range(1..n)) % n;
                    let peer = clients[j].coordinate().clone();
                    let sample = Duration::from_secs_f64(rtt[i][j]);
                    clients[i]
                        .update(&format!("n{j}"), &peer, sample, &mut rng)
                        .unwrap();
                }
            }
        }
        clients
    }

    fn median_relative_error(rtt: &[Vec<f64>], clients: &[VivaldiClient]) -> f64 {
        let mut errors = Vec::new();
        for (i, a) in clients.iter().enumerate() {
            for (j, b) in clients.iter().enumerate().filter(|(j, _)| *j != i) {
                let predicted = a.coordinate().distance(b.coordinate()).as_secs_f64();
                errors.push((predicted - rtt[i][j]).abs() / rtt[i][j]);
            }
        }
        errors.sort_by(f64::total_cmp);
        errors[errors.len() / 2]
    }

    #[test]
    fn converges_on_a_plane_with_access_links() {
        let rtt = synthetic(40, 11);
        let untrained = median_relative_error(&rtt, &train(&rtt, 0, 0, 1));
        assert!(
            untrained > 0.9,
            "at the origin everything is predicted ~0: {untrained}"
        );
        let clients = train(&rtt, 100, 8, 1);
        let error = median_relative_error(&rtt, &clients);
        assert!(error < 0.08, "median relative error {error}");
        let confident = clients
            .iter()
            .filter(|c| c.coordinate().error < 0.3)
            .count();
        assert!(
            confident >= 36,
            "{confident} of 40 nodes trust their coordinate"
        );
    }

    #[test]
    fn repeated_samples_keep_it_still() {
        let rtt = synthetic(12, 5);
        let mut clients = train(&rtt, 150, 4, 2);
        let before = median_relative_error(&rtt, &clients);
        let mut rng = SmallRng::seed_from_u64(9);
        let start = clients[0].coordinate().clone();
        let peer = clients[1].coordinate().clone();
        for _ in 0..1000 {
            clients[0]
                .update("n1", &peer, Duration::from_secs_f64(rtt[0][1]), &mut rng)
                .unwrap();
        }
        let moved = euclidean(&start.vec, &clients[0].coordinate().vec);
        let predicted = clients[0].coordinate().distance(&peer).as_secs_f64();
        assert!(
            (predicted - rtt[0][1]).abs() / rtt[0][1] < 0.05,
            "{predicted} vs {}",
            rtt[0][1]
        );
        // A thousand samples of one pair pull that pair right, and no further.
        assert!(moved < rtt[0][1], "moved {moved} s");
        let after = median_relative_error(&rtt, &clients);
        assert!(after < before + 0.05, "{before} -> {after}");
    }

    #[test]
    fn bad_coordinates_and_rtts_from_the_wire_change_nothing() {
        let config = VivaldiConfig::default();
        let mut rng = SmallRng::seed_from_u64(3);
        let mut client = VivaldiClient::new(config.clone());
        let good = Coordinate {
            vec: vec![0.01; 8],
            height: 0.001,
            error: 0.2,
            adjustment: 0.0,
        };
        for _ in 0..20 {
            client
                .update("good", &good, Duration::from_millis(30), &mut rng)
                .unwrap();
        }
        let before = client.coordinate().clone();
        let with = |f: &dyn Fn(&mut Coordinate)| {
            let mut c = good.clone();
            f(&mut c);
            c
        };
        let bad = [
            with(&|c| c.vec[3] = f64::NAN),
            with(&|c| c.vec[0] = f64::INFINITY),
            with(&|c| c.vec[0] = 1e9),
            with(&|c| c.vec.truncate(2)),
            with(&|c| c.height = -0.001),
            with(&|c| c.height = f64::NAN),
            with(&|c| c.error = f64::NAN),
            with(&|c| c.error = -1.0),
            with(&|c| c.adjustment = f64::NEG_INFINITY),
            with(&|c| c.adjustment = 1e6),
        ];
        for peer in &bad {
            let rejected = client.update("bad", peer, Duration::from_millis(30), &mut rng);
            assert!(matches!(rejected, Err(Rejected::Coordinate(_))), "{peer:?}");
        }
        for rtt in [Duration::ZERO, Duration::from_secs(11), Duration::MAX] {
            let rejected = client.update("good", &good, rtt, &mut rng);
            assert_eq!(rejected, Err(Rejected::Rtt(rtt)));
        }
        assert_eq!(client.coordinate(), &before);
        assert!(client.coordinate().check(&config).is_ok());
    }

    #[test]
    fn one_delayed_reply_is_filtered_out() {
        let mut rng = SmallRng::seed_from_u64(4);
        let peer = Coordinate {
            vec: vec![0.02; 8],
            height: 0.001,
            error: 0.1,
            adjustment: 0.0,
        };
        let mut client = VivaldiClient::new(VivaldiConfig::default());
        for _ in 0..50 {
            client
                .update("p", &peer, Duration::from_millis(40), &mut rng)
                .unwrap();
        }
        let settled = client.coordinate().clone();
        client
            .update("p", &peer, Duration::from_secs(2), &mut rng)
            .unwrap();
        let after = client.coordinate().distance(&peer).as_secs_f64();
        assert!(
            (after - 0.040).abs() < 0.004,
            "a 2 s outlier moved it to {after}"
        );
        assert!(euclidean(&settled.vec, &client.coordinate().vec) < 0.004);
    }

    #[test]
    fn the_same_seed_gives_the_same_coordinates() {
        let rtt = synthetic(10, 8);
        let a = train(&rtt, 20, 3, 42);
        let b = train(&rtt, 20, 3, 42);
        let c = train(&rtt, 20, 3, 43);
        let coords = |cs: &[VivaldiClient]| -> Vec<Coordinate> {
            cs.iter().map(|c| c.coordinate().clone()).collect()
        };
        assert_eq!(coords(&a), coords(&b));
        assert_ne!(coords(&a), coords(&c));
    }

    #[test]
    fn distance_is_symmetric_and_includes_heights_and_adjustments() {
        let a = Coordinate {
            vec: vec![0.003, 0.004],
            height: 0.001,
            error: 0.1,
            adjustment: 0.0005,
        };
        let b = Coordinate {
            vec: vec![0.0, 0.0],
            height: 0.002,
            error: 0.1,
            adjustment: -0.0002,
        };
        let expected = 0.005 + 0.001 + 0.002 + 0.0005 - 0.0002;
        assert!((a.distance(&b).as_secs_f64() - expected).abs() < 1e-9);
        assert_eq!(a.distance(&b), b.distance(&a));
        // Adjustments that would make it negative are ignored.
        let far_below = Coordinate {
            adjustment: -1.0,
            ..b.clone()
        };
        assert!((a.distance(&far_below).as_secs_f64() - 0.008).abs() < 1e-9);
    }
}
