//! One shutdown signal for every task, triggered by SIGTERM/SIGINT or by a task that
//! fails.

use std::future::Future;

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;
use tracing::{info, warn};

/// Cheap to clone; every clone triggers and observes the same shutdown.
#[derive(Clone, Debug)]
pub struct Shutdown(watch::Sender<bool>);

impl Shutdown {
    /// A shutdown not triggered yet.
    pub fn new() -> Self {
        Self(watch::Sender::new(false))
    }

    /// Start shutting down (again is a no-op).
    pub fn trigger(&self) {
        self.0.send_replace(true);
    }

    /// Whether shutdown has been triggered.
    pub fn is_triggered(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once shutdown is triggered (at once if it already was).
    pub fn wait(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.0.subscribe();
        async move {
            // The sender lives in `self` clones; if all are gone, shut down too.
            let _ = rx.wait_for(|triggered| *triggered).await;
        }
    }

    /// Trigger on the first SIGTERM or SIGINT; exit at once on a second one.
    pub fn on_signals(&self) {
        let shutdown = self.clone();
        tokio::spawn(async move {
            let (mut term, mut int) = match (
                signal(SignalKind::terminate()),
                signal(SignalKind::interrupt()),
            ) {
                (Ok(term), Ok(int)) => (term, int),
                (Err(e), _) | (_, Err(e)) => {
                    warn!("cannot listen for SIGTERM/SIGINT: {e}; stop the process with SIGKILL");
                    return;
                }
            };
            let name = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            };
            info!("{name} received: shutting down gracefully (send it again to exit at once)");
            shutdown.trigger();
            let name = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            };
            warn!("second {name}: exiting without waiting for requests in flight");
            std::process::exit(130);
        });
    }
}
