//! What one client connection is doing, so that silent and stalled connections can be
//! closed.
//!
//! hyper's own header read timeout starts only once the auto server has told HTTP/1 from
//! HTTP/2, and HTTP/2 has no idle timeout at all: a socket that sends nothing, or only
//! part of the HTTP/2 preface, or an HTTP/2 connection after its last stream, would stay
//! open for ever. So every connection carries a [`ConnActivity`]:
//!
//! * the connection's service marks each request in flight ([`InFlight`]) from the
//!   moment its headers are parsed until its response body has been sent or dropped;
//! * the socket is wrapped in [`Watched`], which notes the time of the last byte read
//!   or written.
//!
//! The task driving the connection asks [`ConnActivity::deadline`] when it must look
//! again, and [`ConnActivity::verdict`] what to do then:
//!
//! | state | limit | then |
//! |---|---|---|
//! | no request yet | `client_header_timeout` from the accept | close |
//! | nothing in flight after a request | `client_idle_timeout` from the last response | graceful close (HTTP/2 GOAWAY) |
//! | a response body streaming | `body_idle_timeout` from the last byte moved | close at once (the pod connection goes with it) |
//! | waiting for response headers | none here: the service's `timeout` bounds it | |

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;

use crate::metrics::CloseReason;

/// The timeouts of client connections (see the module docs).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ConnTimeouts {
    pub(crate) header: Duration,
    pub(crate) idle: Duration,
    pub(crate) body: Duration,
}

#[derive(Debug)]
struct State {
    in_flight: usize,
    streaming: usize,
    requests: u64,
    idle_since: Instant,
}

/// What one client connection is doing (see the module docs).
#[derive(Debug)]
pub(crate) struct ConnActivity {
    born: Instant,
    /// Milliseconds after `born` of the last byte read or written.
    last_io_ms: AtomicU64,
    state: Mutex<State>,
    changed: Notify,
}

/// What the driver should do with the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Keep,
    /// Close gracefully (finish what runs, HTTP/2 GOAWAY).
    Close(CloseReason),
    /// Cut at once: nothing moves.
    Cut(CloseReason),
}

impl ConnActivity {
    pub(crate) fn new(now: Instant) -> Arc<Self> {
        Arc::new(Self {
            born: now,
            last_io_ms: AtomicU64::new(0),
            state: Mutex::new(State {
                in_flight: 0,
                streaming: 0,
                requests: 0,
                idle_since: now,
            }),
            changed: Notify::new(),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn touch(&self) {
        let ms = u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_io_ms.store(ms, Ordering::Relaxed);
    }

    fn last_io(&self) -> Instant {
        self.born + Duration::from_millis(self.last_io_ms.load(Ordering::Relaxed))
    }

    /// A request's headers have arrived; it is in flight until the guard is dropped.
    pub(crate) fn begin(self: &Arc<Self>) -> InFlight {
        {
            let mut state = self.state();
            state.in_flight += 1;
            state.requests += 1;
        }
        self.changed.notify_one();
        InFlight {
            activity: self.clone(),
            streaming: false,
        }
    }

    /// Resolves when a request begins or ends (the deadline may have moved).
    pub(crate) async fn changed(&self) {
        self.changed.notified().await;
    }

    /// When the driver must next call [`verdict`](Self::verdict); `None` while only
    /// response headers are awaited.
    pub(crate) fn deadline(&self, timeouts: &ConnTimeouts) -> Option<Instant> {
        let state = self.state();
        if state.streaming > 0 {
            Some(self.last_io() + timeouts.body)
        } else if state.in_flight > 0 {
            None
        } else if state.requests == 0 {
            Some(state.idle_since + timeouts.header)
        } else {
            Some(state.idle_since + timeouts.idle)
        }
    }

    /// Whether the connection has outlived its limit at `now`.
    pub(crate) fn verdict(&self, timeouts: &ConnTimeouts, now: Instant) -> Verdict {
        let state = self.state();
        if state.streaming > 0 {
            if now.saturating_duration_since(self.last_io()) >= timeouts.body {
                return Verdict::Cut(CloseReason::Stalled);
            }
        } else if state.in_flight == 0 {
            let (limit, reason) = if state.requests == 0 {
                (timeouts.header, CloseReason::HeaderTimeout)
            } else {
                (timeouts.idle, CloseReason::Idle)
            };
            if now.saturating_duration_since(state.idle_since) >= limit {
                return Verdict::Close(reason);
            }
        }
        Verdict::Keep
    }
}

/// A request in flight on a client connection (see the module docs).
#[derive(Debug)]
pub(crate) struct InFlight {
    activity: Arc<ConnActivity>,
    streaming: bool,
}

impl InFlight {
    /// Response headers are out; the body now streams.
    pub(crate) fn streaming(mut self) -> Self {
        if !self.streaming {
            self.streaming = true;
            // Streaming starts with a fresh stall clock.
            self.activity.touch();
            self.activity.state().streaming += 1;
            self.activity.changed.notify_one();
        }
        self
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        {
            let mut state = self.activity.state();
            state.in_flight = state.in_flight.saturating_sub(1);
            if self.streaming {
                state.streaming = state.streaming.saturating_sub(1);
            }
            if state.in_flight == 0 {
                state.idle_since = Instant::now();
            }
        }
        self.activity.changed.notify_one();
    }
}

/// A client socket that notes when bytes move (see the module docs).
#[derive(Debug)]
pub(crate) struct Watched<S> {
    inner: S,
    activity: Arc<ConnActivity>,
}

impl<S> Watched<S> {
    pub(crate) fn new(inner: S, activity: Arc<ConnActivity>) -> Self {
        Self { inner, activity }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.activity.touch();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            this.activity.touch();
        }
        polled
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            this.activity.touch();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// Logs an error at most once per `every`, with the number of repeats left out, so that
/// a storm (accept failing with EMFILE thousands of times a second) stays readable.
#[derive(Debug)]
pub(crate) struct RateLimited {
    every: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl RateLimited {
    pub(crate) fn new(every: Duration) -> Self {
        Self {
            every,
            last: None,
            suppressed: 0,
        }
    }

    /// `Some(repeats suppressed since the last line)` when a line may be logged now.
    pub(crate) fn allow(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(last) if now.saturating_duration_since(last) < self.every => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timeouts() -> ConnTimeouts {
        ConnTimeouts {
            header: Duration::from_secs(1),
            idle: Duration::from_secs(2),
            body: Duration::from_secs(3),
        }
    }

    #[test]
    fn a_silent_new_connection_times_out_on_headers() {
        let t0 = Instant::now();
        let activity = ConnActivity::new(t0);
        let t = timeouts();
        assert_eq!(activity.deadline(&t), Some(t0 + t.header));
        assert_eq!(activity.verdict(&t, t0), Verdict::Keep);
        assert_eq!(
            activity.verdict(&t, t0 + t.header),
            Verdict::Close(CloseReason::HeaderTimeout)
        );
    }

    #[test]
    fn requests_in_flight_hold_off_the_idle_timeout_and_streams_watch_bytes() {
        let t0 = Instant::now();
        let activity = ConnActivity::new(t0);
        let t = timeouts();
        let guard = activity.begin();
        assert_eq!(activity.deadline(&t), None);
        assert_eq!(activity.verdict(&t, t0 + t.idle * 10), Verdict::Keep);
        let guard = guard.streaming();
        let deadline = activity.deadline(&t).expect("streaming has a deadline");
        assert!(deadline >= t0 + t.body);
        assert_eq!(
            activity.verdict(&t, deadline),
            Verdict::Cut(CloseReason::Stalled)
        );
        drop(guard);
        let idle = activity.deadline(&t).expect("idle deadline");
        assert!(idle >= t0 + t.idle);
        assert_eq!(
            activity.verdict(&t, idle),
            Verdict::Close(CloseReason::Idle)
        );
    }

    #[test]
    fn rate_limited_logs_count_what_they_left_out() {
        let t0 = Instant::now();
        let mut limit = RateLimited::new(Duration::from_secs(1));
        assert_eq!(limit.allow(t0), Some(0));
        assert_eq!(limit.allow(t0 + Duration::from_millis(10)), None);
        assert_eq!(limit.allow(t0 + Duration::from_millis(20)), None);
        assert_eq!(limit.allow(t0 + Duration::from_secs(1)), Some(2));
    }
}
