//! Processing time of an emulated pod: a distribution, and the capacity it runs on.
//!
//! The papers' pods differ in how long a request takes and how many they can work on at
//! once. [`ProcessingTime`] draws the time (constant, uniform, normal truncated at zero,
//! or exponential, from a seeded generator so that a run can be repeated); [`Cpu`] is a
//! pool of cores that the pods of one emulated node share: a request holds a core for its
//! processing time and waits (first come, first served) while every core is busy, and
//! the pool keeps the busy-core time so that the node's CPU usage can be reported (RAP,
//! §4.2 of Nguyen et al., routes on it).

use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

use crate::{parse_duration, EmulateError};

/// A distribution of processing times. Every parameter is a duration, so the value can
/// be compared and written back exactly as it was given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcessingTime {
    /// Always the same time.
    Constant(Duration),
    /// Uniform in `min..=max`.
    Uniform {
        /// The shortest time drawn.
        min: Duration,
        /// The longest time drawn.
        max: Duration,
    },
    /// Normal with this mean and standard deviation; negative draws become zero.
    Normal {
        /// The mean.
        mean: Duration,
        /// The standard deviation.
        std_dev: Duration,
    },
    /// Exponential with this mean (memoryless service, as in an M/M/c queue).
    Exponential {
        /// The mean (1/λ).
        mean: Duration,
    },
}

impl Default for ProcessingTime {
    fn default() -> Self {
        ProcessingTime::Constant(Duration::ZERO)
    }
}

impl ProcessingTime {
    /// One processing time drawn from `rng`.
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> Duration {
        match *self {
            ProcessingTime::Constant(d) => d,
            ProcessingTime::Uniform { min, max } => {
                let (lo, hi) = (nanos(min.min(max)), nanos(min.max(max)));
                Duration::from_nanos(if lo == hi { lo } else { rng.gen_range(lo..=hi) })
            }
            ProcessingTime::Normal { mean, std_dev } => {
                let z = standard_normal(rng);
                secs(mean.as_secs_f64() + z * std_dev.as_secs_f64())
            }
            ProcessingTime::Exponential { mean } => {
                // 1 − U is in (0, 1], so the logarithm is finite.
                let u: f64 = 1.0 - rng.gen::<f64>();
                secs(-mean.as_secs_f64() * u.ln())
            }
        }
    }

    /// The time `percentile` percent of draws stay within (for a normal, of the
    /// untruncated distribution, at least 0).
    pub fn quantile(&self, percentile: f64) -> Duration {
        let p = (percentile / 100.0).clamp(0.0, 1.0);
        match *self {
            ProcessingTime::Constant(d) => d,
            ProcessingTime::Uniform { min, max } => {
                let (lo, hi) = (min.min(max), min.max(max));
                lo + (hi - lo).mul_f64(p)
            }
            ProcessingTime::Normal { mean, std_dev } => {
                secs(mean.as_secs_f64() + standard_normal_quantile(p) * std_dev.as_secs_f64())
            }
            ProcessingTime::Exponential { mean } => secs(-mean.as_secs_f64() * (1.0 - p).ln()),
        }
    }

    /// The mean of the distribution (for a truncated normal, the untruncated mean).
    pub fn mean(&self) -> Duration {
        match *self {
            ProcessingTime::Constant(d) => d,
            ProcessingTime::Uniform { min, max } => (min + max) / 2,
            ProcessingTime::Normal { mean, .. } | ProcessingTime::Exponential { mean } => mean,
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Seconds to a duration, clamping negative and non-finite values to zero.
fn secs(s: f64) -> Duration {
    if s.is_finite() && s > 0.0 {
        Duration::try_from_secs_f64(s).unwrap_or(Duration::MAX)
    } else {
        Duration::ZERO
    }
}

/// The `p` quantile of the standard normal distribution (Abramowitz and Stegun 26.2.23,
/// absolute error below 4.5e-4): 1.645 at 0.95, 2.326 at 0.99.
fn standard_normal_quantile(p: f64) -> f64 {
    if p <= 0.0 {
        return f64::NEG_INFINITY;
    }
    if p >= 1.0 {
        return f64::INFINITY;
    }
    let upper = |q: f64| {
        let t = (-2.0 * q.ln()).sqrt();
        t - (2.515_517 + 0.802_853 * t + 0.010_328 * t * t)
            / (1.0 + 1.432_788 * t + 0.189_269 * t * t + 0.001_308 * t * t * t)
    };
    if p < 0.5 {
        -upper(p)
    } else {
        upper(1.0 - p)
    }
}

/// A standard normal draw (Box–Muller).
fn standard_normal<R: Rng + ?Sized>(rng: &mut R) -> f64 {
    let u1: f64 = 1.0 - rng.gen::<f64>();
    let u2: f64 = rng.gen::<f64>();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

impl fmt::Display for ProcessingTime {
    /// The form [`ProcessingTime::from_str`] reads.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProcessingTime::Constant(d) => write!(f, "{d:?}"),
            ProcessingTime::Uniform { min, max } => write!(f, "uniform({min:?}, {max:?})"),
            ProcessingTime::Normal { mean, std_dev } => write!(f, "normal({mean:?}, {std_dev:?})"),
            ProcessingTime::Exponential { mean } => write!(f, "exponential({mean:?})"),
        }
    }
}

impl FromStr for ProcessingTime {
    type Err = EmulateError;

    /// `5ms` (constant), `constant(5ms)`, `uniform(2ms, 8ms)`, `normal(5ms, 1ms)`,
    /// `exponential(5ms)` (or `exp(5ms)`).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        let invalid = || EmulateError::InvalidDistribution(text.to_string());
        let Some((name, rest)) = text.split_once('(') else {
            return parse_duration(text)
                .map(ProcessingTime::Constant)
                .map_err(|_| invalid());
        };
        let args = rest.strip_suffix(')').ok_or_else(invalid)?;
        let args: Vec<Duration> = args
            .split(',')
            .map(|a| parse_duration(a.trim()))
            .collect::<Result<_, _>>()
            .map_err(|_| invalid())?;
        match (name.trim(), args.as_slice()) {
            ("constant", [d]) => Ok(ProcessingTime::Constant(*d)),
            ("uniform", [min, max]) if min <= max => Ok(ProcessingTime::Uniform {
                min: *min,
                max: *max,
            }),
            ("normal", [mean, std_dev]) => Ok(ProcessingTime::Normal {
                mean: *mean,
                std_dev: *std_dev,
            }),
            ("exponential" | "exp", [mean]) => Ok(ProcessingTime::Exponential { mean: *mean }),
            _ => Err(invalid()),
        }
    }
}

/// Cores shared by the pods of one emulated node (see the module docs). Cheap to clone;
/// clones share the cores. Two handles are equal when they share the same cores.
#[derive(Clone)]
pub struct Cpu(Arc<CpuInner>);

struct CpuInner {
    cores: usize,
    slots: Semaphore,
    busy: Mutex<BusyClock>,
}

/// The integral of busy cores over time, advanced at every change.
struct BusyClock {
    in_use: usize,
    since: Instant,
    busy: Duration,
}

impl BusyClock {
    fn advance(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.since);
        self.busy += elapsed * u32::try_from(self.in_use).unwrap_or(u32::MAX);
        self.since = now;
    }
}

impl fmt::Debug for Cpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cpu")
            .field("cores", &self.0.cores)
            .field("busy", &self.in_use())
            .finish()
    }
}

impl PartialEq for Cpu {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Cpu {}

impl Cpu {
    /// `cores` cores (at least one).
    pub fn new(cores: usize) -> Self {
        let cores = cores.max(1);
        Cpu(Arc::new(CpuInner {
            cores,
            slots: Semaphore::new(cores),
            busy: Mutex::new(BusyClock {
                in_use: 0,
                since: Instant::now(),
                busy: Duration::ZERO,
            }),
        }))
    }

    /// Its number of cores: how many requests of all its pods are processed at once.
    pub fn cores(&self) -> usize {
        self.0.cores
    }

    /// Cores busy right now.
    pub fn in_use(&self) -> usize {
        self.0.cores - self.0.slots.available_permits().min(self.0.cores)
    }

    /// Busy-core time since the pool was made (one core busy for 1 s adds 1 s). The CPU
    /// usage over an interval is the difference of two readings divided by the interval
    /// and the number of cores.
    pub fn busy_time(&self) -> Duration {
        let mut clock = self.clock();
        clock.advance(Instant::now());
        clock.busy
    }

    fn clock(&self) -> std::sync::MutexGuard<'_, BusyClock> {
        self.0.busy.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wait for a free core and hold it until the guard is dropped.
    pub(crate) async fn acquire(&self) -> CoreGuard<'_> {
        // The semaphore is never closed, so acquiring only waits.
        let permit = self.0.slots.acquire().await.ok();
        let mut clock = self.clock();
        clock.advance(Instant::now());
        clock.in_use += 1;
        CoreGuard {
            cpu: self,
            _permit: permit,
        }
    }
}

/// A core held by one request.
pub(crate) struct CoreGuard<'a> {
    cpu: &'a Cpu,
    _permit: Option<SemaphorePermit<'a>>,
}

impl Drop for CoreGuard<'_> {
    fn drop(&mut self) {
        let mut clock = self.cpu.clock();
        clock.advance(Instant::now());
        clock.in_use = clock.in_use.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    use super::*;

    #[test]
    fn quantiles_of_each_distribution() {
        let ms = Duration::from_millis;
        let close = |a: Duration, b: Duration| (a.as_secs_f64() - b.as_secs_f64()).abs() < 2e-5;
        assert_eq!(ProcessingTime::Constant(ms(5)).quantile(99.0), ms(5));
        let uniform = ProcessingTime::Uniform {
            min: ms(2),
            max: ms(12),
        };
        assert!(close(uniform.quantile(90.0), ms(11)));
        let normal = ProcessingTime::Normal {
            mean: ms(10),
            std_dev: ms(1),
        };
        assert!(close(normal.quantile(95.0), Duration::from_micros(11_645)));
        assert!(close(normal.quantile(50.0), ms(10)));
        assert!(close(normal.quantile(99.0), Duration::from_micros(12_326)));
        let exponential = ProcessingTime::Exponential { mean: ms(10) };
        assert!(close(
            exponential.quantile(50.0),
            Duration::from_micros(6_931)
        ));
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn parses_and_prints_every_form() {
        for (text, expected) in [
            ("5ms", ProcessingTime::Constant(ms(5))),
            ("constant(5ms)", ProcessingTime::Constant(ms(5))),
            (
                "uniform(2ms, 8ms)",
                ProcessingTime::Uniform {
                    min: ms(2),
                    max: ms(8),
                },
            ),
            (
                "normal(5ms,1ms)",
                ProcessingTime::Normal {
                    mean: ms(5),
                    std_dev: ms(1),
                },
            ),
            ("exp(4ms)", ProcessingTime::Exponential { mean: ms(4) }),
            (
                "exponential(4ms)",
                ProcessingTime::Exponential { mean: ms(4) },
            ),
        ] {
            let parsed: ProcessingTime = text.parse().unwrap();
            assert_eq!(parsed, expected, "{text}");
            assert_eq!(
                parsed.to_string().parse::<ProcessingTime>().unwrap(),
                parsed
            );
        }
        for bad in [
            "",
            "5",
            "uniform(8ms, 2ms)",
            "normal(5ms)",
            "gamma(1ms)",
            "exp(1ms",
        ] {
            assert!(bad.parse::<ProcessingTime>().is_err(), "{bad}");
        }
    }

    /// Mean and spread of `n` draws, in ms.
    fn moments(d: ProcessingTime, n: usize) -> (f64, f64, f64) {
        let mut rng = SmallRng::seed_from_u64(42);
        let draws: Vec<f64> = (0..n)
            .map(|_| d.sample(&mut rng).as_secs_f64() * 1e3)
            .collect();
        let mean = draws.iter().sum::<f64>() / n as f64;
        let var = draws.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        let min = draws.iter().copied().fold(f64::INFINITY, f64::min);
        (mean, var.sqrt(), min)
    }

    #[test]
    fn draws_follow_the_distribution() {
        let n = 20_000;
        let (mean, sd, _) = moments(ProcessingTime::Constant(ms(3)), 100);
        assert_eq!((mean, sd), (3.0, 0.0));
        let (mean, sd, min) = moments(
            ProcessingTime::Uniform {
                min: ms(2),
                max: ms(8),
            },
            n,
        );
        assert!((mean - 5.0).abs() < 0.1 && (sd - 6.0 / 12f64.sqrt()).abs() < 0.1 && min >= 2.0);
        let (mean, sd, _) = moments(
            ProcessingTime::Normal {
                mean: ms(20),
                std_dev: ms(2),
            },
            n,
        );
        assert!(
            (mean - 20.0).abs() < 0.1 && (sd - 2.0).abs() < 0.1,
            "{mean} {sd}"
        );
        let (mean, sd, min) = moments(ProcessingTime::Exponential { mean: ms(5) }, n);
        assert!(
            (mean - 5.0).abs() < 0.2 && (sd - 5.0).abs() < 0.3 && min >= 0.0,
            "{mean} {sd}"
        );
        // Truncation: a normal around zero never goes negative.
        let (_, _, min) = moments(
            ProcessingTime::Normal {
                mean: ms(0),
                std_dev: ms(5),
            },
            n,
        );
        assert!(min >= 0.0);
    }

    #[test]
    fn the_same_seed_gives_the_same_draws() {
        let d = ProcessingTime::Exponential { mean: ms(5) };
        let draw = |seed| {
            let mut rng = SmallRng::seed_from_u64(seed);
            (0..10).map(|_| d.sample(&mut rng)).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
    }

    #[tokio::test(start_paused = true)]
    async fn cores_are_shared_and_busy_time_is_integrated() {
        let cpu = Cpu::new(2);
        assert_eq!(cpu.clone(), cpu);
        assert_ne!(Cpu::new(2), cpu);
        let a = cpu.acquire().await;
        let b = cpu.acquire().await;
        assert_eq!(cpu.in_use(), 2);
        // A third request waits for a core.
        let waiting = tokio::time::timeout(ms(10), cpu.acquire()).await;
        assert!(waiting.is_err());
        tokio::time::advance(ms(90)).await;
        drop(a);
        assert_eq!(cpu.in_use(), 1);
        tokio::time::advance(ms(100)).await;
        drop(b);
        // Two cores for 100 ms, then one for 100 ms.
        assert_eq!(cpu.busy_time(), ms(300));
        assert_eq!(cpu.in_use(), 0);
    }
}
