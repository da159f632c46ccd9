//! Load-balancing strategies.
//!
//! A [`Strategy`] picks one endpoint of a service for one request. Strategies are
//! object-safe and chosen per service at run time by name (the `strategy` setting,
//! `proxima.io/strategy` on a Service) through a [`StrategyRegistry`]. They are pure:
//! they read a [`PickContext`] (the service's endpoints with their live state, the local
//! node, the time) and draw randomness only from the RNG they are given, so a seeded RNG
//! makes every decision reproducible.

mod baseline;
mod kube_proxy;
mod local;
mod p2c_ewma;
mod params;
mod proximity;
pub(crate) mod qos_pool;
mod rap;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use rand::{Rng, RngCore};

pub use baseline::{RandomStrategy, RoundRobin};
pub use kube_proxy::KubeProxy;
pub use local::{Local, LocalFallback};
pub use p2c_ewma::P2cEwma;
pub use proximity::{Decay, Proximity};
pub use qos_pool::{QosPool, Spread};
pub use rap::Rap;

use crate::environment::Environment;
use crate::model::Node;
use crate::route::{ReadingsRef, Route};
use crate::settings::{ServiceSettings, SettingError};

/// Why an endpoint was chosen (reported in metrics labels and traces).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// A member of the QoS pool.
    Pool,
    /// The QoS pool was empty (or fully excluded): the best predicted endpoint.
    Fallback,
    /// A strategy without a pool (round robin, random, plugins).
    Strategy,
    /// Every eligible endpoint was cooling down after connection failures; the one whose
    /// cooldown ends first is tried rather than failing the request.
    LastResort,
    /// A second attempt of a request whose first is late: the pool member predicted
    /// fastest ([`crate::Router::pick_hedge`]).
    Hedge,
}

impl Reason {
    /// The reason as shown in logs and metrics labels (`pool`, `fallback`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Pool => "pool",
            Reason::Fallback => "fallback",
            Reason::Strategy => "strategy",
            Reason::LastResort => "last-resort",
            Reason::Hedge => "hedge",
        }
    }
}

/// A strategy's choice: an index into [`Route::endpoints`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Choice {
    /// Index into [`Route::endpoints`].
    pub index: usize,
    /// Why this endpoint.
    pub reason: Reason,
}

/// What a strategy sees when it picks.
pub struct PickContext<'a> {
    /// The service's route: endpoints, eligibility, pool and node groups.
    pub route: &'a Route,
    /// The time of the pick (time is passed in; the core reads no clock).
    pub now: Instant,
    /// The node this proxy runs on, when known.
    pub local_node: Option<&'a str>,
    /// Every known node, by name.
    pub nodes: &'a BTreeMap<String, Node>,
    /// Node latencies and resource usage, as far as they are known.
    pub environment: &'a Arc<Environment>,
    /// Indices already tried for this request (retries go elsewhere).
    pub exclude: &'a [usize],
}

impl<'a> PickContext<'a> {
    /// Whether `index` may take this request: eligible by its conditions (see
    /// [`Route::eligible`]), not already tried, not cooling down.
    #[inline(always)]
    pub fn usable(&self, index: usize) -> bool {
        !self.exclude.contains(&index) && !self.route.state(index).cooling_down(self.now)
    }

    /// Eligible endpoints that may take this request.
    pub fn candidates(&self) -> impl Iterator<Item = usize> + '_ {
        self.route
            .eligible()
            .iter()
            .copied()
            .filter(|&i| self.usable(i))
    }

    /// The fresh latency and usage of each of the route's node groups (cached between
    /// changes of the environment; see [`Route::node_readings`]).
    pub fn node_readings(&self) -> ReadingsRef {
        self.route
            .node_readings(self.environment, self.local_node, self.now)
    }

    /// The candidates per node group of the route, counted in O(nodes + exclusions)
    /// while no endpoint of the service is cooling down, and by one pass over the
    /// eligible endpoints otherwise.
    pub fn node_candidates(&self) -> NodeCandidates<'_, 'a> {
        let route = self.route;
        let counts = if !route.none_cooling(self.now) {
            let mut counts = vec![0; route.nodes().len()];
            for i in self.candidates() {
                if let Some(g) = route.group_of(i) {
                    counts[g] += 1;
                }
            }
            Counts::Scanned(counts)
        } else if self.exclude.iter().all(|&i| route.group_of(i).is_none()) {
            Counts::All
        } else {
            let mut counts: Vec<usize> = route.nodes().iter().map(|g| g.members.len()).collect();
            for (k, &i) in self.exclude.iter().enumerate() {
                if let Some(g) = route.group_of(i) {
                    if !self.exclude[..k].contains(&i) {
                        counts[g] -= 1;
                    }
                }
            }
            Counts::Excluding(counts)
        };
        NodeCandidates { ctx: self, counts }
    }
}

/// How many candidates each node group has (see [`PickContext::node_candidates`]).
pub struct NodeCandidates<'c, 'a> {
    ctx: &'c PickContext<'a>,
    counts: Counts,
}

enum Counts {
    /// Every eligible endpoint is a candidate.
    All,
    /// None is cooling down; the excluded ones are not candidates.
    Excluding(Vec<usize>),
    /// Counted one by one (some may be cooling down).
    Scanned(Vec<usize>),
}

impl NodeCandidates<'_, '_> {
    /// Candidates in node group `group`.
    pub fn count(&self, group: usize) -> usize {
        match &self.counts {
            Counts::All => self.ctx.route.nodes()[group].members.len(),
            Counts::Excluding(counts) | Counts::Scanned(counts) => counts[group],
        }
    }

    /// Whether every eligible endpoint is a candidate (none excluded or cooling down),
    /// so that [`Self::count`] is each node group's size.
    pub fn all(&self) -> bool {
        matches!(self.counts, Counts::All)
    }

    /// Candidates in all.
    pub fn total(&self) -> usize {
        (0..self.ctx.route.nodes().len())
            .map(|g| self.count(g))
            .sum()
    }

    /// The `n`th candidate of `group`, in endpoint order. `None` past the last one (or
    /// when an endpoint started cooling down since they were counted).
    pub fn nth(&self, group: usize, n: usize) -> Option<usize> {
        let members = &self.ctx.route.nodes()[group].members;
        match &self.counts {
            Counts::All => members.get(n).copied(),
            Counts::Excluding(_) => members
                .iter()
                .copied()
                .filter(|i| !self.ctx.exclude.contains(i))
                .nth(n),
            Counts::Scanned(_) => members
                .iter()
                .copied()
                .filter(|&i| self.ctx.usable(i))
                .nth(n),
        }
    }

    /// A candidate of `group` drawn uniformly.
    pub fn uniform(&self, group: usize, rng: &mut dyn RngCore) -> Option<Choice> {
        let n = self.count(group);
        if n == 0 {
            return None;
        }
        self.nth(group, rng.gen_range(0..n)).map(|index| Choice {
            index,
            reason: Reason::Strategy,
        })
    }
}

/// Draws of two members the power of two choices makes before its caller scans for a
/// usable one.
const TWO_CHOICE_DRAWS: usize = 3;

/// Two distinct positions in `0..n` (n ≥ 2), uniformly over the ordered pairs: the
/// first uniform, the second uniform among the others.
pub(crate) fn two_distinct(n: usize, rng: &mut dyn RngCore) -> (usize, usize) {
    debug_assert!(n >= 2);
    let a = rng.gen_range(0..n);
    let mut b = rng.gen_range(0..n - 1);
    if b >= a {
        b += 1;
    }
    (a, b)
}

/// The power of two choices over `members` (endpoint indices, at least two): up to
/// [`TWO_CHOICE_DRAWS`] times, two distinct members are drawn; the first draw with a
/// usable member decides, by `better(a, b)` when both are usable. `None` when every draw
/// found two unusable members (the caller then looks at all of them).
pub(crate) fn two_choices(
    ctx: &PickContext<'_>,
    members: &[usize],
    rng: &mut dyn RngCore,
    better: impl Fn(usize, usize) -> usize,
) -> Option<usize> {
    two_choices_among(ctx, members.len(), |p| members[p], rng, better)
}

/// [`two_choices`] over `count` members read by position with `member` (for lists that
/// are not slices, such as the QoS pool read in place).
#[inline]
pub(crate) fn two_choices_among(
    ctx: &PickContext<'_>,
    count: usize,
    member: impl Fn(usize) -> usize,
    rng: &mut dyn RngCore,
    better: impl Fn(usize, usize) -> usize,
) -> Option<usize> {
    if count < 2 {
        return None;
    }
    for _ in 0..TWO_CHOICE_DRAWS {
        let (a, b) = two_distinct(count, rng);
        let (a, b) = (member(a), member(b));
        match (ctx.usable(a), ctx.usable(b)) {
            (true, true) => return Some(better(a, b)),
            (true, false) => return Some(a),
            (false, true) => return Some(b),
            (false, false) => {}
        }
    }
    None
}

/// A load-balancing strategy (see the module docs).
pub trait Strategy: Send + Sync + fmt::Debug {
    /// The name used in settings and annotations.
    fn name(&self) -> &'static str;

    /// Pick an endpoint among [`PickContext::candidates`], or `None` when there is none.
    fn pick(&self, ctx: &PickContext<'_>, rng: &mut dyn RngCore) -> Option<Choice>;

    /// Pick an endpoint for a long-lived exchange (a WebSocket or other tunnel), which
    /// holds its endpoint for as long as it is open: the same as `pick` unless the
    /// strategy keeps a notion of load to level (the QoS pool: the member with the
    /// fewest open exchanges).
    fn pick_long_lived(&self, ctx: &PickContext<'_>, rng: &mut dyn RngCore) -> Option<Choice> {
        self.pick(ctx, rng)
    }

    /// Whether endpoints evicted from the QoS pool need background probes to come back
    /// (strategies that never send them traffic otherwise).
    fn probes_evicted(&self) -> bool {
        false
    }

    /// Whether a request that may go twice is sent to a second pod once its attempt has
    /// waited as long as that pod can still answer within the SLO (`qos-pool-hedge`;
    /// see [`crate::Picked::hedge_after`]). Strategies that do not route by the SLO say
    /// no: their papers send each request once.
    fn hedges(&self) -> bool {
        false
    }

    /// Whether a pool member whose last answer missed is passed over until its verdict,
    /// and so needs probes to get one (`EndpointState::rechecking`). Strategies that keep
    /// sending such a member its share say no: their traffic judges it.
    fn rechecks_misses(&self) -> bool {
        false
    }

    /// Whether, when `pick` finds nothing, the router may still try an eligible endpoint
    /// that is cooling down. Strategies whose `None` is a policy decision (e.g. `local`
    /// rejecting remote pods) say no.
    fn last_resort_allowed(&self) -> bool {
        true
    }
}

/// Builds a strategy from a service's settings. Invalid parameters are reported and
/// replaced by their defaults; the strategy is still built.
pub type Builder = fn(&ServiceSettings) -> (Box<dyn Strategy>, Vec<SettingError>);

/// Strategy constructors by name.
#[derive(Clone)]
pub struct StrategyRegistry {
    builders: BTreeMap<&'static str, Builder>,
}

impl fmt::Debug for StrategyRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.builders.keys()).finish()
    }
}

impl Default for StrategyRegistry {
    /// The eight built-in strategies: `qos-pool` (the default), `round-robin`, `random`,
    /// `rap`, `proximity`, `local`, `kube-proxy` and `p2c-ewma`.
    fn default() -> Self {
        let mut r = Self {
            builders: BTreeMap::new(),
        };
        r.register("qos-pool", QosPool::build);
        r.register("round-robin", |_| (Box::new(RoundRobin::default()), vec![]));
        r.register("random", |_| (Box::new(RandomStrategy), vec![]));
        r.register("rap", Rap::build);
        r.register("proximity", Proximity::build);
        r.register("local", Local::build);
        r.register("kube-proxy", |_| (Box::new(KubeProxy::default()), vec![]));
        r.register("p2c-ewma", P2cEwma::build);
        r
    }
}

/// The strategy a service gets when its `strategy` setting is invalid.
pub const DEFAULT_STRATEGY: &str = "qos-pool";

impl StrategyRegistry {
    /// Make `name` build with `builder`, replacing a builder of the same name.
    pub fn register(&mut self, name: &'static str, builder: Builder) {
        self.builders.insert(name, builder);
    }

    /// The names of the registered strategies, in alphabetical order.
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.builders.keys().copied()
    }

    /// Build the strategy named in `settings`. An unknown name gives the default
    /// strategy; invalid parameters their defaults; either way with the errors to report.
    pub fn build(&self, settings: &ServiceSettings) -> (Box<dyn Strategy>, Vec<SettingError>) {
        match self.builders.get(settings.strategy.as_str()) {
            Some(build) => build(settings),
            None => (
                Box::new(QosPool::default()),
                vec![SettingError::new(
                    "strategy",
                    &settings.strategy,
                    format!("one of {}", self.names().collect::<Vec<_>>().join(", ")),
                )],
            ),
        }
    }
}
