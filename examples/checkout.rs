//! Checkout: three steps inside one guarded call (charge, ship, email). A
//! retry replays the steps that finished and resumes at the first that did
//! not, so a customer is never charged twice.
//!
//! ```text
//! cargo run --example checkout
//! ```
//!
//! Finds a PostgreSQL as the quickstart does (see
//! `idem-test-support/src/database.rs`). `RUST_LOG=idem=warn` shows the
//! dropped call's claim and its takeover in part 3; `RUST_LOG=idem=debug`
//! every claim.

use std::collections::HashMap;
use std::error::Error;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use idem::{Gate, Identity, Rejected};
use idem_test_support::database;
use serde::{Deserialize, Serialize};

/// What a checkout can fail with: a refusal of the gate, or the warehouse
/// turning the shipment down (nothing shipped: a retry may ship).
#[derive(Debug, thiserror::Error)]
enum CheckoutError {
    #[error(transparent)]
    Rejected(#[from] Rejected),
    #[error("the warehouse is unavailable")]
    WarehouseDown,
}

/// The payment provider's answer, recorded with the step and replayed.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Receipt {
    id: String,
    amount_cents: i64,
}

/// Stands in for a payment provider, a warehouse and a mailer. Charges are
/// deduplicated by their idempotency key, as Stripe's are; shipments and
/// emails are not: every call ships or sends.
#[derive(Default)]
struct Services {
    /// Receipts by idempotency key: a second call with a key gets the first
    /// receipt, and nothing is charged.
    receipts: Mutex<HashMap<String, Receipt>>,
    charges: AtomicUsize,
    shipments: AtomicUsize,
    emails: AtomicUsize,
    /// The warehouse turns the next shipment down (once).
    warehouse_down: AtomicBool,
    /// The next charge hangs after the provider charged (once): the client
    /// gives up on it, as a timeout would.
    hang_after_charge: AtomicBool,
}

impl Services {
    async fn charge(&self, key: &str, amount_cents: i64) -> Result<Receipt, CheckoutError> {
        let receipt = {
            let mut receipts = self.receipts.lock().unwrap_or_else(PoisonError::into_inner);
            let count = receipts.len();
            receipts
                .entry(key.to_owned())
                .or_insert_with(|| {
                    self.charges.fetch_add(1, Ordering::SeqCst);
                    Receipt {
                        id: format!("ch_{}", count + 1),
                        amount_cents,
                    }
                })
                .clone()
        };
        if self.hang_after_charge.swap(false, Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        Ok(receipt)
    }

    async fn ship(&self, order: &str) -> Result<String, CheckoutError> {
        if self.warehouse_down.swap(false, Ordering::SeqCst) {
            return Err(CheckoutError::WarehouseDown);
        }
        self.shipments.fetch_add(1, Ordering::SeqCst);
        Ok(format!("parcel_{order}"))
    }

    async fn email(&self, _order: &str, _receipt: &Receipt) -> Result<(), CheckoutError> {
        self.emails.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn counts(&self) -> (usize, usize, usize) {
        (
            self.charges.load(Ordering::SeqCst),
            self.shipments.load(Ordering::SeqCst),
            self.emails.load(Ordering::SeqCst),
        )
    }
}

/// One order's checkout, run at most once per order however often it is
/// retried. Each step runs at most once and its result is recorded with the
/// claim: a retry after a failure replays the finished steps and resumes.
async fn checkout(
    gate: &Gate,
    order: &str,
    amount_cents: i64,
    services: &Services,
) -> Result<(Receipt, String), CheckoutError> {
    let id = Identity::new("checkout").part(order);
    // A lease, so that a holder cut off (its process gone, its call
    // dropped) is taken over by the next retry.
    gate.guard(&id)
        .lease(Duration::from_millis(300))
        .run(async {
            // Stable for this order and step on every run: the provider
            // deduplicates the charge by it, so the step is safe to repeat
            // when a run was cut off inside it.
            let key = idem::downstream_key("charge")?;
            let receipt = idem::step("charge", services.charge(&key, amount_cents))
                .repeatable()
                .await?;
            // Not safe to repeat: a run cut off inside it leaves the order
            // in doubt, for a reconciler or an operator, never shipped twice.
            let parcel = idem::step("ship", services.ship(order)).await?;
            idem::step("email", services.email(order, &receipt)).await?;
            Ok((receipt, parcel))
        })
        .await
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "error".into()),
        )
        .init();
    // Errors are returned, not `exit`ed on, so a throwaway server is removed.
    database::exit_code(run().await)
}

async fn run() -> Result<(), Box<dyn Error>> {
    // Held to the end: dropping it stops a throwaway server, if one was started.
    let database = database::find().await?;
    let pool = database.pool(4).await?;
    let gate = Gate::connect(pool).await?;
    // A fresh account per run: the same output every time.
    let gate = gate.account(idem::testing::unique_name("checkout"));
    let services = Services::default();

    println!("\n1. Checkout of ord_2001: charged, then the warehouse is down");
    services.warehouse_down.store(true, Ordering::SeqCst);
    match checkout(&gate, "ord_2001", 4_999, &services).await {
        Err(CheckoutError::WarehouseDown) => {}
        other => return Err(format!("expected the shipment to fail, got {other:?}").into()),
    }
    println!(
        "   charged {}, shipped {}, emailed {}: the claim is released, the charge recorded",
        services.charges.load(Ordering::SeqCst),
        services.shipments.load(Ordering::SeqCst),
        services.emails.load(Ordering::SeqCst),
    );

    println!("\n2. The client retries: the charge is replayed, not run again");
    let (receipt, parcel) = checkout(&gate, "ord_2001", 4_999, &services).await?;
    println!(
        "   receipt {} ({} cents, the first run's), {parcel} shipped, email sent",
        receipt.id, receipt.amount_cents
    );
    if services.counts() != (1, 1, 1) {
        return Err(format!("expected one of each, got {:?}", services.counts()).into());
    }
    match checkout(&gate, "ord_2001", 4_999, &services).await {
        Err(CheckoutError::Rejected(refusal @ Rejected::AlreadyDone)) => {
            println!("   once more: {refusal}");
        }
        other => return Err(format!("expected AlreadyDone, got {other:?}").into()),
    }

    println!("\n3. Checkout of ord_2002: the provider charges, then the client gives up");
    services.hang_after_charge.store(true, Ordering::SeqCst);
    let cut_off = tokio::time::timeout(
        Duration::from_millis(200),
        checkout(&gate, "ord_2002", 1_250, &services),
    )
    .await;
    if cut_off.is_ok() {
        return Err("expected the charge to hang".into());
    }
    println!(
        "   timed out inside the charge: nobody knows whether it happened (charges so far: {})",
        services.charges.load(Ordering::SeqCst)
    );
    // Past the lease: the next retry takes the claim over and runs the
    // charge again under the same key, which the provider answers with
    // the first receipt.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let (receipt, _) = checkout(&gate, "ord_2002", 1_250, &services).await?;
    let key = first_key(&services, &receipt.id);
    println!(
        "   retry: the charge ran again with the key {key}: the provider answered {} \
         without charging",
        receipt.id
    );
    if services.counts() != (2, 2, 2) {
        return Err(format!("expected two of each, got {:?}", services.counts()).into());
    }

    println!("\n2 orders, each charged, shipped and emailed once, out of 5 attempts.");
    gate.pool().close().await;
    Ok(())
}

/// The idempotency key the provider saw for the receipt `id`.
fn first_key(services: &Services, id: &str) -> String {
    let receipts = services
        .receipts
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    receipts
        .iter()
        .find(|(_, receipt)| receipt.id == id)
        .map(|(key, _)| key.clone())
        .unwrap_or_default()
}
