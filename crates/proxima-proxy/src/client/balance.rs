//! Spreading client connections evenly over the workers (`workers.rs`).
//!
//! Every worker accepts from the same listening socket, and the kernel gives each new
//! connection to whichever worker's accept runs first. A client that opens its
//! connections in a burst (a connection pool, `wrk -c64`) can so land most of them on
//! one worker: measured with two workers, one served 61% of the requests while the
//! other idled part of the time, and the clients on the busy one waited behind more
//! requests (p99 2.4× HAProxy's, which passes every accepted connection to its least
//! loaded thread). Proxima does the same: a worker that accepts a connection while it
//! already serves at least two more than the least loaded worker hands it over to
//! that one. A connection moves at most once, before its first byte is read: one
//! cross-thread send per moved connection, nothing per request.
//!
//! The counts are of open client connections, the load a long-lived client brings;
//! a connection on its way to a worker already counts as that worker's, so workers
//! accepting at the same moment do not all pick the same one.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::net::TcpStream;
use tokio::sync::{mpsc, OwnedSemaphorePermit};

/// An accepted client connection, with its place in the proxy's connection budget.
pub(crate) struct Accepted {
    pub(crate) stream: TcpStream,
    pub(crate) peer: SocketAddr,
    pub(crate) permit: OwnedSemaphorePermit,
}

/// A connection on its way to another worker: out of the accepting worker's reactor,
/// registered again by the worker that serves it.
struct Moving {
    stream: std::net::TcpStream,
    peer: SocketAddr,
    permit: OwnedSemaphorePermit,
}

/// One worker's share: its open connections, and where others send it theirs.
struct Seat {
    open: AtomicUsize,
    inbox: mpsc::UnboundedSender<Moving>,
}

/// The workers' seats, one per worker.
pub(crate) struct Balance {
    seats: Box<[Seat]>,
}

impl Balance {
    /// Seats for `workers` workers, and each worker's end ([`Member`]), in order.
    pub(crate) fn seats(workers: usize) -> Vec<Member> {
        let (seats, inboxes): (Vec<Seat>, Vec<_>) = (0..workers)
            .map(|_| {
                let (inbox, rx) = mpsc::unbounded_channel();
                let seat = Seat {
                    open: AtomicUsize::new(0),
                    inbox,
                };
                (seat, rx)
            })
            .unzip();
        let balance = Arc::new(Balance {
            seats: seats.into_boxed_slice(),
        });
        inboxes
            .into_iter()
            .enumerate()
            .map(|(index, inbox)| Member {
                balance: balance.clone(),
                index,
                inbox,
            })
            .collect()
    }
}

/// Where a connection accepted by worker `mine` should be served, given the open
/// connections of every worker in order: the least loaded worker (the first of equals)
/// when `mine` has at least two more than it (one more is as even as an odd count
/// allows), else `mine`. Each count is read once, without collecting them.
fn destination(open: impl IntoIterator<Item = usize>, mine: usize) -> usize {
    let mut mine_open = 0;
    let (mut least, mut least_open) = (mine, usize::MAX);
    for (worker, count) in open.into_iter().enumerate() {
        if worker == mine {
            mine_open = count;
        }
        if count < least_open {
            (least, least_open) = (worker, count);
        }
    }
    if mine_open > least_open.saturating_add(1) {
        least
    } else {
        mine
    }
}

/// Where [`Member::place`] put a connection.
pub(crate) enum Placed {
    /// Served by this worker.
    Here(Accepted, Served),
    /// Sent to a less loaded worker.
    HandedOver,
    /// Its socket could not leave this worker's reactor, nor join it again (closed).
    Lost,
}

/// A worker's end of the [`Balance`].
pub(crate) struct Member {
    balance: Arc<Balance>,
    index: usize,
    inbox: mpsc::UnboundedReceiver<Moving>,
}

impl Member {
    /// Keep `accepted` on this worker (counted as served here until the returned
    /// [`Served`] is dropped), or hand it to a less loaded worker.
    pub(crate) fn place(&self, accepted: Accepted) -> Placed {
        let seats = &self.balance.seats;
        let open = seats.iter().map(|seat| seat.open.load(Ordering::Relaxed));
        let to = destination(open, self.index);
        if to != self.index {
            seats[to].open.fetch_add(1, Ordering::Relaxed);
            // Out of this worker's reactor; a socket that cannot leave it stays here.
            match accepted.stream.into_std() {
                Ok(stream) => {
                    let moving = Moving {
                        stream,
                        peer: accepted.peer,
                        permit: accepted.permit,
                    };
                    match seats[to].inbox.send(moving) {
                        Ok(()) => return Placed::HandedOver,
                        // That worker has stopped: serve the connection here.
                        Err(mpsc::error::SendError(moving)) => {
                            seats[to].open.fetch_sub(1, Ordering::Relaxed);
                            return match self.arrived(moving) {
                                Some(accepted) => self.keep(accepted),
                                None => Placed::Lost,
                            };
                        }
                    }
                }
                Err(_) => {
                    seats[to].open.fetch_sub(1, Ordering::Relaxed);
                    return Placed::Lost;
                }
            }
        }
        self.keep(accepted)
    }

    fn keep(&self, accepted: Accepted) -> Placed {
        self.balance.seats[self.index]
            .open
            .fetch_add(1, Ordering::Relaxed);
        Placed::Here(accepted, self.served())
    }

    fn served(&self) -> Served {
        Served {
            balance: self.balance.clone(),
            index: self.index,
        }
    }

    /// Register a connection handed over by another worker with this worker's
    /// reactor; `None` (the connection closed) when that fails.
    fn arrived(&self, moving: Moving) -> Option<Accepted> {
        let stream = TcpStream::from_std(moving.stream).ok()?;
        Some(Accepted {
            stream,
            peer: moving.peer,
            permit: moving.permit,
        })
    }

    /// The next connection another worker hands to this one (already counted here).
    /// Pends forever once the inbox is closed.
    pub(crate) async fn handed_over(&mut self) -> (Option<Accepted>, Served) {
        let Some(moving) = self.inbox.recv().await else {
            return std::future::pending().await;
        };
        (self.arrived(moving), self.served())
    }

    /// Take no more connections from other workers; those already sent are returned,
    /// to be served here.
    pub(crate) fn close(&mut self) -> Vec<(Option<Accepted>, Served)> {
        self.inbox.close();
        let mut left = Vec::new();
        while let Ok(moving) = self.inbox.try_recv() {
            left.push((self.arrived(moving), self.served()));
        }
        left
    }
}

/// A connection counted as served by a worker until this is dropped.
pub(crate) struct Served {
    balance: Arc<Balance>,
    index: usize,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.balance.seats[self.index]
            .open
            .fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_moves_only_to_a_worker_with_two_fewer() {
        assert_eq!(destination([0], 0), 0);
        assert_eq!(destination([3, 3], 0), 0);
        assert_eq!(destination([4, 3], 0), 0);
        assert_eq!(destination([5, 3], 0), 1);
        assert_eq!(destination([5, 1, 1], 0), 1, "the first of equals");
        assert_eq!(destination([5, 3, 1], 0), 2);
        assert_eq!(destination([1, 9, 2], 1), 0);
        assert_eq!(destination([2, 9, 2], 2), 2);
    }

    /// A connected pair on loopback: the accepted end and the client's end.
    async fn pair(listener: &tokio::net::TcpListener) -> (TcpStream, SocketAddr, TcpStream) {
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (stream, peer) = listener.accept().await.unwrap();
        (stream, peer, client)
    }

    #[tokio::test]
    async fn a_busy_worker_hands_connections_to_the_idle_one_which_serves_them() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let budget = Arc::new(tokio::sync::Semaphore::new(16));
        let mut members = Balance::seats(2);
        let mut second = members.pop().unwrap();
        let first = members.pop().unwrap();
        let open = |m: &Member| -> Vec<usize> {
            m.balance
                .seats
                .iter()
                .map(|s| s.open.load(Ordering::Relaxed))
                .collect()
        };
        let mut kept = Vec::new();
        let mut clients = Vec::new();
        for _ in 0..7 {
            let (stream, peer, client) = pair(&listener).await;
            clients.push(client);
            let permit = budget.clone().try_acquire_owned().unwrap();
            if let Placed::Here(accepted, served) = first.place(Accepted {
                stream,
                peer,
                permit,
            }) {
                kept.push((accepted, served));
            }
        }
        // The first worker accepted all seven and handed over each one that found it
        // two ahead.
        assert_eq!(open(&first), [4, 3]);
        assert_eq!(kept.len(), 4);
        let mut moved = Vec::new();
        for _ in 0..3 {
            let (accepted, served) = second.handed_over().await;
            moved.push((accepted.expect("registered here"), served));
        }
        // The moved connections still carry their clients' bytes, and their budget.
        assert_eq!(budget.available_permits(), 9);
        for client in &mut clients {
            client.write_all(b"x").await.unwrap();
        }
        let mut got = 0;
        for (accepted, _) in kept.iter_mut().chain(moved.iter_mut()) {
            let mut byte = [0u8; 1];
            accepted.stream.read_exact(&mut byte).await.unwrap();
            got += usize::from(byte == *b"x");
        }
        assert_eq!(got, 7);
        // A connection's end frees its count on the worker serving it.
        moved.pop();
        kept.pop();
        assert_eq!(open(&first), [3, 2]);
        // A stopped worker takes nothing more: its inbox is closed, and the accepting
        // worker serves what it would have moved.
        assert!(second.close().is_empty());
        drop(moved);
        let (stream, peer, _client) = pair(&listener).await;
        let permit = budget.clone().try_acquire_owned().unwrap();
        let placed = first.place(Accepted {
            stream,
            peer,
            permit,
        });
        assert!(
            matches!(placed, Placed::Here(..)),
            "served by the accepting worker"
        );
        assert_eq!(open(&first), [4, 0]);
    }
}
