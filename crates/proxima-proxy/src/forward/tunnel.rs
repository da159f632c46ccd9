//! Upgrades passed through to pods (RFC 9110 §7.8): WebSockets (RFC 6455) and any other
//! protocol a client asks for and a pod accepts, except `h2c`.
//!
//! An HTTP/1.1 request with `Connection: upgrade` and `Upgrade: <protocols>` goes to a
//! pod that the service's strategy picks (the QoS pool, for `qos-pool`), on a connection
//! of its own: a tunnel never takes a pooled keep-alive connection, and its connection
//! is never pooled. The request keeps its `Upgrade` (the other hop-by-hop fields go, as
//! for any request). The time to the pod's answer is the pod's sample, as any request's.
//!
//! * **`101` naming protocols the client asked for**: the client gets the `101`, and once
//!   both sides have switched, bytes are copied both ways until either side closes, no
//!   byte moves for `tunnel_idle_timeout`, or the pod has been gone from discovery for
//!   `tunnel_removed_grace`; at shutdown, until they close or the grace period is over. While open, the tunnel counts as a request in flight on its
//!   pod (strategies that weigh load see it) and as a client connection against
//!   `max_client_connections` (the client's own connection ends when it switches): a
//!   client opening thousands of tunnels meets the same bound as one opening
//!   thousands of connections. A pod that leaves the QoS pool keeps its open tunnels and
//!   gets no new ones (the pick decides).
//! * **`101` naming another protocol, or none**: `502`, as any `101` not asked for.
//! * **Any other answer**: the pod declined the upgrade (RFC 9110 §7.8 lets a server
//!   ignore it, and a WebSocket server answers `400`, `401` or `404` to a handshake it
//!   refuses). The client gets that answer (its body up to [`MAX_DECLINED_BODY`]; a longer
//!   one is `502`), and the connection closes after it.
//! * **Connect failures** are retried on another pod, as for any request (nothing was
//!   sent); a failure after sending is `502`, and the service's `timeout` bounds the time
//!   to the pod's answer (`504`).
//!
//! `Upgrade: h2c` alone is not a tunnel: RFC 9113 §3.1 retired it and through a proxy it
//! is a request-smuggling vector, so such a request is forwarded as a plain one with its
//! `Upgrade` dropped (when other protocols are offered too, `h2c` is struck from the
//! list).
//!
//! **HTTP/2 clients** open WebSockets with extended CONNECT (RFC 8441: `CONNECT` with
//! `:protocol websocket`; the proxy's HTTP/2 server offers
//! `SETTINGS_ENABLE_CONNECT_PROTOCOL`). The pod gets the HTTP/1.1 handshake RFC 6455
//! asks for (`GET` with `Upgrade`, and a `Sec-WebSocket-Key` of the proxy's own, since
//! RFC 8441 §5 has none), and its `101` becomes the client's `200`, without
//! `Sec-WebSocket-Accept`; the tunnel is the client's HTTP/2 stream from then on, under
//! the same rules as above.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{
    CONNECTION, CONTENT_LENGTH, HOST, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_KEY, UPGRADE,
};
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, Uri, Version};
use http_body::Body;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use proxima_core::{EndpointId, Outcome, PickError, Picked, PortRef, ServiceKey};
use tokio::sync::OwnedSemaphorePermit;
use tracing::{debug, info, warn};

use crate::forward::body::ResponseBody;
use crate::forward::headers::{add_forwarded, strip_hop_by_hop};
use crate::forward::pump::Pump;
use crate::forward::request_body::RequestBody;
use crate::metrics::{ErrorKind, ServiceMetrics, TunnelClose};
use crate::upstream::connect::connect_from;
use crate::Proxy;

/// The longest body of a pod's answer declining an upgrade that is passed on.
pub(crate) const MAX_DECLINED_BODY: usize = 64 * 1024;

/// How often an open tunnel checks that its pod is still in discovery.
const REMOVAL_CHECK: Duration = Duration::from_secs(1);

/// A tunnel a client asked for: the protocols, and how it asked.
pub(crate) struct Asked {
    protocols: HeaderValue,
    via: Via,
}

/// How a client asks for a tunnel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Via {
    /// HTTP/1.1 `Upgrade` (answered `101`).
    Upgrade,
    /// HTTP/2 extended CONNECT, RFC 8441 (answered `200`).
    ExtendedConnect,
}

/// The tunnel a request asks for: the protocols of its `Upgrade`, `h2c` struck out (see
/// the module docs), or the `:protocol` of an extended CONNECT; `None` when it asks for
/// none, or for `h2c` alone.
pub(crate) fn asked<B>(req: &Request<B>) -> Option<Asked> {
    // hyper marks the requests that ask for an upgrade (the proxy's own loop hands
    // them all to hyper) and HTTP/2 CONNECTs: every other request is through with one
    // look at an empty extension map, no header lookup.
    req.extensions().get::<OnUpgrade>()?;
    if req.version() == Version::HTTP_2 && req.method() == Method::CONNECT {
        let protocol = req.extensions().get::<hyper::ext::Protocol>()?;
        return Some(Asked {
            protocols: HeaderValue::from_str(protocol.as_str()).ok()?,
            via: Via::ExtendedConnect,
        });
    }
    if req.version() != Version::HTTP_11 || !connection_has_upgrade(req.headers()) {
        return None;
    }
    let offered: Vec<&str> = req
        .headers()
        .get_all(UPGRADE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|p| !p.is_empty() && !p.eq_ignore_ascii_case("h2c"))
        .collect();
    if offered.is_empty() {
        return None;
    }
    Some(Asked {
        protocols: HeaderValue::from_str(&offered.join(", ")).ok()?,
        via: Via::Upgrade,
    })
}

/// Whether `Connection` carries the `upgrade` option.
fn connection_has_upgrade(headers: &HeaderMap) -> bool {
    headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|option| option.trim().eq_ignore_ascii_case("upgrade"))
}

/// Whether every protocol in the pod's `Upgrade` was among those `asked` (names compared
/// without case, versions exactly), and it names at least one.
fn accepted_as_asked(answer: &HeaderMap, asked: &HeaderValue) -> bool {
    let asked: Vec<String> = tokens(asked.to_str().unwrap_or_default());
    let answered: Vec<String> = answer
        .get_all(UPGRADE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(tokens)
        .collect();
    !answered.is_empty() && answered.iter().all(|p| asked.contains(p))
}

fn tokens(list: &str) -> Vec<String> {
    list.split(',')
        .map(|p| p.trim().to_ascii_lowercase())
        .filter(|p| !p.is_empty())
        .collect()
}

/// Why no tunnel was set up on one pod.
enum Failed {
    /// Nothing reached the pod: another may be tried.
    NotSent(String),
    /// The request was sent; the client gets `status`.
    Sent(StatusCode, &'static str, String),
    /// The pod declined the upgrade: its answer, for the client.
    Declined(Response<ResponseBody>),
}

impl Proxy {
    /// Pass an upgrade request to a pod and, if it switches, tunnel the connection (see
    /// the module docs). `protocols` is what [`asked`] found.
    pub(crate) async fn tunnel(
        self: &Arc<Self>,
        mut req: Request<RequestBody>,
        key: &ServiceKey,
        port: Option<PortRef<'_>>,
        asked: Asked,
        client_ip: &HeaderValue,
        start: Instant,
    ) -> Response<ResponseBody> {
        let Asked { protocols, via } = asked;
        let name = key.to_string();
        // An extended CONNECT's stream is the tunnel, not a body.
        if via == Via::Upgrade && !req.body().is_end_stream() {
            return self.refuse_upgrade(
                StatusCode::BAD_REQUEST,
                &name,
                "an upgrade request with a body is not supported",
            );
        }
        let Some(client_side) = req.extensions_mut().remove::<OnUpgrade>() else {
            return self.refuse_upgrade(
                StatusCode::NOT_IMPLEMENTED,
                &name,
                "this connection cannot switch protocols",
            );
        };
        let Some(client_tunnel) = self
            .tunnels_by_client
            .open(client_ip, self.config.max_tunnels_per_client)
        else {
            self.metrics.tunnel_refused();
            warn!(client = ?client_ip, limit = self.config.max_tunnels_per_client,
                "upgrade refused: the client has its limit of tunnels open");
            return self.refuse_upgrade(
                StatusCode::TOO_MANY_REQUESTS,
                &name,
                &format!(
                    "this client has its limit of {} tunnels open",
                    self.config.max_tunnels_per_client
                ),
            );
        };
        // Counted as a client connection while open (see the module docs).
        let Ok(seat) = self.connections.clone().try_acquire_owned() else {
            self.metrics.tunnel_refused();
            return self.refuse_upgrade(
                StatusCode::SERVICE_UNAVAILABLE,
                &name,
                &format!(
                    "the proxy has its limit of {} client connections and tunnels open",
                    self.config.max_client_connections
                ),
            );
        };
        let head = upstream_head(&req, &protocols, client_ip, via);
        let mut tried: Vec<EndpointId> = Vec::new();
        let mut last_failure = None;
        loop {
            let picked = match self.pick_long_lived(key, port, Instant::now(), &tried) {
                Ok(picked) => picked,
                Err(error) => return self.no_pod_for_tunnel(key, error, last_failure, start),
            };
            let service = self.metrics.service(picked.route().key());
            service.pick(picked.reason);
            match self.handshake(&picked, &service, &head, &protocols).await {
                Ok((response, pod_side)) => {
                    let answer = client_answer(&response, via);
                    tokio::spawn(self.clone().run(
                        picked,
                        service,
                        (client_side, pod_side),
                        (seat, client_tunnel),
                    ));
                    return answer;
                }
                Err(Failed::NotSent(error)) => {
                    let retries = picked.route().settings().retries;
                    warn!(service = service.label(), endpoint = %picked.endpoint().id, %error, "could not reach endpoint for an upgrade");
                    tried.push(picked.endpoint().id.clone());
                    last_failure = Some(error);
                    if tried.len() > retries as usize {
                        let detail = last_failure.unwrap_or_default();
                        return self.refuse_upgrade(StatusCode::BAD_GATEWAY, &name, &detail);
                    }
                }
                Err(Failed::Declined(answer)) => return answer,
                Err(Failed::Sent(status, error, detail)) => {
                    debug!(service = service.label(), endpoint = %picked.endpoint().id, %detail, "upgrade failed");
                    return reply_error(status, error, &name, &detail);
                }
            }
        }
    }

    /// One pod's answer to the upgrade: its `101` and its side of the connection, or
    /// why not. The pod's answer is recorded as its sample.
    async fn handshake(
        &self,
        picked: &Picked,
        service: &ServiceMetrics,
        head: &Request<()>,
        protocols: &HeaderValue,
    ) -> Result<(Response<hyper::body::Incoming>, OnUpgrade), Failed> {
        let settings = picked.route().settings();
        let (timeout, connect_timeout) = (settings.timeout, settings.connect_timeout);
        let endpoint = service.endpoint(&picked.endpoint().id);
        let start = Instant::now();
        let stall_start = self.stall_total(start);
        let record = |outcome: Outcome| {
            let now = Instant::now();
            let stall = self.stall_total(now).saturating_sub(stall_start);
            if let Some(change) = self.router.record_stalled(picked, now, outcome, stall) {
                self.pool_changed(service, &picked.endpoint().id, change);
            }
        };
        let connected = tokio::time::timeout(
            connect_timeout,
            connect_from(picked.addr, self.config.upstream_bind),
        )
        .await;
        let stream = match connected {
            Ok(Ok(stream)) => Ok(stream),
            Ok(Err(error)) => Err(error.to_string()),
            Err(_) => Err("connect timed out".to_string()),
        };
        let stream = stream.map_err(|error| {
            record(Outcome::ConnectFailed);
            endpoint.error(ErrorKind::Connect);
            let (id, addr) = (&picked.endpoint().id, picked.addr);
            Failed::NotSent(format!("{id} ({addr}): {error}"))
        })?;
        let _ = stream.set_nodelay(true);
        let sent = async {
            let (mut sender, connection) = hyper::client::conn::http1::Builder::new()
                .handshake(TokioIo::new(stream))
                .await?;
            tokio::spawn(connection.with_upgrades());
            sender.send_request(with_empty_body(head)).await
        };
        let mut response = match tokio::time::timeout(timeout, sent).await {
            Ok(Ok(response)) => response,
            Ok(Err(error)) => {
                record(Outcome::Failed);
                endpoint.error(ErrorKind::Protocol);
                let detail = format!("endpoint {}: {error}", picked.endpoint().id);
                return Err(Failed::Sent(
                    StatusCode::BAD_GATEWAY,
                    "upstream error",
                    detail,
                ));
            }
            Err(_) => {
                record(Outcome::Failed);
                endpoint.error(ErrorKind::Timeout);
                let detail = format!(
                    "endpoint {} did not answer the upgrade within {timeout:?}",
                    picked.endpoint().id
                );
                return Err(Failed::Sent(
                    StatusCode::GATEWAY_TIMEOUT,
                    "upstream timeout",
                    detail,
                ));
            }
        };
        let latency = start.elapsed();
        let status = response.status();
        record(Outcome::Answered {
            latency,
            status: status.as_u16(),
        });
        endpoint.upstream_duration(latency);
        endpoint.response(status);
        if status != StatusCode::SWITCHING_PROTOCOLS {
            self.metrics.tunnel_declined();
            return Err(declined(response, picked).await);
        }
        if !accepted_as_asked(response.headers(), protocols) {
            let detail = format!(
                "endpoint {} switched to {:?}, which was not asked for ({protocols:?})",
                picked.endpoint().id,
                response.headers().get(UPGRADE)
            );
            return Err(Failed::Sent(
                StatusCode::BAD_GATEWAY,
                "upstream protocol error",
                detail,
            ));
        }
        let pod_side = hyper::upgrade::on(&mut response);
        Ok((response, pod_side))
    }

    /// Copy bytes both ways until either side closes, the tunnel idles out or its pod
    /// has been gone from discovery for the grace period (see the module docs).
    async fn run(
        self: Arc<Self>,
        picked: Picked,
        service: Arc<ServiceMetrics>,
        (client_side, pod_side): (OnUpgrade, OnUpgrade),
        seat: (OwnedSemaphorePermit, ClientTunnel),
    ) {
        let (client, pod) = match tokio::try_join!(client_side, pod_side) {
            Ok(sides) => sides,
            Err(error) => {
                debug!(service = service.label(), %error, "upgrade did not complete");
                return;
            }
        };
        let open = OpenTunnel::new(&self.tunnels, self.metrics.tunnel_opened());
        let started = Instant::now();
        let activity = AtomicU64::new(0);
        let (mut client, mut pod) = (TokioIo::new(client), TokioIo::new(pod));
        let idle = self.config.tunnel_idle_timeout;
        let reason = tokio::select! {
            copied = Pump::new(&mut client, &mut pod, started, &activity) => match copied {
                Ok(_) => TunnelClose::Closed,
                Err(_) => TunnelClose::Error,
            },
            () = idled_out(started, &activity, idle) => TunnelClose::Idle,
            () = self.pod_removed(&picked) => TunnelClose::Removed,
            () = self.shutdown_over() => TunnelClose::Shutdown,
        };
        info!(
            service = service.label(),
            endpoint = %picked.endpoint().id,
            reason = reason.as_str(),
            open_for_ms = started.elapsed().as_millis() as u64,
            "tunnel closed"
        );
        drop(open);
        self.metrics.tunnel_closed(reason);
        drop((picked, seat));
    }

    /// Returns once `picked`'s pod has been gone from discovery for
    /// `tunnel_removed_grace`.
    async fn pod_removed(&self, picked: &Picked) {
        let key = picked.route().key().clone();
        let id = picked.endpoint().id.clone();
        let ip = picked.endpoint().ip;
        loop {
            tokio::time::sleep(REMOVAL_CHECK).await;
            let table = self.router.table();
            let present = table.services.get(&key).is_some_and(|route| {
                route
                    .endpoints
                    .iter()
                    .any(|e| e.endpoint.id == id && e.endpoint.ip == ip)
            });
            if !present {
                break;
            }
        }
        info!(service = %key, endpoint = %id, grace = ?self.config.tunnel_removed_grace, "pod of an open tunnel left discovery; closing the tunnel after the grace period");
        tokio::time::sleep(self.config.tunnel_removed_grace).await;
    }

    /// Returns once no tunnel is open (a shutdown waits for that, up to its grace).
    pub(crate) async fn tunnels_closed(&self) {
        let mut open = self.tunnels.subscribe();
        let _ = open.wait_for(|&n| n == 0).await;
    }

    /// Tunnels open now.
    pub(crate) fn open_tunnels(&self) -> usize {
        *self.tunnels.borrow()
    }

    /// Close every open tunnel: a shutdown's grace is over.
    pub(crate) fn cut_tunnels(&self) {
        self.cut_tunnels.send_replace(true);
    }

    async fn shutdown_over(&self) {
        let mut cut = self.cut_tunnels.subscribe();
        let _ = cut.wait_for(|&cut| cut).await;
    }

    fn refuse_upgrade(
        &self,
        status: StatusCode,
        service: &str,
        detail: &str,
    ) -> Response<ResponseBody> {
        self.metrics.unrouted(status);
        reply_error(status, "upgrade refused", service, detail)
    }

    fn no_pod_for_tunnel(
        &self,
        key: &ServiceKey,
        error: PickError,
        last_failure: Option<String>,
        start: Instant,
    ) -> Response<ResponseBody> {
        match last_failure {
            Some(detail) => self.refuse_upgrade(StatusCode::BAD_GATEWAY, &key.to_string(), &detail),
            None => self.no_endpoint(key, error, start),
        }
    }
}

/// Counts a tunnel as open until dropped: in [`Proxy`]'s count (what a shutdown waits
/// on) and in `proxima_tunnels_open`.
struct OpenTunnel {
    count: tokio::sync::watch::Sender<usize>,
    gauge: prometheus::IntGauge,
}

impl OpenTunnel {
    fn new(count: &tokio::sync::watch::Sender<usize>, gauge: prometheus::IntGauge) -> Self {
        count.send_modify(|n| *n += 1);
        gauge.inc();
        Self {
            count: count.clone(),
            gauge,
        }
    }
}

impl Drop for OpenTunnel {
    fn drop(&mut self) {
        self.count.send_modify(|n| *n = n.saturating_sub(1));
        self.gauge.dec();
    }
}

/// The request to send the pod: the client's method, path and fields, less hop-by-hop
/// ones, with `Connection: upgrade` and the protocols asked for.
fn upstream_head(
    req: &Request<RequestBody>,
    protocols: &HeaderValue,
    client_ip: &HeaderValue,
    via: Via,
) -> Request<()> {
    let mut headers = req.headers().clone();
    let mut method = req.method().clone();
    if via == Via::ExtendedConnect {
        // RFC 8441 §5: the HTTP/1.1 handshake of RFC 6455 §4.1.
        method = Method::GET;
        if protocols.as_bytes().eq_ignore_ascii_case(b"websocket") {
            headers.insert(SEC_WEBSOCKET_KEY, websocket_key());
        }
    }
    strip_hop_by_hop(&mut headers);
    add_forwarded(&mut headers, client_ip);
    if !headers.contains_key(HOST) {
        if let Some(authority) = req.uri().authority() {
            if let Ok(host) = HeaderValue::from_str(authority.as_str()) {
                headers.insert(HOST, host);
            }
        }
    }
    headers.remove(CONTENT_LENGTH);
    headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(UPGRADE, protocols.clone());
    let uri = req
        .uri()
        .path_and_query()
        .map_or_else(|| Uri::from_static("/"), |pq| Uri::from(pq.clone()));
    let mut head = Request::new(());
    *head.method_mut() = method;
    *head.uri_mut() = uri;
    *head.headers_mut() = headers;
    head
}

fn with_empty_body(head: &Request<()>) -> Request<Empty<Bytes>> {
    let mut req = Request::new(Empty::new());
    *req.method_mut() = head.method().clone();
    *req.uri_mut() = head.uri().clone();
    *req.headers_mut() = head.headers().clone();
    req
}

/// The answer the client gets to the pod's `101`: over HTTP/1.1 a `101` with the pod's
/// fields less hop-by-hop ones, with the pod's `Upgrade` and `Connection: upgrade`; to
/// an extended CONNECT a `200` with those fields less `Upgrade` and
/// `Sec-WebSocket-Accept` (RFC 8441 §5).
fn client_answer(pod: &Response<hyper::body::Incoming>, via: Via) -> Response<ResponseBody> {
    let mut headers = pod.headers().clone();
    if via == Via::ExtendedConnect {
        strip_hop_by_hop(&mut headers);
        headers.remove(SEC_WEBSOCKET_ACCEPT);
        let mut answer = Response::new(ResponseBody::full(Bytes::new()));
        *answer.headers_mut() = headers;
        return answer;
    }
    let upgrade: Vec<HeaderValue> = headers.get_all(UPGRADE).iter().cloned().collect();
    strip_hop_by_hop(&mut headers);
    for value in upgrade {
        headers.append(UPGRADE, value);
    }
    headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
    let mut answer = Response::new(ResponseBody::full(Bytes::new()));
    *answer.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    *answer.headers_mut() = headers;
    answer
}

/// Tunnels open per client address (see `ProxyConfig::max_tunnels_per_client`).
#[derive(Debug, Default)]
pub(crate) struct ClientTunnels {
    open: std::sync::Mutex<std::collections::HashMap<HeaderValue, usize>>,
}

/// One client's tunnel, counted until dropped.
pub(crate) struct ClientTunnel {
    counts: Arc<ClientTunnels>,
    client: HeaderValue,
}

impl ClientTunnels {
    /// Count a tunnel for `client`, unless it has `limit` open already.
    fn open(self: &Arc<Self>, client: &HeaderValue, limit: usize) -> Option<ClientTunnel> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let count = open.entry(client.clone()).or_default();
        if *count >= limit {
            return None;
        }
        *count += 1;
        Some(ClientTunnel {
            counts: self.clone(),
            client: client.clone(),
        })
    }
}

impl Drop for ClientTunnel {
    fn drop(&mut self) {
        let mut open = self.counts.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = open.get_mut(&self.client) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.client);
            }
        }
    }
}

/// A fresh `Sec-WebSocket-Key`: 16 random bytes in base64 (RFC 6455 §4.1).
fn websocket_key() -> HeaderValue {
    base64_key(rand::random())
}

/// `nonce` in base64, as a `Sec-WebSocket-Key` (24 characters, 2 of padding).
fn base64_key(nonce: [u8; 16]) -> HeaderValue {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut key = Vec::with_capacity(24);
    for chunk in nonce.chunks(3) {
        let bits = chunk
            .iter()
            .enumerate()
            .fold(0u32, |bits, (i, &b)| bits | u32::from(b) << (16 - 8 * i));
        let digits = chunk.len() + 1;
        for i in 0..4 {
            key.push(if i < digits {
                ALPHABET[(bits >> (18 - 6 * i) & 63) as usize]
            } else {
                b'='
            });
        }
    }
    HeaderValue::from_bytes(&key).expect("base64 is a valid header value")
}

/// A pod's answer that declines the upgrade, to pass on (see the module docs).
async fn declined(response: Response<hyper::body::Incoming>, picked: &Picked) -> Failed {
    let (mut parts, body) = response.into_parts();
    match Limited::new(body, MAX_DECLINED_BODY).collect().await {
        Ok(body) => {
            strip_hop_by_hop(&mut parts.headers);
            parts.headers.remove(CONTENT_LENGTH);
            parts
                .headers
                .insert(CONNECTION, HeaderValue::from_static("close"));
            let body = body.to_bytes();
            Failed::Declined(Response::from_parts(parts, ResponseBody::full(body)))
        }
        Err(error) => Failed::Sent(
            StatusCode::BAD_GATEWAY,
            "upstream error",
            format!(
                "endpoint {} declined the upgrade with a body that could not be passed on: {error}",
                picked.endpoint().id
            ),
        ),
    }
}

fn reply_error(
    status: StatusCode,
    error: &str,
    service: &str,
    detail: &str,
) -> Response<ResponseBody> {
    let mut response = crate::forward::reply::error(status, error, service, detail);
    response
        .headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    response
}

/// Returns once no byte has moved for `idle` (activity: nanoseconds after `started` of
/// the last read on either side).
async fn idled_out(started: Instant, activity: &AtomicU64, idle: Duration) {
    loop {
        let last = started + Duration::from_nanos(activity.load(Ordering::Relaxed));
        let until = last + idle;
        if Instant::now() >= until {
            return;
        }
        tokio::time::sleep_until(until.into()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn websocket_keys_are_base64_of_sixteen_bytes() {
        // RFC 6455 §1.3's example nonce.
        assert_eq!(base64_key(*b"the sample nonce"), "dGhlIHNhbXBsZSBub25jZQ==");
        assert_eq!(websocket_key().len(), 24);
    }
}
