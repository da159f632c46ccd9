//! What one client connection is doing, so that silent and stalled connections can be
//! closed.
//!
//! hyper's own header read timeout starts only once the auto server has told HTTP/1 from
//! HTTP/2, and HTTP/2 has no idle timeout at all: a socket that sends nothing, or only
//! part of the HTTP/2 preface, or an HTTP/2 connection after its last stream, would stay
//! open for ever; and hyper's HTTP/1 timer costs an allocation and a timer-wheel entry
//! per request. So hyper's is off, and every connection carries a [`ConnActivity`]:
//!
//! * the connection's service marks each request in flight ([`InFlight`]) from the
//!   moment its headers are parsed until its response body has been sent or dropped;
//! * the socket is wrapped in [`Watched`], which notes the time of the last byte read
//!   or written, and on HTTP/1.1 the time the first byte of the next request's head
//!   arrived while nothing was in flight.
//!
//! The task driving the connection asks [`ConnActivity::next_check`] when it must look
//! again, and [`ConnActivity::verdict`] what to do then. Requests beginning and ending
//! do not wake the driver: a limit that starts after the driver's last look (a request
//! ends, a body starts to stream) ends no sooner than the shortest limit after that
//! look, and the driver never waits longer than that between looks. So no look is late,
//! and a busy connection costs one timer that fires about once per shortest limit,
//! instead of three wake-ups of its task per request.
//!
//! | state | limit | then |
//! |---|---|---|
//! | no request yet | `client_header_timeout` from the accept | close |
//! | nothing in flight after a request | `client_idle_timeout` from the last response | graceful close (HTTP/2 GOAWAY) |
//! | HTTP/1.1: the next request's head begun, not complete | `client_header_timeout` from its first byte (or the idle limit, if sooner) | close |
//! | a response body streaming, or a write the client does not take (its socket full) | `body_idle_timeout` from the last byte moved | close at once (the pod connection goes with it) |
//! | waiting for response headers | none here: the service's `timeout` bounds it | |
//! | HTTP/1.1 on the proxy's own loop, nothing in flight, nothing of a next head | `park` ([`PARK_AFTER`]) from the last response | park: the connection gives up its task until the socket is readable (`client/server.rs`) |
//! | hyper holds the connection, nothing in flight | `rest` ([`PARK_AFTER`]) from the last response | poll the connection once more: an idle HTTP/2 connection gives back its buffers |
//!
//! [`Watched`] also gives hyper's own HTTP/1 error answers a JSON body like the proxy's
//! other errors. hyper answers a request head it cannot take (longer than its read
//! buffer: `431`; a target over 65534 bytes: `414`; malformed: `400`) with a bare status
//! line before the proxy sees the request. [`Watched`] counts the final response heads
//! written: each request the proxy served gets one; a `4xx` head written when every
//! served request has had its head, with nothing in flight, is hyper's, and is replaced
//! by the proxy's own answer. A `431` whose request line alone was longer than the target limit becomes
//! `414`, as a shorter over-long target would get from the proxy.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::metrics::CloseReason;

/// The timeouts of client connections (see the module docs).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ConnTimeouts {
    pub(crate) header: Duration,
    pub(crate) idle: Duration,
    pub(crate) body: Duration,
    /// Idle time after which a connection may park; `None` where it cannot (hyper has
    /// the connection).
    pub(crate) park: Option<Duration>,
    /// Idle time after which a connection hyper holds is polled once more (the driver
    /// gets [`Verdict::Park`] and does not park): HTTP/2 gives back its buffers then
    /// (vendor/h2/PROXIMA-PATCH.md), not at every pause between streams.
    pub(crate) rest: Option<Duration>,
}

/// How long an HTTP/1.1 connection idles on its task before it parks (`client/park.rs`).
/// Waking costs about what a request does (a task and its state made again), so a
/// connection in steady use, whose next request comes sooner, does not park; a device
/// that sends a reading now and then spends nearly all its time parked. Short, because
/// connections that have not parked yet hold their task's state (several kilobytes):
/// a burst of new connections costs that for a quarter second, not for their life.
/// The watchdog looks at a busy connection this often (one timer per connection).
pub(crate) const PARK_AFTER: Duration = Duration::from_millis(250);

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
    /// Requests in flight, readable without the lock (see [`Watched`]).
    busy: AtomicUsize,
    /// Requests begun so far, readable without the lock.
    started: AtomicU64,
    /// Milliseconds after `born` of the last byte read or written.
    last_io_ms: AtomicU64,
    /// Milliseconds after `born` of the first byte of the next HTTP/1.1 request head,
    /// read while nothing was in flight; [`NO_HEAD`] when none has begun.
    head_from_ms: AtomicU64,
    /// The connection speaks HTTP/1 (known from its first request).
    http1: AtomicBool,
    /// The last write found the socket full: the client is not taking what it is sent.
    write_waiting: AtomicBool,
    state: Mutex<State>,
}

/// What the driver should do with the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Keep,
    /// Close gracefully (finish what runs, HTTP/2 GOAWAY).
    Close(CloseReason),
    /// Cut at once: nothing moves.
    Cut(CloseReason),
    /// Idle long enough to park, or where hyper holds the connection, to rest (see
    /// [`ConnTimeouts::park`] and [`ConnTimeouts::rest`]).
    Park,
}

/// [`ConnActivity::head_from_ms`] when no head has begun.
const NO_HEAD: u64 = u64::MAX;

impl ConnActivity {
    pub(crate) fn new(now: Instant) -> Arc<Self> {
        Arc::new(Self {
            born: now,
            busy: AtomicUsize::new(0),
            started: AtomicU64::new(0),
            last_io_ms: AtomicU64::new(0),
            head_from_ms: AtomicU64::new(NO_HEAD),
            http1: AtomicBool::new(false),
            write_waiting: AtomicBool::new(false),
            state: Mutex::new(State {
                in_flight: 0,
                streaming: 0,
                requests: 0,
                idle_since: now,
            }),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Milliseconds since `born`, by the coarse clock: activity is kept for timeouts of
    /// seconds (`clock.rs`).
    fn elapsed_ms(&self) -> u64 {
        let elapsed = crate::clock::coarse_now().saturating_duration_since(self.born);
        u64::try_from(elapsed.as_millis()).unwrap_or(NO_HEAD - 1)
    }

    /// Bytes moved now; returns the time noted (milliseconds after `born`).
    fn touch(&self) -> u64 {
        let ms = self.elapsed_ms();
        self.last_io_ms.store(ms, Ordering::Relaxed);
        ms
    }

    /// Bytes arrived at `at_ms` while nothing was in flight: on HTTP/1.1 after a first
    /// request, they begin the next request's head, which has `client_header_timeout`
    /// from then.
    fn head_bytes(&self, at_ms: u64) {
        if self.http1.load(Ordering::Relaxed)
            && self.head_from_ms.load(Ordering::Relaxed) == NO_HEAD
        {
            self.head_from_ms.store(at_ms, Ordering::Relaxed);
        }
    }

    /// When the next HTTP/1.1 request's head began, if it has.
    fn head_from(&self) -> Option<Instant> {
        match self.head_from_ms.load(Ordering::Relaxed) {
            NO_HEAD => None,
            ms => Some(self.born + Duration::from_millis(ms)),
        }
    }

    /// When the connection may be closed as idle, if it stays idle from now on.
    pub(crate) fn idle_until(&self, timeouts: &ConnTimeouts) -> Instant {
        self.state().idle_since + timeouts.idle
    }

    fn last_io(&self) -> Instant {
        self.born + Duration::from_millis(self.last_io_ms.load(Ordering::Relaxed))
    }

    /// No request is in flight.
    pub(crate) fn is_idle(&self) -> bool {
        self.busy.load(Ordering::Relaxed) == 0
    }

    /// A request's headers have arrived; it is in flight until the guard is dropped.
    /// `http1`: the request came over HTTP/1.x.
    pub(crate) fn begin(self: &Arc<Self>, http1: bool) -> InFlight {
        if http1 {
            self.http1.store(true, Ordering::Relaxed);
        }
        self.head_from_ms.store(NO_HEAD, Ordering::Relaxed);
        {
            let mut state = self.state();
            state.in_flight += 1;
            state.requests += 1;
            self.busy.store(state.in_flight, Ordering::Relaxed);
            self.started.store(state.requests, Ordering::Relaxed);
        }
        InFlight {
            activity: self.clone(),
            streaming: false,
        }
    }

    /// When the driver, looking at `now`, must next call [`verdict`](Self::verdict):
    /// the current limit's deadline, but no later than `now` plus the shortest limit
    /// (the park or rest limit counts), the earliest a limit that starts after `now` (a
    /// request ends, a body starts to stream) could end.
    pub(crate) fn next_check(&self, timeouts: &ConnTimeouts, now: Instant) -> Instant {
        let shortest = timeouts.header.min(timeouts.idle).min(timeouts.body);
        let soonest = now
            + timeouts
                .park
                .or(timeouts.rest)
                .map_or(shortest, |park| park.min(shortest));
        self.deadline(timeouts)
            .map_or(soonest, |deadline| deadline.min(soonest))
    }

    /// Bytes move (a body streams, or a write waits for the client to take bytes): the
    /// stall limit applies.
    fn moving(&self, state: &State) -> bool {
        state.streaming > 0 || self.write_waiting.load(Ordering::Relaxed)
    }

    /// The current limit's deadline; `None` while only response headers are awaited.
    fn deadline(&self, timeouts: &ConnTimeouts) -> Option<Instant> {
        let state = self.state();
        if self.moving(&state) {
            Some(self.last_io() + timeouts.body)
        } else if state.in_flight > 0 {
            None
        } else if state.requests == 0 {
            Some(state.idle_since + timeouts.header)
        } else {
            let idle = state.idle_since + timeouts.idle;
            let idle = match self.parkable(timeouts) {
                Some(park) => idle.min(state.idle_since + park),
                None => idle,
            };
            Some(
                self.head_from()
                    .map_or(idle, |from| idle.min(from + timeouts.header)),
            )
        }
    }

    /// The park limit, when it applies: HTTP/1.1 after a request, with nothing of the
    /// next head read; else the rest limit, if any (the caller has checked that nothing
    /// is in flight or moving).
    fn parkable(&self, timeouts: &ConnTimeouts) -> Option<Duration> {
        let http1 = self.http1.load(Ordering::Relaxed);
        timeouts
            .park
            .filter(|_| http1 && self.head_from().is_none())
            .or(timeouts.rest)
    }

    /// Whether the connection has outlived its limit at `now`.
    pub(crate) fn verdict(&self, timeouts: &ConnTimeouts, now: Instant) -> Verdict {
        let state = self.state();
        if self.moving(&state) {
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
            let head_late = self
                .head_from()
                .is_some_and(|from| now.saturating_duration_since(from) >= timeouts.header);
            if state.requests > 0 && head_late {
                return Verdict::Close(CloseReason::HeaderTimeout);
            }
            let park = self.parkable(timeouts).filter(|_| state.requests > 0);
            if park.is_some_and(|park| now.saturating_duration_since(state.idle_since) >= park) {
                return Verdict::Park;
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
                state.idle_since = crate::clock::coarse_now();
            }
            self.activity.busy.store(state.in_flight, Ordering::Relaxed);
        }
    }
}

/// A client socket that notes when bytes move and dresses hyper's own error answers
/// (see the module docs).
#[derive(Debug)]
pub(crate) struct Watched<S> {
    inner: S,
    activity: Arc<ConnActivity>,
    /// Longest request target the proxy accepts (`max_uri_bytes`).
    max_target: usize,
    /// Bytes of the current request line read so far, between requests.
    line: usize,
    /// The current request line has ended.
    line_done: bool,
    /// Requests begun when the line count was last reset.
    counted_from: u64,
    /// Response heads of the proxy's own (non-informational) answers written so far.
    heads: u64,
    /// Swallowing hyper's error head until its blank line.
    swallowing: bool,
    /// The proxy's answer still to be written in place of hyper's.
    pending: Vec<u8>,
    /// Bytes already read (and noted) by the native loop, read again first by hyper
    /// when it takes the connection over (`http1/serve.rs`).
    replay: bytes::Bytes,
}

impl<S> Watched<S> {
    pub(crate) fn new(inner: S, activity: Arc<ConnActivity>, max_target: usize) -> Self {
        Self {
            inner,
            activity,
            max_target,
            line: 0,
            line_done: false,
            counted_from: 0,
            heads: 0,
            swallowing: false,
            pending: Vec::new(),
            replay: bytes::Bytes::new(),
        }
    }

    fn idle(&self) -> bool {
        self.activity.busy.load(Ordering::Relaxed) == 0
    }

    /// The socket, for a connection that parks between requests (nothing is pending
    /// or to be replayed then: the native loop parks only with nothing read).
    pub(crate) fn into_inner(self) -> S {
        self.inner
    }

    /// Have `bytes`, already read from the socket, read again before anything new.
    pub(crate) fn replay(&mut self, bytes: bytes::Bytes) {
        self.replay = bytes;
    }

    /// `new` bytes were read: note the time and, between requests, how far the next
    /// request line has come (for [`Watched::replacement`]).
    fn note_read(&mut self, new: &[u8]) {
        let at_ms = self.activity.touch();
        let idle = self.idle();
        if idle {
            self.activity.head_bytes(at_ms);
        }
        let started = self.activity.started.load(Ordering::Relaxed);
        if started != self.counted_from {
            // A request began since: what is read between requests now is the next head.
            self.counted_from = started;
            self.line = 0;
            self.line_done = false;
        }
        if idle && !self.line_done {
            match new.iter().position(|b| *b == b'\n') {
                Some(at) => {
                    self.line += at;
                    self.line_done = true;
                }
                None => self.line += new.len(),
            }
        }
    }

    /// The answer to give instead of hyper's bare `status`, if the proxy has one.
    fn replacement(&self, status: &[u8]) -> Option<Vec<u8>> {
        let target_too_long = (
            414,
            "URI Too Long",
            "request target too long",
            format!(
                "the request target is longer than {} bytes",
                self.max_target
            ),
        );
        let (code, reason, error, detail) = match status {
            b"414" => target_too_long,
            b"431" if !self.line_done || self.line > self.max_target => target_too_long,
            b"431" => (
                431,
                "Request Header Fields Too Large",
                "request headers too large",
                "the request head is too large or has too many header lines".to_string(),
            ),
            b"400" => (
                400,
                "Bad Request",
                "malformed request",
                "the request head is not valid HTTP/1.1".to_string(),
            ),
            _ => return None,
        };
        let body = serde_json::json!({"error": error, "service": "", "detail": detail}).to_string();
        Some(
            format!(
                "HTTP/1.1 {code} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            )
            .into_bytes(),
        )
    }

    /// Write what is pending of the proxy's own answer.
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>>
    where
        S: AsyncWrite + Unpin,
    {
        while !self.pending.is_empty() {
            match Pin::new(&mut self.inner).poll_write(cx, &self.pending) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => {
                    self.pending.drain(..n);
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Take `buf` from hyper as written if it is (part of) hyper's own error head that
    /// is being replaced; `Some(bytes taken)` then.
    ///
    /// Every request the proxy served gets one final response head, written by hyper
    /// (often after the body has been handed over, so "nothing in flight" alone does not
    /// tell). A final head written when every served request already has its head is
    /// hyper's own error answer.
    fn intercept(&mut self, buf: &[u8]) -> Option<usize> {
        if !self.swallowing {
            let head = buf.len() >= 12
                && (buf.starts_with(b"HTTP/1.1 ") || buf.starts_with(b"HTTP/1.0 "))
                && buf[9] != b'1';
            if !head {
                return None;
            }
            if self.heads < self.activity.started.load(Ordering::Relaxed) {
                self.heads += 1;
                return None;
            }
            if buf[9] != b'4' || !self.idle() {
                return None;
            }
            self.pending = self.replacement(&buf[9..12])?;
            self.swallowing = true;
        }
        // Up to and including the blank line ending hyper's head (its body is empty).
        match buf.windows(4).position(|w| w == b"\r\n\r\n") {
            Some(end) => {
                self.swallowing = false;
                Some(end + 4)
            }
            None => Some(buf.len()),
        }
    }
}

impl Watched<tokio::net::TcpStream> {
    /// Read what the socket has into `buf` (for the proxy's own HTTP/1.1 server,
    /// `http1/serve.rs`), as `http1::poll_fill` does for pods; `Ok(0)` is the end of the
    /// stream. A read that empties the receive queue also forgets the socket's
    /// readiness without a system call (`http1::forget_readable`), so that watching the
    /// socket for a close while a request is forwarded costs nothing.
    ///
    /// A `buf` without room gets it only once the socket is readable: a connection that
    /// has sent nothing yet (new, or just woken from parking) holds no read buffer.
    pub(crate) fn poll_fill(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut bytes::BytesMut,
        room: usize,
    ) -> Poll<io::Result<usize>> {
        if buf.capacity() == 0 {
            ready!(self.inner.poll_read_ready(cx))?;
        }
        let before = buf.len();
        let mut drained = false;
        let n = ready!(crate::http1::poll_fill(
            &self.inner,
            buf,
            room,
            &mut drained,
            cx
        ))?;
        if n > 0 {
            self.note_read(&buf[before..]);
            if drained {
                crate::http1::forget_readable(&self.inner);
            }
        }
        Poll::Ready(Ok(n))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.replay.is_empty() {
            let n = this.replay.len().min(buf.remaining());
            buf.put_slice(&this.replay.split_to(n));
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.note_read(&buf.filled()[before..]);
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> Watched<S> {
    /// One write of either kind: `first` (the first non-empty buffer) may be taken by
    /// the interceptor; otherwise what is pending goes first, then `write`.
    fn write_with(
        &mut self,
        cx: &mut Context<'_>,
        first: Option<&[u8]>,
        write: impl FnOnce(Pin<&mut S>, &mut Context<'_>) -> Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        if let Some(taken) = first.and_then(|buf| self.intercept(buf)) {
            // Written now if the socket takes it, else on the flush that follows.
            if let Poll::Ready(Err(e)) = self.poll_pending(cx) {
                return Poll::Ready(Err(e));
            }
            return Poll::Ready(Ok(taken));
        }
        if self.poll_pending(cx)?.is_pending() {
            return Poll::Pending;
        }
        let polled = write(Pin::new(&mut self.inner), cx);
        let waiting = &self.activity.write_waiting;
        match polled {
            Poll::Ready(Ok(n)) if n > 0 => {
                self.activity.touch();
                if waiting.load(Ordering::Relaxed) {
                    waiting.store(false, Ordering::Relaxed);
                }
            }
            // The client takes nothing more for now: from here the stall limit runs (a
            // client that pipelines requests and never reads its answers would
            // otherwise hold the connection for ever).
            Poll::Pending => waiting.store(true, Ordering::Relaxed),
            _ => {}
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
        self.get_mut()
            .write_with(cx, Some(buf), |inner, cx| inner.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let first = bufs.iter().find(|b| !b.is_empty()).map(|b| &**b);
        self.get_mut()
            .write_with(cx, first, |inner, cx| inner.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.poll_pending(cx)?.is_pending() {
            return Poll::Pending;
        }
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.poll_pending(cx)?.is_pending() {
            return Poll::Pending;
        }
        Pin::new(&mut this.inner).poll_shutdown(cx)
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
            park: None,
            rest: None,
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
        let guard = activity.begin(true);
        assert_eq!(activity.deadline(&t), None);
        let later = t0 + Duration::from_millis(500);
        assert_eq!(activity.next_check(&t, later), later + t.header);
        // A limit can start at any time after a look (here a body could start to
        // stream): looks are never further apart than the shortest limit.
        let quick = ConnTimeouts {
            body: Duration::from_millis(100),
            ..t
        };
        assert_eq!(activity.next_check(&quick, later), later + quick.body);
        assert_eq!(activity.verdict(&t, t0 + t.idle * 10), Verdict::Keep);
        let guard = guard.streaming();
        let deadline = activity.deadline(&t).expect("streaming has a deadline");
        // Activity is noted by the coarse clock, up to a tick behind (`clock.rs`).
        assert!(deadline + crate::clock::MAX_LAG >= t0 + t.body);
        assert_eq!(
            activity.verdict(&t, deadline),
            Verdict::Cut(CloseReason::Stalled)
        );
        drop(guard);
        let idle = activity.deadline(&t).expect("idle deadline");
        assert!(idle + crate::clock::MAX_LAG >= t0 + t.idle);
        assert_eq!(
            activity.verdict(&t, idle),
            Verdict::Close(CloseReason::Idle)
        );
    }

    #[test]
    fn an_idle_http1_connection_parks_after_its_limit_but_not_before_a_request_or_mid_head() {
        let t0 = Instant::now();
        let activity = ConnActivity::new(t0);
        let t = ConnTimeouts {
            park: Some(Duration::from_millis(250)),
            ..timeouts()
        };
        // No request yet: the header limit, no parking.
        assert_eq!(activity.verdict(&t, t0 + t.header / 2), Verdict::Keep);
        assert_eq!(activity.next_check(&t, t0), t0 + Duration::from_millis(250));
        drop(activity.begin(true));
        let idle_since = activity.state().idle_since;
        assert_eq!(
            activity.deadline(&t),
            Some(idle_since + Duration::from_millis(250))
        );
        assert_eq!(activity.verdict(&t, idle_since), Verdict::Keep);
        assert_eq!(
            activity.verdict(&t, idle_since + Duration::from_millis(250)),
            Verdict::Park
        );
        // Where a connection cannot park (hyper has it), the idle limit is all there is.
        let hyper = ConnTimeouts { park: None, ..t };
        assert_eq!(activity.deadline(&hyper), Some(idle_since + t.idle));
        assert_eq!(
            activity.verdict(&hyper, idle_since + Duration::from_millis(250)),
            Verdict::Keep
        );
        // A next head begun: its header limit, no parking.
        activity.head_bytes(activity.elapsed_ms());
        assert_eq!(
            activity.verdict(&t, idle_since + Duration::from_millis(300)),
            Verdict::Keep
        );
        // Over HTTP/2 (or before HTTP/1 is known), no parking either.
        let h2 = ConnActivity::new(t0);
        drop(h2.begin(false));
        let since = h2.state().idle_since;
        assert_eq!(
            h2.verdict(&t, since + Duration::from_secs(1)),
            Verdict::Keep
        );
    }

    #[test]
    fn a_connection_hyper_holds_is_looked_at_once_it_has_rested_but_never_parks_mid_request() {
        let t0 = Instant::now();
        let rest = Duration::from_millis(250);
        let hyper = ConnTimeouts {
            rest: Some(rest),
            ..timeouts()
        };
        for http1 in [false, true] {
            let activity = ConnActivity::new(t0);
            // No request yet: only the header limit.
            assert_eq!(activity.deadline(&hyper), Some(t0 + hyper.header));
            let request = activity.begin(http1);
            // In flight: no look for rest, however long it takes.
            assert_eq!(activity.verdict(&hyper, t0 + rest * 3), Verdict::Keep);
            drop(request);
            let idle_since = activity.state().idle_since;
            assert_eq!(activity.deadline(&hyper), Some(idle_since + rest));
            assert_eq!(activity.verdict(&hyper, idle_since), Verdict::Keep);
            assert_eq!(activity.verdict(&hyper, idle_since + rest), Verdict::Park);
            // Once rested, the driver looks next at the shortest limit from now, then
            // closes at the idle limit as before.
            let resting = ConnTimeouts {
                rest: None,
                ..hyper
            };
            let now = idle_since + rest;
            assert_eq!(activity.next_check(&resting, now), now + hyper.header);
            // Before it has rested, a look is never more than the rest limit away: a
            // request may end between two looks.
            assert_eq!(activity.next_check(&hyper, idle_since), idle_since + rest);
            assert_eq!(
                activity.verdict(&hyper, idle_since + hyper.idle),
                Verdict::Close(CloseReason::Idle)
            );
        }
    }

    #[test]
    fn a_begun_http1_head_has_the_header_timeout_and_a_silent_keep_alive_the_idle_one() {
        let t0 = Instant::now();
        let t = timeouts();
        assert!(t.header < t.idle);
        for http1 in [true, false] {
            let activity = ConnActivity::new(t0);
            drop(activity.begin(http1));
            let idle_since = activity.state().idle_since;
            // Silent after its request: the idle limit, not the header one.
            assert_eq!(activity.deadline(&t), Some(idle_since + t.idle));
            assert_eq!(activity.verdict(&t, idle_since + t.header), Verdict::Keep);
            // Bytes of a next head arrive while nothing is in flight: on HTTP/1.1 the
            // head must be complete within the header limit (HTTP/2 frames between
            // streams are no head).
            activity.head_bytes(activity.elapsed_ms());
            let from = activity.head_from();
            assert_eq!(from.is_some(), http1);
            if let Some(from) = from {
                assert_eq!(activity.deadline(&t), Some(from + t.header));
                assert_eq!(
                    activity.verdict(&t, from + t.header),
                    Verdict::Close(CloseReason::HeaderTimeout)
                );
                // Once the head is complete the request is in flight, and the clock of
                // the next head starts afresh.
                let guard = activity.begin(true);
                assert_eq!(activity.head_from(), None);
                assert_eq!(activity.verdict(&t, from + t.header), Verdict::Keep);
                drop(guard);
            } else {
                assert_eq!(activity.verdict(&t, idle_since + t.header), Verdict::Keep);
            }
        }
    }

    /// A client that takes none of what it is sent: once the socket is full, the stall
    /// limit runs even with no body streaming (a small answer, complete when its head
    /// came), and a write that goes through again stops it.
    #[tokio::test]
    async fn a_write_the_client_does_not_take_runs_the_stall_limit() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let t0 = Instant::now();
        let activity = ConnActivity::new(t0);
        let t = timeouts();
        let _guard = activity.begin(true);
        let mut watched = Watched::new(server, activity.clone(), 1024);
        // Write until the socket takes nothing more.
        let block = vec![b'x'; 64 << 10];
        let mut sent = 0usize;
        loop {
            let write =
                std::future::poll_fn(|cx| match Pin::new(&mut watched).poll_write(cx, &block) {
                    Poll::Pending => Poll::Ready(None),
                    Poll::Ready(r) => Poll::Ready(Some(r)),
                });
            match write.await {
                Some(Ok(n)) => sent += n,
                Some(Err(e)) => panic!("{e}"),
                None => break,
            }
        }
        assert!(sent > 0);
        let deadline = activity
            .deadline(&t)
            .expect("a waiting write has a deadline");
        assert_eq!(deadline, activity.last_io() + t.body);
        assert_eq!(
            activity.verdict(&t, deadline),
            Verdict::Cut(CloseReason::Stalled)
        );
        // The client reads: the next write goes through, and only response headers
        // are awaited again as far as the limits go.
        let mut sink = vec![0u8; sent];
        client.read_exact(&mut sink).await.unwrap();
        watched.write_all(b"more").await.unwrap();
        assert_eq!(activity.deadline(&t), None);
        assert_eq!(activity.verdict(&t, t0 + t.body * 10), Verdict::Keep);
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
