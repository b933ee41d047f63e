//! The promises of `idem::reconcile` (the `Reconciler`) and of
//! `idem::operations::resolve_as`, attacked from their docs. Each test is
//! named after the promise it attacks; a failing one is a broken promise.

use idem::{Disposition, Outcome};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::operations::{self, NamespaceFilter, ScopeFilter};
use idem::reconcile::{Doubt, Reconciler, Verdict};
use idem::{Gate, Identity, Rejected, idempotent, testing};
use idem_test_support::ChargeError;
use tokio::sync::Barrier;

use crate::support::doubt::{in_doubt, state_of};

async fn state(gate: &Gate, identity: &Identity) -> Option<String> {
    state_of(gate, identity).await.map(|(s, _)| s)
}

/// Calls per address.
type Calls = Arc<Mutex<HashMap<String, usize>>>;

fn counted(calls: &Calls, doubt: &Doubt) {
    *calls
        .lock()
        .unwrap()
        .entry(doubt.address.clone())
        .or_default() += 1;
}

// ---------------------------------------------------------------------------
// "two reconcilers ... resolve a claim exactly once" (reconcile.rs module doc,
// docs/operations.md "Claims in doubt, and the reconciler")

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_reconcilers_at_once_resolve_each_claim_exactly_once() {
    const CLAIMS: usize = 40;
    let gate = testing::gate().await;
    let ids: Vec<Identity> = (0..CLAIMS)
        .map(|k| Identity::new("rt_two").part(k as i64))
        .collect();
    for id in &ids {
        in_doubt(&gate, id).await;
    }
    let make = |verdict: Verdict| {
        Reconciler::new(gate.pool().clone())
            .account(gate.account_name())
            .probe("rt_two", move |_| {
                let verdict = verdict.clone();
                async move {
                    // Slow enough that both reconcilers hold the same claims.
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    verdict
                }
            })
    };
    let a = Arc::new(make(
        Verdict::succeeded_with(&"a".to_owned()).expect("json"),
    ));
    let b = Arc::new(make(Verdict::Failed));
    let barrier = Arc::new(Barrier::new(2));
    let run = |r: Arc<Reconciler>, barrier: Arc<Barrier>| {
        tokio::spawn(async move {
            barrier.wait().await;
            r.reconcile_once().await.expect("a pass")
        })
    };
    let (pa, pb) = tokio::join!(run(a, barrier.clone()), run(b, barrier));
    let (pa, pb) = (pa.expect("no panic"), pb.expect("no panic"));
    assert_eq!(
        pa.resolved + pb.resolved,
        CLAIMS,
        "each claim resolved exactly once: {pa:?} {pb:?}"
    );
    assert_eq!(pa.resolved + pa.lost, pa.probed, "{pa:?}");
    assert_eq!(pb.resolved + pb.lost, pb.probed, "{pb:?}");
    for id in &ids {
        let s = state(&gate, id).await;
        assert!(matches!(s.as_deref(), Some("success" | "failed")), "{s:?}");
    }
}

// ---------------------------------------------------------------------------
// "a reconciler racing the original holder's late settle, resolve a claim
// exactly once, nothing ever overwrites a success" (reconcile.rs module doc)

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_probe_answering_after_the_holders_late_settle_never_overwrites_the_success() {
    let gate = testing::gate().await;
    let id = Identity::new("rt_late").part("ord_1");
    let claim = gate.claim(&id).await.expect("claim");
    let asked = Arc::new(tokio::sync::Notify::new());
    let settled = Arc::new(tokio::sync::Notify::new());
    let reconciler = Reconciler::new(gate.pool().clone())
        .account(gate.account_name())
        .pending_older_than(Duration::ZERO)
        .probe("rt_late", {
            let (asked, settled) = (asked.clone(), settled.clone());
            move |_| {
                let (asked, settled) = (asked.clone(), settled.clone());
                async move {
                    asked.notify_one();
                    settled.notified().await;
                    Verdict::NotHappened
                }
            }
        });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let pass = tokio::spawn(async move { reconciler.reconcile_once().await });
    asked.notified().await;
    claim.settle().await.expect("the holder's late settle");
    settled.notify_one();
    let pass = pass.await.expect("no panic").expect("a pass");
    assert_eq!(
        (pass.probed, pass.resolved, pass.lost),
        (1, 0, 1),
        "{pass:?}"
    );
    assert_eq!(state(&gate, &id).await.as_deref(), Some("success"));
    assert!(matches!(gate.claim(&id).await, Err(Rejected::AlreadyDone)));
}

/// "the resolution and the holder's settle are each applied at most once"
/// (`pending_older_than`), and `Claim::settle`: "If the claim is no longer
/// this holder's, the success is still recorded in the slot unless it is
/// already settled ... (ClaimLost)"; the retry's own settle then finds
/// "that outcome stands and the error is NotRecorded".
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_holders_settle_after_a_release_is_applied_once_and_told_claim_lost() {
    let gate = testing::gate().await;
    let id = Identity::new("rt_slow").part("ord_1");
    let slow = gate.claim(&id).await.expect("claim");
    tokio::time::sleep(Duration::from_millis(20)).await;
    let reconciler = Reconciler::new(gate.pool().clone())
        .account(gate.account_name())
        .pending_older_than(Duration::ZERO)
        .probe("rt_slow", |_| async { Verdict::NotHappened });
    let pass = reconciler.reconcile_once().await.expect("a pass");
    assert_eq!(pass.resolved, 1, "{pass:?}");
    let retry = gate.claim(&id).await.expect("the retry runs");
    let new_fence = retry.fence().expect("fence");
    // The slow holder wakes up and settles: its success happened, and is kept.
    let late = slow.settle().await;
    assert!(matches!(late, Err(Rejected::ClaimLost { .. })), "{late:?}");
    assert_eq!(
        state_of(&gate, &id).await,
        Some(("success".to_owned(), new_fence))
    );
    let second = retry.settle().await;
    assert!(
        matches!(second, Err(Rejected::NotRecorded { .. })),
        "{second:?}"
    );
    // The reconciler, asked again, finds nothing to do.
    let pass = reconciler.reconcile_once().await.expect("a pass");
    assert_eq!(pass.probed, 0, "{pass:?}");
}

// ---------------------------------------------------------------------------
// "The reconciler lists only claims of actions it has a probe for" and
// action_pattern: "`charge` never matches `charge_refund`, with `\`, `%` and
// `_` escaped wherever they fall (in the name, or in its length's bytes)"

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_is_asked_only_about_its_own_action_whatever_the_names() {
    let gate = testing::gate().await;
    let x = |n: usize| "x".repeat(n);
    // (action with a probe, actions without one that a sloppy pattern matches)
    let families: Vec<(String, Vec<String>)> = vec![
        (
            "charge".into(),
            vec!["charge_refund".into(), "chargeX".into()],
        ),
        ("a_c".into(), vec!["abc".into(), "a_cd".into()]),
        ("a%".into(), vec!["ab".into(), "a%b".into(), "aXYZ".into()]),
        ("a\\".into(), vec!["a\\\\".into(), "a\\b".into()]),
        ("é_%\\".into(), vec!["é_%\\x".into(), "éa%\\".into()]),
        // Lengths whose byte is `%` (37), `\` (92), `_` (95).
        (x(37), vec![x(38), x(36), format!("{}y", x(37))]),
        (x(92), vec![x(93), x(91)]),
        (x(95), vec![x(96), x(94)]),
        // Lengths that straddle a one-byte length (127, 128, 300).
        (x(127), vec![x(128)]),
        (x(300), vec![x(301), x(299)]),
    ];
    let seen: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let mut reconciler = Reconciler::new(gate.pool().clone())
        .account(gate.account_name())
        .batch(1000);
    for (action, others) in &families {
        in_doubt(&gate, &Identity::new(action.as_str()).part(1_i64)).await;
        for other in others {
            in_doubt(&gate, &Identity::new(other.as_str()).part(1_i64)).await;
        }
        let registered = action.clone();
        let seen = seen.clone();
        reconciler = reconciler.probe(action.as_str(), move |doubt: Doubt| {
            seen.lock()
                .unwrap()
                .push((registered.clone(), doubt.identity.action().to_owned()));
            async { Verdict::Unknown }
        });
    }
    let pass = reconciler.reconcile_once().await.expect("a pass");
    let seen = seen.lock().unwrap().clone();
    let wrong: Vec<_> = seen
        .iter()
        .filter(|(probe, action)| probe != action)
        .collect();
    assert!(
        wrong.is_empty(),
        "probes asked about other actions: {wrong:?}"
    );
    assert_eq!(pass.probed, families.len(), "{pass:?} {seen:?}");
}

// ---------------------------------------------------------------------------
// "A claim whose probe can answer is reached within one cycle, whatever else
// is in doubt" / "Each resolution ... pending_older_than": odd option values
// must not stop the reconciler from reaching claims in doubt.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_pending_older_than_still_reaches_the_claims_in_doubt() {
    let gate = testing::gate().await;
    let id = Identity::new("rt_huge").part("ord_1");
    in_doubt(&gate, &id).await;
    let reconciler = Reconciler::new(gate.pool().clone())
        .account(gate.account_name())
        // "never probe pending claims, in practice"
        .pending_older_than(Duration::MAX)
        .probe("rt_huge", |_| async { Verdict::NotHappened });
    let pass = reconciler.reconcile_once().await;
    assert!(
        matches!(pass, Ok(ref p) if p.resolved == 1),
        "a claim in doubt was not reached: {pass:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_claim_younger_than_pending_older_than_is_never_probed() {
    let gate = testing::gate().await;
    let id = Identity::new("rt_young").part("ord_1");
    let claim = gate.claim(&id).await.expect("claim");
    let calls: Calls = Arc::default();
    let reconciler = Reconciler::new(gate.pool().clone())
        .account(gate.account_name())
        // Under a second: a seconds-granular age would read it as 0.
        .pending_older_than(Duration::from_millis(900))
        .probe("rt_young", {
            let calls = calls.clone();
            move |doubt| {
                counted(&calls, &doubt);
                async { Verdict::NotHappened }
            }
        });
    let pass = reconciler.reconcile_once().await.expect("a pass");
    assert_eq!(pass.probed, 0, "{pass:?}");
    assert_eq!(state(&gate, &id).await.as_deref(), Some("pending"));
    claim.settle().await.expect("settle");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_zero_and_probe_timeout_zero_are_clamped_not_fatal() {
    let gate = testing::gate().await;
    for k in 0..3_i64 {
        in_doubt(&gate, &Identity::new("rt_clamp").part(k)).await;
    }
    let reconciler = Reconciler::new(gate.pool().clone())
        .account(gate.account_name())
        .batch(0)
        .probe_timeout(Duration::ZERO)
        .probe("rt_clamp", |_| async { Verdict::NotHappened });
    // Whether a probe's task is scheduled within the clamped 1 ms depends on
    // the machine's load; a probe that misses it is unknown, and waits for
    // a later pass. Each claim is asked once in these passes either way.
    let (mut resolved, mut timed_out) = (0, 0);
    for _ in 0..6 {
        let pass = reconciler.reconcile_once().await.expect("a pass");
        assert!(
            pass.probed <= 1,
            "batch(0) is at least 1, not unbounded: {pass:?}"
        );
        resolved += pass.resolved;
        timed_out += pass.timed_out;
    }
    assert_eq!(
        resolved + timed_out,
        3,
        "each claim was asked once, and answered or timed out: {resolved} resolved, \
         {timed_out} timed out"
    );
}

// ---------------------------------------------------------------------------
// "Still unknown: the claim stays held, and is probed again later, each time
// after a longer pause" (Verdict::Unknown) — one reconciler, passes that
// overlap (reconcile_once takes &self: a cron job and an admin endpoint).

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn overlapping_passes_of_one_reconciler_ask_a_probe_once_per_pause() {
    let gate = testing::gate().await;
    for k in 0..5_i64 {
        in_doubt(&gate, &Identity::new("rt_overlap").part(k)).await;
    }
    let calls: Calls = Arc::default();
    let reconciler = Arc::new(
        Reconciler::new(gate.pool().clone())
            .account(gate.account_name())
            .probe("rt_overlap", {
                let calls = calls.clone();
                move |doubt| {
                    counted(&calls, &doubt);
                    async {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        Verdict::Unknown
                    }
                }
            }),
    );
    let barrier = Arc::new(Barrier::new(2));
    let pass = |r: Arc<Reconciler>, b: Arc<Barrier>| {
        tokio::spawn(async move {
            b.wait().await;
            r.reconcile_once().await.expect("a pass")
        })
    };
    let (p1, p2) = tokio::join!(
        pass(reconciler.clone(), barrier.clone()),
        pass(reconciler.clone(), barrier)
    );
    let calls = calls.lock().unwrap().clone();
    let twice: Vec<_> = calls.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "one reconciler asked a probe twice about a claim within its first pause \
         (a probe may have effects): {twice:?}; passes {:?} {:?}",
        p1.expect("no panic"),
        p2.expect("no panic")
    );
}

// ---------------------------------------------------------------------------
// "a lease that runs out under OnExpiry::InDoubt does the same for a holder
// that vanished ... A Reconciler finds those claims" (reconcile.rs module
// doc); Doubt::reason "`lease_expired` (its holder vanished under
// on_expiry = "in_doubt")".

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_holders_expired_lease_under_on_expiry_in_doubt_is_found_by_the_reconciler() {
    let gate = testing::gate().await;
    let id = Identity::new("rt_vanished").part("ord_1");
    // The holder vanishes mid-action: no settle, no release.
    crate::support::holders::vanish(
        gate.guard(&id)
            .lease(Duration::from_millis(200))
            .on_expiry(idem::OnExpiry::InDoubt)
            .claim()
            .await
            .expect("won"),
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    let reasons: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
    let reconciler = Reconciler::new(gate.pool().clone())
        .account(gate.account_name())
        .probe("rt_vanished", {
            let reasons = reasons.clone();
            move |doubt: Doubt| {
                reasons.lock().unwrap().push(doubt.reason.clone());
                async { Verdict::Unknown }
            }
        });
    let pass = reconciler.reconcile_once().await.expect("a pass");
    assert_eq!(
        pass.probed,
        1,
        "the claim whose lease ran out under on_expiry = in_doubt (stored as {:?}) was \
         not probed until a retry turns it: {pass:?}",
        state(&gate, &id).await
    );
    assert_eq!(
        *reasons.lock().unwrap(),
        vec![Some("lease_expired".to_owned())]
    );
}

/// Under `on_expiry = "take_over"` a claim whose lease ran out is probed
/// too (the row cannot say which `on_expiry` it was made with), and a retry
/// that takes it over while the probe runs wins: the takeover raised the
/// fence, so the reconciler's resolution, made against the fence it saw,
/// changes nothing, and the new holder settles its own claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_expired_take_over_claim_is_probed_and_a_takeover_meanwhile_wins() {
    let gate = testing::gate().await;
    let id = Identity::new("rt_taken").part("ord_1");
    crate::support::holders::vanish(
        gate.guard(&id)
            .lease(Duration::from_millis(100))
            .on_expiry(idem::OnExpiry::TakeOver)
            .claim()
            .await
            .expect("won"),
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let asked = Arc::new(tokio::sync::Notify::new());
    let go = Arc::new(tokio::sync::Notify::new());
    let reconciler = Reconciler::new(gate.pool().clone())
        .account(gate.account_name())
        .probe("rt_taken", {
            let (asked, go) = (asked.clone(), go.clone());
            move |doubt: Doubt| {
                let (asked, go) = (asked.clone(), go.clone());
                async move {
                    assert_eq!(doubt.state, operations::ClaimState::Pending);
                    assert_eq!(doubt.reason.as_deref(), Some("lease_expired"));
                    asked.notify_one();
                    go.notified().await;
                    Verdict::NotHappened
                }
            }
        });
    let (_, seen_fence) = state_of(&gate, &id).await.expect("held");
    let pass = tokio::spawn(async move { reconciler.reconcile_once().await });
    asked.notified().await;
    let retry = gate
        .guard(&id)
        .lease(Duration::from_millis(100))
        .on_expiry(idem::OnExpiry::TakeOver)
        .claim()
        .await
        .expect("the retry takes the expired claim over");
    go.notify_one();
    let pass = pass.await.expect("no panic").expect("a pass");
    assert_eq!((pass.probed, pass.resolved), (1, 0), "{pass:?}");
    let (stored, fence) = state_of(&gate, &id).await.expect("held");
    assert_eq!(stored, "pending");
    assert!(fence > seen_fence, "the takeover raised the fence: {fence}");
    retry
        .settle()
        .await
        .expect("the new holder settles its claim");
    assert_eq!(state(&gate, &id).await.as_deref(), Some("success"));
}

// ---------------------------------------------------------------------------
// "The shutdown is watched ... never polled again once it completed" and
// "a probe under way is cancelled, its claim left held" (Reconciler::run).

/// A shutdown that panics if polled again after it completed.
struct Once {
    rx: tokio::sync::oneshot::Receiver<()>,
    done: bool,
}

impl std::future::Future for Once {
    type Output = ();
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        assert!(!self.done, "the shutdown was polled after it completed");
        match std::pin::Pin::new(&mut self.rx).poll(cx) {
            std::task::Poll::Ready(_) => {
                self.done = true;
                std::task::Poll::Ready(())
            }
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_mid_probe_cancels_it_leaves_the_claim_held_and_is_polled_once() {
    let gate = testing::gate().await;
    let hang = Identity::new("rt_stop").part("a");
    in_doubt(&gate, &hang).await;
    let after = Identity::new("rt_stop").part("b");
    in_doubt(&gate, &after).await;
    let started = Arc::new(tokio::sync::Notify::new());
    let asked = Arc::new(AtomicUsize::new(0));
    let dropped = Arc::new(AtomicUsize::new(0));
    struct Dropped(Arc<AtomicUsize>);
    impl Drop for Dropped {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let reconciler = Reconciler::new(gate.pool().clone())
        .account(gate.account_name())
        .probe_timeout(Duration::from_secs(60))
        .probe("rt_stop", {
            let (started, asked, dropped) = (started.clone(), asked.clone(), dropped.clone());
            move |_| {
                asked.fetch_add(1, Ordering::SeqCst);
                let (started, guard) = (started.clone(), Dropped(dropped.clone()));
                async move {
                    let _guard = guard;
                    started.notify_one();
                    std::future::pending::<()>().await;
                    Verdict::NotHappened
                }
            }
        });
    let (stop, rx) = tokio::sync::oneshot::channel();
    let running = tokio::spawn(async move {
        reconciler.run(Once { rx, done: false }).await;
    });
    started.notified().await;
    stop.send(()).expect("send");
    tokio::time::timeout(Duration::from_secs(5), running)
        .await
        .expect("run did not stop while a probe hung")
        .expect("run panicked (the shutdown polled again?)");
    tokio::time::sleep(Duration::from_millis(50)).await;
    // Both claims' probes run at once (probe_concurrency 4): every probe
    // under way is cancelled, none is left running.
    let asked = asked.load(Ordering::SeqCst);
    assert!(asked >= 1, "a probe was asked");
    assert_eq!(
        dropped.load(Ordering::SeqCst),
        asked,
        "every probe was cancelled"
    );
    assert_eq!(state(&gate, &hang).await.as_deref(), Some("in_doubt"));
    assert_eq!(state(&gate, &after).await.as_deref(), Some("in_doubt"));
}

// ---------------------------------------------------------------------------
// "Claims resolved meanwhile by someone else (another reconciler, an
// operator ...): left as they are" (Pass::lost); "nothing ever overwrites a
// success".

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_resolving_while_a_probe_is_slow_wins_and_the_pass_counts_it_lost() {
    let gate = testing::gate().await;
    let id = Identity::new("rt_operator").part("ord_1");
    in_doubt(&gate, &id).await;
    let asked = Arc::new(tokio::sync::Notify::new());
    let go = Arc::new(tokio::sync::Notify::new());
    let reconciler = Reconciler::new(gate.pool().clone())
        .account(gate.account_name())
        .probe("rt_operator", {
            let (asked, go) = (asked.clone(), go.clone());
            move |_| {
                let (asked, go) = (asked.clone(), go.clone());
                async move {
                    asked.notify_one();
                    go.notified().await;
                    Verdict::NotHappened
                }
            }
        });
    let pass = tokio::spawn(async move { reconciler.reconcile_once().await });
    asked.notified().await;
    let address = id.address();
    let slot = operations::Slot::new(gate.account_name(), None, &address);
    let by_hand = operations::resolve(gate.pool(), slot, Outcome::Succeeded(Some("\"by hand\"")))
        .await
        .expect("resolve");
    assert!(
        matches!(by_hand, operations::Resolved::Changed { .. }),
        "{by_hand:?}"
    );
    go.notify_one();
    let pass = pass.await.expect("no panic").expect("a pass");
    assert_eq!((pass.resolved, pass.lost), (0, 1), "{pass:?}");
    assert_eq!(state(&gate, &id).await.as_deref(), Some("success"));
}

// ---------------------------------------------------------------------------
// Verdict::succeeded_with: "the value duplicates of a replay function get
// back".

#[idempotent(key = "order", replay, action = "rt_replay", disposition = ChargeError::disposition)]
async fn rt_replay(gate: &Gate, order: &str, runs: &AtomicUsize) -> Result<String, ChargeError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Err(ChargeError::Timeout)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn succeeded_with_is_what_every_retry_replays() {
    let gate = testing::gate().await;
    let runs = AtomicUsize::new(0);
    let first = rt_replay(&gate, "ord_1", &runs).await;
    assert!(first.is_err(), "{first:?}");
    let held = rt_replay(&gate, "ord_1", &runs).await;
    assert!(held.is_err(), "held in doubt: {held:?}");
    let reconciler = Reconciler::new(gate.pool().clone())
        .account(gate.account_name())
        .probe("rt_replay", |_| async {
            Verdict::succeeded_with(&"receipt \u{202e} \"r_1\"".to_owned()).expect("json")
        });
    let pass = reconciler.reconcile_once().await.expect("a pass");
    assert_eq!(pass.resolved, 1, "{pass:?}");
    for _ in 0..2 {
        let replayed = rt_replay(&gate, "ord_1", &runs).await;
        assert_eq!(
            replayed.as_deref().ok(),
            Some("receipt \u{202e} \"r_1\""),
            "{replayed:?}"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the body ran once");
}

// ---------------------------------------------------------------------------
// "What it remembers of a claim is keyed by its address and fence, so a
// claim released and made anew starts without the old pause" and "a verdict
// the store could not record is ... recorded by a later pass without asking
// the probe again" (docs/operations.md): the kept verdict is the old claim's,
// never its successor's at the same address.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_verdict_is_never_applied_to_a_claim_made_anew_at_its_address() {
    use idem_test_support::fault_proxy::Proxy;
    let gate = testing::gate().await;
    let id = Identity::new("rt_kept").part("ord_1");
    in_doubt(&gate, &id).await;
    let old_fence = state_of(&gate, &id).await.expect("held").1;
    let proxy = Arc::new(tokio::sync::Mutex::new(Proxy::start().await));
    let pool = proxy.lock().await.pool(2).await;
    let asked = Arc::new(AtomicUsize::new(0));
    let reconciler = Reconciler::new(pool)
        .account(gate.account_name())
        .probe("rt_kept", {
            let (asked, proxy) = (asked.clone(), proxy.clone());
            move |_| {
                let (asked, proxy) = (asked.clone(), proxy.clone());
                async move {
                    if asked.fetch_add(1, Ordering::SeqCst) == 0 {
                        // The provider said it charged; then the store goes.
                        proxy.lock().await.cut().await;
                        Verdict::succeeded_with(&"old".to_owned()).expect("json")
                    } else {
                        Verdict::NotHappened
                    }
                }
            }
        });
    assert!(reconciler.reconcile_once().await.is_err());
    // Meanwhile an operator released it, and a retry made it anew, in doubt.
    let address = id.address();
    let slot = operations::Slot::new(gate.account_name(), None, &address);
    let released = operations::resolve(gate.pool(), slot, Outcome::Failed(Disposition::Release))
        .await
        .expect("release");
    assert!(matches!(released, operations::Resolved::Changed { .. }));
    in_doubt(&gate, &id).await;
    let new_fence = state_of(&gate, &id).await.expect("held").1;
    assert_ne!(old_fence, new_fence);
    proxy.lock().await.resume().await;
    let mut passes = Vec::new();
    for _ in 0..3 {
        if let Ok(pass) = reconciler.reconcile_once().await {
            let done = pass.resolved + pass.lost > 0;
            passes.push(pass);
            if done {
                break;
            }
        }
    }
    assert_eq!(
        state(&gate, &id).await,
        None,
        "the new claim got its predecessor's kept verdict instead of its own probe's \
         (asked {} times): {passes:?}",
        asked.load(Ordering::SeqCst)
    );
    assert_eq!(asked.load(Ordering::SeqCst), 2);
}

// "a probe still running then is cancelled, its claim stays held, and it is
// asked again after a pause, as after an unknown" (probe_timeout)

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_probe_is_not_asked_again_before_its_pause() {
    let gate = testing::gate().await;
    let id = Identity::new("rt_timeout").part("ord_1");
    in_doubt(&gate, &id).await;
    let calls: Calls = Arc::default();
    let reconciler = Reconciler::new(gate.pool().clone())
        .account(gate.account_name())
        .probe_timeout(Duration::from_millis(20))
        .probe("rt_timeout", {
            let calls = calls.clone();
            move |doubt| {
                counted(&calls, &doubt);
                async {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    Verdict::NotHappened
                }
            }
        });
    let first = reconciler.reconcile_once().await.expect("a pass");
    assert_eq!(
        (first.probed, first.unknown, first.timed_out),
        (1, 1, 1),
        "{first:?}"
    );
    for _ in 0..3 {
        let again = reconciler.reconcile_once().await.expect("a pass");
        assert_eq!(again.probed, 0, "asked again at once: {again:?}");
    }
    assert_eq!(state(&gate, &id).await.as_deref(), Some("in_doubt"));
}

// "Runs passes until shutdown completes ... The shutdown is watched between
// claims": a shutdown that already came asks no probe.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_with_a_shutdown_that_already_came_asks_no_probe() {
    let gate = testing::gate().await;
    let id = Identity::new("rt_already").part("ord_1");
    in_doubt(&gate, &id).await;
    let calls: Calls = Arc::default();
    let reconciler = Reconciler::new(gate.pool().clone())
        .account(gate.account_name())
        .probe("rt_already", {
            let calls = calls.clone();
            move |doubt| {
                counted(&calls, &doubt);
                async { Verdict::NotHappened }
            }
        });
    tokio::time::timeout(Duration::from_secs(5), reconciler.run(async {}))
        .await
        .expect("run returns");
    assert!(calls.lock().unwrap().is_empty(), "{calls:?}");
    assert_eq!(state(&gate, &id).await.as_deref(), Some("in_doubt"));
}

// "after a store error, with a pause that doubles up to LONGEST_BACKOFF"
// (run): the loop outlives an outage and resolves the claim once the store
// is back.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_outlives_a_store_outage_and_resolves_once_it_is_back() {
    use idem_test_support::fault_proxy::Proxy;
    let gate = testing::gate().await;
    let id = Identity::new("rt_outage").part("ord_1");
    in_doubt(&gate, &id).await;
    let mut proxy = Proxy::start().await;
    let pool = proxy.pool(2).await;
    proxy.cut().await;
    let calls: Calls = Arc::default();
    let reconciler = Reconciler::new(pool)
        .account(gate.account_name())
        .interval(Duration::from_millis(20))
        .probe("rt_outage", {
            let calls = calls.clone();
            move |doubt| {
                counted(&calls, &doubt);
                async { Verdict::Failed }
            }
        });
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        reconciler
            .run(async {
                stopped.await.ok();
            })
            .await;
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.resume().await;
    let mut now = None;
    for _ in 0..100 {
        now = state(&gate, &id).await;
        if now.as_deref() == Some("failed") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.send(()).ok();
    tokio::time::timeout(Duration::from_secs(5), running)
        .await
        .expect("stops")
        .expect("no panic");
    assert_eq!(now.as_deref(), Some("failed"));
    assert_eq!(
        calls.lock().unwrap().values().copied().collect::<Vec<_>>(),
        vec![1]
    );
}

/// Inserts `count` claims of `action` in doubt in one statement: every one
/// with the same `created_at` (one `now()`).
async fn bulk_in_doubt(gate: &Gate, action: &str, from: i64, count: i64) -> Vec<Identity> {
    let ids: Vec<Identity> = (from..from + count)
        .map(|k| Identity::new(action).part(k))
        .collect();
    let addresses: Vec<String> = ids.iter().map(Identity::address).collect();
    let identities: Vec<Vec<u8>> = ids.iter().map(|id| id.canonical().to_vec()).collect();
    idem::sqlx::query(
        "INSERT INTO idem_records \
             (account, kind, address, namespace, state, identity, created_at, in_doubt_since, \
              state_reason) \
         SELECT $1, 'claim', a, NULL, 'in_doubt', i, now(), now(), 'body_in_doubt' \
         FROM unnest($2::text[], $3::bytea[]) AS t(a, i)",
    )
    .bind(gate.account_name())
    .bind(&addresses)
    .bind(&identities)
    .execute(gate.pool())
    .await
    .expect("insert claims in doubt");
    ids
}

// "Each pass reads the next window of claims (a batch), oldest first ... and
// moves on from where the last pass stopped ... a claim whose probe can
// answer is asked within one cycle (the claims with a probe, divided by the
// batch, plus one passes)" (Reconciler): claims made in the same
// microsecond, windows of one.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windows_of_one_walk_claims_made_in_the_same_microsecond_each_once() {
    const CLAIMS: i64 = 60;
    let gate = testing::gate().await;
    let ids = bulk_in_doubt(&gate, "rt_tie", 0, CLAIMS).await;
    let calls: Calls = Arc::default();
    let reconciler = Reconciler::new(gate.pool().clone())
        .account(gate.account_name())
        .batch(1)
        .probe("rt_tie", {
            let calls = calls.clone();
            move |doubt| {
                counted(&calls, &doubt);
                async { Verdict::Unknown }
            }
        });
    // One cycle: CLAIMS / 1 + 1 passes, all within the first pause.
    for _ in 0..=CLAIMS {
        reconciler.reconcile_once().await.expect("a pass");
    }
    let calls = calls.lock().unwrap().clone();
    let missed: Vec<_> = ids
        .iter()
        .map(Identity::address)
        .filter(|a| !calls.contains_key(a))
        .collect();
    assert!(
        missed.is_empty(),
        "{} never asked in one cycle: {missed:?}",
        missed.len()
    );
    assert!(calls.values().all(|n| *n == 1), "{calls:?}");
}

// "thousands of claims without probes ahead of one with a probe": "Claims of
// actions without a probe are never read" — a claim with a probe, newest of
// all, behind 3000 without one, is reached in (1 / 1 + 1) = 2 passes of one.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_claims_without_a_probe_never_hold_up_the_one_with_a_probe() {
    let gate = testing::gate().await;
    bulk_in_doubt(&gate, "rt_no_probe", 0, 3000).await;
    // Prefixes of the probed action, and the action with a suffix.
    bulk_in_doubt(&gate, "rt_prob", 0, 200).await;
    bulk_in_doubt(&gate, "rt_probed_", 0, 200).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let id = Identity::new("rt_probed").part("ord_1");
    in_doubt(&gate, &id).await;
    let reconciler = Reconciler::new(gate.pool().clone())
        .account(gate.account_name())
        .batch(1)
        .probe("rt_probed", |_| async { Verdict::Failed });
    let mut resolved = 0;
    for _ in 0..2 {
        resolved += reconciler.reconcile_once().await.expect("a pass").resolved;
    }
    assert_eq!(resolved, 1);
    assert_eq!(state(&gate, &id).await.as_deref(), Some("failed"));
}

// Doubt: "The account (tenant) it was claimed in", "Its namespace", "The
// fencing token it was claimed (or taken over) with", "ClaimState::InDoubt,
// or ClaimState::Pending for a claim older than pending_older_than", reason
// "`body_in_doubt` ... `None` for a pending claim"; Reconciler::account "Only
// the claims of `account`"; new: "every account of the store".

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_doubt_says_which_claim_it_is_and_the_account_scope_holds() {
    let base = testing::gate().await;
    let acme = base.account(format!("{}_a%_\\", base.account_name()));
    let other = base.account(format!("{}_b", base.account_name()));
    let live = acme.namespace("live\u{1b}");
    let id = Identity::new("rt_doubt").part("ord_1");
    in_doubt(&acme, &id).await;
    in_doubt(&other, &id).await;
    in_doubt(&live, &id).await;
    // A pending claim whose holder is gone: its lease ran out.
    let gone = Identity::new("rt_doubt").part("ord_gone");
    crate::support::holders::vanish(
        acme.guard(&gone)
            .lease(Duration::from_millis(50))
            .claim()
            .await
            .expect("won"),
    );
    tokio::time::sleep(Duration::from_millis(120)).await;
    let seen: Arc<Mutex<Vec<Doubt>>> = Arc::default();
    let probe = {
        let seen = seen.clone();
        move |doubt: Doubt| {
            seen.lock().unwrap().push(doubt);
            async { Verdict::Unknown }
        }
    };
    let scoped = Reconciler::new(acme.pool().clone())
        .account(acme.account_name())
        .pending_older_than(Duration::from_millis(10))
        .probe("rt_doubt", probe.clone());
    let pass = scoped.reconcile_once().await.expect("a pass");
    assert_eq!(pass.probed, 3, "{pass:?}");
    let doubts = std::mem::take(&mut *seen.lock().unwrap());
    let now = std::time::SystemTime::now();
    for doubt in &doubts {
        assert_eq!(doubt.account, acme.account_name(), "{doubt:?}");
        let (stored, fence) = match doubt.namespace.as_deref() {
            None => {
                let identity = if doubt.identity.address() == gone.address() {
                    &gone
                } else {
                    &id
                };
                let scope = ScopeFilter::new()
                    .account(acme.account_name())
                    .namespace(NamespaceFilter::Without);
                let row = operations::find(acme.pool(), &identity.address(), &scope)
                    .await
                    .expect("find")
                    .into_iter()
                    .next()
                    .expect("held");
                (row.state.to_string(), row.fence)
            }
            Some(ns) => {
                assert_eq!(ns, "live\u{1b}");
                let scope = ScopeFilter::new()
                    .account(live.account_name())
                    .namespace(NamespaceFilter::Named(ns));
                let row = operations::find(live.pool(), &id.address(), &scope)
                    .await
                    .expect("find")
                    .into_iter()
                    .next()
                    .expect("held");
                (row.state.to_string(), row.fence)
            }
        };
        assert_eq!(doubt.fence, fence, "{doubt:?}");
        assert_eq!(doubt.address, doubt.identity.address());
        let age = now
            .duration_since(doubt.claimed_at)
            .expect("claimed in the past");
        assert!(age < Duration::from_secs(30), "{doubt:?}");
        match stored.as_str() {
            "in_doubt" => {
                assert_eq!(doubt.state, operations::ClaimState::InDoubt);
                assert_eq!(doubt.reason.as_deref(), Some("body_in_doubt"));
            }
            _ => {
                assert_eq!(doubt.state, operations::ClaimState::Pending, "{doubt:?}");
                // Its lease ran out: it says so, as a claim in doubt by
                // its lease does (the pending row keeps no reason).
                assert_eq!(doubt.reason.as_deref(), Some("lease_expired"));
            }
        }
    }
    // Unscoped, it reaches the other account too (and the claims of accounts
    // of other tests, whose probes are not ours: only rt_doubt is asked).
    let everywhere = Reconciler::new(acme.pool().clone())
        .batch(10_000)
        .probe("rt_doubt", probe);
    everywhere.reconcile_once().await.expect("a pass");
    let doubts = std::mem::take(&mut *seen.lock().unwrap());
    for account in [acme.account_name(), other.account_name()] {
        assert!(
            doubts.iter().any(|d| d.account == account),
            "{account} not reached"
        );
    }
}

// "Probes run in tasks of their own, each bounded by
// Reconciler::probe_timeout; a panic or a hang is an unknown" (module doc):
// a pass dropped mid-probe (an admin endpoint's request timed out, a
// select! elsewhere won) leaves no probe running unbounded.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_dropped_mid_probe_leaves_no_probe_running() {
    let gate = testing::gate().await;
    let id = Identity::new("rt_dropped").part("ord_1");
    in_doubt(&gate, &id).await;
    let alive = Arc::new(AtomicUsize::new(0));
    struct Alive(Arc<AtomicUsize>);
    impl Drop for Alive {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }
    let reconciler = Reconciler::new(gate.pool().clone())
        .account(gate.account_name())
        .probe_timeout(Duration::from_secs(3600))
        .probe("rt_dropped", {
            let alive = alive.clone();
            move |_| {
                alive.fetch_add(1, Ordering::SeqCst);
                let guard = Alive(alive.clone());
                async move {
                    let _guard = guard;
                    std::future::pending::<()>().await;
                    Verdict::NotHappened
                }
            }
        });
    let cut_short =
        tokio::time::timeout(Duration::from_millis(200), reconciler.reconcile_once()).await;
    assert!(cut_short.is_err(), "the probe hangs: {cut_short:?}");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        alive.load(Ordering::SeqCst),
        0,
        "the probe of a dropped pass still runs, bounded by nothing"
    );
    assert_eq!(state(&gate, &id).await.as_deref(), Some("in_doubt"));
}

// "A verdict the store could not record is tried again (three times), and
// otherwise kept ... without asking the probe again" (docs/operations.md):
// the reply of the resolution lost on the wire; the probe is asked once, the
// claim resolved once, and the pass goes on.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resolution_whose_reply_is_lost_is_retried_without_asking_again() {
    use idem_test_support::fault_proxy::{Proxy, Statement};
    let gate = testing::gate().await;
    let settled = Identity::new("rt_lost").part("a");
    let released = Identity::new("rt_lost").part("b");
    in_doubt(&gate, &settled).await;
    tokio::time::sleep(Duration::from_millis(2)).await;
    in_doubt(&gate, &released).await;
    let proxy = Proxy::start().await;
    let pool = proxy.pool(2).await;
    let calls: Calls = Arc::default();
    let a = settled.address();
    let reconciler = Reconciler::new(pool)
        .account(gate.account_name())
        .probe("rt_lost", {
            let calls = calls.clone();
            move |doubt: Doubt| {
                counted(&calls, &doubt);
                let verdict = if doubt.address == a {
                    Verdict::succeeded()
                } else {
                    Verdict::NotHappened
                };
                async move { verdict }
            }
        });
    assert!(proxy.lose_next_reply(Statement::Settle));
    assert!(proxy.lose_next_reply(Statement::Release));
    let mut passes = Vec::new();
    for _ in 0..3 {
        let pass = reconciler.reconcile_once().await;
        let done = matches!(&pass, Ok(p) if p.probed == 0);
        passes.push(pass);
        if done {
            break;
        }
    }
    assert_eq!(
        state(&gate, &settled).await.as_deref(),
        Some("success"),
        "{passes:?}"
    );
    assert_eq!(state(&gate, &released).await, None, "{passes:?}");
    let calls = calls.lock().unwrap().clone();
    assert!(
        calls.values().all(|n| *n == 1),
        "asked again: {calls:?} {passes:?}"
    );
    assert_eq!(calls.len(), 2);
    assert!(!proxy.take_lost_replies().is_empty(), "no reply was lost");
    let resolved: usize = passes.iter().flatten().map(|p| p.resolved).sum();
    assert_eq!(resolved, 2, "{passes:?}");
}

// "A pending claim whose lease is live is never probed nor resolved ... (the
// resolution itself refuses it, should the lease be renewed after the claim
// was listed)" (pending_older_than); Pass::lost "or whose holder renewed its
// lease meanwhile: left as they are".

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_renewed_while_its_probe_runs_is_left_to_its_holder() {
    let gate = testing::gate().await;
    let id = Identity::new("rt_renewed").part("ord_1");
    let claim = gate
        .guard(&id)
        .lease(Duration::from_millis(100))
        .claim()
        .await
        .expect("won");
    // The holder stalls past its lease (a GC pause), nobody takes over.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let asked = Arc::new(tokio::sync::Notify::new());
    let go = Arc::new(tokio::sync::Notify::new());
    let reconciler = Reconciler::new(gate.pool().clone())
        .account(gate.account_name())
        .pending_older_than(Duration::from_millis(50))
        .probe("rt_renewed", {
            let (asked, go) = (asked.clone(), go.clone());
            move |_| {
                let (asked, go) = (asked.clone(), go.clone());
                async move {
                    asked.notify_one();
                    go.notified().await;
                    Verdict::NotHappened
                }
            }
        });
    let pass = tokio::spawn(async move { reconciler.reconcile_once().await });
    asked.notified().await;
    let renewed = claim.extend(Duration::from_secs(30)).await;
    go.notify_one();
    let pass = pass.await.expect("no panic").expect("a pass");
    if renewed.is_ok() {
        assert_eq!((pass.resolved, pass.lost), (0, 1), "{pass:?}");
        assert_eq!(state(&gate, &id).await.as_deref(), Some("pending"));
        claim.settle().await.expect("the holder settles its claim");
        assert_eq!(state(&gate, &id).await.as_deref(), Some("success"));
    } else {
        panic!("the holder could not renew its lapsed lease: {renewed:?} ({pass:?})");
    }
}

// "a resolution under way is finished first, so none is cut in half"
// (Reconciler::run): the shutdown comes while the resolution waits on the
// claim's row lock.

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shutdown_during_a_resolution_waits_for_it_to_finish() {
    let gate = testing::gate().await;
    let id = Identity::new("rt_finish").part("ord_1");
    in_doubt(&gate, &id).await;
    // Someone (an operator's session) holds the row for a while.
    let mut blocker = gate.pool().begin().await.expect("begin");
    idem::sqlx::query("SELECT 1 FROM idem_records WHERE account = $1 AND address = $2 FOR UPDATE")
        .bind(gate.account_name())
        .bind(id.address())
        .execute(&mut *blocker)
        .await
        .expect("lock the row");
    let asked = Arc::new(AtomicUsize::new(0));
    let reconciler = Reconciler::new(gate.pool().clone())
        .account(gate.account_name())
        .probe("rt_finish", {
            let asked = asked.clone();
            move |_| {
                asked.fetch_add(1, Ordering::SeqCst);
                async { Verdict::NotHappened }
            }
        });
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let mut running = tokio::spawn(async move {
        reconciler
            .run(async {
                stopped.await.ok();
            })
            .await;
    });
    while asked.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.send(()).expect("send");
    let early = tokio::time::timeout(Duration::from_millis(300), &mut running).await;
    assert!(
        early.is_err(),
        "run returned with the resolution cut in half"
    );
    blocker.commit().await.expect("let go of the row");
    tokio::time::timeout(Duration::from_secs(5), running)
        .await
        .expect("run stops once the resolution is done")
        .expect("no panic");
    assert_eq!(state(&gate, &id).await, None, "the resolution was finished");
    assert_eq!(asked.load(Ordering::SeqCst), 1);
}

// "Unknown claims are probed again after a pause that doubles, up to five
// minutes" (docs/operations.md); Reconciler::FIRST_WAIT "The first pause
// ... each further unknown doubles it".

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_is_asked_again_after_the_first_pause_then_after_a_longer_one() {
    let gate = testing::gate().await;
    let id = Identity::new("rt_pause").part("ord_1");
    in_doubt(&gate, &id).await;
    let asked = Arc::new(AtomicUsize::new(0));
    let reconciler = Reconciler::new(gate.pool().clone())
        .account(gate.account_name())
        .probe("rt_pause", {
            let asked = asked.clone();
            move |_| {
                asked.fetch_add(1, Ordering::SeqCst);
                async { Verdict::Unknown }
            }
        });
    reconciler.reconcile_once().await.expect("a pass");
    reconciler.reconcile_once().await.expect("a pass");
    assert_eq!(asked.load(Ordering::SeqCst), 1);
    tokio::time::sleep(Reconciler::FIRST_WAIT + Duration::from_millis(100)).await;
    reconciler.reconcile_once().await.expect("a pass");
    reconciler.reconcile_once().await.expect("a pass");
    assert_eq!(
        asked.load(Ordering::SeqCst),
        2,
        "asked again after the first pause, once"
    );
    // The next pause is twice the first: not yet after one more FIRST_WAIT.
    tokio::time::sleep(Reconciler::FIRST_WAIT + Duration::from_millis(100)).await;
    reconciler.reconcile_once().await.expect("a pass");
    assert_eq!(asked.load(Ordering::SeqCst), 2, "the pause did not double");
}

// "a panic or a probe that never answers counts as unknown, and holds up
// neither the other claims nor the shutdown" (Reconciler): a probe that
// blocks its thread (a synchronous SDK call) rather than awaiting.

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_probe_that_blocks_its_thread_times_out_and_holds_up_nobody() {
    let gate = testing::gate().await;
    let blocks = Identity::new("rt_blocks").part("a");
    let knows = Identity::new("rt_knows").part("b");
    in_doubt(&gate, &blocks).await;
    in_doubt(&gate, &knows).await;
    let reconciler = Reconciler::new(gate.pool().clone())
        .account(gate.account_name())
        .probe_timeout(Duration::from_millis(100))
        .probe("rt_blocks", |_| async {
            std::thread::sleep(Duration::from_millis(1500));
            Verdict::NotHappened
        })
        .probe("rt_knows", |_| async { Verdict::Failed });
    let started = std::time::Instant::now();
    let pass = reconciler.reconcile_once().await.expect("a pass");
    assert!(
        started.elapsed() < Duration::from_millis(1000),
        "{:?}",
        started.elapsed()
    );
    assert_eq!((pass.resolved, pass.timed_out), (1, 1), "{pass:?}");
    assert_eq!(state(&gate, &knows).await.as_deref(), Some("failed"));
    assert_eq!(state(&gate, &blocks).await.as_deref(), Some("in_doubt"));
}

// "Each resolution is one compare-and-swap on the fence the reconciler saw"
// (module doc): a retry takes the lapsed claim over while its probe runs.

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_takeover_while_the_probe_runs_leaves_the_new_holder_alone() {
    let gate = testing::gate().await;
    let id = Identity::new("rt_takeover").part("ord_1");
    crate::support::holders::vanish(
        gate.guard(&id)
            .lease(Duration::from_millis(100))
            .claim()
            .await
            .expect("won"),
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let asked = Arc::new(tokio::sync::Notify::new());
    let go = Arc::new(tokio::sync::Notify::new());
    let reconciler = Reconciler::new(gate.pool().clone())
        .account(gate.account_name())
        .pending_older_than(Duration::from_millis(50))
        .probe("rt_takeover", {
            let (asked, go) = (asked.clone(), go.clone());
            move |_| {
                let (asked, go) = (asked.clone(), go.clone());
                async move {
                    asked.notify_one();
                    go.notified().await;
                    Verdict::NotHappened
                }
            }
        });
    let pass = tokio::spawn(async move { reconciler.reconcile_once().await });
    asked.notified().await;
    let retry = gate
        .guard(&id)
        .lease(Duration::from_secs(30))
        .claim()
        .await
        .expect("the retry takes the lapsed claim over");
    let fence = retry.fence().expect("fence");
    go.notify_one();
    let pass = pass.await.expect("no panic").expect("a pass");
    assert_eq!((pass.resolved, pass.lost), (0, 1), "{pass:?}");
    assert_eq!(
        state_of(&gate, &id).await,
        Some(("pending".to_owned(), fence))
    );
    retry.settle().await.expect("the new holder settles");
}
