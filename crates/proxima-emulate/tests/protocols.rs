//! The emulated pod's gRPC and WebSocket answers, against real clients: hyper's h2c
//! client reading trailers (a gRPC exchange without tonic) and tungstenite.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use proxima_emulate::{Backend, BackendConfig};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

const PATIENCE: Duration = Duration::from_secs(20);
const PROCESSING: Duration = Duration::from_millis(30);

async fn pod(name: &str) -> Backend {
    let config = BackendConfig::new(name).delay(PROCESSING).websockets(true);
    Backend::spawn("127.0.0.1:0".parse().unwrap(), config)
        .await
        .unwrap()
}

/// A gRPC message: flag 0, 4-byte big-endian length, payload.
fn message(payload: &[u8]) -> Bytes {
    let mut framed = vec![0u8];
    framed.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    framed.extend_from_slice(payload);
    framed.into()
}

/// One unary call over `client`; returns the answer's parts, body and trailers.
async fn call(
    client: &Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
    addr: SocketAddr,
    payload: &[u8],
) -> (http::response::Parts, Bytes, Option<http::HeaderMap>) {
    let request = Request::post(format!("http://{addr}/testbed.Echo/Call"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(message(payload)))
        .unwrap();
    let response = tokio::time::timeout(PATIENCE, client.request(request))
        .await
        .expect("an answer in time")
        .expect("an answer");
    let (parts, body) = response.into_parts();
    let collected = body.collect().await.expect("the body");
    let trailers = collected.trailers().cloned();
    (parts, collected.to_bytes(), trailers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_calls_are_echoed_with_trailers_and_fail_as_unavailable() {
    let backend = pod("pod-g").await;
    let client = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();

    let began = Instant::now();
    let (parts, body, trailers) = call(&client, backend.addr(), b"hello").await;
    assert!(began.elapsed() >= PROCESSING, "{:?}", began.elapsed());
    assert_eq!(parts.status, StatusCode::OK);
    assert_eq!(parts.version, http::Version::HTTP_2);
    assert_eq!(parts.headers["content-type"], "application/grpc");
    assert_eq!(parts.headers["x-backend"], "pod-g");
    assert!(!parts.headers.contains_key("grpc-status"), "{parts:?}");
    assert_eq!(body, message(b"hello"));
    assert_eq!(trailers.expect("trailers")["grpc-status"], "0");

    // Failing: Trailers-Only UNAVAILABLE at once, whatever the emulated HTTP status.
    backend.set_failing(Some(StatusCode::SERVICE_UNAVAILABLE));
    let (parts, body, trailers) = call(&client, backend.addr(), b"again").await;
    assert_eq!(parts.status, StatusCode::OK);
    assert_eq!(parts.headers["grpc-status"], "14");
    assert!(parts.headers.contains_key("grpc-message"), "{parts:?}");
    assert_eq!(parts.headers["x-backend"], "pod-g");
    assert!(
        body.is_empty() && trailers.is_none(),
        "{body:?} {trailers:?}"
    );
    assert_eq!(
        backend.connections(),
        1,
        "one HTTP/2 connection for both calls"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websockets_open_with_101_and_echo_each_message_after_the_processing_time() {
    let backend = pod("pod-w").await;
    let stream = TcpStream::connect(backend.addr()).await.unwrap();
    let request = format!("ws://{}/chat", backend.addr())
        .into_client_request()
        .unwrap();
    let (mut ws, response) =
        tokio::time::timeout(PATIENCE, tokio_tungstenite::client_async(request, stream))
            .await
            .expect("a handshake in time")
            .expect("a handshake");
    assert_eq!(response.status(), StatusCode::SWITCHING_PROTOCOLS);
    assert_eq!(response.headers()["x-backend"], "pod-w");

    let mut round_trip = async |message: Message| {
        let began = Instant::now();
        ws.send(message).await.unwrap();
        let echo = tokio::time::timeout(PATIENCE, ws.next()).await.unwrap();
        (echo.expect("an echo").expect("a message"), began.elapsed())
    };
    for i in 0..3 {
        let (echo, took) = round_trip(Message::text(format!("hello {i}"))).await;
        assert_eq!(echo, Message::text(format!("hello {i}")));
        assert!(took >= PROCESSING, "{took:?}");
    }
    let (echo, _) = round_trip(Message::binary(vec![1, 2, 3])).await;
    assert_eq!(echo, Message::binary(vec![1, 2, 3]));
    // An overload reaches messages on the open socket.
    backend.set_delay(PROCESSING * 3);
    let (_, took) = round_trip(Message::text("slow")).await;
    assert!(took >= PROCESSING * 3, "{took:?}");
    assert_eq!(backend.hits(), 1, "the handshake is the only request");

    // Stopping the pod closes the socket with a Close frame.
    backend.shutdown().await;
    let end = tokio::time::timeout(PATIENCE, ws.next()).await.unwrap();
    assert!(matches!(end, Some(Ok(Message::Close(_)))), "{end:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_pod_drops_its_websockets_without_a_close_frame() {
    let backend = pod("pod-k").await;
    let stream = TcpStream::connect(backend.addr()).await.unwrap();
    let request = format!("ws://{}/", backend.addr())
        .into_client_request()
        .unwrap();
    let (mut ws, _) = tokio_tungstenite::client_async(request, stream)
        .await
        .unwrap();
    backend.abort();
    let end = tokio::time::timeout(PATIENCE, ws.next()).await.unwrap();
    assert!(!matches!(end, Some(Ok(Message::Close(_)))), "{end:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_websockets_a_pod_ignores_upgrade() {
    let config = BackendConfig::new("plain");
    let backend = Backend::spawn("127.0.0.1:0".parse().unwrap(), config)
        .await
        .unwrap();
    let stream = TcpStream::connect(backend.addr()).await.unwrap();
    let request = format!("ws://{}/", backend.addr())
        .into_client_request()
        .unwrap();
    match tokio_tungstenite::client_async(request, stream).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status(), StatusCode::OK);
        }
        other => panic!("expected the plain answer, got {other:?}"),
    }
}
