//! Upstream HTTP/1.1 connections: connecting, and a bounded keep-alive pool.
//!
//! Idle connections (sockets, or hyper `SendRequest`s, whose previous response has been
//! fully read) are kept per pod address, oldest first, and reused newest first so that
//! rarely used ones age out after `pool_idle_timeout`. Connecting is a separate step from sending,
//! because the forwarding loop treats the two phases differently: a connect failure
//! means nothing reached the pod, so the request may go to another pod whatever its
//! method (see `forward.rs`).
//!
//! ## Bounds
//!
//! As nginx's `keepalive N`, the pool keeps at most `max_idle_per_endpoint` idle
//! connections to one pod and `max_idle_total` in all. A connection coming back to a
//! pod that already has its share pushes out that pod's oldest idle one; one coming back
//! when the pool is full pushes out the oldest idle connection of any pod. Every idle
//! connection is a socket, a task and its buffers, so without a bound a proxy in front
//! of a thousand pods keeps a thousand or more of them for a minute after a burst.
//! Closed idle connections are counted by reason in
//! `proxima_upstream_idle_closed_total`; `proxima_upstream_idle_connections` is the
//! number kept now.
//!
//! ## Parked connections
//!
//! An idle HTTP/1.1 connection that hyper drives costs about 32 KiB: its read and write
//! buffers (8 KiB each), its request channel and its task. In front of a thousand pods
//! that is most of the proxy's memory, while only the most recently used connections
//! are likely to be taken soon. So at most `max_idle_buffered` idle connections keep
//! that state; beyond it, the oldest of them is *parked*: its task ends without
//! shutting the socket down, the buffers are freed, and only the socket (a file
//! descriptor and its reactor registration) stays in the pool, in the same place by
//! age. Taking a parked connection first checks that the pod has not closed it nor
//! sent anything unasked; a request without a body then runs the proxy's own exchange
//! on it (`http1/mod.rs`), and one with a body starts hyper's HTTP/1.1 on it again. No bytes
//! go over the wire for either, so it saves the TCP handshake a fresh connection would
//! cost. The native exchange leaves its connection parked from the start: it keeps no
//! state between requests, so most idle connections cost only their socket.
//! A parked connection is still a pooled one to the forwarding loop: if the pod closed
//! it unseen, the request goes again on a fresh connection (see `forward.rs`).
//!
//! ## Returning connections
//!
//! A connection in use is a [`Lease`]: whoever finishes the exchange (the response
//! body, a probe) releases it and says whether the exchange completed, and the pool
//! alone decides whether to keep it. So the response path does not need to know the
//! pool's rules, and the pool does not depend on the response path.
//!
//! With `upstream_bind` every upstream socket is bound to that local address before it
//! connects (the kernel picks the port), so pods, and anything between, see the proxy's
//! chosen address as the peer.
//!
//! With worker threads (`workers.rs`), a connection is reused by the worker whose
//! runtime drives it, so that a request never wakes another thread, and connections of
//! the other runtime (the prober's) are not kept at all; the bounds stay global. A
//! worker with no idle connection of its own to a pod adopts another worker's parked
//! socket (it moves to the adopting worker's reactor) rather than open a new one.
//!
//! The idle lists sit behind one mutex: each operation is a hash lookup and a push or a
//! pop (eviction by age is a lookup in an ordered map), and connections that are closed
//! are dropped after the lock is released.

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::forward::request_body::RequestBody;
use crate::metrics::{IdleCloseReason, PoolMetrics};
use crate::upstream::connect::{connect_from, ConnectError};
use crate::upstream::h2::H2Pool;

/// A connection to one pod, able to send the next request.
#[derive(Debug)]
pub(crate) struct Sender {
    inner: http1::SendRequest<RequestBody>,
    /// Set by the pool when it parks the connection: when the sender is dropped, the
    /// connection's task hands the socket back with the place it had (see [`Parking`]).
    parking: Arc<OnceLock<Parking>>,
}

impl Sender {
    /// Send `req` (hyper's `try_send_request`: the request comes back in the error when
    /// nothing of it was written).
    pub(crate) fn try_send_request(
        &mut self,
        req: http::Request<RequestBody>,
    ) -> impl Future<
        Output = Result<
            http::Response<hyper::body::Incoming>,
            hyper::client::conn::TrySendError<http::Request<RequestBody>>,
        >,
    > {
        self.inner.try_send_request(req)
    }

    fn is_closed(&self) -> bool {
        self.inner.is_closed()
    }

    fn is_ready(&self) -> bool {
        self.inner.is_ready()
    }
}

/// Where a parked connection goes back in the pool: its idle place by age and since when.
#[derive(Clone, Copy, Debug)]
struct Parking {
    seq: u64,
    since: Instant,
}

/// How many idle connections the pool keeps (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PoolBounds {
    pub(crate) per_endpoint: usize,
    pub(crate) total: usize,
    /// Idle connections that keep their HTTP/1.1 state; the rest are parked.
    pub(crate) buffered: usize,
}

/// An idle connection: ready for the next request through hyper, or parked: a bare
/// socket, which the native exchange (`http1/mod.rs`) uses as it is and hyper starts
/// HTTP/1.1 on again (module docs).
#[derive(Debug)]
pub(crate) enum Held {
    Ready(Sender),
    Parked(TcpStream),
}

impl Held {
    /// Whether the pod closed the connection (or sent something while nothing was asked,
    /// which makes it unusable).
    fn is_closed(&self) -> bool {
        match self {
            Held::Ready(sender) => sender.is_closed(),
            Held::Parked(stream) => {
                // Reads nothing unless the reactor saw the socket readable: an open, quiet
                // connection answers `WouldBlock` without a system call.
                !matches!(stream.try_read(&mut [0; 1]), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
            }
        }
    }

    fn is_ready(&self) -> bool {
        match self {
            Held::Ready(sender) => sender.is_ready(),
            Held::Parked(_) => true,
        }
    }

    /// Whether the pod has closed, reset or written on this connection, as the kernel
    /// knows now: for a request that must not be sent twice, just before it is written
    /// (see `forward::attempt`).
    ///
    /// [`is_closed`](Self::is_closed), which [`ConnPool::take`] asks, reads the runtime's
    /// readiness, and that lags: a worker polls its reactor only between tasks (at the
    /// latest every 61 of them) or when it has nothing to run, so a pod's FIN that came
    /// while the worker was busy is in the socket but not yet known. On a loaded machine
    /// that lag is milliseconds, long enough for a POST to be written on a connection its
    /// pod closed before: one non-blocking `recv(MSG_PEEK)` (one system call, no bytes on
    /// the wire) asks the socket itself. A connection hyper drives has no socket at hand
    /// here; its own task's view is all there is.
    pub(crate) fn closed_now(&self) -> bool {
        match self {
            Held::Ready(sender) => sender.is_closed(),
            Held::Parked(stream) => {
                use std::os::fd::AsRawFd;
                let mut byte = 0u8;
                // SAFETY: the descriptor is the socket's own, open while it is borrowed
                // here, and the buffer is one byte that lives across the call. MSG_PEEK
                // leaves whatever is queued where it is.
                let read = unsafe {
                    libc::recv(
                        stream.as_raw_fd(),
                        (&mut byte as *mut u8).cast(),
                        1,
                        libc::MSG_PEEK | libc::MSG_DONTWAIT,
                    )
                };
                // 0: the pod's FIN; 1: bytes nobody asked for; -1: a reset, unless it is
                // the would-block of an open, quiet connection.
                read >= 0
                    || std::io::Error::last_os_error().kind() != std::io::ErrorKind::WouldBlock
            }
        }
    }
}

#[derive(Debug)]
struct Idle {
    held: Held,
    /// The worker thread whose runtime drives the connection (`workers.rs`).
    worker: u32,
    since: Instant,
    /// Position in [`Lists::by_age`].
    seq: u64,
}

/// The idle connections: per address oldest first, and every one by age.
#[derive(Debug, Default)]
struct Lists {
    /// foldhash: looked up on every take and return, and the addresses are pods'.
    by_addr: foldhash::HashMap<SocketAddr, VecDeque<Idle>>,
    /// Sequence number (increasing with the time of return) -> address.
    by_age: BTreeMap<u64, SocketAddr>,
    /// The same for the connections that are not parked.
    buffered_by_age: BTreeMap<u64, SocketAddr>,
    next_seq: u64,
}

impl Lists {
    fn len(&self) -> usize {
        self.by_age.len()
    }

    fn parked(&self) -> usize {
        self.by_age.len() - self.buffered_by_age.len()
    }

    /// Take `idle` out of the age orders (it has left its address's list).
    fn forget(&mut self, idle: &Idle) {
        self.by_age.remove(&idle.seq);
        self.buffered_by_age.remove(&idle.seq);
    }

    /// Add `idle` to `addr`'s list, in its place by age.
    fn insert(&mut self, addr: SocketAddr, idle: Idle) {
        self.by_age.insert(idle.seq, addr);
        if matches!(idle.held, Held::Ready(_)) {
            self.buffered_by_age.insert(idle.seq, addr);
        }
        let list = self.by_addr.entry(addr).or_default();
        // Nearly always the newest; a parked connection comes back in its old place.
        let at = list.partition_point(|other| other.seq < idle.seq);
        list.insert(at, idle);
    }

    /// Remove entry `i` of `addr`'s list. A list left empty stays, with its room, for
    /// the connection that comes back at the end of the request: removing it would
    /// cost a hash removal, an insertion and an allocation per request to a pod with
    /// one idle connection. [`ConnPool::sweep`] drops empty lists.
    fn remove(&mut self, addr: SocketAddr, i: usize) -> Option<Idle> {
        let idle = self.by_addr.get_mut(&addr)?.remove(i)?;
        self.forget(&idle);
        Some(idle)
    }

    /// Remove the entry of `addr` numbered `seq`.
    fn remove_seq(&mut self, addr: SocketAddr, seq: u64) -> Option<Idle> {
        let i = self
            .by_addr
            .get(&addr)?
            .iter()
            .position(|idle| idle.seq == seq)?;
        self.remove(addr, i)
    }

    /// Remove the oldest idle connection of any address.
    fn pop_oldest(&mut self) -> Option<Idle> {
        let (&seq, &addr) = self.by_age.first_key_value()?;
        self.remove_seq(addr, seq)
    }

    /// Remove the oldest connection that is not parked.
    fn pop_oldest_buffered(&mut self) -> Option<Idle> {
        let (&seq, &addr) = self.buffered_by_age.first_key_value()?;
        self.remove_seq(addr, seq)
    }
}

/// Idle keep-alive connections per pod address, bounded (see the module docs).
#[derive(Debug)]
pub(crate) struct ConnPool {
    lists: Mutex<Lists>,
    bounds: PoolBounds,
    idle_timeout: Duration,
    bind: Option<IpAddr>,
    max_response_headers: usize,
    metrics: PoolMetrics,
    /// Client traffic runs on worker threads (`workers.rs`): a connection driven by any
    /// other runtime (the prober's) would never be taken again, and would only hold an
    /// idle place, so it is closed after its exchange.
    workers_serve: AtomicBool,
    /// The multiplexed connections to h2c pods (`upstream/h2.rs`).
    pub(crate) h2: H2Pool,
}

/// `stream`, registered with another worker's reactor, moved to the calling worker's;
/// `None` (the socket is closed) if either step fails.
fn adopt(stream: TcpStream) -> Option<TcpStream> {
    let stream = stream.into_std().ok()?;
    TcpStream::from_std(stream).ok()
}

/// A connection in use, to be [released](Lease::release) back to its pool. A native
/// exchange's socket is with its response body meanwhile, and comes back through
/// [`Lease::release_socket`].
#[derive(Debug)]
pub(crate) struct Lease {
    pool: Arc<ConnPool>,
    addr: SocketAddr,
    sender: Option<Sender>,
}

impl Lease {
    /// The exchange is over: keep the connection for reuse if it `completed` (the whole
    /// response was read) and the pool has room; otherwise close it.
    pub(crate) fn release(self, completed: bool) {
        if let (true, Some(sender)) = (completed, self.sender) {
            self.pool.put(self.addr, Held::Ready(sender));
        }
    }

    /// The native exchange is over: keep its socket if it is given back (it is only
    /// when the response was read to its end and the pod allows another request).
    pub(crate) fn release_socket(self, socket: Option<TcpStream>) {
        if let Some(socket) = socket {
            self.pool.put(self.addr, Held::Parked(socket));
        }
    }
}

impl ConnPool {
    pub(crate) fn new(
        idle_timeout: Duration,
        bounds: PoolBounds,
        bind: Option<IpAddr>,
        max_response_headers: usize,
        metrics: PoolMetrics,
        h2: (u32, Duration),
    ) -> Self {
        Self {
            h2: H2Pool::new(h2.0, h2.1, idle_timeout),
            lists: Mutex::new(Lists::default()),
            bounds,
            idle_timeout,
            bind,
            max_response_headers,
            metrics,
            workers_serve: AtomicBool::new(false),
        }
    }

    /// From now on client traffic runs on worker threads (see the field's docs).
    pub(crate) fn serve_on_workers(&self) {
        self.workers_serve.store(true, Ordering::Relaxed);
    }

    /// Open a new connection to `addr` within `timeout`, from the pool's bind address if
    /// any, driven by its own task until its [`Sender`] is dropped or the pod closes it.
    pub(crate) async fn connect(
        self: &Arc<Self>,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<Sender, ConnectError> {
        let stream = self.connect_socket(addr, timeout).await?;
        self.drive(addr, stream)
            .await
            .map_err(ConnectError::Handshake)
    }

    /// Open a new connection to `addr` within `timeout`, from the pool's bind address if
    /// any, as a bare socket (for the native exchange, `http1/mod.rs`).
    pub(crate) async fn connect_socket(
        &self,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<TcpStream, ConnectError> {
        let stream = tokio::time::timeout(timeout, connect_from(addr, self.bind))
            .await
            .map_err(|_| ConnectError::Timeout(timeout))??;
        // Small requests and responses must not wait for Nagle's algorithm.
        let _ = stream.set_nodelay(true);
        Ok(stream)
    }

    /// The most header fields a pod's response may have.
    pub(crate) fn max_response_headers(&self) -> usize {
        self.max_response_headers
    }

    /// Start HTTP/1.1 through hyper on `stream` (a new socket, or a parked one), with a
    /// task that drives it and, if the pool parks it, hands the socket back (module
    /// docs).
    pub(crate) async fn drive(
        self: &Arc<Self>,
        addr: SocketAddr,
        stream: TcpStream,
    ) -> Result<Sender, hyper::Error> {
        let (inner, mut conn) = http1::Builder::new()
            .max_headers(self.max_response_headers.max(1))
            .handshake(TokioIo::new(stream))
            .await?;
        let parking = Arc::new(OnceLock::new());
        let parked = Arc::clone(&parking);
        let pool = Arc::downgrade(self);
        tokio::spawn(async move {
            match std::future::poll_fn(|cx| conn.poll_without_shutdown(cx)).await {
                Ok(()) => {
                    if let Some(&place) = parked.get() {
                        let parts = conn.into_parts();
                        // Bytes nobody asked for make the socket useless for a request.
                        if parts.read_buf.is_empty() {
                            park(&pool, addr, parts.io.into_inner(), place);
                        }
                    }
                }
                Err(error) => {
                    tracing::debug!(%addr, %error, "upstream connection ended with an error");
                }
            }
        });
        Ok(Sender { inner, parking })
    }

    fn lists(&self) -> std::sync::MutexGuard<'_, Lists> {
        // The lists stay consistent whatever a panicking holder did; keep serving.
        self.lists.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Lend a connection to `addr` until it is released: `sender` for hyper's, none for
    /// a native exchange's (see [`Lease`]).
    pub(crate) fn lease(self: &Arc<Self>, addr: SocketAddr, sender: Option<Sender>) -> Lease {
        Lease {
            pool: self.clone(),
            addr,
            sender,
        }
    }

    /// The newest idle connection to `addr` that is ready for a request and driven by
    /// the calling worker thread. Closed and expired ones are dropped on the way; ones
    /// still finishing their previous exchange are left.
    ///
    /// A worker with none of its own adopts the newest parked socket of another worker:
    /// it moves to this worker's reactor (two `epoll_ctl` calls), which costs far less
    /// than a new connection, and keeps the pool's bounds shared by the workers: with a
    /// thousand pods and two workers, the pool's 1024 places could not hold a
    /// connection per pod for each worker. A connection hyper drives stays with its
    /// worker (its task runs there).
    pub(crate) fn take(&self, addr: SocketAddr, now: Instant) -> Option<Held> {
        let worker = crate::client::worker::current_index();
        let mut dropped = Vec::new();
        let (taken, adopted) = {
            let mut lists = self.lists();
            let mut i = lists.by_addr.get(&addr).map_or(0, VecDeque::len);
            let mut taken = None;
            // The newest parked socket of another worker (its number), if this one has
            // none.
            let mut other = None;
            while i > 0 {
                i -= 1;
                let Some(entry) = lists.by_addr.get(&addr).and_then(|l| l.get(i)) else {
                    break;
                };
                if self.is_done(entry, now) {
                    dropped.extend(lists.remove(addr, i));
                } else if entry.worker == worker && entry.held.is_ready() {
                    taken = lists.remove(addr, i).map(|idle| idle.held);
                    break;
                } else if other.is_none() && worker != 0 && matches!(entry.held, Held::Parked(_)) {
                    other = Some(entry.seq);
                }
            }
            let adopted = match (&taken, other) {
                (None, Some(seq)) => lists.remove_seq(addr, seq).map(|idle| idle.held),
                _ => None,
            };
            self.metrics.set_idle(lists.len(), lists.parked());
            (taken, adopted)
        };
        drop(dropped);
        match adopted {
            Some(Held::Parked(stream)) => {
                let adopted = adopt(stream).map(Held::Parked);
                if adopted.is_some() {
                    self.metrics.adopted();
                }
                adopted
            }
            _ => taken,
        }
    }

    /// Keep a connection whose exchange has completed for the next request, pushing
    /// out the oldest idle ones beyond the bounds and parking the oldest buffered ones
    /// beyond theirs. A bare socket is not checked here: its exchange read the
    /// response to its end a moment ago, and [`take`](Self::take) checks it anyway.
    fn put(&self, addr: SocketAddr, held: Held) {
        let worker = crate::client::worker::current_index();
        let closed = matches!(&held, Held::Ready(sender) if sender.is_closed());
        if closed || (worker == 0 && self.workers_serve.load(Ordering::Relaxed)) {
            return;
        }
        if self.bounds.per_endpoint == 0 || self.bounds.total == 0 {
            // Keep-alive to pods is off.
            self.metrics.idle_closed(IdleCloseReason::EndpointLimit);
            return;
        }
        // Idle ages are for timeouts of seconds (`clock.rs`).
        let since = crate::clock::coarse_now();
        let mut closing = Vec::new();
        {
            let mut lists = self.lists();
            let seq = lists.next_seq;
            lists.next_seq += 1;
            let idle = Idle {
                held,
                worker,
                since,
                seq,
            };
            self.keep(&mut lists, addr, idle, &mut closing);
            while lists.buffered_by_age.len() > self.bounds.buffered {
                let Some(idle) = lists.pop_oldest_buffered() else {
                    break;
                };
                if let Held::Ready(sender) = &idle.held {
                    // Dropping the sender (below, outside the lock) ends the connection's
                    // task, which hands the socket back to `park`.
                    let _ = sender.parking.set(Parking {
                        seq: idle.seq,
                        since: idle.since,
                    });
                }
                closing.push(idle);
            }
            self.metrics.set_idle(lists.len(), lists.parked());
        }
        // Closing happens outside the lock.
        drop(closing);
    }

    /// Put `idle` in the lists, and take out the oldest ones beyond the bounds into
    /// `closing`.
    fn keep(&self, lists: &mut Lists, addr: SocketAddr, idle: Idle, closing: &mut Vec<Idle>) {
        lists.insert(addr, idle);
        while lists.by_addr.get(&addr).map_or(0, VecDeque::len) > self.bounds.per_endpoint {
            self.metrics.idle_closed(IdleCloseReason::EndpointLimit);
            closing.extend(lists.remove(addr, 0));
        }
        while lists.len() > self.bounds.total {
            match lists.pop_oldest() {
                Some(idle) => {
                    self.metrics.idle_closed(IdleCloseReason::TotalLimit);
                    closing.push(idle);
                }
                None => break,
            }
        }
    }

    /// Take back the socket of a connection the pool parked, in its old place by age.
    fn park(&self, addr: SocketAddr, stream: TcpStream, place: Parking) {
        let held = Held::Parked(stream);
        if held.is_closed() {
            return;
        }
        let idle = Idle {
            held,
            worker: crate::client::worker::current_index(),
            since: place.since,
            seq: place.seq,
        };
        let mut closing = Vec::new();
        {
            let mut lists = self.lists();
            self.keep(&mut lists, addr, idle, &mut closing);
            self.metrics.set_idle(lists.len(), lists.parked());
        }
        drop(closing);
    }

    /// Whether `entry` is to be closed at `now`: idle for `idle_timeout` (counted), or
    /// closed by its pod.
    fn is_done(&self, entry: &Idle, now: Instant) -> bool {
        if now.duration_since(entry.since) >= self.idle_timeout {
            self.metrics.idle_closed(IdleCloseReason::Expired);
            return true;
        }
        entry.held.is_closed()
    }

    /// Close expired and closed connections.
    pub(crate) fn sweep(&self, now: Instant) {
        self.h2.sweep(now);
        let dropped = {
            let mut lists = self.lists();
            let lists = &mut *lists;
            let mut gone = Vec::new();
            for list in lists.by_addr.values_mut() {
                let mut i = 0;
                while i < list.len() {
                    if self.is_done(&list[i], now) {
                        if let Some(idle) = list.remove(i) {
                            gone.push(idle);
                        }
                    } else {
                        i += 1;
                    }
                }
            }
            for idle in &gone {
                lists.forget(idle);
            }
            lists.by_addr.retain(|_, list| !list.is_empty());
            self.metrics.set_idle(lists.len(), lists.parked());
            gone
        };
        drop(dropped);
    }

    /// Idle connections currently kept.
    pub(crate) fn idle_count(&self) -> usize {
        self.lists().len()
    }

    /// Idle connections currently kept to `addr`.
    pub(crate) fn idle_to(&self, addr: SocketAddr) -> usize {
        self.lists().by_addr.get(&addr).map_or(0, VecDeque::len)
    }

    /// The most idle connections currently kept to any one address.
    pub(crate) fn max_idle_per_endpoint(&self) -> usize {
        self.lists()
            .by_addr
            .values()
            .map(VecDeque::len)
            .max()
            .unwrap_or(0)
    }
}

/// Hand a parked connection's socket back to its pool, if the pool is still there.
fn park(pool: &Weak<ConnPool>, addr: SocketAddr, stream: TcpStream, place: Parking) {
    if let Some(pool) = pool.upgrade() {
        pool.park(addr, stream, place);
    }
}

/// A pool with `bounds`, a 60 s idle timeout and metrics of its own, for tests.
#[cfg(test)]
pub(crate) fn pool_of(bounds: PoolBounds) -> Arc<ConnPool> {
    let registry = prometheus::Registry::new();
    let metrics = crate::Metrics::new(&registry).unwrap();
    Arc::new(ConnPool::new(
        Duration::from_secs(60),
        bounds,
        None,
        100,
        metrics.pool(),
        (100, Duration::from_secs(10)),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    use hyper::service::service_fn;
    use tokio::net::TcpListener;

    /// A loopback HTTP/1.1 server that answers every request with an empty 200.
    async fn server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(
                    TokioIo::new(stream),
                    service_fn(|_req| async {
                        Ok::<_, std::convert::Infallible>(http::Response::new(
                            http_body_util::Empty::<bytes::Bytes>::new(),
                        ))
                    }),
                ));
            }
        });
        addr
    }

    /// Bounds the tests below never reach.
    const ROOMY: PoolBounds = PoolBounds {
        per_endpoint: 8,
        total: 8,
        buffered: 8,
    };

    #[tokio::test]
    async fn a_worker_takes_back_only_the_connections_its_own_runtime_drives() {
        let addr = server().await;
        let pool = pool_of(ROOMY);
        let sender = pool.connect(addr, Duration::from_secs(5)).await.unwrap();
        // Let the connection's task run once, so the connection says it is ready.
        tokio::time::sleep(Duration::from_millis(20)).await;
        crate::client::worker::pretend_worker(1);
        pool.put(addr, Held::Ready(sender));
        assert_eq!(pool.idle_to(addr), 1);

        crate::client::worker::pretend_worker(2);
        assert!(
            pool.take(addr, Instant::now()).is_none(),
            "worker 2 took worker 1's"
        );
        assert_eq!(pool.idle_to(addr), 1, "and left it in the pool");

        crate::client::worker::pretend_worker(1);
        assert!(pool.take(addr, Instant::now()).is_some());
        assert_eq!(pool.idle_to(addr), 0);
    }

    #[test]
    fn a_worker_with_none_of_its_own_adopts_another_workers_parked_socket() {
        let runtime = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
        };
        // The pod, on a runtime of its own.
        let pod_runtime = std::thread::spawn(move || {
            let rt = runtime();
            let addr = rt.block_on(server());
            (rt, addr)
        })
        .join()
        .unwrap();
        let (pod_rt, addr) = pod_runtime;
        let pod = std::thread::spawn(move || pod_rt.block_on(std::future::pending::<()>()));
        let pool = pool_of(ROOMY);
        // On its own thread and runtime, worker 1 connects to the pod and parks the socket.
        let park_from_worker_1 = |pool: &Arc<ConnPool>| {
            let pool = pool.clone();
            std::thread::spawn(move || {
                runtime().block_on(async {
                    crate::client::worker::pretend_worker(1);
                    let socket = pool
                        .connect_socket(addr, Duration::from_secs(5))
                        .await
                        .unwrap();
                    pool.put(addr, Held::Parked(socket));
                });
            })
            .join()
            .unwrap();
        };
        park_from_worker_1(&pool);
        assert_eq!(pool.idle_to(addr), 1);

        // Worker 2, on another thread and runtime, has none of its own: it takes worker
        // 1's parked socket, which then serves an exchange on worker 2's reactor.
        let second = pool.clone();
        let status = std::thread::spawn(move || {
            runtime().block_on(async {
                crate::client::worker::pretend_worker(2);
                let Some(Held::Parked(socket)) = second.take(addr, Instant::now()) else {
                    panic!("worker 2 did not adopt the parked socket");
                };
                let req = http::Request::get("/").body(()).unwrap();
                let response = crate::http1::exchange(socket, &req, &[], 100)
                    .await
                    .unwrap();
                response.status()
            })
        })
        .join()
        .unwrap();
        assert_eq!(status, http::StatusCode::OK);
        assert_eq!(pool.idle_to(addr), 0);
        assert_eq!(pool.metrics.adopted_count(), 1);

        // Off the workers (the prober), another worker's socket is not taken.
        park_from_worker_1(&pool);
        let third = pool.clone();
        std::thread::spawn(move || {
            runtime().block_on(async {
                crate::client::worker::pretend_worker(0);
                assert!(third.take(addr, Instant::now()).is_none());
            });
        })
        .join()
        .unwrap();
        assert_eq!(pool.idle_to(addr), 1);
        drop(pod);
    }

    #[tokio::test]
    async fn with_workers_serving_a_connection_of_another_runtime_is_not_kept() {
        let addr = server().await;
        let pool = pool_of(ROOMY);
        // Off the workers and with no workers serving (tests, the testbed): kept.
        let sender = pool.connect(addr, Duration::from_secs(5)).await.unwrap();
        pool.put(addr, Held::Ready(sender));
        assert_eq!(pool.idle_to(addr), 1);
        // Workers serve: a connection the prober's runtime drives is closed instead.
        pool.serve_on_workers();
        let sender = pool.connect(addr, Duration::from_secs(5)).await.unwrap();
        pool.put(addr, Held::Ready(sender));
        assert_eq!(pool.idle_to(addr), 1);
    }

    #[tokio::test]
    async fn a_parked_connection_keeps_its_place_by_age() {
        let (a, b, c) = (server().await, server().await, server().await);
        let pool = pool_of(PoolBounds {
            per_endpoint: 8,
            total: 2,
            buffered: 1,
        });
        for addr in [a, b] {
            let sender = pool.connect(addr, Duration::from_secs(5)).await.unwrap();
            pool.put(addr, Held::Ready(sender));
        }
        // `a`'s connection was the oldest buffered one: its task hands the socket back.
        let parked_back = |pool: Arc<ConnPool>| async move {
            for _ in 0..100 {
                if pool.lists().parked() == 1 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert_eq!(pool.lists().parked(), 1);
        };
        parked_back(pool.clone()).await;
        assert_eq!((pool.idle_to(a), pool.idle_to(b)), (1, 1));
        // A third connection overfills the pool: the oldest by age goes, which is the
        // parked one, not the one returned after it (which is parked in turn).
        let sender = pool.connect(c, Duration::from_secs(5)).await.unwrap();
        pool.put(c, Held::Ready(sender));
        parked_back(pool.clone()).await;
        assert_eq!(
            (pool.idle_to(a), pool.idle_to(b), pool.idle_to(c)),
            (0, 1, 1)
        );
    }
}
