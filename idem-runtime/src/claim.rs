//! Winning a slot, and recording what became of it.
//!
//! A claim is won by the insert. On conflict, one lookup tells the caller why
//! (in flight, done, someone else's payload), and may find a lease that ran
//! out, which is then taken over with a compare-and-swap on its fence.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, PgPool, Postgres};

use crate::error::Rejected;
use crate::gate::Gate;
use crate::identity::Identity;
use crate::mode::{Mode, OnUnavailable, OutcomeCommit};
use crate::observe::{self, GateEvent};
use crate::retry::{SERIALIZATION_BACKOFF, retry_after, retry_after_serialization_failure};
use crate::store::{self, Commit, NewClaim};

/// How often a claim re-tries, without `wait`, when the slot it lost is free
/// again by the time it looks (the holder failed and released in between).
const CLAIM_ATTEMPTS: usize = 3;

/// Pauses between attempts to record an outcome (settle or release), which
/// are idempotent and worth a retry when a pooled connection died under them.
const RECORD_BACKOFF: [Duration; 2] = [Duration::from_millis(25), Duration::from_millis(100)];

/// Polling interval of a waiting duplicate: it starts short, since most
/// bodies are short, and backs off to spare the store.
const WAIT_FIRST_POLL: Duration = Duration::from_millis(10);
const WAIT_LONGEST_POLL: Duration = Duration::from_millis(250);

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

/// One claim statement (and, when a row it could not see stopped it, one
/// lookup).
enum Attempt {
    Won(i64),
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
        self.check_scope()
            .inspect_err(|rejected| self.refused(identity, &address, rejected))?;
        let fingerprint = mode.payload_fingerprint().map(|f| f.digest());
        let new = NewClaim {
            identity: identity.canonical(),
            fingerprint: fingerprint.as_ref().map(|f| f.as_slice()),
            lease_micros: mode.lease_micros(),
        };
        let deadline = mode.wait_duration().map(|wait| Instant::now() + wait);
        let mut poll = WAIT_FIRST_POLL;
        let mut freed = 0;
        // A claim rolled back by a serialization failure or deadlock is sent
        // again; one whose connection died is not (its insert may have
        // committed, and a retry would find its own row and report it as
        // somebody else's invocation in flight). Inside the caller's
        // transaction a failed statement aborts it, so only the caller can
        // retry (the whole transaction).
        let mut backoff = if via.in_transaction() {
            [].iter()
        } else {
            SERIALIZATION_BACKOFF.iter()
        };
        loop {
            let attempt = self
                .attempt(via, &address, identity, new, want_output)
                .await;
            if let Some(pause) = retry_after_serialization_failure(&attempt, &mut backoff) {
                if let Err(error) = &attempt {
                    slot_event!(debug, self, identity, address, error = %error, ?pause,
                        "claim rolled back by a serialization failure; trying again"
                    );
                }
                observe::record(GateEvent::Retried);
                tokio::time::sleep(pause).await;
                continue;
            }
            let attempt = match attempt {
                Ok(attempt) => attempt,
                Err(error) if mode.on_unavailable_policy() == OnUnavailable::Run => {
                    slot_event!(warn, self, identity, address, error = %error,
                        "store unavailable; failing open as on_unavailable = run says: the body runs unguarded"
                    );
                    observe::record(GateEvent::Ungated);
                    return Ok(Acquired::Won(Claim { held: None }));
                }
                Err(error) => return Err(self.unavailable(identity, &address, error)),
            };
            match attempt {
                Attempt::Won(fence) => {
                    slot_event!(debug, self, identity, address, fence, "claim won");
                    observe::record(GateEvent::Won);
                    return Ok(Acquired::Won(Claim {
                        held: Some(Held {
                            gate: self.clone(),
                            action: identity.action().into(),
                            address,
                            fence,
                            leased: mode.lease_duration().is_some(),
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
                Attempt::Held | Attempt::Freed
                    if deadline.is_some_and(|deadline| Instant::now() < deadline) =>
                {
                    freed = 0;
                    let remaining =
                        deadline.map_or(poll, |d| d.saturating_duration_since(Instant::now()));
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
            store::Claimed::Won(fence) => return Ok(Attempt::Won(fence)),
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
        // A stored value goes only to a caller whose payload is known to match.
        let mut replayable = true;
        if let Some(ours) = new.fingerprint {
            match existing.fingerprint.as_deref() {
                Some(theirs) if theirs != ours => return Ok(Attempt::Refused(Rejected::KeyReused)),
                Some(_) => {}
                // Claimed without a fingerprint: the payload is unknown.
                None => replayable = false,
            }
        }
        if existing.settled {
            return Ok(Attempt::Settled(existing.output.filter(|_| replayable)));
        }
        if existing.lease_expired {
            let taken = store::take_over(&mut *conn, scope, address, existing.fence, new).await?;
            return Ok(match taken {
                Some(fence) => {
                    slot_event!(
                        warn,
                        self,
                        identity,
                        address,
                        previous_fence = existing.fence,
                        fence,
                        "lease ran out: claim taken over from its previous holder"
                    );
                    Attempt::Won(fence)
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

    fn unavailable(&self, identity: &Identity, address: &str, error: sqlx::Error) -> Rejected {
        slot_event!(error, self, identity, address, error = %error,
            "store unavailable; failing closed, the body does not run"
        );
        let rejected = Rejected::unavailable(error);
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
    action: Arc<str>,
    address: String,
    fence: i64,
    leased: bool,
    /// Inside the caller's transaction, the transaction decides: a dropped
    /// claim is rolled back with it, so there is nothing to warn about.
    in_transaction: bool,
    /// How the outcome commits.
    commit: Commit,
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
    /// On error the row stays `pending` (fail closed): retries are refused
    /// rather than risk running the action twice. If a lease ran out and the
    /// claim was taken over, nothing changes and the error is
    /// [`Rejected::LeaseLost`].
    pub async fn settle(self) -> Result<(), Rejected> {
        let Some(pool) = self.pool() else {
            return Ok(());
        };
        self.finish(true, None, &mut Via::Pool(&pool)).await
    }

    /// Records failure: the row is deleted, so a retry can run the action.
    ///
    /// On error the row stays `pending` (fail closed). If the claim was
    /// taken over, nothing changes and the error is [`Rejected::LeaseLost`].
    pub async fn release(self) -> Result<(), Rejected> {
        let Some(pool) = self.pool() else {
            return Ok(());
        };
        self.finish(false, None, &mut Via::Pool(&pool)).await
    }

    /// [`settle`](Claim::settle) inside the caller's transaction (for a claim
    /// made with [`Gate::claim_in`]): it takes effect when that commits.
    pub async fn settle_in(self, connection: &mut PgConnection) -> Result<(), Rejected> {
        self.finish(true, None, &mut Via::Transaction(connection))
            .await
    }

    /// [`release`](Claim::release) inside the caller's transaction.
    pub async fn release_in(self, connection: &mut PgConnection) -> Result<(), Rejected> {
        self.finish(false, None, &mut Via::Transaction(connection))
            .await
    }

    /// Renews the lease to `lease` from now, for bodies that run long.
    /// [`Rejected::LeaseLost`] if the claim was taken over meanwhile.
    pub async fn extend(&self, lease: Duration) -> Result<(), Rejected> {
        let Some(held) = &self.held else {
            return Ok(());
        };
        let micros = i64::try_from(lease.as_micros()).unwrap_or(i64::MAX);
        let mut backoff = RECORD_BACKOFF.iter();
        let extended = loop {
            let attempt = async {
                let mut conn = held.gate.pool().acquire().await?;
                let scope = held.gate.scope();
                store::extend(&mut *conn, scope, &held.address, held.fence, micros).await
            }
            .await;
            match retry_after(&attempt, &mut backoff) {
                Some(pause) => tokio::time::sleep(pause).await,
                None => break attempt,
            }
        };
        match extended {
            Ok(true) => Ok(()),
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
            Err(error) => Err(Rejected::unavailable(error)),
        }
    }

    /// The pool of the gate that made this claim, if anything was claimed.
    fn pool(&self) -> Option<PgPool> {
        self.held.as_ref().map(|held| held.gate.pool().clone())
    }

    /// Settles (`success`) or releases the claim through `via`, keeping
    /// `output` with a settle.
    pub(crate) async fn finish(
        mut self,
        success: bool,
        output: Option<&str>,
        via: &mut Via<'_>,
    ) -> Result<(), Rejected> {
        let Some(held) = self.held.take() else {
            return Ok(());
        };
        let scope = held.gate.scope();
        // Inside a transaction a failed statement aborts it: no retry.
        let mut backoff = if via.in_transaction() {
            [].iter()
        } else {
            RECORD_BACKOFF.iter()
        };
        let recorded = loop {
            let attempt = async {
                let mut conn = via.connection().await?;
                if success {
                    store::settle(
                        &mut *conn,
                        scope,
                        &held.address,
                        held.fence,
                        output,
                        held.commit,
                    )
                    .await
                } else {
                    store::release(&mut *conn, scope, &held.address, held.fence, held.commit).await
                }
            }
            .await;
            match retry_after(&attempt, &mut backoff) {
                Some(pause) => tokio::time::sleep(pause).await,
                None => break attempt,
            }
        };
        let recorded = match recorded {
            Ok(false) => held.why_not_recorded(via, success).await,
            other => other.map_err(Rejected::unavailable),
        };
        let verb = if success { "settled" } else { "released" };
        match recorded {
            Ok(true) => {
                held.event(tracing::Level::DEBUG, verb, None);
                Ok(())
            }
            Ok(false) => Ok(()),
            Err(rejected) => {
                let message = match (&rejected, success) {
                    (Rejected::Unavailable { .. }, true) => {
                        "settle failed; the slot stays pending (fail closed) until resolved"
                    }
                    (Rejected::Unavailable { .. }, false) => {
                        "release failed; the slot stays pending (fail closed) until resolved"
                    }
                    _ => "outcome not recorded: the claim is no longer this holder's",
                };
                held.event(tracing::Level::ERROR, message, Some(&rejected));
                Err(rejected)
            }
        }
    }
}

impl Held {
    /// A settle or release matched no pending row under this fence: tell a
    /// retry of our own earlier success from a lost claim.
    async fn why_not_recorded(&self, via: &mut Via<'_>, success: bool) -> Result<bool, Rejected> {
        let scope = self.gate.scope();
        let existing = async {
            store::lookup(&mut *via.connection().await?, scope, &self.address, false).await
        }
        .await
        .map_err(Rejected::unavailable)?;
        let lost = |leased| {
            let address = self.address.clone();
            if leased {
                Rejected::LeaseLost { address }
            } else {
                Rejected::ClaimLost { address }
            }
        };
        match existing {
            // An earlier attempt of this very settle committed.
            Some(row) if row.fence == self.fence && row.settled && success => Ok(true),
            Some(row) if row.fence != self.fence => Err(lost(true)),
            Some(_) => Err(lost(self.leased)),
            // Released: by an earlier attempt of ours, or (with a lease) by a
            // new holder; either way the slot is free and ours changes nothing.
            None if !success => Ok(false),
            None => Err(lost(self.leased)),
        }
    }

    fn event(&self, level: tracing::Level, message: &str, rejected: Option<&Rejected>) {
        let account = self.gate.account_name();
        let namespace = self.gate.namespace_name();
        let action = &*self.action;
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
