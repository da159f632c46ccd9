//! The proxy's own scheduling lag, measured with a ticker.
//!
//! A delay that hits every pod at once (the host is busy, the runtime was blocked, the
//! process was descheduled) is a delay of the proxy, not a verdict on the pods: the
//! response headers may have been waiting in the socket while the proxy could not run.
//! A task wakes up every [`PERIOD`]; how much later than asked it actually runs is the
//! lag. Lags above [`THRESHOLD`] are stalls and add up into a running total, so that an
//! attempt can ask how much of its own duration the proxy spent stalled
//! (`total(end) - total(start)`). A stall still going on when someone asks (the ticker
//! itself has not run yet) is included, so the answer does not depend on which task the
//! runtime happens to wake first.
//!
//! The core uses the figure to set aside misses the stall alone could explain, and, for
//! a few seconds after a stall, to keep the last member of a pool in it
//! (`Router::note_stall`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use proxima_core::Router;

/// How often the ticker asks to wake up.
pub(crate) const PERIOD: Duration = Duration::from_millis(10);
/// Lag below this is ordinary timer and scheduling noise, not a stall.
pub(crate) const THRESHOLD: Duration = Duration::from_millis(15);

/// Running total of measured stalls (see the module docs).
#[derive(Debug)]
pub(crate) struct StallMeter {
    epoch: Instant,
    /// Sum of the stalls measured so far, ns.
    total: AtomicU64,
    /// When the ticker last ran, ns after `epoch`.
    last_tick: AtomicU64,
}

impl StallMeter {
    pub(crate) fn new() -> Self {
        Self {
            epoch: Instant::now(),
            total: AtomicU64::new(0),
            last_tick: AtomicU64::new(0),
        }
    }

    fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Stall time up to `now`, including a stall in progress.
    pub(crate) fn total(&self, now: Instant) -> Duration {
        let last = self.last_tick.load(Ordering::Relaxed);
        let overdue = self
            .nanos(now)
            .saturating_sub(last)
            .saturating_sub(as_nanos(PERIOD));
        let pending = if overdue > as_nanos(THRESHOLD) {
            overdue
        } else {
            0
        };
        Duration::from_nanos(self.total.load(Ordering::Relaxed) + pending)
    }

    /// The ticker ran at `now`, `lag` later than it asked to. Returns whether that lag
    /// was a stall.
    fn tick(&self, now: Instant, lag: Duration) -> bool {
        let stall = lag > THRESHOLD;
        if stall {
            self.total.fetch_add(as_nanos(lag), Ordering::Relaxed);
        }
        self.last_tick.store(self.nanos(now), Ordering::Relaxed);
        stall
    }

    /// Start the ticker on the current tokio runtime (if any); it stops when the meter
    /// is dropped.
    pub(crate) fn spawn(meter: &Arc<Self>, router: &Arc<Router>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        meter.tick(Instant::now(), Duration::ZERO);
        let meter: Weak<Self> = Arc::downgrade(meter);
        let router = Arc::downgrade(router);
        runtime.spawn(async move {
            let mut asked = Instant::now() + PERIOD;
            loop {
                tokio::time::sleep_until(asked.into()).await;
                let now = Instant::now();
                let (Some(meter), Some(router)) = (meter.upgrade(), router.upgrade()) else {
                    return;
                };
                if meter.tick(now, now.saturating_duration_since(asked)) {
                    router.note_stall(now);
                }
                asked = now + PERIOD;
            }
        });
    }
}

fn as_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stalls_add_up_and_an_ongoing_one_counts() {
        let meter = StallMeter::new();
        let t0 = meter.epoch;
        meter.tick(t0, Duration::ZERO);
        assert_eq!(meter.total(t0 + Duration::from_millis(12)), Duration::ZERO);
        // Small lags are noise.
        assert!(!meter.tick(t0 + Duration::from_millis(15), Duration::from_millis(5)));
        assert_eq!(meter.total(t0 + Duration::from_millis(15)), Duration::ZERO);
        // The ticker has not run for 115 ms: 105 ms of stall so far.
        let during = meter.total(t0 + Duration::from_millis(130));
        assert_eq!(during, Duration::from_millis(105));
        // It runs, 110 ms late: the total holds that, and no pending part remains.
        assert!(meter.tick(t0 + Duration::from_millis(135), Duration::from_millis(110)));
        assert_eq!(
            meter.total(t0 + Duration::from_millis(136)),
            Duration::from_millis(110)
        );
    }
}
