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
//! Cost per pick: O(nodes). Pods on one node share its latency and so its weight, so a
//! pick draws a node with the summed weight of its candidate pods, then one of those
//! pods uniformly, which is the same distribution as drawing among all pods. The nodes'
//! latencies are cached until the environment changes or a reading turns stale (see
//! [`crate::route`]), and candidates are counted per node without visiting every
//! endpoint (see [`PickContext::node_candidates`]).

use std::time::Duration;

use rand::{Rng, RngCore};

use super::params::Params;
use super::{Choice, PickContext, Reason, Strategy};
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
        let counts: Vec<usize> = (0..groups).map(|g| candidates.count(g)).collect();
        let total: usize = counts.iter().sum();
        if total <= 1 {
            let only = counts.iter().position(|&c| c > 0)?;
            return candidates.uniform(only, rng);
        }
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
        let per_pod = self.node_weights(&latencies, &counts);
        // Draw a pod: a node by its pods' total weight, then one of its pods.
        let node_weight = |g: usize| per_pod[g] * counts[g] as f64;
        let mut x: f64 = rng.gen::<f64>() * (0..groups).map(node_weight).sum::<f64>();
        let mut chosen = None;
        for g in (0..groups).filter(|&g| counts[g] > 0) {
            chosen = Some((g, x));
            if x < node_weight(g) {
                break;
            }
            x -= node_weight(g);
        }
        let (g, x) = chosen?;
        // Rounding can leave `x` a hair past the node's weight: take its last pod then.
        let pod = ((x / per_pod[g]).max(0.0) as usize).min(counts[g] - 1);
        candidates.nth(g, pod).map(|index| Choice {
            index,
            reason: Reason::Strategy,
        })
    }
}
