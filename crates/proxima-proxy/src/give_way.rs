//! A worker that has been busy for a while gives the CPU away once.
//!
//! The kernel's scheduler (EEVDF since Linux 6.6, CFS before it) takes the CPU from a
//! thread that never sleeps only when its slice is used up *and* something makes the
//! scheduler look: a timer tick (every 4 ms at the common 250 Hz) or another thread
//! waking on that CPU. A thread that is already runnable, waiting its turn, makes no
//! such event. Two workers can so end up queued on one CPU while the client and the pod
//! run on the other: the worker that holds the CPU always has a request ready (its
//! clients and its pod keep it fed), never sleeps, and keeps the CPU to the next tick,
//! and every connection of the worker waiting behind it waits that long too.
//!
//! Measured with two workers (`wrk -t1 -c32` through Proxima to a one-worker nginx, all
//! on two CPUs, `perf sched timehist`): a worker ran up to 4.5 ms at a stretch while its
//! sibling, runnable on the same CPU, waited; one request in ten took over 1.3 ms and
//! the p99 was 4.5 ms, against HAProxy's 1.7 ms on the same host (whose threads' runs
//! ended by 2 ms). So a worker keeps a [`BusySpell`]: the time since it last slept
//! (waited for events and was woken). Once that passes [`DEFAULT_LIMIT`], it calls
//! `sched_yield` at its next chance: when its runtime has run out of ready tasks and is
//! about to wait for events (between batches, nothing half done), or when a request
//! begins, for a worker whose queue never runs empty. A thread that yields goes behind
//! the threads runnable on its CPU (EEVDF pushes its deadline back by a slice), so a
//! sibling waiting there runs now instead of at the next tick; when nothing else is
//! runnable, the call returns at once. It costs one system call per limit of
//! uninterrupted work, nothing to a worker that sleeps between requests.
//!
//! Only workers that could each have a CPU of their own give way (`workers.rs`,
//! `gives_way`): with more workers than CPUs, sharing one is their normal state, the
//! kernel's slices share it fairly, and a yield only sends a worker behind the others.
//! Pinning each worker to its own CPU (`WorkerCpus::Pinned`, nginx's
//! `worker_cpu_affinity auto`) avoids the queueing altogether where the proxy may own
//! CPUs; yielding is for the common case where it shares them.

use std::cell::Cell;
use std::time::{Duration, Instant};

/// Busy time after which a worker gives way. Measured with two workers on two CPUs
/// (`benches/README.md`, eleventh round), p99 against HAProxy's: 1.3× at 1 ms, 0.9×
/// at 500 µs, and at 300 µs no better but 4% fewer requests per second (each yield
/// also lets the client and the pod in sooner, in smaller batches). Well below both
/// the 4 ms tick of a 250 Hz kernel and EEVDF's slice (1.4 ms on two CPUs).
pub const DEFAULT_LIMIT: Duration = Duration::from_micros(500);

/// A wait for events that lasted this long was a sleep (the thread was switched out and
/// woken). A wait that found events ready returns in a few microseconds.
const SLEPT: Duration = Duration::from_micros(20);

/// How long a worker has run without sleeping, and when it should give way (see the
/// module docs). Pure: the caller passes the time in.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BusySpell {
    limit: Duration,
    /// Since when the worker has been running without a sleep (`None`: not yet known).
    since: Option<Instant>,
    /// When the worker began its current wait for events, if it is in one.
    waiting_since: Option<Instant>,
}

impl BusySpell {
    /// A spell for a worker that gives way after `limit` of busy time.
    pub(crate) const fn new(limit: Duration) -> Self {
        Self {
            limit,
            since: None,
            waiting_since: None,
        }
    }

    /// The worker is about to wait for events at `now`. `true`: give the CPU away first
    /// (and then call [`restart`](Self::restart)).
    pub(crate) fn waiting(&mut self, now: Instant) -> bool {
        self.waiting_since = Some(now);
        self.overdue(now)
    }

    /// The worker's wait for events ended at `now`; a long one was a sleep, which ends
    /// the spell.
    pub(crate) fn woken(&mut self, now: Instant) {
        if let Some(began) = self.waiting_since.take() {
            if now.saturating_duration_since(began) >= SLEPT {
                self.since = Some(now);
            }
        }
    }

    /// The worker is busy at `now` (a request begins). `true`: give the CPU away (and
    /// then call [`restart`](Self::restart)).
    pub(crate) fn busy(&mut self, now: Instant) -> bool {
        self.overdue(now)
    }

    /// The worker gave the CPU away and has it back at `now`: a new spell begins.
    pub(crate) fn restart(&mut self, now: Instant) {
        self.since = Some(now);
    }

    fn overdue(&mut self, now: Instant) -> bool {
        let since = *self.since.get_or_insert(now);
        !self.limit.is_zero() && now.saturating_duration_since(since) >= self.limit
    }
}

thread_local! {
    /// The current worker's spell; `None` on threads that are not workers, or whose
    /// workers do not give way.
    static SPELL: Cell<Option<BusySpell>> = const { Cell::new(None) };
}

/// Make the current thread a worker that gives way after `limit` of busy time (`None`:
/// never).
pub(crate) fn enter(limit: Option<Duration>) {
    SPELL.set(limit.filter(|l| !l.is_zero()).map(BusySpell::new));
}

/// The runtime's hook before it waits for events (`on_thread_park`). Returns whether it
/// gave the CPU away.
pub(crate) fn before_wait() -> bool {
    step(|spell| spell.waiting(Instant::now()))
}

/// The runtime's hook after a wait for events (`on_thread_unpark`).
pub(crate) fn after_wait() {
    if let Some(mut spell) = SPELL.get() {
        spell.woken(Instant::now());
        SPELL.set(Some(spell));
    }
}

/// A request begins on this thread at `now`. Returns whether it gave the CPU away.
pub(crate) fn request_begins(now: Instant) -> bool {
    step(|spell| spell.busy(now))
}

fn step(decide: impl FnOnce(&mut BusySpell) -> bool) -> bool {
    let Some(mut spell) = SPELL.get() else {
        return false;
    };
    let gave_way = decide(&mut spell);
    if gave_way {
        yield_cpu();
        spell.restart(Instant::now());
    }
    SPELL.set(Some(spell));
    gave_way
}

fn yield_cpu() {
    #[cfg(unix)]
    // SAFETY: no arguments; it only asks the scheduler to run another thread first.
    unsafe {
        libc::sched_yield();
    }
    #[cfg(not(unix))]
    std::thread::yield_now();
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: Duration = Duration::from_millis(1);

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    #[test]
    fn a_worker_that_never_sleeps_gives_way_once_per_limit() {
        let t0 = Instant::now();
        let mut spell = BusySpell::new(LIMIT);
        let mut gave_way = Vec::new();
        // Waits that find events ready at once (2 µs), every 100 µs, for 3.5 ms.
        let mut at = t0;
        while at < t0 + us(3_500) {
            if spell.waiting(at) {
                gave_way.push(at - t0);
                spell.restart(at + us(1));
            }
            spell.woken(at + us(2));
            at += us(100);
        }
        assert_eq!(gave_way, [us(1_000), us(2_100), us(3_200)]);
    }

    #[test]
    fn a_sleep_ends_the_spell() {
        let t0 = Instant::now();
        let mut spell = BusySpell::new(LIMIT);
        assert!(!spell.waiting(t0));
        spell.woken(t0 + us(2));
        assert!(!spell.busy(t0 + us(900)));
        // A wait of 50 µs: the worker slept, and its busy time starts again.
        assert!(!spell.waiting(t0 + us(950)));
        spell.woken(t0 + us(1_000));
        assert!(!spell.busy(t0 + us(1_900)));
        assert!(!spell.waiting(t0 + us(1_990)));
        spell.woken(t0 + us(1_992));
        assert!(spell.busy(t0 + us(2_000)));
    }

    #[test]
    fn requests_alone_also_count_as_busy() {
        // A worker whose runtime never runs out of ready tasks never waits for events:
        // the requests it begins are where it gives way.
        let t0 = Instant::now();
        let mut spell = BusySpell::new(LIMIT);
        let mut gave_way = Vec::new();
        for i in 0..=20 {
            let at = t0 + us(i * 150);
            if spell.busy(at) {
                gave_way.push(i);
                spell.restart(at);
            }
        }
        // 1050 µs is the first request past the limit, 2100 µs the first past it again.
        assert_eq!(gave_way, [7, 14]);
    }

    #[test]
    fn a_zero_limit_never_gives_way_and_threads_that_are_not_workers_are_left_alone() {
        let t0 = Instant::now();
        let mut spell = BusySpell::new(Duration::ZERO);
        assert!(!spell.busy(t0));
        assert!(!spell.busy(t0 + Duration::from_secs(10)));

        enter(None);
        assert!(!request_begins(Instant::now()));
        assert!(!before_wait());
        enter(Some(Duration::ZERO));
        assert!(!before_wait());
    }

    #[test]
    fn a_worker_thread_gives_way_through_its_hooks() {
        enter(Some(us(200)));
        assert!(!before_wait());
        after_wait();
        let busy_until = Instant::now() + us(500);
        while Instant::now() < busy_until {
            std::hint::spin_loop();
        }
        assert!(request_begins(Instant::now()));
        // The spell restarted when it gave way.
        assert!(!request_begins(Instant::now()));
        enter(None);
    }
}
