//! A rolling deploy: processes of the previous release (schema version 4)
//! keep running against a schema migrated to version 5 while the new
//! release holds claims `in_doubt` and keeps them `failed`. They must never
//! run, take over, settle over or release such a claim.
//!
//! The statements below are the previous release's, frozen as it shipped
//! them (the forms without a namespace): changing them here would test
//! something no deployed process runs.

use idem::sqlx::{self, PgPool, Row};
use idem::{Gate, testing};

/// Its claim statement: look, and insert only when nothing is there. The
/// previous release ran the body only when `won`, took over only when
/// `lease_expired`, and refused the duplicate otherwise.
const CLAIM: &str = "WITH existing AS ( \
         SELECT state = 'success' AS settled, identity, fingerprint, fence, \
                coalesce(first_fence, fence) AS lineage, \
                coalesce(lease_expires_at < now(), false) AS lease_expired \
         FROM idem_records \
         WHERE account = $1 AND kind = 'claim' AND address = $2 \
           AND namespace IS NULL AND $3::text IS NULL \
     ), claimed AS ( \
         INSERT INTO idem_records \
           (account, kind, address, namespace, state, identity, fingerprint, lease_expires_at) \
         SELECT $1, 'claim', $2, $3, 'pending', $4, NULL, now() + $5 * interval '1 microsecond' \
         WHERE NOT EXISTS (SELECT FROM existing) \
         ON CONFLICT DO NOTHING \
         RETURNING fence \
     ) \
     SELECT true AS won, NULL::boolean AS settled, NULL::boolean AS lease_expired FROM claimed \
     UNION ALL \
     SELECT false, settled, lease_expired FROM existing";

/// Its per-row statements that change a claim, each with `$1` account, `$2`
/// address, `$3` namespace (NULL), `$4` the fence it holds or saw.
const CHANGES: [(&str, &str); 5] = [
    (
        "settle",
        "UPDATE idem_records \
         SET state = 'success', settled_at = now(), lease_expires_at = NULL, output_json = NULL \
         WHERE account = $1 AND kind = 'claim' AND address = $2 \
           AND namespace IS NULL AND $3::text IS NULL AND state = 'pending' AND fence = $4",
    ),
    (
        "release",
        "DELETE FROM idem_records \
         WHERE account = $1 AND kind = 'claim' AND address = $2 \
           AND namespace IS NULL AND $3::text IS NULL AND state = 'pending' AND fence = $4",
    ),
    (
        "extend",
        "UPDATE idem_records SET lease_expires_at = now() + interval '1 minute' \
         WHERE account = $1 AND kind = 'claim' AND address = $2 \
           AND namespace IS NULL AND $3::text IS NULL AND state = 'pending' AND fence = $4 \
           AND lease_expires_at IS NOT NULL",
    ),
    (
        "take over",
        "UPDATE idem_records \
         SET fence = nextval('idem_records_fence_seq'), created_at = now(), fingerprint = NULL, \
             first_fence = coalesce(first_fence, fence), \
             lease_expires_at = now() + interval '1 minute' \
         WHERE account = $1 AND kind = 'claim' AND address = $2 \
           AND namespace IS NULL AND $3::text IS NULL \
           AND state = 'pending' AND fence = $4 AND lease_expires_at < now()",
    ),
    (
        "settle over (a late success)",
        "UPDATE idem_records \
         SET state = 'success', settled_at = now(), lease_expires_at = NULL, output_json = NULL \
         WHERE account = $1 AND kind = 'claim' AND address = $2 \
           AND namespace IS NULL AND $3::text IS NULL AND state = 'pending' AND fence = $4",
    ),
];

/// Its operator's release (`idem claims release`), matched on no fence.
const RELEASE_PENDING: &str = "DELETE FROM idem_records r \
     WHERE account = $1 AND kind = 'claim' AND address = $2 \
       AND namespace IS NULL AND $3::text IS NULL AND state = 'pending'";

/// Its prune (`idem prune`), of everything settled before now.
const PRUNE: &str = "DELETE FROM idem_records \
     WHERE kind = 'claim' AND state = 'success' AND settled_at < now() AND account = $1";

async fn row(pool: &PgPool, account: &str, address: &str) -> (String, i64) {
    sqlx::query_as("SELECT state, fence FROM idem_records WHERE account = $1 AND address = $2")
        .bind(account)
        .bind(address)
        .fetch_one(pool)
        .await
        .expect("the claim is still there")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_previous_release_never_runs_takes_over_or_releases_a_claim_in_doubt_or_failed() {
    let gate: Gate = testing::gate().await;
    let pool = gate.pool();
    let account = gate.account_name();
    for (address, state, reason) in [
        ("claim_in_doubt", "in_doubt", "body_in_doubt"),
        ("claim_expired", "in_doubt", "lease_expired"),
        ("claim_failed", "failed", "kept_failure"),
    ] {
        // As the new release leaves them: made long ago, with a reason and
        // no lease. Every statement that takes a claim out of `pending`
        // clears its lease, and must: the previous release reads an expired
        // lease as "take it over", whatever the state.
        sqlx::query(
            "INSERT INTO idem_records \
               (account, kind, address, state, identity, created_at, settled_at, state_reason) \
             VALUES ($1, 'claim', $2, $3, '\\x00', now() - interval '1 day', \
                     CASE WHEN $3 = 'failed' THEN now() - interval '1 day' END, $4)",
        )
        .bind(account)
        .bind(address)
        .bind(state)
        .bind(reason)
        .execute(pool)
        .await
        .expect("a claim as the new release holds it");
        let (_, fence) = row(pool, account, address).await;

        for lease in [None, Some(1_000_000_i64)] {
            let found = sqlx::query(CLAIM)
                .bind(account)
                .bind(address)
                .bind(None::<&str>)
                .bind(&b"\x00"[..])
                .bind(lease)
                .fetch_one(pool)
                .await
                .expect("the previous release's claim");
            let won: bool = found.get("won");
            let settled: Option<bool> = found.get("settled");
            let lease_expired: Option<bool> = found.get("lease_expired");
            assert!(!won, "{address}: the previous release would run the body");
            assert_eq!(
                (settled, lease_expired),
                (Some(false), Some(false)),
                "{address}: the previous release must see it held, not settled and not expired, \
                 so it refuses the duplicate in flight"
            );
        }
        for (name, statement) in CHANGES {
            for seen in [fence, fence + 1] {
                let changed = match sqlx::query(statement)
                    .bind(account)
                    .bind(address)
                    .bind(None::<&str>)
                    .bind(seen)
                    .execute(pool)
                    .await
                {
                    Ok(done) => done.rows_affected(),
                    // Citus refuses the previous release's take over
                    // (nextval in an UPDATE's SET list) before it changes
                    // anything: that release could never take over there.
                    Err(e) if e.to_string().contains("must not be VOLATILE") => 0,
                    Err(e) => panic!("the previous release's {name}: {e}"),
                };
                assert_eq!(
                    changed, 0,
                    "the previous release's {name} changed {address}"
                );
            }
        }
        let released = sqlx::query(RELEASE_PENDING)
            .bind(account)
            .bind(address)
            .bind(None::<&str>)
            .execute(pool)
            .await
            .expect("the previous release's operator release")
            .rows_affected();
        assert_eq!(released, 0, "`idem claims release` of the previous release");
        let pruned = sqlx::query(PRUNE)
            .bind(account)
            .execute(pool)
            .await
            .expect("the previous release's prune")
            .rows_affected();
        assert_eq!(pruned, 0, "`idem prune` of the previous release");
        assert_eq!(row(pool, account, address).await, (state.to_owned(), fence));
    }
}
