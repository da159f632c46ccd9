//! The testbed's own accounting and network emulation, on a small scenario: real nodes
//! (router, file discovery, proxy, admin, peer prober) on 127.0.1.N, real backends,
//! user-space delay gates. Bounds on times are one-sided or generous: the machine may be
//! slow, never faster than the injected delay.

use std::time::Duration;

use proxima_testbed::{plan, run_jobs, Cluster, RunOptions, ScenarioFile, StrategySpec};

/// Two nodes 20 ms apart (one way). `far` (node b) answers at once; `near` (node a, the
/// client's node) joins after 30 requests.
const SCENARIO: &str = include_str!("../crates/proxima-testbed/tests/accounting.yaml");

fn options(name: &str) -> RunOptions {
    RunOptions {
        work_dir: std::env::temp_dir().join(format!(
            "proxima-testbed-test-{name}-{}",
            std::process::id()
        )),
        progress: false,
        ..RunOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_is_counted_once_and_links_add_their_delay() {
    let file = ScenarioFile::parse(SCENARIO).unwrap();
    let jobs = plan(&file, &[StrategySpec::parse("round-robin").unwrap()], &[]).unwrap();
    let options = options("accounting");
    let runs = run_jobs(jobs, 1, &options, None).await.unwrap();
    let _ = std::fs::remove_dir_all(&options.work_dir);
    let run = &runs[0];
    assert!(
        run.warmed_up,
        "the proxies never learnt each other's latency"
    );

    // Accounting: clients == instances == phases, and each phase is what the event said.
    assert_eq!(run.records.len(), 60);
    assert_eq!(run.summary.requests, 60);
    assert_eq!(run.summary.failed, 0, "{:?}", run.per_instance);
    let by_instance: u64 = run.per_instance.iter().map(|(_, n)| n).sum();
    assert_eq!(by_instance, 60);
    assert_eq!(run.accounting_gap, 0);
    let by_phase: u64 = run.phases.iter().map(|p| p.summary.requests).sum();
    assert_eq!(by_phase, 60);
    let names: Vec<&str> = run.phases.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["T0", "T1"]);
    assert_eq!(run.phases[0].summary.requests, 30);
    assert_eq!(run.phases[1].summary.requests, 30);
    let mut seqs: Vec<u64> = run.records.iter().map(|r| r.seq).collect();
    seqs.dedup();
    assert_eq!(seqs, (1..=60).collect::<Vec<_>>());
    assert!(run.records.iter().all(|r| (r.seq <= 30) == (r.phase == 0)));
    for phase in &run.phases {
        let counted: u64 = phase.per_instance.values().sum();
        assert_eq!(counted, phase.summary.requests, "{}", phase.name);
    }

    // Before the join only `far` exists; it is 20 ms away each way, so every answer
    // takes at least 40 ms, and (generously) not more than a second.
    assert_eq!(run.phases[0].per_instance.get("far"), Some(&30));
    let far: Vec<Duration> = run
        .records
        .iter()
        .filter(|r| r.phase == 0)
        .map(|r| r.latency)
        .collect();
    assert!(
        far.iter().all(|l| *l >= Duration::from_millis(40)),
        "{far:?}"
    );
    let mut sorted = far.clone();
    sorted.sort();
    assert!(
        sorted[sorted.len() / 2] < Duration::from_secs(1),
        "{sorted:?}"
    );
    // After it, discovery picks up `near`, whose answers skip the link.
    let near: Vec<Duration> = run
        .records
        .iter()
        .filter(|r| r.phase == 1 && r.instance == Some(1))
        .map(|r| r.latency)
        .collect();
    assert!(!near.is_empty(), "{:?}", run.phases[1].per_instance);
    assert!(near.iter().min() < far.iter().min());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxies_measure_the_emulated_latency_between_nodes() {
    let scenario = ScenarioFile::parse(SCENARIO).unwrap().variant("").unwrap();
    let strategy = StrategySpec::parse("qos-pool").unwrap();
    let options = options("latency");
    let cluster = Cluster::start(&scenario, &strategy, 5, &options.work_dir)
        .await
        .unwrap();
    assert!(cluster.warm_up(Duration::from_secs(30)).await);
    for (node, other) in [(0, "b"), (1, "a")] {
        let rtt = cluster.nodes[node]
            .router()
            .environment()
            .latency(other, std::time::Instant::now())
            .expect("a fresh latency reading");
        // Peer probes leave from the node's own address, so the gate delays them by the
        // link: at least the round trip of 40 ms.
        assert!(rtt >= Duration::from_millis(40), "{rtt:?}");
        assert!(rtt < Duration::from_secs(1), "{rtt:?}");
    }
    assert_eq!(cluster.nodes[0].ip.to_string(), "127.5.1.1");
    assert_eq!(cluster.one_way(0, 1), Duration::from_millis(20));
    cluster.shutdown().await;
    let _ = std::fs::remove_dir_all(&options.work_dir);
}

/// One node, two services of three instances each: `rpc` on h2c (`protocol: grpc`) and
/// `chat` on HTTP/1.1. A gRPC client sends unary calls, four at a time, on its one
/// HTTP/2 connection; a WebSocket client holds six sockets and sends messages on them.
const PROTOCOLS: &str = r#"
name: protocols
nodes: [{ name: a }]
services:
  - name: rpc
    protocol: grpc
    settings: { latency-slo: 1s }
    instances: [{ node: a, count: 3, processing: 2ms }]
  - name: chat
    settings: { latency-slo: 1s }
    instances: [{ node: a, count: 3, processing: 2ms }]
clients:
  - { name: caller, node: a, service: rpc, protocol: grpc, requests: 90, concurrency: 4, body: hello }
  - { name: chatter, node: a, service: chat, protocol: websocket, requests: 60, concurrency: 6, path: /chat }
testbed: { discovery-interval: 100ms, peer-probe-interval: 200ms }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_calls_and_websocket_messages_are_balanced_by_the_qos_pool() {
    let file = ScenarioFile::parse(PROTOCOLS).unwrap();
    let jobs = plan(&file, &[StrategySpec::parse("qos-pool").unwrap()], &[]).unwrap();
    let options = options("protocols");
    let runs = run_jobs(jobs, 1, &options, None).await.unwrap();
    let run = &runs[0];
    assert!(run.warmed_up);
    assert_eq!(run.summary.requests, 150);
    assert_eq!(run.summary.failed, 0, "{:?}", run.records);
    assert_eq!(run.accounting_gap, 0);

    // Per client: what answered, and on how many connections.
    let answered = |client: u16| -> Vec<u64> {
        let mut counts = vec![0u64; run.instance_names.len()];
        for r in run.records.iter().filter(|r| r.client == client) {
            counts[usize::from(r.instance.expect("an instance answered"))] += 1;
        }
        counts
    };
    let calls = answered(0);
    assert!(calls[..3].iter().all(|&n| n > 0), "{calls:?}");
    assert_eq!(calls[..3].iter().sum::<u64>(), 90);
    let grpc = run.records.iter().filter(|r| r.client == 0);
    assert!(grpc
        .clone()
        .all(|r| r.status == 200 && r.grpc_status == Some(0)));
    assert_eq!(
        run.clients[0].connections, 1,
        "every call on one HTTP/2 connection"
    );
    let messages = answered(1);
    assert!(messages[3..].iter().all(|&n| n > 0), "{messages:?}");
    assert_eq!(messages[3..].iter().sum::<u64>(), 60);
    let ws = run.records.iter().filter(|r| r.client == 1);
    assert!(ws
        .clone()
        .all(|r| r.status == 101 && r.grpc_status.is_none()));
    assert_eq!(run.clients[1].connections, 6, "one socket per worker");

    // The report and its files say which client spoke what.
    let report = proxima_testbed::report::table(&runs);
    assert!(report.contains("caller@a [grpc]") && report.contains("chatter@a [websocket]"));
    let out = options.work_dir.join("out");
    let provenance = proxima_testbed::report::Provenance {
        scenario_file: "protocols".into(),
        command: "test".into(),
        commit: None,
        dirty: None,
        seed: 1,
    };
    proxima_testbed::report::write_files(&out, &provenance, "protocols", None, &runs, true)
        .unwrap();
    let clients = std::fs::read_to_string(out.join("clients.csv")).unwrap();
    assert!(
        clients.contains(",caller,a,rpc.default,grpc,1,90,0,0,"),
        "{clients}"
    );
    assert!(
        clients.contains(",chatter,a,chat.default,websocket,6,60,0,0,"),
        "{clients}"
    );
    let json = std::fs::read_to_string(out.join("results.json")).unwrap();
    assert!(json.contains(r#""protocol": "grpc""#), "{json}");
    let _ = std::fs::remove_dir_all(&options.work_dir);
}

/// `proxy-restart` while a device sends: the new proxy takes over node a's sockets, so
/// no connection is refused and the device's requests go on through the new proxy.
/// The old one closes its idle keep-alive connections when it drains (as nginx does on
/// a reload): a request written on one of them just then fails without an answer. That
/// costs at most one request per connection the device holds (4), at the handover
/// only; everything else succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_proxy_takes_over_its_sockets_and_the_device_goes_on() {
    let text = SCENARIO
        .replace(
            "requests: 60, concurrency: 2",
            "requests: 200, concurrency: 4, rate: 100",
        )
        .replace(
            "{ name: T1, at: 30, do: [{ join: near }] }",
            "{ name: T1, at: 30, do: [{ join: near }] }\n  \
             - { name: R1, at: 80, do: [{ proxy-restart: a }] }\n  \
             - { name: R2, at: 140, do: [{ proxy-restart: a }] }",
        );
    let file = ScenarioFile::parse(&text).unwrap();
    let jobs = plan(&file, &[StrategySpec::parse("qos-pool").unwrap()], &[]).unwrap();
    let options = options("restart");
    let runs = run_jobs(jobs, 1, &options, None).await.unwrap();
    let _ = std::fs::remove_dir_all(&options.work_dir);
    let run = &runs[0];
    assert_eq!(run.summary.requests, 200);
    let names: Vec<&str> = run.phases.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["T0", "T1", "R1", "R2"]);
    for phase in &run.phases {
        assert!(phase.summary.requests > 0, "{}", phase.name);
    }
    for (phase, restarted) in [(2, "R1"), (3, "R2")] {
        let mine: Vec<_> = run.records.iter().filter(|r| r.phase == phase).collect();
        let failed: Vec<_> = mine.iter().filter(|r| !r.succeeded()).collect();
        assert!(failed.len() <= 4, "{restarted}: {failed:?}");
        // Failed without an answer (a connection closed under it), not answered badly.
        assert!(
            failed.iter().all(|r| r.status == 0),
            "{restarted}: {failed:?}"
        );
        // Only at the handover: the phase's later requests all succeed.
        assert!(
            mine.iter().skip(10).all(|r| r.succeeded()),
            "{restarted}: {mine:?}"
        );
    }
    let failed = run.records.iter().filter(|r| !r.succeeded());
    assert!(
        failed.clone().all(|r| r.phase >= 2),
        "{:?}",
        failed.collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacing_proxy_knows_nothing_but_what_its_first_peer_round_told_it() {
    use proxima_testbed::scenario::Action;
    let scenario = ScenarioFile::parse(SCENARIO).unwrap().variant("").unwrap();
    let strategy = StrategySpec::parse("qos-pool").unwrap();
    let options = options("replacing");
    let cluster = Cluster::start(&scenario, &strategy, 6, &options.work_dir)
        .await
        .unwrap();
    assert!(cluster.warm_up(Duration::from_secs(30)).await);
    let old = cluster.nodes[0].router();
    cluster.apply(&Action::ProxyRestart(0)).await.unwrap();
    let new = cluster.nodes[0].router();
    assert!(
        !std::sync::Arc::ptr_eq(&old, &new),
        "the proxy was not replaced"
    );
    // Its first round of peer probes ran before `apply` returned (before it served).
    let now = std::time::Instant::now();
    assert!(new.environment().latency("b", now).is_some());
    // Discovery was read at its start: the service is routed.
    assert!(new.table().services.keys().any(|k| k.name == "api"));
    // Node b's proxy is the one it was.
    let before = cluster.nodes[1].router();
    cluster.apply(&Action::ProxyRestart(0)).await.unwrap();
    assert!(std::sync::Arc::ptr_eq(&before, &cluster.nodes[1].router()));
    cluster.shutdown().await;
    let _ = std::fs::remove_dir_all(&options.work_dir);
}
