//! Prune and steps, against a real PostgreSQL, on every walk prune has (in
//! heap order on PostgreSQL 14 and later, through the indexes across
//! accounts as on 12 and 13, and by account as on Citus): a pruned claim
//! takes its steps with it, in both namespace forms; a claim that is not
//! pruned (pending, or settled after the cut-off) keeps its own, even
//! where another claim at the same address is pruned; a step whose claim
//! is gone goes by the same age rule as a claim, and never while pending.
//!
//! Like `index_use`, it needs a PostgreSQL (`DATABASE_URL`, or the local
//! default), sets the schema up in a schema of its own, and drops it after.

use std::num::NonZeroU32;
use std::str::FromStr;
use std::time::{Duration, UNIX_EPOCH};

use idem::sqlx;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Executor, PgPool};

use super::prune::{PruneFilter, Pruning};
use super::scratch::Scratch;
use super::{catalog, operations};

/// A planted row: `(what, account, kind, address, namespace, state,
/// settled, claim_address)`; `settled` may name a release time too
/// (`"old, released new"`).
type Planted = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    Option<&'static str>,
    &'static str,
    &'static str,
    Option<&'static str>,
);

/// The claims and steps every walk starts from ([`Planted`]); settled
/// `'old'` is before the cut-off (2024-01-01), `'new'` after it
/// (2024-06-01).
const ROWS: &[Planted] = &[
    // A settled claim, pruned, and its two steps (one cut off) with it.
    (
        "pruned claim",
        "acme",
        "claim",
        "claim_a",
        None,
        "success",
        "old",
        None,
    ),
    (
        "its recorded step",
        "acme",
        "step",
        "step_a1",
        None,
        "success",
        "old",
        Some("claim_a"),
    ),
    (
        "its cut-off step",
        "acme",
        "step",
        "step_a2",
        None,
        "pending",
        "",
        Some("claim_a"),
    ),
    // The same address in a namespace, pending: it keeps its step.
    (
        "pending claim",
        "acme",
        "claim",
        "claim_a",
        Some("live"),
        "pending",
        "",
        None,
    ),
    (
        "its step",
        "acme",
        "step",
        "step_b1",
        Some("live"),
        "success",
        "old",
        Some("claim_a"),
    ),
    // A settled claim in a namespace, pruned with its step.
    (
        "pruned claim in live",
        "beta",
        "claim",
        "claim_c",
        Some("live"),
        "success",
        "old",
        None,
    ),
    (
        "its step in live",
        "beta",
        "step",
        "step_c1",
        Some("live"),
        "success",
        "old",
        Some("claim_c"),
    ),
    // Settled after the cut-off: kept, with its step.
    (
        "recent claim",
        "beta",
        "claim",
        "claim_d",
        None,
        "success",
        "new",
        None,
    ),
    (
        "its recent step",
        "beta",
        "step",
        "step_d1",
        None,
        "success",
        "old",
        Some("claim_d"),
    ),
    // Steps whose claim was released: by the age rule.
    (
        "old step, claim gone",
        "acme",
        "step",
        "step_e1",
        None,
        "success",
        "old",
        Some("claim_e"),
    ),
    (
        "new step, claim gone",
        "acme",
        "step",
        "step_e2",
        None,
        "success",
        "new",
        Some("claim_e"),
    ),
    (
        "cut-off step, claim gone",
        "acme",
        "step",
        "step_e3",
        None,
        "pending",
        "",
        Some("claim_e"),
    ),
    (
        "old step in live, claim gone",
        "beta",
        "step",
        "step_f1",
        Some("live"),
        "success",
        "old",
        Some("claim_f"),
    ),
    // Recorded before the cut-off, its claim released after it (held in
    // doubt, say, then released): its retry replays it, so it is kept.
    (
        "old step, claim released since",
        "acme",
        "step",
        "step_g1",
        None,
        "success",
        "old, released new",
        Some("claim_g"),
    ),
    // Recorded and released before the cut-off: pruned.
    (
        "old step in live, claim released long ago",
        "beta",
        "step",
        "step_h1",
        Some("live"),
        "success",
        "old, released old",
        Some("claim_h"),
    ),
];

/// What a prune with the cut-off between `'old'` and `'new'` deletes.
const PRUNED: &[&str] = &[
    "pruned claim",
    "its recorded step",
    "its cut-off step",
    "pruned claim in live",
    "its step in live",
    "old step, claim gone",
    "old step in live, claim gone",
    "old step in live, claim released long ago",
];

/// A pool of two connections in `schema`.
async fn pool_in(schema: &str) -> PgPool {
    let url = idem::testing::database_url();
    let options = PgConnectOptions::from_str(&url)
        .expect("the tests' URL")
        .options([("search_path", schema)]);
    PgPoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await
        .expect("connect a pool to the tests' PostgreSQL")
}

/// A scratch schema named after `name`, with idem's tables set up, and a
/// pool in it.
async fn scratch_schema(name: &str) -> (Scratch, PgPool) {
    let mut scratch = Scratch::new(name).await;
    catalog::set_up(&mut scratch.conn)
        .await
        .expect("set the schema up");
    let schema: String = sqlx::query_scalar("SELECT current_schema()::text")
        .fetch_one(&mut scratch.conn)
        .await
        .expect("the scratch schema");
    let pool = pool_in(&schema).await;
    (scratch, pool)
}

/// Plants [`ROWS`] afresh.
async fn plant(pool: &PgPool) {
    pool.execute("DELETE FROM idem_records")
        .await
        .expect("empty the table");
    for (_, account, kind, address, namespace, state, settled, claim_address) in ROWS {
        let (old, new) = ("2024-01-01T00:00:00Z", "2024-06-01T00:00:00Z");
        let (settled_at, released_at) = match *settled {
            "old" => (Some(old), None),
            "new" => (Some(new), None),
            "old, released new" => (Some(old), Some(new)),
            "old, released old" => (Some(old), Some(old)),
            _ => (None, None),
        };
        sqlx::query(
            "INSERT INTO idem_records \
                 (account, kind, address, namespace, state, identity, created_at, settled_at, \
                  claim_address, output_json, released_at) \
             VALUES ($1, $2, $3, $4, $5, '\\x00', timestamptz '2023-12-01', $6::timestamptz, \
                     $7, CASE WHEN $5 = 'success' THEN '{}' END, $8::timestamptz)",
        )
        .bind(account)
        .bind(kind)
        .bind(address)
        .bind(namespace)
        .bind(state)
        .bind(settled_at)
        .bind(claim_address)
        .bind(released_at)
        .execute(pool)
        .await
        .expect("plant a row");
    }
}

/// What is left, by the names in [`ROWS`].
async fn left(pool: &PgPool) -> Vec<&'static str> {
    let rows: Vec<(String, String, String, Option<String>)> =
        sqlx::query_as("SELECT account, kind, address, namespace FROM idem_records")
            .fetch_all(pool)
            .await
            .expect("read what is left");
    ROWS.iter()
        .filter(|(_, account, kind, address, namespace, ..)| {
            rows.iter().any(|(a, k, ad, n)| {
                a == account && k == kind && ad == address && n.as_deref() == *namespace
            })
        })
        .map(|(what, ..)| *what)
        .collect()
}

/// Runs `pruning` to its end; the claims and steps it deleted.
async fn run(pool: &PgPool, mut pruning: Pruning) -> (u64, u64) {
    let mut claims = 0;
    while let Some(batch) = pruning.next_batch(pool).await.expect("a batch") {
        claims += batch;
    }
    (claims, pruning.steps_deleted())
}

#[tokio::test]
async fn prune_takes_a_settled_claims_steps_with_it_on_every_walk_and_leaves_the_rest() {
    let (scratch, pool) = scratch_schema("idem_prune_steps").await;
    let cut_off = UNIX_EPOCH + Duration::from_secs(1_709_251_200); // 2024-03-01
    // A batch of one entry: every window boundary is crossed, a claim's
    // steps and the claim in different batches.
    let one = NonZeroU32::MIN;
    let all = PruneFilter::new(cut_off);
    let walks: Vec<(&str, Vec<Pruning>)> = vec![
        (
            "the default walk (heap order on 14+)",
            vec![Pruning::new(&all, one)],
        ),
        (
            "across the indexes",
            vec![Pruning::new(&all, one).across_indexes()],
        ),
        (
            "by account",
            ["acme", "beta"]
                .into_iter()
                .map(|account| Pruning::new(&PruneFilter::new(cut_off).account(account), one))
                .collect(),
        ),
    ];
    let kept: Vec<&str> = ROWS
        .iter()
        .map(|(what, ..)| *what)
        .filter(|what| !PRUNED.contains(what))
        .collect();
    let mut failures = Vec::new();
    for (walk, prunings) in walks {
        plant(&pool).await;
        let (mut claims, mut steps) = (0, 0);
        for pruning in prunings {
            let (c, s) = run(&pool, pruning).await;
            claims += c;
            steps += s;
        }
        let now = left(&pool).await;
        if now != kept {
            failures.push(format!("{walk}: left {now:?}, not {kept:?}"));
        }
        if (claims, steps) != (2, 6) {
            failures.push(format!(
                "{walk}: counted {claims} claims and {steps} steps, not 2 and 6"
            ));
        }
    }
    // And `claims show`'s statement finds the steps of the claim it names,
    // in its namespace only.
    plant(&pool).await;
    let slot = operations::Slot::new("acme", Some("live"), "claim_a");
    let steps = operations::steps(&pool, slot)
        .await
        .expect("list the steps");
    let addresses: Vec<&str> = steps.iter().map(|step| step.address.as_str()).collect();
    if addresses != ["step_b1"] || steps[0].output_bytes != Some(2) {
        failures.push(format!("the steps of claim_a in live: {steps:?}"));
    }
    pool.close().await;
    scratch.drop().await;
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Plants the claims a compaction is tried on: two successes past their
/// value's window (one in `live`, with a step), one inside it, one kept
/// for ever; none past a slot's window, so an expired-only prune deletes
/// none of them.
async fn plant_for_compaction(pool: &PgPool) {
    pool.execute("DELETE FROM idem_records")
        .await
        .expect("empty the table");
    let claims: [(&str, &str, Option<&str>, Option<&str>); 4] = [
        ("acme", "claim_v", None, Some("1 day")),
        ("beta", "claim_w", Some("live"), Some("1 day")),
        ("acme", "claim_x", None, Some("1000 years")),
        ("acme", "claim_y", None, None),
    ];
    for (account, address, namespace, window) in claims {
        sqlx::query(
            "INSERT INTO idem_records \
                 (account, kind, address, namespace, state, identity, created_at, settled_at, \
                  output_json, fingerprint, fence, first_fence, value_kept_for) \
             VALUES ($1, 'claim', $2, $3, 'success', $4, timestamptz '2024-06-01', \
                     timestamptz '2024-06-01', '\"v\"', '\\x01', 3, 3, $5::interval)",
        )
        .bind(account)
        .bind(address)
        .bind(namespace)
        .bind(idem::Identity::new("compact").part(address).canonical())
        .bind(window)
        .execute(pool)
        .await
        .expect("plant a claim");
    }
    sqlx::query(
        "INSERT INTO idem_records \
             (account, kind, address, namespace, state, identity, settled_at, claim_address) \
         VALUES ('beta', 'step', 'step_w1', 'live', 'success', '\\x00', \
                 timestamptz '2024-06-01', 'claim_w')",
    )
    .execute(pool)
    .await
    .expect("plant a step");
}

/// Per claim address: the length of its identity, whether it still has
/// its value, fingerprint and `first_fence`; and how many steps are left.
async fn compaction_left(pool: &PgPool) -> (Vec<(String, i32, bool)>, i64) {
    let claims = sqlx::query_as(
        "SELECT address, octet_length(identity), \
                output_json IS NOT NULL OR fingerprint IS NOT NULL OR first_fence IS NOT NULL \
         FROM idem_records WHERE kind = 'claim' ORDER BY address",
    )
    .fetch_all(pool)
    .await
    .expect("read the claims");
    let steps = sqlx::query_scalar("SELECT count(*) FROM idem_records WHERE kind = 'step'")
        .fetch_one(pool)
        .await
        .expect("count the steps");
    (claims, steps)
}

#[tokio::test]
async fn every_walk_compacts_the_successes_past_their_value_window_once_with_their_steps() {
    let (scratch, pool) = scratch_schema("idem_prune_compaction").await;
    let one = NonZeroU32::MIN;
    let expired = PruneFilter::expired();
    let walks: Vec<(&str, Vec<Pruning>)> = vec![
        ("the default walk", vec![Pruning::new(&expired, one)]),
        (
            "across the indexes",
            vec![Pruning::new(&expired, one).across_indexes()],
        ),
        (
            "by account",
            ["acme", "beta"]
                .into_iter()
                .map(|account| Pruning::new(&PruneFilter::expired().account(account), one))
                .collect(),
        ),
    ];
    let full = |_: i32| {
        idem::Identity::new("compact")
            .part("claim_v")
            .canonical()
            .len() as i32
    };
    let expected = vec![
        ("claim_v".to_owned(), 8, false),
        ("claim_w".to_owned(), 8, false),
        ("claim_x".to_owned(), full(0), true),
        ("claim_y".to_owned(), full(0), true),
    ];
    let mut failures = Vec::new();
    for (walk, prunings) in walks {
        plant_for_compaction(&pool).await;
        let (mut compacted, mut deleted) = (0, 0);
        for mut pruning in prunings.clone() {
            while let Some(batch) = pruning.next_batch(&pool).await.expect("a batch") {
                deleted += batch;
            }
            compacted += pruning.compacted();
        }
        let left = compaction_left(&pool).await;
        if (compacted, deleted) != (2, 0) || left != (expected.clone(), 0) {
            failures.push(format!(
                "{walk}: compacted {compacted}, deleted {deleted}, left {left:?}"
            ));
        }
        // Once: a walk again compacts nothing more.
        let mut again = 0;
        for mut pruning in prunings {
            while pruning.next_batch(&pool).await.expect("a batch").is_some() {}
            again += pruning.compacted();
        }
        if again != 0 {
            failures.push(format!("{walk}: compacted {again} more the second time"));
        }
    }
    pool.close().await;
    scratch.drop().await;
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
