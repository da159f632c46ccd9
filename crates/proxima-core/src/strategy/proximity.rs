//! proxy-mity's proximity-aware weights (Fahs & Pierre, "Proxy-mity: Proximity-Aware
//! Traffic Routing in Distributed Fog Computing Platforms", §III-C).
//!
//! Each candidate pod ϕᵢ gets the probability
//!
//! ```text
//! F(ϕᵢ) = α · P(ϕᵢ) + (1 − α) · 1/N          (Eq. 6)
//! P(ϕᵢ) = f_β(lᵢ) / Σⱼ f_β(lⱼ)               (Eq. 2)
//! f_β(l) = 1/(β·l)   inverse                 (Eq. 3)
//!        = 1/l^β     power                   (Eq. 4)
//!        = e^(−β·l)  exponential             (Eq. 5)
//! ```
//!
//! where lᵢ is the network latency (in milliseconds) from this node to the node of ϕᵢ,
//! α ∈ [0, 1] trades load balancing (0) for proximity (1), and β sets how aggressively
//! nearby pods are favoured. Pods on this node get the latency `localrtt`, which the paper
//! sets "slightly lower than the lowest inter-node latencies" so the local pod does not
//! take everything: by default 0.9 × the smallest fresh inter-node latency. The request
//! then goes to a pod drawn at random with these weights (the paper programs iptables
//! with them; we draw per request).
//!
//! Numerics: every f_β is computed relative to the smallest latency `l₀` (`l₀/l`,
//! `(l₀/l)^β`, `e^(−β(l−l₀))`), which leaves P unchanged after normalisation but keeps the
//! best pod's weight at 1, so nothing divides by zero or underflows; the inverse decay's β
//! cancels out exactly, as it does in the paper's formula. With α = 1 and equal
//! latencies, P is uniform: nobody starves.
//!
//! Missing data: a pod whose node has no fresh latency reading is given the largest known
//! latency among the candidates (it is not favoured, but not excluded); with no readings
//! at all every pod has the same latency and the choice is uniform.
//!
//! Cost per pick: O(log nodes) in the common case. Pods on one node share its latency
//! and so its weight (Eq. 2–6 give every pod on a node the same F), so a pick draws a
//! node with the summed weight of its candidate pods, then one of those pods uniformly,
//! which is the same distribution as drawing among all pods. The weights change only
//! with the latencies, that is with the environment snapshot, the freshness of its
//! readings or the route: while every eligible pod is a candidate (none already tried,
//! none cooling down) they are computed once per [`crate::route::NodeReadings`] (which
//! the route replaces on each such change) and a pick is one uniform number and a binary
//! search over the nodes' cumulative weights. Otherwise the weights are computed for the
//! pick's candidates, in O(nodes), with the candidates counted per node without visiting
//! every endpoint (see [`PickContext::node_candidates`]).

use std::time::Duration;

use rand::{Rng, RngCore};

use super::params::Params;
use super::{Choice, NodeCandidates, PickContext, Reason, Strategy};
use crate::route::NodeReadings;
use crate::settings::{ServiceSettings, SettingError};

/// The decay function f_β (Eq. 3–5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decay {
    /// `inverse`: f_β(l) = 1/(β·l) (Eq. 3); β cancels out.
    Inverse,
    /// `power`: f_β(l) = 1/l^β (Eq. 4).
    Power,
    /// `exponential`: f_β(l) = e^(−β·l) (Eq. 5), l in milliseconds.
    Exponential,
}

/// proxy-mity's weights (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct Proximity {
    /// α ∈ [0, 1]: 0 is pure load balancing, 1 pure proximity (Eq. 6).
    pub alpha: f64,
    /// β: how strongly nearer pods are favoured (Eq. 3–5).
    pub beta: f64,
    /// The decay function f_β.
    pub decay: Decay,
    /// Latency assumed for pods on this node; `None` = 0.9 × the smallest inter-node one.
    pub localrtt: Option<Duration>,
}

/// `localrtt` when no inter-node latency is known yet.
const DEFAULT_LOCALRTT: Duration = Duration::from_micros(300);

impl Proximity {
    /// From `proximity-alpha` (default 0.8), `proximity-beta` (1), `proximity-decay`
    /// (`exponential`) and `proximity-localrtt`.
    pub fn build(settings: &ServiceSettings) -> (Box<dyn Strategy>, Vec<SettingError>) {
        let mut p = Params::new(settings, "proximity");
        let s = Proximity {
            alpha: p.number("alpha", 0.8, 0.0, 1.0),
            beta: p.number("beta", 1.0, 0.0, 100.0),
            decay: p.choice(
                "decay",
                Decay::Exponential,
                &[
                    ("inverse", Decay::Inverse),
                    ("power", Decay::Power),
                    ("exponential", Decay::Exponential),
                ],
            ),
            localrtt: p.duration("localrtt", None),
        };
        (Box::new(s), p.errors)
    }

    /// The weights F(ϕᵢ) of Eq. 6 for the given latencies (ms), one per pod; they sum
    /// to 1. (A pick computes the same weights per node, see [`Self::node_weights`].)
    pub fn weights(&self, latencies: &[f64]) -> Vec<f64> {
        let counts = vec![1; latencies.len()];
        self.node_weights(latencies, &counts)
    }

    /// The weight F(ϕᵢ) of Eq. 6 of **each pod** of a node, for nodes at the given
    /// latencies (ms) holding `counts[k]` candidate pods each (nodes without one are
    /// ignored): pods on one node share its latency, hence their weight. Over all pods
    /// the weights sum to 1.
    pub fn node_weights(&self, latencies: &[f64], counts: &[usize]) -> Vec<f64> {
        let present = || latencies.iter().zip(counts).filter(|(_, &c)| c > 0);
        let n = counts.iter().sum::<usize>() as f64;
        // Latencies below 1 µs are treated as 1 µs so that l₀/l is defined.
        let floor = 1e-3;
        let l0 = present()
            .map(|(&l, _)| l)
            .fold(f64::INFINITY, f64::min)
            .max(floor);
        let f = |l: f64| {
            let l = l.max(floor);
            match self.decay {
                Decay::Inverse => l0 / l,
                Decay::Power => (l0 / l).powf(self.beta),
                Decay::Exponential => (-self.beta * (l - l0)).exp(),
            }
        };
        let sum: f64 = present().map(|(&l, &c)| c as f64 * f(l)).sum();
        latencies
            .iter()
            .map(|&l| self.alpha * f(l) / sum + (1.0 - self.alpha) / n)
            .collect()
    }
}

impl Strategy for Proximity {
    fn name(&self) -> &'static str {
        "proximity"
    }

    fn pick(&self, ctx: &PickContext<'_>, rng: &mut dyn RngCore) -> Option<Choice> {
        let readings = ctx.node_readings();
        let candidates = ctx.node_candidates();
        let groups = ctx.route.nodes().len();
        if candidates.all() {
            // Every eligible endpoint is a candidate: the weights depend only on the
            // readings (and the route), so they are computed once per readings.
            let counts = |g: usize| ctx.route.nodes()[g].members.len();
            let derive = |r: &NodeReadings| {
                let counts: Vec<usize> = (0..groups).map(counts).collect();
                self.draw(r, &counts)
            };
            if let Some(draw) = readings.derived(derive) {
                return draw.pick(&candidates, rng);
            }
        }
        let counts: Vec<usize> = (0..groups).map(|g| candidates.count(g)).collect();
        self.draw(&readings, &counts).pick(&candidates, rng)
    }
}

/// The weighted draw of one pod for fixed candidate counts per node group: the per-pod
/// weight F(ϕᵢ) of each group (§III-C, Eq. 6) and the cumulative weight of the groups.
#[derive(Debug)]
struct Draw {
    per_pod: Vec<f64>,
    /// `cumulative[g]`: the summed weight of the candidates of groups `0..=g`.
    cumulative: Vec<f64>,
    counts: Vec<usize>,
    /// Candidates in all.
    pods: usize,
}

impl Proximity {
    /// The weights for `counts[g]` candidates in each node group under `readings`.
    fn draw(&self, readings: &NodeReadings, counts: &[usize]) -> Draw {
        let groups = counts.len();
        // Latency (ms) of each node, with the local and missing cases resolved.
        let localrtt = self.localrtt.unwrap_or_else(|| {
            readings
                .min_latency_elsewhere
                .map_or(DEFAULT_LOCALRTT, |min| min.mul_f64(0.9))
        });
        let raw: Vec<Option<f64>> = (0..groups)
            .map(|g| {
                let l = if Some(g) == readings.local {
                    Some(localrtt)
                } else {
                    readings.latency[g]
                };
                l.map(|d| d.as_secs_f64() * 1e3)
            })
            .collect();
        let worst = (0..groups)
            .filter(|&g| counts[g] > 0)
            .filter_map(|g| raw[g])
            .fold(0.0, f64::max);
        let latencies: Vec<f64> = raw.iter().map(|l| l.unwrap_or(worst)).collect();
        let per_pod = self.node_weights(&latencies, counts);
        let cumulative = per_pod
            .iter()
            .zip(counts)
            .scan(0.0, |sum, (&w, &c)| {
                *sum += w * c as f64;
                Some(*sum)
            })
            .collect();
        Draw {
            per_pod,
            cumulative,
            counts: counts.to_vec(),
            pods: counts.iter().sum(),
        }
    }
}

impl Draw {
    /// The summed weight of every candidate (1, up to rounding).
    fn total(&self) -> f64 {
        self.cumulative.last().copied().unwrap_or(0.0)
    }

    /// The group and the pod within it (by position among the group's candidates) at
    /// `x` ∈ [0, total) along the candidates' weights laid end to end.
    fn locate(&self, x: f64) -> Option<(usize, usize)> {
        // The first group whose cumulative weight passes `x` (groups without candidates
        // add nothing and are never first); rounding can leave `x` at the total: then
        // the last group with a candidate.
        let g = match self.cumulative.partition_point(|&c| c <= x) {
            g if g < self.counts.len() && self.counts[g] > 0 => g,
            _ => self.counts.iter().rposition(|&c| c > 0)?,
        };
        let before = if g == 0 { 0.0 } else { self.cumulative[g - 1] };
        // Rounding can leave `x` a hair past the group's weight: its last pod then.
        let pod = (((x - before) / self.per_pod[g]).max(0.0) as usize).min(self.counts[g] - 1);
        Some((g, pod))
    }

    /// Draw a pod: a node by its pods' total weight (binary search over the cumulative
    /// weights), then one of its pods, read off the same uniform number.
    fn pick(&self, candidates: &NodeCandidates<'_, '_>, rng: &mut dyn RngCore) -> Option<Choice> {
        if self.pods <= 1 {
            let only = self.counts.iter().position(|&c| c > 0)?;
            return candidates.uniform(only, rng);
        }
        let x = rng.gen::<f64>() * self.total();
        let (g, pod) = self.locate(x)?;
        candidates.nth(g, pod).map(|index| Choice {
            index,
            reason: Reason::Strategy,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The draw as it was made before the weights were cached: walk the groups with a
    /// candidate, subtracting each one's weight from `x` until it falls inside one.
    fn walk(per_pod: &[f64], counts: &[usize], x: f64) -> Option<(usize, usize)> {
        let node_weight = |g: usize| per_pod[g] * counts[g] as f64;
        let mut x = x;
        let mut chosen = None;
        for g in (0..counts.len()).filter(|&g| counts[g] > 0) {
            chosen = Some((g, x));
            if x < node_weight(g) {
                break;
            }
            x -= node_weight(g);
        }
        let (g, x) = chosen?;
        Some((g, ((x / per_pod[g]).max(0.0) as usize).min(counts[g] - 1)))
    }

    #[test]
    fn the_binary_search_finds_the_pod_the_walk_over_the_nodes_finds() {
        let p = Proximity {
            alpha: 0.7,
            beta: 1.5,
            decay: Decay::Power,
            localrtt: None,
        };
        // Nodes with 0 to 4 candidates (some none, first and last included).
        for counts in [
            vec![3, 0, 2, 1, 4],
            vec![0, 1, 1, 0],
            vec![5],
            vec![0, 0, 2],
            vec![2, 0, 0],
        ] {
            let latencies: Vec<f64> = (0..counts.len()).map(|g| 2.0 + 7.0 * g as f64).collect();
            let per_pod = p.node_weights(&latencies, &counts);
            let draw = Draw {
                cumulative: per_pod
                    .iter()
                    .zip(&counts)
                    .scan(0.0, |sum, (&w, &c)| {
                        *sum += w * c as f64;
                        Some(*sum)
                    })
                    .collect(),
                per_pod: per_pod.clone(),
                pods: counts.iter().sum(),
                counts: counts.clone(),
            };
            assert!((draw.total() - 1.0).abs() < 1e-12, "{counts:?}");
            let steps = 100_000;
            let mut differ = 0;
            for k in 0..steps {
                let x = draw.total() * k as f64 / steps as f64;
                let (found, walked) = (draw.locate(x), walk(&per_pod, &counts, x));
                assert!(found.is_some(), "{counts:?} at {x}");
                if found != walked {
                    // Only where rounding puts `x` on a boundary between two pods.
                    let near = |(g, pod): (usize, usize)| {
                        let start = draw.cumulative[g] - per_pod[g] * (counts[g] - pod) as f64;
                        (x - start).abs().min((x - start - per_pod[g]).abs()) < 1e-12
                    };
                    assert!(
                        near(found.unwrap()),
                        "{counts:?} at {x}: {found:?} vs {walked:?}"
                    );
                    differ += 1;
                }
            }
            assert!(differ <= 2, "{counts:?}: {differ} differ");
            // Past the end (rounding of `x = u · total`): the last pod with a candidate.
            let last = counts.iter().rposition(|&c| c > 0).unwrap();
            assert_eq!(draw.locate(draw.total()), Some((last, counts[last] - 1)));
        }
    }
}
