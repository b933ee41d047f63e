//! Steps inside one claim: [`step`] runs a future at most once per identity
//! and step name, records its result with the claim, and replays it when
//! the identity runs again; [`downstream_key`] gives that step's external
//! call a key of its own.
//!
//! The insert is the lock here too. A step begins by inserting its marker
//! (a `pending` row at the step's own address), only while the claim is
//! still its holder's; it ends by recording its value over the marker
//! (`success`), or, when it failed, by deleting the marker so a later run
//! runs it again. A run of the same identity that finds a recorded step
//! hands its value back without running it; one that finds a marker
//! nobody recorded knows its holder was cut off inside the step, and
//! nobody knows what the step did: the step is not run blindly again (the
//! body is told [`Rejected::StepInDoubt`], and a failure of the body holds
//! the claim in doubt), unless it was declared [`repeatable`](Step::repeatable).
//!
//! A repeatable step needs no marker: cut off inside it, its holder leaves
//! nothing, and a later run runs it again, which is what a marker would
//! have let it do anyway. It is looked up in what the run read of its
//! claim's steps (one statement, at the run's first repeatable step, which
//! every later step of the run replays from), and recorded in one
//! statement that inserts its row only while the claim is still the
//! holder's, fenced like every other.
//!
//! The gate's run loop makes the claim's facts ambient to its body for the
//! body's lifetime (a tokio task-local), so `step` and `downstream_key` need
//! no handle: a future the body spawns as a task of its own is outside, and
//! is told so.

use std::collections::HashMap;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::Poll;

use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::PgConnection;
use tokio::sync::OnceCell;
use tokio::task::futures::TaskLocalFuture;

use crate::claim::{Lease, WonSlot};
use crate::error::Rejected;
use crate::identity::{self, Identity};
use crate::measure::{self, StepLabel};
use crate::mode::Disposition;
use crate::retry;
use crate::scoped_pool::ScopedPool;
use crate::store::{self, Commit, Engine, StepRow, StepState};
use crate::stored_value;
use crate::via::Via;

tokio::task_local! {
    /// The claim the body being polled runs under, if any.
    static CLAIM: Arc<Ambient>;
}

/// How often a step looks again when its row changed between its begin and
/// its look (a cut-off holder's marker removed in between): each miss is a
/// write to this very step within one round trip.
const BEGIN_ATTEMPTS: usize = 4;

/// Why a step of a claim on the pool is not recorded on a connection.
const POOL_CLAIM_ON: &str = "this body's claim is on the pool, and so are its steps (so that \
     the next holder sees them whatever becomes of your transaction): drop .on(..)";

/// Why a step of a claim inside the caller's transaction needs it.
const TX_CLAIM_WITHOUT_ON: &str = "this body's claim is inside your transaction, and its steps \
     must be recorded there too: write idem::step(name, future).on(&mut *tx)";

/// Why a step polled outside the body it began in stops.
const ESCAPED: &str = "the step began in a guarded body and was then polled outside it (in a \
     task the body spawned, or after the body returned), where its claim does not reach: \
     await each step in the body itself";

/// What the body being polled runs under.
pub(crate) struct Ambient {
    under: Under,
    /// What the steps saw, which the run loop reads after the body.
    log: Mutex<Log>,
    /// The claim's steps as this run read them, by address: read once, at
    /// the first step without a marker (steps joined in one body wait for
    /// the one read), and taken from as each step of the run begins (each
    /// name begins once per run, so nothing read is consulted twice).
    read: OnceCell<Mutex<HashMap<String, StepRow>>>,
    /// Held while a carried record is taken and written on its own, so
    /// that whoever takes it next finds it written, and what became of it
    /// noted ([`Carried`]).
    landing: tokio::sync::Mutex<()>,
}

enum Under {
    /// A claim this holder won, on the pool: its steps record on the pool.
    Claim(ClaimFacts),
    /// A claim won inside the caller's transaction: its steps record on
    /// that transaction ([`Step::on`]), and commit or roll back with it.
    TxClaim(ClaimFacts),
    /// A body the gate runs ungated: an absent identity, or a store down
    /// under `on_unavailable = "run"`. Its steps run unrecorded.
    Ungated {
        identity: Identity,
        slots: ScopedPool,
    },
}

struct ClaimFacts {
    slots: ScopedPool,
    identity: Identity,
    address: String,
    fence: i64,
    commit: Commit,
    /// The claim's lease by this process's clock, renewed with it: a claim
    /// found gone is `LeaseLost` once it ran out, `ClaimLost` before
    /// (`NotRecorded` when somebody else decided its outcome).
    lease: Arc<Lease>,
}

impl ClaimFacts {
    fn of(held: &WonSlot) -> ClaimFacts {
        ClaimFacts {
            slots: held.slots.clone(),
            identity: held.identity.clone(),
            address: held.address.clone(),
            fence: held.fence,
            commit: held.commit,
            lease: Arc::clone(&held.lease),
        }
    }
}

#[derive(Default)]
struct Log {
    /// The steps begun in this run, by name: a name begun twice in one run
    /// is a mistake of the body.
    begun: Vec<String>,
    /// A step found cut off, or whose result could not be recorded: the
    /// body's failure must hold the claim, never release it.
    unknown: Option<String>,
    /// What a statement of a step found when the claim was no longer this
    /// holder's (on the pool: taken over, or released): no step of the run
    /// runs from then on, though a recorded one is still replayed.
    lost: Option<Rejected>,
    /// A step told the body its claim was lost, and did not run: a success
    /// of the body after that went on without it, and is not recorded over
    /// whoever holds the slot now.
    refused: Option<Rejected>,
    /// The connection, by address, that read the claim as its holder's
    /// inside the caller's transaction: a later step given another one is
    /// checked before it runs. (Two live connections never share an
    /// address, and the claim's transaction outlives its body.)
    verified: Option<usize>,
    /// The record of the step finished last, waiting to ride with the
    /// run's next statement (see [`Carried`]).
    carried: Option<Carried>,
}

/// The record of a step its holder finished, not yet written: it rides
/// with the run's next statement, the next step's begin or the claim's
/// settle, so that N steps cost N + 2 statements and durable commits with
/// the claim and its settle instead of 2N + 2.
///
/// It waits [`STEP_RECORD_WAIT`](crate::scoped_pool::STEP_RECORD_WAIT) (or what the gate says:
/// [`Gate::with_step_record_wait`](crate::Gate::with_step_record_wait)): a body that does not reach its next
/// statement by then has the record written on its own, by a task that
/// outlives the body (a body dropped or panicking right after the step
/// still has it recorded). Until it lands, the step is as one cut off
/// inside it, its marker in: a process killed in those few milliseconds
/// leaves the step in doubt, never runs it twice. Any other end of the
/// body writes it before its outcome: a failure, a success a step refused,
/// a batch's item, a detached body stopped.
///
/// Carried only where nobody else can record the step meanwhile, so that
/// every run sees one value: a claim on the pool, without a lease or with
/// a good margin of it left ([`Lease::carry_for`]); on one PostgreSQL. In
/// the caller's transaction every statement commits together anyway, and
/// Citus plans the `INSERT` of [`store::RECORD_AND_BEGIN_STEP`] apart
/// from the rest.
///
/// A statement that carries it takes a copy ([`Riding`]) and leaves the
/// record, and its timer, where they are until the statement's answer is
/// in: a body dropped, or no longer polled, in the middle of that
/// statement still has the record written on its own when the wait is
/// over. Both may then write it; each write is a compare-and-swap on the
/// marker, so the second writes nothing and finds the first's.
pub(crate) struct Carried {
    riding: Riding,
    /// The task that writes it on its own once it waited long enough.
    timer: tokio::task::AbortHandle,
}

/// What a statement that carries a step's record writes ([`Carried`]).
#[derive(Debug, Clone)]
pub(crate) struct Riding {
    name: String,
    address: String,
    json: String,
}

/// Who writes a waiting record on its own ([`Ambient::land`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Landing {
    /// Its timer, once it waited long enough: the run goes on.
    Waited,
    /// The run's end, before its outcome is chosen.
    Final,
}

/// Whether `rejected` says the claim is no longer its holder's.
fn says_claim_lost(rejected: &Rejected) -> bool {
    matches!(
        rejected,
        Rejected::LeaseLost { .. } | Rejected::ClaimLost { .. } | Rejected::NotRecorded { .. }
    )
}

impl Riding {
    /// What the store writes.
    pub(crate) fn record(&self) -> store::CarriedRecord<'_> {
        store::CarriedRecord {
            address: &self.address,
            output: &self.json,
        }
    }
}

impl Ambient {
    /// The facts of `claim`'s slot, for its body's steps.
    pub(crate) fn of_claim(
        held: Option<&WonSlot>,
        identity: &Identity,
        slots: &ScopedPool,
    ) -> Arc<Ambient> {
        Ambient::of(
            held.map(|held| Under::Claim(ClaimFacts::of(held))),
            identity,
            slots,
        )
    }

    /// The facts of a claim won inside the caller's transaction; with no
    /// slot held (an absent identity), its steps run unrecorded, as on the
    /// pool.
    pub(crate) fn of_tx_claim(
        held: Option<&WonSlot>,
        identity: &Identity,
        slots: &ScopedPool,
    ) -> Arc<Ambient> {
        Ambient::of(
            held.map(|held| Under::TxClaim(ClaimFacts::of(held))),
            identity,
            slots,
        )
    }

    /// A body's ambient: under its claim, or ungated when it holds none.
    fn of(claim: Option<Under>, identity: &Identity, slots: &ScopedPool) -> Arc<Ambient> {
        let under = claim.unwrap_or_else(|| Under::Ungated {
            identity: identity.clone(),
            slots: slots.clone(),
        });
        Arc::new(Ambient {
            under,
            log: Mutex::default(),
            read: OnceCell::new(),
            landing: tokio::sync::Mutex::new(()),
        })
    }

    /// `body`, polled with this claim ambient to it.
    pub(crate) fn around<F: Future>(self: &Arc<Self>, body: F) -> TaskLocalFuture<Arc<Ambient>, F> {
        CLAIM.scope(Arc::clone(self), body)
    }

    /// What a failure of the body must record, when its steps say: a step
    /// whose outcome nobody knows holds the claim in doubt, whatever the
    /// body's own classification (a release would let a retry run that
    /// step again).
    pub(crate) fn overrides(&self, wanted: Disposition) -> Disposition {
        match self.lock().unknown {
            Some(_) => Disposition::InDoubt,
            None => wanted,
        }
    }

    /// The refusal a step gave the body when it found the claim no longer
    /// this holder's, if one did: a success of the body is then not
    /// recorded over whoever holds the slot now, since the body went on
    /// without the step that was refused. (A step refused for the wrong
    /// connection leaves the claim its holder's: a body that goes on
    /// without it is like one that ignores a step's error.)
    pub(crate) fn refused(&self) -> Option<Rejected> {
        self.lock().refused.clone()
    }

    /// Notes `rejected`, about to be returned by a step to the body, if it
    /// says the claim was lost.
    fn refusing(&self, rejected: &Rejected) {
        if says_claim_lost(rejected) {
            self.lock().refused.get_or_insert_with(|| rejected.clone());
        }
    }

    /// Keeps the value `json` of `held`'s step, which is not repeatable, to
    /// ride with the run's next statement, if this body's steps carry
    /// their records and none waits already (two steps joined in one body
    /// that finish together: the second records on its own). `false`:
    /// record it now.
    fn carries(self: &Arc<Self>, held: &Held<'_>, json: &str) -> bool {
        let Some(wait) = self
            .carrying()
            .and_then(|facts| facts.lease.carry_for(facts.slots.step_record_wait()))
        else {
            return false;
        };
        let mut log = self.lock();
        if log.carried.is_some() {
            return false;
        }
        let ambient = Arc::clone(self);
        let timer = tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            ambient.land(Landing::Waited).await;
        });
        log.carried = Some(Carried {
            riding: Riding {
                name: held.name.to_owned(),
                address: held.address.clone(),
                json: json.to_owned(),
            },
            timer: timer.abort_handle(),
        });
        true
    }

    /// Whether this is the claim of the body being polled now.
    fn is_current(self: &Arc<Self>) -> bool {
        CLAIM
            .try_with(|current| Arc::ptr_eq(current, self))
            .unwrap_or(false)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Log> {
        lock(&self.log)
    }

    /// The claim on the pool whose steps carry their records, if this
    /// body's does ([`Carried`]).
    fn carrying(&self) -> Option<&ClaimFacts> {
        match &self.under {
            Under::Claim(facts) if facts.slots.engine() != Engine::Citus => Some(facts),
            _ => None,
        }
    }

    /// A copy of the record waiting to ride with the next statement, if
    /// any, for that statement to write; the record stays, with its timer,
    /// until the statement's answer is noted ([`carried_landed`]). Waits
    /// for one being written on its own.
    ///
    /// [`carried_landed`]: Ambient::carried_landed
    pub(crate) async fn ride(&self) -> Option<Riding> {
        let _landing = self.landing.lock().await;
        self.lock()
            .carried
            .as_ref()
            .map(|carried| carried.riding.clone())
    }

    /// Writes the record waiting to ride with the next statement, if any,
    /// in a statement of its own: for a run that ends some other way than
    /// by a settle that could carry it.
    pub(crate) async fn land_carried(&self) {
        self.land(Landing::Final).await;
    }

    /// Writes the record waiting, if any, on its own: at the run's end
    /// ([`Landing::Final`]), or once it waited long enough
    /// ([`Landing::Waited`]). A write of the timer's that fails leaves the
    /// record waiting for the run's next statement or its end, which
    /// write it again; only one at the end that fails leaves the step in
    /// doubt.
    async fn land(&self, landing: Landing) {
        let Some(facts) = self.carrying() else {
            return;
        };
        let _landing = self.landing.lock().await;
        let Some(carried) = self.lock().carried.take() else {
            return;
        };
        if landing == Landing::Final {
            carried.timer.abort();
        }
        let held = Held::new(facts, &carried.riding.name);
        let mut via = Via::Pool(facts.slots.pool());
        let recorded = held
            .record(&carried.riding.json, true, self, &mut via)
            .await;
        match recorded {
            Err(ref failed) if landing == Landing::Waited && !says_claim_lost(failed) => {
                self.lock().carried = Some(carried);
            }
            recorded => self.landed(&held, recorded),
        }
    }

    /// Notes what became of `riding` after the statement that carried it,
    /// which wrote it (`recorded`) or wrote nothing: looked into then, as
    /// a record of its own that wrote nothing is. Nothing to note when the
    /// record was written on its own meanwhile (its timer noted it).
    pub(crate) async fn carried_landed(&self, riding: &Riding, recorded: bool) {
        let Some(facts) = self.carrying() else {
            return;
        };
        let _landing = self.landing.lock().await;
        {
            let mut log = self.lock();
            match log.carried.take() {
                Some(carried) if carried.riding.address == riding.address => {
                    carried.timer.abort();
                }
                other => {
                    log.carried = other;
                    return;
                }
            }
        }
        let held = Held::new(facts, &riding.name);
        let found = if recorded {
            Ok(Recorded::Ours)
        } else {
            let mut via = Via::Pool(facts.slots.pool());
            held.wrote_nothing(&riding.json, self, &mut via).await
        };
        self.landed(&held, found);
    }

    /// Notes what became of a carried record. The body went on with the
    /// step's value long ago: another's record ([`Recorded::Theirs`]) is
    /// the step's, and one that could not be written leaves the step in
    /// doubt, as a record of its own that fails does. A claim found lost
    /// is a refusal the body did not hear: its success is not recorded.
    fn landed(&self, held: &Held<'_>, recorded: Result<Recorded, Rejected>) {
        let facts = held.facts;
        let count = |outcome| measure::stepped(&facts.slots, &facts.identity, outcome);
        let unrecorded = match recorded {
            Ok(Recorded::Ours | Recorded::Theirs(_)) => {
                count(StepLabel::Recorded);
                return;
            }
            Err(unrecorded) => unrecorded,
        };
        count(StepLabel::Unrecorded);
        self.lock().unknown = Some(held.name.to_owned());
        if says_claim_lost(&unrecorded) {
            self.refusing(&unrecorded);
        } else {
            unrecorded_event(facts, held, false, &unrecorded);
        }
    }
}

/// Runs `future` as the step `name` of the guarded body it is called in:
/// at most once per identity and name, its `Ok` value recorded with the
/// claim and handed back, without running, to every later run of the same
/// identity.
///
/// Most actions are several calls: a checkout charges the card, books the
/// shipment, sends the receipt. `step` makes each of them a unit of its own
/// inside the claim, and hands its recorded value back **without running** to
/// every later run of the identity — a retry after a failure released the
/// claim, a takeover after a lease ran out, a reconciler's or an operator's
/// release. The body resumes at the first step that did not finish. No
/// workflow engine, no replay of code, no determinism rules: only the named
/// steps are recorded.
///
/// ```no_run
/// # use idem_runtime as idem;
/// # struct Order { id: String }
/// # async fn charge_card(key: &str) -> Result<String, idem::Rejected> { Ok(key.into()) }
/// # async fn book_shipment(order: &Order) -> Result<u64, idem::Rejected> { Ok(1) }
/// # async fn send_receipt(order: &Order) -> Result<(), idem::Rejected> { Ok(()) }
/// # async fn example(gate: &idem::Gate, order: &Order) -> Result<u64, idem::Rejected> {
/// // By hand; `#[idempotent(key = "order.id", lease = "30s")]` on a function
/// // with this body is the same.
/// let id = idem::Identity::new("checkout").part(&order.id);
/// gate.guard(&id).lease(std::time::Duration::from_secs(30)).run(async {
///     // The provider deduplicates by this key: safe to call again.
///     let key = idem::downstream_key("charge")?;
///     // Replayed, not run, when a retry of this checkout gets here again.
///     let _receipt: String = idem::step("charge", charge_card(&key)).repeatable().await?;
///     let parcel: u64 = idem::step("ship", book_shipment(order)).await?;
///     idem::step("email", send_receipt(order)).await?;
///     Ok::<_, idem::Rejected>(parcel)
/// })
/// .await
/// # }
/// ```
///
/// - **A step that fails** (`Err`) records nothing: its marker is removed,
///   and a later run runs it again. The body's failure decides the claim, as
///   ever (released, kept, or held in doubt by its
///   [`disposition`](crate::Guard::disposition)).
/// - **A step cut off** — its body dropped or panicking inside it, its
///   process killed, its lease taken over — has an outcome nobody knows. A
///   later run is told [`Rejected::StepInDoubt`] instead of running it, and a
///   body that fails for it holds the claim in doubt (whatever its
///   disposition says) for a [reconciler](crate::reconcile) or an operator.
///   That holds for a step the body itself dropped (a timeout around it)
///   before the body failed. A step whose value could not be recorded is
///   treated the same way: the store failed after it ran, or its value would
///   not read back from JSON as the same value (a NaN or an infinite float,
///   or `Some(())`, all written `null`); the body still gets the value. A
///   recorded value that no longer reads back as the step's type (a deploy
///   changed it) is refused too, without holding the claim: make the type
///   read what was recorded.
/// - **Repeatable steps.** [`.repeatable()`](Step::repeatable) declares a
///   step safe to run again when cut off: it passes its [`downstream_key`] to
///   a provider that deduplicates by key (Stripe's `Idempotency-Key`, Adyen's
///   `idempotency-key`, the IETF draft's header), so the second call returns
///   the first one's result. That is how an in-doubt step becomes certain: it
///   runs again instead of waiting for somebody to find out. A recorded step
///   is still replayed, never re-run. Since nothing is lost by running it
///   again, a repeatable step writes no marker before it runs: `idem claims
///   show` lists it once it is recorded, and a reconciler is never asked
///   about it.
/// - **Downstream keys** are `idem_` and 40 hex digits, the same on every run
///   of the identity and never the same for two identities, two steps, two
///   accounts or two namespaces.
/// - **Fenced.** Only the claim's holder begins a step; a holder whose lease
///   was taken over cannot begin one (it is told [`Rejected::LeaseLost`]),
///   never records over the new holder's, and finds what the new holder
///   recorded if it asks again. A run's first repeatable step reads whether
///   its claim is still its own before it runs; a later one begins with no
///   statement of its own, so it may still run in a holder that does not know
///   yet that it lost its claim (its call carries the downstream key, so the
///   provider does it once). Its record never goes in over the new holder's:
///   the step hands back the value recorded by whoever recorded it (a new
///   holder, a reconciler), and is otherwise refused: `LeaseLost` once its
///   lease ran out, [`ClaimLost`](Rejected::ClaimLost) when the claim was
///   released under it (an operator's release, say), and
///   [`NotRecorded`](Rejected::NotRecorded) when a reconciler or an operator
///   resolved it as succeeded or failed, which is what the same holder is
///   told without steps: the slot is decided for good. From then on no step
///   of that body runs (a recorded one is still replayed), and should the
///   body swallow the refusal and return `Ok`, its success is not recorded:
///   it went on without the steps that were refused, so it is not the
///   action's success, and the caller is told the refusal instead. Should a
///   cut-off holder's record of a repeatable step land while the new holder
///   runs it again, the new holder goes on with the recorded value, not its
///   own: every run sees one value.
/// - **In your transaction** ([`tx`](crate::Guard::tx)), give the step the
///   connection: `idem::step("charge", call).on(&mut *tx)` ([`Step::on`]). A
///   step given another connection is refused (`WrongConnection`) before it
///   runs. Its record then commits or rolls back with the claim; a rollback
///   forgets the step, so a call the transaction cannot undo wants its
///   downstream key.
/// - **Everywhere a gate runs a body**: the attribute, the guard's
///   [`run`](crate::Guard::run) and [`run_detached`](crate::Guard::run_detached),
///   each body of a [batch](crate::batch), the HTTP layer's handlers. Outside
///   a guarded body, or in a task the body spawned, a step is
///   [`Rejected::NotGuarded`] and its future does not run; so is a name used
///   twice in one run (names are any text: give a loop's steps names of their
///   own). A step begun in the body and then moved out of it (spawned, or
///   kept past the body's end) stops at its next poll there, also
///   `NotGuarded`: its future never goes on outside its claim. If it had
///   started, nobody knows how far it got, and a later run finds it in doubt.
/// - **Ungated**: in a body that runs ungated (an absent identity, on the
///   pool or in a transaction, or a store down under `on_unavailable =
///   "run"`), `future` runs and nothing is recorded.
/// - **Cost**: a step that is not repeatable costs one statement: its
///   marker goes in with the record of the step before it, and the last
///   step's record with the claim's settle, so a body of N steps costs
///   N + 2 statements and durable commits with its claim and its settle,
///   as many as N recovery points written by hand. A finished step's record
///   waits for the run's next statement 20 ms at most (the gate's
///   [`with_step_record_wait`](crate::Gate::with_step_record_wait) sets
///   another wait, or none), then is written on its own (by a task that
///   outlives a body dropped meanwhile), and only
///   where nobody else can record the step in the meantime: a claim on the
///   pool, without a lease or with a good margin of it left, on one
///   PostgreSQL. Elsewhere (in the caller's transaction, on Citus, near a
///   lease's end) each record is a statement of its own, before the body
///   goes on. A process killed in that wait leaves the finished step in
///   doubt, as one cut off inside it: never run twice. A repeatable step
///   that runs costs one statement, its record, written before the body
///   goes on (another holder's may land first, and every run sees one
///   value). Records commit asynchronously under an asynchronous
///   [`outcome_commit`](crate::Guard::outcome_commit), markers always
///   durably (with the record they carry). A run reads its claim's steps
///   once, at its first repeatable step, and replays every recorded step it
///   reaches after that from what it read, with no statement; a step
///   replayed before it costs the look that finds it. A step's value must
///   be `Serialize + DeserializeOwned`; its future `Send`.
pub fn step<'f, F: 'f>(name: impl Into<String>, future: F) -> Step<'f, F> {
    Step {
        name: name.into(),
        future,
        repeatable: false,
        connection: None,
    }
}

/// A step of a guarded body (see [`step`]): await it, or declare it
/// [`repeatable`](Step::repeatable), or give it the caller's transaction
/// ([`on`](Step::on)), first. `'f`: what it borrows.
#[must_use = "a step does nothing until awaited"]
pub struct Step<'f, F> {
    name: String,
    future: F,
    repeatable: bool,
    connection: Option<&'f mut PgConnection>,
}

impl<'f, F> Step<'f, F> {
    /// Records the step on `connection`, the caller's transaction that the
    /// body's claim was made in (`tx`): the step's record commits or rolls
    /// back with it, as the claim does. A step of a claim made inside a
    /// transaction must be given it; one of a claim on the pool must not.
    ///
    /// The future cannot use the connection while the step holds it: a
    /// write of the transaction needs no step anyway, since it commits or
    /// rolls back with the claim. Steps in a transaction are for what the
    /// transaction cannot roll back, a provider's call; a rollback forgets
    /// them, so give such a call its [`downstream_key`].
    pub fn on(mut self, connection: &'f mut PgConnection) -> Self {
        self.connection = Some(connection);
        self
    }

    /// Declares the step safe to run again when its outcome is unknown: it
    /// calls a provider that deduplicates by [`downstream_key`], so a
    /// second call of the same key does nothing twice. A later run then
    /// runs a step its holder was cut off inside, instead of holding the
    /// claim in doubt. A recorded step is still replayed, never re-run.
    ///
    /// It costs one statement, its record: with nothing to guard against
    /// a second run, it writes no marker first. How it is fenced when its
    /// holder lost the claim: see [`step`] (**Fenced**).
    pub fn repeatable(mut self) -> Self {
        self.repeatable = true;
        self
    }
}

// Boxed: a step costs a round trip or two, next to which one allocation is
// nothing, and a named future type keeps `Step` a builder (`.repeatable()`
// before `.await`) on stable Rust. `Send`, as every guarded body must be.
impl<'f, F, T, E> IntoFuture for Step<'f, F>
where
    F: Future<Output = Result<T, E>> + Send + 'f,
    T: Serialize + DeserializeOwned + Send + 'f,
    E: From<Rejected> + Send + 'f,
{
    type Output = Result<T, E>;
    type IntoFuture = Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'f>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(run_step(self))
    }
}

/// A stable key for the external call of step `name` of the guarded body
/// it is called in: the same on every run of the identity, never the same
/// for two identities, two steps, two accounts or two namespaces. `idem_`
/// and 40 lowercase hex digits: 45 characters of `[a-z0-9_]`, which
/// Stripe's `Idempotency-Key`, Adyen's `idempotency-key` (64 at most) and
/// the IETF draft's `Idempotency-Key` field all accept.
///
/// Pass it to a provider that deduplicates by key, and mark the step
/// [`repeatable`](Step::repeatable): a step cut off before its outcome was
/// recorded then runs again and the provider answers the first call's
/// result, which turns an outcome nobody knew into a certain one.
///
/// Outside a guarded body it is [`Rejected::NotGuarded`]; for an absent
/// identity (a key part was `None`), which has no stable key, too.
pub fn downstream_key(name: &str) -> Result<String, Rejected> {
    let ambient = ambient("idem::downstream_key")?;
    let (identity, slots) = match &ambient.under {
        Under::Claim(facts) | Under::TxClaim(facts) => (&facts.identity, &facts.slots),
        Under::Ungated { identity, slots } if !identity.is_absent() => (identity, slots),
        Under::Ungated { .. } => {
            return Err(Rejected::NotGuarded {
                called: "idem::downstream_key",
                why: "the identity is absent (a key part was None), so there is no stable key \
                      for it: give every key part a value",
            });
        }
    };
    Ok(identity::downstream_key(
        slots.account(),
        slots.namespace(),
        &identity.step_canonical(name),
    ))
}

/// The claim ambient to the body being polled, or why there is none.
fn ambient(called: &'static str) -> Result<Arc<Ambient>, Rejected> {
    CLAIM
        .try_with(Arc::clone)
        .map_err(|_| Rejected::NotGuarded {
            called,
            why: "it is not called inside a guarded body (an #[idempotent] function, a guard's \
              run), or it is called in a task the body spawned, which the claim does not \
              reach: call it in the body itself",
        })
}

async fn run_step<F, T, E>(step: Step<'_, F>) -> Result<T, E>
where
    F: Future<Output = Result<T, E>>,
    T: Serialize + DeserializeOwned,
    E: From<Rejected>,
{
    let ambient = ambient("idem::step")?;
    let refused = |why| {
        Err(E::from(Rejected::NotGuarded {
            called: "idem::step",
            why,
        }))
    };
    // Which connection the step was given, to tell a later step given
    // another one (`Log::verified`); compared, never dereferenced.
    let connection = step
        .connection
        .as_deref()
        .map(|connection| std::ptr::from_ref(connection) as usize);
    let (facts, mut via) = match (&ambient.under, step.connection) {
        (Under::Claim(facts), None) => (facts, Via::Pool(facts.slots.pool())),
        (Under::TxClaim(facts), Some(connection)) => (facts, Via::Transaction(connection)),
        (Under::Claim(_), Some(_)) => return refused(POOL_CLAIM_ON),
        (Under::TxClaim(_), None) => return refused(TX_CLAIM_WITHOUT_ON),
        (Under::Ungated { .. }, _) => return step.future.await,
    };
    {
        let mut log = ambient.lock();
        if log.begun.contains(&step.name) {
            return Err(E::from(Rejected::NotGuarded {
                called: "idem::step",
                why: "a step of this name already ran in this run of the body: give each \
                      step its own name (a loop's steps too, by the item they handle)",
            }));
        }
        log.begun.push(step.name.clone());
    }
    let held = Held::new(facts, &step.name);
    let count = |outcome| measure::stepped(&facts.slots, &facts.identity, outcome);
    // Dropped from here on (the body dropped the step, or it panicked
    // inside it) the step may have begun, and done its effect: a failure
    // of the body must then hold the claim, not release it. Each way out
    // below says for itself.
    let mut cut_off = CutOff {
        ambient: &ambient,
        name: &step.name,
        armed: !step.repeatable,
    };
    let begun = if step.repeatable {
        held.begin_unmarked(&ambient, connection, &mut via).await
    } else {
        match held.recorded_in_what_was_read(&ambient) {
            Some(json) => Ok(Begun::Replay(json)),
            None => held.begin(&ambient, &mut via).await,
        }
    };
    // Only a step that is not repeatable inserted a marker: only its
    // marker is there to take back.
    let marked = !step.repeatable;
    match begun {
        Ok(Begun::Replay(json)) => {
            cut_off.disarm();
            count(StepLabel::Replayed);
            return read_back(&step.name, &json);
        }
        Ok(Begun::Run) => {}
        Ok(Begun::Rerun) => count(StepLabel::Repeated),
        Err(refused) => {
            cut_off.disarm();
            match refused {
                Rejected::StepInDoubt { .. } => {
                    count(StepLabel::InDoubt);
                    ambient.lock().unknown = Some(step.name.clone());
                }
                // The marker may have gone in before the store failed (its
                // reply lost): a later run would take it for a step cut
                // off. Removed, nothing of the step is left; if not, the
                // claim is held rather than released.
                Rejected::Unavailable { .. } | Rejected::StoreRefused { .. }
                    if marked && !held.abandon(&mut via).await =>
                {
                    ambient.lock().unknown = Some(step.name.clone());
                }
                _ => ambient.refusing(&refused),
            }
            return Err(E::from(refused));
        }
    }
    // The step's own future is polled only inside the body it began in: a
    // step moved out of it (into a task the body spawned, or kept past the
    // body's end) would run outside its claim, perhaps after the claim was
    // settled or released. It stops at its next poll there instead. Never
    // polled, it never ran, and its marker goes; polled once, nobody knows
    // how far it got, and its marker stays: a later run finds it in doubt.
    let mut future = std::pin::pin!(step.future);
    let mut polled = false;
    let output = std::future::poll_fn(|cx| {
        if !ambient.is_current() {
            return Poll::Ready(None);
        }
        polled = true;
        future.as_mut().poll(cx).map(Some)
    })
    .await;
    let Some(output) = output else {
        cut_off.disarm();
        if !polled {
            if marked {
                held.abandon(&mut via).await;
            }
        } else if !step.repeatable {
            // A body still running (the step was polled inside another
            // body, say) holds its claim should it fail; a repeatable
            // step would simply run again.
            ambient.lock().unknown = Some(step.name.clone());
        }
        return Err(E::from(Rejected::NotGuarded {
            called: "idem::step",
            why: ESCAPED,
        }));
    };
    match &output {
        Ok(value) => match stored_value::to_json(value) {
            Ok(json) if marked && ambient.carries(&held, &json) => {
                // Recorded with the run's next statement ([`Carried`]).
            }
            Ok(json) => match held.record(&json, marked, &ambient, &mut via).await {
                Ok(Recorded::Ours) => count(StepLabel::Recorded),
                Ok(Recorded::Theirs(json)) => {
                    // Another holder recorded the step while this one ran
                    // it (one cut off inside it, whose record landed after
                    // all; or the one that took this claim over): every
                    // run goes on with the one value the record holds.
                    cut_off.disarm();
                    count(StepLabel::Recorded);
                    return read_back(&step.name, &json);
                }
                Err(
                    gone @ (Rejected::LeaseLost { .. }
                    | Rejected::ClaimLost { .. }
                    | Rejected::NotRecorded { .. }
                    | Rejected::WrongConnection { .. }),
                ) => {
                    // The claim is no longer this holder's (or the step
                    // was given a connection that cannot see it): its value
                    // is nobody's record, and the body is told so. A step
                    // that is not repeatable leaves its marker, and this
                    // body's failure holds nothing it does not hold.
                    cut_off.disarm();
                    count(StepLabel::Unrecorded);
                    if !step.repeatable {
                        ambient.lock().unknown = Some(step.name.clone());
                    }
                    ambient.refusing(&gone);
                    return Err(E::from(gone));
                }
                Err(unrecorded) => {
                    // The step happened; what it did is not in the store.
                    // The body goes on with its value; should it fail, the
                    // claim is held, never released (a repeatable step
                    // may run again: it does not hold it).
                    count(StepLabel::Unrecorded);
                    if !step.repeatable {
                        ambient.lock().unknown = Some(step.name.clone());
                    }
                    unrecorded_event(facts, &held, step.repeatable, &unrecorded);
                }
            },
            Err(error) => {
                count(StepLabel::Unrecorded);
                if !step.repeatable {
                    ambient.lock().unknown = Some(step.name.clone());
                }
                tracing::error!(
                    target: "idem",
                    action = facts.identity.action(),
                    step = step.name.as_str(),
                    error = %error,
                    "{}",
                    if step.repeatable {
                        "a step's value could not be recorded as JSON that reads back as its \
                         type, so it is not recorded: a later run runs the step again"
                    } else {
                        "a step's value could not be recorded as JSON that reads back as its \
                         type, so it is not recorded: a later run will find the step in doubt"
                    }
                );
            }
        },
        Err(_) => {
            count(StepLabel::Failed);
            if marked && !held.abandon(&mut via).await {
                ambient.lock().unknown = Some(step.name.clone());
            }
        }
    }
    cut_off.disarm();
    output
}

/// Says that the result of `held`'s step could not be recorded, and what
/// a later run does about it.
fn unrecorded_event(facts: &ClaimFacts, held: &Held<'_>, repeatable: bool, error: &Rejected) {
    tracing::error!(
        target: "idem",
        account = facts.slots.account(),
        namespace = facts.slots.namespace(),
        action = facts.identity.action(),
        address = held.address.as_str(),
        step = held.name,
        error = %error,
        "{}",
        if repeatable {
            "a step's result could not be recorded: a later run runs it again"
        } else {
            "a step's result could not be recorded: a later run will find it in doubt"
        }
    );
}

/// The recorded value `json` of step `name`, as the step's type. Not a
/// doubt when it does not read back: the step happened, under a type that
/// wrote what this one cannot read. The claim follows the body's failure;
/// only code that reads the record can go on.
fn read_back<T: DeserializeOwned, E: From<Rejected>>(name: &str, json: &str) -> Result<T, E> {
    serde_json::from_str(json).map_err(|_| {
        E::from(Rejected::StepInDoubt {
            step: name.to_owned(),
            why: "it happened, and its recorded value no longer reads back as the step's type: \
                  make the type read what an earlier version recorded",
        })
    })
}

/// `mutex`, poisoned or not: what it guards is only ever replaced whole.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Marks the outcome of the body unknown when dropped armed: a step stopped
/// between its begin and its end (its body dropped it, or panicked inside
/// it) may have done its effect. Armed for a step that is not repeatable
/// (a repeatable one simply runs again); each way out of the step that
/// says for itself what its outcome means disarms it.
struct CutOff<'a> {
    ambient: &'a Ambient,
    name: &'a str,
    armed: bool,
}

impl CutOff<'_> {
    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for CutOff<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.ambient.lock().unknown = Some(self.name.to_owned());
        }
    }
}

/// What beginning a step found.
enum Begun {
    /// Run it: its marker is this holder's.
    Run,
    /// Run it again: its holder was cut off inside it, and it is
    /// repeatable; its marker is now this holder's.
    Rerun,
    /// Recorded before: its value, as JSON.
    Replay(String),
}

/// What recording a step's value found.
enum Recorded {
    /// This holder's value is the step's record.
    Ours,
    /// Another's is (as JSON): a holder cut off inside the step whose
    /// record landed after all, the holder that took the claim over, or a
    /// reconciler's or an operator's verdict.
    Theirs(String),
}

/// One step of a claim this holder holds.
struct Held<'a> {
    facts: &'a ClaimFacts,
    name: &'a str,
    canonical: Vec<u8>,
    address: String,
}

impl<'a> Held<'a> {
    fn new(facts: &'a ClaimFacts, name: &'a str) -> Held<'a> {
        let canonical = facts.identity.step_canonical(name);
        let address = identity::step_address(&canonical);
        Held {
            facts,
            name,
            canonical,
            address,
        }
    }

    fn new_step(&self) -> store::NewStep<'_> {
        store::NewStep {
            identity: &self.canonical,
            fence: self.facts.fence,
            claim_address: &self.facts.address,
        }
    }

    /// The step's value, when what the run read of its claim's steps (if
    /// it read them) has it recorded.
    fn recorded_in_what_was_read(&self, ambient: &Ambient) -> Option<String> {
        let row = lock(ambient.read.get()?).remove(&self.address)?;
        (row.state == StepState::Success && row.identity == self.canonical).then(|| row.value())
    }

    /// The claim is no longer this holder's: every later step of the run
    /// is refused (on the pool; in a transaction it cannot be, and the
    /// connection given was the wrong one, which another step may not
    /// repeat). Said once per run, as the first step to find it out
    /// found it.
    async fn lost(&self, ambient: &Ambient, via: &mut Via<'_>) -> Rejected {
        if via.in_transaction() {
            return self.claim_gone(via);
        }
        if let Some(known) = ambient.lock().lost.clone() {
            return known;
        }
        let gone = self.what_became_of_the_claim(via).await;
        ambient.lock().lost.get_or_insert(gone).clone()
    }

    /// Why a claim on the pool is no longer this holder's, as the run loop
    /// would say it when recording the body's outcome: a success or a
    /// failure somebody else recorded under its fence (a reconciler or an
    /// operator resolved it, an earlier holder's late success) is
    /// [`Rejected::NotRecorded`], since the slot is decided for good; a
    /// claim taken over or released is `LeaseLost`/`ClaimLost`. One read,
    /// on this rare path only.
    async fn what_became_of_the_claim(&self, via: &mut Via<'_>) -> Rejected {
        let scope = self.facts.slots.scope();
        let row: Result<_, sqlx::Error> = retry::repeat_recording!(via, |conn| {
            store::lookup(
                &mut *conn,
                scope,
                &self.facts.address,
                store::KeptValue::Skip,
            )
            .await
        });
        match row {
            Ok(Some(row))
                if row.fence == self.facts.fence
                    && self.facts.identity.is_stored_as(&row.identity)
                    && matches!(
                        row.state,
                        store::ClaimState::Success | store::ClaimState::Failed
                    )
                    && !row.written_by_its_holder() =>
            {
                Rejected::NotRecorded {
                    address: self.facts.address.clone(),
                    recorded: crate::claim::recorded_by_another(&row),
                }
            }
            _ => self.claim_gone(via),
        }
    }

    /// Finds a step without a marker (a repeatable one) in what the run
    /// read of its claim's steps, reading them first if the run has not:
    /// replays it if recorded, runs it otherwise. No statement of its own
    /// but that one read per run.
    async fn begin_unmarked(
        &self,
        ambient: &Ambient,
        connection: Option<usize>,
        via: &mut Via<'_>,
    ) -> Result<Begun, Rejected> {
        let read = ambient
            .read
            .get_or_try_init(|| async {
                let scope = self.facts.slots.scope();
                let (claim, fence) = (self.facts.address.as_str(), self.facts.fence);
                let read: Result<_, sqlx::Error> = retry::repeat_recording!(via, |conn| {
                    store::steps_for_replay(&mut *conn, scope, claim, fence).await
                });
                let read = read.map_err(Rejected::from_store)?;
                if !read.held {
                    // In a transaction, a connection that does not see
                    // the claim is the wrong one: what it read is not kept
                    // for a step given the right one.
                    let lost = self.lost(ambient, via).await;
                    if via.in_transaction() {
                        return Err(lost);
                    }
                } else if via.in_transaction() {
                    ambient.lock().verified = connection;
                }
                Ok(Mutex::new(read.steps.into_iter().collect()))
            })
            .await?;
        // In a transaction, a step given another connection than the one
        // that read the claim as its holder's is checked before it runs (a
        // wrong one would run it with nothing to record it on).
        if via.in_transaction() && ambient.lock().verified != connection {
            if !self.claim_still_ours(via).await? {
                return Err(self.claim_gone(via));
            }
            ambient.lock().verified = connection;
        }
        let row = lock(read).remove(&self.address);
        match row {
            Some(row) if row.identity != self.canonical => Err(Rejected::Collision {
                address: self.address.clone(),
            }),
            Some(row) if row.state == StepState::Success => Ok(Begun::Replay(row.value())),
            // Recorded steps are replayed to a holder that lost its claim
            // (what the new holder recorded is what it finds); no step
            // runs under a claim that is no longer its holder's.
            _ if ambient.lock().lost.is_some() => Err(self.lost(ambient, via).await),
            None => Ok(Begun::Run),
            // A marker: a holder was cut off inside it (or the step was not
            // repeatable then). Its record goes over the marker.
            Some(_) => Ok(Begun::Rerun),
        }
    }

    /// Inserts the step's marker, or finds its row: replays a recorded
    /// step, runs a new one, and refuses one whose holder was cut off
    /// inside it.
    async fn begin(&self, ambient: &Ambient, via: &mut Via<'_>) -> Result<Begun, Rejected> {
        let scope = self.facts.slots.scope();
        // The step finished last, if its record waits, rides with the
        // first attempt ([`Carried`]).
        let mut carried = ambient.ride().await;
        for _ in 0..BEGIN_ATTEMPTS {
            let began: Result<bool, Rejected> = match carried.take() {
                Some(carried) => {
                    let written: Result<_, sqlx::Error> = retry::repeat_recording!(via, |conn| {
                        store::record_and_begin_step(
                            &mut *conn,
                            scope,
                            &self.address,
                            self.new_step(),
                            carried.record(),
                        )
                        .await
                    });
                    match written {
                        Ok(written) => {
                            ambient.carried_landed(&carried, written.recorded).await;
                            Ok(written.begun)
                        }
                        // The record still waits, and is written on its
                        // own: by its timer, or at the run's end.
                        Err(error) => Err(Rejected::from_store(error)),
                    }
                }
                None => {
                    let began: Result<bool, sqlx::Error> = retry::repeat_recording!(via, |conn| {
                        store::begin_step(&mut *conn, scope, &self.address, self.new_step()).await
                    });
                    began.map_err(Rejected::from_store)
                }
            };
            if began? {
                return Ok(Begun::Run);
            }
            let row: Result<_, sqlx::Error> = retry::repeat_recording!(via, |conn| {
                store::lookup_step(&mut *conn, scope, &self.address, &self.facts.address).await
            });
            let Some(row) = row.map_err(Rejected::from_store)? else {
                // No row, and no marker of ours went in: the claim is no
                // longer this holder's, unless a cut-off holder's marker
                // went in between (then look again).
                if self.claim_still_ours(via).await? {
                    continue;
                }
                return Err(self.lost(ambient, via).await);
            };
            if row.identity != self.canonical {
                return Err(Rejected::Collision {
                    address: self.address.clone(),
                });
            }
            match row.state {
                StepState::Success => {
                    return Ok(Begun::Replay(row.value()));
                }
                // Ours: an earlier begin of this very step whose reply was
                // lost (a name begun twice in one run was refused above).
                StepState::Pending if row.fence == self.facts.fence => return Ok(Begun::Run),
                StepState::Pending => {
                    if !self.claim_still_ours(via).await? {
                        return Err(self.lost(ambient, via).await);
                    }
                    return Err(Rejected::StepInDoubt {
                        step: self.name.to_owned(),
                        why: "an earlier run was cut off inside it, so nobody knows what it did",
                    });
                }
            }
        }
        Err(self.lost(ambient, via).await)
    }

    /// Records the step's value: over its marker (`marked`), or as its
    /// row, in one statement, for a step without one. `Err`: it is not
    /// recorded.
    async fn record(
        &self,
        json: &str,
        marked: bool,
        ambient: &Ambient,
        via: &mut Via<'_>,
    ) -> Result<Recorded, Rejected> {
        let scope = self.facts.slots.scope();
        let (fence, commit) = (self.facts.fence, self.facts.commit);
        let claim = self.facts.address.as_str();
        let recorded: Result<bool, sqlx::Error> = if marked {
            retry::repeat_recording!(via, |conn| {
                store::record_step(&mut *conn, scope, &self.address, fence, claim, json, commit)
                    .await
            })
        } else {
            retry::repeat_recording!(via, |conn| {
                store::record_unmarked_step(
                    &mut *conn,
                    scope,
                    &self.address,
                    self.new_step(),
                    json,
                    commit,
                )
                .await
            })
        };
        if recorded.map_err(Rejected::from_store)? {
            return Ok(Recorded::Ours);
        }
        self.wrote_nothing(json, ambient, via).await
    }

    /// What became of the step's value `json` when the statement that
    /// was to record it wrote nothing.
    async fn wrote_nothing(
        &self,
        json: &str,
        ambient: &Ambient,
        via: &mut Via<'_>,
    ) -> Result<Recorded, Rejected> {
        let scope = self.facts.slots.scope();
        let fence = self.facts.fence;
        // Wrote nothing: recorded by an earlier attempt whose reply was
        // lost; or recorded by another holder (one that took the claim
        // over, or, for a step without a marker, one cut off inside it
        // whose record landed since this run read its row); or the claim
        // is no longer ours.
        let row: Result<_, sqlx::Error> = retry::repeat_recording!(via, |conn| {
            store::lookup_step(&mut *conn, scope, &self.address, &self.facts.address).await
        });
        match row.map_err(Rejected::from_store)? {
            Some(row)
                if row.state == StepState::Success
                    && row.fence == fence
                    && row.output.as_deref() == Some(json) =>
            {
                Ok(Recorded::Ours)
            }
            Some(row) if row.state == StepState::Success && row.identity == self.canonical => {
                // One value per step: the recorded one. Recorded by a
                // newer holder, or by a reconciler or an operator (under
                // this holder's fence, with another value): the claim is
                // most likely no longer ours, and no later step runs if
                // it is not.
                let ours = row.fence <= fence && self.claim_still_ours(via).await.unwrap_or(false);
                if !ours {
                    self.lost(ambient, via).await;
                }
                Ok(Recorded::Theirs(row.value()))
            }
            _ => Err(self.lost(ambient, via).await),
        }
    }

    /// Removes the marker of a step that failed, so a later run runs it
    /// again. Should that fail, the marker stays: a later run finds the step
    /// in doubt, which is safe.
    /// `false`: the marker may still be there.
    async fn abandon(&self, via: &mut Via<'_>) -> bool {
        let scope = self.facts.slots.scope();
        let (fence, commit) = (self.facts.fence, self.facts.commit);
        let claim = self.facts.address.as_str();
        let abandoned: Result<bool, sqlx::Error> = retry::repeat_recording!(via, |conn| {
            store::abandon_step(&mut *conn, scope, &self.address, fence, claim, commit).await
        });
        if let Err(error) = &abandoned {
            tracing::warn!(
                target: "idem",
                action = self.facts.identity.action(),
                step = self.name,
                error = %error,
                "a step's marker could not be removed: a later run will find the step in doubt"
            );
        }
        // `Ok(false)`: no marker of this holder's is there (it was never
        // inserted, or a holder that took the claim over retook it).
        abandoned.is_ok()
    }

    /// Whether the claim is still pending under this holder's fence.
    async fn claim_still_ours(&self, via: &mut Via<'_>) -> Result<bool, Rejected> {
        let scope = self.facts.slots.scope();
        let row: Result<_, sqlx::Error> = retry::repeat_recording!(via, |conn| {
            store::lookup(
                &mut *conn,
                scope,
                &self.facts.address,
                store::KeptValue::Skip,
            )
            .await
        });
        Ok(row.map_err(Rejected::from_store)?.is_some_and(|row| {
            row.fence == self.facts.fence && row.state == store::ClaimState::Pending
        }))
    }

    /// The claim is no longer this holder's: taken over or released. In a
    /// transaction it cannot be (it has no lease, and a release waits for
    /// the row's lock): the connection given is not the claim's
    /// transaction, which alone sees it.
    fn claim_gone(&self, via: &Via<'_>) -> Rejected {
        if via.in_transaction() {
            return Rejected::WrongConnection {
                called: "a step given a connection other than its claim's transaction",
                instead: "give it the transaction the claim was made in, \
                          idem::step(name, future).on(&mut *tx); the step did not run",
            };
        }
        self.facts.lease.lost(&self.facts.address)
    }
}
