//! gRPC answers of an emulated pod, in the wire form of the gRPC-over-HTTP/2 protocol
//! (no protobuf: payloads are opaque bytes), so that the proxy's gRPC handling (per-call
//! balancing, `grpc-status` as the outcome) is exercised by real calls without tonic.
//!
//! A call is answered `200`, `content-type: application/grpc`, one length-prefixed
//! message (the request's first message echoed) and the trailers `grpc-status: 0`. A
//! failing pod answers "Trailers-Only" (headers with `grpc-status: 14` UNAVAILABLE and
//! a `grpc-message`, no body), as a gRPC server whose dependency is down does; a request
//! whose body holds no whole message gets `grpc-status: 3` INVALID_ARGUMENT.

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Incoming;

use super::{empty, BoxError, NoResponse, ResponseBody};

/// Bytes before a message: the compressed flag (1) and the length (4, big-endian).
const PREFIX: usize = 5;

/// Whether `request` is a gRPC call (`content-type: application/grpc` or
/// `application/grpc+proto` and the like).
pub(super) fn is_call<B>(request: &Request<B>) -> bool {
    request
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"))
}

/// The answer of a failing pod (whatever HTTP status it fails with): UNAVAILABLE.
pub(super) fn failing(status: StatusCode) -> Response<ResponseBody> {
    let message = format!("failing (emulated HTTP {})", status.as_u16());
    trailers_only(14, &message)
}

/// The call's first message back, then `grpc-status: 0`.
pub(super) async fn echo(request: Request<Incoming>) -> Result<Response<ResponseBody>, NoResponse> {
    let body = request.into_body().collect().await?.to_bytes();
    let Some(message) = first_message(&body) else {
        return Ok(trailers_only(3, "the request holds no whole gRPC message"));
    };
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    let frames: [Result<Frame<Bytes>, BoxError>; 2] =
        [Ok(Frame::data(message)), Ok(Frame::trailers(trailers))];
    let mut response = Response::new(StreamBody::new(futures_util::stream::iter(frames)).boxed());
    response
        .headers_mut()
        .insert(CONTENT_TYPE, grpc_content_type());
    Ok(response)
}

/// The first length-prefixed message of `body`, prefix included.
fn first_message(body: &Bytes) -> Option<Bytes> {
    let length = body.get(1..PREFIX)?;
    let length = u32::from_be_bytes(length.try_into().ok()?) as usize;
    body.get(..PREFIX + length)
        .map(|_| body.slice(..PREFIX + length))
}

/// Headers only, ending the stream: `grpc-status` and `grpc-message` in them.
fn trailers_only(code: u8, message: &str) -> Response<ResponseBody> {
    let mut response = empty();
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, grpc_content_type());
    headers.insert("grpc-status", HeaderValue::from(u16::from(code)));
    if let Ok(message) = HeaderValue::from_str(message) {
        headers.insert("grpc-message", message);
    }
    response
}

fn grpc_content_type() -> HeaderValue {
    HeaderValue::from_static("application/grpc")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_whole_message_is_found() {
        let body = Bytes::from_static(b"\0\0\0\0\x02hiMORE");
        assert_eq!(
            first_message(&body).as_deref(),
            Some(&b"\0\0\0\0\x02hi"[..])
        );
        assert_eq!(first_message(&Bytes::from_static(b"\0\0\0\0\x09hi")), None);
        assert_eq!(first_message(&Bytes::from_static(b"\0\0")), None);
        let call = Request::post("/x.Y/Z")
            .header(CONTENT_TYPE, "application/grpc+proto")
            .body(())
            .unwrap();
        assert!(is_call(&call));
        assert!(!is_call(&Request::get("/").body(()).unwrap()));
    }
}
