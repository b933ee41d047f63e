//! One decision of the gate about one slot, and where it is reported: the
//! race harness's [`GateEvent`]s and the metrics' `outcome` label are both
//! derived here from the one [`Decision`] a site makes, so the two cannot
//! disagree; the site's tracing event is chosen by matching the same value.

use crate::error::Rejected;
use crate::identity::Identity;
use crate::measure::{self, OutcomeLabel, Stopwatch};
use crate::mode::Disposition;
use crate::observe::{self, GateEvent};
use crate::outcome::Outcome;
use crate::scoped_pool::ScopedPool;

/// What the gate decided, or what became of a won claim.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Decision<'r> {
    // What a claim came to: one per invocation.
    /// The claim was won (by taking over an expired one, `took_over`).
    Won { took_over: bool },
    /// A duplicate of a settled action gets its stored value.
    Replayed,
    /// A key part is absent: the body runs unguarded.
    Ungated,
    /// The store is down and the mode fails open: the body runs unguarded.
    FailedOpen,
    /// The claim was refused.
    Refused(&'r Rejected),
    // What became of a slot.
    /// A duplicate found the holder's lease run out under
    /// `on_expiry = "in_doubt"` and held the slot in doubt.
    ExpiredIntoDoubt,
    /// The holder's outcome was recorded, as this says.
    Recorded(Outcome),
    /// The holder's outcome was not recorded, as this refusal says.
    Unrecorded(&'r Rejected),
}

impl Decision<'_> {
    /// The value of the metrics' `outcome` label.
    fn label(self) -> OutcomeLabel {
        match self {
            Decision::Won { took_over: false } => OutcomeLabel::Won,
            Decision::Won { took_over: true } => OutcomeLabel::TakenOver,
            Decision::Replayed => OutcomeLabel::Replayed,
            Decision::Ungated => OutcomeLabel::Ungated,
            Decision::FailedOpen => OutcomeLabel::FailedOpen,
            Decision::Refused(rejected) => OutcomeLabel::refused(rejected),
            Decision::ExpiredIntoDoubt => OutcomeLabel::HeldInDoubt,
            Decision::Recorded(Outcome::Succeeded(_)) => OutcomeLabel::Settled,
            Decision::Recorded(Outcome::Failed(Disposition::Release)) => OutcomeLabel::Released,
            Decision::Recorded(Outcome::Failed(Disposition::Keep)) => OutcomeLabel::KeptFailure,
            Decision::Recorded(Outcome::Failed(Disposition::InDoubt)) => OutcomeLabel::HeldInDoubt,
            Decision::Unrecorded(rejected) => OutcomeLabel::unrecorded(rejected),
        }
    }

    /// Tells the race harness in scope, if any.
    fn observe(self) {
        match self {
            Decision::Won { took_over } => {
                if took_over {
                    observe::record(GateEvent::TookOver);
                }
                observe::record(GateEvent::Won);
            }
            Decision::Replayed => observe::record(GateEvent::Replayed),
            Decision::Ungated | Decision::FailedOpen => observe::record(GateEvent::Ungated),
            Decision::Refused(rejected) => observe::record(GateEvent::Refused(rejected.clone())),
            Decision::ExpiredIntoDoubt => observe::record(GateEvent::InDoubt),
            Decision::Recorded(Outcome::Succeeded(_)) => observe::record(GateEvent::Settled),
            Decision::Recorded(Outcome::Failed(Disposition::Release)) => {
                observe::record(GateEvent::Released);
            }
            Decision::Recorded(Outcome::Failed(Disposition::Keep)) => {
                observe::record(GateEvent::Kept);
            }
            Decision::Recorded(Outcome::Failed(Disposition::InDoubt)) => {
                observe::record(GateEvent::InDoubt);
            }
            Decision::Unrecorded(rejected) => {
                observe::record(GateEvent::Unrecorded(rejected.clone()));
            }
        }
    }

    /// Reports a claim's decision, `claiming` after the claim began.
    pub(crate) fn claimed(self, slots: &ScopedPool, identity: &Identity, claiming: &Stopwatch) {
        self.observe();
        measure::claimed(slots, identity, self.label(), claiming);
    }

    /// Reports what became of a won claim: its body ran from `won` until
    /// `recording` began.
    pub(crate) fn recorded(
        self,
        slots: &ScopedPool,
        identity: &Identity,
        won: &Stopwatch,
        recording: &Stopwatch,
    ) {
        self.observe();
        measure::recorded(slots, identity, self.label(), won, recording);
    }

    /// Reports what happened to a slot outside its holder's claim and
    /// recording.
    pub(crate) fn happened(self, slots: &ScopedPool, identity: &Identity) {
        self.observe();
        measure::happened(slots, identity, self.label());
    }

    /// Reports a decision the metrics do not count (a misuse refused before
    /// any statement): to the race harness only.
    pub(crate) fn observed_only(self) {
        self.observe();
    }
}
