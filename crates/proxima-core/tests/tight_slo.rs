//! A tight SLO under mild noise (issue 30): two pods next door that meet a 12 ms SLO at
//! p95 but miss it now and then when the host jitters, and three pods 50 to 100 ms away
//! that never can. The far pods must never take a request while a near one is there:
//! a pod that misses now and then beats a pod that misses always. Deterministic: time is
//! passed in and the RNGs are seeded.

mod common;

use std::time::{Duration, Instant};

use proxima_core::{
    Endpoint, Outcome, Picked, Reason, Router, ServiceKey, ServiceSettings, ServiceSpec, Update,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

fn key() -> ServiceKey {
    ServiceKey::new("default", "tight")
}

fn ok(latency: Duration) -> Outcome {
    Outcome::Answered {
        latency,
        status: 200,
    }
}

const NODES: [(&str, u64); 5] = [
    ("far-1", 50),
    ("far-2", 70),
    ("far-3", 100),
    ("near-1", 3),
    ("near-2", 3),
];

/// The RTT to each pod's node, ms.
fn rtt(id: &str) -> u64 {
    let i: usize = id.trim_start_matches("pod-").parse().expect("pod-N");
    NODES[i].1
}

fn set_rtts(r: &Router, now: Instant) {
    r.update_environment(|env| {
        for (node, rtt) in NODES {
            env.set_latency(node, ms(rtt), now);
        }
    });
}

/// pod-0..2 far (RTT 50, 70, 100 ms), pod-3 and pod-4 next door (3 ms); this proxy's node
/// hosts none. The ids sort far-first, so no tie-break by index can hide a bad ranking.
fn far_and_near(t0: Instant) -> Router {
    let r = Router::new(Some("node-c".into()));
    let endpoints: Vec<Endpoint> = NODES
        .iter()
        .enumerate()
        .map(|(i, (node, _))| {
            Endpoint::new(format!("pod-{i}"), ([10, 0, 0, i as u8 + 1], 80).into()).on_node(*node)
        })
        .collect();
    let (settings, errors) = ServiceSettings::from_pairs([("latency-slo", "12ms")]);
    assert!(errors.is_empty(), "{errors:?}");
    r.apply(
        [Update::Reset {
            nodes: vec![],
            services: vec![(ServiceSpec::new(key(), vec![], settings), endpoints)],
        }],
        t0,
    );
    set_rtts(&r, t0);
    assert_eq!(pool(&r), ["pod-3", "pod-4"], "the far ones are too far");
    r
}

fn pick(r: &Router, now: Instant, rng: &mut SmallRng) -> Picked {
    r.pick(&key(), None, now, rng, &[]).expect("pick")
}

fn pool(r: &Router) -> Vec<String> {
    common::pool_of(r, &key())
}

/// 120 answers in 8 ms (about 60 per near pod), then one spell of host lag: `late`
/// attempts on each near pod still unanswered at the SLO, answered at 14 ms.
fn a_spell_of_lag(r: &Router, t0: Instant, rng: &mut SmallRng, late: usize) -> Instant {
    let mut t = t0;
    for _ in 0..120 {
        t += ms(4);
        let p = pick(r, t, rng);
        r.record(&p, t, ok(ms(8)));
    }
    let late: Vec<Picked> = (0..2 * late).map(|_| pick(r, t, rng)).collect();
    for p in &late {
        r.record_overdue(p, t + ms(12));
    }
    for p in &late {
        r.record(p, t + ms(14), ok(ms(14)));
    }
    t + ms(14)
}

#[test]
fn misses_a_pod_meeting_its_slo_has_by_chance_do_not_empty_the_pool() {
    // 4 of 64 late (93.75%, under 95%), on both pods at once: as likely as not for pods
    // that miss one answer in twenty-five, so not evidence that they miss their SLO.
    let t0 = Instant::now();
    let r = far_and_near(t0);
    let mut rng = SmallRng::seed_from_u64(31);
    let t = a_spell_of_lag(&r, t0, &mut rng, 4);
    assert_eq!(pool(&r), ["pod-3", "pod-4"]);
    let reason = &r
        .explain(t)
        .services
        .remove(0)
        .endpoints
        .into_iter()
        .find(|e| e.id == "pod-3")
        .expect("pod-3")
        .reason;
    assert!(reason.contains("within its margin: 60/64"), "{reason}");
}

#[test]
fn an_emptied_pool_falls_back_to_the_near_pods_that_miss_now_and_then() {
    let t0 = Instant::now();
    let r = far_and_near(t0);
    let mut rng = SmallRng::seed_from_u64(30);
    let t = a_spell_of_lag(&r, t0, &mut rng, 8);
    assert!(pool(&r).is_empty(), "{:?}", pool(&r));
    let mut near = [0; 2];
    for i in 0..50 {
        let p = pick(&r, t + ms(i), &mut rng);
        let id = p.endpoint().id.clone();
        assert!(rtt(&id) == 3, "pick {i}: {id} ({:?})", p.reason);
        assert_eq!(p.reason, Reason::Fallback);
        near[usize::from(id == "pod-4")] += 1;
    }
    // Both share the load, as pool members would.
    assert!(near[0] >= 20 && near[1] >= 20, "{near:?}");
}

#[test]
fn requests_in_flight_never_make_a_far_pod_preferable_to_a_near_one() {
    let t0 = Instant::now();
    let r = far_and_near(t0);
    let mut rng = SmallRng::seed_from_u64(34);
    let mut t = t0;
    for _ in 0..120 {
        t += ms(4);
        let p = pick(&r, t, &mut rng);
        r.record(&p, t, ok(ms(8)));
    }
    // Eight late but answered 16 ms responses per near pod (no overdue): p95 = 16 ms.
    for _ in 0..16 {
        t += ms(1);
        let p = pick(&r, t, &mut rng);
        r.record(&p, t, ok(ms(16)));
    }
    assert!(pool(&r).is_empty(), "{:?}", pool(&r));
    // Three requests in flight on each near pod: 16 ms x 4 no longer loses to 50 ms x 1.
    let table = r.table();
    let route = &table.services[&key()];
    let _held: Vec<_> = [3usize, 4]
        .iter()
        .flat_map(|&i| (0..3).map(move |_| route.endpoints[i].state.start()))
        .collect();
    for i in 0..20 {
        let p = pick(&r, t + ms(1 + i), &mut rng);
        assert_eq!(rtt(&p.endpoint().id), 3, "{}", p.endpoint().id);
    }
}

#[test]
fn correlated_mild_lag_on_a_tight_slo_never_sends_a_request_far() {
    let t0 = Instant::now();
    let r = far_and_near(t0);
    let (mut rng, mut lag) = (SmallRng::seed_from_u64(32), SmallRng::seed_from_u64(33));
    let (mut far, mut fallback) = (0, 0);
    let (mut t, mut lag_until) = (t0, t0);
    // 40 s at 250 requests per second.
    for k in 0..10_000u32 {
        t += ms(4);
        if k % 1000 == 0 {
            set_rtts(&r, t); // fresh readings, as the peer prober keeps them
        }
        // Now and then the host lags: the next answers (about one per pod) are late.
        if lag.gen_bool(0.015) {
            lag_until = t + ms(8);
        }
        let p = pick(&r, t, &mut rng);
        let id = p.endpoint().id.clone();
        far += usize::from(rtt(&id) > 3);
        fallback += usize::from(p.reason == Reason::Fallback);
        if rtt(&id) > 3 || t < lag_until {
            r.record_overdue(&p, t);
            r.record(&p, t, ok(ms(rtt(&id).max(11) + 3)));
        } else {
            r.record(&p, t, ok(ms(8)));
        }
        for ticket in r.due_probes(t) {
            let latency = rtt(&ticket.id).max(5) + 3;
            r.finish_probe(ticket, t, ok(ms(latency)));
        }
    }
    eprintln!("{fallback} fallback picks of 10000");
    assert_eq!(far, 0, "requests sent far ({fallback} fallback picks)");
}

#[test]
fn a_pod_the_prediction_keeps_out_but_its_rtt_alone_does_not_is_probed_and_joins_if_it_can() {
    // The near pods answer in 8 ms over a 3 ms RTT: 5 ms of processing. A new pod 9 ms
    // away is predicted at 14 ms against the 12 ms SLO and kept out of the pool; but its
    // RTT alone fits, and a probe costs no client request, so it is measured rather than
    // guessed at. It processes faster than the others (10 ms in all): it joins.
    let t0 = Instant::now();
    let r = far_and_near(t0);
    let mut rng = SmallRng::seed_from_u64(35);
    let mut t = t0;
    for _ in 0..40 {
        t += ms(4);
        let p = pick(&r, t, &mut rng);
        r.record(&p, t, ok(ms(8)));
    }
    // Every first probe claimed and answered as its node's RTT says (the far ones miss).
    for ticket in r.due_probes(t) {
        let id: String = ticket.id.to_string();
        r.finish_probe(ticket, t, ok(ms(rtt(&id) + 5)));
    }
    r.update_environment(|env| env.set_latency("mid", ms(9), t));
    r.apply(
        [Update::UpsertEndpoint {
            service: key(),
            endpoint: Endpoint::new("pod-5", ([10, 0, 0, 6], 80).into()).on_node("mid"),
        }],
        t,
    );
    let explained = |at| {
        r.explain(at)
            .services
            .remove(0)
            .endpoints
            .into_iter()
            .find(|e| e.id == "pod-5")
            .expect("pod-5")
    };
    assert!(!explained(t).in_pool, "{}", explained(t).reason);
    let probes = r.due_probes(t);
    let ids: Vec<&str> = probes.iter().map(|p| p.id.as_str()).collect();
    assert_eq!(ids, ["pod-5"], "a first probe for the new pod");
    for ticket in probes {
        r.finish_probe(ticket, t + ms(10), ok(ms(10)));
    }
    let e = explained(t + ms(10));
    assert!(e.in_pool, "{}", e.reason);
}

#[test]
fn a_near_pod_that_recovers_is_probed_soon_while_the_pool_is_empty() {
    // Issue 30, seen on a generated 50-node scenario: the only pods that can meet the SLO
    // answered 503 for seconds. They left the pool, the fallback moved to the far pods
    // (measured, and slow, but answering), and the near pods' probes failed and backed
    // off to the longest wait (`qos-pool-probe-max-interval`, 4 s; longer still for pods
    // that flapped before). Once they recovered, nothing but a probe could find it out,
    // and the client stayed far for up to that wait. While the pool is empty every
    // request misses anyway: the pods that could meet the SLO are probed at the base
    // interval (500 ms), and two good probes put a near pod ahead of the far ones in the
    // fallback's ranking: the client is back near within about two intervals (4.5 s
    // after this recovery without the hurry).
    let t0 = Instant::now();
    let r = far_and_near(t0);
    let mut rng = SmallRng::seed_from_u64(36);
    let failing_from = t0 + ms(2_000);
    let mut recovered_at: Option<Instant> = None;
    let mut last_failed_probe = t0;
    let mut back_at = None;
    let mut t = t0;
    while t < t0 + ms(40_000) && back_at.is_none() {
        t += ms(10);
        if t.saturating_duration_since(t0)
            .as_millis()
            .is_multiple_of(1000)
        {
            set_rtts(&r, t); // fresh readings, as the peer prober keeps them
        }
        // Failing for at least 10 s, then recovered just after a near probe failed: the
        // moment that leaves the whole backoff ahead.
        let failed_long = t >= failing_from + ms(10_000);
        if recovered_at.is_none() && failed_long && t == last_failed_probe + ms(20) {
            recovered_at = Some(t);
        }
        let near_failing = t >= failing_from && recovered_at.is_none();
        let outcome = |id: &str| match rtt(id) {
            3 if near_failing => Outcome::Answered {
                latency: ms(4),
                status: 503,
            },
            3 => ok(ms(8)),
            far => ok(ms(far + 3)),
        };
        let p = pick(&r, t, &mut rng);
        let id = p.endpoint().id.clone();
        if recovered_at.is_some() && rtt(&id) == 3 {
            back_at = Some(t);
        }
        r.record(&p, t, outcome(&id));
        for ticket in r.due_probes(t) {
            if rtt(&ticket.id) == 3 && near_failing {
                last_failed_probe = t;
            }
            let outcome = outcome(&ticket.id);
            r.finish_probe(ticket, t, outcome);
        }
    }
    let recovered_at = recovered_at.expect("the near pods recovered");
    let back_at = back_at.expect("a request went to a near pod after the recovery");
    let waited = back_at.saturating_duration_since(recovered_at);
    assert!(
        waited <= ms(1_200),
        "back on a near pod {waited:?} after it recovered"
    );
}
