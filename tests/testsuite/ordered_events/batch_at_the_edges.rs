//! Red team: ordered events in a batch (`Batch::push_ordered`) attacked at
//! their edges, from the docs alone: panics, leases run out mid-batch,
//! batches racing single calls at one instant, hostile orders, replay, the
//! outcome cache, namespaces and accounts, a batch's future dropped, and
//! backends terminated while the batch claims and records.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem::batch::Batch;
use idem::{Fingerprint, Gate, Rejected, testing};
use idem_test_support::connections;
use tokio::sync::{Barrier, Notify};

use super::{Failure, classify, entity, event};

/// How a body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Ok,
    Released,
    Kept,
    Doubtful,
    Panic,
    /// Succeeds after sleeping this many milliseconds.
    Sleep(u64),
}

/// One event: its key, its entity's name, its order, how its body ends.
type Item = (&'static str, &'static str, i64, End);

/// What the bodies did, batch and single calls alike: each that ran (key,
/// entity, order) in the order they started; the entities whose event runs
/// now; every time a body started while another of its entity ran.
#[derive(Default)]
struct Log {
    ran: Mutex<Vec<(String, String, i64)>>,
    running: Mutex<BTreeSet<String>>,
    overlaps: Mutex<Vec<String>>,
}

impl Log {
    fn keys(&self) -> Vec<String> {
        self.ran
            .lock()
            .unwrap()
            .iter()
            .map(|(k, _, _)| k.clone())
            .collect()
    }

    fn times(&self, key: &str) -> usize {
        self.ran
            .lock()
            .unwrap()
            .iter()
            .filter(|(k, _, _)| k == key)
            .count()
    }

    fn orders_of(&self, of: &str) -> Vec<i64> {
        self.ran
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, e, _)| e == of)
            .map(|(_, _, o)| *o)
            .collect()
    }
}

/// A body: logs itself, checks no other event of its entity runs, ends as
/// `end`.
async fn apply(log: &Log, key: &str, of: &str, order: i64, end: End) -> Result<(), Failure> {
    if end == End::Panic {
        panic!("{key} panics");
    }
    if !log.running.lock().unwrap().insert(of.to_owned()) {
        log.overlaps.lock().unwrap().push(format!("{key} of {of}"));
    }
    log.ran
        .lock()
        .unwrap()
        .push((key.to_owned(), of.to_owned(), order));
    let sleep = match end {
        End::Sleep(ms) => ms,
        _ => 1,
    };
    tokio::time::sleep(Duration::from_millis(sleep)).await;
    log.running.lock().unwrap().remove(of);
    match end {
        End::Ok | End::Sleep(_) => Ok(()),
        End::Released => Err(Failure::Released),
        End::Kept => Err(Failure::Kept),
        End::Doubtful => Err(Failure::Doubtful),
        End::Panic => unreachable!(),
    }
}

fn reason(result: &Result<(), Failure>) -> &'static str {
    match result {
        Err(Failure::Rejected(rejected)) => rejected.reason(),
        Ok(()) | Err(_) => "ran",
    }
}

/// Guards `items` as one batch (with `lease`, if any); per item, "ran" or
/// its refusal's reason.
async fn batch(
    gate: &Gate,
    items: &[Item],
    concurrency: usize,
    lease: Option<Duration>,
    log: &Log,
) -> Vec<&'static str> {
    let mut batch = Batch::new();
    for &item in items {
        let (key, of, order, _) = item;
        batch.push_ordered(item, event(key), &entity(of), order);
    }
    let body = |(key, of, order, end): Item| apply(log, key, of, order, end);
    let guard = gate
        .guard_batch(batch)
        .disposition(classify)
        .concurrency(concurrency);
    let results: Vec<Result<(), Failure>> = match lease {
        Some(lease) => guard.lease(lease).run(body).await,
        None => guard.run(body).await,
    };
    results.iter().map(reason).collect()
}

/// One call of `Guard::ordered` for event `key` of `of` at `order`.
async fn single(gate: &Gate, key: &str, of: &str, order: i64, end: End, log: &Log) -> &'static str {
    let id = event(key);
    let result: Result<(), Failure> = gate
        .guard(&id)
        .ordered(&entity(of), order)
        .disposition(classify)
        .run(apply(log, key, of, order, end))
        .await;
    reason(&result)
}

/// Same, with a lease (a retry that may take over a claim whose lease ran
/// out).
async fn single_leased(
    gate: &Gate,
    key: &str,
    of: &str,
    order: i64,
    end: End,
    log: &Log,
) -> &'static str {
    let id = event(key);
    let result: Result<(), Failure> = gate
        .guard(&id)
        .ordered(&entity(of), order)
        .disposition(classify)
        .lease(Duration::from_secs(30))
        .run(apply(log, key, of, order, end))
        .await;
    reason(&result)
}

fn leak(text: String) -> &'static str {
    Box::leak(text.into_boxed_str())
}

/// Waits (up to 10 s) until `key`'s body started.
async fn started(log: &Log, key: &str) {
    for _ in 0..1000 {
        if log.times(key) > 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{key} never started");
}

// ---------------------------------------------------------------------------
// A panicking body
// ---------------------------------------------------------------------------

/// "A body that panics holds its own item ... its claim stays `pending`";
/// for an ordered event, its entity with it (`Guard::ordered`: "pending or
/// in doubt holds the entity"): after the batch's panic, neither an older
/// nor a newer event of the entity runs, by a batch or by one call, and
/// the panicked event itself is in flight.
#[tokio::test]
async fn a_panicking_ordered_body_holds_its_entity() {
    let gate = testing::gate().await;
    let log = Arc::new(Log::default());
    let task = {
        let (gate, log) = (gate.clone(), log.clone());
        tokio::spawn(async move {
            batch(
                &gate,
                &[
                    ("pa5", "sub_pa", 5, End::Panic),
                    ("pb1", "sub_pb", 1, End::Ok),
                ],
                2,
                None,
                &log,
            )
            .await
        })
    };
    let joined = task.await;
    assert!(
        joined.is_err_and(|e| e.is_panic()),
        "the panic reaches the caller"
    );
    assert_eq!(log.keys(), ["pb1"]);
    assert_eq!(
        single(&gate, "pa5", "sub_pa", 5, End::Ok, &log).await,
        "in_flight"
    );
    assert_eq!(
        single(&gate, "pa3", "sub_pa", 3, End::Ok, &log).await,
        "in_flight"
    );
    assert_eq!(
        single(&gate, "pa9", "sub_pa", 9, End::Ok, &log).await,
        "in_flight"
    );
    let again = batch(
        &gate,
        &[("pa2", "sub_pa", 2, End::Ok), ("pb1", "sub_pb", 1, End::Ok)],
        1,
        None,
        &log,
    )
    .await;
    assert_eq!(again, ["in_flight", "already_done"]);
    assert_eq!(log.keys(), ["pb1"]);
}

/// "The other bodies of the batch still run, and every outcome that
/// finished is recorded; then the panic resumes ... (Later copies of the
/// batch's identities, which run in passes after it, do not run.)" and
/// `BatchGuard::run`'s `# Panics`: "once the other bodies have run". The
/// second event of *another* entity is no later copy of any identity, yet
/// (oldest first, one event of an entity per pass) it sits in a second
/// pass: does it run when an unrelated event panics in the first?
#[tokio::test]
async fn a_panic_does_not_stop_the_later_events_of_other_entities() {
    let gate = testing::gate().await;
    let log = Arc::new(Log::default());
    let task = {
        let (gate, log) = (gate.clone(), log.clone());
        tokio::spawn(async move {
            batch(
                &gate,
                &[
                    ("qa1", "sub_qa", 1, End::Panic),
                    ("qb1", "sub_qb", 1, End::Ok),
                    ("qb2", "sub_qb", 2, End::Ok),
                ],
                1,
                None,
                &log,
            )
            .await
        })
    };
    let joined = task.await;
    assert!(
        joined.is_err_and(|e| e.is_panic()),
        "the panic reaches the caller"
    );
    // Held or not, the entity of the panic is never moved.
    assert_eq!(
        single(&gate, "qa0", "sub_qa", 0, End::Ok, &log).await,
        "in_flight"
    );
    assert_eq!(
        log.keys(),
        ["qb1", "qb2"],
        "every other body of the batch ran (qb2 is no copy of an identity)"
    );
}

// ---------------------------------------------------------------------------
// A lease that runs out mid-batch
// ---------------------------------------------------------------------------

/// `BatchGuard::lease`: "no body starts on a claim that may have been
/// taken over. Should the claim be lost already (taken over ...), its body
/// does not start: the item is claimed again alone ... and runs only if
/// that wins." An ordered item waits behind a long body past its lease;
/// the event's own retry takes its claim over and succeeds; the batch's
/// copy must not run again (at most once per event).
#[tokio::test]
async fn an_ordered_item_taken_over_mid_batch_never_runs_twice() {
    let gate = testing::gate().await;
    let log = Arc::new(Log::default());
    let task = {
        let (gate, log) = (gate.clone(), log.clone());
        tokio::spawn(async move {
            batch(
                &gate,
                &[
                    ("lx1", "sub_lx", 1, End::Sleep(1500)),
                    ("lb3", "sub_lb", 3, End::Ok),
                ],
                1,
                Some(Duration::from_millis(800)),
                &log,
            )
            .await
        })
    };
    started(&log, "lx1").await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    // lb3's claim (taken with the batch's) ran out of lease: another event
    // of its entity is refused, its own retry takes it over.
    assert_eq!(
        single(&gate, "lb1", "sub_lb", 1, End::Ok, &log).await,
        "in_flight"
    );
    assert_eq!(
        single_leased(&gate, "lb3", "sub_lb", 3, End::Ok, &log).await,
        "ran"
    );
    let answers = task.await.unwrap();
    assert_eq!(log.times("lb3"), 1, "lb3 ran once: {:?}", log.keys());
    assert_eq!(answers, ["ran", "already_done"]);
    assert_eq!(
        single(&gate, "lb2", "sub_lb", 2, End::Ok, &log).await,
        "superseded"
    );
}

/// `Guard::ordered`: "an event whose order is older than the newest one
/// applied for its entity is refused `Superseded` without running"; with
/// the batch's lease: "the item is claimed again alone, as a `Guard::run`
/// made then would be". The batch's item's claim is taken over by its own
/// retry, which fails and releases (the entity freed); a newer event is
/// applied; when the batch's turn comes the item is older than one applied
/// and must be superseded, not run.
#[tokio::test]
async fn an_ordered_item_whose_claim_was_lost_is_superseded_by_a_newer_event_applied_meanwhile() {
    let gate = testing::gate().await;
    let log = Arc::new(Log::default());
    let task = {
        let (gate, log) = (gate.clone(), log.clone());
        tokio::spawn(async move {
            batch(
                &gate,
                &[
                    ("mx1", "sub_mx", 1, End::Sleep(1500)),
                    ("mb3", "sub_mb", 3, End::Ok),
                ],
                1,
                Some(Duration::from_millis(800)),
                &log,
            )
            .await
        })
    };
    started(&log, "mx1").await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(
        single_leased(&gate, "mb3", "sub_mb", 3, End::Released, &log).await,
        "ran"
    );
    assert_eq!(
        single(&gate, "mb5", "sub_mb", 5, End::Ok, &log).await,
        "ran"
    );
    let answers = task.await.unwrap();
    assert_eq!(answers, ["ran", "superseded"], "ran: {:?}", log.keys());
    assert_eq!(log.times("mb3"), 1);
    assert_eq!(log.orders_of("sub_mb"), [3, 5]);
}

/// `on_expiry(OnExpiry::InDoubt)` on the batch: an ordered item whose
/// lease ran out while it waited its turn is turned in doubt by a retry;
/// its body never starts ("no body starts on a claim that may have been
/// taken over ... runs only if that wins"), and the doubt holds its entity
/// ("in doubt holds the entity").
#[tokio::test]
async fn an_ordered_item_turned_in_doubt_mid_batch_never_runs_and_holds_its_entity() {
    let gate = testing::gate().await;
    let log = Arc::new(Log::default());
    let task = {
        let (gate, log) = (gate.clone(), log.clone());
        tokio::spawn(async move {
            let mut b = Batch::new();
            let items: [Item; 2] = [
                ("ix1", "sub_ix", 1, End::Sleep(1500)),
                ("ib3", "sub_ib", 3, End::Ok),
            ];
            for item in items {
                b.push_ordered(item, event(item.0), &entity(item.1), item.2);
            }
            let log = &log;
            let results: Vec<Result<(), Failure>> = gate
                .guard_batch(b)
                .disposition(classify)
                .lease(Duration::from_millis(800))
                .on_expiry(idem::OnExpiry::InDoubt)
                .run(|(key, of, order, end)| apply(log, key, of, order, end))
                .await;
            results.iter().map(reason).collect::<Vec<_>>()
        })
    };
    started(&log, "ix1").await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let id = event("ib3");
    let retry: Result<(), Failure> = gate
        .guard(&id)
        .ordered(&entity("sub_ib"), 3)
        .disposition(classify)
        .lease(Duration::from_secs(30))
        .on_expiry(idem::OnExpiry::InDoubt)
        .run(apply(&log, "ib3", "sub_ib", 3, End::Ok))
        .await;
    assert_eq!(reason(&retry), "in_doubt");
    let answers = task.await.unwrap();
    assert_eq!(log.times("ib3"), 0, "ib3 ran: {:?}", log.keys());
    assert_eq!(answers, ["ran", "in_doubt"]);
    assert_eq!(
        single(&gate, "ib1", "sub_ib", 1, End::Ok, &log).await,
        "in_flight"
    );
    assert_eq!(
        single(&gate, "ib9", "sub_ib", 9, End::Ok, &log).await,
        "in_flight"
    );
}

/// `Guard::ordered`: "applied" is a recorded success, an earlier holder's
/// late success too; the batch: "An item the statement did not match (its
/// claim was ... released meanwhile) is recorded alone, as `Guard::run`
/// records it." An operator releases a batch's ordered event under its
/// running body (the entity freed, nothing applied), an older event runs,
/// then the batch's body succeeds: if that success is kept in the slot it
/// must count as applied (a newer-than-applied event older than it is
/// superseded), and if it is not kept, the event runs on redelivery.
#[tokio::test]
async fn an_operator_release_under_a_batch_body_then_its_success() {
    let gate = testing::gate().await;
    let log = Arc::new(Log::default());
    let go_on = Arc::new(Notify::new());
    let task = {
        let (gate, log, go_on) = (gate.clone(), log.clone(), go_on.clone());
        tokio::spawn(async move {
            let mut b = Batch::new();
            b.push_ordered((), event("v7"), &entity("sub_v"), 7);
            let results: Vec<Result<(), Failure>> = gate
                .guard_batch(b)
                .disposition(classify)
                .run(|()| {
                    let (log, go_on) = (log.clone(), go_on.clone());
                    async move {
                        log.ran
                            .lock()
                            .unwrap()
                            .push(("v7".into(), "sub_v".into(), 7));
                        go_on.notified().await;
                        Ok(())
                    }
                })
                .await;
            reason(&results[0])
        })
    };
    started(&log, "v7").await;
    let address = event("v7").address();
    let slot = idem::operations::Slot::new(gate.account_name(), gate.namespace_name(), &address);
    let released = idem::operations::release_pending(gate.pool(), slot)
        .await
        .expect("release");
    assert!(released.is_some());
    let log2 = Log::default();
    assert_eq!(
        single(&gate, "v3", "sub_v", 3, End::Ok, &log2).await,
        "ran",
        "freed"
    );
    go_on.notify_one();
    let said = task.await.unwrap();
    let older = single(&gate, "v5", "sub_v", 5, End::Ok, &log2).await;
    let own = single(&gate, "v7", "sub_v", 7, End::Ok, &log2).await;
    match older {
        "superseded" => assert_eq!(own, "already_done", "batch said {said}"),
        "ran" => assert_eq!(
            own, "ran",
            "v7's success is kept yet v5, older, ran (batch said {said})"
        ),
        _ => panic!("v5 {older}, v7 {own}, batch said {said}"),
    }
}

// ---------------------------------------------------------------------------
// Races at one instant
// ---------------------------------------------------------------------------

/// "No two events of one entity at once", "never after a newer event of
/// its entity was applied", at most once per event: two overlapping
/// batches (concurrency 3) and single `Guard::ordered` calls of the same
/// and other events of two entities, all fired at one instant, each
/// redelivered while in flight. Every body succeeds, so the orders that
/// ran for an entity never go down, and no key runs twice.
#[tokio::test]
async fn batches_and_single_calls_at_one_instant_never_overlap_nor_move_back() {
    const ROUNDS: usize = 5;
    for round in 0..ROUNDS {
        let gate = testing::gate_on(testing::pool_with(8).await).await;
        let log = Arc::new(Log::default());
        let batches: Vec<Vec<Item>> = vec![
            vec![
                ("ra5", "sub_ra", 5, End::Ok),
                ("ra2", "sub_ra", 2, End::Ok),
                ("rb3", "sub_rb", 3, End::Ok),
                ("ra8", "sub_ra", 8, End::Ok),
                ("rb1", "sub_rb", 1, End::Ok),
                ("rc1", "sub_rc", 1, End::Ok),
            ],
            vec![
                ("ra8", "sub_ra", 8, End::Ok),
                ("rb4", "sub_rb", 4, End::Ok),
                ("ra6", "sub_ra", 6, End::Ok),
                ("rb3", "sub_rb", 3, End::Ok),
                ("rc2", "sub_rc", 2, End::Ok),
                ("ra2", "sub_ra", 2, End::Ok),
            ],
        ];
        let singles: Vec<Item> = vec![
            ("ra4", "sub_ra", 4, End::Ok),
            ("ra8", "sub_ra", 8, End::Ok),
            ("rb2", "sub_rb", 2, End::Ok),
            ("ra5", "sub_ra", 5, End::Ok),
            ("rc2", "sub_rc", 2, End::Ok),
        ];
        let barrier = Arc::new(Barrier::new(batches.len() + singles.len()));
        let mut tasks = Vec::new();
        for mine in batches {
            let (gate, log, barrier) = (gate.clone(), log.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                let mut pending = mine;
                for _ in 0..300 {
                    let answers = batch(&gate, &pending, 3, None, &log).await;
                    pending = pending
                        .into_iter()
                        .zip(answers)
                        .filter(|(_, answer)| *answer == "in_flight")
                        .map(|(item, _)| item)
                        .collect();
                    if pending.is_empty() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                panic!("still in flight: {pending:?}");
            }));
        }
        for (key, of, order, end) in singles {
            let (gate, log, barrier) = (gate.clone(), log.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                for _ in 0..300 {
                    if single(&gate, key, of, order, end, &log).await != "in_flight" {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                panic!("{key} still in flight");
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        let overlaps = log.overlaps.lock().unwrap().clone();
        assert!(
            overlaps.is_empty(),
            "round {round}: ran beside another: {overlaps:?}"
        );
        let mut seen = BTreeSet::new();
        for key in log.keys() {
            assert!(seen.insert(key.clone()), "round {round}: {key} ran twice");
        }
        for (of, newest) in [("sub_ra", 8), ("sub_rb", 4), ("sub_rc", 2)] {
            let orders = log.orders_of(of);
            assert!(
                orders.windows(2).all(|pair| pair[0] <= pair[1]),
                "round {round}: {of} moved back: {orders:?}"
            );
            assert_eq!(
                orders.last(),
                Some(&newest),
                "round {round}: {of}: {orders:?}"
            );
        }
    }
}

/// Many entities, concurrency 4, events shuffled, some failing released,
/// kept or in doubt, two overlapping batches at one instant; then every
/// entity is checked from outside: an entity whose event is in doubt is
/// held, any other is at the newest success, never past it.
#[tokio::test]
async fn many_entities_with_failures_in_overlapping_batches() {
    let gate = testing::gate_on(testing::pool_with(8).await).await;
    let log = Arc::new(Log::default());
    let mut items: Vec<Item> = Vec::new();
    for e in 0..12 {
        let of = leak(format!("sub_m{e}"));
        for order in [4, 1, 3, 2] {
            let end = match (e + order as usize) % 7 {
                0 => End::Released,
                1 if e % 3 == 0 => End::Kept,
                2 if e == 5 => End::Doubtful,
                _ => End::Ok,
            };
            items.push((leak(format!("m{e}_{order}")), of, order, end));
        }
    }
    let mut other = items.clone();
    other.reverse();
    other.rotate_left(5);
    let barrier = Arc::new(Barrier::new(2));
    let mut tasks = Vec::new();
    for mine in [items.clone(), other] {
        let (gate, log, barrier) = (gate.clone(), log.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            batch(&gate, &mine, 4, None, &log).await
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let overlaps = log.overlaps.lock().unwrap().clone();
    assert!(overlaps.is_empty(), "ran beside another: {overlaps:?}");
    let ran = log.ran.lock().unwrap().clone();
    // Per entity: the successes in the order they ran never go down, and no
    // event succeeded twice.
    let ends: BTreeMap<&str, End> = items.iter().map(|&(k, _, _, end)| (k, end)).collect();
    let mut succeeded = BTreeSet::new();
    for e in 0..12 {
        let of = format!("sub_m{e}");
        let mut applied = i64::MIN;
        let mut held = false;
        for (key, _, order) in ran.iter().filter(|(_, o, _)| *o == of) {
            assert!(!held, "{key} ran after an event of {of} in doubt");
            assert!(
                *order >= applied,
                "{key} at {order} ran after {applied} was applied"
            );
            match ends[key.as_str()] {
                End::Ok => {
                    assert!(succeeded.insert(key.clone()), "{key} succeeded twice");
                    applied = *order;
                }
                End::Doubtful => held = true,
                _ => {}
            }
        }
        let probe = single(
            &gate,
            leak(format!("probe{e}")),
            leak(of.clone()),
            applied.max(0),
            End::Ok,
            &log,
        )
        .await;
        if held {
            assert_eq!(probe, "in_flight", "{of} in doubt");
        } else {
            assert_eq!(probe, "ran", "{of} is free and at {applied}");
            if applied > 0 {
                let older = single(
                    &gate,
                    leak(format!("older{e}")),
                    leak(of.clone()),
                    applied - 1,
                    End::Ok,
                    &log,
                )
                .await;
                assert_eq!(older, "superseded", "{of} at {applied}");
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Hostile orders
// ---------------------------------------------------------------------------

/// `push_ordered`: "an order beyond an `i64` ... refuse the item
/// `InvalidOption`"; "oldest first whatever their place in the batch":
/// i64::MAX, i64::MIN, 0, and u64 just above i64::MAX in one batch.
#[tokio::test]
async fn extreme_orders_in_one_batch() {
    let gate = testing::gate().await;
    let sub = entity("sub_h");
    let ran = Mutex::new(Vec::new());
    let mut b = Batch::new();
    b.push_ordered("hmax", event("hmax"), &sub, i64::MAX);
    b.push_ordered("hbig", event("hbig"), &sub, i64::MAX as u64 + 1);
    b.push_ordered("hmin", event("hmin"), &sub, i64::MIN);
    b.push_ordered("hzero", event("hzero"), &sub, 0u8);
    b.push_ordered("hneg", event("hneg"), &sub, -1i32);
    let results: Vec<Result<(), Rejected>> = gate
        .guard_batch(b)
        .concurrency(4)
        .run(|name| {
            ran.lock().unwrap().push(name);
            async { Ok(()) }
        })
        .await;
    let reasons: Vec<&str> = results
        .iter()
        .map(|r| r.as_ref().map_or_else(Rejected::reason, |()| "ran"))
        .collect();
    assert_eq!(reasons, ["ran", "invalid_option", "ran", "ran", "ran"]);
    assert_eq!(*ran.lock().unwrap(), ["hmin", "hneg", "hzero", "hmax"]);
    let log = Log::default();
    assert_eq!(
        single(&gate, "h1", "sub_h", i64::MAX - 1, End::Ok, &log).await,
        "superseded"
    );
    assert_eq!(
        single(&gate, "h2", "sub_h", i64::MIN, End::Ok, &log).await,
        "superseded"
    );
    assert_eq!(
        single(&gate, "h3", "sub_h", i64::MAX, End::Ok, &log).await,
        "ran"
    );
}

/// System times as orders: before 1970, the epoch, now, far ahead; oldest
/// first, and a time older than the newest applied is superseded.
#[tokio::test]
async fn system_times_in_one_batch() {
    let gate = testing::gate().await;
    let sub = entity("sub_t");
    let now = SystemTime::now();
    let ran = Mutex::new(Vec::new());
    let mut b = Batch::new();
    b.push_ordered("t_now", event("t_now"), &sub, now);
    b.push_ordered(
        "t_far",
        event("t_far"),
        &sub,
        UNIX_EPOCH + Duration::from_secs(200_000 * 365 * 86_400),
    );
    b.push_ordered(
        "t_pre",
        event("t_pre"),
        &sub,
        UNIX_EPOCH - Duration::from_secs(86_400),
    );
    b.push_ordered("t_epoch", event("t_epoch"), &sub, UNIX_EPOCH);
    let results: Vec<Result<(), Rejected>> = gate
        .guard_batch(b)
        .run(|name| {
            ran.lock().unwrap().push(name);
            async { Ok(()) }
        })
        .await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(*ran.lock().unwrap(), ["t_pre", "t_epoch", "t_now", "t_far"]);
    let later: Result<(), Rejected> = gate
        .guard(&event("t_later"))
        .ordered(&sub, now + Duration::from_secs(3600))
        .run(async { Ok(()) })
        .await;
    assert!(matches!(later, Err(Rejected::Superseded)), "{later:?}");
}

// ---------------------------------------------------------------------------
// The same event twice, fingerprints, replay, the cache
// ---------------------------------------------------------------------------

/// "a copy of an event is a duplicate" (its own slot answers it), and the
/// same key for another entity does not move that entity: one event
/// delivered for two entities and at two orders in one batch.
#[tokio::test]
async fn the_same_event_for_two_entities_and_two_orders_in_one_batch() {
    let gate = testing::gate().await;
    let log = Log::default();
    let answers = batch(
        &gate,
        &[
            ("w1", "sub_wa", 5, End::Ok),
            ("w1", "sub_wb", 1, End::Ok),
            ("w2", "sub_wc", 3, End::Ok),
            ("w1", "sub_wa", 2, End::Ok),
        ],
        2,
        None,
        &log,
    )
    .await;
    // w1 runs once, as the oldest of sub_wa (2); every copy is a duplicate.
    assert_eq!(answers, ["already_done", "already_done", "ran", "ran"]);
    assert_eq!(log.times("w1"), 1);
    assert_eq!(log.orders_of("sub_wa"), [2]);
    assert_eq!(
        single(&gate, "wa1", "sub_wa", 1, End::Ok, &log).await,
        "superseded"
    );
    assert_eq!(
        single(&gate, "wa4", "sub_wa", 4, End::Ok, &log).await,
        "ran"
    );
    assert_eq!(
        single(&gate, "wb0", "sub_wb", 0, End::Ok, &log).await,
        "ran",
        "sub_wb never moved"
    );
}

/// Fingerprinted items mixed with ordered ones in one batch: each keeps
/// its promise (a copy with another payload `KeyReused`, ordered events
/// oldest first).
#[tokio::test]
async fn fingerprinted_items_mixed_with_ordered_events() {
    let gate = testing::gate().await;
    let ran = Mutex::new(Vec::new());
    let sub = entity("sub_f");
    let mut b = Batch::new();
    b.push_ordered("o2", event("o2"), &sub, 2);
    b.push_fingerprinted("f1", event("f1"), Fingerprint::new().part(1));
    b.push_ordered("o1", event("o1"), &sub, 1);
    b.push_fingerprinted("f1'", event("f1"), Fingerprint::new().part(2));
    b.push_fingerprinted("f1''", event("f1"), Fingerprint::new().part(1));
    let results: Vec<Result<(), Rejected>> = gate
        .guard_batch(b)
        .concurrency(3)
        .run(|name| {
            ran.lock().unwrap().push(name);
            async { Ok(()) }
        })
        .await;
    let reasons: Vec<&str> = results
        .iter()
        .map(|r| r.as_ref().map_or_else(Rejected::reason, |()| "ran"))
        .collect();
    assert_eq!(reasons, ["ran", "ran", "ran", "key_reused", "already_done"]);
    let ran = ran.lock().unwrap().clone();
    let pos = |n: &str| ran.iter().position(|r| *r == n).unwrap();
    assert!(pos("o1") < pos("o2"), "{ran:?}");
}

/// Replay with ordered events: a copy in the batch and a later batch are
/// handed the kept value; an event older than one applied is superseded,
/// never handed a value nor run.
#[tokio::test]
async fn replay_with_ordered_events() {
    let gate = testing::gate().await;
    let sub = entity("sub_r");
    let ran = Mutex::new(Vec::new());
    let run = |items: Vec<(&'static str, i64)>| {
        let mut b = Batch::new();
        for (key, order) in items {
            b.push_ordered(key, event(key), &sub, order);
        }
        let ran = &ran;
        let gate = &gate;
        async move {
            let results: Vec<Result<String, Rejected>> = gate
                .guard_batch(b)
                .replay()
                .run(|key| {
                    ran.lock().unwrap().push(key);
                    async move { Ok(format!("value of {key}")) }
                })
                .await;
            results
                .into_iter()
                .map(|r| r.unwrap_or_else(|e| e.reason().to_owned()))
                .collect::<Vec<String>>()
        }
    };
    let first = run(vec![("r5", 5), ("r3", 3), ("r5", 5)]).await;
    assert_eq!(first, ["value of r5", "value of r3", "value of r5"]);
    let second = run(vec![("r4", 4), ("r5", 5), ("r3", 3), ("r9", 9)]).await;
    assert_eq!(
        second,
        ["superseded", "value of r5", "value of r3", "value of r9"]
    );
    assert_eq!(*ran.lock().unwrap(), ["r3", "r5", "r9"]);
}

/// "An outcome cache (feature `cache`) changes none of these answers":
/// the same batches through a cached gate answer as without it, and the
/// cache of one namespace answers nothing in another.
#[cfg(feature = "cache")]
#[tokio::test]
async fn the_outcome_cache_changes_no_answer_of_an_ordered_batch() {
    let base = testing::gate().await;
    let cached = base.with_cache(idem::cache::OutcomeCache::builder().build());
    for (gate, ns) in [
        (base.namespace("plain"), "plain"),
        (cached.namespace("one"), "cached"),
    ] {
        let log = Log::default();
        let first = batch(
            &gate,
            &[
                ("c5", "sub_c", 5, End::Ok),
                ("c7", "sub_c", 7, End::Released),
                ("c6", "sub_c", 6, End::Kept),
            ],
            1,
            None,
            &log,
        )
        .await;
        assert_eq!(first, ["ran", "ran", "ran"], "{ns}");
        let second = batch(
            &gate,
            &[
                ("c5", "sub_c", 5, End::Ok),
                ("c4", "sub_c", 4, End::Ok),
                ("c6", "sub_c", 6, End::Ok),
                ("c7", "sub_c", 7, End::Ok),
                ("c5", "sub_c", 5, End::Ok),
            ],
            2,
            None,
            &log,
        )
        .await;
        assert_eq!(
            second,
            [
                "already_done",
                "superseded",
                "already_failed",
                "ran",
                "already_done"
            ],
            "{ns}"
        );
        assert_eq!(log.times("c5"), 1, "{ns}");
        assert_eq!(log.times("c7"), 2, "{ns}");
    }
    // The same events in another namespace of the cached gate: nothing
    // there yet, so they run.
    let other = cached.namespace("two");
    let log = Log::default();
    let answers = batch(
        &other,
        &[("c5", "sub_c", 5, End::Ok), ("c4", "sub_c", 4, End::Ok)],
        1,
        None,
        &log,
    )
    .await;
    assert_eq!(answers, ["ran", "ran"]);
}

// ---------------------------------------------------------------------------
// Accounts and namespaces
// ---------------------------------------------------------------------------

/// "a release frees the event's entity in the same statement", in a
/// namespace (the statement's namespaced form), for several entities at
/// once (concurrency 4), and accounts/namespaces keep their entities
/// apart.
#[tokio::test]
async fn a_batch_release_in_a_namespace_frees_every_entity_it_held() {
    let base = testing::gate().await;
    let gate = base.namespace("ns_rel");
    let log = Log::default();
    let answers = batch(
        &gate,
        &[
            ("na7", "sub_na", 7, End::Released),
            ("nb7", "sub_nb", 7, End::Released),
            ("nc7", "sub_nc", 7, End::Released),
            ("nd7", "sub_nd", 7, End::Ok),
        ],
        4,
        None,
        &log,
    )
    .await;
    assert_eq!(answers, ["ran"; 4]);
    for of in ["sub_na", "sub_nb", "sub_nc"] {
        let key = leak(format!("{of}_3"));
        assert_eq!(
            single(&gate, key, of, 3, End::Ok, &log).await,
            "ran",
            "{of} freed, nothing applied"
        );
    }
    assert_eq!(
        single(&gate, "nd3", "sub_nd", 3, End::Ok, &log).await,
        "superseded"
    );
    // Another namespace, and another account, know nothing of sub_nd.
    assert_eq!(
        single(&base, "nd3", "sub_nd", 3, End::Ok, &log).await,
        "ran"
    );
    let elsewhere = base
        .account(testing::unique_name("other"))
        .namespace("ns_rel");
    assert_eq!(
        single(&elsewhere, "nd3", "sub_nd", 3, End::Ok, &log).await,
        "ran"
    );
}

// ---------------------------------------------------------------------------
// Faults
// ---------------------------------------------------------------------------

/// The batch's future dropped while an ordered body runs: the event may
/// have applied, so its entity is held (`Guard::ordered`: "pending ...
/// holds the entity"), and a finished body of the same pass, unrecorded,
/// never runs again.
#[tokio::test]
async fn dropping_the_batch_mid_body_holds_the_entity() {
    let gate = testing::gate().await;
    let log = Arc::new(Log::default());
    let task = {
        let (gate, log) = (gate.clone(), log.clone());
        tokio::spawn(async move {
            batch(
                &gate,
                &[
                    ("dd5", "sub_dd", 5, End::Sleep(60_000)),
                    ("de1", "sub_de", 1, End::Ok),
                    ("dd6", "sub_dd", 6, End::Ok),
                ],
                2,
                None,
                &log,
            )
            .await
        })
    };
    started(&log, "dd5").await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    task.abort();
    assert!(task.await.is_err_and(|e| e.is_cancelled()));
    let log2 = Log::default();
    for (key, order) in [("dd5", 5), ("dd3", 3), ("dd6", 6), ("dd9", 9)] {
        assert_eq!(
            single(&gate, key, "sub_dd", order, End::Ok, &log2).await,
            "in_flight",
            "{key}"
        );
    }
    let de1 = single(&gate, "de1", "sub_de", 1, End::Ok, &log2).await;
    assert_eq!(
        log.times("de1") + log2.times("de1"),
        1,
        "de1 ran once ({de1})"
    );
    assert_eq!(log.times("dd6"), 0);
}

/// A backend terminated while the batch claims its ordered events (the
/// claim waits on one entity's row): "a store down refuses every item
/// `Unavailable`" of the statement (one for a pass's ordered events, on
/// PostgreSQL; one per event on Citus, where the other entity's item
/// runs), nothing runs, and each entity is where it was: a redelivery
/// runs the other entity's event, and the held one's.
#[tokio::test]
async fn a_backend_terminated_while_the_batch_claims_an_ordered_event() {
    let name = testing::unique_name("rtb_claim");
    let gate = testing::gate_on(connections::named_pool(&name, 3).await).await;
    let admin_pool = testing::pool_with(2).await;
    let admin_gate = Gate::connect(admin_pool.clone())
        .await
        .unwrap()
        .account(gate.account_name());
    let log = Arc::new(Log::default());
    assert_eq!(single(&gate, "k5", "sub_k", 5, End::Ok, &log).await, "ran");
    let mut admin = admin_pool.begin().await.unwrap();
    let locked: i64 = idem::sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT 1 FROM idem_records WHERE account = $1 AND kind = 'entity' \
         AND address = $2 FOR UPDATE) AS l",
    )
    .bind(gate.account_name())
    .bind(entity("sub_k").address())
    .fetch_one(&mut *admin)
    .await
    .unwrap();
    assert_eq!(locked, 1);
    let task = {
        let (gate, log) = (gate.clone(), log.clone());
        tokio::spawn(async move {
            batch(
                &gate,
                &[("k8", "sub_k", 8, End::Ok), ("j1", "sub_j", 1, End::Ok)],
                1,
                None,
                &log,
            )
            .await
        })
    };
    let mut killed = 0;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        killed = connections::terminate_lock_waiters(&admin_pool, &name).await;
        if killed > 0 {
            break;
        }
    }
    assert!(
        killed > 0,
        "the batch's claim never waited on the entity's row"
    );
    let answers = tokio::time::timeout(Duration::from_secs(60), task)
        .await
        .expect("ends")
        .unwrap();
    admin.rollback().await.unwrap();
    assert_eq!(log.times("k8"), 0, "{answers:?}");
    assert_eq!(answers[0], "unavailable", "{answers:?}");
    match answers[1] {
        "ran" => assert_eq!(log.times("j1"), 1),
        "unavailable" => {
            assert_eq!(log.times("j1"), 0, "{answers:?}");
            assert_eq!(
                single(&admin_gate, "j1", "sub_j", 1, End::Ok, &log).await,
                "ran"
            );
        }
        other => panic!("j1: {other} ({answers:?})"),
    }
    assert_eq!(
        single(&admin_gate, "k3", "sub_k", 3, End::Ok, &log).await,
        "superseded"
    );
    assert_eq!(
        single(&admin_gate, "k8", "sub_k", 8, End::Ok, &log).await,
        "ran"
    );
    assert_eq!(
        single(&admin_gate, "k6", "sub_k", 6, End::Ok, &log).await,
        "superseded"
    );
}

/// A backend terminated while the batch records its outcomes (the
/// statement waits on the claim's row): whether the record is retried and
/// lands or not, a released failure never counts as applied, a success
/// either is applied or holds its entity, and nothing runs twice.
#[tokio::test]
async fn a_backend_terminated_while_the_batch_records() {
    for end in [End::Released, End::Ok] {
        let name = testing::unique_name("rtb_record");
        let gate = testing::gate_on(connections::named_pool(&name, 3).await).await;
        let admin_pool = testing::pool_with(2).await;
        let admin_gate = Gate::connect(admin_pool.clone())
            .await
            .unwrap()
            .account(gate.account_name());
        let log = Arc::new(Log::default());
        let go_on = Arc::new(Notify::new());
        let task = {
            let (gate, log, go_on) = (gate.clone(), log.clone(), go_on.clone());
            tokio::spawn(async move {
                let mut b = Batch::new();
                b.push_ordered((), event("g7"), &entity("sub_g"), 7);
                let results: Vec<Result<(), Failure>> = gate
                    .guard_batch(b)
                    .disposition(classify)
                    .run(|()| {
                        let (log, go_on) = (log.clone(), go_on.clone());
                        async move {
                            log.ran
                                .lock()
                                .unwrap()
                                .push(("g7".into(), "sub_g".into(), 7));
                            go_on.notified().await;
                            match end {
                                End::Released => Err(Failure::Released),
                                _ => Ok(()),
                            }
                        }
                    })
                    .await;
                reason(&results[0])
            })
        };
        started(&log, "g7").await;
        let mut admin = admin_pool.begin().await.unwrap();
        idem::sqlx::query(
            "SELECT 1 FROM idem_records WHERE account = $1 AND address = $2 AND kind = 'claim' \
             FOR UPDATE",
        )
        .bind(gate.account_name())
        .bind(event("g7").address())
        .fetch_all(&mut *admin)
        .await
        .unwrap();
        go_on.notify_one();
        let mut killed = 0;
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            killed = connections::terminate_lock_waiters(&admin_pool, &name).await;
            if killed > 0 {
                break;
            }
        }
        assert!(killed > 0, "{end:?}: the record never waited");
        admin.rollback().await.unwrap();
        let said = tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("ends")
            .unwrap();
        let log2 = Log::default();
        // The older event first: it tells whether the entity is held, free
        // with nothing applied, or at 7.
        let older = single(&admin_gate, "g3", "sub_g", 3, End::Ok, &log2).await;
        let own = single(&admin_gate, "g7", "sub_g", 7, End::Ok, &log2).await;
        match (end, older) {
            // The release landed: nothing applied, the entity free.
            (End::Released, "ran") => assert_eq!(own, "ran", "said {said}"),
            // The settle landed: applied.
            (End::Ok, "superseded") => assert_eq!(own, "already_done", "said {said}"),
            // Not recorded: fail closed, the entity held.
            (_, "in_flight") => assert_eq!(own, "in_flight", "said {said}"),
            _ => panic!("{end:?}: g3 {older} (g7 then {own}), batch said {said}"),
        }
        eprintln!("{end:?}: batch said {said}, then g7 {own}, g3 {older}");
    }
}

// ---------------------------------------------------------------------------
// More: a panicking classifier, a long batch, drops and kills at random
// ---------------------------------------------------------------------------

/// "So does a `disposition` classifier that panics on an item's error:
/// that item alone is held" (and, an ordered event, its entity with it);
/// the others are recorded.
#[tokio::test]
async fn a_classifier_panicking_on_an_ordered_item_holds_it_and_its_entity() {
    let gate = testing::gate().await;
    let log = Arc::new(Log::default());
    let task = {
        let (gate, log) = (gate.clone(), log.clone());
        tokio::spawn(async move {
            let mut b = Batch::new();
            let items: [Item; 2] = [
                ("cx5", "sub_cx", 5, End::Kept),
                ("cy1", "sub_cy", 1, End::Ok),
            ];
            for item in items {
                b.push_ordered(item, event(item.0), &entity(item.1), item.2);
            }
            let log = &log;
            let _: Vec<Result<(), Failure>> = gate
                .guard_batch(b)
                .disposition(|failure: &Failure| match failure {
                    Failure::Kept => panic!("the classifier panics"),
                    other => classify(other),
                })
                .concurrency(2)
                .run(|(key, of, order, end)| apply(log, key, of, order, end))
                .await;
        })
    };
    assert!(task.await.is_err_and(|e| e.is_panic()));
    let log2 = Log::default();
    assert_eq!(
        single(&gate, "cx5", "sub_cx", 5, End::Ok, &log2).await,
        "in_flight"
    );
    assert_eq!(
        single(&gate, "cx3", "sub_cx", 3, End::Ok, &log2).await,
        "in_flight"
    );
    assert_eq!(
        single(&gate, "cx7", "sub_cx", 7, End::Ok, &log2).await,
        "in_flight"
    );
    assert_eq!(
        single(&gate, "cy1", "sub_cy", 1, End::Ok, &log2).await,
        "already_done"
    );
}

/// "oldest first, whatever their places in the batch", "one event of an
/// entity per pass": 150 events of each of two entities, delivered newest
/// first and interleaved, concurrency 4: every one runs, each entity's in
/// ascending order, never two of an entity at once.
#[tokio::test]
async fn a_long_batch_of_two_entities_delivered_newest_first() {
    let gate = testing::gate_on(testing::pool_with(6).await).await;
    let log = Log::default();
    let mut items: Vec<Item> = Vec::new();
    for order in (0..150).rev() {
        for of in ["sub_la", "sub_lb"] {
            items.push((leak(format!("{of}_{order}")), of, order, End::Ok));
        }
    }
    let answers = batch(&gate, &items, 4, None, &log).await;
    assert!(answers.iter().all(|a| *a == "ran"), "{answers:?}");
    assert!(log.overlaps.lock().unwrap().is_empty());
    for of in ["sub_la", "sub_lb"] {
        assert_eq!(log.orders_of(of), (0..150).collect::<Vec<i64>>());
    }
}

/// Runs `items` by batches until none is in flight (up to `tries`).
async fn until_settled(
    gate: &Gate,
    items: &[Item],
    concurrency: usize,
    lease: Duration,
    log: &Log,
    tries: usize,
) {
    let mut pending: Vec<Item> = items.to_vec();
    for _ in 0..tries {
        let answers = batch(gate, &pending, concurrency, Some(lease), log).await;
        pending = pending
            .into_iter()
            .zip(answers)
            .filter(|(_, a)| !matches!(*a, "ran" | "already_done" | "superseded"))
            .map(|(item, _)| item)
            .collect();
        if pending.is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("never settled: {pending:?}");
}

/// Every body succeeds, so for each entity the orders that started never
/// go down (a body that started holds its entity until its own outcome or
/// its own retry), nothing ran beside another event of its entity, and
/// the newest ran.
fn check_runs(log: &Log, entities: &[(&str, i64)], what: &str) {
    let overlaps = log.overlaps.lock().unwrap().clone();
    assert!(
        overlaps.is_empty(),
        "{what}: ran beside another: {overlaps:?}"
    );
    for &(of, newest) in entities {
        let orders = log.orders_of(of);
        assert!(
            orders.windows(2).all(|p| p[0] <= p[1]),
            "{what}: {of} moved back: {orders:?}"
        );
        assert_eq!(orders.last(), Some(&newest), "{what}: {of}: {orders:?}");
    }
}

fn mixed_items() -> Vec<Item> {
    let mut items = Vec::new();
    for of in ["sub_xa", "sub_xb", "sub_xc"] {
        for order in [3, 1, 4, 2] {
            items.push((leak(format!("{of}_{order}")), of, order, End::Ok));
        }
    }
    items
}

/// The batch's future dropped at many points (while it claims, runs or
/// records), with a lease, then the batch redelivered until settled: no
/// entity moves back, no two events of an entity run at once, the newest
/// of each runs.
#[tokio::test]
async fn a_batch_dropped_at_any_point_then_redelivered() {
    for step in 0..12u64 {
        let gate = testing::gate_on(testing::pool_with(4).await).await;
        let log = Arc::new(Log::default());
        let items = mixed_items();
        let lease = Duration::from_millis(300);
        let task = {
            let (gate, log, items) = (gate.clone(), log.clone(), items.clone());
            tokio::spawn(async move { batch(&gate, &items, 3, Some(lease), &log).await })
        };
        tokio::time::sleep(Duration::from_micros(step * step * 400)).await;
        task.abort();
        let _ = task.await;
        // The aborted bodies are gone: none runs beside a later one.
        log.running.lock().unwrap().clear();
        until_settled(&gate, &items, 3, lease, &log, 100).await;
        check_runs(
            &log,
            &[("sub_xa", 4), ("sub_xb", 4), ("sub_xc", 4)],
            &format!("step {step}"),
        );
    }
}

/// Backends terminated in a loop while a batch claims, runs and records
/// (with a lease), then the batch redelivered until settled: the same
/// promises hold.
#[tokio::test]
async fn backends_terminated_in_a_loop_under_a_batch() {
    for round in 0..3 {
        let name = testing::unique_name("rtb_loop");
        let gate = testing::gate_on(connections::named_pool(&name, 3).await).await;
        let admin = testing::pool_with(1).await;
        let log = Arc::new(Log::default());
        let items = mixed_items();
        let lease = Duration::from_millis(400);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let killer = {
            let (admin, name, stop) = (admin.clone(), name.clone(), stop.clone());
            tokio::spawn(async move {
                let mut killed = 0;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    killed += connections::terminate_backends(&admin, &name).await;
                    tokio::time::sleep(Duration::from_millis(3 + round * 4)).await;
                }
                killed
            })
        };
        for _ in 0..3 {
            let _ = batch(&gate, &items, 3, Some(lease), &log).await;
        }
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let killed = killer.await.unwrap();
        assert!(killed > 0, "round {round}: no backend was terminated");
        log.running.lock().unwrap().clear();
        until_settled(&gate, &items, 3, lease, &log, 100).await;
        check_runs(
            &log,
            &[("sub_xa", 4), ("sub_xb", 4), ("sub_xc", 4)],
            &format!("round {round} ({killed} killed)"),
        );
    }
}

/// "the copy of a failure that released its slot runs, within this batch,
/// as a redelivery would"; a kept failure's copy is `AlreadyFailed`; and a
/// released failure applied nothing while a kept one frees its entity for
/// the next event of the same batch.
#[tokio::test]
async fn copies_of_released_and_kept_failures_in_one_batch() {
    let gate = testing::gate().await;
    let log = Log::default();
    let answers = batch(
        &gate,
        &[
            ("e5", "sub_e", 5, End::Released),
            ("e5", "sub_e", 5, End::Ok),
            ("e4", "sub_e", 4, End::Ok),
            ("k5", "sub_k", 5, End::Kept),
            ("k5", "sub_k", 5, End::Ok),
            ("k6", "sub_k", 6, End::Ok),
        ],
        3,
        None,
        &log,
    )
    .await;
    assert_eq!(
        answers,
        ["ran", "ran", "ran", "ran", "already_failed", "ran"]
    );
    assert_eq!(log.orders_of("sub_e"), [4, 5, 5]);
    assert_eq!(log.orders_of("sub_k"), [5, 6]);
    assert_eq!(
        single(&gate, "e4b", "sub_e", 4, End::Ok, &log).await,
        "superseded"
    );
    assert_eq!(
        single(&gate, "k5b", "sub_k", 5, End::Ok, &log).await,
        "superseded"
    );
}

/// `OutcomeCommit::Async` ("Settle, release and keep ... commit with
/// `synchronous_commit = off`"): the batch's release under it still frees
/// the entity in the same statement, its settle is still applied.
#[tokio::test]
async fn outcome_commit_async_with_ordered_events() {
    let gate = testing::gate().await;
    let log = Log::default();
    let mut b = Batch::new();
    let items: [Item; 4] = [
        ("aa7", "sub_aa", 7, End::Released),
        ("ab7", "sub_ab", 7, End::Released),
        ("ac5", "sub_ac", 5, End::Ok),
        ("ad5", "sub_ad", 5, End::Kept),
    ];
    for item in items {
        b.push_ordered(item, event(item.0), &entity(item.1), item.2);
    }
    let log_ref = &log;
    let results: Vec<Result<(), Failure>> = gate
        .guard_batch(b)
        .disposition(classify)
        .outcome_commit(idem::OutcomeCommit::Async)
        .concurrency(4)
        .run(|(key, of, order, end)| apply(log_ref, key, of, order, end))
        .await;
    assert!(results.iter().all(|r| reason(r) == "ran"), "{results:?}");
    assert_eq!(
        single(&gate, "aa3", "sub_aa", 3, End::Ok, &log).await,
        "ran"
    );
    assert_eq!(
        single(&gate, "ab3", "sub_ab", 3, End::Ok, &log).await,
        "ran"
    );
    assert_eq!(
        single(&gate, "ac3", "sub_ac", 3, End::Ok, &log).await,
        "superseded"
    );
    assert_eq!(
        single(&gate, "ad3", "sub_ad", 3, End::Ok, &log).await,
        "ran"
    );
}

/// `BatchGuard::lease`: "Should the store fail to renew it, the claim is
/// released (its body never started) and the item refused with the
/// store's error." For an ordered event, that release must free its entity
/// and apply nothing. The renewal is made to wait on the claim's row, and
/// its backend terminated.
#[tokio::test]
async fn a_renewal_killed_mid_batch_releases_the_ordered_item_and_frees_its_entity() {
    let name = testing::unique_name("rtb_renew");
    let gate = testing::gate_on(connections::named_pool(&name, 3).await).await;
    let admin_pool = testing::pool_with(2).await;
    let admin_gate = Gate::connect(admin_pool.clone())
        .await
        .unwrap()
        .account(gate.account_name());
    let log = Arc::new(Log::default());
    let task = {
        let (gate, log) = (gate.clone(), log.clone());
        tokio::spawn(async move {
            batch(
                &gate,
                &[
                    ("nx1", "sub_nx", 1, End::Sleep(1200)),
                    ("ne3", "sub_ne", 3, End::Ok),
                ],
                1,
                Some(Duration::from_millis(1000)),
                &log,
            )
            .await
        })
    };
    started(&log, "nx1").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut admin = admin_pool.begin().await.unwrap();
    let locked = idem::sqlx::query(
        "SELECT 1 FROM idem_records WHERE account = $1 AND address = $2 AND kind = 'claim' \
         FOR UPDATE",
    )
    .bind(gate.account_name())
    .bind(event("ne3").address())
    .fetch_all(&mut *admin)
    .await
    .unwrap();
    assert_eq!(locked.len(), 1);
    // The renewal is tried three times (its record backoff): each attempt
    // is killed while it waits; the release that follows then goes through.
    let mut killed = 0;
    for _ in 0..400 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        killed += connections::terminate_lock_waiters(&admin_pool, &name).await;
        if killed >= 3 {
            break;
        }
    }
    assert!(killed >= 3, "the renewal waited {killed} time(s)");
    admin.rollback().await.unwrap();
    let answers = tokio::time::timeout(Duration::from_secs(60), task)
        .await
        .expect("ends")
        .unwrap();
    assert_eq!(answers[0], "ran");
    let log2 = Log::default();
    let older = single(&admin_gate, "ne1", "sub_ne", 1, End::Ok, &log2).await;
    eprintln!(
        "batch said {answers:?}; ne3 ran {} time(s); then ne1 {older}",
        log.times("ne3")
    );
    if answers[1] == "ran" {
        // Renewed after all (retried): applied.
        assert_eq!(log.times("ne3"), 1);
        assert_eq!(older, "superseded");
    } else {
        assert_eq!(
            log.times("ne3"),
            0,
            "ne3 ran yet was refused {}",
            answers[1]
        );
        assert_eq!(
            older, "ran",
            "released: ne3 applied nothing and freed sub_ne"
        );
        assert_eq!(
            single(&admin_gate, "ne3", "sub_ne", 3, End::Ok, &log2).await,
            "ran"
        );
    }
}

/// Concurrency far above the pool: 30 ordered events of 30 entities (and
/// the same again, overlapping, from a second consumer), 16 bodies at a
/// time on a pool of 2 connections, with a lease: every event runs exactly
/// once, nothing waits forever.
#[tokio::test]
async fn concurrency_far_above_a_tiny_pool() {
    let gate = testing::gate_on(testing::pool_with(2).await).await;
    let log = Arc::new(Log::default());
    let items: Vec<Item> = (0..30)
        .map(|e| {
            (
                leak(format!("tp{e}")),
                leak(format!("sub_tp{e}")),
                1,
                End::Ok,
            )
        })
        .collect();
    let barrier = Arc::new(Barrier::new(2));
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let (gate, log, barrier, items) =
            (gate.clone(), log.clone(), barrier.clone(), items.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            until_settled(&gate, &items, 16, Duration::from_secs(20), &log, 200).await;
        }));
    }
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(120), task)
            .await
            .expect("ends")
            .unwrap();
    }
    for (key, _, _, _) in &items {
        assert_eq!(log.times(key), 1, "{key}");
    }
}

/// One `Guard::ordered` call that waits (`.wait(..)`) for an event in
/// flight.
async fn single_waiting(gate: &Gate, key: &str, of: &str, order: i64, log: &Log) -> &'static str {
    let id = event(key);
    let result: Result<(), Failure> = gate
        .guard(&id)
        .ordered(&entity(of), order)
        .disposition(classify)
        .wait(Duration::from_secs(10))
        .run(apply(log, key, of, order, End::Ok))
        .await;
    reason(&result)
}

/// Single calls that wait for the event in flight, racing two batches at
/// one instant: they queue behind the batches' events instead of being
/// refused, and still never run beside one, never after a newer one was
/// applied, never twice.
#[tokio::test]
async fn waiting_single_calls_racing_batches() {
    for round in 0..4 {
        let gate = testing::gate_on(testing::pool_with(8).await).await;
        let log = Arc::new(Log::default());
        let batches: Vec<Vec<Item>> = vec![
            vec![
                ("wa5", "sub_wa", 5, End::Sleep(20)),
                ("wa2", "sub_wa", 2, End::Sleep(20)),
                ("wb3", "sub_wb", 3, End::Sleep(20)),
                ("wa8", "sub_wa", 8, End::Sleep(20)),
            ],
            vec![
                ("wa8", "sub_wa", 8, End::Sleep(20)),
                ("wb4", "sub_wb", 4, End::Sleep(20)),
                ("wa6", "sub_wa", 6, End::Sleep(20)),
            ],
        ];
        let singles: Vec<(&str, &str, i64)> = vec![
            ("wa4", "sub_wa", 4),
            ("wa9", "sub_wa", 9),
            ("wb2", "sub_wb", 2),
            ("wa5", "sub_wa", 5),
            ("wb5", "sub_wb", 5),
        ];
        let barrier = Arc::new(Barrier::new(batches.len() + singles.len()));
        let mut tasks = Vec::new();
        for mine in batches {
            let (gate, log, barrier) = (gate.clone(), log.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                let mut pending = mine;
                for _ in 0..300 {
                    let answers = batch(&gate, &pending, 2, None, &log).await;
                    pending = pending
                        .into_iter()
                        .zip(answers)
                        .filter(|(_, answer)| *answer == "in_flight")
                        .map(|(item, _)| item)
                        .collect();
                    if pending.is_empty() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                panic!("still in flight: {pending:?}");
            }));
        }
        for (key, of, order) in singles {
            let (gate, log, barrier) = (gate.clone(), log.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                let said = single_waiting(&gate, key, of, order, &log).await;
                assert_ne!(said, "in_flight", "{key} waited and was still refused");
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        let overlaps = log.overlaps.lock().unwrap().clone();
        assert!(
            overlaps.is_empty(),
            "round {round}: ran beside another: {overlaps:?}"
        );
        let mut seen = BTreeSet::new();
        for key in log.keys() {
            assert!(seen.insert(key.clone()), "round {round}: {key} ran twice");
        }
        for (of, newest) in [("sub_wa", 9), ("sub_wb", 5)] {
            let orders = log.orders_of(of);
            assert!(
                orders.windows(2).all(|p| p[0] <= p[1]),
                "round {round}: {of} moved back: {orders:?}"
            );
            assert_eq!(
                orders.last(),
                Some(&newest),
                "round {round}: {of}: {orders:?}"
            );
        }
    }
}

/// `EventOrder` from a `SystemTime`: "Times more than 292,000 years away
/// from it hold the nearest order an `i64` can": a time 400,000 years
/// ahead equals `i64::MAX`, so both run in the batch's order (equal
/// orders), and a time 400,000 years back is superseded.
#[tokio::test]
async fn saturated_system_times_equal_the_extreme_integers() {
    let gate = testing::gate().await;
    let sub = entity("sub_sat");
    let far = Duration::from_secs(400_000 * 365 * 86_400);
    let ran = Mutex::new(Vec::new());
    let mut b = Batch::new();
    b.push_ordered("i_max", event("i_max"), &sub, i64::MAX);
    b.push_ordered("t_far", event("t_far"), &sub, UNIX_EPOCH + far);
    b.push_ordered("t_before", event("t_before"), &sub, UNIX_EPOCH - far);
    let results: Vec<Result<(), Rejected>> = gate
        .guard_batch(b)
        .run(|name| {
            ran.lock().unwrap().push(name);
            async { Ok(()) }
        })
        .await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(*ran.lock().unwrap(), ["t_before", "i_max", "t_far"]);
    let back: Result<(), Rejected> = gate
        .guard(&event("t_back"))
        .ordered(&sub, UNIX_EPOCH - far)
        .run(async { Ok(()) })
        .await;
    assert!(matches!(back, Err(Rejected::Superseded)), "{back:?}");
}
