//! Which store a gate's statements reach, for the outcome cache (feature
//! `cache`): an entry answers only the store it was learned from, so that
//! one cache shared by gates on two databases, two schemas or two servers
//! never answers one from the other.

use sqlx::{PgPool, Row};

/// The store's identity: the cluster's system identifier (distinct per
/// `initdb`), the database, and the `idem_records` table the connection's
/// `search_path` resolves to (distinct per schema). Read once, when the
/// gate connects; no index involved.
pub(crate) const STORE_ID: &str = "SELECT concat_ws('/', \
       (SELECT system_identifier::text FROM pg_control_system()), \
       current_database(), \
       'idem_records'::regclass::oid::text) AS store";

/// The identity of the store `pool` reaches ([`STORE_ID`]).
pub(crate) async fn store_id(pool: &PgPool) -> Result<String, sqlx::Error> {
    sqlx::query(STORE_ID)
        .fetch_one(pool)
        .await?
        .try_get("store")
}
