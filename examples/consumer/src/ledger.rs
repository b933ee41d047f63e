//! The effect: one row in a plain ledger table per applied order.
//!
//! The table has no unique constraint on the order on purpose: it stands
//! for any effect that cannot deduplicate itself (a payment provider, an
//! email, a downstream API). A second application of an order shows as a
//! second row, which is what the test counts.

use std::time::Duration;

use idem::Disposition;
use idem::sqlx::{self, PgPool};

use crate::message::Order;

/// A ledger table's name, checked to be a plain SQL identifier so that it
/// can be spliced into statements (a name cannot be a bind parameter).
#[derive(Debug, Clone)]
pub struct Ledger {
    table: String,
}

/// Why an effect failed, and so what the gate records for its slot.
#[derive(Debug, thiserror::Error)]
pub enum EffectError {
    /// The statement was never sent, or the server refused it: the row was
    /// not written. The slot is released and the message redelivered.
    #[error("the ledger entry was not written: {0}")]
    Refused(sqlx::Error),
    /// The connection failed while the statement ran: the row may or may
    /// not be there. The slot is held in doubt; the reconciler's probe
    /// looks for the row.
    #[error("the ledger entry may or may not have been written: {0}")]
    Unknown(sqlx::Error),
    /// The message can never be applied (say, a negative amount): the
    /// failure is kept, the message terminated, duplicates refused.
    #[error("the order cannot be applied: {0}")]
    Invalid(String),
}

impl EffectError {
    fn from_sqlx(error: sqlx::Error) -> EffectError {
        // A server shutting down (57P01...) or a connection failure
        // (08...) may end the session after the commit, before its reply.
        let cut_off = |database: &dyn sqlx::error::DatabaseError| {
            database
                .code()
                .is_some_and(|code| code.starts_with("57") || code.starts_with("08"))
        };
        match error {
            sqlx::Error::Database(ref database) if cut_off(database.as_ref()) => {
                EffectError::Unknown(error)
            }
            // Never sent, or answered with an error: an autocommitted
            // statement that failed did not commit.
            sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Database(_)
            | sqlx::Error::Configuration(_) => EffectError::Refused(error),
            // Cut off mid-statement (I/O, TLS, protocol, a worker that
            // crashed): the commit may have happened.
            other => EffectError::Unknown(other),
        }
    }

    /// What the gate records for the slot: see the variants.
    pub fn disposition(&self) -> Disposition {
        match self {
            EffectError::Refused(_) => Disposition::Release,
            EffectError::Unknown(_) => Disposition::InDoubt,
            EffectError::Invalid(_) => Disposition::Keep,
        }
    }
}

impl Ledger {
    /// The ledger in `table`, a lowercase SQL identifier (`[a-z_][a-z0-9_]*`,
    /// at most 63 bytes).
    pub fn new(table: &str) -> Result<Ledger, String> {
        let mut chars = table.chars();
        let first_ok = chars
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
        let rest_ok = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if first_ok && rest_ok && table.len() <= 63 {
            Ok(Ledger {
                table: table.to_owned(),
            })
        } else {
            Err(format!(
                "ledger table {table:?} is not a lowercase SQL identifier ([a-z_][a-z0-9_]*, at most 63 bytes)"
            ))
        }
    }

    /// A statement naming the table: safe, as the name was checked to be
    /// a plain identifier when the ledger was made, and nothing else is
    /// spliced in (values are bind parameters).
    fn sql(&self, statement: String) -> sqlx::AssertSqlSafe<String> {
        sqlx::AssertSqlSafe(statement)
    }

    /// Creates the table unless it exists. Several consumers may start at
    /// once: an advisory lock keeps their `CREATE TABLE IF NOT EXISTS` from
    /// racing on the catalog.
    pub async fn create(&self, pool: &PgPool) -> Result<(), sqlx::Error> {
        let mut tx = pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
            .bind(format!("idem-consumer-ledger:{}", self.table))
            .execute(&mut *tx)
            .await?;
        // No unique constraint on order_key: see the module docs. The index
        // is for the reconciler's probe.
        sqlx::query(self.sql(format!(
            "CREATE TABLE IF NOT EXISTS {t} (
                 id bigserial PRIMARY KEY,
                 order_key text NOT NULL,
                 amount bigint NOT NULL,
                 consumer text NOT NULL,
                 stream_sequence bigint NOT NULL,
                 delivered bigint NOT NULL,
                 applied_at timestamptz NOT NULL DEFAULT now()
             )",
            t = self.table
        )))
        .execute(&mut *tx)
        .await?;
        sqlx::query(self.sql(format!(
            "CREATE INDEX IF NOT EXISTS {t}_order_key ON {t} (order_key)",
            t = self.table
        )))
        .execute(&mut *tx)
        .await?;
        tx.commit().await
    }

    /// Applies `order`: one autocommitted insert. Bounded by the pool's
    /// acquire timeout and the connection's `statement_timeout` (see
    /// `main.rs`), so it is over well before the claim's lease runs out:
    /// the reconciler never probes a claim whose effect is still on its
    /// way.
    pub async fn apply(
        &self,
        pool: &PgPool,
        order: &Order,
        consumer: &str,
        stream_sequence: u64,
        delivered: i64,
    ) -> Result<(), EffectError> {
        if order.amount < 0 {
            return Err(EffectError::Invalid(format!(
                "order {} has a negative amount ({})",
                order.order, order.amount
            )));
        }
        sqlx::query(self.sql(format!(
            "INSERT INTO {t} (order_key, amount, consumer, stream_sequence, delivered)
             VALUES ($1, $2, $3, $4, $5)",
            t = self.table
        )))
        .bind(&order.order)
        .bind(order.amount)
        .bind(consumer)
        .bind(i64::try_from(stream_sequence).unwrap_or(i64::MAX))
        .bind(delivered)
        .execute(pool)
        .await
        .map_err(EffectError::from_sqlx)?;
        Ok(())
    }

    /// Whether `order` was applied: what the reconciler's probe asks.
    pub async fn contains(&self, pool: &PgPool, order: &str) -> Result<bool, sqlx::Error> {
        sqlx::query_scalar(self.sql(format!(
            "SELECT EXISTS (SELECT 1 FROM {t} WHERE order_key = $1)",
            t = self.table
        )))
        .bind(order)
        .fetch_one(pool)
        .await
    }
}

/// How long an effect may wait for a connection, and then for its
/// statement, given the claims' lease: an eighth each, so the effect is
/// over within a quarter of the lease (see `main.rs`).
pub fn effect_bound(lease: Duration) -> Duration {
    lease / 8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_identifiers_name_a_ledger() {
        assert!(Ledger::new("ledger").is_ok());
        assert!(Ledger::new("_ledger_2").is_ok());
        assert!(Ledger::new("").is_err());
        assert!(Ledger::new("2ledger").is_err());
        assert!(Ledger::new("Ledger").is_err());
        assert!(Ledger::new("ledger; drop table x").is_err());
        assert!(Ledger::new(&"l".repeat(64)).is_err());
    }
}
