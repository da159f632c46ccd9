//! RAP, the Resource Adaptive Proxy (Nguyen et al., "RAP: Resource Adaptive Proxy for
//! Kubernetes edge clusters", §4.2 and Algorithm 1).
//!
//! Requests are served **locally** while the local node's CPU and RAM usage are both
//! under their thresholds (90% by default, as in §5). Otherwise they go to the **best
//! remote node**: among the other nodes that host a pod of the service and are
//! themselves under the thresholds, the one with the highest score
//!
//! ```text
//! τᵢ = Σᵣ Wᵣ · φᵢʳ           (Eq. 2)      best = argmax τᵢ   (Eq. 3)
//! ```
//!
//! where φᵢʳ is resource r of node i normalised to a common unit (Eq. 1, φ = R/β). We
//! normalise every resource to "how much better is this node", in [0, 1]:
//! `φ_cpu = 1 − cpu usage`, `φ_ram = 1 − ram usage` (free share of allocatable), and
//! `φ_latency = l_min / lᵢ` (the closest candidate node scores 1). The weights
//! `rap-weight-cpu`, `rap-weight-ram`, `rap-weight-latency` (default 1 each) are
//! normalised to sum to 1. If every remote node is over the threshold, RAP stays local.
//! Within the chosen node, pods are picked uniformly.
//!
//! Missing data: a node without fresh usage readings is treated as under the threshold
//! (so RAP keeps its local-first behaviour without metrics) but earns no CPU/RAM score;
//! a node without a fresh latency earns no latency score. With no data at all RAP
//! therefore serves locally, and when there is no local pod it goes to a remote node
//! chosen uniformly among the equally scored ones. When there is no local pod and every
//! remote node is over the threshold, the highest-scoring one is used anyway: serving
//! late beats not serving.
//!
//! Cost per pick: O(nodes). The algorithm only ever compares nodes, so the endpoints are
//! grouped by node once per routing table, the nodes' fresh readings are cached until
//! the environment changes or one of them turns stale (see [`crate::route`]), and the
//! candidates per node are counted without visiting every endpoint (see
//! [`PickContext::node_candidates`]).

use rand::{Rng, RngCore};

use super::params::Params;
use super::{Choice, PickContext, Strategy};
use crate::environment::Usage;
use crate::settings::{ServiceSettings, SettingError};

/// RAP's thresholds and weights (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct Rap {
    /// CPU usage (fraction of allocatable) at or above which a node is overloaded (default
    /// 0.9).
    pub cpu_threshold: f64,
    /// RAM usage (fraction of allocatable) at or above which a node is overloaded (default
    /// 0.9).
    pub ram_threshold: f64,
    /// Weight of free CPU in a node's score, before the weights are normalised to sum to 1.
    pub weight_cpu: f64,
    /// Weight of free RAM in a node's score, before normalising.
    pub weight_ram: f64,
    /// Weight of closeness (`l_min / l`) in a node's score, before normalising.
    pub weight_latency: f64,
}

impl Default for Rap {
    fn default() -> Self {
        Self {
            cpu_threshold: 0.9,
            ram_threshold: 0.9,
            weight_cpu: 1.0 / 3.0,
            weight_ram: 1.0 / 3.0,
            weight_latency: 1.0 / 3.0,
        }
    }
}

impl Rap {
    /// From `rap-cpu-threshold`, `rap-ram-threshold` (percent) and `rap-weight-*`.
    pub fn build(settings: &ServiceSettings) -> (Box<dyn Strategy>, Vec<SettingError>) {
        let (rap, errors) = Self::from_settings(settings);
        (Box::new(rap), errors)
    }

    /// [`Self::build`], unboxed.
    pub fn from_settings(settings: &ServiceSettings) -> (Rap, Vec<SettingError>) {
        let mut p = Params::new(settings, "rap");
        let mut rap = Rap {
            cpu_threshold: p.percent("cpu-threshold", 0.9),
            ram_threshold: p.percent("ram-threshold", 0.9),
            weight_cpu: p.number("weight-cpu", 1.0, 0.0, 1000.0),
            weight_ram: p.number("weight-ram", 1.0, 0.0, 1000.0),
            weight_latency: p.number("weight-latency", 1.0, 0.0, 1000.0),
        };
        let sum = rap.weight_cpu + rap.weight_ram + rap.weight_latency;
        if sum > 0.0 {
            rap.weight_cpu /= sum;
            rap.weight_ram /= sum;
            rap.weight_latency /= sum;
        } else {
            p.errors.push(SettingError::new(
                "rap-weight-cpu",
                "0",
                "weights that are not all zero",
            ));
            rap = Rap {
                cpu_threshold: rap.cpu_threshold,
                ram_threshold: rap.ram_threshold,
                ..Rap::default()
            };
        }
        (rap, p.errors)
    }

    fn under_threshold(&self, usage: Option<Usage>) -> bool {
        usage.is_none_or(|u| u.cpu < self.cpu_threshold && u.ram < self.ram_threshold)
    }

    /// Score of a remote node (Eq. 2 with our normalisation).
    fn score(&self, usage: Option<Usage>, latency_ratio: Option<f64>) -> f64 {
        let (cpu, ram) = usage.map_or((0.0, 0.0), |u| {
            ((1.0 - u.cpu).clamp(0.0, 1.0), (1.0 - u.ram).clamp(0.0, 1.0))
        });
        self.weight_cpu * cpu
            + self.weight_ram * ram
            + self.weight_latency * latency_ratio.unwrap_or(0.0)
    }
}

impl Strategy for Rap {
    fn name(&self) -> &'static str {
        "rap"
    }

    fn pick(&self, ctx: &PickContext<'_>, rng: &mut dyn RngCore) -> Option<Choice> {
        let readings = ctx.node_readings();
        let candidates = ctx.node_candidates();
        let local = readings.local.filter(|&g| candidates.count(g) > 0);
        if let Some(local) = local {
            if self.under_threshold(readings.local_usage) {
                return candidates.uniform(local, rng);
            }
        }
        // The other nodes with a candidate, in node-name order.
        let remote: Vec<usize> = (0..ctx.route.nodes().len())
            .filter(|&g| Some(g) != readings.local && candidates.count(g) > 0)
            .collect();
        let l_min = remote.iter().filter_map(|&g| readings.latency[g]).min();
        let score = |g: usize| {
            let ratio = match (l_min, readings.latency[g]) {
                (Some(min), Some(l)) if !l.is_zero() => Some(min.as_secs_f64() / l.as_secs_f64()),
                (Some(_), Some(_)) => Some(1.0),
                _ => None,
            };
            self.score(readings.usage[g], ratio)
        };
        // The best node (Eq. 3), uniformly among ties; only among the nodes under the
        // thresholds when `only_under`.
        let best = |only_under: bool, rng: &mut dyn RngCore| {
            let eligible = || {
                remote
                    .iter()
                    .copied()
                    .filter(|&g| !only_under || self.under_threshold(readings.usage[g]))
            };
            let top = eligible().map(score).fold(f64::NEG_INFINITY, f64::max);
            let ties = || eligible().filter(|&g| score(g) >= top - 1e-12);
            let n = ties().count();
            (n > 0).then(|| ties().nth(rng.gen_range(0..n))).flatten()
        };
        if let Some(node) = best(true, rng) {
            return candidates.uniform(node, rng);
        }
        // Every remote node is over the threshold: stay local (Algorithm 1) ...
        if let Some(local) = local {
            return candidates.uniform(local, rng);
        }
        // ... and with no local pod, the least loaded remote node still serves.
        best(false, rng).and_then(|node| candidates.uniform(node, rng))
    }
}

#[cfg(test)]
mod tests {
    //! The O(nodes) pick against the algorithm written out over every candidate, on
    //! random clusters with exclusions, cooldowns and stale readings: same RNG, same
    //! choices.

    use std::collections::BTreeMap;
    use std::net::{Ipv4Addr, SocketAddr};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use rand::rngs::SmallRng;
    use rand::{Rng, RngCore, SeedableRng};

    use super::super::{Choice, PickContext, Reason, Strategy};
    use super::Rap;
    use crate::endpoint::{EndpointState, Observation, Outcome};
    use crate::environment::{Environment, Usage};
    use crate::model::{Conditions, Endpoint, ServiceKey, ServiceSpec};
    use crate::route::{Route, RouteEndpoint};
    use crate::settings::ServiceSettings;

    /// RAP as first written: candidates grouped by node on every pick.
    fn reference(rap: &Rap, ctx: &PickContext<'_>, rng: &mut dyn RngCore) -> Option<Choice> {
        let (now, env) = (ctx.now, ctx.environment);
        let uniform = |pods: &[usize], rng: &mut dyn RngCore| {
            (!pods.is_empty()).then(|| Choice {
                index: pods[rng.gen_range(0..pods.len())],
                reason: Reason::Strategy,
            })
        };
        let mut nodes: BTreeMap<Option<&str>, Vec<usize>> = BTreeMap::new();
        for i in ctx.candidates() {
            let node = ctx.route.endpoints[i].endpoint.node.as_deref();
            nodes.entry(node).or_default().push(i);
        }
        let local = ctx.local_node.and_then(|n| nodes.remove(&Some(n)));
        let local_ok = rap.under_threshold(ctx.local_node.and_then(|n| env.usage(n, now)));
        if let Some(local) = &local {
            if local_ok {
                return uniform(local, rng);
            }
        }
        let latency = |node: Option<&str>| node.and_then(|n| env.latency(n, now));
        let l_min = nodes.keys().filter_map(|n| latency(*n)).min();
        let scored: Vec<(f64, bool, &Vec<usize>)> = nodes
            .iter()
            .map(|(node, pods)| {
                let usage = node.and_then(|n| env.usage(n, now));
                let ratio = match (l_min, latency(*node)) {
                    (Some(min), Some(l)) if !l.is_zero() => {
                        Some(min.as_secs_f64() / l.as_secs_f64())
                    }
                    (Some(_), Some(_)) => Some(1.0),
                    _ => None,
                };
                (rap.score(usage, ratio), rap.under_threshold(usage), pods)
            })
            .collect();
        let best = |only_under: bool, rng: &mut dyn RngCore| {
            let eligible: Vec<_> = scored.iter().filter(|s| s.1 || !only_under).collect();
            let top = eligible
                .iter()
                .map(|s| s.0)
                .fold(f64::NEG_INFINITY, f64::max);
            let ties: Vec<&Vec<usize>> = eligible
                .iter()
                .filter(|s| s.0 >= top - 1e-12)
                .map(|s| s.2)
                .collect();
            (!ties.is_empty()).then(|| ties[rng.gen_range(0..ties.len())].clone())
        };
        if let Some(pods) = best(true, rng) {
            return uniform(&pods, rng);
        }
        if let Some(local) = &local {
            return uniform(local, rng);
        }
        best(false, rng).and_then(|pods| uniform(&pods, rng))
    }

    #[test]
    fn node_level_pick_matches_the_per_endpoint_algorithm() {
        let key = ServiceKey::new("default", "svc");
        let mut gen = SmallRng::seed_from_u64(7);
        for scenario in 0..300u64 {
            let t0 = Instant::now();
            let nodes = gen.gen_range(1..6);
            let pods = gen.gen_range(1..25);
            let mut pairs = vec![("strategy", "rap".to_string())];
            if gen.gen_bool(0.5) {
                pairs.push(("rap-weight-latency", gen.gen_range(0..5).to_string()));
            }
            let (settings, _) =
                ServiceSettings::from_pairs(pairs.iter().map(|(k, v)| (*k, v.as_str())));
            let endpoints: Vec<RouteEndpoint> = (0..pods)
                .map(|i| {
                    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, 9000 + i as u16));
                    let e = Endpoint::new(format!("pod-{i}"), addr).with_conditions(Conditions {
                        ready: gen.gen_bool(0.8),
                        serving: true,
                        terminating: gen.gen_bool(0.3),
                    });
                    let endpoint = match gen.gen_range(0..nodes + 1) {
                        0 => e,
                        n => e.on_node(format!("node-{n}")),
                    };
                    let state = EndpointState::new(&settings, t0);
                    // Refused connections put some pods in cooldown.
                    if gen.gen_bool(0.15) {
                        let plain = Observation::plain(false);
                        state.observe(t0, Outcome::ConnectFailed, &settings, &plain);
                    }
                    RouteEndpoint {
                        endpoint: Arc::new(endpoint),
                        state: Arc::new(state),
                    }
                })
                .collect();
            let spec = ServiceSpec::new(key.clone(), vec![], settings.clone());
            let route = Route::new(Arc::new(spec), endpoints, None, t0);
            // Readings for some nodes, some of them old enough to turn stale.
            let mut env = Environment::default();
            for n in 1..=nodes {
                let at = t0 + Duration::from_secs(gen.gen_range(0..3) * 20);
                if gen.gen_bool(0.7) {
                    let rtt = Duration::from_millis(gen.gen_range(0..4) * 5);
                    env.set_latency(format!("node-{n}"), rtt, at);
                }
                if gen.gen_bool(0.7) {
                    let level = |g: &mut SmallRng| [0.2, 0.5, 0.95][g.gen_range(0..3)];
                    let usage = Usage {
                        cpu: level(&mut gen),
                        ram: level(&mut gen),
                    };
                    env.set_usage(format!("node-{n}"), usage, at);
                }
            }
            let env = Arc::new(env);
            let local_node = gen.gen_bool(0.8).then_some("node-1");
            let (rap, _) = Rap::from_settings(&settings);
            let topology = BTreeMap::new();
            for step in 0..20u64 {
                // From inside the cooldowns (250 ms) to past every reading.
                let now = t0 + Duration::from_millis(step * step * 300);
                let exclude: Vec<usize> = (0..route.endpoints.len())
                    .filter(|_| gen.gen_bool(0.15))
                    .collect();
                let ctx = PickContext {
                    route: &route,
                    now,
                    local_node,
                    nodes: &topology,
                    environment: &env,
                    exclude: &exclude,
                };
                let seed = gen.next_u64();
                let fast = rap.pick(&ctx, &mut SmallRng::seed_from_u64(seed));
                let slow = reference(&rap, &ctx, &mut SmallRng::seed_from_u64(seed));
                assert_eq!(fast, slow, "scenario {scenario}, step {step}");
            }
        }
    }
}
