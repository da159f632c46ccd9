//! Connections to pods: where they come from (`connect`, from `--upstream-bind`), the
//! pool that keeps and reuses them (`pool`: HTTP/1.1 sockets and hyper senders), HTTP/2
//! to pods whose port is h2c (`h2`: multiplexed connections, stream places, pings), and
//! the background probes of pods outside the QoS pool (`prober`). The HTTP/1.1 exchange
//! itself is the codec's (`crate::http1`).

pub(crate) mod connect;
pub(crate) mod h2;
pub(crate) mod pool;
pub(crate) mod prober;
