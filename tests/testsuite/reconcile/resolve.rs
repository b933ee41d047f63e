//! Resolving claims from outside the gate (`idem::operations::resolve`):
//! only a claim that is pending or in doubt, exactly once however many
//! resolvers race, under the fence the resolver saw, and never over a
//! success.

use std::sync::Arc;

use idem::operations::{self, ClaimState, Resolved, Resolver, Slot};
use idem::sqlx::{self, PgPool};
use idem::{Claim, Disposition, Gate, Identity, Outcome, testing};
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

/// Holding a claim in doubt resolves nothing: `resolve` refuses it as an
/// error of the request (never an outage), and the claim is left as it
/// was, whatever its state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holding_a_claim_in_doubt_is_refused_and_changes_nothing() {
    let gate = testing::gate().await;
    let id = Identity::new("charge").part("held by an operator");
    let address = id.address();
    let (holder, _fence) = pending(&gate, &id).await;
    for state in ["pending", "in_doubt"] {
        sqlx::query("UPDATE idem_records SET state = $3 WHERE account = $1 AND address = $2")
            .bind(gate.account_name())
            .bind(&address)
            .bind(state)
            .execute(gate.pool())
            .await
            .expect("set the state");
        let held = Outcome::Failed(Disposition::InDoubt);
        let by = Resolver::new("reconciled");
        for refused in [
            operations::resolve(gate.pool(), slot(&gate, &address), held).await,
            operations::resolve_as(gate.pool(), slot(&gate, &address), held, by).await,
        ] {
            match refused {
                Err(error @ idem::Error::Refused(_)) => {
                    assert!(!error.is_outage(), "{error}");
                    let message = error.to_string();
                    assert!(message.contains("not a resolution"), "{message}");
                    assert!(message.contains("nothing was changed"), "{message}");
                }
                other => panic!("{state}: {other:?}"),
            }
        }
        assert_eq!(
            state_of(gate.pool(), gate.account_name(), &address).await,
            Some((state.to_owned(), None)),
            "left as it was"
        );
    }
    drop(holder);
}
