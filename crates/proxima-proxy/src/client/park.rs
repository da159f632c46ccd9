//! Client connections parked between requests: what an idle connection costs.
//!
//! An edge node holds many devices that keep a connection open and send a reading now
//! and then (issue 29: at 20,000 devices, 11.6 KB each was 230 MB for connections doing
//! nothing; HAProxy holds ~200 B). A connection in use needs a task with its state,
//! the exchange and perhaps hyper's (kilobytes, on the heap). One that has idled for
//! [`PARK_AFTER`](crate::client::conn::PARK_AFTER) on the proxy's own HTTP/1.1 loop, with nothing
//! of a next request read, ends its task instead and leaves only a [`Parked`] record in
//! its worker's [`Lot`]: the socket, the client's address, its place in the connection
//! budget, and when it idles out. The lot waits on every parked socket at once
//! (`FuturesUnordered`: one small node each, woken on its own), and the first byte or the
//! client's close gives the connection a new task (`client/server.rs`), with a fresh state, as
//! if it had just been accepted.
//!
//! What stays per parked connection, measured with heaptrack at 4,000 parked
//! connections (`benches/load/README.md`): the lot's node with the record in it,
//! 184 bytes; tokio's registration of the socket with its reactor (`ScheduledIo`),
//! 268 bytes; and the kernel's socket, outside the process's memory. Nothing else: no
//! buffer, no timer, no task.
//! There is no timer per parked connection: the idle limit is kept by a sweep of the lot
//! ([`Lot::sweep`]), which shuts an expired socket down so that its node wakes and the
//! connection is closed (and counted) like any other idle one.

use std::future::Future;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use futures_util::stream::{FuturesUnordered, StreamExt};
use prometheus::IntGauge;
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;

use crate::client::balance::Served;

/// An open client connection: its socket, the client's address and what it holds.
pub(crate) struct Client {
    pub(crate) stream: TcpStream,
    pub(crate) peer: SocketAddr,
    pub(crate) open: Open,
}

/// What an open connection holds until it closes, parked or not: its place in the
/// connection budget and in the workers' balance, and its count in
/// `proxima_client_connections`.
pub(crate) struct Open {
    _permit: OwnedSemaphorePermit,
    _served: Option<Served>,
    gauge: IntGauge,
}

impl Open {
    pub(crate) fn new(
        permit: OwnedSemaphorePermit,
        served: Option<Served>,
        gauge: IntGauge,
    ) -> Self {
        gauge.inc();
        Self {
            _permit: permit,
            _served: served,
            gauge,
        }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

/// A connection waiting, without a task, for its next request.
pub(crate) struct Parked {
    pub(crate) client: Client,
    /// When it is closed as idle if no request comes.
    pub(crate) idle_until: Instant,
}

/// One parked connection in the lot: resolves when its socket is readable.
struct Waiting(Option<Parked>);

impl Future for Waiting {
    type Output = Option<Parked>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(parked) = &self.0 else {
            return Poll::Ready(None);
        };
        // An error (the socket is gone) wakes it as well: the new task finds the close.
        if parked.client.stream.poll_read_ready(cx).is_pending() {
            return Poll::Pending;
        }
        Poll::Ready(self.0.take())
    }
}

/// What became of a parked connection when the lot let go of it.
pub(crate) enum Woken {
    /// Its socket is readable: serve it.
    Ready(Client),
    /// Idle past its limit: closed.
    IdledOut(SocketAddr),
}

/// A worker's parked connections (see the module docs), counted in `gauge`
/// (`proxima_client_connections_parked`, shared by the workers).
pub(crate) struct Lot {
    waiting: FuturesUnordered<Waiting>,
    gauge: IntGauge,
}

impl Lot {
    pub(crate) fn new(gauge: IntGauge) -> Self {
        Self {
            waiting: FuturesUnordered::new(),
            gauge,
        }
    }

    pub(crate) fn park(&mut self, parked: Parked) {
        self.waiting.push(Waiting(Some(parked)));
        self.gauge.inc();
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// The next parked connection to wake (never, while the lot is empty).
    pub(crate) async fn next(&mut self, now: impl Fn() -> Instant) -> Woken {
        loop {
            let woken = self.waiting.next().await;
            if woken.is_some() {
                self.gauge.dec();
            }
            match woken {
                Some(Some(parked)) if now() >= parked.idle_until => {
                    return Woken::IdledOut(parked.client.peer)
                }
                Some(Some(parked)) => return Woken::Ready(parked.client),
                Some(None) => {}
                None => std::future::pending::<()>().await,
            }
        }
    }

    /// Shut down the sockets of connections idle past their limit at `now`, so that
    /// they wake (and [`Lot::next`] reports them as idled out). Returns how many.
    pub(crate) fn sweep(&self, now: Instant) -> usize {
        let mut expired = 0;
        for waiting in &self.waiting {
            let Some(parked) = &waiting.0 else { continue };
            if now >= parked.idle_until {
                // SAFETY: the descriptor is the parked socket's own, open while it is
                // borrowed here; `shutdown` closes nothing, it only ends the stream both
                // ways (the client sees the close an idle limit gives).
                unsafe {
                    libc::shutdown(parked.client.stream.as_raw_fd(), libc::SHUT_RDWR);
                }
                expired += 1;
            }
        }
        expired
    }

    /// Close every parked connection (the proxy shuts down: idle ones close at once).
    pub(crate) fn close_all(&mut self) {
        self.gauge.sub(self.waiting.len() as i64);
        self.waiting.clear();
    }
}

impl Drop for Lot {
    fn drop(&mut self) {
        self.close_all();
    }
}
