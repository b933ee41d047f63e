//! idem's schema: set-up and start-up verification, least privilege, the
//! partitioned layout, and a rolling deploy beside the previous release.

mod partitioned;
mod previous_release;
mod privileges;
mod setup;
// It reads the open claims through the gauges and the console too.
#[cfg(all(feature = "metrics", feature = "console"))]
mod open_claims_index;

use idem::sqlx::{self, AssertSqlSafe, PgPool};

/// Runs `sql` (any number of statements), panicking with it on error.
async fn exec(pool: &PgPool, sql: &str) {
    sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
        .execute(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// How `pg_get_indexdef` ends the definition of the index of open claims
/// (schema version 9).
const DEFINED: &str = "USING btree (account, state, created_at, address) \
     WHERE ((kind = 'claim'::text) AND (state IS DISTINCT FROM 'success'::text))";

/// (oid, definition, valid, unique) of every index named
/// `idem_records_open_claims` on the `idem_records` of the pool's current
/// schema.
async fn open_claims_indexes(pool: &PgPool) -> Vec<(i64, String, bool, bool)> {
    sqlx::query_as(
        "SELECT i.indexrelid::oid::int8, pg_get_indexdef(i.indexrelid), i.indisvalid, i.indisunique \
         FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
         WHERE i.indrelid = to_regclass(quote_ident(current_schema()) || '.idem_records') \
           AND c.relname = 'idem_records_open_claims'",
    )
    .fetch_all(pool)
    .await
    .expect("read the index of open claims")
}
