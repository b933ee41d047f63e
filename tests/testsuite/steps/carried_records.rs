//! A step's record rides with the run's next statement (the next step's
//! marker, or the claim's settle), so that N steps that are not
//! repeatable cost N + 2 statements and durable commits with the claim
//! and its settle, not 2N + 2 (`idem::step`, **Cost**). What rides is
//! still written: by the next statement, on its own once the body has
//! not reached one within a few milliseconds (a body that stalls, or is
//! dropped), before a failure is recorded, and at once when the claim's
//! lease is near its end (nobody else may record the step meanwhile).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem::operations::StepState;
use idem::testing;
use idem::{Gate, Identity, Rejected};
use idem_test_support::fault_proxy::Proxy;

use crate::support::steps::{
    counting_gate, pending_of, records_are_carried, statements_of, steps_of,
};

/// Three steps, back to back, each worth its number.
async fn three_steps() -> Result<u64, Rejected> {
    let a: u64 = idem::step("a", async { Ok::<u64, Rejected>(1) }).await?;
    let b: u64 = idem::step("b", async { Ok::<u64, Rejected>(2) }).await?;
    let c: u64 = idem::step("c", async { Ok::<u64, Rejected>(4) }).await?;
    Ok(a + b + c)
}

/// The names and values of `id`'s recorded steps, and how many are
/// still pending.
async fn recorded_steps(gate: &idem::Gate, id: &Identity) -> (Vec<(String, i64)>, usize) {
    let steps = steps_of(gate, id).await;
    let mut recorded: Vec<(String, i64)> = steps
        .iter()
        .filter(|step| step.state == StepState::Success)
        .map(|step| {
            (
                step.name.clone().unwrap_or_default(),
                step.output_bytes.unwrap_or(-1),
            )
        })
        .collect();
    recorded.sort();
    let pending = steps
        .iter()
        .filter(|step| step.state == StepState::Pending)
        .count();
    (recorded, pending)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_steps_cost_five_statements_with_the_claim_and_its_settle() {
    let proxy = Proxy::start().await;
    let gate = counting_gate(&proxy).await;
    // On Citus each record is a statement of its own: 2N + 2.
    let expected = if records_are_carried(&gate).await {
        5
    } else {
        8
    };
    for (case, lease) in [
        ("no lease", None),
        ("a lease", Some(Duration::from_secs(30))),
    ] {
        let id = Identity::new("carried_cost").part(case);
        let guard = gate.guard(&id);
        let run = async {
            match lease {
                Some(lease) => guard.lease(lease).run(three_steps()).await,
                None => guard.run(three_steps()).await,
            }
        };
        let (done, statements) = statements_of(&proxy, run).await;
        assert_eq!(done.ok(), Some(7), "{case}");
        assert_eq!(
            statements, expected,
            "{case}: the claim, a's marker, b's with a's record, c's with b's, the settle \
             with c's record (N + 2 for N steps)"
        );
        let (recorded, pending) = recorded_steps(&gate, &id).await;
        assert_eq!(pending, 0, "{case}: every step recorded");
        assert_eq!(
            recorded,
            [("a".into(), 1), ("b".into(), 1), ("c".into(), 1)],
            "{case}"
        );
        // Settled: the duplicate is refused, and runs no step.
        let again = gate.guard(&id).run(three_steps()).await;
        assert!(
            matches!(again, Err(Rejected::AlreadyDone)),
            "{case}: settled, the duplicate is refused: {again:?}"
        );
    }
}

/// `Gate::with_step_record_wait(Duration::ZERO)`: every record is written
/// on its own as its step ends, so three steps cost 2N + 2 statements, and
/// none is left to ride with anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gate_that_waits_no_time_writes_each_record_as_its_step_ends() {
    let proxy = Proxy::start().await;
    let gate = counting_gate(&proxy)
        .await
        .with_step_record_wait(Duration::ZERO);
    let id = Identity::new("carried_none").part(1);
    let (done, statements) = statements_of(&proxy, gate.guard(&id).run(three_steps())).await;
    assert_eq!(done.ok(), Some(7));
    assert_eq!(
        statements, 8,
        "the claim, a marker and a record per step, the settle (2N + 2)"
    );
    let (recorded, pending) = recorded_steps(&gate, &id).await;
    assert_eq!(pending, 0, "every step recorded");
    assert_eq!(recorded.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_writes_the_last_record_before_its_release_and_the_retry_replays_all() {
    let proxy = Proxy::start().await;
    let gate = counting_gate(&proxy).await;
    let id = Identity::new("carried_release").part(1);
    let ran = AtomicUsize::new(0);
    let body = |fail: bool| {
        let ran = &ran;
        async move {
            let mut sum = 0;
            for (name, value) in [("a", 1_u64), ("b", 2), ("c", 4)] {
                sum += idem::step(name, async move {
                    ran.fetch_add(1, Ordering::SeqCst);
                    Ok::<u64, Rejected>(value)
                })
                .await?;
            }
            if fail {
                return Err(Rejected::InFlight);
            }
            Ok::<u64, Rejected>(sum)
        }
    };
    let expected = if records_are_carried(&gate).await {
        1 + 3 + 1 + 1
    } else {
        1 + 3 * 2 + 1
    };
    let (failed, statements) = statements_of(&proxy, gate.guard(&id).run(body(true))).await;
    assert!(matches!(failed, Err(Rejected::InFlight)), "{failed:?}");
    assert_eq!(
        statements, expected,
        "the claim, three markers (two carrying), c's record on its own, the release"
    );
    assert_eq!(
        pending_of(&gate, &id).await.len(),
        0,
        "nothing left in doubt"
    );
    let retried = gate.guard(&id).run(body(false)).await;
    assert_eq!(retried.ok(), Some(7));
    assert_eq!(ran.load(Ordering::SeqCst), 3, "each step ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_stalls_after_a_step_has_it_recorded_before_its_next_statement() {
    let gate = testing::gate().await;
    let id = Identity::new("carried_stall").part(1);
    let (stalled_tx, stalled) = tokio::sync::oneshot::channel::<()>();
    let (go_on_tx, go_on) = tokio::sync::oneshot::channel::<()>();
    let body = gate.guard(&id).run(async {
        let a: u64 = idem::step("a", async { Ok::<u64, Rejected>(1) }).await?;
        let _ = stalled_tx.send(());
        let _ = go_on.await;
        Ok::<u64, Rejected>(a)
    });
    let look = async {
        let _ = stalled.await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let seen = recorded_steps(&gate, &id).await;
        let _ = go_on_tx.send(());
        seen
    };
    let (done, (recorded, pending)) = tokio::join!(body, look);
    assert_eq!(done.ok(), Some(1));
    assert_eq!(
        (recorded.len(), pending),
        (1, 0),
        "a step is recorded while its body stalls after it: {recorded:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_dropped_right_after_a_step_still_has_it_recorded() {
    let gate = testing::gate().await;
    let id = Identity::new("carried_dropped").part(1);
    let run = gate.guard(&id).run(async {
        let a: u64 = idem::step("a", async { Ok::<u64, Rejected>(1) }).await?;
        std::future::pending::<()>().await;
        Ok::<u64, Rejected>(a)
    });
    let dropped = tokio::time::timeout(Duration::from_millis(100), run).await;
    assert!(dropped.is_err(), "the body never ends: {dropped:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (recorded, pending) = recorded_steps(&gate, &id).await;
    assert_eq!(
        (recorded.len(), pending),
        (1, 0),
        "the finished step is recorded, not left in doubt: {recorded:?}"
    );
    // The claim is held (its body was dropped), and its retry is refused.
    let retry = gate.guard(&id).run(async { Ok::<u64, Rejected>(0) }).await;
    assert!(retry.is_err(), "{retry:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_that_ends_near_its_lease_s_end_is_recorded_at_once() {
    let proxy = Proxy::start().await;
    let gate = testing::gate_on(proxy.pool(2).await).await;
    let id = Identity::new("carried_lease_end").part(1);
    let lease = Duration::from_millis(400);
    let run = gate.guard(&id).lease(lease).run(async {
        // Ends with less than four times the wait of a carried record
        // left: recorded by a statement of its own, before the body
        // goes on.
        let a: u64 = idem::step("a", async {
            tokio::time::sleep(Duration::from_millis(350)).await;
            Ok::<u64, Rejected>(1)
        })
        .await?;
        Ok::<u64, Rejected>(a)
    });
    let (done, statements) = statements_of(&proxy, run).await;
    assert_eq!(done.ok(), Some(1));
    assert_eq!(
        statements,
        1 + 2 + 1,
        "the claim, a's marker and record, the settle"
    );
}

/// The statement that carries a record commits, and its reply is lost:
/// the retry of the statement writes nothing (the record and the marker
/// are in already), and the step looks: it finds its own record and its
/// own marker, and the body goes on. The same for the settle that carries
/// the last record. Nothing is left in doubt, nothing runs twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_to_a_statement_that_carries_a_record_loses_nothing() {
    let proxy = Proxy::start().await;
    // On Citus no statement carries a record: none is lost, and the rest
    // holds as well.
    let carried = records_are_carried(&counting_gate(&proxy).await).await;
    for (case, fragment) in [
        ("the marker that carries a record", "begun AS ("),
        (
            "the settle that carries the last record",
            "settled AS (UPDATE",
        ),
    ] {
        // The proxy knows a statement by its text, which a connection
        // sends only the first time it prepares it: each attempt runs on a
        // pool of its own, whose connections have prepared nothing. (On
        // one shared pool, once both connections had prepared the
        // statement, no later attempt could lose its reply.) A run whose
        // statement the proxy still did not catch (the record went on its
        // own) proves nothing of a lost reply: each promise is checked,
        // then the case runs again with a new identity, until one reply
        // was lost.
        for attempt in 1_u64.. {
            let gate = counting_gate(&proxy).await;
            let id = Identity::new("carried_lost_reply").part(case).part(attempt);
            let lost = lose_the_reply_and_check(&proxy, &gate, &id, case, fragment).await;
            if lost == usize::from(carried) {
                break;
            }
            assert!(
                lost == 0 && attempt < 8,
                "{case}: replies lost: {lost} in attempt {attempt}"
            );
        }
    }
}

/// Runs three steps under `id`, the next reply to a statement holding
/// `fragment` lost, and checks that nothing was lost with it: each step
/// ran once, all three are recorded, the claim settled. How many replies
/// were lost.
async fn lose_the_reply_and_check(
    proxy: &Proxy,
    gate: &Gate,
    id: &Identity,
    case: &str,
    fragment: &'static str,
) -> usize {
    let ran = AtomicUsize::new(0);
    let body = async {
        let mut sum = 0;
        for (name, value) in [("a", 1_u64), ("b", 2), ("c", 4)] {
            sum += idem::step(name, async {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<u64, Rejected>(value)
            })
            .await?;
        }
        Ok::<u64, Rejected>(sum)
    };
    assert!(proxy.lose_next_reply_to(fragment), "{case}: armed");
    let done = gate.guard(id).run(body).await;
    let lost = proxy.take_lost_fragment_replies();
    proxy.disarm();
    assert_eq!(done.ok(), Some(7), "{case}");
    assert_eq!(ran.load(Ordering::SeqCst), 3, "{case}: each step ran once");
    let (recorded, pending) = recorded_steps(gate, id).await;
    assert_eq!((recorded.len(), pending), (3, 0), "{case}: {recorded:?}");
    let again = gate.guard(id).run(async { Ok::<u64, Rejected>(0) }).await;
    assert!(
        matches!(again, Err(Rejected::AlreadyDone)),
        "{case}: settled: {again:?}"
    );
    lost.len()
}
