//! The discovery index: watch events in, router [`Update`]s out. Pure (no I/O, no clock).
//!
//! Built like kube-rs' reflector store and linkerd2's policy-controller index: the index
//! keeps the latest converted Services, EndpointSlices and Nodes, and after every event
//! computes what the router should now hold for the objects it touched. It remembers what
//! it last gave the router ("emitted") and returns only the difference, so a resync that
//! changes nothing produces no updates, and a Service's endpoints are always the join of
//! *all* its slices (label `kubernetes.io/service-name`), never one slice's view.
//!
//! Each watch stream (one kind, in one namespace or all) lists and then watches. A list
//! arrives as `Init`, `InitApply`..., `InitDone` (kube-runtime's `watcher::Event`); the
//! listed objects are buffered and replace that stream's objects atomically at
//! `InitDone`, so objects deleted while the watch was down disappear. Nothing reaches the
//! router until every stream has listed once; then one [`Update::Reset`] carries the
//! whole view, and a later re-list (after the API server lost our resourceVersion) is
//! again published as a `Reset` if it changed anything.
//!
//! Only opted-in Services are routed (see [`OptIn`]); the others are kept (so that
//! changing the annotation takes effect at once) but never given to the router, which
//! therefore answers 404 for them. Invalid annotations are returned as
//! [`SettingProblem`]s, each error once until the Service's annotations change.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;
use kube::runtime::watcher::Event;
use proxima_core::{ApplyReport, Endpoint, Node, ServiceKey, ServiceSpec, SettingError, Update};

use crate::convert::{self, OptIn, ServiceInfo, SliceInfo, SliceKey};

/// One watch event, by kind.
// Each event is moved once, from the watcher into the index; boxing the larger variants
// would only add an allocation per event.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum Watched {
    /// An event of a Services stream.
    Service(Event<core::Service>),
    /// An event of an EndpointSlices stream.
    EndpointSlice(Event<discovery::EndpointSlice>),
    /// An event of the Nodes stream.
    Node(Event<core::Node>),
}

/// The kinds of objects discovery watches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// `v1` Service.
    Service,
    /// `discovery.k8s.io/v1` EndpointSlice.
    EndpointSlice,
    /// `v1` Node (cluster-wide).
    Node,
}

/// A watch stream: one kind, in one namespace or (`None`) in all of them.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Stream {
    /// The kind of objects it watches.
    pub kind: Kind,
    /// The namespace it watches, or `None` for all of them.
    pub namespace: Option<String>,
}

impl Stream {
    fn covers(&self, namespace: &str) -> bool {
        self.namespace.as_deref().is_none_or(|n| n == namespace)
    }
}

/// What the index watches and routes.
#[derive(Clone, Debug, Default)]
pub struct IndexConfig {
    /// Which Services are routed.
    pub opt_in: OptIn,
    /// Namespaces to watch; empty means all.
    pub namespaces: Vec<String>,
}

impl IndexConfig {
    /// The watch streams this configuration needs: Services and EndpointSlices per
    /// namespace (or cluster-wide), and Nodes.
    pub fn streams(&self) -> Vec<Stream> {
        let scopes: Vec<Option<String>> = if self.namespaces.is_empty() {
            vec![None]
        } else {
            self.namespaces.iter().cloned().map(Some).collect()
        };
        let mut streams = Vec::new();
        for kind in [Kind::Service, Kind::EndpointSlice] {
            streams.extend(scopes.iter().map(|namespace| Stream {
                kind,
                namespace: namespace.clone(),
            }));
        }
        streams.push(Stream {
            kind: Kind::Node,
            namespace: None,
        });
        streams
    }
}

/// Invalid settings of one Service, to be logged and published as an Event.
#[derive(Clone, Debug, PartialEq)]
pub struct SettingProblem {
    /// The Service.
    pub service: ServiceKey,
    /// The Service's uid, for the Event's object reference.
    pub uid: Option<String>,
    /// Errors not reported before.
    pub errors: Vec<SettingError>,
}

/// The outcome of one event.
#[derive(Clone, Debug, Default)]
pub struct Changes {
    /// What the router must apply, in order.
    pub updates: Vec<Update>,
    /// Invalid settings found, each reported once.
    pub problems: Vec<SettingProblem>,
}

/// Lists in progress of one kind: per stream, the objects seen since its `Init`, handed
/// over whole at its `InitDone` (the buffer of kube-rs' reflector `Writer`). One per
/// kind, so the relist rule is written once for all three.
struct Relists<K, V> {
    buffers: BTreeMap<Stream, BTreeMap<K, V>>,
}

impl<K, V> Default for Relists<K, V> {
    fn default() -> Self {
        Self {
            buffers: BTreeMap::new(),
        }
    }
}

/// A watch event after the list bookkeeping: what a kind's handler acts on.
enum Step<T, K, V> {
    Apply(T),
    Delete(T),
    /// A list finished: every object it listed (that converted), replacing the
    /// stream's objects.
    Listed(BTreeMap<K, V>),
    /// `Init` or `InitApply`: buffered, nothing to do yet.
    Buffered,
}

impl<K: Ord, V> Relists<K, V> {
    /// Buffer `Init`/`InitApply` events of `stream` (objects that `convert` rejects are
    /// left out) and pass the others on. An `InitApply` without its `Init` starts the
    /// buffer; an `InitDone` without one lists nothing.
    fn step<T>(
        &mut self,
        stream: &Stream,
        event: Event<T>,
        convert: impl FnOnce(&T) -> Option<(K, V)>,
    ) -> Step<T, K, V> {
        match event {
            Event::Apply(object) => Step::Apply(object),
            Event::Delete(object) => Step::Delete(object),
            Event::Init => {
                self.buffers.insert(stream.clone(), BTreeMap::new());
                Step::Buffered
            }
            Event::InitApply(object) => {
                let buffer = self.buffers.entry(stream.clone()).or_default();
                if let Some((key, value)) = convert(&object) {
                    buffer.insert(key, value);
                }
                Step::Buffered
            }
            Event::InitDone => Step::Listed(self.buffers.remove(stream).unwrap_or_default()),
        }
    }
}

/// What the router was last given.
#[derive(Debug, Default, PartialEq)]
struct View {
    services: BTreeMap<ServiceKey, (ServiceSpec, Vec<Endpoint>)>,
    nodes: BTreeMap<String, Node>,
}

/// The discovery index (see the module docs).
pub struct Index {
    opt_in: OptIn,
    namespaces: Vec<String>,
    streams: Vec<Stream>,
    synced_streams: BTreeSet<Stream>,
    service_lists: Relists<ServiceKey, ServiceInfo>,
    slice_lists: Relists<SliceKey, SliceInfo>,
    node_lists: Relists<String, Node>,
    services: BTreeMap<ServiceKey, ServiceInfo>,
    slices: BTreeMap<SliceKey, SliceInfo>,
    slices_by_service: BTreeMap<ServiceKey, BTreeSet<SliceKey>>,
    nodes: BTreeMap<String, Node>,
    /// `None` until the first complete list of every stream.
    emitted: Option<View>,
    reported: BTreeMap<ServiceKey, Vec<SettingError>>,
    reported_by_router: BTreeMap<ServiceKey, SettingError>,
}

impl Index {
    /// An empty index for `config`'s streams; it publishes nothing until every stream
    /// has listed once.
    pub fn new(config: IndexConfig) -> Self {
        Self {
            streams: config.streams(),
            opt_in: config.opt_in,
            namespaces: config.namespaces,
            synced_streams: BTreeSet::new(),
            service_lists: Relists::default(),
            slice_lists: Relists::default(),
            node_lists: Relists::default(),
            services: BTreeMap::new(),
            slices: BTreeMap::new(),
            slices_by_service: BTreeMap::new(),
            nodes: BTreeMap::new(),
            emitted: None,
            reported: BTreeMap::new(),
            reported_by_router: BTreeMap::new(),
        }
    }

    /// The watch streams the index expects events from.
    pub fn streams(&self) -> &[Stream] {
        &self.streams
    }

    /// Whether every stream has completed its first list (and the router has the view).
    pub fn is_synced(&self) -> bool {
        self.emitted.is_some()
    }

    /// Apply one event from the stream watching `namespace` (`None`: all namespaces;
    /// always `None` for Nodes).
    pub fn apply(&mut self, namespace: Option<&str>, watched: Watched) -> Changes {
        let mut changes = Changes::default();
        match watched {
            Watched::Service(event) => self.on_service(namespace, event, &mut changes),
            Watched::EndpointSlice(event) => self.on_slice(namespace, event, &mut changes),
            Watched::Node(event) => self.on_node(event, &mut changes),
        }
        changes
    }

    /// Problems the router found when building routes (e.g. an unknown strategy), each
    /// returned once until it goes away.
    pub fn router_warnings(&mut self, report: &ApplyReport) -> Vec<SettingProblem> {
        let mut problems = Vec::new();
        for key in &report.changed {
            match report.warnings.iter().find(|(k, _)| k == key) {
                Some((_, warning)) => {
                    if self.reported_by_router.get(key) != Some(warning) {
                        self.reported_by_router.insert(key.clone(), warning.clone());
                        problems.push(SettingProblem {
                            service: key.clone(),
                            uid: self.services.get(key).and_then(|s| s.uid.clone()),
                            errors: vec![warning.clone()],
                        });
                    }
                }
                None => {
                    self.reported_by_router.remove(key);
                }
            }
        }
        problems
    }

    fn in_scope(&self, namespace: &str) -> bool {
        self.namespaces.is_empty() || self.namespaces.iter().any(|n| n == namespace)
    }

    fn on_service(
        &mut self,
        namespace: Option<&str>,
        event: Event<core::Service>,
        changes: &mut Changes,
    ) {
        let stream = stream(Kind::Service, namespace);
        let opt_in = &self.opt_in;
        let step = self.service_lists.step(&stream, event, |service| {
            convert::service_info(service, opt_in)
        });
        match step {
            Step::Apply(service) => {
                let Some((key, info)) = convert::service_info(&service, &self.opt_in) else {
                    return;
                };
                if !self.in_scope(&key.namespace) {
                    return;
                }
                self.report(&key, &info, changes);
                self.services.insert(key.clone(), info);
                self.publish_service(&key, changes);
            }
            Step::Delete(service) => {
                let Some(key) = convert::service_key(&service.metadata) else {
                    return;
                };
                self.services.remove(&key);
                self.reported.remove(&key);
                self.reported_by_router.remove(&key);
                self.publish_service(&key, changes);
            }
            Step::Buffered => {}
            Step::Listed(listed) => {
                self.services
                    .retain(|key, _| !stream.covers(&key.namespace));
                for (key, info) in listed {
                    if self.in_scope(&key.namespace) {
                        self.report(&key, &info, changes);
                        self.services.insert(key, info);
                    }
                }
                let services = &self.services;
                self.reported.retain(|key, _| services.contains_key(key));
                self.reported_by_router
                    .retain(|key, _| services.contains_key(key));
                self.listed(stream, changes);
            }
        }
    }

    fn on_slice(
        &mut self,
        namespace: Option<&str>,
        event: Event<discovery::EndpointSlice>,
        changes: &mut Changes,
    ) {
        let stream = stream(Kind::EndpointSlice, namespace);
        match self.slice_lists.step(&stream, event, convert::slice_info) {
            Step::Apply(slice) => {
                let Some(slice_key) = slice_key(&slice) else {
                    return;
                };
                if !self.in_scope(&slice_key.0) {
                    return;
                }
                // A slice whose label changed leaves its old Service.
                let mut touched: BTreeSet<ServiceKey> =
                    self.remove_slice(&slice_key).into_iter().collect();
                if let Some((slice_key, info)) = convert::slice_info(&slice) {
                    touched.insert(info.service.clone());
                    self.insert_slice(slice_key, info);
                }
                for key in touched {
                    self.publish_service(&key, changes);
                }
            }
            Step::Delete(slice) => {
                if let Some(key) = slice_key(&slice).and_then(|k| self.remove_slice(&k)) {
                    self.publish_service(&key, changes);
                }
            }
            Step::Buffered => {}
            Step::Listed(listed) => {
                let stale: Vec<SliceKey> = self
                    .slices
                    .keys()
                    .filter(|(ns, _)| stream.covers(ns))
                    .cloned()
                    .collect();
                for key in stale {
                    self.remove_slice(&key);
                }
                for (key, info) in listed {
                    if self.in_scope(&key.0) {
                        self.insert_slice(key, info);
                    }
                }
                self.listed(stream, changes);
            }
        }
    }

    fn on_node(&mut self, event: Event<core::Node>, changes: &mut Changes) {
        let stream = stream(Kind::Node, None);
        let step = self.node_lists.step(&stream, event, |node| {
            convert::node(node).map(|node| (node.name.clone(), node))
        });
        match step {
            Step::Apply(node) => {
                if let Some(node) = convert::node(&node) {
                    self.nodes.insert(node.name.clone(), node.clone());
                    if let Some(emitted) = &mut self.emitted {
                        if emitted.nodes.get(&node.name) != Some(&node) {
                            emitted.nodes.insert(node.name.clone(), node.clone());
                            changes.updates.push(Update::UpsertNode(node));
                        }
                    }
                }
            }
            Step::Delete(node) => {
                if let Some(name) = node.metadata.name {
                    self.nodes.remove(&name);
                    if let Some(emitted) = &mut self.emitted {
                        if emitted.nodes.remove(&name).is_some() {
                            changes.updates.push(Update::RemoveNode(name));
                        }
                    }
                }
            }
            Step::Buffered => {}
            Step::Listed(listed) => {
                self.nodes = listed;
                self.listed(stream, changes);
            }
        }
    }

    fn insert_slice(&mut self, key: SliceKey, info: SliceInfo) {
        self.slices_by_service
            .entry(info.service.clone())
            .or_default()
            .insert(key.clone());
        self.slices.insert(key, info);
    }

    /// Forget a slice; returns the Service it belonged to.
    fn remove_slice(&mut self, key: &SliceKey) -> Option<ServiceKey> {
        let info = self.slices.remove(key)?;
        if let Some(keys) = self.slices_by_service.get_mut(&info.service) {
            keys.remove(key);
            if keys.is_empty() {
                self.slices_by_service.remove(&info.service);
            }
        }
        Some(info.service)
    }

    /// Add the Service's errors that were not reported before to `changes.problems`, and
    /// remember all its current errors as reported.
    fn report(&mut self, key: &ServiceKey, info: &ServiceInfo, changes: &mut Changes) {
        let before = self.reported.remove(key).unwrap_or_default();
        let new: Vec<SettingError> = info
            .errors
            .iter()
            .filter(|e| !before.contains(e))
            .cloned()
            .collect();
        if !info.errors.is_empty() {
            self.reported.insert(key.clone(), info.errors.clone());
        }
        if !new.is_empty() {
            changes.problems.push(SettingProblem {
                service: key.clone(),
                uid: info.uid.clone(),
                errors: new,
            });
        }
    }

    /// What the router should hold for one Service: `None` unless it is routable.
    fn desired(&self, key: &ServiceKey) -> Option<(ServiceSpec, Vec<Endpoint>)> {
        let info = self.services.get(key).filter(|i| i.routable)?;
        let slices = self
            .slices_by_service
            .get(key)
            .into_iter()
            .flatten()
            .filter_map(|k| self.slices.get(k));
        Some((info.spec.clone(), convert::service_endpoints(info, slices)))
    }

    fn desired_view(&self) -> View {
        View {
            services: self
                .services
                .keys()
                .filter_map(|key| Some((key.clone(), self.desired(key)?)))
                .collect(),
            nodes: self.nodes.clone(),
        }
    }

    /// Bring the router's copy of one Service up to date (once synced).
    fn publish_service(&mut self, key: &ServiceKey, changes: &mut Changes) {
        let desired = self.desired(key);
        let Some(emitted) = &mut self.emitted else {
            return;
        };
        match (desired, emitted.services.get(key)) {
            (None, None) => {}
            (None, Some(_)) => {
                emitted.services.remove(key);
                changes.updates.push(Update::RemoveService(key.clone()));
            }
            (Some((spec, endpoints)), before) => {
                let (spec_changed, endpoints_changed) = match before {
                    None => (true, true),
                    Some((s, e)) => (s != &spec, e != &endpoints),
                };
                if spec_changed {
                    changes.updates.push(Update::UpsertService(spec.clone()));
                }
                if endpoints_changed {
                    changes.updates.push(Update::SetEndpoints {
                        service: key.clone(),
                        endpoints: endpoints.clone(),
                    });
                }
                emitted.services.insert(key.clone(), (spec, endpoints));
            }
        }
    }

    /// A stream finished a list: once all have, publish the whole view as a `Reset`
    /// (the first time, or when the list changed anything).
    fn listed(&mut self, stream: Stream, changes: &mut Changes) {
        self.synced_streams.insert(stream);
        if !self.streams.iter().all(|s| self.synced_streams.contains(s)) {
            return;
        }
        let view = self.desired_view();
        if self.emitted.as_ref() == Some(&view) {
            return;
        }
        changes.updates.push(Update::Reset {
            nodes: view.nodes.values().cloned().collect(),
            services: view
                .services
                .values()
                .map(|(spec, endpoints)| (spec.clone(), endpoints.clone()))
                .collect(),
        });
        self.emitted = Some(view);
    }
}

fn stream(kind: Kind, namespace: Option<&str>) -> Stream {
    Stream {
        kind,
        namespace: namespace.map(str::to_string),
    }
}

fn slice_key(slice: &discovery::EndpointSlice) -> Option<SliceKey> {
    Some((
        slice.metadata.namespace.clone()?,
        slice.metadata.name.clone()?,
    ))
}

#[cfg(test)]
#[path = "index_tests.rs"]
mod tests;
