//! This node's own resource usage, as reported to peers in `/node/ping` replies (the
//! fallback usage source for clusters without metrics-server).
//!
//! * [`ProcUsage`] reads the kernel's counters: CPU is the busy fraction of all CPUs
//!   between two reads of `/proc/stat` (`1 − Δ(idle + iowait) / Δtotal`); memory is
//!   `1 − MemAvailable / MemTotal` from `/proc/meminfo`. In a pod these files describe the
//!   whole node (procfs is not namespaced by cgroups), which is what is wanted. They are
//!   fractions of the node's capacity, whereas metrics.k8s.io usage is divided by
//!   *allocatable*; the two differ by the kubelet's reservations.
//! * [`FixedUsage`] is a value set by hand, changeable at run time (tests, the testbed,
//!   `PUT /node/usage` with `--allow-usage-override`).
//!
//! Reading `/proc` happens in [`ProcUsage::run`], on a timer, never in a ping: a ping
//! only copies the last reading.

use std::fmt;
use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use proxima_core::environment::UsageReading;
use proxima_core::Usage;
use tracing::warn;

/// Where this node's usage comes from. `current` is called on every ping: it must be
/// cheap and must not block.
pub trait UsageSource: Send + Sync + fmt::Debug {
    /// The latest usage and when it was measured; `None` while unknown.
    fn current(&self) -> Option<UsageReading>;
}

/// Whether a usage value can be believed: finite, non-negative fractions. Values above
/// 1 are possible (metrics-server usage can exceed allocatable) and kept.
pub fn is_plausible(usage: Usage) -> bool {
    let ok = |f: f64| f.is_finite() && (0.0..=1000.0).contains(&f);
    ok(usage.cpu) && ok(usage.ram)
}

/// A hand-set usage (see the module docs). `None` means unknown.
#[derive(Debug, Default)]
pub struct FixedUsage(Mutex<Option<Usage>>);

impl FixedUsage {
    /// A fixed usage of `usage` (`None`: unknown).
    pub fn new(usage: Option<Usage>) -> Self {
        Self(Mutex::new(usage))
    }

    /// Replace the usage (`None`: unknown from now on).
    pub fn set(&self, usage: Option<Usage>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = usage;
    }

    /// The usage set last.
    pub fn get(&self) -> Option<Usage> {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl UsageSource for FixedUsage {
    /// A fixed value is a statement about now: it is always fresh.
    fn current(&self) -> Option<UsageReading> {
        self.get().map(|usage| UsageReading {
            usage,
            at: Instant::now(),
        })
    }
}

/// Cumulative CPU time counters of the `cpu` line of `/proc/stat`, in clock ticks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuTimes {
    /// user + nice + system + idle + iowait + irq + softirq + steal (guest time is
    /// already counted in user).
    pub total: u64,
    /// idle + iowait.
    pub idle: u64,
}

impl CpuTimes {
    /// Busy fraction between `earlier` and `self`; `None` if no time passed.
    pub fn busy_since(&self, earlier: &CpuTimes) -> Option<f64> {
        let total = self.total.checked_sub(earlier.total)?;
        let idle = self.idle.saturating_sub(earlier.idle).min(total);
        (total > 0).then(|| (total - idle) as f64 / total as f64)
    }

    /// Busy fraction since boot.
    pub fn busy_since_boot(&self) -> Option<f64> {
        let idle = self.idle.min(self.total);
        (self.total > 0).then(|| (self.total - idle) as f64 / self.total as f64)
    }
}

/// Parse the aggregate `cpu` line of `/proc/stat`.
pub fn parse_proc_stat(text: &str) -> Option<CpuTimes> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    // Kernels since 2.6.11 have at least user..steal; older ones at least user..idle.
    if fields.len() < 4 {
        return None;
    }
    let field = |i: usize| fields.get(i).copied().unwrap_or(0);
    Some(CpuTimes {
        total: fields.iter().sum(),
        idle: field(3) + field(4),
    })
}

/// Used memory fraction from `/proc/meminfo`: `1 − MemAvailable / MemTotal` (kernels
/// without MemAvailable: free + buffers + cached stand in for it).
pub fn parse_meminfo(text: &str) -> Option<f64> {
    let field = |name: &str| -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|rest| rest.split_whitespace().next()?.parse::<f64>().ok())
    };
    let total = field("MemTotal").filter(|t| *t > 0.0)?;
    let available = field("MemAvailable").or_else(|| {
        Some(field("MemFree")? + field("Buffers").unwrap_or(0.0) + field("Cached").unwrap_or(0.0))
    })?;
    Some((1.0 - available / total).clamp(0.0, 1.0))
}

#[derive(Debug, Default)]
struct ProcState {
    last_cpu: Option<CpuTimes>,
    reading: Option<UsageReading>,
}

/// Usage read from `/proc` (see the module docs).
#[derive(Debug)]
pub struct ProcUsage {
    root: PathBuf,
    state: Mutex<ProcState>,
}

impl Default for ProcUsage {
    fn default() -> Self {
        Self::new()
    }
}

impl ProcUsage {
    /// Reads `/proc`.
    pub fn new() -> Self {
        Self::with_root("/proc")
    }

    /// Reads `<root>/stat` and `<root>/meminfo` (e.g. a host's procfs mounted elsewhere).
    pub fn with_root(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            state: Mutex::new(ProcState::default()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, ProcState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Read the counters now and keep the result as the current reading. CPU is the busy
    /// fraction since the previous call (since boot on the first call).
    pub fn sample(&self) -> io::Result<Usage> {
        let unreadable = |file: &str| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("cannot parse {}/{file}", self.root.display()),
            )
        };
        let stat = std::fs::read_to_string(self.root.join("stat"))?;
        let meminfo = std::fs::read_to_string(self.root.join("meminfo"))?;
        let cpu_times = parse_proc_stat(&stat).ok_or_else(|| unreadable("stat"))?;
        let ram = parse_meminfo(&meminfo).ok_or_else(|| unreadable("meminfo"))?;
        let mut state = self.state();
        let cpu = match state.last_cpu {
            Some(last) => cpu_times.busy_since(&last),
            None => cpu_times.busy_since_boot(),
        }
        .or(state.reading.map(|r| r.usage.cpu))
        .unwrap_or(0.0);
        let usage = Usage {
            cpu: cpu.clamp(0.0, 1.0),
            ram,
        };
        state.last_cpu = Some(cpu_times);
        state.reading = Some(UsageReading {
            usage,
            at: Instant::now(),
        });
        Ok(usage)
    }

    /// Sample every `interval` until `shutdown` resolves. A failed read is logged once
    /// (the reading then ages out and peers see no usage).
    pub async fn run(self: Arc<Self>, interval: Duration, shutdown: impl Future<Output = ()>) {
        let mut ticker = crate::ticker(interval);
        tokio::pin!(shutdown);
        let mut failing = false;
        loop {
            tokio::select! {
                () = &mut shutdown => return,
                _ = ticker.tick() => {}
            }
            match self.sample() {
                Ok(_) => failing = false,
                Err(e) if !failing => {
                    failing = true;
                    warn!("cannot read this node's usage: {e}");
                }
                Err(_) => {}
            }
        }
    }
}

impl UsageSource for ProcUsage {
    fn current(&self) -> Option<UsageReading> {
        self.state().reading
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "cpu  4705 356 584 3699 23 23 0 0 0 0\n\
cpu0 1393280 32966 572056 13343292 6130 0 17875 0 23933 0\n\
intr 1 2 3\n";

    #[test]
    fn proc_stat_counters() {
        let t = parse_proc_stat(STAT).unwrap();
        assert_eq!(t.total, 4705 + 356 + 584 + 3699 + 23 + 23);
        assert_eq!(t.idle, 3699 + 23);
        let later = CpuTimes {
            total: t.total + 100,
            idle: t.idle + 25,
        };
        assert_eq!(later.busy_since(&t), Some(0.75));
        assert_eq!(t.busy_since(&t), None, "no time passed");
        assert_eq!(t.busy_since(&later), None, "counters went back");
        assert!(parse_proc_stat("cpu0 1 2 3 4\n").is_none());
        assert!(parse_proc_stat("cpu  1 2 x 4\n").is_none());
        assert!(parse_proc_stat("cpu  1 2\n").is_none());
    }

    #[test]
    fn meminfo_used_fraction() {
        let text = "MemTotal:       16000000 kB\nMemFree:         1000000 kB\nMemAvailable:    4000000 kB\n";
        assert_eq!(parse_meminfo(text), Some(0.75));
        let old = "MemTotal: 1000 kB\nMemFree: 100 kB\nBuffers: 100 kB\nCached: 300 kB\n";
        assert_eq!(parse_meminfo(old), Some(0.5));
        assert_eq!(parse_meminfo("MemTotal: 0 kB\nMemAvailable: 0 kB\n"), None);
        assert_eq!(parse_meminfo("MemFree: 10 kB\n"), None);
    }

    #[test]
    fn proc_usage_reads_fractions_of_this_machine() {
        let proc = ProcUsage::new();
        assert!(proc.current().is_none(), "nothing read yet");
        for _ in 0..3 {
            let usage = proc.sample().expect("this machine has /proc");
            assert!((0.0..=1.0).contains(&usage.cpu), "{usage:?}");
            assert!(
                (0.0..=1.0).contains(&usage.ram) && usage.ram > 0.0,
                "{usage:?}"
            );
            // Burn a little CPU so that the next read has ticks to compare.
            let start = Instant::now();
            let mut x = 0u64;
            while start.elapsed() < Duration::from_millis(30) {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        }
        let reading = proc.current().expect("a reading after sampling");
        assert!(is_plausible(reading.usage));
    }

    #[test]
    fn proc_usage_reports_a_missing_procfs() {
        let proc = ProcUsage::with_root("/nonexistent/proc");
        assert!(proc.sample().is_err());
        assert!(proc.current().is_none());
    }

    #[test]
    fn fixed_usage_changes_at_run_time() {
        let fixed = FixedUsage::new(None);
        assert!(fixed.current().is_none());
        fixed.set(Some(Usage {
            cpu: 0.5,
            ram: 0.25,
        }));
        assert_eq!(
            fixed.current().unwrap().usage,
            Usage {
                cpu: 0.5,
                ram: 0.25
            }
        );
        fixed.set(None);
        assert!(fixed.get().is_none());
    }

    #[test]
    fn plausible_usage() {
        assert!(is_plausible(Usage { cpu: 1.2, ram: 0.0 }));
        assert!(!is_plausible(Usage {
            cpu: f64::NAN,
            ram: 0.1
        }));
        assert!(!is_plausible(Usage {
            cpu: 0.1,
            ram: -0.1
        }));
        assert!(!is_plausible(Usage {
            cpu: f64::INFINITY,
            ram: 0.1
        }));
    }
}
