//! Property tests: whatever discovery and the backends do, the router's answers stay
//! within its invariants and it never panics.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proxima_core::{
    Conditions, Endpoint, Outcome, PickError, Reason, Router, ServiceKey, ServiceSettings,
    ServiceSpec, Update,
};
use rand::rngs::SmallRng;
use rand::SeedableRng;

#[derive(Clone, Debug)]
enum Op {
    /// Upsert endpoint `id` with conditions (ready, serving, terminating).
    Upsert(u8, bool, bool, bool),
    Remove(u8),
    /// A request whose attempt ends with the outcome; `exclude` ids already tried.
    Request {
        latency_ms: u16,
        outcome: u8,
        exclude: Vec<u8>,
    },
    /// Change the SLO.
    Slo(u16),
    Advance(u16),
    Probe {
        latency_ms: u16,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => (0u8..8, any::<bool>(), any::<bool>(), any::<bool>()).prop_map(|(i, r, s, t)| Op::Upsert(i, r, s, t)),
        1 => (0u8..8).prop_map(Op::Remove),
        4 => (0u16..400, 0u8..8, proptest::collection::vec(0u8..8, 0..3))
            .prop_map(|(latency_ms, outcome, exclude)| Op::Request { latency_ms, outcome, exclude }),
        1 => (1u16..300).prop_map(Op::Slo),
        1 => (0u16..5000).prop_map(Op::Advance),
        1 => (0u16..400).prop_map(|latency_ms| Op::Probe { latency_ms }),
    ]
}

fn key() -> ServiceKey {
    ServiceKey::new("default", "svc")
}

fn spec(slo_ms: u16, strategy: &str, internal_local: bool) -> ServiceSpec {
    let slo = format!("{slo_ms}ms");
    let (settings, errors) = ServiceSettings::from_pairs([
        ("latency-slo", slo.as_str()),
        ("strategy", strategy),
        ("qos-pool-probe-interval", "100ms"),
    ]);
    assert!(errors.is_empty());
    let mut spec = ServiceSpec::new(key(), vec![], settings);
    spec.traffic.internal_local = internal_local;
    spec
}

fn endpoint(i: u8, ready: bool, serving: bool, terminating: bool) -> Endpoint {
    Endpoint::new(
        format!("pod-{i}"),
        SocketAddr::from((Ipv4Addr::LOCALHOST, 9000 + u16::from(i))),
    )
    .on_node(if i.is_multiple_of(2) {
        "node-a"
    } else {
        "node-b"
    })
    .with_conditions(Conditions {
        ready,
        serving,
        terminating,
    })
}

/// `internal_local`: the Service has `internalTrafficPolicy: Local` (only the
/// `kube-proxy` strategy reads it).
fn check(strategy: &str, seed: u64, ops: Vec<Op>, internal_local: bool) {
    let t0 = Instant::now();
    let mut now = t0;
    let router = Router::new(Some("node-a".into()));
    router.apply(
        [Update::UpsertService(spec(80, strategy, internal_local))],
        now,
    );
    let mut rng = SmallRng::seed_from_u64(seed);
    for op in ops {
        match op {
            Op::Upsert(i, r, s, t) => {
                router.apply(
                    [Update::UpsertEndpoint {
                        service: key(),
                        endpoint: endpoint(i, r, s, t),
                    }],
                    now,
                );
            }
            Op::Remove(i) => {
                router.apply(
                    [Update::RemoveEndpoint {
                        service: key(),
                        id: format!("pod-{i}"),
                    }],
                    now,
                );
            }
            Op::Slo(ms) => {
                router.apply(
                    [Update::UpsertService(spec(ms, strategy, internal_local))],
                    now,
                );
            }
            Op::Advance(ms) => now += Duration::from_millis(u64::from(ms)),
            Op::Probe { latency_ms } => {
                for ticket in router.due_probes(now) {
                    let latency = Duration::from_millis(u64::from(latency_ms));
                    router.finish_probe(ticket, now, Outcome::Response { latency });
                }
            }
            Op::Request {
                latency_ms,
                outcome,
                exclude,
            } => {
                let exclude: Vec<String> = exclude.iter().map(|i| format!("pod-{i}")).collect();
                let table = router.table();
                let route = table.services.get(&key()).expect("service stays");
                // Invariant: the pool is a subset of the eligible endpoints.
                let pool = route.pool();
                assert!(pool.iter().all(|i| route.eligible().contains(i)));
                // Invariant: eligible = ready, or serving+terminating when none is ready.
                let any_ready = route.endpoints.iter().any(|e| e.endpoint.conditions.ready);
                for &i in route.eligible() {
                    let c = route.endpoints[i].endpoint.conditions;
                    assert!(if any_ready {
                        c.ready
                    } else {
                        c.serving && c.terminating
                    });
                }
                // Which endpoints may be picked: the eligible ones; under kube-proxy's
                // `internalTrafficPolicy: Local`, the local ready ones, or the local
                // serving-terminating ones when no local endpoint is ready (decided
                // among the local endpoints alone, whatever the other nodes have).
                let may_take: Vec<usize> = if internal_local && strategy == "kube-proxy" {
                    let local =
                        |i: usize| route.endpoints[i].endpoint.node.as_deref() == Some("node-a");
                    let conditions = |i: usize| route.endpoints[i].endpoint.conditions;
                    let all = 0..route.endpoints.len();
                    let local_ready: Vec<usize> = all
                        .clone()
                        .filter(|&i| local(i) && conditions(i).ready)
                        .collect();
                    if local_ready.is_empty() {
                        all.filter(|&i| {
                            local(i) && conditions(i).serving && conditions(i).terminating
                        })
                        .collect()
                    } else {
                        local_ready
                    }
                } else {
                    route.eligible().to_vec()
                };
                let allowed: Vec<usize> = may_take
                    .iter()
                    .copied()
                    .filter(|&i| !exclude.contains(&route.endpoints[i].endpoint.id))
                    .collect();
                match router.pick(&key(), None, now, &mut rng, &exclude) {
                    Ok(picked) => {
                        // Invariant: only eligible, not excluded endpoints are picked.
                        assert!(
                            allowed.contains(&picked.index),
                            "picked {} not in {allowed:?}",
                            picked.index
                        );
                        if picked.reason == Reason::Fallback {
                            // Invariant: fallback only when no usable pool member exists.
                            assert!(pool.iter().all(|&i| !allowed.contains(&i)
                                || route.endpoints[i].state.cooling_down(now)));
                        }
                        if picked.reason == Reason::Pool {
                            assert!(pool.contains(&picked.index));
                        }
                        let latency = Duration::from_millis(u64::from(latency_ms));
                        let outcome = match outcome {
                            0 => Outcome::ConnectFailed,
                            1 => Outcome::Failed,
                            2 => Outcome::Answered {
                                latency,
                                status: 503,
                            },
                            3 => {
                                // Overdue first, then the late answer.
                                router.record_overdue(&picked, now);
                                Outcome::Answered {
                                    latency,
                                    status: 200,
                                }
                            }
                            4 => {
                                // The client went away: no outcome follows.
                                router.record_abandoned(&picked, now + latency, Duration::ZERO);
                                continue;
                            }
                            5 => {
                                router.record_stalled(
                                    &picked,
                                    now,
                                    Outcome::Response { latency },
                                    latency / 2,
                                );
                                continue;
                            }
                            _ => Outcome::Response { latency },
                        };
                        router.record(&picked, now, outcome);
                    }
                    Err(e) => {
                        assert_eq!(e, PickError::NoEndpoints);
                        // Invariant: no endpoint is refused while one is allowed, except by
                        // `local`, whose policy restricts where traffic may go (kube-proxy's policy is
                        // already in `allowed`).
                        if strategy != "local" {
                            assert!(allowed.is_empty(), "refused with {allowed:?} allowed");
                        }
                    }
                }
            }
        }
    }
    // Every in-flight guard was dropped.
    for e in &router.table().services[&key()].endpoints {
        assert_eq!(e.state.in_flight(), 0);
    }
    // Explaining never panics and covers every endpoint.
    let explain = router.explain(now);
    assert_eq!(
        explain.services[0].endpoints.len(),
        router.table().services[&key()].endpoints.len()
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn qos_pool_invariants(seed in any::<u64>(), ops in proptest::collection::vec(op(), 1..150)) {
        check("qos-pool", seed, ops, false);
    }

    #[test]
    fn round_robin_invariants(seed in any::<u64>(), ops in proptest::collection::vec(op(), 1..100)) {
        check("round-robin", seed, ops, false);
    }

    #[test]
    fn plugin_invariants(
        seed in any::<u64>(),
        strategy in prop::sample::select(vec!["rap", "proximity", "local", "kube-proxy", "p2c-ewma"]),
        ops in proptest::collection::vec(op(), 1..100),
    ) {
        check(strategy, seed, ops, false);
    }

    #[test]
    fn kube_proxy_local_policy_invariants(
        seed in any::<u64>(),
        ops in proptest::collection::vec(op(), 1..100),
    ) {
        check("kube-proxy", seed, ops, true);
    }

    #[test]
    fn random_invariants(seed in any::<u64>(), ops in proptest::collection::vec(op(), 1..100)) {
        check("random", seed, ops, false);
    }
}
