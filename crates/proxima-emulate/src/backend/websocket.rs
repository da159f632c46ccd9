//! WebSockets of an emulated pod: an echo whose every message takes the pod's
//! processing time, so that a tunnel's round trips show which pod holds it (and how
//! loaded it is) as requests do.
//!
//! The handshake is an ordinary request (it waits for the processing time, counts as a
//! hit, gets the failure status while the pod fails), answered `101` with the RFC 6455
//! `Sec-WebSocket-Accept`. The upgraded connection then runs in a task of its own,
//! outside the HTTP connection's, until the client closes it or the pod stops (a Close
//! frame) or is killed (the socket dropped).

use std::sync::Arc;

use futures_util::{SinkExt, StreamExt};
use http::header::{CONNECTION, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_KEY, UPGRADE};
use http::{HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::upgrade::{OnUpgrade, Upgraded};
use hyper_util::rt::TokioIo;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::WebSocketStream;

use super::{empty, stopped, ResponseBody, Shared};

type Socket = WebSocketStream<TokioIo<Upgraded>>;

/// Whether `request` opens a WebSocket (`GET`, `Upgrade: websocket`, a key).
pub(super) fn is_handshake<B>(request: &Request<B>) -> bool {
    let upgrade = request
        .headers()
        .get(UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    request.method() == Method::GET && upgrade && request.headers().contains_key(SEC_WEBSOCKET_KEY)
}

/// Answer the handshake `101` and echo on the upgraded connection from then on.
pub(super) fn accept(
    shared: Arc<Shared>,
    mut request: Request<Incoming>,
) -> Response<ResponseBody> {
    let key = request
        .headers()
        .get(SEC_WEBSOCKET_KEY)
        .map(|k| derive_accept_key(k.as_bytes()));
    let Some(Ok(accept)) = key.map(HeaderValue::try_from) else {
        let mut response = empty();
        *response.status_mut() = StatusCode::BAD_REQUEST;
        return response;
    };
    let upgrade = hyper::upgrade::on(&mut request);
    tokio::spawn(session(shared, upgrade));
    let mut response = empty();
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(UPGRADE, HeaderValue::from_static("websocket"));
    headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(SEC_WEBSOCKET_ACCEPT, accept);
    response
}

/// One WebSocket, from the upgrade to its end.
async fn session(shared: Arc<Shared>, upgrade: OnUpgrade) {
    let Ok(upgraded) = upgrade.await else {
        return;
    };
    let mut socket =
        WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
    let mut end = shared.sessions_end.subscribe();
    tokio::select! {
        () = echo(&shared, &mut socket) => {}
        () = stopped(&mut end) => {
            if !shared.is_aborted() {
                let _ = socket.close(None).await;
            }
        }
    }
}

/// Echo text and binary messages, each after a processing time, until the socket ends
/// (pings are answered by the socket itself).
async fn echo(shared: &Shared, socket: &mut Socket) {
    while let Some(Ok(message)) = socket.next().await {
        if !(message.is_text() || message.is_binary()) {
            continue;
        }
        shared.process(shared.processing_time()).await;
        if socket.send(message).await.is_err() {
            return;
        }
    }
}
