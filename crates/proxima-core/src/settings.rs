//! Per-service routing settings and their one parser.
//!
//! The same keys are used by the YAML file source (`latency-slo: 80ms`) and by Service
//! annotations (`proxima.io/latency-slo: "80ms"`), so both go through
//! [`ServiceSettings::from_pairs`]. An invalid value never rejects the service: the
//! setting keeps its default and a [`SettingError`] says which key was wrong and what
//! form it accepts, for a log line or a Kubernetes Event.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::retry_budget::RetryBudgetParams;

/// The annotation prefix under which Kubernetes Services carry these keys.
pub const ANNOTATION_PREFIX: &str = "proxima.io/";

/// Settings of the `qos-pool` strategy (keys `qos-pool-*`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct QosPoolParams {
    /// Recent measurements kept per endpoint.
    pub window: usize,
    /// Measurements needed before an endpoint can be judged; fewer means "warming up".
    pub min_samples: usize,
    /// Measurements older than this are forgotten.
    pub max_age: Duration,
    /// Consecutive probe measurements within the SLO needed to re-admit an endpoint
    /// while the pool has a member (one while it has none: see `endpoint.rs`).
    pub readmit_after: u32,
    /// Interval between probes of an endpoint outside the pool while they succeed; it
    /// doubles up to `probe_max_interval` while they keep missing, except while the
    /// service's pool is empty (see `Route::hurry_probes`).
    pub probe_interval: Duration,
    /// `qos-pool-probe-max-interval`: the longest wait between probes of an evicted
    /// endpoint that keeps missing.
    pub probe_max_interval: Duration,
    /// Path of the background probe request (`GET`), when probes are not shaped like
    /// the service's traffic or no such traffic was seen.
    pub probe_path: String,
    /// Consecutive failures (failure statuses, resets, timeouts, refused connections)
    /// that take an endpoint out of the pool at once; 0 turns this off. Envoy's outlier
    /// detection ejects after 5 consecutive 5xx, linkerd's failure accrual after 7.
    pub eject_after: u32,
    /// Largest share of a service's eligible endpoints, in percent, that may be out of
    /// the pool for consecutive failures at one time (Envoy's `max_ejection_percent`);
    /// at least one endpoint may always be ejected unless this is 0.
    pub max_ejection_percent: f64,
    /// How long a re-admitted endpoint takes to ramp up to its full share (Envoy's
    /// `slow_start_config`); zero turns slow start off.
    pub slow_start: Duration,
    /// What the background probes look like (`qos-pool-probe`).
    pub probe: ProbeShape,
    /// `qos-pool-probe-idle-after`: once a service has had no request at this proxy for
    /// this long, its pods outside the pool are no longer probed here until a request
    /// comes (first probes of new pods still are); zero probes them whatever the traffic.
    /// A proxy routes the services its node's clients use, so probing every pod of every
    /// service from every node would load each pod with a probe stream per node (at 100
    /// nodes and a 4 s backoff, 25 probes/s per evicted pod) for answers nobody reads;
    /// what an idle proxy knows of those pods comes from its neighbours' reports instead.
    pub probe_idle_after: Duration,
    /// `qos-pool-verdict-confidence`, in percent: a pod leaves the pool for latency only
    /// when its fresh samples miss the SLO percentile by more than chance explains at
    /// this confidence (see `estimator::likely_misses`); 0 judges on the share alone, as
    /// QEdgeProxy's point estimate does.
    pub verdict_confidence: f64,
    /// `qos-pool-hedge` (`on` | `off`): a request that may go twice and has waited as
    /// long as a second pod can still answer within the SLO goes to that pod as well
    /// (see `forward.rs` in the proxy and [`crate::Picked::hedge_after`]).
    pub hedge: bool,
}

/// What background probes of evicted endpoints look like (`qos-pool-probe`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProbeShape {
    /// `path`: `GET <qos-pool-probe-path>` (the default).
    #[default]
    Path,
    /// `traffic`: the method, path and headers of a recent real request of the service
    /// that was idempotent and had no body; `GET <qos-pool-probe-path>` until one is seen.
    Traffic,
}

impl Default for QosPoolParams {
    fn default() -> Self {
        Self {
            window: 64,
            min_samples: 3,
            max_age: Duration::from_secs(30),
            readmit_after: 3,
            probe_interval: Duration::from_millis(500),
            // Short enough that a pod that recovers is back within a few seconds (a
            // probe per 4 s per evicted pod costs little); pods that flap wait longer
            // through the flap backoff (endpoint.rs).
            probe_max_interval: Duration::from_secs(4),
            probe_path: "/".to_string(),
            eject_after: 5,
            max_ejection_percent: 50.0,
            slow_start: Duration::from_secs(10),
            // Longer than the gap between a device's readings in the papers' workloads
            // (1-10 s), so that a service in steady use is never paused.
            probe_idle_after: Duration::from_secs(60),
            probe: ProbeShape::Path,
            verdict_confidence: 95.0,
            hedge: true,
        }
    }
}

/// How a service is routed. Defaults are documented per field and in the README.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ServiceSettings {
    /// `latency-slo`: the response time the service promises (default 100ms).
    pub latency_slo: Duration,
    /// `slo-percentile`: share of requests that must meet it, in percent (default 95).
    pub slo_percentile: f64,
    /// `strategy`: `qos-pool` (default), `round-robin`, `random`, or a plugin.
    pub strategy: String,
    /// `timeout`: whole request, to response headers (default 15s).
    pub timeout: Duration,
    /// `connect-timeout`: TCP connect to an endpoint (default 1s).
    pub connect_timeout: Duration,
    /// `retries`: extra attempts on other endpoints (default 2).
    pub retries: u32,
    /// `failure-status`: response statuses that count as failures, i.e. SLO misses,
    /// however fast they come (default `5xx`).
    pub failure_status: StatusSet,
    /// `grpc-failure-codes`: the `grpc-status` codes of a gRPC call's answer that count
    /// as failures, as a failure status does (default [`GrpcCodes::default`]).
    pub grpc_failure_codes: GrpcCodes,
    /// `retry-budget-*`: how many retries the service may add to its requests (see
    /// [`crate::retry_budget`]).
    pub retry_budget: RetryBudgetParams,
    /// `qos-pool-*`: how the QoS pool admits, evicts and probes endpoints.
    pub qos_pool: QosPoolParams,
    /// Every `<strategy>-<param>` key not known here, for strategy plugins.
    pub params: BTreeMap<String, String>,
    /// The values that were rejected when these settings were read (each setting named
    /// here is on its default), so that `/debug/pools` can show them with the service.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<SettingError>,
}

impl Default for ServiceSettings {
    fn default() -> Self {
        Self {
            latency_slo: Duration::from_millis(100),
            slo_percentile: 95.0,
            strategy: "qos-pool".to_string(),
            timeout: Duration::from_secs(15),
            connect_timeout: Duration::from_secs(1),
            retries: 2,
            failure_status: StatusSet::default(),
            grpc_failure_codes: GrpcCodes::default(),
            retry_budget: RetryBudgetParams::default(),
            qos_pool: QosPoolParams::default(),
            params: BTreeMap::new(),
            problems: Vec::new(),
        }
    }
}

/// A setting whose value was rejected; the default stays in force.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize)]
#[error("invalid value {value:?} for `{key}`: expected {expected}; using the default")]
pub struct SettingError {
    /// The setting's key, without the `proxima.io/` prefix.
    pub key: String,
    /// The value as given.
    pub value: String,
    /// What would have been accepted, e.g. `a duration such as 2s`.
    pub expected: String,
}

impl SettingError {
    /// The error for `key = value`, which should have been `expected`.
    pub fn new(key: &str, value: &str, expected: impl Into<String>) -> Self {
        Self {
            key: key.to_string(),
            value: value.to_string(),
            expected: expected.into(),
        }
    }
}

/// Strategy names; `<name>-<param>` keys of these are strategy parameters. The router's
/// [`StrategyRegistry`](crate::StrategyRegistry) says which of them are built.
pub const KNOWN_STRATEGIES: &[&str] = &[
    "qos-pool",
    "round-robin",
    "random",
    "rap",
    "proximity",
    "local",
    "kube-proxy",
    "p2c-ewma",
];

impl ServiceSettings {
    /// Parse `key = value` pairs (keys without the `proxima.io/` prefix; pairs with other
    /// prefixes are ignored by the caller). Unknown keys that look like strategy
    /// parameters go to [`ServiceSettings::params`]; other unknown keys are errors.
    pub fn from_pairs<'a, I>(pairs: I) -> (Self, Vec<SettingError>)
    where
        I: IntoIterator<Item = (&'a str, &'a str)>,
    {
        let mut s = Self::default();
        let mut errors = Vec::new();
        for (key, value) in pairs {
            if let Err(e) = s.set(key, value.trim()) {
                errors.push(e);
            }
        }
        if s.qos_pool.min_samples > s.qos_pool.window {
            errors.push(SettingError::new(
                "qos-pool-min-samples",
                &s.qos_pool.min_samples.to_string(),
                format!("at most qos-pool-window ({})", s.qos_pool.window),
            ));
            s.qos_pool.min_samples = s.qos_pool.window;
        }
        if s.qos_pool.probe_max_interval < s.qos_pool.probe_interval {
            s.qos_pool.probe_max_interval = s.qos_pool.probe_interval;
        }
        (s, errors)
    }

    /// Parse annotations: keys starting with [`ANNOTATION_PREFIX`] are settings, the rest
    /// are ignored. `enabled` is handled by discovery and skipped here.
    pub fn from_annotations<'a, I>(annotations: I) -> (Self, Vec<SettingError>)
    where
        I: IntoIterator<Item = (&'a str, &'a str)>,
    {
        Self::from_pairs(annotations.into_iter().filter_map(|(k, v)| {
            let key = k.strip_prefix(ANNOTATION_PREFIX)?;
            (key != "enabled").then_some((key, v))
        }))
    }

    fn set(&mut self, key: &str, value: &str) -> Result<(), SettingError> {
        let dur = |v: &str| parse_duration(v).ok_or_else(|| duration_error(key, v));
        match key {
            "latency-slo" => {
                let slo = positive(key, value, dur(value)?)?;
                if slo > MAX_LATENCY_SLO {
                    return Err(SettingError::new(
                        key,
                        value,
                        "a duration greater than zero and at most 60m",
                    ));
                }
                self.latency_slo = slo;
            }
            "slo-percentile" => {
                self.slo_percentile = value
                    .trim_end_matches('%')
                    .parse::<f64>()
                    .ok()
                    .filter(|p| *p > 0.0 && *p <= 100.0)
                    .ok_or_else(|| {
                        SettingError::new(
                            key,
                            value,
                            "a number in (0, 100], e.g. \"95\" or \"99.9\"",
                        )
                    })?;
            }
            "strategy" => {
                if !value
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    || value.is_empty()
                {
                    return Err(SettingError::new(
                        key,
                        value,
                        format!("a strategy name, one of {}", KNOWN_STRATEGIES.join(", ")),
                    ));
                }
                self.strategy = value.to_string();
            }
            "timeout" => self.timeout = positive(key, value, dur(value)?)?,
            "connect-timeout" => self.connect_timeout = positive(key, value, dur(value)?)?,
            "retries" => {
                self.retries = value
                    .parse::<u32>()
                    .ok()
                    .filter(|r| *r <= 10)
                    .ok_or_else(|| SettingError::new(key, value, "an integer from 0 to 10"))?;
            }
            "failure-status" => {
                self.failure_status = StatusSet::parse(value).ok_or_else(|| {
                    SettingError::new(
                        key,
                        value,
                        "status codes, classes and ranges separated by commas, e.g. \"5xx\", \
                         \"5xx,429\", \"500-599\", \"503\", or \"none\"",
                    )
                })?;
            }
            "grpc-failure-codes" => {
                self.grpc_failure_codes = GrpcCodes::parse(value).ok_or_else(|| {
                    SettingError::new(
                        key,
                        value,
                        "gRPC status codes (0-16) or their names separated by commas, e.g. \
                         \"14,4\" or \"UNAVAILABLE,DEADLINE_EXCEEDED\", or \"none\"",
                    )
                })?;
            }
            "qos-pool-eject-after" => {
                self.qos_pool.eject_after = parse_count(key, value, 0, 1000)? as u32;
            }
            "qos-pool-max-ejection-percent" => {
                self.qos_pool.max_ejection_percent =
                    percent(key, value, 100.0, "a percentage from 0 to 100, e.g. \"50\"")?;
            }
            "qos-pool-slow-start" => self.qos_pool.slow_start = dur(value)?,
            "qos-pool-probe-idle-after" => self.qos_pool.probe_idle_after = dur(value)?,
            "qos-pool-hedge" => {
                self.qos_pool.hedge = match value {
                    "on" => true,
                    "off" => false,
                    _ => return Err(SettingError::new(key, value, "\"on\" or \"off\"")),
                };
            }
            "qos-pool-verdict-confidence" => {
                self.qos_pool.verdict_confidence = percent(
                    key,
                    value,
                    99.9,
                    "a percentage from 0 to 99.9, e.g. \"95\" (0: the share alone decides)",
                )?;
            }
            "retry-budget-ratio" => {
                self.retry_budget.ratio = value
                    .parse::<f64>()
                    .ok()
                    .filter(|r| (0.0..=10.0).contains(r))
                    .ok_or_else(|| {
                        SettingError::new(
                            key,
                            value,
                            "retries per request, a number from 0 to 10, e.g. \"0.2\"",
                        )
                    })?;
            }
            "retry-budget-min-per-second" => {
                self.retry_budget.min_per_second = parse_count(key, value, 0, 100_000)? as u32;
            }
            "retry-budget-ttl" => {
                let ttl = positive(key, value, dur(value)?)?;
                if ttl > Duration::from_secs(600) {
                    return Err(SettingError::new(key, value, "a duration up to 10m"));
                }
                self.retry_budget.ttl = ttl;
            }
            "qos-pool-window" => {
                self.qos_pool.window = parse_count(key, value, 1, 4096)?;
            }
            "qos-pool-min-samples" => {
                self.qos_pool.min_samples = parse_count(key, value, 1, 4096)?;
            }
            "qos-pool-max-age" => self.qos_pool.max_age = positive(key, value, dur(value)?)?,
            "qos-pool-readmit-after" => {
                self.qos_pool.readmit_after = parse_count(key, value, 1, 1000)? as u32;
            }
            "qos-pool-probe-interval" => {
                self.qos_pool.probe_interval = positive(key, value, dur(value)?)?
            }
            "qos-pool-probe-max-interval" => {
                self.qos_pool.probe_max_interval = positive(key, value, dur(value)?)?
            }
            "qos-pool-probe-path" => {
                if !value.starts_with('/') || value.chars().any(|c| c.is_whitespace()) {
                    return Err(SettingError::new(
                        key,
                        value,
                        "an absolute path such as \"/healthz\"",
                    ));
                }
                self.qos_pool.probe_path = value.to_string();
            }
            "qos-pool-probe" => {
                self.qos_pool.probe = match value {
                    "path" => ProbeShape::Path,
                    "traffic" => ProbeShape::Traffic,
                    _ => return Err(SettingError::new(
                        key,
                        value,
                        "\"path\" (GET qos-pool-probe-path) or \"traffic\" (like recent requests)",
                    )),
                };
            }
            // The QoS pool's own strategy parameter, read by `QosPool::build`.
            "qos-pool-spread" => {
                if !matches!(value, "even" | "slack") {
                    return Err(SettingError::new(key, value, "\"even\" or \"slack\""));
                }
                self.params.insert(key.to_string(), value.to_string());
            }
            "qos-pool-slack-even-turns" => {
                parse_count(key, value, 0, 1000)?;
                self.params.insert(key.to_string(), value.to_string());
            }
            "qos-pool-slack-levels" => {
                if !value
                    .parse::<f64>()
                    .is_ok_and(|v| (1.0..=1000.0).contains(&v))
                {
                    return Err(SettingError::new(key, value, "a number from 1 to 1000"));
                }
                self.params.insert(key.to_string(), value.to_string());
            }
            other => {
                // `<strategy>-<param>` keys belong to strategies; anything else (a typo
                // such as `latency-sloo`) is reported rather than silently ignored.
                let strategy_param = KNOWN_STRATEGIES.iter().any(|s| {
                    *s != "qos-pool"
                        && other
                            .strip_prefix(s)
                            .is_some_and(|p| p.starts_with('-') && p.len() > 1)
                });
                if strategy_param {
                    self.params.insert(other.to_string(), value.to_string());
                } else {
                    return Err(SettingError::new(
                        key,
                        value,
                        "a known key: latency-slo, slo-percentile, strategy, timeout, \
                         connect-timeout, retries, failure-status, grpc-failure-codes, \
                         retry-budget-*, qos-pool-*, or <strategy>-<param>",
                    ));
                }
            }
        }
        Ok(())
    }

    /// A strategy parameter (`<strategy>-<name>`), if set.
    pub fn param(&self, strategy: &str, name: &str) -> Option<&str> {
        self.params
            .get(&format!("{strategy}-{name}"))
            .map(String::as_str)
    }
}

/// A set of HTTP status codes (the `failure-status` setting): classes (`5xx`), ranges
/// (`500-599`) and single codes (`429`), separated by commas; `none` is the empty set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusSet {
    ranges: Vec<(u16, u16)>,
    text: String,
}

impl Default for StatusSet {
    fn default() -> Self {
        Self {
            ranges: vec![(500, 599)],
            text: "5xx".to_string(),
        }
    }
}

impl Serialize for StatusSet {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.text)
    }
}

impl StatusSet {
    /// Parse the setting's text; `None` when any part of it is not a valid form.
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        if text.eq_ignore_ascii_case("none") {
            return Some(Self {
                ranges: Vec::new(),
                text: "none".to_string(),
            });
        }
        let code = |s: &str| {
            s.trim()
                .parse::<u16>()
                .ok()
                .filter(|c| (100..=599).contains(c))
        };
        let mut ranges = Vec::new();
        for part in text.split(',') {
            let part = part.trim();
            let lower = part.to_ascii_lowercase();
            let range = if let Some(class) = lower.strip_suffix("xx") {
                let digit = class.parse::<u16>().ok().filter(|d| (1..=5).contains(d))?;
                (digit * 100, digit * 100 + 99)
            } else if let Some((from, to)) = part.split_once('-') {
                let (from, to) = (code(from)?, code(to)?);
                if from > to {
                    return None;
                }
                (from, to)
            } else {
                let c = code(part)?;
                (c, c)
            };
            ranges.push(range);
        }
        Some(Self {
            ranges,
            text: text.to_string(),
        })
    }

    /// Whether `status` falls in one of the set's ranges.
    pub fn contains(&self, status: u16) -> bool {
        self.ranges
            .iter()
            .any(|&(from, to)| (from..=to).contains(&status))
    }

    /// The setting as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

/// gRPC status codes (the `grpc-failure-codes` setting), by number or by name, as gRPC's
/// `doc/statuscodes.md` gives them; `none` is the empty set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrpcCodes {
    /// Bit `n` set: code `n` is in the set.
    bits: u32,
    text: String,
}

/// gRPC's status code names, by code.
const GRPC_CODE_NAMES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

impl Default for GrpcCodes {
    /// The codes that say the pod (not the call) is in trouble: UNAVAILABLE (14, down or
    /// overloaded), DEADLINE_EXCEEDED (4, too slow), RESOURCE_EXHAUSTED (8, out of
    /// capacity), INTERNAL (13) and UNKNOWN (2, an unhandled error: how a crashing
    /// handler answers). Codes about the call itself (INVALID_ARGUMENT, NOT_FOUND,
    /// PERMISSION_DENIED, ...) are the client's business and say nothing of the pod; the
    /// same split as Envoy's and linkerd's retryable gRPC codes.
    fn default() -> Self {
        Self::parse("UNKNOWN,DEADLINE_EXCEEDED,RESOURCE_EXHAUSTED,INTERNAL,UNAVAILABLE")
            .expect("valid default")
    }
}

impl Serialize for GrpcCodes {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.text)
    }
}

impl GrpcCodes {
    /// Parse the setting's text; `None` when any part is neither a code nor a name.
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        if text.eq_ignore_ascii_case("none") {
            return Some(Self {
                bits: 0,
                text: "none".to_string(),
            });
        }
        let mut bits = 0u32;
        for part in text.split(',') {
            let part = part.trim();
            let code = match part.parse::<u8>() {
                Ok(code) => code,
                Err(_) => GRPC_CODE_NAMES
                    .iter()
                    .position(|name| name.eq_ignore_ascii_case(part))?
                    as u8,
            };
            if usize::from(code) >= GRPC_CODE_NAMES.len() {
                return None;
            }
            bits |= 1 << code;
        }
        Some(Self {
            bits,
            text: text.to_string(),
        })
    }

    /// Whether `code` is in the set.
    pub fn contains(&self, code: u8) -> bool {
        code < 32 && self.bits & (1 << code) != 0
    }

    /// The setting as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

fn duration_error(key: &str, value: &str) -> SettingError {
    SettingError::new(
        key,
        value,
        "a duration with a unit: us, ms, s or m (e.g. \"80ms\", \"1.5s\")",
    )
}

/// The longest `latency-slo` accepted: the estimator tells response times apart up to
/// 71 minutes (`estimator.rs`), so a longer SLO could not be judged as written.
const MAX_LATENCY_SLO: Duration = Duration::from_secs(3600);

/// A percentage from 0 to `max`, with or without `%`.
fn percent(key: &str, value: &str, max: f64, expected: &str) -> Result<f64, SettingError> {
    value
        .trim_end_matches('%')
        .parse::<f64>()
        .ok()
        .filter(|p| (0.0..=max).contains(p))
        .ok_or_else(|| SettingError::new(key, value, expected))
}

fn positive(key: &str, value: &str, d: Duration) -> Result<Duration, SettingError> {
    if d.is_zero() {
        Err(SettingError::new(
            key,
            value,
            "a duration greater than zero",
        ))
    } else {
        Ok(d)
    }
}

fn parse_count(key: &str, value: &str, min: usize, max: usize) -> Result<usize, SettingError> {
    value
        .parse::<usize>()
        .ok()
        .filter(|n| (min..=max).contains(n))
        .ok_or_else(|| SettingError::new(key, value, format!("an integer from {min} to {max}")))
}

/// Parse `80ms`, `1.5s`, `250us`, `2m`. A unit is required: a bare number is ambiguous.
pub fn parse_duration(value: &str) -> Option<Duration> {
    let value = value.trim();
    let split = value.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (number, unit) = value.split_at(split);
    let number: f64 = number.parse().ok()?;
    let scale = match unit.trim() {
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        "m" => 60.0,
        _ => return None,
    };
    let secs = number * scale;
    (secs.is_finite() && (0.0..=86_400.0).contains(&secs)).then(|| Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_documented_keys() {
        let (s, errors) = ServiceSettings::from_pairs([
            ("latency-slo", "80ms"),
            ("slo-percentile", "99.5"),
            ("strategy", "round-robin"),
            ("timeout", "2s"),
            ("connect-timeout", "250ms"),
            ("retries", "1"),
            ("retry-budget-ratio", "0.5"),
            ("retry-budget-min-per-second", "0"),
            ("retry-budget-ttl", "30s"),
            ("qos-pool-window", "32"),
            ("qos-pool-probe-path", "/healthz"),
            ("qos-pool-probe", "traffic"),
            ("proximity-alpha", "0.8"),
        ]);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(s.latency_slo, Duration::from_millis(80));
        assert_eq!(s.slo_percentile, 99.5);
        assert_eq!(s.strategy, "round-robin");
        assert_eq!(s.timeout, Duration::from_secs(2));
        assert_eq!(s.connect_timeout, Duration::from_millis(250));
        assert_eq!(s.retries, 1);
        assert_eq!(s.retry_budget.ratio, 0.5);
        assert_eq!(s.retry_budget.min_per_second, 0);
        assert_eq!(s.retry_budget.ttl, Duration::from_secs(30));
        assert_eq!(s.qos_pool.window, 32);
        assert_eq!(s.qos_pool.probe_path, "/healthz");
        assert_eq!(s.qos_pool.probe, ProbeShape::Traffic);
        assert_eq!(s.param("proximity", "alpha"), Some("0.8"));
    }

    #[test]
    fn a_latency_slo_beyond_what_the_estimator_tells_apart_keeps_the_default() {
        let (s, errors) = ServiceSettings::from_pairs([("latency-slo", "120m")]);
        assert_eq!(s.latency_slo, ServiceSettings::default().latency_slo);
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0].expected.contains("at most 60m"),
            "{:?}",
            errors[0]
        );
        let (s, errors) = ServiceSettings::from_pairs([("latency-slo", "60m")]);
        assert_eq!(
            (s.latency_slo, errors.len()),
            (Duration::from_secs(3600), 0)
        );
    }

    #[test]
    fn invalid_values_keep_defaults_and_name_the_key() {
        let (s, errors) = ServiceSettings::from_pairs([
            ("latency-slo", "80"),
            ("slo-percentile", "150"),
            ("retries", "-1"),
            ("retry-budget-ratio", "-0.1"),
            ("retry-budget-min-per-second", "ten"),
            ("retry-budget-ttl", "1h"),
            ("qos-pool-probe", "GET"),
            ("bogus", "x"),
            ("latency-sloo", "80ms"),
        ]);
        let d = ServiceSettings::default();
        assert_eq!(s.latency_slo, d.latency_slo);
        assert_eq!(s.slo_percentile, d.slo_percentile);
        assert_eq!(s.retries, d.retries);
        assert_eq!(s.retry_budget, d.retry_budget);
        let keys: Vec<_> = errors.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "latency-slo",
                "slo-percentile",
                "retries",
                "retry-budget-ratio",
                "retry-budget-min-per-second",
                "retry-budget-ttl",
                "qos-pool-probe",
                "bogus",
                "latency-sloo"
            ]
        );
        assert!(errors[0].to_string().contains("80ms"), "{}", errors[0]);
    }

    #[test]
    fn annotations_use_the_prefix() {
        let (s, errors) = ServiceSettings::from_annotations([
            ("proxima.io/latency-slo", "50ms"),
            ("proxima.io/enabled", "true"),
            ("kubectl.kubernetes.io/last-applied-configuration", "{}"),
        ]);
        assert!(errors.is_empty());
        assert_eq!(s.latency_slo, Duration::from_millis(50));
    }

    #[test]
    fn grpc_failure_codes_take_numbers_and_names() {
        let default = GrpcCodes::default();
        for code in [2, 4, 8, 13, 14] {
            assert!(default.contains(code), "{code}");
        }
        for code in [0, 1, 3, 5, 12, 16, 40] {
            assert!(!default.contains(code), "{code}");
        }
        let (s, errors) =
            ServiceSettings::from_pairs([("grpc-failure-codes", "14, unavailable,5")]);
        assert!(errors.is_empty(), "{errors:?}");
        assert!(s.grpc_failure_codes.contains(14) && s.grpc_failure_codes.contains(5));
        assert!(!s.grpc_failure_codes.contains(4));
        for bad in ["17", "UNAVAILABLEX", "", "14,"] {
            let (s, errors) = ServiceSettings::from_pairs([("grpc-failure-codes", bad)]);
            assert_eq!(errors.len(), 1, "{bad:?}");
            assert_eq!(s.grpc_failure_codes, GrpcCodes::default());
        }
        let (s, _) = ServiceSettings::from_pairs([("grpc-failure-codes", "none")]);
        assert!((0..17).all(|c| !s.grpc_failure_codes.contains(c)));
    }

    #[test]
    fn failure_statuses_accept_classes_ranges_and_codes() {
        let parse = |v: &str| {
            let (s, errors) = ServiceSettings::from_pairs([("failure-status", v)]);
            (s.failure_status, errors)
        };
        let (default, _) = parse("5xx");
        assert_eq!(default, StatusSet::default());
        assert!(default.contains(500) && default.contains(599) && !default.contains(429));
        let (set, errors) = parse("5xx, 429");
        assert!(errors.is_empty(), "{errors:?}");
        assert!(set.contains(503) && set.contains(429) && !set.contains(404));
        let (set, _) = parse("500-503,4XX");
        assert!(set.contains(502) && !set.contains(504) && set.contains(404));
        let (set, _) = parse("none");
        assert!(!set.contains(500));
        for bad in ["", "6xx", "5x", "600", "503-500", "5xx,,429", "abc", "99"] {
            let (set, errors) = parse(bad);
            assert_eq!(set, StatusSet::default(), "{bad:?} falls back to 5xx");
            assert_eq!(errors.len(), 1, "{bad:?}");
            assert_eq!(errors[0].key, "failure-status");
        }
    }

    #[test]
    fn ejection_and_slow_start_settings() {
        let (s, errors) = ServiceSettings::from_pairs([
            ("qos-pool-eject-after", "7"),
            ("qos-pool-max-ejection-percent", "34%"),
            ("qos-pool-slow-start", "0s"),
            ("qos-pool-verdict-confidence", "99%"),
            ("qos-pool-probe-idle-after", "0s"),
            ("qos-pool-hedge", "off"),
        ]);
        assert!(errors.is_empty(), "{errors:?}");
        assert!(!s.qos_pool.hedge);
        assert_eq!(s.qos_pool.probe_idle_after, Duration::ZERO);
        assert_eq!(s.qos_pool.eject_after, 7);
        assert_eq!(s.qos_pool.max_ejection_percent, 34.0);
        assert_eq!(s.qos_pool.slow_start, Duration::ZERO);
        assert_eq!(s.qos_pool.verdict_confidence, 99.0);
        let (s, errors) = ServiceSettings::from_pairs([
            ("qos-pool-eject-after", "-1"),
            ("qos-pool-max-ejection-percent", "101"),
            ("qos-pool-slow-start", "10"),
            ("qos-pool-verdict-confidence", "100"),
            ("qos-pool-probe-idle-after", "soon"),
            ("qos-pool-hedge", "yes"),
        ]);
        assert_eq!(errors.len(), 6);
        assert_eq!(s.qos_pool, QosPoolParams::default());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_duration("250us"), Some(Duration::from_micros(250)));
        assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("80"), None);
        assert_eq!(parse_duration("ms"), None);
        assert_eq!(parse_duration("-1s"), None);
        assert_eq!(parse_duration("1e400s"), None);
    }
}
