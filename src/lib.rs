//! **idem** makes an async function run at most once per identity, even when
//! retries arrive at the same instant.
//!
//! ```
//! use idem::{idempotent, Gate, Rejected};
//!
//! #[derive(Debug, thiserror::Error)]
//! enum ChargeError {
//!     #[error(transparent)]
//!     Rejected(#[from] Rejected),
//!     #[error("card declined")]
//!     Declined,
//! }
//!
//! struct Order {
//!     id: String,
//! }
//!
//! /// Charges an order once, however often it is retried.
//! #[idempotent(key = "order.id, amount_cents")]
//! async fn charge(gate: &Gate, order: &Order, amount_cents: i64) -> Result<String, ChargeError> {
//!     // The side effect: runs only for the invocation that won the claim.
//!     Ok(format!("charged {amount_cents} for {}", order.id))
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let url = idem::testing::database_url();
//! let pool = idem::sqlx::PgPool::connect(&url).await?;
//! let gate = Gate::connect(pool).await?.account(idem::testing::unique_name("docs"));
//! let order = Order { id: "ord_1001".into() };
//!
//! assert_eq!(charge(&gate, &order, 4_999).await?, "charged 4999 for ord_1001");
//! // The retry is refused: the charge already happened.
//! assert!(matches!(
//!     charge(&gate, &order, 4_999).await,
//!     Err(ChargeError::Rejected(Rejected::AlreadyDone))
//! ));
//! # Ok(()) }
//! ```
//!
//! # The insert is the lock
//!
//! Each guarded invocation inserts a claim row into `idem_records` at an
//! address derived from its [`Identity`]: `claim_` followed by the first 24
//! hex digits of the sha1 of the identity's canonical encoding. A unique index
//! that PostgreSQL enforces lets exactly one concurrent insert win; the others
//! are refused and their bodies do not run.
//!
//! | step | when | effect |
//! |---|---|---|
//! | claim | before the body | insert a `pending` row, autocommitted; a conflict refuses |
//! | settle | the body returned `Ok` | the row becomes `success` and keeps the slot forever |
//! | release | the body returned `Err` | the row is deleted, so a retry can run |
//! | (nothing) | settle failed, the body panicked, or its future was dropped | the row stays `pending`: the outcome is unknown, so retries are refused |
//!
//! A success is never lost: a settle never fails because of the value it
//! carries, and a holder whose claim was taken over or released while its
//! body ran still records its success in the slot, and is told
//! [`Rejected::LeaseLost`] or [`Rejected::ClaimLost`]. Only an outage is
//! [`Rejected::Unavailable`]; the store refusing the request (a permission,
//! a missing table) is [`Rejected::StoreRefused`], which never fails open.
//!
//! Uniqueness lives in two partial unique indexes split on
//! `namespace IS NULL`, because a unique index over a nullable column
//! enforces nothing for the rows where it is NULL. [`Gate::connect`] sets the
//! schema up (idempotently, under an advisory lock) and refuses to start when
//! either index or its predicate is missing.
//!
//! # `#[idempotent]`
//!
//! ```text
//! #[idempotent(key = "order.id, amount_cents")]
//! #[idempotent(key = "order.id", action = "charge", gate = self.gate, account = tenant.id, namespace = "live")]
//! ```
//!
//! | option | value | default |
//! |---|---|---|
//! | `key` | a string of comma-separated expressions, each starting from a parameter (or `self`); each must implement [`KeyPart`] | required |
//! | `action` | a string naming the action | the function's name |
//! | `gate` | an expression giving a `Gate`, `&Gate` or `Arc<Gate>` | the parameter named `gate` |
//! | `account` | an expression whose `Display` form names the account (tenant) | the gate's account |
//! | `namespace` | an expression whose `Display` form names the namespace | the gate's namespace |
//! | `replay` | (a flag) keep the `Ok` value (serde) and return it to later duplicates | off |
//! | `fingerprint` | a string of expressions making up the payload; another payload under the same key is [`Rejected::KeyReused`] | none |
//! | `lease` | a duration (`"30s"`, `"5m"`, at most `"100y"`): a pending claim expires and is taken over with a higher fence; a stale holder is told [`Rejected::LeaseLost`] | holds until resolved |
//! | `wait` | a duration: an in-flight duplicate waits for the outcome instead of being refused | no waiting |
//! | `on_unavailable` | `"refuse"` or `"run"` (fail open on an outage, for harmless duplicates) | `"refuse"` |
//! | `tx` | a `&mut Transaction<'_, Postgres>` or `&mut PgConnection` parameter: claim and settle inside it | own statements |
//! | `crate` | the path to idem as your crate names it, e.g. `"idem1"` after `idem1 = { package = "idem", ... }` in Cargo.toml, or a re-export such as `"::my_app::deps::idem"`: the generated code goes through it | `::idem` |
//! | `outcome_commit` | `"durable"` or `"async"`: settle and release commit without waiting for the disk ([`OutcomeCommit::Async`]); not with `lease` or `tx` | `"durable"` |
//!
//! The README's "choosing a mode" table says what each mode guarantees and
//! costs.
//!
//! The function must be `async` and return `Result<T, E>` with
//! `E: From<Rejected>`. Its signature, visibility, attributes, docs, generics,
//! `where` clauses and receiver are kept as written. The key parts and the
//! gate are evaluated before the body runs.
//!
//! **Name `action` for anything long-lived.** It defaults to the function's
//! name, not its module path: moving the function keeps its slots, but
//! renaming it starts afresh, and every settled action could run once more.
//!
//! A key part that is `None` makes the identity absent: that invocation runs
//! ungated, deliberately, and a tracing event says so. Floats are not key
//! parts: they have no canonical form, and the compile error says so.
//!
//! # Testing your guarded functions
//!
//! With the `testing` feature (in your dev-dependencies:
//! `idem = { version = "0.1", features = ["testing"] }`), `testing::race`
//! fires invocations at the same instant and reports what the gate decided;
//! `race_test!` turns that into a whole test:
//!
//! ```
//! # use idem::{idempotent, Gate, Rejected};
//! # struct Order { id: u64 }
//! # #[idempotent(key = "order.id")]
//! # async fn ship(gate: &Gate, order: &Order) -> Result<(), Rejected> { Ok(()) }
//! idem::race_test! {
//!     /// Sixteen simultaneous retries ship the order once.
//!     ship_runs_once,
//!     setup: {
//!         let gate = idem::testing::gate().await;
//!         let order = Order { id: 7 };
//!     },
//!     race(16): ship(&gate, &order),
//! }
//! ```

// Library code never unwraps: bad input gets an error that says what to do.
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

pub use idem_macros::idempotent;
pub use idem_runtime::{
    ADDRESS_DIGEST_HEX, ADDRESS_PREFIX, Claim, Error, Fingerprint, Gate, GateEvent, Identity,
    KeyPart, Mode, NotCanonical, OnUnavailable, OutcomeCommit, PartWriter, PartWritten, Rejected,
    SchemaProblem, SchemaProblems, meter, schema, sqlx,
};

/// Test helpers (feature `testing`): a real database, isolated gates, and
/// invocations fired at the same instant with a report of what the gate
/// decided. See also [`race_test!`].
#[cfg(feature = "testing")]
pub use idem_runtime::testing;

/// The `Idempotency-Key` header for axum services (feature `axum`).
///
/// A charge that runs once per key, whose retries get the first answer back
/// byte for byte, and whose refusals are the IETF idempotency-key draft's
/// 409, 422 and 503:
///
/// ```
/// use axum::extract::State;
/// use axum::http::StatusCode;
/// use axum::response::{IntoResponse, Response};
/// use axum::{Json, Router, routing::post};
/// use idem::axum::{IdempotencyKey, StoredResponse};
/// use idem::{Gate, Rejected, idempotent};
///
/// #[derive(serde::Deserialize)]
/// struct NewCharge {
///     amount_cents: i64,
///     currency: String,
/// }
///
/// #[derive(Debug, thiserror::Error)]
/// enum ChargeError {
///     #[error(transparent)]
///     Rejected(#[from] Rejected),
///     #[error(transparent)]
///     Encoding(#[from] serde_json::Error),
/// }
///
/// impl IntoResponse for ChargeError {
///     fn into_response(self) -> Response {
///         match self {
///             ChargeError::Rejected(refused) => refused.into_response(), // 409, 422, 503, ...
///             ChargeError::Encoding(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
///         }
///     }
/// }
///
/// /// Runs once per Idempotency-Key; a retry gets the first answer back.
/// #[idempotent(key = "key", fingerprint = "charge.amount_cents, charge.currency", replay)]
/// async fn create_charge(
///     State(gate): State<Gate>,
///     key: IdempotencyKey,
///     Json(charge): Json<NewCharge>,
/// ) -> Result<StoredResponse, ChargeError> {
///     let receipt = serde_json::json!({ "charged": charge.amount_cents, "in": charge.currency });
///     Ok(StoredResponse::json(StatusCode::CREATED, &receipt)?)
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let url = idem::testing::database_url();
/// # let pool = idem::sqlx::PgPool::connect(&url).await?;
/// let gate = Gate::connect(pool).await?.account(idem::testing::unique_name("docs"));
/// let app: Router = Router::new()
///     .route("/charges", post(create_charge))
///     .with_state(gate.clone());
///
/// // What the router does for two identical requests, by hand:
/// let key: IdempotencyKey = "9f1c2e0a-7b4d-4c1e-8f3a-2d6b5e4c3a21".parse()?;
/// let request = || Json(NewCharge { amount_cents: 4_999, currency: "EUR".into() });
/// let first = create_charge(State(gate.clone()), key.clone(), request()).await.into_response();
/// let retry = create_charge(State(gate.clone()), key.clone(), request()).await.into_response();
/// assert_eq!(first.status(), StatusCode::CREATED);
/// assert_eq!(retry.status(), StatusCode::CREATED);
/// assert!(first.headers().get("idempotent-replayed").is_none());
/// assert_eq!(retry.headers()["idempotent-replayed"], "true");
/// # drop(app);
/// # Ok(()) }
/// ```
#[cfg(feature = "axum")]
pub use idem_runtime::http as axum;

/// What `#[idempotent]` and `race_test!` expand to call. Not a stable API.
#[doc(hidden)]
pub mod __private {
    pub use idem_runtime::expansion::*;
    #[cfg(feature = "testing")]
    pub use tokio;
}

/// Generates a `#[tokio::test]` that races one guarded invocation against
/// itself and asserts that exactly one ran ([`testing::RaceReport::assert_exactly_once`]).
///
/// ```text
/// idem::race_test! {
///     /// Doc comments and attributes are kept.
///     name_of_the_test,
///     setup: { let gate = idem::testing::gate().await; /* more lets */ },
///     race(16): the_guarded_fn(&gate, ...),
///     // optional: more checks, with the report in hand
///     then(report): { assert_eq!(report.refused(), 15); },
/// }
/// ```
///
/// The setup runs once; the invocation expression is evaluated once per
/// racer and may borrow what the setup made. The test runs on a
/// multi-threaded runtime.
#[cfg(feature = "testing")]
#[macro_export]
macro_rules! race_test {
    (
        $(#[$attr:meta])*
        $name:ident,
        setup: { $($setup:tt)* },
        race($racers:expr): $invocation:expr
        $(, then($report:ident): $check:block)?
        $(,)?
    ) => {
        $(#[$attr])*
        #[::idem::__private::tokio::test(
            flavor = "multi_thread",
            worker_threads = 2,
            crate = "::idem::__private::tokio"
        )]
        async fn $name() {
            $($setup)*
            let report = ::idem::testing::race($racers, || $invocation).await;
            report.assert_exactly_once();
            $(
                let $report = &report;
                $check
            )?
        }
    };
}
