//! Header rewriting between client and pod (RFC 9110 §7.6.1).
//!
//! Hop-by-hop headers describe one connection and are dropped in both directions:
//! `Connection` and every header it lists, plus `Keep-Alive`, `Proxy-Connection`, `TE`,
//! `Trailer`, `Transfer-Encoding`, `Upgrade`, `Proxy-Authenticate` and
//! `Proxy-Authorization`. Towards the pod the proxy adds the client's address to
//! `X-Forwarded-For` and sets `X-Forwarded-Proto`; everything else, `Host` included,
//! passes unchanged. The common case (no hop-by-hop header at all) costs one scan of
//! the header names and no allocation.

use http::header::{
    CONNECTION, PROXY_AUTHENTICATE, PROXY_AUTHORIZATION, TE, TRAILER, TRANSFER_ENCODING, UPGRADE,
};
use http::{HeaderMap, HeaderName, HeaderValue};

pub(crate) const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
pub(crate) const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
pub(crate) const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
pub(crate) const PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");

/// The hop-by-hop headers of the fixed set (see the module docs).
const HOP_BY_HOP: [HeaderName; 9] = [
    CONNECTION,
    TE,
    TRAILER,
    TRANSFER_ENCODING,
    UPGRADE,
    PROXY_AUTHENTICATE,
    PROXY_AUTHORIZATION,
    KEEP_ALIVE,
    PROXY_CONNECTION,
];

fn is_hop_by_hop(name: &HeaderName) -> bool {
    HOP_BY_HOP.contains(name)
}

/// [`is_hop_by_hop`] for a name as it came off the wire, in any case (for heads kept
/// raw, `http1/mod.rs`): by length first, since it runs for every field of a response.
pub(crate) fn is_hop_by_hop_name(name: &str) -> bool {
    let is = |known: &HeaderName| name.eq_ignore_ascii_case(known.as_str());
    match name.len() {
        2 => is(&TE),
        7 => is(&TRAILER) || is(&UPGRADE),
        10 => is(&CONNECTION) || is(&KEEP_ALIVE),
        16 => is(&PROXY_CONNECTION),
        17 => is(&TRANSFER_ENCODING),
        18 => is(&PROXY_AUTHENTICATE),
        19 => is(&PROXY_AUTHORIZATION),
        _ => false,
    }
}

/// What one `Connection` field says (RFC 9110 §7.6.1).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ConnectionOptions {
    pub(crate) close: bool,
    pub(crate) keep_alive: bool,
    /// It lists a header to drop beyond the fixed hop-by-hop set: an option other than
    /// `close` and `keep-alive` (the latter is dropped anyway).
    pub(crate) names_other_headers: bool,
}

impl ConnectionOptions {
    /// Whether the connection may carry another message (RFC 9112 §9.3).
    pub(crate) fn persistent(self, version: http::Version) -> bool {
        !self.close && (version == http::Version::HTTP_11 || self.keep_alive)
    }
}

/// The options of one `Connection` field value.
pub(crate) fn connection_options(value: &[u8]) -> ConnectionOptions {
    let mut options = ConnectionOptions::default();
    for token in value.split(|&b| b == b',') {
        let token = token.trim_ascii();
        if token.eq_ignore_ascii_case(b"close") {
            options.close = true;
        } else if token.eq_ignore_ascii_case(b"keep-alive") {
            options.keep_alive = true;
        } else if !token.is_empty() {
            options.names_other_headers = true;
        }
    }
    options
}

/// Remove hop-by-hop headers (see the module docs).
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    if !headers.keys().any(is_hop_by_hop) {
        return;
    }
    // `Connection: keep-alive` or `close`, the usual forms, list no other header: no
    // copy of the options is needed then.
    let lists_others = headers
        .get_all(CONNECTION)
        .iter()
        .any(|value| connection_options(value.as_bytes()).names_other_headers);
    if lists_others {
        if let http::header::Entry::Occupied(entry) = headers.entry(CONNECTION) {
            let listed: Vec<HeaderValue> = entry.remove_entry_mult().1.collect();
            for value in &listed {
                let Ok(value) = value.to_str() else { continue };
                for token in value.split(',') {
                    let token = token.trim();
                    if !token.is_empty() {
                        headers.remove(token);
                    }
                }
            }
        }
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

/// Add the client's address to `X-Forwarded-For` (joined into one line with what the
/// client sent, as nginx's `$proxy_add_x_forwarded_for` does) and set
/// `X-Forwarded-Proto: http`.
pub(crate) fn add_forwarded(headers: &mut HeaderMap, client_ip: &HeaderValue) {
    match headers.entry(X_FORWARDED_FOR) {
        http::header::Entry::Vacant(entry) => {
            entry.insert(client_ip.clone());
        }
        http::header::Entry::Occupied(mut entry) => {
            let mut joined = Vec::with_capacity(64);
            for value in entry.iter() {
                joined.extend_from_slice(value.as_bytes());
                joined.extend_from_slice(b", ");
            }
            joined.extend_from_slice(client_ip.as_bytes());
            // Joined valid values stay valid; fall back to a second line if not.
            match HeaderValue::from_maybe_shared(bytes::Bytes::from(joined)) {
                Ok(value) => {
                    entry.insert(value);
                }
                Err(_) => entry.append(client_ip.clone()),
            }
        }
    }
    headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static("http"));
}

/// Size of the request headers as counted against `max_header_bytes`: each
/// `name: value\r\n` line.
pub(crate) fn header_bytes(headers: &HeaderMap) -> usize {
    headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        m
    }

    fn names(m: &HeaderMap) -> Vec<&str> {
        let mut v: Vec<_> = m.keys().map(|k| k.as_str()).collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn drops_hop_by_hop_and_connection_listed_headers() {
        let mut m = map(&[
            ("host", "api"),
            ("connection", "keep-alive, X-Secret"),
            ("connection", "x-other"),
            ("x-secret", "1"),
            ("x-other", "2"),
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "keep-alive"),
            ("te", "trailers"),
            ("trailer", "x-sum"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("proxy-authenticate", "Basic"),
            ("proxy-authorization", "Basic eA=="),
            ("x-kept", "3"),
            ("content-length", "5"),
        ]);
        strip_hop_by_hop(&mut m);
        assert_eq!(names(&m), ["content-length", "host", "x-kept"]);
    }

    #[test]
    fn the_usual_connection_options_drop_only_the_fixed_set() {
        let mut m = map(&[
            ("connection", "Keep-Alive"),
            ("Connection", "close"),
            ("keep-alive", "timeout=5"),
            ("host", "api"),
            ("x-a", "1"),
        ]);
        strip_hop_by_hop(&mut m);
        assert_eq!(names(&m), ["host", "x-a"]);
    }

    #[test]
    fn a_name_off_the_wire_is_hop_by_hop_in_any_case_exactly_when_its_header_is() {
        for name in &HOP_BY_HOP {
            assert!(is_hop_by_hop_name(name.as_str()), "{name}");
            assert!(
                is_hop_by_hop_name(&name.as_str().to_ascii_uppercase()),
                "{name}"
            );
        }
        for name in [
            "date",
            "content-length",
            "x-te",
            "tee",
            "server",
            "upgrade-insecure-requests",
            "",
        ] {
            let header = HeaderName::from_bytes(name.as_bytes()).ok();
            assert!(!is_hop_by_hop_name(name), "{name}");
            assert!(header.is_none_or(|h| !is_hop_by_hop(&h)), "{name}");
        }
    }

    #[test]
    fn leaves_ordinary_headers_alone() {
        let mut m = map(&[("host", "api"), ("x-a", "1"), ("x-a", "2")]);
        let before = m.clone();
        strip_hop_by_hop(&mut m);
        assert_eq!(m, before);
    }

    #[test]
    fn forwarded_for_is_added_or_extended() {
        let ip = HeaderValue::from_static("10.0.0.7");
        let mut m = map(&[]);
        add_forwarded(&mut m, &ip);
        assert_eq!(m[&X_FORWARDED_FOR], "10.0.0.7");
        assert_eq!(m[&X_FORWARDED_PROTO], "http");

        let mut m = map(&[
            ("x-forwarded-for", "1.2.3.4"),
            ("x-forwarded-for", "5.6.7.8"),
            ("x-forwarded-proto", "https"),
        ]);
        add_forwarded(&mut m, &ip);
        let all: Vec<_> = m.get_all(&X_FORWARDED_FOR).iter().collect();
        assert_eq!(all, ["1.2.3.4, 5.6.7.8, 10.0.0.7"]);
        assert_eq!(m[&X_FORWARDED_PROTO], "http");
    }

    #[test]
    fn counts_header_lines() {
        let m = map(&[("host", "api"), ("x-a", "12345")]);
        assert_eq!(header_bytes(&m), (4 + 3 + 4) + (3 + 5 + 4));
    }
}
