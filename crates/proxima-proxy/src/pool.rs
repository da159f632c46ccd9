//! Upstream HTTP/1.1 connections: connecting, and a keep-alive pool per endpoint.
//!
//! The pool is deliberately small. Idle connections (`SendRequest`s whose previous
//! response has been fully read) are kept per pod address, newest last, and reused
//! newest first so that rarely used ones age out after `pool_idle_timeout`. Connecting
//! is a separate step from sending, because the forwarding loop treats the two phases
//! differently: a connect failure means nothing reached the pod, so the request may go
//! to another pod whatever its method (see `forward.rs`).
//!
//! With `upstream_bind` every upstream socket is bound to that local address before it
//! connects (the kernel picks the port), so pods, and anything between, see the proxy's
//! chosen address as the peer.
//!
//! Addresses are spread over a fixed number of shards, each a short mutex-protected
//! list, so concurrent requests to different pods rarely meet on a lock and the
//! critical section is a push or a pop.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;

use crate::body::RequestBody;
use crate::connect::connect_from;

/// A connection to one pod, able to send the next request.
pub(crate) type Sender = http1::SendRequest<RequestBody>;

const SHARDS: usize = 16;
/// Idle connections kept per pod; more are closed when they come back.
const MAX_IDLE_PER_ENDPOINT: usize = 1024;

#[derive(Debug)]
struct Idle {
    sender: Sender,
    since: Instant,
}

type Shard = Vec<(SocketAddr, Vec<Idle>)>;

/// Idle keep-alive connections per pod address (see the module docs).
#[derive(Debug)]
pub(crate) struct ConnPool {
    shards: Vec<Mutex<Shard>>,
    idle_timeout: Duration,
    bind: Option<IpAddr>,
    max_response_headers: usize,
}

impl ConnPool {
    pub(crate) fn new(
        idle_timeout: Duration,
        bind: Option<IpAddr>,
        max_response_headers: usize,
    ) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(Vec::new())).collect(),
            idle_timeout,
            bind,
            max_response_headers,
        }
    }

    /// Open a new connection to `addr` within `timeout` (see [`connect`]).
    pub(crate) async fn connect(
        &self,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<Sender, ConnectError> {
        connect(addr, timeout, self.bind, self.max_response_headers).await
    }

    fn shard(&self, addr: SocketAddr) -> std::sync::MutexGuard<'_, Shard> {
        let mut h = DefaultHasher::new();
        addr.hash(&mut h);
        let i = (h.finish() as usize) % SHARDS;
        // The lists stay consistent whatever a panicking holder did; keep serving.
        self.shards[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The newest idle connection to `addr` that is ready for a request. Closed and
    /// expired ones are dropped on the way; ones still finishing their previous
    /// exchange are left for later.
    pub(crate) fn take(&self, addr: SocketAddr, now: Instant) -> Option<Sender> {
        let mut shard = self.shard(addr);
        let (_, idle) = shard.iter_mut().find(|(a, _)| *a == addr)?;
        let mut i = idle.len();
        while i > 0 {
            i -= 1;
            let entry = &idle[i];
            if entry.sender.is_closed() || now.duration_since(entry.since) >= self.idle_timeout {
                idle.swap_remove(i);
            } else if entry.sender.is_ready() {
                return Some(idle.swap_remove(i).sender);
            }
        }
        None
    }

    /// Keep a connection whose exchange has completed for the next request.
    pub(crate) fn put(&self, addr: SocketAddr, sender: Sender) {
        if sender.is_closed() {
            return;
        }
        let since = Instant::now();
        let mut shard = self.shard(addr);
        let idle = match shard.iter().position(|(a, _)| *a == addr) {
            Some(i) => &mut shard[i].1,
            None => {
                shard.push((addr, Vec::new()));
                let last = shard.len() - 1;
                &mut shard[last].1
            }
        };
        if idle.len() < MAX_IDLE_PER_ENDPOINT {
            idle.push(Idle { sender, since });
        }
    }

    /// Close expired and closed connections and forget addresses with none left.
    pub(crate) fn sweep(&self, now: Instant) {
        for shard in &self.shards {
            let mut shard = shard.lock().unwrap_or_else(|e| e.into_inner());
            for (_, idle) in shard.iter_mut() {
                idle.retain(|e| {
                    !e.sender.is_closed() && now.duration_since(e.since) < self.idle_timeout
                });
            }
            shard.retain(|(_, idle)| !idle.is_empty());
        }
    }

    /// Idle connections currently kept (for tests and debugging).
    pub(crate) fn idle_count(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                let s = s.lock().unwrap_or_else(|e| e.into_inner());
                s.iter().map(|(_, idle)| idle.len()).sum::<usize>()
            })
            .sum()
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
