//! Upstream HTTP/1.1 connections: connecting, and a bounded keep-alive pool.
//!
//! Idle connections (`SendRequest`s whose previous response has been fully read) are
//! kept per pod address, oldest first, and reused newest first so that rarely used ones
//! age out after `pool_idle_timeout`. Connecting is a separate step from sending,
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
//! With worker threads (`workers.rs`), a connection is reused only by the worker whose
//! runtime drives it, so that a request never wakes another thread, and connections of
//! the other runtime (the prober's) are not kept at all; the bounds stay global.
//!
//! The idle lists sit behind one mutex: each operation is a hash lookup and a push or a
//! pop (eviction by age is a lookup in an ordered map), and connections that are closed
//! are dropped after the lock is released.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;

use crate::connect::connect_from;
use crate::metrics::{IdleCloseReason, PoolMetrics};
use crate::request_body::RequestBody;

/// A connection to one pod, able to send the next request.
pub(crate) type Sender = http1::SendRequest<RequestBody>;

/// How many idle connections the pool keeps (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PoolBounds {
    pub(crate) per_endpoint: usize,
    pub(crate) total: usize,
}

#[derive(Debug)]
struct Idle {
    sender: Sender,
    /// The worker thread whose runtime drives the connection (`workers.rs`).
    worker: u32,
    since: Instant,
    /// Position in [`Lists::by_age`].
    seq: u64,
}

/// The idle connections: per address oldest first, and every one by age.
#[derive(Debug, Default)]
struct Lists {
    by_addr: HashMap<SocketAddr, VecDeque<Idle>>,
    /// Sequence number (increasing with the time of return) -> address.
    by_age: BTreeMap<u64, SocketAddr>,
    next_seq: u64,
}

impl Lists {
    fn len(&self) -> usize {
        self.by_age.len()
    }

    /// Remove entry `i` of `addr`'s list.
    fn remove(&mut self, addr: SocketAddr, i: usize) -> Option<Idle> {
        let list = self.by_addr.get_mut(&addr)?;
        let idle = list.remove(i)?;
        if list.is_empty() {
            self.by_addr.remove(&addr);
        }
        self.by_age.remove(&idle.seq);
        Some(idle)
    }

    /// Remove the oldest idle connection of any address.
    fn pop_oldest(&mut self) -> Option<Idle> {
        let (_, addr) = self.by_age.pop_first()?;
        let list = self.by_addr.get_mut(&addr)?;
        // Per address the list is ordered by age, so the oldest overall is its front.
        let idle = list.pop_front();
        if list.is_empty() {
            self.by_addr.remove(&addr);
        }
        idle
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
}

/// A connection in use, to be [released](Lease::release) back to its pool.
#[derive(Debug)]
pub(crate) struct Lease {
    pool: Arc<ConnPool>,
    addr: SocketAddr,
    sender: Sender,
}

impl Lease {
    /// The exchange is over: keep the connection for reuse if it `completed` (the whole
    /// response was read) and the pool has room; otherwise close it.
    pub(crate) fn release(self, completed: bool) {
        if completed {
            self.pool.put(self.addr, self.sender);
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
    ) -> Self {
        Self {
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

    /// Open a new connection to `addr` within `timeout` (see [`connect`]).
    pub(crate) async fn connect(
        &self,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<Sender, ConnectError> {
        connect(addr, timeout, self.bind, self.max_response_headers).await
    }

    fn lists(&self) -> std::sync::MutexGuard<'_, Lists> {
        // The lists stay consistent whatever a panicking holder did; keep serving.
        self.lists.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Lend `sender`, a connection to `addr`, until [`Lease::release`].
    pub(crate) fn lease(self: &Arc<Self>, addr: SocketAddr, sender: Sender) -> Lease {
        Lease {
            pool: self.clone(),
            addr,
            sender,
        }
    }

    /// The newest idle connection to `addr` that is ready for a request and driven by
    /// the calling worker thread. Closed and expired ones are dropped on the way; ones
    /// still finishing their previous exchange, and other workers' ones, are left.
    pub(crate) fn take(&self, addr: SocketAddr, now: Instant) -> Option<Sender> {
        let worker = crate::workers::current_index();
        let mut dropped = Vec::new();
        let taken = {
            let mut lists = self.lists();
            let mut i = lists.by_addr.get(&addr).map_or(0, VecDeque::len);
            let mut taken = None;
            while i > 0 {
                i -= 1;
                let Some(entry) = lists.by_addr.get(&addr).and_then(|l| l.get(i)) else {
                    break;
                };
                let expired = now.duration_since(entry.since) >= self.idle_timeout;
                if entry.sender.is_closed() || expired {
                    if expired {
                        self.metrics.idle_closed(IdleCloseReason::Expired);
                    }
                    dropped.extend(lists.remove(addr, i));
                } else if entry.worker == worker && entry.sender.is_ready() {
                    taken = lists.remove(addr, i).map(|idle| idle.sender);
                    break;
                }
            }
            self.metrics.set_idle(lists.len());
            taken
        };
        drop(dropped);
        taken
    }

    /// Keep a connection whose exchange has completed for the next request, pushing
    /// out the oldest idle ones beyond the bounds.
    fn put(&self, addr: SocketAddr, sender: Sender) {
        let worker = crate::workers::current_index();
        if sender.is_closed() || (worker == 0 && self.workers_serve.load(Ordering::Relaxed)) {
            return;
        }
        let PoolBounds {
            per_endpoint,
            total,
        } = self.bounds;
        if per_endpoint == 0 || total == 0 {
            // Keep-alive to pods is off.
            self.metrics.idle_closed(IdleCloseReason::EndpointLimit);
            return;
        }
        let since = Instant::now();
        let mut evicted = Vec::new();
        {
            let mut lists = self.lists();
            let seq = lists.next_seq;
            lists.next_seq += 1;
            let list = lists.by_addr.entry(addr).or_default();
            list.push_back(Idle {
                sender,
                worker,
                since,
                seq,
            });
            let over = list.len().saturating_sub(per_endpoint);
            let oldest: Vec<Idle> = list.drain(..over).collect();
            lists.by_age.insert(seq, addr);
            for idle in oldest {
                lists.by_age.remove(&idle.seq);
                self.metrics.idle_closed(IdleCloseReason::EndpointLimit);
                evicted.push(idle);
            }
            while lists.len() > total {
                match lists.pop_oldest() {
                    Some(idle) => {
                        self.metrics.idle_closed(IdleCloseReason::TotalLimit);
                        evicted.push(idle);
                    }
                    None => break,
                }
            }
            self.metrics.set_idle(lists.len());
        }
        // Closing happens outside the lock.
        drop(evicted);
    }

    /// Close expired and closed connections.
    pub(crate) fn sweep(&self, now: Instant) {
        let mut dropped = Vec::new();
        {
            let mut lists = self.lists();
            let lists = &mut *lists;
            let mut gone = Vec::new();
            for list in lists.by_addr.values_mut() {
                let mut i = 0;
                while i < list.len() {
                    let entry = &list[i];
                    let expired = now.duration_since(entry.since) >= self.idle_timeout;
                    if entry.sender.is_closed() || expired {
                        if expired {
                            self.metrics.idle_closed(IdleCloseReason::Expired);
                        }
                        if let Some(idle) = list.remove(i) {
                            gone.push(idle.seq);
                            dropped.push(idle);
                        }
                    } else {
                        i += 1;
                    }
                }
            }
            for seq in gone {
                lists.by_age.remove(&seq);
            }
            lists.by_addr.retain(|_, list| !list.is_empty());
            self.metrics.set_idle(lists.len());
        }
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

/// Why a connection could not be opened.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnectError {
    #[error("connect timed out after {0:?}")]
    Timeout(Duration),
    #[error("connect failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("HTTP/1.1 handshake failed: {0}")]
    Handshake(hyper::Error),
    /// A fresh connection broke before the request could be written.
    #[error("connection closed before the request was sent: {0}")]
    Closed(hyper::Error),
}

/// Open an HTTP/1.1 connection to `addr` within `timeout`, from `bind` when given, that
/// accepts responses of up to `max_headers` header lines. The connection is driven by its
/// own task until its `Sender` is dropped or the pod closes it.
pub(crate) async fn connect(
    addr: SocketAddr,
    timeout: Duration,
    bind: Option<IpAddr>,
    max_headers: usize,
) -> Result<Sender, ConnectError> {
    let stream = tokio::time::timeout(timeout, connect_from(addr, bind))
        .await
        .map_err(|_| ConnectError::Timeout(timeout))??;
    // Small requests and responses must not wait for Nagle's algorithm.
    let _ = stream.set_nodelay(true);
    let (sender, conn) = http1::Builder::new()
        .max_headers(max_headers.max(1))
        .handshake(TokioIo::new(stream))
        .await
        .map_err(ConnectError::Handshake)?;
    tokio::spawn(async move {
        if let Err(error) = conn.await {
            tracing::debug!(%addr, %error, "upstream connection ended with an error");
        }
    });
    Ok(sender)
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

    #[tokio::test]
    async fn a_worker_takes_back_only_the_connections_its_own_runtime_drives() {
        let addr = server().await;
        let registry = prometheus::Registry::new();
        let metrics = crate::Metrics::new(&registry).unwrap();
        let bounds = PoolBounds {
            per_endpoint: 8,
            total: 8,
        };
        let pool = ConnPool::new(Duration::from_secs(60), bounds, None, 100, metrics.pool());
        let sender = pool.connect(addr, Duration::from_secs(5)).await.unwrap();
        // Let the connection's task run once, so the connection says it is ready.
        tokio::time::sleep(Duration::from_millis(20)).await;
        crate::workers::pretend_worker(1);
        pool.put(addr, sender);
        assert_eq!(pool.idle_to(addr), 1);

        crate::workers::pretend_worker(2);
        assert!(
            pool.take(addr, Instant::now()).is_none(),
            "worker 2 took worker 1's"
        );
        assert_eq!(pool.idle_to(addr), 1, "and left it in the pool");

        crate::workers::pretend_worker(1);
        assert!(pool.take(addr, Instant::now()).is_some());
        assert_eq!(pool.idle_to(addr), 0);
    }

    #[tokio::test]
    async fn with_workers_serving_a_connection_of_another_runtime_is_not_kept() {
        let addr = server().await;
        let registry = prometheus::Registry::new();
        let metrics = crate::Metrics::new(&registry).unwrap();
        let bounds = PoolBounds {
            per_endpoint: 8,
            total: 8,
        };
        let pool = ConnPool::new(Duration::from_secs(60), bounds, None, 100, metrics.pool());
        // Off the workers and with no workers serving (tests, the testbed): kept.
        let sender = pool.connect(addr, Duration::from_secs(5)).await.unwrap();
        pool.put(addr, sender);
        assert_eq!(pool.idle_to(addr), 1);
        // Workers serve: a connection the prober's runtime drives is closed instead.
        pool.serve_on_workers();
        let sender = pool.connect(addr, Duration::from_secs(5)).await.unwrap();
        pool.put(addr, sender);
        assert_eq!(pool.idle_to(addr), 1);
    }
}
