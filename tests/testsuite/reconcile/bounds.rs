//! What a reconciler promises whatever else is in doubt: a claim whose
//! probe knows the answer is resolved within a bounded number of passes
//! (item 8); one probe that panics or never answers neither ends the loop
//! nor holds up the other claims or the shutdown (item 9); a pending claim
//! whose holder keeps renewing its lease is never touched (item 10); a
//! verdict the store failed to record is not asked for again (item 13).
//! All against a real PostgreSQL, the store fault through the fault proxy.

use idem::{Disposition, Outcome};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use idem::operations::{self, ClaimState};
use idem::reconcile::{Doubt, Reconciler, Verdict};
use idem::{Gate, Identity, Rejected, testing};
use idem_test_support::ChargeError;
use idem_test_support::fault_proxy::Proxy;

use crate::support::doubt::{in_doubt, state_of};

/// Holds `count` claims of `action` in doubt, keys `0..count`.
async fn many_in_doubt(gate: &Gate, action: &str, count: usize) {
    for key in 0..count {
        in_doubt(gate, &Identity::new(action).part(key as i64)).await;
    }
}

/// A probe that counts its calls and answers `verdict`.
fn counting(
    calls: &Arc<AtomicUsize>,
    verdict: Verdict,
) -> impl Fn(Doubt) -> std::future::Ready<Verdict> + Send + Sync + 'static {
    let calls = Arc::clone(calls);
    move |_| {
        calls.fetch_add(1, Ordering::SeqCst);
        std::future::ready(verdict.clone())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_claim_whose_probe_knows_is_resolved_within_a_bounded_number_of_passes() {
    // At the default batch (100): 300 claims without a probe, oldest of all;
    // 250 whose probe never knows; the one whose probe knows; 150 more that
    // never know; 400 more without a probe, newest. Claims without a probe
    // must not take a probed claim's place, and unknowns must not pin the
    // window.
    const BATCH: usize = 100;
    let gate = testing::gate().await;
    many_in_doubt(&gate, "no_probe_old", 300).await;
    many_in_doubt(&gate, "never_knows", 250).await;
    let known = Identity::new("knows").part("ord_1");
    in_doubt(&gate, &known).await;
    for key in 250..400_i64 {
        in_doubt(&gate, &Identity::new("never_knows").part(key)).await;
    }
    many_in_doubt(&gate, "no_probe_new", 400).await;

    let unknown_calls = Arc::new(AtomicUsize::new(0));
    let known_calls = Arc::new(AtomicUsize::new(0));
    let reconciler = Reconciler::new(gate.pool().clone())
        .account(gate.account_name())
        .probe("never_knows", counting(&unknown_calls, Verdict::Unknown))
        .probe("knows", counting(&known_calls, Verdict::succeeded()));

    // 401 claims have a probe: five windows of 100 reach every one of them,
    // and one more pass allows for a window that starts anywhere.
    let bound = 401_usize.div_ceil(BATCH) + 1;
    let mut passes = 0;
    while passes < bound
        && state_of(&gate, &known)
            .await
            .is_some_and(|(s, _)| s != "success")
    {
        let pass = reconciler.reconcile_once().await.expect("a pass");
        assert!(pass.probed <= BATCH, "{pass:?}");
        passes += 1;
    }
    assert_eq!(
        state_of(&gate, &known)
            .await
            .map(|(state, _)| state)
            .as_deref(),
        Some("success"),
        "the claim whose probe knows was not resolved within {bound} passes \
         ({} unknowns asked, the knowing probe asked {} times)",
        unknown_calls.load(Ordering::SeqCst),
        known_calls.load(Ordering::SeqCst),
    );
    assert_eq!(known_calls.load(Ordering::SeqCst), 1);
    assert!(matches!(
        gate.claim(&known).await,
        Err(Rejected::AlreadyDone)
    ));
}

/// Three claims in doubt, made in this order: one whose probe panics, one
/// whose probe never answers, one whose probe knows.
async fn a_panic_a_hang_and_a_knowing_probe(gate: &Gate) -> (Identity, Identity, Identity) {
    let panics = Identity::new("probe_panics").part("a");
    let hangs = Identity::new("probe_hangs").part("b");
    let knows = Identity::new("probe_knows").part("c");
    for identity in [&panics, &hangs, &knows] {
        in_doubt(gate, identity).await;
    }
    (panics, hangs, knows)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_probe_and_one_that_never_answers_hold_up_nobody() {
    let captured = idem_test_support::capture::Captured::global();
    let gate = testing::gate().await;
    let (panics, hangs, knows) = a_panic_a_hang_and_a_knowing_probe(&gate).await;
    let hung = Arc::new(AtomicUsize::new(0));
    let reconciler = Arc::new(
        Reconciler::new(gate.pool().clone())
            .account(gate.account_name())
            .probe("probe_panics", |_| async {
                panic!("the provider's SDK panicked")
            })
            .probe("probe_hangs", {
                let hung = Arc::clone(&hung);
                move |_| {
                    hung.fetch_add(1, Ordering::SeqCst);
                    std::future::pending()
                }
            })
            .probe("probe_knows", |_| async { Verdict::NotHappened })
            // Long enough for the panic to finish unwinding first: the
            // panic hook prints a backtrace, which on a loaded machine
            // (CI builds beside the tests) took longer than 300 ms, so the
            // panicking probe was counted as timed out.
            .probe_timeout(Duration::from_secs(3)),
    );

    // One pass: the panic and the hang are contained, the third claim is
    // resolved all the same. (Ten seconds: a hang detector, not a speed bound.)
    let once = tokio::spawn({
        let reconciler = Arc::clone(&reconciler);
        async move { reconciler.reconcile_once().await }
    });
    let pass = tokio::time::timeout(Duration::from_secs(10), once)
        .await
        .expect("a probe that never answers held the pass up")
        .expect("a panicking probe ended the pass")
        .expect("a pass");
    assert_eq!(
        (pass.probed, pass.resolved, pass.unknown),
        (3, 1, 2),
        "{pass:?}"
    );
    assert_eq!((pass.panicked, pass.timed_out), (1, 1), "{pass:?}");
    assert_eq!(state_of(&gate, &knows).await, None, "released");
    assert_eq!(
        state_of(&gate, &panics).await.map(|s| s.0).as_deref(),
        Some("in_doubt")
    );
    assert_eq!(
        state_of(&gate, &hangs).await.map(|s| s.0).as_deref(),
        Some("in_doubt")
    );
    assert_eq!(hung.load(Ordering::SeqCst), 1);
    // The panic is said, with what it was about.
    let said = captured.lines_with(&panics.address());
    assert!(
        said.contains("ERROR")
            && said.contains("the probe panicked")
            && said.contains("probe_panics"),
        "no error line with the action and the address: {said:?}"
    );
    assert!(said.contains("the provider's SDK panicked"), "{said:?}");

    // The loop goes on after a panic, and stops when asked.
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn({
        let reconciler = Arc::clone(&reconciler);
        async move {
            reconciler
                .run(async {
                    stopped.await.ok();
                })
                .await;
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!running.is_finished(), "run ended on its own");
    stop.send(()).expect("run is still listening");
    tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("run did not stop")
        .expect("run panicked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_while_a_probe_hangs_stops_the_loop() {
    let gate = testing::gate().await;
    let hangs = Identity::new("probe_hangs").part("b");
    in_doubt(&gate, &hangs).await;
    let asked = Arc::new(tokio::sync::Notify::new());
    let reconciler = Reconciler::new(gate.pool().clone())
        .account(gate.account_name())
        .probe("probe_hangs", {
            let asked = Arc::clone(&asked);
            move |_| {
                asked.notify_one();
                std::future::pending()
            }
        })
        // Far longer than the test: only the shutdown can end the probe.
        .probe_timeout(Duration::from_secs(3600));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        reconciler
            .run(async {
                stopped.await.ok();
            })
            .await;
    });
    asked.notified().await;
    stop.send(()).expect("run is still listening");
    tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("shutdown waited for a probe that never answers")
        .expect("run panicked");
    assert_eq!(
        state_of(&gate, &hangs).await.map(|s| s.0).as_deref(),
        Some("in_doubt")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_claim_whose_lease_is_renewed_is_never_touched() {
    let gate = testing::gate().await;
    let id = Identity::new("export").part("batch_7");
    let lease = Duration::from_millis(600);
    let claim = gate.guard(&id).lease(lease).claim().await.expect("won");
    let fence = state_of(&gate, &id).await.expect("claimed").1;
    let ran = Arc::new(AtomicUsize::new(1)); // the holder's body, running
    let asked = Arc::new(AtomicUsize::new(0));
    let reconciler = Reconciler::new(gate.pool().clone())
        .account(gate.account_name())
        .probe("export", counting(&asked, Verdict::NotHappened))
        .pending_older_than(Duration::from_millis(50));

    // The holder renews every 150 ms while reconcilers pass and retries try
    // to run the action: none may resolve the claim, so no retry runs.
    let renewing = Arc::new(AtomicBool::new(true));
    let holder = tokio::spawn({
        let renewing = Arc::clone(&renewing);
        async move {
            while renewing.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(150)).await;
                claim
                    .extend(lease)
                    .await
                    .expect("the holder renews its lease");
            }
            claim
        }
    });
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        reconciler.reconcile_once().await.expect("a pass");
        let retry: Result<(), ChargeError> = gate
            .guard(&id)
            .lease(lease)
            .disposition(ChargeError::disposition)
            .run(async {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok(())
            })
            .await;
        assert!(
            matches!(retry, Err(ChargeError::Rejected(Rejected::InFlight))),
            "{retry:?}"
        );
    }
    renewing.store(false, Ordering::SeqCst);
    let claim = holder.await.expect("the holder");
    assert_eq!(
        ran.load(Ordering::SeqCst),
        1,
        "the body ran twice at the same time"
    );
    assert_eq!(
        asked.load(Ordering::SeqCst),
        0,
        "a living holder's claim was probed"
    );
    assert_eq!(state_of(&gate, &id).await, Some(("pending".into(), fence)));
    claim
        .settle()
        .await
        .expect("the holder settles its own claim");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_resolution_itself_refuses_a_pending_claim_whose_lease_is_live() {
    // The lease may be renewed between the listing and the resolution: the
    // compare-and-swap decides, whatever the caller saw.
    let gate = testing::gate().await;
    let id = Identity::new("export").part("batch_8");
    let claim = gate
        .guard(&id)
        .lease(Duration::from_secs(60))
        .claim()
        .await
        .expect("won");
    let (_, fence) = state_of(&gate, &id).await.expect("claimed");
    let address = id.address();
    let slot = operations::Slot::new(gate.account_name(), None, &address);
    let by = operations::Resolver::new("reconciled").expected_fence(fence);
    let resolved =
        operations::resolve_as(gate.pool(), slot, Outcome::Failed(Disposition::Release), by)
            .await
            .expect("resolve");
    assert!(
        !matches!(resolved, operations::Resolved::Changed { .. }),
        "a claim whose lease is live was resolved: {resolved:?}"
    );
    assert_eq!(state_of(&gate, &id).await, Some(("pending".into(), fence)));
    claim
        .settle()
        .await
        .expect("the holder settles its own claim");
    let _ = ClaimState::Pending;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verdict_the_store_could_not_record_is_recorded_later_without_asking_again() {
    let gate = testing::gate().await;
    let id = Identity::new("charge").part("ord_13");
    in_doubt(&gate, &id).await;
    let proxy = Arc::new(tokio::sync::Mutex::new(Proxy::start().await));
    let pool = proxy.lock().await.pool(2).await;
    let asked = Arc::new(AtomicUsize::new(0));
    let reconciler = Reconciler::new(pool)
        .account(gate.account_name())
        .probe("charge", {
            let (asked, proxy) = (Arc::clone(&asked), Arc::clone(&proxy));
            move |_| {
                let (asked, proxy) = (Arc::clone(&asked), Arc::clone(&proxy));
                async move {
                    asked.fetch_add(1, Ordering::SeqCst);
                    // The provider answered; then the store goes away.
                    proxy.lock().await.cut().await;
                    Verdict::succeeded_with(&"receipt_13".to_owned()).expect("a JSON value")
                }
            }
        });
    assert!(
        reconciler.reconcile_once().await.is_err(),
        "the store was cut off: the pass cannot have recorded its verdict"
    );
    assert_eq!(
        state_of(&gate, &id).await.map(|s| s.0).as_deref(),
        Some("in_doubt")
    );

    proxy.lock().await.resume().await;
    let mut resolved = 0;
    for _ in 0..3 {
        if let Ok(pass) = reconciler.reconcile_once().await {
            resolved += pass.resolved;
        }
        if resolved > 0 {
            break;
        }
    }
    assert_eq!(resolved, 1);
    assert_eq!(
        state_of(&gate, &id).await.map(|s| s.0).as_deref(),
        Some("success")
    );
    assert_eq!(
        asked.load(Ordering::SeqCst),
        1,
        "the probe was asked again for an answer it had given"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_made_anew_at_an_address_does_not_inherit_the_old_ones_pause() {
    // A row at the address whose identity does not read back is left alone
    // for five minutes (LONGEST_WAIT). Then it is released and the slot is
    // claimed anew (a new fence), and held in doubt: the new claim is a
    // claim of its own, probed at the next pass.
    let gate = testing::gate().await;
    let id = Identity::new("charge").part("ord_anew");
    let mut unreadable = id.canonical().to_vec();
    unreadable.push(0xff);
    idem::sqlx::query(
        "INSERT INTO idem_records (account, kind, address, state, identity, state_reason) \
         VALUES ($1, 'claim', $2, 'in_doubt', $3, 'body_in_doubt')",
    )
    .bind(gate.account_name())
    .bind(id.address())
    .bind(&unreadable)
    .execute(gate.pool())
    .await
    .expect("insert a claim whose identity does not read back");
    let asked = Arc::new(AtomicUsize::new(0));
    let reconciler = Reconciler::new(gate.pool().clone())
        .account(gate.account_name())
        .probe("charge", counting(&asked, Verdict::succeeded()));
    assert_eq!(reconciler.reconcile_once().await.expect("a pass").probed, 0);

    let address = id.address();

    let slot = operations::Slot::new(gate.account_name(), None, &address);
    let released = operations::resolve(gate.pool(), slot, Outcome::Failed(Disposition::Release))
        .await
        .expect("release by hand");
    assert!(
        matches!(released, operations::Resolved::Changed { .. }),
        "{released:?}"
    );
    in_doubt(&gate, &id).await;

    let pass = reconciler.reconcile_once().await.expect("a pass");
    assert_eq!(
        (pass.probed, pass.resolved),
        (1, 1),
        "the new claim inherited its predecessor's pause: {pass:?}"
    );
    assert_eq!(asked.load(Ordering::SeqCst), 1);
    assert_eq!(
        state_of(&gate, &id).await.map(|s| s.0).as_deref(),
        Some("success")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_is_in_doubt_since_its_lease_ran_out_or_its_body_said_so() {
    // What `idem claims list --state in_doubt --older-than` measures from.
    let gate = testing::gate().await;
    let lease = Duration::from_millis(200);
    let expired = Identity::new("charge_leased").part("ord_since");
    crate::support::holders::vanish(
        gate.guard(&expired)
            .lease(lease)
            .on_expiry(idem::OnExpiry::InDoubt)
            .claim()
            .await
            .expect("won"),
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(matches!(
        gate.guard(&expired)
            .lease(lease)
            .on_expiry(idem::OnExpiry::InDoubt)
            .claim()
            .await,
        Err(Rejected::InDoubt)
    ));
    let body = Identity::new("charge").part("ord_since");
    in_doubt(&gate, &body).await;

    let since = |identity: &Identity| {
        idem::sqlx::query_as::<_, (Option<i64>, bool)>(
            "SELECT round(extract(epoch FROM in_doubt_since - created_at) * 1000)::int8, \
                    in_doubt_since <= now() \
             FROM idem_records WHERE account = $1 AND address = $2",
        )
        .bind(gate.account_name())
        .bind(identity.address())
        .fetch_one(gate.pool())
    };
    // The lease ran out 200 ms after the claim, whenever it was noticed.
    let (after_claim, past) = since(&expired).await.expect("read the claim");
    assert_eq!(after_claim, Some(200), "in doubt since its lease ran out");
    assert!(past);
    let (after_claim, past) = since(&body).await.expect("read the claim");
    assert!(after_claim.is_some_and(|ms| ms >= 0), "{after_claim:?}");
    assert!(past);
}

/// `Reconciler`'s docs: "a probe that hangs delays only its own claim,
/// until its timeout". Twelve claims listed after one whose probe never
/// answers, under the 30 s default timeout: each is resolved while the
/// hang still runs, not 30 s later each; one probe at a time (asked for)
/// is the old behaviour, where the first hang holds up the pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_probe_holds_up_only_its_own_claim() {
    let gate = testing::gate().await;
    // Listed oldest first: the hang comes first.
    in_doubt(&gate, &Identity::new("probe_hangs_first").part(0)).await;
    many_in_doubt(&gate, "probe_knows_after", 12).await;
    let knowing = Arc::new(AtomicUsize::new(0));
    let reconciler = |probes: usize| {
        Reconciler::new(gate.pool().clone())
            .account(gate.account_name())
            .probe("probe_hangs_first", |_| std::future::pending())
            .probe(
                "probe_knows_after",
                counting(&knowing, Verdict::NotHappened),
            )
            .probe_concurrency(probes)
    };

    // One at a time: the hang holds up every claim after it.
    let serial = reconciler(1);
    let held_up = tokio::time::timeout(Duration::from_secs(2), serial.reconcile_once()).await;
    assert!(held_up.is_err(), "one probe at a time waits on the hang");
    assert_eq!(
        knowing.load(Ordering::SeqCst),
        0,
        "nothing after the hang was asked"
    );

    // The default: the others go on beside it. (Ten seconds: far below the
    // 30 s the hang is allowed, and a hang detector, not a speed bound.)
    let concurrent = reconciler(Reconciler::DEFAULT_PROBE_CONCURRENCY);
    let resolved = async {
        loop {
            let left = operations::count(
                gate.pool(),
                &operations::ListFilter::new()
                    .scope(operations::ScopeFilter::new().account(gate.account_name()))
                    .state(ClaimState::InDoubt),
            )
            .await
            .expect("count");
            if left == 1 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::select! {
        pass = concurrent.reconcile_once() => panic!("the pass ended before its hang timed out: {pass:?}"),
        () = resolved => {}
        () = tokio::time::sleep(Duration::from_secs(10)) => panic!(
            "the claims after a hanging probe were not resolved beside it ({} asked)",
            knowing.load(Ordering::SeqCst)
        ),
    }
    assert_eq!(knowing.load(Ordering::SeqCst), 12, "each asked once");
}
