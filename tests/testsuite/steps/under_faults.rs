//! The proof of steps inside one claim (issue 27): a three-step checkout
//! against a fake provider, many clients retrying each key at once, faults
//! at every point, and the provider's ledgers read at the end.
//!
//! The checkout charges (through a downstream key the provider
//! deduplicates by, as Stripe does: a repeatable step), ships and emails
//! (neither deduplicated: every call is an effect). Each key is retried by
//! several clients until it completes, under a short lease, so a cut-off
//! holder is taken over. The faults, on a schedule fixed by the key's
//! number (not by time):
//!
//! - a body dropped mid-step: the provider acts, then hangs, and the
//!   client gives up on the call (as a client timeout does) right there;
//! - a body that stalls past its lease inside a step, then finishes;
//! - every connection cut through the fault proxy, a few times, and the
//!   server restarted once, while keys run (a throwaway cluster of the
//!   test's own, never the machine's server).
//!
//! At the end: each step's effect happened at most once per key; every key
//! completed, or is held in doubt only because `ship` or `email` (not safe
//! to repeat) was cut off, never `charge`; the reconciler resolves those
//! from the provider's ledgers (the probe is told which step is in doubt,
//! and answers for it), and a retry then completes every key: each
//! charged, shipped and emailed exactly once, without an operator. The control
//! runs the same workload, the same bodies, with the effects called
//! directly: it ships or emails twice, so the proof can fail.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use idem::reconcile::{Reconciler, Verdict};
use idem::sqlx::{self, PgPool};
use idem::{Gate, Identity, Rejected};
use idem_test_support::history::Target;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

/// Keys (orders), and clients retrying each at once.
const KEYS: usize = 40;
const CLIENTS: usize = 4;
/// The most reconciler passes a held key may need before it completes.
const MAX_PASSES: usize = 3;
/// Short, so a cut-off holder is taken over within the run; longer than a
/// whole body takes on two busy cores (a body slower than its lease is
/// taken over at every attempt, and no key gets anywhere: at 300 ms, with
/// a machine's load at 8, the run livelocked so for minutes).
const LEASE: Duration = Duration::from_millis(1_000);
/// How long a stalled step takes: well past its lease.
const STALL: Duration = Duration::from_millis(2_000);
/// Keys start one after another, this far apart, so that the connection
/// faults and the restart land while keys are running.
const STAGGER: Duration = Duration::from_millis(25);
/// A client's first pause before it retries a refusal, doubled at each
/// refusal up to [`LONGEST_PAUSE`], as a polite client backs off.
const PAUSE: Duration = Duration::from_millis(20);
const LONGEST_PAUSE: Duration = Duration::from_millis(320);
/// More attempts than any key needs: a client still retrying then is a
/// key that never completes.
const ATTEMPTS: usize = 2_000;

/// One of the checkout's effects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Effect {
    Charge,
    Ship,
    Email,
}

impl Effect {
    const ALL: [Effect; 3] = [Effect::Charge, Effect::Ship, Effect::Email];

    /// The name of its step.
    fn step(self) -> &'static str {
        match self {
            Effect::Charge => "charge",
            Effect::Ship => "ship",
            Effect::Email => "email",
        }
    }
}

/// What goes wrong in the first call of one effect of one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// The provider acts, then never answers; the client drops the call.
    Hang(Effect),
    /// The provider takes [`STALL`] (past the lease), then acts.
    Stall(Effect),
}

/// The fault of key `n`, if any: every kind on an equal share of the keys,
/// by the key's number, so every run injects the same faults.
fn fault_of(n: usize) -> Option<Fault> {
    let effect = Effect::ALL[n % 3];
    match (n / 3) % 3 {
        0 => Some(Fault::Hang(effect)),
        1 => Some(Fault::Stall(effect)),
        _ => None,
    }
}

fn order_of(n: usize) -> String {
    format!("ord_{n:03}")
}

/// What the charge returns: the provider's receipt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Receipt {
    id: String,
    order: String,
}

/// The fake provider: `charge` deduplicates by its downstream key (a second
/// call with the same key returns the first receipt and charges nothing);
/// `ship` and `email` do not, so their ledgers count every call. It also
/// plays the faults of [`fault_of`], each once.
#[derive(Default)]
struct Provider {
    receipts: Mutex<HashMap<String, Receipt>>,
    /// Effects that happened, by order.
    ledgers: Mutex<BTreeMap<(String, Effect), usize>>,
    /// Faults not played yet, by order.
    faults: Mutex<HashMap<String, Fault>>,
    hangs: AtomicUsize,
    stalls: AtomicUsize,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Provider {
    fn with_faults(keys: usize) -> Provider {
        let provider = Provider::default();
        lock(&provider.faults).extend((0..keys).filter_map(|n| Some((order_of(n), fault_of(n)?))));
        provider
    }

    fn count(&self, order: &str, effect: Effect) -> usize {
        lock(&self.ledgers)
            .get(&(order.to_owned(), effect))
            .copied()
            .unwrap_or(0)
    }

    fn happened(&self, order: &str, effect: Effect) {
        *lock(&self.ledgers)
            .entry((order.to_owned(), effect))
            .or_default() += 1;
    }

    /// Whether `order` was dealt a hang and has played it.
    fn hung(&self, order: &str) -> bool {
        let n: Option<usize> = order.strip_prefix("ord_").and_then(|n| n.parse().ok());
        matches!(n.and_then(fault_of), Some(Fault::Hang(_)))
            && !lock(&self.faults).contains_key(order)
    }

    /// The fault of this call of `effect` for `order`, taken: each is
    /// played once, by the first call that reaches it.
    fn take_fault(&self, order: &str, effect: Effect) -> Option<Fault> {
        let mut faults = lock(&self.faults);
        let fault = *faults.get(order)?;
        let ours = matches!(fault, Fault::Hang(e) | Fault::Stall(e) if e == effect);
        ours.then(|| faults.remove(order)).flatten()
    }

    /// One call of `effect`: its fault before (a stall) or after (a hang),
    /// and `act`, the effect itself. `cut` tells the client that the call
    /// hangs, so that it gives up on it at that very point.
    async fn call<T>(
        &self,
        order: &str,
        effect: Effect,
        cut: &Notify,
        act: impl FnOnce() -> T,
    ) -> T {
        let fault = self.take_fault(order, effect);
        if fault == Some(Fault::Stall(effect)) {
            self.stalls.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(STALL).await;
        }
        let value = act();
        if fault == Some(Fault::Hang(effect)) {
            self.hangs.fetch_add(1, Ordering::SeqCst);
            cut.notify_one();
            std::future::pending::<()>().await;
        }
        value
    }

    async fn charge(&self, key: &str, order: &str, cut: &Notify) -> Result<Receipt, Rejected> {
        Ok(self
            .call(order, Effect::Charge, cut, || {
                let mut receipts = lock(&self.receipts);
                if let Some(first) = receipts.get(key) {
                    return first.clone();
                }
                self.happened(order, Effect::Charge);
                let receipt = Receipt {
                    id: format!("ch_{}", receipts.len() + 1),
                    order: order.to_owned(),
                };
                receipts.insert(key.to_owned(), receipt.clone());
                receipt
            })
            .await)
    }

    async fn ship(&self, order: &str, cut: &Notify) -> Result<String, Rejected> {
        Ok(self
            .call(order, Effect::Ship, cut, || {
                self.happened(order, Effect::Ship);
                format!("parcel_{order}")
            })
            .await)
    }

    async fn email(&self, order: &str, cut: &Notify) -> Result<(), Rejected> {
        self.call(order, Effect::Email, cut, || {
            self.happened(order, Effect::Email)
        })
        .await;
        Ok(())
    }
}

/// What a completed checkout returns.
#[derive(Debug)]
struct Checkout {
    _receipt: Receipt,
    _parcel: String,
}

/// The body: charge (repeatable, under its downstream key), ship, email,
/// each a step.
async fn with_steps(provider: &Provider, order: &str, cut: &Notify) -> Result<Checkout, Rejected> {
    let key = idem::downstream_key("charge")?;
    let receipt = idem::step("charge", provider.charge(&key, order, cut))
        .repeatable()
        .await?;
    let parcel = idem::step("ship", provider.ship(order, cut)).await?;
    idem::step("email", provider.email(order, cut)).await?;
    Ok(Checkout {
        _receipt: receipt,
        _parcel: parcel,
    })
}

/// The control: the same calls, the effects made directly.
async fn without_steps(
    provider: &Provider,
    order: &str,
    cut: &Notify,
) -> Result<Checkout, Rejected> {
    let key = idem::downstream_key("charge")?;
    let receipt = provider.charge(&key, order, cut).await?;
    let parcel = provider.ship(order, cut).await?;
    provider.email(order, cut).await?;
    Ok(Checkout {
        _receipt: receipt,
        _parcel: parcel,
    })
}

/// How one client's retries of its key ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Ended {
    /// It completed (`Ok`), or was told it had (`AlreadyDone`).
    Completed,
    /// Held in doubt: a client was told so, and which step, if a body was
    /// told a step was in doubt ([`Rejected::StepInDoubt`]).
    InDoubt(Option<String>),
}

/// What the clients did, in all.
#[derive(Default)]
struct Tally {
    attempts: AtomicUsize,
    dropped: AtomicUsize,
    refused: Mutex<BTreeMap<&'static str, usize>>,
}

impl Tally {
    fn refused(&self, rejected: &Rejected) {
        let reason = match rejected {
            Rejected::InFlight => "in flight",
            Rejected::Unavailable { .. } => "unavailable",
            Rejected::LeaseLost { .. } => "lease lost",
            Rejected::ClaimLost { .. } => "claim lost",
            Rejected::NotRecorded { .. } => "not recorded",
            _ => "other",
        };
        *lock(&self.refused).entry(reason).or_default() += 1;
    }
}

/// Which body the workload runs.
#[derive(Debug, Clone, Copy)]
enum Body {
    WithSteps,
    WithoutSteps,
}

/// One call of `body` for `order` under `gate`'s guard with a lease; `None`
/// when the client gave up on it mid-call (the provider hung).
async fn attempt(
    gate: &Gate,
    provider: &Provider,
    order: &str,
    body: Body,
) -> Option<Result<Checkout, Rejected>> {
    let id = Identity::new("checkout").part(order);
    let cut = Notify::new();
    let guard = gate.guard(&id).lease(LEASE);
    let call = async {
        match body {
            Body::WithSteps => guard.run(with_steps(provider, order, &cut)).await,
            Body::WithoutSteps => guard.run(without_steps(provider, order, &cut)).await,
        }
    };
    tokio::select! {
        outcome = call => Some(outcome),
        () = cut.notified() => None,
    }
}

/// One client: retries `order` until it completes or is held in doubt.
async fn client(
    gate: Gate,
    provider: Arc<Provider>,
    tally: Arc<Tally>,
    order: String,
    body: Body,
) -> Ended {
    let mut pause = PAUSE;
    for _ in 0..ATTEMPTS {
        tally.attempts.fetch_add(1, Ordering::SeqCst);
        match attempt(&gate, &provider, &order, body).await {
            None => {
                tally.dropped.fetch_add(1, Ordering::SeqCst);
            }
            Some(Ok(_) | Err(Rejected::AlreadyDone)) => return Ended::Completed,
            Some(Err(Rejected::StepInDoubt { step, .. })) => return Ended::InDoubt(Some(step)),
            Some(Err(Rejected::InDoubt)) => return Ended::InDoubt(None),
            Some(Err(other)) => {
                tally.refused(&other);
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(LONGEST_PAUSE);
            }
        }
    }
    panic!("{order} never completed nor was held in doubt after {ATTEMPTS} attempts");
}

/// The connection faults, at fixed points of the run: every connection
/// cut through the proxy (and new ones turned away) for a while, three
/// times, and the server restarted once, in between.
async fn connection_faults(target: &Target) -> (usize, usize) {
    let proxy = target
        .proxy
        .clone()
        .expect("the gate goes through the proxy");
    let cluster = target.cluster.clone().expect("a cluster of the test's own");
    let (mut cuts, mut restarts) = (0, 0);
    // After 150 ms a cut, 300 ms later the restart, then two more cuts.
    for (pause, restart) in [(150, false), (300, true), (300, false), (300, false)] {
        tokio::time::sleep(Duration::from_millis(pause)).await;
        if restart {
            let cluster = Arc::clone(&cluster);
            tokio::task::spawn_blocking(move || cluster.restart())
                .await
                .expect("restart the cluster");
            restarts += 1;
        } else {
            proxy.cut_for(Duration::from_millis(120)).await;
            cuts += 1;
        }
    }
    (cuts, restarts)
}

/// How each key's clients ended, and the connection faults injected.
struct Storm {
    ends: BTreeMap<String, Vec<Ended>>,
    cuts: usize,
    restarts: usize,
}

/// The run: every key's clients, started a key at a time, under the
/// connection faults.
async fn storm(target: &Target, provider: &Arc<Provider>, tally: &Arc<Tally>, body: Body) -> Storm {
    let mut clients = tokio::task::JoinSet::new();
    let faults = connection_faults(target);
    let start = async {
        for n in 0..KEYS {
            for _ in 0..CLIENTS {
                let (gate, provider, tally) =
                    (target.gate.clone(), Arc::clone(provider), Arc::clone(tally));
                let order = order_of(n);
                clients.spawn(async move {
                    let ended = client(gate, provider, tally, order.clone(), body).await;
                    (order, ended)
                });
            }
            tokio::time::sleep(STAGGER).await;
        }
    };
    let ((cuts, restarts), ()) = tokio::join!(faults, start);
    let mut ends: BTreeMap<String, Vec<Ended>> = BTreeMap::new();
    while let Some(joined) = clients.join_next().await {
        let (order, ended) = joined.expect("a client");
        ends.entry(order).or_default().push(ended);
    }
    Storm {
        ends,
        cuts,
        restarts,
    }
}

/// The state of the claim of `order`, read straight from the table.
async fn claim_state(admin: &PgPool, gate: &Gate, order: &str) -> Option<String> {
    sqlx::query_scalar(
        "SELECT state FROM idem_records WHERE account = $1 AND kind = 'claim' AND address = $2",
    )
    .bind(gate.account_name())
    .bind(Identity::new("checkout").part(order).address())
    .fetch_optional(admin)
    .await
    .expect("read the claim")
}

/// The state of each step row of the claim of `order`, by step name (the
/// row keeps the step's canonical encoding, which ends with its name).
async fn step_states(admin: &PgPool, gate: &Gate, order: &str) -> BTreeMap<&'static str, String> {
    let rows: Vec<(Vec<u8>, String)> = sqlx::query_as(
        "SELECT identity, state FROM idem_records \
         WHERE account = $1 AND kind = 'step' AND claim_address = $2",
    )
    .bind(gate.account_name())
    .bind(Identity::new("checkout").part(order).address())
    .fetch_all(admin)
    .await
    .expect("read the steps");
    rows.into_iter()
        .filter_map(|(identity, state)| {
            let effect = Effect::ALL
                .into_iter()
                .find(|effect| identity.ends_with(effect.step().as_bytes()))?;
            Some((effect.step(), state))
        })
        .collect()
}

/// A reconciler whose probe asks the provider about the step in doubt:
/// if it happened, the step is recorded with what it returned, and the
/// claim released, so the retry resumes after it; if not, the step's
/// marker goes with the release, so the retry runs it.
fn reconciler(gate: &Gate, provider: &Arc<Provider>) -> Reconciler {
    let provider = Arc::clone(provider);
    Reconciler::new(gate.pool().clone())
        .account(gate.account_name())
        .probe("checkout", move |doubt| {
            let provider = Arc::clone(&provider);
            async move {
                let Some(order) = doubt.identity.parts().next().and_then(|p| p.as_text()) else {
                    return Verdict::Unknown;
                };
                // None left in doubt: the holder cut off inside one came
                // back and recorded it late. Nothing is unknown any more:
                // released, the retry replays what is recorded.
                let Some(step) = doubt.steps_in_doubt.first() else {
                    return Verdict::NotHappened;
                };
                let answer = match step.as_str() {
                    "ship" if provider.count(order, Effect::Ship) > 0 => {
                        Verdict::step_succeeded_with("ship", &format!("parcel_{order}"))
                    }
                    "email" if provider.count(order, Effect::Email) > 0 => {
                        Verdict::step_succeeded_with("email", &())
                    }
                    "ship" | "email" => return Verdict::NotHappened,
                    _ => return Verdict::Unknown,
                };
                answer.unwrap_or(Verdict::Unknown)
            }
        })
}

/// The effects per order, as `charge/ship/email` counts, and how many
/// orders had each count of each effect.
fn effects_figure(provider: &Provider) -> String {
    Effect::ALL
        .into_iter()
        .map(|effect| {
            let mut by_count: BTreeMap<usize, usize> = BTreeMap::new();
            for n in 0..KEYS {
                *by_count
                    .entry(provider.count(&order_of(n), effect))
                    .or_default() += 1;
            }
            let counts: Vec<String> = by_count
                .iter()
                .map(|(count, orders)| format!("{orders} keys x{count}"))
                .collect();
            format!("{}: {}", effect.step(), counts.join(", "))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn faults_figure(provider: &Provider, storm: &Storm, tally: &Tally) -> String {
    format!(
        "{} hangs (calls dropped: {}), {} stalls past the lease, {} connection cuts, {} restart",
        provider.hangs.load(Ordering::SeqCst),
        tally.dropped.load(Ordering::SeqCst),
        provider.stalls.load(Ordering::SeqCst),
        storm.cuts,
        storm.restarts,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_steps_under_faults_run_each_effect_at_most_once_and_every_key_completes() {
    let target = Target::cluster(12).await;
    let provider = Arc::new(Provider::with_faults(KEYS));
    let tally = Arc::new(Tally::default());
    let storm = storm(&target, &provider, &tally, Body::WithSteps).await;
    let (gate, admin) = (&target.gate, &target.admin);

    // Every key completed, or is held in doubt; none in doubt for the
    // charge, which is safe to repeat.
    let mut held = Vec::new();
    let mut in_doubt_at = BTreeMap::<&str, usize>::new();
    let mut late_successes = 0;
    for (order, ends) in &storm.ends {
        let told: Vec<&str> = ends
            .iter()
            .filter_map(|ended| match ended {
                Ended::InDoubt(Some(step)) => Some(step.as_str()),
                _ => None,
            })
            .collect();
        assert!(
            !told.contains(&"charge"),
            "{order}: a client was told the repeatable charge is in doubt: {ends:?}"
        );
        let state = claim_state(admin, gate, order).await;
        let steps = step_states(admin, gate, order).await;
        if ends.iter().all(|ended| *ended == Ended::Completed) {
            assert_eq!(state.as_deref(), Some("success"), "{order}: {steps:?}");
            continue;
        }
        // A client was told the key is in doubt, and the stalled holder
        // then finished the body: its late success settled the claim.
        if state.as_deref() == Some("success") {
            late_successes += 1;
            continue;
        }
        // Held: by a step not safe to repeat that was cut off, which a
        // client was told of or whose marker nobody recorded; the charge
        // is recorded.
        assert!(
            matches!(state.as_deref(), Some("in_doubt" | "pending")),
            "{order} is held, its claim is {state:?}"
        );
        assert_eq!(
            steps.get("charge").map(String::as_str),
            Some("success"),
            "{order} is held in doubt, and its charge is not recorded: {steps:?} {ends:?}"
        );
        let cut_off: Vec<&str> = ["ship", "email"]
            .into_iter()
            .filter(|step| {
                told.contains(step) || steps.get(step).is_some_and(|state| state == "pending")
            })
            .collect();
        // Or held when a step's record or marker could not be written (the
        // store cut off): unknown then, it may have landed after all, and
        // then nothing is left in doubt but the claim itself.
        let at = match cut_off.first() {
            Some(step) => *step,
            None => {
                assert!(
                    steps.values().all(|state| state == "success"),
                    "{order} is held in doubt, yet neither ship nor email was cut off: \
                     {steps:?} {ends:?}"
                );
                "nothing left in doubt"
            }
        };
        *in_doubt_at.entry(at).or_default() += 1;
        held.push(order.clone());
    }

    // The reconciler resolves them from the provider's ledgers; then every
    // key completes, and nothing runs again. Each resolved key resumes
    // where it stopped: a step the probe said happened is replayed, one it
    // said did not runs now. A stalled holder whose lease ran out may
    // begin a step after a pass listed its claim's steps and before the
    // pass released the claim: the retry then finds that step in doubt
    // (it never runs blind), its failure holds the claim again, and the
    // next pass resolves it. No operator either way, in a bounded number
    // of passes.
    let reconciler = reconciler(gate, &provider);
    let (mut left, mut passes, mut resolved) = (held.clone(), 0, 0);
    while !left.is_empty() {
        assert!(
            passes < MAX_PASSES,
            "still held after {passes} reconciler passes: {left:?}"
        );
        let pass = reconciler
            .reconcile_once()
            .await
            .expect("a reconciler's pass");
        passes += 1;
        resolved += pass.resolved;
        assert_eq!(pass.resolved, left.len(), "pass {passes}: {pass:?}");
        let (mut again_in_doubt, mut hung_now) = (Vec::new(), false);
        for order in &left {
            match attempt(gate, &provider, order, Body::WithSteps).await {
                Some(Ok(_)) => assert_eq!(
                    claim_state(admin, gate, order).await.as_deref(),
                    Some("success")
                ),
                Some(Err(Rejected::StepInDoubt { step, .. })) if step != "charge" => {
                    again_in_doubt.push(order.clone())
                }
                // A key a connection fault held before it reached the
                // effect whose hang it was dealt plays that hang only now:
                // the provider acted, the client gave up inside the step,
                // and the claim is left pending under its lease. Once the
                // lease ran out, the next pass resolves it like any other.
                None if provider.hung(order) => {
                    hung_now = true;
                    again_in_doubt.push(order.clone());
                }
                again => panic!("{order} after reconciler pass {passes}: {again:?}"),
            }
        }
        if hung_now {
            tokio::time::sleep(LEASE + Duration::from_millis(200)).await;
        }
        left = again_in_doubt;
    }

    // The ledgers: every key charged, shipped and emailed exactly once.
    for n in 0..KEYS {
        let order = order_of(n);
        for effect in Effect::ALL {
            assert!(
                provider.count(&order, effect) <= 1,
                "{order}: {effect:?} happened {} times",
                provider.count(&order, effect)
            );
        }
        for effect in Effect::ALL {
            assert_eq!(provider.count(&order, effect), 1, "{order}: {effect:?}");
        }
    }
    assert!(provider.hangs.load(Ordering::SeqCst) > 0, "no body hung");
    assert!(
        provider.stalls.load(Ordering::SeqCst) > 0,
        "no body stalled"
    );
    assert_eq!((storm.cuts, storm.restarts), (3, 1));

    eprintln!(
        "steps under faults: {KEYS} keys x {CLIENTS} clients, {} attempts, refused {:?}",
        tally.attempts.load(Ordering::SeqCst),
        lock(&tally.refused),
    );
    eprintln!("  faults: {}", faults_figure(&provider, &storm, &tally));
    eprintln!(
        "  held in doubt: {} keys (cut off in {in_doubt_at:?}), resolved by the reconciler's \
         step verdicts, then completed by a retry: {}; told in doubt, then settled by the \
         stalled holder's late success: {late_successes}; reconciler passes: {passes}",
        held.len(),
        resolved,
    );
    eprintln!("  effects: {}", effects_figure(&provider));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_workload_without_steps_ships_or_emails_twice() {
    let target = Target::cluster(12).await;
    let provider = Arc::new(Provider::with_faults(KEYS));
    let tally = Arc::new(Tally::default());
    let storm = storm(&target, &provider, &tally, Body::WithoutSteps).await;
    let twice: Vec<String> = (0..KEYS)
        .map(order_of)
        .filter(|order| {
            provider.count(order, Effect::Ship) > 1 || provider.count(order, Effect::Email) > 1
        })
        .collect();
    eprintln!(
        "without steps: {KEYS} keys x {CLIENTS} clients, {} attempts; faults: {}",
        tally.attempts.load(Ordering::SeqCst),
        faults_figure(&provider, &storm, &tally),
    );
    eprintln!(
        "  effects: {}; shipped or emailed twice: {} keys",
        effects_figure(&provider),
        twice.len()
    );
    assert!(
        !twice.is_empty(),
        "without steps a dropped or stalled body's retry should repeat the shipment or the \
         email, so this workload can catch steps that do not work"
    );
}
