//! Gauges that describe the routing table, computed at scrape time.
//!
//! The table changes on discovery updates and on pool admissions/evictions; rather than
//! hook every one of those, the gauges are read from the current snapshot whenever
//! `/metrics` is scraped, which is exactly when their values are looked at. Being built
//! from the snapshot, they never outlive a service or endpoint that left the table.
//!
//! | metric | labels | meaning |
//! |---|---|---|
//! | `proxima_pool_size` | service | endpoints in the QoS pool |
//! | `proxima_endpoints` | service, state | endpoints outside the pool by [`STATES`]: `evicted` (eligible by their conditions, out of the pool), `not_ready` (not eligible); the pool's own are `proxima_pool_size` |
//! | `proxima_endpoint_in_pool` | service, endpoint | 1 while the endpoint is in the service's QoS pool, else 0 |
//! | `proxima_endpoint_in_flight` | service, endpoint | requests (and probes) outstanding to it through this proxy |
//! | `proxima_endpoint_estimate_seconds` | service, endpoint | its predicted response time at the service's SLO percentile, from its fresh samples: `NaN` before it has any, `+Inf` when that rank is a failure |
//!
//! These are the per-pod series of the default metric set: a few gauges per pod, no
//! per-pod histogram (see `proxima_proxy::Metrics` for the counters), so that `/metrics`
//! stays small at a thousand pods.

use prometheus::core::{Collector, Desc};
use prometheus::proto::{Gauge, LabelPair, Metric, MetricFamily, MetricType};
use proxima_core::{Router, Table};
use std::sync::Arc;

/// The `state` label values of `proxima_endpoints`. Eligible endpoints are the pool's
/// plus the evicted ones, and the pool's are `proxima_pool_size`: neither is repeated.
pub const STATES: [&str; 2] = ["evicted", "not_ready"];

const POOL_SIZE: (&str, &str) = (
    "proxima_pool_size",
    "Endpoints in the service's QoS pool (warming up or meeting the latency SLO).",
);
const ENDPOINTS: (&str, &str) = (
    "proxima_endpoints",
    "Endpoints of the service outside its QoS pool, by state: evicted (eligible by its \
     conditions, outside the pool), not_ready (not eligible).",
);
const IN_POOL: (&str, &str) = (
    "proxima_endpoint_in_pool",
    "1 while the endpoint is in the service's QoS pool, else 0.",
);
const IN_FLIGHT: (&str, &str) = (
    "proxima_endpoint_in_flight",
    "Requests and probes outstanding to the endpoint through this proxy.",
);
const ESTIMATE: (&str, &str) = (
    "proxima_endpoint_estimate_seconds",
    "Predicted response time of the endpoint at the service's SLO percentile (NaN before \
     its first sample, +Inf when that rank is a failure).",
);

/// The routing-table gauges (see the module docs), a [`Collector`] that reads the
/// router's current table whenever the registry is gathered.
#[derive(Debug)]
pub struct TableGauges {
    router: Arc<Router>,
    descs: Vec<Desc>,
}

impl TableGauges {
    /// Register the gauges of `router`'s table on `registry`.
    pub fn register(
        registry: &prometheus::Registry,
        router: Arc<Router>,
    ) -> prometheus::Result<()> {
        registry.register(Box::new(Self::new(router)?))
    }

    /// The gauges of `router`'s table, not yet registered (see [`TableGauges::register`]).
    pub fn new(router: Arc<Router>) -> prometheus::Result<Self> {
        let desc = |(name, help): (&str, &str), labels: &[&str]| {
            Desc::new(
                name.to_string(),
                help.to_string(),
                labels.iter().map(|l| l.to_string()).collect(),
                Default::default(),
            )
        };
        let descs = vec![
            desc(POOL_SIZE, &["service"])?,
            desc(ENDPOINTS, &["service", "state"])?,
            desc(IN_POOL, &["endpoint", "service"])?,
            desc(IN_FLIGHT, &["endpoint", "service"])?,
            desc(ESTIMATE, &["endpoint", "service"])?,
        ];
        Ok(Self { router, descs })
    }
}

fn family((name, help): (&str, &str), capacity: usize) -> MetricFamily {
    let mut family = MetricFamily::default();
    family.set_name(name.to_string());
    family.set_help(help.to_string());
    family.set_field_type(MetricType::GAUGE);
    family.mut_metric().reserve(capacity);
    family
}

fn label(name: &str, value: &str) -> LabelPair {
    let mut pair = LabelPair::default();
    pair.set_name(name.to_string());
    pair.set_value(value.to_string());
    pair
}

/// A gauge sample with `labels`, which must be in the order of the family's label names
/// (alphabetical, as the text format expects).
fn gauge(labels: Vec<LabelPair>, value: f64) -> Metric {
    let mut gauge = Gauge::default();
    gauge.set_value(value);
    let mut metric = Metric::default();
    metric.set_label(labels);
    metric.set_gauge(gauge);
    metric
}

/// The estimate in seconds as exported: `NaN` unknown, `+Inf` a failure.
fn estimate_seconds(score_micros: u64) -> f64 {
    match score_micros {
        0 => f64::NAN,
        u64::MAX => f64::INFINITY,
        micros => micros as f64 / 1e6,
    }
}

/// The families of `table`.
pub fn families(table: &Table) -> Vec<MetricFamily> {
    let services = table.services.len();
    let endpoints: usize = table.services.values().map(|r| r.endpoints.len()).sum();
    let mut pool_size = family(POOL_SIZE, services);
    let mut by_state = family(ENDPOINTS, services * STATES.len());
    let mut in_pool = family(IN_POOL, endpoints);
    let mut in_flight = family(IN_FLIGHT, endpoints);
    let mut estimate = family(ESTIMATE, endpoints);
    let mut member = Vec::new();
    for route in table.services.values() {
        let service = route.key().to_string();
        let pool = route.pool();
        let eligible = route.eligible();
        member.clear();
        member.resize(route.endpoints.len(), false);
        for &i in pool.iter() {
            if let Some(m) = member.get_mut(i) {
                *m = true;
            }
        }
        let evicted = eligible.iter().filter(|&&i| !member[i]).count();
        let counts = [evicted, route.endpoints.len() - eligible.len()];
        pool_size
            .mut_metric()
            .push(gauge(vec![label("service", &service)], pool.len() as f64));
        for (state, count) in STATES.iter().zip(counts) {
            by_state.mut_metric().push(gauge(
                vec![label("service", &service), label("state", state)],
                count as f64,
            ));
        }
        for (i, e) in route.endpoints.iter().enumerate() {
            let labels = || {
                vec![
                    label("endpoint", &e.endpoint.id),
                    label("service", &service),
                ]
            };
            in_pool
                .mut_metric()
                .push(gauge(labels(), f64::from(u8::from(member[i]))));
            in_flight
                .mut_metric()
                .push(gauge(labels(), f64::from(e.state.in_flight())));
            estimate
                .mut_metric()
                .push(gauge(labels(), estimate_seconds(e.state.score_micros())));
        }
    }
    vec![pool_size, by_state, in_pool, in_flight, estimate]
}

impl Collector for TableGauges {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        families(&self.router.table())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimates_are_seconds_with_unknown_and_failure_marked() {
        assert!(estimate_seconds(0).is_nan());
        assert_eq!(estimate_seconds(u64::MAX), f64::INFINITY);
        assert_eq!(estimate_seconds(12_500), 0.0125);
    }
}
