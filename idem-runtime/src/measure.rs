//! What the gate tells the `metrics` facade: one outcome per decision, and
//! how long claims, bodies and recordings took.
//!
//! [`Decision`](crate::decision::Decision) calls these, with the label it
//! derives from the same decision it tells a race harness
//! ([`observe`](crate::observe)). With the feature `metrics`
//! they count through the facade, labelled as the gate's
//! [`MetricsOptions`](crate::metrics::MetricsOptions) say (what the metrics
//! are: [`crate::metrics`]); without it every function here is empty and a
//! [`Stopwatch`] holds nothing, so a build without metrics pays nothing.

#[cfg(feature = "metrics")]
use std::time::Instant;

use crate::error::Rejected;
use crate::identity::Identity;
use crate::scoped_pool::ScopedPool;

/// What became of one invocation, or of one claim: the value of the
/// `outcome` label of `idem_outcomes_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OutcomeLabel {
    // What the claim decided: one per invocation.
    /// The claim was won: the body runs.
    Won,
    /// The claim was won by taking over one whose lease ran out.
    TakenOver,
    /// A duplicate of a settled action got its stored value back.
    Replayed,
    /// A key part was absent: the body runs unguarded.
    Ungated,
    /// The store was down and the mode fails open: the body runs unguarded.
    FailedOpen,
    /// The claim was refused: the label is [`Rejected::reason`].
    Refused(&'static str),
    // What became of a won claim: one per recording.
    /// The success was recorded.
    Settled,
    /// The failure was recorded by deleting the claim.
    Released,
    /// A definite failure was kept.
    KeptFailure,
    /// The slot was put in doubt: by its body, or by a duplicate that found
    /// its lease run out under `on_expiry = "in_doubt"`.
    HeldInDoubt,
    /// The claim was no longer this holder's when its outcome was recorded.
    StaleSettle,
    /// The store failed to record the outcome: the claim stays pending.
    Unrecorded,
    /// The outcome was not recorded: the slot already recorded one somebody
    /// else wrote (a resolution, an expiry into doubt, an earlier holder's
    /// late success), which it keeps.
    NotRecorded,
    // What a reconciler did.
    /// A reconciler's probe resolved a claim in doubt (or a stale pending
    /// one).
    Reconciled,
}

impl OutcomeLabel {
    /// The claim was refused as `rejected` says.
    pub(crate) fn refused(rejected: &Rejected) -> OutcomeLabel {
        OutcomeLabel::Refused(rejected.reason())
    }

    /// Outcome a won claim's outcome failed as `rejected` says.
    pub(crate) fn unrecorded(rejected: &Rejected) -> OutcomeLabel {
        match rejected {
            Rejected::LeaseLost { .. } | Rejected::ClaimLost { .. } => OutcomeLabel::StaleSettle,
            Rejected::NotRecorded { .. } => OutcomeLabel::NotRecorded,
            _ => OutcomeLabel::Unrecorded,
        }
    }

    /// The label's value.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn label(self) -> &'static str {
        match self {
            OutcomeLabel::Won => "won",
            OutcomeLabel::TakenOver => "taken_over",
            OutcomeLabel::Replayed => "replayed",
            OutcomeLabel::Ungated => "ungated",
            OutcomeLabel::FailedOpen => "failed_open",
            OutcomeLabel::Refused(reason) => reason,
            OutcomeLabel::Settled => "settled",
            OutcomeLabel::Released => "released",
            OutcomeLabel::KeptFailure => "kept_failure",
            OutcomeLabel::HeldInDoubt => "held_in_doubt",
            OutcomeLabel::StaleSettle => "stale_settle",
            OutcomeLabel::Unrecorded => "unrecorded",
            OutcomeLabel::NotRecorded => "not_recorded",
            OutcomeLabel::Reconciled => "reconciled",
        }
    }
}

/// What became of one step of a guarded body ([`step`](crate::step())), as
/// `idem_steps_total` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StepLabel {
    /// It ran and its value was recorded.
    Recorded,
    /// A recorded value was handed back: it did not run.
    Replayed,
    /// It ran again, repeatable, over the marker of a run cut off inside
    /// it while it was not.
    Repeated,
    /// It returned `Err`: nothing recorded, a later run runs it again.
    Failed,
    /// Its holder had been cut off inside it: refused, not run.
    InDoubt,
    /// It ran, and its value could not be recorded.
    Unrecorded,
}

impl StepLabel {
    /// The label's value.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn label(self) -> &'static str {
        match self {
            StepLabel::Recorded => "recorded",
            StepLabel::Replayed => "replayed",
            StepLabel::Repeated => "repeated",
            StepLabel::Failed => "failed",
            StepLabel::InDoubt => "in_doubt",
            StepLabel::Unrecorded => "unrecorded",
        }
    }
}

/// A step of a body of `identity` in `slots` came to `outcome`.
#[inline]
pub(crate) fn stepped(slots: &ScopedPool, identity: &Identity, outcome: StepLabel) {
    #[cfg(feature = "metrics")]
    facade::stepped(slots, identity, outcome);
    #[cfg(not(feature = "metrics"))]
    let _ = (slots, identity, outcome);
}

/// When something started, for a duration histogram; nothing without the
/// feature.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stopwatch {
    #[cfg(feature = "metrics")]
    started: Instant,
}

impl Stopwatch {
    /// Starts now.
    #[inline]
    pub(crate) fn start() -> Stopwatch {
        Stopwatch {
            #[cfg(feature = "metrics")]
            started: Instant::now(),
        }
    }
}

/// A claim of `identity` in `slots` came to `outcome`, `claiming` after it
/// began.
#[inline]
pub(crate) fn claimed(
    slots: &ScopedPool,
    identity: &Identity,
    outcome: OutcomeLabel,
    claiming: &Stopwatch,
) {
    #[cfg(feature = "metrics")]
    facade::claimed(slots, identity, outcome, claiming.started.elapsed());
    #[cfg(not(feature = "metrics"))]
    let _ = (slots, identity, outcome, claiming);
}

/// The outcome of a won claim was recorded as `outcome`: its body ran from
/// `won` until `recording` began, and the recording took until now.
#[inline]
pub(crate) fn recorded(
    slots: &ScopedPool,
    identity: &Identity,
    outcome: OutcomeLabel,
    won: &Stopwatch,
    recording: &Stopwatch,
) {
    #[cfg(feature = "metrics")]
    facade::recorded(
        slots,
        identity,
        outcome,
        recording.started.saturating_duration_since(won.started),
        recording.started.elapsed(),
    );
    #[cfg(not(feature = "metrics"))]
    let _ = (slots, identity, outcome, won, recording);
}

/// Something happened to the slot of `identity` in `slots` outside its
/// holder's claim and recording (a duplicate put it in doubt).
#[inline]
pub(crate) fn happened(slots: &ScopedPool, identity: &Identity, outcome: OutcomeLabel) {
    #[cfg(feature = "metrics")]
    facade::happened(slots, identity, outcome);
    #[cfg(not(feature = "metrics"))]
    let _ = (slots, identity, outcome);
}

/// A reconciler resolved a claim of `action` (in `account`, labelled only
/// when `label_account`).
#[inline]
pub(crate) fn reconciled(action: &str, account: &str, label_account: bool) {
    let outcome = OutcomeLabel::Reconciled;
    #[cfg(feature = "metrics")]
    facade::resolved(action, account, label_account, outcome);
    #[cfg(not(feature = "metrics"))]
    let _ = (action, account, label_account, outcome);
}

/// The calls into the `metrics` facade.
#[cfg(feature = "metrics")]
mod facade {
    use std::sync::Arc;
    use std::time::Duration;

    use ::metrics::{Label, SharedString, counter, histogram};

    use super::{OutcomeLabel, StepLabel};
    use crate::identity::Identity;
    use crate::metrics::names;
    use crate::scoped_pool::ScopedPool;

    /// The labels every metric of a gate carries: the action, and the
    /// account when the gate was asked to label it; room for one more.
    /// Both are shared strings, so a label costs a reference count, not a
    /// copy; the `Vec` is what the facade's key is made of, one per metric
    /// updated.
    fn labels(slots: &ScopedPool, identity: &Identity) -> Vec<Label> {
        let account = slots
            .metrics()
            .labels_account()
            .then(|| SharedString::from(Arc::clone(slots.shared_account())));
        labels_of(
            SharedString::from(Arc::clone(identity.shared_action())),
            account,
        )
    }

    fn labels_of(action: SharedString, account: Option<SharedString>) -> Vec<Label> {
        let mut labels = Vec::with_capacity(3);
        labels.push(Label::new(names::ACTION, action));
        if let Some(account) = account {
            labels.push(Label::new(names::ACCOUNT, account));
        }
        labels
    }

    fn with_outcome(mut labels: Vec<Label>, outcome: OutcomeLabel) -> Vec<Label> {
        labels.push(Label::new(names::OUTCOME, outcome.label()));
        labels
    }

    pub(super) fn claimed(
        slots: &ScopedPool,
        identity: &Identity,
        outcome: OutcomeLabel,
        took: Duration,
    ) {
        let labels = labels(slots, identity);
        histogram!(names::CLAIM_DURATION_SECONDS, labels.clone()).record(took);
        counter!(names::OUTCOMES_TOTAL, with_outcome(labels, outcome)).increment(1);
    }

    pub(super) fn recorded(
        slots: &ScopedPool,
        identity: &Identity,
        outcome: OutcomeLabel,
        body: Duration,
        recording: Duration,
    ) {
        let labels = labels(slots, identity);
        histogram!(names::BODY_DURATION_SECONDS, labels.clone()).record(body);
        histogram!(names::SETTLE_DURATION_SECONDS, labels.clone()).record(recording);
        counter!(names::OUTCOMES_TOTAL, with_outcome(labels, outcome)).increment(1);
    }

    pub(super) fn happened(slots: &ScopedPool, identity: &Identity, outcome: OutcomeLabel) {
        counter!(
            names::OUTCOMES_TOTAL,
            with_outcome(labels(slots, identity), outcome)
        )
        .increment(1);
    }

    pub(super) fn stepped(slots: &ScopedPool, identity: &Identity, outcome: StepLabel) {
        let mut labels = labels(slots, identity);
        labels.push(Label::new(names::OUTCOME, outcome.label()));
        counter!(names::STEPS_TOTAL, labels).increment(1);
    }

    /// A reconciler's resolution is rare (a probe and a round trip each):
    /// its labels are copied.
    pub(super) fn resolved(
        action: &str,
        account: &str,
        label_account: bool,
        outcome: OutcomeLabel,
    ) {
        let action = SharedString::from(action.to_owned());
        let account = label_account.then(|| SharedString::from(account.to_owned()));
        counter!(
            names::OUTCOMES_TOTAL,
            with_outcome(labels_of(action, account), outcome)
        )
        .increment(1);
    }
}
