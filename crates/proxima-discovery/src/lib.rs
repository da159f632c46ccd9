//! Discovery sources: where the router learns which services and endpoints exist.
//!
//! A source turns the outside world into [`proxima_core::Update`]s for the
//! [`Router`](proxima_core::Router). This crate holds the file source; the Kubernetes
//! source is the `proxima-k8s` crate (`--discovery kube`).
//!
//! * [`file`](mod@file): a YAML topology file, polled for changes (`--discovery file:PATH`). It is
//!   the source of a proxy without a cluster (`proxima demo`, tests, small static
//!   setups), and its service settings use the same keys as the `proxima.io/<key>`
//!   Service annotations of the Kubernetes source.
//! * [`yaml`]: how the project reads YAML, here and in `proxima demo` and the testbed:
//!   every error with its line and path.

#![warn(missing_docs)]

pub mod file;
pub mod yaml;

pub use file::{load, parse, parse_named, watch, FileError, FileWatcher, Problem, Topology};
