//! Ordered events in a batch (`Batch::push_ordered`): a consumer's batch
//! of events for many entities keeps every promise of `Guard::ordered`,
//! runs an entity's events oldest first, frees an entity its released
//! event held, and overlapping batches fired at the same instant never run
//! an event twice nor move an entity back.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::batch::Batch;
use idem::{Gate, Rejected, testing};
use tokio::sync::Barrier;

use super::{Failure, classify, entity, event};

/// One event of a batch: its key, its entity's name, its order, and how
/// its body ends (`None`: it succeeds).
type Delivery = (&'static str, &'static str, i64, Option<fn() -> Failure>);

/// What the bodies did: each that ran (key, entity, order), in the order
/// they started; and the entities whose event runs now.
#[derive(Default)]
struct Log {
    ran: Mutex<Vec<(String, String, i64)>>,
    running: Mutex<BTreeSet<String>>,
}

/// Guards `deliveries` as one batch, `concurrency` bodies at a time, each
/// body logged in `log` when it runs (failing the test should another
/// event of its entity run at the same time); per item, its reason ("ran"
/// when its body ran).
async fn deliver_batch(
    gate: &Gate,
    deliveries: &[Delivery],
    concurrency: usize,
    log: &Log,
) -> Vec<&'static str> {
    let mut batch = Batch::new();
    for &delivery in deliveries {
        let (key, of, order, _) = delivery;
        batch.push_ordered(delivery, event(key), &entity(of), order);
    }
    let results: Vec<Result<(), Failure>> = gate
        .guard_batch(batch)
        .disposition(classify)
        .concurrency(concurrency)
        .run(|(key, of, order, ends)| async move {
            assert!(
                log.running.lock().unwrap().insert(of.to_owned()),
                "{key} ran while another event of {of} ran"
            );
            log.ran
                .lock()
                .unwrap()
                .push((key.to_owned(), of.to_owned(), order));
            tokio::time::sleep(Duration::from_millis(1)).await;
            log.running.lock().unwrap().remove(of);
            match ends {
                None => Ok(()),
                Some(failure) => Err(failure()),
            }
        })
        .await;
    results
        .into_iter()
        .map(|result| match result {
            Err(Failure::Rejected(rejected)) => rejected.reason(),
            Ok(()) | Err(_) => "ran",
        })
        .collect()
}

/// The keys that ran, per entity, in the order they ran.
fn ran_per_entity(log: &Log) -> BTreeMap<String, Vec<String>> {
    let mut ran: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (key, of, _) in log.ran.lock().unwrap().iter() {
        ran.entry(of.clone()).or_default().push(key.clone());
    }
    ran
}

/// "The batch runs an entity's events one at a time, oldest first
/// whatever their place in the batch; each answer is returned in the
/// item's place"; an event older than one applied before the batch is
/// superseded; a copy of an event is a duplicate.
#[tokio::test]
async fn a_batch_runs_each_entity_s_events_oldest_first_and_answers_in_place() {
    let gate = testing::gate().await;
    let log = Log::default();
    // sub_b is at 5 before the batch.
    let before = deliver_batch(&gate, &[("b5", "sub_b", 5, None)], 1, &log).await;
    assert_eq!(before, ["ran"]);
    log.ran.lock().unwrap().clear();

    let answers = deliver_batch(
        &gate,
        &[
            ("a3", "sub_a", 3, None),
            ("b2", "sub_b", 2, None),
            ("a1", "sub_a", 1, None),
            ("b7", "sub_b", 7, None),
            ("a2", "sub_a", 2, None),
            ("a1", "sub_a", 1, None),
            ("a2b", "sub_a", 2, None),
            ("c1", "sub_c", 1, None),
        ],
        4,
        &log,
    )
    .await;
    assert_eq!(
        answers,
        [
            "ran",
            "superseded",
            "ran",
            "ran",
            "ran",
            "already_done",
            "ran",
            "ran"
        ]
    );
    let ran = ran_per_entity(&log);
    assert_eq!(
        ran["sub_a"],
        ["a1", "a2", "a2b", "a3"],
        "oldest first, equal orders in place"
    );
    assert_eq!(ran["sub_b"], ["b7"]);
    assert_eq!(ran["sub_c"], ["c1"]);

    // After the batch, each entity is at its newest event.
    let after = deliver_batch(
        &gate,
        &[
            ("a2c", "sub_a", 2, None),
            ("b6", "sub_b", 6, None),
            ("c1b", "sub_c", 1, None),
        ],
        1,
        &log,
    )
    .await;
    assert_eq!(after, ["superseded", "superseded", "ran"]);
}

/// "A release frees the event's entity in the same statement": a failure
/// released by the batch's one statement leaves its entity free, for the
/// entity's next event in the same batch and for a later call, and applies
/// nothing (an older event still runs); a kept failure applies nothing
/// either; one in doubt holds the entity.
#[tokio::test]
async fn a_failure_released_by_the_batch_frees_its_entity_and_applies_nothing() {
    let gate = testing::gate().await;
    let log = Log::default();
    let answers = deliver_batch(
        &gate,
        &[
            ("a5", "sub_a", 5, Some(|| Failure::Released)),
            ("a6", "sub_a", 6, Some(|| Failure::Released)),
            ("b5", "sub_b", 5, Some(|| Failure::Kept)),
            ("c5", "sub_c", 5, Some(|| Failure::Doubtful)),
            ("c6", "sub_c", 6, None),
        ],
        2,
        &log,
    )
    .await;
    // c6 comes after c5 (oldest first), which holds sub_c in doubt.
    assert_eq!(answers, ["ran", "ran", "ran", "ran", "in_flight"]);
    assert_eq!(ran_per_entity(&log)["sub_a"], ["a5", "a6"]);

    // Released and kept failures applied nothing and left their entities
    // free: older events run, by a batch and by one call.
    let later = deliver_batch(
        &gate,
        &[
            ("a1", "sub_a", 1, None),
            ("b1", "sub_b", 1, None),
            ("c7", "sub_c", 7, None),
        ],
        1,
        &log,
    )
    .await;
    assert_eq!(later, ["ran", "ran", "in_flight"], "sub_c is held in doubt");
    let one: Result<(), Rejected> = gate
        .guard(&event("a0"))
        .ordered(&entity("sub_a"), 0)
        .run(async { Ok(()) })
        .await;
    assert!(
        matches!(one, Err(Rejected::Superseded)),
        "a1 was applied: {one:?}"
    );
    let one: Result<(), Rejected> = gate
        .guard(&event("a2"))
        .ordered(&entity("sub_a"), 2)
        .run(async { Ok(()) })
        .await;
    assert!(
        one.is_ok(),
        "the released a5 and a6 applied nothing: {one:?}"
    );
}

/// The refusals of `Guard::ordered` hold item by item: an order beyond an
/// `i64`, an absent identity or entity, a batch keeping its slots for a
/// window, each refuse the item before it runs, and the other items run.
#[tokio::test]
async fn options_an_ordered_event_cannot_use_refuse_the_item_not_the_batch() {
    let gate = testing::gate().await;
    let ran = Mutex::new(Vec::new());
    let mut batch = Batch::new();
    batch.push_ordered("too far", event("e1"), &entity("sub_a"), u64::MAX);
    batch.push_ordered(
        "no key",
        event("e2").part(None::<&str>),
        &entity("sub_a"),
        1,
    );
    batch.push_ordered(
        "no entity",
        event("e3"),
        &entity("sub_a").part(None::<&str>),
        1,
    );
    batch.push_ordered("fine", event("e4"), &entity("sub_a"), 2);
    batch.push("plain", event("e5"));
    let results: Vec<Result<(), Rejected>> = gate
        .guard_batch(batch)
        .run(|name| {
            ran.lock().unwrap().push(name);
            async { Ok(()) }
        })
        .await;
    let reasons: Vec<&str> = results
        .iter()
        .map(|result| result.as_ref().map_or_else(Rejected::reason, |()| "ran"))
        .collect();
    assert_eq!(
        reasons,
        [
            "invalid_option",
            "invalid_option",
            "invalid_option",
            "ran",
            "ran"
        ]
    );
    // (`fine` runs in a later pass than `plain`: the refused event of its
    // entity, of an order that does not fit, was taken first.)
    let ran: BTreeSet<&str> = ran.lock().unwrap().iter().copied().collect();
    assert_eq!(ran, BTreeSet::from(["fine", "plain"]));

    let mut batch = Batch::new();
    batch.push_ordered((), event("e6"), &entity("sub_b"), 1);
    batch.push((), event("e7"));
    let results: Vec<Result<(), Rejected>> = gate
        .guard_batch(batch)
        .keep_slot_for(Duration::from_secs(60))
        .run(|()| async { Ok(()) })
        .await;
    assert!(
        matches!(results[0], Err(Rejected::InvalidOption { .. })),
        "{results:?}"
    );
    assert!(results[1].is_ok(), "{results:?}");
}

/// Overlapping batches of the same events, fired at the same instant and
/// redelivered as a consumer would until none is in flight: no event runs
/// twice, no two events of an entity run at once, an entity's events run
/// in order, its newest runs, and every event that did not run is older
/// than one that ran.
#[tokio::test]
async fn overlapping_batches_at_the_same_instant_never_run_an_event_twice_nor_move_back() {
    const ROUNDS: usize = 8;
    const CONSUMERS: usize = 3;
    for round in 0..ROUNDS {
        let gate = testing::gate().await;
        let log = Arc::new(Log::default());
        // Per consumer, the same 12 events of 3 entities, in its own order.
        let mut events: Vec<Delivery> = Vec::new();
        for of in ["sub_a", "sub_b", "sub_c"] {
            for (n, order) in [3, 1, 4, 2].into_iter().enumerate() {
                let key: &'static str = Box::leak(format!("{of}_{n}_{order}").into_boxed_str());
                events.push((key, of, order, None));
            }
        }
        let barrier = Arc::new(Barrier::new(CONSUMERS));
        let mut consumers = Vec::new();
        for consumer in 0..CONSUMERS {
            let (gate, log, barrier) = (gate.clone(), log.clone(), barrier.clone());
            let mut mine = events.clone();
            let turn = (round * 5 + consumer * 7) % mine.len();
            mine.rotate_left(turn);
            if consumer % 2 == 1 {
                mine.reverse();
            }
            consumers.push(tokio::spawn(async move {
                barrier.wait().await;
                let mut pending = mine;
                for _ in 0..200 {
                    let answers = deliver_batch(&gate, &pending, 3, &log).await;
                    pending = pending
                        .into_iter()
                        .zip(answers)
                        .filter(|(_, answer)| *answer == "in_flight")
                        .map(|(delivery, _)| delivery)
                        .collect();
                    if pending.is_empty() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                panic!("still in flight after 200 redeliveries: {pending:?}");
            }));
        }
        for consumer in consumers {
            consumer.await.unwrap();
        }
        let log = log.ran.lock().unwrap();
        let mut seen = BTreeSet::new();
        for (key, _, _) in log.iter() {
            assert!(seen.insert(key.clone()), "round {round}: {key} ran twice");
        }
        for of in ["sub_a", "sub_b", "sub_c"] {
            let orders: Vec<i64> = log
                .iter()
                .filter(|(_, entity, _)| entity == of)
                .map(|(_, _, order)| *order)
                .collect();
            assert!(
                orders.windows(2).all(|pair| pair[0] <= pair[1]),
                "round {round}: {of} moved back: {orders:?}"
            );
            assert_eq!(orders.last(), Some(&4), "round {round}: {of}'s newest ran");
        }
    }
}
