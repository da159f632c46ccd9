//! User-space network delay: a TCP relay that delays each direction.
//!
//! The testbed emulates edge nodes that are milliseconds apart (papers,
//! evaluation setup), but the test kernel has no `netem` qdisc, so the delay
//! is injected here. Each accepted connection is paired with a connection to
//! the target, and each direction runs a small pipeline:
//!
//! ```text
//! reader: read chunk at t  ──(t + delay, chunk)──▶ queue ──▶ writer: sleep until t + delay, write
//! ```
//!
//! The reader keeps reading while earlier chunks wait, so a direction holds
//! up to a bandwidth-delay product of data and throughput is not limited to
//! one chunk per delay; the queue is FIFO, so order is preserved even when
//! [`DelayLink::set_delay`] shortens the delay. Delays are kept to within tens
//! of microseconds by a dedicated timer thread (tokio's millisecond timer would
//! add about a millisecond to every hop). An end of stream (FIN) is
//! delayed like data and forwarded as a half-close. Limits: the TCP handshake
//! with the relay itself is not delayed, and read/write errors (e.g. a reset)
//! tear both connections down at once rather than after the delay.
//!
//! A delay of [`BLACKHOLE`] drops the link: data is held, not forwarded, until the
//! delay changes (as TCP keeps retransmitting into a dead route); a peer waiting for
//! an answer hangs until its own timeout. The handshake still completes (see above),
//! so a new connection opens but nothing crosses it.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use std::time::Instant;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};

/// Size of one read from a socket (a buffer of this size per direction of each
/// relayed connection).
const READ_CHUNK: usize = 16 * 1024;
/// Chunks in flight per direction (bounds memory at 16 MiB per direction).
const QUEUE_CHUNKS: usize = 1024;

/// A running delay relay. Dropping it closes the listener and every relayed
/// connection.
#[derive(Debug)]
pub struct DelayLink {
    addr: SocketAddr,
    target: SocketAddr,
    delay_nanos: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl DelayLink {
    /// Listens on `listen` (port 0 picks a free port) and relays every
    /// connection to `target`, delaying each direction by `delay`.
    pub async fn spawn(
        listen: SocketAddr,
        target: SocketAddr,
        delay: Duration,
    ) -> io::Result<DelayLink> {
        let listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let delay_nanos = Arc::new(AtomicU64::new(duration_nanos(delay)));
        let task = tokio::spawn(accept_loop(listener, target, delay_nanos.clone()));
        Ok(DelayLink {
            addr,
            target,
            delay_nanos,
            task,
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address connections are relayed to.
    pub fn target(&self) -> SocketAddr {
        self.target
    }

    /// The current one-way delay.
    pub fn delay(&self) -> Duration {
        Duration::from_nanos(self.delay_nanos.load(Ordering::Relaxed))
    }

    /// Changes the one-way delay of data read from now on, in both directions
    /// of every (existing and future) connection.
    pub fn set_delay(&self, delay: Duration) {
        self.delay_nanos
            .store(duration_nanos(delay), Ordering::Relaxed);
    }

    /// Closes the listener and every relayed connection.
    pub fn abort(&self) {
        self.task.abort();
    }
}

impl Drop for DelayLink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub(crate) fn duration_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A delay that never ends: data is held (as dropped packets that TCP keeps
/// retransmitting) until the delay is set to anything else. Give it to
/// [`DelayLink::set_delay`] or [`DelayMatrix::set`](crate::DelayMatrix::set).
pub const BLACKHOLE: Duration = Duration::MAX;

const BLACKHOLE_NANOS: u64 = u64::MAX;

async fn accept_loop(listener: TcpListener, target: SocketAddr, delay_nanos: Arc<AtomicU64>) {
    let mut relays = JoinSet::new();
    loop {
        match listener.accept().await {
            Ok((inbound, _peer)) => {
                relays.spawn(relay(
                    inbound,
                    target,
                    delay_nanos.clone(),
                    delay_nanos.clone(),
                ));
            }
            Err(error) => {
                tracing::warn!(%error, "delay link accept failed");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        while relays.try_join_next().is_some() {}
    }
}

/// Relay `inbound` to a new connection to `target`: what the peer sends is delayed by
/// `upstream` nanoseconds, what comes back by `downstream` (both read per chunk, so a
/// change applies to connections already open).
pub(crate) async fn relay(
    inbound: TcpStream,
    target: SocketAddr,
    upstream: Arc<AtomicU64>,
    downstream: Arc<AtomicU64>,
) {
    let outbound = match TcpStream::connect(target).await {
        Ok(outbound) => outbound,
        Err(error) => {
            tracing::debug!(%error, %target, "delay link cannot reach its target");
            return;
        }
    };
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    let (inbound_read, inbound_write) = inbound.into_split();
    let (outbound_read, outbound_write) = outbound.into_split();
    let result = tokio::try_join!(
        delayed_copy(inbound_read, outbound_write, upstream),
        delayed_copy(outbound_read, inbound_write, downstream),
    );
    if let Err(error) = result {
        tracing::debug!(%error, "delay link connection ended");
    }
}

/// One direction: forwards everything read from `reader` to `writer`, each
/// chunk `delay` after it was read, then forwards the end of stream.
async fn delayed_copy(
    mut reader: OwnedReadHalf,
    mut writer: OwnedWriteHalf,
    delay_nanos: Arc<AtomicU64>,
) -> io::Result<()> {
    // `None` marks the end of stream.
    let (queue, mut pending) = mpsc::channel::<(Instant, Option<Bytes>)>(QUEUE_CHUNKS);
    let read_delay = delay_nanos.clone();
    let read_side = async move {
        // One read buffer, and each chunk a copy of what was read. A chunk split off a
        // shared buffer stays alive for the delay, so the next read had to allocate a
        // fresh buffer, and the longer the delays a strategy chose, the more of those
        // were alive at once: the emulation's own cost grew with its routing.
        let mut buffer = BytesMut::with_capacity(READ_CHUNK);
        loop {
            buffer.clear();
            let read = reader.read_buf(&mut buffer).await?;
            let nanos = read_delay.load(Ordering::Relaxed);
            // Held data goes once the link is back (the writer waits for that).
            let due = Instant::now()
                + match nanos {
                    BLACKHOLE_NANOS => Duration::ZERO,
                    n => Duration::from_nanos(n),
                };
            let chunk = (read > 0).then(|| Bytes::copy_from_slice(&buffer));
            let at_end = chunk.is_none();
            if queue.send((due, chunk)).await.is_err() || at_end {
                return Ok::<(), io::Error>(());
            }
        }
    };
    let write_side = async move {
        while let Some((due, chunk)) = pending.recv().await {
            crate::timer::sleep_until(due).await;
            while delay_nanos.load(Ordering::Relaxed) == BLACKHOLE_NANOS {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            match chunk {
                Some(bytes) => writer.write_all(&bytes).await?,
                None => {
                    writer.shutdown().await?;
                    break;
                }
            }
        }
        Ok::<(), io::Error>(())
    };
    tokio::try_join!(read_side, write_side).map(|_| ())
}
