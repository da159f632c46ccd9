//! `blackhole` and `node-down` drop packets (nftables, in the test's own network
//! namespace): a TCP connect across them hangs until its timeout instead of completing
//! or being refused, an open connection stalls, and both come back when the event ends.
//! Each test re-executes itself in a namespace of its own (`tests/k8s/netns.rs`); without
//! `unshare` or `nft` (Debian: `apt-get install nftables`) they fail, never skip.

#[path = "../../../tests/k8s/netns.rs"]
mod netns;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use proxima_testbed::scenario::Action;
use proxima_testbed::{Cluster, ScenarioFile, StrategySpec};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// Three nodes; the events are applied by hand, in file order.
const SCENARIO: &str = r#"
name: drops
nodes: [{ name: a, region: r1 }, { name: b, region: r2 }, { name: c, region: r2 }]
latency: { default: 1ms }
services:
  - name: api
    instances: [{ name: on-b, node: b }]
clients:
  - { node: a, service: api, requests: 100 }
events:
  - { at: 10, do: [{ blackhole: { between: [region:r1, b] } }] }
  - { at: 20, do: [{ reset: { between: [a, b] } }] }
  - { at: 30, do: [{ node-down: b }] }
  - { at: 40, do: [{ node-up: b }] }
testbed: { discovery-interval: 100ms, peer-probe-interval: 200ms }
"#;

/// How long a connect may take before it counts as hanging: far above a loopback
/// handshake, far below TCP's own give-up time.
const HANG: Duration = Duration::from_millis(1500);

#[derive(Debug, PartialEq)]
enum Connect {
    Connected,
    Refused,
    Hangs,
}

/// Connect from `from` (a node's address, as its proxy and prober do) to `to`.
async fn connect(from: IpAddr, to: SocketAddr) -> Connect {
    let socket = TcpSocket::new_v4().expect("socket");
    socket.bind(SocketAddr::new(from, 0)).expect("bind");
    match tokio::time::timeout(HANG, socket.connect(to)).await {
        Err(_) => Connect::Hangs,
        Ok(Ok(_)) => Connect::Connected,
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => Connect::Refused,
        Ok(Err(e)) => panic!("connect {from} -> {to}: unexpected {e}"),
    }
}

/// Send one `/node/ping` on `stream` and wait up to `wait` for the start of the answer.
async fn ping(stream: &mut TcpStream, wait: Duration) -> bool {
    stream
        .write_all(b"GET /node/ping HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("write");
    let mut buf = [0u8; 4096];
    match tokio::time::timeout(wait, stream.read(&mut buf)).await {
        Ok(Ok(n)) => n > 0 && buf[..n].starts_with(b"HTTP/1.1 200"),
        _ => false,
    }
}

async fn start() -> (Arc<Cluster>, Vec<Action>, std::path::PathBuf) {
    let file = ScenarioFile::parse(SCENARIO).unwrap();
    let scenario = file.variant(&file.variant_names()[0]).unwrap();
    let actions: Vec<Action> = scenario
        .events
        .iter()
        .flat_map(|e| e.actions.clone())
        .collect();
    let dir = std::env::temp_dir().join(format!("proxima-testbed-drops-{}", unique()));
    let cluster = Cluster::start(
        &scenario,
        &StrategySpec::parse("round-robin").unwrap(),
        0,
        &dir,
    )
    .await
    .unwrap();
    (cluster, actions, dir)
}

/// The only way to see the firewall from outside: nft's own listing of the ruleset.
fn ruleset() -> String {
    let out = std::process::Command::new("nft")
        .args(["list", "ruleset"])
        .output()
        .expect("nft (Debian: apt-get install nftables)");
    assert!(out.status.success(), "nft list ruleset: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connects_across_a_blackhole_or_to_a_down_node_hang_until_the_event_ends() {
    if netns::isolated("connects_across_a_blackhole_or_to_a_down_node_hang_until_the_event_ends")
        .is_none()
    {
        return;
    }
    let (cluster, actions, dir) = start().await;
    let ip: Vec<IpAddr> = cluster.nodes.iter().map(|n| n.ip).collect();
    let admin: Vec<SocketAddr> = cluster.nodes.iter().map(|n| n.admin).collect();
    let (a, b, c) = (0, 1, 2);
    // A port of b's address that nobody listens on: refused while b is reachable.
    let closed = {
        let l = std::net::TcpListener::bind((ip[b], 0)).unwrap();
        l.local_addr().unwrap()
    };
    assert_eq!(connect(ip[a], admin[b]).await, Connect::Connected);
    assert_eq!(connect(ip[a], closed).await, Connect::Refused);
    let mut open_from_a = {
        let socket = TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::new(ip[a], 0)).unwrap();
        socket.connect(admin[b]).await.unwrap()
    };
    assert!(ping(&mut open_from_a, Duration::from_secs(5)).await);

    // Blackhole a <-> b: both directions hang, c <-> b is untouched.
    cluster.apply(&actions[0]).await.unwrap();
    assert_eq!(connect(ip[a], admin[b]).await, Connect::Hangs);
    assert_eq!(connect(ip[b], admin[a]).await, Connect::Hangs);
    assert_eq!(connect(ip[a], closed).await, Connect::Hangs);
    assert_eq!(connect(ip[c], admin[b]).await, Connect::Connected);
    assert_eq!(connect(ip[a], admin[c]).await, Connect::Connected);
    // An open connection stalls: the request is retransmitted into the void.
    assert!(!ping(&mut open_from_a, Duration::from_millis(800)).await);

    // Reset: connects complete again, and the stalled connection delivers (TCP
    // retransmits; its backoff is well under the wait).
    cluster.apply(&actions[1]).await.unwrap();
    assert_eq!(connect(ip[a], admin[b]).await, Connect::Connected);
    assert_eq!(connect(ip[b], admin[a]).await, Connect::Connected);
    assert_eq!(connect(ip[a], closed).await, Connect::Refused);
    let mut answer = [0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(10), open_from_a.read(&mut answer))
        .await
        .expect("the stalled request is answered once the link is back")
        .unwrap();
    assert!(
        answer[..n].starts_with(b"HTTP/1.1 200"),
        "{:?}",
        &answer[..n]
    );

    // b down: nothing reaches it from anywhere, its own connects hang too.
    cluster.apply(&actions[2]).await.unwrap();
    assert!(ruleset().contains(&ip[b].to_string()), "{}", ruleset());
    assert_eq!(connect(ip[a], admin[b]).await, Connect::Hangs);
    assert_eq!(connect(ip[c], admin[b]).await, Connect::Hangs);
    assert_eq!(connect(ip[b], admin[c]).await, Connect::Hangs);
    assert_eq!(connect(ip[c], closed).await, Connect::Hangs);
    assert_eq!(connect(ip[a], admin[c]).await, Connect::Connected);

    // b up: back.
    cluster.apply(&actions[3]).await.unwrap();
    assert_eq!(connect(ip[a], admin[b]).await, Connect::Connected);
    assert_eq!(connect(ip[b], admin[c]).await, Connect::Connected);
    assert_eq!(connect(ip[c], closed).await, Connect::Refused);
    assert!(!ruleset().contains(&ip[b].to_string()), "{}", ruleset());

    cluster.shutdown().await;
    let _ = std::fs::remove_dir_all(dir);
    // The run's table is gone with it.
    assert!(!ruleset().contains("proxima_testbed_0"), "{}", ruleset());
}

/// A whole run: the proxy on `a` loses `b` to a blackhole for 2 s, with a 200 ms
/// connect timeout and `c` as the other endpoint.
const RUN: &str = r#"
name: drops-run
nodes: [{ name: a, region: r1 }, { name: b, region: r2 }, { name: c, region: r2 }]
latency: { default: 1ms }
services:
  - name: api
    settings: { latency-slo: 1s, connect-timeout: 200ms, timeout: 1s }
    instances: [{ name: on-b, node: b }, { name: on-c, node: c }]
clients:
  - { node: a, service: api, rate: 20, duration: 8s, timeout: 3s }
events:
  - { name: hole, at: 2s, do: [{ blackhole: { between: [a, b] } }] }
  - { name: back, at: 4s, do: [{ reset: { between: [a, b] } }] }
strategies: [round-robin]
testbed: { discovery-interval: 100ms, peer-probe-interval: 200ms }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_meets_a_blackhole_with_connect_timeouts_and_retries_elsewhere() {
    if netns::isolated("a_proxy_meets_a_blackhole_with_connect_timeouts_and_retries_elsewhere")
        .is_none()
    {
        return;
    }
    let file = ScenarioFile::parse(RUN).unwrap();
    let jobs = proxima_testbed::plan(&file, &[], &[]).unwrap();
    let options = proxima_testbed::RunOptions {
        work_dir: std::env::temp_dir().join(format!("proxima-testbed-drops-run-{}", unique())),
        ..proxima_testbed::RunOptions::default()
    };
    let runs = proxima_testbed::run_jobs(jobs, 1, &options, None)
        .await
        .unwrap();
    let _ = std::fs::remove_dir_all(&options.work_dir);
    let run = &runs[0];
    let proxy = |phase: &str| {
        run.proxy_phases
            .iter()
            .find(|p| p.phase == phase)
            .unwrap_or_else(|| panic!("no phase {phase}: {:?}", run.proxy_phases))
            .counters
    };
    let answered = |phase: &str, instance: &str| {
        run.phases
            .iter()
            .find(|p| p.name == phase)
            .and_then(|p| p.per_instance.get(instance).copied())
            .unwrap_or(0)
    };
    let requests = |phase: &str| {
        run.phases
            .iter()
            .find(|p| p.name == phase)
            .map_or(0, |p| p.summary.requests)
    };
    let context = format!("{:?}\n{:?}", run.proxy_phases, run.phases);
    // Before: both answer, nothing fails.
    assert!(proxy("T0").is_zero(), "{context}");
    assert!(
        answered("T0", "on-b") > 0 && answered("T0", "on-c") > 0,
        "{context}"
    );
    // During: connects to b time out (they are not refused: nothing answers), the
    // requests go to c, and b answers nothing.
    assert!(proxy("hole").connect_failures >= 1, "{context}");
    assert_eq!(answered("hole", "on-b"), 0, "{context}");
    assert!(
        answered("hole", "on-c") * 2 >= requests("hole"),
        "most requests of the hole are answered by c: {context}"
    );
    // After: b answers again once its cooldown is over.
    assert!(answered("back", "on-b") > 0, "{context}");
    assert_eq!(
        run.proxy.connect_failures,
        run.proxy_phases
            .iter()
            .map(|p| p.counters.connect_failures)
            .sum::<u64>()
    );
}

/// A name part no concurrent run shares: these tests run in their own PID namespace,
/// where every run's process id is the same.
fn unique() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{}-{nanos}", std::process::id())
}
