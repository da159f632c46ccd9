//! The router's side of what neighbouring proxies share (see [`crate::neighbours`] for
//! the rules): [`Router::hear`] takes in a round of their reports, [`Router::digest`]
//! says what this proxy knows for them.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::endpoint::{Admission, EvictionCause};
use crate::model::{EndpointId, ServiceKey};
use crate::neighbours::{
    is_news, Hearsay, PodReport, ProcessingReport, VerdictKind, VerdictReport,
};
use crate::router::{Router, ServiceRoute, Table};

/// What hearing a round of reports did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct HearReport {
    /// Reports about pods this proxy routes (the rest are dropped).
    pub kept: usize,
    /// Pods that became suspect: service, pod, and the node whose proxy saw them fail.
    pub suspected: Vec<(ServiceKey, EndpointId, String)>,
    /// Evicted pods whose next probe was brought forward by a neighbour's "back".
    pub probes_forward: usize,
    /// Processing estimates taken in (new, or better than the one held).
    pub estimates: usize,
}

/// What this proxy tells its neighbours, in the order to send it: `news` (verdicts that
/// hold wherever the client stands, its own before relayed ones, newest first) before
/// `estimates` (processing estimates, its own before relayed ones, each part in a
/// stable order so that a caller that sends a slice at a time covers them all).
#[derive(Debug, Default, PartialEq)]
pub struct Digest {
    /// Failure verdicts and returns.
    pub news: Vec<PodReport>,
    /// Processing estimates alone.
    pub estimates: Vec<PodReport>,
}

impl Router {
    /// Take in neighbours' `reports`, received at `now` (see [`crate::neighbours`]): keep
    /// what concerns pods this proxy routes, suspect those a neighbour saw fail after
    /// this proxy last heard from them, probe soon those a neighbour saw come back, and
    /// republish the pools. Reports that originate at this proxy's own node are ignored.
    pub fn hear(&self, reports: &[PodReport], now: Instant) -> HearReport {
        let mut out = HearReport::default();
        let local = self.local_node().map(str::to_string);
        self.update_environment_in(|env, table| {
            let hearsay = Arc::make_mut(&mut env.hearsay);
            let mut ids = RouteIds::default();
            for report in reports {
                if local.as_deref() == Some(report.origin.as_str()) {
                    continue;
                }
                let Some((route, index)) = ids.find(table, &report.service, &report.pod) else {
                    continue;
                };
                out.kept += 1;
                let max_age = route.settings().qos_pool.max_age;
                let merged = hearsay.merge(report, now, max_age);
                out.estimates += usize::from(merged.processing);
                if merged.verdict && route.strategy.probes_evicted() {
                    act_on_verdict(hearsay, route, index, now, &mut out);
                }
            }
            forget_unrouted(hearsay, table, now);
        });
        out
    }

    /// What this proxy knows for its neighbours at `now` (see [`Digest`]). Empty when it
    /// does not know its own node (a report must name where it was measured).
    pub fn digest(&self, now: Instant) -> Digest {
        let Some(local) = self.local_node() else {
            return Digest::default();
        };
        let table = self.table();
        let mut own = Vec::new();
        let mut services: Vec<&Arc<ServiceRoute>> = table.services.values().collect();
        services.sort_by(|a, b| a.key().cmp(b.key()));
        for route in services.into_iter().filter(|r| r.strategy.probes_evicted()) {
            for &index in route.eligible() {
                own.extend(own_report(route, index, &table, local, now));
            }
        }
        // What this proxy measured itself it says itself; the rest it passes on.
        let own_verdicts: HashSet<(&ServiceKey, &str)> = own
            .iter()
            .filter(|r| r.verdict.is_some())
            .map(|r| (&r.service, r.pod.as_str()))
            .collect();
        let own_estimates: HashSet<(&ServiceKey, &str)> = own
            .iter()
            .filter(|r| r.processing.is_some())
            .map(|r| (&r.service, r.pod.as_str()))
            .collect();
        let mut relayed: Vec<PodReport> = table
            .environment
            .hearsay
            .relayed(now)
            .map(|mut r| {
                let pod = (&r.service, r.pod.as_str());
                let verdict_own = own_verdicts.contains(&pod);
                let processing_own = own_estimates.contains(&pod);
                r.verdict = r.verdict.filter(|v| v.kind.location_free() && !verdict_own);
                r.processing = r.processing.filter(|_| !processing_own);
                r
            })
            .filter(|r| r.verdict.is_some() || r.processing.is_some())
            .collect();
        relayed.sort_by(|a, b| (&a.service, &a.pod).cmp(&(&b.service, &b.pod)));
        let (mut news, own_estimates): (Vec<_>, Vec<_>) =
            own.into_iter().partition(|r| r.verdict.is_some());
        let (mut relayed_news, relayed_estimates): (Vec<_>, Vec<_>) =
            relayed.into_iter().partition(|r| r.verdict.is_some());
        let newest_first = |r: &PodReport| r.verdict.map_or(Duration::MAX, |v| v.age);
        news.sort_by_key(newest_first);
        relayed_news.sort_by_key(newest_first);
        news.extend(relayed_news);
        Digest {
            news,
            estimates: own_estimates.into_iter().chain(relayed_estimates).collect(),
        }
    }
}

/// Endpoint indices by id, built for a service the first time a report names it.
#[derive(Default)]
struct RouteIds<'t> {
    by_service: HashMap<&'t ServiceKey, HashMap<&'t str, usize>>,
}

impl<'t> RouteIds<'t> {
    fn find(
        &mut self,
        table: &'t Table,
        service: &ServiceKey,
        pod: &str,
    ) -> Option<(&'t ServiceRoute, usize)> {
        let (key, route) = table.services.get_key_value(service)?;
        let ids = self.by_service.entry(key).or_insert_with(|| {
            route
                .endpoints
                .iter()
                .enumerate()
                .map(|(i, e)| (e.endpoint.id.as_str(), i))
                .collect()
        });
        let index = *ids.get(pod)?;
        Some((route, index))
    }
}

/// Suspect or probe soon the pod at `index` on the verdict just merged for it.
fn act_on_verdict(
    hearsay: &Hearsay,
    route: &ServiceRoute,
    index: usize,
    now: Instant,
    out: &mut HearReport,
) {
    let endpoint = &route.endpoints[index];
    let Some(verdict) = hearsay
        .get(route.key(), &endpoint.endpoint.id)
        .and_then(|h| h.verdict.as_ref())
    else {
        return;
    };
    match verdict.kind {
        VerdictKind::Back => {
            out.probes_forward += usize::from(endpoint.state.probe_soon(verdict.at, now));
        }
        // Suspicion counts against the service's ejection cap, as this proxy's own
        // ejections do: a fault every pod shares, or one pod's overload reported by
        // every proxy at once, must not empty the pool through neighbours' reports.
        kind if kind.location_free()
            && route.out_for_failures() < route.ejection_cap()
            && endpoint.state.suspect(verdict.at, now) =>
        {
            out.suspected.push((
                route.key().clone(),
                endpoint.endpoint.id.clone(),
                verdict.origin.clone(),
            ));
        }
        _ => {}
    }
}

/// Drop what is stale and what concerns pods this proxy no longer routes.
fn forget_unrouted(hearsay: &mut Hearsay, table: &Table, now: Instant) {
    let mut ids = RouteIds::default();
    hearsay.retain(
        now,
        |service| {
            table
                .services
                .get(service)
                .map(|r| r.settings().qos_pool.max_age)
        },
        |service, pod| ids.find(table, service, pod).is_some(),
    );
}

/// This proxy's own report of the pod at `index`, if it has anything to say: its
/// failure verdict (for as long as the pod stays out) or its return (for
/// [`VERDICT_NEWS`](crate::neighbours::VERDICT_NEWS)), and its processing-time estimate when it has fresh samples and
/// knows its round-trip time to the pod's node.
fn own_report(
    route: &ServiceRoute,
    index: usize,
    table: &Table,
    local: &str,
    now: Instant,
) -> Option<PodReport> {
    let endpoint = &route.endpoints[index];
    let settings = route.settings();
    let (admission, readmitted_at, last_answer, samples) = {
        let stats = endpoint.state.lock();
        let (samples, _) =
            stats
                .estimator
                .count_within(now, settings.qos_pool.max_age, settings.latency_slo);
        let epoch = endpoint.state.epoch();
        (
            stats.admission,
            stats.readmitted_at.get(epoch),
            stats.last_answer.get(epoch),
            samples,
        )
    };
    let verdict = match admission {
        Admission::Evicted { since, cause, .. } if cause != EvictionCause::Latency => {
            Some(VerdictReport {
                kind: VerdictKind::Out(cause),
                age: now.saturating_duration_since(since),
            })
        }
        _ => readmitted_at
            .map(|at| now.saturating_duration_since(at))
            .filter(|age| is_news(VerdictKind::Back, *age))
            .map(|age| VerdictReport {
                kind: VerdictKind::Back,
                age,
            }),
    };
    let processing = processing_estimate(route, index, table, local, now, samples, last_answer);
    (verdict.is_some() || processing.is_some()).then(|| PodReport {
        service: route.key().clone(),
        pod: endpoint.endpoint.id.clone(),
        origin: local.to_string(),
        hops: 0,
        processing,
        verdict,
    })
}

/// The pod's response time at the SLO percentile as this proxy measured it, less this
/// proxy's round-trip time to the pod's node (0 on its own node).
fn processing_estimate(
    route: &ServiceRoute,
    index: usize,
    table: &Table,
    local: &str,
    now: Instant,
    samples: usize,
    last_answer: Option<Instant>,
) -> Option<ProcessingReport> {
    let score = route.endpoints[index].state.score_micros();
    if samples == 0 || score == 0 || score == u64::MAX {
        return None;
    }
    let node = route.endpoints[index].endpoint.node.as_deref()?;
    let rtt = if node == local {
        Duration::ZERO
    } else {
        table.environment.latency(node, now)?
    };
    Some(ProcessingReport {
        time: Duration::from_micros(score).saturating_sub(rtt),
        samples: u32::try_from(samples).unwrap_or(u32::MAX),
        age: last_answer.map_or(Duration::ZERO, |at| now.saturating_duration_since(at)),
    })
}
