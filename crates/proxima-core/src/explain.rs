//! `/debug/pools`: every service's pool and why each endpoint is in or out.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::endpoint::{unanswered_limit, Admission, EvictionCause};
use crate::environment::{Environment, RttSource};
use crate::router::{Router, ServiceRoute};

/// The `/debug/pools` document: this proxy's view of every node and service.
#[derive(Debug, Serialize)]
pub struct PoolsExplain {
    /// This proxy's node (`--node-name`), if it knows it.
    pub node: Option<String>,
    /// What this proxy knows of every node: latency from here and resource usage.
    pub nodes: Vec<NodeExplain>,
    /// Every routed service, sorted by namespace and name.
    pub services: Vec<ServiceExplain>,
}

/// One node as this proxy sees it; readings older than their max age show as `null`.
#[derive(Debug, Serialize)]
pub struct NodeExplain {
    /// Node name, as in Kubernetes.
    pub name: String,
    /// Zone (`topology.kubernetes.io/zone`), if known.
    pub zone: Option<String>,
    /// Round-trip time from this node: smoothed measurement, else predicted by network
    /// coordinates (`null`: neither).
    pub rtt_ms: Option<f64>,
    /// Where `rtt_ms` comes from: `measured` or `coordinates`.
    pub rtt_from: Option<RttSource>,
    /// CPU in use as a fraction of the node's allocatable CPU (1.0 = all; may exceed it);
    /// `null`: unknown or stale.
    pub cpu: Option<f64>,
    /// Memory in use as a fraction of the node's allocatable memory (as `cpu`).
    pub ram: Option<f64>,
    /// Age of the reading `rtt_ms` comes from (the latency, or the node's coordinate), ms.
    pub rtt_age_ms: Option<f64>,
    /// Age of the usage reading, ms.
    pub usage_age_ms: Option<f64>,
}

/// One service's settings, pool and endpoints.
#[derive(Debug, Serialize)]
pub struct ServiceExplain {
    /// `name.namespace`, as clients name it in `x-service`.
    pub service: String,
    /// The service's namespace.
    pub namespace: String,
    /// The service's name.
    pub name: String,
    /// Strategy in use (`strategy` setting).
    pub strategy: String,
    /// The latency SLO, ms.
    pub latency_slo_ms: f64,
    /// Percentile of responses that must meet the SLO (e.g. 95).
    pub slo_percentile: f64,
    /// Endpoints in the QoS pool now.
    pub pool_size: usize,
    /// Endpoints that may serve at all (ready, or terminating when nothing else is left).
    pub eligible: usize,
    /// True when only terminating endpoints are left to serve.
    pub only_terminating: bool,
    /// The `failure-status` set, as configured.
    pub failure_status: String,
    /// Endpoints out for consecutive failures, and how many may be at once.
    pub failure_ejected: usize,
    /// Most endpoints that may be out for failures at once (`qos-pool-max-ejection-percent`).
    pub failure_ejection_cap: usize,
    /// How long ago this proxy last routed a client request of the service, ms; `None`
    /// if it never did.
    pub last_request_ms: Option<f64>,
    /// Whether its pods outside the pool go unprobed from here until a client request
    /// comes (none for `qos-pool-probe-idle-after`).
    pub probes_paused: bool,
    /// Settings rejected when read and problems found building the route, each once.
    pub warnings: Vec<String>,
    /// Every endpoint, in discovery order.
    pub endpoints: Vec<EndpointExplain>,
}

/// One endpoint and why it is (not) in the pool.
#[derive(Debug, Serialize)]
pub struct EndpointExplain {
    /// Endpoint id ([`crate::EndpointId`]: the pod name, or its IP when unnamed).
    pub id: String,
    /// `ip:port` of its first port.
    pub address: String,
    /// Its ports, each with the protocol it speaks and where that was read.
    pub ports: Vec<PortExplain>,
    /// Node the endpoint runs on, if known.
    pub node: Option<String>,
    /// Zone of the endpoint, if known.
    pub zone: Option<String>,
    /// EndpointSlice condition `ready`.
    pub ready: bool,
    /// EndpointSlice condition `serving`.
    pub serving: bool,
    /// EndpointSlice condition `terminating`.
    pub terminating: bool,
    /// Whether the endpoint is in the QoS pool now.
    pub in_pool: bool,
    /// Its admission state: warming, admitted or evicted.
    pub admission: Admission,
    /// Why it is out of the pool: `latency`, `consecutive-failures`, `unanswered`, or
    /// `null` when in.
    pub out_because: Option<EvictionCause>,
    /// One sentence: why it is (not) in the pool.
    pub reason: String,
    /// Fresh samples in the estimator's window.
    pub samples: usize,
    /// How many of those met the SLO.
    pub within_slo: usize,
    /// Predicted latency at the SLO percentile, ms (`null` without data or on failures).
    pub predicted_ms: Option<f64>,
    /// Exponentially weighted mean latency, ms (`null` without samples).
    pub ewma_ms: Option<f64>,
    /// Room under the SLO that `qos-pool-spread: slack` ranks pool members by, ms: the
    /// SLO less the larger of `predicted_ms` and the current peak-EWMA latency (without
    /// a measurement, the node's RTT plus the service's processing time; at least 1/64
    /// of the SLO). Members within an eighth of the SLO of the roomiest share the load.
    pub slack_ms: f64,
    /// Requests in flight to it now, through this proxy.
    pub in_flight: u32,
    /// Attempts started on it since it was discovered ([`crate::EndpointState::requests`]).
    pub requests: u64,
    /// Outcomes that counted as failures ([`crate::EndpointState::failures`]).
    pub failures: u64,
    /// Failures in a row, reset by a success.
    pub consecutive_failures: u32,
    /// Share weight (1 = full; less during the slow start after re-admission).
    pub weight: f64,
    /// Evictions soon after a return, which lengthen the wait for the first probe.
    pub flaps: u32,
    /// When the next probe is due, ms from now (endpoints out of the pool, suspected, or
    /// probed after a miss).
    pub next_probe_ms: Option<f64>,
    /// Time left before it may be picked again after connection failures, ms (`null`: none).
    pub cooldown_ms: Option<f64>,
    /// Out of the pool on a neighbour's failure report until a probe of this proxy's
    /// own answers within the SLO (see [`crate::neighbours`]).
    pub suspected: bool,
    /// What neighbouring proxies reported about it (`null`: nothing fresh).
    pub heard: Option<HeardExplain>,
}

/// What neighbouring proxies reported about an endpoint, and whose report it is.
#[derive(Debug, Serialize)]
pub struct HeardExplain {
    /// Its processing time (response time at the SLO percentile less the RTT to its
    /// node) as a neighbour measured it, ms, when fresh.
    pub processing_ms: Option<f64>,
    /// Samples that estimate rests on.
    pub processing_samples: Option<u32>,
    /// Age of that estimate's newest sample, ms.
    pub processing_age_ms: Option<f64>,
    /// Node of the proxy that measured it.
    pub processing_from: Option<String>,
    /// The newest verdict heard: `out` with its cause, or `back`.
    pub verdict: Option<crate::neighbours::VerdictKind>,
    /// How long ago that verdict was reached, ms.
    pub verdict_age_ms: Option<f64>,
    /// Node of the proxy that reached it.
    pub verdict_from: Option<String>,
    /// Proxies it passed through before it reached this one.
    pub verdict_hops: Option<u8>,
}

fn heard_explain(
    route: &ServiceRoute,
    index: usize,
    env: &crate::environment::Environment,
    now: Instant,
) -> Option<HeardExplain> {
    let heard = env
        .hearsay
        .get(route.key(), &route.endpoints[index].endpoint.id)?;
    let processing = route.heard_processing(index, env, now);
    let verdict = heard.verdict.as_ref();
    let age = |at: Instant| ms(now.saturating_duration_since(at));
    Some(HeardExplain {
        processing_ms: processing.map(|p| ms(p.time)),
        processing_samples: processing.map(|p| p.samples),
        processing_age_ms: processing.map(|p| age(p.at)),
        processing_from: processing.map(|p| p.origin.clone()),
        verdict: verdict.map(|v| v.kind),
        verdict_age_ms: verdict.map(|v| age(v.at)),
        verdict_from: verdict.map(|v| v.origin.clone()),
        verdict_hops: verdict.map(|v| v.hops),
    })
    .filter(|h| h.processing_ms.is_some() || h.verdict.is_some())
}

/// One port of an endpoint (see [`crate::port_protocol`]).
#[derive(Debug, Serialize)]
pub struct PortExplain {
    /// Its name (empty for an unnamed port).
    pub name: String,
    /// Its number on the endpoint's IP.
    pub port: u16,
    /// What it speaks: `http1`, `h2c` or `web-socket`.
    pub protocol: crate::PortProtocol,
    /// Where that was read: `endpoint-app-protocol`, `service-app-protocol`,
    /// `port-name` or `default`.
    pub protocol_from: crate::ProtocolSource,
    /// The `appProtocol` (or file `protocol`) value it was read from, as written.
    pub app_protocol: Option<String>,
}

fn ports_of(service: &[crate::ServicePort], endpoint: &[crate::EndpointPort]) -> Vec<PortExplain> {
    endpoint
        .iter()
        .map(|p| {
            let service_port = service.iter().find(|s| s.name == p.name);
            let (protocol, protocol_from) = crate::port_protocol(p, service_port);
            let app_protocol = p
                .app_protocol
                .clone()
                .or_else(|| service_port.and_then(|s| s.app_protocol.clone()));
            PortExplain {
                name: p.name.clone(),
                port: p.port,
                protocol,
                protocol_from,
                app_protocol,
            }
        })
        .collect()
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

impl Router {
    /// Explain every service, sorted by namespace and name.
    pub fn explain(&self, now: Instant) -> PoolsExplain {
        let table = self.table();
        let mut routes: Vec<_> = table.services.values().cloned().collect();
        routes.sort_by(|a, b| a.key().cmp(b.key()));
        let env = self.environment();
        let mut names: std::collections::BTreeSet<&str> =
            table.nodes.keys().map(String::as_str).collect();
        names.extend(env.latency.keys().map(String::as_str));
        names.extend(env.usage.keys().map(String::as_str));
        names.extend(env.coordinates.keys().map(String::as_str));
        let nodes = names
            .into_iter()
            .map(|name| {
                let usage = env.usage(name, now);
                let rtt = env.rtt_estimate(name, now);
                NodeExplain {
                    name: name.to_string(),
                    zone: table.nodes.get(name).and_then(|n| n.zone.clone()),
                    rtt_ms: rtt.map(|(d, _)| ms(d)),
                    rtt_from: rtt.map(|(_, from)| from),
                    cpu: usage.map(|u| u.cpu),
                    ram: usage.map(|u| u.ram),
                    rtt_age_ms: rtt_age(&env, name, rtt.map(|(_, from)| from))
                        .map(|at| ms(now.saturating_duration_since(at))),
                    usage_age_ms: env
                        .usage
                        .get(name)
                        .map(|r| ms(now.saturating_duration_since(r.at))),
                }
            })
            .collect();
        PoolsExplain {
            node: self.local_node().map(str::to_string),
            nodes,
            services: routes
                .iter()
                .map(|r| {
                    let probing = self.probes_paused(r, now);
                    explain_route(r, now, &env, self.local_node(), probing)
                })
                .collect(),
        }
    }
}

/// When the reading an RTT of `from` was taken from was taken (the latency reading
/// unless it was predicted).
fn rtt_age(env: &Environment, node: &str, from: Option<RttSource>) -> Option<Instant> {
    match from {
        Some(RttSource::Coordinates) => env.coordinates.get(node).map(|r| r.at),
        _ => env.latency.get(node).map(|r| r.at),
    }
}

/// Words for an RTT predicted rather than measured, empty when measured.
fn predicted_by_coordinates(env: &Environment, node: Option<&str>, now: Instant) -> &'static str {
    match node.and_then(|n| env.rtt_estimate(n, now)) {
        Some((_, RttSource::Coordinates)) => " (predicted by network coordinates)",
        _ => "",
    }
}

fn explain_route(
    route: &ServiceRoute,
    now: Instant,
    env: &Environment,
    local_node: Option<&str>,
    (paused, last_request): (bool, Option<Duration>),
) -> ServiceExplain {
    let s = route.settings();
    let pool = route.pool();
    let processing = route.processing_estimate(env, local_node, now);
    let too_far = |i: usize| {
        let processing = route.processing_of(i, processing, env, now);
        route.too_far(i, env, local_node, now, processing)
    };
    let processing_from = |i: usize| match route.heard_processing(i, env, now) {
        Some(heard) => format!(
            "its processing time as the proxy on {} measured it ({}ms over {} samples)",
            heard.origin,
            ms(heard.time),
            heard.samples
        ),
        None => "the service's processing time".to_string(),
    };
    let endpoints = route
        .endpoints
        .iter()
        .enumerate()
        .map(|(i, ep)| {
            let (prediction, admission) = {
                let stats = ep.state.lock();
                (
                    stats.estimator.predict(now, s.qos_pool.max_age, s.latency_slo, s.slo_percentile),
                    stats.admission,
                )
            };
            let detail = ep.state.detail();
            let weight = ep.state.weight(now, s.qos_pool.slow_start);
            let eligible = route.eligible().contains(&i);
            let in_pool = pool.contains(&i);
            let cooldown = ep.state.cooldown_remaining(now);
            let c = ep.endpoint.conditions;
            let p = s.slo_percentile;
            let quantile = prediction.quantile.filter(|d| *d != Duration::MAX);
            let over = || match prediction.quantile {
                Some(Duration::MAX) => format!("p{p} is a failed request"),
                Some(q) => format!("p{p} {:.3}ms", ms(q)),
                None => "no fresh samples".to_string(),
            };
            let reason = if !eligible {
                if c.terminating {
                    "terminating: used only when no endpoint is ready".to_string()
                } else {
                    "not ready".to_string()
                }
            } else {
                let failures = || match detail.last_failure_status {
                    Some(answer) => format!(
                        "{} consecutive failures (last: {answer})",
                        detail.consecutive_failures
                    ),
                    None => format!(
                        "{} consecutive failures (last: no response)",
                        detail.consecutive_failures
                    ),
                };
                // With no member in the pool, one good probe re-admits (endpoint.rs).
                let to_return = if route.read_pool(|pool| pool.is_empty()) {
                    1
                } else {
                    s.qos_pool.readmit_after
                };
                let mut base = match admission {
                    Admission::Warming if too_far(i).is_some() => {
                        format!(
                            "initial estimate: its node's RTT from here{} plus {} ({}ms in all) exceeds the {}ms SLO; kept out of the pool until its node comes closer",
                            predicted_by_coordinates(env, ep.endpoint.node.as_deref(), now),
                            processing_from(i),
                            too_far(i).map_or(0.0, ms),
                            ms(s.latency_slo)
                        )
                    }
                    Admission::Warming if !in_pool && route.awaiting_first_probe(i) => format!(
                        "new and not yet measured while the pool has measured members: waits out of the pool for a first probe within the {}ms SLO",
                        ms(s.latency_slo)
                    ),
                    Admission::Warming => format!(
                        "warming up: {}/{} fresh samples, initial estimate assumes it meets the SLO",
                        prediction.samples, s.qos_pool.min_samples
                    ),
                    Admission::Admitted if prediction.meets(p) == Some(false) => format!(
                        "meets SLO within its margin: {}/{} within {}ms, under {p}% but by no more than chance explains for a pod that meets it (qos-pool-verdict-confidence {})",
                        prediction.within_slo,
                        prediction.samples,
                        ms(s.latency_slo),
                        s.qos_pool.verdict_confidence
                    ),
                    Admission::Admitted => format!(
                        "meets SLO: {} <= {}ms over {} samples",
                        over(),
                        ms(s.latency_slo),
                        prediction.samples
                    ),
                    Admission::Evicted {
                        consecutive_good,
                        cause: EvictionCause::Latency,
                        ..
                    } => format!(
                        "evicted for latency: {} > {}ms ({}/{} within SLO); probing, {}/{} good probes to return",
                        over(),
                        ms(s.latency_slo),
                        prediction.within_slo,
                        prediction.samples,
                        consecutive_good,
                        to_return
                    ),
                    Admission::Evicted {
                        consecutive_good,
                        cause: EvictionCause::ConsecutiveFailures,
                        ..
                    } => format!(
                        "ejected for consecutive failures ({} or more in a row, qos-pool-eject-after); probing, {}/{} good probes to return",
                        s.qos_pool.eject_after,
                        consecutive_good,
                        to_return
                    ),
                    Admission::Evicted {
                        consecutive_good,
                        cause: EvictionCause::Unanswered,
                        ..
                    } => format!(
                        "evicted as hung: a request went {}ms without an answer while it answered nothing else; probing, {}/{} good probes to return",
                        ms(unanswered_limit(s)),
                        consecutive_good,
                        to_return
                    ),
                };
                if admission.in_pool() && ep.state.suspected() {
                    let heard = env
                        .hearsay
                        .get(route.key(), &ep.endpoint.id)
                        .and_then(|h| h.verdict.as_ref());
                    let (from, ago) = heard.map_or(("a neighbour".to_string(), 0.0), |v| {
                        (
                            format!("the proxy on {}", v.origin),
                            ms(now.saturating_duration_since(v.at)),
                        )
                    });
                    base = format!(
                        "suspect: {from} saw it fail {ago}ms ago, after this proxy's last answer from it; out of the pool until a probe of this proxy's own answers within the {}ms SLO ({base})",
                        ms(s.latency_slo)
                    );
                }
                if admission.in_pool() && route.probed_in_pool(i) && !ep.state.suspected() {
                    base = format!(
                        "{base}; its last answer missed: probed every {}ms until one meets the SLO",
                        ms(s.qos_pool.probe_interval)
                    );
                }
                if admission.in_pool() && detail.ejection_capped {
                    base = format!(
                        "{base}; {} but not ejected: {} of {} pods are already out for failures (qos-pool-max-ejection-percent {})",
                        failures(),
                        route.failure_ejected(),
                        route.eligible().len(),
                        s.qos_pool.max_ejection_percent
                    );
                } else if admission.in_pool() && detail.kept_during_stall {
                    base = format!(
                        "{base}; kept in the pool although it misses the SLO: it is the last member and the proxy itself stalled within the last {}s",
                        crate::router::STALL_MEMORY.as_secs()
                    );
                }
                if admission.in_pool() && weight < 1.0 {
                    base = format!(
                        "{base}; slow start after re-admission: {:.0}% of a full share",
                        weight * 100.0
                    );
                }
                match cooldown {
                    Some(left) => format!(
                        "cooling down after connection failures ({:.0}ms left); {base}",
                        ms(left)
                    ),
                    None => base,
                }
            };
            let port = ep.endpoint.ports.first().map_or(0, |p| p.port);
            EndpointExplain {
                id: ep.endpoint.id.clone(),
                address: std::net::SocketAddr::new(ep.endpoint.ip, port).to_string(),
                ports: ports_of(&route.spec.ports, &ep.endpoint.ports),
                node: ep.endpoint.node.clone(),
                zone: ep.endpoint.zone.clone(),
                ready: c.ready,
                serving: c.serving,
                terminating: c.terminating,
                in_pool,
                admission,
                out_because: match admission {
                    Admission::Evicted { cause, .. } => Some(cause),
                    _ => None,
                },
                reason,
                samples: prediction.samples,
                within_slo: prediction.within_slo,
                predicted_ms: quantile.map(ms),
                ewma_ms: prediction.ewma.map(ms),
                slack_ms: 1e3 * crate::strategy::qos_pool::room_now(route, i, env, local_node, now),
                in_flight: ep.state.in_flight(),
                requests: ep.state.requests(),
                failures: ep.state.failures(),
                consecutive_failures: detail.consecutive_failures,
                weight,
                flaps: detail.flaps,
                next_probe_ms: detail
                    .next_probe
                    .filter(|_| !admission.in_pool())
                    .map(|at| ms(at.saturating_duration_since(now))),
                cooldown_ms: cooldown.map(ms),
                suspected: ep.state.suspected(),
                heard: heard_explain(route, i, env, now),
            }
        })
        .collect();
    ServiceExplain {
        service: route.key().to_string(),
        namespace: route.key().namespace.clone(),
        name: route.key().name.clone(),
        strategy: route.strategy.name().to_string(),
        latency_slo_ms: ms(s.latency_slo),
        slo_percentile: s.slo_percentile,
        pool_size: pool.len(),
        eligible: route.eligible().len(),
        only_terminating: route.only_terminating(),
        failure_status: s.failure_status.as_str().to_string(),
        failure_ejected: route.failure_ejected(),
        failure_ejection_cap: route.ejection_cap(),
        last_request_ms: last_request.map(ms),
        probes_paused: paused && route.strategy.probes_evicted(),
        warnings: {
            // Settings rejected when read, then what building the route found.
            let mut warnings: Vec<String> = s.problems.iter().map(ToString::to_string).collect();
            for w in route.warnings.iter().map(ToString::to_string) {
                if !warnings.contains(&w) {
                    warnings.push(w);
                }
            }
            warnings
        },
        endpoints,
    }
}
