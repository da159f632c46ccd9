//! `proxima-testbed`: run a scenario on an emulated edge cluster and compare strategies.
//!
//! ```text
//! proxima-testbed run examples/scenarios/qedgeproxy-static.yaml \
//!     --strategies qos-pool,round-robin,proximity:alpha=0.8 --out docs/results/qedgeproxy-static
//! proxima-testbed check examples/scenarios/rap-delay.yaml
//! proxima-testbed generate --nodes 12 --regions 3 --services 3 --seed 7 --out gen.yaml
//! proxima-testbed coordinates --nodes 50,100,250 --seed 1,2,3 --plot coordinates.png
//! proxima-testbed compare out/n20-seed1 out/n20-seed2 --lead qos-pool --out out/all
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Parser;
use proxima_testbed::compare;
use proxima_testbed::coordinates::{self, ErrorStats, SimOptions, SimReport};
use proxima_testbed::generate::{generate, GenerateOptions};
use proxima_testbed::report::{self, Provenance};
use proxima_testbed::{
    cluster, k8s, netns, plan, plot, run_jobs, DiscoveryMode, ProgressBoard, RunOptions,
    ScenarioFile, StrategySpec,
};
use tokio::sync::watch;

// The command line is one subcommand; clap names the program after the package.
#[derive(Debug, Parser)]
#[command(
    version,
    about = "Emulate a geo-distributed edge cluster on one machine and compare Proxima's strategies"
)]
enum Command {
    /// Run a scenario once per strategy (and variant) and report.
    Run {
        /// The scenario file (YAML).
        scenario: PathBuf,
        /// Strategies to compare, comma-separated: `name[:key=value]...`, e.g.
        /// `qos-pool,round-robin,proximity:alpha=0.8:decay=inverse`. Default: the
        /// scenario's `strategies`.
        #[arg(long, value_delimiter = ',')]
        strategies: Vec<String>,
        /// Only these variants (comma-separated names). Default: all.
        #[arg(long, value_delimiter = ',')]
        variants: Vec<String>,
        /// Where to write results.json, the CSV files and the plots. Default:
        /// target/testbed/<scenario name>.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Runs at once, each on its own address block (127.K.1.N).
        #[arg(long, default_value_t = 1)]
        parallel: usize,
        /// Override the scenario's seed.
        #[arg(long)]
        seed: Option<u64>,
        /// Also write every request to requests.csv.
        #[arg(long)]
        raw: bool,
        /// Run everything N times and report, per strategy and service, the median and
        /// range over the N runs (plots show the first). Repeat k runs the strategies
        /// in turn from the k-th, so that each runs first as often as the others.
        #[arg(long, default_value_t = 1)]
        repeat: u32,
        /// Do not draw PNG plots.
        #[arg(long)]
        no_plots: bool,
        /// No progress line.
        #[arg(long, short)]
        quiet: bool,
        /// Discovery from a real Kubernetes API server (Nodes, Services, EndpointSlices)
        /// instead of topology files: starts etcd and kube-apiserver (from
        /// tests/k8s/provision.sh) and runs everything in a private network namespace
        /// (needs root), nodes on 10.251.K.N.
        #[arg(long)]
        kube: bool,
        /// Run in the host's network namespace instead of the testbed's own (which
        /// needs root or user namespaces). Scenarios with `blackhole` or `node-down`
        /// events are refused then: they drop packets with nftables, which only happens
        /// in the testbed's own namespace.
        #[arg(long, conflicts_with = "kube")]
        host_network: bool,
    },
    /// Check a scenario file and show what it would run.
    Check { scenario: PathBuf },
    /// Simulate the peer prober's rounds on generated latency matrices and report how
    /// well network coordinates predict every pair's RTT, and what probes cost on the
    /// wire (no process is started; see docs/results/coordinates.md).
    Coordinates {
        /// Cluster sizes, comma-separated (2 to 250 each).
        #[arg(long, value_delimiter = ',', required = true)]
        nodes: Vec<usize>,
        /// Seeds, comma-separated: one run per size and seed.
        #[arg(long, value_delimiter = ',', default_value = "1")]
        seed: Vec<u64>,
        /// Regions of the generated topologies.
        #[arg(long, default_value_t = 4)]
        regions: usize,
        /// `generated`: the matrix `generate` writes (delays drawn per pair); `plane`:
        /// the same zones and regions as places in a plane (delays obey the triangle
        /// inequality).
        #[arg(long, default_value = "generated")]
        geometry: String,
        /// Probe rounds per run.
        #[arg(long, default_value_t = 60)]
        rounds: usize,
        /// Most peers probed per node and round (default: the prober's).
        #[arg(long)]
        peers_per_round: Option<usize>,
        /// Largest random jitter added to an RTT sample, as a share of it.
        #[arg(long, default_value_t = 0.05)]
        jitter: f64,
        /// Dimensions of the coordinates' Euclidean part.
        #[arg(long)]
        dimensions: Option<usize>,
        /// Vivaldi's c_c (most one sample moves a coordinate).
        #[arg(long)]
        cc: Option<f64>,
        /// Vivaldi's c_e (most one sample changes the error estimate).
        #[arg(long)]
        ce: Option<f64>,
        /// Residuals averaged into each node's adjustment term (0: none).
        #[arg(long)]
        adjustment_window: Option<usize>,
        /// Write the median and p90 error after every round to this CSV file.
        #[arg(long)]
        csv: Option<PathBuf>,
        /// Draw the error against rounds (first seed of each size) to this PNG file.
        #[arg(long)]
        plot: Option<PathBuf>,
    },
    /// Put several `run --out` directories side by side: each strategy's share of reach
    /// per scenario (directory and variant), by how much `--lead` is ahead of the best
    /// other, and the host's lag; writes compare.md, compare.csv and compare.png.
    Compare {
        /// `run --out` directories (each with its summary.csv).
        #[arg(required = true)]
        dirs: Vec<PathBuf>,
        /// The strategy label whose margin over the others the table gives.
        #[arg(long, default_value = "qos-pool")]
        lead: String,
        /// Where to write the files.
        #[arg(long)]
        out: PathBuf,
    },
    /// Write a random but valid scenario (every event kind once) to stdout or --out.
    Generate {
        #[arg(long)]
        nodes: usize,
        #[arg(long, default_value_t = 1)]
        regions: usize,
        #[arg(long, default_value_t = 1)]
        services: usize,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// How long the clients send (seconds).
        #[arg(long, default_value_t = 20)]
        duration: u64,
        /// Write the scenario here instead of stdout.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    let command = Command::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("PROXIMA_LOG")
                // kube-client logs every 500 of /readyz while the API server starts.
                .unwrap_or_else(|_| {
                    tracing_subscriber::EnvFilter::new("error,kube_client::client::builder=off")
                }),
        )
        .with_writer(std::io::stderr)
        .init();
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")
        .and_then(|rt| rt.block_on(run(command)));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("proxima-testbed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Read and check a scenario file; every problem on a line of its own, after the
/// file's name.
fn load(path: &std::path::Path) -> Result<ScenarioFile> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    ScenarioFile::parse(&text).map_err(|e| {
        let lines: Vec<String> = e
            .to_string()
            .lines()
            .map(|l| format!("{}: {l}", path.display()))
            .collect();
        anyhow::anyhow!(
            "{} is not a valid scenario:\n{}",
            path.display(),
            lines.join("\n")
        )
    })
}

/// One simulation with a progress line on stderr every ten rounds.
fn simulate_with_progress(options: &SimOptions, geometry: &str) -> Result<(SimReport, ErrorStats)> {
    let topology = match geometry {
        "generated" => coordinates::generated(options.nodes, options.regions, options.seed)
            .map_err(|e| anyhow::anyhow!(e))?,
        "plane" => coordinates::planar(options.nodes, options.regions, options.seed),
        other => anyhow::bail!("--geometry: generated or plane, not {other:?}"),
    };
    let started = std::time::Instant::now();
    let label = format!("{} nodes, seed {}", options.nodes, options.seed);
    let report = coordinates::simulate(options, &topology, &mut |e| {
        if e.round % 10 == 0 || e.round == options.rounds {
            eprintln!(
                "{label}: round {}/{}, median error {}, {:.0}s",
                e.round,
                options.rounds,
                percent(e.all.median),
                started.elapsed().as_secs_f64()
            );
        }
    });
    Ok((report, coordinates::class_baseline(&topology)))
}

fn percent(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{:.1}%", v * 100.0))
}

fn share(part: usize, whole: usize) -> String {
    if whole == 0 {
        "-".into()
    } else {
        format!("{:.0}%", part as f64 * 100.0 / whole as f64)
    }
}

/// The results as a Markdown table, one row per run.
fn coordinates_table(reports: &[(SimReport, ErrorStats)]) -> String {
    let mut out = String::from(
        "| nodes | seed | rounds | predicted pairs | median | p90 | not probed in 10 s: pairs | median | p90 | class baseline median | p90 | reply bytes (mean / max) | probe bytes per node per s |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for (r, baseline) in reports {
        let Some(last) = r.last() else { continue };
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.0} / {} | {:.0} |\n",
            r.options.nodes,
            r.options.seed,
            last.round,
            share(last.all.predicted, last.all.pairs),
            percent(last.all.median),
            percent(last.all.p90),
            share(last.not_recent.pairs, last.all.pairs),
            percent(last.not_recent.median),
            percent(last.not_recent.p90),
            percent(baseline.median),
            percent(baseline.p90),
            r.reply_bytes,
            r.largest_reply,
            r.bytes_per_node_per_second(),
        ));
    }
    out.push_str(
        "\n| nodes | seed | same zone: median | p90 | same region: median | p90 | other region: median | p90 | node error estimates: median | max | median height | median adjustment |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for (r, _) in reports {
        let [zone, region, world] = &r.by_class;
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {:.2} | {:.2} | {:.2} ms | {:.2} ms |\n",
            r.options.nodes,
            r.options.seed,
            percent(zone.median),
            percent(zone.p90),
            percent(region.median),
            percent(region.p90),
            percent(world.median),
            percent(world.p90),
            r.nodes_after.error_median,
            r.nodes_after.error_max,
            r.nodes_after.height_median * 1e3,
            r.nodes_after.adjustment_median * 1e3,
        ));
    }
    out
}

/// Every round of every run: nodes, seed, round, then median and p90 for all pairs,
/// pairs not probed recently and pairs without a fresh measurement.
fn coordinates_csv(reports: &[(SimReport, ErrorStats)]) -> String {
    let mut out = String::from(
        "nodes,seed,round,predicted,pairs,median,p90,not_recent_pairs,not_recent_median,not_recent_p90,unmeasured_pairs,unmeasured_median,unmeasured_p90\n",
    );
    let v = |x: Option<f64>| x.map_or(String::new(), |x| format!("{x:.4}"));
    for (r, _) in reports {
        for e in &r.rounds {
            out.push_str(&format!(
                "{},{},{},{},{},{},{},{},{},{},{},{},{}\n",
                r.options.nodes,
                r.options.seed,
                e.round,
                e.all.predicted,
                e.all.pairs,
                v(e.all.median),
                v(e.all.p90),
                e.not_recent.pairs,
                v(e.not_recent.median),
                v(e.not_recent.p90),
                e.unmeasured.pairs,
                v(e.unmeasured.median),
                v(e.unmeasured.p90),
            ));
        }
    }
    out
}

fn git(args: &[&str]) -> Option<String> {
    let out = std::process::Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

async fn run(command: Command) -> Result<()> {
    match command {
        Command::Generate {
            nodes,
            regions,
            services,
            seed,
            duration,
            out,
        } => {
            let options = GenerateOptions {
                nodes,
                regions,
                services,
                seed,
                duration_s: duration,
            };
            let text = generate(&options).map_err(|e| anyhow::anyhow!(e))?;
            // Never write what check would refuse.
            ScenarioFile::parse(&text)
                .map_err(|e| anyhow::anyhow!("generated an invalid scenario (a bug):\n{e}"))?;
            match out {
                Some(path) => std::fs::write(&path, text)
                    .with_context(|| format!("cannot write {}", path.display()))?,
                None => print!("{text}"),
            }
            Ok(())
        }
        Command::Coordinates {
            nodes,
            seed,
            regions,
            geometry,
            rounds,
            peers_per_round,
            jitter,
            dimensions,
            cc,
            ce,
            adjustment_window,
            csv,
            plot,
        } => {
            let mut reports = Vec::new();
            for n in &nodes {
                for s in &seed {
                    let mut options = SimOptions::new(*n, regions.min(*n), *s);
                    options.rounds = rounds;
                    options.jitter = jitter;
                    options.peers_per_round = peers_per_round.unwrap_or(options.peers_per_round);
                    let v = &mut options.vivaldi;
                    v.dimensions = dimensions.unwrap_or(v.dimensions);
                    v.cc = cc.unwrap_or(v.cc);
                    v.ce = ce.unwrap_or(v.ce);
                    v.adjustment_window = adjustment_window.unwrap_or(v.adjustment_window);
                    reports.push(simulate_with_progress(&options, &geometry)?);
                }
            }
            println!("{}", coordinates_table(&reports));
            if let Some(path) = csv {
                std::fs::write(&path, coordinates_csv(&reports))
                    .with_context(|| format!("cannot write {}", path.display()))?;
                eprintln!("wrote {}", path.display());
            }
            if let Some(path) = plot {
                let mut first_seed = std::collections::HashSet::new();
                let shown: Vec<_> = reports
                    .iter()
                    .filter(|(r, _)| first_seed.insert(r.options.nodes))
                    .map(|(r, _)| r.clone())
                    .collect();
                if plot::coordinate_errors(&path, &shown)? {
                    eprintln!("wrote {}", path.display());
                }
            }
            Ok(())
        }
        Command::Compare { dirs, lead, out } => {
            let comparison = compare::compare(compare::read_dirs(&dirs)?);
            println!("{}", compare::write(&out, &comparison, &lead)?);
            plot::comparison(&out.join("compare.png"), &comparison)?;
            eprintln!(
                "wrote compare.md, compare.csv and compare.png in {}",
                out.display()
            );
            Ok(())
        }
        Command::Check { scenario } => {
            let file = load(&scenario)?;
            let jobs = plan(&file, &[], &[])?;
            println!("{}: {} run(s)", scenario.display(), jobs.len());
            for job in &jobs {
                let s = &job.scenario;
                println!(
                    "  {}{}: {} nodes, {} instances, {} clients, {} events",
                    if s.variant.is_empty() {
                        String::new()
                    } else {
                        format!("[{}] ", s.variant)
                    },
                    job.strategy,
                    s.nodes.len(),
                    s.services.iter().map(|x| x.instances.len()).sum::<usize>(),
                    s.clients.len(),
                    s.events.len()
                );
            }
            Ok(())
        }
        Command::Run {
            scenario,
            strategies,
            variants,
            out,
            parallel,
            seed,
            raw,
            repeat,
            no_plots,
            quiet,
            kube,
            host_network,
        } => {
            let file = load(&scenario)?;
            let strategies: Vec<StrategySpec> = strategies
                .iter()
                .filter(|s| !s.trim().is_empty())
                .map(|s| StrategySpec::parse(s).map_err(|e| anyhow::anyhow!("--strategies: {e}")))
                .collect::<Result<_, _>>()?;
            let mut jobs = plan(&file, &strategies, &variants)?;
            if let Some(seed) = seed {
                for job in &mut jobs {
                    job.scenario.seed = seed;
                }
            }
            let repeat = repeat.max(1);
            // (repeat number, series label) of every job, in job order.
            let mut series: Vec<(u32, String)> = Vec::new();
            if repeat > 1 {
                let once = std::mem::take(&mut jobs);
                for k in 1..=repeat {
                    // Each repeat starts one job later, so that no strategy always runs
                    // first (the first run of a sitting was the noisiest, issue 30).
                    let start = (k as usize - 1) % once.len().max(1);
                    for job in once.iter().cycle().skip(start).take(once.len()) {
                        let mut job = job.clone();
                        series.push((k, job.strategy.label.clone()));
                        job.strategy.label = format!("{} #{k}", job.strategy.label);
                        jobs.push(job);
                    }
                }
            }
            if kube && parallel > 1 {
                anyhow::bail!("--kube runs one at a time (the runs share one API server)");
            }
            if host_network {
                if let Some(job) = jobs.iter().find(|j| cluster::drops_packets(&j.scenario)) {
                    anyhow::bail!(
                        "--host-network: scenario {} has blackhole or node-down events, \
                         which drop packets with nftables in the testbed's own network \
                         namespace; run without --host-network",
                        job.scenario.name
                    );
                }
            } else if !netns::inside() {
                // Again, in a network namespace of its own (holding the node addresses
                // with --kube; 127.K.1.N are its loopback addresses otherwise).
                let addresses: Vec<_> = if kube {
                    let nodes = jobs
                        .iter()
                        .map(|j| j.scenario.nodes.len())
                        .max()
                        .unwrap_or(0);
                    (0..nodes).map(|i| k8s::node_address(0, i)).collect()
                } else {
                    Vec::new()
                };
                let status = netns::reexec_isolated(&addresses)?;
                return if status.success() {
                    Ok(())
                } else {
                    Err(anyhow::anyhow!("the isolated run failed ({status})"))
                };
            } else {
                netns::check_isolated()?;
            }
            let control_plane = if kube {
                eprintln!("starting etcd and kube-apiserver v{}", k8s::K8S_VERSION);
                Some(k8s::ControlPlane::start().await?)
            } else {
                None
            };
            let first = jobs.first().context("nothing to run")?;
            let name = first.scenario.name.clone();
            let description = first.scenario.description.clone();
            let seed = first.scenario.seed;
            let out = out.unwrap_or_else(|| PathBuf::from("target/testbed").join(&name));
            eprintln!(
                "{name}: {} run(s), {} at a time; results in {}",
                jobs.len(),
                parallel.max(1),
                out.display()
            );

            let board = ProgressBoard::default();
            let (stop, stopped) = watch::channel(false);
            let printer = (!quiet).then(|| tokio::spawn(board.clone().run(stopped)));
            let options = RunOptions {
                progress: !quiet,
                discovery: match &control_plane {
                    Some(plane) => DiscoveryMode::Kube(k8s::KubeApi(plane.client())),
                    None => DiscoveryMode::Files,
                },
                ..RunOptions::default()
            };
            let result = run_jobs(jobs, parallel, &options, (!quiet).then_some(&board)).await;
            let _ = stop.send(true);
            if let Some(p) = printer {
                let _ = p.await;
            }
            let _ = std::fs::remove_dir_all(&options.work_dir);
            drop(options);
            drop(control_plane);
            let mut runs = result?;
            for (run, (k, label)) in runs.iter_mut().zip(&series) {
                run.repeat = *k;
                run.series = match run.variant.as_str() {
                    "" => label.clone(),
                    v => format!("{v} {label}"),
                };
            }

            println!("{}", report::table(&runs));
            let provenance = Provenance {
                scenario_file: scenario.display().to_string(),
                command: std::env::args().collect::<Vec<_>>().join(" "),
                commit: git(&["rev-parse", "HEAD"]),
                dirty: git(&["status", "--porcelain"]).map(|s| !s.is_empty()),
                seed,
            };
            report::write_files(&out, &provenance, &name, description.as_deref(), &runs, raw)?;
            if !no_plots {
                let first: Vec<_> = runs.iter().filter(|r| r.repeat <= 1).cloned().collect();
                for path in plot::draw_all(&out, &first)? {
                    eprintln!("wrote {}", path.display());
                }
            }
            eprintln!(
                "wrote {}/results.json, summary.csv, services.csv, instances.csv",
                out.display()
            );
            Ok(())
        }
    }
}
