//! The floor: the statements the gate cannot avoid, written by hand against
//! the same `idem_records` (same row, same indexes): insert a pending row,
//! run the body, update the row to success, each statement autocommitted on
//! its own pooled connection, as the gate runs them.
//!
//! Besides the floor itself, two levers the runtime could pull, measured
//! here with hand-written SQL before anyone changes the runtime:
//!
//! - the settle committed with `synchronous_commit = off`: only the claim
//!   must be durable; a settle lost in a server crash leaves the slot
//!   `pending`, which refuses retries (fail closed) — for claims without a
//!   lease (BENCHMARKS.md says why);
//! - the claim fused with the lookup that explains a refusal
//!   ([`crate::fused`]), whose cost on a new claim shows here.

use idem::sqlx::{self, PgPool};

use crate::BoxError;
use crate::body::Body;
use crate::fused::{Fused, Outcome};
use crate::keys;

/// How the hand-written claim is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// A plain `INSERT`: the least a claim can be.
    Insert,
    /// `INSERT ... ON CONFLICT DO NOTHING RETURNING`, the gate's form: a
    /// conflict returns no row instead of an error, at the price of a
    /// speculative insertion (an index probe first, and one more WAL record).
    InsertOnConflict,
    /// One statement that claims, or finds who holds the slot.
    Fused(Fused),
}

/// How the hand-written settle commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// Autocommitted, waiting for its WAL to reach the disk, as the gate does.
    Durable,
    /// Autocommitted with `synchronous_commit` turned off for its own
    /// transaction from inside the statement: still one round trip.
    AsyncInStatement,
    /// `BEGIN; SET LOCAL synchronous_commit = off; UPDATE ...; COMMIT`: the
    /// textbook form, three more round trips.
    AsyncInTransaction,
}

/// A floor variant: one way to write the claim, one way to settle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Floor {
    pub claim: Claim,
    pub settle: Settle,
}

const INSERT_PENDING: &str = "INSERT INTO idem_records (account, kind, address, namespace, state, identity) \
     VALUES ($1, 'claim', $2, NULL, 'pending', $3)";

const INSERT_PENDING_ON_CONFLICT: &str = "INSERT INTO idem_records \
       (account, kind, address, namespace, state, identity) \
     VALUES ($1, 'claim', $2, NULL, 'pending', $3) \
     ON CONFLICT DO NOTHING \
     RETURNING true";

const SETTLE: &str = "UPDATE idem_records SET state = 'success', settled_at = now() \
     WHERE account = $1 AND kind = 'claim' AND address = $2 AND namespace IS NULL \
       AND state = 'pending'";

/// `set_config(..., true)` lasts until the end of the current transaction,
/// which for an autocommitted statement includes its own commit record: the
/// commit does not wait for the WAL flush. The one-row subquery in `FROM`
/// runs once, before the update.
const SETTLE_ASYNC: &str = "UPDATE idem_records SET state = 'success', settled_at = now() \
     FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit \
     WHERE account = $1 AND kind = 'claim' AND address = $2 AND namespace IS NULL \
       AND state = 'pending'";

impl Floor {
    /// Claims identity `n` in `account`, runs `body`, settles.
    pub async fn run(
        self,
        pool: &PgPool,
        account: &str,
        n: u64,
        body: Body,
    ) -> Result<(), BoxError> {
        let address = keys::address(n);
        let identity = format!("loadgen floor {n}").into_bytes();
        self.claim(pool, account, &address, &identity).await?;
        body.run().await;
        self.settle(pool, account, &address).await
    }

    async fn claim(
        self,
        pool: &PgPool,
        account: &str,
        address: &str,
        identity: &[u8],
    ) -> Result<(), BoxError> {
        match self.claim {
            Claim::Insert => {
                sqlx::query(INSERT_PENDING)
                    .bind(account)
                    .bind(address)
                    .bind(identity)
                    .execute(pool)
                    .await?;
                Ok(())
            }
            Claim::InsertOnConflict => {
                let won: Option<bool> = sqlx::query_scalar(INSERT_PENDING_ON_CONFLICT)
                    .bind(account)
                    .bind(address)
                    .bind(identity)
                    .fetch_optional(pool)
                    .await?;
                match won {
                    Some(true) => Ok(()),
                    _ => Err(format!("the floor lost the claim on the fresh {address}").into()),
                }
            }
            Claim::Fused(fused) => match fused.claim(pool, account, address, identity).await? {
                Outcome::Won => Ok(()),
                _ => Err(format!("the floor lost the claim on the fresh {address}").into()),
            },
        }
    }

    async fn settle(self, pool: &PgPool, account: &str, address: &str) -> Result<(), BoxError> {
        let settled = match self.settle {
            Settle::Durable => {
                sqlx::query(SETTLE)
                    .bind(account)
                    .bind(address)
                    .execute(pool)
                    .await?
            }
            Settle::AsyncInStatement => {
                sqlx::query(SETTLE_ASYNC)
                    .bind(account)
                    .bind(address)
                    .execute(pool)
                    .await?
            }
            Settle::AsyncInTransaction => {
                let mut tx = pool.begin().await?;
                sqlx::query("SET LOCAL synchronous_commit = off")
                    .execute(&mut *tx)
                    .await?;
                let settled = sqlx::query(SETTLE)
                    .bind(account)
                    .bind(address)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                settled
            }
        };
        if settled.rows_affected() != 1 {
            return Err(format!("the floor's settle found no pending {address}").into());
        }
        Ok(())
    }
}
