//! The listening side: connections from clients, HTTP/1.1 and HTTP/2 (prior knowledge,
//! `h2c`) on the same port, and graceful shutdown.
//!
//! Each connection is served by the proxy's own HTTP/1.1 loop (`http1/serve.rs`) until a
//! request it leaves to hyper arrives, then by hyper's auto server, both calling the
//! connection's service (`conn_service.rs`): admission, the target service of every
//! request (reusing the previous key while the connection keeps naming the same
//! service), then [`Proxy::forward`](crate::Proxy).
//!
//! An HTTP/1.1 connection that idles for `conn::PARK_AFTER` with nothing of a next
//! request read parks: its task ends, and the worker's [`Lot`] keeps only its socket
//! and a few fields until the socket is readable again (`client/park.rs`), so that thousands of
//! idle devices cost a few hundred bytes each.
//!
//! Shutdown drains in two steps, within `shutdown_grace` in all:
//! 1. **Drain, still listening.** Every open connection is asked to finish (HTTP/1.1
//!    closes after the current response, HTTP/2 sends GOAWAY, an idle one closes now).
//!    Parked connections close at once. The listener stays open meanwhile: a new
//!    connection gets one answer, with `connection: close`. On a Kubernetes node the proxy's port is a hostPort, which
//!    the next proxy pod can take only once this process is gone, so every moment the
//!    port refuses connections is a moment this node's clients are cut off; refusing
//!    them while slow requests finish would add their time to that gap.
//! 2. **Close.** Once the connections that were open at shutdown are gone (or half the
//!    grace period is over, so that late requests have the other half to finish), the
//!    listener closes: new connections are refused, idle ones close, the rest finish.
//!    Whatever still runs when `shutdown_grace` is over is cut off.
//!
//! Overload is met at two levels: connections beyond `max_client_connections` are
//! closed as soon as they are accepted, and requests beyond `max_concurrent_requests` in
//! flight (on any connection, HTTP/2 streams included) are answered `503` at once with a
//! JSON body and `retry-after`, counted in `proxima_requests_shed_total` (see `conn_service.rs`).
//! Neither queues: a flood degrades into fast refusals instead of growing queues and
//! latency for everyone.

use std::cell::RefCell;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use http::Request;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

use crate::client::balance::{Accepted, Member, Placed, Served};
use crate::client::conn::{ConnActivity, ConnTimeouts, RateLimited, Verdict, Watched, PARK_AFTER};
use crate::client::conn_service::ConnService;
use crate::client::gate::Gate;
use crate::client::park::{Client, Lot, Open, Parked, Woken};
use crate::forward::request_body::RequestBody;
use crate::forward::target::TargetCache;
use crate::http1::serve;
use crate::metrics::CloseReason;
use crate::{Proxy, ProxyConfig};

/// Pause after an accept error (e.g. out of file descriptors) before accepting again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// At most one log line per this time about failing accepts or shed connections.
const LOG_EVERY: Duration = Duration::from_secs(5);
/// After an idle connection was asked to close (HTTP/2 GOAWAY), how long the client has
/// to let go before the socket is dropped.
const CLOSE_GRACE: Duration = Duration::from_secs(5);
/// hyper's default HTTP/1 read buffer limit (8 KiB + 100 × 4 KiB).
const HYPER_DEFAULT_MAX_BUF: usize = 8192 + 4096 * 100;

// hyper answers 431 or 414 itself (without our JSON body) when a request head outgrows
// its read buffer or header array; both are kept well above the proxy's own limits, so
// that the proxy's checks, with their JSON answers, are what clients normally meet. The
// native loop hands such heads to hyper at the same sizes.

/// hyper's HTTP/1 read buffer, and the longest head the native loop reads.
fn hyper_buffer(config: &ProxyConfig) -> usize {
    config
        .max_header_bytes
        .saturating_add(config.max_uri_bytes)
        .saturating_mul(4)
        .max(HYPER_DEFAULT_MAX_BUF)
}

/// Most header lines hyper parses whatever the configuration: hyper reserves a
/// `HeaderMap` for every line it parsed, and a map holds at most 24576 entries (its
/// 32768 slots, filled to three quarters); one more would panic in hyper. Beyond this
/// hyper answers 431, as for any head over its limit.
const MAX_PARSED_HEADERS: usize = 24_000;

/// Header lines hyper parses at most, and the native loop too.
fn hyper_max_headers(config: &ProxyConfig) -> usize {
    config
        .max_request_headers
        .saturating_mul(4)
        .clamp(100, MAX_PARSED_HEADERS)
}

fn builder(config: &ProxyConfig) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    let buffer = hyper_buffer(config);
    builder
        .http1()
        // The header timeout is the connection driver's (`client/conn.rs`): hyper's would arm a
        // timer for every request.
        .timer(TokioTimer::new())
        .header_read_timeout(None)
        .max_headers(hyper_max_headers(config))
        .max_buf_size(buffer);
    builder
        .http2()
        // HTTP/2 clients may open WebSockets with extended CONNECT (RFC 8441).
        .enable_connect_protocol()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(buffer).unwrap_or(u32::MAX));
    builder
}

/// Accept connections until `shutdown` resolves; then drain and close as the module
/// docs say, within `shutdown_grace`.
///
/// At most `max_client_connections` are open at once (counted across every listener
/// and worker serving this proxy): a connection beyond that is
/// accepted and closed at once (shed), so the proxy never holds more file descriptors
/// than its budget and discovery, the admin server and the pods keep theirs. Accept
/// errors (such as running out of file descriptors anyway) back off briefly and are
/// logged at most once per few seconds, with a count.
pub async fn serve(
    proxy: Arc<Proxy>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    serve_with(proxy, listener, shutdown, None).await
}

/// [`serve`], as one of several workers sharing `listener` when `balance` is this
/// worker's seat: connections are then spread evenly over the workers (`balance.rs`).
pub(crate) async fn serve_with(
    proxy: Arc<Proxy>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
    mut balance: Option<Member>,
) -> std::io::Result<()> {
    let servers = Arc::new(Servers {
        hyper: builder(&proxy.config),
        native: serve::Limits {
            max_head: hyper_buffer(&proxy.config),
            max_headers: hyper_max_headers(&proxy.config),
        },
        timeouts: ConnTimeouts {
            header: proxy.config.client_header_timeout,
            idle: proxy.config.client_idle_timeout,
            body: proxy.config.body_idle_timeout,
            park: Some(PARK_AFTER),
            rest: None,
        },
    });
    let mut connections = Cohorts::new();
    let mut acceptor = Acceptor::new(&proxy, listener)?;
    let mut lot = Lot::new(proxy.metrics.parked_connections().clone());
    let mut sweep = tokio::time::interval(sweep_every(&servers.timeouts));
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let serve = |connections: &mut Cohorts, client: Client| {
        let (set, finish, draining) = connections.joining();
        set.spawn(drive(
            proxy.clone(),
            servers.clone(),
            client,
            finish,
            draining,
        ));
    };
    let serve_one = |connections: &mut Cohorts, accepted: Accepted, served: Option<Served>| {
        let gauge = proxy.metrics.client_connections().clone();
        let client = Client {
            stream: accepted.stream,
            peer: accepted.peer,
            open: Open::new(accepted.permit, served, gauge),
        };
        serve(connections, client);
    };
    let grace = proxy.config.shutdown_grace;
    tokio::pin!(shutdown);
    // Set at shutdown: when the listener closes at the latest (step 2).
    let mut close_by: Option<Instant> = None;
    loop {
        let draining = close_by.is_some();
        tokio::select! {
            () = &mut shutdown, if !draining => {
                close_by = Some(begin_drain(&mut connections, &mut lot, grace));
                if connections.before.is_empty() {
                    break;
                }
            }
            accepted = acceptor.next() => {
                let Some(accepted) = accepted else { continue };
                // The select draws between branches that are ready together: a client
                // that connected just after the shutdown signal is served as one that
                // came during the drain (one answer), never closed with the idle ones.
                if !draining && (&mut shutdown).now_or_never().is_some() {
                    close_by = Some(begin_drain(&mut connections, &mut lot, grace));
                }
                let placed = match &balance {
                    Some(member) => member.place(accepted),
                    None => {
                        serve_one(&mut connections, accepted, None);
                        continue;
                    }
                };
                match placed {
                    Placed::Here(accepted, served) => {
                        serve_one(&mut connections, accepted, Some(served))
                    }
                    Placed::HandedOver => proxy.metrics.handed_over(),
                    Placed::Lost => {}
                }
                if close_by.is_some() && connections.before.is_empty() {
                    break;
                }
            }
            (accepted, served) = handed_over(&mut balance) => {
                if let Some(accepted) = accepted {
                    serve_one(&mut connections, accepted, Some(served));
                }
            }
            Some(joined) = connections.before.join_next(), if !connections.before.is_empty() => {
                if let Some(parked) = parked(joined).filter(|_| !draining) {
                    lot.park(parked);
                }
                if draining && connections.before.is_empty() {
                    break;
                }
            }
            Some(joined) = connections.during.join_next(), if !connections.during.is_empty() => {
                // Accepted while draining: they close after one answer, never park.
                drop(parked(joined));
            }
            woken = lot.next(Instant::now), if !lot.is_empty() => match woken {
                Woken::Ready(client) => serve(&mut connections, client),
                Woken::IdledOut(peer) => {
                    debug!(%peer, reason = CloseReason::Idle.as_str(), "closing client connection");
                    proxy.metrics.connection_closed(CloseReason::Idle);
                }
            },
            _ = sweep.tick(), if !lot.is_empty() => {
                lot.sweep(Instant::now());
            }
            () = sleep_until_some(close_by) => break,
        }
    }
    let stopping_since = close_by.map_or_else(Instant::now, |at| at - grace / 2);
    // Clients already in the listen queue get their one answer rather than the reset a
    // closing listener gives them.
    for accepted in acceptor.close() {
        serve_one(&mut connections, accepted, None);
    }
    // Connections other workers handed over before this one stopped are served like
    // those it accepted itself: answered, then closed as the shutdown asks.
    if let Some(member) = &mut balance {
        for (accepted, served) in member.close() {
            if let Some(accepted) = accepted {
                serve_one(&mut connections, accepted, Some(served));
            }
        }
    }
    info!(
        connections = connections.len(),
        "shutting down: no new connections; finishing the last requests"
    );
    connections.close();
    let left = grace.saturating_sub(stopping_since.elapsed());
    if tokio::time::timeout(left, connections.finish())
        .await
        .is_err()
    {
        warn!(
            connections = connections.len(),
            "shutdown grace period over; closing the remaining connections"
        );
        connections.cut().await;
    }
    // Open tunnels (WebSockets) run on this worker until their sides close them, up to
    // the grace period; the rest are cut when the worker stops.
    let left = grace.saturating_sub(stopping_since.elapsed());
    if proxy.open_tunnels() > 0 {
        info!(
            tunnels = proxy.open_tunnels(),
            "waiting for open tunnels to close"
        );
        if tokio::time::timeout(left, proxy.tunnels_closed())
            .await
            .is_err()
        {
            warn!(
                tunnels = proxy.open_tunnels(),
                "shutdown grace period over; closing the open tunnels"
            );
            proxy.cut_tunnels();
            let _ = tokio::time::timeout(TUNNELS_CUT_WAIT, proxy.tunnels_closed()).await;
        }
    }
    info!("proxy stopped");
    Ok(())
}

/// Drain step 1: connections accepted from now on get one answer, idle and parked ones
/// close, those with a request in flight finish it. Returns when the listener closes at
/// the latest (step 2).
fn begin_drain(connections: &mut Cohorts, lot: &mut Lot, grace: Duration) -> Instant {
    info!(
        connections = connections.before.len(),
        grace = ?grace,
        "shutting down: finishing in-flight requests; new connections get one answer"
    );
    connections.drain();
    lot.close_all();
    Instant::now() + grace / 2
}

/// A finished connection task's parked connection, if it parked.
fn parked(joined: Result<Option<Parked>, tokio::task::JoinError>) -> Option<Parked> {
    joined.unwrap_or_else(|error| {
        warn!(%error, "connection task failed");
        None
    })
}

/// How often the parked connections are checked for their idle limit: a few times
/// per limit, at least once a second (a connection closes at most this late).
fn sweep_every(timeouts: &ConnTimeouts) -> Duration {
    (timeouts.idle / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// The connections of one listener: those accepted before shutdown, and those accepted
/// while the proxy drains, each cohort with its own signal to finish.
struct Cohorts {
    before: JoinSet<Option<Parked>>,
    during: JoinSet<Option<Parked>>,
    finish_before: watch::Sender<bool>,
    finish_during: watch::Sender<bool>,
}

impl Cohorts {
    fn new() -> Self {
        Self {
            before: JoinSet::new(),
            during: JoinSet::new(),
            finish_before: watch::Sender::new(false),
            finish_during: watch::Sender::new(false),
        }
    }

    /// Where a connection accepted now goes: its set, its signal to finish, and whether
    /// the proxy is draining (the connection then gets one answer).
    fn joining(&mut self) -> (&mut JoinSet<Option<Parked>>, watch::Receiver<bool>, bool) {
        if *self.finish_before.borrow() {
            (&mut self.during, self.finish_during.subscribe(), true)
        } else {
            (&mut self.before, self.finish_before.subscribe(), false)
        }
    }

    /// Step 1: the connections open now finish what they are doing.
    fn drain(&mut self) {
        self.finish_before.send_replace(true);
    }

    /// Step 2: every connection finishes.
    fn close(&mut self) {
        self.finish_before.send_replace(true);
        self.finish_during.send_replace(true);
    }

    fn len(&self) -> usize {
        self.before.len() + self.during.len()
    }

    async fn finish(&mut self) {
        while self.before.join_next().await.is_some() {}
        while self.during.join_next().await.is_some() {}
    }

    async fn cut(&mut self) {
        self.before.shutdown().await;
        self.during.shutdown().await;
    }
}

/// The listener, with the connection budget and rate-limited logging of accept errors
/// and sheds.
struct Acceptor<'a> {
    proxy: &'a Proxy,
    listener: TcpListener,
    accept_errors: RateLimited,
    sheds: RateLimited,
}

impl<'a> Acceptor<'a> {
    fn new(proxy: &'a Proxy, listener: TcpListener) -> std::io::Result<Self> {
        let local = listener.local_addr()?;
        info!(%local, max_connections = proxy.config.max_client_connections, "proxy listening");
        Ok(Self {
            proxy,
            listener,
            accept_errors: RateLimited::new(LOG_EVERY),
            sheds: RateLimited::new(LOG_EVERY),
        })
    }

    /// The next connection within the budget (`None`: one was shed, or accept failed).
    async fn next(&mut self) -> Option<Accepted> {
        match self.listener.accept().await {
            Ok((stream, peer)) => admit(self.proxy, &mut self.sheds, stream, peer),
            Err(error) => {
                if let Some(more) = self.accept_errors.allow(Instant::now()) {
                    warn!(%error, repeats_since_last_line = more, "accept failed");
                }
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                None
            }
        }
    }

    /// Close the listener, taking the connections already in its listen queue (at most
    /// [`WAITING_AT_CLOSE`], so that a flood of new ones cannot hold it open). Read
    /// without waiting, from the socket itself: the runtime may not have seen them yet.
    fn close(self) -> Vec<Accepted> {
        let Self {
            proxy,
            listener,
            mut sheds,
            ..
        } = self;
        let listener = match listener.into_std() {
            Ok(listener) => listener,
            Err(_) => return Vec::new(),
        };
        let mut waiting = Vec::new();
        for _ in 0..WAITING_AT_CLOSE {
            let Ok((stream, peer)) = listener.accept() else {
                break; // WouldBlock: none left (or an error: stop here either way)
            };
            let stream = stream
                .set_nonblocking(true)
                .and_then(|()| TcpStream::from_std(stream));
            if let Some(accepted) = stream.ok().and_then(|s| admit(proxy, &mut sheds, s, peer)) {
                waiting.push(accepted);
            }
        }
        waiting
    }
}

/// An accepted connection, if the connection budget has room for it.
fn admit(
    proxy: &Proxy,
    sheds: &mut RateLimited,
    stream: TcpStream,
    peer: SocketAddr,
) -> Option<Accepted> {
    // Shared with every other listener or worker serving this proxy.
    let Ok(permit) = proxy.connections.clone().try_acquire_owned() else {
        // Over budget: close at once rather than hold the descriptor.
        drop(stream);
        proxy.metrics.connection_closed(CloseReason::Shed);
        if let Some(more) = sheds.allow(Instant::now()) {
            warn!(
                %peer,
                limit = proxy.config.max_client_connections,
                shed_since_last_line = more,
                "connection limit reached; shedding new client connections"
            );
        }
        return None;
    };
    Some(Accepted {
        stream,
        peer,
        permit,
    })
}

/// How long a stopping worker waits for the tunnels it told to close.
const TUNNELS_CUT_WAIT: Duration = Duration::from_secs(1);

/// The most connections taken from the listen queue when the listener closes.
const WAITING_AT_CLOSE: usize = 1024;

/// The next connection another worker hands to this one; never, without a balance.
async fn handed_over(balance: &mut Option<Member>) -> (Option<Accepted>, Served) {
    match balance {
        Some(member) => member.handed_over().await,
        None => std::future::pending().await,
    }
}

/// The two servers a client connection may meet: the proxy's own HTTP/1.1 loop first,
/// then hyper's, set up once per listener; and the connections' timeouts.
struct Servers {
    hyper: auto::Builder<TokioExecutor>,
    native: serve::Limits,
    timeouts: ConnTimeouts,
}

/// Serve one client connection while it is in use, closing it when it is silent, idle
/// or stalled (see `client/conn.rs`) or, gracefully, when `stop` turns true; `Some` when it
/// parks instead (`client/park.rs`).
///
/// The connection starts on the proxy's own HTTP/1.1 loop (`http1/serve.rs`); hyper takes
/// it over, with the bytes read so far, at the first request that loop leaves to it
/// (a body, an upgrade, HTTP/2, a head it cannot parse). hyper's state is on the heap,
/// paid only by the connections hyper takes over.
async fn drive(
    proxy: Arc<Proxy>,
    servers: Arc<Servers>,
    client: Client,
    mut stop: watch::Receiver<bool>,
    draining: bool,
) -> Option<Parked> {
    let Client { stream, peer, open } = client;
    let _ = stream.set_nodelay(true);
    let activity = ConnActivity::new(Instant::now());
    let service = ConnService::new(proxy.clone(), peer, activity.clone());
    let io = Watched::new(stream, activity.clone(), proxy.config.max_uri_bytes);
    let timeouts = servers.timeouts;
    let mut watchdog = Watchdog {
        check: Box::pin(tokio::time::sleep_until(
            activity.next_check(&timeouts, Instant::now()).into(),
        )),
        timeouts,
        activity,
        proxy: &proxy,
        peer,
        closing: false,
        stopping: *stop.borrow(),
    };
    // The watchdog rarely has anything to say: it is polled only when its own timer or
    // the shutdown signal woke it, not on every wake by the sockets.
    let gate = Gate::new();
    let (io, cache) = match serve_natively(
        &service,
        io,
        servers.native,
        &mut watchdog,
        &gate,
        &mut stop,
        draining,
    )
    .await
    {
        serve::Served::Closed => return None,
        serve::Served::Parked { io } => {
            let stream = io.into_inner();
            return Some(Parked {
                client: Client { stream, peer, open },
                idle_until: watchdog.activity.idle_until(&timeouts),
            });
        }
        serve::Served::Handoff { io, cache } => (io, cache),
    };
    // hyper's connections do not park; once idle they are polled once more, when an
    // HTTP/2 connection gives back its buffers (vendor/h2/PROXIMA-PATCH.md).
    watchdog.timeouts.park = None;
    watchdog.timeouts.rest = Some(PARK_AFTER);
    let io = TokioIo::new(io);
    let mut conn = Box::pin(
        servers
            .hyper
            .serve_connection_with_upgrades(io, hyper_service(service, cache)),
    );
    if watchdog.stopping {
        conn.as_mut().graceful_shutdown();
    }
    loop {
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(error) = result {
                    debug!(%peer, %error, "client connection ended with an error");
                }
                return None;
            }
            event = gate.wrap(watchdog.next(&mut stop)) => match event {
                Event::Graceful => conn.as_mut().graceful_shutdown(),
                Event::Cut => return None,
                // Rested: the loop polls `conn` again at once.
                Event::Park => {}
            }
        }
    }
}

/// The native phase of [`drive`]. A connection accepted while the proxy drains
/// (`draining`) gets one answer.
async fn serve_natively(
    service: &ConnService,
    io: Watched<TcpStream>,
    limits: serve::Limits,
    watchdog: &mut Watchdog<'_>,
    gate: &Gate,
    stop: &mut watch::Receiver<bool>,
    draining: bool,
) -> serve::Served {
    // Told to stop before it began: close, unless it is one of those a drain answers.
    if watchdog.stopping && !draining {
        return serve::Served::Closed;
    }
    let asks = serve::Asks::default();
    asks.close.store(draining, Ordering::Relaxed);
    let native = serve::serve(service, io, limits, &asks);
    tokio::pin!(native);
    loop {
        tokio::select! {
            served = native.as_mut() => return served,
            event = gate.wrap(watchdog.next(stop)) => match event {
                Event::Cut => return serve::Served::Closed,
                // Accepted while the proxy drains: it closes after its one answer anyway,
                // and its request may be on its way already (a close now would lose it).
                Event::Graceful if draining => {}
                // Between requests the connection just closes, as hyper's would; a
                // request in flight is answered first, with `connection: close`.
                Event::Graceful if watchdog.activity.is_idle() => return serve::Served::Closed,
                Event::Graceful => asks.close.store(true, Ordering::Relaxed),
                // The loop parks when it next waits for a request with nothing read
                // (the select polls it again at once).
                Event::Park => asks.park.store(true, Ordering::Relaxed),
            }
        }
    }
}

/// What the connection driver must do.
enum Event {
    /// Finish what runs, then close (HTTP/1.1 `connection: close`, HTTP/2 GOAWAY).
    Graceful,
    /// Drop the connection now.
    Cut,
    /// Idle long enough to park (`client/park.rs`), or, where hyper holds the
    /// connection, to be polled once more (`ConnTimeouts::rest`).
    Park,
}

/// The connection's timeouts and the proxy's shutdown, as events for the driver: one
/// timer per connection, moved only when it fires (see `client/conn.rs`).
struct Watchdog<'a> {
    check: std::pin::Pin<Box<tokio::time::Sleep>>,
    timeouts: ConnTimeouts,
    activity: Arc<ConnActivity>,
    proxy: &'a Proxy,
    peer: SocketAddr,
    /// Asked to close; cut when [`CLOSE_GRACE`] is over.
    closing: bool,
    /// The proxy is shutting down (its own grace period bounds the rest).
    stopping: bool,
}

impl Watchdog<'_> {
    /// The next event. Cancel-safe: state changes only after the last wait.
    async fn next(&mut self, stop: &mut watch::Receiver<bool>) -> Event {
        loop {
            tokio::select! {
                changed = stop.changed(), if !self.stopping => {
                    if changed.is_err() || *stop.borrow() {
                        self.stopping = true;
                        self.closing = false;
                        return Event::Graceful;
                    }
                }
                () = self.check.as_mut(), if self.closing || !self.stopping => {
                    let peer = self.peer;
                    if self.closing {
                        debug!(%peer, "client did not close in time; dropping the connection");
                        return Event::Cut;
                    }
                    let now = Instant::now();
                    match self.activity.verdict(&self.timeouts, now) {
                        Verdict::Keep => self
                            .check
                            .as_mut()
                            .reset(self.activity.next_check(&self.timeouts, now).into()),
                        Verdict::Close(reason) => {
                            debug!(%peer, reason = reason.as_str(), "closing client connection");
                            self.proxy.metrics.connection_closed(reason);
                            self.closing = true;
                            self.check.as_mut().reset((now + CLOSE_GRACE).into());
                            return Event::Graceful;
                        }
                        Verdict::Park => {
                            let resting = ConnTimeouts {
                                park: None,
                                rest: None,
                                ..self.timeouts
                            };
                            let next = self.activity.next_check(&resting, now);
                            self.check.as_mut().reset(next.into());
                            return Event::Park;
                        }
                        Verdict::Cut(reason) => {
                            debug!(%peer, reason = reason.as_str(), "cutting stalled client connection");
                            self.proxy.metrics.connection_closed(reason);
                            return Event::Cut;
                        }
                    }
                }
                else => std::future::pending::<()>().await,
            }
        }
    }
}

/// hyper's service for a connection it took over, with the connection's target cache.
fn hyper_service(
    service: Arc<ConnService>,
    cache: TargetCache,
) -> impl hyper::service::Service<
    Request<Incoming>,
    Response = http::Response<crate::ResponseBody>,
    Error = Infallible,
    Future = impl Future<Output = Result<http::Response<crate::ResponseBody>, Infallible>> + Send,
> + Send {
    let cache = RefCell::new(cache);
    service_fn(move |req: Request<Incoming>| {
        let req = req.map(RequestBody::Client);
        let admitted = match cache.try_borrow_mut() {
            Ok(mut cache) => service.admit(&mut cache, req),
            Err(_) => service.admit(&mut TargetCache::default(), req),
        };
        async move {
            // Boxed: hyper spawns a task per HTTP/2 stream, and the answer's future is
            // 3.8 KB, which was copied whole on its way into each task (memmove led the
            // profile under h2load). Allocating it once inside the task: 37.1 against
            // 40.9 µs of CPU per request, 10 of 10 interleaved rounds (benches/load
            // README, "HTTP/2 clients side by side").
            let mut response = Box::pin(admitted.answer()).await;
            // hyper writes the header map: fields that came raw go into it.
            crate::http1::map_raw_fields(&mut response);
            Ok::<_, Infallible>(response)
        }
    })
}
