//! Forwarding one request: Algorithm 1 of QEdgeProxy (Čilić et al., §III-A).
//!
//! ```text
//! REQUESTROUTING(request, service)
//!   serviceInstance ← getInstanceFromQoSPool(service)   Router::pick
//!   qos ← sendRequest(request, serviceInstance)           attempt()
//!   storeQoSMeasurements(serviceInstance, qos)             Router::record
//! ```
//!
//! The measurement is the time from the start of the attempt (connect included, when a
//! connection had to be opened) to the pod's response headers, taken with `Instant`.
//!
//! Around that core, failures are retried on another endpoint (the ids already tried
//! are passed to `pick` as `exclude`), up to the service's `retries`. [`Proxy::forward`]
//! is the retry loop; each turn is one attempt, whose end is classified by a pure
//! function (`verdict::judge`, tested alone) and acted on by `Proxy::settle`:
//!
//! * **Connect failures** (refused, unreachable, `connect-timeout`) and connections that
//!   broke before the request was written: nothing reached the pod, so any request is
//!   retried, its streaming body untouched. A pooled keep-alive connection that turns
//!   out to be stale gives the request back (`try_send_request`), or is found closed by
//!   its pod just before a request that must not go twice is written on it
//!   (`Held::closed_now`), and the same endpoint is tried on a fresh connection,
//!   without counting as a retry.
//! * **Failures after sending** (reset, protocol error): the request is replayed only
//!   if it is [`replayable`]: idempotent (by its method or an `Idempotency-Key`) with no
//!   body or one read whole, since the pod may have acted on it; otherwise the client
//!   gets `502`.
//! * **Timeout**: the service's `timeout` bounds the whole request up to response
//!   headers; when it passes the client gets `504` and nothing is retried.
//!
//! * **Hedge** (`qos-pool-hedge`, on under the QoS pool): a first attempt of a
//!   [`replayable`] request still without response headers at the last moment the
//!   fastest other pool member can answer within the SLO (`Picked::hedge_after`) is
//!   sent to that member as well, and the copy that answers first is the one the client
//!   gets ([`Proxy::hedge`]; Dean and Barroso's hedged requests, timed by the SLO). A
//!   hedge counts as a retry.
//!
//! Retries and hedges also need the service's retry budget (`RetryBudget`, linkerd's rule: a
//! share of the requests plus a small floor per second): every request is counted in it,
//! and a retry it refuses is not sent; the client gets the failure at hand.
//!
//! Every attempt is reported to the router (`ConnectFailed`, `Answered` with its status,
//! `Failed`), so the QoS pool and the connection cooldown see every failure; a status in
//! the service's `failure-status` set is a failure like a reset. While an attempt waits
//! for response headers it is watched: once it has waited longer than the SLO it is
//! stored as a miss at once (`Router::record_overdue`); once it has waited twice that
//! (at least 250 ms) while its pod answered nothing else, the pod leaves the pool as
//! hung (`Router::record_unanswered`); and if the client goes away first, the wait so
//! far is stored (`Router::record_abandoned`). Each report carries the
//! proxy's own stall during the attempt (`client/stall.rs`), so that the proxy's lag is not
//! held against the pod.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, HOST, TE, TRANSFER_ENCODING};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri, Version};
use http_body::Body;
use http_body_util::BodyExt;
use proxima_core::endpoint::unanswered_limit;
use proxima_core::{
    EndpointId, Outcome, PickError, Picked, PoolChange, PortProtocol, PortRef, Reason, ServiceKey,
};
use rand::rngs::SmallRng;
use rand::SeedableRng;
use tracing::{debug, error, info, warn};

use crate::forward::body::{Finish, ResponseBody, Rest, UpstreamBody};
use crate::forward::headers::{add_forwarded, header_bytes, strip_hop_by_hop};
use crate::forward::request_body::RequestBody;
use crate::forward::target::{split_port, TargetError, TargetSource};
use crate::http1::{self, UpstreamError};
use crate::metrics::{EndpointMetrics, ErrorKind, ServiceMetrics};
use crate::upstream::connect::ConnectError;
use crate::upstream::pool::{ConnPool, Held, Sender};
use crate::Proxy;
use verdict::{Ended, Next, Place, Refusal};

pub(crate) mod body;
pub(crate) mod grpc;
pub(crate) mod headers;
pub(crate) mod pump;
pub(crate) mod reply;
pub(crate) mod request_body;
pub mod target;
pub(crate) mod tunnel;
mod verdict;

/// Pooled connections tried for one attempt before a fresh one is opened.
const MAX_STALE: usize = 3;

thread_local! {
    /// Randomness for the strategies' choices; per thread, so picking takes no lock.
    static RNG: RefCell<SmallRng> = RefCell::new(SmallRng::from_entropy());
}

/// Run `pick` with the thread's randomness (or a fresh one, if a pick is already
/// drawing from it).
fn with_rng<R>(pick: impl FnOnce(&mut SmallRng) -> R) -> R {
    RNG.with(|rng| match rng.try_borrow_mut() {
        Ok(mut rng) => pick(&mut rng),
        Err(_) => pick(&mut SmallRng::from_entropy()),
    })
}

/// The service a request names, resolved when the request arrived (see `client/server.rs`).
#[derive(Debug)]
pub(crate) struct Target {
    pub(crate) key: Arc<ServiceKey>,
    /// The header value that named it; the port is read from it.
    pub(crate) raw: HeaderValue,
    pub(crate) source: TargetSource,
}

/// A request that names no routable service.
#[derive(Debug)]
pub(crate) struct BadTarget {
    pub(crate) error: TargetError,
    /// What the client sent, for the error body.
    pub(crate) named: String,
}

/// How one attempt on one endpoint ended.
pub(crate) enum Attempt {
    /// Response headers arrived (at the instant given: the measurement ends there, not
    /// after the wait for the first body frame); the connection goes back to the pool
    /// after the body (hyper's sender here; a native exchange's socket is in the body).
    Response(Response<UpstreamBody>, Option<Sender>, Instant),
    /// Nothing reached the pod; the request comes back untouched.
    NotSent(Request<RequestBody>, ConnectError),
    /// The request was (at least in part) sent, and no response came. The request comes
    /// back (as sent) when the caller asked to keep it for a retry on another pod; boxed,
    /// so that this rare case does not make every attempt's result larger to move.
    Failed(ErrorKind, UpstreamError, Option<Box<Request<RequestBody>>>),
    /// The client's own request body broke while it was being sent.
    ClientBodyFailed(hyper::Error),
    /// The request deadline passed before response headers arrived.
    TimedOut { sent: bool },
}

/// Whether a failed request may go to another pod: a retry is left and the service's
/// retry budget consents (it counts the retry when it does).
fn may_retry(service: &ServiceMetrics, picked: &Picked, done: u32, retries: u32) -> bool {
    if done >= retries {
        return false;
    }
    if !picked.route().retry_budget().try_retry(Instant::now()) {
        service.retry_refused();
        debug!(
            service = service.label(),
            "retry budget spent: not retrying"
        );
        return false;
    }
    true
}

/// `400` for a request whose own body broke while it was sent.
fn answer_client_body_failed(
    service: &ServiceMetrics,
    error: &hyper::Error,
) -> Response<ResponseBody> {
    debug!(service = service.label(), %error, "client request body failed");
    service.answered(StatusCode::BAD_REQUEST);
    reply::error(
        StatusCode::BAD_REQUEST,
        "request body failed",
        service.label(),
        &describe(error),
    )
}

impl Attempt {
    /// How the attempt ended, for [`verdict::judge`], and when (the response headers'
    /// arrival for an answer, else now). `grpc`: the request is a gRPC call.
    fn ended(&self, attempt_start: Instant, grpc: bool) -> (Ended, Instant) {
        let ended = match self {
            Attempt::Response(response, _, at) => {
                let ended = Ended::Answered {
                    latency: at.saturating_duration_since(attempt_start),
                    status: response.status().as_u16(),
                    grpc: grpc.then(|| grpc_status(response)).flatten(),
                };
                return (ended, *at);
            }
            Attempt::NotSent(_, error) => Ended::NotSent {
                error: describe(error),
            },
            Attempt::Failed(kind, error, back) => Ended::Failed {
                kind: *kind,
                error: describe(error),
                kept: back.is_some(),
            },
            Attempt::TimedOut { sent } => Ended::TimedOut { sent: *sent },
            Attempt::ClientBodyFailed(_) => Ended::ClientBodyFailed,
        };
        (ended, Instant::now())
    }

    /// The request, when it came back for another pod.
    fn into_request(self) -> Option<Request<RequestBody>> {
        match self {
            Attempt::NotSent(req, _) => Some(req),
            Attempt::Failed(_, _, back) => back.map(|req| *req),
            _ => None,
        }
    }
}

/// How long to wait, once a pod's response headers are in, for the first frame of its
/// body. A body that is broken from its first byte (say, invalid chunked framing right
/// after the headers) then fails the attempt, and the client gets `502` instead of a
/// connection cut after the headers. A frame that takes longer is not waited for: the
/// headers go out, and a body that breaks later is cut off (HTTP/1.1 closes the
/// connection before the terminating chunk or the declared length, HTTP/2 resets the
/// stream), which is the only honest way left to tell the client.
const FIRST_FRAME_WAIT: Duration = Duration::from_millis(10);

/// Send `req` to the pod at `addr`: on a pooled connection if one is ready, else on a
/// fresh one (see the module docs). A request without a body goes through the proxy's
/// own HTTP/1.1 exchange (`http1/mod.rs`), one with a body through hyper's client.
///
/// A pooled connection can turn out dead under the request: the pod closed it while idle
/// (many servers do, without `Connection: close`), racing with the reuse. If nothing of
/// the request was written, or the connection closed or was reset before any byte of a
/// response and the request is [`replayable`], the request goes again to the same pod
/// on a fresh connection. A request that is not is first checked against a pooled
/// socket's own state (`Held::closed_now`), so that a close the worker has not heard of
/// yet costs it a connection, not a `502`. None of these counts against the pod: only
/// the final result of the attempt is reported.
///
/// `keep` asks for the request back when it fails after being sent, for a retry on
/// another pod (a [`replayable`] request, see [`Proxy::forward`]). The native
/// exchange only borrows the request, so it costs nothing there; only hyper's client,
/// which takes the request, needs a copy ([`Replay`]), made just before it sends.
///
/// `deadline` bounds the connect phase here; the wait for response headers is bounded
/// by the caller (one timer per request, `Proxy::watched`), who learns from `sent`
/// whether the request had begun to be written when the deadline passed.
///
/// An async block rather than an `async fn`, whose arguments rustc stores twice in its
/// state (as arguments and as locals): the state moves with every move of the request's
/// future. For the same reason the rarer awaits (a new connection, hyper's client for
/// requests with bodies) are boxed, so that the state is as large as the common path
/// needs.
// Not an `async fn`: see above.
#[allow(clippy::manual_async_fn)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn attempt<'a>(
    pool: &'a Arc<ConnPool>,
    addr: SocketAddr,
    protocol: PortProtocol,
    mut req: Request<RequestBody>,
    deadline: Instant,
    connect_timeout: Duration,
    keep: bool,
    sent: &'a AtomicBool,
) -> impl std::future::Future<Output = Attempt> + 'a {
    async move {
        if protocol == PortProtocol::H2c {
            let to = Upstream {
                pool,
                addr,
                deadline,
                connect_timeout,
            };
            return Box::pin(by_h2(to, req, keep, sent)).await;
        }
        let resendable = replayable(&req);
        // Bodies in memory go as the head does; a client's streamed body, through hyper.
        let native = matches!(req.body(), RequestBody::Empty | RequestBody::Whole(_));
        let mut stale = 0;
        loop {
            let pooled = if stale < MAX_STALE {
                pool.take(addr, crate::clock::coarse_now())
            } else {
                None
            };
            // A request that must not be sent twice is not written on a connection the
            // pod has already closed, reset or written on: asked of the socket itself,
            // since the pool's check reads readiness that can lag (`Held::closed_now`).
            // Nothing was written, so the same pod gets it on another connection.
            if !resendable && pooled.as_ref().is_some_and(Held::closed_now) {
                debug!(%addr, "pooled connection closed by the pod before the request; trying another");
                stale += 1;
                continue;
            }
            let fresh = pooled.is_none();
            let held = match pooled {
                Some(held) => held,
                None => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Attempt::TimedOut { sent: false };
                    }
                    let timeout = connect_timeout.min(left);
                    let connected = if native {
                        Box::pin(pool.connect_socket(addr, timeout))
                            .await
                            .map(Held::Parked)
                    } else {
                        Box::pin(pool.connect(addr, timeout)).await.map(Held::Ready)
                    };
                    match connected {
                        Ok(held) => held,
                        Err(ConnectError::Timeout(_)) if left < connect_timeout => {
                            return Attempt::TimedOut { sent: false }
                        }
                        Err(error) => return Attempt::NotSent(req, error),
                    }
                }
            };
            let sender = match held {
                Held::Parked(socket) if native => {
                    sent.store(true, Ordering::Relaxed);
                    match http1::exchange(
                        socket,
                        &req,
                        req.body().whole_bytes(),
                        pool.max_response_headers(),
                    )
                    .await
                    {
                        Ok(response) => {
                            return match first_frame(response.map(Rest::Native), deadline).await {
                                Ok((response, at)) => {
                                    // The request is answered: its map can serve another.
                                    crate::spare::give_back(std::mem::take(req.headers_mut()));
                                    Attempt::Response(response, None, at)
                                }
                                Err(error) => Attempt::Failed(
                                    ErrorKind::Protocol,
                                    error,
                                    keep.then(|| Box::new(req)),
                                ),
                            };
                        }
                        Err(error) if error.nothing_sent() && fresh => {
                            sent.store(false, Ordering::Relaxed);
                            return Attempt::NotSent(req, ConnectError::Closed(error.into()));
                        }
                        // A stale keep-alive connection: same pod, another connection.
                        Err(error) if error.nothing_sent() => {
                            sent.store(false, Ordering::Relaxed);
                            stale += 1;
                        }
                        Err(error) if !fresh && resendable && error.died_before_response() => {
                            debug!(%addr, %error, "pooled connection died before a response; sending again on a fresh one");
                            stale = MAX_STALE;
                        }
                        Err(error) => {
                            let kind = if error.is_protocol() {
                                ErrorKind::Protocol
                            } else {
                                ErrorKind::Reset
                            };
                            return Attempt::Failed(
                                kind,
                                error.into(),
                                keep.then(|| Box::new(req)),
                            );
                        }
                    }
                    continue;
                }
                Held::Parked(socket) => match Box::pin(pool.drive(addr, socket)).await {
                    Ok(sender) => sender,
                    // The handshake writes nothing; it fails only if the runtime is shutting
                    // down. Try another connection.
                    Err(_) => {
                        stale += 1;
                        continue;
                    }
                },
                Held::Ready(sender) => sender,
            };
            let sending = by_hyper(
                sender,
                req,
                addr,
                Resend {
                    fresh,
                    resendable,
                    keep,
                },
                sent,
                deadline,
            );
            match Box::pin(sending).await {
                ByHyper::Done(attempt) => return attempt,
                ByHyper::Stale(back) => {
                    req = back;
                    stale += 1;
                }
                ByHyper::Again(back) => {
                    req = back;
                    stale = MAX_STALE;
                }
            }
        }
    }
}

/// What became of a request sent through hyper's client (see [`by_hyper`]).
enum ByHyper {
    Done(Attempt),
    /// A stale keep-alive connection refused it unsent: try another connection.
    Stale(Request<RequestBody>),
    /// The pooled connection died before a response: send it again on a fresh one.
    Again(Request<RequestBody>),
}

/// Whether and from what a request may be sent again when a pooled connection dies
/// under it.
struct Resend {
    /// The connection is new (a new one failing is the pod's failure).
    fresh: bool,
    /// The request may be sent twice ([`replayable`]).
    resendable: bool,
    /// The caller wants the request back if it fails after being sent (see
    /// [`attempt`]).
    keep: bool,
}

impl Resend {
    /// The request for the caller's retry on another pod, made from `again`, if the
    /// caller asked for it.
    fn hand_back(&self, again: Option<Replay>) -> Option<Box<Request<RequestBody>>> {
        again
            .filter(|_| self.keep)
            .map(|replay| Box::new(replay.request()))
    }
}

/// Send `req` through hyper's client connection `sender` (requests with bodies, and
/// connections hyper already drives): [`attempt`]'s rarer path, in a future of its own
/// that `attempt` boxes.
async fn by_hyper(
    mut sender: Sender,
    req: Request<RequestBody>,
    addr: SocketAddr,
    resend: Resend,
    sent: &AtomicBool,
    deadline: Instant,
) -> ByHyper {
    // hyper takes the request: what a resend on a fresh connection or a retry on
    // another pod needs is copied first, and only when either can happen.
    let resend_here = !resend.fresh && resend.resendable;
    let again = (resend_here || resend.keep).then(|| Replay::of(&req));
    sent.store(true, Ordering::Relaxed);
    match sender.try_send_request(req).await {
        Ok(response) => ByHyper::Done(
            match first_frame(response.map(Rest::Hyper), deadline).await {
                Ok((response, at)) => Attempt::Response(response, Some(sender), at),
                Err(error) => Attempt::Failed(ErrorKind::Protocol, error, resend.hand_back(again)),
            },
        ),
        Err(mut error) => match error.take_message() {
            Some(back) if resend.fresh => {
                sent.store(false, Ordering::Relaxed);
                ByHyper::Done(Attempt::NotSent(
                    back,
                    ConnectError::Closed(error.into_error().into()),
                ))
            }
            Some(back) => {
                // A stale keep-alive connection: same pod, fresh connection.
                sent.store(false, Ordering::Relaxed);
                ByHyper::Stale(back)
            }
            None => {
                let error = error.into_error();
                if client_body_failed(&error) {
                    return ByHyper::Done(Attempt::ClientBodyFailed(error));
                }
                match again {
                    Some(replay) if resend_here && died_before_response(&error) => {
                        debug!(%addr, error = describe(&error), "pooled connection died before a response; sending again on a fresh one");
                        ByHyper::Again(replay.request())
                    }
                    again => ByHyper::Done(Attempt::Failed(
                        error_kind(&error),
                        error.into(),
                        resend.hand_back(again),
                    )),
                }
            }
        },
    }
}

/// Where an attempt goes: the pool, the pod, and its time limits.
struct Upstream<'a> {
    pool: &'a Arc<ConnPool>,
    addr: SocketAddr,
    deadline: Instant,
    connect_timeout: Duration,
}

/// Send `req` to an h2c pod on a multiplexed connection (`upstream/h2.rs`): a stream on
/// a connection with room, or on a new one. A connection that was closing (GOAWAY, pod
/// gone) gives the request back untouched and another is tried. A request the pod
/// refused unprocessed (`REFUSED_STREAM`, above a graceful GOAWAY) comes back as not
/// sent, for another pod, when it can be sent again: without a body, or with a body
/// recorded within its limit (`RequestBody::recorded`). `keep` as for [`attempt`].
async fn by_h2(
    to: Upstream<'_>,
    req: Request<RequestBody>,
    keep: bool,
    sent: &AtomicBool,
) -> Attempt {
    // The request as any pod's attempt takes it, for sending it again.
    let head = Replay::of(&req);
    let mut req = req;
    for_h2(&mut req, to.addr);
    let recorded = match req.body() {
        RequestBody::Empty => Some(RequestBody::Empty),
        body => body.again(),
    };
    let mut closed = 0;
    loop {
        let seat = to.pool.h2.seat(to.addr);
        let left = to.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Attempt::TimedOut { sent: false };
        }
        let timeout = to.connect_timeout.min(left);
        let mut sender = match seat
            .sender(to.addr, to.pool.connect_socket(to.addr, timeout))
            .await
        {
            Ok(sender) => sender,
            Err(ConnectError::Timeout(_)) if left < to.connect_timeout => {
                return Attempt::TimedOut { sent: false }
            }
            Err(error) => return Attempt::NotSent(req, error),
        };
        sent.store(true, Ordering::Relaxed);
        let error = match sender.try_send_request(req).await {
            Ok(response) => {
                let response = response.map(|body| Rest::Multiplexed(body, seat));
                return match first_frame(response, to.deadline).await {
                    Ok((response, at)) => Attempt::Response(response, None, at),
                    Err(error) => Attempt::Failed(
                        ErrorKind::Protocol,
                        error,
                        keep.then(|| Box::new(head.request())),
                    ),
                };
            }
            Err(mut error) => match error.take_message() {
                Some(back) if closed < MAX_STALE => {
                    sent.store(false, Ordering::Relaxed);
                    req = back;
                    closed += 1;
                    continue;
                }
                Some(back) => {
                    sent.store(false, Ordering::Relaxed);
                    let error = ConnectError::Closed(error.into_error().into());
                    return Attempt::NotSent(back, error);
                }
                None => error.into_error(),
            },
        };
        if client_body_failed(&error) {
            return Attempt::ClientBodyFailed(error);
        }
        let unprocessed: Option<fn(hyper::Error) -> ConnectError> = if !seat.pod_spoke_h2() {
            Some(ConnectError::NotHttp2)
        } else if crate::upstream::h2::never_processed(&error) {
            Some(ConnectError::Refused)
        } else {
            None
        };
        if let (Some(why), Some(body)) = (unprocessed, recorded) {
            sent.store(false, Ordering::Relaxed);
            return Attempt::NotSent(head.request_with(body), why(error));
        }
        return Attempt::Failed(
            error_kind(&error),
            error.into(),
            keep.then(|| Box::new(head.request())),
        );
    }
}

/// The `grpc-status` of a pod's answer to a gRPC call, if it came with the headers
/// (Trailers-Only) or in trailers that were the body's first frame. A status that
/// follows messages is not waited for: the call's sample is its time to headers, and
/// its messages say the pod is serving it.
fn grpc_status(response: &Response<UpstreamBody>) -> Option<u8> {
    crate::forward::grpc::status(response.headers()).or_else(|| {
        response
            .body()
            .first_trailers()
            .and_then(crate::forward::grpc::status)
    })
}

/// `req` with its client body read through a record, if it has one.
fn record_body(req: Request<RequestBody>) -> Request<RequestBody> {
    let (parts, body) = req.into_parts();
    let body = match body {
        RequestBody::Client(body) => RequestBody::recorded(body),
        body => body,
    };
    Request::from_parts(parts, body)
}

/// Turn a request prepared for a pod ([`prepare`]) into one for an HTTP/2 pod: the
/// `Host` becomes the `:authority` (RFC 9113 §8.3.1), the target absolute, and a gRPC
/// call says `te: trailers`, which gRPC over HTTP/2 requires of clients and which
/// [`prepare`] removed with the hop-by-hop fields.
fn for_h2(req: &mut Request<RequestBody>, addr: SocketAddr) {
    let authority = req
        .headers_mut()
        .remove(HOST)
        .and_then(|host| Authority::try_from(host.as_bytes()).ok())
        .or_else(|| req.uri().authority().cloned())
        .or_else(|| Authority::try_from(addr.to_string()).ok());
    let mut parts = http::uri::Parts::default();
    parts.scheme = Some(Scheme::HTTP);
    parts.authority = authority;
    parts.path_and_query = Some(
        req.uri()
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/")),
    );
    if let Ok(uri) = Uri::from_parts(parts) {
        *req.uri_mut() = uri;
    }
    *req.version_mut() = Version::HTTP_2;
    let headers = req.headers_mut();
    headers.remove(TRANSFER_ENCODING);
    let grpc = headers
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    if grpc {
        headers.insert(TE, HeaderValue::from_static("trailers"));
    }
}

/// Split off the response's framing problems and wait briefly for its first body frame
/// (see [`FIRST_FRAME_WAIT`]); the response, and when its headers arrived.
///
/// A response with both `Transfer-Encoding` and `Content-Length` is framed by the
/// former, and the latter must not be passed on (RFC 9112 §6.3): the client would trust
/// a length the body does not have. Invalid lengths and codings the client could not be
/// told of are errors (`http1::check_length_fields`).
// Not an `async fn`: see above.
#[allow(clippy::manual_async_fn)]
fn first_frame(
    response: Response<Rest>,
    deadline: Instant,
) -> impl std::future::Future<Output = Result<(Response<UpstreamBody>, Instant), UpstreamError>> {
    // An async block for the reason `attempt` gives.
    async move {
        // The measurement ends here, not after the wait below.
        let headers_at = Instant::now();
        let (mut parts, mut rest) = response.into_parts();
        if let Rest::Hyper(body) = &rest {
            // The native exchange checked these while framing the body.
            http1::check_length_fields(&mut parts.headers, !body.is_end_stream())?;
        }
        let mut first = None;
        if !rest.is_end_stream() {
            // Usually the first frame came in the same read as the headers: take it without
            // arming a timer.
            let ready = std::future::poll_fn(|cx| {
                std::task::Poll::Ready(std::pin::Pin::new(&mut rest).poll_frame(cx))
            })
            .await;
            let frame = match ready {
                std::task::Poll::Ready(frame) => frame,
                std::task::Poll::Pending => {
                    let wait =
                        FIRST_FRAME_WAIT.min(deadline.saturating_duration_since(Instant::now()));
                    tokio::time::timeout(wait, rest.frame())
                        .await
                        .ok()
                        .flatten()
                }
            };
            match frame {
                Some(Ok(frame)) => first = Some(frame),
                Some(Err(error)) => return Err(error),
                None => {}
            }
        }
        Ok((
            Response::from_parts(parts, UpstreamBody::new(first, rest)),
            headers_at,
        ))
    }
}

/// Whether a pooled connection failed the way an idle close racing with reuse does:
/// closed or reset before a complete response head.
fn died_before_response(error: &hyper::Error) -> bool {
    if error.is_incomplete_message() || error.is_canceled() {
        return true;
    }
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            return http1::is_connection_break(io);
        }
        source = cause.source();
    }
    false
}

/// Whether the error came from the client's request body rather than the pod.
fn client_body_failed(error: &hyper::Error) -> bool {
    error.is_user()
        && std::error::Error::source(error)
            .is_some_and(|s| s.downcast_ref::<hyper::Error>().is_some())
}

fn error_kind(error: &hyper::Error) -> ErrorKind {
    if error.is_parse() || error.is_parse_status() || error.is_parse_too_large() || error.is_user()
    {
        ErrorKind::Protocol
    } else if error.is_timeout() {
        ErrorKind::Timeout
    } else {
        ErrorKind::Reset
    }
}

/// An error with its causes, `outer: inner: root`, for logs and error details.
pub(crate) fn describe(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// RFC 9110 §9.2.2 idempotent methods that are safe to replay.
fn is_idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

/// The headers by which a client says that its pod deduplicates the request, whatever
/// its method (draft-ietf-httpapi-idempotency-key-header; the second is the older
/// spelling, which Go's `net/http` honours too).
const IDEMPOTENCY_KEYS: [&str; 2] = ["idempotency-key", "x-idempotency-key"];

/// Whether `req` may reach a pod twice: sent again after the pod may have acted on it.
///
/// This is the one rule for every replay after bytes of a request were written: on a
/// fresh connection to the same pod when a reused one broke before any response byte
/// (a pod's idle close racing with the reuse), and on another pod (`keep`). It holds
/// when both
///
/// * the request is idempotent: by its method (RFC 9110 §9.2.2), or by an
///   [`IDEMPOTENCY_KEYS`] header with a value, by which the client declares that a
///   second copy does no harm (it would itself send the same request again with the
///   same key; Go's `Transport.shouldRetryRequest` trusts the key in the same way);
/// * and its body can be sent again as it was: none, or one the proxy read whole
///   (`http1/serve.rs` reads bodies up to 16 KiB whole), never a client's stream.
///
/// Any other request that was written, even in part, is answered `502` if no answer
/// came: RFC 9110 §9.2.2 and RFC 9112 §9.3.1 forbid replaying a non-idempotent request
/// unless the proxy knows it was never applied, and a connection that breaks after the
/// write cannot tell "closed before it saw the request" from "acted on it and died".
/// What the proxy can know is that nothing was written ([`http1::H1Error::nothing_sent`],
/// hyper giving the request back) or that the pod had closed the connection before the
/// write (`Held::closed_now`, asked of the socket just before writing such a request):
/// those are never sent, and go again whatever the method. What is left is a pod that
/// closes as the request comes: its FIN still on the wire when the request is written
/// (the one-way delay plus the microseconds between the check and the write), or its
/// server deciding to close just as the request arrives, and then resetting the
/// connection with the request unread. Neither can be told from a pod that read the
/// request and died, so both stay a `502` (in `tests/hardening.rs`'s race against a
/// 200 ms idle close on loopback, 2 POSTs in 950 under load, the one whose error was
/// kept reset with the request unread).
///
/// A bound on how long a pooled connection may have been idle before such a request
/// uses it would avoid those too, but only under the shortest idle timeout of the pods'
/// servers, which the proxy does not know (gunicorn 2 s, Node.js and uvicorn 5 s,
/// nginx 75 s, Go's none by default); and every POST after a pause that long would pay
/// a new connection (a handshake, a socket left in TIME_WAIT): for devices reporting
/// every few seconds, nearly every POST. It was not taken; the check costs one system
/// call per such request.
fn replayable(req: &Request<RequestBody>) -> bool {
    let idempotent = is_idempotent(req.method())
        || IDEMPOTENCY_KEYS.iter().any(|name| {
            req.headers()
                .get(*name)
                .is_some_and(|value| !value.is_empty())
        });
    let body_again = req.body().is_end_stream() || matches!(req.body(), RequestBody::Whole(_));
    idempotent && body_again
}

/// What is needed to send a request again: its head, and its body when the proxy read
/// it whole (a request with any other body is not sent again, see [`replayable`]).
/// The header lines are kept as a list (one allocation; names and values are shared,
/// not copied) and made into a map again only when the request is replayed, which is
/// rare.
pub(crate) struct Replay {
    method: Method,
    uri: Uri,
    headers: Vec<(HeaderName, HeaderValue)>,
    /// The body read whole, shared with the request's.
    whole: Option<Bytes>,
}

impl Replay {
    fn of(req: &Request<RequestBody>) -> Self {
        Self {
            method: req.method().clone(),
            uri: req.uri().clone(),
            headers: req
                .headers()
                .iter()
                .map(|(name, value)| (name.clone(), value.clone()))
                .collect(),
            whole: req.body().whole_shared(),
        }
    }

    fn request(&self) -> Request<RequestBody> {
        self.request_with(match &self.whole {
            Some(data) => RequestBody::whole(data.clone()),
            None => RequestBody::Empty,
        })
    }

    /// The request again, with `body`.
    fn request_with(&self, body: RequestBody) -> Request<RequestBody> {
        let mut req = Request::new(body);
        *req.method_mut() = self.method.clone();
        *req.uri_mut() = self.uri.clone();
        let headers = req.headers_mut();
        headers.reserve(self.headers.len());
        for (name, value) in &self.headers {
            headers.append(name.clone(), value.clone());
        }
        *req.version_mut() = Version::HTTP_11;
        req
    }
}

/// Turn the client's request into the request for the pod: hop-by-hop headers out,
/// forwarding headers in, origin-form URI, HTTP/1.1, `Host` kept (or taken from the
/// HTTP/2 `:authority`).
fn prepare(req: &mut Request<RequestBody>, client_ip: &HeaderValue) {
    let headers = req.headers_mut();
    strip_hop_by_hop(headers);
    add_forwarded(headers, client_ip);
    if let Some(authority) = req.uri().authority() {
        if !req.headers().contains_key(HOST) {
            if let Ok(host) = HeaderValue::from_str(authority.as_str()) {
                req.headers_mut().insert(HOST, host);
            }
        }
    }
    let uri = req.uri();
    if uri.scheme().is_some() || uri.authority().is_some() {
        *req.uri_mut() = match uri.path_and_query() {
            Some(pq) => Uri::from(pq.clone()),
            None => Uri::from_static("/"),
        };
    }
    *req.version_mut() = Version::HTTP_11;
    req.extensions_mut().clear();
    if let RequestBody::Client(body) = req.body() {
        if body.is_end_stream() {
            *req.body_mut() = RequestBody::Empty;
        } else if body.size_hint().exact().is_none() && !req.headers().contains_key(CONTENT_LENGTH)
        {
            // A body of unknown length goes chunked. Say so explicitly: hyper's client
            // would otherwise send a GET or HEAD body as no body at all.
            req.headers_mut()
                .insert(TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        }
    }
}

/// What [`Proxy::watched`] watches an attempt by.
struct Watch<'a> {
    /// The proxy's stall total when the attempt began (`client/stall.rs`).
    stall_start: Duration,
    slo: Duration,
    /// The request's deadline: no response headers by then is a timeout.
    deadline: Instant,
    /// Set by the attempt once its request begins to be written.
    sent: &'a AtomicBool,
    /// Who drops the attempt if it is dropped unanswered.
    dropped_by: DroppedBy,
}

/// Why a watched attempt would be dropped before its answer (see [`Abandoned`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DroppedBy {
    /// The client went away.
    Client,
    /// It is a hedged request's first copy and the hedge answered first: it has waited
    /// past its pod's own prediction and past the last moment another pod could still
    /// meet the SLO, so it is stored as a miss (whether it would have answered in the
    /// little time left, the proxy will not learn).
    Hedge,
    /// It is the hedge and the first copy answered first: no evidence against its pod.
    FirstCopy,
}

/// A moment a watched attempt is judged at (see [`Proxy::watched`]): `limit` after it
/// began, not counting the proxy's own stalls meanwhile.
struct Moment {
    limit: Duration,
    /// When to look next (a stall moves it on); `None` once reached.
    at: Option<Instant>,
}

impl Moment {
    fn new(start: Instant, limit: Duration) -> Self {
        Self {
            limit,
            at: Some(start + limit),
        }
    }

    /// Whether an attempt begun at `start`, unanswered at `now` after `waited` (its wait
    /// less the proxy's `stall`), reaches this moment now; if the stall explains the
    /// wait, the moment moves on by the stall instead.
    fn reached(&mut self, start: Instant, now: Instant, waited: Duration, stall: Duration) -> bool {
        if self.at.is_none_or(|at| now < at) {
            return false;
        }
        if waited <= self.limit {
            self.at = Some(start + self.limit + stall + Duration::from_millis(1));
            return false;
        }
        self.at = None;
        true
    }
}

/// The moments of a watched attempt, each judged once: the hedge, if the request has
/// one (`Picked::hedge_after`), overdue (the SLO), then hung ([`unanswered_limit`]).
struct Waits {
    hedge: Option<Moment>,
    overdue: Moment,
    hung: Moment,
}

impl Waits {
    fn new(picked: &Picked, slo: Duration, hedge_after: Option<Duration>) -> Self {
        Self {
            hedge: hedge_after.map(|after| Moment::new(picked.at, after)),
            overdue: Moment::new(picked.at, slo),
            hung: Moment::new(picked.at, unanswered_limit(picked.route().settings())),
        }
    }

    /// The next moment to look at, the deadline at the latest.
    fn next(&self, deadline: Instant) -> Instant {
        [
            self.hedge.as_ref().and_then(|h| h.at),
            self.overdue.at,
            self.hung.at,
        ]
        .into_iter()
        .flatten()
        .fold(deadline, Instant::min)
    }
}

/// How a watch of an attempt ended.
// As large as an `Attempt`, which it carries on every request: boxing it would add an
// allocation to each.
#[allow(clippy::large_enum_variant)]
enum Watched {
    Done(Attempt),
    /// The hedge's moment came with the attempt still unanswered; it goes on.
    HedgeDue,
}

/// Dropped with `armed` set when the client went away (HTTP/1 close, h2 reset) while an
/// attempt was waiting for response headers: the wait so far is still a measurement.
struct Abandoned<'a> {
    proxy: &'a Proxy,
    picked: &'a Picked,
    service: &'a ServiceMetrics,
    stall_start: Duration,
    armed: bool,
    dropped_by: DroppedBy,
}

impl Drop for Abandoned<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let now = Instant::now();
        let stall = self.proxy.stall_total(now).saturating_sub(self.stall_start);
        let endpoint = &self.picked.endpoint().id;
        let waited_ms = now.saturating_duration_since(self.picked.at).as_millis() as u64;
        if self.dropped_by == DroppedBy::Client {
            debug!(service = self.service.label(), %endpoint, waited_ms,
                "the client went away before the endpoint answered");
            self.service.abandoned();
        } else {
            debug!(service = self.service.label(), %endpoint, waited_ms,
                "the other copy of the hedged request answered first");
            self.service.outraced();
        }
        let router = &self.proxy.router;
        let change = match self.dropped_by {
            DroppedBy::Hedge => router.record_overdue(self.picked, now),
            DroppedBy::Client | DroppedBy::FirstCopy => {
                router.record_abandoned(self.picked, now, stall)
            }
        };
        if let Some(change) = change {
            self.proxy.pool_changed(self.service, endpoint, change);
        }
    }
}

/// A hedged request's first attempt, while the hedge races it.
struct Leg<'a, 'w> {
    picked: &'a Picked,
    endpoint: &'a Arc<EndpointMetrics>,
    attempt_start: Instant,
    watch: Watch<'w>,
    waits: &'a mut Waits,
}

/// What a hedge's race needs to know of the request.
struct Race<'a> {
    service: &'a Arc<ServiceMetrics>,
    port: Option<PortRef<'a>>,
    grpc: bool,
    /// The time the request has, and whether it is a call's own deadline ([`Place`]).
    limit: Duration,
    call_deadline: bool,
    connect_timeout: Duration,
}

/// The second copy of a hedged request (see [`Proxy::hedge`]).
struct Hedged {
    picked: Picked,
    endpoint: Arc<EndpointMetrics>,
    start: Instant,
    stall_start: Duration,
    /// Its attempt is the one gone on with: it answered first, or the first copy
    /// failed and it ended after.
    chosen: bool,
}

/// The answer to give when no further attempt is made, and the endpoint it is counted
/// against.
struct Failure {
    refusal: Refusal,
    endpoint: Arc<EndpointMetrics>,
}

/// One request over its attempts: what [`Proxy::forward`]'s retry loop carries from
/// one attempt to the next.
struct Call<'k> {
    start: Instant,
    key: &'k ServiceKey,
    port: Option<PortRef<'k>>,
    client_version: Version,
    grpc: bool,
    /// The call's own `grpc-timeout`, which bounds it as well as the service's timeout.
    grpc_timeout: Option<Duration>,
    /// Whether the request may reach a pod twice ([`replayable`]).
    replayable: bool,
    /// Pods tried so far, not picked again.
    tried: Vec<EndpointId>,
    /// Set by the first attempt: the start plus the time the request has.
    deadline: Option<Instant>,
    /// Set by the first attempt: the service's metrics.
    service: Option<Arc<ServiceMetrics>>,
    /// The last attempt's failure: the answer when no pod is left to retry on.
    failure: Option<Failure>,
    retries_done: u32,
}

/// What one attempt leaves [`Proxy::forward`]'s loop to do.
enum Step {
    /// Answer the client with this.
    Answer(Response<ResponseBody>),
    /// Try another pod with the request, handed back unsent.
    Retry(Request<RequestBody>),
}

/// An attempt made: its pod, and what the service's settings gave it.
struct Tried {
    picked: Picked,
    service: Arc<ServiceMetrics>,
    endpoint: Arc<EndpointMetrics>,
    attempt_start: Instant,
    /// The proxy's stall total when the attempt began (`client/stall.rs`).
    stall_start: Duration,
    /// The service's `timeout`, `retries` and latency SLO.
    timeout: Duration,
    retries: u32,
    slo: Duration,
    /// The time the request had: `timeout`, or the call's own deadline if sooner.
    limit: Duration,
}

/// What the client gets from a pod's answer once its outcome is recorded.
struct Answer {
    start: Instant,
    attempt_start: Instant,
    /// When the response headers arrived.
    now: Instant,
    slo: Duration,
    /// Its status or gRPC code is in the service's failure set.
    failed: bool,
    client_version: Version,
    grpc: bool,
}

impl Proxy {
    pub(crate) fn pick(
        &self,
        key: &ServiceKey,
        port: Option<PortRef<'_>>,
        now: Instant,
        exclude: &[EndpointId],
    ) -> Result<Picked, PickError> {
        with_rng(|rng| self.router.pick(key, port, now, rng, exclude))
    }

    /// [`Proxy::pick`] for a tunnel (`Router::pick_long_lived`).
    pub(crate) fn pick_long_lived(
        &self,
        key: &ServiceKey,
        port: Option<PortRef<'_>>,
        now: Instant,
        exclude: &[EndpointId],
    ) -> Result<Picked, PickError> {
        with_rng(|rng| self.router.pick_long_lived(key, port, now, rng, exclude))
    }

    /// Count and log a QoS-pool membership change.
    pub(crate) fn pool_changed(
        &self,
        service: &ServiceMetrics,
        endpoint: &str,
        change: PoolChange,
    ) {
        self.metrics.pool_change(service, change);
        match change {
            PoolChange::Evicted => info!(
                service = service.label(),
                endpoint,
                "endpoint left the QoS pool: its measured response times miss the latency SLO"
            ),
            PoolChange::Readmitted => info!(
                service = service.label(),
                endpoint, "endpoint rejoined the QoS pool: its probes meet the latency SLO again"
            ),
        }
    }

    /// Report an attempt's outcome, with the proxy's own stall since `stall_start`.
    fn record(
        &self,
        picked: &Picked,
        service: &ServiceMetrics,
        now: Instant,
        outcome: Outcome,
        stall_start: Duration,
    ) {
        let stall = self.stall_total(now).saturating_sub(stall_start);
        if let Some(change) = self.router.record_stalled(picked, now, outcome, stall) {
            self.pool_changed(service, &picked.endpoint().id, change);
        }
    }

    /// Run one attempt on `picked`, watching it: once it has gone without response
    /// headers for longer than the SLO (plus any stall of the proxy meanwhile), a miss
    /// is stored at that moment; once it has gone [`unanswered_limit`] without them, the
    /// pod is judged as hung if it answered nothing else meanwhile; so a pod that hangs
    /// leaves the pool in a fraction of a second rather than one `timeout`. When the
    /// request's `deadline` passes, the attempt is dropped and times out (`sent`: whether
    /// its request had begun to be written); if the client goes away first and this
    /// future is dropped, "no answer after T" is stored (see [`Abandoned`]). One timer
    /// serves every moment, moved on from one to the next. A request with a hedge
    /// (`waits.hedge`) is handed back at its moment, its attempt still running, for
    /// [`Proxy::hedge`] to race it.
    async fn watched(
        &self,
        picked: &Picked,
        service: &ServiceMetrics,
        watch: &Watch<'_>,
        waits: &mut Waits,
        mut attempt: std::pin::Pin<&mut impl std::future::Future<Output = Attempt>>,
    ) -> Watched {
        let mut abandoned = Abandoned {
            proxy: self,
            picked,
            service,
            stall_start: watch.stall_start,
            armed: true,
            dropped_by: watch.dropped_by,
        };
        let timer = tokio::time::sleep_until(waits.next(watch.deadline).into());
        tokio::pin!(timer);
        let result = loop {
            tokio::select! {
                biased;
                result = attempt.as_mut() => break Watched::Done(result),
                () = timer.as_mut() => {
                    let now = Instant::now();
                    if now >= watch.deadline {
                        let sent = watch.sent.load(Ordering::Relaxed);
                        break Watched::Done(Attempt::TimedOut { sent });
                    }
                    if self.judge_wait(picked, service, watch.stall_start, waits, now) {
                        break Watched::HedgeDue;
                    }
                    timer.as_mut().reset(waits.next(watch.deadline).into());
                }
            }
        };
        abandoned.armed = false;
        result
    }

    /// An attempt still without response headers at `now`: store the overdue miss once
    /// it has waited longer than the SLO, then judge its pod once it has waited the
    /// unanswered limit, neither counting the proxy's own stalls since `stall_start`.
    /// Whether the hedge's moment came (once).
    fn judge_wait(
        &self,
        picked: &Picked,
        service: &ServiceMetrics,
        stall_start: Duration,
        waits: &mut Waits,
        now: Instant,
    ) -> bool {
        let stall = self.stall_total(now).saturating_sub(stall_start);
        let waited = now
            .saturating_duration_since(picked.at)
            .saturating_sub(stall);
        let hedge_due = waits
            .hedge
            .as_mut()
            .is_some_and(|hedge| hedge.reached(picked.at, now, waited, stall));
        if hedge_due {
            waits.hedge = None;
        }
        let endpoint = &picked.endpoint().id;
        if waits.overdue.reached(picked.at, now, waited, stall) {
            debug!(service = service.label(), %endpoint, slo = ?waits.overdue.limit,
                "no response headers within the SLO: counted as a miss now");
            service.overdue();
            if let Some(change) = self.router.record_overdue(picked, now) {
                self.pool_changed(service, endpoint, change);
            }
        }
        if waits.hung.reached(picked.at, now, waited, stall) {
            if let Some(change) = self.router.record_unanswered(picked, now) {
                info!(service = service.label(), %endpoint, waited = ?waits.hung.limit,
                    "endpoint answered nothing while a request waited: taken out of the QoS pool as hung");
                self.metrics.pool_change(service, change);
            }
        }
        hedge_due
    }

    /// Send the request of a late first attempt to a second pod as well
    /// ([`Router::pick_hedge`](proxima_core::Router::pick_hedge), at the moment
    /// `Picked::hedge_after` set) and go on with the copy that answers first; the other
    /// is dropped (see [`DroppedBy`] for what is stored of it). A copy that fails first
    /// is recorded as any failed attempt and the other is waited for. No hedge
    /// (and the first copy is waited for alone) when the retry budget refuses it or no
    /// other member can take it. The hedge is sent only for a request that may reach a
    /// pod twice (`replayable`), so either pod may act on it.
    async fn hedge(
        &self,
        first: Leg<'_, '_>,
        // `dyn`: a second instance of `watched` for the hedge's rare path leaves the
        // common one inlined into `forward` (one call site: 0.3-0.4% of the
        // instructions per HTTP/1.1 request, `benches/load/instructions.sh`).
        mut sent: std::pin::Pin<&mut (dyn std::future::Future<Output = Attempt> + Send)>,
        replay: Option<Replay>,
        race: Race<'_>,
    ) -> (Attempt, Option<Hedged>) {
        let now = Instant::now();
        let route = first.picked.route();
        let second = match replay {
            Some(replay) if route.retry_budget().try_retry(now) => self
                .router
                .pick_hedge(first.picked, race.port, now)
                .map(|picked| (picked, replay)),
            Some(_) => {
                race.service.retry_refused();
                None
            }
            None => None,
        };
        let Some((picked, replay)) = second else {
            let alone = self.watched_to_end(
                first.picked,
                race.service,
                &first.watch,
                first.waits,
                std::pin::Pin::new(&mut sent),
            );
            return (alone.await, None);
        };
        race.service.pick(Reason::Hedge);
        debug!(service = race.service.label(), late = %first.picked.endpoint().id,
            hedge = %picked.endpoint().id, "request late: sent to a second pod as well");
        let endpoint = race.service.endpoint(&picked.endpoint().id);
        let stall_start = self.stall_total(now);
        let written = AtomicBool::new(false);
        let hedge_sent = attempt(
            &self.pool,
            picked.addr,
            picked.protocol,
            replay.request(),
            first.watch.deadline,
            race.connect_timeout,
            true,
            &written,
        );
        tokio::pin!(hedge_sent);
        let mut hedge_sent: std::pin::Pin<&mut (dyn std::future::Future<Output = Attempt> + Send)> =
            hedge_sent;
        let watch = Watch {
            stall_start,
            slo: first.watch.slo,
            deadline: first.watch.deadline,
            sent: &written,
            dropped_by: DroppedBy::FirstCopy,
        };
        let mut waits = Waits::new(&picked, watch.slo, None);
        let first_watch = Watch {
            dropped_by: DroppedBy::Hedge,
            ..first.watch
        };
        let (attempt, chosen) = {
            let one = self.watched_to_end(
                first.picked,
                race.service,
                &first_watch,
                first.waits,
                std::pin::Pin::new(&mut sent),
            );
            let two = self.watched_to_end(
                &picked,
                race.service,
                &watch,
                &mut waits,
                std::pin::Pin::new(&mut hedge_sent),
            );
            tokio::pin!(one, two);
            tokio::select! {
                a = one.as_mut() => match a {
                    a @ Attempt::Response(..) => (a, false),
                    a => {
                        let (start, stall) = (first.attempt_start, first.watch.stall_start);
                        self.settle_lost(first.picked, first.endpoint, &a, start, stall, &race);
                        (two.as_mut().await, true)
                    }
                },
                b = two.as_mut() => match b {
                    b @ Attempt::Response(..) => (b, true),
                    b => {
                        self.settle_lost(&picked, &endpoint, &b, now, stall_start, &race);
                        (one.as_mut().await, false)
                    }
                },
            }
        };
        let hedged = Hedged {
            picked,
            endpoint,
            start: now,
            stall_start,
            chosen,
        };
        (attempt, Some(hedged))
    }

    /// [`Proxy::watched`] to the attempt's end, past its hedge's moment if it has one.
    async fn watched_to_end(
        &self,
        picked: &Picked,
        service: &ServiceMetrics,
        watch: &Watch<'_>,
        waits: &mut Waits,
        mut attempt: std::pin::Pin<&mut impl std::future::Future<Output = Attempt>>,
    ) -> Attempt {
        loop {
            let watched = self.watched(picked, service, watch, waits, attempt.as_mut());
            if let Watched::Done(attempt) = watched.await {
                return attempt;
            }
        }
    }

    /// Record a hedged request's copy that failed while the other still waits.
    fn settle_lost(
        &self,
        picked: &Picked,
        endpoint: &EndpointMetrics,
        attempt: &Attempt,
        attempt_start: Instant,
        stall_start: Duration,
        race: &Race<'_>,
    ) {
        let (ended, now) = attempt.ended(attempt_start, race.grpc);
        let place = Place {
            endpoint: &picked.endpoint().id,
            addr: picked.addr,
            limit: race.limit,
            call_deadline: race.call_deadline,
        };
        let verdict = verdict::judge(&ended, place, picked.route().settings());
        if let Some(outcome) = verdict.outcome {
            self.record(picked, race.service, now, outcome, stall_start);
        }
        if let Some(kind) = verdict.error {
            endpoint.error(kind);
        }
        debug!(service = race.service.label(), endpoint = %picked.endpoint().id, ?ended,
            "a copy of a hedged request failed; waiting for the other");
    }

    /// Answer a request that names no routable service or is malformed.
    fn refuse(
        &self,
        status: StatusCode,
        error: &str,
        service: &str,
        detail: &str,
    ) -> Response<ResponseBody> {
        self.metrics.unrouted(status);
        debug!(status = status.as_u16(), service, detail, "request refused");
        reply::error(status, error, service, detail)
    }

    fn give_up(
        &self,
        service: &ServiceMetrics,
        failure: Failure,
        start: Instant,
    ) -> Response<ResponseBody> {
        failure.endpoint.failed_request();
        service.request_duration(start.elapsed());
        service.slo(false);
        let Refusal {
            status,
            error,
            detail,
            ..
        } = failure.refusal;
        reply::error(status, error, service.label(), &detail)
    }

    /// Log an attempt that brought no answer; its failure, for the client if no other
    /// pod answers.
    fn failed(
        &self,
        service: &ServiceMetrics,
        picked: &Picked,
        refusal: Refusal,
        endpoint: Arc<EndpointMetrics>,
    ) -> Failure {
        warn!(
            service = service.label(),
            endpoint = %picked.endpoint().id,
            addr = %picked.addr,
            detail = %refusal.detail,
            "{}",
            refusal.log
        );
        Failure { refusal, endpoint }
    }

    /// The pod's answer on its way to the client, its outcome recorded: metrics, the
    /// debug line, hop-by-hop headers off, and the finish that returns the connection.
    fn deliver(
        &self,
        picked: Picked,
        service: Arc<ServiceMetrics>,
        endpoint: Arc<EndpointMetrics>,
        response: Response<UpstreamBody>,
        sender: Option<Sender>,
        answer: Answer,
    ) -> Response<ResponseBody> {
        let latency = answer.now.saturating_duration_since(answer.attempt_start);
        let code = answer.grpc.then(|| grpc_status(&response)).flatten();
        if code.is_some() {
            service.grpc_status(code);
        }
        endpoint.upstream_duration(latency);
        let (mut parts, body) = response.into_parts();
        endpoint.response(parts.status);
        let elapsed = answer.now.saturating_duration_since(answer.start);
        service.request_duration(elapsed);
        // A failure status misses the SLO however fast it came.
        service.slo(elapsed <= answer.slo && !answer.failed);
        debug!(
            service = service.label(),
            endpoint = %picked.endpoint().id,
            status = parts.status.as_u16(),
            latency_us = latency.as_micros() as u64,
            "forwarded"
        );
        strip_hop_by_hop(&mut parts.headers);
        parts.version = answer.client_version;
        let finish = Finish {
            connection: self.pool.lease(picked.addr, sender),
            picked,
            metrics: endpoint,
            // Its status is still to come, in trailers.
            grpc: (answer.grpc && code.is_none()).then(|| service.clone()),
        };
        Response::from_parts(parts, ResponseBody::upstream(body, finish))
    }

    /// Forward one client request (see the module docs): refuse it, open its tunnel,
    /// or try pods until one attempt answers it.
    ///
    /// An async block, as [`attempt`] is, so that its arguments are stored once.
    // Not an `async fn`: see above.
    #[allow(clippy::manual_async_fn)]
    pub(crate) fn forward(
        self: Arc<Self>,
        mut req: Request<RequestBody>,
        target: Result<Target, BadTarget>,
        client_ip: HeaderValue,
    ) -> impl std::future::Future<Output = Response<ResponseBody>> {
        async move {
            let start = Instant::now();
            if crate::client::give_way::request_begins(start) {
                self.metrics.worker_yielded();
            }
            let target = match self.screen(&req, target) {
                Ok(target) => target,
                Err(refused) => return *refused,
            };
            let port = split_port(target.raw.to_str().unwrap_or_default(), target.source)
                .ok()
                .and_then(|(_, port)| port);
            let key = &*target.key;
            if let Some(asked) = crate::forward::tunnel::asked(&req) {
                return self.tunnel(req, key, port, asked, &client_ip, start).await;
            }
            if req.method() == Method::CONNECT {
                return self.refuse(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "method not allowed",
                    &target.key.to_string(),
                    "CONNECT tunnels are not supported (HTTP/2 extended CONNECT is, RFC 8441)",
                );
            }
            let grpc = crate::forward::grpc::is_call(req.headers());
            let mut call = Call {
                start,
                key,
                port,
                client_version: req.version(),
                grpc,
                grpc_timeout: grpc
                    .then(|| crate::forward::grpc::timeout(req.headers()))
                    .flatten(),
                replayable: false,
                tried: Vec::new(),
                deadline: None,
                service: None,
                failure: None,
                retries_done: 0,
            };
            prepare(&mut req, &client_ip);
            call.replayable = replayable(&req);
            // Each turn is one attempt: its pod picked (`pick_next`), sent and watched
            // here, raced by a hedge if one comes due, then judged and acted on
            // (`conclude`). The awaits and the attempt's state stay in this loop's own
            // future: an attempt future of its own, or its setup returned as one value,
            // is moved whole: +1.3% and +1.9% instructions per HTTP/1.1 request
            // (`benches/load/instructions.sh`).
            loop {
                // The first attempt starts with the request (a clock read saved).
                let mut attempt_start = if call.tried.is_empty() {
                    start
                } else {
                    Instant::now()
                };
                let mut picked = match self.pick_next(&mut call, &req, attempt_start) {
                    Ok(picked) => picked,
                    Err(answer) => return *answer,
                };
                let service = call
                    .service
                    .get_or_insert_with(|| self.metrics.service(picked.route().key()))
                    .clone();
                let settings = picked.route().settings();
                let (timeout, connect_timeout, retries, slo) = (
                    settings.timeout,
                    settings.connect_timeout,
                    settings.retries,
                    settings.latency_slo,
                );
                // A gRPC call's own deadline bounds it too.
                let limit = call.grpc_timeout.map_or(timeout, |t| t.min(timeout));
                let deadline = *call.deadline.get_or_insert(start + limit);
                // Kept for a retry on another pod only when one can follow.
                let keep = call.replayable
                    && call.retries_done < retries
                    && picked.route().eligible().len() > 1;
                // A late first attempt may be sent to a second pod as well; its copy of
                // the request is made now, as the attempt takes the request.
                let hedge_after = (keep && call.tried.is_empty())
                    .then(|| picked.hedge_after(attempt_start))
                    .flatten();
                let replay = hedge_after.map(|_| Replay::of(&req));
                service.pick(picked.reason);
                let mut endpoint = service.endpoint(&picked.endpoint().id);

                crate::spans::record_attempt(&picked.endpoint().id, call.retries_done + 1);
                let mut stall_start = self.stall_total(attempt_start);
                // Pinned here and watched by reference: a future taken by value would be
                // stored twice in `watched`'s state (argument and pinned local), and each
                // copy of this one is moved with every move of the request's future.
                let written = AtomicBool::new(false);
                if picked.protocol == PortProtocol::H2c && call.retries_done < retries {
                    // A pod may refuse the stream unprocessed; its body is then sent to
                    // the next pod (`RequestBody::recorded`).
                    req = record_body(req);
                }
                let sent = attempt(
                    &self.pool,
                    picked.addr,
                    picked.protocol,
                    req,
                    deadline,
                    connect_timeout,
                    keep,
                    &written,
                );
                tokio::pin!(sent);
                let watch = Watch {
                    stall_start,
                    slo,
                    deadline,
                    sent: &written,
                    dropped_by: DroppedBy::Client,
                };
                let mut waits = Waits::new(&picked, slo, hedge_after);
                // The common path moves the attempt once; a hedge's bookkeeping stays
                // in its own branch (moving the attempt through tuples cost 1% of the
                // instructions per HTTP/1.1 request).
                let watched = self
                    .watched(&picked, &service, &watch, &mut waits, sent.as_mut())
                    .await;
                let attempt = match watched {
                    Watched::Done(attempt) => attempt,
                    Watched::HedgeDue => {
                        let first = Leg {
                            picked: &picked,
                            endpoint: &endpoint,
                            attempt_start,
                            watch,
                            waits: &mut waits,
                        };
                        let race = Race {
                            service: &service,
                            port: call.port,
                            grpc: call.grpc,
                            limit,
                            call_deadline: limit < timeout,
                            connect_timeout,
                        };
                        // Boxed: the rare path, whose second attempt would otherwise
                        // make every request's future as large as two.
                        let (attempt, hedge) =
                            Box::pin(self.hedge(first, sent.as_mut(), replay, race)).await;
                        // A hedge counts as a retry; the copy gone on with is the one
                        // that answered first (or failed last).
                        if let Some(hedge) = hedge {
                            call.retries_done += 1;
                            if hedge.chosen {
                                call.tried.push(picked.endpoint().id.clone());
                                picked = hedge.picked;
                                endpoint = hedge.endpoint;
                                (attempt_start, stall_start) = (hedge.start, hedge.stall_start);
                            } else {
                                call.tried.push(hedge.picked.endpoint().id.clone());
                            }
                        }
                        attempt
                    }
                };
                let tried = Tried {
                    picked,
                    service,
                    endpoint,
                    attempt_start,
                    stall_start,
                    timeout,
                    retries,
                    slo,
                    limit,
                };
                match self.conclude(&mut call, tried, attempt) {
                    Step::Answer(response) => return response,
                    Step::Retry(back) => req = back,
                }
            }
        }
    }

    /// The next pod for `call`, not one tried already; the answer instead when none is
    /// left (boxed: the rare path). The first pick counts the request in the service's
    /// retry budget and keeps its shape for the probes.
    fn pick_next(
        &self,
        call: &mut Call<'_>,
        req: &Request<RequestBody>,
        attempt_start: Instant,
    ) -> Result<Picked, Box<Response<ResponseBody>>> {
        let picked = match self.pick(call.key, call.port, attempt_start, &call.tried) {
            Ok(picked) => picked,
            Err(error) => return Err(Box::new(self.nowhere_left(call, error))),
        };
        if call.service.is_none() {
            picked.route().retry_budget().record_request(attempt_start);
            self.probe_shapes
                .remember(picked.route(), req, attempt_start);
        }
        Ok(picked)
    }

    /// Judge how the attempt ended ([`verdict::judge`], the pure classification), report
    /// what the router and the metrics learn from it, and [`settle`](Self::settle) what
    /// follows.
    // Inlined: `attempt` holds the pod's response head, which a call would copy (twice,
    // with `settle`): 1.4% of the instructions per HTTP/1.1 request.
    #[inline(always)]
    fn conclude(&self, call: &mut Call<'_>, plan: Tried, attempt: Attempt) -> Step {
        let place = Place {
            endpoint: &plan.picked.endpoint().id,
            addr: plan.picked.addr,
            limit: plan.limit,
            call_deadline: plan.limit < plan.timeout,
        };
        let (ended, now) = attempt.ended(plan.attempt_start, call.grpc);
        let verdict = verdict::judge(&ended, place, plan.picked.route().settings());
        if let Some(outcome) = verdict.outcome {
            self.record(&plan.picked, &plan.service, now, outcome, plan.stall_start);
        }
        if let Some(kind) = verdict.error {
            plan.endpoint.error(kind);
        }
        let answer = Answer {
            start: call.start,
            attempt_start: plan.attempt_start,
            now,
            slo: plan.slo,
            failed: false,
            client_version: call.client_version,
            grpc: call.grpc,
        };
        self.settle(call, verdict.next, attempt, plan, answer)
    }

    /// No pod left to pick: the last attempt's failure if there was one, else why the
    /// service has none.
    fn nowhere_left(&self, call: &mut Call<'_>, error: PickError) -> Response<ResponseBody> {
        match (&call.service, call.failure.take()) {
            (Some(service), Some(failure)) => self.give_up(service, failure, call.start),
            _ => self.no_endpoint(call.key, error, call.start),
        }
    }

    /// What follows an attempt whose verdict says `next`: the pod's answer delivered,
    /// the client's own fault answered, or the request handed back for another pod when
    /// the verdict, the retry policy and the retry budget allow one; otherwise the
    /// failure's answer.
    #[inline(always)]
    fn settle(
        &self,
        call: &mut Call<'_>,
        next: Next,
        attempt: Attempt,
        plan: Tried,
        mut answer: Answer,
    ) -> Step {
        let Tried {
            picked,
            service,
            endpoint,
            retries,
            ..
        } = plan;
        let give_up = |failure| Step::Answer(self.give_up(&service, failure, call.start));
        let (failure, back) = match (next, attempt) {
            (Next::Deliver { failed }, Attempt::Response(response, sender, _)) => {
                answer.failed = failed;
                let response = self.deliver(picked, service, endpoint, response, sender, answer);
                return Step::Answer(response);
            }
            (Next::ClientFault, Attempt::ClientBodyFailed(error)) => {
                return Step::Answer(answer_client_body_failed(&service, &error));
            }
            (Next::Retry(refusal), attempt) => {
                let failure = self.failed(&service, &picked, refusal, endpoint);
                match attempt.into_request() {
                    Some(back) => (failure, back),
                    None => return give_up(failure),
                }
            }
            (Next::GiveUp(refusal), _) => {
                return give_up(self.failed(&service, &picked, refusal, endpoint));
            }
            // `judge` delivers only answers and blames the client only for its body;
            // were that ever broken, the client still gets an answer.
            (next, _) => {
                error!(?next, "an attempt's verdict does not fit how it ended");
                let refusal = Refusal {
                    status: StatusCode::BAD_GATEWAY,
                    error: "proxy error",
                    detail: "the proxy could not tell how the attempt ended".into(),
                    log: "an attempt's verdict does not fit how it ended",
                };
                return give_up(Failure { refusal, endpoint });
            }
        };
        if !may_retry(&service, &picked, call.retries_done, retries) {
            return give_up(failure);
        }
        call.retries_done += 1;
        service.retry();
        call.tried.push(picked.endpoint().id.clone());
        call.failure = Some(failure);
        Step::Retry(back)
    }

    /// The service `target` names, or the answer refusing the request: its headers are
    /// too large, or it names no routable service (boxed: the rare path).
    fn screen(
        &self,
        req: &Request<RequestBody>,
        target: Result<Target, BadTarget>,
    ) -> Result<Target, Box<Response<ResponseBody>>> {
        let size = header_bytes(req.headers());
        if size > self.config.max_header_bytes {
            let detail = format!(
                "the request headers take {size} bytes; the limit is {}",
                self.config.max_header_bytes
            );
            return Err(Box::new(self.refuse(
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "request headers too large",
                "",
                &detail,
            )));
        }
        target.map_err(|bad| {
            let detail = match bad.error {
                TargetError::Missing => format!(
                    "name the service in the `{}` header (name[.namespace][:port]) or in Host",
                    self.config.service_header
                ),
                TargetError::Invalid(why) => format!("{why}: {:?}", bad.named),
            };
            Box::new(self.refuse(
                StatusCode::BAD_REQUEST,
                "no service named",
                &bad.named,
                &detail,
            ))
        })
    }

    /// Answer a request for which the first pick found nothing.
    pub(crate) fn no_endpoint(
        &self,
        key: &ServiceKey,
        error: PickError,
        start: Instant,
    ) -> Response<ResponseBody> {
        let name = key.to_string();
        match error {
            PickError::UnknownService => self.refuse(
                StatusCode::NOT_FOUND,
                "unknown service",
                &name,
                &format!("no service {} in namespace {}", key.name, key.namespace),
            ),
            PickError::UnknownPort(port) => {
                self.metrics.service(key).answered(StatusCode::NOT_FOUND);
                reply::error(
                    StatusCode::NOT_FOUND,
                    "unknown port",
                    &name,
                    &format!("service {name} has no port {port}"),
                )
            }
            PickError::NoEndpoints => {
                let service = self.metrics.service(key);
                service.answered(StatusCode::SERVICE_UNAVAILABLE);
                service.request_duration(start.elapsed());
                service.slo(false);
                warn!(service = %name, "no ready endpoints");
                reply::error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "no ready endpoints",
                    &name,
                    &format!("service {name} has no ready endpoint to take the request"),
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;

    use crate::upstream::pool::PoolBounds;

    /// A pool as the proxy's, with a 60 s idle timeout and metrics of its own.
    fn pool() -> Arc<ConnPool> {
        crate::upstream::pool::pool_of(PoolBounds {
            per_endpoint: 8,
            total: 8,
            buffered: 8,
        })
    }

    /// `method /` with `body` read whole (as `http1/serve.rs` hands small bodies on)
    /// and the extra `headers`.
    fn request(
        method: Method,
        body: &'static str,
        headers: &[(&str, &str)],
    ) -> Request<RequestBody> {
        let mut req = Request::builder()
            .method(method)
            .uri("/")
            .header("host", "api")
            .header("content-length", body.len());
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        req.body(RequestBody::whole(Bytes::from_static(body.as_bytes())))
            .unwrap()
    }

    /// One request as a blocking pod reads it: the head and the body its
    /// `content-length` declares, as text.
    fn read_request(stream: &mut std::net::TcpStream) -> String {
        let mut data = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(end) = data.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&data[..end]).to_ascii_lowercase();
                let length: usize = head
                    .lines()
                    .find_map(|line| line.strip_prefix("content-length:"))
                    .map_or(0, |v| v.trim().parse().unwrap());
                if data.len() >= end + 4 + length {
                    return String::from_utf8_lossy(&data).into_owned();
                }
            }
            let n = stream.read(&mut chunk).unwrap();
            assert!(n > 0, "the proxy closed before a whole request");
            data.extend_from_slice(&chunk[..n]);
        }
    }

    /// A POST taken from the pool onto a connection its pod closed while the worker was
    /// busy (its reactor not polled since, so the runtime has not heard of the FIN)
    /// goes on a fresh connection: nothing was written on the closed one, and the pod
    /// gets the POST exactly once. Before the pooled socket was asked directly, the POST
    /// was written on the closed connection and failed with `502`, since it may not be
    /// sent twice.
    #[test]
    fn a_post_on_a_pooled_connection_its_pod_closed_unheard_goes_on_a_fresh_one() {
        let pod = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = pod.local_addr().unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let pool = pool();
            let socket = pool
                .connect_socket(addr, Duration::from_secs(5))
                .await
                .unwrap();
            let (kept_alive, _) = pod.accept().unwrap();
            // From here until the POST is written nothing awaits, so the runtime's
            // reactor is not polled: a worker busy with other tasks.
            drop(kept_alive);
            let mut fin = libc::pollfd {
                fd: socket.as_raw_fd(),
                events: libc::POLLRDHUP,
                revents: 0,
            };
            // Wait (a bound, not a pause) until the pod's FIN is in the proxy's socket.
            // SAFETY: one pollfd, for a socket open while it is borrowed here.
            let arrived = unsafe { libc::poll(&mut fin, 1, 10_000) };
            assert_eq!(arrived, 1, "the pod's close did not reach the socket");
            pool.lease(addr, None).release_socket(Some(socket));

            let answering = std::thread::spawn(move || {
                let (mut stream, _) = pod.accept().unwrap();
                let seen = read_request(&mut stream);
                stream
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                    .unwrap();
                (seen, pod, stream)
            });
            let sent = AtomicBool::new(false);
            let deadline = Instant::now() + Duration::from_secs(10);
            let req = request(Method::POST, "reading 2", &[]);
            let attempt = attempt(
                &pool,
                addr,
                PortProtocol::Http1,
                req,
                deadline,
                Duration::from_secs(5),
                false,
                &sent,
            )
            .await;
            match &attempt {
                Attempt::Response(response, ..) => assert_eq!(response.status(), 200),
                Attempt::Failed(_, error, _) => panic!("failed: {error}"),
                _ => panic!("neither answered nor failed"),
            }
            let (seen, pod, _stream) = answering.join().unwrap();
            assert!(seen.starts_with("POST / HTTP/1.1\r\n"), "{seen}");
            assert!(seen.ends_with("\r\n\r\nreading 2"), "{seen}");
            // No third connection: the POST went once, on the fresh one.
            pod.set_nonblocking(true).unwrap();
            assert!(pod.accept().is_err(), "another connection came");
        });
    }

    #[test]
    fn what_may_reach_a_pod_twice() {
        let with =
            |method, body, headers: &[(&str, &str)]| replayable(&request(method, body, headers));
        // Idempotent methods, with no body or one read whole.
        assert!(with(Method::GET, "", &[]));
        assert!(with(Method::PUT, "state", &[]));
        // POST only with an idempotency key that has a value.
        assert!(!with(Method::POST, "reading", &[]));
        assert!(!with(Method::POST, "", &[]));
        assert!(with(
            Method::POST,
            "reading",
            &[("idempotency-key", "\"k-1\"")]
        ));
        assert!(with(Method::PATCH, "x", &[("x-idempotency-key", "k-2")]));
        assert!(!with(Method::POST, "reading", &[("idempotency-key", "")]));
    }

    #[test]
    fn idempotent_methods() {
        for m in [
            Method::GET,
            Method::HEAD,
            Method::OPTIONS,
            Method::TRACE,
            Method::PUT,
            Method::DELETE,
        ] {
            assert!(is_idempotent(&m), "{m}");
        }
        for m in [Method::POST, Method::PATCH, Method::CONNECT] {
            assert!(!is_idempotent(&m), "{m}");
        }
    }

    #[test]
    fn a_replay_sends_the_same_head_again() {
        let original = Request::builder()
            .method(Method::PUT)
            .uri("/a/b?c=d")
            .header("host", "api")
            .header("x-a", "1")
            .header("accept", "text/plain")
            .header("x-a", "2")
            .body(RequestBody::Empty)
            .unwrap();
        let again = Replay::of(&original).request();
        assert_eq!(again.method(), Method::PUT);
        assert_eq!(again.uri(), "/a/b?c=d");
        assert_eq!(again.version(), Version::HTTP_11);
        let lines = |r: &Request<RequestBody>| -> Vec<(String, String)> {
            r.headers()
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_string()))
                .collect()
        };
        assert_eq!(lines(&again), lines(&original));
        assert_eq!(again.headers().get_all("x-a").iter().count(), 2);
    }
}
