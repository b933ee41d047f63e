//! Trying for a slot: the insert, and what to do when it loses.
//!
//! A slot is won by the insert. On conflict, one lookup tells the caller why
//! (in flight, done, someone else's payload), and may find a lease that ran
//! out, which is then taken over with a compare-and-swap on its fence. A
//! duplicate told to wait until the slot is decided (or its wait is over)
//! attaches to a holder in this process (`attach`), is woken by one in
//! another (`wakeup`), and polls only when it can do neither.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use crate::attach::Landing;
use crate::claim::{Claim, Lease, WonSlot};
use crate::decision::Decision;
use crate::error::Rejected;
use crate::fault::{self, Fault};
use crate::identity::Identity;
use crate::measure::Stopwatch;
use crate::mode::{Mode, OnExpiry, OnUnavailable, OutcomeCommit};
use crate::observe::{self, GateEvent};
use crate::retry::{self, SERIALIZATION_BACKOFF};
use crate::scoped_pool::ScopedPool;
use crate::settled::{Fact, Final, StoredOutput};
use crate::store::{self, Commit, Engine, NewClaim};
// Said by every caller of `acquire`: whether a replay is wanted.
pub(crate) use crate::store::KeptValue;
use crate::via::Via;
use crate::wakeup::Listening;

/// How often a claim re-tries, without `wait`, when the slot it lost is free
/// again by the time it looks (the holder failed and released in between).
const CLAIM_ATTEMPTS: usize = 3;

/// Polling interval of a waiting duplicate: it starts short, since most
/// bodies are short, and backs off to spare the store.
const WAIT_FIRST_POLL: Duration = Duration::from_millis(10);
const WAIT_LONGEST_POLL: Duration = Duration::from_millis(250);

/// How often a duplicate attached to a claim of this process still looks
/// at the slot: the holder hears only its own outcome, and the slot may
/// change under it without one (its lease runs out and a retry takes it
/// over or holds it in doubt; an earlier holder's late success is written
/// over it), while the holder itself is stuck. Found by
/// `attach::at_the_edges`: attached waiters waited their whole wait there.
const ATTACHED_LOOK: Duration = Duration::from_secs(1);

/// A tracing event about the contended slot, with the fields every gate
/// event carries (account, namespace, action, address), then any others and
/// the message.
macro_rules! slot_event {
    ($level:ident, $contender:expr, $($rest:tt)+) => {
        tracing::$level!(
            target: "idem",
            account = $contender.slots.account(),
            namespace = $contender.slots.namespace(),
            action = $contender.identity.action(),
            address = %$contender.address,
            $($rest)+
        )
    };
}

/// The result of trying for a slot.
#[allow(
    clippy::large_enum_variant,
    reason = "made once per invocation and unpacked at once; boxing the claim would \
              allocate on every won claim, the hot path, to shrink the rare refusal"
)]
pub(crate) enum Acquired {
    /// This caller runs the body.
    Won(Claim),
    /// The action already succeeded; its stored value, when asked for and
    /// kept (and the payload is known to match).
    Settled(Option<String>),
}

/// Tries for the slot of `identity` in `slots` as `mode` says, running the
/// statements through `via`. `kept_value`: a duplicate of a settled action
/// is handed its stored value (replay).
pub(crate) async fn acquire(
    slots: &ScopedPool,
    identity: &Identity,
    mode: &Mode,
    kept_value: KeptValue,
    via: &mut Via<'_>,
) -> Result<Acquired, Rejected> {
    acquire_unless(
        slots,
        identity,
        mode,
        kept_value,
        via,
        std::future::pending::<()>(),
    )
    .await
}

/// [`acquire`], giving up a wait (refused [`Rejected::InFlight`], nothing
/// claimed) once `stop` resolves: a detached run whose caller left past
/// its bound, or whose shutdown's grace ran out, must not wait on. It is
/// only looked at between polls, where no statement is in flight (one
/// dropped mid-insert could leave a claim nobody records).
pub(crate) async fn acquire_unless<S: std::future::Future>(
    slots: &ScopedPool,
    identity: &Identity,
    mode: &Mode,
    kept_value: KeptValue,
    via: &mut Via<'_>,
    stop: S,
) -> Result<Acquired, Rejected> {
    let mut stop = std::pin::pin!(stop);
    let contender = Contender::new(slots, identity);
    if identity.is_absent() && mode.is_ordered() {
        // Ungated, it would be neither deduplicated nor ordered.
        let rejected = Rejected::InvalidOption {
            option: "key",
            value: format!("{identity:?}"),
            reason: "an ordered event's key is absent (a part is None): run ungated, it would \
                     be neither deduplicated nor ordered; give every part of its key",
        };
        contender.refused(&rejected);
        return Err(rejected);
    }
    if identity.is_absent() {
        contender.ungated();
        return Ok(Acquired::Won(Claim::ungated()));
    }
    let (lease_micros, windows) = slots
        .check()
        .and_then(|()| Ok((mode.lease_micros()?, mode.windows()?)))
        .inspect_err(|rejected| contender.refused(rejected))?;
    let ordered = mode
        .ordered_by()
        .inspect_err(|rejected| contender.refused(rejected))?;
    let entity_address = ordered.map(|(entity, _)| entity.address());
    let fingerprint = mode.payload_fingerprint().map(|f| f.digest());
    let new = NewClaim {
        identity: identity.canonical(),
        fingerprint: fingerprint.as_ref().map(|f| f.as_slice()),
        lease_micros,
        expires_in_doubt: mode.expires_in_doubt(),
        windows,
        ordered: ordered
            .zip(entity_address.as_deref())
            .map(|((entity, order), address)| store::OrderedBy {
                entity: address,
                entity_identity: entity.canonical(),
                order: order.get(),
            }),
    };
    let wait = Wait::of(mode);
    let mut poll = WAIT_FIRST_POLL;
    let mut freed = 0;
    // Subscribed to wake-ups for the slot, once a claim of another process
    // is waited on.
    let mut listening: Option<Listening> = None;
    // A claim rolled back by a serialization failure or deadlock is sent
    // again; one whose connection died is not (its insert may have
    // committed, and a retry would find its own row and report it as
    // somebody else's invocation in flight). Inside the caller's
    // transaction a failed statement aborts it, so only the caller can
    // retry (the whole transaction).
    let on_repeat = |error: &sqlx::Error, pause: Duration| {
        slot_event!(debug, contender, error = %error, ?pause,
            "claim rolled back by a serialization failure; trying again"
        );
        observe::record(GateEvent::Retried);
    };
    // A final fact this process already knows answers with no round trip;
    // it is only ever a settled or a refused attempt.
    // An outcome with a window is never remembered, so never recalled:
    // its window could end while it is.
    let mut recalled = if windows.any() {
        None
    } else {
        contender
            .recalled(new, kept_value)
            .map(|attempt| (attempt, ReadFrom::Cache))
    };
    loop {
        let (attempt, read) = match recalled.take() {
            Some(answered) => answered,
            None => {
                let attempt = retry::repeat!(
                    via.backoff(&SERIALIZATION_BACKOFF),
                    retry::is_serialization_failure,
                    on_repeat,
                    contender
                        .attempt(via, new, kept_value, mode.on_expiry_policy())
                        .await,
                );
                match attempt {
                    Ok(attempt) => (attempt, ReadFrom::of(via)),
                    // Only an outage may fail open: an error of the request
                    // would meet every call, and run every body unguarded.
                    Err(error)
                        if mode.on_unavailable_policy() == OnUnavailable::Run
                            && fault::classify(&error) == Fault::Outage =>
                    {
                        slot_event!(warn, contender, error = %error,
                            "store unavailable; failing open as on_unavailable = run says: the body runs unguarded"
                        );
                        contender.failed_open();
                        return Ok(Acquired::Won(Claim::ungated()));
                    }
                    Err(error) => return Err(contender.store_failed(error)),
                }
            }
        };
        match contender.conclude(attempt, mode, fingerprint, read) {
            Concluded::Acquired(acquired) => return acquired,
            // Freed: try again at once, a few times.
            Concluded::Undecided(Undecided::Freed) if freed + 1 < CLAIM_ATTEMPTS => {
                freed += 1;
            }
            // Held by a claim of this process while a wait is not over:
            // await its outcome as it lands (no statement, no polling).
            Concluded::Undecided(Undecided::HeldByAnother)
                if wait.goes_on()
                    && let Some(mut attached) = contender.attach(via) =>
            {
                freed = 0;
                listening = None;
                tokio::select! {
                    landed = attached.landed() => {
                        // Answered by what landed, or (the holder went
                        // without recording, a window) look at once.
                        recalled = landed
                            .and_then(|landed| contender.attached(&landed, new, kept_value, windows))
                            .map(|attempt| (attempt, ReadFrom::Attached));
                        poll = WAIT_FIRST_POLL;
                    }
                    // The slot may have changed without its holder: look.
                    () = tokio::time::sleep(ATTACHED_LOOK) => {}
                    // Over: one last look decides.
                    () = wait.over() => {}
                    _ = &mut stop => {
                        contender.refused(&Rejected::InFlight);
                        return Err(Rejected::InFlight);
                    }
                }
            }
            // Held by a claim of another process (or freed on every
            // attempt) while a wait is not over: be woken when its outcome
            // lands, looking once a second, or else poll.
            Concluded::Undecided(undecided) if wait.goes_on() => {
                freed = 0;
                let listen = match (undecided, contender.holder_seen(via)) {
                    (Undecided::HeldByAnother, Some(fence)) => {
                        contender.listen(fence, &mut listening, via).await
                    }
                    _ => Listen::Poll,
                };
                let (woken, pause) = match listen {
                    // The row changed before the mark: look at once.
                    Listen::Look => continue,
                    Listen::Listening(listening) => (Some(listening), ATTACHED_LOOK),
                    Listen::Poll => (None, poll),
                };
                let polls = woken.is_none();
                tokio::select! {
                    // Landed, or the wake-up may have been lost: look now.
                    () = async {
                        match woken {
                            Some(listening) => listening.woken().await,
                            None => std::future::pending().await,
                        }
                    } => poll = WAIT_FIRST_POLL,
                    () = tokio::time::sleep(wait.pause(pause)) => {
                        if polls {
                            poll = (poll * 2).min(WAIT_LONGEST_POLL);
                        }
                    }
                    _ = &mut stop => {
                        contender.refused(&Rejected::InFlight);
                        return Err(Rejected::InFlight);
                    }
                }
            }
            // Still held, or the slot changed hands on every attempt.
            Concluded::Undecided(_) => {
                contender.refused(&Rejected::InFlight);
                return Err(Rejected::InFlight);
            }
        }
    }
}

/// What a duplicate waiting on a claim of another process does next.
enum Listen<'l> {
    /// Await a wake-up (and look now and then).
    Listening(&'l mut Listening),
    /// The claim changed before it was marked: look at once.
    Look,
    /// No wake-up to be had (no listener yet, the mark failed): poll.
    Poll,
}

/// How long a duplicate that finds its slot held waits for it.
#[derive(Debug, Clone, Copy)]
enum Wait {
    /// Not at all: it is refused `InFlight` at once.
    No,
    /// Until then.
    Until(Instant),
    /// A wait too long for the clock to hold: unbounded.
    Unbounded,
}

impl Wait {
    fn of(mode: &Mode) -> Wait {
        match mode.wait_duration() {
            None => Wait::No,
            Some(wait) => Instant::now()
                .checked_add(wait)
                .map_or(Wait::Unbounded, Wait::Until),
        }
    }

    /// Whether it is still waiting.
    fn goes_on(self) -> bool {
        match self {
            Wait::No => false,
            Wait::Until(until) => Instant::now() < until,
            Wait::Unbounded => true,
        }
    }

    /// Resolves once the wait is over (never, for an unbounded one).
    async fn over(self) {
        match self {
            Wait::Until(until) => {
                tokio::time::sleep_until(tokio::time::Instant::from_std(until)).await
            }
            Wait::No => {}
            Wait::Unbounded => std::future::pending().await,
        }
    }

    /// The pause before the next look: `poll`, or what is left if less.
    fn pause(self, poll: Duration) -> Duration {
        match self {
            Wait::Until(until) => poll.min(until.saturating_duration_since(Instant::now())),
            Wait::No | Wait::Unbounded => poll,
        }
    }
}

/// One caller trying for the slot of one identity.
pub(crate) struct Contender<'a> {
    slots: &'a ScopedPool,
    identity: &'a Identity,
    address: String,
    /// Since this caller began to try: how long its claim took.
    claiming: Stopwatch,
    /// The fence of the pending row its last look found holding the slot
    /// ([`NO_FENCE`]: none), to attach to when this process holds it.
    held_by: AtomicI64,
}

/// No pending row seen.
const NO_FENCE: i64 = i64::MIN;

/// What one attempt comes to for its caller.
#[allow(
    clippy::large_enum_variant,
    reason = "a won claim is moved once or twice, never held in bulk: boxing it would cost an \
              allocation per claim to save a little stack"
)]
pub(crate) enum Concluded {
    /// Decided: the slot is this caller's, or the caller is answered.
    Acquired(Result<Acquired, Rejected>),
    /// Nothing decided yet: another try may.
    Undecided(Undecided),
}

/// Why an attempt decided nothing for its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Undecided {
    /// Pending under someone else, lease (if any) not run out.
    HeldByAnother,
    /// Gone between the insert and the lookup, or taken over by another:
    /// worth another try at once.
    Freed,
}

/// Where an attempt's answer was read, which decides what may be made of
/// it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadFrom {
    /// This process's outcome cache: no round trip (only ever a settled or
    /// a refused attempt).
    Cache,
    /// A connection of the pool: committed rows only, which this process
    /// may remember.
    Pool,
    /// The caller's transaction: a row may be its own uncommitted write,
    /// never remembered.
    Transaction,
    /// Handed over by the holder in this process as its outcome landed
    /// (a duplicate attached to it while waiting): no round trip.
    Attached,
}

impl ReadFrom {
    /// Where `via` reads.
    pub(crate) fn of(via: &Via<'_>) -> ReadFrom {
        if via.in_transaction() {
            ReadFrom::Transaction
        } else {
            ReadFrom::Pool
        }
    }
}

/// A slot this caller now holds: its fence, and the lineage (the fence the
/// claim began with, which a takeover keeps).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fenced {
    fence: i64,
    lineage: i64,
    took_over: bool,
}

impl Fenced {
    /// A slot just claimed (not taken over) with `fence`.
    pub(crate) fn new(fence: i64) -> Fenced {
        Fenced {
            fence,
            lineage: fence,
            took_over: false,
        }
    }
}

/// One claim statement (and, when a row it could not see stopped it, one
/// lookup).
pub(crate) enum Attempt {
    Won(Fenced),
    Settled(Option<String>),
    Refused(Rejected),
    Undecided(Undecided),
}

impl<'a> Contender<'a> {
    pub(crate) fn new(slots: &'a ScopedPool, identity: &'a Identity) -> Contender<'a> {
        Contender {
            slots,
            identity,
            address: identity.address(),
            claiming: Stopwatch::start(),
            held_by: AtomicI64::new(NO_FENCE),
        }
    }

    /// Says that the identity is absent (a key part is `None`), so the
    /// body runs unguarded.
    pub(crate) fn ungated(&self) {
        tracing::info!(
            target: "idem",
            account = self.slots.account(),
            namespace = self.slots.namespace(),
            action = self.identity.action(),
            absent_part = self.identity.first_absent_part(),
            "ungated: a key part is None, so there is no slot to claim and the body runs unguarded"
        );
        self.decided(Decision::Ungated);
    }

    /// Says that the store is down and the mode fails open, so the body
    /// runs unguarded.
    fn failed_open(&self) {
        self.decided(Decision::FailedOpen);
    }

    /// Reports the claim's `decision`, and how long it took.
    fn decided(&self, decision: Decision<'_>) {
        decision.claimed(self.slots, self.identity, &self.claiming);
    }

    /// The slot's address.
    pub(crate) fn address(&self) -> &str {
        &self.address
    }

    /// What `attempt`, read from `read`, comes to: a won claim (with the
    /// `fingerprint` it was made with, under `mode`), an answer, or another
    /// try. Says so to tracing, to a race harness and to the metrics.
    pub(crate) fn conclude(
        &self,
        attempt: Attempt,
        mode: &Mode,
        fingerprint: Option<[u8; 20]>,
        read: ReadFrom,
    ) -> Concluded {
        let cached = read == ReadFrom::Cache;
        let acquired = match attempt {
            Attempt::Won(fenced) => Ok(Acquired::Won(self.won(
                fenced,
                mode,
                fingerprint,
                read == ReadFrom::Transaction,
            ))),
            Attempt::Settled(Some(output)) => {
                slot_event!(
                    debug,
                    self,
                    cached,
                    "duplicate of a settled action: replaying its stored value"
                );
                self.decided(Decision::Replayed);
                Ok(Acquired::Settled(Some(output)))
            }
            Attempt::Settled(None) => {
                self.refused_as(&Rejected::AlreadyDone, cached);
                Ok(Acquired::Settled(None))
            }
            Attempt::Refused(rejected) => {
                self.refused_as(&rejected, cached);
                Err(rejected)
            }
            Attempt::Undecided(undecided) => return Concluded::Undecided(undecided),
        };
        Concluded::Acquired(acquired)
    }

    /// The claim of a slot this caller won (`fenced`), under `mode`.
    fn won(
        &self,
        fenced: Fenced,
        mode: &Mode,
        fingerprint: Option<[u8; 20]>,
        in_transaction: bool,
    ) -> Claim {
        let Fenced {
            fence,
            lineage,
            took_over,
        } = fenced;
        slot_event!(debug, self, fence, took_over, "claim won");
        self.decided(Decision::Won { took_over });
        Claim::won(WonSlot {
            slots: self.slots.clone(),
            identity: self.identity.clone(),
            fingerprint,
            address: self.address.clone(),
            fence,
            lineage,
            lease: Arc::new(Lease::from_now(mode.lease_duration())),
            won: Stopwatch::start(),
            in_transaction,
            windows: mode.windows().unwrap_or_default(),
            ordered: mode
                .ordered_by()
                .ok()
                .flatten()
                .map(|(entity, order)| (entity.address(), order.get())),
            // Never under a lease or in the caller's transaction: see
            // OutcomeCommit::Async. Nor on Citus, where the setting is made
            // on the coordinator, the worker that writes the row commits
            // durably all the same, and the extra step only costs round
            // trips (BENCHMARKS.md).
            // Not inside the caller's transaction: undecided until it
            // commits, so nobody may be answered from it before.
            attached: (!in_transaction).then(|| self.slots.in_flight().hold(fence)),
            commit: match mode.outcome_commit_policy() {
                OutcomeCommit::Async
                    if mode.lease_duration().is_none()
                        && !in_transaction
                        && self.slots.engine() == Engine::PostgreSQL =>
                {
                    Commit::Async
                }
                _ => Commit::Durable,
            },
        })
    }

    /// One claim statement, and what it found.
    async fn attempt(
        &self,
        via: &mut Via<'_>,
        new: NewClaim<'_>,
        kept_value: KeptValue,
        on_expiry: OnExpiry,
    ) -> Result<Attempt, sqlx::Error> {
        let (scope, address) = (self.slots.scope(), &*self.address);
        self.held_by.store(NO_FENCE, Ordering::Relaxed);
        let read = ReadFrom::of(via);
        let within = match read {
            ReadFrom::Transaction => store::Within::CallersTransaction,
            ReadFrom::Pool | ReadFrom::Cache | ReadFrom::Attached => store::Within::Autocommit,
        };
        // One connection for the whole attempt: every acquire may cost a
        // round trip of its own (the pool's liveness check).
        let mut conn = via.connection().await?;
        // An ordered event's claim on Citus is a transaction on the pooled
        // connection: cut short, it must not go back to the pool inside it
        // (`store::guarded`).
        let in_a_transaction_of_its_own = new.ordered.is_some()
            && self.slots.engine() == Engine::Citus
            && within == store::Within::Autocommit;
        conn.close_if_dropped(in_a_transaction_of_its_own);
        let claimed = store::claim(
            &mut conn,
            self.slots.engine(),
            within,
            scope,
            address,
            new,
            kept_value,
        )
        .await;
        // Done, or failed (sqlx rolls back a transaction it counted).
        conn.close_if_dropped(false);
        let existing = match claimed? {
            store::ClaimAnswer::Won(fence) => return Ok(Attempt::Won(Fenced::new(fence))),
            store::ClaimAnswer::Holder(existing) => existing,
            store::ClaimAnswer::Superseded { applied } => {
                slot_event!(
                    debug,
                    self,
                    applied,
                    "an event of the entity with a newer order was applied"
                );
                return Ok(Attempt::Refused(Rejected::Superseded));
            }
            // Another event of the entity runs: wait for it, or be refused
            // as in flight, as a duplicate of a claim in flight is.
            store::ClaimAnswer::EntityHeld { stale: false } => {
                return Ok(Attempt::Undecided(Undecided::HeldByAnother));
            }
            // Read as it was before the statement waited for the entity:
            // ask again at once, as for a slot freed meanwhile.
            store::ClaimAnswer::EntityHeld { stale: true } => {
                return Ok(Attempt::Undecided(Undecided::Freed));
            }
            store::ClaimAnswer::EntityCollision => {
                return Ok(Attempt::Refused(Rejected::Collision {
                    address: new
                        .ordered
                        .map_or_else(|| self.address.clone(), |ordered| ordered.entity.to_owned()),
                }));
            }
            // Stopped by a row the statement could not see: look again,
            // with a new snapshot, to tell the caller why.
            store::ClaimAnswer::Hidden => {
                match store::lookup(&mut *conn, scope, address, kept_value).await? {
                    Some(existing) => existing,
                    // The holder failed and released in between: the slot
                    // is free again.
                    None => return Ok(Attempt::Undecided(Undecided::Freed)),
                }
            }
        };
        self.judge(&mut conn, existing, new, kept_value, on_expiry, read)
            .await
    }

    /// What the row found holding the slot means for this caller: the rules
    /// every duplicate is judged by, with the statements they may call for
    /// on `conn` (a claim whose lease ran out is taken over, or turned in
    /// doubt). `read`: where the row was read; one read inside the caller's
    /// transaction may be uncommitted, and is not remembered.
    pub(crate) async fn judge(
        &self,
        conn: &mut sqlx::PgConnection,
        existing: store::Existing,
        new: NewClaim<'_>,
        kept_value: KeptValue,
        on_expiry: OnExpiry,
        read: ReadFrom,
    ) -> Result<Attempt, sqlx::Error> {
        let (scope, address) = (self.slots.scope(), &*self.address);
        // Past its window the slot is free: this claim reopens it, and the
        // insert then decides between all who found it so.
        if existing.slot_expired {
            let reopened =
                store::reopen_expired(&mut *conn, scope, address, existing.fence).await?;
            if reopened {
                slot_event!(
                    info,
                    self,
                    previous_fence = existing.fence,
                    "the slot's window is over: its outcome no longer holds it, and it is \
                     claimed anew"
                );
            }
            return Ok(Attempt::Undecided(Undecided::Freed));
        }
        // A final row read on a connection of the pool is committed: this
        // process may remember it, unless it has a window (which could end
        // while it is remembered). One read inside the caller's
        // transaction may be that transaction's own uncommitted settle.
        if read != ReadFrom::Transaction && !existing.windowed {
            self.slots
                .remember(address, || Final::of_row(&existing, kept_value.is_read()));
        }
        // Past the value's window, what was kept with the value (the
        // fingerprint too) is kept no more: whatever its payload, a
        // duplicate is refused, and one that replays is told so.
        if existing.settled && existing.value_expired {
            let judged = self.replayable(new, &existing.identity, existing.fingerprint.as_deref());
            return Ok(match judged {
                Err(collision @ Rejected::Collision { .. }) => Attempt::Refused(collision),
                _ if kept_value.is_read() => Attempt::Refused(Rejected::ValueNotKept),
                _ => settled(None, false),
            });
        }
        let replayable =
            match self.replayable(new, &existing.identity, existing.fingerprint.as_deref()) {
                Ok(replayable) => replayable,
                Err(refused) => return Ok(Attempt::Refused(refused)),
            };
        if existing.settled {
            return Ok(settled(existing.output, replayable));
        }
        // Neither runs again: one may have taken effect, the other failed
        // for good.
        match existing.state {
            store::ClaimState::InDoubt => return Ok(Attempt::Refused(Rejected::InDoubt)),
            store::ClaimState::Failed => return Ok(kept_failure()),
            store::ClaimState::Pending | store::ClaimState::Success => {}
        }
        // Either the claim or this caller saying `in_doubt` is enough: a
        // holder that asked for it may have done what no retry may repeat,
        // whatever a later deploy or another call site says.
        if existing.lease_expired && (existing.expires_in_doubt || on_expiry == OnExpiry::InDoubt) {
            // The holder is gone and may have done the action: nobody runs
            // it until its outcome is established.
            let turned = store::expire_in_doubt(&mut *conn, scope, address, existing.fence).await?;
            if turned {
                slot_event!(
                    warn,
                    self,
                    previous_fence = existing.fence,
                    "lease ran out: the claim is in doubt, held until a reconciler or an \
                     operator resolves it"
                );
                Decision::ExpiredIntoDoubt.happened(self.slots, self.identity);
                return Ok(Attempt::Refused(Rejected::InDoubt));
            }
            // Resolved, released or turned by another meanwhile: look again.
            return Ok(Attempt::Undecided(Undecided::Freed));
        }
        if existing.lease_expired {
            let taken = store::take_over(&mut *conn, scope, address, existing.fence, new).await?;
            return Ok(match taken {
                Some(taken) => {
                    slot_event!(
                        warn,
                        self,
                        previous_fence = existing.fence,
                        fence = taken.fence,
                        "lease ran out: claim taken over from its previous holder"
                    );
                    Attempt::Won(Fenced {
                        fence: taken.fence,
                        lineage: taken.lineage,
                        took_over: true,
                    })
                }
                None => Attempt::Undecided(Undecided::Freed),
            });
        }
        self.held_by.store(existing.fence, Ordering::Relaxed);
        Ok(Attempt::Undecided(Undecided::HeldByAnother))
    }

    /// Attaches to the claim whose pending row the last look found holding
    /// the slot, if this process holds it (and `via` is no transaction of
    /// the caller's, whose reads may not see what lands).
    fn attach(&self, via: &Via<'_>) -> Option<crate::attach::Attached> {
        let fence = self.held_by.load(Ordering::Relaxed);
        if fence == NO_FENCE || via.in_transaction() {
            return None;
        }
        let attached = self.slots.in_flight().attach(fence)?;
        self.held_by.store(NO_FENCE, Ordering::Relaxed);
        Some(attached)
    }

    /// The fence of the pending row the last look found holding the slot,
    /// taken (each look's once), unless `via` is the caller's transaction.
    fn holder_seen(&self, via: &Via<'_>) -> Option<i64> {
        let fence = self.held_by.swap(NO_FENCE, Ordering::Relaxed);
        (fence != NO_FENCE && !via.in_transaction()).then_some(fence)
    }

    /// Subscribes to the wake-up of the slot (`wakeup`), kept in
    /// `listening` across looks, and marks the claim of `fence` as waited
    /// on unless a waiter of this process has: what to do next.
    async fn listen<'l>(
        &self,
        fence: i64,
        listening: &'l mut Option<Listening>,
        via: &mut Via<'_>,
    ) -> Listen<'l> {
        if listening.as_ref().is_none_or(Listening::orphaned) {
            // Subscribed anew before the old subscription goes, so that the
            // slot's entry (and what it says was marked) stays.
            *listening = self
                .slots
                .wakeups()
                .listen(self.slots.pool(), &self.address)
                .await;
        }
        let Some(subscribed) = listening.as_mut() else {
            return Listen::Poll;
        };
        if subscribed.marked(fence) {
            return Listen::Listening(subscribed);
        }
        let scope = self.slots.scope();
        let marked = async {
            let mut conn = via.connection().await?;
            store::mark_awaited(&mut *conn, scope, &self.address, fence).await
        }
        .await;
        match marked {
            Ok(true) => {
                subscribed.mark(fence);
                Listen::Listening(subscribed)
            }
            Ok(false) => Listen::Look,
            Err(error) => {
                slot_event!(debug, self, error = %error,
                    "could not mark the claim waited on; polling it instead"
                );
                Listen::Poll
            }
        }
    }

    /// What `landed` (the outcome of the claim this caller attached to)
    /// says to it, by the same rules as a row read from the store; `None`:
    /// it cannot say (a release, an outcome to read, or a caller with a
    /// window of its own), so the caller looks again at once.
    fn attached(
        &self,
        landed: &Landing,
        new: NewClaim<'_>,
        kept_value: KeptValue,
        windows: store::Windows,
    ) -> Option<Attempt> {
        if windows.any() {
            return None;
        }
        match landed {
            Landing::Final(known) => Some(self.judged_final(known, new, kept_value)),
            Landing::InDoubt {
                identity,
                fingerprint,
            } => Some(
                match self.replayable(new, identity, fingerprint.as_deref()) {
                    Ok(_) => Attempt::Refused(Rejected::InDoubt),
                    Err(refused) => Attempt::Refused(refused),
                },
            ),
            Landing::Freed | Landing::Look => None,
        }
    }

    /// Whether the row found in the slot (its `identity` and `fingerprint`)
    /// may hand this caller its stored value, or why it refuses it: the
    /// rules every duplicate is judged by, whether the row was read from
    /// the store or recalled from the outcome cache.
    fn replayable(
        &self,
        new: NewClaim<'_>,
        identity: &[u8],
        fingerprint: Option<&[u8]>,
    ) -> Result<bool, Rejected> {
        if !self.identity.is_stored_as(identity) {
            return Err(Rejected::Collision {
                address: self.address.clone(),
            });
        }
        // A stored value goes only to a caller whose payload is known to
        // match: both gave the same fingerprint, or neither gave one. Either
        // side without one makes the payloads incomparable: the duplicate is
        // told the action is done, and is not handed the value.
        match (new.fingerprint, fingerprint) {
            (Some(ours), Some(theirs)) if ours != theirs => Err(Rejected::KeyReused),
            (ours, theirs) => Ok(ours.is_some() == theirs.is_some()),
        }
    }

    /// What a final fact this process remembers says to this caller, by
    /// the same rules as a row read from the store; `None` when it cannot
    /// say (nothing remembered, or a replaying caller meets a success
    /// remembered without its value): the store is asked.
    pub(crate) fn recalled(&self, new: NewClaim<'_>, kept_value: KeptValue) -> Option<Attempt> {
        let known = self.slots.recall(&self.address)?;
        let judged = self.judged_final(&known, new, kept_value);
        // A replaying caller that meets a success remembered without its
        // value asks the store.
        match judged {
            Attempt::Undecided(_) => None,
            judged => Some(judged),
        }
    }

    /// What the final fact `known` says to this caller, by the same rules
    /// as a row read from the store: a replaying caller that meets a
    /// success known without its value is undecided (it must ask the
    /// store).
    fn judged_final(&self, known: &Final, new: NewClaim<'_>, kept_value: KeptValue) -> Attempt {
        let replayable = match self.replayable(new, &known.identity, known.fingerprint.as_deref()) {
            Ok(replayable) => replayable,
            Err(refused) => return Attempt::Refused(refused),
        };
        match &known.fact {
            Fact::Failed => kept_failure(),
            // The value matters only to a replaying caller it may go to.
            Fact::Success(_) if !(kept_value.is_read() && replayable) => settled(None, replayable),
            Fact::Success(StoredOutput::Known(output)) => {
                settled(output.as_deref().map(str::to_owned), replayable)
            }
            Fact::Success(StoredOutput::Unknown) => Attempt::Undecided(Undecided::Freed),
        }
    }

    /// Says why the claim was refused: to tracing, to a race harness and
    /// to the metrics.
    pub(crate) fn refused(&self, rejected: &Rejected) {
        self.refused_as(rejected, false);
    }

    /// [`refused`](Contender::refused), saying whether the answer came from
    /// the outcome cache (`cached`) rather than the store.
    fn refused_as(&self, rejected: &Rejected, cached: bool) {
        slot_event!(
            info,
            self,
            reason = rejected.reason(),
            cached,
            "claim refused: {rejected}"
        );
        self.decided(Decision::Refused(rejected));
    }

    /// A claim statement failed: an outage, or an error of the request.
    pub(crate) fn store_failed(&self, error: sqlx::Error) -> Rejected {
        let rejected = Rejected::from_store(error);
        if rejected.is_outage() {
            slot_event!(error, self, error = %rejected,
                "store unavailable; failing closed, the body does not run"
            );
        } else {
            slot_event!(error, self, error = %rejected,
                "store refused the claim (not an outage); the body does not run"
            );
        }
        self.decided(Decision::Refused(&rejected));
        rejected
    }
}

/// What a duplicate of a settled action gets: the stored `output`, if it
/// may have it (`replayable`), or to hear that the action is done.
fn settled(output: Option<String>, replayable: bool) -> Attempt {
    Attempt::Settled(output.filter(|_| replayable))
}

/// What a duplicate of a failure kept for good gets.
fn kept_failure() -> Attempt {
    Attempt::Refused(Rejected::AlreadyFailed)
}
