//! The admin server on a real socket, queried with hyper's HTTP/1 client.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use proxima_admin::{serve, AdminState, Readiness};
use proxima_core::{Endpoint, Outcome, Router, ServiceKey, ServiceSettings, ServiceSpec, Update};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

struct Admin {
    addr: SocketAddr,
    state: Arc<AdminState>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

impl Admin {
    async fn start(router: Arc<Router>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(AdminState {
            router,
            registry: prometheus::Registry::new(),
            readiness: Readiness::new(),
        });
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(state.clone(), listener, async {
            let _ = stopped.await;
        }));
        Self {
            addr,
            state,
            stop: Some(stop),
            task: Some(task),
        }
    }

    async fn request(&self, method: Method, path: &str) -> (StatusCode, String, String) {
        let stream = TcpStream::connect(self.addr).await.unwrap();
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", "admin")
            .body(Empty::<Bytes>::new())
            .unwrap();
        let res = tokio::time::timeout(Duration::from_secs(30), sender.send_request(req))
            .await
            .expect("admin answers")
            .unwrap();
        let status = res.status();
        let content_type = res
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        let body = res.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            content_type,
            String::from_utf8(body.to_vec()).unwrap(),
        )
    }

    async fn get(&self, path: &str) -> (StatusCode, String) {
        let (status, _, body) = self.request(Method::GET, path).await;
        (status, body)
    }

    async fn stop(mut self) {
        self.stop.take().unwrap().send(()).unwrap();
        let task = self.task.take().unwrap();
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("the admin server stops")
            .unwrap()
            .unwrap();
    }
}

fn dps() -> ServiceKey {
    ServiceKey::new("default", "dps")
}

/// `dps` with three endpoints (one not ready) and `web` with one.
fn topology(with_web: bool) -> Update {
    let (settings, errors) = ServiceSettings::from_pairs([("latency-slo", "50ms")]);
    assert!(errors.is_empty());
    let mut services = vec![(
        ServiceSpec::new(dps(), vec![], settings),
        vec![
            Endpoint::new("fast", "127.0.0.1:9001".parse().unwrap()),
            Endpoint::new("slow", "127.0.0.1:9002".parse().unwrap()),
            Endpoint::new("down", "127.0.0.1:9003".parse().unwrap()).with_conditions(
                proxima_core::Conditions {
                    ready: false,
                    serving: false,
                    terminating: false,
                },
            ),
        ],
    )];
    if with_web {
        services.push((
            ServiceSpec::new(
                ServiceKey::new("default", "web"),
                vec![],
                ServiceSettings::default(),
            ),
            vec![Endpoint::new("web-1", "127.0.0.1:9004".parse().unwrap())],
        ));
    }
    Update::Reset {
        nodes: vec![],
        services,
    }
}

/// Feed `slow` responses over the SLO until it is evicted.
fn evict_slow(router: &Router) {
    let mut rng = rand::rngs::mock::StepRng::new(0, 1);
    for _ in 0..3 {
        let picked = router
            .pick(
                &dps(),
                None,
                Instant::now(),
                &mut rng,
                &["fast".to_string()],
            )
            .unwrap();
        assert_eq!(picked.endpoint().id, "slow");
        router.record(
            &picked,
            Instant::now(),
            Outcome::Response {
                latency: Duration::from_millis(200),
            },
        );
    }
}

fn metric_line<'b>(body: &'b str, prefix: &str) -> Option<&'b str> {
    body.lines().find(|l| l.starts_with(prefix))
}

#[tokio::test]
async fn health_and_readiness() {
    let admin = Admin::start(Arc::new(Router::new(None))).await;
    assert_eq!(
        admin.get("/healthz").await,
        (StatusCode::OK, "ok".to_string())
    );
    let (status, body) = admin.get("/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body.contains("discovery"), "{body}");

    // Any clone of the handle marks the shared state.
    let readiness = admin.state.readiness.clone();
    readiness.mark_synced();
    assert!(admin.state.readiness.is_synced());
    assert_eq!(
        admin.get("/readyz").await,
        (StatusCode::OK, "ok".to_string())
    );
    admin.stop().await;
}

#[tokio::test]
async fn metrics_show_the_registry_and_the_table() {
    let router = Arc::new(Router::new(None));
    router.apply([topology(true)], Instant::now());
    evict_slow(&router);
    let admin = Admin::start(router.clone()).await;
    let counter = prometheus::IntCounter::new("proxima_test_total", "A test counter.").unwrap();
    admin
        .state
        .registry
        .register(Box::new(counter.clone()))
        .unwrap();
    counter.inc_by(7);

    let (status, content_type, body) = admin.request(Method::GET, "/metrics").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        content_type.starts_with("text/plain; version=0.0.4"),
        "{content_type}"
    );
    assert_eq!(
        metric_line(&body, "proxima_test_total "),
        Some("proxima_test_total 7")
    );
    assert!(body.contains("# HELP proxima_pool_size "), "{body}");
    let expect = [
        r#"proxima_pool_size{service="dps.default"} 1"#,
        r#"proxima_endpoints{service="dps.default",state="evicted"} 1"#,
        r#"proxima_endpoints{service="dps.default",state="not_ready"} 1"#,
        r#"proxima_pool_size{service="web.default"} 1"#,
        r#"proxima_endpoints{service="web.default",state="not_ready"} 0"#,
        // Per pod: in the pool or not, in flight, and the estimate (NaN before a sample).
        r#"proxima_endpoint_in_pool{endpoint="fast",service="dps.default"} 1"#,
        r#"proxima_endpoint_in_pool{endpoint="slow",service="dps.default"} 0"#,
        r#"proxima_endpoint_in_pool{endpoint="down",service="dps.default"} 0"#,
        r#"proxima_endpoint_in_flight{endpoint="slow",service="dps.default"} 0"#,
        r#"proxima_endpoint_estimate_seconds{endpoint="slow",service="dps.default"} 0.2"#,
        r#"proxima_endpoint_estimate_seconds{endpoint="fast",service="dps.default"} NaN"#,
        r#"proxima_endpoint_in_pool{endpoint="web-1",service="web.default"} 1"#,
    ];
    for line in expect {
        assert!(
            body.lines().any(|l| l == line),
            "missing {line:?} in\n{body}"
        );
    }

    // `web` goes away: so do its label sets. `dps` keeps its state through the reset.
    router.apply([topology(false)], Instant::now());
    let (_, body) = admin.get("/metrics").await;
    assert!(!body.contains("web.default"), "{body}");
    assert!(!body.contains("web-1"), "{body}");
    assert!(
        body.lines()
            .any(|l| l == r#"proxima_endpoints{service="dps.default",state="evicted"} 1"#),
        "{body}"
    );
    admin.stop().await;
}

#[tokio::test]
async fn debug_pools_explains_every_endpoint() {
    let router = Arc::new(Router::new(Some("worker-1".to_string())));
    router.apply([topology(true)], Instant::now());
    evict_slow(&router);
    let admin = Admin::start(router).await;

    let (status, content_type, body) = admin.request(Method::GET, "/debug/pools").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(content_type, "application/json");
    assert!(
        body.contains("\n  \"node\": \"worker-1\""),
        "pretty-printed: {body}"
    );
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    let services = json["services"].as_array().unwrap();
    let names: Vec<_> = services
        .iter()
        .map(|s| s["service"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["dps.default", "web.default"]);
    let dps = &services[0];
    assert_eq!(dps["pool_size"], 1);
    assert_eq!(dps["latency_slo_ms"], 50.0);
    let slow = dps["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["id"] == "slow")
        .unwrap();
    assert_eq!(slow["in_pool"], false);
    assert_eq!(slow["samples"], 3);
    assert!(
        slow["reason"].as_str().unwrap().starts_with("evicted"),
        "{slow}"
    );

    for query in [
        "service=web.default",
        "service=web",
        "x=1&service=web.default",
    ] {
        let (status, body) = admin.get(&format!("/debug/pools?{query}")).await;
        assert_eq!(status, StatusCode::OK, "{query}");
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        let services = json["services"].as_array().unwrap();
        assert_eq!(services.len(), 1, "{query}");
        assert_eq!(services[0]["service"], "web.default");
    }
    let (status, body) = admin.get("/debug/pools?service=nope.default").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body.contains("unknown service nope.default"), "{body}");
    admin.stop().await;
}

#[tokio::test]
async fn other_paths_and_methods() {
    let admin = Admin::start(Arc::new(Router::new(None))).await;
    let (status, body) = admin.get("/").await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("/debug/pools"), "{body}");
    let (status, body) = admin.get("/nope").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body.contains("/metrics"), "lists what exists: {body}");
    let (status, _, _) = admin.request(Method::POST, "/healthz").await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    let (status, _, body) = admin.request(Method::HEAD, "/healthz").await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, ""));
    admin.stop().await;
}

#[tokio::test]
async fn stops_accepting_on_shutdown_and_rejects_a_second_server_on_one_registry() {
    let router = Arc::new(Router::new(None));
    let admin = Admin::start(router.clone()).await;
    let addr = admin.addr;
    // One request proves it is up before it is stopped.
    assert_eq!(admin.get("/healthz").await.0, StatusCode::OK);

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let err = serve(
        Arc::new(AdminState {
            router,
            registry: admin.state.registry.clone(),
            readiness: Readiness::new(),
        }),
        listener,
        std::future::pending(),
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("admin gauges"), "{err}");

    admin.stop().await;
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "the listener is closed"
    );
}
