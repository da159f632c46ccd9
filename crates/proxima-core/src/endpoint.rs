//! Mutable per-endpoint state: measurements, QoS-pool admission, connection cooldown,
//! probe schedule and in-flight count.
//!
//! Admission follows QEdgeProxy (§III-A, event 3; §III-B): the pod's own measured
//! response times decide whether it is in its service's QoS pool. A pod leaves for
//! latency when its fresh samples are evidence that it misses the SLO percentile, not
//! merely a share under it by chance (`estimator::likely_misses`,
//! `qos-pool-verdict-confidence`): the paper keeps the instances "likely to satisfy the
//! QoS requirements", and a point estimate evicts pods that meet p95 every few hundred
//! requests, and all of them at once when the host jitters. Around that test:
//!
//! * **Failures are misses.** A response whose status is in the service's
//!   `failure-status` set (default `5xx`), a reset, a timeout or a refused connection is
//!   stored as a miss, however fast it came: a pod that answers `500` in 2 ms does not
//!   meet an SLO. An attempt still unanswered when the SLO has passed is stored as a miss
//!   at that moment (`EndpointState::observe_overdue`), and its eventual outcome gives
//!   that miss its time (or makes it a failure) rather than adding a second sample; an
//!   attempt the client abandoned after the SLO is a miss too.
//! * **A pod that answers nothing leaves at once.** The test above weighs independent
//!   answers; a pod that hangs (stopped, deadlocked, its node frozen) gives none, and
//!   holds at most as many misses as it has callers waiting, which a full window of
//!   earlier answers outweighs. So an attempt still unanswered after
//!   [`unanswered_limit`] (twice the SLO, at least 250 ms), when the pod has answered
//!   nothing at all since that attempt was sent, evicts it (`EvictionCause::Unanswered`).
//!   Host jitter delays answers by tens of milliseconds and they still come; a pod
//!   silent for that long while a request waits is not noise.
//! * **Consecutive failures eject at once**, next to the latency test, as Envoy's outlier
//!   detection (`consecutive_5xx`, 5 by default) and linkerd's failure accrual (7
//!   failures) do: `qos-pool-eject-after` failures in a row take the pod out without
//!   waiting for the window's verdict. The service caps how many pods may be out for
//!   this at one time (`qos-pool-max-ejection-percent`, Envoy's `max_ejection_percent`),
//!   so that a fault common to every pod (a shared dependency, a poisonous request) does
//!   not empty the pool through this fast path; the latency test itself is not capped.
//! * **Quiet services are judged.** A pod with fewer than `min_samples` fresh samples
//!   is warming and admitted on the initial estimate, but it leaves as soon as every
//!   one of its fresh samples misses, and after warming for `max_age` it is judged on
//!   whatever fresh samples it has.
//! * **New pods are probed before they cost a request.** Every endpoint never measured
//!   gets one background probe at once. One added to a service whose pods are already
//!   measured stays out of the pool until it has been measured (Envoy's
//!   `ignore_new_hosts_until_first_hc`); the pods of a new service are tried at once on
//!   the initial estimate, probes or not, so that nothing waits.
//! * **Re-admission without flapping.** Evicted pods are probed: quickly (every
//!   `probe-interval`) while probes succeed, with doubling backoff while they fail. A
//!   pod evicted again within `max_age` of its return waits twice as long before its
//!   first probe each time (up to [`FLAP_BACKOFF_MAX`], linkerd's 60 s); each `max_age`
//!   it stays healthy halves that again. While its service's pool is empty, requests
//!   that fall back bring the probe forward (`Route::hurry_probes`), and one good probe
//!   (or answer) re-admits: `readmit_after` good probes in a row guard the pool's
//!   members from a pod that answered a few probes well by chance, but with no member
//!   every request goes to a pod expected to miss, and the pod that just met the SLO is
//!   the best evidence there is (n50 seed 1: a near pod back from 10 s of 503s took
//!   770 ms and 10 requests, all missed at a pod 60 ms away, to return;
//!   docs/results/issue-30.md). On return the misses that evicted it are dropped but
//!   its good history is kept, and it ramps up over `qos-pool-slow-start` (Envoy's
//!   `slow_start_config`) instead of taking a burst.
//! * **Stalls are not verdicts.** A response that misses the SLO only by the time the
//!   proxy itself was stalled (its scheduling lag, measured by the data plane) is set
//!   aside: neither good nor bad evidence. See `Observation::stall`. The pool's last
//!   member is not evicted right after a stall; it is judged on its evidence once the
//!   stall is out of memory, traffic or not.
//!
//! One [`EndpointState`] lives as long as the endpoint's id stays in its service, across
//! any number of discovery updates. The hot path reads only atomics (`attempts`,
//! `admitted`, `cooldown_until`); the mutex is taken once per finished request.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::estimator::LatencyEstimator;
use crate::settings::ServiceSettings;

/// Decay time of the peak EWMA (linkerd's default) and the sample a failure counts as.
const PEAK_EWMA_TAU: Duration = Duration::from_secs(10);
const PEAK_EWMA_FAILURE: Duration = Duration::from_secs(1);

/// First and longest cooldown after a connection failure.
const COOLDOWN_BASE: Duration = Duration::from_millis(250);
const COOLDOWN_MAX: Duration = Duration::from_secs(30);

/// Longest wait before the first probe of a pod that keeps being evicted soon after its
/// return (linkerd's failure-accrual backoff tops out at 60 s).
pub const FLAP_BACKOFF_MAX: Duration = Duration::from_secs(60);

/// Share of its full weight a re-admitted pod starts its slow start with (Envoy's
/// `min_weight_percent` default, 10%).
const SLOW_START_MIN_WEIGHT: f64 = 0.1;

/// Bits of [`EndpointState`]'s `attempts` word that count attempts in flight: up to
/// 16.7 million at once to one endpoint, far beyond what one proxy's sockets and memory
/// allow (each attempt holds a connection or stream and a `Picked`).
const IN_FLIGHT_BITS: u32 = 24;
const IN_FLIGHT_MASK: u64 = (1 << IN_FLIGHT_BITS) - 1;
/// One attempt started, in the `attempts` word.
const ONE_STARTED: u64 = 1 << IN_FLIGHT_BITS;

/// [`EndpointState::within_permille`] of an endpoint without fresh samples.
pub const UNKNOWN_SHARE: u32 = u32::MAX;

/// Fixed-point unit of the spreading counter: one pick at full weight.
pub(crate) const PICK_UNIT: u64 = 1000;

/// Why an endpoint is out of the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum EvictionCause {
    /// Its fresh samples (failures included) miss the SLO at the percentile.
    Latency,
    /// `qos-pool-eject-after` consecutive failures.
    ConsecutiveFailures,
    /// An attempt went [`unanswered_limit`] without an answer while the pod answered
    /// nothing else either.
    Unanswered,
}

/// Shortest wait for an answer that, with no other answer from the pod meanwhile,
/// makes a pod count as hung (see the module docs).
const UNANSWERED_FLOOR: Duration = Duration::from_millis(250);

/// How long an attempt may go unanswered, with the pod answering nothing else, before
/// the pod counts as hung and leaves the pool: twice the SLO, at least
/// [`UNANSWERED_FLOOR`] (see the module docs).
pub fn unanswered_limit(settings: &ServiceSettings) -> Duration {
    settings.latency_slo.saturating_mul(2).max(UNANSWERED_FLOOR)
}

/// Whether an endpoint is in its service's QoS pool, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum Admission {
    /// Fewer fresh samples than `min_samples`: assumed to meet the SLO (the initial
    /// estimate) and tried, so that it gets measured.
    Warming,
    /// Its fresh samples meet the SLO.
    Admitted,
    /// It missed the SLO; it gets only background probes until `readmit_after`
    /// consecutive probes meet the SLO.
    Evicted {
        /// When it was evicted.
        #[serde(skip)]
        since: Instant,
        /// Probes in a row that met the SLO since; `readmit_after` of them re-admit it.
        consecutive_good: u32,
        /// Why it was evicted.
        cause: EvictionCause,
    },
}

impl Admission {
    /// Whether this state keeps the endpoint in the pool (warming or admitted).
    pub fn in_pool(&self) -> bool {
        !matches!(self, Admission::Evicted { .. })
    }
}

/// A change of pool membership, reported so that callers can count and log it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolChange {
    /// It left the pool.
    Evicted,
    /// It came back into the pool.
    Readmitted,
}

/// How a forwarded request (or probe) ended, as far as routing cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Response headers with `status` arrived after `latency`; a status in the service's
    /// `failure-status` set makes it a failure.
    Answered {
        /// From sending the request to the response headers.
        latency: Duration,
        /// The response's status code.
        status: u16,
    },
    /// A gRPC call's answer with `grpc-status` `code` (in the headers of a Trailers-Only
    /// answer, or in the trailers that followed them at once), its headers after
    /// `latency`; a code in the service's `grpc-failure-codes` makes it a failure.
    GrpcAnswered {
        /// From sending the request to the response headers.
        latency: Duration,
        /// The `grpc-status` code.
        code: u8,
    },
    /// Response headers arrived after `latency` with a status that is not a failure
    /// (for callers that have already classified it).
    Response {
        /// From sending the request to the response headers.
        latency: Duration,
    },
    /// The connection could not be opened: nothing reached the pod.
    ConnectFailed,
    /// Sent, but no response: reset, protocol error or timeout.
    Failed,
}

/// What a failed answer said: an HTTP status, or a gRPC call's `grpc-status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailedAnswer {
    /// An HTTP status in the service's `failure-status`.
    Status(u16),
    /// A `grpc-status` in the service's `grpc-failure-codes`.
    Grpc(u8),
}

impl std::fmt::Display for FailedAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FailedAnswer::Status(status) => write!(f, "status {status}"),
            FailedAnswer::Grpc(code) => write!(f, "grpc-status {code}"),
        }
    }
}

#[derive(Debug)]
pub(crate) struct Stats {
    pub(crate) estimator: LatencyEstimator,
    pub(crate) admission: Admission,
    /// Consecutive connection failures, for the cooldown backoff.
    pub(crate) connect_failures: u32,
    /// Probe schedule while evicted.
    probe_interval_nanos: u64,
    /// When it is next due for a probe.
    pub(crate) next_probe: Moment,
    pub(crate) probe_in_flight: bool,
    /// Failures in a row (any kind), and the status of the last failed answer.
    pub(crate) consecutive_failures: u32,
    pub(crate) last_failure_status: Option<FailedAnswer>,
    /// Whether the last ejection for consecutive failures was refused by the cap.
    pub(crate) ejection_capped: bool,
    /// Whether the last latency eviction was withheld because it would have emptied the
    /// pool during a measured stall of the proxy.
    pub(crate) kept_during_stall: bool,
    /// Evictions soon after a return, decayed while healthy (the first-probe backoff).
    pub(crate) flaps: u32,
    pub(crate) readmitted_at: Moment,
    /// Since when it has been warming (judged on the initial estimate).
    pub(crate) warming_since: Moment,
    /// When its last response headers came, whatever their status (see
    /// [`EvictionCause::Unanswered`]).
    pub(crate) last_answer: Moment,
}

/// An optional instant in [`Stats`]: nanoseconds after the endpoint state's `epoch`,
/// plus one, with 0 for none (an instant before the epoch counts as the epoch). 8 bytes
/// where an `Option<Instant>` takes 16: four of them are 32 bytes of every endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Moment(u64);

impl Moment {
    pub(crate) const NONE: Moment = Moment(0);

    /// `at`, counted from `epoch`.
    pub(crate) fn at(epoch: Instant, at: Instant) -> Self {
        let nanos = at.saturating_duration_since(epoch).as_nanos();
        Moment(
            u64::try_from(nanos)
                .unwrap_or(u64::MAX - 1)
                .min(u64::MAX - 1)
                + 1,
        )
    }

    /// The instant, given the `epoch` it was counted from.
    pub(crate) fn get(self, epoch: Instant) -> Option<Instant> {
        let nanos = self.0.checked_sub(1)?;
        Some(epoch + Duration::from_nanos(nanos))
    }
}

/// `d` in nanoseconds, saturating (584 years).
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Stats {
    /// The wait between probes while evicted (doubling while they fail). Kept as
    /// nanoseconds, 8 bytes where a `Duration` takes 16.
    pub(crate) fn probe_interval(&self) -> Duration {
        Duration::from_nanos(self.probe_interval_nanos)
    }

    fn set_probe_interval(&mut self, interval: Duration) {
        self.probe_interval_nanos = nanos(interval);
    }
}

/// Mutable state of one endpoint (see the module docs).
///
/// Laid out for the pick path: the atomics a pick reads or bumps (in-flight count,
/// cooldown, spreading counter, slow start, attempt count, peak EWMA) come first, 64
/// bytes together with the flags and the failure count, so that comparing two
/// endpoints of a large service touches at most two lines of each rather than several.
///
/// Not aligned to a cache line (it was, with `align(64)`): in its `Arc` that cost 48
/// bytes of padding after the two reference counts and an aligned allocation, whose
/// split-off pieces the allocator kept as holes between the states, about 100 bytes an
/// endpoint at 50,000 idle endpoints (issue 29's ≤ 1 KB goal). What the alignment bought
/// is small: a pick reads two endpoints' first 64 bytes, which now span two lines of
/// each for most endpoints, and all of them are hot in the cache of a busy service
/// anyway; false sharing needs two cores writing two different endpoints whose states
/// are neighbours in memory, while the pick's writes (`attempts`, `picks`) already go
/// to the endpoints every worker picks, which is true sharing the alignment never
/// prevented. The `routing` benchmark (`pick/.*/1000`) is the check.
#[derive(Debug)]
#[repr(C)]
pub struct EndpointState {
    /// Attempts in flight (the low [`IN_FLIGHT_BITS`] bits) and attempts started (the
    /// rest), in one word so that starting an attempt is one atomic add, not two.
    attempts: AtomicU64,
    admitted: AtomicBool,
    /// Whether the admission is `Warming` (no verdict from measurements yet).
    warming: AtomicBool,
    /// Set when it (re)joins the pool: its counter is brought level with the pool's.
    needs_baseline: AtomicBool,
    /// Out of the pool for consecutive failures (counted against the service's cap).
    failure_ejected: AtomicBool,
    /// Whether any outcome (traffic or probe) has ever been stored for it.
    measured: AtomicBool,
    /// Added to a service already measured: out of the pool until first measured.
    held_until_probed: AtomicBool,
    /// A neighbour reported it failing after this proxy's last answer from it: out of
    /// the pool until an answer of its own meets the SLO (see `neighbours.rs`).
    suspect: AtomicBool,
    /// In the pool, and its last answer missed the SLO or failed: under a strategy that
    /// passes such a member over (the slack spread: its peak EWMA holds the miss for
    /// tens of seconds), probed every `probe-interval` until an answer meets the SLO or
    /// the misses take it out; without the probes its verdict, and the failure news
    /// neighbours learn from (`neighbours.rs`), would wait for traffic it no longer
    /// gets. A probe's miss enters its window; its hit only ends the recheck. Under the
    /// even spread the member keeps its share, its traffic judges it, and it is not
    /// probed (probes of in-pool members there cost 1.8 points of reach on n20 seed 2:
    /// their unloaded hits kept pods slow under load in the pool).
    recheck: AtomicBool,
    /// Cooldown end as nanoseconds after `epoch`; 0 when not cooling down.
    cooldown_until: AtomicU64,
    /// Spreading counter: [`PICK_UNIT`] / weight per pick (stride scheduling), so that
    /// two-choice picks on it give every pool member an even share, and a member in
    /// slow start a proportionally smaller one.
    picks: AtomicU64,
    /// Start of the slow start after re-admission (ns after `epoch`; 0: none).
    ramp_start: AtomicU64,
    /// Peak EWMA of response times (f64 seconds as bits; 0 = no sample) and when it was
    /// last updated (ns after `epoch`), for the `p2c-ewma` strategy.
    peak_ewma_bits: AtomicU64,
    peak_ewma_at: AtomicU64,
    failures: AtomicU64,
    // Below: read on the measurement path and by the rarer branches of a pick.
    pub(crate) stats: Mutex<Stats>,
    /// Predicted SLO-percentile latency in µs (0 before any sample, `u32::MAX` when
    /// that rank is a failure), for fallback ranking. The samples are `u32` µs, so
    /// nothing is lost against a `u64`.
    score_micros: AtomicU32,
    /// Share of its fresh samples within the SLO, in thousandths ([`UNKNOWN_SHARE`]
    /// without any), as of the last measurement: what the empty-pool fallback ranks by.
    within_permille: AtomicU32,
    epoch: Instant,
}

// 248 bytes on 64-bit Linux (`Instant` 16 bytes, `Mutex` a 4-byte futex): with the
// `Arc`'s counts and the allocator's header, a 272-byte chunk for every endpoint. A
// field added or widened costs every endpoint as much, so it should be a decision, not
// an accident.
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
const _: () = assert!(std::mem::size_of::<EndpointState>() == 248);

/// What the caller knows about an outcome beyond the outcome itself.
pub(crate) struct Observation<'a> {
    pub(crate) from_probe: bool,
    /// An overdue miss was already stored for this attempt: store no second sample.
    pub(crate) late: bool,
    /// How long the proxy itself was stalled (scheduling lag it measured) while the
    /// attempt ran. A response that misses the SLO by no more than this is set aside:
    /// the stall may have delayed the moment the proxy noticed the headers by that much,
    /// so the sample cannot tell a slow pod from a slow proxy. Setting aside rather than
    /// subtracting the stall: if the stall fell while the pod was still working it
    /// delayed nothing, and subtracting it would turn a real miss into a hit.
    pub(crate) stall: Duration,
    /// Reserve one of the service's failure-ejection slots for this endpoint.
    pub(crate) may_eject: &'a dyn Fn() -> bool,
    /// Whether a latency eviction must be withheld because it would empty the pool
    /// during a measured stall.
    pub(crate) keep_in_pool: &'a dyn Fn() -> bool,
    /// Whether the service's pool has no member: then one good answer re-admits an
    /// evicted endpoint (see the module docs).
    pub(crate) pool_empty: &'a dyn Fn() -> bool,
}

impl Observation<'_> {
    pub(crate) fn plain(from_probe: bool) -> Observation<'static> {
        Observation {
            from_probe,
            late: false,
            stall: Duration::ZERO,
            may_eject: &|| true,
            keep_in_pool: &|| false,
            pool_empty: &|| false,
        }
    }
}

impl EndpointState {
    /// Fresh state for an endpoint of a service with `settings`; `epoch` is the instant its
    /// atomic timestamps count from (any instant not after the first use).
    pub fn new(settings: &ServiceSettings, epoch: Instant) -> Self {
        Self {
            stats: Mutex::new(Stats {
                estimator: LatencyEstimator::new(settings.qos_pool.window),
                admission: Admission::Warming,
                connect_failures: 0,
                probe_interval_nanos: nanos(settings.qos_pool.probe_interval),
                next_probe: Moment::NONE,
                probe_in_flight: false,
                consecutive_failures: 0,
                last_failure_status: None,
                ejection_capped: false,
                kept_during_stall: false,
                flaps: 0,
                readmitted_at: Moment::NONE,
                warming_since: Moment::NONE,
                last_answer: Moment::NONE,
            }),
            attempts: AtomicU64::new(0),
            admitted: AtomicBool::new(true),
            warming: AtomicBool::new(true),
            cooldown_until: AtomicU64::new(0),
            score_micros: AtomicU32::new(0),
            within_permille: AtomicU32::new(UNKNOWN_SHARE),
            peak_ewma_bits: AtomicU64::new(0),
            peak_ewma_at: AtomicU64::new(0),
            epoch,
            failures: AtomicU64::new(0),
            picks: AtomicU64::new(0),
            needs_baseline: AtomicBool::new(true),
            ramp_start: AtomicU64::new(0),
            failure_ejected: AtomicBool::new(false),
            measured: AtomicBool::new(false),
            held_until_probed: AtomicBool::new(false),
            suspect: AtomicBool::new(false),
            recheck: AtomicBool::new(false),
        }
    }

    /// Its share weight at `now`: 1, or less during the slow start after re-admission
    /// (linear from 10% to 100% over `slow_start`, as Envoy's default aggression 1.0).
    pub fn weight(&self, now: Instant, slow_start: Duration) -> f64 {
        let start = self.ramp_start.load(Ordering::Relaxed);
        if start == 0 || slow_start.is_zero() {
            return 1.0;
        }
        let elapsed = now
            .saturating_duration_since(self.epoch + Duration::from_nanos(start))
            .as_secs_f64();
        let share = elapsed / slow_start.as_secs_f64();
        if share >= 1.0 {
            1.0
        } else {
            share.max(SLOW_START_MIN_WEIGHT)
        }
    }

    /// The instant its atomic timestamps and [`Moment`]s count from.
    pub(crate) fn epoch(&self) -> Instant {
        self.epoch
    }

    /// The spreading counter (see the field docs).
    pub(crate) fn picks(&self) -> u64 {
        self.picks.load(Ordering::Relaxed)
    }

    /// Count one pick at `weight`.
    pub(crate) fn charge(&self, weight: f64) {
        // Full weight (no slow start) is the common case; skip the division there.
        let stride = if weight >= 1.0 {
            PICK_UNIT
        } else {
            (PICK_UNIT as f64 / weight.max(SLOW_START_MIN_WEIGHT)).round() as u64
        };
        self.picks.fetch_add(stride, Ordering::Relaxed);
    }

    /// Bring a member that just joined the pool level with the others (`baseline`: the
    /// lowest counter among them), so it neither starves nor takes a catch-up burst.
    pub(crate) fn join_baseline(&self, baseline: Option<u64>) {
        if self.needs_baseline.swap(false, Ordering::Relaxed) {
            if let Some(b) = baseline {
                self.picks.store(b, Ordering::Relaxed);
            }
        }
    }

    pub(crate) fn needs_baseline(&self) -> bool {
        self.needs_baseline.load(Ordering::Relaxed)
    }

    /// Whether it is out of the pool for consecutive failures.
    pub fn failure_ejected(&self) -> bool {
        self.failure_ejected.load(Ordering::Relaxed)
    }

    pub(crate) fn set_failure_ejected(&self) {
        self.failure_ejected.store(true, Ordering::Relaxed);
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Stats> {
        // A panic while holding the lock cannot leave Stats inconsistent in a way that
        // matters for routing; keep serving rather than poisoning the endpoint.
        self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Requests currently outstanding to this endpoint (through this proxy).
    pub fn in_flight(&self) -> u32 {
        // At most IN_FLIGHT_BITS (< 32) bits.
        (self.attempts.load(Ordering::Relaxed) & IN_FLIGHT_MASK) as u32
    }

    /// Whether the QoS pool currently admits it (warming or admitted).
    pub fn in_pool(&self) -> bool {
        self.admitted.load(Ordering::Relaxed)
    }

    /// Predicted response time at the SLO percentile, in µs, as of the last measurement
    /// (0 when unknown, `u64::MAX` when that rank is a failure).
    pub fn score_micros(&self) -> u64 {
        match self.score_micros.load(Ordering::Relaxed) {
            u32::MAX => u64::MAX,
            micros => u64::from(micros),
        }
    }

    /// Share of its fresh samples within the SLO, in thousandths, as of the last
    /// measurement ([`UNKNOWN_SHARE`] without any).
    pub fn within_permille(&self) -> u32 {
        self.within_permille.load(Ordering::Relaxed)
    }

    /// Predict from the samples held, and publish what the pick path reads of it.
    fn publish_prediction(
        &self,
        stats: &Stats,
        now: Instant,
        settings: &ServiceSettings,
    ) -> crate::estimator::Prediction {
        let prediction = stats.estimator.predict(
            now,
            settings.qos_pool.max_age,
            settings.latency_slo,
            settings.slo_percentile,
        );
        // The quantile is a sample (at most `MAX_MICROS`) or `Duration::MAX`.
        let score = prediction
            .quantile
            .map_or(0, |d| u32::try_from(d.as_micros()).unwrap_or(u32::MAX));
        self.score_micros.store(score, Ordering::Relaxed);
        let share = match prediction.samples {
            0 => UNKNOWN_SHARE,
            n => (prediction.within_slo * 1000 / n) as u32,
        };
        self.within_permille.store(share, Ordering::Relaxed);
        prediction
    }

    /// The peak-EWMA response time in seconds as of its last sample, before the decay
    /// since (so at least [`Self::peak_ewma`] at any later time); 0 before the first
    /// sample. Cheaper than the decay, which takes an `exp`.
    pub fn peak_ewma_bound_secs(&self) -> f64 {
        f64::from_bits(self.peak_ewma_bits.load(Ordering::Relaxed)).max(0.0)
    }

    /// The peak-EWMA response time at `now` (decayed since its last sample), or `None`
    /// before the first sample. Reading never changes it.
    pub fn peak_ewma(&self, now: Instant) -> Option<Duration> {
        let value = f64::from_bits(self.peak_ewma_bits.load(Ordering::Relaxed));
        if value <= 0.0 {
            return None;
        }
        let at = self.epoch + Duration::from_nanos(self.peak_ewma_at.load(Ordering::Relaxed));
        let elapsed = now.saturating_duration_since(at).as_secs_f64();
        Some(Duration::from_secs_f64(
            value * (-elapsed / PEAK_EWMA_TAU.as_secs_f64()).exp(),
        ))
    }

    /// Called with the stats lock held, so there is one writer at a time.
    fn update_peak_ewma(&self, now: Instant, sample: Duration) {
        let sample = sample.as_secs_f64().max(1e-9);
        let previous = f64::from_bits(self.peak_ewma_bits.load(Ordering::Relaxed));
        let at = self.epoch + Duration::from_nanos(self.peak_ewma_at.load(Ordering::Relaxed));
        let next = if previous <= 0.0 || sample > previous {
            sample
        } else {
            let elapsed = now.saturating_duration_since(at).as_secs_f64();
            let keep = (-elapsed / PEAK_EWMA_TAU.as_secs_f64()).exp();
            previous * keep + sample * (1.0 - keep)
        };
        let nanos = now.saturating_duration_since(self.epoch).as_nanos();
        self.peak_ewma_at
            .store(u64::try_from(nanos).unwrap_or(u64::MAX), Ordering::Relaxed);
        self.peak_ewma_bits.store(next.to_bits(), Ordering::Relaxed);
    }

    /// Whether it has too few fresh measurements to be judged on them.
    pub fn warming(&self) -> bool {
        self.warming.load(Ordering::Relaxed)
    }

    /// Whether any outcome has ever been stored for it (see `Route::pool`).
    pub fn measured(&self) -> bool {
        self.measured.load(Ordering::Relaxed)
    }

    /// Keep it out of a pool with measured members until it has been measured.
    pub(crate) fn hold_until_probed(&self) {
        self.held_until_probed.store(true, Ordering::Relaxed);
    }

    /// Whether it joined a measured service and has not been measured since.
    pub fn held_until_probed(&self) -> bool {
        self.held_until_probed.load(Ordering::Relaxed) && !self.measured()
    }

    /// Attempts started on it ([`EndpointState::start`]) since it was created, modulo
    /// 2^40 (at 100,000 requests per second to this one endpoint, it wraps after four
    /// months).
    pub fn requests(&self) -> u64 {
        self.attempts.load(Ordering::Relaxed) >> IN_FLIGHT_BITS
    }

    /// Outcomes that counted as failures (no connection, no response, or a `failure-status`
    /// status) since it was created.
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// Whether a connection failure put it in cooldown that lasts past `now`.
    pub fn cooling_down(&self, now: Instant) -> bool {
        self.cooldown_remaining(now).is_some()
    }

    /// Time left in the cooldown after connection failures, or `None` when it may be picked.
    pub fn cooldown_remaining(&self, now: Instant) -> Option<Duration> {
        let until = self.cooldown_until.load(Ordering::Relaxed);
        if until == 0 {
            return None;
        }
        let until = self.epoch + Duration::from_nanos(until);
        let left = until.saturating_duration_since(now);
        (!left.is_zero()).then_some(left)
    }

    /// Mark one more request outstanding; the guard undoes it when dropped.
    pub fn start(self: &Arc<Self>) -> InFlight {
        self.begin_attempt();
        InFlight(self.clone())
    }

    /// One more attempt outstanding; the caller calls [`Self::end_attempt`] once for it.
    pub(crate) fn begin_attempt(&self) {
        self.attempts.fetch_add(ONE_STARTED + 1, Ordering::Relaxed);
    }

    /// An attempt counted by [`Self::begin_attempt`] is over.
    pub(crate) fn end_attempt(&self) {
        self.attempts.fetch_sub(1, Ordering::Relaxed);
    }

    /// Feed an outcome; returns a pool change if the verdict flipped.
    pub(crate) fn observe(
        &self,
        now: Instant,
        outcome: Outcome,
        settings: &ServiceSettings,
        obs: &Observation<'_>,
    ) -> Option<PoolChange> {
        let mut stats = self.lock();
        if matches!(
            outcome,
            Outcome::Answered { .. } | Outcome::Response { .. } | Outcome::GrpcAnswered { .. }
        ) {
            stats.last_answer = Moment::at(self.epoch, now);
        }
        let slo = settings.latency_slo;
        // The probe verdict (and, for fallback traffic to an evicted pod, the same).
        let good = match outcome {
            Outcome::ConnectFailed => {
                stats.connect_failures = stats.connect_failures.saturating_add(1);
                let exp = stats.connect_failures.saturating_sub(1).min(16);
                let cooldown = COOLDOWN_BASE.saturating_mul(1 << exp).min(COOLDOWN_MAX);
                self.set_cooldown(now + cooldown);
                self.failed(&mut stats, now, None, obs.late, slo);
                false
            }
            Outcome::Failed => {
                stats.connect_failures = 0;
                self.failed(&mut stats, now, None, obs.late, slo);
                false
            }
            Outcome::Answered { status, .. } if settings.failure_status.contains(status) => {
                stats.connect_failures = 0;
                self.cooldown_until.store(0, Ordering::Relaxed);
                self.failed(
                    &mut stats,
                    now,
                    Some(FailedAnswer::Status(status)),
                    obs.late,
                    slo,
                );
                false
            }
            Outcome::GrpcAnswered { code, .. } if settings.grpc_failure_codes.contains(code) => {
                stats.connect_failures = 0;
                self.cooldown_until.store(0, Ordering::Relaxed);
                self.failed(
                    &mut stats,
                    now,
                    Some(FailedAnswer::Grpc(code)),
                    obs.late,
                    slo,
                );
                false
            }
            Outcome::Answered { latency, .. }
            | Outcome::Response { latency }
            | Outcome::GrpcAnswered { latency, .. } => {
                stats.connect_failures = 0;
                stats.consecutive_failures = 0;
                stats.ejection_capped = false;
                self.cooldown_until.store(0, Ordering::Relaxed);
                // A recheck probe's miss is evidence; its hit is one unloaded request,
                // weak evidence for a pod under its share of the load: it clears the
                // recheck without entering the window, and the peak EWMA starts again
                // from it.
                let recheck_hit = obs.from_probe && latency <= slo && self.rechecking();
                if recheck_hit {
                    self.peak_ewma_bits.store(0, Ordering::Relaxed);
                }
                self.update_peak_ewma(now, latency);
                if obs.late {
                    // Its miss was stored when it went overdue; now it has a time.
                    stats.estimator.resolve_overdue(slo, Some(latency));
                    return self.settle(&mut stats, now, settings, latency <= slo, obs);
                }
                let set_aside = latency > slo && latency.saturating_sub(obs.stall) <= slo;
                if set_aside {
                    // No verdict either way (see `Observation::stall`).
                    if obs.from_probe {
                        stats.probe_in_flight = false;
                        self.schedule_next_probe(&mut stats, now, true, settings);
                    }
                    return None;
                }
                if !recheck_hit {
                    stats.estimator.record(now, latency);
                }
                latency <= slo
            }
        };
        self.settle(&mut stats, now, settings, good, obs)
    }

    /// The verdict of an outcome whose sample is stored: judge admission on it.
    fn settle(
        &self,
        stats: &mut Stats,
        now: Instant,
        settings: &ServiceSettings,
        good: bool,
        obs: &Observation<'_>,
    ) -> Option<PoolChange> {
        if obs.from_probe {
            stats.probe_in_flight = false;
        }
        self.measured.store(true, Ordering::Relaxed);
        if good {
            let suspect = self.suspect.swap(false, Ordering::Relaxed);
            let rechecked = self.recheck.swap(false, Ordering::Relaxed);
            if rechecked || suspect {
                stats.next_probe = Moment::NONE;
            }
            if rechecked && obs.from_probe {
                // Passed over meanwhile: back level with the others, not a catch-up burst.
                self.needs_baseline.store(true, Ordering::Relaxed);
            }
        } else if self.suspected() {
            stats.next_probe = Moment::at(self.epoch, now + stats.probe_interval());
        } else {
            self.recheck_after_miss(stats, now, settings);
        }
        self.advance(stats, now, settings, Some(good), obs)
    }

    /// A pool member missed: probe it from the next probe interval on (see `recheck`).
    fn recheck_after_miss(&self, stats: &mut Stats, now: Instant, settings: &ServiceSettings) {
        if stats.admission.in_pool() && !self.suspected() {
            self.recheck.store(true, Ordering::Relaxed);
            let next = now + settings.qos_pool.probe_interval;
            stats.next_probe = Moment::at(self.epoch, next);
        }
    }

    /// A failure of any kind: a miss in the window (the overdue one made a failure, when
    /// `late`), one more in a row.
    fn failed(
        &self,
        stats: &mut Stats,
        now: Instant,
        status: Option<FailedAnswer>,
        late: bool,
        slo: Duration,
    ) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        stats.consecutive_failures = stats.consecutive_failures.saturating_add(1);
        stats.last_failure_status = status;
        if late {
            stats.estimator.resolve_overdue(slo, None);
        } else {
            stats.estimator.record_failure(now);
        }
        self.update_peak_ewma(now, PEAK_EWMA_FAILURE);
    }

    /// An attempt has had no response headers for longer than the SLO: store the miss
    /// now, so that a pod that hangs leaves the pool in about one SLO rather than one
    /// `timeout`. The caller reports the eventual outcome as `late`.
    pub(crate) fn observe_overdue(
        &self,
        now: Instant,
        settings: &ServiceSettings,
        obs: &Observation<'_>,
    ) -> Option<PoolChange> {
        let mut stats = self.lock();
        stats.estimator.record_overdue(now, settings.latency_slo);
        self.measured.store(true, Ordering::Relaxed);
        // Its answer may never come (a hedge outraced it): the probes find out.
        self.recheck_after_miss(&mut stats, now, settings);
        self.advance(&mut stats, now, settings, None, obs)
    }

    /// An attempt sent at `sent` (already stored overdue) is still unanswered at `now`,
    /// [`unanswered_limit`] later: if the pod has answered nothing since `sent`, it hangs
    /// and leaves the pool (unless `obs` keeps the last member during a stall).
    pub(crate) fn observe_unanswered(
        &self,
        now: Instant,
        sent: Instant,
        settings: &ServiceSettings,
        obs: &Observation<'_>,
    ) -> Option<PoolChange> {
        let mut stats = self.lock();
        let answered_since = stats
            .last_answer
            .get(self.epoch)
            .is_some_and(|at| at >= sent);
        if answered_since || !stats.admission.in_pool() {
            return None;
        }
        if (obs.keep_in_pool)() {
            stats.kept_during_stall = true;
            return None;
        }
        let before = stats.admission;
        stats.admission = self.evict(&mut stats, now, settings, EvictionCause::Unanswered);
        self.publish_admission(&mut stats, before, now, settings)
    }

    /// Re-judge admission without a new sample (after a settings change or for expiry).
    /// With `settings_changed`, an evicted endpoint is re-admitted at once when its fresh
    /// samples meet the new SLO, or probed at once when it has none.
    pub(crate) fn reevaluate(
        &self,
        now: Instant,
        settings: &ServiceSettings,
        settings_changed: bool,
    ) -> Option<PoolChange> {
        let mut stats = self.lock();
        stats.estimator.resize(settings.qos_pool.window);
        if settings_changed {
            if let Admission::Evicted { .. } = stats.admission {
                stats.set_probe_interval(settings.qos_pool.probe_interval);
                if !stats.probe_in_flight {
                    stats.next_probe = Moment::at(self.epoch, now);
                }
            }
        }
        self.advance(&mut stats, now, settings, None, &Observation::plain(false))
    }

    /// The admission state machine (see the module docs). `last_good` is the verdict of
    /// a sample just taken (`None`: a re-judgement on the samples held).
    fn advance(
        &self,
        stats: &mut Stats,
        now: Instant,
        settings: &ServiceSettings,
        last_good: Option<bool>,
        obs: &Observation<'_>,
    ) -> Option<PoolChange> {
        let q = &settings.qos_pool;
        let prediction = self.publish_prediction(stats, now, settings);
        let samples = prediction.samples;
        let meets = prediction.meets(settings.slo_percentile).unwrap_or(false);
        let misses = prediction.likely_misses(settings.slo_percentile, q.verdict_confidence);
        let all_miss = samples > 0 && prediction.within_slo == 0;
        let before = stats.admission;
        stats.admission = match before {
            Admission::Warming | Admission::Admitted => {
                let failing = q.eject_after > 0 && stats.consecutive_failures >= q.eject_after;
                let warmed_long = stats
                    .warming_since
                    .get(self.epoch)
                    .is_some_and(|since| now.saturating_duration_since(since) >= q.max_age);
                let judged = samples >= q.min_samples || all_miss || (warmed_long && samples > 0);
                if failing && (obs.may_eject)() {
                    stats.ejection_capped = false;
                    self.evict(stats, now, settings, EvictionCause::ConsecutiveFailures)
                } else {
                    stats.ejection_capped = failing;
                    if judged && (misses || all_miss) {
                        if (obs.keep_in_pool)() {
                            stats.kept_during_stall = true;
                            before
                        } else {
                            self.evict(stats, now, settings, EvictionCause::Latency)
                        }
                    } else if samples >= q.min_samples || (judged && warmed_long) {
                        stats.kept_during_stall = false;
                        Admission::Admitted
                    } else {
                        Admission::Warming
                    }
                }
            }
            Admission::Evicted {
                since,
                consecutive_good,
                cause,
            } => match last_good {
                Some(true) => {
                    let good = consecutive_good + 1;
                    if good >= q.readmit_after || (obs.pool_empty)() {
                        self.readmit(stats, now, settings)
                    } else {
                        self.schedule_next_probe(stats, now, true, settings);
                        Admission::Evicted {
                            since,
                            consecutive_good: good,
                            cause,
                        }
                    }
                }
                Some(false) => {
                    self.schedule_next_probe(stats, now, false, settings);
                    Admission::Evicted {
                        since,
                        consecutive_good: 0,
                        cause,
                    }
                }
                // A settings change re-judges on the evidence already held (any number
                // of fresh samples, all within the new SLO, or enough that meet it).
                None if cause == EvictionCause::Latency
                    && samples > 0
                    && meets
                    && (samples >= q.min_samples || prediction.within_slo == samples) =>
                {
                    self.readmit(stats, now, settings)
                }
                None => before,
            },
        };
        self.publish_admission(stats, before, now, settings)
    }

    /// Make `stats.admission` (changed from `before`) visible to the pick path; returns
    /// the pool change, if any.
    fn publish_admission(
        &self,
        stats: &mut Stats,
        before: Admission,
        now: Instant,
        settings: &ServiceSettings,
    ) -> Option<PoolChange> {
        if stats.admission == Admission::Warming {
            if stats.warming_since == Moment::NONE {
                stats.warming_since = Moment::at(self.epoch, now);
            }
        } else {
            stats.warming_since = Moment::NONE;
        }
        let in_pool = stats.admission.in_pool();
        if in_pool && !before.in_pool() {
            // Re-admission forgot the misses that evicted it.
            self.publish_prediction(stats, now, settings);
        }
        self.admitted.store(in_pool, Ordering::Relaxed);
        self.warming
            .store(stats.admission == Admission::Warming, Ordering::Relaxed);
        match (before.in_pool(), in_pool) {
            (true, false) => Some(PoolChange::Evicted),
            (false, true) => Some(PoolChange::Readmitted),
            _ => None,
        }
    }

    /// Leave the pool, with the first probe after the flap backoff.
    fn evict(
        &self,
        stats: &mut Stats,
        now: Instant,
        settings: &ServiceSettings,
        cause: EvictionCause,
    ) -> Admission {
        let q = &settings.qos_pool;
        if let Some(back) = stats.readmitted_at.get(self.epoch) {
            let healthy_for = now.saturating_duration_since(back);
            let window = q.max_age.max(Duration::from_millis(1));
            let decay = (healthy_for.as_nanos() / window.as_nanos()).min(32) as u32;
            stats.flaps = stats.flaps.saturating_sub(decay);
            if healthy_for < window {
                stats.flaps = stats.flaps.saturating_add(1);
            }
        }
        let first = q
            .probe_interval
            .saturating_mul(1u32 << stats.flaps.min(16))
            .min(FLAP_BACKOFF_MAX.max(q.probe_interval));
        stats.set_probe_interval(first);
        stats.next_probe = Moment::at(self.epoch, now + first);
        stats.kept_during_stall = false;
        // Its own verdict now: the probes of an evicted pod decide its return.
        self.suspect.store(false, Ordering::Relaxed);
        self.recheck.store(false, Ordering::Relaxed);
        if cause == EvictionCause::Latency {
            stats.ejection_capped = false;
        }
        self.ramp_start.store(0, Ordering::Relaxed);
        Admission::Evicted {
            since: now,
            consecutive_good: 0,
            cause,
        }
    }

    /// Return to the pool: drop the misses that evicted it, keep its good history, and
    /// start the slow start. The peak EWMA forgets them too: it remembers a failure as
    /// 1 s for tens of seconds, and the slack spread, which reads it, would pass over a
    /// pod its probes just found good until then; its next answer sets it afresh.
    fn readmit(&self, stats: &mut Stats, now: Instant, settings: &ServiceSettings) -> Admission {
        stats
            .estimator
            .forget_misses_before(now, settings.latency_slo);
        self.peak_ewma_bits.store(0, Ordering::Relaxed);
        stats.next_probe = Moment::NONE;
        stats.consecutive_failures = 0;
        stats.ejection_capped = false;
        stats.readmitted_at = Moment::at(self.epoch, now);
        self.failure_ejected.store(false, Ordering::Relaxed);
        let nanos = now.saturating_duration_since(self.epoch).as_nanos();
        self.ramp_start.store(
            u64::try_from(nanos).unwrap_or(u64::MAX).max(1),
            Ordering::Relaxed,
        );
        self.needs_baseline.store(true, Ordering::Relaxed);
        Admission::Admitted
    }

    /// Probes come every `probe-interval` while they succeed; while they fail, the
    /// interval doubles up to `probe-max-interval` (or the flap backoff, if longer).
    fn schedule_next_probe(
        &self,
        stats: &mut Stats,
        now: Instant,
        good: bool,
        settings: &ServiceSettings,
    ) {
        let q = &settings.qos_pool;
        if good {
            stats.next_probe = Moment::at(self.epoch, now + q.probe_interval);
        } else {
            let cap = q.probe_max_interval.max(stats.probe_interval());
            stats.set_probe_interval(stats.probe_interval().saturating_mul(2).min(cap));
            stats.next_probe = Moment::at(self.epoch, now + stats.probe_interval());
        }
    }

    /// What `/debug/pools` shows beyond the admission.
    pub(crate) fn detail(&self) -> EndpointDetail {
        let stats = self.lock();
        EndpointDetail {
            consecutive_failures: stats.consecutive_failures,
            last_failure_status: stats.last_failure_status,
            ejection_capped: stats.ejection_capped,
            kept_during_stall: stats.kept_during_stall,
            flaps: stats.flaps,
            next_probe: stats.next_probe.get(self.epoch),
        }
    }

    /// Claim a background probe if one is due; the caller must report its outcome.
    /// Due: an evicted endpoint at its scheduled time, or a warming one never measured
    /// when `first_probe` (it waits outside the pool for that probe).
    pub(crate) fn claim_probe(&self, now: Instant, first_probe: bool) -> bool {
        let mut stats = self.lock();
        let due = match (stats.admission, stats.next_probe.get(self.epoch)) {
            (Admission::Evicted { .. }, Some(at)) => at <= now,
            (_, next) if self.suspected() || self.rechecking() => next.is_none_or(|at| at <= now),
            (Admission::Warming, _) => first_probe && !self.measured(),
            _ => false,
        };
        if due && !stats.probe_in_flight {
            stats.probe_in_flight = true;
            true
        } else {
            false
        }
    }

    /// Whether a neighbour's failure report keeps it out of the pool until an answer of
    /// this proxy's own meets the SLO (see `neighbours.rs`).
    pub fn suspected(&self) -> bool {
        self.suspect.load(Ordering::Relaxed)
    }

    /// Whether it is in the pool and probed because its last answer missed (see the
    /// field's docs).
    pub fn rechecking(&self) -> bool {
        self.recheck.load(Ordering::Relaxed)
    }

    /// A neighbour saw it fail at `at` (a failure verdict, see `neighbours.rs`): suspect
    /// it and probe it at once, unless it is out of the pool already or this proxy has
    /// had an answer from it since `at` (its own evidence is newer). Returns whether it
    /// became suspect.
    pub(crate) fn suspect(&self, at: Instant, now: Instant) -> bool {
        let mut stats = self.lock();
        let answered_since = stats
            .last_answer
            .get(self.epoch)
            .is_some_and(|answer| answer >= at);
        if !stats.admission.in_pool() || answered_since || self.suspected() {
            return false;
        }
        self.suspect.store(true, Ordering::Relaxed);
        stats.next_probe = Moment::at(self.epoch, now);
        true
    }

    /// A neighbour saw it come back at `at`: if this proxy ejected it for failures before
    /// that, its next probe is due now rather than after its backoff (the probe still
    /// decides). A latency eviction is left to its schedule: it depends on where this
    /// proxy stands, and a neighbour's return says nothing about that. Returns whether
    /// the probe was brought forward.
    pub(crate) fn probe_soon(&self, at: Instant, now: Instant) -> bool {
        self.probe_now_if(now, |admission| {
            matches!(
                admission,
                Admission::Evicted { since, cause, .. }
                    if since < at && cause != EvictionCause::Latency
            )
        })
    }

    /// Its service's pool is empty: if it is out of the pool, its next probe is due at
    /// once rather than after its backoff (the probe still decides; see
    /// [`Route::hurry_probes`](crate::Route::hurry_probes)).
    pub(crate) fn hurry_probe(&self, now: Instant) {
        self.probe_now_if(now, |admission| {
            matches!(admission, Admission::Evicted { .. })
        });
    }

    /// Make its next probe due at `now` if its admission passes `wanted` and the probe
    /// is scheduled later and not in flight. Returns whether it was brought forward.
    fn probe_now_if(&self, now: Instant, wanted: impl FnOnce(Admission) -> bool) -> bool {
        let mut stats = self.lock();
        let later = stats
            .next_probe
            .get(self.epoch)
            .is_some_and(|next| next > now);
        if later && !stats.probe_in_flight && wanted(stats.admission) {
            stats.next_probe = Moment::at(self.epoch, now);
            return true;
        }
        false
    }

    /// Whether a latency eviction is being withheld for a stall of the proxy.
    pub(crate) fn kept_during_stall(&self) -> bool {
        self.lock().kept_during_stall
    }

    /// Give up a claimed probe without an outcome (e.g. shutting down).
    pub(crate) fn release_probe(&self) {
        self.lock().probe_in_flight = false;
    }

    fn set_cooldown(&self, until: Instant) {
        let nanos = until.saturating_duration_since(self.epoch).as_nanos();
        self.cooldown_until.store(
            u64::try_from(nanos).unwrap_or(u64::MAX).max(1),
            Ordering::Relaxed,
        );
    }
}

/// Failure and probe details of an endpoint, for `/debug/pools`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct EndpointDetail {
    pub(crate) consecutive_failures: u32,
    pub(crate) last_failure_status: Option<FailedAnswer>,
    pub(crate) ejection_capped: bool,
    pub(crate) kept_during_stall: bool,
    pub(crate) flaps: u32,
    pub(crate) next_probe: Option<Instant>,
}

/// Decrements the endpoint's in-flight count when dropped.
#[derive(Debug)]
pub struct InFlight(Arc<EndpointState>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.end_attempt();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In-flight and started attempts share one word; each keeps its own count.
    #[test]
    fn attempts_in_flight_and_started_count_apart() {
        let state = Arc::new(EndpointState::new(
            &ServiceSettings::default(),
            Instant::now(),
        ));
        let guards: Vec<InFlight> = (0..300).map(|_| state.start()).collect();
        assert_eq!((state.in_flight(), state.requests()), (300, 300));
        drop(guards);
        assert_eq!((state.in_flight(), state.requests()), (0, 300));
        // Concurrent starts and ends lose none of either.
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..10_000 {
                        let _attempt = state.start();
                    }
                });
            }
        });
        assert_eq!((state.in_flight(), state.requests()), (0, 40_300));
    }
}
