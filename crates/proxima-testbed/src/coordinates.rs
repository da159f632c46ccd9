//! `proxima-testbed coordinates`: how well network coordinates predict the RTTs of a
//! generated cluster, and what they cost on the wire, without starting a single process.
//!
//! The latency matrix is the one `proxima-testbed generate` writes for the same
//! `--nodes`, `--regions` and `--seed` (read back through the scenario parser, so it is
//! exactly what an emulated run would use). Every node then runs the prober's rounds in
//! simulated time, with the prober's own parts and the network replaced by the matrix:
//!
//! * each round, every node chooses up to `peers_per_round` peers with
//!   [`proxima_nodes::sample::select`] (the same tiers, history and refresh time);
//! * each probe's RTT is twice the one-way delay, plus random jitter;
//! * the peer answers with a real [`PingReply`] built from its [`NodeCoordinates`]
//!   (its coordinate and its relayed ones), serialised to JSON and parsed back, so that
//!   the wire's rounding and its size are the real ones;
//! * the prober's side is the same two calls the prober makes:
//!   [`NodeCoordinates::observe`] and [`NodeCoordinates::learn`].
//!
//! After each round every node's prediction of every other node's RTT is read as the
//! router would read it ([`Environment::predicted_rtt`], trust threshold included) and
//! compared with the true RTT.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use proxima_core::coordinates::VivaldiConfig;
use proxima_core::Environment;
use proxima_nodes::coordinates::NodeCoordinates;
use proxima_nodes::ping::WireUsage;
use proxima_nodes::sample::{self, Peer, ProbeHistory};
use proxima_nodes::{PingReply, ProberConfig};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::generate::{generate, GenerateOptions};
use crate::ScenarioFile;

/// What to simulate.
#[derive(Clone, Debug)]
pub struct SimOptions {
    /// Nodes, 2 to 250 (as `generate`).
    pub nodes: usize,
    /// Regions of the generated topology.
    pub regions: usize,
    /// Seed of the topology and of every random choice of the simulation.
    pub seed: u64,
    /// Probe rounds.
    pub rounds: usize,
    /// Most peers a node probes per round.
    pub peers_per_round: usize,
    /// Time between rounds.
    pub interval: Duration,
    /// How long a reading stays fresh (the environment's `max_age`).
    pub max_age: Duration,
    /// Largest jitter added to an RTT sample, as a share of the RTT.
    pub jitter: f64,
    /// A pair counts as "not probed recently" when its last probe is older than this.
    pub recent: Duration,
    /// The coordinates' parameters.
    pub vivaldi: VivaldiConfig,
}

impl SimOptions {
    /// The prober's and environment's defaults for `nodes`, `regions` and `seed`.
    pub fn new(nodes: usize, regions: usize, seed: u64) -> Self {
        let prober = ProberConfig::default();
        Self {
            nodes,
            regions,
            seed,
            rounds: 60,
            peers_per_round: prober.max_peers_per_round,
            interval: prober.interval,
            max_age: Environment::default().max_age,
            jitter: 0.05,
            recent: Duration::from_secs(10),
            vivaldi: VivaldiConfig::default(),
        }
    }
}

/// Prediction error over a set of node pairs.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ErrorStats {
    /// Ordered pairs in the set.
    pub pairs: usize,
    /// Of them, pairs with a prediction.
    pub predicted: usize,
    /// Median relative error `|predicted − true| / true` over the predicted pairs.
    pub median: Option<f64>,
    /// 90th percentile of the same.
    pub p90: Option<f64>,
}

impl ErrorStats {
    fn of(pairs: usize, mut errors: Vec<f64>) -> Self {
        errors.sort_by(f64::total_cmp);
        let at = |q: f64| -> Option<f64> {
            let last = errors.len().checked_sub(1)?;
            Some(errors[((last as f64) * q).round() as usize])
        };
        Self {
            pairs,
            predicted: errors.len(),
            median: at(0.5),
            p90: at(0.9),
        }
    }
}

/// The prediction error after one round.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RoundError {
    /// Rounds done (1-based).
    pub round: usize,
    /// Over every ordered pair of distinct nodes.
    pub all: ErrorStats,
    /// Over the pairs whose last probe is older than [`SimOptions::recent`] (or that
    /// were never probed).
    pub not_recent: ErrorStats,
    /// Over the pairs without a fresh measurement ([`SimOptions::max_age`]): where the
    /// router uses the prediction.
    pub unmeasured: ErrorStats,
}

/// What a simulation found.
#[derive(Clone, Debug)]
pub struct SimReport {
    /// The options it ran with.
    pub options: SimOptions,
    /// The error after every round.
    pub rounds: Vec<RoundError>,
    /// Bytes of one probe's request, as the prober sends it.
    pub request_bytes: usize,
    /// Mean bytes of one reply (head and JSON body) over the last round.
    pub reply_bytes: f64,
    /// Largest reply seen, bytes.
    pub largest_reply: usize,
    /// Mean probes per node per round over the last round.
    pub probes_per_round: f64,
    /// After the last round, over pairs in the same zone, the same region, and
    /// different regions.
    pub by_class: [ErrorStats; 3],
    /// The nodes' own coordinates after the last round.
    pub nodes_after: NodeShape,
}

impl SimReport {
    /// Probe bytes (request and reply) a node causes per second by its own probes.
    pub fn bytes_per_node_per_second(&self) -> f64 {
        (self.request_bytes as f64 + self.reply_bytes) * self.probes_per_round
            / self.options.interval.as_secs_f64()
    }

    /// The error after the last round.
    pub fn last(&self) -> Option<&RoundError> {
        self.rounds.last()
    }
}

/// A generated topology: where each node is and the one-way delays between them.
#[derive(Clone, Debug)]
pub struct Topology {
    /// `one_way[from][to]`.
    pub one_way: Vec<Vec<Duration>>,
    /// Each node's (region, zone).
    pub place: Vec<(Option<String>, Option<String>)>,
}

impl Topology {
    /// Whether nodes `i` and `j` share a zone (0), only a region (1), or neither (2).
    pub fn class(&self, i: usize, j: usize) -> usize {
        let (a, b) = (&self.place[i], &self.place[j]);
        if a.0 != b.0 {
            2
        } else if a.1 != b.1 {
            1
        } else {
            0
        }
    }

    fn rtt(&self, i: usize, j: usize) -> Duration {
        self.one_way[i][j] + self.one_way[j][i]
    }
}

/// The topology `generate` writes for these options.
pub fn generated(nodes: usize, regions: usize, seed: u64) -> Result<Topology, String> {
    let text = generate(&GenerateOptions {
        nodes,
        regions,
        services: 1,
        seed,
        duration_s: 20,
    })?;
    let file = ScenarioFile::parse(&text).map_err(|e| e.to_string())?;
    let scenario = file.variant("").map_err(|e| e.to_string())?;
    Ok(Topology {
        one_way: scenario.latency.one_way,
        place: scenario
            .nodes
            .into_iter()
            .map(|n| (n.region, n.zone))
            .collect(),
    })
}

/// A topology of the same shape as `generate`'s (nodes spread over `regions` regions
/// in turn, two zones per region) whose delays come from places in a plane instead of
/// independent draws per pair: regions 25-70 ms apart one way, zones within a region
/// 5-15 ms apart, nodes within 1-2 ms of their zone's centre, plus an access link of
/// 0.1-0.5 ms per node. It obeys the triangle inequality, as delays that follow
/// geography mostly do, and so tells what the coordinates can do where a metric
/// space fits.
pub fn planar(nodes: usize, regions: usize, seed: u64) -> Topology {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut around = |centre: (f64, f64), from: f64, to: f64| {
        let angle = rng.gen_range(0.0..std::f64::consts::TAU);
        let r = rng.gen_range(from..to);
        (centre.0 + r * angle.cos(), centre.1 + r * angle.sin())
    };
    // Region centres on a circle whose chord between neighbours is about 47 ms.
    let radius = 0.047 / (2.0 * (std::f64::consts::PI / regions.max(2) as f64).sin());
    let region_centre: Vec<(f64, f64)> = (0..regions)
        .map(|r| {
            let a = std::f64::consts::TAU * r as f64 / regions as f64;
            (radius * a.cos(), radius * a.sin())
        })
        .collect();
    let zone_centre: Vec<[(f64, f64); 2]> = region_centre
        .iter()
        .map(|c| [around(*c, 0.0025, 0.0075), around(*c, 0.0025, 0.0075)])
        .collect();
    let place: Vec<(usize, usize)> = (0..nodes)
        .map(|i| (i % regions, (i / regions) % 2))
        .collect();
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x5eed);
    let points: Vec<((f64, f64), f64)> = place
        .iter()
        .map(|(r, z)| {
            let centre = zone_centre[*r][*z];
            let angle = rng.gen_range(0.0..std::f64::consts::TAU);
            let d = rng.gen_range(0.001..0.002) / 2.0;
            let point = (centre.0 + d * angle.cos(), centre.1 + d * angle.sin());
            (point, rng.gen_range(0.0001..0.0005))
        })
        .collect();
    let one_way = points
        .iter()
        .map(|(a, access_a)| {
            points
                .iter()
                .map(|(b, access_b)| {
                    let d = (a.0 - b.0).hypot(a.1 - b.1);
                    Duration::from_secs_f64(d + access_a + access_b)
                })
                .collect()
        })
        .collect();
    Topology {
        one_way,
        place: place
            .iter()
            .map(|(r, z)| (Some(format!("r{r}")), Some(format!("r{r}-{z}"))))
            .collect(),
    }
}

/// The error of a predictor that knows, for each pair, only whether the two nodes share
/// a zone, a region or neither, and predicts the median true RTT of that class: the
/// generator draws each pair's delay at random within its class, which no predictor
/// that does not measure the pair can know.
pub fn class_baseline(topology: &Topology) -> ErrorStats {
    let n = topology.one_way.len();
    let rtt = |i: usize, j: usize| topology.rtt(i, j).as_secs_f64();
    let class = |i: usize, j: usize| topology.class(i, j);
    let pairs = || (0..n).flat_map(move |i| (0..n).filter(move |j| *j != i).map(move |j| (i, j)));
    let mut by_class: [Vec<f64>; 3] = Default::default();
    for (i, j) in pairs() {
        by_class[class(i, j)].push(rtt(i, j));
    }
    let medians: Vec<f64> = by_class
        .iter_mut()
        .map(|v| {
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied().unwrap_or(0.0)
        })
        .collect();
    let errors: Vec<f64> = pairs()
        .map(|(i, j)| (medians[class(i, j)] - rtt(i, j)).abs() / rtt(i, j))
        .collect();
    ErrorStats::of(errors.len(), errors)
}

struct SimNode {
    name: String,
    coordinates: NodeCoordinates,
    peers: Vec<Peer>,
    history: HashMap<String, ProbeHistory>,
    rng: SmallRng,
}

fn node_name(i: usize) -> String {
    format!("edge-{}", i + 1)
}

fn node_addr(i: usize) -> SocketAddr {
    let i = u32::try_from(i).unwrap_or(u32::MAX);
    SocketAddr::new(IpAddr::V4(Ipv4Addr::from(0x0a00_0001 + i)), 9901)
}

/// The request the prober sends (see `prober::exchange`): hyper writes header names in
/// lower case.
fn request_bytes(to: SocketAddr) -> usize {
    format!("GET /node/ping HTTP/1.1\r\nhost: {to}\r\nuser-agent: proxima-peer-prober\r\n\r\n")
        .len()
}

/// The admin server's reply head for a body of `body` bytes, as hyper writes it.
fn reply_head_bytes(body: usize) -> usize {
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {body}\r\n\
         date: Sat, 28 Nov 2026 01:00:00 GMT\r\n\r\n"
    )
    .len()
}

/// Run the simulation on `one_way` (see the module docs); `progress` is called after
/// every round with the round's error.
pub fn simulate(
    options: &SimOptions,
    topology: &Topology,
    progress: &mut dyn FnMut(&RoundError),
) -> SimReport {
    let n = topology.one_way.len();
    let mut rng = SmallRng::seed_from_u64(options.seed);
    let mut nodes: Vec<SimNode> = (0..n)
        .map(|i| SimNode {
            name: node_name(i),
            coordinates: NodeCoordinates::new(
                Some(node_name(i)),
                options.vivaldi.clone(),
                options.max_age,
                options.seed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15),
            ),
            peers: (0..n)
                .filter(|j| *j != i)
                .map(|j| Peer {
                    node: node_name(j),
                    addr: node_addr(j),
                    hosts_endpoints: false,
                })
                .collect(),
            history: HashMap::new(),
            rng: SmallRng::seed_from_u64(rng.gen()),
        })
        .collect();
    let start = Instant::now();
    let mut last_probe: Vec<Vec<Option<Instant>>> = vec![vec![None; n]; n];
    let mut rounds = Vec::new();
    let (mut reply_total, mut replies, mut largest) = (0usize, 0usize, 0usize);
    for round in 0..options.rounds {
        let now = start + options.interval * u32::try_from(round).unwrap_or(u32::MAX);
        (reply_total, replies) = (0, 0);
        let mut order: Vec<usize> = (0..n).collect();
        rand::seq::SliceRandom::shuffle(&mut order[..], &mut rng);
        for i in order {
            let chosen = {
                let node = &mut nodes[i];
                sample::select(
                    node.peers.clone(),
                    &node.history,
                    now,
                    options.max_age / 2,
                    options.peers_per_round,
                    &mut node.rng,
                )
            };
            for peer in chosen {
                let j = node_index(&peer.node);
                let true_rtt = topology.rtt(i, j);
                let rtt = true_rtt.mul_f64(1.0 + rng.gen_range(0.0..=options.jitter));
                let received = now + rtt;
                let body = reply_of(&nodes[j], received);
                let size = body.len() + reply_head_bytes(body.len());
                (reply_total, replies, largest) =
                    (reply_total + size, replies + 1, largest.max(size));
                let reply: PingReply =
                    serde_json::from_slice(&body).expect("a reply we serialised parses");
                let node = &mut nodes[i];
                if let Some(c) = &reply.coordinate {
                    let _ = node.coordinates.observe(&peer.node, c, rtt, received);
                }
                node.coordinates.learn(&reply.gossip, received);
                let seen = node.history.entry(peer.node.clone()).or_default();
                seen.last_attempt = Some(now);
                seen.last_success = Some(received);
                last_probe[i][j] = Some(received);
            }
        }
        let end = now + options.interval;
        let error = measure(options, topology, &nodes, &last_probe, round + 1, end);
        progress(&error);
        rounds.push(error);
    }
    let end = start + options.interval * u32::try_from(options.rounds).unwrap_or(u32::MAX);
    SimReport {
        options: options.clone(),
        rounds,
        request_bytes: request_bytes(node_addr(n.saturating_sub(1))),
        reply_bytes: reply_total as f64 / replies.max(1) as f64,
        largest_reply: largest,
        probes_per_round: replies as f64 / n.max(1) as f64,
        by_class: by_class(options, topology, &nodes, end),
        nodes_after: node_shape(&nodes),
    }
}

/// The error over pairs in the same zone, the same region and different regions.
fn by_class(
    options: &SimOptions,
    topology: &Topology,
    nodes: &[SimNode],
    now: Instant,
) -> [ErrorStats; 3] {
    let mut classes: [(usize, Vec<f64>); 3] = Default::default();
    for (i, node) in nodes.iter().enumerate() {
        let env = environment_of(node, options.max_age, now);
        for j in (0..nodes.len()).filter(|j| *j != i) {
            let truth = topology.rtt(i, j).as_secs_f64();
            let (pairs, errors) = &mut classes[topology.class(i, j)];
            *pairs += 1;
            errors.extend(
                env.predicted_rtt(&nodes[j].name, now)
                    .map(|p| (p.as_secs_f64() - truth).abs() / truth),
            );
        }
    }
    classes.map(|(pairs, errors)| ErrorStats::of(pairs, errors))
}

/// What the nodes' own coordinates look like after the last round.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct NodeShape {
    /// Median of the nodes' own error estimates.
    pub error_median: f64,
    /// Largest of them.
    pub error_max: f64,
    /// Median height (the access-link part), seconds.
    pub height_median: f64,
    /// Median adjustment term, seconds.
    pub adjustment_median: f64,
}

fn node_shape(nodes: &[SimNode]) -> NodeShape {
    let own: Vec<_> = nodes.iter().map(|n| n.coordinates.own()).collect();
    let sorted = |f: &dyn Fn(&proxima_core::coordinates::Coordinate) -> f64| {
        let mut v: Vec<f64> = own.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v
    };
    let median = |v: &[f64]| v.get(v.len() / 2).copied().unwrap_or(0.0);
    let errors = sorted(&|c| c.error);
    NodeShape {
        error_median: median(&errors),
        error_max: errors.last().copied().unwrap_or(0.0),
        height_median: median(&sorted(&|c| c.height)),
        adjustment_median: median(&sorted(&|c| c.adjustment)),
    }
}

fn node_index(name: &str) -> usize {
    name.strip_prefix("edge-")
        .and_then(|i| i.parse::<usize>().ok())
        .map_or(0, |i| i - 1)
}

/// The JSON body `node` answers with at `now` (as `LocalNode::reply`, with usage).
fn reply_of(node: &SimNode, now: Instant) -> Vec<u8> {
    let (coordinate, gossip) = node.coordinates.reply_fields(now);
    let reply = PingReply {
        node: Some(node.name.clone()),
        usage: Some(WireUsage {
            cpu: 0.314_159,
            ram: 0.271_828,
        }),
        usage_age_ms: Some(1234),
        at_ms: 1_795_000_000_000,
        coordinate: Some(coordinate),
        gossip,
        // Pod reports travel in the same replies, up to `--peer-share-bytes` more; this
        // counts what the coordinates add.
        pods: Vec::new(),
    };
    serde_json::to_vec(&reply).expect("numbers and strings serialise")
}

/// Every node's predictions at `now`, against the truth.
fn measure(
    options: &SimOptions,
    topology: &Topology,
    nodes: &[SimNode],
    last_probe: &[Vec<Option<Instant>>],
    round: usize,
    now: Instant,
) -> RoundError {
    let n = nodes.len();
    let mut all = (0, Vec::new());
    let mut not_recent = (0, Vec::new());
    let mut unmeasured = (0, Vec::new());
    for (i, node) in nodes.iter().enumerate() {
        let env = environment_of(node, options.max_age, now);
        for j in (0..n).filter(|j| *j != i) {
            let truth = topology.rtt(i, j).as_secs_f64();
            let error = env
                .predicted_rtt(&nodes[j].name, now)
                .map(|p| (p.as_secs_f64() - truth).abs() / truth);
            let age = last_probe[i][j].map(|at| now.saturating_duration_since(at));
            let sets = [
                (true, &mut all),
                (age.is_none_or(|a| a > options.recent), &mut not_recent),
                (age.is_none_or(|a| a > options.max_age), &mut unmeasured),
            ];
            for (member, (pairs, errors)) in sets {
                if member {
                    *pairs += 1;
                    errors.extend(error);
                }
            }
        }
    }
    RoundError {
        round,
        all: ErrorStats::of(all.0, all.1),
        not_recent: ErrorStats::of(not_recent.0, not_recent.1),
        unmeasured: ErrorStats::of(unmeasured.0, unmeasured.1),
    }
}

/// What the prober would publish for `node` at `now`.
fn environment_of(node: &SimNode, max_age: Duration, now: Instant) -> Environment {
    let mut env = Environment {
        max_age,
        local_coordinate: Some(node.coordinates.own()),
        ..Environment::default()
    };
    for (name, reading) in node.coordinates.known(now) {
        env.set_coordinate(name, reading.coordinate, reading.at);
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_laid_out_in_a_plane_is_predicted_closely() {
        let options = SimOptions {
            rounds: 40,
            ..SimOptions::new(20, 3, 1)
        };
        let topology = planar(options.nodes, options.regions, options.seed);
        for i in 0..20 {
            for j in (0..20).filter(|j| *j != i) {
                let rtt = topology.rtt(i, j);
                match topology.class(i, j) {
                    0 => assert!(rtt < Duration::from_millis(8), "{i}-{j}: {rtt:?}"),
                    2 => assert!(rtt > Duration::from_millis(50), "{i}-{j}: {rtt:?}"),
                    _ => {}
                }
            }
        }
        let report = simulate(&options, &topology, &mut |_| {});
        let last = report.last().unwrap();
        let median = last.all.median.unwrap();
        assert!(median < 0.1, "median relative error {median}: {last:?}");
    }

    #[test]
    fn a_small_generated_cluster_is_predicted_well_and_cheaply() {
        let options = SimOptions {
            rounds: 40,
            ..SimOptions::new(20, 3, 1)
        };
        let topology = generated(options.nodes, options.regions, options.seed).unwrap();
        assert_eq!(topology.one_way.len(), 20);
        let report = simulate(&options, &topology, &mut |_| {});
        let baseline = class_baseline(&topology);
        eprintln!("{:?}\nbaseline {baseline:?}", report.last());
        let last = report.last().unwrap();
        assert_eq!(last.all.pairs, 20 * 19);
        assert!(last.all.predicted >= 20 * 19 * 9 / 10, "{last:?}");
        let median = last.all.median.unwrap();
        assert!(median < 0.25, "median relative error {median}");
        // 19 peers, all probed each round; a reply of 8 relayed coordinates is a few
        // hundred bytes.
        assert_eq!(report.probes_per_round, 19.0);
        assert!(report.largest_reply < 4096, "{}", report.largest_reply);
        assert!(report.reply_bytes > 300.0);
        let again = simulate(&options, &topology, &mut |_| {});
        assert_eq!(again.rounds, report.rounds, "the same seed, the same run");
    }
}
