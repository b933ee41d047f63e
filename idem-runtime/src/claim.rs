//! Winning a slot, and recording what became of it.
//!
//! A claim is won by the insert. On conflict, one lookup tells the caller why
//! (in flight, done, someone else's payload), and may find a lease that ran
//! out, which is then taken over with a compare-and-swap on its fence.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, PgPool, Postgres};

use crate::error::Rejected;
use crate::fault::{self, Fault};
use crate::gate::Gate;
use crate::identity::Identity;
use crate::mode::{self, Mode, OnUnavailable, OutcomeCommit};
use crate::observe::{self, GateEvent};
use crate::retry::{self, SERIALIZATION_BACKOFF};
use crate::store::{self, Commit, LateSuccess, NewClaim};

/// How often a claim re-tries, without `wait`, when the slot it lost is free
/// again by the time it looks (the holder failed and released in between).
const CLAIM_ATTEMPTS: usize = 3;

/// How often a holder whose claim is no longer its own tries to record its
/// success in the slot, when the slot changes under it between the look and
/// the write. Each miss means another claim or release of this very slot
/// landed within one round trip, so a few are plenty; should every one miss,
/// the error says the success could not be kept.
const LATE_SUCCESS_ATTEMPTS: usize = 8;

/// Pauses between attempts to record an outcome (settle or release), which
/// are idempotent and worth a retry when a pooled connection died under them.
const RECORD_BACKOFF: [Duration; 2] = [Duration::from_millis(25), Duration::from_millis(100)];

/// Polling interval of a waiting duplicate: it starts short, since most
/// bodies are short, and backs off to spare the store.
const WAIT_FIRST_POLL: Duration = Duration::from_millis(10);
const WAIT_LONGEST_POLL: Duration = Duration::from_millis(250);

/// The pauses before repeating a statement sent through `via`: `pauses`,
/// or none inside the caller's transaction, which a failed statement has
/// aborted (only the caller can retry it, whole).
fn backoff(via: &Via<'_>, pauses: &'static [Duration]) -> &'static [Duration] {
    if via.in_transaction() { &[] } else { pauses }
}

/// A tracing event about one slot, with the fields every gate event carries
/// (account, namespace, action, address), then any others and the message.
macro_rules! slot_event {
    ($level:ident, $gate:expr, $identity:expr, $address:expr, $($rest:tt)+) => {
        tracing::$level!(
            target: "idem",
            account = $gate.account_name(),
            namespace = $gate.namespace_name(),
            action = $identity.action(),
            address = %$address,
            $($rest)+
        )
    };
}

/// Where the statements run: a pooled connection each (autocommit), or the
/// caller's transaction.
pub(crate) enum Via<'c> {
    Pool(&'c PgPool),
    Transaction(&'c mut PgConnection),
}

/// A connection for one statement.
pub(crate) enum Conn<'a> {
    Pooled(PoolConnection<Postgres>),
    Borrowed(&'a mut PgConnection),
}

impl Via<'_> {
    pub(crate) async fn connection(&mut self) -> Result<Conn<'_>, sqlx::Error> {
        match self {
            Via::Pool(pool) => pool.acquire().await.map(Conn::Pooled),
            Via::Transaction(connection) => Ok(Conn::Borrowed(connection)),
        }
    }

    fn in_transaction(&self) -> bool {
        matches!(self, Via::Transaction(_))
    }
}

impl Deref for Conn<'_> {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        match self {
            Conn::Pooled(pooled) => pooled,
            Conn::Borrowed(connection) => connection,
        }
    }
}

impl DerefMut for Conn<'_> {
    fn deref_mut(&mut self) -> &mut PgConnection {
        match self {
            Conn::Pooled(pooled) => pooled,
            Conn::Borrowed(connection) => connection,
        }
    }
}

/// The result of trying for a slot.
pub(crate) enum Acquired {
    /// This caller runs the body.
    Won(Claim),
    /// The action already succeeded; its stored value, when asked for and
    /// kept (and the payload is known to match).
    Settled(Option<String>),
}

/// A slot this caller now holds: its fence, and the lineage (the fence the
/// claim began with, which a takeover keeps).
#[derive(Debug, Clone, Copy)]
struct Won {
    fence: i64,
    lineage: i64,
    took_over: bool,
}

/// One claim statement (and, when a row it could not see stopped it, one
/// lookup).
enum Attempt {
    Won(Won),
    Settled(Option<String>),
    /// Pending under someone else, lease (if any) not run out.
    Held,
    /// Gone between the insert and the lookup, or taken over by another.
    Freed,
    Refused(Rejected),
}

impl Gate {
    /// Tries for the slot of `identity` as `mode` says.
    pub(crate) async fn acquire(
        &self,
        identity: &Identity,
        mode: &Mode,
        want_output: bool,
        via: &mut Via<'_>,
    ) -> Result<Acquired, Rejected> {
        if identity.is_absent() {
            tracing::info!(
                target: "idem",
                account = self.account_name(),
                namespace = self.namespace_name(),
                action = identity.action(),
                absent_part = identity.first_absent_part(),
                "ungated: a key part is None, so there is no slot to claim and the body runs unguarded"
            );
            observe::record(GateEvent::Ungated);
            return Ok(Acquired::Won(Claim { held: None }));
        }
        let address = identity.address();
        let lease_micros = self
            .check_scope()
            .and_then(|()| mode.lease_micros())
            .inspect_err(|rejected| self.refused(identity, &address, rejected))?;
        let fingerprint = mode.payload_fingerprint().map(|f| f.digest());
        let new = NewClaim {
            identity: identity.canonical(),
            fingerprint: fingerprint.as_ref().map(|f| f.as_slice()),
            lease_micros,
        };
        // `None` inside: a wait too long for the clock to hold, so unbounded.
        let deadline = mode
            .wait_duration()
            .map(|wait| Instant::now().checked_add(wait));
        let waiting = |deadline: Option<Option<Instant>>| {
            deadline.is_some_and(|until| until.is_none_or(|until| Instant::now() < until))
        };
        let mut poll = WAIT_FIRST_POLL;
        let mut freed = 0;
        // A claim rolled back by a serialization failure or deadlock is sent
        // again; one whose connection died is not (its insert may have
        // committed, and a retry would find its own row and report it as
        // somebody else's invocation in flight). Inside the caller's
        // transaction a failed statement aborts it, so only the caller can
        // retry (the whole transaction).
        let on_repeat = |error: &sqlx::Error, pause: Duration| {
            slot_event!(debug, self, identity, address, error = %error, ?pause,
                "claim rolled back by a serialization failure; trying again"
            );
            observe::record(GateEvent::Retried);
        };
        loop {
            let attempt = retry::repeat!(
                backoff(via, &SERIALIZATION_BACKOFF),
                retry::is_serialization_failure,
                on_repeat,
                self.attempt(via, &address, identity, new, want_output)
                    .await,
            );
            let attempt = match attempt {
                Ok(attempt) => attempt,
                // Only an outage may fail open: an error of the request would
                // meet every call, and run every body unguarded.
                Err(error)
                    if mode.on_unavailable_policy() == OnUnavailable::Run
                        && fault::classify(&error) == Fault::Outage =>
                {
                    slot_event!(warn, self, identity, address, error = %error,
                        "store unavailable; failing open as on_unavailable = run says: the body runs unguarded"
                    );
                    observe::record(GateEvent::Ungated);
                    return Ok(Acquired::Won(Claim { held: None }));
                }
                Err(error) => return Err(self.store_failed(identity, &address, error)),
            };
            match attempt {
                Attempt::Won(won) => {
                    let Won {
                        fence,
                        lineage,
                        took_over,
                    } = won;
                    slot_event!(
                        debug,
                        self,
                        identity,
                        address,
                        fence,
                        took_over,
                        "claim won"
                    );
                    if took_over {
                        observe::record(GateEvent::TookOver);
                    }
                    observe::record(GateEvent::Won);
                    return Ok(Acquired::Won(Claim {
                        held: Some(Held {
                            gate: self.clone(),
                            identity: identity.clone(),
                            fingerprint,
                            address,
                            fence,
                            lineage,
                            leased: mode.lease_duration().is_some(),
                            lease_ends: Mutex::new(
                                mode.lease_duration()
                                    .and_then(|lease| Instant::now().checked_add(lease)),
                            ),
                            in_transaction: via.in_transaction(),
                            // Never under a lease or in the caller's
                            // transaction: see OutcomeCommit::Async.
                            commit: match mode.outcome_commit_policy() {
                                OutcomeCommit::Async
                                    if mode.lease_duration().is_none() && !via.in_transaction() =>
                                {
                                    Commit::Async
                                }
                                _ => Commit::Durable,
                            },
                        }),
                    }));
                }
                Attempt::Settled(Some(output)) => {
                    slot_event!(
                        debug,
                        self,
                        identity,
                        address,
                        "duplicate of a settled action: replaying its stored value"
                    );
                    observe::record(GateEvent::Replayed);
                    return Ok(Acquired::Settled(Some(output)));
                }
                Attempt::Settled(None) => {
                    self.refused(identity, &address, &Rejected::AlreadyDone);
                    return Ok(Acquired::Settled(None));
                }
                Attempt::Refused(rejected) => {
                    self.refused(identity, &address, &rejected);
                    return Err(rejected);
                }
                // Freed: try again at once, a few times.
                Attempt::Freed if freed + 1 < CLAIM_ATTEMPTS => {
                    freed += 1;
                }
                // Held (or freed on every attempt) while a wait is not over:
                // pause, then look again.
                Attempt::Held | Attempt::Freed if waiting(deadline) => {
                    freed = 0;
                    let remaining = deadline
                        .flatten()
                        .map_or(poll, |d| d.saturating_duration_since(Instant::now()));
                    tokio::time::sleep(poll.min(remaining)).await;
                    poll = (poll * 2).min(WAIT_LONGEST_POLL);
                }
                // Still held, or the slot changed hands on every attempt.
                Attempt::Held | Attempt::Freed => {
                    self.refused(identity, &address, &Rejected::InFlight);
                    return Err(Rejected::InFlight);
                }
            }
        }
    }

    async fn attempt(
        &self,
        via: &mut Via<'_>,
        address: &str,
        identity: &Identity,
        new: NewClaim<'_>,
        want_output: bool,
    ) -> Result<Attempt, sqlx::Error> {
        let scope = self.scope();
        // One connection for the whole attempt: every acquire may cost a
        // round trip of its own (the pool's liveness check).
        let mut conn = via.connection().await?;
        let existing = match store::claim(&mut *conn, scope, address, new, want_output).await? {
            store::Claimed::Won(fence) => {
                return Ok(Attempt::Won(Won {
                    fence,
                    lineage: fence,
                    took_over: false,
                }));
            }
            store::Claimed::Held(existing) => existing,
            // Stopped by a row the statement could not see: look again,
            // with a new snapshot, to tell the caller why.
            store::Claimed::Hidden => {
                match store::lookup(&mut *conn, scope, address, want_output).await? {
                    Some(existing) => existing,
                    // The holder failed and released in between: the slot
                    // is free again.
                    None => return Ok(Attempt::Freed),
                }
            }
        };
        if existing.identity != identity.canonical() {
            return Ok(Attempt::Refused(Rejected::Collision {
                address: address.to_owned(),
            }));
        }
        // A stored value goes only to a caller whose payload is known to
        // match: both gave the same fingerprint, or neither gave one. Either
        // side without one makes the payloads incomparable: the duplicate is
        // told the action is done, and is not handed the value.
        let replayable = match (new.fingerprint, existing.fingerprint.as_deref()) {
            (Some(ours), Some(theirs)) if ours != theirs => {
                return Ok(Attempt::Refused(Rejected::KeyReused));
            }
            (ours, theirs) => ours.is_some() == theirs.is_some(),
        };
        if existing.settled {
            return Ok(Attempt::Settled(existing.output.filter(|_| replayable)));
        }
        if existing.lease_expired {
            let taken = store::take_over(&mut *conn, scope, address, existing.fence, new).await?;
            return Ok(match taken {
                Some(taken) => {
                    slot_event!(
                        warn,
                        self,
                        identity,
                        address,
                        previous_fence = existing.fence,
                        fence = taken.fence,
                        "lease ran out: claim taken over from its previous holder"
                    );
                    Attempt::Won(Won {
                        fence: taken.fence,
                        lineage: taken.lineage,
                        took_over: true,
                    })
                }
                None => Attempt::Freed,
            });
        }
        Ok(Attempt::Held)
    }

    pub(crate) fn refused(&self, identity: &Identity, address: &str, rejected: &Rejected) {
        slot_event!(
            info,
            self,
            identity,
            address,
            reason = rejected.reason(),
            "claim refused: {rejected}"
        );
        observe::record(GateEvent::Refused(rejected.clone()));
    }

    /// A claim statement failed: an outage, or an error of the request.
    fn store_failed(&self, identity: &Identity, address: &str, error: sqlx::Error) -> Rejected {
        let rejected = Rejected::from_store(error);
        if rejected.is_outage() {
            slot_event!(error, self, identity, address, error = %rejected,
                "store unavailable; failing closed, the body does not run"
            );
        } else {
            slot_event!(error, self, identity, address, error = %rejected,
                "store refused the claim (not an outage); the body does not run"
            );
        }
        observe::record(GateEvent::Refused(rejected.clone()));
        rejected
    }
}

/// A won slot (or, for an absent identity or a fail-open run, no slot at
/// all). Record the outcome with [`settle`](Claim::settle) or
/// [`release`](Claim::release); dropping it unresolved leaves the row
/// pending, which refuses every retry until its lease (if any) runs out or an
/// operator resolves it.
#[must_use = "a claim must be settled or released; dropped, it keeps its slot pending"]
pub struct Claim {
    held: Option<Held>,
}

struct Held {
    gate: Gate,
    identity: Identity,
    /// The payload's fingerprint, kept with a late success.
    fingerprint: Option<[u8; 20]>,
    address: String,
    fence: i64,
    /// The fence the claim began with: ours, or the one of the claim we took
    /// over. A row that still carries it was taken over, not released.
    lineage: i64,
    leased: bool,
    /// When the lease runs out, by this process's clock (`None`: no lease).
    /// Only to tell, when the claim is gone, a lease that ran out (and was
    /// taken over, then released) from a claim removed under a live lease.
    lease_ends: Mutex<Option<Instant>>,
    /// Inside the caller's transaction, the transaction decides: a dropped
    /// claim is rolled back with it, so there is nothing to warn about.
    in_transaction: bool,
    /// How the outcome commits.
    commit: Commit,
}

/// What a holder is recording.
#[derive(Debug, Clone, Copy)]
enum Outcome<'a> {
    Success { output: Option<&'a str> },
    Failure,
}

impl Claim {
    /// `false` when nothing was claimed (an absent identity, or the store was
    /// down and the mode fails open).
    pub fn is_gated(&self) -> bool {
        self.held.is_some()
    }

    /// The claimed address, if anything was claimed.
    pub fn address(&self) -> Option<&str> {
        self.held.as_ref().map(|held| held.address.as_str())
    }

    /// The fencing token: higher for every later claim or takeover of any
    /// slot. Pass it to external systems that can reject stale writers.
    pub fn fence(&self) -> Option<i64> {
        self.held.as_ref().map(|held| held.fence)
    }

    /// Records success: the row becomes `success` and keeps the slot forever.
    ///
    /// If the store fails, the row stays `pending` (fail closed): retries
    /// are refused rather than risk running the action twice; the error is
    /// [`Rejected::Unavailable`] (an outage) or [`Rejected::StoreRefused`].
    /// If the claim is no longer this holder's, the success is still
    /// recorded in the slot unless it is already settled (a success that
    /// happened is never forgotten), and the error says what happened:
    /// [`Rejected::LeaseLost`] (its lease ran out and another invocation
    /// took it over) or [`Rejected::ClaimLost`] (someone released or removed
    /// it).
    pub async fn settle(self) -> Result<(), Rejected> {
        let Some(pool) = self.pool() else {
            return Ok(());
        };
        self.finish(Outcome::Success { output: None }, &mut Via::Pool(&pool))
            .await
    }

    /// Records failure: the row is deleted, so a retry can run the action.
    ///
    /// If the store fails, the row stays `pending` (fail closed). If the
    /// claim was taken over, nothing changes and the error is
    /// [`Rejected::LeaseLost`]: the new holder decides. A claim that is gone
    /// already (released by someone else, or by an earlier attempt of this
    /// release whose reply was lost) counts as released.
    pub async fn release(self) -> Result<(), Rejected> {
        let Some(pool) = self.pool() else {
            return Ok(());
        };
        self.finish(Outcome::Failure, &mut Via::Pool(&pool)).await
    }

    /// [`settle`](Claim::settle) inside the caller's transaction (for a claim
    /// made with [`Gate::claim_in`]): it takes effect when that commits.
    pub async fn settle_in(self, connection: &mut PgConnection) -> Result<(), Rejected> {
        self.finish(
            Outcome::Success { output: None },
            &mut Via::Transaction(connection),
        )
        .await
    }

    /// [`release`](Claim::release) inside the caller's transaction.
    pub async fn release_in(self, connection: &mut PgConnection) -> Result<(), Rejected> {
        self.finish(Outcome::Failure, &mut Via::Transaction(connection))
            .await
    }

    /// Renews the lease to `lease` from now, for bodies that run long.
    ///
    /// A claim made without a lease holds until it is resolved: there is
    /// nothing to renew, and it stays unexpirable. `lease` is checked as
    /// [`Mode::lease`] checks it ([`Rejected::InvalidOption`]).
    /// [`Rejected::LeaseLost`] if the claim was taken over meanwhile.
    pub async fn extend(&self, lease: Duration) -> Result<(), Rejected> {
        let Some(held) = &self.held else {
            return Ok(());
        };
        let micros = mode::lease_micros(lease)?;
        if !held.leased {
            return Ok(());
        }
        let extended = retry::repeat!(
            RECORD_BACKOFF,
            retry::is_transient,
            |_, _| {},
            async {
                let mut conn = held.gate.pool().acquire().await?;
                store::extend(
                    &mut *conn,
                    held.gate.scope(),
                    &held.address,
                    held.fence,
                    micros,
                )
                .await
            }
            .await,
        );
        match extended {
            Ok(true) => {
                *held
                    .lease_ends
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = Instant::now().checked_add(lease);
                Ok(())
            }
            Ok(false) => {
                let lost = Rejected::LeaseLost {
                    address: held.address.clone(),
                };
                held.event(
                    tracing::Level::ERROR,
                    "lease extension found the claim taken over",
                    Some(&lost),
                );
                Err(lost)
            }
            Err(error) => Err(Rejected::from_store(error)),
        }
    }

    /// The pool of the gate that made this claim, if anything was claimed.
    fn pool(&self) -> Option<PgPool> {
        self.held.as_ref().map(|held| held.gate.pool().clone())
    }

    /// Settles the claim, keeping `output` (the `Ok` value for replay).
    pub(crate) async fn settle_with(
        self,
        output: Option<&str>,
        via: &mut Via<'_>,
    ) -> Result<(), Rejected> {
        self.finish(Outcome::Success { output }, via).await
    }

    /// Releases the claim.
    pub(crate) async fn release_via(self, via: &mut Via<'_>) -> Result<(), Rejected> {
        self.finish(Outcome::Failure, via).await
    }

    /// Records `outcome` through `via`, and reports it.
    async fn finish(mut self, outcome: Outcome<'_>, via: &mut Via<'_>) -> Result<(), Rejected> {
        let Some(held) = self.held.take() else {
            return Ok(());
        };
        let recorded = held.record(outcome, via).await;
        match (&recorded, outcome) {
            (Ok(()), Outcome::Success { .. }) => {
                held.event(tracing::Level::DEBUG, "settled", None);
                observe::record(GateEvent::Settled);
            }
            (Ok(()), Outcome::Failure) => {
                held.event(tracing::Level::DEBUG, "released", None);
                observe::record(GateEvent::Released);
            }
            (Err(rejected), _) => {
                let message = match rejected {
                    Rejected::LeaseLost { .. } | Rejected::ClaimLost { .. } => match outcome {
                        Outcome::Success { .. } => {
                            "the claim was no longer this holder's when its success was recorded; \
                             the success is kept in the slot unless it was settled already"
                        }
                        Outcome::Failure => {
                            "the claim was taken over before its release: the new holder decides"
                        }
                    },
                    _ => match outcome {
                        Outcome::Success { .. } => {
                            "settle failed; the slot stays pending (fail closed) until resolved"
                        }
                        Outcome::Failure => {
                            "release failed; the slot stays pending (fail closed) until resolved"
                        }
                    },
                };
                held.event(tracing::Level::ERROR, message, Some(rejected));
                observe::record(GateEvent::Unrecorded(rejected.clone()));
            }
        }
        recorded
    }
}

impl Held {
    /// Records `outcome`: the statement, retried after a transient failure;
    /// a success whose value the store refuses, again without the value;
    /// and, when it matched no row of ours, what became of the claim.
    async fn record(&self, outcome: Outcome<'_>, via: &mut Via<'_>) -> Result<(), Rejected> {
        let mut attempt = self.record_once(outcome, via).await;
        // Inside the caller's transaction the failure has aborted it: the
        // claim rolls back with the body's writes, and nothing is lost.
        let carries_a_value = matches!(outcome, Outcome::Success { output: Some(_) });
        if carries_a_value && !via.in_transaction() {
            attempt = match attempt {
                Err(error) if fault::classify(&error) != Fault::Outage => {
                    self.event(
                        tracing::Level::ERROR,
                        "the settle carrying the Ok value for replay was refused (not an \
                         outage); settling without the value, so that the success is kept and \
                         duplicates are refused as already done",
                        Some(&Rejected::from_store(error)),
                    );
                    self.record_once(Outcome::Success { output: None }, via)
                        .await
                }
                other => other,
            };
        }
        match attempt {
            Ok(true) => Ok(()),
            Ok(false) => self.no_longer_ours(outcome, via).await,
            Err(error) => Err(Rejected::from_store(error)),
        }
    }

    /// One settle or release statement, retried after a transient failure
    /// (it is matched on the fence, so a repeat changes nothing). `false`:
    /// no pending row under this fence.
    async fn record_once(
        &self,
        outcome: Outcome<'_>,
        via: &mut Via<'_>,
    ) -> Result<bool, sqlx::Error> {
        let (scope, address, fence, commit) =
            (self.gate.scope(), &*self.address, self.fence, self.commit);
        retry::repeat!(
            backoff(via, &RECORD_BACKOFF),
            retry::is_transient,
            |_, _| {},
            async {
                let mut conn = via.connection().await?;
                match outcome {
                    Outcome::Success { output } => {
                        store::settle(&mut *conn, scope, address, fence, output, commit).await
                    }
                    Outcome::Failure => {
                        store::release(&mut *conn, scope, address, fence, commit).await
                    }
                }
            }
            .await,
        )
    }

    /// The settle or release matched no pending row under this fence: find
    /// out what became of the claim, and make sure a success is kept.
    async fn no_longer_ours(
        &self,
        outcome: Outcome<'_>,
        via: &mut Via<'_>,
    ) -> Result<(), Rejected> {
        match outcome {
            Outcome::Failure => {
                let row = self.look(via).await?;
                self.release_matched_nothing(row.as_ref())
            }
            Outcome::Success { output } => self.keep_success(output, via).await,
        }
    }

    /// A release matched no pending row of ours: it happened (by an earlier
    /// attempt whose reply was lost, or by someone else, the slot then maybe
    /// claimed anew by this or a colliding identity), or it is moot (a late
    /// success of a holder before us settled our row), unless the claim was
    /// taken over: then the new holder decides.
    fn release_matched_nothing(&self, row: Option<&store::Existing>) -> Result<(), Rejected> {
        match row {
            Some(row)
                if row.identity == self.identity.canonical()
                    && row.lineage == self.lineage
                    && row.fence != self.fence =>
            {
                Err(self.lease_lost())
            }
            _ => Ok(()),
        }
    }

    /// A settle matched no pending row of ours: unless an earlier attempt of
    /// it committed, write the success into the slot anyway (over the pending
    /// row that replaced ours, or into the vacant slot), and say what became
    /// of the claim.
    async fn keep_success(&self, output: Option<&str>, via: &mut Via<'_>) -> Result<(), Rejected> {
        for _ in 0..LATE_SUCCESS_ATTEMPTS {
            let (seen, lost) = match self.look(via).await? {
                // Released under us while the body ran, by the holder that
                // took it over or by someone else.
                None if self.lease_ran_out() => (None, self.lease_lost()),
                None => (None, self.claim_lost()),
                // A colliding identity claimed the vacant slot: the success
                // cannot be written there. Said loudly by `finish`.
                Some(row) if row.identity != self.identity.canonical() => {
                    return Err(self.claim_lost());
                }
                // An earlier attempt of this very settle committed.
                Some(row) if row.settled && row.fence == self.fence => return Ok(()),
                Some(row) => {
                    let lost = if row.lineage == self.lineage {
                        self.lease_lost()
                    } else {
                        self.claim_lost()
                    };
                    // Settled already (by a holder after us, or by a late
                    // success of one before us): nothing to add.
                    if row.settled {
                        return Err(lost);
                    }
                    (Some(row.fence), lost)
                }
            };
            if self.keep_late_success(via, seen, output).await? {
                return Err(lost);
            }
        }
        self.event(
            tracing::Level::ERROR,
            "the slot changed under every attempt to keep this success after the claim was \
             lost: it is not recorded, and a retry may run the action again",
            None,
        );
        Err(self.claim_lost())
    }

    /// Writes this holder's success into the slot it no longer holds: over
    /// the pending row last seen with fence `seen`, or into the vacant slot.
    /// `false`: the slot changed between the look and the write.
    async fn keep_late_success(
        &self,
        via: &mut Via<'_>,
        seen: Option<i64>,
        output: Option<&str>,
    ) -> Result<bool, Rejected> {
        let scope = self.gate.scope();
        let late = LateSuccess {
            identity: self.identity.canonical(),
            fingerprint: self.fingerprint.as_ref().map(|f| f.as_slice()),
            output,
        };
        let address = &*self.address;
        // Both are safe to repeat: the first is matched on the fence seen,
        // the second inserts only into a vacant slot.
        let written: Result<bool, sqlx::Error> = retry::repeat!(
            backoff(via, &RECORD_BACKOFF),
            retry::is_transient,
            |_, _| {},
            async {
                let mut conn = via.connection().await?;
                match seen {
                    Some(seen) => store::settle_over(&mut *conn, scope, address, seen, late).await,
                    None => store::settle_vacant(&mut *conn, scope, address, late).await,
                }
            }
            .await,
        );
        let written = written.map_err(Rejected::from_store)?;
        if written {
            self.event(
                tracing::Level::WARN,
                "a success recorded after the claim was lost: the slot is settled with it, so \
                 no retry runs the action again",
                None,
            );
        }
        Ok(written)
    }

    /// The row in the slot now, if any.
    async fn look(&self, via: &mut Via<'_>) -> Result<Option<store::Existing>, Rejected> {
        let (scope, address) = (self.gate.scope(), &*self.address);
        let row: Result<_, sqlx::Error> = retry::repeat!(
            backoff(via, &RECORD_BACKOFF),
            retry::is_transient,
            |_, _| {},
            async { store::lookup(&mut *via.connection().await?, scope, address, false).await }
                .await,
        );
        row.map_err(Rejected::from_store)
    }

    /// Whether the lease has run out by this process's clock.
    fn lease_ran_out(&self) -> bool {
        self.lease_ends
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some_and(|ends| Instant::now() >= ends)
    }

    fn lease_lost(&self) -> Rejected {
        Rejected::LeaseLost {
            address: self.address.clone(),
        }
    }

    fn claim_lost(&self) -> Rejected {
        Rejected::ClaimLost {
            address: self.address.clone(),
        }
    }

    fn event(&self, level: tracing::Level, message: &str, rejected: Option<&Rejected>) {
        let account = self.gate.account_name();
        let namespace = self.gate.namespace_name();
        let action = self.identity.action();
        let address = &*self.address;
        let fence = self.fence;
        let error = rejected.map(tracing::field::display);
        match level {
            tracing::Level::ERROR => tracing::error!(
                target: "idem", account, namespace, action, address, fence, error, "{message}"
            ),
            tracing::Level::WARN => tracing::warn!(
                target: "idem", account, namespace, action, address, fence, error, "{message}"
            ),
            _ => tracing::debug!(
                target: "idem", account, namespace, action, address, fence, error, "{message}"
            ),
        }
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if let Some(held) = self.held.as_ref().filter(|held| !held.in_transaction) {
            held.event(
                tracing::Level::WARN,
                "claim dropped before its outcome was recorded (panic, cancellation or \
                 a forgotten settle); the slot stays pending and refuses retries",
                None,
            );
        }
    }
}

impl fmt::Debug for Claim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Claim")
            .field("address", &self.address())
            .field("fence", &self.fence())
            .finish()
    }
}
