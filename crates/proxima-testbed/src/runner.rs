//! Running a scenario: a fresh cluster per (variant, strategy), the same seed for all,
//! clients and events driven to the end, then the numbers.
//!
//! One run: start the cluster ([`Cluster::start`]); wait until every proxy knows its
//! peers' latencies (and usage) so that latency-aware strategies start informed; start
//! the clients and the event driver; when the clients are done, stop everything and
//! summarise. Events triggered by a request count hold the request after the threshold
//! until they are applied (see [`Sequencer`]); time-triggered ones happen on time.

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::client::{ClientRun, Live, RequestRecord, Sequencer};
use crate::cluster::{Cluster, DiscoveryMode};
use crate::host::{HostReport, HostSampler};
use crate::scenario::{Scenario, StrategySpec, Trigger};
use crate::stats::{
    per_instance, ClientReport, PhaseReport, ProxyCounters, ProxyPhase, RunReport, ServiceReport,
    ServiceSummary, Summary,
};
use crate::TestbedError;

/// How runs are carried out.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Where the per-node topology files go (a directory per run is made inside).
    pub work_dir: PathBuf,
    /// Print a progress line on stderr about once a second.
    pub progress: bool,
    /// Where the nodes' discovery reads the topology (files unless `--kube`).
    pub discovery: DiscoveryMode,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            work_dir: std::env::temp_dir().join(format!("proxima-testbed-{}", std::process::id())),
            progress: false,
            discovery: DiscoveryMode::Files,
        }
    }
}

/// What the progress line says about one run.
#[derive(Clone)]
struct Progress {
    label: String,
    live: Arc<Live>,
    sequencer: Arc<Sequencer>,
    total: Option<u64>,
    phases: Vec<String>,
    started: Instant,
}

impl Progress {
    fn line(&self) -> String {
        let done = self.live.done.load(Ordering::Relaxed);
        let errors = self.live.errors.load(Ordering::Relaxed);
        let met = self.live.slo_met.load(Ordering::Relaxed);
        let latency = self.live.latency_us.load(Ordering::Relaxed);
        let elapsed = self.started.elapsed().as_secs_f64().max(1e-3);
        let total = self.total.map_or(String::new(), |t| format!("/{t}"));
        let phase = self
            .phases
            .get(usize::from(self.sequencer.phase()))
            .cloned()
            .unwrap_or_default();
        let (avg, share) = if done > 0 {
            (
                latency as f64 / done as f64 / 1e3,
                met as f64 * 100.0 / done as f64,
            )
        } else {
            (0.0, 0.0)
        };
        format!(
            "[{}] {done}{total} requests  {:.0} req/s  avg {avg:.1} ms  SLO {share:.2}%  phase {phase}  errors {errors}",
            self.label,
            done as f64 / elapsed
        )
    }
}

/// Prints the progress lines of the runs in flight, about once a second.
#[derive(Clone, Default)]
pub struct ProgressBoard {
    runs: Arc<std::sync::Mutex<Vec<(u64, Progress)>>>,
    next: Arc<std::sync::atomic::AtomicU64>,
}

impl ProgressBoard {
    fn add(&self, progress: Progress) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.runs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((id, progress));
        id
    }

    fn remove(&self, id: u64) {
        self.runs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(i, _)| *i != id);
    }

    /// Print until `stop` turns true.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        let terminal = std::io::stderr().is_terminal();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut count = 0u64;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.wait_for(|s| *s) => break,
            }
            count += 1;
            let lines: Vec<String> = self
                .runs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .map(|(_, p)| p.line())
                .collect();
            if lines.is_empty() {
                continue;
            }
            let text = lines.join(" | ");
            let mut err = std::io::stderr().lock();
            if terminal {
                let _ = write!(err, "\r\x1b[K{text}");
            } else if count.is_multiple_of(10) {
                // Logs get a line every ten seconds rather than a stream of them.
                let _ = writeln!(err, "{text}");
            }
            let _ = err.flush();
        }
        if terminal {
            let _ = write!(std::io::stderr(), "\r\x1b[K");
        }
    }
}

/// Run `scenario` with `strategy` on address block `block` (see [`Cluster`]).
pub async fn run_one(
    scenario: &Scenario,
    strategy: &StrategySpec,
    block: u8,
    options: &RunOptions,
    board: Option<&ProgressBoard>,
) -> Result<RunReport, TestbedError> {
    let label = match scenario.variant.as_str() {
        "" => strategy.label.clone(),
        v => format!("{v} {}", strategy.label),
    };
    let dir = options.work_dir.join(format!("run-{block}"));
    let cluster = Cluster::start_with(scenario, strategy, block, &dir, &options.discovery).await?;
    let warmed_up = cluster.warm_up(scenario.testbed.warmup_timeout).await;
    if !warmed_up {
        tracing::warn!(run = %label, "not every proxy knew its peers before traffic started");
    }
    let result = drive(scenario, strategy, &cluster, &label, board, warmed_up).await;
    cluster.shutdown().await;
    result
}

async fn drive(
    scenario: &Scenario,
    strategy: &StrategySpec,
    cluster: &Arc<Cluster>,
    label: &str,
    board: Option<&ProgressBoard>,
    warmed_up: bool,
) -> Result<RunReport, TestbedError> {
    let instance_names: Vec<String> = scenario
        .services
        .iter()
        .flat_map(|s| s.instances.iter().map(|i| i.name.clone()))
        .collect();
    let index: HashMap<String, u16> = instance_names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.clone(), i as u16))
        .collect();
    let thresholds: Vec<(u64, usize)> = scenario
        .events
        .iter()
        .enumerate()
        .filter_map(|(i, e)| match e.at {
            Trigger::Requests(n) => Some((n, i)),
            Trigger::Time(_) => None,
        })
        .collect();
    let (sequencer, mut due) = Sequencer::new(thresholds, scenario.events.len());
    let live = Arc::new(Live::default());
    let (stop, stop_rx) = watch::channel(false);
    let started = Instant::now();
    let phase_names: Vec<String> = std::iter::once("T0".to_string())
        .chain(scenario.events.iter().map(|e| e.name.clone()))
        .collect();
    let progress_id = board.map(|b| {
        b.add(Progress {
            label: label.to_string(),
            live: live.clone(),
            sequencer: sequencer.clone(),
            total: scenario.clients.iter().map(|c| c.requests).sum(),
            phases: phase_names.clone(),
            started,
        })
    });

    // The event driver: time events on time, count events when the sequencer says.
    let driver = {
        let cluster = cluster.clone();
        let sequencer = sequencer.clone();
        let events = scenario.events.clone();
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let mut applied = vec![false; events.len()];
            let mut starts: Vec<(String, Duration)> = Vec::new();
            // The proxies' counters as each phase ends (before its event's actions).
            let mut counters = Vec::new();
            let mut timed: Vec<(Duration, usize)> = events
                .iter()
                .enumerate()
                .filter_map(|(i, e)| match e.at {
                    Trigger::Time(t) => Some((t, i)),
                    Trigger::Requests(_) => None,
                })
                .collect();
            timed.sort_by_key(|(t, _)| *t);
            let mut timed = timed.into_iter().peekable();
            let mut failure = None;
            loop {
                let next_time = timed.peek().map(|(t, _)| started + *t);
                let event = tokio::select! {
                    _ = stop.wait_for(|s| *s) => break,
                    Some(i) = due.recv() => i,
                    _ = async {
                        match next_time {
                            Some(at) => tokio::time::sleep_until(at.into()).await,
                            None => std::future::pending().await,
                        }
                    } => match timed.next() {
                        Some((_, i)) => i,
                        None => continue,
                    },
                };
                if std::mem::replace(&mut applied[event], true) {
                    continue;
                }
                counters.push(cluster.proxy_counters());
                for action in &events[event].actions {
                    if let Err(e) = cluster.apply(action).await {
                        failure.get_or_insert(e);
                    }
                }
                starts.push((events[event].name.clone(), started.elapsed()));
                sequencer.applied(event);
            }
            (starts, counters, failure)
        })
    };

    let objectives = scenario.objectives(strategy);
    let counters_at_start = cluster.proxy_counters();
    let sampler = HostSampler::start();
    let mut clients = Vec::new();
    for (i, spec) in scenario.clients.iter().enumerate() {
        let service = &scenario.services[spec.service];
        let run = ClientRun {
            index: i as u16,
            spec: spec.clone(),
            service: format!("{}.{}", service.name, service.namespace),
            slo: objectives[spec.service].0,
            target: cluster.client_addr(i),
            sequencer: sequencer.clone(),
            live: live.clone(),
            instances: Arc::new(index.clone()),
            started,
            stop: stop_rx.clone(),
            best_response: {
                let (cluster, percentile) = (cluster.clone(), objectives[spec.service].1);
                Arc::new(move || cluster.best_response(i, percentile))
            },
        };
        clients.push(tokio::spawn(run.run()));
    }
    let mut records: Vec<RequestRecord> = Vec::new();
    let mut connections = Vec::new();
    for c in clients {
        let output = c
            .await
            .map_err(|e| TestbedError::Invalid(format!("a client failed: {e}")))?;
        records.extend(output.records);
        connections.push(output.connections);
    }
    let counters_at_end = cluster.proxy_counters();
    let host = sampler.finish().await;
    if host.noisy {
        tracing::warn!(run = %label, lag_p99_ms = host.lag_p99_ms, "the host was busy: this run is noisy");
    }
    let _ = stop.send(true);
    let (phase_starts, phase_ends, failure) = driver
        .await
        .map_err(|e| TestbedError::Invalid(format!("the event driver failed: {e}")))?;
    if let (Some(board), Some(id)) = (board, progress_id) {
        board.remove(id);
    }
    if let Some(e) = failure {
        return Err(e);
    }
    records.sort_by_key(|r| r.seq);
    let mut run = report(
        scenario,
        strategy,
        label,
        records,
        phase_starts,
        warmed_up,
        host,
    );
    run.proxy = counters_at_end.since(&counters_at_start);
    for (client, n) in run.clients.iter_mut().zip(connections) {
        client.connections = n;
    }
    // Phase k runs from the k-th snapshot (the start, then each event) to the next.
    let bounds: Vec<ProxyCounters> = std::iter::once(counters_at_start)
        .chain(phase_ends)
        .chain(std::iter::once(counters_at_end))
        .collect();
    run.proxy_phases = run
        .phase_starts
        .iter()
        .zip(bounds.windows(2))
        .map(|((phase, _), pair)| ProxyPhase {
            phase: phase.clone(),
            counters: pair[1].since(&pair[0]),
        })
        .collect();
    Ok(run)
}

/// Summarise one run's records.
fn report(
    scenario: &Scenario,
    strategy: &StrategySpec,
    label: &str,
    records: Vec<RequestRecord>,
    phase_starts: Vec<(String, Duration)>,
    warmed_up: bool,
    host: HostReport,
) -> RunReport {
    // In the order `drive` numbered them.
    let instance_names: Vec<String> = scenario
        .services
        .iter()
        .flat_map(|s| s.instances.iter().map(|i| i.name.clone()))
        .collect();
    let objectives = scenario.objectives(strategy);
    let service_of: Vec<usize> = scenario.clients.iter().map(|c| c.service).collect();
    let slos: Vec<Duration> = service_of.iter().map(|s| objectives[*s].0).collect();
    let slo = |r: &RequestRecord| {
        slos.get(usize::from(r.client))
            .copied()
            .unwrap_or(Duration::MAX)
    };
    let summary = Summary::of(&records, &slo);
    let overall = per_instance(&records, &instance_names);
    let mut phase_list: Vec<(String, Duration)> = vec![("T0".to_string(), Duration::ZERO)];
    phase_list.extend(phase_starts.iter().cloned());
    let phases = phase_list
        .iter()
        .enumerate()
        .map(|(p, (name, start))| {
            let in_phase: Vec<&RequestRecord> = records
                .iter()
                .filter(|r| usize::from(r.phase) == p)
                .collect();
            PhaseReport {
                name: name.clone(),
                start_s: start.as_secs_f64(),
                summary: Summary::of(in_phase.iter().copied(), &slo),
                per_instance: per_instance(in_phase.iter().copied(), &instance_names)
                    .into_iter()
                    .collect(),
            }
        })
        .collect();

    // Per service: its own requests, instances, SLO and percentile, overall and per phase.
    let mut first_instance = 0usize;
    let mut services = Vec::new();
    for (si, service) in scenario.services.iter().enumerate() {
        let members: Vec<(u16, String)> = service
            .instances
            .iter()
            .enumerate()
            .map(|(k, inst)| ((first_instance + k) as u16, inst.name.clone()))
            .collect();
        first_instance += service.instances.len();
        let own: Vec<&RequestRecord> = records
            .iter()
            .filter(|r| service_of.get(usize::from(r.client)) == Some(&si))
            .collect();
        let (slo, percentile) = objectives[si];
        let name = format!("{}.{}", service.name, service.namespace);
        let by_phase = phase_list
            .iter()
            .enumerate()
            .map(|(p, (phase, _))| {
                let in_phase: Vec<&RequestRecord> = own
                    .iter()
                    .copied()
                    .filter(|r| usize::from(r.phase) == p)
                    .collect();
                (
                    phase.clone(),
                    ServiceSummary::of(name.clone(), slo, percentile, &in_phase, &members),
                )
            })
            .collect();
        services.push(ServiceReport {
            all: ServiceSummary::of(name, slo, percentile, &own, &members),
            phases: by_phase,
        });
    }
    let services_met = services.iter().filter(|s| s.all.met).count();
    let services_met_where_reachable = services
        .iter()
        .filter(|s| s.all.met_where_reachable)
        .count();

    let clients = scenario
        .clients
        .iter()
        .enumerate()
        .map(|(i, c)| ClientReport {
            name: c.name.clone(),
            node: scenario.nodes[c.node].name.clone(),
            service: {
                let s = &scenario.services[c.service];
                format!("{}.{}", s.name, s.namespace)
            },
            protocol: c.protocol,
            connections: 0,
            summary: Summary::of(records.iter().filter(|r| usize::from(r.client) == i), &slo),
        })
        .collect();
    let counted: u64 = overall.iter().map(|(_, n)| n).sum();
    let slo_ms = match slos.split_first() {
        Some((first, rest)) if rest.iter().all(|s| s == first) => Some(first.as_secs_f64() * 1e3),
        _ => None,
    };
    RunReport {
        slo_ms,
        scenario: scenario.name.clone(),
        variant: scenario.variant.clone(),
        strategy: strategy.strategy.clone(),
        label: label.to_string(),
        accounting_gap: records.len() as i64 - counted as i64,
        summary,
        per_instance: overall,
        services,
        services_met,
        services_met_where_reachable,
        phases,
        clients,
        warmed_up,
        host,
        repeat: 1,
        series: label.to_string(),
        proxy: ProxyCounters::default(),
        proxy_phases: Vec::new(),
        records,
        instance_names,
        phase_starts: phase_list,
        client_service: service_of,
    }
}
