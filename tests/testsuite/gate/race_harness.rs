//! `idem::testing::race` and its report: when the guard does not hold, the
//! assertion names the likely cause.

use std::panic::{AssertUnwindSafe, catch_unwind};

use idem::testing::{self, RaceReport, race};
use idem::{Gate, Identity, Rejected};

/// What [`RaceReport::assert_exactly_once`] says when it fails on
/// `report`, which it must.
fn why_not_exactly_once<T, E>(report: &RaceReport<T, E>) -> String {
    let check = || {
        report.assert_exactly_once();
    };
    let panic = catch_unwind(AssertUnwindSafe(check)).expect_err("the assertion must fail");
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_than_one_winner_is_blamed_on_the_unique_constraint() {
    let gate = testing::gate().await;
    // Each racer in an account of its own: the constraint cannot see them
    // as duplicates, as if it were missing.
    let report = race(4, || {
        let scoped = gate.account(testing::unique_name("split"));
        async move {
            scoped
                .run(&Identity::new("x"), async { Ok::<_, Rejected>(()) })
                .await
        }
    })
    .await;
    assert_eq!(report.claimed(), 4);
    let message = why_not_exactly_once(&report);
    assert!(message.contains("4 of 4 invocations won"), "{message}");
    assert!(
        message.contains("unique constraint is missing or contains a nullable column"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_winner_is_blamed_on_the_schema_or_the_gate() {
    let gate = testing::gate().await;
    let id = Identity::new("held_elsewhere");
    let held = gate.claim(&id).await.expect("someone else holds the slot");
    let report = race(4, || gate.run(&id, async { Ok::<_, Rejected>(()) })).await;
    let message = why_not_exactly_once(&report);
    assert!(message.contains("no invocation won the claim"), "{message}");
    assert!(
        message.contains("schema was never set up or the gate points elsewhere"),
        "{message}"
    );
    assert!(message.contains("refused 4x (in_flight)"), "{message}");
    held.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unguarded_function_is_reported_as_such() {
    async fn unguarded(_gate: &Gate) -> Result<(), Rejected> {
        Ok(())
    }
    let gate = testing::gate().await;
    let report = race(3, || unguarded(&gate)).await;
    let message = why_not_exactly_once(&report);
    assert!(
        message.contains("none of the 3 invocations consulted a gate"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panics_and_body_errors_are_reported_not_propagated() {
    let gate = testing::gate().await;
    let report = race(2, || {
        let gate = gate.clone();
        async move {
            gate.run(
                &Identity::new("boom").part(testing::unique_name("p")),
                async {
                    if gate.account_name().is_empty() {
                        return Ok(());
                    }
                    panic!("body panicked")
                },
            )
            .await
            .map_err(|rejected: Rejected| rejected.to_string())
        }
    })
    .await;
    assert_eq!(report.errors().len(), 2, "{report}");
    assert!(report.errors()[0].contains("body panicked"), "{report}");
    let message = why_not_exactly_once(&report);
    assert!(message.contains("panicked: body panicked"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_race_passes_and_counts_every_refusal() {
    let gate = testing::gate().await;
    let id = Identity::new("clean");
    let report = race(8, || {
        gate.run(&id, async {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            Ok::<_, Rejected>(())
        })
    })
    .await;
    report.assert_exactly_once();
    assert_eq!(
        (
            report.len(),
            report.wins(),
            report.refused(),
            report.ungated()
        ),
        (8, 1, 7, 0)
    );
    let counted: usize = report.refusal_counts().iter().map(|(_, n)| n).sum();
    assert_eq!(counted, 7);
    assert!(
        report.to_string().starts_with("race of 8: 1 won"),
        "{report}"
    );
}

/// `assert_all_refused` passes when every racer was refused as expected
/// on a held slot, and fails naming each racer that was not: one that won
/// once the slot was free, and one refused another way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_refused_names_every_racer_that_was_not() {
    let gate = testing::gate().await;
    let id = Identity::new("held").part(testing::unique_name("race"));
    let held = gate.claim(&id).await.expect("the first claim wins");
    race(8, || gate.run(&id, async { Ok::<_, Rejected>(()) }))
        .await
        .assert_all_refused(&Rejected::InFlight);

    // Settled: every racer is refused AlreadyDone, which is not InFlight.
    held.settle().await.expect("settle");
    let done = race(3, || gate.run(&id, async { Ok::<_, Rejected>(()) })).await;
    let check = || {
        done.assert_all_refused(&Rejected::InFlight);
    };
    let panic = catch_unwind(AssertUnwindSafe(check)).expect_err("the assertion must fail");
    let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        message.contains("expected all 3 invocations refused in_flight"),
        "{message}"
    );
    assert!(message.contains("#0 refused already_done"), "{message}");

    // A free slot: one racer runs, and is named.
    let free = Identity::new("free").part(testing::unique_name("race"));
    let ran = race(2, || gate.run(&free, async { Ok::<_, Rejected>(()) })).await;
    let check = || {
        ran.assert_all_refused(&Rejected::InFlight);
    };
    let panic = catch_unwind(AssertUnwindSafe(check)).expect_err("the assertion must fail");
    let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(message.contains("ran and succeeded"), "{message}");
}

/// A race whose identity is absent (a `None` key part: every invocation
/// runs ungated, all of them) fails `assert_exactly_once`, and its message
/// names that cause: the invocations ran ungated, not that "the schema was
/// never set up or the gate points elsewhere".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_absent_identity_running_every_racer_ungated_is_named_as_the_cause() {
    let gate = testing::gate().await;
    let ran = std::sync::atomic::AtomicUsize::new(0);
    let report = race(4, || {
        let id = Identity::new("absent").part(None::<&str>);
        let ran = &ran;
        let gate = &gate;
        async move {
            gate.run(&id, async {
                ran.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Ok::<_, Rejected>(())
            })
            .await
        }
    })
    .await;
    assert_eq!(ran.load(std::sync::atomic::Ordering::SeqCst), 4, "all ran");
    assert_eq!(report.ungated(), 4, "{report}");
    let message = why_not_exactly_once(&report);
    assert!(
        message.contains("ungated"),
        "four bodies ran ungated, and the message says: {message}"
    );
    assert!(
        !message.contains("schema was never set up"),
        "the cause named is not the cause: {message}"
    );
}
