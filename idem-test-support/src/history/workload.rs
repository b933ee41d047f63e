//! What a run does: the [`Workload`], and the odds of its bodies' [`Plans`].

use std::time::Duration;

use super::{Entry, Guard};

/// The odds of a call's plan, in percent; the rest succeed.
#[derive(Debug, Clone, Copy)]
pub struct Plans {
    /// Bodies that return `Err`.
    pub fail: u64,
    /// Bodies that panic.
    pub panic: u64,
    /// Bodies that never return, dropped mid-body.
    pub hang: u64,
    /// Calls dropped around the time their body returns: mid-body, or
    /// while the gate records the outcome.
    pub cancel_late: u64,
    /// Leased bodies that work past their lease.
    pub overrun: u64,
    /// Longest ordinary work of a body.
    pub work: Duration,
}

/// What a run does: who calls what, how often, and how bodies behave.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Callers at once.
    pub tasks: usize,
    /// Calls in all.
    pub calls: usize,
    /// Identities called.
    pub identities: usize,
    /// How many identities are called at a time: a window that slides over
    /// all of them as the run goes, so that each meets a burst of
    /// concurrent duplicates. `identities` calls them all at random.
    pub in_play: usize,
    /// Each identity's guard is drawn from these.
    pub guards: Vec<Guard>,
    /// Each call's entry is drawn from these.
    pub entries: Vec<Entry>,
    /// How bodies behave.
    pub plans: Plans,
    /// A task that meters batches (and re-sends them) alongside.
    pub metering: bool,
    /// Percent of calls made through the target's cached gate (when it has
    /// one), the rest through the uncached one: the same keys through both.
    pub cached: u64,
    /// Stop calling this long after the start, whatever `calls` says.
    pub until: Option<Duration>,
    /// The seed of every random choice: the same seed, the same run.
    pub seed: u64,
}

impl Plans {
    /// Bodies that succeed, or fail `fail` percent of the time, after up to
    /// 3 ms of work; none panics, hangs or is cancelled.
    pub fn succeed_or_fail(fail: u64) -> Plans {
        Plans {
            fail,
            panic: 0,
            hang: 0,
            cancel_late: 0,
            overrun: 0,
            work: Duration::from_millis(3),
        }
    }
}

impl Workload {
    /// The plain gate through `Gate::run`, every identity called at random,
    /// bodies as `plans` says.
    pub fn plain(
        tasks: usize,
        calls: usize,
        identities: usize,
        plans: Plans,
        seed: u64,
    ) -> Workload {
        Workload {
            tasks,
            calls,
            identities,
            in_play: identities,
            guards: vec![Guard::Plain],
            entries: vec![Entry::Run],
            plans,
            metering: false,
            cached: 0,
            until: None,
            seed,
        }
    }
}

/// A count from the environment variable `variable` (to size a long run),
/// else `default`.
pub fn count_from_env(variable: &str, default: usize) -> usize {
    std::env::var(variable).map_or(default, |text| {
        text.parse()
            .unwrap_or_else(|e| panic!("{variable}={text} is not a count: {e}"))
    })
}
