//! The QoS pool when pods fail (issue 8): failures are misses and eject fast, overdue and
//! abandoned attempts are measurements, no flapping, quick forgiveness, calm under
//! stalls, an even spread and judged quiet services. Deterministic: time is passed in and
//! the RNGs are seeded.

mod common;

use std::collections::{HashMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use proxima_core::{
    Admission, Endpoint, EvictionCause, Outcome, Picked, PoolChange, ProbeTicket, Reason, Router,
    ServiceKey, ServiceSettings, ServiceSpec, Update,
};
use rand::rngs::SmallRng;
use rand::SeedableRng;

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

fn key() -> ServiceKey {
    ServiceKey::new("default", "svc")
}

fn addr(i: usize) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, 9100 + i as u16))
}

fn endpoints(n: usize) -> Vec<Endpoint> {
    (0..n)
        .map(|i| Endpoint::new(format!("pod-{i}"), addr(i)).on_node(format!("node-{i}")))
        .collect()
}

fn settings(pairs: &[(&str, &str)]) -> ServiceSettings {
    let (s, errors) = ServiceSettings::from_pairs(pairs.iter().copied());
    assert!(errors.is_empty(), "{errors:?}");
    s
}

fn router(n: usize, pairs: &[(&str, &str)], now: Instant) -> Router {
    let router = Router::new(Some("node-0".into()));
    router.apply(
        [Update::Reset {
            nodes: vec![],
            services: vec![(
                ServiceSpec::new(key(), vec![], settings(pairs)),
                endpoints(n),
            )],
        }],
        now,
    );
    router
}

fn pick(router: &Router, now: Instant, rng: &mut SmallRng) -> Picked {
    router.pick(&key(), None, now, rng, &[]).expect("pick")
}

/// One request: pick, then record what `answer(pod id)` says.
fn request(
    router: &Router,
    now: Instant,
    rng: &mut SmallRng,
    answer: &dyn Fn(&str) -> Outcome,
) -> (String, Reason) {
    let picked = pick(router, now, rng);
    let id = picked.endpoint().id.clone();
    router.record(&picked, now, answer(&id));
    (id, picked.reason)
}

fn ok(latency: Duration) -> Outcome {
    Outcome::Answered {
        latency,
        status: 200,
    }
}

fn pool(router: &Router) -> Vec<String> {
    common::pool_of(router, &key())
}

fn explain(router: &Router, now: Instant, id: &str) -> proxima_core::explain::EndpointExplain {
    router
        .explain(now)
        .services
        .remove(0)
        .endpoints
        .into_iter()
        .find(|e| e.id == id)
        .expect("endpoint explained")
}

/// The first probe due after `from`, scanning in 1 ms steps.
fn next_probe(router: &Router, from: Instant) -> (Instant, ProbeTicket) {
    (1..=120_000)
        .map(|k| from + ms(k))
        .find_map(|at| router.due_probes(at).pop().map(|t| (at, t)))
        .expect("a probe is due within 120 s")
}

#[test]
fn a_pod_answering_fast_500s_stops_getting_traffic() {
    for spread in ["even", "slack"] {
        let t0 = Instant::now();
        let r = router(
            3,
            &[("latency-slo", "80ms"), ("qos-pool-spread", spread)],
            t0,
        );
        let mut rng = SmallRng::seed_from_u64(1);
        let mut to_bad = 0;
        for i in 0..300 {
            let (id, _) = request(&r, t0 + ms(i), &mut rng, &|id| {
                if id == "pod-2" {
                    Outcome::Answered {
                        latency: ms(2),
                        status: 500,
                    }
                } else {
                    ok(ms(20))
                }
            });
            to_bad += u32::from(id == "pod-2");
        }
        // Before issue 8 it took 25-36% of the requests; now it is out after its first.
        assert_eq!(to_bad, 1, "{spread}: requests to the failing pod");
        assert_eq!(pool(&r), ["pod-0", "pod-1"], "{spread}");
        let e = explain(&r, t0 + ms(300), "pod-2");
        assert!(e.out_because.is_some(), "{e:?}");
        assert!(e.reason.starts_with("evicted for latency"), "{}", e.reason);
        assert_eq!(e.predicted_ms, None, "its p95 is a failure: {e:?}");
    }
}

#[test]
fn the_failure_status_setting_decides_what_a_failure_is() {
    let t0 = Instant::now();
    let mut rng = SmallRng::seed_from_u64(2);
    let answer = |status| {
        move |_: &str| Outcome::Answered {
            latency: ms(2),
            status,
        }
    };
    // `none`: a 500 is an answer like any other.
    let r = router(1, &[("failure-status", "none")], t0);
    for i in 0..10 {
        request(&r, t0 + ms(i), &mut rng, &answer(500));
    }
    assert_eq!(pool(&r), ["pod-0"]);
    // `5xx,429`: a fast 429 is a miss; a 404 is not.
    let r = router(2, &[("failure-status", "5xx,429")], t0);
    for i in 0..10 {
        request(&r, t0 + ms(i), &mut rng, &|id| {
            if id == "pod-0" {
                answer(429)(id)
            } else {
                answer(404)(id)
            }
        });
    }
    assert_eq!(pool(&r), ["pod-1"]);
    assert_eq!(r.explain(t0).services[0].failure_status, "5xx,429");
}

#[test]
fn consecutive_failures_eject_before_the_window_would() {
    // At p50 over 64 samples the latency test needs 32 misses; five in a row eject.
    // The even spread keeps sending the failing pod its share meanwhile; the slack
    // spread passes it over after its first failure (the test above).
    let t0 = Instant::now();
    let r = router(
        3,
        &[
            ("slo-percentile", "50"),
            ("qos-pool-eject-after", "5"),
            ("qos-pool-spread", "even"),
        ],
        t0,
    );
    let mut rng = SmallRng::seed_from_u64(3);
    let mut t = t0;
    for _ in 0..150 {
        t += ms(1);
        request(&r, t, &mut rng, &|_| ok(ms(10)));
    }
    let mut bad_hits = 0;
    let mut changes = vec![];
    for _ in 0..200 {
        t += ms(1);
        let picked = pick(&r, t, &mut rng);
        let bad = picked.endpoint().id == "pod-1";
        let outcome = if bad {
            bad_hits += 1;
            Outcome::Failed
        } else {
            ok(ms(10))
        };
        changes.extend(r.record(&picked, t, outcome));
    }
    assert_eq!(bad_hits, 5, "ejected after exactly 5 failures in a row");
    assert_eq!(changes, [PoolChange::Evicted]);
    let e = explain(&r, t, "pod-1");
    assert_eq!(e.out_because, Some(EvictionCause::ConsecutiveFailures));
    assert!(e.reason.contains("consecutive failures"), "{}", e.reason);
    assert_eq!(e.consecutive_failures, 5);
    // It comes back through probes.
    let mut last = t;
    for _ in 0..3 {
        let (at, ticket) = next_probe(&r, last);
        r.finish_probe(ticket, at, ok(ms(10)));
        last = at;
    }
    assert_eq!(pool(&r), ["pod-0", "pod-1", "pod-2"]);
}

/// Three pods answering in 10 ms under an 80 ms SLO, warmed up under the slack spread,
/// then pod-1 answering `pod1` while client requests come every millisecond; returns
/// the router, the time, and how many of 200 requests went to pod-1.
fn slack_pool_with_pod_1(pod1: Outcome) -> (Router, Instant, u32) {
    let t0 = Instant::now();
    let r = router(
        3,
        &[
            ("latency-slo", "80ms"),
            ("qos-pool-eject-after", "3"),
            ("qos-pool-probe-interval", "100ms"),
        ],
        t0,
    );
    let mut rng = SmallRng::seed_from_u64(4);
    let mut t = t0;
    for _ in 0..60 {
        t += ms(1);
        request(&r, t, &mut rng, &|_| ok(ms(10)));
    }
    let mut to_pod_1 = 0;
    for _ in 0..200 {
        t += ms(1);
        let (id, _) = request(&r, t, &mut rng, &|id| {
            if id == "pod-1" {
                pod1
            } else {
                ok(ms(10))
            }
        });
        to_pod_1 += u32::from(id == "pod-1");
    }
    (r, t, to_pod_1)
}

#[test]
fn under_the_slack_spread_a_member_that_failed_is_probed_until_its_failures_eject_it() {
    // One client request finds the failure; the slack spread sends no more, and the
    // probes, not client traffic, bring the ejection (and the news neighbours hear).
    let (r, mut t, to_pod_1) = slack_pool_with_pod_1(Outcome::Failed);
    assert_eq!(to_pod_1, 1);
    let e = explain(&r, t, "pod-1");
    assert!(e.in_pool, "{e:?}");
    assert!(e.reason.contains("probed every 100ms"), "{}", e.reason);
    for _ in 0..2 {
        let (at, ticket) = next_probe(&r, t);
        assert!(at <= t + ms(100), "probed within the interval");
        r.finish_probe(ticket, at, Outcome::Failed);
        t = at;
    }
    assert_eq!(pool(&r), ["pod-0", "pod-2"]);
    let e = explain(&r, t, "pod-1");
    assert_eq!(e.out_because, Some(EvictionCause::ConsecutiveFailures));
}

#[test]
fn under_the_slack_spread_a_member_back_from_one_failure_takes_traffic_after_a_good_probe() {
    let (r, mut t, _) = slack_pool_with_pod_1(Outcome::Failed);
    let (at, ticket) = next_probe(&r, t);
    r.finish_probe(ticket, at, ok(ms(10)));
    t = at;
    assert!(!explain(&r, t, "pod-1").reason.contains("probed every"));
    // Its 1 s failure penalty is gone with the good probe: a third of the requests again.
    let mut rng = SmallRng::seed_from_u64(5);
    let mut to_pod_1 = 0;
    for _ in 0..300 {
        t += ms(1);
        let (id, _) = request(&r, t, &mut rng, &|_| ok(ms(10)));
        to_pod_1 += u32::from(id == "pod-1");
    }
    assert!((80..=120).contains(&to_pod_1), "{to_pod_1} of 300");
    assert!(
        r.due_probes(t + ms(1_000)).is_empty(),
        "no probe once it answers well"
    );
}

#[test]
fn the_ejection_cap_keeps_part_of_the_pool_when_every_pod_fails() {
    let t0 = Instant::now();
    let r = router(
        4,
        &[
            ("slo-percentile", "50"),
            ("qos-pool-eject-after", "3"),
            ("qos-pool-max-ejection-percent", "50"),
        ],
        t0,
    );
    let mut rng = SmallRng::seed_from_u64(4);
    let mut t = t0;
    for _ in 0..200 {
        t += ms(1);
        request(&r, t, &mut rng, &|_| ok(ms(10)));
    }
    // A fault every pod shares: all answer 503.
    for _ in 0..40 {
        t += ms(1);
        request(&r, t, &mut rng, &|_| Outcome::Answered {
            latency: ms(1),
            status: 503,
        });
    }
    let svc = r.explain(t).services.remove(0);
    assert_eq!(svc.failure_ejection_cap, 2);
    assert_eq!(svc.failure_ejected, 2);
    assert_eq!(pool(&r).len(), 2, "half the pool stays: {svc:?}");
    let capped: Vec<_> = svc.endpoints.iter().filter(|e| e.in_pool).collect();
    for e in capped {
        assert!(e.reason.contains("not ejected"), "{}", e.reason);
        assert!(e.consecutive_failures >= 3);
    }
    // 0% turns the fast path off.
    let r = router(
        2,
        &[
            ("slo-percentile", "50"),
            ("qos-pool-eject-after", "3"),
            ("qos-pool-max-ejection-percent", "0"),
        ],
        t0,
    );
    for _ in 0..100 {
        request(&r, t0, &mut rng, &|_| ok(ms(10)));
    }
    for _ in 0..10 {
        request(&r, t0, &mut rng, &|_| Outcome::Failed);
    }
    assert_eq!(pool(&r).len(), 2);
}

#[test]
fn an_overdue_attempt_is_a_miss_at_once_and_its_late_answer_is_not_counted_twice() {
    let t0 = Instant::now();
    // Judged on the share alone, so that four misses decide (the margin has tests of
    // its own, tight_slo.rs and qos_pool.rs).
    let r = router(
        2,
        &[
            ("latency-slo", "100ms"),
            ("qos-pool-verdict-confidence", "0"),
        ],
        t0,
    );
    let mut rng = SmallRng::seed_from_u64(5);
    for i in 0..60 {
        request(&r, t0 + ms(i), &mut rng, &|_| ok(ms(10)));
    }
    let samples = |at| explain(&r, at, "pod-0").samples;
    let before = samples(t0 + ms(60));
    let hung: Vec<Picked> = (0..4)
        .map(|_| {
            r.pick(&key(), None, t0 + ms(60), &mut rng, &["pod-1".into()])
                .unwrap()
        })
        .collect();
    // One SLO later, still unanswered: four misses, and p95 of the window fails.
    let t = t0 + ms(161);
    let changes: Vec<_> = hung.iter().filter_map(|p| r.record_overdue(p, t)).collect();
    assert_eq!(changes, [PoolChange::Evicted]);
    assert_eq!(pool(&r), ["pod-1"]);
    assert_eq!(samples(t), before + 4);
    // Reporting the same overdue attempt again, and its late answers, add nothing.
    assert_eq!(r.record_overdue(&hung[0], t), None);
    for p in &hung {
        r.record(p, t0 + ms(2060), ok(ms(2000)));
    }
    assert_eq!(samples(t0 + ms(2060)), before + 4);
}

/// `waiting` requests picked at `t` on `pod-1` (the other pods excluded).
fn stuck_on_pod_1(r: &Router, rng: &mut SmallRng, t: Instant, waiting: usize) -> Vec<Picked> {
    let others: Vec<_> = ["pod-0", "pod-2"].iter().map(|&id| id.into()).collect();
    (0..waiting)
        .map(|_| r.pick(&key(), None, t, rng, &others).unwrap())
        .collect()
}

#[test]
fn a_pod_that_answers_nothing_leaves_as_hung_though_its_misses_are_too_few_to_judge() {
    let t0 = Instant::now();
    // The default margin: 4 misses in a window of 64 good answers prove nothing.
    let r = router(3, &[("latency-slo", "200ms")], t0);
    let mut rng = SmallRng::seed_from_u64(7);
    for i in 0..300 {
        request(&r, t0 + ms(i), &mut rng, &|_| ok(ms(10)));
    }
    let t = t0 + ms(300);
    let hung = stuck_on_pod_1(&r, &mut rng, t, 4);
    let overdue: Vec<_> = hung
        .iter()
        .filter_map(|p| r.record_overdue(p, t + ms(201)))
        .collect();
    assert_eq!(overdue, [], "four misses of 64 are within the margin");
    assert!(pool(&r).contains(&"pod-1".to_string()));
    // Twice the SLO later, nothing from pod-1 at all while the others answer: hung.
    request(&r, t + ms(350), &mut rng, &|_| ok(ms(10)));
    let change = r.record_unanswered(&hung[0], t + ms(401));
    assert_eq!(change, Some(PoolChange::Evicted));
    assert_eq!(pool(&r), ["pod-0", "pod-2"]);
    let e = explain(&r, t + ms(401), "pod-1");
    assert!(matches!(
        e.admission,
        Admission::Evicted {
            cause: EvictionCause::Unanswered,
            ..
        }
    ));
    assert!(e.reason.contains("hung"), "{}", e.reason);
    // The other stuck callers change nothing more.
    for p in &hung[1..] {
        assert_eq!(r.record_unanswered(p, t + ms(402)), None);
    }
}

#[test]
fn a_pod_slow_on_one_request_but_answering_others_is_not_hung() {
    let t0 = Instant::now();
    let r = router(3, &[("latency-slo", "200ms")], t0);
    let mut rng = SmallRng::seed_from_u64(8);
    for i in 0..300 {
        request(&r, t0 + ms(i), &mut rng, &|_| ok(ms(10)));
    }
    let t = t0 + ms(300);
    let slow = stuck_on_pod_1(&r, &mut rng, t, 1);
    r.record_overdue(&slow[0], t + ms(201));
    // pod-1 answers a later request meanwhile: it is alive, one request is slow.
    let quick = stuck_on_pod_1(&r, &mut rng, t + ms(250), 1);
    r.record(&quick[0], t + ms(260), ok(ms(10)));
    assert_eq!(r.record_unanswered(&slow[0], t + ms(401)), None);
    assert!(pool(&r).contains(&"pod-1".to_string()));
    // An abandoned wait past the limit is judged the same way.
    assert_eq!(
        r.record_abandoned(&slow[0], t + ms(900), Duration::ZERO),
        None
    );
    assert!(pool(&r).contains(&"pod-1".to_string()));
}

#[test]
fn the_last_member_that_hangs_is_kept_while_the_proxy_itself_just_stalled() {
    let t0 = Instant::now();
    let r = router(1, &[("latency-slo", "200ms")], t0);
    let mut rng = SmallRng::seed_from_u64(9);
    for i in 0..100 {
        request(&r, t0 + ms(i), &mut rng, &|_| ok(ms(10)));
    }
    let t = t0 + ms(100);
    let p = pick(&r, t, &mut rng);
    r.note_stall(t + ms(300));
    assert_eq!(r.record_unanswered(&p, t + ms(401)), None);
    assert_eq!(pool(&r), ["pod-0"]);
    let e = explain(&r, t + ms(401), "pod-0");
    assert!(e.reason.contains("stalled"), "{}", e.reason);
}

#[test]
fn an_abandoned_attempt_is_a_miss_only_once_it_outlasted_the_slo() {
    let t0 = Instant::now();
    let r = router(1, &[("latency-slo", "100ms")], t0);
    let mut rng = SmallRng::seed_from_u64(6);
    for i in 0..10 {
        request(&r, t0 + ms(i), &mut rng, &|_| ok(ms(10)));
    }
    let p = pick(&r, t0 + ms(10), &mut rng);
    // Given up after 50 ms: says nothing.
    assert_eq!(r.record_abandoned(&p, t0 + ms(60), Duration::ZERO), None);
    assert_eq!(explain(&r, t0 + ms(60), "pod-0").samples, 10);
    // After 300 ms, but the proxy itself stalled for 250 of them: nothing either.
    assert_eq!(r.record_abandoned(&p, t0 + ms(310), ms(250)), None);
    assert_eq!(explain(&r, t0 + ms(310), "pod-0").samples, 10);
    // After 300 ms: a miss.
    r.record_abandoned(&p, t0 + ms(310), Duration::ZERO);
    let e = explain(&r, t0 + ms(310), "pod-0");
    assert_eq!((e.samples, e.within_slo), (11, 10));
}

/// A router of `pod-0` and `pod-1` under `pairs`, `pod-1` measured and in the pool
/// (so that `readmit-after` counts: an empty pool re-admits on one good probe).
fn router_with_a_good_member(pairs: &[(&str, &str)], now: Instant) -> Router {
    let r = router(2, pairs, now);
    let mut rng = SmallRng::seed_from_u64(70);
    for _ in 0..3 {
        let p = r
            .pick(&key(), None, now, &mut rng, &["pod-0".into()])
            .unwrap();
        r.record(&p, now, ok(ms(5)));
    }
    r
}

#[test]
fn probes_come_quickly_while_they_succeed() {
    let t0 = Instant::now();
    let r = router_with_a_good_member(
        &[
            ("latency-slo", "80ms"),
            ("qos-pool-probe-interval", "100ms"),
            ("qos-pool-probe-max-interval", "2s"),
        ],
        t0,
    );
    let mut rng = SmallRng::seed_from_u64(7);
    evict_slow(&r, t0, &mut rng);
    assert_eq!(pool(&r), ["pod-1"]);
    let mut last = t0;
    let mut gaps = vec![];
    for _ in 0..6 {
        let (at, ticket) = next_probe(&r, last);
        r.finish_probe(ticket, at, ok(ms(300)));
        gaps.push((at - last).as_millis());
        last = at;
    }
    assert_eq!(gaps, [100, 200, 400, 800, 1600, 2000]);
    // The pod recovers: the next probe is still 2 s away, then the good ones come
    // every 100 ms, so it is back 2.2 s after recovering, not 3 × 2 s.
    let mut gaps = vec![];
    let mut changes = vec![];
    for _ in 0..3 {
        let (at, ticket) = next_probe(&r, last);
        changes.push(r.finish_probe(ticket, at, ok(ms(10))));
        gaps.push((at - last).as_millis());
        last = at;
    }
    assert_eq!(gaps, [2000, 100, 100]);
    assert_eq!(changes, [None, None, Some(PoolChange::Readmitted)]);
}

#[test]
fn a_near_pod_back_from_failing_takes_the_traffic_on_its_first_good_probe_when_the_pool_is_empty() {
    // A 12 ms SLO; pod-0 on this node answers in 3 ms, pod-1 is 60 ms away. pod-0 answers
    // 503 for 10 s, so the pool is empty and requests (13 a second) fall back to pod-1,
    // which misses every one. When pod-0 recovers, its first good probe brings it back:
    // the requests stop going to a pod that always misses within a probe interval.
    let t0 = Instant::now();
    let r = router(
        2,
        &[
            ("latency-slo", "12ms"),
            ("qos-pool-probe-interval", "500ms"),
        ],
        t0,
    );
    r.update_environment(|env| env.set_latency("node-1", ms(60), t0));
    let recovered = t0 + Duration::from_secs(10);
    let answer = |id: &str, now: Instant| match id {
        "pod-0" if now < recovered => Outcome::Answered {
            latency: ms(2),
            status: 503,
        },
        "pod-0" => ok(ms(3)),
        _ => ok(ms(61)),
    };
    let mut rng = SmallRng::seed_from_u64(71);
    let gap = ms(77);
    let mut far_after_recovery = 0;
    let mut back_at = None;
    for k in 0..200u32 {
        let now = t0 + gap * k;
        for ticket in r.due_probes(now) {
            let id = if ticket.addr == addr(0) {
                "pod-0"
            } else {
                "pod-1"
            };
            r.finish_probe(ticket, now, answer(id, now));
        }
        let p = pick(&r, now, &mut rng);
        let id = p.endpoint().id.clone();
        r.record(&p, now, answer(&id, now));
        if now >= recovered && back_at.is_none() {
            if id == "pod-1" {
                far_after_recovery += 1;
            } else {
                assert_eq!(p.reason, Reason::Pool);
                back_at = Some(now);
            }
        }
        if now > recovered - Duration::from_secs(5) && now < recovered {
            assert!(pool(&r).is_empty(), "pod-0 in the pool while failing");
        }
    }
    let back_at = back_at.expect("pod-0 back");
    assert!(
        back_at - recovered <= ms(500) + gap,
        "back {:?} after recovering",
        back_at - recovered
    );
    assert!(far_after_recovery <= 7, "{far_after_recovery}");
}

/// Evict `pod-0` with a slow answer at `at`.
fn evict_slow(r: &Router, at: Instant, rng: &mut SmallRng) {
    let p = r.pick(&key(), None, at, rng, &["pod-1".into()]).unwrap();
    assert_eq!(p.endpoint().id, "pod-0");
    assert_eq!(r.record(&p, at, ok(ms(500))), Some(PoolChange::Evicted));
}

/// Re-admit `pod-0` with good probes from `from`; returns when it happened.
fn readmit(r: &Router, from: Instant) -> (Instant, u128) {
    let (first, ticket) = next_probe(r, from);
    let mut change = r.finish_probe(ticket, first, ok(ms(5)));
    let mut last = first;
    while change.is_none() {
        let (at, ticket) = next_probe(r, last);
        change = r.finish_probe(ticket, at, ok(ms(5)));
        last = at;
    }
    assert_eq!(change, Some(PoolChange::Readmitted));
    (last, (first - from).as_millis())
}

#[test]
fn a_pod_that_flaps_waits_longer_each_time_and_is_forgiven_when_it_stays_healthy() {
    let t0 = Instant::now();
    let r = router_with_a_good_member(
        &[
            ("latency-slo", "80ms"),
            ("qos-pool-probe-interval", "100ms"),
            ("qos-pool-max-age", "10s"),
            // One slow answer evicts (on the share alone): the flaps are what is tested.
            ("qos-pool-verdict-confidence", "0"),
        ],
        t0,
    );
    let mut rng = SmallRng::seed_from_u64(8);
    let mut t = t0;
    let mut first_probe_waits = vec![];
    for _ in 0..4 {
        evict_slow(&r, t, &mut rng);
        let (back, wait) = readmit(&r, t);
        first_probe_waits.push(wait);
        // Slow again one second after coming back.
        t = back + ms(1000);
    }
    assert_eq!(first_probe_waits, [100, 200, 400, 800]);
    assert_eq!(explain(&r, t, "pod-0").flaps, 3);
    // Healthy for 25 s (two max-ages): the backoff halves twice.
    let back = t;
    for i in 0..25 {
        request(&r, back + Duration::from_secs(i), &mut rng, &|_| ok(ms(5)));
    }
    t = back + Duration::from_secs(25);
    evict_slow(&r, t, &mut rng);
    let (_, wait) = readmit(&r, t);
    assert_eq!(wait, 200);
}

#[test]
fn a_readmitted_pod_ramps_up_instead_of_taking_a_burst() {
    let t0 = Instant::now();
    let r = router(
        3,
        &[
            ("latency-slo", "80ms"),
            ("qos-pool-probe-interval", "100ms"),
            ("qos-pool-slow-start", "10s"),
        ],
        t0,
    );
    let mut rng = SmallRng::seed_from_u64(9);
    let mut t = t0;
    let slow_until = t0 + ms(2000);
    for _ in 0..2000 {
        t += ms(1);
        request(&r, t, &mut rng, &|id| {
            ok(if id == "pod-2" && t < slow_until {
                ms(300)
            } else {
                ms(10)
            })
        });
    }
    assert_eq!(pool(&r), ["pod-0", "pod-1"]);
    let (back, _) = readmit_pod(&r, t);
    assert_eq!(pool(&r), ["pod-0", "pod-1", "pod-2"]);
    // Shares per second at 100 requests a second for 12 s.
    let mut per_second = vec![];
    for s in 0..12u64 {
        let mut counts: HashMap<String, u32> = HashMap::new();
        for k in 0..100u64 {
            let now = back + ms(s * 1000 + k * 10);
            let (id, _) = request(&r, now, &mut rng, &|_| ok(ms(10)));
            *counts.entry(id).or_default() += 1;
        }
        per_second.push(counts.get("pod-2").copied().unwrap_or(0));
    }
    // First second: about 10% of a full share (33), never a burst; then it grows.
    assert!(per_second[0] <= 8, "{per_second:?}");
    assert!(per_second[0] >= 1, "{per_second:?}");
    assert!(per_second[4] > per_second[0], "{per_second:?}");
    assert!(
        per_second[11] >= 30 && per_second[11] <= 36,
        "{per_second:?}"
    );
    let e = explain(&r, back + ms(11_500), "pod-2");
    assert_eq!(e.weight, 1.0);
}

fn readmit_pod(r: &Router, from: Instant) -> (Instant, ()) {
    let mut last = from;
    loop {
        let (at, ticket) = next_probe(r, last);
        if r.finish_probe(ticket, at, ok(ms(10))) == Some(PoolChange::Readmitted) {
            return (at, ());
        }
        last = at;
    }
}

#[test]
fn a_readmitted_pod_keeps_its_good_history_so_one_outlier_does_not_evict_it() {
    let t0 = Instant::now();
    let r = router(
        1,
        &[
            ("latency-slo", "80ms"),
            ("qos-pool-probe-interval", "100ms"),
            // Judged on the share alone: four slow answers of 54 evict.
            ("qos-pool-verdict-confidence", "0"),
        ],
        t0,
    );
    let mut rng = SmallRng::seed_from_u64(10);
    for i in 0..50 {
        request(&r, t0 + ms(i), &mut rng, &|_| ok(ms(10)));
    }
    let mut t = t0 + ms(50);
    for _ in 0..4 {
        t += ms(1);
        request(&r, t, &mut rng, &|_| ok(ms(200)));
    }
    assert!(pool(&r).is_empty());
    let (back, _) = readmit_pod(&r, t);
    let e = explain(&r, back, "pod-0");
    assert_eq!(
        e.within_slo, e.samples,
        "the misses that evicted it are gone"
    );
    assert!(e.samples > 50, "its good history is kept: {e:?}");
    // One ordinary outlier (p95 allows 5%) right after its return.
    request(&r, back + ms(1), &mut rng, &|_| ok(ms(200)));
    assert_eq!(pool(&r), ["pod-0"]);
}

#[test]
fn a_settings_change_rejudges_every_pod_at_once_on_the_samples_it_has() {
    // The example: evicted at 80 ms with 2/2 samples of 150 ms; the SLO
    // becomes 200 ms; it stayed out 47 s. Now it is back at once.
    let t0 = Instant::now();
    let r = router(2, &[("latency-slo", "80ms")], t0);
    let mut rng = SmallRng::seed_from_u64(11);
    for i in 0..30 {
        request(&r, t0 + ms(i), &mut rng, &|id| {
            ok(if id == "pod-1" { ms(150) } else { ms(10) })
        });
    }
    assert_eq!(pool(&r), ["pod-0"]);
    let e = explain(&r, t0 + ms(30), "pod-1");
    assert!(e.samples < 3, "{e:?}");
    let spec = ServiceSpec::new(key(), vec![], settings(&[("latency-slo", "200ms")]));
    r.apply([Update::UpsertService(spec)], t0 + ms(40));
    assert_eq!(pool(&r), ["pod-0", "pod-1"]);
    // An evicted pod without fresh samples is probed at once instead.
    let spec = ServiceSpec::new(key(), vec![], settings(&[("latency-slo", "5ms")]));
    r.apply([Update::UpsertService(spec)], t0 + ms(50));
    assert!(pool(&r).is_empty());
    let later = t0 + Duration::from_secs(60);
    let spec = ServiceSpec::new(key(), vec![], settings(&[("latency-slo", "300ms")]));
    r.apply([Update::UpsertService(spec)], later);
    assert_eq!(r.due_probes(later).len(), 2, "probed at once");
}

#[test]
fn a_miss_explained_by_a_stall_of_the_proxy_is_set_aside() {
    let t0 = Instant::now();
    let r = router(1, &[("latency-slo", "80ms")], t0);
    let mut rng = SmallRng::seed_from_u64(12);
    for i in 0..20 {
        request(&r, t0 + ms(i), &mut rng, &|_| ok(ms(10)));
    }
    let p = pick(&r, t0 + ms(20), &mut rng);
    // 120 ms, of which the proxy was stalled 60: no verdict.
    r.record_stalled(&p, t0 + ms(140), ok(ms(120)), ms(60));
    assert_eq!(explain(&r, t0 + ms(140), "pod-0").samples, 20);
    // 200 ms with a 60 ms stall: a miss all the same.
    r.record_stalled(&p, t0 + ms(220), ok(ms(200)), ms(60));
    let e = explain(&r, t0 + ms(220), "pod-0");
    assert_eq!((e.samples, e.within_slo), (21, 20));
}

#[test]
fn noise_during_a_measured_stall_does_not_empty_a_healthy_pool() {
    let t0 = Instant::now();
    let r = router(2, &[("latency-slo", "80ms")], t0);
    let mut rng = SmallRng::seed_from_u64(13);
    for i in 0..100 {
        request(&r, t0 + ms(i), &mut rng, &|_| ok(ms(10)));
    }
    let t = t0 + ms(100);
    r.note_stall(t);
    // Everything is slow for a while: the pool shrinks, but not to nothing.
    for i in 0..40 {
        request(&r, t + ms(i), &mut rng, &|_| ok(ms(150)));
    }
    assert_eq!(pool(&r).len(), 1);
    let kept = &pool(&r)[0];
    let e = explain(&r, t + ms(40), kept);
    assert!(e.reason.contains("stalled"), "{}", e.reason);
    // Without a stall in the last few seconds, the verdict stands.
    let later = t + Duration::from_secs(10);
    for i in 0..10 {
        request(&r, later + ms(i), &mut rng, &|_| ok(ms(150)));
    }
    assert!(pool(&r).is_empty());
}

#[test]
fn the_empty_pool_fallback_predicts_unmeasured_pods_from_rtt_plus_processing() {
    // SLO 40 ms. pod-0 (this node) measured at 45 ms; pod-1 never measured, 52 ms away;
    // pod-2 never measured, 100 ms away. Before, unknown pods scored 0: the best; then
    // their RTT alone.
    let t0 = Instant::now();
    let r = router(3, &[("latency-slo", "40ms")], t0);
    r.update_environment(|env| {
        env.set_latency("node-1", ms(52), t0);
        env.set_latency("node-2", ms(100), t0);
    });
    assert_eq!(pool(&r), ["pod-0"]);
    let mut rng = SmallRng::seed_from_u64(14);
    for i in 0..5 {
        request(&r, t0 + ms(i), &mut rng, &|_| ok(ms(45)));
    }
    assert!(pool(&r).is_empty());
    for i in 0..50 {
        let p = pick(&r, t0 + ms(10 + i), &mut rng);
        assert_eq!(p.reason, Reason::Fallback);
        assert_eq!(p.endpoint().id, "pod-0");
    }
    // pod-1's node comes within the SLO, 30 ms away; but the service's pods take 45 ms
    // to answer (pod-0 is on this node): 75 ms predicted, kept out, and never preferred
    // to the pod that answers in 45.
    r.update_environment(|env| env.set_latency("node-1", ms(30), t0 + ms(100)));
    assert!(pool(&r).is_empty());
    let e = explain(&r, t0 + ms(100), "pod-1");
    assert!(
        e.reason.contains("(75ms in all) exceeds the 40ms SLO"),
        "{}",
        e.reason
    );
    let p = pick(&r, t0 + ms(100), &mut rng);
    assert_eq!(p.endpoint().id, "pod-0");
}

/// Requests arrive every `gap`; each holds its pod for that pod's latency, so in-flight
/// counts are what a real proxy would see. Returns the picks per pod after warm-up.
fn spread_under_concurrency(
    r: &Router,
    t0: Instant,
    latency: &dyn Fn(&str) -> Duration,
    gap: Duration,
    requests: usize,
) -> HashMap<String, u32> {
    let mut rng = SmallRng::seed_from_u64(15);
    let mut open: VecDeque<(Instant, Picked)> = VecDeque::new();
    let mut counts: HashMap<String, u32> = HashMap::new();
    for k in 0..requests {
        let now = t0 + gap * k as u32;
        open.make_contiguous().sort_by_key(|(done, _)| *done);
        while open.front().is_some_and(|(done, _)| *done <= now) {
            let (done, p) = open.pop_front().unwrap();
            r.record(&p, done, ok(latency(&p.endpoint().id)));
        }
        let p = pick(r, now, &mut rng);
        let id = p.endpoint().id.clone();
        if k >= requests / 10 {
            *counts.entry(id.clone()).or_default() += 1;
        }
        open.push_back((now + latency(&id), p));
    }
    counts
}

/// A router of `n` pods spreading by slack under `slo`.
fn slack_router(n: usize, slo: &str, now: Instant) -> Router {
    router(
        n,
        &[("latency-slo", slo), ("qos-pool-spread", "slack")],
        now,
    )
}

/// `id`'s share of all the picks in `counts`.
fn share_of(counts: &HashMap<String, u32>, id: &str) -> f64 {
    f64::from(counts[id]) / f64::from(counts.values().sum::<u32>())
}

fn max_over_min(counts: &HashMap<String, u32>) -> f64 {
    let max = *counts.values().max().unwrap() as f64;
    let min = *counts.values().min().unwrap() as f64;
    max / min
}

#[test]
fn the_spread_is_even_whatever_the_rtt() {
    let t0 = Instant::now();
    let r = router(
        3,
        &[("latency-slo", "80ms"), ("qos-pool-spread", "even")],
        t0,
    );
    // pod-0 on this node (2 ms), pod-1 and pod-2 far away (50 and 70 ms), 200 rps.
    let latency = |id: &str| match id {
        "pod-0" => ms(2),
        "pod-1" => ms(50),
        _ => ms(70),
    };
    let counts = spread_under_concurrency(&r, t0, &latency, ms(5), 6000);
    assert_eq!(counts.len(), 3);
    assert!(max_over_min(&counts) <= 1.2, "{counts:?}");
}

#[test]
fn the_slack_spread_sends_the_roomy_pods_most_evenly_and_starves_none() {
    // A loose SLO (400 ms) that every pod meets on paper, at 50 requests/s: two pods
    // near (20 and 25 ms: level, 5 ms apart against a 50 ms level), two far (200 and
    // 300 ms). Two random choices would send the far ones half of the requests; the
    // slack rule looks at the whole pool.
    let t0 = Instant::now();
    let r = slack_router(4, "400ms", t0);
    let latency = |id: &str| match id {
        "pod-0" => ms(20),
        "pod-1" => ms(25),
        "pod-2" => ms(200),
        _ => ms(300),
    };
    let counts = spread_under_concurrency(&r, t0, &latency, ms(20), 12_000);
    eprintln!("{counts:?}");
    let share = |id: &str| share_of(&counts, id);
    assert!(share("pod-0") + share("pod-1") >= 0.8, "{counts:?}");
    let near = [counts["pod-0"], counts["pod-1"]];
    let (hi, lo) = (near.iter().max().unwrap(), near.iter().min().unwrap());
    assert!(
        f64::from(*hi) / f64::from(*lo) <= 1.2,
        "near pods uneven: {counts:?}"
    );
    // One decision in eight is even: the far pods keep a floor share.
    assert!(
        share("pod-2") >= 0.02 && share("pod-3") >= 0.02,
        "starved: {counts:?}"
    );
    // `qos-pool-slack-even-turns: 0`: no floor, the far pods take only what the near
    // ones cannot (here nothing).
    let pairs = [
        ("latency-slo", "400ms"),
        ("qos-pool-spread", "slack"),
        ("qos-pool-slack-even-turns", "0"),
    ];
    let r = router(4, &pairs, t0);
    let counts = spread_under_concurrency(&r, t0, &latency, ms(20), 12_000);
    let far: u32 = ["pod-2", "pod-3"]
        .iter()
        .filter_map(|id| counts.get(*id))
        .sum();
    assert!(far < 120, "{counts:?}");
}

#[test]
fn the_slack_spreads_even_turns_skip_a_member_within_noise_of_the_slo() {
    // A 150 ms SLO at p99, 20 requests a second: pod-0 answers in 20 ms (the roomy
    // tier), pod-1 in 100 ms (50 ms of room: outside the tier, but with room beyond the
    // tier's width of 150 / 8 ms), pod-2 in 145 ms (5 ms of room: host jitter turns its
    // answers into misses). The even turns keep pod-1 measured with a floor share;
    // pod-2, once measured, gets none (before, it took the floor share too, and at 50
    // nodes a pod like it missed a third of those requests).
    let t0 = Instant::now();
    let r = router(
        3,
        &[
            ("latency-slo", "150ms"),
            ("slo-percentile", "99"),
            ("qos-pool-spread", "slack"),
        ],
        t0,
    );
    let latency = |id: &str| match id {
        "pod-0" => ms(20),
        "pod-1" => ms(100),
        _ => ms(145),
    };
    let counts = spread_under_concurrency(&r, t0, &latency, ms(50), 2400);
    eprintln!("{counts:?}");
    assert_eq!(pool(&r), ["pod-0", "pod-1", "pod-2"]);
    assert!(share_of(&counts, "pod-1") >= 0.06, "{counts:?}");
    assert!(counts.get("pod-2").copied().unwrap_or(0) <= 2, "{counts:?}");
}

#[test]
fn the_slack_spread_ranks_a_pod_nobody_measured_by_its_rtt_and_the_processing_time() {
    // pod-0 on this node answers in 45 ms (35 ms of room under 80 ms); pod-1, never
    // measured, is 60 ms away: 60 ms + the service's 45 ms of processing is past the
    // SLO, so it has the least room, not the "half the SLO" of an unknown pod.
    let t0 = Instant::now();
    let r = slack_router(2, "80ms", t0);
    r.update_environment(|env| env.set_latency("node-1", ms(60), t0));
    let mut rng = SmallRng::seed_from_u64(23);
    let mut now = t0;
    for _ in 0..10 {
        let p = r
            .pick(&key(), None, now, &mut rng, &["pod-1".into()])
            .unwrap();
        now += ms(50);
        r.record(&p, now, ok(ms(45)));
    }
    let room = |id: &str| explain(&r, now, id).slack_ms;
    assert!((30.0..=36.0).contains(&room("pod-0")), "{}", room("pod-0"));
    assert!(room("pod-1") <= 80.0 / 64.0 + 1e-9, "{}", room("pod-1"));
}

/// A request every `gap` for `requests` requests. pod-0 is near but works on one request
/// at a time, `service` each (a single-worker queue: a request waits for those ahead of
/// it); pod-1 is far and answers in `far` whatever the load. Returns the share of
/// answers within `slo` and the picks per pod, past the first tenth.
fn near_pod_with_a_capacity(
    spread: &str,
    gap: Duration,
    service: Duration,
    far: Duration,
    requests: usize,
) -> (f64, HashMap<String, u32>) {
    let t0 = Instant::now();
    let slo = ms(20);
    let r = router(
        2,
        &[("latency-slo", "20ms"), ("qos-pool-spread", spread)],
        t0,
    );
    let mut rng = SmallRng::seed_from_u64(21);
    let mut open: VecDeque<(Instant, Picked, Duration)> = VecDeque::new();
    let mut counts: HashMap<String, u32> = HashMap::new();
    let (mut within, mut counted) = (0, 0);
    let mut near_free_at = t0;
    for k in 0..requests {
        let now = t0 + gap * k as u32;
        open.make_contiguous().sort_by_key(|(done, ..)| *done);
        while open.front().is_some_and(|(done, ..)| *done <= now) {
            let (done, p, latency) = open.pop_front().unwrap();
            r.record(&p, done, ok(latency));
        }
        let p = pick(&r, now, &mut rng);
        let id = p.endpoint().id.clone();
        let latency = if id == "pod-0" {
            near_free_at = near_free_at.max(now) + service;
            near_free_at - now
        } else {
            far
        };
        if k >= requests / 10 {
            *counts.entry(id).or_default() += 1;
            counted += 1;
            within += usize::from(latency <= slo);
        }
        open.push_back((now + latency, p, latency));
    }
    (within as f64 / counted as f64, counts)
}

#[test]
fn the_slack_spread_pushes_no_pod_past_its_capacity() {
    // 450 requests per second; the near pod serves 250 per second at most (4 ms each),
    // the far one answers in 17 ms. Its slack says "send the near pod more"; its queue
    // (requests in flight) says when that is enough.
    let (within, counts) =
        near_pod_with_a_capacity("slack", Duration::from_micros(2222), ms(4), ms(17), 20_000);
    let (even_within, even_counts) =
        near_pod_with_a_capacity("even", Duration::from_micros(2222), ms(4), ms(17), 20_000);
    eprintln!("slack {within:.4} {counts:?}; even {even_within:.4} {even_counts:?}");
    assert!(within >= even_within - 0.002, "{within} {counts:?}");
    let near = share_of(&counts, "pod-0");
    assert!(
        near <= 0.58,
        "past its capacity (250 of 450 a second): {counts:?}"
    );
}

#[test]
fn the_slack_spread_sends_more_to_the_near_pod_with_room() {
    // 200 requests per second, a 12 ms SLO: the near pod answers in 3 ms, the other in
    // 9 ms (3 ms of slack). Even, each takes half and the tight one's answers ride the
    // SLO's edge; by slack, the one with room takes most.
    let t0 = Instant::now();
    let r = slack_router(2, "12ms", t0);
    let latency = |id: &str| if id == "pod-0" { ms(3) } else { ms(9) };
    let counts = spread_under_concurrency(&r, t0, &latency, ms(5), 6000);
    eprintln!("{counts:?}");
    let near = share_of(&counts, "pod-0");
    assert!(near >= 0.7, "{counts:?}");
    assert!(counts["pod-1"] > 0, "starved: {counts:?}");
    // /debug/pools shows the room each was ranked by: about 9 ms and 3 ms.
    let end = t0 + ms(5) * 6000;
    let room = |id: &str| explain(&r, end, id).slack_ms;
    assert!((7.0..=9.5).contains(&room("pod-0")), "{}", room("pod-0"));
    assert!((2.0..=3.5).contains(&room("pod-1")), "{}", room("pod-1"));
}

#[test]
fn a_saturated_pod_gets_less_than_an_even_share() {
    let t0 = Instant::now();
    let r = router(2, &[("latency-slo", "10s")], t0);
    let mut rng = SmallRng::seed_from_u64(16);
    // pod-1 holds 20 requests that do not come back; pod-0 is idle.
    let stuck: Vec<Picked> = (0..20)
        .map(|_| {
            r.pick(&key(), None, t0, &mut rng, &["pod-0".into()])
                .unwrap()
        })
        .collect();
    let mut to_stuck = 0;
    for _ in 0..200 {
        let p = pick(&r, t0, &mut rng);
        if p.endpoint().id == "pod-1" {
            to_stuck += 1;
        }
    }
    assert_eq!(to_stuck, 0);
    drop(stuck);
}

#[test]
fn a_quiet_pod_whose_few_samples_all_miss_leaves_the_pool() {
    let t0 = Instant::now();
    let r = router(
        2,
        &[("latency-slo", "80ms"), ("qos-pool-min-samples", "5")],
        t0,
    );
    let mut rng = SmallRng::seed_from_u64(17);
    // One request every 5 s.
    let mut t = t0;
    let mut changes = vec![];
    while pool(&r).len() == 2 && t < t0 + Duration::from_secs(60) {
        let p = pick(&r, t, &mut rng);
        let slow = p.endpoint().id == "pod-1";
        changes.extend(r.record(&p, t, ok(if slow { ms(200) } else { ms(20) })));
        t += Duration::from_secs(5);
    }
    assert_eq!(pool(&r), ["pod-0"]);
    assert_eq!(changes, [PoolChange::Evicted]);
    let e = explain(&r, t, "pod-1");
    assert_eq!(e.samples, 1, "judged on one sample: {e:?}");
}

#[test]
fn a_warming_pod_is_judged_after_max_age_on_the_samples_it_has() {
    let t0 = Instant::now();
    let r = router(
        1,
        &[
            ("latency-slo", "80ms"),
            ("qos-pool-min-samples", "10"),
            ("qos-pool-max-age", "30s"),
        ],
        t0,
    );
    let mut rng = SmallRng::seed_from_u64(18);
    // Half its answers miss, one every 4 s: never "all miss", never 10 samples.
    let mut t = t0;
    for k in 0..9u32 {
        request(&r, t, &mut rng, &|_| {
            ok(if k % 2 == 0 { ms(20) } else { ms(200) })
        });
        let state = r.table().services[&key()].endpoints[0].state.clone();
        if t < t0 + Duration::from_secs(30) {
            assert!(state.in_pool(), "warming at {k}");
        }
        t += Duration::from_secs(4);
    }
    // Warming for 30 s is enough: judged on its fresh samples (4/8 miss at p95).
    let table = r.table();
    let e = explain(&r, t, "pod-0");
    assert!(
        !table.services[&key()].endpoints[0].state.in_pool(),
        "{e:?}"
    );
    assert!(matches!(e.admission, Admission::Evicted { .. }));
}

#[test]
fn the_spread_is_even_for_closed_loop_clients_too() {
    // Six clients, each sending its next request when the previous one is answered:
    // the far pod holds nearly every request in flight, which is latency, not a queue.
    let t0 = Instant::now();
    let r = router(
        2,
        &[("latency-slo", "200ms"), ("qos-pool-spread", "even")],
        t0,
    );
    let latency = |id: &str| if id == "pod-0" { ms(2) } else { ms(40) };
    let mut rng = SmallRng::seed_from_u64(19);
    let mut open: Vec<(Instant, Picked)> = Vec::new();
    let mut counts: HashMap<String, u32> = HashMap::new();
    for _ in 0..6 {
        let p = pick(&r, t0, &mut rng);
        open.push((t0 + latency(&p.endpoint().id), p));
    }
    for k in 0..3000 {
        open.sort_by_key(|(done, _)| *done);
        let (now, p) = open.remove(0);
        r.record(&p, now, ok(latency(&p.endpoint().id)));
        drop(p);
        let next = pick(&r, now, &mut rng);
        let id = next.endpoint().id.clone();
        if k >= 300 {
            *counts.entry(id.clone()).or_default() += 1;
        }
        open.push((now + latency(&id), next));
    }
    assert!(max_over_min(&counts) <= 1.2, "{counts:?}");
}

#[test]
fn a_pod_kept_for_a_stall_is_judged_once_the_stall_is_over_without_new_traffic() {
    let t0 = Instant::now();
    let r = router(1, &[("latency-slo", "80ms")], t0);
    let mut rng = SmallRng::seed_from_u64(17);
    r.note_stall(t0);
    for i in 0..5 {
        request(&r, t0 + ms(i), &mut rng, &|_| ok(ms(150)));
    }
    assert_eq!(pool(&r), ["pod-0"], "kept while the proxy had just stalled");
    // No traffic at all afterwards: the background tick re-judges it.
    assert!(r.due_probes(t0 + ms(100)).is_empty());
    assert_eq!(pool(&r), ["pod-0"], "still within the stall memory");
    let after = t0 + proxima_core::router::STALL_MEMORY + ms(100);
    let _ = r.due_probes(after);
    assert!(
        pool(&r).is_empty(),
        "judged on its misses once the stall is forgotten"
    );
    let e = explain(&r, after, "pod-0");
    assert!(e.reason.starts_with("evicted for latency"), "{}", e.reason);
}

/// Add `pod-new` (at `addr(n)`) to the service of `router(n, ..)`.
fn add_pod(r: &Router, n: usize, now: Instant) {
    r.apply(
        [Update::UpsertEndpoint {
            service: key(),
            endpoint: Endpoint::new("pod-new", addr(n)).on_node("node-new"),
        }],
        now,
    );
}

#[test]
fn a_new_pod_joins_a_measured_pool_only_after_a_first_probe_within_the_slo() {
    let slo = [("latency-slo", "80ms")];
    let t0 = Instant::now();
    let r = router(2, &slo, t0);
    let mut rng = SmallRng::seed_from_u64(19);
    // A fresh service: its pods are tried on the initial estimate, and probed once each.
    let first: Vec<String> = r.due_probes(t0).into_iter().map(|t| t.id.clone()).collect();
    assert_eq!(
        first.len(),
        2,
        "every new pod gets a first probe: {first:?}"
    );
    for i in 0..20 {
        request(&r, t0 + ms(i), &mut rng, &|_| ok(ms(10)));
    }
    // A pod that is always slow joins: no client request reaches it, its probe says no.
    let t = t0 + ms(100);
    add_pod(&r, 2, t);
    assert_eq!(pool(&r), ["pod-0", "pod-1"]);
    let e = explain(&r, t, "pod-new");
    assert!(!e.in_pool && e.reason.contains("first probe"), "{e:?}");
    let tickets = r.due_probes(t);
    assert_eq!(tickets.len(), 1, "only the new pod is probed");
    assert_eq!(tickets[0].id, "pod-new");
    assert!(r.due_probes(t).is_empty(), "one first probe at a time");
    for i in 0..50 {
        let (id, _) = request(&r, t + ms(i), &mut rng, &|_| ok(ms(10)));
        assert_ne!(id, "pod-new", "a client request went to the unprobed pod");
    }
    let ticket = tickets.into_iter().next().unwrap();
    r.finish_probe(ticket, t + ms(300), ok(ms(300)));
    assert_eq!(pool(&r), ["pod-0", "pod-1"]);
    assert!(explain(&r, t + ms(300), "pod-new").out_because.is_some());
    // A good new pod joins as soon as its first probe answers within the SLO.
    let r = router(2, &slo, t0);
    for i in 0..20 {
        request(&r, t0 + ms(i), &mut rng, &|_| ok(ms(10)));
    }
    add_pod(&r, 2, t);
    let ticket = r
        .due_probes(t)
        .into_iter()
        .find(|p| p.id == "pod-new")
        .expect("a first probe of the new pod");
    r.finish_probe(ticket, t + ms(10), ok(ms(10)));
    assert_eq!(pool(&r), ["pod-0", "pod-1", "pod-new"]);
    let mut to_new = 0;
    for i in 0..30 {
        let (id, _) = request(&r, t + ms(20 + i), &mut rng, &|_| ok(ms(10)));
        to_new += usize::from(id == "pod-new");
    }
    assert!(
        to_new >= 5,
        "the probed pod takes its share: {to_new} of 30"
    );
}

#[test]
fn without_a_measured_member_new_pods_still_take_traffic_on_the_initial_estimate() {
    let t0 = Instant::now();
    let r = router(3, &[("latency-slo", "80ms")], t0);
    let mut rng = SmallRng::seed_from_u64(23);
    // Probes in flight and unanswered: the first requests are not held back.
    assert_eq!(r.first_probes_pending(t0), 3);
    let probes = r.due_probes(t0);
    assert_eq!(probes.len(), 3);
    assert_eq!(pool(&r), ["pod-0", "pod-1", "pod-2"]);
    let (_, reason) = request(&r, t0, &mut rng, &|_| ok(ms(10)));
    assert!(matches!(reason, Reason::Pool), "{reason:?}");
    assert_eq!(
        r.first_probes_pending(t0),
        2,
        "the request measured one pod"
    );
    for probe in probes {
        r.finish_probe(probe, t0 + ms(5), ok(ms(5)));
    }
    assert_eq!(r.first_probes_pending(t0 + ms(5)), 0);
}

#[test]
fn the_slack_tier_width_is_a_setting_checked_like_the_others() {
    let (_, errors) = ServiceSettings::from_pairs([("qos-pool-slack-levels", "32")]);
    assert!(errors.is_empty(), "{errors:?}");
    for bad in ["-1", "x", "1001"] {
        let (_, errors) = ServiceSettings::from_pairs([("qos-pool-slack-even-turns", bad)]);
        assert_eq!(errors.len(), 1, "{bad}: {errors:?}");
    }
    for bad in ["0", "x", "5000"] {
        let (_, errors) = ServiceSettings::from_pairs([("qos-pool-slack-levels", bad)]);
        assert_eq!(errors.len(), 1, "{bad}: {errors:?}");
        assert!(errors[0].expected.contains("1 to 1000"), "{errors:?}");
    }
}
