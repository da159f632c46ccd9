//! Upgrades through the proxy (`tunnel.rs`): a real WebSocket client (tokio-tungstenite)
//! and a real WebSocket server as the pod, and pods that decline or misanswer.

#[path = "support/binary.rs"]
mod binary;
mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use futures_util::{SinkExt, StreamExt};
use proxima_core::{Router, Update};
use proxima_proxy::ProxyConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

/// A WebSocket pod: echoes every text and binary message, prefixed with its name, and
/// answers plain requests (the proxy's probes) with `200 ok`.
async fn websocket_pod(name: &'static str) -> SocketAddr {
    let listener = TcpListener::bind(loopback()).await.expect("bind pod");
    let addr = listener.local_addr().expect("pod addr");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = [0u8; 1024];
                let Ok(n) = stream.peek(&mut head).await else {
                    return;
                };
                let head = String::from_utf8_lossy(&head[..n]).to_ascii_lowercase();
                if !head.contains("upgrade: websocket") {
                    let _ = stream
                        .write_all(
                            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
                        )
                        .await;
                    return;
                }
                let Ok(mut ws) = tokio_tungstenite::accept_hdr_async(stream, show_forwarded).await
                else {
                    return;
                };
                while let Some(Ok(message)) = ws.next().await {
                    let echo = match message {
                        Message::Text(text) => Message::text(format!("{name}: {text}")),
                        Message::Binary(data) => Message::Binary(data),
                        Message::Close(_) => break,
                        _ => continue,
                    };
                    if ws.send(echo).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    addr
}

/// The pod's handshake callback: tells the client the `x-forwarded-for` the pod saw.
#[allow(clippy::result_large_err)] // the signature is tungstenite's `Callback`
fn show_forwarded(req: &Request, mut response: Response) -> Result<Response, ErrorResponse> {
    let forwarded = req
        .headers()
        .get("x-forwarded-for")
        .cloned()
        .unwrap_or_else(|| http::HeaderValue::from_static("none"));
    response
        .headers_mut()
        .insert("x-seen-forwarded-for", forwarded);
    Ok(response)
}

type Client = WebSocketStream<TcpStream>;
type Handshake = Result<
    (
        Client,
        tokio_tungstenite::tungstenite::handshake::client::Response,
    ),
    tokio_tungstenite::tungstenite::Error,
>;

/// A WebSocket client connected through `proxy` to the service `ws.shop`.
async fn connect(proxy: &TestProxy) -> Handshake {
    let stream = TcpStream::connect(proxy.addr).await.expect("connect");
    handshake(proxy, stream).await
}

/// The WebSocket handshake for `ws.shop` on `stream`, a connection to `proxy`.
async fn handshake(proxy: &TestProxy, stream: TcpStream) -> Handshake {
    let mut request = format!("ws://{}/chat", proxy.addr)
        .into_client_request()
        .expect("request");
    request
        .headers_mut()
        .insert("x-service", http::HeaderValue::from_static("ws.shop"));
    within(
        "handshake",
        tokio_tungstenite::client_async(request, stream),
    )
    .await
}

/// Send `message` and return the pod's answer.
async fn round_trip<S>(ws: &mut WebSocketStream<S>, message: Message) -> Message
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    ws.send(message).await.expect("send");
    within("echo", ws.next())
        .await
        .expect("message")
        .expect("ok")
}

/// Wait until the proxy ends the tunnel (`what` names the reason for the wait).
async fn closed_by_the_proxy(ws: &mut Client, what: &str) {
    let end = within(what, ws.next()).await;
    assert!(!matches!(end, Some(Ok(Message::Text(_)))), "{end:?}");
}

async fn proxy_for(config: ProxyConfig, pods: Vec<(&str, SocketAddr)>) -> TestProxy {
    let endpoints = pods
        .into_iter()
        .map(|(id, addr)| endpoint(id, addr))
        .collect();
    TestProxy::start_with(config, vec![(service("shop", "ws", &[], &[]), endpoints)]).await
}

fn in_flight(router: &Router, id: &str) -> u32 {
    let table = router.table();
    let route = table.services.values().next().expect("one service");
    let endpoint = route
        .endpoints
        .iter()
        .find(|e| e.endpoint.id == id)
        .expect("endpoint");
    endpoint.state.in_flight()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_is_tunnelled_to_a_pod_and_counts_as_in_flight_while_open() {
    let pod = websocket_pod("pod-0").await;
    let proxy = proxy_for(ProxyConfig::default(), vec![("pod-0", pod)]).await;
    let samples = || {
        let explain = proxy.router.explain(std::time::Instant::now());
        explain.services[0].endpoints[0].samples
    };
    // A new pod's first probe, then the handshake: its time is the pod's next sample.
    eventually("first probe", Duration::from_secs(5), || samples() == 1).await;
    let (mut ws, response) = connect(&proxy).await.expect("handshake through the proxy");
    assert_eq!(samples(), 2);
    assert_eq!(response.status(), 101);
    assert_eq!(response.headers()["x-seen-forwarded-for"], "127.0.0.1");
    for i in 0..3 {
        let echo = round_trip(&mut ws, Message::text(format!("hello {i}"))).await;
        assert_eq!(echo, Message::text(format!("pod-0: hello {i}")));
    }
    let big = vec![7u8; 1 << 20];
    let echo = round_trip(&mut ws, Message::binary(big.clone())).await;
    assert_eq!(echo.into_data(), big);
    assert_eq!(proxy.metric("proxima_tunnels_open"), 1.0);
    assert_eq!(
        proxy.metric(r#"proxima_tunnels_total{outcome="opened"}"#),
        1.0
    );
    assert_eq!(
        in_flight(&proxy.router, "pod-0"),
        1,
        "open tunnel is in flight"
    );
    ws.close(None).await.expect("close");
    drop(ws);
    eventually("tunnel closed", Duration::from_secs(5), || {
        proxy.metric("proxima_tunnels_open") == 0.0
    })
    .await;
    assert_eq!(
        proxy.metric(r#"proxima_tunnels_closed_total{reason="closed"}"#),
        1.0
    );
    assert_eq!(in_flight(&proxy.router, "pod-0"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tunnels_are_spread_over_the_pool_and_a_refused_pod_is_skipped() {
    let (a, b) = (websocket_pod("pod-a").await, websocket_pod("pod-b").await);
    let dead = dead_addr().await;
    let proxy = proxy_for(
        ProxyConfig::default(),
        vec![("pod-a", a), ("pod-b", b), ("pod-dead", dead)],
    )
    .await;
    let mut open = Vec::new();
    let mut names = Vec::new();
    for i in 0..12 {
        let (mut ws, _) = connect(&proxy).await.expect("handshake");
        let echo = round_trip(&mut ws, Message::text(format!("{i}"))).await;
        let text = echo.into_text().expect("text");
        names.push(text.split(':').next().unwrap_or_default().to_string());
        open.push(ws);
    }
    let to_a = names.iter().filter(|n| *n == "pod-a").count();
    assert!((3..=9).contains(&to_a), "spread: {names:?}");
    assert_eq!(proxy.metric("proxima_tunnels_open"), 12.0);
}

/// Open a tunnel and file it under the pod that answered (`pod-a` first).
async fn open_on_some_pod(proxy: &TestProxy, by_pod: &mut [Vec<Client>; 2]) {
    let (mut ws, _) = connect(proxy).await.expect("handshake");
    let echo = round_trip(&mut ws, Message::text("hi")).await;
    let pod = usize::from(echo.into_text().expect("text").starts_with("pod-b"));
    by_pod[pod].push(ws);
}

/// Tunnels hold their pods until they close: new ones go to the pool member with the
/// fewest open, so pods stay level when some tunnels close sooner than others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_tunnels_go_to_the_pod_with_the_fewest_open() {
    let (a, b) = (websocket_pod("pod-a").await, websocket_pod("pod-b").await);
    let proxy = proxy_for(ProxyConfig::default(), vec![("pod-a", a), ("pod-b", b)]).await;
    let idle = || in_flight(&proxy.router, "pod-a") + in_flight(&proxy.router, "pod-b") == 0;
    eventually("first probes done", PATIENCE, idle).await;
    let mut by_pod: [Vec<Client>; 2] = [Vec::new(), Vec::new()];
    for _ in 0..8 {
        open_on_some_pod(&proxy, &mut by_pod).await;
    }
    assert_eq!([by_pod[0].len(), by_pod[1].len()], [4, 4]);
    // Three of pod-a's close; the next three all go to pod-a.
    by_pod[0].truncate(1);
    eventually("pod-a's closed tunnels released", PATIENCE, || {
        in_flight(&proxy.router, "pod-a") == 1
    })
    .await;
    for _ in 0..3 {
        open_on_some_pod(&proxy, &mut by_pod).await;
    }
    assert_eq!([by_pod[0].len(), by_pod[1].len()], [4, 4]);
}

/// Send `request` to `addr` and read the answer's head (up to the blank line).
async fn head_of(addr: SocketAddr, request: &str) -> String {
    within("answer", async {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        stream.write_all(request.as_bytes()).await.expect("send");
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        while !out.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = stream.read(&mut buf).await.expect("read");
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&out).into_owned()
    })
    .await
}

const WEBSOCKET_HANDSHAKE: &str = "GET /chat HTTP/1.1\r\nhost: proxima\r\nx-service: ws.shop\r\n\
    connection: Upgrade\r\nupgrade: websocket\r\nsec-websocket-version: 13\r\n\
    sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_answers_an_upgrade_without_switching_has_its_answer_passed_on() {
    // An HTTP pod that ignores `Upgrade` (RFC 9110 §7.8 allows it) and answers 200.
    let pod = backend("plain").await;
    let proxy = proxy_for(ProxyConfig::default(), vec![("plain-0", pod.addr())]).await;
    let error = connect(&proxy).await.expect_err("no switch");
    match error {
        tokio_tungstenite::tungstenite::Error::Http(response) => {
            assert_eq!(response.status(), 200);
            assert_eq!(response.headers()["x-backend"], "plain");
        }
        other => panic!("expected the pod's answer, got {other:?}"),
    }
    let head = head_of(proxy.addr, WEBSOCKET_HANDSHAKE).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("connection: close"), "{head}");
    assert_eq!(
        proxy.metric(r#"proxima_tunnels_total{outcome="declined"}"#),
        2.0
    );
    assert_eq!(proxy.metric("proxima_tunnels_open"), 0.0);
}

/// A pod that answers every request with `answer`, then holds the connection.
async fn scripted_pod(answer: &'static str) -> SocketAddr {
    let listener = TcpListener::bind(loopback()).await.expect("bind pod");
    let addr = listener.local_addr().expect("pod addr");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = stream.read(&mut buf).await;
                let _ = stream.write_all(answer.as_bytes()).await;
                tokio::time::sleep(Duration::from_secs(10)).await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_switches_to_a_protocol_not_asked_for_is_a_bad_gateway() {
    let pod = scripted_pod(
        "HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: h2c\r\n\r\n",
    )
    .await;
    let proxy = proxy_for(ProxyConfig::default(), vec![("odd-0", pod)]).await;
    let head = head_of(proxy.addr, WEBSOCKET_HANDSHAKE).await;
    assert!(head.starts_with("HTTP/1.1 502"), "{head}");
    assert_eq!(proxy.metric("proxima_tunnels_open"), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrade_to_h2c_is_not_passed_on() {
    let pod = backend("plain").await;
    let proxy = proxy_for(ProxyConfig::default(), vec![("plain-0", pod.addr())]).await;
    let answer = raw_exchange(
        proxy.addr,
        b"GET /x HTTP/1.1\r\nhost: proxima\r\nx-service: ws.shop\r\nconnection: upgrade, close\r\n\
          upgrade: h2c\r\nhttp2-settings: AAMAAABkAAQAAP__\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let body = &answer[answer.find("\r\n\r\n").expect("head") + 4..];
    let echo: serde_json::Value = serde_json::from_str(body).expect("echo");
    assert!(echo["headers"].get("upgrade").is_none(), "{echo}");
    assert_eq!(
        proxy.metric(r#"proxima_tunnels_total{outcome="opened"}"#),
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_tunnel_is_closed_and_a_busy_one_is_not() {
    let pod = websocket_pod("pod-0").await;
    let config = ProxyConfig {
        tunnel_idle_timeout: Duration::from_millis(600),
        ..ProxyConfig::default()
    };
    let proxy = proxy_for(config, vec![("pod-0", pod)]).await;
    let (mut busy, _) = connect(&proxy).await.expect("handshake");
    let (mut idle, _) = connect(&proxy).await.expect("handshake");
    for i in 0..8 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        round_trip(&mut busy, Message::text(format!("{i}"))).await;
    }
    closed_by_the_proxy(&mut idle, "idle tunnel closed").await;
    assert_eq!(
        proxy.metric(r#"proxima_tunnels_closed_total{reason="idle"}"#),
        1.0
    );
    assert_eq!(proxy.metric("proxima_tunnels_open"), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_to_a_pod_that_left_discovery_closes_after_the_grace_period() {
    let pod = websocket_pod("pod-0").await;
    let other = websocket_pod("pod-1").await;
    let config = ProxyConfig {
        tunnel_removed_grace: Duration::from_millis(300),
        ..ProxyConfig::default()
    };
    let proxy = proxy_for(config, vec![("pod-0", pod)]).await;
    let (mut ws, _) = connect(&proxy).await.expect("handshake");
    // pod-0 is replaced by pod-1 (a rolling update).
    proxy.router.apply(
        [Update::Reset {
            nodes: vec![],
            services: vec![(
                service("shop", "ws", &[], &[]),
                vec![endpoint("pod-1", other)],
            )],
        }],
        std::time::Instant::now(),
    );
    let echo = round_trip(&mut ws, Message::text("still here")).await;
    assert_eq!(
        echo,
        Message::text("pod-0: still here"),
        "open during the grace"
    );
    closed_by_the_proxy(&mut ws, "closed after the grace").await;
    assert_eq!(
        proxy.metric(r#"proxima_tunnels_closed_total{reason="removed"}"#),
        1.0
    );
    let (mut ws, _) = connect(&proxy).await.expect("new tunnels go to pod-1");
    let echo = round_trip(&mut ws, Message::text("hi")).await;
    assert_eq!(echo, Message::text("pod-1: hi"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_shutdown_open_tunnels_run_until_they_close_or_the_grace_ends() {
    let pod = websocket_pod("pod-0").await;
    // Closed by its client: the proxy stops then, long before its grace is over.
    let config = ProxyConfig {
        shutdown_grace: Duration::from_secs(30),
        ..ProxyConfig::default()
    };
    let mut proxy = proxy_for(config, vec![("pod-0", pod)]).await;
    let (mut ws, _) = connect(&proxy).await.expect("handshake");
    proxy.begin_shutdown();
    for i in 0..3 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let echo = round_trip(&mut ws, Message::text(format!("{i}"))).await;
        assert_eq!(echo, Message::text(format!("pod-0: {i}")));
    }
    let started = std::time::Instant::now();
    ws.close(None).await.expect("close");
    drop(ws);
    within("serve returns", proxy.server_stopped())
        .await
        .expect("serve ends cleanly");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );

    // Never closed: cut when the grace is over.
    let pod = websocket_pod("pod-0").await;
    let config = ProxyConfig {
        shutdown_grace: Duration::from_secs(1),
        ..ProxyConfig::default()
    };
    let mut proxy = proxy_for(config, vec![("pod-0", pod)]).await;
    let (mut ws, _) = connect(&proxy).await.expect("handshake");
    let started = std::time::Instant::now();
    proxy.begin_shutdown();
    within("serve returns", proxy.server_stopped())
        .await
        .expect("serve ends cleanly");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
    closed_by_the_proxy(&mut ws, "tunnel cut").await;
    assert_eq!(
        proxy.metric(r#"proxima_tunnels_closed_total{reason="shutdown"}"#),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_served_plain_requests_can_then_switch() {
    // The proxy's own loop serves the plain requests; the upgrade hands the connection
    // to hyper, which switches it.
    let pod = websocket_pod("pod-0").await;
    let proxy = proxy_for(ProxyConfig::default(), vec![("pod-0", pod)]).await;
    let mut stream = TcpStream::connect(proxy.addr).await.expect("connect");
    for _ in 0..2 {
        stream
            .write_all(b"GET /health HTTP/1.1\r\nhost: proxima\r\nx-service: ws.shop\r\n\r\n")
            .await
            .expect("send");
        let mut answer = Vec::new();
        let mut buf = [0u8; 1024];
        while !answer.ends_with(b"ok") {
            let n = within("answer", stream.read(&mut buf)).await.expect("read");
            assert!(n > 0, "closed: {:?}", String::from_utf8_lossy(&answer));
            answer.extend_from_slice(&buf[..n]);
        }
        assert!(answer.starts_with(b"HTTP/1.1 200"));
    }
    let (mut ws, _) = handshake(&proxy, stream)
        .await
        .expect("switched on a used connection");
    let echo = round_trip(&mut ws, Message::text("after two requests")).await;
    assert_eq!(echo, Message::text("pod-0: after two requests"));
}

/// An HTTP/2 client's extended CONNECT (RFC 8441) for a WebSocket to `ws.shop` through
/// the proxy at `addr`: the `200`'s headers, and the WebSocket on the stream.
async fn extended_connect(
    addr: SocketAddr,
) -> (
    http::HeaderMap,
    WebSocketStream<hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>>,
) {
    use hyper::client::conn::http2;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use tokio_tungstenite::tungstenite::protocol::Role;

    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut sender, connection) = http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
        .await
        .expect("h2 handshake");
    tokio::spawn(connection);
    let mut connect = http::Request::connect("http://ws.shop/chat")
        .header("sec-websocket-version", "13")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .expect("request");
    connect
        .extensions_mut()
        .insert(hyper::ext::Protocol::from_static("websocket"));
    let mut response = within("extended CONNECT", sender.send_request(connect))
        .await
        .expect("answer");
    assert_eq!(response.status(), http::StatusCode::OK, "{response:?}");
    let headers = response.headers().clone();
    let upgraded = hyper::upgrade::on(&mut response).await.expect("stream");
    let ws = WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Client, None).await;
    (headers, ws)
}

/// RFC 8441: an HTTP/2 client opens a WebSocket with extended CONNECT; the pod gets the
/// HTTP/1.1 handshake and its `101` reaches the client as `200`; messages then travel
/// on the client's HTTP/2 stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_client_opens_a_websocket_with_extended_connect() {
    let pod = websocket_pod("pod-a").await;
    let proxy = proxy_for(ProxyConfig::default(), vec![("pod-a", pod)]).await;
    let (headers, mut ws) = extended_connect(proxy.addr).await;
    assert!(!headers.contains_key("sec-websocket-accept"));
    assert!(headers.contains_key("x-seen-forwarded-for"));
    for i in 0..3 {
        let echo = round_trip(&mut ws, Message::text(format!("over h2 {i}"))).await;
        assert_eq!(
            echo.into_text().expect("text"),
            format!("pod-a: over h2 {i}")
        );
    }
    assert_eq!(in_flight(&proxy.router, "pod-a"), 1);
    assert_eq!(proxy.metric("proxima_tunnels_open"), 1.0);
    drop(ws);
    eventually("tunnel closed", PATIENCE, || {
        in_flight(&proxy.router, "pod-a") == 0
    })
    .await;
}

/// One client cannot hold every connection place with tunnels: past its limit its
/// upgrades get 429, while its plain requests and other clients' tunnels pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_past_its_tunnel_limit_gets_429_and_others_are_not_affected() {
    let pod = websocket_pod("pod-a").await;
    let config = ProxyConfig {
        max_tunnels_per_client: 3,
        ..ProxyConfig::default()
    };
    let proxy = proxy_for(config, vec![("pod-a", pod)]).await;
    let mut open = Vec::new();
    for _ in 0..3 {
        open.push(connect(&proxy).await.expect("handshake").0);
    }
    let refused = connect(&proxy).await.expect_err("past the limit");
    match refused {
        tokio_tungstenite::tungstenite::Error::Http(answer) => {
            assert_eq!(answer.status(), http::StatusCode::TOO_MANY_REQUESTS);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        proxy.metric(r#"proxima_tunnels_total{outcome="refused"}"#),
        1.0
    );
    // Another client address (127.0.0.2 is loopback too) opens one.
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind("127.0.0.2:0".parse().unwrap())
        .expect("bind 127.0.0.2");
    let stream = socket.connect(proxy.addr).await.expect("connect");
    let (mut other, _) = handshake(&proxy, stream).await.expect("other client");
    round_trip(&mut other, Message::text("hi")).await;
    // The first client's plain requests pass; a closed tunnel makes room for a new one.
    let reply = get(
        &http1_client(),
        &proxy.url("/"),
        &[("x-service", "ws.shop")],
    )
    .await;
    assert_eq!(reply.status, http::StatusCode::OK);
    drop(open.pop());
    eventually("a tunnel closed", PATIENCE, || {
        proxy.metric("proxima_tunnels_open") == 3.0
    })
    .await;
    connect(&proxy).await.expect("room again");
}

/// The real binary, file discovery: WebSockets from an HTTP/1.1 client and from an
/// HTTP/2 client (extended CONNECT) reach the pods of a topology file's service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_tunnels_websockets_from_http1_and_http2_clients() {
    let (a, b) = (websocket_pod("pod-a").await, websocket_pod("pod-b").await);
    let dir = binary::TempDir::new("ws");
    let path = dir.0.join("topology.yaml");
    let topology = format!(
        "services:\n  - name: ws\n    namespace: shop\n    endpoints:\n      - {{ id: pod-a, address: '{a}' }}\n      - {{ id: pod-b, address: '{b}' }}\n"
    );
    std::fs::write(&path, topology).expect("write topology");
    let discovery = format!("file:{}", path.display());
    let proxima = binary::Proxima::start(&["run", "--discovery", &discovery]).await;

    let mut answered_by = std::collections::BTreeSet::new();
    let mut open = Vec::new();
    for i in 0..4 {
        let stream = TcpStream::connect(proxima.proxy).await.expect("connect");
        let mut request = format!("ws://{}/chat", proxima.proxy)
            .into_client_request()
            .expect("request");
        request
            .headers_mut()
            .insert("x-service", http::HeaderValue::from_static("ws.shop"));
        let (mut ws, _) = within(
            "handshake",
            tokio_tungstenite::client_async(request, stream),
        )
        .await
        .expect("handshake");
        let echo = round_trip(&mut ws, Message::text(format!("h1 {i}"))).await;
        let text = echo.into_text().expect("text").to_string();
        answered_by.insert(text.split(':').next().unwrap_or_default().to_string());
        open.push(ws);
    }
    assert_eq!(answered_by.len(), 2, "{answered_by:?}");

    let (_, mut ws) = extended_connect(proxima.proxy).await;
    let echo = round_trip(&mut ws, Message::text("over h2")).await;
    assert!(echo.into_text().expect("text").ends_with(": over h2"));
}
