//! What is recorded while a workload runs: the [`Recorder`] every task
//! shares, and the log each body keeps of itself.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use super::{
    BodyRun, Charge, Extension, Fault, FaultKind, Guard, History, Invocation, Keys, Left,
    MeterAttempt, Metered, Micros, ProbeVerdict, Probed, StepRan, receipt,
};

/// Records a history as it happens. Shared by every task of a run.
pub struct Recorder {
    epoch: Instant,
    next_id: AtomicU64,
    invocations: Mutex<Vec<Invocation>>,
    faults: Mutex<Vec<Fault>>,
    metering: Mutex<Metering>,
    ledger: Mutex<Ledger>,
}

/// The fake provider's charges, and what probes said of them.
#[derive(Default, Clone)]
struct Ledger {
    charges: Vec<Charge>,
    probes: Vec<Probed>,
}

/// The batches metered, and every attempt to record one.
#[derive(Default, Clone)]
struct Metering {
    batches: Vec<Vec<Metered>>,
    attempts: Vec<MeterAttempt>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Recorder {
    /// An empty history, its clock starting now.
    pub fn new() -> Recorder {
        Recorder {
            epoch: Instant::now(),
            next_id: AtomicU64::new(0),
            invocations: Mutex::new(Vec::new()),
            faults: Mutex::new(Vec::new()),
            metering: Mutex::new(Metering::default()),
            ledger: Mutex::new(Ledger::default()),
        }
    }

    /// The history's clock now.
    pub fn now(&self) -> Micros {
        self.at(Instant::now())
    }

    /// `instant` on the history's clock.
    pub fn at(&self, instant: Instant) -> Micros {
        instant.saturating_duration_since(self.epoch).as_micros() as Micros
    }

    /// Records a fault.
    pub fn fault(&self, kind: FaultKind, start: Micros, end: Micros) {
        lock(&self.faults).push(Fault { kind, start, end });
    }

    /// A fresh invocation id.
    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Records a finished invocation.
    pub fn push(&self, invocation: Invocation) {
        lock(&self.invocations).push(invocation);
    }

    /// The fake provider: charges `identity` for `invocation`, unless the
    /// provider holds a charge of it already (a real provider with an
    /// idempotency key would refuse the second); either way the request is
    /// in the ledger. Returns the charge's receipt, or `None` for a charge
    /// refused as a second one.
    pub fn charge(&self, identity: usize, invocation: u64) -> Option<u64> {
        let at = self.now();
        let mut ledger = lock(&self.ledger);
        let first = !ledger.charges.iter().any(|c| c.identity == identity);
        ledger.charges.push(Charge {
            identity,
            invocation,
            at,
        });
        first.then(|| receipt(invocation))
    }

    /// What the provider's ledger says of `identity` now, as a probe reads
    /// it: the first charge's receipt, if any.
    pub fn charged(&self, identity: usize) -> Option<u64> {
        let ledger = lock(&self.ledger);
        let first = ledger.charges.iter().find(|c| c.identity == identity);
        first.map(|charge| receipt(charge.invocation))
    }

    /// Records a probe's answer.
    pub fn probed(&self, identity: usize, verdict: ProbeVerdict) {
        let at = self.now();
        lock(&self.ledger).probes.push(Probed {
            identity,
            at,
            verdict,
        });
    }

    /// A new batch of `events`; its number.
    pub(super) fn batch(&self, events: Vec<Metered>) -> usize {
        let batches = &mut lock(&self.metering).batches;
        batches.push(events);
        batches.len() - 1
    }

    pub(super) fn batch_events(&self, batch: usize) -> Vec<Metered> {
        lock(&self.metering).batches[batch].clone()
    }

    pub(super) fn attempt(&self, attempt: MeterAttempt) {
        lock(&self.metering).attempts.push(attempt);
    }

    /// The history so far, of identities guarded by `guards`.
    pub fn history(&self, guards: Vec<Guard>) -> History {
        let mut invocations = lock(&self.invocations).clone();
        invocations.sort_by_key(|invocation| invocation.id);
        let mut faults = lock(&self.faults).clone();
        faults.sort_by_key(|fault| fault.start);
        let Metering { batches, attempts } = lock(&self.metering).clone();
        let Ledger { charges, probes } = lock(&self.ledger).clone();
        History {
            guards,
            invocations,
            faults,
            batches,
            attempts,
            keys: Keys::Numbers,
            charges,
            probes,
        }
    }
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder::new()
    }
}

/// What a body writes about itself; shared by the body and its invocation.
pub struct BodyLog {
    epoch: Instant,
    run: Mutex<Option<BodyRun>>,
    /// Still running: not returned, panicked or dropped yet.
    open: AtomicBool,
    pub(super) entered: tokio::sync::Notify,
}

impl BodyLog {
    /// A body not entered yet, on `recorder`'s clock.
    pub fn new(recorder: &Recorder) -> Arc<BodyLog> {
        Arc::new(BodyLog {
            epoch: recorder.epoch,
            run: Mutex::new(None),
            open: AtomicBool::new(false),
            entered: tokio::sync::Notify::new(),
        })
    }

    pub(super) fn now(&self) -> Micros {
        self.epoch.elapsed().as_micros() as Micros
    }

    /// The body is entered now; hold what this returns to its end (dropped
    /// unfinished, it records a cancellation or a panic).
    pub fn enter(&self) -> Inside<'_> {
        let start = self.now();
        *lock(&self.run) = Some(BodyRun {
            start,
            end: start,
            left: Left::Cancelled,
            extensions: Vec::new(),
            steps: Vec::new(),
        });
        self.open.store(true, Ordering::SeqCst);
        self.entered.notify_one();
        Inside { log: self }
    }

    /// The body left, as `left` says.
    pub fn leave(&self, left: Left) {
        if self.open.swap(false, Ordering::SeqCst)
            && let Some(run) = lock(&self.run).as_mut()
        {
            run.end = self.now();
            run.left = left;
        }
    }

    pub(super) fn extension(&self, extension: Extension) {
        if let Some(run) = lock(&self.run).as_mut() {
            run.extensions.push(extension);
        }
    }

    /// The future of the step `name` begins to run now.
    pub(super) fn step(&self, name: &'static str, repeatable: bool) {
        let at = self.now();
        if let Some(run) = lock(&self.run).as_mut() {
            run.steps.push(StepRan {
                name,
                repeatable,
                at,
            });
        }
    }

    /// Its run, if it was entered (taken: a second call gets `None`).
    pub fn take(&self) -> Option<BodyRun> {
        lock(&self.run).take()
    }

    /// Entered and not left yet.
    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::SeqCst)
    }
}

/// A body between entry and exit: if it is dropped unfinished, it was
/// cancelled, or it panicked.
pub struct Inside<'a> {
    log: &'a BodyLog,
}

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        let left = if std::thread::panicking() {
            Left::Panicked
        } else {
            Left::Cancelled
        };
        self.log.leave(left);
    }
}
