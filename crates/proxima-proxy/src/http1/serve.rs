//! The proxy's own HTTP/1.1 server loop, for the requests nearly all edge traffic is made
//! of: a head and no body (GETs, HEADs, probes, DELETEs), or a small one (devices
//! POSTing a reading). It reads and parses the request head (`httparse`, header values
//! sharing the read buffer), reads a body of up to [`WHOLE_BODY_LIMIT`] bytes whole
//! (by `Content-Length`, or chunked, decoded as pods' answers are), hands the request
//! to the same per-connection service as hyper's server, and writes the response head
//! and body itself: a small first body frame is copied behind the head and both go in
//! one `send`, a larger one goes with the head in one `writev`. Since the connection
//! stays on this loop, it parks between requests (`client/park.rs`) whatever they carry.
//!
//! Anything else goes to hyper for the rest of the connection, with the bytes read so far
//! replayed in front of the socket ([`Watched::replay`]): a larger body, or one framed
//! otherwise (a list of lengths, a coding besides `chunked`, both fields, trailer
//! fields, a malformed chunk), an `Expect` other than `100-continue` before a body (which
//! the loop answers itself), `Upgrade`, `TE`, `CONNECT`, an HTTP/2 preface,
//! a head that does not parse or that outgrows the read limit. hyper then behaves
//! exactly as if it had had the connection from the start, answers included (its own
//! `400`/`431`/`414`, which `client/conn.rs` dresses as JSON). The native loop never
//! answers a protocol error itself.
//!
//! What the loop keeps of hyper's HTTP/1.1 server (RFC 9112):
//!
//! * persistence (§9.3): `Connection: close`, HTTP/1.0 without `keep-alive`, or a
//!   graceful close asked by the connection driver end the connection after the
//!   current response, which then says `connection: close`;
//! * framing of the response (§6.3): the pod's `Content-Length`, else the body's exact
//!   size, else chunked for HTTP/1.1 and close-delimited for HTTP/1.0; no body for
//!   `HEAD`, `1xx`, `204` and `304`. Trailers are dropped (a request that sends `TE`,
//!   the only one that may receive them, goes to hyper). A body that breaks off, or
//!   ends short of its length, closes the connection, so the client sees a cut answer;
//! * pipelining: bytes after a head stay buffered for the next request;
//! * a client that closes while its request waits for the pod aborts the request (its
//!   future is dropped, so `forward.rs` measures the wait as abandoned), as with hyper,
//!   which also watches for that only while no pipelined bytes are buffered;
//! * a `date` header on answers without one, formatted once per second per thread;
//! * a pod's header fields written as the pod sent them, when its head needs nothing
//!   but its connection fields taken out (`http1::RawFields`): no header map is built,
//!   searched or written for the common answer. hyper's server, which writes maps,
//!   gets them as one (`http1::map_raw_fields`).
//!
//! Timeouts and close reasons stay with the connection driver (`client/server.rs`, `client/conn.rs`),
//! which sees this loop's reads and writes through the same [`Watched`] socket.

use std::cell::RefCell;
use std::io::{self, IoSlice, Write};
use std::mem::MaybeUninit;
use std::ops::Range;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::{Buf, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, DATE, EXPECT, TE, TRANSFER_ENCODING, UPGRADE};
use http::{
    HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri, Version,
};
use http_body::Body;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::client::conn::Watched;
use crate::client::conn_service::ConnService;
use crate::client::gate::Gate;
use crate::forward::body::ResponseBody;
use crate::forward::request_body::RequestBody;
use crate::forward::target::TargetCache;
use crate::http1::{Chunked, Decoded, RawFields};

/// Bytes a read makes room for: a whole head of the kind devices send (a few hundred
/// bytes) and a few pipelined ones; a longer head grows the buffer by as much again per
/// read. As nginx's `client_header_buffer_size` (1k), and for the same reason: a
/// connection holds its buffer while it is in use, and a burst of new connections
/// multiplies it (hyper starts at 8 KiB).
const READ_SIZE: usize = 1024;
/// The largest request body the loop reads itself, whole, before it forwards the
/// request (a chunked one: this many bytes of it as sent, framing included). As nginx's
/// `client_body_buffer_size` (16k): devices' readings fit many times over, and the
/// buffer is held only while its request is read and sent. A larger body goes to hyper,
/// which streams it, and whose connections do not park.
const WHOLE_BODY_LIMIT: usize = 16 * 1024;
/// Header field slots of a request's first parse (on the stack).
const COMMON_HEADERS: usize = 64;
/// Header fields the proxy adds to a request on its way to a pod (`headers.rs`).
const FORWARDING_HEADERS: usize = 2;

/// What became of a connection when the loop let go of it.
pub(crate) enum Served {
    /// Closed (by either side, or after its last response).
    Closed,
    /// Not for this loop: hyper takes it over; the socket replays what was read.
    Handoff {
        io: Watched<TcpStream>,
        cache: TargetCache,
    },
    /// Asked to park ([`Asks::park`]) while waiting for a next request with nothing of
    /// it read: the socket, for the driver to wait on.
    Parked { io: Watched<TcpStream> },
}

/// What the connection driver asks of the loop, read when the loop next looks.
#[derive(Debug, Default)]
pub(crate) struct Asks {
    /// End the connection after the current response.
    pub(crate) close: AtomicBool,
    /// Give the socket back once waiting for a next request with nothing read.
    pub(crate) park: AtomicBool,
}

/// Limits of the loop, from the proxy's configuration.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// A head not complete within this many bytes goes to hyper, whose read buffer is
    /// this large too, and which answers `431` or `414`.
    pub(crate) max_head: usize,
    /// Header lines parsed at most; more go to hyper (which then answers `431`).
    pub(crate) max_headers: usize,
}

/// Serve HTTP/1.x requests on `io` until the connection closes, until one arrives
/// that is not for this loop (see the module docs), or until the driver asks it to
/// park (`asks`).
///
/// The loop's state lives only while the connection is in use: an idle one parks
/// (`client/park.rs`), and the read buffer, the exchange and the loop's future go with its task.
/// The buffers a request needs while it is parsed and answered are the thread's
/// (`spare.rs`), not the connection's.
pub(crate) async fn serve(
    service: &ConnService,
    mut io: Watched<TcpStream>,
    limits: Limits,
    asks: &Asks,
) -> Served {
    // Allocated once the socket has bytes (see [`Watched::poll_fill`]), then kept from
    // request to request until the connection parks: the next heads are read into the
    // room the last ones left, or into the same allocation taken back once their
    // requests are done with it (`BytesMut::reserve`). A fresh buffer per request cost
    // two allocations (the buffer, and the shared header `split_to` makes) and their
    // frees: 26,750 -> 26,290 instructions per request (`instructions.sh`).
    let mut buf = BytesMut::new();
    let mut cache = TargetCache::default();
    // Bytes of `buf` already known to hold no complete head.
    let mut searched = 0;
    // The watch for the client going away while its request waits is polled only when
    // the socket woke it (see `client/gate.rs`).
    let watch = Gate::new();
    loop {
        let (admitted, keep_alive, head_request, version) = {
            let parsed = loop {
                // See `may_settle_head`: a client sending a byte at a time cannot make
                // the parse quadratic.
                if crate::http1::may_settle_head(&buf[searched..]) {
                    let mut fields = crate::spare::take().unwrap_or_default();
                    let parsed = parse_request(
                        &mut buf,
                        limits.max_headers,
                        &mut fields,
                        service.service_header(),
                    );
                    crate::spare::give_back(fields);
                    match parsed {
                        Parse::Partial => {}
                        Parse::Request(parsed) => break parsed,
                        Parse::NotNative => return handoff(io, buf, cache),
                        Parse::Invalid => return refuse_malformed(service, io).await,
                    }
                }
                searched = buf.len();
                if buf.len() >= limits.max_head {
                    return handoff(io, buf, cache);
                }
                let read = std::future::poll_fn(|cx| {
                    if buf.is_empty() && asks.park.load(Ordering::Relaxed) {
                        return Poll::Ready(None);
                    }
                    io.poll_fill(cx, &mut buf, READ_SIZE).map(Some)
                });
                match read.await {
                    None => return Served::Parked { io },
                    Some(Ok(0) | Err(_)) => return Served::Closed,
                    Some(Ok(_)) => {}
                }
            };
            searched = 0;
            let Native {
                request,
                keep_alive,
                body,
                expects_continue,
                head,
            } = parsed;
            // On the heap, as the answer below: only requests with a body pay for it.
            let read = match body {
                BodyFraming::Length(0) => None,
                _ => Some(Box::pin(read_whole(&mut io, &mut buf, body, expects_continue)).await),
            };
            let request = match read {
                None => request,
                Some(Whole::Read(data)) => with_body(request, body, data),
                Some(Whole::Closed) => return Served::Closed,
                Some(Whole::Hyper) => {
                    in_front(&head, &mut buf);
                    return handoff(io, buf, cache);
                }
            };
            let head_request = request.method() == Method::HEAD;
            let version = request.version();
            let admitted = service.admit(&mut cache, request);
            (admitted, keep_alive, head_request, version)
        };
        // While the pod is asked, a close by the client aborts the request (the answer's
        // future is dropped). As in hyper, the socket is watched only while nothing of a
        // next request is buffered: a client that pipelines and then half-closes still
        // gets its answers.
        // The answer's future ends with this block, before the response is written.
        // It is in the loop's own state, not boxed: it (~3 KB) and the writing of the
        // response (~850 bytes) stay in the connection's task between requests, but only
        // until the connection parks (`PARK_AFTER`, when the task and its state go).
        // Boxing them cost two allocations and their frees per request: 27,320 -> 26,750
        // instructions per request without (`instructions.sh`). Made here, in its pinned
        // place, rather than in the block above and moved: the move was a 3 KB copy.
        let response = {
            let mut answer = std::pin::pin!(admitted.answer());
            loop {
                let watching = buf.is_empty();
                tokio::select! {
                    biased;
                    response = answer.as_mut() => break response,
                    read = watch.wrap(std::future::poll_fn(|cx| io.poll_fill(cx, &mut buf, READ_SIZE))), if watching => {
                        match read {
                            Ok(0) | Err(_) => return Served::Closed,
                            Ok(_) => {}
                        }
                    }
                }
            }
        };
        let close = !keep_alive || asks.close.load(Ordering::Relaxed);
        let mut head_out = crate::spare::take().unwrap_or_default();
        let written = respond(
            &mut io,
            &mut head_out,
            response,
            version,
            head_request,
            close,
        )
        .await;
        crate::spare::give_back(head_out);
        match written {
            Ok(true) => {}
            Ok(false) | Err(_) => {
                let _ = io.shutdown().await;
                return Served::Closed;
            }
        }
        if asks.close.load(Ordering::Relaxed) {
            let _ = io.shutdown().await;
            return Served::Closed;
        }
    }
}

/// Where the reading of a body has got to.
enum BodyRead {
    /// All of the body is the read buffer's first this many bytes, once they are there.
    Length(usize),
    Chunked(Chunks),
}

/// What one look at the read buffer found of a body.
enum Step {
    /// The body, taken off the front of the read buffer.
    Read(bytes::Bytes),
    /// More bytes are needed; a read should make room for this many.
    More(usize),
    /// hyper's to read (see [`Chunks`]).
    Hyper,
}

impl BodyRead {
    fn new(framing: BodyFraming) -> Self {
        match framing {
            BodyFraming::Length(n) => BodyRead::Length(n),
            BodyFraming::Chunked => BodyRead::Chunked(Chunks::default()),
        }
    }

    /// Look at what `buf` holds (the bytes after the head).
    fn step(&mut self, buf: &mut BytesMut) -> Step {
        match self {
            BodyRead::Length(n) if buf.len() >= *n => Step::Read(buf.split_to(*n).freeze()),
            BodyRead::Length(n) => Step::More(*n - buf.len()),
            BodyRead::Chunked(chunks) => chunks.step(buf),
        }
    }
}

/// A chunked body, decoded as its bytes arrive (by the decoder of pods' chunked
/// bodies, `http1::decode_chunked`) from a copy: the bytes as sent stay in the read
/// buffer until the last chunk is in, so that a body that turns out to be hyper's is
/// handed over whole, with its head: one longer than [`WHOLE_BODY_LIMIT`] (or whose
/// encoding is, while it is incomplete), a malformed one (hyper answers it), one with
/// trailer fields (which hyper passes on, and a body read whole could not).
#[derive(Default)]
struct Chunks {
    state: Chunked,
    /// Bytes of the read buffer copied into `undecoded` so far.
    copied: usize,
    undecoded: BytesMut,
    data: BytesMut,
}

impl Chunks {
    fn step(&mut self, buf: &mut BytesMut) -> Step {
        self.undecoded.extend_from_slice(&buf[self.copied..]);
        self.copied = buf.len();
        loop {
            match crate::http1::decode_chunked(&mut self.state, &mut self.undecoded) {
                Ok(Some(Decoded::Data(data)))
                    if self.data.len() + data.len() <= WHOLE_BODY_LIMIT =>
                {
                    self.data.extend_from_slice(&data)
                }
                Ok(Some(Decoded::End(trailers))) if trailers.is_empty() => {
                    buf.advance(self.copied - self.undecoded.len());
                    return Step::Read(std::mem::take(&mut self.data).freeze());
                }
                Ok(None) if buf.len() < WHOLE_BODY_LIMIT => return Step::More(READ_SIZE),
                Ok(_) | Err(_) => return Step::Hyper,
            }
        }
    }
}

/// `request` with the body read whole, and no expectation left (the proxy met it). A
/// chunked one goes on with its length instead (the pod is sent it with
/// `Content-Length`; `Transfer-Encoding` is hop-by-hop).
fn with_body(
    request: Request<RequestBody>,
    framing: BodyFraming,
    data: bytes::Bytes,
) -> Request<RequestBody> {
    let mut request = request;
    request.headers_mut().remove(EXPECT);
    if framing == BodyFraming::Chunked {
        let headers = request.headers_mut();
        headers.remove(TRANSFER_ENCODING);
        headers.insert(CONTENT_LENGTH, HeaderValue::from(data.len()));
    }
    *request.body_mut() = RequestBody::whole(data);
    request
}

/// Answer a head httparse refuses with `400` and close. Not left to hyper: after a
/// first read that ended mid-head, hyper parses again only once the buffer holds a head's
/// end (CRLF CRLF or LF LF), which a head broken by a bare CR may never send; the client
/// would wait out the head timeout for its answer.
async fn refuse_malformed(service: &ConnService, mut io: Watched<TcpStream>) -> Served {
    let mut head = Vec::new();
    let response = service.malformed();
    let _ = respond(&mut io, &mut head, response, Version::HTTP_11, false, true).await;
    let _ = io.shutdown().await;
    Served::Closed
}

/// Put `head` back in front of the bytes that followed it.
fn in_front(head: &[u8], buf: &mut BytesMut) {
    let mut whole = BytesMut::with_capacity(head.len() + buf.len());
    whole.extend_from_slice(head);
    whole.extend_from_slice(buf);
    *buf = whole;
}

fn handoff(mut io: Watched<TcpStream>, buf: BytesMut, cache: TargetCache) -> Served {
    io.replay(buf.freeze());
    Served::Handoff { io, cache }
}

/// A request this loop serves, whether the client lets the connection be reused, how
/// its body (still in the read buffer, or still to come) is framed and whether the
/// client waits to be asked for it, and its head, for hyper should the body turn out to
/// be its to read.
struct Native {
    request: Request<RequestBody>,
    keep_alive: bool,
    body: BodyFraming,
    /// The client waits for `100 Continue` before it sends the body (RFC 9110 §10.1.1).
    expects_continue: bool,
    head: bytes::Bytes,
}

/// How a request's body is delimited (RFC 9112 §6.3), in the forms this loop reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BodyFraming {
    /// `Content-Length` (0, or none given: no body), at most [`WHOLE_BODY_LIMIT`].
    Length(usize),
    /// `Transfer-Encoding: chunked`, alone, on HTTP/1.1.
    Chunked,
}

/// The framing a `Content-Length` or `Transfer-Encoding` field gives a request body, if
/// it is one this loop reads: a single length up to [`WHOLE_BODY_LIMIT`], or `chunked`
/// alone on HTTP/1.1. Anything else, a second such field included, is hyper's (lists,
/// other codings, a length beside a coding: RFC 9112 §6.3 rules 3 to 5).
fn body_framing(
    seen: Option<BodyFraming>,
    name: &HeaderName,
    value: &[u8],
    version: Version,
) -> Result<BodyFraming, Unserved> {
    if seen.is_some() {
        return Err(Unserved::Other);
    }
    let value = value.trim_ascii();
    if *name == CONTENT_LENGTH {
        return crate::http1::parse_length(value)
            .and_then(|n| usize::try_from(n).ok())
            .filter(|&n| n <= WHOLE_BODY_LIMIT)
            .map(BodyFraming::Length)
            .ok_or(Unserved::Other);
    }
    if version == Version::HTTP_11 && value.eq_ignore_ascii_case(b"chunked") {
        return Ok(BodyFraming::Chunked);
    }
    Err(Unserved::Other)
}

/// What reading a request's body whole came to.
enum Whole {
    /// The body (empty if it has none); the read buffer starts at what follows it.
    Read(bytes::Bytes),
    /// The client closed first: the request goes nowhere.
    Closed,
    /// hyper's to read (see [`Chunks`]): every byte of it is still in the read buffer.
    Hyper,
}

/// Read the body of a request into memory, whole, before the request is forwarded, so
/// that a connection holds nothing of it once its answer is out, and the next request
/// is read from exactly where the body ends. Bounded by the connection's header timeout,
/// as the head before it (`client/conn.rs`: no request is in flight yet).
///
/// A client that waits for `100 Continue` is sent it once the body is needed, as nginx
/// does: the proxy takes the body itself, so the pod never sees the expectation.
async fn read_whole(
    io: &mut Watched<TcpStream>,
    buf: &mut BytesMut,
    framing: BodyFraming,
    mut expects_continue: bool,
) -> Whole {
    let mut body = BodyRead::new(framing);
    // A head whose body has not begun to arrive with it, and that does not wait for
    // `100 Continue`, is streamed by hyper: the pod gets the head at once and may answer
    // before the body (as nginx answers a POST to a static file) rather than the client
    // waiting on this loop. Found by smugglex: a head declaring a body that never came
    // waited here for the head timeout.
    if buf.is_empty() && !expects_continue {
        return Whole::Hyper;
    }
    loop {
        let room = match body.step(buf) {
            Step::Read(data) => return Whole::Read(data),
            Step::Hyper => return Whole::Hyper,
            Step::More(room) => room,
        };
        if std::mem::take(&mut expects_continue) {
            let interim = &mut [IoSlice::new(b"HTTP/1.1 100 Continue\r\n\r\n")];
            if write_all(io, interim).await.is_err() {
                return Whole::Closed;
            }
        }
        match std::future::poll_fn(|cx| io.poll_fill(cx, buf, room)).await {
            Ok(0) | Err(_) => return Whole::Closed,
            Ok(_) => {}
        }
    }
}

// Returned once per request and matched at once; boxing the request would cost an
// allocation per request to save a move.
#[allow(clippy::large_enum_variant)]
enum Parse {
    Partial,
    /// A head httparse refuses: no parser can serve it.
    Invalid,
    Request(Native),
    NotNative,
}

/// A header field as parsed: its name, and where its value lies in the head.
struct Field {
    name: HeaderName,
    value: Range<usize>,
}

/// The parser's field lists, kept per thread between heads.
impl crate::spare::Spare for Vec<Field> {
    fn kept() -> &'static std::thread::LocalKey<RefCell<Vec<Self>>> {
        thread_local! {
            static KEPT_FIELDS: RefCell<Vec<Vec<Field>>> = const { RefCell::new(Vec::new()) };
        }
        &KEPT_FIELDS
    }

    fn reset(&mut self) -> bool {
        self.clear();
        self.capacity() > 0 && self.capacity() <= COMMON_HEADERS
    }
}

/// Why [`scan`] leaves a head to hyper.
enum Unserved {
    /// More header fields than the slots given.
    TooManyHeaders,
    /// Not HTTP/1.1: httparse refuses the head.
    Invalid,
    Other,
}

/// What the request line and header fields of a complete head say, before the head
/// is split off the read buffer.
struct Scanned {
    len: usize,
    version: Version,
    method: Method,
    target: Range<usize>,
    body: BodyFraming,
    /// `Expect: 100-continue`, on a request with a body.
    expects_continue: bool,
}

/// Parse the request head at the start of `buf`. On success the head is split off
/// `buf` (what follows stays, for the next request) and the request's values share it.
/// `known`: a header name nearly every request has (the service header), taken as is
/// rather than made again (a name outside the standard set is copied to the heap).
fn parse_request(
    buf: &mut BytesMut,
    max_headers: usize,
    fields: &mut Vec<Field>,
    known: &HeaderName,
) -> Parse {
    // Nearly every head fits in a few dozen field slots on the stack; only one that
    // does not is parsed again with room for the configured most.
    let max_headers = max_headers.max(1);
    let first = max_headers.min(COMMON_HEADERS);
    let scanned = match crate::http1::with_header_slots(first, |slots| {
        scan(buf, slots, fields, known)
    }) {
        Err(Unserved::TooManyHeaders) if max_headers > first => {
            crate::http1::with_header_slots(max_headers, |slots| scan(buf, slots, fields, known))
        }
        scanned => scanned,
    };
    let Scanned {
        len,
        version,
        method,
        target,
        body,
        expects_continue,
    } = match scanned {
        Ok(Some(scanned)) => scanned,
        Ok(None) => return Parse::Partial,
        Err(Unserved::Invalid) => return Parse::Invalid,
        Err(_) => return Parse::NotNative,
    };
    let head = buf.split_to(len).freeze();
    // `http` refuses some targets httparse takes (longer than 65534 bytes, say): hyper
    // answers those, so the head goes back in front of what followed it.
    let give_back = |buf: &mut BytesMut| {
        in_front(&head, buf);
        Parse::NotNative
    };
    let Ok(uri) = Uri::from_maybe_shared(head.slice(target)) else {
        return give_back(buf);
    };
    // Room for the forwarding headers `forward` adds, so the map is not grown and
    // rehashed once per request. A head with more fields than a map can hold
    // (`HeaderMap`'s 32768) is hyper's to refuse.
    let Ok(mut headers) = crate::spare::header_map(fields.len() + FORWARDING_HEADERS) else {
        return give_back(buf);
    };
    for field in fields.drain(..) {
        let Ok(value) = HeaderValue::from_maybe_shared(head.slice(field.value)) else {
            return give_back(buf);
        };
        if headers.try_append(field.name, value).is_err() {
            return give_back(buf);
        }
    }
    let keep_alive = crate::http1::persistent(version, &headers);
    let mut request = Request::new(RequestBody::Empty);
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.version_mut() = version;
    *request.headers_mut() = headers;
    Parse::Request(Native {
        request,
        keep_alive,
        body,
        expects_continue,
        head,
    })
}

/// Parse the head at the start of `buf` into `slots`: `Ok(None)` while it is
/// incomplete, `Err` when the native loop does not serve it. `fields` gets the header
/// names and where their values lie.
fn scan<'b>(
    buf: &'b [u8],
    slots: &mut [MaybeUninit<httparse::Header<'b>>],
    fields: &mut Vec<Field>,
    known: &HeaderName,
) -> Result<Option<Scanned>, Unserved> {
    let mut parsed = httparse::Request::new(&mut []);
    let len = match httparse::ParserConfig::default().parse_request_with_uninit_headers(
        &mut parsed,
        buf,
        slots,
    ) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(Unserved::TooManyHeaders),
        // Another version (HTTP/2's preface, say) is hyper's to answer.
        Err(httparse::Error::Version) => return Err(Unserved::Other),
        Err(_) => return Err(Unserved::Invalid),
    };
    let version = match parsed.version {
        Some(0) => Version::HTTP_10,
        Some(1) => Version::HTTP_11,
        _ => return Err(Unserved::Other),
    };
    let mut body = None;
    let mut expects_continue = false;
    let method = Method::from_bytes(parsed.method.unwrap_or_default().as_bytes())
        .map_err(|_| Unserved::Other)?;
    if method == Method::CONNECT {
        return Err(Unserved::Other);
    }
    let base = buf.as_ptr() as usize;
    let offset = |part: &[u8]| {
        let start = part.as_ptr() as usize - base;
        start..start + part.len()
    };
    let target = offset(parsed.path.ok_or(Unserved::Other)?.as_bytes());
    fields.clear();
    for header in parsed.headers.iter() {
        let name = if header.name.eq_ignore_ascii_case(known.as_str()) {
            known.clone()
        } else {
            HeaderName::from_bytes(header.name.as_bytes()).map_err(|_| Unserved::Other)?
        };
        if name == UPGRADE || name == TE {
            return Err(Unserved::Other);
        }
        if name == EXPECT {
            let continue_only = !expects_continue
                && version == Version::HTTP_11
                && header
                    .value
                    .trim_ascii()
                    .eq_ignore_ascii_case(b"100-continue");
            if !continue_only {
                return Err(Unserved::Other);
            }
            expects_continue = true;
        }
        if name == CONTENT_LENGTH || name == TRANSFER_ENCODING {
            body = Some(body_framing(body, &name, header.value, version)?);
        }
        fields.push(Field {
            name,
            value: offset(header.value),
        });
    }
    let body = body.unwrap_or(BodyFraming::Length(0));
    // Nothing to continue with: hyper's to answer, as before.
    if expects_continue && body == BodyFraming::Length(0) {
        return Err(Unserved::Other);
    }
    Ok(Some(Scanned {
        len,
        version,
        method,
        target,
        body,
        expects_continue,
    }))
}

/// The default service header, for the fuzz and unit tests.
const SERVICE_HEADER: HeaderName = HeaderName::from_static("x-service");

/// For the fuzz tests: parse `input` as a client's request head, as the native loop
/// does. Returns whether the loop would serve it itself, and how many bytes stay
/// buffered (all of them when it would not: hyper gets every byte); never panics.
#[doc(hidden)]
pub fn parse_request_for_fuzzing(input: &[u8], max_headers: usize) -> (bool, usize) {
    let mut buf = BytesMut::from(input);
    let native = matches!(
        parse_request(&mut buf, max_headers, &mut Vec::new(), &SERVICE_HEADER),
        Parse::Request(_)
    );
    (native, buf.len())
}

/// What the native loop makes of the bytes at the start of a connection (or after its
/// last request), for the differential tests.
#[doc(hidden)]
#[derive(Debug)]
pub enum NativeRequest {
    /// Served natively: the request as the loop parsed it (with its body, read whole;
    /// its header fields as the client sent them), whether the connection stays open
    /// after it, and how many bytes of the input its head and body took.
    Served {
        /// The request.
        message: crate::http1::PlainMessage,
        /// Whether the loop reads another request after answering this one.
        keep_alive: bool,
        /// Bytes of the input the head and body took; the rest stays buffered.
        used: usize,
    },
    /// A complete head whose body the input does not hold whole: the loop reads on (or,
    /// at the close, closes without forwarding the request).
    UnfinishedBody {
        /// The request as parsed, without its body.
        message: crate::http1::PlainMessage,
    },
    /// No complete head yet: the loop reads on (or, at the close, closes).
    Partial,
    /// Left to hyper, every byte of the input with it (the head, or the body: see
    /// `Chunks`).
    Handoff,
    /// Refused with `400` by the loop itself: httparse refuses the head.
    Invalid,
}

/// For the differential tests: parse the start of `input` as the native loop does (it
/// parses once its buffer holds a control byte, see `http1::may_settle_head`).
#[doc(hidden)]
pub fn parse_request_for_differential(input: &[u8], max_headers: usize) -> NativeRequest {
    if !crate::http1::may_settle_head(input) {
        return NativeRequest::Partial;
    }
    let mut buf = BytesMut::from(input);
    match parse_request(&mut buf, max_headers, &mut Vec::new(), &SERVICE_HEADER) {
        Parse::Partial => NativeRequest::Partial,
        Parse::NotNative => NativeRequest::Handoff,
        Parse::Invalid => NativeRequest::Invalid,
        Parse::Request(Native {
            request,
            keep_alive,
            body,
            ..
        }) => {
            let message = |body: &[u8]| crate::http1::PlainMessage {
                start: [
                    request.method().as_str().to_string(),
                    request.uri().to_string(),
                ],
                version: request.version(),
                headers: crate::http1::PlainMessage::fields_of(request.headers()),
                body: body.escape_ascii().to_string(),
                trailers: Vec::new(),
            };
            match BodyRead::new(body).step(&mut buf) {
                Step::Read(body) => NativeRequest::Served {
                    message: message(&body),
                    keep_alive,
                    used: input.len() - buf.len(),
                },
                Step::More(_) => NativeRequest::UnfinishedBody {
                    message: message(b""),
                },
                Step::Hyper => NativeRequest::Handoff,
            }
        }
    }
}

/// How a response body is delimited on the wire to the client (the decoder's
/// counterpart is `http1::Framing`, which also carries where a decode has got to).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Encoding {
    None,
    Length(u64),
    Chunked,
    UntilClose,
}

/// Write `response`; `Ok(true)` when the connection may carry another request.
async fn respond(
    io: &mut Watched<TcpStream>,
    head: &mut Vec<u8>,
    response: Response<ResponseBody>,
    version: Version,
    head_request: bool,
    close: bool,
) -> io::Result<bool> {
    let (mut parts, mut body) = response.into_parts();
    let exact = body.size_hint().exact();
    let raw = body.take_raw_fields();
    let (framing, length) = match &raw {
        // A pod's fields as it sent them: checked when they were read (`http1/mod.rs`).
        Some(raw) => framing(parts.status, raw.length, exact, version, head_request),
        None => map_framing(&mut parts, exact, version, head_request),
    };
    let close = close || framing == Encoding::UntilClose;
    let fields = match &raw {
        Some(raw) => Fields::Raw(raw),
        None => Fields::Map(&parts.headers),
    };
    encode_head(head, &parts, fields, length, version, close);
    crate::spare::give_back(std::mem::take(&mut parts.headers));
    let mut body = Pin::new(&mut body);
    if framing == Encoding::None {
        write_all(io, &mut [IoSlice::new(head)]).await?;
        return Ok(!close);
    }
    let mut head_sent = false;
    let mut sent: u64 = 0;
    loop {
        // The first frame goes out with the head when it is already there; if not, the
        // head goes alone at once (a slow body must not hold back the status).
        let frame = if head_sent {
            std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await
        } else {
            match std::future::poll_fn(|cx| Poll::Ready(body.as_mut().poll_frame(cx))).await {
                Poll::Ready(frame) => frame,
                Poll::Pending => {
                    write_all(io, &mut [IoSlice::new(head)]).await?;
                    head_sent = true;
                    continue;
                }
            }
        };
        let head_part: &[u8] = if head_sent { &[] } else { head };
        match frame {
            None => {
                let ending: &[u8] = if framing == Encoding::Chunked {
                    b"0\r\n\r\n"
                } else {
                    b""
                };
                write_all(io, &mut [IoSlice::new(head_part), IoSlice::new(ending)]).await?;
                let short = matches!(framing, Encoding::Length(n) if n != sent);
                return Ok(!close && !short);
            }
            Some(Err(_)) => {
                // Cut off: the client must not take what it got for the whole answer.
                if !head_sent {
                    write_all(io, &mut [IoSlice::new(head_part)]).await?;
                }
                return Ok(false);
            }
            Some(Ok(frame)) => {
                let Ok(data) = frame.into_data() else {
                    continue; // trailers: dropped (see the module docs)
                };
                if data.is_empty() {
                    continue;
                }
                let len = data.len() as u64;
                if let Encoding::Length(n) = framing {
                    if sent + len > n {
                        // More than the length said: what fits goes, then the close.
                        let fits = usize::try_from(n - sent).unwrap_or(0);
                        write_all(
                            io,
                            &mut [IoSlice::new(head_part), IoSlice::new(&data[..fits])],
                        )
                        .await?;
                        return Ok(false);
                    }
                }
                if !head_sent && data.len() <= COALESCED_BODY_LIMIT {
                    // One `send` of head and body: cheaper in the kernel than a `writev`
                    // of the two, and for small bodies than the copy it takes.
                    if framing == Encoding::Chunked {
                        write!(head, "{len:x}\r\n")?;
                        head.extend_from_slice(&data);
                        head.extend_from_slice(b"\r\n");
                    } else {
                        head.extend_from_slice(&data);
                    }
                    write_all(io, &mut [IoSlice::new(head)]).await?;
                } else if framing == Encoding::Chunked {
                    let mut size = [0; CHUNK_SIZE_LINE];
                    let size = chunk_size_line(len, &mut size);
                    write_all(
                        io,
                        &mut [
                            IoSlice::new(head_part),
                            IoSlice::new(size),
                            IoSlice::new(&data),
                            IoSlice::new(b"\r\n"),
                        ],
                    )
                    .await?;
                } else {
                    write_all(io, &mut [IoSlice::new(head_part), IoSlice::new(&data)]).await?;
                }
                head_sent = true;
                sent += len;
            }
        }
    }
}

/// Longest chunk-size line: 16 hex digits and CRLF.
const CHUNK_SIZE_LINE: usize = 18;

/// `len` in hex and CRLF, a chunk's size line (RFC 9112 §7.1), written into `buf`
/// rather than a new string per frame.
fn chunk_size_line(len: u64, buf: &mut [u8; CHUNK_SIZE_LINE]) -> &[u8] {
    let mut cursor = io::Cursor::new(&mut buf[..]);
    // Cannot fail: a u64 has at most 16 hex digits.
    let _ = write!(cursor, "{len:x}\r\n");
    let written = usize::try_from(cursor.position()).unwrap_or(0);
    &buf[..written]
}

/// What the response's framing asks of its length fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LengthField {
    /// Left as they are.
    Keep,
    /// Any `content-length` replaced by this one (the body's exact size).
    Set(u64),
    /// Any `content-length` removed; `transfer-encoding: chunked` added.
    Chunked,
    /// Any `content-length` removed.
    Drop,
}

/// How a body goes on the wire to a client speaking `version`, and what that asks of
/// the length fields: `declared` is the response's valid `Content-Length` (pods'
/// answers arrive with theirs checked and merged, `http1/mod.rs`; the proxy's own have none),
/// `exact` the body's size if it is known.
fn framing(
    status: StatusCode,
    declared: Option<u64>,
    exact: Option<u64>,
    version: Version,
    head_request: bool,
) -> (Encoding, LengthField) {
    let no_body_status = crate::http1::bodiless(status);
    if declared.is_none() && !no_body_status {
        // The length the body has, if it is known (a HEAD answer says what a GET's would).
        if let Some(exact) = exact {
            if !(head_request && exact == 0) {
                let framing = if head_request {
                    Encoding::None
                } else {
                    Encoding::Length(exact)
                };
                return (framing, LengthField::Set(exact));
            }
        }
    }
    if head_request || no_body_status {
        return (Encoding::None, LengthField::Keep);
    }
    match declared {
        Some(n) => (Encoding::Length(n), LengthField::Keep),
        None if version == Version::HTTP_11 => (Encoding::Chunked, LengthField::Chunked),
        None => (Encoding::UntilClose, LengthField::Drop),
    }
}

/// [`framing`] for a response whose fields are in its map: `Transfer-Encoding` (the
/// pod's coding, already decoded) and any length field the framing replaces are taken
/// out of the map; [`encode_head`] writes the new ones.
fn map_framing(
    parts: &mut http::response::Parts,
    exact: Option<u64>,
    version: Version,
    head_request: bool,
) -> (Encoding, LengthField) {
    // One scan of the (few) names says which of the lookups below are needed.
    let (mut coded, mut length) = (false, false);
    for name in parts.headers.keys() {
        coded |= name == TRANSFER_ENCODING;
        length |= name == CONTENT_LENGTH;
    }
    if coded {
        parts.headers.remove(TRANSFER_ENCODING);
    }
    let declared = match length {
        true => crate::http1::content_length(&mut parts.headers)
            .ok()
            .flatten(),
        false => None,
    };
    let (framing, field) = framing(parts.status, declared, exact, version, head_request);
    if length && field != LengthField::Keep {
        parts.headers.remove(CONTENT_LENGTH);
    }
    (framing, field)
}

/// A response's header fields, as a map or as the pod sent them.
enum Fields<'a> {
    Map(&'a HeaderMap),
    Raw(&'a RawFields),
}

/// The status line and header fields, with `connection`, `date` and the length
/// fields the framing asks for.
fn encode_head(
    out: &mut Vec<u8>,
    parts: &http::response::Parts,
    fields: Fields<'_>,
    length: LengthField,
    version: Version,
    close: bool,
) {
    out.clear();
    if let Fields::Raw(raw) = fields {
        // Status line and the tail take less than 160 bytes.
        out.reserve(raw.len() + 160);
    }
    out.extend_from_slice(if version == Version::HTTP_10 {
        b"HTTP/1.0 "
    } else {
        b"HTTP/1.1 "
    });
    out.extend_from_slice(parts.status.as_str().as_bytes());
    out.push(b' ');
    match parts.extensions.get::<hyper::ext::ReasonPhrase>() {
        Some(reason) => out.extend_from_slice(reason.as_bytes()),
        None => out.extend_from_slice(
            parts
                .status
                .canonical_reason()
                .unwrap_or_default()
                .as_bytes(),
        ),
    }
    out.extend_from_slice(b"\r\n");
    let dated = match fields {
        Fields::Raw(raw) => {
            for lines in raw.lines() {
                out.extend_from_slice(lines);
            }
            raw.dated
        }
        Fields::Map(headers) => {
            let mut dated = false;
            for (name, value) in headers {
                if name == CONNECTION {
                    continue;
                }
                dated |= name == DATE;
                out.extend_from_slice(name.as_str().as_bytes());
                out.extend_from_slice(b": ");
                out.extend_from_slice(value.as_bytes());
                out.extend_from_slice(b"\r\n");
            }
            dated
        }
    };
    match length {
        LengthField::Set(n) => {
            let _ = write!(out, "content-length: {n}\r\n");
        }
        LengthField::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        LengthField::Keep | LengthField::Drop => {}
    }
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    } else if version == Version::HTTP_10 {
        out.extend_from_slice(b"connection: keep-alive\r\n");
    }
    if !dated {
        out.extend_from_slice(b"date: ");
        with_date(|date| out.extend_from_slice(date));
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

thread_local! {
    /// The second last formatted, and its IMF-fixdate.
    static HTTP_DATE: RefCell<(u64, [u8; 29])> = const { RefCell::new((u64::MAX, [0; 29])) };
}

/// Call `then` with the current date as an HTTP date (RFC 9110 §5.6.7).
///
/// Formatted by `httpdate` once a second per thread and kept: no crate offers the cache
/// (hyper keeps one, private to its own server). Measured on this machine (load 0.1, a
/// loop of 5 million answers, release build, 2026-11-28): 43–46 ns per answer with the
/// cache, most of it the clock read, against 131–142 ns formatting each time; the
/// ~90 ns saved is about 0.8% of a proxied request's CPU (11.8 µs, `benches/README.md`).
fn with_date(then: impl FnOnce(&[u8])) {
    let now = SystemTime::now();
    let second = now
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    HTTP_DATE.with(|cached| {
        let mut cached = cached.borrow_mut();
        if cached.0 != second {
            let formatted = httpdate::fmt_http_date(now);
            let bytes = formatted.as_bytes();
            if bytes.len() == cached.1.len() {
                cached.1.copy_from_slice(bytes);
                cached.0 = second;
            }
        }
        then(&cached.1);
    });
}

/// The largest first body frame that is copied behind the response head so that both go
/// in one `send`: a `writev` costs about 300 ns more in the kernel than a `send`
/// (`benches/README.md`, tenth round), several times what copying 4 KiB costs.
const COALESCED_BODY_LIMIT: usize = 4096;

/// Write every byte of `bufs` (empty ones are skipped): a lone buffer with `send`, more
/// with `writev`.
async fn write_all(io: &mut Watched<TcpStream>, bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
    let mut bufs = &mut bufs[..];
    IoSlice::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        let n = if bufs.len() == 1 || bufs[1..].iter().all(|b| b.is_empty()) {
            let only: &[u8] = &bufs[0];
            std::future::poll_fn(|cx| Pin::new(&mut *io).poll_write(cx, only)).await?
        } else {
            std::future::poll_fn(|cx| Pin::new(&mut *io).poll_write_vectored(cx, bufs)).await?
        };
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut bufs, n);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use http::HeaderMap;

    use super::*;

    fn parse(head: &[u8]) -> (Parse, BytesMut) {
        let mut buf = BytesMut::from(head);
        let parsed = parse_request(&mut buf, 100, &mut Vec::new(), &SERVICE_HEADER);
        (parsed, buf)
    }

    #[test]
    fn a_bodyless_request_is_native_and_leaves_what_follows() {
        let (parsed, rest) =
            parse(b"GET /a?b=1 HTTP/1.1\r\nHost: svc\r\nX-Service: bench\r\n\r\nGET /next");
        let Parse::Request(native) = parsed else {
            panic!("not native")
        };
        assert!(native.keep_alive);
        let request = native.request;
        assert_eq!(request.method(), Method::GET);
        assert_eq!(request.uri(), "/a?b=1");
        assert_eq!(request.version(), Version::HTTP_11);
        assert_eq!(request.headers()["x-service"], "bench");
        assert_eq!(request.headers()["host"], "svc");
        assert_eq!(&rest[..], b"GET /next");
    }

    #[test]
    fn a_configured_service_header_is_recognised_in_any_case() {
        let mut buf = BytesMut::from(&b"GET / HTTP/1.1\r\nX-Target: a\r\nx-targets: b\r\n\r\n"[..]);
        let known = HeaderName::from_static("x-target");
        let Parse::Request(native) = parse_request(&mut buf, 100, &mut Vec::new(), &known) else {
            panic!("not native")
        };
        let headers = native.request.headers();
        assert_eq!(headers.len(), 2);
        assert_eq!(headers["x-target"], "a");
        assert_eq!(headers["x-targets"], "b");
    }

    #[test]
    fn persistence_follows_the_version_and_connection() {
        for (head, keep) in [
            (&b"GET / HTTP/1.0\r\n\r\n"[..], false),
            (b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", true),
            (b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n", false),
            (b"GET / HTTP/1.1\r\nContent-Length: 0\r\n\r\n", true),
            // A value with obs-text is no list of tokens: its keep-alive does not count,
            // its close does (closing is always allowed).
            (
                b"GET / HTTP/1.0\r\nConnection: \xe9close, keep-alive\r\n\r\n",
                false,
            ),
            (b"GET / HTTP/1.1\r\nConnection: \xe9x, close\r\n\r\n", false),
        ] {
            let Parse::Request(native) = parse(head).0 else {
                panic!("{head:?} not native")
            };
            assert_eq!(native.keep_alive, keep, "{head:?}");
        }
    }

    /// A GET head with `n` header fields.
    fn head_with_fields(n: usize) -> String {
        let mut head = String::from("GET / HTTP/1.1\r\n");
        for i in 0..n {
            head.push_str(&format!("h{i}: v\r\n"));
        }
        head.push_str("\r\n");
        head
    }

    #[test]
    fn bodies_switches_and_oddities_go_to_hyper_with_nothing_consumed() {
        for head in [
            &b"POST / HTTP/1.1\r\nContent-Length: 16385\r\n\r\nabc"[..],
            b"POST / HTTP/1.1\r\nContent-Length: 3, 3\r\n\r\nabc",
            b"POST / HTTP/1.1\r\nContent-Length: +3\r\n\r\nabc",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
            b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"GET / HTTP/1.1\r\nContent-Length: 0\r\nContent-Length: 0\r\n\r\n",
            b"GET / HTTP/1.1\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
            b"GET / HTTP/1.1\r\nExpect: 100-continue\r\n\r\n",
            b"POST / HTTP/1.1\r\nExpect: 100-continue, x\r\nContent-Length: 3\r\n\r\nabc",
            b"POST / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc",
            b"POST / HTTP/1.1\r\nExpect: 100-continue\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc",
            b"GET / HTTP/1.1\r\nTE: trailers\r\n\r\n",
            b"CONNECT svc:80 HTTP/1.1\r\n\r\n",
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        ] {
            let (parsed, rest) = parse(head);
            assert!(matches!(parsed, Parse::NotNative), "{head:?}");
            assert_eq!(&rest[..], head, "bytes kept for hyper");
        }
        // What httparse refuses is refused here (400), not left to hyper.
        for head in [
            &b"GET / HTTP/1.1\r\nBad Header: x\r\n\r\n"[..],
            b"GET /\x7f HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1\rHost: a\r\r",
            b"GET / HTTP/1.1\r\nHost: a\rX: b\r\r",
        ] {
            assert!(matches!(parse(head).0, Parse::Invalid), "{head:?}");
        }
        // Refused only after the split (the target is too long for `http`): given back.
        let long = format!("GET /{} HTTP/1.1\r\n\r\nGET /next", "u".repeat(70_000));
        let (parsed, rest) = parse(long.as_bytes());
        assert!(matches!(parsed, Parse::NotNative));
        assert!(rest[..] == *long.as_bytes(), "bytes given back for hyper");
        assert!(matches!(
            parse(b"GET / HTTP/1.1\r\nHost: a").0,
            Parse::Partial
        ));
        // More fields than the first parse has slots for, fewer than the limit: native.
        let hundred = head_with_fields(100);
        let mut buf = BytesMut::from(hundred.as_bytes());
        let Parse::Request(native) = parse_request(&mut buf, 800, &mut Vec::new(), &SERVICE_HEADER)
        else {
            panic!("100 fields under a limit of 800 not native")
        };
        assert_eq!(native.request.headers().len(), 100);
        let mut buf = BytesMut::from(hundred.as_bytes());
        assert!(matches!(
            parse_request(&mut buf, 99, &mut Vec::new(), &SERVICE_HEADER),
            Parse::NotNative
        ));
        // More fields than a `HeaderMap` holds: hyper's to refuse, every byte kept.
        let many = head_with_fields(33_000);
        let mut buf = BytesMut::from(many.as_bytes());
        let parsed = parse_request(&mut buf, 40_000, &mut Vec::new(), &SERVICE_HEADER);
        assert!(matches!(parsed, Parse::NotNative));
        assert!(buf[..] == *many.as_bytes());
    }

    /// The body the loop reads for `input`'s first request, and the bytes left after it.
    fn body_of(input: &[u8]) -> Option<(String, usize)> {
        match parse_request_for_differential(input, 100) {
            NativeRequest::Served { message, used, .. } => Some((message.body, input.len() - used)),
            _ => None,
        }
    }

    #[test]
    fn small_bodies_are_read_whole_and_the_next_request_starts_where_they_end() {
        let next = b"GET /next HTTP/1.1\r\n\r\n";
        for (request, body) in [
            (&b"POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc"[..], "abc"),
            (b"POST / HTTP/1.0\r\nContent-Length: 003\r\n\r\nabc", "abc"),
            (
                b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2;x=y\r\nab\r\n1\r\nc\r\n0\r\n\r\n",
                "abc",
            ),
            (b"POST / HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n0\r\n\r\n", ""),
            (
                b"PUT / HTTP/1.1\r\nExpect: 100-Continue\r\nContent-Length: 3\r\n\r\nabc",
                "abc",
            ),
        ] {
            let mut input = request.to_vec();
            input.extend_from_slice(next);
            assert_eq!(
                body_of(&input),
                Some((body.to_string(), next.len())),
                "{:?}",
                request.escape_ascii().to_string()
            );
        }
        // A body not all there yet: the loop reads on.
        let partial = b"POST / HTTP/1.1\r\nContent-Length: 4\r\n\r\nabc";
        assert!(matches!(
            parse_request_for_differential(partial, 100),
            NativeRequest::UnfinishedBody { .. }
        ));
        // Trailer fields, a malformed chunk, an encoding over the limit: hyper's, whole.
        let long = format!(
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{}\r\n0\r\n\r\n",
            WHOLE_BODY_LIMIT + 1,
            "x".repeat(WHOLE_BODY_LIMIT + 1)
        );
        for input in [
            &b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\nX-T: 1\r\n\r\n"
                [..],
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            long.as_bytes(),
        ] {
            assert!(matches!(
                parse_request_for_differential(input, 100),
                NativeRequest::Handoff
            ));
        }
    }

    fn framed(
        status: u16,
        headers: &[(&str, &str)],
        body: &[u8],
        version: Version,
        head_request: bool,
    ) -> (Encoding, HeaderMap) {
        let mut response = Response::new(ResponseBody::full(Bytes::copy_from_slice(body)));
        *response.status_mut() = StatusCode::from_u16(status).unwrap();
        for (name, value) in headers {
            response.headers_mut().append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        let (mut parts, body) = response.into_parts();
        let (framing, length) =
            map_framing(&mut parts, body.size_hint().exact(), version, head_request);
        let mut out = Vec::new();
        encode_head(
            &mut out,
            &parts,
            Fields::Map(&parts.headers),
            length,
            version,
            false,
        );
        (framing, written_fields(&out))
    }

    /// The header fields of a written head.
    fn written_fields(head: &[u8]) -> HeaderMap {
        let mut slots = [httparse::EMPTY_HEADER; 32];
        let mut response = httparse::Response::new(&mut slots);
        assert!(response.parse(head).unwrap().is_complete());
        let mut map = HeaderMap::new();
        for field in response.headers.iter() {
            map.append(
                HeaderName::from_bytes(field.name.as_bytes()).unwrap(),
                HeaderValue::from_bytes(field.value).unwrap(),
            );
        }
        map
    }

    #[test]
    fn a_chunk_size_line_is_hex_and_crlf_up_to_the_largest_size() {
        let mut buf = [0; CHUNK_SIZE_LINE];
        assert_eq!(chunk_size_line(0, &mut buf), b"0\r\n");
        assert_eq!(chunk_size_line(4097, &mut buf), b"1001\r\n");
        assert_eq!(chunk_size_line(u64::MAX, &mut buf), b"ffffffffffffffff\r\n");
    }

    #[test]
    fn the_response_framing_follows_rfc_9112() {
        let v11 = Version::HTTP_11;
        let (f, h) = framed(200, &[], b"hello", v11, false);
        assert_eq!(
            (f, h["content-length"].as_bytes()),
            (Encoding::Length(5), &b"5"[..])
        );
        let (f, h) = framed(200, &[("content-length", "5")], b"hello", v11, true);
        assert_eq!(
            (f, h["content-length"].as_bytes()),
            (Encoding::None, &b"5"[..])
        );
        let (f, h) = framed(200, &[], b"hello", v11, true);
        assert_eq!(
            (f, h["content-length"].as_bytes()),
            (Encoding::None, &b"5"[..])
        );
        let (f, h) = framed(204, &[], b"", v11, false);
        assert_eq!(f, Encoding::None);
        assert!(!h.contains_key("content-length"));
        let (f, h) = framed(304, &[("content-length", "9")], b"", v11, false);
        assert_eq!(
            (f, h["content-length"].as_bytes()),
            (Encoding::None, &b"9"[..])
        );
        let (f, _) = framed(200, &[("content-length", "5")], b"hello", v11, false);
        assert_eq!(f, Encoding::Length(5));
        let (f, h) = framed(200, &[("transfer-encoding", "chunked")], b"hi", v11, false);
        assert_eq!(
            (f, h["content-length"].as_bytes()),
            (Encoding::Length(2), &b"2"[..])
        );
        assert!(!h.contains_key("transfer-encoding"));
    }

    #[test]
    fn a_head_has_its_status_line_connection_and_date() {
        let mut response = Response::new(ResponseBody::full(Bytes::new()));
        *response.status_mut() = StatusCode::NOT_FOUND;
        response
            .headers_mut()
            .insert("x-a", HeaderValue::from_static("1"));
        let (parts, _) = response.into_parts();
        let mut out = Vec::new();
        let fields = || Fields::Map(&parts.headers);
        encode_head(
            &mut out,
            &parts,
            fields(),
            LengthField::Keep,
            Version::HTTP_10,
            false,
        );
        let text = String::from_utf8(out.clone()).unwrap();
        assert!(
            text.starts_with(
                "HTTP/1.0 404 Not Found\r\nx-a: 1\r\nconnection: keep-alive\r\ndate: "
            ),
            "{text}"
        );
        assert!(text.ends_with(" GMT\r\n\r\n"), "{text}");
        encode_head(
            &mut out,
            &parts,
            fields(),
            LengthField::Keep,
            Version::HTTP_11,
            true,
        );
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("\r\nconnection: close\r\n"), "{text}");
    }

    #[test]
    fn a_pods_fields_pass_raw_in_their_order_and_case_without_its_connection_fields() {
        let pod = b"HTTP/1.1 200 OK\r\nServer: pod\r\nConnection: keep-alive\r\nX-Multi: a\r\n\
                    Keep-Alive: timeout=5\r\nx-multi: b\r\nContent-Length: 2\r\n\r\n";
        let raw = crate::http1::raw_fields_of(pod).expect("kept raw");
        assert_eq!(raw.length, Some(2));
        let mut response = Response::new(ResponseBody::full(Bytes::new()));
        *response.status_mut() = StatusCode::OK;
        let (parts, _) = response.into_parts();
        let mut out = Vec::new();
        let (framed, length) = framing(parts.status, raw.length, None, Version::HTTP_11, false);
        assert_eq!((framed, length), (Encoding::Length(2), LengthField::Keep));
        encode_head(
            &mut out,
            &parts,
            Fields::Raw(&raw),
            length,
            Version::HTTP_11,
            false,
        );
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.starts_with(
                "HTTP/1.1 200 OK\r\nServer: pod\r\nX-Multi: a\r\nx-multi: b\r\n\
                 Content-Length: 2\r\ndate: "
            ),
            "{text}"
        );
        assert!(text.ends_with(" GMT\r\n\r\n"), "{text}");

        // A pod's own date is kept; a length the framing sets is written after the
        // fields; the close is said.
        let pod = b"HTTP/1.0 200 OK\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\n\r\n";
        let raw = crate::http1::raw_fields_of(pod).expect("kept raw");
        let (framed, length) = framing(parts.status, raw.length, Some(5), Version::HTTP_10, false);
        assert_eq!((framed, length), (Encoding::Length(5), LengthField::Set(5)));
        let mut out = Vec::new();
        encode_head(
            &mut out,
            &parts,
            Fields::Raw(&raw),
            length,
            Version::HTTP_10,
            true,
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.0 200 OK\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\n\
             content-length: 5\r\nconnection: close\r\n\r\n"
        );
    }
}
