//! Replies lost on the wire after the server committed: the statement took
//! effect, and the client saw its connection die. What each caller is told
//! must match what happened (issue 13, items 4b, 6 and 9).

use std::time::{Duration, SystemTime};

use idem::meter::{Event, EventOutcome};
use idem::testing;
use idem::{Gate, Identity, Rejected};
use idem_test_support::fault_proxy::{Proxy, Statement};
use idem_test_support::rows::{self, RowTrigger};

/// A fresh proxy, and a gate whose pool goes through it, each statement's
/// SQL in its own Parse message (no statement cache) so the proxy can
/// recognise it.
async fn gate_behind_a_proxy() -> (Proxy, Gate) {
    let proxy = Proxy::start().await;
    let pool = crate::support::proxy::pool_through(&proxy).await;
    (proxy, testing::gate_on(pool).await)
}

fn lost(proxy: &Proxy) -> Vec<Statement> {
    proxy
        .take_lost_replies()
        .into_iter()
        .map(|lost| lost.statement)
        .collect()
}

/// A release commits, its reply is lost, and the slot is claimed anew
/// before the release is retried: the release happened, and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_whose_reply_is_lost_after_the_slot_was_claimed_anew_reports_released() {
    let (proxy, gate) = gate_behind_a_proxy().await;
    let id = Identity::new("lost_release").part(1);
    // Claimed anew by someone else in the very transaction of the delete,
    // so it is there whenever the retry comes: a trigger stands in for a
    // second process that is fast. It inserts into the table it fires on,
    // which on Citus is the account's shard (a trigger there may not start
    // a distributed statement of its own, and a shard has no default for
    // the fence: the coordinator draws it, so the trigger writes one no
    // sequence hands out).
    let admin = testing::pool_with(1).await;
    let trigger = RowTrigger::install(
        &admin,
        &testing::unique_name("claim_anew"),
        "AFTER DELETE",
        &format!(
            "IF OLD.account = '{account}' AND OLD.kind = 'claim' THEN \
               EXECUTE format('INSERT INTO %I.%I (account, kind, address, namespace, state, \
                               identity, fence) \
                               VALUES ($1, ''claim'', $2, $3, ''pending'', $4, $5)', \
                              TG_TABLE_SCHEMA, TG_TABLE_NAME) \
                 USING OLD.account, OLD.address, OLD.namespace, OLD.identity, -OLD.fence; \
             END IF; RETURN OLD;",
            account = gate.account_name()
        ),
    )
    .await;
    let claim = gate.claim(&id).await.expect("claimed");
    assert!(proxy.lose_next_reply(Statement::Release));
    let released = claim.release().await;
    trigger.remove(&admin).await;
    assert_eq!(lost(&proxy), [Statement::Release], "the reply was lost");
    assert!(
        released.is_ok(),
        "the release happened (then someone claimed the slot): {released:?}"
    );
    assert_eq!(
        rows::row_state(&gate, &id.address()).await.as_deref(),
        Some("pending"),
        "the new claim is untouched"
    );
}

/// A settle commits and its reply is lost: the retry finds its own success.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_whose_reply_is_lost_is_recognised_as_done() {
    let (proxy, gate) = gate_behind_a_proxy().await;
    let id = Identity::new("lost_settle").part(1);
    assert!(proxy.lose_next_reply(Statement::Settle));
    let result = gate.run(&id, async { Ok::<_, Rejected>("done") }).await;
    assert_eq!(lost(&proxy), [Statement::Settle]);
    assert_eq!(result.expect("the body's value"), "done");
    let again = gate.run(&id, async { Ok::<_, Rejected>("again") }).await;
    assert!(matches!(again, Err(Rejected::AlreadyDone)), "{again:?}");
}

/// A claim commits and its reply is lost: the caller is told the store was
/// unavailable and the body does not run; the row stays pending, and
/// without a lease refuses every retry until an operator releases it (as
/// `Rejected::Unavailable` documents).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_reply_is_lost_refuses_retries_until_released() {
    let (proxy, gate) = gate_behind_a_proxy().await;
    let id = Identity::new("lost_claim").part(1);
    assert!(proxy.lose_next_reply(Statement::Claim));
    let first = gate.run(&id, async { Ok::<_, Rejected>("ran") }).await;
    assert_eq!(lost(&proxy), [Statement::Claim]);
    assert!(
        matches!(first, Err(Rejected::Unavailable { .. })),
        "{first:?}"
    );
    let retry = gate.run(&id, async { Ok::<_, Rejected>("ran") }).await;
    assert!(matches!(retry, Err(Rejected::InFlight)), "{retry:?}");
    assert_eq!(
        rows::row_state(&gate, &id.address()).await.as_deref(),
        Some("pending")
    );
}

/// A metering batch commits and its reply is lost: the call fails, yet the
/// batch is stored; re-sent, every event is reported deduplicated, and the
/// totals count each event once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metering_batch_whose_reply_is_lost_is_stored_and_a_resend_deduplicates() {
    let (proxy, gate) = gate_behind_a_proxy().await;
    let meter = gate.meter();
    let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
    let events: Vec<Event> = (0..5)
        .map(|n| Event::new(format!("evt_{n}"), "api_calls", 2, at))
        .collect();
    assert!(proxy.lose_next_reply(Statement::Meter));
    let first = meter.record(&events).await;
    assert_eq!(lost(&proxy), [Statement::Meter]);
    let error = first.expect_err("the call saw its connection die");
    assert!(error.is_outage(), "{error}");
    let again = meter.record(&events).await.expect("the re-send");
    assert!(
        again
            .outcomes
            .iter()
            .all(|outcome| matches!(outcome, EventOutcome::Deduplicated)),
        "the failed call had stored the batch: {again:?}"
    );
    let totals = meter
        .total("api_calls", SystemTime::UNIX_EPOCH..SystemTime::now())
        .await
        .expect("totals");
    assert_eq!(
        (totals.events, totals.quantity),
        (5, 10),
        "each event counted once"
    );
}
