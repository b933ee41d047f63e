//! What the tasks of a run share, and how each call is drawn from the
//! workload.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::Guard;
use super::body::Plan;
use super::invoke::Call;
use super::record::Recorder;
use super::target::Target;
use super::workload::Workload;
use crate::rng::XorShift;

/// Everything the tasks of a run share.
pub(super) struct Context {
    pub(super) target: Target,
    pub(super) recorder: Recorder,
    pub(super) workload: Workload,
    pub(super) guards: Vec<Guard>,
    pub(super) started: Instant,
    pub(super) calls_made: AtomicUsize,
    pub(super) stop: AtomicBool,
}

impl Context {
    pub(super) fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
            || self
                .workload
                .until
                .is_some_and(|until| self.started.elapsed() >= until)
    }

    /// How far the run has got, from 0 to 1, `made` calls in: in calls,
    /// or in time.
    fn progress(&self, made: usize) -> f64 {
        let workload = &self.workload;
        let called = made as f64 / workload.calls as f64;
        let elapsed = workload.until.map_or(0.0, |until| {
            self.started.elapsed().as_secs_f64() / until.as_secs_f64()
        });
        called.max(elapsed).min(1.0)
    }

    /// An identity of the window in play, for one more call.
    fn identity(&self, rng: &mut XorShift) -> usize {
        let made = self.calls_made.fetch_add(1, Ordering::Relaxed);
        let identities = self.guards.len();
        let in_play = self.workload.in_play.clamp(1, identities);
        let first = ((identities - in_play) as f64 * self.progress(made)) as usize;
        first + rng.below(in_play as u64) as usize
    }

    pub(super) fn draw(&self, rng: &mut XorShift) -> Call {
        let identity = self.identity(rng);
        let guard = self.guards[identity];
        let entries = &self.workload.entries;
        let entry = entries[rng.below(entries.len() as u64) as usize];
        let plans = self.workload.plans;
        let roll = rng.below(100);
        let plan = if roll < plans.fail {
            Plan::Fail
        } else if roll < plans.fail + plans.panic {
            Plan::Panic
        } else if roll < plans.fail + plans.panic + plans.hang {
            Plan::Hang
        } else {
            Plan::Succeed
        };
        let mut work = Duration::from_micros(rng.below(plans.work.as_micros() as u64 + 1));
        if let Some(lease) = guard.lease()
            && rng.below(100) < plans.overrun
        {
            work = lease + Duration::from_millis(10 + rng.below(200));
        }
        let cancel_after = match plan {
            Plan::Hang => Some(Duration::from_micros(rng.below(1_000))),
            _ if rng.below(100) < plans.cancel_late => {
                Some(work.mul_f64(0.5 + rng.below(100) as f64 / 100.0))
            }
            _ => None,
        };
        let fingerprint = match guard {
            Guard::Fingerprint => [None, Some(1), Some(1), Some(2)][rng.below(4) as usize],
            _ => None,
        };
        Call {
            identity,
            guard,
            fingerprint,
            entry,
            plan,
            work,
            cancel_after,
        }
    }
}
