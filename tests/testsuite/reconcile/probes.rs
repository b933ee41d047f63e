//! The reconciler's probes, concurrency, shutdown, store
//! errors, overlapping passes and its `Pass` counts.

use idem::{Disposition, Outcome};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem::reconcile::{Pass, Reconciler, Verdict};
use idem::testing;
use idem::{Gate, Identity};

use crate::support::doubt::{in_doubt, state_of};

async fn held(gate: &Gate, action: &str, n: usize) -> Vec<Identity> {
    let mut ids = Vec::new();
    for i in 0..n {
        let id = Identity::new(action).part(i as u64);
        in_doubt(gate, &id).await;
        ids.push(id);
    }
    ids
}

fn adds_up(pass: &Pass) -> bool {
    pass.probed == pass.resolved + pass.unknown + pass.lost
        && pass.panicked + pass.timed_out <= pass.unknown
}

/// Counts probes running at once, and the most at once.
#[derive(Default)]
struct Gauge {
    now: AtomicUsize,
    most: AtomicUsize,
    started: AtomicUsize,
}

struct Running(Arc<Gauge>);
impl Running {
    fn new(g: &Arc<Gauge>) -> Running {
        let now = g.now.fetch_add(1, Ordering::SeqCst) + 1;
        g.most.fetch_max(now, Ordering::SeqCst);
        g.started.fetch_add(1, Ordering::SeqCst);
        Running(g.clone())
    }
}
impl Drop for Running {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::SeqCst);
    }
}

/// `probe_concurrency`: "How many claims of a pass are handled at once
/// [...] (default 4; at least 1)".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconciler_probes_run_exactly_probe_concurrency_at_once() {
    let gate = testing::gate_on(testing::pool_with(12).await).await;
    let mut seen = Vec::new();
    for n in [None, Some(0usize), Some(1), Some(3)] {
        let action = testing::unique_name("rv_rc");
        let ids = held(&gate, &action, 9).await;
        let gauge = Arc::new(Gauge::default());
        let g = gauge.clone();
        let mut reconciler = Reconciler::new(gate.pool().clone())
            .account(gate.account_name())
            .probe(action.clone(), move |_d| {
                let running = Running::new(&g);
                async move {
                    tokio::time::sleep(Duration::from_millis(150)).await;
                    drop(running);
                    Verdict::succeeded()
                }
            });
        if let Some(n) = n {
            reconciler = reconciler.probe_concurrency(n);
        }
        let pass = reconciler.reconcile_once().await.expect("pass");
        assert!(adds_up(&pass), "Pass counts do not add up: {pass:?}");
        assert_eq!(
            pass.resolved, 9,
            "every claim resolved in one pass: {pass:?}"
        );
        for id in &ids {
            assert_eq!(
                state_of(&gate, id).await.map(|s| s.0).as_deref(),
                Some("success")
            );
        }
        seen.push((n, gauge.most.load(Ordering::SeqCst)));
    }
    let want = [4usize, 1, 1, 3];
    for ((n, most), want) in seen.iter().zip(want) {
        assert_eq!(
            *most, want,
            "probe_concurrency {n:?}: {most} probes ran at once, not {want} (all: {seen:?})"
        );
    }
}

/// "a probe that hangs holds up its own claim for up to the probe_timeout,
/// while the others go on probes - 1 at a time": the knowable claims are
/// resolved long before the hanging probe's timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconciler_a_hanging_probe_delays_only_its_own_claim() {
    let gate = testing::gate_on(testing::pool_with(10).await).await;
    let action = testing::unique_name("rv_rh");
    // The oldest claim hangs; 8 after it are known at once.
    let ids = held(&gate, &action, 9).await;
    let hang = ids[0].clone();
    let reconciler = Arc::new(
        Reconciler::new(gate.pool().clone())
            .account(gate.account_name())
            .probe_timeout(Duration::from_secs(6))
            .probe(action.clone(), move |d| {
                let hangs = d.identity == hang;
                async move {
                    if hangs {
                        std::future::pending::<()>().await;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    Verdict::succeeded()
                }
            }),
    );
    let r = reconciler.clone();
    let started = Instant::now();
    let pass = tokio::spawn(async move { r.reconcile_once().await });
    // Within 2 s (a third of the timeout), the 8 knowable claims are done.
    let deadline = started + Duration::from_secs(2);
    let mut done = 0;
    while Instant::now() < deadline {
        done = 0;
        for id in &ids[1..] {
            if state_of(&gate, id).await.map(|s| s.0).as_deref() == Some("success") {
                done += 1;
            }
        }
        if done == 8 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        done,
        8,
        "\"a probe that hangs delays only its own claim\": after {:?} only {done} of 8 knowable \
         claims were resolved while one probe hung",
        started.elapsed()
    );
    let pass = pass.await.expect("join").expect("pass");
    assert!(adds_up(&pass), "Pass counts do not add up: {pass:?}");
    assert_eq!((pass.resolved, pass.timed_out), (8, 1), "{pass:?}");
}

/// "every claim whose probe can answer is asked within one cycle (the
/// claims with a probe, divided by the batch, plus one passes)", with more
/// hanging probes than the concurrency among them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconciler_knowable_claims_are_resolved_within_a_cycle_among_hanging_ones() {
    let gate = testing::gate_on(testing::pool_with(10).await).await;
    let action = testing::unique_name("rv_rk");
    let ids = held(&gate, &action, 12).await;
    // Claims 0..=8 hang (more than 4 of them, at every place in the
    // order), 9..=11 are known.
    let hanging: Vec<Identity> = ids[..9].to_vec();
    let reconciler = Reconciler::new(gate.pool().clone())
        .account(gate.account_name())
        .batch(4)
        .probe_timeout(Duration::from_millis(300))
        .probe(action.clone(), move |d| {
            let hangs = hanging.contains(&d.identity);
            async move {
                if hangs {
                    std::future::pending::<()>().await;
                }
                Verdict::succeeded()
            }
        });
    let passes = 12usize.div_ceil(4) + 1;
    let mut total = Pass::default();
    for _ in 0..passes {
        let pass = reconciler.reconcile_once().await.expect("pass");
        assert!(adds_up(&pass), "Pass counts do not add up: {pass:?}");
        total.resolved += pass.resolved;
        total.timed_out += pass.timed_out;
    }
    for id in &ids[9..] {
        assert_eq!(
            state_of(&gate, id).await.map(|s| s.0).as_deref(),
            Some("success"),
            "a knowable claim was not resolved within {passes} passes among hanging probes \
             (resolved {}, timed out {})",
            total.resolved,
            total.timed_out
        );
    }
}

/// `run`: "The shutdown is watched between claims and during each probe (a
/// probe under way is cancelled, its claim left held)": the loop returns
/// soon after the shutdown, every probe under way is dropped, and no probe
/// starts after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconciler_shutdown_cancels_every_probe_and_starts_no_more() {
    let gate = testing::gate_on(testing::pool_with(10).await).await;
    let action = testing::unique_name("rv_rs");
    let ids = held(&gate, &action, 10).await;
    let gauge = Arc::new(Gauge::default());
    let g = gauge.clone();
    let reconciler = Arc::new(
        Reconciler::new(gate.pool().clone())
            .account(gate.account_name())
            .probe_timeout(Duration::from_secs(30))
            .probe(action.clone(), move |_d| {
                let running = Running::new(&g);
                async move {
                    let _running = running;
                    std::future::pending::<()>().await;
                    Verdict::succeeded()
                }
            }),
    );
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let r = reconciler.clone();
    let run = tokio::spawn(async move {
        r.run(async {
            let _ = rx.await;
        })
        .await
    });
    // Wait for the probes to be under way.
    let deadline = Instant::now() + Duration::from_secs(5);
    while gauge.now.load(Ordering::SeqCst) < 4 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(gauge.now.load(Ordering::SeqCst), 4, "4 probes under way");
    let started_before = gauge.started.load(Ordering::SeqCst);
    let asked = Instant::now();
    tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(3), run)
        .await
        .expect("the loop returns within 3 s of the shutdown (probe timeout 30 s)")
        .expect("join");
    let took = asked.elapsed();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        gauge.now.load(Ordering::SeqCst),
        0,
        "a probe still runs after the shutdown returned ({took:?})"
    );
    assert_eq!(
        gauge.started.load(Ordering::SeqCst),
        started_before,
        "a probe started after the shutdown"
    );
    for id in &ids {
        assert_eq!(
            state_of(&gate, id).await.map(|s| s.0).as_deref(),
            Some("in_doubt"),
            "a claim whose probe was cancelled is left held"
        );
    }
}

/// "Passes of one reconciler that overlap [...] never handle one claim at
/// the same time: its probe is not asked twice at once."
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconciler_overlapping_passes_never_probe_one_claim_twice_at_once() {
    let gate = testing::gate_on(testing::pool_with(16).await).await;
    let action = testing::unique_name("rv_ro");
    let _ids = held(&gate, &action, 6).await;
    let at_once: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let twice = Arc::new(AtomicUsize::new(0));
    let asked = Arc::new(AtomicUsize::new(0));
    let (a, t, k) = (at_once.clone(), twice.clone(), asked.clone());
    let reconciler = Arc::new(
        Reconciler::new(gate.pool().clone())
            .account(gate.account_name())
            .probe_concurrency(6)
            .probe(action.clone(), move |d| {
                let (a, t) = (a.clone(), t.clone());
                k.fetch_add(1, Ordering::SeqCst);
                {
                    let mut map = a.lock().unwrap();
                    let n = map.entry(d.address.clone()).or_default();
                    *n += 1;
                    if *n > 1 {
                        t.fetch_add(1, Ordering::SeqCst);
                    }
                }
                async move {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    *a.lock().unwrap().get_mut(&d.address).unwrap() -= 1;
                    Verdict::succeeded()
                }
            }),
    );
    let barrier = Arc::new(tokio::sync::Barrier::new(4));
    let mut passes = Vec::new();
    for _ in 0..4 {
        let (r, b) = (reconciler.clone(), barrier.clone());
        passes.push(tokio::spawn(async move {
            b.wait().await;
            r.reconcile_once().await
        }));
    }
    let mut total = Pass::default();
    for p in passes {
        let pass = p.await.expect("join").expect("pass");
        assert!(adds_up(&pass), "Pass counts do not add up: {pass:?}");
        total.resolved += pass.resolved;
        total.probed += pass.probed;
    }
    assert_eq!(
        twice.load(Ordering::SeqCst),
        0,
        "a claim's probe was asked twice at once by overlapping passes"
    );
    assert_eq!(
        total.resolved, 6,
        "each claim resolved exactly once across the passes: {total:?}"
    );
}

/// "An error of the store ends the pass": with the pool closed under it,
/// the pass returns an error and asks no further probe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconciler_a_store_error_ends_the_pass() {
    let gate = testing::gate_on(testing::pool_with(6).await).await;
    let action = testing::unique_name("rv_re");
    let ids = held(&gate, &action, 8).await;
    let pool = testing::pool_with(4).await;
    let p = pool.clone();
    let asked = Arc::new(AtomicUsize::new(0));
    let k = asked.clone();
    let reconciler = Reconciler::new(pool)
        .account(gate.account_name())
        .probe_concurrency(1)
        .probe(action.clone(), move |_d| {
            let p = p.clone();
            let n = k.fetch_add(1, Ordering::SeqCst);
            async move {
                if n == 0 {
                    p.close().await;
                }
                Verdict::succeeded()
            }
        });
    let result = tokio::time::timeout(Duration::from_secs(10), reconciler.reconcile_once())
        .await
        .expect("the pass ends");
    assert!(
        result.is_err(),
        "the pass over a closed pool reported {result:?}, not an error"
    );
    assert!(
        asked.load(Ordering::SeqCst) <= 2,
        "the pass went on asking probes after the store failed: {} asked",
        asked.load(Ordering::SeqCst)
    );
    let mut resolved = 0;
    for id in &ids {
        if state_of(&gate, id).await.map(|s| s.0).as_deref() == Some("success") {
            resolved += 1;
        }
    }
    assert_eq!(
        resolved, 0,
        "nothing could be resolved through the closed pool"
    );
}

/// `Pass` counts: panics and timeouts are among the unknowns, and every
/// probed claim is resolved, unknown or lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconciler_pass_counts_add_up_with_panics_timeouts_and_losses() {
    let gate = testing::gate_on(testing::pool_with(8).await).await;
    let action = testing::unique_name("rv_rp");
    let ids = held(&gate, &action, 8).await;
    let gate2 = gate.clone();
    let lost_id = ids[5].clone();
    let reconciler = Reconciler::new(gate.pool().clone())
        .account(gate.account_name())
        // Long enough that a probe that panics at once is never counted
        // as timed out on a loaded machine (200 ms was not, in a full run
        // beside two builds); only the probe that never ends times out.
        .probe_timeout(Duration::from_secs(2))
        .probe(action.clone(), move |d| {
            let which: u64 = match d.identity.parts().next() {
                Some(idem::PartValue::Integer(digits)) => digits.parse().unwrap_or(99),
                _ => 99,
            };
            let gate = gate2.clone();
            let lost_id = lost_id.clone();
            async move {
                match which {
                    0 | 1 => panic!("red39 probe panics"),
                    2 => {
                        std::future::pending::<()>().await;
                        Verdict::Unknown
                    }
                    3 => Verdict::Unknown,
                    5 => {
                        // Somebody else resolves it first.
                        let address = lost_id.address();
                        idem::operations::resolve(
                            gate.pool(),
                            idem::operations::Slot::new(gate.account_name(), None, &address),
                            Outcome::Failed(Disposition::Keep),
                        )
                        .await
                        .expect("resolve");
                        Verdict::succeeded()
                    }
                    _ => Verdict::succeeded(),
                }
            }
        });
    let pass = reconciler.reconcile_once().await.expect("pass");
    assert_eq!(pass.probed, 8, "{pass:?}");
    assert!(adds_up(&pass), "Pass counts do not add up: {pass:?}");
    assert_eq!(
        (
            pass.panicked,
            pass.timed_out,
            pass.unknown,
            pass.lost,
            pass.resolved
        ),
        (2, 1, 4, 1, 3),
        "Pass: {pass:?}"
    );
}
