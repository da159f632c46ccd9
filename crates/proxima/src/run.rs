//! `proxima run`: wire the router, discovery, the proxy, its prober and the admin
//! server together, and stop them together.
//!
//! Start-up order: bind both ports (a taken port fails at once); start the admin server
//! (`/healthz` answers, `/readyz` says 503); load discovery's first full view (a bad
//! topology file is fatal here, while later bad edits are only logged; Kubernetes
//! discovery lists in the background and is waited for, however long the API server
//! takes); mark ready; start the proxy and the prober. Until then connections to the
//! proxy port wait in its backlog rather than get answers from an empty table. On
//! SIGTERM/SIGINT every task stops accepting work but the proxy, which lets requests in
//! flight finish (answering new connections once each meanwhile) for up to
//! `--shutdown-grace` (see `proxima_proxy::server`); the process exits 0. A task that fails takes the
//! others down and the process exits 1.
//!
//! Node measurements (`proxima_nodes`, flags under "Node measurements"): the admin
//! server answers peers' `GET /node/ping` from the start; with the proxy come the peer
//! prober, the sampler of this node's usage and (with metrics-server as usage source)
//! the metrics.k8s.io poller. The prober's first round runs before the proxy serves (at
//! most about `--peer-probe-timeout`), so that a proxy that joins a cluster starts with
//! its peers' latencies and pod reports. They write into the router's environment and never stop
//! the proxy: an unreachable peer or API is logged and retried.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use proxima_admin::{AdminState, Readiness};
use proxima_core::Router;
use proxima_discovery::{FileError, FileWatcher};
use proxima_proxy::{Metrics, Proxy};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::{error, info, warn};

use crate::cli::{Discovery, KubeArgs, NodesArgs, ProxyArgs, RunArgs, UsageSource};
use crate::kubernetes::{self, DiscoveryTask, FirstSync};
use crate::shutdown::Shutdown;

/// Time allowed, beyond the proxy's grace period, for the other tasks to stop.
const STOP_SLACK: Duration = Duration::from_secs(10);

/// `proxima run`: serve on the flags' addresses until a signal or a failure.
pub async fn run(args: RunArgs) -> Result<()> {
    let shutdown = Shutdown::new();
    shutdown.on_signals();
    let router = Arc::new(Router::new(args.serve.proxy.node_name.clone()));
    let ports = Ports {
        proxy: args.serve.listen,
        admin: args.serve.admin,
    };
    let discovery = DiscoveryPlan {
        discovery: &args.discovery,
        kube: &args.kube,
    };
    serve(
        ports,
        &args.serve.proxy,
        discovery,
        router,
        &shutdown,
        |_| {},
    )
    .await
}

/// Where services come from (`--discovery`), with the settings of Kubernetes discovery
/// (used only by `--discovery kube`, and by the metrics-server poller).
#[derive(Clone, Copy, Debug)]
pub struct DiscoveryPlan<'a> {
    pub discovery: &'a Discovery,
    pub kube: &'a KubeArgs,
}

/// Addresses to listen on, or (once bound) listened on.
#[derive(Clone, Copy, Debug)]
pub struct Ports {
    pub proxy: SocketAddr,
    pub admin: SocketAddr,
}

async fn bind(addr: SocketAddr, flag: &str) -> Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr} ({flag})"))
}

/// Discovery, started: the task that follows changes, and (for Kubernetes, which syncs
/// in the background) the first sync to wait for before serving.
struct RunningDiscovery {
    task: DiscoveryTask,
    first_sync: Option<FirstSync>,
}

/// Start discovery: a file is loaded here (and ready at once); Kubernetes discovery
/// lists in its task and marks `readiness` when it has synced.
async fn start_discovery(
    plan: DiscoveryPlan<'_>,
    router: Arc<Router>,
    readiness: Readiness,
    registry: &prometheus::Registry,
    shutdown: &Shutdown,
) -> Result<RunningDiscovery> {
    match plan.discovery {
        Discovery::File(path) => {
            let (watcher, _) = FileWatcher::open(path, router).map_err(describe)?;
            readiness.mark_synced();
            let task = watcher.run(move || readiness.mark_synced(), shutdown.wait());
            Ok(RunningDiscovery {
                task: Box::pin(async move {
                    task.await;
                    Ok(())
                }),
                first_sync: None,
            })
        }
        Discovery::Kube => {
            let config = plan.kube.config(router.local_node());
            let (task, first_sync) = kubernetes::start(
                plan.kube.kubeconfig(),
                config,
                router,
                readiness,
                registry,
                shutdown.wait(),
            )
            .await?;
            Ok(RunningDiscovery {
                task,
                first_sync: Some(first_sync),
            })
        }
    }
}

fn describe(error: FileError) -> anyhow::Error {
    match error.problems() {
        [] => anyhow!("cannot load the topology: {error}"),
        problems => anyhow!(
            "the topology file is invalid:\n  {}",
            problems
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n  ")
        ),
    }
}

/// Run everything until `shutdown` (see the module docs). `on_ready` is called with
/// the bound addresses once the proxy serves.
pub async fn serve(
    ports: Ports,
    args: &ProxyArgs,
    discovery: DiscoveryPlan<'_>,
    router: Arc<Router>,
    shutdown: &Shutdown,
    on_ready: impl FnOnce(Ports),
) -> Result<()> {
    let proxy_listener = bind(ports.proxy, "--listen").await?;
    let admin_listener = bind(ports.admin, "--admin").await?;
    let bound = Ports {
        proxy: proxy_listener.local_addr()?,
        admin: admin_listener.local_addr()?,
    };

    if let Some(warning) = args.limits.max_client_connections.warning() {
        warn!("{warning}");
    }
    let registry = prometheus::Registry::new();
    let metrics = Arc::new(
        Metrics::with_options(&registry, args.metrics_options())
            .context("cannot register the proxy metrics")?,
    );
    let readiness = Readiness::new();
    let nodes = NodeMeasurements::new(&args.nodes, &router, &registry)?;
    let admin = Arc::new(AdminState {
        router: router.clone(),
        // A handle on the same registry: discovery registers its metrics later.
        registry: registry.clone(),
        readiness: readiness.clone(),
    });

    let mut tasks: JoinSet<(&'static str, Result<()>)> = JoinSet::new();
    tasks.spawn({
        let stop = shutdown.wait();
        let node_endpoints: Arc<dyn proxima_admin::NodeEndpoints> = nodes.local.clone();
        let access = args.admin.access();
        async move {
            let result = proxima_admin::serve_with_access(
                admin,
                Some(node_endpoints),
                access,
                admin_listener,
                stop,
            )
            .await;
            ("admin server", result.map_err(Into::into))
        }
    });

    let running =
        match start_discovery(discovery, router.clone(), readiness, &registry, shutdown).await {
            Ok(running) => running,
            Err(e) => {
                shutdown.trigger();
                while tasks.join_next().await.is_some() {}
                return Err(e);
            }
        };
    let discovery_task = running.task;
    tasks.spawn(async move { ("discovery", discovery_task.await) });
    let grace = args.shutdown_grace;
    if let Some(first_sync) = running.first_sync {
        // Serve only once discovery has synced; stop waiting if anything ends first.
        let early = tokio::select! {
            synced = first_sync.wait() => (!synced).then_some(None),
            () = shutdown.wait() => Some(None),
            joined = tasks.join_next() => Some(joined),
        };
        if let Some(joined) = early {
            let mut failure = None;
            if let Some(joined) = joined {
                settle(joined, shutdown, &mut failure);
            }
            return supervise(tasks, shutdown, grace, failure).await;
        }
    }

    nodes
        .spawn(args, discovery, router.clone(), &mut tasks, shutdown)
        .await;
    let proxy = Proxy::new(router, metrics, args.config());
    let workers = args.worker_options();
    let serving = proxy_listener.into_std().and_then(|listener| {
        proxima_proxy::serve_on_workers(proxy.clone(), listener, workers, || shutdown.wait())
    });
    tasks.spawn(async move {
        let result = match serving {
            Ok(workers) => workers.join().await,
            Err(e) => Err(e),
        };
        ("proxy", result.map_err(Into::into))
    });
    tasks.spawn({
        let stop = shutdown.wait();
        async move {
            proxima_proxy::run_prober(proxy, stop).await;
            ("prober", Ok(()))
        }
    });
    tasks.spawn({
        let stop = shutdown.wait();
        async move {
            crate::heap::give_back_free_pages(stop).await;
            ("heap trim", Ok(()))
        }
    });
    info!(proxy = %bound.proxy, admin = %bound.admin, "proxima is ready");
    on_ready(bound);

    supervise(tasks, shutdown, grace, None).await
}

type Joined = Result<(&'static str, Result<()>), tokio::task::JoinError>;

/// Wait for every task. The first failure (or a task that ends before shutdown)
/// triggers shutdown for the others; tasks still running `grace` + slack after
/// shutdown are aborted. `failure` is one that happened before.
async fn supervise(
    mut tasks: JoinSet<(&'static str, Result<()>)>,
    shutdown: &Shutdown,
    grace: Duration,
    mut failure: Option<anyhow::Error>,
) -> Result<()> {
    let mut deadline: Option<Instant> = None;
    loop {
        let joined = match deadline {
            None => tokio::select! {
                joined = tasks.join_next() => joined,
                () = shutdown.wait() => {
                    deadline = Some(Instant::now() + grace + STOP_SLACK);
                    continue;
                }
            },
            Some(at) => match tokio::time::timeout_at(at, tasks.join_next()).await {
                Ok(joined) => joined,
                Err(_) => {
                    warn!("{} tasks did not stop in time; aborting them", tasks.len());
                    tasks.abort_all();
                    while tasks.join_next().await.is_some() {}
                    break;
                }
            },
        };
        let Some(joined) = joined else { break };
        settle(joined, shutdown, &mut failure);
    }
    match failure {
        Some(e) => Err(e),
        None => {
            info!("shut down cleanly");
            Ok(())
        }
    }
}

/// Account for a task that ended: a failure, or an end before shutdown, is logged,
/// kept (the first one) and triggers shutdown.
fn settle(joined: Joined, shutdown: &Shutdown, failure: &mut Option<anyhow::Error>) {
    let (name, result) = match joined {
        Ok(done) => done,
        Err(e) => ("a task", Err(anyhow!("it panicked: {e}"))),
    };
    match result {
        Err(e) => {
            error!("{name} failed: {e:#}");
            failure.get_or_insert(e.context(format!("{name} failed")));
            shutdown.trigger();
        }
        Ok(()) if !shutdown.is_triggered() => {
            error!("{name} stopped unexpectedly; shutting down");
            failure.get_or_insert(anyhow!("{name} stopped unexpectedly"));
            shutdown.trigger();
        }
        Ok(()) => {}
    }
}

/// This node as peers see it, and the node metrics (see the module docs).
struct NodeMeasurements {
    local: Arc<proxima_nodes::LocalNode>,
    proc_usage: Option<Arc<proxima_nodes::ProcUsage>>,
    gauges: Arc<proxima_nodes::NodeGauges>,
}

/// How often this node's usage is read from /proc (the CPU fraction is over this time).
const USAGE_SAMPLE_INTERVAL: Duration = Duration::from_secs(5);

impl NodeMeasurements {
    fn new(args: &NodesArgs, router: &Router, registry: &prometheus::Registry) -> Result<Self> {
        let gauges = Arc::new(
            proxima_nodes::NodeGauges::register(registry)
                .context("cannot register the node metrics")?,
        );
        let proc_usage = (args.usage_source != UsageSource::Off)
            .then(|| Arc::new(proxima_nodes::ProcUsage::new()));
        let source = proc_usage
            .clone()
            .map(|p| p as Arc<dyn proxima_nodes::UsageSource>);
        let mut local =
            proxima_nodes::LocalNode::new(router.local_node().map(str::to_string), source);
        if args.allow_usage_override {
            local = local.allowing_override();
        }
        let max_age = args.node_reading_max_age;
        router.update_environment(|env| env.max_age = max_age);
        let coordinates = proxima_nodes::NodeCoordinates::new(
            router.local_node().map(str::to_string),
            proxima_core::coordinates::VivaldiConfig::default(),
            max_age,
            rand::random(),
        );
        let local = local.with_coordinates(Arc::new(coordinates));
        Ok(Self {
            local: Arc::new(local),
            proc_usage,
            gauges,
        })
    }

    /// Start the measurement loops as tasks that run until shutdown.
    async fn spawn(
        self,
        proxy_args: &ProxyArgs,
        discovery: DiscoveryPlan<'_>,
        router: Arc<Router>,
        tasks: &mut JoinSet<(&'static str, Result<()>)>,
        shutdown: &Shutdown,
    ) {
        let args = &proxy_args.nodes;
        let bind = proxy_args.upstream_bind;
        let token = proxy_args.admin.access().token;
        let kube = match discovery.discovery {
            Discovery::Kube => Some(discovery.kube),
            Discovery::File(_) => None,
        };
        let metrics_server = match (args.usage_source, kube) {
            (UsageSource::Auto | UsageSource::MetricsServer, Some(kube)) => {
                match proxima_k8s::client(kube.kubeconfig()).await {
                    Ok(client) => Some(client),
                    Err(e) => {
                        warn!("node usage: cannot reach metrics.k8s.io ({e}); using peer reports");
                        None
                    }
                }
            }
            (UsageSource::MetricsServer, None) => {
                warn!("--usage-source metrics-server needs --discovery kube; using peer reports");
                None
            }
            _ => None,
        };
        let peer_usage = proxima_nodes::PeerUsage::new(
            args.usage_source != UsageSource::Off && metrics_server.is_none(),
        );
        if let Some(proc_usage) = self.proc_usage {
            let stop = shutdown.wait();
            tasks.spawn(async move {
                proc_usage.run(USAGE_SAMPLE_INTERVAL, stop).await;
                ("node usage sampler", Ok(()))
            });
        }
        if let Some(client) = metrics_server {
            let poller = proxima_nodes::MetricsServerSource::new(
                client,
                router.clone(),
                self.gauges.clone(),
                peer_usage.clone(),
            )
            .with_interval(args.usage_poll_interval);
            let stop = shutdown.wait();
            tasks.spawn(async move {
                poller.run(stop).await;
                ("metrics.k8s.io poller", Ok(()))
            });
        }
        let config = proxima_nodes::ProberConfig {
            interval: args.peer_probe_interval,
            timeout: args.peer_probe_timeout,
            max_peers_per_round: args.peer_sample,
            share_bytes: args.peer_share_bytes,
            peer_port: args.peer_port,
            bind,
            token,
            ..proxima_nodes::ProberConfig::default()
        };
        let rng = <rand::rngs::SmallRng as rand::SeedableRng>::from_entropy();
        let mut prober = proxima_nodes::PeerProber::new(router, config, self.gauges, rng)
            .with_local(self.local)
            .with_peer_usage(peer_usage);
        if args.peer_sample > 0 {
            prober.first_round().await;
        }
        let stop = shutdown.wait();
        tasks.spawn(async move {
            prober.run(stop).await;
            ("peer prober", Ok(()))
        });
    }
}
