//! Opening a TCP connection from a chosen local address (HAProxy's `source`): the one
//! rule for every outgoing connection of a node's proxy, used by the upstream pool here
//! and by the peer prober in `proxima_nodes`; and [`ConnectError`], why a connection to
//! a pod could not be used, shared by the HTTP/1.1 and HTTP/2 pools.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::net::{TcpSocket, TcpStream};

use crate::http1::UpstreamError;

/// A TCP connection to `addr`, leaving from `bind` (any port) when given, else from
/// the address the kernel chooses. A `bind` of the other address family than `addr`
/// is an `InvalidInput` error, before any socket is opened.
pub async fn connect_from(addr: SocketAddr, bind: Option<IpAddr>) -> io::Result<TcpStream> {
    let Some(local) = bind else {
        return TcpStream::connect(addr).await;
    };
    if local.is_ipv4() != addr.is_ipv4() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{addr} cannot be reached from the bind address {local}"),
        ));
    }
    let socket = if local.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.bind(SocketAddr::new(local, 0))?;
    socket.connect(addr).await
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use tokio::net::TcpListener;

    use super::*;

    #[tokio::test]
    async fn connects_from_the_bind_address_of_the_same_family() {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let local = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
        let stream = connect_from(addr, Some(local)).await.unwrap();
        assert_eq!(stream.local_addr().unwrap().ip(), local);
        let (_, peer) = listener.accept().await.unwrap();
        assert_eq!(peer.ip(), local);

        let unbound = connect_from(addr, None).await.unwrap();
        assert_eq!(unbound.peer_addr().unwrap(), addr);

        let err = connect_from(addr, Some(IpAddr::V6(Ipv6Addr::LOCALHOST)))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert!(err.to_string().contains("bind address ::1"), "{err}");
    }
}

/// Why a connection could not be opened.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnectError {
    #[error("connect timed out after {0:?}")]
    Timeout(Duration),
    #[error("connect failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("HTTP handshake failed: {0}")]
    Handshake(hyper::Error),
    /// An HTTP/2 pod refused the request without processing it (`REFUSED_STREAM`, or
    /// a graceful GOAWAY below the request's stream).
    #[error("the pod refused the request unprocessed: {0}")]
    Refused(hyper::Error),
    /// A pod whose port is declared h2c did not begin HTTP/2 (no SETTINGS preface).
    #[error("the pod does not speak HTTP/2, though its port is declared h2c (appProtocol or port name): {0}")]
    NotHttp2(hyper::Error),
    /// A fresh connection broke before the request could be written.
    #[error("connection closed before the request was sent: {0}")]
    Closed(UpstreamError),
}
