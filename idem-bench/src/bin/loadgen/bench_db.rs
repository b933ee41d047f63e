//! The benchmark's own corner of the database: a schema created afresh for
//! the run (idem's tables and the alternatives' tables in it), the pools
//! that reach it, what its tables hold before each run, and its removal.
//!
//! Every connection gets `search_path` set to the schema at connect time,
//! so the gate, the floor and the alternatives all run their ordinary,
//! unqualified SQL against the benchmark's tables and never the tests'.

use std::str::FromStr;
use std::sync::Arc;

use idem::Gate;
use idem::sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use idem::sqlx::{self, AssertSqlSafe, PgPool};

use crate::BoxError;
use crate::accounts::Accounts;
use crate::duplicates::Settled;
use crate::{advisory, brandur, recovery_points, steps_in_row};

/// What the tables hold when a run starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contents {
    /// Nothing: every such run starts from empty tables.
    Empty,
    /// This many settled claims, for the duplicates group to refuse.
    Settled(u64),
    /// Both at once: `history` settled claims laid down in bulk, and
    /// `settled` ones for the duplicates scenarios to refuse (the history
    /// group, and every run of the Citus comparison). A larger history
    /// over the same settled claims only adds rows.
    Preloaded { history: u64, settled: u64 },
}

/// How `idem_records` is laid out, by idem's own set-up functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableLayout {
    /// One table (`Gate::connect`).
    Plain,
    /// Hash-partitioned on account (`idem::schema::set_up_partitioned`).
    Partitioned(u16),
    /// Distributed by Citus on account (`idem::schema::set_up_distributed`);
    /// the URL must be the coordinator's.
    Distributed,
}

/// The benchmark schema, and what its tables hold now.
pub struct BenchDb {
    schema: String,
    connect: PgConnectOptions,
    /// For set-up and description; never measured.
    admin: PgPool,
    layout: TableLayout,
    /// Whose rows the pre-fill and the settled identities are.
    accounts: Arc<Accounts>,
    contents: Option<Contents>,
    settled: Option<Arc<Settled>>,
    checkpoints: bool,
}

/// Settled claims `$2 ..= $3`, one statement, row `i` in account
/// `$1[i mod the number of accounts]`, as [`Accounts::of`] places
/// operations. Addresses are spread over the key space like the gate's (md5
/// is built in; sha1 would need pgcrypto). On Citus the coordinator runs
/// the `SELECT` and routes each row to its account's shard.
const PREFILL: &str = "INSERT INTO idem_records \
       (account, kind, address, namespace, state, identity, created_at, settled_at) \
     SELECT ($1::text[])[1 + i % cardinality($1::text[])], 'claim', \
            'claim_' || left(md5(i::text), 24), NULL, 'success', \
            decode(md5(i::text) || md5((-i)::text), 'hex'), now(), now() \
     FROM generate_series($2::bigint, $3::bigint) AS i";

/// Two statements: Citus truncates a distributed table, but not in one
/// statement with tables of the coordinator's own.
const EMPTY: &str = "TRUNCATE idem_records; TRUNCATE idempotency_keys, advisory_outcomes, recovery_points, \
     steps_in_row";

impl BenchDb {
    /// Drops `schema` if it exists (a crashed run's leftovers), creates it
    /// afresh with idem's tables laid out as `layout` says and the
    /// alternatives' tables; the pre-fill and the settled identities will
    /// belong to `accounts`.
    pub async fn create(
        url: &str,
        schema: &str,
        layout: TableLayout,
        checkpoints: bool,
        accounts: Arc<Accounts>,
    ) -> Result<BenchDb, BoxError> {
        let connect = PgConnectOptions::from_str(url)?
            .application_name("idem-loadgen")
            .options([("search_path", schema)]);
        let admin = PgPoolOptions::new()
            .max_connections(2)
            .connect_with(connect.clone())
            .await?;
        // `schema` is a plain identifier: the flag's parser checked it.
        sqlx::raw_sql(AssertSqlSafe(format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema};"
        )))
        .execute(&admin)
        .await?;
        // The gate sets its own schema up where search_path points.
        match layout {
            TableLayout::Plain => {}
            TableLayout::Partitioned(partitions) => {
                idem::schema::set_up_partitioned(&admin, partitions).await?;
            }
            TableLayout::Distributed => idem::schema::set_up_distributed(&admin).await?,
        }
        Gate::connect(admin.clone()).await?;
        sqlx::raw_sql(brandur::SCHEMA).execute(&admin).await?;
        sqlx::raw_sql(advisory::SCHEMA).execute(&admin).await?;
        sqlx::raw_sql(recovery_points::SCHEMA)
            .execute(&admin)
            .await?;
        sqlx::raw_sql(steps_in_row::SCHEMA).execute(&admin).await?;
        Ok(BenchDb {
            schema: schema.to_owned(),
            connect,
            admin,
            layout,
            accounts,
            contents: None,
            settled: None,
            checkpoints,
        })
    }

    /// The connection for describing the server.
    pub fn admin(&self) -> &PgPool {
        &self.admin
    }

    /// A pool of `size` connections, every one already open, so that
    /// connecting is never measured. sqlx's defaults otherwise, the same for
    /// every scenario.
    pub async fn pool(&self, size: u32, ping_on_acquire: bool) -> Result<PgPool, BoxError> {
        let pool = PgPoolOptions::new()
            .max_connections(size)
            .test_before_acquire(ping_on_acquire)
            .connect_with(self.connect.clone())
            .await?;
        let mut open = Vec::new();
        for _ in 0..size {
            open.push(pool.acquire().await?);
        }
        Ok(pool)
    }

    /// Brings the tables to `want`, then checkpoints (unless told not to),
    /// so that every run starts just after a checkpoint rather than one
    /// landing in the middle of some runs and not others.
    ///
    /// Refusals write nothing, so settled rows are kept from one run to the
    /// next; history is kept too, growing by the few rows each run adds.
    pub async fn prepare(&mut self, want: Contents) -> Result<(), BoxError> {
        match (want, self.contents) {
            (Contents::Settled(_) | Contents::Preloaded { .. }, Some(have)) if have == want => {}
            (Contents::Settled(count), _) => {
                self.empty().await?;
                self.settle(count).await?;
            }
            (
                Contents::Preloaded { history, settled },
                Some(Contents::Preloaded {
                    history: have,
                    settled: settled_before,
                }),
            ) if settled == settled_before && have < history => {
                self.prefill(have, history).await?;
            }
            (Contents::Preloaded { history, settled }, _) => {
                self.empty().await?;
                self.settle(settled).await?;
                self.prefill(0, history).await?;
            }
            (Contents::Empty, _) => self.empty().await?,
        }
        self.contents = Some(want);
        self.checkpoint().await
    }

    /// The settled rows, while the tables hold them.
    pub fn settled(&self) -> Option<Arc<Settled>> {
        match self.contents {
            Some(Contents::Settled(_) | Contents::Preloaded { .. }) => self.settled.clone(),
            _ => None,
        }
    }

    /// Drops the schema and everything in it.
    pub async fn drop_schema(self) -> Result<(), BoxError> {
        sqlx::raw_sql(AssertSqlSafe(format!(
            "DROP SCHEMA IF EXISTS {} CASCADE",
            self.schema
        )))
        .execute(&self.admin)
        .await?;
        self.admin.close().await;
        Ok(())
    }

    /// Whose rows the pre-fill and the settled identities are: the
    /// accounts the measured operations claim in as well.
    pub fn accounts(&self) -> Arc<Accounts> {
        Arc::clone(&self.accounts)
    }

    async fn settle(&mut self, count: u64) -> Result<(), BoxError> {
        eprintln!("settling {count} identities for the duplicates group ...");
        let settled = Settled::insert(&self.admin, count, Arc::clone(&self.accounts)).await?;
        self.settled = Some(Arc::new(settled));
        Ok(())
    }

    async fn empty(&mut self) -> Result<(), BoxError> {
        sqlx::raw_sql(EMPTY).execute(&self.admin).await?;
        self.settled = None;
        Ok(())
    }

    /// Adds settled claims `have + 1 ..= rows`, then `VACUUM (ANALYZE)`: a
    /// table with years of history has been vacuumed by autovacuum, so the
    /// runs on it should not pay for setting every row's hint bits.
    async fn prefill(&self, have: u64, rows: u64) -> Result<(), BoxError> {
        eprintln!("pre-filling idem_records from {have} to {rows} settled rows ...");
        sqlx::query(PREFILL)
            .bind(self.accounts.names())
            .bind(i64::try_from(have + 1)?)
            .bind(i64::try_from(rows)?)
            .execute(&self.admin)
            .await?;
        sqlx::raw_sql("VACUUM (ANALYZE) idem_records")
            .execute(&self.admin)
            .await?;
        Ok(())
    }

    /// What `idem_records` and each of its indexes hold on disk:
    /// (relation, bytes), the table first. On Citus, the coordinator's
    /// (empty) shell: not what this reports.
    pub async fn sizes(&self) -> Result<Vec<(String, i64)>, BoxError> {
        let rows: Vec<(String, i64)> = sqlx::query_as(
            "SELECT c.relname::text, pg_relation_size(c.oid) \
             FROM pg_class c \
             WHERE c.oid = 'idem_records'::regclass \
                OR c.oid IN (SELECT indexrelid FROM pg_index \
                             WHERE indrelid = 'idem_records'::regclass) \
             ORDER BY c.relkind DESC, c.relname",
        )
        .fetch_all(&self.admin)
        .await?;
        Ok(rows)
    }

    /// `CHECKPOINT` needs superuser or `pg_checkpoint`; without either, the
    /// run goes on and says once that checkpoints fall where they fall. On
    /// Citus the rows and their WAL are the workers': each of them
    /// checkpoints too.
    async fn checkpoint(&mut self) -> Result<(), BoxError> {
        if !self.checkpoints {
            return Ok(());
        }
        let sql = match self.layout {
            TableLayout::Distributed => {
                "CHECKPOINT; \
                 DO $$ BEGIN \
                   IF EXISTS (SELECT FROM run_command_on_workers('CHECKPOINT') WHERE NOT success) \
                   THEN RAISE EXCEPTION 'CHECKPOINT failed on a worker'; END IF; \
                 END $$"
            }
            TableLayout::Plain | TableLayout::Partitioned(_) => "CHECKPOINT",
        };
        if let Err(error) = sqlx::raw_sql(sql).execute(&self.admin).await {
            eprintln!(
                "note: CHECKPOINT failed ({error}); runs go on without one before each, \
                 so a checkpoint may land inside some runs"
            );
            self.checkpoints = false;
        }
        Ok(())
    }
}
