//! `protocol: grpc` clients: unary gRPC calls in wire form (no protobuf, no tonic:
//! the payload is opaque bytes), all on the client's one HTTP/2 connection to its
//! proxy, so the proxy, not the connection, decides which pod answers each call.
//!
//! A call is `POST <path>` with `content-type: application/grpc`, `te: trailers` and
//! one length-prefixed message (flag 0, 4-byte big-endian length, the client's `body`
//! or `ping`). Its outcome is the `grpc-status` of the trailers, or of the headers of a
//! Trailers-Only answer (how the proxy reports its own errors to gRPC clients).

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method};
use http_body_util::BodyExt;

use super::{local_addr, Answer, ClientRun, HttpClient};

/// The payload of a call when the client gives no `body`.
const DEFAULT_PAYLOAD: &[u8] = b"ping";
/// `grpc-status` UNKNOWN: what a `200` without any `grpc-status` counts as.
const UNKNOWN: u8 = 2;

/// One call and its whole answer; `None` when none came.
pub(super) async fn call(run: &ClientRun, client: &HttpClient) -> Option<Answer> {
    let payload = run
        .spec
        .body
        .as_deref()
        .map_or(DEFAULT_PAYLOAD, str::as_bytes);
    let mut request = run.request(Method::POST, message(payload));
    let headers = request.headers_mut();
    headers.insert("content-type", HeaderValue::from_static("application/grpc"));
    headers.insert("te", HeaderValue::from_static("trailers"));
    let response = client.request(request).await.ok()?;
    let status = response.status().as_u16();
    let instance = run.instance_of(response.headers());
    let local = local_addr(&response);
    let in_headers = grpc_status(response.headers());
    let body = response.into_body().collect().await.ok()?;
    let in_trailers = body.trailers().and_then(grpc_status);
    let grpc_status = in_headers
        .or(in_trailers)
        .or((status == 200).then_some(UNKNOWN));
    Some(Answer {
        status,
        grpc_status,
        instance,
        local,
    })
}

/// `payload` as one gRPC message: flag 0 (not compressed), length, bytes.
fn message(payload: &[u8]) -> Bytes {
    let length = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    let mut framed = Vec::with_capacity(5 + payload.len());
    framed.push(0);
    framed.extend_from_slice(&length.to_be_bytes());
    framed.extend_from_slice(payload);
    framed.into()
}

/// The `grpc-status` in `headers`, if any (a code that is not a number counts as
/// UNKNOWN).
fn grpc_status(headers: &HeaderMap) -> Option<u8> {
    let value = headers.get("grpc-status")?;
    Some(
        value
            .to_str()
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(UNKNOWN),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_length_prefixed_and_statuses_read() {
        assert_eq!(&message(b"hi")[..], b"\0\0\0\0\x02hi");
        let mut headers = HeaderMap::new();
        assert_eq!(grpc_status(&headers), None);
        headers.insert("grpc-status", HeaderValue::from_static("14"));
        assert_eq!(grpc_status(&headers), Some(14));
        headers.insert("grpc-status", HeaderValue::from_static("oops"));
        assert_eq!(grpc_status(&headers), Some(UNKNOWN));
    }
}
