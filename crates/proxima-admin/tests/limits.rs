//! The admin server's request limits (tower-http's `RequestBodyLimit` and `Timeout` in
//! front of the handlers) over a real socket: a body past the limit, declared or not, gets
//! 413, a body that never comes gets 408, each with the server's JSON error body; a body
//! within the limit reaches the handler.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::StatusCode;
use proxima_admin::{AdminState, NodeEndpoints, Readiness};
use proxima_core::Router;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Node endpoints that remember the last usage body they were given.
#[derive(Debug, Default)]
struct Recorder(Mutex<Option<Vec<u8>>>);

impl NodeEndpoints for Recorder {
    fn ping(&self) -> Bytes {
        Bytes::from_static(b"{}")
    }

    fn put_usage(&self, body: &[u8]) -> Result<Bytes, (StatusCode, String)> {
        *self.0.lock().unwrap() = Some(body.to_vec());
        Ok(Bytes::from_static(b"{\"ok\":true}"))
    }
}

async fn admin() -> (SocketAddr, Arc<Recorder>) {
    let state = Arc::new(AdminState {
        router: Arc::new(Router::new(None)),
        registry: prometheus::Registry::new(),
        readiness: Readiness::new(),
    });
    let recorder = Arc::new(Recorder::default());
    let node: Arc<dyn NodeEndpoints> = recorder.clone();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(proxima_admin::serve_with_node(
        state,
        Some(node),
        listener,
        std::future::pending(),
    ));
    (addr, recorder)
}

/// Send `request` (then keep the connection open, sending nothing more) and read the
/// answer until the server closes.
async fn ask(addr: SocketAddr, request: &[u8]) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut answer))
        .await
        .expect("answered within 30 s")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {answer:?}"));
    (status, answer)
}

fn put(framing: &str, body: &str) -> Vec<u8> {
    format!(
        "PUT /node/usage HTTP/1.1\r\nhost: admin\r\nconnection: close\r\n{framing}\r\n\r\n{body}"
    )
    .into_bytes()
}

fn chunked(body: &str) -> String {
    format!("{:x}\r\n{body}\r\n0\r\n\r\n", body.len())
}

#[tokio::test]
async fn bodies_past_the_limit_get_413_and_slow_ones_408_in_json() {
    let (addr, recorder) = admin().await;

    let usage = r#"{"cpu": 0.5, "ram": 0.25}"#;
    let (status, answer) = ask(addr, &put("transfer-encoding: chunked", &chunked(usage))).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        recorder.0.lock().unwrap().as_deref(),
        Some(usage.as_bytes())
    );

    // Declared too large: refused by the limit layer before the handler runs.
    let (status, answer) = ask(addr, &put("content-length: 10000000000", "{")).await;
    assert_eq!(status, 413, "{answer}");
    assert!(answer.contains(r#""error":"body too large""#), "{answer}");

    // Chunked past the limit: refused as the handler reads it.
    let big = "x".repeat(5000);
    let (status, answer) = ask(addr, &put("transfer-encoding: chunked", &chunked(&big))).await;
    assert_eq!(status, 413, "{answer}");
    assert!(answer.contains(r#""error":"body too large""#), "{answer}");

    // A body that never comes: the request's time runs out.
    let started = Instant::now();
    let (status, answer) = ask(addr, &put("content-length: 100", "{")).await;
    assert_eq!(status, 408, "{answer}");
    assert!(answer.contains(r#""error":"request too slow""#), "{answer}");
    assert!(answer.contains("application/json"), "{answer}");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(4) && waited < Duration::from_secs(20),
        "{waited:?}"
    );
}
