//! The peer prober: node-to-node latency from this node, and peers' own usage reports.
//!
//! Every `interval` a round runs:
//!
//! 1. the probe-able peers are read from the routing table ([`sample::peers`]: every
//!    other node with an address; port from `proxima.io/admin-port` or `--peer-port`);
//! 2. at most `max_peers_per_round` of them are chosen ([`sample::select`]);
//! 3. all chosen peers are probed at once, each `GET /node/ping` on a fresh connection
//!    with one overall `timeout` (connect included). The sample is the time from sending
//!    the request to reading the whole reply: one network round trip plus the peer's
//!    (tiny) handling time; the TCP handshake before it is not counted;
//! 4. each sample updates the peer's EWMA (`smoothing` is the new sample's weight; a
//!    peer whose last reading expired starts again from the sample), dated when the
//!    reply arrived. A reply from a proxy that says it runs on another node is a
//!    failure: the address or port is wrong, and its usage must not be misattributed;
//! 5. the pod reports in the replies are taken in (`proxima_core::neighbours`), and the
//!    digest this proxy's own replies carry is rebuilt at the start of each round;
//! 6. the readings are published into the router's [`Environment`](proxima_core::Environment) in one update,
//!    together with the peers' reported usage and this node's own usage when peer
//!    reports are the usage source ([`PeerUsage`]), and expired readings are dropped.
//!
//! When this node keeps network coordinates (its [`LocalNode`] was given
//! [`NodeCoordinates`]), every answer also moves this node's
//! coordinate (the raw RTT sample and the peer's coordinate from the reply) and adds the
//! coordinates the peer relayed; the round then publishes this node's coordinate and
//! every fresh known one into the environment, where they predict the RTT of nodes
//! without a fresh measurement ([`Environment::rtt_estimate`](proxima_core::Environment::rtt_estimate)).
//!
//! A peer that stops answering keeps its last reading until it is older than the
//! environment's `max_age`; strategies then see no latency for it (they are written to
//! work without one). Failures are counted per node in
//! `proxima_peer_probe_failures_total`.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::header::{HeaderValue, HOST, USER_AGENT};
use hyper::{Request, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use proxima_core::environment::LatencyReading;
use proxima_core::{HearReport, Router, Usage};
use rand::{Rng, RngCore};
use tokio::net::TcpStream;
use tower::Service;
use tracing::{debug, info, warn};

use crate::coordinates::NodeCoordinates;
use crate::dated;
use crate::metrics::NodeGauges;
use crate::ping::{LocalNode, PingReply};
use crate::sample::{self, ProbeHistory};
use crate::share::{self, WirePod};
use crate::usage::is_plausible;

/// Time beyond the probe timeout allowed for the first round's bookkeeping.
const FIRST_ROUND_SLACK: Duration = Duration::from_millis(250);

/// Path of the ping endpoint on a peer's admin port.
pub const PING_PATH: &str = "/node/ping";

/// Largest ping reply read.
const MAX_REPLY_BYTES: usize = 16 * 1024;

/// How the prober runs.
#[derive(Clone, Debug)]
pub struct ProberConfig {
    /// Time between rounds.
    pub interval: Duration,
    /// Limit of one probe, connect included.
    pub timeout: Duration,
    /// Most peers probed per round (0 probes none; this node's usage is still published).
    pub max_peers_per_round: usize,
    /// Admin port of peer proxies, unless a node's `proxima.io/admin-port` label says
    /// otherwise.
    pub peer_port: u16,
    /// Weight of a new sample in the EWMA, in (0, 1].
    pub smoothing: f64,
    /// Local address probes leave from (as the proxy's `upstream_bind`); `None`: the
    /// kernel chooses. The testbed binds each emulated node's probes to its address.
    pub bind: Option<IpAddr>,
    /// The admin token peers expect (`Authorization: Bearer`), when their `/node/*`
    /// endpoints are closed to the node network (see `proxima_admin::AdminAccess`).
    pub token: Option<String>,
    /// Bytes of pod reports each reply of this proxy carries (see [`crate::share`]);
    /// 0 shares nothing and takes in nothing of what peers share.
    pub share_bytes: usize,
}

impl Default for ProberConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(2),
            timeout: Duration::from_secs(1),
            max_peers_per_round: 32,
            peer_port: 9901,
            smoothing: 0.3,
            bind: None,
            token: None,
            share_bytes: crate::share::DEFAULT_BUDGET,
        }
    }
}

/// Whether peers' usage reports are published into the environment. The
/// metrics-server source turns it off while metrics.k8s.io answers and on when it does
/// not. Clones share one switch.
#[derive(Clone, Debug)]
pub struct PeerUsage(Arc<AtomicBool>);

impl PeerUsage {
    /// A switch, on if `enabled`.
    pub fn new(enabled: bool) -> Self {
        Self(Arc::new(AtomicBool::new(enabled)))
    }

    /// Turn publishing peers' usage on or off, for every clone.
    pub fn set(&self, enabled: bool) {
        self.0.store(enabled, Ordering::Relaxed);
    }

    /// Whether peers' usage is published now.
    pub fn enabled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// Why a probe failed.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// No whole reply within the probe's time limit (connect included).
    #[error("no reply within {0:?}")]
    Timeout(Duration),
    /// The TCP connect failed.
    #[error("cannot connect: {0}")]
    Connect(#[source] io::Error),
    /// The HTTP exchange failed.
    #[error("HTTP error: {0}")]
    Http(#[from] hyper::Error),
    /// The peer answered with a status other than 200.
    #[error("answered {0}")]
    Status(StatusCode),
    /// The reply body is not a ping reply.
    #[error("unreadable reply: {0}")]
    Reply(String),
    /// The proxy that answered names another node than the one probed (a stale address).
    #[error("the proxy there runs on node {0:?}")]
    WrongNode(String),
}

/// A successful probe.
#[derive(Clone, Debug)]
pub struct Answer {
    /// Request sent to reply read.
    pub rtt: Duration,
    /// What the peer said.
    pub reply: PingReply,
    /// When the reply was read.
    pub received: Instant,
}

/// Probe the proxy at `addr` once (see the module docs).
pub async fn ping(addr: SocketAddr, timeout: Duration) -> Result<Answer, ProbeError> {
    ping_from(addr, None, timeout).await
}

/// [`ping`] from the local address `bind`, when given.
pub async fn ping_from(
    addr: SocketAddr,
    bind: Option<IpAddr>,
    timeout: Duration,
) -> Result<Answer, ProbeError> {
    ping_with(addr, bind, None, timeout).await
}

/// [`ping_from`], sending `token` as `Authorization: Bearer <token>` when given.
pub async fn ping_with(
    addr: SocketAddr,
    bind: Option<IpAddr>,
    token: Option<&str>,
    timeout: Duration,
) -> Result<Answer, ProbeError> {
    tokio::time::timeout(timeout, exchange(addr, bind, token))
        .await
        .map_err(|_| ProbeError::Timeout(timeout))?
}

/// A connection to the peer at `addr`, leaving from `bind` (`--upstream-bind`) as the
/// proxy's own connections to pods do, through hyper-util's connector, which binds the
/// local address when it is of `addr`'s family, and turns Nagle off (a small request and
/// reply must not wait for each other).
async fn connect(addr: SocketAddr, bind: Option<IpAddr>) -> io::Result<TokioIo<TcpStream>> {
    let mut connector = HttpConnector::new();
    connector.set_local_address(bind);
    connector.set_nodelay(true);
    let uri = hyper::Uri::try_from(format!("http://{addr}/")).map_err(io::Error::other)?;
    connector.call(uri).await.map_err(io::Error::other)
}

async fn exchange(
    addr: SocketAddr,
    bind: Option<IpAddr>,
    token: Option<&str>,
) -> Result<Answer, ProbeError> {
    let stream = connect(addr, bind).await.map_err(ProbeError::Connect)?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(stream).await?;
    let mut request = Request::new(Empty::new());
    *request.uri_mut() = hyper::Uri::from_static(PING_PATH);
    let headers = request.headers_mut();
    if let Ok(host) = HeaderValue::from_str(&addr.to_string()) {
        headers.insert(HOST, host);
    }
    headers.insert(USER_AGENT, HeaderValue::from_static("proxima-peer-prober"));
    if let Some(Ok(value)) = token.map(|t| HeaderValue::from_str(&format!("Bearer {t}"))) {
        headers.insert(hyper::header::AUTHORIZATION, value);
    }
    let answer = async {
        let sent = Instant::now();
        let response = sender.send_request(request).await?;
        if response.status() != StatusCode::OK {
            return Err(ProbeError::Status(response.status()));
        }
        let body = Limited::new(response.into_body(), MAX_REPLY_BYTES)
            .collect()
            .await
            .map_err(|e| ProbeError::Reply(e.to_string()))?
            .to_bytes();
        let received = Instant::now();
        let reply: PingReply =
            serde_json::from_slice(&body).map_err(|e| ProbeError::Reply(e.to_string()))?;
        Ok(Answer {
            rtt: received.saturating_duration_since(sent),
            reply,
            received,
        })
    };
    tokio::pin!(conn);
    tokio::pin!(answer);
    tokio::select! {
        biased;
        answer = &mut answer => answer,
        // The connection ended first (the peer may close after replying): the reply, if
        // any, is already on its way to `answer`.
        closed = &mut conn => {
            closed?;
            answer.await
        }
    }
}

/// What one round did.
#[derive(Debug, Default)]
pub struct RoundReport {
    /// Peers probed, in the order chosen.
    pub probed: Vec<String>,
    /// Peers that answered, with their smoothed round-trip time.
    pub answered: Vec<(String, Duration)>,
    /// Peers that did not answer, and why.
    pub failed: Vec<(String, ProbeError)>,
    /// What the pod reports in the replies did, when sharing is on.
    pub heard: Option<HearReport>,
}

/// The probing loop (see the module docs).
pub struct PeerProber {
    router: Arc<Router>,
    config: ProberConfig,
    gauges: Arc<NodeGauges>,
    local: Option<Arc<LocalNode>>,
    peer_usage: PeerUsage,
    rng: Box<dyn RngCore + Send>,
    history: HashMap<String, ProbeHistory>,
    smoothed: HashMap<String, LatencyReading>,
    /// Peers whose last probe failed after an earlier success (logged once).
    failing: HashMap<String, bool>,
    /// Where this round's estimates start in the digest (see [`share::encode`]).
    share_cursor: usize,
}

/// How long after the start of a round the next one starts: `interval`, jittered by up
/// to a tenth of it either way; before the loop's `first` round, a random share of it.
/// Proxies that start together (a DaemonSet rollout; the testbed's emulated nodes, all
/// started at once) would otherwise probe in step for as long as they run: every
/// node's probes, and every peer's replies, in the same instant of each interval. On the
/// testbed's 50-node scenarios that was 1,600 probes at once every 2 s and a host lag of
/// 100-300 ms at each, which a 12 ms SLO cannot absorb. Envoy's health checks
/// (`initial_jitter`, `interval_jitter`) and memberlist's gossip jitter for the same
/// reason.
fn round_wait(interval: Duration, first: bool, rng: &mut dyn RngCore) -> Duration {
    let share = if first {
        rng.gen_range(0.0..1.0)
    } else {
        rng.gen_range(0.9..1.1)
    };
    interval.mul_f64(share)
}

impl std::fmt::Debug for PeerProber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerProber")
            .field("config", &self.config)
            .field("peers", &self.history.len())
            .finish_non_exhaustive()
    }
}

impl PeerProber {
    /// A prober for `router`'s node. `rng` chooses among equally good peers (seed it in
    /// tests). Peer usage reports are published by default.
    pub fn new(
        router: Arc<Router>,
        config: ProberConfig,
        gauges: Arc<NodeGauges>,
        rng: impl RngCore + Send + 'static,
    ) -> Self {
        Self {
            router,
            config,
            gauges,
            local: None,
            peer_usage: PeerUsage::new(true),
            rng: Box::new(rng),
            history: HashMap::new(),
            smoothed: HashMap::new(),
            failing: HashMap::new(),
            share_cursor: 0,
        }
    }

    /// Also publish this node's own usage (from what it tells peers) while peer reports
    /// are the usage source.
    pub fn with_local(mut self, local: Arc<LocalNode>) -> Self {
        self.local = Some(local);
        self
    }

    /// Publish peers' usage only while `switch` is on.
    pub fn with_peer_usage(mut self, switch: PeerUsage) -> Self {
        self.peer_usage = switch;
        self
    }

    /// Run rounds about every `interval` until `shutdown` resolves: the first after a
    /// random share of the interval, then one every interval, each start jittered by up
    /// to a tenth of it either way (`round_wait`).
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let interval = self.config.interval.max(Duration::from_millis(10));
        let mut next = tokio::time::Instant::now() + round_wait(interval, true, &mut self.rng);
        loop {
            tokio::select! {
                () = &mut shutdown => return,
                () = tokio::time::sleep_until(next) => {}
            }
            let started = tokio::time::Instant::now();
            tokio::select! {
                () = &mut shutdown => return,
                _ = self.round() => {}
            }
            let wait = round_wait(interval, false, &mut self.rng);
            next = (started + wait).max(tokio::time::Instant::now());
        }
    }

    /// One round before the proxy serves, so that a proxy that joins knows its peers'
    /// round-trip times and what they measured of pods (failures, processing times)
    /// before its first request: without them every pod it has not measured looks as
    /// good as any other, and its first requests go to pods its neighbours know cannot
    /// meet the SLO. Probes run at once, so the round takes about one probe timeout; a
    /// round that takes longer is given up (`None`) and left to the loop.
    pub async fn first_round(&mut self) -> Option<RoundReport> {
        let started = Instant::now();
        let bound = self.config.timeout + FIRST_ROUND_SLACK;
        match tokio::time::timeout(bound, self.round()).await {
            Ok(report) => {
                info!(
                    answered = report.answered.len(),
                    probed = report.probed.len(),
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "first round of peer probes done before serving"
                );
                Some(report)
            }
            Err(_) => {
                warn!(
                    "first round of peer probes took longer than {:?}; serving without it",
                    self.config.timeout
                );
                None
            }
        }
    }

    /// Probe one sample of peers and publish the results.
    pub async fn round(&mut self) -> RoundReport {
        let table = self.router.table();
        let env = self.router.environment();
        let started = Instant::now();
        self.forget_departed(|node| table.nodes.contains_key(node));

        let peers = sample::peers(&table, self.router.local_node(), self.config.peer_port);
        let chosen = sample::select(
            peers,
            &self.history,
            started,
            env.max_age / 2,
            self.config.max_peers_per_round,
            &mut *self.rng,
        );
        let (timeout, bind) = (self.config.timeout, self.config.bind);
        self.publish_pods(started);
        let token = self.config.token.as_deref();
        let results = futures_util::future::join_all(
            chosen
                .iter()
                .map(|p| ping_with(p.addr, bind, token, timeout)),
        )
        .await;

        let publish_usage = self.peer_usage.enabled();
        let mut report = RoundReport::default();
        let mut latencies = Vec::new();
        let mut usages = Vec::new();
        let mut pods = Vec::new();
        for (peer, result) in chosen.into_iter().zip(results) {
            let node = peer.node;
            report.probed.push(node.clone());
            self.history.entry(node.clone()).or_default().last_attempt = Some(started);
            let answer = result.and_then(|a| match &a.reply.node {
                Some(other) if *other != node => Err(ProbeError::WrongNode(other.clone())),
                _ => Ok(a),
            });
            match answer {
                Ok(answer) => {
                    let rtt = self.smooth(&node, answer.rtt, answer.received, env.max_age);
                    self.history.entry(node.clone()).or_default().last_success =
                        Some(answer.received);
                    if self.failing.remove(&node) == Some(true) {
                        info!(node, addr = %peer.addr, "peer proxy answers again");
                    }
                    self.learn_coordinates(&node, &answer);
                    if let Some(usage) = answer.reply.usage.map(Usage::from) {
                        if is_plausible(usage) {
                            let at = dated(answer.received, answer.reply.usage_age_ms);
                            usages.push((node.clone(), usage, at));
                        }
                    }
                    latencies.push((node.clone(), rtt, answer.received));
                    pods.push((answer.received, answer.reply.pods));
                    report.answered.push((node, rtt));
                }
                Err(e) => {
                    self.gauges.probe_failed(&node);
                    let answered_before = self.history.get(&node).and_then(|h| h.last_success);
                    let first_failure = !self.failing.contains_key(&node);
                    if answered_before.is_some() && first_failure {
                        info!(node, addr = %peer.addr, "peer proxy stopped answering: {e}");
                    } else {
                        debug!(node, addr = %peer.addr, "peer probe failed: {e}");
                    }
                    self.failing.insert(node.clone(), answered_before.is_some());
                    report.failed.push((node, e));
                }
            }
        }

        let local = self
            .local
            .as_ref()
            .filter(|_| publish_usage)
            .and_then(|l| Some((l.name()?.to_string(), l.usage()?)));
        let now = Instant::now();
        let coordinates = self.coordinates().map(|c| (c.own(), c.known(now)));
        self.router.update_environment(|env| {
            for (node, rtt, at) in latencies {
                env.set_latency(node, rtt, at);
            }
            if publish_usage {
                for (node, usage, at) in usages {
                    env.set_usage(node, usage, at);
                }
                if let Some((node, reading)) = local {
                    env.set_usage(node, reading.usage, reading.at);
                }
            }
            if let Some((own, known)) = coordinates {
                env.local_coordinate = Some(own);
                env.coordinates = known.into_iter().collect();
            }
            let max_age = env.max_age;
            let fresh = |at: Instant| now.saturating_duration_since(at) <= max_age;
            env.latency.retain(|_, r| fresh(r.at));
            env.usage.retain(|_, r| fresh(r.at));
        });
        self.gauges.refresh(&self.router.environment(), now);
        report.heard = self.hear(pods, now);
        report
    }

    /// This round's pod reports for peers' pings (see [`crate::share`]).
    fn publish_pods(&mut self, now: Instant) {
        let Some(local) = self.local.as_ref().filter(|_| self.config.share_bytes > 0) else {
            return;
        };
        let digest = self.router.digest(now);
        let (pods, next) = share::encode(&digest, self.config.share_bytes, self.share_cursor);
        self.share_cursor = next;
        local.set_pods(&pods);
    }

    /// Take in the pod reports of the replies read at their times, as of `now`.
    fn hear(&self, replies: Vec<(Instant, Vec<WirePod>)>, now: Instant) -> Option<HearReport> {
        if self.config.share_bytes == 0 {
            return None;
        }
        let reports: Vec<_> = replies
            .into_iter()
            .flat_map(|(received, pods)| {
                let since = now.saturating_duration_since(received);
                pods.into_iter().filter_map(move |p| p.into_report(since))
            })
            .collect();
        let heard = self.router.hear(&reports, now);
        for (service, pod, origin) in &heard.suspected {
            info!(%service, pod, reported_by = origin, "pod suspect on a neighbour's failure report: probed before it takes another request");
        }
        Some(heard)
    }

    /// This node's network coordinates, when it keeps them.
    fn coordinates(&self) -> Option<&Arc<NodeCoordinates>> {
        self.local.as_ref()?.coordinates()
    }

    /// Feed `node`'s answer to the network coordinates, if this node keeps them.
    fn learn_coordinates(&self, node: &str, answer: &Answer) {
        let Some(coordinates) = self.coordinates() else {
            return;
        };
        if let Some(peer) = &answer.reply.coordinate {
            if let Err(e) = coordinates.observe(node, peer, answer.rtt, answer.received) {
                debug!(node, "peer coordinate not used: {e}");
            }
        }
        coordinates.learn(&answer.reply.gossip, answer.received);
    }

    /// EWMA of the round-trip time to `node`, restarted when the last reading expired.
    fn smooth(&mut self, node: &str, sample: Duration, at: Instant, max_age: Duration) -> Duration {
        let alpha = self.config.smoothing.clamp(0.01, 1.0);
        let rtt = match self.smoothed.get(node) {
            Some(last) if at.saturating_duration_since(last.at) <= max_age => {
                let (last, sample) = (last.rtt.as_secs_f64(), sample.as_secs_f64());
                Duration::from_secs_f64((last + alpha * (sample - last)).max(0.0))
            }
            _ => sample,
        };
        self.smoothed
            .insert(node.to_string(), LatencyReading { rtt, at });
        rtt
    }

    fn forget_departed(&mut self, present: impl Fn(&str) -> bool) {
        self.history.retain(|node, _| present(node));
        self.smoothed.retain(|node, _| present(node));
        self.failing.retain(|node, _| present(node));
        if let Some(coordinates) = self.coordinates() {
            coordinates.retain(&present, Instant::now());
        }
        self.gauges.retain_nodes(present);
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    use super::*;

    #[test]
    fn rounds_of_proxies_started_together_drift_apart() {
        // Fifty proxies started in the same instant, 2 s rounds: by their tenth round their
        // starts are spread over the interval rather than stacked in one instant.
        let interval = Duration::from_secs(2);
        let mut rng = SmallRng::seed_from_u64(7);
        let mut firsts = vec![];
        let mut tenths = vec![];
        for _ in 0..50 {
            let mut at = round_wait(interval, true, &mut rng);
            firsts.push(at);
            for _ in 1..10 {
                let wait = round_wait(interval, false, &mut rng);
                assert!(wait >= interval.mul_f64(0.9) && wait <= interval.mul_f64(1.1));
                at += wait;
            }
            tenths.push(at);
        }
        assert!(firsts.iter().all(|&w| w < interval));
        // The starts of the tenth round, as phases within the interval: at most 10 of the
        // 50 in any tenth of it (5 on average; in step, all 50 would be in one).
        let mut per_tenth = [0; 10];
        for at in &tenths {
            let phase = at.as_secs_f64() % interval.as_secs_f64() / interval.as_secs_f64();
            per_tenth[(phase * 10.0) as usize % 10] += 1;
        }
        assert!(per_tenth.iter().all(|&n| n <= 10), "{per_tenth:?}");
        // The mean wait stays the interval: the cadence of the probes is unchanged.
        let mean = (tenths.iter().sum::<Duration>() - firsts.iter().sum::<Duration>()) / (50 * 9);
        assert!(
            mean > interval.mul_f64(0.97) && mean < interval.mul_f64(1.03),
            "{mean:?}"
        );
    }

    #[tokio::test]
    async fn probes_leave_from_the_bind_address() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let local: IpAddr = "127.0.0.2".parse().unwrap();
        let _bound = connect(addr, Some(local)).await.unwrap();
        let (_, peer) = listener.accept().await.unwrap();
        assert_eq!(peer.ip(), local);
        let _unbound = connect(addr, None).await.unwrap();
        let (_, peer) = listener.accept().await.unwrap();
        assert_eq!(peer.ip(), IpAddr::from([127, 0, 0, 1]));
    }

    fn prober(smoothing: f64) -> PeerProber {
        let gauges = Arc::new(NodeGauges::register(&prometheus::Registry::new()).unwrap());
        let config = ProberConfig {
            smoothing,
            ..ProberConfig::default()
        };
        PeerProber::new(
            Arc::new(Router::new(None)),
            config,
            gauges,
            SmallRng::seed_from_u64(1),
        )
    }

    #[test]
    fn rtt_is_smoothed_and_restarts_after_expiry() {
        let mut p = prober(0.5);
        let t0 = Instant::now();
        let max_age = Duration::from_secs(10);
        let ms = Duration::from_millis;
        assert_eq!(p.smooth("n", ms(40), t0, max_age), ms(40));
        assert_eq!(p.smooth("n", ms(20), t0 + ms(1), max_age), ms(30));
        assert_eq!(p.smooth("n", ms(30), t0 + ms(2), max_age), ms(30));
        // Expired: the old value says nothing any more.
        assert_eq!(
            p.smooth("n", ms(2), t0 + Duration::from_secs(20), max_age),
            ms(2)
        );
    }

    #[tokio::test]
    async fn a_closed_port_fails_fast_and_an_unrouted_address_times_out() {
        // Bind then drop, so that the port is closed.
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        match ping(addr, Duration::from_secs(5)).await {
            Err(ProbeError::Connect(_)) => {}
            other => panic!("expected a refused connection, got {other:?}"),
        }
        // A listener that never accepts and never answers.
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let timeout = Duration::from_millis(200);
        match ping(silent.local_addr().unwrap(), timeout).await {
            Err(ProbeError::Timeout(t)) => assert_eq!(t, timeout),
            other => panic!("expected a timeout, got {other:?}"),
        }
    }
}
