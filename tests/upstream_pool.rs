//! The upstream keep-alive pool stays within its bounds: at most
//! `max_idle_per_endpoint` idle connections to one pod and `max_idle_total` in all, the
//! oldest going first. Real sockets: emulated pods that answer after a delay, so that
//! concurrent requests open many connections at once, and a real HTTP client.

mod common;

use std::time::Duration;

use common::*;
use futures_util::future::join_all;
use http::StatusCode;
use proxima_proxy::ProxyConfig;

const PER_ENDPOINT: usize = 3;
const TOTAL: usize = 10;
const PODS: usize = 8;
/// Concurrent requests per pod in the burst: each needs its own connection.
const CONCURRENT_PER_POD: usize = 6;

/// `api.shop`, round robin over `pods` (named `pod-<i>` in order) with a lenient SLO.
fn round_robin_api(pods: &[Backend]) -> (proxima_core::ServiceSpec, Vec<proxima_core::Endpoint>) {
    let endpoints = pods
        .iter()
        .enumerate()
        .map(|(i, b)| endpoint(&format!("pod-{i}"), b.addr()))
        .collect();
    let settings = [("strategy", "round-robin"), ("latency-slo", "5s")];
    (service("shop", "api", &[], &settings), endpoints)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_stay_within_their_bounds_per_pod_and_in_total() {
    let mut pods = Vec::new();
    for i in 0..PODS {
        pods.push(
            backend_with(BackendConfig::new(format!("pod-{i}")).delay(Duration::from_millis(300)))
                .await,
        );
    }
    let other = backend("other-0").await;
    let config = ProxyConfig {
        max_idle_per_endpoint: PER_ENDPOINT,
        max_idle_total: TOTAL,
        ..ProxyConfig::default()
    };
    let proxy = TestProxy::start_with(
        config,
        vec![
            round_robin_api(&pods),
            (
                service("shop", "other", &[], &[]),
                vec![endpoint("other-0", other.addr())],
            ),
            (
                service("shop", "solo", &[], &[("latency-slo", "5s")]),
                vec![endpoint("solo-0", pods[0].addr())],
            ),
        ],
    )
    .await;
    let client = http1_client();
    let url = proxy.url("/");

    // One pod gets more requests at once than it may keep idle connections: once they
    // are answered it keeps exactly its bound, the oldest going.
    let replies = join_all(
        (0..CONCURRENT_PER_POD).map(|_| get(&client, &url, &[("x-service", "solo.shop")])),
    )
    .await;
    assert!(replies.iter().all(|r| r.status == StatusCode::OK));
    eventually(
        "the pod's connections come back",
        Duration::from_secs(5),
        || proxy.proxy.idle_connections_to(pods[0].addr()) == PER_ENDPOINT,
    )
    .await;
    assert!(
        proxy.metric(r#"proxima_upstream_idle_closed_total{reason="endpoint_limit"}"#)
            >= (CONCURRENT_PER_POD - PER_ENDPOINT) as f64,
        "{}",
        proxy.metrics_text()
    );

    // A burst: every pod gets several requests at once, each on its own connection.
    let replies = join_all(
        (0..PODS * CONCURRENT_PER_POD).map(|_| get(&client, &url, &[("x-service", "api.shop")])),
    )
    .await;
    let mut answered = std::collections::BTreeMap::<String, usize>::new();
    for reply in &replies {
        assert_eq!(reply.status, StatusCode::OK);
        *answered.entry(reply.backend().to_string()).or_default() += 1;
    }
    assert_eq!(answered.len(), PODS, "{answered:?}");
    // More connections were opened than the pool may keep.
    let opened: u64 = pods.iter().map(|p| p.connections()).sum();
    assert!(
        opened > TOTAL as u64,
        "only {opened} connections were opened"
    );

    // Every connection has come back (or been closed) once the responses are read.
    eventually("idle connections settle", Duration::from_secs(5), || {
        proxy.metric("proxima_upstream_idle_connections") as usize == proxy.proxy.idle_connections()
    })
    .await;
    let idle = proxy.metric("proxima_upstream_idle_connections") as usize;
    assert_eq!(idle, TOTAL, "the pool is full, not over");
    assert!(proxy.proxy.max_idle_connections_per_endpoint() <= PER_ENDPOINT);
    assert!(
        proxy.metric(r#"proxima_upstream_idle_closed_total{reason="total_limit"}"#) > 0.0,
        "{}",
        proxy.metrics_text()
    );

    // A connection to another pod comes back to a full pool: the oldest idle one goes,
    // the new one stays, and reuse still works (one connection for many requests).
    // (Its first probe's connection, if still pooled, went with the oldest.)
    assert_eq!(proxy.proxy.idle_connections_to(other.addr()), 0);
    let before = other.connections();
    for _ in 0..5 {
        let reply = get(&client, &url, &[("x-service", "other.shop")]).await;
        assert_eq!(reply.status, StatusCode::OK);
    }
    assert_eq!(proxy.proxy.idle_connections_to(other.addr()), 1);
    assert_eq!(
        other.connections() - before,
        1,
        "sequential requests reuse one connection"
    );
    assert_eq!(proxy.proxy.idle_connections(), TOTAL);
    assert_eq!(
        proxy.metric("proxima_upstream_idle_connections") as usize,
        TOTAL
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bound_of_zero_keeps_no_idle_connection() {
    let pod = backend("pod-0").await;
    let config = ProxyConfig {
        max_idle_per_endpoint: 0,
        ..ProxyConfig::default()
    };
    let proxy = TestProxy::one_pod(config, "pod-0", pod.addr()).await;
    // The new pod's first probe comes first; count the requests' connections after it.
    eventually("the first probe", Duration::from_secs(10), || {
        pod.hits() > pod.client_hits()
    })
    .await;
    let before = pod.connections();
    let client = http1_client();
    for _ in 0..3 {
        let reply = get(&client, &proxy.url("/"), &[("x-service", "api.shop")]).await;
        assert_eq!(reply.status, StatusCode::OK);
    }
    assert_eq!(proxy.proxy.idle_connections(), 0);
    assert_eq!(
        pod.connections() - before,
        3,
        "each request had its own connection"
    );
}

/// Beyond `max_idle_buffered`, idle connections are parked: their socket stays pooled
/// without HTTP state (and a body-less request's native exchange leaves its connection
/// parked from the start). Taking one back opens no new TCP connection, and one the pod
/// closed while parked is noticed (or retried) without failing a request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_connections_are_reused_and_a_closed_one_fails_no_request() {
    const PODS: usize = 4;
    let mut pods = Vec::new();
    for i in 0..PODS {
        pods.push(backend(&format!("pod-{i}")).await);
    }
    let config = ProxyConfig {
        max_idle_buffered: 1,
        ..ProxyConfig::default()
    };
    let proxy = TestProxy::start_with(config, vec![round_robin_api(&pods)]).await;
    let client = http1_client();
    let url = proxy.url("/");
    let round = || async {
        for _ in 0..PODS {
            let reply = get(&client, &url, &[("x-service", "api.shop")]).await;
            assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
        }
    };
    round().await;
    eventually(
        "all idle connections parked but at most the one buffered",
        Duration::from_secs(5),
        || {
            proxy.metric("proxima_upstream_idle_parked_connections") as usize + 1
                >= proxy.proxy.idle_connections()
                && proxy.proxy.idle_connections() >= PODS
        },
    )
    .await;

    // Round robin over the pods: nearly every request takes a parked connection.
    let opened = |pods: &[Backend]| -> u64 { pods.iter().map(|p| p.connections()).sum() };
    let before = opened(&pods);
    let served_before: u64 = pods.iter().map(|p| p.client_hits()).sum();
    for _ in 0..5 {
        round().await;
    }
    let served: u64 = pods.iter().map(|p| p.client_hits()).sum::<u64>() - served_before;
    assert_eq!(served, 5 * PODS as u64);
    // Without reuse these 20 requests would open 20 connections. A connection being
    // parked is out of the idle lists until its task has handed the socket back, and a
    // buffered one is not ready until its task has seen the previous response end; on a
    // loaded machine a request can come for that pod in between and open a new one.
    let new = opened(&pods) - before;
    assert!(
        new <= 2,
        "parked connections were taken again instead of new ones: {new} opened for 20 requests"
    );
    assert!(proxy.metric("proxima_upstream_idle_parked_connections") >= (PODS - 1) as f64);

    // A pod restarts on the same address: its graceful shutdown closes the idle (parked)
    // connection under the pool. The next requests to it still succeed.
    let victim = pods.remove(0);
    let addr = victim.addr();
    victim.shutdown().await;
    let again = Backend::spawn(addr, BackendConfig::new("pod-0"))
        .await
        .expect("the pod comes back on its address");
    pods.insert(0, again);
    for _ in 0..3 {
        round().await;
    }
    assert!(pods[0].client_hits() >= 3, "the restarted pod was not used");
    assert!(
        pods[0].connections() >= 1,
        "the restarted pod's requests came on a new connection"
    );
}

/// A pod that, after each answer, writes an unasked-for response onto the idle
/// connection. Parked connections that hold such bytes are never reused: every request
/// gets its own answer, never the stray one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_connection_the_pod_wrote_on_unasked_is_not_reused() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let listener = tokio::net::TcpListener::bind(loopback()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&chunk[..n]),
                        }
                    }
                    head.clear();
                    let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nhi";
                    if stream.write_all(answer).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    let stray = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nstray";
                    if stream.write_all(stray).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let config = ProxyConfig {
        max_idle_buffered: 0,
        ..ProxyConfig::default()
    };
    let settings = [("strategy", "round-robin"), ("latency-slo", "5s")];
    let proxy = TestProxy::start_with(
        config,
        vec![(
            service("shop", "api", &[], &settings),
            vec![endpoint("pod-0", addr)],
        )],
    )
    .await;
    let client = http1_client();
    for _ in 0..5 {
        let reply = get(&client, &proxy.url("/"), &[("x-service", "api.shop")]).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(&reply.body[..], b"hi");
        // Let the stray answer land on the parked connection.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        accepted.load(std::sync::atomic::Ordering::Relaxed),
        5,
        "each request had to open a connection of its own"
    );
}

/// Requests in flight across a set of pods, and the most ever at once.
#[derive(Default)]
struct Concurrency {
    now: std::sync::atomic::AtomicUsize,
    most: std::sync::atomic::AtomicUsize,
    seen: std::sync::Mutex<std::collections::HashSet<u16>>,
}

/// A pod on its own loopback port that answers every request `200` after `delay`,
/// counting in `load` the requests in flight on all such pods.
async fn counting_pod(load: std::sync::Arc<Concurrency>, delay: Duration) -> std::net::SocketAddr {
    use std::sync::atomic::Ordering;
    let listener = tokio::net::TcpListener::bind(loopback())
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let load = load.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |_req| {
                    let load = load.clone();
                    async move {
                        let now = load.now.fetch_add(1, Ordering::SeqCst) + 1;
                        load.most.fetch_max(now, Ordering::SeqCst);
                        load.seen.lock().unwrap().insert(addr.port());
                        tokio::time::sleep(delay).await;
                        load.now.fetch_sub(1, Ordering::SeqCst);
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(full("ok")))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_probes_of_many_new_pods_go_out_a_bounded_wave_at_a_time() {
    use std::sync::atomic::Ordering;
    const NEW_PODS: usize = 40;
    const BOUND: usize = 4;
    let load = std::sync::Arc::new(Concurrency::default());
    let mut services = Vec::new();
    for s in 0..4 {
        let mut endpoints = Vec::new();
        for p in 0..NEW_PODS / 4 {
            let addr = counting_pod(load.clone(), Duration::from_millis(60)).await;
            endpoints.push(endpoint(&format!("svc-{s}-pod-{p}"), addr));
        }
        services.push((service("shop", &format!("svc-{s}"), &[], &[]), endpoints));
    }
    let config = ProxyConfig {
        max_concurrent_first_probes: BOUND,
        ..ProxyConfig::default()
    };
    // Every pod is new and never measured: each is due its first probe at once.
    let _proxy = TestProxy::start_with(config, services).await;
    eventually("every new pod probed", Duration::from_secs(20), || {
        load.seen.lock().unwrap().len() == NEW_PODS
    })
    .await;
    let most = load.most.load(Ordering::SeqCst);
    assert!(
        most <= BOUND,
        "{most} probes in flight at once, bound {BOUND}"
    );
    assert!(
        most > 1,
        "probes went out one at a time: the bound was not used"
    );
}
