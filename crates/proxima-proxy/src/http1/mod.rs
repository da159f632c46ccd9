//! The proxy's own HTTP/1.1 exchange with a pod, for requests without a body.
//!
//! Most requests through an edge proxy carry no body (GETs from devices, probes). For
//! them the proxy writes the request head and reads the response in the requesting
//! task, on a plain socket taken from the pool, instead of going through hyper's client
//! connection. hyper's client hands every request to a connection task over a channel
//! and wakes that task for each step; measured on this machine (`benches/README.md`,
//! fourth round) that dispatch cost about 3 µs of CPU per request, and every idle
//! connection it drove kept two 8 KiB buffers and a task. Here an idle connection is
//! only its socket (a "parked" one in `upstream/pool.rs`), and a response is read into one
//! buffer that its body frames share. Requests with a body keep going through hyper,
//! whose request-body streaming (chunked uploads, `Expect`) is not repeated here.
//!
//! What is read follows RFC 9112:
//!
//! * the status line and header fields (§4, §5) with `httparse`, at most
//!   `max-response-headers` fields and [`MAX_HEAD_BYTES`] bytes, else the response is
//!   a protocol error;
//! * interim `1xx` responses (RFC 9110 §15.2) are read and dropped; `101` is an error,
//!   since the proxy never asks for an upgrade (it drops `Upgrade` headers);
//! * the body length (§6.3): none for `HEAD`, `1xx`, `204` and `304`;
//!   `Transfer-Encoding` wins over `Content-Length`, which is then removed (chunked, or
//!   read until close if it names no coding); a coding other than chunked (gzip, ...)
//!   is an error, since the client would get it undeclared once the hop-by-hop header
//!   is taken off; differing or malformed `Content-Length` values are an error, never
//!   guessed at; with neither, the body runs until the pod closes;
//! * chunked framing (§7.1), with chunk extensions ignored and trailers passed on as a
//!   trailers frame; a malformed size line, a missing CRLF after a chunk, or an
//!   overlong line or trailer section is an error;
//! * persistence (§9.3): the connection goes back to the pool only if the response
//!   was read to its end, allows keep-alive (HTTP/1.1 without `close`, HTTP/1.0 with
//!   `keep-alive`), was not delimited by the close, and nothing followed it.
//!
//! The exchange borrows the request, so that a connection that turns out dead before
//! any response (a pod that closed it while idle) leaves the request to be sent again;
//! [`H1Error::nothing_sent`] and [`H1Error::died_before_response`] tell the cases apart
//! for `forward.rs`.

pub(crate) mod serve;

use std::cell::Cell;
use std::io;
use std::mem::MaybeUninit;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, DATE, TRANSFER_ENCODING};

use crate::forward::headers::{
    connection_options, is_hop_by_hop_name, ConnectionOptions, KEEP_ALIVE, PROXY_CONNECTION,
};
use http::response::Parts;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Version};
use http_body::{Frame, SizeHint};
use tokio::io::Interest;
use tokio::net::TcpStream;

/// The most bytes a response head may take: what hyper's client allowed, so that pods
/// that worked behind it keep working.
pub(crate) const MAX_HEAD_BYTES: usize = 8192 + 4096 * 100;
/// The most bytes of a chunk-size line (extensions included).
const MAX_CHUNK_LINE: usize = 4096;
/// The most bytes of a chunked body's trailer section.
const MAX_TRAILER_BYTES: usize = 64 * 1024;
/// The most trailer fields.
const MAX_TRAILERS: usize = 64;
/// Header slots kept on the stack while a head is parsed (uninitialised, so free);
/// a larger `max-response-headers` takes them from the heap.
const STACK_HEADER_SLOTS: usize = 512;
/// Room made in the read buffer before each read.
const READ_SIZE: usize = 8 * 1024;
/// The same while a long body streams.
const BODY_READ_SIZE: usize = 32 * 1024;

/// Why an exchange with a pod failed, through hyper's client or the proxy's own.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// Through hyper's client (requests with a body).
    #[error(transparent)]
    Hyper(#[from] hyper::Error),
    /// Through the proxy's own exchange (requests without one).
    #[error(transparent)]
    Native(#[from] H1Error),
}

/// Why a native exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum H1Error {
    /// Nothing of the request was written.
    #[error("the connection failed before any byte of the request was written: {0}")]
    NotWritten(#[source] io::Error),
    /// Part of the request was written.
    #[error("writing the request failed: {0}")]
    Write(#[source] io::Error),
    /// The pod closed the connection without answering.
    #[error("the connection closed before a response")]
    ClosedBeforeResponse,
    /// The pod closed the connection part way through the response head.
    #[error("the connection closed in the middle of the response head")]
    IncompleteHead,
    /// The connection failed while the response was read.
    #[error("reading the response failed: {0}")]
    Read(#[source] io::Error),
    /// The response head is not HTTP/1.x.
    #[error("invalid response head: {0}")]
    Parse(httparse::Error),
    /// The pod answered with an HTTP/2 frame: its port speaks HTTP/2 but is not declared
    /// h2c.
    #[error("the pod answered in HTTP/2: declare its port h2c (appProtocol kubernetes.io/h2c or grpc, or a port name grpc-*, h2c-*, http2-*)")]
    Http2Answer,
    /// The response head is larger than [`MAX_HEAD_BYTES`].
    #[error("the response head is larger than {MAX_HEAD_BYTES} bytes")]
    HeadTooLarge,
    /// The response head has more fields than allowed.
    #[error("the response has more than {0} header fields")]
    TooManyHeaders(usize),
    /// The status code is outside 100–999.
    #[error("invalid response status {0}")]
    Status(u16),
    /// A field name or value is invalid.
    #[error("invalid response header field {0:?}")]
    Header(String),
    /// `Content-Length` is malformed or given twice with different values.
    #[error("invalid or conflicting content-length")]
    ContentLength,
    /// `101 Switching Protocols` without an upgrade asked for.
    #[error("101 Switching Protocols, but no upgrade was asked for")]
    UnaskedSwitch,
    /// A transfer coding other than chunked, which the client could not be told of.
    #[error("unsupported transfer coding {0:?}")]
    TransferCoding(String),
    /// The chunked framing is broken.
    #[error("invalid chunked body: {0}")]
    Chunked(&'static str),
    /// The connection closed before the body's declared end.
    #[error("the connection closed before the end of the body")]
    BodyCut,
}

impl H1Error {
    /// Nothing of the request reached the socket: it may go anywhere again.
    pub(crate) fn nothing_sent(&self) -> bool {
        matches!(self, H1Error::NotWritten(_))
    }

    /// The connection closed or was reset before a complete response head: what a pod
    /// closing an idle connection, racing with its reuse, looks like.
    pub(crate) fn died_before_response(&self) -> bool {
        match self {
            H1Error::NotWritten(_) | H1Error::ClosedBeforeResponse | H1Error::IncompleteHead => {
                true
            }
            H1Error::Write(e) | H1Error::Read(e) => is_connection_break(e),
            _ => false,
        }
    }

    /// The pod answered something that is not valid HTTP/1.1 (as opposed to a broken
    /// connection).
    pub(crate) fn is_protocol(&self) -> bool {
        matches!(
            self,
            H1Error::Parse(_)
                | H1Error::Http2Answer
                | H1Error::HeadTooLarge
                | H1Error::TooManyHeaders(_)
                | H1Error::Status(_)
                | H1Error::Header(_)
                | H1Error::ContentLength
                | H1Error::UnaskedSwitch
                | H1Error::TransferCoding(_)
                | H1Error::Chunked(_)
        )
    }
}

/// Whether an I/O error is the connection closing or being reset under the exchange
/// (what a pod closing an idle connection looks like), for either client.
pub(crate) fn is_connection_break(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::UnexpectedEof
    )
}

/// Send `req`'s head and `body` on `stream` and read the response head. `body` is the
/// whole of the request's body (none, or one read whole, whose length the head says):
/// `req`'s own body is not sent. The response body is read as it is polled.
pub(crate) async fn exchange<B>(
    stream: TcpStream,
    req: &Request<B>,
    body: &[u8],
    max_headers: usize,
) -> Result<Response<NativeBody>, H1Error> {
    // Head and body are written from the thread's scratch buffer in one write, the
    // buffer given back after it (a future dropped meanwhile just frees it).
    let mut head = HEAD_SCRATCH.with(Cell::take);
    encode_head(req, &mut head);
    head.extend_from_slice(body);
    let written = write_all(&stream, &head).await;
    if head.capacity() <= MAX_SCRATCH {
        head.clear();
        HEAD_SCRATCH.with(|scratch| scratch.set(head));
    }
    written?;
    let head_request = req.method() == Method::HEAD;
    // No buffer while the pod has not answered: an exchange that waits holds none.
    std::future::poll_fn(|cx| stream.poll_read_ready(cx))
        .await
        .map_err(H1Error::Read)?;
    let mut buf = READ_SPARE.with(Cell::take).unwrap_or_default();
    let mut drained = false;
    loop {
        let had = buf.len();
        let read =
            std::future::poll_fn(|cx| poll_fill(&stream, &mut buf, READ_SIZE, &mut drained, cx))
                .await;
        match read {
            Ok(0) if buf.is_empty() => return Err(H1Error::ClosedBeforeResponse),
            Ok(0) => return Err(H1Error::IncompleteHead),
            Ok(_) => {}
            Err(e) => return Err(H1Error::Read(e)),
        }
        if may_settle_head(&buf[had..]) {
            if let Some(head) = parse_head(&mut buf, max_headers, head_request)? {
                // What is left of the buffer (nothing, its allocation shared with the
                // head and body just split off) is the next exchange's: once those are
                // dropped, its `reserve` takes the allocation back instead of making one.
                READ_SPARE.with(|spare| spare.set(Some(buf)));
                return Ok(head.into_response(stream, drained));
            }
        }
        if buf.len() >= MAX_HEAD_BYTES {
            return Err(H1Error::HeadTooLarge);
        }
    }
}

thread_local! {
    /// A buffer for request heads, reused by the exchanges of the thread.
    static HEAD_SCRATCH: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
    /// The read buffer of the thread's last response head, for the next one (see
    /// `exchange`). Taken only once the pod's answer is there, so one usually serves
    /// every exchange of the thread in turn.
    static READ_SPARE: Cell<Option<BytesMut>> = const { Cell::new(None) };
}

/// Request heads larger than this do not keep their buffer for the next exchange.
const MAX_SCRATCH: usize = 16 * 1024;

/// The request line and header fields, as hyper's client writes them: origin-form
/// target, HTTP/1.1, fields in order; no `Transfer-Encoding`: a body that follows is
/// whole, and its `Content-Length` says how long.
fn encode_head<B>(req: &Request<B>, out: &mut Vec<u8>) {
    let target = req
        .uri()
        .path_and_query()
        .map(|pq| pq.as_str())
        .filter(|t| !t.is_empty())
        .unwrap_or("/");
    let method = req.method().as_str();
    let fields: usize = req
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum();
    // Request line: method, space, target, " HTTP/1.1\r\n"; the blank line at the end.
    out.reserve(method.len() + 1 + target.len() + 11 + fields + 2);
    out.extend_from_slice(method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in req.headers() {
        if name == TRANSFER_ENCODING {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

async fn write_all(stream: &TcpStream, data: &[u8]) -> Result<(), H1Error> {
    let mut written = 0;
    while written < data.len() {
        match stream.try_write(&data[written..]) {
            Ok(0) => return Err(H1Error::Write(io::ErrorKind::WriteZero.into())),
            Ok(n) => written += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                stream.writable().await.map_err(H1Error::Write)?;
            }
            Err(e) if written == 0 => return Err(H1Error::NotWritten(e)),
            Err(e) => return Err(H1Error::Write(e)),
        }
    }
    Ok(())
}

/// Read what the socket has into `buf`, making room for `room` bytes first if it has
/// less; `Ok(0)` is the end of the stream. `drained` tells whether the read took less
/// than there was room for, i.e. emptied the socket's receive queue.
pub(crate) fn poll_fill(
    stream: &TcpStream,
    buf: &mut BytesMut,
    room: usize,
    drained: &mut bool,
    cx: &mut Context<'_>,
) -> Poll<io::Result<usize>> {
    if buf.capacity() - buf.len() < room / 4 {
        buf.reserve(room);
    }
    let space = buf.capacity() - buf.len();
    loop {
        match stream.try_read_buf(buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => ready!(stream.poll_read_ready(cx))?,
            Ok(n) => {
                *drained = n < space;
                return Poll::Ready(Ok(n));
            }
            Err(e) => return Poll::Ready(Err(e)),
        }
    }
}

/// Forget that `stream` was readable, without a system call, when its last read
/// emptied its receive queue. tokio keeps a socket readable until a read finds it
/// empty, so the pool's check for a pod's close (a read that must say "would block")
/// would otherwise cost a system call on every reuse. Anything the pod sends later
/// (a close, stray bytes) arrives as a new readiness event, and a close already seen
/// is kept (tokio never clears it).
pub(crate) fn forget_readable(stream: &TcpStream) {
    let _ = stream.try_io(Interest::READABLE, || {
        Err::<(), _>(io::ErrorKind::WouldBlock.into())
    });
}

/// A final response head, parsed.
#[derive(Debug)]
struct Head {
    parts: Parts,
    framing: Framing,
    keep_alive: bool,
    /// What came after the head in the same reads: the start of the body.
    rest: Bytes,
    /// The fields as the pod sent them, when they can be passed on as they are; the
    /// map in `parts` is then empty (see [`RawFields`]).
    raw: Option<Box<RawFields>>,
}

impl Head {
    fn into_response(self, stream: TcpStream, drained: bool) -> Response<NativeBody> {
        let mut body = NativeBody::new(
            Some(stream),
            self.framing,
            self.keep_alive,
            self.rest,
            drained,
        );
        body.raw = self.raw;
        Response::from_parts(self.parts, body)
    }
}

/// Whether bytes just read may have completed a head or made it invalid: they hold a
/// control byte. A head ends with a line end, so it can only have become complete if
/// they hold one; and a bare CR (RFC 9112 §2.2), a NUL or another control byte makes
/// it invalid at once, which the parser says then, instead of the head's timeout
/// answering a request that will never end in a line end. Parsing only then keeps a
/// peer that sends its head a byte at a time from making the parse quadratic.
pub(crate) fn may_settle_head(new: &[u8]) -> bool {
    new.iter().any(|&b| b < 0x20 || b == 0x7f)
}

/// Parse the response head at the start of `buf`, skipping interim responses:
/// `None` while it is incomplete. On success `buf` is left empty (what followed the
/// head is in [`Head::rest`]).
///
/// The head's end is found first (its blank line), and the head is then split off,
/// frozen and parsed once, its header values sharing the frozen bytes.
fn parse_head(
    buf: &mut BytesMut,
    max_headers: usize,
    head_request: bool,
) -> Result<Option<Head>, H1Error> {
    let max_headers = max_headers.max(1);
    // No HTTP/1 status line starts with a zero byte; an HTTP/2 frame header does.
    if buf.first() == Some(&0) && is_http2_frame(buf) {
        return Err(H1Error::Http2Answer);
    }
    loop {
        let Some(end) = head_end(buf) else {
            // Incomplete (rare: heads nearly always come in one read), but one that is
            // already malformed fails now rather than when the pod stops sending.
            return parse_response(buf, max_headers, |_, parsed| match parsed {
                Ok(_) => Ok(None),
                Err(e) => Err(parse_error(e, max_headers)),
            });
        };
        let bytes = buf.split_to(end).freeze();
        let head = parse_response(&bytes, max_headers, |response, parsed| match parsed {
            // httparse ends a head at its first blank line, as `head_end` does.
            Ok(httparse::Status::Complete(len)) if len == end => {
                match response.code.unwrap_or_default() {
                    101 => Err(H1Error::UnaskedSwitch),
                    100..=199 => Ok(None),
                    _ => build_head(&bytes, response, head_request).map(Some),
                }
            }
            Ok(_) => Err(H1Error::Parse(httparse::Error::Status)),
            Err(e) => Err(parse_error(e, max_headers)),
        })?;
        if let Some(mut head) = head {
            head.rest = buf.split().freeze();
            return Ok(Some(head));
        }
        // An interim response (1xx): the final one follows.
    }
}

/// Whether `bytes` begin with an HTTP/2 frame header on stream 0 of the kinds a server
/// sends first: SETTINGS (its preface), or GOAWAY (its answer to an HTTP/1.1 request).
fn is_http2_frame(bytes: &[u8]) -> bool {
    const SETTINGS: u8 = 0x4;
    const GOAWAY: u8 = 0x7;
    bytes.len() >= 9 && matches!(bytes[3], SETTINGS | GOAWAY) && bytes[5..9] == [0, 0, 0, 0]
}

fn parse_error(error: httparse::Error, max_headers: usize) -> H1Error {
    match error {
        httparse::Error::TooManyHeaders => H1Error::TooManyHeaders(max_headers),
        error => H1Error::Parse(error),
    }
}

/// Where the head at the start of `buf` ends: just after its first blank line (`\n\n`
/// or `\n\r\n`), past any empty lines before the status line (which httparse skips).
fn head_end(buf: &[u8]) -> Option<usize> {
    let mut at = buf.iter().position(|&b| b != b'\r' && b != b'\n')?;
    // memchr, not a byte loop: finding the lines of nginx's response head took about
    // 1,000 instructions, memchr about 300 (`instructions.sh`: 26,246 -> 25,554 per
    // request).
    while let Some(i) = memchr::memchr(b'\n', &buf[at..]) {
        let next = at + i + 1;
        match &buf[next..] {
            [b'\n', ..] => return Some(next + 1),
            [b'\r', b'\n', ..] => return Some(next + 2),
            _ => at = next,
        }
    }
    None
}

/// Parse a response head from `bytes` into at most `max_headers` fields, and hand the
/// result to `then`. The field slots live on the stack for this call only.
fn parse_response<'b, R>(
    bytes: &'b [u8],
    max_headers: usize,
    then: impl FnOnce(&httparse::Response<'_, 'b>, httparse::Result<usize>) -> R,
) -> R {
    with_header_slots(max_headers, |slots| {
        let mut response = httparse::Response::new(&mut []);
        let parsed = httparse::ParserConfig::default().parse_response_with_uninit_headers(
            &mut response,
            bytes,
            slots,
        );
        then(&response, parsed)
    })
}

/// Call `then` with `max_headers` header slots for `httparse`: on the stack when they
/// fit there (nearly always), else on the heap for this call only.
pub(crate) fn with_header_slots<'b, R>(
    max_headers: usize,
    then: impl FnOnce(&mut [MaybeUninit<httparse::Header<'b>>]) -> R,
) -> R {
    let mut stack = [MaybeUninit::<httparse::Header<'b>>::uninit(); STACK_HEADER_SLOTS];
    let mut heap = Vec::new();
    let slots = if max_headers <= STACK_HEADER_SLOTS {
        &mut stack[..max_headers]
    } else {
        heap.reserve_exact(max_headers);
        &mut heap.spare_capacity_mut()[..max_headers]
    };
    then(slots)
}

/// The final response head in `bytes`, as parsed. What framing and persistence need
/// is noted while the fields are copied, so the map is not searched for it again; and
/// `Connection` (unless it lists other headers, which the hop-by-hop strip must then
/// find), `Keep-Alive` and `Proxy-Connection` describe only this connection and are
/// left out of the map (`headers.rs` would strip them).
fn build_head(
    bytes: &Bytes,
    response: &httparse::Response<'_, '_>,
    head_request: bool,
) -> Result<Head, H1Error> {
    let code = response.code.unwrap_or_default();
    let (mut parts, ()) = Response::new(()).into_parts();
    parts.status = StatusCode::from_u16(code).map_err(|_| H1Error::Status(code))?;
    parts.version = match response.version {
        Some(0) => Version::HTTP_10,
        _ => Version::HTTP_11,
    };
    if let Some(reason) = response.reason {
        // A reason phrase of the pod's own is passed on, as hyper's client did.
        if Some(reason) != parts.status.canonical_reason() {
            if let Ok(reason) =
                hyper::ext::ReasonPhrase::try_from(bytes.slice_ref(reason.as_bytes()))
            {
                parts.extensions.insert(reason);
            }
        }
    }
    // The fields stay raw when they can (the map is then empty and not looked at:
    // no coding and no length to check), else they are mapped.
    let (fields, mut headers, raw) = match RawFields::of(bytes, response) {
        Some((raw, connection)) => {
            let fields = FramingFields {
                transfer_encoding: false,
                content_length: raw
                    .length
                    .map_or(ContentLength::Absent, ContentLength::Single),
                connection,
            };
            (fields, HeaderMap::new(), Some(Box::new(raw)))
        }
        None => {
            let mut fields = FramingFields::default();
            let headers = field_map(bytes, response, &mut fields)?;
            (fields, headers, None)
        }
    };
    let (framing, delimited) = framing(&parts, &mut headers, &fields, head_request)?;
    parts.headers = headers;
    Ok(Head {
        keep_alive: delimited && fields.connection.persistent(parts.version),
        parts,
        framing,
        rest: Bytes::new(),
        raw,
    })
}

/// The header map of a head's `response` fields (values sharing `bytes`), noting in
/// `fields` what framing and persistence need. `Connection` (unless it lists other
/// headers), `Keep-Alive` and `Proxy-Connection` stay out of it.
fn field_map(
    bytes: &Bytes,
    response: &httparse::Response<'_, '_>,
    fields: &mut FramingFields,
) -> Result<HeaderMap, H1Error> {
    let mut headers = crate::spare::header_map(response.headers.len())
        .map_err(|_| H1Error::TooManyHeaders(response.headers.len()))?;
    for field in response.headers.iter() {
        let name = HeaderName::from_bytes(field.name.as_bytes())
            .map_err(|_| H1Error::Header(field.name.to_string()))?;
        if name == CONNECTION {
            let options = connection_options(field.value);
            fields.connection.close |= options.close;
            fields.connection.keep_alive |= options.keep_alive;
            if !options.names_other_headers {
                continue;
            }
        } else if name == KEEP_ALIVE || name == PROXY_CONNECTION {
            continue;
        } else if name == TRANSFER_ENCODING {
            fields.transfer_encoding = true;
        } else if name == CONTENT_LENGTH {
            fields.content_length = match fields.content_length {
                // The usual single plain value is read here; lists and repeats are
                // checked on the map (`content_length`).
                ContentLength::Absent => parse_length(field.value.trim_ascii())
                    .map_or(ContentLength::Check, ContentLength::Single),
                _ => ContentLength::Check,
            };
        }
        let value = HeaderValue::from_maybe_shared(bytes.slice_ref(field.value))
            .map_err(|_| H1Error::Header(field.name.to_string()))?;
        headers.append(name, value);
    }
    Ok(headers)
}

/// Which of the fields that decide a response's framing it has (noted while parsing).
#[derive(Default)]
struct FramingFields {
    transfer_encoding: bool,
    content_length: ContentLength,
    connection: ConnectionOptions,
}

/// A response's `Content-Length` fields, as noted while parsing.
#[derive(Clone, Copy, Default)]
enum ContentLength {
    #[default]
    Absent,
    /// One field with one valid length.
    Single(u64),
    /// Several fields, a list or an invalid value: [`content_length`] decides.
    Check,
}

/// Runs of field lines a [`RawFields`] holds at most; a head whose kept lines are split
/// into more (many dropped fields between them) is mapped instead.
const MAX_RAW_RUNS: usize = 4;
/// Fields a [`RawFields`] holds at most: any header map can take them.
const MAX_RAW_FIELDS: usize = 256;

/// A response head's fields kept as the pod sent them, for the proxy's own client loop
/// (`http1/serve.rs`) to write as they are: nearly every response is passed on with its
/// fields unchanged, and building a header map from them, searching it for framing,
/// writing it out and clearing it cost more than the rest of reading and writing the
/// head. Only the connection's own fields are left out (`Connection`, `Keep-Alive`,
/// `Proxy-Connection`), as the map would leave them.
///
/// A head is kept raw only when nothing in it needs the map's treatment: every line
/// ends in CRLF; no `Transfer-Encoding`, `TE`, `Trailer`, `Upgrade`,
/// `Proxy-Authenticate` or `Proxy-Authorization` (hop-by-hop fields that the strip
/// removes); no `Connection` that lists other headers; at most one `Content-Length`,
/// with one valid value; names a header map would take (httparse takes the value bytes
/// a `HeaderValue` takes: tab, visible ASCII, obs-text). Any other head is
/// mapped as before, and so are raw ones that go to hyper's server ([`Self::to_map`]).
#[derive(Debug)]
pub(crate) struct RawFields {
    /// The head as received, status line to blank line.
    head: Bytes,
    /// The field lines to pass on, as byte ranges of `head` (each a run of whole lines).
    runs: [(u32, u32); MAX_RAW_RUNS],
    run_count: u8,
    /// Fields in the head, for parsing it again.
    fields: u16,
    /// The pod sent a `Date`.
    pub(crate) dated: bool,
    /// The pod's `Content-Length`, if it sent one.
    pub(crate) length: Option<u64>,
}

/// How [`RawFields::of`] treats a field, by its name.
enum RawName {
    Pass,
    Date,
    ContentLength,
    Connection,
    /// `Keep-Alive`, `Proxy-Connection`: left out.
    Drop,
    /// A field the map's treatment is needed for.
    Map,
}

impl RawName {
    fn of(name: &str) -> Self {
        let is = |known: &HeaderName| name.eq_ignore_ascii_case(known.as_str());
        if !is_hop_by_hop_name(name) {
            return match name.len() {
                4 if is(&DATE) => Self::Date,
                14 if is(&CONTENT_LENGTH) => Self::ContentLength,
                // `HeaderName` takes no longer name.
                len if len > usize::from(u16::MAX) => Self::Map,
                _ => Self::Pass,
            };
        }
        // The connection's own fields, as `field_map` treats them; the other hop-by-hop
        // fields need the strip.
        if is(&CONNECTION) {
            Self::Connection
        } else if is(&KEEP_ALIVE) || is(&PROXY_CONNECTION) {
            Self::Drop
        } else {
            Self::Map
        }
    }
}

impl RawFields {
    /// The fields of the final response head `head`, as `response` parsed them, if they
    /// can be passed on raw (see the type's docs), and what its `Connection` fields say.
    fn of(
        head: &Bytes,
        response: &httparse::Response<'_, '_>,
    ) -> Option<(Self, ConnectionOptions)> {
        let fields = &*response.headers;
        if fields.len() > MAX_RAW_FIELDS || !head.ends_with(b"\r\n\r\n") {
            return None;
        }
        let base = head.as_ptr() as usize;
        let start_of = |field: &httparse::Header<'_>| field.name.as_ptr() as usize - base;
        // Where the blank line ending the head starts.
        let end = head.len() - 2;
        let mut raw = Self {
            head: head.clone(),
            runs: [(0, 0); MAX_RAW_RUNS],
            run_count: 0,
            fields: u16::try_from(fields.len()).ok()?,
            dated: false,
            length: None,
        };
        let mut connection = ConnectionOptions::default();
        let mut run_from = None;
        for (i, field) in fields.iter().enumerate() {
            let start = start_of(field);
            // A line runs to where the next begins, and must end in CRLF.
            let line_end = fields.get(i + 1).map_or(end, start_of);
            if head.get(line_end.checked_sub(2)?..line_end) != Some(b"\r\n") {
                return None;
            }
            let pass = match RawName::of(field.name) {
                RawName::Pass => true,
                RawName::Date => {
                    raw.dated = true;
                    true
                }
                RawName::ContentLength if raw.length.is_none() => {
                    raw.length = Some(parse_length(field.value.trim_ascii())?);
                    true
                }
                RawName::Connection => {
                    let options = connection_options(field.value);
                    if options.names_other_headers {
                        return None;
                    }
                    connection.close |= options.close;
                    connection.keep_alive |= options.keep_alive;
                    false
                }
                RawName::Drop => false,
                RawName::ContentLength | RawName::Map => return None,
            };
            match (pass, run_from) {
                (true, None) => run_from = Some(start),
                (false, Some(from)) => {
                    raw.push_run(from, start)?;
                    run_from = None;
                }
                _ => {}
            }
        }
        if let Some(from) = run_from {
            raw.push_run(from, end)?;
        }
        Some((raw, connection))
    }

    fn push_run(&mut self, from: usize, to: usize) -> Option<()> {
        let slot = self.runs.get_mut(usize::from(self.run_count))?;
        *slot = (u32::try_from(from).ok()?, u32::try_from(to).ok()?);
        self.run_count += 1;
        Some(())
    }

    /// The field lines to pass on, each run ending in CRLF.
    pub(crate) fn lines(&self) -> impl Iterator<Item = &[u8]> {
        self.runs[..usize::from(self.run_count)]
            .iter()
            .map(|&(from, to)| &self.head[from as usize..to as usize])
    }

    /// Their bytes in all.
    pub(crate) fn len(&self) -> usize {
        self.lines().map(<[u8]>::len).sum()
    }

    /// The same fields in a header map (for hyper's server, which writes a map), as the
    /// map would have had them from the start.
    pub(crate) fn to_map(&self) -> Result<HeaderMap, H1Error> {
        let fields = usize::from(self.fields).max(1);
        parse_response(&self.head, fields, |response, parsed| match parsed {
            Ok(httparse::Status::Complete(_)) => {
                field_map(&self.head, response, &mut FramingFields::default())
            }
            Ok(httparse::Status::Partial) => Err(H1Error::IncompleteHead),
            Err(e) => Err(parse_error(e, fields)),
        })
    }
}

/// The fields of the response head `head` if they would be kept raw (tests).
#[cfg(test)]
pub(crate) fn raw_fields_of(head: &[u8]) -> Option<RawFields> {
    let head = Bytes::copy_from_slice(head);
    parse_response(&head, 64, |response, parsed| {
        assert!(matches!(parsed, Ok(httparse::Status::Complete(_))));
        RawFields::of(&head, response).map(|(raw, _)| raw)
    })
}

/// Give `response` the header map of the fields it carries raw, if it does: before it
/// goes anywhere but the proxy's own client loop.
pub(crate) fn map_raw_fields(response: &mut Response<crate::ResponseBody>) {
    if let Some(raw) = response.body_mut().take_raw_fields() {
        // The head parsed once already and its fields were checked: this cannot fail.
        if let Ok(map) = raw.to_map() {
            *response.headers_mut() = map;
        }
    }
}

/// Whether a response with `status` never has a body, whatever its fields say (RFC 9112
/// §6.3 rule 1: every `1xx`, `204` and `304`); the one rule both directions use (the
/// decoder of pods' answers here, the encoder of answers to clients in `serve.rs`).
pub(crate) fn bodiless(status: StatusCode) -> bool {
    status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
}

/// How the body's end is found (RFC 9112 §6.3), and whether it is found without the
/// connection closing.
fn framing(
    parts: &Parts,
    headers: &mut HeaderMap,
    fields: &FramingFields,
    head_request: bool,
) -> Result<(Framing, bool), H1Error> {
    let bodiless = head_request || bodiless(parts.status);
    if !bodiless && fields.transfer_encoding {
        let chunked = transfer_codings(headers)?;
        // Chunked framing is HTTP/1.1's; in an HTTP/1.0 message it is faulty and only
        // the close ends the body.
        return Ok(if chunked && parts.version == Version::HTTP_11 {
            (Framing::Chunked(Chunked::Size), true)
        } else {
            (Framing::UntilClose, false)
        });
    }
    // Checked even where no body follows (HEAD, 304): the length goes on to the
    // client, which must be able to trust it.
    let length = match fields.content_length {
        ContentLength::Absent => None,
        ContentLength::Single(n) => Some(n),
        ContentLength::Check => content_length(headers)?,
    };
    Ok(match length {
        _ if bodiless => (Framing::Length(0), true),
        Some(n) => (Framing::Length(n), true),
        None => (Framing::UntilClose, false),
    })
}

/// Whether a response with `Transfer-Encoding` is chunked. The length beside it is
/// removed (the coding wins, and the client must not trust a length the body does not
/// have). Transfer-Encoding is hop-by-hop: the proxy takes chunked framing off, and a
/// coding beyond it (gzip, ...) would reach the client undeclared, its body unreadable;
/// it is refused rather than passed on mislabelled.
///
/// `identity` (RFC 2616's coding that codes nothing, still sent by old servers) is
/// passed over, but not after `chunked`: `chunked, identity` does not end in chunked,
/// so RFC 9112 §6.3 (rule 4) reads its body until the close, where passing over the
/// `identity` would read it as chunked. Reading it until the close would hand the
/// client the chunk framing as the body; it is refused instead.
fn transfer_codings(headers: &mut HeaderMap) -> Result<bool, H1Error> {
    headers.remove(CONTENT_LENGTH);
    let codings = headers
        .get_all(TRANSFER_ENCODING)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|c| !c.is_empty());
    let (mut chunked, mut ends_chunked) = (false, false);
    for coding in codings {
        ends_chunked = coding.eq_ignore_ascii_case(b"chunked");
        chunked |= ends_chunked;
        if !ends_chunked && !coding.eq_ignore_ascii_case(b"identity") {
            return Err(H1Error::TransferCoding(
                String::from_utf8_lossy(coding).into_owned(),
            ));
        }
    }
    if chunked && !ends_chunked {
        return Err(H1Error::TransferCoding(
            "identity after chunked".to_string(),
        ));
    }
    Ok(chunked)
}

/// The checks of a response's length fields that [`framing`] makes, for one that
/// hyper's client read (requests with a body), so that the client is handed the same
/// either way. `with_body`: the response has a body to come (its coding matters).
pub(crate) fn check_length_fields(headers: &mut HeaderMap, with_body: bool) -> Result<(), H1Error> {
    if with_body && headers.contains_key(TRANSFER_ENCODING) {
        transfer_codings(headers).map(drop)
    } else {
        content_length(headers).map(drop)
    }
}

/// The response's `Content-Length`: malformed or differing values are an error;
/// the same value repeated (in several fields or a list) becomes one field, as the
/// client is sent it.
pub(crate) fn content_length(headers: &mut HeaderMap) -> Result<Option<u64>, H1Error> {
    let mut length = None;
    let mut items = 0;
    for value in headers.get_all(CONTENT_LENGTH) {
        for item in value.as_bytes().split(|&b| b == b',') {
            let n = parse_length(item.trim_ascii()).ok_or(H1Error::ContentLength)?;
            if length.is_some_and(|seen| seen != n) {
                return Err(H1Error::ContentLength);
            }
            length = Some(n);
            items += 1;
        }
    }
    if let (Some(n), true) = (length, items > 1) {
        headers.insert(CONTENT_LENGTH, HeaderValue::from(n));
    }
    Ok(length)
}

/// A decimal length: digits only, no sign, no overflow.
fn parse_length(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 19 {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &d| {
        d.is_ascii_digit()
            .then(|| n.checked_mul(10)?.checked_add(u64::from(d - b'0')))
            .flatten()
    })
}

/// Whether the peer lets the connection be reused (RFC 9112 §9.3).
pub(crate) fn persistent(version: Version, headers: &HeaderMap) -> bool {
    let mut options = ConnectionOptions::default();
    for value in headers.get_all(CONNECTION) {
        let more = connection_options(value.as_bytes());
        options.close |= more.close;
        // A value with obs-text is no list of tokens (RFC 9110 §5.5, §7.6.1): its `close`
        // is honoured, as closing is always allowed (RFC 9112 §9.6), but not its
        // `keep-alive`, which would keep an HTTP/1.0 connection open on a value nobody
        // can read (hyper ignores the whole value).
        options.keep_alive |= more.keep_alive && value.to_str().is_ok();
    }
    options.persistent(version)
}

/// Where in the body the reader is.
#[derive(Debug)]
enum Framing {
    /// This many bytes are still to come.
    Length(u64),
    Chunked(Chunked),
    /// Everything until the pod closes the connection.
    UntilClose,
    /// Read to its end, or broken off (then `NativeBody::complete` is false).
    Done,
}

/// Where in a chunked body the decoder is (RFC 9112 §7.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Chunked {
    /// At a chunk-size line.
    #[default]
    Size,
    /// Inside a chunk's data, this many bytes still to come.
    Data(u64),
    /// At the CRLF after a chunk's data.
    DataEnd,
    /// After the last chunk: the trailer section and the final CRLF; this many bytes
    /// of it were searched for its end already (a pod sending it a byte at a time must
    /// not make the search quadratic).
    Trailers(usize),
}

/// What one step of the chunked decoder found.
#[derive(Debug)]
enum Decoded {
    Data(Bytes),
    /// The body ended, with these trailer fields (maybe none).
    End(HeaderMap),
}

/// Decode the next piece of a chunked body from the front of `buf`: `None` when more
/// bytes are needed.
fn decode_chunked(state: &mut Chunked, buf: &mut BytesMut) -> Result<Option<Decoded>, H1Error> {
    loop {
        match *state {
            Chunked::Size => {
                let Some(&first) = buf.first() else {
                    return Ok(None);
                };
                // httparse would read an empty size as 0, the end of the body.
                if !first.is_ascii_hexdigit() {
                    return Err(H1Error::Chunked("invalid chunk size"));
                }
                // Leading zeros are part of the size (`1*HEXDIG`, RFC 9112 §7.1), however
                // many; httparse takes 16 digits at most, zeros included. They go, but
                // for the last one of a size of zero.
                let zeros = buf.iter().take_while(|&&b| b == b'0').count();
                if zeros > MAX_CHUNK_LINE {
                    return Err(H1Error::Chunked("chunk size line too long"));
                }
                match buf.get(zeros) {
                    None if zeros > 1 => return Ok(None),
                    Some(next) if next.is_ascii_hexdigit() => buf.advance(zeros),
                    Some(_) if zeros > 1 => buf.advance(zeros - 1),
                    _ => {}
                }
                match httparse::parse_chunk_size(buf) {
                    // httparse passes over a bare LF inside an extension (it ends the line
                    // only at CRLF); RFC 9112 §7.1.1 allows none there, and a peer that
                    // ends the line at the LF reads a different body: refused, as hyper
                    // does.
                    Ok(httparse::Status::Complete((used, _)))
                        if buf[..used - 2].contains(&b'\n') =>
                    {
                        return Err(H1Error::Chunked("bare LF in chunk size line"))
                    }
                    Ok(httparse::Status::Complete((used, size))) => {
                        buf.advance(used);
                        *state = if size == 0 {
                            Chunked::Trailers(0)
                        } else {
                            Chunked::Data(size)
                        };
                    }
                    Ok(httparse::Status::Partial) if buf.len() <= MAX_CHUNK_LINE => {
                        return Ok(None)
                    }
                    Ok(httparse::Status::Partial) => {
                        return Err(H1Error::Chunked("chunk size line too long"))
                    }
                    Err(_) => return Err(H1Error::Chunked("invalid chunk size line")),
                }
            }
            Chunked::Data(left) => {
                if buf.is_empty() {
                    return Ok(None);
                }
                let take = usize::try_from(left).map_or(buf.len(), |left| left.min(buf.len()));
                let data = buf.split_to(take).freeze();
                let left = left - take as u64;
                *state = if left == 0 {
                    Chunked::DataEnd
                } else {
                    Chunked::Data(left)
                };
                return Ok(Some(Decoded::Data(data)));
            }
            Chunked::DataEnd => {
                let end = &buf[..buf.len().min(2)];
                if !b"\r\n".starts_with(end) {
                    return Err(H1Error::Chunked("no CRLF after chunk data"));
                }
                if end.len() < 2 {
                    return Ok(None);
                }
                buf.advance(2);
                *state = Chunked::Size;
            }
            Chunked::Trailers(searched) => {
                let start = &buf[..buf.len().min(2)];
                if start == b"\r\n" {
                    buf.advance(2);
                    return Ok(Some(Decoded::End(HeaderMap::new())));
                }
                let from = searched.saturating_sub(3);
                let Some(end) = buf[from..].windows(4).position(|w| w == b"\r\n\r\n") else {
                    if buf.len() > MAX_TRAILER_BYTES {
                        return Err(H1Error::Chunked("trailer section too long"));
                    }
                    *state = Chunked::Trailers(buf.len());
                    return Ok(None);
                };
                let section = buf.split_to(from + end + 4).freeze();
                return parse_trailers(&section).map(|t| Some(Decoded::End(t)));
            }
        }
    }
}

/// The trailer fields of a complete trailer section (with its final empty line).
fn parse_trailers(section: &Bytes) -> Result<HeaderMap, H1Error> {
    // Every trailer line ends in CRLF, as the section's end is found (and as hyper reads
    // them): a bare LF, which RFC 9112 §2.2 only allows a recipient to take for a line
    // end, is refused rather than taken for one inside the section and not at its end.
    let bare_lf = |(i, &b): (usize, &u8)| b == b'\n' && (i == 0 || section[i - 1] != b'\r');
    if section.iter().enumerate().any(bare_lf) {
        return Err(H1Error::Chunked("bare LF in the trailer section"));
    }
    let mut slots = [httparse::EMPTY_HEADER; MAX_TRAILERS];
    let fields = match httparse::parse_headers(section, &mut slots) {
        Ok(httparse::Status::Complete((_, fields))) => fields,
        _ => return Err(H1Error::Chunked("invalid trailer section")),
    };
    let mut trailers = HeaderMap::with_capacity(fields.len());
    for field in fields.iter() {
        let name = HeaderName::from_bytes(field.name.as_bytes())
            .map_err(|_| H1Error::Chunked("invalid trailer field"))?;
        let value = HeaderValue::from_maybe_shared(section.slice_ref(field.value))
            .map_err(|_| H1Error::Chunked("invalid trailer field"))?;
        trailers.append(name, value);
    }
    Ok(trailers)
}

/// A pod's response body, read from its connection as it is polled.
#[derive(Debug)]
pub(crate) struct NativeBody {
    /// The connection, until the body is done and it is [taken back](Self::reusable).
    stream: Option<TcpStream>,
    /// Body bytes that came with the head.
    early: Bytes,
    /// Bytes read since.
    buf: BytesMut,
    framing: Framing,
    keep_alive: bool,
    /// Whether the body was read to its end (not broken off).
    complete: bool,
    /// Whether the last read emptied the socket's receive queue (see `poll_fill`).
    drained: bool,
    /// The head's fields, while they are carried raw (see [`RawFields`]).
    pub(crate) raw: Option<Box<RawFields>>,
}

impl NativeBody {
    /// `stream`: `None` reads as a closed connection (the differential tests).
    fn new(
        stream: Option<TcpStream>,
        framing: Framing,
        keep_alive: bool,
        early: Bytes,
        drained: bool,
    ) -> Self {
        let mut body = Self {
            stream,
            early,
            buf: BytesMut::new(),
            framing,
            keep_alive,
            complete: false,
            drained,
            raw: None,
        };
        match body.framing {
            Framing::Length(0) => body.finish(),
            // The chunked decoder works on one buffer.
            Framing::Chunked(_) if !body.early.is_empty() => {
                body.buf = BytesMut::from(&body.early[..]);
                body.early = Bytes::new();
            }
            _ => {}
        }
        body
    }

    fn finish(&mut self) {
        self.framing = Framing::Done;
        self.complete = true;
    }

    fn fail(&mut self, error: H1Error) -> Poll<Option<Result<Frame<Bytes>, H1Error>>> {
        self.framing = Framing::Done;
        self.complete = false;
        self.stream = None;
        Poll::Ready(Some(Err(error)))
    }

    /// The connection, if the response was read to its end and the connection may
    /// carry another request (module docs); it stays with the body otherwise.
    pub(crate) fn reusable(&mut self) -> Option<TcpStream> {
        let clean = self.complete && self.keep_alive && self.early.is_empty();
        if !clean || !self.buf.is_empty() {
            return None;
        }
        let stream = self.stream.take()?;
        if self.drained {
            forget_readable(&stream);
        }
        Some(stream)
    }

    /// Read to its end; a body that broke off never says so.
    pub(crate) fn is_end_stream(&self) -> bool {
        matches!(self.framing, Framing::Done) && self.complete
    }

    pub(crate) fn size_hint(&self) -> SizeHint {
        match self.framing {
            Framing::Length(left) => SizeHint::with_exact(left),
            Framing::Done => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }

    pub(crate) fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, H1Error>>> {
        loop {
            match &mut self.framing {
                Framing::Done => return Poll::Ready(None),
                Framing::Length(left) => {
                    let left = *left;
                    let data = if !self.early.is_empty() {
                        let take = usize::try_from(left)
                            .map_or(self.early.len(), |l| l.min(self.early.len()));
                        self.early.split_to(take)
                    } else if !self.buf.is_empty() {
                        let take =
                            usize::try_from(left).map_or(self.buf.len(), |l| l.min(self.buf.len()));
                        self.buf.split_to(take).freeze()
                    } else {
                        match ready!(self.poll_read(cx)) {
                            Ok(0) => return self.fail(H1Error::BodyCut),
                            Ok(_) => continue,
                            Err(e) => return self.fail(H1Error::Read(e)),
                        }
                    };
                    let left = left - data.len() as u64;
                    if left == 0 {
                        self.finish();
                    } else {
                        self.framing = Framing::Length(left);
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Framing::UntilClose => {
                    if !self.early.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(std::mem::take(&mut self.early)))));
                    }
                    if !self.buf.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(self.buf.split().freeze()))));
                    }
                    match ready!(self.poll_read(cx)) {
                        Ok(0) => {
                            // The close ends the body; the connection is done too.
                            self.finish();
                            self.stream = None;
                            return Poll::Ready(None);
                        }
                        Ok(_) => continue,
                        Err(e) => return self.fail(H1Error::Read(e)),
                    }
                }
                Framing::Chunked(state) => match decode_chunked(state, &mut self.buf) {
                    Ok(Some(Decoded::Data(data))) => {
                        return Poll::Ready(Some(Ok(Frame::data(data))))
                    }
                    Ok(Some(Decoded::End(trailers))) => {
                        self.finish();
                        if trailers.is_empty() {
                            return Poll::Ready(None);
                        }
                        return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
                    }
                    Ok(None) => match ready!(self.poll_read(cx)) {
                        Ok(0) => return self.fail(H1Error::BodyCut),
                        Ok(_) => {}
                        Err(e) => return self.fail(H1Error::Read(e)),
                    },
                    Err(e) => return self.fail(e),
                },
            }
        }
    }

    fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        match &self.stream {
            Some(stream) => poll_fill(stream, &mut self.buf, BODY_READ_SIZE, &mut self.drained, cx),
            None => Poll::Ready(Ok(0)),
        }
    }
}

/// For the fuzz tests: parse `input` as what a pod sends back after a request (`HEAD`
/// if `head_request`), then decode its body as far as `input` goes. Returns whether a
/// response head was found, and the body bytes decoded; never panics.
#[doc(hidden)]
pub fn decode_for_fuzzing(input: &[u8], head_request: bool, max_headers: usize) -> (bool, usize) {
    let mut buf = BytesMut::from(input);
    let Ok(Some(head)) = parse_head(&mut buf, max_headers, head_request) else {
        return (false, 0);
    };
    let mut decoded = 0;
    match head.framing {
        Framing::Length(n) => {
            decoded = head
                .rest
                .len()
                .min(usize::try_from(n).unwrap_or(usize::MAX))
        }
        Framing::UntilClose => decoded = head.rest.len(),
        Framing::Chunked(mut state) => {
            let mut buf = BytesMut::from(&head.rest[..]);
            while let Ok(Some(piece)) = decode_chunked(&mut state, &mut buf) {
                match piece {
                    Decoded::Data(data) => decoded += data.len(),
                    Decoded::End(_) => break,
                }
            }
        }
        Framing::Done => {}
    }
    (true, decoded)
}

/// An HTTP/1 message as plain data, for the differential tests (`tests/differential.rs`),
/// which compare what the proxy's parsers make of some bytes with what hyper's make of
/// them. Byte strings are kept escaped (`escape_ascii`), which loses nothing.
#[doc(hidden)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlainMessage {
    /// A request's method and target, or a response's status code and its reason
    /// phrase (empty when it is the canonical one, as neither parser keeps it then).
    pub start: [String; 2],
    /// HTTP/1.0 or HTTP/1.1.
    pub version: Version,
    /// The header fields as the header map holds them: names lower case, in the map's
    /// order (by name in order of first appearance, values in order).
    pub headers: Vec<(String, String)>,
    /// The body, decoded from its framing.
    pub body: String,
    /// The trailer fields of a chunked body, in the map's order.
    pub trailers: Vec<(String, String)>,
}

impl PlainMessage {
    /// The fields of `map`, as [`PlainMessage::headers`] holds them.
    pub fn fields_of(map: &HeaderMap) -> Vec<(String, String)> {
        map.iter()
            .map(|(name, value)| {
                (
                    name.as_str().to_string(),
                    value.as_bytes().escape_ascii().to_string(),
                )
            })
            .collect()
    }
}

/// For the differential tests: what the native exchange makes of `input` sent by a pod
/// that then closes the connection, in answer to a `GET` (or a `HEAD` if
/// `head_request`): the response head as [`exchange`] parses it and its body and
/// trailers as [`NativeBody`] decodes them (the close ends the input), or why it fails.
/// The fields are those of the map the response would get (`map_raw_fields`), without
/// `Connection`, `Keep-Alive` and `Proxy-Connection`, which the exchange leaves out.
#[doc(hidden)]
pub fn exchange_for_differential(
    input: &[u8],
    head_request: bool,
    max_headers: usize,
) -> Result<PlainMessage, String> {
    // `exchange` parses once a read brings a line end, and fails at the close with the
    // head incomplete.
    let mut buf = BytesMut::from(input);
    let head = match may_settle_head(input) {
        true => parse_head(&mut buf, max_headers, head_request).map_err(|e| e.to_string())?,
        false => None,
    };
    let Some(head) = head else {
        let error = match input.is_empty() {
            true => H1Error::ClosedBeforeResponse,
            false => H1Error::IncompleteHead,
        };
        return Err(error.to_string());
    };
    let headers = match &head.raw {
        Some(raw) => raw.to_map().map_err(|e| e.to_string())?,
        None => head.parts.headers.clone(),
    };
    let reason = head
        .parts
        .extensions
        .get::<hyper::ext::ReasonPhrase>()
        .map_or(String::new(), |r| r.as_bytes().escape_ascii().to_string());
    let mut message = PlainMessage {
        start: [head.parts.status.as_str().to_string(), reason],
        version: head.parts.version,
        headers: PlainMessage::fields_of(&headers),
        body: String::new(),
        trailers: Vec::new(),
    };
    let mut body = NativeBody::new(None, head.framing, head.keep_alive, head.rest, false);
    let mut cx = Context::from_waker(std::task::Waker::noop());
    let mut data = Vec::new();
    loop {
        match body.poll_frame(&mut cx) {
            Poll::Ready(None) => break,
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(bytes) => data.extend_from_slice(&bytes),
                Err(frame) => {
                    if let Some(trailers) = frame.trailers_ref() {
                        message.trailers = PlainMessage::fields_of(trailers);
                    }
                }
            },
            Poll::Ready(Some(Err(e))) => return Err(e.to_string()),
            // Without a connection every read ends at once.
            Poll::Pending => return Err("body pending without a connection".to_string()),
        }
    }
    if !body.is_end_stream() {
        return Err("body not read to its end".to_string());
    }
    message.body = data.escape_ascii().to_string();
    Ok(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(text: &[u8]) -> Result<Option<Head>, H1Error> {
        parse_head(&mut BytesMut::from(text), 100, false).map(|h| h.map(mapped))
    }

    /// `head` with the fields it carries raw also in its map, as hyper's server gets
    /// them (`map_raw_fields`).
    fn mapped(mut head: Head) -> Head {
        if let Some(raw) = &head.raw {
            assert!(head.parts.headers.is_empty());
            head.parts.headers = raw.to_map().expect("raw fields map");
        }
        head
    }

    /// Decode a whole chunked body fed in pieces of `step` bytes.
    fn dechunk(input: &[u8], step: usize) -> Result<(Vec<u8>, HeaderMap), H1Error> {
        let mut state = Chunked::Size;
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for piece in input.chunks(step.max(1)) {
            buf.extend_from_slice(piece);
            while let Some(decoded) = decode_chunked(&mut state, &mut buf)? {
                match decoded {
                    Decoded::Data(data) => out.extend_from_slice(&data),
                    Decoded::End(trailers) => {
                        assert!(buf.is_empty(), "bytes after the body: {buf:?}");
                        return Ok((out, trailers));
                    }
                }
            }
        }
        Err(H1Error::BodyCut)
    }

    #[test]
    fn a_head_with_its_fields_and_the_start_of_the_body() {
        let parsed = head(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\nx-a: 2\r\n\r\nhel")
            .unwrap()
            .unwrap();
        assert_eq!(parsed.parts.status, StatusCode::OK);
        assert_eq!(parsed.parts.version, Version::HTTP_11);
        assert!(parsed.raw.is_some(), "an ordinary head is kept raw");
        let values: Vec<_> = parsed.parts.headers.get_all("x-a").iter().collect();
        assert_eq!(values, ["1", "2"]);
        assert!(matches!(parsed.framing, Framing::Length(5)));
        assert!(parsed.keep_alive);
        assert_eq!(&parsed.rest[..], b"hel");
        assert!(parsed
            .parts
            .extensions
            .get::<hyper::ext::ReasonPhrase>()
            .is_none());
    }

    #[test]
    fn a_head_ends_at_its_first_blank_line_in_either_line_ending() {
        assert_eq!(head_end(b"HTTP/1.1 200 OK\r\n\r\nbody"), Some(19));
        assert_eq!(head_end(b"HTTP/1.1 200 OK\nA: b\n\nbody"), Some(22));
        assert_eq!(head_end(b"\r\n\nHTTP/1.1 200 OK\r\n\r\n"), Some(22));
        assert_eq!(head_end(b"HTTP/1.1 200 OK\r\nA: b\r\n\r"), None);
        assert_eq!(head_end(b"\r\n\r\n"), None);
        let parsed = head(b"\r\n\nHTTP/1.1 204 No Content\nA: b\n\nnext")
            .unwrap()
            .unwrap();
        assert_eq!(parsed.parts.status, StatusCode::NO_CONTENT);
        assert_eq!(parsed.parts.headers["a"], "b");
        assert_eq!(&parsed.rest[..], b"next");
    }

    #[test]
    fn a_malformed_head_fails_before_its_end_arrives() {
        assert!(matches!(
            head(b"HTTP/1.1 200 OK\r\nno colon here\r\n"),
            Err(H1Error::Parse(_))
        ));
        assert!(matches!(
            head(b"HTTX/1.1 200 OK\r\n"),
            Err(H1Error::Parse(_))
        ));
    }

    #[test]
    fn connection_fields_decide_reuse_and_stay_out_of_the_map_unless_they_list_headers() {
        let parsed = head(
            b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\n\
              Proxy-Connection: keep-alive\r\nContent-Length: 0\r\n\r\n",
        )
        .unwrap()
        .unwrap();
        assert!(parsed.keep_alive);
        assert_eq!(parsed.parts.headers.len(), 1, "{:?}", parsed.parts.headers);
        assert_eq!(parsed.parts.headers[CONTENT_LENGTH], "0");

        let parsed = head(b"HTTP/1.1 200 OK\r\nconnection: CLOSE\r\ncontent-length: 0\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(!parsed.keep_alive);
        let parsed = head(b"HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(
            !parsed.keep_alive,
            "HTTP/1.0 closes unless it asks for keep-alive"
        );

        // A header the pod names in `Connection` is hop-by-hop too: the field stays in the
        // map for the strip to find, and both go.
        let mut parsed = head(
            b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive, X-Trace\r\nX-Trace: 1\r\n\
              X-Kept: 2\r\nContent-Length: 0\r\n\r\n",
        )
        .unwrap()
        .unwrap();
        assert!(parsed.keep_alive);
        assert!(parsed.raw.is_none(), "mapped, for the strip");
        assert!(parsed.parts.headers.contains_key(CONNECTION));
        crate::forward::headers::strip_hop_by_hop(&mut parsed.parts.headers);
        let mut names: Vec<_> = parsed.parts.headers.keys().map(|n| n.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, ["content-length", "x-kept"]);
    }

    #[test]
    fn only_heads_the_map_would_pass_on_unchanged_are_kept_raw() {
        let raw = |text: &[u8]| {
            let parsed = parse_head(&mut BytesMut::from(text), 100, false)
                .unwrap()
                .unwrap();
            parsed.raw.map(|raw| {
                let lines: Vec<u8> = raw.lines().flatten().copied().collect();
                (String::from_utf8(lines).unwrap(), raw.dated, raw.length)
            })
        };
        assert_eq!(
            raw(
                b"HTTP/1.1 200 OK\r\nServer: s\r\nDate: d\r\nContent-Length: 0\r\n\
                  Connection: keep-alive\r\n\r\n"
            ),
            Some((
                "Server: s\r\nDate: d\r\nContent-Length: 0\r\n".to_string(),
                true,
                Some(0)
            ))
        );
        // The connection's own fields leave gaps: each run of kept lines is passed.
        assert_eq!(
            raw(
                b"HTTP/1.1 204 No Content\r\nKeep-Alive: 5\r\nA: 1\r\nProxy-Connection: x\r\n\
                  B: 2\r\nconnection: close\r\n\r\n"
            ),
            Some(("A: 1\r\nB: 2\r\n".to_string(), false, None))
        );
        assert_eq!(
            raw(b"HTTP/1.1 200 OK\r\n\r\n"),
            Some((String::new(), false, None))
        );
        // Everything else goes through the map.
        for mapped in [
            &b"HTTP/1.1 200 OK\nA: 1\nContent-Length: 0\n\n"[..],
            b"HTTP/1.1 200 OK\r\nA: 1\nContent-Length: 0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nContent-Length: 0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 0, 0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nConnection: x-trace\r\nContent-Length: 0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nUpgrade: h2c\r\nContent-Length: 0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTrailer: x\r\nContent-Length: 0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nProxy-Authenticate: Basic\r\nContent-Length: 0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nA: 1\r\nKeep-Alive: 1\r\nB: 1\r\nKeep-Alive: 1\r\nC: 1\r\n\
              Keep-Alive: 1\r\nD: 1\r\nKeep-Alive: 1\r\nE: 1\r\nContent-Length: 0\r\n\r\n",
        ] {
            assert_eq!(raw(mapped), None, "{}", String::from_utf8_lossy(mapped));
        }
        // Values a header map would refuse never get this far: httparse refuses them.
        for bad in [&b"x: a\x7fb"[..], b"x: a\x01b", b"x: a\x00b"] {
            let mut text = b"HTTP/1.1 200 OK\r\n".to_vec();
            text.extend_from_slice(bad);
            text.extend_from_slice(b"\r\ncontent-length: 0\r\n\r\n");
            assert!(
                parse_head(&mut BytesMut::from(&text[..]), 100, false).is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn an_incomplete_head_waits_and_interim_responses_are_skipped() {
        assert!(head(b"HTTP/1.1 200 OK\r\nContent-Le").unwrap().is_none());
        let mut buf = BytesMut::from(
            &b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n"[..],
        );
        assert!(parse_head(&mut buf, 100, false).unwrap().is_none());
        assert!(buf.is_empty(), "interim heads are consumed");
        buf.extend_from_slice(b"HTTP/1.1 204 No Content\r\n\r\n");
        let parsed = parse_head(&mut buf, 100, false).unwrap().unwrap();
        assert_eq!(parsed.parts.status, StatusCode::NO_CONTENT);
        assert!(matches!(parsed.framing, Framing::Length(0)));
    }

    #[test]
    fn framing_follows_rfc_9112_section_6_3() {
        let framing_of = |text: &[u8], head_request: bool| {
            parse_head(&mut BytesMut::from(text), 100, head_request).map(|h| {
                h.map(mapped)
                    .map(|h| (h.framing, h.keep_alive, h.parts.headers))
            })
        };
        let (f, keep, _) = framing_of(b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n", true)
            .unwrap()
            .unwrap();
        assert!(matches!(f, Framing::Length(0)) && keep, "HEAD has no body");
        for status in ["204 No Content", "304 Not Modified"] {
            let text = format!("HTTP/1.1 {status}\r\ncontent-length: 9\r\n\r\n");
            let (f, _, _) = framing_of(text.as_bytes(), false).unwrap().unwrap();
            assert!(matches!(f, Framing::Length(0)), "{status}");
        }
        let (f, keep, headers) = framing_of(
            b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\ntransfer-encoding: identity, Chunked\r\n\r\n",
            false,
        )
        .unwrap()
        .unwrap();
        assert!(matches!(f, Framing::Chunked(Chunked::Size)) && keep);
        assert!(
            !headers.contains_key(CONTENT_LENGTH),
            "the length beside it is dropped"
        );
        let (f, keep, _) = framing_of(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: identity\r\n\r\n",
            false,
        )
        .unwrap()
        .unwrap();
        assert!(
            matches!(f, Framing::UntilClose) && !keep,
            "no chunked coding"
        );
        for codings in [
            "gzip, chunked",
            "chunked, gzip",
            "gzip",
            "chunked\r\ntransfer-encoding: br",
            // Not ending in chunked (RFC 9112 §6.3): hyper would read it until the close.
            "chunked, identity",
            "chunked\r\ntransfer-encoding: identity",
        ] {
            let text = format!("HTTP/1.1 200 OK\r\ntransfer-encoding: {codings}\r\n\r\n");
            assert!(
                matches!(
                    framing_of(text.as_bytes(), false),
                    Err(H1Error::TransferCoding(_))
                ),
                "{codings}"
            );
        }
        let (f, keep, _) = framing_of(
            b"HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
            false,
        )
        .unwrap()
        .unwrap();
        assert!(
            matches!(f, Framing::UntilClose) && !keep,
            "chunked in HTTP/1.0"
        );
        let (f, keep, _) = framing_of(b"HTTP/1.1 200 OK\r\n\r\n", false)
            .unwrap()
            .unwrap();
        assert!(matches!(f, Framing::UntilClose) && !keep);
        let (f, _, headers) = framing_of(
            b"HTTP/1.1 200 OK\r\ncontent-length: 7\r\ncontent-length: 7, 7\r\n\r\n",
            false,
        )
        .unwrap()
        .unwrap();
        assert!(matches!(f, Framing::Length(7)), "repeated equal lengths");
        let lengths: Vec<_> = headers.get_all(CONTENT_LENGTH).iter().collect();
        assert_eq!(lengths, ["7"], "become one field");
        for bad in [
            &b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\ncontent-length: 5, 6\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: abc\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: +1\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: \r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: 99999999999999999999\r\n\r\n",
        ] {
            // Also where no body follows: the length still reaches the client.
            for head_request in [false, true] {
                assert!(
                    matches!(framing_of(bad, head_request), Err(H1Error::ContentLength)),
                    "{}",
                    String::from_utf8_lossy(bad)
                );
            }
        }
    }

    #[test]
    fn persistence_follows_the_version_and_connection_options() {
        let keep = |text: &[u8]| head(text).unwrap().unwrap().keep_alive;
        assert!(keep(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"));
        assert!(!keep(
            b"HTTP/1.1 200 OK\r\nconnection: Close\r\ncontent-length: 0\r\n\r\n"
        ));
        assert!(!keep(
            b"HTTP/1.1 200 OK\r\nconnection: x, close\r\ncontent-length: 0\r\n\r\n"
        ));
        assert!(!keep(b"HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n"));
        assert!(keep(
            b"HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 0\r\n\r\n"
        ));
    }

    #[test]
    fn bad_heads_are_errors_of_their_own_kind() {
        assert!(matches!(
            head(b"HTTP/1.1 101 Switching Protocols\r\n\r\n"),
            Err(H1Error::UnaskedSwitch)
        ));
        assert!(matches!(head(b"garbage\r\n\r\n"), Err(H1Error::Parse(_))));
        // An HTTP/2 server's GOAWAY (after its SETTINGS) in answer to HTTP/1.1.
        let goaway = [0, 0, 8, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
        assert!(matches!(head(&goaway), Err(H1Error::Http2Answer)));
        assert!(matches!(
            head(b"HTTP/1.1 099 Low\r\n\r\n"),
            Err(H1Error::Status(99))
        ));
        let many: String = (0..101).map(|i| format!("x-{i}: v\r\n")).collect();
        let text = format!("HTTP/1.1 200 OK\r\n{many}\r\n");
        assert!(matches!(
            head(text.as_bytes()),
            Err(H1Error::TooManyHeaders(100))
        ));
        // Beyond the stack's slots the heap's are used.
        let mut buf = BytesMut::from(text.as_bytes());
        assert!(parse_head(&mut buf, STACK_HEADER_SLOTS + 1, false)
            .unwrap()
            .is_some());
        for error in [
            H1Error::UnaskedSwitch,
            H1Error::ContentLength,
            H1Error::Chunked("x"),
            H1Error::TooManyHeaders(1),
        ] {
            assert!(
                error.is_protocol() && !error.died_before_response(),
                "{error}"
            );
        }
    }

    #[test]
    fn a_reason_phrase_of_the_pods_own_is_kept() {
        let parsed = head(b"HTTP/1.1 200 Fine Thanks\r\ncontent-length: 0\r\n\r\n")
            .unwrap()
            .unwrap();
        let reason = parsed
            .parts
            .extensions
            .get::<hyper::ext::ReasonPhrase>()
            .unwrap();
        assert_eq!(reason.as_bytes(), b"Fine Thanks");
    }

    #[test]
    fn header_values_share_the_read_buffer_and_keep_obs_text() {
        let mut text =
            b"HTTP/1.1 200 OK\r\nx-raw: caf\xe9\r\nx-empty:\r\ncontent-length: 0\r\n\r\n".to_vec();
        let parsed = mapped(
            parse_head(&mut BytesMut::from(&text[..]), 10, false)
                .unwrap()
                .unwrap(),
        );
        assert_eq!(parsed.parts.headers["x-raw"].as_bytes(), b"caf\xe9");
        assert_eq!(parsed.parts.headers["x-empty"].as_bytes(), b"");
        text[0] = b'X';
    }

    #[test]
    fn chunked_bodies_decode_exactly_however_they_are_split() {
        let body = b"5;name=value\r\nhello\r\n1 ; x\r\n,\r\nB\r\n 0123456789\r\n0\r\nx-sum: 42\r\nx-b: 1\r\n\r\n";
        for step in 1..body.len() {
            let (data, trailers) = dechunk(body, step).unwrap();
            assert_eq!(data, b"hello, 0123456789", "step {step}");
            assert_eq!(trailers["x-sum"], "42");
            assert_eq!(trailers.len(), 2);
        }
        let (data, trailers) = dechunk(b"3\r\nabc\r\n0\r\n\r\n", 2).unwrap();
        assert_eq!(data, b"abc");
        assert!(trailers.is_empty());
    }

    #[test]
    fn a_chunk_size_may_have_any_number_of_leading_zeros() {
        let zeros = "0".repeat(40);
        let body = format!("{zeros}5\r\nhello\r\n{zeros}\r\nx-t: 1\r\n\r\n");
        for step in [1, 3, 64] {
            let (data, trailers) = dechunk(body.as_bytes(), step).unwrap();
            assert_eq!(data, b"hello", "step {step}");
            assert_eq!(trailers["x-t"], "1");
        }
        let endless = "0".repeat(MAX_CHUNK_LINE + 1);
        assert!(matches!(
            dechunk(endless.as_bytes(), 64),
            Err(H1Error::Chunked(_))
        ));
        // Past the zeros, at most 64 bits.
        assert!(matches!(
            dechunk(b"000010000000000000000\r\n", 64),
            Err(H1Error::Chunked(_))
        ));
        assert!(matches!(
            dechunk(b"0000ffffffffffffffff\r\nabc", 64),
            Err(H1Error::BodyCut)
        ));
    }

    #[test]
    fn broken_chunked_framing_is_an_error_not_a_guess() {
        for bad in [
            &b"zz\r\nabc\r\n0\r\n\r\n"[..],
            b"\r\n",
            b"3\r\nabcX\r\n0\r\n\r\n",
            b"3\nabc\r\n0\r\n\r\n",
            b"-3\r\nabc\r\n0\r\n\r\n",
            b"10000000000000000\r\n",
            b"0\r\nbad trailer\r\n\r\n",
            // A bare LF in an extension (RFC 9112 §7.1.1): a reader that ends the line
            // there would take `3` for the next size line.
            b"5;a\n3\r\nhello\r\n0\r\n\r\n",
            b"0;a\nb\r\n\r\n",
            // Trailer lines end in CRLF.
            b"0\r\nx-t: 1\nx-u: 2\r\n\r\n",
        ] {
            assert!(
                matches!(dechunk(bad, 64), Err(H1Error::Chunked(_))),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        let long_line = [b"1;".as_slice(), &[b'x'; MAX_CHUNK_LINE]].concat();
        assert!(matches!(dechunk(&long_line, 64), Err(H1Error::Chunked(_))));
        let long_trailer = [b"0\r\nx: ".as_slice(), &[b'y'; MAX_TRAILER_BYTES]].concat();
        assert!(matches!(
            dechunk(&long_trailer, 4096),
            Err(H1Error::Chunked(_))
        ));
    }

    #[test]
    fn the_request_head_is_written_as_hyper_would() {
        let req = Request::builder()
            .method(Method::DELETE)
            .uri("/a/b?c=d")
            .header("host", "api")
            .header("x-a", "1")
            .header("transfer-encoding", "chunked")
            .header("x-a", "2")
            .body(())
            .unwrap();
        let encoded = |req: &Request<()>| {
            let mut out = Vec::new();
            encode_head(req, &mut out);
            out
        };
        let head = encoded(&req);
        assert_eq!(
            head,
            b"DELETE /a/b?c=d HTTP/1.1\r\nhost: api\r\nx-a: 1\r\nx-a: 2\r\n\r\n"
        );
        let star = Request::builder()
            .method(Method::OPTIONS)
            .uri("*")
            .body(())
            .unwrap();
        let head = encoded(&star);
        assert_eq!(head, b"OPTIONS * HTTP/1.1\r\n\r\n");
        // Reserved at its exact size once (it used to be one byte short, and grown).
        assert_eq!(head.capacity(), head.len());
    }

    /// A pod on loopback that answers the first request with `answer`, then, when told,
    /// sends `later` and closes.
    async fn pod(
        answer: &'static [u8],
        later: &'static [u8],
    ) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (go, wait) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut request = vec![0; 1024];
            let _ = socket.read(&mut request).await.unwrap();
            socket.write_all(answer).await.unwrap();
            let _ = wait.await;
            socket.write_all(later).await.unwrap();
        });
        (addr, go)
    }

    /// Whether the socket shows a close or unasked bytes within a second, read as the
    /// pool reads it (`Held::is_closed`).
    async fn shows_activity(stream: &TcpStream) -> bool {
        for _ in 0..100 {
            match stream.try_read(&mut [0; 1]) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await
                }
                _ => return true,
            }
        }
        false
    }

    #[tokio::test]
    async fn a_reusable_socket_is_quiet_and_still_shows_what_the_pod_does_later() {
        for later in [&b""[..], b"HTTP/1.1 200 OK\r\n\r\n"] {
            let (addr, go) = pod(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nhi", later).await;
            let stream = TcpStream::connect(addr).await.unwrap();
            let req = Request::builder().uri("/").body(()).unwrap();
            let mut body = exchange(stream, &req, &[], 10).await.unwrap().into_body();
            let frame = std::future::poll_fn(|cx| body.poll_frame(cx)).await;
            assert_eq!(frame.unwrap().unwrap().into_data().unwrap(), "hi");
            assert!(body.is_end_stream());
            let stream = body.reusable().expect("a complete keep-alive response");
            // Quiet now: the pool's check finds nothing to read.
            assert!(
                matches!(stream.try_read(&mut [0; 1]), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
            );
            // What the pod does after the readiness was forgotten is still seen.
            go.send(()).unwrap();
            assert!(shows_activity(&stream).await, "later {later:?} went unseen");
        }
    }

    #[tokio::test]
    async fn answers_sent_a_byte_at_a_time_are_read_whole() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let answer: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nx-a: 1\r\n\
            transfer-encoding: chunked\r\n\r\n3;e=1\r\nabc\r\n0\r\nx-t: 2\r\n\r\n";
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            socket.set_nodelay(true).unwrap();
            let _ = socket.read(&mut [0; 1024]).await.unwrap();
            for byte in answer {
                socket.write_all(&[*byte]).await.unwrap();
                tokio::time::sleep(std::time::Duration::from_micros(200)).await;
            }
        });
        let stream = TcpStream::connect(addr).await.unwrap();
        let req = Request::builder().uri("/").body(()).unwrap();
        let response = exchange(stream, &req, &[], 10).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()["x-a"], "1");
        let mut body = response.into_body();
        let (mut data, mut trailers) = (Vec::new(), None);
        while let Some(frame) = std::future::poll_fn(|cx| body.poll_frame(cx)).await {
            match frame.unwrap().into_data() {
                Ok(bytes) => data.extend_from_slice(&bytes),
                Err(frame) => trailers = frame.into_trailers().ok(),
            }
        }
        assert_eq!(data, b"abc");
        assert_eq!(trailers.unwrap()["x-t"], "2");
        assert!(body.reusable().is_some());
    }

    #[tokio::test]
    async fn the_read_buffer_is_reused_only_once_the_answer_it_held_is_dropped() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        // Bodies that nearly fill a read: each exchange needs the whole buffer again.
        const LEN: usize = READ_SIZE - 1024;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let mut held = Vec::new();
            for fill in [b'a', b'b', b'c'] {
                let (mut socket, _) = listener.accept().await.unwrap();
                let _ = socket.read(&mut [0; 1024]).await.unwrap();
                let mut bytes =
                    format!("HTTP/1.1 200 OK\r\ncontent-length: {LEN}\r\n\r\n").into_bytes();
                bytes.resize(bytes.len() + LEN, fill);
                socket.write_all(&bytes).await.unwrap();
                held.push(socket); // open: the exchange must not wait for a close
            }
            std::future::pending::<()>().await;
        });
        /// The first frame (its bytes as they lie in the read buffer), after checking
        /// that the whole body is `fill`.
        async fn first_frame_of(addr: std::net::SocketAddr, fill: u8) -> Bytes {
            let stream = TcpStream::connect(addr).await.unwrap();
            let req = Request::builder().uri("/").body(()).unwrap();
            let mut body = exchange(stream, &req, &[], 10).await.unwrap().into_body();
            let mut frames = Vec::new();
            while let Some(frame) = std::future::poll_fn(|cx| body.poll_frame(cx)).await {
                frames.push(frame.unwrap().into_data().unwrap());
            }
            assert_eq!(frames.iter().map(Bytes::len).sum::<usize>(), LEN);
            assert!(frames.iter().all(|f| f.iter().all(|&x| x == fill)));
            frames.swap_remove(0)
        }
        let a = first_frame_of(addr, b'a').await;
        let first_at = a.as_ptr();
        drop(a);
        // What is left of its read buffer waits for the next exchange of the thread.
        let spare_at = READ_SPARE.with(|spare| {
            let buf = spare.take().expect("the read buffer is kept");
            let at = buf.as_ptr();
            spare.set(Some(buf));
            at
        });
        assert_eq!(spare_at, first_at.wrapping_add(LEN));
        // The first answer is gone: the second is read into the same allocation.
        let b = first_frame_of(addr, b'b').await;
        assert_eq!(b.as_ptr(), first_at, "the buffer was not reused");
        // The second is still held: the third gets a buffer of its own, and the second's
        // bytes stay as they were.
        let c = first_frame_of(addr, b'c').await;
        assert_ne!(c.as_ptr(), b.as_ptr());
        assert!(
            b.iter().all(|&x| x == b'b'),
            "the second answer was overwritten"
        );
    }

    #[test]
    fn died_before_response_covers_the_idle_close_race_only() {
        assert!(H1Error::ClosedBeforeResponse.died_before_response());
        assert!(H1Error::IncompleteHead.died_before_response());
        assert!(H1Error::Read(io::ErrorKind::ConnectionReset.into()).died_before_response());
        assert!(!H1Error::Read(io::ErrorKind::TimedOut.into()).died_before_response());
        assert!(!H1Error::BodyCut.died_before_response());
        assert!(H1Error::NotWritten(io::ErrorKind::BrokenPipe.into()).nothing_sent());
        assert!(!H1Error::Write(io::ErrorKind::BrokenPipe.into()).nothing_sent());
    }
}
