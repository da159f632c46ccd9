//! Helpers for the data-plane tests: a proxy on a real loopback socket with its router
//! built directly (no discovery), emulated backends, a backend that resets every
//! connection, and real HTTP clients (hyper, raw TCP, curl).
#![allow(dead_code)]

use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode, Version};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client as LegacyClient;
use hyper_util::rt::TokioExecutor;
use proxima_core::{
    Conditions, Endpoint, EndpointPort, Hints, Router, ServiceKey, ServicePort, ServiceSettings,
    ServiceSpec, Update,
};
use proxima_proxy::prometheus::{Encoder, Registry, TextEncoder};
use proxima_proxy::{run_prober, serve, Metrics, Proxy, ProxyConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use proxima_emulate::{Backend, BackendConfig};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// Body type of test requests: whole or streamed.
pub type Body = BoxBody<Bytes, BoxError>;
pub type Client = LegacyClient<HttpConnector, Body>;

/// Longest any single test step may take before the test fails instead of hanging.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// Fail instead of hanging.
pub async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(PATIENCE, fut).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: no result within {PATIENCE:?}"),
    }
}

/// Poll `check` until it holds, or fail after `limit`.
pub async fn eventually(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check() {
        assert!(
            Instant::now() < deadline,
            "{what}: not true within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub fn loopback() -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0)
}

/// An emulated pod named `name` answering without delay.
pub async fn backend(name: &str) -> Backend {
    backend_with(BackendConfig::new(name)).await
}

pub async fn backend_with(config: BackendConfig) -> Backend {
    Backend::spawn(loopback(), config)
        .await
        .expect("emulated backend starts")
}

/// A loopback address nothing listens on (connections are refused).
pub async fn dead_addr() -> SocketAddr {
    let listener = TcpListener::bind(loopback()).await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    addr
}

/// A Service with named ports and settings given as `key = value` pairs.
pub fn service(
    namespace: &str,
    name: &str,
    ports: &[(&str, u16)],
    settings: &[(&str, &str)],
) -> ServiceSpec {
    let (settings, errors) = ServiceSettings::from_pairs(settings.iter().copied());
    assert!(errors.is_empty(), "test settings rejected: {errors:?}");
    ServiceSpec::new(
        ServiceKey::new(namespace, name),
        ports
            .iter()
            .map(|(name, port)| ServicePort {
                name: name.to_string(),
                port: *port,
                app_protocol: None,
            })
            .collect(),
        settings,
    )
}

/// A ready endpoint with one unnamed port.
pub fn endpoint(id: &str, addr: SocketAddr) -> Endpoint {
    Endpoint::new(id, addr)
}

/// A ready endpoint on loopback with named ports.
pub fn endpoint_ports(id: &str, ports: &[(&str, u16)]) -> Endpoint {
    Endpoint {
        id: id.to_string(),
        ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
        ports: ports
            .iter()
            .map(|(name, port)| EndpointPort {
                name: name.to_string(),
                port: *port,
                app_protocol: None,
            })
            .collect(),
        node: None,
        zone: None,
        conditions: Conditions::default(),
        hints: Hints::default(),
    }
}

/// A proxy serving on a loopback port, with its prober running.
pub struct TestProxy {
    pub router: Arc<Router>,
    pub registry: Registry,
    pub proxy: Arc<Proxy>,
    pub addr: SocketAddr,
    stop: watch::Sender<bool>,
    server: Option<JoinHandle<io::Result<()>>>,
    prober: Option<JoinHandle<()>>,
}

async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

impl TestProxy {
    pub async fn start(services: Vec<(ServiceSpec, Vec<Endpoint>)>) -> Self {
        Self::start_with(ProxyConfig::default(), services).await
    }

    /// A proxy with `config` for one service, `api.shop`, of one pod `id` at `addr`.
    pub async fn one_pod(config: ProxyConfig, id: &str, addr: SocketAddr) -> Self {
        Self::start_with(
            config,
            vec![(service("shop", "api", &[], &[]), vec![endpoint(id, addr)])],
        )
        .await
    }

    pub async fn start_with(
        config: ProxyConfig,
        services: Vec<(ServiceSpec, Vec<Endpoint>)>,
    ) -> Self {
        let router = Arc::new(Router::new(Some("node-a".to_string())));
        let report = router.apply(
            [Update::Reset {
                nodes: vec![],
                services,
            }],
            Instant::now(),
        );
        assert!(report.warnings.is_empty(), "{:?}", report.warnings);
        let registry = Registry::new();
        let metrics = Arc::new(Metrics::new(&registry).expect("metrics register"));
        let proxy = Proxy::new(router.clone(), metrics, config);
        let listener = TcpListener::bind(loopback()).await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy addr");
        let (stop, rx) = watch::channel(false);
        let server = tokio::spawn(serve(proxy.clone(), listener, stopped(rx.clone())));
        let prober = tokio::spawn(run_prober(proxy.clone(), stopped(rx)));
        Self {
            router,
            registry,
            proxy,
            addr,
            stop,
            server: Some(server),
            prober: Some(prober),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// The metrics in the Prometheus text format.
    pub fn metrics_text(&self) -> String {
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("encode metrics");
        String::from_utf8(out).expect("metrics are UTF-8")
    }

    /// The value of one series, written as in the text format
    /// (`name{label="v",...}` with labels in alphabetical order); 0 when absent.
    pub fn metric(&self, series: &str) -> f64 {
        self.metrics_text()
            .lines()
            .find_map(|line| {
                let (name, value) = line.rsplit_once(' ')?;
                (name == series).then(|| value.parse().expect("metric value"))
            })
            .unwrap_or(0.0)
    }

    /// Signal shutdown to the server and the prober.
    pub fn begin_shutdown(&self) {
        let _ = self.stop.send(true);
    }

    /// Wait for `serve` to return.
    pub async fn server_stopped(&mut self) -> io::Result<()> {
        match self.server.take() {
            Some(server) => server.await.expect("serve task"),
            None => Ok(()),
        }
    }
}

impl Drop for TestProxy {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(server) = &self.server {
            server.abort();
        }
        if let Some(prober) = &self.prober {
            prober.abort();
        }
    }
}

/// A backend that reads each request's headers and then resets the connection
/// (`SO_LINGER` 0), without any response.
pub struct Resetter {
    pub addr: SocketAddr,
    hits: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl Resetter {
    pub async fn spawn() -> Self {
        let listener = TcpListener::bind(loopback()).await.expect("bind resetter");
        let addr = listener.local_addr().expect("addr");
        let hits = Arc::new(AtomicU64::new(0));
        let counter = hits.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let counter = counter.clone();
                tokio::spawn(async move {
                    let mut seen = Vec::new();
                    let mut buf = [0u8; 4096];
                    loop {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => seen.extend_from_slice(&buf[..n]),
                        }
                        if seen.windows(4).any(|w| w == b"\r\n\r\n") {
                            break;
                        }
                    }
                    counter.fetch_add(1, Ordering::SeqCst);
                    let _ = stream.set_zero_linger();
                    drop(stream);
                });
            }
        });
        Self { addr, hits, task }
    }

    /// Requests whose headers arrived.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::SeqCst)
    }
}

impl Drop for Resetter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An HTTP/1.1 client.
pub fn http1_client() -> Client {
    LegacyClient::builder(TokioExecutor::new()).build_http()
}

/// An HTTP/2 client with prior knowledge (h2c).
pub fn h2c_client() -> Client {
    LegacyClient::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http()
}

pub fn full(data: impl Into<Bytes>) -> Body {
    Full::new(data.into())
        .map_err(|never| match never {})
        .boxed()
}

pub fn empty() -> Body {
    full(Bytes::new())
}

/// A response read to the end.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub version: Version,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "body is not JSON ({e}): {:?}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The `x-backend` header set by emulated backends.
    pub fn backend(&self) -> &str {
        self.header("x-backend").unwrap_or("")
    }

    /// A header the backend saw, from its JSON echo.
    pub fn echoed_header(&self, name: &str) -> Option<String> {
        self.json()["headers"][name].as_str().map(str::to_string)
    }

    /// Assert a proxy error answer: status, JSON shape and `error` text.
    pub fn assert_error(&self, status: StatusCode, error: &str) {
        assert_eq!(
            self.status,
            status,
            "body: {:?}",
            String::from_utf8_lossy(&self.body)
        );
        assert_eq!(self.header("content-type"), Some("application/json"));
        let json = self.json();
        let object = json.as_object().expect("error body is an object");
        let mut keys: Vec<_> = object.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["detail", "error", "service"], "{json}");
        assert_eq!(json["error"], error, "{json}");
        assert!(
            json["service"].is_string() && json["detail"].is_string(),
            "{json}"
        );
    }
}

/// Send a request and read the whole response.
pub async fn send(client: &Client, req: Request<Body>) -> Reply {
    within("request", async {
        let response = client.request(req).await.expect("response");
        let (parts, body) = response.into_parts();
        let body = body.collect().await.expect("response body").to_bytes();
        Reply {
            status: parts.status,
            version: parts.version,
            headers: parts.headers,
            body,
        }
    })
    .await
}

/// `GET url` with extra headers.
pub async fn get(client: &Client, url: &str, headers: &[(&str, &str)]) -> Reply {
    let mut req = Request::get(url);
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    send(client, req.body(empty()).expect("request")).await
}

/// Write raw bytes to `addr` and read until the server closes the connection. A server
/// that stops reading early may reset the connection; whatever arrived is returned.
pub async fn raw_exchange(addr: SocketAddr, request: &[u8]) -> String {
    within("raw exchange", async {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        let _ = stream.write_all(request).await;
        let mut out = Vec::new();
        let _ = stream.read_to_end(&mut out).await;
        String::from_utf8_lossy(&out).into_owned()
    })
    .await
}

/// Run curl with `args`; returns (exit ok, stdout).
pub async fn curl(args: Vec<String>) -> (bool, String) {
    within("curl", async {
        let out = tokio::task::spawn_blocking(move || {
            std::process::Command::new("curl")
                .args(["--silent", "--show-error", "--max-time", "30"])
                .args(&args)
                .output()
        })
        .await
        .expect("curl task")
        .expect("curl runs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    })
    .await
}

/// FNV-1a over a byte stream, for comparing large bodies without keeping them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Checksum(u64);

impl Default for Checksum {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Checksum {
    pub fn update(&mut self, data: &[u8]) {
        for &b in data {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

/// `len` bytes of the emulated backends' stream pattern starting at `offset`.
pub fn pattern(offset: u64, len: usize) -> Vec<u8> {
    proxima_emulate::pattern_bytes(offset, len)
}
