//! The one-node cluster of `tests/cluster/up.sh`, from a Rust test.
//!
//! The test binary runs twice. The first run (the parent) brings the cluster up with
//! `up.sh --foreground`, whose stdin it holds: if the parent dies, however, the pipe
//! closes and the script takes the cluster down. It then runs itself again inside the
//! cluster's *device* network namespace (10.250.0.2, a client on the node's network), so
//! that every request of the scenarios reaches the node as a device's would: through
//! `10.250.0.1:8080`, the DaemonSet's hostPort. When that run ends the parent closes the
//! script's stdin and waits for `down.sh`, which fails if anything of the cluster is left.
//!
//! The second run (the child) drives the cluster with `tests/cluster/in.sh` (kubectl, ctr
//! and signals on the node) and talks HTTP itself.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Set in the child: the cluster directory.
pub const IN_DEVICE: &str = "PROXIMA_NODE_TEST_CLUSTER";

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `KEY=value` lines.
fn parse_env(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .filter(|(k, _)| !k.is_empty() && k.bytes().all(|b| b.is_ascii_uppercase() || b == b'_'))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The running `up.sh --foreground`.
pub struct Up {
    child: Child,
    stdin: Option<ChildStdin>,
    pub env: BTreeMap<String, String>,
    pub dir: PathBuf,
}

impl Up {
    /// Bring the cluster up in `dir`; panics with the script's verdict if it cannot
    /// (its progress and, on failure, the failed component's log go to stderr).
    pub fn start(dir: &Path) -> Up {
        let mut child = Command::new("bash")
            .arg(repo().join("tests/cluster/up.sh"))
            .arg("--foreground")
            .arg(dir)
            // The tests provide the image's binary (tests/run.sh builds it): cargo test
            // holds cargo's build lock, so the script must not run cargo.
            .env("PROXIMA_NO_CARGO", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("run tests/cluster/up.sh");
        let stdin = child.stdin.take();
        let mut lines = BufReader::new(child.stdout.take().expect("up.sh stdout")).lines();
        let mut printed = String::new();
        let mut ready = false;
        for line in lines.by_ref() {
            let line = line.expect("read up.sh output");
            if line == "CLUSTER_READY" {
                ready = true;
                break;
            }
            printed.push_str(&line);
            printed.push('\n');
        }
        if !ready {
            let status = child.wait().expect("wait for up.sh");
            panic!(
                "the one-node cluster did not come up (tests/cluster/up.sh: {status}); \
                 the failed component and the end of its log are above"
            );
        }
        // The rest of its output (down.sh's) goes to stderr.
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                eprintln!("{line}");
            }
        });
        Up {
            child,
            stdin,
            env: parse_env(&printed),
            dir: dir.to_path_buf(),
        }
    }

    /// Take the cluster down (close the script's stdin) and wait for `down.sh`'s verdict.
    pub fn down(mut self) -> ExitStatus {
        drop(self.stdin.take());
        self.child.wait().expect("wait for up.sh / down.sh")
    }

    /// Run this test binary again, with `args`, inside the device's network namespace.
    pub fn run_on_device(&self, args: &[String]) -> ExitStatus {
        let netns = &self.env["DEVICE_NETNS"];
        Command::new("nsenter")
            .arg(format!("--net={netns}"))
            .arg("--")
            .arg(std::env::current_exe().expect("test executable"))
            .args(args)
            .env(IN_DEVICE, &self.dir)
            .status()
            .expect("nsenter into the device's network namespace")
    }
}

/// What went wrong in a command run on the node.
#[derive(Debug)]
pub struct Failed(pub String);

/// The cluster, as seen from the device.
pub struct Node {
    pub dir: PathBuf,
    pub env: BTreeMap<String, String>,
}

impl Node {
    /// In the child: the cluster `up.sh` described in its directory's `env` file.
    pub fn from_env() -> Option<Node> {
        let dir = PathBuf::from(std::env::var_os(IN_DEVICE)?);
        let text = std::fs::read_to_string(dir.join("env"))
            .unwrap_or_else(|e| panic!("{}/env: {e}", dir.display()));
        Some(Node {
            env: parse_env(&text),
            dir,
        })
    }

    pub fn var(&self, name: &str) -> &str {
        self.env
            .get(name)
            .unwrap_or_else(|| panic!("{name} missing from {}/env", self.dir.display()))
    }

    /// `tests/cluster/in.sh args...`: a command on the node; its stdout, or its stderr.
    pub fn on_node(&self, args: &[&str]) -> Result<String, Failed> {
        let output = Command::new("bash")
            .arg(repo().join("tests/cluster/in.sh"))
            .args(args)
            .env("PROXIMA_CLUSTER_DIR", &self.dir)
            .stdin(Stdio::null())
            .output()
            .expect("run tests/cluster/in.sh");
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(Failed(format!(
                "`{}` failed ({}): {}{}",
                args.join(" "),
                output.status,
                String::from_utf8_lossy(&output.stderr),
                String::from_utf8_lossy(&output.stdout)
            )))
        }
    }

    /// What the cluster looks like, for a failed scenario's report: which of `up.sh`'s
    /// components still run, the node's conditions, every pod, the latest events, and the
    /// last errors and warnings of the kubelet's and containerd's logs. A scenario that
    /// waits in vain says only what it waited for; a CI run that failed so is diagnosed
    /// from this alone.
    pub fn diagnosis(&self) -> String {
        let mut out = String::from("---- the cluster after the failure\n");
        out += &self.components();
        let kubectl = |args: &[&str]| match self.kubectl(args) {
            Ok(text) | Err(Failed(text)) => text,
        };
        let conditions = "{range .items[*].status.conditions[*]}{.type}={.status} ({.reason}: {.message}){\"\\n\"}{end}";
        for (what, args) in [
            (
                "node conditions",
                vec!["get", "nodes", "-o", &format!("jsonpath={conditions}")],
            ),
            ("pods", vec!["get", "pods", "-A", "-o", "wide"]),
            (
                "latest events",
                vec!["get", "events", "-A", "--sort-by=.lastTimestamp"],
            ),
        ] {
            let text = kubectl(&args);
            out += &format!("-- {what}:\n{}\n", last_lines(&text, 40));
        }
        for log in ["kubelet", "containerd"] {
            let text = std::fs::read_to_string(self.dir.join(format!("logs/{log}.log")))
                .unwrap_or_else(|e| format!("(unreadable: {e})"));
            let complaints: String = text
                .lines()
                .filter(|line| is_complaint(line))
                .map(|line| format!("{line}\n"))
                .collect();
            // A component that died says why in its last lines (a fatal line, a Go
            // panic's stack), which need not look like a complaint.
            out += &format!(
                "-- the last errors and warnings of {log}.log:\n{}\n-- its last lines:\n{}\n",
                last_lines(&complaints, 30),
                last_lines(&text, 12)
            );
        }
        out
    }

    /// `name pid` lines of `up.sh`'s pids file, each said running or gone.
    fn components(&self) -> String {
        let pids = std::fs::read_to_string(self.dir.join("pids")).unwrap_or_default();
        let states: Vec<String> = pids
            .lines()
            .filter_map(|line| line.split_once(' '))
            .map(|(name, pid)| {
                let alive = Path::new("/proc").join(pid.trim()).exists();
                format!("{name} {}", if alive { "running" } else { "GONE" })
            })
            .collect();
        format!("-- components: {}\n", states.join(", "))
    }

    pub fn kubectl(&self, args: &[&str]) -> Result<String, Failed> {
        let mut all = vec!["kubectl"];
        all.extend_from_slice(args);
        self.on_node(&all)
    }

    /// kubectl that must succeed.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        self.kubectl(args).unwrap_or_else(|Failed(e)| panic!("{e}"))
    }

    /// `kubectl get ... -o json`.
    pub fn get_json(&self, args: &[&str]) -> Value {
        let mut all = vec!["get"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["-o", "json"]);
        serde_json::from_str(&self.kubectl_ok(&all)).expect("kubectl JSON")
    }

    /// `kubectl apply -k` / `-f` of a path in the repository (or absolute).
    pub fn apply(&self, flag: &str, path: &Path) -> String {
        let path = repo().join(path);
        self.kubectl_ok(&["apply", flag, path.to_str().expect("utf-8 path")])
    }

    /// The pods of `namespace` matching `selector`, running or not.
    pub fn pods(&self, namespace: &str, selector: &str) -> Vec<Value> {
        let list = self.get_json(&["pods", "-n", namespace, "-l", selector]);
        list["items"].as_array().cloned().unwrap_or_default()
    }

    /// The ready pods (condition Ready true, not being deleted) of `namespace` / `selector`.
    pub fn ready_pods(&self, namespace: &str, selector: &str) -> Vec<PodInfo> {
        self.pods(namespace, selector)
            .iter()
            .map(PodInfo::of)
            .filter(|p| p.ready && !p.deleting)
            .collect()
    }

    /// The names of [`Node::ready_pods`].
    pub fn ready_pod_names(&self, namespace: &str, selector: &str) -> BTreeSet<String> {
        self.ready_pods(namespace, selector)
            .into_iter()
            .map(|p| p.name)
            .collect()
    }

    /// The process id, in the node's PID namespace, of a pod's (first) container.
    pub fn container_pid(&self, namespace: &str, pod: &str) -> u32 {
        let json = self.get_json(&["pod", "-n", namespace, pod]);
        let id = json["status"]["containerStatuses"][0]["containerID"]
            .as_str()
            .unwrap_or_else(|| panic!("pod {pod} has no container id yet"))
            .trim_start_matches("containerd://")
            .to_string();
        let socket = self.dir.join("containerd/containerd.sock");
        let tasks = self
            .on_node(&[
                "ctr",
                "--address",
                socket.to_str().expect("utf-8 path"),
                "-n",
                "k8s.io",
                "tasks",
                "ls",
            ])
            .unwrap_or_else(|Failed(e)| panic!("{e}"));
        tasks
            .lines()
            .find_map(|l| {
                let mut fields = l.split_whitespace();
                (fields.next() == Some(id.as_str())).then(|| fields.next()?.parse().ok())?
            })
            .unwrap_or_else(|| panic!("no containerd task {id} for pod {pod}:\n{tasks}"))
    }

    /// Send `signal` (`STOP`, `CONT`, `TERM`) to a process on the node.
    pub fn signal(&self, pid: u32, signal: &str) {
        self.on_node(&["kill", &format!("-{signal}"), &pid.to_string()])
            .unwrap_or_else(|Failed(e)| panic!("{e}"));
    }

    /// `/proc/<pid>/<file>` of a process on the node.
    pub fn proc_file(&self, pid: u32, file: &str) -> String {
        self.on_node(&["cat", &format!("/proc/{pid}/{file}")])
            .unwrap_or_else(|Failed(e)| panic!("{e}"))
    }
}

/// The parts of a Pod the tests look at.
#[derive(Clone, Debug)]
pub struct PodInfo {
    pub name: String,
    pub ip: String,
    pub ready: bool,
    pub deleting: bool,
    pub restarts: u64,
}

impl PodInfo {
    pub fn of(pod: &Value) -> PodInfo {
        let conditions = pod["status"]["conditions"].as_array();
        let ready = conditions.is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        });
        PodInfo {
            name: pod["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            ip: pod["status"]["podIP"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            ready,
            deleting: !pod["metadata"]["deletionTimestamp"].is_null(),
            restarts: pod["status"]["containerStatuses"][0]["restartCount"]
                .as_u64()
                .unwrap_or(0),
        }
    }
}

/// Poll `check` every `every` until it returns `Some`, or panic after `within` naming `what`.
pub fn wait_for<T>(
    what: &str,
    within: Duration,
    every: Duration,
    mut check: impl FnMut() -> Option<T>,
) -> (T, Duration) {
    let start = Instant::now();
    loop {
        if let Some(value) = check() {
            return (value, start.elapsed());
        }
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        std::thread::sleep(every);
    }
}

/// The last `n` lines of `text`.
fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A klog line of severity F, E or W (`E1128 08:30:01.123 ...`), or a logrus one of
/// level fatal, error or warning (containerd).
fn is_complaint(line: &str) -> bool {
    let klog = line.len() > 5
        && matches!(line.as_bytes()[0], b'F' | b'E' | b'W')
        && line.as_bytes()[1..5].iter().all(u8::is_ascii_digit);
    klog || ["level=fatal", "level=error", "level=warning"]
        .iter()
        .any(|level| line.contains(level))
}
