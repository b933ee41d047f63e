//! **idem** makes an async function run at most once per identity, even when
//! retries arrive at the same instant: put [`#[idempotent(key = "...")]`](macro@idempotent)
//! on it, and a duplicate (concurrent or later) is refused instead of run.
//! For payment, webhook, job and metering code on PostgreSQL.
//!
//! The package is `idem-pg`; its library is `idem`, which is what code and
//! the generated paths name. It is not on crates.io yet: depend on a clone
//! by path, `cargo add idem-pg --path path/to/idem` (the README says what
//! else its first example needs).
//!
//! ```no_run
//! use idem::sqlx::PgPool;
//! use idem::{idempotent, Gate, Rejected};
//!
//! #[derive(Debug, thiserror::Error)]
//! enum ChargeError {
//!     #[error(transparent)]
//!     Rejected(#[from] Rejected),
//!     // ... and the errors of your own
//! }
//!
//! struct Order { id: String }
//!
//! /// Charges an order once, however often it is retried.
//! #[idempotent(key = "order.id, amount_cents")]
//! async fn charge(gate: &Gate, order: &Order, amount_cents: i64) -> Result<String, ChargeError> {
//!     // The side effect: runs only for the invocation that won the claim.
//!     Ok(format!("charged {amount_cents} for {}", order.id))
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let pool = PgPool::connect(&std::env::var("DATABASE_URL")?).await?;
//!     let gate = Gate::connect(pool).await?; // sets up and verifies idem's schema
//!     let order = Order { id: "ord_1001".into() };
//!
//!     assert_eq!(charge(&gate, &order, 4_999).await?, "charged 4999 for ord_1001");
//!     // A retry after the success is refused: the charge already happened.
//!     // (One that arrives while the first still runs is refused `InFlight`.)
//!     assert!(matches!(
//!         charge(&gate, &order, 4_999).await,
//!         Err(ChargeError::Rejected(Rejected::AlreadyDone))
//!     ));
//!     Ok(())
//! }
//! ```
//!
//! ## By hand
//!
//! [`Gate::guard`] starts a [`Guard`]: its methods are the attribute's
//! options, its type changes where an option's bound does, and it ends in
//! `run` or `claim` ([`Claim`], or [`TxClaim`] in a transaction).
//!
//! ```
//! use std::time::Duration;
//! use idem::{Gate, Identity, Rejected};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let pool = idem::sqlx::PgPool::connect(&idem::testing::database_url()).await?;
//! # let gate = Gate::connect(pool).await?.account(idem::testing::unique_name("docs"));
//! let id = Identity::new("charge").part("ord_1001").part(4_999);
//! let charge = || async { Ok::<_, Rejected>(String::from("receipt 1")) };
//! let guard = || gate.guard(&id).lease(Duration::from_secs(30)).replay();
//!
//! let first = guard().run(charge()).await?;
//! // A retry is handed the kept receipt: the body does not run again.
//! assert_eq!(guard().run(charge()).await?, first);
//! # Ok(()) }
//! ```
//!
//! ## Where to read
//!
//! | to read | where |
//! |---|---|
//! | the attribute, and **every mode** (replay, fingerprint, lease, wait, tx, dispositions, ...) in one table | [`#[idempotent]`](macro@idempotent#options) |
//! | connecting, scoping, guarding by hand: every option, a claim, a claim in a transaction | [`Gate`], [`guard`], [`Claim`], [`TxClaim`] |
//! | what makes an action unique, and what can be a key | [`Identity`], [`KeyPart`] |
//! | why a duplicate was refused, and what to do next | [`Rejected`] |
//! | an outcome that may or may not have happened: reconcilers | [`reconcile`], [`Disposition`] |
//! | message consumers: a whole batch claimed in one statement | [`batch`], [`Gate::guard_batch`] |
//! | usage metering: a re-sent batch deduplicates | [`meter`] |
//! | the schema, your own migrations, the partitioned layout | [`schema`] |
//! | what operators do to claims (list, release, resolve, prune) | [`operations`], the `idem` command |
//! | testing your guarded functions | `testing`, `race_test!` (feature `testing`) |
//! | the `Idempotency-Key` protocol, per axum handler or one layer per service | `http` (features `axum`, `tower`) |
//! | answering duplicates of settled outcomes with no round trip | `cache` (feature `cache`) |
//! | counters, histograms and gauges for a dashboard | `metrics` (feature `metrics`) |
//! | the operator console, mounted in your axum service | `console` (feature `console`) |
//!
//! The last five are there only with their feature: from a clone,
//! `cargo doc -p idem-pg --all-features --open` shows them all (a plain
//! `cargo doc --open` leaves them out).
//!
//! ## The insert is the lock
//!
//! Each guarded call inserts a claim row at an address derived from its
//! [`Identity`] (its action's name and key parts); a unique index
//! PostgreSQL enforces lets exactly one concurrent insert win, and the
//! losers are refused without running. No lock is held across the body: a
//! claim is one statement, committed on its own, so a duplicate is refused
//! at once instead of waiting on the winner. An `Ok`
//! settles the row forever; an `Err` releases it (or keeps it, or holds it
//! in doubt, as a [`Disposition`] says); a panic, a dropped future or an
//! unrecorded outcome leaves it held: idem fails closed. [`Gate::connect`]
//! sets up the schema and refuses to start without its two partial unique
//! indexes; for your own migrations see [`schema`].
//!
//! ## Features
//!
//! `uuid` (`Uuid` key parts); `axum`, `tower`, `cache`, `metrics`,
//! `console` and `testing`, as the table above says (`testing` pulls tokio's
//! multi-threaded runtime: enable it in dev-dependencies only). The default
//! set pulls no test-only dependency. The repository's `docs/` holds what is
//! not API (operations, the `idem` command, reliability, design decisions,
//! distributed engines); `BENCHMARKS.md` what it costs.

#![cfg_attr(docsrs, feature(doc_cfg))]
// Library code never unwraps: bad input gets an error that says what to do.
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

#[doc = include_str!("idempotent.md")]
pub use idem_macros::idempotent;
pub use idem_runtime::{
    ADDRESS_DIGEST_HEX, ADDRESS_PREFIX, Claim, ClaimOrReplay, Detached, Disposition, Error,
    EventOrder, Fingerprint, Gate, Guard, Identity, KeyPart, MAX_LEASE, MAX_WINDOW, NotCanonical,
    OnExpiry, OnUnavailable, OrderOutOfRange, Outcome, OutcomeCommit, PartValue, PartWriter,
    PartWritten, Rejected, SchemaProblem, SchemaProblems, Shutdown, Step, TxClaim, batch, detach,
    downstream_key, guard, meter, operations, reconcile, schema, shown, sqlx, step,
};

/// Not a stable API: what idem's own `idem` command, benchmarks and tests
/// reach into (the migrations one by one, the index definitions, the batch
/// claim statement). It changes in any release, without notice.
#[doc(hidden)]
pub use idem_runtime::__internal;

/// Test helpers (feature `testing`, for your dev-dependencies): a real
/// database, isolated gates, and invocations fired at the same instant
/// with a report of what the gate decided; [`race_test!`] makes one such
/// race a whole test.
///
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub use idem_testing as testing;

#[cfg(feature = "cache")]
#[cfg_attr(docsrs, doc(cfg(feature = "cache")))]
pub use idem_runtime::cache;

/// Counters, histograms and gauges of what the gates decide (feature
/// `metrics`), for a dashboard and alerts.
///
/// Scraped by Prometheus, for example:
///
/// ```
/// # #[cfg(feature = "metrics")]
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use idem::metrics::{Gauges, MetricsOptions};
/// use idem::{Gate, Identity, Rejected};
///
/// // Any recorder of the `metrics` ecosystem; here, Prometheus' text format.
/// let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?;
/// idem::metrics::describe();
///
/// # let url = idem::testing::database_url();
/// # let pool = idem::sqlx::PgPool::connect(&url).await?;
/// let gate = Gate::connect(pool.clone()).await?.account(idem::testing::unique_name("docs"));
/// // Labels: action and outcome; the account too, only when asked for.
/// let gate = gate.with_metrics(MetricsOptions::new().label_account(false));
/// let id = Identity::new("charge").part("ord_1001");
/// for _ in 0..3 {
///     let _: Result<(), Rejected> = gate.run(&id, async { Ok(()) }).await;
/// }
/// // The gauges: one query per sample (`Gauges::run` samples on an interval).
/// Gauges::new(pool, Duration::from_secs(300)).sample_once().await?;
///
/// let scraped = prometheus.render(); // what GET /metrics would serve
/// assert!(scraped.contains(r#"idem_outcomes_total{action="charge",outcome="won"} 1"#));
/// assert!(scraped.contains(r#"idem_outcomes_total{action="charge",outcome="settled"} 1"#));
/// assert!(scraped.contains(r#"idem_outcomes_total{action="charge",outcome="already_done"} 2"#));
/// assert!(scraped.contains("idem_claims_in_doubt"));
/// # Ok(()) }
/// # #[cfg(not(feature = "metrics"))]
/// # fn main() {}
/// ```
///
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub use idem_runtime::metrics;

#[cfg(feature = "console")]
#[cfg_attr(docsrs, doc(cfg(feature = "console")))]
pub use idem_console as console;

#[doc = include_str!("http.md")]
// A blank line: the runtime's module docs follow as a paragraph of their own.
#[doc = ""]
#[cfg(any(feature = "axum", feature = "tower"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "axum", feature = "tower"))))]
pub use idem_runtime::http;

/// The README's Rust snippets, compiled as doctests (`cargo test --doc`):
/// what a newcomer pastes first must compile as shown.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

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
///
/// ```
/// # use idem::{idempotent, Gate, Rejected};
/// # struct Order { id: u64 }
/// # #[idempotent(key = "order.id")]
/// # async fn ship(gate: &Gate, order: &Order) -> Result<(), Rejected> { Ok(()) }
/// idem::race_test! {
///     /// Sixteen simultaneous retries ship the order once.
///     ship_runs_once,
///     setup: {
///         let gate = idem::testing::gate().await; // isolated account, real PostgreSQL
///         let order = Order { id: 7 };
///     },
///     race(16): ship(&gate, &order),
/// }
/// ```
///
/// A failure names its cause: more than one winner means the unique
/// constraint is missing or contains a nullable column; no winner means the
/// schema was never set up or the gate points elsewhere.
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
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
