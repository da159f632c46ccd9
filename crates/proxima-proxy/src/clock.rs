//! A cheaper clock for bookkeeping that only needs milliseconds.
//!
//! A request reads the clock about nine times. The reads that measure (a pod's response
//! time, the request's duration) need the precise monotonic clock; those that note when
//! a connection last moved bytes or fell idle, for timeouts of seconds, do not. On
//! Linux, [`coarse_now`] reads `CLOCK_MONOTONIC_COARSE`: the same clock as
//! [`Instant::now`], as of the kernel's last tick (up to 4 ms behind at 250 Hz), read
//! from the vDSO without touching the TSC: 3 ns against 19 ns for the precise clock on
//! the benchmark machine. A timeout measured from a coarse reading may end that much
//! early, never late. Elsewhere it is [`Instant::now`].

use std::sync::LazyLock;
use std::time::{Duration, Instant};

/// The most [`coarse_now`] lags the precise clock: a tick at 100 Hz, the slowest
/// kernel tick rate.
#[cfg(test)]
pub(crate) const MAX_LAG: Duration = Duration::from_millis(10);

/// Now, to within the kernel's tick (see the module docs); never after [`Instant::now`].
pub(crate) fn coarse_now() -> Instant {
    #[cfg(target_os = "linux")]
    {
        // An `Instant` cannot be built from a raw reading: the coarse reading is taken
        // as an offset from a moment read on both clocks.
        static ANCHOR: LazyLock<(Instant, Duration)> =
            LazyLock::new(|| (Instant::now(), monotonic(libc::CLOCK_MONOTONIC)));
        let (at, reading) = *ANCHOR;
        at + monotonic(libc::CLOCK_MONOTONIC_COARSE).saturating_sub(reading)
    }
    #[cfg(not(target_os = "linux"))]
    {
        Instant::now()
    }
}

#[cfg(target_os = "linux")]
fn monotonic(clock: libc::clockid_t) -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid, writable timespec; both clocks exist on every Linux
    // this runs on (2.6.32+), so the call cannot fail.
    unsafe { libc::clock_gettime(clock, &mut now) };
    Duration::new(
        u64::try_from(now.tv_sec).unwrap_or(0),
        u32::try_from(now.tv_nsec).unwrap_or(0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_coarse_clock_follows_the_precise_one_within_a_tick() {
        for _ in 0..50 {
            let before = Instant::now();
            let coarse = coarse_now();
            let after = Instant::now();
            // Never ahead of the precise clock; at most a tick behind it.
            assert!(coarse <= after, "{coarse:?} after {after:?}");
            assert!(
                before.saturating_duration_since(coarse) <= MAX_LAG,
                "{coarse:?} too far behind {before:?}"
            );
            std::thread::sleep(Duration::from_micros(300));
        }
    }
}
