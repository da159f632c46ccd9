//! Events that make a node or a link unreachable, on a real emulated cluster: requests
//! that cross a blackholed link or reach a node that is down hang until the client gives
//! up (a timeout, not a refused connection). The client waits 300 ms, the link is 5 ms.
//! The packets are dropped by nftables, so the test runs in a network namespace of its
//! own (`tests/k8s/netns.rs`).

#[path = "../../../tests/k8s/netns.rs"]
mod netns;

use proxima_testbed::client::ErrorKind;
use proxima_testbed::{plan, run_jobs, RunOptions, ScenarioFile};

const SCENARIO: &str = r#"
name: unreachable
nodes: [{ name: a, zone: za, region: r1 }, { name: b, zone: zb, region: r2 }]
latency: { default: 5ms }
services:
  - name: api
    settings: { latency-slo: 1s }
    instances: [{ name: far, node: b }]
clients:
  - { name: device, node: a, service: api, requests: 10, timeout: 300ms }
events:
  - { name: hole, at: 3, do: [{ blackhole: { between: [region:r1, region:r2] } }] }
  - { name: back, at: 5, do: [{ reset: { between: [a, b] } }] }
  - { name: down, at: 7, do: [{ node-down: b }] }
strategies: [round-robin]
testbed: { discovery-interval: 100ms, peer-probe-interval: 200ms }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackholes_and_lost_nodes_make_requests_time_out() {
    if netns::isolated("blackholes_and_lost_nodes_make_requests_time_out").is_none() {
        return;
    }
    let file = ScenarioFile::parse(SCENARIO).unwrap();
    let jobs = plan(&file, &[], &[]).unwrap();
    let options = RunOptions {
        work_dir: std::env::temp_dir().join(format!(
            "proxima-testbed-test-events-{}",
            std::process::id()
        )),
        ..RunOptions::default()
    };
    let runs = run_jobs(jobs, 1, &options, None).await.unwrap();
    let _ = std::fs::remove_dir_all(&options.work_dir);
    let run = &runs[0];
    let kinds = |phase: u16| -> Vec<Option<ErrorKind>> {
        run.records
            .iter()
            .filter(|r| r.phase == phase)
            .map(|r| r.error())
            .collect()
    };
    assert_eq!(kinds(0), [None, None, None], "{:?}", run.records);
    assert_eq!(
        kinds(1),
        [Some(ErrorKind::Timeout), Some(ErrorKind::Timeout)],
        "{:?}",
        run.records
    );
    assert_eq!(kinds(3), [Some(ErrorKind::Timeout); 3], "{:?}", run.records);
    assert_eq!(
        run.summary.timeouts,
        2 + 3 + kinds(2).iter().flatten().count() as u64
    );
    let service = &run.services[0];
    assert_eq!(service.all.summary.timeouts, run.summary.timeouts);
    assert!(!service.all.met);
    assert_eq!(service.all.at_percentile_ms, None);
    assert_eq!(service.phases[0].1.summary.requests, 3);
    assert!(service.phases[0].1.met);
}
