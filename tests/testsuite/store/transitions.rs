//! The ways a claim leaves `pending` without a success, against a real
//! PostgreSQL: kept `failed`, held `in_doubt`, or turned in doubt when its
//! lease ran out. Each is a compare-and-swap on the pending row and its
//! fence, and a row in either state never looks expired, so nothing on
//! the claim path (settle, release, extend, take over) can touch it again.
//!
//! Like `index_use`, it needs a PostgreSQL (`DATABASE_URL`, or the local
//! default), sets the schema up in a schema of its own, and drops it after.

use std::time::Duration;

use idem::sqlx;
use sqlx::PgConnection;

use super::claims::{self, ClaimAnswer, Existing, NewClaim};
use super::operations::{self, ClaimState, NamespaceFilter, ScopeFilter};
use super::scratch::Scratch;
use super::{Commit, Engine, Scope, catalog};

const SCOPE: Scope<'static> = Scope {
    account: "acme",
    namespace: None,
};

/// A scratch schema with idem set up.
async fn scratch() -> Scratch {
    let mut scratch = Scratch::new("idem_transitions").await;
    catalog::set_up(&mut scratch.conn)
        .await
        .expect("set the schema up");
    scratch
}

/// Claims `address`, with a lease of `lease_micros` if given; its fence.
async fn won(conn: &mut PgConnection, address: &str, lease_micros: Option<i64>) -> i64 {
    won_with(conn, address, leased(lease_micros, false)).await
}

/// A new claim with a lease of `lease_micros` if given, held in doubt when
/// it runs out if `expires_in_doubt`.
fn leased(lease_micros: Option<i64>, expires_in_doubt: bool) -> NewClaim<'static> {
    NewClaim {
        identity: b"\x00",
        fingerprint: None,
        lease_micros,
        expires_in_doubt,
        windows: Default::default(),
        ordered: None,
    }
}

/// Claims `address` as `new` says; its fence.
async fn won_with(conn: &mut PgConnection, address: &str, new: NewClaim<'_>) -> i64 {
    match claims::claim(
        &mut *conn,
        Engine::PostgreSQL,
        claims::Within::Autocommit,
        SCOPE,
        address,
        new,
        claims::KeptValue::Skip,
    )
    .await
    {
        Ok(ClaimAnswer::Won(fence)) => fence,
        other => panic!("a fresh slot is won: {other:?}"),
    }
}

async fn look(conn: &mut PgConnection, address: &str) -> Existing {
    claims::lookup(&mut *conn, SCOPE, address, claims::KeptValue::Skip)
        .await
        .expect("lookup")
        .expect("the row is there")
}

async fn reason(conn: &mut PgConnection, address: &str) -> (Option<String>, bool) {
    sqlx::query_as(
        "SELECT state_reason, settled_at IS NOT NULL FROM idem_records WHERE address = $1",
    )
    .bind(address)
    .fetch_one(&mut *conn)
    .await
    .expect("read the row")
}

/// Every statement of the claim path that changes a pending row, under
/// `fence`: none may change a row that is no longer pending.
async fn claim_path_changes_nothing(conn: &mut PgConnection, address: &str, fence: i64) {
    let new = leased(Some(1_000_000), false);
    assert!(
        !claims::settle(&mut *conn, SCOPE, address, fence, None, Commit::Durable)
            .await
            .expect("settle")
            .changed()
    );
    assert!(
        !claims::release(&mut *conn, SCOPE, address, fence, Commit::Durable)
            .await
            .expect("release")
            .changed()
    );
    assert!(
        !claims::extend(&mut *conn, SCOPE, address, fence, 1_000_000)
            .await
            .expect("extend")
    );
    assert!(
        claims::take_over(&mut *conn, SCOPE, address, fence, new)
            .await
            .expect("take over")
            .is_none()
    );
    assert!(
        !claims::keep(
            &mut *conn,
            SCOPE,
            address,
            fence,
            Commit::Durable,
            "kept_failure"
        )
        .await
        .expect("keep")
        .changed()
    );
    assert!(
        !claims::hold_in_doubt(&mut *conn, SCOPE, address, fence, "body_in_doubt")
            .await
            .expect("hold in doubt")
            .changed()
    );
    assert!(
        !claims::expire_in_doubt(&mut *conn, SCOPE, address, fence)
            .await
            .expect("expire in doubt")
    );
}

#[tokio::test]
async fn a_claim_is_held_in_doubt_only_by_its_holder_and_then_refuses_the_claim_path() {
    let mut scratch = scratch().await;
    let conn = &mut scratch.conn;
    let address = "claim_held";
    let fence = won(&mut *conn, address, None).await;
    assert!(
        !claims::hold_in_doubt(&mut *conn, SCOPE, address, fence + 1, "body_in_doubt")
            .await
            .expect("hold in doubt")
            .changed(),
        "another fence holds nothing"
    );
    assert!(
        claims::hold_in_doubt(&mut *conn, SCOPE, address, fence, "body_in_doubt")
            .await
            .expect("hold in doubt")
            .changed()
    );
    let held = look(&mut *conn, address).await;
    assert_eq!(held.state, ClaimState::InDoubt);
    assert!(!held.settled && !held.lease_expired);
    assert_eq!(
        reason(&mut *conn, address).await,
        (Some("body_in_doubt".into()), false)
    );
    claim_path_changes_nothing(&mut *conn, address, fence).await;

    // A duplicate's claim finds it held, in doubt, not expired.
    let new = leased(None, false);
    match claims::claim(
        &mut *conn,
        Engine::PostgreSQL,
        claims::Within::Autocommit,
        SCOPE,
        address,
        new,
        claims::KeptValue::Skip,
    )
    .await
    {
        Ok(ClaimAnswer::Holder(existing)) => {
            assert_eq!(existing.state, ClaimState::InDoubt);
            assert!(!existing.lease_expired);
        }
        other => panic!("the slot is held: {other:?}"),
    }
    scratch.drop().await;
}

#[tokio::test]
async fn a_kept_failure_is_settled_failed_and_never_over_a_success() {
    let mut scratch = scratch().await;
    let conn = &mut scratch.conn;
    for (address, commit) in [
        ("claim_kept", Commit::Durable),
        ("claim_kept_async", Commit::Async),
    ] {
        let fence = won(&mut *conn, address, Some(60_000_000)).await;
        assert!(
            claims::keep(&mut *conn, SCOPE, address, fence, commit, "kept_failure")
                .await
                .expect("keep")
                .changed()
        );
        let kept = look(&mut *conn, address).await;
        assert_eq!(kept.state, ClaimState::Failed);
        assert!(!kept.settled && !kept.lease_expired);
        assert_eq!(
            reason(&mut *conn, address).await,
            (Some("kept_failure".into()), true)
        );
        claim_path_changes_nothing(&mut *conn, address, fence).await;
    }

    let address = "claim_succeeded";
    let fence = won(&mut *conn, address, None).await;
    assert!(
        claims::settle(&mut *conn, SCOPE, address, fence, None, Commit::Durable)
            .await
            .expect("settle")
            .changed()
    );
    claim_path_changes_nothing(&mut *conn, address, fence).await;
    assert_eq!(look(&mut *conn, address).await.state, ClaimState::Success);
    scratch.drop().await;
}

#[tokio::test]
async fn an_expired_lease_turns_in_doubt_once_and_only_under_the_fence_seen() {
    let mut scratch = scratch().await;
    let conn = &mut scratch.conn;
    let address = "claim_expiring";
    let fence = won(&mut *conn, address, Some(1)).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let expired = look(&mut *conn, address).await;
    assert_eq!(expired.state, ClaimState::Pending);
    assert!(expired.lease_expired);

    assert!(
        !claims::expire_in_doubt(&mut *conn, SCOPE, address, fence + 1)
            .await
            .expect("expire in doubt"),
        "a fence not seen matches nothing"
    );
    assert!(
        claims::expire_in_doubt(&mut *conn, SCOPE, address, fence)
            .await
            .expect("expire in doubt")
    );
    let held = look(&mut *conn, address).await;
    assert_eq!(held.state, ClaimState::InDoubt);
    assert!(!held.lease_expired, "a claim in doubt never expires");
    assert_eq!(
        reason(&mut *conn, address).await,
        (Some("lease_expired".into()), false)
    );
    claim_path_changes_nothing(&mut *conn, address, fence).await;

    // A lease that has not run out is not turned.
    let address = "claim_leased";
    let fence = won(&mut *conn, address, Some(60_000_000)).await;
    assert!(
        !claims::expire_in_doubt(&mut *conn, SCOPE, address, fence)
            .await
            .expect("expire in doubt")
    );
    assert_eq!(look(&mut *conn, address).await.state, ClaimState::Pending);
    scratch.drop().await;
}

/// A claim records its own `on_expiry` (`expires_in_doubt`), and the
/// takeover refuses a claim made with `in_doubt`, under the fence seen or
/// not: no caller of the statement can take it over by mistake. A claim
/// made with `take_over` stores nothing for it and is taken over.
#[tokio::test]
async fn a_claim_made_in_doubt_on_expiry_is_never_taken_over() {
    let mut scratch = scratch().await;
    let conn = &mut scratch.conn;
    let held = won_with(
        &mut *conn,
        "claim_in_doubt_on_expiry",
        leased(Some(1), true),
    )
    .await;
    let taken = won_with(
        &mut *conn,
        "claim_taken_over_on_expiry",
        leased(Some(1), false),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(5)).await;

    let expired = look(&mut *conn, "claim_in_doubt_on_expiry").await;
    assert!(expired.lease_expired && expired.expires_in_doubt);
    assert!(
        claims::take_over(
            &mut *conn,
            SCOPE,
            "claim_in_doubt_on_expiry",
            held,
            leased(Some(1), false)
        )
        .await
        .expect("take over")
        .is_none(),
        "a claim made with on_expiry = in_doubt was taken over"
    );
    let still = look(&mut *conn, "claim_in_doubt_on_expiry").await;
    assert_eq!((still.state, still.fence), (ClaimState::Pending, held));

    let expired = look(&mut *conn, "claim_taken_over_on_expiry").await;
    assert!(expired.lease_expired && !expired.expires_in_doubt);
    let stored: Option<bool> =
        sqlx::query_scalar("SELECT expires_in_doubt FROM idem_records WHERE address = $1")
            .bind("claim_taken_over_on_expiry")
            .fetch_one(&mut *conn)
            .await
            .expect("read the row");
    assert_eq!(stored, None, "take_over, the default, stores NULL");
    let over = claims::take_over(
        &mut *conn,
        SCOPE,
        "claim_taken_over_on_expiry",
        taken,
        leased(Some(1), false),
    )
    .await
    .expect("take over")
    .expect("a take_over claim is taken over");
    assert!(over.fence > taken);
    scratch.drop().await;
}

/// A state this build does not know (a later version wrote it) fails the
/// read of its row with an error naming it: on the claim path and for the
/// operator alike, never taken for another state, never a panic.
#[tokio::test]
async fn a_state_this_build_does_not_know_fails_the_read_saying_so() {
    let mut scratch = scratch().await;
    let conn = &mut scratch.conn;
    let address = "claim_from_the_future";
    won(&mut *conn, address, None).await;
    // As a later version's migration would, to admit its new state.
    sqlx::query("ALTER TABLE idem_records DROP CONSTRAINT idem_records_claim_state")
        .execute(&mut *conn)
        .await
        .expect("drop the check of the states");
    sqlx::query("UPDATE idem_records SET state = 'archived' WHERE address = $1")
        .bind(address)
        .execute(&mut *conn)
        .await
        .expect("write a state of a later version");
    let unknown = |error: &sqlx::Error| {
        let message = error.to_string();
        assert!(
            matches!(error, sqlx::Error::ColumnDecode { .. }),
            "{error:?}"
        );
        assert!(
            message.contains("\"archived\"") && message.contains("upgrade idem"),
            "{message}"
        );
    };
    let looked = claims::lookup(&mut *conn, SCOPE, address, claims::KeptValue::Skip).await;
    unknown(&looked.expect_err("the lookup fails"));
    let new = leased(None, false);
    let claimed = claims::claim(
        &mut *conn,
        Engine::PostgreSQL,
        claims::Within::Autocommit,
        SCOPE,
        address,
        new,
        claims::KeptValue::Skip,
    )
    .await;
    unknown(&claimed.expect_err("the claim fails"));
    let scope = ScopeFilter::new()
        .account(Some(SCOPE.account))
        .namespace(NamespaceFilter::Any);
    let found = sqlx::query(sqlx::AssertSqlSafe(operations::find_statement(&scope)))
        .bind(scope.account)
        .bind(None::<&str>)
        .bind(address)
        .fetch_one(&mut *conn)
        .await
        .expect("the row is there");
    unknown(
        &<operations::ClaimRow as sqlx::FromRow<_>>::from_row(&found)
            .expect_err("the row is not read"),
    );
    scratch.drop().await;
}
