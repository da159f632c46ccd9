//! Outside conformance suites against the real binary (issue 29): what our own tests
//! cannot check, others' tests do.
//!
//! - **h2spec** (github.com/summerwind/h2spec, every case including the strict ones)
//!   against the proxy's HTTP/2 side, in front of an emulated pod. Every case passes or is
//!   in [`H2SPEC_EXCEPTIONS`] with its reason.
//! - **smugglex** (crates.io), an HTTP/1.1 request-smuggling scanner, with its mutation
//!   fuzzing on, against the proxy in front of a real nginx: no finding.
//!
//! Both tools come from `tests/conformance/provision.sh` (run by `tests/run.sh`); a tool
//! that is missing fails the test. The proxy routes by `Host` here, since neither tool
//! sends our service header: h2spec's `:authority` is its target host, so h2spec runs in
//! a mount namespace of its own whose `/etc/hosts` names the service's host (`unshare`;
//! root, as the Kubernetes tests need too). Traffic stays on loopback.
#[path = "support/binary.rs"]
mod binary;

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// h2spec cases this proxy fails on purpose: (package, case, why).
const H2SPEC_EXCEPTIONS: &[(&str, &str, &str)] = &[(
    "http2/3.5",
    "Sends invalid connection preface",
    "the listener serves HTTP/1.1 and h2c with prior knowledge on one port (as nginx and \
     HAProxy can): bytes that do not start with the HTTP/2 preface are an HTTP/1.1 request, \
     and an invalid HTTP/1.1 request line gets 400 and a close (RFC 9112 §3), which h2spec \
     reads as a reply where it expected only the close",
)];

fn cache() -> PathBuf {
    std::env::var_os("PROXIMA_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/proxima")
        })
}

/// A tool `tests/conformance/provision.sh` put in the cache.
fn tool(name: &str) -> PathBuf {
    let path = cache().join(name);
    assert!(
        path.exists(),
        "{} is missing: run `bash tests/conformance/provision.sh` (tests/run.sh does)",
        path.display()
    );
    path
}

fn nginx() -> PathBuf {
    ["/usr/sbin/nginx", "/usr/bin/nginx", "/sbin/nginx"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .expect("nginx is missing: run `bash tests/conformance/provision.sh` (tests/run.sh does)")
}

fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// A proxy following a topology file with one service, `name` in `default`, at `pod`.
async fn proxy_for(dir: &Path, name: &str, pod: SocketAddr) -> binary::Proxima {
    let path = dir.join("topology.yaml");
    let topology = format!(
        "services:\n  - name: {name}\n    endpoints:\n      - {{ id: {name}-0, address: '{pod}' }}\n"
    );
    std::fs::write(&path, topology).expect("write topology");
    let discovery = format!("file:{}", path.display());
    binary::Proxima::start(&["run", "--discovery", &discovery]).await
}

/// One `<testcase>` of h2spec's JUnit report.
#[derive(Debug)]
struct Case {
    package: String,
    name: String,
    /// The `<error>`, `<failure>` or `<skipped>` text; `None` when the case passed.
    problem: Option<String>,
}

/// The cases of an h2spec JUnit report (its XML is flat and regular: one element per
/// case, self-closed by `</testcase>`, with a child element only when it did not pass).
fn junit_cases(report: &str) -> Vec<Case> {
    let attribute = |element: &str, name: &str| {
        let start = element.find(&format!("{name}=\"")).expect(name) + name.len() + 2;
        let len = element[start..].find('"').expect("closing quote");
        element[start..start + len].to_string()
    };
    report
        .split("<testcase ")
        .skip(1)
        .map(|element| {
            let element = &element[..element.find("</testcase>").expect("</testcase>")];
            let body = &element[element.find('>').expect("tag end") + 1..];
            Case {
                package: attribute(element, "package"),
                name: attribute(element, "classname"),
                problem: (!body.trim().is_empty()).then(|| body.trim().to_string()),
            }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2spec_passes_every_case_but_the_written_exceptions() {
    let h2spec = tool("h2spec-v2.2.1");
    let pod = binary::backend("h2spec-pod").await;
    let dir = binary::TempDir::new("h2spec");
    let proxima = proxy_for(&dir.0, "h2spec", pod.addr()).await;

    let hosts = dir.0.join("hosts");
    let system = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
    std::fs::write(&hosts, format!("{system}\n127.0.0.1 h2spec.default\n")).expect("hosts");
    let report = dir.0.join("h2spec.xml");
    let script = format!(
        "mount --bind '{}' /etc/hosts && exec '{}' --strict -h h2spec.default -p {} -o 5 -j '{}'",
        hosts.display(),
        h2spec.display(),
        proxima.proxy.port(),
        report.display()
    );
    let run = tokio::task::spawn_blocking(move || {
        Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &script])
            .output()
            .expect("unshare runs h2spec")
    })
    .await
    .expect("h2spec finishes");
    let output = String::from_utf8_lossy(&run.stdout);
    let report = std::fs::read_to_string(&report).unwrap_or_else(|e| {
        panic!(
            "h2spec wrote no report ({e}); stdout:\n{output}\nstderr:\n{}",
            String::from_utf8_lossy(&run.stderr)
        )
    });
    let cases = junit_cases(&report);
    // h2spec 2.2.1 with --strict has 146 cases; a run that reached fewer did not test
    // the proxy (a wrong host, a dead port).
    assert!(cases.len() >= 146, "{} cases only:\n{output}", cases.len());
    let exception = |case: &Case| {
        H2SPEC_EXCEPTIONS
            .iter()
            .find(|(package, name, _)| case.package == *package && case.name == *name)
    };
    let unexpected: Vec<_> = cases
        .iter()
        .filter(|case| case.problem.is_some() && exception(case).is_none())
        .collect();
    assert!(
        unexpected.is_empty(),
        "h2spec cases failed with no written reason: {unexpected:#?}\n{output}"
    );
    for case in cases.iter().filter(|case| case.problem.is_some()) {
        let (_, _, why) = exception(case).expect("checked above");
        eprintln!(
            "h2spec {} {:?}: fails on purpose: {why}",
            case.package, case.name
        );
    }
    let passed = cases.iter().filter(|case| case.problem.is_none()).count();
    eprintln!("h2spec: {passed} of {} cases pass", cases.len());
}

/// nginx serving `200 origin ok` on a loopback port, in `dir`, stopped on drop.
struct Nginx {
    child: Child,
    addr: SocketAddr,
}

impl Nginx {
    async fn start(dir: &Path) -> Self {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()));
        let d = dir.display();
        let config = format!(
            "daemon off;\nworker_processes 1;\nerror_log {d}/nginx-error.log;\npid {d}/nginx.pid;\n\
             events {{ worker_connections 256; }}\n\
             http {{\n  access_log {d}/nginx-access.log;\n  client_body_temp_path {d}/nginx-body;\n\
               server {{\n    listen {addr};\n    location / {{ return 200 \"origin ok\\n\"; }}\n  }}\n}}\n"
        );
        let path = dir.join("nginx.conf");
        std::fs::write(&path, config).expect("nginx.conf");
        // Its output goes to its logs: a worker that outlived its master would otherwise
        // hold the test's output pipe open.
        let child = Command::new(nginx())
            .arg("-c")
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nginx starts");
        let deadline = Instant::now() + binary::PATIENCE;
        while tokio::net::TcpStream::connect(addr).await.is_err() {
            assert!(Instant::now() < deadline, "nginx does not listen on {addr}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Self { child, addr }
    }
}

impl Drop for Nginx {
    /// SIGTERM, nginx's fast shutdown: the master stops its workers before it exits
    /// (SIGKILL would leave them running).
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smugglex_finds_no_request_smuggling_in_front_of_nginx() {
    let smugglex = tool("smugglex-0.4.0");
    let dir = binary::TempDir::new("smugglex");
    let origin = Nginx::start(&dir.0).await;
    let proxima = proxy_for(&dir.0, "origin", origin.addr).await;

    let report = dir.0.join("smugglex.json");
    // Every check but h2-downgrade (only on https targets), with mutation fuzzing. A
    // check whose attack times out where its baseline did not counts as a finding, so
    // a proxy that waits on a head it should refuse is caught too.
    let checks = "cl-te,te-cl,te-te,h2c,h2,cl-edge,cl-0,0-cl,parser-discrepancy";
    let url = format!("http://{}/", proxima.proxy);
    let args = [
        "--vhost",
        "origin.default",
        "--checks",
        checks,
        "--fuzz",
        "--timeout",
        "5",
        "--json",
        "--no-color",
        "--output",
    ];
    let run = {
        let report = report.clone();
        tokio::task::spawn_blocking(move || {
            Command::new(&smugglex)
                .args(args)
                .arg(&report)
                .arg(&url)
                .output()
                .expect("smugglex runs")
        })
        .await
        .expect("smugglex finishes")
    };
    let text = std::fs::read_to_string(&report).unwrap_or_else(|e| {
        panic!(
            "smugglex wrote no report ({e}); stderr:\n{}",
            String::from_utf8_lossy(&run.stderr)
        )
    });
    let json: serde_json::Value = serde_json::from_str(&text).expect("smugglex JSON");
    let checks_run = json["summary"]["total_checks"]
        .as_u64()
        .expect("total_checks");
    assert_eq!(checks_run, 9, "{text}");
    let findings: Vec<_> = json["results"]
        .as_array()
        .expect("results")
        .iter()
        .flat_map(|target| target["checks"].as_array().expect("checks").iter())
        .filter(|check| check["vulnerable"] == serde_json::Value::Bool(true))
        .map(|check| (check["check_type"].clone(), check["payload"].clone()))
        .collect();
    assert!(findings.is_empty(), "smugglex findings: {findings:#?}");
    // The scan went through the proxy to the origin: its baselines were answered.
    let access = std::fs::read_to_string(dir.0.join("nginx-access.log")).unwrap_or_default();
    assert!(
        access.lines().count() >= 50,
        "nginx saw {} requests",
        access.lines().count()
    );
    drop(proxima);
}
