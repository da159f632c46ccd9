//! Kubernetes discovery for Proxima.
//!
//! Watches Services, EndpointSlices (discovery.k8s.io/v1) and Nodes and keeps a
//! [`proxima_core::Router`] up to date, in two layers (the shape of kube-rs' reflector
//! and linkerd2's policy controller):
//!
//! * [`Index`] (pure): watch events in, [`proxima_core::Update`]s and settings problems
//!   out. Joins every EndpointSlice of a Service, applies the API's condition defaults,
//!   maps ports by name, routes only opted-in Services (annotation `proxima.io/enabled:
//!   "true"` or a label selector) and parses settings with
//!   [`proxima_core::ServiceSettings::from_annotations`].
//! * [`run`] / [`KubeDiscovery`] (thin runtime): kube-runtime watchers with a short
//!   jittered backoff (backon's, 0.7–1.4 s apart at its cap), not kube-runtime's 30 s
//!   default (a vanished API server is retried, an expired resourceVersion re-lists),
//!   each in a `watcher` span, feeding the index and the router; reports invalid
//!   annotations as warnings and Kubernetes Events (reason `InvalidAnnotation`); exposes
//!   API connectivity through [`ApiStatus`].

#![warn(missing_docs)]

mod config;
mod convert;
mod index;
mod runtime;
mod selector;

pub use config::{client, Error, K8sConfig};
pub use convert::{OptIn, ENABLED_ANNOTATION, SERVICE_NAME_LABEL, ZONE_LABEL};
pub use index::{Changes, Index, IndexConfig, Kind, SettingProblem, Stream, Watched};
pub use runtime::{run, ApiStatus, KubeDiscovery, EVENT_REASON};
pub use selector::{LabelSelector, SelectorError};

/// Re-exported so that callers and tests use the same versions.
pub use k8s_openapi;
pub use kube;
