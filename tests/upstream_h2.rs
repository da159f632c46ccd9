//! HTTP/2 to pods whose port speaks h2c (`upstream_h2.rs`): real hyper and h2 servers as
//! the pods, HTTP/1.1 and HTTP/2 clients on the other side.

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use proxima_core::Endpoint;
use proxima_proxy::ProxyConfig;
use tokio::net::TcpListener;

/// An endpoint on `addr` whose port speaks h2c, as `appProtocol: kubernetes.io/h2c`
/// says.
fn h2c_endpoint(id: &str, addr: SocketAddr) -> Endpoint {
    let mut endpoint = endpoint(id, addr);
    endpoint.ports[0].app_protocol = Some("kubernetes.io/h2c".to_string());
    endpoint
}

/// An HTTP/2-only pod (hyper, prior knowledge) allowing `streams` at once per
/// connection: it answers, after `delay`, with what it saw: the request's version,
/// authority, `host`, `te`, and body, prefixed with its name. Counts its connections.
struct H2Pod {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
}

async fn h2_pod(name: &'static str, streams: u32, delay: Duration) -> H2Pod {
    let listener = TcpListener::bind(loopback()).await.expect("bind pod");
    let addr = listener.local_addr().expect("pod addr");
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = connections.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            let service = service_fn(move |req: Request<Incoming>| async move {
                tokio::time::sleep(delay).await;
                let seen = format!(
                    "{name}: version={:?} authority={} host={} te={}",
                    req.version(),
                    req.uri().authority().map_or("-", |a| a.as_str()),
                    header(&req, "host"),
                    header(&req, "te"),
                );
                let body = req.into_body().collect().await.map(|b| b.to_bytes());
                let body = String::from_utf8_lossy(&body.unwrap_or_default()).into_owned();
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(format!(
                    "{seen} body={body}"
                )))))
            });
            tokio::spawn(async move {
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .max_concurrent_streams(streams)
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    H2Pod { addr, connections }
}

fn header<B>(req: &Request<B>, name: &str) -> String {
    req.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_string()
}

/// A pod (the h2 crate's server) that refuses every stream with `REFUSED_STREAM`,
/// unprocessed, and counts them.
async fn refusing_pod() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind(loopback()).await.expect("bind pod");
    let addr = listener.local_addr().expect("pod addr");
    let refused = Arc::new(AtomicUsize::new(0));
    let counted = refused.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let counted = counted.clone();
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(stream).await else {
                    return;
                };
                while let Some(Ok((_, mut respond))) = conn.accept().await {
                    counted.fetch_add(1, Ordering::SeqCst);
                    respond.send_reset(h2::Reason::REFUSED_STREAM);
                }
            });
        }
    });
    (addr, refused)
}

fn post(proxy: &TestProxy, body: &'static str) -> Request<Body> {
    Request::post(proxy.url("/upload?x=1"))
        .header("x-service", "api.shop")
        .body(full(body))
        .expect("request")
}

#[tokio::test]
async fn http1_and_h2_clients_reach_an_h2c_pod_over_http2() {
    let pod = h2_pod("pod-a", 100, Duration::ZERO).await;
    let proxy = TestProxy::start(vec![(
        service("shop", "api", &[], &[]),
        vec![h2c_endpoint("pod-a", pod.addr)],
    )])
    .await;
    for client in [http1_client(), h2c_client()] {
        let reply = send(&client, post(&proxy, "hello")).await;
        assert_eq!(reply.status, StatusCode::OK);
        let seen = String::from_utf8_lossy(&reply.body);
        assert!(seen.starts_with("pod-a: version=HTTP/2.0"), "{seen}");
        // The client's Host (or :authority) is the pod's :authority, not a header.
        let authority = proxy.addr.to_string();
        assert!(
            seen.contains(&format!("authority={authority} host=-")),
            "{seen}"
        );
        assert!(seen.ends_with("body=hello"), "{seen}");
        let reply = get(&client, &proxy.url("/"), &[("x-service", "api.shop")]).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert!(String::from_utf8_lossy(&reply.body).ends_with("body="));
    }
    // Every request went over one multiplexed connection.
    assert_eq!(pod.connections.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_pod_s_stream_limit_opens_more_connections_instead_of_queueing() {
    // Two streams per connection, six requests at once, each held 300 ms by the pod.
    let pod = h2_pod("pod-a", 2, Duration::from_millis(300)).await;
    let proxy = TestProxy::start(vec![(
        service("shop", "api", &[], &[("latency-slo", "2s")]),
        vec![h2c_endpoint("pod-a", pod.addr)],
    )])
    .await;
    // Let the first connection learn the pod's SETTINGS.
    let client = h2c_client();
    let reply = get(&client, &proxy.url("/"), &[("x-service", "api.shop")]).await;
    assert_eq!(reply.status, StatusCode::OK);
    let started = std::time::Instant::now();
    let calls = (0..6).map(|_| {
        let client = client.clone();
        let url = proxy.url("/");
        async move { get(&client, &url, &[("x-service", "api.shop")]).await }
    });
    for reply in futures_util::future::join_all(calls).await {
        assert_eq!(reply.status, StatusCode::OK);
    }
    // Three for the six (a probe in flight meanwhile may have needed a fourth).
    let connections = pod.connections.load(Ordering::SeqCst);
    assert!((3..=4).contains(&connections), "{connections} connections");
    // Queued behind two streams they would have taken three rounds (900 ms).
    assert!(
        started.elapsed() < Duration::from_millis(850),
        "{:?}",
        started.elapsed()
    );
}

/// With pod `bad` (which turns requests away unprocessed, counted in `turned_away`)
/// and a good pod-b in one service, `n` POSTs all reach pod-b with their bodies, and
/// `bad` was tried.
async fn posts_pass_a_pod_that_turns_them_away(
    bad: (&str, SocketAddr),
    turned_away: &AtomicUsize,
    n: usize,
) {
    let pod = h2_pod("pod-b", 100, Duration::ZERO).await;
    let proxy = TestProxy::start(vec![(
        service("shop", "api", &[], &[("retries", "2")]),
        vec![h2c_endpoint(bad.0, bad.1), h2c_endpoint("pod-b", pod.addr)],
    )])
    .await;
    let client = h2c_client();
    for _ in 0..n {
        // A POST: not idempotent, but never processed, so sent again.
        let reply = send(&client, post(&proxy, "payload")).await;
        assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
        let seen = String::from_utf8_lossy(&reply.body);
        assert!(
            seen.starts_with("pod-b:") && seen.ends_with("body=payload"),
            "{seen}"
        );
    }
    let tried = turned_away.load(Ordering::SeqCst);
    assert!(tried >= 1, "{} was never tried", bad.0);
}

#[tokio::test]
async fn a_refused_stream_goes_to_another_pod_with_its_body() {
    let (refuser, refused) = refusing_pod().await;
    posts_pass_a_pod_that_turns_them_away(("refuser", refuser), &refused, 20).await;
}

#[tokio::test]
async fn an_h2c_pod_is_probed_over_http2() {
    let pod = h2_pod("pod-a", 100, Duration::ZERO).await;
    let proxy = TestProxy::start(vec![(
        service("shop", "api", &[], &[("latency-slo", "200ms")]),
        vec![h2c_endpoint("pod-a", pod.addr)],
    )])
    .await;
    // A new endpoint is probed at once; an HTTP/1.1 probe would fail at an h2-only pod.
    eventually("the first probe met the SLO", PATIENCE, || {
        proxy
            .metrics_text()
            .lines()
            .any(|l| l.starts_with("proxima_probes_total") && l.contains("met"))
    })
    .await;
}

/// A pod that speaks HTTP/1.1 only (hyper's HTTP/1.1 server), answering `200 liar`.
async fn http1_only_pod() -> SocketAddr {
    let listener = TcpListener::bind(loopback()).await.expect("bind pod");
    let addr = listener.local_addr().expect("pod addr");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let service = service_fn(|_: Request<Incoming>| async {
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"liar"))))
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service),
            );
        }
    });
    addr
}

#[tokio::test]
async fn a_pod_declared_h2c_that_speaks_http1_is_skipped_and_named_in_the_error() {
    let liar = http1_only_pod().await;
    let pod = h2_pod("pod-b", 100, Duration::ZERO).await;
    let proxy = TestProxy::start(vec![
        (
            service("shop", "api", &[], &[("retries", "2")]),
            vec![h2c_endpoint("liar", liar), h2c_endpoint("pod-b", pod.addr)],
        ),
        (
            service("shop", "only-liar", &[], &[]),
            vec![h2c_endpoint("liar", liar)],
        ),
    ])
    .await;
    let client = h2c_client();
    for _ in 0..10 {
        // A POST too: the HTTP/1.1 server never understood it, so it goes elsewhere.
        let reply = send(&client, post(&proxy, "payload")).await;
        assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
        assert!(String::from_utf8_lossy(&reply.body).starts_with("pod-b:"));
    }
    let reply = get(&client, &proxy.url("/"), &[("x-service", "only-liar.shop")]).await;
    reply.assert_error(StatusCode::BAD_GATEWAY, "upstream unavailable");
    let detail = reply.json()["detail"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(detail.contains("does not speak HTTP/2"), "{detail}");
    assert!(
        proxy.metric(r#"proxima_upstream_errors_total{endpoint="liar",kind="connect",service="only-liar.shop"}"#) >= 1.0
    );
}

#[tokio::test]
async fn a_pod_declared_http1_that_speaks_only_http2_gets_a_clear_502() {
    let pod = h2_pod("pod-a", 100, Duration::ZERO).await;
    // No appProtocol, no port name: HTTP/1.1 is sent.
    let proxy = TestProxy::start(vec![(
        service("shop", "api", &[], &[]),
        vec![endpoint("pod-a", pod.addr)],
    )])
    .await;
    let reply = get(
        &http1_client(),
        &proxy.url("/"),
        &[("x-service", "api.shop")],
    )
    .await;
    reply.assert_error(StatusCode::BAD_GATEWAY, "upstream error");
    let detail = reply.json()["detail"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    // The pod's GOAWAY is named when it arrives; a pod that resets the connection at
    // once (with the request unread) leaves only the reset to tell.
    assert!(
        detail.contains("declare its port h2c") || detail.contains("reset"),
        "{detail}"
    );
    let failures = ["protocol", "reset"].map(|kind| {
        proxy.metric(&format!(
            r#"proxima_upstream_errors_total{{endpoint="pod-a",kind="{kind}",service="api.shop"}}"#
        ))
    });
    assert_eq!(failures.iter().sum::<f64>(), 1.0, "{failures:?}");
}

/// A gRPC pod that answers a message and ends the stream without trailers: without
/// `grpc-status` (a broken gRPC server, or a plain HTTP/2 one behind a gRPC port).
async fn statusless_grpc_pod() -> SocketAddr {
    let listener = TcpListener::bind(loopback()).await.expect("bind pod");
    let addr = listener.local_addr().expect("pod addr");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let service = service_fn(|_: Request<Incoming>| async {
                let mut response = Response::new(Full::new(Bytes::from_static(b"\0\0\0\0\x01x")));
                response
                    .headers_mut()
                    .insert("content-type", "application/grpc".parse().unwrap());
                Ok::<_, Infallible>(response)
            });
            tokio::spawn(async move {
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn a_grpc_answer_without_grpc_status_is_passed_on_and_counted() {
    let pod = statusless_grpc_pod().await;
    let proxy = TestProxy::start(vec![(
        service("shop", "api", &[], &[]),
        vec![h2c_endpoint("pod-a", pod)],
    )])
    .await;
    let call = Request::post(proxy.url("/echo.Echo/Say"))
        .header("x-service", "api.shop")
        .header("content-type", "application/grpc")
        .body(full(&b"\0\0\0\0\x02hi"[..]))
        .expect("request");
    let reply = send(&h2c_client(), call).await;
    // Passed on as it came: the client's gRPC library reads the missing status as
    // INTERNAL; the proxy counts it.
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(&reply.body[..], b"\0\0\0\0\x01x");
    assert_eq!(
        proxy.metric(r#"proxima_grpc_responses_total{code="missing",service="api.shop"}"#),
        1.0
    );
}

/// An h2c pod (hyper) that shuts each connection down gracefully (GOAWAY, RFC 9113
/// §6.8) once `after` requests have arrived on it, answering each after 20 ms: streams
/// it took are answered, streams that cross its GOAWAY are refused unprocessed.
async fn leaving_pod(after: usize) -> H2Pod {
    let listener = TcpListener::bind(loopback()).await.expect("bind pod");
    let addr = listener.local_addr().expect("pod addr");
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = connections.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            let arrived = Arc::new(AtomicUsize::new(0));
            let leave = Arc::new(tokio::sync::Notify::new());
            let (seen, told) = (arrived.clone(), leave.clone());
            let service = service_fn(move |req: Request<Incoming>| {
                if seen.fetch_add(1, Ordering::SeqCst) + 1 == after {
                    told.notify_one();
                }
                async move {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    let _ = req.into_body().collect().await;
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(
                        b"leaving: answered",
                    ))))
                }
            });
            tokio::spawn(async move {
                let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service);
                tokio::pin!(conn);
                tokio::select! {
                    _ = conn.as_mut() => return,
                    () = leave.notified() => conn.as_mut().graceful_shutdown(),
                }
                let _ = conn.await;
            });
        }
    });
    H2Pod { addr, connections }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pods_goaway_fails_no_request() {
    let leaving = leaving_pod(5).await;
    let pod = h2_pod("pod-b", 100, Duration::from_millis(5)).await;
    let proxy = TestProxy::start(vec![(
        service("shop", "api", &[], &[("retries", "2")]),
        vec![
            h2c_endpoint("leaving", leaving.addr),
            h2c_endpoint("pod-b", pod.addr),
        ],
    )])
    .await;
    let client = h2c_client();
    // Many at once, so that streams cross the GOAWAY on the leaving pod's connections.
    for _ in 0..3 {
        let calls = (0..40).map(|_| {
            let (client, request) = (client.clone(), post(&proxy, "payload"));
            async move { send(&client, request).await }
        });
        for reply in futures_util::future::join_all(calls).await {
            assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
        }
    }
    // Its connections went away in turn, and new ones took their place.
    assert!(leaving.connections.load(Ordering::SeqCst) >= 2);
}

/// A pod speaking raw HTTP/2 frames that answers the first request it sees with a
/// GOAWAY whose last stream id is 0: it processed none of them (RFC 9113 §6.8). Counts
/// the requests it turned away.
async fn goaway_at_once_pod() -> (SocketAddr, Arc<AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const SETTINGS: [u8; 9] = [0, 0, 0, 4, 0, 0, 0, 0, 0];
    const SETTINGS_ACK: [u8; 9] = [0, 0, 0, 4, 1, 0, 0, 0, 0];
    const GOAWAY_NONE_PROCESSED: [u8; 17] = [0, 0, 8, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    let listener = TcpListener::bind(loopback()).await.expect("bind pod");
    let addr = listener.local_addr().expect("pod addr");
    let turned_away = Arc::new(AtomicUsize::new(0));
    let counted = turned_away.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let counted = counted.clone();
            tokio::spawn(async move {
                let mut preface = [0u8; 24];
                if stream.read_exact(&mut preface).await.is_err() {
                    return;
                }
                let _ = stream.write_all(&SETTINGS).await;
                let mut header = [0u8; 9];
                while stream.read_exact(&mut header).await.is_ok() {
                    let length = u32::from_be_bytes([0, header[0], header[1], header[2]]);
                    let mut payload = vec![0u8; length as usize];
                    if stream.read_exact(&mut payload).await.is_err() {
                        return;
                    }
                    match (header[3], header[4] & 1) {
                        (4, 0) => {
                            let _ = stream.write_all(&SETTINGS_ACK).await;
                        }
                        (1, _) => {
                            counted.fetch_add(1, Ordering::SeqCst);
                            let _ = stream.write_all(&GOAWAY_NONE_PROCESSED).await;
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            return;
                        }
                        _ => {}
                    }
                }
            });
        }
    });
    (addr, turned_away)
}

#[tokio::test]
async fn requests_above_a_pods_goaway_go_to_another_pod_with_their_body() {
    let (leaving, turned_away) = goaway_at_once_pod().await;
    posts_pass_a_pod_that_turns_them_away(("leaving", leaving), &turned_away, 10).await;
}

/// A TCP relay to `target` whose open connections can be frozen: nothing passes on them
/// either way any more, and nothing closes (a pod gone silent: its node lost, the
/// network cut). Connections opened after a freeze pass.
struct Relay {
    addr: SocketAddr,
    /// Connections numbered below this are frozen.
    frozen_below: Arc<AtomicUsize>,
    opened: Arc<AtomicUsize>,
}

impl Relay {
    async fn to(target: SocketAddr) -> Self {
        let listener = TcpListener::bind(loopback()).await.expect("bind relay");
        let addr = listener.local_addr().expect("relay addr");
        let (frozen_below, opened) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (frozen, count) = (frozen_below.clone(), opened.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(pod) = tokio::net::TcpStream::connect(target).await else {
                    continue;
                };
                let number = count.fetch_add(1, Ordering::SeqCst);
                let (client_read, client_write) = client.into_split();
                let (pod_read, pod_write) = pod.into_split();
                tokio::spawn(relay_one_way(
                    client_read,
                    pod_write,
                    number,
                    frozen.clone(),
                ));
                tokio::spawn(relay_one_way(
                    pod_read,
                    client_write,
                    number,
                    frozen.clone(),
                ));
            }
        });
        Self {
            addr,
            frozen_below,
            opened,
        }
    }

    /// Freeze every connection open now.
    fn freeze(&self) {
        self.frozen_below
            .store(self.opened.load(Ordering::SeqCst), Ordering::SeqCst);
    }
}

async fn relay_one_way(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    number: usize,
    frozen_below: Arc<AtomicUsize>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let Ok(n) = from.read(&mut buf).await else {
            return;
        };
        if number < frozen_below.load(Ordering::SeqCst) {
            // Hold both halves open, passing nothing.
            std::future::pending::<()>().await;
        }
        if n == 0 || to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_to_a_pod_gone_silent_is_found_dead_by_its_pings() {
    let pod = h2_pod("pod-a", 100, Duration::ZERO).await;
    let relay = Relay::to(pod.addr).await;
    let config = ProxyConfig {
        h2_ping_interval: Duration::from_millis(200),
        ..ProxyConfig::default()
    };
    let proxy = TestProxy::start_with(
        config,
        vec![(
            service("shop", "api", &[], &[("timeout", "3s")]),
            vec![h2c_endpoint("pod-a", relay.addr)],
        )],
    )
    .await;
    let client = h2c_client();
    let reply = get(&client, &proxy.url("/"), &[("x-service", "api.shop")]).await;
    assert_eq!(reply.status, StatusCode::OK);
    relay.freeze();
    // An unanswered ping (200 ms, then 200 ms to answer) closes the frozen connection;
    // the next request takes a new one instead of waiting out its timeout on it.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let started = std::time::Instant::now();
    let reply = get(&client, &proxy.url("/"), &[("x-service", "api.shop")]).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(relay.opened.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_larger_than_the_flow_control_windows_pass_both_ways() {
    let pod = h2_pod("pod-a", 100, Duration::ZERO).await;
    let proxy = TestProxy::start(vec![(
        service("shop", "api", &[], &[]),
        vec![h2c_endpoint("pod-a", pod.addr)],
    )])
    .await;
    // 3 MiB: beyond HTTP/2's 64 KiB initial windows and hyper's larger ones, so both
    // the request and the echoed response wait on WINDOW_UPDATEs on both hops.
    let payload = "x".repeat(3 << 20);
    for client in [http1_client(), h2c_client()] {
        let request = Request::post(proxy.url("/big"))
            .header("x-service", "api.shop")
            .body(full(payload.clone()))
            .expect("request");
        let reply = send(&client, request).await;
        assert_eq!(reply.status, StatusCode::OK);
        let seen = String::from_utf8_lossy(&reply.body);
        let body = seen.split_once(" body=").map(|(_, b)| b).unwrap_or("");
        assert_eq!(body.len(), payload.len());
    }
}
