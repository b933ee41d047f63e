//! The checker's new rules and events, each fed a hand-made history that
//! breaks it (and, beside it, the same history kept clean).

use std::time::Duration;

use idem_test_support::history::{
    Entry, Event, Final, Got, Guard, History, Left, ProbeVerdict, RECONCILED_LEASE, Rule, receipt,
};

use super::broken;

const MS: u64 = 1_000;

/// A reconciled identity: #0 claims, charges and settles its own value.
fn charged_and_settled() -> History {
    let mut history = History::of(vec![Guard::Reconciled]);
    history
        .call(0, 0, 10 * MS)
        .body(MS, 9 * MS, Left::Ok(0))
        .got(Got::Value(0))
        .events(&[Event::Won, Event::Settled]);
    history.charged(0, 0, 2 * MS);
    history
}

fn success() -> Final {
    Final::rows(&[(0, "success")])
}

#[test]
fn a_reconciled_history_that_keeps_the_ledger_has_no_anomalies() {
    let mut history = charged_and_settled();
    history
        .call(0, 20 * MS, 21 * MS)
        .got(Got::Value(0))
        .events(&[Event::Replayed]);
    history.probed(0, 30 * MS, ProbeVerdict::Charged(receipt(0)));
    assert_eq!(broken(&history, &success()), []);
}

#[test]
fn a_second_charge_breaks_rule_7() {
    let mut history = charged_and_settled();
    history
        .call(0, 20 * MS, 30 * MS)
        .body(21 * MS, 29 * MS, Left::Err)
        .got(Got::Failed)
        .events(&[Event::Won, Event::InDoubt]);
    assert_eq!(broken(&history, &success()), []);
    history.charged(0, 1, 22 * MS);
    assert_eq!(broken(&history, &success()), [Rule::Ledger]);
}

#[test]
fn a_body_beside_a_holder_whose_lease_was_renewed_breaks_rule_7() {
    // #0 works 400 ms on a 150 ms lease; #1 runs at 250 ms: fine if #0's
    // lease ran out, a second holder beside a live one if #0 renewed it.
    let beside = |renewed: bool| {
        let lease = RECONCILED_LEASE.as_micros() as u64;
        let mut history = History::of(vec![Guard::Reconciled]);
        history
            .call(0, 0, 400 * MS)
            .entry(Entry::Claim)
            .body(MS, 400 * MS, Left::Err)
            .extended(lease / 2, lease / 2 + MS, renewed)
            .extended(lease, lease + MS, renewed)
            .got(Got::Failed)
            .events(&[Event::Won, Event::InDoubt]);
        history
            .call(0, 250 * MS, 260 * MS)
            .body(251 * MS, 259 * MS, Left::Err)
            .got(Got::Failed)
            .events(&[Event::Won, Event::Released]);
        broken(&history, &Final::default())
    };
    assert_eq!(beside(false), []);
    assert_eq!(beside(true), [Rule::Ledger]);
}

#[test]
fn a_probe_that_contradicts_the_ledger_breaks_rule_7() {
    for verdict in [
        ProbeVerdict::NotHappened,
        ProbeVerdict::Failed,
        ProbeVerdict::Charged(receipt(7)),
    ] {
        let mut history = charged_and_settled();
        history.probed(0, 30 * MS, verdict);
        assert_eq!(broken(&history, &success()), [Rule::Ledger], "{verdict:?}");
    }
    // Before the charge, "not charged" was the truth.
    let mut history = charged_and_settled();
    history.probed(0, MS, ProbeVerdict::NotHappened);
    assert_eq!(broken(&history, &success()), []);
}

#[test]
fn a_row_that_forgets_a_charge_or_invents_one_breaks_rule_7() {
    let history = charged_and_settled();
    assert_eq!(broken(&history, &Final::default()), [Rule::Ledger]);
    assert_eq!(
        broken(&history, &Final::rows(&[(0, "failed")])),
        [Rule::Ledger]
    );
    let mut uncharged = History::of(vec![Guard::Reconciled]);
    uncharged
        .call(0, 0, 10 * MS)
        .body(MS, 9 * MS, Left::Err)
        .got(Got::Failed)
        .events(&[Event::Won, Event::InDoubt]);
    assert_eq!(broken(&uncharged, &Final::rows(&[(0, "failed")])), []);
    assert_eq!(broken(&uncharged, &success()), [Rule::Ledger]);
}

#[test]
fn a_holder_told_its_value_while_the_slot_replays_the_probe_s_breaks_rule_7() {
    // The lease ran out into doubt, a probe settled the claim with the
    // provider's receipt; the holder's late settle then says `Ok`.
    let mut history = charged_and_settled();
    history
        .call(0, 20 * MS, 21 * MS)
        .got(Got::Value(receipt(0)))
        .events(&[Event::Replayed]);
    history.probed(0, 5 * MS, ProbeVerdict::Charged(receipt(0)));
    assert_eq!(broken(&history, &success()), [Rule::Ledger]);
    // Told its outcome was not recorded (its settle failed in an outage),
    // or told it lost the claim, it is one story.
    history.invocations[0].events = vec![Event::Won, Event::Unrecorded("unavailable")];
    assert_eq!(broken(&history, &success()), []);
    history.invocations[0].events = vec![Event::Won, Event::Unrecorded("lease_lost")];
    history.invocations[0].got = Got::refused("lease_lost");
    assert_eq!(broken(&history, &success()), []);
}

#[test]
fn already_failed_after_a_charge_or_done_before_one_breaks_rule_7() {
    let mut history = charged_and_settled();
    history
        .call(0, 20 * MS, 21 * MS)
        .got(Got::refused("already_failed"))
        .events(&[Event::Refused("already_failed")]);
    assert_eq!(broken(&history, &success()), [Rule::Ledger]);
    let mut history = History::of(vec![Guard::Reconciled]);
    history
        .call(0, 0, MS)
        .got(Got::refused("already_done"))
        .events(&[Event::Refused("already_done")]);
    assert_eq!(broken(&history, &Final::default()), [Rule::Ledger]);
}

#[test]
fn a_handler_cancelled_by_its_client_breaks_rule_8() {
    let cancelled = |left: Left| {
        let mut history = History::of(vec![Guard::Fingerprint]);
        history
            .call(0, 0, 10 * MS)
            .entry(Entry::Http)
            .fingerprint(1)
            .body(MS, 20 * MS, left)
            .events(&[Event::Won]);
        let row = if left == Left::Cancelled {
            "pending"
        } else {
            "success"
        };
        broken(&history, &Final::rows(&[(0, row)]))
    };
    assert_eq!(cancelled(Left::Ok(0)), []);
    assert_eq!(cancelled(Left::Cancelled), [Rule::Detached]);
}

#[test]
fn an_abandoned_request_may_hold_the_slot_and_nothing_more() {
    // A client went away before its answer: its claim may stand, so a
    // pending row and the duplicates' in-flight refusals are explained.
    let mut history = History::of(vec![Guard::Fingerprint]);
    history
        .call(0, 0, MS)
        .entry(Entry::Http)
        .fingerprint(1)
        .events(&[Event::Abandoned]);
    history
        .call(0, 10 * MS, 11 * MS)
        .entry(Entry::Http)
        .fingerprint(1)
        .got(Got::refused("in_flight"))
        .events(&[Event::Refused("in_flight")]);
    assert_eq!(broken(&history, &Final::rows(&[(0, "pending")])), []);
    // Without it, the pending row and the refusal are unexplained.
    history.invocations[0].events.clear();
    assert_eq!(
        broken(&history, &Final::rows(&[(0, "pending")])),
        [Rule::TrueAnswers, Rule::FinalRows]
    );
}

#[test]
fn a_duplicate_inside_a_batch_refused_in_flight_beside_a_settled_slot_breaks_rule_4() {
    // The slot was settled before the batch; its first copy is told done,
    // the second must be too.
    let second = |reason: &'static str| {
        let mut history = History::of(vec![Guard::Plain]);
        history
            .call(0, 0, 10 * MS)
            .body(MS, 9 * MS, Left::Ok(0))
            .got(Got::Value(0))
            .events(&[Event::Won, Event::Settled]);
        for _ in 0..2 {
            history
                .call(0, 20 * MS, 30 * MS)
                .entry(Entry::Batch)
                .got(Got::refused(reason))
                .events(&[Event::Refused(reason)]);
        }
        history.invocations[1].got = Got::refused("already_done");
        history.invocations[1].events = vec![Event::Refused("already_done")];
        broken(&history, &Final::rows(&[(0, "success")]))
    };
    assert_eq!(second("already_done"), []);
    assert_eq!(second("in_flight"), [Rule::TrueAnswers]);
}

#[test]
fn a_hold_or_a_kept_failure_without_a_disposition_breaks_rule_4() {
    for event in [Event::InDoubt, Event::Kept] {
        let mut history = History::of(vec![Guard::Plain]);
        history
            .call(0, 0, 10 * MS)
            .body(MS, 9 * MS, Left::Err)
            .got(Got::Failed)
            .events(&[Event::Won, event.clone(), Event::Released]);
        assert_eq!(
            broken(&history, &Final::default()),
            [Rule::TrueAnswers],
            "{event:?}"
        );
    }
}

/// The lease the rules above reason with.
#[test]
fn the_reconciled_lease_is_shorter_than_a_slow_holder() {
    assert!(RECONCILED_LEASE < Duration::from_millis(200));
}

#[test]
fn a_late_success_over_a_takeover_is_judged_by_when_each_won_not_when_each_was_called() {
    // #0 is called first but is refused in flight and wins only by taking
    // the claim over, after #1's lease ran out; #1's body then succeeds
    // late and settles over #0's row, so #0 is truly told `not_recorded`.
    // Seen in CI (IDEM_HISTORY_SEED=1796289109560356578, on Citus): a
    // checker that compared call times judged that answer untrue.
    let told_not_recorded = |first_won: u64| {
        let mut history = History::of(vec![Guard::Lease(Duration::from_millis(50))]);
        history
            .call(0, 0, 80 * MS)
            .body(60 * MS, 70 * MS, Left::Ok(0))
            .got(Got::refused("not_recorded"))
            .events(&[
                Event::TookOver,
                Event::Won,
                Event::Unrecorded("not_recorded"),
            ]);
        history
            .call(0, MS, 67 * MS)
            .body(first_won, 65 * MS, Left::Ok(1))
            .got(Got::refused("lease_lost"))
            .events(&[Event::Won, Event::Unrecorded("lease_lost")]);
        broken(&history, &Final::rows(&[(0, "success")]))
    };
    assert_eq!(told_not_recorded(2 * MS), []);
    // Had #1 won after #0, nothing of it could have settled over #0's row.
    assert!(told_not_recorded(62 * MS).contains(&Rule::TrueAnswers));
}

// ---------------------------------------------------------------- rule 9

/// A stepped identity: #0 runs `reserve` and `notify`, then fails and
/// releases; #1 replays `reserve` (its future does not run), runs `notify`
/// again (repeatable) and settles.
fn stepped_released_and_retried() -> History {
    let mut history = History::of(vec![Guard::Stepped]);
    history
        .call(0, 0, 10 * MS)
        .body(MS, 9 * MS, Left::Err)
        .stepped("reserve", false, 2 * MS)
        .stepped("notify", true, 5 * MS)
        .got(Got::Failed)
        .events(&[Event::Won, Event::Released]);
    history
        .call(0, 20 * MS, 30 * MS)
        .body(21 * MS, 29 * MS, Left::Ok(1))
        .stepped("notify", true, 22 * MS)
        .got(Got::Value(1))
        .events(&[Event::Won, Event::Settled]);
    history
}

#[test]
fn a_stepped_history_that_replays_its_step_has_no_anomalies() {
    assert_eq!(broken(&stepped_released_and_retried(), &success()), []);
}

#[test]
fn a_step_that_is_not_repeatable_run_twice_breaks_rule_9() {
    let mut history = stepped_released_and_retried();
    // The retry ran `reserve` again instead of replaying it.
    if let Some(body) = history.invocations[1].body.as_mut() {
        body.steps.insert(
            0,
            idem_test_support::history::StepRan {
                name: "reserve",
                repeatable: false,
                at: 21 * MS,
            },
        );
    }
    assert_eq!(broken(&history, &success()), [Rule::Steps]);
}

#[test]
fn a_step_run_twice_by_an_ungated_body_breaks_nothing() {
    // Ungated (a store down under fail-open): its steps are not recorded,
    // by design, so running one again is no broken promise of steps.
    let mut history = stepped_released_and_retried();
    history
        .call(0, 40 * MS, 50 * MS)
        .body(41 * MS, 49 * MS, Left::Ok(2))
        .stepped("reserve", false, 42 * MS)
        .got(Got::Value(2))
        .events(&[Event::Refused("unavailable"), Event::Ungated]);
    let rules = broken(&history, &success());
    assert!(!rules.contains(&Rule::Steps), "{rules:?}");
}

// ---------------------------------------------------------------- rule 10

/// Four ordered identities, the events of entity 0 at orders 1, 2, 2, 3:
/// #0 (identity 3, order 3) runs and settles; then identity 0 (order 1) is
/// refused superseded; then identity 1 (order 2) is too.
fn ordered_in_turn() -> History {
    let mut history = History::of(vec![Guard::Ordered; 4]);
    history
        .call(3, 0, 10 * MS)
        .body(MS, 9 * MS, Left::Ok(0))
        .got(Got::Value(0))
        .events(&[Event::Won, Event::Settled]);
    for identity in [0, 1] {
        history
            .call(identity, 20 * MS, 21 * MS)
            .got(Got::refused("superseded"))
            .events(&[Event::Refused("superseded")]);
    }
    history
}

fn ordered_rows() -> Final {
    Final::rows(&[(3, "success")])
}

#[test]
fn an_ordered_history_that_keeps_its_entity_in_order_has_no_anomalies() {
    let mut history = ordered_in_turn();
    // The newest, delivered again, is a duplicate.
    history
        .call(3, 30 * MS, 31 * MS)
        .got(Got::refused("already_done"))
        .events(&[Event::Refused("already_done")]);
    assert_eq!(broken(&history, &ordered_rows()), []);
}

#[test]
fn two_events_of_one_entity_at_once_break_rule_10() {
    let mut history = ordered_in_turn();
    // Identity 2 (order 2) ran beside #0, before it was applied.
    history
        .call(2, 0, 8 * MS)
        .body(2 * MS, 7 * MS, Left::Err)
        .got(Got::Failed)
        .events(&[Event::Won, Event::Released]);
    assert_eq!(broken(&history, &ordered_rows()), [Rule::Ordered]);
}

#[test]
fn an_older_event_run_after_a_newer_one_was_applied_breaks_rule_10() {
    let mut history = ordered_in_turn();
    history
        .call(2, 40 * MS, 50 * MS)
        .body(41 * MS, 49 * MS, Left::Err)
        .got(Got::Failed)
        .events(&[Event::Won, Event::Released]);
    assert_eq!(broken(&history, &ordered_rows()), [Rule::Ordered]);
}

#[test]
fn a_refusal_as_superseded_with_nothing_newer_applied_breaks_rule_10() {
    let mut history = History::of(vec![Guard::Ordered; 4]);
    history
        .call(1, 0, MS)
        .got(Got::refused("superseded"))
        .events(&[Event::Refused("superseded")]);
    assert_eq!(broken(&history, &Final::default()), [Rule::Ordered]);
    // Told to an identity that is not ordered, it is a false answer.
    let mut plain = History::of(vec![Guard::Plain]);
    plain
        .call(0, 0, MS)
        .got(Got::refused("superseded"))
        .events(&[Event::Refused("superseded")]);
    assert_eq!(broken(&plain, &Final::default()), [Rule::TrueAnswers]);
}
