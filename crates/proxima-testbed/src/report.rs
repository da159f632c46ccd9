//! Writing results: a table for the terminal, JSON and CSV files for later.
//!
//! * `results.json`: the scenario, the command and commit that produced it, and every
//!   run's [`RunReport`] (summary, requests per instance and per phase, per client);
//! * `summary.csv`: one line per run (with how many services met their own SLO, and
//!   the host's scheduling lag and load during it, `noisy` when the lag was high);
//! * `services.csv`: one line per run, service and phase (`phase` = `all` for the whole
//!   run): the service's own SLO and percentile, the response time at that percentile,
//!   whether it was met, share within SLO, mean/p50/p95/p99, errors, timeouts, and the
//!   spread of requests over its instances (max/min over those with at least 1%);
//! * `instances.csv`: requests per instance, per run and phase (`phase` = `all` for the
//!   whole run);
//! * `clients.csv`: one line per run and client: its service, its `protocol` (`http`,
//!   `grpc` or `websocket`: what its requests were, so that results for gRPC calls and
//!   WebSocket messages are told from HTTP requests), the connections to its proxy that
//!   carried answers, and its numbers;
//! * `requests.csv` (with `--raw`): every request, with its error kind (`status`,
//!   `grpc-status` for a gRPC call answered with a code other than OK, `connection` or
//!   `timeout`) when it failed; its client's protocol is in `clients.csv`.

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::stats::{repeat_summaries, RepeatSummary, RunReport, Spread3, ERROR_BUCKET};
use crate::TestbedError;

/// Where a set of results came from.
#[derive(Clone, Debug, Serialize)]
pub struct Provenance {
    /// The scenario file as given on the command line.
    pub scenario_file: String,
    /// The whole command line.
    pub command: String,
    /// `git rev-parse HEAD` of the work tree, if git answered.
    pub commit: Option<String>,
    /// Whether the work tree had uncommitted changes.
    pub dirty: Option<bool>,
    /// The scenario's seed.
    pub seed: u64,
}

#[derive(Serialize)]
struct ResultsFile<'a> {
    provenance: &'a Provenance,
    scenario: &'a str,
    description: Option<&'a str>,
    runs: &'a [RunReport],
    /// With `--repeat N`: median and range per series and service.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    repeats: Vec<RepeatSummary>,
}

/// The results table: one line per run, one per service and run (against the
/// service's own SLO and percentile), then requests per instance, per phase and per
/// client.
pub fn table(runs: &[RunReport]) -> String {
    let mut out = String::new();
    let width = runs.iter().map(|r| r.label.len()).max().unwrap_or(8).max(8);
    let _ = writeln!(
        out,
        "{:<width$}  {:>8} {:>9} {:>8} {:>8} {:>8} {:>9} {:>9} {:>9} {:>7} {:>8} {:>9} {:>9}  host (runtime lag, 1-min load)",
        "run",
        "requests",
        "avg ms",
        "p50 ms",
        "p95 ms",
        "p99 ms",
        "in SLO",
        "of reach",
        "req/s",
        "errors",
        "timeouts",
        "SLOs met",
        "at reach",
    );
    for r in runs {
        let s = &r.summary;
        let _ = writeln!(
            out,
            "{:<width$}  {:>8} {:>9.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2}% {:>8.2}% {:>9.1} {:>7} {:>8} {:>9} {:>9}  {}",
            r.label,
            s.requests,
            s.avg_ms,
            s.p50_ms,
            s.p95_ms,
            s.p99_ms,
            s.slo_share,
            s.reachable_share,
            s.throughput,
            s.failed,
            s.timeouts,
            format!("{}/{}", r.services_met, r.services.len()),
            format!("{}/{}", r.services_met_where_reachable, r.services.len()),
            r.host.brief(),
        );
    }
    let _ = writeln!(
        out,
        "(of reach: of the requests some instance could have answered within the SLO when \
         they were sent, by the scenario's delays and processing times, the share that was; \
         SLOs met at reach: services whose own percentile over those requests met the SLO)"
    );
    if runs.iter().any(|r| r.host.noisy) {
        let _ = writeln!(
            out,
            "NOISY: the runtime woke late (p99 lag above {} ms): the host, not only the \
             strategy, shaped these runs' response times",
            crate::host::NOISY_LAG_P99.as_millis()
        );
    }
    let swidth = runs
        .iter()
        .flat_map(|r| r.services.iter().map(|s| s.all.service.len()))
        .max()
        .unwrap_or(7)
        .max(7);
    let _ = writeln!(
        out,
        "\nper service (each against its own SLO at its own percentile; spread = max/min \
         requests over its instances with at least 1% of them):"
    );
    let _ = writeln!(
        out,
        "{:<width$}  {:<swidth$} {:>14} {:>8} {:>9} {:>9} {:>4} {:>9} {:>8} {:>8} {:>8} {:>8} {:>6} {:>8} {:>6}",
        "run",
        "service",
        "SLO",
        "in SLO",
        "of reach",
        "at pct",
        "met",
        "at reach",
        "avg ms",
        "p50 ms",
        "p95 ms",
        "p99 ms",
        "errors",
        "timeouts",
        "spread"
    );
    for r in runs {
        for svc in &r.services {
            let v = &svc.all;
            let s = &v.summary;
            let _ = writeln!(
                out,
                "{:<width$}  {:<swidth$} {:>14} {:>7.2}% {:>8.2}% {:>9} {:>4} {:>9} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>6} {:>8} {:>6}",
                r.label,
                v.service,
                format!("{} ms @ p{}", v.slo_ms, v.percentile),
                s.slo_share,
                s.reachable_share,
                v.at_percentile_ms
                    .map_or("failed".to_string(), |t| format!("{t:.2}")),
                if v.met { "yes" } else { "no" },
                if v.met_where_reachable { "yes" } else { "no" },
                s.avg_ms,
                s.p50_ms,
                s.p95_ms,
                s.p99_ms,
                s.failed,
                s.timeouts,
                v.spread.map_or("-".to_string(), |x| format!("{x:.2}")),
            );
        }
    }
    let _ = writeln!(out, "\nrequests per instance:");
    for r in runs {
        let counts: Vec<String> = r
            .per_instance
            .iter()
            .map(|(name, n)| format!("{name}={n}"))
            .collect();
        let _ = writeln!(out, "{:<width$}  {}", r.label, counts.join(" "));
    }
    if runs.iter().any(|r| r.phases.len() > 1) {
        let pwidth = runs
            .iter()
            .flat_map(|r| r.phases.iter().map(|p| p.name.len()))
            .max()
            .unwrap_or(4);
        let _ = writeln!(
            out,
            "\nper phase and service (share in SLO, spread; requests per instance):"
        );
        for r in runs.iter().filter(|r| r.phases.len() > 1) {
            for svc in &r.services {
                for (phase, v) in &svc.phases {
                    if v.summary.requests == 0 {
                        continue;
                    }
                    let counts: Vec<String> = v
                        .per_instance
                        .iter()
                        .filter(|(_, n)| *n > 0)
                        .map(|(name, n)| format!("{name}={n}"))
                        .collect();
                    let _ = writeln!(
                        out,
                        "{:<width$}  {:<swidth$} {:<pwidth$} {:>6.2}% {:>6}  {}",
                        r.label,
                        v.service,
                        phase,
                        v.summary.slo_share,
                        v.spread.map_or("-".to_string(), |x| format!("{x:.2}")),
                        counts.join(" ")
                    );
                }
            }
        }
    }
    if runs.iter().any(|r| !r.proxy.is_zero()) {
        let pwidth = runs
            .iter()
            .flat_map(|r| r.proxy_phases.iter().map(|p| p.phase.len()))
            .max()
            .unwrap_or(3)
            .max(3);
        let _ = writeln!(
            out,
            "\nproxies, summed over the nodes (failed upstream attempts: connect = refused or \
             over connect-timeout, timeout = over the service's timeout; QoS-pool changes; \
             background probes of pods), in all and per phase with any:"
        );
        let _ = writeln!(
            out,
            "{:<width$}  {:<pwidth$} {:>8} {:>8} {:>6} {:>8} {:>7} {:>10} {:>7}",
            "run",
            "phase",
            "connect",
            "timeout",
            "reset",
            "protocol",
            "evicted",
            "readmitted",
            "probes"
        );
        for r in runs {
            let all = std::iter::once(("all", &r.proxy));
            let phases = r
                .proxy_phases
                .iter()
                .filter(|p| !p.counters.is_zero())
                .map(|p| (p.phase.as_str(), &p.counters));
            for (phase, c) in all.chain(phases) {
                let _ = writeln!(
                    out,
                    "{:<width$}  {:<pwidth$} {:>8} {:>8} {:>6} {:>8} {:>7} {:>10} {:>7}",
                    r.label,
                    phase,
                    c.connect_failures,
                    c.timeouts,
                    c.resets,
                    c.protocol_errors,
                    c.evictions,
                    c.readmissions,
                    c.probes
                );
            }
        }
    }
    let repeats = repeat_summaries(runs);
    if runs.iter().any(|r| r.repeat > 1) {
        let _ = writeln!(
            out,
            "\nover repeats (median [min..max]; met and noisy: runs out of all):"
        );
        let f = |s: &Option<Spread3>, unit: &str| {
            s.as_ref().map_or("-".to_string(), |s| {
                format!("{}{unit} [{}..{}]", s.median, s.min, s.max)
            })
        };
        for r in &repeats {
            let _ = writeln!(
                out,
                "{:<width$}  {:<swidth$} in SLO {}  of reach {}  at pct {}  p99 {}  spread {}  met {}/{}  met at reach {}/{}  noisy {}/{}",
                r.series,
                r.service,
                f(&r.slo_share, "%"),
                f(&r.reachable_share, "%"),
                f(&r.at_percentile_ms, " ms"),
                f(&r.p99_ms, " ms"),
                f(&r.spread, ""),
                r.met,
                r.runs,
                r.met_where_reachable,
                r.runs,
                r.noisy,
                r.runs
            );
        }
    }
    if runs.iter().any(|r| r.clients.len() > 1) {
        let _ = writeln!(out, "\nper client [protocol] (avg ms, req/s):");
        for r in runs {
            let parts: Vec<String> = r
                .clients
                .iter()
                .map(|c| {
                    format!(
                        "{}@{} [{}]: {:.2} ms {:.1} req/s",
                        c.name,
                        c.node,
                        c.protocol.as_str(),
                        c.summary.avg_ms,
                        c.summary.throughput
                    )
                })
                .collect();
            let _ = writeln!(out, "{:<width$}  {}", r.label, parts.join("  "));
        }
    }
    out
}

/// `clients.csv`: one line per run and client.
fn clients_csv(runs: &[RunReport]) -> String {
    let mut text = String::from(
        "variant,label,client,node,service,protocol,connections,requests,failed,timeouts,slo_share,avg_ms,p50_ms,p95_ms,p99_ms,throughput\n",
    );
    for r in runs {
        for c in &r.clients {
            let s = &c.summary;
            let _ = writeln!(
                text,
                "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
                csv_field(&r.variant),
                csv_field(&r.label),
                csv_field(&c.name),
                csv_field(&c.node),
                csv_field(&c.service),
                c.protocol.as_str(),
                c.connections,
                s.requests,
                s.failed,
                s.timeouts,
                s.slo_share,
                s.avg_ms,
                s.p50_ms,
                s.p95_ms,
                s.p99_ms,
                s.throughput,
            );
        }
    }
    text
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn write(path: &Path, text: &str) -> Result<(), TestbedError> {
    std::fs::write(path, text).map_err(|e| TestbedError::io(path, e))
}

/// Write `results.json`, `summary.csv`, `services.csv`, `instances.csv`,
/// `clients.csv` (and `requests.csv` when `raw`) into `dir`.
pub fn write_files(
    dir: &Path,
    provenance: &Provenance,
    scenario: &str,
    description: Option<&str>,
    runs: &[RunReport],
    raw: bool,
) -> Result<(), TestbedError> {
    std::fs::create_dir_all(dir).map_err(|e| TestbedError::io(dir, e))?;
    let repeats = if runs.iter().any(|r| r.repeat > 1) {
        repeat_summaries(runs)
    } else {
        Vec::new()
    };
    let json = serde_json::to_string_pretty(&ResultsFile {
        provenance,
        scenario,
        description,
        runs,
        repeats,
    })
    .map_err(|e| TestbedError::Invalid(e.to_string()))?;
    write(&dir.join("results.json"), &json)?;

    let mut summary = String::from(
        "variant,strategy,label,requests,succeeded,failed,timeouts,slo_met,slo_share,reachable,reachable_share,avg_ms,p50_ms,p95_ms,p99_ms,max_ms,throughput,duration_s,services_met,services,repeat,lag_p50_ms,lag_p99_ms,lag_max_ms,load_start,load_max,noisy,proxy_connect_failures,proxy_timeouts,proxy_resets,proxy_evictions,proxy_readmissions,proxy_probes,services_met_where_reachable\n",
    );
    for r in runs {
        let s = &r.summary;
        let _ = writeln!(
            summary,
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            csv_field(&r.variant),
            csv_field(&r.strategy),
            csv_field(&r.label),
            s.requests,
            s.succeeded,
            s.failed,
            s.timeouts,
            s.slo_met,
            s.slo_share,
            s.reachable,
            s.reachable_share,
            s.avg_ms,
            s.p50_ms,
            s.p95_ms,
            s.p99_ms,
            s.max_ms,
            s.throughput,
            s.duration_s,
            r.services_met,
            r.services.len(),
            r.repeat,
            r.host.lag_p50_ms,
            r.host.lag_p99_ms,
            r.host.lag_max_ms,
            r.host.load_start.map_or(String::new(), |l| l.to_string()),
            r.host.load_max.map_or(String::new(), |l| l.to_string()),
            r.host.noisy,
            r.proxy.connect_failures,
            r.proxy.timeouts,
            r.proxy.resets,
            r.proxy.evictions,
            r.proxy.readmissions,
            r.proxy.probes,
            r.services_met_where_reachable,
        );
    }
    write(&dir.join("summary.csv"), &summary)?;

    let mut services = String::from(
        "variant,label,service,phase,slo_ms,percentile,at_percentile_ms,met,requests,failed,timeouts,slo_share,reachable,reachable_share,avg_ms,p50_ms,p95_ms,p99_ms,spread,max_per_instance,min_per_instance,at_percentile_reachable_ms,met_where_reachable\n",
    );
    for r in runs {
        for svc in &r.services {
            let rows = std::iter::once(("all", &svc.all))
                .chain(svc.phases.iter().map(|(p, v)| (p.as_str(), v)));
            for (phase, v) in rows {
                let s = &v.summary;
                let busy: Vec<u64> = v
                    .per_instance
                    .iter()
                    .filter(|(n, c)| n != ERROR_BUCKET && *c * 100 >= s.requests && *c > 0)
                    .map(|(_, c)| *c)
                    .collect();
                let _ = writeln!(
                    services,
                    "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
                    csv_field(&r.variant),
                    csv_field(&r.label),
                    csv_field(&v.service),
                    csv_field(phase),
                    v.slo_ms,
                    v.percentile,
                    v.at_percentile_ms.map_or(String::new(), |t| t.to_string()),
                    v.met,
                    s.requests,
                    s.failed,
                    s.timeouts,
                    s.slo_share,
                    s.reachable,
                    s.reachable_share,
                    s.avg_ms,
                    s.p50_ms,
                    s.p95_ms,
                    s.p99_ms,
                    v.spread.map_or(String::new(), |x| x.to_string()),
                    busy.iter().max().map_or(String::new(), |x| x.to_string()),
                    busy.iter().min().map_or(String::new(), |x| x.to_string()),
                    v.at_percentile_reachable_ms
                        .map_or(String::new(), |t| t.to_string()),
                    v.met_where_reachable,
                );
            }
        }
    }
    write(&dir.join("services.csv"), &services)?;

    let mut instances = String::from("variant,label,phase,instance,requests\n");
    for r in runs {
        for (name, n) in &r.per_instance {
            let _ = writeln!(
                instances,
                "{},{},all,{},{n}",
                csv_field(&r.variant),
                csv_field(&r.label),
                csv_field(name)
            );
        }
        for p in &r.phases {
            for (name, n) in &p.per_instance {
                let _ = writeln!(
                    instances,
                    "{},{},{},{},{n}",
                    csv_field(&r.variant),
                    csv_field(&r.label),
                    csv_field(&p.name),
                    csv_field(name)
                );
            }
        }
    }
    write(&dir.join("instances.csv"), &instances)?;
    write(&dir.join("clients.csv"), &clients_csv(runs))?;

    if raw {
        let mut text = String::from(
            "variant,label,seq,client,phase,start_ms,latency_ms,status,error,instance,reachable\n",
        );
        for r in runs {
            for rec in &r.records {
                let instance = rec
                    .instance
                    .and_then(|i| r.instance_names.get(usize::from(i)))
                    .map_or("", String::as_str);
                let _ = writeln!(
                    text,
                    "{},{},{},{},{},{:.3},{:.3},{},{},{},{}",
                    csv_field(&r.variant),
                    csv_field(&r.label),
                    rec.seq,
                    rec.client,
                    rec.phase,
                    rec.start.as_secs_f64() * 1e3,
                    rec.latency.as_secs_f64() * 1e3,
                    rec.status,
                    rec.error().map_or("", |e| e.as_str()),
                    csv_field(instance),
                    rec.reachable
                );
            }
        }
        write(&dir.join("requests.csv"), &text)?;
    }
    Ok(())
}
