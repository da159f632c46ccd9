//! Routing-core benchmarks: the pick decision and the measurement update, per strategy,
//! for services of 10, 100 and 1000 endpoints.
//!
//! Every strategy the settings know ([`KNOWN_STRATEGIES`]) is measured, so a new one is
//! benchmarked without editing this file; the QoS pool once per spread as well
//! (`qos-pool:spread=even`, `qos-pool:spread=slack`).
//!
//! `cargo bench --bench routing` (add `-- --quick` for a fast pass). Everything runs on
//! the pure core: no sockets, no runtime, a seeded RNG, explicit time.

use std::hint::black_box;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use proxima_core::settings::KNOWN_STRATEGIES;
use proxima_core::{Endpoint, Outcome, Router, ServiceKey, ServiceSettings, ServiceSpec, Update};
use rand::rngs::SmallRng;
use rand::SeedableRng;

const SIZES: [usize; 3] = [10, 100, 1000];

fn key() -> ServiceKey {
    ServiceKey::new("default", "bench")
}

/// A router with one service of `n` endpoints on 10 nodes, every endpoint measured
/// (`window` samples each) so the pool is in its steady state: 80% of the endpoints meet
/// the 80 ms SLO, 20% are evicted. The warm-up's measurements are stamped from `now`
/// on, 1 µs apart; returns the router and the time of the last one.
fn warmed_router(spec: &str, n: usize, now: Instant) -> (Router, Instant) {
    let (strategy, spread) = match spec.split_once(":spread=") {
        Some((strategy, spread)) => (strategy, Some(spread)),
        None => (spec, None),
    };
    let mut pairs = vec![("latency-slo", "80ms"), ("strategy", strategy)];
    pairs.extend(spread.map(|spread| ("qos-pool-spread", spread)));
    let (settings, errors) = ServiceSettings::from_pairs(pairs);
    assert!(errors.is_empty(), "{errors:?}");
    let endpoints = (0..n)
        .map(|i| {
            let addr =
                SocketAddr::from((Ipv4Addr::new(10, 0, (i / 250) as u8, (i % 250) as u8), 8080));
            Endpoint::new(format!("pod-{i}"), addr).on_node(format!("node-{}", i % 10))
        })
        .collect();
    let router = Router::new(Some("node-0".into()));
    // Latency and usage of the 10 nodes, for the strategies that read them.
    router.update_environment(|env| {
        for i in 0..10u64 {
            let node = format!("node-{i}");
            env.set_latency(node.clone(), Duration::from_millis(2 + 5 * i), now);
            let load = 0.1 * i as f64;
            env.set_usage(
                node,
                proxima_core::Usage {
                    cpu: load,
                    ram: load,
                },
                now,
            );
        }
    });
    router.apply(
        [Update::Reset {
            nodes: vec![],
            services: vec![(ServiceSpec::new(key(), vec![], settings), endpoints)],
        }],
        now,
    );
    // Steady state: route 2 × window requests per endpoint through the strategy itself.
    let window = router.table().services[&key()].settings().qos_pool.window;
    let mut rng = SmallRng::seed_from_u64(1);
    let mut at = now;
    for k in 0..(2 * window * n) {
        let picked = router.pick(&key(), None, now, &mut rng, &[]).unwrap();
        let latency = if picked.index % 5 == 4 {
            150
        } else {
            20 + (picked.index % 7) as u64
        };
        at = now + Duration::from_micros(k as u64);
        router.record(
            &picked,
            at,
            Outcome::Response {
                latency: Duration::from_millis(latency),
            },
        );
    }
    (router, at)
}

/// How far the record benchmark's clock moves per measurement. The steady state it
/// times needs every sample in the windows younger than `qos-pool-max-age` (30 s) for
/// the whole run; with 10 µs steps a run of 3 million iterations (a few seconds of
/// criterion) crossed that. At 10 ns a step the 30 s take 3·10⁹ iterations, far beyond
/// a criterion run. (A diagnostic run of this loop at 1000 endpoints with 10 µs steps
/// saw no pool change and no change in cost when it crossed 30 s, so the old clock was
/// not what made the 1000-endpoint figures spread; see benches/README.md.) The only
/// other effect of the clock, the peak EWMA's decay, does not change a record's cost.
const RECORD_STEP: Duration = Duration::from_nanos(10);

/// Every known strategy, and the QoS pool with each spread.
fn specs() -> Vec<String> {
    let mut specs: Vec<String> = KNOWN_STRATEGIES.iter().map(|s| s.to_string()).collect();
    specs.extend([
        "qos-pool:spread=even".into(),
        "qos-pool:spread=slack".into(),
    ]);
    specs
}

fn bench_pick(c: &mut Criterion) {
    let mut group = c.benchmark_group("pick");
    for spec in specs() {
        let strategy = spec.as_str();
        for n in SIZES {
            let now = Instant::now();
            let mut router = None;
            let mut rng = SmallRng::seed_from_u64(7);
            group.bench_with_input(BenchmarkId::new(strategy, n), &n, |b, _| {
                // Warmed up only when this benchmark is selected (it takes seconds).
                let (router, _) = router.get_or_insert_with(|| warmed_router(strategy, n, now));
                // Built once: the benchmark times the pick, not two string allocations.
                let service = key();
                b.iter(|| {
                    let picked = router.pick(&service, None, now, &mut rng, &[]).unwrap();
                    black_box(picked.addr)
                })
            });
        }
    }
    group.finish();
}

fn bench_record(c: &mut Criterion) {
    let mut group = c.benchmark_group("record");
    for spec in specs() {
        let strategy = spec.as_str();
        for n in SIZES {
            let now = Instant::now();
            let mut router = None;
            let mut rng = SmallRng::seed_from_u64(9);
            group.bench_with_input(BenchmarkId::new(strategy, n), &n, |b, _| {
                // The clock runs on from the warm-up's last measurement.
                let (router, t) = router.get_or_insert_with(|| warmed_router(strategy, n, now));
                let pick_at = *t;
                let service = key();
                b.iter_batched(
                    || router.pick(&service, None, pick_at, &mut rng, &[]).unwrap(),
                    |picked| {
                        *t += RECORD_STEP;
                        black_box(router.record(
                            &picked,
                            *t,
                            Outcome::Response {
                                latency: Duration::from_millis(25),
                            },
                        ))
                    },
                    criterion::BatchSize::SmallInput,
                )
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench_pick, bench_record);
criterion_main!(benches);
