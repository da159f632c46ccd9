//! The `proxima` command line as a user meets it: `--help` texts, flag and env
//! parsing, JSON logs, graceful shutdown on SIGTERM, `proxima demo` and `proxima check`.
//!
//! Needs the binary: `cargo build -p proxima` first.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Command, Stdio};
use std::time::Duration;

use http::{Request, StatusCode};
use http_body_util::Empty;
use proxima_emulate::{Backend, BackendConfig};
use serde_json::Value;

#[path = "support/binary.rs"]
mod binary;

use binary::*;

// ---- the tests ----

fn run(args: &[&str]) -> (Option<i32>, String, String) {
    let output = Command::new(binary())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("proxima runs");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// A topology with service `dps` served by `backend`.
fn topology(backend: &Backend) -> String {
    format!(
        "services:\n  - name: dps\n    settings: {{ latency-slo: 5s, timeout: 30s }}\n    endpoints:\n      - {{ id: a, address: '{}' }}\n",
        backend.addr()
    )
}

#[test]
fn help_explains_every_flag() {
    let (code, top, _) = run(&["--help"]);
    assert_eq!(code, Some(0));
    for needle in [
        "run",
        "demo",
        "check",
        "--log-format",
        "--log-level",
        "proxima demo",
    ] {
        assert!(
            top.contains(needle),
            "`proxima --help` lacks {needle:?}:\n{top}"
        );
    }

    let (code, help, _) = run(&["run", "--help"]);
    assert_eq!(code, Some(0));
    let flags = [
        ("--discovery", "PROXIMA_DISCOVERY"),
        ("--listen", "PROXIMA_LISTEN"),
        ("--admin", "PROXIMA_ADMIN"),
        ("--node-name", "NODE_NAME"),
        ("--service-header", "PROXIMA_SERVICE_HEADER"),
        ("--default-namespace", "PROXIMA_DEFAULT_NAMESPACE"),
        ("--cluster-domain", "PROXIMA_CLUSTER_DOMAIN"),
        ("--max-header-bytes", "PROXIMA_MAX_HEADER_BYTES"),
        ("--shutdown-grace", "PROXIMA_SHUTDOWN_GRACE"),
        ("--upstream-idle-timeout", "PROXIMA_UPSTREAM_IDLE_TIMEOUT"),
        ("--client-header-timeout", "PROXIMA_CLIENT_HEADER_TIMEOUT"),
        ("--client-idle-timeout", "PROXIMA_CLIENT_IDLE_TIMEOUT"),
        ("--body-idle-timeout", "PROXIMA_BODY_IDLE_TIMEOUT"),
        ("--max-client-connections", "PROXIMA_MAX_CLIENT_CONNECTIONS"),
        ("--max-request-headers", "PROXIMA_MAX_REQUEST_HEADERS"),
        ("--max-response-headers", "PROXIMA_MAX_RESPONSE_HEADERS"),
        ("--max-uri-bytes", "PROXIMA_MAX_URI_BYTES"),
        ("--admin-token", "PROXIMA_ADMIN_TOKEN"),
        ("--admin-trusted-networks", "PROXIMA_ADMIN_TRUSTED_NETWORKS"),
        ("--log-format", "PROXIMA_LOG_FORMAT"),
        ("--log-level", "PROXIMA_LOG"),
        ("--kubeconfig", "KUBECONFIG"),
        ("--namespaces", "PROXIMA_NAMESPACES"),
        ("--service-selector", "PROXIMA_SERVICE_SELECTOR"),
    ];
    for (flag, env) in flags {
        // The flag, its help sentence on the next line, and its environment variable.
        let at = help
            .find(&format!("\n      {flag} <"))
            .map(|i| i + 1)
            .unwrap_or_else(|| panic!("`proxima run --help` lacks {flag}:\n{help}"));
        // From the flag to the next flag or section: "--flag <VALUE>", its help, its env.
        let rest = &help[at..];
        let end = ["\n      --", "\n  -"]
            .iter()
            .filter_map(|sep| rest[2..].find(sep).map(|i| i + 2))
            .min()
            .unwrap_or(rest.len());
        let entry = &rest[..end];
        let after_value = &entry[entry.find('>').map_or(0, |i| i + 1)..];
        let explanation = after_value.split("[env:").next().unwrap_or_default().trim();
        assert!(
            explanation.len() > 40,
            "{flag} has no explanation: {entry:?}"
        );
        assert!(
            entry.contains(&format!("[env: {env}")),
            "{flag} does not mention {env}: {entry:?}"
        );
    }
    assert!(help.contains("file:PATH"), "{help}");
    // A flag without a value: its line, its explanation and its variable.
    let no_events = help
        .split("\n      --")
        .find(|entry| entry.starts_with("no-events"))
        .unwrap_or_else(|| panic!("`proxima run --help` lacks --no-events:\n{help}"));
    assert!(
        no_events.contains("Events") && no_events.contains("[env: PROXIMA_NO_EVENTS"),
        "{no_events}"
    );

    let (code, demo, _) = run(&["demo", "--help"]);
    assert_eq!(code, Some(0));
    for needle in ["--topology", "--write", "--load", "--listen", "--admin"] {
        assert!(
            demo.contains(needle),
            "`proxima demo --help` lacks {needle}:\n{demo}"
        );
    }
}

#[test]
fn bad_flags_fail_with_a_clear_message() {
    let (code, _, err) = run(&["run"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("--discovery"), "{err}");

    let (code, _, err) = run(&["run", "--discovery", "kube:default"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("expected file:PATH"), "{err}");

    let (code, _, err) = run(&["run", "--discovery", "file:x", "--shutdown-grace", "30"]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("--shutdown-grace") && err.contains("unit"),
        "{err}"
    );

    let (code, _, err) = run(&["run", "--discovery", "file:x", "--listen", "localhost"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("--listen"), "{err}");

    let (code, _, err) = run(&["run", "--discovery", "file:x", "--log-level", "info,="]);
    assert_ne!(code, Some(0));
    assert!(err.contains("--log-level"), "{err}");

    let (code, _, err) = run(&["--log-format", "xml", "run", "--discovery", "file:x"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("json"), "{err}");

    let (code, _, err) = run(&[
        "run",
        "--discovery",
        "kube",
        "--service-selector",
        "tier in (a,b)",
    ]);
    assert_eq!(code, Some(2));
    assert!(err.contains("--service-selector"), "{err}");
}

#[test]
fn kube_discovery_takes_its_kubeconfig_from_the_environment() {
    let output = Command::new(binary())
        .args(["run", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
        .env("PROXIMA_DISCOVERY", "kube")
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .stdin(Stdio::null())
        .output()
        .expect("proxima runs");
    let err = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{err}");
    assert!(
        err.contains("error: cannot read kubeconfig /nonexistent/kubeconfig"),
        "{err}"
    );
}

#[test]
fn a_taken_port_is_a_clear_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().to_string();
    let dir = TempDir::new("port");
    let path = dir.0.join("t.yaml");
    std::fs::write(&path, "services: []\n").unwrap();
    let (code, _, err) = run(&[
        "run",
        "--discovery",
        &format!("file:{}", path.display()),
        "--listen",
        &port,
        "--admin",
        "127.0.0.1:0",
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(&format!("error: cannot listen on {port} (--listen)")),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_and_settings_from_the_environment() {
    let dir = TempDir::new("json");
    let path = dir.0.join("topology.yaml");
    let a = backend("a").await;
    std::fs::write(&path, topology(&a)).unwrap();
    let discovery = format!("file:{}", path.display());
    let mut proxima = Proxima::start_with(
        &["run"],
        &[
            ("PROXIMA_DISCOVERY", discovery.as_str()),
            ("PROXIMA_LOG_FORMAT", "json"),
            ("PROXIMA_SERVICE_HEADER", "x-target"),
        ],
    )
    .await;
    let http = client();

    // The service header came from the environment.
    let request = Request::get(format!("http://{}/", proxima.proxy))
        .header("x-target", "dps")
        .body(Empty::new())
        .unwrap();
    let response = http.request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["x-backend"], "a");

    proxima.signal("TERM");
    assert!(proxima.wait_exit().await.success(), "{}", proxima.logs());
    proxima.wait_log("shut down cleanly").await;
    let logs = proxima.logs();
    let mut messages = Vec::new();
    for line in logs.lines() {
        let json: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line:?}"));
        assert!(
            json["level"].is_string() && json["timestamp"].is_string(),
            "{line}"
        );
        messages.push(json["message"].as_str().unwrap_or_default().to_string());
    }
    assert!(messages.iter().any(|m| m == "proxima is ready"), "{logs}");
    assert!(
        messages.iter().any(|m| m.starts_with("topology loaded")),
        "{logs}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_a_slow_request_finish_and_exits_zero() {
    let dir = TempDir::new("term");
    let path = dir.0.join("topology.yaml");
    let slow = Backend::spawn(
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
        BackendConfig::new("slow").delay(Duration::from_millis(1500)),
    )
    .await
    .unwrap();
    std::fs::write(&path, topology(&slow)).unwrap();
    let discovery = format!("file:{}", path.display());
    let mut proxima =
        Proxima::start(&["run", "--discovery", &discovery, "--shutdown-grace", "30s"]).await;
    let (proxy, admin) = (proxima.proxy, proxima.admin);

    let http = client();
    let in_flight = tokio::spawn({
        let http = http.clone();
        async move { get(&http, &format!("http://{proxy}/slow"), Some("dps")).await }
    });
    eventually("the request reaches the pod", || async {
        (slow.client_hits() == 1).then_some(())
    })
    .await;

    proxima.signal("TERM");
    proxima.wait_log("SIGTERM received").await;
    let reply = tokio::time::timeout(PATIENCE, in_flight)
        .await
        .expect("the slow request completes")
        .unwrap();
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(reply.backend.as_deref(), Some("slow"));
    let status = proxima.wait_exit().await;
    assert_eq!(status.code(), Some(0), "{}", proxima.logs());
    assert!(
        proxima.logs().contains("shut down cleanly"),
        "{}",
        proxima.logs()
    );
    // Both servers are gone.
    assert!(tokio::net::TcpStream::connect(proxy).await.is_err());
    assert!(tokio::net::TcpStream::connect(admin).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_stops_an_idle_proxy() {
    let dir = TempDir::new("int");
    let path = dir.0.join("topology.yaml");
    std::fs::write(&path, "services: []\n").unwrap();
    let discovery = format!("file:{}", path.display());
    let mut proxima = Proxima::start(&["run", "--discovery", &discovery]).await;
    proxima.signal("INT");
    let status = proxima.wait_exit().await;
    assert_eq!(status.code(), Some(0), "{}", proxima.logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_serves_emulated_pods_from_a_file_it_writes() {
    let dir = TempDir::new("demo");
    let file = dir.0.join("demo.yaml");
    let write = file.display().to_string();
    let mut proxima = Proxima::start(&["demo", "--write", &write]).await;
    let (proxy, admin) = (proxima.proxy, proxima.admin);
    let http = client();

    // The banner says what to try, with the real ports.
    let banner = eventually("the banner", || {
        let out = proxima.out.lock().unwrap().join("\n");
        async move { out.contains("Ctrl-C").then_some(out) }
    })
    .await;
    assert!(
        banner.contains(&format!(
            "curl -H 'x-service: dps' localhost:{}/",
            proxy.port()
        )),
        "{banner}"
    );
    assert!(
        banner.contains(&format!("curl localhost:{}/debug/pools", admin.port())),
        "{banner}"
    );
    assert!(banner.contains(&write), "{banner}");

    let reply = get(&http, &format!("http://{proxy}/"), Some("dps")).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert!(reply.backend.unwrap().starts_with("dps-"));
    let reply = get(&http, &format!("http://{proxy}/"), Some("ocr")).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);

    // The written file is a plain topology that `proxima check` accepts.
    let (code, out, _) = run(&["check", &write]);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("ok (2 services, 5 endpoints, 3 nodes)"),
        "{out}"
    );

    // The built-in load makes the 150 ms pods leave their pools (SLO 80 ms).
    eventually("dps-w3 evicted", || async {
        let r = get(
            &http,
            &format!("http://{admin}/debug/pools?service=dps"),
            None,
        )
        .await;
        let json: Value = serde_json::from_str(&r.body).ok()?;
        let eps = json["services"][0]["endpoints"].as_array()?.clone();
        let w3 = eps.iter().find(|e| e["id"] == "dps-w3")?;
        (w3["in_pool"] == false).then_some(())
    })
    .await;

    proxima.signal("TERM");
    let status = proxima.wait_exit().await;
    assert_eq!(status.code(), Some(0), "{}", proxima.logs());
}

#[test]
fn check_reports_every_problem_with_its_line() {
    let dir = TempDir::new("check");
    let good = dir.0.join("good.yaml");
    std::fs::write(
        &good,
        "services:\n  - name: dps\n    endpoints: [{ address: 127.0.0.1:9 }]\n",
    )
    .unwrap();
    let bad = dir.0.join("bad.yaml");
    std::fs::write(
        &bad,
        "services:\n  - name: dps\n    settings: { retries: many }\n    endpoints:\n      - address: nowhere\n",
    )
    .unwrap();
    let (code, out, _) = run(&["check", good.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("good.yaml: ok (1 services, 1 endpoints, 0 nodes)"),
        "{out}"
    );

    let (code, out, _) = run(&["check", good.to_str().unwrap(), bad.to_str().unwrap()]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("bad.yaml:3: services[0].settings.retries: invalid value \"many\""),
        "{out}"
    );
    assert!(
        out.contains("bad.yaml:5: services[0].endpoints[0].address: invalid address"),
        "{out}"
    );
}

/// Every log line about a request carries its `request` span: which request (`id`),
/// the service, the endpoint and the attempt, so JSON lines can be joined to it.
#[tokio::test]
async fn json_log_lines_carry_the_request_span() {
    let dir = TempDir::new("spans");
    let path = dir.0.join("topology.yaml");
    let a = backend("a").await;
    let closed = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap()
        .local_addr()
        .unwrap();
    let down = format!(
        "  - name: down\n    settings: {{ retries: 0 }}\n    endpoints:\n      - {{ id: gone, address: '{closed}' }}\n"
    );
    std::fs::write(&path, format!("{}{down}", topology(&a))).unwrap();
    let discovery = format!("file:{}", path.display());
    let mut proxima = Proxima::start(&[
        "--log-format",
        "json",
        "--log-level",
        "info,proxima_proxy=debug",
        "run",
        "--discovery",
        &discovery,
    ])
    .await;
    let http = client();
    let url = format!("http://{}/", proxima.proxy);
    for _ in 0..2 {
        assert_eq!(get(&http, &url, Some("dps")).await.status, StatusCode::OK);
    }
    let refused = get(&http, &url, Some("down")).await;
    assert_eq!(refused.status, StatusCode::BAD_GATEWAY);
    proxima.signal("TERM");
    assert!(proxima.wait_exit().await.success(), "{}", proxima.logs());

    let lines: Vec<Value> = proxima
        .logs()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    let about = |message: &str| -> Vec<&Value> {
        lines
            .iter()
            .filter(|l| l["message"] == message)
            .map(|l| &l["span"])
            .collect()
    };
    let forwarded = about("forwarded");
    assert_eq!(forwarded.len(), 2, "{lines:#?}");
    for span in &forwarded {
        assert_eq!(span["name"], "request", "{span}");
        assert_eq!(span["service"], "dps.default", "{span}");
        assert_eq!(span["endpoint"], "a", "{span}");
        assert_eq!(span["attempt"], 1, "{span}");
    }
    assert_ne!(forwarded[0]["id"], forwarded[1]["id"], "one id per request");
    // A failure logged at warn carries the same fields, under the default filter too.
    let unreachable = about("could not reach endpoint");
    assert_eq!(unreachable.len(), 1, "{lines:#?}");
    assert_eq!(unreachable[0]["service"], "down.default");
    assert_eq!(unreachable[0]["endpoint"], "gone");
    assert_eq!(unreachable[0]["attempt"], 1);
    assert!(unreachable[0]["id"].as_u64().is_some());
    // Lines outside any request have no request span.
    let ready = lines
        .iter()
        .find(|l| l["message"] == "proxima is ready")
        .expect("ready line");
    assert!(ready.get("span").is_none(), "{ready}");
}
