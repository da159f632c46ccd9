//! `proxima`: the per-node proxy binary. The arguments are in `cli`; each command has
//! its module (`run`, `demo`, `check`).

mod check;
mod cli;
mod demo;
mod heap;
mod kubernetes;
mod load;
mod logging;
mod run;
mod shutdown;

use std::future::Future;
use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command};

/// Parse the command line, run the command, and turn its outcome into an exit code:
/// 0 after a clean shutdown, 1 on an error (after a clear message), 2 on bad flags.
fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = logging::init(&cli.log) {
        eprintln!("error: {e:#}");
        return ExitCode::from(2);
    }
    let result = match cli.command {
        Command::Check(args) => return check::run(&args),
        Command::Run(args) => {
            heap::limit_arenas(args.serve.proxy.worker_count());
            block_on(run::run(args))
        }
        Command::Demo(args) => block_on(demo::run(args)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            logging::fatal(cli.log.log_format, &e);
            ExitCode::FAILURE
        }
    }
}

/// Run an async command on a multi-threaded runtime.
fn block_on(command: impl Future<Output = anyhow::Result<()>>) -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| anyhow::anyhow!("cannot start the async runtime: {e}"))?
        .block_on(command)
}
