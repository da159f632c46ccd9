//! Proxima the way users run it: on a real Kubernetes node.
//!
//! `tests/cluster/up.sh` starts a one-node cluster (etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler, kubelet, kube-proxy in iptables mode,
//! containerd + runc + CNI bridge/portmap) in namespaces of its own, with the images built
//! from this repository (`tests/cluster/images.sh`: Proxima from `deploy/Dockerfile`, the
//! release binary, on a base of Debian's libc). Then, as the README says:
//! `kubectl apply -k deploy/` (the image set with a kustomize overlay) and
//! `kubectl apply -k examples/kubernetes/`, and the scenarios below, in order, every
//! request sent by a device on the node's network to the node's port 8080 (the
//! DaemonSet's hostPort), as devices do. Nothing is mocked: the pods run under the
//! kubelet, the EndpointSlice controller writes the slices, the proxy reads them through
//! its service account and kube-proxy's ClusterIP for the API server.
//!
//! Every scenario prints what it measured; the last lines sum them up.
//!
//! A custom harness (`harness = false`): one cluster serves every scenario, and it must be
//! taken down, and checked to leave nothing behind, after the last one. Accepts libtest's
//! usual arguments (`--list`, name filters, `--exact`, `--skip`); the installation runs
//! whatever the filter. Needs root, and the image's binary: `cargo build --profile dist
//! -p proxima` (tests/run.sh does it first).

#[path = "k8s/fortio.rs"]
mod fortio;
#[path = "cluster/node.rs"]
mod node;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use node::{wait_for, Node, PodInfo, Up};

type Scenario = fn(&mut World);

/// In the order they run: each leaves the cluster as the next expects it.
const SCENARIOS: &[(&str, Scenario)] = &[
    ("the_proxy_runs_as_the_daemonset_declares", runs_as_declared),
    (
        "a_device_reaches_a_pod_through_the_node",
        device_reaches_a_pod,
    ),
    (
        "a_pod_failing_its_readiness_probe_leaves_the_pool",
        readiness_probe,
    ),
    (
        "a_stopped_container_leaves_the_pool_on_the_qos_rules",
        stopped_container,
    ),
    ("a_rolling_update_under_load_loses_nothing", rolling_update),
    (
        "a_daemonset_rollout_drains_and_the_port_comes_back",
        daemonset_rollout,
    ),
    ("the_proxy_log_has_no_forbidden", no_forbidden),
];

const PATIENCE: Duration = Duration::from_secs(180);
const POLL: Duration = Duration::from_millis(50);

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = Options::parse(&args);
    if options.list {
        for (name, _) in SCENARIOS {
            println!("{name}: test");
        }
        return ExitCode::SUCCESS;
    }
    let selected: Vec<(&str, Scenario)> = SCENARIOS
        .iter()
        .copied()
        .filter(|(name, _)| options.selects(name))
        .collect();
    if let Some(node) = Node::from_env() {
        return run_scenarios(node, &selected);
    }
    println!("\nrunning {} tests", selected.len());
    if selected.is_empty() {
        println!("\ntest result: ok. 0 passed; 0 failed\n");
        return ExitCode::SUCCESS;
    }
    if let Err(stale) = image_binary_is_fresh() {
        eprintln!("{stale}");
        return ExitCode::FAILURE;
    }
    let dir = std::env::temp_dir().join(format!("proxima-node-test-{}", std::process::id()));
    let up = match std::panic::catch_unwind(|| Up::start(&dir)) {
        Ok(up) => up,
        Err(_) => {
            println!("\ntest result: FAILED. the cluster did not start\n");
            return ExitCode::FAILURE;
        }
    };
    let ran = up.run_on_device(&args);
    let down = up.down();
    if !down.success() {
        eprintln!(
            "tests/cluster/down.sh failed ({down}): part of the cluster was left behind (above)"
        );
    }
    if ran.success() && down.success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// libtest's arguments, as far as this harness needs them.
#[derive(Default)]
struct Options {
    list: bool,
    exact: bool,
    ignored: bool,
    filters: Vec<String>,
    skip: Vec<String>,
}

impl Options {
    fn parse(args: &[String]) -> Options {
        let mut options = Options::default();
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--list" => options.list = true,
                "--exact" => options.exact = true,
                "--ignored" => options.ignored = true,
                "--skip" => options.skip.extend(args.next().cloned()),
                "--test-threads" | "--color" | "--format" | "-Z" | "--logfile" => {
                    args.next();
                }
                flag if flag.starts_with('-') => {}
                filter => options.filters.push(filter.to_string()),
            }
        }
        options
    }

    fn selects(&self, name: &str) -> bool {
        let matches = |f: &String| {
            if self.exact {
                name == f
            } else {
                name.contains(f.as_str())
            }
        };
        !self.ignored
            && (self.filters.is_empty() || self.filters.iter().any(matches))
            && !self.skip.iter().any(|s| name.contains(s.as_str()))
    }
}

/// The image is built from `target/dist/proxima`: fail rather than test an old build.
fn image_binary_is_fresh() -> Result<(), String> {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let binary = std::env::var_os("PROXIMA_IMAGE_BINARY")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo.join("target/dist/proxima"));
    let built = std::fs::metadata(&binary)
        .and_then(|m| m.modified())
        .map_err(|e| {
            format!(
                "{}: {e}: build the image's binary first: cargo build --profile dist -p proxima \
                 (tests/run.sh does)",
                binary.display()
            )
        })?;
    let mut newest: Option<(SystemTime, PathBuf)> = None;
    let mut visit = vec![repo.join("crates"), repo.join("Cargo.lock")];
    while let Some(path) = visit.pop() {
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        // A crate's tests, benchmarks and examples are not in the binary: a change to
        // one leaves `cargo build` with nothing to do, so its file would stay newer.
        let not_built = ["tests", "benches", "examples"];
        if meta.is_dir()
            && path
                .file_name()
                .is_some_and(|n| not_built.iter().any(|d| n == *d))
        {
            continue;
        }
        if meta.is_dir() {
            if let Ok(entries) = std::fs::read_dir(&path) {
                visit.extend(entries.flatten().map(|e| e.path()));
            }
        } else if path
            .extension()
            .is_some_and(|e| e == "rs" || e == "toml" || e == "lock")
        {
            let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            if newest.as_ref().is_none_or(|(t, _)| modified > *t) {
                newest = Some((modified, path));
            }
        }
    }
    match newest {
        Some((time, path)) if time > built && std::env::var_os("PROXIMA_IMAGE_BINARY").is_none() => {
            Err(format!(
                "{} is older than {}: rebuild it (cargo build --profile dist -p proxima; tests/run.sh \
                 does) so that the image tests this tree",
                binary.display(),
                path.display()
            ))
        }
        _ => Ok(()),
    }
}

// ---- the child: scenarios ----------------------------------------------------------------

/// What the scenarios share.
struct World {
    node: Node,
    rt: tokio::runtime::Runtime,
    http: Http,
    /// The admin token of the `proxima-admin` Secret (README "Admin access").
    token: String,
    /// `http://NODE_IP:8080`, `http://NODE_IP:9901`.
    proxy: String,
    admin: String,
    /// Logs of Proxima pods that are gone (a rollout replaced them).
    old_logs: String,
    /// One line per measurement, printed at the end.
    summary: Vec<String>,
}

fn run_scenarios(node: Node, selected: &[(&str, Scenario)]) -> ExitCode {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let node_ip = node.var("NODE_IP").to_string();
    let mut world = World {
        rt,
        http: Http::new(),
        token: format!("{:032x}", rand::random::<u128>()),
        proxy: format!("http://{node_ip}:8080"),
        admin: format!("http://{node_ip}:9901"),
        node,
        old_logs: String::new(),
        summary: Vec::new(),
    };
    let mut failed = Vec::new();
    let mut passed = 0;
    let started = Instant::now();
    let mut run = |name: &str, scenario: Scenario, world: &mut World| {
        eprintln!("\n==== {name}");
        let t = Instant::now();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| scenario(world)));
        let verdict = if outcome.is_ok() { "ok" } else { "FAILED" };
        println!(
            "test {name} ... {verdict} ({:.1}s)",
            t.elapsed().as_secs_f64()
        );
        if outcome.is_ok() {
            passed += 1;
        } else {
            eprintln!("{}", world.node.diagnosis());
            failed.push(name.to_string());
        }
        outcome.is_ok()
    };
    if !run("install_as_the_readme_says", install, &mut world) {
        println!("\ntest result: FAILED. the installation failed; no scenario ran\n");
        return ExitCode::FAILURE;
    }
    for (name, scenario) in selected {
        run(name, *scenario, &mut world);
    }
    println!("\nmeasured:");
    for line in &world.summary {
        println!("  {line}");
    }
    let verdict = if failed.is_empty() { "ok" } else { "FAILED" };
    println!(
        "\ntest result: {verdict}. {passed} passed; {} failed; finished in {:.1}s",
        failed.len(),
        started.elapsed().as_secs_f64()
    );
    for name in &failed {
        println!("    {name}");
    }
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

impl World {
    fn get(&self, path: &str, headers: &[(&str, &str)]) -> Result<Reply, String> {
        let url = format!("{}{path}", self.proxy);
        self.rt.block_on(self.http.get(&url, headers))
    }

    /// `GET path` for `service` through the node's port.
    fn call(&self, service: &str, path: &str) -> Reply {
        self.get(path, &[("x-service", service)])
            .unwrap_or_else(|e| panic!("GET {path} for {service}: {e}"))
    }

    /// The service's entry in `/debug/pools`, read with the admin token.
    fn pool(&self, service: &str) -> Value {
        let url = format!("{}/debug/pools?service={service}", self.admin);
        let auth = format!("Bearer {}", self.token);
        let reply = self
            .rt
            .block_on(self.http.get(&url, &[("authorization", &auth)]))
            .unwrap_or_else(|e| panic!("GET {url}: {e}"));
        assert_eq!(reply.status, StatusCode::OK, "{url}: {}", reply.body);
        let json: Value = serde_json::from_str(&reply.body).expect("/debug/pools JSON");
        json["services"][0].clone()
    }

    fn proxima_pod(&self) -> PodInfo {
        let pods = self
            .node
            .ready_pods("proxima-system", "app.kubernetes.io/name=proxima");
        assert_eq!(
            pods.len(),
            1,
            "one ready Proxima pod on the one node: {pods:?}"
        );
        pods[0].clone()
    }

    fn note(&mut self, line: String) {
        eprintln!("  -> {line}");
        self.summary.push(line);
    }
}

/// The pool entry of endpoint `id` (the pod's name).
fn endpoint<'a>(pool: &'a Value, id: &str) -> Option<&'a Value> {
    pool["endpoints"].as_array()?.iter().find(|e| e["id"] == id)
}

fn in_pool(pool: &Value, id: &str) -> bool {
    endpoint(pool, id).is_some_and(|e| e["in_pool"] == true)
}

// ---- installation ----------------------------------------------------------------------------

/// The README's installation (tests/cluster/install.sh: the admin Secret, `kubectl apply
/// -k` of deploy/ with the image set by a kustomize overlay, `kubectl apply -k
/// examples/kubernetes/`, both rollouts), then the tests' own workloads; every rollout
/// must finish and the proxy must answer.
fn install(w: &mut World) {
    let node = &w.node;
    let t = Instant::now();
    let status = Command::new("bash")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cluster/install.sh"))
        .arg(&w.token)
        .env("PROXIMA_CLUSTER_DIR", &node.dir)
        .status()
        .expect("run tests/cluster/install.sh");
    assert!(
        status.success(),
        "tests/cluster/install.sh failed: {status}"
    );
    eprintln!(
        "{}",
        node.apply("-f", Path::new("tests/cluster/manifests/workloads.yaml"))
    );
    for what in ["deployment/slow", "deployment/ready"] {
        node.kubectl_ok(&["-n", "default", "rollout", "status", what, "--timeout=180s"]);
    }
    let rolled_out = t.elapsed();
    // The proxy answers once discovery has synced.
    let ((), ready) = wait_for(
        "Proxima's /readyz through the node's admin port",
        PATIENCE,
        POLL,
        || {
            let url = format!("{}/readyz", w.admin);
            let reply = w.rt.block_on(w.http.get(&url, &[])).ok()?;
            (reply.status == StatusCode::OK).then_some(())
        },
    );
    let image_mb = node
        .var("PROXIMA_IMAGE_BYTES")
        .parse::<f64>()
        .unwrap_or(0.0)
        / 1e6;
    w.note(format!(
        "install: image {} ({image_mb:.1} MB); installed and every rollout done in {:.1}s, /readyz 200 {:.1}s later",
        node.var("PROXIMA_IMAGE"),
        rolled_out.as_secs_f64(),
        ready.as_secs_f64()
    ));
}

// ---- scenarios ---------------------------------------------------------------------------------

/// The proxy's process, seen from the node, holds exactly what deploy/daemonset.yaml
/// declares: its user, no capabilities, no privilege escalation, the runtime's seccomp
/// profile, a read-only root filesystem; and it reaches the API server as the pod's
/// service account, through the `kubernetes` Service.
fn runs_as_declared(w: &mut World) {
    let pod = w.proxima_pod();
    check_security(w, &pod.name);
    let metrics =
        w.rt.block_on(w.http.get(&format!("{}/metrics", w.admin), &[]))
            .expect("GET /metrics");
    assert!(
        metrics
            .body
            .lines()
            .any(|l| l == "proxima_kube_api_connected 1"),
        "the proxy is not connected to the API server:\n{}",
        metrics
            .body
            .lines()
            .filter(|l| l.contains("kube_api"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let env = w.node.kubectl_ok(&[
        "-n",
        "proxima-system",
        "exec",
        &pod.name,
        "--",
        "/proxima",
        "--version",
    ]);
    w.note(format!(
        "security context of {} as declared; `kubectl exec`: {}",
        pod.name,
        env.trim()
    ));
}

fn check_security(w: &World, pod: &str) {
    let declared: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/daemonset.yaml"),
        )
        .expect("read deploy/daemonset.yaml"),
    )
    .expect("deploy/daemonset.yaml is YAML");
    let container = &declared["spec"]["template"]["spec"]["containers"][0]["securityContext"];
    let uid = container["runAsUser"].as_u64().expect("runAsUser declared");
    let gid = container["runAsGroup"]
        .as_u64()
        .expect("runAsGroup declared");
    let pid = w.node.container_pid("proxima-system", pod);
    let status = w.node.proc_file(pid, "status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "))
            .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
    };
    assert_eq!(field("Uid"), format!("{uid} {uid} {uid} {uid}"), "user");
    assert_eq!(field("Gid"), format!("{gid} {gid} {gid} {gid}"), "group");
    if container["capabilities"]["drop"][0] == "ALL" {
        for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
            assert_eq!(
                field(set),
                "0000000000000000",
                "{set}: capabilities drop ALL"
            );
        }
    }
    if container["allowPrivilegeEscalation"] == false {
        assert_eq!(field("NoNewPrivs"), "1", "allowPrivilegeEscalation: false");
    }
    if container["seccompProfile"]["type"] == "RuntimeDefault" {
        assert_eq!(field("Seccomp"), "2", "seccomp RuntimeDefault: filter mode");
    }
    if container["readOnlyRootFilesystem"] == true {
        let mounts = w.node.proc_file(pid, "mountinfo");
        let root = mounts
            .lines()
            .find(|l| l.split_whitespace().nth(4) == Some("/"))
            .expect("a root mount in mountinfo");
        let options = root.split_whitespace().nth(5).unwrap_or_default();
        assert!(
            options.split(',').any(|o| o == "ro"),
            "root filesystem read-only: {root}"
        );
    }
    let limits = w.node.proc_file(pid, "limits");
    let nofile = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap_or_default()
        .to_string();
    eprintln!("  {pod}: uid {uid}, gid {gid}, no capabilities, no_new_privs, seccomp filter, / read-only; {nofile}");
}

/// A device sends to the node's port 8080 and names the Service; a pod answers. The
/// pool shows the pods with their EndpointSlice conditions, read with the admin token.
fn device_reaches_a_pod(w: &mut World) {
    let pods: BTreeSet<String> = w
        .node
        .ready_pod_names("default", "app.kubernetes.io/name=dps");
    assert_eq!(pods.len(), 3, "three dps pods: {pods:?}");
    let mut answered: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..60 {
        let reply = w.call("dps.default", "/hostname");
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        assert!(
            pods.contains(&reply.body),
            "answered by {:?}, not a dps pod",
            reply.body
        );
        *answered.entry(reply.body).or_default() += 1;
    }
    assert_eq!(
        answered.len(),
        3,
        "every pod of the pool answers: {answered:?}"
    );
    let by_host = w
        .get("/hostname", &[("host", "dps.default.svc.cluster.local")])
        .expect("GET by Host");
    assert_eq!(by_host.status, StatusCode::OK, "{}", by_host.body);
    let unknown = w.call("nope.default", "/");
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert!(unknown.body.contains("unknown service"), "{}", unknown.body);
    // /debug/pools answers a device only with the token.
    let url = format!("{}/debug/pools", w.admin);
    let denied =
        w.rt.block_on(w.http.get(&url, &[]))
            .expect("GET /debug/pools");
    assert_eq!(denied.status, StatusCode::FORBIDDEN, "{}", denied.body);
    let pool = w.pool("dps.default");
    let ready = w.node.ready_pods("default", "app.kubernetes.io/name=dps");
    for pod in &ready {
        let ep = endpoint(&pool, &pod.name)
            .unwrap_or_else(|| panic!("{} not in /debug/pools: {pool:#}", pod.name));
        assert_eq!(ep["address"], format!("{}:8080", pod.ip), "{ep:#}");
        assert_eq!(ep["node"], w.node.var("NODE_NAME"), "{ep:#}");
        assert_eq!(
            (&ep["ready"], &ep["serving"], &ep["terminating"]),
            (&Value::Bool(true), &Value::Bool(true), &Value::Bool(false)),
            "EndpointSlice conditions: {ep:#}"
        );
        assert_eq!(ep["in_pool"], true, "{ep:#}");
    }
    w.note(format!(
        "device -> {}:8080 -> dps pods: 60 requests spread {:?}; /debug/pools lists {} pods, ready/serving",
        w.node.var("NODE_IP"),
        answered.values().collect::<Vec<_>>(),
        ready.len()
    ));
}

/// `ready`'s pods answer /readyz with 503 once their process gets SIGTERM, while
/// `--delay-shutdown` keeps them serving: only the kubelet's verdict, through the
/// EndpointSlice, takes such a pod out of the pool. No request fails meanwhile, and none
/// reaches the pod once it is out.
fn readiness_probe(w: &mut World) {
    let service = "ready.default";
    let pods = w.node.ready_pods("default", "app.kubernetes.io/name=ready");
    assert_eq!(pods.len(), 2, "{pods:?}");
    for _ in 0..20 {
        assert_eq!(w.call(service, "/hostname").status, StatusCode::OK);
    }
    let (victim, other) = (&pods[0], &pods[1]);
    let ((), _) = wait_for("both ready pods in the pool", PATIENCE, POLL, || {
        let pool = w.pool(service);
        (in_pool(&pool, &victim.name) && in_pool(&pool, &other.name)).then_some(())
    });
    let traffic = Traffic::start(w, service, "/hostname", 2);
    let pid = w.node.container_pid("default", &victim.name);
    w.node.signal(pid, "TERM");
    let (pool, left) = wait_for("the unready pod leaves the pool", PATIENCE, POLL, || {
        let pool = w.pool(service);
        let ep = endpoint(&pool, &victim.name)?;
        (ep["ready"] == false && ep["in_pool"] == false).then_some(pool)
    });
    let out_at = Instant::now();
    let ep = endpoint(&pool, &victim.name).expect("endpoint").clone();
    // What the kubelet says.
    let kubelet = PodInfo::of(&w.node.get_json(&["pod", "-n", "default", &victim.name]));
    assert!(
        !kubelet.ready,
        "the kubelet marked {} not ready",
        victim.name
    );
    // Still serving (until --delay-shutdown ends), but it gets nothing more from the proxy.
    std::thread::sleep(Duration::from_secs(2));
    let outcome = traffic.stop(w);
    let late = outcome.sent_to_between(&victim.name, out_at, Instant::now());
    assert_eq!(
        late, 0,
        "requests reached {} after it left the pool",
        victim.name
    );
    assert!(
        outcome.failures.is_empty(),
        "requests failed: {:?}",
        outcome.failures
    );
    w.note(format!(
        "readiness: SIGTERM -> /readyz 503 -> kubelet NotReady -> out of the pool in {:.2}s \
         (reason {:?}); {} requests meanwhile, 0 failed",
        left.as_secs_f64(),
        ep["reason"].as_str().unwrap_or_default(),
        outcome.total
    ));
    // It exits after --delay-shutdown, the kubelet restarts it, it comes back.
    let ((), back) = wait_for(
        "the restarted pod back in the pool",
        PATIENCE,
        Duration::from_millis(200),
        || {
            let pod = PodInfo::of(&w.node.get_json(&["pod", "-n", "default", &victim.name]));
            if !(pod.ready && pod.restarts >= 1) {
                return None;
            }
            w.call(service, "/hostname");
            in_pool(&w.pool(service), &victim.name).then_some(())
        },
    );
    w.note(format!(
        "readiness: the container restarted and {} is back in the pool {:.1}s after the SIGTERM",
        victim.name,
        (back + left).as_secs_f64()
    ));
}

/// A container stopped with SIGSTOP accepts connections (the kernel does) and answers
/// nothing. The kubelet notices only after its probe fails three times; the QoS pool
/// must drop the pod well before, on its own measurements, with the EndpointSlice still
/// saying ready. Requests caught on it finish once it continues: no client error.
fn stopped_container(w: &mut World) {
    let service = "dps.default";
    let pods = w.node.ready_pods("default", "app.kubernetes.io/name=dps");
    assert_eq!(pods.len(), 3, "{pods:?}");
    let victim = pods[0].clone();
    let traffic = Traffic::start(w, service, "/hostname", 4);
    std::thread::sleep(Duration::from_secs(3));
    let pid = w.node.container_pid("default", &victim.name);
    w.node.signal(pid, "STOP");
    let stopped = Instant::now();
    // Whatever fails below, the pod continues: the scenarios after this one use it.
    let stopped_pod = Continue { node: &w.node, pid };
    let (ep, left) = wait_for(
        "the stopped pod leaves the QoS pool",
        Duration::from_secs(10),
        POLL,
        || {
            let pool = w.pool(service);
            let ep = endpoint(&pool, &victim.name)?;
            (ep["in_pool"] == false).then(|| ep.clone())
        },
    );
    assert_eq!(
        ep["ready"], true,
        "left on the QoS rules, before the kubelet: {ep:#}"
    );
    let out_at = Instant::now();
    std::thread::sleep(Duration::from_secs(8).saturating_sub(stopped.elapsed()));
    drop(stopped_pod);
    let continued = Instant::now();
    let ((), back) = wait_for("the continued pod back in the pool", PATIENCE, POLL, || {
        in_pool(&w.pool(service), &victim.name).then_some(())
    });
    std::thread::sleep(Duration::from_secs(2));
    let outcome = traffic.stop(w);
    assert!(
        outcome.failures.is_empty(),
        "requests failed: {:?}",
        outcome.failures
    );
    let late = outcome.sent_to_between(&victim.name, out_at, continued);
    assert_eq!(
        late, 0,
        "client requests went to the stopped pod after it left the pool"
    );
    w.note(format!(
        "SIGSTOP: out of the pool in {:.3}s ({:?}), EndpointSlice still ready; back {:.1}s after \
         SIGCONT; {} requests, 0 failed, {} waited for the stopped pod (> 1 s: {})",
        left.as_secs_f64(),
        ep["reason"].as_str().unwrap_or_default(),
        back.as_secs_f64(),
        outcome.total,
        outcome.slow_on(&victim.name),
        outcome.slower_than(Duration::from_secs(1))
    ));
}

/// Sends SIGCONT to a stopped process when dropped (after a panic too).
struct Continue<'a> {
    node: &'a Node,
    pid: u32,
}

impl Drop for Continue<'_> {
    fn drop(&mut self) {
        let _ = self.node.on_node(&["kill", "-CONT", &self.pid.to_string()]);
    }
}

/// kubernetes-optimization §5.2.3: Fortio, 8 connections, 1500 requests/s, through the
/// node's port while `kubectl rollout restart` replaces every pod of the Deployment.
fn rolling_update(w: &mut World) {
    let load = fortio::Load {
        connections: 8,
        qps: 1500,
        duration: Duration::from_secs(45),
    };
    let url = format!("{}/", w.proxy);
    let before: BTreeSet<String> = w
        .node
        .ready_pod_names("default", "app.kubernetes.io/name=dps");
    let running = fortio::start(
        load,
        &url,
        &["x-service: dps.default"],
        &std::env::temp_dir(),
    );
    std::thread::sleep(Duration::from_secs(3));
    let t = Instant::now();
    w.node.kubectl_ok(&["rollout", "restart", "deployment/dps"]);
    w.node
        .kubectl_ok(&["rollout", "status", "deployment/dps", "--timeout=120s"]);
    let rolled = t.elapsed();
    assert!(
        rolled + Duration::from_secs(3) < load.duration,
        "the rollout ({rolled:?}) outlasted the load"
    );
    let outcome = w.rt.block_on(running.finish());
    eprintln!("{outcome}");
    let after: BTreeSet<String> = w
        .node
        .ready_pod_names("default", "app.kubernetes.io/name=dps");
    assert!(
        before.is_disjoint(&after),
        "every pod replaced: {before:?} -> {after:?}"
    );
    assert_eq!(
        outcome.failures(),
        0,
        "requests lost during the rollout:\n{outcome}"
    );
    w.note(format!(
        "rolling update: {} requests at {:.0}/s over {:.0}s, rollout {:.1}s, {} failed; p99 {:.2} ms",
        outcome.requests,
        outcome.actual_qps,
        outcome.actual_duration.as_secs_f64(),
        rolled.as_secs_f64(),
        outcome.failures(),
        outcome.percentile("99")
    ));
}

/// `kubectl rollout restart daemonset/proxima`: the old proxy gets SIGTERM and must let
/// the requests in flight finish; new connections to the node's port fail until the next
/// pod listens. The window is measured with a connection every 10 ms.
fn daemonset_rollout(w: &mut World) {
    let old = w.proxima_pod();
    let log = LogFollower::start(&w.node, "proxima-system", &old.name);
    let slow: Vec<_> = (0..4)
        .map(|_| {
            let http = Http::new();
            let url = format!("{}/?delay=4s", w.proxy);
            w.rt.spawn(async move {
                let t = Instant::now();
                let reply = http.get(&url, &[("x-service", "slow.default")]).await;
                (reply, t.elapsed())
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let prober = Prober::start(w);
    std::thread::sleep(Duration::from_secs(1));
    let t = Instant::now();
    w.node.kubectl_ok(&[
        "-n",
        "proxima-system",
        "rollout",
        "restart",
        "daemonset/proxima",
    ]);
    w.node.kubectl_ok(&[
        "-n",
        "proxima-system",
        "rollout",
        "status",
        "daemonset/proxima",
        "--timeout=180s",
    ]);
    let rolled = t.elapsed();
    let ((), _) = wait_for("the new proxy routes", PATIENCE, POLL, || {
        (w.get("/hostname", &[("x-service", "dps.default")])
            .ok()?
            .status
            == StatusCode::OK)
            .then_some(())
    });
    std::thread::sleep(Duration::from_secs(1));
    let probes = prober.stop(w);
    for handle in slow {
        let (reply, took) = w.rt.block_on(handle).expect("slow request task");
        let reply = reply.unwrap_or_else(|e| panic!("a request in flight at SIGTERM failed: {e}"));
        assert_eq!(
            reply.status,
            StatusCode::OK,
            "in flight at SIGTERM: {}",
            reply.body
        );
        assert!(took >= Duration::from_secs(4), "{took:?}");
    }
    let old_log = log.stop();
    assert!(
        old_log.contains("SIGTERM received"),
        "old proxy's log:\n{old_log}"
    );
    assert!(
        old_log.contains("shut down cleanly"),
        "old proxy's log:\n{old_log}"
    );
    w.old_logs.push_str(&old_log);
    let new = w.proxima_pod();
    assert_ne!(new.name, old.name);
    check_security(w, &new.name);
    // A connection is either answered or refused: none accepted and then dropped.
    let lost: Vec<&Attempt> = probes
        .attempts
        .iter()
        .filter(|a| !matches!(&a.outcome, Ok(200)) && a.outcome != Err("ConnectionRefused".into()))
        .collect();
    assert!(
        lost.is_empty(),
        "connections accepted and not answered: {lost:?}"
    );
    let refused = probes.window(Some("ConnectionRefused"));
    let failing = probes.window(None);
    w.note(format!(
        "DaemonSet rollout: 4 requests in flight at SIGTERM all answered 200; rollout {:.1}s; \
         new connections refused for {:.2}s (failing at all for {:.2}s; {} of {} connections: {})",
        rolled.as_secs_f64(),
        refused.as_secs_f64(),
        failing.as_secs_f64(),
        probes.failed(),
        probes.attempts.len(),
        probes.kinds()
    ));
}

/// Nothing in any proxy's log says `forbidden`: RBAC gives it all it asks for.
fn no_forbidden(w: &mut World) {
    let current = w.node.kubectl_ok(&[
        "-n",
        "proxima-system",
        "logs",
        "-l",
        "app.kubernetes.io/name=proxima",
        "--tail=-1",
    ]);
    let all = format!("{}{current}", w.old_logs);
    let forbidden: Vec<&str> = all
        .lines()
        .filter(|l| l.to_ascii_lowercase().contains("forbidden"))
        .collect();
    assert!(
        forbidden.is_empty(),
        "forbidden in the proxy's log:\n{}",
        forbidden.join("\n")
    );
    let warnings: Vec<&str> = all
        .lines()
        .filter(|l| l.contains("\"level\":\"WARN\"") || l.contains("\"level\":\"ERROR\""))
        .collect();
    for line in &warnings {
        eprintln!("  {line}");
    }
    w.note(format!(
        "logs: {} lines from the proxies, none forbidden; {} warnings or errors (above)",
        all.lines().count(),
        warnings.len()
    ));
}

// ---- traffic ----------------------------------------------------------------------------------------

/// Sequential requests on `workers` keep-alive connections until stopped, each answer
/// recorded with the pod that gave it (agnhost's /hostname).
struct Traffic {
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<Vec<Sent>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

#[derive(Clone, Debug)]
struct Sent {
    started: Instant,
    pod: Option<String>,
    status: Option<u16>,
    error: Option<String>,
    took: Duration,
}

struct TrafficOutcome {
    total: usize,
    failures: Vec<String>,
    log: Vec<Sent>,
}

impl Traffic {
    fn start(w: &World, service: &str, path: &str, workers: usize) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let log = Arc::new(Mutex::new(Vec::new()));
        let tasks = (0..workers)
            .map(|_| {
                let (stop, log, http) = (stop.clone(), log.clone(), Http::new());
                let url = format!("{}{path}", w.proxy);
                let service = service.to_string();
                w.rt.spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        let t = Instant::now();
                        let reply = http.get(&url, &[("x-service", &service)]).await;
                        let sent = match reply {
                            Ok(r) => Sent {
                                started: t,
                                pod: (r.status == StatusCode::OK).then(|| r.body.clone()),
                                status: Some(r.status.as_u16()),
                                error: (r.status != StatusCode::OK).then_some(r.body),
                                took: t.elapsed(),
                            },
                            Err(e) => Sent {
                                started: t,
                                pod: None,
                                status: None,
                                error: Some(e),
                                took: t.elapsed(),
                            },
                        };
                        log.lock().unwrap().push(sent);
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                })
            })
            .collect();
        Traffic { stop, log, tasks }
    }

    fn stop(self, w: &World) -> TrafficOutcome {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            w.rt.block_on(task).expect("traffic task");
        }
        let log = self.log.lock().unwrap().clone();
        let failures = log
            .iter()
            .filter(|s| s.status != Some(200))
            .map(|s| format!("{:?} {:?}", s.status, s.error))
            .collect();
        TrafficOutcome {
            total: log.len(),
            failures,
            log,
        }
    }
}

impl TrafficOutcome {
    /// Requests sent from `from` on (and before `to`) that `pod` answered.
    fn sent_to_between(&self, pod: &str, from: Instant, to: Instant) -> usize {
        self.log
            .iter()
            .filter(|s| s.pod.as_deref() == Some(pod) && s.started > from && s.started < to)
            .count()
    }

    fn slow_on(&self, pod: &str) -> usize {
        self.log
            .iter()
            .filter(|s| s.pod.as_deref() == Some(pod) && s.took > Duration::from_millis(500))
            .count()
    }

    fn slower_than(&self, limit: Duration) -> usize {
        self.log.iter().filter(|s| s.took > limit).count()
    }
}

/// A new connection to the node's port every 10 ms, each sending one request.
struct Prober {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Vec<Attempt>>,
}

#[derive(Debug, Clone)]
struct Attempt {
    at: Duration,
    outcome: Result<u16, String>,
}

struct Probes {
    attempts: Vec<Attempt>,
}

impl Prober {
    fn start(w: &World) -> Prober {
        let stop = Arc::new(AtomicBool::new(false));
        let addr: std::net::SocketAddr = format!("{}:8080", w.node.var("NODE_IP"))
            .parse()
            .expect("address");
        let task = w.rt.spawn({
            let stop = stop.clone();
            async move {
                let start = Instant::now();
                let mut running = Vec::new();
                let mut tick = tokio::time::interval(Duration::from_millis(10));
                while !stop.load(Ordering::Relaxed) {
                    tick.tick().await;
                    let at = start.elapsed();
                    running.push(tokio::spawn(async move {
                        Attempt {
                            at,
                            outcome: one_connection(addr).await,
                        }
                    }));
                }
                let mut attempts = Vec::new();
                for r in running {
                    attempts.push(r.await.expect("probe task"));
                }
                attempts
            }
        });
        Prober { stop, task }
    }

    fn stop(self, w: &World) -> Probes {
        self.stop.store(true, Ordering::Relaxed);
        Probes {
            attempts: w.rt.block_on(self.task).expect("prober"),
        }
    }
}

async fn one_connection(addr: std::net::SocketAddr) -> Result<u16, String> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| kind(&e))?;
        stream
            .write_all(b"GET /hostname HTTP/1.1\r\nhost: probe\r\nx-service: dps.default\r\nconnection: close\r\n\r\n")
            .await
            .map_err(|e| kind(&e))?;
        let mut head = [0u8; 12];
        stream.read_exact(&mut head).await.map_err(|e| kind(&e))?;
        std::str::from_utf8(&head[9..12])
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| "bad status line".to_string())
    };
    match tokio::time::timeout(Duration::from_secs(3), exchange).await {
        Ok(result) => result,
        Err(_) => Err("timeout".to_string()),
    }
}

fn kind(e: &std::io::Error) -> String {
    format!("{:?}", e.kind())
}

impl Probes {
    fn failed(&self) -> usize {
        self.attempts
            .iter()
            .filter(|a| a.outcome != Ok(200))
            .count()
    }

    /// From the first connection that failed with `kind` (None: any failure) to the
    /// last one, at one connection per 10 ms.
    fn window(&self, kind: Option<&str>) -> Duration {
        let failed: Vec<Duration> = self
            .attempts
            .iter()
            .filter(|a| match (&a.outcome, kind) {
                (Ok(200), _) => false,
                (Err(e), Some(kind)) => e == kind,
                (_, _) => kind.is_none(),
            })
            .map(|a| a.at)
            .collect();
        match (failed.first(), failed.last()) {
            (Some(first), Some(last)) => *last - *first + Duration::from_millis(10),
            _ => Duration::ZERO,
        }
    }

    fn kinds(&self) -> String {
        let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
        for a in &self.attempts {
            let key = match &a.outcome {
                Ok(status) => status.to_string(),
                Err(e) => e.clone(),
            };
            *kinds.entry(key).or_default() += 1;
        }
        format!("{kinds:?}")
    }
}

/// `kubectl logs -f` of a pod, in the background, until the pod is gone.
struct LogFollower {
    child: std::process::Child,
    out: PathBuf,
}

impl LogFollower {
    fn start(node: &Node, namespace: &str, pod: &str) -> LogFollower {
        let out = node.dir.join(format!("log-{pod}.txt"));
        let file = std::fs::File::create(&out).expect("log file");
        let child = Command::new("bash")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cluster/in.sh"))
            .args(["kubectl", "-n", namespace, "logs", "-f", pod])
            .env("PROXIMA_CLUSTER_DIR", &node.dir)
            .stdout(file)
            .stderr(Stdio::null())
            .spawn()
            .expect("kubectl logs -f");
        LogFollower { child, out }
    }

    /// What it printed (it ends by itself when the pod's container exits).
    fn stop(mut self) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self
            .child
            .try_wait()
            .expect("kubectl logs status")
            .is_none()
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }
}

// ---- HTTP -------------------------------------------------------------------------------------------

/// A keep-alive HTTP/1.1 client (hyper), as an application would use.
#[derive(Clone)]
struct Http(Client<HttpConnector, Empty<Bytes>>);

#[derive(Debug)]
struct Reply {
    status: StatusCode,
    body: String,
}

impl Http {
    fn new() -> Self {
        Http(
            Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(5))
                .build_http(),
        )
    }

    async fn get(&self, url: &str, headers: &[(&str, &str)]) -> Result<Reply, String> {
        let mut request = Request::get(url);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request.body(Empty::new()).map_err(|e| e.to_string())?;
        let response = tokio::time::timeout(Duration::from_secs(30), self.0.request(request))
            .await
            .map_err(|_| format!("no answer from {url} in 30s"))?
            .map_err(|e| format!("{e:?}"))?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok(Reply {
            status,
            body: String::from_utf8_lossy(&body).into_owned(),
        })
    }
}
