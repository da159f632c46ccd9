//! The admin endpoints themselves: plain functions from a request to a response.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, LengthLimitError};
use hyper::body::Body;
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use prometheus::{Encoder, TextEncoder};
use tower_http::BoxError;

use crate::{AdminState, NodeEndpoints};

type Reply = Response<Full<Bytes>>;

/// What the admin server sends: a [`Reply`], or an answer of the layers in front of
/// the handlers.
pub(crate) type AdminBody = UnsyncBoxBody<Bytes, BoxError>;

const INDEX: &str = "proxima admin\n\
\n\
/metrics       Prometheus metrics\n\
/healthz       liveness: 200 while the process serves\n\
/readyz        readiness: 200 once discovery has synced\n\
/debug/pools   QoS pools and why each endpoint is in or out (?service=name.namespace)\n\
/node/ping     this node's name and usage, for peer proxies (when node measurements run)\n";

/// Largest request body the admin server reads (`PUT /node/usage` is the only request
/// with one); tower-http's `RequestBodyLimit` holds every request to it.
pub(crate) const MAX_BODY: usize = 4096;
/// Time a request has to arrive whole, body included, and be answered (tower-http's
/// `Timeout`): a client that sends a body slowly or never cannot hold a task for longer.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether `path` shows or changes what only operators and peers may see (see the crate
/// docs).
pub(crate) fn is_private(path: &str) -> bool {
    path.starts_with("/debug/") || path.starts_with("/node/") || path == "/debug" || path == "/node"
}

/// The answer to a client not allowed on a private path.
pub(crate) fn forbidden() -> Reply {
    json_error(
        StatusCode::FORBIDDEN,
        "forbidden",
        "/debug and /node answer only to loopback, the trusted networks \
         (--admin-trusted-networks) or with the admin token (Authorization: Bearer)",
    )
}

fn json_error(status: StatusCode, error: &str, detail: &str) -> Reply {
    let body = serde_json::json!({ "error": error, "detail": detail });
    reply(status, "application/json", format!("{body}\n"))
}

fn reply(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Reply {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Reply {
    reply(status, "text/plain; charset=utf-8", body)
}

pub(crate) async fn respond<B>(
    state: &AdminState,
    node: Option<&dyn NodeEndpoints>,
    req: Request<B>,
) -> Reply
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    match (node, req.method(), req.uri().path()) {
        (Some(node), &Method::PUT, "/node/usage") => {
            match req.into_body().collect().await.map_err(Into::into) {
                Ok(body) => match node.put_usage(&body.to_bytes()) {
                    Ok(json) => reply(StatusCode::OK, "application/json", json),
                    Err((status, message)) => text(status, format!("{message}\n")),
                },
                // A chunked body past the limit: the limit layer answers a declared length
                // that is too large before the handler runs.
                Err(e) if e.is::<LengthLimitError>() => too_large(),
                Err(_) => json_error(
                    StatusCode::BAD_REQUEST,
                    "unreadable body",
                    "the request body ended early or its framing is invalid",
                ),
            }
        }
        _ => handle(state, node, &req),
    }
}

fn too_large() -> Reply {
    json_error(
        StatusCode::PAYLOAD_TOO_LARGE,
        "body too large",
        &format!("the body may take at most {MAX_BODY} bytes"),
    )
}

/// The answers the layers give themselves (413 for a declared length over
/// [`MAX_BODY`], 408 past [`REQUEST_TIMEOUT`]: plain text or empty) in the admin
/// server's JSON error form, like every other refusal.
pub(crate) fn explain_refusal<B>(response: Response<B>) -> Response<AdminBody>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let json = response
        .headers()
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    let explained = match response.status() {
        _ if json => None,
        StatusCode::PAYLOAD_TOO_LARGE => Some(too_large()),
        StatusCode::REQUEST_TIMEOUT => Some(json_error(
            StatusCode::REQUEST_TIMEOUT,
            "request too slow",
            &format!("the request was not received and answered within {REQUEST_TIMEOUT:?}"),
        )),
        _ => None,
    };
    match explained {
        Some(reply) => reply.map(|body| body.map_err(|never| match never {}).boxed_unsync()),
        None => response.map(|body| body.map_err(Into::into).boxed_unsync()),
    }
}

pub(crate) fn handle<B>(
    state: &AdminState,
    node: Option<&dyn NodeEndpoints>,
    req: &Request<B>,
) -> Reply {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD\n");
        r.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    match req.uri().path() {
        "/metrics" => metrics(state),
        "/healthz" => text(StatusCode::OK, "ok"),
        "/readyz" if state.readiness.is_synced() => text(StatusCode::OK, "ok"),
        "/readyz" => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: discovery has not synced yet",
        ),
        "/debug/pools" => pools(state, req.uri().query()),
        "/node/ping" => match node {
            Some(node) => reply(StatusCode::OK, "application/json", node.ping()),
            None => text(
                StatusCode::NOT_FOUND,
                "not found: node measurements are off\n",
            ),
        },
        "/" => text(StatusCode::OK, INDEX),
        _ => text(StatusCode::NOT_FOUND, format!("not found\n\n{INDEX}")),
    }
}

fn metrics(state: &AdminState) -> Reply {
    let encoder = TextEncoder::new();
    let mut body = Vec::new();
    match encoder.encode(&state.registry.gather(), &mut body) {
        Ok(()) => reply(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            body,
        ),
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot encode metrics: {e}\n"),
        ),
    }
}

/// The value of `name` in a query string (names here need no percent-decoding).
fn query_param<'q>(query: Option<&'q str>, name: &str) -> Option<&'q str> {
    query?
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

fn pools(state: &AdminState, query: Option<&str>) -> Reply {
    let mut explain = state.router.explain(Instant::now());
    if let Some(wanted) = query_param(query, "service") {
        // `name.namespace`, or a bare `name` for the default namespace.
        let wanted = if wanted.contains('.') {
            wanted.to_string()
        } else {
            format!("{wanted}.default")
        };
        explain.services.retain(|s| s.service == wanted);
        if explain.services.is_empty() {
            return reply(
                StatusCode::NOT_FOUND,
                "application/json",
                format!(
                    "{}\n",
                    serde_json::json!({ "error": format!("unknown service {wanted}") })
                ),
            );
        }
    }
    match serde_json::to_vec_pretty(&explain) {
        Ok(mut body) => {
            body.push(b'\n');
            reply(StatusCode::OK, "application/json", body)
        }
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot encode pools: {e}\n"),
        ),
    }
}
