//! Guarded calls that outlive their caller: what happens when the caller's
//! future is dropped, and how to have a body run to completion instead.
//!
//! # When the caller's future is dropped
//!
//! A guarded body (an `#[idempotent]` function, a guard's
//! [`run`](crate::Guard::run)) runs inside its caller's future, and is
//! cancelled with it. When that future is dropped — a client that
//! disconnects (hyper drops the request's future), a timeout around the call
//! (`tokio::time::timeout`, a `tower` timeout), a `select!` that took another
//! branch, a task aborted — the body stops at its next `.await`, wherever it
//! was: perhaps after the charge, before the settle. Its claim is then left
//! `pending`, as for a panic: without a [lease](crate::Guard::lease) every
//! retry is refused [`Rejected::InFlight`] until an operator resolves it;
//! with one, the retry takes the claim over when it expires and runs a body
//! that may already have taken effect (or, with
//! [`on_expiry`](crate::Guard::on_expiry) `InDoubt`, finds it in doubt).
//!
//! # Running to completion
//!
//! To have the body run to completion whatever its caller does, end its
//! guard in [`run_detached`](crate::Guard::run_detached): a `'static + Send`
//! body (owning what it uses: `async move`), run with a [`Detached`] handle.
//! The claim, the body and its settle run as a task of their own on the tokio
//! runtime, and dropping the caller's future leaves it running; its outcome
//! is recorded as usual, so the retry gets it
//! ([`AlreadyDone`](Rejected::AlreadyDone) after a success, a run after a
//! failure that released the key).
//!
//! - A body may run on for the handle's bound after its caller left
//!   ([`Detached::with_bound`]; [a minute](Detached::DEFAULT_BOUND) by
//!   default). Past it the body is stopped and its claim held **in doubt**
//!   (`state_reason` [`PAST_BOUND`]), never released: it may have taken
//!   effect. A reconciler or an operator resolves it. A duplicate still
//!   waiting for its claim ([`wait`](crate::Guard::wait)) when its caller
//!   left stops waiting at the bound, claiming nothing; one that wins its
//!   claim past the bound releases it without beginning its body.
//! - At shutdown, [`Detached::shutdown`] waits for the bodies still running,
//!   up to a grace period, then stops the rest and holds their claims in
//!   doubt ([`AT_SHUTDOWN`]). Call it before the runtime stops: a task the
//!   runtime drops leaves its claim `pending`.
//! - With a lease, a detached body renews its own lease while it runs
//!   (every third of the lease, as [`Claim::extend`] does), also after its
//!   caller left: its bound, not the lease, limits how long it runs, and a
//!   retry meanwhile is refused [`Rejected::InFlight`], never handed a body
//!   still running. The lease is taken over only when the process died, or
//!   when the store stayed down longer than the lease (a renewal the store
//!   fails is tried again at the next tick, and none landed). A renewal that
//!   finds the claim taken over or released stops; the body runs on to its
//!   end and its outcome is recorded as for any lost claim.
//! - A detached body that panics holds its claim in doubt ([`PANICKED`])
//!   and the panic is resumed in its caller, if the caller is still waiting.
//! - The `tower` layer (`http::IdempotencyLayer`, feature `tower`) runs every
//!   guarded request this way.
//!
//! ```no_run
//! # async fn demo(gate: idem_runtime::Gate) -> Result<(), idem_runtime::Rejected> {
//! use std::time::Duration;
//! use idem_runtime::{Detached, Identity, Rejected};
//!
//! let detached = Detached::with_bound(Duration::from_secs(30)); // one per service
//! let id = Identity::new("charge").part("ord_1001").part(4_999);
//! let receipt: Result<String, Rejected> = gate
//!     .guard(&id)
//!     .run_detached(&detached, async move {
//!         // Runs to its end even if this caller's future is dropped.
//!         Ok("r_1".to_owned())
//!     })
//!     .await;
//! # let _ = receipt;
//! // At shutdown, once nothing new is accepted:
//! detached.shutdown(Duration::from_secs(10)).await;
//! # Ok(()) }
//! ```

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::FutureExt as _;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::acquire::{Acquired, KeptValue, acquire_unless};
use crate::claim::Claim;
use crate::error::Rejected;
use crate::identity::Identity;
use crate::mode::{Disposition, Mode};
use crate::run::OutcomeOf;
use crate::scoped_pool::ScopedPool;
use crate::step::Ambient;
use crate::via::Via;

/// `state_reason` of a claim whose detached body was stopped because it
/// ran past the bound after its caller left.
pub const PAST_BOUND: &str = "detached_past_bound";
/// `state_reason` of a claim whose detached body was stopped at shutdown,
/// after the grace period.
pub const AT_SHUTDOWN: &str = "detached_at_shutdown";
/// `state_reason` of a claim whose detached body panicked.
pub const PANICKED: &str = "body_panicked";

/// The bodies run detached from their callers, and how long one may run on
/// after its caller left: a handle to share (cloning it is cheap), and to
/// await at shutdown.
///
/// Its bound, its shutdown, and how it renews a leased claim: see [the
/// module docs](self).
///
/// ```no_run
/// # async fn demo(gate: idem_runtime::Gate) {
/// use std::time::Duration;
/// use idem_runtime::Detached;
///
/// let detached = Detached::with_bound(Duration::from_secs(30));
/// // ... serve, running guarded bodies with `detached` ...
/// // Once the server stopped accepting: let the bodies finish, up to 10 s,
/// // then hold the rest in doubt.
/// let stopped = detached.shutdown(Duration::from_secs(10)).await;
/// assert_eq!(detached.running(), 0);
/// # let _ = stopped;
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Detached {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    bound: Duration,
    tracker: TaskTracker,
    /// Set when a shutdown begins: no new run claims anything.
    closing: AtomicBool,
    /// Cancelled when a shutdown's grace ran out: running bodies stop.
    shutdown: CancellationToken,
    held_at_shutdown: AtomicUsize,
}

/// What [`Detached::shutdown`] came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Shutdown {
    /// Bodies stopped when the grace period ran out; their claims are held
    /// in doubt ([`AT_SHUTDOWN`]) for a reconciler or an operator.
    pub held_in_doubt: usize,
}

impl Detached {
    /// How long a body may run on after its caller left, by default: one
    /// minute, longer than any answer a client waits for, short enough that
    /// a stuck body does not hold its key forever unknown.
    pub const DEFAULT_BOUND: Duration = Duration::from_secs(60);

    /// A handle whose bodies may run [`DEFAULT_BOUND`](Self::DEFAULT_BOUND)
    /// after their caller left.
    pub fn new() -> Detached {
        Detached::with_bound(Detached::DEFAULT_BOUND)
    }

    /// A handle whose bodies may run `bound` after their caller left; then
    /// each is stopped and its claim held in doubt.
    pub fn with_bound(bound: Duration) -> Detached {
        Detached {
            shared: Arc::new(Shared {
                bound,
                tracker: TaskTracker::new(),
                closing: AtomicBool::new(false),
                shutdown: CancellationToken::new(),
                held_at_shutdown: AtomicUsize::new(0),
            }),
        }
    }

    /// How long a body may run on after its caller left.
    pub fn bound(&self) -> Duration {
        self.shared.bound
    }

    /// How many detached runs have not finished (claiming, running, or
    /// recording).
    pub fn running(&self) -> usize {
        self.shared.tracker.len()
    }

    /// Waits for the detached bodies still running, up to `grace`; then
    /// stops the rest and holds their claims in doubt, and returns once
    /// every claim is recorded. Never releases a claim whose body started.
    /// A run that begins after this was called claims nothing and is
    /// refused [`Rejected::InFlight`] (retry later, at another instance);
    /// so is one still waiting for its claim ([`Guard::wait`](crate::Guard::wait))
    /// when the grace runs out.
    ///
    /// Call it after the server stopped accepting requests, before the
    /// runtime shuts down: a task the runtime drops records nothing, and
    /// its claim stays `pending`.
    pub async fn shutdown(&self, grace: Duration) -> Shutdown {
        let shared = &self.shared;
        shared.closing.store(true, Ordering::SeqCst);
        shared.tracker.close();
        if tokio::time::timeout(grace, shared.tracker.wait())
            .await
            .is_err()
        {
            shared.shutdown.cancel();
            shared.tracker.wait().await;
        }
        Shutdown {
            held_in_doubt: shared.held_at_shutdown.load(Ordering::SeqCst),
        }
    }
}

impl Default for Detached {
    fn default() -> Detached {
        Detached::new()
    }
}

impl Shared {
    /// Whether a shutdown has begun.
    fn is_closing(&self) -> bool {
        self.closing.load(Ordering::SeqCst)
    }
}

/// How a detached run ended, as its task returns it.
enum Finished<R> {
    /// What the caller gets.
    Output(R),
    /// The body panicked; its claim is held. The payload, to resume.
    Panicked(Box<dyn Any + Send>),
}

/// Why a running body was stopped.
#[derive(Clone, Copy)]
enum Stop {
    PastBound,
    Shutdown,
}

/// Claims `identity` in `slots`, runs `body` only if the claim was won and
/// records its outcome, as [`run`](crate::run) does, but in a task of
/// `detached`'s: dropping the returned future does not cancel it. From
/// the moment the caller left, the body has `detached`'s bound to finish;
/// then, or at shutdown past its grace, the body is stopped and the claim
/// held in doubt. A panic of the body holds the claim in doubt and is
/// resumed here.
///
/// Must be called within a tokio runtime (it spawns).
pub(crate) async fn run_detached<R, F>(
    detached: &Detached,
    slots: ScopedPool,
    identity: Identity,
    mode: Mode,
    outcome: OutcomeOf<'static, R>,
    body: F,
) -> R
where
    R: Send + 'static,
    F: Future<Output = R> + Send + 'static,
{
    let refused = outcome.refuser();
    let left = Left::default();
    let run = Run {
        shared: Arc::clone(&detached.shared),
        slots,
        identity,
        mode,
        outcome,
        left: left.clone(),
    };
    let task = detached
        .shared
        .tracker
        .spawn(crate::observe::carried(run.claim_and_run(body)));
    // Dropped with this future, before the task is done: the caller left,
    // and the body's bound starts.
    let caller = Caller(Some(left));
    let joined = task.await;
    caller.stayed();
    match joined {
        Ok(Finished::Output(output)) => output,
        Ok(Finished::Panicked(payload)) => std::panic::resume_unwind(payload),
        Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
        // The runtime dropped the task (it is shutting down): what the body
        // did is unknown, and its claim was left as it was.
        Err(_) => refused(Rejected::InDoubt),
    }
}

/// One detached run: what its task owns.
struct Run<R> {
    shared: Arc<Shared>,
    slots: ScopedPool,
    identity: Identity,
    mode: Mode,
    outcome: OutcomeOf<'static, R>,
    /// When the caller left, if it did.
    left: Left,
}

/// When a detached run's caller left: the instant, and a token cancelled
/// then, for the task to wait on.
#[derive(Clone, Default)]
struct Left {
    at: Arc<std::sync::OnceLock<tokio::time::Instant>>,
    token: CancellationToken,
}

/// Held by the awaiting caller: dropped before the run is done, it records
/// that the caller left, and when.
struct Caller(Option<Left>);

impl Caller {
    /// The caller saw the run to its end.
    fn stayed(mut self) {
        self.0 = None;
    }
}

impl Drop for Caller {
    fn drop(&mut self) {
        if let Some(left) = self.0.take() {
            let _first = left.at.set(tokio::time::Instant::now());
            left.token.cancel();
        }
    }
}

impl<R> Run<R> {
    async fn claim_and_run<F: Future<Output = R>>(self, body: F) -> Finished<R> {
        if self.shared.is_closing() {
            return Finished::Output(self.outcome.refused(Rejected::InFlight));
        }
        let mut via = Via::Pool(self.slots.pool());
        // A duplicate that waits (`Guard::wait`) is a run too: it stops
        // waiting at its bound after its caller left, or at the shutdown's
        // grace, as a body would be stopped then.
        let claim = match acquire_unless(
            &self.slots,
            &self.identity,
            &self.mode,
            KeptValue::read_if(self.outcome.replays()),
            &mut via,
            self.stop(),
        )
        .await
        {
            Ok(Acquired::Won(claim)) => claim,
            Ok(Acquired::Settled(stored)) => {
                return Finished::Output(self.outcome.settled(&self.identity, stored));
            }
            Err(rejected) => return Finished::Output(self.outcome.refused(rejected)),
        };
        if self.shared.is_closing() || self.past_bound() {
            // Won during shutdown, or after the caller left more than the
            // bound ago (it waited for a duplicate): the body not begun,
            // nothing happened, so the slot is free again. Begun now, the
            // body would be stopped at once, perhaps after starting its
            // effect, and its key held in doubt for nothing.
            let _recorded = claim.dispose_via(Disposition::Release, &mut via).await;
            return Finished::Output(self.outcome.refused(Rejected::InFlight));
        }
        let steps = Ambient::of_claim(claim.held(), &self.identity, &self.slots);
        let body = AssertUnwindSafe(steps.around(body)).catch_unwind();
        // Nobody else keeps a leased claim alive once its caller left: the
        // run renews it while the body runs, so that a retry within the
        // bound never takes over a body that is still running.
        let body = renewing(&claim, self.mode.lease_duration(), body);
        tokio::select! {
            // A body that finishes as it is stopped is recorded as finished.
            biased;
            ran = body => match ran {
                Ok(output) => Finished::Output(
                    self.outcome.record(claim, output, Some(&steps), &mut via).await,
                ),
                Err(payload) => {
                    // A step it finished is recorded, not left in doubt.
                    steps.land_carried().await;
                    self.hold(claim, PANICKED, &mut via).await;
                    Finished::Panicked(payload)
                }
            },
            stop = self.stop() => {
                let reason = match stop {
                    Stop::PastBound => PAST_BOUND,
                    Stop::Shutdown => {
                        self.shared.held_at_shutdown.fetch_add(1, Ordering::SeqCst);
                        AT_SHUTDOWN
                    }
                };
                steps.land_carried().await;
                self.hold(claim, reason, &mut via).await;
                Finished::Output(self.outcome.refused(Rejected::InDoubt))
            }
        }
    }

    /// Whether the caller left more than the bound ago.
    fn past_bound(&self) -> bool {
        self.left
            .at
            .get()
            .is_some_and(|left_at| left_at.elapsed() >= self.shared.bound)
    }

    /// Resolves when the body must be stopped: its bound ran out after the
    /// caller left, or the shutdown's grace did.
    async fn stop(&self) -> Stop {
        // Counted from when the caller left, which may be before the body
        // began (it left while the claim was being won).
        let past_bound = async {
            self.left.token.cancelled().await;
            let left_at = self
                .left
                .at
                .get()
                .copied()
                .unwrap_or_else(tokio::time::Instant::now);
            match left_at.checked_add(self.shared.bound) {
                Some(deadline) => tokio::time::sleep_until(deadline).await,
                // A bound too large to be an instant: no bound.
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = past_bound => Stop::PastBound,
            () = self.shared.shutdown.cancelled() => Stop::Shutdown,
        }
    }

    /// Holds `claim` in doubt for `reason`; a hold that cannot be recorded
    /// leaves the row pending (fail closed), as the claim reports.
    async fn hold(&self, claim: Claim, reason: &'static str, via: &mut Via<'_>) {
        tracing::warn!(
            target: "idem",
            action = self.identity.action(),
            address = claim.address(),
            reason,
            "a detached body was stopped or panicked; its claim is held in doubt, never released"
        );
        let _recorded = claim.hold_in_doubt(reason, via).await;
    }
}

/// Runs `body`, renewing `claim`'s `lease` (if it has one) meanwhile.
/// When a renewal finds the claim lost, the body still runs to its end
/// (it may be mid-effect) and its recording says what became of the claim.
async fn renewing<T>(claim: &Claim, lease: Option<Duration>, body: impl Future<Output = T>) -> T {
    let Some(lease) = lease.filter(|_| claim.is_gated()) else {
        return body.await;
    };
    let mut body = std::pin::pin!(body);
    tokio::select! {
        biased;
        output = &mut body => output,
        () = renew(claim, lease) => body.await,
    }
}

/// Renews `claim`'s lease to `lease` every third of it, well before it
/// runs out; returns only once the claim is lost (taken over or
/// released). A renewal the store failed (an outage) is tried again at the
/// next tick: a lease shorter than the outage can still run out.
async fn renew(claim: &Claim, lease: Duration) {
    // A period of zero would spin (and `interval` refuses it).
    let period = (lease / RENEWALS_PER_LEASE).max(Duration::from_millis(1));
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        match claim.extend(lease).await {
            Ok(()) => {}
            Err(Rejected::LeaseLost { .. }) => return,
            Err(error) => tracing::warn!(
                target: "idem",
                address = claim.address(),
                %error,
                "a detached body's lease could not be renewed; trying again at the next tick"
            ),
        }
    }
}

/// How many times a running detached body's lease is renewed within one
/// lease: a renewal late by up to two periods (a slow store, a busy
/// runtime) still lands before the lease runs out.
const RENEWALS_PER_LEASE: u32 = 3;

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_shutdown_with_nothing_running_returns_at_once_and_holds_nothing() {
        let detached = Detached::with_bound(Duration::from_millis(5));
        assert_eq!(detached.bound(), Duration::from_millis(5));
        assert_eq!(Detached::default().bound(), Detached::DEFAULT_BOUND);
        let stopped = detached.shutdown(Duration::from_secs(3600)).await;
        assert_eq!(stopped, Shutdown { held_in_doubt: 0 });
        assert_eq!(detached.running(), 0);
    }

    #[tokio::test]
    async fn clones_share_the_bodies_and_the_shutdown() {
        let detached = Detached::new();
        let clone = detached.clone();
        let (started, finish) = (
            Arc::new(tokio::sync::Notify::new()),
            CancellationToken::new(),
        );
        let task = {
            let (started, finish) = (Arc::clone(&started), finish.clone());
            clone.shared.tracker.spawn(async move {
                started.notify_one();
                finish.cancelled().await;
            })
        };
        started.notified().await;
        assert_eq!(detached.running(), 1, "a clone's task is the original's");
        finish.cancel();
        detached.shutdown(Duration::from_secs(3600)).await;
        assert!(task.is_finished());
        assert!(clone.shared.tracker.is_closed());
    }
}
