//! The real `proxima` binary following a topology file: routing to emulated pods, live
//! edits (add/remove endpoints, change the SLO) without restart, measurements kept for
//! endpoints that stay, invalid edits ignored with a log line that names the line.
//!
//! Needs the binary: `cargo build -p proxima` first.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};

use http::StatusCode;
use proxima_emulate::Backend;
use serde_json::Value;

#[path = "support/binary.rs"]
mod binary;

use binary::*;

// ---- the tests ----

/// A topology of service `dps` with endpoints `(id, backend)`, the SLO on line 5.
fn topology(slo: &str, endpoints: &[(&str, &Backend)]) -> String {
    let mut text =
        String::from("nodes:\n  - { name: worker-1, zone: edge-a }\nservices:\n  - name: dps\n");
    text.push_str(&format!(
        "    settings: {{ latency-slo: {slo}, timeout: 10s }}\n"
    ));
    text.push_str("    endpoints:\n");
    for (id, b) in endpoints {
        text.push_str(&format!(
            "      - {{ id: {id}, address: '{}', node: worker-1 }}\n",
            b.addr()
        ));
    }
    text
}

/// Replace the file as editors do: write a sibling, rename it over.
fn replace(path: &Path, text: &str) {
    let tmp = path.with_extension("swp");
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

/// `dps.default` in `/debug/pools`.
async fn pools(client: &HttpClient, admin: SocketAddr) -> Value {
    let reply = get(
        client,
        &format!("http://{admin}/debug/pools?service=dps.default"),
        None,
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let json: Value = serde_json::from_str(&reply.body).expect("pools JSON");
    json["services"][0].clone()
}

fn endpoint<'v>(service: &'v Value, id: &str) -> Option<&'v Value> {
    service["endpoints"]
        .as_array()?
        .iter()
        .find(|e| e["id"] == id)
}

fn ids(service: &Value) -> Vec<String> {
    service["endpoints"]
        .as_array()
        .map(|eps| {
            eps.iter()
                .map(|e| e["id"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// Send `n` requests to `dps`; every one must succeed. Returns the backends that answered.
async fn send(client: &HttpClient, proxy: SocketAddr, n: usize) -> Vec<String> {
    let mut seen = Vec::new();
    for _ in 0..n {
        let reply = get(client, &format!("http://{proxy}/"), Some("dps")).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        seen.push(reply.backend.expect("x-backend"));
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follows_edits_of_the_topology_file_without_restart() {
    let dir = TempDir::new("file");
    let path = dir.0.join("topology.yaml");
    let (a, b, c) = (backend("a").await, backend("b").await, backend("c").await);
    std::fs::write(&path, topology("500ms", &[("a", &a), ("b", &b)])).unwrap();
    let discovery = format!("file:{}", path.display());
    let mut proxima = Proxima::start(&["run", "--discovery", &discovery]).await;
    let (proxy, admin) = (proxima.proxy, proxima.admin);
    let http = client();

    let ready = get(&http, &format!("http://{admin}/readyz"), None).await;
    assert_eq!((ready.status, ready.body.as_str()), (StatusCode::OK, "ok"));

    // Routing: both endpoints serve.
    let seen = send(&http, proxy, 30).await;
    assert!(seen.iter().all(|s| s == "a" || s == "b"), "{seen:?}");
    assert!(
        a.hits() > 0 && b.hits() > 0,
        "a: {}, b: {}",
        a.hits(),
        b.hits()
    );
    let before = pools(&http, admin).await;
    assert_eq!(before["latency_slo_ms"], 500.0);
    let a_samples = endpoint(&before, "a").unwrap()["samples"].as_u64().unwrap();
    let a_requests = endpoint(&before, "a").unwrap()["requests"]
        .as_u64()
        .unwrap();
    assert!(a_samples > 0, "{before:#}");

    // Add `c` and tighten the SLO: applied without restart; `a` keeps its measurements.
    replace(
        &path,
        &topology("400ms", &[("a", &a), ("b", &b), ("c", &c)]),
    );
    let after = eventually("c added and SLO 400ms", || async {
        let p = pools(&http, admin).await;
        (ids(&p) == ["a", "b", "c"] && p["latency_slo_ms"] == 400.0).then_some(p)
    })
    .await;
    let a_after = endpoint(&after, "a").unwrap();
    assert!(
        a_after["samples"].as_u64().unwrap() >= a_samples,
        "{after:#}"
    );
    assert!(
        a_after["requests"].as_u64().unwrap() >= a_requests,
        "{after:#}"
    );
    assert_eq!(endpoint(&after, "c").unwrap()["requests"], 0);
    proxima
        .wait_log("topology loaded: 1 services, 3 endpoints")
        .await;
    eventually("c gets traffic", || async {
        send(&http, proxy, 5)
            .await
            .iter()
            .any(|s| s == "c")
            .then_some(())
    })
    .await;

    // Remove `b` (edited in place this time): no more requests reach it.
    std::fs::write(&path, topology("400ms", &[("a", &a), ("c", &c)])).unwrap();
    eventually("b removed", || async {
        (ids(&pools(&http, admin).await) == ["a", "c"]).then_some(())
    })
    .await;
    let b_hits = b.hits();
    let seen = send(&http, proxy, 20).await;
    assert!(!seen.iter().any(|s| s == "b"), "{seen:?}");
    assert_eq!(b.hits(), b_hits);

    // An invalid edit is rejected with its line; the previous topology keeps serving.
    replace(&path, &topology("80", &[("a", &a)]));
    let rejected = proxima.wait_log("topology file rejected").await;
    assert!(
        rejected
            .contains("topology.yaml:5: services[0].settings.latency-slo: invalid value \"80\""),
        "{rejected}"
    );
    let kept = pools(&http, admin).await;
    assert_eq!(ids(&kept), ["a", "c"]);
    assert_eq!(kept["latency_slo_ms"], 400.0);
    send(&http, proxy, 5).await;

    // The next valid edit applies again.
    replace(&path, &topology("300ms", &[("a", &a)]));
    eventually("only a, SLO 300ms", || async {
        let p = pools(&http, admin).await;
        (ids(&p) == ["a"] && p["latency_slo_ms"] == 300.0).then_some(())
    })
    .await;
    let seen = send(&http, proxy, 5).await;
    assert!(seen.iter().all(|s| s == "a"), "{seen:?}");

    proxima.signal("TERM");
    let status = proxima.wait_exit().await;
    assert!(status.success(), "{status}:\n{}", proxima.logs());
}

/// One endpoint `web-0` at `addr` with the given extra fields, beside `other`.
fn stateful(addr: SocketAddr, extra: &str, other: &Backend) -> String {
    format!(
        "nodes:\n  - {{ name: worker-1, zone: edge-a }}\n  - {{ name: worker-2, zone: edge-b }}\n\
         services:\n  - name: dps\n    settings: {{ latency-slo: 500ms }}\n    endpoints:\n      \
         - {{ id: web-0, address: '{addr}', node: worker-1{extra} }}\n      \
         - {{ id: web-1, address: '{}', node: worker-1 }}\n",
        other.addr()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_keeps_its_history_until_its_address_changes() {
    let dir = TempDir::new("identity");
    let path = dir.0.join("topology.yaml");
    let (old, other) = (backend("web-0-old").await, backend("web-1").await);
    // The recreated pod: same name, another IP (as a rescheduled StatefulSet pod).
    let recreated = Backend::spawn(
        "127.0.0.2:0".parse().unwrap(),
        proxima_emulate::BackendConfig::new("web-0-new"),
    )
    .await
    .expect("a pod on 127.0.0.2");
    std::fs::write(&path, stateful(old.addr(), "", &other)).unwrap();
    let discovery = format!("file:{}", path.display());
    let proxima = Proxima::start(&["run", "--discovery", &discovery]).await;
    let (proxy, admin) = (proxima.proxy, proxima.admin);
    let http = client();
    // Measured by client requests, not only by its first probe, so that a reset to
    // nothing shows below.
    eventually("web-0 measured", || async {
        send(&http, proxy, 5).await;
        let p = pools(&http, admin).await;
        (endpoint(&p, "web-0")?["requests"].as_u64()? > 0).then_some(())
    })
    .await;
    let before = pools(&http, admin).await;
    let samples = endpoint(&before, "web-0").unwrap()["samples"]
        .as_u64()
        .unwrap();
    let requests = endpoint(&before, "web-0").unwrap()["requests"]
        .as_u64()
        .unwrap();

    // Only its conditions and zone change: the same pod, its history stays.
    replace(
        &path,
        &stateful(
            old.addr(),
            ", zone: edge-b, ready: false, serving: true, terminating: true",
            &other,
        ),
    );
    let changed = eventually("web-0 terminating", || async {
        let p = pools(&http, admin).await;
        (endpoint(&p, "web-0")?["terminating"] == true).then_some(p)
    })
    .await;
    let web0 = endpoint(&changed, "web-0").unwrap();
    assert_eq!(web0["samples"].as_u64(), Some(samples), "{changed:#}");
    assert_eq!(web0["requests"].as_u64(), Some(requests), "{changed:#}");

    // Recreated with a new address: a new pod, measured from scratch.
    replace(&path, &stateful(recreated.addr(), "", &other));
    let moved = eventually("web-0 at its new address", || async {
        let p = pools(&http, admin).await;
        (endpoint(&p, "web-0")?["address"]
            .as_str()?
            .starts_with("127.0.0.2"))
        .then_some(p)
    })
    .await;
    let web0 = endpoint(&moved, "web-0").unwrap();
    // Nothing of the old history; at most the new pod's first probe (every new pod
    // gets one at once) may already have landed.
    assert!(web0["samples"].as_u64() <= Some(1), "{moved:#}");
    assert_eq!(web0["requests"], 0, "{moved:#}");
    // And it serves from there.
    eventually("the new web-0 answers", || async {
        send(&http, proxy, 5)
            .await
            .iter()
            .any(|s| s == "web-0-new")
            .then_some(())
    })
    .await;
    assert!(old.hits() > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_file_at_start_is_fatal_and_names_the_line() {
    let dir = TempDir::new("bad");
    let path = dir.0.join("topology.yaml");
    std::fs::write(
        &path,
        "services:\n  - name: dps\n    endpoints:\n      - address: 127.0.0.1:1\n      - address: 127.0.0.1:1\n",
    )
    .unwrap();
    let output = Command::new(binary())
        .args(["run", "--discovery", &format!("file:{}", path.display())])
        .args(["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .output()
        .expect("proxima runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("error: the topology file is invalid"),
        "{stderr}"
    );
    assert!(
        stderr.contains("topology.yaml:5: services[0].endpoints[1].id: duplicate endpoint id"),
        "{stderr}"
    );

    let missing = dir.0.join("missing.yaml");
    let output = Command::new(binary())
        .args(["run", "--discovery", &format!("file:{}", missing.display())])
        .args(["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .output()
        .expect("proxima runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("missing.yaml: cannot read"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_and_metrics_follow_the_file() {
    let dir = TempDir::new("ready");
    let path = dir.0.join("topology.yaml");
    let a = backend("a").await;
    std::fs::write(&path, topology("500ms", &[("a", &a)])).unwrap();
    let discovery = format!("file:{}", path.display());
    let proxima =
        Proxima::start(&["run", "--discovery", &discovery, "--node-name", "worker-1"]).await;
    let http = client();
    let admin = proxima.admin;

    eventually("/readyz 200", || async {
        let r = get(&http, &format!("http://{admin}/readyz"), None).await;
        (r.status == StatusCode::OK).then_some(())
    })
    .await;
    let health = get(&http, &format!("http://{admin}/healthz"), None).await;
    assert_eq!(
        (health.status, health.body.as_str()),
        (StatusCode::OK, "ok")
    );

    let all = get(&http, &format!("http://{admin}/debug/pools"), None).await;
    let json: Value = serde_json::from_str(&all.body).unwrap();
    assert_eq!(json["node"], "worker-1");

    let metrics = get(&http, &format!("http://{admin}/metrics"), None).await;
    assert!(
        metrics
            .body
            .lines()
            .any(|l| l == r#"proxima_pool_size{service="dps.default"} 1"#),
        "{}",
        metrics.body
    );

    // The service goes away: so do its gauges.
    std::fs::write(&path, "services: []\n").unwrap();
    eventually("dps gauges removed", || async {
        let m = get(&http, &format!("http://{admin}/metrics"), None).await;
        (!m.body.contains("dps.default")).then_some(())
    })
    .await;
}

#[test]
fn the_annotated_example_topology_is_valid() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/topology.yaml");
    let topology = proxima_discovery::load(&path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(topology.service_count(), 2);
    assert_eq!(topology.endpoint_count(), 5);
}
