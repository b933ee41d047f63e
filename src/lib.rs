//! **idem** makes an async function run at most once per identity, even when
//! retries arrive at the same instant: put [`#[idempotent(key = "...")]`](macro@idempotent)
//! on it, and a duplicate (concurrent or later) is refused instead of run.
//! For payment, webhook, job and metering code on PostgreSQL.
//!
//! The package is `idem-pg` (`cargo add idem-pg`); its library is `idem`,
//! which is what code and the generated paths name.
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
//! | to read | where |
//! |---|---|
//! | the attribute, every option with an example | [`#[idempotent]`](macro@idempotent) |
//! | connecting, scoping, claiming by hand | [`Gate`], [`Claim`], [`Mode`] |
//! | what makes an action unique, and what can be a key | [`Identity`], [`KeyPart`] |
//! | why a duplicate was refused, and what to do next | [`Rejected`] |
//! | usage metering: a re-sent batch deduplicates | [`meter`] |
//! | message consumers: a whole batch claimed in one statement | [`batch`] |
//! | the schema, your own migrations, the partitioned layout | [`schema`] |
//! | testing your guarded functions | `testing`, `race_test!` (feature `testing`) |
//! | the `Idempotency-Key` header for axum | `axum` (feature `axum`) |
//! | the `Idempotency-Key` protocol for a whole HTTP or gRPC service, one layer | `http::IdempotencyLayer` (feature `tower`) |
//! | answering duplicates of settled outcomes with no round trip | `cache` (feature `cache`) |
//! | counters, histograms and gauges for a dashboard | `metrics` (feature `metrics`) |
//!
//! # The insert is the lock
//!
//! Each guarded invocation inserts a claim row into `idem_records` at an
//! address derived from its [`Identity`]: `claim_` followed by the first 24
//! hex digits of the sha1 of the identity's canonical encoding (its action
//! and key parts). A unique index that PostgreSQL enforces lets exactly one
//! concurrent insert win; the others are refused and their bodies do not
//! run. No lock is held across the body, and the happy path is one
//! statement for the claim and one for the outcome.
//!
//! | step | when | effect in `idem_records` | a retry then |
//! |---|---|---|---|
//! | claim | before the body | a `pending` row is inserted, autocommitted; on conflict nothing is written | refused: [`InFlight`](Rejected::InFlight) |
//! | settle | the body returned `Ok` | the row becomes `success`, forever | refused: [`AlreadyDone`](Rejected::AlreadyDone) (or, with `replay`, handed the value) |
//! | release | the body returned `Err` | the row is deleted | runs |
//! | unknown | the settle failed, the body panicked, or its future was dropped | the row stays `pending` | refused: `InFlight` (fail closed) |
//! | store down | the claim cannot be written or read (an outage) | nothing | refused: [`Unavailable`](Rejected::Unavailable); the body never runs |
//! | store refuses | a permission, a missing table, a value it cannot hold: an error of the request | nothing | refused: [`StoreRefused`](Rejected::StoreRefused), saying what to fix; never retryable, never fails open |
//!
//! - The row a duplicate finds tells `InFlight` from `AlreadyDone`, and its
//!   stored canonical identity is re-checked: a digest collision is refused
//!   ([`Rejected::Collision`]), never merged.
//! - **A success is never lost.** If recording it fails because the store
//!   fails, the caller still gets the body's `Ok` value, the row stays
//!   `pending` (so no retry runs), and a tracing error says so. A settle
//!   never fails because of the value it carries. A holder whose claim was
//!   taken over or released while its body ran still records its success in
//!   the slot (unless it is settled already), and its caller is told
//!   [`Rejected::LeaseLost`] or [`Rejected::ClaimLost`] instead of the value:
//!   another invocation may have run the action too, so check the side
//!   effect. Whoever did not write the outcome the slot records (a
//!   reconciler or an operator resolved the claim meanwhile, an earlier
//!   holder's late success settled it, its lease ran out into doubt) is
//!   told [`Rejected::NotRecorded`], never its own `Ok`: holder and
//!   duplicates tell one story.
//! - A claim whose insert committed just before its connection died is
//!   refused `Unavailable` (the body does not run), and its row stays
//!   `pending`: without a lease it refuses every retry until an operator
//!   releases it with the `idem` command.
//! - Every decision is a `tracing` event on target `idem` ([`GateEvent`]
//!   names them): claim won, refused (with the reason), settled, released,
//!   ungated, store unavailable, store refused, a lease taken over, a success
//!   kept after its claim was lost.
//!
//! Uniqueness lives in two partial unique indexes split on
//! `namespace IS NULL`, because a unique index over a nullable column
//! enforces nothing for the rows where it is NULL. [`Gate::connect`] sets the
//! schema up (idempotently, under an advisory lock, in its own
//! `idem_schema_version` table, never sqlx's `_sqlx_migrations`) and refuses
//! to start, naming what is missing, when either index or its predicate is
//! not there. Running your own migrations? Apply [`schema::SCHEMA_SQL`] and
//! use [`Gate::connect_without_setup`].
//!
//! # Modes
//!
//! The plain gate is the default. Each mode is one more option of
//! [`#[idempotent]`](macro@idempotent) (or a [`Mode`] for [`Gate::run_with`]),
//! opt-in, and they combine:
//!
//! | option | what it adds |
//! |---|---|
//! | [`replay`](macro@idempotent#replay) | a duplicate of a settled action gets the stored `Ok` value back |
//! | [`fingerprint`](macro@idempotent#fingerprint) | the same key with another payload is refused [`Rejected::KeyReused`] |
//! | [`lease`](macro@idempotent#lease) | a pending claim whose holder crashed expires and is taken over, fenced |
//! | [`wait`](macro@idempotent#wait) | a duplicate in flight waits for the outcome instead of being refused |
//! | [`tx`](macro@idempotent#tx) | the claim and the settle commit with your transaction's writes |
//! | [`outcome_commit = "async"`](macro@idempotent#outcome_commit) | settle and release do not wait for the disk |
//! | [`on_unavailable = "run"`](macro@idempotent#on_unavailable) | fail open on an outage, for harmless duplicates |
//! | [`disposition`](macro@idempotent#disposition) | each `Err` released, kept as a definite failure ([`Rejected::AlreadyFailed`]), or held in doubt ([`Rejected::InDoubt`]), as your [`Disposition`] function says |
//! | [`on_expiry = "in_doubt"`](macro@idempotent#on_expiry) | a claim whose lease ran out is held in doubt, never run again blindly |
//!
//! # Batches, for message consumers
//!
//! A consumer that reads messages in batches (Kafka, SQS, NATS: the inbox
//! pattern) hands the whole batch to [`Gate::run_batch`]: one statement
//! claims every identity, the bodies of the won ones run (as many at a time
//! as [`Batch::concurrency`](batch::Batch::concurrency) says), and one
//! statement per kind of outcome records them. Each message gets what
//! [`Gate::run`] would have given it; overlapping batches from many
//! consumers run each identity once, and cannot deadlock:
//!
//! ```
//! use idem::batch::Batch;
//! use idem::{Gate, Identity, Rejected};
//!
//! struct Message {
//!     id: u64,
//!     cents: i64,
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let url = idem::testing::database_url();
//! # let pool = idem::sqlx::PgPool::connect(&url).await?;
//! # let gate = Gate::connect(pool).await?.account(idem::testing::unique_name("docs"));
//! let messages: Vec<Message> = (1..=3).map(|id| Message { id, cents: 100 * id as i64 }).collect();
//! let batch = || -> Batch<&Message> {
//!     messages.iter().map(|m| (m, Identity::new("credit").part(m.id))).collect()
//! };
//!
//! let credited = gate
//!     .run_batch(batch().concurrency(8), |m| async move { Ok::<_, Rejected>(m.cents) })
//!     .await;
//! assert!(credited.iter().all(Result::is_ok));
//!
//! // The broker redelivers the batch: nothing runs twice.
//! let redelivered = gate
//!     .run_batch(batch(), |m| async move { Ok::<_, Rejected>(m.cents) })
//!     .await;
//! assert!(redelivered.iter().all(|r| matches!(r, Err(Rejected::AlreadyDone))));
//! # Ok(()) }
//! ```
//!
//! # A local cache of settled outcomes
//!
//! A settled success (and a kept failure) never changes while its row
//! exists, so a process that has seen one can refuse (or, with `replay`,
//! answer) the next duplicate itself, with no round trip. With the `cache`
//! feature, give a gate an `idem::cache::OutcomeCache`, bounded by entries
//! and bytes and with a time to live; every scoped copy of the gate shares
//! it, and its entries never answer across accounts, namespaces or
//! fingerprints:
//!
//! ```no_run
//! # #[cfg(feature = "cache")]
//! # async fn demo(pool: idem::sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use idem::{Gate, Identity, Rejected, cache::OutcomeCache};
//!
//! let cache = OutcomeCache::builder()
//!     .max_entries(100_000)
//!     .max_bytes(64 << 20)
//!     .ttl(Duration::from_secs(300))
//!     .build();
//! let gate = Gate::connect(pool).await?.with_cache(cache);
//! let id = Identity::new("charge").part("ord_1001");
//!
//! let _: Result<(), Rejected> = gate.run(&id, async { Ok(()) }).await;
//! // Refused from the cache, without a statement.
//! let again: Result<(), Rejected> = gate.run(&id, async { Ok(()) }).await;
//! assert!(matches!(again, Err(Rejected::AlreadyDone)));
//! # Ok(()) }
//! ```
//!
//! It holds only final facts (never a claim pending, in flight or in
//! doubt) and never learns from a settle inside your transaction. A row
//! pruned (`idem prune`) or deleted by hand is still answered from the
//! cache for up to its time to live: the `cache` module says what that
//! means, and `Gate::without_cache` opts an action out.
//!
//! # Metrics
//!
//! With the `metrics` feature, every gate counts what it decides through
//! the [`metrics`](https://docs.rs/metrics) facade, so any exporter shows
//! it: `idem_outcomes_total` by action and outcome (won, taken over,
//! replayed, each refusal, settled, released, kept, held in doubt, stale,
//! unrecorded, reconciled), histograms of claim, body and settle durations,
//! and, from one periodic query the application opts into, gauges of the
//! claims that are stuck (pending too long, in doubt, the oldest ages).
//! Install a recorder once per process; `idem::metrics` lists every metric
//! and label, and says what they cost:
//!
//! ```
//! # #[cfg(feature = "metrics")]
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use idem::metrics::{Gauges, MetricsOptions};
//! use idem::{Gate, Identity, Rejected};
//!
//! // Any recorder of the `metrics` ecosystem; here, Prometheus' text format.
//! let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?;
//! idem::metrics::describe();
//!
//! # let url = idem::testing::database_url();
//! # let pool = idem::sqlx::PgPool::connect(&url).await?;
//! let gate = Gate::connect(pool.clone()).await?.account(idem::testing::unique_name("docs"));
//! // Labels: action and outcome; the account too, only when asked for.
//! let gate = gate.with_metrics(MetricsOptions::new().label_account(false));
//! let id = Identity::new("charge").part("ord_1001");
//! for _ in 0..3 {
//!     let _: Result<(), Rejected> = gate.run(&id, async { Ok(()) }).await;
//! }
//! // The gauges: one query per sample (`Gauges::run` samples on an interval).
//! Gauges::new(pool, Duration::from_secs(300)).sample_once().await?;
//!
//! let scraped = prometheus.render(); // what GET /metrics would serve
//! assert!(scraped.contains(r#"idem_outcomes_total{action="charge",outcome="won"} 1"#));
//! assert!(scraped.contains(r#"idem_outcomes_total{action="charge",outcome="settled"} 1"#));
//! assert!(scraped.contains(r#"idem_outcomes_total{action="charge",outcome="already_done"} 2"#));
//! assert!(scraped.contains("idem_claims_in_doubt"));
//! # Ok(()) }
//! # #[cfg(not(feature = "metrics"))]
//! # fn main() {}
//! ```
//!
//! The payments example (`examples/payments/`) serves them on
//! `GET /metrics`; the operations guide says what to alert on.
//!
//! # Testing your guarded functions
//!
//! With the `testing` feature (in your dev-dependencies, with
//! `features = ["testing"]`), `testing::race` fires invocations at the same
//! instant and reports what the gate decided; `race_test!` turns that into
//! a whole test:
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
//!         let gate = idem::testing::gate().await; // isolated account, real PostgreSQL
//!         let order = Order { id: 7 };
//!     },
//!     race(16): ship(&gate, &order),
//! }
//! ```
//!
//! `assert_exactly_once` names the cause when it fails: more than one winner
//! means the unique constraint is missing or contains a nullable column; no
//! winner means the schema was never set up or the gate points elsewhere.
//!
//! # Features
//!
//! | feature | what it adds |
//! |---|---|
//! | `uuid` | `uuid::Uuid` key parts |
//! | `testing` | `idem::testing` and `idem::race_test!`: a real database, isolated gates, races fired at one instant; pulls tokio's multi-threaded runtime, so enable it in dev-dependencies only |
//! | `axum` | `idem::axum` (also `idem::http`): the `Idempotency-Key` header, `Rejected` as an HTTP response, responses replayed byte for byte; pulls axum's extractor traits, no server |
//! | `tower` | `idem::http::IdempotencyLayer`: the same protocol for any tower service (axum routers, hyper services, tonic gRPC servers), one layer; pulls `tower-layer`, `tower-service`, `http-body`, `http-body-util` and `bytes`, no server. With axum routers enable `axum` too: the layer reads axum's route templates, and without them guards only what `.route(..)` names |
//! | `cache` | `idem::cache`: a bounded, expiring local cache of settled outcomes, so a duplicate this process has seen settled is answered with no round trip; pulls `quick_cache` |
//! | `metrics` | `idem::metrics`: outcomes counted by action, claim, body and settle durations, and gauges of stuck claims, through the `metrics` facade (any exporter); pulls `metrics` |
//!
//! The default feature set pulls no test-only dependency.
//!
//! # Beyond the API
//!
//! The repository's `docs/` holds what is not API: `operations.md` (set-up,
//! privileges and row-level security, the `idem` command, partitioning,
//! monitoring and metrics, stuck claims, outages), `reliability.md` (the faults tested
//! and the history checker), `design-decisions.md`, `distributed-engines.md`
//! (Citus, CockroachDB, YugabyteDB) and `development.md`. `BENCHMARKS.md`
//! holds the load generator's report.

#![cfg_attr(docsrs, feature(doc_cfg))]
// Library code never unwraps: bad input gets an error that says what to do.
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

#[doc = include_str!("idempotent.md")]
pub use idem_macros::idempotent;
pub use idem_runtime::{
    ADDRESS_DIGEST_HEX, ADDRESS_PREFIX, Claim, Detached, Disposed, Disposition, Error, Fingerprint,
    Gate, GateEvent, Identity, KeyPart, Mode, NotCanonical, OnExpiry, OnUnavailable, OutcomeCommit,
    PartValue, PartWriter, PartWritten, Rejected, SchemaProblem, SchemaProblems, Shutdown, batch,
    detach, meter, operations, reconcile, schema, sqlx,
};

/// Test helpers (feature `testing`): a real database, isolated gates, and
/// invocations fired at the same instant with a report of what the gate
/// decided. See also [`race_test!`].
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub use idem_runtime::testing;

#[cfg(feature = "cache")]
#[cfg_attr(docsrs, doc(cfg(feature = "cache")))]
pub use idem_runtime::cache;

#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub use idem_runtime::metrics;

#[doc = include_str!("axum.md")]
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub use idem_runtime::http as axum;

#[doc = include_str!("http.md")]
#[cfg(any(feature = "axum", feature = "tower"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "axum", feature = "tower"))))]
pub use idem_runtime::http;

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
