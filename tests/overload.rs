//! Load shedding at the listener: beyond `max_concurrent_requests` in flight, requests
//! are answered `503` at once with a JSON body and `retry-after`, counted in
//! `proxima_requests_shed_total`, and nothing waits in a queue. Real sockets: emulated
//! pods that hold requests, HTTP/1.1 and HTTP/2 clients.

mod common;

use std::time::Duration;

use common::*;
use futures_util::future::join_all;
use http::StatusCode;
use proxima_proxy::ProxyConfig;

const LIMIT: usize = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_over_the_limit_get_503_with_a_body_and_retry_after() {
    let slow = backend_with(BackendConfig::new("slow-0").delay(Duration::from_secs(2))).await;
    let fast = backend("fast-0").await;
    let config = ProxyConfig {
        max_concurrent_requests: LIMIT,
        ..ProxyConfig::default()
    };
    let proxy = TestProxy::start_with(
        config,
        vec![
            (
                service("shop", "slow", &[], &[("latency-slo", "5s")]),
                vec![endpoint("slow-0", slow.addr())],
            ),
            (
                service("shop", "fast", &[], &[]),
                vec![endpoint("fast-0", fast.addr())],
            ),
        ],
    )
    .await;
    let url = proxy.url("/");

    // Fill every place with requests the slow pod holds.
    let holders: Vec<_> = (0..LIMIT)
        .map(|_| {
            let (client, url) = (http1_client(), url.clone());
            tokio::spawn(async move { get(&client, &url, &[("x-service", "slow.shop")]).await })
        })
        .collect();
    eventually(
        "the slow pod holds every place",
        Duration::from_secs(10),
        || slow.client_hits() == LIMIT as u64,
    )
    .await;

    // Over the limit: answered at once, while the held requests are still running,
    // whatever service they name and over either protocol.
    let h1 = http1_client();
    let h2 = h2c_client();
    let shed = join_all((0..4).map(|i| {
        let client = if i % 2 == 0 { &h1 } else { &h2 };
        get(client, &url, &[("x-service", "fast.shop")])
    }))
    .await;
    for reply in &shed {
        reply.assert_error(StatusCode::SERVICE_UNAVAILABLE, "overloaded");
        assert_eq!(reply.header("retry-after"), Some("1"));
    }
    assert!(
        holders.iter().all(|h| !h.is_finished()),
        "the shed answers came before the held requests ended"
    );
    assert_eq!(fast.client_hits(), 0, "nothing shed reached a pod");
    assert_eq!(proxy.metric("proxima_requests_shed_total"), 4.0);
    assert_eq!(
        proxy.metric(r#"proxima_requests_total{code="503",endpoint="",service=""}"#),
        4.0
    );

    // The held requests finish normally and free their places: traffic flows again,
    // on the connections that were refused too.
    for holder in holders {
        let reply = within("held request", holder).await.expect("held request");
        assert_eq!(reply.status, StatusCode::OK);
    }
    // A place is freed once the response has been written, which the client can see
    // a moment before the proxy's task gets to it on a busy machine.
    eventually(
        "the held requests' places are free",
        Duration::from_secs(5),
        || proxy.proxy.requests_in_flight() == 0,
    )
    .await;
    for client in [&h1, &h2] {
        let replies =
            join_all((0..LIMIT).map(|_| get(client, &url, &[("x-service", "fast.shop")]))).await;
        for reply in replies {
            assert_eq!(reply.status, StatusCode::OK);
        }
    }
    assert_eq!(proxy.metric("proxima_requests_shed_total"), 4.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_response_keeps_its_place_until_its_body_is_sent() {
    let pod = backend("pod-0").await;
    let config = ProxyConfig {
        max_concurrent_requests: 1,
        ..ProxyConfig::default()
    };
    let proxy = TestProxy::one_pod(config, "pod-0", pod.addr()).await;
    // A response whose headers arrived but whose body the client has not read (32 MiB,
    // more than the socket buffers hold) holds the only place; a second request is shed;
    // once the body has been read, the place is free again.
    let client = http1_client();
    let other = http1_client();
    let url = proxy.url("/stream?bytes=33554432");
    let response = within("response headers", async {
        client
            .request(
                http::Request::get(&url)
                    .header("x-service", "api.shop")
                    .body(empty())
                    .unwrap(),
            )
            .await
            .expect("response")
    })
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    let refused = get(&other, &url, &[("x-service", "api.shop")]).await;
    refused.assert_error(StatusCode::SERVICE_UNAVAILABLE, "overloaded");
    use http_body_util::BodyExt;
    let body = within("body", response.into_body().collect())
        .await
        .expect("body")
        .to_bytes();
    assert_eq!(body.len(), 32 << 20);
    assert_eq!(proxy.metric("proxima_requests_shed_total"), 1.0);
    // The place is released when the proxy has written the last byte, which may be a
    // moment after the client read it: ask again until answered.
    let mut answered = false;
    for _ in 0..50 {
        let reply = get(&other, &proxy.url("/"), &[("x-service", "api.shop")]).await;
        if reply.status == StatusCode::OK {
            answered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(answered, "the place was never freed");
}
