//! Response bodies, streamed frame by frame (never buffered whole); the request's is in
//! `request_body`.
//!
//! [`ResponseBody`] wraps a pod's response body and holds the attempt's
//! [`Picked`](proxima_core::Picked) until the body has been streamed to the end: the
//! endpoint's in-flight count, which power-of-two-choices reads, must cover the whole
//! transfer and not only the wait for headers. When the body ends, the upstream
//! connection's [`Lease`] is released, telling the pool whether the exchange completed
//! (the pool keeps it for reuse, within its bounds) or broke off (client gone, pod
//! reset: the pool closes it).
//!
//! A pod's body may begin with a frame the proxy already read ([`UpstreamBody`]): before
//! answering, `forward::attempt` waits a moment for the first frame so that a body that
//! is broken from its first byte becomes a `502` rather than a cut-off answer. The rest
//! comes through hyper's client or the proxy's own exchange (`http1/mod.rs`); the latter
//! holds its socket until the body ends, and hands it back only if it may carry
//! another request.
//!
//! Every response also holds the client connection's [`InFlight`] mark, and its place
//! under the proxy's concurrency limit (see `client/server.rs`), until it has been sent or
//! dropped (see `client/conn.rs`).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use proxima_core::Picked;
use tokio::sync::OwnedSemaphorePermit;

use crate::client::conn::InFlight;
use crate::http1::{NativeBody, UpstreamError};
use crate::metrics::{EndpointMetrics, ErrorKind, ServiceMetrics};
use crate::upstream::h2::Seat;
use crate::upstream::pool::Lease;

/// What `poll_frame` returns for a pod's response body.
type ResponseFrame = Poll<Option<Result<Frame<Bytes>, UpstreamError>>>;

/// What to do once a pod's response body has been streamed.
#[derive(Debug)]
pub(crate) struct Finish {
    /// Keeps the endpoint's in-flight count until the body is done.
    pub(crate) picked: Picked,
    /// The connection the response came on; the pool decides whether it is kept.
    pub(crate) connection: Lease,
    pub(crate) metrics: Arc<EndpointMetrics>,
    /// A gRPC call whose `grpc-status` is still to come (in trailers): counted here.
    pub(crate) grpc: Option<Arc<ServiceMetrics>>,
}

impl Finish {
    /// Count the call's `grpc-status` from a frame of its body, if it is trailers.
    fn saw(&mut self, frame: &Frame<Bytes>) {
        if let (Some(service), Some(trailers)) = (&self.grpc, frame.trailers_ref()) {
            service.grpc_status(crate::forward::grpc::status(trailers));
            self.grpc = None;
        }
    }

    fn complete(self, clean: bool, body: &mut UpstreamBody) {
        if let (Some(service), true) = (&self.grpc, clean) {
            tracing::debug!(
                service = service.label(),
                endpoint = %self.picked.endpoint().id,
                "gRPC answer ended without grpc-status (its client reads INTERNAL)"
            );
            service.grpc_status(None);
        }
        body.release(self.connection, clean);
        // Dropping `picked` ends the in-flight count.
    }
}

/// A pod's response body, possibly with its first frame already read.
#[derive(Debug)]
pub(crate) struct UpstreamBody {
    first: Option<Frame<Bytes>>,
    pub(crate) rest: Rest,
    /// Whether frames were handed on since the pod's body last had nothing ready.
    burst: bool,
    /// The pod's body broke right after frames that the server may not have written
    /// yet; handed on at the next poll (see `ResponseBody::poll_frame`).
    held_error: Option<UpstreamError>,
}

impl UpstreamBody {
    pub(crate) fn new(first: Option<Frame<Bytes>>, rest: Rest) -> Self {
        Self {
            first,
            rest,
            burst: false,
            held_error: None,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none() && self.held_error.is_none() && self.rest.is_end_stream()
    }

    /// The body's first frame, if it was read already and is trailers (a gRPC answer
    /// with no message).
    pub(crate) fn first_trailers(&self) -> Option<&http::HeaderMap> {
        self.first.as_ref().and_then(Frame::trailers_ref)
    }

    /// The exchange is over: give its connection back through `lease`, to be kept if
    /// the body was read to its end (`clean`) and the connection allows it.
    pub(crate) fn release(&mut self, lease: Lease, clean: bool) {
        match &mut self.rest {
            Rest::Hyper(_) => lease.release(clean),
            // Its stream's place is given back with the body.
            Rest::Multiplexed(..) => drop(lease),
            Rest::Native(body) => lease.release_socket(body.reusable().filter(|_| clean)),
        }
    }
}

/// The part of a pod's body still to be read: through hyper's client, or the proxy's
/// own exchange.
#[derive(Debug)]
pub(crate) enum Rest {
    Hyper(Incoming),
    Native(NativeBody),
    /// A stream of an HTTP/2 connection, holding its place on it until dropped.
    Multiplexed(Incoming, #[allow(dead_code)] Seat),
}

impl Body for Rest {
    type Data = Bytes;
    type Error = UpstreamError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> ResponseFrame {
        match self.get_mut() {
            Rest::Hyper(body) | Rest::Multiplexed(body, _) => {
                Pin::new(body).poll_frame(cx).map_err(UpstreamError::Hyper)
            }
            Rest::Native(body) => body.poll_frame(cx).map_err(UpstreamError::Native),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Rest::Hyper(body) | Rest::Multiplexed(body, _) => body.is_end_stream(),
            Rest::Native(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Rest::Hyper(body) | Rest::Multiplexed(body, _) => body.size_hint(),
            Rest::Native(body) => body.size_hint(),
        }
    }
}

/// Body of a response to a client: a pod's body streamed through, or a small body
/// the proxy wrote itself (errors).
#[derive(Debug)]
pub struct ResponseBody {
    kind: Kind,
    /// The request's mark on its client connection, released with the body.
    in_flight: Option<InFlight>,
    /// The request's place under the proxy's concurrency limit, released with the body.
    admission: Option<OwnedSemaphorePermit>,
}

#[derive(Debug)]
enum Kind {
    /// Boxed: a response moves by value through every future between the pod and the
    /// client connection (five or six copies), and the pod's body and its finish are
    /// 432 bytes of the 576 a response would otherwise be; one allocation from the
    /// thread's cache costs less than copying them each time (`benches/README.md`).
    Upstream(Box<Upstream>),
    Full(Option<Bytes>),
}

#[derive(Debug)]
struct Upstream {
    body: UpstreamBody,
    finish: Option<Finish>,
}

impl ResponseBody {
    pub(crate) fn full(data: Bytes) -> Self {
        Self {
            kind: Kind::Full((!data.is_empty()).then_some(data)),
            in_flight: None,
            admission: None,
        }
    }

    pub(crate) fn upstream(body: UpstreamBody, finish: Finish) -> Self {
        Self {
            kind: Kind::Upstream(Box::new(Upstream {
                body,
                finish: Some(finish),
            })),
            in_flight: None,
            admission: None,
        }
    }

    /// Hold the request's mark on its client connection until the body is done; a pod's
    /// body counts as streaming (watched for stalls) from now on.
    pub(crate) fn hold(&mut self, in_flight: InFlight) {
        let in_flight = match &self.kind {
            Kind::Upstream(up) if !up.body.is_end_stream() => in_flight.streaming(),
            _ => in_flight,
        };
        self.in_flight = Some(in_flight);
    }

    /// The response head's fields, if they came raw from the proxy's own exchange with
    /// the pod (`http1::RawFields`): taken, so that nothing else writes them.
    pub(crate) fn take_raw_fields(&mut self) -> Option<Box<crate::http1::RawFields>> {
        match &mut self.kind {
            Kind::Upstream(up) => match &mut up.body.rest {
                Rest::Native(native) => native.raw.take(),
                Rest::Hyper(_) | Rest::Multiplexed(..) => None,
            },
            Kind::Full(_) => None,
        }
    }

    /// Hold the request's place under the concurrency limit until the body is done, so
    /// that a response still streaming counts as in flight.
    pub(crate) fn admit(&mut self, permit: OwnedSemaphorePermit) {
        self.admission = Some(permit);
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = UpstreamError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> ResponseFrame {
        match &mut self.get_mut().kind {
            Kind::Full(data) => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            Kind::Upstream(up) => {
                let Upstream { body, finish } = &mut **up;
                if let Some(error) = body.held_error.take() {
                    return Poll::Ready(Some(Err(error)));
                }
                if let Some(first) = body.first.take() {
                    if let Some(f) = finish {
                        f.saw(&first);
                    }
                    if body.rest.is_end_stream() {
                        if let Some(f) = finish.take() {
                            f.complete(true, body);
                        }
                    }
                    body.burst = true;
                    return Poll::Ready(Some(Ok(first)));
                }
                let polled = Pin::new(&mut body.rest).poll_frame(cx);
                match &polled {
                    Poll::Pending => body.burst = false,
                    Poll::Ready(Some(Ok(frame))) => {
                        body.burst = true;
                        if let Some(f) = finish {
                            f.saw(frame);
                        }
                    }
                    _ => {}
                }
                match &polled {
                    Poll::Ready(None) => {
                        if let Some(f) = finish.take() {
                            f.complete(true, body);
                        }
                    }
                    Poll::Ready(Some(Ok(_))) if body.rest.is_end_stream() => {
                        if let Some(f) = finish.take() {
                            f.complete(true, body);
                        }
                    }
                    Poll::Ready(Some(Err(error))) => {
                        if let Some(f) = finish.take() {
                            tracing::debug!(
                                service = %f.picked.route().key(),
                                endpoint = %f.picked.endpoint().id,
                                %error,
                                "upstream response body broke off"
                            );
                            f.metrics.error(ErrorKind::Reset);
                            f.complete(false, body);
                        }
                        if body.burst {
                            // hyper's server drops what it has not written yet when a
                            // body fails, and the frames just handed on may be in that
                            // (the head too): the client would get a bare close. Let it
                            // write them first, then fail.
                            body.burst = false;
                            if let Poll::Ready(Some(Err(error))) = polled {
                                body.held_error = Some(error);
                            }
                            cx.waker().wake_by_ref();
                            return Poll::Pending;
                        }
                    }
                    _ => {}
                }
                polled
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Full(data) => data.is_none(),
            Kind::Upstream(up) => up.body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Full(data) => SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64)),
            Kind::Upstream(up) => {
                let body = &up.body;
                let rest = body.rest.size_hint();
                let first = body
                    .first
                    .as_ref()
                    .and_then(Frame::data_ref)
                    .map_or(0, |d| d.len() as u64);
                let mut hint = SizeHint::new();
                hint.set_lower(rest.lower().saturating_add(first));
                if let Some(upper) = rest.upper() {
                    hint.set_upper(upper.saturating_add(first));
                }
                hint
            }
        }
    }
}

impl Drop for ResponseBody {
    fn drop(&mut self) {
        if let Kind::Upstream(up) = &mut self.kind {
            let Upstream { body, finish } = &mut **up;
            if let Some(f) = finish.take() {
                // Bodies that end without a final poll (empty, HEAD, 204, 304) are
                // complete; anything else was cut off and its connection is unusable.
                let clean = body.is_end_stream();
                f.complete(clean, body);
            }
        }
    }
}
