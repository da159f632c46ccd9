//! A faithful kube-proxy baseline: the endpoint filtering of kube-proxy's
//! `CategorizeEndpoints` (pkg/proxy/topology.go), then a uniformly random endpoint, as
//! its iptables mode does.
//!
//! Conditions are the EndpointSlice's, as kube-proxy reads them: `ready` and `serving`
//! absent mean true, `terminating` absent means false (the discovery sources apply that).
//!
//! * `internalTrafficPolicy: Local`: only endpoints on this node. The ready local ones;
//!   when no local endpoint is ready, the local ones that are serving while terminating,
//!   **decided among the local endpoints alone** (ready pods on other nodes do not stop
//!   the local terminating fallback). None means the traffic is dropped (503 here),
//!   never sent elsewhere. Topology hints do not apply.
//! * Otherwise (`Cluster`) the topology mode is chosen from the hints of the **ready**
//!   endpoints only; with no ready endpoint there is no topology:
//!   - same node, when every ready endpoint carries `hints.forNodes` and at least one
//!     names this node (kube-proxy's `PreferSameTrafficDistribution` gate, on by default);
//!   - else same zone, when every ready endpoint carries `hints.forZones` and at least
//!     one names this node's zone;
//!   - else none: a set that is only partly hinted, or has no hint for here, turns
//!     topology off and every ready endpoint is used.
//!
//!   The ready endpoints the mode allows are used; when none is ready, every endpoint
//!   serving while terminating (whatever its hints).
//! * Hints are only ever the EndpointSlice's: the Service's `trafficDistribution` is not
//!   turned into hints here (that is the EndpointSlice controller's job; a source without
//!   that controller, such as the topology file, states the hints it wants).
//!
//! kube-proxy knows nothing about cooldowns: an endpoint cooling down after connection
//! failures is only avoided while another filtered one is usable.
//!
//! Cost per pick: O(log nodes) while no endpoint of the service cools down (plus
//! O(e · log endpoints) for e endpoints already tried). The filtered set depends only on
//! the route (endpoints, conditions, hints, traffic policy), this proxy's node and that
//! node's zone, so it is computed once and kept until the zone or node differs; the
//! route itself never changes, and a new route gets a new strategy (see `crate::router`).
//! While some endpoint cools down, a pick scans the filtered set as before.

use std::sync::Arc;

use arc_swap::ArcSwapOption;
use rand::{Rng, RngCore};

use super::{Choice, PickContext, Reason, Strategy};
use crate::model::Endpoint;

/// kube-proxy's topology filtering and random choice (see the module docs). Built per
/// route: it caches the route's filtered endpoints.
#[derive(Debug, Default)]
pub struct KubeProxy {
    filtered: ArcSwapOption<Filtered>,
}

/// The endpoints [`KubeProxy::filter`] gave for a proxy on `local_node` in `zone`.
#[derive(Debug)]
struct Filtered {
    local_node: Option<String>,
    zone: Option<String>,
    /// Endpoint indices, ascending.
    indices: Vec<usize>,
}

impl Filtered {
    fn holds_for(&self, local_node: Option<&str>, zone: Option<&str>) -> bool {
        self.local_node.as_deref() == local_node && self.zone.as_deref() == zone
    }
}

/// The zone of this proxy's node, as the routing table knows it.
fn local_zone<'a>(ctx: &PickContext<'a>) -> Option<&'a str> {
    ctx.local_node
        .and_then(|n| ctx.nodes.get(n))
        .and_then(|n| n.zone.as_deref())
}

/// The topology mode kube-proxy chose for a Service on this node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Topology<'a> {
    /// No topology: every ready endpoint.
    Off,
    /// Only endpoints hinted for this node.
    SameNode(&'a str),
    /// Only endpoints hinted for this zone.
    SameZone(&'a str),
}

impl Topology<'_> {
    fn allows(&self, endpoint: &Endpoint) -> bool {
        match self {
            Topology::Off => true,
            Topology::SameNode(node) => endpoint.hints.for_nodes.iter().any(|n| n == node),
            Topology::SameZone(zone) => endpoint.hints.for_zones.iter().any(|z| z == zone),
        }
    }
}

/// kube-proxy's `topologyModeFromHints`: decided over the ready endpoints only.
fn topology_mode<'a>(
    ready: &[&Endpoint],
    node: Option<&'a str>,
    zone: Option<&'a str>,
) -> Topology<'a> {
    if ready.is_empty() {
        return Topology::Off;
    }
    let all_node_hinted = ready.iter().all(|e| !e.hints.for_nodes.is_empty());
    if let Some(node) = node {
        if all_node_hinted && ready.iter().any(|e| Topology::SameNode(node).allows(e)) {
            return Topology::SameNode(node);
        }
    }
    let all_zone_hinted = ready.iter().all(|e| !e.hints.for_zones.is_empty());
    if let Some(zone) = zone {
        if all_zone_hinted && ready.iter().any(|e| Topology::SameZone(zone).allows(e)) {
            return Topology::SameZone(zone);
        }
    }
    Topology::Off
}

impl KubeProxy {
    /// The endpoint indices kube-proxy would route to from this node (see the module
    /// docs). Conditions are read from every endpoint of the Service, not from the
    /// router's [`eligible`](crate::route::Route::eligible) set, because the
    /// `Local` policy decides its terminating fallback on its own.
    pub fn filter(&self, ctx: &PickContext<'_>) -> Vec<usize> {
        let endpoints = &ctx.route.endpoints;
        let all = || 0..endpoints.len();
        let endpoint = |i: usize| &*endpoints[i].endpoint;
        let ready = |i: usize| endpoint(i).conditions.ready;
        let serving_terminating = |i: usize| {
            let c = endpoint(i).conditions;
            c.serving && c.terminating
        };
        if ctx.route.spec.traffic.internal_local {
            let Some(here) = ctx.local_node else {
                return Vec::new();
            };
            let local = |i: usize| endpoint(i).node.as_deref() == Some(here);
            let local_ready: Vec<usize> = all().filter(|&i| local(i) && ready(i)).collect();
            if !local_ready.is_empty() {
                return local_ready;
            }
            return all()
                .filter(|&i| local(i) && serving_terminating(i))
                .collect();
        }
        let zone = local_zone(ctx);
        let ready_endpoints: Vec<&Endpoint> = all().filter(|&i| ready(i)).map(endpoint).collect();
        let mode = topology_mode(&ready_endpoints, ctx.local_node, zone);
        let cluster: Vec<usize> = all()
            .filter(|&i| ready(i) && mode.allows(endpoint(i)))
            .collect();
        if !cluster.is_empty() {
            return cluster;
        }
        all().filter(|&i| serving_terminating(i)).collect()
    }

    /// Run `f` on [`Self::filter`] for `ctx`: the cached set while this proxy's node and
    /// zone are the ones it was computed for, else a new one (then cached).
    fn with_filtered<R>(&self, ctx: &PickContext<'_>, f: impl FnOnce(&[usize]) -> R) -> R {
        let zone = local_zone(ctx);
        let cached = self.filtered.load();
        if let Some(hit) = cached
            .as_deref()
            .filter(|c| c.holds_for(ctx.local_node, zone))
        {
            return f(&hit.indices);
        }
        let fresh = Arc::new(Filtered {
            local_node: ctx.local_node.map(str::to_string),
            zone: zone.map(str::to_string),
            indices: self.filter(ctx),
        });
        self.filtered.store(Some(fresh.clone()));
        f(&fresh.indices)
    }
}

impl Strategy for KubeProxy {
    fn name(&self) -> &'static str {
        "kube-proxy"
    }

    fn pick(&self, ctx: &PickContext<'_>, rng: &mut dyn RngCore) -> Option<Choice> {
        self.with_filtered(ctx, |filtered| pick_among(ctx, filtered, rng))
    }

    fn last_resort_allowed(&self) -> bool {
        false
    }
}

/// kube-proxy's random choice among the `filtered` endpoints (ascending indices): one
/// not already tried, preferably one not cooling down.
fn pick_among(ctx: &PickContext<'_>, filtered: &[usize], rng: &mut dyn RngCore) -> Option<Choice> {
    let choice = |index| Choice {
        index,
        reason: Reason::Strategy,
    };
    if ctx.route.none_cooling(ctx.now) {
        // Every filtered endpoint not already tried is usable: draw among those
        // (the same draw as below) without listing them.
        let mut skipped: Vec<usize> = ctx
            .exclude
            .iter()
            .filter_map(|i| filtered.binary_search(i).ok())
            .collect();
        skipped.sort_unstable();
        skipped.dedup();
        let allowed = filtered.len() - skipped.len();
        if allowed == 0 {
            return None;
        }
        let mut k = rng.gen_range(0..allowed);
        // The k-th position that is not skipped.
        for &s in &skipped {
            if s <= k {
                k += 1;
            }
        }
        return Some(choice(filtered[k]));
    }
    let allowed: Vec<usize> = filtered
        .iter()
        .copied()
        .filter(|i| !ctx.exclude.contains(i))
        .collect();
    let usable: Vec<usize> = allowed.iter().copied().filter(|&i| ctx.usable(i)).collect();
    let from = if usable.is_empty() { &allowed } else { &usable };
    (!from.is_empty()).then(|| choice(from[rng.gen_range(0..from.len())]))
}
