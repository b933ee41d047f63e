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

/// `resolve_as` resolves "exactly once, however many resolvers race": of
/// many resolvers holding one stale pending claim in doubt at the same
/// instant, under the fence they all saw, exactly one is told `Changed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "BREAK: every racing in-doubt resolver after the first is told Changed (in_doubt -> in_doubt), not one"]
async fn racing_in_doubt_resolvers_hold_a_stale_claim_exactly_once() {
    const RESOLVERS: usize = 8;
    let gate = testing::gate().await;
    let id = Identity::new("charge").part("held by many");
    let address = id.address();
    let (_holder, fence) = pending(&gate, &id).await;
    let barrier = Arc::new(Barrier::new(RESOLVERS));
    let mut resolvers = race_resolvers(
        &gate,
        &address,
        fence,
        &barrier,
        RESOLVERS,
        &[Outcome::Failed(Disposition::InDoubt)],
    );
    let mut changed = Vec::new();
    while let Some(resolved) = resolvers.join_next().await {
        if let Resolved::Changed { before, after } = resolved.expect("no panic") {
            changed.push((before.state, after));
        }
    }
    assert_eq!(
        changed.len(),
        1,
        "exactly one resolver holds it in doubt: {changed:?}"
    );
}

/// The same race with each resolver also expecting the state it saw
/// (`pending`): exactly one holds it, the others are told `StateChanged`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_in_doubt_resolvers_expecting_pending_hold_a_claim_exactly_once() {
    const RESOLVERS: usize = 8;
    let gate = testing::gate().await;
    let id = Identity::new("charge").part("held by many, expecting pending");
    let address = id.address();
    let (_holder, fence) = pending(&gate, &id).await;
    let barrier = Arc::new(Barrier::new(RESOLVERS));
    let mut resolvers = JoinSet::new();
    for _ in 0..RESOLVERS {
        let (gate, address, barrier) = (gate.clone(), address.clone(), barrier.clone());
        resolvers.spawn(async move {
            barrier.wait().await;
            let by = Resolver::new("reconciled")
                .expected_fence(fence)
                .expected_state(ClaimState::Pending);
            operations::resolve_as(
                gate.pool(),
                slot(&gate, &address),
                Outcome::Failed(Disposition::InDoubt),
                by,
            )
            .await
            .expect("resolve")
        });
    }
    let (mut changed, mut state_changed) = (0, 0);
    while let Some(resolved) = resolvers.join_next().await {
        match resolved.expect("no panic") {
            Resolved::Changed { before, after } => {
                assert_eq!(
                    (before.state, after),
                    (ClaimState::Pending, Some(ClaimState::InDoubt))
                );
                changed += 1;
            }
            Resolved::StateChanged { current, expected } => {
                assert_eq!(
                    (current.state, expected),
                    (ClaimState::InDoubt, ClaimState::Pending)
                );
                state_changed += 1;
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!((changed, state_changed), (1, RESOLVERS - 1));
}

/// An in-doubt hold never acts over a kept failure, nor over a claim whose
/// lease is live, whatever the holder does at the same instant (settling,
/// releasing or extending): the holder's outcome or the hold, never both,
/// and never a hold over a live lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_doubt_hold_racing_its_holder_never_acts_over_a_live_lease_or_an_outcome() {
    const RESOLVERS: usize = 4;
    let gate = testing::gate().await;
    for round in 0..12u32 {
        let id = Identity::new("charge").part(round).part("raced hold");
        let address = id.address();
        // A lease just run out: the holder may still act on it.
        let claim = gate
            .guard(&id)
            .lease(Duration::from_millis(50))
            .claim()
            .await
            .expect("claim");
        tokio::time::sleep(Duration::from_millis(80)).await;
        let barrier = Arc::new(Barrier::new(RESOLVERS + 1));
        let holder = {
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                match round % 4 {
                    0 => claim.settle().await.map(|()| "settled"),
                    1 => claim.release().await.map(|()| "released"),
                    2 => claim.dispose(Disposition::Keep).await.map(|()| "kept"),
                    _ => claim
                        .extend(Duration::from_secs(60))
                        .await
                        .map(|()| "extended"),
                }
            })
        };
        let mut resolvers = JoinSet::new();
        for _ in 0..RESOLVERS {
            let (gate, address, barrier) = (gate.clone(), address.clone(), barrier.clone());
            resolvers.spawn(async move {
                barrier.wait().await;
                operations::resolve(
                    gate.pool(),
                    slot(&gate, &address),
                    Outcome::Failed(Disposition::InDoubt),
                )
                .await
                .expect("resolve")
            });
        }
        let mut held_from_pending = 0;
        while let Some(resolved) = resolvers.join_next().await {
            if let Resolved::Changed { before, after } = resolved.expect("no panic") {
                assert_eq!(after, Some(ClaimState::InDoubt));
                assert!(before.state.is_resolvable(), "{before:?}");
                if before.state == ClaimState::Pending {
                    held_from_pending += 1;
                }
            }
        }
        let said = holder.await.expect("no panic");
        let now = state_of(gate.pool(), gate.account_name(), &address)
            .await
            .map(|(state, _)| state);
        assert!(held_from_pending <= 1, "round {round}: {held_from_pending}");
        match (said, now.as_deref()) {
            // The holder got there first: its outcome stands.
            (Ok("settled"), Some("success"))
            | (Ok("released"), None)
            | (Ok("kept"), Some("failed"))
            | (Ok("extended"), Some("pending")) => {
                assert_eq!(held_from_pending, 0, "round {round}: held over the holder")
            }
            // The hold got there first: the holder is refused, the hold stands.
            (Err(_), Some("in_doubt")) => assert_eq!(held_from_pending, 1, "round {round}"),
            (said, now) => panic!("round {round}: the holder said {said:?}, the slot is {now:?}"),
        }
    }
}

/// A claim held in doubt by an operator is then resolved by a reconciler's
/// compare-and-swap expecting `in_doubt` at its fence, and a late
/// reconciler expecting `pending` (what it listed before the hold) changes
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_claim_is_resolved_by_the_resolver_that_saw_it_in_doubt_only() {
    let gate = testing::gate().await;
    let id = Identity::new("charge").part("held then reconciled");
    let address = id.address();
    let (_holder, fence) = pending(&gate, &id).await;
    let held = operations::resolve(
        gate.pool(),
        slot(&gate, &address),
        Outcome::Failed(Disposition::InDoubt),
    )
    .await
    .expect("hold");
    assert!(matches!(held, Resolved::Changed { .. }), "{held:?}");
    let late = operations::resolve_as(
        gate.pool(),
        slot(&gate, &address),
        Outcome::Failed(Disposition::Release),
        Resolver::new("reconciled")
            .expected_fence(fence)
            .expected_state(ClaimState::Pending),
    )
    .await
    .expect("resolve");
    assert!(matches!(late, Resolved::StateChanged { .. }), "{late:?}");
    let settled = operations::resolve_as(
        gate.pool(),
        slot(&gate, &address),
        Outcome::Succeeded(Some("\"paid\"")),
        Resolver::new("reconciled")
            .expected_fence(fence)
            .expected_state(ClaimState::InDoubt),
    )
    .await
    .expect("resolve");
    assert!(
        matches!(
            settled,
            Resolved::Changed {
                after: Some(ClaimState::Success),
                ..
            }
        ),
        "{settled:?}"
    );
    let replayed: Result<String, Rejected> = gate
        .guard(&id)
        .replay()
        .run(async { Ok("ran again".to_owned()) })
        .await;
    assert_eq!(replayed.expect("replayed"), "paid");
}

/// A hold in a namespace acts on that namespace's claim only: the same
/// address without a namespace, or in another, is left as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_doubt_hold_in_a_namespace_touches_that_namespace_only() {
    let gate = testing::gate().await;
    let id = Identity::new("charge").part("namespaced hold");
    let address = id.address();
    let plain = gate.claim(&id).await.expect("claim without a namespace");
    let live = gate.namespace("live");
    let in_live = live.claim(&id).await.expect("claim in live");
    let test = gate.namespace("test");
    let in_test = test.claim(&id).await.expect("claim in test");
    let held = operations::resolve(
        gate.pool(),
        Slot::new(gate.account_name(), Some("live"), &address),
        Outcome::Failed(Disposition::InDoubt),
    )
    .await
    .expect("hold");
    assert!(
        matches!(
            held,
            Resolved::Changed {
                after: Some(ClaimState::InDoubt),
                ..
            }
        ),
        "{held:?}"
    );
    let states: Vec<(Option<String>, String)> = sqlx::query_as(
        "SELECT namespace, state FROM idem_records \
         WHERE account = $1 AND kind = 'claim' AND address = $2 ORDER BY namespace NULLS FIRST",
    )
    .bind(gate.account_name())
    .bind(&address)
    .fetch_all(gate.pool())
    .await
    .expect("read");
    assert_eq!(
        states,
        vec![
            (None, "pending".to_owned()),
            (Some("live".to_owned()), "in_doubt".to_owned()),
            (Some("test".to_owned()), "pending".to_owned()),
        ]
    );
    plain.settle().await.expect("settle");
    in_test.settle().await.expect("settle");
    assert!(in_live.settle().await.is_err(), "the hold stands");
}

/// The holder of a claim an operator held in doubt learns, at its late
/// settle, keep, release or extend, that its outcome is not what the slot
/// records (a recording that failed: `NotRecorded`, `LeaseLost` or
/// `ClaimLost`), never a refusal that says its body did not run; and the
/// hold stands. (Which of the three is right,
/// `a_holder_whose_claim_was_held_in_doubt_mid_body_is_told_not_recorded`
/// attacks.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_s_late_end_after_a_hold_is_told_its_outcome_was_not_recorded() {
    let gate = testing::gate().await;
    for end in ["settle", "keep", "release", "extend"] {
        let id = Identity::new("charge").part(end).part("late end");
        let address = id.address();
        // A lease run out: its holder may be gone, or only slow.
        let claim = gate
            .guard(&id)
            .lease(Duration::from_millis(50))
            .claim()
            .await
            .expect("claim");
        tokio::time::sleep(Duration::from_millis(80)).await;
        let held = operations::resolve(
            gate.pool(),
            slot(&gate, &address),
            Outcome::Failed(Disposition::InDoubt),
        )
        .await
        .expect("hold");
        assert!(matches!(held, Resolved::Changed { .. }), "{held:?}");
        let said = match end {
            "settle" => claim.settle().await,
            "keep" => claim.dispose(Disposition::Keep).await,
            "release" => claim.release().await,
            _ => claim.extend(Duration::from_secs(30)).await,
        };
        match &said {
            Err(Rejected::NotRecorded { recorded, .. }) => {
                assert!(recorded.contains("doubt"), "{end}: {said:?}")
            }
            Err(Rejected::LeaseLost { .. } | Rejected::ClaimLost { .. }) => {}
            other => panic!("{end}: the holder was told {other:?}"),
        }
        assert_eq!(
            state_of(gate.pool(), gate.account_name(), &address)
                .await
                .map(|(state, _)| state)
                .as_deref(),
            Some("in_doubt"),
            "{end}: the hold stands"
        );
    }
}

/// A claim cut off inside a step, then held in doubt by an operator: a
/// reconciler afterwards is shown it in doubt with its step in doubt, and
/// its `StepSucceeded` verdict releases it so that the next invocation
/// replays the step's value without running it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_claim_cut_off_in_a_step_is_reconciled_through_its_step() {
    use crate::support::steps::cut_off_inside;
    use idem::reconcile::{Reconciler, Verdict};
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    let gate = testing::gate().await;
    let id = Identity::new("held_checkout").part("ord_9");
    let address = id.address();
    let lease = Duration::from_millis(100);
    cut_off_inside(&gate, &id, "charge", lease, &Arc::default()).await;
    tokio::time::sleep(lease + Duration::from_millis(50)).await;
    let held = operations::resolve(
        gate.pool(),
        slot(&gate, &address),
        Outcome::Failed(Disposition::InDoubt),
    )
    .await
    .expect("hold");
    assert!(
        matches!(&held, Resolved::Changed { before, after: Some(ClaimState::InDoubt) }
            if before.state == ClaimState::Pending),
        "{held:?}"
    );
    let shown = Arc::new(Mutex::new(Vec::new()));
    let reconciler = Reconciler::new(gate.pool().clone())
        .account(gate.account_name())
        .probe("held_checkout", {
            let shown = shown.clone();
            move |doubt| {
                let shown = shown.clone();
                async move {
                    shown.lock().unwrap_or_else(|e| e.into_inner()).push((
                        doubt.state,
                        doubt.reason.clone(),
                        doubt.steps_in_doubt.clone(),
                    ));
                    Verdict::step_succeeded_with("charge", &7u64).expect("a value")
                }
            }
        });
    let pass = reconciler.reconcile_once().await.expect("a pass");
    assert_eq!((pass.probed, pass.resolved), (1, 1), "{pass:?}");
    assert_eq!(
        *shown.lock().unwrap_or_else(|e| e.into_inner()),
        vec![(
            ClaimState::InDoubt,
            Some("operator".to_owned()),
            vec!["charge".to_owned()]
        )]
    );
    assert_eq!(
        state_of(gate.pool(), gate.account_name(), &address).await,
        None
    );
    let ran = AtomicUsize::new(0);
    let retried: Result<u64, Rejected> = gate
        .guard(&id)
        .run(async {
            idem::step("charge", async {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<u64, Rejected>(1)
            })
            .await
        })
        .await;
    assert_eq!(
        retried.expect("the retry runs"),
        7,
        "the step's value replayed"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 0, "the step did not run again");
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

/// A reconciler probes a stale pending claim; while its probe runs, an
/// operator holds the claim in doubt. The probe's verdict was for the
/// claim pending: `resolve_as`'s docs say a release of a claim whose
/// outcome became unknown "lets a retry run it again", so the reconciler
/// must not apply it to the claim now in doubt (it counts it `lost`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "BREAK (debatable: the reconciler documents a compare-and-swap on the fence only): a probe's NotHappened for a pending claim releases it after an operator held it in doubt mid-probe"]
async fn a_verdict_for_a_pending_claim_is_not_applied_once_an_operator_held_it_in_doubt() {
    use idem::reconcile::{Reconciler, Verdict};

    let gate = testing::gate().await;
    for verdict in [Verdict::NotHappened, Verdict::Failed, Verdict::succeeded()] {
        let action = testing::unique_name("held_mid_probe");
        let id = Identity::new(action.as_str()).part(1u8);
        let address = id.address();
        let (_holder, _) = pending(&gate, &id).await;
        let (asked, answer) = (
            Arc::new(tokio::sync::Notify::new()),
            Arc::new(Barrier::new(2)),
        );
        let reconciler = Reconciler::new(gate.pool().clone())
            .account(gate.account_name())
            .pending_older_than(Duration::ZERO)
            .probe(action.clone(), {
                let (asked, answer, verdict) = (asked.clone(), answer.clone(), verdict.clone());
                move |_| {
                    let (asked, answer, verdict) = (asked.clone(), answer.clone(), verdict.clone());
                    async move {
                        asked.notify_one();
                        answer.wait().await;
                        verdict
                    }
                }
            });
        let pass = {
            let reconciler = &reconciler;
            async move { reconciler.reconcile_once().await.expect("a pass") }
        };
        let hold = async {
            asked.notified().await;
            let held = operations::resolve(
                gate.pool(),
                slot(&gate, &address),
                Outcome::Failed(Disposition::InDoubt),
            )
            .await
            .expect("hold");
            answer.wait().await;
            held
        };
        let (pass, held) = tokio::join!(pass, hold);
        assert!(matches!(held, Resolved::Changed { .. }), "{held:?}");
        assert_eq!(
            state_of(gate.pool(), gate.account_name(), &address)
                .await
                .map(|(state, _)| state)
                .as_deref(),
            Some("in_doubt"),
            "{verdict:?} for the claim pending was applied to it held in doubt: {pass:?}"
        );
        assert_eq!((pass.resolved, pass.lost), (0, 1), "{verdict:?}: {pass:?}");
    }
}

/// `Guard::run`'s docs: "If somebody else recorded the claim's outcome
/// meanwhile (a reconciler or an operator resolved it ...), the call returns
/// `Rejected::NotRecorded`". An operator's in-doubt hold mid-body is such an
/// outcome (`NotRecorded`'s docs name "held in doubt"); `ClaimLost` would
/// say the claim was released and "a success is still recorded", which is
/// false: the hold stands, the success is not recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "BREAK: a holder whose claim an operator held in doubt mid-body is told ClaimLost/LeaseLost (\"a success is still recorded\"), not NotRecorded; the success is not recorded"]
async fn a_holder_whose_claim_was_held_in_doubt_mid_body_is_told_not_recorded() {
    let gate = testing::gate().await;
    let mut wrong = Vec::new();
    for (round, lease) in [None, Some(Duration::from_millis(50))]
        .into_iter()
        .enumerate()
    {
        let id = Identity::new("charge").part(round).part("held mid-body");
        let address = id.address();
        let body = async {
            tokio::time::sleep(Duration::from_millis(80)).await;
            let held = operations::resolve(
                gate.pool(),
                slot(&gate, &address),
                Outcome::Failed(Disposition::InDoubt),
            )
            .await
            .expect("hold");
            assert!(matches!(held, Resolved::Changed { .. }), "{held:?}");
            Ok::<u64, Rejected>(7)
        };
        let told = match lease {
            None => gate.guard(&id).run(body).await,
            Some(lease) => gate.guard(&id).lease(lease).run(body).await,
        };
        let now = state_of(gate.pool(), gate.account_name(), &address)
            .await
            .map(|(state, _)| state);
        assert_eq!(
            now.as_deref(),
            Some("in_doubt"),
            "lease {lease:?}: the hold stands"
        );
        if !matches!(&told, Err(Rejected::NotRecorded { recorded, .. }) if recorded.contains("doubt"))
        {
            wrong.push(format!("lease {lease:?}: told {told:?}"));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// "Never over a success or a kept failure": a claim kept `failed` by its
/// body is left as it is by every outcome, the in-doubt hold included,
/// from an operator or a reconciler expecting its fence.
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
        Outcome::Failed(Disposition::InDoubt),
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
        Outcome::Failed(Disposition::InDoubt),
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

/// `Verdict::outcome`: "`None` for `Unknown`: the claim stays held in
/// doubt, as it is"; `Verdict::Unknown`: "the claim stays held, and is
/// probed again later". A stale pending claim (its lease run out) whose
/// probe says unknown: does it stay held, or does the next retry take it
/// over and run the action the probe could not rule out?
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "BREAK (doc): after an Unknown verdict a stale pending claim is not held: the next retry takes it over and runs the body"]
async fn an_unknown_verdict_leaves_a_stale_pending_claim_held() {
    use idem::reconcile::{Reconciler, Verdict};
    use std::sync::atomic::{AtomicUsize, Ordering};

    let gate = testing::gate().await;
    let action = testing::unique_name("unknown_stale");
    let id = Identity::new(action.as_str()).part(1u8);
    let lease = Duration::from_millis(50);
    let claim = gate.guard(&id).lease(lease).claim().await.expect("claim");
    std::mem::forget(claim);
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
    assert_eq!(
        ran.load(Ordering::SeqCst),
        0,
        "the probe could not say whether it happened, and a retry ran it: {retry:?}"
    );
}

/// Holding in doubt a claim already in doubt changes nothing (it "keeps the
/// time it turned"), so it must not be told `Changed` nor rewrite how the
/// claim got there: a reconciler's `Doubt::reason` still says
/// `body_in_doubt` after an operator's redundant hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "BREAK: a redundant in-doubt hold of a claim already in doubt is told Changed and rewrites its state_reason (body_in_doubt -> operator)"]
async fn a_redundant_hold_changes_nothing_and_keeps_how_the_claim_got_there() {
    let gate = testing::gate().await;
    let id = Identity::new("charge").part("already in doubt");
    let address = id.address();
    let body: Result<(), Rejected> = gate
        .guard(&id)
        .disposition(|_: &Rejected| Disposition::InDoubt)
        .run(async { Err(Rejected::InFlight) })
        .await;
    assert!(body.is_err());
    let before = state_of(gate.pool(), gate.account_name(), &address).await;
    assert_eq!(
        before.as_ref().map(|(state, _)| state.as_str()),
        Some("in_doubt")
    );
    let again = operations::resolve(
        gate.pool(),
        slot(&gate, &address),
        Outcome::Failed(Disposition::InDoubt),
    )
    .await
    .expect("hold");
    let after = state_of(gate.pool(), gate.account_name(), &address).await;
    assert_eq!(
        after, before,
        "the redundant hold rewrote the claim ({again:?})"
    );
    assert!(
        !matches!(again, Resolved::Changed { .. }),
        "told Changed for a hold that changed nothing: {again:?}"
    );
}
