//! Pod reports on the wire: the `pods` list of a `/node/ping` reply (see
//! `proxima_core::neighbours` for what they mean and how they are weighed).
//!
//! ```json
//! "pods": [
//!   {"svc": "default/api", "pod": "api-7f9c-2", "by": "edge-3", "verdict": "consecutive-failures", "verdict_age_ms": 420},
//!   {"svc": "default/api", "pod": "api-7f9c-4", "by": "edge-3", "proc_us": 2140, "n": 64, "proc_age_ms": 35},
//!   {"svc": "default/api", "pod": "api-7f9c-5", "by": "edge-9", "hops": 1, "proc_us": 9800, "n": 12, "proc_age_ms": 2400}
//! ]
//! ```
//!
//! A reply carries at most `budget` bytes of them ([`encode`]): every piece of news
//! first (failure verdicts and returns), then processing estimates from a rotating
//! cursor, so that over rounds every estimate travels whatever the cluster size. What a
//! peer sends is checked before it is believed ([`WirePod::into_report`]): an entry that
//! is malformed or out of range is dropped, the rest of the reply still counts.

use std::time::Duration;

use proxima_core::neighbours::{PodReport, ProcessingReport, VerdictKind, VerdictReport, MAX_HOPS};
use proxima_core::{Digest, EvictionCause, ServiceKey};
use serde::{Deserialize, Serialize};

/// Default byte budget of the `pods` list in one reply.
pub const DEFAULT_BUDGET: usize = 4096;

/// Longest name (service, pod, node) believed: a DNS subdomain's 253 characters.
const MAX_NAME: usize = 253;

/// Largest age or processing time believed: anything older is not news, anything
/// slower is not a processing time.
const MAX_MS: u64 = 3_600_000;

/// One pod report as it travels (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WirePod {
    /// The service, `namespace/name`.
    pub svc: String,
    /// The pod's endpoint id.
    pub pod: String,
    /// Node of the proxy that measured it.
    pub by: String,
    /// Times it was passed on since.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub hops: u8,
    /// Processing time, µs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proc_us: Option<u64>,
    /// Samples the processing time rests on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<u32>,
    /// Age of the processing time's newest sample, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proc_age_ms: Option<u64>,
    /// `consecutive-failures`, `unanswered`, `latency` or `back`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<String>,
    /// How long ago the verdict was reached, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict_age_ms: Option<u64>,
}

fn is_zero(v: &u8) -> bool {
    *v == 0
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn verdict_name(kind: VerdictKind) -> &'static str {
    match kind {
        VerdictKind::Out(EvictionCause::ConsecutiveFailures) => "consecutive-failures",
        VerdictKind::Out(EvictionCause::Unanswered) => "unanswered",
        VerdictKind::Out(EvictionCause::Latency) => "latency",
        VerdictKind::Back => "back",
    }
}

fn verdict_kind(name: &str) -> Option<VerdictKind> {
    Some(match name {
        "consecutive-failures" => VerdictKind::Out(EvictionCause::ConsecutiveFailures),
        "unanswered" => VerdictKind::Out(EvictionCause::Unanswered),
        "latency" => VerdictKind::Out(EvictionCause::Latency),
        "back" => VerdictKind::Back,
        _ => return None,
    })
}

impl WirePod {
    /// The report as it travels.
    pub fn from_report(r: &PodReport) -> Self {
        Self {
            svc: format!("{}/{}", r.service.namespace, r.service.name),
            pod: r.pod.clone(),
            by: r.origin.clone(),
            hops: r.hops,
            proc_us: r
                .processing
                .map(|p| u64::try_from(p.time.as_micros()).unwrap_or(u64::MAX)),
            n: r.processing.map(|p| p.samples),
            proc_age_ms: r.processing.map(|p| millis(p.age)),
            verdict: r.verdict.map(|v| verdict_name(v.kind).to_string()),
            verdict_age_ms: r.verdict.map(|v| millis(v.age)),
        }
    }

    /// The report, aged by `since_received` (the time between reading the reply and
    /// taking it in), if every part of it is well-formed and in range; a part that is
    /// not (an unknown verdict, a processing time without its sample count) is left out.
    pub fn into_report(self, since_received: Duration) -> Option<PodReport> {
        let (namespace, name) = self.svc.split_once('/')?;
        let names = [namespace, name, &self.pod, &self.by];
        if names.iter().any(|n| n.is_empty() || n.len() > MAX_NAME) || self.hops > MAX_HOPS {
            return None;
        }
        let in_range = |ms: u64| (ms <= MAX_MS).then(|| Duration::from_millis(ms) + since_received);
        let processing = match (self.proc_us, self.n, self.proc_age_ms) {
            (Some(us), Some(samples), Some(age)) if us <= MAX_MS * 1000 && samples > 0 => {
                Some(ProcessingReport {
                    time: Duration::from_micros(us),
                    samples,
                    age: in_range(age)?,
                })
            }
            _ => None,
        };
        let verdict = match (
            self.verdict.as_deref().and_then(verdict_kind),
            self.verdict_age_ms,
        ) {
            (Some(kind), Some(age)) => Some(VerdictReport {
                kind,
                age: in_range(age)?,
            }),
            _ => None,
        };
        (processing.is_some() || verdict.is_some()).then(|| PodReport {
            service: ServiceKey::new(namespace, name),
            pod: self.pod,
            origin: self.by,
            hops: self.hops,
            processing,
            verdict,
        })
    }
}

/// The `pods` list of this round's replies: all news, then estimates from `cursor` on
/// (wrapping), within `budget` bytes of JSON. Returns it and the cursor to start from
/// next round.
pub fn encode(digest: &Digest, budget: usize, cursor: usize) -> (Vec<WirePod>, usize) {
    let mut pods = Vec::new();
    let mut used: usize = 2; // the brackets
    let mut fits = |pod: WirePod| {
        // Serialising strings and numbers cannot fail; the comma is counted.
        let size = serde_json::to_vec(&pod).map_or(usize::MAX, |v| v.len() + 1);
        if used.saturating_add(size) > budget {
            return false;
        }
        used += size;
        pods.push(pod);
        true
    };
    for report in &digest.news {
        if !fits(WirePod::from_report(report)) {
            return (pods, cursor);
        }
    }
    let count = digest.estimates.len();
    let mut taken = 0;
    while taken < count {
        let report = &digest.estimates[(cursor + taken) % count];
        if !fits(WirePod::from_report(report)) {
            break;
        }
        taken += 1;
    }
    let next = if count == 0 {
        0
    } else {
        (cursor + taken) % count
    };
    (pods, next)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn estimate(i: usize) -> PodReport {
        PodReport {
            service: ServiceKey::new("default", "api"),
            pod: format!("api-{i}"),
            origin: "edge-3".into(),
            hops: 0,
            processing: Some(ProcessingReport {
                time: Duration::from_micros(2140),
                samples: 64,
                age: Duration::from_millis(35),
            }),
            verdict: None,
        }
    }

    fn news() -> PodReport {
        PodReport {
            processing: None,
            verdict: Some(VerdictReport {
                kind: VerdictKind::Out(EvictionCause::Unanswered),
                age: Duration::from_millis(420),
            }),
            ..estimate(999)
        }
    }

    #[test]
    fn a_report_survives_the_wire() {
        for r in [estimate(1), news()] {
            let json = serde_json::to_string(&WirePod::from_report(&r)).unwrap();
            let back: WirePod = serde_json::from_str(&json).unwrap();
            assert_eq!(back.clone().into_report(Duration::ZERO), Some(r), "{json}");
        }
        let aged = WirePod::from_report(&news())
            .into_report(Duration::from_millis(30))
            .unwrap();
        assert_eq!(aged.verdict.unwrap().age, Duration::from_millis(450));
    }

    #[test]
    fn what_a_peer_sends_is_checked_before_it_is_believed() {
        let good = WirePod::from_report(&estimate(1));
        let bad = [
            WirePod {
                svc: "no-slash".into(),
                ..good.clone()
            },
            WirePod {
                pod: String::new(),
                ..good.clone()
            },
            WirePod {
                by: "x".repeat(300),
                ..good.clone()
            },
            WirePod {
                hops: MAX_HOPS + 1,
                ..good.clone()
            },
            WirePod {
                proc_age_ms: Some(MAX_MS + 1),
                ..good.clone()
            },
            WirePod {
                n: None,
                ..good.clone()
            },
            WirePod {
                n: Some(0),
                ..good.clone()
            },
            WirePod {
                proc_us: None,
                verdict: Some("gone".into()),
                verdict_age_ms: Some(1),
                ..good.clone()
            },
        ];
        for pod in bad {
            assert_eq!(pod.clone().into_report(Duration::ZERO), None, "{pod:?}");
        }
    }

    #[test]
    fn news_goes_first_and_estimates_rotate_within_the_budget() {
        let digest = Digest {
            news: vec![news()],
            estimates: (0..100).map(estimate).collect(),
        };
        let (first, cursor) = encode(&digest, DEFAULT_BUDGET, 0);
        let bytes = serde_json::to_vec(&first).unwrap().len();
        assert!(bytes <= DEFAULT_BUDGET, "{bytes}");
        assert_eq!(first[0].pod, "api-999");
        assert!(first.len() > 10 && first.len() < 100, "{}", first.len());
        assert_eq!(cursor, first.len() - 1);
        // Over enough rounds every estimate travels.
        let mut seen = std::collections::HashSet::new();
        let mut at = 0;
        for _ in 0..10 {
            let (pods, next) = encode(&digest, DEFAULT_BUDGET, at);
            seen.extend(pods.into_iter().map(|p| p.pod));
            at = next;
        }
        assert_eq!(seen.len(), 101);
        // A budget too small for anything sends nothing rather than too much.
        assert!(encode(&digest, 10, 0).0.is_empty());
    }
}
