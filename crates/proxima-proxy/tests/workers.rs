//! `serve_on_workers`: several worker threads, each with its own single-threaded
//! runtime, share one listener. Requests are served on every worker, each worker reuses
//! the keep-alive upstream connections it opened (so a client connection's requests do
//! not open new pod connections), and all workers stop on the stop signal.

use std::collections::HashSet;
use std::convert::Infallible;
use std::net::SocketAddr;
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

/// An HTTP/1.1 server that notes the peer address of every connection it accepts and
/// answers each request with the port the request came from, so a client can tell
/// which upstream connection carried it.
async fn counting_server() -> (SocketAddr, Arc<Mutex<HashSet<SocketAddr>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let peers: Arc<Mutex<HashSet<SocketAddr>>> = Arc::default();
    let seen = peers.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, peer)) = listener.accept().await else {
                return;
            };
            seen.lock().unwrap().insert(peer);
            tokio::spawn(async move {
                let service = service_fn(move |_req: Request<Incoming>| async move {
                    let body = Full::new(Bytes::from(peer.port().to_string()));
                    Ok::<_, Infallible>(Response::new(body))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, peers)
}

fn proxy(backend: SocketAddr) -> Arc<Proxy> {
    let router = Arc::new(Router::new(None));
    let (settings, errors) = ServiceSettings::from_pairs([("latency-slo", "1s")]);
    assert!(errors.is_empty(), "{errors:?}");
    router.apply(
        [Update::Reset {
            nodes: vec![],
            services: vec![(
                ServiceSpec::new(ServiceKey::new("default", "api"), vec![], settings),
                vec![Endpoint::new("api-0", backend)],
            )],
        }],
        Instant::now(),
    );
    let metrics = Arc::new(Metrics::new(&Registry::new()).unwrap());
    Proxy::new(router, metrics, ProxyConfig::default())
}

/// `count` GETs over one keep-alive client connection; the bodies (the port of the
/// upstream connection that carried each request).
async fn gets(proxy: SocketAddr, count: usize) -> Vec<String> {
    let stream = TcpStream::connect(proxy).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut bodies = Vec::new();
    for _ in 0..count {
        let req = Request::builder()
            .uri("/")
            .header("x-service", "api")
            .body(Empty::<Bytes>::new())
            .unwrap();
        sender.ready().await.unwrap();
        let response = sender.send_request(req).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        bodies.push(String::from_utf8(body.to_vec()).unwrap());
    }
    bodies
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_serve_reuse_their_own_upstream_connections_and_stop_together() {
    let (backend, upstream_peers) = counting_server().await;
    let proxy = proxy(backend);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = watch::channel(false);
    let workers = proxima_proxy::serve_on_workers(proxy.clone(), listener, 3, || {
        let mut stopped = stopped.clone();
        async move {
            let _ = stopped.wait_for(|s| *s).await;
        }
    })
    .unwrap();

    // Eight client connections at once, twenty requests each.
    let clients: Vec<_> = (0..8).map(|_| tokio::spawn(gets(addr, 20))).collect();
    let mut per_client = Vec::new();
    for client in clients {
        per_client.push(client.await.unwrap());
    }
    let carried: HashSet<&String> = per_client.iter().flatten().collect();
    assert_eq!(per_client.iter().flatten().count(), 160);
    // Each worker reuses the pod connections it opened: never more of them than
    // requests in flight at once (eight), where 160 requests without reuse would open
    // 160.
    let opened = upstream_peers.lock().unwrap().len();
    assert!((1..=8).contains(&opened), "{opened} upstream connections");
    assert_eq!(carried.len(), opened);
    assert!(proxy.idle_connections() <= 8);

    // Six client connections one after another: whichever worker takes one reuses its
    // own idle pod connection, so at most one new pod connection per worker (one per
    // client connection, six, if nothing were reused).
    for _ in 0..6 {
        gets(addr, 3).await;
    }
    let after = upstream_peers.lock().unwrap().len();
    assert!(
        after <= opened + 3,
        "{opened} then {after} upstream connections"
    );

    stop.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(10), workers.join())
        .await
        .expect("every worker stops on the signal")
        .expect("no worker failed");
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "the listener is closed"
    );
}
