//! The reconciler's workload: bodies that charge a fake provider (or do
//! not) and then settle, fail for good, release, or say they cannot tell
//! (`Disposition::InDoubt`); slow holders that outlive their lease (which
//! runs out into doubt), some renewing it (`Claim::extend`); and two
//! `Reconciler`s at once whose probes ask the provider's ledger. The
//! ledger is the truth: rule 7 holds the provider, the probes, the rows
//! and every caller's answer to it.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use idem::reconcile::{Doubt, Reconciler, Verdict};
use idem::{Gate, idempotent, testing};

use super::context::Context;
use super::drive::{Run, start};
use super::faults::Faults;
use super::invoke::extending;
use super::record::{BodyLog, Recorder};
use super::target::Target;
use super::workload::{Plans, Workload};
use super::{
    ACTION, Entry, Event, Got, Guard, Invocation, Left, ProbeVerdict, RECONCILED_LEASE, identity,
};
use crate::error::ChargeError;
use crate::rng::XorShift;

/// What the reconciler's workload does.
#[derive(Debug, Clone)]
pub struct Reconciling {
    /// Callers at once.
    pub tasks: usize,
    /// Calls in all.
    pub calls: usize,
    /// Identities, called from a sliding window of `in_play`.
    pub identities: usize,
    /// Identities called at a time.
    pub in_play: usize,
    /// Percent of bodies that charge the provider.
    pub charge: u64,
    /// Percent of bodies that then say they cannot tell (in doubt).
    pub in_doubt: u64,
    /// Percent of holders that work past their lease.
    pub slow: u64,
    /// Percent of slow holders that renew their lease every half lease
    /// meanwhile (through `gate.guard(..).claim()` and `Claim::extend`).
    pub renew: u64,
    /// Percent of probes that answer unknown.
    pub unknown: u64,
    /// The second reconciler also probes pending claims older than this.
    pub pending_older_than: Option<Duration>,
    /// Stop calling this long after the start, whatever `calls` says.
    pub until: Option<Duration>,
    /// The seed of every random choice.
    pub seed: u64,
}

impl Reconciling {
    fn workload(&self) -> Workload {
        Workload {
            tasks: self.tasks,
            calls: self.calls,
            identities: self.identities,
            in_play: self.in_play,
            guards: vec![Guard::Reconciled],
            entries: vec![Entry::Attribute, Entry::Claim],
            plans: Plans::succeed_or_fail(0),
            metering: false,
            cached: 0,
            until: self.until,
            seed: self.seed,
        }
    }
}

/// What one body does.
#[derive(Debug, Clone, Copy)]
struct Charging {
    identity: usize,
    invocation: u64,
    charge: bool,
    /// After charging (or not): what it says.
    says: Says,
    work: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Says {
    /// `Ok`: only after a charge.
    Charged,
    /// In doubt: it cannot tell.
    CannotTell,
    /// Declined (kept failed), only without a charge.
    Declined,
    /// Invalid (released), only without a charge.
    Invalid,
}

impl Charging {
    async fn run(self, recorder: &Recorder, log: &BodyLog) -> Result<u64, ChargeError> {
        let _inside = log.enter();
        if self.charge {
            // The provider is asked at once: by the time a lease can run
            // out, what it holds is what it will hold.
            recorder.charge(self.identity, self.invocation);
        }
        tokio::time::sleep(self.work).await;
        let (left, output) = match self.says {
            Says::Charged => (Left::Ok(self.invocation), Ok(self.invocation)),
            Says::CannotTell => (Left::Err, Err(ChargeError::Timeout)),
            Says::Declined => (Left::Err, Err(ChargeError::Declined)),
            Says::Invalid => (Left::Err, Err(ChargeError::Invalid)),
        };
        log.leave(left);
        output
    }
}

/// The attribute's way: replay, the lease, expiry into doubt, and the
/// error's disposition.
#[idempotent(
    key = "n",
    action = "history",
    replay,
    lease = "150ms",
    on_expiry = "in_doubt",
    disposition = ChargeError::disposition
)]
async fn charge(
    gate: &Gate,
    n: u64,
    body: Charging,
    recorder: &Recorder,
    log: &BodyLog,
) -> Result<u64, ChargeError> {
    body.run(recorder, log).await
}

/// By hand: the claim, renewed while a slow body works if `renew`, then
/// settled (no value to replay) or disposed as the error says.
async fn charge_by_claim(
    gate: &Gate,
    body: Charging,
    renew: bool,
    recorder: &Recorder,
    log: &BodyLog,
) -> Result<u64, ChargeError> {
    let claim = Guard::Reconciled
        .claim(gate, &identity(body.identity), None)
        .await?;
    let output = if renew {
        extending(&claim, RECONCILED_LEASE, log, body.run(recorder, log)).await
    } else {
        body.run(recorder, log).await
    };
    match output {
        Ok(value) => claim.settle().await.map(|()| value).map_err(Into::into),
        Err(error) => {
            // The body's error is what its caller needs; the events say
            // how it was recorded.
            let _recorded = claim.dispose(error.disposition()).await;
            Err(error)
        }
    }
}

/// Runs the workload against `target` beside two reconcilers, while
/// `faults` (if any) are injected; stops the reconcilers once the callers
/// are done and the last claims in doubt had a moment to be probed.
pub async fn run_reconciling(
    target: &Target,
    reconciling: &Reconciling,
    faults: Option<&Faults>,
) -> Run {
    let mut seeds = XorShift::new(reconciling.seed);
    let guards = vec![Guard::Reconciled; reconciling.identities];
    let workload = reconciling.workload();
    let started = start(target, &workload, guards, faults, &mut seeds);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let reconcilers: Vec<_> = [None, reconciling.pending_older_than]
        .into_iter()
        .map(|older| {
            let reconciler = reconciler(&started.context, reconciling, older, seeds.next_u64());
            let mut stopped = stopped.clone();
            tokio::spawn(async move {
                reconciler
                    .run(async move {
                        let _ = stopped.wait_for(|stop| *stop).await;
                    })
                    .await;
            })
        })
        .collect();
    let callers: Vec<_> = (0..reconciling.tasks)
        .map(|task| {
            let share = reconciling.calls / reconciling.tasks
                + usize::from(task < reconciling.calls % reconciling.tasks);
            let context = started.context.clone();
            tokio::spawn(caller(
                context,
                reconciling.clone(),
                seeds.next_u64(),
                share,
            ))
        })
        .collect();
    for caller in callers {
        caller.await.expect("a caller panicked");
    }
    // A last word for the claims turned in doubt at the end.
    tokio::time::sleep(RECONCILED_LEASE * 4).await;
    let _ = stop.send(true);
    for reconciler in reconcilers {
        reconciler.await.expect("a reconciler panicked");
    }
    started.finish().await
}

/// A reconciler of the run's account, its probe reading the ledger.
fn reconciler(
    context: &Arc<Context>,
    reconciling: &Reconciling,
    pending_older_than: Option<Duration>,
    seed: u64,
) -> Reconciler {
    let rng = Arc::new(Mutex::new(XorShift::new(seed)));
    let unknown = reconciling.unknown;
    let probe_context = context.clone();
    let reconciler = Reconciler::new(context.target.gate.pool().clone())
        .account(context.target.gate.account_name())
        .batch(16)
        .interval(Duration::from_millis(20))
        .probe(ACTION, move |doubt: Doubt| {
            let (context, rng) = (probe_context.clone(), rng.clone());
            async move { probe(&context, &rng, unknown, &doubt) }
        });
    match pending_older_than {
        Some(age) => reconciler.pending_older_than(age),
        None => reconciler,
    }
}

/// What the provider's ledger says of `doubt`, recorded.
fn probe(context: &Context, rng: &Mutex<XorShift>, unknown: u64, doubt: &Doubt) -> Verdict {
    let Some(n) = doubt
        .identity
        .parts()
        .next()
        .and_then(|part| part.as_i128())
    else {
        return Verdict::Unknown;
    };
    let identity = n as usize;
    let recorder = &context.recorder;
    let roll = rng
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .below(100);
    let (verdict, recorded) = match recorder.charged(identity) {
        _ if roll < unknown => (Verdict::Unknown, ProbeVerdict::Unknown),
        Some(receipt) => (
            Verdict::succeeded_with(&receipt).expect("a number serializes"),
            ProbeVerdict::Charged(receipt),
        ),
        None if roll.is_multiple_of(2) => (Verdict::Failed, ProbeVerdict::Failed),
        None => (Verdict::NotHappened, ProbeVerdict::NotHappened),
    };
    recorder.probed(identity, recorded);
    verdict
}

async fn caller(context: Arc<Context>, reconciling: Reconciling, seed: u64, calls: usize) {
    let mut rng = XorShift::new(seed);
    for _ in 0..calls {
        if context.stopped() {
            break;
        }
        let got = call(&context, &reconciling, &mut rng).await;
        if got.reason() == Some("unavailable") || got.reason() == Some("in_doubt") {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Draws one call, makes it and records it.
async fn call(context: &Context, reconciling: &Reconciling, rng: &mut XorShift) -> Got {
    let recorder = &context.recorder;
    let n = context.draw(rng).identity;
    let id = recorder.next_id();
    let charges = rng.below(100) < reconciling.charge;
    let in_doubt = rng.below(100) < reconciling.in_doubt;
    let says = match (charges, in_doubt) {
        (_, true) => Says::CannotTell,
        (true, false) => Says::Charged,
        (false, false) if rng.below(2) == 0 => Says::Declined,
        (false, false) => Says::Invalid,
    };
    let slow = rng.below(100) < reconciling.slow;
    let work = if slow {
        RECONCILED_LEASE + Duration::from_millis(50 + rng.below(250))
    } else {
        Duration::from_micros(rng.below(3_000))
    };
    let body = Charging {
        identity: n,
        invocation: id,
        charge: charges,
        says,
        work,
    };
    // A renewing holder renews through its `Claim`; the others take
    // either way in.
    let renew = slow && rng.below(100) < reconciling.renew;
    let by_claim = renew || rng.below(2) == 0;
    let log = BodyLog::new(recorder);
    let start = recorder.now();
    let (output, events) = testing::observe(async {
        if by_claim {
            charge_by_claim(&context.target.gate, body, renew, recorder, &log).await
        } else {
            charge(&context.target.gate, n as u64, body, recorder, &log).await
        }
    })
    .await;
    let got = match output {
        Ok(value) => Got::Value(value),
        Err(ChargeError::Rejected(rejected)) => Got::refused(rejected.reason()),
        Err(_) => Got::Failed,
    };
    recorder.push(Invocation {
        id,
        identity: n,
        fingerprint: None,
        entry: if by_claim {
            Entry::Claim
        } else {
            Entry::Attribute
        },
        start,
        end: recorder.now(),
        body: log.take(),
        got: got.clone(),
        events: events.iter().map(Event::from).collect(),
    });
    got
}
