//! HTTP/2 to pods whose port speaks h2c (issue 28; `PortProtocol::H2c`, from
//! `appProtocol` or the port's name): multiplexed connections, opened with prior
//! knowledge (RFC 9113 §3.3), each carrying many requests at once.
//!
//! * **Streams per connection.** A connection takes new requests while its open streams
//!   are below the smaller of the pod's `SETTINGS_MAX_CONCURRENT_STREAMS` and
//!   `--upstream-h2-max-streams` (100 by default, the least RFC 9113 §6.5.2 asks a peer to
//!   allow). When every connection to the pod is full, another is opened, instead of
//!   queueing requests behind the full one (hyper's client would hold them until a stream
//!   ends). hyper does not expose the pod's settings, so [`SettingsTap`] reads the first
//!   frame the pod sends, its SETTINGS preface (§3.4), as it passes; a pod that lowers
//!   the limit later is still obeyed by hyper's client, the extra requests then wait.
//! * **Flow control end to end.** hyper's client gives window back to the pod only as
//!   the client of the proxy takes the data, and sends the request body only as the pod
//!   grants window, so a slow side slows the other rather than filling the proxy.
//! * **Dead connections.** Each connection pings the pod every
//!   `--upstream-h2-ping-interval` (10 s), idle or not, and is closed if no answer comes
//!   in [`PING_TIMEOUT`] (or the interval, if shorter): a pod that vanished without a
//!   FIN or RST (node lost, network cut) takes no more requests after that, rather than
//!   every request sent on it waiting for its timeout. A connection with no open stream
//!   for the pool's idle timeout is closed by [`H2Pool::sweep`].
//! * **GOAWAY.** A connection that received GOAWAY takes no new requests (hyper marks
//!   it closed). Requests the pod never processed (stream ids above the GOAWAY's last
//!   stream id, and streams refused with `REFUSED_STREAM`) fail with errors that
//!   [`never_processed`] recognises; `forward.rs` sends them to another pod, as RFC 9113
//!   §8.7 allows for any method.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::OnceCell;

use crate::forward::request_body::RequestBody;
use crate::upstream::connect::ConnectError;

/// The longest a ping may go unanswered before its connection is closed (at most the
/// ping interval).
const PING_TIMEOUT: Duration = Duration::from_secs(5);
/// Streams per connection before the pod's SETTINGS arrive (as hyper's client).
const DEFAULT_STREAMS: u32 = 100;

/// A sender of requests on one multiplexed connection.
pub(crate) type H2Sender = http2::SendRequest<RequestBody>;

/// The multiplexed connections to each pod (see the module docs).
#[derive(Debug)]
pub(crate) struct H2Pool {
    conns: Mutex<HashMap<SocketAddr, Vec<Arc<H2Conn>>>>,
    /// `--upstream-h2-max-streams`.
    max_streams: u32,
    /// `--upstream-h2-ping-interval`.
    ping_interval: Duration,
    idle_timeout: Duration,
    epoch: Instant,
}

#[derive(Debug)]
struct H2Conn {
    /// Set once the connection is open; requests that took a seat on it meanwhile wait.
    sender: OnceCell<H2Sender>,
    /// Opening it failed: it takes no more requests.
    failed: AtomicBool,
    /// Streams open (or waiting for it to open) on it now.
    open: AtomicU32,
    /// The pod's `SETTINGS_MAX_CONCURRENT_STREAMS` (0 while unknown: until its SETTINGS
    /// are read, the limit its other connections learned).
    pod_limit: Arc<AtomicU32>,
    /// Whether the pod's first frame was SETTINGS: it speaks HTTP/2.
    spoke_h2: Arc<AtomicBool>,
    /// When its last stream ended, in nanoseconds since the pool's epoch.
    last_used: AtomicU64,
    epoch: Instant,
    ping_interval: Duration,
}

impl H2Conn {
    fn limit(&self, max_streams: u32) -> u32 {
        match self.pod_limit.load(Ordering::Relaxed) {
            0 => DEFAULT_STREAMS.min(max_streams),
            pod => pod.min(max_streams),
        }
    }

    /// Closed by the pod (or by a GOAWAY), or never opened.
    fn is_closed(&self) -> bool {
        self.failed.load(Ordering::Relaxed) || self.sender.get().is_some_and(H2Sender::is_closed)
    }
}

/// One stream's place on a connection, taken before the stream is opened: counted until
/// dropped (with the response body).
#[derive(Debug)]
pub(crate) struct Seat {
    conn: Arc<H2Conn>,
}

impl Seat {
    fn take(conn: &Arc<H2Conn>) -> Self {
        conn.open.fetch_add(1, Ordering::Relaxed);
        Self { conn: conn.clone() }
    }

    /// Whether the pod has begun its side of HTTP/2 on this connection (its SETTINGS
    /// preface). A request that failed before that was not processed: a server sends
    /// its preface before anything else (RFC 9113 §3.4), and a pod that never does (an
    /// HTTP/1.1 server behind a port declared h2c) cannot have understood the request.
    pub(crate) fn pod_spoke_h2(&self) -> bool {
        self.conn.spoke_h2.load(Ordering::Relaxed)
    }

    /// The connection's sender: at once if it is open; otherwise after it opens, on the
    /// socket `connect` gives (the first seat's caller opens it, the others wait).
    pub(crate) async fn sender(
        &self,
        addr: SocketAddr,
        connect: impl Future<Output = Result<TcpStream, ConnectError>>,
    ) -> Result<H2Sender, ConnectError> {
        let conn = &self.conn;
        let opened = conn
            .sender
            .get_or_try_init(|| async {
                let socket = connect.await?;
                let taps = (conn.pod_limit.clone(), conn.spoke_h2.clone());
                open(addr, socket, taps, conn.ping_interval)
                    .await
                    .map_err(ConnectError::Handshake)
            })
            .await;
        match opened {
            Ok(sender) => Ok(sender.clone()),
            Err(error) => {
                conn.failed.store(true, Ordering::Relaxed);
                Err(error)
            }
        }
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        let since = Instant::now().saturating_duration_since(self.conn.epoch);
        self.conn
            .last_used
            .store(since.as_nanos() as u64, Ordering::Relaxed);
        self.conn.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Start HTTP/2 on `socket`, a new connection to `addr`, driven by its own task.
async fn open(
    addr: SocketAddr,
    socket: TcpStream,
    (pod_limit, spoke_h2): (Arc<AtomicU32>, Arc<AtomicBool>),
    ping_interval: Duration,
) -> Result<H2Sender, hyper::Error> {
    let tap = SettingsTap::new(socket, pod_limit, spoke_h2);
    let (sender, conn) = http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .keep_alive_interval(ping_interval)
        .keep_alive_timeout(PING_TIMEOUT.min(ping_interval))
        .keep_alive_while_idle(true)
        .handshake(TokioIo::new(tap))
        .await?;
    tokio::spawn(async move {
        if let Err(error) = conn.await {
            tracing::debug!(%addr, %error, "upstream HTTP/2 connection ended with an error");
        }
    });
    Ok(sender)
}

impl H2Pool {
    pub(crate) fn new(max_streams: u32, ping_interval: Duration, idle_timeout: Duration) -> Self {
        Self {
            conns: Mutex::new(HashMap::new()),
            max_streams: max_streams.max(1),
            ping_interval: ping_interval.max(Duration::from_millis(1)),
            idle_timeout,
            epoch: Instant::now(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SocketAddr, Vec<Arc<H2Conn>>>> {
        self.conns.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A place for one stream to `addr`: on the first connection (open or opening) with
    /// room, so that streams gather on few connections and the rest go idle and close;
    /// or on a new connection, which the caller opens ([`Seat::sender`]).
    pub(crate) fn seat(&self, addr: SocketAddr) -> Seat {
        let mut conns = self.lock();
        let list = conns.entry(addr).or_default();
        // What the pod said on its other connections, until it says so on the new one.
        let known_limit = list
            .iter()
            .rev()
            .map(|conn| conn.pod_limit.load(Ordering::Relaxed))
            .find(|&limit| limit != 0)
            .unwrap_or(0);
        list.retain(|conn| !conn.is_closed());
        let room = list
            .iter()
            .find(|conn| conn.open.load(Ordering::Relaxed) < conn.limit(self.max_streams));
        if let Some(conn) = room {
            return Seat::take(conn);
        }
        let conn = Arc::new(H2Conn {
            sender: OnceCell::new(),
            failed: AtomicBool::new(false),
            open: AtomicU32::new(0),
            pod_limit: Arc::new(AtomicU32::new(known_limit)),
            spoke_h2: Arc::new(AtomicBool::new(false)),
            last_used: AtomicU64::new(0),
            epoch: self.epoch,
            ping_interval: self.ping_interval,
        });
        let seat = Seat::take(&conn);
        list.push(conn);
        seat
    }

    /// Close connections the pod closed, and those without a stream for the idle
    /// timeout.
    pub(crate) fn sweep(&self, now: Instant) {
        let now = now.saturating_duration_since(self.epoch).as_nanos() as u64;
        let idle = self.idle_timeout.as_nanos() as u64;
        let mut conns = self.lock();
        for list in conns.values_mut() {
            list.retain(|conn| {
                let unused = conn.open.load(Ordering::Relaxed) == 0
                    && now.saturating_sub(conn.last_used.load(Ordering::Relaxed)) >= idle;
                !conn.is_closed() && !unused
            });
        }
        conns.retain(|_, list| !list.is_empty());
    }
}

/// Whether a request that failed on an HTTP/2 connection was never processed by the pod
/// (RFC 9113 §8.7): refused with `REFUSED_STREAM`, or above the last stream id of a
/// graceful GOAWAY. A GOAWAY for an error is not taken as proof: h2 reports the same
/// error for every stream the connection still had when it closed, processed or not.
pub(crate) fn never_processed(error: &hyper::Error) -> bool {
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        if let Some(h2) = cause.downcast_ref::<h2::Error>() {
            let reason = h2.reason();
            return h2.is_remote()
                && ((h2.is_reset() && reason == Some(h2::Reason::REFUSED_STREAM))
                    || (h2.is_go_away() && reason == Some(h2::Reason::NO_ERROR)));
        }
        source = cause.source();
    }
    false
}

/// A pod's socket that reads `SETTINGS_MAX_CONCURRENT_STREAMS` from the first frame the
/// pod sends (its SETTINGS preface) into `pod_limit`, then only passes bytes.
struct SettingsTap {
    stream: TcpStream,
    pod_limit: Arc<AtomicU32>,
    spoke_h2: Arc<AtomicBool>,
    /// The first frame's bytes while it is being read; `None` once read.
    first: Option<Vec<u8>>,
}

/// The frame header's length (RFC 9113 §4.1), SETTINGS' type and the setting's id.
const FRAME_HEADER: usize = 9;
const SETTINGS: u8 = 0x4;
const MAX_CONCURRENT_STREAMS: u16 = 0x3;
/// A preface larger than this is not read (it would be a pod with odd settings).
const MAX_PREFACE: usize = 1024;

impl SettingsTap {
    fn new(stream: TcpStream, pod_limit: Arc<AtomicU32>, spoke_h2: Arc<AtomicBool>) -> Self {
        Self {
            stream,
            pod_limit,
            spoke_h2,
            first: Some(Vec::new()),
        }
    }

    /// Take in `bytes` the pod sent; once the first frame is whole, read it.
    fn saw(&mut self, bytes: &[u8]) {
        let Some(first) = &mut self.first else { return };
        first.extend_from_slice(bytes);
        if first.len() < FRAME_HEADER {
            return;
        }
        let length = u32::from_be_bytes([0, first[0], first[1], first[2]]) as usize;
        if first[3] != SETTINGS || length > MAX_PREFACE {
            self.first = None;
            return;
        }
        if first.len() < FRAME_HEADER + length {
            return;
        }
        self.spoke_h2.store(true, Ordering::Relaxed);
        if let Some(limit) = max_concurrent_streams(&first[FRAME_HEADER..FRAME_HEADER + length]) {
            // 0 would mean "no new streams"; the pool counts it as one at a time.
            self.pod_limit.store(limit.max(1), Ordering::Relaxed);
        } else {
            // No limit said: unbounded by the pod.
            self.pod_limit.store(u32::MAX, Ordering::Relaxed);
        }
        self.first = None;
    }
}

/// The `SETTINGS_MAX_CONCURRENT_STREAMS` in a SETTINGS frame's payload, if given (the
/// last one counts, RFC 9113 §6.5.3).
fn max_concurrent_streams(payload: &[u8]) -> Option<u32> {
    payload
        .chunks_exact(6)
        .rev()
        .find(|setting| u16::from_be_bytes([setting[0], setting[1]]) == MAX_CONCURRENT_STREAMS)
        .map(|setting| u32::from_be_bytes([setting[2], setting[3], setting[4], setting[5]]))
}

impl AsyncRead for SettingsTap {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.stream).poll_read(cx, buf);
        if this.first.is_some() && matches!(polled, Poll::Ready(Ok(()))) {
            let read = buf.filled()[before..].to_vec();
            this.saw(&read);
        }
        polled
    }
}

impl AsyncWrite for SettingsTap {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings_frame(settings: &[(u16, u32)]) -> Vec<u8> {
        let length = settings.len() * 6;
        let mut frame = vec![0, 0, length as u8, SETTINGS, 0, 0, 0, 0, 0];
        for (id, value) in settings {
            frame.extend_from_slice(&id.to_be_bytes());
            frame.extend_from_slice(&value.to_be_bytes());
        }
        frame
    }

    #[tokio::test]
    async fn the_pods_stream_limit_is_read_from_its_settings_in_any_split() {
        let frame = settings_frame(&[(0x4, 65_535), (MAX_CONCURRENT_STREAMS, 7), (0x5, 16_384)]);
        for split in [1, 4, 9, 10, frame.len()] {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let stream = TcpStream::connect(listener.local_addr().unwrap())
                .await
                .unwrap();
            let limit = Arc::new(AtomicU32::new(0));
            let spoke_h2 = Arc::new(AtomicBool::new(false));
            let mut tap = SettingsTap::new(stream, limit.clone(), spoke_h2.clone());
            let mut rest = &frame[..];
            while !rest.is_empty() {
                let (now, later) = rest.split_at(split.min(rest.len()));
                tap.saw(now);
                rest = later;
            }
            assert_eq!(limit.load(Ordering::Relaxed), 7, "split {split}");
            assert!(spoke_h2.load(Ordering::Relaxed));
            assert!(tap.first.is_none());
        }
    }

    #[test]
    fn settings_without_a_limit_leave_the_pod_unbounded() {
        assert_eq!(
            max_concurrent_streams(&settings_frame(&[(0x4, 1)])[9..]),
            None
        );
        assert_eq!(
            max_concurrent_streams(&settings_frame(&[(3, 5), (3, 9)])[9..]),
            Some(9)
        );
    }
}
