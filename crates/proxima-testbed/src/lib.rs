//! Proxima's edge testbed: emulate a geo-distributed cluster on one machine and re-run
//! the papers' experiments against the real data plane.
//!
//! A scenario file ([`scenario`]) describes nodes, the latency between them, services
//! with their SLO and instances (with processing-time distributions), clients attached
//! to nodes, and timed events (instances joining, leaving, failing or slowing down,
//! links changing, node usage changing). For each strategy to compare, the testbed
//! starts a fresh [`Cluster`] in which every node runs Proxima's own router, file
//! discovery, proxy, admin server and peer prober on its own loopback address, and every
//! instance is a real HTTP server; delay between nodes is injected by user-space gates
//! keyed on the source address (see [`cluster`]), and `blackhole` / `node-down` drop packets
//! with nftables inside the testbed's own network namespace ([`netns`], [`firewall`]). With `--kube` ([`k8s`]), discovery
//! comes from a real Kubernetes API server (EndpointSlices) instead of files. The clients' requests are then
//! summarised ([`stats`]) and written as a table, JSON, CSV ([`report`]) and PNG plots
//! ([`plot`]).
//!
//! The experiments reproduced in `examples/scenarios/` and their results in
//! `docs/results/` follow QEdgeProxy (Čilić et al., §V), proxy-mity (Fahs & Pierre,
//! §IV), RAP (Nguyen et al., §5) and local scheduling in KubeEdge (Kim et al., §5.4).

#![warn(missing_docs)]

pub mod client;
pub mod cluster;
pub mod compare;
pub mod coordinates;
pub mod firewall;
pub mod generate;
pub mod host;
pub mod k8s;
pub mod netns;
pub mod plot;
pub mod report;
pub mod runner;
pub mod scenario;
pub mod shape;
pub mod stats;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub use cluster::{Cluster, DiscoveryMode};
pub use runner::{run_one, ProgressBoard, RunOptions};
pub use scenario::{Scenario, ScenarioError, ScenarioFile, StrategySpec};
pub use stats::{RunReport, Summary};

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum TestbedError {
    /// The scenario file is invalid.
    #[error(transparent)]
    Scenario(#[from] ScenarioError),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        #[source]
        source: std::io::Error,
    },
    /// Sockets, namespaces, links or the Kubernetes control plane could not be set up.
    #[error("network setup failed: {0}")]
    Net(String),
    /// The run asked for something the cluster cannot do (an unknown instance, a topology
    /// the proxy's discovery rejects).
    #[error("{0}")]
    Invalid(String),
    /// A plot could not be drawn.
    #[error("plot: {0}")]
    Plot(String),
}

impl TestbedError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        TestbedError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// One run to do: a variant of the scenario with one strategy.
#[derive(Clone, Debug)]
pub struct Job {
    /// The checked scenario of the variant.
    pub scenario: Scenario,
    /// The strategy to run it with.
    pub strategy: StrategySpec,
}

/// The runs of `file`: every selected variant (all when `variants` is empty) times every
/// strategy (`strategies`, else the scenario's own list, else `qos-pool`).
pub fn plan(
    file: &ScenarioFile,
    strategies: &[StrategySpec],
    variants: &[String],
) -> Result<Vec<Job>, TestbedError> {
    let names = file.variant_names();
    for v in variants {
        if !names.contains(v) {
            return Err(TestbedError::Invalid(format!(
                "no variant {v:?}; the scenario has {}",
                names.join(", ")
            )));
        }
    }
    let mut jobs = Vec::new();
    for name in names
        .iter()
        .filter(|n| variants.is_empty() || variants.contains(n))
    {
        let scenario = file.variant(name)?;
        let list = if !strategies.is_empty() {
            strategies.to_vec()
        } else if !scenario.strategies.is_empty() {
            scenario.strategies.clone()
        } else {
            vec![StrategySpec::parse("qos-pool")?]
        };
        for strategy in list {
            check_settings(&scenario, &strategy)?;
            jobs.push(Job {
                scenario: scenario.clone(),
                strategy,
            });
        }
    }
    Ok(jobs)
}

/// Parameters of one strategy (`rap-cpu-threshold`) are refused by discovery for a
/// service that runs another: say so before anything starts.
fn check_settings(scenario: &Scenario, strategy: &StrategySpec) -> Result<(), TestbedError> {
    for service in &scenario.services {
        for (key, _) in &service.settings {
            let other = proxima_core::settings::KNOWN_STRATEGIES.iter().find(|s| {
                **s != "qos-pool"
                    && **s != strategy.strategy
                    && key
                        .strip_prefix(**s)
                        .is_some_and(|rest| rest.starts_with('-'))
            });
            if let Some(other) = other {
                return Err(TestbedError::Invalid(format!(
                    "service {}: setting `{key}` belongs to strategy {other}, not {}; \
                     give it in the strategy instead (e.g. `{other}:{}=...`)",
                    service.name,
                    strategy.strategy,
                    &key[other.len() + 1..]
                )));
            }
        }
    }
    Ok(())
}

/// Run `jobs`, at most `parallel` at a time (each on its own address block), and return
/// their reports in job order. A failed run fails the whole set.
pub async fn run_jobs(
    jobs: Vec<Job>,
    parallel: usize,
    options: &RunOptions,
    board: Option<&ProgressBoard>,
) -> Result<Vec<RunReport>, TestbedError> {
    let parallel = parallel.clamp(1, 100);
    let free: Arc<Mutex<Vec<u8>>> = Arc::new(Mutex::new((0..parallel as u8).rev().collect()));
    let slots = Arc::new(tokio::sync::Semaphore::new(parallel));
    let mut handles = Vec::new();
    for job in jobs {
        let permit = slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| TestbedError::Invalid(e.to_string()))?;
        let block = free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
            .unwrap_or(0);
        let (free, options, board) = (free.clone(), options.clone(), board.cloned());
        handles.push(tokio::spawn(async move {
            let result = run_one(
                &job.scenario,
                &job.strategy,
                block,
                &options,
                board.as_ref(),
            )
            .await;
            free.lock().unwrap_or_else(|e| e.into_inner()).push(block);
            drop(permit);
            result
        }));
    }
    let mut reports = Vec::new();
    for h in handles {
        reports.push(
            h.await
                .map_err(|e| TestbedError::Invalid(format!("a run panicked: {e}")))??,
        );
    }
    Ok(reports)
}
