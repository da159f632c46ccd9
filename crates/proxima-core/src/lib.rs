//! Proxima's routing core.
//!
//! Pure and deterministic: no async runtime, no HTTP, no Kubernetes. Time (`now`) and
//! randomness (an `RngCore`) are passed in, so every decision can be tested and
//! benchmarked on its own. Discovery feeds it [`Update`]s; the data plane asks it to
//! [`Router::pick`] an endpoint and reports each attempt with [`Router::record`].
//!
//! * [`model`]: services, endpoints, nodes, updates.
//! * [`coordinates`]: network coordinates (Vivaldi): predicted RTTs between any two
//!   nodes from a bounded number of measurements.
//! * [`settings`]: per-service SLO and strategy settings, parsed once for files and
//!   annotations alike.
//! * [`estimator`]: per-endpoint response-time estimator.
//! * [`endpoint`]: per-endpoint live state and QoS-pool admission.
//! * [`route`]: one service as routed: endpoints, eligibility, QoS pool, node groups;
//!   what strategies read.
//! * [`strategy`]: the `Strategy` trait, the QoS pool and the baselines.
//! * [`router`]: the lock-free routing table (each service's route and strategy).
//! * [`gossip`]: the router's side of it: hearing reports, the digest it sends.
//! * [`neighbours`]: what neighbouring proxies report about pods, and how it is weighed.
//! * [`retry_budget`]: the per-service budget that bounds retries.

#![warn(missing_docs)]

pub mod coordinates;
pub mod endpoint;
pub mod environment;
pub mod estimator;
pub mod explain;
pub mod gossip;
pub mod model;
pub mod neighbours;
pub mod pool_list;
pub mod retry_budget;
pub mod route;
pub mod router;
pub mod settings;
pub mod strategy;

pub use endpoint::{
    Admission, EndpointState, EvictionCause, FailedAnswer, InFlight, Outcome, PoolChange,
};
pub use environment::{Environment, Usage};
pub use estimator::{LatencyEstimator, Prediction};
pub use gossip::{Digest, HearReport};
pub use model::{
    is_dns_label, port_protocol, Conditions, Endpoint, EndpointId, EndpointPort, Hints, Node,
    PortProtocol, ProtocolSource, ServiceKey, ServicePort, ServiceSpec, TrafficPolicy, Update,
};
pub use pool_list::{PoolList, PoolView};
pub use retry_budget::{RetryBudget, RetryBudgetParams, RetryBudgetUse};
pub use route::{Expected, NodeGroup, NodeReadings, PortTarget, Route, RouteEndpoint};
pub use router::{
    release_cached_table, ApplyReport, PickError, Picked, PortRef, ProbeTicket, Router,
    ServiceRoute, Table,
};
pub use settings::{GrpcCodes, ProbeShape, ServiceSettings, SettingError, StatusSet};
pub use strategy::{Choice, NodeCandidates, PickContext, Reason, Strategy, StrategyRegistry};
