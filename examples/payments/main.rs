//! An axum payments service that charges once per `Idempotency-Key`.
//!
//! ```text
//! cargo run --example payments --features axum,metrics            # port 3000
//! PORT=8080 cargo run --example payments --features axum,metrics  # or: -- 8080
//! ```
//!
//! `POST /charges` takes `{"amount_cents": 4999, "currency": "EUR"}`, an
//! `Idempotency-Key` header and `Authorization: Bearer <account>` (a
//! stand-in for real authentication: the token is the account). The handler
//! is guarded by `#[idempotent]` and writes each charge into a `charges`
//! table: see `service.rs` beside this file, which `tests.rs` starts on
//! 127.0.0.1 and drives over real HTTP (`cargo test --example payments
//! --features axum,metrics`). `GET /metrics` shows what idem counted, in
//! Prometheus' text format, with the gauges of stuck claims sampled beside
//! the service every 15 seconds. The card network it calls takes a second, declines
//! charges above 1,000.00, and times out its first call after charging,
//! then one call in five (the 6th, the 11th, ...), alternately before and
//! after charging: such a charge is held in doubt (retries get 409 and are
//! never charged twice) until the reconciler running beside the service
//! asks the network's lookup, within five seconds. The same calls time out
//! on every start, so a session goes as the READMEs show.
//!
//! Uses `DATABASE_URL`, else a PostgreSQL on 127.0.0.1:5432, else the tests'
//! throwaway server when it runs, else a throwaway one (see
//! `idem-test-support/src/database.rs`). Ctrl-C stops it.

mod service;
#[cfg(test)]
mod tests;

use std::error::Error;
use std::net::Ipv4Addr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use idem::Gate;
use idem::metrics::Gauges;
use idem_test_support::database;
use service::Payments;
use tokio::net::TcpListener;

/// Where the service listens unless `PORT` or an argument says otherwise.
const DEFAULT_PORT: u16 = 3000;

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "idem=info".into()),
        )
        .init();
    // Errors are returned, not `exit`ed on, so a throwaway server is removed.
    database::exit_code(run().await)
}

/// How often the gauges of stuck claims are sampled, and the recorder's
/// upkeep runs.
const METRICS_INTERVAL: Duration = Duration::from_secs(15);

/// A claim pending longer than this is stuck: the card network answers
/// within seconds.
const STALE_AFTER: Duration = Duration::from_secs(60);

async fn run() -> Result<(), Box<dyn Error>> {
    let port = port()?;
    let metrics = service::install_metrics()?;
    // Held to the end: dropping it stops a throwaway server, if one was started.
    let database = database::find().await?;
    let pool = database.pool(16).await?;
    let gate = Gate::connect(pool).await?;
    service::create_charges_table(gate.pool()).await?;
    let pool = gate.pool().clone();
    let payments = Arc::new(Payments::new(gate, Duration::from_secs(1)));
    // The first call times out after charging, then one in five,
    // alternately before and after charging.
    payments.network.time_out_every(service::TIME_OUT_EVERY);
    // Beside the service, until it stops: establishes the charges whose
    // call timed out, from the card network's lookup.
    let reconciler = service::reconciler(Arc::clone(&payments)).interval(Duration::from_secs(5));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let reconciling = tokio::spawn(async move {
        let mut stopped = stopped;
        reconciler
            .run(async move {
                let _ = stopped.wait_for(|stop| *stop).await;
            })
            .await;
    });
    // The gauges of stuck claims, and the recorder's upkeep, beside it too.
    let gauges = Gauges::new(pool.clone(), STALE_AFTER).interval(METRICS_INTERVAL);
    let sampling = tokio::spawn({
        let (mut stopped, metrics) = (stop.subscribe(), metrics.clone());
        async move {
            let upkeep = async {
                loop {
                    tokio::time::sleep(METRICS_INTERVAL).await;
                    metrics.run_upkeep();
                }
            };
            tokio::select! {
                () = gauges.run(async { let _ = stopped.wait_for(|stop| *stop).await; }) => {}
                () = upkeep => {}
            }
        }
    });
    let app = service::router(payments, metrics);

    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, port)).await?;
    let address = listener.local_addr()?;
    println!("payments: listening on http://{address}; Ctrl-C stops it. Try:");
    println!(
        "  curl -i http://{address}/charges -H 'Authorization: Bearer acct_1' \\\n    \
         -H 'Idempotency-Key: 3c5e1b2a' -H 'Content-Type: application/json' \\\n    \
         -d '{{\"amount_cents\": 4999, \"currency\": \"EUR\"}}'"
    );
    println!("  curl http://{address}/metrics");
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            // An error here means no signal can be received: run until killed.
            if tokio::signal::ctrl_c().await.is_err() {
                std::future::pending::<()>().await;
            }
        })
        .await?;
    let _ = stop.send(true);
    reconciling.await?;
    sampling.await?;
    println!("payments: stopped");
    pool.close().await;
    Ok(())
}

/// The port: the first argument, else `PORT`, else [`DEFAULT_PORT`].
fn port() -> Result<u16, String> {
    let given = std::env::args()
        .nth(1)
        .map(|port| ("the argument", port))
        .or_else(|| std::env::var("PORT").ok().map(|port| ("PORT", port)));
    match given {
        None => Ok(DEFAULT_PORT),
        Some((source, port)) => port
            .parse()
            .map_err(|_| format!("{source} must be a port number (0 to 65535), not {port:?}")),
    }
}
