//! The emulated pod against a real hyper client and raw TCP sockets.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use proxima_emulate::{pattern_bytes, Backend, BackendConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const PATIENCE: Duration = Duration::from_secs(20);

fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

type TestClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

fn client() -> TestClient {
    Client::builder(TokioExecutor::new()).build_http()
}

async fn get(client: &TestClient, url: String) -> (http::response::Parts, Bytes) {
    let response = tokio::time::timeout(PATIENCE, client.get(url.parse().unwrap()))
        .await
        .expect("response in time")
        .expect("response");
    let (parts, body) = response.into_parts();
    let body = body.collect().await.expect("body").to_bytes();
    (parts, body)
}

#[tokio::test]
async fn echoes_request_as_json_with_backend_header() {
    let backend = Backend::spawn(any_port(), BackendConfig::new("pod-a"))
        .await
        .unwrap();
    let request = Request::builder()
        .method(Method::PUT)
        .uri(format!("http://{}/some/path?x=1&y=2", backend.addr()))
        .header("x-test", "hello")
        .body(Full::new(Bytes::from(vec![7u8; 1234])))
        .unwrap();
    let response = client().request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["x-backend"], "pod-a");
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let echo: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(echo["backend"], "pod-a");
    assert_eq!(echo["method"], "PUT");
    assert_eq!(echo["path"], "/some/path");
    assert_eq!(echo["query"], "x=1&y=2");
    assert_eq!(echo["headers"]["x-test"], "hello");
    assert_eq!(echo["body_bytes"], 1234);
    assert_eq!(backend.hits(), 1);
    assert_eq!(backend.name(), "pod-a");
}

#[tokio::test]
async fn status_route_answers_the_requested_status() {
    let backend = Backend::spawn(any_port(), BackendConfig::new("s"))
        .await
        .unwrap();
    let client = client();
    for code in [200u16, 204, 404, 503] {
        let (parts, body) = get(&client, format!("http://{}/status/{code}", backend.addr())).await;
        assert_eq!(parts.status.as_u16(), code);
        assert_eq!(parts.headers["x-backend"], "s");
        if code == 204 {
            assert!(body.is_empty());
        }
    }
    let (parts, _) = get(&client, format!("http://{}/status/abc", backend.addr())).await;
    assert_eq!(parts.status, StatusCode::BAD_REQUEST);
    assert_eq!(backend.hits(), 5);
}

#[tokio::test]
async fn stream_route_sends_the_pattern_in_chunks() {
    let backend = Backend::spawn(any_port(), BackendConfig::new("s"))
        .await
        .unwrap();
    let total = 1_000_003usize;
    let url = format!("http://{}/stream?bytes={total}&chunk=4096", backend.addr());
    let response = client().get(url.parse().unwrap()).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let mut received = Vec::with_capacity(total);
    let mut frames = 0;
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            received.extend_from_slice(&data);
            frames += 1;
        }
    }
    assert_eq!(received.len(), total);
    assert_eq!(received, pattern_bytes(0, total));
    assert!(frames > 1, "the body arrived as {frames} frame(s)");

    let (parts, _) = get(&client(), format!("http://{}/stream", backend.addr())).await;
    assert_eq!(parts.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn echo_route_streams_the_body_back_before_the_request_ends() {
    let backend = Backend::spawn(any_port(), BackendConfig::new("e"))
        .await
        .unwrap();
    let (sender, receiver) =
        tokio::sync::mpsc::channel::<Result<http_body::Frame<Bytes>, std::io::Error>>(4);
    let body = StreamBody::new(Box::pin(tokio_stream_from(receiver)));
    let request = Request::builder()
        .method(Method::POST)
        .uri(format!("http://{}/echo", backend.addr()))
        .body(body)
        .unwrap();
    let client = Client::builder(TokioExecutor::new()).build_http();
    sender
        .send(Ok(http_body::Frame::data(Bytes::from_static(b"first "))))
        .await
        .unwrap();
    let response = tokio::time::timeout(PATIENCE, client.request(request))
        .await
        .expect("response headers while the request body is still open")
        .unwrap();
    assert_eq!(response.headers()["x-backend"], "e");
    let mut body = response.into_body();
    // The first chunk comes back while the request body is still open:
    // the backend does not buffer the whole body.
    let first = tokio::time::timeout(PATIENCE, body.frame())
        .await
        .expect("first echoed chunk in time")
        .unwrap()
        .unwrap()
        .into_data()
        .unwrap();
    assert_eq!(&first[..], b"first ");
    sender
        .send(Ok(http_body::Frame::data(Bytes::from(vec![b'z'; 100_000]))))
        .await
        .unwrap();
    drop(sender);
    let rest = body.collect().await.unwrap().to_bytes();
    assert_eq!(rest.len(), 100_000);
    assert!(rest.iter().all(|&b| b == b'z'));
}

/// A `Stream` over an mpsc receiver (tokio-stream is not a dependency).
fn tokio_stream_from<T: Send + 'static>(
    receiver: tokio::sync::mpsc::Receiver<T>,
) -> impl futures_util::Stream<Item = T> + Send + 'static {
    futures_util::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|item| (item, receiver))
    })
}

#[tokio::test]
async fn headers_route_sets_hop_by_hop_headers() {
    let backend = Backend::spawn(any_port(), BackendConfig::new("h"))
        .await
        .unwrap();
    let (parts, _) = get(&client(), format!("http://{}/headers", backend.addr())).await;
    assert_eq!(parts.status, StatusCode::CREATED);
    assert_eq!(parts.headers["connection"], "x-drop-me");
    assert_eq!(parts.headers["x-drop-me"], "1");
    assert_eq!(parts.headers["keep-alive"], "timeout=5");
    assert_eq!(parts.headers["x-custom"], "kept");
    assert_eq!(parts.headers["x-backend"], "h");
}

#[tokio::test]
async fn reset_route_closes_without_a_response() {
    let backend = Backend::spawn(any_port(), BackendConfig::new("r"))
        .await
        .unwrap();
    let mut stream = TcpStream::connect(backend.addr()).await.unwrap();
    stream
        .write_all(b"GET /reset HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut received = Vec::new();
    // Either a clean EOF or a reset: in both cases no response bytes.
    let _ = tokio::time::timeout(PATIENCE, stream.read_to_end(&mut received))
        .await
        .expect("connection closed in time");
    assert!(
        received.is_empty(),
        "got {:?}",
        String::from_utf8_lossy(&received)
    );
    assert_eq!(backend.hits(), 1);
}

#[tokio::test]
async fn keeps_connections_alive() {
    let backend = Backend::spawn(any_port(), BackendConfig::new("k"))
        .await
        .unwrap();
    let mut stream = TcpStream::connect(backend.addr()).await.unwrap();
    for _ in 0..3 {
        stream
            .write_all(b"GET /status/200 HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buffer = vec![0u8; 4096];
        let read = tokio::time::timeout(PATIENCE, stream.read(&mut buffer))
            .await
            .unwrap()
            .unwrap();
        let text = String::from_utf8_lossy(&buffer[..read]).to_string();
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        assert!(text.contains("x-backend: k"), "{text}");
    }
    assert_eq!(backend.hits(), 3);
}

#[tokio::test]
async fn processing_delay_is_applied_and_changes_live() {
    let delay = Duration::from_millis(150);
    let backend = Backend::spawn(any_port(), BackendConfig::new("d").delay(delay))
        .await
        .unwrap();
    let client = client();
    let url = format!("http://{}/", backend.addr());
    let started = Instant::now();
    get(&client, url.clone()).await;
    assert!(started.elapsed() >= delay);

    let longer = Duration::from_millis(400);
    backend.set_delay(longer);
    assert_eq!(backend.delay(), longer);
    let started = Instant::now();
    get(&client, url).await;
    assert!(started.elapsed() >= longer);
}

#[tokio::test]
async fn jitter_adds_bounded_extra_time() {
    let config = BackendConfig::new("j")
        .delay(Duration::from_millis(20))
        .jitter(Duration::from_millis(30));
    assert_eq!(config.jitter, Duration::from_millis(30));
    let backend = Backend::spawn(any_port(), config).await.unwrap();
    let client = client();
    for _ in 0..5 {
        let started = Instant::now();
        get(&client, format!("http://{}/", backend.addr())).await;
        assert!(started.elapsed() >= Duration::from_millis(20));
    }
    assert_eq!(backend.hits(), 5);
}

#[tokio::test]
async fn shutdown_releases_the_port() {
    let backend = Backend::spawn(any_port(), BackendConfig::new("g"))
        .await
        .unwrap();
    let addr = backend.addr();
    get(&client(), format!("http://{addr}/")).await;
    tokio::time::timeout(PATIENCE, backend.shutdown())
        .await
        .expect("shutdown in time");
    assert!(TcpStream::connect(addr).await.is_err());
    // The same address can host a new pod right away.
    let again = Backend::spawn(addr, BackendConfig::new("g2"))
        .await
        .unwrap();
    let (parts, _) = get(&client(), format!("http://{addr}/")).await;
    assert_eq!(parts.headers["x-backend"], "g2");
    drop(again);
}

#[tokio::test]
async fn shutdown_lets_in_flight_requests_finish() {
    let backend = Backend::spawn(
        any_port(),
        BackendConfig::new("f").delay(Duration::from_millis(300)),
    )
    .await
    .unwrap();
    let url = format!("http://{}/", backend.addr());
    let in_flight = tokio::spawn(async move { get(&client(), url).await.0.status });
    while backend.hits() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    backend.shutdown().await;
    assert_eq!(in_flight.await.unwrap(), StatusCode::OK);
}

#[tokio::test]
async fn abort_drops_in_flight_requests_and_the_listener() {
    let backend = Backend::spawn(
        any_port(),
        BackendConfig::new("x").delay(Duration::from_secs(2)),
    )
    .await
    .unwrap();
    let addr = backend.addr();
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let deadline = Instant::now() + PATIENCE;
    while backend.hits() == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(backend.hits(), 1);
    backend.abort();
    let mut received = Vec::new();
    let _ = tokio::time::timeout(PATIENCE, stream.read_to_end(&mut received))
        .await
        .expect("connection closed by the abort");
    assert!(
        received.is_empty(),
        "got {:?}",
        String::from_utf8_lossy(&received)
    );
    // The listener goes away too; poll, since the abort completes asynchronously.
    let deadline = Instant::now() + PATIENCE;
    while TcpStream::connect(addr).await.is_ok() {
        assert!(Instant::now() < deadline, "listener still open after abort");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A restarted pod can bind the same address immediately after the abort.
    let restarted = Backend::spawn(addr, BackendConfig::new("x2"))
        .await
        .unwrap();
    let (parts, _) = get(&client(), format!("http://{addr}/")).await;
    assert_eq!(parts.headers["x-backend"], "x2");
    assert_eq!(restarted.hits(), 1);
}

#[tokio::test]
async fn restart_right_after_abort_binds_the_same_port() {
    let backend = Backend::spawn(any_port(), BackendConfig::new("p"))
        .await
        .unwrap();
    let addr = backend.addr();
    backend.abort();
    drop(backend);
    let restarted = Backend::spawn(addr, BackendConfig::new("p2"))
        .await
        .unwrap();
    let (parts, _) = get(&client(), format!("http://{addr}/")).await;
    assert_eq!(parts.headers["x-backend"], "p2");
    assert_eq!(restarted.hits(), 1);
}

#[tokio::test]
async fn a_failing_pod_answers_its_status_at_once_until_it_recovers() {
    // A minute of processing, which failing answers skip: they arrive within PATIENCE.
    let backend = Backend::spawn(
        any_port(),
        BackendConfig::new("f").delay(Duration::from_secs(60)),
    )
    .await
    .unwrap();
    let client = client();
    assert_eq!(backend.failing(), None);
    backend.set_failing(Some(StatusCode::INTERNAL_SERVER_ERROR));
    assert_eq!(backend.failing(), Some(StatusCode::INTERNAL_SERVER_ERROR));
    for path in ["/", "/status/200", "/stream?bytes=10"] {
        let (parts, _) = get(&client, format!("http://{}{path}", backend.addr())).await;
        assert_eq!(parts.status, StatusCode::INTERNAL_SERVER_ERROR, "{path}");
        assert_eq!(parts.headers["x-backend"], "f");
    }
    backend.set_failing(None);
    backend.set_delay(Duration::ZERO);
    let (parts, _) = get(&client, format!("http://{}/", backend.addr())).await;
    assert_eq!(parts.status, StatusCode::OK);
    assert_eq!(backend.hits(), 4);
}
