//! A sketch, not idem: three steps kept in the claim's own row, written by
//! hand, to measure the design issue 41 item 5 names before it is built.
//! Today a step's marker is a row of its own (three index entries) and its
//! record a compare-and-swap on that row; here both are `UPDATE`s of the
//! claim's row that change no indexed column, so each can stay on its page
//! (a heap-only update) and touches no index.
//!
//! The table is `idem_records`'s shape with its indexes (`LIKE ...
//! INCLUDING ALL`) and a `steps jsonb` column. Per operation: the claim
//! (`INSERT ... ON CONFLICT DO NOTHING RETURNING fence`); per step its
//! marker, carrying the record of the step before it (`UPDATE ... SET
//! steps = steps || $4` where the claim is still pending under its fence);
//! the settle carrying the last record: 1 + 3 + 1 = 5 statements, 5
//! durable commits, as many as [`crate::recovery_points`] sends and as
//! `steps/three` does.

use idem::sqlx::{self, PgPool};

use crate::BoxError;
use crate::keys;

/// `idem_records`'s columns, constraints, defaults and indexes, and the
/// steps of the claim in its own row.
pub const SCHEMA: &str = "\
CREATE TABLE steps_in_row (LIKE idem_records INCLUDING ALL); \
ALTER TABLE steps_in_row ADD COLUMN steps jsonb NULL;";

/// The steps, as many as [`crate::stepped`]'s.
const STEPS: [&str; 3] = ["a", "b", "c"];

const CLAIM: &str = "INSERT INTO steps_in_row \
       (account, kind, address, namespace, state, identity, first_fence) \
     VALUES ($1, 'claim', $2, NULL, 'pending', $3, NULL) \
     ON CONFLICT (account, kind, address) WHERE namespace IS NULL DO NOTHING \
     RETURNING fence";

/// A step's marker with the record of the step before it, if any: a
/// compare-and-swap on the holder's fence, as idem's are.
const MARK: &str = "UPDATE steps_in_row SET steps = coalesce(steps, '{}'::jsonb) || $4::text::jsonb \
     WHERE account = $1 AND kind = 'claim' AND address = $2 AND namespace IS NULL \
       AND state = 'pending' AND fence = $3";

const SETTLE: &str = "UPDATE steps_in_row \
     SET state = 'success', settled_at = now(), steps = steps || $4::text::jsonb \
     WHERE account = $1 AND kind = 'claim' AND address = $2 AND namespace IS NULL \
       AND state = 'pending' AND fence = $3";

/// Runs claim `n` through its three steps in `account`: an error if the
/// claim was not new or a statement found no row it held.
pub async fn run(pool: &PgPool, account: &str, n: u64) -> Result<(), BoxError> {
    let address = keys::address(n);
    let identity = format!("idem\x01steps_in_row/{n}");
    let fence: Option<i64> = sqlx::query_scalar(CLAIM)
        .bind(account)
        .bind(&address)
        .bind(identity.as_bytes())
        .fetch_optional(pool)
        .await?;
    let fence = fence.ok_or_else(|| format!("{address} has a row already (a duplicate)"))?;
    let mut previous: Option<&str> = None;
    for step in STEPS {
        // The step's effect would run after its marker; it does nothing,
        // as the steps of `steps/three` do.
        let change = match previous {
            Some(done) => {
                format!(r#"{{"{done}": {{"value": null}}, "{step}": {{"begun": true}}}}"#)
            }
            None => format!(r#"{{"{step}": {{"begun": true}}}}"#),
        };
        write(pool, MARK, account, &address, fence, &change).await?;
        previous = Some(step);
    }
    let last = previous.map_or_else(
        || "{}".to_owned(),
        |done| format!(r#"{{"{done}": {{"value": null}}}}"#),
    );
    write(pool, SETTLE, account, &address, fence, &last).await
}

async fn write(
    pool: &PgPool,
    statement: &'static str,
    account: &str,
    address: &str,
    fence: i64,
    change: &str,
) -> Result<(), BoxError> {
    let done = sqlx::query(statement)
        .bind(account)
        .bind(address)
        .bind(fence)
        .bind(change)
        .execute(pool)
        .await?;
    if done.rows_affected() != 1 {
        return Err(format!("{address}: the claim was not pending under fence {fence}").into());
    }
    Ok(())
}
