//! Responses the proxy writes itself: errors, always
//! `{"error": "...", "service": "...", "detail": "..."}` as `application/json`, except to
//! gRPC clients, who cannot read that: they get the same error as a gRPC status
//! ([`to_grpc`]).

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Response, StatusCode};

use crate::forward::body::ResponseBody;

/// An error answer: status, a short fixed `error`, the service as the client named it
/// (or empty) and a `detail` sentence.
pub(crate) fn error(
    status: StatusCode,
    error: &str,
    service: &str,
    detail: &str,
) -> Response<ResponseBody> {
    let body = serde_json::json!({
        "error": error,
        "service": service,
        "detail": detail,
    });
    // Serialising a map of strings cannot fail; an empty body would still be an answer.
    let bytes = serde_json::to_vec(&body).unwrap_or_default();
    let mut response = Response::new(ResponseBody::full(Bytes::from(bytes)));
    *response.status_mut() = status;
    response.extensions_mut().insert(ProxyMade {
        detail: detail.to_string(),
    });
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// Marks an answer the proxy made itself (not a pod's), with its detail sentence.
#[derive(Clone, Debug)]
pub(crate) struct ProxyMade {
    detail: String,
}

/// Whether a request is a gRPC call: HTTP/2 with `content-type: application/grpc` (or
/// `application/grpc+proto` and the like).
pub(crate) fn is_grpc<B>(req: &http::Request<B>) -> bool {
    req.version() == http::Version::HTTP_2 && crate::forward::grpc::is_call(req.headers())
}

/// The gRPC status code for an error status of the proxy's own (gRPC's
/// `doc/statuscodes.md` names; its `doc/http-grpc-status-mapping.md` maps a plain HTTP
/// answer, and this follows it except where the proxy knows more: a `504` is the proxy's
/// own deadline passing, so DEADLINE_EXCEEDED rather than UNAVAILABLE; a `400` is a call
/// that named no valid service, INVALID_ARGUMENT rather than INTERNAL; limits passed
/// are RESOURCE_EXHAUSTED).
fn grpc_code(status: StatusCode) -> u8 {
    match status.as_u16() {
        400 => 3,              // INVALID_ARGUMENT
        404 | 405 | 501 => 12, // UNIMPLEMENTED
        413 | 414 | 431 => 8,  // RESOURCE_EXHAUSTED
        429 | 502 | 503 => 14, // UNAVAILABLE
        504 => 4,              // DEADLINE_EXCEEDED
        _ => 2,                // UNKNOWN
    }
}

/// Turn an answer the proxy made into a gRPC "Trailers-Only" answer (gRPC's
/// `doc/PROTOCOL-HTTP2.md`): `200`, `content-type: application/grpc`, `grpc-status` and
/// `grpc-message` (percent-encoded) in the headers, no body. A pod's answer is left as it
/// is; so is `retry-after` (gRPC clients ignore it, but it does no harm).
pub(crate) fn to_grpc(response: &mut Response<ResponseBody>) {
    let Some(made) = response.extensions_mut().remove::<ProxyMade>() else {
        return;
    };
    let code = grpc_code(response.status());
    *response.status_mut() = StatusCode::OK;
    *response.body_mut() = ResponseBody::full(Bytes::new());
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert("grpc-status", HeaderValue::from(u16::from(code)));
    if let Ok(message) = HeaderValue::from_str(&percent_encode(&made.detail)) {
        headers.insert("grpc-message", message);
    }
}

/// gRPC's `grpc-message` encoding: bytes outside printable ASCII, and `%`, as `%XX`.
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if (0x20..=0x7e).contains(&byte) && byte != b'%' {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_errors_become_grpc_statuses_and_pod_answers_do_not() {
        let mut answer = error(
            StatusCode::GATEWAY_TIMEOUT,
            "upstream timeout",
            "api",
            "50% of «it» timed out",
        );
        to_grpc(&mut answer);
        assert_eq!(answer.status(), StatusCode::OK);
        assert_eq!(answer.headers()["content-type"], "application/grpc");
        assert_eq!(answer.headers()["grpc-status"], "4");
        assert_eq!(
            answer.headers()["grpc-message"],
            "50%25 of %C2%ABit%C2%BB timed out"
        );
        for (status, code) in [
            (503, "14"),
            (502, "14"),
            (404, "12"),
            (400, "3"),
            (431, "8"),
            (500, "2"),
        ] {
            let mut answer = error(StatusCode::from_u16(status).unwrap(), "e", "", "d");
            to_grpc(&mut answer);
            assert_eq!(answer.headers()["grpc-status"], code, "{status}");
        }
        let mut from_pod = Response::new(ResponseBody::full(Bytes::from_static(b"x")));
        *from_pod.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        to_grpc(&mut from_pod);
        assert_eq!(from_pod.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(from_pod.headers().get("grpc-status").is_none());
    }
}
