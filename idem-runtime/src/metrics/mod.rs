//! Outcome metrics through the [`metrics`](https://docs.rs/metrics) facade,
//! so that any exporter (Prometheus, StatsD, OpenTelemetry...) shows them.
//!
//! With the feature `metrics`, every gate counts what it decides and times
//! its claims, bodies and recordings, through whatever recorder the
//! application installed (with none, each call is a few loads and does
//! nothing). The tracing events on target `idem` say the same, one by one;
//! these are their sums, for a dashboard and alerts.
//!
//! ```no_run
//! # async fn demo(pool: idem_runtime::sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use idem_runtime::metrics::{Gauges, MetricsOptions};
//! use idem_runtime::{Gate, Identity, Rejected};
//!
//! // Any recorder of the `metrics` ecosystem, installed once per process,
//! // e.g. metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?
//! idem_runtime::metrics::describe(); // names' help texts and units, once the recorder is in
//!
//! // Every gate counts; this one also labels each series with its account.
//! let gate = Gate::connect(pool.clone())
//!     .await?
//!     .with_metrics(MetricsOptions::new().label_account(true));
//! let id = Identity::new("charge").part("ord_1001");
//! let _: Result<(), Rejected> = gate.run(&id, async { Ok(()) }).await;
//! // idem_outcomes_total{action="charge",account="default",outcome="won"} 1
//! // idem_outcomes_total{action="charge",account="default",outcome="settled"} 1
//!
//! // The gauges, from one query a minute, beside the service until shutdown.
//! let gauges = Gauges::new(pool, Duration::from_secs(300)).interval(Duration::from_secs(60));
//! let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
//! let task = tokio::spawn(async move { gauges.run(async { stopped.await.ok(); }).await });
//! // ... on shutdown:
//! let _ = stop.send(());
//! task.await.ok();
//! # Ok(()) }
//! ```
//!
//! # The metrics
//!
//! | name | kind | labels | what it is |
//! |---|---|---|---|
//! | `idem_outcomes_total` | counter | `action`, `outcome`, (`account`) | decisions, by outcome (below) |
//! | `idem_claim_duration_seconds` | histogram | `action`, (`account`) | from the start of a claim to its decision, a `wait` included (for a batch, the batch's claim, per item) |
//! | `idem_body_duration_seconds` | histogram | `action`, (`account`) | from a won claim (for a batch, its body's turn to run) until its outcome is recorded |
//! | `idem_settle_duration_seconds` | histogram | `action`, (`account`) | recording a won claim's outcome: settle, release, keep or hold in doubt |
//! | `idem_stale_pending_claims` | gauge | (`account`) | pending claims older than the age [`Gauges`] was given |
//! | `idem_claims_in_doubt` | gauge | (`account`) | claims in doubt, waiting for a reconciler or an operator |
//! | `idem_oldest_pending_claim_age_seconds` | gauge | (`account`) | the age of the oldest pending claim; 0 when there is none |
//! | `idem_oldest_in_doubt_claim_age_seconds` | gauge | (`account`) | how long the oldest claim in doubt has been in doubt (since it went in doubt); 0 when there is none |
//!
//! Every label is bounded: `action` is the first argument of
//! [`Identity::new`](crate::Identity::new) (the function's name, under
//! `#[idempotent]`), never a key part; `outcome` is one of the values
//! below; `account` is there only when asked for
//! ([`MetricsOptions::label_account`], [`Gauges::account`]), as tenants
//! may be many.
//!
//! ## The outcomes
//!
//! Each invocation counts **one** claim outcome; each won claim whose body
//! returned counts **one** recording outcome after it. A dropped or
//! panicked body counts none: its claim stays pending, which
//! `idem_stale_pending_claims` shows.
//!
//! | `outcome` | when | the body |
//! |---|---|---|
//! | `won` | the claim was won | runs |
//! | `taken_over` | the claim was won by taking over one whose lease ran out | runs; the previous holder may still be running |
//! | `replayed` | a duplicate of a settled action got its stored value | does not run |
//! | `ungated` | a key part was `None`: there is no slot | runs unguarded |
//! | `failed_open` | the store was down, and `on_unavailable = "run"` | runs unguarded |
//! | `in_flight`, `already_done`, `in_doubt`, `already_failed`, `superseded`, `key_reused`, `collision`, `unavailable`, `store_refused`, `invalid_option`, `invalid_scope` | the claim was refused: [`Rejected::reason`](crate::Rejected::reason) | does not run |
//! | `settled` | the success was recorded | ran |
//! | `released` | the failure was recorded: the claim deleted, a retry runs | ran |
//! | `kept_failure` | a definite failure was kept (`Disposition::Keep`) | ran |
//! | `held_in_doubt` | the slot was put in doubt: by its body (`Disposition::InDoubt`), or by a duplicate that found its lease run out under `on_expiry = "in_doubt"` | ran, or was presumed gone |
//! | `stale_settle` | the claim was no longer this holder's when its outcome was recorded (`LeaseLost`, `ClaimLost`; a success is still kept) | ran |
//! | `unrecorded` | the store failed to record the outcome: the claim stays pending | ran |
//! | `not_recorded` | the outcome was not recorded: the slot already records one somebody else wrote (a reconciler or an operator resolved it, its lease ran out into doubt, an earlier holder's late success settled it), which stands (`NotRecorded`) | ran |
//! | `reconciled` | a [`Reconciler`](crate::reconcile::Reconciler)'s probe resolved a claim | |
//!
//! Steps inside a body ([`step`](crate::step())) are counted apart, in
//! `idem_steps_total` (by `action` and `outcome`; a step's name is not a
//! label, since names may be made per item):
//!
//! | `outcome` | when | the step |
//! |---|---|---|
//! | `recorded` | it ran, and its value was recorded | ran |
//! | `replayed` | an earlier run recorded it: its value was handed back | does not run |
//! | `repeated` | it is repeatable, and an earlier run left its marker (cut off inside it while the step was not declared repeatable) | runs again |
//! | `failed` | it returned `Err`: nothing recorded, a later run runs it again | ran |
//! | `in_doubt` | its holder was cut off inside it: refused (`StepInDoubt`) | does not run |
//! | `unrecorded` | it ran, and the store failed to record its value: a later run finds it in doubt (or, repeatable, runs it again) | ran |
//!
//! A repeatable step writes no marker, so one cut off leaves no trace: the
//! run that runs it again counts it `recorded`.
//! So `won + taken_over + ungated + failed_open` is how many bodies ran,
//! and the refusals are how many duplicates were stopped. What to alert
//! on is in the operations guide: `idem_claims_in_doubt > 0`, any
//! `idem_stale_pending_claims`, any `unavailable` or `failed_open`.
//!
//! # What it costs
//!
//! Without the feature, nothing: the calls are compiled out. With it, a
//! claim's decision updates one counter and one histogram in the recorder,
//! a recording one counter and two histograms; the labels share the
//! identity's action and the gate's account (a reference count, no copy of
//! either string), and the only allocations are the label lists the
//! facade's keys are made of, one per metric updated. Nothing waits on the
//! recorder beyond its own update. Measured (`cargo bench -p idem-bench
//! --features metrics --bench metrics`): a duplicate refused from the
//! outcome cache, the cheapest decision, takes 0.6 µs with no recorder and
//! 1.2 µs with Prometheus' (its registry's lookups); beside a decision that
//! goes to the store (a round trip, ~100 µs) it vanishes. The gauges cost
//! one query per [`Gauges::interval`] (see [`Gauges`]).
//!
//! Inside the caller's transaction (`tx`, [`Guard::tx`](crate::Guard::tx)),
//! an outcome is counted when its statement succeeds, as the tracing event
//! says it: should the transaction roll back afterwards, the count stays.

mod gauges;

pub use gauges::{GaugeSample, Gauges};

/// The metrics' names and labels, for queries, dashboards and tests.
pub mod names {
    /// Counter: decisions, by `action` and `outcome` (and `account`, when
    /// asked).
    pub const OUTCOMES_TOTAL: &str = "idem_outcomes_total";
    /// Counter: steps of guarded bodies ([`step`](crate::step())), by
    /// `action` and `outcome` (and `account`, when asked): `recorded`,
    /// `replayed`, `repeated`, `failed`, `in_doubt`, `unrecorded`.
    pub const STEPS_TOTAL: &str = "idem_steps_total";
    /// Histogram, seconds: from the start of a claim to its decision.
    pub const CLAIM_DURATION_SECONDS: &str = "idem_claim_duration_seconds";
    /// Histogram, seconds: from a won claim until its outcome is recorded.
    pub const BODY_DURATION_SECONDS: &str = "idem_body_duration_seconds";
    /// Histogram, seconds: recording a won claim's outcome.
    pub const SETTLE_DURATION_SECONDS: &str = "idem_settle_duration_seconds";
    /// Gauge: pending claims older than the age [`Gauges`](super::Gauges)
    /// was given.
    pub const STALE_PENDING_CLAIMS: &str = "idem_stale_pending_claims";
    /// Gauge: claims in doubt.
    pub const CLAIMS_IN_DOUBT: &str = "idem_claims_in_doubt";
    /// Gauge, seconds: the age of the oldest pending claim (0: none).
    pub const OLDEST_PENDING_CLAIM_AGE_SECONDS: &str = "idem_oldest_pending_claim_age_seconds";
    /// Gauge, seconds: the age of the oldest claim in doubt (0: none).
    pub const OLDEST_IN_DOUBT_CLAIM_AGE_SECONDS: &str = "idem_oldest_in_doubt_claim_age_seconds";

    /// Label: the action's name.
    pub const ACTION: &str = "action";
    /// Label: what became of the invocation or the claim.
    pub const OUTCOME: &str = "outcome";
    /// Label: the account (tenant), only when asked for.
    pub const ACCOUNT: &str = "account";
}

/// How a gate's metrics are labelled: set with
/// [`Gate::with_metrics`](crate::Gate::with_metrics), per gate (its
/// [`account`](crate::Gate::account) and
/// [`namespace`](crate::Gate::namespace) copies keep it).
///
/// Every gate counts, with the labels `action` and `outcome`; these
/// options add to them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MetricsOptions {
    label_account: bool,
}

impl MetricsOptions {
    /// The default: labels `action` and `outcome` only.
    pub const fn new() -> MetricsOptions {
        MetricsOptions {
            label_account: false,
        }
    }

    /// Whether every series also carries the label `account` (default
    /// `false`). Each account then has series of its own: turn it on only
    /// when the accounts are few (a handful of tenants, not one per user).
    #[must_use]
    pub const fn label_account(mut self, label: bool) -> MetricsOptions {
        self.label_account = label;
        self
    }

    /// Whether series carry the label `account`.
    pub const fn labels_account(&self) -> bool {
        self.label_account
    }
}

/// Describes every metric (its help text and unit) to the recorder
/// installed: call it once, after installing it. Without it the metrics
/// are recorded all the same, only undescribed.
pub fn describe() {
    use ::metrics::{Unit, describe_counter, describe_gauge, describe_histogram};

    describe_counter!(
        names::OUTCOMES_TOTAL,
        Unit::Count,
        "Decisions of idem's gates, by action and outcome: one claim outcome per invocation \
         (won, taken_over, replayed, ungated, failed_open, or the refusal's reason), one \
         recording outcome per won claim (settled, released, kept_failure, held_in_doubt, \
         stale_settle, unrecorded, not_recorded), and reconciled."
    );
    describe_histogram!(
        names::CLAIM_DURATION_SECONDS,
        Unit::Seconds,
        "From the start of a claim to its decision."
    );
    describe_histogram!(
        names::BODY_DURATION_SECONDS,
        Unit::Seconds,
        "From a won claim until its outcome is recorded: the guarded body."
    );
    describe_histogram!(
        names::SETTLE_DURATION_SECONDS,
        Unit::Seconds,
        "Outcome a won claim's outcome: settle, release, keep or hold in doubt."
    );
    describe_gauge!(
        names::STALE_PENDING_CLAIMS,
        Unit::Count,
        "Pending claims older than the age the gauges were given: crashed holders, or bodies \
         running longer than expected."
    );
    describe_gauge!(
        names::CLAIMS_IN_DOUBT,
        Unit::Count,
        "Claims in doubt: refused until a reconciler or an operator resolves them."
    );
    describe_gauge!(
        names::OLDEST_PENDING_CLAIM_AGE_SECONDS,
        Unit::Seconds,
        "The age of the oldest pending claim; 0 when there is none."
    );
    describe_gauge!(
        names::OLDEST_IN_DOUBT_CLAIM_AGE_SECONDS,
        Unit::Seconds,
        "The age of the oldest claim in doubt; 0 when there is none."
    );
}
