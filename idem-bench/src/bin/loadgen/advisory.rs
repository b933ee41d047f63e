//! The other alternative: a session advisory lock held across the body.
//!
//! Take a pooled connection, `pg_advisory_lock` the key, look the outcome
//! up, run the body, insert the outcome, unlock, give the connection back.
//! One durable commit instead of the gate's two, but the connection is held
//! for the whole body, so a pool smaller than the concurrency queues every
//! request behind the slowest bodies. (The lock is not durable either: a
//! crash mid-body frees it, and a retry runs the body again.)

use idem::sqlx::pool::PoolConnection;
use idem::sqlx::{self, PgPool, Postgres};

use crate::BoxError;
use crate::body::{Body, RESPONSE_BODY};
use crate::keys;

/// Where a finished request's outcome is kept, one row per (account, key).
pub const SCHEMA: &str = "\
CREATE TABLE advisory_outcomes ( \
    account       text        NOT NULL, \
    key           text        NOT NULL, \
    response_code integer     NOT NULL, \
    response_body jsonb       NOT NULL, \
    created_at    timestamptz NOT NULL DEFAULT now(), \
    PRIMARY KEY (account, key) \
);";

const ACCOUNT: &str = "default";

/// 64 bits of the key's hash, so unrelated keys practically never share a
/// lock (`hashtext` alone has 32).
const LOCK: &str = "SELECT pg_advisory_lock(hashtextextended($1, 0))";
const UNLOCK: &str = "SELECT pg_advisory_unlock(hashtextextended($1, 0))";

const LOOKUP: &str = "SELECT response_code FROM advisory_outcomes WHERE account = $1 AND key = $2";

const RECORD: &str = "INSERT INTO advisory_outcomes (account, key, response_code, response_body) \
     VALUES ($1, $2, 200, $3::jsonb)";

/// Runs one request with key `n` under the key's advisory lock.
pub async fn run(pool: &PgPool, n: u64, body: Body) -> Result<(), BoxError> {
    let key = keys::hex24(n);
    let mut conn = pool.acquire().await?;
    sqlx::query(LOCK).bind(&key).execute(&mut *conn).await?;
    match locked(&mut conn, &key, body).await {
        Ok(()) => Ok(()),
        Err(error) => {
            // A session lock outlives a failed request: close the session
            // instead of handing its lock back to the pool.
            let _closed = conn.close().await;
            Err(error)
        }
    }
}

/// Everything done while holding the key's lock, the unlock included.
async fn locked(
    conn: &mut PoolConnection<Postgres>,
    key: &str,
    body: Body,
) -> Result<(), BoxError> {
    let done: Option<i32> = sqlx::query_scalar(LOOKUP)
        .bind(ACCOUNT)
        .bind(key)
        .fetch_optional(&mut **conn)
        .await?;
    if done.is_some() {
        return Err(format!("key {key} already has an outcome (a duplicate)").into());
    }
    body.run().await;
    sqlx::query(RECORD)
        .bind(ACCOUNT)
        .bind(key)
        .bind(RESPONSE_BODY)
        .execute(&mut **conn)
        .await?;
    sqlx::query(UNLOCK).bind(key).execute(&mut **conn).await?;
    Ok(())
}
