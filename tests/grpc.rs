//! gRPC through the proxy, end to end: real tonic clients, and gRPC pods (tonic's
//! server-side codec on hyper's HTTP/2 server) on ports whose `appProtocol` says they
//! speak h2c. Unary, server-streaming and bidirectional calls; one client channel's calls
//! spread over the pool; a pod answering UNAVAILABLE leaving the pool; the proxy keeping
//! a call's `grpc-timeout`; an HTTP/1.1 client reaching an h2c pod.

#[path = "support/binary.rs"]
mod binary;
mod common;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::{ready, Ready};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes};
use common::*;
use futures_util::stream::{self, BoxStream};
use futures_util::StreamExt;
use http::header::{CONTENT_TYPE, HOST, TE};
use http::uri::PathAndQuery;
use http::{StatusCode, Uri, Version};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client as LegacyClient;
use hyper_util::rt::{TokioExecutor, TokioIo};
use proxima_core::{Endpoint, Router, ServiceSpec};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};
use tonic::client::Grpc;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::server::{ServerStreamingService, StreamingService, UnaryService};
use tonic::transport::Channel;
use tonic::{Code, Status, Streaming};

/// The test service's methods (no `.proto`: messages are raw bytes, see [`RawCodec`]).
const ECHO: &str = "/proxima.test.Echo/Echo";
const COUNT: &str = "/proxima.test.Echo/Count";
const CHAT: &str = "/proxima.test.Echo/Chat";
/// The standard health check, in case the proxy probes gRPC pods with it.
const HEALTH: &str = "/grpc.health.v1.Health/Check";

/// The Service the tests call, as clients name it.
const TARGET: &str = "echo.shop";

/// A codec of raw bytes: each message is sent as it is, without protobuf.
#[derive(Clone, Copy, Debug, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// What a pod does with each call of the test service.
#[derive(Clone, Copy, Debug)]
enum Mode {
    /// Answers at once.
    Serve,
    /// Answers every call `UNAVAILABLE` (and plain requests, such as probes, `503`).
    Unavailable,
    /// Waits this long before answering a call, whatever its `grpc-timeout`.
    Sleep(Duration),
}

/// What a pod saw of one request.
#[derive(Clone, Debug)]
struct Seen {
    path: String,
    version: Version,
    /// `:authority`, else `Host`.
    authority: String,
    te: Option<String>,
    grpc_timeout: Option<String>,
}

/// A pod's name, its current mode, and what it saw.
struct PodState {
    name: &'static str,
    mode: Mutex<Mode>,
    seen: Mutex<Vec<Seen>>,
}

/// A gRPC pod on loopback, speaking HTTP/2 only (prior knowledge). It serves the test
/// service: `Echo` answers `<name>: <message>`, `Count` streams `<name> 1` to
/// `<name> n` for a message `n`, and `Chat` echoes each message as `Echo` does; plain
/// (non-gRPC) requests get `200 <name> saw <version> for <authority>`. It is served by
/// hyper rather than tonic's `Server`, whose own `grpc-timeout` layer would answer a
/// deadline that only the proxy should keep.
struct GrpcPod {
    name: &'static str,
    addr: SocketAddr,
    state: Arc<PodState>,
    task: JoinHandle<()>,
}

impl GrpcPod {
    async fn spawn(name: &'static str, mode: Mode) -> Self {
        let listener = TcpListener::bind(loopback()).await.expect("bind pod");
        let addr = listener.local_addr().expect("pod addr");
        let state = Arc::new(PodState {
            name,
            mode: Mutex::new(mode),
            seen: Mutex::new(Vec::new()),
        });
        let pod = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let pod = pod.clone();
                let service = hyper::service::service_fn(move |req| answer(pod.clone(), req));
                tokio::spawn(
                    hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service),
                );
            }
        });
        Self {
            name,
            addr,
            state,
            task,
        }
    }

    /// From now on, answer as `mode` says.
    fn set_mode(&self, mode: Mode) {
        *self.state.mode.lock().expect("pod mode") = mode;
    }

    /// Calls of the test service's methods this pod got (not probes or health checks).
    fn calls(&self) -> usize {
        self.seen()
            .iter()
            .filter(|s| s.path.starts_with("/proxima.test.Echo/"))
            .count()
    }

    /// Every request the pod got so far.
    fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().expect("pod log").clone()
    }

    /// The pod as a ready endpoint of its Service, on a port named `grpc` whose
    /// `appProtocol` is `grpc`.
    fn endpoint(&self) -> Endpoint {
        let mut endpoint = endpoint_ports(self.name, &[("grpc", self.addr.port())]);
        endpoint.ports[0].app_protocol = Some("grpc".to_string());
        endpoint
    }
}

impl Drop for GrpcPod {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A pod's answer to one request (see [`GrpcPod`]).
async fn answer(
    pod: Arc<PodState>,
    req: http::Request<Incoming>,
) -> Result<http::Response<tonic::body::Body>, Infallible> {
    let name = pod.name;
    let mode = *pod.mode.lock().expect("pod mode");
    let header = |name| {
        req.headers()
            .get(name)
            .and_then(|v: &http::HeaderValue| v.to_str().ok())
            .map(str::to_string)
    };
    let seen = Seen {
        path: req.uri().path().to_string(),
        version: req.version(),
        authority: req
            .uri()
            .authority()
            .map(|a| a.to_string())
            .or_else(|| header(HOST))
            .unwrap_or_default(),
        te: header(TE),
        grpc_timeout: header(http::HeaderName::from_static("grpc-timeout")),
    };
    pod.seen.lock().expect("pod log").push(seen.clone());
    let grpc = header(CONTENT_TYPE).is_some_and(|t| t.starts_with("application/grpc"));
    if !grpc {
        let (status, text) = match mode {
            Mode::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, format!("{name} is down")),
            _ => (
                StatusCode::OK,
                format!("{name} saw {:?} for {}", seen.version, seen.authority),
            ),
        };
        let body = tonic::body::Body::new(Full::new(Bytes::from(text)));
        let mut response = http::Response::new(body);
        *response.status_mut() = status;
        return Ok(response);
    }
    match mode {
        Mode::Unavailable => return Ok(Status::unavailable(format!("{name} is down")).into_http()),
        Mode::Sleep(delay) if seen.path != HEALTH => tokio::time::sleep(delay).await,
        _ => {}
    }
    let mut server = tonic::server::Grpc::new(RawCodec);
    Ok(match seen.path.as_str() {
        ECHO => server.unary(Echo(name), req).await,
        COUNT => server.server_streaming(Count(name), req).await,
        CHAT => server.streaming(Chat(name), req).await,
        HEALTH => server.unary(Serving, req).await,
        other => Status::unimplemented(other.to_string()).into_http(),
    })
}

/// `<name>: <message>`.
fn reply(name: &str, message: &[u8]) -> Bytes {
    format!("{name}: {}", String::from_utf8_lossy(message)).into()
}

/// `Echo`: one message in, `<name>: <message>` out.
struct Echo(&'static str);

impl UnaryService<Bytes> for Echo {
    type Response = Bytes;
    type Future = Ready<Result<tonic::Response<Bytes>, Status>>;

    fn call(&mut self, request: tonic::Request<Bytes>) -> Self::Future {
        ready(Ok(tonic::Response::new(reply(self.0, request.get_ref()))))
    }
}

/// `Count`: a decimal `n` in, `<name> 1` to `<name> n` out.
struct Count(&'static str);

impl ServerStreamingService<Bytes> for Count {
    type Response = Bytes;
    type ResponseStream = BoxStream<'static, Result<Bytes, Status>>;
    type Future = Ready<Result<tonic::Response<Self::ResponseStream>, Status>>;

    fn call(&mut self, request: tonic::Request<Bytes>) -> Self::Future {
        let name = self.0;
        let Some(n) = std::str::from_utf8(request.get_ref())
            .ok()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            return ready(Err(Status::invalid_argument("not a number")));
        };
        let messages = (1..=n).map(move |i| Ok(Bytes::from(format!("{name} {i}"))));
        ready(Ok(tonic::Response::new(stream::iter(messages).boxed())))
    }
}

/// `Chat`: each message in is answered at once as `Echo` answers it.
struct Chat(&'static str);

impl StreamingService<Bytes> for Chat {
    type Response = Bytes;
    type ResponseStream = BoxStream<'static, Result<Bytes, Status>>;
    type Future = Ready<Result<tonic::Response<Self::ResponseStream>, Status>>;

    fn call(&mut self, request: tonic::Request<Streaming<Bytes>>) -> Self::Future {
        let name = self.0;
        let replies = request
            .into_inner()
            .map(move |message| message.map(|m| reply(name, &m)));
        ready(Ok(tonic::Response::new(replies.boxed())))
    }
}

/// `grpc.health.v1.Health/Check`: always `SERVING` (the protobuf `status = 1`).
struct Serving;

impl UnaryService<Bytes> for Serving {
    type Response = Bytes;
    type Future = Ready<Result<tonic::Response<Bytes>, Status>>;

    fn call(&mut self, _: tonic::Request<Bytes>) -> Self::Future {
        ready(Ok(tonic::Response::new(Bytes::from_static(&[0x08, 0x01]))))
    }
}

/// `echo.shop`, with one port named `grpc`, and `settings`.
fn echo_service(settings: &[(&str, &str)]) -> ServiceSpec {
    service("shop", "echo", &[("grpc", 50051)], settings)
}

/// A proxy for `echo.shop` over `pods`.
async fn proxy_for(pods: &[&GrpcPod], settings: &[(&str, &str)]) -> TestProxy {
    let endpoints = pods.iter().map(|p| p.endpoint()).collect();
    TestProxy::start(vec![(echo_service(settings), endpoints)]).await
}

/// One tonic channel (one HTTP/2 connection) to `addr`, whose calls name `echo.shop` in
/// their `:authority`, as a client that resolved the Service to the proxy would.
async fn channel_to(addr: SocketAddr) -> Grpc<Channel> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .origin(Uri::from_static("http://echo.shop"));
    let channel = within("tonic channel connects", endpoint.connect())
        .await
        .expect("tonic channel connects");
    Grpc::new(channel)
}

/// A unary `Echo` call of `request` over any transport: the answer as text.
async fn echo<T>(grpc: &mut Grpc<T>, request: tonic::Request<Bytes>) -> Result<String, Status>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::ResponseBody: hyper::body::Body<Data = Bytes> + Send + 'static,
    <T::ResponseBody as hyper::body::Body>::Error: Into<BoxError>,
{
    grpc.ready()
        .await
        .map_err(|e| Status::unavailable(format!("client not ready: {}", e.into())))?;
    let answer = grpc
        .unary(request, PathAndQuery::from_static(ECHO), RawCodec)
        .await?;
    Ok(String::from_utf8_lossy(answer.get_ref()).into_owned())
}

/// A unary `Echo` of `message` on a channel, with no deadline or metadata.
async fn echo_text(grpc: &mut Grpc<Channel>, message: &str) -> Result<String, Status> {
    within(
        "echo call",
        echo(grpc, tonic::Request::new(Bytes::from(message.to_string()))),
    )
    .await
}

/// Assert that every kind of call reaches pod `name` over `grpc`: a unary `Echo`, a
/// `Count` of 5 streamed messages, and a `Chat` of 3 round trips (each message is sent
/// only after the previous answer came back).
async fn assert_every_kind_of_call(grpc: &mut Grpc<Channel>, name: &str) {
    let answer = echo_text(grpc, "hello").await.expect("unary Echo");
    assert_eq!(answer, format!("{name}: hello"));

    within("server-streaming Count", async {
        grpc.ready().await.expect("channel ready");
        let request = tonic::Request::new(Bytes::from_static(b"5"));
        let mut stream = grpc
            .server_streaming(request, PathAndQuery::from_static(COUNT), RawCodec)
            .await
            .expect("Count answers")
            .into_inner();
        for i in 1..=5 {
            let message = stream.message().await.expect("Count message");
            assert_eq!(message, Some(format!("{name} {i}").into()), "message {i}");
        }
        assert_eq!(stream.message().await.expect("Count ends with OK"), None);
    })
    .await;

    within("bidirectional Chat", async {
        grpc.ready().await.expect("channel ready");
        let (tx, rx) = mpsc::channel::<Bytes>(1);
        let outbound = stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
        tx.send(Bytes::from_static(b"round 1")).await.expect("send");
        let mut replies = grpc
            .streaming(
                tonic::Request::new(outbound),
                PathAndQuery::from_static(CHAT),
                RawCodec,
            )
            .await
            .expect("Chat answers")
            .into_inner();
        for round in 1..=3 {
            let message = replies.message().await.expect("Chat reply");
            assert_eq!(message, Some(format!("{name}: round {round}").into()));
            if round < 3 {
                let next = format!("round {}", round + 1);
                tx.send(next.into()).await.expect("send");
            }
        }
        drop(tx);
        assert_eq!(replies.message().await.expect("Chat ends with OK"), None);
    })
    .await;
}

/// Ids of the endpoints in `echo.shop`'s QoS pool.
fn pool(router: &Router) -> Vec<String> {
    let table = router.table();
    let route = table
        .services
        .values()
        .find(|r| r.key().to_string() == TARGET)
        .expect("echo.shop is routed");
    route
        .pool()
        .into_iter()
        .map(|i| route.endpoints[i].endpoint.id.clone())
        .collect()
}

/// Why each endpoint of `echo.shop` is in or out of its pool, for failure messages.
fn pool_reasons(router: &Router) -> Vec<String> {
    router
        .explain(Instant::now())
        .services
        .into_iter()
        .filter(|s| s.service == TARGET)
        .flat_map(|s| s.endpoints)
        .map(|e| format!("{}: {}", e.id, e.reason))
        .collect()
}

/// The harness itself: a tonic client that dials a pod directly (no proxy) makes every
/// kind of call. The tests below differ from this one only by the proxy in between.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tonic_client_that_dials_a_pod_directly_makes_every_kind_of_call() {
    let pod = GrpcPod::spawn("pod-0", Mode::Serve).await;
    let mut grpc = channel_to(pod.addr).await;
    assert_every_kind_of_call(&mut grpc, "pod-0").await;
    assert!(pod.seen().iter().all(|s| s.authority == TARGET));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unary_streaming_and_bidirectional_calls_reach_an_h2c_pod_through_the_proxy() {
    let pod = GrpcPod::spawn("pod-0", Mode::Serve).await;
    let proxy = proxy_for(&[&pod], &[]).await;
    let mut grpc = channel_to(proxy.addr).await;

    assert_every_kind_of_call(&mut grpc, "pod-0").await;

    // The pod got each call over HTTP/2, for the name the client used, and with the
    // `te: trailers` that gRPC requires (a hop-by-hop header otherwise).
    let calls: Vec<_> = pod
        .seen()
        .into_iter()
        .filter(|s| s.path.starts_with("/proxima.test.Echo/"))
        .collect();
    assert_eq!(calls.len(), 3, "{calls:?}");
    for call in calls {
        assert_eq!(call.version, Version::HTTP_2, "{call:?}");
        assert_eq!(call.authority, TARGET, "{call:?}");
        assert_eq!(call.te.as_deref(), Some("trailers"), "{call:?}");
    }
}

/// kube-proxy balances connections, so one gRPC channel would stick to one pod; the
/// proxy balances the calls on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_grpc_channel_s_calls_are_spread_over_three_pods() {
    const CALLS: usize = 3000;
    const CONCURRENCY: usize = 16;
    let pods = [
        GrpcPod::spawn("pod-0", Mode::Serve).await,
        GrpcPod::spawn("pod-1", Mode::Serve).await,
        GrpcPod::spawn("pod-2", Mode::Serve).await,
    ];
    // An SLO far above any call's time, even on a busy machine: the pods stay equal.
    // The even spread, whose share per pod this checks; the default (slack) also passes
    // over a pod holding more calls in flight than its latency explains, which at 16
    // calls in flight on a busy machine moved the split to 829 / 1,067 / 1,104.
    let settings = [("latency-slo", "1s"), ("qos-pool-spread", "even")];
    let proxy = proxy_for(&pods.iter().collect::<Vec<_>>(), &settings).await;
    let grpc = channel_to(proxy.addr).await;

    let next = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(AtomicU64::new(0));
    let mut callers = JoinSet::new();
    for _ in 0..CONCURRENCY {
        let (mut grpc, next, failures) = (grpc.clone(), next.clone(), failures.clone());
        callers.spawn(async move {
            let mut answered_by = Vec::new();
            while next.fetch_add(1, Ordering::Relaxed) < CALLS {
                match echo_text(&mut grpc, "hi").await {
                    Ok(answer) => {
                        let (pod, _) = answer.split_once(':').expect("`<pod>: hi`");
                        answered_by.push(pod.to_string());
                    }
                    Err(status) => {
                        if failures.fetch_add(1, Ordering::Relaxed) == 0 {
                            eprintln!("first failed call: {status:?}");
                        }
                    }
                }
            }
            answered_by
        });
    }
    let mut per_pod = BTreeMap::<String, usize>::new();
    for answered_by in within("every call", callers.join_all()).await {
        for pod in answered_by {
            *per_pod.entry(pod).or_default() += 1;
        }
    }

    assert_eq!(failures.load(Ordering::Relaxed), 0, "failed calls");
    assert_eq!(per_pod.len(), 3, "{per_pod:?}");
    assert_eq!(per_pod.values().sum::<usize>(), CALLS);
    let max = *per_pod.values().max().expect("counts") as f64;
    let min = *per_pod.values().min().expect("counts") as f64;
    assert!(
        max / min <= 1.2,
        "uneven spread: {per_pod:?}; {:?}",
        pool_reasons(&proxy.router)
    );
}

/// A pod that starts answering every call UNAVAILABLE leaves the pool on those answers
/// alone (its first probe had passed), and stays out while its probes fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_answers_unavailable_leaves_the_pool() {
    let ok_0 = GrpcPod::spawn("pod-0", Mode::Serve).await;
    let ok_1 = GrpcPod::spawn("pod-1", Mode::Serve).await;
    let failing = GrpcPod::spawn("pod-2", Mode::Serve).await;
    let proxy = proxy_for(&[&ok_0, &ok_1, &failing], &[]).await;
    let mut grpc = channel_to(proxy.addr).await;
    let in_pool = || pool(&proxy.router).contains(&"pod-2".to_string());

    for _ in 0..30 {
        echo_text(&mut grpc, "warm-up").await.expect("warm-up call");
    }
    assert!(failing.calls() >= 1, "pod-2 took its share");
    assert!(in_pool(), "{:?}", pool_reasons(&proxy.router));

    // Its UNAVAILABLE answers are passed on to the client as they are, until they take
    // it out of the pool: client calls under the even spread, the probes that follow
    // its first failure under the slack spread (which passes it over meanwhile).
    failing.set_mode(Mode::Unavailable);
    let (mut sent, mut failures) = (0, 0);
    let leaving = Instant::now();
    while in_pool() {
        sent += 1;
        assert!(
            leaving.elapsed() < Duration::from_secs(10),
            "pod-2 still in the pool after {sent} calls"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
        match echo_text(&mut grpc, "hello").await {
            Ok(answer) => assert!(!answer.starts_with("pod-2"), "{answer}"),
            Err(status) => {
                assert_eq!(status.code(), Code::Unavailable, "{status:?}");
                assert_eq!(status.message(), "pod-2 is down", "{status:?}");
                failures += 1;
            }
        }
    }
    assert!(
        (1..=10).contains(&failures),
        "{failures} of {sent} calls failed before pod-2 left the pool"
    );

    // Out of the pool, it gets no more calls (its probes are no calls of the service).
    let before = failing.calls();
    let mut failures = 0;
    for _ in 0..300 {
        if let Err(status) = echo_text(&mut grpc, "after").await {
            eprintln!("failed call after pod-2 left the pool: {status:?}");
            failures += 1;
        }
    }
    let after = failing.calls() - before;
    assert!(after <= 3, "pod-2 still got {after} of 300 calls");
    assert!(failures <= 3, "{failures} of 300 calls failed");
    // The answers' statuses are counted: OK from the trailers after a message,
    // UNAVAILABLE from the Trailers-Only answers.
    let counted = |code: &str| {
        proxy.metric(&format!(
            r#"proxima_grpc_responses_total{{code="{code}",service="echo.shop"}}"#
        ))
    };
    assert!(counted("0") >= 300.0, "{}", counted("0"));
    assert!(counted("14") >= 1.0, "{}", counted("14"));
}

/// The deadline is the client's: a pod that ignores it does not hold the call longer,
/// though the service's own `timeout` (15 s) is far off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_past_its_grpc_timeout_gets_deadline_exceeded_from_the_proxy() {
    let pod = GrpcPod::spawn("slow-0", Mode::Sleep(Duration::from_secs(2))).await;
    let proxy = proxy_for(&[&pod], &[]).await;
    // tonic's client over hyper's h2c client rather than a tonic `Channel`: a channel
    // keeps the deadline itself (answering CANCELLED at 200 ms), which would race with
    // the proxy's answer. The service is named in `x-service`.
    let h2c = LegacyClient::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<tonic::body::Body>();
    let origin = Uri::try_from(proxy.url("")).expect("proxy uri");
    let mut grpc = Grpc::with_origin(h2c, origin);

    let mut request = tonic::Request::new(Bytes::from_static(b"late"));
    request.set_timeout(Duration::from_millis(200));
    request
        .metadata_mut()
        .insert("x-service", TARGET.parse().expect("metadata value"));
    let started = Instant::now();
    let result = within("call with a deadline", echo(&mut grpc, request)).await;
    let took = started.elapsed();

    let status = result.expect_err("no answer in time");
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(status.message().contains("grpc-timeout"), "{status:?}");
    assert!(
        took < Duration::from_millis(1500),
        "answered after {took:?}"
    );
    // The pod was asked, and told the deadline too.
    let calls = pod.seen();
    let call = calls
        .iter()
        .find(|s| s.path == ECHO)
        .expect("the pod got the call");
    assert!(call.grpc_timeout.is_some(), "{call:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http1_client_reaches_an_h2c_pod_that_sees_http2() {
    let pod = GrpcPod::spawn("pod-0", Mode::Serve).await;
    let proxy = proxy_for(&[&pod], &[]).await;

    let reply = get(
        &http1_client(),
        &proxy.url("/hello"),
        &[("x-service", TARGET)],
    )
    .await;

    assert_eq!(
        reply.status,
        StatusCode::OK,
        "{:?}",
        String::from_utf8_lossy(&reply.body)
    );
    assert_eq!(reply.version, Version::HTTP_11);
    // The client's Host becomes the pod's `:authority`.
    assert_eq!(
        String::from_utf8_lossy(&reply.body),
        format!("pod-0 saw HTTP/2.0 for {}", proxy.addr)
    );
}

/// The real binary with file discovery: a topology file declaring the port `protocol:
/// grpc` (read the Kubernetes way, as appProtocol) and two gRPC pods; every kind of call
/// passes, and one channel's calls reach both pods.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_routes_grpc_to_pods_declared_in_its_topology_file() {
    let pods = [
        GrpcPod::spawn("pod-0", Mode::Serve).await,
        GrpcPod::spawn("pod-1", Mode::Serve).await,
    ];
    let dir = binary::TempDir::new("grpc");
    let path = dir.0.join("topology.yaml");
    let mut topology = String::from(
        "services:\n  - name: echo\n    namespace: shop\n    ports: [{ name: rpc, port: 50051, protocol: grpc }]\n    endpoints:\n",
    );
    for pod in &pods {
        topology.push_str(&format!(
            "      - {{ id: {}, address: '{}' }}\n",
            pod.name, pod.addr
        ));
    }
    std::fs::write(&path, topology).expect("write topology");
    let discovery = format!("file:{}", path.display());
    let proxima = binary::Proxima::start(&["run", "--discovery", &discovery]).await;
    let mut grpc = channel_to(proxima.proxy).await;
    let mut answered_by = std::collections::BTreeSet::new();
    for _ in 0..20 {
        let answer = echo_text(&mut grpc, "hi").await.expect("unary call");
        answered_by.insert(answer.split(':').next().unwrap_or_default().to_string());
    }
    assert_eq!(answered_by.len(), 2, "{answered_by:?}");
    // Streaming calls too, whichever pod takes them.
    for _ in 0..4 {
        within("server-streaming Count", async {
            grpc.ready().await.expect("channel ready");
            let request = tonic::Request::new(Bytes::from_static(b"3"));
            let mut stream = grpc
                .server_streaming(request, PathAndQuery::from_static(COUNT), RawCodec)
                .await
                .expect("Count answers")
                .into_inner();
            let mut n = 0;
            while let Some(message) = stream.message().await.expect("Count message") {
                assert!(
                    message.ends_with(format!(" {}", n + 1).as_bytes()),
                    "{message:?}"
                );
                n += 1;
            }
            assert_eq!(n, 3);
        })
        .await;
    }
}
