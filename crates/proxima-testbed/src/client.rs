//! Load generators: the emulated devices that send requests to their node's proxy.
//!
//! A client is either a **closed loop** (`concurrency` workers, each sending its next
//! request when the previous one is answered, like `ab -c` or `hey -c`) or an **open
//! loop** (`rate` requests per second at even spacing, at most `concurrency`
//! outstanding). Each request names its service in `x-service`, and its response time
//! is what the client sees: from sending the request to reading the whole response.
//!
//! What a request is depends on the client's `protocol`: an HTTP/1.1 request on a
//! keep-alive pool, a unary gRPC call on the client's one HTTP/2 connection
//! (`client/grpc.rs`), or a message on the worker's WebSocket (`client/websocket.rs`). Every kind is
//! numbered, timed and recorded the same way, so the report compares them directly.
//! Closed and open loops share one shape: `concurrency` workers take numbered tickets,
//! from the sequencer directly or, in an open loop, from a ticker at the client's rate
//! (a WebSocket worker keeps its socket from ticket to ticket).
//!
//! Requests are numbered across all clients by a [`Sequencer`], which is also how
//! events triggered "after N requests" are placed exactly: the request that would be
//! number N + 1 waits until the event has been applied, so every request belongs to
//! exactly one phase (the number of events applied when it was sent).

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderValue, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::{HttpConnector, HttpInfo};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};

use crate::scenario::{ClientProtocol, ClientSpec};

mod grpc;
mod websocket;

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
    /// HTTP status; 0 when no response came (connection error, timeout). A WebSocket
    /// message's is its socket's `101`.
    pub status: u16,
    /// A gRPC call's `grpc-status` (from its trailers, or the headers of a
    /// Trailers-Only answer; 2, UNKNOWN, when a `200` carried none); `None` for other
    /// protocols and for calls without an answer.
    pub grpc_status: Option<u8>,
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
    /// A gRPC call answered with a `grpc-status` other than 0 (OK).
    Grpc,
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
            ErrorKind::Grpc => "grpc-status",
            ErrorKind::Connection => "connection",
            ErrorKind::Timeout => "timeout",
        }
    }
}

impl RequestRecord {
    /// Whether a 2xx answer arrived within the client's timeout (for a gRPC call,
    /// with `grpc-status: 0`; for a WebSocket message, its echo on a `101` socket).
    pub fn succeeded(&self) -> bool {
        self.error().is_none()
    }

    /// `None` for a successful answer read in time (see [`RequestRecord::succeeded`]).
    pub fn error(&self) -> Option<ErrorKind> {
        if self.timed_out {
            Some(ErrorKind::Timeout)
        } else if self.status == 0 {
            Some(ErrorKind::Connection)
        } else if self.grpc_status.is_some_and(|code| code != 0) {
            Some(ErrorKind::Grpc)
        } else if (200..300).contains(&self.status) || self.status == 101 {
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

/// What a client's run gave.
#[derive(Debug, Default)]
pub struct ClientOutput {
    /// Every request, in sending order.
    pub records: Vec<RequestRecord>,
    /// Connections to its proxy that carried an answer (told apart by their local
    /// address): one for a `grpc` client, one per worker for `websocket` (more when
    /// sockets broke), the keep-alive pool for `http`.
    pub connections: usize,
}

/// How one exchange ended.
#[derive(Clone, Copy, Debug)]
enum Outcome {
    /// An answer (of any status), read whole.
    Answer(Answer),
    /// No answer: refused, broken, or not the protocol's.
    Broken,
    /// No whole answer within the client's `timeout`.
    TimedOut,
}

/// An answer, and the client side of the connection that carried it.
#[derive(Clone, Copy, Debug)]
struct Answer {
    status: u16,
    grpc_status: Option<u8>,
    instance: Option<u16>,
    local: Option<SocketAddr>,
}

/// What a worker sends on: the client's shared HTTP client, or its own WebSocket.
enum Worker {
    Http(HttpClient),
    Grpc(HttpClient),
    WebSocket(Option<websocket::Socket>),
}

/// Where workers take their tickets: straight from the sequencer (closed loop), or
/// from a ticker at the client's rate (open loop) that holds one of `concurrency`
/// slots per ticket until its request is answered.
struct Tickets {
    sent: AtomicU64,
    paced: Option<tokio::sync::Mutex<mpsc::Receiver<Ticket>>>,
}

struct Ticket {
    seq: u64,
    phase: u16,
    _slot: Option<OwnedSemaphorePermit>,
}

/// What the workers collect.
#[derive(Default)]
struct Collected {
    records: Mutex<Vec<RequestRecord>>,
    connections: Mutex<HashSet<SocketAddr>>,
}

impl ClientRun {
    /// Send until the request count or the duration is reached (or `stop`), and return
    /// every record.
    pub async fn run(self) -> ClientOutput {
        let this = Arc::new(self);
        let (tickets, ticker) = this.clone().tickets();
        let tickets = Arc::new(tickets);
        let collected = Arc::new(Collected::default());
        let shared = this.http_client();
        let workers: Vec<_> = (0..this.spec.concurrency)
            .map(|_| {
                let worker = match (this.spec.protocol, &shared) {
                    (ClientProtocol::Grpc, Some(client)) => Worker::Grpc(client.clone()),
                    (_, Some(client)) => Worker::Http(client.clone()),
                    (_, None) => Worker::WebSocket(None),
                };
                let (this, tickets, collected) = (this.clone(), tickets.clone(), collected.clone());
                tokio::spawn(async move { this.work(worker, &tickets, &collected).await })
            })
            .collect();
        for w in workers {
            let _ = w.await;
        }
        if let Some(ticker) = ticker {
            ticker.abort();
        }
        collected.output()
    }

    /// The HTTP client the workers share: a keep-alive pool, or for gRPC one HTTP/2
    /// connection (prior knowledge) that every call shares; `None` for WebSockets.
    fn http_client(&self) -> Option<HttpClient> {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let mut builder = Client::builder(TokioExecutor::new());
        match self.spec.protocol {
            ClientProtocol::Http => builder.pool_max_idle_per_host(usize::MAX),
            ClientProtocol::Grpc => builder.http2_only(true),
            ClientProtocol::WebSocket => return None,
        };
        Some(builder.build(connector))
    }

    /// The workers' tickets, and the open loop's ticker task.
    fn tickets(self: Arc<Self>) -> (Tickets, Option<tokio::task::JoinHandle<()>>) {
        let Some(rate) = self.spec.rate else {
            let tickets = Tickets {
                sent: AtomicU64::new(0),
                paced: None,
            };
            return (tickets, None);
        };
        let (sender, receiver) = mpsc::channel(self.spec.concurrency.max(1));
        let ticker = tokio::spawn(async move {
            let slots = Arc::new(Semaphore::new(self.spec.concurrency));
            let sent = AtomicU64::new(0);
            let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            loop {
                tick.tick().await;
                let Ok(slot) = slots.clone().acquire_owned().await else {
                    break;
                };
                let Some((seq, phase)) = self.ticket(&sent).await else {
                    break;
                };
                let ticket = Ticket {
                    seq,
                    phase,
                    _slot: Some(slot),
                };
                if sender.send(ticket).await.is_err() {
                    break;
                }
            }
        });
        let tickets = Tickets {
            sent: AtomicU64::new(0),
            paced: Some(tokio::sync::Mutex::new(receiver)),
        };
        (tickets, Some(ticker))
    }

    /// One worker: a request per ticket, until there are none.
    async fn work(&self, mut worker: Worker, tickets: &Tickets, collected: &Collected) {
        loop {
            let ticket = match &tickets.paced {
                Some(receiver) => receiver.lock().await.recv().await,
                None => self.ticket(&tickets.sent).await.map(|(seq, phase)| Ticket {
                    seq,
                    phase,
                    _slot: None,
                }),
            };
            let Some(ticket) = ticket else {
                return;
            };
            let (record, local) = self.send(&mut worker, ticket.seq, ticket.phase).await;
            collected.add(record, local);
        }
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

    /// One request (for WebSockets, one message; the socket is opened first when the
    /// worker has none, and a failed handshake is the record).
    async fn send(
        &self,
        worker: &mut Worker,
        seq: u64,
        phase: u16,
    ) -> (RequestRecord, Option<SocketAddr>) {
        let reachable = (self.best_response)().is_some_and(|best| best <= self.slo);
        let mut start = self.started.elapsed();
        let mut began = Instant::now();
        let outcome = match worker.prepare(self).await {
            Err(failed) => failed,
            Ok(()) => {
                (start, began) = (self.started.elapsed(), Instant::now());
                worker.exchange(self).await
            }
        };
        let latency = began.elapsed();
        let (status, grpc_status, instance, local) = match outcome {
            Outcome::Answer(a) => (a.status, a.grpc_status, a.instance, a.local),
            Outcome::Broken | Outcome::TimedOut => (0, None, None, None),
        };
        let record = RequestRecord {
            client: self.index,
            seq,
            phase,
            start,
            latency,
            status,
            grpc_status,
            timed_out: matches!(outcome, Outcome::TimedOut),
            instance,
            reachable,
        };
        self.count(&record);
        (record, local)
    }

    /// Add `record` to the progress line's totals.
    fn count(&self, record: &RequestRecord) {
        self.live.done.fetch_add(1, Ordering::Relaxed);
        self.live.latency_us.fetch_add(
            u64::try_from(record.latency.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        if !record.succeeded() {
            self.live.errors.fetch_add(1, Ordering::Relaxed);
        } else if record.latency <= self.slo {
            self.live.slo_met.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The index of the instance an answer names in `x-backend`.
    fn instance_of(&self, headers: &http::HeaderMap) -> Option<u16> {
        headers
            .get("x-backend")
            .and_then(|v| v.to_str().ok())
            .and_then(|name| self.instances.get(name).copied())
    }

    /// `x-service` and the request's URI on the client's link.
    fn request(&self, method: http::Method, body: Bytes) -> Request<Full<Bytes>> {
        let uri = format!("http://{}{}", self.target, self.spec.path);
        let mut request = Request::new(Full::new(body));
        *request.method_mut() = method;
        *request.uri_mut() = uri.parse().unwrap_or_default();
        if let Ok(service) = HeaderValue::from_str(&self.service) {
            request.headers_mut().insert("x-service", service);
        }
        request
    }

    /// An HTTP request and its whole answer.
    async fn http_exchange(&self, client: &HttpClient) -> Option<Answer> {
        let body = self.spec.body.clone().map(Bytes::from).unwrap_or_default();
        let mut request = self.request(self.spec.method.clone(), body);
        request
            .headers_mut()
            .insert("content-type", HeaderValue::from_static("application/json"));
        let response = client.request(request).await.ok()?;
        let answer = Answer {
            status: response.status().as_u16(),
            grpc_status: None,
            instance: self.instance_of(response.headers()),
            local: local_addr(&response),
        };
        response.into_body().collect().await.ok()?;
        Some(answer)
    }
}

/// The client side of the connection `response` came on.
fn local_addr<B>(response: &http::Response<B>) -> Option<SocketAddr> {
    response
        .extensions()
        .get::<HttpInfo>()
        .map(|info| info.local_addr())
}

/// `exchange` within the client's `timeout`.
async fn timed(timeout: Duration, exchange: impl Future<Output = Option<Answer>>) -> Outcome {
    match tokio::time::timeout(timeout, exchange).await {
        Ok(Some(answer)) => Outcome::Answer(answer),
        Ok(None) => Outcome::Broken,
        Err(_) => Outcome::TimedOut,
    }
}

impl Worker {
    /// Open the worker's WebSocket if it has none (within the client's timeout);
    /// `Err` is the record of a handshake that failed.
    async fn prepare(&mut self, run: &ClientRun) -> Result<(), Outcome> {
        let Worker::WebSocket(socket @ None) = self else {
            return Ok(());
        };
        match tokio::time::timeout(run.spec.timeout, websocket::open(run)).await {
            Ok(Some(opened)) => {
                *socket = Some(opened);
                Ok(())
            }
            Ok(None) => Err(Outcome::Broken),
            Err(_) => Err(Outcome::TimedOut),
        }
    }

    /// One exchange within the client's timeout. A WebSocket that failed one is
    /// dropped (a late echo must not answer the next message), and reopened next time.
    async fn exchange(&mut self, run: &ClientRun) -> Outcome {
        let timeout = run.spec.timeout;
        match self {
            Worker::Http(client) => timed(timeout, run.http_exchange(client)).await,
            Worker::Grpc(client) => timed(timeout, grpc::call(run, client)).await,
            Worker::WebSocket(slot) => {
                let Some(socket) = slot.as_mut() else {
                    return Outcome::Broken;
                };
                let outcome = timed(timeout, websocket::round_trip(run, socket)).await;
                if !matches!(outcome, Outcome::Answer(_)) {
                    *slot = None;
                }
                outcome
            }
        }
    }
}

impl Collected {
    fn add(&self, record: RequestRecord, local: Option<SocketAddr>) {
        self.records
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(record);
        if let Some(local) = local {
            self.connections
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(local);
        }
    }

    fn output(&self) -> ClientOutput {
        let mut records =
            std::mem::take(&mut *self.records.lock().unwrap_or_else(|e| e.into_inner()));
        records.sort_by_key(|r| r.seq);
        let connections = self
            .connections
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len();
        ClientOutput {
            records,
            connections,
        }
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
