//! Quickstart: a payment that runs once, however often it is retried.
//!
//! ```text
//! cargo run --example quickstart
//! ```
//!
//! Finds its PostgreSQL as idem's tests do: `DATABASE_URL` when set, else a
//! server on 127.0.0.1:5432 that lets user `postgres` in, else a throwaway
//! one started from the machine's server binaries or, with none installed,
//! from a pinned build fetched once (`IDEM_THROWAWAY=1` skips the local
//! server). It works in a database of its own, dropped on exit. The guarded
//! `charge` is in `billing.rs` beside this file; `races.rs` races it with
//! `idem::race_test!`, as you would race yours (`cargo test -p
//! idem-quickstart`). `RUST_LOG=idem=debug` shows every claim, settle and
//! release.

mod billing;
#[cfg(test)]
mod races;

use std::error::Error;
use std::process::ExitCode;
use std::sync::atomic::Ordering;

use idem::sqlx::postgres::PgPoolOptions;
use idem::testing::server::databases::OwnDatabase;
use idem::{Gate, Rejected};
use tracing::Level;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::prelude::*;

use billing::{ChargeError, Order, Provider, charge};

#[tokio::main]
async fn main() -> ExitCode {
    // `RUST_LOG=idem=debug`: targets and levels only (`Targets`), which
    // needs no regex engine to build.
    let filter: Targets = std::env::var("RUST_LOG")
        .ok()
        .and_then(|directives| directives.parse().ok())
        .unwrap_or_else(|| Targets::new().with_default(Level::WARN));
    tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer())
        .with(filter)
        .init();
    // Errors are returned, not `exit`ed on, so the database is dropped.
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), Box<dyn Error>> {
    // Held to the end: dropping it drops the database it created.
    let database = tokio::task::spawn_blocking(OwnDatabase::create).await??;
    println!("database: {}", database.describe());
    // One connection per racer, so all 16 claims reach PostgreSQL at once.
    let pool = PgPoolOptions::new()
        .max_connections(16)
        .connect(database.url())
        .await?;
    // `Gate::connect` creates idem's table if needed and verifies its unique
    // indexes. A fresh account per run starts with no claims, so the output
    // is the same every time.
    let gate = Gate::connect(pool).await?;
    let gate = gate.account(idem::testing::unique_name("quickstart"));
    let provider = Provider::default();

    println!("\n1. A client retries one charge 16 times at the same instant");
    let order = Order {
        id: "ord_1001".into(),
    };
    let report = idem::testing::race(16, || charge(&gate, &order, 4_999, &provider)).await;
    let reasons = report.refusal_counts();
    let counts: Vec<String> = reasons
        .iter()
        .map(|(refusal, count)| format!("{}: {count}", refusal.reason().replace('_', " ")))
        .collect();
    println!(
        "   16 concurrent retries -> {} ran, {} refused ({})",
        report.claimed(),
        report.refused(),
        counts.join(", ")
    );
    for (refusal, _) in &reasons {
        println!("   e.g. \"{refusal}\"");
    }
    let charged = provider.charges.load(Ordering::SeqCst);
    if report.claimed() != 1 || report.wins() != 1 || charged != 1 {
        return Err(
            format!("expected exactly one charge, the provider saw {charged}\n{report}").into(),
        );
    }

    println!("\n2. The client retries once more, after the charge succeeded");
    match charge(&gate, &order, 4_999, &provider).await {
        Err(ChargeError::Rejected(refusal @ Rejected::AlreadyDone)) => println!("   {refusal}"),
        other => return Err(format!("expected AlreadyDone, got {other:?}").into()),
    }

    println!("\n3. A charge that fails is released, so its retry runs");
    let order = Order {
        id: "ord_1002".into(),
    };
    provider.decline_next.store(true, Ordering::SeqCst);
    match charge(&gate, &order, 1_250, &provider).await {
        Err(ChargeError::Declined) => println!("   first attempt: card declined -> slot released"),
        other => return Err(format!("expected Declined, got {other:?}").into()),
    }
    let receipt = charge(&gate, &order, 1_250, &provider).await?;
    println!(
        "   retry: ran -> charged {} cents for {}",
        receipt.amount_cents, receipt.order_id
    );

    let charged = provider.charges.load(Ordering::SeqCst);
    if charged != 2 {
        return Err(format!("expected 2 charges in all, the provider saw {charged}").into());
    }
    println!("\nThe provider charged 2 orders once each, out of 19 attempts.");
    gate.pool().close().await;
    Ok(())
}
