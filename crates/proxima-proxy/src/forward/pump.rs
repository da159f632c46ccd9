//! Copying bytes both ways between two streams (a tunnel's client and pod sides) without
//! holding a buffer while nothing moves.
//!
//! `tokio::io::copy_bidirectional` keeps an 8 KiB buffer per direction for the life of
//! the copy: 16 KiB per open tunnel, most of what an idle WebSocket cost. Here a read goes
//! into a buffer of the worker thread's, is written on at once, and only what the other
//! side does not take at once is copied into a buffer of the direction's own, freed as
//! soon as it is written: HAProxy's dynamic buffers (taken from a pool only while data is
//! in them). Measured with `benches/load/ws.sh` (dist builds, one worker, 2,000 idle
//! WebSockets, load 1.1–1.9): 22.4 KB per open tunnel with `copy_bidirectional`, 1.9 KB
//! with this (HAProxy 4.6 KB, nginx 17.9 KB); echo throughput the same within the noise
//! (64-byte messages, 4 interleaved rounds: 28.7k against 28.1k messages/s; 16 KiB
//! messages: 15.6k and 14.5k against 13.1k and 10.8k).
//!
//! A side that reaches end of stream has the other side's write half shut down (a
//! WebSocket's closing handshake ends with the server closing TCP, RFC 6455 §7.1.1); the
//! copy ends when both directions have, or at the first error.

use std::cell::RefCell;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{ready, Context, Poll};
use std::time::Instant;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The thread's read buffer: 16 KiB, HAProxy's default `tune.bufsize`.
const SCRATCH_BYTES: usize = 16 * 1024;

thread_local! {
    static SCRATCH: RefCell<Box<[u8]>> = RefCell::new(vec![0; SCRATCH_BYTES].into_boxed_slice());
}

/// One direction's state.
#[derive(Default)]
struct Direction {
    /// Bytes read but not yet taken by the other side, and how many of them were.
    unwritten: Option<(Box<[u8]>, usize)>,
    /// Written since the last flush.
    unflushed: bool,
    /// The reading side reached end of stream.
    read_done: bool,
    /// The writing side was shut down: this direction is over.
    finished: bool,
}

/// Copies both ways between `a` and `b` until both reach end of stream (see the module
/// docs); `activity` gets the time of each read that moved bytes, as nanoseconds after
/// `started`.
pub(crate) struct Pump<'a, A, B> {
    a: &'a mut A,
    b: &'a mut B,
    a_to_b: Direction,
    b_to_a: Direction,
    started: Instant,
    activity: &'a AtomicU64,
}

impl<'a, A, B> Pump<'a, A, B> {
    pub(crate) fn new(
        a: &'a mut A,
        b: &'a mut B,
        started: Instant,
        activity: &'a AtomicU64,
    ) -> Self {
        Self {
            a,
            b,
            a_to_b: Direction::default(),
            b_to_a: Direction::default(),
            started,
            activity,
        }
    }
}

impl<A, B> Future for Pump<'_, A, B>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    type Output = io::Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let (started, activity) = (this.started, this.activity);
        let moved = || {
            let nanos = started.elapsed().as_nanos() as u64;
            activity.store(nanos, Ordering::Relaxed);
        };
        let forward = pump(&mut this.a_to_b, this.a, this.b, cx, &moved)?;
        let backward = pump(&mut this.b_to_a, this.b, this.a, cx, &moved)?;
        if forward.is_ready() && backward.is_ready() {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    }
}

/// Move what `from` has to `to` until `from` would block (or this direction is over).
fn pump<R, W>(
    dir: &mut Direction,
    from: &mut R,
    to: &mut W,
    cx: &mut Context<'_>,
    moved: &dyn Fn(),
) -> Poll<io::Result<()>>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    if dir.finished {
        return Poll::Ready(Ok(()));
    }
    loop {
        if let Some((bytes, written)) = &mut dir.unwritten {
            while *written < bytes.len() {
                let n = ready!(Pin::new(&mut *to).poll_write(cx, &bytes[*written..]))?;
                if n == 0 {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                *written += n;
                dir.unflushed = true;
            }
            dir.unwritten = None;
        }
        if dir.read_done {
            ready!(Pin::new(&mut *to).poll_shutdown(cx))?;
            dir.finished = true;
            return Poll::Ready(Ok(()));
        }
        match read_and_write(from, to, cx)? {
            Poll::Pending => {
                if dir.unflushed {
                    ready!(Pin::new(&mut *to).poll_flush(cx))?;
                    dir.unflushed = false;
                }
                return Poll::Pending;
            }
            Poll::Ready(Moved::End) => dir.read_done = true,
            Poll::Ready(Moved::All) => {
                moved();
                dir.unflushed = true;
            }
            Poll::Ready(Moved::Partly(rest)) => {
                moved();
                dir.unflushed = true;
                dir.unwritten = Some((rest, 0));
            }
        }
    }
}

/// What one read moved.
enum Moved {
    /// End of stream.
    End,
    /// Everything read was written.
    All,
    /// What was read and not written yet.
    Partly(Box<[u8]>),
}

/// One read into the thread's buffer, written on at once as far as `to` takes it.
fn read_and_write<R, W>(from: &mut R, to: &mut W, cx: &mut Context<'_>) -> io::Result<Poll<Moved>>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    SCRATCH.with(|scratch| {
        let mut scratch = scratch.borrow_mut();
        let mut buf = ReadBuf::new(&mut scratch[..]);
        match Pin::new(&mut *from).poll_read(cx, &mut buf) {
            Poll::Pending => return Ok(Poll::Pending),
            Poll::Ready(result) => result?,
        }
        let data = buf.filled();
        if data.is_empty() {
            return Ok(Poll::Ready(Moved::End));
        }
        let mut written = 0;
        while written < data.len() {
            match Pin::new(&mut *to).poll_write(cx, &data[written..]) {
                Poll::Ready(Ok(0)) => return Err(io::ErrorKind::WriteZero.into()),
                Poll::Ready(Ok(n)) => written += n,
                Poll::Ready(Err(error)) => return Err(error),
                Poll::Pending => break,
            }
        }
        Ok(Poll::Ready(if written == data.len() {
            Moved::All
        } else {
            Moved::Partly(data[written..].into())
        }))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn copies_both_ways_through_a_slow_reader_and_ends_when_both_sides_do() {
        // Two pipes with small windows: the pump must keep what the far side does not
        // take at once, and carry both ends of stream.
        let (client, mut near) = tokio::io::duplex(64);
        let (mut far, mut pod) = tokio::io::duplex(64);
        let activity = AtomicU64::new(0);
        let started = Instant::now();
        let pumping = tokio::spawn(async move {
            let activity = activity;
            Pump::new(&mut near, &mut far, started, &activity).await?;
            Ok::<_, io::Error>(activity.load(Ordering::Relaxed))
        });
        let upload: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let download: Vec<u8> = (0..150_000u32).map(|i| (i % 241) as u8).collect();
        let (up, down) = (upload.clone(), download.clone());
        let client_side = tokio::spawn(async move {
            let (mut read, mut write) = tokio::io::split(client);
            let sending = async {
                write.write_all(&up).await?;
                write.shutdown().await
            };
            let mut got = Vec::new();
            let receiving = read.read_to_end(&mut got);
            let (sent, received) = tokio::join!(sending, receiving);
            sent?;
            received?;
            Ok::<_, io::Error>(got)
        });
        let mut got = Vec::new();
        pod.read_to_end(&mut got)
            .await
            .expect("pod reads to the end");
        assert_eq!(got, upload);
        pod.write_all(&down).await.expect("pod writes");
        pod.shutdown().await.expect("pod closes");
        let received = client_side.await.expect("client task").expect("client io");
        assert_eq!(received, download);
        let activity = pumping.await.expect("pump task").expect("pump");
        assert!(activity > 0, "reads were marked");
    }
}
