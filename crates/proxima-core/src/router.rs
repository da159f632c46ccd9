//! The router: the current routing table and the operations on it.
//!
//! Reads are lock-free: the table is a snapshot behind an [`ArcSwap`] (as pingora's
//! `BackendSelection` does), and a pick only loads it, looks the service up and asks its
//! strategy. A pick reads the snapshot through a per-thread cache (see
//! [`release_cached_table`]): one atomic load to check that it is still the current one,
//! instead of arc-swap's two read-modify-writes per load. The node environment
//! (latencies, usage) is part of the snapshot, so one load gives a pick everything it
//! reads. Writers (discovery updates, pool-membership changes, environment updates)
//! are serialised by one mutex. A discovery update publishes a new snapshot; the
//! snapshot's services, endpoints and node groups never change after that. What does
//! change in place, and why that is safe, is listed in [`crate::route`]: each service's
//! QoS pool (swapped whole, under the writer lock, when a verdict flips or node
//! latencies move), the per-endpoint state (shared between snapshots through `Arc`, so
//! an update that keeps an endpoint keeps its measurements, in-flight count and
//! cooldown), and two caches derived from the route, the environment and the time.
//!
//! An endpoint's state belongs to its name **and** address: a pod
//! recreated under the same name with a new IP (a StatefulSet pod rescheduled) is a
//! new process, maybe on another node, and starts with no history, while a change of
//! conditions, node, zone, hints or port keeps it.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::cache::Cache;
use arc_swap::ArcSwap;
use rand::RngCore;

use crate::endpoint::{EndpointState, Observation, Outcome, PoolChange};
use crate::environment::Environment;
use crate::model::{Endpoint, EndpointId, Node, PortProtocol, ServiceKey, ServiceSpec, Update};
use crate::retry_budget::RetryBudget;
use crate::route::{PortSlot, PortTarget, Route, RouteEndpoint};
use crate::settings::{ProbeShape, ServiceSettings, SettingError};
use crate::strategy::{Choice, PickContext, Reason, Strategy, StrategyRegistry};

/// One service as routed: its [`Route`] (spec, endpoints, eligibility, QoS pool, node
/// groups; everything a strategy reads) and the strategy that picks among it. It
/// dereferences to the route.
#[derive(Debug)]
pub struct ServiceRoute {
    route: Route,
    /// Picks among the route's endpoints; built from the `strategy` setting.
    pub strategy: Box<dyn Strategy>,
    /// Problems with the settings found by the router (an unknown strategy, invalid
    /// strategy parameters); the service runs on defaults for them.
    pub warnings: Vec<SettingError>,
    /// Shared by the service's requests; kept across updates while its settings stay.
    retry_budget: Arc<RetryBudget>,
    /// When a client request of this service was last routed here; kept across updates.
    last_routed: Arc<LastRouted>,
}

/// When a service last had a client request at this proxy (ns after the router's epoch,
/// plus one; 0: never), to the nearest [`LastRouted::GRAIN`]: what pauses the probes of a
/// service nobody on this node uses (`qos-pool-probe-idle-after`).
#[derive(Debug, Default)]
struct LastRouted(AtomicU64);

impl LastRouted {
    /// Picks store at most one timestamp per grain, so that the requests of a busy
    /// service share the word's cache line read-only.
    const GRAIN: Duration = Duration::from_millis(100);

    #[inline]
    fn note(&self, epoch: Instant, now: Instant) {
        let nanos = nanos_after(epoch, now).saturating_add(1);
        let grain = Self::GRAIN.as_nanos() as u64;
        let last = self.0.load(Ordering::Relaxed);
        if last == 0 || nanos.saturating_sub(last) >= grain {
            self.0.store(nanos, Ordering::Relaxed);
        }
    }

    /// How long ago the last request was routed; `None` if none ever was.
    fn ago(&self, epoch: Instant, now: Instant) -> Option<Duration> {
        let stamp = self.0.load(Ordering::Relaxed).checked_sub(1)?;
        Some(now.saturating_duration_since(epoch + Duration::from_nanos(stamp)))
    }
}

fn nanos_after(epoch: Instant, now: Instant) -> u64 {
    u64::try_from(now.saturating_duration_since(epoch).as_nanos()).unwrap_or(u64::MAX)
}

impl Deref for ServiceRoute {
    type Target = Route;

    fn deref(&self) -> &Route {
        &self.route
    }
}

impl ServiceRoute {
    /// Whether endpoint `i`, if in the pool, is probed: a neighbour reported it failing,
    /// or its last answer missed under a strategy that passes such a member over
    /// ([`Strategy::rechecks_misses`]).
    pub(crate) fn probed_in_pool(&self, i: usize) -> bool {
        let state = &self.endpoints[i].state;
        state.suspected() || (state.rechecking() && self.strategy.rechecks_misses())
    }

    /// The endpoints the strategy picks among.
    pub fn route(&self) -> &Route {
        &self.route
    }

    /// The budget that bounds this service's retries (see [`crate::retry_budget`]).
    pub fn retry_budget(&self) -> &RetryBudget {
        &self.retry_budget
    }

    /// Whether the probes of this service's pods outside the pool are paused at this
    /// proxy: no client request for `qos-pool-probe-idle-after` (or ever). Returns how
    /// long ago the last request was routed as well (`None`: never).
    fn probes_paused(&self, epoch: Instant, now: Instant) -> (bool, Option<Duration>) {
        let ago = self.last_routed.ago(epoch, now);
        let after = self.settings().qos_pool.probe_idle_after;
        let paused = !after.is_zero() && ago.is_none_or(|ago| ago >= after);
        (paused, ago)
    }

    /// Rebuild the pool list: eligible endpoints admitted by their measurements, except
    /// warming ones whose node is already too far away (see [`Route::too_far`]), new
    /// ones waiting for their first probe (see [`Route::pool`]) and ones a neighbour's
    /// report made suspect (see [`crate::neighbours`]). Members that just
    /// joined get their spreading counter level with the others'. Callers hold the
    /// router's writer lock.
    fn refresh_pool(&self, env: &Environment, local_node: Option<&str>, now: Instant) {
        let processing = self.processing_estimate(env, local_node, now);
        let candidates: Vec<usize> = self
            .eligible()
            .iter()
            .copied()
            .filter(|&i| {
                let state = &self.endpoints[i].state;
                let processing = self.processing_of(i, processing, env, now);
                state.in_pool()
                    && !state.suspected()
                    && self.too_far(i, env, local_node, now, processing).is_none()
            })
            .collect();
        let probe_first = self.awaits_first_probe(&candidates);
        let pool: Vec<usize> = candidates
            .into_iter()
            .filter(|&i| !(probe_first && self.endpoints[i].state.held_until_probed()))
            .collect();
        let baseline = pool
            .iter()
            .map(|&i| &self.endpoints[i].state)
            .filter(|s| !s.needs_baseline())
            .map(|s| s.picks())
            .min();
        for &i in &pool {
            self.endpoints[i].state.join_baseline(baseline);
        }
        self.route.set_pool(&pool);
    }

    /// Whether never-measured members of `candidates` wait for a first probe: the
    /// strategy probes, and some candidate has been measured (see [`Route::pool`]).
    fn awaits_first_probe(&self, candidates: &[usize]) -> bool {
        self.strategy.probes_evicted()
            && candidates
                .iter()
                .any(|&i| self.endpoints[i].state.measured())
    }
}

/// A snapshot of everything routable. Its maps are never changed once published; the
/// routes in it update their QoS pools and caches in place (see the module docs).
#[derive(Debug, Default)]
pub struct Table {
    /// Looked up on every pick, so hashed with foldhash rather than SipHash.
    pub services: foldhash::HashMap<ServiceKey, Arc<ServiceRoute>>,
    /// Every known node, by name.
    pub nodes: BTreeMap<String, Node>,
    /// Node latencies and usage as last published ([`Router::update_environment`]).
    pub environment: Arc<Environment>,
}

/// A port of the target service, as the client named it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortRef<'a> {
    /// A named port (`name:http`), matched against [`crate::ServicePort::name`].
    Name(&'a str),
    /// A port number, matched against [`crate::ServicePort::port`].
    Number(u16),
}

/// Why no endpoint could be picked.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PickError {
    /// No service of that namespace and name is known.
    #[error("unknown service")]
    UnknownService,
    /// The service has no port of that name or number.
    #[error("the service has no port {0}")]
    UnknownPort(String),
    /// No endpoint may take traffic: none eligible, or the strategy found none.
    #[error("no ready endpoints")]
    NoEndpoints,
}

/// The endpoint chosen for one attempt. Holds the endpoint's in-flight count until it is
/// dropped; report how the attempt went with [`Router::record`].
///
/// The fields are for reading: the count is released on the endpoint the pick chose, in
/// the route it holds, which already holds its state (so no second reference to the
/// state is taken per pick). Its reference to the route is handed back to the dropping
/// thread's pick cache for that thread's next pick of the same route (see
/// [`release_cached_table`]), so a pick and its drop need not touch the route's
/// reference count.
#[derive(Debug)]
pub struct Picked {
    /// The service's route at the time of the pick; `None` only inside `drop`.
    route: Option<Arc<ServiceRoute>>,
    /// Index of the endpoint in [`Route::endpoints`].
    pub index: usize,
    /// Address to connect to: the endpoint's IP and the port that was asked for.
    pub addr: SocketAddr,
    /// What that port speaks.
    pub protocol: PortProtocol,
    /// Why the strategy chose it.
    pub reason: Reason,
    /// When it was picked: the start of the attempt.
    pub at: Instant,
    /// An overdue miss was stored for this attempt (see [`Router::record_overdue`]).
    overdue: AtomicBool,
    /// The endpoint whose in-flight count this pick holds (the chosen `index`).
    holds: usize,
}

impl Drop for Picked {
    fn drop(&mut self) {
        let Some(route) = self.route.take() else {
            return;
        };
        if self.holds < route.endpoints.len() {
            route.state(self.holds).end_attempt();
        }
        // What the stash gives back (a reference it displaced, or this one when the
        // thread's cache is busy or gone) is dropped here, after the cache's borrow.
        let _displaced = CACHED_TABLE.try_with(|cell| match cell.try_borrow_mut() {
            Ok(mut cache) => cache.routes.put(route),
            Err(_) => Some(route),
        });
    }
}

impl Picked {
    /// The service's route at the time of the pick: its spec, settings, endpoints and
    /// retry budget.
    pub fn route(&self) -> &Arc<ServiceRoute> {
        // Only `drop` takes it.
        self.route
            .as_ref()
            .expect("a Picked holds its route until dropped")
    }

    /// Whether an overdue miss has been stored for this attempt.
    pub fn overdue(&self) -> bool {
        self.overdue.load(Ordering::Relaxed)
    }

    /// The endpoint as discovery described it.
    pub fn endpoint(&self) -> &Endpoint {
        &self.route().endpoints[self.index].endpoint
    }

    /// The endpoint's measurements and pool state.
    pub fn state(&self) -> &Arc<EndpointState> {
        &self.route().endpoints[self.index].state
    }

    /// How long this attempt may go without response headers before its request is
    /// sent to a second pod as well (a *hedged request*: Dean and Barroso, "The Tail at
    /// Scale", CACM 2013, which defer the second copy until the first has been
    /// outstanding longer than the 95th-percentile expected latency). Ours is tied to
    /// the SLO instead of a fixed percentile: the second copy goes to the pool member
    /// predicted fastest at the SLO percentile ([`Route::fastest_other_member`]), at
    /// the last moment it can still answer within the SLO with a tenth of it to spare,
    /// `SLO − its prediction − SLO/10`. Sent later it could not meet the SLO; sent
    /// earlier it would duplicate answers that were merely slow. No hedge (`None`) when
    /// that moment comes before this endpoint's own prediction while that prediction
    /// meets the SLO (the hedge would then
    /// duplicate more than the percentile's share of its requests: a tight SLO leaves no
    /// room for a second try), when no other member has a prediction, or when the
    /// strategy or `qos-pool-hedge: off` says so. A pod that went silent (a blackholed
    /// zone, a hung process) then costs its in-flight requests a late answer instead of
    /// a timeout, and the pool member a bounded share of duplicates.
    pub fn hedge_after(&self, now: Instant) -> Option<Duration> {
        let route = self.route();
        let slo = route.settings().latency_slo;
        if !(route.settings().qos_pool.hedge && route.strategy.hedges()) {
            return None;
        }
        let (_, fastest) = route.fastest_other_member(self.index, now)?;
        let after = slo.checked_sub(fastest + slo / HEDGE_SPARE)?;
        // This endpoint's own prediction: unknown, or past the SLO (a member not yet
        // judged out on its misses), does not hold the hedge back.
        let own = u128::from(route.state(self.index).score_micros());
        let after_own = own == 0 || own >= slo.as_micros() || after.as_micros() > own;
        (after_own && !after.is_zero()).then_some(after)
    }
}

/// A hedge must leave the SLO divided by this to spare (see [`Picked::hedge_after`]).
const HEDGE_SPARE: u32 = 10;

/// A background probe of an evicted endpoint, claimed by [`Router::due_probes`]. Report
/// it with [`Router::finish_probe`]; dropping it unreported frees the claim.
#[derive(Debug)]
pub struct ProbeTicket {
    /// The service the endpoint belongs to.
    pub service: ServiceKey,
    /// The endpoint's id.
    pub id: EndpointId,
    /// Address to probe.
    pub addr: SocketAddr,
    /// What the probed port speaks.
    pub protocol: PortProtocol,
    /// `GET` of this path, unless `shape` asks for the service's traffic.
    pub path: String,
    /// Whether to send `GET path` or replay a recent request of the service.
    pub shape: ProbeShape,
    /// Time limit of the probe: the service's `timeout`, at most 10 × its latency SLO.
    pub timeout: Duration,
    /// The first probe of a new endpoint (not of an evicted one).
    pub first: bool,
    settings: ServiceSettings,
    state: Arc<EndpointState>,
    done: bool,
}

impl Drop for ProbeTicket {
    fn drop(&mut self) {
        if !self.done {
            self.state.release_probe();
        }
    }
}

/// What an [`Router::apply`] call changed and what it found wrong.
#[derive(Debug, Default)]
pub struct ApplyReport {
    /// Services whose routes were rebuilt.
    pub changed: Vec<ServiceKey>,
    /// Settings the router could not honour (the service runs on defaults for them).
    pub warnings: Vec<(ServiceKey, SettingError)>,
}

#[derive(Debug, Default)]
struct Desired {
    /// Shared with the route built from each (`Route::spec`).
    specs: BTreeMap<ServiceKey, Arc<ServiceSpec>>,
    /// Shared with the routes built from them (`RouteEndpoint::endpoint`): one copy of
    /// each endpoint, not one here and one per route. A set ordered by the endpoint's
    /// own id rather than a map keyed by a copy of it: at 50,000 endpoints the copies
    /// and the wider tree nodes were ~110 bytes an endpoint.
    endpoints: BTreeMap<ServiceKey, BTreeSet<ById>>,
    nodes: BTreeMap<String, Node>,
}

/// The routing table and its writer (see the module docs). Cheap to share: wrap it in
/// an `Arc`.
#[derive(Debug)]
pub struct Router {
    /// Shared with the per-thread caches of the threads that picked (see
    /// [`release_cached_table`]), which also use it to tell routers apart.
    table: Arc<ArcSwap<Table>>,
    desired: Mutex<Desired>,
    registry: StrategyRegistry,
    local_node: Option<String>,
    epoch: Instant,
    /// Serialises failure ejections so the per-service cap holds under concurrency.
    ejection: Mutex<()>,
    /// When the data plane last reported a stall of its own (ns after `epoch`; 0: never).
    last_stall: AtomicU64,
    /// Set when a latency eviction was withheld for a stall: once the stall is out of
    /// memory, [`Router::due_probes`] re-judges those endpoints on their evidence.
    kept_for_stall: AtomicBool,
    /// Where the next bounded claim of probes starts (an index into the table's
    /// services; see [`Router::due_probes_at_most`]).
    probe_cursor: AtomicU64,
}

/// The table a thread's last pick read, with the router's table cell it came from.
type TableCache = Cache<Arc<ArcSwap<Table>>, Arc<Table>>;

/// What a thread keeps between picks (see [`release_cached_table`]).
struct ThreadPickCache {
    /// The table its last pick read.
    table: Option<TableCache>,
    /// Route references that dropped [`Picked`]s handed back.
    routes: RouteStash,
}

/// How many route references a thread keeps for reuse: enough for the services a
/// worker is busy with at once, few enough that a superseded route leaves soon.
const STASHED_ROUTES: usize = 4;

/// Route references kept by a thread for its next picks, so that a pick and the drop of
/// its [`Picked`] take no atomic read-modify-write on the route's shared reference
/// count. A pick only takes a reference to the very route it chose from the current
/// table (compared by address), so what the stash holds never decides anything; it
/// only keeps routes alive (at most [`STASHED_ROUTES`] per thread).
struct RouteStash {
    slots: [Option<Arc<ServiceRoute>>; STASHED_ROUTES],
    /// The slot `put` replaces next when all are full (round robin, so that a
    /// superseded route is displaced after at most `STASHED_ROUTES` drops).
    next: usize,
}

impl RouteStash {
    const EMPTY: Self = Self {
        slots: [None, None, None, None],
        next: 0,
    };

    /// A kept reference to `route`, if there is one.
    #[inline]
    fn take(&mut self, route: &Arc<ServiceRoute>) -> Option<Arc<ServiceRoute>> {
        self.slots
            .iter_mut()
            .find(|slot| slot.as_ref().is_some_and(|kept| Arc::ptr_eq(kept, route)))?
            .take()
    }

    /// Keep `route`; returns the reference it displaced, for the caller to drop once
    /// the thread's cache is no longer borrowed (dropping a route's last reference runs
    /// destructors, its strategy's among them, that should find the cache free).
    #[inline]
    fn put(&mut self, route: Arc<ServiceRoute>) -> Option<Arc<ServiceRoute>> {
        if let Some(free) = self.slots.iter_mut().find(|slot| slot.is_none()) {
            *free = Some(route);
            return None;
        }
        let at = self.next;
        self.next = (at + 1) % STASHED_ROUTES;
        self.slots[at].replace(route)
    }
}

thread_local! {
    /// This thread's [`ThreadPickCache`] (see [`release_cached_table`]).
    static CACHED_TABLE: RefCell<ThreadPickCache> = const {
        RefCell::new(ThreadPickCache {
            table: None,
            routes: RouteStash::EMPTY,
        })
    };
}

/// Drop this thread's cached routing table and the route references it keeps.
///
/// [`Router::pick`] reads the table through a per-thread cache: it keeps an `Arc` of the
/// snapshot it last read and, on each pick, compares it with the router's current one
/// (one atomic load) and reloads it when they differ. So a pick never routes on an old
/// table, and reading the current one takes no read-modify-write (an `ArcSwap` load
/// takes two: arc-swap's debt slot, claimed and paid back). The same cache keeps up to
/// four route references that dropped [`Picked`]s handed back; a pick that chooses one
/// of those very routes (the same `Arc`, found in the current table) takes that
/// reference instead of incrementing the route's shared reference count, and the drop
/// of its `Picked` hands it back instead of decrementing it.
///
/// What the cache keeps alive: on each thread that has picked, the last table it read
/// (its routes, endpoint states and caches, the node environment) and the router's
/// table cell, until the thread picks again (from any router), exits, or calls this;
/// and the routes of up to four references, until later drops on the thread displace
/// them (round robin), a pick takes them, the thread exits, or it calls this. That is
/// at most one superseded table and four routes per thread, never a growing number,
/// and it only costs memory. A thread that stops picking for good (a runtime's worker
/// going idle, a test's thread after its router is dropped) would keep them until it
/// exits; such threads can call this when they go idle (e.g. a runtime's
/// `on_thread_park` hook), at the price of one full load and one reference count on
/// their next pick.
pub fn release_cached_table() {
    // Nothing to drop when the thread's storage is already gone or a pick is running on
    // this thread (then its cache stays until the next call). What is released is
    // dropped after the borrow (see `RouteStash::put`).
    let _released = CACHED_TABLE.try_with(|cell| {
        cell.try_borrow_mut().ok().map(|mut cache| {
            (
                cache.table.take(),
                std::mem::replace(&mut cache.routes, RouteStash::EMPTY),
            )
        })
    });
}

/// How long after a measured stall the pool's last member is not evicted for latency.
pub const STALL_MEMORY: Duration = Duration::from_secs(5);

impl Router {
    /// A router for a proxy on `local_node`, with the default strategies.
    pub fn new(local_node: Option<String>) -> Self {
        Self::with_registry(local_node, StrategyRegistry::default())
    }

    /// A router for a proxy on `local_node`, building strategies from `registry`.
    pub fn with_registry(local_node: Option<String>, registry: StrategyRegistry) -> Self {
        Self {
            table: Arc::new(ArcSwap::from_pointee(Table::default())),
            desired: Mutex::new(Desired::default()),
            registry,
            local_node,
            epoch: Instant::now(),
            ejection: Mutex::new(()),
            last_stall: AtomicU64::new(0),
            kept_for_stall: AtomicBool::new(false),
            probe_cursor: AtomicU64::new(0),
        }
    }

    /// The data plane measured a stall of its own (scheduling lag) ending at `now`.
    pub fn note_stall(&self, now: Instant) {
        let nanos = now.saturating_duration_since(self.epoch).as_nanos();
        self.last_stall.store(
            u64::try_from(nanos).unwrap_or(u64::MAX).max(1),
            Ordering::Relaxed,
        );
    }

    /// Whether a stall was reported within [`STALL_MEMORY`] before `now`.
    pub fn stalled_recently(&self, now: Instant) -> bool {
        match self.last_stall.load(Ordering::Relaxed) {
            0 => false,
            nanos => {
                now.saturating_duration_since(self.epoch + Duration::from_nanos(nanos))
                    <= STALL_MEMORY
            }
        }
    }

    /// The node this proxy runs on, if known.
    pub fn local_node(&self) -> Option<&str> {
        self.local_node.as_deref()
    }

    /// The strategies this router can build.
    pub fn registry(&self) -> &StrategyRegistry {
        &self.registry
    }

    /// The current snapshot.
    pub fn table(&self) -> Arc<Table> {
        self.table.load_full()
    }

    /// The current node latencies and usage.
    pub fn environment(&self) -> Arc<Environment> {
        self.table.load().environment.clone()
    }

    /// Change the environment (node latencies, usage) and publish it. Writers are the
    /// periodic measurement loops; readers never wait for them.
    pub fn update_environment(&self, change: impl FnOnce(&mut Environment)) {
        self.update_environment_in(|env, _| change(env));
    }

    /// [`Self::update_environment`], `change` also reading the table it applies to.
    pub(crate) fn update_environment_in(&self, change: impl FnOnce(&mut Environment, &Table)) {
        let _writer = self.desired();
        let current = self.table.load();
        let mut env = Environment::clone(&current.environment);
        change(&mut env, &current);
        // New latencies can move warming endpoints in or out of their pools (the
        // initial estimate, see `Route::too_far`).
        if let Some(now) = env.newest() {
            for route in current.services.values() {
                route.refresh_pool(&env, self.local_node(), now);
            }
        }
        self.table.store(Arc::new(Table {
            services: current.services.clone(),
            nodes: current.nodes.clone(),
            environment: Arc::new(env),
        }));
    }

    fn desired(&self) -> std::sync::MutexGuard<'_, Desired> {
        self.desired.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Apply discovery updates and publish a new snapshot.
    pub fn apply<I: IntoIterator<Item = Update>>(&self, updates: I, now: Instant) -> ApplyReport {
        let mut desired = self.desired();
        let mut dirty = BTreeSet::new();
        let mut nodes_changed = false;
        for update in updates {
            match update {
                Update::Reset { nodes, services } => {
                    nodes_changed = true;
                    desired.nodes = nodes.into_iter().map(|n| (n.name.clone(), n)).collect();
                    dirty.extend(desired.specs.keys().cloned());
                    dirty.extend(desired.endpoints.keys().cloned());
                    desired.specs.clear();
                    desired.endpoints.clear();
                    for (spec, endpoints) in services {
                        dirty.insert(spec.key.clone());
                        desired.endpoints.insert(spec.key.clone(), by_id(endpoints));
                        desired.specs.insert(spec.key.clone(), Arc::new(spec));
                    }
                }
                Update::UpsertNode(node) => {
                    nodes_changed = true;
                    desired.nodes.insert(node.name.clone(), node);
                }
                Update::RemoveNode(name) => {
                    nodes_changed |= desired.nodes.remove(&name).is_some();
                }
                Update::UpsertService(spec) => {
                    dirty.insert(spec.key.clone());
                    desired.specs.insert(spec.key.clone(), Arc::new(spec));
                }
                Update::RemoveService(key) => {
                    desired.specs.remove(&key);
                    desired.endpoints.remove(&key);
                    dirty.insert(key);
                }
                Update::SetEndpoints { service, endpoints } => {
                    desired.endpoints.insert(service.clone(), by_id(endpoints));
                    dirty.insert(service);
                }
                Update::UpsertEndpoint { service, endpoint } => {
                    desired
                        .endpoints
                        .entry(service.clone())
                        .or_default()
                        .replace(ById(Arc::new(endpoint)));
                    dirty.insert(service);
                }
                Update::RemoveEndpoint { service, id } => {
                    if let Some(eps) = desired.endpoints.get_mut(&service) {
                        eps.remove(id.as_str());
                    }
                    dirty.insert(service);
                }
            }
        }

        let current = self.table.load();
        let mut report = ApplyReport::default();
        let mut services = current.services.clone();
        for key in dirty {
            match self.build_route(&mut desired, &key, current.services.get(&key), now) {
                Some(route) => {
                    for w in &route.warnings {
                        report.warnings.push((key.clone(), w.clone()));
                    }
                    services.insert(key.clone(), Arc::new(route));
                }
                None => {
                    services.remove(&key);
                }
            }
            report.changed.push(key);
        }
        let nodes = if nodes_changed {
            desired.nodes.clone()
        } else {
            current.nodes.clone()
        };
        self.table.store(Arc::new(Table {
            services,
            nodes,
            environment: current.environment.clone(),
        }));
        report
    }

    fn build_route(
        &self,
        desired: &mut Desired,
        key: &ServiceKey,
        previous: Option<&Arc<ServiceRoute>>,
        now: Instant,
    ) -> Option<ServiceRoute> {
        // Endpoints may arrive before their Service; keep them, route nothing.
        let spec = desired.specs.get(key).cloned()?;
        let empty = BTreeSet::new();
        let wanted = desired.endpoints.get(key).unwrap_or(&empty);
        // The states to keep are those of the previous route's endpoints that stay with
        // the same name and address (see the module docs); the route is their only
        // record, rather than a map of every endpoint's name and state beside it (at
        // 50,000 endpoints, ~120 bytes each).
        let previous_by_id: HashMap<&str, &RouteEndpoint> = previous
            .map(|p| {
                let endpoints = p.route().endpoints.iter();
                endpoints.map(|e| (e.endpoint.id.as_str(), e)).collect()
            })
            .unwrap_or_default();
        let kept = |id: &str, endpoint: &Endpoint| {
            previous_by_id
                .get(id)
                .filter(|e| e.endpoint.ip == endpoint.ip)
                .map(|e| &e.state)
        };
        let settings_changed = previous.is_none_or(|p| p.spec.settings != spec.settings);
        let mut endpoints = Vec::with_capacity(wanted.len());
        // An endpoint added to a service already measured waits for its first probe
        // (see `Route::pool`); those of a new service are tried at once.
        let service_measured = wanted
            .iter()
            .filter_map(|ById(endpoint)| kept(&endpoint.id, endpoint))
            .any(|s| s.measured());
        for ById(endpoint) in wanted {
            let state = kept(&endpoint.id, endpoint).cloned().unwrap_or_else(|| {
                let state = EndpointState::new(&spec.settings, self.epoch);
                if service_measured {
                    state.hold_until_probed();
                }
                Arc::new(state)
            });
            if settings_changed {
                state.reevaluate(now, &spec.settings, previous.is_some());
            }
            endpoints.push(RouteEndpoint {
                endpoint: endpoint.clone(),
                state,
            });
        }
        let (strategy, warnings) = self.registry.build(&spec.settings);
        let retry_budget = previous
            .filter(|p| p.spec.settings.retry_budget == spec.settings.retry_budget)
            .map(|p| p.retry_budget.clone())
            .unwrap_or_else(|| Arc::new(RetryBudget::new(spec.settings.retry_budget, self.epoch)));
        let route = ServiceRoute {
            route: Route::new(spec, endpoints, previous.map(|p| p.route()), self.epoch),
            strategy,
            warnings,
            retry_budget,
            last_routed: previous.map(|p| p.last_routed.clone()).unwrap_or_default(),
        };
        route.refresh_pool(&self.table.load().environment, self.local_node(), now);
        Some(route)
    }

    /// Pick an endpoint of `service` for one attempt, skipping endpoint ids in `exclude`
    /// (those already tried for this request).
    pub fn pick(
        &self,
        service: &ServiceKey,
        port: Option<PortRef<'_>>,
        now: Instant,
        rng: &mut dyn RngCore,
        exclude: &[EndpointId],
    ) -> Result<Picked, PickError> {
        let cached = CACHED_TABLE.try_with(|cell| {
            // Busy only if a strategy picks from inside a pick; then the plain load below.
            let mut slot = cell.try_borrow_mut().ok()?;
            let ThreadPickCache { table, routes } = &mut *slot;
            let cache = match table {
                Some(cache) if std::ptr::eq(cache.arc_swap(), &*self.table) => cache,
                other => other.insert(Cache::new(self.table.clone())),
            };
            Some(self.pick_in(
                cache.load(),
                Some(routes),
                service,
                port,
                now,
                rng,
                exclude,
                false,
            ))
        });
        match cached {
            Ok(Some(picked)) => picked,
            // The thread is exiting (its cache is gone) or the cache is in use.
            _ => self.pick_in(
                &self.table.load(),
                None,
                service,
                port,
                now,
                rng,
                exclude,
                false,
            ),
        }
    }

    /// [`pick`](Self::pick) for a long-lived exchange (a tunnel), by the strategy's
    /// [`Strategy::pick_long_lived`]. Rare next to requests: no per-thread cache.
    pub fn pick_long_lived(
        &self,
        service: &ServiceKey,
        port: Option<PortRef<'_>>,
        now: Instant,
        rng: &mut dyn RngCore,
        exclude: &[EndpointId],
    ) -> Result<Picked, PickError> {
        self.pick_in(
            &self.table.load(),
            None,
            service,
            port,
            now,
            rng,
            exclude,
            true,
        )
    }

    // Inlined into both of `pick`'s paths (cached table, plain load), so that the hot one
    // makes no call for it.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn pick_in(
        &self,
        table: &Table,
        stash: Option<&mut RouteStash>,
        service: &ServiceKey,
        port: Option<PortRef<'_>>,
        now: Instant,
        rng: &mut dyn RngCore,
        exclude: &[EndpointId],
        long_lived: bool,
    ) -> Result<Picked, PickError> {
        let route = table
            .services
            .get(service)
            .ok_or(PickError::UnknownService)?;
        let port = resolve_port_slot(route, port)?;
        // The first try of a request excludes nothing: no list to build.
        let mut excluded: Vec<usize> = if exclude.is_empty() {
            let choice = self.choose(table, route, now, rng, &[], long_lived)?;
            match route.addr(port, choice.index) {
                Some(target) => return Ok(self.picked(route, stash, choice, target, now)),
                None => vec![choice.index],
            }
        } else {
            exclude.iter().filter_map(|id| route.index_of(id)).collect()
        };
        // A strategy may pick an endpoint that lacks the requested port; skip it and ask
        // again, at most once per endpoint (a first try above that found no port counts
        // as one of these tries).
        let tries = route.endpoints.len() + 1;
        for _ in usize::from(exclude.is_empty())..tries {
            let choice = self.choose(table, route, now, rng, &excluded, long_lived)?;
            match route.addr(port, choice.index) {
                Some(target) => return Ok(self.picked(route, stash, choice, target, now)),
                None => excluded.push(choice.index),
            }
        }
        Err(PickError::NoEndpoints)
    }

    /// The strategy's choice (or the last resort) among the endpoints not in `excluded`.
    #[inline]
    fn choose(
        &self,
        table: &Table,
        route: &ServiceRoute,
        now: Instant,
        rng: &mut dyn RngCore,
        excluded: &[usize],
        long_lived: bool,
    ) -> Result<Choice, PickError> {
        let ctx = PickContext {
            route: route.route(),
            now,
            local_node: self.local_node.as_deref(),
            nodes: &table.nodes,
            environment: &table.environment,
            exclude: excluded,
        };
        let choice = if long_lived {
            route.strategy.pick_long_lived(&ctx, rng)
        } else {
            route.strategy.pick(&ctx, rng)
        };
        choice
            .or_else(|| {
                route
                    .strategy
                    .last_resort_allowed()
                    .then(|| last_resort(&ctx))
                    .flatten()
            })
            .ok_or(PickError::NoEndpoints)
    }

    fn picked(
        &self,
        route: &Arc<ServiceRoute>,
        stash: Option<&mut RouteStash>,
        choice: Choice,
        target: PortTarget,
        now: Instant,
    ) -> Picked {
        route.state(choice.index).begin_attempt();
        route.last_routed.note(self.epoch, now);
        // A reference a dropped `Picked` of this very route handed back, if any.
        let route = stash
            .and_then(|stash| stash.take(route))
            .unwrap_or_else(|| route.clone());
        Picked {
            route: Some(route),
            index: choice.index,
            addr: target.addr,
            protocol: target.protocol,
            reason: choice.reason,
            at: now,
            overdue: AtomicBool::new(false),
            holds: choice.index,
        }
    }

    /// The second attempt of a request whose attempt on `first` is late (see
    /// [`Picked::hedge_after`]): the pool member predicted fastest other than it, on the
    /// port `port` names; `None` when there is none. Not charged to the spreading
    /// counters: a hedge is a copy, not a request's share.
    pub fn pick_hedge(
        &self,
        first: &Picked,
        port: Option<PortRef<'_>>,
        now: Instant,
    ) -> Option<Picked> {
        let route = first.route();
        let (index, _) = route.fastest_other_member(first.index, now)?;
        let target = route.addr(resolve_port_slot(route, port).ok()?, index)?;
        let choice = Choice {
            index,
            reason: Reason::Hedge,
        };
        Some(self.picked(route, None, choice, target, now))
    }

    /// Report how an attempt went (Algorithm 1, `storeQoSMeasurements`). Returns the
    /// pool change it caused, if any.
    pub fn record(&self, picked: &Picked, now: Instant, outcome: Outcome) -> Option<PoolChange> {
        self.record_stalled(picked, now, outcome, Duration::ZERO)
    }

    /// [`record`](Self::record) for an attempt during which the proxy itself was stalled
    /// for `stall` (its measured scheduling lag): a response that misses the SLO by no
    /// more than that is set aside rather than counted (see `endpoint.rs`).
    pub fn record_stalled(
        &self,
        picked: &Picked,
        now: Instant,
        outcome: Outcome,
        stall: Duration,
    ) -> Option<PoolChange> {
        let late = picked.overdue();
        self.observe(picked, now, stall, |state, obs| {
            let obs = Observation { late, ..obs };
            state.observe(now, outcome, picked.route().settings(), &obs)
        })
    }

    /// The attempt has had no response headers for longer than the SLO (and longer
    /// than the SLO plus the proxy's own stall since it started): store a miss now.
    /// Its eventual outcome, reported with `record`, adds no second sample. Returns the
    /// pool change it caused; does nothing if already reported.
    pub fn record_overdue(&self, picked: &Picked, now: Instant) -> Option<PoolChange> {
        if picked.overdue.swap(true, Ordering::Relaxed) {
            return None;
        }
        self.observe(picked, now, Duration::ZERO, |state, obs| {
            state.observe_overdue(now, picked.route().settings(), &obs)
        })
    }

    /// The attempt, already stored overdue, is still unanswered at `now`,
    /// [`unanswered_limit`](crate::endpoint::unanswered_limit) after it was sent (less
    /// the proxy's own stalls): if its pod has answered nothing since, the pod hangs and
    /// leaves the pool (see `endpoint.rs`). Returns the pool change it caused.
    pub fn record_unanswered(&self, picked: &Picked, now: Instant) -> Option<PoolChange> {
        let overdue = self.record_overdue(picked, now);
        let hung = self.observe(picked, now, Duration::ZERO, |state, obs| {
            state.observe_unanswered(now, picked.at, picked.route().settings(), &obs)
        });
        overdue.or(hung)
    }

    /// The client went away before the attempt was answered: "no answer after
    /// `now - picked.at`" is a miss when that exceeds the SLO (less the proxy's own
    /// `stall` meanwhile), and no evidence otherwise; past the unanswered limit it is
    /// judged as [`record_unanswered`](Self::record_unanswered) does.
    pub fn record_abandoned(
        &self,
        picked: &Picked,
        now: Instant,
        stall: Duration,
    ) -> Option<PoolChange> {
        let waited = now
            .saturating_duration_since(picked.at)
            .saturating_sub(stall);
        let settings = picked.route().settings();
        if waited >= crate::endpoint::unanswered_limit(settings) {
            self.record_unanswered(picked, now)
        } else if waited > settings.latency_slo {
            self.record_overdue(picked, now)
        } else {
            None
        }
    }

    /// Run one observation of `picked`'s endpoint with the service-wide checks it needs
    /// (the failure-ejection cap, the stall guard), then refresh the pool if it changed.
    fn observe(
        &self,
        picked: &Picked,
        now: Instant,
        stall: Duration,
        run: impl FnOnce(&EndpointState, Observation<'_>) -> Option<PoolChange>,
    ) -> Option<PoolChange> {
        let route = picked.route();
        let state = picked.state();
        let may_eject = || {
            let _one_at_a_time = self.ejection.lock().unwrap_or_else(|e| e.into_inner());
            // A suspect pod is counted already: its own ejection takes no second place.
            let others = route.out_for_failures() - usize::from(state.suspected());
            if others < route.ejection_cap() {
                state.set_failure_ejected();
                true
            } else {
                false
            }
        };
        let keep_in_pool = || {
            // Never let noise empty a pool that was healthy a moment ago: while the
            // proxy has just measured a stall of its own, the last member stays.
            let only_member = route.read_pool(|p| p.len() == 1 && p.get(0) == picked.index);
            let keep = only_member && self.stalled_recently(now);
            if keep {
                self.kept_for_stall.store(true, Ordering::Relaxed);
            }
            keep
        };
        let obs = Observation {
            from_probe: false,
            late: false,
            stall,
            may_eject: &may_eject,
            keep_in_pool: &keep_in_pool,
            pool_empty: &|| route.read_pool(|pool| pool.is_empty()),
        };
        let was_measured = state.measured();
        let was_suspect = state.suspected();
        let change = run(state, obs);
        // A connection failure may have started a cooldown (see `Route::none_cooling`).
        route.note_cooldown(state, now);
        if change.is_some() || was_measured != state.measured() || was_suspect != state.suspected()
        {
            self.refresh_pool(route.key(), now);
        }
        change
    }

    fn refresh_pool(&self, key: &ServiceKey, now: Instant) {
        // Under the writer lock, so that a concurrent apply either sees the new
        // membership or publishes a route that this refresh then updates.
        let _desired = self.desired();
        let table = self.table.load();
        if let Some(route) = table.services.get(key) {
            route.refresh_pool(&table.environment, self.local_node(), now);
        }
    }

    /// Claim the background probes due at `now` for services whose strategy probes:
    /// evicted endpoints on their schedule, and new endpoints never measured (one first
    /// probe each). Evicted and suspect endpoints of a service with no client request
    /// here for `qos-pool-probe-idle-after` wait for its next request instead.
    pub fn due_probes(&self, now: Instant) -> Vec<ProbeTicket> {
        self.due_probes_at_most(now, usize::MAX)
    }

    /// [`due_probes`](Self::due_probes), claiming at most `first_probes` first probes of
    /// new endpoints. The data plane bounds its first probes in flight, so that a thousand
    /// new endpoints (a start, a large rollout) are probed a wave at a time instead of
    /// opening a connection to each at once; what is left stays due and is claimed by a
    /// later call, which starts right after the last endpoint this one claimed, so a
    /// bound never starves any endpoint. Probes of evicted endpoints are never held back:
    /// they are how a recovered pod gets back into its pool, and a few that hang until
    /// their timeout must not delay the others. (New endpoints are in their pool while
    /// they warm up, so a later first probe costs no capacity.)
    pub fn due_probes_at_most(&self, now: Instant, first_probes: usize) -> Vec<ProbeTicket> {
        self.rejudge_after_stall(now);
        let table = self.table.load();
        let mut due = Vec::new();
        let count = table.services.len();
        if count == 0 {
            return due;
        }
        // The map is never changed once published, so its order is stable between calls
        // on the same table (a new table merely resumes the rotation elsewhere).
        let (start, start_slot) = unpack_cursor(self.probe_cursor.load(Ordering::Relaxed));
        let start = start % count;
        let mut firsts = 0;
        let mut resume_at = None;
        // The first service is visited from the cursor on, and once more at the end up
        // to it, so every (service, endpoint) is visited once per call.
        let visits = table.services.values().cycle().skip(start).take(count + 1);
        for (offset, route) in visits.enumerate() {
            if !route.strategy.probes_evicted() {
                continue;
            }
            let (paused, _) = self.probes_paused(route, now);
            let eligible = route.eligible();
            let slots = match offset {
                0 => start_slot.min(eligible.len())..eligible.len(),
                _ if offset == count => 0..start_slot.min(eligible.len()),
                _ => 0..eligible.len(),
            };
            let settings = route.settings();
            let service_port = resolve_port_slot(route, None)
                .ok()
                .flatten()
                .and_then(|slot| route.spec.ports.get(slot));
            let env = &table.environment;
            for slot in slots {
                let i = eligible[slot];
                let ep = &route.endpoints[i];
                // Every new endpoint is probed at once, so that one which cannot meet
                // the SLO is usually known before a client request would try it.
                let first_probe = route.needs_first_probe(i, env, self.local_node(), now);
                if ep.state.in_pool() && !first_probe && !route.probed_in_pool(i) {
                    continue;
                }
                // Left due: the first tick after the service's next request claims it.
                if paused && !first_probe {
                    continue;
                }
                if first_probe && firsts == first_probes {
                    resume_at.get_or_insert(((start + offset) % count, slot));
                    continue;
                }
                let Some(target) = PortTarget::of(&ep.endpoint, service_port) else {
                    continue;
                };
                if ep.state.claim_probe(now, first_probe) {
                    firsts += usize::from(first_probe);
                    due.push(ProbeTicket {
                        service: route.key().clone(),
                        id: ep.endpoint.id.clone(),
                        addr: target.addr,
                        protocol: target.protocol,
                        path: settings.qos_pool.probe_path.clone(),
                        shape: settings.qos_pool.probe,
                        timeout: settings.timeout.min(settings.latency_slo * 10),
                        first: first_probe,
                        settings: settings.clone(),
                        state: ep.state.clone(),
                        done: false,
                    });
                }
            }
        }
        if let Some((service, slot)) = resume_at {
            self.probe_cursor
                .store(pack_cursor(service, slot), Ordering::Relaxed);
        }
        due
    }

    /// How many endpoints still wait for their first measurement (probe or request), of
    /// the services whose strategy probes: what a proxy that just started has yet to
    /// learn before it knows which new pods cannot meet their SLO.
    pub fn first_probes_pending(&self, now: Instant) -> usize {
        let table = self.table.load();
        let env = &table.environment;
        table
            .services
            .values()
            .filter(|route| route.strategy.probes_evicted())
            .map(|route| {
                route
                    .eligible()
                    .iter()
                    .filter(|&&i| route.needs_first_probe(i, env, self.local_node(), now))
                    .count()
            })
            .sum()
    }

    /// An endpoint kept in the pool only because the proxy had just stalled is judged
    /// on its evidence once the stall is out of memory, without waiting for traffic.
    fn rejudge_after_stall(&self, now: Instant) {
        if !self.kept_for_stall.load(Ordering::Relaxed) || self.stalled_recently(now) {
            return;
        }
        self.kept_for_stall.store(false, Ordering::Relaxed);
        let table = self.table.load();
        for route in table.services.values() {
            let mut changed = false;
            for &i in route.eligible() {
                let state = &route.endpoints[i].state;
                if state.in_pool() && state.kept_during_stall() {
                    changed |= state.reevaluate(now, route.settings(), false).is_some();
                }
            }
            if changed {
                self.refresh_pool(route.key(), now);
            }
        }
    }

    /// Whether `route`'s probes of pods outside its pool are paused here for want of
    /// client requests, and how long ago its last one was routed (`None`: never).
    pub(crate) fn probes_paused(
        &self,
        route: &ServiceRoute,
        now: Instant,
    ) -> (bool, Option<Duration>) {
        route.probes_paused(self.epoch, now)
    }

    /// Report a probe's outcome. Returns the pool change it caused, if any.
    pub fn finish_probe(
        &self,
        mut ticket: ProbeTicket,
        now: Instant,
        outcome: Outcome,
    ) -> Option<PoolChange> {
        ticket.done = true;
        let was_measured = ticket.state.measured();
        let was_suspect = ticket.state.suspected();
        let was_rechecking = ticket.state.rechecking();
        let table = self.table.load();
        let route = table.services.get(&ticket.service);
        let pool_empty = || route.is_some_and(|r| r.read_pool(|pool| pool.is_empty()));
        let obs = Observation {
            pool_empty: &pool_empty,
            ..Observation::plain(true)
        };
        let change = ticket.state.observe(now, outcome, &ticket.settings, &obs);
        if let Some(route) = route {
            route.note_cooldown(&ticket.state, now);
        }
        if change.is_some()
            || was_measured != ticket.state.measured()
            || was_suspect != ticket.state.suspected()
            || was_rechecking != ticket.state.rechecking()
        {
            self.refresh_pool(&ticket.service, now);
        }
        change
    }
}

/// A bounded probe claim's resume point: a service's place in the table and an
/// endpoint's place in that service's eligible list, 32 bits each.
fn pack_cursor(service: usize, slot: usize) -> u64 {
    let part = |v: usize| u64::try_from(v).unwrap_or(u64::MAX) & u64::from(u32::MAX);
    (part(service) << 32) | part(slot)
}

fn unpack_cursor(cursor: u64) -> (usize, usize) {
    (
        (cursor >> 32) as usize,
        (cursor & u64::from(u32::MAX)) as usize,
    )
}

/// An endpoint in the router's record of a service, ordered and found by its id.
#[derive(Debug)]
struct ById(Arc<Endpoint>);

impl PartialEq for ById {
    fn eq(&self, other: &Self) -> bool {
        self.0.id == other.0.id
    }
}

impl Eq for ById {}

impl PartialOrd for ById {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ById {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.id.cmp(&other.0.id)
    }
}

impl std::borrow::Borrow<str> for ById {
    fn borrow(&self) -> &str {
        &self.0.id
    }
}

/// A service's endpoints by id; of several under one id, the last is kept.
fn by_id(endpoints: Vec<Endpoint>) -> BTreeSet<ById> {
    let mut set = BTreeSet::new();
    for endpoint in endpoints {
        set.replace(ById(Arc::new(endpoint)));
    }
    set
}

/// The requested service port as a [`PortSlot`] of the route: the index of the
/// service port, or `None` for the unnamed one.
#[inline]
fn resolve_port_slot(
    route: &ServiceRoute,
    port: Option<PortRef<'_>>,
) -> Result<PortSlot, PickError> {
    let ports = &route.spec.ports;
    let found = match port {
        None => return Ok((!ports.is_empty()).then_some(0)),
        Some(PortRef::Name(name)) => ports.iter().position(|p| p.name == name),
        Some(PortRef::Number(n)) => ports.iter().position(|p| p.port == n),
    };
    match (found, port) {
        (Some(p), _) => Ok(Some(p)),
        // A service declared without ports takes any port number (file discovery).
        (None, Some(PortRef::Number(_))) if ports.is_empty() => Ok(None),
        (None, Some(PortRef::Name(n))) => Err(PickError::UnknownPort(n.to_string())),
        (None, Some(PortRef::Number(n))) => Err(PickError::UnknownPort(n.to_string())),
        (None, None) => Ok(None),
    }
}

/// Every candidate is cooling down: try the eligible endpoint whose cooldown ends first
/// rather than failing the request outright.
fn last_resort(ctx: &PickContext<'_>) -> Option<Choice> {
    ctx.route
        .eligible()
        .iter()
        .copied()
        .filter(|i| !ctx.exclude.contains(i))
        .min_by_key(|&i| ctx.route.endpoints[i].state.cooldown_remaining(ctx.now))
        .map(|index| Choice {
            index,
            reason: Reason::LastResort,
        })
}
