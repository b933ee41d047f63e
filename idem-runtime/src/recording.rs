//! The one outcome type: what a call that ran asks its slot to record, from
//! the run loop (a body's output) through the claim (its statement, the
//! cache, the report) down to the store (a batch's statement per kind).
//! Vocabulary, as `error` is: it names nothing else of the crate, so the
//! store, the bottom layer, may name it.

/// What an `Err` of a guarded body means for its slot. The function's
/// author chooses it per error value: `#[idempotent(disposition = path)]`
/// names a `fn(&E) -> Disposition`, and so does a guard's
/// [`disposition`](crate::Guard::disposition). Without one, every `Err` is
/// [`Release`](Disposition::Release).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Disposition {
    /// Nothing happened: the claim is deleted, and a retry runs the body.
    /// The default, for errors that changed nothing (a validation error, a
    /// connection refused before the request was sent).
    #[default]
    Release,
    /// A definite failure (a card declined): the slot is kept as `failed`;
    /// duplicates do not run and are refused with
    /// [`Rejected::AlreadyFailed`](crate::Rejected::AlreadyFailed).
    Keep,
    /// The effect may have happened (a timeout after the request was sent):
    /// the slot is held `in_doubt`; duplicates do not run and are refused
    /// with [`Rejected::InDoubt`](crate::Rejected::InDoubt) until a
    /// reconciler or an operator establishes the outcome.
    InDoubt,
}

/// What a slot records for a call that ran: a success, with the value kept
/// for replay if there is one, or a failure and what it means for the slot.
///
/// `V` is how the kept value travels: `String` out of the run loop, `&str`
/// into a statement, `()` where only the kind matters (a batch groups its
/// outcomes by [`kind`](Recording::kind), one statement per kind).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Recording<V> {
    /// Settled, keeping this value for replay, if any.
    Settled(Option<V>),
    /// A failure, and what it means for the slot.
    Failed(Disposition),
}

impl<V> Recording<V> {
    /// The outcome without its value: what a batch groups by.
    pub(crate) fn kind(&self) -> Recording<()> {
        match self {
            Recording::Settled(_) => Recording::Settled(None),
            Recording::Failed(disposition) => Recording::Failed(*disposition),
        }
    }

    /// The value kept for replay, if this is a success that keeps one.
    pub(crate) fn into_value(self) -> Option<V> {
        match self {
            Recording::Settled(value) => value,
            Recording::Failed(_) => None,
        }
    }
}

impl Recording<()> {
    /// Every kind of outcome, in the order a batch records them.
    pub(crate) const KINDS: [Recording<()>; 4] = [
        Recording::Settled(None),
        Recording::Failed(Disposition::Release),
        Recording::Failed(Disposition::Keep),
        Recording::Failed(Disposition::InDoubt),
    ];

    /// This kind with `value` kept, for a success.
    pub(crate) fn with_value<V>(self, value: Option<V>) -> Recording<V> {
        match self {
            Recording::Settled(_) => Recording::Settled(value),
            Recording::Failed(disposition) => Recording::Failed(disposition),
        }
    }
}
