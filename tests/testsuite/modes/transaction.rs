//! In a transaction (`tx = ...`): the claim commits or rolls back with the
//! body's writes, and transactions racing one key charge once.

use super::*;

async fn charges_table(gate: &Gate) {
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS idem_test_charges (account text NOT NULL, order_id bigint NOT NULL)",
    )
    .execute(gate.pool())
    .await
    .expect("create the charges table");
}

async fn charges(gate: &Gate, order_id: i64) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM idem_test_charges WHERE account = $1 AND order_id = $2",
    )
    .bind(gate.account_name())
    .bind(order_id)
    .fetch_one(gate.pool())
    .await
    .expect("count charges")
}

/// Writes the charge in the caller's transaction: the charge and the claim
/// commit together or not at all.
#[idempotent(key = "order_id", tx = tx, replay)]
async fn charge_in(
    gate: &Gate,
    tx: &mut Transaction<'_, Postgres>,
    order_id: i64,
) -> Result<i64, JobError> {
    sqlx::query("INSERT INTO idem_test_charges (account, order_id) VALUES ($1, $2)")
        .bind(gate.account_name())
        .bind(order_id)
        .execute(&mut **tx)
        .await?;
    Ok(order_id * 10)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_transaction_the_claim_commits_or_rolls_back_with_the_body_s_writes() {
    let gate = testing::gate().await;
    charges_table(&gate).await;

    // Rolled back: no charge, and no claim either, so a retry runs.
    let mut tx = gate.pool().begin().await.expect("begin");
    assert_eq!(charge_in(&gate, &mut tx, 1).await.expect("runs"), 10);
    tx.rollback().await.expect("rollback");
    assert_eq!(charges(&gate, 1).await, 0);
    assert_eq!(
        rows::row_state(&gate, &Identity::new("charge_in").part(1_i64).address()).await,
        None
    );

    // Committed: one charge, settled, and the duplicate is replayed.
    let mut tx = gate.pool().begin().await.expect("begin");
    assert_eq!(charge_in(&gate, &mut tx, 1).await.expect("runs"), 10);
    tx.commit().await.expect("commit");
    let mut tx = gate.pool().begin().await.expect("begin");
    assert_eq!(charge_in(&gate, &mut tx, 1).await.expect("replayed"), 10);
    tx.commit().await.expect("commit");
    assert_eq!(charges(&gate, 1).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_waits_for_the_first_transaction_then_is_refused_or_runs() {
    let gate = testing::gate().await;
    charges_table(&gate).await;
    for commit in [true, false] {
        let order_id = if commit { 2 } else { 3 };
        let mut first = gate.pool().begin().await.expect("begin");
        charge_in(&gate, &mut first, order_id)
            .await
            .expect("first claims");

        let duplicate = tokio::spawn({
            let gate = gate.clone();
            async move {
                let mut tx = gate.pool().begin().await.expect("begin");
                let result = charge_in(&gate, &mut tx, order_id).await;
                tx.commit().await.expect("commit");
                result.map_err(|e| e.to_string())
            }
        });
        // The duplicate blocks on the first transaction's uncommitted claim.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !duplicate.is_finished(),
            "the duplicate must wait for the first transaction"
        );
        if commit {
            first.commit().await.expect("commit");
        } else {
            first.rollback().await.expect("rollback");
        }
        let result = duplicate.await.expect("duplicate task");
        // Committed: the duplicate gets the replay; rolled back: it runs.
        assert_eq!(result.expect("replayed or ran"), order_id * 10);
        assert_eq!(charges(&gate, order_id).await, 1, "commit = {commit}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_racing_one_key_charge_once() {
    let gate = testing::gate().await;
    charges_table(&gate).await;
    let report = race(8, || async {
        let mut tx = gate.pool().begin().await?;
        let result = charge_in(&gate, &mut tx, 4).await;
        tx.commit().await?;
        result
    })
    .await;
    assert_eq!(report.claimed, 1, "{report}");
    assert_eq!(report.wins + report.replayed, 8, "{report}");
    assert_eq!(charges(&gate, 4).await, 1);
}
