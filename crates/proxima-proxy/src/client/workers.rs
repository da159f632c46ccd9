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
//!   pool tags them, see `upstream/pool.rs`): handing one to another thread would turn every
//!   request into two cross-thread wake-ups;
//! * each worker measures its own scheduling lag (`client/stall.rs`), since a stall of one
//!   worker is not one of the others, and its requests read that meter;
//! * a worker that has run for a while without sleeping gives the CPU away once
//!   (`give_way.rs`), so that a sibling queued behind it on the same CPU does not wait
//!   for the kernel's next tick; where the proxy may own its CPUs, each worker can be
//!   pinned to one instead ([`WorkerCpus::Pinned`]).
//!
//! The control plane (discovery, admin server, probes) stays on the caller's runtime.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tracing::{info, warn};

use crate::client::balance::{Balance, Member};
use crate::client::stall::StallMeter;
use crate::Proxy;

/// Which CPUs the workers run on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WorkerCpus {
    /// Any CPU the process may use; the kernel places and moves them (the default: on an
    /// edge node the proxy shares its CPUs with the workloads).
    #[default]
    Shared,
    /// Worker `n` on the `n`-th CPU the process may use, wrapping around when there are
    /// more workers than CPUs (nginx's `worker_cpu_affinity auto`, HAProxy's `cpu-map`):
    /// for a proxy given CPUs of its own (Kubernetes' static CPU manager), where it
    /// keeps two workers from queueing on one CPU while another runs something else.
    Pinned,
}

/// How the data-plane workers run.
#[derive(Clone, Copy, Debug)]
pub struct WorkerOptions {
    /// How many workers (at least one is started).
    pub count: usize,
    /// Which CPUs they run on.
    pub cpus: WorkerCpus,
    /// Busy time without a sleep after which a worker gives the CPU away once
    /// (`give_way.rs`); `None` or zero: never. Used only by two or more workers, no
    /// more than the CPUs, and not pinned (see `gives_way`).
    pub yield_after: Option<Duration>,
}

impl WorkerOptions {
    /// `count` workers on shared CPUs, giving way after
    /// [`DEFAULT_YIELD_AFTER`](crate::DEFAULT_YIELD_AFTER).
    pub fn new(count: usize) -> Self {
        Self {
            count,
            cpus: WorkerCpus::Shared,
            yield_after: Some(crate::client::give_way::DEFAULT_LIMIT),
        }
    }
}

/// Serve `listener` on worker threads (at least one), each with its own single-threaded
/// runtime (see the module docs). Each worker stops accepting when the future `stop()`
/// gives it resolves and then finishes as [`serve`](crate::serve) does.
/// [`Workers::join`] waits for them all.
pub fn serve_on_workers<S, F>(
    proxy: Arc<Proxy>,
    listener: std::net::TcpListener,
    options: WorkerOptions,
    stop: S,
) -> io::Result<Workers>
where
    S: Fn() -> F,
    F: Future<Output = ()> + Send + 'static,
{
    listener.set_nonblocking(true)?;
    proxy.pool.serve_on_workers();
    let workers = options.count.max(1);
    let allowed = affinity::allowed_cpus();
    let cpus = match (options.cpus, &allowed) {
        (WorkerCpus::Shared, _) => Vec::new(),
        (WorkerCpus::Pinned, Ok(allowed)) => allowed.clone(),
        (WorkerCpus::Pinned, Err(error)) => {
            warn!(%error, "cannot read the CPUs this process may use; workers are not pinned");
            Vec::new()
        }
    };
    let cpu_count = allowed.map_or_else(
        |_| std::thread::available_parallelism().map_or(1, usize::from),
        |allowed| allowed.len(),
    );
    let yield_after = options
        .yield_after
        .filter(|_| gives_way(workers, cpu_count, !cpus.is_empty()));
    let mut done = Vec::with_capacity(workers);
    let seats = Balance::seats(workers);
    let heartbeats = crate::client::give_way::Heartbeats::new(workers);
    for (n, seat) in (1..=workers).zip(seats) {
        let listener = listener.try_clone()?;
        let proxy = proxy.clone();
        let stop = stop();
        let giving_way = yield_after.map(|limit| (heartbeats.clone(), n - 1, limit));
        let (tx, rx) = oneshot::channel();
        let cpu = (!cpus.is_empty()).then(|| cpus[(n - 1) % cpus.len()]);
        std::thread::Builder::new()
            .name(format!("proxima-worker-{n}"))
            .spawn(move || {
                if let Some(cpu) = cpu {
                    match affinity::pin_current_thread(cpu) {
                        Ok(()) => info!(worker = n, cpu, "proxy worker pinned"),
                        Err(error) => warn!(worker = n, cpu, %error, "proxy worker not pinned"),
                    }
                }
                crate::client::give_way::enter(giving_way);
                let _ = tx.send(run_worker(n as u32, proxy, listener, seat, stop));
            })?;
        done.push(rx);
    }
    info!(workers, cpus = ?options.cpus, ?yield_after, "proxy workers started");
    Ok(Workers { done })
}

/// Whether `workers` workers on `cpus` CPUs give way when busy (`give_way.rs`). Only
/// when each could have a CPU of its own but they are not pinned: then two of them
/// queued on one CPU is the kernel's placement, which a yield undoes. A lone worker
/// has no sibling; pinned workers are never queued together unless there are more
/// than CPUs; and with more workers than CPUs, sharing a CPU is the normal state, the
/// kernel's time slices share it fairly, and a yield only sends the worker behind all
/// the others there (four workers on two CPUs: p99 1.9–2.0 ms without yielding,
/// 3.6–4.3 ms with it, `benches/README.md`).
fn gives_way(workers: usize, cpus: usize, pinned: bool) -> bool {
    workers >= 2 && workers <= cpus && !pinned
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
    let yields = proxy.metrics.worker_yields();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .on_thread_park(move || {
            if crate::client::give_way::before_wait() {
                yields.inc();
            }
        })
        .on_thread_unpark(crate::client::give_way::after_wait)
        .build()?;
    runtime.block_on(async move {
        let stall = Arc::new(StallMeter::new());
        StallMeter::spawn(&stall, proxy.router());
        crate::client::worker::enter(Some((index, stall)));
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let served = crate::client::server::serve_with(proxy, listener, stop, Some(seat)).await;
        crate::client::worker::enter(None);
        served
    })
}

/// Reading and setting which CPUs a thread may run on (Linux: `sched_getaffinity`,
/// `sched_setaffinity`).
mod affinity {
    use std::io;

    /// The CPUs the calling thread may run on, in ascending order.
    #[cfg(target_os = "linux")]
    pub(super) fn allowed_cpus() -> io::Result<Vec<usize>> {
        // SAFETY: a zeroed cpu_set_t is an empty set; the kernel writes at most its size.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<libc::cpu_set_t>();
        // SAFETY: `set` is valid and writable for `size` bytes; 0 is the calling thread.
        if unsafe { libc::sched_getaffinity(0, size, &mut set) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
            // SAFETY: `cpu` is below CPU_SETSIZE, the set's capacity.
            .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
            .collect();
        if cpus.is_empty() {
            return Err(io::Error::other("the affinity mask is empty"));
        }
        Ok(cpus)
    }

    /// Let the calling thread run on `cpu` only.
    #[cfg(target_os = "linux")]
    pub(super) fn pin_current_thread(cpu: usize) -> io::Result<()> {
        if cpu >= libc::CPU_SETSIZE as usize {
            return Err(io::Error::other(format!(
                "CPU {cpu} is past the largest set"
            )));
        }
        // SAFETY: as above; `cpu` is below CPU_SETSIZE.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        unsafe { libc::CPU_SET(cpu, &mut set) };
        let size = std::mem::size_of::<libc::cpu_set_t>();
        // SAFETY: `set` is a valid set of `size` bytes; 0 is the calling thread.
        if unsafe { libc::sched_setaffinity(0, size, &set) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    #[cfg(not(target_os = "linux"))]
    pub(super) fn allowed_cpus() -> io::Result<Vec<usize>> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "pinning workers to CPUs needs Linux",
        ))
    }

    #[cfg(not(target_os = "linux"))]
    pub(super) fn pin_current_thread(_cpu: usize) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "pinning workers to CPUs needs Linux",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::gives_way;

    #[test]
    fn only_unpinned_workers_with_a_cpu_each_give_way() {
        assert!(!gives_way(1, 4, false), "a lone worker");
        assert!(gives_way(2, 2, false));
        assert!(gives_way(2, 8, false));
        assert!(!gives_way(3, 2, false), "more workers than CPUs");
        assert!(!gives_way(2, 2, true), "pinned one per CPU");
        assert!(!gives_way(4, 2, true), "pinned, wrapping around");
    }
}
