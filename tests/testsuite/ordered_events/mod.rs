//! Ordered events (`Guard::ordered`): each event runs at most once by its
//! own key; an event older than the newest applied for its entity is
//! refused `Superseded` without running, one of equal order runs; events of
//! one entity never run at once. What "applied" means under each outcome
//! (success, released or kept failure, in doubt, resolved, released by an
//! operator, a transaction rolled back) is pinned here, then every
//! permutation of a handful of events is delivered, twice each, one after
//! another and all at the same instant, against a real PostgreSQL.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::operations::{self, Slot};
use idem::{Disposition, EventOrder, Gate, Identity, Outcome, Rejected, testing};
use tokio::sync::{Barrier, Notify};

// Each promise of the docs attacked at its edges (races, faults, leases,
// operators, transactions, hostile orders), from the docs alone.
mod at_the_edges;
// A consumer's batch of events for many entities (`Batch::push_ordered`).
mod in_a_batch;
// Red team: ordered events in a batch attacked at their edges.
mod batch_at_the_edges;

/// A body's error: a refusal of its own gate, or a failure disposed of as
/// its variant says.
#[derive(Debug)]
enum Failure {
    Rejected(Rejected),
    Released,
    Kept,
    Doubtful,
}

impl From<Rejected> for Failure {
    fn from(rejected: Rejected) -> Self {
        Failure::Rejected(rejected)
    }
}

fn classify(failure: &Failure) -> Disposition {
    match failure {
        Failure::Kept => Disposition::Keep,
        Failure::Doubtful => Disposition::InDoubt,
        Failure::Rejected(_) | Failure::Released => Disposition::Release,
    }
}

fn event(key: &str) -> Identity {
    Identity::new("subscription_event").part(key)
}

fn entity(name: &str) -> Identity {
    Identity::new("subscription").part(name)
}

/// What a delivery came to: it ran, or its refusal.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Delivered {
    Ran,
    Refused(&'static str),
}

/// Delivers event `key` of `of` at `order`, whose body ends as `ends`
/// (`None`: succeeds) and is logged in `log` when it runs.
async fn deliver(
    gate: &Gate,
    of: &Identity,
    key: &str,
    order: i64,
    ends: Option<fn() -> Failure>,
    log: &Mutex<Vec<(String, i64)>>,
) -> Delivered {
    let id = event(key);
    let result: Result<(), Failure> = gate
        .guard(&id)
        .ordered(of, order)
        .disposition(classify)
        .run(async {
            log.lock().unwrap().push((key.to_owned(), order));
            match ends {
                None => Ok(()),
                Some(failure) => Err(failure()),
            }
        })
        .await;
    match result {
        Ok(()) => Delivered::Ran,
        Err(Failure::Rejected(rejected)) => Delivered::Refused(rejected.reason()),
        Err(_) => Delivered::Ran,
    }
}

fn ran(log: &Mutex<Vec<(String, i64)>>) -> Vec<String> {
    log.lock()
        .unwrap()
        .iter()
        .map(|(key, _)| key.clone())
        .collect()
}

const RAN: Delivered = Delivered::Ran;
const SUPERSEDED: Delivered = Delivered::Refused("superseded");
const IN_FLIGHT: Delivered = Delivered::Refused("in_flight");
const ALREADY_DONE: Delivered = Delivered::Refused("already_done");

/// "an event whose order is older than the newest one applied for its
/// entity is refused `Rejected::Superseded` without running; an event of
/// equal order runs"; a duplicate is told what its own slot says.
#[tokio::test]
async fn an_older_event_is_superseded_an_equal_one_runs_and_a_duplicate_is_a_duplicate() {
    let gate = testing::gate().await;
    let log = Mutex::new(Vec::new());
    let sub = entity("sub_1");
    let steps: [(&str, i64, Delivered); 8] = [
        ("e5", 5, RAN),
        ("e3", 3, SUPERSEDED),
        ("e5b", 5, RAN),
        ("e5", 5, ALREADY_DONE),
        ("e7", 7, RAN),
        ("e6", 6, SUPERSEDED),
        ("e3", 3, SUPERSEDED),
        ("e7", 7, ALREADY_DONE),
    ];
    for (key, order, expected) in steps {
        let delivered = deliver(&gate, &sub, key, order, None, &log).await;
        assert_eq!(delivered, expected, "{key} at {order}");
    }
    assert_eq!(ran(&log), ["e5", "e5b", "e7"]);
    // Another entity is not held back by this one's order.
    let other = deliver(&gate, &entity("sub_2"), "f1", 1, None, &log).await;
    assert_eq!(other, RAN);
}

/// "A failure that is released (the default) or kept applied nothing:
/// the entity stays where it was, and an older event may still run."
#[tokio::test]
async fn a_released_or_kept_failure_applies_nothing_and_frees_the_entity() {
    let gate = testing::gate().await;
    let log = Mutex::new(Vec::new());
    let sub = entity("sub_1");
    assert_eq!(
        deliver(&gate, &sub, "e7", 7, Some(|| Failure::Released), &log).await,
        RAN
    );
    assert_eq!(deliver(&gate, &sub, "e4", 4, None, &log).await, RAN);
    assert_eq!(
        deliver(&gate, &sub, "e6", 6, Some(|| Failure::Kept), &log).await,
        RAN
    );
    assert_eq!(deliver(&gate, &sub, "e5", 5, None, &log).await, RAN);
    // The kept failure refuses its duplicates; the released one runs
    // again, and is newer than anything applied.
    assert_eq!(
        deliver(&gate, &sub, "e6", 6, None, &log).await,
        Delivered::Refused("already_failed")
    );
    assert_eq!(deliver(&gate, &sub, "e7", 7, None, &log).await, RAN);
    assert_eq!(deliver(&gate, &sub, "e6b", 6, None, &log).await, SUPERSEDED);
    assert_eq!(ran(&log), ["e7", "e4", "e6", "e5", "e7"]);
}

/// "An outcome in doubt holds the entity until it is resolved, since it
/// may have applied": older and newer events are refused in flight; once
/// resolved as succeeded, it is applied; once released, it is not.
#[tokio::test]
async fn an_outcome_in_doubt_holds_the_entity_until_it_is_resolved() {
    let gate = testing::gate().await;
    let log = Mutex::new(Vec::new());
    for (resolution, older_then) in [
        (Outcome::Succeeded(None), SUPERSEDED),
        (Outcome::Failed(Disposition::Release), RAN),
        (Outcome::Failed(Disposition::Keep), RAN),
    ] {
        let sub = entity(&format!("sub_{resolution:?}"));
        let doubtful = format!("e7_{resolution:?}");
        let (older, newer) = (format!("e3_{resolution:?}"), format!("e9_{resolution:?}"));
        assert_eq!(
            deliver(&gate, &sub, &doubtful, 7, Some(|| Failure::Doubtful), &log).await,
            RAN
        );
        assert_eq!(deliver(&gate, &sub, &older, 3, None, &log).await, IN_FLIGHT);
        assert_eq!(deliver(&gate, &sub, &newer, 9, None, &log).await, IN_FLIGHT);
        let address = event(&doubtful).address();
        let slot = Slot::new(gate.account_name(), gate.namespace_name(), &address);
        let resolved = operations::resolve(gate.pool(), slot, resolution)
            .await
            .expect("resolve");
        assert!(
            matches!(resolved, operations::Resolved::Changed { .. }),
            "{resolved:?}"
        );
        assert_eq!(
            deliver(&gate, &sub, &older, 3, None, &log).await,
            older_then,
            "after {resolution:?}"
        );
        assert_eq!(deliver(&gate, &sub, &newer, 9, None, &log).await, RAN);
    }
}

/// "Events of one entity never run at once": while one runs, another is
/// refused in flight, or with `wait` waits for it and then runs (newer) or
/// is superseded (older).
#[tokio::test]
async fn events_of_one_entity_never_run_at_once() {
    let gate = testing::gate().await;
    let sub = entity("sub_1");
    let release = Arc::new(Notify::new());
    let started = Arc::new(Notify::new());
    let running = Arc::new(Mutex::new(Vec::<&str>::new()));
    let first = {
        let (gate, sub, release, started, running) = (
            gate.clone(),
            sub.clone(),
            release.clone(),
            started.clone(),
            running.clone(),
        );
        tokio::spawn(async move {
            let id = event("e5");
            gate.guard(&id)
                .ordered(&sub, 5)
                .run(async {
                    running.lock().unwrap().push("e5 began");
                    started.notify_one();
                    release.notified().await;
                    running.lock().unwrap().push("e5 ended");
                    Ok::<(), Rejected>(())
                })
                .await
        })
    };
    started.notified().await;
    let log = Mutex::new(Vec::new());
    assert_eq!(deliver(&gate, &sub, "e8", 8, None, &log).await, IN_FLIGHT);
    assert_eq!(deliver(&gate, &sub, "e2", 2, None, &log).await, IN_FLIGHT);
    let waiting = |key: &'static str, order: i64| {
        let (gate, sub, running) = (gate.clone(), sub.clone(), running.clone());
        tokio::spawn(async move {
            let id = event(key);
            gate.guard(&id)
                .ordered(&sub, order)
                .wait(Duration::from_secs(30))
                .run(async {
                    running.lock().unwrap().push(key);
                    Ok::<(), Rejected>(())
                })
                .await
        })
    };
    let newer = waiting("e8", 8);
    let older = waiting("e2", 2);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        *running.lock().unwrap(),
        ["e5 began"],
        "nobody ran beside e5"
    );
    release.notify_one();
    first.await.expect("e5").expect("e5 ran");
    newer.await.expect("e8").expect("e8 ran after e5");
    let older = older.await.expect("e2");
    let running = running.lock().unwrap().clone();
    assert_eq!(running[..2], ["e5 began", "e5 ended"]);
    // e2 came after e5's success: superseded, whether before or after e8.
    assert!(matches!(older, Err(Rejected::Superseded)), "{older:?}");
    assert_eq!(running, ["e5 began", "e5 ended", "e8"]);
    assert!(log.lock().unwrap().is_empty());
}

/// "A claim inside your transaction that rolls back takes the entity's
/// change back with it", and "a release (an operator's) frees the hold".
#[tokio::test]
async fn a_rolled_back_transaction_and_an_operator_s_release_hand_the_entity_back() {
    let gate = testing::gate().await;
    let log = Mutex::new(Vec::new());
    let sub = entity("sub_1");
    let id = event("e9");
    let mut tx = gate.pool().begin().await.expect("begin");
    let claim = gate
        .guard(&id)
        .ordered(&sub, 9)
        .tx(&mut tx)
        .claim()
        .await
        .expect("claimed in the transaction");
    drop(claim);
    tx.rollback().await.expect("rollback");
    assert_eq!(deliver(&gate, &sub, "e4", 4, None, &log).await, RAN);

    // A pending claim an operator releases frees its entity.
    let held = gate
        .guard(&id)
        .ordered(&sub, 9)
        .claim()
        .await
        .expect("claimed");
    assert_eq!(deliver(&gate, &sub, "e5", 5, None, &log).await, IN_FLIGHT);
    let address = id.address();
    let slot = Slot::new(gate.account_name(), gate.namespace_name(), &address);
    let released = operations::release_pending(gate.pool(), slot)
        .await
        .expect("release");
    assert!(released.is_some());
    assert_eq!(deliver(&gate, &sub, "e5", 5, None, &log).await, RAN);
    drop(held);
    assert_eq!(ran(&log), ["e4", "e5"]);
}

/// Refused `InvalidOption` before any statement: an order beyond an i64,
/// an absent entity, a slot window.
#[tokio::test]
async fn options_an_ordered_event_cannot_use_are_refused_before_it_runs() {
    let gate = testing::gate().await;
    let id = event("e1");
    let sub = entity("sub_1");
    let refusal = |result: Result<(), Rejected>| match result {
        Err(Rejected::InvalidOption { option, .. }) => option,
        other => panic!("expected InvalidOption, got {other:?}"),
    };
    let body = || async { panic!("the body must not run") };
    let beyond = gate.guard(&id).ordered(&sub, u64::MAX).run(body()).await;
    assert_eq!(refusal(beyond), "order");
    let absent = Identity::new("subscription").part(None::<&str>);
    let absent = gate.guard(&id).ordered(&absent, 1).run(body()).await;
    assert_eq!(refusal(absent), "entity");
    let windowed = gate
        .guard(&id)
        .ordered(&sub, 1)
        .keep_slot_for(Duration::from_secs(60))
        .run(body())
        .await;
    assert_eq!(refusal(windowed), "keep_slot_for");
    // Nothing was written: the event runs once asked properly.
    let ran: Result<(), Rejected> = gate
        .guard(&id)
        .ordered(&sub, EventOrder::from(1))
        .run(async { Ok(()) })
        .await;
    assert!(ran.is_ok(), "{ran:?}");
}

/// An entity's address held by another entity's identity (a digest
/// collision, forged behind the gate's back) is refused, never shared.
#[tokio::test]
async fn an_entity_address_held_by_another_identity_is_a_collision() {
    let gate = testing::gate().await;
    let sub = entity("sub_1");
    sqlx_insert_entity(&gate, &sub.address(), b"another entity").await;
    let id = event("e1");
    let result: Result<(), Rejected> = gate
        .guard(&id)
        .ordered(&sub, 1)
        .run(async { panic!("the body must not run") })
        .await;
    assert!(
        matches!(&result, Err(Rejected::Collision { address }) if *address == sub.address()),
        "{result:?}"
    );
}

async fn sqlx_insert_entity(gate: &Gate, address: &str, identity: &[u8]) {
    idem::sqlx::query(
        "INSERT INTO idem_records (account, kind, address, namespace, state, identity) \
         VALUES ($1, 'entity', $2, $3, 'entity', $4)",
    )
    .bind(gate.account_name())
    .bind(address)
    .bind(gate.namespace_name())
    .bind(identity)
    .execute(gate.pool())
    .await
    .expect("forge the entity");
}

/// The events of the permutations: two of equal order among them.
const EVENTS: [(&str, i64); 5] = [("a", 1), ("b", 2), ("c", 2), ("d", 3), ("e", 4)];

fn permutations(items: &[(&'static str, i64)]) -> Vec<Vec<(&'static str, i64)>> {
    if items.len() <= 1 {
        return vec![items.to_vec()];
    }
    let mut all = Vec::new();
    for (index, item) in items.iter().enumerate() {
        let mut rest = items.to_vec();
        rest.remove(index);
        for mut tail in permutations(&rest) {
            tail.insert(0, *item);
            all.push(tail);
        }
    }
    all
}

/// Every permutation of five events (two of equal order), each delivered
/// twice in a row, one entity per permutation, in and out of a namespace:
/// exactly the events not older than one applied before them run, each
/// once, and the entity ends at its newest event.
#[tokio::test]
async fn every_permutation_delivered_in_turn_runs_exactly_the_events_not_older_than_one_applied() {
    let plain = testing::gate().await;
    let namespaced = plain.namespace("ordered");
    for (index, permutation) in permutations(&EVENTS).into_iter().enumerate() {
        let gate = if index % 2 == 0 { &plain } else { &namespaced };
        let sub = entity(&format!("turn_{index}"));
        let log = Mutex::new(Vec::new());
        let mut expected = Vec::new();
        let mut newest = i64::MIN;
        for (name, order) in &permutation {
            let key = format!("{name}_{index}");
            let first = deliver(gate, &sub, &key, *order, None, &log).await;
            let again = deliver(gate, &sub, &key, *order, None, &log).await;
            if *order >= newest {
                newest = *order;
                expected.push(key.clone());
                assert_eq!(first, RAN, "{permutation:?}: {key}");
                assert_eq!(again, ALREADY_DONE, "{permutation:?}: {key} again");
            } else {
                assert_eq!(first, SUPERSEDED, "{permutation:?}: {key}");
                assert_eq!(again, SUPERSEDED, "{permutation:?}: {key} again");
            }
        }
        assert_eq!(ran(&log), expected, "{permutation:?}");
        assert_eq!(newest, 4);
    }
}

/// Every permutation of the same events, each delivered twice, all at the
/// same instant (a barrier), redelivered while refused in flight: no event
/// runs twice, no two run at once, the orders applied never go down, the
/// newest event always runs, and an event refused superseded is older than
/// one applied before it.
#[tokio::test]
async fn every_permutation_delivered_at_once_never_runs_an_event_twice_nor_moves_back() {
    let gate = testing::gate_on(testing::pool_with(12).await).await;
    let permutations = permutations(&EVENTS);
    for (index, permutation) in permutations.iter().enumerate() {
        let sub = entity(&format!("at_once_{index}"));
        let deliveries: Vec<(String, i64)> = permutation
            .iter()
            .chain(permutation.iter())
            .map(|(name, order)| (format!("{name}_{index}"), *order))
            .collect();
        let barrier = Arc::new(Barrier::new(deliveries.len()));
        let inside = Arc::new(Mutex::new(0_usize));
        let applied = Arc::new(Mutex::new(Vec::<(String, i64)>::new()));
        let mut tasks = Vec::new();
        for (key, order) in deliveries {
            let (gate, sub, barrier, inside, applied) = (
                gate.clone(),
                sub.clone(),
                barrier.clone(),
                inside.clone(),
                applied.clone(),
            );
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                let id = event(&key);
                loop {
                    let result = gate
                        .guard(&id)
                        .ordered(&sub, order)
                        .run(async {
                            {
                                let mut inside = inside.lock().unwrap();
                                assert_eq!(*inside, 0, "{key} ran beside another event");
                                *inside += 1;
                            }
                            applied.lock().unwrap().push((key.clone(), order));
                            tokio::task::yield_now().await;
                            *inside.lock().unwrap() -= 1;
                            Ok::<(), Rejected>(())
                        })
                        .await;
                    match result {
                        Err(Rejected::InFlight) => {
                            tokio::time::sleep(Duration::from_millis(2)).await;
                        }
                        Ok(()) => return (key, order, "ran", applied.lock().unwrap().len()),
                        Err(rejected) => {
                            let seen = applied.lock().unwrap().len();
                            return (key, order, rejected.reason(), seen);
                        }
                    }
                }
            }));
        }
        let mut outcomes = Vec::new();
        for task in tasks {
            outcomes.push(task.await.expect("a delivery panicked"));
        }
        let applied = applied.lock().unwrap().clone();
        let mut runs: BTreeMap<&str, usize> = BTreeMap::new();
        for (key, _) in &applied {
            *runs.entry(key).or_default() += 1;
        }
        assert!(
            runs.values().all(|&count| count == 1),
            "{permutation:?}: an event ran twice: {applied:?}"
        );
        assert!(
            applied.windows(2).all(|pair| pair[0].1 <= pair[1].1),
            "{permutation:?}: the entity moved back: {applied:?}"
        );
        assert!(
            applied.iter().any(|(_, order)| *order == 4),
            "{permutation:?}: the newest event did not run: {applied:?}"
        );
        let ran_keys: BTreeSet<&str> = applied.iter().map(|(key, _)| key.as_str()).collect();
        for (key, order, said, seen) in &outcomes {
            match *said {
                "ran" => assert!(ran_keys.contains(key.as_str())),
                "already_done" => assert!(ran_keys.contains(key.as_str()), "{key}"),
                "superseded" => assert!(
                    applied[..*seen].iter().any(|(_, newer)| newer > order),
                    "{permutation:?}: {key} at {order} superseded by nothing: {applied:?}"
                ),
                other => panic!("{permutation:?}: {key}: refused {other}"),
            }
        }
    }
}

/// A webhook's event, as a provider sends it.
struct Event {
    id: String,
    object_id: String,
    sequence: u64,
}

/// The attribute's `entity` and `order`: the events of one action and
/// entity, ordered as `Guard::ordered` orders them.
#[idem::idempotent(key = "event.id", entity = "event.object_id", order = "event.sequence")]
async fn apply(gate: &Gate, event: &Event, applied: &Mutex<Vec<u64>>) -> Result<(), Rejected> {
    applied.lock().unwrap().push(event.sequence);
    Ok(())
}

#[tokio::test]
async fn the_attribute_orders_the_events_of_one_entity() {
    let gate = testing::gate().await;
    let applied = Mutex::new(Vec::new());
    let event = |id: &str, object_id: &str, sequence| Event {
        id: id.to_owned(),
        object_id: object_id.to_owned(),
        sequence,
    };
    let answers = [
        apply(&gate, &event("evt_2", "sub_1", 2), &applied).await,
        apply(&gate, &event("evt_1", "sub_1", 1), &applied).await,
        apply(&gate, &event("evt_1b", "sub_2", 1), &applied).await,
        apply(&gate, &event("evt_2", "sub_1", 2), &applied).await,
        apply(&gate, &event("evt_3", "sub_1", 3), &applied).await,
        apply(&gate, &event("evt_big", "sub_1", u64::MAX), &applied).await,
    ];
    let reasons: Vec<&str> = answers
        .iter()
        .map(|answer| answer.as_ref().err().map_or("ran", Rejected::reason))
        .collect();
    assert_eq!(
        reasons,
        [
            "ran",
            "superseded",
            "ran",
            "already_done",
            "ran",
            "invalid_option"
        ]
    );
    assert_eq!(*applied.lock().unwrap(), [2, 1, 3]);
}

/// A prune by age never deletes the claim of the event that holds its
/// entity (its success is read from that row at the entity's next event):
/// were it gone, the entity would stay held for good. Once a newer event
/// has taken the entity, it may go, and the entity remembers it applied.
#[tokio::test]
async fn a_prune_keeps_the_event_that_holds_its_entity_until_the_next_one_came() {
    let gate = testing::gate().await;
    let log = Mutex::new(Vec::new());
    let sub = entity("sub_1");
    let present = |key: &str| {
        let address = event(key).address();
        let gate = gate.clone();
        async move {
            idem_test_support::rows::row_state(&gate, &address)
                .await
                .is_some()
        }
    };
    let prune_all = || async {
        // Everything settled up to a second from now, in this account.
        let filter =
            operations::PruneFilter::new(std::time::SystemTime::now() + Duration::from_secs(1))
                .account(gate.account_name());
        operations::prune(gate.pool(), &filter)
            .await
            .expect("prune")
    };
    assert_eq!(deliver(&gate, &sub, "e5", 5, None, &log).await, RAN);
    prune_all().await;
    assert!(present("e5").await, "the holder's claim was pruned");
    assert_eq!(deliver(&gate, &sub, "e7", 7, None, &log).await, RAN);
    prune_all().await;
    assert!(
        !present("e5").await,
        "a claim its entity no longer needs is pruned"
    );
    assert!(present("e7").await, "the new holder's claim was pruned");
    // Its entity remembers that 5 applied, and 7 holds it, settled.
    assert_eq!(deliver(&gate, &sub, "e6", 6, None, &log).await, SUPERSEDED);
    assert_eq!(deliver(&gate, &sub, "e8", 8, None, &log).await, RAN);
    assert_eq!(ran(&log), ["e5", "e7", "e8"]);
}

/// "A success (... an earlier holder's late one ...) is applied": an
/// event whose claim an operator released while its body ran, and which
/// then succeeded, is told `ClaimLost`, and its success is recorded in its
/// vacant slot; its entity counts it as applied, so an older event is
/// superseded after it.
#[tokio::test]
async fn a_late_success_in_a_vacant_slot_is_applied_for_its_entity() {
    let gate = testing::gate().await;
    let log = Mutex::new(Vec::new());
    let sub = entity("sub_1");
    let id = event("e7");
    let address = id.address();
    let slot = Slot::new(gate.account_name(), gate.namespace_name(), &address);
    let result: Result<(), Rejected> = gate
        .guard(&id)
        .ordered(&sub, 7)
        .run(async {
            let released = operations::release_pending(gate.pool(), slot)
                .await
                .expect("release");
            assert!(released.is_some(), "the operator released the claim");
            Ok(())
        })
        .await;
    assert!(
        matches!(result, Err(Rejected::ClaimLost { .. })),
        "{result:?}"
    );
    assert_eq!(
        deliver(&gate, &sub, "e7", 7, None, &log).await,
        ALREADY_DONE
    );
    assert_eq!(deliver(&gate, &sub, "e3", 3, None, &log).await, SUPERSEDED);
    assert_eq!(deliver(&gate, &sub, "e9", 9, None, &log).await, RAN);
}
