//! One service as routed: its endpoints with their live state, which of them may take
//! traffic, its QoS pool, and its endpoints grouped by node. This is everything a
//! strategy reads when it picks (see `strategy::PickContext`); the router pairs
//! a [`Route`] with the strategy that picks among it (`router::ServiceRoute`). The module
//! depends on neither, so imports run one way: `router` → `strategy` → `route`.
//!
//! # What a route holds and what changes in place
//!
//! A [`Route`] is built by the router from one discovery state and never rebuilt in
//! place: the spec, the endpoints, the eligible set and the node groups are fixed for its
//! life. Three things change while it is published, each because waiting for the next
//! discovery update would route on stale facts:
//!
//! * the **QoS pool** (`pool`): rebuilt from the endpoints' admission verdicts after a
//!   measurement flips one, and from node latencies after an environment update. It is
//!   a [`PoolList`]: a pick reads one complete list, old or new, with plain atomic loads
//!   (no reference count taken), and a writer publishes a whole new list under the
//!   router's writer lock, so two writers never interleave;
//! * each endpoint's [`EndpointState`]: atomics and a mutex of its own, shared with the
//!   routes built later for the same endpoint (that is how measurements survive updates);
//! * two caches that only ever hold what could be recomputed from the route, the
//!   environment and the time: the **node readings** (per node group: fresh latency and
//!   usage, valid for one environment snapshot and the span of time in which no reading
//!   turns stale; see [`NodeReadings`], which also keep what the route's strategy derives
//!   from them, e.g. proximity's weights) and the **cooldown horizon** (a time after which
//!   no endpoint of the service is cooling down; it only ever grows, and a pick that
//!   sees an older value only takes the slower exact path).
//!
//! So a pick never sees a half-built route; at worst it sees a pool or a cache one
//! update behind, which is the same as having picked a moment earlier.

use std::any::Any;
use std::net::SocketAddr;
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use arc_swap::{ArcSwapOption, Guard};

use crate::endpoint::EndpointState;
use crate::environment::{Environment, Usage};
use crate::model::{port_protocol, Endpoint, PortProtocol, ServiceKey, ServicePort, ServiceSpec};
use crate::pool_list::{PoolList, PoolView};
use crate::settings::ServiceSettings;

/// What this proxy expects of an endpoint's next answer: the empty-pool fallback ranks
/// endpoints by it (see `strategy::qos_pool`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expected {
    /// Share of answers within the SLO, in thousandths.
    pub within_permille: u32,
    /// Response time at the SLO percentile, µs (`u64::MAX`: that rank is a failure).
    pub micros: u64,
    /// Whether from this proxy's own measurements of it (otherwise predicted from its
    /// node's RTT and the service's processing time).
    pub measured: bool,
}

impl Expected {
    /// The better of two expectations comes first: more answers within the SLO, then
    /// the shorter time.
    pub fn quality(&self, other: &Self) -> std::cmp::Ordering {
        other
            .within_permille
            .cmp(&self.within_permille)
            .then(self.micros.cmp(&other.micros))
    }

    /// Whether this is as good as `best` for all practical purposes: within 2 points of
    /// its share and 10% (or a millisecond) of its time. Level endpoints share the
    /// fallback's load rather than one taking all of it.
    pub fn level_with(&self, best: &Self) -> bool {
        let time_margin = (best.micros / 10).max(1000);
        self.within_permille + 20 >= best.within_permille
            && self.micros <= best.micros.saturating_add(time_margin)
    }
}

/// An endpoint of a routed service: what discovery said, plus the live state.
#[derive(Debug)]
pub struct RouteEndpoint {
    /// What discovery said about the endpoint: shared with the router's record of it and
    /// with the routes built for it before, since at tens of thousands of endpoints a
    /// copy per route is a good part of the memory.
    pub endpoint: Arc<Endpoint>,
    /// Its measurements and pool state, shared with the data plane (kept across updates
    /// that keep its id and IP).
    pub state: Arc<EndpointState>,
}

/// The eligible endpoints of a route on one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeGroup {
    /// The node's name; `None` for endpoints whose node is unknown.
    pub node: Option<String>,
    /// Indices into [`Route::endpoints`], ascending.
    pub members: Vec<usize>,
}

/// A port of the service as the router resolved it: the index of a service port, or
/// `None` for the unnamed port of a service declared without ports.
pub type PortSlot = Option<usize>;

/// Where a request for one service port goes on one endpoint: the socket address and
/// what the endpoint's port speaks there ([`port_protocol`]), resolved once per route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortTarget {
    /// The endpoint's IP and its port for the service port.
    pub addr: SocketAddr,
    /// What that port speaks.
    pub protocol: PortProtocol,
}

impl PortTarget {
    /// The endpoint's port for `service_port` (`None`: the unnamed port of a service
    /// declared without ports), if it has one.
    pub fn of(endpoint: &Endpoint, service_port: Option<&ServicePort>) -> Option<Self> {
        let name = service_port.map_or("", |p| p.name.as_str());
        let port = endpoint.port_entry(name)?;
        Some(Self {
            addr: SocketAddr::new(endpoint.ip, port.port),
            protocol: port_protocol(port, service_port).0,
        })
    }
}

/// An endpoint's port for one service port and what it speaks: a [`PortTarget`] without
/// the IP, which is the endpoint's own (see [`Route::addr`]). 4 bytes where the whole
/// socket address was 36, for every endpoint and port of every route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SlotPort {
    port: u16,
    protocol: PortProtocol,
}

/// Marks an endpoint that is in no node group (not eligible).
const NO_GROUP: u32 = u32::MAX;

/// One service as routed (see the module docs).
#[derive(Debug)]
pub struct Route {
    /// The service as discovered: shared with the router's record of it, since a copy
    /// per route was ~100 bytes an endpoint at 10 pods a Service.
    pub spec: Arc<ServiceSpec>,
    /// Its endpoints in discovery order; indices into this are how the route names them.
    pub endpoints: Vec<RouteEndpoint>,
    /// Each endpoint's state again, packed (see [`Route::state`]).
    states: Vec<Arc<EndpointState>>,
    eligible: Vec<usize>,
    /// Members are distinct endpoints, so the list's capacity is the endpoint count.
    pool: PoolList,
    /// Eligible endpoints by node, in node-name order (`None` first).
    nodes: Vec<NodeGroup>,
    /// For each endpoint, the index of its group in `nodes` (`NO_GROUP`: not eligible).
    group_of: Vec<u32>,
    /// Each endpoint's port per [`PortSlot`]: one list for the unnamed port, then one
    /// per service port (resolved once here rather than on every pick).
    ports: Vec<Vec<Option<SlotPort>>>,
    /// Shared by every route built for this service (see [`Route::none_cooling`]).
    cooldowns: Arc<CooldownHorizon>,
    /// The router's epoch: the origin of the horizon's nanoseconds.
    epoch: Instant,
    readings: ArcSwapOption<NodeReadings>,
    /// [`Route::recent_processing_estimate`]'s last value (µs + 1; 0: none) and when it
    /// was computed (ns after `epoch`; 0: never).
    processing_cache: [AtomicU64; 2],
    /// When [`Route::hurry_probes`] last ran (ns after `epoch`; 0: never).
    hurried: AtomicU64,
}

/// How long [`Route::recent_processing_estimate`] reuses a computed estimate.
const PROCESSING_CACHE_FOR: Duration = Duration::from_millis(250);

impl Route {
    /// A route over `endpoints` (kept in the given order). `previous` is the route this
    /// one replaces for the same service, whose endpoint states it shares: its cooldown
    /// horizon carries over. `epoch` is the router's.
    pub(crate) fn new(
        spec: Arc<ServiceSpec>,
        endpoints: Vec<RouteEndpoint>,
        previous: Option<&Route>,
        epoch: Instant,
    ) -> Self {
        let eligible = eligible(&endpoints);
        let nodes = node_groups(&endpoints, &eligible);
        let mut group_of = vec![NO_GROUP; endpoints.len()];
        for (g, group) in nodes.iter().enumerate() {
            for &i in &group.members {
                group_of[i] = g as u32;
            }
        }
        let cooldowns = previous.map_or_else(Arc::default, |p| p.cooldowns.clone());
        let slots = [None].into_iter().chain(spec.ports.iter().map(Some));
        let ports = slots
            .map(|service_port| {
                let port = |e: &RouteEndpoint| {
                    let target = PortTarget::of(&e.endpoint, service_port)?;
                    Some(SlotPort {
                        port: target.addr.port(),
                        protocol: target.protocol,
                    })
                };
                endpoints.iter().map(port).collect()
            })
            .collect();
        let states = endpoints.iter().map(|e| e.state.clone()).collect();
        let endpoints_len = endpoints.len();
        let route = Self {
            spec,
            endpoints,
            states,
            ports,
            eligible,
            pool: PoolList::new(endpoints_len),
            nodes,
            group_of,
            cooldowns,
            epoch,
            readings: ArcSwapOption::empty(),
            processing_cache: Default::default(),
            hurried: AtomicU64::new(0),
        };
        for endpoint in &route.endpoints {
            route.note_cooldown(&endpoint.state, epoch);
        }
        route
    }

    /// The live state of endpoint `index` (as `endpoints[index].state`), read from a
    /// list of pointers alone: a pick that compares endpoints of a large service then
    /// does not load each one's discovery record too.
    pub fn state(&self, index: usize) -> &EndpointState {
        &self.states[index]
    }

    /// The service's namespace and name.
    pub fn key(&self) -> &ServiceKey {
        &self.spec.key
    }

    /// The service's settings.
    pub fn settings(&self) -> &ServiceSettings {
        &self.spec.settings
    }

    /// Indices of the endpoints that may take traffic by their conditions: the ready
    /// ones; or, when none is ready, the ones still serving while terminating (as
    /// kube-proxy does).
    pub fn eligible(&self) -> &[usize] {
        &self.eligible
    }

    /// Indices of the eligible endpoints in the QoS pool (warming or admitted). An
    /// endpoint added to a service whose pods are already measured is not in it until
    /// a first background probe has answered within the SLO (as Envoy's
    /// `ignore_new_hosts_until_first_hc`), so that a new pod that cannot meet the SLO
    /// never costs a client request, as long as the pool has a measured member to
    /// serve meanwhile. The endpoints of a new service are tried on the initial
    /// estimate (QEdgeProxy §III-A, event 1); every new endpoint gets its first probe at
    /// once either way (`Router::due_probes`).
    ///
    /// A copy of one complete version of the list; a pick reads it in place with
    /// [`Self::read_pool`].
    pub fn pool(&self) -> Vec<usize> {
        self.pool.to_vec()
    }

    /// Run `read` on one complete version of the pool list (see [`Self::pool`]) without
    /// copying it. `read` may run more than once when the pool changes meanwhile, so it
    /// must have no effect other than its result and its RNG draws (see
    /// [`PoolList::read`]).
    #[inline]
    pub fn read_pool<R>(&self, read: impl FnMut(PoolView<'_>) -> R) -> R {
        self.pool.read(read)
    }

    /// The eligible endpoints grouped by node, in node-name order (endpoints without a
    /// node first).
    pub fn nodes(&self) -> &[NodeGroup] {
        &self.nodes
    }

    /// The index in [`Self::nodes`] of the group holding endpoint `index`, if eligible.
    pub fn group_of(&self, index: usize) -> Option<usize> {
        self.group_of
            .get(index)
            .filter(|&&g| g != NO_GROUP)
            .map(|&g| g as usize)
    }

    /// The name endpoints give the port in `slot` (empty for the unnamed port).
    pub fn port_name(&self, slot: PortSlot) -> &str {
        slot.and_then(|i| self.spec.ports.get(i))
            .map_or("", |p| p.name.as_str())
    }

    /// Endpoint `index`'s address for the port in `slot`, if it has that port (see
    /// [`Endpoint::port`]). The IP comes from the endpoint's record, which the data plane
    /// reads for the picked endpoint anyway (its id labels the request's metrics).
    pub fn addr(&self, slot: PortSlot, index: usize) -> Option<PortTarget> {
        let port = (*self.ports.get(slot.map_or(0, |i| i + 1))?.get(index)?)?;
        Some(PortTarget {
            addr: SocketAddr::new(self.endpoints.get(index)?.endpoint.ip, port.port),
            protocol: port.protocol,
        })
    }

    /// Whether endpoints are only there as a terminating fallback.
    pub fn only_terminating(&self) -> bool {
        !self.eligible.is_empty()
            && self
                .eligible
                .iter()
                .all(|&i| !self.endpoints[i].endpoint.conditions.ready)
    }

    /// Publish a new pool list (the router computes it; it needs the strategy).
    pub(crate) fn set_pool(&self, pool: &[usize]) {
        self.pool.set(pool);
    }

    /// Whether the endpoint at `index` is kept out of the pool until its first probe.
    pub fn awaiting_first_probe(&self, index: usize) -> bool {
        let state = &self.endpoints[index].state;
        state.warming() && state.held_until_probed() && !self.read_pool(|p| p.contains(index))
    }

    /// How many of the eligible endpoints may be out for consecutive failures at once:
    /// `max-ejection-percent` of them, rounded down, but at least one (as Envoy), unless
    /// the percentage is 0.
    pub fn ejection_cap(&self) -> usize {
        let percent = self.spec.settings.qos_pool.max_ejection_percent;
        if percent <= 0.0 {
            return 0;
        }
        ((self.eligible.len() as f64 * percent / 100.0).floor() as usize).max(1)
    }

    /// Eligible endpoints currently out for consecutive failures.
    pub fn failure_ejected(&self) -> usize {
        self.eligible
            .iter()
            .filter(|&&i| self.endpoints[i].state.failure_ejected())
            .count()
    }

    /// Eligible endpoints out for consecutive failures or suspect on a neighbour's
    /// failure report: what [`Self::ejection_cap`] bounds.
    pub fn out_for_failures(&self) -> usize {
        self.eligible
            .iter()
            .filter(|&&i| {
                let state = &self.endpoints[i].state;
                state.failure_ejected() || state.suspected()
            })
            .count()
    }

    /// Whether the endpoint at `index` is due its first probe: never measured, and not
    /// too far by its node's round-trip time alone ([`Self::too_far`] without the
    /// processing time). A probe costs no client request, so an endpoint the prediction
    /// keeps out of the pool but the network alone does not is measured rather than
    /// guessed at.
    pub fn needs_first_probe(
        &self,
        index: usize,
        env: &Environment,
        local_node: Option<&str>,
        now: Instant,
    ) -> bool {
        let state = &self.endpoints[index].state;
        state.warming()
            && !state.measured()
            && self.too_far(index, env, local_node, now, None).is_none()
    }

    /// The initial estimate of QEdgeProxy §III-A, event 1 ("based on initial estimates,
    /// such as environmental conditions"): an endpoint never measured, whose node's
    /// round-trip time from this proxy plus the service's `processing` time
    /// ([`Self::processing_estimate`], when known) exceeds the SLO, cannot meet it and
    /// is not tried. Returns that prediction. Endpoints on this node, without a node, or
    /// without an RTT (measured or predicted) are given the benefit of the doubt; a measured one is
    /// judged on its measurements.
    pub fn too_far(
        &self,
        index: usize,
        env: &Environment,
        local_node: Option<&str>,
        now: Instant,
        processing: Option<Duration>,
    ) -> Option<Duration> {
        let endpoint = &self.endpoints[index];
        let on_this_node = local_node.is_some() && endpoint.endpoint.node.as_deref() == local_node;
        if !endpoint.state.warming() || endpoint.state.measured() || on_this_node {
            return None;
        }
        self.rtt(index, env, local_node, now)
            .map(|rtt| rtt + processing.unwrap_or_default())
            .filter(|predicted| *predicted > self.spec.settings.latency_slo)
    }

    /// The round-trip time from this proxy to the endpoint's node: 0 on this node, the
    /// fresh reading otherwise, else the one its network coordinates predict
    /// ([`Environment::rtt_estimate`]); `None` when there is neither (or no node).
    pub(crate) fn rtt(
        &self,
        index: usize,
        env: &Environment,
        local_node: Option<&str>,
        now: Instant,
    ) -> Option<Duration> {
        let node = self.endpoints[index].endpoint.node.as_deref()?;
        if Some(node) == local_node {
            return Some(Duration::ZERO);
        }
        env.rtt_estimate(node, now).map(|(rtt, _)| rtt)
    }

    /// How long this service's pods take to answer once a request reaches them, as this
    /// proxy measured it: the median, over the eligible endpoints it has measured, of the
    /// response time at the SLO percentile less the round-trip time to the endpoint's
    /// node. QEdgeProxy §II faults predictions "predominantly based on network latency,
    /// thus not capturing processing delays or the waiting time induced by the target
    /// instance's queue"; this is the part the RTT leaves out. `None` without such a
    /// measurement.
    pub fn processing_estimate(
        &self,
        env: &Environment,
        local_node: Option<&str>,
        now: Instant,
    ) -> Option<Duration> {
        let mut processing: Vec<u64> = self
            .eligible
            .iter()
            .filter_map(|&i| {
                let score = self.endpoints[i].state.score_micros();
                let rtt = self.rtt(i, env, local_node, now)?;
                (score > 0 && score < u64::MAX).then(|| {
                    score.saturating_sub(u64::try_from(rtt.as_micros()).unwrap_or(u64::MAX))
                })
            })
            .collect();
        if processing.is_empty() {
            return None;
        }
        let middle = processing.len() / 2;
        let (_, median, _) = processing.select_nth_unstable(middle);
        Some(Duration::from_micros(*median))
    }

    /// [`Self::processing_estimate`] as computed at most [`PROCESSING_CACHE_FOR`] ago,
    /// for the pick path: the estimate scans every eligible endpoint's RTT (a hash
    /// lookup each) and takes a median, ~0.5 µs at 10 endpoints and tens of µs at 1,000,
    /// where a pick takes ~0.15 µs; a quarter of a second old is as good an estimate.
    pub(crate) fn recent_processing_estimate(
        &self,
        env: &Environment,
        local_node: Option<&str>,
        now: Instant,
    ) -> Option<Duration> {
        let [value, at] = &self.processing_cache;
        let now_nanos = self.nanos(now);
        let computed = at.load(Ordering::Relaxed);
        let reuse = u64::try_from(PROCESSING_CACHE_FOR.as_nanos()).unwrap_or(u64::MAX);
        if computed != 0 && now_nanos.saturating_sub(computed) < reuse {
            return value
                .load(Ordering::Relaxed)
                .checked_sub(1)
                .map(Duration::from_micros);
        }
        let fresh = self.processing_estimate(env, local_node, now);
        let micros = fresh.map_or(0, |p| {
            u64::try_from(p.as_micros()).unwrap_or(u64::MAX - 1) + 1
        });
        value.store(micros, Ordering::Relaxed);
        at.store(now_nanos.max(1), Ordering::Relaxed);
        fresh
    }

    /// The processing time to predict the endpoint at `index` with when this proxy has
    /// no fresh measurements of it: the one a neighbouring proxy measured for this very
    /// pod, when fresh (see [`crate::neighbours`]), else `service_wide` (this proxy's
    /// [`Self::processing_estimate`]).
    pub fn processing_of(
        &self,
        index: usize,
        service_wide: Option<Duration>,
        env: &Environment,
        now: Instant,
    ) -> Option<Duration> {
        self.heard_processing(index, env, now)
            .map(|heard| heard.time)
            .or(service_wide)
    }

    /// The fresh processing estimate a neighbour reported for the endpoint at `index`.
    pub fn heard_processing<'e>(
        &self,
        index: usize,
        env: &'e Environment,
        now: Instant,
    ) -> Option<&'e crate::neighbours::HeardProcessing> {
        let pod = &self.endpoints[index].endpoint.id;
        env.hearsay.processing(
            &self.spec.key,
            pod,
            now,
            self.spec.settings.qos_pool.max_age,
        )
    }

    /// What this proxy expects of the endpoint at `index` (see [`Expected`]): its own
    /// measurements when it has fresh ones; otherwise its node's round-trip time plus
    /// its processing time ([`Self::processing_of`]: a neighbour's measurement of it, or
    /// the service's `processing`, [`Self::processing_estimate`]), within the SLO or not.
    /// An endpoint whose node's RTT is unknown is expected to take the SLO (never the
    /// best unknown).
    pub fn expected(
        &self,
        index: usize,
        processing: Option<Duration>,
        env: &Environment,
        local_node: Option<&str>,
        now: Instant,
    ) -> Expected {
        let state = &self.endpoints[index].state;
        let within = state.within_permille();
        if within != crate::endpoint::UNKNOWN_SHARE {
            return Expected {
                within_permille: within,
                micros: state.score_micros(),
                measured: true,
            };
        }
        let slo = self.spec.settings.latency_slo;
        let processing = self.processing_of(index, processing, env, now);
        let time = match self.rtt(index, env, local_node, now) {
            Some(rtt) => rtt + processing.unwrap_or_default(),
            None => slo,
        };
        Expected {
            within_permille: if time <= slo { 1000 } else { 0 },
            micros: u64::try_from(time.as_micros()).unwrap_or(u64::MAX),
            measured: false,
        }
    }

    /// The pool member other than `except`, not cooling down, with the shortest
    /// predicted time at the SLO percentile, and that time: where a late attempt on
    /// `except` is hedged (see [`crate::Picked::hedge_after`]). Members without a
    /// prediction (warming, never measured) or whose percentile rank is a failure are
    /// not counted on.
    pub fn fastest_other_member(&self, except: usize, now: Instant) -> Option<(usize, Duration)> {
        self.read_pool(|pool| {
            pool.iter()
                .filter(|&i| i != except && !self.state(i).cooling_down(now))
                .filter_map(|i| {
                    let score = self.state(i).score_micros();
                    (score > 0 && score < u64::MAX).then_some((i, score))
                })
                .min_by_key(|&(_, score)| score)
        })
        .map(|(i, score)| (i, Duration::from_micros(score)))
    }

    /// The endpoint index with this id.
    pub fn index_of(&self, id: &str) -> Option<usize> {
        self.endpoints.iter().position(|e| e.endpoint.id == id)
    }

    /// No pool member can take a request of the service (the QoS pool's fallback): bring
    /// the next probe of each endpoint out of the pool that could still meet the SLO
    /// (its node's RTT, where known, is under it) forward to now, whatever its backoff;
    /// at most once per `qos-pool-probe-interval`, so that an empty pool probes each such
    /// endpoint at that interval. The backoff (failures doubling the wait up to
    /// `qos-pool-probe-max-interval`, flaps up to a minute) keeps a pod that misses from
    /// taking client requests too soon; while the pool is empty every request goes to a
    /// pod expected to miss anyway, and only a probe can find the pod that recovered.
    pub(crate) fn hurry_probes(&self, env: &Environment, local_node: Option<&str>, now: Instant) {
        let interval = self.spec.settings.qos_pool.probe_interval;
        let at = self.nanos(now).max(1);
        let last = self.hurried.load(Ordering::Relaxed);
        let step = u64::try_from(interval.as_nanos()).unwrap_or(u64::MAX);
        if last != 0 && at < last.saturating_add(step) {
            return;
        }
        if self
            .hurried
            .compare_exchange(last, at, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        let slo = self.spec.settings.latency_slo;
        for &i in &self.eligible {
            if self
                .rtt(i, env, local_node, now)
                .is_none_or(|rtt| rtt < slo)
            {
                self.endpoints[i].state.hurry_probe(now);
            }
        }
    }

    /// Take note of `state`'s cooldown, if it has one at `now` (call after anything
    /// that may have started one: a connection failure, seen in a request or a probe).
    pub(crate) fn note_cooldown(&self, state: &EndpointState, now: Instant) {
        if let Some(left) = state.cooldown_remaining(now) {
            let until = self.nanos(now + left).saturating_add(1);
            self.cooldowns.0.fetch_max(until, Ordering::Relaxed);
        }
    }

    /// Whether no endpoint of the service can be cooling down at `now`: `now` is past
    /// every cooldown the route was told of. `false` only means "look at each one".
    pub fn none_cooling(&self, now: Instant) -> bool {
        self.nanos(now) >= self.cooldowns.0.load(Ordering::Relaxed)
    }

    fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    /// The fresh node readings of the route's node groups at `now` under `env` for a
    /// proxy on `local_node`: the cached ones while still valid, else computed (in
    /// O(readings + nodes)) and cached.
    pub fn node_readings(
        &self,
        env: &Arc<Environment>,
        local_node: Option<&str>,
        now: Instant,
    ) -> ReadingsRef {
        let cached = self.readings.load();
        if cached
            .as_ref()
            .is_some_and(|r| r.valid_for(env, local_node, now))
        {
            return ReadingsRef::Cached(cached);
        }
        let fresh = Arc::new(NodeReadings::new(&self.nodes, env, local_node, now));
        self.readings.store(Some(fresh.clone()));
        ReadingsRef::Computed(fresh)
    }
}

/// The latest end of a cooldown among a service's endpoints, in nanoseconds after the
/// router's epoch (0: none). It only grows; see [`Route::none_cooling`].
#[derive(Debug, Default)]
struct CooldownHorizon(AtomicU64);

/// The fresh environment readings of a route's node groups at one time, and the span of
/// time over which they stay the same. Holding the environment snapshot they were read
/// from keeps its identity (no other snapshot can take its address while it is held).
///
/// They also keep one value the route's strategy derives from them (see
/// [`NodeReadings::derived`]): readings are replaced whenever the route, the environment
/// snapshot or the freshness of a reading changes, so that value is dropped with them.
pub struct NodeReadings {
    environment: Arc<Environment>,
    local_node: Option<String>,
    /// The readings hold for `after < now <= until` (each bound `None`: unbounded).
    after: Option<Instant>,
    until: Option<Instant>,
    /// Per node group (same index as [`Route::nodes`]): fresh RTT from this proxy.
    pub latency: Vec<Option<Duration>>,
    /// Per node group: fresh resource usage.
    pub usage: Vec<Option<Usage>>,
    /// The group of the local node, when it has eligible endpoints.
    pub local: Option<usize>,
    /// Fresh usage of the local node (whether or not it hosts an endpoint).
    pub local_usage: Option<Usage>,
    /// The smallest fresh RTT to any node other than the local one, whether or not it
    /// hosts an endpoint ([`Environment::min_latency`]).
    pub min_latency_elsewhere: Option<Duration>,
    derived: OnceLock<Box<dyn Any + Send + Sync>>,
}

impl std::fmt::Debug for NodeReadings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeReadings")
            .field("after", &self.after)
            .field("until", &self.until)
            .field("latency", &self.latency)
            .field("usage", &self.usage)
            .field("local", &self.local)
            .field("local_usage", &self.local_usage)
            .field("min_latency_elsewhere", &self.min_latency_elsewhere)
            .field("derived", &self.derived.get().is_some())
            .finish_non_exhaustive()
    }
}

impl NodeReadings {
    /// What the route's strategy derives from these readings (and from the route and
    /// its own parameters, which do not change while the readings live): computed by
    /// `derive` on first use, then kept as long as the readings. A route has one
    /// strategy, so one value; `None` if a value of another type is already held.
    pub fn derived<T: Any + Send + Sync>(&self, derive: impl FnOnce(&Self) -> T) -> Option<&T> {
        self.derived
            .get_or_init(|| Box::new(derive(self)))
            .downcast_ref()
    }

    fn new(
        nodes: &[NodeGroup],
        env: &Arc<Environment>,
        local_node: Option<&str>,
        now: Instant,
    ) -> Self {
        // Every reading is fresh while `now <= at + max_age`; find the span around `now`
        // in which none of them changes side.
        let (mut after, mut until) = (None::<Instant>, None::<Instant>);
        let stamps = env
            .latency
            .values()
            .map(|r| r.at)
            .chain(env.usage.values().map(|r| r.at));
        for at in stamps {
            let Some(expiry) = at.checked_add(env.max_age) else {
                continue;
            };
            if now <= expiry {
                until = Some(until.map_or(expiry, |u| u.min(expiry)));
            } else {
                after = Some(after.map_or(expiry, |a| a.max(expiry)));
            }
        }
        Self {
            environment: env.clone(),
            local_node: local_node.map(str::to_string),
            after,
            until,
            latency: nodes
                .iter()
                .map(|g| g.node.as_deref().and_then(|n| env.latency(n, now)))
                .collect(),
            usage: nodes
                .iter()
                .map(|g| g.node.as_deref().and_then(|n| env.usage(n, now)))
                .collect(),
            local: local_node.and_then(|l| nodes.iter().position(|g| g.node.as_deref() == Some(l))),
            local_usage: local_node.and_then(|n| env.usage(n, now)),
            min_latency_elsewhere: env.min_latency(local_node, now),
            derived: OnceLock::new(),
        }
    }

    fn valid_for(&self, env: &Arc<Environment>, local_node: Option<&str>, now: Instant) -> bool {
        Arc::ptr_eq(&self.environment, env)
            && self.after.is_none_or(|a| now > a)
            && self.until.is_none_or(|u| now <= u)
            && self.local_node.as_deref() == local_node
    }
}

/// [`NodeReadings`] as returned by [`Route::node_readings`]: borrowed from the cache, or
/// just computed.
pub enum ReadingsRef {
    /// Borrowed from the route's cache.
    Cached(Guard<Option<Arc<NodeReadings>>>),
    /// Computed for this call (the cached ones were no longer valid).
    Computed(Arc<NodeReadings>),
}

impl Deref for ReadingsRef {
    type Target = NodeReadings;

    fn deref(&self) -> &NodeReadings {
        match self {
            ReadingsRef::Cached(guard) => guard
                .as_deref()
                .expect("a cached reading is only returned when present"),
            ReadingsRef::Computed(readings) => readings,
        }
    }
}

/// The endpoints that may take traffic by their conditions (see [`Route::eligible`]).
fn eligible(endpoints: &[RouteEndpoint]) -> Vec<usize> {
    let mut ready: Vec<usize> = (0..endpoints.len())
        .filter(|&i| endpoints[i].endpoint.conditions.ready)
        .collect();
    if ready.is_empty() {
        ready = (0..endpoints.len())
            .filter(|&i| {
                let c = endpoints[i].endpoint.conditions;
                c.serving && c.terminating
            })
            .collect();
    }
    // Kept for the route's life: a filtered collect grows by doubling (16 slots for a
    // Service of 10 pods).
    ready.shrink_to_fit();
    ready
}

/// The eligible endpoints grouped by node name, in name order (`None` first).
fn node_groups(endpoints: &[RouteEndpoint], eligible: &[usize]) -> Vec<NodeGroup> {
    let mut by_node: std::collections::BTreeMap<Option<&str>, Vec<usize>> = Default::default();
    for &i in eligible {
        by_node
            .entry(endpoints[i].endpoint.node.as_deref())
            .or_default()
            .push(i);
    }
    by_node
        .into_iter()
        .map(|(node, mut members)| {
            // Kept for the route's life: pushed one by one, it grew by doubling.
            members.shrink_to_fit();
            NodeGroup {
                node: node.map(str::to_string),
                members,
            }
        })
        .collect()
}
