//! What prune leaves of a success past its value's window
//! (`keep_value_for`): the slot, which still refuses every duplicate and a
//! colliding identity; not the value, the fingerprint, the steps or the
//! canonical identity, which give way to an 8-byte check of it. (Every
//! walk compacts, once: `store::prune_steps`.) `at_the_edges`: a red
//! team's attacks, from the docs alone.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem::operations::{self, NamespaceFilter, PruneFilter, Pruning, ScopeFilter};
use idem::sqlx::{self, PgPool};
use idem::{Fingerprint, Gate, Identity, Rejected, testing};

use super::{WINDOW, counted, past_the_window};
use crate::support::steps::steps_of;

mod at_the_edges;

/// The stored row of `id` in `gate`'s account: its identity, value,
/// fingerprint and `first_fence`.
async fn stored(gate: &Gate, id: &Identity) -> (Vec<u8>, Option<String>, Option<Vec<u8>>) {
    sqlx::query_as(
        "SELECT identity, output_json, fingerprint FROM idem_records \
         WHERE account = $1 AND kind = 'claim' AND address = $2 \
         AND namespace IS NOT DISTINCT FROM $3",
    )
    .bind(gate.account_name())
    .bind(id.address())
    .bind(gate.namespace_name())
    .fetch_one(gate.pool())
    .await
    .expect("the claim's row")
}

/// Runs a whole prune of what has expired in `account`; what it compacted.
async fn compact(pool: &PgPool, account: &str) -> u64 {
    let filter = PruneFilter::expired().account(account);
    let mut pruning = Pruning::new(&filter, NonZeroU32::MIN);
    while pruning.next_batch(pool).await.expect("a batch").is_some() {}
    pruning.compacted()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_compacts_a_success_past_its_value_window_and_its_slot_still_refuses_duplicates() {
    let gate = testing::gate().await;
    let account = gate.account_name().to_owned();
    let id = Identity::new("receipt").part("ord_compacted");
    let runs = Arc::new(AtomicUsize::new(0));
    let guard = || {
        gate.guard(&id)
            .replay()
            .fingerprint(Fingerprint::new().part(1250_i64))
            .keep_value_for(WINDOW)
    };
    let first = guard()
        .run({
            let runs = Arc::clone(&runs);
            async move {
                let charge: String = idem::step("charge", async {
                    Ok::<String, Rejected>("ch_1".to_owned())
                })
                .await?;
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<String, Rejected>(format!("receipt for {charge}"))
            }
        })
        .await;
    assert_eq!(first.ok().as_deref(), Some("receipt for ch_1"));
    assert_eq!(steps_of(&gate, &id).await.len(), 1, "the step is recorded");

    // Inside the window nothing is compacted.
    assert_eq!(compact(gate.pool(), &account).await, 0);
    assert_eq!(stored(&gate, &id).await.0, id.canonical());

    past_the_window().await;
    assert_eq!(compact(gate.pool(), &account).await, 1);
    let (identity, value, fingerprint) = stored(&gate, &id).await;
    assert_eq!(identity.len(), 8, "an 8-byte check: {identity:02x?}");
    assert!(operations::is_compacted(&identity));
    assert_eq!(
        (value, fingerprint),
        (None, None),
        "the value and fingerprint are gone"
    );
    assert!(
        steps_of(&gate, &id).await.is_empty(),
        "its steps went with them"
    );
    assert_eq!(compact(gate.pool(), &account).await, 0, "compacted once");

    // The slot refuses as before: a replaying caller is told the value is
    // gone, any other that the action is done, whatever its payload.
    let again = guard().run(counted(&runs, "r_2")).await;
    assert!(matches!(again, Err(Rejected::ValueNotKept)), "{again:?}");
    let plain = gate.guard(&id).run(counted(&runs, "r_3")).await;
    assert!(matches!(plain, Err(Rejected::AlreadyDone)), "{plain:?}");
    let other_payload = gate
        .guard(&id)
        .fingerprint(Fingerprint::new().part(9_i64))
        .run(counted(&runs, "r_4"))
        .await;
    assert!(
        matches!(other_payload, Err(Rejected::AlreadyDone)),
        "{other_payload:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the body ran once");

    // The check is the database's sha256 and the gate's alike: another
    // identity's check in this slot is a collision, refused.
    let other = Identity::new("receipt").part("ord_other");
    sqlx::query(
        "UPDATE idem_records SET identity = substring(sha256($3) FROM 1 FOR 8) \
         WHERE account = $1 AND kind = 'claim' AND address = $2",
    )
    .bind(&account)
    .bind(id.address())
    .bind(other.canonical())
    .execute(gate.pool())
    .await
    .expect("plant another identity's check");
    let collided = gate.guard(&id).run(counted(&runs, "r_5")).await;
    assert!(
        matches!(collided, Err(Rejected::Collision { .. })),
        "a compacted row of another identity is a collision: {collided:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_compacts_only_successes_past_their_value_window() {
    let gate = testing::gate().await;
    let account = gate.account_name().to_owned();
    let ok = || async { Ok::<_, Rejected>("v".to_owned()) };
    let forever = Identity::new("compact_only").part("forever");
    let inside = Identity::new("compact_only").part("inside");
    let failed = Identity::new("compact_only").part("failed");
    let pending = Identity::new("compact_only").part("pending");
    let past = Identity::new("compact_only").part("past");
    gate.guard(&forever)
        .replay()
        .run(ok())
        .await
        .expect("forever");
    gate.guard(&inside)
        .replay()
        .keep_value_for(Duration::from_secs(3600))
        .run(ok())
        .await
        .expect("inside");
    let kept = gate
        .guard(&failed)
        .keep_value_for(WINDOW)
        .disposition(|_: &Rejected| idem::Disposition::Keep)
        .run(async { Err::<String, _>(Rejected::InFlight) })
        .await;
    assert!(kept.is_err());
    let claim = gate
        .guard(&pending)
        .keep_value_for(WINDOW)
        .claim()
        .await
        .expect("pending");
    gate.guard(&past)
        .replay()
        .keep_value_for(WINDOW)
        .run(ok())
        .await
        .expect("past");
    past_the_window().await;

    assert_eq!(compact(gate.pool(), &account).await, 1, "only `past`");
    for id in [&forever, &inside, &failed, &pending] {
        assert_eq!(
            stored(&gate, id).await.0,
            id.canonical(),
            "{id:?} keeps its identity"
        );
    }
    let scope = ScopeFilter::new()
        .account(account.as_str())
        .namespace(NamespaceFilter::Any);
    let shown = operations::find(gate.pool(), &past.address(), &scope)
        .await
        .expect("find")
        .into_iter()
        .next()
        .expect("the compacted claim is still listed");
    assert!(operations::is_compacted(&shown.identity));
    let read_back = Identity::from_canonical(&shown.identity).expect_err("no identity");
    assert!(read_back.to_string().contains("compacted"), "{read_back}");
    claim.settle().await.expect("settled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compacted_claim_keeps_no_creation_time_and_is_still_listed_by_its_settle() {
    let gate = testing::gate().await;
    let account = gate.account_name().to_owned();
    let older = Identity::new("compact_listed").part("older");
    let newer = Identity::new("compact_listed").part("newer");
    let forever = Identity::new("compact_listed").part("forever");
    for id in [&older, &newer] {
        gate.guard(id)
            .keep_value_for(WINDOW)
            .run(async { Ok::<_, Rejected>(()) })
            .await
            .expect("settled");
    }
    past_the_window().await;
    assert_eq!(compact(gate.pool(), &account).await, 2);
    gate.guard(&forever)
        .run(async { Ok::<_, Rejected>(()) })
        .await
        .expect("settled");

    // The compacted rows hold no creation time (the 8 bytes that bring a
    // key under twice its floor), the others keep theirs.
    let created: Vec<(String, bool)> = sqlx::query_as(
        "SELECT address, created_at IS NULL FROM idem_records \
         WHERE account = $1 AND kind = 'claim' ORDER BY address",
    )
    .bind(&account)
    .fetch_all(gate.pool())
    .await
    .expect("rows");
    let mut expected = vec![
        (older.address(), true),
        (newer.address(), true),
        (forever.address(), false),
    ];
    expected.sort();
    assert_eq!(created, expected);

    // Listed newest first by their settle, each shown created when it
    // settled, and found by age as settled claims are.
    let scope = ScopeFilter::new()
        .account(account.as_str())
        .namespace(NamespaceFilter::Any);
    let listed = operations::list(gate.pool(), &operations::ListFilter::new().scope(scope))
        .await
        .expect("list");
    let order: Vec<String> = listed.iter().map(|row| row.address.clone()).collect();
    assert_eq!(order, [forever.address(), newer.address(), older.address()]);
    for row in &listed[1..] {
        assert_eq!(Some(row.created_micros), row.settled_micros, "{row:?}");
        assert!(row.age_seconds >= 0, "{row:?}");
    }
    let old = operations::ListFilter::new()
        .scope(scope)
        .older_than(WINDOW);
    let aged: Vec<String> = operations::list(gate.pool(), &old)
        .await
        .expect("list older")
        .into_iter()
        .map(|row| row.address)
        .collect();
    assert_eq!(aged, [newer.address(), older.address()]);
    assert_eq!(
        operations::count(gate.pool(), &old).await.expect("count"),
        2
    );
}
