//! The client side of the real `proxima` binary, byte by byte: persistence, pipelining,
//! the framing of answers the proxy writes (its own HTTP/1.1 loop for body-less
//! requests, `serve_h1.rs`) and the hand-over to hyper in the middle of a connection
//! when a request with a body arrives.
//!
//! Needs the binary: `cargo build -p proxima` first.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[path = "support/binary.rs"]
mod binary;
#[path = "support/raw.rs"]
mod raw;

use binary::*;
use raw::*;

/// A pod that answers each request with its path as the body, `x-method` naming the
/// method and `x-got` the length of the body it received (HEAD: the length, no body).
async fn echo_pod() -> RawPod {
    scripted_backend(None, |head, body| {
        let path = head.path().to_string();
        let extra = format!("x-method: {}\r\nx-got: {}\r\n", head.method(), body.len());
        if head.method() == "HEAD" {
            let bytes = format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n{extra}\r\n",
                path.len()
            );
            return Script::send(bytes);
        }
        Script::send(ok(&path, &extra))
    })
    .await
}

/// Everything the proxy sends on `stream` until it closes it.
async fn read_to_close(stream: &mut TcpStream) -> String {
    let mut data = Vec::new();
    let read = tokio::time::timeout(PATIENCE, stream.read_to_end(&mut data)).await;
    assert!(read.is_ok(), "the proxy did not close within {PATIENCE:?}");
    String::from_utf8_lossy(&data).to_ascii_lowercase()
}

/// The answers in `data`, split at their status lines.
fn answers(data: &str) -> Vec<&str> {
    let mut starts: Vec<usize> = data.match_indices("http/1.").map(|(at, _)| at).collect();
    starts.push(data.len());
    starts.windows(2).map(|w| &data[w[0]..w[1]]).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_are_answered_in_order_across_the_hand_over_to_hyper() {
    let dir = TempDir::new("pipelined");
    let pod = echo_pod().await;
    let proxima = start(&dir, &[("api", pod.addr)], &[]).await;
    let mut stream = TcpStream::connect(proxima.proxy).await.unwrap();
    // Body-less requests (the proxy's own loop), then one with a body (hyper takes the
    // connection over, with the bytes already read), then more for hyper: all in one
    // write.
    let requests = concat!(
        "GET /one HTTP/1.1\r\nhost: api\r\nx-service: api\r\n\r\n",
        "HEAD /two HTTP/1.1\r\nhost: api\r\nx-service: api\r\n\r\n",
        "DELETE /three HTTP/1.1\r\nhost: api\r\nx-service: api\r\ncontent-length: 0\r\n\r\n",
        "POST /four HTTP/1.1\r\nhost: api\r\nx-service: api\r\ncontent-length: 5\r\n\r\nhello",
        "GET /five HTTP/1.1\r\nhost: api\r\nx-service: api\r\nconnection: close\r\n\r\n",
    );
    stream.write_all(requests.as_bytes()).await.unwrap();
    let data = read_to_close(&mut stream).await;
    let answers = answers(&data);
    assert_eq!(answers.len(), 5, "{data}");
    let expect = [
        ("/one", "get", "0"),
        ("", "head", "0"),
        ("/three", "delete", "0"),
        ("/four", "post", "5"),
        ("/five", "get", "0"),
    ];
    for (answer, (body, method, got)) in answers.iter().zip(expect) {
        assert!(answer.starts_with("http/1.1 200 ok\r\n"), "{answer}");
        assert!(
            answer.contains(&format!("\r\nx-method: {method}\r\n")),
            "{answer}"
        );
        assert!(
            answer.contains(&format!("\r\nx-got: {got}\r\n")),
            "{answer}"
        );
        assert!(answer.ends_with(&format!("\r\n\r\n{body}")), "{answer}");
        assert!(answer.contains("\r\ndate: "), "{answer}");
    }
    // The HEAD answer keeps the length a GET would have.
    assert!(
        answers[1].contains("\r\ncontent-length: 4\r\n"),
        "{}",
        answers[1]
    );
    assert!(
        answers[4].contains("\r\nconnection: close\r\n"),
        "{}",
        answers[4]
    );
    let paths: Vec<String> = pod.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(paths, ["/one", "/two", "/three", "/four", "/five"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_1_0_clients_get_close_or_keep_alive_as_they_ask() {
    let dir = TempDir::new("http10");
    let pod = echo_pod().await;
    let proxima = start(&dir, &[("api", pod.addr)], &[]).await;

    // No keep-alive asked: one answer, marked, then the close.
    let mut stream = TcpStream::connect(proxima.proxy).await.unwrap();
    stream
        .write_all(b"GET /a HTTP/1.0\r\nx-service: api\r\n\r\n")
        .await
        .unwrap();
    let data = read_to_close(&mut stream).await;
    assert!(data.starts_with("http/1.0 200 ok\r\n"), "{data}");
    assert!(data.contains("\r\nconnection: close\r\n"), "{data}");
    assert!(data.ends_with("\r\n\r\n/a"), "{data}");

    // Keep-alive asked: the answer says so and the connection takes a second request.
    let mut stream = TcpStream::connect(proxima.proxy).await.unwrap();
    stream
        .write_all(b"GET /b HTTP/1.0\r\nx-service: api\r\nconnection: keep-alive\r\n\r\n")
        .await
        .unwrap();
    let mut data = Vec::new();
    let mut chunk = [0u8; 4096];
    while !data.ends_with(b"/b") {
        let n = tokio::time::timeout(PATIENCE, stream.read(&mut chunk))
            .await
            .expect("an answer in time")
            .unwrap();
        assert!(n > 0, "closed after a keep-alive request");
        data.extend_from_slice(&chunk[..n]);
    }
    let first = String::from_utf8_lossy(&data).to_ascii_lowercase();
    assert!(first.contains("\r\nconnection: keep-alive\r\n"), "{first}");
    stream
        .write_all(b"GET /c HTTP/1.0\r\nx-service: api\r\n\r\n")
        .await
        .unwrap();
    let second = read_to_close(&mut stream).await;
    assert!(second.ends_with("\r\n\r\n/c"), "{second}");
}

/// A pod that answers with a body whose length it does not say (HTTP/1.0 style, ended
/// by its close), or chunked with a trailer.
async fn unframed_pod() -> RawPod {
    scripted_backend(None, |head, _| match head.path() {
        "/until-close" => {
            Script::send(&b"HTTP/1.0 200 OK\r\nx-kind: close\r\n\r\nuntil the close"[..]).then_close()
        }
        _ => Script::send(
            &b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntrailer: x-sum\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\nx-sum: 11\r\n\r\n"[..],
        ),
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_without_a_length_go_chunked_to_http_1_1_and_until_close_to_http_1_0() {
    let dir = TempDir::new("unframed");
    let pod = unframed_pod().await;
    let proxima = start(&dir, &[("api", pod.addr)], &[]).await;
    for (request, chunked) in [
        (
            "GET /until-close HTTP/1.1\r\nhost: api\r\nx-service: api\r\nconnection: close\r\n\r\n",
            true,
        ),
        (
            "GET /chunked HTTP/1.1\r\nhost: api\r\nx-service: api\r\nconnection: close\r\n\r\n",
            true,
        ),
        ("GET /until-close HTTP/1.0\r\nx-service: api\r\n\r\n", false),
    ] {
        let reply = exchange(proxima.proxy, request.as_bytes())
            .await
            .unwrap_or_else(|| panic!("no answer to {request:?}"));
        assert_eq!(reply.status, 200, "{reply:?}");
        assert_eq!(
            reply.head.contains("transfer-encoding: chunked"),
            chunked,
            "{request:?}: {reply:?}"
        );
        assert!(!reply.head.contains("content-length"), "{reply:?}");
        let body = String::from_utf8_lossy(&reply.body).into_owned();
        let expected = if request.contains("until-close") {
            "until the close"
        } else {
            "hello world"
        };
        assert_eq!(body, expected, "{request:?}: {reply:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_head_of_a_slow_body_goes_out_before_the_body() {
    let dir = TempDir::new("slow-body");
    let pod = scripted_backend(None, |_, _| {
        Script::send(&b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\n"[..])
            .pause(Duration::from_secs(2))
            .write(&b"late"[..])
    })
    .await;
    let proxima = start(&dir, &[("api", pod.addr)], &[]).await;
    let mut stream = TcpStream::connect(proxima.proxy).await.unwrap();
    let sent = Instant::now();
    stream
        .write_all(b"GET / HTTP/1.1\r\nhost: api\r\nx-service: api\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut data = Vec::new();
    let mut chunk = [0u8; 4096];
    while !data.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut chunk).await.unwrap();
        assert!(n > 0, "closed before the head");
        data.extend_from_slice(&chunk[..n]);
    }
    let head_after = sent.elapsed();
    assert!(
        !data.ends_with(b"late"),
        "the head waited for the body ({head_after:?})"
    );
    let rest = read_to_close(&mut stream).await;
    assert!(
        rest.ends_with("late"),
        "{rest:?} after {:?}",
        String::from_utf8_lossy(&data)
    );
}

/// A small first body frame goes out copied behind the head in one `send`, a larger one
/// with the head in one `writev` (`serve_h1.rs`): bodies on either side of that limit,
/// with a length and chunked, arrive whole and in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_either_side_of_the_copy_limit_arrive_whole() {
    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| b'a' + (i % 26) as u8).collect()
    }
    let dir = TempDir::new("copy-limit");
    let pod = scripted_backend(None, |head, _| {
        let mut parts = head.path().trim_start_matches('/').split('/');
        let kind = parts.next().unwrap_or_default().to_string();
        let len: usize = parts.next().and_then(|n| n.parse().ok()).unwrap_or(0);
        let body = pattern(len);
        let mut answer = if kind == "chunked" {
            format!("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n{len:x}\r\n").into_bytes()
        } else {
            format!("HTTP/1.1 200 OK\r\ncontent-length: {len}\r\n\r\n").into_bytes()
        };
        answer.extend_from_slice(&body);
        if kind == "chunked" {
            answer.extend_from_slice(b"\r\n0\r\n\r\n");
        }
        Script::send(answer)
    })
    .await;
    let proxima = start(&dir, &[("api", pod.addr)], &[]).await;
    for kind in ["length", "chunked"] {
        for len in [1, 100, 4095, 4096, 4097, 10_000, 200_000] {
            let request = format!(
                "GET /{kind}/{len} HTTP/1.1\r\nhost: api\r\nx-service: api\r\nconnection: close\r\n\r\n"
            );
            let reply = exchange(proxima.proxy, request.as_bytes())
                .await
                .unwrap_or_else(|| panic!("no answer to {request:?}"));
            assert_eq!(reply.status, 200, "{kind} {len}: {}", reply.head);
            assert_eq!(reply.body.len(), len, "{kind} {len}: {}", reply.head);
            assert!(reply.body == pattern(len), "{kind} {len}: the bytes differ");
        }
    }
}
