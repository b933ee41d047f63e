//! Metering: a client sends usage in batches, times out, and sends some
//! batches again. Nothing is counted twice.
//!
//! ```text
//! cargo run --example metering
//! ```
//!
//! Finds a PostgreSQL as the quickstart does (see
//! `idem-test-support/src/database.rs`).

use std::error::Error;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use idem::Gate;
use idem::meter::{BatchReport, Event, EventOutcome};
use idem_test_support::database;

#[tokio::main]
async fn main() -> ExitCode {
    // Errors are returned, not `exit`ed on, so a throwaway server is removed.
    database::exit_code(run().await)
}

async fn run() -> Result<(), Box<dyn Error>> {
    let database = database::find().await?;
    let pool = database.pool(4).await?;
    let gate = Gate::connect(pool).await?;
    // A fresh account per run: the same output every time.
    let meter = gate.account(idem::testing::unique_name("metering")).meter();
    let start = SystemTime::now();

    // A stream of API calls, 50 per batch, each event with its own id.
    let stream: Vec<Event> = (0..200)
        .map(|n| {
            let at = start + Duration::from_millis(n * 10);
            Event::new(format!("req_{n:04}"), "api_calls", 1 + (n % 3) as i64, at)
        })
        .collect();
    let batches: Vec<&[Event]> = stream.chunks(50).collect();

    println!("\nsending 4 batches of 50 events");
    for (n, batch) in batches.iter().enumerate() {
        print_report(&format!("batch {}", n + 1), &meter.record(batch).await?);
    }

    println!("\nthe client timed out on batches 2 and 3 and sends them again");
    for n in [1, 2] {
        print_report(
            &format!("batch {} again", n + 1),
            &meter.record(batches[n]).await?,
        );
    }

    println!("\na buggy client re-sends req_0007 with another quantity");
    let changed = Event::new("req_0007", "api_calls", 100, stream[7].occurred_at());
    let report = meter.record(&[changed]).await?;
    print_report("changed re-send", &report);
    if let EventOutcome::Conflict { stored } = &report.outcomes[0] {
        println!(
            "    stored: quantity {} (kept; the re-send is not counted)",
            stored.quantity
        );
    }

    let total = meter
        .total("api_calls", start..start + Duration::from_secs(60))
        .await?;
    let expected: i64 = stream.iter().map(Event::quantity).sum();
    println!(
        "\ntotal api_calls: {} over {} events (sent: {expected} over 200)",
        total.quantity, total.events
    );
    if total.quantity != i128::from(expected) || total.events != 200 {
        return Err("the total does not match what was sent once".into());
    }
    gate.pool().close().await;
    Ok(())
}

fn print_report(label: &str, report: &BatchReport) {
    println!(
        "  {label:<16} inserted {:>3}, deduplicated {:>3}, conflicts {}",
        report.inserted, report.deduplicated, report.conflicts
    );
}
