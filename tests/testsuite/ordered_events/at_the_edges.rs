//! The promises of ordered events (`Guard::ordered`, the attribute's
//! `entity` and `order`, `EventOrder`, `Rejected::Superseded`) attacked at
//! their edges, written from their documentation alone and run against a
//! real PostgreSQL: races of many entities, every outcome, leases run out
//! and taken over, operators, transactions, faults and hostile orders.
//! Each test names the promise it attacks.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idem::operations::{
    self, ClaimState, ListFilter, NamespaceFilter, PruneFilter, ScopeFilter, Slot,
};
use idem::{
    Disposition, EventOrder, Gate, Identity, OnExpiry, OnUnavailable, Outcome, Rejected, testing,
};
use idem_test_support::connections;
use tokio::sync::{Barrier, Notify};

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

// The body's error, its dispositions and the identities: the module's.
use super::{Failure, classify, entity, event};

/// How a body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Ok,
    Released,
    Kept,
    Doubtful,
}

/// Delivers event `key` of `of` at `order`; the body ends as `end` and logs
/// `key` in `log` when it runs. Returns "ran" or the refusal's reason.
async fn go(
    gate: &Gate,
    key: &str,
    of: &Identity,
    order: impl TryInto<EventOrder, Error = impl std::fmt::Display>,
    end: End,
    log: &Mutex<Vec<String>>,
) -> &'static str {
    let id = event(key);
    let result: Result<(), Failure> = gate
        .guard(&id)
        .ordered(of, order)
        .disposition(classify)
        .run(async {
            log.lock().unwrap().push(key.to_owned());
            match end {
                End::Ok => Ok(()),
                End::Released => Err(Failure::Released),
                End::Kept => Err(Failure::Kept),
                End::Doubtful => Err(Failure::Doubtful),
            }
        })
        .await;
    match result {
        Ok(()) => "ran",
        Err(Failure::Rejected(rejected)) => rejected.reason(),
        Err(_) => "ran",
    }
}

/// A successful delivery.
async fn ok(gate: &Gate, key: &str, of: &Identity, order: i64) -> &'static str {
    let log = Mutex::new(Vec::new());
    go(gate, key, of, order, End::Ok, &log).await
}

fn slot_of<'a>(gate: &'a Gate, address: &'a str) -> Slot<'a> {
    Slot::new(gate.account_name(), gate.namespace_name(), address)
}

/// A task that runs event `key` of `of` at `order`, tells `started` once
/// its body began, then waits for `release` before ending as `end`.
fn held(
    gate: &Gate,
    key: &str,
    of: &Identity,
    order: i64,
    lease: Option<Duration>,
    end: End,
) -> (
    Arc<Notify>,
    Arc<Notify>,
    tokio::task::JoinHandle<&'static str>,
) {
    let started = Arc::new(Notify::new());
    let release = Arc::new(Notify::new());
    let (gate, key, of) = (gate.clone(), key.to_owned(), of.clone());
    let (s, r) = (started.clone(), release.clone());
    let task = tokio::spawn(async move {
        let id = event(&key);
        let body = async {
            s.notify_one();
            r.notified().await;
            match end {
                End::Ok => Ok(()),
                End::Released => Err(Failure::Released),
                End::Kept => Err(Failure::Kept),
                End::Doubtful => Err(Failure::Doubtful),
            }
        };
        let result: Result<(), Failure> = match lease {
            Some(lease) => {
                gate.guard(&id)
                    .ordered(&of, order)
                    .disposition(classify)
                    .lease(lease)
                    .run(body)
                    .await
            }
            None => {
                gate.guard(&id)
                    .ordered(&of, order)
                    .disposition(classify)
                    .run(body)
                    .await
            }
        };
        match result {
            Ok(()) => "ran",
            Err(Failure::Rejected(rejected)) => rejected.reason(),
            Err(_) => "ran",
        }
    });
    (started, release, task)
}

// ---------------------------------------------------------------------------
// Races
// ---------------------------------------------------------------------------

/// What one body run was.
#[derive(Debug, Clone)]
struct Run {
    key: String,
    order: i64,
    end: End,
}

/// Many entities, many events each (equal orders among them), each event
/// delivered three times, all at the same instant; some bodies fail
/// (released on a first attempt, or kept). Redeliveries follow `InFlight`
/// and released failures. Checked: no event succeeds twice, no two events
/// of one entity run at once, no body runs with an order below a success
/// applied before it, the successes' orders never go down, and every
/// `Superseded` is older than a success applied before the refusal.
#[tokio::test]
async fn race_many_events_of_many_entities_with_duplicates_and_failures() {
    let gate = testing::gate_on(testing::pool_with(12).await).await;
    const ENTITIES: usize = 4;
    const EVENTS: usize = 12;
    const COPIES: usize = 3;
    let mut rng = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut deliveries = Vec::new();
    let mut plans = HashMap::new();
    for e in 0..ENTITIES {
        for k in 0..EVENTS {
            let key = format!("r{e}_{k}");
            // Orders 0..8: equal orders are frequent.
            let order = (next() % 8) as i64;
            let end = match next() % 10 {
                0 | 1 => End::Released, // first attempt only
                2 => End::Kept,
                _ => End::Ok,
            };
            plans.insert(key.clone(), end);
            for _ in 0..COPIES {
                deliveries.push((e, key.clone(), order));
            }
        }
    }
    let plans = Arc::new(plans);
    let barrier = Arc::new(Barrier::new(deliveries.len()));
    let inside: Arc<Vec<AtomicUsize>> =
        Arc::new((0..ENTITIES).map(|_| AtomicUsize::new(0)).collect());
    let overlaps = Arc::new(AtomicUsize::new(0));
    let runs: Arc<Vec<Mutex<Vec<Run>>>> =
        Arc::new((0..ENTITIES).map(|_| Mutex::new(Vec::new())).collect());
    let failed_once: Arc<Mutex<HashMap<String, bool>>> = Arc::new(Mutex::new(HashMap::new()));
    let mut tasks = Vec::new();
    for (e, key, order) in deliveries {
        let (gate, barrier, inside, overlaps, runs, plans, failed_once) = (
            gate.clone(),
            barrier.clone(),
            inside.clone(),
            overlaps.clone(),
            runs.clone(),
            plans.clone(),
            failed_once.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let sub = entity(&format!("race_{e}"));
            let id = event(&key);
            barrier.wait().await;
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let result: Result<(), Failure> = gate
                    .guard(&id)
                    .ordered(&sub, order)
                    .disposition(classify)
                    .run(async {
                        if inside[e].fetch_add(1, Ordering::SeqCst) != 0 {
                            overlaps.fetch_add(1, Ordering::SeqCst);
                        }
                        let end = match plans[&key] {
                            End::Released => {
                                let mut failed = failed_once.lock().unwrap();
                                if failed.insert(key.clone(), true).is_some() {
                                    End::Ok
                                } else {
                                    End::Released
                                }
                            }
                            other => other,
                        };
                        runs[e].lock().unwrap().push(Run {
                            key: key.clone(),
                            order,
                            end,
                        });
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        inside[e].fetch_sub(1, Ordering::SeqCst);
                        match end {
                            End::Ok => Ok(()),
                            End::Released => Err(Failure::Released),
                            End::Kept => Err(Failure::Kept),
                            End::Doubtful => Err(Failure::Doubtful),
                        }
                    })
                    .await;
                let seen = runs[e].lock().unwrap().len();
                match result {
                    Err(Failure::Rejected(Rejected::InFlight)) | Err(Failure::Released) => {
                        assert!(Instant::now() < deadline, "{key}: still refused after 60 s");
                        tokio::time::sleep(Duration::from_millis(3)).await;
                    }
                    Ok(()) => return (e, key, order, "ran", seen),
                    Err(Failure::Kept) => return (e, key, order, "kept", seen),
                    Err(Failure::Doubtful) => unreachable!(),
                    Err(Failure::Rejected(rejected)) => {
                        return (e, key, order, rejected.reason(), seen);
                    }
                }
            }
        }));
    }
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.expect("a delivery panicked"));
    }
    assert_eq!(
        overlaps.load(Ordering::SeqCst),
        0,
        "two events of one entity ran at once"
    );
    for e in 0..ENTITIES {
        let runs = runs[e].lock().unwrap().clone();
        // No event succeeds twice, nor runs again after a success or a kept failure.
        let mut by_key: BTreeMap<&str, Vec<End>> = BTreeMap::new();
        for run in &runs {
            by_key.entry(&run.key).or_default().push(run.end);
        }
        for (key, ends) in &by_key {
            let finals = ends.iter().filter(|end| **end != End::Released).count();
            assert!(
                finals <= 1,
                "entity {e}: {key} ran to an end twice: {ends:?}"
            );
            if let Some(position) = ends.iter().position(|end| *end != End::Released) {
                assert_eq!(
                    position,
                    ends.len() - 1,
                    "{key} ran after its end: {ends:?}"
                );
            }
        }
        // No body runs below a success applied before it; successes never go down.
        let mut newest = i64::MIN;
        for run in &runs {
            assert!(
                run.order >= newest,
                "entity {e}: {} at {} ran after a success at {newest}: {runs:?}",
                run.key,
                run.order
            );
            if run.end == End::Ok {
                newest = run.order;
            }
        }
        for (oe, key, order, said, seen) in outcomes.iter().filter(|o| o.0 == e) {
            let _ = oe;
            match *said {
                "ran" | "kept" => assert!(by_key.contains_key(key.as_str()), "{key}"),
                "already_done" => assert!(
                    runs.iter().any(|r| &r.key == key && r.end == End::Ok),
                    "{key} already done but never succeeded"
                ),
                "already_failed" => assert!(
                    runs.iter().any(|r| &r.key == key && r.end == End::Kept),
                    "{key} already failed but never kept a failure"
                ),
                "superseded" => {
                    assert!(
                        runs[..*seen]
                            .iter()
                            .any(|r| r.end == End::Ok && r.order > *order),
                        "entity {e}: {key} at {order} superseded by nothing applied: {runs:?}"
                    );
                    assert!(
                        !runs.iter().any(|r| &r.key == key && r.end == End::Ok),
                        "{key} superseded yet it had succeeded"
                    );
                }
                other => panic!("{key}: refused {other}"),
            }
        }
    }
}

/// "An event of equal order is not older: it runs (once, by its own key):
/// two events stamped in the same second are never dropped", with twenty
/// events of one order, each delivered twice, at the same instant.
#[tokio::test]
async fn race_events_of_equal_order_all_run_exactly_once() {
    let gate = testing::gate_on(testing::pool_with(10).await).await;
    let sub = entity("equal");
    let stamp = SystemTime::now();
    let keys: Vec<String> = (0..20).map(|k| format!("eq_{k}")).collect();
    let barrier = Arc::new(Barrier::new(keys.len() * 2));
    let counts = Arc::new(Mutex::new(BTreeMap::<String, usize>::new()));
    let mut tasks = Vec::new();
    for key in [keys.clone(), keys.clone()].concat() {
        let (gate, sub, barrier, counts) =
            (gate.clone(), sub.clone(), barrier.clone(), counts.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let id = event(&key);
            loop {
                let result = gate
                    .guard(&id)
                    .ordered(&sub, stamp)
                    .run(async {
                        *counts.lock().unwrap().entry(key.clone()).or_default() += 1;
                        Ok::<(), Rejected>(())
                    })
                    .await;
                match result {
                    Err(Rejected::InFlight) => tokio::time::sleep(Duration::from_millis(2)).await,
                    Ok(()) => return "ran",
                    Err(other) => return other.reason(),
                }
            }
        }));
    }
    let mut said = Vec::new();
    for task in tasks {
        said.push(task.await.unwrap());
    }
    assert!(
        said.iter().all(|s| *s == "ran" || *s == "already_done"),
        "{said:?}"
    );
    let counts = counts.lock().unwrap().clone();
    assert_eq!(
        counts.len(),
        20,
        "an event of equal order was dropped: {counts:?}"
    );
    assert!(counts.values().all(|c| *c == 1), "{counts:?}");
}

// ---------------------------------------------------------------------------
// Outcomes
// ---------------------------------------------------------------------------

/// "A duplicate of an event that ran is told what its own slot says
/// (AlreadyDone, ...), not this [Superseded]": a kept failure older than
/// the newest applied is `AlreadyFailed`, a released one is `Superseded`.
#[tokio::test]
async fn a_duplicate_is_told_its_own_slot_not_superseded() {
    let gate = testing::gate().await;
    let log = Mutex::new(Vec::new());
    let sub = entity("dups");
    assert_eq!(go(&gate, "k3", &sub, 3, End::Kept, &log).await, "ran");
    assert_eq!(go(&gate, "r4", &sub, 4, End::Released, &log).await, "ran");
    assert_eq!(go(&gate, "s5", &sub, 5, End::Ok, &log).await, "ran");
    assert_eq!(go(&gate, "s9", &sub, 9, End::Ok, &log).await, "ran");
    assert_eq!(
        go(&gate, "k3", &sub, 3, End::Ok, &log).await,
        "already_failed"
    );
    assert_eq!(
        go(&gate, "s5", &sub, 5, End::Ok, &log).await,
        "already_done"
    );
    assert_eq!(go(&gate, "r4", &sub, 4, End::Ok, &log).await, "superseded");
    assert_eq!(*log.lock().unwrap(), ["k3", "r4", "s5", "s9"]);
}

/// A panic in the body: "in doubt ... held until a reconciler or an
/// operator resolves it". Older, newer and the event's own retry are
/// refused; resolved as succeeded, it is applied.
#[tokio::test]
async fn a_panic_in_the_body_holds_the_entity_until_resolved() {
    let gate = testing::gate().await;
    let sub = entity("panic");
    let task = {
        let (gate, sub) = (gate.clone(), sub.clone());
        tokio::spawn(async move {
            let id = event("p7");
            gate.guard(&id)
                .ordered(&sub, 7)
                .run(async {
                    if true {
                        panic!("the body panics");
                    }
                    Ok::<(), Rejected>(())
                })
                .await
        })
    };
    assert!(task.await.is_err(), "the body panicked");
    let log = Mutex::new(Vec::new());
    assert_eq!(go(&gate, "p3", &sub, 3, End::Ok, &log).await, "in_flight");
    assert_eq!(go(&gate, "p9", &sub, 9, End::Ok, &log).await, "in_flight");
    let own = go(&gate, "p7", &sub, 7, End::Ok, &log).await;
    assert!(own == "in_flight" || own == "in_doubt", "{own}");
    let address = event("p7").address();
    let resolved = operations::resolve(
        gate.pool(),
        slot_of(&gate, &address),
        Outcome::Succeeded(None),
    )
    .await
    .expect("resolve");
    assert!(
        matches!(resolved, operations::Resolved::Changed { .. }),
        "{resolved:?}"
    );
    assert_eq!(go(&gate, "p3", &sub, 3, End::Ok, &log).await, "superseded");
    assert_eq!(
        go(&gate, "p7", &sub, 7, End::Ok, &log).await,
        "already_done"
    );
    assert_eq!(go(&gate, "p7b", &sub, 7, End::Ok, &log).await, "ran");
    assert_eq!(go(&gate, "p9", &sub, 9, End::Ok, &log).await, "ran");
    assert!(log.lock().unwrap().iter().all(|k| k != "p3"));
}

/// A dropped future (a task aborted mid-body) holds the entity; an
/// operator's release frees it ("freed, nothing applied").
#[tokio::test]
async fn a_task_cancelled_mid_body_holds_the_entity_until_released() {
    let gate = testing::gate().await;
    let sub = entity("abort");
    let (started, _release, task) = held(&gate, "a7", &sub, 7, None, End::Ok);
    started.notified().await;
    task.abort();
    let _ = task.await;
    let log = Mutex::new(Vec::new());
    assert_eq!(go(&gate, "a3", &sub, 3, End::Ok, &log).await, "in_flight");
    assert_eq!(go(&gate, "a9", &sub, 9, End::Ok, &log).await, "in_flight");
    let address = event("a7").address();
    let released = operations::release_pending(gate.pool(), slot_of(&gate, &address))
        .await
        .expect("release");
    assert!(released.is_some());
    assert_eq!(go(&gate, "a3", &sub, 3, End::Ok, &log).await, "ran");
    assert_eq!(go(&gate, "a7", &sub, 7, End::Ok, &log).await, "ran");
    assert_eq!(go(&gate, "a5", &sub, 5, End::Ok, &log).await, "superseded");
}

/// `Disposition::InDoubt` resolved by an operator as released, kept, or
/// succeeded, checked on a newer event too ("held until resolved").
#[tokio::test]
async fn in_doubt_resolved_each_way_moves_the_entity_as_the_table_says() {
    let gate = testing::gate().await;
    let log = Mutex::new(Vec::new());
    for (n, resolution, older_then, own_then) in [
        (0, Outcome::Succeeded(None), "superseded", "already_done"),
        (1, Outcome::Failed(Disposition::Release), "ran", "ran"),
        (
            2,
            Outcome::Failed(Disposition::Keep),
            "ran",
            "already_failed",
        ),
    ] {
        let sub = entity(&format!("doubt_{n}"));
        let (k7, k3, k9) = (format!("d7_{n}"), format!("d3_{n}"), format!("d9_{n}"));
        assert_eq!(go(&gate, &k7, &sub, 7, End::Doubtful, &log).await, "ran");
        assert_eq!(go(&gate, &k7, &sub, 7, End::Ok, &log).await, "in_doubt");
        assert_eq!(go(&gate, &k9, &sub, 9, End::Ok, &log).await, "in_flight");
        let address = event(&k7).address();
        operations::resolve(gate.pool(), slot_of(&gate, &address), resolution)
            .await
            .expect("resolve");
        assert_eq!(
            go(&gate, &k3, &sub, 3, End::Ok, &log).await,
            older_then,
            "{n}"
        );
        assert_eq!(
            go(&gate, &k7, &sub, 7, End::Ok, &log).await,
            own_then,
            "{n}"
        );
        assert_eq!(go(&gate, &k9, &sub, 9, End::Ok, &log).await, "ran", "{n}");
    }
}

/// The claim's own `on_expiry` holds: an ordered event claimed with
/// `InDoubt` whose retry says nothing (take over, the default) is held in
/// doubt all the same, and so is its entity.
#[tokio::test]
async fn a_retry_that_would_take_over_holds_an_event_claimed_in_doubt_on_expiry() {
    let gate = testing::gate().await;
    let sub = entity("lease_doubt_mixed");
    let id = event("ldm7");
    let claim = gate
        .guard(&id)
        .ordered(&sub, 7)
        .lease(Duration::from_millis(300))
        .on_expiry(OnExpiry::InDoubt)
        .claim()
        .await
        .expect("claimed");
    tokio::time::sleep(Duration::from_millis(700)).await;
    let log = Mutex::new(Vec::new());
    let own: Result<(), Rejected> = gate
        .guard(&id)
        .ordered(&sub, 7)
        .lease(Duration::from_millis(300))
        .run(async { panic!("ldm7 ran again, claimed in doubt on expiry") })
        .await;
    assert!(matches!(own, Err(Rejected::InDoubt)), "{own:?}");
    assert_eq!(go(&gate, "ldm9", &sub, 9, End::Ok, &log).await, "in_flight");
    drop(claim);
}

/// "A lease that runs out leaves the entity with the event whose lease it
/// was, for its own retry to take over": other events (older and newer)
/// are refused meanwhile; the event's own retry takes over and, once it
/// succeeds, is applied.
#[tokio::test]
async fn a_lease_run_out_is_taken_over_by_the_event_s_own_retry_only() {
    let gate = testing::gate().await;
    let sub = entity("lease");
    let (started, release, first) = held(
        &gate,
        "l7",
        &sub,
        7,
        Some(Duration::from_millis(500)),
        End::Ok,
    );
    started.notified().await;
    tokio::time::sleep(Duration::from_millis(900)).await;
    let log = Mutex::new(Vec::new());
    assert_eq!(go(&gate, "l3", &sub, 3, End::Ok, &log).await, "in_flight");
    assert_eq!(go(&gate, "l9", &sub, 9, End::Ok, &log).await, "in_flight");
    let id = event("l7");
    let retry: Result<(), Rejected> = gate
        .guard(&id)
        .ordered(&sub, 7)
        .lease(Duration::from_secs(30))
        .run(async { Ok(()) })
        .await;
    assert!(retry.is_ok(), "the event's own retry takes over: {retry:?}");
    release.notify_one();
    let late = first.await.unwrap();
    assert_eq!(late, "lease_lost");
    assert_eq!(go(&gate, "l3", &sub, 3, End::Ok, &log).await, "superseded");
    assert_eq!(go(&gate, "l9", &sub, 9, End::Ok, &log).await, "ran");
}

/// A lease run out under `on_expiry = InDoubt`: held until resolved.
#[tokio::test]
async fn a_lease_run_out_in_doubt_holds_the_entity() {
    let gate = testing::gate().await;
    let sub = entity("lease_doubt");
    let id = event("ld7");
    let claim = gate
        .guard(&id)
        .ordered(&sub, 7)
        .lease(Duration::from_millis(300))
        .on_expiry(OnExpiry::InDoubt)
        .claim()
        .await
        .expect("claimed");
    tokio::time::sleep(Duration::from_millis(700)).await;
    let log = Mutex::new(Vec::new());
    let own: Result<(), Rejected> = gate
        .guard(&id)
        .ordered(&sub, 7)
        .lease(Duration::from_millis(300))
        .on_expiry(OnExpiry::InDoubt)
        .run(async { panic!("ld7 ran again, in doubt") })
        .await;
    assert!(matches!(own, Err(Rejected::InDoubt)), "{own:?}");
    assert_eq!(go(&gate, "ld3", &sub, 3, End::Ok, &log).await, "in_flight");
    assert_eq!(go(&gate, "ld9", &sub, 9, End::Ok, &log).await, "in_flight");
    // The holder's late success settles the doubt: applied.
    claim
        .settle()
        .await
        .expect("a late success settles the doubt");
    assert_eq!(go(&gate, "ld3", &sub, 3, End::Ok, &log).await, "superseded");
    assert_eq!(go(&gate, "ld9", &sub, 9, End::Ok, &log).await, "ran");
    assert!(log.lock().unwrap().iter().all(|k| k != "ld3" && k != "ld7"));
}

/// "A lease that runs out leaves the entity with the event whose lease it
/// was, for its own retry": the holder is counted gone, for its entity as
/// for its own slot. A lease runs out while its body still runs; the
/// event's own retry takes over and fails (released: nothing applied), and
/// the entity is free for an older event, beside the first body, still
/// running, which is told `LeaseLost` when it ends, its success recorded
/// and applied.
#[tokio::test]
async fn a_holder_past_its_lease_is_counted_gone_for_its_entity_too() {
    let gate = testing::gate().await;
    let sub = entity("stale");
    let (started, release, first) = held(
        &gate,
        "s7",
        &sub,
        7,
        Some(Duration::from_millis(400)),
        End::Ok,
    );
    started.notified().await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    let id = event("s7");
    let retry: Result<(), Failure> = gate
        .guard(&id)
        .ordered(&sub, 7)
        .disposition(classify)
        .lease(Duration::from_secs(30))
        .run(async { Err(Failure::Released) })
        .await;
    assert!(matches!(retry, Err(Failure::Released)), "{retry:?}");
    // s7's first body is still running here, past its lease.
    let log = Mutex::new(Vec::new());
    let beside = go(&gate, "s3", &sub, 3, End::Ok, &log).await;
    assert_eq!(
        beside, "ran",
        "the entity was free once the takeover released"
    );
    release.notify_one();
    let late = first.await.expect("the first body");
    assert_eq!(late, "lease_lost");
    assert_eq!(go(&gate, "s5", &sub, 5, End::Ok, &log).await, "superseded");
}

/// "Applied is a recorded success: ... an earlier holder's late success".
/// A lease runs out; the event's own retry takes over and releases; then
/// the first holder's body succeeds late: the run docs say "the success is
/// still kept in the slot". An older event must now be superseded.
#[tokio::test]
async fn a_late_success_after_the_take_over_released_is_applied() {
    let gate = testing::gate().await;
    let sub = entity("late");
    let (started, release, first) = held(
        &gate,
        "t7",
        &sub,
        7,
        Some(Duration::from_millis(400)),
        End::Ok,
    );
    started.notified().await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    let id = event("t7");
    let retry: Result<(), Failure> = gate
        .guard(&id)
        .ordered(&sub, 7)
        .disposition(classify)
        .lease(Duration::from_secs(30))
        .run(async { Err(Failure::Released) })
        .await;
    assert!(matches!(retry, Err(Failure::Released)), "{retry:?}");
    release.notify_one();
    let late = first.await.unwrap();
    let log = Mutex::new(Vec::new());
    let own = go(&gate, "t7", &sub, 7, End::Ok, &log).await;
    let older = go(&gate, "t5", &sub, 5, End::Ok, &log).await;
    if own == "already_done" {
        // The slot records t7's success: t7 is applied, t5 is older.
        assert_eq!(
            older, "superseded",
            "t7's late success ({late}) is recorded (t7 is already_done) yet t5, older, ran"
        );
    } else {
        // The late success was not kept: then t7 ran again.
        assert_eq!(own, "ran", "late = {late}");
    }
}

/// An operator releases a pending event whose body is still running
/// ("freed, nothing applied"); then the body succeeds: the run docs say
/// "the success is still kept in the slot" (ClaimLost). Is it applied?
#[tokio::test]
async fn an_operator_release_under_a_running_body_then_its_success() {
    let gate = testing::gate().await;
    let sub = entity("op_release");
    let (started, release, first) = held(&gate, "o7", &sub, 7, None, End::Ok);
    started.notified().await;
    let address = event("o7").address();
    let released = operations::release_pending(gate.pool(), slot_of(&gate, &address))
        .await
        .expect("release");
    assert!(released.is_some());
    release.notify_one();
    let said = first.await.unwrap();
    assert_eq!(said, "claim_lost");
    let log = Mutex::new(Vec::new());
    let own = go(&gate, "o7", &sub, 7, End::Ok, &log).await;
    let older = go(&gate, "o5", &sub, 5, End::Ok, &log).await;
    if own == "already_done" {
        assert_eq!(
            older, "superseded",
            "o7's success is recorded yet o5, older, ran"
        );
    } else {
        assert_eq!(own, "ran");
    }
}

/// Inside a transaction: "the entity is taken with the claim ... and other
/// events of it wait for your commit"; once committed with a success, an
/// older event is superseded and a newer one runs.
#[tokio::test]
async fn tx_commit_others_wait_for_it_then_see_it_applied() {
    let gate = testing::gate_on(testing::pool_with(6).await).await;
    let sub = entity("tx_commit");
    let id = event("x9");
    let mut tx = gate.pool().begin().await.expect("begin");
    let claim = gate
        .guard(&id)
        .ordered(&sub, 9)
        .tx(&mut tx)
        .claim()
        .await
        .expect("claim");
    claim.settle(&mut tx).await.expect("settle in tx");
    let waiter = |key: &'static str, order: i64| {
        let (gate, sub) = (gate.clone(), sub.clone());
        tokio::spawn(async move { ok(&gate, key, &sub, order).await })
    };
    let older = waiter("x4", 4);
    let newer = waiter("x12", 12);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!older.is_finished(), "x4 did not wait for the commit");
    assert!(!newer.is_finished(), "x12 did not wait for the commit");
    tx.commit().await.expect("commit");
    let (older, newer) = (older.await.unwrap(), newer.await.unwrap());
    assert_eq!(
        (older, newer),
        ("superseded", "ran"),
        "events that waited for the commit are refused, although nothing of the entity runs"
    );
}

/// "handed back if the transaction rolls back", even after a settle inside it.
#[tokio::test]
async fn tx_rollback_after_a_settle_hands_the_entity_back() {
    let gate = testing::gate_on(testing::pool_with(6).await).await;
    let sub = entity("tx_rollback");
    assert_eq!(ok(&gate, "y2", &sub, 2).await, "ran");
    let id = event("y9");
    let mut tx = gate.pool().begin().await.expect("begin");
    let result: Result<(), Rejected> = gate
        .guard(&id)
        .ordered(&sub, 9)
        .tx(&mut tx)
        .run(async |_conn: &mut idem::sqlx::PgConnection| Ok(()))
        .await;
    assert!(result.is_ok(), "{result:?}");
    let waiting = {
        let (gate, sub) = (gate.clone(), sub.clone());
        tokio::spawn(async move { ok(&gate, "y4", &sub, 4).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiting.is_finished(),
        "y4 did not wait for the transaction"
    );
    tx.rollback().await.expect("rollback");
    assert_eq!(waiting.await.unwrap(), "ran");
    assert_eq!(ok(&gate, "y1", &sub, 1).await, "superseded");
    assert_eq!(ok(&gate, "y9", &sub, 9).await, "ran");
}

/// Two events of one entity in one transaction: the first settled, an
/// older one in the same transaction is superseded, a newer one runs;
/// another transaction's event waits, then sees them.
#[tokio::test]
async fn tx_several_events_of_one_entity_in_one_transaction() {
    let gate = testing::gate_on(testing::pool_with(6).await).await;
    let sub = entity("tx_many");
    let mut tx = gate.pool().begin().await.expect("begin");
    let (a, b, c, d) = (event("z9"), event("z4"), event("z12"), event("z13"));
    let first: Result<(), Rejected> = gate
        .guard(&a)
        .ordered(&sub, 9)
        .tx(&mut tx)
        .run(async |_conn: &mut idem::sqlx::PgConnection| Ok(()))
        .await;
    assert!(first.is_ok(), "{first:?}");
    let older: Result<(), Rejected> = gate
        .guard(&b)
        .ordered(&sub, 4)
        .tx(&mut tx)
        .run(async |_conn: &mut idem::sqlx::PgConnection| {
            panic!("z4 is older than z9, applied in this transaction")
        })
        .await;
    assert!(matches!(older, Err(Rejected::Superseded)), "{older:?}");
    let newer: Result<(), Rejected> = gate
        .guard(&c)
        .ordered(&sub, 12)
        .tx(&mut tx)
        .run(async |_conn: &mut idem::sqlx::PgConnection| Ok(()))
        .await;
    assert!(newer.is_ok(), "{newer:?}");
    // A claim left pending in the transaction holds the entity for the next one.
    let pending = gate
        .guard(&d)
        .ordered(&sub, 13)
        .tx(&mut tx)
        .claim()
        .await
        .expect("z13");
    let beside: Result<(), Rejected> = gate
        .guard(&event("z14"))
        .ordered(&sub, 14)
        .tx(&mut tx)
        .run(async |_conn: &mut idem::sqlx::PgConnection| {
            panic!("z14 runs beside z13, pending in the same transaction")
        })
        .await;
    assert!(matches!(beside, Err(Rejected::InFlight)), "{beside:?}");
    pending.settle(&mut tx).await.expect("z13 settled");
    tx.commit().await.expect("commit");
    assert_eq!(ok(&gate, "z11", &sub, 11).await, "superseded");
    assert_eq!(ok(&gate, "z13b", &sub, 13).await, "ran");
}

/// "with wait, waits for it": an event waiting on one in doubt does not
/// run (it waits, then is refused), and returns within its wait.
#[tokio::test]
async fn wait_behind_an_event_in_doubt_never_runs() {
    let gate = testing::gate().await;
    let sub = entity("wait_doubt");
    let log = Mutex::new(Vec::new());
    assert_eq!(go(&gate, "w7", &sub, 7, End::Doubtful, &log).await, "ran");
    let id = event("w9");
    let began = Instant::now();
    let waited: Result<(), Rejected> = gate
        .guard(&id)
        .ordered(&sub, 9)
        .wait(Duration::from_millis(800))
        .run(async { panic!("w9 ran beside w7, in doubt") })
        .await;
    assert!(
        matches!(waited, Err(Rejected::InFlight | Rejected::InDoubt)),
        "{waited:?}"
    );
    assert!(began.elapsed() < Duration::from_secs(5));
}

/// `wait` on a holder that releases: the waiter then runs (newer) or runs
/// too (older: nothing was applied).
#[tokio::test]
async fn wait_behind_a_released_failure_runs_the_older_event() {
    let gate = testing::gate().await;
    let sub = entity("wait_release");
    let (started, release, first) = held(&gate, "v7", &sub, 7, None, End::Released);
    started.notified().await;
    let waiter = {
        let (gate, sub) = (gate.clone(), sub.clone());
        tokio::spawn(async move {
            let id = event("v3");
            gate.guard(&id)
                .ordered(&sub, 3)
                .wait(Duration::from_secs(20))
                .run(async { Ok::<(), Rejected>(()) })
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished());
    release.notify_one();
    assert_eq!(first.await.unwrap(), "ran");
    let waited = waiter.await.unwrap();
    assert!(waited.is_ok(), "v3 after v7's released failure: {waited:?}");
}

// ---------------------------------------------------------------------------
// Faults
// ---------------------------------------------------------------------------

async fn lock_entity_row(admin: &mut idem::sqlx::PgConnection, gate: &Gate, of: &Identity) -> i64 {
    idem::sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT 1 FROM idem_records WHERE account = $1 AND address = $2 \
         AND kind = 'entity' FOR UPDATE) locked",
    )
    .bind(gate.account_name())
    .bind(of.address())
    .fetch_one(admin)
    .await
    .expect("lock the entity row")
}

/// A backend terminated while its claim waits on the entity's row (mid
/// claim): the claim is refused `Unavailable`, nothing is taken, and the
/// event runs on redelivery; the entity's order is intact.
#[tokio::test]
async fn a_backend_terminated_mid_claim_leaves_the_entity_as_it_was() {
    let name = testing::unique_name("rt_kill");
    let pool = connections::named_pool(&name, 3).await;
    let gate = testing::gate_on(pool).await;
    let admin_pool = testing::pool_with(2).await;
    let admin_gate = Gate::connect(admin_pool.clone())
        .await
        .unwrap()
        .account(gate.account_name());
    let sub = entity("kill");
    assert_eq!(ok(&gate, "k5", &sub, 5).await, "ran");
    let mut admin = admin_pool.begin().await.unwrap();
    assert_eq!(lock_entity_row(&mut admin, &gate, &sub).await, 1);
    let ran = Arc::new(AtomicBool::new(false));
    let claim = {
        let (gate, sub, ran) = (gate.clone(), sub.clone(), ran.clone());
        tokio::spawn(async move {
            let id = event("k8");
            gate.guard(&id)
                .ordered(&sub, 8)
                .run(async move {
                    ran.store(true, Ordering::SeqCst);
                    Ok::<(), Rejected>(())
                })
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
    assert!(killed > 0, "the claim never waited on the entity's row");
    let result = claim.await.unwrap();
    admin.rollback().await.unwrap();
    assert!(!ran.load(Ordering::SeqCst), "the body ran: {result:?}");
    assert!(
        matches!(result, Err(Rejected::Unavailable { .. })),
        "{result:?}"
    );
    assert_eq!(ok(&admin_gate, "k3", &sub, 3).await, "superseded");
    assert_eq!(ok(&admin_gate, "k8", &sub, 8).await, "ran");
    assert_eq!(ok(&admin_gate, "k6", &sub, 6).await, "superseded");
}

/// A backend terminated while the success is being recorded (mid body's
/// end): fail closed, the entity is held (nothing older, nothing beside).
#[tokio::test]
async fn a_backend_terminated_mid_settle_holds_the_entity() {
    let name = testing::unique_name("rt_kill_settle");
    let pool = connections::named_pool(&name, 3).await;
    let gate = testing::gate_on(pool).await;
    let admin_pool = testing::pool_with(2).await;
    let admin_gate = Gate::connect(admin_pool.clone())
        .await
        .unwrap()
        .account(gate.account_name());
    let sub = entity("kill_settle");
    let go_on = Arc::new(Notify::new());
    let started = Arc::new(Notify::new());
    let task = {
        let (gate, sub, go_on, started) =
            (gate.clone(), sub.clone(), go_on.clone(), started.clone());
        tokio::spawn(async move {
            let id = event("m7");
            gate.guard(&id)
                .ordered(&sub, 7)
                .run(async move {
                    started.notify_one();
                    go_on.notified().await;
                    Ok::<(), Rejected>(())
                })
                .await
        })
    };
    started.notified().await;
    let mut admin = admin_pool.begin().await.unwrap();
    let address = event("m7").address();
    idem::sqlx::query("SELECT 1 FROM idem_records WHERE account = $1 AND address = $2 AND kind = 'claim' FOR UPDATE")
        .bind(gate.account_name())
        .bind(&address)
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
    assert!(killed > 0, "the settle never waited");
    admin.rollback().await.unwrap();
    let said = tokio::time::timeout(Duration::from_secs(60), task)
        .await
        .expect("the run ends")
        .unwrap();
    let own = ok(&admin_gate, "m7", &sub, 7).await;
    if own == "already_done" {
        // The settle was retried and landed: applied.
        assert_eq!(
            ok(&admin_gate, "m3", &sub, 3).await,
            "superseded",
            "{said:?}"
        );
        assert_eq!(ok(&admin_gate, "m9", &sub, 9).await, "ran", "{said:?}");
    } else {
        // Not recorded: fail closed, the entity is held.
        assert_eq!(own, "in_flight", "{said:?}");
        assert_eq!(ok(&admin_gate, "m3", &sub, 3).await, "in_flight");
        assert_eq!(ok(&admin_gate, "m9", &sub, 9).await, "in_flight");
    }
}

/// A claim dropped at a random point (its future aborted while the claim
/// statement may be in flight): an event never runs twice, and an entity
/// that refuses `InFlight` has a pending event that holds it.
#[tokio::test]
async fn dropping_the_claim_in_flight_never_strands_the_entity() {
    let gate = testing::gate_on(testing::pool_with(4).await).await;
    let sub = entity("drop");
    let runs = Arc::new(Mutex::new(BTreeMap::<String, usize>::new()));
    for round in 0..40_u64 {
        let key = format!("dr_{round}");
        let order = round as i64;
        let task = {
            let (gate, sub, runs, key) = (gate.clone(), sub.clone(), runs.clone(), key.clone());
            tokio::spawn(async move {
                let id = event(&key);
                gate.guard(&id)
                    .ordered(&sub, order)
                    .run(async {
                        *runs.lock().unwrap().entry(key.clone()).or_default() += 1;
                        Ok::<(), Rejected>(())
                    })
                    .await
            })
        };
        tokio::time::sleep(Duration::from_micros(round * 137 % 4000)).await;
        task.abort();
        let _ = task.await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let again = {
            let id = event(&key);
            gate.guard(&id)
                .ordered(&sub, order)
                .run(async {
                    *runs.lock().unwrap().entry(key.clone()).or_default() += 1;
                    Ok::<(), Rejected>(())
                })
                .await
        };
        match again {
            Ok(()) | Err(Rejected::AlreadyDone) => {}
            Err(Rejected::InFlight) => {
                // It must be held by a pending claim: its own.
                let pending = operations::list(
                    gate.pool(),
                    &ListFilter::new()
                        .scope(
                            ScopeFilter::new()
                                .account(gate.account_name())
                                .namespace(NamespaceFilter::Any),
                        )
                        .state(ClaimState::Pending),
                )
                .await
                .unwrap();
                assert_eq!(
                    pending.len(),
                    1,
                    "round {round}: refused in flight, held by {pending:?}"
                );
                operations::release_pending(gate.pool(), pending[0].slot())
                    .await
                    .unwrap();
                // Released by an operator: may run again (its body may have begun).
                let third = ok(&gate, &key, &sub, order).await;
                assert_eq!(third, "ran", "round {round}");
            }
            Err(other) => panic!("round {round}: {other:?}"),
        }
        let next = ok(&gate, &format!("probe_{round}"), &sub, order).await;
        assert_eq!(next, "ran", "round {round}: the entity is stranded");
    }
}

// ---------------------------------------------------------------------------
// Hostile input
// ---------------------------------------------------------------------------

/// The extremes of an `i64`: a first event at `i64::MIN` runs, equal runs,
/// `i64::MAX` holds, and nothing below it runs after it.
#[tokio::test]
async fn extreme_orders() {
    let gate = testing::gate().await;
    let sub = entity("extremes");
    assert_eq!(ok(&gate, "min_a", &sub, i64::MIN).await, "ran");
    assert_eq!(ok(&gate, "min_b", &sub, i64::MIN).await, "ran");
    assert_eq!(ok(&gate, "neg", &sub, -5).await, "ran");
    assert_eq!(ok(&gate, "min_c", &sub, i64::MIN).await, "superseded");
    assert_eq!(ok(&gate, "zero", &sub, 0).await, "ran");
    assert_eq!(ok(&gate, "max_a", &sub, i64::MAX).await, "ran");
    assert_eq!(ok(&gate, "max_m1", &sub, i64::MAX - 1).await, "superseded");
    assert_eq!(ok(&gate, "max_b", &sub, i64::MAX).await, "ran");
    // A fresh entity whose very first event is at i64::MIN, failing kept,
    // then again at i64::MIN.
    let fresh = entity("extremes_fresh");
    let log = Mutex::new(Vec::new());
    assert_eq!(
        go(&gate, "f1", &fresh, i64::MIN, End::Kept, &log).await,
        "ran"
    );
    assert_eq!(
        go(&gate, "f2", &fresh, i64::MIN, End::Released, &log).await,
        "ran"
    );
    assert_eq!(
        go(&gate, "f3", &fresh, i64::MIN, End::Ok, &log).await,
        "ran"
    );
}

/// Conversions: beyond an i64 refused `InvalidOption` before any statement
/// (u64, usize, i128 both ways, u128); `i64` and smaller types accepted.
#[tokio::test]
async fn orders_beyond_an_i64_are_refused_before_any_statement() {
    let gate = testing::gate().await;
    let sub = entity("conversions");
    let id = event("c1");
    let refused = |r: Result<(), Rejected>| matches!(r, Err(Rejected::InvalidOption { option, .. }) if option == "order");
    let body = || async { panic!("must not run") };
    assert!(refused(
        gate.guard(&id)
            .ordered(&sub, (i64::MAX as u64) + 1)
            .run(body())
            .await
    ));
    assert!(refused(
        gate.guard(&id).ordered(&sub, u128::MAX).run(body()).await
    ));
    assert!(refused(
        gate.guard(&id).ordered(&sub, i128::MIN).run(body()).await
    ));
    assert!(refused(
        gate.guard(&id)
            .ordered(&sub, (i64::MIN as i128) - 1)
            .run(body())
            .await
    ));
    assert!(refused(
        gate.guard(&id).ordered(&sub, usize::MAX).run(body()).await
    ));
    assert_eq!(
        EventOrder::try_from(i64::MAX as u64).unwrap().get(),
        i64::MAX
    );
    assert_eq!(EventOrder::from(-1_i8).get(), -1);
    assert_eq!(EventOrder::from(u32::MAX).get(), u32::MAX as i64);
    let ran: Result<(), Rejected> = gate
        .guard(&id)
        .ordered(&sub, i64::MAX as u64)
        .run(async { Ok(()) })
        .await;
    assert!(ran.is_ok(), "{ran:?}");
}

/// Times: before 1970 negative and ordered; microseconds kept (one µs is
/// newer); far past and far future saturate and stay ordered.
#[tokio::test]
async fn system_times_before_1970_and_far_away() {
    let gate = testing::gate().await;
    let sub = entity("times");
    let t = |micros: i64| {
        if micros >= 0 {
            UNIX_EPOCH + Duration::from_micros(micros as u64)
        } else {
            UNIX_EPOCH - Duration::from_micros(micros.unsigned_abs())
        }
    };
    assert_eq!(EventOrder::from(t(-1)).get(), -1);
    assert_eq!(
        EventOrder::from(UNIX_EPOCH - Duration::from_nanos(1)).get(),
        0,
        "-1 ns rounds to?"
    );
    let log = Mutex::new(Vec::new());
    assert_eq!(
        go(&gate, "t_a", &sub, t(-20_000_000), End::Ok, &log).await,
        "ran"
    );
    assert_eq!(
        go(&gate, "t_b", &sub, t(-30_000_000), End::Ok, &log).await,
        "superseded"
    );
    assert_eq!(
        go(&gate, "t_c", &sub, t(-19_999_999), End::Ok, &log).await,
        "ran"
    );
    assert_eq!(
        go(&gate, "t_d", &sub, t(-20_000_000), End::Ok, &log).await,
        "superseded"
    );
    assert_eq!(go(&gate, "t_e", &sub, t(5), End::Ok, &log).await, "ran");
    // Same microsecond, different nanoseconds: equal, both run.
    let now = UNIX_EPOCH + Duration::new(1_700_000_000, 123_456_000);
    assert_eq!(
        go(
            &gate,
            "t_f",
            &sub,
            now + Duration::from_nanos(999),
            End::Ok,
            &log
        )
        .await,
        "ran"
    );
    assert_eq!(go(&gate, "t_g", &sub, now, End::Ok, &log).await, "ran");
    if let Some(far) = UNIX_EPOCH.checked_add(Duration::from_secs(400_000 * 365 * 86_400)) {
        assert_eq!(EventOrder::from(far).get(), i64::MAX);
        assert_eq!(go(&gate, "t_far", &sub, far, End::Ok, &log).await, "ran");
    }
    if let Some(past) = UNIX_EPOCH.checked_sub(Duration::from_secs(400_000 * 365 * 86_400)) {
        assert!(EventOrder::from(past).get() < EventOrder::from(t(-1)).get());
    }
}

/// The same key delivered for another entity: a duplicate, told its slot;
/// the other entity must not be moved (nothing was applied to it).
#[tokio::test]
async fn the_same_key_for_another_entity_does_not_move_that_entity() {
    let gate = testing::gate().await;
    let (a, b) = (entity("same_key_a"), entity("same_key_b"));
    assert_eq!(ok(&gate, "e100", &a, 100).await, "ran");
    assert_eq!(ok(&gate, "e100", &b, 100).await, "already_done");
    assert_eq!(
        ok(&gate, "b50", &b, 50).await,
        "ran",
        "b was moved by a duplicate of a's event"
    );
    assert_eq!(ok(&gate, "a50", &a, 50).await, "superseded");
}

/// The same key in flight for entity A delivered for entity B: refused
/// in flight; once it ends on A, B has had nothing applied nor running.
#[tokio::test]
async fn the_same_key_in_flight_for_another_entity_does_not_hold_that_entity() {
    let gate = testing::gate().await;
    let (a, b) = (entity("inflight_a"), entity("inflight_b"));
    let (started, release, first) = held(&gate, "g100", &a, 100, None, End::Ok);
    started.notified().await;
    assert_eq!(ok(&gate, "g100", &b, 100).await, "in_flight");
    assert_eq!(
        ok(&gate, "b1", &b, 1).await,
        "ran",
        "b is held by a's event"
    );
    release.notify_one();
    assert_eq!(first.await.unwrap(), "ran");
    assert_eq!(ok(&gate, "b2", &b, 2).await, "ran", "b moved by a's event");
}

/// An event of A fails released; its key is then reused for an event of B
/// at a greater order, which succeeds. Nothing was ever applied to A: an
/// event of A at any order must run.
#[tokio::test]
async fn a_released_key_reused_for_another_entity_does_not_move_the_first() {
    let gate = testing::gate().await;
    let (a, b) = (entity("reuse_a"), entity("reuse_b"));
    let log = Mutex::new(Vec::new());
    assert_eq!(go(&gate, "h7", &a, 7, End::Released, &log).await, "ran");
    assert_eq!(go(&gate, "h7", &b, 100, End::Ok, &log).await, "ran");
    assert_eq!(
        ok(&gate, "a50", &a, 50).await,
        "ran",
        "a was moved by b's event"
    );
    // And pending: a key released on A, then pending on B, must not hold A.
    let (c, d) = (entity("reuse_c"), entity("reuse_d"));
    assert_eq!(go(&gate, "h8", &c, 8, End::Released, &log).await, "ran");
    let (started, release, on_d) = held(&gate, "h8", &d, 100, None, End::Ok);
    started.notified().await;
    let on_c = ok(&gate, "c1", &c, 1).await;
    release.notify_one();
    assert_eq!(on_d.await.unwrap(), "ran");
    assert_eq!(on_c, "ran", "c is held by d's event");
    assert_eq!(ok(&gate, "c2", &c, 2).await, "ran", "c moved by d's event");
}

/// The same key redelivered with another order: its slot answers
/// (AlreadyDone), whatever the order; after a release it is a new event.
#[tokio::test]
async fn the_same_key_with_another_order() {
    let gate = testing::gate().await;
    let sub = entity("other_order");
    let log = Mutex::new(Vec::new());
    assert_eq!(go(&gate, "q5", &sub, 5, End::Ok, &log).await, "ran");
    assert_eq!(
        go(&gate, "q5", &sub, 1, End::Ok, &log).await,
        "already_done"
    );
    assert_eq!(
        go(&gate, "q5", &sub, 50, End::Ok, &log).await,
        "already_done"
    );
    assert_eq!(go(&gate, "q6", &sub, 6, End::Ok, &log).await, "ran");
    // Superseded "never will [run] for this event": redelivered with a
    // greater order (the provider re-stamped it), does it run?
    assert_eq!(go(&gate, "q3", &sub, 3, End::Ok, &log).await, "superseded");
    let again = go(&gate, "q3", &sub, 9, End::Ok, &log).await;
    assert_eq!(again, "ran", "an event's order is what its delivery says");
}

/// An entity with a `None` part anywhere is refused `InvalidOption`, the
/// body not run, and nothing written.
#[tokio::test]
async fn an_entity_with_an_absent_part_anywhere_is_refused() {
    let gate = testing::gate().await;
    let id = event("n1");
    for absent in [
        Identity::new("subscription").part("x").part(None::<&str>),
        Identity::new("subscription").part(None::<i64>).part("y"),
    ] {
        let result: Result<(), Rejected> = gate
            .guard(&id)
            .ordered(&absent, 1)
            .run(async { panic!("ran") })
            .await;
        assert!(
            matches!(&result, Err(Rejected::InvalidOption { option, .. }) if *option == "entity"),
            "{result:?}"
        );
    }
    assert_eq!(ok(&gate, "n1", &entity("n"), 1).await, "ran");
}

/// An event whose own key is absent (a `None` part: an ungated claim by
/// the claim docs) of an entity whose newest applied event is newer: "an
/// older event never runs after a newer one".
#[tokio::test]
async fn an_event_with_an_absent_key_older_than_the_applied_one() {
    let gate = testing::gate().await;
    let sub = entity("absent_key");
    assert_eq!(ok(&gate, "u10", &sub, 10).await, "ran");
    let id = Identity::new("subscription_event").part(None::<&str>);
    let ran = Arc::new(AtomicBool::new(false));
    let result: Result<(), Rejected> = {
        let ran = ran.clone();
        gate.guard(&id)
            .ordered(&sub, 3)
            .run(async move {
                ran.store(true, Ordering::SeqCst);
                Ok(())
            })
            .await
    };
    assert!(
        !ran.load(Ordering::SeqCst),
        "an event with an absent key at 3 ran after one at 10 was applied: {result:?}"
    );
    assert!(
        matches!(&result, Err(Rejected::InvalidOption { option: "key", .. })),
        "{result:?}"
    );
}

/// Accounts and namespaces: is an entity isolated per account and per
/// namespace ("a row of its own in the event's account and namespace")?
#[tokio::test]
async fn entities_are_isolated_per_account_and_namespace() {
    let gate = testing::gate().await;
    let other_account = gate.account(testing::unique_name("rt_other"));
    let namespaced = gate.namespace("rt_ns");
    let other_namespace = gate.namespace("rt_ns2");
    let sub = entity("isolated");
    assert_eq!(ok(&gate, "i10", &sub, 10).await, "ran");
    assert_eq!(ok(&other_account, "i3", &sub, 3).await, "ran");
    assert_eq!(ok(&namespaced, "i3", &sub, 3).await, "ran");
    assert_eq!(ok(&namespaced, "i2", &sub, 2).await, "superseded");
    assert_eq!(ok(&other_namespace, "i2", &sub, 2).await, "ran");
    // Running in one scope does not hold another.
    let (started, release, first) = held(&gate, "i20", &sub, 20, None, End::Ok);
    started.notified().await;
    assert_eq!(ok(&namespaced, "i21", &sub, 21).await, "ran");
    assert_eq!(ok(&other_account, "i21", &sub, 21).await, "ran");
    assert_eq!(ok(&gate, "i22", &sub, 22).await, "in_flight");
    release.notify_one();
    assert_eq!(first.await.unwrap(), "ran");
    // Back without a namespace: the plain gate's entity is at 20.
    let plain_again = namespaced.without_namespace();
    assert_eq!(ok(&plain_again, "i15", &sub, 15).await, "superseded");
}

/// By hand, the entity is its identity: two event actions ordered on one
/// entity identity share its order.
#[tokio::test]
async fn two_event_actions_on_one_entity_identity_share_its_order() {
    let gate = testing::gate().await;
    let sub = entity("shared");
    let invoice = Identity::new("invoice_event").part("inv_1");
    let result: Result<(), Rejected> = gate
        .guard(&invoice)
        .ordered(&sub, 10)
        .run(async { Ok(()) })
        .await;
    assert!(result.is_ok());
    assert_eq!(ok(&gate, "s5", &sub, 5).await, "superseded");
    // An entity of another action name with the same parts is another entity.
    let other = Identity::new("invoice").part("shared");
    let result: Result<(), Rejected> = gate
        .guard(&event("s4"))
        .ordered(&other, 4)
        .run(async { Ok(()) })
        .await;
    assert!(result.is_ok(), "{result:?}");
}

struct Hook {
    id: String,
    object: String,
    seq: i64,
}

#[idem::idempotent(key = "hook.id", entity = "hook.object", order = "hook.seq")]
async fn apply_invoice(gate: &Gate, hook: &Hook, log: &Mutex<Vec<String>>) -> Result<(), Rejected> {
    log.lock().unwrap().push(format!("invoice {}", hook.id));
    Ok(())
}

#[idem::idempotent(key = "hook.id", entity = "hook.object", order = "hook.seq")]
async fn apply_refund(gate: &Gate, hook: &Hook, log: &Mutex<Vec<String>>) -> Result<(), Rejected> {
    log.lock().unwrap().push(format!("refund {}", hook.id));
    Ok(())
}

/// The attribute: "with the action's name, the entity's identity": two
/// actions on the same object have entities of their own.
#[tokio::test]
async fn the_attribute_keys_the_entity_by_the_action() {
    let gate = testing::gate().await;
    let log = Mutex::new(Vec::new());
    let hook = |id: &str, seq| Hook {
        id: id.to_owned(),
        object: "obj_1".to_owned(),
        seq,
    };
    assert!(apply_invoice(&gate, &hook("h10", 10), &log).await.is_ok());
    assert!(apply_refund(&gate, &hook("h5", 5), &log).await.is_ok());
    assert!(matches!(
        apply_invoice(&gate, &hook("h6", 6), &log).await,
        Err(Rejected::Superseded)
    ));
    assert!(matches!(
        apply_refund(&gate, &hook("h4", 4), &log).await,
        Err(Rejected::Superseded)
    ));
    assert!(matches!(
        apply_invoice(&gate, &hook("h10", 10), &log).await,
        Err(Rejected::AlreadyDone)
    ));
    assert!(apply_refund(&gate, &hook("h10", 11), &log).await.is_ok());
    assert_eq!(
        *log.lock().unwrap(),
        ["invoice h10", "refund h5", "refund h10"]
    );
}

/// `replay` and `keep_value_for` with `ordered`: the duplicate is handed
/// the value; the order holds.
#[tokio::test]
async fn replay_and_keep_value_for_with_ordered() {
    let gate = testing::gate().await;
    let sub = entity("replay");
    let id = event("rp7");
    let first: Result<i64, Rejected> = gate
        .guard(&id)
        .ordered(&sub, 7)
        .replay()
        .keep_value_for(Duration::from_secs(3600))
        .run(async { Ok(7) })
        .await;
    assert_eq!(first.unwrap(), 7);
    let again: Result<i64, Rejected> = gate
        .guard(&id)
        .ordered(&sub, 7)
        .replay()
        .run(async { panic!("replayed, not run") })
        .await;
    assert_eq!(again.unwrap(), 7);
    assert_eq!(ok(&gate, "rp3", &sub, 3).await, "superseded");
}

/// "The slot of an ordered event is kept for ever: its entity's order is
/// judged from it"; "keep_value_for is fine". A value's window runs out
/// and prune compacts the success: the order must hold.
#[tokio::test]
async fn a_value_window_run_out_and_compacted_keeps_the_order() {
    let gate = testing::gate().await;
    let sub = entity("compact");
    let id = event("cp7");
    let first: Result<i64, Rejected> = gate
        .guard(&id)
        .ordered(&sub, 7)
        .replay()
        .keep_value_for(Duration::from_secs(1))
        .run(async { Ok(7) })
        .await;
    assert_eq!(first.unwrap(), 7);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let pruned = operations::prune(
        gate.pool(),
        &PruneFilter::expired().account(gate.account_name()),
    )
    .await
    .expect("prune");
    let _ = pruned;
    assert_eq!(
        ok(&gate, "cp3", &sub, 3).await,
        "superseded",
        "the order was lost to a compaction"
    );
    assert_eq!(ok(&gate, "cp7", &sub, 7).await, "already_done");
    assert_eq!(ok(&gate, "cp8", &sub, 8).await, "ran");
}

/// "The entity is a row of its own ..., kept for ever" and "the slot of an
/// ordered event is kept for ever": an operator's prune with a horizon
/// (which deletes successes "kept for ever") right after the newest
/// event's success. Does an older event run afterwards?
#[tokio::test]
async fn prune_with_a_horizon_keeps_the_entity_s_order() {
    let gate = testing::gate().await;
    let sub = entity("prune");
    assert_eq!(ok(&gate, "pr7", &sub, 7).await, "ran");
    let horizon = SystemTime::now() + Duration::from_secs(5);
    let pruned = operations::prune(
        gate.pool(),
        &PruneFilter::new(horizon).account(gate.account_name()),
    )
    .await
    .expect("prune");
    assert_eq!(pruned, 0, "the claim that holds its entity is kept");
    let older = ok(&gate, "pr3", &sub, 3).await;
    let newer = ok(&gate, "pr9", &sub, 9).await;
    assert_ne!(
        older, "ran",
        "after a prune, an event older than the applied one ran"
    );
    // Nothing runs and nothing is in doubt: the entity must not be held.
    assert_eq!(
        (older, newer),
        ("superseded", "ran"),
        "after a prune of its newest success, the entity refuses every event in flight \
         although nothing runs (pruned {pruned} rows)"
    );
}

/// The same, when an event after the newest was already claimed (the
/// newest folded into the entity) before the prune.
#[tokio::test]
async fn prune_with_a_horizon_after_a_later_claim_keeps_the_order() {
    let gate = testing::gate().await;
    let sub = entity("prune_folded");
    assert_eq!(ok(&gate, "pf7", &sub, 7).await, "ran");
    assert_eq!(ok(&gate, "pf3", &sub, 3).await, "superseded");
    let horizon = SystemTime::now() + Duration::from_secs(5);
    operations::prune(
        gate.pool(),
        &PruneFilter::new(horizon).account(gate.account_name()),
    )
    .await
    .expect("prune");
    assert_eq!(ok(&gate, "pf4", &sub, 4).await, "superseded");
}

/// `keep_slot_for` is refused whatever the call order (before or after
/// `ordered`) and whatever its window.
#[tokio::test]
async fn keep_slot_for_is_refused_before_or_after_ordered() {
    let gate = testing::gate().await;
    let sub = entity("slot_window");
    let id = event("w1");
    let before: Result<(), Rejected> = gate
        .guard(&id)
        .keep_slot_for(Duration::from_secs(60))
        .ordered(&sub, 1)
        .run(async { panic!("ran") })
        .await;
    assert!(
        matches!(before, Err(Rejected::InvalidOption { .. })),
        "{before:?}"
    );
    let claim = gate
        .guard(&id)
        .ordered(&sub, 1)
        .keep_slot_for(Duration::from_secs(60))
        .claim()
        .await;
    assert!(
        matches!(claim, Err(Rejected::InvalidOption { .. })),
        "{:?}",
        claim.err()
    );
}

/// `on_unavailable = Run` with an ordered event and the store down: the
/// body runs unguarded, so neither ordering promise can hold. Is this
/// combination refused, as `keep_slot_for` is?
#[tokio::test]
async fn on_unavailable_run_with_ordered_when_the_store_is_down() {
    let pool = testing::pool_with(2).await;
    let gate = testing::gate_on(pool).await;
    let sub = entity("down");
    assert_eq!(ok(&gate, "dn10", &sub, 10).await, "ran");
    gate.pool().close().await;
    let ran = Arc::new(AtomicBool::new(false));
    let id = event("dn3");
    let result: Result<(), Rejected> = {
        let ran = ran.clone();
        gate.guard(&id)
            .ordered(&sub, 3)
            .on_unavailable(OnUnavailable::Run)
            .run(async move {
                ran.store(true, Ordering::SeqCst);
                Ok(())
            })
            .await
    };
    assert!(
        !ran.load(Ordering::SeqCst),
        "an ordered event older than the applied one ran unguarded under on_unavailable = Run: {result:?}"
    );
    assert!(
        matches!(
            &result,
            Err(Rejected::InvalidOption {
                option: "on_unavailable",
                ..
            })
        ),
        "{result:?}"
    );
}

/// The outcome cache (feature `cache`) with ordered events: a superseded
/// event stays superseded, a duplicate stays a duplicate, and a released
/// failure is not cached as anything.
#[cfg(feature = "cache")]
#[tokio::test]
async fn the_outcome_cache_with_ordered_events() {
    let base = testing::gate().await;
    let gate = base.with_cache(idem::cache::OutcomeCache::builder().build());
    let sub = entity("cache");
    let log = Mutex::new(Vec::new());
    assert_eq!(go(&gate, "cc7", &sub, 7, End::Released, &log).await, "ran");
    assert_eq!(go(&gate, "cc3", &sub, 3, End::Ok, &log).await, "ran");
    assert_eq!(go(&gate, "cc7", &sub, 7, End::Ok, &log).await, "ran");
    assert_eq!(
        go(&gate, "cc7", &sub, 7, End::Ok, &log).await,
        "already_done"
    );
    assert_eq!(go(&gate, "cc5", &sub, 5, End::Ok, &log).await, "superseded");
    assert_eq!(go(&gate, "cc5", &sub, 5, End::Ok, &log).await, "superseded");
    assert_eq!(*log.lock().unwrap(), ["cc7", "cc3", "cc7"]);
}

/// Many events of one entity, each delivered twice, all with `wait`, at the
/// same instant: they queue instead of being refused; no two run at once,
/// nothing runs below a success before it, no event runs twice, and every
/// superseded one is older than a success applied before it.
#[tokio::test]
async fn race_events_with_wait_queue_in_order() {
    let gate = testing::gate_on(testing::pool_with(12).await).await;
    let sub = entity("wait_race");
    let orders: Vec<i64> = (0..16).map(|k| (k * 7 % 11) as i64).collect();
    let barrier = Arc::new(Barrier::new(orders.len() * 2));
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let runs = Arc::new(Mutex::new(Vec::<(String, i64)>::new()));
    let mut tasks = Vec::new();
    for (k, order) in orders.iter().chain(orders.iter()).enumerate() {
        let key = format!("wr_{}", k % orders.len());
        let order = *order;
        let (gate, sub, barrier, inside, overlaps, runs) = (
            gate.clone(),
            sub.clone(),
            barrier.clone(),
            inside.clone(),
            overlaps.clone(),
            runs.clone(),
        );
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let id = event(&key);
            loop {
                let result = gate
                    .guard(&id)
                    .ordered(&sub, order)
                    .wait(Duration::from_secs(30))
                    .run(async {
                        if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                            overlaps.fetch_add(1, Ordering::SeqCst);
                        }
                        runs.lock().unwrap().push((key.clone(), order));
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        inside.fetch_sub(1, Ordering::SeqCst);
                        Ok::<(), Rejected>(())
                    })
                    .await;
                let seen = runs.lock().unwrap().len();
                match result {
                    Err(Rejected::InFlight) => tokio::time::sleep(Duration::from_millis(2)).await,
                    Ok(()) => return (key, order, "ran", seen),
                    Err(other) => return (key, order, other.reason(), seen),
                }
            }
        }));
    }
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.unwrap());
    }
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two events ran at once");
    let runs = runs.lock().unwrap().clone();
    let mut counts = BTreeMap::<&str, usize>::new();
    for (key, _) in &runs {
        *counts.entry(key).or_default() += 1;
    }
    assert!(counts.values().all(|c| *c == 1), "{runs:?}");
    assert!(
        runs.windows(2).all(|w| w[0].1 <= w[1].1),
        "the entity moved back: {runs:?}"
    );
    for (key, order, said, seen) in &outcomes {
        match *said {
            "ran" | "already_done" => assert!(counts.contains_key(key.as_str()), "{key}"),
            "superseded" => assert!(
                runs[..*seen].iter().any(|(_, o)| o > order),
                "{key}@{order}: {runs:?}"
            ),
            other => panic!("{key}: {other}"),
        }
    }
}
