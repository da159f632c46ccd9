//! Which service a request is for.
//!
//! Clients name the target Service in the `x-service` header (the QEdgeProxy paper, §IV:
//! "the service name included in the request header") or, without it, in `Host`, in any
//! of the forms Kubernetes DNS gives a Service:
//!
//! | form                                   | namespace           |
//! |----------------------------------------|---------------------|
//! | `name`                                 | the default one     |
//! | `name.ns`                              | `ns`                |
//! | `name.ns.svc`                          | `ns`                |
//! | `name.ns.svc.<cluster domain>`         | `ns`                |
//!
//! Each form may end in `:port`: a Service port number, or (header form only, since a
//! Host port is always numeric) a port name such as `name:grpc`. Names are DNS labels
//! and compared in lower case; a trailing dot (`….cluster.local.`) is accepted.
//!
//! Parsing is pure and allocation-free ([`split_target`]); only building the
//! [`ServiceKey`] allocates, and `TargetCache` skips even that while a connection keeps
//! naming the same service, as clients of one service do.

use std::sync::Arc;

use http::HeaderValue;
use proxima_core::{PortRef, ServiceKey};

/// Where the target was named.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetSource {
    /// The service header (`x-service`); port names are allowed.
    Header,
    /// `Host` (or the HTTP/2 `:authority`); ports are numbers.
    Host,
}

/// Why a request names no routable service (answered with `400`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    /// No service header and no usable `Host`.
    #[error("the request names no service")]
    Missing,
    /// The name cannot be a service: the reason.
    #[error("{0}")]
    Invalid(&'static str),
}

/// The parts of a target, borrowed from the header value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TargetParts<'a> {
    /// Service name.
    pub name: &'a str,
    /// Namespace, when the target named one.
    pub namespace: Option<&'a str>,
    /// Port, when the target named one (a name only in the service header).
    pub port: Option<PortRef<'a>>,
}

impl TargetParts<'_> {
    /// The service key, in lower case, in `default_namespace` when none was named.
    pub fn key(&self, default_namespace: &str) -> ServiceKey {
        ServiceKey::new(
            self.namespace
                .unwrap_or(default_namespace)
                .to_ascii_lowercase(),
            self.name.to_ascii_lowercase(),
        )
    }
}

/// Parse a target (see the module docs) into its service key and optional port.
pub fn parse_target<'a>(
    value: &'a str,
    source: TargetSource,
    default_namespace: &str,
    cluster_domain: &str,
) -> Result<(ServiceKey, Option<PortRef<'a>>), TargetError> {
    let parts = split_target(value, source, cluster_domain)?;
    Ok((parts.key(default_namespace), parts.port))
}

/// Split and validate a target without allocating.
pub fn split_target<'a>(
    value: &'a str,
    source: TargetSource,
    cluster_domain: &str,
) -> Result<TargetParts<'a>, TargetError> {
    let (host, port) = split_port(value, source)?;
    let host = host.strip_suffix('.').unwrap_or(host);
    let mut labels = host.splitn(4, '.');
    let name = labels.next().unwrap_or_default();
    let namespace = labels.next();
    match labels.next() {
        None => {}
        Some(svc) if svc.eq_ignore_ascii_case("svc") => {
            if let Some(domain) = labels.next() {
                let expected = cluster_domain.trim_end_matches('.');
                if expected.is_empty() || !domain.eq_ignore_ascii_case(expected) {
                    return Err(TargetError::Invalid("not this cluster's domain"));
                }
            }
        }
        Some(_) => {
            return Err(TargetError::Invalid(
                "expected name, name.namespace, name.namespace.svc or name.namespace.svc.<cluster domain>",
            ))
        }
    }
    check_label(name)?;
    if let Some(ns) = namespace {
        check_label(ns)?;
    }
    Ok(TargetParts {
        name,
        namespace,
        port,
    })
}

/// Split off and parse the optional `:port`.
pub fn split_port(
    value: &str,
    source: TargetSource,
) -> Result<(&str, Option<PortRef<'_>>), TargetError> {
    let value = value.trim();
    if value.is_empty() {
        return Err(TargetError::Missing);
    }
    if value.starts_with('[') {
        return Err(TargetError::Invalid("an IP address is not a service name"));
    }
    let Some((host, port)) = value.rsplit_once(':') else {
        return Ok((value, None));
    };
    let port = if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) {
        match port.parse::<u16>() {
            Ok(n) if n > 0 => PortRef::Number(n),
            _ => return Err(TargetError::Invalid("port number out of range")),
        }
    } else if source == TargetSource::Header && is_port_name(port) {
        PortRef::Name(port)
    } else {
        return Err(TargetError::Invalid("invalid port"));
    };
    Ok((host, Some(port)))
}

/// A DNS label: 1–63 letters, digits and inner dashes.
fn check_label(label: &str) -> Result<(), TargetError> {
    let ok = !label.is_empty()
        && label.len() <= 63
        && !label.starts_with('-')
        && !label.ends_with('-')
        && label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(TargetError::Invalid(
            "not a valid service or namespace name",
        ))
    }
}

/// A Kubernetes port name (IANA service name): 1–15 lower-case letters, digits and inner
/// dashes, with at least one letter.
fn is_port_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 15
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.contains("--")
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && name.bytes().any(|b| b.is_ascii_lowercase())
}

/// The last target a connection named and its key (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct TargetCache {
    last: Option<(TargetSource, HeaderValue, Arc<ServiceKey>)>,
}

impl TargetCache {
    /// The service key for `raw`, validated; reuses the previous key when `raw` repeats.
    pub(crate) fn key(
        &mut self,
        raw: &HeaderValue,
        source: TargetSource,
        default_namespace: &str,
        cluster_domain: &str,
    ) -> Result<Arc<ServiceKey>, TargetError> {
        if let Some((s, v, key)) = &self.last {
            if *s == source && v == raw {
                return Ok(key.clone());
            }
        }
        let text = raw
            .to_str()
            .map_err(|_| TargetError::Invalid("the service name is not ASCII"))?;
        let key = Arc::new(split_target(text, source, cluster_domain)?.key(default_namespace));
        // A copy of the few bytes, not `raw.clone()`: `raw` is usually a slice of the
        // connection's read buffer (the head was split off it), and keeping it would pin
        // that whole buffer for as long as the connection lives, idle or not.
        let owned = HeaderValue::from_bytes(raw.as_bytes()).unwrap_or_else(|_| raw.clone());
        self.last = Some((source, owned, key.clone()));
        Ok(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use TargetSource::{Header, Host};

    fn parse(
        value: &str,
        source: TargetSource,
    ) -> Result<(ServiceKey, Option<PortRef<'_>>), TargetError> {
        parse_target(value, source, "default", "cluster.local")
    }

    fn key(ns: &str, name: &str) -> ServiceKey {
        ServiceKey::new(ns, name)
    }

    #[test]
    fn the_remembered_name_does_not_hold_the_buffer_it_was_read_from() {
        let head = bytes::Bytes::from(b"GET / HTTP/1.1\r\nx-service: api.shop\r\n\r\n".to_vec());
        let raw = HeaderValue::from_maybe_shared(head.slice(27..35)).unwrap();
        let mut cache = TargetCache::default();
        let key = cache.key(&raw, Header, "default", "cluster.local").unwrap();
        assert_eq!(*key, ServiceKey::new("shop", "api"));
        drop(raw);
        assert!(head.is_unique(), "the cache still holds the request's head");
        // And it still recognises the name when it comes again.
        let again = HeaderValue::from_static("api.shop");
        let same = cache
            .key(&again, Header, "default", "cluster.local")
            .unwrap();
        assert!(Arc::ptr_eq(&key, &same));
    }

    #[test]
    fn every_dns_form_names_the_same_service() {
        for value in [
            "api.shop",
            "api.shop.svc",
            "api.shop.svc.cluster.local",
            "api.shop.svc.cluster.local.",
            "API.Shop.SVC.Cluster.Local",
        ] {
            for source in [Header, Host] {
                assert_eq!(
                    parse(value, source),
                    Ok((key("shop", "api"), None)),
                    "{value}"
                );
            }
        }
        assert_eq!(parse("api", Host), Ok((key("default", "api"), None)));
        assert_eq!(parse("api.", Host), Ok((key("default", "api"), None)));
        assert_eq!(
            parse_target("api", Header, "edge", "cluster.local"),
            Ok((key("edge", "api"), None))
        );
    }

    #[test]
    fn ports_by_number_and_by_name() {
        assert_eq!(
            parse("api:8080", Host),
            Ok((key("default", "api"), Some(PortRef::Number(8080))))
        );
        assert_eq!(
            parse("api.shop.svc.cluster.local:80", Host),
            Ok((key("shop", "api"), Some(PortRef::Number(80))))
        );
        assert_eq!(
            parse("api.shop:grpc-web", Header),
            Ok((key("shop", "api"), Some(PortRef::Name("grpc-web"))))
        );
        assert_eq!(
            parse("api.shop.svc:http", Header),
            Ok((key("shop", "api"), Some(PortRef::Name("http"))))
        );
        // A Host port is a number.
        assert!(parse("api:http", Host).is_err());
        for bad in [
            "api:0",
            "api:65536",
            "api:",
            "api:-x",
            "api:Http",
            "api:a--b",
            "api:abcdefghijklmnop",
        ] {
            assert!(parse(bad, Header).is_err(), "{bad}");
        }
    }

    #[test]
    fn rejects_what_is_not_a_service() {
        assert_eq!(parse("", Header), Err(TargetError::Missing));
        assert_eq!(parse("   ", Host), Err(TargetError::Missing));
        for bad in [
            "127.0.0.1",
            "127.0.0.1:8080",
            "[::1]:8080",
            "::1",
            "api.shop.svc.other.domain",
            "api.shop.cluster.local",
            "api.shop.svc.cluster.local.extra",
            "-api",
            "api-.shop",
            "a..b",
            ".api",
            "api/x",
            "ap i",
            "ä.shop",
        ] {
            assert!(parse(bad, Header).is_err(), "{bad:?} should be rejected");
        }
        let long = "a".repeat(64);
        assert!(parse(&long, Header).is_err());
        assert!(parse(&"a".repeat(63), Header).is_ok());
    }

    #[test]
    fn never_panics_on_arbitrary_bytes() {
        let alphabet = b"aZ09-.:[]% \t\xff";
        // Every string of up to 4 symbols from the alphabet.
        let mut stack = vec![Vec::new()];
        while let Some(s) = stack.pop() {
            let text = String::from_utf8_lossy(&s);
            let _ = parse(&text, Header);
            let _ = parse(&text, Host);
            if s.len() < 4 {
                for &b in alphabet {
                    let mut next = s.clone();
                    next.push(b);
                    stack.push(next);
                }
            }
        }
    }

    #[test]
    fn cache_reuses_the_key_for_the_same_value_only() {
        let mut cache = TargetCache::default();
        let a = HeaderValue::from_static("api.shop");
        let k1 = cache.key(&a, Header, "default", "cluster.local").unwrap();
        let k2 = cache
            .key(&a.clone(), Header, "default", "cluster.local")
            .unwrap();
        assert!(Arc::ptr_eq(&k1, &k2));
        let b = HeaderValue::from_static("web");
        let k3 = cache.key(&b, Header, "default", "cluster.local").unwrap();
        assert_eq!(*k3, key("default", "web"));
        assert!(cache
            .key(
                &HeaderValue::from_static("a b"),
                Header,
                "default",
                "cluster.local"
            )
            .is_err());
        let not_ascii = HeaderValue::from_bytes(b"caf\xe9").unwrap();
        assert!(cache
            .key(&not_ascii, Header, "default", "cluster.local")
            .is_err());
    }
}
