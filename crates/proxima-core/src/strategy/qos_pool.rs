//! The QoS-pool strategy of QEdgeProxy (Čilić et al., §III and Algorithm 1).
//!
//! For each service the proxy keeps a *QoS pool*: the endpoints that its own measured
//! response times predict will meet the service's latency SLO at the configured
//! percentile (§III-B). Requests are spread **evenly inside the pool** rather than sent
//! to the fastest endpoint (§I: "distribute the workload evenly across instances capable
//! of meeting the QoS requirements"), which keeps any one pod from being overloaded.
//!
//! * **Membership** is judged per endpoint by [`EndpointState`](crate::EndpointState)
//!   after every measurement (event 3 of §III-A): an endpoint with fewer than
//!   `min_samples` fresh measurements is *warming* and is in the pool on an optimistic
//!   initial estimate (event 1), so it gets measured; one whose fresh samples meet the
//!   SLO is *admitted*; one that misses is *evicted*. The optimistic estimate yields to
//!   a measured one where there is one: a warming endpoint whose node's round-trip time
//!   from this proxy (measured by the peer prober) already exceeds the SLO is kept out
//!   (event 1 builds the initial pool "based on initial estimates, such as environmental
//!   conditions"; see `Route::too_far`). Failures (a `failure-status` answer,
//!   reset, timeout, refused connection) and attempts unanswered past the SLO are
//!   misses; consecutive failures eject at once (Envoy's outlier detection, linkerd's
//!   failure accrual); a quiet pod whose few samples all miss is judged on them. The
//!   rules, with their anchors, are in `endpoint.rs`.
//! * **Spreading evenly** (`qos-pool-spread: even`, the paper's rule), whatever the
//!   round-trip time to each member: two distinct
//!   members are drawn at random and the one with the *lower spreading counter* wins
//!   (ties go to the first draw, itself random). Each pick adds `1 / weight` to the
//!   winner's counter (stride scheduling), so over any window every member's share is
//!   the same, within a request or two, at any concurrency; a member that just
//!   (re)joined starts level with the lowest counter in the pool, so it neither starves
//!   nor takes a catch-up burst. Comparing requests *in flight* instead (the plain
//!   power of two choices) is not even: by Little's law a member 50 ms away holds 25
//!   times as many requests in flight as one 2 ms away for the same rate, and so loses
//!   most comparisons (the issue measured a 2:1 split between a local and a remote pod).
//!   The rule: within the pool, each member's share over a window stays within
//!   max/min ≤ 1.2 of the others' (weights aside), unless the saturation rule below
//!   applies.
//! * **Or by slack** (`qos-pool-spread: slack`, the default since it led on five of six
//!   generated scenarios, docs/results/issue-30.md; not in the paper, whose even spread
//!   treats a member just under the SLO like one with a wide margin, so that host
//!   jitter turns the first kind's answers into misses). Up to [`SLACK_SAMPLE`] usable
//!   members are looked at (all of a small pool). A member is *hot* when it holds at
//!   least `1 + max(in_flight(other), 1) · latency ratio` requests in flight next to
//!   some other one: more than its latency explains, a queue starting. Among the members
//!   that are not hot, the ones whose *slack* (the SLO less the predicted time at the
//!   SLO percentile, or less the current peak-EWMA latency when that is larger) is
//!   within an eighth of the SLO of the largest form the *roomy tier*, and the request
//!   goes to the one of them with the lowest spreading counter (the even rule's stride
//!   scheduling, slow start included, within the tier), so that pods with clearly more
//!   room take the load and pods level with each other share it evenly. All hot: the
//!   even rule decides. This is Prequal's hot-cold rule (Wydrowski et al., NSDI 2024,
//!   §3: among the replicas of the probe pool that are not hot, the lowest latency;
//!   load as requests in flight), with the SLO's slack as the latency side and levels
//!   of an eighth of the SLO so that near-equal pods are not ranked by noise. Looking at the whole (sampled) pool rather than at two drawn
//!   members matters: with four members and one near, two choices send the near one
//!   only half of the requests. The load signal is current (a queue makes a member hot
//!   within its next few requests, and its slack shrinks as its answers slow), so a near
//!   pod takes what it can serve without queueing and no more; a spread weighted by the
//!   verdict window alone oscillated against a pod's capacity
//!   (docs/results/issue-30.md). The papers' spread stays as a constraint: one decision
//!   in eight (`qos-pool-slack-even-turns`) is an *even turn*, taken by the lowest
//!   spreading counter among the cold members with room under the SLO beyond noise (at
//!   least the tier's width, `SLO / 8`) or not yet measured by this proxy (which, the
//!   others' counters being ahead, goes to the members outside the tier), so no member
//!   that can meet the SLO is starved or left unmeasured; and the saturation rule below
//!   holds for both. A member this proxy measured closer to the SLO than that takes no
//!   even turns (with none to take it, the turn is the slack rule's): it gets requests
//!   when the members with room are hot, or when none is cold (the even rule then
//!   decides among all). A floor share sent there is a floor share of misses: at 50
//!   nodes a pod 148 ± 5 ms away under a 150 ms p99 SLO missed a third of the even turns
//!   it took (docs/results/issue-30.md).
//! * **Saturation overrides evenness.** In-flight counts still decide when they show
//!   that a member is actually saturated, i.e. it holds more requests than its latency
//!   explains: `a` is saturated next to `b` when
//!   `in_flight(a) ≥ 4 + 2 · max(in_flight(b), 1) · latency(a) / latency(b)` (peak-EWMA
//!   latencies; the ratio is 1 while either is unknown). Equal rates make in-flight
//!   counts proportional to latency, so only a queue that builds up beyond that trips
//!   the rule; the 4 keeps a few concurrent requests from counting as saturation, and
//!   `max(…, 1)` keeps an idle fast member from making any request on a slower one
//!   look like a queue.
//! * **Slow start**: a member re-admitted after an eviction has a weight that grows
//!   linearly from 10% to 100% over `qos-pool-slow-start` (Envoy's `slow_start_config`
//!   with aggression 1.0), so it takes a growing share rather than a burst.
//! * **Re-admission**: evicted endpoints receive no client traffic; the data plane sends
//!   them background probes and they return after `readmit_after` consecutive probes
//!   within the SLO (see `endpoint.rs` for the backoff, the failure rules and the flap
//!   protection). While the pool is empty, each request that falls back brings those
//!   probes forward, at most once per probe interval, for the endpoints whose node's
//!   RTT leaves room under the SLO ([`Route::hurry_probes`](crate::Route::hurry_probes)):
//!   the backoff keeps a pod that misses from taking requests too soon, but with no
//!   member every request goes to a pod expected to miss anyway, and a pod that
//!   recovered is found only by its probe.
//! * **Rechecks** (slack spread): a member whose last answer missed or failed is passed
//!   over at once (its peak EWMA holds a failure as 1 s), so its verdict comes from
//!   probes, every probe interval until an answer meets the SLO or its misses take it
//!   out: a probe's miss enters its window and consecutive failed probes eject it (news
//!   its neighbours hear); a good one, which says little of the pod under load, stays
//!   out of the window but clears the miss from its peak EWMA and brings it back level
//!   with the others' spreading counters, not a catch-up burst. Under the even spread
//!   the member keeps its share, and its traffic judges it.
//! * **Fallback** (documented behaviour, not in the paper, whose Algorithm 1 assumes a
//!   pool member): when the pool is empty, the request still goes out, to the endpoints
//!   expected to do best ([`Route::expected`](crate::Route::expected)): the most
//!   answers within the SLO first, then the shortest time at the SLO percentile. A pod
//!   that misses now and then (60 of 64 within) beats a pod that misses always (0 of
//!   64), however many requests each holds: a pod 50 ms away never takes the traffic of
//!   a 12 ms service from pods next door that miss it by a millisecond now and then.
//!   An endpoint this proxy has not measured is expected to take its node's round-trip
//!   time plus the service's processing time, as measured on its other pods
//!   ([`Route::processing_estimate`](crate::Route::processing_estimate); QEdgeProxy §II
//!   faults predictions from network latency alone), and one whose node's RTT is unknown
//!   to take the SLO. The endpoints level with the best (2 points of share, 10% of time)
//!   share the load by the pool's own rule (fewest picks, unless saturated), so that
//!   neither one endpoint nor every proxy herds onto the best-ranked one.
//! * Instance state updates (event 2) rebuild the pool from the endpoints' current
//!   conditions; measurements survive them.

use std::time::Duration;

use rand::{Rng, RngCore};

use super::params::Params;
use super::{two_choices_among, Choice, PickContext, Reason, Strategy};
use crate::settings::{ServiceSettings, SettingError};

/// QEdgeProxy's QoS pool with two-choice spreading (see the module docs).
#[derive(Clone, Copy, Debug)]
pub struct QosPool {
    spread: Spread,
    /// Slacks within `SLO / levels` of the largest are level (the roomy tier).
    levels: f64,
    /// Under [`Spread::Slack`], one decision in this many is taken by the even rule
    /// (`qos-pool-slack-even-turns`; 0: none).
    even_turns: u32,
}

impl Default for QosPool {
    fn default() -> Self {
        Self::new(Spread::default(), SLACK_LEVELS).with_even_turns(EVEN_TURNS)
    }
}

/// How requests are spread inside the pool (`qos-pool-spread`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Spread {
    /// Every member the same share (QEdgeProxy §I), saturation aside.
    Even,
    /// Members with more slack under the SLO take more, against their load in flight;
    /// one decision in [`EVEN_TURNS`] is taken by the even rule (see the module docs).
    /// The default: it led on five of six generated scenarios (docs/results/issue-30.md).
    #[default]
    Slack,
}

/// One pick in this many is decided by the even rule under [`Spread::Slack`] unless
/// `qos-pool-slack-even-turns` says otherwise, so that a member with little slack still
/// gets a floor share and stays measured.
const EVEN_TURNS: u32 = 8;

impl QosPool {
    /// The strategy with `spread`; under [`Spread::Slack`], slacks within
    /// `SLO / levels` of the largest are level.
    pub fn new(spread: Spread, levels: f64) -> Self {
        Self {
            spread,
            levels,
            even_turns: EVEN_TURNS,
        }
    }

    /// Under [`Spread::Slack`], one decision in `turns` by the even rule (0: none).
    pub fn with_even_turns(self, turns: u32) -> Self {
        Self {
            even_turns: turns,
            ..self
        }
    }

    /// Build from a service's settings (`qos-pool-spread: even | slack`,
    /// `qos-pool-slack-levels`: 8 unless set).
    pub fn build(settings: &ServiceSettings) -> (Box<dyn Strategy>, Vec<SettingError>) {
        let mut p = Params::new(settings, "qos-pool");
        let spread = p.choice(
            "spread",
            Spread::default(),
            &[("even", Spread::Even), ("slack", Spread::Slack)],
        );
        let levels = p.number("slack-levels", SLACK_LEVELS, 1.0, 1000.0);
        let turns = p.number("slack-even-turns", f64::from(EVEN_TURNS), 0.0, 1000.0) as u32;
        let pool = Self::new(spread, levels).with_even_turns(turns);
        (Box::new(pool), p.errors)
    }
}

/// In-flight requests beyond what latency explains before a member counts as saturated.
const SATURATION_SLACK: f64 = 4.0;

/// In-flight requests beyond what latency explains before a member counts as *hot*
/// under [`Spread::Slack`]: a hot member leaves the roomy tier whatever its slack.
const HOT_SLACK: f64 = 1.0;

impl Strategy for QosPool {
    fn name(&self) -> &'static str {
        "qos-pool"
    }

    fn pick(&self, ctx: &PickContext<'_>, rng: &mut dyn RngCore) -> Option<Choice> {
        // Read in place; the closure may run again if the pool changes meanwhile (it
        // only reads and draws), and the winner is charged once, below.
        let tier = match self.spread {
            Spread::Even => None,
            Spread::Slack if self.even_turns != 0 && rng.gen_ratio(1, self.even_turns) => {
                Some(Tier::WithRoom(self.levels))
            }
            Spread::Slack => Some(Tier::Roomy(self.levels)),
        };
        let chosen = ctx.route.read_pool(|pool| match pool.len() {
            0 => None,
            1 => ctx.usable(pool.get(0)).then(|| pool.get(0)),
            n => tier
                .and_then(|tier| roomiest(ctx, n, |p| pool.get(p), rng, tier))
                .or_else(|| {
                    two_choices_among(ctx, n, |p| pool.get(p), rng, |a, b| prefer(ctx, a, b))
                })
                .or_else(|| {
                    // Most of the pool is excluded or cooling down: choose among the rest.
                    let usable: Vec<usize> = pool.iter().filter(|&i| ctx.usable(i)).collect();
                    (!usable.is_empty()).then(|| usable[rng.gen_range(0..usable.len())])
                }),
        });
        match chosen {
            Some(index) => {
                let state = ctx.route.state(index);
                state.charge(state.weight(ctx.now, ctx.route.settings().qos_pool.slow_start));
                Some(Choice {
                    index,
                    reason: Reason::Pool,
                })
            }
            None => fallback(ctx),
        }
    }

    /// Least open among the usable pool members (ties at random): a tunnel holds its
    /// pod until it closes, so evenly *opened* tunnels (the stride rule) drift apart as
    /// some close sooner than others; leveling the ones *open* keeps them even. The
    /// in-flight count is what an open tunnel holds (with any plain requests, which on a
    /// pod carrying tunnels are the smaller part). No stride charge: a tunnel is not a
    /// request's share. With no usable member, as `pick` (the fallback).
    fn pick_long_lived(&self, ctx: &PickContext<'_>, rng: &mut dyn RngCore) -> Option<Choice> {
        let least = ctx.route.read_pool(|pool| {
            let usable: Vec<(usize, u32)> = pool
                .iter()
                .filter(|&i| ctx.usable(i))
                .map(|i| (i, ctx.route.state(i).in_flight()))
                .collect();
            let fewest = usable.iter().map(|&(_, open)| open).min()?;
            let level: Vec<usize> = usable
                .iter()
                .filter(|&&(_, open)| open == fewest)
                .map(|&(i, _)| i)
                .collect();
            Some(level[rng.gen_range(0..level.len())])
        });
        match least {
            Some(index) => Some(Choice {
                index,
                reason: Reason::Pool,
            }),
            None => self.pick(ctx, rng),
        }
    }

    fn probes_evicted(&self) -> bool {
        true
    }

    fn hedges(&self) -> bool {
        true
    }

    fn rechecks_misses(&self) -> bool {
        self.spread == Spread::Slack
    }
}

/// The better of two usable pool members by the even rule (see the module docs): not
/// saturated next to the other, then the fewer picks.
fn prefer(ctx: &PickContext<'_>, a: usize, b: usize) -> usize {
    if saturated(ctx, a, b) {
        return b;
    }
    if saturated(ctx, b, a) {
        return a;
    }
    if ctx.route.state(b).picks() < ctx.route.state(a).picks() {
        b
    } else {
        a
    }
}

/// Pool members the slack rule looks at per decision. Prequal's probe pool holds 16
/// replicas; ours are read in place, not probed, so 8 keeps the scan short while a
/// pool of a few pods (the common case) is looked at whole.
const SLACK_SAMPLE: usize = 8;

/// Slacks within `SLO / SLACK_LEVELS` of the largest count as level (the roomy tier),
/// unless `qos-pool-slack-levels` says otherwise.
const SLACK_LEVELS: f64 = 8.0;

/// The members a decision of the slack spread chooses among (see the module docs).
#[derive(Clone, Copy, Debug)]
enum Tier {
    /// Slacks within `SLO / levels` of the largest: the roomy tier.
    Roomy(f64),
    /// Every member with room under the SLO beyond the noise (at least `SLO / levels`,
    /// the roomy tier's width), or not yet measured by this proxy (so that it gets
    /// measured): an even turn.
    WithRoom(f64),
}

/// A member as the slack rule sees it.
#[derive(Clone, Copy, Default)]
struct Seen {
    index: usize,
    in_flight: f64,
    /// Peak-EWMA latency in seconds (0 while unknown): decayed to now when `exact`,
    /// else its bound before the decay, which lies below the prediction (so that the
    /// slack does not need the decay).
    latency: f64,
    exact: bool,
    slack: f64,
    /// Whether `slack` rests on this proxy's own measurements of the member (otherwise
    /// on what [`predicted_micros`] expects of it).
    measured: bool,
}

/// The slack rule (see the module docs): the member of `tier` among the usable ones
/// that are not hot with the lowest spreading counter. `None` when fewer than two usable
/// members were found, or none of them is both cold and in the tier (the even rule then
/// decides).
fn roomiest(
    ctx: &PickContext<'_>,
    count: usize,
    member: impl Fn(usize) -> usize,
    rng: &mut dyn RngCore,
    tier: Tier,
) -> Option<usize> {
    let mut seen = [Seen::default(); SLACK_SAMPLE];
    let len = look_at(ctx, count, member, rng, &mut seen);
    if len < 2 {
        return None;
    }
    let seen = &mut seen[..len];
    // The hot test compares latencies: decay them all when any member may be hot.
    if seen.iter().any(|s| s.in_flight >= HOT_SLACK) {
        for s in seen.iter_mut().filter(|s| !s.exact) {
            s.latency = decayed_peak_ewma(ctx, s.index);
        }
    }
    let seen = &*seen;
    let mut cold = [false; SLACK_SAMPLE];
    for (k, s) in seen.iter().enumerate() {
        cold[k] = !hot(s, seen);
    }
    let best = (0..len)
        .filter(|&k| cold[k])
        .map(|k| seen[k].slack)
        .reduce(f64::max)?;
    let slo = ctx.route.settings().latency_slo.as_secs_f64();
    let in_tier = |s: &Seen, tier: Tier| match tier {
        Tier::Roomy(levels) => s.slack >= best - slo / levels,
        Tier::WithRoom(levels) => s.slack >= slo / levels || !s.measured,
    };
    let fewest_picks = |tier: Tier| {
        (0..len)
            .filter(|&k| cold[k] && in_tier(&seen[k], tier))
            .map(|k| seen[k].index)
            .min_by_key(|&i| ctx.route.state(i).picks())
    };
    fewest_picks(tier).or_else(|| match tier {
        // No member with room: the turn is the slack rule's.
        Tier::WithRoom(levels) => fewest_picks(Tier::Roomy(levels)),
        Tier::Roomy(_) => None,
    })
}

fn decayed_peak_ewma(ctx: &PickContext<'_>, index: usize) -> f64 {
    let state = ctx.route.state(index);
    state.peak_ewma(ctx.now).map_or(0.0, |l| l.as_secs_f64())
}

/// Fill `seen` with up to [`SLACK_SAMPLE`] distinct usable members, starting at a random
/// position (so that ties fall at random); returns how many.
fn look_at(
    ctx: &PickContext<'_>,
    count: usize,
    member: impl Fn(usize) -> usize,
    rng: &mut dyn RngCore,
    seen: &mut [Seen; SLACK_SAMPLE],
) -> usize {
    let mut len = 0;
    let mut add = |index: usize| {
        if len == SLACK_SAMPLE || !ctx.usable(index) || seen[..len].iter().any(|s| s.index == index)
        {
            return;
        }
        let state = ctx.route.state(index);
        let in_flight = f64::from(state.in_flight());
        let predicted = predicted_secs(ctx, index);
        // The decay since the last sample only lowers the peak EWMA: it matters when
        // the EWMA's bound is above the prediction, or for the hot test.
        let bound = state.peak_ewma_bound_secs();
        let exact = bound > predicted || in_flight >= HOT_SLACK;
        let latency = if exact {
            decayed_peak_ewma(ctx, index)
        } else {
            bound
        };
        seen[len] = Seen {
            index,
            in_flight,
            latency,
            exact,
            slack: room(ctx.route.settings().latency_slo, predicted, latency),
            measured: state.score_micros() != 0,
        };
        len += 1;
    };
    let start = rng.gen_range(0..count);
    if count <= SLACK_SAMPLE {
        (0..count).for_each(|k| add(member((start + k) % count)));
    } else {
        // Random positions; a repeat only makes the sample smaller.
        add(member(start));
        for _ in 0..2 * SLACK_SAMPLE {
            add(member(rng.gen_range(0..count)));
        }
    }
    len
}

/// Whether `a` holds at least [`HOT_SLACK`] more requests in flight than its latency
/// explains next to some other member of `seen` ([`beyond_latency`] with a factor of 1,
/// on the values read once): a queue starting at the pod, as this proxy sees it.
fn hot(a: &Seen, seen: &[Seen]) -> bool {
    a.in_flight >= HOT_SLACK
        && seen.iter().any(|b| {
            b.index != a.index
                && beyond_latency(
                    (a.in_flight, a.latency),
                    (b.in_flight, b.latency),
                    HOT_SLACK,
                    1.0,
                )
        })
}

/// Member `i`'s predicted time at the SLO percentile in seconds ([`predicted_micros`];
/// the SLO when that rank is a failure).
fn predicted_secs(ctx: &PickContext<'_>, i: usize) -> f64 {
    let route = ctx.route;
    let micros = predicted_micros(route, i, ctx.environment, ctx.local_node, ctx.now);
    micros_to_secs(micros, route.settings().latency_slo)
}

/// The room member `i` of `route` has now (see [`room`]), for `/debug/pools`: the same
/// numbers the slack rule reads, with the peak EWMA decayed to `now`.
pub(crate) fn room_now(
    route: &crate::Route,
    i: usize,
    env: &crate::environment::Environment,
    local_node: Option<&str>,
    now: std::time::Instant,
) -> f64 {
    let slo = route.settings().latency_slo;
    let predicted = micros_to_secs(predicted_micros(route, i, env, local_node, now), slo);
    let latency = route
        .state(i)
        .peak_ewma(now)
        .map_or(0.0, |l| l.as_secs_f64());
    room(slo, predicted, latency)
}

/// A prediction in µs as seconds; `u64::MAX` (a failure at that rank) as the SLO.
fn micros_to_secs(micros: u64, slo: Duration) -> f64 {
    match micros {
        u64::MAX => slo.as_secs_f64(),
        us => us as f64 / 1e6,
    }
}

/// Member `i`'s predicted time at the SLO percentile, µs: this proxy's own when it has
/// measured it; otherwise what [`Route::expected`](crate::Route::expected) expects of it
/// (its node's RTT plus the processing time a neighbour or the service's other pods
/// show, or the SLO when the RTT is unknown), so that a pod nobody measured is neither
/// the roomiest by default nor ranked by its network distance alone.
fn predicted_micros(
    route: &crate::Route,
    i: usize,
    env: &crate::environment::Environment,
    local_node: Option<&str>,
    now: std::time::Instant,
) -> u64 {
    match route.state(i).score_micros() {
        0 => {
            let service_wide = route
                .heard_processing(i, env, now)
                .is_none()
                .then(|| route.recent_processing_estimate(env, local_node, now))
                .flatten();
            route.expected(i, service_wide, env, local_node, now).micros
        }
        measured => measured,
    }
}

/// The slack the slack spread ranks members by, in seconds: `slo` less the larger of
/// the `predicted` time at the SLO percentile (seconds, [`predicted_secs`]) and the
/// current peak-EWMA `latency` in seconds (which a queue at the pod, from any proxy,
/// raises within a request or two where the window takes many). A member at or over
/// the SLO (in the pool within its verdict margin) keeps 1/64 of the SLO.
fn room(slo: Duration, predicted: f64, latency: f64) -> f64 {
    let slo = slo.as_secs_f64();
    (slo - predicted.max(latency)).max(slo / 64.0)
}

/// Whether `a` holds more requests in flight than its latency explains next to `b`.
fn saturated(ctx: &PickContext<'_>, a: usize, b: usize) -> bool {
    busier(ctx, a, b, SATURATION_SLACK, 2.0)
}

/// Whether `a` holds at least `slack + factor · max(in_flight(b), 1) · latency(a) /
/// latency(b)` requests in flight (peak-EWMA latencies; the ratio is 1 while either is
/// unknown): more than its latency explains next to `b`, by that margin.
fn busier(ctx: &PickContext<'_>, a: usize, b: usize, slack: f64, factor: f64) -> bool {
    let (sa, sb) = (ctx.route.state(a), ctx.route.state(b));
    let in_flight = f64::from(sa.in_flight());
    // The right-hand side is at least the slack (the ratio is never negative): below
    // it there is no need to decay the two peak EWMAs, the costly part of the test.
    if in_flight < slack {
        return false;
    }
    let latency =
        |state: &crate::EndpointState| state.peak_ewma(ctx.now).map_or(0.0, |l| l.as_secs_f64());
    let b = (f64::from(sb.in_flight()), latency(sb));
    beyond_latency((in_flight, latency(sa)), b, slack, factor)
}

/// Whether `a` (requests in flight, latency in seconds, 0 while unknown) holds at least
/// `slack + factor · max(in_flight(b), 1) · latency(a) / latency(b)` requests in
/// flight; the ratio is 1 while either latency is unknown.
fn beyond_latency(a: (f64, f64), b: (f64, f64), slack: f64, factor: f64) -> bool {
    let ((in_flight, la), (others, lb)) = (a, b);
    let ratio = if la > 0.0 && lb > 0.0 { la / lb } else { 1.0 };
    in_flight >= slack + factor * others.max(1.0) * ratio
}

/// The best expected candidates when no pool member can take the request (see the
/// module docs): those level with the best, sharing the load by the pool's own rule.
fn fallback(ctx: &PickContext<'_>) -> Option<Choice> {
    let route = ctx.route;
    route.hurry_probes(ctx.environment, ctx.local_node, ctx.now);
    let processing = route.processing_estimate(ctx.environment, ctx.local_node, ctx.now);
    let expected =
        |i: usize| route.expected(i, processing, ctx.environment, ctx.local_node, ctx.now);
    let best = ctx.candidates().map(expected).min_by(|a, b| a.quality(b))?;
    let index = ctx
        .candidates()
        .filter(|&i| expected(i).level_with(&best))
        .reduce(|a, b| prefer(ctx, a, b))?;
    route.state(index).charge(1.0);
    Some(Choice {
        index,
        reason: Reason::Fallback,
    })
}
