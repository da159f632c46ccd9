//! `proxima-emulate`: run an emulated pod or a delay link by hand.
//!
//! ```text
//! proxima-emulate backend --listen 127.0.0.1:9001 --name a --delay 20ms
//! proxima-emulate backend --listen 127.0.0.1:9002 --name b --processing 'normal(20ms, 4ms)' --seed 1
//! proxima-emulate link --listen 127.0.0.1:9101 --target 127.0.0.1:9001 --delay 5ms
//! ```

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use proxima_emulate::{Backend, BackendConfig, DelayLink, ProcessingTime};

// The command line is one subcommand; clap names the program after the package.
#[derive(Debug, Parser)]
#[command(version, about = "Emulated pods and network delay for Proxima")]
enum Command {
    /// Serve HTTP/1.1 as an emulated pod until Ctrl-C.
    Backend {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:9001")]
        listen: SocketAddr,
        /// Name returned in the `x-backend` header.
        #[arg(long, default_value = "backend")]
        name: String,
        /// Processing time before the response headers (e.g. 20ms).
        #[arg(long, default_value = "0ms", value_parser = parse_duration)]
        delay: Duration,
        /// Uniform extra processing time, 0..=jitter (e.g. 5ms).
        #[arg(long, default_value = "0ms", value_parser = parse_duration)]
        jitter: Duration,
        /// Processing time drawn per request, added to the delay: `5ms`,
        /// `uniform(2ms, 8ms)`, `normal(5ms, 1ms)` or `exponential(5ms)`.
        #[arg(long, default_value = "0ms")]
        processing: ProcessingTime,
        /// Seed of the processing-time draws (default: from entropy).
        #[arg(long)]
        seed: Option<u64>,
        /// Requests processed at once; more wait (default: no limit).
        #[arg(long)]
        workers: Option<usize>,
    },
    /// Relay TCP to a target, delaying each direction, until Ctrl-C.
    Link {
        /// Address to listen on.
        #[arg(long)]
        listen: SocketAddr,
        /// Address to relay to.
        #[arg(long)]
        target: SocketAddr,
        /// One-way delay added to each direction (e.g. 10ms).
        #[arg(long, value_parser = parse_duration)]
        delay: Duration,
    },
}

fn parse_duration(value: &str) -> Result<Duration, String> {
    proxima_emulate::parse_duration(value).map_err(|error| error.to_string())
}

fn main() -> anyhow::Result<()> {
    let command = Command::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    runtime.block_on(run(command))
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Backend {
            listen,
            name,
            delay,
            jitter,
            processing,
            seed,
            workers,
        } => {
            let mut config = BackendConfig::new(name)
                .delay(delay)
                .jitter(jitter)
                .processing(processing);
            config.seed = seed;
            config.workers = workers.map(|w| w.max(1));
            let backend = Backend::spawn(listen, config)
                .await
                .with_context(|| format!("cannot listen on {listen}"))?;
            println!(
                "backend {} listening on {} (delay {delay:?}, jitter {jitter:?}, processing {processing})",
                backend.name(),
                backend.addr()
            );
            tokio::signal::ctrl_c()
                .await
                .context("cannot wait for Ctrl-C")?;
            backend.shutdown().await;
        }
        Command::Link {
            listen,
            target,
            delay,
        } => {
            let link = DelayLink::spawn(listen, target, delay)
                .await
                .with_context(|| format!("cannot listen on {listen}"))?;
            println!(
                "link {} -> {} (one-way delay {delay:?})",
                link.addr(),
                link.target()
            );
            tokio::signal::ctrl_c()
                .await
                .context("cannot wait for Ctrl-C")?;
        }
    }
    Ok(())
}
