//! The HTTP data plane end to end: a real proxy on a loopback socket, real backends
//! (`proxima-emulate` pods, plus a connection-resetting one), real clients (hyper
//! HTTP/1.1 and h2c, raw TCP, curl). The router is built directly from services and
//! endpoints; no discovery is involved.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use http::{Method, Request, StatusCode, Version};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use proxima_core::explain::EndpointExplain;
use proxima_core::{Conditions, Router};
use proxima_proxy::ProxyConfig;

const MIB: usize = 1024 * 1024;

fn explain(router: &Router, service: &str, id: &str) -> EndpointExplain {
    router
        .explain(Instant::now())
        .services
        .into_iter()
        .find(|s| s.service == service)
        .unwrap_or_else(|| panic!("service {service} in explain"))
        .endpoints
        .into_iter()
        .find(|e| e.id == id)
        .unwrap_or_else(|| panic!("endpoint {id} of {service} in explain"))
}

fn in_pool(router: &Router, service: &str, id: &str) -> bool {
    let e = explain(router, service, id);
    let pool_has_it = router
        .table()
        .services
        .values()
        .find(|r| r.key().to_string() == service)
        .is_some_and(|r| r.pool().iter().any(|&i| r.endpoints[i].endpoint.id == id));
    assert_eq!(e.in_pool, pool_has_it, "explain and pool() agree");
    pool_has_it
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_by_header_and_by_every_host_form() {
    let api_http = backend("api-http").await;
    let api_admin = backend("api-admin").await;
    let web = backend("web").await;
    let proxy = TestProxy::start(vec![
        (
            service("shop", "api", &[("http", 80), ("admin", 81)], &[]),
            vec![endpoint_ports(
                "api-0",
                &[
                    ("http", api_http.addr().port()),
                    ("admin", api_admin.addr().port()),
                ],
            )],
        ),
        (
            service("default", "web", &[], &[]),
            vec![endpoint("web-0", web.addr())],
        ),
    ])
    .await;
    let client = http1_client();
    let url = proxy.url("/hello?x=1");

    for (named, expected) in [
        ("api.shop", "api-http"),
        ("api.shop:http", "api-http"),
        ("api.shop:80", "api-http"),
        ("api.shop:admin", "api-admin"),
        ("api.shop:81", "api-admin"),
        ("api.shop.svc", "api-http"),
        ("api.shop.svc:admin", "api-admin"),
        ("api.shop.svc.cluster.local", "api-http"),
        ("api.shop.svc.cluster.local:admin", "api-admin"),
        ("web", "web"),
        ("web.default", "web"),
        // A service declared without ports takes any port number.
        ("web:8080", "web"),
    ] {
        let reply = get(&client, &url, &[("x-service", named)]).await;
        assert_eq!(reply.status, StatusCode::OK, "x-service: {named}");
        assert_eq!(reply.backend(), expected, "x-service: {named}");
    }

    for (host, expected) in [
        ("api.shop", "api-http"),
        ("api.shop:80", "api-http"),
        ("api.shop:81", "api-admin"),
        ("api.shop.svc", "api-http"),
        ("api.shop.svc:81", "api-admin"),
        ("api.shop.svc.cluster.local", "api-http"),
        ("api.shop.svc.cluster.local:81", "api-admin"),
        ("API.Shop.svc.cluster.local.", "api-http"),
        ("web", "web"),
        ("web:80", "web"),
        ("web.default.svc.cluster.local", "web"),
    ] {
        let reply = get(&client, &url, &[("host", host)]).await;
        assert_eq!(reply.status, StatusCode::OK, "Host: {host}");
        assert_eq!(reply.backend(), expected, "Host: {host}");
        let echo = reply.json();
        assert_eq!(echo["path"], "/hello");
        assert_eq!(echo["query"], "x=1");
        // The client's Host reaches the pod unchanged.
        assert_eq!(echo["headers"]["host"], host);
    }

    // The header wins over Host.
    let reply = get(
        &client,
        &url,
        &[("host", "web"), ("x-service", "api.shop:admin")],
    )
    .await;
    assert_eq!(reply.backend(), "api-admin");

    // curl, by Host.
    let (ok, out) = curl(vec![
        "-H".into(),
        "Host: api.shop.svc.cluster.local:81".into(),
        proxy.url("/curl"),
    ])
    .await;
    assert!(ok, "curl failed: {out}");
    let echo: serde_json::Value = serde_json::from_str(&out).expect("curl got the JSON echo");
    assert_eq!(echo["backend"], "api-admin");
    assert_eq!(echo["path"], "/curl");

    assert_eq!(
        proxy.metric(r#"proxima_picks_total{reason="pool",service="api.shop"}"#),
        19.0
    );
    assert!(
        proxy
            .metric(r#"proxima_requests_total{code="200",endpoint="web-0",service="web.default"}"#)
            >= 3.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_is_a_json_answer_with_its_status() {
    let good = backend("good").await;
    let slow = backend_with(BackendConfig::new("slow").delay(Duration::from_secs(5))).await;
    let idle = backend("idle").await;
    let dead = dead_addr().await;
    let not_ready = Conditions {
        ready: false,
        serving: false,
        terminating: false,
    };
    let proxy = TestProxy::start(vec![
        (
            service("shop", "api", &[("http", 80)], &[]),
            vec![endpoint_ports("api-0", &[("http", good.addr().port())])],
        ),
        (service("shop", "empty", &[], &[]), vec![]),
        (
            service("shop", "idle", &[], &[]),
            vec![endpoint("idle-0", idle.addr()).with_conditions(not_ready)],
        ),
        (
            service("shop", "down", &[], &[]),
            vec![endpoint("down-0", dead)],
        ),
        (
            service("shop", "slow", &[], &[("timeout", "300ms")]),
            vec![endpoint("slow-0", slow.addr())],
        ),
    ])
    .await;
    let client = http1_client();
    let url = proxy.url("/");

    let reply = get(&client, &url, &[("x-service", "nope.shop")]).await;
    reply.assert_error(StatusCode::NOT_FOUND, "unknown service");
    assert_eq!(reply.json()["service"], "nope.shop");

    for named in ["api.shop:9999", "api.shop:grpc"] {
        let reply = get(&client, &url, &[("x-service", named)]).await;
        reply.assert_error(StatusCode::NOT_FOUND, "unknown port");
    }

    // No service named: Host is the proxy's own address, an IP.
    let reply = get(&client, &url, &[]).await;
    reply.assert_error(StatusCode::BAD_REQUEST, "no service named");
    for (name, value) in [
        ("x-service", "bad name!"),
        ("x-service", ""),
        ("x-service", "api.shop.svc.other.domain"),
        ("host", "[::1]:80"),
    ] {
        let reply = get(&client, &url, &[(name, value)]).await;
        reply.assert_error(StatusCode::BAD_REQUEST, "no service named");
    }
    // A Host whose port is not digits is no host[:port] at all (RFC 9112 §3.2): refused
    // before any service is looked for.
    let reply = get(&client, &url, &[("host", "api.shop:admin")]).await;
    reply.assert_error(StatusCode::BAD_REQUEST, "bad host");
    // Raw requests: HTTP/1.0 naming nothing, HTTP/1.1 without the Host it must have
    // (RFC 9112 §3.2), and a service name that is not ASCII.
    let raw = raw_exchange(proxy.addr, b"GET / HTTP/1.0\r\n\r\n").await;
    assert!(raw.starts_with("HTTP/1.0 400"), "{raw}");
    assert!(raw.contains(r#""error":"no service named""#), "{raw}");
    let raw = raw_exchange(proxy.addr, b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n").await;
    assert!(raw.starts_with("HTTP/1.1 400"), "{raw}");
    assert!(raw.contains(r#""error":"bad host""#), "{raw}");
    let raw = raw_exchange(
        proxy.addr,
        b"GET / HTTP/1.1\r\nHost: x\r\nx-service: caf\xe9\xff\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(raw.starts_with("HTTP/1.1 400"), "{raw}");

    for named in ["empty.shop", "idle.shop"] {
        let reply = get(&client, &url, &[("x-service", named)]).await;
        reply.assert_error(StatusCode::SERVICE_UNAVAILABLE, "no ready endpoints");
    }
    assert_eq!(idle.hits(), 0);

    let reply = get(&client, &url, &[("x-service", "down.shop")]).await;
    reply.assert_error(StatusCode::BAD_GATEWAY, "upstream unavailable");
    assert_eq!(reply.json()["service"], "down.shop");

    let reply = get(&client, &url, &[("x-service", "slow.shop")]).await;
    reply.assert_error(StatusCode::GATEWAY_TIMEOUT, "upstream timeout");

    // Header size: our own limit (16 KiB) answers with JSON; just below it passes.
    let big = "b".repeat(20 * 1024);
    let reply = get(&client, &url, &[("x-service", "api.shop"), ("x-big", &big)]).await;
    reply.assert_error(
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        "request headers too large",
    );
    let many: Vec<(String, String)> = (0..40)
        .map(|i| (format!("x-h{i}"), "m".repeat(500)))
        .collect();
    let mut headers: Vec<(&str, &str)> =
        many.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    headers.push(("x-service", "api.shop"));
    let reply = get(&client, &url, &headers).await;
    reply.assert_error(
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        "request headers too large",
    );
    let fits = "f".repeat(15 * 1024);
    let reply = get(
        &client,
        &url,
        &[("x-service", "api.shop"), ("x-fits", &fits)],
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    // Far beyond hyper's read buffer, hyper refuses on its own with 431 (plain) and
    // closes the connection; the client may see the reset before the answer.
    let huge = "h".repeat(600 * 1024);
    let request =
        format!("GET / HTTP/1.1\r\nHost: api.shop\r\nx-huge: {huge}\r\nConnection: close\r\n\r\n");
    let raw = raw_exchange(proxy.addr, request.as_bytes()).await;
    assert!(
        raw.is_empty() || raw.starts_with("HTTP/1.1 431"),
        "{}",
        &raw[..raw.len().min(200)]
    );

    // The proxy still serves after all that.
    let reply = get(&client, &url, &[("x-service", "api.shop")]).await;
    assert_eq!(reply.status, StatusCode::OK);

    let m = |s: &str| proxy.metric(s);
    assert_eq!(
        m(r#"proxima_requests_total{code="404",endpoint="",service=""}"#),
        1.0
    );
    assert_eq!(
        m(r#"proxima_requests_total{code="404",endpoint="",service="api.shop"}"#),
        2.0
    );
    assert_eq!(
        m(r#"proxima_requests_total{code="503",endpoint="",service="idle.shop"}"#),
        1.0
    );
    assert_eq!(
        m(r#"proxima_requests_total{code="error",endpoint="down-0",service="down.shop"}"#),
        1.0
    );
    assert_eq!(
        m(r#"proxima_upstream_errors_total{endpoint="down-0",kind="connect",service="down.shop"}"#),
        1.0
    );
    assert_eq!(
        m(r#"proxima_upstream_errors_total{endpoint="slow-0",kind="timeout",service="slow.shop"}"#),
        1.0
    );
    assert_eq!(
        m(r#"proxima_slo_total{result="missed",service="slow.shop"}"#),
        1.0
    );
    assert!(m(r#"proxima_requests_total{code="431",endpoint="",service=""}"#) >= 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_connections_are_retried_elsewhere_with_the_streaming_body() {
    let good = backend("good").await;
    let dead = dead_addr().await;
    // Round robin makes the first pick the dead endpoint (ids are ordered).
    let proxy = TestProxy::start(vec![(
        service("shop", "api", &[], &[("strategy", "round-robin")]),
        vec![endpoint("a-dead", dead), endpoint("b-good", good.addr())],
    )])
    .await;
    let client = http1_client();

    let payload: Bytes = pattern(0, MIB).into();
    let req = Request::post(proxy.url("/echo"))
        .header("x-service", "api.shop")
        .body(full(payload.clone()))
        .expect("request");
    let reply = send(&client, req).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.backend(), "good");
    assert_eq!(reply.body, payload, "the POST body survived the retry");
    assert_one_retry_after(&proxy, "a-dead", "connect");

    // The dead endpoint cools down; every request keeps succeeding.
    for _ in 0..10 {
        let reply = get(&client, &proxy.url("/"), &[("x-service", "api.shop")]).await;
        assert_eq!(reply.status, StatusCode::OK);
    }
    assert!(explain(&proxy.router, "api.shop", "a-dead").failures >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sent_post_is_not_replayed_but_an_idempotent_get_is() {
    let resetter = Resetter::spawn().await;
    let good = backend("good").await;
    let proxy = TestProxy::start(vec![(
        service("shop", "api", &[], &[("strategy", "round-robin")]),
        vec![
            endpoint("a-reset", resetter.addr),
            endpoint("b-good", good.addr()),
        ],
    )])
    .await;
    let client = http1_client();

    // First pick: the resetter. The GET was sent and reset, then replayed on b-good.
    let reply = get(&client, &proxy.url("/get"), &[("x-service", "api.shop")]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.backend(), "good");
    assert_eq!(resetter.hits(), 1);
    assert_eq!(good.hits(), 1);
    assert_one_retry_after(&proxy, "a-reset", "reset");

    // Round robin counts every pick, the retry's too: the next request starts on the
    // resetter again and is replayed again.
    let reply = get(&client, &proxy.url("/get"), &[("x-service", "api.shop")]).await;
    assert_eq!(reply.backend(), "good");
    assert_eq!((resetter.hits(), good.hits()), (2, 2));

    // Fifth pick: the resetter. A POST that reached it is not replayed.
    let req = Request::post(proxy.url("/post"))
        .header("x-service", "api.shop")
        .body(full("order #1"))
        .expect("request");
    let reply = send(&client, req).await;
    reply.assert_error(StatusCode::BAD_GATEWAY, "upstream error");
    assert_eq!(resetter.hits(), 3);
    assert_eq!(good.hits(), 2, "the POST never reached b-good");
    assert_eq!(
        proxy.metric(r#"proxima_retries_total{service="api.shop"}"#),
        2.0
    );
    assert_eq!(
        proxy.metric(
            r#"proxima_requests_total{code="error",endpoint="a-reset",service="api.shop"}"#
        ),
        1.0
    );
}

/// `api.shop` counted one retry, after one upstream error of `kind` at `endpoint`.
fn assert_one_retry_after(proxy: &TestProxy, endpoint: &str, kind: &str) {
    assert_eq!(
        proxy.metric(r#"proxima_retries_total{service="api.shop"}"#),
        1.0
    );
    let errors = format!(
        r#"proxima_upstream_errors_total{{endpoint="{endpoint}",kind="{kind}",service="api.shop"}}"#
    );
    assert_eq!(proxy.metric(&errors), 1.0, "{errors}");
}

/// A pod that answers the first request it gets and a broken status line to every
/// later one; it counts the connections it accepted.
async fn answers_once_then_garbles() -> (std::net::SocketAddr, Arc<AtomicU64>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind(loopback())
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let connections = Arc::new(AtomicU64::new(0));
    let accepted = connections.clone();
    tokio::spawn(async move {
        let answered = Arc::new(AtomicU64::new(0));
        while let Ok((mut stream, _)) = listener.accept().await {
            accepted.fetch_add(1, Ordering::SeqCst);
            let answered = answered.clone();
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut buf = [0u8; 4096];
                loop {
                    // A head, and the body its Content-Length announces.
                    let end = loop {
                        if let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                            break end + 4;
                        }
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => seen.extend_from_slice(&buf[..n]),
                        }
                    };
                    let head = String::from_utf8_lossy(&seen[..end]).to_ascii_lowercase();
                    let length: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .map_or(0, |v| v.trim().parse().expect("length"));
                    while seen.len() < end + length {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => seen.extend_from_slice(&buf[..n]),
                        }
                    }
                    seen.drain(..end + length);
                    if answered.fetch_add(1, Ordering::SeqCst) == 0 {
                        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nfirst";
                        if stream.write_all(ok).await.is_err() {
                            return;
                        }
                    } else {
                        let _ = stream.write_all(b"NOT HTTP\r\n\r\n").await;
                        return;
                    }
                }
            });
        }
    });
    (addr, connections)
}

/// A body-less GET that goes out on a connection hyper's client drives (left in the
/// pool by a request with a body) and fails there after being sent is retried on
/// another pod, as on the proxy's own exchange: the request comes back from hyper's
/// path too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_failed_on_a_pooled_hyper_connection_is_retried_on_another_pod() {
    let (flaky, connections) = answers_once_then_garbles().await;
    let good = backend("good").await;
    let proxy = TestProxy::start(vec![(
        service("shop", "api", &[], &[("strategy", "round-robin")]),
        vec![endpoint("a-flaky", flaky), endpoint("b-good", good.addr())],
    )])
    .await;
    let client = http1_client();

    // First pick: a-flaky, which answers this PUT; its connection, driven by hyper's
    // client (the request had a body), goes back to the pool.
    let req = Request::put(proxy.url("/put"))
        .header("x-service", "api.shop")
        .body(full("x"))
        .expect("request");
    let reply = send(&client, req).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(&reply.body[..], b"first");
    // Second pick: b-good.
    let reply = get(&client, &proxy.url("/get"), &[("x-service", "api.shop")]).await;
    assert_eq!(reply.backend(), "good");

    // Third pick: a-flaky again, on the pooled connection; the answer does not parse,
    // so the GET goes to b-good.
    let reply = get(&client, &proxy.url("/get"), &[("x-service", "api.shop")]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.backend(), "good");
    assert_eq!(good.hits(), 2);
    assert_eq!(
        connections.load(Ordering::SeqCst),
        1,
        "the GET went out on the PUT's connection"
    );
    assert_one_retry_after(&proxy, "a-flaky", "protocol");
}

/// A body fed from a channel, so the test decides when each chunk goes out.
fn channel_body() -> (tokio::sync::mpsc::Sender<Bytes>, Body) {
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(4);
    let frames = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|chunk| (Ok::<_, BoxError>(Frame::data(chunk)), rx))
    });
    (tx, StreamBody::new(frames).boxed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_bodies_stream_both_ways_without_buffering() {
    const TOTAL: usize = 64 * MIB;
    let bulk = backend("bulk").await;
    let proxy = TestProxy::start(vec![(
        service("shop", "bulk", &[], &[]),
        vec![endpoint("bulk-0", bulk.addr())],
    )])
    .await;
    let client = http1_client();

    // Download: 64 MiB from the pod, checked by length and checksum.
    let req = Request::get(proxy.url(&format!("/stream?bytes={TOTAL}")))
        .header("x-service", "bulk.shop")
        .body(empty())
        .expect("request");
    let response = within("download headers", client.request(req))
        .await
        .expect("response");
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let mut received = 0usize;
    let mut checksum = Checksum::default();
    let mut first = true;
    while let Some(frame) = within("download frame", body.frame()).await {
        let frame = frame.expect("download frame");
        if let Some(data) = frame.data_ref() {
            checksum.update(data);
            received += data.len();
            if first {
                first = false;
                // The in-flight count covers the body, not just the headers.
                assert_eq!(explain(&proxy.router, "bulk.shop", "bulk-0").in_flight, 1);
            }
        }
    }
    assert_eq!(received, TOTAL);
    let mut expected = Checksum::default();
    for offset in (0..TOTAL).step_by(MIB) {
        expected.update(&pattern(offset as u64, MIB));
    }
    assert_eq!(checksum, expected);
    eventually("in-flight back to 0", Duration::from_secs(10), || {
        explain(&proxy.router, "bulk.shop", "bulk-0").in_flight == 0
    })
    .await;

    // Upload: 64 MiB echoed back. Only the first MiB is sent before echoed bytes come
    // back; a proxy that buffered either body whole would never answer.
    let (tx, upload) = channel_body();
    let req = Request::post(proxy.url("/echo"))
        .header("x-service", "bulk.shop")
        .body(upload)
        .expect("request");
    let first_chunk = Bytes::from(pattern(0, MIB));
    tx.send(first_chunk).await.expect("first chunk");
    let response = within("upload headers", client.request(req))
        .await
        .expect("response");
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let mut received = 0usize;
    let mut checksum = Checksum::default();
    let mut rest = Some(tx);
    while let Some(frame) = within("echo frame", body.frame()).await {
        let frame = frame.expect("echo frame");
        if let Some(data) = frame.data_ref() {
            checksum.update(data);
            received += data.len();
        }
        if let Some(tx) = rest.take() {
            // Echoed bytes are back: send the remaining 63 MiB.
            tokio::spawn(async move {
                for offset in (MIB..TOTAL).step_by(MIB) {
                    if tx
                        .send(Bytes::from(pattern(offset as u64, MIB)))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
    }
    assert_eq!(received, TOTAL);
    assert_eq!(checksum, expected);

    // curl sends `Expect: 100-continue` with a body this large.
    let upload = pattern(3, 2 * MIB);
    let file = std::env::temp_dir().join(format!("proxima-dataplane-{}.bin", std::process::id()));
    std::fs::write(&file, &upload).expect("write upload file");
    let (ok, out) = curl(vec![
        "-H".into(),
        "x-service: bulk.shop".into(),
        "--data-binary".into(),
        format!("@{}", file.display()),
        proxy.url("/echo"),
    ])
    .await;
    let _ = std::fs::remove_file(&file);
    assert!(ok, "curl failed");
    assert_eq!(out.len(), upload.len());
    assert!(
        out.as_bytes() == upload.as_slice(),
        "curl got its body back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hop_by_hop_headers_are_dropped_both_ways_and_forwarding_headers_added() {
    let pod = backend("pod").await;
    let proxy = TestProxy::start(vec![(
        service("shop", "api", &[], &[]),
        vec![endpoint("pod-0", pod.addr())],
    )])
    .await;
    let client = http1_client();

    let reply = get(
        &client,
        &proxy.url("/"),
        &[
            ("x-service", "api.shop"),
            ("connection", "x-hop"),
            ("x-hop", "1"),
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "keep-alive"),
            ("proxy-authorization", "Basic Zm9vOmJhcg=="),
            ("te", "trailers"),
            ("x-keep", "yes"),
            ("x-forwarded-for", "10.1.2.3"),
            ("x-forwarded-proto", "https"),
        ],
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    let echo = reply.json();
    let seen = echo["headers"].as_object().expect("echoed headers");
    for dropped in [
        "connection",
        "x-hop",
        "keep-alive",
        "proxy-connection",
        "proxy-authorization",
        "te",
    ] {
        assert!(
            !seen.contains_key(dropped),
            "{dropped} reached the pod: {echo}"
        );
    }
    assert_eq!(seen["x-keep"], "yes");
    assert_eq!(seen["x-forwarded-for"], "10.1.2.3, 127.0.0.1");
    assert_eq!(seen["x-forwarded-proto"], "http");
    assert_eq!(seen["host"], proxy.addr.to_string());

    let reply = get(&client, &proxy.url("/"), &[("x-service", "api.shop")]).await;
    assert_eq!(
        reply.echoed_header("x-forwarded-for").as_deref(),
        Some("127.0.0.1")
    );

    // Towards the client: the pod's hop-by-hop headers are gone, the rest is kept.
    let reply = get(
        &client,
        &proxy.url("/headers"),
        &[("x-service", "api.shop")],
    )
    .await;
    assert_eq!(reply.status, StatusCode::CREATED);
    assert_eq!(reply.header("x-custom"), Some("kept"));
    assert_eq!(reply.header("x-drop-me"), None);
    assert_eq!(reply.header("keep-alive"), None);
    assert!(
        reply
            .header("connection")
            .is_none_or(|c| !c.contains("x-drop-me")),
        "{:?}",
        reply.headers
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_status_and_headers_pass_through() {
    let pod = backend("pod").await;
    let proxy = TestProxy::start(vec![(
        service("shop", "api", &[], &[]),
        vec![endpoint("pod-0", pod.addr())],
    )])
    .await;
    let client = http1_client();
    let at = |path: &str| proxy.url(path);
    let svc = [("x-service", "api.shop")];

    let reply = get(&client, &at("/status/201"), &svc).await;
    assert_eq!(reply.status, StatusCode::CREATED);
    assert_eq!(reply.backend(), "pod");
    assert_eq!(reply.header("content-type"), Some("application/json"));
    assert_eq!(reply.json()["backend"], "pod");

    // A 503 or 404 from the pod is the pod's, not the proxy's.
    for status in [503u16, 404, 500] {
        let reply = get(&client, &at(&format!("/status/{status}")), &svc).await;
        assert_eq!(reply.status.as_u16(), status);
        assert_eq!(reply.json()["backend"], "pod", "the pod's own body");
    }

    let reply = get(&client, &at("/status/204"), &svc).await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT);
    assert!(reply.body.is_empty());

    let req = Request::head(at("/"))
        .header("x-service", "api.shop")
        .body(empty())
        .expect("request");
    let reply = send(&client, req).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(reply.body.is_empty());

    for method in [Method::PUT, Method::DELETE, Method::PATCH, Method::OPTIONS] {
        let req = Request::builder()
            .method(method.clone())
            .uri(at("/m?q=1"))
            .header("x-service", "api.shop")
            .body(full("x"))
            .expect("request");
        let reply = send(&client, req).await;
        assert_eq!(reply.status, StatusCode::OK, "{method}");
        assert_eq!(reply.json()["method"], method.as_str());
        assert_eq!(reply.json()["body_bytes"], 1);
    }

    assert_eq!(
        proxy.metric(r#"proxima_requests_total{code="503",endpoint="pod-0",service="api.shop"}"#),
        1.0
    );
    // Sequential requests reuse one keep-alive connection to the pod.
    assert!(
        proxy.proxy.idle_connections() <= 3,
        "{}",
        proxy.proxy.idle_connections()
    );
    assert!(proxy.proxy.idle_connections() >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_endpoint_leaves_the_pool_and_returns_after_it_recovers() {
    let fast = backend("fast").await;
    let slow = backend("slow").await;
    let proxy = TestProxy::start(vec![(
        service(
            "shop",
            "api",
            &[],
            &[
                ("latency-slo", "80ms"),
                ("qos-pool-probe-interval", "100ms"),
                ("qos-pool-probe-max-interval", "400ms"),
            ],
        ),
        vec![endpoint("fast", fast.addr()), endpoint("slow", slow.addr())],
    )])
    .await;
    let client = http1_client();
    let svc = [("x-service", "api.shop")];
    let url = proxy.url("/");

    for _ in 0..10 {
        assert_eq!(get(&client, &url, &svc).await.status, StatusCode::OK);
    }
    assert!(in_pool(&proxy.router, "api.shop", "slow"));

    // 100 ms of processing: over the 80 ms SLO. The slack spread passes it over after
    // its first slow answer and the probes that follow take it out; under the even
    // spread client requests would. Either way within seconds, after few slow answers.
    slow.set_delay(Duration::from_millis(100));
    let leaving = Instant::now();
    let mut slow_answers = 0;
    while in_pool(&proxy.router, "api.shop", "slow") {
        assert!(
            leaving.elapsed() < Duration::from_secs(10),
            "slow endpoint still in the pool after {:?}",
            leaving.elapsed()
        );
        let reply = get(&client, &url, &svc).await;
        assert_eq!(reply.status, StatusCode::OK);
        slow_answers += usize::from(reply.backend() == "slow");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(slow_answers <= 10, "{slow_answers} slow answers to clients");
    let e = explain(&proxy.router, "api.shop", "slow");
    assert!(e.reason.starts_with("evicted"), "{}", e.reason);

    // Outside the pool it gets no client traffic.
    let before = explain(&proxy.router, "api.shop", "slow").requests;
    for _ in 0..20 {
        let reply = get(&client, &url, &svc).await;
        assert_eq!(reply.backend(), "fast");
    }
    assert_eq!(explain(&proxy.router, "api.shop", "slow").requests, before);

    // It recovers; background probes bring it back.
    slow.set_delay(Duration::ZERO);
    eventually("slow endpoint readmitted", Duration::from_secs(30), || {
        in_pool(&proxy.router, "api.shop", "slow")
    })
    .await;
    let m = |s: &str| proxy.metric(s);
    assert_eq!(
        m(r#"proxima_pool_changes_total{change="evicted",service="api.shop"}"#),
        1.0
    );
    assert_eq!(
        m(r#"proxima_pool_changes_total{change="readmitted",service="api.shop"}"#),
        1.0
    );
    assert!(m(r#"proxima_probes_total{result="met",service="api.shop"}"#) >= 3.0);

    // And takes client traffic again.
    let mut served_by_slow = false;
    for _ in 0..200 {
        if get(&client, &url, &svc).await.backend() == "slow" {
            served_by_slow = true;
            break;
        }
    }
    assert!(served_by_slow);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_ready_endpoints_never_receive_traffic() {
    let ready = backend("ready").await;
    let starting = backend("starting").await;
    let terminating = backend("terminating").await;
    let proxy = TestProxy::start(vec![(
        service("shop", "api", &[], &[]),
        vec![
            endpoint("ready", ready.addr()),
            endpoint("starting", starting.addr()).with_conditions(Conditions {
                ready: false,
                serving: false,
                terminating: false,
            }),
            endpoint("terminating", terminating.addr()).with_conditions(Conditions {
                ready: false,
                serving: true,
                terminating: true,
            }),
        ],
    )])
    .await;
    let client = http1_client();
    for _ in 0..40 {
        let reply = get(&client, &proxy.url("/"), &[("x-service", "api.shop")]).await;
        assert_eq!(reply.backend(), "ready");
    }
    // Long enough for background probes to have run, had any been due.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(starting.hits(), 0);
    assert_eq!(terminating.hits(), 0);
    assert_eq!(ready.client_hits(), 40);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_finishes_in_flight_requests_answering_new_connections_until_then() {
    // Long enough that a loaded machine still fits the request below into its drain.
    let slow = backend_with(BackendConfig::new("slow").delay(Duration::from_millis(4000))).await;
    let fast = backend("fast").await;
    let config = ProxyConfig {
        shutdown_grace: Duration::from_secs(30),
        ..ProxyConfig::default()
    };
    let mut proxy = TestProxy::start_with(
        config,
        vec![
            (
                service("shop", "api", &[], &[]),
                vec![endpoint("slow-0", slow.addr())],
            ),
            (
                service("shop", "web", &[], &[]),
                vec![endpoint("fast-0", fast.addr())],
            ),
        ],
    )
    .await;
    let client = http1_client();
    let url = proxy.url("/");
    let in_flight = tokio::spawn({
        let client = client.clone();
        async move { get(&client, &url, &[("x-service", "api.shop")]).await }
    });
    eventually("request reached the pod", Duration::from_secs(10), || {
        slow.client_hits() == 1
    })
    .await;

    proxy.begin_shutdown();
    // While the slow request drains, the port still answers, one request per connection.
    let started = Instant::now();
    let reply = get(
        &http1_client(),
        &proxy.url("/"),
        &[("x-service", "web.shop")],
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.backend(), "fast");
    assert_eq!(reply.headers["connection"], "close");
    assert!(
        started.elapsed() < Duration::from_millis(3000),
        "answered before the slow request finished"
    );
    // Once it has finished, the listener closes.
    let addr = proxy.addr;
    eventually("new connections refused", Duration::from_secs(10), || {
        std::net::TcpStream::connect(addr).is_err()
    })
    .await;
    let reply = within("in-flight request", in_flight)
        .await
        .expect("request task");
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.backend(), "slow");
    within("serve returns", proxy.server_stopped())
        .await
        .expect("serve ends cleanly");
}

#[tokio::test]
async fn a_client_that_connects_as_the_shutdown_begins_gets_its_one_answer() {
    // One thread: the proxy's loop runs only when this test waits, so the shutdown
    // signal and the new connection are both ready when it next looks, every time.
    let pod = backend("pod").await;
    for round in 0..20 {
        let mut proxy = TestProxy::start(vec![(
            service("shop", "web", &[], &[]),
            vec![endpoint("pod-0", pod.addr())],
        )])
        .await;
        proxy.begin_shutdown();
        let mut client = std::net::TcpStream::connect(proxy.addr).expect("connect");
        std::io::Write::write_all(
            &mut client,
            b"GET / HTTP/1.1\r\nhost: proxima\r\nx-service: web.shop\r\n\r\n",
        )
        .expect("send");
        client.set_nonblocking(true).expect("nonblocking");
        let mut client = tokio::net::TcpStream::from_std(client).expect("tokio stream");
        let mut answer = Vec::new();
        within(
            "answer",
            tokio::io::AsyncReadExt::read_to_end(&mut client, &mut answer),
        )
        .await
        .expect("read");
        let answer = String::from_utf8_lossy(&answer);
        assert!(
            answer.starts_with("HTTP/1.1 200"),
            "round {round}: {answer:?}"
        );
        assert!(
            answer.contains("connection: close"),
            "round {round}: {answer:?}"
        );
        within("serve returns", proxy.server_stopped())
            .await
            .expect("serve ends cleanly");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_still_running_after_the_grace_period_are_cut_off() {
    let stuck = backend_with(BackendConfig::new("stuck").delay(Duration::from_secs(40))).await;
    let grace = Duration::from_secs(2);
    let config = ProxyConfig {
        shutdown_grace: grace,
        ..ProxyConfig::default()
    };
    let mut proxy = TestProxy::start_with(
        config,
        vec![(
            service("shop", "api", &[], &[("timeout", "60s")]),
            vec![endpoint("stuck-0", stuck.addr())],
        )],
    )
    .await;
    let client = http1_client();
    let req = Request::get(proxy.url("/"))
        .header("x-service", "api.shop")
        .body(empty())
        .expect("request");
    let in_flight = tokio::spawn(async move { client.request(req).await });
    eventually("request reached the pod", Duration::from_secs(10), || {
        stuck.client_hits() == 1
    })
    .await;
    let shutdown = Instant::now();
    proxy.begin_shutdown();
    // The port stays open while the request drains, up to half the grace period.
    let addr = proxy.addr;
    eventually("new connections refused", Duration::from_secs(10), || {
        std::net::TcpStream::connect(addr).is_err()
    })
    .await;
    let refused_after = shutdown.elapsed();
    assert!(
        refused_after >= grace / 2 - Duration::from_millis(100),
        "listening until half the grace period: {refused_after:?}"
    );
    // Far sooner than the pod would answer.
    tokio::time::timeout(Duration::from_secs(20), proxy.server_stopped())
        .await
        .expect("serve returned after the grace period")
        .expect("serve ends cleanly");
    let result = tokio::time::timeout(Duration::from_secs(20), in_flight)
        .await
        .expect("client saw the connection close")
        .expect("client task");
    assert!(result.is_err(), "the cut-off request has no response");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_calls_get_the_proxys_own_errors_as_grpc_statuses() {
    let slow = backend_with(BackendConfig::new("slow").delay(Duration::from_secs(5))).await;
    let dead = dead_addr().await;
    let proxy = TestProxy::start(vec![
        (
            service("shop", "slow", &[], &[("timeout", "200ms")]),
            vec![endpoint("slow-0", slow.addr())],
        ),
        (
            service("shop", "gone", &[], &[("retries", "0")]),
            vec![endpoint("gone-0", dead)],
        ),
    ])
    .await;
    let client = h2c_client();
    let call = |service: &'static str, grpc: bool| {
        let mut req = Request::post(proxy.url("/inventory.Stock/Get"))
            .header("x-service", service)
            .header("te", "trailers");
        if grpc {
            req = req.header("content-type", "application/grpc");
        }
        send(
            &client,
            req.body(full(&b"\0\0\0\0\0"[..])).expect("request"),
        )
    };
    for (service, code) in [
        ("nowhere.shop", "12"),
        ("gone.shop", "14"),
        ("slow.shop", "4"),
    ] {
        let reply = call(service, true).await;
        assert_eq!(reply.status, StatusCode::OK, "{service}");
        assert_eq!(reply.headers["content-type"], "application/grpc");
        assert_eq!(reply.headers["grpc-status"], code, "{service}");
        assert!(!reply.headers["grpc-message"].is_empty());
        assert!(reply.body.is_empty(), "trailers-only: {:?}", reply.body);
    }
    // Not a gRPC call: the usual JSON.
    call("nowhere.shop", false)
        .await
        .assert_error(StatusCode::NOT_FOUND, "unknown service");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_prior_knowledge_works() {
    let pod = backend("pod").await;
    let proxy = TestProxy::start(vec![(
        service("shop", "api", &[], &[]),
        vec![endpoint("pod-0", pod.addr())],
    )])
    .await;

    // hyper, HTTP/2 only.
    let client = h2c_client();
    let reply = get(&client, &proxy.url("/h2?x=2"), &[("x-service", "api.shop")]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.version, Version::HTTP_2);
    let echo = reply.json();
    assert_eq!(echo["path"], "/h2");
    assert_eq!(echo["query"], "x=2");
    // The pod speaks HTTP/1.1 and gets a Host taken from :authority.
    assert_eq!(echo["headers"]["host"], proxy.addr.to_string());

    let payload: Bytes = pattern(7, 3 * MIB).into();
    let req = Request::post(proxy.url("/echo"))
        .header("x-service", "api.shop")
        .body(full(payload.clone()))
        .expect("request");
    let reply = send(&client, req).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.body, payload);

    // Routed by :authority alone.
    let stream = tokio::net::TcpStream::connect(proxy.addr)
        .await
        .expect("connect");
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .expect("h2 handshake");
    tokio::spawn(conn);
    let req = Request::get("http://api.shop.svc.cluster.local/by-authority")
        .body(empty())
        .expect("request");
    let response = within("h2 by authority", sender.send_request(req))
        .await
        .expect("response");
    assert_eq!(response.status(), StatusCode::OK);
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    let echo: serde_json::Value = serde_json::from_slice(&body).expect("JSON echo");
    assert_eq!(echo["headers"]["host"], "api.shop.svc.cluster.local");

    // An error answer over h2 is the same JSON.
    let reply = get(&client, &proxy.url("/"), &[("x-service", "nope.shop")]).await;
    reply.assert_error(StatusCode::NOT_FOUND, "unknown service");

    // curl, h2c with prior knowledge.
    let (ok, out) = curl(vec![
        "--http2-prior-knowledge".into(),
        "-H".into(),
        "x-service: api.shop".into(),
        proxy.url("/curl-h2"),
    ])
    .await;
    assert!(ok, "curl failed: {out}");
    let echo: serde_json::Value = serde_json::from_str(&out).expect("JSON echo");
    assert_eq!(echo["path"], "/curl-h2");
}
