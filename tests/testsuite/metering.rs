//! Usage metering by address: re-sent batches deduplicate instead of double
//! counting, against a real PostgreSQL.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem::meter::{Event, EventOutcome, Total};
use idem::testing;
use idem_test_support::schemas;

/// A fixed instant, so totals over time ranges are exact.
fn at(seconds: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_800_000_000 + seconds)
}

fn all_time() -> std::ops::Range<SystemTime> {
    UNIX_EPOCH..at(1_000_000)
}

/// The total of `events` events whose quantities sum to `quantity`.
fn total_of(quantity: i128, events: u64) -> Total {
    Total { quantity, events }
}

fn batch(ids: std::ops::Range<u32>, meter: &str) -> Vec<Event> {
    ids.map(|i| Event::new(format!("evt_{i}"), meter, i64::from(i), at(u64::from(i))))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identical_resent_batch_is_all_deduplicated_and_totals_do_not_move() {
    let meter = testing::gate().await.meter();
    let events = batch(1..11, "api_calls");
    let first = meter.record(&events).await.expect("record");
    assert_eq!(
        (first.inserted, first.deduplicated, first.conflicts),
        (10, 0, 0)
    );
    assert!(first.outcomes.iter().all(|o| *o == EventOutcome::Inserted));
    let total = meter.total("api_calls", all_time()).await.expect("total");
    assert_eq!(total, total_of(55, 10));

    for _ in 0..3 {
        let again = meter.record(&events).await.expect("re-send");
        assert_eq!(
            (again.inserted, again.deduplicated, again.conflicts),
            (0, 10, 0)
        );
        assert!(
            again
                .outcomes
                .iter()
                .all(|o| *o == EventOutcome::Deduplicated)
        );
    }
    assert_eq!(
        meter.total("api_calls", all_time()).await.expect("total"),
        total
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partly_overlapping_batch_counts_only_what_is_new() {
    let meter = testing::gate().await.meter();
    meter
        .record(&batch(1..11, "api_calls"))
        .await
        .expect("first");
    let report = meter
        .record(&batch(6..16, "api_calls"))
        .await
        .expect("overlap");
    assert_eq!((report.inserted, report.deduplicated), (5, 5));
    for (i, outcome) in (6..16).zip(&report.outcomes) {
        let expected = if i < 11 {
            EventOutcome::Deduplicated
        } else {
            EventOutcome::Inserted
        };
        assert_eq!(*outcome, expected, "evt_{i}");
    }
    let total = meter.total("api_calls", all_time()).await.expect("total");
    assert_eq!(total, total_of((1..16).sum(), 15));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_tasks_resending_one_batch_at_once_count_each_event_once() {
    let gate = testing::gate().await;
    let events = Arc::new(batch(1..201, "api_calls"));
    let barrier = Arc::new(tokio::sync::Barrier::new(8));
    let mut senders = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (meter, events, barrier) = (gate.meter(), events.clone(), barrier.clone());
        senders.spawn(async move {
            barrier.wait().await;
            meter.record(&events).await
        });
    }
    let mut inserted_per_event = vec![0; events.len()];
    while let Some(sent) = senders.join_next().await {
        let report = sent.expect("no panic").expect("every re-sender succeeds");
        assert_eq!(
            report.inserted + report.deduplicated,
            events.len(),
            "{report:?}"
        );
        assert_eq!(report.conflicts, 0);
        for (count, outcome) in inserted_per_event.iter_mut().zip(&report.outcomes) {
            *count += usize::from(*outcome == EventOutcome::Inserted);
        }
    }
    assert!(
        inserted_per_event.iter().all(|&n| n == 1),
        "each event must be inserted by exactly one sender: {inserted_per_event:?}"
    );
    let total = gate
        .meter()
        .total("api_calls", all_time())
        .await
        .expect("total");
    assert_eq!(total, total_of((1..201).sum(), 200));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_events_in_one_call() {
    let meter = testing::gate().await.meter();
    let events = batch(0..10_000, "bulk");
    let report = meter.record(&events).await.expect("one call");
    assert_eq!(report.inserted, 10_000);
    assert_eq!(report.outcomes.len(), 10_000);
    let again = meter.record(&events).await.expect("re-send");
    assert_eq!(again.deduplicated, 10_000);
    let total = meter.total("bulk", all_time()).await.expect("total");
    assert_eq!(total, total_of((0..10_000).sum(), 10_000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_identifier_with_other_content_is_a_conflict_never_a_second_count() {
    let meter = testing::gate().await.meter();
    meter
        .record(&[Event::new("evt_1", "api_calls", 5, at(1))])
        .await
        .expect("first");
    let changed = [
        Event::new("evt_1", "api_calls", 7, at(1)), // another quantity
        Event::new("evt_1", "storage", 5, at(1)),   // another meter
        Event::new("evt_1", "api_calls", 5, at(2)), // another time
    ];
    for event in &changed {
        let report = meter
            .record(std::slice::from_ref(event))
            .await
            .expect("conflict");
        assert_eq!(report.conflicts, 1, "{report:?}");
        let EventOutcome::Conflict { stored } = &report.outcomes[0] else {
            panic!("expected a conflict: {report:?}");
        };
        assert_eq!(
            (stored.meter.as_str(), stored.quantity, stored.occurred_at),
            ("api_calls", 5, at(1))
        );
    }
    let totals = meter.totals(all_time()).await.expect("totals");
    assert_eq!(totals.len(), 1, "{totals:?}");
    assert_eq!(totals["api_calls"], total_of(5, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeats_within_one_batch_are_judged_against_the_first() {
    let meter = testing::gate().await.meter();
    let report = meter
        .record(&[
            Event::new("evt_1", "m", 1, at(1)),
            Event::new("evt_1", "m", 1, at(1)),
            Event::new("evt_1", "m", 2, at(1)),
        ])
        .await
        .expect("record");
    assert_eq!(report.outcomes[0], EventOutcome::Inserted);
    assert_eq!(report.outcomes[1], EventOutcome::Deduplicated);
    assert!(
        matches!(report.outcomes[2], EventOutcome::Conflict { .. }),
        "{report:?}"
    );
    assert_eq!(
        meter.total("m", all_time()).await.expect("total").quantity,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identifiers_of_any_content() {
    let meter = testing::gate().await.meter();
    let long = "x".repeat(1 << 20);
    let events = vec![
        Event::new("\0", "m", 1, at(1)),
        Event::new("a\0b", "m", 1, at(1)),
        Event::new("'); DELETE FROM idem_records; --", "m", 1, at(1)),
        Event::new("🦀\u{202e}\r\n", "m", 1, at(1)),
        Event::new("", "m", 1, at(1)),
        Event::new(long.as_str(), "m", 1, at(1)),
        Event::new(&[0u8, 0xff, 0][..], "m", 1, at(1)),
        Event::new(42_u64, "m", 1, at(1)),
        Event::new("42", "m", 1, at(1)), // text, not the integer 42
        Event::new(uuid::Uuid::from_u128(7).as_bytes(), "m", 1, at(1)),
    ];
    let report = meter.record(&events).await.expect("record");
    assert_eq!(report.inserted, events.len(), "{:?}", report.outcomes);
    let again = meter.record(&events).await.expect("re-send");
    assert_eq!(again.deduplicated, events.len());
    assert_eq!(
        meter.total("m", all_time()).await.expect("total").events,
        events.len() as u64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accounts_and_namespaces_do_not_see_each_other() {
    let gate = testing::gate().await;
    let acme = gate.account(testing::unique_name("acme")).meter();
    let globex = gate.account(testing::unique_name("globex")).meter();
    let events = batch(1..4, "api_calls");
    assert_eq!(acme.record(&events).await.expect("acme").inserted, 3);
    assert_eq!(
        globex.record(&events).await.expect("globex").inserted,
        3,
        "same ids, another account"
    );
    let live = gate.namespace("live").meter();
    assert_eq!(
        live.record(&events).await.expect("live").inserted,
        3,
        "same ids, another namespace"
    );

    let other = gate.account(testing::unique_name("initech")).meter();
    assert!(other.totals(all_time()).await.expect("totals").is_empty());
    assert_eq!(
        acme.total("api_calls", all_time())
            .await
            .expect("acme")
            .events,
        3
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn totals_follow_meter_and_time_range() {
    let meter = testing::gate().await.meter();
    meter.record(&batch(1..11, "api_calls")).await.expect("api");
    meter
        .record(&batch(100..103, "storage"))
        .await
        .expect("storage");
    // [at(3), at(6)) holds events 3, 4 and 5.
    let window = meter
        .total("api_calls", at(3)..at(6))
        .await
        .expect("window");
    assert_eq!(window, total_of(12, 3));
    let totals = meter.totals(at(0)..at(1_000)).await.expect("totals");
    assert_eq!(totals["storage"], total_of(303, 3));
    assert_eq!(totals["api_calls"].events, 10);
    assert_eq!(
        meter.total("nothing", all_time()).await.expect("empty"),
        Total::default()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_that_cannot_be_stored_say_why_and_the_rest_is_stored() {
    let meter = testing::gate().await.meter();
    let report = meter
        .record(&[
            Event::new("ok", "m", 1, at(1)),
            Event::new("bad_meter", "a\0b", 1, at(1)),
            Event::new(None::<&str>, "m", 1, at(1)),
            Event::new("empty_meter", "", 1, at(1)),
        ])
        .await
        .expect("record");
    assert_eq!((report.inserted, report.rejected), (1, 3), "{report:?}");
    for outcome in &report.outcomes[1..] {
        assert!(
            matches!(outcome, EventOutcome::Invalid { reason } if !reason.is_empty()),
            "{outcome:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_failure_stores_nothing_and_says_so() {
    let gate = testing::gate().await;
    gate.pool().close().await;
    let error = gate
        .meter()
        .record(&batch(1..3, "m"))
        .await
        .expect_err("the pool is closed");
    assert!(error.to_string().contains("PostgreSQL"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_1_schema_is_migrated_for_metering() {
    let (_, pool) = schemas::fresh_schema(2).await;
    idem::sqlx::raw_sql(idem::__internal::MIGRATIONS[0].sql)
        .execute(&pool)
        .await
        .expect("apply version 1 only");
    let gate = idem::Gate::connect(pool.clone())
        .await
        .expect("connect migrates");
    let version: i32 = idem::sqlx::query_scalar("SELECT max(version) FROM idem_schema_version")
        .fetch_one(&pool)
        .await
        .expect("version");
    assert_eq!(version, idem::schema::SCHEMA_VERSION);
    assert_eq!(
        gate.meter()
            .record(&batch(1..3, "m"))
            .await
            .expect("record")
            .inserted,
        2
    );
}
