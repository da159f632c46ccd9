//! The discovery runtime: kube-runtime watchers feeding the [`Index`] and the router.
//!
//! One watcher per [`Stream`] (Services and EndpointSlices per namespace, or
//! cluster-wide; Nodes), each with a jittered backoff of about a second at most: when the
//! API server goes away the watchers retry (0.2 s doubling to 0.7 s, plus 0–100% jitter,
//! see [`watch_backoff`]), resume from their
//! resourceVersion when it comes back, and re-list when it has expired (410 Gone). The
//! streams are merged; whatever is ready is drained into one batch so a burst of events
//! becomes one router update.
//!
//! Connectivity ([`ApiStatus`]) goes down on a watcher error that did not come from the
//! API server itself (refused, reset, timed out) and up on any event; while it is down a
//! probe asks for `/version` every second, because a resumed watch that has nothing to
//! report sends nothing. Transitions are logged once each way.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::stream::{self, BoxStream};
use futures_util::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::PostParams;
use kube::runtime::utils::ResetTimerBackoff;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};
use proxima_core::Router;
use tokio::sync::mpsc;
use tracing::{debug, info, info_span, warn, Span};

use crate::config::{Error, K8sConfig};
use crate::convert::SERVICE_NAME_LABEL;
use crate::index::{Index, Kind, SettingProblem, Stream, Watched};

/// `reason` of the Kubernetes Events published for invalid annotations.
pub const EVENT_REASON: &str = "InvalidAnnotation";
const EVENT_CONTROLLER: &str = "proxima";
/// At most this many watch events are applied to the router as one batch.
const MAX_BATCH: usize = 1024;
const PROBE_INTERVAL_DOWN: Duration = Duration::from_secs(1);
const PROBE_INTERVAL_UP: Duration = Duration::from_secs(30);
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Discovery's view of the API server, shared with the admin server for metrics and
/// readiness. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct ApiStatus(Arc<StatusInner>);

#[derive(Debug, Default)]
struct StatusInner {
    connected: AtomicBool,
    synced: AtomicBool,
    watch_errors: AtomicU64,
}

impl ApiStatus {
    /// Whether the last contact with the API server succeeded.
    pub fn connected(&self) -> bool {
        self.0.connected.load(Ordering::Relaxed)
    }

    /// Whether the first complete list of every watched kind has reached the router.
    pub fn synced(&self) -> bool {
        self.0.synced.load(Ordering::Relaxed)
    }

    /// Watch errors seen so far (each is retried with backoff).
    pub fn watch_errors(&self) -> u64 {
        self.0.watch_errors.load(Ordering::Relaxed)
    }

    fn set_connected(&self, connected: bool, why: &dyn std::fmt::Display) {
        let was = self.0.connected.swap(connected, Ordering::Relaxed);
        match (was, connected) {
            (true, false) => warn!(error = %why, "Kubernetes API server unreachable; retrying"),
            (false, true) => info!("Kubernetes API server reachable"),
            _ => {}
        }
    }
}

/// Kubernetes discovery, ready to [`run`](KubeDiscovery::run).
pub struct KubeDiscovery {
    client: Client,
    router: Arc<Router>,
    config: K8sConfig,
    status: ApiStatus,
}

/// Run discovery until `shutdown` resolves; see [`KubeDiscovery::run`].
pub async fn run(
    client: Client,
    router: Arc<Router>,
    config: K8sConfig,
    on_synced: impl FnOnce() + Send + 'static,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), Error> {
    KubeDiscovery::new(client, router, config)
        .run(on_synced, shutdown)
        .await
}

impl KubeDiscovery {
    /// Discovery of what `config` selects, read through `client` into `router`;
    /// nothing is watched until [`run`](Self::run).
    pub fn new(client: Client, router: Arc<Router>, config: K8sConfig) -> Self {
        Self {
            client,
            router,
            config,
            status: ApiStatus::default(),
        }
    }

    /// A handle on the connectivity and sync state, valid after `run` starts and ends.
    pub fn status(&self) -> ApiStatus {
        self.status.clone()
    }

    /// Watch until `shutdown` resolves, applying changes to the router. `on_synced` is
    /// called once, after the first complete list of Services, EndpointSlices and Nodes
    /// has been applied. Watch failures are retried forever, never returned.
    pub async fn run(
        self,
        on_synced: impl FnOnce() + Send + 'static,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), Error> {
        let KubeDiscovery {
            client,
            router,
            config,
            status,
        } = self;
        let mut index = Index::new(config.index_config());
        let mut events = stream::select_all(watch_streams(&client, &index));
        let _probe = AbortOnDrop(tokio::spawn(probe(client.clone(), status.clone())));
        let publisher = config.publish_events.then(|| {
            let (tx, rx) = mpsc::channel(256);
            let instance = config
                .instance
                .clone()
                .unwrap_or_else(|| EVENT_CONTROLLER.to_string());
            (
                tx,
                AbortOnDrop(tokio::spawn(publish_events(client.clone(), instance, rx))),
            )
        });
        let mut on_synced = Some(on_synced);
        tokio::pin!(shutdown);
        info!(
            namespaces = ?config.namespaces,
            selector = %config.selector.as_ref().map(|s| s.to_string()).unwrap_or_default(),
            "watching Services, EndpointSlices and Nodes"
        );

        loop {
            let first = tokio::select! {
                _ = &mut shutdown => break,
                item = events.next() => item,
            };
            let Some(first) = first else { break };
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match events.next().now_or_never() {
                    Some(Some(item)) => batch.push(item),
                    _ => break,
                }
            }

            let mut updates = Vec::new();
            let mut problems = Vec::new();
            for (watcher_span, item) in batch {
                let _in_watcher = watcher_span.enter();
                match item {
                    Ok((namespace, watched)) => {
                        status.set_connected(true, &"watch event");
                        let changes = index.apply(namespace.as_deref(), watched);
                        updates.extend(changes.updates);
                        problems.extend(changes.problems);
                    }
                    Err(e) => {
                        status.0.watch_errors.fetch_add(1, Ordering::Relaxed);
                        if expired(&e) {
                            // Routine after an outage: the watch re-lists.
                            info!(error = %e, "Kubernetes watch expired; re-listing");
                        } else if answered_by_api_server(&e) {
                            warn!(error = %e, "Kubernetes watch failed; retrying");
                        } else {
                            debug!(error = %e, "Kubernetes watch failed; retrying");
                            status.set_connected(false, &e);
                        }
                    }
                }
            }
            if !updates.is_empty() {
                debug!(updates = updates.len(), "applying discovery updates");
                let report = router.apply(updates, Instant::now());
                problems.extend(index.router_warnings(&report));
            }
            for problem in problems {
                log_problem(&problem);
                if let Some((tx, _)) = &publisher {
                    if tx.try_send(problem).is_err() {
                        warn!("too many Kubernetes Events pending; dropping one");
                    }
                }
            }
            if index.is_synced() {
                if let Some(on_synced) = on_synced.take() {
                    status.0.synced.store(true, Ordering::Relaxed);
                    let table = router.table();
                    info!(
                        services = table.services.len(),
                        nodes = table.nodes.len(),
                        "Kubernetes discovery synced"
                    );
                    on_synced();
                }
            }
        }
        Ok(())
    }
}

/// One item of a watch stream, with the span of the watcher it came from (see [`watch`]).
type WatchItem = (Span, Result<(Option<String>, Watched), watcher::Error>);

fn watch_streams(client: &Client, index: &Index) -> Vec<BoxStream<'static, WatchItem>> {
    fn scoped<K>(client: &Client, namespace: &Option<String>) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        match namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        }
    }
    let config = watcher::Config::default();
    index
        .streams()
        .iter()
        .map(|s| {
            let namespace = s.namespace.clone();
            match s.kind {
                Kind::Service => watch(
                    scoped(client, &namespace),
                    s,
                    config.clone(),
                    Watched::Service,
                ),
                Kind::EndpointSlice => watch(
                    scoped(client, &namespace),
                    s,
                    config.clone().labels(SERVICE_NAME_LABEL),
                    Watched::EndpointSlice,
                ),
                Kind::Node => watch(Api::all(client.clone()), s, config.clone(), Watched::Node),
            }
        })
        .collect()
}

/// The watcher of one stream, with its backoff. Each has a span (`watcher`, with the
/// stream's `kind` and `namespace`, `*` for all): the watcher's own logs and those about
/// its events carry it, so a log line says which watch it is about.
fn watch<K>(
    api: Api<K>,
    stream: &Stream,
    config: watcher::Config,
    wrap: fn(watcher::Event<K>) -> Watched,
) -> BoxStream<'static, WatchItem>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + 'static,
{
    let namespace = stream.namespace.clone();
    let span = watcher_span(stream);
    let events = watcher(api, config)
        .backoff(watch_backoff())
        .map(move |item| item.map(|event| (namespace.clone(), wrap(event))));
    InSpan {
        inner: events.boxed(),
        span,
    }
    .boxed()
}

/// The span of the watcher of `stream`.
fn watcher_span(stream: &Stream) -> Span {
    info_span!(
        "watcher",
        kind = ?stream.kind,
        namespace = stream.namespace.as_deref().unwrap_or("*"),
    )
}

/// A stream polled inside `span`, each item paired with it.
struct InSpan<S> {
    inner: S,
    span: Span,
}

impl<S: futures_util::Stream + Unpin> futures_util::Stream for InSpan<S> {
    type Item = (Span, S::Item);

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        let span = self.span.clone();
        let _in_span = span.enter();
        std::pin::Pin::new(&mut self.inner)
            .poll_next(cx)
            .map(|item| item.map(|item| (span.clone(), item)))
    }
}

/// Whether a watch error is the API server's 410 Gone for an expired resourceVersion.
fn expired(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::WatchError(status) => status.code == 410,
        watcher::Error::WatchFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status)) => status.code == 410,
        _ => false,
    }
}

/// Whether a watch error is an answer from the API server (so it is reachable).
fn answered_by_api_server(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => matches!(e, kube::Error::Api(_)),
        watcher::Error::WatchError(_) | watcher::Error::NoResourceVersion => true,
    }
}

/// Ask the API server for `/version`: every second while it is unreachable, every
/// [`PROBE_INTERVAL_UP`] while it is.
async fn probe(client: Client, status: ApiStatus) {
    let mut last_probe: Option<Instant> = None;
    loop {
        tokio::time::sleep(PROBE_INTERVAL_DOWN).await;
        let due =
            !status.connected() || last_probe.is_none_or(|t| t.elapsed() >= PROBE_INTERVAL_UP);
        if !due {
            continue;
        }
        last_probe = Some(Instant::now());
        match tokio::time::timeout(PROBE_TIMEOUT, client.apiserver_version()).await {
            Ok(Ok(_)) => status.set_connected(true, &"version probe"),
            Ok(Err(e)) => status.set_connected(false, &e),
            Err(_) => status.set_connected(false, &"version probe timed out"),
        }
    }
}

fn log_problem(problem: &SettingProblem) {
    for e in &problem.errors {
        warn!(
            service = %format!("{}/{}", problem.service.namespace, problem.service.name),
            annotation = %format!("{}{}", proxima_core::settings::ANNOTATION_PREFIX, e.key),
            value = %e.value,
            expected = %e.expected,
            "invalid annotation: {e}"
        );
    }
}

/// Publish one events.k8s.io/v1 Event per invalid annotation. The index already
/// reports each error once, so every Event here is news.
async fn publish_events(
    client: Client,
    instance: String,
    mut problems: mpsc::Receiver<SettingProblem>,
) {
    while let Some(problem) = problems.recv().await {
        let namespace = problem.service.namespace.clone();
        let api: Api<K8sEvent> = Api::namespaced(client.clone(), &namespace);
        for e in &problem.errors {
            let event = invalid_annotation_event(&problem, e, &instance);
            if let Err(err) = api.create(&PostParams::default(), &event).await {
                warn!(service = %problem.service, error = %err, "cannot publish Kubernetes Event");
            }
        }
    }
}

fn invalid_annotation_event(
    problem: &SettingProblem,
    error: &proxima_core::SettingError,
    instance: &str,
) -> K8sEvent {
    let now = k8s_openapi::jiff::Timestamp::now();
    let mut note = format!(
        "{}{}: {error}",
        proxima_core::settings::ANNOTATION_PREFIX,
        error.key
    );
    if note.len() > 1000 {
        let mut cut = 1000;
        while !note.is_char_boundary(cut) {
            cut -= 1;
        }
        note.truncate(cut);
    }
    K8sEvent {
        metadata: ObjectMeta {
            namespace: Some(problem.service.namespace.clone()),
            name: Some(format!(
                "{}.{:x}",
                problem.service.name,
                now.as_nanosecond()
            )),
            ..Default::default()
        },
        event_time: Some(MicroTime(now)),
        type_: Some("Warning".to_string()),
        reason: Some(EVENT_REASON.to_string()),
        action: Some("ParseAnnotations".to_string()),
        note: Some(note),
        regarding: Some(ObjectReference {
            api_version: Some("v1".to_string()),
            kind: Some("Service".to_string()),
            namespace: Some(problem.service.namespace.clone()),
            name: Some(problem.service.name.clone()),
            uid: problem.uid.clone(),
            ..Default::default()
        }),
        reporting_controller: Some(EVENT_CONTROLLER.to_string()),
        reporting_instance: Some(instance.chars().take(128).collect()),
        ..Default::default()
    }
}

/// Aborts a background task when discovery stops (or its future is dropped).
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Retry delays of a failed watch: exponential from 200 ms, doubling to 700 ms, each
/// plus a random 0–100% (backon's jitter), so 0.7–1.4 s apart once at the cap; reset
/// after two minutes without errors.
///
/// kube-runtime's default caps at 30 s, which after an API-server outage delays the
/// re-list (and so every change made meanwhile) by up to 30 s. A proxy routes on this
/// state, so it comes back sooner: with a 4 s cap a change made just after the API server
/// returned took up to 5.5 s to be routed; with about 1 s it is routed within about 2 s.
/// While the API server is down each node retries its watches about once a second, a
/// load an unreachable server does not feel; the jitter spreads a DaemonSet's reconnects
/// so that a returning API server is not hit by every node at once.
fn watch_backoff() -> ResetTimerBackoff<watcher::ExponentialBackoff> {
    let builder = backon::ExponentialBuilder::default()
        .with_min_delay(BACKOFF_MIN)
        .with_max_delay(BACKOFF_MAX)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times();
    ResetTimerBackoff::new(builder.into(), BACKOFF_RESET)
}

const BACKOFF_MIN: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_millis(700);
const BACKOFF_RESET: Duration = Duration::from_secs(120);

#[cfg(test)]
mod span_tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use futures_util::StreamExt;

    use super::*;

    /// Log lines, shared with the subscriber that writes them.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_watcher_logs_inside_its_span_and_tags_its_items() {
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .json()
            .with_current_span(true)
            .with_max_level(tracing::Level::DEBUG)
            .with_writer(move || writer.clone())
            .finish();
        // This test's thread only (a current-thread runtime polls everything on it).
        let _subscriber = tracing::subscriber::set_default(subscriber);
        let stream = Stream {
            kind: Kind::EndpointSlice,
            namespace: Some("shop".to_string()),
        };
        let span = watcher_span(&stream);
        // What the watcher itself logs while it is polled.
        let inner = futures_util::stream::iter([1, 2]).inspect(|n| debug!(n, "polled"));
        let tagged = InSpan {
            inner: inner.boxed(),
            span,
        };
        let items: Vec<(Span, i32)> = tagged.collect().await;
        assert_eq!(items.iter().map(|(_, n)| *n).collect::<Vec<_>>(), [1, 2]);
        // What is logged about an item, in the item's span.
        {
            let _in = items[0].0.enter();
            debug!("about the item");
        }
        debug!("outside any watcher");
        let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        let logged: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(logged.len(), 4, "{text}");
        assert!(logged[3].get("span").is_none(), "{text}");
        for line in &logged[..3] {
            assert_eq!(line["span"]["name"], "watcher", "{line}");
            assert_eq!(line["span"]["kind"], "EndpointSlice", "{line}");
            assert_eq!(line["span"]["namespace"], "shop", "{line}");
        }
    }
}

#[cfg(test)]
mod backoff_tests {
    use kube::runtime::utils::Backoff;

    use super::*;

    #[test]
    fn watch_backoff_grows_to_its_cap_with_jitter_and_resets() {
        let mut b = watch_backoff();
        let delays: Vec<Duration> = (&mut b).take(10).collect();
        assert!(delays[0] >= BACKOFF_MIN && delays[0] <= BACKOFF_MIN * 2);
        assert!(delays.iter().all(|d| *d <= BACKOFF_MAX * 2), "{delays:?}");
        assert!(delays[9] >= BACKOFF_MAX);
        b.reset();
        assert!(b.next().unwrap() <= BACKOFF_MIN * 2);
    }
}
