//! `GET /node/ping` on the admin port: the cheap endpoint peers probe.
//!
//! One request gives the prober both a round-trip sample and the answering node's own
//! usage (the peer-report usage source):
//!
//! ```json
//! {"node": "worker-2", "usage": {"cpu": 0.31, "ram": 0.57}, "usage_age_ms": 840, "at_ms": 1767225600123}
//! ```
//!
//! `usage` is `null` when unknown; `usage_age_ms` is how old it is (so the prober can date
//! the reading on its own clock; wall clocks of different nodes are not compared);
//! `at_ms` is the answering node's wall clock in ms since the Unix epoch, for people
//! reading the reply; `pods` (left out when empty) is what the proxy knows about pods,
//! for its neighbours (see [`crate::share`]). `PUT /node/usage` with `{"cpu": f, "ram": f}` (or `null` to clear)
//! overrides the reported usage when the proxy runs with `--allow-usage-override`.
//!
//! A proxy that keeps network coordinates ([`crate::coordinates`]) also answers with its
//! own (`coordinate`, in ms) and up to eight it knows of other nodes (`gossip`: each
//! `{"node", "coordinate", "age_ms"}`). Both fields are left out when empty, and read as
//! empty when absent, so proxies with and without them probe each other.

use std::sync::{Arc, RwLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use hyper::StatusCode;
use proxima_admin::NodeEndpoints;
use proxima_core::environment::UsageReading;
use proxima_core::Usage;
use serde::{Deserialize, Serialize};

use crate::coordinates::{GossipEntry, NodeCoordinates, WireCoordinate};
use crate::share::WirePod;
use crate::usage::{is_plausible, FixedUsage, UsageSource};

/// Usage as it travels in ping replies and `PUT /node/usage` bodies.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct WireUsage {
    /// CPU in use ÷ allocatable.
    pub cpu: f64,
    /// Memory in use ÷ allocatable.
    pub ram: f64,
}

impl From<Usage> for WireUsage {
    fn from(u: Usage) -> Self {
        Self {
            cpu: u.cpu,
            ram: u.ram,
        }
    }
}

impl From<WireUsage> for Usage {
    fn from(u: WireUsage) -> Self {
        Self {
            cpu: u.cpu,
            ram: u.ram,
        }
    }
}

/// The body of a `/node/ping` reply (see the module docs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PingReply {
    /// The answering proxy's node name (`null` if it was not told).
    pub node: Option<String>,
    /// The node's usage, `null` when unknown.
    pub usage: Option<WireUsage>,
    /// How old `usage` is, ms (so the prober can date the reading).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_age_ms: Option<u64>,
    /// The answering node's wall clock, ms since the Unix epoch (for people reading it).
    #[serde(default)]
    pub at_ms: u64,
    /// What the answering proxy knows about pods (see [`crate::share`]); absent from
    /// proxies that share nothing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pods: Vec<WirePod>,
    /// The answering node's network coordinate (absent from proxies that keep none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coordinate: Option<WireCoordinate>,
    /// Coordinates of other nodes the answering node knows, at most
    /// [`MAX_GOSSIP`](crate::coordinates::MAX_GOSSIP).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gossip: Vec<GossipEntry>,
}

/// This proxy's node, as it answers peers.
#[derive(Debug)]
pub struct LocalNode {
    name: Option<String>,
    source: Option<Arc<dyn UsageSource>>,
    /// Present when `--allow-usage-override` is set; a set value wins over `source`.
    usage_override: Option<FixedUsage>,
    /// The pod reports of this round's replies as their JSON array (empty: none), set
    /// by the peer prober each round. Serialised once a round rather than once a
    /// reply, since every peer pings each round: with 30 reports (3.4 KB) a reply took
    /// 8.1 µs to clone and serialise them, and takes 0.24 µs to copy them in.
    pods: RwLock<Bytes>,
    /// This node's network coordinate and those it relays, when it keeps them.
    coordinates: Option<Arc<NodeCoordinates>>,
}

/// Why `PUT /node/usage` was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OverrideError {
    /// The proxy was started without `--allow-usage-override`.
    #[error("usage overrides are off (start the proxy with --allow-usage-override)")]
    NotAllowed,
    /// The body is neither usage fractions nor `null`: why.
    #[error("expected {{\"cpu\": fraction, \"ram\": fraction}} or null: {0}")]
    Invalid(String),
}

impl LocalNode {
    /// `name`: this node's name; `source`: where its usage comes from (`None`: unknown).
    pub fn new(name: Option<String>, source: Option<Arc<dyn UsageSource>>) -> Self {
        Self {
            name,
            source,
            usage_override: None,
            pods: RwLock::default(),
            coordinates: None,
        }
    }

    /// Answer with network coordinates from `coordinates` (which the prober, given this
    /// node, keeps up to date).
    pub fn with_coordinates(mut self, coordinates: Arc<NodeCoordinates>) -> Self {
        self.coordinates = Some(coordinates);
        self
    }

    /// The network coordinates this node keeps, if any.
    pub fn coordinates(&self) -> Option<&Arc<NodeCoordinates>> {
        self.coordinates.as_ref()
    }

    /// Accept `PUT /node/usage` overrides.
    pub fn allowing_override(mut self) -> Self {
        self.usage_override = Some(FixedUsage::new(None));
        self
    }

    /// This node's name, if known.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// The usage reported to peers: the override when set, else the source's reading.
    pub fn usage(&self) -> Option<UsageReading> {
        self.usage_override
            .as_ref()
            .and_then(|o| o.current())
            .or_else(|| self.source.as_ref()?.current())
            .filter(|r| is_plausible(r.usage))
    }

    /// Set (`Some`) or clear (`None`) the override.
    pub fn set_override(&self, usage: Option<Usage>) -> Result<(), OverrideError> {
        let slot = self
            .usage_override
            .as_ref()
            .ok_or(OverrideError::NotAllowed)?;
        if let Some(u) = usage.filter(|u| !is_plausible(*u) || u.cpu > 1.0 || u.ram > 1.0) {
            return Err(OverrideError::Invalid(format!(
                "cpu {} and ram {} must be fractions from 0 to 1",
                u.cpu, u.ram
            )));
        }
        slot.set(usage);
        Ok(())
    }

    /// Answer pings with `pods` from now on.
    pub fn set_pods(&self, pods: &[WirePod]) {
        // Serialising strings and numbers cannot fail.
        let json = match pods {
            [] => Bytes::new(),
            pods => serde_json::to_vec(pods).map_or_else(|_| Bytes::new(), Bytes::from),
        };
        *self.pods.write().unwrap_or_else(|e| e.into_inner()) = json;
    }

    /// The reply to a ping, now, but for its pod reports, which [`LocalNode::json`]
    /// adds as they were serialised for the round. Private: what it returns is not
    /// the whole reply.
    fn reply(&self) -> PingReply {
        let reading = self.usage();
        let (coordinate, gossip) = match &self.coordinates {
            Some(c) => {
                let (own, gossip) = c.reply_fields(Instant::now());
                (Some(own), gossip)
            }
            None => (None, Vec::new()),
        };
        PingReply {
            node: self.name.clone(),
            usage: reading.map(|r| r.usage.into()),
            usage_age_ms: reading.map(|r| millis(r.at.elapsed().as_millis())),
            at_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| millis(d.as_millis())),
            pods: Vec::new(),
            coordinate,
            gossip,
        }
    }

    fn json(&self) -> Bytes {
        // Serialising plain numbers and strings cannot fail.
        let Ok(mut json) = serde_json::to_vec(&self.reply()) else {
            return Bytes::from_static(b"{}");
        };
        let pods = self.pods.read().unwrap_or_else(|e| e.into_inner()).clone();
        // The reply is an object with at least `at_ms`: the round's pods go before its
        // closing brace.
        if !pods.is_empty() && json.pop() == Some(b'}') {
            json.extend_from_slice(b",\"pods\":");
            json.extend_from_slice(&pods);
            json.push(b'}');
        }
        Bytes::from(json)
    }
}

fn millis(ms: u128) -> u64 {
    u64::try_from(ms).unwrap_or(u64::MAX)
}

impl NodeEndpoints for LocalNode {
    fn ping(&self) -> Bytes {
        self.json()
    }

    fn put_usage(&self, body: &[u8]) -> Result<Bytes, (StatusCode, String)> {
        let usage: Option<WireUsage> = serde_json::from_slice(body).map_err(|e| {
            (
                StatusCode::BAD_REQUEST,
                OverrideError::Invalid(e.to_string()).to_string(),
            )
        })?;
        self.set_override(usage.map(Usage::from)).map_err(|e| {
            let status = match e {
                OverrideError::NotAllowed => StatusCode::FORBIDDEN,
                OverrideError::Invalid(_) => StatusCode::BAD_REQUEST,
            };
            (status, e.to_string())
        })?;
        Ok(self.json())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dated;

    #[test]
    fn replies_carry_name_and_usage() {
        let fixed = Arc::new(FixedUsage::new(Some(Usage {
            cpu: 0.5,
            ram: 0.25,
        })));
        let node = LocalNode::new(Some("w1".into()), Some(fixed.clone()));
        let reply: PingReply = serde_json::from_slice(&node.ping()).unwrap();
        assert_eq!(reply.node.as_deref(), Some("w1"));
        assert_eq!(
            reply.usage,
            Some(WireUsage {
                cpu: 0.5,
                ram: 0.25
            })
        );
        assert!(reply.usage_age_ms.unwrap() < 1000);
        assert!(reply.at_ms > 1_600_000_000_000);
        fixed.set(None);
        let reply: serde_json::Value = serde_json::from_slice(&node.ping()).unwrap();
        assert_eq!(reply["usage"], serde_json::Value::Null);
    }

    #[test]
    fn a_rounds_pod_reports_go_in_every_reply_until_the_next() {
        let node = LocalNode::new(Some("w1".into()), None);
        let pod = |name: &str| WirePod {
            svc: "default/api".into(),
            pod: name.into(),
            by: "w1".into(),
            hops: 0,
            proc_us: Some(2140),
            n: Some(64),
            proc_age_ms: Some(35),
            verdict: None,
            verdict_age_ms: None,
        };
        let pods = vec![pod("api-1"), pod("api-\"2\"")];
        node.set_pods(&pods);
        for _ in 0..2 {
            let reply: PingReply = serde_json::from_slice(&node.ping()).unwrap();
            assert_eq!(reply.pods, pods);
            assert_eq!(reply.node.as_deref(), Some("w1"));
        }
        node.set_pods(&[]);
        let text = node.ping();
        assert!(!String::from_utf8_lossy(&text).contains("pods"));
        let reply: PingReply = serde_json::from_slice(&text).unwrap();
        assert!(reply.pods.is_empty());
    }

    #[test]
    fn replies_without_coordinates_still_parse_and_omit_them() {
        let old_peer = br#"{"node": "w1", "usage": null, "at_ms": 1}"#;
        let reply: PingReply = serde_json::from_slice(old_peer).unwrap();
        assert_eq!(reply.coordinate, None);
        assert!(reply.gossip.is_empty());
        let without = LocalNode::new(Some("w1".into()), None).ping();
        let text = String::from_utf8_lossy(&without);
        assert!(
            !text.contains("coordinate") && !text.contains("gossip"),
            "{text}"
        );
        let coordinates = Arc::new(NodeCoordinates::new(
            Some("w1".into()),
            proxima_core::coordinates::VivaldiConfig::default(),
            std::time::Duration::from_secs(30),
            1,
        ));
        let with = LocalNode::new(Some("w1".into()), None).with_coordinates(coordinates);
        let reply: PingReply = serde_json::from_slice(&with.ping()).unwrap();
        assert_eq!(reply.coordinate.unwrap().vec_ms, vec![0.0; 8]);
    }

    #[test]
    fn overrides_need_the_flag_and_valid_values() {
        let off = LocalNode::new(None, None);
        let (status, message) = off.put_usage(br#"{"cpu": 0.9, "ram": 0.1}"#).unwrap_err();
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert!(message.contains("--allow-usage-override"), "{message}");

        let source = Arc::new(FixedUsage::new(Some(Usage { cpu: 0.1, ram: 0.1 })));
        let on = LocalNode::new(Some("w1".into()), Some(source)).allowing_override();
        let reply = on.put_usage(br#"{"cpu": 0.9, "ram": 0.2}"#).unwrap();
        let reply: PingReply = serde_json::from_slice(&reply).unwrap();
        assert_eq!(reply.usage, Some(WireUsage { cpu: 0.9, ram: 0.2 }));
        for bad in [
            &b"{\"cpu\": -1, \"ram\": 0.2}"[..],
            b"{\"cpu\": 1}",
            b"cpu=1",
            b"",
        ] {
            let (status, _) = on.put_usage(bad).unwrap_err();
            assert_eq!(
                status,
                StatusCode::BAD_REQUEST,
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        on.put_usage(b"null").unwrap();
        assert_eq!(
            on.usage().unwrap().usage,
            Usage { cpu: 0.1, ram: 0.1 },
            "back to the source"
        );
    }

    #[test]
    fn readings_are_dated_by_their_age() {
        let now = Instant::now();
        assert_eq!(dated(now, None), now);
        assert_eq!(dated(now, Some(0)), now);
        let earlier = dated(now, Some(1500));
        assert!(earlier <= now);
        // An absurd age cannot go before this clock's origin: the reply time is used.
        assert!(dated(now, Some(u64::MAX)) <= now);
    }
}
