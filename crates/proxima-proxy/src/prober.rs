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
//! Housekeeping rides on the same loop: expired idle connections are closed and metric
//! series of services and endpoints that are gone are dropped.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::header::{HOST, USER_AGENT};
use http::{HeaderValue, Request, Uri};
use http_body::Body;
use proxima_core::{Outcome, ProbeTicket};
use tokio::task::JoinSet;
use tracing::debug;

use crate::body::RequestBody;
use crate::forward::{attempt, Attempt};
use crate::Proxy;

/// How often due probes are collected.
pub const TICK: Duration = Duration::from_millis(100);
/// How often idle connections and stale metric series are swept.
const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// Background probes of endpoints evicted from QoS pools (`Router::due_probes` /
/// `finish_probe`), ticking every ~100 ms, until shutdown.
pub async fn run_prober(proxy: Arc<Proxy>, shutdown: impl Future<Output = ()> + Send) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut probes = JoinSet::new();
    let mut last_sweep = Instant::now();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            _ = tick.tick() => {
                let now = Instant::now();
                for ticket in proxy.router.due_probes(now) {
                    probes.spawn(probe(proxy.clone(), ticket));
                }
                if now.duration_since(last_sweep) >= SWEEP_EVERY {
                    last_sweep = now;
                    proxy.pool.sweep(now);
                    proxy.metrics.forget_missing(&proxy.router.table());
                }
            }
            Some(_) = probes.join_next(), if !probes.is_empty() => {}
        }
    }
    // Unfinished probes drop their tickets, which releases the claims.
    probes.shutdown().await;
}

/// Probe one endpoint and report the outcome.
async fn probe(proxy: Arc<Proxy>, ticket: ProbeTicket) {
    let service = proxy.metrics.service(&ticket.service);
    let start = Instant::now();
    let deadline = start + ticket.timeout;
    let host = HeaderValue::from_str(&ticket.service.to_string()).ok();
    let mut req = Request::new(RequestBody::Empty);
    *req.uri_mut() = ticket
        .path
        .parse::<Uri>()
        .unwrap_or_else(|_| Uri::from_static("/"));
    if let Some(host) = host {
        req.headers_mut().insert(HOST, host);
    }
    req.headers_mut()
        .insert(USER_AGENT, HeaderValue::from_static("proxima-probe"));

    let outcome = match attempt(&proxy.pool, ticket.addr, req, deadline, ticket.timeout).await {
        Attempt::Response(response, sender) => {
            let latency = start.elapsed();
            let status = response.status().as_u16();
            // Read the body so that the connection can be reused.
            let mut body = response.into_body();
            let drained = tokio::time::timeout_at(deadline.into(), async {
                while let Some(frame) =
                    std::future::poll_fn(|cx| std::pin::Pin::new(&mut body).poll_frame(cx)).await
                {
                    if frame.is_err() {
                        return false;
                    }
                }
                true
            })
            .await;
            if drained == Ok(true) {
                proxy.pool.put(ticket.addr, sender);
            }
            Outcome::Answered { latency, status }
        }
        Attempt::NotSent(_, error) => {
            debug!(service = %ticket.service, endpoint = %ticket.id, %error, "probe could not connect");
            Outcome::ConnectFailed
        }
        Attempt::Failed(_, error) | Attempt::ClientBodyFailed(error) => {
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
