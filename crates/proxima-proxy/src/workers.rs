//! Serving on worker threads, each with its own single-threaded runtime (nginx's model).
//!
//! The work-stealing scheduler is built for tasks that may run anywhere; a proxy's
//! connection task and the upstream connection task it drives do not need that, and on
//! one or two cores the scheduler's cross-thread bookkeeping (shared queues, atomics on
//! every wake, a parked-thread protocol) costs more per request than it gives. So the
//! listener is shared by `workers` threads, each running a `current_thread` runtime
//! that accepts, serves its connections and runs their upstream connections, all on
//! that thread:
//!
//! * every worker polls a duplicate of the one listening socket, so whichever worker is
//!   free takes the next connection, and there is still exactly one bound port (no
//!   `SO_REUSEPORT`, which would also let another process bind it); a worker that
//!   finds itself two connections ahead of another hands the new one over, so a burst
//!   of connections is still spread evenly (`balance.rs`);
//! * upstream keep-alive connections are reused by the worker that opened them (the
//!   pool tags them, see `pool.rs`): handing one to another thread would turn every
//!   request into two cross-thread wake-ups;
//! * each worker measures its own scheduling lag (`stall.rs`), since a stall of one
//!   worker is not one of the others, and its requests read that meter.
//!
//! The control plane (discovery, admin server, probes) stays on the caller's runtime.

use std::future::Future;
use std::io;
use std::sync::Arc;

use tokio::sync::oneshot;
use tracing::info;

use crate::balance::{Balance, Member};
use crate::stall::StallMeter;
use crate::Proxy;

/// Serve `listener` on `workers` threads (at least one), each with its own
/// single-threaded runtime (see the module docs). Each worker stops accepting when the
/// future `stop()` gives it resolves and then finishes as [`serve`](crate::serve)
/// does. [`Workers::join`] waits for them all.
pub fn serve_on_workers<S, F>(
    proxy: Arc<Proxy>,
    listener: std::net::TcpListener,
    workers: usize,
    stop: S,
) -> io::Result<Workers>
where
    S: Fn() -> F,
    F: Future<Output = ()> + Send + 'static,
{
    listener.set_nonblocking(true)?;
    proxy.pool.serve_on_workers();
    let workers = workers.max(1);
    let mut done = Vec::with_capacity(workers);
    let seats = Balance::seats(workers);
    for (n, seat) in (1..=workers).zip(seats) {
        let listener = listener.try_clone()?;
        let proxy = proxy.clone();
        let stop = stop();
        let (tx, rx) = oneshot::channel();
        std::thread::Builder::new()
            .name(format!("proxima-worker-{n}"))
            .spawn(move || {
                let _ = tx.send(run_worker(n as u32, proxy, listener, seat, stop));
            })?;
        done.push(rx);
    }
    info!(workers, "proxy workers started");
    Ok(Workers { done })
}

/// The running workers of [`serve_on_workers`].
#[derive(Debug)]
pub struct Workers {
    done: Vec<oneshot::Receiver<io::Result<()>>>,
}

impl Workers {
    /// Wait until every worker has stopped; the first error any of them met (a worker
    /// that panicked is an error too).
    pub async fn join(self) -> io::Result<()> {
        let mut first_error = None;
        for (n, rx) in self.done.into_iter().enumerate() {
            let result = rx.await.unwrap_or_else(|_| {
                Err(io::Error::other(format!("proxy worker {} panicked", n + 1)))
            });
            if let Err(error) = result {
                first_error.get_or_insert(error);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

fn run_worker(
    index: u32,
    proxy: Arc<Proxy>,
    listener: std::net::TcpListener,
    seat: Member,
    stop: impl Future<Output = ()> + Send,
) -> io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let stall = Arc::new(StallMeter::new());
        StallMeter::spawn(&stall, proxy.router());
        crate::worker::enter(Some((index, stall)));
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let served = crate::server::serve_with(proxy, listener, stop, Some(seat)).await;
        crate::worker::enter(None);
        served
    })
}
