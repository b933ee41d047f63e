//! One history of what happened and one checker of what was promised, for
//! every randomized test of the gate: the soak, the fault tests and the
//! history test.
//!
//! While a workload runs, every invocation is recorded: when it started and
//! ended, whether its body was entered and how it left, what its caller got,
//! and what the gate reported inside it ([`idem::testing::observe`]); so is
//! every fault injected. Afterwards the final rows of `idem_records` are
//! read, and [`check()`] holds the history to the gate's promises offline, as
//! Jepsen's and Elle's checkers do: pure functions over data, so a unit test
//! can feed them a hand-made bad history and watch each rule fail.
//!
//! The rules; every anomaly names its rule, the identity and an excerpt:
//!
//! 1. **Exclusive.** No two bodies of one identity run at once, unless one
//!    ran ungated or the earlier one's lease could have run out before the
//!    later one claimed (and no takeover happens sooner than that); no body
//!    starts after a success of its identity was recorded.
//! 2. **Kept.** At most one `success` row per identity, and only after a
//!    body succeeded; every body that returned `Ok` is settled, or its
//!    caller or its events say it was not (never silently lost); a stale
//!    holder's success is kept in the slot.
//! 3. **Done means done.** No body starts after a caller of its identity
//!    was told `AlreadyDone` or handed a replayed value.
//! 4. **True answers.** Every refusal names a true reason, every value is
//!    the caller's own body's or a replay of a matching success, every
//!    message says what to do, and only an outage fails open.
//! 5. **Final rows.** A row stays `pending` only where a holder's outcome is
//!    unknown (cancelled, panicked, its connection lost, its asynchronous
//!    outcome lost in a crash); no claim is in any other state than
//!    `pending` or `success`, and every row belongs to an identity.
//! 6. **Metering.** Every event of an acknowledged batch is stored exactly
//!    once with its quantity, and reported inserted at most once.
//! 7. **Ledger** (identities of [`Guard::Reconciled`], instead of rules 1
//!    to 5). The fake provider charged each key at most once; no body
//!    beside a live (renewed) lease; every probe's verdict, the final row
//!    and every answer agree with the ledger; the callers of a key were
//!    told one story.
//! 8. **Detached.** A request through the tower layer whose client went
//!    away still runs to completion: its handler is never cancelled.
//! 9. **Steps** (identities of [`Guard::Stepped`], with rules 1 to 3
//!    instead of 1 to 5). No step of an identity that is not declared
//!    repeatable runs twice, in gated bodies: not after a release, a
//!    takeover, a holder cut off inside it, or a reply lost.
//! 10. **Ordered** (identities of [`Guard::Ordered`], with rules 1 to 3 and
//!     5 instead of 1 to 5). No two bodies of one entity run at once; no
//!     body runs after an event of its entity with a newer order was
//!     settled; every event refused `superseded` is older than an event of
//!     its entity whose body succeeded before the refusal.
//!
//! Where a fault makes the truth unknowable the checker gives the benefit
//! of the doubt, and only there: a claim refused as unavailable (or run
//! ungated, failing open) may have committed, so it may hold the slot; a
//! holder cancelled, panicked or unable to record its outcome holds it
//! until its lease runs out (forever without a lease); an asynchronous
//! outcome recorded before a crash may be lost; an outage may be reported
//! up to the checker's `OUTAGE_GRACE` after its fault.
//!
//! The parts, in the order a run uses them: `record` (the recorder), `body`
//! and `invoke` (one call through each entry point), `target`, `workload`,
//! `context` and `drive` (the run), `faults` (the injector), `meter` (the
//! metering task) and `final_state`; then `check` (a module per rule) and
//! `figures`. `handmade` builds histories for the checker's unit tests.
//! The surfaces' workloads: `batch` (consumers of `gate.guard_batch`),
//! `reconcile` (bodies in doubt, slow holders, two reconcilers over a fake
//! provider); the tower layer's lives in `tests/testsuite/history/layer.rs` (its
//! server needs features this crate does not enable) and drives a run
//! through [`run_outside`]; a cached gate is the caller's to make
//! ([`Target::beside`]).

mod batch;
mod body;
mod check;
mod context;
mod drive;
mod faults;
mod figures;
mod final_state;
mod handmade;
mod invoke;
mod meter;
mod reconcile;
mod record;
mod target;
mod workload;

// The public API, at the paths the tests use: `history::run`,
// `history::Target`...
pub use self::{
    batch::{Batches, run_batches},
    body::{Body, Plan},
    check::{Anomaly, Rule, check},
    drive::{Run, Session, assert_recovers, run, run_outside},
    faults::{Faults, Inject},
    figures::{Figures, assert_no_anomalies},
    reconcile::{Reconciling, run_reconciling},
    record::{BodyLog, Inside, Recorder},
    target::Target,
    workload::{Plans, Workload, count_from_env},
};

use std::time::Duration;

use idem::Identity;
use idem::testing::GateEvent;

use crate::fault_proxy::Statement;

// ===================================================================== model

/// Microseconds since the history began, on one monotonic clock.
pub type Micros = u64;

/// The action every identity of a history belongs to; an identity is
/// `(ACTION, n)`, and each run has an account of its own.
pub const ACTION: &str = "history";

/// The lease of identities guarded by a short lease: shorter than most
/// bodies' work, so takeovers happen.
pub const SHORT_LEASE: Duration = Duration::from_millis(80);
/// The lease of identities guarded by a long lease: longer than most
/// bodies' work.
pub const LONG_LEASE: Duration = Duration::from_millis(250);
/// The lease of the reconciler's workload: slow holders outlive it, and
/// their claims turn in doubt unless they renew it.
pub const RECONCILED_LEASE: Duration = Duration::from_millis(150);
/// How long a waiting duplicate waits for the holder's outcome.
pub const WAIT: Duration = Duration::from_millis(300);

/// How an identity is guarded: every invocation of it uses this mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guard {
    /// The plain gate.
    Plain,
    /// `replay`: duplicates get the stored value.
    Replay,
    /// Replay, and a payload fingerprint: callers carry payload 1 or 2, or
    /// none at all.
    Fingerprint,
    /// A lease of this length.
    Lease(Duration),
    /// `wait`: a duplicate waits for the holder's outcome.
    Wait,
    /// Claim and settle inside the caller's transaction; the body's effect
    /// is a row it writes there.
    Tx,
    /// `outcome_commit = "async"`.
    AsyncOutcome,
    /// `on_unavailable = "run"`: an outage runs the body ungated.
    FailOpen,
    /// The reconciler's workload: replay, a lease of [`RECONCILED_LEASE`]
    /// that runs out into doubt (`on_expiry = "in_doubt"`), failures held
    /// in doubt, kept or released as the body says; its bodies charge a
    /// fake provider, and rule 7 (the ledger) judges it instead of rules 1
    /// to 5, which know nothing of dispositions.
    Reconciled,
    /// Steps inside one claim, under [`SHORT_LEASE`] (taken over): each
    /// body runs the step `reserve` (not repeatable; a hanging body hangs
    /// inside it) and then `notify` (repeatable), each logging that its
    /// future ran. Rule 9 judges it with rules 1 to 3; rules 4 and 5 know
    /// nothing of a claim a step in doubt holds.
    Stepped,
    /// Ordered events (`Guard::ordered`): identity `n` is an event of the
    /// entity [`entity_of`]`(n)`, at the order [`order_of`]`(n)`, with
    /// the other ordered identities of its group of [`EVENTS_PER_ENTITY`].
    /// Rule 10 judges the entity; rule 4 does not, since an event is also
    /// refused in flight while another event of its entity runs.
    Ordered,
}

impl Guard {
    /// Every guard, each lease length once.
    pub const EVERY: [Guard; 11] = [
        Guard::Plain,
        Guard::Replay,
        Guard::Fingerprint,
        Guard::Lease(SHORT_LEASE),
        Guard::Lease(LONG_LEASE),
        Guard::Wait,
        Guard::Tx,
        Guard::AsyncOutcome,
        Guard::FailOpen,
        Guard::Stepped,
        Guard::Ordered,
    ];

    /// Its name in figures and anomalies.
    pub fn name(self) -> &'static str {
        match self {
            Guard::Plain => "plain",
            Guard::Replay => "replay",
            Guard::Fingerprint => "fingerprint",
            Guard::Lease(_) => "lease",
            Guard::Wait => "wait",
            Guard::Tx => "tx",
            Guard::AsyncOutcome => "async",
            Guard::FailOpen => "fail_open",
            Guard::Reconciled => "reconciled",
            Guard::Stepped => "stepped",
            Guard::Ordered => "ordered",
        }
    }

    /// Its lease, if it has one.
    pub fn lease(self) -> Option<Duration> {
        match self {
            Guard::Lease(lease) => Some(lease),
            Guard::Reconciled => Some(RECONCILED_LEASE),
            Guard::Stepped => Some(SHORT_LEASE),
            _ => None,
        }
    }

    fn replays(self) -> bool {
        matches!(self, Guard::Replay | Guard::Fingerprint | Guard::Reconciled)
    }
}

/// How an invocation reaches the gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// An `#[idempotent]` function.
    Attribute,
    /// `gate.guard(..)` with the identity's options, then `.run(body)`.
    Run,
    /// `gate.guard(..)` with its options (or `.tx(..)`), then `.claim()`,
    /// then `settle` or `release`, with `Claim::extend` under a lease.
    Claim,
    /// One item of `gate.guard_batch(..).run(..)` (or with `.replay()`): its start
    /// and end are the batch's, and its events are what its answer shows
    /// (see `history::batch`).
    Batch,
    /// One HTTP request through the tower layer, by a real client; its body
    /// is the handler's run, its events what the response shows (see
    /// `history::http`).
    Http,
}

/// One invocation: a call of the guarded action, from start to end.
#[derive(Debug, Clone)]
pub struct Invocation {
    /// Unique in the history; a successful body returns it as its value.
    pub id: u64,
    /// The identity's number.
    pub identity: usize,
    /// The payload it carried, for a fingerprinted identity.
    pub fingerprint: Option<u8>,
    /// How it reached the gate.
    pub entry: Entry,
    /// When the caller called.
    pub start: Micros,
    /// When the caller got its answer.
    pub end: Micros,
    /// Present when the body was entered.
    pub body: Option<BodyRun>,
    /// What the caller got.
    pub got: Got,
    /// What the gate reported inside the invocation, in order.
    pub events: Vec<Event>,
}

/// A body that was entered.
#[derive(Debug, Clone)]
pub struct BodyRun {
    /// When it was entered.
    pub start: Micros,
    /// When it returned, panicked or was dropped.
    pub end: Micros,
    /// How it left.
    pub left: Left,
    /// Lease renewals made while it ran.
    pub extensions: Vec<Extension>,
    /// The steps whose future ran in it, in order.
    pub steps: Vec<StepRan>,
}

/// A step's future began to run (`idem::step`): its effect may happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepRan {
    /// The step's name.
    pub name: &'static str,
    /// Declared `.repeatable()`.
    pub repeatable: bool,
    /// When its future began.
    pub at: Micros,
}

/// A `Claim::extend` call.
#[derive(Debug, Clone, Copy)]
pub struct Extension {
    /// When it was called.
    pub start: Micros,
    /// When it returned.
    pub end: Micros,
    /// It returned `Ok`: the lease was renewed.
    pub renewed: bool,
}

/// How a body left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Left {
    /// Returned `Ok` with this value.
    Ok(u64),
    /// Returned `Err`.
    Err,
    /// Panicked.
    Panicked,
    /// Dropped before it returned (its caller gave up on it).
    Cancelled,
}

/// What the caller got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Got {
    /// `Ok`: the body's value, or a replayed one.
    Value(u64),
    /// The body's own error.
    Failed,
    /// An [`idem::Rejected`], by [`idem::Rejected::reason`].
    Refused {
        /// [`idem::Rejected::reason`].
        reason: &'static str,
        /// Its message says that the body did not run (or that the side
        /// effect needs checking) and what to do.
        says_what_to_do: bool,
    },
    /// A database error outside the gate (a transaction that could not
    /// begin or commit).
    StoreError,
    /// The invocation panicked (its body did).
    Panicked,
    /// The invocation was dropped before it answered.
    Cancelled,
}

impl Got {
    /// A refusal whose message says what to do.
    pub fn refused(reason: &'static str) -> Got {
        Got::Refused {
            reason,
            says_what_to_do: true,
        }
    }

    fn reason(&self) -> Option<&'static str> {
        match self {
            Got::Refused { reason, .. } => Some(reason),
            _ => None,
        }
    }
}

/// A [`GateEvent`], with refusals by their reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// [`GateEvent::Won`].
    Won,
    /// [`GateEvent::TookOver`].
    TookOver,
    /// [`GateEvent::Refused`], by reason.
    Refused(&'static str),
    /// [`GateEvent::Ungated`].
    Ungated,
    /// [`GateEvent::Replayed`].
    Replayed,
    /// [`GateEvent::Retried`].
    Retried,
    /// [`GateEvent::Settled`].
    Settled,
    /// [`GateEvent::Released`].
    Released,
    /// [`GateEvent::Unrecorded`], by reason.
    Unrecorded(&'static str),
    /// [`GateEvent::Kept`]: a definite failure was kept.
    Kept,
    /// [`GateEvent::InDoubt`]: the slot is held in doubt.
    InDoubt,
    /// Not the gate's: the caller went away (a client disconnected) after
    /// its request may have reached the gate, so its claim may stand, as a
    /// claim refused as unavailable may.
    Abandoned,
    /// One this checker does not know.
    Other(String),
}

impl From<&GateEvent> for Event {
    fn from(event: &GateEvent) -> Event {
        match event {
            GateEvent::Won => Event::Won,
            GateEvent::TookOver => Event::TookOver,
            GateEvent::Refused(rejected) => Event::Refused(rejected.reason()),
            GateEvent::Ungated => Event::Ungated,
            GateEvent::Replayed => Event::Replayed,
            GateEvent::Retried => Event::Retried,
            GateEvent::Settled => Event::Settled,
            GateEvent::Released => Event::Released,
            GateEvent::Unrecorded(rejected) => Event::Unrecorded(rejected.reason()),
            GateEvent::Kept => Event::Kept,
            GateEvent::InDoubt => Event::InDoubt,
            other => Event::Other(format!("{other:?}")),
        }
    }
}

/// A fault injected, from when it began to when it was over.
#[derive(Debug, Clone, Copy)]
pub struct Fault {
    /// What it was.
    pub kind: FaultKind,
    /// When it began.
    pub start: Micros,
    /// When it was over.
    pub end: Micros,
}

/// A kind of fault the injector knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// `pg_terminate_backend` of the gate's connections: how many died.
    BackendsTerminated(i64),
    /// Every connection through the proxy cut, new ones turned away.
    ConnectionsCut,
    /// A statement committed and its reply was lost with its connection.
    ReplyLost(Statement),
    /// `pg_ctl restart -m fast`.
    Restart,
    /// `pg_ctl stop -m immediate`, then start.
    Crash,
}

impl FaultKind {
    /// Its name in figures and anomalies.
    pub fn name(self) -> String {
        match self {
            FaultKind::BackendsTerminated(_) => "backends_terminated".to_owned(),
            FaultKind::ConnectionsCut => "connections_cut".to_owned(),
            FaultKind::ReplyLost(statement) => format!("reply_lost_{}", statement.name()),
            FaultKind::Restart => "restart".to_owned(),
            FaultKind::Crash => "crash".to_owned(),
        }
    }
}

/// One metered event: its identifier and quantity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metered {
    /// The event's identifier.
    pub event: u64,
    /// Its quantity.
    pub quantity: i64,
}

/// One attempt to record a batch.
#[derive(Debug, Clone)]
pub struct MeterAttempt {
    /// The batch's number.
    pub batch: usize,
    /// When the attempt began.
    pub start: Micros,
    /// When it returned.
    pub end: Micros,
    /// Per event, in the batch's order; `None` when the attempt failed.
    pub reported: Option<Vec<Reported>>,
}

/// What the meter reported for one event of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reported {
    /// Stored by this attempt.
    Inserted,
    /// Already stored.
    Deduplicated,
    /// An outcome this checker does not know.
    Other(String),
}

/// Everything recorded in one run.
#[derive(Debug, Clone, Default)]
pub struct History {
    /// Per identity, by number.
    pub guards: Vec<Guard>,
    /// By id.
    pub invocations: Vec<Invocation>,
    /// Every fault injected.
    pub faults: Vec<Fault>,
    /// The metering batches, by number.
    pub batches: Vec<Vec<Metered>>,
    /// Every attempt to record a batch.
    pub attempts: Vec<MeterAttempt>,
    /// How identity numbers become keys (and so addresses).
    pub keys: Keys,
    /// The fake provider's ledger: every charge it was asked to make.
    pub charges: Vec<Charge>,
    /// Every answer a reconciler's probe gave.
    pub probes: Vec<Probed>,
}

impl History {
    /// A fault was active between `start` and `end`, or had just been (as
    /// the checker judges an outage): what a workload that infers an
    /// invocation's events from its answer asks before assuming that an
    /// outcome was recorded.
    pub fn fault_during(&self, start: Micros, end: Micros) -> bool {
        self.faults
            .iter()
            .any(|fault| fault.start <= end && start <= fault.end + check::OUTAGE_GRACE)
    }
}

/// How identity `n` is keyed: how the final rows are told apart.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Keys {
    /// `(ACTION, n)`, `n` an integer: every entry point of the gate.
    #[default]
    Numbers,
    /// `(ACTION, "key-n")`: an `Idempotency-Key` header through the tower
    /// layer, whose route is [`ACTION`].
    Text,
}

/// A charge the fake provider was asked to make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charge {
    /// The identity charged.
    pub identity: usize,
    /// The invocation whose body charged.
    pub invocation: u64,
    /// When.
    pub at: Micros,
}

/// What a probe told a reconciler about one claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probed {
    /// The identity probed.
    pub identity: usize,
    /// When the probe answered.
    pub at: Micros,
    /// What it answered.
    pub verdict: ProbeVerdict,
}

/// A probe's answer, as read from the provider's ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeVerdict {
    /// Charged: settled, with this receipt to replay.
    Charged(u64),
    /// Not charged: kept failed.
    Failed,
    /// Not charged: released for a retry.
    NotHappened,
    /// Not telling (yet).
    Unknown,
}

/// The provider's receipt for a charge made by invocation `invocation`:
/// what a probe replays. It differs from the value the charging body
/// returns, so that a caller told its own value while the slot replays the
/// probe's shows as two stories.
pub fn receipt(invocation: u64) -> u64 {
    RECEIPTS + invocation
}

/// Where receipts start: above every invocation id.
pub const RECEIPTS: u64 = 1 << 40;

/// What the store holds once the run is over.
#[derive(Debug, Clone, Default)]
pub struct Final {
    /// The run's claim rows.
    pub claims: Vec<ClaimRow>,
    /// Rows written by transaction-mode bodies: `(identity, invocation)`.
    pub effects: Vec<(usize, u64)>,
    /// The run's metering rows.
    pub meter_rows: Vec<MeterRow>,
}

/// A claim row left in `idem_records`.
#[derive(Debug, Clone)]
pub struct ClaimRow {
    /// `None`: the address is none of the history's identities.
    pub identity: Option<usize>,
    /// Its address.
    pub address: String,
    /// Its state.
    pub state: String,
}

/// A metering row left in `idem_records`.
#[derive(Debug, Clone)]
pub struct MeterRow {
    /// `None`: the address is no event the history sent.
    pub event: Option<u64>,
    /// Its quantity.
    pub quantity: i64,
}

/// The address of identity `n`.
pub fn address(n: usize) -> String {
    identity(n).address()
}

/// The address of identity `n`, keyed as `keys` says.
pub fn address_of(keys: Keys, n: usize) -> String {
    match keys {
        Keys::Numbers => address(n),
        Keys::Text => Identity::new(ACTION).part(http_key(n)).address(),
    }
}

/// The `Idempotency-Key` of identity `n` through the tower layer.
pub fn http_key(n: usize) -> String {
    format!("key-{n}")
}

/// How many consecutive identities are the events of one entity, for
/// those guarded [`Guard::Ordered`].
pub const EVENTS_PER_ENTITY: usize = 4;

/// The entity's number of identity `n` ([`Guard::Ordered`]).
pub fn entity_of(n: usize) -> usize {
    n / EVENTS_PER_ENTITY
}

/// The entity identity of identity `n` ([`Guard::Ordered`]): of the
/// action's name, as the attribute's `entity` makes it.
pub fn entity_identity(n: usize) -> Identity {
    Identity::new(ACTION).part(entity_of(n) as u64)
}

/// The order of identity `n` among its entity's events ([`Guard::Ordered`]):
/// two of the four are equal, so that an event of equal order runs too.
pub fn order_of(n: usize) -> i64 {
    [1, 2, 2, 3][n % EVENTS_PER_ENTITY]
}

/// Identity `n` through every entry point of the gate.
pub fn identity(n: usize) -> Identity {
    Identity::new(ACTION).part(n as u64)
}
