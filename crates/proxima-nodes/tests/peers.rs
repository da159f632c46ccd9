//! The peer prober against real admin servers on distinct loopback addresses
//! (127.0.0.2, 127.0.0.3, … are loopback too, so each stands for a node), one of them
//! behind a user-space delay link of 20 ms each way.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use prometheus::{Encoder, Registry, TextEncoder};
use proxima_admin::{AdminState, Readiness};
use proxima_core::coordinates::VivaldiConfig;
use proxima_core::environment::RttSource;
use proxima_core::{
    Endpoint, Node, Router, ServiceKey, ServiceSettings, ServiceSpec, Update, Usage,
};
use proxima_emulate::DelayLink;
use proxima_nodes::{
    FixedUsage, LocalNode, NodeCoordinates, NodeGauges, PeerProber, PeerUsage, ProbeError,
    ProberConfig, ADMIN_PORT_LABEL,
};
use rand::rngs::SmallRng;
use rand::SeedableRng;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const LINK_DELAY: Duration = Duration::from_millis(20);
/// Generous: the machine running the tests may be slow and busy.
const DEADLINE: Duration = Duration::from_secs(20);

/// A proxy's admin server for one emulated node.
struct Peer {
    addr: SocketAddr,
    usage: Arc<FixedUsage>,
    local: Arc<LocalNode>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
}

impl Peer {
    async fn start(node: &str, ip: &str, usage: Option<Usage>, allow_override: bool) -> Peer {
        let usage = Arc::new(FixedUsage::new(usage));
        let mut local = LocalNode::new(Some(node.to_string()), Some(usage.clone()));
        if allow_override {
            local = local.allowing_override();
        }
        Self::serve(node, ip, usage, local).await
    }

    /// A peer that keeps network coordinates.
    async fn with_coordinates(node: &str, ip: &str) -> Peer {
        let usage = Arc::new(FixedUsage::new(None));
        let coordinates = Arc::new(NodeCoordinates::new(
            Some(node.to_string()),
            VivaldiConfig::default(),
            Duration::from_secs(60),
            node.len() as u64,
        ));
        let local = LocalNode::new(Some(node.to_string()), None).with_coordinates(coordinates);
        Self::serve(node, ip, usage, local).await
    }

    async fn serve(node: &str, ip: &str, usage: Arc<FixedUsage>, local: LocalNode) -> Peer {
        let listener = TcpListener::bind((ip.parse::<IpAddr>().unwrap(), 0))
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let local = Arc::new(local);
        let state = Arc::new(AdminState {
            router: Arc::new(Router::new(Some(node.to_string()))),
            registry: Registry::new(),
            readiness: Readiness::new(),
        });
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(proxima_admin::serve_with_node(
            state,
            Some(local.clone()),
            listener,
            async move {
                let _ = stopped.await;
            },
        ));
        Peer {
            addr,
            usage,
            local,
            stop: Some(stop),
            task,
        }
    }

    /// Stop serving; the port is closed when this returns.
    async fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        (&mut self.task).await.unwrap().unwrap();
    }
}

fn node(name: &str, addr: SocketAddr) -> Node {
    Node {
        name: name.into(),
        zone: None,
        labels: BTreeMap::from([(ADMIN_PORT_LABEL.to_string(), addr.port().to_string())]),
        addresses: vec![addr.ip()],
    }
}

/// A router on node `n1` that knows `nodes`, with one service whose pod runs on the
/// first of them.
fn router(nodes: Vec<Node>, max_age: Duration) -> Arc<Router> {
    let router = Arc::new(Router::new(Some("n1".into())));
    let spec = ServiceSpec::new(
        ServiceKey::new("default", "web"),
        vec![],
        ServiceSettings::default(),
    );
    let pod = Endpoint::new("web-1", "127.0.0.1:1".parse().unwrap()).on_node(nodes[0].name.clone());
    router.apply(
        [Update::Reset {
            nodes,
            services: vec![(spec, vec![pod])],
        }],
        Instant::now(),
    );
    router.update_environment(|env| env.max_age = max_age);
    router
}

fn prober(
    router: &Arc<Router>,
    registry: &Registry,
    config: ProberConfig,
) -> (PeerProber, Arc<NodeGauges>) {
    let gauges = Arc::new(NodeGauges::register(registry).unwrap());
    let prober = PeerProber::new(
        router.clone(),
        config,
        gauges.clone(),
        SmallRng::seed_from_u64(42),
    );
    (prober, gauges)
}

fn scrape(registry: &Registry) -> String {
    let mut out = Vec::new();
    TextEncoder::new()
        .encode(&registry.gather(), &mut out)
        .unwrap();
    String::from_utf8(out).unwrap()
}

fn gauge(text: &str, metric: &str, node: &str) -> Option<f64> {
    let prefix = format!("{metric}{{node=\"{node}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix)?.parse().ok())
}

/// `PUT path` with `body` to `addr`; the status and body of the reply.
async fn put(addr: SocketAddr, path: &str, body: &str) -> (u16, String) {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let request = hyper::Request::put(path)
        .header("host", addr.to_string())
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_and_usage_of_peers_land_in_the_environment() {
    let near = Peer::start("n2", "127.0.0.2", Some(Usage { cpu: 0.2, ram: 0.3 }), false).await;
    // n3's proxy listens on 127.0.0.13; its node address 127.0.0.3 is 20 ms away each way.
    let far = Peer::start(
        "n3",
        "127.0.0.13",
        Some(Usage { cpu: 0.7, ram: 0.8 }),
        false,
    )
    .await;
    let link = DelayLink::spawn("127.0.0.3:0".parse().unwrap(), far.addr, LINK_DELAY)
        .await
        .unwrap();
    // n4's address leads to n2's proxy: a misconfiguration, not a measurement of n4.
    let me = Arc::new(LocalNode::new(
        Some("n1".into()),
        Some(Arc::new(FixedUsage::new(Some(Usage {
            cpu: 0.05,
            ram: 0.1,
        })))),
    ));
    let router = router(
        vec![
            node("n3", link.addr()),
            node("n1", "127.0.0.1:9".parse().unwrap()),
            node("n2", near.addr),
            node("n4", near.addr),
        ],
        Duration::from_secs(60),
    );
    let registry = Registry::new();
    let (prober, gauges) = prober(&router, &registry, ProberConfig::default());
    let mut prober = prober.with_local(me);

    let start = Instant::now();
    let mut rounds = 0;
    loop {
        let report = prober.round().await;
        rounds += 1;
        let mut probed = report.probed.clone();
        probed.sort();
        assert_eq!(probed, ["n2", "n3", "n4"], "every peer but this node");
        let failed: Vec<&str> = report.failed.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(failed, ["n4"], "{:?}", report.failed);
        assert!(matches!(&report.failed[0].1, ProbeError::WrongNode(n) if n == "n2"));
        if rounds >= 5 {
            break;
        }
        assert!(start.elapsed() < DEADLINE);
    }

    let env = router.environment();
    let now = Instant::now();
    let far_rtt = env.latency("n3", now).expect("n3 measured");
    let near_rtt = env.latency("n2", now).expect("n2 measured");
    eprintln!("measured: n2 {near_rtt:?}, n3 {far_rtt:?}");
    // Each sample crosses the link twice, so none can be under 40 ms; the upper bound
    // only guards against measuring something else (e.g. the TCP handshake as well).
    assert!(far_rtt >= 2 * LINK_DELAY, "n3: {far_rtt:?}");
    assert!(
        far_rtt < 2 * LINK_DELAY + Duration::from_millis(200),
        "n3: {far_rtt:?}"
    );
    assert!(near_rtt < Duration::from_millis(20), "n2: {near_rtt:?}");
    assert!(
        env.latency("n4", now).is_none(),
        "a wrong answer is no reading"
    );
    assert!(env.latency("n1", now).is_none(), "this node is not probed");

    assert_eq!(env.usage("n2", now), Some(Usage { cpu: 0.2, ram: 0.3 }));
    assert_eq!(env.usage("n3", now), Some(Usage { cpu: 0.7, ram: 0.8 }));
    assert_eq!(
        env.usage("n1", now),
        Some(Usage {
            cpu: 0.05,
            ram: 0.1
        }),
        "own usage"
    );
    assert!(env.usage("n4", now).is_none(), "usage is not misattributed");

    let text = scrape(&registry);
    let rtt = gauge(&text, "proxima_node_rtt_seconds", "n3").expect(&text);
    assert!((rtt - far_rtt.as_secs_f64()).abs() < 1e-9, "{text}");
    assert_eq!(
        gauge(&text, "proxima_node_cpu_usage", "n3"),
        Some(0.7),
        "{text}"
    );
    assert_eq!(
        gauge(&text, "proxima_node_ram_usage", "n2"),
        Some(0.3),
        "{text}"
    );
    assert_eq!(
        gauge(&text, "proxima_peer_probe_failures_total", "n4"),
        Some(5.0),
        "{text}"
    );
    assert_eq!(gauges.failures("n3"), 0);

    // A peer's usage changes: the next round publishes it.
    near.usage.set(Some(Usage { cpu: 0.9, ram: 0.4 }));
    prober.round().await;
    let env = router.environment();
    assert_eq!(
        env.usage("n2", Instant::now()),
        Some(Usage { cpu: 0.9, ram: 0.4 })
    );
    drop(link);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_stops_answering_goes_stale() {
    let mut peer = Peer::start("n2", "127.0.0.2", Some(Usage { cpu: 0.5, ram: 0.5 }), false).await;
    let max_age = Duration::from_millis(1500);
    let router = router(vec![node("n2", peer.addr)], max_age);
    let registry = Registry::new();
    let config = ProberConfig {
        timeout: Duration::from_secs(2),
        ..ProberConfig::default()
    };
    let (mut prober, gauges) = prober(&router, &registry, config);

    let report = prober.round().await;
    assert_eq!(report.answered.len(), 1, "{:?}", report.failed);
    let answered_at = Instant::now();
    assert!(router.environment().latency("n2", answered_at).is_some());
    assert!(gauge(&scrape(&registry), "proxima_node_rtt_seconds", "n2").is_some());

    peer.stop().await;
    let report = prober.round().await;
    assert!(
        matches!(report.failed.as_slice(), [(n, ProbeError::Connect(_))] if n == "n2"),
        "{:?}",
        report.failed
    );
    assert_eq!(gauges.failures("n2"), 1);

    // The last reading stays until it is older than max_age, then it is gone.
    let deadline = Instant::now() + DEADLINE;
    loop {
        prober.round().await;
        let env = router.environment();
        if env.latency("n2", Instant::now()).is_none() {
            break;
        }
        assert!(Instant::now() < deadline, "the reading never expired");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(answered_at.elapsed() >= max_age);
    prober.round().await;
    let env = router.environment();
    assert!(
        env.usage("n2", Instant::now()).is_none(),
        "its usage expired too"
    );
    assert!(
        env.latency.is_empty() && env.usage.is_empty(),
        "expired readings are dropped"
    );
    let failures = gauges.failures("n2");
    assert!(failures >= 2, "{failures}");
    let text = scrape(&registry);
    assert!(
        gauge(&text, "proxima_node_rtt_seconds", "n2").is_none(),
        "{text}"
    );
    assert_eq!(
        gauge(&text, "proxima_peer_probe_failures_total", "n2"),
        Some(failures as f64),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rounds_probe_a_bounded_sample_of_a_large_cluster() {
    let live = Peer::start("n2", "127.0.0.2", Some(Usage { cpu: 0.1, ram: 0.1 }), false).await;
    // A port that nothing listens on, on any loopback address.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut nodes = vec![node("n2", live.addr)];
    for i in 0..499u32 {
        let ip = std::net::Ipv4Addr::new(127, 1, (i / 250) as u8, (i % 250 + 1) as u8);
        nodes.push(node(
            &format!("dead-{i}"),
            SocketAddr::new(ip.into(), closed),
        ));
    }
    let router = router(nodes, Duration::from_secs(60));
    let registry = Registry::new();
    let (mut prober, gauges) = prober(&router, &registry, ProberConfig::default());

    let mut probed_total = 0;
    let mut distinct = std::collections::HashSet::new();
    for round in 0..17 {
        let report = prober.round().await;
        assert_eq!(report.probed.len(), 32, "round {round}");
        // n2 hosts the service's pod: it is probed every round.
        assert!(report.probed.iter().any(|n| n == "n2"), "round {round}");
        assert_eq!(
            report.answered.len(),
            1,
            "round {round}: {:?}",
            &report.failed[..1]
        );
        assert!(report
            .failed
            .iter()
            .all(|(_, e)| matches!(e, ProbeError::Connect(_))));
        probed_total += report.probed.len();
        distinct.extend(report.probed);
    }
    // 17 rounds of 31 dead nodes each cover all 499 of them (least recently tried first).
    assert_eq!(distinct.len(), 500);
    let failures: u64 = (0..499)
        .map(|i| gauges.failures(&format!("dead-{i}")))
        .sum();
    assert_eq!(
        failures as usize,
        probed_total - 17,
        "one probe per chosen peer, no more"
    );
    assert!(router.environment().latency("n2", Instant::now()).is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_overrides_and_the_fallback_switch() {
    let peer = Peer::start("n2", "127.0.0.2", None, true).await;
    let locked = Peer::start("n3", "127.0.0.3", None, false).await;
    let router = router(
        vec![node("n2", peer.addr), node("n3", locked.addr)],
        Duration::from_secs(60),
    );
    let registry = Registry::new();
    let switch = PeerUsage::new(false);
    let (prober, _) = prober(&router, &registry, ProberConfig::default());
    let mut prober = prober.with_peer_usage(switch.clone());

    // No usage known yet: the reply says null and nothing is published.
    prober.round().await;
    assert!(router.environment().usage.is_empty());

    let (status, body) = put(peer.addr, "/node/usage", r#"{"cpu": 0.65, "ram": 0.35}"#).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"cpu\":0.65"), "{body}");
    assert_eq!(
        peer.local.usage().unwrap().usage,
        Usage {
            cpu: 0.65,
            ram: 0.35
        }
    );
    let (status, body) = put(locked.addr, "/node/usage", r#"{"cpu": 0.65, "ram": 0.35}"#).await;
    assert_eq!(status, 403, "{body}");
    let (status, _) = put(peer.addr, "/node/usage", r#"{"cpu": "high"}"#).await;
    assert_eq!(status, 400);

    // The switch is off (metrics-server answers): peers' reports are not published.
    prober.round().await;
    let env = router.environment();
    assert!(env.latency("n2", Instant::now()).is_some());
    assert!(env.usage("n2", Instant::now()).is_none());

    switch.set(true);
    prober.round().await;
    let env = router.environment();
    assert_eq!(
        env.usage("n2", Instant::now()),
        Some(Usage {
            cpu: 0.65,
            ram: 0.35
        })
    );
    assert!(env.usage("n3", Instant::now()).is_none());
}

/// A router on node `name` that knows `nodes`, without services.
fn router_on(name: &str, nodes: Vec<Node>) -> Arc<Router> {
    let router = Arc::new(Router::new(Some(name.into())));
    router.apply(
        [Update::Reset {
            nodes,
            services: vec![],
        }],
        Instant::now(),
    );
    router
}

fn unreachable(name: &str) -> Node {
    Node {
        name: name.into(),
        zone: None,
        labels: BTreeMap::new(),
        addresses: vec![],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinates_of_a_node_never_probed_arrive_in_a_peers_replies() {
    // n1 probes only n2; n2 and n3 probe each other. Every link delays 20 ms each way.
    let n2 = Peer::with_coordinates("n2", "127.0.0.32").await;
    let n3 = Peer::with_coordinates("n3", "127.0.0.33").await;
    let me = Peer::with_coordinates("n1", "127.0.0.31").await;
    let link = |to: SocketAddr, from: &'static str| async move {
        DelayLink::spawn(format!("{from}:0").parse().unwrap(), to, LINK_DELAY)
            .await
            .unwrap()
    };
    let (to_n2_from_n1, to_n2_from_n3, to_n3) = (
        link(n2.addr, "127.0.0.42").await,
        link(n2.addr, "127.0.0.43").await,
        link(n3.addr, "127.0.0.44").await,
    );
    let on_n1 = router_on(
        "n1",
        vec![node("n2", to_n2_from_n1.addr()), unreachable("n3")],
    );
    let on_n2 = router_on("n2", vec![node("n3", to_n3.addr())]);
    let on_n3 = router_on("n3", vec![node("n2", to_n2_from_n3.addr())]);
    let mut probers: Vec<PeerProber> = [(&on_n1, &me), (&on_n2, &n2), (&on_n3, &n3)]
        .into_iter()
        .map(|(router, peer)| {
            let (p, _) = prober(router, &Registry::new(), ProberConfig::default());
            p.with_local(peer.local.clone())
        })
        .collect();

    let start = Instant::now();
    let estimate = loop {
        assert!(
            start.elapsed() < DEADLINE,
            "no trusted estimate of n3 in time"
        );
        let reports = futures_util::future::join_all(probers.iter_mut().map(|p| p.round())).await;
        assert_eq!(reports[0].probed, ["n2"], "n1 never probes n3");
        let now = Instant::now();
        if let Some(estimate) = on_n1.environment().rtt_estimate("n3", now) {
            break estimate;
        }
    };
    let (rtt, source) = estimate;
    assert_eq!(source, RttSource::Coordinates);
    assert!(on_n1.environment().latency("n3", Instant::now()).is_none());
    // n1 and n3 sit each 40 ms from n2: by the triangle inequality at most 80 ms apart.
    assert!(rtt <= 4 * LINK_DELAY + Duration::from_millis(30), "{rtt:?}");
    let measured = on_n1
        .environment()
        .rtt_estimate("n2", Instant::now())
        .unwrap();
    assert_eq!(measured.1, RttSource::Measured, "measured wins where fresh");
    eprintln!(
        "n1 -> n3 predicted {rtt:?}, n1 -> n2 measured {:?}",
        measured.0
    );
}

/// A proxy on `local` routing web-1 (on n2) and web-2 (on n1), three failures in a row
/// ejecting a pod.
fn sharing_router(local: &str, nodes: Vec<Node>) -> Arc<Router> {
    let router = Arc::new(Router::new(Some(local.into())));
    // The even spread, so that client traffic alone brings a failing pod to its
    // ejection; the slack spread passes it over after its first failure and leaves the
    // ejection to its probes (core tests/trust.rs).
    let (settings, errors) = ServiceSettings::from_pairs([
        ("latency-slo", "50ms"),
        ("qos-pool-eject-after", "3"),
        ("qos-pool-spread", "even"),
    ]);
    assert!(errors.is_empty(), "{errors:?}");
    let spec = ServiceSpec::new(ServiceKey::new("default", "web"), vec![], settings);
    let pods = vec![
        Endpoint::new("web-1", "127.0.0.1:1".parse().unwrap()).on_node("n2"),
        Endpoint::new("web-2", "127.0.0.1:2".parse().unwrap()).on_node("n1"),
    ];
    router.apply(
        [Update::Reset {
            nodes,
            services: vec![(spec, pods)],
        }],
        Instant::now(),
    );
    router
}

/// Send `n` requests through `router`, web-1 answering `web1` and web-2 200 in 5 ms.
fn traffic(router: &Router, n: usize, web1: proxima_core::Outcome) {
    let mut rng = SmallRng::seed_from_u64(3);
    let key = ServiceKey::new("default", "web");
    for _ in 0..n {
        let now = Instant::now();
        let picked = router.pick(&key, None, now, &mut rng, &[]).unwrap();
        let outcome = if picked.endpoint().id == "web-1" {
            web1
        } else {
            proxima_core::Outcome::Answered {
                latency: Duration::from_millis(5),
                status: 200,
            }
        };
        router.record(&picked, now, outcome);
    }
}

fn pool_ids(router: &Router) -> Vec<String> {
    let table = router.table();
    let route = &table.services[&ServiceKey::new("default", "web")];
    let mut ids: Vec<String> = route
        .pool()
        .iter()
        .map(|&i| route.endpoints[i].endpoint.id.clone())
        .collect();
    ids.sort();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_one_proxy_saw_fail_is_suspect_at_its_neighbour_after_one_round() {
    // n2's proxy: its admin server, and its own prober, which publishes its reports.
    let n2 = Peer::start("n2", "127.0.0.2", None, false).await;
    let nodes = || {
        vec![
            node("n2", n2.addr),
            node("n1", "127.0.0.1:9".parse().unwrap()),
        ]
    };
    let n2_router = sharing_router("n2", nodes());
    // n1's proxy, sharing on and off: both sent web-1 a few good requests earlier.
    let on = sharing_router("n1", nodes());
    let off = sharing_router("n1", nodes());
    let good = proxima_core::Outcome::Answered {
        latency: Duration::from_millis(5),
        status: 200,
    };
    for r in [&n2_router, &on, &off] {
        traffic(r, 20, good);
    }
    // Then web-1 starts failing; n2's proxy, which sends it traffic, ejects it.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let failing = proxima_core::Outcome::Answered {
        latency: Duration::from_millis(1),
        status: 503,
    };
    traffic(&n2_router, 20, failing);
    assert_eq!(pool_ids(&n2_router), ["web-2"]);
    let registry = Registry::new();
    let quiet = ProberConfig {
        max_peers_per_round: 0,
        ..ProberConfig::default()
    };
    let (n2_prober, _) = prober(&n2_router, &registry, quiet);
    n2_prober.with_local(n2.local.clone()).round().await;

    // One round of n1's prober (which probes n2) later, web-1 is suspect there.
    let (on_prober, _) = prober(&on, &Registry::new(), ProberConfig::default());
    let mut on_prober = on_prober.with_local(Arc::new(LocalNode::new(Some("n1".into()), None)));
    let report = on_prober.round().await;
    assert_eq!(report.answered.len(), 1, "{:?}", report.failed);
    let heard = report.heard.expect("sharing is on by default");
    assert_eq!(heard.suspected.len(), 1, "{heard:?}");
    assert_eq!(heard.suspected[0].1, "web-1");
    assert_eq!(heard.suspected[0].2, "n2");
    assert_eq!(pool_ids(&on), ["web-2"]);
    let explain = on.explain(Instant::now());
    let web1 = &explain.services[0].endpoints[0];
    assert!(web1.reason.contains("n2"), "{}", web1.reason);
    let probes = on.due_probes(Instant::now());
    assert_eq!(probes.len(), 1, "probed before it takes another request");

    // With sharing off, the same round changes nothing.
    let no_sharing = ProberConfig {
        share_bytes: 0,
        ..ProberConfig::default()
    };
    let (mut off_prober, _) = prober(&off, &Registry::new(), no_sharing);
    let report = off_prober.round().await;
    assert!(report.heard.is_none());
    assert_eq!(pool_ids(&off), ["web-1", "web-2"]);
}
