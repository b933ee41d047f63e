//! Resolving claims from outside the gate (`idem::operations::resolve`):
//! only a claim that is pending or in doubt, exactly once however many
//! resolvers race, under the fence the resolver saw, and never over a
//! success.

use std::sync::Arc;
use std::time::Duration;

use idem::operations::{self, ClaimState, Resolved, Resolver, Slot};
use idem::sqlx::{self, PgPool};
use idem::{Claim, Disposition, Gate, Identity, Outcome, Rejected, testing};
use tokio::sync::Barrier;
use tokio::task::JoinSet;

/// A pending claim of `id` in `gate`'s account, and its fence. Keep the
/// claim alive for as long as the test needs it pending: its holder has not
/// recorded an outcome.
async fn pending(gate: &Gate, id: &Identity) -> (Claim, i64) {
    let claim = gate.claim(id).await.expect("claim");
    let fence = claim.fence().expect("a claimed slot has a fence");
    (claim, fence)
}

async fn state_of(pool: &PgPool, account: &str, address: &str) -> Option<(String, Option<String>)> {
    sqlx::query_as(
        "SELECT state, state_reason FROM idem_records \
         WHERE account = $1 AND kind = 'claim' AND address = $2 AND namespace IS NULL",
    )
    .bind(account)
    .bind(address)
    .fetch_optional(pool)
    .await
    .expect("read the claim")
}

fn slot<'a>(gate: &'a Gate, address: &'a str) -> Slot<'a> {
    Slot::new(gate.account_name(), None, address)
}

/// Spawns `count` reconcilers of the claim at `address`, each resolving it
/// as the next of `resolutions` in turn, under the fence they saw, all at
/// once through `barrier`.
fn race_resolvers(
    gate: &Gate,
    address: &str,
    fence: i64,
    barrier: &Arc<Barrier>,
    count: usize,
    resolutions: &[Outcome<Option<&'static str>>],
) -> JoinSet<Resolved> {
    let mut resolvers = JoinSet::new();
    for resolution in resolutions.iter().copied().cycle().take(count) {
        let (gate, address, barrier) = (gate.clone(), address.to_owned(), barrier.clone());
        resolvers.spawn(async move {
            barrier.wait().await;
            let by = Resolver::new("reconciled").expected_fence(fence);
            operations::resolve_as(gate.pool(), slot(&gate, &address), resolution, by)
                .await
                .expect("resolve")
        });
    }
    resolvers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_resolvers_resolve_a_claim_exactly_once() {
    const RESOLVERS: usize = 8;
    let gate = testing::gate().await;
    for round in 0..4 {
        let id = Identity::new("charge").part(round);
        let address = id.address();
        let (_holder, fence) = pending(&gate, &id).await;
        sqlx::query(
            "UPDATE idem_records SET state = 'in_doubt' WHERE account = $1 AND address = $2",
        )
        .bind(gate.account_name())
        .bind(&address)
        .execute(gate.pool())
        .await
        .expect("hold it in doubt");

        let barrier = Arc::new(Barrier::new(RESOLVERS));
        let resolutions = [
            Outcome::Succeeded(Some("\"paid\"")),
            Outcome::Failed(Disposition::Keep),
            Outcome::Failed(Disposition::Release),
        ];
        let mut resolvers =
            race_resolvers(&gate, &address, fence, &barrier, RESOLVERS, &resolutions);
        let mut changed = Vec::new();
        while let Some(resolved) = resolvers.join_next().await {
            match resolved.expect("no panic") {
                Resolved::Changed { before, after } => {
                    assert_eq!(before.state, ClaimState::InDoubt);
                    assert_eq!(before.fence, fence);
                    changed.push(after);
                }
                Resolved::Missing | Resolved::NotResolvable(_) => {}
                other => panic!("round {round}: {other:?}"),
            }
        }
        assert_eq!(changed.len(), 1, "round {round}: exactly one resolver wins");
        let now = state_of(gate.pool(), gate.account_name(), &address).await;
        match changed[0] {
            None => assert_eq!(now, None, "released"),
            Some(state) => assert_eq!(
                now,
                Some((state.as_str().to_owned(), Some("reconciled".to_owned())))
            ),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_success_is_never_resolved_over() {
    let gate = testing::gate().await;
    let id = Identity::new("charge").part("settled");
    let claim = gate.claim(&id).await.expect("claim");
    claim.settle().await.expect("settle");
    let address = id.address();
    for resolution in [
        Outcome::Succeeded(None),
        Outcome::Failed(Disposition::Keep),
        Outcome::Failed(Disposition::InDoubt),
        Outcome::Failed(Disposition::Release),
    ] {
        match operations::resolve(gate.pool(), slot(&gate, &address), resolution)
            .await
            .expect("resolve")
        {
            Resolved::NotResolvable(row) => assert_eq!(row.state, ClaimState::Success),
            other => panic!("{resolution:?} over a success: {other:?}"),
        }
    }
    assert_eq!(
        state_of(gate.pool(), gate.account_name(), &address).await,
        Some(("success".to_owned(), None))
    );
    match operations::resolve(
        gate.pool(),
        slot(&gate, "claim_000000000000000000000000"),
        Outcome::Failed(Disposition::Keep),
    )
    .await
    .expect("resolve")
    {
        Resolved::Missing => {}
        other => panic!("no claim there: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_settling_while_resolvers_race_leaves_one_outcome() {
    const RESOLVERS: usize = 4;
    let gate = testing::gate().await;
    for round in 0..4 {
        let id = Identity::new("charge").part(round);
        let address = id.address();
        let claim = gate.claim(&id).await.expect("claim");
        let fence = claim.fence().expect("fence");
        let barrier = Arc::new(Barrier::new(RESOLVERS + 1));
        let holder = {
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                claim.settle().await
            })
        };
        let resolutions = [Outcome::Succeeded(None), Outcome::Failed(Disposition::Keep)];
        let mut resolvers =
            race_resolvers(&gate, &address, fence, &barrier, RESOLVERS, &resolutions);
        let mut changed = Vec::new();
        while let Some(resolved) = resolvers.join_next().await {
            if let Resolved::Changed { before, after } = resolved.expect("no panic") {
                assert_eq!(before.state, ClaimState::Pending);
                changed.push(after);
            }
        }
        let settled = holder.await.expect("no panic");
        assert!(changed.len() <= 1, "round {round}: {changed:?}");
        let now = state_of(gate.pool(), gate.account_name(), &address)
            .await
            .map(|(state, _)| state);
        match changed.first() {
            // The holder settled first: every resolver found a success.
            None => {
                assert!(settled.is_ok(), "round {round}: {settled:?}");
                assert_eq!(now.as_deref(), Some("success"), "round {round}");
            }
            // A resolver got there first: its outcome stands, whatever the
            // holder's late settle then found.
            Some(Some(state)) => assert!(
                now.as_deref() == Some(state.as_str())
                    || (now.as_deref() == Some("success") && *state == ClaimState::Success),
                "round {round}: resolved {state:?}, now {now:?}"
            ),
            Some(None) => panic!("round {round}: nothing released"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resolver_whose_fence_moved_on_changes_nothing() {
    let gate = testing::gate().await;
    let id = Identity::new("charge").part("moved");
    let (_holder, fence) = pending(&gate, &id).await;
    let address = id.address();
    let by = Resolver::new("reconciled").expected_fence(fence - 1);
    match operations::resolve_as(
        gate.pool(),
        slot(&gate, &address),
        Outcome::Failed(Disposition::Release),
        by,
    )
    .await
    .expect("resolve")
    {
        Resolved::FenceMoved { current, expected } => {
            assert_eq!((current.fence, expected), (fence, fence - 1));
            assert_eq!(current.state, ClaimState::Pending);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        state_of(gate.pool(), gate.account_name(), &address).await,
        Some(("pending".to_owned(), None))
    );
    // An operator, who names no fence, resolves it.
    match operations::resolve(
        gate.pool(),
        slot(&gate, &address),
        Outcome::Failed(Disposition::Release),
    )
    .await
    .expect("resolve")
    {
        Resolved::Changed { before, after } => {
            assert_eq!((before.state, after), (ClaimState::Pending, None));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        state_of(gate.pool(), gate.account_name(), &address).await,
        None
    );
}

/// An operator who does not know what a stale pending claim's holder did
/// holds it in doubt (`Outcome::Failed(Disposition::InDoubt)`): duplicates
/// are refused `InDoubt`, never run, until it is resolved for good; one
/// already in doubt keeps the time it turned; a claim whose lease is live
/// is left to its holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_holds_a_stale_pending_claim_in_doubt_until_it_is_resolved() {
    let gate = testing::gate().await;
    let id = Identity::new("charge").part("held by an operator");
    let address = id.address();
    let (holder, fence) = pending(&gate, &id).await;
    let in_doubt = Outcome::Failed(Disposition::InDoubt);
    match operations::resolve(gate.pool(), slot(&gate, &address), in_doubt)
        .await
        .expect("resolve")
    {
        Resolved::Changed { before, after } => {
            assert_eq!((before.state, before.fence), (ClaimState::Pending, fence));
            assert_eq!(after, Some(ClaimState::InDoubt));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        state_of(gate.pool(), gate.account_name(), &address).await,
        Some(("in_doubt".to_owned(), Some("operator".to_owned())))
    );
    let ran = std::sync::atomic::AtomicBool::new(false);
    let duplicate: Result<(), Rejected> = gate
        .guard(&id)
        .run(async {
            ran.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        })
        .await;
    assert!(matches!(duplicate, Err(Rejected::InDoubt)), "{duplicate:?}");
    assert!(
        !ran.load(std::sync::atomic::Ordering::SeqCst),
        "a held claim never runs"
    );
    // The holder's late settle is not recorded over the operator's hold.
    assert!(holder.settle().await.is_err(), "the slot records the hold");

    // Held again: still in doubt, since the time it first turned.
    let since = |pool: PgPool, address: String, account: String| async move {
        sqlx::query_scalar::<_, Option<String>>(
            "SELECT in_doubt_since::text FROM idem_records WHERE account = $1 AND address = $2",
        )
        .bind(account)
        .bind(address)
        .fetch_one(&pool)
        .await
        .expect("read in_doubt_since")
    };
    let first = since(
        gate.pool().clone(),
        address.clone(),
        gate.account_name().to_owned(),
    )
    .await;
    assert!(first.is_some(), "a held claim says since when");
    tokio::time::sleep(Duration::from_millis(20)).await;
    let again = operations::resolve(gate.pool(), slot(&gate, &address), in_doubt)
        .await
        .expect("resolve");
    assert!(matches!(again, Resolved::Changed { .. }), "{again:?}");
    let second = since(
        gate.pool().clone(),
        address.clone(),
        gate.account_name().to_owned(),
    )
    .await;
    assert_eq!(first, second, "held since it first turned");

    // Resolved for good, the next invocation runs.
    let released = operations::resolve(
        gate.pool(),
        slot(&gate, &address),
        Outcome::Failed(Disposition::Release),
    )
    .await
    .expect("resolve");
    assert!(
        matches!(released, Resolved::Changed { after: None, .. }),
        "{released:?}"
    );
    let retry: Result<(), Rejected> = gate.guard(&id).run(async { Ok(()) }).await;
    assert!(retry.is_ok(), "{retry:?}");

    // A claim whose lease is live has a living holder: left to it.
    let leased = Identity::new("charge").part("leased");
    let live = gate
        .guard(&leased)
        .lease(Duration::from_secs(60))
        .claim()
        .await
        .expect("claim");
    match operations::resolve(gate.pool(), slot(&gate, &leased.address()), in_doubt)
        .await
        .expect("resolve")
    {
        Resolved::LeaseLive(row) => assert_eq!(row.state, ClaimState::Pending),
        other => panic!("{other:?}"),
    }
    live.settle().await.expect("the holder settles");
}
