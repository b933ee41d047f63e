//! The double charge this library exists to prevent, in its most common
//! form: a payment call that times out, sometimes before the charge and
//! sometimes after. Many clients retry each key at the same time while two
//! reconcilers race to establish what happened. At the end every key is
//! charged at most once (by the provider's own ledger), every key is
//! resolved, and nothing is left in doubt.
//!
//! The same workload with release-on-every-error (what every `Err` meant
//! before dispositions) charges keys twice: the second test shows the first
//! can fail.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use idem::reconcile::{Reconciler, Verdict};
use idem::testing;
use idem::{Gate, Rejected, idempotent};
use idem_test_support::{ChargeError, XorShift};
use serde::{Deserialize, Serialize};

const KEYS: usize = 30;
const CLIENTS_PER_KEY: usize = 3;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Receipt {
    order: String,
    charge: u64,
}

/// A payment provider that answers at random: charges, declines, times out
/// before charging, or times out after charging. Its ledger is the truth.
struct Provider {
    random: Mutex<XorShift>,
    ledger: Mutex<HashMap<String, Vec<u64>>>,
    charges: Mutex<u64>,
}

impl Provider {
    fn new(seed: u64) -> Provider {
        Provider {
            random: Mutex::new(XorShift::new(seed)),
            ledger: Mutex::new(HashMap::new()),
            charges: Mutex::new(0),
        }
    }

    async fn charge(&self, order: &str) -> Result<Receipt, ChargeError> {
        let roll = self
            .random
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .below(100);
        tokio::time::sleep(Duration::from_millis(5)).await;
        match roll {
            0..40 => Ok(self.book(order)),
            40..55 => Err(ChargeError::Declined),
            55..75 => Err(ChargeError::Timeout),
            _ => {
                self.book(order);
                Err(ChargeError::Timeout)
            }
        }
    }

    fn book(&self, order: &str) -> Receipt {
        let charge = {
            let mut charges = self.charges.lock().unwrap_or_else(PoisonError::into_inner);
            *charges += 1;
            *charges
        };
        self.ledger
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(order.to_owned())
            .or_default()
            .push(charge);
        Receipt {
            order: order.to_owned(),
            charge,
        }
    }

    /// The provider's lookup by reference: the charge of `order`, if any.
    fn lookup(&self, order: &str) -> Option<Receipt> {
        let ledger = self.ledger.lock().unwrap_or_else(PoisonError::into_inner);
        let charge = *ledger.get(order)?.first()?;
        Some(Receipt {
            order: order.to_owned(),
            charge,
        })
    }

    fn charged_twice(&self) -> Vec<(String, usize)> {
        let ledger = self.ledger.lock().unwrap_or_else(PoisonError::into_inner);
        let mut twice: Vec<_> = ledger
            .iter()
            .filter(|(_, charges)| charges.len() > 1)
            .map(|(order, charges)| (order.clone(), charges.len()))
            .collect();
        twice.sort();
        twice
    }
}

#[idempotent(key = "order", replay, disposition = ChargeError::disposition)]
async fn charge(gate: &Gate, order: &str, provider: &Provider) -> Result<Receipt, ChargeError> {
    provider.charge(order).await
}

/// What every `Err` meant before dispositions: released, so a retry runs.
#[idempotent(key = "order", replay, action = "charge")]
async fn charge_releasing(
    gate: &Gate,
    order: &str,
    provider: &Provider,
) -> Result<Receipt, ChargeError> {
    provider.charge(order).await
}

/// How a client's retries of one key ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Charged,
    Declined,
}

/// One client: retries `order` until it gets a definite answer.
async fn client(
    gate: &Gate,
    order: &str,
    provider: &Provider,
    disposed: bool,
    deadline: Instant,
) -> End {
    loop {
        let result = if disposed {
            charge(gate, order, provider).await
        } else {
            charge_releasing(gate, order, provider).await
        };
        match result {
            Ok(_) | Err(ChargeError::Rejected(Rejected::AlreadyDone)) => return End::Charged,
            Err(ChargeError::Declined | ChargeError::Rejected(Rejected::AlreadyFailed)) => {
                return End::Declined;
            }
            Err(
                ChargeError::Timeout
                | ChargeError::Rejected(Rejected::InDoubt | Rejected::InFlight),
            ) => {}
            Err(other) => panic!("{order}: unexpected {other:?}"),
        }
        assert!(
            Instant::now() < deadline,
            "{order}: no definite answer before the deadline"
        );
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
}

/// A reconciler that asks the provider's lookup about `charge`.
fn reconciler(gate: &Gate, provider: &Arc<Provider>) -> Reconciler {
    let provider = Arc::clone(provider);
    Reconciler::new(gate.pool().clone())
        .account(gate.account_name())
        .interval(Duration::from_millis(20))
        .batch(10)
        .probe("charge", move |doubt| {
            let provider = Arc::clone(&provider);
            async move {
                let Some(order) = doubt.identity.parts().next().and_then(|p| p.as_text()) else {
                    return Verdict::Unknown;
                };
                match provider.lookup(order) {
                    Some(receipt) => Verdict::succeeded_with(&receipt).unwrap_or(Verdict::Unknown),
                    None => Verdict::NotHappened,
                }
            }
        })
}

struct Run {
    provider: Arc<Provider>,
    ends: Vec<(String, End)>,
    gate: Gate,
}

/// Many clients per key, all keys at once, two reconcilers racing.
async fn run(disposed: bool, seed: u64) -> Run {
    let gate = testing::gate_on(testing::pool_with(24).await).await;
    let provider = Arc::new(Provider::new(seed));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let reconcilers: Vec<_> = (0..2)
        .map(|_| {
            let reconciler = reconciler(&gate, &provider);
            let mut stopped = stopped.clone();
            tokio::spawn(async move {
                reconciler
                    .run(async move {
                        let _ = stopped.wait_for(|stop| *stop).await;
                    })
                    .await;
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut clients = tokio::task::JoinSet::new();
    for key in 0..KEYS {
        for _ in 0..CLIENTS_PER_KEY {
            let (gate, provider) = (gate.clone(), Arc::clone(&provider));
            let order = format!("ord_{key}");
            clients.spawn(async move {
                let end = client(&gate, &order, &provider, disposed, deadline).await;
                (order, end)
            });
        }
    }
    let mut ends = Vec::new();
    while let Some(joined) = clients.join_next().await {
        ends.push(joined.expect("a client panicked"));
    }
    let _ = stop.send(true);
    for reconciler in reconcilers {
        reconciler.await.expect("a reconciler panicked");
    }
    Run {
        provider,
        ends,
        gate,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn timeouts_before_and_after_the_charge_never_charge_twice() {
    let seed = XorShift::seed_from_env("IDEM_RECONCILE_SEED");
    let Run {
        provider,
        ends,
        gate,
    } = run(true, seed).await;

    // A last pass, as a deployment would run before it declares all clear.
    let last = reconciler(&gate, &provider)
        .reconcile_once()
        .await
        .expect("the last pass");
    assert_eq!(last.unknown, 0, "seed {seed}: {last:?}");

    assert_eq!(
        provider.charged_twice(),
        vec![],
        "seed {seed}: keys charged more than once"
    );
    // Every client of a key heard the same definite answer, and it is the
    // provider's: charged once, or declined and never charged.
    let mut by_key: HashMap<&str, End> = HashMap::new();
    for (order, end) in &ends {
        let first = *by_key.entry(order).or_insert(*end);
        assert_eq!(first, *end, "seed {seed}: clients of {order} disagree");
        let charged = provider.lookup(order).is_some();
        assert_eq!(
            charged,
            *end == End::Charged,
            "seed {seed}: {order} ended {end:?} but the provider's ledger says charged = {charged}"
        );
    }
    assert_eq!(by_key.len(), KEYS);
    // Nothing is left in doubt, pending or released: each key is settled or
    // kept failed.
    for key in 0..KEYS {
        let order = format!("ord_{key}");
        let address = idem::Identity::new("charge").part(order.as_str()).address();
        let state = idem_test_support::rows::row_state(&gate, &address).await;
        let expected = match by_key[order.as_str()] {
            End::Charged => "success",
            End::Declined => "failed",
        };
        assert_eq!(state.as_deref(), Some(expected), "seed {seed}: {order}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn releasing_on_every_error_charges_keys_twice() {
    let seed = XorShift::seed_from_env("IDEM_RECONCILE_SEED");
    let Run { provider, .. } = run(false, seed).await;
    // The same workload, the same provider, release on every error: a
    // timeout after the charge frees the key, and a retry charges again.
    let twice = provider.charged_twice();
    eprintln!("seed {seed}: without dispositions, keys charged more than once: {twice:?}");
    assert!(
        !twice.is_empty(),
        "seed {seed}: expected double charges without dispositions (the test above could not fail)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_pending_claim_is_probed_only_when_asked_and_unknowns_wait() {
    use std::sync::atomic::{AtomicUsize, Ordering};

    let gate = testing::gate().await;
    let id = idem::Identity::new("export").part("batch_9");
    // Its holder crashed without a lease: pending, forever.
    crate::support::holders::vanish(gate.claim(&id).await.expect("won"));
    tokio::time::sleep(Duration::from_millis(150)).await;

    let asked = Arc::new(AtomicUsize::new(0));
    let probe = |verdict: Verdict| {
        let asked = Arc::clone(&asked);
        move |doubt: idem::reconcile::Doubt| {
            asked.fetch_add(1, Ordering::SeqCst);
            assert_eq!(doubt.identity.action(), "export");
            assert_eq!(doubt.reason, None);
            let verdict = verdict.clone();
            async move { verdict }
        }
    };
    let base = || Reconciler::new(gate.pool().clone()).account(gate.account_name());

    // Without pending_older_than, a pending claim is nobody's business.
    let pass = base()
        .probe("export", probe(Verdict::succeeded()))
        .reconcile_once()
        .await
        .expect("a pass");
    assert_eq!((pass.probed, asked.load(Ordering::SeqCst)), (0, 0));

    // Unknown: asked once, then left alone until its pause is over.
    let unsure = base()
        .probe("export", probe(Verdict::Unknown))
        .pending_older_than(Duration::from_millis(100));
    assert_eq!(unsure.reconcile_once().await.expect("a pass").unknown, 1);
    assert_eq!(unsure.reconcile_once().await.expect("a pass").probed, 0);
    assert_eq!(asked.load(Ordering::SeqCst), 1);

    // Established: settled, and a retry is refused as done, never run.
    let sure = base()
        .probe("export", probe(Verdict::succeeded()))
        .pending_older_than(Duration::from_millis(100));
    assert_eq!(sure.reconcile_once().await.expect("a pass").resolved, 1);
    assert!(matches!(gate.claim(&id).await, Err(Rejected::AlreadyDone)));
}
