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

use std::cell::RefCell;
use std::future::Future;
use std::io;
use std::sync::Arc;

use tokio::sync::oneshot;
use tracing::info;

use crate::balance::{Balance, Member};
use crate::stall::StallMeter;
use crate::Proxy;

/// What the current thread is, for the pool and the stall meter.
#[derive(Debug)]
struct Worker {
    /// 1-based worker number; 0 is any thread that is not a worker.
    index: u32,
    stall: Arc<StallMeter>,
}

thread_local! {
    static CURRENT: RefCell<Option<Worker>> = const { RefCell::new(None) };
}

/// Make the current thread worker `index`, measuring its stalls with `stall`, or (`None`)
/// no worker.
fn enter(worker: Option<(u32, Arc<StallMeter>)>) {
    let worker = worker.map(|(index, stall)| Worker { index, stall });
    CURRENT.with(|current| *current.borrow_mut() = worker);
}

/// Make the current thread count as worker `index` (tests of the per-worker rules).
#[cfg(test)]
pub(crate) fn pretend_worker(index: u32) {
    enter(Some((index, Arc::new(StallMeter::new()))));
}

/// The worker number of the current thread (0 when it is not a worker).
pub(crate) fn current_index() -> u32 {
    CURRENT.with(|w| w.borrow().as_ref().map_or(0, |w| w.index))
}

/// Run `f` with the current worker's stall meter, if this thread is a worker.
pub(crate) fn with_stall<R>(f: impl FnOnce(Option<&StallMeter>) -> R) -> R {
    CURRENT.with(|w| f(w.borrow().as_ref().map(|w| &*w.stall)))
}

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
        enter(Some((index, stall)));
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let served = crate::server::serve_with(proxy, listener, stop, Some(seat)).await;
        enter(None);
        served
    })
}
