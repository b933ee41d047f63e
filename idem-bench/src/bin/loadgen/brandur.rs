//! The alternative most teams write: a Stripe-style `idempotency_keys`
//! table, after Brandur Leach's "Implementing Stripe-like Idempotency Keys in
//! Postgres". Two phases, each its own transaction:
//!
//! 1. lock: insert the key if it is new, `SELECT ... FOR UPDATE` it, refuse
//!    it if finished or locked by a live request, set `locked_at`, commit;
//! 2. the body runs, holding no connection;
//! 3. complete: store the response and unlock in one `UPDATE`, committed.
//!
//! Written to its advantage: READ COMMITTED (the article runs each phase
//! SERIALIZABLE, which the `ON CONFLICT` and `FOR UPDATE` make unnecessary),
//! the one-statement completion autocommitted rather than wrapped in
//! `BEGIN`/`COMMIT`, and no request-parameter columns to write.

use idem::sqlx::{self, PgPool};

use crate::BoxError;
use crate::body::{Body, RESPONSE_BODY};
use crate::keys;

/// The table, with the columns the article's design uses (less the request
/// method, path and parameters), and its unique index on (user, key).
pub const SCHEMA: &str = "\
CREATE TABLE idempotency_keys ( \
    id              bigserial   PRIMARY KEY, \
    created_at      timestamptz NOT NULL DEFAULT now(), \
    idempotency_key text        NOT NULL CHECK (char_length(idempotency_key) <= 100), \
    last_run_at     timestamptz NOT NULL DEFAULT now(), \
    locked_at       timestamptz NULL, \
    recovery_point  text        NOT NULL CHECK (char_length(recovery_point) <= 50), \
    response_code   integer     NULL, \
    response_body   jsonb       NULL, \
    user_id         bigint      NOT NULL \
); \
CREATE UNIQUE INDEX idempotency_keys_user_id_idempotency_key \
    ON idempotency_keys (user_id, idempotency_key);";

/// Every key belongs to one user, as every gate claim belongs to one account.
const USER_ID: i64 = 1;

const INSERT_KEY: &str = "INSERT INTO idempotency_keys (user_id, idempotency_key, recovery_point) \
     VALUES ($1, $2, 'started') \
     ON CONFLICT (user_id, idempotency_key) DO NOTHING";

/// A lock older than the article's timeout belongs to a request that died.
const LOCK_KEY: &str = "SELECT id, recovery_point, \
            (locked_at > now() - interval '90 seconds') IS TRUE AS locked \
     FROM idempotency_keys WHERE user_id = $1 AND idempotency_key = $2 \
     FOR UPDATE";

const MARK_LOCKED: &str =
    "UPDATE idempotency_keys SET locked_at = now(), last_run_at = now() WHERE id = $1";

const COMPLETE: &str = "UPDATE idempotency_keys \
     SET locked_at = NULL, recovery_point = 'finished', response_code = 200, \
         response_body = $2::jsonb \
     WHERE id = $1";

/// Runs one request with key `n` through both phases around `body`.
pub async fn run(pool: &PgPool, n: u64, body: Body) -> Result<(), BoxError> {
    let key = keys::hex24(n);
    let id = lock(pool, &key).await?;
    body.run().await;
    sqlx::query(COMPLETE)
        .bind(id)
        .bind(RESPONSE_BODY)
        .execute(pool)
        .await?;
    Ok(())
}

/// The lock phase: the key's row id, once it is locked for this request.
async fn lock(pool: &PgPool, key: &str) -> Result<i64, BoxError> {
    let mut tx = pool.begin().await?;
    sqlx::query(INSERT_KEY)
        .bind(USER_ID)
        .bind(key)
        .execute(&mut *tx)
        .await?;
    let (id, recovery_point, locked): (i64, String, bool) = sqlx::query_as(LOCK_KEY)
        .bind(USER_ID)
        .bind(key)
        .fetch_one(&mut *tx)
        .await?;
    // Both refusals are the article's; with distinct keys neither happens,
    // and a run that meets one stops, since it measured something else.
    if recovery_point == "finished" {
        return Err(format!("key {key} is already finished (a duplicate)").into());
    }
    if locked {
        return Err(format!("key {key} is locked by a live request (409)").into());
    }
    sqlx::query(MARK_LOCKED).bind(id).execute(&mut *tx).await?;
    tx.commit().await?;
    Ok(id)
}
