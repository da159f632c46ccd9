//! Log output: human-readable text or JSON lines, on stderr, filtered by `--log-level`.

use std::io::IsTerminal;

use anyhow::anyhow;
use tracing_subscriber::EnvFilter;

use crate::cli::{LogArgs, LogFormat};

/// kube-client logs every failed API request at ERROR and every dropped watch at WARN:
/// while the API server is away that is a line a second saying what `proxima_k8s` says
/// once, at the right level ("Kubernetes API server unreachable; retrying"). Silenced
/// unless the filter names `kube_client` itself.
const QUIET_BY_DEFAULT: &str = "kube_client=off";

/// The filter for `--log-level`: the user's, plus [`QUIET_BY_DEFAULT`].
fn filter_spec(log_level: &str) -> String {
    if log_level.contains("kube_client") {
        log_level.to_string()
    } else {
        format!("{log_level},{QUIET_BY_DEFAULT}")
    }
}

/// Install the global subscriber.
pub fn init(args: &LogArgs) -> anyhow::Result<()> {
    let filter = EnvFilter::builder()
        .parse(filter_spec(&args.log_level))
        .map_err(|e| anyhow!("invalid --log-level {:?}: {e}", args.log_level))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let installed = match args.log_format {
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        // `span`: the innermost span's fields (`request`: id, service, endpoint,
        // attempt; `watcher`: kind, namespace), so a line can be joined to its request
        // or watch.
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .try_init(),
    };
    installed.map_err(|e| anyhow!("cannot install the logger: {e}"))
}

/// Report the error that ends the process: a plain `error:` line for people, a log
/// record for collectors that expect every line to be JSON.
pub fn fatal(format: LogFormat, error: &anyhow::Error) {
    match format {
        LogFormat::Text => eprintln!("error: {error:#}"),
        LogFormat::Json => tracing::error!("{error:#}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kube_client_is_quiet_unless_asked_for() {
        assert_eq!(filter_spec("info"), "info,kube_client=off");
        assert_eq!(
            filter_spec("debug,kube_client=debug"),
            "debug,kube_client=debug"
        );
        for level in ["info", "warn,proxima_proxy=debug", ""] {
            let spec = filter_spec(level);
            assert!(EnvFilter::builder().parse(&spec).is_ok(), "{spec}");
        }
    }
}
