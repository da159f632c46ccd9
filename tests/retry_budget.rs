//! The real `proxima` binary with every pod of a service failing: retries share the
//! service's retry budget, so the pods see about `(1 + ratio) × requests` attempts plus
//! the floor, not `(1 + retries) × requests`.
//!
//! The pods are raw TCP listeners that read each request and close the connection
//! without answering (a reset after the request was sent), so a `GET` is retried on
//! another pod, and every attempt is one accepted connection, which the test counts.
//!
//! Needs the binary: `cargo build -p proxima` first.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::StatusCode;
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;

#[path = "support/binary.rs"]
mod binary;

use binary::*;

/// A pod that reads a request and closes the connection without an answer, counting
/// the connections it accepted.
async fn failing_pod() -> (SocketAddr, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let accepted = Arc::new(AtomicU64::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                // Wait for the request head, then drop the connection.
                let _ = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf)).await;
            });
        }
    });
    (addr, accepted)
}

/// The value of an unlabelled-but-for-service counter in `/metrics` text.
fn counter(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .find(|l| l.starts_with(name) && l.contains("service=\"dps.default\""))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_does_not_multiply_the_load_by_the_retries() {
    let dir = TempDir::new("retry-budget");
    let path = dir.0.join("topology.yaml");
    let mut pods = Vec::new();
    for _ in 0..3 {
        pods.push(failing_pod().await);
    }
    // retries 2: without a budget every request would cost the pods 3 attempts.
    let (ratio, floor_per_second, ttl_secs) = (0.2, 1u64, 10u64);
    let mut text = format!(
        "services:\n  - name: dps\n    settings: {{ retries: 2, retry-budget-ratio: {ratio}, \
         retry-budget-min-per-second: {floor_per_second}, retry-budget-ttl: {ttl_secs}s, \
         strategy: random }}\n    endpoints:\n"
    );
    for (i, (addr, _)) in pods.iter().enumerate() {
        text.push_str(&format!("      - {{ id: pod-{i}, address: '{addr}' }}\n"));
    }
    std::fs::write(&path, text).unwrap();
    let discovery = format!("file:{}", path.display());
    let proxima = Proxima::start(&["run", "--discovery", &discovery]).await;
    let http = client();

    let requests = 200u64;
    let start = Instant::now();
    for _ in 0..requests {
        let reply = get(&http, &format!("http://{}/", proxima.proxy), Some("dps")).await;
        assert_eq!(reply.status, StatusCode::BAD_GATEWAY, "{}", reply.body);
    }
    let elapsed = start.elapsed();
    // Let the last connections be counted.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let attempts: u64 = pods.iter().map(|(_, n)| n.load(Ordering::Relaxed)).sum();
    // The floor is earned once per window the run touched.
    let windows = elapsed.as_secs() / ttl_secs + 2;
    let bound = requests + (requests as f64 * ratio) as u64 + floor_per_second * ttl_secs * windows;
    assert!(
        attempts >= requests,
        "every request reached a pod: {attempts} attempts for {requests} requests"
    );
    assert!(
        attempts <= bound,
        "{attempts} upstream attempts for {requests} requests exceed the budget's {bound} \
         (without it: {})",
        requests * 3
    );

    let metrics = get(&http, &format!("http://{}/metrics", proxima.admin), None)
        .await
        .body;
    let retries = counter(&metrics, "proxima_retries_total");
    let refused = counter(&metrics, "proxima_retries_refused_total");
    assert_eq!(retries, attempts - requests, "{metrics}");
    assert!(
        refused >= requests / 2,
        "most requests wanted a retry the budget refused: {refused}"
    );
}
