//! Proxies that share what they measure (issue 30): three routers stand for the proxies
//! of three nodes, and what one says in its digest is heard by the next, as the peer
//! prober carries it. Deterministic: time is passed in and the RNGs are seeded.

mod common;

use std::time::{Duration, Instant};

use common::{key, ms, pod, pool_of};
use proxima_core::neighbours::{PodReport, ProcessingReport, VerdictKind, VerdictReport};
use proxima_core::{EvictionCause, Outcome, Picked, Router, ServiceSettings, ServiceSpec, Update};
use rand::rngs::SmallRng;
use rand::SeedableRng;

const SLO: &str = "20ms";

fn ok(latency: Duration) -> Outcome {
    Outcome::Answered {
        latency,
        status: 200,
    }
}

fn failed() -> Outcome {
    Outcome::Answered {
        latency: ms(2),
        status: 503,
    }
}

/// A proxy on `node` routing pod-0 (node-x) and pod-1 (node-y), with 4 ms to each node.
fn proxy(node: &str, t0: Instant) -> Router {
    let r = Router::new(Some(node.into()));
    let (settings, errors) = ServiceSettings::from_pairs([
        ("latency-slo", SLO),
        ("qos-pool-min-samples", "3"),
        ("qos-pool-eject-after", "3"),
        ("qos-pool-probe-interval", "1s"),
        // Every pod its share whatever it answered, so that a short burst of traffic
        // brings a failing pod to its ejection; the slack spread passes it over after
        // its first failure and leaves the ejection to its probes (tests/trust.rs).
        ("qos-pool-spread", "even"),
    ]);
    assert!(errors.is_empty(), "{errors:?}");
    r.apply(
        [Update::Reset {
            nodes: vec![],
            services: vec![(
                ServiceSpec::new(key(), vec![], settings),
                vec![pod(0, "node-x"), pod(1, "node-y")],
            )],
        }],
        t0,
    );
    r.update_environment(|env| {
        env.set_latency("node-x", ms(4), t0);
        env.set_latency("node-y", ms(4), t0);
    });
    r
}

fn pick_id(r: &Router, now: Instant, rng: &mut SmallRng) -> (Picked, String) {
    let picked = r.pick(&key(), None, now, rng, &[]).expect("pick");
    let id = picked.endpoint().id.clone();
    (picked, id)
}

/// Send `n` requests through `r` at `now`, each answered as `answer(pod)` says.
fn traffic(r: &Router, now: Instant, n: usize, answer: impl Fn(&str) -> Outcome) {
    let mut rng = SmallRng::seed_from_u64(7);
    for _ in 0..n {
        let (picked, id) = pick_id(r, now, &mut rng);
        r.record(&picked, now, answer(&id));
    }
}

fn report(
    pod: &str,
    verdict: Option<(VerdictKind, u64)>,
    processing: Option<(u64, u32)>,
) -> PodReport {
    PodReport {
        service: key(),
        pod: pod.into(),
        origin: "node-a".into(),
        hops: 0,
        processing: processing.map(|(time, samples)| ProcessingReport {
            time: ms(time),
            samples,
            age: ms(100),
        }),
        verdict: verdict.map(|(kind, age)| VerdictReport { kind, age: ms(age) }),
    }
}

fn ejected() -> VerdictKind {
    VerdictKind::Out(EvictionCause::ConsecutiveFailures)
}

#[test]
fn a_pod_a_neighbour_saw_fail_is_probed_before_it_takes_another_request() {
    let t0 = Instant::now();
    let b = proxy("node-b", t0);
    traffic(&b, t0, 20, |_| ok(ms(6)));
    assert_eq!(pool_of(&b, &key()), ["pod-0", "pod-1"]);

    // Ten seconds later (this quiet proxy sent nothing since), node-a's proxy reports
    // that it ejected pod-0 for failures 300 ms ago.
    let t1 = t0 + Duration::from_secs(10);
    let heard = b.hear(&[report("pod-0", Some((ejected(), 300)), None)], t1);
    assert_eq!(heard.suspected.len(), 1, "{heard:?}");
    assert_eq!(heard.suspected[0].2, "node-a");
    assert_eq!(pool_of(&b, &key()), ["pod-1"], "suspect: out until probed");
    let mut rng = SmallRng::seed_from_u64(1);
    for _ in 0..50 {
        assert_eq!(pick_id(&b, t1, &mut rng).1, "pod-1");
    }

    // It is probed at once; a failed probe keeps it out and the next probe waits.
    let probes = b.due_probes(t1);
    assert_eq!(probes.len(), 1);
    assert_eq!(probes[0].id, "pod-0");
    b.finish_probe(probes.into_iter().next().unwrap(), t1 + ms(5), failed());
    assert_eq!(pool_of(&b, &key()), ["pod-1"]);
    assert!(b.due_probes(t1 + ms(500)).is_empty(), "no probe storm");

    // A probe of its own within the SLO clears the suspicion.
    let t2 = t1 + ms(1_100);
    let probe = b.due_probes(t2).into_iter().next().expect("probed again");
    b.finish_probe(probe, t2 + ms(6), ok(ms(6)));
    assert_eq!(pool_of(&b, &key()), ["pod-0", "pod-1"]);
    assert!(b.due_probes(t2 + Duration::from_secs(5)).is_empty());
}

#[test]
fn a_report_older_than_this_proxys_own_last_answer_changes_nothing() {
    let t0 = Instant::now();
    let b = proxy("node-b", t0);
    traffic(&b, t0, 20, |_| ok(ms(6)));
    // The ejection was reached 300 ms before t0 + 100 ms: before b's own answers at t0.
    let heard = b.hear(
        &[report("pod-0", Some((ejected(), 300)), None)],
        t0 + ms(100),
    );
    assert!(heard.suspected.is_empty(), "{heard:?}");
    assert_eq!(pool_of(&b, &key()), ["pod-0", "pod-1"]);
    // A latency eviction depends on where the reporter stands: no suspicion either.
    let latency = VerdictKind::Out(EvictionCause::Latency);
    let heard = b.hear(&[report("pod-1", Some((latency, 0)), None)], t0 + ms(5_000));
    assert!(heard.suspected.is_empty());
    // Nor does a report from this proxy's own node, relayed back to it.
    let own = PodReport {
        origin: "node-b".into(),
        ..report("pod-1", Some((ejected(), 0)), None)
    };
    assert_eq!(b.hear(&[own], t0 + ms(6_000)).kept, 0);
    assert_eq!(pool_of(&b, &key()), ["pod-0", "pod-1"]);
}

#[test]
fn a_pod_never_measured_is_predicted_from_its_rtt_and_a_neighbours_processing_estimate() {
    let t0 = Instant::now();
    let b = proxy("node-b", t0);
    // 4 ms away and no processing time known: both in, on the optimistic estimate.
    assert_eq!(pool_of(&b, &key()), ["pod-0", "pod-1"]);
    // node-a measured pod-0 taking 18 ms to answer, pod-1 taking 3 ms.
    let heard = b.hear(
        &[
            report("pod-0", None, Some((18, 40))),
            report("pod-1", None, Some((3, 40))),
        ],
        t0 + ms(10),
    );
    assert_eq!(heard.estimates, 2);
    // 4 + 18 > 20: pod-0 cannot meet the SLO from here; 4 + 3 can.
    assert_eq!(pool_of(&b, &key()), ["pod-1"]);
    let explain = b.explain(t0 + ms(20));
    let pod0 = &explain.services[0].endpoints[0];
    assert!(pod0.reason.contains("node-a"), "{}", pod0.reason);
    // Its own measurements win over the neighbour's as soon as it has them.
    let t1 = t0 + ms(50);
    for probe in b.due_probes(t1) {
        b.finish_probe(probe, t1, ok(ms(7)));
    }
    traffic(&b, t1, 10, |_| ok(ms(7)));
    let table = b.table();
    let route = &table.services[&key()];
    assert!(route.state(0).measured());
}

#[test]
fn a_failure_travels_two_hops_and_a_return_brings_probes_forward() {
    let t0 = Instant::now();
    let (a, b, c) = (
        proxy("node-a", t0),
        proxy("node-b", t0),
        proxy("node-c", t0),
    );
    for r in [&a, &b, &c] {
        traffic(r, t0, 20, |_| ok(ms(6)));
    }
    // node-a's proxy sees pod-0 fail three times in a row and ejects it.
    let t1 = t0 + Duration::from_secs(5);
    traffic(
        &a,
        t1,
        12,
        |id| if id == "pod-0" { failed() } else { ok(ms(6)) },
    );
    assert_eq!(pool_of(&a, &key()), ["pod-1"]);
    let digest = a.digest(t1 + ms(100));
    assert_eq!(digest.news.len(), 1, "{digest:?}");
    assert_eq!(digest.news[0].pod, "pod-0");
    assert_eq!(digest.news[0].verdict.unwrap().kind, ejected());
    // pod-1's processing estimate: p95 of 6 ms less the 4 ms to its node.
    let pod1 = digest.estimates.iter().find(|r| r.pod == "pod-1").unwrap();
    assert_eq!(pod1.processing.unwrap().time, ms(2));

    // b probes a, c probes only b: c learns of it second hand.
    let t2 = t1 + ms(200);
    let mut reports = digest.news.clone();
    reports.extend(digest.estimates.clone());
    b.hear(&reports, t2);
    let relayed = b.digest(t2 + ms(50));
    assert_eq!(relayed.news[0].origin, "node-a");
    assert_eq!(relayed.news[0].hops, 1);
    let heard = c.hear(&relayed.news, t2 + ms(60));
    assert_eq!(heard.suspected.len(), 1, "{heard:?}");
    assert_eq!(pool_of(&c, &key()), ["pod-1"]);
    let explain = c.explain(t2 + ms(70));
    assert!(explain.services[0].endpoints[0].suspected);

    // Seen at its last hop, it is not passed on again.
    let twice = c.digest(t2 + ms(80));
    assert!(twice.news.iter().all(|r| r.hops <= 2));

    // a's next probe of pod-0 is after its backoff (1 s); b reports it back first.
    let t3 = t1 + ms(300);
    assert!(a.due_probes(t3).is_empty());
    let back = PodReport {
        origin: "node-b".into(),
        ..report("pod-0", Some((VerdictKind::Back, 0)), None)
    };
    assert_eq!(a.hear(&[back], t3).probes_forward, 1);
    assert_eq!(a.due_probes(t3).len(), 1, "the probe is due now");
}

#[test]
fn reports_never_take_more_pods_out_than_the_ejection_cap_allows() {
    // Two pods, qos-pool-max-ejection-percent 50: one may be out for failures at a time,
    // whoever saw them fail. node-a reports both failing (an overload every proxy sees,
    // or a fault they share): one is suspect, the other keeps serving.
    let t0 = Instant::now();
    let b = proxy("node-b", t0);
    traffic(&b, t0, 20, |_| ok(ms(6)));
    let t1 = t0 + Duration::from_secs(10);
    let heard = b.hear(
        &[
            report("pod-0", Some((ejected(), 100)), None),
            report("pod-1", Some((ejected(), 100)), None),
        ],
        t1,
    );
    assert_eq!(heard.suspected.len(), 1, "{heard:?}");
    assert_eq!(pool_of(&b, &key()).len(), 1);
    // The suspect pod's own failures may still eject it: it holds its place already.
    let suspect = &heard.suspected[0].1;
    let table = b.table();
    let route = &table.services[&key()];
    assert!(route.state(route.index_of(suspect).unwrap()).suspected());
    let mut t = t1;
    for _ in 0..3 {
        let Some(probe) = b.due_probes(t).into_iter().next() else {
            t += ms(1_100);
            continue;
        };
        b.finish_probe(probe, t, failed());
        t += ms(1_100);
    }
    let explain = b.explain(t);
    let out: Vec<_> = explain.services[0]
        .endpoints
        .iter()
        .filter(|e| e.out_because.is_some())
        .map(|e| e.id.clone())
        .collect();
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(&out[0], suspect, "ejected by its own failures");
    assert_eq!(pool_of(&b, &key()).len(), 1);
}
