//! The body of a request on its way to a pod. It is its own module because both the
//! connection pool (whose connections send it) and the response path need its type,
//! and the pool must not depend on the response path (which hands connections back to
//! the pool).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

/// What `poll_frame` returns for a client's request body: hyper's frames and errors.
type PolledFrame = Poll<Option<Result<Frame<Bytes>, hyper::Error>>>;

/// Body of a request on its way to a pod: the client's body, or nothing (requests
/// without a body, and replays of them).
#[derive(Debug)]
pub(crate) enum RequestBody {
    Client(Incoming),
    Empty,
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> PolledFrame {
        match self.get_mut() {
            RequestBody::Client(body) => Pin::new(body).poll_frame(cx),
            RequestBody::Empty => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RequestBody::Client(body) => body.is_end_stream(),
            RequestBody::Empty => true,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RequestBody::Client(body) => body.size_hint(),
            RequestBody::Empty => SizeHint::with_exact(0),
        }
    }
}
