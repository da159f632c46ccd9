//! A per-service retry budget: retries may add at most a fixed share of the service's
//! requests, plus a small floor, so that an outage does not multiply the load on the
//! pods by `1 + retries`.
//!
//! This is the rule of linkerd's retry budgets (after Finagle's `RetryBudget`): over a
//! sliding window of `ttl`, the retries sent may not exceed
//! `ratio × requests + min_per_second × ttl`. linkerd's defaults are `ratio` 0.2,
//! `min_per_second` 10 and `ttl` 10 s; Proxima uses the same (`retry-budget-ratio`,
//! `retry-budget-min-per-second`, `retry-budget-ttl`). With every pod failing, a service
//! receiving `n` requests in one window therefore sends at most
//! `n × (1 + ratio) + min_per_second × ttl` attempts in it, instead of `n × (1 + retries)`.
//! The floor lets a quiet service (a request every few seconds) still retry.
//!
//! Counting is per second slot in a ring of `ceil(ttl / 1 s)` slots: a slot older than
//! `ttl` is forgotten as a whole, so the window is `ttl` rounded up to whole seconds. The
//! budget is pure: the time is passed in.
//!
//! Counting a request is on every request's path, so it takes no lock: each slot keeps
//! its second and its count packed in one atomic word, and one compare-and-swap both
//! moves the slot to a new second and counts in it. Retries are rare and their check
//! ("is there budget left?") must not be raced by another retry, so deciding a retry
//! takes a mutex; the request counts it reads meanwhile can only grow, which only
//! grants more.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde::Serialize;

/// The budget's parameters (service settings `retry-budget-*`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct RetryBudgetParams {
    /// Retries allowed per request, on top of the floor (`retry-budget-ratio`, 0.2).
    pub ratio: f64,
    /// Retries allowed per second whatever the request rate
    /// (`retry-budget-min-per-second`, 10).
    pub min_per_second: u32,
    /// How long a request or retry counts (`retry-budget-ttl`, 10 s).
    pub ttl: Duration,
}

impl Default for RetryBudgetParams {
    fn default() -> Self {
        Self {
            ratio: 0.2,
            min_per_second: 10,
            ttl: Duration::from_secs(10),
        }
    }
}

/// Requests and retries counted in one second, each as a [`Count`] word.
#[derive(Debug, Default)]
struct Slot {
    requests: AtomicU64,
    retries: AtomicU64,
}

/// A count tagged with the second it belongs to, packed into one `u64`: the second
/// (after the budget's epoch) in the high 32 bits, the count in the low 32 bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Count {
    second: u32,
    count: u32,
}

impl Count {
    fn load(word: &AtomicU64) -> Self {
        let bits = word.load(Ordering::Relaxed);
        Self {
            second: (bits >> 32) as u32,
            count: bits as u32,
        }
    }

    fn bits(self) -> u64 {
        (u64::from(self.second) << 32) | u64::from(self.count)
    }

    /// Count one more in `second`: a slot still holding an older second starts over.
    /// (A slot already holding a later second, which only happens when the clock handed
    /// in runs backwards by a whole window, keeps it and counts there.)
    fn add(word: &AtomicU64, second: u32) {
        let mut current = word.load(Ordering::Relaxed);
        loop {
            let held = Count {
                second: (current >> 32) as u32,
                count: current as u32,
            };
            let next = if held.second < second {
                Count { second, count: 1 }
            } else {
                Count {
                    second: held.second,
                    count: held.count.saturating_add(1),
                }
            };
            match word.compare_exchange_weak(
                current,
                next.bits(),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(actual) => current = actual,
            }
        }
    }

    /// This count, if its second lies in the `len`-second window ending at `second`.
    fn within(self, second: u32, len: u32) -> u64 {
        if self.second <= second && second - self.second < len {
            u64::from(self.count)
        } else {
            0
        }
    }
}

/// A service's retry budget (see the module docs). Share it between requests; it
/// tracks its own window.
#[derive(Debug)]
pub struct RetryBudget {
    params: RetryBudgetParams,
    epoch: Instant,
    /// How many one-second slots the window has.
    len: u32,
    /// The slots, made at the first request counted: every service has a budget, and
    /// most of a large cluster's services may see no request for a long time (10 slots
    /// are 176 bytes with the allocator's header, 17 an idle endpoint at 10 pods a
    /// Service). Until then every count is 0.
    slots: OnceLock<Box<[Slot]>>,
    /// Serialises retry decisions (see the module docs).
    retry_decisions: Mutex<()>,
}

/// How much of the budget is in use, for `/debug/pools` and tests.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct RetryBudgetUse {
    /// Requests counted in the current window.
    pub requests: u64,
    /// Retries sent in the current window.
    pub retries: u64,
    /// Retries the window allows in all.
    pub allowed: u64,
}

impl RetryBudget {
    /// A budget counting from `epoch` (any instant at or before the first use).
    pub fn new(params: RetryBudgetParams, epoch: Instant) -> Self {
        let seconds = params.ttl.as_secs() + u64::from(params.ttl.subsec_nanos() > 0);
        let len = seconds.clamp(1, u64::from(u32::MAX)) as u32;
        Self {
            params,
            epoch,
            len,
            slots: OnceLock::new(),
            retry_decisions: Mutex::new(()),
        }
    }

    /// The parameters the budget was made with.
    pub fn params(&self) -> &RetryBudgetParams {
        &self.params
    }

    /// Whole seconds from the epoch to `now` (saturating after 136 years).
    fn second(&self, now: Instant) -> u32 {
        u32::try_from(now.saturating_duration_since(self.epoch).as_secs()).unwrap_or(u32::MAX)
    }

    /// The slot of `second`, to count in (the slots are made at the first count).
    fn slot(&self, second: u32) -> &Slot {
        let slots = self
            .slots
            .get_or_init(|| (0..self.len).map(|_| Slot::default()).collect());
        &slots[(second % self.len) as usize]
    }

    /// Requests and retries counted in the window that ends at `second`.
    fn totals(&self, second: u32) -> (u64, u64) {
        let len = self.len;
        let slots = self.slots.get().map_or(&[][..], |s| &s[..]);
        slots.iter().fold((0, 0), |(q, r), s| {
            (
                q + Count::load(&s.requests).within(second, len),
                r + Count::load(&s.retries).within(second, len),
            )
        })
    }

    fn allowed(&self, requests: u64) -> u64 {
        let earned = (requests as f64 * self.params.ratio).floor() as u64;
        earned + u64::from(self.params.min_per_second) * u64::from(self.len)
    }

    /// Count a client request (once, whatever its retries). Lock-free.
    pub fn record_request(&self, now: Instant) {
        let second = self.second(now);
        Count::add(&self.slot(second).requests, second);
    }

    /// Ask to send one retry at `now`: `true` (and counted) while the window's retries
    /// stay within `ratio × requests + min_per_second × ttl`, `false` once spent.
    pub fn try_retry(&self, now: Instant) -> bool {
        let second = self.second(now);
        let _one_decision_at_a_time = self
            .retry_decisions
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let (requests, retries) = self.totals(second);
        if retries >= self.allowed(requests) {
            return false;
        }
        Count::add(&self.slot(second).retries, second);
        true
    }

    /// The budget's use in the window ending at `now`.
    pub fn usage(&self, now: Instant) -> RetryBudgetUse {
        let (requests, retries) = self.totals(self.second(now));
        RetryBudgetUse {
            requests,
            retries,
            allowed: self.allowed(requests),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(ratio: f64, min_per_second: u32, ttl_secs: u64) -> (RetryBudget, Instant) {
        let t0 = Instant::now();
        let params = RetryBudgetParams {
            ratio,
            min_per_second,
            ttl: Duration::from_secs(ttl_secs),
        };
        (RetryBudget::new(params, t0), t0)
    }

    /// Retries granted when asking `asked` times at `now`.
    fn grant(budget: &RetryBudget, now: Instant, asked: usize) -> usize {
        (0..asked).filter(|_| budget.try_retry(now)).count()
    }

    #[test]
    fn retries_are_a_share_of_requests_plus_the_floor() {
        let (b, t0) = budget(0.2, 1, 10);
        for _ in 0..100 {
            b.record_request(t0);
        }
        // 20% of 100 plus a floor of 1/s over 10 s.
        assert_eq!(grant(&b, t0, 1000), 30);
        assert_eq!(
            b.usage(t0),
            RetryBudgetUse {
                requests: 100,
                retries: 30,
                allowed: 30
            }
        );
        // Each further request earns a fifth of a retry.
        for _ in 0..10 {
            b.record_request(t0);
        }
        assert_eq!(grant(&b, t0, 10), 2);
    }

    #[test]
    fn the_floor_lets_a_quiet_service_retry() {
        let (b, t0) = budget(0.2, 10, 10);
        b.record_request(t0);
        assert_eq!(grant(&b, t0, 500), 100, "10/s over the 10 s window");
        let (b, t0) = budget(0.2, 0, 10);
        b.record_request(t0);
        assert_eq!(
            grant(&b, t0, 5),
            0,
            "no floor, one request earns no whole retry"
        );
    }

    #[test]
    fn requests_and_retries_expire_after_the_ttl() {
        let (b, t0) = budget(0.5, 0, 2);
        for _ in 0..10 {
            b.record_request(t0);
        }
        assert_eq!(grant(&b, t0, 10), 5);
        // Still inside the 2 s window: spent.
        assert_eq!(grant(&b, t0 + Duration::from_millis(1500), 1), 0);
        // A second later the first second's requests and retries are gone.
        assert_eq!(
            grant(&b, t0 + Duration::from_secs(2), 1),
            0,
            "no requests left"
        );
        for _ in 0..4 {
            b.record_request(t0 + Duration::from_secs(2));
        }
        assert_eq!(grant(&b, t0 + Duration::from_secs(2), 10), 2);
        // Long idle: everything forgotten, the ring reused.
        let later = t0 + Duration::from_secs(3600);
        assert_eq!(
            b.usage(later),
            RetryBudgetUse {
                requests: 0,
                retries: 0,
                allowed: 0
            }
        );
        for _ in 0..2 {
            b.record_request(later);
        }
        assert_eq!(grant(&b, later, 5), 1);
    }

    #[test]
    fn a_steady_outage_stays_within_the_budget_over_many_windows() {
        // 50 requests a second for a minute, each wanting 2 retries.
        let (b, t0) = budget(0.2, 1, 10);
        let mut retries = 0;
        for ms in (0..60_000u64).step_by(20) {
            let now = t0 + Duration::from_millis(ms);
            b.record_request(now);
            retries += grant(&b, now, 2);
        }
        let requests = 3000.0;
        // Over 6 windows: 20% of the requests plus the floor of each window, at most.
        let bound = requests * 0.2 + 6.0 * 10.0;
        assert!(retries as f64 <= bound, "{retries} > {bound}");
        assert!(retries as f64 >= requests * 0.2 * 0.9, "{retries}");
    }

    #[test]
    fn a_fractional_ttl_rounds_up_to_whole_seconds_and_zero_is_one() {
        let t0 = Instant::now();
        let params = RetryBudgetParams {
            ratio: 0.0,
            min_per_second: 1,
            ttl: Duration::from_millis(1500),
        };
        let b = RetryBudget::new(params, t0);
        assert_eq!(b.usage(t0).allowed, 2);
        let b = RetryBudget::new(
            RetryBudgetParams {
                ttl: Duration::ZERO,
                ..params
            },
            t0,
        );
        assert_eq!(b.usage(t0).allowed, 1);
        // A time before the epoch counts as the epoch, never panics.
        let early = RetryBudget::new(params, t0 + Duration::from_secs(5));
        early.record_request(t0);
        assert!(early.try_retry(t0));
    }

    #[test]
    fn concurrent_requests_are_all_counted_without_a_lock() {
        let (b, t0) = budget(0.5, 0, 10);
        let threads = 4;
        let each = 10_000;
        std::thread::scope(|scope| {
            for k in 0..threads {
                let b = &b;
                scope.spawn(move || {
                    for i in 0..each {
                        // Spread over two seconds so that slots also move on concurrently.
                        let at = t0 + Duration::from_millis(((i + k) % 2) as u64 * 1000);
                        b.record_request(at);
                    }
                });
            }
        });
        let use_ = b.usage(t0 + Duration::from_secs(1));
        assert_eq!(use_.requests, (threads * each) as u64);
        assert_eq!(use_.allowed, (threads * each) as u64 / 2);
    }

    #[test]
    fn a_slot_left_behind_by_a_backwards_clock_keeps_its_later_second() {
        let (b, t0) = budget(1.0, 0, 2);
        b.record_request(t0 + Duration::from_secs(4));
        // Second 2 shares the slot of second 4: counted there, not lost.
        b.record_request(t0 + Duration::from_secs(2));
        assert_eq!(b.usage(t0 + Duration::from_secs(4)).requests, 2);
    }
}
