//! What `#[idempotent]` generates, exercised: methods, generics, lifetimes,
//! `impl Trait`, options, and the order in which things are evaluated.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use idem::testing::{self, race};
use idem::{Gate, Identity, KeyPart, Rejected, idempotent};
use idem_test_support::rows;

#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error(transparent)]
    Rejected(#[from] Rejected),
    #[error("parse: {0}")]
    Parse(#[from] std::num::ParseIntError),
}

struct Order {
    id: u64,
    customer: String,
}

struct Tenant {
    id: i64,
}

/// A service that keeps its gate in a field.
struct Billing {
    gate: Arc<Gate>,
    charges: AtomicUsize,
}

impl Billing {
    /// Charges through `self.gate`, keyed on a field of an argument.
    #[idempotent(key = "order.id", gate = self.gate, action = "billing.charge")]
    async fn charge(&self, order: &Order) -> Result<u64, AppError> {
        self.charges.fetch_add(1, Ordering::SeqCst);
        Ok(order.id)
    }

    /// Keyed on `self` too, and scoped to the tenant's account.
    #[idempotent(key = "order.id > 100, order.customer", gate = self.gate, account = tenant.id, namespace = "live")]
    async fn refund<'a>(&'a self, tenant: &Tenant, order: &'a Order) -> Result<&'a str, AppError> {
        Ok(&order.customer)
    }

    /// Consumes `self`.
    #[idempotent(key = "id", gate = self.gate)]
    async fn close(self, id: u32) -> Result<usize, AppError> {
        Ok(self.charges.into_inner() + id as usize)
    }
}

/// Generic, with a `where` clause and an `impl Trait` argument.
#[idempotent(key = "key, label.as_ref()")]
pub(crate) async fn generic<K>(
    gate: &Gate,
    key: K,
    label: impl AsRef<str>,
    seen: &Mutex<Vec<String>>,
) -> Result<String, AppError>
where
    K: KeyPart + std::fmt::Display,
{
    let text = format!("{key}:{}", label.as_ref());
    seen.lock().expect("seen").push(text.clone());
    Ok(text)
}

/// The body's `?` converts into the declared error type; `return` works.
#[idempotent(key = "input")]
async fn parse(gate: &Gate, input: &str) -> Result<i64, AppError> {
    if input.is_empty() {
        return Ok(0);
    }
    let value: i64 = input.parse()?;
    Ok(value)
}

/// An owned gate that the body still uses after the claim.
#[idempotent(key = "n")]
async fn owned_gate(gate: Gate, n: u8) -> Result<String, AppError> {
    Ok(gate.account_name().to_owned())
}

/// Records when the key is evaluated, relative to the body.
struct Probe<'a>(&'a Mutex<Vec<&'static str>>);

impl Probe<'_> {
    fn key(&self) -> u32 {
        self.0.lock().expect("log").push("key evaluated");
        7
    }
}

#[idempotent(key = "probe.key()")]
async fn probed(gate: &Gate, probe: Probe<'_>) -> Result<(), Rejected> {
    probe.0.lock().expect("log").push("body ran");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn methods_use_self_gate_and_race_correctly() {
    let billing = Billing {
        gate: Arc::new(testing::gate().await),
        charges: AtomicUsize::new(0),
    };
    let order = Order {
        id: 42,
        customer: "cus_1".into(),
    };
    race(16, || billing.charge(&order))
        .await
        .assert_exactly_once();
    assert_eq!(billing.charges.load(Ordering::SeqCst), 1);
    // action = "billing.charge" names the slot.
    let address = Identity::new("billing.charge").part(42_u64).address();
    assert_eq!(
        rows::row_state(&billing.gate, &address).await.as_deref(),
        Some("success")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn account_and_namespace_options_scope_the_claim() {
    let gate = testing::gate().await;
    let tenant = Tenant {
        id: 4242 + std::process::id() as i64 * 1_000_000,
    };
    let billing = Billing {
        gate: Arc::new(gate.clone()),
        charges: AtomicUsize::new(0),
    };
    let order = Order {
        id: 1,
        customer: "cus_9".into(),
    };
    assert_eq!(
        billing.refund(&tenant, &order).await.expect("first refund"),
        "cus_9"
    );
    assert!(matches!(
        billing.refund(&tenant, &order).await,
        Err(AppError::Rejected(Rejected::AlreadyDone))
    ));
    let scoped = gate.account(tenant.id.to_string()).namespace("live");
    let address = Identity::new("refund").part(false).part("cus_9").address();
    assert_eq!(
        rows::row_state(&scoped, &address).await.as_deref(),
        Some("success")
    );
    // Not in the gate's own account.
    assert_eq!(rows::row_state(&gate, &address).await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_by_value_receiver_works() {
    let billing = Billing {
        gate: Arc::new(testing::gate().await),
        charges: AtomicUsize::new(3),
    };
    assert_eq!(billing.close(4).await.expect("close"), 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generics_where_clauses_and_impl_trait_arguments_work() {
    let gate = testing::gate().await;
    let seen = Mutex::new(Vec::new());
    assert_eq!(
        generic(&gate, 5_u16, "five", &seen).await.expect("runs"),
        "5:five"
    );
    assert_eq!(
        generic(&gate, "5", String::from("five"), &seen)
            .await
            .expect("text key differs"),
        "5:five"
    );
    assert!(matches!(
        generic(&gate, 5_i64, "five", &seen).await,
        Err(AppError::Rejected(Rejected::AlreadyDone))
    ));
    assert_eq!(seen.lock().expect("seen").len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn question_mark_and_return_in_the_body() {
    let gate = testing::gate().await;
    assert_eq!(parse(&gate, "").await.expect("early return"), 0);
    assert_eq!(parse(&gate, "12").await.expect("parsed"), 12);
    assert!(matches!(parse(&gate, "x").await, Err(AppError::Parse(_))));
    // The failed parse released its slot; the same input fails again, by running.
    assert!(matches!(parse(&gate, "x").await, Err(AppError::Parse(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owned_gate_parameter_is_still_usable_in_the_body() {
    let gate = testing::gate().await;
    let account = gate.account_name().to_owned();
    assert_eq!(owned_gate(gate, 1).await.expect("runs"), account);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_parts_are_evaluated_before_the_body() {
    let gate = testing::gate().await;
    let log = Mutex::new(Vec::new());
    probed(&gate, Probe(&log)).await.expect("runs");
    assert_eq!(*log.lock().expect("log"), ["key evaluated", "body ran"]);
    // A refused call evaluates its key, and never its body.
    assert!(matches!(
        probed(&gate, Probe(&log)).await,
        Err(Rejected::AlreadyDone)
    ));
    assert_eq!(
        *log.lock().expect("log"),
        ["key evaluated", "body ran", "key evaluated"]
    );
}

#[test]
fn futures_of_guarded_functions_are_send() {
    fn assert_send<T: Send>(_: &T) {}
    let gate: Option<&Gate> = None;
    if let Some(gate) = gate {
        assert_send(&parse(gate, "1"));
        assert_send(&generic(gate, 1_u8, "x", &Mutex::new(Vec::new())));
    }
    fn assert_traits<T: Send + Sync + Clone>() {}
    assert_traits::<Gate>();
    assert_traits::<Identity>();
    fn assert_claim_send<T: Send>() {}
    assert_claim_send::<idem::Claim>();
}
