//! What neighbouring proxies tell each other about pods.
//!
//! QEdgeProxy's design (§III) gives every proxy a QoS pool of its own, learnt only from
//! the requests it forwards: a proxy that sends a pod a request a minute learns that the
//! pod went bad only by sending it requests that miss, and a pod it never used is a
//! guess from its node's round-trip time. Neighbouring proxies already probe each other
//! (`/node/ping`, see `proxima-nodes`); each reply also carries a bounded digest of
//! [`PodReport`]s, and what a proxy hears is kept here, in [`Hearsay`]:
//!
//! * a **processing-time estimate** per pod: the reporter's response time at the SLO
//!   percentile less its round-trip time to the pod's node, with its sample count and
//!   age. It is the part of a response time that does not depend on where the client
//!   stands (QEdgeProxy §II faults predictions from network latency alone), so a proxy
//!   predicts a pod it has not measured as *its own* RTT to the pod's node plus this
//!   estimate ([`crate::Route::expected`], [`crate::Route::too_far`]);
//! * **verdicts**: the pod left the reporter's pool (with the cause) or came back.
//!   Failure verdicts (consecutive failures, unanswered) do not depend on where the
//!   reporter stands either; a latency eviction does (a far proxy evicts a near pod for
//!   its own distance), so it travels only as the processing estimate.
//!
//! Rules, in the spirit of gossip-based failure detectors (SWIM's *suspicion*,
//! Das, Gupta and Motivala, DSN 2002, §4.2: a member reported failed by another is
//! suspected, not declared failed, until it is checked):
//!
//! * **A neighbour's report never overrides this proxy's own fresh measurements.** A
//!   measured pod is judged on its measurements; the shared processing estimate only
//!   predicts pods this proxy has no fresh samples of.
//! * **A failure verdict raises suspicion, not a verdict.** A pod that a neighbour
//!   ejected for failures *after* the last answer this proxy had from it leaves this
//!   proxy's pool until one probe of this proxy's own answers within the SLO
//!   ([`crate::EndpointState::suspected`]). A report older than this proxy's own last
//!   answer says nothing new and is ignored.
//! * **Suspicion is capped** with this proxy's own ejections by the service's
//!   `qos-pool-max-ejection-percent` (Envoy's `max_ejection_percent`): an overloaded pod
//!   that every proxy reports, or a fault every pod shares, must not empty every pool
//!   at once through reports.
//! * **A "back" verdict brings the next probe forward** for a pod this proxy ejected for
//!   failures (not for latency, which depends on where it stands); it does not re-admit
//!   it.
//! * **Newer and better-sampled knowledge wins** ([`Hearsay::merge`]): a processing
//!   estimate replaces the one held when it is newer and rests on at least half as many
//!   samples, or when the one held is stale; the newest verdict wins.
//! * **Bounded**: reports relay at most [`MAX_HOPS`] times (so that a report reaches
//!   proxies that never probe the reporter: with 32 peers probed per round out of 250,
//!   two rounds reach nearly every proxy), knowledge older than the service's `max_age`
//!   is dropped, only pods of services this proxy routes are kept, and the digest a
//!   proxy sends is cut to a byte budget by the node layer, failure verdicts first.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::endpoint::EvictionCause;
use crate::model::{EndpointId, ServiceKey};

/// Most times a report is passed on after the proxy that measured it.
pub const MAX_HOPS: u8 = 2;

/// How long a verdict counts as news: a pod ejected longer ago than this is reported as
/// out for as long as it stays out (so that a proxy that joins learns of it), but one
/// that came back is reported as back only this long.
pub const VERDICT_NEWS: Duration = Duration::from_secs(10);

/// Two reports of one verdict whose times differ by less than this are the same verdict
/// heard along two paths (ages are rounded to milliseconds and each hop adds its
/// round-trip time), not a newer one.
const SAME_VERDICT: Duration = Duration::from_millis(250);

/// What a pod's pool verdict at a proxy was.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum VerdictKind {
    /// It left the pool, for this cause.
    Out(EvictionCause),
    /// It came back into the pool.
    Back,
}

impl VerdictKind {
    /// Whether the verdict holds wherever the client stands: failures do, a latency
    /// eviction does not (see the module docs).
    pub fn location_free(self) -> bool {
        matches!(
            self,
            VerdictKind::Out(EvictionCause::ConsecutiveFailures | EvictionCause::Unanswered)
                | VerdictKind::Back
        )
    }
}

/// A processing-time estimate: response time at the SLO percentile less the RTT to the
/// pod's node, as measured by one proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessingReport {
    /// The estimate.
    pub time: Duration,
    /// Fresh samples it rests on.
    pub samples: u32,
    /// How old its newest sample is, when sent.
    pub age: Duration,
}

/// A verdict as reported: what, and how long ago.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VerdictReport {
    /// What the verdict was.
    pub kind: VerdictKind,
    /// How long before the report was sent it was reached.
    pub age: Duration,
}

/// What one proxy tells its neighbours about one pod (ages relative to when it is sent;
/// no wall clocks of different nodes are compared).
#[derive(Clone, Debug, PartialEq)]
pub struct PodReport {
    /// The pod's service.
    pub service: ServiceKey,
    /// The pod, by its endpoint id (the same at every proxy: they read the same slices).
    pub pod: EndpointId,
    /// The node of the proxy that measured it.
    pub origin: String,
    /// Times it has been passed on since (0: from the proxy that measured it).
    pub hops: u8,
    /// Its processing-time estimate, when the origin has one.
    pub processing: Option<ProcessingReport>,
    /// Its latest verdict at the origin, when that is news (see [`VERDICT_NEWS`]).
    pub verdict: Option<VerdictReport>,
}

/// A processing-time estimate heard from a neighbour.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HeardProcessing {
    /// The estimate.
    pub time: Duration,
    /// Samples it rests on.
    pub samples: u32,
    /// When its newest sample was taken, on this proxy's clock.
    #[serde(skip)]
    pub at: Instant,
    /// Node of the proxy that measured it.
    pub origin: String,
    /// Times it was passed on before it reached this proxy.
    pub hops: u8,
}

/// A verdict heard from a neighbour.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HeardVerdict {
    /// What it was.
    pub kind: VerdictKind,
    /// When it was reached, on this proxy's clock.
    #[serde(skip)]
    pub at: Instant,
    /// Node of the proxy that reached it.
    pub origin: String,
    /// Times it was passed on before it reached this proxy.
    pub hops: u8,
}

/// What this proxy has heard about one pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Heard {
    /// The best processing-time estimate heard.
    pub processing: Option<HeardProcessing>,
    /// The newest verdict heard.
    pub verdict: Option<HeardVerdict>,
}

/// What merging a report changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Merged {
    /// The processing estimate held was replaced.
    pub processing: bool,
    /// A newer verdict is held.
    pub verdict: bool,
}

/// Everything heard from neighbours, per service and pod (see the module docs).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Hearsay {
    pods: HashMap<ServiceKey, HashMap<EndpointId, Heard>>,
}

impl Hearsay {
    /// What was heard about `pod` of `service`.
    pub fn get(&self, service: &ServiceKey, pod: &str) -> Option<&Heard> {
        self.pods.get(service)?.get(pod)
    }

    /// The processing estimate heard for `pod`, if its newest sample is no older than
    /// `max_age` at `now`.
    pub fn processing(
        &self,
        service: &ServiceKey,
        pod: &str,
        now: Instant,
        max_age: Duration,
    ) -> Option<&HeardProcessing> {
        self.get(service, pod)?
            .processing
            .as_ref()
            .filter(|p| now.saturating_duration_since(p.at) <= max_age)
    }

    /// Pods heard of, in all.
    pub fn len(&self) -> usize {
        self.pods.values().map(HashMap::len).sum()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    /// Every pod heard of.
    pub fn iter(&self) -> impl Iterator<Item = (&ServiceKey, &EndpointId, &Heard)> {
        self.pods
            .iter()
            .flat_map(|(s, pods)| pods.iter().map(move |(p, h)| (s, p, h)))
    }

    /// Take in `report`, received at `received`: newer and better-sampled knowledge wins
    /// (see the module docs). `max_age` is how long the report's service keeps samples.
    pub fn merge(&mut self, report: &PodReport, received: Instant, max_age: Duration) -> Merged {
        let heard = self
            .pods
            .entry(report.service.clone())
            .or_default()
            .entry(report.pod.clone())
            .or_default();
        let mut merged = Merged::default();
        if let Some(p) = report.processing {
            let incoming = HeardProcessing {
                time: p.time,
                samples: p.samples,
                at: received.checked_sub(p.age).unwrap_or(received),
                origin: report.origin.clone(),
                hops: report.hops,
            };
            if better_processing(&incoming, heard.processing.as_ref(), received, max_age) {
                heard.processing = Some(incoming);
                merged.processing = true;
            }
        }
        if let Some(v) = report.verdict {
            let at = received.checked_sub(v.age).unwrap_or(received);
            let newer = heard.verdict.as_ref().is_none_or(|held| {
                at > held.at + SAME_VERDICT || (at > held.at && held.kind != v.kind)
            });
            if newer {
                heard.verdict = Some(HeardVerdict {
                    kind: v.kind,
                    at,
                    origin: report.origin.clone(),
                    hops: report.hops,
                });
                merged.verdict = true;
            }
        }
        merged
    }

    /// Drop what is older than `max_age(service)` at `now`, and the pods for which
    /// `keep(service, pod)` is false (pods this proxy no longer routes).
    pub fn retain(
        &mut self,
        now: Instant,
        max_age: impl Fn(&ServiceKey) -> Option<Duration>,
        mut keep: impl FnMut(&ServiceKey, &str) -> bool,
    ) {
        self.pods.retain(|service, pods| {
            let Some(max_age) = max_age(service) else {
                return false;
            };
            let fresh = |at: Instant| now.saturating_duration_since(at) <= max_age;
            pods.retain(|pod, heard| {
                if heard.processing.as_ref().is_some_and(|p| !fresh(p.at)) {
                    heard.processing = None;
                }
                if heard.verdict.as_ref().is_some_and(|v| !fresh(v.at)) {
                    heard.verdict = None;
                }
                keep(service, pod) && (heard.processing.is_some() || heard.verdict.is_some())
            });
            !pods.is_empty()
        });
    }

    /// What this proxy passes on of what it heard, at `now`: reports that have not yet
    /// made [`MAX_HOPS`] hops, their ages as of `now`, verdicts only while news.
    pub fn relayed(&self, now: Instant) -> impl Iterator<Item = PodReport> + '_ {
        self.iter().filter_map(move |(service, pod, heard)| {
            let processing = heard
                .processing
                .as_ref()
                .filter(|p| p.hops < MAX_HOPS)
                .map(|p| ProcessingReport {
                    time: p.time,
                    samples: p.samples,
                    age: now.saturating_duration_since(p.at),
                });
            let verdict = heard
                .verdict
                .as_ref()
                .filter(|v| {
                    v.hops < MAX_HOPS && is_news(v.kind, now.saturating_duration_since(v.at))
                })
                .map(|v| VerdictReport {
                    kind: v.kind,
                    age: now.saturating_duration_since(v.at),
                });
            // One report carries one origin: the verdict's when there is one.
            let (origin, hops) = match (&heard.verdict, &heard.processing) {
                (Some(v), _) if verdict.is_some() => (v.origin.clone(), v.hops),
                (_, Some(p)) if processing.is_some() => (p.origin.clone(), p.hops),
                _ => return None,
            };
            let processing = processing.filter(|_| {
                heard
                    .processing
                    .as_ref()
                    .is_some_and(|p| p.origin == origin)
            });
            Some(PodReport {
                service: service.clone(),
                pod: pod.clone(),
                origin,
                hops: hops + 1,
                processing,
                verdict,
            })
        })
    }
}

/// Whether a verdict reached `age` ago is still worth passing on (see [`VERDICT_NEWS`]).
pub fn is_news(kind: VerdictKind, age: Duration) -> bool {
    match kind {
        VerdictKind::Out(_) => true,
        VerdictKind::Back => age <= VERDICT_NEWS,
    }
}

/// Whether `incoming` should replace `held` (see the module docs).
fn better_processing(
    incoming: &HeardProcessing,
    held: Option<&HeardProcessing>,
    now: Instant,
    max_age: Duration,
) -> bool {
    let Some(held) = held else {
        return true;
    };
    let held_stale = now.saturating_duration_since(held.at) > max_age;
    held_stale
        || (incoming.at > held.at && incoming.samples.saturating_mul(2) >= held.samples)
        || (incoming.at == held.at && incoming.samples > held.samples)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX_AGE: Duration = Duration::from_secs(30);

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    fn report(
        origin: &str,
        processing: Option<(u64, u32, u64)>,
        verdict: Option<(VerdictKind, u64)>,
    ) -> PodReport {
        PodReport {
            service: ServiceKey::new("default", "api"),
            pod: "api-1".into(),
            origin: origin.into(),
            hops: 0,
            processing: processing.map(|(time, samples, age)| ProcessingReport {
                time: ms(time),
                samples,
                age: ms(age),
            }),
            verdict: verdict.map(|(kind, age)| VerdictReport { kind, age: ms(age) }),
        }
    }

    fn held(h: &Hearsay) -> &Heard {
        h.get(&ServiceKey::new("default", "api"), "api-1").unwrap()
    }

    #[test]
    fn newer_estimate_wins_unless_it_rests_on_far_fewer_samples() {
        let t0 = Instant::now() + Duration::from_secs(100);
        let mut h = Hearsay::default();
        assert!(
            h.merge(&report("a", Some((5, 40, 100)), None), t0, MAX_AGE)
                .processing
        );
        // Newer, with more than half the samples: wins.
        assert!(
            h.merge(&report("b", Some((7, 25, 0)), None), t0, MAX_AGE)
                .processing
        );
        assert_eq!(held(&h).processing.as_ref().unwrap().origin, "b");
        // Newer but on 3 samples against 25: the better-sampled one stays.
        let later = t0 + ms(500);
        assert!(
            !h.merge(&report("c", Some((30, 3, 0)), None), later, MAX_AGE)
                .processing
        );
        assert_eq!(held(&h).processing.as_ref().unwrap().time, ms(7));
        // Older: never wins over a fresh one.
        assert!(
            !h.merge(&report("d", Some((9, 60, 5_000)), None), later, MAX_AGE)
                .processing
        );
        // Once the held one is stale, anything fresh replaces it.
        let stale = t0 + MAX_AGE + Duration::from_secs(1);
        assert!(
            h.merge(&report("c", Some((30, 3, 0)), None), stale, MAX_AGE)
                .processing
        );
        assert_eq!(held(&h).processing.as_ref().unwrap().origin, "c");
    }

    #[test]
    fn the_newest_verdict_wins_and_one_verdict_heard_twice_is_not_news() {
        let t0 = Instant::now() + Duration::from_secs(100);
        let out = VerdictKind::Out(EvictionCause::ConsecutiveFailures);
        let mut h = Hearsay::default();
        assert!(
            h.merge(&report("a", None, Some((out, 0))), t0, MAX_AGE)
                .verdict
        );
        // The same verdict relayed by another proxy 40 ms later, its age rounded.
        let relayed = PodReport {
            hops: 1,
            ..report("a", None, Some((out, 30)))
        };
        assert!(!h.merge(&relayed, t0 + ms(40), MAX_AGE).verdict);
        // The pod came back later: news.
        assert!(
            h.merge(
                &report("b", None, Some((VerdictKind::Back, 0))),
                t0 + ms(900),
                MAX_AGE
            )
            .verdict
        );
        assert_eq!(held(&h).verdict.as_ref().unwrap().kind, VerdictKind::Back);
        // An older ejection arriving late changes nothing.
        assert!(
            !h.merge(&report("c", None, Some((out, 600))), t0 + ms(1000), MAX_AGE)
                .verdict
        );
        assert_eq!(held(&h).verdict.as_ref().unwrap().origin, "b");
    }

    #[test]
    fn relayed_reports_keep_their_origin_and_age_and_stop_after_max_hops() {
        let t0 = Instant::now() + Duration::from_secs(100);
        let out = VerdictKind::Out(EvictionCause::Unanswered);
        let mut h = Hearsay::default();
        h.merge(
            &report("a", Some((4, 20, 200)), Some((out, 300))),
            t0,
            MAX_AGE,
        );
        let relayed: Vec<PodReport> = h.relayed(t0 + ms(1000)).collect();
        assert_eq!(relayed.len(), 1);
        let r = &relayed[0];
        assert_eq!((r.origin.as_str(), r.hops), ("a", 1));
        assert_eq!(r.verdict.unwrap().age, ms(1300));
        assert_eq!(r.processing.unwrap().age, ms(1200));
        // Heard at its last hop: kept, not passed on.
        let mut far = Hearsay::default();
        far.merge(
            &PodReport {
                hops: MAX_HOPS,
                ..report("a", Some((4, 20, 0)), None)
            },
            t0,
            MAX_AGE,
        );
        assert_eq!(far.relayed(t0).count(), 0);
        assert!(far
            .processing(&ServiceKey::new("default", "api"), "api-1", t0, MAX_AGE)
            .is_some());
    }

    #[test]
    fn a_back_verdict_stops_being_news_and_old_knowledge_is_dropped() {
        let t0 = Instant::now() + Duration::from_secs(100);
        let mut h = Hearsay::default();
        h.merge(
            &report("a", Some((4, 20, 0)), Some((VerdictKind::Back, 0))),
            t0,
            MAX_AGE,
        );
        let later = t0 + VERDICT_NEWS + ms(1);
        let r: Vec<PodReport> = h.relayed(later).collect();
        assert_eq!(r.len(), 1);
        assert!(
            r[0].verdict.is_none(),
            "a return is news only for {VERDICT_NEWS:?}"
        );
        h.retain(t0 + MAX_AGE + ms(1), |_| Some(MAX_AGE), |_, _| true);
        assert!(h.is_empty());
        // Pods no longer routed are dropped too.
        h.merge(&report("a", Some((4, 20, 0)), None), t0, MAX_AGE);
        h.retain(t0, |_| Some(MAX_AGE), |_, pod| pod != "api-1");
        assert!(h.is_empty());
    }

    #[test]
    fn only_failure_verdicts_hold_wherever_the_client_stands() {
        assert!(VerdictKind::Out(EvictionCause::ConsecutiveFailures).location_free());
        assert!(VerdictKind::Out(EvictionCause::Unanswered).location_free());
        assert!(!VerdictKind::Out(EvictionCause::Latency).location_free());
    }
}
