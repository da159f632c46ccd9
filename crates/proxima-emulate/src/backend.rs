//! An emulated pod: an HTTP/1.1 and h2c server with a live-adjustable processing time,
//! which also answers gRPC calls and, if asked to, WebSockets (so that the testbed's QoS results can
//! be checked for them too).
//!
//! The QoS-pool strategy (papers, "QoS pool" section) admits a pod when its
//! measured response times predict it meets the Service's latency SLO. To
//! exercise that logic with real traffic, each [`Backend`] holds every
//! request for `delay + U(0, jitter) + processing` before it sends the response
//! headers, where `processing` is drawn from a [`ProcessingTime`] distribution
//! (seeded, so that runs repeat); [`Backend::set_delay`] changes the fixed part
//! while the server runs, which is how tests, the demo and the testbed emulate a
//! pod becoming overloaded and recovering.
//!
//! Capacity: by default every request is processed at once, however many arrive.
//! With `workers` a pod processes at most that many at a time, and with a shared
//! [`Cpu`] the pods of one node hold one of its cores while processing; requests
//! beyond either limit wait in arrival order, as on a busy node.
//!
//! Failing fast: [`Backend::set_failing`] makes the pod answer every request at once
//! with a given status (e.g. `500`), without its processing time, as a pod whose
//! dependency is down does; `None` brings the normal answers back.
//!
//! Routes (any method unless noted):
//! - a gRPC call (`content-type: application/grpc...`, any path) gets its first
//!   message echoed back with `grpc-status: 0` in the trailers; while failing, a
//!   Trailers-Only `grpc-status: 14` (UNAVAILABLE) instead of the failure status, as a
//!   gRPC server whose dependency is down answers (`backend/grpc.rs`);
//! - with [`BackendConfig::websockets`], a WebSocket handshake (`GET` with
//!   `Upgrade: websocket`, any path) is answered `101` after the processing time, as
//!   any request; then every text or binary message is echoed after a processing time
//!   of its own, so that per-message latency reflects the pod (`backend/websocket.rs`).
//!   Without it the pod is a plain HTTP server that ignores `Upgrade` (RFC 9110 §7.8
//!   allows it), which the proxy's tests of declined upgrades rely on;
//! - `/status/NNN` answers with status `NNN` (and the JSON echo as body);
//! - `/stream?bytes=N[&chunk=K]` streams `N` bytes of [`crate::pattern_byte`]
//!   in chunks of `K` bytes (default 16 KiB), with chunked transfer encoding;
//! - `POST /echo` streams the request body back unchanged, frame by frame;
//! - `/reset` closes the connection without any response;
//! - `/headers` answers 201 with hop-by-hop headers a proxy must drop
//!   (`connection: x-drop-me`, `x-drop-me`, `keep-alive`) and `x-custom: kept`;
//! - anything else answers 200 with a JSON echo of the request
//!   (`backend`, `method`, `path`, `query`, `headers`, `body_bytes`); the body
//!   is read to the end and counted, never stored.
//!
//! Every response carries `x-backend: <name>` (a `101` included).

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use http::{Method, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Incoming;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::task::{AbortHandle, JoinHandle, JoinSet};

use crate::pattern::pattern_bytes;
use crate::processing::{Cpu, ProcessingTime};

mod grpc;
mod websocket;

/// Error type of response bodies (request bodies echoed back can fail mid-stream).
type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// The body type of every response.
type ResponseBody = BoxBody<Bytes, BoxError>;

/// How long a graceful [`Backend::shutdown`] waits for in-flight requests.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// How long [`Backend::spawn`] retries a bind that fails with `AddrInUse`:
/// an aborted backend releases its port asynchronously, and restarting a
/// pod on the same address right after [`Backend::abort`] must still work.
const REBIND_PATIENCE: Duration = Duration::from_secs(3);
/// Default chunk size of `/stream`.
const DEFAULT_STREAM_CHUNK: usize = 16 * 1024;
/// Largest chunk size `/stream` accepts.
const MAX_STREAM_CHUNK: usize = 1024 * 1024;

/// Configuration of an emulated pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendConfig {
    /// Sent back in the `x-backend` header and the JSON echo.
    pub name: String,
    /// Fixed processing time before the response headers.
    pub delay: Duration,
    /// Uniformly distributed extra processing time in `0..=jitter`.
    pub jitter: Duration,
    /// Processing time drawn per request, added to `delay` and the jitter.
    pub processing: ProcessingTime,
    /// Seed of the draws (jitter and `processing`); `None` seeds from entropy.
    pub seed: Option<u64>,
    /// Requests processed at once; more wait in arrival order. `None`: no limit.
    pub workers: Option<usize>,
    /// The node's cores, shared with its other pods: a request holds one while it is
    /// processed. `None`: unlimited.
    pub cpu: Option<Cpu>,
    /// Whether WebSocket handshakes are accepted (and messages echoed); otherwise
    /// `Upgrade` is ignored and the request answered as any other.
    pub websockets: bool,
}

impl BackendConfig {
    /// A backend called `name` that answers without delay.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            delay: Duration::ZERO,
            jitter: Duration::ZERO,
            processing: ProcessingTime::default(),
            seed: None,
            workers: None,
            cpu: None,
            websockets: false,
        }
    }

    /// Sets the fixed processing time.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// Sets the maximum uniform extra processing time.
    pub fn jitter(mut self, jitter: Duration) -> Self {
        self.jitter = jitter;
        self
    }

    /// Sets the distribution of the per-request processing time.
    pub fn processing(mut self, processing: ProcessingTime) -> Self {
        self.processing = processing;
        self
    }

    /// Seeds the draws, so that the same requests get the same processing times.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Processes at most `workers` requests at once (at least one).
    pub fn workers(mut self, workers: usize) -> Self {
        self.workers = Some(workers.max(1));
        self
    }

    /// Processes on the shared cores of `cpu`.
    pub fn cpu(mut self, cpu: Cpu) -> Self {
        self.cpu = Some(cpu);
        self
    }

    /// Accepts WebSockets (see the module docs).
    pub fn websockets(mut self, websockets: bool) -> Self {
        self.websockets = websockets;
        self
    }
}

/// Why a request gets no response; hyper then closes the connection.
#[derive(Debug, thiserror::Error)]
enum NoResponse {
    #[error("reset requested by the client (/reset)")]
    ResetRequested,
    #[error("backend aborted")]
    Aborted,
    #[error("reading the request body failed: {0}")]
    BodyRead(#[from] hyper::Error),
}

/// State shared by the handle, the accept loop and every request.
#[derive(Debug)]
struct Shared {
    name: String,
    name_header: HeaderValue,
    delay_nanos: AtomicU64,
    jitter_nanos: AtomicU64,
    /// The distribution and the generator its draws (and the jitter's) come from.
    draws: std::sync::Mutex<(ProcessingTime, SmallRng)>,
    workers: Option<Semaphore>,
    cpu: Option<Cpu>,
    hits: AtomicU64,
    /// Of `hits`, the proxy's background probes (marked `x-proxima-probe`).
    probe_hits: AtomicU64,
    /// Connections accepted so far.
    connections: AtomicU64,
    aborted: AtomicBool,
    /// The status every request gets at once while failing; 0 when not failing.
    failing: AtomicU16,
    /// Turns `true` when the pod stops or is killed: its WebSocket sessions, which
    /// outlive their HTTP connection's task, end then.
    sessions_end: watch::Sender<bool>,
    /// [`BackendConfig::websockets`].
    websockets: bool,
}

impl Shared {
    fn processing_time(&self) -> Duration {
        let delay = self.delay_nanos.load(Ordering::Relaxed);
        let jitter = self.jitter_nanos.load(Ordering::Relaxed);
        let mut draws = self.draws.lock().unwrap_or_else(|e| e.into_inner());
        let (distribution, rng) = &mut *draws;
        let extra = if jitter == 0 {
            0
        } else {
            rng.gen_range(0..=jitter)
        };
        let drawn = duration_nanos(distribution.sample(rng));
        Duration::from_nanos(delay.saturating_add(extra).saturating_add(drawn))
    }

    /// Wait for a worker and a core (in that order, so that no two requests wait on each
    /// other), hold them for `processing`, then let them go.
    async fn process(&self, processing: Duration) {
        // The semaphore is never closed, so acquiring only waits.
        let _worker = match &self.workers {
            Some(workers) => workers.acquire().await.ok(),
            None => None,
        };
        let _core = match &self.cpu {
            Some(cpu) => Some(cpu.acquire().await),
            None => None,
        };
        // The precise timer: tokio's would add about a millisecond to every request.
        crate::timer::sleep(processing).await;
    }

    fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::SeqCst)
    }

    /// The status the pod is failing with, if it is.
    fn failing(&self) -> Option<StatusCode> {
        StatusCode::from_u16(self.failing.load(Ordering::Relaxed)).ok()
    }
}

fn duration_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A running emulated pod. Dropping it aborts it (see [`Backend::abort`]).
#[derive(Debug)]
pub struct Backend {
    shared: Arc<Shared>,
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
    abort_handle: AbortHandle,
}

impl Backend {
    /// Binds `listen` (port 0 picks a free port) and serves HTTP/1.1 with keep-alive
    /// and h2c on the same port, in a background task.
    pub async fn spawn(listen: SocketAddr, config: BackendConfig) -> io::Result<Backend> {
        let listener = bind_with_patience(listen).await?;
        let addr = listener.local_addr()?;
        let name_header = HeaderValue::from_str(&config.name)
            .unwrap_or_else(|_| HeaderValue::from_static("unnamed"));
        let rng = match config.seed {
            Some(seed) => SmallRng::seed_from_u64(seed),
            None => SmallRng::from_entropy(),
        };
        let shared = Arc::new(Shared {
            name: config.name,
            name_header,
            delay_nanos: AtomicU64::new(duration_nanos(config.delay)),
            jitter_nanos: AtomicU64::new(duration_nanos(config.jitter)),
            draws: std::sync::Mutex::new((config.processing, rng)),
            workers: config.workers.map(|n| Semaphore::new(n.max(1))),
            cpu: config.cpu,
            hits: AtomicU64::new(0),
            probe_hits: AtomicU64::new(0),
            connections: AtomicU64::new(0),
            aborted: AtomicBool::new(false),
            failing: AtomicU16::new(0),
            sessions_end: watch::channel(false).0,
            websockets: config.websockets,
        });
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(accept_loop(listener, shared.clone(), stop_rx));
        let abort_handle = task.abort_handle();
        Ok(Backend {
            shared,
            addr,
            stop,
            task: Some(task),
            abort_handle,
        })
    }

    /// The address the backend listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The backend's name (the `x-backend` header value).
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The current fixed processing time.
    pub fn delay(&self) -> Duration {
        Duration::from_nanos(self.shared.delay_nanos.load(Ordering::Relaxed))
    }

    /// Changes the fixed processing time of requests that arrive from now on.
    pub fn set_delay(&self, delay: Duration) {
        self.shared
            .delay_nanos
            .store(duration_nanos(delay), Ordering::Relaxed);
    }

    /// Changes the maximum uniform extra processing time.
    pub fn set_jitter(&self, jitter: Duration) {
        self.shared
            .jitter_nanos
            .store(duration_nanos(jitter), Ordering::Relaxed);
    }

    /// Changes the distribution of the per-request processing time.
    pub fn set_processing(&self, processing: ProcessingTime) {
        self.shared
            .draws
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0 = processing;
    }

    /// The current distribution of the per-request processing time.
    pub fn processing(&self) -> ProcessingTime {
        self.shared
            .draws
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0
    }

    /// Answer every request from now on at once with `status` (no processing time,
    /// any path), or normally again with `None`.
    pub fn set_failing(&self, status: Option<StatusCode>) {
        self.shared
            .failing
            .store(status.map_or(0, |s| s.as_u16()), Ordering::Relaxed);
    }

    /// The status the pod is failing with, if it is.
    pub fn failing(&self) -> Option<StatusCode> {
        self.shared.failing()
    }

    /// Whether [`Backend::abort`] killed it.
    pub fn aborted(&self) -> bool {
        self.shared.is_aborted()
    }

    /// Number of requests received so far (including `/reset`).
    pub fn hits(&self) -> u64 {
        self.shared.hits.load(Ordering::Relaxed)
    }

    /// Requests received so far that were not the proxy's background probes.
    pub fn client_hits(&self) -> u64 {
        self.hits() - self.shared.probe_hits.load(Ordering::Relaxed)
    }

    /// Number of connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.shared.connections.load(Ordering::Relaxed)
    }

    /// Stops accepting, lets in-flight requests finish (up to 5 s), closes
    /// idle keep-alive connections, and returns once the port is released.
    /// Open WebSockets are closed (with a Close frame) at once.
    pub async fn shutdown(mut self) {
        self.shared.sessions_end.send_replace(true);
        let _ = self.stop.send(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }

    /// Emulates `kill -9`: drops the listener and every open connection
    /// without answering in-flight requests. The sockets close as soon as
    /// the runtime cancels the server task (immediately on a multi-thread
    /// runtime, at the caller's next `.await` on a current-thread one);
    /// requests that race with the abort are refused, never answered.
    pub fn abort(&self) {
        self.shared.aborted.store(true, Ordering::SeqCst);
        self.abort_handle.abort();
        // Upgraded connections (WebSockets) run in tasks of their own: drop them too.
        self.shared.sessions_end.send_replace(true);
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        if self.task.is_some() {
            self.abort();
        }
    }
}

async fn bind_with_patience(listen: SocketAddr) -> io::Result<TcpListener> {
    let deadline = tokio::time::Instant::now() + REBIND_PATIENCE;
    loop {
        match TcpListener::bind(listen).await {
            Err(e)
                if e.kind() == io::ErrorKind::AddrInUse
                    && listen.port() != 0
                    && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            result => return result,
        }
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    if shared.is_aborted() {
                        continue;
                    }
                    shared.connections.fetch_add(1, Ordering::Relaxed);
                    connections.spawn(serve_connection(stream, shared.clone(), stop.clone()));
                }
                Err(error) => {
                    // Typically EMFILE: back off instead of spinning.
                    tracing::warn!(%error, backend = %shared.name, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            },
            _ = stopped(&mut stop) => break,
        }
        while connections.try_join_next().is_some() {}
    }
    drop(listener);
    let drain = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(DRAIN_TIMEOUT, drain).await.is_err() {
        connections.abort_all();
    }
}

/// Resolves once a stop is requested (or the handle is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    // The returned guard is not `Send`; drop it before the caller awaits more.
    let _ = stop.wait_for(|stopped| *stopped).await.map(|_| ());
}

async fn serve_connection(stream: TcpStream, shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let _ = stream.set_nodelay(true);
    let service = service_fn(move |request| handle(shared.clone(), request));
    // HTTP/1.1, and HTTP/2 with prior knowledge (h2c) on the same port, as many real
    // servers serve both (Go's h2c handler, tonic accepting HTTP/1.1): a pod emulates
    // either kind of port.
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().keep_alive(true);
    // Upgrades for WebSockets: the connection is handed to `websocket::accept`'s task.
    let connection = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
    tokio::pin!(connection);
    tokio::select! {
        result = connection.as_mut() => {
            if let Err(error) = result {
                tracing::debug!(%error, "backend connection ended");
            }
        }
        _ = stopped(&mut stop) => {
            connection.as_mut().graceful_shutdown();
            let _ = connection.await;
        }
    }
}

async fn handle(
    shared: Arc<Shared>,
    request: Request<Incoming>,
) -> Result<Response<ResponseBody>, NoResponse> {
    if request.headers().contains_key("x-proxima-probe") {
        shared.probe_hits.fetch_add(1, Ordering::Relaxed);
    }
    shared.hits.fetch_add(1, Ordering::Relaxed);
    if let Some(status) = shared.failing() {
        let mut response = match grpc::is_call(&request) {
            true => grpc::failing(status),
            false => plain(status, "failing (emulated)\n"),
        };
        response
            .headers_mut()
            .insert("x-backend", shared.name_header.clone());
        return Ok(response);
    }
    let processing = shared.processing_time();
    shared.process(processing).await;
    if shared.is_aborted() {
        return Err(NoResponse::Aborted);
    }
    let mut response = route(&shared, request).await?;
    response
        .headers_mut()
        .insert("x-backend", shared.name_header.clone());
    Ok(response)
}

async fn route(
    shared: &Arc<Shared>,
    request: Request<Incoming>,
) -> Result<Response<ResponseBody>, NoResponse> {
    if shared.websockets && websocket::is_handshake(&request) {
        return Ok(websocket::accept(shared.clone(), request));
    }
    if grpc::is_call(&request) {
        return grpc::echo(request).await;
    }
    let path = request.uri().path().to_string();
    if path == "/reset" {
        return Err(NoResponse::ResetRequested);
    }
    if path == "/echo" && request.method() == Method::POST {
        return Ok(echo_body(request));
    }
    if path == "/stream" {
        return Ok(stream_pattern(request.uri().query()));
    }
    if path == "/headers" {
        let mut response = json_echo(shared, request).await?;
        *response.status_mut() = StatusCode::CREATED;
        let headers = response.headers_mut();
        headers.insert(
            http::header::CONNECTION,
            HeaderValue::from_static("x-drop-me"),
        );
        headers.insert(
            HeaderName::from_static("x-drop-me"),
            HeaderValue::from_static("1"),
        );
        headers.insert(
            HeaderName::from_static("keep-alive"),
            HeaderValue::from_static("timeout=5"),
        );
        headers.insert(
            HeaderName::from_static("x-custom"),
            HeaderValue::from_static("kept"),
        );
        return Ok(response);
    }
    if let Some(code) = path.strip_prefix("/status/") {
        let Some(status) = code
            .parse::<u16>()
            .ok()
            .and_then(|code| StatusCode::from_u16(code).ok())
            .filter(|status| status.as_u16() >= 200)
        else {
            return Ok(plain(
                StatusCode::BAD_REQUEST,
                "expected /status/NNN with NNN in 200..=999\n",
            ));
        };
        if status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
            let mut response = empty();
            *response.status_mut() = status;
            return Ok(response);
        }
        let mut response = json_echo(shared, request).await?;
        *response.status_mut() = status;
        return Ok(response);
    }
    json_echo(shared, request).await
}

/// `POST /echo`: the request body goes back frame by frame as it arrives.
fn echo_body(request: Request<Incoming>) -> Response<ResponseBody> {
    let content_type = request.headers().get(CONTENT_TYPE).cloned();
    let body = request.into_body().map_err(BoxError::from).boxed();
    let mut response = Response::new(body);
    if let Some(content_type) = content_type {
        response.headers_mut().insert(CONTENT_TYPE, content_type);
    }
    response
}

/// `/stream?bytes=N[&chunk=K]`.
fn stream_pattern(query: Option<&str>) -> Response<ResponseBody> {
    let mut total: Option<u64> = None;
    let mut chunk = DEFAULT_STREAM_CHUNK;
    for (key, value) in query_pairs(query.unwrap_or("")) {
        match key {
            "bytes" => total = value.parse().ok(),
            "chunk" => match value.parse::<usize>() {
                Ok(size) => chunk = size.clamp(1, MAX_STREAM_CHUNK),
                Err(_) => return plain(StatusCode::BAD_REQUEST, "chunk must be a number\n"),
            },
            _ => {}
        }
    }
    let Some(total) = total else {
        return plain(StatusCode::BAD_REQUEST, "expected /stream?bytes=N\n");
    };
    // The pattern has period 26, so every chunk is a slice of one buffer.
    let period = pattern_bytes(0, chunk + 26);
    let template = Bytes::from(period);
    let chunk_len = chunk as u64;
    let frames = futures_util::stream::iter((0..total.div_ceil(chunk_len)).map(move |index| {
        let offset = index * chunk_len;
        let len = chunk_len.min(total - offset) as usize;
        let start = (offset % 26) as usize;
        Ok::<_, BoxError>(Frame::data(template.slice(start..start + len)))
    }));
    let mut response = Response::new(StreamBody::new(frames).boxed());
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    response
}

/// The default answer: what the backend saw, as JSON.
async fn json_echo(
    shared: &Shared,
    request: Request<Incoming>,
) -> Result<Response<ResponseBody>, NoResponse> {
    let (parts, mut body) = request.into_parts();
    let mut body_bytes: u64 = 0;
    while let Some(frame) = body.frame().await {
        if let Some(data) = frame?.data_ref() {
            body_bytes += data.len() as u64;
        }
    }
    let mut headers = serde_json::Map::new();
    for name in parts.headers.keys() {
        let values: Vec<String> = parts
            .headers
            .get_all(name)
            .iter()
            .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned())
            .collect();
        headers.insert(name.as_str().to_string(), values.join(", ").into());
    }
    let echo = serde_json::json!({
        "backend": shared.name,
        "method": parts.method.as_str(),
        "version": format!("{:?}", parts.version),
        "path": parts.uri.path(),
        "query": parts.uri.query().unwrap_or(""),
        "headers": headers,
        "body_bytes": body_bytes,
    });
    let mut response = full(echo.to_string());
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Ok(response)
}

fn query_pairs(query: &str) -> impl Iterator<Item = (&str, &str)> {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| pair.split_once('=').unwrap_or((pair, "")))
}

fn full(body: impl Into<Bytes>) -> Response<ResponseBody> {
    Response::new(
        Full::new(body.into())
            .map_err(|never: Infallible| match never {})
            .boxed(),
    )
}

fn empty() -> Response<ResponseBody> {
    full(Bytes::new())
}

fn plain(status: StatusCode, text: &'static str) -> Response<ResponseBody> {
    let mut response = full(text);
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    response
}
