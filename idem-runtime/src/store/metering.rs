//! The metering statements over `idem_records` (`kind = 'meter_event'`):
//! record a batch of usage events, and total them by meter. What an outcome
//! means, and how a batch is checked before it is sent, is
//! [`crate::meter`]'s business.

use sqlx::postgres::PgRow;
use sqlx::{FromRow, PgExecutor, Row};

use super::{Scope, SplitOnNamespace};

/// The text of [`RECORD`] with its namespace value and conflict arbiter.
///
/// Rows are written in address order so that concurrent batches lock shared
/// rows in the same order, and cannot deadlock.
///
/// `DO UPDATE` (a no-op write) rather than `DO NOTHING`, so a row that
/// conflicts comes back too, locked and in its latest committed version, even
/// when it committed after the statement's snapshot. A new row is told from
/// a stored one by its fence: each candidate draws one from the sequence
/// first, and only a row this statement inserted can carry it (`xmax = 0`
/// would say the same on a plain table, but a partitioned one cannot return
/// system columns).
macro_rules! record_statement {
    ($namespace:literal, $arbiter:literal) => {
        concat!(
            "WITH e AS MATERIALIZED ( \
                 SELECT u.*, nextval('idem_records_fence_seq') AS fence \
                 FROM unnest($2::text[], $3::bytea[], $4::text[], $5::bigint[], $6::bigint[]) \
                      AS u(address, identity, meter, quantity, occurred_us) \
             ), written AS ( \
                 INSERT INTO idem_records AS r \
                   (account, kind, address, namespace, state, identity, meter, quantity, \
                    occurred_at, fence) \
                 SELECT $1, 'meter_event', e.address, ",
            $namespace,
            ", 'recorded', e.identity, e.meter, e.quantity, \
                        timestamptz 'epoch' + e.occurred_us * interval '1 microsecond', e.fence \
                 FROM e \
                 ORDER BY e.address \
                 ON CONFLICT ",
            $arbiter,
            " DO UPDATE SET state = r.state \
                 RETURNING r.address, r.fence, r.identity, r.meter, r.quantity, \
                           round(extract(epoch FROM r.occurred_at) * 1000000)::bigint \
                               AS occurred_us \
             ) \
             SELECT w.address, w.fence = e.fence AS inserted, w.identity, w.meter, w.quantity, \
                    w.occurred_us \
             FROM written w JOIN e ON e.address = w.address"
        )
    };
}

/// Stores a batch of events, or returns the row each already has, in one
/// statement (see `record_statement!`). `$1` the account; `$2`..`$6` the
/// batch's columns as arrays (address, identity, meter, quantity, time in
/// microseconds since the epoch); `$7` the namespace, in the form within
/// one only. Index: the conflict arbiter is named, the partial unique index
/// of its form, and the conflicting row is found through it.
pub const RECORD: SplitOnNamespace = SplitOnNamespace {
    without_namespace: record_statement!(
        "NULL",
        "(account, kind, address) WHERE namespace IS NULL"
    ),
    within_namespace: record_statement!(
        "$7",
        "(account, kind, address, namespace) WHERE namespace IS NOT NULL"
    ),
};

/// The text of a total, over the events of one scope in a time range, with
/// its namespace test and any further test.
///
/// The sum is returned as text: `sum(bigint)` is `numeric`, which no Rust
/// integer the driver decodes can hold in general, while an `i128` can hold
/// every sum of `i64` quantities that fits in memory.
macro_rules! total_statement {
    ($namespace_test:literal $(, $and:literal)?) => {
        concat!(
            "SELECT meter, sum(quantity)::text AS quantity, count(*) AS events \
             FROM idem_records \
             WHERE account = $1 AND kind = 'meter_event' AND ",
            $namespace_test,
            " AND occurred_at >= timestamptz 'epoch' + $2 * interval '1 microsecond' \
              AND occurred_at < timestamptz 'epoch' + $3 * interval '1 microsecond'"
            $(, " AND ", $and)?,
            " GROUP BY meter"
        )
    };
}

/// Every meter's total over a scope's events in a time range. `$1` the
/// account; `$2`, `$3` the range's start (included) and end (excluded) in
/// microseconds since the epoch; `$4` the namespace (NULL, and tested as
/// NULL, in the form without one). Index: `idem_records_meter_totals`,
/// `(account, meter, occurred_at) WHERE kind = 'meter_event'` (schema
/// version 2), or on a small table a partial unique index's leading
/// `(account, kind)`; the namespace test filters the rows found. Split on
/// the namespace all the same, so that no statement here folds that test.
pub const TOTALS: SplitOnNamespace = SplitOnNamespace {
    without_namespace: total_statement!("namespace IS NULL AND $4::text IS NULL"),
    within_namespace: total_statement!("namespace = $4"),
};

/// [`TOTALS`] for one meter, `$5`. Index: as for [`TOTALS`].
pub const TOTAL_OF_METER: SplitOnNamespace = SplitOnNamespace {
    without_namespace: total_statement!("namespace IS NULL AND $4::text IS NULL", "meter = $5"),
    within_namespace: total_statement!("namespace = $4", "meter = $5"),
};

/// A batch of events as columns, one entry per event, for `unnest`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EventColumns<'a> {
    pub addresses: &'a [String],
    pub identities: &'a [Vec<u8>],
    pub meters: &'a [String],
    pub quantities: &'a [i64],
    /// When each happened, in microseconds since the Unix epoch.
    pub occurred_micros: &'a [i64],
}

/// An event's row as [`record`] returns it: what is stored at its address,
/// decoded by column name.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct StoredEvent {
    pub address: String,
    /// This statement inserted the row (rather than finding it there).
    pub inserted: bool,
    pub identity: Vec<u8>,
    pub meter: String,
    pub quantity: i64,
    /// In microseconds since the Unix epoch.
    #[sqlx(rename = "occurred_us")]
    pub occurred_micros: i64,
}

/// Stores the events of a batch that are new ([`RECORD`]), and returns the
/// stored row of every event sent, inserted or not. Repeatable after a
/// serialization failure: the statement is rolled back whole.
pub(crate) async fn record<'e>(
    executor: impl PgExecutor<'e>,
    scope: Scope<'_>,
    events: EventColumns<'_>,
) -> Result<Vec<StoredEvent>, sqlx::Error> {
    let query = sqlx::query(RECORD.for_namespace(scope.namespace))
        .bind(scope.account)
        .bind(events.addresses)
        .bind(events.identities)
        .bind(events.meters)
        .bind(events.quantities)
        .bind(events.occurred_micros);
    let query = match scope.namespace {
        Some(namespace) => query.bind(namespace),
        None => query,
    };
    query
        .fetch_all(executor)
        .await?
        .iter()
        .map(StoredEvent::from_row)
        .collect()
}

/// One meter's total as [`totals`] returns it.
#[derive(Debug)]
pub(crate) struct MeterTotal {
    pub meter: String,
    pub quantity: i128,
    pub events: i64,
}

impl MeterTotal {
    fn from_row(row: &PgRow) -> Result<MeterTotal, sqlx::Error> {
        let sum: String = row.try_get("quantity")?;
        let quantity = sum
            .parse::<i128>()
            .map_err(|e| sqlx::Error::Decode(format!("sum {sum:?}: {e}").into()))?;
        Ok(MeterTotal {
            meter: row.try_get("meter")?,
            quantity,
            events: row.try_get("events")?,
        })
    }
}

/// The totals of `meter` (or of every meter) over the events of `scope`
/// that happened from `from_micros` (included) to `until_micros`
/// (excluded), in microseconds since the Unix epoch.
pub(crate) async fn totals<'e>(
    executor: impl PgExecutor<'e>,
    scope: Scope<'_>,
    meter: Option<&str>,
    from_micros: i64,
    until_micros: i64,
) -> Result<Vec<MeterTotal>, sqlx::Error> {
    let statement = match meter {
        Some(_) => &TOTAL_OF_METER,
        None => &TOTALS,
    };
    let query = sqlx::query(statement.for_namespace(scope.namespace))
        .bind(scope.account)
        .bind(from_micros)
        .bind(until_micros)
        .bind(scope.namespace);
    let query = match meter {
        Some(meter) => query.bind(meter),
        None => query,
    };
    query
        .fetch_all(executor)
        .await?
        .iter()
        .map(MeterTotal::from_row)
        .collect()
}
