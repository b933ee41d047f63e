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

/// An operator's success whose kept text is not JSON, or not the
/// function's type: the slot is settled, and a `replay` duplicate gets a
/// refusal (or an error), never another value, never a panic, and never a
/// run of its body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_s_kept_text_that_does_not_read_back_is_never_handed_as_a_value() {
    let gate = testing::gate().await;
    for (round, kept) in ["{not json", "\"text\"", "1e400", "null", ""]
        .into_iter()
        .enumerate()
    {
        let id = Identity::new("charge").part(round).part("odd kept text");
        let address = id.address();
        let (_holder, _) = pending(&gate, &id).await;
        let resolved = operations::resolve(
            gate.pool(),
            slot(&gate, &address),
            Outcome::Succeeded(Some(kept)),
        )
        .await;
        match resolved {
            // Refused by the store: nothing changed, and it says so.
            Err(error) => {
                assert!(!error.is_outage(), "{kept:?}: {error}");
                continue;
            }
            Ok(resolved) => assert!(
                matches!(
                    resolved,
                    Resolved::Changed {
                        after: Some(ClaimState::Success),
                        ..
                    }
                ),
                "{kept:?}: {resolved:?}"
            ),
        }
        let ran = std::sync::atomic::AtomicBool::new(false);
        let duplicate = std::panic::AssertUnwindSafe(gate.guard(&id).replay().run(async {
            ran.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok::<u64, Rejected>(42)
        }));
        let duplicate = futures_util::FutureExt::catch_unwind(duplicate)
            .await
            .unwrap_or_else(|_| panic!("{kept:?}: a duplicate panicked"));
        assert!(
            !ran.load(std::sync::atomic::Ordering::SeqCst),
            "{kept:?}: ran again"
        );
        assert!(
            duplicate.is_err(),
            "{kept:?}: handed a value: {duplicate:?}"
        );
    }
}

/// "Never over a success or a kept failure": a claim kept `failed` by its
/// body is left as it is by every outcome, from an operator or a
/// reconciler expecting its fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_failure_is_never_resolved_over() {
    let gate = testing::gate().await;
    let id = Identity::new("charge").part("kept failed");
    let address = id.address();
    let (claim, fence) = pending(&gate, &id).await;
    claim.dispose(Disposition::Keep).await.expect("keep");
    for resolution in [
        Outcome::Succeeded(Some("1")),
        Outcome::Failed(Disposition::Keep),
        Outcome::Failed(Disposition::Release),
    ] {
        for by in [
            Resolver::OPERATOR,
            Resolver::new("reconciled").expected_fence(fence),
        ] {
            match operations::resolve_as(gate.pool(), slot(&gate, &address), resolution, by)
                .await
                .expect("resolve")
            {
                Resolved::NotResolvable(row) => assert_eq!(row.state, ClaimState::Failed),
                other => panic!("{resolution:?} over a kept failure: {other:?}"),
            }
        }
    }
    assert_eq!(
        state_of(gate.pool(), gate.account_name(), &address).await,
        Some(("failed".to_owned(), Some("kept_failure".to_owned())))
    );
}

/// `resolve` acts on claims only: given the address of a step (as
/// `operations::pending_steps` lists it), every outcome finds no claim
/// there and the step's marker is left as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_s_address_is_never_resolved_as_a_claim() {
    use crate::support::steps::cut_off_inside;

    let gate = testing::gate().await;
    let id = Identity::new("checkout").part("step address");
    let lease = Duration::from_millis(100);
    cut_off_inside(&gate, &id, "charge", lease, &Arc::default()).await;
    let steps = operations::pending_steps(gate.pool(), slot(&gate, &id.address()))
        .await
        .expect("pending steps");
    assert_eq!(steps.len(), 1, "{steps:?}");
    let step_address = steps[0].address.clone();
    for resolution in [
        Outcome::Succeeded(Some("1")),
        Outcome::Failed(Disposition::Keep),
        Outcome::Failed(Disposition::Release),
    ] {
        let resolved = operations::resolve(gate.pool(), slot(&gate, &step_address), resolution)
            .await
            .expect("resolve");
        assert!(
            matches!(resolved, Resolved::Missing),
            "{resolution:?}: {resolved:?}"
        );
    }
    let after = operations::pending_steps(gate.pool(), slot(&gate, &id.address()))
        .await
        .expect("pending steps");
    assert_eq!(after, steps, "the step's marker is untouched");
}

/// `Verdict::Unknown` leaves the claim as it is: a stale pending claim
/// (its lease run out, `on_expiry` the default take-over) is not turned in
/// doubt by the probe's ignorance, and the next claim takes it over and
/// runs, as it would with no reconciler (`Verdict::Unknown`'s docs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_verdict_leaves_a_stale_pending_claim_to_its_expiry_policy() {
    use idem::reconcile::{Reconciler, Verdict};
    use std::sync::atomic::{AtomicUsize, Ordering};

    let gate = testing::gate().await;
    let action = testing::unique_name("unknown_stale");
    let id = Identity::new(action.as_str()).part(1u8);
    let lease = Duration::from_millis(50);
    let claim = gate.guard(&id).lease(lease).claim().await.expect("claim");
    crate::support::holders::vanish(claim);
    tokio::time::sleep(lease + Duration::from_millis(30)).await;
    let pass = Reconciler::new(gate.pool().clone())
        .account(gate.account_name())
        .probe(action.clone(), |_| async { Verdict::Unknown })
        .reconcile_once()
        .await
        .expect("a pass");
    assert_eq!((pass.probed, pass.unknown), (1, 1), "{pass:?}");
    let ran = AtomicUsize::new(0);
    let retry: Result<(), Rejected> = gate
        .guard(&id)
        .lease(lease)
        .run(async {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
        .await;
    assert!(retry.is_ok(), "{retry:?}");
    assert_eq!(
        ran.load(Ordering::SeqCst),
        1,
        "the expired claim is taken over, as its on_expiry says"
    );
}
