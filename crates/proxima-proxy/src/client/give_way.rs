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
//! (waited for events and was woken). Once that passes [`DEFAULT_LIMIT`], it looks at
//! its siblings' [`Heartbeats`] (when each last ran: every wait for events, wake-up and
//! request start is a beat), and if one has not run for as long, calls `sched_yield`.
//! It does so at its next chance: when its runtime has run out of ready tasks and is
//! about to wait for events (between batches, nothing half done), or when a request
//! begins, for a worker whose queue never runs empty. A thread that yields goes behind
//! the threads runnable on its CPU (EEVDF pushes its deadline back by a slice), so a
//! sibling waiting there runs now instead of at the next tick; when nothing else is
//! runnable, the call returns at once.
//!
//! Looking at the siblings first matters: yielding whenever busy (tried first) also
//! gave the CPU to the client and the pod while every sibling was running elsewhere,
//! five to ten times as often, for a higher p99 (2.1–2.7 ms against 1.7–2.0 ms, `wrk
//! -t2 -c64`). A sibling that is idle, not waiting, looks the same from here; yielding
//! for it costs one system call per limit of busy time. A worker that sleeps between
//! requests pays one clock store per wait and request, nothing else.
//!
//! Only workers that could each have a CPU of their own give way (`workers.rs`,
//! `gives_way`): with more workers than CPUs, sharing one is their normal state, the
//! kernel's slices share it fairly, and a yield only sends a worker behind the others.
//! Pinning each worker to its own CPU (`WorkerCpus::Pinned`, nginx's
//! `worker_cpu_affinity auto`) avoids the queueing altogether where the proxy may own
//! CPUs; yielding is for the common case where it shares them.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Busy time after which a worker gives way, and how long a sibling must have gone
/// without running for it to. Measured with two workers on two CPUs, yielding whenever
/// busy (`benches/README.md`, eleventh round), p99 against HAProxy's: 1.3× at 1 ms,
/// 0.9× at 500 µs, and at 300 µs no better but 4% fewer requests per second. Well below
/// both the 4 ms tick of a 250 Hz kernel and EEVDF's slice (1.4 ms on two CPUs).
pub const DEFAULT_LIMIT: Duration = Duration::from_micros(500);

/// A wait for events that lasted this long was a sleep (the thread was switched out and
/// woken). A wait that found events ready returns in a few microseconds.
const SLEPT: Duration = Duration::from_micros(20);

/// How long a worker has run without sleeping, and when it is time to look at its
/// siblings (see the module docs). Pure: the caller passes the time in.
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

    /// The worker is about to wait for events at `now`. `true`: it has been busy past
    /// its limit, time to look at its siblings (and then [`restart`](Self::restart)).
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

    /// The worker is busy at `now` (a request begins). `true` as for
    /// [`waiting`](Self::waiting).
    pub(crate) fn busy(&mut self, now: Instant) -> bool {
        self.overdue(now)
    }

    /// The worker has looked at its siblings (and given the CPU away if one waited) and
    /// runs on at `now`: a new spell begins.
    pub(crate) fn restart(&mut self, now: Instant) {
        self.since = Some(now);
    }

    fn overdue(&mut self, now: Instant) -> bool {
        let since = *self.since.get_or_insert(now);
        !self.limit.is_zero() && now.saturating_duration_since(since) >= self.limit
    }
}

/// When each worker last ran, as nanoseconds after a shared epoch: one cache line per
/// worker, written only by that worker.
#[derive(Debug)]
pub(crate) struct Heartbeats {
    epoch: Instant,
    beats: Box<[Beat]>,
}

#[derive(Debug, Default)]
#[repr(align(64))]
struct Beat(AtomicU64);

impl Heartbeats {
    /// Heartbeats of `workers` workers, all as of now.
    pub(crate) fn new(workers: usize) -> Arc<Self> {
        Arc::new(Self {
            epoch: Instant::now(),
            beats: (0..workers).map(|_| Beat::default()).collect(),
        })
    }

    fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    fn beat(&self, worker: usize, now: Instant) {
        self.beats[worker]
            .0
            .store(self.nanos(now), Ordering::Relaxed);
    }

    /// Whether a worker other than `me` has not run for `limit` up to `now`.
    fn a_sibling_waits(&self, me: usize, now: Instant, limit: Duration) -> bool {
        let now = self.nanos(now);
        let limit = u64::try_from(limit.as_nanos()).unwrap_or(u64::MAX);
        self.beats
            .iter()
            .enumerate()
            .any(|(i, beat)| i != me && now.saturating_sub(beat.0.load(Ordering::Relaxed)) >= limit)
    }
}

/// A worker thread's part: its spell, and where it and its siblings beat.
struct GivingWay {
    spell: BusySpell,
    heartbeats: Arc<Heartbeats>,
    me: usize,
}

thread_local! {
    /// The current worker's part; `None` on threads that are not workers, or whose
    /// workers do not give way.
    static WORKER: RefCell<Option<GivingWay>> = const { RefCell::new(None) };
}

/// Make the current thread worker `me` (0-based) of those beating in `heartbeats`,
/// giving way after `limit` of busy time; `None`: a thread that never gives way.
pub(crate) fn enter(worker: Option<(Arc<Heartbeats>, usize, Duration)>) {
    let part = worker
        .filter(|(_, _, limit)| !limit.is_zero())
        .map(|(heartbeats, me, limit)| GivingWay {
            spell: BusySpell::new(limit),
            heartbeats,
            me,
        });
    WORKER.with(|w| *w.borrow_mut() = part);
}

/// The runtime's hook before it waits for events (`on_thread_park`). Returns whether it
/// gave the CPU away.
pub(crate) fn before_wait() -> bool {
    step(Instant::now, BusySpell::waiting)
}

/// The runtime's hook after a wait for events (`on_thread_unpark`).
pub(crate) fn after_wait() {
    WORKER.with(|w| {
        if let Some(part) = w.borrow_mut().as_mut() {
            let now = Instant::now();
            part.heartbeats.beat(part.me, now);
            part.spell.woken(now);
        }
    });
}

/// A request begins on this thread at `now`. Returns whether it gave the CPU away.
pub(crate) fn request_begins(now: Instant) -> bool {
    step(|| now, BusySpell::busy)
}

/// `now` is read only on a thread that gives way: a lone worker's runtime parks
/// without a clock read.
fn step(now: impl FnOnce() -> Instant, overdue: fn(&mut BusySpell, Instant) -> bool) -> bool {
    WORKER.with(|w| {
        let mut w = w.borrow_mut();
        let Some(part) = w.as_mut() else {
            return false;
        };
        let now = now();
        part.heartbeats.beat(part.me, now);
        if !overdue(&mut part.spell, now) {
            return false;
        }
        let waits = part
            .heartbeats
            .a_sibling_waits(part.me, now, part.spell.limit);
        // Given way or not, the next look is a limit from now: after a yield, the
        // moment the CPU came back.
        let resumed = if waits {
            yield_cpu();
            Instant::now()
        } else {
            now
        };
        part.spell.restart(resumed);
        waits
    })
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
        enter(Some((Heartbeats::new(2), 0, Duration::ZERO)));
        assert!(!before_wait());
        enter(None);
    }

    #[test]
    fn a_sibling_waits_when_it_has_not_beaten_for_the_limit() {
        let heartbeats = Heartbeats::new(3);
        let t0 = heartbeats.epoch;
        for worker in 0..3 {
            heartbeats.beat(worker, t0 + us(1_000));
        }
        // Worker 0 at 1.4 ms: everyone ran 400 µs ago.
        assert!(!heartbeats.a_sibling_waits(0, t0 + us(1_400), us(500)));
        // Workers 0 and 1 run on; worker 2 last ran at 1 ms.
        heartbeats.beat(1, t0 + us(1_500));
        assert!(heartbeats.a_sibling_waits(0, t0 + us(1_500), us(500)));
        assert!(heartbeats.a_sibling_waits(1, t0 + us(1_500), us(500)));
        // Worker 2 itself only looks at the others.
        heartbeats.beat(0, t0 + us(1_500));
        assert!(!heartbeats.a_sibling_waits(2, t0 + us(1_600), us(500)));
    }

    #[test]
    fn a_busy_worker_gives_way_only_to_a_sibling_that_has_not_run() {
        let heartbeats = Heartbeats::new(2);
        // Limits of milliseconds, so that a preempted test thread does not change the answers.
        enter(Some((heartbeats.clone(), 0, Duration::from_millis(20))));
        assert!(!before_wait());
        after_wait();
        spin(Duration::from_millis(30));
        // The sibling (worker 1) beat just now: it runs elsewhere, no need to yield.
        heartbeats.beat(1, Instant::now());
        assert!(!request_begins(Instant::now()));
        // The look restarted the spell: a limit later, and the sibling silent since.
        spin(Duration::from_millis(30));
        assert!(request_begins(Instant::now()));
        // Given way: the spell restarted again.
        assert!(!request_begins(Instant::now()));
        enter(None);
    }

    fn spin(time: Duration) {
        let until = Instant::now() + time;
        while Instant::now() < until {
            std::hint::spin_loop();
        }
    }
}
