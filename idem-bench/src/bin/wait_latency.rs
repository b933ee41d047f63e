//! How should a waiting duplicate (`wait = "5s"`) learn that the holder
//! finished: by polling, as idem does, or by `LISTEN`/`NOTIFY`? This measures
//! both in one process against the same PostgreSQL, and prints ratios.
//!
//! ```text
//! cargo run -p idem-bench --release --bin wait_latency
//! ```
//!
//! - wake-up latency: from the holder's settle returning to the waiting
//!   duplicate's answer;
//! - settle cost: a settle alone, against a settle followed by the
//!   `pg_notify` that `LISTEN`-based waiting would need on every settle.

use std::error::Error;
use std::time::{Duration, Instant};

use idem::sqlx::postgres::PgListener;
use idem::{Gate, Identity, Rejected};
use idem_test_support::database;

const TRIALS: usize = 40;
const SETTLES: usize = 300;
const CHANNEL: &str = "idem_wait_latency";

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let database = database::find().await?;
    let pool = database.pool(4).await?;
    let gate = Gate::connect(pool.clone())
        .await?
        .account(idem::testing::unique_name("wait"));
    let mut listener = PgListener::connect(&database.url).await?;
    listener.listen(CHANNEL).await?;

    let mut polled = Vec::with_capacity(TRIALS);
    let mut notified = Vec::with_capacity(TRIALS);
    for trial in 0..TRIALS {
        // Bodies of 20 to 115 ms, the same sequence for both strategies.
        let body = Duration::from_millis(20 + (trial as u64 * 37) % 96);
        polled.push(wake_by_polling(&gate, trial, body).await?);
        notified.push(wake_by_notify(&gate, &mut listener, trial, body).await?);
    }

    let plain = settle_cost(&gate, "settle_alone", false).await?;
    let with_notify = settle_cost(&gate, "settle_and_notify", true).await?;

    polled.sort();
    notified.sort();
    let pct = |v: &[Duration], p: usize| v[(v.len() * p / 100).min(v.len() - 1)];
    println!("\nwake-up latency after the holder settles ({TRIALS} trials each)");
    println!("| strategy | p50 | p99 |");
    println!("|---|---|---|");
    println!(
        "| polling (10 ms, backing off to 250 ms) | {:?} | {:?} |",
        pct(&polled, 50),
        pct(&polled, 99)
    );
    println!(
        "| LISTEN/NOTIFY | {:?} | {:?} |",
        pct(&notified, 50),
        pct(&notified, 99)
    );
    println!("\nsettle cost ({SETTLES} settles each, one connection at a time)");
    println!("| settle | mean | ratio |");
    println!("|---|---|---|");
    println!("| alone | {plain:?} | 1.00 |");
    println!(
        "| + pg_notify | {with_notify:?} | {:.2} |",
        with_notify.as_secs_f64() / plain.as_secs_f64()
    );
    gate.pool().close().await;
    Ok(())
}

/// The holder claims, works for `body`, settles; a duplicate that arrived
/// meanwhile waits with idem's polling. Returns settle-to-answer latency.
async fn wake_by_polling(
    gate: &Gate,
    trial: usize,
    body: Duration,
) -> Result<Duration, Box<dyn Error>> {
    let id = Identity::new("poll").part(trial);
    let claim = gate.claim(&id).await?;
    let holder = async {
        tokio::time::sleep(body).await;
        claim.settle().await?;
        Ok::<_, Rejected>(Instant::now())
    };
    let waiter = async {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let answer = gate.guard(&id).wait(Duration::from_secs(5)).claim().await;
        (answer.map(|_| ()), Instant::now())
    };
    let (settled, (answer, answered)) = tokio::join!(holder, waiter);
    if !matches!(answer, Err(Rejected::AlreadyDone)) {
        return Err(format!("the waiter should learn the action is done: {answer:?}").into());
    }
    Ok(answered.saturating_duration_since(settled?))
}

/// The same, but the holder notifies after settling and the duplicate
/// listens, then looks once more.
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

/// Mean time of claim-then-settle, the settle followed by a notify or not.
async fn settle_cost(gate: &Gate, label: &str, notify: bool) -> Result<Duration, Box<dyn Error>> {
    let mut spent = Duration::ZERO;
    for n in 0..SETTLES {
        let id = Identity::new(label).part(n);
        let claim = gate.claim(&id).await?;
        let started = Instant::now();
        claim.settle().await?;
        if notify {
            idem::sqlx::query("SELECT pg_notify($1, $2)")
                .bind(CHANNEL)
                .bind(id.address())
                .execute(gate.pool())
                .await?;
        }
        spent += started.elapsed();
    }
    Ok(spent / SETTLES as u32)
}
