//! gRPC load for `benches/load/grpc.sh`: a gRPC pod and a unary-call load.
//!
//! ```text
//! grpc-load serve ADDR NAME
//!     a gRPC pod speaking HTTP/2 only (prior knowledge): the unary `/bench.Echo/Say`
//!     answers `NAME: <payload>`; any other (non-gRPC) request, such as a proxy's probe
//!     `GET /`, gets `200 NAME`
//! grpc-load load --target ADDR --authority HOST --connections C --concurrency N
//!                --duration D --payload BYTES [--threads T]
//!     C tonic channels (HTTP/2 connections) to ADDR, their calls naming HOST in
//!     `:authority`; N calls of `Say` with a BYTES-byte payload in flight in total (each
//!     channel carries N/C of them), for D (`8s`, `500ms`, `1m`); T runtime threads
//!     (default 1). Prints one line:
//!     `calls_per_s p50_us p99_us errors pods`, where pods is `NAME=calls,...` over the
//!     pods that answered (from the answers' prefix), or `-`; the first failed call's
//!     status goes to standard error
//! ```
//!
//! Real gRPC on both sides (tonic's client channel, tonic's server-side codec on hyper's
//! HTTP/2 server) with raw-bytes messages, so no `.proto` is compiled: every proxy in the
//! comparison relays the same frames, trailers included.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::{ready, Ready};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::header::CONTENT_TYPE;
use http::uri::PathAndQuery;
use http::Uri;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tonic::client::Grpc;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::server::UnaryService;
use tonic::transport::Channel;
use tonic::Status;

/// The one method of the benchmark's service (no `.proto`: see [`RawCodec`]).
const SAY: &str = "/bench.Echo/Say";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("serve") if args.len() == 3 => {
            let addr = args[1].parse().unwrap_or_else(|_| usage());
            // Leaked once: every answer of the pod's life borrows it.
            let name: &'static str = Box::leak(args[2].clone().into_boxed_str());
            runtime(1).block_on(serve(addr, name));
        }
        Some("load") => {
            let load = Load::parse(&args[1..]);
            runtime(load.threads).block_on(load.run());
        }
        _ => usage(),
    }
}

fn usage() -> ! {
    eprintln!(
        "usage: grpc-load serve ADDR NAME\n       grpc-load load --target ADDR --authority HOST \
         --connections C --concurrency N --duration D --payload BYTES [--threads T]"
    );
    std::process::exit(2)
}

fn runtime(threads: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .expect("runtime")
}

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

// ---- the pod ----

/// Serve the pod on `addr`: HTTP/2 only, one connection task each, as hyper's server
/// runs them (tonic's own `Server` would add its layers; the proxies see the same bytes).
async fn serve(addr: SocketAddr, name: &'static str) {
    let listener = TcpListener::bind(addr).await.expect("bind");
    while let Ok((stream, _)) = listener.accept().await {
        let _ = stream.set_nodelay(true);
        let service = hyper::service::service_fn(move |req| answer(name, req));
        tokio::spawn(
            hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service),
        );
    }
}

/// The pod's answer to one request: `Say` for gRPC calls of it, `UNIMPLEMENTED` for
/// other methods, `200 NAME` for anything that is not gRPC (probes).
async fn answer(
    name: &'static str,
    req: http::Request<Incoming>,
) -> Result<http::Response<tonic::body::Body>, Infallible> {
    let grpc = req
        .headers()
        .get(CONTENT_TYPE)
        .is_some_and(|t| t.as_bytes().starts_with(b"application/grpc"));
    if !grpc {
        let body = Full::new(Bytes::from(format!("{name}\n")));
        return Ok(http::Response::new(tonic::body::Body::new(body)));
    }
    if req.uri().path() != SAY {
        return Ok(Status::unimplemented(req.uri().path().to_string()).into_http());
    }
    Ok(tonic::server::Grpc::new(RawCodec)
        .unary(Say(name), req)
        .await)
}

/// `Say`: the payload back, after the pod's name and `: `.
struct Say(&'static str);

impl UnaryService<Bytes> for Say {
    type Response = Bytes;
    type Future = Ready<Result<tonic::Response<Bytes>, Status>>;

    fn call(&mut self, request: tonic::Request<Bytes>) -> Self::Future {
        let payload = request.get_ref();
        let mut reply = BytesMut::with_capacity(self.0.len() + 2 + payload.len());
        reply.put_slice(self.0.as_bytes());
        reply.put_slice(b": ");
        reply.put_slice(payload);
        ready(Ok(tonic::Response::new(reply.freeze())))
    }
}

// ---- the load ----

struct Load {
    target: SocketAddr,
    authority: String,
    connections: usize,
    concurrency: usize,
    duration: Duration,
    payload: usize,
    threads: usize,
}

/// What one caller (one call in flight at a time) saw.
#[derive(Default)]
struct Tally {
    /// Round-trip times of the answered calls, in microseconds.
    latencies: Vec<u64>,
    /// Answered calls per pod, by the name the answer starts with.
    per_pod: Vec<(Bytes, u64)>,
}

impl Load {
    fn parse(args: &[String]) -> Self {
        let mut flags = BTreeMap::new();
        let mut rest = args.iter();
        while let Some(flag) = rest.next() {
            let Some(key) = flag.strip_prefix("--") else {
                usage()
            };
            let value = rest.next().unwrap_or_else(|| usage());
            flags.insert(key.to_string(), value.clone());
        }
        let mut take = |key: &str| flags.remove(key);
        let number = |value: Option<String>| -> usize {
            value
                .unwrap_or_else(|| usage())
                .parse()
                .unwrap_or_else(|_| usage())
        };
        let load = Self {
            target: take("target")
                .unwrap_or_else(|| usage())
                .parse()
                .unwrap_or_else(|_| usage()),
            authority: take("authority").unwrap_or_else(|| usage()),
            connections: number(take("connections")).max(1),
            concurrency: number(take("concurrency")).max(1),
            duration: duration(&take("duration").unwrap_or_else(|| usage())),
            payload: number(take("payload")),
            threads: number(Some(take("threads").unwrap_or_else(|| "1".into()))).max(1),
        };
        if let Some(unknown) = flags.keys().next() {
            eprintln!("unknown flag --{unknown}");
            usage()
        }
        load
    }

    async fn run(self) {
        let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", self.target))
            .expect("target")
            .origin(
                format!("http://{}", self.authority)
                    .parse::<Uri>()
                    .unwrap_or_else(|_| usage()),
            )
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(5));
        let mut channels = Vec::with_capacity(self.connections);
        for _ in 0..self.connections {
            match endpoint.connect().await {
                Ok(channel) => channels.push(Grpc::new(channel)),
                Err(error) => {
                    eprintln!("cannot connect to {}: {error:?}", self.target);
                    std::process::exit(1);
                }
            }
        }
        let payload = Bytes::from(vec![b'x'; self.payload]);
        // One call on each channel first, not counted: the connection's first stream
        // (and the proxy's first upstream connections) are not what is measured.
        let errors = Arc::new(AtomicU64::new(0));
        for grpc in &mut channels {
            if let Err(status) = say(grpc, &payload).await {
                report_first(&errors, &status, "warm-up call");
            }
        }
        let errors = Arc::new(AtomicU64::new(0));

        let started = Instant::now();
        let until = started + self.duration;
        let callers: Vec<_> = (0..self.concurrency)
            .map(|i| {
                let mut grpc = channels[i % channels.len()].clone();
                let (payload, errors) = (payload.clone(), errors.clone());
                tokio::spawn(async move {
                    let mut tally = Tally::default();
                    while Instant::now() < until {
                        let start = Instant::now();
                        match say(&mut grpc, &payload).await {
                            Ok(answer) => {
                                tally.latencies.push(start.elapsed().as_micros() as u64);
                                tally.count(answer);
                            }
                            Err(status) => {
                                report_first(&errors, &status, "failed call");
                                // A proxy that fails every call at once would spin.
                                tokio::time::sleep(Duration::from_millis(1)).await;
                            }
                        }
                    }
                    tally
                })
            })
            .collect();
        let mut all = Vec::new();
        let mut per_pod = BTreeMap::<String, u64>::new();
        for caller in callers {
            let tally = caller.await.expect("caller task");
            all.extend(tally.latencies);
            for (pod, n) in tally.per_pod {
                *per_pod
                    .entry(String::from_utf8_lossy(&pod).into_owned())
                    .or_default() += n;
            }
        }
        let elapsed = started.elapsed();
        all.sort_unstable();
        let at = |q: f64| {
            all.get(((all.len() as f64 * q) as usize).min(all.len().saturating_sub(1)))
                .copied()
                .unwrap_or(0)
        };
        let pods = if per_pod.is_empty() {
            "-".to_string()
        } else {
            per_pod
                .iter()
                .map(|(pod, n)| format!("{pod}={n}"))
                .collect::<Vec<_>>()
                .join(",")
        };
        println!(
            "{:.0} {} {} {} {pods}",
            all.len() as f64 / elapsed.as_secs_f64(),
            at(0.5),
            at(0.99),
            errors.load(Ordering::Relaxed),
        );
    }
}

impl Tally {
    /// Count an answer for the pod it names (`NAME: payload`).
    fn count(&mut self, answer: Bytes) {
        let name = match answer.iter().position(|&b| b == b':') {
            Some(end) => answer.slice(..end),
            None => Bytes::from_static(b"?"),
        };
        match self.per_pod.iter_mut().find(|(pod, _)| *pod == name) {
            Some((_, n)) => *n += 1,
            None => self.per_pod.push((name, 1)),
        }
    }
}

/// Count a failed call, printing the first one's status.
fn report_first(errors: &AtomicU64, status: &Status, what: &str) {
    if errors.fetch_add(1, Ordering::Relaxed) == 0 {
        eprintln!(
            "first {what}: {:?}: {}",
            status.code(),
            status.message().replace('\n', " ")
        );
    }
}

/// One unary `Say` call: the answer's message.
async fn say(grpc: &mut Grpc<Channel>, payload: &Bytes) -> Result<Bytes, Status> {
    grpc.ready()
        .await
        .map_err(|e| Status::unavailable(format!("channel not ready: {e}")))?;
    let request = tonic::Request::new(payload.clone());
    let answer = grpc
        .unary(request, PathAndQuery::from_static(SAY), RawCodec)
        .await?;
    Ok(answer.into_inner())
}

/// `8s`, `500ms`, `1m`, or plain seconds.
fn duration(text: &str) -> Duration {
    let (number, unit) = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .map_or((text, "s"), |at| text.split_at(at));
    let value: f64 = number.parse().unwrap_or_else(|_| usage());
    let seconds = match unit {
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        _ => usage(),
    };
    Duration::from_secs_f64(seconds)
}
