//! Shared harness of the tests that run the `proxima` binary: the binary as a child
//! process with captured logs, a temp dir, an HTTP client and emulated pods.
//! Included with `#[path = "support/binary.rs"] mod binary;`.
#![allow(dead_code)] // each test file uses a different part of it

use std::io::{BufRead, BufReader};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use proxima_emulate::{Backend, BackendConfig};

pub const PATIENCE: Duration = Duration::from_secs(60);

pub fn binary() -> PathBuf {
    // target/<profile>/deps/<this test> -> target/<profile>/proxima
    let exe = std::env::current_exe().expect("test executable path");
    let path = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .join("proxima");
    assert!(
        path.exists(),
        "{} is missing: run `cargo build -p proxima` first",
        path.display()
    );
    path
}

pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "proxima-suite-{tag}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running `proxima` with its stderr and stdout collected line by line.
pub struct Proxima {
    pub child: Child,
    pub log: Arc<Mutex<Vec<String>>>,
    pub out: Arc<Mutex<Vec<String>>>,
    pub proxy: SocketAddr,
    pub admin: SocketAddr,
}

pub fn collect(stream: impl std::io::Read + Send + 'static) -> Arc<Mutex<Vec<String>>> {
    let lines = Arc::new(Mutex::new(Vec::new()));
    std::thread::spawn({
        let lines = lines.clone();
        move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                lines.lock().unwrap().push(line);
            }
        }
    });
    lines
}

impl Proxima {
    /// Start `proxima <args> --listen 127.0.0.1:0 --admin 127.0.0.1:0` and wait until it
    /// says it is ready (and on which ports).
    pub async fn start(args: &[&str]) -> Self {
        Self::start_with(args, &[]).await
    }

    pub async fn start_with(args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::start_under(&[], args, env).await
    }

    /// [`start_with`](Self::start_with), run by `wrapper` (a command and its arguments
    /// that end by running the binary, e.g. `prlimit --nofile=160 --`).
    pub async fn start_under(wrapper: &[&str], args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut command = match wrapper.split_first() {
            Some((program, rest)) => {
                let mut command = Command::new(program);
                command.args(rest).arg(binary());
                command
            }
            None => Command::new(binary()),
        };
        let mut child = command
            .args(args)
            .args(["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("proxima starts");
        let log = collect(child.stderr.take().expect("stderr"));
        let out = collect(child.stdout.take().expect("stdout"));
        let mut proxima = Self {
            child,
            log,
            out,
            proxy: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
            admin: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
        };
        let ready = proxima.wait_log("proxima is ready").await;
        proxima.proxy = field(&ready, "proxy");
        proxima.admin = field(&ready, "admin");
        proxima
    }

    pub fn logs(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// The first log line containing `needle`.
    pub async fn wait_log(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(line) = self.log.lock().unwrap().iter().find(|l| l.contains(needle)) {
                return line.clone();
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                // Let the reader thread drain what is left.
                tokio::time::sleep(Duration::from_millis(200)).await;
                panic!(
                    "proxima exited ({status}) before logging {needle:?}:\n{}",
                    self.logs()
                );
            }
            assert!(
                Instant::now() < deadline,
                "no log line with {needle:?} within {PATIENCE:?}:\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([format!("-{name}"), self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{name} failed");
    }

    pub async fn wait_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "proxima did not exit:\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Proxima {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `proxy=127.0.0.1:1234` in a text log line, `"proxy":"127.0.0.1:1234"` in a JSON one.
pub fn field(line: &str, name: &str) -> SocketAddr {
    let text = format!("{name}=");
    let json = format!("\"{name}\":\"");
    line.split_whitespace()
        .find_map(|word| word.strip_prefix(&text))
        .or_else(|| {
            let start = line.find(&json)? + json.len();
            line[start..].split('"').next()
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} address in {line:?}"))
}

pub type HttpClient = Client<HttpConnector, Empty<Bytes>>;

pub fn client() -> HttpClient {
    // Idle connections are let go before the admin server's 10 s header-read timeout
    // closes them: reusing one just as the server closes it fails the request.
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(5))
        .build_http()
}

pub struct Reply {
    pub status: StatusCode,
    pub backend: Option<String>,
    pub body: String,
}

pub async fn get(client: &HttpClient, url: &str, service: Option<&str>) -> Reply {
    let mut request = Request::get(url);
    if let Some(service) = service {
        request = request.header("x-service", service);
    }
    let request = request.body(Empty::new()).expect("request");
    let response = tokio::time::timeout(PATIENCE, client.request(request))
        .await
        .unwrap_or_else(|_| panic!("no answer from {url}"))
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let status = response.status();
    let backend = response
        .headers()
        .get("x-backend")
        .map(|v| v.to_str().expect("ascii").to_string());
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    Reply {
        status,
        backend,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// Poll `check` until it returns `Some`, or fail after [`PATIENCE`].
pub async fn eventually<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    mut check: impl FnMut() -> F,
) -> T {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {PATIENCE:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub async fn backend(name: &str) -> Backend {
    Backend::spawn(
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
        BackendConfig::new(name),
    )
    .await
    .expect("emulated pod starts")
}
