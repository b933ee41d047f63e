//! Claim rows read straight from `idem_records`, behind the gate's back:
//! what a test asserts the gate left there. Deliberately not through the
//! runtime's store (the code under test), and not on the claim path, so
//! these reads need not be shaped for the partial unique indexes.

use idem::Gate;
use idem::sqlx;

/// The state of a claim row of `gate`'s account and namespace: `None` when
/// absent.
///
/// # Panics
/// When the table cannot be read.
pub async fn row_state(gate: &Gate, address: &str) -> Option<String> {
    sqlx::query_scalar(
        "SELECT state FROM idem_records WHERE account = $1 AND kind = 'claim' AND address = $2 \
         AND namespace IS NOT DISTINCT FROM $3",
    )
    .bind(gate.account_name())
    .bind(address)
    .bind(gate.namespace_name())
    .fetch_optional(gate.pool())
    .await
    .expect("read idem_records")
}

/// How many claim rows `gate`'s account holds in `state`.
///
/// # Panics
/// When the table cannot be read.
pub async fn count_rows(gate: &Gate, state: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM idem_records WHERE account = $1 AND kind = 'claim' AND state = $2",
    )
    .bind(gate.account_name())
    .bind(state)
    .fetch_one(gate.pool())
    .await
    .expect("count idem_records")
}

/// Deletes the row at `address` in `gate`'s account, as an operator's
/// `idem claims release` does behind its holder's back.
///
/// # Panics
/// When the statement fails.
pub async fn delete_row(gate: &Gate, address: &str) {
    sqlx::query("DELETE FROM idem_records WHERE account = $1 AND address = $2")
        .bind(gate.account_name())
        .bind(address)
        .execute(gate.pool())
        .await
        .expect("delete the claim row");
}

/// Plants a claim row in `state` at `address` in `gate`'s account whose
/// stored identity is `identity` (canonical bytes): when that is another
/// identity's, the row is what a digest collision would leave.
///
/// # Panics
/// When the statement fails.
pub async fn plant_row(gate: &Gate, address: &str, state: &str, identity: &[u8]) {
    sqlx::query(
        "INSERT INTO idem_records (account, kind, address, state, identity) \
         VALUES ($1, 'claim', $2, $3, $4)",
    )
    .bind(gate.account_name())
    .bind(address)
    .bind(state)
    .bind(identity)
    .execute(gate.pool())
    .await
    .expect("plant a claim row");
}

/// A row trigger on `idem_records` that a test installs to make the store
/// misbehave on cue, and removes with [`RowTrigger::remove`].
///
/// Works on a Citus coordinator too: Citus creates a trigger on every shard
/// once `citus.enable_unsafe_triggers` says the test takes responsibility
/// for it (a mere placeholder setting on PostgreSQL without Citus), and it
/// propagates DDL one statement at a time, so each runs on its own.
#[derive(Debug)]
pub struct RowTrigger {
    name: String,
}

impl RowTrigger {
    /// Creates the PL/pgSQL trigger function `name` with `body` (between
    /// `BEGIN` and `END`) and fires it `when` (`BEFORE UPDATE`, `AFTER
    /// DELETE`, ...) for each row of `idem_records`.
    ///
    /// # Panics
    /// When the function or trigger cannot be created.
    pub async fn install(pool: &sqlx::PgPool, name: &str, when: &str, body: &str) -> RowTrigger {
        let statements = [
            "SET citus.enable_unsafe_triggers TO on".to_owned(),
            format!(
                "CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN {body} END $$"
            ),
            format!(
                "CREATE TRIGGER {name} {when} ON idem_records FOR EACH ROW EXECUTE FUNCTION {name}()"
            ),
        ];
        execute_each(pool, &statements, "install the trigger").await;
        RowTrigger {
            name: name.to_owned(),
        }
    }

    /// Drops the trigger and its function.
    ///
    /// # Panics
    /// When they cannot be dropped.
    pub async fn remove(self, pool: &sqlx::PgPool) {
        let name = &self.name;
        let statements = [
            "SET citus.enable_unsafe_triggers TO on".to_owned(),
            format!("DROP TRIGGER {name} ON idem_records"),
            format!("DROP FUNCTION {name}()"),
        ];
        execute_each(pool, &statements, "remove the trigger").await;
    }
}

/// Runs `statements` one after the other on one connection of `pool`.
async fn execute_each(pool: &sqlx::PgPool, statements: &[String], doing: &str) {
    let mut connection = pool
        .acquire()
        .await
        .unwrap_or_else(|e| panic!("{doing}: {e}"));
    for statement in statements {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement.as_str()))
            .execute(&mut *connection)
            .await
            .unwrap_or_else(|e| panic!("{doing}: {statement}: {e}"));
    }
}
