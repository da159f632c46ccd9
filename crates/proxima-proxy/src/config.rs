//! Data-plane settings that are the same for every service (per-service settings such
//! as timeouts and retries come from [`proxima_core::ServiceSettings`]).

use std::net::IpAddr;
use std::time::Duration;

use http::HeaderName;
use proxima_core::ServiceKey;

/// How the proxy listens, names services and manages connections.
#[derive(Clone, Debug)]
pub struct ProxyConfig {
    /// Header naming the target service (`name[.namespace][:port]`); when absent the
    /// service is taken from `Host`. Default `x-service`.
    pub service_header: HeaderName,
    /// Namespace of a service named without one. Default `default`.
    pub default_namespace: String,
    /// Cluster DNS domain accepted in `name.ns.svc.<domain>`. Default `cluster.local`.
    pub cluster_domain: String,
    /// Largest total size of request headers (`name: value\r\n` each); larger requests
    /// get `431` with a JSON body. Default 16 KiB.
    pub max_header_bytes: usize,
    /// How long in-flight requests may run after shutdown begins. Default 30 s.
    pub shutdown_grace: Duration,
    /// How long an idle upstream keep-alive connection is kept. Default 60 s.
    pub pool_idle_timeout: Duration,
    /// Most idle keep-alive connections kept to one pod; beyond it the pod's oldest idle
    /// one is closed. `0` turns keep-alive to pods off. Default 256: below the requests a
    /// pod has in flight at once, connections are closed on return and opened again a
    /// moment later, and an idle connection of a body-less request costs only its
    /// socket; `max_idle_total` bounds them all.
    pub max_idle_per_endpoint: usize,
    /// Most idle keep-alive connections kept in all; beyond it the oldest idle one (to
    /// any pod) is closed. `0` turns keep-alive to pods off. Default 1024.
    pub max_idle_total: usize,
    /// Most idle keep-alive connections that keep their HTTP/1.1 state (about 32 KiB
    /// each: buffers, channel, task); beyond it the oldest one is parked, keeping only
    /// its socket until it is taken again. Default 64.
    pub max_idle_buffered: usize,
    /// Local address bound before connecting to upstreams (client traffic and background
    /// probes alike), as HAProxy's `source`: on a host with several addresses it decides
    /// which one pods see as the peer. The port is chosen by the kernel. An upstream of the
    /// other address family cannot be reached from it (the connect fails). Default `None`:
    /// the kernel picks the source address.
    pub upstream_bind: Option<IpAddr>,
    /// Time a new client connection has to deliver its first request's headers (this
    /// covers the HTTP/1-or-2 detection, so a silent socket or a partial HTTP/2 preface
    /// is closed), and an HTTP/1.1 client each next request's headers once it has begun.
    /// Default 30 s.
    pub client_header_timeout: Duration,
    /// A client connection with no request in flight for this long is closed (HTTP/1.1
    /// keep-alive, HTTP/2 after its last stream, with GOAWAY). Default 60 s.
    pub client_idle_timeout: Duration,
    /// While a response body is being streamed, a client connection on which no byte
    /// moves for this long (a client that stopped reading, a pod that stopped sending,
    /// a client that stopped sending its request body) is closed, and with it the
    /// connection to the pod. Default 60 s.
    pub body_idle_timeout: Duration,
    /// Most requests at once on one HTTP/2 connection to an h2c pod (fewer if the pod's
    /// `SETTINGS_MAX_CONCURRENT_STREAMS` says so); beyond it another connection is
    /// opened (`upstream/h2.rs`). Default 100.
    pub h2_max_streams: u32,
    /// How often each HTTP/2 connection to a pod pings it; one unanswered for 5 s (or
    /// this, if shorter) closes the connection. Default 10 s.
    pub h2_ping_interval: Duration,
    /// An upgraded connection (a WebSocket) on which no byte moves either way for this
    /// long is closed (`forward/tunnel.rs`). Default 5 minutes.
    pub tunnel_idle_timeout: Duration,
    /// Most tunnels one client address may hold open; beyond it its upgrades get `429`,
    /// so that one client cannot take every connection place from the others (its
    /// plain requests still pass). Default 256.
    pub max_tunnels_per_client: usize,
    /// How long a tunnel stays open once its pod has left discovery. Default 10 s.
    pub tunnel_removed_grace: Duration,
    /// Most client connections open at once; beyond it new connections are accepted and
    /// closed at once (shed), so that file descriptors stay for pods, discovery and the
    /// admin server. Default 4096.
    pub max_client_connections: usize,
    /// Most requests in flight at once (from their headers until their response body is
    /// sent); beyond it requests are shed at once with `503`, a JSON body and
    /// `retry-after`, instead of queueing. Default 4096.
    pub max_concurrent_requests: usize,
    /// Most first probes of new endpoints in flight at once (see `prober`); more that are
    /// due wait for a later tick. Probes of evicted endpoints are not bounded. Default 32.
    pub max_concurrent_first_probes: usize,
    /// Most header lines in a client request; more get `431` with a JSON body. Default 200.
    pub max_request_headers: usize,
    /// Most header lines in a pod's response; more are an upstream protocol error
    /// (`502`). Default 500 (a response with a hundred `Set-Cookie` lines passes).
    pub max_response_headers: usize,
    /// Longest request target (path and query, or absolute URI) in bytes; longer ones get
    /// `414` with a JSON body. Default 8 KiB.
    pub max_uri_bytes: usize,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        Self {
            service_header: HeaderName::from_static("x-service"),
            default_namespace: ServiceKey::DEFAULT_NAMESPACE.to_string(),
            cluster_domain: "cluster.local".to_string(),
            max_header_bytes: 16 * 1024,
            shutdown_grace: Duration::from_secs(30),
            pool_idle_timeout: Duration::from_secs(60),
            max_idle_per_endpoint: 256,
            max_idle_total: 1024,
            max_idle_buffered: 64,
            upstream_bind: None,
            client_header_timeout: Duration::from_secs(30),
            client_idle_timeout: Duration::from_secs(60),
            body_idle_timeout: Duration::from_secs(60),
            h2_max_streams: 100,
            h2_ping_interval: Duration::from_secs(10),
            tunnel_idle_timeout: Duration::from_secs(300),
            tunnel_removed_grace: Duration::from_secs(10),
            max_tunnels_per_client: 256,
            max_client_connections: 4096,
            max_concurrent_requests: 4096,
            max_concurrent_first_probes: 32,
            max_request_headers: 200,
            max_response_headers: 500,
            max_uri_bytes: 8 * 1024,
        }
    }
}
