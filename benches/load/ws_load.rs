//! WebSocket load for `benches/load/ws.sh`: an echo origin, an echo load and idle tunnels.
//!
//! ```text
//! ws-load serve ADDR                       echo every message back (the origin)
//! ws-load echo ADDR SERVICE CONNS SECS BYTES
//!     CONNS WebSockets through the proxy at ADDR to SERVICE (x-service), each sending a
//!     BYTES-byte binary message and waiting for its echo, for SECS seconds; prints
//!     `messages_per_s p50_us p99_us`
//! ws-load hold ADDR SERVICE CONNS
//!     opens CONNS WebSockets, one echo each, prints `open CONNS` and keeps them until
//!     its standard input closes
//! ```
//!
//! A real RFC 6455 client and server (tokio-tungstenite) on each side, so each proxy in
//! the comparison relays the same frames.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

type Socket = WebSocketStream<TcpStream>;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let arg = |i: usize| args.get(i).cloned().unwrap_or_else(|| usage());
    let number = |i: usize| arg(i).parse::<u64>().unwrap_or_else(|_| usage());
    match args.first().map(String::as_str) {
        Some("serve") => runtime.block_on(serve(arg(1).parse().unwrap_or_else(|_| usage()))),
        Some("echo") => runtime.block_on(echo(
            arg(1).parse().unwrap_or_else(|_| usage()),
            arg(2),
            number(3) as usize,
            Duration::from_secs(number(4)),
            number(5) as usize,
        )),
        Some("hold") => runtime.block_on(hold(
            arg(1).parse().unwrap_or_else(|_| usage()),
            arg(2),
            number(3) as usize,
        )),
        _ => usage(),
    }
}

fn usage() -> ! {
    eprintln!(
        "usage: ws-load serve ADDR | echo ADDR SERVICE CONNS SECS BYTES | hold ADDR SERVICE CONNS"
    );
    std::process::exit(2)
}

async fn serve(addr: SocketAddr) {
    let listener = TcpListener::bind(addr).await.expect("bind");
    while let Ok((stream, _)) = listener.accept().await {
        tokio::spawn(async move {
            let _ = stream.set_nodelay(true);
            let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else {
                return;
            };
            while let Some(Ok(message)) = ws.next().await {
                if message.is_close() {
                    break;
                }
                if (message.is_binary() || message.is_text()) && ws.send(message).await.is_err() {
                    break;
                }
            }
        });
    }
}

async fn open(addr: SocketAddr, service: &str) -> Socket {
    let mut request = format!("ws://{addr}/echo")
        .into_client_request()
        .expect("request");
    request
        .headers_mut()
        .insert("x-service", service.parse().expect("service name"));
    let stream = TcpStream::connect(addr).await.expect("connect");
    let _ = stream.set_nodelay(true);
    let (ws, _) = tokio_tungstenite::client_async(request, stream)
        .await
        .expect("handshake");
    ws
}

async fn round_trip(ws: &mut Socket, message: &Message) {
    ws.send(message.clone()).await.expect("send");
    loop {
        match ws.next().await {
            Some(Ok(m)) if m.is_binary() => return,
            Some(Ok(_)) => continue,
            other => panic!("echo: {other:?}"),
        }
    }
}

async fn echo(addr: SocketAddr, service: String, conns: usize, secs: Duration, bytes: usize) {
    let latencies = Arc::new(Mutex::new(Vec::new()));
    let message = Message::binary(vec![b'x'; bytes]);
    let until = Instant::now() + secs;
    let tasks: Vec<_> = (0..conns)
        .map(|_| {
            let (service, message, latencies) =
                (service.clone(), message.clone(), latencies.clone());
            tokio::spawn(async move {
                let mut ws = open(addr, &service).await;
                let mut mine = Vec::new();
                while Instant::now() < until {
                    let start = Instant::now();
                    round_trip(&mut ws, &message).await;
                    mine.push(start.elapsed().as_micros() as u64);
                }
                latencies.lock().await.extend(mine);
                let _ = ws.close(None).await;
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("connection task");
    }
    let mut all = std::mem::take(&mut *latencies.lock().await);
    all.sort_unstable();
    let at = |q: f64| {
        all.get(((all.len() as f64 * q) as usize).min(all.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    println!(
        "{:.0} {} {}",
        all.len() as f64 / secs.as_secs_f64(),
        at(0.5),
        at(0.99)
    );
}

async fn hold(addr: SocketAddr, service: String, conns: usize) {
    let message = Message::binary(vec![b'x'; 16]);
    let mut held = Vec::with_capacity(conns);
    for i in 0..conns {
        let mut ws = open(addr, &service).await;
        round_trip(&mut ws, &message).await;
        held.push(ws);
        if (i + 1) % 1000 == 0 {
            eprintln!("  {}/{conns} tunnels open", i + 1);
        }
    }
    println!("open {}", held.len());
    let _ = tokio::task::spawn_blocking(|| {
        let mut rest = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut rest)
    })
    .await;
}
