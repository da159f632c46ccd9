//! When a late attempt is sent to a second pod as well (`Picked::hedge_after`,
//! `Router::pick_hedge`): at the last moment the fastest other pool member can still
//! answer within the SLO with a tenth of it to spare, never before the late pod's own
//! prediction, and only under strategies and settings that hedge. Deterministic: time
//! is passed in and the RNG is seeded.

mod common;

use std::time::{Duration, Instant};

use common::{key, ms, pod};
use proxima_core::{
    EndpointId, Outcome, Picked, Reason, Router, ServiceSettings, ServiceSpec, Update,
};
use rand::rngs::SmallRng;
use rand::SeedableRng;

/// `latencies[i]` is pod-i's answer time; every pod is measured 40 times.
fn measured(settings: &[(&str, &str)], latencies: &[u64], t0: Instant) -> Router {
    let r = Router::new(Some("node-a".into()));
    let endpoints = (0..latencies.len())
        .map(|i| pod(i, &format!("node-{i}")))
        .collect();
    let (settings, errors) = ServiceSettings::from_pairs(settings.iter().copied());
    assert!(errors.is_empty(), "{errors:?}");
    r.apply(
        [Update::Reset {
            nodes: vec![],
            services: vec![(ServiceSpec::new(key(), vec![], settings), endpoints)],
        }],
        t0,
    );
    let mut rng = SmallRng::seed_from_u64(7);
    for (i, &latency) in latencies.iter().enumerate() {
        for n in 0..40 {
            let now = t0 + ms(n);
            let p = on(&r, i, latencies.len(), now, &mut rng);
            r.record(&p, now, answered(ms(latency)));
        }
    }
    r
}

fn answered(latency: Duration) -> Outcome {
    Outcome::Answered {
        latency,
        status: 200,
    }
}

/// A pick that can only land on pod-`i` of `count`.
fn on(r: &Router, i: usize, count: usize, now: Instant, rng: &mut SmallRng) -> Picked {
    let others: Vec<EndpointId> = (0..count)
        .filter(|&j| j != i)
        .map(|j| format!("pod-{j}"))
        .collect();
    let p = r.pick(&key(), None, now, rng, &others).expect("pick");
    assert_eq!(p.endpoint().id, format!("pod-{i}"));
    p
}

const LOOSE: &[(&str, &str)] = &[("latency-slo", "400ms"), ("slo-percentile", "99")];

#[test]
fn a_late_attempt_is_hedged_on_the_fastest_other_member_while_it_can_still_meet_the_slo() {
    let t0 = Instant::now();
    let r = measured(LOOSE, &[50, 60, 150], t0);
    let now = t0 + ms(100);
    let mut rng = SmallRng::seed_from_u64(1);
    // On the 150 ms pod: the 50 ms one can answer until 400 − 50 − 40 = 310 ms.
    let slow = on(&r, 2, 3, now, &mut rng);
    assert_eq!(slow.hedge_after(now), Some(ms(310)));
    let hedge = r.pick_hedge(&slow, None, now).expect("a hedge");
    assert_eq!(hedge.endpoint().id, "pod-0");
    assert_eq!(hedge.reason, Reason::Hedge);
    assert_eq!(
        hedge.state().in_flight(),
        1,
        "the hedge holds its pod like any attempt"
    );
    // On the fastest pod itself: the next fastest (60 ms) bounds it.
    let fast = on(&r, 0, 3, now, &mut rng);
    assert_eq!(fast.hedge_after(now), Some(ms(300)));
    assert_eq!(
        r.pick_hedge(&fast, None, now)
            .expect("a hedge")
            .endpoint()
            .id,
        "pod-1"
    );
}

#[test]
fn a_member_predicted_past_the_slo_is_hedged_all_the_same() {
    // pod-1's misses have not yet taken it out of the pool (too few to be sure), but its
    // prediction is past the SLO: its late attempts are hedged.
    let t0 = Instant::now();
    let r = measured(LOOSE, &[50, 5], t0);
    let now = t0 + ms(100);
    let mut rng = SmallRng::seed_from_u64(5);
    let late = on(&r, 1, 2, now, &mut rng);
    r.record_overdue(&late, now + ms(400));
    let p = on(&r, 1, 2, now + ms(401), &mut rng);
    assert!(p.state().in_pool());
    assert!(
        p.state().score_micros() > 400_000,
        "{}",
        p.state().score_micros()
    );
    assert_eq!(p.hedge_after(now + ms(401)), Some(ms(310)));
}

#[test]
fn a_tight_slo_leaves_no_room_for_a_second_try() {
    // 12 ms at p95 on pods answering in 10 ms: a second copy sent at 12 − 10 − 1.2 ms
    // would come before the first pod's own prediction, duplicating most requests.
    let t0 = Instant::now();
    let r = measured(&[("latency-slo", "12ms")], &[10, 10], t0);
    let mut rng = SmallRng::seed_from_u64(2);
    let p = on(&r, 0, 2, t0 + ms(100), &mut rng);
    assert_eq!(p.hedge_after(t0 + ms(100)), None);
}

#[test]
fn no_hedge_without_another_measured_member_or_when_turned_off() {
    let t0 = Instant::now();
    let mut rng = SmallRng::seed_from_u64(3);
    let alone = measured(LOOSE, &[50], t0);
    let p = on(&alone, 0, 1, t0 + ms(100), &mut rng);
    assert_eq!(p.hedge_after(t0 + ms(100)), None);
    assert!(alone.pick_hedge(&p, None, t0 + ms(100)).is_none());

    let off = [LOOSE, &[("qos-pool-hedge", "off")]].concat();
    let r = measured(&off, &[50, 60], t0);
    let p = on(&r, 1, 2, t0 + ms(100), &mut rng);
    assert_eq!(p.hedge_after(t0 + ms(100)), None);

    // A strategy that sends each request once (the baselines' papers) never hedges.
    let local = [LOOSE, &[("strategy", "round-robin")]].concat();
    let r = measured(&local, &[50, 60], t0);
    let p = on(&r, 1, 2, t0 + ms(100), &mut rng);
    assert_eq!(p.hedge_after(t0 + ms(100)), None);
}

#[test]
fn a_member_cooling_down_after_a_refused_connection_is_not_hedged_on() {
    // pod-0 is the fastest, but its last connection was refused: the hedge goes to
    // pod-1, the fastest member that can take it, and is timed by it.
    let t0 = Instant::now();
    let r = measured(LOOSE, &[50, 60, 150], t0);
    let now = t0 + ms(100);
    let mut rng = SmallRng::seed_from_u64(4);
    let refused = on(&r, 0, 3, now, &mut rng);
    r.record(&refused, now, Outcome::ConnectFailed);
    assert!(refused.state().cooling_down(now));
    let p = on(&r, 2, 3, now, &mut rng);
    assert_eq!(p.hedge_after(now), Some(ms(300)));
    let hedge = r.pick_hedge(&p, None, now).expect("a hedge");
    assert_eq!(hedge.endpoint().id, "pod-1");
}
