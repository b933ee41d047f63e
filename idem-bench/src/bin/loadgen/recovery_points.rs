//! The baseline for steps inside one claim: the same phases written by hand
//! as recovery points, after Brandur Leach's "Implementing Stripe-like
//! Idempotency Keys in Postgres", in the same database. One row per key
//! whose `recovery_point` column says how far the request got; each phase
//! moves it on in a statement of its own, so a retry resumes after the last
//! phase recorded.
//!
//! Per operation: insert the key's row (`INSERT ... ON CONFLICT DO NOTHING
//! RETURNING`, a new key or the run stops), one `UPDATE ... SET
//! recovery_point = $phase` per phase, then `UPDATE ... SET finished =
//! true`: with [`PHASES`] phases, 1 + 3 + 1 = 5 statements, each
//! autocommitted on a pooled connection of its own, 5 durable commits. Written to
//! its advantage: no lock column, no response stored, no check that the
//! phase before it is the one recorded (the `UPDATE` only checks the key is
//! unfinished), where idem's step is a compare-and-swap on its holder's
//! fence that also stores the step's value.

use idem::sqlx::{self, PgPool};

use crate::BoxError;
use crate::keys;

/// One row per key, as the article's `idempotency_keys` has, less what the
/// comparison does not need.
pub const SCHEMA: &str = "\
CREATE TABLE recovery_points ( \
    idempotency_key text        PRIMARY KEY, \
    recovery_point  text        NOT NULL, \
    finished        boolean     NOT NULL DEFAULT false, \
    created_at      timestamptz NOT NULL DEFAULT now() \
);";

/// The phases, one per step of [`crate::stepped`]: the same number.
pub const PHASES: [&str; 3] = ["a", "b", "c"];

const INSERT_KEY: &str = "INSERT INTO recovery_points (idempotency_key, recovery_point) \
     VALUES ($1, 'started') \
     ON CONFLICT (idempotency_key) DO NOTHING \
     RETURNING true";

const REACHED: &str = "UPDATE recovery_points SET recovery_point = $2 \
     WHERE idempotency_key = $1 AND NOT finished";

const FINISH: &str = "UPDATE recovery_points SET finished = true \
     WHERE idempotency_key = $1 AND NOT finished";

/// Runs request `n` through its phases, each recorded as its recovery
/// point: an error if the key was not new or a phase found no row.
pub async fn run(pool: &PgPool, n: u64) -> Result<(), BoxError> {
    let key = keys::hex24(n);
    let inserted: Option<bool> = sqlx::query_scalar(INSERT_KEY)
        .bind(&key)
        .fetch_optional(pool)
        .await?;
    if inserted.is_none() {
        return Err(format!("key {key} has a row already (a duplicate)").into());
    }
    for phase in PHASES {
        // The phase's own work would run here; it does nothing, as the
        // steps do nothing.
        let done = sqlx::query(REACHED)
            .bind(&key)
            .bind(phase)
            .execute(pool)
            .await?;
        if done.rows_affected() != 1 {
            return Err(format!("key {key}: phase {phase} found no unfinished row").into());
        }
    }
    let done = sqlx::query(FINISH).bind(&key).execute(pool).await?;
    if done.rows_affected() != 1 {
        return Err(format!("key {key}: no unfinished row to finish").into());
    }
    Ok(())
}
