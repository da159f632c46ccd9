//! Fuzzing of everything that parses input from outside the proxy (issue 10): service
//! names from `x-service`, `Host` and absolute URIs; topology files; Service annotations
//! as the Kubernetes index reads them; what pods send back to the native HTTP/1.1
//! exchange (response heads, body framing); client request heads as the proxy's own
//! HTTP/1.1 loop reads them (nothing it leaves to hyper may be consumed). Each property feeds random and mutated input and
//! asserts only that nothing panics and that accepted names are well formed.
//!
//! A proptest harness rather than cargo-fuzz, which needs a nightly compiler. It runs with
//! the other tests for a bounded number of cases (`PROXIMA_FUZZ_CASES`, default 512 per
//! property, about a second each); CI can raise it for a longer run, e.g.
//! `PROXIMA_FUZZ_CASES=10000 cargo test --test fuzz` (as `.ci/run` does).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1 as core;
use kube::runtime::watcher::Event;
use proptest::prelude::*;
use proxima_core::ServiceSettings;
use proxima_k8s::{Index, IndexConfig, Watched};
use proxima_proxy::target::split_target;
use proxima_proxy::{decode_for_fuzzing, parse_request_for_fuzzing, parse_target, TargetSource};

fn config() -> ProptestConfig {
    let cases = std::env::var("PROXIMA_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(512);
    ProptestConfig {
        cases,
        // The properties only check for panics; no need to shrink at length.
        max_shrink_iters: 256,
        // Integration tests have no lib.rs to put a regressions file beside.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Strings built from the characters that matter to the name parsers, plus anything.
fn name_like() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-zA-Z0-9.:\\[\\]%@/ \t_-]{0,80}",
        ".{0,40}",
        "([a-z0-9-]{0,70}\\.){0,6}[a-z0-9-]{0,70}(:[0-9a-z]{0,8})?",
    ]
}

/// Responses a pod might send: valid ones of every framing, to be mutated.
const RESPONSES: &[&[u8]] = &[
    b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nx-a: b\r\n\r\nhello",
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5;x=y\r\nhello\r\n0\r\nt: 1\r\n\r\n",
    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.0 404 Not Found\r\nconnection: keep-alive\r\n\r\nbody until close",
    b"HTTP/1.1 304 Not Modified\r\ncontent-length: 10\r\n\r\n",
    b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
];

/// A valid response, with byte ranges replaced, inserted or deleted.
/// Client request heads the proxy's own HTTP/1.1 loop serves, or leaves to hyper.
const REQUESTS: &[&[u8]] = &[
    b"GET /a?b=c HTTP/1.1\r\nhost: api\r\nx-service: api.default\r\n\r\nGET / HTTP/1.1\r\n",
    b"HEAD / HTTP/1.0\r\nconnection: keep-alive\r\ncontent-length: 0\r\n\r\n",
    b"POST /p HTTP/1.1\r\ncontent-length: 3\r\nexpect: 100-continue\r\n\r\nabc",
    b"GET http://api.default.svc:8080/x HTTP/1.1\r\nte: trailers\r\n\r\n",
];

/// A sample of `bases` with a few byte ranges replaced.
fn mutated(bases: &'static [&'static [u8]]) -> impl Strategy<Value = Vec<u8>> {
    let edits = prop::collection::vec(
        (
            any::<prop::sample::Index>(),
            0usize..8,
            prop::collection::vec(
                prop_oneof![
                    any::<u8>(),
                    prop::sample::select(b"\r\n:;, 0123456789abcdefABCDEF".to_vec())
                ],
                0..8,
            ),
        ),
        1..5,
    );
    (prop::sample::select(bases), edits).prop_map(|(base, edits)| {
        let mut bytes = base.to_vec();
        for (at, remove, insert) in edits {
            let at = at.index(bytes.len() + 1);
            let end = (at + remove).min(bytes.len());
            bytes.splice(at..end, insert);
        }
        bytes
    })
}

/// The annotated example topology, so that mutations start from something valid.
const EXAMPLE: &str = include_str!("../examples/topology.yaml");

/// Mutations of a YAML document: replace, insert or delete a byte range.
fn mutated_yaml() -> impl Strategy<Value = String> {
    let edits = prop::collection::vec(
        (
            any::<prop::sample::Index>(),
            0usize..16,
            "[ -~\n\t]{0,12}|[\\[\\]{}:,&*!|>'\"%@`#-]{1,4}",
        ),
        1..6,
    );
    edits.prop_map(|edits| {
        let mut text = EXAMPLE.as_bytes().to_vec();
        for (at, remove, insert) in edits {
            let start = at.index(text.len() + 1);
            let end = (start + remove).min(text.len());
            text.splice(start..end, insert.into_bytes());
        }
        String::from_utf8_lossy(&text).into_owned()
    })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn service_names_never_panic(value in name_like(), header in any::<bool>()) {
        let source = if header { TargetSource::Header } else { TargetSource::Host };
        if let Ok(parts) = split_target(&value, source, "cluster.local") {
            // What is accepted is a DNS label (and namespace label).
            for label in std::iter::once(parts.name).chain(parts.namespace) {
                prop_assert!(!label.is_empty() && label.len() <= 63, "{value:?}");
                prop_assert!(
                    label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'),
                    "{value:?}"
                );
            }
        }
        let _ = parse_target(&value, source, "default", "cluster.local");
    }

    #[test]
    fn absolute_uris_never_panic(authority in name_like(), path in "[ -~]{0,40}") {
        let uri = format!("http://{authority}/{path}");
        if let Ok(uri) = uri.parse::<http::Uri>() {
            if let Some(authority) = uri.authority() {
                let _ = parse_target(authority.as_str(), TargetSource::Host, "default", "cluster.local");
            }
        }
    }

    #[test]
    fn arbitrary_pod_responses_never_panic(
        bytes in prop::collection::vec(any::<u8>(), 0..300),
        head in any::<bool>(),
        max_headers in 0usize..8,
    ) {
        let _ = decode_for_fuzzing(&bytes, head, max_headers);
    }

    #[test]
    fn mutated_pod_responses_never_panic(bytes in mutated(RESPONSES), head in any::<bool>()) {
        let (parsed, decoded) = decode_for_fuzzing(&bytes, head, 100);
        // No more body than was sent.
        prop_assert!(!parsed || decoded <= bytes.len());
    }

    #[test]
    fn arbitrary_client_requests_never_panic_nor_lose_bytes(
        bytes in prop::collection::vec(any::<u8>(), 0..300),
        max_headers in 0usize..8,
    ) {
        let (native, left) = parse_request_for_fuzzing(&bytes, max_headers);
        let kept = if native { left < bytes.len() } else { left == bytes.len() };
        prop_assert!(kept, "native {native}, {left} of {} bytes left", bytes.len());
    }

    #[test]
    fn mutated_client_requests_never_panic_nor_lose_bytes(bytes in mutated(REQUESTS)) {
        // What the native loop does not serve goes to hyper whole.
        let (native, left) = parse_request_for_fuzzing(&bytes, 100);
        let kept = if native { left < bytes.len() } else { left == bytes.len() };
        prop_assert!(kept, "native {native}, {left} of {} bytes left", bytes.len());
    }

    #[test]
    fn chunked_bodies_decode_to_the_bytes_encoded(
        pieces in prop::collection::vec((1usize..300, "(;[a-z]{1,5}(=[a-z0-9]{0,5})?)?", any::<bool>()), 0..12),
        trailers in "([a-z]{1,8}: [ -~]{0,10}\r\n){0,3}",
    ) {
        let mut bytes = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
        let mut total = 0;
        for (len, extension, upper) in &pieces {
            let size = if *upper { format!("{len:X}") } else { format!("{len:x}") };
            bytes.extend_from_slice(format!("{size}{extension}\r\n").as_bytes());
            bytes.extend(std::iter::repeat_n(b'x', *len));
            bytes.extend_from_slice(b"\r\n");
            total += len;
        }
        bytes.extend_from_slice(format!("0\r\n{trailers}\r\n").as_bytes());
        prop_assert_eq!(decode_for_fuzzing(&bytes, false, 100), (true, total));
    }

    #[test]
    fn arbitrary_topologies_never_panic(text in ".{0,400}") {
        let _ = proxima_discovery::parse(&text);
    }

    #[test]
    fn mutated_topologies_never_panic(text in mutated_yaml()) {
        if let Err(error) = proxima_discovery::parse(&text) {
            // A rejected edit names its problems.
            prop_assert!(!error.to_string().is_empty());
        }
    }

    #[test]
    fn annotations_never_panic(
        pairs in prop::collection::vec(
            (
                prop_oneof![
                    Just("proxima.io/enabled".to_string()),
                    Just("proxima.io/latency-slo".to_string()),
                    Just("proxima.io/strategy".to_string()),
                    Just("proxima.io/retries".to_string()),
                    Just("proxima.io/qos-pool-window".to_string()),
                    "proxima\\.io/[a-z-]{0,30}",
                    ".{0,20}",
                ],
                prop_oneof![".{0,30}", "[0-9.]{1,12}(us|ms|s|m|h|%)?", Just("true".to_string())],
            ),
            0..8,
        )
    ) {
        let (_, errors) = ServiceSettings::from_annotations(
            pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        );
        for error in &errors {
            // Every rejection can be logged and published as an Event.
            prop_assert!(!error.to_string().is_empty());
        }
        // Through the Kubernetes index too, as a watched Service.
        let annotations: BTreeMap<String, String> = pairs.into_iter().collect();
        let service = core::Service {
            metadata: kube::api::ObjectMeta {
                name: Some("api".into()),
                namespace: Some("default".into()),
                annotations: Some(annotations),
                ..Default::default()
            },
            ..Default::default()
        };
        let mut index = Index::new(IndexConfig::default());
        let _ = index.apply(None, Watched::Service(Event::Apply(service)));
    }
}
