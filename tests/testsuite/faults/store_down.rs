//! Store down: every entry point fails closed (the body never runs) while
//! the database cannot be reached, and the *same* gate works again once it
//! can. The database is cut off by a TCP proxy between the gate's pool and
//! the server, then the proxy accepts connections again.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use idem::guard::{Leased, NoReplay, ReleaseAll};
use idem::meter::Event;
use idem::sqlx::{self, Connection, PgConnection};
use idem::testing;
use idem::{Fingerprint, Gate, Identity, Rejected, idempotent};
use idem_test_support::{JobError, Proxy};

/// Counts the bodies that ran.
static RUNS: AtomicUsize = AtomicUsize::new(0);

fn body_runs() -> String {
    RUNS.fetch_add(1, Ordering::SeqCst);
    "done".to_owned()
}

#[idempotent(key = "order")]
async fn plain(gate: &Gate, order: &str) -> Result<String, JobError> {
    Ok(body_runs())
}

#[idempotent(key = "order", replay)]
async fn replayed(gate: &Gate, order: &str) -> Result<String, JobError> {
    Ok(body_runs())
}

#[idempotent(key = "order", fingerprint = "amount", replay)]
async fn fingerprinted(gate: &Gate, order: &str, amount: i64) -> Result<String, JobError> {
    Ok(body_runs())
}

#[idempotent(key = "order", lease = "30s")]
async fn leased(gate: &Gate, order: &str) -> Result<String, JobError> {
    Ok(body_runs())
}

#[idempotent(key = "order", wait = "2s")]
async fn waiting(gate: &Gate, order: &str) -> Result<String, JobError> {
    Ok(body_runs())
}

#[idempotent(key = "order", on_unavailable = "refuse")]
async fn refusing(gate: &Gate, order: &str) -> Result<String, JobError> {
    Ok(body_runs())
}

#[idempotent(key = "order", tx = tx)]
async fn in_tx(gate: &Gate, tx: &mut PgConnection, order: &str) -> Result<String, JobError> {
    Ok(body_runs())
}

/// The one mode that runs when the store is down, on purpose.
#[idempotent(key = "order", on_unavailable = "run")]
async fn failing_open(gate: &Gate, order: &str, ran: &AtomicUsize) -> Result<(), JobError> {
    ran.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// The guard of `id` with every option a pooled claim can have at once.
fn every_mode<'a>(
    gate: &'a Gate,
    id: &'a Identity,
) -> idem::Guard<'a, NoReplay, ReleaseAll, Leased> {
    gate.guard(id)
        .lease(Duration::from_secs(30))
        .wait(Duration::from_secs(2))
        .fingerprint(Fingerprint::new().part(4_999))
}

/// What each entry point returned, by name, as `Ok(())` or the refusal.
type Outcomes = Vec<(&'static str, Result<(), Rejected>)>;

fn outcome<T>(result: Result<T, JobError>) -> Result<(), Rejected> {
    match result {
        Ok(_) => Ok(()),
        Err(JobError::Rejected(rejected)) => Err(rejected),
        Err(other) => panic!("these bodies never fail; only the gate refuses: {other:?}"),
    }
}

/// Calls every entry point once, concurrently (each waits out the pool's
/// acquire timeout while the store is down), on identities named by `round`.
async fn every_entry_point(gate: &Gate, tx: &mut PgConnection, round: &str) -> Outcomes {
    let id = |entry: &str| Identity::new("store_down").part(entry).part(round);
    let order = |entry: &str| format!("{entry}/{round}");
    let body = || async { Ok::<_, JobError>(body_runs()) };
    let (claim, guard_claim, run, guard_run, guard_replay, guard_tx_claim) = tokio::join!(
        async {
            let claim = gate.claim(&id("claim")).await?;
            RUNS.fetch_add(1, Ordering::SeqCst);
            claim.settle().await
        },
        async {
            let claim = every_mode(gate, &id("guard_claim")).claim().await?;
            RUNS.fetch_add(1, Ordering::SeqCst);
            claim.settle().await
        },
        async { outcome(gate.run(&id("run"), body()).await) },
        async { outcome(every_mode(gate, &id("guard_run")).run(body()).await) },
        async {
            outcome(
                every_mode(gate, &id("guard_replay"))
                    .replay()
                    .run(body())
                    .await,
            )
        },
        async {
            let claim = gate.guard(&id("guard_tx_claim")).tx(tx).claim().await?;
            RUNS.fetch_add(1, Ordering::SeqCst);
            claim.settle(tx).await
        },
    );
    // In the caller's transaction: the connection is the caller's.
    let o_in_tx = in_tx(gate, tx, &order("in_tx")).await;
    let orders = [
        "plain",
        "replayed",
        "fingerprinted",
        "leased",
        "waiting",
        "refusing",
    ]
    .map(order);
    let (o_plain, o_replayed, o_fingerprinted, o_leased, o_waiting, o_refusing) = tokio::join!(
        plain(gate, &orders[0]),
        replayed(gate, &orders[1]),
        fingerprinted(gate, &orders[2], 4_999),
        leased(gate, &orders[3]),
        waiting(gate, &orders[4]),
        refusing(gate, &orders[5]),
    );
    vec![
        ("Gate::claim", claim),
        ("Gate::guard(..).claim()", guard_claim),
        ("Gate::run", run),
        ("Gate::guard(..).run(..)", guard_run),
        ("Gate::guard(..).replay().run(..)", guard_replay),
        ("Gate::guard(..).tx(..).claim()", guard_tx_claim),
        ("#[idempotent(tx)]", outcome(o_in_tx)),
        ("#[idempotent]", outcome(o_plain)),
        ("#[idempotent(replay)]", outcome(o_replayed)),
        (
            "#[idempotent(fingerprint, replay)]",
            outcome(o_fingerprinted),
        ),
        ("#[idempotent(lease)]", outcome(o_leased)),
        ("#[idempotent(wait)]", outcome(o_waiting)),
        (
            "#[idempotent(on_unavailable = \"refuse\")]",
            outcome(o_refusing),
        ),
    ]
}

fn event(id: &str) -> Event {
    Event::new(id, "api_calls", 1, SystemTime::now())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_entry_point_fails_closed_while_the_store_is_down_and_the_same_gate_recovers() {
    let mut proxy = Proxy::start().await;
    let gate = testing::gate_on(proxy.pool(16).await).await;
    let mut tx = PgConnection::connect_with(&proxy.options())
        .await
        .expect("connect");
    sqlx::query("BEGIN").execute(&mut tx).await.expect("begin");
    // A claim won before the outage, resolved after it; leased, so that
    // extending it needs the store.
    let held = gate
        .guard(&Identity::new("store_down").part("held"))
        .lease(Duration::from_secs(60))
        .claim()
        .await
        .expect("claim");
    let ran_open = AtomicUsize::new(0);
    let before = RUNS.load(Ordering::SeqCst);

    proxy.cut().await;
    let down = std::time::Instant::now();
    let outcomes = every_entry_point(&gate, &mut tx, "down").await;
    for (entry, outcome) in &outcomes {
        match outcome {
            Err(rejected @ Rejected::Unavailable { .. }) => {
                let message = rejected.to_string();
                assert!(
                    message.contains("did not run") && message.contains("retry"),
                    "{entry}: the refusal does not say what to do: {message}"
                );
            }
            other => panic!("{entry} did not fail closed while the store was down: {other:?}"),
        }
    }
    let (meter, events) = (gate.meter(), [event("down")]);
    let (connect, record, extended) = tokio::join!(
        Gate::connect(gate.pool().clone()),
        meter.record(&events),
        held.extend(Duration::from_secs(30)),
    );
    assert!(
        matches!(connect, Err(idem::Error::Database(_))),
        "Gate::connect: {connect:?}"
    );
    assert!(
        matches!(record, Err(idem::Error::Database(_))),
        "Meter::record: {record:?}"
    );
    assert!(
        matches!(extended, Err(Rejected::Unavailable { .. })),
        "Claim::extend: {extended:?}"
    );
    assert_eq!(
        RUNS.load(Ordering::SeqCst),
        before,
        "a body ran while the store was down"
    );
    let down_for = down.elapsed();

    // Failing open is the documented exception: it runs, unguarded.
    failing_open(&gate, "open", &ran_open)
        .await
        .expect("on_unavailable = \"run\" runs the body");
    assert_eq!(ran_open.load(Ordering::SeqCst), 1);

    // The server is back: the same gate, the same pool.
    proxy.resume().await;
    held.settle()
        .await
        .expect("a claim won before the outage settles after it");
    let mut tx = gate.pool().begin().await.expect("begin after the outage");
    let outcomes = every_entry_point(&gate, &mut tx, "down").await;
    tx.commit().await.expect("commit");
    for (entry, outcome) in &outcomes {
        assert!(outcome.is_ok(), "{entry} did not recover: {outcome:?}");
    }
    assert_eq!(
        RUNS.load(Ordering::SeqCst),
        before + outcomes.len(),
        "each refused invocation runs exactly once when retried"
    );
    let report = gate
        .meter()
        .record(&[event("down")])
        .await
        .expect("Meter::record recovers");
    assert_eq!(report.inserted, 1);
    let again = every_entry_point(
        &gate,
        &mut gate.pool().begin().await.expect("begin"),
        "down",
    )
    .await;
    for (entry, outcome) in &again {
        // replay gives the stored value back; the rest refuse: none runs again.
        assert!(
            matches!(outcome, Ok(()) | Err(Rejected::AlreadyDone)),
            "{entry} after success: {outcome:?}"
        );
    }
    assert_eq!(
        RUNS.load(Ordering::SeqCst),
        before + outcomes.len(),
        "nothing ran twice"
    );
    println!(
        "store down: {} entry points refused (Unavailable) in {:.1} s while cut off, plus \
         Gate::connect, Meter::record and Claim::extend; all recovered on the \
         same gate",
        outcomes.len(),
        down_for.as_secs_f64()
    );
}
