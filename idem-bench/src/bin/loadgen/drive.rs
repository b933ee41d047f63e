//! Drives a workload: `concurrency` workers issue operations back to back
//! for the warm-up and then the measured window; only operations that
//! complete inside the measured window count.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::BoxError;
use crate::cpu::{CpuClock, CpuUse};
use crate::keys;

/// One operation of a run, by identity number: the matrix's [`Workload`]
/// and River's side by side ([`crate::river`]) are driven alike.
///
/// [`Workload`]: crate::workload::Workload
pub trait Operation: Send + Sync + 'static {
    /// Runs operation number `n`; an error stops the run.
    fn run(&self, n: u64) -> impl Future<Output = Result<(), BoxError>> + Send;
}

/// The longest latency the histogram holds exactly; longer ones are
/// recorded as this (a minute would already be a broken run).
const MAX_LATENCY_MICROS: u64 = 60_000_000;

/// What one run measured.
pub struct Measurement {
    /// Operations completed inside the measured window.
    pub ops: u64,
    /// The measured window's length.
    pub window: Duration,
    /// Their latencies, in microseconds.
    pub latency: Histogram<u64>,
    /// CPU time per operation over the measured window, when asked for.
    pub cpu: Option<CpuUse>,
}

impl Measurement {
    /// Completed operations per second of the measured window.
    pub fn ops_per_second(&self) -> f64 {
        self.ops as f64 / self.window.as_secs_f64()
    }

    /// The latency at `quantile` (0.5 for the median), in milliseconds.
    pub fn latency_ms(&self, quantile: f64) -> f64 {
        self.latency.value_at_quantile(quantile) as f64 / 1000.0
    }
}

#[cfg(test)]
impl Measurement {
    /// `ops` operations in one second, a millisecond each: a run for the
    /// reports' tests.
    pub fn of_ops(ops: u64) -> Measurement {
        let mut latency = histogram().expect("the histogram's bounds");
        latency.record(1000).expect("a millisecond is in bounds");
        Measurement {
            ops,
            window: Duration::from_secs(1),
            latency,
            cpu: None,
        }
    }
}

/// Runs `workload` with `concurrency` workers: `warmup`, then `measured`,
/// reading the CPU time `clock` counts (if given) at the edges of the
/// measured window ([`Measurement::cpu`]).
pub async fn drive<W: Operation>(
    workload: Arc<W>,
    concurrency: u32,
    warmup: Duration,
    measured: Duration,
    clock: Option<CpuClock>,
) -> Result<Measurement, BoxError> {
    let start = Instant::now();
    let window = Window {
        from: start + warmup,
        to: start + warmup + measured,
    };
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..concurrency)
        .map(|_| tokio::spawn(worker(Arc::clone(&workload), window, Arc::clone(&stop))))
        .collect();
    let cpu = clock.map(|clock| {
        tokio::spawn(async move {
            tokio::time::sleep_until(window.from.into()).await;
            let before = clock.sample();
            tokio::time::sleep_until(window.to.into()).await;
            (before, clock.sample())
        })
    });
    let mut total = Measurement {
        ops: 0,
        window: measured,
        latency: histogram()?,
        cpu: None,
    };
    let mut first_error = None;
    for worker in workers {
        match worker.await? {
            Ok((ops, latency)) => {
                total.ops += ops;
                total.latency.add(&latency)?;
            }
            Err(error) => {
                first_error.get_or_insert(error);
            }
        }
    }
    if let Some(cpu) = cpu {
        let (before, after) = cpu.await?;
        total.cpu = before.per_op(&after, total.ops);
    }
    match first_error {
        Some(error) => Err(error),
        None => Ok(total),
    }
}

#[derive(Clone, Copy)]
struct Window {
    from: Instant,
    to: Instant,
}

/// One worker: operations back to back until the window closes or another
/// worker failed.
async fn worker<W: Operation>(
    workload: Arc<W>,
    window: Window,
    stop: Arc<AtomicBool>,
) -> Result<(u64, Histogram<u64>), BoxError> {
    let mut latency = histogram()?;
    let mut ops = 0;
    while !stop.load(Ordering::Relaxed) {
        let began = Instant::now();
        if began >= window.to {
            break;
        }
        if let Err(error) = workload.run(keys::next()).await {
            stop.store(true, Ordering::Relaxed);
            return Err(error);
        }
        let done = Instant::now();
        if done > window.from && done <= window.to {
            let micros = u64::try_from((done - began).as_micros()).unwrap_or(u64::MAX);
            latency.saturating_record(micros.clamp(1, MAX_LATENCY_MICROS));
            ops += 1;
        }
    }
    Ok((ops, latency))
}

/// 1 µs to a minute at three significant digits.
fn histogram() -> Result<Histogram<u64>, BoxError> {
    Ok(Histogram::new_with_bounds(1, MAX_LATENCY_MICROS, 3)?)
}
