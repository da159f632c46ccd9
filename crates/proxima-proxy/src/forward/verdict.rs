//! What the end of one attempt means: pure rules, tested alone, that the retry loop of
//! `forward.rs` follows.
//!
//! | the attempt ended             | the pod's record          | then                                    |
//! |-------------------------------|---------------------------|-----------------------------------------|
//! | response headers              | `Answered` / `GrpcAnswered` (a failure if the status or code is in the service's set) | the answer goes to the client |
//! | nothing reached the pod       | `ConnectFailed`           | another pod (any request: nothing was sent), else `502` |
//! | failed after sending, request kept (`forward::replayable`: idempotent by method or key, no body or one read whole) | `Failed` | another pod, else `502` |
//! | failed after sending, not kept | `Failed`                 | `502` now: the pod may have acted on it |
//! | deadline passed               | `Failed` if it was sent   | `504` now                               |
//! | the client's body broke       | nothing                   | `400` now                               |
//!
//! "Another pod" still needs a retry left and the retry budget's consent; the loop asks
//! those (the budget is state), and answers with the failure at hand when refused.

use std::time::Duration;

use http::StatusCode;
use proxima_core::{Outcome, ServiceSettings};

use crate::metrics::ErrorKind;

/// How an attempt ended, as much of it as the rules need.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Ended {
    /// Response headers arrived after `latency`; `grpc`: the call's status when the
    /// headers carry it (a Trailers-Only answer).
    Answered {
        latency: Duration,
        status: u16,
        grpc: Option<u8>,
    },
    /// Nothing reached the pod; `error` says why.
    NotSent { error: String },
    /// Sent (at least in part) and no answer; `kept`: the request came back for another
    /// pod.
    Failed {
        kind: ErrorKind,
        error: String,
        kept: bool,
    },
    /// The deadline passed first; `sent`: the request had begun to be written.
    TimedOut { sent: bool },
    /// The client's own request body broke while it was sent.
    ClientBodyFailed,
}

/// Where the attempt was made, for the answer's words.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Place<'a> {
    pub(crate) endpoint: &'a str,
    pub(crate) addr: std::net::SocketAddr,
    /// The time the request had: the service's `timeout`, or the call's `grpc-timeout`.
    pub(crate) limit: Duration,
    /// Whether `limit` is the call's own deadline.
    pub(crate) call_deadline: bool,
}

/// The answer a client gets when no further attempt is made, and the log line that says
/// why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub(crate) status: StatusCode,
    pub(crate) error: &'static str,
    pub(crate) detail: String,
    pub(crate) log: &'static str,
}

/// What follows an attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// The pod's answer goes to the client; `failed`: its status or gRPC code is in the
    /// service's failure set (it misses the SLO however fast it came).
    Deliver { failed: bool },
    /// Another pod may take the request; if none may, this answer.
    Retry(Refusal),
    /// This answer, now.
    GiveUp(Refusal),
    /// `400`: the client's body broke.
    ClientFault,
}

/// An attempt's end, judged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// What the router learns about the pod, if anything.
    pub(crate) outcome: Option<Outcome>,
    /// The error counted for the endpoint, if any.
    pub(crate) error: Option<ErrorKind>,
    pub(crate) next: Next,
}

/// Judge how an attempt at `place` ended, under the service's `settings` (see the
/// module docs).
pub(crate) fn judge(ended: &Ended, place: Place<'_>, settings: &ServiceSettings) -> Verdict {
    let Place { endpoint, addr, .. } = place;
    match ended {
        &Ended::Answered {
            latency,
            status,
            grpc,
        } => {
            let (outcome, failed) = match grpc {
                Some(code) => (
                    Outcome::GrpcAnswered { latency, code },
                    settings.grpc_failure_codes.contains(code),
                ),
                None => (
                    Outcome::Answered { latency, status },
                    settings.failure_status.contains(status),
                ),
            };
            Verdict {
                outcome: Some(outcome),
                error: None,
                next: Next::Deliver { failed },
            }
        }
        Ended::NotSent { error } => Verdict {
            outcome: Some(Outcome::ConnectFailed),
            error: Some(ErrorKind::Connect),
            next: Next::Retry(Refusal {
                status: StatusCode::BAD_GATEWAY,
                error: "upstream unavailable",
                detail: format!("endpoint {endpoint} ({addr}): {error}"),
                log: "could not reach endpoint",
            }),
        },
        &Ended::Failed {
            kind,
            ref error,
            kept,
        } => {
            let refusal = Refusal {
                status: StatusCode::BAD_GATEWAY,
                error: "upstream error",
                detail: format!(
                    "endpoint {endpoint} ({addr}) failed after the request was sent: {error}"
                ),
                log: "endpoint failed the request",
            };
            Verdict {
                outcome: Some(Outcome::Failed),
                error: Some(kind),
                next: match kept {
                    true => Next::Retry(refusal),
                    false => Next::GiveUp(refusal),
                },
            }
        }
        &Ended::TimedOut { sent } => Verdict {
            outcome: sent.then_some(Outcome::Failed),
            error: Some(ErrorKind::Timeout),
            next: Next::GiveUp(Refusal {
                status: StatusCode::GATEWAY_TIMEOUT,
                error: "upstream timeout",
                detail: format!(
                    "no response headers within {:?}{} (last endpoint tried: {endpoint})",
                    place.limit,
                    if place.call_deadline {
                        " (the call's grpc-timeout)"
                    } else {
                        ""
                    },
                ),
                log: "no response headers before the request timeout",
            }),
        },
        Ended::ClientBodyFailed => Verdict {
            outcome: None,
            error: None,
            next: Next::ClientFault,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place() -> Place<'static> {
        Place {
            endpoint: "pod-a",
            addr: "10.0.0.7:8080".parse().unwrap(),
            limit: Duration::from_secs(2),
            call_deadline: false,
        }
    }

    fn settings() -> ServiceSettings {
        ServiceSettings::default()
    }

    #[test]
    fn an_answer_is_delivered_and_a_failure_status_or_code_marks_it_failed() {
        let latency = Duration::from_millis(12);
        let answered = |status, grpc| Ended::Answered {
            latency,
            status,
            grpc,
        };
        let verdict = judge(&answered(200, None), place(), &settings());
        assert_eq!(
            verdict.outcome,
            Some(Outcome::Answered {
                latency,
                status: 200
            })
        );
        assert_eq!(verdict.next, Next::Deliver { failed: false });
        assert_eq!(verdict.error, None);
        // 5xx are failures by default, 4xx are the client's.
        let failed = |ended| judge(&ended, place(), &settings()).next;
        assert_eq!(failed(answered(503, None)), Next::Deliver { failed: true });
        assert_eq!(failed(answered(404, None)), Next::Deliver { failed: false });
        // A gRPC call is judged by its code, not its (always 200) status.
        assert_eq!(
            failed(answered(200, Some(14))),
            Next::Deliver { failed: true }
        );
        assert_eq!(
            failed(answered(200, Some(5))),
            Next::Deliver { failed: false }
        );
        assert_eq!(
            judge(&answered(200, Some(14)), place(), &settings()).outcome,
            Some(Outcome::GrpcAnswered { latency, code: 14 })
        );
    }

    #[test]
    fn what_never_reached_the_pod_goes_to_another_whatever_the_method() {
        let verdict = judge(
            &Ended::NotSent {
                error: "connection refused".into(),
            },
            place(),
            &settings(),
        );
        assert_eq!(verdict.outcome, Some(Outcome::ConnectFailed));
        assert_eq!(verdict.error, Some(ErrorKind::Connect));
        let Next::Retry(refusal) = verdict.next else {
            panic!("{:?}", verdict.next)
        };
        assert_eq!(refusal.status, StatusCode::BAD_GATEWAY);
        assert_eq!(
            refusal.detail,
            "endpoint pod-a (10.0.0.7:8080): connection refused"
        );
    }

    #[test]
    fn a_sent_request_goes_to_another_pod_only_if_it_was_kept() {
        let failed = |kept| Ended::Failed {
            kind: ErrorKind::Reset,
            error: "reset".into(),
            kept,
        };
        let kept = judge(&failed(true), place(), &settings());
        let not_kept = judge(&failed(false), place(), &settings());
        for verdict in [&kept, &not_kept] {
            assert_eq!(verdict.outcome, Some(Outcome::Failed));
            assert_eq!(verdict.error, Some(ErrorKind::Reset));
        }
        let (Next::Retry(a), Next::GiveUp(b)) = (kept.next, not_kept.next) else {
            panic!("kept: retry; not kept: give up")
        };
        assert_eq!(a, b);
        assert_eq!(a.status, StatusCode::BAD_GATEWAY);
        assert!(a
            .detail
            .contains("failed after the request was sent: reset"));
    }

    #[test]
    fn a_timeout_is_answered_at_once_and_held_against_the_pod_only_if_sent() {
        for sent in [false, true] {
            let verdict = judge(&Ended::TimedOut { sent }, place(), &settings());
            assert_eq!(verdict.outcome, sent.then_some(Outcome::Failed));
            assert_eq!(verdict.error, Some(ErrorKind::Timeout));
            let Next::GiveUp(refusal) = verdict.next else {
                panic!("{:?}", verdict.next)
            };
            assert_eq!(refusal.status, StatusCode::GATEWAY_TIMEOUT);
            assert_eq!(
                refusal.detail,
                "no response headers within 2s (last endpoint tried: pod-a)"
            );
        }
        let call = Place {
            call_deadline: true,
            limit: Duration::from_millis(200),
            ..place()
        };
        let Next::GiveUp(refusal) = judge(&Ended::TimedOut { sent: true }, call, &settings()).next
        else {
            panic!("a timeout gives up")
        };
        assert!(refusal.detail.contains("200ms (the call's grpc-timeout)"));
    }

    #[test]
    fn a_broken_client_body_is_the_clients_fault_not_the_pods() {
        let verdict = judge(&Ended::ClientBodyFailed, place(), &settings());
        assert_eq!(
            verdict,
            Verdict {
                outcome: None,
                error: None,
                next: Next::ClientFault
            }
        );
    }
}
