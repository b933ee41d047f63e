//! The guard over many items: [`Gate::guard_batch`].

use std::fmt;
use std::marker::PhantomData;

use super::{Classified, Classify, NoReplay, ReleaseAll, Replay, ReplayPolicy, outcome_for};
use crate::batch::{self, Batch};
use crate::gate::Gate;

/// A [`Batch`] about to be guarded, item by item: the batch form of
/// [`Guard`](super::Guard), with the same [`replay`](BatchGuard::replay)
/// and [`disposition`](BatchGuard::disposition), and the batch's own
/// options ([`Batch::lease`], [`Batch::concurrency`], ...) on the batch.
/// Built by [`Gate::guard_batch`]; ends in [`run`](BatchGuard::run).
#[must_use = "a batch guard does nothing until `.run(..)` is awaited"]
pub struct BatchGuard<'a, M, R = NoReplay, D = ReleaseAll> {
    gate: &'a Gate,
    batch: Batch<M>,
    replay: PhantomData<R>,
    classify: D,
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
        }
    }
}

impl<'a, M, D> BatchGuard<'a, M, NoReplay, D> {
    /// Keeps each `Ok` value so that a later duplicate of its item is
    /// handed it without running, as [`Guard::replay`](super::Guard::replay)
    /// does for one call.
    pub fn replay(self) -> BatchGuard<'a, M, Replay, D> {
        BatchGuard {
            gate: self.gate,
            batch: self.batch,
            replay: PhantomData,
            classify: self.classify,
        }
    }
}

impl<'a, M, R> BatchGuard<'a, M, R, ReleaseAll> {
    /// Records each item's `Err` as `classify` says of it, as
    /// [`Guard::disposition`](super::Guard::disposition) does for one call.
    pub fn disposition<F>(self, classify: F) -> BatchGuard<'a, M, R, Classified<F>> {
        BatchGuard {
            gate: self.gate,
            batch: self.batch,
            replay: self.replay,
            classify: Classified(classify),
        }
    }
}

impl<M, R, D> BatchGuard<'_, M, R, D> {
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

impl<M, R, D> fmt::Debug for BatchGuard<'_, M, R, D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BatchGuard")
            .field("gate", self.gate)
            .field("batch", &self.batch)
            .field("replay", &std::any::type_name::<R>())
            .finish_non_exhaustive()
    }
}
