//! The caches behind fast picks give the decisions of the computation they replace, and
//! are dropped when what they were computed from changes: the routing table, the node
//! environment (a new snapshot, or a reading turning stale), the local node's zone, an
//! endpoint's cooldown, the endpoints already tried.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use common::*;
use proxima_core::strategy::{Decay, KubeProxy, Proximity};
use proxima_core::{
    Endpoint, EndpointId, Hints, Node, Outcome, PickContext, Router, ServiceKey, ServiceRoute,
    ServiceSettings, ServiceSpec, Update,
};
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};

/// `pods[i]` = node of pod i; pods are named `pod-<i>`.
fn endpoints(pods: &[&str]) -> Vec<Endpoint> {
    pods.iter()
        .enumerate()
        .map(|(i, node)| pod(i, node))
        .collect()
}

fn node(name: &str, zone: &str) -> Node {
    Node {
        name: name.to_string(),
        zone: Some(zone.to_string()),
        ..Default::default()
    }
}

fn router(local: &str, pairs: &[(&str, &str)], pods: Vec<Endpoint>, nodes: Vec<Node>) -> Router {
    let (settings, errors) = ServiceSettings::from_pairs(pairs.iter().copied());
    assert!(errors.is_empty(), "{errors:?}");
    let router = Router::new(Some(local.to_string()));
    router.apply(
        [Update::Reset {
            nodes,
            services: vec![(ServiceSpec::new(key(), vec![], settings), pods)],
        }],
        Instant::now(),
    );
    router
}

fn set_endpoints(router: &Router, endpoints: Vec<Endpoint>) {
    router.apply(
        [Update::SetEndpoints {
            service: key(),
            endpoints,
        }],
        Instant::now(),
    );
}

fn distribution(
    router: &Router,
    now: Instant,
    n: usize,
    seed: u64,
    exclude: &[EndpointId],
) -> HashMap<String, usize> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut counts = HashMap::new();
    for _ in 0..n {
        match router.pick(&key(), None, now, &mut rng, exclude) {
            Ok(p) => *counts.entry(p.endpoint().id.clone()).or_default() += 1,
            Err(e) => *counts.entry(format!("error: {e}")).or_default() += 1,
        }
    }
    counts
}

/// Refuse one connection on `id` (it cools down for 250 ms from `now`).
fn cool_down(router: &Router, id: &str, now: Instant) {
    let all = router.table().services[&key()].endpoints.len();
    let others: Vec<EndpointId> = (0..all)
        .map(|i| format!("pod-{i}"))
        .filter(|o| o != id)
        .collect();
    let mut rng = SmallRng::seed_from_u64(0);
    let picked = router.pick(&key(), None, now, &mut rng, &others).unwrap();
    assert_eq!(picked.endpoint().id, id);
    router.record(&picked, now, Outcome::ConnectFailed);
}

// ---------------------------------------------------------------- kube-proxy

/// kube-proxy's choice as it was made before its filtered set was cached: filter every
/// endpoint, drop the ones tried, prefer the ones not cooling down, draw uniformly.
fn kube_proxy_uncached(
    router: &Router,
    now: Instant,
    exclude: &[usize],
    rng: &mut dyn RngCore,
) -> Option<usize> {
    let table = router.table();
    let environment = router.environment();
    let ctx = PickContext {
        route: table.services[&key()].route(),
        now,
        local_node: router.local_node(),
        nodes: &table.nodes,
        environment: &environment,
        exclude,
    };
    let allowed: Vec<usize> = KubeProxy::default()
        .filter(&ctx)
        .into_iter()
        .filter(|i| !exclude.contains(i))
        .collect();
    let usable: Vec<usize> = allowed.iter().copied().filter(|&i| ctx.usable(i)).collect();
    let from = if usable.is_empty() { &allowed } else { &usable };
    (!from.is_empty()).then(|| from[rng.gen_range(0..from.len())])
}

#[test]
fn kube_proxy_cached_picks_make_the_uncached_draws() {
    let t0 = Instant::now();
    let nodes: Vec<String> = (0..40).map(|i| format!("node-{}", i % 4)).collect();
    let pods: Vec<&str> = nodes.iter().map(String::as_str).collect();
    let mut eps = endpoints(&pods);
    // A few not ready (filtered out), the rest hinted for zone-a or zone-b.
    for (i, e) in eps.iter_mut().enumerate() {
        e.conditions.ready = i % 7 != 3;
        e.hints = Hints {
            for_zones: [if i % 3 == 0 { "zone-b" } else { "zone-a" }.to_string()].into(),
            for_nodes: [].into(),
        };
    }
    let r = router(
        "node-0",
        &[("strategy", "kube-proxy")],
        eps,
        vec![node("node-0", "zone-a")],
    );
    let mut choose = SmallRng::seed_from_u64(5);
    for round in 0..400u64 {
        let now = t0 + ms(round);
        if round % 50 == 25 {
            // Filtered ones (ready, hinted for zone-a), 250 ms each: overlapping.
            let pod = [1, 2, 4, 5, 7, 8, 11, 13][(round / 50) as usize];
            cool_down(&r, &format!("pod-{pod}"), now);
        }
        // Up to 4 tried endpoints, repeats and unfiltered ones included.
        let tried: Vec<usize> = (0..choose.gen_range(0..5))
            .map(|_| choose.gen_range(0..40))
            .collect();
        // Route indices follow the ids' order (pod-0, pod-1, pod-10, ...).
        let table = r.table();
        let route = &table.services[&key()];
        let exclude: Vec<EndpointId> = tried
            .iter()
            .map(|&i| route.endpoints[i].endpoint.id.clone())
            .collect();
        let seed = choose.gen::<u64>();
        let cached = r
            .pick(
                &key(),
                None,
                now,
                &mut SmallRng::seed_from_u64(seed),
                &exclude,
            )
            .ok()
            .map(|p| p.index);
        let uncached = kube_proxy_uncached(&r, now, &tried, &mut SmallRng::seed_from_u64(seed));
        assert_eq!(cached, uncached, "round {round}, tried {tried:?}");
    }
}

#[test]
fn kube_proxy_cache_follows_a_new_table() {
    let now = Instant::now();
    let r = router(
        "node-1",
        &[("strategy", "kube-proxy")],
        endpoints(&["node-1", "node-2"]),
        vec![node("node-1", "zone-a")],
    );
    assert_eq!(ids(&distribution(&r, now, 200, 1, &[])), ["pod-0", "pod-1"]);
    // A third pod; then pod-0 no longer ready.
    set_endpoints(&r, endpoints(&["node-1", "node-2", "node-3"]));
    assert_eq!(
        ids(&distribution(&r, now, 300, 2, &[])),
        ["pod-0", "pod-1", "pod-2"]
    );
    let mut eps = endpoints(&["node-1", "node-2", "node-3"]);
    eps[0].conditions.ready = false;
    set_endpoints(&r, eps);
    assert_eq!(ids(&distribution(&r, now, 300, 3, &[])), ["pod-1", "pod-2"]);
}

#[test]
fn kube_proxy_cache_follows_the_local_nodes_zone() {
    let now = Instant::now();
    let mut eps = endpoints(&["node-1", "node-2", "node-3"]);
    for (e, zone) in eps.iter_mut().zip(["zone-a", "zone-b", "zone-b"]) {
        e.hints.for_zones = [zone.to_string()].into();
    }
    let r = router(
        "node-1",
        &[("strategy", "kube-proxy")],
        eps,
        vec![node("node-1", "zone-b")],
    );
    assert_eq!(ids(&distribution(&r, now, 200, 4, &[])), ["pod-1", "pod-2"]);
    // The node moves to zone-a: the table's nodes change, the route does not.
    let before = r.table().services[&key()].clone();
    let report = r.apply([Update::UpsertNode(node("node-1", "zone-a"))], now);
    assert!(report.changed.is_empty());
    assert!(std::sync::Arc::ptr_eq(&before, &r.table().services[&key()]));
    assert_eq!(ids(&distribution(&r, now, 200, 5, &[])), ["pod-0"]);
    // Its zone becomes unknown: topology off, every endpoint.
    r.apply(
        [Update::UpsertNode(Node {
            name: "node-1".into(),
            ..Default::default()
        })],
        now,
    );
    assert_eq!(
        ids(&distribution(&r, now, 300, 6, &[])),
        ["pod-0", "pod-1", "pod-2"]
    );
}

#[test]
fn kube_proxy_cache_leaves_out_cooling_and_tried_endpoints() {
    let now = Instant::now();
    let r = router(
        "node-1",
        &[("strategy", "kube-proxy")],
        endpoints(&["node-1", "node-2", "node-3", "node-4"]),
        vec![node("node-1", "zone-a")],
    );
    assert_eq!(ids(&distribution(&r, now, 300, 7, &[])).len(), 4);
    // Tried ones are never drawn again; the others stay even.
    let tried = [
        "pod-1".to_string(),
        "pod-3".to_string(),
        "pod-1".to_string(),
    ];
    let counts = distribution(&r, now, 20_000, 8, &tried);
    assert_eq!(ids(&counts), ["pod-0", "pod-2"]);
    assert!(
        counts["pod-0"].abs_diff(counts["pod-2"]) < 600,
        "{counts:?}"
    );
    // pod-2 cools down: avoided while it does, back once it is over.
    cool_down(&r, "pod-2", now);
    assert_eq!(
        ids(&distribution(&r, now, 300, 9, &[])),
        ["pod-0", "pod-1", "pod-3"]
    );
    let later = now + Duration::from_secs(1);
    assert_eq!(ids(&distribution(&r, later, 300, 10, &[])).len(), 4);
}

// ---------------------------------------------------------------- proximity

fn proximity_router(pods: &[&str]) -> Router {
    router(
        "node-1",
        &[
            ("strategy", "proximity"),
            ("proximity-alpha", "0.9"),
            ("proximity-decay", "exponential"),
            ("proximity-beta", "0.1"),
            ("proximity-localrtt", "2ms"),
        ],
        endpoints(pods),
        vec![],
    )
}

fn set_latencies(router: &Router, at: Instant, rtts: &[(&str, u64)]) {
    router.update_environment(|env| {
        for (node, l) in rtts {
            env.set_latency(*node, ms(*l), at);
        }
    });
}

/// The share of each pod that proxy-mity's Eq. 6 gives, for pods at these latencies.
fn expected(latencies: &[f64]) -> Vec<f64> {
    Proximity {
        alpha: 0.9,
        beta: 0.1,
        decay: Decay::Exponential,
        localrtt: Some(ms(2)),
    }
    .weights(latencies)
}

/// Picks follow `weights` (per pod, in pod order) within one point.
fn assert_shares(router: &Router, now: Instant, weights: &[f64], seed: u64) {
    let n = 40_000;
    let counts = distribution(router, now, n, seed, &[]);
    for (i, w) in weights.iter().enumerate() {
        let id = format!("pod-{i}");
        let share = *counts.get(&id).unwrap_or(&0) as f64 / n as f64;
        assert!(
            (share - w).abs() < 0.01,
            "{id}: {share} vs {w} ({counts:?})"
        );
    }
    assert_eq!(counts.values().sum::<usize>(), n);
    assert!(counts.keys().all(|k| k.starts_with("pod-")), "{counts:?}");
}

#[test]
fn proximity_cached_weights_follow_a_new_environment_snapshot() {
    let now = Instant::now();
    let r = proximity_router(&["node-1", "node-2", "node-3", "node-3"]);
    set_latencies(&r, now, &[("node-2", 5), ("node-3", 30)]);
    assert_shares(&r, now, &expected(&[2.0, 5.0, 30.0, 30.0]), 11);
    // node-3 becomes the near one.
    set_latencies(&r, now, &[("node-2", 30), ("node-3", 3)]);
    assert_shares(&r, now, &expected(&[2.0, 30.0, 3.0, 3.0]), 12);
}

#[test]
fn proximity_cached_weights_follow_readings_turning_stale() {
    let now = Instant::now();
    let r = proximity_router(&["node-1", "node-2", "node-3"]);
    set_latencies(&r, now, &[("node-2", 5)]);
    set_latencies(&r, now + Duration::from_secs(20), &[("node-3", 40)]);
    let t = now + Duration::from_secs(25);
    assert_shares(&r, t, &expected(&[2.0, 5.0, 40.0]), 13);
    // 31 s after the first reading (max age 30 s) node-2's is stale: it is given the
    // largest known latency.
    let t = now + Duration::from_secs(31);
    assert_shares(&r, t, &expected(&[2.0, 40.0, 40.0]), 14);
    // And with every reading stale, each pod has the local latency: uniform.
    let t = now + Duration::from_secs(60);
    assert_shares(&r, t, &[1.0 / 3.0; 3], 15);
}

#[test]
fn proximity_cached_weights_follow_a_new_table() {
    let now = Instant::now();
    let r = proximity_router(&["node-1", "node-2", "node-3"]);
    set_latencies(&r, now, &[("node-2", 5), ("node-3", 30)]);
    assert_shares(&r, now, &expected(&[2.0, 5.0, 30.0]), 16);
    // A second pod on node-3, and node-1's pod gone.
    set_endpoints(&r, endpoints(&["node-4", "node-2", "node-3", "node-3"]));
    set_latencies(&r, now, &[("node-4", 60)]);
    assert_shares(&r, now, &expected(&[60.0, 5.0, 30.0, 30.0]), 17);
}

#[test]
fn proximity_cached_weights_leave_out_cooling_and_tried_pods() {
    let now = Instant::now();
    let r = proximity_router(&["node-1", "node-2", "node-3", "node-3"]);
    set_latencies(&r, now, &[("node-2", 5), ("node-3", 30)]);
    assert_shares(&r, now, &expected(&[2.0, 5.0, 30.0, 30.0]), 18);
    // pod-0 tried: the weights of the other three alone.
    let n = 40_000;
    let counts = distribution(&r, now, n, 19, &["pod-0".into()]);
    for (id, w) in ["pod-1", "pod-2", "pod-3"]
        .iter()
        .zip(expected(&[5.0, 30.0, 30.0]))
    {
        let share = *counts.get(*id).unwrap_or(&0) as f64 / n as f64;
        assert!(
            (share - w).abs() < 0.01,
            "{id}: {share} vs {w} ({counts:?})"
        );
    }
    assert!(!counts.contains_key("pod-0"));
    // pod-1 cools down: never picked while it does; the cached weights again after.
    cool_down(&r, "pod-1", now);
    let counts = distribution(&r, now, 2_000, 20, &[]);
    assert!(!counts.contains_key("pod-1"), "{counts:?}");
    assert_shares(
        &r,
        now + Duration::from_secs(1),
        &expected(&[2.0, 5.0, 30.0, 30.0]),
        21,
    );
}

// ---------------------------------------------------------------- the readings' slot

#[test]
fn node_readings_keep_one_derived_value_until_the_route_or_environment_changes() {
    let now = Instant::now();
    let r = proximity_router(&["node-1", "node-2"]);
    set_latencies(&r, now, &[("node-2", 5)]);
    let computed = AtomicUsize::new(0);
    let derive = |_: &proxima_core::NodeReadings| computed.fetch_add(1, Ordering::Relaxed);
    let look = |at: Instant| {
        let table = r.table();
        let env = r.environment();
        let readings = table.services[&key()].node_readings(&env, r.local_node(), at);
        *readings.derived(derive).expect("one type per route")
    };
    // Computed once, then kept (also across time while no reading changes freshness).
    assert_eq!(look(now), 0);
    assert_eq!(look(now + ms(10)), 0);
    assert_eq!(computed.load(Ordering::Relaxed), 1);
    // A new environment snapshot.
    set_latencies(&r, now, &[("node-2", 7)]);
    assert_eq!(look(now + ms(10)), 1);
    assert_eq!(look(now + ms(20)), 1);
    // A reading turning stale.
    assert_eq!(look(now + Duration::from_secs(31)), 2);
    // A new route.
    set_endpoints(&r, endpoints(&["node-1", "node-2", "node-2"]));
    assert_eq!(look(now + Duration::from_secs(31)), 3);
    assert_eq!(computed.load(Ordering::Relaxed), 4);
    // A value of another type is not handed out as this one.
    let table = r.table();
    let env = r.environment();
    let readings =
        table.services[&key()].node_readings(&env, r.local_node(), now + Duration::from_secs(31));
    assert!(readings.derived(|_| "other").is_none());
}

/// The per-thread table cache of `Router::pick` never routes on a superseded table,
/// on the thread that published the update or on another one.
#[test]
fn a_pick_after_an_update_reads_the_new_table_on_every_thread() {
    let router = std::sync::Arc::new(router("n1", &[], endpoints(&["n1"]), vec![]));
    let (ask, asked) = std::sync::mpsc::channel::<()>();
    let (answer, answers) = std::sync::mpsc::channel::<EndpointId>();
    let picker = {
        let router = router.clone();
        std::thread::spawn(move || {
            let mut rng = SmallRng::seed_from_u64(3);
            for () in asked {
                let picked = router
                    .pick(&key(), None, Instant::now(), &mut rng, &[])
                    .unwrap();
                answer.send(picked.endpoint().id.clone()).unwrap();
            }
        })
    };
    let mut rng = SmallRng::seed_from_u64(4);
    let mut pick_here = || {
        router
            .pick(&key(), None, Instant::now(), &mut rng, &[])
            .unwrap()
            .endpoint()
            .id
            .clone()
    };
    ask.send(()).unwrap();
    assert_eq!(answers.recv().unwrap(), "pod-0");
    assert_eq!(pick_here(), "pod-0");
    // Both threads now cache the first table; replace its only endpoint.
    set_endpoints(&router, vec![pod(1, "n1")]);
    assert_eq!(pick_here(), "pod-1");
    ask.send(()).unwrap();
    assert_eq!(answers.recv().unwrap(), "pod-1");
    drop(ask);
    picker.join().unwrap();
}

/// What the cache keeps alive: a superseded table only until the thread's next pick
/// (or `release_cached_table`), and each router's picks read that router's table.
#[test]
fn the_thread_cache_keeps_no_superseded_table_past_the_next_pick() {
    let a = router("n1", &[], endpoints(&["n1"]), vec![]);
    let b = router("n1", &[], vec![pod(7, "n1")], vec![]);
    let mut rng = SmallRng::seed_from_u64(5);
    let mut pick = |r: &Router| {
        r.pick(&key(), None, Instant::now(), &mut rng, &[])
            .unwrap()
            .endpoint()
            .id
            .clone()
    };
    assert_eq!(pick(&a), "pod-0");
    let first = std::sync::Arc::downgrade(&a.table());
    set_endpoints(&a, vec![pod(1, "n1")]);
    assert!(first.upgrade().is_some(), "this thread's cache holds it");
    // Another router's pick on this thread replaces the cache, and reads its own table.
    assert_eq!(pick(&b), "pod-7");
    assert!(first.upgrade().is_none(), "released by the next pick");
    assert_eq!(pick(&a), "pod-1");
    // The same on a new update of the same router.
    let second = std::sync::Arc::downgrade(&a.table());
    set_endpoints(&a, vec![pod(2, "n1")]);
    assert_eq!(pick(&a), "pod-2");
    assert!(second.upgrade().is_none());
    // And without another pick, when the thread lets its cache go.
    let third = std::sync::Arc::downgrade(&a.table());
    set_endpoints(&a, vec![pod(3, "n1")]);
    assert!(third.upgrade().is_some());
    proxima_core::release_cached_table();
    assert!(third.upgrade().is_none());
    assert_eq!(pick(&a), "pod-3");
}

/// A dropped `Picked` hands its route reference back to the thread for the thread's
/// next pick of that very route. A pick never gets a superseded route that way, even one
/// handed back after the update (an attempt that outlived it); drops displace the
/// superseded routes the thread kept; `release_cached_table` lets all of them go.
#[test]
fn handed_back_route_references_never_route_on_a_superseded_route() {
    let keys: Vec<ServiceKey> = (0..6)
        .map(|i| ServiceKey::new("default", format!("svc-{i}")))
        .collect();
    let router = Router::new(Some("n1".into()));
    let spec = |k: &ServiceKey| ServiceSpec::new(k.clone(), vec![], ServiceSettings::default());
    router.apply(
        [Update::Reset {
            nodes: vec![],
            services: keys.iter().map(|k| (spec(k), vec![pod(0, "n1")])).collect(),
        }],
        Instant::now(),
    );
    let set_pod = |i: usize| {
        router.apply(
            keys.iter().map(|k| Update::SetEndpoints {
                service: k.clone(),
                endpoints: vec![pod(i, "n1")],
            }),
            Instant::now(),
        )
    };
    let current = |k: &ServiceKey| Arc::clone(&router.table().services[k]);
    let mut rng = SmallRng::seed_from_u64(11);
    let mut pick = |k: &ServiceKey| router.pick(k, None, Instant::now(), &mut rng, &[]).unwrap();
    let alive =
        |routes: &[Weak<ServiceRoute>]| routes.iter().filter(|w| w.strong_count() > 0).count();

    // Picks and drops over more services than the thread keeps references for.
    for _ in 0..3 {
        for k in &keys {
            let picked = pick(k);
            assert!(Arc::ptr_eq(picked.route(), &current(k)));
        }
    }
    // An attempt outlives an update of its service; its drop hands back the old route.
    let outlived = pick(&keys[0]);
    let first: Vec<Weak<ServiceRoute>> = keys.iter().map(|k| Arc::downgrade(&current(k))).collect();
    set_pod(1);
    drop(outlived);
    for k in &keys {
        let picked = pick(k);
        assert!(
            Arc::ptr_eq(picked.route(), &current(k)),
            "{k}: not the current route"
        );
        assert_eq!(picked.endpoint().id, "pod-1");
        assert_eq!(picked.route().endpoints.len(), 1);
    }
    // Six drops of the new routes displaced every superseded one (the thread keeps four),
    // and the pick after the update let the old table go.
    assert_eq!(alive(&first), 0, "superseded routes still kept");

    // Without further picks, the thread keeps what it had until it lets its cache go.
    let second: Vec<Weak<ServiceRoute>> =
        keys.iter().map(|k| Arc::downgrade(&current(k))).collect();
    set_pod(2);
    assert!(alive(&second) > 0);
    proxima_core::release_cached_table();
    assert_eq!(alive(&second), 0, "released with the thread's cache");
    assert_eq!(pick(&keys[3]).endpoint().id, "pod-2");
}
