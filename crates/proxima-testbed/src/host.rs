//! How busy the host was during a run, so that a result the machine itself spoiled is
//! marked as such rather than taken for the strategy's.
//!
//! The testbed runs every node, instance and client in one process, so when the machine
//! is loaded (a compile, other tests) the runtime itself falls behind and every response
//! time grows. While a run goes, a task asks the runtime to wake it every millisecond
//! and records how late each wake-up came (its **scheduling lag**: on an idle machine
//! about a millisecond, tokio's timer granularity), and the host's 1-minute load average
//! (`/proc/loadavg`) is read every second. A run whose 99th percentile lag exceeds
//! [`NOISY_LAG_P99`] is marked **noisy**: its numbers say as much about the host as
//! about the strategy.

use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A run whose p99 scheduling lag is above this is noisy.
pub const NOISY_LAG_P99: Duration = Duration::from_millis(5);

/// What the host did during a run.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct HostReport {
    /// How late the runtime woke a 1 ms ticker, median, ms.
    pub lag_p50_ms: f64,
    /// The same lateness at the 99th percentile, ms (what [`NOISY_LAG_P99`] judges).
    pub lag_p99_ms: f64,
    /// The largest lateness seen, ms.
    pub lag_max_ms: f64,
    /// Wake-ups measured.
    pub lag_samples: u64,
    /// The host's 1-minute load average when the run started (`None`: unknown).
    pub load_start: Option<f64>,
    /// The highest 1-minute load average seen during the run.
    pub load_max: Option<f64>,
    /// Cores the process may use.
    pub cpus: usize,
    /// p99 lag above the threshold ([`NOISY_LAG_P99`]).
    pub noisy: bool,
}

impl HostReport {
    /// One line for the table.
    pub fn brief(&self) -> String {
        format!(
            "{} lag p99 {:.1} ms, load {} on {} cpus",
            if self.noisy { "NOISY" } else { "ok" },
            self.lag_p99_ms,
            self.load_max.map_or("?".to_string(), |l| format!("{l:.2}")),
            self.cpus
        )
    }
}

/// The host's 1-minute load average, where the system says it.
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Samples the host until [`HostSampler::finish`].
pub struct HostSampler {
    stop: watch::Sender<bool>,
    task: JoinHandle<(Vec<Duration>, Vec<f64>)>,
    load_start: Option<f64>,
}

impl HostSampler {
    /// Start sampling: a 1 ms ticker's lateness, and the load average once a second.
    pub fn start() -> Self {
        let (stop, mut stopped) = watch::channel(false);
        let load_start = load_average();
        let task = tokio::spawn(async move {
            let mut lags = Vec::new();
            let mut loads: Vec<f64> = load_average().into_iter().collect();
            let mut tick = tokio::time::interval(Duration::from_millis(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut last_load = Instant::now();
            loop {
                tokio::select! {
                    due = tick.tick() => {
                        let now = tokio::time::Instant::now();
                        lags.push(now.saturating_duration_since(due));
                    }
                    _ = stopped.wait_for(|s| *s) => break,
                }
                if last_load.elapsed() >= Duration::from_secs(1) {
                    last_load = Instant::now();
                    loads.extend(load_average());
                }
            }
            (lags, loads)
        });
        HostSampler {
            stop,
            task,
            load_start,
        }
    }

    /// Stop sampling and summarise what was measured.
    pub async fn finish(self) -> HostReport {
        let _ = self.stop.send(true);
        let (lags, loads) = self.task.await.unwrap_or_default();
        summarise(lags, loads, self.load_start)
    }
}

/// The report of `lags` and `loads` (see [`HostReport`]).
pub fn summarise(mut lags: Vec<Duration>, loads: Vec<f64>, load_start: Option<f64>) -> HostReport {
    lags.sort();
    // The first wake-up comes at once; the rest are the ones that were waited for.
    let at = |p: f64| -> Duration {
        if lags.is_empty() {
            return Duration::ZERO;
        }
        let rank = ((p / 100.0) * lags.len() as f64).ceil() as usize;
        lags[rank.clamp(1, lags.len()) - 1]
    };
    let ms = |d: Duration| (d.as_secs_f64() * 1e4).round() / 10.0;
    let p99 = at(99.0);
    HostReport {
        lag_p50_ms: ms(at(50.0)),
        lag_p99_ms: ms(p99),
        lag_max_ms: ms(lags.last().copied().unwrap_or_default()),
        lag_samples: lags.len() as u64,
        load_start,
        load_max: loads.iter().copied().reduce(f64::max).or(load_start),
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        noisy: p99 > NOISY_LAG_P99,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_whose_runtime_fell_behind_is_noisy() {
        let quiet: Vec<Duration> = (0..1000).map(|_| Duration::from_micros(900)).collect();
        let q = summarise(quiet, vec![0.5, 0.7], Some(0.5));
        assert!(!q.noisy);
        assert_eq!(q.lag_p99_ms, 0.9);
        assert_eq!(q.load_max, Some(0.7));
        let mut busy: Vec<Duration> = (0..1000).map(|_| Duration::from_micros(900)).collect();
        for lag in busy.iter_mut().take(20) {
            *lag = Duration::from_millis(30);
        }
        let b = summarise(busy, vec![], Some(3.0));
        assert!(b.noisy);
        assert_eq!(b.lag_max_ms, 30.0);
        assert_eq!(b.load_max, Some(3.0));
        assert!(b.brief().starts_with("NOISY"));
    }

    #[tokio::test]
    async fn the_sampler_measures_while_the_run_goes() {
        let sampler = HostSampler::start();
        tokio::time::sleep(Duration::from_millis(30)).await;
        let report = sampler.finish().await;
        assert!(report.lag_samples > 0);
        assert!(report.cpus >= 1);
    }
}
