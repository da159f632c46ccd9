//! Keeping the router in step with a topology file.
//!
//! The file is polled (every [`POLL_INTERVAL`]) and compared by a hash of its content,
//! not by modification time or inotify: that is the same for editors that write in
//! place and for those that write a new file and rename it over the old one, and for a
//! file on any kind of mount (a ConfigMap volume swaps a symlink). A changed file is read
//! a second time after a short pause and used only when both reads agree, so a file
//! caught half-written is not applied. A valid change becomes one `Update::Reset`: the
//! router keeps the measurements of every endpoint whose id stays. An invalid change is
//! logged once and the previous topology stays in force.

use std::collections::hash_map::DefaultHasher;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use proxima_core::{Router, Update};
use tracing::{info, warn};

use super::{parse_named, FileError, Topology};

/// How often the file is checked for changes.
pub const POLL_INTERVAL: Duration = Duration::from_millis(500);

/// Pause before the confirming second read of a changed file.
const SETTLE: Duration = Duration::from_millis(50);

/// What a successful (re)load put in force.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReloadSummary {
    /// Nodes in the file.
    pub nodes: usize,
    /// Services in the file.
    pub services: usize,
    /// Endpoints of all its services together.
    pub endpoints: usize,
}

/// A topology file applied to a router; [`FileWatcher::run`] follows its changes.
#[derive(Debug)]
pub struct FileWatcher {
    path: PathBuf,
    name: String,
    router: Arc<Router>,
    /// Hash of the content last acted on (applied or rejected).
    seen: u64,
    interval: Duration,
}

fn hash(bytes: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    bytes.hash(&mut h);
    h.finish()
}

impl FileWatcher {
    /// Load `path` and apply it to `router`. A file that cannot be used at start is an
    /// error (there is no previous state to fall back to).
    pub fn open(
        path: impl Into<PathBuf>,
        router: Arc<Router>,
    ) -> Result<(Self, ReloadSummary), FileError> {
        let path = path.into();
        let name = path.display().to_string();
        let bytes = std::fs::read(&path).map_err(|source| FileError::Read {
            file: name.clone(),
            source,
        })?;
        let topology = parse_named(&name, &String::from_utf8_lossy(&bytes))?;
        let mut watcher = Self {
            path,
            name,
            router,
            seen: hash(&bytes),
            interval: POLL_INTERVAL,
        };
        let summary = watcher.apply(topology);
        Ok((watcher, summary))
    }

    /// Check for changes every `interval` instead of [`POLL_INTERVAL`].
    pub fn with_interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// The topology file this watcher follows.
    pub fn path(&self) -> &Path {
        &self.path
    }

    async fn read(&self) -> Result<Vec<u8>, FileError> {
        tokio::fs::read(&self.path)
            .await
            .map_err(|source| FileError::Read {
                file: self.name.clone(),
                source,
            })
    }

    /// Check the file once: `Ok(None)` when it has not (stably) changed, the summary when
    /// a change was applied, the error when it could not be read or a new content is
    /// invalid (reported once per content; the previous topology stays).
    pub async fn poll(&mut self) -> Result<Option<ReloadSummary>, FileError> {
        let bytes = self.read().await?;
        let h = hash(&bytes);
        if h == self.seen {
            return Ok(None);
        }
        tokio::time::sleep(SETTLE).await;
        if hash(&self.read().await?) != h {
            // Still being written; look again at the next tick.
            return Ok(None);
        }
        self.seen = h;
        let topology = parse_named(&self.name, &String::from_utf8_lossy(&bytes))?;
        Ok(Some(self.apply(topology)))
    }

    fn apply(&mut self, topology: Topology) -> ReloadSummary {
        let summary = ReloadSummary {
            nodes: topology.nodes.len(),
            services: topology.service_count(),
            endpoints: topology.endpoint_count(),
        };
        let report = self.router.apply([Update::from(topology)], Instant::now());
        info!(
            file = %self.name,
            services = summary.services,
            endpoints = summary.endpoints,
            nodes = summary.nodes,
            "topology loaded: {} services, {} endpoints, {} nodes",
            summary.services,
            summary.endpoints,
            summary.nodes,
        );
        for (service, warning) in report.warnings {
            warn!(file = %self.name, %service, "service {service}: {warning}");
        }
        summary
    }

    /// Follow the file until `shutdown` resolves, calling `on_synced` after each applied
    /// change. Problems are logged, never fatal.
    pub async fn run(mut self, on_synced: impl Fn(), shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut unreadable = false;
        loop {
            tokio::select! {
                () = &mut shutdown => return,
                () = tokio::time::sleep(self.interval) => {}
            }
            match self.poll().await {
                Ok(applied) => {
                    if std::mem::take(&mut unreadable) {
                        info!(file = %self.name, "topology file is readable again");
                    }
                    if applied.is_some() {
                        on_synced();
                    }
                }
                Err(e @ FileError::Read { .. }) => {
                    if !std::mem::replace(&mut unreadable, true) {
                        warn!(file = %self.name, "{e}; keeping the previous topology");
                    }
                }
                Err(e) => {
                    warn!(
                        file = %self.name,
                        "topology file rejected, keeping the previous topology: {e}"
                    );
                }
            }
        }
    }
}

/// Load `path` into `router`, call `on_synced`, then follow the file (see the module
/// docs) until `shutdown` resolves. Fails only if the file cannot be used at start.
pub async fn watch(
    path: impl Into<PathBuf>,
    router: Arc<Router>,
    on_synced: impl Fn(),
    shutdown: impl Future<Output = ()>,
) -> Result<(), FileError> {
    let (watcher, _) = FileWatcher::open(path, router)?;
    on_synced();
    watcher.run(on_synced, shutdown).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use proxima_core::{Outcome, ServiceKey};
    use tokio::sync::oneshot;

    use super::*;

    /// A directory under the system temp dir, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> Self {
            static NEXT: AtomicUsize = AtomicUsize::new(0);
            let dir = std::env::temp_dir().join(format!(
                "proxima-discovery-{tag}-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// Replace the file the way many editors do: write a new file, rename it over.
    fn replace(path: &Path, text: &str) {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }

    fn topology(slo: &str, endpoints: &[(&str, u16)]) -> String {
        let mut text = format!(
            "services:\n  - name: dps\n    settings:\n      latency-slo: {slo}\n    endpoints:\n"
        );
        for (id, port) in endpoints {
            text.push_str(&format!(
                "      - {{ id: {id}, address: 127.0.0.1:{port} }}\n"
            ));
        }
        text
    }

    fn ids(router: &Router) -> Vec<String> {
        let key = ServiceKey::new("default", "dps");
        router
            .table()
            .services
            .get(&key)
            .map(|r| r.endpoints.iter().map(|e| e.endpoint.id.clone()).collect())
            .unwrap_or_default()
    }

    async fn until(what: &str, mut cond: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !cond() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn follows_valid_edits_and_keeps_state_through_invalid_ones() {
        let dir = TempDir::new("watch");
        let path = dir.0.join("topology.yaml");
        std::fs::write(&path, topology("80ms", &[("a", 9001), ("b", 9002)])).unwrap();

        let router = Arc::new(Router::new(None));
        let synced = Arc::new(AtomicUsize::new(0));
        let (stop, stopped) = oneshot::channel::<()>();
        let (watcher, summary) = FileWatcher::open(&path, router.clone()).unwrap();
        assert_eq!(summary.endpoints, 2);
        let task = tokio::spawn({
            let synced = synced.clone();
            watcher.with_interval(Duration::from_millis(25)).run(
                move || {
                    synced.fetch_add(1, Ordering::SeqCst);
                },
                async {
                    let _ = stopped.await;
                },
            )
        });
        assert_eq!(ids(&router), ["a", "b"]);

        // Measure `a`, so that its state can be recognised after reloads.
        let key = ServiceKey::new("default", "dps");
        let mut rng = rand::rngs::mock::StepRng::new(0, 1);
        let a_state = {
            let picked = router
                .pick(&key, None, Instant::now(), &mut rng, &["b".to_string()])
                .unwrap();
            assert_eq!(picked.endpoint().id, "a");
            router.record(
                &picked,
                Instant::now(),
                Outcome::Response {
                    latency: Duration::from_millis(3),
                },
            );
            picked.state().clone()
        };

        // Add an endpoint (file replaced by rename) and change the SLO.
        replace(
            &path,
            &topology("50ms", &[("a", 9001), ("b", 9002), ("c", 9003)]),
        );
        until("endpoint c", || ids(&router) == ["a", "b", "c"]).await;
        let route = router.table().services[&key].clone();
        assert_eq!(route.settings().latency_slo, Duration::from_millis(50));
        let a = &route.endpoints[route.index_of("a").unwrap()];
        assert!(Arc::ptr_eq(&a.state, &a_state), "a kept its state");
        assert_eq!(a.state.requests(), 1);
        until("the sync callback", || synced.load(Ordering::SeqCst) == 1).await;

        // An invalid edit (written in place) changes nothing.
        std::fs::write(&path, topology("soon", &[("a", 9001)])).unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(ids(&router), ["a", "b", "c"]);
        assert_eq!(synced.load(Ordering::SeqCst), 1);

        // Nor does a missing file.
        std::fs::remove_file(&path).unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(ids(&router), ["a", "b", "c"]);

        // The next valid content is applied: `b` and `c` go, `a` still keeps its state.
        replace(&path, &topology("50ms", &[("a", 9001)]));
        until("only a", || ids(&router) == ["a"]).await;
        let route = router.table().services[&key].clone();
        assert!(Arc::ptr_eq(&route.endpoints[0].state, &a_state));
        assert_eq!(synced.load(Ordering::SeqCst), 2);

        stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("the watcher stops on shutdown")
            .unwrap();
    }

    #[tokio::test]
    async fn poll_reports_an_invalid_change_once_and_keeps_the_topology() {
        let dir = TempDir::new("poll");
        let path = dir.0.join("topology.yaml");
        std::fs::write(&path, topology("80ms", &[("a", 9001)])).unwrap();
        let router = Arc::new(Router::new(None));
        let (mut watcher, _) = FileWatcher::open(&path, router.clone()).unwrap();
        assert_eq!(watcher.poll().await.unwrap(), None, "unchanged");

        std::fs::write(&path, topology("80", &[("a", 9001), ("b", 9002)])).unwrap();
        let err = watcher.poll().await.unwrap_err();
        let problem = &err.problems()[0];
        assert_eq!(problem.line, Some(4), "{err}");
        assert_eq!(problem.path, "services[0].settings.latency-slo");
        assert_eq!(watcher.poll().await.unwrap(), None, "reported once");
        assert_eq!(ids(&router), ["a"]);

        std::fs::write(&path, topology("80ms", &[("a", 9001), ("b", 9002)])).unwrap();
        let summary = watcher.poll().await.unwrap().expect("applied");
        assert_eq!((summary.services, summary.endpoints), (1, 2));
        assert_eq!(ids(&router), ["a", "b"]);

        std::fs::remove_file(&path).unwrap();
        assert!(matches!(watcher.poll().await, Err(FileError::Read { .. })));
        assert_eq!(ids(&router), ["a", "b"]);
    }

    #[tokio::test]
    async fn watch_fails_on_a_bad_initial_file() {
        let dir = TempDir::new("bad");
        let path = dir.0.join("topology.yaml");
        std::fs::write(
            &path,
            "services:\n  - name: dps\n    settings: { timeout: never }\n",
        )
        .unwrap();
        let router = Arc::new(Router::new(None));
        let err = watch(
            &path,
            router.clone(),
            || panic!("not synced"),
            std::future::pending(),
        )
        .await
        .unwrap_err();
        let shown = err.to_string();
        assert!(
            shown.contains("topology.yaml:3: services[0].settings.timeout"),
            "{shown}"
        );

        let missing = dir.0.join("missing.yaml");
        let err = watch(&missing, router, || {}, std::future::pending())
            .await
            .unwrap_err();
        assert!(matches!(err, FileError::Read { .. }), "{err}");
    }

    #[tokio::test]
    async fn watch_syncs_once_at_start_and_stops_on_shutdown() {
        let dir = TempDir::new("start");
        let path = dir.0.join("topology.yaml");
        std::fs::write(&path, topology("80ms", &[("a", 9001)])).unwrap();
        let router = Arc::new(Router::new(None));
        let synced = AtomicUsize::new(0);
        watch(
            &path,
            router.clone(),
            || {
                synced.fetch_add(1, Ordering::SeqCst);
            },
            tokio::time::sleep(Duration::from_millis(100)),
        )
        .await
        .unwrap();
        assert_eq!(synced.load(Ordering::SeqCst), 1);
        assert_eq!(ids(&router), ["a"]);
    }
}
