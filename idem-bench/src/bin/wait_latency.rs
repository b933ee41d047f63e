//! How soon does a waiting duplicate (`wait = "5s"`) learn that the holder
//! finished? Polling as every waiter did before issue 42 (10 ms, backing
//! off to 250 ms), against the two ways a waiter learns it now: attached to
//! the holder in the same process, and woken by the holder's notification
//! in another (schema version 13), with a bare `LISTEN`/`NOTIFY` as the
//! floor of the latter. One run, one PostgreSQL, ratios printed.
//!
//! ```text
//! cargo run -p idem-bench --release --bin wait_latency
//! ```
//!
//! - wake-up latency: from the holder's settle returning to the waiting
//!   duplicate's answer. "Polling" is a duplicate on a second gate on its
//!   own pool (another process, as far as idem can tell: its gate holds no
//!   claim of the other's) that claims again on the schedule every waiter
//!   kept before; "woken" is `wait` on that second gate; "attached" is
//!   `wait` on the holder's own gate.
//! - the plain settle with no waiter: claims and settles, paired in the
//!   same run, through a gate (which registers each claim for attaching,
//!   and whose settle returns whether anybody waits) and, alternating with
//!   it, the claim statement and the settle as it was before schema
//!   version 13 (no `RETURNING`) sent by hand, so that both meet the same
//!   server at the same moments.

use std::error::Error;
use std::time::{Duration, Instant};

use idem::__internal::store::{Engine, Scope, claims};
use idem::sqlx::postgres::PgListener;
use idem::{Gate, Identity, Rejected};
use idem_test_support::database;

const TRIALS: usize = 40;
const SETTLES: usize = 400;
const CHANNEL: &str = "idem_wait_latency";

/// The settle of a claim without a namespace as schema version 12 sent it:
/// no `RETURNING` (version 13 returns whether anybody waits).
const SETTLE_BEFORE_V13: &str = "UPDATE idem_records \
     SET state = 'success', settled_at = statement_timestamp(), lease_expires_at = NULL, output_json = $5 \
     WHERE account = $1 AND kind = 'claim' AND address = $2 AND namespace IS NULL AND $3::text IS NULL \
       AND state = 'pending' AND fence = $4";

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let database = database::find().await?;
    let account = idem::testing::unique_name("wait");
    let gate = Gate::connect(database.pool(4).await?)
        .await?
        .account(account.clone());
    // Another process, as far as the holder's gate can tell.
    let elsewhere = Gate::connect(database.pool(4).await?)
        .await?
        .account(account);
    let mut listener = PgListener::connect(&database.url).await?;
    listener.listen(CHANNEL).await?;

    let (mut polled, mut woken, mut attached, mut notified) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for trial in 0..TRIALS {
        // Bodies of 20 to 115 ms, the same sequence for every strategy.
        let body = Duration::from_millis(20 + (trial as u64 * 37) % 96);
        polled.push(wake(&gate, &elsewhere, Waiter::Polls, trial, body).await?);
        woken.push(wake(&gate, &elsewhere, Waiter::Waits("woken"), trial, body).await?);
        attached.push(wake(&gate, &gate, Waiter::Waits("attach"), trial, body).await?);
        notified.push(wake_by_notify(&gate, &mut listener, trial, body).await?);
    }

    let (registered, by_hand) = settle_throughput(&gate).await?;

    for run in [&mut polled, &mut woken, &mut attached, &mut notified] {
        run.sort();
    }
    let pct = |v: &[Duration], p: usize| v[(v.len() * p / 100).min(v.len() - 1)];
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64().max(1e-9);
    let sooner = |a: Duration| ratio(pct(&polled, 50), a);
    println!("\nwake-up latency after the holder settles ({TRIALS} trials each)");
    println!("| strategy | p50 | p99 | p50 vs polling (how many times sooner) |");
    println!("|---|---|---|---|");
    println!(
        "| polling, a waiter in another gate (10 ms backing off to 250 ms: every waiter before) | {:?} | {:?} | 1× |",
        pct(&polled, 50),
        pct(&polled, 99)
    );
    println!(
        "| woken, a waiter in another gate (its holder notifies: schema version 13) | {:?} | {:?} | {:.0}× |",
        pct(&woken, 50),
        pct(&woken, 99),
        sooner(pct(&woken, 50))
    );
    println!(
        "| attached, a waiter in the holder's process | {:?} | {:?} | {:.0}× |",
        pct(&attached, 50),
        pct(&attached, 99),
        sooner(pct(&attached, 50))
    );
    println!(
        "| LISTEN/NOTIFY then one look (reference, another process) | {:?} | {:?} | {:.0}× |",
        pct(&notified, 50),
        pct(&notified, 99),
        sooner(pct(&notified, 50))
    );
    println!(
        "\nthe plain settle with no waiter ({SETTLES} claims and settles each, paired, one at a time)"
    );
    println!("| claim + settle | mean | ratio |");
    println!("|---|---|---|");
    println!(
        "| the claim, and the settle as before schema version 13, by hand | {by_hand:?} | 1.00 |"
    );
    println!(
        "| through the gate (registered for attaching, returning whether anybody waits) | {registered:?} | {:.3} |",
        ratio(registered, by_hand)
    );
    gate.pool().close().await;
    elsewhere.pool().close().await;
    Ok(())
}

/// How the duplicate waits.
#[derive(Clone, Copy)]
enum Waiter {
    /// Claims again on the schedule every waiter kept before issue 42.
    Polls,
    /// `wait`, as idem does it now; the action's label.
    Waits(&'static str),
}

/// The holder claims on `holder`, works for `body`, settles; a duplicate
/// on `waiter` that arrived meanwhile waits. Returns settle-to-answer
/// latency.
async fn wake(
    holder: &Gate,
    waiter: &Gate,
    how: Waiter,
    trial: usize,
    body: Duration,
) -> Result<Duration, Box<dyn Error>> {
    let label = match how {
        Waiter::Polls => "poll",
        Waiter::Waits(label) => label,
    };
    let id = Identity::new(label).part(trial);
    let claim = holder.claim(&id).await?;
    let holding = async {
        tokio::time::sleep(body).await;
        claim.settle().await?;
        Ok::<_, Rejected>(Instant::now())
    };
    let waiting = async {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let answer = match how {
            Waiter::Waits(_) => waiter.guard(&id).wait(Duration::from_secs(5)).claim().await,
            Waiter::Polls => {
                let mut poll = Duration::from_millis(10);
                loop {
                    match waiter.claim(&id).await {
                        Err(Rejected::InFlight) => tokio::time::sleep(poll).await,
                        answer => break answer,
                    }
                    poll = (poll * 2).min(Duration::from_millis(250));
                }
            }
        };
        (answer.map(|_| ()), Instant::now())
    };
    let (settled, (answer, answered)) = tokio::join!(holding, waiting);
    if !matches!(answer, Err(Rejected::AlreadyDone)) {
        return Err(format!("the waiter should learn the action is done: {answer:?}").into());
    }
    Ok(answered.saturating_duration_since(settled?))
}

/// The holder notifies after settling and the duplicate listens, then
/// looks once more: what a cross-process wake-up costs at best.
async fn wake_by_notify(
    gate: &Gate,
    listener: &mut PgListener,
    trial: usize,
    body: Duration,
) -> Result<Duration, Box<dyn Error>> {
    let id = Identity::new("notify").part(trial);
    let address = id.address();
    let claim = gate.claim(&id).await?;
    let holder = async {
        tokio::time::sleep(body).await;
        claim.settle().await?;
        idem::sqlx::query("SELECT pg_notify($1, $2)")
            .bind(CHANNEL)
            .bind(&address)
            .execute(gate.pool())
            .await?;
        Ok::<_, Box<dyn Error>>(Instant::now())
    };
    let waiter = async {
        tokio::time::sleep(Duration::from_millis(5)).await;
        if !matches!(gate.claim(&id).await, Err(Rejected::InFlight)) {
            return Err::<_, Box<dyn Error>>("the holder should still be in flight".into());
        }
        loop {
            let notification = listener.recv().await?;
            if notification.payload() == address {
                break;
            }
        }
        let answer = gate.claim(&id).await;
        if !matches!(answer, Err(Rejected::AlreadyDone)) {
            return Err(format!("the waiter should learn the action is done: {answer:?}").into());
        }
        Ok(Instant::now())
    };
    let (settled, answered) = tokio::join!(holder, waiter);
    Ok(answered?.saturating_duration_since(settled?))
}

/// Mean time of one claim and its settle with nobody waiting: through the
/// gate (which registers the claim for attaching and removes it as it
/// settles), and the very same named statements sent through the store
/// below the gate (no registration), alternating one by one.
async fn settle_throughput(gate: &Gate) -> Result<(Duration, Duration), Box<dyn Error>> {
    let (mut registered, mut by_hand) = (Duration::ZERO, Duration::ZERO);
    let scope = Scope {
        account: gate.account_name(),
        namespace: None,
    };
    for n in 0..SETTLES {
        let id = Identity::new("settle_registered").part(n);
        let started = Instant::now();
        gate.claim(&id).await?.settle().await?;
        registered += started.elapsed();

        let id = Identity::new("settle_by_hand").part(n);
        let address = id.address();
        let started = Instant::now();
        let new = claims::NewClaim {
            identity: id.canonical(),
            fingerprint: None,
            lease_micros: None,
            expires_in_doubt: false,
            windows: Default::default(),
            ordered: None,
        };
        let answer = claims::claim(
            &mut *gate.pool().acquire().await?,
            Engine::PostgreSQL,
            claims::Within::Autocommit,
            scope,
            &address,
            new,
            claims::KeptValue::Skip,
        )
        .await?;
        let claims::ClaimAnswer::Won(fence) = answer else {
            return Err(format!("a fresh slot is won: {answer:?}").into());
        };
        let settled = idem::sqlx::query(SETTLE_BEFORE_V13)
            .bind(scope.account)
            .bind(&address)
            .bind(scope.namespace)
            .bind(fence)
            .bind(None::<&str>)
            .execute(&mut *gate.pool().acquire().await?)
            .await?;
        if settled.rows_affected() != 1 {
            return Err("the settle matched its own claim".into());
        }
        by_hand += started.elapsed();
    }
    Ok((registered / SETTLES as u32, by_hand / SETTLES as u32))
}
