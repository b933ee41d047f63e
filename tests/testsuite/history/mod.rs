//! Randomized histories of every mode under every fault, checked offline
//! against the gate's promises (see `idem-test-support/src/history/mod.rs`
//! for the rules), and the checker itself proven able to fail on hand-made
//! bad histories.
//!
//! Two short runs of the gate's entry points are the default: one against
//! the test database through a fault proxy (backends terminated,
//! connections cut, replies lost after the commit), one against a
//! throwaway cluster that is also restarted and crashed. The surfaces built
//! on them have workloads of their own under the same faults, in
//! `tests/testsuite/history/`: batches, the tower layer through a real server and
//! real clients (feature `tower`), the reconciler over a fake provider, and
//! cached gates beside uncached ones (feature `cache`).
//! `cargo test --all-features --test testsuite history:: -- --ignored --nocapture`
//! runs the long ones; `IDEM_HISTORY_CALLS`, `IDEM_HISTORY_IDENTITIES` and
//! `IDEM_HISTORY_TASKS` size them (each surface's file names its own
//! knobs), and `IDEM_HISTORY_SEED` replays a run's choices (the
//! interleaving and the faults' timing are the machine's).

use std::time::Duration;

use idem::meter::Event as MeterEvent;
use idem::sqlx;
use idem::{Identity, Rejected};
use idem_test_support::fault_proxy::Statement;
use idem_test_support::history::{
    self, Entry, Event, FaultKind, Faults, Final, Got, Guard, History, Inject, Left, MeterAttempt,
    MeterRow, Metered, Plans, Reported, Rule, Target, Workload, check, count_from_env,
};
use idem_test_support::{XorShift, rows};

// The surfaces beyond the gate's own entry points, each a workload of its
// own under the same faults and rules.
mod batches;
#[cfg(feature = "cache")]
mod cached;
#[cfg(feature = "tower")]
mod layer;
// Half the calls through another process's gate: waits woken across
// processes.
mod processes;
mod reconciled;
// The new rules and events, each shown catching a planted violation.
mod rules;

const SEED_VARIABLE: &str = "IDEM_HISTORY_SEED";

/// The short runs' size: each takes about 20 s on 2 cores.
const CALLS: usize = 8_000;
const CALLS_PER_IDENTITY: usize = 6;
/// Identities called at a time: twelve tasks on them race.
const IN_PLAY: usize = 12;
const TASKS: usize = 12;
/// The long run's size.
const LONG_CALLS: usize = 100_000;
/// The gate's pool: fewer than the tasks, so calls also queue for it.
pub(crate) const CONNECTIONS: u32 = 8;

/// Every guard through every entry point, bodies that succeed, fail,
/// panic, hang until cancelled, are cancelled around their return, or
/// outlive their lease; and a metering task alongside.
pub(crate) fn every_mode(calls: usize) -> Workload {
    let calls = count_from_env("IDEM_HISTORY_CALLS", calls);
    Workload {
        tasks: count_from_env("IDEM_HISTORY_TASKS", TASKS),
        calls,
        identities: count_from_env(
            "IDEM_HISTORY_IDENTITIES",
            (calls / CALLS_PER_IDENTITY).max(1),
        ),
        in_play: IN_PLAY,
        guards: Guard::EVERY.to_vec(),
        entries: vec![Entry::Attribute, Entry::Run, Entry::Claim],
        plans: Plans {
            fail: 25,
            panic: 4,
            hang: 8,
            cancel_late: 6,
            overrun: 20,
            work: Duration::from_millis(3),
        },
        metering: true,
        cached: 0,
        until: None,
        seed: XorShift::seed_from_env(SEED_VARIABLE),
    }
}

/// What a proxy and `pg_terminate_backend` can do to connections.
pub(crate) fn connection_faults() -> Vec<(u64, Inject)> {
    vec![
        (3, Inject::Terminate),
        (2, Inject::Cut),
        (6, Inject::LoseReply),
    ]
}

/// ... and what `pg_ctl` can do to the server.
pub(crate) fn every_fault() -> Vec<(u64, Inject)> {
    let mut kinds = connection_faults();
    kinds.extend([(1, Inject::Restart), (1, Inject::Crash)]);
    kinds
}

pub(crate) fn faults(kinds: Vec<(u64, Inject)>) -> Faults {
    Faults {
        kinds,
        pause: 50..500,
        limit: usize::MAX,
    }
}

/// Runs every mode on `target` while `faults` are injected, checks the
/// history, and checks that the gate serves again afterwards.
async fn every_mode_keeps_every_promise(target: Target, calls: usize, faults: Faults, name: &str) {
    let run = history::run(&target, &every_mode(calls), Some(&faults)).await;
    history::assert_no_anomalies(&run, name, SEED_VARIABLE);
    history::assert_recovers(&target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_mode_under_connection_faults_keeps_every_promise() {
    let target = Target::proxied(CONNECTIONS).await;
    let faults = faults(connection_faults());
    every_mode_keeps_every_promise(target, CALLS, faults, "history (connection faults)").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_mode_across_restarts_and_crashes_keeps_every_promise() {
    let target = Target::cluster(CONNECTIONS).await;
    let faults = faults(every_fault());
    every_mode_keeps_every_promise(target, CALLS, faults, "history (every fault)").await;
}

/// Ordered events alone, four to an entity (`history::EVENTS_PER_ENTITY`),
/// every entity's events in play at once, through every entry point that
/// orders them, under the connection faults: rule 10 with rules 1 to 3
/// and 5.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_events_under_connection_faults_keep_every_promise() {
    let target = Target::proxied(CONNECTIONS).await;
    let workload = Workload {
        guards: vec![Guard::Ordered],
        metering: false,
        ..every_mode(CALLS / 2)
    };
    let run = history::run(&target, &workload, Some(&faults(connection_faults()))).await;
    history::assert_no_anomalies(&run, "history (ordered events)", SEED_VARIABLE);
    history::assert_recovers(&target).await;
}

/// The long run: `cargo test --test testsuite history:: -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the long history (minutes): run it with -- --ignored"]
async fn a_long_history_of_every_mode_under_every_fault_keeps_every_promise() {
    let target = Target::cluster(CONNECTIONS).await;
    let faults = faults(every_fault());
    every_mode_keeps_every_promise(target, LONG_CALLS, faults, "history (long, every fault)").await;
}

/// The checker catches a gate that does not guard. On a throwaway cluster
/// whose partial unique indexes are dropped behind the gate's back (the
/// claim's insert then conflicts with nothing), concurrent duplicates all
/// win, and the history shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_without_its_unique_indexes_is_caught() {
    let target = Target::cluster(CONNECTIONS).await;
    // Without the indexes, two claims of one identity both win when each
    // took its snapshot before the other committed. An insert that takes
    // 20 ms makes that window wide enough that rivals always fall in it,
    // even on a loaded machine, and bodies longer than the window make the
    // two winners' bodies overlap: the race collides every time instead of
    // when the scheduler happens to line it up.
    sqlx::raw_sql(
        "DROP INDEX idem_records_unique_without_namespace, idem_records_unique_within_namespace;
         CREATE FUNCTION idem_test_slow_insert() RETURNS trigger LANGUAGE plpgsql
             AS $$ BEGIN PERFORM pg_sleep(0.02); RETURN NEW; END $$;
         CREATE TRIGGER idem_test_slow_insert BEFORE INSERT ON idem_records
             FOR EACH ROW EXECUTE FUNCTION idem_test_slow_insert();",
    )
    .execute(&target.admin)
    .await
    .expect("drop the unique indexes, slow the insert down");
    // Three identities in play at a time, twelve tasks racing on them.
    let seed = XorShift::seed_from_env(SEED_VARIABLE);
    let plans = Plans {
        work: Duration::from_millis(40),
        ..Plans::succeed_or_fail(30)
    };
    let plain = Workload::plain(TASKS, 1_200, 200, plans, seed);
    let workload = Workload {
        in_play: 3,
        ..plain
    };
    let run = history::run(&target, &workload, None).await;
    let anomalies = check(&run.history, &run.last);
    let rules: Vec<Rule> = anomalies.iter().map(|anomaly| anomaly.rule).collect();
    println!(
        "without unique indexes: {} anomalies found",
        anomalies.len()
    );
    assert!(
        rules.contains(&Rule::Exclusive) && rules.contains(&Rule::Kept),
        "duplicates ran and settled, and the checker missed them: {rules:?}"
    );
}

// ------------------------------------------------------------- the proxy

fn lost(n: u64) -> Identity {
    Identity::new("lost_reply").part(n)
}

/// Each statement the proxy can lose the reply of is recognised, and its
/// reply is lost only after it committed: the state it leaves proves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_loses_each_statement_s_reply_after_it_commits() {
    let target = Target::proxied(4).await;
    let proxy = target.proxy.clone().expect("a proxied target");
    let gate = &target.gate;
    let state = |n| async move { rows::row_state(gate, &lost(n).address()).await };

    proxy.lose_next_reply(Statement::Claim);
    let claimed = gate.claim(&lost(1)).await;
    assert!(
        matches!(claimed, Err(Rejected::Unavailable { .. })),
        "{claimed:?}"
    );
    assert_eq!(
        state(1).await.as_deref(),
        Some("pending"),
        "the claim committed"
    );

    let claim = gate.claim(&lost(2)).await.expect("claim");
    proxy.lose_next_reply(Statement::Settle);
    claim
        .settle()
        .await
        .expect("the settle is retried, and finds its commit");
    assert_eq!(state(2).await.as_deref(), Some("success"));

    let claim = gate.claim(&lost(3)).await.expect("claim");
    proxy.lose_next_reply(Statement::Release);
    claim
        .release()
        .await
        .expect("the release is retried, and finds its commit");
    assert_eq!(state(3).await, None);

    let claim = gate
        .guard(&lost(4))
        .lease(Duration::from_millis(50))
        .claim()
        .await
        .expect("claim");
    proxy.lose_next_reply(Statement::Extend);
    claim
        .extend(Duration::from_secs(60))
        .await
        .expect("the extension is retried");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let duplicate = gate
        .guard(&lost(4))
        .lease(Duration::from_millis(50))
        .claim()
        .await;
    assert!(
        matches!(duplicate, Err(Rejected::InFlight)),
        "the extension landed: {duplicate:?}"
    );

    let stale = gate
        .guard(&lost(5))
        .lease(Duration::from_millis(50))
        .claim()
        .await
        .expect("claim");
    tokio::time::sleep(Duration::from_millis(100)).await;
    proxy.lose_next_reply(Statement::TakeOver);
    let taken = gate
        .guard(&lost(5))
        .lease(Duration::from_millis(50))
        .claim()
        .await;
    assert!(
        matches!(taken, Err(Rejected::Unavailable { .. })),
        "{taken:?}"
    );
    let settled = stale.settle().await;
    assert!(
        matches!(settled, Err(Rejected::LeaseLost { .. })),
        "the takeover committed, so the stale holder lost its lease: {settled:?}"
    );

    let batch = [MeterEvent::new(
        "lost",
        "calls",
        1,
        std::time::SystemTime::now(),
    )];
    proxy.lose_next_reply(Statement::Meter);
    let first = gate.meter().record(&batch).await;
    assert!(first.is_err(), "the batch's reply was lost: {first:?}");
    let again = gate.meter().record(&batch).await.expect("re-sent");
    assert_eq!(
        again.deduplicated, 1,
        "the lost batch was stored: {again:?}"
    );

    let mut fired: Vec<Statement> = proxy
        .take_lost_replies()
        .iter()
        .map(|lost| lost.statement)
        .collect();
    fired.sort();
    assert_eq!(fired, Statement::ALL, "each armed reply was lost once");
}

// ------------------------------------------- the checker, on bad histories

/// The rules the checker finds broken, each once.
pub(crate) fn broken(history: &History, last: &Final) -> Vec<Rule> {
    let mut rules: Vec<Rule> = check(history, last).iter().map(|a| a.rule).collect();
    rules.sort();
    rules.dedup();
    rules
}

/// A call of `identity` whose body ran and returned the call's number,
/// which the caller got, with `events` recorded: returns that number.
fn ran_and_returned(
    history: &mut History,
    identity: usize,
    start: u64,
    end: u64,
    events: &[Event],
) -> u64 {
    let id = history.invocations.len() as u64;
    history
        .call(identity, start, end)
        .body(start + 1, end - 1, Left::Ok(id))
        .got(Got::Value(id))
        .events(events);
    id
}

fn won_and_settled(history: &mut History, identity: usize, start: u64, end: u64) -> u64 {
    ran_and_returned(history, identity, start, end, &[Event::Won, Event::Settled])
}

fn refused(history: &mut History, identity: usize, start: u64, end: u64, reason: &'static str) {
    history
        .call(identity, start, end)
        .got(Got::refused(reason))
        .events(&[Event::Refused(reason)]);
}

/// A history that keeps every promise: a success, a duplicate refused in
/// flight and one told it is done; a failure released and retried.
fn clean() -> (History, Final) {
    let mut history = History::of(vec![Guard::Plain, Guard::Plain]);
    won_and_settled(&mut history, 0, 0, 10);
    refused(&mut history, 0, 2, 3, "in_flight");
    refused(&mut history, 0, 20, 21, "already_done");
    history
        .call(1, 0, 10)
        .body(1, 5, Left::Err)
        .got(Got::Failed)
        .events(&[Event::Won, Event::Released]);
    won_and_settled(&mut history, 1, 12, 20);
    (history, Final::rows(&[(0, "success"), (1, "success")]))
}

#[test]
fn a_history_that_keeps_every_promise_has_no_anomalies() {
    let (history, last) = clean();
    assert_eq!(
        check(&history, &last).len(),
        0,
        "{:?}",
        check(&history, &last)
    );
}

#[test]
fn two_bodies_at_once_break_rule_1() {
    let (mut history, last) = clean();
    won_and_settled(&mut history, 0, 4, 9);
    assert_eq!(broken(&history, &last), [Rule::Exclusive]);
}

#[test]
fn a_fresh_claim_beside_a_holder_whose_lease_cannot_have_run_out_breaks_rule_1() {
    // #0 overruns its lease; #1 takes its claim over and releases it; #2
    // claims anew while #0 still runs: legitimate only once #0's lease may
    // have run out.
    let fresh_claim_at = |at: u64| {
        let mut history = History::of(vec![Guard::Lease(Duration::from_millis(100))]);
        history
            .call(0, 0, 300_000)
            .body(1_000, 290_000, Left::Err)
            .got(Got::Failed)
            .events(&[Event::Won, Event::Unrecorded("lease_lost")]);
        history
            .call(0, 120_000, 130_000)
            .body(121_000, 125_000, Left::Err)
            .got(Got::Failed)
            .events(&[Event::TookOver, Event::Won, Event::Released]);
        history
            .call(0, at, at + 20_000)
            .body(at + 1_000, at + 10_000, Left::Err)
            .got(Got::Failed)
            .events(&[Event::Won, Event::Released]);
        broken(&history, &Final::default())
    };
    assert_eq!(fresh_claim_at(150_000), []);
    assert_eq!(fresh_claim_at(50_000), [Rule::Exclusive]);
}

#[test]
fn a_takeover_before_the_lease_could_run_out_breaks_rule_1() {
    let lease = Duration::from_millis(100);
    let takeover = |at: u64| {
        let mut history = History::of(vec![Guard::Lease(lease)]);
        history
            .call(0, 0, 50_000)
            .body(1_000, 50_000, Left::Cancelled)
            .events(&[Event::Won]);
        history
            .call(0, at, at + 20_000)
            .body(at + 1_000, at + 10_000, Left::Ok(1))
            .got(Got::Value(1))
            .events(&[Event::TookOver, Event::Won, Event::Settled]);
        broken(&history, &Final::rows(&[(0, "success")]))
    };
    assert_eq!(
        takeover(30_000),
        [Rule::Exclusive],
        "30 ms into a 100 ms lease"
    );
    assert_eq!(takeover(150_000), [], "after the lease ran out");
}

#[test]
fn a_body_after_a_settled_success_breaks_rule_1() {
    let (mut history, last) = clean();
    won_and_settled(&mut history, 0, 30, 40);
    assert_eq!(
        broken(&history, &last),
        [Rule::Exclusive, Rule::DoneMeansDone]
    );
}

#[test]
fn a_settled_success_missing_from_the_table_breaks_rule_2() {
    let (history, _) = clean();
    assert_eq!(
        broken(&history, &Final::rows(&[(1, "success")])),
        [Rule::Kept]
    );
}

#[test]
fn a_success_neither_settled_nor_reported_breaks_rule_2() {
    let mut history = History::of(vec![Guard::Plain]);
    ran_and_returned(&mut history, 0, 0, 10, &[Event::Won]);
    assert_eq!(broken(&history, &Final::default()), [Rule::Kept]);
}

#[test]
fn a_stale_success_reported_lost_but_not_kept_breaks_rule_2() {
    let lease = Duration::from_millis(10);
    let mut history = History::of(vec![Guard::Lease(lease)]);
    history
        .call(0, 0, 50_000)
        .body(1_000, 40_000, Left::Ok(0))
        .got(Got::refused("lease_lost"))
        .events(&[Event::Won, Event::Unrecorded("lease_lost")]);
    history
        .call(0, 20_000, 30_000)
        .body(21_000, 29_000, Left::Err)
        .got(Got::Failed)
        .events(&[Event::TookOver, Event::Won, Event::Released]);
    assert_eq!(broken(&history, &Final::default()), [Rule::Kept]);
    assert_eq!(broken(&history, &Final::rows(&[(0, "success")])), []);
}

#[test]
fn two_effects_of_transactions_break_rule_2() {
    let mut history = History::of(vec![Guard::Tx]);
    won_and_settled(&mut history, 0, 0, 10);
    won_and_settled(&mut history, 0, 20, 30);
    let mut last = Final::rows(&[(0, "success")]);
    last.effects = vec![(0, 0)];
    assert_eq!(broken(&history, &last), [Rule::Exclusive]);
    last.effects = vec![(0, 0), (0, 1)];
    assert!(broken(&history, &last).contains(&Rule::Kept));
}

#[test]
fn a_body_after_already_done_breaks_rule_3() {
    let mut history = History::of(vec![Guard::FailOpen]);
    won_and_settled(&mut history, 0, 0, 10);
    refused(&mut history, 0, 20, 21, "already_done");
    history
        .call(0, 30, 40)
        .body(31, 39, Left::Err)
        .got(Got::Failed)
        .events(&[Event::Won, Event::Released]);
    let rules = broken(&history, &Final::rows(&[(0, "success")]));
    assert!(rules.contains(&Rule::DoneMeansDone), "{rules:?}");
}

#[test]
fn a_refusal_for_a_false_reason_breaks_rule_4() {
    for reason in [
        "already_done",
        "in_flight",
        "key_reused",
        "unavailable",
        "store_refused",
    ] {
        let mut history = History::of(vec![Guard::Plain]);
        refused(&mut history, 0, 0, 10, reason);
        assert_eq!(
            broken(&history, &Final::default()),
            [Rule::TrueAnswers],
            "{reason}"
        );
    }
}

#[test]
fn unavailable_is_true_only_around_a_fault() {
    let mut history = History::of(vec![Guard::Plain]);
    refused(&mut history, 0, 2_000_000, 2_100_000, "unavailable");
    history.fault(FaultKind::ConnectionsCut, 1_900_000, 2_050_000);
    assert_eq!(broken(&history, &Final::default()), []);
    // Long over by then.
    (history.faults[0].start, history.faults[0].end) = (100_000, 500_000);
    assert_eq!(broken(&history, &Final::default()), [Rule::TrueAnswers]);
}

#[test]
fn a_refusal_that_does_not_say_what_to_do_breaks_rule_4() {
    let mut history = History::of(vec![Guard::Plain]);
    won_and_settled(&mut history, 0, 0, 10);
    history
        .call(0, 20, 21)
        .got(Got::Refused {
            reason: "already_done",
            says_what_to_do: false,
        })
        .events(&[Event::Refused("already_done")]);
    assert_eq!(
        broken(&history, &Final::rows(&[(0, "success")])),
        [Rule::TrueAnswers]
    );
}

#[test]
fn a_replay_of_another_payload_s_value_breaks_rule_4() {
    let replay_to = |payload: u8| {
        let mut history = History::of(vec![Guard::Fingerprint]);
        won_and_settled(&mut history, 0, 0, 10);
        history.invocations[0].fingerprint = Some(1);
        history
            .call(0, 20, 21)
            .fingerprint(payload)
            .got(Got::Value(0))
            .events(&[Event::Replayed]);
        broken(&history, &Final::rows(&[(0, "success")]))
    };
    assert_eq!(replay_to(1), []);
    assert_eq!(replay_to(2), [Rule::TrueAnswers]);
}

#[test]
fn already_done_instead_of_a_replay_breaks_rule_4() {
    // The success was made with payload 1: a caller with payload 1 gets its
    // value, one without a payload is told it is done.
    let told_done = |payload: Option<u8>| {
        let mut history = History::of(vec![Guard::Fingerprint]);
        won_and_settled(&mut history, 0, 0, 10);
        history.invocations[0].fingerprint = Some(1);
        refused(&mut history, 0, 20, 21, "already_done");
        history.invocations[1].fingerprint = payload;
        broken(&history, &Final::rows(&[(0, "success")]))
    };
    assert_eq!(told_done(None), []);
    assert_eq!(
        told_done(Some(1)),
        [Rule::TrueAnswers],
        "its value is replayed"
    );
    assert_eq!(
        told_done(Some(2)),
        [Rule::TrueAnswers],
        "another payload is key_reused"
    );
}

#[test]
fn a_waiting_duplicate_refused_before_its_wait_ran_out_breaks_rule_4() {
    let waited = |micros: u64| {
        let mut history = History::of(vec![Guard::Wait]);
        history
            .call(0, 0, 2_000_000)
            .body(1_000, 2_000_000, Left::Cancelled)
            .events(&[Event::Won]);
        refused(&mut history, 0, 100_000, 100_000 + micros, "in_flight");
        broken(&history, &Final::rows(&[(0, "pending")]))
    };
    assert_eq!(waited(history::WAIT.as_micros() as u64 + 5_000), []);
    assert_eq!(waited(50_000), [Rule::TrueAnswers]);
}

#[test]
fn a_stale_holder_told_its_failure_was_lost_breaks_rule_4() {
    let mut history = History::of(vec![Guard::Lease(Duration::from_millis(10))]);
    history
        .call(0, 0, 50_000)
        .body(1_000, 40_000, Left::Err)
        .got(Got::refused("lease_lost"))
        .events(&[Event::Won, Event::Unrecorded("lease_lost")]);
    won_and_settled(&mut history, 0, 20_000, 30_000);
    history.invocations[1].events.insert(0, Event::TookOver);
    assert_eq!(
        broken(&history, &Final::rows(&[(0, "success")])),
        [Rule::TrueAnswers]
    );
}

#[test]
fn failing_open_while_the_store_is_up_breaks_rule_4() {
    let mut history = History::of(vec![Guard::FailOpen]);
    ran_and_returned(&mut history, 0, 0, 10, &[Event::Ungated]);
    assert_eq!(broken(&history, &Final::default()), [Rule::TrueAnswers]);
    history.fault(FaultKind::Restart, 0, 5);
    assert_eq!(broken(&history, &Final::default()), []);
}

#[test]
fn a_pending_row_without_an_unknown_outcome_breaks_rule_5() {
    let mut history = History::of(vec![Guard::Plain]);
    history
        .call(0, 0, 10)
        .body(1, 5, Left::Err)
        .got(Got::Failed)
        .events(&[Event::Won, Event::Released]);
    assert_eq!(
        broken(&history, &Final::rows(&[(0, "pending")])),
        [Rule::FinalRows]
    );
    // A later holder cancelled mid-body leaves its claim pending.
    history
        .call(0, 20, 30)
        .body(21, 30, Left::Cancelled)
        .events(&[Event::Won]);
    assert_eq!(broken(&history, &Final::rows(&[(0, "pending")])), []);
}

#[test]
fn an_async_outcome_may_be_lost_only_in_a_crash() {
    let mut history = History::of(vec![Guard::AsyncOutcome]);
    won_and_settled(&mut history, 0, 0, 10);
    let pending = Final::rows(&[(0, "pending")]);
    assert_eq!(broken(&history, &pending), [Rule::Kept, Rule::FinalRows]);
    history.fault(FaultKind::Crash, 100, 200);
    assert_eq!(broken(&history, &pending), []);
}

#[test]
fn a_claim_in_another_state_or_of_no_identity_breaks_rule_5() {
    let (history, mut last) = clean();
    last.claims[1].state = "failed".to_owned();
    last.claims[0].identity = None;
    assert_eq!(broken(&history, &last), [Rule::Kept, Rule::FinalRows]);
}

#[test]
fn a_metered_event_counted_twice_breaks_rule_6() {
    let attempt = |reported| MeterAttempt {
        batch: 0,
        start: 0,
        end: 1,
        reported: Some(vec![reported]),
    };
    let mut history = History {
        batches: vec![vec![Metered {
            event: 0,
            quantity: 2,
        }]],
        attempts: vec![attempt(Reported::Inserted), attempt(Reported::Deduplicated)],
        ..History::default()
    };
    let stored = |rows: usize| Final {
        meter_rows: vec![
            MeterRow {
                event: Some(0),
                quantity: 2,
            };
            rows
        ],
        ..Final::default()
    };
    assert_eq!(broken(&history, &stored(1)), []);
    assert_eq!(broken(&history, &stored(2)), [Rule::Metering]);
    history.attempts[1] = attempt(Reported::Inserted);
    assert_eq!(broken(&history, &stored(1)), [Rule::Metering]);
}
