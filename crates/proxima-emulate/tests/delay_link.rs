//! The delay relay with real sockets: RTT, live changes, throughput, EOF.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use proxima_emulate::{Backend, BackendConfig, DelayLink, BLACKHOLE};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const PATIENCE: Duration = Duration::from_secs(20);

fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// Time of one request/response on an already established connection.
async fn round_trip(stream: &mut TcpStream) -> Duration {
    let started = Instant::now();
    stream
        .write_all(b"GET /status/200 HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buffer = vec![0u8; 4096];
    let read = tokio::time::timeout(PATIENCE, stream.read(&mut buffer))
        .await
        .expect("response in time")
        .unwrap();
    let elapsed = started.elapsed();
    let text = String::from_utf8_lossy(&buffer[..read]);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    elapsed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_response_takes_two_one_way_delays() {
    let backend = Backend::spawn(any_port(), BackendConfig::new("far"))
        .await
        .unwrap();
    let delay = Duration::from_millis(60);
    let link = DelayLink::spawn(any_port(), backend.addr(), delay)
        .await
        .unwrap();
    assert_eq!(link.target(), backend.addr());
    let mut stream = TcpStream::connect(link.addr()).await.unwrap();
    // Warm up, then measure: each direction is delayed once.
    round_trip(&mut stream).await;
    let rtt = round_trip(&mut stream).await;
    assert!(rtt >= 2 * delay, "rtt {rtt:?} < 2 x {delay:?}");
    assert!(rtt < 2 * delay + Duration::from_secs(5), "rtt {rtt:?}");

    let longer = Duration::from_millis(150);
    link.set_delay(longer);
    assert_eq!(link.delay(), longer);
    let rtt = round_trip(&mut stream).await;
    assert!(rtt >= 2 * longer, "rtt {rtt:?} < 2 x {longer:?}");

    link.set_delay(Duration::ZERO);
    let rtt = round_trip(&mut stream).await;
    assert!(rtt < 2 * longer, "rtt {rtt:?} after removing the delay");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_transfer_is_pipelined_and_intact() {
    let backend = Backend::spawn(any_port(), BackendConfig::new("bulk"))
        .await
        .unwrap();
    let delay = Duration::from_millis(100);
    let link = DelayLink::spawn(any_port(), backend.addr(), delay)
        .await
        .unwrap();
    let payload: Vec<u8> = (0..8 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    let client = Client::builder(TokioExecutor::new()).build_http();
    let request = Request::builder()
        .method(Method::POST)
        .uri(format!("http://{}/echo", link.addr()))
        .body(Full::new(Bytes::from(payload.clone())))
        .unwrap();
    let started = Instant::now();
    let response = tokio::time::timeout(PATIENCE, client.request(request))
        .await
        .expect("response in time")
        .unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let elapsed = started.elapsed();
    assert_eq!(body.len(), payload.len());
    assert!(body[..] == payload[..], "echoed bytes differ");
    // 8 MiB is at least 128 reads of 64 KiB: one chunk per delay would take
    // 12.8 s or more; a pipelined relay takes about one RTT plus copying.
    assert!(elapsed < Duration::from_secs(6), "took {elapsed:?}");
}

#[tokio::test]
async fn end_of_stream_is_forwarded_as_half_close() {
    let listener = TcpListener::bind(any_port()).await.unwrap();
    let target = listener.local_addr().unwrap();
    let link = DelayLink::spawn(any_port(), target, Duration::from_millis(20))
        .await
        .unwrap();
    let server = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut received = Vec::new();
        socket.read_to_end(&mut received).await.unwrap();
        // Answer after the client's half-close arrived.
        socket.write_all(&received).await.unwrap();
        socket.write_all(b" done").await.unwrap();
        received
    });
    let mut stream = TcpStream::connect(link.addr()).await.unwrap();
    stream.write_all(b"ping").await.unwrap();
    stream.shutdown().await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(PATIENCE, stream.read_to_end(&mut answer))
        .await
        .expect("answer in time")
        .unwrap();
    assert_eq!(answer, b"ping done");
    assert_eq!(server.await.unwrap(), b"ping");
}

#[tokio::test]
async fn unreachable_target_closes_the_client_connection() {
    // Reserve a port, then free it so nothing listens there.
    let target = TcpListener::bind(any_port())
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let link = DelayLink::spawn(any_port(), target, Duration::from_millis(5))
        .await
        .unwrap();
    let mut stream = TcpStream::connect(link.addr()).await.unwrap();
    let mut received = Vec::new();
    let _ = tokio::time::timeout(PATIENCE, stream.read_to_end(&mut received))
        .await
        .expect("closed in time");
    assert!(received.is_empty());
}

#[tokio::test]
async fn abort_closes_the_listener() {
    let backend = Backend::spawn(any_port(), BackendConfig::new("a"))
        .await
        .unwrap();
    let link = DelayLink::spawn(any_port(), backend.addr(), Duration::ZERO)
        .await
        .unwrap();
    let addr = link.addr();
    let mut stream = TcpStream::connect(addr).await.unwrap();
    round_trip(&mut stream).await;
    link.abort();
    let deadline = Instant::now() + PATIENCE;
    while TcpStream::connect(addr).await.is_ok() {
        assert!(Instant::now() < deadline, "listener still open after abort");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackholed_link_holds_data_until_it_is_back() {
    let backend = Backend::spawn(any_port(), BackendConfig::new("far"))
        .await
        .unwrap();
    let link = DelayLink::spawn(any_port(), backend.addr(), Duration::ZERO)
        .await
        .unwrap();
    let mut stream = TcpStream::connect(link.addr()).await.unwrap();
    round_trip(&mut stream).await;
    link.set_delay(BLACKHOLE);
    stream
        .write_all(b"GET /status/200 HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buffer = vec![0u8; 4096];
    // Nothing comes back while the link drops everything (however slow the machine).
    let held = tokio::time::timeout(Duration::from_millis(300), stream.read(&mut buffer)).await;
    assert!(held.is_err(), "an answer crossed a blackholed link");
    // Back up: the held request goes through, as TCP's retransmission would.
    link.set_delay(Duration::ZERO);
    let read = tokio::time::timeout(PATIENCE, stream.read(&mut buffer))
        .await
        .expect("the held request answered once the link is back")
        .unwrap();
    assert!(String::from_utf8_lossy(&buffer[..read]).starts_with("HTTP/1.1 200"));
}
