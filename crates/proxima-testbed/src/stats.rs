//! What a run measured: response times as the clients saw them, the share that met
//! the SLO, requests per instance (overall and per phase between events), throughput.
//!
//! Percentiles are nearest-rank over every request of the group (failed ones included,
//! with the time they took to fail); a request meets the SLO when it succeeded (2xx)
//! within its service's `latency-slo`. A request the client gave up on after its
//! `timeout` is a failure of its own kind (`timeouts`), and so never within the SLO.
//! Throughput is requests per second between the first request sent and the last
//! response read.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::client::RequestRecord;

/// Numbers of one group of requests.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Summary {
    /// Requests in the group.
    pub requests: u64,
    /// 2xx answers.
    pub succeeded: u64,
    /// Requests without a 2xx answer: errors, other statuses, timeouts.
    pub failed: u64,
    /// Failed requests the client gave up on after its `timeout` (part of `failed`).
    pub timeouts: u64,
    /// Requests that succeeded (2xx) within their service's `latency-slo`.
    pub slo_met: u64,
    /// `slo_met / requests`, in percent.
    pub slo_share: f64,
    /// Requests that some instance could have answered within the SLO when they were
    /// sent (see `Cluster::best_response`): what any router could reach.
    pub reachable: u64,
    /// Of those, the ones that did meet the SLO, in percent of `reachable` (100 when
    /// there were none): the share of what could be reached that was.
    pub reachable_share: f64,
    /// Mean response time, ms (failed requests with the time they took to fail).
    pub avg_ms: f64,
    /// Median response time, ms (nearest rank).
    pub p50_ms: f64,
    /// 95th percentile response time, ms (nearest rank).
    pub p95_ms: f64,
    /// 99th percentile response time, ms (nearest rank).
    pub p99_ms: f64,
    /// Slowest response time, ms.
    pub max_ms: f64,
    /// Requests per second between the first request sent and the last response read.
    pub throughput: f64,
    /// That span, s.
    pub duration_s: f64,
}

/// The time of `records` sorted ascending, at percentile `p` (nearest rank).
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

impl Summary {
    /// Summarise `records`; `slo` gives each record's service SLO.
    pub fn of<'a>(
        records: impl IntoIterator<Item = &'a RequestRecord>,
        slo: &dyn Fn(&RequestRecord) -> Duration,
    ) -> Self {
        let records: Vec<&RequestRecord> = records.into_iter().collect();
        let n = records.len() as u64;
        if n == 0 {
            return Summary::default();
        }
        let mut times: Vec<Duration> = records.iter().map(|r| r.latency).collect();
        times.sort();
        let succeeded = records.iter().filter(|r| r.succeeded()).count() as u64;
        let timeouts = records.iter().filter(|r| r.timed_out).count() as u64;
        let slo_met = records
            .iter()
            .filter(|r| r.succeeded() && r.latency <= slo(r))
            .count() as u64;
        let reachable = records.iter().filter(|r| r.reachable).count() as u64;
        let reachable_met = records
            .iter()
            .filter(|r| r.reachable && r.succeeded() && r.latency <= slo(r))
            .count() as u64;
        let total: Duration = times.iter().sum();
        let first = records.iter().map(|r| r.start).min().unwrap_or_default();
        let last = records
            .iter()
            .map(|r| r.start + r.latency)
            .max()
            .unwrap_or_default();
        let span = last.saturating_sub(first).as_secs_f64();
        Summary {
            requests: n,
            succeeded,
            failed: n - succeeded,
            timeouts,
            slo_met,
            slo_share: (slo_met as f64 * 100.0 / n as f64 * 1e3).round() / 1e3,
            reachable,
            reachable_share: if reachable == 0 {
                100.0
            } else {
                (reachable_met as f64 * 100.0 / reachable as f64 * 1e3).round() / 1e3
            },
            avg_ms: ms(total / u32::try_from(n).unwrap_or(u32::MAX)),
            p50_ms: ms(percentile(&times, 50.0)),
            p95_ms: ms(percentile(&times, 95.0)),
            p99_ms: ms(percentile(&times, 99.0)),
            max_ms: ms(*times.last().unwrap_or(&Duration::ZERO)),
            throughput: if span > 0.0 {
                (n as f64 / span * 10.0).round() / 10.0
            } else {
                0.0
            },
            duration_s: (span * 1e3).round() / 1e3,
        }
    }
}

/// The response time at percentile `p` when failed requests count as never answered:
/// `None` when failures reach into that percentile.
pub fn percentile_with_failures<'a>(
    records: impl IntoIterator<Item = &'a RequestRecord>,
    p: f64,
) -> Option<Duration> {
    let mut times: Vec<Option<Duration>> = records
        .into_iter()
        .map(|r| r.succeeded().then_some(r.latency))
        .collect();
    if times.is_empty() {
        return Some(Duration::ZERO);
    }
    // `None` (failed) sorts first; move failures to the end.
    times.sort_by_key(|t| t.map_or((1, Duration::ZERO), |d| (0, d)));
    let rank = ((p / 100.0) * times.len() as f64).ceil() as usize;
    times[rank.clamp(1, times.len()) - 1]
}

/// One service's numbers in one run (or one phase of it), against its own objective.
#[derive(Clone, Debug, Serialize)]
pub struct ServiceSummary {
    /// `name.namespace`.
    pub service: String,
    /// The service's `latency-slo` (ms) and `slo-percentile` (%), strategy
    /// overrides included.
    pub slo_ms: f64,
    /// The service's `slo-percentile` (%), strategy overrides included.
    pub percentile: f64,
    /// Response time at the service's own percentile (ms), failures counted as never
    /// answered; `None` when failures reach into it.
    pub at_percentile_ms: Option<f64>,
    /// The service's own percentile met its own SLO (and it had requests).
    pub met: bool,
    /// Response time at the service's own percentile over its *reachable* requests
    /// (those some instance could have answered within the SLO when they were sent),
    /// ms; `None` when failures reach into it.
    pub at_percentile_reachable_ms: Option<f64>,
    /// The service's own percentile over its reachable requests met its SLO: what a
    /// router can be held to when some clients have no pod near enough (true when none
    /// of its requests was reachable).
    pub met_where_reachable: bool,
    /// Every request of the service (or of the phase).
    pub summary: Summary,
    /// Requests per instance of the service (`error` last, if any).
    pub per_instance: Vec<(String, u64)>,
    /// max / min requests over the service's instances that took at least 1% of its
    /// requests (the members of its pool that were used).
    pub spread: Option<f64>,
}

impl ServiceSummary {
    /// `records` are the service's requests; `instances` its instances' indices
    /// and names in the run's instance list.
    pub fn of(
        service: String,
        slo: Duration,
        percentile: f64,
        records: &[&RequestRecord],
        instances: &[(u16, String)],
    ) -> Self {
        let summary = Summary::of(records.iter().copied(), &|_| slo);
        let at = percentile_with_failures(records.iter().copied(), percentile);
        let reachable = records.iter().copied().filter(|r| r.reachable);
        let at_reachable = percentile_with_failures(reachable, percentile);
        let any_reachable = records.iter().any(|r| r.reachable);
        let mut counts: Vec<(String, u64)> =
            instances.iter().map(|(_, n)| (n.clone(), 0)).collect();
        let mut errors = 0;
        for r in records {
            match r
                .instance
                .and_then(|i| instances.iter().position(|(k, _)| *k == i))
            {
                Some(k) => counts[k].1 += 1,
                None => errors += 1,
            }
        }
        if errors > 0 {
            counts.push((ERROR_BUCKET.to_string(), errors));
        }
        ServiceSummary {
            service,
            slo_ms: ms(slo),
            percentile,
            at_percentile_ms: at.map(ms),
            met: summary.requests > 0 && at.is_some_and(|t| t <= slo),
            at_percentile_reachable_ms: at_reachable.filter(|_| any_reachable).map(ms),
            met_where_reachable: !any_reachable || at_reachable.is_some_and(|t| t <= slo),
            spread: spread(&counts, summary.requests),
            summary,
            per_instance: counts,
        }
    }
}

/// One service in one run: the whole run, and each phase.
#[derive(Clone, Debug, Serialize)]
pub struct ServiceReport {
    /// The whole run.
    #[serde(flatten)]
    pub all: ServiceSummary,
    /// Per phase, in phase order (named as in [`RunReport::phases`]).
    pub phases: Vec<(String, ServiceSummary)>,
}

/// Requests of one phase (between two events).
#[derive(Clone, Debug, Serialize)]
pub struct PhaseReport {
    /// Phase name: `T0` before the first event, then the name of the event that began it.
    pub name: String,
    /// When the phase began, from the start of the traffic (s).
    pub start_s: f64,
    /// Every request of the phase.
    pub summary: Summary,
    /// Requests per instance, in instance order; `error` counts answers without one.
    pub per_instance: BTreeMap<String, u64>,
}

/// What the nodes' proxies counted, summed over every node's Prometheus registry:
/// failed upstream attempts by kind (`proxima_upstream_errors_total`) and QoS-pool
/// membership changes (`proxima_pool_changes_total`). It shows how the proxies met
/// unreachable nodes: with packets dropped, a new connection's connect times out
/// (`connect`, then a retry elsewhere and the endpoint's cooldown) and a request on an
/// open connection runs into the service's `timeout` (`timeouts`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ProxyCounters {
    /// Connects that failed: refused, unreachable or over `connect-timeout`.
    pub connect_failures: u64,
    /// Attempts over the service's `timeout` (the client got 504).
    pub timeouts: u64,
    /// Connections that broke after the request was sent.
    pub resets: u64,
    /// Attempts whose pod answered with broken HTTP.
    pub protocol_errors: u64,
    /// Endpoints evicted from, and readmitted to, a QoS pool.
    pub evictions: u64,
    /// Endpoints readmitted to a QoS pool (counted with `evictions`).
    pub readmissions: u64,
    /// Background probes the proxies sent to pods (`proxima_probes_total`).
    pub probes: u64,
}

impl ProxyCounters {
    /// What was counted after `earlier` (a snapshot of the same counters).
    pub fn since(&self, earlier: &ProxyCounters) -> ProxyCounters {
        ProxyCounters {
            connect_failures: self
                .connect_failures
                .saturating_sub(earlier.connect_failures),
            timeouts: self.timeouts.saturating_sub(earlier.timeouts),
            resets: self.resets.saturating_sub(earlier.resets),
            protocol_errors: self.protocol_errors.saturating_sub(earlier.protocol_errors),
            evictions: self.evictions.saturating_sub(earlier.evictions),
            readmissions: self.readmissions.saturating_sub(earlier.readmissions),
            probes: self.probes.saturating_sub(earlier.probes),
        }
    }

    /// Whether nothing was counted.
    pub fn is_zero(&self) -> bool {
        *self == ProxyCounters::default()
    }
}

/// The proxies' counters of one phase (see [`ProxyCounters`]).
#[derive(Clone, Debug, Serialize)]
pub struct ProxyPhase {
    /// Phase name (as in [`RunReport::phases`]).
    pub phase: String,
    /// What was counted during the phase.
    #[serde(flatten)]
    pub counters: ProxyCounters,
}

/// Requests of one client.
#[derive(Clone, Debug, Serialize)]
pub struct ClientReport {
    /// Client name.
    pub name: String,
    /// Name of the client's node.
    pub node: String,
    /// `name.namespace` of its service.
    pub service: String,
    /// What its requests were: `http`, `grpc` (calls) or `websocket` (messages).
    pub protocol: crate::scenario::ClientProtocol,
    /// Connections to its node's proxy that carried an answer: one for `grpc` (every
    /// call shares it), one per worker for `websocket` unless sockets broke.
    pub connections: usize,
    /// Every request of the client.
    pub summary: Summary,
}

/// Everything measured in one run (one variant, one strategy).
#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    /// The scenario's name.
    pub scenario: String,
    /// The variant, empty when the file has none.
    pub variant: String,
    /// The strategy's name.
    pub strategy: String,
    /// The strategy spec's label (as in `--strategies`), ` #k` added for repeats.
    pub label: String,
    /// Every request of the run.
    pub summary: Summary,
    /// The latency SLO (ms) when every client's service has the same one.
    pub slo_ms: Option<f64>,
    /// Instances in scenario order with their request counts (`error` last, if any).
    pub per_instance: Vec<(String, u64)>,
    /// Each service against its own SLO and percentile, with its own spread.
    pub services: Vec<ServiceReport>,
    /// Services whose own percentile met their own SLO.
    pub services_met: usize,
    /// Services whose own percentile over their reachable requests met their SLO
    /// ([`ServiceSummary::met_where_reachable`]).
    pub services_met_where_reachable: usize,
    /// Every phase, from `T0` to the last event's.
    pub phases: Vec<PhaseReport>,
    /// Every client.
    pub clients: Vec<ClientReport>,
    /// Whether every proxy knew every peer's latency (and usage) before traffic began.
    pub warmed_up: bool,
    /// How busy the host was while the clients ran; `noisy` runs say as much about
    /// the machine as about the strategy.
    pub host: crate::host::HostReport,
    /// Which of `--repeat N` runs this is (1-based), and the label of the series of
    /// repeats it belongs to (its label without ` #k`).
    pub repeat: u32,
    /// The series of `--repeat` runs this belongs to: its label without ` #k`.
    pub series: String,
    /// The nodes' proxies' failed upstream attempts and pool changes while the clients
    /// ran, in all and per phase.
    pub proxy: ProxyCounters,
    /// The same counters per phase.
    pub proxy_phases: Vec<ProxyPhase>,
    /// Responses minus (requests per instance + errors): 0 when every request was
    /// counted exactly once.
    pub accounting_gap: i64,
    /// Every request, for the CSV files and plots.
    #[serde(skip)]
    pub records: Vec<RequestRecord>,
    /// Instance names in scenario order (the plots' series).
    #[serde(skip)]
    pub instance_names: Vec<String>,
    /// Each phase's name and start, from the start of the traffic.
    #[serde(skip)]
    pub phase_starts: Vec<(String, Duration)>,
    /// Index into `services` of each client's service.
    #[serde(skip)]
    pub client_service: Vec<usize>,
}

/// The median and range of a value over repeated runs.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Spread3 {
    /// The median.
    pub median: f64,
    /// The smallest value.
    pub min: f64,
    /// The largest value.
    pub max: f64,
}

impl Spread3 {
    /// The median, minimum and maximum of the finite `values` (rounded to 3 decimals);
    /// `None` when there are none.
    pub fn of(values: &[f64]) -> Option<Self> {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        let r = |x: f64| (x * 1e3).round() / 1e3;
        Some(Spread3 {
            median: r(median),
            min: r(v[0]),
            max: r(v[n - 1]),
        })
    }
}

/// One service of one series of repeated runs (`--repeat N`).
#[derive(Clone, Debug, Serialize)]
pub struct RepeatSummary {
    /// The variant, empty when the file has none.
    pub variant: String,
    /// The series' label.
    pub series: String,
    /// `name.namespace` of the service.
    pub service: String,
    /// Runs in the series.
    pub runs: usize,
    /// Runs whose own percentile met the SLO, and runs marked noisy.
    pub met: usize,
    /// Runs whose own percentile over the reachable requests met the SLO.
    pub met_where_reachable: usize,
    /// Runs whose host was noisy (see [`crate::host`]).
    pub noisy: usize,
    /// Share of requests that met the SLO, %.
    pub slo_share: Option<Spread3>,
    /// Share of the reachable requests that met the SLO, % ([`Summary::reachable_share`]).
    pub reachable_share: Option<Spread3>,
    /// Over the runs where failures did not reach into the percentile.
    pub at_percentile_ms: Option<Spread3>,
    /// 99th percentile response time, ms.
    pub p99_ms: Option<Spread3>,
    /// max / min requests per used instance (see [`ServiceSummary::spread`]).
    pub spread: Option<Spread3>,
}

/// Median and range per series and service, over runs with the same `series`.
pub fn repeat_summaries(runs: &[RunReport]) -> Vec<RepeatSummary> {
    let mut keys: Vec<(&str, &str)> = Vec::new();
    for r in runs {
        if !keys.contains(&(r.variant.as_str(), r.series.as_str())) {
            keys.push((&r.variant, &r.series));
        }
    }
    let mut out = Vec::new();
    for (variant, series) in keys {
        let group: Vec<&RunReport> = runs
            .iter()
            .filter(|r| r.variant == variant && r.series == series)
            .collect();
        let Some(first) = group.first() else { continue };
        for (k, svc) in first.services.iter().enumerate() {
            let each: Vec<&ServiceSummary> = group
                .iter()
                .filter_map(|r| r.services.get(k))
                .map(|s| &s.all)
                .collect();
            let values = |f: &dyn Fn(&ServiceSummary) -> Option<f64>| -> Vec<f64> {
                each.iter().filter_map(|s| f(s)).collect()
            };
            out.push(RepeatSummary {
                variant: variant.to_string(),
                series: series.to_string(),
                service: svc.all.service.clone(),
                runs: group.len(),
                met: each.iter().filter(|s| s.met).count(),
                met_where_reachable: each.iter().filter(|s| s.met_where_reachable).count(),
                noisy: group.iter().filter(|r| r.host.noisy).count(),
                slo_share: Spread3::of(&values(&|s| Some(s.summary.slo_share))),
                reachable_share: Spread3::of(&values(&|s| Some(s.summary.reachable_share))),
                at_percentile_ms: Spread3::of(&values(&|s| s.at_percentile_ms)),
                p99_ms: Spread3::of(&values(&|s| Some(s.summary.p99_ms))),
                spread: Spread3::of(&values(&|s| s.spread)),
            });
        }
    }
    out
}

/// Name of the bucket for answers that came from no instance.
pub const ERROR_BUCKET: &str = "error";

/// Count requests per instance name (in `names` order), errors in [`ERROR_BUCKET`].
pub fn per_instance<'a>(
    records: impl IntoIterator<Item = &'a RequestRecord>,
    names: &[String],
) -> Vec<(String, u64)> {
    let mut counts = vec![0u64; names.len()];
    let mut errors = 0;
    for r in records {
        match r.instance.and_then(|i| counts.get_mut(usize::from(i))) {
            Some(c) => *c += 1,
            None => errors += 1,
        }
    }
    let mut out: Vec<(String, u64)> = names.iter().cloned().zip(counts).collect();
    if errors > 0 {
        out.push((ERROR_BUCKET.to_string(), errors));
    }
    out
}

/// max / min over the instances with at least 1% of `total` requests.
pub fn spread(per_instance: &[(String, u64)], total: u64) -> Option<f64> {
    let busy: Vec<u64> = per_instance
        .iter()
        .filter(|(name, n)| name != ERROR_BUCKET && *n * 100 >= total && *n > 0)
        .map(|(_, n)| *n)
        .collect();
    let (min, max) = (busy.iter().min()?, busy.iter().max()?);
    Some((*max as f64 / *min as f64 * 1000.0).round() / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(seq: u64, ms: u64, status: u16, instance: Option<u16>) -> RequestRecord {
        RequestRecord {
            reachable: true,
            client: 0,
            seq,
            phase: 0,
            start: Duration::from_millis(seq * 10),
            latency: Duration::from_millis(ms),
            status,
            timed_out: false,
            instance,
            grpc_status: None,
        }
    }

    #[test]
    fn summaries_count_slo_and_percentiles() {
        let records: Vec<RequestRecord> = (1..=100)
            .map(|i| {
                record(
                    i,
                    i,
                    if i == 100 { 502 } else { 200 },
                    (i != 100).then_some((i % 2) as u16),
                )
            })
            .collect();
        let s = Summary::of(&records, &|_| Duration::from_millis(80));
        assert_eq!(s.requests, 100);
        assert_eq!(s.failed, 1);
        assert_eq!(s.slo_met, 80);
        assert_eq!(s.slo_share, 80.0);
        assert_eq!(s.p50_ms, 50.0);
        assert_eq!(s.p95_ms, 95.0);
        assert_eq!(s.p99_ms, 99.0);
        assert_eq!(s.avg_ms, 50.5);
        // From 10 ms (first sent) to 1000 + 100 ms (last answered).
        assert_eq!(s.duration_s, 1.09);
        let names = vec!["a".to_string(), "b".to_string()];
        let counts = per_instance(&records, &names);
        assert_eq!(
            counts,
            [("a".into(), 49), ("b".into(), 50), (ERROR_BUCKET.into(), 1)]
        );
        assert_eq!(spread(&counts, 100), Some(1.02));
        assert_eq!(Summary::of(&[], &|_| Duration::ZERO), Summary::default());
    }

    #[test]
    fn each_service_is_judged_by_its_own_percentile_and_slo() {
        // 100 requests: 1..=96 ms answered by instance 0 or 1, then 4 failures.
        let records: Vec<RequestRecord> = (1..=100)
            .map(|i| {
                let mut r = record(i, i.min(96), 200, Some((i % 2) as u16));
                if i > 96 {
                    r.status = 0;
                    r.timed_out = i > 98;
                    r.instance = None;
                }
                r
            })
            .collect();
        let refs: Vec<&RequestRecord> = records.iter().collect();
        let members = [(0u16, "a".to_string()), (1u16, "b".to_string())];
        let p95 = ServiceSummary::of(
            "api.default".into(),
            Duration::from_millis(95),
            95.0,
            &refs,
            &members,
        );
        assert_eq!(p95.at_percentile_ms, Some(95.0));
        assert!(p95.met);
        assert_eq!(p95.summary.failed, 4);
        assert_eq!(p95.summary.timeouts, 2);
        assert_eq!(
            p95.per_instance,
            [("a".into(), 48), ("b".into(), 48), (ERROR_BUCKET.into(), 4)]
        );
        assert_eq!(p95.spread, Some(1.0));
        // The same requests against p99: failures reach into it, so it is not met.
        let p99 = ServiceSummary::of(
            "api.default".into(),
            Duration::from_secs(10),
            99.0,
            &refs,
            &members,
        );
        assert_eq!(p99.at_percentile_ms, None);
        assert!(!p99.met);
        // A tighter SLO at the same percentile is missed.
        let tight = ServiceSummary::of(
            "api.default".into(),
            Duration::from_millis(90),
            95.0,
            &refs,
            &members,
        );
        assert!(!tight.met);
        // No requests: nothing met, nothing spread.
        let none = ServiceSummary::of("x".into(), Duration::from_millis(1), 95.0, &[], &members);
        assert!(!none.met);
        assert_eq!(none.spread, None);
    }

    #[test]
    fn a_service_is_also_judged_on_the_requests_some_instance_could_serve_in_time() {
        // 100 requests, 1..=100 ms; the 10 slowest came from a client no instance could
        // serve within 90 ms: over all, p95 is 95 ms (missed); over the 90 reachable
        // ones, 86 ms (met).
        let records: Vec<RequestRecord> = (1..=100)
            .map(|i| RequestRecord {
                reachable: i <= 90,
                ..record(i, i, 200, Some(0))
            })
            .collect();
        let refs: Vec<&RequestRecord> = records.iter().collect();
        let members = [(0u16, "a".to_string())];
        let slo = Duration::from_millis(90);
        let v = ServiceSummary::of("api.default".into(), slo, 95.0, &refs, &members);
        assert_eq!((v.at_percentile_ms, v.met), (Some(95.0), false));
        assert_eq!(v.at_percentile_reachable_ms, Some(86.0));
        assert!(v.met_where_reachable);
        // A failure among the reachable ones at the percentile: not met.
        let mut failing = records.clone();
        for r in failing.iter_mut().take(5) {
            r.status = 0;
        }
        let refs: Vec<&RequestRecord> = failing.iter().collect();
        let v = ServiceSummary::of("api.default".into(), slo, 95.0, &refs, &members);
        assert_eq!(v.at_percentile_reachable_ms, None);
        assert!(!v.met_where_reachable);
        // None reachable: nothing a router could have done, so nothing missed.
        let far: Vec<RequestRecord> = records
            .iter()
            .map(|r| RequestRecord {
                reachable: false,
                ..*r
            })
            .collect();
        let refs: Vec<&RequestRecord> = far.iter().collect();
        let v = ServiceSummary::of("api.default".into(), slo, 95.0, &refs, &members);
        assert_eq!(v.at_percentile_reachable_ms, None);
        assert!(v.met_where_reachable);
    }

    #[test]
    fn repeats_report_the_median_and_the_range() {
        let s = Spread3::of(&[3.0, 1.0, 2.0, f64::INFINITY]).unwrap();
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
        let even = Spread3::of(&[4.0, 1.0, 2.0, 3.0]).unwrap();
        assert_eq!(even.median, 2.5);
        assert_eq!(Spread3::of(&[]), None);
    }
}
