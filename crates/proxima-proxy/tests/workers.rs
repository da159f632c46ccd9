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
use proxima_proxy::{Metrics, Proxy, ProxyConfig, WorkerCpus, WorkerOptions};
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

fn proxy(backend: SocketAddr, registry: &Registry) -> Arc<Proxy> {
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
    let metrics = Arc::new(Metrics::new(registry).unwrap());
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
            .header("host", "api")
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

/// The tests read this process's worker threads from `/proc`: one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// CPUs in a `/proc` list such as `0-3,6`.
fn cpu_list(list: &str) -> Vec<usize> {
    let mut cpus = Vec::new();
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        let (first, last) = part.split_once('-').unwrap_or((part, part));
        cpus.extend(first.parse::<usize>().unwrap()..=last.parse::<usize>().unwrap());
    }
    cpus
}

fn allowed_cpus(status: &str) -> Vec<usize> {
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .expect("Cpus_allowed_list in /proc status");
    cpu_list(line)
}

/// The CPUs each of this process's proxy worker threads may run on (thread names are
/// cut to 15 bytes, `proxima-worker-`).
fn worker_thread_cpus() -> Vec<Vec<usize>> {
    let mut found = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.starts_with("proxima-worker") {
            if let Ok(status) = std::fs::read_to_string(task.path().join("status")) {
                found.push(allowed_cpus(&status));
            }
        }
    }
    found
}

/// The CPUs of each worker thread once `settled` holds for them (threads name and pin
/// themselves once started); what was last seen after five seconds.
async fn worker_cpus_once(settled: impl Fn(&[Vec<usize>]) -> bool) -> Vec<Vec<usize>> {
    let mut seen = worker_thread_cpus();
    for _ in 0..100 {
        if settled(&seen) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        seen = worker_thread_cpus();
    }
    seen
}

/// Wait until the worker threads of an earlier test have exited.
async fn no_worker_threads() {
    let left = worker_cpus_once(|threads| threads.is_empty()).await;
    assert!(
        left.is_empty(),
        "worker threads of an earlier test are still running"
    );
}

fn stopper(
    stopped: &watch::Receiver<bool>,
) -> impl Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    let stopped = stopped.clone();
    move || {
        let mut stopped = stopped.clone();
        Box::pin(async move {
            let _ = stopped.wait_for(|s| *s).await;
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_serve_reuse_their_own_upstream_connections_and_stop_together() {
    let _one = ONE_AT_A_TIME.lock().await;
    let serving = Serving::start(WorkerOptions::new(3)).await;
    let (addr, proxy, upstream_peers) = (serving.addr, &serving.proxy, &serving.upstream_peers);
    // Shared CPUs: every worker may run wherever the process may.
    let process = allowed_cpus(&std::fs::read_to_string("/proc/self/status").unwrap());
    let shared = worker_cpus_once(|threads| threads.len() == 3).await;
    assert_eq!(shared, vec![process; 3]);

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

    serving.stop().await;
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "the listener is closed"
    );
}

/// Workers serving in front of a counting server, with their metrics.
struct Serving {
    proxy: Arc<Proxy>,
    /// The upstream connections the counting server accepted, by peer address.
    upstream_peers: Arc<Mutex<HashSet<SocketAddr>>>,
    registry: Registry,
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    workers: proxima_proxy::Workers,
}

impl Serving {
    /// Workers started with `options`, once those of an earlier test have exited.
    async fn start(options: WorkerOptions) -> Self {
        no_worker_threads().await;
        let (backend, upstream_peers) = counting_server().await;
        let registry = Registry::new();
        let proxy = proxy(backend, &registry);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = watch::channel(false);
        let workers =
            proxima_proxy::serve_on_workers(proxy.clone(), listener, options, stopper(&stopped))
                .unwrap();
        Self {
            proxy,
            upstream_peers,
            registry,
            addr,
            stop,
            workers,
        }
    }

    /// Four client connections at once, twenty requests each.
    async fn load(&self) {
        let clients: Vec<_> = (0..4).map(|_| tokio::spawn(gets(self.addr, 20))).collect();
        for client in clients {
            assert_eq!(client.await.unwrap().len(), 20);
        }
    }

    /// The yields the workers counted.
    fn yields(&self) -> f64 {
        self.registry
            .gather()
            .into_iter()
            .find(|family| family.get_name() == "proxima_worker_yields_total")
            .map(|family| family.get_metric()[0].get_counter().get_value())
            .expect("the yield counter is exported")
    }

    async fn stop(self) {
        self.stop.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(10), self.workers.join())
            .await
            .expect("every worker stops on the signal")
            .expect("no worker failed");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pinned_workers_take_the_processs_cpus_in_turn() {
    let _one = ONE_AT_A_TIME.lock().await;
    let process = allowed_cpus(&std::fs::read_to_string("/proc/self/status").unwrap());
    // One worker more than the process has CPUs: the last one wraps around.
    let count = process.len() + 1;
    let serving = Serving::start(WorkerOptions {
        count,
        cpus: WorkerCpus::Pinned,
        // Any busy time at all would do, but pinned workers never give way.
        yield_after: Some(Duration::from_nanos(1)),
    })
    .await;
    let pinned = worker_cpus_once(|threads| {
        threads.len() == count && threads.iter().all(|cpus| cpus.len() == 1)
    })
    .await;
    assert_eq!(pinned.len(), count, "{pinned:?}");
    let mut pinned: Vec<usize> = pinned
        .into_iter()
        .map(|cpus| {
            assert_eq!(cpus.len(), 1, "a pinned worker runs on one CPU: {cpus:?}");
            cpus[0]
        })
        .collect();
    pinned.sort_unstable();
    let mut expected: Vec<usize> = (0..count).map(|n| process[n % process.len()]).collect();
    expected.sort_unstable();
    assert_eq!(pinned, expected, "the process may use {process:?}");

    serving.load().await;
    assert_eq!(serving.yields(), 0.0);
    serving.stop().await;
}

/// Serve 80 requests on `count` shared workers that give way after any busy time; the
/// yields counted.
async fn yields_of_busy_workers(count: usize) -> f64 {
    let serving = Serving::start(WorkerOptions {
        yield_after: Some(Duration::from_nanos(1)),
        ..WorkerOptions::new(count)
    })
    .await;
    serving.load().await;
    let yields = serving.yields();
    serving.stop().await;
    yields
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_workers_give_way_only_when_each_could_have_a_cpu() {
    let _one = ONE_AT_A_TIME.lock().await;
    let cpus = allowed_cpus(&std::fs::read_to_string("/proc/self/status").unwrap()).len();
    // A lone worker has no sibling to give way to.
    assert_eq!(yields_of_busy_workers(1).await, 0.0);
    // More workers than CPUs share them by the kernel's time slices.
    assert_eq!(yields_of_busy_workers(cpus + 1).await, 0.0);
    // Two workers, each of which could have a CPU: they give way (on one CPU, two
    // workers are more than CPUs).
    let two = yields_of_busy_workers(2).await;
    if cpus >= 2 {
        assert!(two >= 1.0, "{two} yields");
    } else {
        assert_eq!(two, 0.0);
    }
}
