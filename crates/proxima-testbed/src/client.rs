//! Load generators: the emulated devices that send requests to their node's proxy.
//!
//! A client is either a **closed loop** (`concurrency` workers, each sending its next
//! request when the previous one is answered, like `ab -c` or `hey -c`) or an **open
//! loop** (`rate` requests per second at even spacing, at most `concurrency`
//! outstanding). Each request names its service in `x-service`, and its response time
//! is what the client sees: from sending the request to reading the whole response.
//!
//! Requests are numbered across all clients by a [`Sequencer`], which is also how
//! events triggered "after N requests" are placed exactly: the request that would be
//! number N + 1 waits until the event has been applied, so every request belongs to
//! exactly one phase (the number of events applied when it was sent).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderValue, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::sync::{mpsc, watch, Semaphore};

use crate::scenario::ClientSpec;

/// One answered (or failed) request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RequestRecord {
    /// Index of the client in the scenario.
    pub client: u16,
    /// 1-based number over all clients, in sending order.
    pub seq: u64,
    /// Events applied when it was sent.
    pub phase: u16,
    /// When it was sent, from the start of the traffic.
    pub start: Duration,
    /// Time to the whole response, as the client saw it.
    pub latency: Duration,
    /// HTTP status; 0 when no response came (connection error, timeout).
    pub status: u16,
    /// No whole response within the client's `timeout`: the client gave up.
    pub timed_out: bool,
    /// The instance that answered (its `x-backend`), as an index into the run's
    /// instance list; `None` for error answers of the proxy itself.
    pub instance: Option<u16>,
    /// Whether some instance could have answered it within its service's SLO when it
    /// was sent, by the cluster's own numbers (see `Cluster::best_response`).
    pub reachable: bool,
}

/// Why a request failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ErrorKind {
    /// An answer other than 2xx (from the proxy or the instance).
    Status,
    /// No answer: the connection was refused or broke.
    Connection,
    /// No whole answer within the client's timeout.
    Timeout,
}

impl ErrorKind {
    /// The kind as written in the report and CSV files.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Status => "status",
            ErrorKind::Connection => "connection",
            ErrorKind::Timeout => "timeout",
        }
    }
}

impl RequestRecord {
    /// Whether a 2xx answer arrived within the client's timeout.
    pub fn succeeded(&self) -> bool {
        self.error().is_none()
    }

    /// `None` for a 2xx answer read in time.
    pub fn error(&self) -> Option<ErrorKind> {
        if self.timed_out {
            Some(ErrorKind::Timeout)
        } else if self.status == 0 {
            Some(ErrorKind::Connection)
        } else if (200..300).contains(&self.status) {
            None
        } else {
            Some(ErrorKind::Status)
        }
    }
}

/// Request numbering and count-triggered events (see the module docs).
#[derive(Debug)]
pub struct Sequencer {
    state: Mutex<SeqState>,
    /// Count thresholds with their event index, in order.
    thresholds: Vec<(u64, usize)>,
    due: mpsc::UnboundedSender<usize>,
    /// Number of events applied so far (the current phase).
    phase: watch::Sender<u16>,
    applied: Mutex<Vec<bool>>,
}

#[derive(Debug, Default)]
struct SeqState {
    issued: u64,
    next_threshold: usize,
}

impl Sequencer {
    /// `thresholds`: `(request count, event index)` of count-triggered events, in order;
    /// `events`: how many events there are in all. Due events are sent on the returned
    /// receiver; report them applied with [`Sequencer::applied`].
    pub fn new(
        thresholds: Vec<(u64, usize)>,
        events: usize,
    ) -> (Arc<Self>, mpsc::UnboundedReceiver<usize>) {
        let (due, receiver) = mpsc::unbounded_channel();
        let (phase, _) = watch::channel(0);
        let sequencer = Sequencer {
            state: Mutex::new(SeqState::default()),
            thresholds,
            due,
            phase,
            applied: Mutex::new(vec![false; events]),
        };
        (Arc::new(sequencer), receiver)
    }

    fn is_applied(&self, event: usize) -> bool {
        self.applied
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(event)
            .copied()
            .unwrap_or(true)
    }

    /// Mark `event` applied: later requests belong to the next phase.
    pub fn applied(&self, event: usize) {
        if let Some(flag) = self
            .applied
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(event)
        {
            *flag = true;
        }
        self.phase.send_modify(|p| *p += 1);
    }

    /// The current phase (events applied).
    pub fn phase(&self) -> u16 {
        *self.phase.borrow()
    }

    /// Requests numbered so far.
    pub fn issued(&self) -> u64 {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).issued
    }

    /// The number and phase of the next request, waiting while a count-triggered event
    /// that must come first is being applied.
    pub async fn next(&self) -> (u64, u16) {
        let mut changes = self.phase.subscribe();
        loop {
            {
                let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
                let pending = self
                    .thresholds
                    .get(state.next_threshold)
                    .filter(|(count, _)| state.issued >= *count)
                    .map(|(_, event)| *event);
                match pending {
                    Some(event) if self.is_applied(event) => {
                        state.next_threshold += 1;
                        continue;
                    }
                    Some(_) => {}
                    None => {
                        state.issued += 1;
                        // Read the phase under the lock, so numbering and phases agree.
                        return (state.issued, *self.phase.borrow());
                    }
                }
            }
            // Tell the driver (once per threshold is enough; duplicates are ignored
            // there) and wait for a change of phase.
            if let Some((_, event)) = self.thresholds.get(
                self.state
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .next_threshold,
            ) {
                let _ = self.due.send(*event);
            }
            if changes.changed().await.is_err() {
                // The sequencer is being dropped; keep numbering without events.
                let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
                state.issued += 1;
                return (state.issued, *self.phase.borrow());
            }
        }
    }
}

/// Totals for the progress line, updated by every client.
#[derive(Debug, Default)]
pub struct Live {
    /// Requests answered or failed so far.
    pub done: AtomicU64,
    /// Of those, the failed ones.
    pub errors: AtomicU64,
    /// Of those, the ones that met their service's SLO.
    pub slo_met: AtomicU64,
    /// Sum of their response times, µs (for the mean).
    pub latency_us: AtomicU64,
}

/// Everything a client needs while it runs.
pub struct ClientRun {
    /// Index of the client in [`crate::Scenario::clients`].
    pub index: u16,
    /// The client as the scenario describes it.
    pub spec: ClientSpec,
    /// `name.namespace` of its service.
    pub service: String,
    /// Its service's latency SLO, to count `slo_met`.
    pub slo: Duration,
    /// Where to send (the client's link to its node's proxy).
    pub target: SocketAddr,
    /// Numbers the requests over all clients and fires count-triggered events.
    pub sequencer: Arc<Sequencer>,
    /// The totals for the progress line.
    pub live: Arc<Live>,
    /// Instance name to index.
    pub instances: Arc<HashMap<String, u16>>,
    /// When the traffic started: records count time from here.
    pub started: Instant,
    /// Becomes `true` when the run stops.
    pub stop: watch::Receiver<bool>,
    /// The shortest response time any router could give this client's next request now
    /// (`None`: none can answer); see `Cluster::best_response`.
    pub best_response: Arc<dyn Fn() -> Option<Duration> + Send + Sync>,
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

impl ClientRun {
    /// Send until the request count or the duration is reached (or `stop`), and return
    /// every record.
    pub async fn run(self) -> Vec<RequestRecord> {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client: HttpClient = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(usize::MAX)
            .build(connector);
        let this = Arc::new(self);
        let records = Arc::new(Mutex::new(Vec::new()));
        let sent = Arc::new(AtomicU64::new(0));
        match this.spec.rate {
            None => {
                let mut workers = Vec::new();
                for _ in 0..this.spec.concurrency {
                    let (this, client, records, sent) =
                        (this.clone(), client.clone(), records.clone(), sent.clone());
                    workers.push(tokio::spawn(async move {
                        while let Some((seq, phase)) = this.ticket(&sent).await {
                            let record = this.send(&client, seq, phase).await;
                            records
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .push(record);
                        }
                    }));
                }
                for w in workers {
                    let _ = w.await;
                }
            }
            Some(rate) => {
                let slots = Arc::new(Semaphore::new(this.spec.concurrency));
                let spacing = Duration::from_secs_f64(1.0 / rate);
                let mut tick = tokio::time::interval(spacing);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                let mut tasks = Vec::new();
                loop {
                    tick.tick().await;
                    let Ok(permit) = slots.clone().acquire_owned().await else {
                        break;
                    };
                    let Some((seq, phase)) = this.ticket(&sent).await else {
                        break;
                    };
                    let (this, client, records) = (this.clone(), client.clone(), records.clone());
                    tasks.push(tokio::spawn(async move {
                        let record = this.send(&client, seq, phase).await;
                        records
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push(record);
                        drop(permit);
                    }));
                }
                for t in tasks {
                    let _ = t.await;
                }
            }
        }
        let mut records = std::mem::take(&mut *records.lock().unwrap_or_else(|e| e.into_inner()));
        records.sort_by_key(|r| r.seq);
        records
    }

    /// The next request's number and phase, or `None` when this client is done.
    async fn ticket(&self, sent: &AtomicU64) -> Option<(u64, u16)> {
        if *self.stop.borrow() {
            return None;
        }
        if let Some(limit) = self.spec.duration {
            if self.started.elapsed() >= limit {
                return None;
            }
        }
        let n = sent.fetch_add(1, Ordering::Relaxed);
        if self.spec.requests.is_some_and(|limit| n >= limit) {
            return None;
        }
        Some(self.sequencer.next().await)
    }

    async fn send(&self, client: &HttpClient, seq: u64, phase: u16) -> RequestRecord {
        let body = self.spec.body.clone().map(Bytes::from).unwrap_or_default();
        let uri = format!("http://{}{}", self.target, self.spec.path);
        let mut request = Request::new(Full::new(body));
        *request.method_mut() = self.spec.method.clone();
        *request.uri_mut() = uri.parse().unwrap_or_default();
        if let Ok(service) = HeaderValue::from_str(&self.service) {
            request.headers_mut().insert("x-service", service);
        }
        request
            .headers_mut()
            .insert("content-type", HeaderValue::from_static("application/json"));
        let reachable = (self.best_response)().is_some_and(|best| best <= self.slo);
        let start = self.started.elapsed();
        let began = Instant::now();
        let exchange = async {
            let response = client.request(request).await.ok()?;
            let status = response.status().as_u16();
            let backend = response
                .headers()
                .get("x-backend")
                .and_then(|v| v.to_str().ok())
                .and_then(|name| self.instances.get(name).copied());
            response.into_body().collect().await.ok()?;
            Some((status, backend))
        };
        let (timed_out, (status, instance)) =
            match tokio::time::timeout(self.spec.timeout, exchange).await {
                Ok(answer) => (false, answer.unwrap_or((0, None))),
                Err(_) => (true, (0, None)),
            };
        let latency = began.elapsed();
        let record = RequestRecord {
            client: self.index,
            seq,
            phase,
            start,
            latency,
            status,
            timed_out,
            instance,
            reachable,
        };
        self.live.done.fetch_add(1, Ordering::Relaxed);
        self.live.latency_us.fetch_add(
            u64::try_from(latency.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        if !record.succeeded() {
            self.live.errors.fetch_add(1, Ordering::Relaxed);
        } else if latency <= self.slo {
            self.live.slo_met.fetch_add(1, Ordering::Relaxed);
        }
        record
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn requests_wait_for_a_count_event_and_change_phase() {
        let (seq, mut due) = Sequencer::new(vec![(2, 0)], 1);
        assert_eq!(seq.next().await, (1, 0));
        assert_eq!(seq.next().await, (2, 0));
        let waiting = {
            let seq = seq.clone();
            tokio::spawn(async move { seq.next().await })
        };
        assert_eq!(due.recv().await, Some(0));
        assert!(!waiting.is_finished());
        seq.applied(0);
        assert_eq!(waiting.await.unwrap(), (3, 1));
        assert_eq!(seq.next().await, (4, 1));
        assert_eq!(seq.issued(), 4);
    }

    #[tokio::test]
    async fn an_event_applied_early_does_not_block() {
        let (seq, _due) = Sequencer::new(vec![(1, 1)], 2);
        seq.applied(0); // a time event
        seq.applied(1);
        assert_eq!(seq.next().await, (1, 2));
        assert_eq!(seq.next().await, (2, 2));
    }
}
