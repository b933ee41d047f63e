//! Quickstart: a payment that runs once, however often it is retried.
//!
//! ```text
//! cargo run --example quickstart
//! ```
//!
//! Uses `DATABASE_URL`, else a PostgreSQL on 127.0.0.1:5432, else the tests'
//! throwaway server when it runs, else a throwaway one started from the
//! local PostgreSQL binaries (see `idem-test-support/src/database.rs`). The
//! guarded `charge` is in `billing.rs` beside this file; `races.rs` races it
//! with `idem::race_test!`, as you would race yours (`cargo test --example
//! quickstart`). `RUST_LOG=idem=debug` shows every claim, settle and release.

mod billing;
#[cfg(test)]
mod races;

use std::error::Error;
use std::process::ExitCode;
use std::sync::atomic::Ordering;

use idem::{Gate, Rejected};

use billing::{ChargeError, Order, Provider, charge};
use idem_test_support::database;

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    // Errors are returned, not `exit`ed on, so a throwaway server is removed.
    database::exit_code(run().await)
}

async fn run() -> Result<(), Box<dyn Error>> {
    // Held to the end: dropping it stops a throwaway server, if one was started.
    let database = database::find().await?;
    // One connection per racer, so all 16 claims reach PostgreSQL at once.
    let pool = database.pool(16).await?;
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
