//! Issue 8, "a QoS pool you can trust when pods fail", against the real `proxima` binary
//! following a topology file: real emulated pods (proxima-emulate) or a raw-socket pod
//! written here, real HTTP clients. Each test asserts the share of client requests the
//! bad pod receives after a short warm-up.
//!
//! Needs the binary: `cargo build -p proxima` first.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::StatusCode;
use proxima_emulate::{Backend, BackendConfig};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

#[path = "support/binary.rs"]
mod binary;

use binary::*;

/// A topology with service `svc` (settings as YAML flow pairs) and endpoints `(id, addr)`.
fn topology(settings: &str, endpoints: &[(&str, SocketAddr)]) -> String {
    let mut text = format!("services:\n  - name: svc\n    settings: {{ {settings} }}\n");
    text.push_str("    endpoints:\n");
    for (id, addr) in endpoints {
        text.push_str(&format!("      - {{ id: {id}, address: '{addr}' }}\n"));
    }
    text
}

fn replace(path: &Path, text: &str) {
    let tmp = path.with_extension("swp");
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

/// A proxy following a topology file in its own temp dir.
struct Setup {
    proxima: Proxima,
    path: std::path::PathBuf,
    _dir: TempDir,
    http: HttpClient,
}

impl Setup {
    async fn start(text: &str) -> Self {
        Self::start_with(text, &[]).await
    }

    async fn start_with(text: &str, env: &[(&str, &str)]) -> Self {
        let dir = TempDir::new("trust");
        let path = dir.0.join("topology.yaml");
        std::fs::write(&path, text).expect("write topology");
        let discovery = format!("file:{}", path.display());
        let proxima = Proxima::start_with(&["run", "--discovery", &discovery], env).await;
        Self {
            proxima,
            path,
            _dir: dir,
            http: client(),
        }
    }

    /// One request to `svc`; the backend that answered, or `None` when the client gave
    /// up after `patience`.
    async fn request(&self, patience: Duration) -> Option<String> {
        self.request_path("/", patience).await
    }

    async fn request_path(&self, path: &str, patience: Duration) -> Option<String> {
        let url = format!("http://{}{path}", self.proxima.proxy);
        let request = http::Request::get(&url)
            .header("x-service", "svc")
            .body(http_body_util::Empty::new())
            .expect("request");
        let response = tokio::time::timeout(patience, self.http.request(request))
            .await
            .ok()?
            .unwrap_or_else(|e| panic!("GET {url}: {e}"));
        Some(
            response
                .headers()
                .get("x-backend")
                .map_or("(proxy)", |v| v.to_str().unwrap_or("?"))
                .to_string(),
        )
    }

    /// `svc.default` in `/debug/pools`.
    async fn pools(&self) -> Value {
        let url = format!(
            "http://{}/debug/pools?service=svc.default",
            self.proxima.admin
        );
        let reply = get(&self.http, &url, None).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        let json: Value = serde_json::from_str(&reply.body).expect("pools JSON");
        json["services"][0].clone()
    }

    async fn endpoint(&self, id: &str) -> Value {
        let pools = self.pools().await;
        pools["endpoints"]
            .as_array()
            .and_then(|eps| eps.iter().find(|e| e["id"] == id))
            .cloned()
            .unwrap_or_else(|| panic!("no endpoint {id} in {pools:#}"))
    }
}

/// A raw-socket pod that answers every request at once with `status` (HTTP/1.1,
/// keep-alive), naming itself in `x-backend`.
struct StatusPod {
    addr: SocketAddr,
    hits: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl StatusPod {
    async fn spawn(name: &'static str, status: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let hits = Arc::new(AtomicU64::new(0));
        let counter = hits.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let counter = counter.clone();
                tokio::spawn(async move {
                    let mut seen = Vec::new();
                    let mut buf = [0u8; 4096];
                    loop {
                        while let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                            seen.drain(..end + 4);
                            counter.fetch_add(1, Ordering::SeqCst);
                            let answer = format!(
                                "HTTP/1.1 {status} Failing\r\nx-backend: {name}\r\ncontent-length: 0\r\n\r\n"
                            );
                            if stream.write_all(answer.as_bytes()).await.is_err() {
                                return;
                            }
                        }
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => seen.extend_from_slice(&buf[..n]),
                        }
                    }
                });
            }
        });
        Self { addr, hits, task }
    }
}

impl Drop for StatusPod {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn pod(name: &str, delay_ms: u64) -> Backend {
    Backend::spawn(
        "127.0.0.1:0".parse().unwrap(),
        BackendConfig::new(name).delay(Duration::from_millis(delay_ms)),
    )
    .await
    .expect("emulated pod starts")
}

fn share(seen: &[Option<String>], id: &str) -> f64 {
    seen.iter().filter(|s| s.as_deref() == Some(id)).count() as f64 / seen.len() as f64
}

const PATIENT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_answering_fast_500s_gets_almost_no_traffic() {
    // Before issue 8 it took 25-36% of 300 requests, "meeting the SLO" at p95 3.5 ms.
    let (a, b) = (pod("a", 20).await, pod("b", 20).await);
    let bad = StatusPod::spawn("bad", 500).await;
    let setup = Setup::start(&topology(
        "latency-slo: 80ms",
        &[("a", a.addr()), ("b", b.addr()), ("bad", bad.addr)],
    ))
    .await;
    let mut seen = vec![];
    for _ in 0..300 {
        seen.push(setup.request(PATIENT).await);
    }
    let after_warm_up = &seen[30..];
    let bad_share = share(after_warm_up, "bad");
    eprintln!(
        "fast-5xx: bad pod share after warm-up {:.1}% (all: {:.1}%), raw hits {}",
        bad_share * 100.0,
        share(&seen, "bad") * 100.0,
        bad.hits.load(Ordering::SeqCst)
    );
    assert!(bad_share < 0.05, "the failing pod took {bad_share:.3}");
    let e = setup.endpoint("bad").await;
    assert_eq!(e["in_pool"], false, "{e:#}");
    assert!(e["out_because"].is_string(), "{e:#}");
    let reason = e["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("evicted") || reason.starts_with("ejected"),
        "{reason}"
    );
    assert_eq!(setup.pools().await["failure_status"], "5xx");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_give_up_at_300ms_steer_the_pool_away_from_a_2s_pod() {
    // Before: 47 of 100 requests still went to the 2 s pod after 40 were abandoned.
    let (a, b, slow) = (
        pod("a", 10).await,
        pod("b", 10).await,
        pod("slow", 2000).await,
    );
    let setup = Setup::start(&topology(
        "latency-slo: 100ms",
        &[("a", a.addr()), ("b", b.addr()), ("slow", slow.addr())],
    ))
    .await;
    let patience = Duration::from_millis(300);
    let mut seen = vec![];
    for _ in 0..100 {
        seen.push(setup.request(patience).await);
    }
    let given_up = |s: &[Option<String>]| s.iter().filter(|r| r.is_none()).count();
    // Only the slow pod makes a client give up (a and b answer in 10 ms).
    let abandoned_after = given_up(&seen[20..]);
    eprintln!(
        "300ms clients: {} of 100 abandoned, {abandoned_after} of them after the first 20",
        given_up(&seen)
    );
    assert!(
        abandoned_after <= 4,
        "{abandoned_after} of 80 went to the slow pod"
    );
    let e = setup.endpoint("slow").await;
    assert_eq!(e["in_pool"], false, "{e:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_client_abandons_is_still_measured_over_http1_and_h2() {
    // The only pod takes 2 s, the SLO is 1 s, the clients give up after 1.5 s. Whether
    // the overdue timer (at 1 s) or the client's departure (at 1.5 s) comes first, the
    // pod must end up out of the pool, and the departure itself must be seen for both
    // an HTTP/1 close and an h2 stream reset.
    let slow = pod("slow", 2000).await;
    let setup = Setup::start_with(
        &topology("latency-slo: 1s", &[("slow", slow.addr())]),
        &[("PROXIMA_LOG", "info,proxima_proxy=debug")],
    )
    .await;
    let url = format!("http://{}/", setup.proxima.proxy);
    let h2: hyper_util::client::legacy::Client<_, http_body_util::Empty<bytes::Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .http2_only(true)
            .build_http();
    let mut gave_up = 0;
    for i in 0..4 {
        let request = http::Request::get(&url)
            .header("x-service", "svc")
            .body(http_body_util::Empty::new())
            .expect("request");
        let client = if i % 2 == 0 { &setup.http } else { &h2 };
        match tokio::time::timeout(Duration::from_millis(1500), client.request(request)).await {
            Err(_) => gave_up += 1,
            Ok(answer) => panic!("the 2 s pod answered within 1.5 s: {answer:?}"),
        }
    }
    assert_eq!(gave_up, 4);
    // The proxy notices a departure when it next polls that connection or stream, which
    // on a busy machine can come well after the client's own timeout returned: wait for
    // it rather than for a fixed time.
    let departed = |logs: &str| {
        logs.lines()
            .filter(|l| l.contains("the client went away before the endpoint answered"))
            .count()
    };
    let departures = eventually("every departure is seen", || async {
        let n = departed(&setup.proxima.logs());
        (n >= 4).then_some(n)
    })
    .await;
    eprintln!("abandoned: {gave_up} of 4 given up, {departures} departures logged");
    assert_eq!(departures, 4, "{}", setup.proxima.logs());
    let expected = [
        r#"proxima_unanswered_total{service="svc.default",why="abandoned"} 4"#,
        r#"proxima_unanswered_total{service="svc.default",why="overdue"} 4"#,
    ];
    let metrics_url = format!("http://{}/metrics", setup.proxima.admin);
    eventually("both unanswered counters reach 4", || async {
        let metrics = get(&setup.http, &metrics_url, None).await.body;
        expected
            .iter()
            .all(|series| metrics.lines().any(|l| l == *series))
            .then_some(())
    })
    .await;
    // On a loaded machine the proxy may have stalled meanwhile, and then the pool's last
    // member is kept for a few seconds (`STALL_MEMORY`); it is judged after that without
    // any further traffic.
    let e = eventually("the slow pod is out of the pool", || async {
        let e = setup.endpoint("slow").await;
        (e["in_pool"] == false).then_some(e)
    })
    .await;
    assert_eq!(e["out_because"], "latency", "{e:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_hangs_leaves_the_pool_in_a_fraction_of_a_second() {
    // A pod with a window full of good answers stops answering (as a stopped container
    // does: the kernel still accepts); four patient clients, so it holds at most four
    // misses against 60 good answers, too few for the latency test's margin alone.
    let (a, hang) = (pod("a", 5).await, pod("hang", 5).await);
    let setup = Arc::new(
        // No hedges: they would answer the waiting requests from `a` and leave the
        // hanging pod to the latency test (`a_request_to_a_pod_gone_silent_…`).
        Setup::start(&topology(
            "latency-slo: 100ms, timeout: 15s, qos-pool-hedge: 'off'",
            &[("a", a.addr()), ("hang", hang.addr())],
        ))
        .await,
    );
    for _ in 0..200 {
        setup.request(PATIENT).await;
    }
    assert_eq!(setup.endpoint("hang").await["in_pool"], true);
    hang.set_delay(Duration::from_secs(20));
    let started = Instant::now();
    // Four requests at once: about half go to the hanging pod and wait.
    let mut waiting = vec![];
    for _ in 0..4 {
        let setup = setup.clone();
        waiting.push(tokio::spawn(async move {
            setup.request(Duration::from_secs(20)).await
        }));
    }
    let e = eventually("the hanging pod is out of the pool", || {
        let setup = setup.clone();
        async move {
            let e = setup.endpoint("hang").await;
            (e["in_pool"] == false).then_some(e)
        }
    })
    .await;
    let took = started.elapsed();
    eprintln!("hanging pod out after {took:?}: {e}");
    assert_eq!(e["out_because"], "unanswered", "{e:#}");
    // Well under the 15 s timeout (generous bound for a busy machine).
    assert!(took < Duration::from_secs(5), "{took:?}");
    let mut seen = vec![];
    for _ in 0..50 {
        seen.push(setup.request(PATIENT).await);
    }
    assert_eq!(share(&seen, "a"), 1.0, "{seen:?}");
    for w in waiting {
        w.abort();
    }
}

/// The value of the sample `series` (name and labels, as exposed) in `metrics`; 0 when
/// absent.
fn sample(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_to_a_pod_gone_silent_is_answered_by_another_within_the_slo() {
    // A 400 ms SLO on pods answering in 5 ms: a request left waiting by a pod that went
    // silent (a blackholed zone) goes to the other pod as well at 400 - 5 - 40 ms, and
    // the client gets that answer instead of waiting for the timeout.
    let (a, silent) = (pod("a", 5).await, pod("silent", 5).await);
    let setup = Setup::start(&topology(
        "latency-slo: 400ms, slo-percentile: 99, timeout: 15s",
        &[("a", a.addr()), ("silent", silent.addr())],
    ))
    .await;
    for _ in 0..200 {
        setup.request(PATIENT).await;
    }
    assert_eq!(setup.endpoint("silent").await["in_pool"], true);
    silent.set_delay(Duration::from_secs(20));
    let mut seen = vec![];
    for _ in 0..20 {
        // Without the hedge, a request on the silent pod waits for the 15 s timeout.
        seen.push(setup.request(Duration::from_secs(3)).await);
    }
    assert_eq!(
        share(&seen, "a"),
        1.0,
        "every request answered, by a: {seen:?}"
    );
    let url = format!("http://{}/metrics", setup.proxima.admin);
    let metrics = get(&setup.http, &url, None).await.body;
    let hedges = sample(
        &metrics,
        r#"proxima_picks_total{reason="hedge",service="svc.default"}"#,
    );
    let outraced = sample(
        &metrics,
        r#"proxima_unanswered_total{service="svc.default",why="outraced"}"#,
    );
    eprintln!("hedges {hedges}, outraced {outraced}");
    assert!(hedges >= 1.0, "{metrics}");
    assert_eq!(hedges, outraced, "every hedge answered first: {metrics}");
    // Each outraced copy is a miss: after a few the silent pod gets no more requests,
    // out of the pool (the even spread's way) or passed over and probed until its
    // probes decide (the slack spread's).
    let e = setup.endpoint("silent").await;
    let passed_over = e["in_pool"] == true
        && e["reason"]
            .as_str()
            .is_some_and(|r| r.contains("probed every"));
    assert!(e["in_pool"] == false || passed_over, "{e:#}");
    assert!(
        hedges <= 10.0,
        "hedged until it left the pool or was passed over, not forever: {hedges}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_must_not_reach_two_pods_is_never_hedged() {
    let (a, silent) = (pod("a", 5).await, pod("silent", 5).await);
    let setup = Setup::start(&topology(
        "latency-slo: 400ms, slo-percentile: 99, timeout: 2s",
        &[("a", a.addr()), ("silent", silent.addr())],
    ))
    .await;
    for _ in 0..200 {
        setup.request(PATIENT).await;
    }
    silent.set_delay(Duration::from_secs(20));
    let mut statuses = vec![];
    for _ in 0..4 {
        let mut conn = tokio::net::TcpStream::connect(setup.proxima.proxy)
            .await
            .expect("connect");
        let post = "POST / HTTP/1.1\r\nhost: svc\r\nx-service: svc\r\ncontent-length: 5\r\nconnection: close\r\n\r\norder";
        conn.write_all(post.as_bytes()).await.expect("write");
        let mut answer = String::new();
        conn.read_to_string(&mut answer).await.expect("read");
        let status = answer.get(9..12).and_then(|s| s.parse::<u16>().ok());
        statuses.push(status.unwrap_or_else(|| panic!("no status line: {answer:?}")));
    }
    // The POSTs that landed on the silent pod waited for it: 504 at the timeout.
    assert!(statuses.contains(&504), "{statuses:?}");
    let metrics = get(
        &setup.http,
        &format!("http://{}/metrics", setup.proxima.admin),
        None,
    )
    .await
    .body;
    let hedges = sample(
        &metrics,
        r#"proxima_picks_total{reason="hedge",service="svc.default"}"#,
    );
    assert_eq!(hedges, 0.0, "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovered_pod_is_back_within_seconds() {
    let (a, b) = (pod("a", 5).await, pod("b", 300).await);
    let setup = Setup::start(&topology(
        "latency-slo: 100ms",
        &[("a", a.addr()), ("b", b.addr())],
    ))
    .await;
    // b is slow for 12 s: its probes back off meanwhile.
    let slow_until = Instant::now() + Duration::from_secs(12);
    while Instant::now() < slow_until {
        setup.request(PATIENT).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(setup.endpoint("b").await["in_pool"], false);
    b.set_delay(Duration::from_millis(5));
    let recovered = Instant::now();
    loop {
        if setup.request(PATIENT).await.as_deref() == Some("b") {
            break;
        }
        assert!(
            recovered.elapsed() < Duration::from_secs(30),
            "b never came back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = recovered.elapsed();
    eprintln!("recovered pod back after {took:?}");
    // Probes at most 4 s apart while failing, then 3 good ones 0.5 s apart; before
    // issue 8 this took 12-42 s. Generous bound for a busy machine.
    assert!(took < Duration::from_secs(9), "{took:?}");
    // And it gets its share again once slow start is over.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let mut seen = vec![];
    for _ in 0..100 {
        seen.push(setup.request(PATIENT).await);
    }
    let b_share = share(&seen, "b");
    assert!((0.4..=0.6).contains(&b_share), "b took {b_share}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_slow_only_under_load_does_not_flap_and_ramps_up_when_it_returns() {
    // `flappy` processes one request at a time (40 ms each): alone it meets the 60 ms
    // SLO, under four concurrent clients its queue does not. The even spread, which
    // gives it a full share and so the queue; the slack spread sends it only its even
    // turns (20 ms of room against the others' 50), too few to build one.
    let (a, b) = (pod("a", 10).await, pod("b", 10).await);
    let flappy = Backend::spawn(
        "127.0.0.1:0".parse().unwrap(),
        BackendConfig::new("flappy")
            .delay(Duration::from_millis(40))
            .workers(1),
    )
    .await
    .expect("pod starts");
    let setup = Arc::new(
        Setup::start(&topology(
            "latency-slo: 60ms, qos-pool-spread: even",
            &[("a", a.addr()), ("b", b.addr()), ("flappy", flappy.addr())],
        ))
        .await,
    );
    let run_for = Duration::from_secs(20);
    let started = Instant::now();
    let mut clients = vec![];
    for _ in 0..4 {
        let setup = setup.clone();
        clients.push(tokio::spawn(async move {
            let mut seen = vec![];
            while started.elapsed() < run_for {
                let sent = Instant::now();
                let backend = setup.request(PATIENT).await;
                seen.push((backend, sent.elapsed()));
            }
            seen
        }));
    }
    // Watch for a moment in slow start after a return.
    let mut saw_ramp = false;
    while started.elapsed() < run_for {
        let e = setup.endpoint("flappy").await;
        if e["in_pool"] == true && e["weight"].as_f64().unwrap_or(1.0) < 1.0 {
            saw_ramp = true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut seen = vec![];
    for c in clients {
        seen.extend(c.await.expect("client"));
    }
    let e = setup.endpoint("flappy").await;
    let logs = setup.proxima.logs();
    let evictions = logs
        .lines()
        .filter(|l| l.contains("left the QoS pool") && l.contains("flappy"))
        .count();
    let total = seen.len();
    let to_flappy = seen
        .iter()
        .filter(|(b, _)| b.as_deref() == Some("flappy"))
        .count();
    // Answers from flappy slower than the SLO plus a generous proxy allowance: the
    // queue a burst builds up on it.
    let flappy_misses = seen
        .iter()
        .filter(|(b, t)| b.as_deref() == Some("flappy") && *t > Duration::from_millis(120))
        .count();
    eprintln!(
        "flappy: {evictions} evictions in {run_for:?}; {to_flappy} of {total} requests, {flappy_misses} of them over 120 ms; flaps {}; saw slow start: {saw_ramp}",
        e["flaps"]
    );
    assert!(evictions >= 1, "it is slow under load: {logs}");
    assert!(evictions <= 6, "{evictions} evictions in {run_for:?}");
    // Its share stays small, and the requests that queued on it are a sliver.
    assert!(
        (to_flappy as f64) < 0.15 * total as f64,
        "{to_flappy} of {total}"
    );
    assert!(
        (flappy_misses as f64) < 0.02 * total as f64,
        "{flappy_misses} of {total}"
    );
    if evictions >= 2 {
        assert!(e["flaps"].as_u64().unwrap_or(0) >= 1, "{e:#}");
        assert!(saw_ramp, "a returning pod ramps up");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_looser_slo_rejudges_an_evicted_pod_at_once() {
    // The issue's example: evicted at 80 ms, its few fresh samples within a new 200 ms
    // SLO, yet it stayed out 47 s. Samples age out after 2 s here, so that by the time
    // of the edit the evicted pod has fewer fresh samples than `min-samples`, or none.
    let (a, b) = (pod("a", 10).await, pod("b", 150).await);
    let endpoints = [("a", a.addr()), ("b", b.addr())];
    // The even spread, whose share after the slow start is easy to state (the slack
    // spread gives b, with 50 ms of room against a's 190, its even turns only).
    let settings =
        |slo: &str| format!("latency-slo: {slo}, qos-pool-max-age: 2s, qos-pool-spread: even");
    let setup = Setup::start(&topology(&settings("80ms"), &endpoints)).await;
    let until = Instant::now() + Duration::from_secs(6);
    while Instant::now() < until {
        setup.request(PATIENT).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let e = setup.endpoint("b").await;
    assert_eq!(e["in_pool"], false, "{e:#}");
    replace(&setup.path, &topology(&settings("200ms"), &endpoints));
    let edited = Instant::now();
    eventually("the new SLO is applied", || async {
        (setup.pools().await["latency_slo_ms"] == 200.0).then_some(())
    })
    .await;
    eventually("b is back", || async {
        (setup.endpoint("b").await["in_pool"] == true).then_some(())
    })
    .await;
    let took = edited.elapsed();
    eprintln!("SLO change: b back {took:?} after the edit");
    // At once, or after three quick probes (the file is polled every 0.5 s).
    assert!(took < Duration::from_secs(5), "{took:?}");
    tokio::time::sleep(Duration::from_secs(10)).await; // past the slow start
    let mut seen = vec![];
    for _ in 0..60 {
        seen.push(setup.request(PATIENT).await);
    }
    let b_share = share(&seen, "b");
    assert!((0.35..=0.65).contains(&b_share), "b took {b_share}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_service_judges_a_pod_on_few_samples() {
    // One request every 200 ms, qos-pool-min-samples 10: before issue 8 the slow pod
    // stayed "warming" (in the pool) until it had 10 fresh samples.
    let (a, slow) = (pod("a", 5).await, pod("slow", 200).await);
    let setup = Setup::start(&topology(
        "latency-slo: 100ms, qos-pool-min-samples: 10",
        &[("a", a.addr()), ("slow", slow.addr())],
    ))
    .await;
    let mut seen = vec![];
    for _ in 0..30 {
        seen.push(setup.request(PATIENT).await);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let slow_count = seen.iter().filter(|s| s.as_deref() == Some("slow")).count();
    eprintln!("quiet service: slow pod got {slow_count} of 30");
    assert!(slow_count <= 2, "{slow_count} of 30 went to the slow pod");
    let e = setup.endpoint("slow").await;
    assert_eq!(e["in_pool"], false, "{e:#}");
    assert!(e["samples"].as_u64().unwrap() < 10, "{e:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_spread_is_even_whatever_the_response_time() {
    // Before issue 8, two choices on in-flight counts split 2:1 between a near and a far
    // pod: by Little's law the slower one always holds more requests in flight.
    let (near, far) = (pod("near", 2).await, pod("far", 40).await);
    // The paper's even spread; the default (slack) sends the near pod more, as it has
    // 38 ms more room under the SLO (tested in the core's trust.rs).
    let setup = Arc::new(
        Setup::start(&topology(
            "latency-slo: 200ms, qos-pool-spread: even",
            &[("near", near.addr()), ("far", far.addr())],
        ))
        .await,
    );
    let mut clients = vec![];
    for _ in 0..6 {
        let setup = setup.clone();
        clients.push(tokio::spawn(async move {
            let mut seen = vec![];
            for _ in 0..100 {
                seen.push(setup.request(PATIENT).await);
            }
            seen
        }));
    }
    let mut seen = vec![];
    for c in clients {
        seen.extend(c.await.expect("client"));
    }
    let (n, f) = (share(&seen, "near"), share(&seen, "far"));
    eprintln!("spread: near {:.1}%, far {:.1}%", n * 100.0, f * 100.0);
    assert!((n + f - 1.0).abs() < 1e-9, "{seen:?}");
    assert!(n.max(f) / n.min(f) <= 1.2, "near {n}, far {f}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalls_of_the_proxy_itself_do_not_empty_the_pool() {
    // The whole proxy process is stopped (SIGSTOP) for 300 ms, six times, while six
    // clients keep requests in flight: every pod looks slow at once. That is the
    // proxy's stall, not the pods'. (A 32-sample window holds several stalls.)
    let (a, b) = (pod("a", 10).await, pod("b", 10).await);
    let setup = Arc::new(
        Setup::start(&topology(
            "latency-slo: 100ms, qos-pool-window: 32",
            &[("a", a.addr()), ("b", b.addr())],
        ))
        .await,
    );
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut clients = vec![];
    for _ in 0..6 {
        let (setup, stop) = (setup.clone(), stop.clone());
        clients.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                setup.request(PATIENT).await;
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut smallest_pool = u64::MAX;
    for _ in 0..6 {
        setup.proxima.signal("STOP");
        tokio::time::sleep(Duration::from_millis(300)).await;
        setup.proxima.signal("CONT");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let size = setup.pools().await["pool_size"].as_u64().unwrap();
        smallest_pool = smallest_pool.min(size);
    }
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        c.await.expect("client");
    }
    let logs = setup.proxima.logs();
    let evictions = logs
        .lines()
        .filter(|l| l.contains("left the QoS pool"))
        .count();
    eprintln!("stalls: smallest pool {smallest_pool}, {evictions} evictions");
    assert!(smallest_pool >= 1, "the pool emptied:\n{logs}");
    assert!(
        evictions <= 1,
        "{evictions} evictions for the proxy's own stalls"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_fails_on_every_pod_ejects_at_most_the_cap() {
    // Four healthy pods; then every request asks for a 503 (a fault that is not the
    // pods', like a poisonous request or a shared dependency being down). Three failures
    // in a row eject a pod at once, but at most 50% of the pool: two stay in, and
    // `/debug/pools` says why each pod is where it is.
    let pods = [
        pod("p0", 2).await,
        pod("p1", 2).await,
        pod("p2", 2).await,
        pod("p3", 2).await,
    ];
    let endpoints: Vec<(&str, SocketAddr)> = pods.iter().map(|p| (p.name(), p.addr())).collect();
    let setup = Setup::start(&topology(
        "latency-slo: 100ms, slo-percentile: 50, qos-pool-eject-after: 3, qos-pool-readmit-after: 5",
        &endpoints,
    ))
    .await;
    for _ in 0..200 {
        setup.request(PATIENT).await;
    }
    assert_eq!(setup.pools().await["pool_size"], 4);
    for _ in 0..40 {
        setup.request_path("/status/503", PATIENT).await;
    }
    let pools = setup.pools().await;
    eprintln!(
        "ejection cap: pool {} of 4, {} ejected (cap {})",
        pools["pool_size"], pools["failure_ejected"], pools["failure_ejection_cap"]
    );
    assert_eq!(pools["failure_ejection_cap"], 2, "{pools:#}");
    assert_eq!(pools["failure_ejected"], 2, "{pools:#}");
    assert_eq!(pools["pool_size"], 2, "{pools:#}");
    for e in pools["endpoints"].as_array().unwrap() {
        let reason = e["reason"].as_str().unwrap();
        if e["in_pool"] == true {
            assert!(reason.contains("not ejected"), "{reason}");
        } else {
            assert_eq!(e["out_because"], "consecutive-failures", "{e:#}");
            assert!(
                reason.starts_with("ejected for consecutive failures"),
                "{reason}"
            );
        }
    }
    // Ordinary requests again: the two pods still in take them all, and the ejected
    // ones come back through their probes.
    let mut seen = vec![];
    for _ in 0..20 {
        seen.push(setup.request(PATIENT).await);
    }
    assert!(seen.iter().all(Option::is_some), "{seen:?}");
    eventually("the ejected pods are back", || async {
        (setup.pools().await["pool_size"] == 4).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_pod_that_cannot_meet_the_slo_never_gets_a_client_request() {
    // A service in use; then a pod that takes 300 ms for everything (80 ms SLO) is
    // added, then a good one. Before, the slow pod was "warming" and got client requests
    // until it was judged; now it waits for a first probe and fails it.
    let (a, b, slow, c) = (
        pod("a", 5).await,
        pod("b", 5).await,
        pod("slow", 300).await,
        pod("c", 5).await,
    );
    let settings = "latency-slo: 80ms";
    let setup = Setup::start(&topology(settings, &[("a", a.addr()), ("b", b.addr())])).await;
    for _ in 0..20 {
        setup.request(PATIENT).await;
    }
    replace(
        &setup.path,
        &topology(
            settings,
            &[("a", a.addr()), ("b", b.addr()), ("slow", slow.addr())],
        ),
    );
    eventually(
        "the slow pod is known and probed out of the pool",
        || async {
            let pools = setup.pools().await;
            let e = pools["endpoints"]
                .as_array()
                .and_then(|eps| eps.iter().find(|e| e["id"] == "slow"))
                .cloned()?;
            (e["out_because"] == "latency").then_some(())
        },
    )
    .await;
    replace(
        &setup.path,
        &topology(
            settings,
            &[
                ("a", a.addr()),
                ("b", b.addr()),
                ("slow", slow.addr()),
                ("c", c.addr()),
            ],
        ),
    );
    eventually("the good new pod joins after its first probe", || async {
        let pools = setup.pools().await;
        let e = pools["endpoints"]
            .as_array()
            .and_then(|eps| eps.iter().find(|e| e["id"] == "c"))
            .cloned()?;
        (e["in_pool"] == true).then_some(())
    })
    .await;
    let mut seen = vec![];
    for _ in 0..60 {
        seen.push(setup.request(PATIENT).await);
    }
    eprintln!(
        "new pods: slow {:.1}%, c {:.1}%",
        share(&seen, "slow") * 100.0,
        share(&seen, "c") * 100.0
    );
    assert_eq!(share(&seen, "slow"), 0.0, "{seen:?}");
    assert!(share(&seen, "c") > 0.15, "{seen:?}");
    // The slow pod was never sent a client request, only probes.
    let e = setup.endpoint("slow").await;
    assert_eq!(e["in_pool"], false, "{e:#}");
    assert_eq!(e["requests"], 0, "{e:#}");
}
