//! A request the client gives up on is a failure of its own kind: counted as a timeout,
//! never within the SLO. The instance takes 5 s; the client waits 150 ms, so the margin
//! is wide on a slow machine.

use std::time::Duration;

use proxima_testbed::client::ErrorKind;
use proxima_testbed::{plan, run_jobs, RunOptions, ScenarioFile};

const SCENARIO: &str = r#"
name: timeout
nodes: [{ name: a }]
services:
  - name: slow
    settings: { latency-slo: 10s }
    instances: [{ name: sleepy, node: a, processing: 5s }]
  - name: quick
    settings: { latency-slo: 10s }
    instances: [{ name: brisk, node: a }]
clients:
  - { name: waits, node: a, service: slow, requests: 2, timeout: 150ms }
  - { name: gets, node: a, service: quick, requests: 3 }
strategies: [round-robin]
testbed: { discovery-interval: 100ms, peer-probe-interval: 200ms, client-timeout: 20s }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_timeout_is_counted_as_a_timeout() {
    let file = ScenarioFile::parse(SCENARIO).unwrap();
    let scenario = file.variant("").unwrap();
    assert_eq!(scenario.clients[0].timeout, Duration::from_millis(150));
    assert_eq!(scenario.clients[1].timeout, Duration::from_secs(20));
    let jobs = plan(&file, &[], &[]).unwrap();
    let options = RunOptions {
        work_dir: std::env::temp_dir().join(format!(
            "proxima-testbed-test-timeout-{}",
            std::process::id()
        )),
        ..RunOptions::default()
    };
    let runs = run_jobs(jobs, 1, &options, None).await.unwrap();
    let _ = std::fs::remove_dir_all(&options.work_dir);
    let run = &runs[0];
    let waits = &run.clients[0].summary;
    assert_eq!(waits.requests, 2);
    assert_eq!((waits.failed, waits.timeouts, waits.slo_met), (2, 2, 0));
    for r in run.records.iter().filter(|r| r.client == 0) {
        assert_eq!(r.error(), Some(ErrorKind::Timeout), "{r:?}");
        assert!(r.latency >= Duration::from_millis(150), "{r:?}");
    }
    let gets = &run.clients[1].summary;
    assert_eq!((gets.requests, gets.failed, gets.timeouts), (3, 0, 0));
    assert_eq!(run.summary.timeouts, 2);
    assert_eq!(run.summary.slo_met, 3);
}
