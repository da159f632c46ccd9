//! A real Kubernetes control plane for tests: etcd and kube-apiserver on free loopback
//! ports, each cluster with its own temporary data and certificate directory.
//!
//! Include it with `#[path = ".../tests/k8s/support.rs"] mod k8s_support;` (the testbed's
//! `--kube` control plane includes it too, so it holds no test-only code: every start
//! step has a fallible form). Binaries come
//! from `tests/k8s/provision.sh` (kube-apiserver and kubectl v1.31.4 in
//! `${PROXIMA_CACHE:-$HOME/.cache/proxima}`, etcd from Debian); the environment variables
//! `PROXIMA_ETCD`, `PROXIMA_KUBE_APISERVER` and `PROXIMA_KUBECTL` override them. A missing
//! binary fails the test with a message naming the provision script; nothing is skipped.
//!
//! There is no kubelet, scheduler or controller-manager: tests create Nodes, Services and
//! EndpointSlices themselves. Everything is killed and deleted when the [`Cluster`] drops
//! (set `PROXIMA_KEEP_K8S_DIR=1` to keep the directory, with the logs, for debugging).

#![allow(dead_code)]

use std::fs;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use kube::config::{KubeConfigOptions, Kubeconfig};

pub const K8S_VERSION: &str = "1.31.4";
pub const TOKEN: &str = "proxima-test-token";
const PROVISION: &str = "tests/k8s/provision.sh";
const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// Paths of the control-plane binaries.
#[derive(Clone, Debug)]
pub struct Binaries {
    pub etcd: PathBuf,
    pub kube_apiserver: PathBuf,
    pub kubectl: PathBuf,
}

/// Find the binaries, or panic naming the provision script.
pub fn binaries() -> Binaries {
    let binaries = find_binaries().unwrap_or_else(|e| panic!("{e}"));
    if let Err(e) = present(&binaries.kubectl, "PROXIMA_KUBECTL") {
        panic!("{e}");
    }
    binaries
}

/// Find etcd and kube-apiserver (what [`Cluster::launch`] needs), or say which is
/// missing and how to get it. `kubectl` is where it would be, not checked.
pub fn find_binaries() -> Result<Binaries, String> {
    let cache = std::env::var_os("PROXIMA_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/proxima")))
        .unwrap_or_else(|| PathBuf::from(".cache/proxima"));
    let path =
        |var: &str, default: PathBuf| std::env::var_os(var).map(PathBuf::from).unwrap_or(default);
    let binaries = Binaries {
        etcd: path("PROXIMA_ETCD", PathBuf::from("/usr/bin/etcd")),
        kube_apiserver: path(
            "PROXIMA_KUBE_APISERVER",
            cache.join(format!("kube-apiserver-v{K8S_VERSION}")),
        ),
        kubectl: path(
            "PROXIMA_KUBECTL",
            cache.join(format!("kubectl-v{K8S_VERSION}")),
        ),
    };
    present(&binaries.etcd, "PROXIMA_ETCD")?;
    present(&binaries.kube_apiserver, "PROXIMA_KUBE_APISERVER")?;
    Ok(binaries)
}

fn present(path: &Path, var: &str) -> Result<(), String> {
    if path.is_file() {
        Ok(())
    } else {
        Err(format!(
            "{} not found (set {var} or run {PROVISION} first: it installs etcd and builds \
             kube-apiserver and kubectl v{K8S_VERSION})",
            path.display()
        ))
    }
}

/// A running etcd and kube-apiserver. Dropping it kills both and deletes its directory.
pub struct Cluster {
    binaries: Binaries,
    dir: PathBuf,
    etcd: Child,
    etcd_port: u16,
    apiserver: Option<Child>,
    api_port: u16,
    kubeconfig: PathBuf,
}

impl Cluster {
    /// Start etcd and kube-apiserver and wait until the API server is ready and the
    /// `default` namespace exists.
    pub async fn start() -> Cluster {
        binaries();
        Self::launch().await.unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Cluster::start`] for callers that handle the error (the testbed's `--kube`):
    /// what is missing or why the control plane did not come up.
    pub async fn launch() -> Result<Cluster, String> {
        let binaries = find_binaries()?;
        let mut last_error = String::new();
        // Free ports are found by binding port 0 and letting go; another process may
        // take one in between, so a failed start is retried on fresh ports.
        for _ in 0..3 {
            match Self::try_start(binaries.clone()).await {
                Ok(cluster) => return Ok(cluster),
                Err(e) => last_error = e,
            }
        }
        Err(format!(
            "cannot start a Kubernetes control plane: {last_error}"
        ))
    }

    async fn try_start(binaries: Binaries) -> Result<Cluster, String> {
        let dir = unique_dir();
        fs::create_dir_all(dir.join("certs")).map_err(|e| e.to_string())?;
        write_credentials(&dir)?;
        let etcd_port = try_free_port()?;
        let peer_port = try_free_port()?;
        let etcd = spawn_logged(
            Command::new(&binaries.etcd).args([
                "--name=proxima-test".to_string(),
                format!("--data-dir={}", dir.join("etcd").display()),
                format!("--listen-client-urls=http://127.0.0.1:{etcd_port}"),
                format!("--advertise-client-urls=http://127.0.0.1:{etcd_port}"),
                format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"),
                format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"),
                format!("--initial-cluster=proxima-test=http://127.0.0.1:{peer_port}"),
            ]),
            &dir.join("etcd.log"),
        )?;
        let api_port = try_free_port()?;
        let kubeconfig = dir.join("kubeconfig");
        let mut cluster = Cluster {
            binaries,
            dir,
            etcd,
            etcd_port,
            apiserver: None,
            api_port,
            kubeconfig,
        };
        cluster.wait_for_etcd().await?;
        cluster.spawn_apiserver()?;
        cluster.wait_for_certificate().await?;
        cluster.write_kubeconfig()?;
        cluster.wait_until_ready().await?;
        Ok(cluster)
    }

    /// `https://127.0.0.1:PORT`.
    pub fn server(&self) -> String {
        format!("https://127.0.0.1:{}", self.api_port)
    }

    pub fn api_port(&self) -> u16 {
        self.api_port
    }

    pub fn token(&self) -> &str {
        TOKEN
    }

    /// A kubeconfig for the cluster (bearer token; trusts the API server's self-generated
    /// certificate, which is valid for 127.0.0.1).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn binaries(&self) -> &Binaries {
        &self.binaries
    }

    /// A kube-rs client built from [`Cluster::kubeconfig`].
    pub async fn client(&self) -> kube::Client {
        self.try_client().await.unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Cluster::client`], or why it cannot be built.
    pub async fn try_client(&self) -> Result<kube::Client, String> {
        let file = Kubeconfig::read_from(&self.kubeconfig)
            .map_err(|e| format!("cannot read the test kubeconfig: {e}"))?;
        let config = kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
            .await
            .map_err(|e| format!("invalid test kubeconfig: {e}"))?;
        kube::Client::try_from(config).map_err(|e| format!("cannot build a kube client: {e}"))
    }

    /// `kubectl --kubeconfig <this cluster's>`; add arguments and run it.
    pub fn kubectl(&self) -> Command {
        let mut command = Command::new(&self.binaries.kubectl);
        command.arg("--kubeconfig").arg(&self.kubeconfig);
        command
    }

    /// Kill the API server (etcd keeps the data), as if it crashed.
    pub fn stop_apiserver(&mut self) {
        if let Some(mut child) = self.apiserver.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Start the API server again on the same port with the same etcd and certificates,
    /// and wait until it is ready.
    pub async fn start_apiserver(&mut self) {
        assert!(
            self.apiserver.is_none(),
            "the API server is already running"
        );
        let result = match self.spawn_apiserver() {
            Ok(()) => self.wait_until_ready().await,
            Err(e) => Err(e),
        };
        if let Err(e) = result {
            panic!("cannot restart kube-apiserver: {e}");
        }
    }

    pub fn apiserver_running(&self) -> bool {
        self.apiserver.is_some()
    }

    /// The last lines of the API server's log, for failure messages.
    pub fn apiserver_log_tail(&self) -> String {
        log_tail(&self.dir.join("kube-apiserver.log"), 40)
    }

    fn spawn_apiserver(&mut self) -> Result<(), String> {
        let dir = &self.dir;
        let child = spawn_logged(
            Command::new(&self.binaries.kube_apiserver).args([
                format!("--etcd-servers=http://127.0.0.1:{}", self.etcd_port),
                "--bind-address=127.0.0.1".to_string(),
                "--advertise-address=127.0.0.1".to_string(),
                format!("--secure-port={}", self.api_port),
                format!("--cert-dir={}", dir.join("certs").display()),
                format!("--token-auth-file={}", dir.join("tokens.csv").display()),
                format!(
                    "--service-account-key-file={}",
                    dir.join("sa.pub").display()
                ),
                format!(
                    "--service-account-signing-key-file={}",
                    dir.join("sa.key").display()
                ),
                "--service-account-issuer=https://kubernetes.default.svc".to_string(),
                "--authorization-mode=RBAC".to_string(),
                "--service-cluster-ip-range=10.96.0.0/16".to_string(),
                "--profiling=false".to_string(),
            ]),
            &dir.join("kube-apiserver.log"),
        )?;
        self.apiserver = Some(child);
        Ok(())
    }

    fn write_kubeconfig(&self) -> Result<(), String> {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: proxima-test\n  cluster:\n    server: {server}\n    \
             certificate-authority: {ca}\nusers:\n- name: admin\n  user:\n    token: {TOKEN}\ncontexts:\n- name: \
             proxima-test\n  context:\n    cluster: proxima-test\n    user: admin\ncurrent-context: proxima-test\n",
            server = self.server(),
            ca = self.certificate().display(),
        );
        fs::write(&self.kubeconfig, text).map_err(|e| e.to_string())
    }

    /// The API server's self-generated serving certificate and its CA.
    pub fn certificate(&self) -> PathBuf {
        self.dir.join("certs").join("apiserver.crt")
    }

    /// The API server writes its self-signed certificate into `--cert-dir` at start (and
    /// reuses it on restart).
    async fn wait_for_certificate(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        // The file holds the serving certificate and then its CA; both must be there.
        let complete = |path: &Path| {
            fs::read_to_string(path)
                .is_ok_and(|pem| pem.matches("-----END CERTIFICATE-----").count() >= 2)
        };
        while !complete(&self.certificate()) {
            if let Some(child) = &mut self.apiserver {
                if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
                    self.apiserver = None;
                    return Err(format!(
                        "kube-apiserver exited ({status}):\n{}",
                        self.apiserver_log_tail()
                    ));
                }
            }
            if Instant::now() > deadline {
                return Err("kube-apiserver wrote no certificate in time".into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    async fn wait_for_etcd(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = self.etcd.try_wait().map_err(|e| e.to_string())? {
                return Err(format!(
                    "etcd exited ({status}):\n{}",
                    log_tail(&self.dir.join("etcd.log"), 20)
                ));
            }
            if TcpStream::connect(("127.0.0.1", self.etcd_port)).is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err("etcd did not listen in time".into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn wait_until_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let client = self.try_client().await?;
        let mut last;
        loop {
            if let Some(child) = &mut self.apiserver {
                if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
                    self.apiserver = None;
                    return Err(format!(
                        "kube-apiserver exited ({status}):\n{}",
                        self.apiserver_log_tail()
                    ));
                }
            }
            let readyz = http::Request::get("/readyz")
                .body(Vec::new())
                .map_err(|e| e.to_string())?;
            match client.request_text(readyz).await {
                Ok(body) if body.trim() == "ok" => {
                    // The default namespace is made by a bootstrap controller shortly
                    // after the server turns ready.
                    let ns = http::Request::get("/api/v1/namespaces/default")
                        .body(Vec::new())
                        .map_err(|e| e.to_string())?;
                    match client.request_text(ns).await {
                        Ok(_) => return Ok(()),
                        Err(e) => last = e.to_string(),
                    }
                }
                Ok(body) => last = body,
                Err(e) => last = e.to_string(),
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "kube-apiserver not ready after {READY_TIMEOUT:?} (last: {last}):\n{}",
                    self.apiserver_log_tail()
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop_apiserver();
        let _ = self.etcd.kill();
        let _ = self.etcd.wait();
        if std::env::var_os("PROXIMA_KEEP_K8S_DIR").is_none() {
            let _ = fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("kept Kubernetes test directory {}", self.dir.display());
        }
    }
}

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    try_free_port().unwrap_or_else(|e| panic!("{e}"))
}

fn try_free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("cannot bind an ephemeral loopback port: {e}"))
}

fn unique_dir() -> PathBuf {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    std::env::temp_dir().join(format!(
        "proxima-k8s-{}-{}-{nanos:x}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
}

/// The token file and the service-account key pair (made with openssl).
fn write_credentials(dir: &Path) -> Result<(), String> {
    fs::write(
        dir.join("tokens.csv"),
        format!("{TOKEN},admin,admin,system:masters\n"),
    )
    .map_err(|e| e.to_string())?;
    let key = dir.join("sa.key");
    run(Command::new("openssl")
        .arg("genrsa")
        .arg("-out")
        .arg(&key)
        .arg("2048"))?;
    run(Command::new("openssl")
        .arg("rsa")
        .arg("-in")
        .arg(&key)
        .arg("-pubout")
        .arg("-out")
        .arg(dir.join("sa.pub")))
}

fn run(command: &mut Command) -> Result<(), String> {
    let output = command
        .output()
        .map_err(|e| format!("cannot run {command:?}: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{command:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

fn spawn_logged(command: &mut Command, log: &Path) -> Result<Child, String> {
    let file = fs::File::create(log).map_err(|e| e.to_string())?;
    let err = file.try_clone().map_err(|e| e.to_string())?;
    command
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("cannot start {command:?}: {e}"))
}

fn log_tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
