//! Emulation helpers for Proxima's tests, demo and testbed.
//!
//! The papers evaluate the proxy against pods whose response time is
//! dominated by processing time and by the network distance between edge
//! nodes. This crate reproduces both with real sockets on loopback:
//!
//! - [`Backend`] is an emulated pod: an HTTP/1.1 server whose processing time
//!   (a fixed delay, uniform jitter and a [`ProcessingTime`] distribution) can be
//!   changed while it runs, to emulate overload, which can run on a limited
//!   number of workers and on cores shared with its node's other pods ([`Cpu`]),
//!   and which can be stopped gracefully or killed abruptly.
//! - [`DelayLink`] is a user-space TCP relay that adds a one-way delay to each
//!   direction, standing in for `tc netem`, which the test kernel lacks.
//! - [`SourceDelayGate`] is the same relay with delays chosen by the connecting
//!   source's address from a live [`DelayMatrix`], so one listener can sit at
//!   different distances from different emulated nodes.

#![warn(missing_docs)]

mod backend;
mod delay_link;
mod gate;
mod pattern;
mod processing;
mod timer;

pub use backend::{Backend, BackendConfig};
pub use delay_link::{DelayLink, BLACKHOLE};
pub use gate::{DelayMatrix, SourceDelayGate};
pub use pattern::{pattern_byte, pattern_bytes};
pub use processing::{Cpu, ProcessingTime};

/// Errors of this crate's configuration parsing.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EmulateError {
    /// A duration such as `20ms` could not be parsed.
    #[error("invalid duration {0:?} (expected e.g. 500us, 20ms, 1.5s)")]
    InvalidDuration(String),
    /// A processing-time distribution could not be parsed.
    #[error(
        "invalid processing time {0:?} (expected e.g. 5ms, uniform(2ms, 8ms), \
         normal(5ms, 1ms) or exponential(5ms))"
    )]
    InvalidDistribution(String),
}

/// Parses a duration with Proxima's settings syntax (`500us`, `20ms`, `1.5s`, `1m`).
pub fn parse_duration(value: &str) -> Result<std::time::Duration, EmulateError> {
    proxima_core::settings::parse_duration(value)
        .ok_or_else(|| EmulateError::InvalidDuration(value.to_string()))
}
