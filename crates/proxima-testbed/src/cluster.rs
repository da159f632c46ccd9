//! The emulated cluster: every node runs the real Proxima data plane on its own
//! loopback address, every instance is a real HTTP server, and the network between
//! them is emulated in user space.
//!
//! Node `i` (0-based) of run block `b` lives on `127.b.1.(i+1)`; the first run uses
//! `127.0.1.N`. On it run, in process and unchanged:
//!
//! * a [`Router`] for that node, fed by **file discovery** (`FileWatcher`) from a
//!   topology file per node that the testbed writes (and rewrites when instances join,
//!   leave or fail);
//!   with [`DiscoveryMode::Kube`] (`--kube`), by `proxima_k8s` discovery watching a
//!   real API server instead, where the testbed publishes Nodes, Services and
//!   EndpointSlices ([`crate::k8s`]); nodes then live on `10.251.b.N`;
//! * the **proxy** (`proxima_proxy::serve`) and its background prober, with
//!   `upstream_bind` set to the node's address, so that every connection it opens
//!   leaves from that address;
//! * the **admin server** with `/node/ping`, and the **peer prober** of
//!   `proxima-nodes`, also bound to the node's address, which measures the latency to
//!   every other node and carries node usage (RAP);
//! * its **instances**: `proxima_emulate::Backend`s, sharing the node's cores when the
//!   scenario gives it some.
//!
//! Every listener another node connects to (each instance, each admin port) sits behind
//! a [`SourceDelayGate`] on the node's address: a connection coming from node `j`
//! (recognised by its source address) is delayed by the one-way latency `j → i` on the
//! way in and `i → j` on the way out, from one live [`DelayMatrix`], so latency changes
//! apply at once to open connections. Clients reach their node's proxy through a
//! [`DelayLink`] with their own one-way latency.
//!
//! `blackhole` and `node-down` make packets vanish: the nftables rules of a
//! [`Firewall`] drop everything on a blackholed link and to or from a down node, so a
//! connect across them hangs (its SYN gets no answer) and open connections stall, as in
//! a real partition. That needs the testbed's own network namespace
//! ([`crate::netns`]); the gates also hold their data while a link is down.
//!
//! Node usage (for RAP) is emulated: every `usage-interval` each node's CPU usage is the
//! busy share of its cores over the last `usage-window` plus its background CPU, and
//! its RAM usage is its background RAM; the value is set on the node's
//! [`FixedUsage`] source, which the node's proxy reports to its peers in ping replies.

use std::collections::{BTreeMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use proxima_admin::{AdminState, NodeEndpoints, Readiness};
use proxima_core::coordinates::VivaldiConfig;
use proxima_core::{Router, Usage};
use proxima_discovery::FileWatcher;
use proxima_emulate::{
    Backend, BackendConfig, Cpu, DelayLink, DelayMatrix, SourceDelayGate, BLACKHOLE,
};
use proxima_nodes::{
    FixedUsage, LocalNode, NodeCoordinates, NodeGauges, PeerProber, ProberConfig, ADMIN_PORT_LABEL,
};
use proxima_proxy::{Metrics, Proxy, ProxyConfig};
use rand::rngs::SmallRng;
use rand::SeedableRng;
use serde::Serialize;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::firewall::Firewall;
use crate::scenario::{
    Action, BaseUsage, LinkChange, Scenario, ServiceProtocol, ServiceSpecDoc, StrategySpec,
};
use crate::stats::ProxyCounters;
use crate::TestbedError;

/// Resolves once `stop` says so (or its sender is gone).
pub(crate) async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// The address of node `index` in run block `block`.
pub fn node_address(block: u8, index: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, block, 1, (index + 1) as u8))
}

/// Where each node's router learns the topology from.
#[derive(Clone, Debug, Default)]
pub enum DiscoveryMode {
    /// Topology files the testbed writes; nodes on `127.K.1.N`.
    #[default]
    Files,
    /// A Kubernetes API server (Nodes, Services, EndpointSlices); nodes on `10.251.K.N`,
    /// inside a private network namespace (see [`crate::k8s`]).
    Kube(crate::k8s::KubeApi),
}

impl DiscoveryMode {
    /// The address of node `index` in run block `block`.
    pub fn node_address(&self, block: u8, index: usize) -> IpAddr {
        match self {
            DiscoveryMode::Files => node_address(block, index),
            DiscoveryMode::Kube(_) => crate::k8s::node_address(block, index),
        }
    }
}

/// One running node.
#[derive(Debug)]
pub struct NodeRuntime {
    /// Node name.
    pub name: String,
    /// The node's address in the emulated network.
    pub ip: IpAddr,
    /// Where the node's proxy listens (clients reach it through their own link).
    pub proxy: SocketAddr,
    /// The gate in front of the node's admin port (what peers probe).
    pub admin: SocketAddr,
    cpu: Option<Cpu>,
    usage: Option<Arc<FixedUsage>>,
    /// The listening sockets each proxy of this node serves on in turn.
    sockets: NodeSockets,
    proxies: Mutex<NodeProxies>,
    _admin_gate: SourceDelayGate,
}

/// The proxies a node has run.
#[derive(Debug)]
struct NodeProxies {
    /// The one serving now (`proxy-restart` replaces it).
    live: ProxyGeneration,
    /// The metrics of those before it, so that the run's counters keep what they did.
    retired: Vec<prometheus::Registry>,
}

impl NodeRuntime {
    fn proxies(&self) -> std::sync::MutexGuard<'_, NodeProxies> {
        self.proxies.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The routing table of the node's live proxy (pools, node readings).
    pub fn router(&self) -> Arc<Router> {
        self.proxies().live.router.clone()
    }

    /// The metrics of every proxy the node has run, the live one last.
    fn registries(&self) -> Vec<prometheus::Registry> {
        let proxies = self.proxies();
        let mut all = proxies.retired.clone();
        all.push(proxies.live.registry.clone());
        all
    }

    /// Puts `next` in the live proxy's place and stops the one it replaces.
    fn replace_proxy(&self, next: ProxyGeneration) {
        let mut proxies = self.proxies();
        let old = std::mem::replace(&mut proxies.live, next);
        let _ = old.stop.send(true);
        proxies.retired.push(old.registry);
    }
}

/// A node's proxy and admin listening sockets. Each proxy the node runs accepts on a
/// duplicate of them, so that a replacement takes over without a moment in which
/// clients or peers are refused, as a restarted proxy behind a kept socket would.
#[derive(Debug)]
struct NodeSockets {
    proxy: std::net::TcpListener,
    admin: std::net::TcpListener,
}

impl NodeSockets {
    /// Duplicates of both sockets for one proxy.
    fn take(&self) -> std::io::Result<(TcpListener, TcpListener)> {
        let proxy = TcpListener::from_std(self.proxy.try_clone()?)?;
        let admin = TcpListener::from_std(self.admin.try_clone()?)?;
        Ok((proxy, admin))
    }
}

/// Why a node's proxy starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Start {
    /// With the cluster, before any traffic (the run's warm-up waits for it).
    WithTheRun,
    /// To replace the node's proxy while traffic flows (`proxy-restart`).
    Replacing,
}

/// How long a peer probe may take; a replacing proxy's first round waits twice that
/// at most.
const PEER_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// One proxy of a node with what it learns: router, metrics, and the signal that stops
/// its tasks (discovery, data plane, pod prober, admin server, peer prober).
#[derive(Debug)]
struct ProxyGeneration {
    router: Arc<Router>,
    registry: prometheus::Registry,
    stop: watch::Sender<bool>,
}

/// An instance: its spec, and its backend and gate while it runs.
#[derive(Debug)]
struct InstanceRuntime {
    name: String,
    service: usize,
    node: usize,
    seed: u64,
    running: Option<(Backend, SourceDelayGate)>,
    /// Listed in discovery (ready).
    listed: bool,
}

/// What events change, shared with the tasks that finish them later.
#[derive(Debug)]
struct State {
    instances: Vec<InstanceRuntime>,
    /// Current one-way delays, `[from][to]`.
    one_way: Vec<Vec<Duration>>,
    /// Links that drop everything, `[from][to]`.
    blackholed: Vec<Vec<bool>>,
    /// Nodes that are down (unreachable).
    down: Vec<bool>,
    background: Vec<BaseUsage>,
}

/// The running cluster (see the module docs). Stop it with [`Cluster::shutdown`].
pub struct Cluster {
    scenario: Scenario,
    /// Settings of each service for this run (scenario settings + strategy).
    settings: Vec<Vec<(String, String)>>,
    /// Every node, in scenario order.
    pub nodes: Vec<NodeRuntime>,
    delays: Arc<DelayMatrix>,
    state: Arc<Mutex<State>>,
    dir: PathBuf,
    /// Set in `--kube` mode: writes the Kubernetes objects.
    publisher: Option<crate::k8s::Publisher>,
    clients: Vec<DelayLink>,
    /// The run's address block (names its nftables table).
    block: u8,
    /// Drops the packets of blackholed links and down nodes (made at start when the
    /// scenario has such events, else when the first one comes).
    firewall: Mutex<Option<Firewall>>,
    stop: watch::Sender<bool>,
    tasks: Mutex<JoinSet<()>>,
    /// The `busy-host` event's spinning threads.
    hog: CpuHog,
}

/// Threads that keep CPUs busy (`busy-host`): each spins until told to stop, yielding
/// now and then so the kernel's scheduler shares the core as it would with any busy
/// process.
#[derive(Debug, Default)]
pub struct CpuHog {
    running: Mutex<
        Vec<(
            Arc<std::sync::atomic::AtomicBool>,
            std::thread::JoinHandle<()>,
        )>,
    >,
}

impl CpuHog {
    /// Keep exactly `cores` threads spinning (0: none).
    pub fn set(&self, cores: usize) {
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        for (stop, thread) in running.drain(..) {
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let _ = thread.join();
        }
        for k in 0..cores {
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let flag = stop.clone();
            let thread = std::thread::Builder::new()
                .name(format!("busy-host-{k}"))
                .spawn(move || {
                    let mut x = 0u64;
                    while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                        for _ in 0..10_000 {
                            x = std::hint::black_box(
                                x.wrapping_mul(6364136223846793005).wrapping_add(1),
                            );
                        }
                    }
                })
                .expect("spawn a busy-host thread");
            running.push((stop, thread));
        }
    }
}

impl Drop for CpuHog {
    fn drop(&mut self) {
        self.set(0);
    }
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("scenario", &self.scenario.name)
            .field("nodes", &self.nodes.len())
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

/// The topology file as file discovery reads it.
#[derive(Serialize)]
struct TopologyDoc {
    nodes: Vec<TopologyNode>,
    services: Vec<TopologyService>,
}

#[derive(Serialize)]
struct TopologyNode {
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    zone: Option<String>,
    labels: BTreeMap<String, String>,
    addresses: Vec<IpAddr>,
}

#[derive(Serialize)]
struct TopologyService {
    name: String,
    namespace: String,
    /// Only a `grpc` service declares its port, to say it speaks h2c (its endpoints'
    /// one unnamed port takes the service port's `appProtocol`, as in Kubernetes).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    ports: Vec<TopologyPort>,
    settings: BTreeMap<String, String>,
    endpoints: Vec<TopologyEndpoint>,
}

#[derive(Serialize)]
struct TopologyPort {
    name: String,
    port: u16,
    /// The port's `appProtocol`.
    protocol: String,
}

/// The service port of a scenario service, in the topology files and as the Service
/// object of `--kube` runs: named `http`, or `grpc` with `appProtocol: grpc` for a
/// `protocol: grpc` service.
pub(crate) fn service_port(protocol: ServiceProtocol) -> (&'static str, Option<&'static str>) {
    match protocol {
        ServiceProtocol::Http => ("http", None),
        ServiceProtocol::Grpc => ("grpc", Some("grpc")),
    }
}

impl TopologyService {
    fn new(
        spec: &ServiceSpecDoc,
        settings: &[(String, String)],
        endpoints: Vec<TopologyEndpoint>,
    ) -> Self {
        let ports = match service_port(spec.protocol) {
            (name, Some(protocol)) => vec![TopologyPort {
                name: name.to_string(),
                port: 80,
                protocol: protocol.to_string(),
            }],
            (_, None) => Vec::new(),
        };
        Self {
            name: spec.name.clone(),
            namespace: spec.namespace.clone(),
            ports,
            settings: settings.iter().cloned().collect(),
            endpoints,
        }
    }
}

#[derive(Serialize)]
struct TopologyEndpoint {
    id: String,
    address: String,
    node: String,
}

fn hash_seed(seed: u64, name: &str) -> u64 {
    // FNV-1a: stable across runs and platforms, unlike the std hasher's keys.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ seed;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

impl Cluster {
    /// Start every node and the instances that start at once, write the topology files,
    /// and open the client links. `block` chooses the address block (see the module
    /// docs), so that runs can go on side by side.
    pub async fn start(
        scenario: &Scenario,
        strategy: &StrategySpec,
        block: u8,
        dir: &Path,
    ) -> Result<Arc<Cluster>, TestbedError> {
        Self::start_with(scenario, strategy, block, dir, &DiscoveryMode::Files).await
    }

    /// [`Cluster::start`] with the given discovery source.
    pub async fn start_with(
        scenario: &Scenario,
        strategy: &StrategySpec,
        block: u8,
        dir: &Path,
        discovery: &DiscoveryMode,
    ) -> Result<Arc<Cluster>, TestbedError> {
        std::fs::create_dir_all(dir).map_err(|e| TestbedError::io(dir, e))?;
        let publisher = match discovery {
            DiscoveryMode::Files => None,
            DiscoveryMode::Kube(api) => {
                check_kube_names(scenario)?;
                Some(crate::k8s::Publisher::new(api.0.clone()))
            }
        };
        // Before anything listens: a run whose events drop packets fails here, at once,
        // when it cannot (no private network namespace, no nftables).
        let firewall = if drops_packets(scenario) {
            Some(Firewall::new(block)?)
        } else {
            None
        };
        let (stop, _) = watch::channel(false);
        let delays = DelayMatrix::new();
        let n = scenario.nodes.len();
        let ips: Vec<IpAddr> = (0..n).map(|i| discovery.node_address(block, i)).collect();
        for from in 0..n {
            for to in 0..n {
                delays.set(ips[from], ips[to], scenario.latency.one_way(from, to));
            }
        }
        let settings: Vec<Vec<(String, String)>> = scenario
            .services
            .iter()
            .map(|s| {
                let mut pairs: BTreeMap<String, String> = s.settings.iter().cloned().collect();
                pairs.insert("strategy".into(), strategy.strategy.clone());
                pairs.extend(strategy.settings.iter().cloned());
                pairs.into_iter().collect()
            })
            .collect();

        let mut instances = Vec::new();
        for (si, service) in scenario.services.iter().enumerate() {
            for inst in &service.instances {
                instances.push(InstanceRuntime {
                    name: inst.name.clone(),
                    service: si,
                    node: inst.node,
                    seed: hash_seed(scenario.seed, &inst.name),
                    running: None,
                    listed: false,
                });
            }
        }
        let state = Arc::new(Mutex::new(State {
            instances,
            one_way: scenario.latency.one_way.clone(),
            blackholed: vec![vec![false; n]; n],
            down: vec![false; n],
            background: scenario
                .nodes
                .iter()
                .map(|n| n.usage.unwrap_or(BaseUsage { cpu: 0.0, ram: 0.0 }))
                .collect(),
        }));
        let mut cluster = Cluster {
            scenario: scenario.clone(),
            settings,
            nodes: Vec::new(),
            delays,
            state,
            dir: dir.to_path_buf(),
            publisher,
            clients: Vec::new(),
            block,
            firewall: Mutex::new(firewall),
            stop,
            tasks: Mutex::new(JoinSet::new()),
            hog: CpuHog::default(),
        };

        // Instances first, so that the first topology already lists them.
        let cpus: Vec<Option<Cpu>> = scenario
            .nodes
            .iter()
            .map(|n| n.cores.map(Cpu::new))
            .collect();
        let starting: Vec<usize> = {
            let state = cluster.lock();
            (0..state.instances.len())
                .filter(|&i| cluster.instance_spec(&state.instances[i]).start)
                .collect()
        };
        for i in starting {
            cluster.start_instance(i, &ips, &cpus).await?;
        }
        // Admin gates must exist before the topology names their ports.
        let mut admin_parts = Vec::new();
        for (i, node) in scenario.nodes.iter().enumerate() {
            let listener = TcpListener::bind(SocketAddr::new(ips[i], 0))
                .await
                .map_err(|e| {
                    TestbedError::Net(format!("node {}: admin listener: {e}", node.name))
                })?;
            let inner = listener
                .local_addr()
                .map_err(|e| TestbedError::Net(e.to_string()))?;
            let gate =
                SourceDelayGate::spawn(SocketAddr::new(ips[i], 0), inner, cluster.delays.clone())
                    .await
                    .map_err(|e| {
                        TestbedError::Net(format!("node {}: admin gate: {e}", node.name))
                    })?;
            admin_parts.push((listener, gate));
        }
        let admin_ports: Vec<u16> = admin_parts.iter().map(|(_, g)| g.addr().port()).collect();
        let node_docs: Vec<TopologyNode> = scenario
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| TopologyNode {
                name: n.name.clone(),
                zone: n.zone.clone(),
                labels: BTreeMap::from([(
                    ADMIN_PORT_LABEL.to_string(),
                    admin_ports[i].to_string(),
                )]),
                addresses: vec![ips[i]],
            })
            .collect();
        match &cluster.publisher {
            None => cluster.write_topology_with(&node_docs)?,
            Some(publisher) => {
                let nodes: Vec<crate::k8s::NodeObject<'_>> = scenario
                    .nodes
                    .iter()
                    .enumerate()
                    .map(|(i, n)| crate::k8s::NodeObject {
                        name: &n.name,
                        zone: n.zone.as_deref(),
                        ip: ips[i],
                        admin_port: admin_ports[i],
                    })
                    .collect();
                publisher.nodes(&nodes).await?;
                let services: Vec<crate::k8s::ServiceObject<'_>> = scenario
                    .services
                    .iter()
                    .zip(&cluster.settings)
                    .map(|(s, settings)| crate::k8s::ServiceObject {
                        name: &s.name,
                        namespace: &s.namespace,
                        settings,
                        port: service_port(s.protocol),
                    })
                    .collect();
                publisher.services(&services).await?;
                cluster.publish_slices().await?;
            }
        }

        for (i, (node, (admin_listener, admin_gate))) in
            scenario.nodes.iter().zip(admin_parts).enumerate()
        {
            let runtime = cluster
                .start_node(
                    i,
                    node.name.clone(),
                    ips[i],
                    cpus[i].clone(),
                    admin_listener,
                    admin_gate,
                )
                .await?;
            cluster.nodes.push(runtime);
        }
        for client in &scenario.clients {
            let proxy = cluster.nodes[client.node].proxy;
            let link = DelayLink::spawn(
                "127.0.0.1:0".parse().expect("a valid address"),
                proxy,
                client.latency,
            )
            .await
            .map_err(|e| TestbedError::Net(format!("client {}: link: {e}", client.name)))?;
            cluster.clients.push(link);
        }
        let cluster = Arc::new(cluster);
        cluster.spawn_usage_samplers();
        Ok(cluster)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn instance_spec(&self, inst: &InstanceRuntime) -> &crate::scenario::InstanceSpec {
        let service = &self.scenario.services[inst.service];
        service
            .instances
            .iter()
            .find(|s| s.name == inst.name)
            .expect("every runtime instance comes from the scenario")
    }

    fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        self.tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .spawn(task);
    }

    /// Start instance `i` (backend and gate) and mark it listed.
    async fn start_instance(
        &self,
        i: usize,
        ips: &[IpAddr],
        cpus: &[Option<Cpu>],
    ) -> Result<(), TestbedError> {
        let (name, node, seed, spec) = {
            let state = self.lock();
            let inst = &state.instances[i];
            if inst.running.is_some() {
                drop(state);
                self.lock().instances[i].listed = true;
                return Ok(());
            }
            (
                inst.name.clone(),
                inst.node,
                inst.seed,
                self.instance_spec(inst).clone(),
            )
        };
        let mut config = BackendConfig::new(name.clone())
            .processing(spec.processing)
            .seed(seed)
            .websockets(true);
        config.workers = spec.workers;
        config.cpu = cpus[node].clone();
        let backend = Backend::spawn(SocketAddr::new(ips[node], 0), config)
            .await
            .map_err(|e| TestbedError::Net(format!("instance {name}: {e}")))?;
        let gate = SourceDelayGate::spawn(
            SocketAddr::new(ips[node], 0),
            backend.addr(),
            self.delays.clone(),
        )
        .await
        .map_err(|e| TestbedError::Net(format!("instance {name}: gate: {e}")))?;
        let mut state = self.lock();
        state.instances[i].running = Some((backend, gate));
        state.instances[i].listed = true;
        Ok(())
    }

    async fn start_node(
        &self,
        index: usize,
        name: String,
        ip: IpAddr,
        cpu: Option<Cpu>,
        admin_listener: TcpListener,
        admin_gate: SourceDelayGate,
    ) -> Result<NodeRuntime, TestbedError> {
        let net = |what: &str, e: &dyn std::fmt::Display| {
            TestbedError::Net(format!("node {name}: {what}: {e}"))
        };
        let listener = TcpListener::bind(SocketAddr::new(ip, 0))
            .await
            .map_err(|e| net("proxy listener", &e))?;
        let proxy = listener
            .local_addr()
            .map_err(|e| net("proxy listener", &e))?;
        let sockets = NodeSockets {
            proxy: listener.into_std().map_err(|e| net("proxy listener", &e))?,
            admin: admin_listener
                .into_std()
                .map_err(|e| net("admin listener", &e))?,
        };
        let usage = self.scenario.nodes[index]
            .usage
            .map(|_| Arc::new(FixedUsage::new(None)));
        let live = self
            .launch_proxy(index, ip, &sockets, usage.clone(), Start::WithTheRun)
            .await?;
        Ok(NodeRuntime {
            name,
            ip,
            proxy,
            admin: admin_gate.addr(),
            cpu,
            usage,
            sockets,
            proxies: Mutex::new(NodeProxies {
                live,
                retired: Vec::new(),
            }),
            _admin_gate: admin_gate,
        })
    }

    /// Start a proxy for node `index` on its sockets: discovery, data plane, pod
    /// prober, admin server and peer prober, all new.
    async fn launch_proxy(
        &self,
        index: usize,
        ip: IpAddr,
        sockets: &NodeSockets,
        usage: Option<Arc<FixedUsage>>,
        start: Start,
    ) -> Result<ProxyGeneration, TestbedError> {
        let name = self.scenario.nodes[index].name.clone();
        let net = |what: &str, e: &dyn std::fmt::Display| {
            TestbedError::Net(format!("node {name}: {what}: {e}"))
        };
        let (stop_sender, _) = watch::channel(false);
        // Every task of this proxy stops with the run or when a new proxy replaces it.
        let stop = || {
            let (run, own) = (self.stop.subscribe(), stop_sender.subscribe());
            async move {
                tokio::select! {
                    () = stopped(run) => {}
                    () = stopped(own) => {}
                }
            }
        };
        let (listener, admin_listener) = sockets.take().map_err(|e| net("sockets", &e))?;
        let router = Arc::new(Router::new(Some(name.clone())));
        match &self.publisher {
            None => {
                let path = self.topology_path(index);
                let (watcher, _) = FileWatcher::open(&path, router.clone())
                    .map_err(|e| TestbedError::Invalid(format!("node {name}: topology: {e}")))?;
                let watcher = watcher.with_interval(self.scenario.testbed.discovery_interval);
                self.spawn(watcher.run(|| {}, stop()));
            }
            Some(publisher) => {
                // The node's own watch of the API server, as `proxima --kube` runs it.
                let config = proxima_k8s::K8sConfig {
                    instance: Some(name.clone()),
                    ..proxima_k8s::K8sConfig::default()
                };
                let (client, router, stop) = (publisher.client(), router.clone(), stop());
                let node = name.clone();
                self.spawn(async move {
                    if let Err(error) = proxima_k8s::run(client, router, config, || {}, stop).await
                    {
                        tracing::warn!(%error, node, "testbed kubernetes discovery stopped");
                    }
                });
            }
        }

        let registry = prometheus::Registry::new();
        let metrics = Arc::new(Metrics::new(&registry).map_err(|e| net("metrics", &e))?);
        let config = ProxyConfig {
            upstream_bind: Some(ip),
            shutdown_grace: Duration::from_secs(1),
            // Every client's link reaches the proxy from 127.0.0.1, yet stands for
            // devices of their own: their WebSockets are not one client's.
            max_tunnels_per_client: usize::MAX,
            ..ProxyConfig::default()
        };
        let proxy = Proxy::new(router.clone(), metrics, config);

        let source = usage
            .clone()
            .map(|u| u as Arc<dyn proxima_nodes::UsageSource>);
        let mut local = LocalNode::new(Some(name.clone()), source);
        if self.scenario.testbed.peer_coordinates {
            local = local.with_coordinates(Arc::new(NodeCoordinates::new(
                Some(name.clone()),
                VivaldiConfig::default(),
                router.environment().max_age,
                hash_seed(self.scenario.seed, &name),
            )));
        }
        let local = Arc::new(local);
        let readiness = Readiness::new();
        readiness.mark_synced();
        let admin = Arc::new(AdminState {
            router: router.clone(),
            registry: registry.clone(),
            readiness,
        });
        let endpoints: Arc<dyn NodeEndpoints> = local.clone();
        let admin_stop = stop();
        self.spawn(async move {
            if let Err(error) =
                proxima_admin::serve_with_node(admin, Some(endpoints), admin_listener, admin_stop)
                    .await
            {
                tracing::warn!(%error, "testbed admin server stopped");
            }
        });
        let gauges = Arc::new(NodeGauges::register(&registry).map_err(|e| net("node gauges", &e))?);
        let prober_config = ProberConfig {
            interval: self.scenario.testbed.peer_probe_interval,
            timeout: PEER_PROBE_TIMEOUT,
            bind: Some(ip),
            share_bytes: self.scenario.testbed.peer_share_bytes,
            max_peers_per_round: self.scenario.testbed.peer_sample,
            ..ProberConfig::default()
        };
        let rng = SmallRng::seed_from_u64(hash_seed(self.scenario.seed, &name));
        let mut prober =
            PeerProber::new(router.clone(), prober_config, gauges, rng).with_local(local);
        if start == Start::Replacing {
            // As `proxima run` starts.
            prober.first_round().await;
        }
        self.spawn(prober.run(stop()));

        let serving = proxy.clone();
        let serve_stop = stop();
        self.spawn(async move {
            if let Err(error) = proxima_proxy::serve(serving, listener, serve_stop).await {
                tracing::warn!(%error, "testbed proxy stopped");
            }
        });
        self.spawn(proxima_proxy::run_prober(proxy, stop()));
        Ok(ProxyGeneration {
            router,
            registry,
            stop: stop_sender,
        })
    }

    /// `proxy-restart`: a new proxy takes over node `index`'s sockets, then the old one
    /// stops (its connections drain within its shutdown grace).
    async fn restart_proxy(&self, index: usize) -> Result<(), TestbedError> {
        let node = &self.nodes[index];
        let next = self
            .launch_proxy(
                index,
                node.ip,
                &node.sockets,
                node.usage.clone(),
                Start::Replacing,
            )
            .await?;
        node.replace_proxy(next);
        Ok(())
    }

    fn topology_path(&self, node: usize) -> PathBuf {
        self.dir
            .join(format!("{}.yaml", self.scenario.nodes[node].name))
    }

    fn node_docs(&self) -> Vec<TopologyNode> {
        self.nodes
            .iter()
            .zip(&self.scenario.nodes)
            .map(|(rt, spec)| TopologyNode {
                name: rt.name.clone(),
                zone: spec.zone.clone(),
                labels: BTreeMap::from([(
                    ADMIN_PORT_LABEL.to_string(),
                    rt.admin.port().to_string(),
                )]),
                addresses: vec![rt.ip],
            })
            .collect()
    }

    /// Publish the current topology: the nodes' files, or the EndpointSlices.
    async fn publish(&self) -> Result<(), TestbedError> {
        match &self.publisher {
            None => self.write_topology(),
            Some(_) => self.publish_slices().await,
        }
    }

    /// `--kube`: one EndpointSlice per listed, running instance.
    async fn publish_slices(&self) -> Result<(), TestbedError> {
        let Some(publisher) = &self.publisher else {
            return Ok(());
        };
        let wanted = {
            let state = self.lock();
            state
                .instances
                .iter()
                .enumerate()
                .filter(|(_, i)| i.listed)
                .filter_map(|(index, i)| {
                    let (_, gate) = i.running.as_ref()?;
                    let service = &self.scenario.services[i.service];
                    let node = &self.scenario.nodes[i.node];
                    Some(crate::k8s::SliceObject {
                        name: format!("{}-i{index}", service.name),
                        namespace: service.namespace.clone(),
                        service: service.name.clone(),
                        instance: i.name.clone(),
                        addr: gate.addr(),
                        node: node.name.clone(),
                        zone: node.zone.clone(),
                        port_name: service_port(service.protocol).0.to_string(),
                    })
                })
                .collect()
        };
        publisher.slices(wanted).await
    }

    /// Write the current topology to every node's file (atomically: write, then rename).
    fn write_topology(&self) -> Result<(), TestbedError> {
        let docs = self.node_docs();
        self.write_topology_with(&docs)
    }

    fn write_topology_with(&self, nodes: &[TopologyNode]) -> Result<(), TestbedError> {
        let services = {
            let state = self.lock();
            self.scenario
                .services
                .iter()
                .enumerate()
                .map(|(si, s)| {
                    let endpoints = state
                        .instances
                        .iter()
                        .filter(|i| i.service == si && i.listed)
                        .filter_map(|i| {
                            let (_, gate) = i.running.as_ref()?;
                            Some(TopologyEndpoint {
                                id: i.name.clone(),
                                address: gate.addr().to_string(),
                                node: self.scenario.nodes[i.node].name.clone(),
                            })
                        })
                        .collect();
                    TopologyService::new(s, &self.settings[si], endpoints)
                })
                .collect()
        };
        let doc = TopologyDoc {
            nodes: nodes
                .iter()
                .map(|n| TopologyNode {
                    name: n.name.clone(),
                    zone: n.zone.clone(),
                    labels: n.labels.clone(),
                    addresses: n.addresses.clone(),
                })
                .collect(),
            services,
        };
        let text =
            serde_saphyr::to_string(&doc).map_err(|e| TestbedError::Invalid(e.to_string()))?;
        let text = format!(
            "# Written by proxima-testbed for scenario {}.\n{text}",
            self.scenario.name
        );
        for node in 0..self.scenario.nodes.len() {
            let path = self.topology_path(node);
            let tmp = path.with_extension("yaml.tmp");
            std::fs::write(&tmp, &text).map_err(|e| TestbedError::io(&tmp, e))?;
            std::fs::rename(&tmp, &path).map_err(|e| TestbedError::io(&path, e))?;
        }
        Ok(())
    }

    /// Every node's usage, recomputed every `usage-interval` (see the module docs).
    fn spawn_usage_samplers(self: &Arc<Self>) {
        for (index, node) in self.nodes.iter().enumerate() {
            let Some(usage) = node.usage.clone() else {
                continue;
            };
            let cpu = node.cpu.clone();
            let state = self.state.clone();
            let interval = self.scenario.testbed.usage_interval;
            let window = self.scenario.testbed.usage_window;
            let stop = self.stop.subscribe();
            self.spawn(async move {
                let mut history: VecDeque<(Instant, Duration)> = VecDeque::new();
                let mut tick = tokio::time::interval(interval);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let stopped = stopped(stop);
                tokio::pin!(stopped);
                loop {
                    tokio::select! {
                        () = &mut stopped => return,
                        _ = tick.tick() => {}
                    }
                    let now = Instant::now();
                    let background =
                        state.lock().unwrap_or_else(|e| e.into_inner()).background[index];
                    let busy = match &cpu {
                        Some(cpu) => {
                            let total = cpu.busy_time();
                            history.push_back((now, total));
                            while history.len() > 2 && now.duration_since(history[1].0) >= window {
                                history.pop_front();
                            }
                            let (then, before) = history[0];
                            let span = now.duration_since(then).as_secs_f64();
                            if span > 0.0 {
                                (total - before).as_secs_f64() / (span * cpu.cores() as f64)
                            } else {
                                cpu.in_use() as f64 / cpu.cores() as f64
                            }
                        }
                        None => 0.0,
                    };
                    usage.set(Some(Usage {
                        cpu: background.cpu + busy,
                        ram: background.ram,
                    }));
                }
            });
        }
    }

    /// Wait until every node's proxy has an RTT to every other node (measured, or
    /// predicted by the network coordinates when it probes fewer peers a round than the
    /// cluster has: `peer-sample`) and the usage of every node that reports one, or
    /// `timeout` passes. Returns whether it did.
    pub async fn warm_up(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let reporting: Vec<&str> = self
            .scenario
            .nodes
            .iter()
            .filter(|n| n.usage.is_some())
            .map(|n| n.name.as_str())
            .collect();
        loop {
            let now = Instant::now();
            let ready = self.nodes.iter().all(|node| {
                let router = node.router();
                let env = router.environment();
                let table = router.table();
                let routed = self.scenario.services.iter().all(|s| {
                    table
                        .services
                        .keys()
                        .any(|k| k.name == s.name && k.namespace == s.namespace)
                });
                let latencies = self
                    .nodes
                    .iter()
                    .filter(|other| other.name != node.name)
                    .all(|other| env.rtt_estimate(&other.name, now).is_some());
                let usages = reporting.iter().all(|n| env.usage(n, now).is_some());
                // A proxy that has run for a while has probed every pod once (see
                // `Router::first_probes_pending`); traffic at its first millisecond
                // would measure the start-up, not the strategy.
                let probed = router.first_probes_pending(now) == 0;
                routed && latencies && usages && probed
            });
            if ready {
                return true;
            }
            if now >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The address client `index` sends to.
    pub fn client_addr(&self, index: usize) -> SocketAddr {
        self.clients[index].addr()
    }

    /// Apply one action of an event.
    pub async fn apply(self: &Arc<Self>, action: &Action) -> Result<(), TestbedError> {
        let ips: Vec<IpAddr> = self.nodes.iter().map(|n| n.ip).collect();
        match action {
            Action::Join(name) => {
                let i = self.instance_index(name)?;
                let cpus: Vec<Option<Cpu>> = self.nodes.iter().map(|n| n.cpu.clone()).collect();
                self.start_instance(i, &ips, &cpus).await?;
                self.publish().await?;
            }
            Action::Leave(name) => {
                let i = self.instance_index(name)?;
                let running = {
                    let mut state = self.lock();
                    state.instances[i].listed = false;
                    state.instances[i].running.take()
                };
                // Unlisted first; the instance keeps serving for `drain`, long enough for
                // every node's discovery to notice and for requests in flight to finish.
                self.publish().await?;
                if let Some((backend, gate)) = running {
                    let drain = self.scenario.testbed.drain;
                    self.spawn(async move {
                        tokio::time::sleep(drain).await;
                        backend.shutdown().await;
                        drop(gate);
                    });
                }
            }
            Action::Fail {
                instance,
                remove_after,
            } => {
                let i = self.instance_index(instance)?;
                if let Some((backend, gate)) = self.lock().instances[i].running.as_ref() {
                    // A dead pod: nothing answers, connections are refused.
                    backend.abort();
                    gate.close();
                }
                let cluster = self.clone();
                let after = *remove_after;
                self.spawn(async move {
                    tokio::time::sleep(after).await;
                    {
                        let mut state = cluster.lock();
                        state.instances[i].listed = false;
                        state.instances[i].running = None;
                    }
                    if let Err(error) = cluster.publish().await {
                        tracing::warn!(%error, "cannot publish the topology");
                    }
                });
            }
            Action::Overload {
                instance,
                add,
                processing,
            } => {
                let i = self.instance_index(instance)?;
                let state = self.lock();
                if let Some((backend, _)) = state.instances[i].running.as_ref() {
                    backend.set_delay(backend.delay() + *add);
                    if let Some(p) = processing {
                        backend.set_processing(*p);
                    }
                }
            }
            Action::Errors { instance, status } => {
                let i = self.instance_index(instance)?;
                if let Some((backend, _)) = self.lock().instances[i].running.as_ref() {
                    backend.set_failing(*status);
                }
            }
            Action::Link { pairs, change } => {
                let mut state = self.lock();
                for &(x, y) in pairs {
                    for (a, b) in [(x, y), (y, x)] {
                        match change {
                            LinkChange::Set(d) => state.one_way[a][b] = *d,
                            LinkChange::Add(d) => state.one_way[a][b] += *d,
                            LinkChange::Blackhole => state.blackholed[a][b] = true,
                            LinkChange::Reset => {
                                state.one_way[a][b] = self.scenario.latency.one_way(a, b);
                                state.blackholed[a][b] = false;
                            }
                        }
                        self.refresh_link(&state, &ips, a, b);
                    }
                }
                drop(state);
                self.sync_firewall(&ips)?;
            }
            Action::ResetInstance(name) => {
                let i = self.instance_index(name)?;
                let state = self.lock();
                let spec = self.instance_spec(&state.instances[i]);
                if let Some((backend, _)) = state.instances[i].running.as_ref() {
                    backend.set_delay(Duration::ZERO);
                    backend.set_processing(spec.processing);
                }
            }
            Action::NodeDown { node, remove_after } => {
                {
                    let mut state = self.lock();
                    state.down[*node] = true;
                    for other in 0..ips.len() {
                        self.refresh_link(&state, &ips, *node, other);
                        self.refresh_link(&state, &ips, other, *node);
                    }
                }
                self.sync_firewall(&ips)?;
                for (c, spec) in self.scenario.clients.iter().enumerate() {
                    if spec.node == *node {
                        self.clients[c].set_delay(BLACKHOLE);
                    }
                }
                if let Some(after) = *remove_after {
                    // The control plane notices the lost node and unlists its pods.
                    let (cluster, node) = (self.clone(), *node);
                    self.spawn(async move {
                        tokio::time::sleep(after).await;
                        {
                            let mut state = cluster.lock();
                            if !state.down[node] {
                                return;
                            }
                            for inst in state.instances.iter_mut().filter(|i| i.node == node) {
                                inst.listed = false;
                            }
                        }
                        if let Err(error) = cluster.publish().await {
                            tracing::warn!(%error, "cannot publish the topology");
                        }
                    });
                }
            }
            Action::NodeUp(node) => {
                {
                    let mut state = self.lock();
                    state.down[*node] = false;
                    for other in 0..ips.len() {
                        self.refresh_link(&state, &ips, *node, other);
                        self.refresh_link(&state, &ips, other, *node);
                    }
                    for inst in state.instances.iter_mut().filter(|i| i.node == *node) {
                        if inst.running.is_some() {
                            inst.listed = true;
                        }
                    }
                }
                self.sync_firewall(&ips)?;
                for (c, spec) in self.scenario.clients.iter().enumerate() {
                    if spec.node == *node {
                        self.clients[c].set_delay(spec.latency);
                    }
                }
                self.publish().await?;
            }
            Action::ProxyRestart(node) => self.restart_proxy(*node).await?,
            Action::BusyHost { cores } => self.hog.set(*cores),
            Action::Usage { node, cpu, ram } => {
                let mut state = self.lock();
                let bg = &mut state.background[*node];
                if let Some(c) = cpu {
                    bg.cpu = *c;
                }
                if let Some(r) = ram {
                    bg.ram = *r;
                }
            }
        }
        Ok(())
    }

    /// Set the live delay `a → b` from the state: its value, unless the link is
    /// blackholed or either end is down.
    fn refresh_link(&self, state: &State, ips: &[IpAddr], a: usize, b: usize) {
        if a == b {
            return;
        }
        let delay = if state.blackholed[a][b] || state.down[a] || state.down[b] {
            BLACKHOLE
        } else {
            state.one_way[a][b]
        };
        self.delays.set(ips[a], ips[b], delay);
    }

    /// Make the nftables rules drop exactly what the state says is unreachable: every
    /// blackholed link (each direction on its own) and every node that is down. The
    /// gates hold their data as well ([`Cluster::refresh_link`]), so that what a gate
    /// had already accepted does not cross either.
    ///
    /// `nft` runs outside the state's lock (other tasks take it often), under the
    /// firewall's own, which also keeps the rule sets in the order of the changes.
    fn sync_firewall(&self, ips: &[IpAddr]) -> Result<(), TestbedError> {
        let mut firewall = self.firewall.lock().unwrap_or_else(|e| e.into_inner());
        let (links, down) = {
            let state = self.lock();
            let n = ips.len();
            let links: Vec<(IpAddr, IpAddr)> = (0..n)
                .flat_map(|a| (0..n).map(move |b| (a, b)))
                .filter(|&(a, b)| a != b && state.blackholed[a][b])
                .map(|(a, b)| (ips[a], ips[b]))
                .collect();
            let down: Vec<IpAddr> = (0..n).filter(|&i| state.down[i]).map(|i| ips[i]).collect();
            (links, down)
        };
        if firewall.is_none() {
            if links.is_empty() && down.is_empty() {
                return Ok(());
            }
            *firewall = Some(Firewall::new(self.block)?);
        }
        firewall
            .as_ref()
            .expect("made just above")
            .sync(&links, &down)
    }

    fn instance_index(&self, name: &str) -> Result<usize, TestbedError> {
        self.lock()
            .instances
            .iter()
            .position(|i| i.name == name)
            .ok_or_else(|| TestbedError::Invalid(format!("no instance {name:?}")))
    }

    /// The best response time at `percentile` any router could give client `index`'s
    /// requests now: over its service's instances that are listed, alive, not failing
    /// and reachable from the client's node, the client link's round trip, the nodes'
    /// round trip and the instance's processing time at that percentile (with any
    /// overload). So an instance that can meet the service's SLO at its percentile makes
    /// the request reachable; one that meets it only on a good draw does not. `None`
    /// when no instance can answer at all. Host lag and queueing are left out: what no
    /// router could foresee or avoid. The share of the reachable requests that met the
    /// SLO is the report's "of reach" (issue 30).
    pub fn best_response(&self, index: usize, percentile: f64) -> Option<Duration> {
        let client = &self.scenario.clients[index];
        let from = client.node;
        let state = self.lock();
        if state.down[from] {
            return None;
        }
        state
            .instances
            .iter()
            .filter(|inst| inst.service == client.service && inst.listed)
            .filter_map(|inst| {
                let (backend, _) = inst.running.as_ref()?;
                let to = inst.node;
                let unreachable = state.down[to]
                    || (from != to && (state.blackholed[from][to] || state.blackholed[to][from]));
                if unreachable || backend.aborted() || backend.failing().is_some() {
                    return None;
                }
                let network = if from == to {
                    Duration::ZERO
                } else {
                    state.one_way[from][to] + state.one_way[to][from]
                };
                let processing = backend.processing().quantile(percentile);
                Some(client.latency * 2 + network + backend.delay() + processing)
            })
            .min()
    }

    /// The one-way delay from node `from` to node `to` right now.
    pub fn one_way(&self, from: usize, to: usize) -> Duration {
        self.lock().one_way[from][to]
    }

    /// The proxies' failed upstream attempts and pool changes so far, summed over the
    /// nodes (see [`ProxyCounters`]).
    pub fn proxy_counters(&self) -> ProxyCounters {
        let families: Vec<_> = self
            .nodes
            .iter()
            .flat_map(|n| n.registries())
            .flat_map(|r| r.gather())
            .collect();
        // Every node's series of `name`, and one's count.
        let series = |name: &'static str| {
            families
                .iter()
                .filter(move |f| f.get_name() == name)
                .flat_map(|f| f.get_metric())
        };
        let count = |m: &prometheus::proto::Metric| m.get_counter().get_value() as u64;
        // The sum over every node of `name`'s series whose `label` is `value`.
        let sum = |name: &'static str, label: &str, value: &str| -> u64 {
            series(name)
                .filter(|m| {
                    m.get_label()
                        .iter()
                        .any(|l| l.get_name() == label && l.get_value() == value)
                })
                .map(count)
                .sum()
        };
        let errors = |kind: &str| sum("proxima_upstream_errors_total", "kind", kind);
        let changes = |change: &str| sum("proxima_pool_changes_total", "change", change);
        let probes = series("proxima_probes_total").map(count).sum();
        ProxyCounters {
            connect_failures: errors("connect"),
            timeouts: errors("timeout"),
            resets: errors("reset"),
            protocol_errors: errors("protocol"),
            evictions: changes("evicted"),
            readmissions: changes("readmitted"),
            probes,
        }
    }

    /// Requests each running instance received (client traffic and probes alike).
    pub fn backend_hits(&self) -> BTreeMap<String, u64> {
        self.lock()
            .instances
            .iter()
            .filter_map(|i| Some((i.name.clone(), i.running.as_ref()?.0.hits())))
            .collect()
    }

    /// Stop every node and instance and remove the topology files.
    pub async fn shutdown(&self) {
        if let Some(publisher) = &self.publisher {
            // Before the watchers stop, so that the next run's nodes start clean.
            if let Err(error) = publisher.clean().await {
                tracing::warn!(%error, "cannot delete the run's Kubernetes objects");
            }
        }
        let _ = self.stop.send(true);
        self.hog.set(0);
        let mut tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|e| e.into_inner()));
        let drained = async { while tasks.join_next().await.is_some() {} };
        if tokio::time::timeout(Duration::from_secs(5), drained)
            .await
            .is_err()
        {
            tasks.abort_all();
        }
        let running: Vec<(Backend, SourceDelayGate)> = self
            .lock()
            .instances
            .iter_mut()
            .filter_map(|i| i.running.take())
            .collect();
        for (backend, gate) in running {
            backend.abort();
            drop(gate);
        }
        // Deletes the run's nftables table.
        drop(
            self.firewall
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take(),
        );
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether any event of `scenario` drops packets (`blackhole`, `node-down`), which
/// needs the firewall (and so the testbed's own network namespace).
pub fn drops_packets(scenario: &Scenario) -> bool {
    scenario.events.iter().flat_map(|e| &e.actions).any(|a| {
        matches!(
            a,
            Action::NodeDown { .. }
                | Action::Link {
                    change: LinkChange::Blackhole,
                    ..
                }
        )
    })
}

/// `--kube`: node, service and namespace names become Kubernetes object names, and
/// each node's router knows itself by its Node's name, so they must be valid as they are.
fn check_kube_names(scenario: &Scenario) -> Result<(), TestbedError> {
    let names = scenario
        .nodes
        .iter()
        .map(|n| ("node", &n.name))
        .chain(scenario.services.iter().map(|s| ("service", &s.name)))
        .chain(
            scenario
                .services
                .iter()
                .map(|s| ("namespace", &s.namespace)),
        );
    for (what, name) in names {
        if !proxima_core::is_dns_label(name) {
            return Err(TestbedError::Invalid(format!(
                "--kube: {what} name {name:?} is not a valid Kubernetes name \
                 (lowercase letters, digits and '-', at most 63)"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proxima_core::{PortProtocol, ServiceKey, Update};

    fn service(name: &str, protocol: ServiceProtocol) -> ServiceSpecDoc {
        ServiceSpecDoc {
            name: name.into(),
            namespace: "default".into(),
            settings: Vec::new(),
            slo: Duration::from_millis(100),
            protocol,
            instances: Vec::new(),
        }
    }

    /// A `grpc` service's port says `grpc` in the topology file, and the proxy's route
    /// then speaks h2c to its endpoints (given as `address: ip:port`); an `http`
    /// service's route speaks HTTP/1.1.
    #[test]
    fn a_grpc_service_is_routed_over_h2c() {
        let endpoint = |id: &str| TopologyEndpoint {
            id: id.into(),
            address: "127.0.1.1:9000".into(),
            node: "a".into(),
        };
        let doc = TopologyDoc {
            nodes: Vec::new(),
            services: vec![
                TopologyService::new(
                    &service("rpc", ServiceProtocol::Grpc),
                    &[],
                    vec![endpoint("r")],
                ),
                TopologyService::new(
                    &service("api", ServiceProtocol::Http),
                    &[],
                    vec![endpoint("h")],
                ),
            ],
        };
        let text = serde_saphyr::to_string(&doc).unwrap();
        assert!(text.contains("protocol: grpc"), "{text}");
        let topology = proxima_discovery::parse(&text).unwrap();
        let router = Router::new(None);
        router.apply([Update::from(topology)], Instant::now());
        let table = router.table();
        let protocol = |name: &str| {
            let route = &table.services[&ServiceKey::new("default", name)];
            let slot = (!route.spec.ports.is_empty()).then_some(0);
            route.addr(slot, 0).map(|target| target.protocol)
        };
        assert_eq!(protocol("rpc"), Some(PortProtocol::H2c));
        assert_eq!(protocol("api"), Some(PortProtocol::Http1));
    }
}
