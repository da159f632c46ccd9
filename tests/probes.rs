//! Background probes of evicted pods, as the pods see them, through the real `proxima`
//! binary: `GET <qos-pool-probe-path>` by default, and with `qos-pool-probe: traffic` the
//! method, path, query and headers of the service's recent idempotent, body-less
//! requests (never a request with a body, never the client's `x-forwarded-for`).
//!
//! The slow pod is a small HTTP server written for the test that records every request
//! it gets and answers after 200 ms, so it leaves a 50 ms pool and is probed.
//!
//! Needs the binary: `cargo build -p proxima` first.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

#[path = "support/binary.rs"]
mod binary;

use binary::*;

/// One request as the pod saw it.
#[derive(Clone, Debug)]
struct Seen {
    method: Method,
    uri: String,
    headers: HeaderMap,
    body_bytes: usize,
}

impl Seen {
    fn is_probe(&self) -> bool {
        self.headers.contains_key("x-proxima-probe")
    }
}

/// A pod that records what it receives and answers `200` after `delay`.
async fn recording_pod(delay: Duration) -> (SocketAddr, Arc<Mutex<Vec<Seen>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let log = log.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req: Request<Incoming>| {
                    let log = log.clone();
                    async move {
                        let (parts, body) = req.into_parts();
                        let body_bytes = body.collect().await.map_or(0, |b| b.to_bytes().len());
                        log.lock().unwrap().push(Seen {
                            method: parts.method,
                            uri: parts.uri.to_string(),
                            headers: parts.headers,
                            body_bytes,
                        });
                        tokio::time::sleep(delay).await;
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
                    }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, seen)
}

async fn send(http: &HttpClient, proxy: SocketAddr, method: Method, path: &str) -> StatusCode {
    let request = Request::builder()
        .method(method)
        .uri(format!("http://{proxy}{path}"))
        .header("x-service", "dps")
        .header("x-tenant", "7")
        .header("authorization", "Bearer test-token")
        .body(Empty::<Bytes>::new())
        .expect("request");
    let response = tokio::time::timeout(PATIENCE, http.request(request))
        .await
        .expect("answer in time")
        .expect("answer");
    let status = response.status();
    let _ = response.into_body().collect().await;
    status
}

/// A POST with a body (which must never become a probe).
async fn post(proxy: SocketAddr) {
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let request = Request::post(format!("http://{proxy}/api/orders"))
        .header("x-service", "dps")
        .body(Full::new(Bytes::from_static(b"{\"order\":1}")))
        .expect("request");
    let response = http.request(request).await.expect("answer");
    assert_eq!(response.status(), StatusCode::OK);
}

/// Start proxima on a service of a fast pod and the recording slow pod; returns them.
async fn start(
    dir: &TempDir,
    probe: &str,
) -> (Proxima, proxima_emulate::Backend, Arc<Mutex<Vec<Seen>>>) {
    let fast = backend("fast").await;
    let (slow, seen) = recording_pod(Duration::from_millis(200)).await;
    let path = dir.0.join("topology.yaml");
    let text = format!(
        "services:\n  - name: dps\n    settings: {{ latency-slo: 50ms, qos-pool-min-samples: 1, \
         qos-pool-window: 4, qos-pool-probe-interval: 100ms, qos-pool-probe-max-interval: 200ms, \
         qos-pool-probe-path: /healthz{probe} }}\n    endpoints:\n      \
         - {{ id: fast, address: '{}' }}\n      - {{ id: slow, address: '{slow}' }}\n",
        fast.addr()
    );
    std::fs::write(&path, text).unwrap();
    let discovery = format!("file:{}", path.display());
    let proxima = Proxima::start(&["run", "--discovery", &discovery]).await;
    (proxima, fast, seen)
}

/// Wait until the slow pod received `n` probes; returns everything it received.
async fn probes(seen: &Arc<Mutex<Vec<Seen>>>, n: usize) -> Vec<Seen> {
    eventually("probes reach the evicted pod", || async {
        let all = seen.lock().unwrap().clone();
        (all.iter().filter(|s| s.is_probe()).count() >= n).then_some(all)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traffic_shaped_probes_repeat_recent_idempotent_requests() {
    let dir = TempDir::new("probes-traffic");
    let (proxima, _fast, seen) = start(&dir, ", qos-pool-probe: traffic").await;
    let http = client();
    // Until the slow pod had a real request (and left the pool), and at least 12.
    let mut i = 0;
    while i < 12 || !seen.lock().unwrap().iter().any(|s| !s.is_probe()) {
        assert!(i < 500, "the slow pod never got a request");
        let path = if i % 2 == 0 {
            "/api/items?page=2"
        } else {
            "/api/items/42"
        };
        assert_eq!(
            send(&http, proxima.proxy, Method::GET, path).await,
            StatusCode::OK
        );
        i += 1;
    }
    // Requests with a body, and non-idempotent ones, are never imitated.
    for _ in 0..5 {
        post(proxima.proxy).await;
    }
    let all = probes(&seen, 5).await;
    // The first probe of a new pod is sent at start-up: with nothing to imitate yet it
    // uses the probe path. Every later one imitates a recent request.
    let mut probes: Vec<&Seen> = all.iter().filter(|s| s.is_probe()).collect();
    if probes.first().is_some_and(|p| p.uri == "/healthz") {
        probes.remove(0);
    }
    assert!(!probes.is_empty(), "{all:?}");
    for probe in &probes {
        assert_eq!(probe.method, Method::GET, "{probe:?}");
        assert!(
            probe.uri == "/api/items?page=2" || probe.uri == "/api/items/42",
            "{probe:?}"
        );
        assert_eq!(probe.headers["x-tenant"], "7", "{probe:?}");
        assert_eq!(probe.headers["authorization"], "Bearer test-token");
        assert_eq!(probe.headers["x-service"], "dps");
        assert!(
            !probe.headers.contains_key("x-forwarded-for"),
            "the client's address is not replayed: {probe:?}"
        );
        assert_eq!(probe.body_bytes, 0);
    }
    // The two shapes take turns.
    let uris: std::collections::BTreeSet<&str> = probes.iter().map(|p| p.uri.as_str()).collect();
    assert_eq!(uris.len(), 2, "{probes:?}");
    // Real requests that reached the slow pod carry no probe mark.
    assert!(all.iter().any(|s| !s.is_probe()), "{all:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_probes_are_the_default() {
    let dir = TempDir::new("probes-path");
    let (proxima, _fast, seen) = start(&dir, "").await;
    let http = client();
    let mut i = 0;
    while i < 6 || !seen.lock().unwrap().iter().any(|s| !s.is_probe()) {
        assert!(i < 500, "the slow pod never got a request");
        assert_eq!(
            send(&http, proxima.proxy, Method::GET, "/api/items?page=2").await,
            StatusCode::OK
        );
        i += 1;
    }
    let all = probes(&seen, 2).await;
    for probe in all.iter().filter(|s| s.is_probe()) {
        assert_eq!(probe.method, Method::GET);
        assert_eq!(probe.uri, "/healthz");
        assert_eq!(probe.headers["user-agent"], "proxima-probe");
        assert!(!probe.headers.contains_key("x-tenant"), "{probe:?}");
    }
}
