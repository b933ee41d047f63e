//! The claim path's statements over `idem_records` (`kind = 'claim'`):
//! claim, lookup, take over, settle, release, extend, the two ways a late
//! success is recorded, and the two ways a claim leaves `pending` without a
//! success: kept as `failed`, or held `in_doubt`.
//!
//! Every statement that changes a holder's row is a compare-and-swap on
//! `state = 'pending' AND fence = $4`: it changes the row only while it is
//! still the pending claim that holder (or looker) saw, so of two racing
//! writers exactly one changes it, and none ever writes over a success, a
//! kept failure or a claim in doubt.
//!
//! By default every statement runs on its own pooled connection and commits
//! on its own (autocommit): a claim is visible to every other process the
//! moment it is won, so a losing duplicate is refused at once instead of
//! waiting on the winner's transaction. In-transaction mode passes the
//! caller's connection instead, and the caller's commit decides.
//!
//! Every statement but [`SETTLE_VACANT`] finds its row by address through
//! the partial unique index its form's namespace test implies
//! ([`SplitOnNamespace`]); the claim's and the vacant settle's inserts are
//! arbitrated by the same two indexes.

use sqlx::FromRow;
use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use sqlx::{PgConnection, PgExecutor, Postgres, Row};

use super::operations::ClaimState;
use super::{Commit, Engine, PerCommit, Scope, SplitOnNamespace, per_commit, per_row};

/// What a new claim row carries besides its scope and address.
#[derive(Debug, Clone, Copy)]
pub struct NewClaim<'a> {
    /// The identity's canonical encoding.
    pub identity: &'a [u8],
    /// The payload's fingerprint, when the claim has one.
    pub fingerprint: Option<&'a [u8]>,
    /// `None`: the claim holds until resolved.
    pub lease_micros: Option<i64>,
    /// Its lease, run out, holds the slot in doubt (`on_expiry =
    /// "in_doubt"`) rather than letting a retry take it over: recorded with
    /// the claim (`expires_in_doubt`), so that a retry whose own policy
    /// says otherwise still holds it.
    pub expires_in_doubt: bool,
    /// How long its value and its slot are kept once its outcome is in.
    pub windows: Windows,
    /// The entity and order of an ordered event (`Guard::ordered`).
    pub ordered: Option<super::ordered::OrderedBy<'a>>,
}

/// How long a claim keeps what (`Guard::keep_value_for`,
/// `Guard::keep_slot_for`), in microseconds; `None`: for ever.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Windows {
    /// The value's window.
    pub value_micros: Option<i64>,
    /// The slot's window.
    pub slot_micros: Option<i64>,
}

impl NewClaim<'_> {
    /// The claim's `expires_in_doubt`: `true`, or NULL for a takeover
    /// (the default: most rows then store nothing for it).
    pub(crate) fn expires_in_doubt(&self) -> Option<bool> {
        expires_in_doubt(self.expires_in_doubt)
    }

    /// Its lease, as a batch claims every item with it.
    pub(crate) fn lease(&self) -> super::batch::BatchLease {
        super::batch::BatchLease {
            micros: self.lease_micros,
            expires_in_doubt: self.expires_in_doubt,
        }
    }
}

/// What a claim stores in `expires_in_doubt` for its policy: `true`, or
/// NULL for a takeover.
pub(crate) fn expires_in_doubt(in_doubt: bool) -> Option<bool> {
    in_doubt.then_some(true)
}

impl Windows {
    /// Whether either window is set: the claim's outcome is not final for
    /// ever, so no process may remember it (the outcome cache).
    pub fn any(&self) -> bool {
        self.value_micros.is_some() || self.slot_micros.is_some()
    }
}

/// A claim row found on conflict: the columns `existing_columns!` names
/// and `output`, decoded by name.
#[derive(Debug, sqlx::FromRow)]
pub struct Existing {
    /// The slot records a success.
    pub settled: bool,
    /// The row's state, parsed as it is read: a state this build does not
    /// know (written by a later version) fails the read instead.
    pub state: ClaimState,
    /// The identity's canonical encoding.
    pub identity: Vec<u8>,
    /// The payload's fingerprint, when the claim has one.
    pub fingerprint: Option<Vec<u8>>,
    /// The claim's fence.
    pub fence: i64,
    /// The fence of the claim this row began as: kept by takeovers, new
    /// when the slot was released and claimed anew. A holder whose lineage
    /// still matches was taken over; one whose lineage is gone was released.
    pub lineage: i64,
    /// A lease was set and has run out (by the database's clock), on a
    /// claim still `pending`: a claim in doubt or failed never expires.
    pub lease_expired: bool,
    /// The claim was made with `on_expiry = "in_doubt"`: its lease, run
    /// out, holds the slot in doubt whatever the retry that finds it says.
    pub expires_in_doubt: bool,
    /// A reconciler or an operator resolved the claim (`resolved_at` is
    /// set): its state is theirs, not its holder's.
    pub resolved: bool,
    /// How the claim got to its state (`state_reason`): with `resolved`,
    /// who wrote it (`Existing::written_by_its_holder`).
    pub reason: Option<String>,
    /// The stored `Ok` value, when asked for and present (and kept: not
    /// past its window).
    pub output: Option<String>,
    /// The outcome is in and its slot's window is over (by the
    /// database's clock): the row holds the slot no more, and the next
    /// claim reopens it ([`REOPEN_EXPIRED`]).
    pub slot_expired: bool,
    /// The success is in and its value's window is over: what was kept
    /// with it (the value, the fingerprint) is kept no more.
    pub value_expired: bool,
    /// The row has a window at all: its outcome is not final for ever, so
    /// no process may remember it.
    pub windowed: bool,
}

/// `state_reason` of a failure its holder kept ([`KEEP`]).
pub(crate) const KEPT_FAILURE: &str = "kept_failure";
/// `state_reason` of a claim its holder's body held in doubt
/// ([`HOLD_IN_DOUBT`]).
pub(crate) const BODY_IN_DOUBT: &str = "body_in_doubt";

/// The text of [`LATE_SUCCESS`], a macro so that the statement that writes
/// it ([`SETTLE_OVER`]) joins the same text the readers compare with.
macro_rules! late_success {
    () => {
        "late_success"
    };
}
/// `state_reason` of a success written by a holder whose claim was no
/// longer its own ([`SETTLE_OVER`]): over the row of the holder that
/// replaced it, which must not take it for its own.
pub(crate) const LATE_SUCCESS: &str = late_success!();

/// The text of [`LEASE_EXPIRED`], a macro so that the statements that write
/// it ([`EXPIRE_IN_DOUBT`]) and match on it ([`SETTLE_OWN_HOLD`]) join the
/// same text the readers compare with.
macro_rules! lease_expired {
    () => {
        "lease_expired"
    };
}
/// `state_reason` of a pending claim a looker turned in doubt because its
/// lease ran out ([`EXPIRE_IN_DOUBT`], `on_expiry = "in_doubt"`).
pub(crate) const LEASE_EXPIRED: &str = lease_expired!();

impl Existing {
    /// Whether the row's state was written by the holder of its fence
    /// itself (its settle, its kept failure, its body's doubt) rather than
    /// by somebody else over its row: a reconciler or an operator
    /// (`resolved_at`), a looker that found its lease run out
    /// (`lease_expired`), or an earlier holder's late success
    /// ([`LATE_SUCCESS`]). Read from the row, not from a statement's reply,
    /// so a holder that repeats its statement after a lost reply still
    /// knows its own outcome. A pending row is its holder's.
    pub(crate) fn written_by_its_holder(&self) -> bool {
        let reason = self.reason.as_deref();
        !self.resolved
            && match self.state {
                ClaimState::Pending => true,
                ClaimState::Success => reason.is_none(),
                ClaimState::Failed => reason == Some(KEPT_FAILURE),
                ClaimState::InDoubt => reason == Some(BODY_IN_DOUBT),
            }
    }
}

/// The text of [`CLAIM`] with its namespace test: the claim, and the whole
/// gate, in one statement whose insert decides.
///
/// It looks first, in the same statement, so that a duplicate of a visible
/// claim (the common duplicate: a retry of something settled or long in
/// flight) is answered by this one round trip instead of an insert that
/// conflicts and then a lookup: a refusal costs what a hand-written `SELECT`
/// does. When the lookup finds nothing the `INSERT ... ON CONFLICT DO
/// NOTHING` runs, and a conflict with either partial unique index means
/// somebody else holds the slot. The lookup is an early-out only: a row it
/// cannot see (committed after the statement's snapshot, or not committed
/// yet) still stops the insert, and then no row comes back at all, which
/// [`claim`] answers with a plain [`lookup`] under a new snapshot.
///
/// `$1` account, `$2` address, `$3` namespace, `$4` identity, `$5`
/// fingerprint, `$6` lease in microseconds (NULL: none), `$7` whether to
/// return the stored output, `$8` and `$9` the value's and the slot's
/// windows in microseconds (NULL: for ever), `$10` `expires_in_doubt`
/// (`true`, or NULL: take over).
///
/// Its look is served by the partial unique index its namespace test
/// implies; its insert is arbitrated by both (`ON CONFLICT DO NOTHING`
/// names no index, so a conflict with either stops it).
macro_rules! claim_statement {
    ($namespace_test:literal) => {
        concat!(
            "WITH existing AS ( \
                 SELECT ",
            existing_columns!(),
            ", CASE WHEN $7 THEN coalesce(output_json, output::text) END AS output \
                 FROM idem_records \
                 WHERE account = $1 AND kind = 'claim' AND address = $2 AND ",
            $namespace_test,
            " ), claimed AS ( \
                 INSERT INTO idem_records \
                   (account, kind, address, namespace, state, identity, fingerprint, \
                    lease_expires_at, expires_in_doubt, value_kept_for, slot_kept_for) \
                 SELECT $1, 'claim', $2, $3, 'pending', $4, $5, \
                        now() + $6 * interval '1 microsecond', $10, \
                        $8 * interval '1 microsecond', $9 * interval '1 microsecond' \
                 WHERE NOT EXISTS (SELECT FROM existing) \
                 ON CONFLICT DO NOTHING \
                 RETURNING fence \
             ) \
             SELECT true AS won, fence, NULL::bigint AS lineage, NULL::boolean AS settled, \
                    NULL::text AS state, NULL::bytea AS identity, NULL::bytea AS fingerprint, \
                    NULL::boolean AS lease_expired, NULL::boolean AS expires_in_doubt, \
                    NULL::boolean AS resolved, \
                    NULL::text AS reason, NULL::text AS output, NULL::boolean AS slot_expired, \
                    NULL::boolean AS value_expired, NULL::boolean AS windowed \
             FROM claimed \
             UNION ALL \
             SELECT false, fence, lineage, settled, state, identity, fingerprint, lease_expired, \
                    expires_in_doubt, resolved, reason, output, slot_expired, value_expired, \
                    windowed \
             FROM existing"
        )
    };
}

/// The columns of an [`Existing`] row, by the names [`Existing::from_row`]
/// reads; `$7` (claim) or `$4` (lookup) says whether to return the stored
/// output. A value settled before schema version 4 is still in `output`.
/// Only a `pending` row's lease can have run out: the states a claim leaves
/// `pending` for clear it, and the test says so regardless. Only a
/// recorded outcome (a success, a kept failure) has windows that run:
/// one pending or in doubt holds its slot until it is resolved. A success
/// a prune compacted (`compacted!`: its identity an 8-byte check, its
/// value window cleared) is past its value's window for good, and is
/// never remembered by a cache that would hand out a value.
macro_rules! existing_columns {
    () => {
        "state = 'success' AS settled, state, identity, fingerprint, fence, \
         coalesce(first_fence, fence) AS lineage, \
         (state = 'pending' AND coalesce(lease_expires_at < now(), false)) AS lease_expired, \
         coalesce(expires_in_doubt, false) AS expires_in_doubt, \
         resolved_at IS NOT NULL AS resolved, state_reason AS reason, \
         coalesce(state IN ('success', 'failed') AND now() - settled_at > slot_kept_for, false) \
             AS slot_expired, \
         (state = 'success' AND (coalesce(now() - settled_at > value_kept_for, false) \
                                 OR octet_length(identity) <= 8)) \
             AS value_expired, \
         (value_kept_for IS NOT NULL OR slot_kept_for IS NOT NULL \
          OR octet_length(identity) <= 8) AS windowed"
    };
}
pub(super) use existing_columns;

/// Claims a slot, or finds the row that holds it, in one statement (see
/// `claim_statement!`). Index: the partial unique index of its form.
pub const CLAIM: SplitOnNamespace = SplitOnNamespace {
    without_namespace: claim_statement!("namespace IS NULL AND $3::text IS NULL"),
    within_namespace: claim_statement!("namespace = $3"),
};

/// The claim on Citus: the insert alone, which Citus routes to the worker
/// holding the account's shard (the one-statement [`CLAIM`] is planned
/// there as steps whose intermediate results go to every worker, so a
/// stopped worker would refuse every account's claims, and each claim
/// would cost several hops). When it inserts nothing, the caller looks the
/// holder up with [`LOOKUP`], as it does when [`CLAIM`] meets a row it
/// cannot see. One text serves both forms: the insert is arbitrated by
/// whichever partial unique index the new row's namespace falls under.
///
/// `$1` account, `$2` address, `$3` namespace, `$4` identity, `$5`
/// fingerprint, `$6` lease in microseconds (NULL: none), `$7` and `$8` the
/// value's and the slot's windows in microseconds (NULL: for ever), `$9`
/// `expires_in_doubt` (`true`, or NULL: take over).
pub const CLAIM_ROUTED: SplitOnNamespace = SplitOnNamespace {
    without_namespace: CLAIM_ROUTED_STATEMENT,
    within_namespace: CLAIM_ROUTED_STATEMENT,
};

/// The text of [`CLAIM_ROUTED`].
const CLAIM_ROUTED_STATEMENT: &str = "INSERT INTO idem_records \
       (account, kind, address, namespace, state, identity, fingerprint, lease_expires_at, \
        value_kept_for, slot_kept_for, expires_in_doubt) \
     VALUES ($1, 'claim', $2, $3, 'pending', $4, $5, now() + $6 * interval '1 microsecond', \
             $7 * interval '1 microsecond', $8 * interval '1 microsecond', $9) \
     ON CONFLICT DO NOTHING \
     RETURNING fence";

/// What the claim statement answered: the slot won, or who holds it.
#[derive(Debug)]
pub enum ClaimAnswer {
    /// This statement inserted the claim, with this fence.
    Won(i64),
    /// The row of the slot's holder, which the statement could see.
    Holder(Existing),
    /// The insert met a row the statement's snapshot cannot see (or, on
    /// Citus, any row: the routed claim does not look): look again.
    Hidden,
    /// An ordered event: an event of its entity with a newer order
    /// (`applied`) was applied. Nothing was written but the entity's fold.
    Superseded {
        /// The newest order applied for the entity.
        applied: i64,
    },
    /// An ordered event: another event of its entity runs, or may have run
    /// (pending or in doubt). Nothing was claimed.
    EntityHeld {
        /// The holder changed after the statement's snapshot: a new
        /// statement may find it done.
        stale: bool,
    },
    /// An ordered event: the entity's address is held by another entity's
    /// identity (a digest collision). Nothing was claimed.
    EntityCollision,
}

/// The row holding a slot, as [`Existing`] reads it. `$4`: whether to return
/// the stored output (it may be large). Index: the partial unique index of
/// its form, as for every `per_row!` statement.
pub const LOOKUP: SplitOnNamespace = per_row!(concat!(
    "SELECT ",
    existing_columns!(),
    ", CASE WHEN $4 THEN coalesce(output_json, output::text) END AS output \
         FROM idem_records"
));

/// The end of an outcome statement over a holder's own row: whether a
/// duplicate in another process waits on it ([`MARK_AWAITED`]), so that
/// the holder wakes it (`wakeup`); `false` for the rows nobody marked.
macro_rules! awaited {
    () => {
        "RETURNING coalesce(awaited, false)"
    };
}

/// Marks a pending claim as waited on by a duplicate in another process
/// (schema version 13), if it is still the one that was seen (`$4`, its
/// fence): the outcome statements then return the mark (`awaited!`), and
/// its holder wakes the waiters. Sent only by a waiter, once per claim it
/// waits on, after it listens: either the holder's outcome statement sees
/// the mark, or the mark finds the row no longer pending under that fence
/// (and the waiter looks). No index reads the column, so the update is
/// heap-only where the page has room. Index: the partial unique index of
/// its form.
pub const MARK_AWAITED: SplitOnNamespace = per_row!(
    "UPDATE idem_records SET awaited = true",
    "state = 'pending' AND fence = $4"
);

/// Marks the holder's pending claim settled. `$4`: the holder's fence; `$5`:
/// the output to keep, or NULL. The output
/// is kept as the text serde_json wrote, not as `jsonb`, which refuses some
/// of what JSON can say (`\u0000`): a settle must never fail because of the
/// value it carries. `settled_at` is the statement's time, not its
/// transaction's start (`now()`): in the caller's transaction, begun long
/// before, a window (`slot_expired!`) must run from the outcome, not end
/// before the commit that records it. Every outcome statement stamps it
/// so. Index: the partial unique index of its form.
pub const SETTLE: PerCommit<SplitOnNamespace> = per_commit!(
    opening "FROM",
    per_row!(
        "UPDATE idem_records \
         SET state = 'success', settled_at = statement_timestamp(), lease_expires_at = NULL, output_json = $5",
        "state = 'pending' AND fence = $4";
        awaited!()
    )
);

/// The text of [`SETTLE_CARRYING_STEP`] ending in `$select`, with the
/// namespace test of both rows.
macro_rules! settle_carrying_step {
    ($select:expr) => {
        SplitOnNamespace {
            without_namespace: settle_carrying_step!(@"namespace IS NULL AND $3::text IS NULL", $select),
            within_namespace: settle_carrying_step!(@"namespace = $3", $select),
        }
    };
    (@$namespace_test:literal, $select:expr) => {
        concat!(
            "WITH ",
            super::steps::recording_carried!("$6", "$7", "$4", "$2", $namespace_test),
            ", settled AS (UPDATE idem_records \
               SET state = 'success', settled_at = statement_timestamp(), lease_expires_at = NULL, \
                   output_json = $5 \
               WHERE account = $1 AND kind = 'claim' AND address = $2 AND ",
            $namespace_test,
            " AND state = 'pending' AND fence = $4 \
               RETURNING awaited) ",
            $select
        )
    };
}

/// [`SETTLE`], carrying the record of the step the body finished last
/// (its address `$6` and value `$7`): the step's value
/// goes over the holder's own marker as
/// [`RECORD_STEP`](super::steps::RECORD_STEP) writes it, and the claim is
/// settled, in one statement and one commit. Each says in its own column
/// whether it wrote: the record does not depend on the claim (a success
/// that happened is never lost), and the settle's `false` is looked into
/// as [`SETTLE`]'s is. `$1`–`$5` as `SETTLE`'s; `$6` the step's address,
/// `$7` its value. Index: the partial unique index of its form, for both
/// rows.
pub const SETTLE_CARRYING_STEP: PerCommit<SplitOnNamespace> = per_commit!(
    opening "FROM",
    settle_carrying_step!(
        "SELECT EXISTS (SELECT FROM settled) AS settled, \
                EXISTS (SELECT FROM recorded) AS recorded, \
                coalesce((SELECT awaited FROM settled), false) AS awaited"
    )
);

/// Deletes the holder's pending claim, freeing the slot, and stamps its
/// steps released (`stamping_released_steps!`). `$4`: the holder's
/// fence. Index: the partial unique index of its form; the steps', for
/// the stamp.
pub const RELEASE: PerCommit<SplitOnNamespace> = per_commit!(
    opening "USING",
    per_row!(
        "WITH released AS (DELETE FROM idem_records",
        "state = 'pending' AND fence = $4";
        released("awaited", "coalesce(r.awaited, false)")
    )
);

/// Keeps the holder's pending claim as a definite failure: duplicates are
/// refused, never run. `$4`: the holder's fence; `$5`: how it got there
/// (`state_reason`). Index: the partial unique index of its form.
pub const KEEP: PerCommit<SplitOnNamespace> = per_commit!(
    opening "FROM",
    per_row!(
        "UPDATE idem_records \
         SET state = 'failed', settled_at = statement_timestamp(), lease_expires_at = NULL, state_reason = $5",
        "state = 'pending' AND fence = $4";
        awaited!()
    )
);

/// Holds the holder's pending claim in doubt: its outcome is unknown, so
/// nobody runs it until a reconciler or an operator resolves it. The lease
/// is cleared, so it can never be taken over; `in_doubt_since` says when it
/// turned. `$4`: the holder's fence; `$5`: how it got there
/// (`state_reason`). Index: the partial unique index of its form.
pub const HOLD_IN_DOUBT: SplitOnNamespace = per_row!(
    "UPDATE idem_records \
     SET state = 'in_doubt', lease_expires_at = NULL, state_reason = $5, \
         in_doubt_since = now()",
    "state = 'pending' AND fence = $4";
    awaited!()
);

/// Turns a pending claim whose lease ran out in doubt, if it is still the
/// one that was seen (`$4`, its fence): for an action whose expiry means
/// "the outcome is unknown", not "run it again". Of several lookers, one
/// changes it; a holder that settles first wins, and this then changes
/// nothing. It has been in doubt since its lease ran out
/// (`in_doubt_since`), however much later someone looked. Index: the
/// partial unique index of its form.
pub const EXPIRE_IN_DOUBT: SplitOnNamespace = per_row!(
    concat!(
        "UPDATE idem_records \
         SET state = 'in_doubt', lease_expires_at = NULL, state_reason = '",
        lease_expired!(),
        "', in_doubt_since = lease_expires_at"
    ),
    "state = 'pending' AND fence = $4 AND lease_expires_at < now()"
);

/// Renews the holder's lease. `$4`: the holder's fence; `$5`: the new lease
/// in microseconds. Only a claim that has a lease is extended: one made
/// without holds until it is resolved, and must never become expirable.
/// Index: the partial unique index of its form.
pub const EXTEND: SplitOnNamespace = per_row!(
    "UPDATE idem_records SET lease_expires_at = now() + $5 * interval '1 microsecond'",
    "state = 'pending' AND fence = $4 AND lease_expires_at IS NOT NULL"
);

/// Takes over a pending claim whose lease ran out, if it is still the one
/// that was seen (`$4`, its fence): exactly one of several takers wins, and
/// the fence it gets back (from the sequence) outranks every earlier one.
/// The row keeps its lineage (the fence it began with), not the mark of
/// those who waited on the claim it replaces ([`MARK_AWAITED`] is per
/// claim: they mark the new one when they look again). `$5`: the new lease
/// in microseconds, or NULL; `$6`: the new fingerprint. A claim made with
/// `on_expiry = "in_doubt"` is never taken over, whoever asks: the judge
/// turns it in doubt instead, and the statement refuses it too, so that no
/// caller can get that wrong. Its taker says `take_over`, as the row does,
/// so the row keeps `expires_in_doubt` NULL. Index: the partial unique
/// index of its form.
///
/// The fence is drawn in a materialized CTE, not in the `SET` list: Citus
/// refuses a volatile function in an `UPDATE` of a distributed table
/// ("functions used in UPDATE queries on distributed tables must not be
/// VOLATILE"), while it runs a CTE on the coordinator first and hands its
/// one row to the worker. The guarantee is the same on one PostgreSQL and
/// on Citus: one value drawn from the one sequence, before the row changes,
/// so it is new and above every fence drawn before it; a taker that loses
/// the race leaves a gap in the sequence, nothing else.
pub const TAKE_OVER: SplitOnNamespace = per_row!(
    "WITH drawn AS MATERIALIZED (SELECT nextval('idem_records_fence_seq') AS next_fence) \
     UPDATE idem_records \
     SET fence = drawn.next_fence, created_at = now(), fingerprint = $6, \
         first_fence = coalesce(first_fence, fence), awaited = NULL, \
         lease_expires_at = now() + $5 * interval '1 microsecond' \
     FROM drawn",
    "state = 'pending' AND fence = $4 AND lease_expires_at < now() \
     AND expires_in_doubt IS NOT TRUE";
    "RETURNING fence, first_fence AS lineage"
);

/// Records the success of a holder whose claim is no longer its own (taken
/// over, or released and claimed anew, or turned in doubt when its lease
/// ran out) over the row that replaced it, if that is still the one that
/// was seen (`$4`, its fence) and its outcome is still open (pending, or in
/// doubt: the success is the outcome nobody knew). A success that happened
/// is a fact the slot must keep: without this, the new holder's release
/// would free the slot and a retry would run the action once more. The row
/// keeps its fence, so the new holder's own settle or release finds it
/// settled, and `state_reason` says `LATE_SUCCESS`, so that holder knows
/// the success is not its own. `$5`: the output; `$6`: the fingerprint of
/// the payload the output belongs to. Index: the partial unique index of
/// its form.
pub const SETTLE_OVER: SplitOnNamespace = per_row!(
    concat!(
        "UPDATE idem_records \
         SET state = 'success', settled_at = statement_timestamp(), lease_expires_at = NULL, output_json = $5, \
             fingerprint = $6, state_reason = '",
        late_success!(),
        "'"
    ),
    "state IN ('pending', 'in_doubt') AND fence = $4"
);

/// Records the success of a holder whose own claim its lease turned in
/// doubt ([`EXPIRE_IN_DOUBT`], `on_expiry = "in_doubt"`) while nobody took
/// it over: matched on its fence (`$4`) and on that reason, so only the
/// hold its own expiry made. The outcome is the holder's own, as if it had
/// settled in time, so `state_reason` is cleared: a settle repeated after
/// this reply was lost reads the row back as its own, where
/// [`SETTLE_OVER`]'s `late_success` would say somebody else wrote it.
/// `$5`: the output; `$6`: the fingerprint. Index: the partial unique index
/// of its form.
pub const SETTLE_OWN_HOLD: SplitOnNamespace = per_row!(
    "UPDATE idem_records \
     SET state = 'success', settled_at = statement_timestamp(), lease_expires_at = NULL, output_json = $5, \
         fingerprint = $6, state_reason = NULL",
    concat!(
        "state = 'in_doubt' AND state_reason = '",
        lease_expired!(),
        "' AND fence = $4"
    )
);

/// The text of [`SETTLE_VACANT`], with the entity's namespace test.
macro_rules! settle_vacant_statement {
    ($entity_namespace_test:literal) => {
        concat!(
            "WITH settled AS (INSERT INTO idem_records \
               (account, kind, address, namespace, state, identity, fingerprint, settled_at, \
                output_json, value_kept_for, slot_kept_for, entity, event_order) \
             VALUES ($1, 'claim', $2, $3, 'success', $4, $5, statement_timestamp(), $6, \
                     $7 * interval '1 microsecond', $8 * interval '1 microsecond', $9, $10) \
             ON CONFLICT DO NOTHING RETURNING 1), \
             applied AS (UPDATE idem_records e SET applied_order = greatest(e.applied_order, $10) \
               WHERE e.account = $1 AND e.kind = 'entity' AND e.address = $9 AND ",
            $entity_namespace_test,
            " AND EXISTS (SELECT FROM settled)) \
             SELECT FROM settled"
        )
    };
}

/// Records the success of a holder whose claim was released (by the holder
/// that took it over, or by an operator) while nobody holds the slot: a
/// settled row, as if claimed and settled at once. `$4`: the identity;
/// `$5`: the fingerprint; `$6`: the output; `$7`, `$8`: the value's and the
/// slot's windows in microseconds (NULL: for ever), as the claim wrote
/// them, so that the late success is kept no longer, and no shorter, than
/// its action said. `$9`, `$10`: an ordered event's entity and order (NULL
/// for any other claim): the row names them as its claim did, and the
/// entity counts the success as applied in the same statement (its release
/// freed the entity, so no later claim would read this row as its holder's).
/// The insert is arbitrated by whichever partial unique index the new
/// row's namespace falls under; the entity is found through the one of its
/// form.
pub const SETTLE_VACANT: SplitOnNamespace = SplitOnNamespace {
    without_namespace: settle_vacant_statement!("e.namespace IS NULL AND $3::text IS NULL"),
    within_namespace: settle_vacant_statement!("e.namespace = $3"),
};

/// What an outcome statement over a holder's own row did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Wrote {
    /// No pending row under the holder's fence: it changed nothing.
    Nothing,
    /// It wrote the holder's row. `awaited`: a duplicate in another
    /// process waits on it ([`MARK_AWAITED`]), to be woken.
    Row {
        /// Somebody waits on the row.
        awaited: bool,
    },
}

impl Wrote {
    /// The holder's row was written by a statement that did not say
    /// whether anybody waits on it (its answer was lost, or it wrote over
    /// a row the holder found in another state): taken as awaited, since
    /// a wake-up nobody hears is cheap and one not sent costs a waiter up
    /// to a second. A rare path.
    pub const UNSAID: Wrote = Wrote::Row { awaited: true };

    /// Whether it changed the holder's row.
    pub fn changed(self) -> bool {
        matches!(self, Wrote::Row { .. })
    }

    /// Whether a duplicate in another process waits on what was written.
    pub fn awaited(self) -> bool {
        matches!(self, Wrote::Row { awaited: true })
    }
}

/// Runs `query`, an outcome statement matched on one holder's row that
/// ends in [`awaited!`]: what it wrote.
async fn wrote_one<'e>(
    query: Query<'_, Postgres, PgArguments>,
    executor: impl PgExecutor<'e>,
) -> Result<Wrote, sqlx::Error> {
    Ok(match query.fetch_optional(executor).await? {
        None => Wrote::Nothing,
        Some(row) => Wrote::Row {
            awaited: row.try_get(0)?,
        },
    })
}

/// Runs `query` (a statement matched on one row's address and fence, or an
/// insert into one slot); `true` when it changed exactly that row.
pub(super) async fn changed_one<'e>(
    query: Query<'_, Postgres, PgArguments>,
    executor: impl PgExecutor<'e>,
) -> Result<bool, sqlx::Error> {
    Ok(query.execute(executor).await?.rows_affected() == 1)
}

/// Whether a statement that finds a settled slot reads its kept value:
/// only a caller that replays it needs those bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeptValue {
    /// Read the value kept for replay.
    Read,
    /// Leave it where it is.
    Skip,
}

impl KeptValue {
    /// [`Read`](KeptValue::Read) for a caller that replays.
    pub fn read_if(replays: bool) -> KeptValue {
        if replays {
            KeptValue::Read
        } else {
            KeptValue::Skip
        }
    }

    /// Whether it is read, as the statements bind it.
    pub fn is_read(self) -> bool {
        self == KeptValue::Read
    }
}

/// Where a claim's statements run, which a claim of several statements
/// (an ordered event's, on Citus) must know to commit them as one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Within {
    /// On a connection of the gate's pool, each statement committing on its
    /// own: a claim of several statements opens a transaction of its own.
    Autocommit,
    /// Inside the caller's transaction, whose commit decides.
    CallersTransaction,
}

/// Claims the slot, or finds who holds it: in one statement ([`CLAIM`]) on
/// PostgreSQL; on Citus the insert alone ([`CLAIM_ROUTED`]), a row it
/// could not insert then being [`ClaimAnswer::Hidden`] for the caller to look
/// up. An ordered event's claim is `ordered::claim_ordered`'s (in one
/// statement), or on Citus `ordered::claim_ordered_routed`'s (in routed
/// statements, one transaction: `within` says whose).
pub async fn claim(
    conn: &mut PgConnection,
    engine: Engine,
    within: Within,
    scope: Scope<'_>,
    address: &str,
    claim: NewClaim<'_>,
    kept_value: KeptValue,
) -> Result<ClaimAnswer, sqlx::Error> {
    if let Some(ordered) = claim.ordered {
        return match engine {
            Engine::PostgreSQL => {
                super::ordered::claim_ordered(conn, scope, address, claim, ordered, kept_value)
                    .await
            }
            Engine::Citus => {
                super::ordered::claim_ordered_routed(
                    conn, within, scope, address, claim, ordered, kept_value,
                )
                .await
            }
        };
    }
    if engine == Engine::Citus {
        let fence = CLAIM_ROUTED
            .for_row(scope, address)
            .bind(claim.identity)
            .bind(claim.fingerprint)
            .bind(claim.lease_micros)
            .bind(claim.windows.value_micros)
            .bind(claim.windows.slot_micros)
            .bind(claim.expires_in_doubt())
            .fetch_optional(conn)
            .await?;
        return match fence {
            Some(row) => Ok(ClaimAnswer::Won(row.try_get("fence")?)),
            None => Ok(ClaimAnswer::Hidden),
        };
    }
    let row = CLAIM
        .for_row(scope, address)
        .bind(claim.identity)
        .bind(claim.fingerprint)
        .bind(claim.lease_micros)
        .bind(kept_value.is_read())
        .bind(claim.windows.value_micros)
        .bind(claim.windows.slot_micros)
        .bind(claim.expires_in_doubt())
        .fetch_optional(conn)
        .await?;
    let Some(row) = row else {
        return Ok(ClaimAnswer::Hidden);
    };
    if row.try_get::<bool, _>("won")? {
        return Ok(ClaimAnswer::Won(row.try_get("fence")?));
    }
    Existing::from_row(&row).map(ClaimAnswer::Holder)
}

/// The row holding a slot, if any is still there.
pub async fn lookup<'e>(
    executor: impl PgExecutor<'e>,
    scope: Scope<'_>,
    address: &str,
    kept_value: KeptValue,
) -> Result<Option<Existing>, sqlx::Error> {
    LOOKUP
        .for_row(scope, address)
        .bind(kept_value.is_read())
        .fetch_optional(executor)
        .await?
        .as_ref()
        .map(Existing::from_row)
        .transpose()
}

/// Marks a pending claim settled, keeping `output`. [`Wrote::Nothing`]:
/// the row is no longer pending under this fence.
pub async fn settle<'e>(
    executor: impl PgExecutor<'e>,
    scope: Scope<'_>,
    address: &str,
    fence: i64,
    output: Option<&str>,
    commit: Commit,
) -> Result<Wrote, sqlx::Error> {
    let statement = SETTLE.committing(commit);
    wrote_one(
        statement.for_row(scope, address).bind(fence).bind(output),
        executor,
    )
    .await
}

/// Settles a pending claim, keeping `output`, and records `carried` over
/// its holder's marker ([`SETTLE_CARRYING_STEP`]).
pub(crate) async fn settle_carrying_step<'e>(
    executor: impl PgExecutor<'e>,
    scope: Scope<'_>,
    address: &str,
    fence: i64,
    output: Option<&str>,
    carried: super::steps::CarriedRecord<'_>,
    commit: Commit,
) -> Result<SettledCarrying, sqlx::Error> {
    let row = SETTLE_CARRYING_STEP
        .committing(commit)
        .for_row(scope, address)
        .bind(fence)
        .bind(output)
        .bind(carried.address)
        .bind(carried.output)
        .fetch_one(executor)
        .await?;
    Ok(SettledCarrying {
        settled: if row.try_get("settled")? {
            Wrote::Row {
                awaited: row.try_get("awaited")?,
            }
        } else {
            Wrote::Nothing
        },
        recorded: row.try_get("recorded")?,
    })
}

/// What [`SETTLE_CARRYING_STEP`] wrote.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SettledCarrying {
    /// What the settle wrote.
    pub settled: Wrote,
    /// The step's record went over the holder's marker.
    pub recorded: bool,
}

/// Deletes a pending claim. [`Wrote::Nothing`]: the row is no longer
/// pending under this fence.
pub async fn release<'e>(
    executor: impl PgExecutor<'e>,
    scope: Scope<'_>,
    address: &str,
    fence: i64,
    commit: Commit,
) -> Result<Wrote, sqlx::Error> {
    let statement = RELEASE.committing(commit);
    wrote_one(statement.for_row(scope, address).bind(fence), executor).await
}

/// Keeps a pending claim as a definite failure ([`KEEP`]), saying why in
/// `reason`. [`Wrote::Nothing`]: the row is no longer pending under this
/// fence.
pub async fn keep<'e>(
    executor: impl PgExecutor<'e>,
    scope: Scope<'_>,
    address: &str,
    fence: i64,
    commit: Commit,
    reason: &str,
) -> Result<Wrote, sqlx::Error> {
    let statement = KEEP.committing(commit);
    wrote_one(
        statement.for_row(scope, address).bind(fence).bind(reason),
        executor,
    )
    .await
}

/// Marks the pending claim of `fence` as waited on ([`MARK_AWAITED`]).
/// `false`: the row is no longer pending under this fence (look at it).
pub(crate) async fn mark_awaited<'e>(
    executor: impl PgExecutor<'e>,
    scope: Scope<'_>,
    address: &str,
    fence: i64,
) -> Result<bool, sqlx::Error> {
    changed_one(MARK_AWAITED.for_row(scope, address).bind(fence), executor).await
}

/// The text of [`LANDED_CHANNEL`], a macro so that [`WAKE`] joins it.
macro_rules! landed_channel {
    () => {
        "idem_landed"
    };
}

/// The channel a holder wakes the duplicates waiting in other processes on
/// ([`WAKE`]); its payload is the claim's address.
pub(crate) const LANDED_CHANNEL: &str = landed_channel!();

/// Wakes the duplicates waiting on a claim in other processes: sent by its
/// holder after an outcome statement found the claim marked
/// ([`MARK_AWAITED`]), never otherwise. `$1`: the claim's address. A
/// notification sent from an autocommitted statement is delivered at
/// once; the channel is `idem_landed`.
pub const WAKE: &str = concat!("SELECT pg_notify('", landed_channel!(), "', $1)");

/// [`WAKE`] for the claims at `$1` (`text[]`), in one statement: a
/// batch's outcomes.
pub const WAKE_ALL: &str = concat!(
    "SELECT pg_notify('",
    landed_channel!(),
    "', address) FROM unnest($1::text[]) AS address"
);

/// Sends [`WAKE_ALL`] for the claims at `addresses`.
pub(crate) async fn wake_all<'e>(
    executor: impl PgExecutor<'e>,
    addresses: &[String],
) -> Result<(), sqlx::Error> {
    sqlx::query(WAKE_ALL)
        .bind(addresses)
        .execute(executor)
        .await?;
    Ok(())
}

/// Sends [`WAKE`] for the claim at `address`.
pub(crate) async fn wake<'e>(
    executor: impl PgExecutor<'e>,
    address: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(WAKE).bind(address).execute(executor).await?;
    Ok(())
}

/// Holds a pending claim in doubt ([`HOLD_IN_DOUBT`]), saying why in
/// `reason`. [`Wrote::Nothing`]: the row is no longer pending under this
/// fence.
pub async fn hold_in_doubt<'e>(
    executor: impl PgExecutor<'e>,
    scope: Scope<'_>,
    address: &str,
    fence: i64,
    reason: &str,
) -> Result<Wrote, sqlx::Error> {
    wrote_one(
        HOLD_IN_DOUBT
            .for_row(scope, address)
            .bind(fence)
            .bind(reason),
        executor,
    )
    .await
}

/// The test that a claim's slot is past its window: a recorded outcome (a
/// success, a kept failure) whose `slot_kept_for` has run since it was
/// recorded, by the database's clock. The one rule the claim, the
/// reopening and prune share.
///
/// Written `now() - settled_at > slot_kept_for`, not `settled_at +
/// slot_kept_for < now()`: adding an interval to a `timestamptz` is a
/// stable function (it depends on the time zone, for days and months), and
/// Citus refuses a stable function over a column in an `UPDATE` or a
/// `DELETE`; the difference of two `timestamptz` is immutable, and `now()`
/// alone it evaluates first.
macro_rules! slot_expired {
    () => {
        "state IN ('success', 'failed') AND now() - settled_at > slot_kept_for"
    };
}
pub(super) use slot_expired;

/// The test of a claim a prune compacts ([`compacted!`]): a success past
/// the window in which its value is kept
/// ([`keep_value_for`](crate::Guard::keep_value_for)), by the database's
/// clock as every duplicate judges it (`value_expired` in
/// `existing_columns!`), and not compacted yet (no canonical identity is
/// 8 bytes or shorter: `identity::COMPACTED_LEN`), so that compacting is
/// idempotent and a batch never rewrites a row twice.
macro_rules! compactable {
    () => {
        "kind = 'claim' AND state = 'success' AND now() - settled_at > value_kept_for \
         AND octet_length(identity) > 8"
    };
}
pub(super) use compactable;

/// What a prune leaves of a claim past its value's window: the slot, its
/// state and windows, and of the identity only the check a duplicate's
/// collision test needs (`identity::compacted`: the first 8 bytes of its
/// SHA-256); no value, no fingerprint (whose window is the value's),
/// `first_fence` only where it says something (`coalesce(first_fence,
/// fence)` reads the same without it when the two are equal), and no
/// value window (a compacted identity says the value's window is over:
/// `existing_columns!`), and no creation time (nothing judges a settled
/// claim by it, and what shows one reads `coalesce(created_at,
/// settled_at)`: `sql/v11.sql`). What stays: BENCHMARKS.md, "Bytes per
/// settled key".
macro_rules! compacted {
    () => {
        "identity = substring(sha256(identity) FROM 1 FOR 8), fingerprint = NULL, \
         output = NULL, output_json = NULL, first_fence = NULLIF(first_fence, fence), \
         value_kept_for = NULL, created_at = NULL"
    };
}
pub(super) use compacted;

/// Deletes the steps of a claim whose slot expired, before the claim
/// itself ([`REOPEN_EXPIRED`]): the next claim of the slot is a new action,
/// whose steps must run anew, never replay the old ones. Only steps
/// written under fences up to the expired claim's (`$4`): a step of a
/// newer holder (who reopened the slot first) has a higher fence, drawn
/// after. `$1` account, `$2` the claim's address, `$3` namespace. Index:
/// the index of a claim's steps.
pub const REOPEN_EXPIRED_STEPS: SplitOnNamespace = SplitOnNamespace {
    without_namespace: "DELETE FROM idem_records \
         WHERE account = $1 AND kind = 'step' AND claim_address = $2 \
           AND namespace IS NULL AND $3::text IS NULL AND fence <= $4",
    within_namespace: "DELETE FROM idem_records \
         WHERE account = $1 AND kind = 'step' AND claim_address = $2 \
           AND namespace = $3 AND fence <= $4",
};

/// Deletes the claim last seen with fence `$4` if its slot is past its
/// window, so that the claim that found it can claim the slot anew (by the
/// insert, which still decides among several that found it). Index: the
/// partial unique index of its form.
pub const REOPEN_EXPIRED: SplitOnNamespace = per_row!(
    "DELETE FROM idem_records",
    concat!("fence = $4 AND ", slot_expired!())
);

/// Reopens the slot whose claim, last seen with fence `seen`, is past its
/// window: its steps first ([`REOPEN_EXPIRED_STEPS`]), then the claim
/// ([`REOPEN_EXPIRED`]). Two statements, each on its own: should the
/// second never run, the claim is still past its window and the next
/// claim reopens it. `false`: the claim changed since it was seen
/// (reopened by another, or pruned).
pub async fn reopen_expired(
    conn: &mut sqlx::PgConnection,
    scope: Scope<'_>,
    address: &str,
    seen: i64,
) -> Result<bool, sqlx::Error> {
    REOPEN_EXPIRED_STEPS
        .for_row(scope, address)
        .bind(seen)
        .execute(&mut *conn)
        .await?;
    changed_one(
        REOPEN_EXPIRED.for_row(scope, address).bind(seen),
        &mut *conn,
    )
    .await
}

/// Turns the expired pending claim last seen with fence `seen` in doubt
/// ([`EXPIRE_IN_DOUBT`]). `false`: it changed since it was seen (settled,
/// released, extended, taken over, or turned in doubt by another).
pub async fn expire_in_doubt<'e>(
    executor: impl PgExecutor<'e>,
    scope: Scope<'_>,
    address: &str,
    seen: i64,
) -> Result<bool, sqlx::Error> {
    changed_one(EXPIRE_IN_DOUBT.for_row(scope, address).bind(seen), executor).await
}

/// Renews a pending claim's lease. `false`: the claim was lost.
pub async fn extend<'e>(
    executor: impl PgExecutor<'e>,
    scope: Scope<'_>,
    address: &str,
    fence: i64,
    lease_micros: i64,
) -> Result<bool, sqlx::Error> {
    changed_one(
        EXTEND
            .for_row(scope, address)
            .bind(fence)
            .bind(lease_micros),
        executor,
    )
    .await
}

/// A claim won by taking an expired one over.
#[derive(Debug, Clone, Copy)]
pub struct TakenOver {
    /// The new holder's fence.
    pub fence: i64,
    /// The fence of the claim the row began as, kept by the takeover.
    pub lineage: i64,
}

/// Takes over an expired claim last seen with fence `seen`. `Some`: this
/// call now holds it, with a fence higher than any before.
pub async fn take_over<'e>(
    executor: impl PgExecutor<'e>,
    scope: Scope<'_>,
    address: &str,
    seen: i64,
    claim: NewClaim<'_>,
) -> Result<Option<TakenOver>, sqlx::Error> {
    TAKE_OVER
        .for_row(scope, address)
        .bind(seen)
        .bind(claim.lease_micros)
        .bind(claim.fingerprint)
        .fetch_optional(executor)
        .await?
        .map(|row| {
            Ok(TakenOver {
                fence: row.try_get("fence")?,
                lineage: row.try_get("lineage")?,
            })
        })
        .transpose()
}

/// What a late success needs to be recorded in a slot that is no longer its
/// holder's: the payload it belongs to, and the value to keep.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LateSuccess<'a> {
    pub identity: &'a [u8],
    pub fingerprint: Option<&'a [u8]>,
    pub output: Option<&'a str>,
    /// The late holder's windows: written only into a vacant slot (a row
    /// it settles over has the windows its claim wrote).
    pub windows: Windows,
    /// An ordered event's entity address and order: written only into a
    /// vacant slot, whose entity then counts the success as applied.
    pub ordered: Option<(&'a str, i64)>,
}

/// Settles the pending row last seen with fence `seen` with a late success
/// ([`SETTLE_OVER`]). `false`: the row changed since it was seen.
pub(crate) async fn settle_over<'e>(
    executor: impl PgExecutor<'e>,
    scope: Scope<'_>,
    address: &str,
    seen: i64,
    late: LateSuccess<'_>,
) -> Result<bool, sqlx::Error> {
    changed_one(
        SETTLE_OVER
            .for_row(scope, address)
            .bind(seen)
            .bind(late.output)
            .bind(late.fingerprint),
        executor,
    )
    .await
}

/// Settles this holder's own claim, held in doubt by its expired lease,
/// with its success ([`SETTLE_OWN_HOLD`]). `false`: the row changed since
/// it was seen.
pub(crate) async fn settle_own_hold<'e>(
    executor: impl PgExecutor<'e>,
    scope: Scope<'_>,
    address: &str,
    fence: i64,
    late: LateSuccess<'_>,
) -> Result<bool, sqlx::Error> {
    changed_one(
        SETTLE_OWN_HOLD
            .for_row(scope, address)
            .bind(fence)
            .bind(late.output)
            .bind(late.fingerprint),
        executor,
    )
    .await
}

/// Records a late success in a vacant slot ([`SETTLE_VACANT`]). `false`:
/// someone claimed the slot meanwhile.
pub(crate) async fn settle_vacant<'e>(
    executor: impl PgExecutor<'e>,
    scope: Scope<'_>,
    address: &str,
    late: LateSuccess<'_>,
) -> Result<bool, sqlx::Error> {
    changed_one(
        SETTLE_VACANT
            .for_row(scope, address)
            .bind(late.identity)
            .bind(late.fingerprint)
            .bind(late.output)
            .bind(late.windows.value_micros)
            .bind(late.windows.slot_micros)
            .bind(late.ordered.map(|(entity, _)| entity))
            .bind(late.ordered.map(|(_, order)| order)),
        executor,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A late success marks the row it settles, so that the holder of
    /// that row does not take the success for its own.
    #[test]
    fn a_late_success_says_so_in_the_row() {
        let marked = format!("state_reason = '{LATE_SUCCESS}'");
        for statement in [SETTLE_OVER.without_namespace, SETTLE_OVER.within_namespace] {
            assert!(statement.contains(&marked), "{statement}");
        }
    }
}
