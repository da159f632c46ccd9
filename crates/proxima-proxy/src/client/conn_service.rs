//! What serves the requests of one client connection, whichever server reads them
//! (the proxy's own HTTP/1.1 loop, `http1/serve.rs`, or hyper's, `client/server.rs`): admission
//! under the concurrency limit, the proxy's own request limits, the target service's
//! name, then [`Proxy::forward`](crate::Proxy).
//!
//! A request over `max_concurrent_requests` in flight (on any connection, HTTP/2 streams
//! included) is answered `503` at once with a JSON body and `retry-after`, counted in
//! `proxima_requests_shed_total` (see [`shed`]).

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use http::header::{CONNECTION, HOST, TRANSFER_ENCODING};
use http::{HeaderName, HeaderValue, Request, StatusCode};
use tokio::sync::OwnedSemaphorePermit;
use tracing::{debug, Instrument, Span};

use crate::client::conn::{ConnActivity, InFlight};
use crate::forward::reply;
use crate::forward::request_body::RequestBody;
use crate::forward::target::{TargetCache, TargetError, TargetSource};
use crate::forward::{BadTarget, Target};
use crate::{Proxy, ProxyConfig};

/// Most bytes of an invalid service name echoed back in the error body.
const MAX_ECHO: usize = 64;

/// What the client sent as a service name, cut to [`MAX_ECHO`] bytes for the error body.
fn echo(raw: &[u8]) -> String {
    if raw.len() <= MAX_ECHO {
        return String::from_utf8_lossy(raw).into_owned();
    }
    let mut text = String::from_utf8_lossy(&raw[..MAX_ECHO]).into_owned();
    text.push('…');
    text
}

/// Whether a `Host` or authority names this machine rather than a service: `localhost`
/// or an IP address, with or without a port. Such requests name no service (400).
fn names_a_machine(value: &str) -> bool {
    let value = value.trim();
    if value.starts_with('[') {
        return true;
    }
    let host = match value.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => value,
    };
    let host = host.strip_suffix('.').unwrap_or(host);
    host.eq_ignore_ascii_case("localhost") || host.parse::<IpAddr>().is_ok()
}

/// Which service `req` names: the service header; else the authority of an
/// absolute-form URI or HTTP/2 `:authority` (RFC 9112 §3.2.2: it wins over `Host`); else
/// `Host`. A `Host` or authority that is `localhost` or an IP address names no service.
fn resolve<B>(
    config: &ProxyConfig,
    cache: &mut TargetCache,
    req: &Request<B>,
) -> Result<Target, BadTarget> {
    let headers = req.headers();
    let missing = || BadTarget {
        error: TargetError::Missing,
        named: String::new(),
    };
    let (raw, source) = if let Some(value) = headers.get(&config.service_header) {
        (value.clone(), TargetSource::Header)
    } else if let Some(authority) = req.uri().authority() {
        let value = HeaderValue::from_str(authority.as_str()).map_err(|_| BadTarget {
            error: TargetError::Invalid("invalid authority"),
            named: echo(authority.as_str().as_bytes()),
        })?;
        (value, TargetSource::Host)
    } else if let Some(value) = headers.get(HOST) {
        (value.clone(), TargetSource::Host)
    } else {
        return Err(missing());
    };
    if source == TargetSource::Host && raw.to_str().is_ok_and(names_a_machine) {
        return Err(missing());
    }
    match cache.key(
        &raw,
        source,
        &config.default_namespace,
        &config.cluster_domain,
    ) {
        Ok(key) => Ok(Target { key, raw, source }),
        Err(error) => Err(BadTarget {
            error,
            named: echo(raw.as_bytes()),
        }),
    }
}

/// Why an HTTP/1 request's head breaks a rule of RFC 9112 that neither hyper nor the
/// native loop enforces (hyper forwards two `Host` lines, and `chunked, chunked`):
///
/// * `Host` (§3.2): `400` for none in HTTP/1.1, for more than one, and for a value that
///   is not `host[:port]` (empty is allowed: a target without authority);
/// * `Transfer-Encoding` (§6.1, §7): `501` for any coding but `chunked` (the proxy
///   decodes and re-frames bodies, so it would pass such a body on half decoded), `400`
///   for `chunked` applied twice and for one in HTTP/1.0 (its framing is faulty by
///   definition). These close the connection after the answer: the body's length is
///   unknown. `Transfer-Encoding` next to `Content-Length` needs nothing here: hyper
///   frames such a request by the coding alone, drops the length and closes after the
///   answer, as §6.1 allows.
fn breaks_rfc9112<B>(req: &Request<B>) -> Option<Refusal> {
    if req.version() >= http::Version::HTTP_2 {
        return None;
    }
    bad_host(req).or_else(|| bad_transfer_coding(req))
}

/// For the differential tests: the status the proxy refuses `req` with before routing
/// it, by [`breaks_rfc9112`], if it does.
#[doc(hidden)]
pub fn refusal_for_differential<B>(req: &Request<B>) -> Option<u16> {
    breaks_rfc9112(req).map(|refusal| refusal.status.as_u16())
}

/// RFC 9112 §3.2: exactly one valid `Host` in HTTP/1.1, at most one in HTTP/1.0.
fn bad_host<B>(req: &Request<B>) -> Option<Refusal> {
    let mut hosts = req.headers().get_all(HOST).iter();
    let detail = match (hosts.next(), hosts.next()) {
        (None, _) if req.version() == http::Version::HTTP_11 => {
            "an HTTP/1.1 request needs a Host header".to_string()
        }
        (Some(_), Some(_)) => "more than one Host header".to_string(),
        (Some(host), None) if !valid_host(host.as_bytes()) => {
            format!("Host {:?} is not host[:port]", echo(host.as_bytes()))
        }
        _ => return None,
    };
    Some(Refusal {
        status: StatusCode::BAD_REQUEST,
        error: "bad host",
        detail: format!("{detail} (RFC 9112 §3.2)"),
        close: false,
    })
}

/// RFC 9112 §6.1 and §7: `chunked` once, no other coding, not in HTTP/1.0.
fn bad_transfer_coding<B>(req: &Request<B>) -> Option<Refusal> {
    let codings: Vec<&[u8]> = req
        .headers()
        .get_all(TRANSFER_ENCODING)
        .iter()
        .flat_map(|value| value.as_bytes().split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|coding| !coding.is_empty())
        .collect();
    let chunked = |coding: &&[u8]| coding.eq_ignore_ascii_case(b"chunked");
    let (status, detail) = if codings.is_empty() {
        return None;
    } else if let Some(other) = codings.iter().find(|c| !chunked(c)) {
        let other = echo(other);
        let detail = format!("transfer coding {other:?} is not supported; only chunked is");
        (StatusCode::NOT_IMPLEMENTED, detail)
    } else if codings.len() > 1 {
        let detail = "chunked applied more than once".to_string();
        (StatusCode::BAD_REQUEST, detail)
    } else if req.version() == http::Version::HTTP_10 {
        let detail = "Transfer-Encoding in an HTTP/1.0 request".to_string();
        (StatusCode::BAD_REQUEST, detail)
    } else {
        return None;
    };
    Some(Refusal {
        status,
        error: "bad framing",
        detail: format!("{detail} (RFC 9112 §6.1)"),
        close: true,
    })
}

/// Whether a `Host` value is `uri-host [":" port]` (RFC 9112 §3.2, RFC 3986 §3.2.2),
/// or empty: an IPv6 address in brackets, or a non-empty reg-name (an IPv4 address is
/// one: unreserved and sub-delims characters), then `:` and
/// digits if a port is given. IPvFuture literals and zone identifiers are refused: no pod
/// is reached through them.
///
/// Checked here rather than with `http::uri::Authority::try_from`, which takes an owned
/// copy of the value (an allocation) and parses more than this asks: 28,003 instructions
/// per HTTP/1.1 request through the proxy with it, 27,309 with this
/// (`benches/load/instructions.sh`, 2026-12-07), for a three-line grammar.
fn valid_host(value: &[u8]) -> bool {
    if value.is_empty() {
        return true;
    }
    let (host, port) = match value {
        [b'[', ..] => match value.iter().position(|&b| b == b']') {
            Some(end) => value.split_at(end + 1),
            None => return false,
        },
        _ => value.split_at(value.iter().position(|&b| b == b':').unwrap_or(value.len())),
    };
    let port_ok = match port {
        [] => true,
        [b':', digits @ ..] => digits.iter().all(u8::is_ascii_digit),
        _ => false,
    };
    port_ok
        && match host {
            [b'[', literal @ .., b']'] => std::str::from_utf8(literal)
                .is_ok_and(|literal| literal.parse::<std::net::Ipv6Addr>().is_ok()),
            _ => is_reg_name(host),
        }
}

/// RFC 3986 §3.2.2 `reg-name`, not empty, of unreserved and sub-delims characters. Its
/// percent-encoded octets are refused: no name a pod is reached by has one (the
/// differential test's oracle, `tests/differential.rs`, refuses them as well).
fn is_reg_name(host: &[u8]) -> bool {
    !host.is_empty()
        && host
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=".contains(b))
}

/// The proxy's own request limits and RFC 9112's rules for a request's head, answered
/// with JSON: a broken `Host` or `Transfer-Encoding` ([`breaks_rfc9112`]: 400 or 501),
/// too many header lines (431), a request target too long (414).
fn over_limits<B>(proxy: &Proxy, req: &Request<B>) -> Option<http::Response<crate::ResponseBody>> {
    let refusal = breaks_rfc9112(req).or_else(|| beyond_limits(&proxy.config, req))?;
    proxy.metrics.unrouted(refusal.status);
    debug!(
        status = refusal.status.as_u16(),
        detail = refusal.detail,
        "request refused"
    );
    let mut response = reply::error(refusal.status, refusal.error, "", &refusal.detail);
    if refusal.close {
        response
            .headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    Some(response)
}

/// A request refused before it is routed.
struct Refusal {
    status: StatusCode,
    error: &'static str,
    detail: String,
    /// The body's framing is unknown: close the connection after the answer.
    close: bool,
}

/// Too many header lines (431), a request target too long (414).
fn beyond_limits<B>(config: &ProxyConfig, req: &Request<B>) -> Option<Refusal> {
    let lines = req.headers().len();
    if lines > config.max_request_headers {
        return Some(Refusal {
            status: StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            error: "too many request headers",
            detail: format!(
                "the request has {lines} header lines; the limit is {}",
                config.max_request_headers
            ),
            close: false,
        });
    }
    let uri = req.uri();
    let length = uri.path_and_query().map_or(0, |pq| pq.as_str().len())
        + uri.authority().map_or(0, |a| a.as_str().len())
        + uri.scheme_str().map_or(0, str::len);
    (length > config.max_uri_bytes).then(|| Refusal {
        status: StatusCode::URI_TOO_LONG,
        error: "request target too long",
        detail: format!(
            "the request target takes {length} bytes; the limit is {}",
            config.max_uri_bytes
        ),
        close: false,
    })
}

/// Seconds a shed client is asked to wait (`retry-after`).
const SHED_RETRY_AFTER: &str = "1";

/// The answer to a request over `max_concurrent_requests`: `503` with a JSON body and
/// `retry-after`, at once and without reading the request's body.
///
/// Admission is a semaphore's `try_acquire` per request, not tower's `ConcurrencyLimit`
/// and `LoadShed`: the place must be held until the response body has been sent (a
/// streaming response still uses a pod connection and buffers), while tower's limit ends
/// when the response future resolves; and bridging a tower stack with
/// `TowerToHyperService` clones the stack and boxes an acquire future per request, where
/// this is one atomic operation.
fn shed(proxy: &Proxy) -> http::Response<crate::ResponseBody> {
    proxy.metrics.shed();
    let limit = proxy.config.max_concurrent_requests;
    debug!(limit, "request shed: too many requests in flight");
    let mut response = reply::error(
        StatusCode::SERVICE_UNAVAILABLE,
        "overloaded",
        "",
        &format!("the proxy has its limit of {limit} requests in flight; retry shortly"),
    );
    response.headers_mut().insert(
        http::header::RETRY_AFTER,
        HeaderValue::from_static(SHED_RETRY_AFTER),
    );
    response
}

/// What serves the requests of one client connection, whichever server reads them
/// (the native loop of `http1/serve.rs` or hyper's): resolve the target, then forward.
pub(crate) struct ConnService {
    proxy: Arc<Proxy>,
    /// Formatted once per connection and shared by its requests.
    client_ip: HeaderValue,
    activity: Arc<ConnActivity>,
}

impl ConnService {
    pub(crate) fn new(
        proxy: Arc<Proxy>,
        peer: SocketAddr,
        activity: Arc<ConnActivity>,
    ) -> Arc<Self> {
        let client_ip = HeaderValue::from_str(&peer.ip().to_canonical().to_string())
            .unwrap_or_else(|_| HeaderValue::from_static("unknown"));
        Arc::new(Self {
            proxy,
            client_ip,
            activity,
        })
    }

    /// The header that names the target service.
    pub(crate) fn service_header(&self) -> &HeaderName {
        &self.proxy.config.service_header
    }

    /// `400` for a head no HTTP/1.1 parser can take (a bare CR, a control byte in a
    /// field, a broken request line), answered with the same JSON as hyper's `400`
    /// (`client/conn.rs`); the connection closes after it.
    pub(crate) fn malformed(&self) -> http::Response<crate::ResponseBody> {
        // Counted as a request with its own answer, so that the connection does not take
        // this head for one of hyper's bare error heads and replace it.
        drop(self.activity.begin(true));
        let status = http::StatusCode::BAD_REQUEST;
        self.proxy.metrics.unrouted(status);
        debug!(status = 400, "request refused: malformed head");
        let mut response = reply::error(
            status,
            "malformed request",
            "",
            "the request head is not valid HTTP/1.1",
        );
        response
            .headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
        response
    }

    /// Admit `req` (or refuse it: shed, over the limits) and resolve the service it
    /// names; `cache` remembers the connection's last service name. What is left is
    /// [`Admitted::answer`], which borrows nothing from the connection.
    ///
    /// Two steps rather than one function returning the answer's future: that future
    /// holds the forwarding future (several KiB), and a future returned by value from a
    /// plain function is copied whole into its caller's state, where an `async fn`'s is
    /// built in place. Measured: a 4.9 KB copy per request on the native loop.
    pub(crate) fn admit(&self, cache: &mut TargetCache, req: Request<RequestBody>) -> Admitted {
        let proxy = &self.proxy;
        let in_flight = self.activity.begin(req.version() < http::Version::HTTP_2);
        let grpc = reply::is_grpc(&req);
        let admission = proxy.admission.clone().try_acquire_owned().ok();
        let refused = match admission {
            None => Some(shed(proxy)),
            Some(_) => over_limits(proxy, &req),
        };
        let work = match refused {
            Some(refused) => Err(Box::new(refused)),
            None => {
                let target = resolve(&proxy.config, cache, &req);
                let named = target.as_ref().map(|t| &*t.key);
                let span = crate::spans::request(named.map_err(|bad| bad.named.as_str()));
                Ok(ToForward { req, target, span })
            }
        };
        Admitted {
            proxy: proxy.clone(),
            client_ip: self.client_ip.clone(),
            in_flight,
            admission,
            grpc,
            work,
        }
    }
}

/// A request that [`ConnService::admit`] took in, to be answered.
pub(crate) struct Admitted {
    proxy: Arc<Proxy>,
    client_ip: HeaderValue,
    in_flight: InFlight,
    admission: Option<OwnedSemaphorePermit>,
    /// A gRPC call: the proxy's own errors are answered as gRPC statuses.
    grpc: bool,
    /// The refusal (rare) is boxed so that moving an admitted request stays cheap.
    work: Result<ToForward, Box<http::Response<crate::ResponseBody>>>,
}

/// An admitted request and the service it names.
struct ToForward {
    req: Request<RequestBody>,
    target: Result<Target, BadTarget>,
    span: Span,
}

impl Admitted {
    /// The answer: the refusal, or what [`Proxy::forward`] brings back. The response
    /// body holds the request's marks (in flight on its connection, its place under the
    /// concurrency limit) until it has been sent or dropped.
    ///
    /// An async block that takes `self`'s fields where they lie (an `async fn` would
    /// store `self` twice in its state, which moves with the request's future).
    // Not an `async fn`: see above.
    #[allow(clippy::manual_async_fn)]
    pub(crate) fn answer(self) -> impl Future<Output = http::Response<crate::ResponseBody>> {
        async move {
            let mut response = match self.work {
                Err(refused) => *refused,
                Ok(ToForward { req, target, span }) => {
                    self.proxy
                        .forward(req, target, self.client_ip)
                        .instrument(span)
                        .await
                }
            };
            if self.grpc {
                reply::to_grpc(&mut response);
            }
            // Set in place: the response is a few hundred bytes, and `map` would move it
            // twice.
            let body = response.body_mut();
            body.hold(self.in_flight);
            if let Some(permit) = self.admission {
                body.admit(permit);
            }
            response
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_is_a_host_and_an_optional_port_of_digits() {
        for good in [
            &b""[..],
            b"api",
            b"api.default:8080",
            b"api:",
            b"[::1]",
            b"[::1]:80",
            b"[::ffff:10.0.0.1]:80",
            b"10.0.0.1:1",
            b"a-b_c~d!$&'()*+,;=e",
        ] {
            assert!(valid_host(good), "{:?}", good.escape_ascii().to_string());
        }
        for bad in [
            &b"api:x"[..],
            b"api:80x",
            b"api:8:0",
            b"[::1]x",
            b"[::1]:http",
            b"[G::1]:80",
            b"[1:::2]",
            b"[v1.x]",
            b"[::1",
            b"a b",
            b"user@api",
            b":80",
            b"api%2Dv1:80",
            b"xn--bcher-kva.examp%0e",
            b"api%4:80",
            b"api%zz",
            b"a/b",
            b"a\"b",
            b"[::1]:80:80",
            b"[fe80::1%25eth0]",
        ] {
            assert!(!valid_host(bad), "{:?}", bad.escape_ascii().to_string());
        }
    }
}
