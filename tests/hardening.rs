//! The real `proxima` binary against misbehaving peers written for each test: silent and
//! stalled clients, backends that close idle keep-alive connections, break their framing
//! or send too many headers, and requests at and over the limits (issue 10).
//!
//! Needs the binary: `cargo build -p proxima` first.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::StatusCode;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[path = "support/binary.rs"]
mod binary;
#[path = "support/raw.rs"]
mod raw;

use binary::*;
use raw::*;

// ---- 1. silent connections ----

/// A proxy in front of one pod (`api`, answering `hi`) with the client header and idle
/// timeouts given; the directory holds its topology.
async fn with_client_timeouts(name: &str, header: &str, idle: &str) -> (TempDir, Proxima) {
    let dir = TempDir::new(name);
    let pod = raw_backend(None, |_, _| (ok("hi", ""), false)).await;
    let flags = [
        "--client-header-timeout",
        header,
        "--client-idle-timeout",
        idle,
    ];
    let proxima = start(&dir, &[("api", pod)], &flags).await;
    (dir, proxima)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_and_idle_client_connections_are_closed() {
    let (_dir, proxima) = with_client_timeouts("silent", "1s", "2s").await;
    let proxy = proxima.proxy;
    let openers: [&[u8]; 4] = [
        b"",
        b"PRI * HTTP/2.0\r\n",
        b"PRI * HTTP/2.0\r\n\r\nSM",
        // The whole preface and an empty SETTINGS frame, then no stream.
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00",
    ];
    let mut silent = Vec::new();
    for opener in openers {
        let mut stream = TcpStream::connect(proxy).await.unwrap();
        stream.write_all(opener).await.unwrap();
        silent.push((opener, stream));
    }
    for (opener, stream) in &mut silent {
        assert!(
            closed_within(stream, Duration::from_secs(15)).await,
            "a connection that sent {:?} is still open",
            String::from_utf8_lossy(opener)
        );
    }

    // A real HTTP/2 client: its request is answered, then the idle connection is closed.
    let stream = TcpStream::connect(proxy).await.unwrap();
    let (mut send, conn) =
        hyper::client::conn::http2::handshake::<_, _, http_body_util::Empty<bytes::Bytes>>(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(stream),
        )
        .await
        .unwrap_or_else(|e| panic!("h2 handshake: {e}"));
    let conn = tokio::spawn(conn);
    let request = http::Request::get(format!("http://{proxy}/"))
        .header("x-service", "api")
        .body(http_body_util::Empty::new())
        .unwrap();
    let response = send.send_request(request).await.expect("h2 request");
    assert_eq!(response.status(), StatusCode::OK);
    drop(response);
    let ended = tokio::time::timeout(Duration::from_secs(15), conn).await;
    assert!(ended.is_ok(), "the idle HTTP/2 connection is still open");

    let metrics = admin_text(proxima.admin, "/metrics").await;
    assert!(
        metric(
            &metrics,
            "proxima_client_connections_closed_total{reason=\"header_timeout\"}"
        ) >= 4.0,
        "{metrics}"
    );
}

/// Read one `200` answer whose body is `hi`, leaving the connection open.
async fn read_ok_hi(stream: &mut TcpStream) {
    let mut data = Vec::new();
    let mut chunk = [0u8; 4096];
    while !data.ends_with(b"hi") {
        let n = stream.read(&mut chunk).await.expect("an answer");
        assert!(n > 0, "closed before the answer");
        data.extend_from_slice(&chunk[..n]);
    }
    assert!(
        data.starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&data)
    );
}

/// HTTP/1.1 keep-alive: after a request, a silent connection is closed by the idle limit,
/// and a next request whose head has begun but does not complete, by the header limit
/// counted from its first byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_next_http1_head_that_never_completes_meets_the_header_timeout() {
    let (_dir, proxima) = with_client_timeouts("slow-head", "1s", "4s").await;
    let request = b"GET / HTTP/1.1\r\nhost: x\r\nx-service: api\r\n\r\n";
    // Silent after a request: still open after twice the header limit, closed by the
    // idle limit.
    let mut silent = TcpStream::connect(proxima.proxy).await.unwrap();
    silent.write_all(request).await.unwrap();
    read_ok_hi(&mut silent).await;
    assert!(
        !closed_within(&mut silent, Duration::from_secs(2)).await,
        "a silent keep-alive connection was closed before its idle limit"
    );
    assert!(closed_within(&mut silent, Duration::from_secs(10)).await);

    // A next head begun and left unfinished: closed by the header limit, well before
    // the idle one.
    let mut slow = TcpStream::connect(proxima.proxy).await.unwrap();
    slow.write_all(request).await.unwrap();
    read_ok_hi(&mut slow).await;
    slow.write_all(b"GET / HTTP/1.1\r\nx-serv").await.unwrap();
    let started = std::time::Instant::now();
    assert!(closed_within(&mut slow, Duration::from_secs(10)).await);
    assert!(
        started.elapsed() < Duration::from_millis(3500),
        "closed after {:?}: the idle limit, not the header limit",
        started.elapsed()
    );

    let metrics = admin_text(proxima.admin, "/metrics").await;
    assert!(
        metric(
            &metrics,
            "proxima_client_connections_closed_total{reason=\"header_timeout\"}"
        ) >= 1.0,
        "{metrics}"
    );
    assert!(
        metric(
            &metrics,
            "proxima_client_connections_closed_total{reason=\"idle\"}"
        ) >= 1.0,
        "{metrics}"
    );
}

/// Idle HTTP/1.1 connections park (give up their task, `park.rs`): counted by the parked
/// gauge, each wakes for its next request and is answered as before, a parked client
/// that closes is let go, and the idle limit still closes the rest, counted as idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_keep_alive_connections_park_wake_for_their_next_request_and_idle_out() {
    const CLIENTS: usize = 20;
    let (_dir, proxima) = with_client_timeouts("park", "2s", "4s").await;
    let request = b"GET / HTTP/1.1\r\nhost: x\r\nx-service: api\r\n\r\n";
    let gauges = |text: &str| {
        (
            metric(text, "proxima_client_connections "),
            metric(text, "proxima_client_connections_parked "),
        )
    };
    let wait_for = |open: usize, parked: usize| async move {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let text = admin_text(proxima.admin, "/metrics").await;
            let now = gauges(&text);
            if now == (open as f64, parked as f64) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "(open, parked) = {now:?}, not ({open}, {parked})"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let mut client = TcpStream::connect(proxima.proxy).await.unwrap();
        client.write_all(request).await.unwrap();
        read_ok_hi(&mut client).await;
        clients.push(client);
    }
    wait_for(CLIENTS, CLIENTS).await;

    // Woken by their next requests, twice, parking again in between.
    for _ in 0..2 {
        for client in &mut clients {
            client.write_all(request).await.unwrap();
            read_ok_hi(client).await;
        }
        wait_for(CLIENTS, CLIENTS).await;
    }
    // A request sent a byte at a time wakes its connection with the first byte.
    let slow = &mut clients[0];
    for byte in request.chunks(1) {
        slow.write_all(byte).await.unwrap();
    }
    read_ok_hi(slow).await;
    wait_for(CLIENTS, CLIENTS).await;

    // Parked clients that close are let go.
    let quitters = 5;
    clients.truncate(CLIENTS - quitters);
    wait_for(CLIENTS - quitters, CLIENTS - quitters).await;

    // The idle limit (4 s from the last answer) closes the rest.
    let since = Instant::now();
    for client in &mut clients {
        assert!(closed_within(client, Duration::from_secs(10)).await);
    }
    assert!(
        since.elapsed() < Duration::from_secs(6),
        "closed {:?} after the last answer, not by the 4 s idle limit",
        since.elapsed()
    );
    wait_for(0, 0).await;
    let text = admin_text(proxima.admin, "/metrics").await;
    assert!(
        metric(
            &text,
            "proxima_client_connections_closed_total{reason=\"idle\"}"
        ) >= (CLIENTS - quitters) as f64,
        "{text}"
    );
}

/// Read what `stream` has into `data`; the answer must not end there.
async fn read_more(stream: &mut TcpStream, data: &mut Vec<u8>) {
    let mut chunk = [0u8; 4096];
    let n = stream.read(&mut chunk).await.expect("an answer");
    assert!(
        n > 0,
        "closed mid-answer: {:?}",
        String::from_utf8_lossy(data)
    );
    data.extend_from_slice(&chunk[..n]);
}

/// One answer read off `stream`, framed by its `content-length` or chunked: its status
/// line (lower case) and its body, decoded. Nothing after it is read.
async fn read_answer(stream: &mut TcpStream) -> (String, Vec<u8>) {
    let mut data = Vec::new();
    let answer = read_next_answer(stream, &mut data).await;
    assert!(
        data.is_empty(),
        "bytes after the answer: the next one began early"
    );
    answer
}

/// The next answer from `data` and then `stream`, as [`read_answer`], leaving in `data`
/// what follows it: the answers to pipelined requests can come in one read.
async fn read_next_answer(stream: &mut TcpStream, data: &mut Vec<u8>) -> (String, Vec<u8>) {
    let end = loop {
        if let Some(at) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        read_more(stream, data).await;
    };
    let head = String::from_utf8_lossy(&data[..end]).to_lowercase();
    let status = head.lines().next().unwrap_or_default().to_string();
    let length = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .map(|n| n.trim().parse::<usize>().unwrap());
    let mut body = Vec::new();
    let mut at = end;
    match length {
        Some(length) => {
            while data.len() < end + length {
                read_more(stream, data).await;
            }
            body.extend_from_slice(&data[end..end + length]);
            at = end + length;
        }
        None => loop {
            let line_end = loop {
                if let Some(n) = data[at..].windows(2).position(|w| w == b"\r\n") {
                    break at + n;
                }
                read_more(stream, data).await;
            };
            let size = usize::from_str_radix(&String::from_utf8_lossy(&data[at..line_end]), 16)
                .expect("a chunk size");
            while data.len() < line_end + 2 + size + 2 {
                read_more(stream, data).await;
            }
            body.extend_from_slice(&data[line_end + 2..line_end + 2 + size]);
            at = line_end + 2 + size + 2;
            if size == 0 {
                break;
            }
        },
    }
    data.drain(..at);
    (status, body)
}

/// Devices that POST their readings: their connections park between requests as GET
/// ones do (the native loop reads a small body whole, `http1/serve.rs`, and keeps the
/// connection), and each resumes exactly where it was: bodies by length and chunked,
/// a body split by a pause longer than the park delay, a request pipelined right behind
/// a body, each read to the byte. A body over the loop's limit is hyper's (streamed,
/// answered the same), and that connection does not park.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_whose_requests_have_bodies_park_and_resume_exactly_where_they_were() {
    const CLIENTS: usize = 12;
    let dir = TempDir::new("park-bodies");
    let pod = backend("pod").await;
    let proxima = start(&dir, &[("api", pod.addr())], &[]).await;
    let parked = || async move {
        let text = admin_text(proxima.admin, "/metrics").await;
        metric(&text, "proxima_client_connections_parked ")
    };
    let wait_parked = |count: usize| async move {
        let deadline = Instant::now() + Duration::from_secs(10);
        while parked().await != count as f64 {
            assert!(
                Instant::now() < deadline,
                "{} parked, not {count}",
                parked().await
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let post = |reading: &str, chunked: bool| {
        let head = "POST /echo HTTP/1.1\r\nhost: x\r\nx-service: api\r\n";
        match chunked {
            false => format!("{head}content-length: {}\r\n\r\n{reading}", reading.len()),
            true => format!(
                "{head}transfer-encoding: chunked\r\n\r\n{:x}\r\n{reading}\r\n0\r\n\r\n",
                reading.len()
            ),
        }
    };
    let mut clients = Vec::new();
    for i in 0..CLIENTS {
        let mut client = TcpStream::connect(proxima.proxy).await.unwrap();
        let reading = format!("reading {i}");
        client
            .write_all(post(&reading, i % 2 == 1).as_bytes())
            .await
            .unwrap();
        let (status, body) = read_answer(&mut client).await;
        assert!(status.starts_with("http/1.1 200"), "{status}");
        assert_eq!(body, reading.as_bytes());
        clients.push(client);
    }
    wait_parked(CLIENTS).await;

    // Woken by a body and a GET pipelined behind it, in one write: both answered, in
    // order, the GET read from exactly where the body ended.
    for (i, client) in clients.iter_mut().enumerate() {
        let reading = format!("second reading {i}");
        let mut bytes = post(&reading, i % 2 == 0);
        bytes.push_str("GET /after HTTP/1.1\r\nhost: x\r\nx-service: api\r\n\r\n");
        client.write_all(bytes.as_bytes()).await.unwrap();
        let mut data = Vec::new();
        let (_, body) = read_next_answer(client, &mut data).await;
        assert_eq!(body, reading.as_bytes());
        let (status, echo) = read_next_answer(client, &mut data).await;
        assert!(data.is_empty(), "bytes after the GET's answer");
        assert!(status.starts_with("http/1.1 200"), "{status}");
        let echo: Value = serde_json::from_slice(&echo).unwrap();
        assert_eq!(
            (echo["method"].as_str(), echo["path"].as_str()),
            (Some("GET"), Some("/after"))
        );
    }
    wait_parked(CLIENTS).await;

    // A body split by a pause longer than the park delay: the connection waits for the
    // rest (it does not park mid-request) and the body arrives whole.
    let slow = &mut clients[0];
    let bytes = post("0123456789", false);
    let (first, rest) = bytes.split_at(bytes.len() - 4);
    slow.write_all(first.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(parked().await, (CLIENTS - 1) as f64);
    slow.write_all(rest.as_bytes()).await.unwrap();
    assert_eq!(read_answer(slow).await.1, b"0123456789");
    wait_parked(CLIENTS).await;

    // Over the loop's limit (16 KiB): hyper streams it, and keeps the connection.
    let large = "x".repeat(20_000);
    let big = &mut clients[1];
    big.write_all(post(&large, false).as_bytes()).await.unwrap();
    assert_eq!(read_answer(big).await.1, large.as_bytes());
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(parked().await, (CLIENTS - 1) as f64);
}

/// A client that waits for `100 Continue` before its body (curl does, for bodies over
/// 1 KiB) is asked for it by the proxy's own loop, and its connection then parks as any
/// other; with curl itself, the body arrives whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_expecting_100_continue_are_asked_for_their_body_and_park() {
    let dir = TempDir::new("park-continue");
    let pod = backend("pod").await;
    let proxima = start(&dir, &[("api", pod.addr())], &[]).await;
    let reading = "r".repeat(2000);
    let mut client = TcpStream::connect(proxima.proxy).await.unwrap();
    for _ in 0..2 {
        let head = format!(
            "POST /echo HTTP/1.1\r\nhost: x\r\nx-service: api\r\nexpect: 100-continue\r\n\
             content-length: {}\r\n\r\n",
            reading.len()
        );
        client.write_all(head.as_bytes()).await.unwrap();
        let interim = b"HTTP/1.1 100 Continue\r\n\r\n";
        let mut asked = vec![0u8; interim.len()];
        tokio::time::timeout(PATIENCE, client.read_exact(&mut asked))
            .await
            .expect("asked for the body")
            .unwrap();
        assert_eq!(asked, interim);
        client.write_all(reading.as_bytes()).await.unwrap();
        let (status, body) = read_answer(&mut client).await;
        assert!(status.starts_with("http/1.1 200"), "{status}");
        assert_eq!(body, reading.as_bytes());
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = admin_text(proxima.admin, "/metrics").await;
        if metric(&text, "proxima_client_connections_parked ") == 1.0 {
            break;
        }
        assert!(Instant::now() < deadline, "the connection did not park");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let file = dir.0.join("reading");
    std::fs::write(&file, &reading).unwrap();
    let url = format!("http://{}/echo", proxima.proxy);
    let curl = tokio::task::spawn_blocking(move || {
        std::process::Command::new("curl")
            .args(["-sS", "-H", "x-service: api", "--data-binary"])
            .arg(format!("@{}", file.display()))
            .arg(url)
            .output()
    })
    .await
    .unwrap()
    .expect("curl runs");
    assert!(
        curl.status.success(),
        "{}",
        String::from_utf8_lossy(&curl.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&curl.stdout), reading);
}

// ---- 2. stale keep-alive connections ----

/// A pod that closes its idle connections after 200 ms, without `Connection: close`,
/// and requests spaced around that moment, to race it: GETs and POSTs whose bodies the
/// proxy reads whole. A GET may go twice, so one that meets a connection closing under
/// it is sent again on a fresh one and every GET is answered. A POST is not written on
/// a connection the pod has already closed (the proxy asks the socket just before the
/// write); one written just as the pod closes (its close still on the way, or the pod
/// deciding to close as it arrives) may not be sent again, and gets `502`. So every
/// POST reaches the pod at most once: answered, and read by the pod exactly once, or
/// `502` and never read by the pod. How many took the `502` is printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_on_connections_the_pod_closed_while_idle_are_sent_again() {
    let dir = TempDir::new("stale");
    let served = Arc::new(AtomicUsize::new(0));
    let posts = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let pod = raw_backend(Some(Duration::from_millis(200)), {
        let served = served.clone();
        let posts = posts.clone();
        move |head, body| {
            if head.header("x-proxima-probe").is_none() {
                served.fetch_add(1, Ordering::Relaxed);
            }
            match head.method() {
                "POST" => {
                    let body = String::from_utf8_lossy(body).into_owned();
                    posts.lock().unwrap().push(body.clone());
                    (ok(&body, ""), false)
                }
                _ => (ok("fine", ""), false),
            }
        }
    })
    .await;
    let proxima = start(&dir, &[("api", pod)], &[]).await;
    let http = client();
    let mut failures = Vec::new();
    let mut unsent = Vec::new();
    for i in 0..100u64 {
        // Spaced around the pod's idle close, to race it.
        tokio::time::sleep(Duration::from_millis(190 + (i * 7) % 25)).await;
        if i % 2 == 1 {
            let reading = format!("reading {i}");
            let (status, body) = post(proxima.proxy, "/", &reading, "").await;
            let read = posts
                .lock()
                .unwrap()
                .iter()
                .filter(|b| **b == reading)
                .count();
            if status.starts_with("http/1.1 200") && body == reading && read == 1 {
                continue;
            }
            if status.starts_with("http/1.1 502")
                && body.contains("failed after the request was sent")
                && read == 0
            {
                let why = body.split("was sent: ").nth(1).unwrap_or_default();
                unsent.push(format!(
                    "#{i}: {}",
                    why.split('"').next().unwrap_or_default()
                ));
                continue;
            }
            failures.push(format!(
                "#{i}: {status} {body} (the pod read it {read} times)"
            ));
            continue;
        }
        let reply = get(&http, &format!("http://{}/", proxima.proxy), Some("api")).await;
        if reply.status != StatusCode::OK {
            failures.push(format!("#{i}: {} {}", reply.status, reply.body));
        }
    }
    eprintln!(
        "{} of 50 POSTs written as the pod closed, never read by it, answered 502: {unsent:?}",
        unsent.len()
    );
    assert!(
        failures.is_empty(),
        "{} failed: {failures:#?}",
        failures.len()
    );
    assert_eq!(served.load(Ordering::Relaxed), 100 - unsent.len());
    let metrics = admin_text(proxima.admin, "/metrics").await;
    if unsent.is_empty() {
        assert!(
            !metrics.contains("proxima_upstream_errors_total{"),
            "a stale connection counted against the pod:\n{metrics}"
        );
    }
    let pools = admin_text(proxima.admin, "/debug/pools?service=api").await;
    let pools: Value = serde_json::from_str(&pools).unwrap();
    let endpoint = &pools["services"][0]["endpoints"][0];
    assert_eq!(endpoint["requests"], 100, "{endpoint:#}");
}

/// A client request as [`resetting_pod`] read it: on which of its connections (numbered
/// in accept order), its path, and its body.
#[derive(Clone, Debug, PartialEq)]
struct Read {
    connection: usize,
    path: String,
    body: String,
}

/// A pod that answers each request `200` with its body, keeping the connection, except
/// the first request to each path under `/reset`: that one it reads whole (head and
/// body), then resets the connection (`SO_LINGER` 0) without a byte of answer, as a pod
/// that acted on a request and crashed would. It records every client request it read.
async fn resetting_pod() -> (std::net::SocketAddr, Arc<std::sync::Mutex<Vec<Read>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let reads = Arc::new(std::sync::Mutex::new(Vec::<Read>::new()));
    let record = reads.clone();
    tokio::spawn(async move {
        let mut accepted = 0;
        while let Ok((mut stream, _)) = listener.accept().await {
            let connection = accepted;
            accepted += 1;
            let record = record.clone();
            tokio::spawn(async move {
                while let Some(head) = read_head(&mut stream, None).await {
                    let length: usize = head
                        .header("content-length")
                        .map_or(0, |n| n.parse().unwrap());
                    let mut body = head.rest.clone();
                    let mut chunk = [0u8; 4096];
                    while body.len() < length {
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => body.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let body = String::from_utf8_lossy(&body).into_owned();
                    if head.is_probe() {
                        if stream.write_all(&ok("", "")).await.is_err() {
                            return;
                        }
                        continue;
                    }
                    let path = head.path().to_string();
                    let first = {
                        let mut reads = record.lock().unwrap();
                        let first = !reads.iter().any(|r| r.path == path);
                        reads.push(Read {
                            connection,
                            path: path.clone(),
                            body: body.clone(),
                        });
                        first
                    };
                    if first && path.starts_with("/reset") {
                        let _ = stream.set_zero_linger();
                        return;
                    }
                    if stream.write_all(&ok(&body, "")).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, reads)
}

/// POST `body` to `path` on service `api`, head and body in one write (so the proxy's
/// loop reads the body whole), with the `extra` header lines; the status line and body
/// of the answer.
async fn post(
    proxy: std::net::SocketAddr,
    path: &str,
    body: &str,
    extra: &str,
) -> (String, String) {
    let mut client = TcpStream::connect(proxy).await.unwrap();
    let request = format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\nx-service: api\r\n{extra}content-length: {}\r\n\r\n{body}",
        body.len()
    );
    client.write_all(request.as_bytes()).await.unwrap();
    let (status, body) = read_answer(&mut client).await;
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// Wait until the proxy keeps one idle connection to its pod, so that the next request
/// reuses it.
async fn one_idle_connection(proxima: &Proxima) {
    eventually("the pod connection back in the pool", || async {
        let text = admin_text(proxima.admin, "/metrics").await;
        (metric(&text, "proxima_upstream_idle_connections ") == 1.0).then_some(())
    })
    .await;
}

/// A pod that read a POST on a reused connection and reset it without answering may
/// have acted on it: the client gets `502` and the pod saw the POST once. The same with
/// an `Idempotency-Key`, by which the client says a second copy does no harm: the POST
/// goes again on a fresh connection and is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_the_pod_read_and_reset_is_sent_again_only_with_an_idempotency_key() {
    let dir = TempDir::new("reset-post");
    let (pod, reads) = resetting_pod().await;
    let proxima = start(&dir, &[("api", pod)], &[]).await;
    let reads = || reads.lock().unwrap().clone();

    let (status, _) = post(proxima.proxy, "/warm", "first", "").await;
    assert!(status.starts_with("http/1.1 200"), "{status}");
    one_idle_connection(&proxima).await;
    let (status, body) = post(proxima.proxy, "/reset-plain", "reading 1", "").await;
    assert!(status.starts_with("http/1.1 502"), "{status} {body}");
    assert!(body.contains("failed after the request was sent"), "{body}");
    let warm = reads()[0].connection;
    assert_eq!(
        reads()[1..],
        [Read {
            connection: warm,
            path: "/reset-plain".into(),
            body: "reading 1".into()
        }],
        "the POST came on the reused connection, once"
    );

    let (status, _) = post(proxima.proxy, "/warm-again", "second", "").await;
    assert!(status.starts_with("http/1.1 200"), "{status}");
    one_idle_connection(&proxima).await;
    let reused = reads().last().unwrap().connection;
    let (status, body) = post(
        proxima.proxy,
        "/reset-keyed",
        "reading 2",
        "idempotency-key: \"k-2\"\r\n",
    )
    .await;
    assert!(status.starts_with("http/1.1 200"), "{status} {body}");
    assert_eq!(body, "reading 2");
    let keyed: Vec<Read> = reads()
        .into_iter()
        .filter(|r| r.path == "/reset-keyed")
        .collect();
    assert_eq!(keyed.len(), 2, "{keyed:#?}");
    assert_eq!(keyed[0].connection, reused, "{keyed:#?}");
    assert_ne!(
        keyed[1].connection, reused,
        "sent again on a fresh connection"
    );
    assert!(keyed.iter().all(|r| r.body == "reading 2"), "{keyed:#?}");
}

// ---- 3. backend framing ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_framing_errors_never_reach_the_client_as_a_wrong_body() {
    let dir = TempDir::new("framing");
    let pod = raw_backend(None, |head, _| match head.path() {
        "/both" => (
            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n\
              a\r\n0123456789\r\na\r\nabcdefghij\r\n0\r\n\r\n"
                .to_vec(),
            false,
        ),
        _ => (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz-not-a-size\r\n".to_vec(),
            true,
        ),
    })
    .await;
    let proxima = start(&dir, &[("api", pod)], &[]).await;

    let both = exchange(
        proxima.proxy,
        b"GET /both HTTP/1.1\r\nhost: api\r\nconnection: close\r\n\r\n",
    )
    .await
    .expect("an answer");
    assert_eq!(both.status, 200, "{both:?}");
    assert!(!both.head.contains("content-length: 5"), "{}", both.head);
    assert_eq!(both.body, b"0123456789abcdefghij", "{both:?}");

    // Over a keep-alive connection too: the next request on it is answered normally.
    let http = client();
    for _ in 0..3 {
        let reply = get(
            &http,
            &format!("http://{}/both", proxima.proxy),
            Some("api"),
        )
        .await;
        assert_eq!(reply.body, "0123456789abcdefghij");
    }

    let broken = exchange(
        proxima.proxy,
        b"GET /broken HTTP/1.1\r\nhost: api\r\nconnection: close\r\n\r\n",
    )
    .await
    .expect("an answer, not an empty reply");
    assert_eq!(broken.status, 502, "{broken:?}");
    assert_eq!(broken.json()["error"], "upstream error");
}

// ---- 4. limits ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_count_and_uri_limits_answer_with_json() {
    let dir = TempDir::new("limits");
    let pod = raw_backend(None, |head, _| match head.path() {
        "/cookies" => {
            let cookies: String = (0..101)
                .map(|i| format!("set-cookie: c{i}=v{i}\r\n"))
                .collect();
            (ok("cookies", &cookies), false)
        }
        "/pod-431" => (
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n\r\n".to_vec(),
            false,
        ),
        _ => (ok("fine", ""), false),
    })
    .await;
    let proxima = start(&dir, &[("api", pod)], &[]).await;
    let proxy = proxima.proxy;

    let request = |headers: usize, path: &str| {
        let mut text = format!("GET {path} HTTP/1.1\r\nhost: api\r\nconnection: close\r\n");
        for i in 0..headers {
            text.push_str(&format!("x-h{i}: {i}\r\n"));
        }
        text.push_str("\r\n");
        text.into_bytes()
    };

    // 150 header lines: under the default limit of 200 (hyper's own is 100).
    let many = exchange(proxy, &request(150, "/")).await.expect("answer");
    assert_eq!(many.status, 200, "{many:?}");
    let too_many = exchange(proxy, &request(250, "/")).await.expect("answer");
    assert_eq!(too_many.status, 431, "{too_many:?}");
    assert_eq!(too_many.json()["error"], "too many request headers");
    // Past hyper's own header array (4 x the limit): still 431 with JSON.
    let far_too_many = exchange(proxy, &request(1000, "/")).await.expect("answer");
    assert_eq!(far_too_many.status, 431, "{far_too_many:?}");
    assert_eq!(far_too_many.json()["error"], "request headers too large");
    // A malformed head: 400 with JSON.
    let malformed = exchange(proxy, b"GET / HTTP/1.1\r\nbad header line\r\n\r\n")
        .await
        .expect("answer");
    assert_eq!(malformed.status, 400, "{malformed:?}");
    assert_eq!(malformed.json()["error"], "malformed request");

    // A pod's own 4xx answers pass through untouched, on a kept-alive connection too.
    let http = client();
    for _ in 0..3 {
        let reply = get(&http, &format!("http://{proxy}/pod-431"), Some("api")).await;
        assert_eq!(reply.status, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
        assert_eq!(reply.body, "", "a pod's answer was rewritten");
    }

    // A response with 101 Set-Cookie lines passes whole.
    let cookies = exchange(proxy, &request(0, "/cookies"))
        .await
        .expect("answer");
    assert_eq!(cookies.status, 200, "{cookies:?}");
    assert_eq!(cookies.head.matches("set-cookie:").count(), 101);

    // Over --max-uri-bytes (8 KiB): 414 with a JSON body, also past hyper's own limits
    // (65534 bytes of target, then its read buffer).
    for length in [9_000, 40_000, 100_000, 1 << 20] {
        let path = format!("/{}", "u".repeat(length));
        let long = exchange(proxy, &request(0, &path)).await.expect("answer");
        assert_eq!(long.status, 414, "{length}: {}", long.head);
        assert_eq!(long.json()["error"], "request target too long");
    }
}

/// RFC 9112's MUSTs for a request's `Host` (§3.2) and `Transfer-Encoding` (§6.1, §7):
/// refused with JSON before any pod sees them, on the native loop and on hyper's alike,
/// and the connection closed when the body's length is in doubt; what the rules allow
/// still passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_breaking_rfc_9112_host_and_framing_rules_never_reach_a_pod() {
    let dir = TempDir::new("rfc9112");
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = seen.clone();
    // Counts the test's requests (path `/t`), not the proxy's probes.
    let pod = raw_backend(None, move |head, body| {
        if head.path() == "/t" {
            counter.fetch_add(1, Ordering::Relaxed);
        }
        (ok(&String::from_utf8_lossy(body), ""), false)
    })
    .await;
    let proxima = start(&dir, &[("api", pod)], &[]).await;
    let proxy = proxima.proxy;
    let body = "5\r\nhello\r\n0\r\n\r\n";
    // (request, status, error, whether the proxy must close)
    let refused = [
        ("GET /t HTTP/1.1\r\nx-service: api\r\nconnection: close\r\n\r\n".to_string(), 400, "bad host", false),
        ("GET /t HTTP/1.1\r\nhost: api\r\nhost: other\r\nconnection: close\r\n\r\n".into(), 400, "bad host", false),
        ("GET /t HTTP/1.0\r\nhost: api\r\nhost: api\r\n\r\n".into(), 400, "bad host", false),
        ("GET /t HTTP/1.1\r\nhost: a b\r\nx-service: api\r\nconnection: close\r\n\r\n".into(), 400, "bad host", false),
        ("GET /t HTTP/1.1\r\nhost: user@api\r\nx-service: api\r\nconnection: close\r\n\r\n".into(), 400, "bad host", false),
        (format!("POST /t HTTP/1.1\r\nhost: api\r\ntransfer-encoding: chunked, chunked\r\n\r\n{body}"), 400, "bad framing", true),
        (format!("POST /t HTTP/1.1\r\nhost: api\r\ntransfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n\r\n{body}"), 400, "bad framing", true),
        (format!("POST /t HTTP/1.1\r\nhost: api\r\ntransfer-encoding: gzip, chunked\r\n\r\n{body}"), 501, "bad framing", true),
    ];
    for (request, status, error, closes) in &refused {
        let reply = exchange(proxy, request.as_bytes()).await.expect("answer");
        assert_eq!(reply.status, *status, "{request:?}: {reply:?}");
        assert_eq!(reply.json()["error"], *error, "{request:?}: {reply:?}");
        if *closes {
            assert!(
                reply.head.contains("connection: close"),
                "{request:?}: {reply:?}"
            );
        }
        assert_eq!(
            seen.load(Ordering::Relaxed),
            0,
            "{request:?} reached the pod"
        );
    }
    // HTTP/1.0 with Transfer-Encoding: its framing is faulty (hyper refuses it first).
    let old = format!("POST /t HTTP/1.0\r\nhost: api\r\ntransfer-encoding: chunked\r\n\r\n{body}");
    let reply = exchange(proxy, old.as_bytes()).await.expect("answer");
    assert_eq!(reply.status, 400, "{reply:?}");
    assert_eq!(
        seen.load(Ordering::Relaxed),
        0,
        "{old:?} reached the pod: {reply:?}"
    );

    let allowed = [
        // HTTP/1.0 needs no Host; an empty Host is a target without authority.
        "GET /t HTTP/1.0\r\nx-service: api\r\n\r\n".to_string(),
        "GET /t HTTP/1.1\r\nhost:\r\nx-service: api\r\nconnection: close\r\n\r\n".into(),
        "GET /t HTTP/1.1\r\nhost: [::1]:8080\r\nx-service: api\r\nconnection: close\r\n\r\n".into(),
        format!("POST /t HTTP/1.1\r\nhost: api\r\ntransfer-encoding: Chunked\r\nconnection: close\r\n\r\n{body}"),
    ];
    for request in &allowed {
        let reply = exchange(proxy, request.as_bytes()).await.expect("answer");
        assert_eq!(reply.status, 200, "{request:?}: {reply:?}");
    }
    assert_eq!(seen.load(Ordering::Relaxed), allowed.len());
    // Content-Length next to Transfer-Encoding: framed by the coding alone, the length
    // dropped, and the connection closed after the answer (§6.1).
    let both = format!(
        "POST /t HTTP/1.1\r\nhost: api\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n{body}"
    );
    let reply = exchange(proxy, both.as_bytes()).await.expect("answer");
    assert_eq!(
        (reply.status, &reply.body[..]),
        (200, &b"hello"[..]),
        "{reply:?}"
    );
    assert!(reply.head.contains("connection: close"), "{reply:?}");
}

/// A head that holds a bare CR (RFC 9112 §2.2) or another control byte where none may
/// be, and no line feed, is refused at once rather than left to the head timeout: the
/// CR-only payloads of the smuggling scanner (tests/conformance.rs) are this case, and
/// nginx answers them with 400 at once too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heads_with_a_bare_cr_or_a_control_byte_are_refused_at_once() {
    let dir = TempDir::new("bare-cr");
    let pod = raw_backend(None, |_, _| (ok("hi", ""), false)).await;
    let proxima = start(&dir, &[("api", pod)], &[]).await;
    for request in [
        &b"POST / HTTP/1.1\rHost: api\rContent-Length: 0\r\r"[..],
        b"GET / HTTP/1.1\rHost: api\r\r",
        b"GET /t HTTP/1.1\r\nhost: api\rx-a: b\r\r",
        b"GET /\0 HTTP/1.1",
        b"GET / HTTP/1.1\r\nhost: api\r\nx-a: \x01",
    ] {
        let mut stream = TcpStream::connect(proxima.proxy).await.expect("connect");
        stream.write_all(request).await.expect("write");
        // The write side stays open: only the proxy can end this exchange early.
        let mut answer = vec![0; 2048];
        let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut answer))
            .await
            .unwrap_or_else(|_| panic!("{request:?}: no answer within 5 s"))
            .expect("read");
        let answer = String::from_utf8_lossy(&answer[..read]);
        assert!(answer.starts_with("HTTP/1.1 400 "), "{request:?}: {answer}");
        assert!(answer.contains("application/json"), "{request:?}: {answer}");
    }
}

/// At the highest `--max-request-headers`, hyper's own header array (4 x the limit)
/// would be larger than a `HeaderMap` can hold: a head with more lines than a map takes
/// must still get 431 with JSON, not a panic and a dropped connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_header_lines_than_a_header_map_holds_get_431() {
    let dir = TempDir::new("limits-map");
    let pod = raw_backend(None, |_, _| (ok("hi", ""), false)).await;
    let flags = ["--max-request-headers", "10000"];
    let proxima = start(&dir, &[("api", pod)], &flags).await;
    let mut text = String::from("GET / HTTP/1.1\r\nhost: api\r\nconnection: close\r\n");
    for i in 0..33_000 {
        text.push_str(&format!("h{i}: v\r\n"));
    }
    text.push_str("\r\n");
    let reply = exchange(proxima.proxy, text.as_bytes())
        .await
        .expect("an answer, not a dropped connection");
    assert_eq!(reply.status, 431, "{reply:?}");
    assert_eq!(reply.json()["error"], "request headers too large");
    // The proxy still serves.
    let fine = exchange(
        proxima.proxy,
        b"GET / HTTP/1.1\r\nhost: api\r\nconnection: close\r\n\r\n",
    )
    .await
    .expect("answer");
    assert_eq!(fine.status, 200, "{fine:?}");
    assert!(!proxima.logs().contains("panicked"), "{}", proxima.logs());
}

// ---- 5. GET and HEAD bodies ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_and_head_bodies_are_forwarded_chunked_or_not() {
    let dir = TempDir::new("getbody");
    let pod = raw_backend(None, |_, body| {
        let got = String::from_utf8_lossy(body).into_owned();
        (ok("", &format!("x-got: [{got}]\r\n")), false)
    })
    .await;
    let proxima = start(&dir, &[("api", pod)], &[]).await;
    for method in ["GET", "HEAD"] {
        let chunked = format!(
            "{method} / HTTP/1.1\r\nhost: api\r\nconnection: close\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        );
        let reply = exchange(proxima.proxy, chunked.as_bytes())
            .await
            .expect("answer");
        assert!(
            reply.head.contains("x-got: [hello]"),
            "{method}: {}",
            reply.head
        );
        let sized = format!(
            "{method} / HTTP/1.1\r\nhost: api\r\nconnection: close\r\ncontent-length: 5\r\n\r\nhello"
        );
        let reply = exchange(proxima.proxy, sized.as_bytes())
            .await
            .expect("answer");
        assert!(
            reply.head.contains("x-got: [hello]"),
            "{method}: {}",
            reply.head
        );
    }
}

// ---- 6. stalled clients ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_releases_both_connections() {
    let dir = TempDir::new("stall");
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let pod = listener.local_addr().unwrap();
    let (released_tx, released) = tokio::sync::oneshot::channel::<Duration>();
    tokio::spawn(async move {
        // The proxy's first probe of a new pod may come first: answer it and go on.
        let mut stream = loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            let head = read_head(&mut stream, None).await.expect("request");
            if head.header("x-proxima-probe").is_none() {
                break stream;
            }
            let _ = stream
                .write_all(&ok("probe", "connection: close\r\n"))
                .await;
        };
        let size: u64 = 100 << 20;
        let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {size}\r\n\r\n");
        stream.write_all(head.as_bytes()).await.unwrap();
        let block = vec![b'x'; 64 << 10];
        let mut sent = 0;
        let mut stuck_since = None;
        while sent < size {
            match tokio::time::timeout(Duration::from_millis(200), stream.write(&block)).await {
                Ok(Ok(0)) | Ok(Err(_)) => break,
                Ok(Ok(n)) => {
                    sent += n as u64;
                    stuck_since = None;
                }
                Err(_) => {
                    stuck_since.get_or_insert_with(Instant::now);
                }
            }
        }
        let _ = released_tx.send(stuck_since.map_or(Duration::ZERO, |s| s.elapsed()));
    });
    let proxima = start(&dir, &[("api", pod)], &["--body-idle-timeout", "1s"]).await;
    let mut client = TcpStream::connect(proxima.proxy).await.unwrap();
    client
        .write_all(b"GET / HTTP/1.1\r\nhost: api\r\n\r\n")
        .await
        .unwrap();
    let mut first = [0u8; 4096];
    let n = client.read(&mut first).await.unwrap();
    assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"));
    // Now stop reading. The pod's connection must be closed (its writes fail) ...
    let stuck = tokio::time::timeout(Duration::from_secs(20), released)
        .await
        .expect("the pod connection is still open 20 s after the client stopped reading")
        .expect("pod task");
    assert!(stuck < Duration::from_secs(15), "{stuck:?}");
    // ... and so must the client's.
    assert!(closed_within(&mut client, Duration::from_secs(10)).await);
    let metrics = admin_text(proxima.admin, "/metrics").await;
    assert_eq!(
        metric(
            &metrics,
            "proxima_client_connections_closed_total{reason=\"stalled\"}"
        ),
        1.0,
        "{metrics}"
    );
}

/// A client that pipelines requests and never reads the answers. Each answer has no
/// body (a `204` with a large head), so no body streams and only the stall of the
/// writes can tell: once the socket is full nothing moves, and the stall limit closes
/// the connection as it would a stalled body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_pipelines_and_never_reads_is_cut_when_its_socket_is_full() {
    let dir = TempDir::new("stall-pipelined");
    let answer = format!(
        "HTTP/1.1 204 No Content\r\nx-pad: {}\r\n\r\n",
        "x".repeat(4000)
    );
    let pod = raw_backend(None, move |_, _| (answer.clone().into_bytes(), false)).await;
    let proxima = start(&dir, &[("api", pod)], &["--body-idle-timeout", "1s"]).await;
    let client = TcpStream::connect(proxima.proxy).await.unwrap();
    let (mut reader, mut writer) = client.into_split();
    // 4000 answers of 4 KB: far more than the sockets between can hold. Written from
    // a task of its own: the proxy stops reading requests once it cannot write.
    let writing = tokio::spawn(async move {
        let requests = "GET / HTTP/1.1\r\nhost: api\r\n\r\n".repeat(4000);
        let _ = writer.write_all(requests.as_bytes()).await;
        writer
    });
    let metrics = eventually("the connection is cut as stalled", || async {
        let metrics = admin_text(proxima.admin, "/metrics").await;
        let stalled = metric(
            &metrics,
            "proxima_client_connections_closed_total{reason=\"stalled\"}",
        );
        (stalled >= 1.0).then_some(metrics)
    })
    .await;
    assert_eq!(
        metric(&metrics, "proxima_client_connections "),
        0.0,
        "{metrics}"
    );
    // What the client then reads is answers up to the cut, then the end.
    let mut got = Vec::new();
    let _ = reader.read_to_end(&mut got).await;
    assert!(got.starts_with(b"HTTP/1.1 204 No Content\r\n"));
    writing.abort();
}

// ---- the connection budget ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_budget_are_shed_and_the_admin_server_still_answers() {
    let dir = TempDir::new("budget");
    let pod = raw_backend(None, |_, _| (ok("fine", ""), false)).await;
    let proxima = start(&dir, &[("api", pod)], &["--max-client-connections", "8"]).await;
    let mut held = Vec::new();
    for _ in 0..8 {
        held.push(TcpStream::connect(proxima.proxy).await.unwrap());
    }
    // Let the proxy accept them all before the next one.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut over = TcpStream::connect(proxima.proxy).await.unwrap();
    assert!(
        closed_within(&mut over, Duration::from_secs(5)).await,
        "a connection over the budget was kept"
    );
    let health = get(
        &client(),
        &format!("http://{}/healthz", proxima.admin),
        None,
    )
    .await;
    assert_eq!(health.status, StatusCode::OK);
    let metrics = admin_text(proxima.admin, "/metrics").await;
    assert!(
        metric(
            &metrics,
            "proxima_client_connections_closed_total{reason=\"shed\"}"
        ) >= 1.0
    );
    assert_eq!(
        metric(&metrics, "proxima_client_connections "),
        8.0,
        "{metrics}"
    );
    drop(held);
    let reply = eventually("a request is served once connections are free", || async {
        let reply = exchange(
            proxima.proxy,
            b"GET / HTTP/1.1\r\nhost: api\r\nconnection: close\r\n\r\n",
        )
        .await;
        reply.filter(|r| r.status == 200)
    })
    .await;
    assert_eq!(reply.body, b"fine");
}

/// With few file descriptors (ulimit -n 160) and the `auto` budget, a flood of client
/// connections is shed; the admin server and the topology reload keep working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_flood_under_a_low_file_limit_leaves_discovery_and_admin_working() {
    let dir = TempDir::new("flood");
    let pod = raw_backend(None, |_, _| (ok("fine", ""), false)).await;
    let other = raw_backend(None, |_, _| (ok("other", ""), false)).await;
    let path = dir.0.join("topology.yaml");
    std::fs::write(&path, topology(&[("api", pod)], "timeout: 10s")).unwrap();
    let discovery = format!("file:{}", path.display());
    let proxima = Proxima::start_under(
        &["prlimit", "--nofile=160", "--"],
        &["run", "--discovery", &discovery, "--node-name", "worker-1"],
        &[],
    )
    .await;
    let mut flood = Vec::new();
    for _ in 0..400 {
        if let Ok(stream) = TcpStream::connect(proxima.proxy).await {
            flood.push(stream);
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let health = get(
        &client(),
        &format!("http://{}/healthz", proxima.admin),
        None,
    )
    .await;
    assert_eq!(health.status, StatusCode::OK);
    // The topology file is still read: a new service appears.
    std::fs::write(
        &path,
        topology(&[("api", pod), ("other", other)], "timeout: 10s"),
    )
    .unwrap();
    eventually("the reloaded topology", || async {
        let pools = admin_text(proxima.admin, "/debug/pools?service=other").await;
        pools.contains("other-0").then_some(())
    })
    .await;
    let metrics = admin_text(proxima.admin, "/metrics").await;
    assert!(
        metric(
            &metrics,
            "proxima_client_connections_closed_total{reason=\"shed\"}"
        ) >= 300.0,
        "{metrics}"
    );
    assert!(
        !proxima.logs().contains("Too many open files"),
        "{}",
        proxima.logs()
    );
    drop(flood);
    let reply = eventually("a request once the flood is gone", || async {
        exchange(
            proxima.proxy,
            b"GET / HTTP/1.1\r\nhost: other\r\nconnection: close\r\n\r\n",
        )
        .await
        .filter(|r| r.status == 200)
    })
    .await;
    assert_eq!(reply.body, b"other");
}

// ---- 8. how services are named ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_names_from_headers_hosts_and_absolute_uris() {
    let dir = TempDir::new("naming");
    let api = raw_backend(None, |_, _| (ok("api", ""), false)).await;
    let web = raw_backend(None, |_, _| (ok("web", ""), false)).await;
    let proxima = start(&dir, &[("api", api), ("web", web)], &[]).await;
    let proxy = proxima.proxy;

    // An invalid x-service is echoed in part only.
    let junk = "a!".repeat(2500);
    let request =
        format!("GET / HTTP/1.1\r\nhost: api\r\nconnection: close\r\nx-service: {junk}\r\n\r\n");
    let reply = exchange(proxy, request.as_bytes()).await.expect("answer");
    assert_eq!(reply.status, 400);
    assert!(reply.body.len() < 600, "{} bytes echoed", reply.body.len());

    // The absolute-form URI's authority wins over Host.
    let reply = exchange(
        proxy,
        b"GET http://web.default/ HTTP/1.1\r\nhost: api\r\nconnection: close\r\n\r\n",
    )
    .await
    .expect("answer");
    assert_eq!(
        (reply.status, reply.body.as_slice()),
        (200, b"web".as_slice())
    );
    // ... and only services of the topology are reachable through it.
    let reply = exchange(
        proxy,
        b"GET http://example.com/ HTTP/1.1\r\nhost: api\r\nconnection: close\r\n\r\n",
    )
    .await
    .expect("answer");
    assert_eq!(reply.status, 404, "{reply:?}");
    let reply = exchange(
        proxy,
        b"GET http://nope.default:80/ HTTP/1.1\r\nhost: api\r\nconnection: close\r\n\r\n",
    )
    .await
    .expect("answer");
    assert_eq!(reply.status, 404, "{reply:?}");

    // A Host that names the machine names no service.
    for host in [
        "localhost",
        "localhost:8080",
        "127.0.0.1",
        "127.0.0.1:8080",
        "[::1]:8080",
    ] {
        let request = format!("GET / HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n");
        let reply = exchange(proxy, request.as_bytes()).await.expect("answer");
        assert_eq!(reply.status, 400, "{host}: {reply:?}");
        let json = reply.json();
        assert_eq!(json["error"], "no service named", "{host}: {json}");
        assert!(
            json["detail"]
                .as_str()
                .unwrap()
                .contains("name the service"),
            "{host}: {json}"
        );
    }
}
