//! Strategy plugins, each checked against its paper's rule with seeded RNGs.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::*;
use proxima_core::strategy::{Decay, Proximity};
use proxima_core::{
    Conditions, Endpoint, Hints, Node, Outcome, PickError, Router, ServiceSettings, ServiceSpec,
    TrafficPolicy, Update, Usage,
};
use rand::rngs::SmallRng;
use rand::SeedableRng;

/// `pods[i]` = node of pod i; pods are named `pod-<i>`.
fn endpoints(pods: &[&str]) -> Vec<Endpoint> {
    pods.iter()
        .enumerate()
        .map(|(i, node)| {
            let mut e = pod(i, node);
            e.zone = Some(format!(
                "zone-{}",
                node.trim_start_matches("node-").chars().next().unwrap()
            ));
            e
        })
        .collect()
}

fn router(local: &str, pairs: &[(&str, &str)], pods: &[&str], traffic: TrafficPolicy) -> Router {
    let (settings, errors) = ServiceSettings::from_pairs(pairs.iter().copied());
    assert!(errors.is_empty(), "{errors:?}");
    let mut spec = ServiceSpec::new(key(), vec![], settings);
    spec.traffic = traffic;
    let mut nodes: Vec<Node> = pods
        .iter()
        .chain(std::iter::once(&local))
        .map(|n| Node {
            name: n.to_string(),
            zone: Some(format!(
                "zone-{}",
                n.trim_start_matches("node-").chars().next().unwrap()
            )),
            ..Default::default()
        })
        .collect();
    nodes.dedup_by(|a, b| a.name == b.name);
    let router = Router::new(Some(local.to_string()));
    let report = router.apply(
        [Update::Reset {
            nodes,
            services: vec![(spec, endpoints(pods))],
        }],
        Instant::now(),
    );
    assert!(report.warnings.is_empty(), "{:?}", report.warnings);
    router
}

fn distribution(router: &Router, now: Instant, n: usize, seed: u64) -> HashMap<String, usize> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut counts = HashMap::new();
    for _ in 0..n {
        match router.pick(&key(), None, now, &mut rng, &[]) {
            Ok(p) => *counts.entry(p.endpoint().id.clone()).or_default() += 1,
            Err(e) => *counts.entry(format!("error: {e}")).or_default() += 1,
        }
    }
    counts
}

fn share(counts: &HashMap<String, usize>, id: &str, n: usize) -> f64 {
    *counts.get(id).unwrap_or(&0) as f64 / n as f64
}

// ---------------------------------------------------------------- proximity (proxy-mity)

fn latencies(router: &Router, now: Instant, rtts: &[(&str, u64)]) {
    router.update_environment(|env| {
        for (node, l) in rtts {
            env.set_latency(*node, ms(*l), now);
        }
    });
}

#[test]
fn proximity_alpha_zero_is_uniform() {
    let now = Instant::now();
    let r = router(
        "node-1a",
        &[("strategy", "proximity"), ("proximity-alpha", "0")],
        &["node-1a", "node-2a", "node-3a", "node-4a"],
        TrafficPolicy::default(),
    );
    latencies(
        &r,
        now,
        &[("node-2a", 10), ("node-3a", 50), ("node-4a", 200)],
    );
    let n = 40_000;
    let counts = distribution(&r, now, n, 1);
    for i in 0..4 {
        let s = share(&counts, &format!("pod-{i}"), n);
        // 4σ of a binomial share with p = 0.25, n = 40 000 is ±0.0087.
        assert!((s - 0.25).abs() < 0.0087, "pod-{i}: {s} ({counts:?})");
    }
}

#[test]
fn proximity_alpha_one_follows_the_decay_weights() {
    let now = Instant::now();
    for (decay, beta) in [("inverse", "1"), ("power", "2"), ("exponential", "0.05")] {
        let r = router(
            "node-1a",
            &[
                ("strategy", "proximity"),
                ("proximity-alpha", "1"),
                ("proximity-decay", decay),
                ("proximity-beta", beta),
                ("proximity-localrtt", "5ms"),
            ],
            &["node-1a", "node-2a", "node-3a"],
            TrafficPolicy::default(),
        );
        latencies(&r, now, &[("node-2a", 10), ("node-3a", 40)]);
        let l = [5.0_f64, 10.0, 40.0];
        let beta: f64 = beta.parse().unwrap();
        let f: Vec<f64> = l
            .iter()
            .map(|&l| match decay {
                "inverse" => 1.0 / (beta * l),
                "power" => 1.0 / l.powf(beta),
                _ => (-beta * l).exp(),
            })
            .collect();
        let sum: f64 = f.iter().sum();
        let n = 40_000;
        let counts = distribution(&r, now, n, 2);
        for (i, fi) in f.iter().enumerate() {
            let expected = fi / sum;
            let s = share(&counts, &format!("pod-{i}"), n);
            assert!(
                (s - expected).abs() < 0.01,
                "{decay}: pod-{i} {s} vs {expected}"
            );
        }
    }
}

#[test]
fn proximity_alpha_one_with_equal_or_zero_latencies_does_not_starve_or_divide_by_zero() {
    let p = Proximity {
        alpha: 1.0,
        beta: 1.0,
        decay: Decay::Inverse,
        localrtt: None,
    };
    for decay in [Decay::Inverse, Decay::Power, Decay::Exponential] {
        let p = Proximity { decay, ..p.clone() };
        let w = p.weights(&[0.0, 0.0, 0.0]);
        assert!(
            w.iter().all(|x| (x - 1.0 / 3.0).abs() < 1e-12),
            "{decay:?} {w:?}"
        );
        let w = p.weights(&[7.0, 7.0]);
        assert!(w.iter().all(|x| (x - 0.5).abs() < 1e-12));
        // Exponential decay of very distant pods underflows without the l₀ shift.
        let w = p.weights(&[1000.0, 5000.0]);
        assert!(w.iter().all(|x| x.is_finite()) && (w.iter().sum::<f64>() - 1.0).abs() < 1e-9);
    }
}

#[test]
fn proximity_without_latency_data_is_uniform() {
    let now = Instant::now();
    let r = router(
        "node-9z",
        &[("strategy", "proximity"), ("proximity-alpha", "1")],
        &["node-1a", "node-2a"],
        TrafficPolicy::default(),
    );
    let n = 20_000;
    let counts = distribution(&r, now, n, 3);
    assert!(
        (share(&counts, "pod-0", n) - 0.5).abs() < 0.02,
        "{counts:?}"
    );
}

#[test]
fn proximity_invalid_parameters_are_reported_and_defaulted() {
    let (settings, _) = ServiceSettings::from_pairs([
        ("strategy", "proximity"),
        ("proximity-alpha", "1.5"),
        ("proximity-decay", "gaussian"),
    ]);
    let router = Router::new(None);
    let report = router.apply(
        [Update::UpsertService(ServiceSpec::new(
            key(),
            vec![],
            settings,
        ))],
        Instant::now(),
    );
    let keys: Vec<&str> = report
        .warnings
        .iter()
        .map(|(_, e)| e.key.as_str())
        .collect();
    assert_eq!(keys, ["proximity-alpha", "proximity-decay"]);
    assert_eq!(router.table().services[&key()].strategy.name(), "proximity");
}

// ---------------------------------------------------------------- RAP

fn usage(router: &Router, now: Instant, nodes: &[(&str, f64, f64)]) {
    router.update_environment(|env| {
        for (node, cpu, ram) in nodes {
            env.set_usage(
                *node,
                Usage {
                    cpu: *cpu,
                    ram: *ram,
                },
                now,
            );
        }
    });
}

fn rap_router() -> Router {
    router(
        "node-1a",
        &[("strategy", "rap")],
        &["node-1a", "node-1a", "node-2a", "node-3a", "node-4a"],
        TrafficPolicy::default(),
    )
}

#[test]
fn rap_stays_local_under_the_threshold() {
    let now = Instant::now();
    let r = rap_router();
    usage(&r, now, &[("node-1a", 0.89, 0.5), ("node-2a", 0.1, 0.1)]);
    latencies(&r, now, &[("node-2a", 3), ("node-3a", 18), ("node-4a", 30)]);
    let counts = distribution(&r, now, 2000, 4);
    assert_eq!(
        share(&counts, "pod-0", 2000) + share(&counts, "pod-1", 2000),
        1.0
    );
    // Evenly across the local pods.
    assert!(
        (share(&counts, "pod-0", 2000) - 0.5).abs() < 0.05,
        "{counts:?}"
    );
}

#[test]
fn rap_offloads_to_the_highest_scoring_node_above_the_threshold() {
    let now = Instant::now();
    let r = rap_router();
    latencies(&r, now, &[("node-2a", 3), ("node-3a", 18), ("node-4a", 30)]);
    // Local CPU over 90%. node-2a is closest but busy; node-3a has the best blend.
    usage(
        &r,
        now,
        &[
            ("node-1a", 0.95, 0.2),
            ("node-2a", 0.85, 0.8),
            ("node-3a", 0.1, 0.1),
            ("node-4a", 0.1, 0.1),
        ],
    );
    // Scores (weights 1/3 each): node-2a = (0.15 + 0.2 + 1)/3 = 0.45,
    // node-3a = (0.9 + 0.9 + 3/18)/3 = 0.656, node-4a = (0.9 + 0.9 + 0.1)/3 = 0.633.
    let counts = distribution(&r, now, 500, 5);
    assert_eq!(counts.get("pod-3"), Some(&500), "{counts:?}");
    // With latency weighted heavily, the closest node wins instead.
    let r2 = router(
        "node-1a",
        &[("strategy", "rap"), ("rap-weight-latency", "10")],
        &["node-1a", "node-1a", "node-2a", "node-3a", "node-4a"],
        TrafficPolicy::default(),
    );
    latencies(
        &r2,
        now,
        &[("node-2a", 3), ("node-3a", 18), ("node-4a", 30)],
    );
    usage(
        &r2,
        now,
        &[
            ("node-1a", 0.2, 0.95),
            ("node-2a", 0.85, 0.8),
            ("node-3a", 0.1, 0.1),
        ],
    );
    let counts = distribution(&r2, now, 500, 6);
    assert_eq!(counts.get("pod-2"), Some(&500), "{counts:?}");
}

#[test]
fn rap_stays_local_when_every_remote_node_is_over_the_threshold() {
    let now = Instant::now();
    let r = rap_router();
    latencies(&r, now, &[("node-2a", 3), ("node-3a", 18), ("node-4a", 30)]);
    usage(
        &r,
        now,
        &[
            ("node-1a", 0.99, 0.99),
            ("node-2a", 0.95, 0.1),
            ("node-3a", 0.1, 0.92),
            ("node-4a", 0.91, 0.91),
        ],
    );
    let counts = distribution(&r, now, 500, 7);
    assert_eq!(counts.len(), 2, "{counts:?}");
    assert!(counts.contains_key("pod-0") && counts.contains_key("pod-1"));
}

#[test]
fn rap_without_metrics_stays_local_and_stale_readings_count_as_missing() {
    let now = Instant::now();
    let r = rap_router();
    usage(&r, now, &[("node-1a", 0.99, 0.99)]);
    // 31 s later the overload reading is stale: local again.
    let later = now + Duration::from_secs(31);
    let counts = distribution(&r, later, 200, 8);
    assert_eq!(
        counts.get("pod-0").unwrap_or(&0) + counts.get("pod-1").unwrap_or(&0),
        200
    );
}

// ---------------------------------------------------------------- local (KubeEdge)

#[test]
fn local_never_leaves_the_node_and_spreads_evenly() {
    let now = Instant::now();
    let r = router(
        "node-2a",
        &[("strategy", "local")],
        &["node-1a", "node-2a", "node-2a", "node-2a", "node-3a"],
        TrafficPolicy::default(),
    );
    let counts = distribution(&r, now, 3000, 9);
    assert_eq!(counts.len(), 3, "{counts:?}");
    for id in ["pod-1", "pod-2", "pod-3"] {
        assert_eq!(counts[id], 1000, "round robin is exact: {counts:?}");
    }
}

#[test]
fn local_without_a_local_pod_rejects_or_goes_to_the_nearest_node() {
    let now = Instant::now();
    let pods = ["node-1a", "node-3a", "node-3a"];
    let reject = router(
        "node-2a",
        &[("strategy", "local"), ("local-fallback", "reject")],
        &pods,
        TrafficPolicy::default(),
    );
    let mut rng = SmallRng::seed_from_u64(10);
    assert_eq!(
        reject.pick(&key(), None, now, &mut rng, &[]).unwrap_err(),
        PickError::NoEndpoints
    );
    let nearest = router(
        "node-2a",
        &[("strategy", "local")],
        &pods,
        TrafficPolicy::default(),
    );
    latencies(&nearest, now, &[("node-1a", 25), ("node-3a", 8)]);
    let counts = distribution(&nearest, now, 1000, 11);
    assert_eq!(counts.get("pod-0"), None, "{counts:?}");
    assert_eq!(counts["pod-1"] + counts["pod-2"], 1000);
}

#[test]
fn local_keeps_to_the_node_even_when_its_pods_cool_down() {
    let now = Instant::now();
    let r = router(
        "node-2a",
        &[("strategy", "local"), ("local-fallback", "reject")],
        &["node-1a", "node-2a"],
        TrafficPolicy::default(),
    );
    let mut rng = SmallRng::seed_from_u64(12);
    let p = r.pick(&key(), None, now, &mut rng, &[]).unwrap();
    assert_eq!(p.endpoint().id, "pod-1");
    r.record(&p, now, Outcome::ConnectFailed);
    drop(p);
    let p = r.pick(&key(), None, now, &mut rng, &[]).unwrap();
    assert_eq!(p.endpoint().id, "pod-1", "still local while cooling down");
}

// ---------------------------------------------------------------- kube-proxy

fn with_hints(router: &Router, hints: &[(&[&str], &[&str])], pods: &[&str]) {
    let mut eps = endpoints(pods);
    for (e, (zones, nodes)) in eps.iter_mut().zip(hints) {
        e.hints = Hints {
            for_zones: zones.iter().map(|s| s.to_string()).collect(),
            for_nodes: nodes.iter().map(|s| s.to_string()).collect(),
        };
    }
    router.apply(
        [Update::SetEndpoints {
            service: key(),
            endpoints: eps,
        }],
        Instant::now(),
    );
}

#[test]
fn kube_proxy_internal_traffic_policy_local_uses_only_local_endpoints_or_drops() {
    let now = Instant::now();
    let local = TrafficPolicy {
        internal_local: true,
        ..Default::default()
    };
    let pods = ["node-1a", "node-2a", "node-2a"];
    let r = router(
        "node-2a",
        &[("strategy", "kube-proxy")],
        &pods,
        local.clone(),
    );
    assert_eq!(ids(&distribution(&r, now, 500, 13)), ["pod-1", "pod-2"]);
    let r = router("node-3b", &[("strategy", "kube-proxy")], &pods, local);
    assert_eq!(
        ids(&distribution(&r, now, 10, 14)),
        ["error: no ready endpoints"]
    );
}

#[test]
fn kube_proxy_zone_hints_are_all_or_nothing() {
    let now = Instant::now();
    let pods = ["node-1a", "node-2b", "node-3b"];
    let r = router(
        "node-2b",
        &[("strategy", "kube-proxy")],
        &pods,
        TrafficPolicy::default(),
    );
    // Every endpoint hinted, two for our zone: only those.
    with_hints(
        &r,
        &[(&["zone-1"], &[]), (&["zone-2"], &[]), (&["zone-2"], &[])],
        &pods,
    );
    // Node names' first digit gives the zone: node-2b is in zone-2.
    assert_eq!(ids(&distribution(&r, now, 500, 15)), ["pod-1", "pod-2"]);
    // One endpoint without hints: hints are ignored altogether.
    with_hints(
        &r,
        &[(&["zone-1"], &[]), (&[], &[]), (&["zone-2"], &[])],
        &pods,
    );
    assert_eq!(
        ids(&distribution(&r, now, 500, 16)),
        ["pod-0", "pod-1", "pod-2"]
    );
    // All hinted but none for our zone: all endpoints.
    with_hints(
        &r,
        &[(&["zone-1"], &[]), (&["zone-3"], &[]), (&["zone-3"], &[])],
        &pods,
    );
    assert_eq!(
        ids(&distribution(&r, now, 500, 17)),
        ["pod-0", "pod-1", "pod-2"]
    );
    // No hints and no trafficDistribution: all endpoints, uniformly.
    let r = router(
        "node-2b",
        &[("strategy", "kube-proxy")],
        &pods,
        TrafficPolicy::default(),
    );
    let counts = distribution(&r, now, 30_000, 18);
    for id in ["pod-0", "pod-1", "pod-2"] {
        assert!(
            (share(&counts, id, 30_000) - 1.0 / 3.0).abs() < 0.02,
            "{counts:?}"
        );
    }
}

/// EndpointSlice conditions: (ready, serving, terminating).
type Flags = (bool, bool, bool);
/// A pod: its node, conditions and zone hints.
type Pod<'a> = (&'a str, Flags, &'a [&'a str]);

/// Replace the endpoints with `pods`, named `pod-<i>` in order.
fn with_conditions(router: &Router, pods: &[Pod<'_>]) {
    let nodes: Vec<&str> = pods.iter().map(|p| p.0).collect();
    let mut eps = endpoints(&nodes);
    for (e, (_, (ready, serving, terminating), zones)) in eps.iter_mut().zip(pods) {
        e.conditions = Conditions {
            ready: *ready,
            serving: *serving,
            terminating: *terminating,
        };
        e.hints.for_zones = zones.iter().map(|z| z.to_string()).collect();
    }
    router.apply(
        [Update::SetEndpoints {
            service: key(),
            endpoints: eps,
        }],
        Instant::now(),
    );
}

const READY: Flags = (true, true, false);
const SERVING_TERMINATING: Flags = (false, true, true);
const GONE: Flags = (false, false, true);

#[test]
fn kube_proxy_local_policy_decides_the_terminating_fallback_among_local_endpoints() {
    let now = Instant::now();
    let local = TrafficPolicy {
        internal_local: true,
        ..Default::default()
    };
    let r = router(
        "node-2a",
        &[("strategy", "kube-proxy")],
        &["node-1a"],
        local,
    );
    // A ready pod elsewhere does not stop the local terminating fallback.
    with_conditions(
        &r,
        &[
            ("node-1a", READY, &[]),
            ("node-2a", SERVING_TERMINATING, &[]),
            ("node-2a", GONE, &[]),
        ],
    );
    assert_eq!(ids(&distribution(&r, now, 200, 30)), ["pod-1"]);
    // A ready local pod wins over the local terminating one.
    with_conditions(
        &r,
        &[
            ("node-2a", READY, &[]),
            ("node-2a", SERVING_TERMINATING, &[]),
            ("node-1a", READY, &[]),
        ],
    );
    assert_eq!(ids(&distribution(&r, now, 200, 31)), ["pod-0"]);
    // Only terminating-but-not-serving pods here: dropped, even with ready pods elsewhere.
    with_conditions(&r, &[("node-2a", GONE, &[]), ("node-1a", READY, &[])]);
    assert_eq!(
        ids(&distribution(&r, now, 10, 32)),
        ["error: no ready endpoints"]
    );
}

#[test]
fn kube_proxy_ignores_hints_when_no_endpoint_is_ready() {
    let now = Instant::now();
    let r = router(
        "node-2b",
        &[("strategy", "kube-proxy")],
        &["node-1a"],
        TrafficPolicy::default(),
    );
    // Every endpoint terminating: the fallback takes all serving ones, hints or not.
    with_conditions(
        &r,
        &[
            ("node-1a", SERVING_TERMINATING, &["zone-1"]),
            ("node-2b", SERVING_TERMINATING, &["zone-2"]),
            ("node-3b", SERVING_TERMINATING, &["zone-3"]),
            ("node-2b", GONE, &["zone-2"]),
        ],
    );
    assert_eq!(
        ids(&distribution(&r, now, 500, 33)),
        ["pod-0", "pod-1", "pod-2"]
    );
}

#[test]
fn kube_proxy_topology_is_decided_by_the_ready_endpoints_hints() {
    let now = Instant::now();
    let r = router(
        "node-2b",
        &[("strategy", "kube-proxy")],
        &["node-1a"],
        TrafficPolicy::default(),
    );
    // A terminating endpoint without hints does not turn topology off; it is not
    // used either, since ready endpoints exist.
    with_conditions(
        &r,
        &[
            ("node-1a", READY, &["zone-1"]),
            ("node-2b", READY, &["zone-2"]),
            ("node-2b", SERVING_TERMINATING, &[]),
        ],
    );
    assert_eq!(ids(&distribution(&r, now, 200, 34)), ["pod-1"]);
}

#[test]
fn kube_proxy_partly_hinted_endpoints_turn_topology_off_without_deriving_hints() {
    let now = Instant::now();
    let pods = ["node-1a", "node-2b", "node-2c", "node-3b"];
    for distribution_name in ["PreferClose", "PreferSameZone", "PreferSameNode"] {
        let policy = TrafficPolicy {
            traffic_distribution: Some(distribution_name.into()),
            ..Default::default()
        };
        // The Service asks for a distribution, but the slice carries no hints: topology
        // is off (the EndpointSlice controller writes hints, kube-proxy never derives them).
        let r = router("node-2b", &[("strategy", "kube-proxy")], &pods, policy);
        assert_eq!(
            ids(&distribution(&r, now, 500, 35)),
            ["pod-0", "pod-1", "pod-2", "pod-3"],
            "{distribution_name}"
        );
        // Hinted except one ready endpoint: still off.
        with_conditions(
            &r,
            &[
                ("node-1a", READY, &["zone-1"]),
                ("node-2b", READY, &["zone-2"]),
                ("node-2c", READY, &["zone-2"]),
                ("node-3b", READY, &[]),
            ],
        );
        assert_eq!(
            ids(&distribution(&r, now, 500, 36)),
            ["pod-0", "pod-1", "pod-2", "pod-3"],
            "{distribution_name}"
        );
    }
}

#[test]
fn kube_proxy_node_hints_come_first_then_zone_hints() {
    let now = Instant::now();
    let pods = ["node-1a", "node-2b", "node-2c"];
    let r = router(
        "node-2b",
        &[("strategy", "kube-proxy")],
        &pods,
        TrafficPolicy::default(),
    );
    let hinted = |nodes: [&[&str]; 3]| {
        with_hints(
            &r,
            &[
                (&["zone-1"], nodes[0]),
                (&["zone-2"], nodes[1]),
                (&["zone-2"], nodes[2]),
            ],
            &pods,
        )
    };
    // Every endpoint node-hinted, one for this node: only that one.
    hinted([&["node-1a"], &["node-2b"], &["node-2c"]]);
    assert_eq!(ids(&distribution(&r, now, 300, 37)), ["pod-1"]);
    // Node hints on all, none for this node: the zone hints decide.
    hinted([&["node-1a"], &["node-2x"], &["node-2c"]]);
    assert_eq!(ids(&distribution(&r, now, 300, 38)), ["pod-1", "pod-2"]);
    // Node hints missing on one: the zone hints decide.
    hinted([&["node-1a"], &["node-2b"], &[]]);
    assert_eq!(ids(&distribution(&r, now, 300, 39)), ["pod-1", "pod-2"]);
}

// ---------------------------------------------------------------- p2c-ewma

#[test]
fn p2c_ewma_prefers_the_cheaper_endpoint_and_believes_peaks_at_once() {
    let t0 = Instant::now();
    let r = router(
        "node-1a",
        &[("strategy", "p2c-ewma")],
        &["node-1a", "node-2a"],
        TrafficPolicy::default(),
    );
    let mut rng = SmallRng::seed_from_u64(22);
    // Measure both: pod-0 fast, pod-1 slow.
    let mut t = t0;
    for _ in 0..20 {
        let p = r.pick(&key(), None, t, &mut rng, &[]).unwrap();
        let latency = if p.endpoint().id == "pod-0" {
            ms(5)
        } else {
            ms(50)
        };
        r.record(&p, t, Outcome::Response { latency });
        t += ms(1);
    }
    let counts = distribution(&r, t, 100, 23);
    assert_eq!(
        counts.get("pod-0"),
        Some(&100),
        "with two endpoints P2C always compares both"
    );
    // One peak on pod-0 makes it expensive at once.
    let table = r.table();
    let p0 = &table.services[&key()].endpoints[0].state;
    let before = p0.peak_ewma(t).unwrap();
    let p = r
        .pick(&key(), None, t, &mut rng, &["pod-1".into()])
        .unwrap();
    r.record(&p, t, Outcome::Response { latency: ms(200) });
    drop(p);
    assert_eq!(p0.peak_ewma(t), Some(ms(200)));
    assert!(before < ms(10));
    assert_eq!(distribution(&r, t, 50, 24).get("pod-1"), Some(&50));
    // And the peak decays while idle (τ = 10 s): 30 s later it is below pod-1's 50 ms.
    assert!(p0.peak_ewma(t + Duration::from_secs(30)).unwrap() < ms(11));
}

#[test]
fn every_strategy_survives_an_empty_environment_and_no_local_node() {
    let now = Instant::now();
    for strategy in [
        "qos-pool",
        "round-robin",
        "random",
        "rap",
        "proximity",
        "local",
        "kube-proxy",
        "p2c-ewma",
    ] {
        let (settings, _) = ServiceSettings::from_pairs([("strategy", strategy)]);
        let router = Router::new(None);
        router.apply(
            [Update::Reset {
                nodes: vec![],
                services: vec![(
                    ServiceSpec::new(key(), vec![], settings),
                    endpoints(&["node-1a", "node-2a"]),
                )],
            }],
            now,
        );
        assert_eq!(router.table().services[&key()].strategy.name(), strategy);
        let counts = distribution(&router, now, 200, 25);
        assert_eq!(
            counts.values().sum::<usize>(),
            200,
            "{strategy}: {counts:?}"
        );
        assert!(
            counts.keys().all(|k| k.starts_with("pod-")),
            "{strategy}: {counts:?}"
        );
    }
}

#[test]
fn p2c_ewma_fallback_compares_two_distinct_endpoints() {
    // 100 endpoints, 98 already tried: the three random draws mostly find no usable one,
    // and the fallback chooses between the two left. Drawing the same one twice would
    // hand the expensive one about a quarter of those picks; two distinct draws never
    // do, so it only wins the picks where a draw saw it alone (about 6%).
    let t0 = Instant::now();
    let nodes: Vec<String> = (0..100).map(|i| format!("node-{}a", i % 5)).collect();
    let pods: Vec<&str> = nodes.iter().map(String::as_str).collect();
    let r = router(
        "node-0a",
        &[("strategy", "p2c-ewma")],
        &pods,
        TrafficPolicy::default(),
    );
    let others = |keep: &[&str]| -> Vec<String> {
        (0..100)
            .map(|i| format!("pod-{i}"))
            .filter(|id| !keep.contains(&id.as_str()))
            .collect()
    };
    let mut rng = SmallRng::seed_from_u64(31);
    // pod-0 is cheap (1 ms), pod-1 expensive (300 ms).
    for (pod, latency) in [("pod-0", 1), ("pod-1", 300)] {
        let p = r.pick(&key(), None, t0, &mut rng, &others(&[pod])).unwrap();
        assert_eq!(p.endpoint().id, pod);
        r.record(
            &p,
            t0,
            Outcome::Response {
                latency: ms(latency),
            },
        );
    }
    let exclude = others(&["pod-0", "pod-1"]);
    let n = 4000;
    let mut expensive = 0;
    for _ in 0..n {
        let p = r.pick(&key(), None, t0, &mut rng, &exclude).unwrap();
        assert!(["pod-0", "pod-1"].contains(&p.endpoint().id.as_str()));
        expensive += usize::from(p.endpoint().id == "pod-1");
    }
    let share = expensive as f64 / n as f64;
    assert!(share < 0.12, "expensive endpoint took {share}");
}

#[test]
fn proximity_weights_hold_per_pod_with_several_pods_per_node_exclusions_and_cooldowns() {
    let now = Instant::now();
    // node-1a (local, 3 pods), node-2a (2 pods), node-3a (3 pods).
    let pods = [
        "node-1a", "node-2a", "node-3a", "node-1a", "node-2a", "node-3a", "node-1a", "node-3a",
    ];
    let r = router(
        "node-1a",
        &[
            ("strategy", "proximity"),
            ("proximity-alpha", "0.7"),
            ("proximity-decay", "power"),
            ("proximity-beta", "1.5"),
            ("proximity-localrtt", "4ms"),
        ],
        &pods,
        TrafficPolicy::default(),
    );
    latencies(&r, now, &[("node-2a", 10), ("node-3a", 30)]);
    let p = Proximity {
        alpha: 0.7,
        beta: 1.5,
        decay: Decay::Power,
        localrtt: Some(ms(4)),
    };
    let latency_of = |i: usize| match pods[i] {
        "node-1a" => 4.0,
        "node-2a" => 10.0,
        _ => 30.0,
    };
    // Expected shares from the per-pod formula over the candidates.
    let expect = |candidates: &[usize]| -> HashMap<String, f64> {
        let l: Vec<f64> = candidates.iter().map(|&i| latency_of(i)).collect();
        candidates
            .iter()
            .zip(p.weights(&l))
            .map(|(&i, w)| (format!("pod-{i}"), w))
            .collect()
    };
    let check = |exclude: &[String], candidates: &[usize], seed: u64| {
        let n = 40_000;
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut counts: HashMap<String, usize> = HashMap::new();
        for _ in 0..n {
            let picked = r.pick(&key(), None, now, &mut rng, exclude).unwrap();
            *counts.entry(picked.endpoint().id.clone()).or_default() += 1;
        }
        let expected = expect(candidates);
        assert_eq!(
            counts.keys().filter(|k| !expected.contains_key(*k)).count(),
            0,
            "{counts:?}"
        );
        for (id, w) in expected {
            let s = share(&counts, &id, n);
            assert!((s - w).abs() < 0.01, "{id}: {s} vs {w} ({counts:?})");
        }
    };
    // Every pod a candidate.
    check(&[], &(0..8).collect::<Vec<_>>(), 41);
    // pod-4 (the second node-2a pod) already tried, pod-3 (local) too.
    check(&["pod-4".into(), "pod-3".into()], &[0, 1, 2, 5, 6, 7], 42);
    // pod-1 (the other node-2a pod) cools down after a refused connection: node-2a has
    // no candidate left with pod-4 excluded.
    let picked = r
        .pick(
            &key(),
            None,
            now,
            &mut SmallRng::seed_from_u64(43),
            &others_than(&["pod-1"]),
        )
        .unwrap();
    r.record(&picked, now, Outcome::ConnectFailed);
    drop(picked);
    check(&["pod-4".into()], &[0, 2, 3, 5, 6, 7], 44);
}

/// Ids of the 8 pods of the proximity test other than `keep`.
fn others_than(keep: &[&str]) -> Vec<String> {
    (0..8)
        .map(|i| format!("pod-{i}"))
        .filter(|id| !keep.contains(&id.as_str()))
        .collect()
}

#[test]
fn rap_avoids_a_node_whose_pods_cool_down_and_follows_new_readings() {
    let now = Instant::now();
    let r = router(
        "node-1a",
        &[("strategy", "rap")],
        &["node-1a", "node-2a", "node-3a"],
        TrafficPolicy::default(),
    );
    // The local node is overloaded; node-2a is the best remote node.
    usage(
        &r,
        now,
        &[
            ("node-1a", 0.95, 0.5),
            ("node-2a", 0.1, 0.1),
            ("node-3a", 0.6, 0.6),
        ],
    );
    assert_eq!(ids(&distribution(&r, now, 50, 51)), ["pod-1"]);
    // pod-1 refuses a connection and cools down: node-3a takes over at once.
    let p = r
        .pick(&key(), None, now, &mut SmallRng::seed_from_u64(52), &[])
        .unwrap();
    assert_eq!(p.endpoint().id, "pod-1");
    r.record(&p, now, Outcome::ConnectFailed);
    drop(p);
    assert_eq!(ids(&distribution(&r, now, 50, 53)), ["pod-2"]);
    // Once its cooldown is over it is the best again; then new readings move the
    // traffic to node-3a.
    let later = now + Duration::from_secs(1);
    assert_eq!(ids(&distribution(&r, later, 50, 54)), ["pod-1"]);
    usage(
        &r,
        later,
        &[
            ("node-1a", 0.95, 0.5),
            ("node-2a", 0.7, 0.7),
            ("node-3a", 0.1, 0.1),
        ],
    );
    assert_eq!(ids(&distribution(&r, later, 50, 55)), ["pod-2"]);
    // And when every reading is stale, RAP serves locally again.
    let stale = later + Duration::from_secs(120);
    assert_eq!(ids(&distribution(&r, stale, 50, 56)), ["pod-0"]);
}
