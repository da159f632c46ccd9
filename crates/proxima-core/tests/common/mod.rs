//! Helpers shared by the routing core's integration tests.

#![allow(dead_code)] // each test file uses its own part

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use proxima_core::{Endpoint, Router, ServiceKey};

pub fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

/// The service every test routes to.
pub fn key() -> ServiceKey {
    ServiceKey::new("default", "svc")
}

/// Pod `i`, named `pod-<i>`, on `node`, at 127.0.0.1:(9000 + i).
pub fn pod(i: usize, node: &str) -> Endpoint {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, 9000 + i as u16));
    Endpoint::new(format!("pod-{i}"), addr).on_node(node)
}

/// The ids counted in `counts`, sorted.
pub fn ids(counts: &HashMap<String, usize>) -> Vec<String> {
    let mut v: Vec<String> = counts.keys().cloned().collect();
    v.sort();
    v
}

/// The ids of the QoS pool of service `key`, sorted.
pub fn pool_of(router: &Router, key: &ServiceKey) -> Vec<String> {
    let table = router.table();
    let route = &table.services[key];
    let mut ids: Vec<String> = route
        .pool()
        .iter()
        .map(|&i| route.endpoints[i].endpoint.id.clone())
        .collect();
    ids.sort();
    ids
}
