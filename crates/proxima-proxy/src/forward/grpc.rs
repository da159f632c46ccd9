//! What the proxy reads of gRPC calls (gRPC's `doc/PROTOCOL-HTTP2.md`): whether a request
//! is one, its deadline (`grpc-timeout`), and the status of its answer (`grpc-status`),
//! which decides the call's outcome for the QoS pool (`forward.rs`).

use std::time::Duration;

use http::header::CONTENT_TYPE;
use http::HeaderMap;

/// Whether the head is a gRPC call's: `content-type: application/grpc`, alone or with a
/// message format (`application/grpc+proto`, `;charset=...`). gRPC-Web
/// (`application/grpc-web`) carries its status in the body and is passed as plain HTTP.
pub(crate) fn is_call(headers: &HeaderMap) -> bool {
    headers.get(CONTENT_TYPE).is_some_and(|value| {
        let value = value.as_bytes();
        value.starts_with(b"application/grpc")
            && matches!(
                value.get(b"application/grpc".len()),
                None | Some(b'+' | b';')
            )
    })
}

/// The call's `grpc-timeout`: an integer of at most 8 digits and a unit, `H`, `M`, `S`,
/// `m`, `u` or `n`. A malformed value is no deadline (as gRPC servers treat it).
pub(crate) fn timeout(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get("grpc-timeout")?.as_bytes();
    let (&unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let amount: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b'H' => Duration::from_secs(amount * 3600),
        b'M' => Duration::from_secs(amount * 60),
        b'S' => Duration::from_secs(amount),
        b'm' => Duration::from_millis(amount),
        b'u' => Duration::from_micros(amount),
        b'n' => Duration::from_nanos(amount),
        _ => return None,
    })
}

/// The `grpc-status` in `headers` (a Trailers-Only answer's headers, or trailers), if
/// present and a code; a value that is no number reads as UNKNOWN (2), as gRPC clients
/// read it.
pub(crate) fn status(headers: &HeaderMap) -> Option<u8> {
    let value = headers.get("grpc-status")?;
    Some(
        std::str::from_utf8(value.as_bytes())
            .ok()
            .and_then(|text| text.trim().parse::<u8>().ok())
            .unwrap_or(2),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(n, v)| (http::HeaderName::from_static(n), v.parse().unwrap()))
            .collect()
    }

    #[test]
    fn grpc_calls_are_told_by_their_content_type() {
        for yes in [
            "application/grpc",
            "application/grpc+proto",
            "application/grpc;charset=utf-8",
        ] {
            assert!(is_call(&head(&[("content-type", yes)])), "{yes}");
        }
        for no in [
            "application/grpc-web",
            "application/grpc-web+proto",
            "application/json",
            "application/grpcx",
        ] {
            assert!(!is_call(&head(&[("content-type", no)])), "{no}");
        }
        assert!(!is_call(&HeaderMap::new()));
    }

    #[test]
    fn grpc_timeouts_in_every_unit() {
        let t = |v: &'static str| timeout(&head(&[("grpc-timeout", v)]));
        assert_eq!(t("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(t("2M"), Some(Duration::from_secs(120)));
        assert_eq!(t("3S"), Some(Duration::from_secs(3)));
        assert_eq!(t("200m"), Some(Duration::from_millis(200)));
        assert_eq!(t("99999999u"), Some(Duration::from_micros(99_999_999)));
        assert_eq!(t("5n"), Some(Duration::from_nanos(5)));
        for bad in ["", "m", "123456789m", "10x", "-1S", "1.5S", " 1S"] {
            assert_eq!(t(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn grpc_status_reads_codes_and_takes_garbage_as_unknown() {
        assert_eq!(status(&head(&[("grpc-status", "0")])), Some(0));
        assert_eq!(status(&head(&[("grpc-status", "14")])), Some(14));
        assert_eq!(status(&head(&[("grpc-status", "x")])), Some(2));
        assert_eq!(status(&HeaderMap::new()), None);
    }
}
