//! Discovery sources: where the router learns which services and endpoints exist.
//!
//! A source turns the outside world into [`proxima_core::Update`]s for the
//! [`Router`](proxima_core::Router). Today there is one source:
//!
//! * [`file`]: a YAML topology file, polled for changes. It is the embedded default for
//!   a proxy without a cluster (`proxima demo`, tests, small static setups), and its
//!   service settings use the same keys as the `proxima.io/<key>` Service annotations of
//!   the Kubernetes source that will come next.

#![warn(missing_docs)]

pub mod file;

pub use file::{load, parse, parse_named, watch, FileError, FileWatcher, Problem, Topology};
