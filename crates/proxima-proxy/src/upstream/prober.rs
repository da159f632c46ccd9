//! Background probes of endpoints evicted from a QoS pool.
//!
//! An evicted endpoint gets no client traffic, so without probes the proxy would never
//! learn that it recovered. Every [`TICK`] the prober claims the probes that are due
//! ([`Router::due_probes`](proxima_core::Router::due_probes): the core schedules them
//! with exponential backoff while the endpoint keeps missing) and sends each a
//! `GET <probe-path>` over the same keep-alive pool as client traffic, so that a probe
//! measures what a request would see. The time to response headers is reported with
//! [`Router::finish_probe`](proxima_core::Router::finish_probe); after `readmit-after`
//! consecutive probes within the SLO the endpoint rejoins the pool.
//!
//! With `qos-pool-probe: traffic` a probe is shaped like the service's real traffic
//! instead: the forwarding path remembers the last few requests of the service that
//! were idempotent and had no body ([`TrafficShapes`]), and each probe reuses the
//! method, path, query and headers of one of them (in turn, newest first), less
//! `x-forwarded-for` (it names a client that did not send the probe) and plus
//! `x-proxima-probe: 1`, so that a pod that is slow only on its real work is judged on
//! that work. Until such a request was seen, or when the last one is older than the
//! service's `qos-pool-max-age`, the probe is `GET <probe-path>`.
//!
//! At most `max_concurrent_first_probes` first probes of new endpoints are in flight;
//! other new endpoints wait for a later tick (resuming where the last claim stopped).
//! Without the bound, a start or a large rollout would open a connection to every new
//! endpoint at once: a thousand HTTP/1.1 connections with their buffers, a memory peak
//! that the heap keeps long after. Probes of evicted endpoints are not bounded: a few
//! hanging until their timeout must not delay another pod's return to its pool.
//!
//! Housekeeping rides on the same loop: expired idle connections are closed and metric
//! series of services and endpoints that are gone are dropped.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::header::{HeaderName, HOST, USER_AGENT};
use http::{HeaderMap, HeaderValue, Method, Request, Uri, Version};
use http_body::Body;
use proxima_core::{Outcome, ProbeShape, ProbeTicket, ServiceKey, ServiceRoute, Table};
use tokio::task::JoinSet;
use tracing::debug;

use crate::forward::request_body::RequestBody;
use crate::forward::{attempt, Attempt};
use crate::Proxy;

/// How often due probes are collected.
pub const TICK: Duration = Duration::from_millis(100);
/// How often idle connections and stale metric series are swept.
const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// Requests remembered per service for traffic-shaped probes.
const SHAPES_KEPT: usize = 8;
/// Marks a probe to the pod (and to whoever reads its logs).
const PROBE_HEADER: HeaderName = HeaderName::from_static("x-proxima-probe");

/// One remembered request: what a traffic-shaped probe sends.
#[derive(Debug)]
struct Shape {
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    seen: Instant,
}

#[derive(Debug, Default)]
struct ServiceShapes {
    /// Newest at the back.
    recent: VecDeque<Arc<Shape>>,
    /// Probes taken since the newest request was remembered (which one is next).
    taken: usize,
}

/// Recent idempotent, body-less requests of services probed with
/// `qos-pool-probe: traffic` (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct TrafficShapes {
    services: Mutex<HashMap<ServiceKey, ServiceShapes>>,
}

impl TrafficShapes {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ServiceKey, ServiceShapes>> {
        self.services.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Remember `req` (as it is about to be forwarded) if its service's probes are
    /// shaped like its traffic and it can be sent again safely: idempotent method, no
    /// body. Cheap when the service does not ask for it.
    pub(crate) fn remember<B: Body>(&self, route: &ServiceRoute, req: &Request<B>, now: Instant) {
        if route.settings().qos_pool.probe != ProbeShape::Traffic
            || !req.body().is_end_stream()
            || !matches!(
                *req.method(),
                Method::GET | Method::HEAD | Method::OPTIONS | Method::PUT | Method::DELETE
            )
        {
            return;
        }
        let mut headers = req.headers().clone();
        headers.remove(http::header::HeaderName::from_static("x-forwarded-for"));
        let shape = Arc::new(Shape {
            method: req.method().clone(),
            uri: req.uri().clone(),
            headers,
            seen: now,
        });
        let mut services = self.lock();
        let entry = services.entry(route.key().clone()).or_default();
        if entry.recent.len() == SHAPES_KEPT {
            entry.recent.pop_front();
        }
        entry.recent.push_back(shape);
        entry.taken = 0;
    }

    /// The request a probe of `service` should imitate: the remembered ones in turn,
    /// newest first; `None` when none is younger than `max_age`.
    fn take(&self, service: &ServiceKey, now: Instant, max_age: Duration) -> Option<Arc<Shape>> {
        let mut services = self.lock();
        let entry = services.get_mut(service)?;
        entry
            .recent
            .retain(|s| now.saturating_duration_since(s.seen) <= max_age);
        if entry.recent.is_empty() {
            services.remove(service);
            return None;
        }
        let n = entry.recent.len();
        let shape = entry.recent[n - 1 - entry.taken % n].clone();
        entry.taken += 1;
        Some(shape)
    }

    /// Drop what was kept for services that are gone or no longer probe this way, and
    /// requests older than their service's `qos-pool-max-age` (they may hold
    /// credentials; see the README).
    fn forget_old(&self, table: &Table, now: Instant) {
        self.lock().retain(|key, shapes| {
            let Some(route) = table.services.get(key) else {
                return false;
            };
            let settings = &route.settings().qos_pool;
            shapes
                .recent
                .retain(|s| now.saturating_duration_since(s.seen) <= settings.max_age);
            settings.probe == ProbeShape::Traffic && !shapes.recent.is_empty()
        });
    }
}

/// Background probes of endpoints evicted from QoS pools (`Router::due_probes` /
/// `finish_probe`), ticking every ~100 ms, until shutdown.
pub async fn run_prober(proxy: Arc<Proxy>, shutdown: impl Future<Output = ()> + Send) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut probes = JoinSet::new();
    let first_in_flight = Arc::new(AtomicUsize::new(0));
    let mut last_sweep = Instant::now();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            _ = tick.tick() => {
                let now = Instant::now();
                let bound = proxy.config.max_concurrent_first_probes;
                let room = bound.saturating_sub(first_in_flight.load(Ordering::Relaxed));
                for ticket in proxy.router.due_probes_at_most(now, room) {
                    let slot = ticket.first.then(|| FirstProbeSlot::take(&first_in_flight));
                    // Boxed: tokio allocates a task 128-byte aligned, and glibc serves
                    // an aligned request only from a free chunk larger by the
                    // alignment, so the hole a finished ~5.8 KB probe task leaves
                    // (split by the small lasting allocations a probe makes, such as
                    // a first estimator sample) never fits the next one: 10,000 first
                    // probes left 40 MB of such holes. A plain allocation of the same
                    // size fits them.
                    let probe = Box::pin(probe(proxy.clone(), ticket));
                    probes.spawn(async move {
                        probe.await;
                        drop(slot);
                    });
                }
                if now.duration_since(last_sweep) >= SWEEP_EVERY {
                    last_sweep = now;
                    proxy.pool.sweep(now);
                    let table = proxy.router.table();
                    proxy.metrics.forget_missing(&table);
                    proxy.probe_shapes.forget_old(&table, now);
                }
            }
            Some(_) = probes.join_next(), if !probes.is_empty() => {}
        }
    }
    // Unfinished probes drop their tickets, which releases the claims.
    probes.shutdown().await;
}

/// A first probe in flight, counted until dropped (with its task, however it ends).
struct FirstProbeSlot(Arc<AtomicUsize>);

impl FirstProbeSlot {
    fn take(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Self(count.clone())
    }
}

impl Drop for FirstProbeSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Probe one endpoint and report the outcome.
async fn probe(proxy: Arc<Proxy>, ticket: ProbeTicket) {
    let service = proxy.metrics.service(&ticket.service);
    let start = Instant::now();
    let deadline = start + ticket.timeout;
    let max_age = proxy
        .router
        .table()
        .services
        .get(&ticket.service)
        .map_or(Duration::ZERO, |route| route.settings().qos_pool.max_age);
    let shape = match ticket.shape {
        ProbeShape::Traffic => proxy.probe_shapes.take(&ticket.service, start, max_age),
        ProbeShape::Path => None,
    };
    let req = match shape {
        Some(shape) => shaped_probe(&shape),
        None => path_probe(&ticket),
    };

    let sent = AtomicBool::new(false);
    let answer = attempt(
        &proxy.pool,
        ticket.addr,
        ticket.protocol,
        req,
        deadline,
        ticket.timeout,
        false,
        &sent,
    );
    let answer = tokio::time::timeout_at(deadline.into(), answer)
        .await
        .unwrap_or(Attempt::TimedOut {
            sent: sent.load(Ordering::Relaxed),
        });
    let outcome = match answer {
        Attempt::Response(response, sender, headers_at) => {
            let latency = headers_at.saturating_duration_since(start);
            let status = response.status().as_u16();
            // Read the body so that the connection can be reused.
            let mut body = response.into_body();
            let drained = tokio::time::timeout_at(deadline.into(), async {
                while let Some(frame) =
                    std::future::poll_fn(|cx| std::pin::Pin::new(&mut body.rest).poll_frame(cx))
                        .await
                {
                    if frame.is_err() {
                        return false;
                    }
                }
                true
            })
            .await;
            body.release(proxy.pool.lease(ticket.addr, sender), drained == Ok(true));
            Outcome::Answered { latency, status }
        }
        Attempt::NotSent(_, error) => {
            debug!(service = %ticket.service, endpoint = %ticket.id, %error, "probe could not connect");
            Outcome::ConnectFailed
        }
        Attempt::Failed(_, error, _) => {
            debug!(service = %ticket.service, endpoint = %ticket.id, %error, "probe failed");
            Outcome::Failed
        }
        Attempt::ClientBodyFailed(error) => {
            debug!(service = %ticket.service, endpoint = %ticket.id, %error, "probe failed");
            Outcome::Failed
        }
        Attempt::TimedOut { .. } => Outcome::Failed,
    };
    let table = proxy.router.table();
    let settings = table
        .services
        .get(&ticket.service)
        .map(|route| route.settings());
    let met = |latency| settings.is_some_and(|s| latency <= s.latency_slo);
    let failure = |status| settings.is_some_and(|s| s.failure_status.contains(status));
    let result = match outcome {
        Outcome::Answered { status, .. } if failure(status) => "error",
        Outcome::Answered { latency, .. } | Outcome::Response { latency } if met(latency) => "met",
        Outcome::Answered { .. } | Outcome::Response { .. } => "missed",
        _ => "error",
    };
    proxy.metrics.probe(&service, result);
    let endpoint = ticket.id.clone();
    debug!(service = service.label(), %endpoint, result, "probe done");
    if let Some(change) = proxy.router.finish_probe(ticket, Instant::now(), outcome) {
        proxy.pool_changed(&service, &endpoint, change);
    }
}

/// `GET <probe-path>`, with the service as `Host`.
fn path_probe(ticket: &ProbeTicket) -> Request<RequestBody> {
    let mut req = Request::new(RequestBody::Empty);
    *req.uri_mut() = ticket
        .path
        .parse::<Uri>()
        .unwrap_or_else(|_| Uri::from_static("/"));
    if let Ok(host) = HeaderValue::from_str(&ticket.service.to_string()) {
        req.headers_mut().insert(HOST, host);
    }
    req.headers_mut()
        .insert(USER_AGENT, HeaderValue::from_static("proxima-probe"));
    req.headers_mut()
        .insert(PROBE_HEADER, HeaderValue::from_static("1"));
    req
}

/// A copy of a remembered real request (see the module docs).
fn shaped_probe(shape: &Shape) -> Request<RequestBody> {
    let mut req = Request::new(RequestBody::Empty);
    *req.method_mut() = shape.method.clone();
    *req.uri_mut() = shape.uri.clone();
    *req.headers_mut() = shape.headers.clone();
    *req.version_mut() = Version::HTTP_11;
    req.headers_mut()
        .insert(PROBE_HEADER, HeaderValue::from_static("1"));
    req
}
