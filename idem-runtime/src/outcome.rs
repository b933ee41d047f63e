//! The one outcome vocabulary: what a slot records for an action, whoever
//! finds it out. The run loop (a body's `Ok` or its `Err`'s
//! [`Disposition`]), a reconciler's [`Verdict`](crate::reconcile::Verdict),
//! an operator's [`resolve`](crate::operations::resolve) and the HTTP
//! layer's [status policy](crate::http::IdempotencyLayer::status_policy)
//! all say it as an [`Outcome`], and each outcome leaves the slot in one
//! [`ClaimState`](crate::operations::ClaimState) (or deletes it:
//! [`ClaimState::after`](crate::operations::ClaimState::after)).
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

/// How an action turned out, as its slot records it: the one outcome
/// vocabulary of idem.
///
/// | outcome | the slot becomes | duplicates |
/// |---|---|---|
/// | `Succeeded(v)` | [`success`](crate::operations::ClaimState::Success), forever | refused [`AlreadyDone`](crate::Rejected::AlreadyDone), or given the kept value with `replay` |
/// | `Failed(Disposition::Keep)` | [`failed`](crate::operations::ClaimState::Failed) | refused [`AlreadyFailed`](crate::Rejected::AlreadyFailed) |
/// | `Failed(Disposition::InDoubt)` | [`in_doubt`](crate::operations::ClaimState::InDoubt) until resolved | refused [`InDoubt`](crate::Rejected::InDoubt) |
/// | `Failed(Disposition::Release)` | deleted | the next one runs |
///
/// `V` is what a success keeps, where the speaker has one to give: `()` for
/// the HTTP layer (the response itself is kept), `Option<&str>` for an
/// operator (the JSON text to replay, if any).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome<V = ()> {
    /// The action happened: the slot is settled forever, keeping `V`.
    Succeeded(V),
    /// The action failed, and the [`Disposition`] says what that means for
    /// its slot.
    Failed(Disposition),
}

impl<V> Outcome<V> {
    /// The outcome without what a success keeps.
    pub fn kind(&self) -> Outcome {
        match self {
            Outcome::Succeeded(_) => Outcome::Succeeded(()),
            Outcome::Failed(disposition) => Outcome::Failed(*disposition),
        }
    }
}

impl<V> Outcome<Option<V>> {
    /// The value kept for replay, if this is a success that keeps one.
    pub(crate) fn into_value(self) -> Option<V> {
        match self {
            Outcome::Succeeded(value) => value,
            Outcome::Failed(_) => None,
        }
    }
}

impl Outcome {
    /// Every kind of outcome, in the order a batch records them.
    pub(crate) const KINDS: [Outcome; 4] = [
        Outcome::Succeeded(()),
        Outcome::Failed(Disposition::Release),
        Outcome::Failed(Disposition::Keep),
        Outcome::Failed(Disposition::InDoubt),
    ];

    /// This kind with `value` kept, for a success.
    pub(crate) fn with_value<V>(self, value: V) -> Outcome<V> {
        match self {
            Outcome::Succeeded(()) => Outcome::Succeeded(value),
            Outcome::Failed(disposition) => Outcome::Failed(disposition),
        }
    }
}
