//! The Grafana dashboard in `deploy/grafana/` is checked against the proxy: every
//! query parses as PromQL (`promtool check rules` on the queries written as recording
//! rules), and every metric it names is one the proxy exports (a real proxy, with the
//! admin's table gauges, is driven through failures, retries, evictions and probes until
//! every family the dashboard uses has been scraped).
//!
//! Needs promtool: `bash tests/provision-promtool.sh` (tests/run.sh runs it). Without
//! it this test fails; it is never skipped.

mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::*;
use http::StatusCode;
use serde_json::Value;

const DASHBOARD: &str = "deploy/grafana/proxima-dashboard.json";

/// promtool as provisioned by tests/provision-promtool.sh, or from PATH.
fn promtool() -> PathBuf {
    if let Some(path) = std::env::var_os("PROXIMA_PROMTOOL") {
        return PathBuf::from(path);
    }
    let cache = std::env::var_os("PROXIMA_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/proxima")));
    if let Some(linked) = cache.map(|c| c.join("promtool")).filter(|p| p.exists()) {
        return linked;
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("promtool"))
            .find(|p| p.exists())
    });
    on_path.unwrap_or_else(|| {
        panic!("promtool is missing: run `bash tests/provision-promtool.sh` (tests/run.sh does)")
    })
}

/// Every PromQL query of the dashboard: panel targets, and the selectors inside the
/// template variables' `label_values(selector, label)`.
fn queries(dashboard: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            out.push(target["expr"].as_str().expect("expr").to_string());
        }
    }
    for variable in dashboard["templating"]["list"]
        .as_array()
        .expect("templating")
    {
        if variable["type"] != "query" {
            continue;
        }
        let query = variable["query"]["query"].as_str().expect("variable query");
        let inner = query
            .strip_prefix("label_values(")
            .and_then(|q| q.strip_suffix(')'))
            .and_then(|q| q.rsplit_once(','))
            .map(|(selector, _label)| selector.trim())
            .unwrap_or_else(|| panic!("unexpected variable query {query:?}"));
        out.push(inner.to_string());
    }
    out
}

/// Grafana's variables replaced by values of the same kind, as Grafana would.
fn with_variables(query: &str) -> String {
    let query = query
        .replace("$__rate_interval", "1m")
        .replace("$__interval", "15s")
        .replace("$instance", ".*")
        .replace("$service", ".*");
    assert!(!query.contains('$'), "unknown variable in {query}");
    query
}

/// The `proxima_*` names a query uses.
fn metric_names(query: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = query;
    while let Some(at) = rest.find("proxima_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
            .collect();
        rest = &rest[at + name.len()..];
        names.insert(name);
    }
    names
}

#[test]
fn every_dashboard_query_parses() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join(DASHBOARD)).expect("dashboard JSON");
    let dashboard: Value = serde_json::from_str(&text).expect("dashboard is JSON");
    let queries = queries(&dashboard);
    assert!(queries.len() >= 10, "{queries:?}");
    // The queries as recording rules: `promtool check rules` parses every expression.
    let rules: Vec<Value> = queries
        .iter()
        .enumerate()
        .map(|(i, q)| serde_json::json!({ "record": format!("dashboard:query_{i}"), "expr": with_variables(q) }))
        .collect();
    let file = serde_json::json!({ "groups": [{ "name": "dashboard", "rules": rules }] });
    let dir = std::env::temp_dir().join(format!("proxima-dashboard-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("rules.yaml");
    std::fs::write(&path, file.to_string()).unwrap();
    let output = Command::new(promtool())
        .args(["check", "rules"])
        .arg(&path)
        .output()
        .expect("promtool runs");
    let _ = std::fs::remove_dir_all(&dir);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "promtool check rules failed:\n{said}"
    );
    assert!(
        said.contains(&format!("{} rules found", queries.len())),
        "{said}"
    );

    // A broken query is caught: the check is not a formality.
    let broken = serde_json::json!({ "groups": [{ "name": "g", "rules": [
        { "record": "dashboard:broken", "expr": "sum by (service (rate(proxima_retries_total[1m]))" }
    ] }] });
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(&path, broken.to_string()).unwrap();
    let status = Command::new(promtool())
        .args(["check", "rules"])
        .arg(&path)
        .output()
        .expect("promtool runs")
        .status;
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!status.success(), "promtool accepted a broken query");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_uses_is_exported() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join(DASHBOARD)).expect("dashboard JSON");
    let dashboard: Value = serde_json::from_str(&text).expect("dashboard is JSON");
    let used: BTreeSet<String> = queries(&dashboard)
        .iter()
        .flat_map(|q| metric_names(q))
        .collect();
    assert!(used.len() >= 10, "{used:?}");

    // A proxy that meets every case the dashboard shows.
    let good = backend("good-0").await;
    let slow = backend_with(BackendConfig::new("slow-0").delay(Duration::from_millis(120))).await;
    let flaky = [backend("flaky-0").await, backend("flaky-1").await];
    let (dead_a, dead_b, dead_c) = (dead_addr().await, dead_addr().await, dead_addr().await);
    let proxy = TestProxy::start(vec![
        // A dead pod beside a good one: connect errors.
        (
            service("shop", "mixed", &[], &[("qos-pool-eject-after", "1")]),
            vec![endpoint("good-0", good.addr()), endpoint("dead-0", dead_a)],
        ),
        // Pods that reset the connection on `/reset` (and answer probes of `/`): an
        // idempotent request is tried again on the other pod.
        (
            service("shop", "flaky", &[], &[]),
            vec![
                endpoint("flaky-0", flaky[0].addr()),
                endpoint("flaky-1", flaky[1].addr()),
            ],
        ),
        // Only dead pods and no retry budget: the retry is refused.
        (
            service(
                "shop",
                "down",
                &[],
                &[
                    ("retry-budget-ratio", "0"),
                    ("retry-budget-min-per-second", "0"),
                ],
            ),
            vec![endpoint("dead-1", dead_b), endpoint("dead-2", dead_c)],
        ),
        // Slower than its SLO: overdue attempts, eviction, probes.
        (
            service("shop", "slow", &[], &[("latency-slo", "20ms")]),
            vec![endpoint("slow-0", slow.addr())],
        ),
    ])
    .await;
    proxima_admin::gauges::TableGauges::register(&proxy.registry, proxy.router.clone())
        .expect("table gauges register");
    let client = http1_client();
    let url = proxy.url("/");
    for _ in 0..6 {
        let reply = get(&client, &url, &[("x-service", "mixed.shop")]).await;
        assert_eq!(reply.status, StatusCode::OK);
        let reply = get(&client, &url, &[("x-service", "down.shop")]).await;
        assert_eq!(reply.status, StatusCode::BAD_GATEWAY);
        let reply = get(&client, &url, &[("x-service", "slow.shop")]).await;
        assert_eq!(reply.status, StatusCode::OK);
        let reply = get(
            &client,
            &proxy.url("/reset"),
            &[("x-service", "flaky.shop")],
        )
        .await;
        assert_eq!(reply.status, StatusCode::BAD_GATEWAY);
    }

    // The families the proxy exports, from `# TYPE` lines; a histogram's series are
    // `_bucket`, `_sum` and `_count`.
    let exported = |text: &str| -> BTreeSet<String> {
        let mut names = BTreeSet::new();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("# TYPE ") else {
                continue;
            };
            let mut words = rest.split_whitespace();
            let (Some(name), Some(kind)) = (words.next(), words.next()) else {
                continue;
            };
            names.insert(name.to_string());
            if kind == "histogram" {
                for suffix in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{name}{suffix}"));
                }
            }
        }
        names
    };
    let mut missing = BTreeSet::new();
    for _ in 0..100 {
        let names = exported(&proxy.metrics_text());
        missing = used.difference(&names).cloned().collect();
        if missing.is_empty() {
            break;
        }
        // Probes of evicted pods come on their own schedule.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        missing.is_empty(),
        "the dashboard uses metrics the proxy does not export: {missing:?}\n{}",
        proxy.metrics_text()
    );
}
