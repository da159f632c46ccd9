//! Which peers to probe in a round: a bounded sample, so that the cost of a round does
//! not grow with the cluster.
//!
//! Up to `bound` peers are taken, in three tiers:
//!
//! 1. nodes hosting endpoints of routed services: the strategies need their latency;
//! 2. nodes whose latency is missing or due for a refresh (no success for
//!    `refresh_after`);
//! 3. any other node, at random (cheap exploration, so that every latency stays known).
//!
//! Inside the first two tiers the least recently *attempted* node goes first (a node that
//! keeps failing does not hold its slot every round), ties broken at random; the random
//! generator is the caller's, so the choice is reproducible in tests.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use proxima_core::Table;
use rand::seq::SliceRandom;
use rand::RngCore;

/// Node label that overrides the peer admin port for one node (e.g. the testbed runs
/// several proxies on one machine, each on its own admin port).
pub const ADMIN_PORT_LABEL: &str = "proxima.io/admin-port";

/// A node the prober can reach.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    /// Node name.
    pub node: String,
    /// The node's first address and its proxy's admin port.
    pub addr: SocketAddr,
    /// Whether endpoints of routed services run on it.
    pub hosts_endpoints: bool,
}

/// What the prober remembers of a peer's probes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProbeHistory {
    /// When it was last probed.
    pub last_attempt: Option<Instant>,
    /// When it last answered.
    pub last_success: Option<Instant>,
}

/// The probe-able peers of `table`: every node but `local` that has an address. The
/// port is the node's `proxima.io/admin-port` label when it is a valid port, else
/// `default_port`.
pub fn peers(table: &Table, local: Option<&str>, default_port: u16) -> Vec<Peer> {
    let hosting: HashSet<&str> = table
        .services
        .values()
        .flat_map(|route| route.endpoints.iter())
        .filter_map(|e| e.endpoint.node.as_deref())
        .collect();
    table
        .nodes
        .values()
        .filter(|node| Some(node.name.as_str()) != local)
        .filter_map(|node| {
            let ip = *node.addresses.first()?;
            let port = node
                .labels
                .get(ADMIN_PORT_LABEL)
                .and_then(|p| p.trim().parse::<u16>().ok())
                .filter(|p| *p != 0)
                .unwrap_or(default_port);
            Some(Peer {
                node: node.name.clone(),
                addr: SocketAddr::new(ip, port),
                hosts_endpoints: hosting.contains(node.name.as_str()),
            })
        })
        .collect()
}

/// Choose at most `bound` of `peers` for this round (see the module docs).
pub fn select(
    mut peers: Vec<Peer>,
    history: &HashMap<String, ProbeHistory>,
    now: Instant,
    refresh_after: Duration,
    bound: usize,
    rng: &mut dyn RngCore,
) -> Vec<Peer> {
    if peers.len() <= bound {
        return peers;
    }
    peers.shuffle(rng);
    let seen = |p: &Peer| history.get(&p.node).copied().unwrap_or_default();
    let due = |p: &Peer| {
        seen(p)
            .last_success
            .is_none_or(|at| now.saturating_duration_since(at) >= refresh_after)
    };
    let tier = |p: &Peer| {
        if p.hosts_endpoints {
            0
        } else if due(p) {
            1
        } else {
            2
        }
    };
    // Never-attempted first (`None` < `Some`), then the oldest attempt; the sort is
    // stable, so the shuffle breaks ties. The random tier keeps its shuffled order.
    peers.sort_by_key(|p| match tier(p) {
        2 => (2, None),
        t => (t, seen(p).last_attempt),
    });
    peers.truncate(bound);
    peers
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::net::{IpAddr, Ipv4Addr};
    use std::sync::Arc;

    use proxima_core::{Endpoint, Node, Router, ServiceKey, ServiceSettings, ServiceSpec, Update};
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    use super::*;

    fn peer(i: u32, hosts_endpoints: bool) -> Peer {
        Peer {
            node: format!("n{i}"),
            addr: SocketAddr::new(IpAddr::V4(Ipv4Addr::from(0x7f00_0000 + i)), 9901),
            hosts_endpoints,
        }
    }

    #[test]
    fn small_clusters_are_probed_whole() {
        let peers: Vec<Peer> = (1..=5).map(|i| peer(i, false)).collect();
        let mut rng = SmallRng::seed_from_u64(1);
        let chosen = select(
            peers.clone(),
            &HashMap::new(),
            Instant::now(),
            Duration::from_secs(10),
            32,
            &mut rng,
        );
        assert_eq!(chosen, peers);
    }

    #[test]
    fn endpoint_nodes_then_stale_then_random() {
        let now = Instant::now() + Duration::from_secs(100);
        let peers: Vec<Peer> = (1..=100).map(|i| peer(i, i <= 10)).collect();
        let mut history = HashMap::new();
        // n11..=n20 are due (last success long ago); the rest were probed just now.
        for i in 11..=100 {
            let at = if i <= 20 {
                now - Duration::from_secs(60)
            } else {
                now
            };
            history.insert(
                format!("n{i}"),
                ProbeHistory {
                    last_attempt: Some(at),
                    last_success: Some(at),
                },
            );
        }
        let mut rng = SmallRng::seed_from_u64(7);
        let chosen = select(peers, &history, now, Duration::from_secs(10), 32, &mut rng);
        assert_eq!(chosen.len(), 32);
        let names: HashSet<&str> = chosen.iter().map(|p| p.node.as_str()).collect();
        for i in 1..=20 {
            assert!(
                names.contains(format!("n{i}").as_str()),
                "n{i} must be chosen"
            );
        }
        assert!(
            chosen[..10].iter().all(|p| p.hosts_endpoints),
            "endpoint nodes first"
        );
        // The same seed gives the same sample.
        let again = select(
            (1..=100).map(|i| peer(i, i <= 10)).collect(),
            &history,
            now,
            Duration::from_secs(10),
            32,
            &mut SmallRng::seed_from_u64(7),
        );
        assert_eq!(again, chosen);
    }

    #[test]
    fn rounds_rotate_through_every_node() {
        let peers: Vec<Peer> = (1..=500).map(|i| peer(i, false)).collect();
        let mut history: HashMap<String, ProbeHistory> = HashMap::new();
        let mut rng = SmallRng::seed_from_u64(3);
        let start = Instant::now();
        let mut probed = HashSet::new();
        // Nothing ever answers: attempts alone must move the sample on. 15 rounds of 32
        // reach 480 distinct nodes; the 16th takes the last 20 and the 12 oldest.
        for round in 0..16u64 {
            let now = start + Duration::from_secs(2 * round);
            let chosen = select(
                peers.clone(),
                &history,
                now,
                Duration::from_secs(15),
                32,
                &mut rng,
            );
            assert_eq!(chosen.len(), 32);
            for p in chosen {
                let first_time = probed.insert(p.node.clone());
                let previous = history.get(&p.node).and_then(|h| h.last_attempt);
                assert!(
                    first_time || (round == 15 && previous == Some(start)),
                    "round {round}: {} probed again before all others",
                    p.node
                );
                history.entry(p.node).or_default().last_attempt = Some(now);
            }
        }
        assert_eq!(probed.len(), 500);
    }

    #[test]
    fn peers_come_from_the_table_without_this_node() {
        let router = Arc::new(Router::new(Some("n1".into())));
        let node = |name: &str, ip: Option<&str>, port: Option<&str>| Node {
            name: name.into(),
            zone: None,
            labels: port
                .map(|p| BTreeMap::from([(ADMIN_PORT_LABEL.to_string(), p.to_string())]))
                .unwrap_or_default(),
            addresses: ip
                .map(|ip| vec![ip.parse().unwrap()])
                .into_iter()
                .flatten()
                .collect(),
        };
        let spec = ServiceSpec::new(
            ServiceKey::new("default", "web"),
            vec![],
            ServiceSettings::default(),
        );
        let endpoint = Endpoint::new("web-1", "127.0.0.9:80".parse().unwrap()).on_node("n3");
        router.apply(
            [Update::Reset {
                nodes: vec![
                    node("n1", Some("127.0.0.1"), None),
                    node("n2", Some("127.0.0.2"), Some("19902")),
                    node("n3", Some("127.0.0.3"), Some("not-a-port")),
                    node("n4", None, None),
                ],
                services: vec![(spec, vec![endpoint])],
            }],
            Instant::now(),
        );
        let peers = peers(&router.table(), router.local_node(), 9901);
        assert_eq!(
            peers,
            vec![
                Peer {
                    node: "n2".into(),
                    addr: "127.0.0.2:19902".parse().unwrap(),
                    hosts_endpoints: false
                },
                Peer {
                    node: "n3".into(),
                    addr: "127.0.0.3:9901".parse().unwrap(),
                    hosts_endpoints: true
                },
            ]
        );
    }
}
