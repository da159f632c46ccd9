//! The body of a request on its way to a pod. It is its own module because both the
//! connection pool (whose connections send it) and the response path need its type,
//! and the pool must not depend on the response path (which hands connections back to
//! the pool).
//!
//! A body sent to an HTTP/2 pod may be recorded ([`RequestBody::recorded`]): its frames
//! are kept as they pass, up to [`REPLAY_LIMIT`] bytes, so that a request the pod
//! refused unprocessed (`REFUSED_STREAM`, GOAWAY) can go to another pod with its body
//! (`upstream/h2.rs`). gRPC calls are such requests: each carries a body. The limit is
//! Envoy's idea (`per_request_buffer_limit_bytes`): a larger body is passed on without
//! being kept, and its request is not sent again.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

/// What `poll_frame` returns for a client's request body: hyper's frames and errors.
type PolledFrame = Poll<Option<Result<Frame<Bytes>, hyper::Error>>>;

/// The most bytes of a body kept for sending it again.
pub(crate) const REPLAY_LIMIT: usize = 64 * 1024;

/// Body of a request on its way to a pod: the client's body, or nothing (requests
/// without a body, and replays of them), or the client's body read through a record,
/// or a small body the proxy's own HTTP/1.1 loop read whole (`http1/serve.rs`).
#[derive(Debug)]
pub(crate) enum RequestBody {
    Client(Incoming),
    Empty,
    Recorded(Reader),
    Whole(Whole),
}

/// A body read whole before its request is forwarded. Never empty (an empty body is
/// [`RequestBody::Empty`]); it can be read again from the start, as a recorded one.
#[derive(Debug)]
pub(crate) struct Whole {
    data: Bytes,
    sent: bool,
}

impl Whole {
    fn poll_frame(&mut self) -> PolledFrame {
        if self.sent {
            return Poll::Ready(None);
        }
        self.sent = true;
        Poll::Ready(Some(Ok(Frame::data(self.data.clone()))))
    }
}

/// One reading of a recorded body: from its first frame, the client's body being read
/// on once the recorded frames are used up.
#[derive(Debug)]
pub(crate) struct Reader {
    record: Arc<Mutex<Record>>,
    /// Recorded frames this reading has passed on.
    next: usize,
    /// This reading has passed on the end (and the trailers, if any).
    done: bool,
    hint: SizeHint,
}

#[derive(Debug)]
struct Record {
    source: Incoming,
    frames: Vec<Bytes>,
    kept: usize,
    /// More than the limit has been read: the record cannot be read again.
    overflow: bool,
    trailers: Option<HeaderMap>,
    ended: bool,
}

impl RequestBody {
    /// `data`, read whole: [`RequestBody::Empty`] when there is none.
    pub(crate) fn whole(data: Bytes) -> Self {
        if data.is_empty() {
            return RequestBody::Empty;
        }
        RequestBody::Whole(Whole { data, sent: false })
    }

    /// Read `body` through a record, so that it can be sent again (see the module docs).
    pub(crate) fn recorded(body: Incoming) -> Self {
        let hint = body.size_hint();
        RequestBody::Recorded(Reader {
            record: Arc::new(Mutex::new(Record {
                source: body,
                frames: Vec::new(),
                kept: 0,
                overflow: false,
                trailers: None,
                ended: false,
            })),
            next: 0,
            done: false,
            hint,
        })
    }

    /// The bytes of a body read whole; none for any other.
    pub(crate) fn whole_bytes(&self) -> &[u8] {
        match self {
            RequestBody::Whole(whole) => &whole.data,
            _ => &[],
        }
    }

    /// The bytes of a body read whole, shared (for sending it again); none for any
    /// other.
    pub(crate) fn whole_shared(&self) -> Option<Bytes> {
        match self {
            RequestBody::Whole(whole) => Some(whole.data.clone()),
            _ => None,
        }
    }

    /// A new reading of this body from its start, if it is recorded and within the
    /// limit (the attempt that had it is over, or will read no more).
    pub(crate) fn again(&self) -> Option<Self> {
        let reader = match self {
            RequestBody::Recorded(reader) => reader,
            RequestBody::Whole(whole) => return Some(Self::whole(whole.data.clone())),
            _ => return None,
        };
        let overflow = reader
            .record
            .lock()
            .map(|record| record.overflow)
            .unwrap_or(true);
        (!overflow).then(|| {
            RequestBody::Recorded(Reader {
                record: reader.record.clone(),
                next: 0,
                done: false,
                hint: reader.hint,
            })
        })
    }
}

impl Reader {
    fn poll_frame(&mut self, cx: &mut Context<'_>) -> PolledFrame {
        let Ok(mut record) = self.record.lock() else {
            return Poll::Ready(None);
        };
        if let Some(data) = record.frames.get(self.next) {
            self.next += 1;
            return Poll::Ready(Some(Ok(Frame::data(data.clone()))));
        }
        if self.done {
            return Poll::Ready(None);
        }
        if record.ended {
            self.done = true;
            return Poll::Ready(record.trailers.clone().map(|t| Ok(Frame::trailers(t))));
        }
        let polled = Pin::new(&mut record.source).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    record.kept += data.len();
                    if record.kept > REPLAY_LIMIT {
                        record.overflow = true;
                        record.frames = Vec::new();
                    } else {
                        record.frames.push(data.clone());
                        self.next = record.frames.len();
                    }
                } else if let Some(trailers) = frame.trailers_ref() {
                    record.trailers = Some(trailers.clone());
                    record.ended = true;
                    self.done = true;
                }
            }
            Poll::Ready(None) => {
                record.ended = true;
                self.done = true;
            }
            Poll::Ready(Some(Err(_))) => record.overflow = true,
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.done
            || self.record.lock().is_ok_and(|record| {
                self.next >= record.frames.len()
                    && (record.ended && record.trailers.is_none()
                        || !record.ended && record.source.is_end_stream())
            })
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> PolledFrame {
        match self.get_mut() {
            RequestBody::Client(body) => Pin::new(body).poll_frame(cx),
            RequestBody::Empty => Poll::Ready(None),
            RequestBody::Recorded(reader) => reader.poll_frame(cx),
            RequestBody::Whole(whole) => whole.poll_frame(),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RequestBody::Client(body) => body.is_end_stream(),
            RequestBody::Empty => true,
            RequestBody::Recorded(reader) => reader.is_end_stream(),
            RequestBody::Whole(whole) => whole.sent,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RequestBody::Client(body) => body.size_hint(),
            RequestBody::Empty => SizeHint::with_exact(0),
            RequestBody::Recorded(reader) => reader.hint,
            RequestBody::Whole(whole) if whole.sent => SizeHint::with_exact(0),
            RequestBody::Whole(whole) => SizeHint::with_exact(whole.data.len() as u64),
        }
    }
}
