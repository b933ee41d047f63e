//! What one settled key costs on disk, beside the least any design could
//! pay for it.
//!
//! ```text
//! cargo run -p idem-bench --release --bin key_bytes -- --rows 1000000
//! ```
//!
//! In a throwaway schema it settles `--sample` identities through the gate
//! itself (`gate.guard(&id).run(..)`, no options: what most users write),
//! then lays down `--rows` more settled claims in bulk, each a copy of a
//! gate-written row's shape: the same columns set, values of the same
//! widths (an address of 30 characters, an identity as long as the
//! sample's), so the bulk rows cost what the gate's own cost. It checks
//! that: the average width of a bulk row (`pg_column_size` of the whole
//! row) must be within 2 bytes of the gate's, or the run fails.
//!
//! After `VACUUM (ANALYZE)`, it reports the table's heap and each index,
//! in bytes per settled key (`pg_relation_size` ÷ rows), beside the floor:
//! a table of `(account text, digest bytea)` with a 12-byte digest as its
//! primary key, holding the same accounts and as many keys, vacuumed alike.
//! That floor is what any design that refuses a duplicate by a unique
//! constraint pays at least: the key and its index entry, nothing else.

use std::time::{Duration, Instant};

use clap::Parser;
use idem::operations::{DEFAULT_BATCH_SIZE, PruneFilter, Pruning};
use idem::sqlx::{self, PgPool, Row};
use idem::{Gate, Identity, Rejected};
use idem_bench::BoxError;
use idem_test_support::database;

/// Measures the bytes a settled key costs.
#[derive(Debug, Parser)]
struct Flags {
    /// Settled claims laid down in bulk.
    #[arg(long, default_value_t = 1_000_000)]
    rows: i64,
    /// Settled through the gate first: the shape the bulk rows copy.
    #[arg(long, default_value_t = 2_000)]
    sample: i64,
    /// Accounts the keys are spread over.
    #[arg(long, default_value_t = 100)]
    accounts: i64,
    /// Keys past their value's window, compacted by a prune: the sample
    /// settles with `keep_value_for` and `idem prune --expired` compacts
    /// it, and the bulk rows copy that shape.
    #[arg(long)]
    compacted: bool,
}

/// A charge's identity, as payment code writes it: an action and an
/// order id (`ord_` and 16 hex digits, as most providers' ids are).
fn identity(n: i64) -> Identity {
    Identity::new("charge").part(format!("ord_{n:016x}"))
}

/// The account of key `n`.
fn account(n: i64, accounts: i64) -> String {
    format!("acct_{:04}", n % accounts)
}

/// Copies of a gate-written row, `$1 + 1 ..= $2`: the columns a plain
/// `gate.guard(&id).run` settles (its claim sets `fence` and `first_fence`,
/// its settle `settled_at`; nothing else), with an address of 30
/// characters and an identity of the sample's length (`$3`), over `$4`
/// accounts named as the sample's; `$5`: compacted, so without
/// `first_fence` (equal to `fence`, a prune clears it) and `created_at`.
const BULK: &str = "INSERT INTO idem_records \
       (account, kind, address, namespace, state, identity, created_at, settled_at, \
        fence, first_fence) \
     SELECT 'acct_' || lpad((i % $4)::text, 4, '0'), 'claim', \
            'claim_' || left(md5(i::text), 24), NULL, 'success', \
            substring(decode(md5(i::text) || md5((-i)::text) || md5((i * 7)::text), 'hex') \
                      FOR $3), \
            CASE WHEN $5 THEN NULL ELSE now() END, now(), f, CASE WHEN $5 THEN NULL ELSE f END \
     FROM generate_series($1::bigint + 1, $2::bigint) AS i, \
          LATERAL (SELECT nextval('idem_records_fence_seq') AS f) AS fence";

/// The least a key can cost: its account and a 12-byte digest, the
/// primary key. Filled with as many keys, over the same accounts.
const FLOOR: &str = "CREATE TABLE floor_keys ( \
       account text  NOT NULL, \
       digest  bytea NOT NULL, \
       PRIMARY KEY (account, digest) \
     ); \
     INSERT INTO floor_keys \
     SELECT 'acct_' || lpad((i % {accounts})::text, 4, '0'), \
            substring(decode(md5(i::text), 'hex') FOR 12) \
     FROM generate_series(1, {rows}) AS i";

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let flags = Flags::parse();
    let database = database::find().await.map_err(|e| e.to_string())?;
    let admin = database.pool(2).await?;
    let schema = idem::testing::unique_name("idem_key_bytes");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
        .execute(&admin)
        .await?;
    let measured = measure(&database.url, &schema, &flags).await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
        .execute(&admin)
        .await?;
    println!("{}", measured?);
    Ok(())
}

/// One relation's size in bytes and what it is.
struct Relation {
    name: String,
    bytes: i64,
}

async fn sizes(pool: &PgPool, table: &str) -> Result<Vec<Relation>, BoxError> {
    let rows = sqlx::query(
        "SELECT c.relname::text AS name, pg_relation_size(c.oid) AS bytes \
         FROM pg_class c \
         WHERE c.oid = to_regclass($1) \
            OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = to_regclass($1)) \
         ORDER BY c.relkind DESC, c.relname",
    )
    .bind(table)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|row| {
            Ok(Relation {
                name: row.try_get("name")?,
                bytes: row.try_get("bytes")?,
            })
        })
        .collect()
}

/// The columns a settled claim fills, with what each holds on average
/// (`pg_column_size`, as stored: a short text or bytea with its 1-byte
/// header), over a sample of about [`SAMPLED_ROWS`] of the table's `keys`
/// rows (all of them in a small table: a fixed 1% of a few thousand rows
/// is often no page at all, and an average of nothing is NULL).
const SAMPLED_ROWS: f64 = 20_000.0;

const COLUMNS: [&str; 10] = [
    "account",
    "kind",
    "address",
    "state",
    "identity",
    "created_at",
    "settled_at",
    "fence",
    "first_fence",
    "namespace",
];

async fn columns(pool: &PgPool, keys: i64) -> Result<String, BoxError> {
    let percent = (SAMPLED_ROWS * 100.0 / keys.max(1) as f64).min(100.0);
    let averages: Vec<String> = COLUMNS
        .iter()
        .map(|column| format!("coalesce(avg(pg_column_size({column})), 0)::float8"))
        .collect();
    let row = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {}, coalesce(avg(pg_column_size(r.*)), 0)::float8 AS whole \
         FROM (SELECT * FROM idem_records TABLESAMPLE SYSTEM ({percent})) r",
        averages.join(", ")
    )))
    .fetch_one(pool)
    .await?;
    let mut out = String::from("\n\n| column | bytes, as stored |\n|---|--:|\n");
    for (place, column) in COLUMNS.iter().enumerate() {
        let bytes: f64 = row.try_get(place)?;
        out.push_str(&format!("| `{column}` | {bytes:.1} |\n"));
    }
    let whole: f64 = row.try_get("whole")?;
    out.push_str(&format!(
        "| the whole row (with its 24-byte header, null bitmap and padding) | {whole:.1} |"
    ));
    Ok(out)
}

/// Each unique index's shape, read with `pgstattuple`'s `pgstatindex`
/// when the extension can be installed: its height (root to leaf, what a
/// lookup walks), its leaf and internal pages (their ratio is the
/// fan-out, by which the keys must grow for one more level) and how full
/// its leaves are.
async fn shapes(pool: &PgPool) -> String {
    if sqlx::raw_sql("CREATE EXTENSION IF NOT EXISTS pgstattuple")
        .execute(pool)
        .await
        .is_err()
    {
        return "\n\nIndex shapes: not read (pgstattuple could not be installed).".into();
    }
    let mut out = String::from(
        "\n\n| index | levels, root to leaf | leaf pages | internal pages | leaf density |\n\
         |---|--:|--:|--:|--:|\n",
    );
    for index in ["idem_records_unique_without_namespace", "floor_keys_pkey"] {
        let shape: Result<(i64, i64, i64, f64), sqlx::Error> = sqlx::query_as(
            "SELECT tree_level::int8 + 1, leaf_pages, internal_pages, avg_leaf_density \
             FROM pgstatindex($1)",
        )
        .bind(index)
        .fetch_one(pool)
        .await;
        match shape {
            Ok((levels, leaves, internal, density)) => out.push_str(&format!(
                "| `{index}` | {levels} | {leaves} | {internal} | {density:.0}% |\n"
            )),
            Err(error) => out.push_str(&format!("| `{index}` | not read: {error} | | | |\n")),
        }
    }
    out
}

async fn measure(url: &str, schema: &str, flags: &Flags) -> Result<String, BoxError> {
    let options: sqlx::postgres::PgConnectOptions = url.parse()?;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect_with(options.options([("search_path", schema)]))
        .await?;
    let gate = Gate::connect(pool.clone()).await?;
    let started = Instant::now();
    for n in 0..flags.sample {
        let id = identity(n);
        let gate = gate.account(account(n, flags.accounts));
        let guard = gate.guard(&id);
        let guard = if flags.compacted {
            guard.keep_value_for(Duration::from_millis(1))
        } else {
            guard
        };
        guard.run(async { Ok::<(), Rejected>(()) }).await?;
    }
    eprintln!(
        "settled {} through the gate in {:.1?}",
        flags.sample,
        started.elapsed()
    );
    if flags.compacted {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut pruning = Pruning::new(&PruneFilter::expired(), DEFAULT_BATCH_SIZE);
        while pruning.next_batch(&pool).await?.is_some() {}
        if pruning.compacted() != flags.sample as u64 {
            return Err(format!(
                "prune compacted {} of the {} sample keys",
                pruning.compacted(),
                flags.sample
            )
            .into());
        }
    }
    let sample: (f64, i32) = sqlx::query_as(
        "SELECT avg(pg_column_size(r.*))::float8, max(length(identity)) \
         FROM idem_records r WHERE kind = 'claim'",
    )
    .fetch_one(&pool)
    .await?;
    let started = Instant::now();
    sqlx::query(BULK)
        .bind(flags.sample)
        .bind(flags.sample + flags.rows)
        .bind(sample.1)
        .bind(flags.accounts)
        .bind(flags.compacted)
        .execute(&pool)
        .await?;
    let bulk: (f64,) = sqlx::query_as(
        "SELECT avg(pg_column_size(r.*))::float8 FROM idem_records r \
         WHERE kind = 'claim' AND fence > (SELECT max(fence) - 10000 FROM idem_records)",
    )
    .fetch_one(&pool)
    .await?;
    if (bulk.0 - sample.0).abs() > 2.0 {
        return Err(format!(
            "a bulk row is {:.1} bytes wide, a gate-written one {:.1}: the copy is not \
             faithful, so its sizes would not be the gate's",
            bulk.0, sample.0
        )
        .into());
    }
    sqlx::raw_sql("VACUUM (ANALYZE) idem_records")
        .execute(&pool)
        .await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(
        FLOOR
            .replace("{accounts}", &flags.accounts.to_string())
            .replace("{rows}", &(flags.sample + flags.rows).to_string()),
    ))
    .execute(&pool)
    .await?;
    // Alone: VACUUM refuses to run in the implicit transaction of a
    // script of several statements.
    sqlx::raw_sql("VACUUM (ANALYZE) floor_keys")
        .execute(&pool)
        .await?;
    eprintln!("laid down and vacuumed in {:.1?}", started.elapsed());
    let keys = flags.sample + flags.rows;
    let idem = sizes(&pool, "idem_records").await?;
    let floor = sizes(&pool, "floor_keys").await?;
    let total = |relations: &[Relation]| relations.iter().map(|r| r.bytes).sum::<i64>();
    let per_key = |bytes: i64| bytes as f64 / keys as f64;
    let mut report = format!(
        "{keys} settled keys over {} accounts; a gate-written row is {:.1} bytes wide \
         (the bulk copies {:.1}), its identity {} bytes\n\n\
         | relation | MiB | bytes per key |\n|---|--:|--:|\n",
        flags.accounts, sample.0, bulk.0, sample.1
    );
    for relation in idem.iter().chain(&floor) {
        report.push_str(&format!(
            "| `{}` | {:.1} | {:.1} |\n",
            relation.name,
            relation.bytes as f64 / 1_048_576.0,
            per_key(relation.bytes)
        ));
    }
    let (idem_total, floor_total) = (total(&idem), total(&floor));
    report.push_str(&format!(
        "| **idem, all** | {:.1} | **{:.1}** |\n| **floor, all** | {:.1} | **{:.1}** |\n\n\
         idem ÷ floor: {:.2}×",
        idem_total as f64 / 1_048_576.0,
        per_key(idem_total),
        floor_total as f64 / 1_048_576.0,
        per_key(floor_total),
        idem_total as f64 / floor_total as f64
    ));
    report.push_str(&columns(&pool, keys).await?);
    report.push_str(&shapes(&pool).await);
    Ok(report)
}
