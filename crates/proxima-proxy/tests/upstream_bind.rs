//! `ProxyConfig::upstream_bind`: client traffic and background probes leave from the
//! configured local address. A real proxy on loopback forwards to a real HTTP server that
//! records the peer address of every request it gets.

use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use proxima_core::{Endpoint, Router, ServiceKey, ServiceSettings, ServiceSpec, Update};
use proxima_proxy::prometheus::Registry;
use proxima_proxy::{Metrics, Proxy, ProxyConfig};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Requests seen by the recording server: (peer address, user agent).
type Seen = Arc<Mutex<Vec<(IpAddr, String)>>>;

/// An HTTP/1.1 server that records who asked and answers after `delay`.
async fn recording_server(delay: Duration) -> (SocketAddr, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Seen = Arc::default();
    let record = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, peer)) = listener.accept().await else {
                return;
            };
            let record = record.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req: Request<Incoming>| {
                    let agent = req
                        .headers()
                        .get("user-agent")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_string();
                    record.lock().unwrap().push((peer.ip(), agent));
                    async move {
                        tokio::time::sleep(delay).await;
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, seen)
}

/// A proxy bound to `bind` for upstreams, routing service `api` to `backend`.
async fn proxy(
    bind: IpAddr,
    backend: SocketAddr,
    settings: &[(&str, &str)],
) -> (SocketAddr, watch::Sender<bool>) {
    let router = Arc::new(Router::new(None));
    let (settings, errors) = ServiceSettings::from_pairs(settings.iter().copied());
    assert!(errors.is_empty(), "{errors:?}");
    let key = ServiceKey::new("default", "api");
    router.apply(
        [Update::Reset {
            nodes: vec![],
            services: vec![(
                ServiceSpec::new(key, vec![], settings),
                vec![Endpoint::new("api-0", backend)],
            )],
        }],
        Instant::now(),
    );
    let metrics = Arc::new(Metrics::new(&Registry::new()).unwrap());
    let config = ProxyConfig {
        upstream_bind: Some(bind),
        ..ProxyConfig::default()
    };
    let proxy = Proxy::new(router, metrics, config);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = watch::channel(false);
    let wait = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    tokio::spawn(proxima_proxy::serve(
        proxy.clone(),
        listener,
        wait(stopped.clone()),
    ));
    tokio::spawn(proxima_proxy::run_prober(proxy, wait(stopped)));
    (addr, stop)
}

async fn get(proxy: SocketAddr) -> StatusCode {
    let stream = TcpStream::connect(proxy).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::builder()
        .uri("/")
        .header("host", "api")
        .header("x-service", "api")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let response = sender.send_request(req).await.unwrap();
    let status = response.status();
    response.into_body().collect().await.unwrap();
    status
}

const BIND: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 77));

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_leave_from_the_bind_address() {
    let (backend, seen) = recording_server(Duration::ZERO).await;
    let (proxy, _stop) = proxy(BIND, backend, &[]).await;
    for _ in 0..5 {
        assert_eq!(get(proxy).await, StatusCode::OK);
    }
    let seen = seen.lock().unwrap().clone();
    // Besides the five requests, the new pod's first probe (also from the bind address).
    let requests = seen.iter().filter(|(_, agent)| agent != "proxima-probe");
    assert_eq!(requests.count(), 5, "{seen:?}");
    assert!(seen.iter().all(|(ip, _)| *ip == BIND), "{seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_probes_leave_from_the_bind_address() {
    // Every answer takes 20 ms against an SLO of 1 ms: the pod is evicted after its
    // first measurement and then only probed.
    let (backend, seen) = recording_server(Duration::from_millis(20)).await;
    let settings = [
        ("latency-slo", "1ms"),
        ("qos-pool-min-samples", "1"),
        ("qos-pool-probe-interval", "50ms"),
        ("qos-pool-probe-max-interval", "50ms"),
    ];
    let (proxy, _stop) = proxy(BIND, backend, &settings).await;
    assert_eq!(get(proxy).await, StatusCode::OK);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let probes: Vec<(IpAddr, String)> = seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, agent)| agent == "proxima-probe")
            .cloned()
            .collect();
        if probes.len() >= 2 {
            assert!(probes.iter().all(|(ip, _)| *ip == BIND), "{probes:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no probes arrived: {:?}",
            seen.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_of_the_other_family_is_a_connect_failure() {
    let (backend, seen) = recording_server(Duration::ZERO).await;
    let v6 = IpAddr::V6(std::net::Ipv6Addr::LOCALHOST);
    let (proxy, _stop) = proxy(v6, backend, &[]).await;
    // Nothing reached the pod: the client gets a gateway error, never a hang.
    let status = get(proxy).await;
    assert!(status.is_server_error(), "{status}");
    assert!(seen.lock().unwrap().is_empty());
}
