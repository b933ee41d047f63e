//! The guard: one builder for every way to guard a call by hand, and what
//! `#[idempotent]` expands to.
//!
//! [`Gate::guard`] starts a [`Guard`] for one identity. Its methods are the
//! attribute's options, and it ends in [`run`](Guard::run) (run a body if
//! the claim is won, then record what it returned) or in
//! [`claim`](Guard::claim) (hand the won claim to the caller, who records
//! the outcome). Its type changes where a bound does, so a combination the
//! attribute refuses does not compile by hand either:
//!
//! | option | changes | then |
//! |---|---|---|
//! | [`replay`](Guard::replay) | `R` to [`Replay`] | the body's `Ok` type must be serde; a duplicate gets the stored value |
//! | [`disposition`](Guard::disposition) | `D` to [`Classified`] | each `Err` is released, kept or held in doubt as the classifier says |
//! | [`tx`](Guard::tx) | `P` to [`InTx`] | claim and record inside the caller's transaction: no lease, wait, fail-open or asynchronous commit |
//! | [`lease`](Guard::lease) | `P` to [`Leased`] | no `tx`, no asynchronous commit; [`on_expiry`](Guard::on_expiry) becomes possible |
//! | [`outcome_commit`](Guard::outcome_commit) | `P` to [`AsyncCommit`] | no `tx`, no lease |
//! | [`wait`](Guard::wait), [`on_unavailable`](Guard::on_unavailable) | `P` to [`Pooled`] (unless already on the pool) | no `tx` |
//! | [`fingerprint`](Guard::fingerprint) | nothing | |
//! | [`keep_value_for`](Guard::keep_value_for), [`keep_slot_for`](Guard::keep_slot_for) | nothing | how long the value, and the slot, outlive the outcome (for ever unless set) |
//!
//! An option given twice takes the second value (the attribute refuses a
//! repeated option; by hand it is a rebinding, as with sqlx's `bind`).
//! The ends: on the pool, [`run`](Guard::run), [`run_detached`](Guard::run_detached)
//! (the body outlives a caller that leaves), [`claim`](Guard::claim) (a
//! [`Claim`]) and, with `replay`, [`claim_or_replay`](Guard::claim_or_replay);
//! after [`tx`](Guard::tx), `run` with a body handed the
//! transaction's connection, and `claim` (a [`TxClaim`],
//! recorded on that connection). [`Gate::guard_batch`] is the same guard
//! over a [`Batch`](crate::batch::Batch) of items.
//!
//! ```no_run
//! # async fn demo(gate: idem_runtime::Gate) -> Result<(), idem_runtime::Rejected> {
//! use std::time::Duration;
//! use idem_runtime::{Disposition, Identity, Rejected};
//!
//! let id = Identity::new("charge").part("ord_1001").part(4_999);
//! let receipt: Result<String, Rejected> = gate
//!     .guard(&id)
//!     .lease(Duration::from_secs(30))
//!     .replay()
//!     .disposition(|_: &Rejected| Disposition::Release)
//!     .run(async { Ok("r_1".to_owned()) })
//!     .await;
//! # let _ = receipt?; Ok(()) }
//! ```

use std::fmt;
use std::marker::PhantomData;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgConnection;

use crate::acquire::{Acquired, KeptValue, acquire};
use crate::claim::Claim;
use crate::detach::{self, Detached};
use crate::error::Rejected;
use crate::gate::Gate;
use crate::identity::Identity;
use crate::mode::{Disposition, Fingerprint, Mode, OnExpiry, OnUnavailable, OutcomeCommit};
use crate::run::{
    self, GuardedResult, OutcomeOf, ReplayableResult, outcome_of, replayed_outcome_of,
};
use crate::step::Ambient;
use crate::via::Via;

mod batch;
pub use batch::BatchGuard;

/// A call about to be guarded: the gate, the identity and the options so
/// far. Built by [`Gate::guard`]; see [the module docs](crate::guard) for
/// the options and how each changes the type.
///
/// - `R`: whether a duplicate of a settled call is handed the stored value
///   ([`Replay`]) or refused [`Rejected::AlreadyDone`] ([`NoReplay`]).
/// - `D`: what an `Err` means for the slot: released ([`ReleaseAll`]) or
///   as a classifier says ([`Classified`]).
/// - `P`: where the claim is made and which options are still open:
///   [`Anywhere`], [`Pooled`], [`Leased`], [`AsyncCommit`], [`InTx`].
#[must_use = "a guard does nothing until `.run(..)` or `.claim()` is awaited"]
pub struct Guard<'a, R = NoReplay, D = ReleaseAll, P = Anywhere> {
    gate: &'a Gate,
    identity: &'a Identity,
    mode: Mode,
    replay: PhantomData<R>,
    classify: D,
    place: P,
}

/// `R` of a [`Guard`]: a duplicate of a settled call is refused
/// [`Rejected::AlreadyDone`].
#[derive(Debug, Clone, Copy, Default)]
pub struct NoReplay;

/// `R` of a [`Guard`]: the `Ok` value is kept (as JSON, in the settle's
/// own statement) and a duplicate of a settled call is handed it without
/// running. See [`Guard::replay`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Replay;

/// `D` of a [`Guard`]: every `Err` releases the slot, so a retry runs.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReleaseAll;

/// `D` of a [`Guard`]: each `Err` is recorded as the classifier `F` says
/// (a `Fn(&E) -> Disposition`). See [`Guard::disposition`].
#[derive(Clone, Copy)]
pub struct Classified<F>(F);

/// `P` of a [`Guard`]: nothing chosen yet that decides where the claim is
/// made; it is made on the gate's pool unless [`tx`](Guard::tx) is given.
#[derive(Debug, Clone, Copy, Default)]
pub struct Anywhere;

/// `P` of a [`Guard`]: on the pool, because of an option only a pooled
/// claim has ([`wait`](Guard::wait), [`on_unavailable`](Guard::on_unavailable)).
#[derive(Debug, Clone, Copy, Default)]
pub struct Pooled;

/// `P` of a [`Guard`]: on the pool, with a [lease](Guard::lease).
#[derive(Debug, Clone, Copy, Default)]
pub struct Leased;

/// `P` of a [`Guard`]: on the pool, its outcome committed asynchronously
/// ([`outcome_commit`](Guard::outcome_commit)).
#[derive(Debug, Clone, Copy, Default)]
pub struct AsyncCommit;

/// `P` of a [`Guard`]: inside the caller's transaction on this connection
/// ([`tx`](Guard::tx)).
pub struct InTx<'c>(&'c mut PgConnection);

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::NoReplay {}
    impl Sealed for super::Replay {}
    impl Sealed for super::ReleaseAll {}
    impl<F> Sealed for super::Classified<F> {}
    impl Sealed for super::Anywhere {}
    impl Sealed for super::Pooled {}
    impl Sealed for super::Leased {}
    impl Sealed for super::AsyncCommit {}
    impl Sealed for super::InTx<'_> {}
}

/// What a body's output `O` means under replay policy `Self`
/// ([`NoReplay`] or [`Replay`]): how it is refused, whether it succeeded,
/// and, with [`Replay`], how its `Ok` value is kept.
#[diagnostic::on_unimplemented(
    message = "`replay` keeps the `Ok` value for later duplicates, so the body must return `Result<T, E>` with `T: serde::Serialize + serde::de::DeserializeOwned` and `E: From<idem::Rejected>`; `{O}` is not such a `Result`",
    label = "the body's output here",
    note = "derive `serde::Serialize` and `serde::Deserialize` for the `Ok` type, or drop `replay` (duplicates then get `Rejected::AlreadyDone`)"
)]
pub trait ReplayPolicy<O>: sealed::Sealed {
    #[doc(hidden)]
    fn __outcome() -> OutcomeOf<'static, O>;
}

// A body whose output does not fit is reported through the bound it misses,
// `GuardedResult` or `ReplayableResult`, whose messages say how to fix it.
impl<O: GuardedResult> ReplayPolicy<O> for NoReplay {
    fn __outcome() -> OutcomeOf<'static, O> {
        outcome_of()
    }
}

impl<O: ReplayableResult> ReplayPolicy<O> for Replay {
    fn __outcome() -> OutcomeOf<'static, O> {
        replayed_outcome_of()
    }
}

/// What a failed output `O` means for its slot under `Self`
/// ([`ReleaseAll`] or [`Classified`]).
#[diagnostic::on_unimplemented(
    message = "the classifier given to `disposition` must take the body's error: `Fn(&E) -> Disposition` for a body returning `Result<T, E>`; `{O}` does not fit it",
    label = "the body's output here",
    note = "write the classifier for the body's error type, e.g. `.disposition(|error: &MyError| match error {{ .. }})`"
)]
pub trait Classify<O>: sealed::Sealed {
    #[doc(hidden)]
    fn __disposition(&self, output: &O) -> Disposition;
}

impl<O> Classify<O> for ReleaseAll {
    fn __disposition(&self, _: &O) -> Disposition {
        Disposition::Release
    }
}

impl<T, E, F: Fn(&E) -> Disposition> Classify<Result<T, E>> for Classified<F> {
    fn __disposition(&self, output: &Result<T, E>) -> Disposition {
        output.as_ref().err().map_or(Disposition::Release, &self.0)
    }
}

/// A place a [`wait`](Guard::wait) or an
/// [`on_unavailable`](Guard::on_unavailable) fits: any claim made on the pool.
#[diagnostic::on_unimplemented(
    message = "`wait` and `on_unavailable` cannot be combined with `tx`: inside your transaction the claim is invisible until it commits, so duplicates already wait for it, and a store that is down has taken your transaction with it",
    label = "this guard claims inside your transaction",
    note = "drop the option, or claim outside the transaction (drop `.tx(..)`)"
)]
pub trait PoolOption: sealed::Sealed {
    /// Where the claim is made after the option.
    type Pooled;
    #[doc(hidden)]
    fn __pooled(self) -> Self::Pooled;
}

impl PoolOption for Anywhere {
    type Pooled = Pooled;
    fn __pooled(self) -> Pooled {
        Pooled
    }
}

/// A place already on the pool stays where it is.
macro_rules! stays_pooled {
    ($($place:ident),*) => {$(
        impl PoolOption for $place {
            type Pooled = $place;
            fn __pooled(self) -> $place {
                self
            }
        }
    )*};
}

stays_pooled!(Pooled, Leased, AsyncCommit);

/// A place a [`lease`](Guard::lease) fits: a pooled claim whose outcome
/// commits durably.
#[diagnostic::on_unimplemented(
    message = "a `lease` cannot be combined with `{Self}`: with `tx` the claim is invisible until your transaction commits, so no lease can run out; with an asynchronous outcome commit a settle lost in a crash would leave the claim pending, and once its lease ran out a duplicate would run the action again",
    label = "this guard cannot take a lease",
    note = "drop the lease, or the option it conflicts with (`.tx(..)` or `.outcome_commit(..)`)"
)]
pub trait LeaseOption: sealed::Sealed {}
impl LeaseOption for Anywhere {}
impl LeaseOption for Pooled {}
impl LeaseOption for Leased {}

/// A place an asynchronous [`outcome_commit`](Guard::outcome_commit) fits:
/// a pooled claim without a lease.
#[diagnostic::on_unimplemented(
    message = "`outcome_commit` cannot be combined with `{Self}`: with `tx` the outcome commits with your transaction, your own writes included; with a lease a settle lost in a crash would leave the claim pending, and once its lease ran out a duplicate would run the action again",
    label = "this guard cannot commit its outcome asynchronously",
    note = "drop `outcome_commit`, or the option it conflicts with (`.tx(..)` or `.lease(..)`)"
)]
pub trait OutcomeCommitOption: sealed::Sealed {}
impl OutcomeCommitOption for Anywhere {}
impl OutcomeCommitOption for Pooled {}
impl OutcomeCommitOption for AsyncCommit {}

/// A place whose claim is made on the gate's pool: every `P` but [`InTx`].
pub trait OnPool: sealed::Sealed {}
impl OnPool for Anywhere {}
impl OnPool for Pooled {}
impl OnPool for Leased {}
impl OnPool for AsyncCommit {}

impl Gate {
    /// Starts guarding a call on `identity`: add options, then
    /// [`run`](Guard::run) a body or take the [`claim`](Guard::claim).
    /// See [`guard`](crate::guard) for the options.
    ///
    /// ```no_run
    /// # async fn demo(gate: idem_runtime::Gate) -> Result<(), idem_runtime::Rejected> {
    /// use idem_runtime::{Identity, Rejected};
    ///
    /// let id = Identity::new("charge").part("ord_1001");
    /// let receipt: Result<String, Rejected> = gate
    ///     .guard(&id)
    ///     .replay()
    ///     .run(async { Ok("r_1".to_owned()) })
    ///     .await;
    /// # let _ = receipt; Ok(()) }
    /// ```
    pub fn guard<'a>(&'a self, identity: &'a Identity) -> Guard<'a> {
        Guard {
            gate: self,
            identity,
            mode: Mode::new(),
            replay: PhantomData,
            classify: ReleaseAll,
            place: Anywhere,
        }
    }
}

impl<'a, R, D, P> Guard<'a, R, D, P> {
    /// The same guard with its `P` turned into another.
    fn placed<Q>(self, place: impl FnOnce(P) -> Q) -> Guard<'a, R, D, Q> {
        Guard {
            gate: self.gate,
            identity: self.identity,
            mode: self.mode,
            replay: self.replay,
            classify: self.classify,
            place: place(self.place),
        }
    }

    /// A payload fingerprint: a duplicate whose fingerprint differs from
    /// the claim's is refused [`Rejected::KeyReused`] (the same key sent
    /// with another payload), never run or handed another's value. The
    /// attribute's `fingerprint = "..."`.
    pub fn fingerprint(mut self, fingerprint: Fingerprint) -> Guard<'a, R, D, P> {
        self.mode = self.mode.fingerprint(fingerprint);
        self
    }

    /// Keeps the value a success returned (for [`replay`](Guard::replay);
    /// a stored HTTP response) and the payload's
    /// [`fingerprint`](Guard::fingerprint) for `window` after the outcome
    /// is recorded, instead of for ever. Past it the slot still refuses
    /// every duplicate, but a caller that replays is told
    /// [`Rejected::ValueNotKept`] instead of handed the value, whatever its
    /// payload. `idem prune` then compacts the claim: it deletes the value,
    /// the fingerprint and the steps, and keeps of the identity only an
    /// 8-byte check of it (its slot still refuses duplicates and a
    /// colliding identity; the row no longer says which action and key it
    /// was). The attribute's `keep_value_for = "..."`.
    ///
    /// For values that should not live for ever (personal data, large
    /// responses) while the action must still never run twice. The window
    /// is the action's own: it is written with the claim, so a prune
    /// enforces what each action said when it ran, and is judged by the
    /// database's clock from the statement that records the outcome. With
    /// [`tx`](Guard::tx), that statement runs inside your transaction: the
    /// window counts from it, not from your commit, so a transaction left
    /// open after `run` returns shortens the window by as long (commit
    /// promptly, or keep the window far longer than your transactions).
    /// Within a [`keep_slot_for`](Guard::keep_slot_for)
    /// window it ends with the slot at the latest. More than zero and at
    /// most [`MAX_WINDOW`](crate::MAX_WINDOW), or every claim is refused
    /// [`Rejected::InvalidOption`] before any statement runs.
    pub fn keep_value_for(mut self, window: Duration) -> Guard<'a, R, D, P> {
        self.mode = self.mode.keep_value_for(window);
        self
    }

    /// Holds the slot of a recorded outcome (a success, or a failure kept
    /// with [`Disposition::Keep`]) for `window`
    /// after it is recorded, instead of for ever: past it the next
    /// invocation with the same identity **runs again**, as a new action
    /// (its steps run anew), and `idem prune` deletes the row. The
    /// attribute's `keep_slot_for = "..."`; the HTTP layer says when a
    /// response's key expires in its `Idempotency-Key-Expires` header.
    ///
    /// Opt in only where a key is reused on purpose after a while, or
    /// where a provider's own window is the contract (Stripe keeps keys 24
    /// hours, Adyen 31 days): say the window in your API's documentation,
    /// as the IETF draft asks. Within it, nothing runs twice, whatever
    /// prunes meanwhile: expiry is judged by the database's clock against
    /// the window written with the claim, counted from the statement that
    /// recorded the outcome (with [`tx`](Guard::tx), inside your
    /// transaction, not at its commit: see
    /// [`keep_value_for`](Guard::keep_value_for)). A claim still pending or in
    /// doubt never expires (its lease and its reconciler govern it). More
    /// than zero and at most [`MAX_WINDOW`](crate::MAX_WINDOW), or every
    /// claim is refused [`Rejected::InvalidOption`] before any statement
    /// runs.
    pub fn keep_slot_for(mut self, window: Duration) -> Guard<'a, R, D, P> {
        self.mode = self.mode.keep_slot_for(window);
        self
    }

    /// An ordered event: the call is an event of `entity` at `order`
    /// (greater is newer: an integer, or a [`SystemTime`](std::time::SystemTime);
    /// see [`EventOrder`](crate::EventOrder)). It still runs at most once
    /// by its own identity, and besides:
    ///
    /// - **an older event never runs after a newer one**: an event whose
    ///   order is below the newest applied for its entity is refused
    ///   [`Rejected::Superseded`] without running. An event of equal order
    ///   is not older: it runs (once, by its own key).
    /// - **events of one entity never run at once**: while one runs (or
    ///   its outcome is in doubt), every other event of the entity is
    ///   refused [`Rejected::InFlight`] (with [`wait`](Guard::wait), waits
    ///   for it), so its redelivery comes after the outcome is in.
    ///
    /// "Applied" is a recorded success: the holder's settle, an earlier
    /// holder's late success, a reconciler's or an operator's resolution
    /// as succeeded. A failure that is released (the default) or kept
    /// ([`Disposition::Keep`]) applied nothing:
    /// the entity stays where it was, and an older event may still run. An
    /// outcome in doubt holds the entity until it is resolved, since it
    /// may have applied (fail closed: nothing older runs meanwhile, and
    /// nothing newer runs beside what it may be doing). A lease that runs
    /// out leaves the entity with the event whose lease it was, for its
    /// own retry to take over: from then on the first holder is counted
    /// gone, for its entity as for its slot (it is told
    /// [`Rejected::LeaseLost`] when it ends, and its success is applied).
    /// An event whose claim an operator released while it ran applied
    /// nothing, unless its body then succeeds: it is told
    /// [`Rejected::ClaimLost`], and its success is recorded and applied.
    /// Inside your transaction ([`tx`](Guard::tx)) the entity is taken
    /// with the claim and handed back if the transaction rolls back, and
    /// other events of it wait for your commit, then see it.
    ///
    /// It costs the claim one more row (the entity's, in the same account
    /// and namespace) locked and written in the same statement: no round
    /// trip. On a table Citus distributes, which routes no one statement
    /// that does both, the entity is taken and the event claimed by two
    /// statements routed to the account's worker and committed together:
    /// on the gate's pool, four round trips (`BEGIN`, the two, `COMMIT`)
    /// where one PostgreSQL takes one; inside your transaction, two. A new
    /// entity costs one statement more. The attribute's `entity = "..."`
    /// and `order = "..."`.
    ///
    /// Refused [`Rejected::InvalidOption`] before any statement runs: an
    /// `order` beyond an `i64` (a `u64` above `i64::MAX`); an `entity`, or
    /// the event's own identity, that is absent (a `None` part: an ordered
    /// event never runs ungated); with
    /// [`keep_slot_for`](Guard::keep_slot_for) (the slot of an ordered
    /// event is kept for ever: its entity's order is judged from it); with
    /// [`OnUnavailable::Run`] (run unguarded, it would be neither
    /// deduplicated nor ordered). In a [batch](crate::batch): an item
    /// added with [`Batch::push_ordered`](crate::batch::Batch::push_ordered).
    /// Not in the HTTP layer.
    ///
    /// ```no_run
    /// # async fn demo(gate: idem_runtime::Gate) -> Result<(), idem_runtime::Rejected> {
    /// use idem_runtime::{Identity, Rejected};
    ///
    /// // A webhook: `evt_42` moved subscription `sub_7` to version 12.
    /// let event = Identity::new("subscription_event").part("evt_42");
    /// let subscription = Identity::new("subscription").part("sub_7");
    /// let applied: Result<(), Rejected> = gate
    ///     .guard(&event)
    ///     .ordered(&subscription, 12)
    ///     .run(async { /* write version 12 of sub_7 */ Ok(()) })
    ///     .await;
    /// match applied {
    ///     // A newer event was applied: this one has nothing left to do.
    ///     Ok(()) | Err(Rejected::Superseded) | Err(Rejected::AlreadyDone) => {}
    ///     // Another event of sub_7 is running: redeliver this one later.
    ///     Err(other) => return Err(other),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn ordered<O>(mut self, entity: &Identity, order: O) -> Guard<'a, R, D, P>
    where
        O: TryInto<crate::EventOrder>,
        O::Error: std::fmt::Display,
    {
        let order = order.try_into().map_err(|error| error.to_string());
        self.mode = self.mode.ordered(entity.clone(), order);
        self
    }

    /// Waits up to `wait` for an in-flight duplicate to finish, then takes
    /// its outcome (the stored value with replay, [`Rejected::AlreadyDone`],
    /// [`Rejected::AlreadyFailed`], [`Rejected::InDoubt`], or its slot, if
    /// it released), instead of refusing at once with
    /// [`Rejected::InFlight`]; past `wait`, it is refused `InFlight`. The
    /// attribute's `wait = "..."`. Not with [`tx`](Guard::tx) (why: there).
    ///
    /// A holder in this process (this gate or a copy of it) hands its
    /// outcome to its waiters as it records it: no statement, no polling
    /// but a look once a second (the slot can change without its holder: a
    /// stuck holder's lease runs out and a retry takes it over, or an
    /// earlier holder's late success lands on it). A holder in another
    /// process wakes its waiters with a notification it sends only
    /// because they marked its claim as waited on: the waiter listens (one
    /// connection per gate, outside its pool, while any of its calls
    /// waits), marks the claim once, and looks once a second too, so a
    /// lost wake-up costs at most that; where it cannot listen, it polls,
    /// every 10 ms backing off to 250 ms. A holder that goes without
    /// recording (dropped, taken over, the store failing) sends its
    /// waiters back to the store at once: no waiter is left hanging.
    pub fn wait(mut self, wait: Duration) -> Guard<'a, R, D, P::Pooled>
    where
        P: PoolOption,
    {
        self.mode = self.mode.wait(wait);
        self.placed(P::__pooled)
    }

    /// What a claim does when the store is down: refuse
    /// ([`OnUnavailable::Refuse`], the default: fail closed) or run the body
    /// unguarded ([`OnUnavailable::Run`]: fail open, for actions where a
    /// duplicate costs less than a missed run). The attribute's
    /// `on_unavailable = "run"`. Not with [`tx`](Guard::tx) (why: there).
    pub fn on_unavailable(mut self, policy: OnUnavailable) -> Guard<'a, R, D, P::Pooled>
    where
        P: PoolOption,
    {
        self.mode = self.mode.on_unavailable(policy);
        self.placed(P::__pooled)
    }

    /// A lease: a claim whose holder has not recorded an outcome within
    /// `lease` is taken over by the next duplicate with a higher fencing
    /// token (or held in doubt, with [`on_expiry`](Guard::on_expiry)). The
    /// previous holder's late release changes nothing, and its late settle
    /// only ever records the success it reports (never undoing one), then
    /// tells it [`Rejected::LeaseLost`]. The attribute's `lease = "..."`.
    /// Not with [`tx`](Guard::tx) nor an asynchronous
    /// [`outcome_commit`](Guard::outcome_commit) (why: [`Guard::tx`],
    /// [`OutcomeCommit::Async`]).
    ///
    /// `lease` must be more than zero (a lease of zero would let every
    /// duplicate take the claim over at once) and at most
    /// [`MAX_LEASE`](crate::MAX_LEASE); otherwise the call is refused
    /// [`Rejected::InvalidOption`] before any statement runs (never as an
    /// outage, so never failing open).
    pub fn lease(mut self, lease: Duration) -> Guard<'a, R, D, Leased>
    where
        P: LeaseOption,
    {
        self.mode = self.mode.lease(lease);
        self.placed(|_| Leased)
    }

    /// How the outcome commits: durably (the default) or asynchronously
    /// ([`OutcomeCommit::Async`]: one WAL flush less per call; a crash may
    /// lose the outcome, which leaves the slot closed, never open). The
    /// attribute's `outcome_commit = "async"`. Not with [`tx`](Guard::tx) or
    /// a [`lease`](Guard::lease) (why: [`Guard::tx`],
    /// [`OutcomeCommit::Async`]): the guard's type closes both whatever
    /// the value, so write it only to choose `Async` (`Durable` is the
    /// default).
    pub fn outcome_commit(mut self, commit: OutcomeCommit) -> Guard<'a, R, D, AsyncCommit>
    where
        P: OutcomeCommitOption,
    {
        self.mode = self.mode.outcome_commit(commit);
        self.placed(|_| AsyncCommit)
    }
}

impl<'a, R, D> Guard<'a, R, D, Leased> {
    /// What a claim whose lease ran out becomes: taken over by the next
    /// duplicate ([`OnExpiry::TakeOver`], the default) or held in doubt
    /// ([`OnExpiry::InDoubt`]) until a reconciler or an operator finds out.
    /// Recorded with the claim: a claim made with `InDoubt` is held in
    /// doubt whatever the duplicate that finds it says (see [`OnExpiry`]).
    /// The attribute's `on_expiry = "..."`; only after a
    /// [`lease`](Guard::lease).
    pub fn on_expiry(mut self, on_expiry: OnExpiry) -> Guard<'a, R, D, Leased> {
        self.mode = self.mode.on_expiry(on_expiry);
        self
    }
}

impl<'a, R, D> Guard<'a, R, D, Anywhere> {
    /// Claims and records inside the caller's transaction on `connection`
    /// (a `&mut Transaction<'_, Postgres>` coerces to it): the claim, the
    /// body's own writes and the outcome commit or roll back together. The
    /// attribute's `tx = ...`.
    ///
    /// A concurrent duplicate in another transaction waits for this one to
    /// finish, then is refused if it committed, or claims the slot if it
    /// rolled back. Under `REPEATABLE READ` or `SERIALIZABLE`, such a
    /// duplicate fails with a serialization error instead, reported as
    /// [`Rejected::Unavailable`]: retry its whole transaction. A claim made
    /// outside any transaction and still in flight refuses this guard
    /// [`Rejected::InFlight`] at once: there is no waiting here.
    ///
    /// An outcome that cannot be recorded inside the transaction (a
    /// statement of the body's failed and aborted it, even if the body
    /// swallowed the error; its connection was lost) is returned as that
    /// refusal, never as the body's `Ok`: the transaction can no longer
    /// commit, and sqlx reports the `COMMIT` of an aborted transaction as a
    /// success although PostgreSQL rolled it back. Retry the whole
    /// transaction.
    ///
    /// Only before [`lease`](Guard::lease), [`wait`](Guard::wait),
    /// [`on_unavailable`](Guard::on_unavailable) and
    /// [`outcome_commit`](Guard::outcome_commit), none of which can be
    /// combined with it (the attribute refuses them too, the tower layer
    /// and the batch guard take these same methods): inside the caller's
    /// transaction the claim is invisible to every other session until it
    /// commits, so a duplicate already waits for it (there is nothing for
    /// `wait` to add) and **no lease can run out**; a store that is down has
    /// taken the transaction with it, so there is nothing to fail open to
    /// (`on_unavailable`); and an asynchronous outcome commit would set
    /// `synchronous_commit = off` for the caller's whole transaction, its
    /// own writes included.
    pub fn tx<'c>(self, connection: &'c mut PgConnection) -> Guard<'a, R, D, InTx<'c>> {
        self.placed(|_| InTx(connection))
    }
}

impl<'a, D, P> Guard<'a, NoReplay, D, P> {
    /// Keeps the body's `Ok` value (as JSON, in the settle's own
    /// statement) so that a later duplicate is handed it without running.
    /// A duplicate while the first is in flight is still refused (or
    /// waits, with [`wait`](Guard::wait)). The attribute's `replay`.
    ///
    /// The value is kept as the text `serde_json` writes. A value that
    /// fails to serialize, or that the store refuses (larger than
    /// PostgreSQL takes), never loses the success: the claim is settled
    /// without a value, a tracing error says so, and duplicates are refused
    /// with [`Rejected::AlreadyDone`]. So is a duplicate whose stored value
    /// no longer deserializes, and one whose fingerprint differs in
    /// presence from the stored one.
    pub fn replay(self) -> Guard<'a, Replay, D, P> {
        Guard {
            gate: self.gate,
            identity: self.identity,
            mode: self.mode,
            replay: PhantomData,
            classify: self.classify,
            place: self.place,
        }
    }
}

impl<'a, R, P> Guard<'a, R, ReleaseAll, P> {
    /// Records each `Err` as `classify` says of it: released (a retry
    /// runs), kept as a definite failure (duplicates are refused
    /// [`Rejected::AlreadyFailed`]), or held in doubt (duplicates are
    /// refused [`Rejected::InDoubt`] until a reconciler or an operator
    /// resolves it). The attribute's `disposition = path`: any
    /// `fn(&E) -> Disposition`, such as `.disposition(MyError::disposition)`.
    pub fn disposition<F>(self, classify: F) -> Guard<'a, R, Classified<F>, P> {
        Guard {
            gate: self.gate,
            identity: self.identity,
            mode: self.mode,
            replay: self.replay,
            classify: Classified(classify),
            place: self.place,
        }
    }
}

/// What the run loop is told of a body's output `O` under replay policy
/// `R` and classifier `D`: one guard or each item of a batch.
fn outcome_for<'d, R, D, O>(classify: D) -> OutcomeOf<'d, O>
where
    R: ReplayPolicy<O>,
    D: Classify<O> + Send + Sync + 'd,
{
    R::__outcome().disposed_by(move |output: &O| classify.__disposition(output))
}

impl<'a, R, D, P: OnPool> Guard<'a, R, D, P> {
    /// Runs `body` if this call wins the claim: settles the claim when the
    /// body returns `Ok` (keeping the value, with [`replay`](Guard::replay)),
    /// records an `Err` as the [`disposition`](Guard::disposition) says
    /// (by default: released, so a retry can run), and refuses duplicates
    /// with [`Rejected`] converted into `E`.
    ///
    /// The body is not polled unless the claim is won. If it panics, or its
    /// future is dropped, the claim stays pending: the outcome is unknown, so
    /// retries are refused (fail closed; see [`detach`] for a
    /// body that runs to completion instead). If the store fails to record the
    /// success, the body's `Ok` value is still returned, the claim stays
    /// pending, and a tracing error says so. If the claim was no longer this
    /// call's when the body succeeded (its lease ran out and another call
    /// took it over, or someone released it), the success is still kept in
    /// the slot, but the call returns [`Rejected::LeaseLost`] or
    /// [`Rejected::ClaimLost`] instead of the value: another call may have
    /// run the action too, so check the side effect before acting on it.
    /// If somebody else recorded the claim's outcome meanwhile (a reconciler
    /// or an operator resolved it, an earlier holder's late success settled
    /// it), the call returns [`Rejected::NotRecorded`]: the slot keeps that
    /// outcome, and every duplicate is told it, not this body's value. So
    /// does an `Err` that was to hold the slot ([`Disposition::Keep`] or
    /// [`Disposition::InDoubt`], with a [`disposition`](Guard::disposition));
    /// an `Err` that releases it said nothing happened, and is returned as
    /// it is.
    pub async fn run<O, F>(self, body: F) -> O
    where
        F: IntoFuture<Output = O>,
        R: ReplayPolicy<O>,
        D: Classify<O> + Send + Sync,
    {
        self.__check::<O>().__run(body).await
    }

    /// [`run`](Guard::run), with a body that runs to completion whatever
    /// its caller does: the claim, the body and the record run as a task of
    /// `detached`'s, so dropping this future (a client that disconnected, a
    /// timeout around it) does not cancel the body wherever it was. See
    /// [`detach`] for its bound, its shutdown and its lease. The body must be
    /// `Send + 'static`; it needs a tokio runtime.
    pub async fn run_detached<O, F>(self, detached: &Detached, body: F) -> O
    where
        F: Future<Output = O> + Send + 'static,
        O: Send + 'static,
        R: ReplayPolicy<O>,
        D: Classify<O> + Send + Sync + 'static,
    {
        let outcome = outcome_for::<R, D, O>(self.classify);
        detach::run_detached(
            detached,
            self.gate.slots().clone(),
            self.identity.clone(),
            self.mode,
            outcome,
            body,
        )
        .await
    }

    /// Tries for the claim and, when it is won, hands it over: the caller
    /// runs the action and records its outcome with [`Claim::settle`],
    /// [`Claim::release`] or [`Claim::dispose`]. A duplicate is refused
    /// ([`Rejected::InFlight`], [`Rejected::AlreadyDone`], ...); a store
    /// error is [`Rejected::Unavailable`] (fail closed). An absent identity
    /// (a `None` key part) yields an ungated claim whose records do nothing.
    pub async fn claim(self) -> Result<Claim, Rejected>
    where
        R: PlainClaim,
    {
        let mut via = Via::Pool(self.gate.pool());
        won(acquire(
            self.gate.slots(),
            self.identity,
            &self.mode,
            KeptValue::Skip,
            &mut via,
        )
        .await?)
    }
}

impl<'a, D, P: OnPool> Guard<'a, Replay, D, P> {
    /// [`claim`](Guard::claim) with replay: a duplicate of a settled call
    /// whose value was kept ([`Claim::settle_value`]) gets
    /// [`ClaimOrReplay::Replayed`] with it, instead of
    /// [`Rejected::AlreadyDone`].
    pub async fn claim_or_replay<T>(self) -> Result<ClaimOrReplay<T, Claim>, Rejected>
    where
        T: serde::de::DeserializeOwned,
    {
        let mut via = Via::Pool(self.gate.pool());
        let acquired = acquire(
            self.gate.slots(),
            self.identity,
            &self.mode,
            KeptValue::Read,
            &mut via,
        )
        .await?;
        replayed(acquired, self.identity, |claim| claim)
    }
}

/// How [`Guard::claim`] answers a duplicate of a settled call: only
/// [`NoReplay`] guards have `claim`; a [`Replay`] guard has
/// [`claim_or_replay`](Guard::claim_or_replay), which can hand back the
/// stored value.
#[diagnostic::on_unimplemented(
    message = "a `replay` guard ends in `claim_or_replay::<T>()`, not `claim()`: a duplicate of a settled call may be handed the stored value instead of a claim",
    label = "`claim` on a guard with `replay`",
    note = "call `.claim_or_replay::<T>()` and match `ClaimOrReplay::Won(claim)` / `ClaimOrReplay::Replayed(value)`, or drop `.replay()`"
)]
pub trait PlainClaim: sealed::Sealed {}
impl PlainClaim for NoReplay {}

/// A won claim, or `AlreadyDone` for a duplicate of a settled call.
fn won(acquired: Acquired) -> Result<Claim, Rejected> {
    match acquired {
        Acquired::Won(claim) => Ok(claim),
        Acquired::Settled(_) => Err(Rejected::AlreadyDone),
    }
}

/// A won claim, or the value a settled call kept: what
/// [`Guard::claim_or_replay`] returns.
#[derive(Debug)]
pub enum ClaimOrReplay<T, C> {
    /// This caller won the claim: run the action, then record its outcome.
    Won(C),
    /// The call already succeeded and kept this value
    /// ([`Claim::settle_value`]): return it, do not run.
    Replayed(T),
}

/// A won claim or the stored value of `acquired`; `AlreadyDone` when the
/// settled call kept none, or it no longer reads back as `T`.
fn replayed<T, C>(
    acquired: Acquired,
    identity: &Identity,
    wrap: impl FnOnce(Claim) -> C,
) -> Result<ClaimOrReplay<T, C>, Rejected>
where
    T: serde::de::DeserializeOwned,
{
    match acquired {
        Acquired::Won(claim) => Ok(ClaimOrReplay::Won(wrap(claim))),
        Acquired::Settled(None) => Err(Rejected::AlreadyDone),
        Acquired::Settled(Some(json)) => match serde_json::from_str(&json) {
            Ok(value) => Ok(ClaimOrReplay::Replayed(value)),
            Err(error) => {
                tracing::warn!(
                    target: "idem",
                    action = identity.action(),
                    error = %error,
                    "the stored value no longer reads back as the requested type; refusing the \
                     duplicate as already done"
                );
                Err(Rejected::AlreadyDone)
            }
        },
    }
}

impl<'a, 'c, R, D> Guard<'a, R, D, InTx<'c>> {
    /// Runs `body` on the transaction's connection if this call wins the
    /// claim, then records its outcome in the same transaction: the claim,
    /// the body's writes and the outcome commit or roll back together.
    /// Otherwise as [`run`](Guard::run) on the pool.
    ///
    /// ```no_run
    /// # async fn demo(gate: idem_runtime::Gate, pool: idem_runtime::sqlx::PgPool) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    /// use idem_runtime::{Identity, sqlx::PgConnection};
    ///
    /// type Error = Box<dyn std::error::Error + Send + Sync>;
    /// let mut tx = pool.begin().await?;
    /// let id = Identity::new("credit").part("ord_1001");
    /// let credited: Result<(), Error> = gate
    ///     .guard(&id)
    ///     .tx(&mut tx)
    ///     .run(async |conn: &mut PgConnection| {
    ///         idem_runtime::sqlx::query("UPDATE wallets SET cents = cents + 100 WHERE id = 1")
    ///             .execute(conn)
    ///             .await?;
    ///         Ok(())
    ///     })
    ///     .await;
    /// credited?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub async fn run<O, F>(self, body: F) -> O
    where
        F: AsyncFnOnce(&mut PgConnection) -> O,
        R: ReplayPolicy<O>,
        D: Classify<O> + Send + Sync,
    {
        let connection = &mut *self.place.0;
        let outcome = outcome_for::<R, D, O>(self.classify);
        let mut via = Via::Transaction(&mut *connection);
        let want_value = outcome.replays();
        let claim = match acquire(
            self.gate.slots(),
            self.identity,
            &self.mode,
            KeptValue::read_if(want_value),
            &mut via,
        )
        .await
        {
            Ok(Acquired::Won(claim)) => claim,
            Ok(Acquired::Settled(stored)) => return outcome.settled(self.identity, stored),
            Err(rejected) => return outcome.refused(rejected),
        };
        let steps = Ambient::of_tx_claim(claim.held(), self.identity, self.gate.slots());
        let output = steps.around(body(&mut *connection)).await;
        outcome
            .record(
                claim,
                output,
                Some(&steps),
                &mut Via::Transaction(connection),
            )
            .await
    }

    /// Tries for the claim inside the transaction and, when it is won,
    /// hands it over as a [`TxClaim`], whose outcome is recorded on the
    /// same transaction. Otherwise as [`claim`](Guard::claim) on the pool.
    pub async fn claim(self) -> Result<TxClaim, Rejected>
    where
        R: PlainClaim,
    {
        let mut via = Via::Transaction(self.place.0);
        won(acquire(
            self.gate.slots(),
            self.identity,
            &self.mode,
            KeptValue::Skip,
            &mut via,
        )
        .await?)
        .map(TxClaim)
    }
}

impl<'a, 'c, D> Guard<'a, Replay, D, InTx<'c>> {
    /// [`claim`](Guard::claim) inside the transaction, with replay: a
    /// duplicate of a settled call whose value was kept
    /// ([`TxClaim::settle_value`]) gets [`ClaimOrReplay::Replayed`].
    pub async fn claim_or_replay<T>(self) -> Result<ClaimOrReplay<T, TxClaim>, Rejected>
    where
        T: serde::de::DeserializeOwned,
    {
        let mut via = Via::Transaction(self.place.0);
        let acquired = acquire(
            self.gate.slots(),
            self.identity,
            &self.mode,
            KeptValue::Read,
            &mut via,
        )
        .await?;
        replayed(acquired, self.identity, TxClaim)
    }
}

/// A claim won inside the caller's transaction ([`Guard::tx`] then
/// [`claim`](Guard::claim)). Its outcome is recorded on that transaction's
/// connection, so it commits or rolls back with it; there is no way to
/// record it through the pool (which would wait forever on the row the open
/// transaction holds). Dropped unrecorded, the row stays pending until the
/// transaction ends: a commit keeps it pending (fail closed), a rollback
/// removes it.
#[must_use = "a claim must be settled or released; dropped, it keeps its slot pending"]
#[derive(Debug)]
pub struct TxClaim(Claim);

impl TxClaim {
    /// `false` when nothing was claimed (an absent identity).
    pub fn is_gated(&self) -> bool {
        self.0.is_gated()
    }

    /// The claimed address, if anything was claimed.
    pub fn address(&self) -> Option<&str> {
        self.0.address()
    }

    /// The fencing token (see [`Claim::fence`]).
    pub fn fence(&self) -> Option<i64> {
        self.0.fence()
    }

    /// Records success on `connection`, the claim's transaction: it takes
    /// effect when that commits. See [`Claim::settle`].
    pub async fn settle(self, connection: &mut PgConnection) -> Result<(), Rejected> {
        self.0
            .settle_on(None, &mut Via::Transaction(connection))
            .await
    }

    /// Records success keeping `value` for replay (see
    /// [`Claim::settle_value`]), on the claim's transaction.
    pub async fn settle_value<T: serde::Serialize + serde::de::DeserializeOwned>(
        self,
        connection: &mut PgConnection,
        value: &T,
    ) -> Result<(), Rejected> {
        let json = crate::stored_value::for_replay(self.0.address(), value);
        self.0
            .settle_on(json.as_deref(), &mut Via::Transaction(connection))
            .await
    }

    /// Records failure on the claim's transaction: the row is deleted, so a
    /// retry can run. See [`Claim::release`].
    pub async fn release(self, connection: &mut PgConnection) -> Result<(), Rejected> {
        self.dispose(connection, Disposition::Release).await
    }

    /// Records a failure as `disposition` says, on the claim's transaction.
    /// See [`Claim::dispose`].
    pub async fn dispose(
        self,
        connection: &mut PgConnection,
        disposition: Disposition,
    ) -> Result<(), Rejected> {
        self.0
            .dispose_via(disposition, &mut Via::Transaction(connection))
            .await
    }
}

impl<'a, R, D, P> Guard<'a, R, D, P> {
    /// The attribute's terminal, first half: every bound the body's output
    /// `O` must meet, checked here and only here, so a return type that
    /// does not fit fails once, at the type (the expansion spans this call
    /// there). Then [`Checked::__run`] or [`Checked::__enter`], which can
    /// no longer fail to type-check. Not a stable API.
    #[doc(hidden)]
    pub fn __check<'d, O>(self) -> Checked<'a, 'd, P, O>
    where
        R: ReplayPolicy<O>,
        D: Classify<O> + Send + Sync + 'd,
    {
        Checked {
            gate: self.gate,
            identity: self.identity,
            mode: self.mode,
            place: self.place,
            outcome: outcome_for::<R, D, O>(self.classify),
        }
    }
}

/// A guard whose body's output `O` was checked ([`Guard::__check`]): what
/// the attribute runs. Not a stable API.
#[doc(hidden)]
pub struct Checked<'a, 'd, P, O> {
    gate: &'a Gate,
    identity: &'a Identity,
    mode: Mode,
    place: P,
    outcome: OutcomeOf<'d, O>,
}

impl<P: OnPool, O> Checked<'_, '_, P, O> {
    /// [`Guard::run`], its bounds already met.
    #[doc(hidden)]
    pub async fn __run<F: IntoFuture<Output = O>>(self, body: F) -> O {
        run::run(
            self.gate.slots(),
            self.identity,
            &self.mode,
            self.outcome,
            body.into_future(),
        )
        .await
    }
}

impl<'d, O> Checked<'_, 'd, InTx<'_>, O> {
    /// The attribute's `tx` mode, before the body: claims inside the
    /// transaction, and lets go of the connection, which the body then
    /// writes through under its own name. `Break` carries what the function
    /// returns instead of running its body (a refusal, or a replayed value).
    #[doc(hidden)]
    pub async fn __enter(self) -> ControlFlow<O, Entered<'d, O>> {
        let mut via = Via::Transaction(self.place.0);
        let want_value = self.outcome.replays();
        match acquire(
            self.gate.slots(),
            self.identity,
            &self.mode,
            KeptValue::read_if(want_value),
            &mut via,
        )
        .await
        {
            Ok(Acquired::Won(claim)) => ControlFlow::Continue(Entered {
                steps: Ambient::of_tx_claim(claim.held(), self.identity, self.gate.slots()),
                claim,
                outcome: self.outcome,
            }),
            Ok(Acquired::Settled(stored)) => {
                ControlFlow::Break(self.outcome.settled(self.identity, stored))
            }
            Err(rejected) => ControlFlow::Break(self.outcome.refused(rejected)),
        }
    }
}

/// The attribute's `tx` mode between claim and record: the won claim and
/// what the body's output means. Not a stable API.
#[doc(hidden)]
pub struct Entered<'d, O> {
    claim: Claim,
    outcome: OutcomeOf<'d, O>,
    /// What the body's steps see, and saw.
    steps: Arc<Ambient>,
}

impl<O> Entered<'_, O> {
    /// Runs the body, its steps under the claim.
    #[doc(hidden)]
    pub async fn __around<F: Future<Output = O>>(&self, body: F) -> O {
        self.steps.around(body).await
    }

    /// After the body: records `output` inside the transaction on
    /// `connection`, and returns what the function returns.
    #[doc(hidden)]
    pub async fn __finish(self, output: O, connection: &mut PgConnection) -> O {
        self.outcome
            .record(
                self.claim,
                output,
                Some(&self.steps),
                &mut Via::Transaction(connection),
            )
            .await
    }
}

impl<R, D, P> fmt::Debug for Guard<'_, R, D, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guard")
            .field("gate", self.gate)
            .field("identity", self.identity)
            .field("mode", &self.mode)
            .field("replay", &std::any::type_name::<R>())
            .field("place", &std::any::type_name::<P>())
            .finish_non_exhaustive()
    }
}

impl<F> fmt::Debug for Classified<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Classified(..)")
    }
}

impl fmt::Debug for InTx<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("InTx(..)")
    }
}
