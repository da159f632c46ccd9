//! Per-endpoint response-time estimator.
//!
//! QEdgeProxy (§III-A, event 3 "QoS measurement updates") keeps the QoS pool current
//! from the response times the proxy itself measures; §III-B leaves the predictor open.
//! We use the simplest predictor that answers the pool's actual question, "will this pod
//! meet an SLO of X at percentile P?", exactly and cheaply:
//!
//! * a **sliding window** of the last `window` measurements (time to response headers,
//!   microsecond resolution, so fast backends never round to zero), each stamped with the
//!   time it was taken; measurements older than `max_age` are ignored, so a pod that went
//!   quiet is judged on what is still relevant;
//! * the SLO test counts fresh samples within the SLO: the pod meets "X at P" iff at
//!   least `P%` of them are ≤ X. That is the same as "the nearest-rank P-quantile ≤ X",
//!   but it needs no sort; the quantile itself is computed only for display and for
//!   ranking endpoints when the pool is empty;
//! * an **EWMA** of the same samples (α = 0.3 per sample) shows the trend in
//!   `/debug/pools` and breaks ties between equally good fallbacks.
//!
//! Failed requests (a failure status such as a fast `500`, a reset, a timeout, a refused
//! connection) are stored as misses: they count against the SLO whatever the threshold.
//! An attempt still unanswered when the SLO passed is stored at once as the least it is
//! known to take, the SLO and a microsecond (a miss at once, not one timeout later);
//! when its outcome comes, that placeholder takes the real time, or becomes a
//! failure. So a pod that answers 13 ms against a 12 ms SLO is predicted at 13 ms, not
//! as a failure: the empty-pool fallback tells "misses now and then by a little" from
//! "fails". Reading never changes the estimator; `now` is always passed in.
//!
//! Cost: the pool re-judges an endpoint after every measurement, so the estimator keeps
//! its window's values sorted as they come and go (an insertion and a removal in a
//! sorted array of `window` values). The window itself is in time order: a sample
//! stamped earlier than the newest one already in it (concurrent recorders finishing a
//! few microseconds apart take the endpoint's lock in either order) is stamped with that
//! newest time instead, so its first sample is its oldest and the stale ones are a
//! prefix. While every sample is fresh, which is the steady state, a prediction is then
//! two binary searches and one array read; only a window holding stale samples is
//! filtered and ranked sample by sample. Both ways give the same numbers.
//!
//! Memory: a thousand endpoints keep a thousand windows, so a sample is 8 bytes and its
//! sorted copy 4: its time in milliseconds after the estimator's `base`, and its value
//! in microseconds up to `MAX_MICROS` (71 minutes; longer responses count as that
//! long, and `latency-slo` is at most 60 minutes). Millisecond stamps make an age exact
//! to within a millisecond, which is nothing against age limits of seconds. When a stamp
//! would pass `u32::MAX` (49 days after `base`), the base moves forward and every stamp
//! with it; a sample more than 24 days older than the newest then counts as 24 days
//! old. A sample's position in the sequence of samples is implied by its place in the
//! window, the window's storage grows with the samples instead of being reserved up
//! front, and the buffer for ranking a window with stale samples is one per thread,
//! not one per endpoint. The samples and their sorted copy share one allocation
//! ([`Window`]): at 50,000 idle endpoints, each with the one sample of its first probe,
//! two allocations were 80 bytes an endpoint with the allocator's headers, one is 32.

use std::cell::RefCell;
use std::time::{Duration, Instant};

/// Weight of the newest sample in the EWMA.
const EWMA_ALPHA: f64 = 0.3;

/// Marker value of a failed request: larger than any SLO.
const MISS_US: u32 = u32::MAX;

/// The longest response time (and SLO) told apart, in microseconds: 71 minutes.
pub(crate) const MAX_MICROS: u32 = MISS_US - 1;

/// Where a stamp lands after the base moves forward (see the module docs): half the
/// range, so that the newer half of the range is free again.
const REBASED_STAMP: u32 = u32::MAX / 2;

/// What an overdue attempt is stored as until its outcome comes (see the module docs):
/// a miss of `slo_us` by the least amount.
fn overdue_placeholder(slo_us: u32) -> u32 {
    slo_us.saturating_add(1).min(MAX_MICROS)
}

/// `d` in microseconds, saturating at [`MAX_MICROS`].
fn micros_of(d: Duration) -> u32 {
    u32::try_from(d.as_micros()).map_or(MAX_MICROS, |us| us.min(MAX_MICROS))
}

thread_local! {
    /// Fresh values of a window that also holds stale ones, ranked (see `predict`).
    static SCRATCH: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
}

/// A time as milliseconds after the estimator's `base` (see the module docs); computed
/// wide, stored as `u32`.
type Stamp = i64;

#[derive(Clone, Copy, Debug, PartialEq)]
struct Sample {
    at: u32,
    micros: u32,
}

/// The samples of a window, oldest first (their stamps ascending; see the module docs),
/// and their values sorted, in one allocation of `3 × cap` words: the samples' stamps,
/// then their values, both a ring of `cap` slots starting at `head`; then the values
/// sorted ascending in the first `len` of the last `cap` slots.
#[derive(Clone, Debug, Default)]
struct Window {
    buf: Box<[u32]>,
    head: u32,
    len: u32,
}

impl Window {
    fn cap(&self) -> usize {
        self.buf.len() / 3
    }

    fn len(&self) -> usize {
        self.len as usize
    }

    /// The ring slot of the `i`-th oldest sample.
    fn slot(&self, i: usize) -> usize {
        let slot = self.head as usize + i;
        let cap = self.cap();
        if slot >= cap {
            slot - cap
        } else {
            slot
        }
    }

    /// The `i`-th oldest sample (`i < len`).
    fn get(&self, i: usize) -> Sample {
        let slot = self.slot(i);
        Sample {
            at: self.buf[slot],
            micros: self.buf[self.cap() + slot],
        }
    }

    fn front(&self) -> Option<Sample> {
        (self.len > 0).then(|| self.get(0))
    }

    fn back(&self) -> Option<Sample> {
        self.len().checked_sub(1).map(|i| self.get(i))
    }

    /// The samples from the `first`-th oldest on, oldest first.
    fn iter_from(&self, first: usize) -> impl Iterator<Item = Sample> + '_ {
        (first..self.len()).map(|i| self.get(i))
    }

    /// The first index whose sample fails `pred`, which holds for a prefix.
    fn partition_point(&self, pred: impl Fn(Sample) -> bool) -> usize {
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if pred(self.get(mid)) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// The values, ascending.
    fn sorted(&self) -> &[u32] {
        let start = 2 * self.cap();
        &self.buf[start..start + self.len()]
    }

    /// Put `micros` into the sorted values (one more than `len` of them after).
    fn insert_sorted(&mut self, micros: u32) {
        let start = 2 * self.cap();
        let len = self.len();
        let values = &mut self.buf[start..start + len + 1];
        let at = values[..len].partition_point(|&v| v < micros);
        values.copy_within(at..len, at + 1);
        values[at] = micros;
    }

    /// Take one `micros` out of the sorted values (one fewer than `len` of them after).
    fn remove_sorted(&mut self, micros: u32) {
        let start = 2 * self.cap();
        let len = self.len();
        let values = &mut self.buf[start..start + len];
        let at = values.partition_point(|&v| v < micros);
        values.copy_within(at + 1..len, at);
    }

    /// Append `sample` as the newest; the storage grows (doubling, up to `limit`
    /// samples) when full.
    fn push_back(&mut self, sample: Sample, limit: usize) {
        if self.len() == self.cap() {
            self.grow(limit);
        }
        let slot = self.slot(self.len());
        let cap = self.cap();
        self.buf[slot] = sample.at;
        self.buf[cap + slot] = sample.micros;
        self.insert_sorted(sample.micros);
        self.len += 1;
    }

    /// Room for more samples: twice as many, at least 2 (a 32-byte allocation holds
    /// them, the least the allocator gives), at most `limit` but always one more.
    #[cold]
    fn grow(&mut self, limit: usize) {
        let len = self.len();
        let cap = (self.cap() * 2).clamp(2, limit.max(2)).max(len + 1);
        let mut buf = vec![0; 3 * cap].into_boxed_slice();
        for (i, sample) in self.iter_from(0).enumerate() {
            buf[i] = sample.at;
            buf[cap + i] = sample.micros;
        }
        buf[2 * cap..2 * cap + len].copy_from_slice(self.sorted());
        self.buf = buf;
        self.head = 0;
    }

    fn pop_front(&mut self) -> Option<Sample> {
        let sample = self.front()?;
        self.remove_sorted(sample.micros);
        self.head = u32::try_from(self.slot(1)).unwrap_or(0);
        self.len -= 1;
        Some(sample)
    }

    /// Give the `i`-th oldest sample the value `micros` (`i < len`).
    fn set_micros(&mut self, i: usize, micros: u32) {
        let old = self.get(i).micros;
        self.remove_sorted(old);
        self.len -= 1;
        self.insert_sorted(micros);
        self.len += 1;
        let slot = self.slot(i);
        let cap = self.cap();
        self.buf[cap + slot] = micros;
    }

    /// Give the `i`-th oldest sample the stamp `at` (`i < len`).
    fn set_at(&mut self, i: usize, at: u32) {
        let slot = self.slot(i);
        self.buf[slot] = at;
    }

    /// Keep only the samples for which `keep` holds, in their order (the storage stays).
    fn retain(&mut self, keep: impl Fn(Sample) -> bool) {
        let kept: Vec<Sample> = self.iter_from(0).filter(|&s| keep(s)).collect();
        self.head = 0;
        self.len = 0;
        let cap = self.cap();
        for sample in kept {
            self.push_back(sample, cap);
        }
    }
}

/// Sliding-window latency estimator for one endpoint. See the module docs.
#[derive(Clone, Debug)]
pub struct LatencyEstimator {
    /// How many samples the window keeps, at most (settings allow 4,096).
    window: u32,
    samples: Window,
    /// The origin of the samples' [`Stamp`]s: the time of the first sample pushed into
    /// an empty window, moved forward when stamps would overflow.
    base: Option<Instant>,
    /// NaN before the first response: an `Option<f64>` would take 8 bytes more of
    /// every endpoint's state (see `EndpointState`'s size).
    ewma_us: f64,
    total: u64,
}

/// What the estimator predicts for an SLO at `now`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Prediction {
    /// Fresh samples the prediction rests on.
    pub samples: usize,
    /// Fresh samples within the SLO.
    pub within_slo: usize,
    /// Nearest-rank quantile at the SLO percentile; `None` without fresh samples,
    /// `Some(Duration::MAX)` when that rank is a failed request.
    pub quantile: Option<Duration>,
    /// Trend of recent samples (failures excluded); `None` before the first success.
    pub ewma: Option<Duration>,
}

impl Prediction {
    /// Whether the fresh samples meet the SLO at the percentile (`None` without samples).
    pub fn meets(&self, percentile: f64) -> Option<bool> {
        (self.samples > 0).then(|| meets_share(self.within_slo, self.samples, percentile))
    }

    /// Whether the fresh samples show, at `confidence` percent, that the pod misses the
    /// SLO at the percentile (see [`likely_misses`]).
    pub fn likely_misses(&self, percentile: f64, confidence: f64) -> bool {
        likely_misses(self.within_slo, self.samples, percentile, confidence)
    }
}

/// Whether `samples` answers of which `within` met the SLO are evidence, at `confidence`
/// percent, that a pod misses the SLO at `percentile`.
///
/// A pod that meets "p95" still misses one answer in twenty, and a window of 64 holds 4
/// or more such misses a quarter of the time, at random: judged on the share alone (the
/// point estimate), a pod that meets its SLO is evicted every few hundred requests, and
/// host jitter that makes every pod miss at once empties the pool. QEdgeProxy (§III-B)
/// keeps in the pool the instances "likely to satisfy the QoS requirements"; we evict
/// only when the misses are unlikely for a pod that meets it: a one-sided binomial test,
/// `P(X ≥ misses) < 1 − confidence` for `X ~ Binomial(samples, 1 − percentile)`. At 95%
/// confidence and p95 that is 7 misses of 64 (4 on the share alone), 3 of 10, 2 of 3;
/// at p99, 3 of 64 instead of 1. With `confidence` 0, or a percentile of 100, the share
/// alone decides.
pub fn likely_misses(within: usize, samples: usize, percentile: f64, confidence: f64) -> bool {
    if samples == 0 || meets_share(within, samples, percentile) {
        return false;
    }
    let miss_rate = 1.0 - percentile / 100.0;
    if confidence <= 0.0 || miss_rate <= 0.0 {
        return true;
    }
    binomial_tail(samples, miss_rate, samples - within) < 1.0 - confidence / 100.0
}

/// `P(X ≥ k)` for `X ~ Binomial(n, p)`, `0 < p < 1`, summed in logs (no underflow for
/// the 4096-sample windows the settings allow).
fn binomial_tail(n: usize, p: f64, k: usize) -> f64 {
    let (ln_p, ln_q) = (p.ln(), (1.0 - p).ln());
    // ln C(n, k), then each next term from the one before.
    let ln_choose: f64 = (1..=k).map(|i| ((n - k + i) as f64 / i as f64).ln()).sum();
    let mut ln_term = ln_choose + k as f64 * ln_p + (n - k) as f64 * ln_q;
    let mut tail = 0.0;
    for j in k..=n {
        let term = ln_term.exp();
        tail += term;
        // Past the mean the terms shrink geometrically: stop when they stop counting.
        if (j as f64) > n as f64 * p && term < tail * 1e-12 {
            break;
        }
        ln_term += ((n - j) as f64 / (j + 1) as f64).ln() + ln_p - ln_q;
    }
    tail.min(1.0)
}

fn meets_share(within: usize, samples: usize, percentile: f64) -> bool {
    // within / samples >= percentile / 100, without rounding surprises at 100%.
    (within as f64) * 100.0 >= percentile * samples as f64 - 1e-9
}

impl LatencyEstimator {
    /// An empty estimator keeping the last `window` samples (at least 1).
    pub fn new(window: usize) -> Self {
        Self {
            window: window_size(window),
            samples: Window::default(),
            base: None,
            ewma_us: f64::NAN,
            total: 0,
        }
    }

    /// How many samples the window keeps.
    pub fn window(&self) -> usize {
        self.window as usize
    }

    /// Change the window size, keeping the newest samples.
    pub fn resize(&mut self, window: usize) {
        self.window = window_size(window);
        self.keep_newest(self.window());
    }

    /// Record a response-time measurement taken at `now`.
    pub fn record(&mut self, now: Instant, latency: Duration) {
        let micros = micros_of(latency);
        self.push(now, micros);
        self.update_ewma(micros);
    }

    fn update_ewma(&mut self, micros: u32) {
        let x = f64::from(micros);
        let prev = self.ewma_us;
        self.ewma_us = if prev.is_nan() {
            x
        } else {
            prev + EWMA_ALPHA * (x - prev)
        };
    }

    /// Record a failed request (reset, timeout, 5xx from a broken connection).
    pub fn record_failure(&mut self, now: Instant) {
        self.push(now, MISS_US);
    }

    /// Record an attempt still unanswered at `now`, when `slo` has passed: a miss, stored
    /// as the least it will take until [`Self::resolve_overdue`] says how it ended.
    pub fn record_overdue(&mut self, now: Instant, slo: Duration) {
        self.push(now, overdue_placeholder(micros_of(slo)));
    }

    /// An attempt recorded overdue ended: its placeholder (the oldest one still in the
    /// window) takes its response time, or becomes a failure (`None`). Returns whether a
    /// placeholder was there to take it; the window may have moved past it.
    pub fn resolve_overdue(&mut self, slo: Duration, latency: Option<Duration>) -> bool {
        let placeholder = overdue_placeholder(micros_of(slo));
        let Some(index) = self
            .samples
            .iter_from(0)
            .position(|s| s.micros == placeholder)
        else {
            return false;
        };
        let micros = latency.map_or(MISS_US, |l| micros_of(l).max(placeholder));
        self.samples.set_micros(index, micros);
        if let Some(latency) = latency {
            self.update_ewma(micros_of(latency));
        }
        true
    }

    /// `at` as a [`Stamp`] (0 while there is no sample yet).
    fn stamp(&self, at: Instant) -> Stamp {
        let Some(base) = self.base else { return 0 };
        let millis = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        match at.checked_duration_since(base) {
            Some(after) => millis(after),
            None => -millis(base.duration_since(at)),
        }
    }

    /// Whether a sample taken at `at` is at most `max_age` old at `now` (a stamp).
    fn is_fresh(at: u32, now: Stamp, max_age: Duration) -> bool {
        let age_ms = u128::try_from(i128::from(now) - i128::from(at)).unwrap_or(0);
        age_ms * 1_000_000 <= max_age.as_nanos()
    }

    fn push(&mut self, at: Instant, micros: u32) {
        if self.samples.len() == self.window() {
            self.pop_oldest();
        }
        if self.samples.len() == 0 {
            self.base = Some(at);
        }
        let newest = self.samples.back().map_or(0, |s| s.at);
        let mut stamp = self.stamp(at).max(Stamp::from(newest));
        if stamp > Stamp::from(u32::MAX) {
            stamp = self.rebase(stamp);
        }
        let at = u32::try_from(stamp).unwrap_or(u32::MAX);
        self.samples.push_back(Sample { at, micros }, self.window());
        self.total += 1;
    }

    /// Move `base` forward so that `stamp` becomes [`REBASED_STAMP`], and every sample's
    /// stamp with it (at least 0); returns the new stamp.
    #[cold]
    fn rebase(&mut self, stamp: Stamp) -> Stamp {
        let shift = stamp - Stamp::from(REBASED_STAMP);
        if let Some(base) = &mut self.base {
            *base += Duration::from_millis(shift.unsigned_abs());
        }
        for i in 0..self.samples.len() {
            let moved = (Stamp::from(self.samples.get(i).at) - shift).max(0);
            self.samples.set_at(i, u32::try_from(moved).unwrap_or(0));
        }
        Stamp::from(REBASED_STAMP)
    }

    /// Drop the sample pushed first.
    fn pop_oldest(&mut self) {
        self.samples.pop_front();
    }

    /// Forget every sample except the newest `keep`.
    pub fn keep_newest(&mut self, keep: usize) {
        while self.samples.len() > keep {
            self.pop_oldest();
        }
    }

    /// Forget the misses of `slo` taken before `before`, keeping every sample within it
    /// (used on re-admission: the misses that evicted a pod are superseded by the
    /// probes that show its recovery, while its good history stays as evidence, so one
    /// ordinary outlier right after its return does not evict it again).
    pub fn forget_misses_before(&mut self, before: Instant, slo: Duration) {
        let slo_us = micros_of(slo);
        let before = self.stamp(before);
        // Rare (a re-admission): the window is rebuilt from the samples kept, still in
        // time order.
        self.samples
            .retain(|s| Stamp::from(s.at) >= before || s.micros <= slo_us);
    }

    /// Whether every sample in the window is fresh at `now`.
    fn all_fresh(&self, now: Instant, max_age: Duration) -> bool {
        let now = self.stamp(now);
        self.samples
            .front()
            .is_none_or(|s| Self::is_fresh(s.at, now, max_age))
    }

    /// Measurements recorded over the estimator's life.
    pub fn total(&self) -> u64 {
        self.total
    }

    fn fresh(&self, now: Instant, max_age: Duration) -> impl Iterator<Item = Sample> + '_ {
        let now = self.stamp(now);
        // The stamps ascend, so the stale samples are a prefix.
        let first = self
            .samples
            .partition_point(|s| !Self::is_fresh(s.at, now, max_age));
        self.samples.iter_from(first)
    }

    /// The prediction for `slo` at `percentile` from samples no older than `max_age`.
    ///
    /// A window holding stale samples is ranked in a buffer kept per thread, so that
    /// the measurement path does not allocate once that buffer has grown to the window.
    pub fn predict(
        &self,
        now: Instant,
        max_age: Duration,
        slo: Duration,
        percentile: f64,
    ) -> Prediction {
        let slo_us = micros_of(slo);
        let (samples, within_slo, quantile) = if self.all_fresh(now, max_age) {
            let sorted = self.samples.sorted();
            let quantile = rank_index(sorted.len(), percentile).map(|i| sorted[i]);
            (
                sorted.len(),
                sorted.partition_point(|&v| v <= slo_us),
                quantile,
            )
        } else {
            let rank = |scratch: &mut Vec<u32>| {
                scratch.clear();
                scratch.extend(self.fresh(now, max_age).map(|s| s.micros));
                let within_slo = scratch.iter().filter(|&&v| v <= slo_us).count();
                (scratch.len(), within_slo, nearest_rank(scratch, percentile))
            };
            // A buffer of its own when the thread's is gone (the thread is exiting) or
            // in use.
            SCRATCH
                .try_with(|cell| cell.try_borrow_mut().ok().map(|mut s| rank(&mut s)))
                .ok()
                .flatten()
                .unwrap_or_else(|| rank(&mut Vec::new()))
        };
        let quantile = quantile.map(|us| {
            if us == MISS_US {
                Duration::MAX
            } else {
                Duration::from_micros(u64::from(us))
            }
        });
        Prediction {
            samples,
            within_slo,
            quantile,
            ewma: self.ewma(),
        }
    }

    /// Fresh samples, and how many of them meet `slo` (no allocation: used on the
    /// measurement path).
    pub fn count_within(&self, now: Instant, max_age: Duration, slo: Duration) -> (usize, usize) {
        let slo_us = micros_of(slo);
        if self.all_fresh(now, max_age) {
            let sorted = self.samples.sorted();
            return (sorted.len(), sorted.partition_point(|&v| v <= slo_us));
        }
        self.fresh(now, max_age).fold((0, 0), |(n, ok), s| {
            (n + 1, ok + usize::from(s.micros <= slo_us))
        })
    }

    /// Exponentially weighted mean of the response times recorded (failures are not),
    /// weight 0.3 for the newest, regardless of age; `None` before the first response.
    pub fn ewma(&self) -> Option<Duration> {
        let us = self.ewma_us;
        (!us.is_nan()).then(|| Duration::from_micros(us.round() as u64))
    }

    /// The latencies of the newest `n` samples, newest last; `None` for a miss.
    pub fn newest(&self, n: usize) -> impl Iterator<Item = Option<Duration>> + '_ {
        let skip = self.samples.len().saturating_sub(n);
        self.samples
            .iter_from(skip)
            .map(|s| (s.micros != MISS_US).then(|| Duration::from_micros(u64::from(s.micros))))
    }
}

/// `window` as the estimator keeps it: at least 1, at most `u32::MAX`.
fn window_size(window: usize) -> u32 {
    u32::try_from(window.max(1)).unwrap_or(u32::MAX)
}

/// Nearest-rank percentile: the smallest value with at least `p%` of values ≤ it.
fn nearest_rank(values: &mut [u32], percentile: f64) -> Option<u32> {
    let index = rank_index(values.len(), percentile)?;
    let (_, v, _) = values.select_nth_unstable(index);
    Some(*v)
}

/// The 0-based position of the nearest-rank `percentile` among `n` sorted values.
fn rank_index(n: usize, percentile: f64) -> Option<usize> {
    if n == 0 {
        return None;
    }
    let rank = ((percentile / 100.0) * n as f64).ceil() as usize;
    Some(rank.clamp(1, n) - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn microsecond_resolution_is_kept() {
        let t0 = Instant::now();
        let mut e = LatencyEstimator::new(8);
        e.record(t0, Duration::from_micros(180));
        let p = e.predict(t0, ms(1000), Duration::from_micros(200), 95.0);
        assert_eq!(p.quantile, Some(Duration::from_micros(180)));
        assert_eq!(p.meets(95.0), Some(true));
        let p = e.predict(t0, ms(1000), Duration::from_micros(100), 95.0);
        assert_eq!(p.meets(95.0), Some(false));
    }

    #[test]
    fn percentile_is_nearest_rank() {
        let t0 = Instant::now();
        let mut e = LatencyEstimator::new(100);
        for i in 1..=100 {
            e.record(t0, ms(i));
        }
        let p = e.predict(t0, ms(1000), ms(95), 95.0);
        assert_eq!(p.quantile, Some(ms(95)));
        assert_eq!(p.meets(95.0), Some(true));
        let p = e.predict(t0, ms(1000), ms(94), 95.0);
        assert_eq!(p.meets(95.0), Some(false));
        assert_eq!(e.predict(t0, ms(1000), ms(50), 50.0).quantile, Some(ms(50)));
        assert_eq!(
            e.predict(t0, ms(1000), ms(50), 100.0).quantile,
            Some(ms(100))
        );
    }

    #[test]
    fn an_overdue_attempt_is_a_miss_until_its_answer_gives_it_a_time() {
        let t0 = Instant::now();
        let mut e = LatencyEstimator::new(8);
        let slo = ms(12);
        for _ in 0..3 {
            e.record(t0, ms(8));
        }
        e.record_overdue(t0, slo);
        let p = e.predict(t0, ms(1000), slo, 75.0);
        assert_eq!((p.samples, p.within_slo), (4, 3), "a miss at once");
        assert_eq!(p.quantile, Some(ms(8)));
        // The highest rank is the placeholder: the least it will take.
        let p = e.predict(t0, ms(1000), slo, 100.0);
        assert_eq!(p.quantile, Some(Duration::from_micros(12_001)));
        // Answered in 14 ms: still a miss, now with its time.
        assert!(e.resolve_overdue(slo, Some(ms(14))));
        let p = e.predict(t0, ms(1000), slo, 100.0);
        assert_eq!((p.within_slo, p.quantile), (3, Some(ms(14))));
        // Nothing left to resolve.
        assert!(!e.resolve_overdue(slo, Some(ms(14))));
        // One that ends in a failure is a failure.
        e.record_overdue(t0, slo);
        assert!(e.resolve_overdue(slo, None));
        assert_eq!(
            e.predict(t0, ms(1000), slo, 100.0).quantile,
            Some(Duration::MAX)
        );
        assert_eq!(e.predict(t0, ms(1000), slo, 100.0).within_slo, 3);
    }

    #[test]
    fn misses_must_be_more_than_chance_to_count_against_a_pod() {
        // p95, confidence 95%: the thresholds the docs give.
        let evicts_at =
            |n: usize, p: f64, c: f64| (0..=n).find(|&misses| likely_misses(n - misses, n, p, c));
        assert_eq!(evicts_at(64, 95.0, 95.0), Some(7));
        assert_eq!(evicts_at(10, 95.0, 95.0), Some(3));
        assert_eq!(evicts_at(3, 95.0, 95.0), Some(2));
        assert_eq!(evicts_at(64, 99.0, 95.0), Some(3));
        // Confidence 0: the share alone.
        assert_eq!(evicts_at(64, 95.0, 0.0), Some(4));
        assert_eq!(evicts_at(64, 99.0, 0.0), Some(1));
        // p100 allows no miss at any confidence.
        assert_eq!(evicts_at(64, 100.0, 95.0), Some(1));
        // Large windows do not underflow; the margin shrinks as evidence grows.
        assert_eq!(evicts_at(4096, 95.0, 95.0), Some(229));
        assert!(binomial_tail(4096, 0.5, 2048) > 0.49);
    }

    #[test]
    fn window_slides_and_old_samples_expire() {
        let t0 = Instant::now();
        let mut e = LatencyEstimator::new(4);
        for i in 0..4 {
            e.record(t0, ms(200 + i));
        }
        for _ in 0..4 {
            e.record(t0 + ms(10), ms(5));
        }
        assert_eq!(e.count_within(t0 + ms(10), ms(1000), ms(10)), (4, 4));
        // Nothing is fresh a minute later.
        assert_eq!(e.count_within(t0 + ms(61_000), ms(30_000), ms(10)), (0, 0));
        assert_eq!(e.total(), 8);
    }

    #[test]
    fn failures_are_misses() {
        let t0 = Instant::now();
        let mut e = LatencyEstimator::new(4);
        e.record(t0, ms(1));
        e.record_failure(t0);
        let p = e.predict(t0, ms(1000), ms(1000), 100.0);
        assert_eq!(p.samples, 2);
        assert_eq!(p.within_slo, 1);
        assert_eq!(p.quantile, Some(Duration::MAX));
        assert_eq!(p.ewma, Some(ms(1)));
    }

    #[test]
    fn forgetting_old_misses_keeps_good_history_and_new_samples() {
        let t0 = Instant::now();
        let mut e = LatencyEstimator::new(8);
        e.record(t0, ms(5));
        e.record(t0, ms(500));
        e.record_failure(t0);
        e.record(t0 + ms(10), ms(6));
        e.record(t0 + ms(20), ms(700));
        e.forget_misses_before(t0 + ms(20), ms(100));
        assert_eq!(e.count_within(t0 + ms(20), ms(1000), ms(100)), (3, 2));
    }

    #[test]
    fn a_sample_recorded_out_of_order_ages_with_the_newest_one() {
        let t0 = Instant::now() + ms(1000);
        let mut e = LatencyEstimator::new(4);
        e.record(t0, ms(1));
        // A concurrent recorder that took the lock second, with an earlier time.
        e.record(t0 - ms(40), ms(2));
        // Stamped as taken at t0: 15 ms old, not 55, so still fresh at a 50 ms age limit.
        assert_eq!(e.count_within(t0 + ms(15), ms(50), ms(10)), (2, 2));
        assert_eq!(e.count_within(t0 + ms(51), ms(50), ms(10)), (0, 0));
        // And the window is in time order again for what comes later.
        e.record(t0 + ms(60), ms(3));
        assert_eq!(e.count_within(t0 + ms(60), ms(50), ms(10)), (1, 1));
    }

    #[test]
    fn stamps_stay_exact_across_a_move_of_the_base() {
        let day = Duration::from_secs(86_400);
        let t0 = Instant::now();
        let mut e = LatencyEstimator::new(8);
        e.record(t0, ms(1));
        e.record(t0 + 30 * day, ms(2));
        e.record(t0 + 30 * day + ms(900), ms(3));
        // 50 days after the first sample: past the 49 days a stamp can hold.
        let late = t0 + 50 * day;
        e.record(late, ms(4));
        e.record(late + ms(5), ms(5));
        // The last two are 1 s apart from each other's ages as before the move...
        assert_eq!(e.count_within(late + ms(1000), ms(1000), ms(10)), (2, 2));
        assert_eq!(e.count_within(late + ms(1006), ms(1000), ms(10)), (0, 0));
        // ...and the 30-day-old ones keep their 20-day age and the gap between them.
        let from_day_30 = (20 * day).saturating_sub(ms(900));
        assert_eq!(e.count_within(late, from_day_30, ms(10)), (3, 3));
        assert_eq!(e.count_within(late, from_day_30 - ms(1), ms(10)), (2, 2));
        // The first, older than the 24 days kept apart, counts as 24.8 days old.
        assert_eq!(e.count_within(late, 25 * day, ms(10)), (5, 5));
        // A second move keeps the order and the values.
        e.record(late + 40 * day, ms(6));
        assert_eq!(e.count_within(late + 40 * day, ms(0), ms(10)), (1, 1));
        let values: Vec<_> = e.newest(8).collect();
        assert_eq!(values, (1..=6).map(|v| Some(ms(v))).collect::<Vec<_>>());
    }

    #[test]
    fn responses_and_slos_beyond_the_range_saturate() {
        let t0 = Instant::now();
        let mut e = LatencyEstimator::new(4);
        e.record(t0, Duration::from_secs(5 * 3600));
        let p = e.predict(t0, ms(1000), Duration::from_secs(3600), 50.0);
        assert_eq!(p.within_slo, 0);
        assert_eq!(
            p.quantile,
            Some(Duration::from_micros(u64::from(MAX_MICROS)))
        );
        e.record_failure(t0);
        let p = e.predict(t0, ms(1000), Duration::MAX, 100.0);
        assert_eq!(
            (p.samples, p.within_slo, p.quantile),
            (2, 1, Some(Duration::MAX))
        );
    }

    #[test]
    fn reading_does_not_change_state() {
        let t0 = Instant::now();
        let mut e = LatencyEstimator::new(4);
        e.record(t0, ms(3));
        let a = e.predict(t0, ms(100), ms(5), 95.0);
        let b = e.predict(t0, ms(100), ms(5), 95.0);
        assert_eq!(a, b);
    }

    /// The prediction written out: filter the fresh samples, sort, rank.
    fn brute_force(
        samples: &[(Instant, u32)],
        now: Instant,
        max_age: Duration,
        slo: Duration,
        percentile: f64,
    ) -> (usize, usize, Option<Duration>) {
        let mut fresh: Vec<u32> = samples
            .iter()
            .filter(|(at, _)| now.saturating_duration_since(*at) <= max_age)
            .map(|&(_, v)| v)
            .collect();
        fresh.sort_unstable();
        let slo_us = micros_of(slo);
        let within = fresh.iter().filter(|&&v| v <= slo_us).count();
        let quantile = rank_index(fresh.len(), percentile).map(|i| match fresh[i] {
            MISS_US => Duration::MAX,
            us => Duration::from_micros(u64::from(us)),
        });
        (fresh.len(), within, quantile)
    }

    #[test]
    fn a_sample_takes_eight_bytes_and_nothing_is_reserved_before_the_first() {
        // A thousand endpoints keep a thousand windows (see the module docs).
        assert_eq!(std::mem::size_of::<Sample>(), 8);
        let e = LatencyEstimator::new(64);
        assert_eq!(e.samples.buf.len(), 0);
    }

    #[test]
    fn incremental_prediction_equals_the_prediction_over_the_window() {
        use rand::rngs::SmallRng;
        use rand::{Rng, SeedableRng};
        let t0 = Instant::now();
        let mut rng = SmallRng::seed_from_u64(3);
        for _ in 0..200 {
            let window = rng.gen_range(1..40);
            let mut e = LatencyEstimator::new(window);
            // What the window should hold: (at, micros), oldest first, each stamped no
            // earlier than the newest before it (see the module docs).
            let mut model: Vec<(Instant, u32)> = Vec::new();
            let mut clock = t0 + Duration::from_secs(1);
            for _ in 0..rng.gen_range(1..200) {
                // Mostly forward, sometimes a little back (concurrent recorders).
                clock += Duration::from_millis(rng.gen_range(0..400));
                let at = clock - Duration::from_millis(rng.gen_range(0..3) * 50);
                let stamped = model.last().map_or(at, |&(newest, _)| at.max(newest));
                match rng.gen_range(0..20) {
                    0 => {
                        e.record_failure(at);
                        model.push((stamped, MISS_US));
                    }
                    1 => {
                        let keep = rng.gen_range(0..window + 1);
                        e.keep_newest(keep);
                        let drop = model.len().saturating_sub(keep);
                        model.drain(..drop);
                        continue;
                    }
                    2 => {
                        let slo = ms(rng.gen_range(1..100));
                        e.forget_misses_before(at, slo);
                        let slo_us = micros_of(slo);
                        model.retain(|&(t, v)| t >= at || v <= slo_us);
                        continue;
                    }
                    _ => {
                        let micros = rng.gen_range(0..100_000u32);
                        e.record(at, Duration::from_micros(u64::from(micros)));
                        model.push((stamped, micros));
                    }
                }
                if model.len() > window {
                    model.remove(0);
                }
                let now = clock + Duration::from_millis(rng.gen_range(0..3000));
                let max_age = ms(rng.gen_range(1..5000));
                let slo = ms(rng.gen_range(1..100));
                let percentile = [50.0, 90.0, 95.0, 99.0, 100.0][rng.gen_range(0..5)];
                let p = e.predict(now, max_age, slo, percentile);
                let expected = brute_force(&model, now, max_age, slo, percentile);
                assert_eq!((p.samples, p.within_slo, p.quantile), expected);
                assert_eq!(e.count_within(now, max_age, slo), (expected.0, expected.1));
            }
        }
    }
}
