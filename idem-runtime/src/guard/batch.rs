//! The guard over many items: [`Gate::guard_batch`].

use std::fmt;
use std::marker::PhantomData;

use std::time::Duration;

use super::{
    Anywhere, AsyncCommit, Classified, Classify, LeaseOption, Leased, NoReplay,
    OutcomeCommitOption, ReleaseAll, Replay, ReplayPolicy, outcome_for,
};
use crate::batch::{self, Batch};
use crate::gate::Gate;
use crate::mode::{Mode, OnExpiry, OutcomeCommit};

/// A [`Batch`] about to be guarded, item by item: the batch form of
/// [`Guard`](super::Guard), with the guard's options that a batch can
/// take and the same refusals at compile time:
/// [`replay`](BatchGuard::replay), [`disposition`](BatchGuard::disposition),
/// [`lease`](BatchGuard::lease) (then [`on_expiry`](BatchGuard::on_expiry)),
/// [`outcome_commit`](BatchGuard::outcome_commit); a fingerprint is given
/// per item ([`Batch::push_fingerprinted`]). Built by
/// [`Gate::guard_batch`]; ends in [`run`](BatchGuard::run).
#[must_use = "a batch guard does nothing until `.run(..)` is awaited"]
pub struct BatchGuard<'a, M, R = NoReplay, D = ReleaseAll, P = Anywhere> {
    gate: &'a Gate,
    batch: Batch<M>,
    replay: PhantomData<R>,
    classify: D,
    place: PhantomData<P>,
}

impl Gate {
    /// Starts guarding each item of `batch`: add
    /// [`replay`](BatchGuard::replay) or a
    /// [`disposition`](BatchGuard::disposition), then
    /// [`run`](BatchGuard::run) one body per won item. See
    /// [`batch`](crate::batch) for how a batch is claimed and recorded.
    ///
    /// ```no_run
    /// # async fn demo(gate: idem_runtime::Gate) {
    /// use idem_runtime::batch::Batch;
    /// use idem_runtime::{Identity, Rejected};
    ///
    /// let batch: Batch<u32> = (1..=3)
    ///     .map(|n| (n, Identity::new("meter").part(n)))
    ///     .collect();
    /// let outcomes: Vec<Result<u32, Rejected>> = gate
    ///     .guard_batch(batch)
    ///     .replay()
    ///     .run(|n| async move { Ok(n * 10) })
    ///     .await;
    /// # let _ = outcomes; }
    /// ```
    pub fn guard_batch<M>(&self, batch: Batch<M>) -> BatchGuard<'_, M> {
        BatchGuard {
            gate: self,
            batch,
            replay: PhantomData,
            classify: ReleaseAll,
            place: PhantomData,
        }
    }
}

impl<'a, M, R, D, P> BatchGuard<'a, M, R, D, P> {
    /// This guard with `change` made to its claim options, in the state
    /// `Q` the option moves it to.
    fn optioned<Q>(mut self, change: impl FnOnce(Mode) -> Mode) -> BatchGuard<'a, M, R, D, Q> {
        self.batch.mode = change(self.batch.mode.clone());
        BatchGuard {
            gate: self.gate,
            batch: self.batch,
            replay: self.replay,
            classify: self.classify,
            place: PhantomData,
        }
    }

    /// Each claim expires after `lease`, as [`Guard::lease`](super::Guard::lease)
    /// says (and is checked as it is); not with an asynchronous
    /// [`outcome_commit`](BatchGuard::outcome_commit), which does not
    /// compile. The batch's outcomes are recorded when its last body
    /// returns, so the lease must cover the whole batch.
    ///
    /// The lease runs from the batch's claim, and a body may wait for its
    /// turn behind others (see [`concurrency`](BatchGuard::concurrency)). A body whose turn
    /// opens with less than half the lease left (by this process's clock,
    /// which trails the store's by one round trip, far less than that
    /// margin) first renews its claim to a whole lease (one statement,
    /// matched on the claim's fence), so no body starts on a claim that
    /// may have been taken over. Should the claim be lost already (taken
    /// over, turned in doubt, released), its body does not start: the item
    /// is claimed again alone, as a [`Guard::run`](crate::Guard::run) made then would be, and
    /// runs only if that wins. Should the store fail to renew it, the
    /// claim is released (its body never started) and the item refused
    /// with the store's error. A lease that covers the whole batch never
    /// costs that statement.
    pub fn lease(self, lease: Duration) -> BatchGuard<'a, M, R, D, Leased>
    where
        P: LeaseOption,
    {
        self.optioned(|mode| mode.lease(lease))
    }

    /// Keeps each item's value and fingerprint for `window` after its
    /// outcome, as [`Guard::keep_value_for`](super::Guard::keep_value_for)
    /// says.
    pub fn keep_value_for(self, window: Duration) -> BatchGuard<'a, M, R, D, P> {
        self.optioned(|mode| mode.keep_value_for(window))
    }

    /// Holds each item's slot for `window` after its outcome, as
    /// [`Guard::keep_slot_for`](super::Guard::keep_slot_for) says.
    pub fn keep_slot_for(self, window: Duration) -> BatchGuard<'a, M, R, D, P> {
        self.optioned(|mode| mode.keep_slot_for(window))
    }

    /// Runs at most `bodies` won bodies at a time (at least one; one by
    /// default, in the batch's order). A body waits for its turn within
    /// the batch's lease (see [`lease`](BatchGuard::lease)).
    pub fn concurrency(mut self, bodies: usize) -> BatchGuard<'a, M, R, D, P> {
        self.batch.concurrency = bodies.max(1);
        self
    }

    /// How the outcomes commit, as
    /// [`Guard::outcome_commit`](super::Guard::outcome_commit) says
    /// (ignored on Citus, as it is for one claim); not with a
    /// [`lease`](BatchGuard::lease), which does not compile.
    pub fn outcome_commit(self, commit: OutcomeCommit) -> BatchGuard<'a, M, R, D, AsyncCommit>
    where
        P: OutcomeCommitOption,
    {
        self.optioned(|mode| mode.outcome_commit(commit))
    }
}

impl<'a, M, R, D> BatchGuard<'a, M, R, D, Leased> {
    /// What a claim whose lease ran out becomes; see [`OnExpiry`].
    pub fn on_expiry(self, on_expiry: OnExpiry) -> BatchGuard<'a, M, R, D, Leased> {
        self.optioned(|mode| mode.on_expiry(on_expiry))
    }
}

impl<'a, M, D, P> BatchGuard<'a, M, NoReplay, D, P> {
    /// Keeps each `Ok` value so that a later duplicate of its item is
    /// handed it without running, as [`Guard::replay`](super::Guard::replay)
    /// does for one call.
    pub fn replay(self) -> BatchGuard<'a, M, Replay, D, P> {
        BatchGuard {
            gate: self.gate,
            batch: self.batch,
            replay: PhantomData,
            classify: self.classify,
            place: self.place,
        }
    }
}

impl<'a, M, R, P> BatchGuard<'a, M, R, ReleaseAll, P> {
    /// Records each item's `Err` as `classify` says of it, as
    /// [`Guard::disposition`](super::Guard::disposition) does for one call.
    pub fn disposition<F>(self, classify: F) -> BatchGuard<'a, M, R, Classified<F>, P> {
        BatchGuard {
            gate: self.gate,
            batch: self.batch,
            replay: self.replay,
            classify: Classified(classify),
            place: self.place,
        }
    }
}

impl<M, R, D, P> BatchGuard<'_, M, R, D, P> {
    /// Runs each item's `body` whose claim this batch wins, at most once
    /// per identity, with one statement to claim the whole batch and one
    /// per kind of outcome to record it (see [`batch`](crate::batch)).
    ///
    /// Returns, in the batch's order, what [`Guard::run`](super::Guard::run)
    /// would have returned for each item: the body's output when it ran, or
    /// the [`Rejected`](crate::Rejected) that refused it (or, with
    /// [`replay`](BatchGuard::replay), the value a settled duplicate kept).
    /// A later copy of an identity is answered as a duplicate made after
    /// the earlier copy finished (see
    /// [the module docs](crate::batch#the-same-identity-twice-in-a-batch)).
    ///
    /// # Panics
    ///
    /// When a body panics, once the other bodies have run and every
    /// finished outcome is recorded, with that body's panic; its own claim
    /// is left pending, as [`Guard::run`](super::Guard::run) leaves it.
    pub async fn run<O, F, Fut>(self, body: F) -> Vec<O>
    where
        F: FnMut(M) -> Fut,
        Fut: Future<Output = O>,
        R: ReplayPolicy<O>,
        D: Classify<O> + Send + Sync,
    {
        let outcome = outcome_for::<R, D, O>(self.classify);
        batch::run(self.gate.slots(), self.batch, outcome, body).await
    }
}

impl<M, R, D, P> fmt::Debug for BatchGuard<'_, M, R, D, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BatchGuard")
            .field("gate", self.gate)
            .field("batch", &self.batch)
            .field("replay", &std::any::type_name::<R>())
            .finish_non_exhaustive()
    }
}
