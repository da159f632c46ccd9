//! Raw-socket peers for the tests that run the `proxima` binary: pods written for the
//! test that send exact bytes (in pieces, with pauses, closing when told) and record on
//! which of their connections each request came, a file topology to start the proxy on,
//! and a client that writes exact request bytes and reads the raw answer.
//! Included, after `support/binary.rs`, with
//! `#[path = "support/binary.rs"] mod binary; #[path = "support/raw.rs"] mod raw;`.
#![allow(dead_code)] // each test file uses a different part of it

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::binary::{client, get, Proxima, TempDir, PATIENCE};

/// A request head as a raw backend read it.
pub struct Head {
    pub text: String,
    /// Bytes read after the head (the start of the body).
    pub rest: Vec<u8>,
}

impl Head {
    pub fn method(&self) -> &str {
        self.text.split_whitespace().next().unwrap_or("")
    }

    pub fn path(&self) -> &str {
        self.text.split_whitespace().nth(1).unwrap_or("")
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.text.lines().skip(1).find_map(|line| {
            let (n, v) = line.split_once(':')?;
            n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }

    /// A background probe of the proxy, not a client's request.
    pub fn is_probe(&self) -> bool {
        self.header("x-proxima-probe").is_some()
    }
}

/// Read one request head; `None` when the peer closed (or reset) first.
pub async fn read_head(stream: &mut TcpStream, wait: Option<Duration>) -> Option<Head> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            return Some(Head {
                text: String::from_utf8_lossy(&buf[..at]).into_owned(),
                rest: buf[at + 4..].to_vec(),
            });
        }
        let read = match wait {
            Some(wait) if buf.is_empty() => {
                match tokio::time::timeout(wait, stream.read(&mut chunk)).await {
                    Ok(read) => read,
                    Err(_) => return None,
                }
            }
            _ => stream.read(&mut chunk).await,
        };
        match read {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Read a chunked body that begins with `rest`; returns the decoded bytes.
pub async fn read_chunked(stream: &mut TcpStream, mut rest: Vec<u8>) -> Vec<u8> {
    let mut chunk = [0u8; 4096];
    while !rest.ends_with(b"0\r\n\r\n") {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => rest.extend_from_slice(&chunk[..n]),
        }
    }
    dechunk(&rest)
}

/// Decode a complete chunked body (test input, trusted to be well formed).
pub fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(line_end) = data.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size_text = String::from_utf8_lossy(&data[..line_end]);
        let size =
            usize::from_str_radix(size_text.split(';').next().unwrap().trim(), 16).unwrap_or(0);
        data = &data[line_end + 2..];
        if size == 0 || data.len() < size {
            return out;
        }
        out.extend_from_slice(&data[..size]);
        data = &data[(size + 2).min(data.len())..];
    }
}

/// One step of what a raw pod does in answer to a request.
pub enum Step {
    Write(Vec<u8>),
    Pause(Duration),
    /// Set the flag: the steps before it are done.
    Mark(Arc<AtomicBool>),
    /// Wait until the flag is set (by the test; bounded by [`PATIENCE`]).
    Wait(Arc<AtomicBool>),
}

/// What a raw pod does in answer to one request: its writes (each its own `write`
/// call, with `TCP_NODELAY`, so pauses between them split the bytes on the wire), and
/// whether it closes the connection afterwards.
pub struct Script {
    pub steps: Vec<Step>,
    pub close: bool,
}

impl Script {
    /// Write `bytes` at once and keep the connection.
    pub fn send(bytes: impl Into<Vec<u8>>) -> Self {
        Self {
            steps: vec![Step::Write(bytes.into())],
            close: false,
        }
    }

    /// Write each piece in turn, pausing `pause` between them, and keep the connection.
    pub fn pieces<P: Into<Vec<u8>>>(pieces: impl IntoIterator<Item = P>, pause: Duration) -> Self {
        let mut steps = Vec::new();
        for piece in pieces {
            if !steps.is_empty() {
                steps.push(Step::Pause(pause));
            }
            steps.push(Step::Write(piece.into()));
        }
        Self {
            steps,
            close: false,
        }
    }

    /// Nothing at all, then close.
    pub fn hang_up() -> Self {
        Self {
            steps: Vec::new(),
            close: true,
        }
    }

    pub fn pause(mut self, pause: Duration) -> Self {
        self.steps.push(Step::Pause(pause));
        self
    }

    pub fn write(mut self, bytes: impl Into<Vec<u8>>) -> Self {
        self.steps.push(Step::Write(bytes.into()));
        self
    }

    /// Set `flag` once the steps so far are done.
    pub fn mark(mut self, flag: &Arc<AtomicBool>) -> Self {
        self.steps.push(Step::Mark(flag.clone()));
        self
    }

    /// Wait until `flag` is set before the next steps.
    pub fn wait_for(mut self, flag: &Arc<AtomicBool>) -> Self {
        self.steps.push(Step::Wait(flag.clone()));
        self
    }

    /// Close the connection once the steps are done.
    pub fn then_close(mut self) -> Self {
        self.close = true;
        self
    }
}

/// A request a raw pod read: on which of its accepted connections (numbered from 0 in
/// accept order), and its method and path.
#[derive(Clone, Debug)]
pub struct Served {
    pub connection: usize,
    pub method: String,
    pub path: String,
    pub probe: bool,
}

/// A raw pod: its address, the connections it accepted and the requests it read.
#[derive(Clone)]
pub struct RawPod {
    pub addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    served: Arc<Mutex<Vec<Served>>>,
}

impl RawPod {
    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// The clients' requests read so far (the proxy's probes left out), in order.
    pub fn requests(&self) -> Vec<Served> {
        let served = self.served.lock().unwrap();
        served.iter().filter(|s| !s.probe).cloned().collect()
    }

    /// The connection the client request to `path` came on (the last one, if several).
    pub fn connection_of(&self, path: &str) -> usize {
        self.requests()
            .iter()
            .rev()
            .find(|s| s.path == path)
            .unwrap_or_else(|| panic!("no request for {path} reached the pod"))
            .connection
    }
}

/// A raw HTTP/1.1 backend: each connection answers requests with `answer(head, body)`,
/// and closes a connection that stays idle for `idle_close` after a response, without
/// `Connection: close`.
pub async fn scripted_backend<F>(idle_close: Option<Duration>, answer: F) -> RawPod
where
    F: Fn(&Head, &[u8]) -> Script + Send + Sync + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let pod = RawPod {
        addr: listener.local_addr().unwrap(),
        accepted: Arc::new(AtomicUsize::new(0)),
        served: Arc::new(Mutex::new(Vec::new())),
    };
    let answer = Arc::new(answer);
    let shared = pod.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let connection = shared.accepted.fetch_add(1, Ordering::SeqCst);
            let _ = stream.set_nodelay(true);
            let answer = answer.clone();
            let served = shared.served.clone();
            tokio::spawn(async move {
                let mut first = true;
                loop {
                    let wait = if first { None } else { idle_close };
                    first = false;
                    let Some(head) = read_head(&mut stream, wait).await else {
                        // Idle too long (or the proxy left): close; unread bytes make it a reset.
                        return;
                    };
                    served.lock().unwrap().push(Served {
                        connection,
                        method: head.method().to_string(),
                        path: head.path().to_string(),
                        probe: head.is_probe(),
                    });
                    let body = if head
                        .header("transfer-encoding")
                        .is_some_and(|v| v.contains("chunked"))
                    {
                        read_chunked(&mut stream, head.rest.clone()).await
                    } else {
                        head.rest.clone()
                    };
                    let script = answer(&head, &body);
                    for step in script.steps {
                        match step {
                            Step::Write(bytes) => {
                                if stream.write_all(&bytes).await.is_err() {
                                    return;
                                }
                            }
                            Step::Pause(pause) => tokio::time::sleep(pause).await,
                            Step::Mark(flag) => flag.store(true, Ordering::SeqCst),
                            Step::Wait(flag) => {
                                let deadline = tokio::time::Instant::now() + PATIENCE;
                                while !flag.load(Ordering::SeqCst)
                                    && tokio::time::Instant::now() < deadline
                                {
                                    tokio::time::sleep(Duration::from_millis(5)).await;
                                }
                            }
                        }
                    }
                    if script.close {
                        return;
                    }
                }
            });
        }
    });
    pod
}

/// A raw HTTP/1.1 backend whose answer to each request is the bytes to write at once,
/// and whether to close afterwards (see [`scripted_backend`]).
pub async fn raw_backend<F>(idle_close: Option<Duration>, answer: F) -> SocketAddr
where
    F: Fn(&Head, &[u8]) -> (Vec<u8>, bool) + Send + Sync + 'static,
{
    scripted_backend(idle_close, move |head, body| {
        let (bytes, close) = answer(head, body);
        Script {
            steps: vec![Step::Write(bytes)],
            close,
        }
    })
    .await
    .addr
}

pub fn ok(body: &str, extra: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n{extra}\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// A topology naming each `(service, address)` pair with one endpoint.
pub fn topology(services: &[(&str, SocketAddr)], settings: &str) -> String {
    let mut text = String::from("nodes:\n  - { name: worker-1 }\nservices:\n");
    for (name, addr) in services {
        text.push_str(&format!(
            "  - name: {name}\n    settings: {{ {settings} }}\n    endpoints:\n      - {{ id: {name}-0, address: '{addr}', node: worker-1 }}\n"
        ));
    }
    text
}

pub async fn start(dir: &TempDir, services: &[(&str, SocketAddr)], flags: &[&str]) -> Proxima {
    start_with_settings(dir, services, "timeout: 10s", flags).await
}

pub async fn start_with_settings(
    dir: &TempDir,
    services: &[(&str, SocketAddr)],
    settings: &str,
    flags: &[&str],
) -> Proxima {
    start_on_topology(dir, &topology(services, settings), flags).await
}

/// Start the proxy on the topology `text` (written to `dir`).
pub async fn start_on_topology(dir: &TempDir, text: &str, flags: &[&str]) -> Proxima {
    let path = dir.0.join("topology.yaml");
    std::fs::write(&path, text).unwrap();
    let discovery = format!("file:{}", path.display());
    let mut args = vec![
        "run",
        "--discovery",
        discovery.as_str(),
        "--node-name",
        "worker-1",
    ];
    args.extend_from_slice(flags);
    Proxima::start(&args).await
}

/// A raw HTTP/1.1 exchange: write `request`, read until the proxy closes (send
/// `connection: close`), and split the answer. `None` when the connection closed or
/// broke with no answer at all.
pub async fn exchange(proxy: SocketAddr, request: &[u8]) -> Option<RawReply> {
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut data = Vec::new();
    let read = tokio::time::timeout(PATIENCE, async {
        let mut chunk = [0u8; 65536];
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => data.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await;
    assert!(read.is_ok(), "no end of the answer within {PATIENCE:?}");
    RawReply::parse(&data)
}

#[derive(Debug)]
pub struct RawReply {
    pub status: u16,
    /// The head, lowercased.
    pub head: String,
    pub body: Vec<u8>,
}

impl RawReply {
    pub fn parse(data: &[u8]) -> Option<Self> {
        let at = data.windows(4).position(|w| w == b"\r\n\r\n")?;
        let head = String::from_utf8_lossy(&data[..at]).to_ascii_lowercase();
        let status = head.split_whitespace().nth(1)?.parse().ok()?;
        let raw = &data[at + 4..];
        let body = if head.contains("transfer-encoding: chunked") {
            dechunk(raw)
        } else {
            raw.to_vec()
        };
        Some(Self { status, head, body })
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }
}

/// Whether the proxy closes `stream` within `limit` (reads whatever it sent first).
pub async fn closed_within(stream: &mut TcpStream, limit: Duration) -> bool {
    let mut chunk = [0u8; 65536];
    tokio::time::timeout(limit, async {
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

pub async fn admin_text(admin: SocketAddr, path: &str) -> String {
    get(&client(), &format!("http://{admin}{path}"), None)
        .await
        .body
}

/// The value of the first metric line starting with `series` (0 when absent).
pub fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}
