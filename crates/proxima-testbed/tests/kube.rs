//! `proxima-testbed run --kube` end to end: the binary starts etcd and a real
//! kube-apiserver (binaries from `tests/k8s/provision.sh`; missing ones fail the test),
//! re-executes itself in a private network namespace, publishes the emulated cluster as
//! Nodes, a Service and EndpointSlices, and every node's router follows the API server.
//! The accounting is checked as in `tests/testbed.rs`: every request counted once, the
//! join (an EndpointSlice write) seen by discovery, the link's delay injected.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

/// Two nodes 20 ms apart (one way). `far` (node b) answers at once; `near` (node a, the
/// client's node) joins after 30 requests.
const SCENARIO: &str = include_str!("accounting.yaml");

/// One line of `requests.csv`.
struct Request {
    seq: u64,
    phase: u64,
    latency_ms: f64,
    status: u16,
    instance: String,
    /// Whether some instance could have answered it within the SLO.
    reachable: bool,
}

fn requests(path: &std::path::Path) -> Vec<Request> {
    let text = std::fs::read_to_string(path).expect("requests.csv");
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some("variant,label,seq,client,phase,start_ms,latency_ms,status,error,instance,reachable")
    );
    lines
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            Request {
                seq: f[2].parse().unwrap(),
                phase: f[4].parse().unwrap(),
                latency_ms: f[6].parse().unwrap(),
                status: f[7].parse().unwrap(),
                instance: f[9].to_string(),
                reachable: f[10].parse().unwrap(),
            }
        })
        .collect()
}

#[test]
fn kube_mode_counts_every_request_once_and_injects_the_link_delay() {
    let dir = std::env::temp_dir().join(format!("proxima-testbed-kube-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let scenario = dir.join("scenario.yaml");
    std::fs::write(&scenario, SCENARIO).unwrap();
    let out: PathBuf = dir.join("out");
    let output = Command::new(env!("CARGO_BIN_EXE_proxima-testbed"))
        .arg("run")
        .arg(&scenario)
        .args([
            "--kube",
            "--strategies",
            "round-robin",
            "--raw",
            "--no-plots",
            "--quiet",
        ])
        .arg("--out")
        .arg(&out)
        .output()
        .expect("run proxima-testbed");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "proxima-testbed --kube failed ({}):\n{stderr}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout)
    );
    assert!(
        stderr.contains("starting etcd and kube-apiserver"),
        "{stderr}"
    );

    let results: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    let run = &results["runs"][0];
    assert_eq!(
        run["warmed_up"], true,
        "the proxies never learnt each other's latency"
    );
    assert_eq!(run["summary"]["requests"], 60);
    assert_eq!(run["summary"]["failed"], 0, "{}", run["per_instance"]);
    let by_instance: u64 = run["per_instance"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p[1].as_u64().unwrap())
        .sum();
    assert_eq!(by_instance, 60);
    assert_eq!(run["accounting_gap"], 0);
    let phases = run["phases"].as_array().unwrap();
    let names: Vec<&str> = phases.iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["T0", "T1"]);
    for phase in phases {
        assert_eq!(phase["summary"]["requests"], 30, "{phase}");
        let counted: u64 = phase["per_instance"]
            .as_object()
            .unwrap()
            .values()
            .map(|n| n.as_u64().unwrap())
            .sum();
        assert_eq!(counted, 30, "{phase}");
    }
    assert_eq!(phases[0]["per_instance"]["far"], 30);

    let records = requests(&out.join("requests.csv"));
    let mut seqs: Vec<u64> = records.iter().map(|r| r.seq).collect();
    seqs.sort();
    assert_eq!(seqs, (1..=60).collect::<Vec<_>>());
    assert!(records.iter().all(|r| (r.seq <= 30) == (r.phase == 0)));
    assert!(records.iter().all(|r| r.status == 200));
    let reachable = records.iter().filter(|r| r.reachable).count();
    assert_eq!(run["summary"]["reachable"], reachable, "{}", run["summary"]);

    // Before the join only `far` (20 ms away each way) answers: at least 40 ms, and
    // (generously) a median under a second.
    let mut far: Vec<f64> = records
        .iter()
        .filter(|r| r.phase == 0)
        .map(|r| r.latency_ms)
        .collect();
    assert!(far.iter().all(|l| *l >= 40.0), "{far:?}");
    far.sort_by(f64::total_cmp);
    assert!(far[far.len() / 2] < 1000.0, "{far:?}");
    // After it, discovery (the API server's EndpointSlice) brings `near`, which skips
    // the link.
    let near: Vec<f64> = records
        .iter()
        .filter(|r| r.phase == 1 && r.instance == "near")
        .map(|r| r.latency_ms)
        .collect();
    assert!(!near.is_empty(), "{}", phases[1]["per_instance"]);
    assert!(near.iter().copied().fold(f64::MAX, f64::min) < far[0]);
    let _ = std::fs::remove_dir_all(&dir);
}
