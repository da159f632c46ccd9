//! `protocol: websocket` clients: each worker holds one WebSocket through its node's
//! proxy and sends one message per ticket on it, so the results show how the proxy
//! places long-lived connections (with the QoS pool: on the member with the fewest
//! tunnels open) and how each pod then answers.
//!
//! A socket is opened with the HTTP/1.1 handshake (`GET <path>`, `Upgrade: websocket`,
//! `x-service`); the pod that holds it is read from the `x-backend` header of the
//! `101`, and every message on it is counted as that pod's. A message's response time
//! is from sending it to reading its echo; the handshake is not part of it (it is a
//! record of its own only when it fails: a connection error, or a timeout). A socket
//! that breaks, closes or misses an echo is dropped, and the worker opens a new one
//! for its next message.

use std::net::SocketAddr;

use futures_util::{SinkExt, StreamExt};
use http::HeaderValue;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use super::{Answer, ClientRun};

/// The message when the client gives no `body`.
const DEFAULT_MESSAGE: &str = "ping";

/// An open WebSocket and what its handshake said.
pub(super) struct Socket {
    stream: WebSocketStream<TcpStream>,
    /// The pod that answered the `101`.
    instance: Option<u16>,
    local: Option<SocketAddr>,
}

/// Connect to the client's link and open a WebSocket; `None` when the connection or
/// the handshake failed (an answer other than `101` included).
pub(super) async fn open(run: &ClientRun) -> Option<Socket> {
    let uri = format!("ws://{}{}", run.target, run.spec.path);
    let mut request = uri.into_client_request().ok()?;
    if let Ok(service) = HeaderValue::from_str(&run.service) {
        request.headers_mut().insert("x-service", service);
    }
    let stream = TcpStream::connect(run.target).await.ok()?;
    let _ = stream.set_nodelay(true);
    let local = stream.local_addr().ok();
    let (stream, response) = tokio_tungstenite::client_async(request, stream)
        .await
        .ok()?;
    Some(Socket {
        stream,
        instance: run.instance_of(response.headers()),
        local,
    })
}

/// Send one message and wait for its echo (pings and pongs in between are skipped);
/// `None` when the socket broke or closed first.
pub(super) async fn round_trip(run: &ClientRun, socket: &mut Socket) -> Option<Answer> {
    let text = run.spec.body.as_deref().unwrap_or(DEFAULT_MESSAGE);
    socket.stream.send(Message::text(text)).await.ok()?;
    loop {
        match socket.stream.next().await?.ok()? {
            Message::Text(_) | Message::Binary(_) => break,
            Message::Close(_) => return None,
            _ => {}
        }
    }
    Some(Answer {
        status: 101,
        grpc_status: None,
        instance: socket.instance,
        local: socket.local,
    })
}
