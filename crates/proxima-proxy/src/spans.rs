//! The `request` span: one per client request, so that every log line about a request
//! (from the pick to the last retry) carries the same fields and can be joined to it.
//!
//! Fields: `id` (this proxy's running number of the request), `service` (as the client
//! named it), and, once picked, `endpoint` and `attempt` (1 for the first try, 2 for
//! the first retry, ...), recorded again on every retry so a line shows the attempt it
//! is about. The span is at `info` level so that `warn` lines carry it under the
//! default filter; it logs nothing itself, and per-request lines stay at `debug`.

use std::sync::atomic::{AtomicU64, Ordering};

use proxima_core::{EndpointId, ServiceKey};
use tracing::field::Empty;
use tracing::{info_span, Span};

/// Requests seen by this process, for the span's `id`.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A new `request` span for a request naming `service`: its key, or (`Err`) what the
/// client wrote when it names no valid service. Endpoint and attempt start empty.
pub(crate) fn request(service: Result<&ServiceKey, &str>) -> Span {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let span = info_span!(
        "request",
        id,
        service = Empty,
        endpoint = Empty,
        attempt = Empty
    );
    if !span.is_disabled() {
        match service {
            Ok(key) => span.record("service", tracing::field::display(key)),
            Err(named) => span.record("service", named),
        };
    }
    span
}

/// Record in the current `request` span that attempt number `attempt` goes to
/// `endpoint`.
pub(crate) fn record_attempt(endpoint: &EndpointId, attempt: u32) {
    let span = Span::current();
    if !span.is_disabled() {
        span.record("endpoint", endpoint.as_str());
        span.record("attempt", attempt);
    }
}
