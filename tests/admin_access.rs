//! The admin port of the real `proxima` binary as the node network sees it (issue 10,
//! item 7): health and metrics answer everyone; `/debug/*` and `/node/*` answer loopback,
//! trusted networks, or the shared token; `PUT /node/usage` is validated, capped and
//! timed out.
//!
//! The client must come from an address that is not loopback, so the test runs in a
//! network namespace of its own (tests/k8s/netns.rs) and connects from 10.250.0.x.
//! Needs the binary: `cargo build -p proxima` first.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

#[path = "support/binary.rs"]
mod binary;
#[path = "k8s/netns.rs"]
mod netns;

use binary::*;

/// Connect to `to` from `from` (any port).
async fn connect_from(from: IpAddr, to: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(from, 0)).unwrap();
    socket.connect(to).await.unwrap()
}

/// One request with `connection: close`; the status and body of the answer.
async fn ask(from: IpAddr, admin: SocketAddr, request: String) -> (u16, String) {
    let mut stream = connect_from(from, admin).await;
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut data = Vec::new();
    tokio::time::timeout(PATIENCE, stream.read_to_end(&mut data))
        .await
        .expect("an answer in time")
        .expect("read");
    let text = String::from_utf8_lossy(&data).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (status, body)
}

fn get_req(path: &str, token: Option<&str>) -> String {
    let auth = token.map_or(String::new(), |t| format!("authorization: Bearer {t}\r\n"));
    format!("GET {path} HTTP/1.1\r\nhost: admin\r\nconnection: close\r\n{auth}\r\n")
}

fn put_usage(body: &str, token: &str) -> String {
    format!(
        "PUT /node/usage HTTP/1.1\r\nhost: admin\r\nconnection: close\r\n\
         authorization: Bearer {token}\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}

#[test]
fn debug_and_node_endpoints_need_loopback_a_trusted_network_or_the_token() {
    let Some(hosts) =
        netns::isolated("debug_and_node_endpoints_need_loopback_a_trusted_network_or_the_token")
    else {
        return;
    };
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(run(hosts));
}

async fn run(hosts: Vec<IpAddr>) {
    let dir = TempDir::new("admin-access");
    let path = dir.0.join("topology.yaml");
    std::fs::write(
        &path,
        "nodes:\n  - { name: worker-1 }\nservices:\n  - name: api\n    endpoints:\n      - { id: api-0, address: '127.0.0.1:9', node: worker-1 }\n",
    )
    .unwrap();
    let discovery = format!("file:{}", path.display());
    let trusted = format!("{}/32", hosts[2]);
    let proxima = Proxima::start(&[
        "run",
        "--discovery",
        &discovery,
        "--node-name",
        "worker-1",
        "--allow-usage-override",
        "--admin-token",
        "s3cret-token",
        "--admin-trusted-networks",
        &trusted,
    ])
    .await;
    let admin = proxima.admin;
    let (outside, trusted_host) = (hosts[1], hosts[2]);
    let loopback: IpAddr = "127.0.0.1".parse().unwrap();

    // Health and metrics: everyone, as the kubelet and Prometheus need.
    for path in ["/healthz", "/readyz", "/metrics"] {
        let (status, _) = ask(outside, admin, get_req(path, None)).await;
        assert_eq!(status, 200, "{path} from the node network");
    }
    // Debug and node endpoints: not from the node network without the token ...
    for path in ["/debug/pools", "/node/ping"] {
        let (status, body) = ask(outside, admin, get_req(path, None)).await;
        assert_eq!(status, 403, "{path}: {body}");
        assert!(body.contains("\"forbidden\""), "{body}");
        assert!(!body.contains("api-0"), "{body}");
        let (status, _) = ask(outside, admin, get_req(path, Some("wrong-token"))).await;
        assert_eq!(status, 403, "{path} with a wrong token");
        // ... but with it, from loopback, or from a trusted network.
        let (status, body) = ask(outside, admin, get_req(path, Some("s3cret-token"))).await;
        assert_eq!(status, 200, "{path} with the token: {body}");
        let (status, _) = ask(loopback, admin, get_req(path, None)).await;
        assert_eq!(status, 200, "{path} from loopback");
        let (status, _) = ask(trusted_host, admin, get_req(path, None)).await;
        assert_eq!(status, 200, "{path} from a trusted network");
    }
    let (status, body) = ask(
        outside,
        admin,
        get_req("/debug/pools", Some("s3cret-token")),
    )
    .await;
    assert_eq!(status, 200);
    assert!(body.contains("api-0"), "{body}");

    // PUT /node/usage: fractions only.
    let token = "s3cret-token";
    let (status, body) = ask(
        outside,
        admin,
        put_usage(r#"{"cpu": 2.0, "ram": 0.5}"#, token),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = ask(
        outside,
        admin,
        put_usage(r#"{"cpu": 0.5, "ram": -0.1}"#, token),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = ask(
        outside,
        admin,
        put_usage(r#"{"cpu": 0.5, "ram": 1.0}"#, token),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // A declared 10 GB body is refused at once; a body that never comes is timed out.
    let huge = format!(
        "PUT /node/usage HTTP/1.1\r\nhost: admin\r\nconnection: close\r\n\
         authorization: Bearer {token}\r\ncontent-length: 10000000000\r\n\r\n{{"
    );
    let (status, body) = ask(outside, admin, huge).await;
    assert_eq!(status, 413, "{body}");
    let started = Instant::now();
    let slow = format!(
        "PUT /node/usage HTTP/1.1\r\nhost: admin\r\nconnection: close\r\n\
         authorization: Bearer {token}\r\ncontent-length: 100\r\n\r\n{{"
    );
    let (status, body) = ask(outside, admin, slow).await;
    assert_eq!(status, 408, "{body}");
    assert!(started.elapsed() < Duration::from_secs(30));
}
