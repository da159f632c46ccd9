//! Local scheduling (Kim et al., "Local Scheduling in KubeEdge-Based Edge Computing
//! Environment", §4.2): requests are handled only by pods on the node that received
//! them, distributed equally among those pods (round robin), never forwarded to remote
//! edge nodes.
//!
//! When this node has no pod of the service, the per-service `local-fallback` decides:
//! `reject` answers 503 (the paper's pure scheme), `nearest` (default) sends the request
//! to a pod on the node with the lowest measured latency from here (uniformly among that
//! node's pods; uniformly among all pods while no latency is known).
//!
//! Cost per pick: O(pods on this node) for the local choice; O(nodes) for `nearest`
//! while latencies are known (the node groups and readings of [`crate::route`]).

use std::borrow::Cow;
use std::sync::atomic::{AtomicUsize, Ordering};

use rand::{Rng, RngCore};

use super::params::Params;
use super::{Choice, PickContext, Reason, Strategy};
use crate::settings::{ServiceSettings, SettingError};

/// What `local` does when this node has no pod of the service (`local-fallback`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LocalFallback {
    /// `reject`: no pick, so the request gets 503 (the paper's pure scheme).
    Reject,
    /// `nearest` (default): a pod on the node with the lowest measured latency from here.
    Nearest,
}

/// Local scheduling (see the module docs).
#[derive(Debug)]
pub struct Local {
    /// What to do when this node has no pod of the service.
    pub fallback: LocalFallback,
    next: AtomicUsize,
}

impl Local {
    /// Local scheduling with this fallback.
    pub fn new(fallback: LocalFallback) -> Self {
        Self {
            fallback,
            next: AtomicUsize::new(0),
        }
    }

    /// From `local-fallback: reject|nearest`.
    pub fn build(settings: &ServiceSettings) -> (Box<dyn Strategy>, Vec<SettingError>) {
        let mut p = Params::new(settings, "local");
        let fallback = p.choice(
            "fallback",
            LocalFallback::Nearest,
            &[
                ("reject", LocalFallback::Reject),
                ("nearest", LocalFallback::Nearest),
            ],
        );
        (Box::new(Local::new(fallback)), p.errors)
    }
}

impl Strategy for Local {
    fn name(&self) -> &'static str {
        "local"
    }

    fn pick(&self, ctx: &PickContext<'_>, rng: &mut dyn RngCore) -> Option<Choice> {
        let route = ctx.route;
        let readings = ctx.node_readings();
        // This node's eligible pods, less the ones already tried.
        let on_local = readings
            .local
            .map_or(&[][..], |g| &route.nodes()[g].members[..]);
        let local: Cow<'_, [usize]> = if on_local.iter().any(|i| ctx.exclude.contains(i)) {
            Cow::Owned(
                on_local
                    .iter()
                    .copied()
                    .filter(|i| !ctx.exclude.contains(i))
                    .collect(),
            )
        } else {
            Cow::Borrowed(on_local)
        };
        if !local.is_empty() {
            let n = local.len();
            let start = self.next.fetch_add(1, Ordering::Relaxed);
            let usable = (0..n)
                .map(|k| local[(start + k) % n])
                .find(|&i| ctx.usable(i));
            // All local pods cooling down: the one that recovers first, still local.
            let index = usable.or_else(|| {
                local
                    .iter()
                    .copied()
                    .min_by_key(|&i| route.endpoints[i].state.cooldown_remaining(ctx.now))
            })?;
            return Some(Choice {
                index,
                reason: Reason::Strategy,
            });
        }
        match self.fallback {
            LocalFallback::Reject => None,
            LocalFallback::Nearest => {
                let candidates = ctx.node_candidates();
                let nearest = (0..route.nodes().len())
                    .filter(|&g| candidates.count(g) > 0)
                    .filter_map(|g| Some((readings.latency[g]?, g)))
                    .min_by_key(|(l, _)| *l)
                    .map(|(_, g)| g);
                match nearest {
                    Some(node) => candidates.uniform(node, rng),
                    None => {
                        let n = candidates.total();
                        (n > 0)
                            .then(|| ctx.candidates().nth(rng.gen_range(0..n)))
                            .flatten()
                            .map(|index| Choice {
                                index,
                                reason: Reason::Strategy,
                            })
                    }
                }
            }
        }
    }

    fn last_resort_allowed(&self) -> bool {
        // `None` means "rejected by policy", or no usable pod anywhere for `nearest`.
        self.fallback == LocalFallback::Nearest
    }
}
