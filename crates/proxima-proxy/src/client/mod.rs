//! Client connections: accepting them (`server`), the worker threads they are spread
//! over (`workers`, `worker`, `balance`, `give_way`), one connection's life and limits
//! (`conn`: timeouts, parking while idle with `park`, hyper's error heads in JSON), what
//! a connection's requests go through before forwarding (`conn_service`: admission,
//! RFC 9112's rules for a request's head, the service named), the proxy's own stalls
//! (`stall`), and the gate that watches a client while its request waits (`gate`).

pub(crate) mod balance;
pub(crate) mod conn;
pub(crate) mod conn_service;
pub(crate) mod gate;
pub(crate) mod give_way;
pub(crate) mod park;
pub(crate) mod server;
pub(crate) mod stall;
pub(crate) mod worker;
pub(crate) mod workers;
