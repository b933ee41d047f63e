//! What can go wrong, and what the caller should do about it.

use std::fmt;
use std::sync::Arc;

/// Why a guarded invocation did not run (or, for [`Rejected::ClaimLost`], why
/// its outcome could not be recorded). Every message says what to do next.
///
/// A function guarded by `#[idempotent]` returns `Result<T, E>` with
/// `E: From<Rejected>`, so a refusal reaches its caller as an ordinary error.
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

    /// The store could not be read or written, so the gate failed closed:
    /// the body did not run.
    #[error(
        "idem's store (PostgreSQL) is unavailable, so the body did not run; \
         retry when the database is reachable ({source})"
    )]
    Unavailable {
        /// The database error that closed the gate.
        #[source]
        source: Arc<sqlx::Error>,
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

    /// The claim's lease ran out and another invocation took the slot over
    /// (with a higher fencing token) before this holder recorded its
    /// outcome. The record is unchanged: the new holder decides.
    #[error(
        "the lease on {address} ran out and another invocation took the claim over; \
         this outcome was not recorded: the new holder's counts, so check the side effect \
         before acting on it; renew long leases with Claim::extend"
    )]
    LeaseLost {
        /// The address of the lost claim.
        address: String,
    },

    /// The claim was no longer pending when its outcome was recorded:
    /// someone released or removed it while the body ran. The body's effect
    /// is not recorded, so a retry may run it again.
    #[error(
        "the claim on {address} was released or removed by someone else while the body ran; \
         its outcome is not recorded: check the side effect before retrying"
    )]
    ClaimLost {
        /// The address of the lost claim.
        address: String,
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
    pub(crate) fn unavailable(source: sqlx::Error) -> Self {
        Rejected::Unavailable {
            source: Arc::new(source),
        }
    }

    /// A short, stable name for logs and metrics: `"in_flight"`,
    /// `"already_done"`, `"unavailable"`, `"collision"`, `"key_reused"`,
    /// `"lease_lost"`, `"claim_lost"` or `"invalid_scope"`.
    pub fn reason(&self) -> &'static str {
        match self {
            Rejected::InFlight => "in_flight",
            Rejected::AlreadyDone => "already_done",
            Rejected::Unavailable { .. } => "unavailable",
            Rejected::Collision { .. } => "collision",
            Rejected::KeyReused => "key_reused",
            Rejected::LeaseLost { .. } => "lease_lost",
            Rejected::ClaimLost { .. } => "claim_lost",
            Rejected::InvalidScope { .. } => "invalid_scope",
        }
    }

    /// `true` when retrying later may succeed (in flight, store unavailable).
    pub fn is_retryable(&self) -> bool {
        matches!(self, Rejected::InFlight | Rejected::Unavailable { .. })
    }
}

/// Why a [`Gate`](crate::Gate) could not start, or a store operation such
/// as [`Meter::record`](crate::meter::Meter::record) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The database could not be reached or refused a statement.
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
            SchemaProblem::Partitions { detail } => write!(f, "idem_records: {detail}"),
        }
    }
}
