//! What can go wrong, and what the caller should do about it.

use std::fmt;
use std::sync::Arc;

use crate::fault::{self, Fault};

/// Why a guarded invocation did not run, or why its outcome could not be
/// recorded. Every message says what to do next.
///
/// A function guarded by `#[idempotent]` returns `Result<T, E>` with
/// `E: From<Rejected>`, so a refusal reaches its caller as an ordinary error.
///
/// The variants mean one of three things:
///
/// | kind | variants | the body | what to do |
/// |---|---|---|---|
/// | **a refused duplicate**: the slot says not to run | [`InFlight`](Rejected::InFlight), [`InDoubt`](Rejected::InDoubt) | did not run (but [`InDoubt`](Rejected::InDoubt) to the caller of a [detached run](crate::Guard::run_detached) that a shutdown stopped: its body ran, and is held in doubt) | retry later |
/// | | [`StepInDoubt`](Rejected::StepInDoubt): a step of the body is in doubt | ran up to that step, which did not run again | retry later |
/// | | [`AlreadyDone`](Rejected::AlreadyDone), [`AlreadyFailed`](Rejected::AlreadyFailed) | did not run | nothing: the first invocation's outcome stands |
/// | | [`KeyReused`](Rejected::KeyReused), [`Collision`](Rejected::Collision) | did not run | use a new key |
/// | | [`Unavailable`](Rejected::Unavailable), [`StoreRefused`](Rejected::StoreRefused): the store could not be asked | did not run (or ran, and its outcome was not recorded) | retry once the database is back; fix what `fix` says |
/// | **a recording that failed**: this holder's outcome is not what the slot records | [`LeaseLost`](Rejected::LeaseLost), [`ClaimLost`](Rejected::ClaimLost), [`NotRecorded`](Rejected::NotRecorded) | ran | check the side effect: another invocation may have run, or the slot records another outcome |
/// | **a misuse**: a mistake of the calling code | [`InvalidOption`](Rejected::InvalidOption), [`InvalidScope`](Rejected::InvalidScope), [`NotGuarded`](Rejected::NotGuarded), [`WrongConnection`](Rejected::WrongConnection) | did not run, or ran and nothing was recorded (`WrongConnection`: the claim is still pending in its transaction) | change the code |
///
/// [`is_retryable`](Rejected::is_retryable) and
/// [`is_outage`](Rejected::is_outage) answer the usual questions;
/// [`reason`](Rejected::reason) names each for logs and metrics.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Rejected {
    /// Another invocation with the same identity holds the slot and has not
    /// finished (or its outcome is unknown: it crashed, was cancelled, or
    /// could not record its result). The body did not run.
    #[error(
        "another invocation of this action with the same key is in flight \
         (or its outcome is unknown); the body did not run; retry later"
    )]
    InFlight,

    /// An invocation with the same identity already succeeded. The body did
    /// not run again.
    #[error(
        "this action already succeeded with the same key; the body did not run \
         again; nothing to do"
    )]
    AlreadyDone,

    /// An invocation with the same identity already succeeded, and the
    /// value it returned was kept for replay only for a window
    /// ([`Guard::keep_value_for`](crate::Guard::keep_value_for)), which is
    /// over: the slot still refuses the duplicate, but has nothing to hand
    /// it. The body did not run again. Only a caller that replays is told
    /// this; others get [`AlreadyDone`](Rejected::AlreadyDone), as ever.
    #[error(
        "this action already succeeded with the same key; the body did not run again; its \
         value is no longer kept for replay (its window is over), so there is nothing to \
         return: nothing to do"
    )]
    ValueNotKept,

    /// The first invocation with the same identity may or may not have
    /// taken effect (its body said so with [`Disposition::InDoubt`], or its
    /// lease ran out under `on_expiry = "in_doubt"`), and the outcome is
    /// being established by a reconciler or an operator. The body did not
    /// run: running it again could do the action twice.
    ///
    /// [`Disposition::InDoubt`]: crate::Disposition::InDoubt
    #[error(
        "the outcome of the first invocation of this action with the same key is being \
         established (it may or may not have taken effect); the body did not run; retry \
         the same request later"
    )]
    InDoubt,

    /// The first invocation with the same identity failed definitively and
    /// its body kept the failure ([`Disposition::Keep`]). The body did not
    /// run again: retrying the same request will fail the same way.
    ///
    /// [`Disposition::Keep`]: crate::Disposition::Keep
    #[error(
        "this action already failed definitively with the same key; the body did not run \
         again; do not retry it: make a new request, under a new key, to try again"
    )]
    AlreadyFailed,

    /// An ordered event ([`Guard::ordered`](crate::Guard::ordered)) older
    /// than the newest event applied for its entity: applying it now would
    /// roll the entity back. The body did not run, and never will for this
    /// event: nothing to do (acknowledge it). A duplicate of an event that
    /// ran is told what its own slot says
    /// ([`AlreadyDone`](Rejected::AlreadyDone), ...), not this.
    #[error(
        "a newer event of this entity was already applied, so this older one would roll it \
         back; the body did not run; nothing to do"
    )]
    Superseded,

    /// The store could not be reached (connection refused or lost, pool
    /// timed out, server shutting down or starting up, out of resources),
    /// so the gate failed closed: the body did not run. Only this refusal
    /// is an outage: only it is retryable as such, and only it lets
    /// `on_unavailable = "run"` fail open.
    ///
    /// A claim whose insert committed just before its connection died is
    /// refused this way too, and its row stays `pending`: without a lease it
    /// refuses every retry (as [`InFlight`](Rejected::InFlight)) until an
    /// operator releases it (`idem claims list --state pending
    /// --older-than 10m`, then `idem claims release`). With a lease it
    /// expires and the next claim takes it over.
    #[error(
        "idem's store (PostgreSQL) is unavailable, so the body did not run; \
         retry when the database is reachable ({source})"
    )]
    Unavailable {
        /// The database error that closed the gate.
        #[source]
        source: Arc<sqlx::Error>,
    },

    /// The store answered, and refused the statement for a reason of its
    /// own: a permission missing, idem's table missing or older than this
    /// build, a value it cannot hold, a constraint or trigger added to the
    /// table. Not an outage: retrying will not help, and the gate never
    /// fails open on it. The body did not run (or, after a body, its
    /// outcome could not be recorded); `fix` says what to change.
    #[error(
        "idem's store (PostgreSQL) refused the statement, so the body did not run; \
         this is not an outage and retrying will not help: {fix} ({source})"
    )]
    StoreRefused {
        /// What to change so that the statement can succeed.
        fix: &'static str,
        /// The database error.
        #[source]
        source: Arc<sqlx::Error>,
    },

    /// An option of the claim has a value the gate cannot use (a lease of
    /// zero, or longer than [`MAX_LEASE`](crate::MAX_LEASE)).
    /// Checked before any statement: the body did not run.
    #[error(
        "the {option} {value} cannot be used: {reason}; the body did not run; change the option"
    )]
    InvalidOption {
        /// The option: `"lease"`.
        option: &'static str,
        /// Its value, as given.
        value: String,
        /// Why it cannot be used.
        reason: &'static str,
    },

    /// The slot is held by a *different* identity whose address collides
    /// with this one (the first 96 bits of their sha1 agree). Refused rather
    /// than merged: the body did not run.
    #[error(
        "address {address} is held by a different identity (a digest collision); \
         the body did not run; change the action name or add a key part to separate them"
    )]
    Collision {
        /// The contested address.
        address: String,
    },

    /// A duplicate carries a different payload (its fingerprint differs from
    /// the one stored with the claim): the key was reused for another
    /// request. Refused, and never given the other payload's stored value.
    #[error(
        "this key was already used with a different payload (the fingerprints differ); \
         the body did not run; use a new key for a new request"
    )]
    KeyReused,

    /// The claim's lease ran out while the body ran, and the claim is no
    /// longer this holder's: another invocation took it over (with a higher
    /// fencing token), so it may run, or have run, the action too; or,
    /// once the lease had run out, it was released or removed (by the
    /// holder that took it over, or by an operator: once the row is gone,
    /// the two cannot be told apart). A success of this holder is still
    /// recorded (a success that happened is never forgotten: the slot is
    /// settled unless it already records an outcome, a success or a failure
    /// kept for good); a failure changes nothing, the new holder decides.
    /// Check the side effect before acting on this outcome.
    #[error(
        "the lease on {address} ran out while the body ran and the claim is no longer this \
         invocation's (taken over by another, or released once the lease had run out), so \
         the action may have run twice: check the side effect before acting on this outcome \
         (a success is still recorded unless the slot records an outcome already; a failure \
         is left to the new holder); renew long leases with Claim::extend"
    )]
    LeaseLost {
        /// The address of the lost claim.
        address: String,
    },

    /// The claim was released or removed by someone else while the body ran
    /// (an operator's `idem claims release`, say), and the slot may have
    /// been claimed anew, so the action may have run twice. A success of
    /// this holder is still recorded (the slot is settled unless it already
    /// records an outcome, a success or a failure kept for good); a failure
    /// changes nothing. A claim whose lease had run out when it was removed
    /// is told [`LeaseLost`](Rejected::LeaseLost) instead.
    #[error(
        "the claim on {address} was released or removed by someone else while the body ran, \
         so another invocation may have run the action too: check the side effect before \
         acting on this outcome (a success is still recorded; a failure changes nothing)"
    )]
    ClaimLost {
        /// The address of the lost claim.
        address: String,
    },

    /// This holder's outcome was not recorded: the slot already records an
    /// outcome somebody else wrote while the body ran. A reconciler or an
    /// operator resolved the claim, an earlier holder's late success
    /// settled it, or its lease ran out under `on_expiry = "in_doubt"` and
    /// it is held in doubt for a reconciler or an operator to resolve.
    /// Every duplicate is told what the slot records (with `replay`, its
    /// value), never this holder's outcome: `recorded` says what that is.
    /// Check the side effect against it; `idem claims show` says who
    /// recorded it.
    #[error(
        "the outcome of this invocation was not recorded: the claim on {address} {recorded}, \
         and every duplicate is told that, not this outcome; check the side effect against \
         it (idem claims show {address} says who recorded it)"
    )]
    NotRecorded {
        /// The address of the claim.
        address: String,
        /// What the slot records instead, and who wrote it.
        recorded: &'static str,
    },

    /// The outcome of a claim made inside the caller's transaction was
    /// recorded on another connection: a [`TxClaim`](crate::TxClaim) on
    /// another transaction, or a step given a connection other than its
    /// claim's transaction. Nothing was recorded, and nothing waited: the
    /// claim is still pending inside that transaction: record its outcome
    /// there, as `instead` says.
    #[error(
        "{called} cannot record the outcome of a claim made inside a transaction: {instead}; \
         nothing was recorded and nothing waited, and the claim is still pending in its \
         transaction"
    )]
    WrongConnection {
        /// What was called, and how: `"Claim::settle"` (through the pool),
        /// `"TxClaim::release on another connection than its transaction's"`.
        called: &'static str,
        /// Why that cannot work, and what to call instead.
        instead: &'static str,
    },

    /// A step of the body ([`step`](crate::step())) whose outcome this run
    /// does not know: an earlier run was cut off inside it and it is not
    /// [`repeatable`](crate::Step::repeatable). It did not run again; a
    /// failure of the body holds the claim in doubt, for a reconciler or an
    /// operator to find out what the step did. Retry later.
    ///
    /// Also a step whose recorded value no longer reads back as its type
    /// (`why` says so): it happened, so it does not run again either, but
    /// nothing is in doubt and the claim follows the body's failure; code
    /// that reads the record goes on.
    #[error(
        "step {step:?} is in doubt: {why}; it did not run again, and a failure of the body \
         holds the claim in doubt until it is resolved; retry later"
    )]
    StepInDoubt {
        /// The step's name.
        step: String,
        /// Why its outcome is not known.
        why: &'static str,
    },

    /// [`step`](crate::step()) or [`downstream_key`](crate::downstream_key)
    /// was called where it cannot work (outside a guarded body, in a task
    /// the body spawned, a step name used twice in one run). A mistake of
    /// the code: nothing ran.
    #[error("{called} cannot be used here: {why}; nothing ran")]
    NotGuarded {
        /// `"idem::step"` or `"idem::downstream_key"`.
        called: &'static str,
        /// Why not, and what to do instead.
        why: &'static str,
    },

    /// The account or namespace name can never be stored: it holds a NUL
    /// character (PostgreSQL `text` cannot), or it is longer than
    /// [`Gate::MAX_SCOPE_NAME_BYTES`](crate::Gate::MAX_SCOPE_NAME_BYTES)
    /// (a unique index entry cannot hold it). Not worth retrying: the body
    /// did not run.
    #[error(
        "the {scope} name {} cannot be stored: {reason}; the body did not run; use another name",
        abbreviated(name)
    )]
    InvalidScope {
        /// `"account"` or `"namespace"`.
        scope: &'static str,
        /// The offending name.
        name: String,
        /// Why it cannot be stored.
        reason: &'static str,
    },
}

/// A name for a message: quoted, and cut short when long.
fn abbreviated(name: &str) -> String {
    const SHOWN: usize = 40;
    match name.char_indices().nth(SHOWN) {
        Some((cut, _)) => format!("{:?}… ({} bytes)", &name[..cut], name.len()),
        None => format!("{name:?}"),
    }
}

impl Rejected {
    /// A store error as the refusal it is: an outage is
    /// [`Unavailable`](Rejected::Unavailable), anything else an error of
    /// the request, [`StoreRefused`](Rejected::StoreRefused).
    pub(crate) fn from_store(source: sqlx::Error) -> Self {
        match fault::classify(&source) {
            Fault::Outage => Rejected::Unavailable {
                source: Arc::new(source),
            },
            Fault::Request { fix } => Rejected::StoreRefused {
                fix,
                source: Arc::new(source),
            },
        }
    }

    /// `true` for [`Unavailable`](Rejected::Unavailable): the store could not
    /// be reached. The only refusal that may fail open.
    pub fn is_outage(&self) -> bool {
        matches!(self, Rejected::Unavailable { .. })
    }

    /// A short, stable name for logs and metrics: `"in_flight"`,
    /// `"already_done"`, `"value_not_kept"`, `"in_doubt"`, `"already_failed"`, `"superseded"`, `"unavailable"`, `"store_refused"`,
    /// `"invalid_option"`, `"collision"`, `"key_reused"`, `"lease_lost"`,
    /// `"claim_lost"`, `"invalid_scope"`, `"not_recorded"`, `"wrong_connection"`,
    /// `"step_in_doubt"` or `"not_guarded"`.
    pub fn reason(&self) -> &'static str {
        match self {
            Rejected::InFlight => "in_flight",
            Rejected::AlreadyDone => "already_done",
            Rejected::ValueNotKept => "value_not_kept",
            Rejected::InDoubt => "in_doubt",
            Rejected::AlreadyFailed => "already_failed",
            Rejected::Superseded => "superseded",
            Rejected::Unavailable { .. } => "unavailable",
            Rejected::StoreRefused { .. } => "store_refused",
            Rejected::InvalidOption { .. } => "invalid_option",
            Rejected::Collision { .. } => "collision",
            Rejected::KeyReused => "key_reused",
            Rejected::LeaseLost { .. } => "lease_lost",
            Rejected::ClaimLost { .. } => "claim_lost",
            Rejected::InvalidScope { .. } => "invalid_scope",
            Rejected::NotRecorded { .. } => "not_recorded",
            Rejected::WrongConnection { .. } => "wrong_connection",
            Rejected::StepInDoubt { .. } => "step_in_doubt",
            Rejected::NotGuarded { .. } => "not_guarded",
        }
    }

    /// `true` when retrying the same call later may succeed (in flight, in
    /// doubt, store unavailable); never for an error of the request.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Rejected::InFlight
                | Rejected::InDoubt
                | Rejected::StepInDoubt { .. }
                | Rejected::Unavailable { .. }
        )
    }
}

/// Why a [`Gate`](crate::Gate) could not start, or a store operation such
/// as [`Meter::record`](crate::meter::Meter::record) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The database could not be reached or refused a statement;
    /// [`Error::is_outage`] tells which.
    #[error("idem's store (PostgreSQL) failed: {0}")]
    Database(#[from] sqlx::Error),

    /// The schema is there but cannot enforce uniqueness; the gate refuses
    /// to start rather than let duplicates through.
    #[error("{0}")]
    Schema(SchemaProblems),

    /// The schema could not be set up as asked (for example, partitioned
    /// over a table that exists unpartitioned). Nothing was changed.
    #[error("idem's schema was not set up: {0}")]
    Setup(String),

    /// The request asks for what idem does not do; the message says what
    /// to ask instead. Nothing was changed, and the same request meets the
    /// same answer: not an outage.
    #[error("{0}; nothing was changed")]
    Refused(&'static str),
}

impl Error {
    /// `true` when the database could not be reached (worth a retry once it
    /// is back); `false` for an error of the request or of the schema,
    /// which a retry meets again.
    pub fn is_outage(&self) -> bool {
        matches!(self, Error::Database(error) if fault::classify(error) == Fault::Outage)
    }
}

/// Everything wrong with the schema that a gate found at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaProblems {
    /// The table the gate checked, as PostgreSQL resolved it.
    pub table: String,
    /// What is missing or wrong, one entry each.
    pub problems: Vec<SchemaProblem>,
}

impl fmt::Display for SchemaProblems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "idem refuses to start: {} cannot enforce one claim per identity:",
            self.table
        )?;
        for problem in &self.problems {
            writeln!(f, "  - {problem}")?;
        }
        write!(
            f,
            "Fix: connect once with a role that may run DDL (Gate::connect sets the schema up), \
             or apply idem::schema::SCHEMA_SQL with your migration tool."
        )
    }
}

/// One thing wrong with idem's schema.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SchemaProblem {
    /// The table does not exist where the connection's `search_path` looks.
    MissingTable {
        /// The `search_path` in force.
        search_path: String,
    },
    /// A required column is missing, or is nullable where it must not be.
    Column {
        /// The column.
        column: &'static str,
        /// What is wrong with it.
        wrong: &'static str,
    },
    /// One of the two partial unique indexes is missing or not usable.
    MissingIndex {
        /// The index as it should be defined.
        definition: &'static str,
        /// What was found instead, if anything resembling it exists.
        found: Option<String>,
    },
    /// The table is partitioned, but not every account has a partition to
    /// go to.
    Partitions {
        /// What is missing, and how to add it.
        detail: String,
    },
    /// Citus holds the table in a way the gate cannot rely on: distributed
    /// by another column, an index missing on a shard placement, or the
    /// connection is to a worker rather than the coordinator.
    Distribution {
        /// What is wrong, and how to mend it.
        detail: String,
    },
}

impl fmt::Display for SchemaProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SchemaProblem::MissingTable { search_path } => write!(
                f,
                "table idem_records does not exist (search_path is {search_path})"
            ),
            SchemaProblem::Column { column, wrong } => {
                write!(f, "column idem_records.{column} {wrong}")
            }
            SchemaProblem::MissingIndex { definition, found } => {
                write!(f, "missing unique index: {definition}")?;
                if let Some(found) = found {
                    write!(f, " (found instead: {found})")?;
                }
                Ok(())
            }
            SchemaProblem::Partitions { detail } | SchemaProblem::Distribution { detail } => {
                write!(f, "idem_records: {detail}")
            }
        }
    }
}
