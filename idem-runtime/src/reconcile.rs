//! Establishing outcomes nobody knows: the application's probes, run over
//! claims in doubt, pending claims whose lease ran out (their holder is
//! presumed gone), and, if asked, pending claims without a lease old
//! enough that their holder is presumed gone too.
//!
//! A body that cannot tell whether its effect happened (a payment call that
//! timed out) returns an error of [`Disposition::InDoubt`]; a lease that
//! runs out under [`OnExpiry::InDoubt`] does the same for a holder that
//! vanished. Either way the slot is held and duplicates are refused, never
//! run. (The row of a holder that vanished stays `pending`, its lease run
//! out, until a retry looks and turns it `in_doubt`, whatever that retry's
//! own `on_expiry`: the claim's is recorded with it. The reconciler lists
//! such pending claims as they are, so it need not wait for a retry.) A
//! [`Reconciler`] finds those claims, asks the probe registered for their
//! action what really happened (the payment provider, by a reference
//! derived from the key), and resolves each as the probe says: settled
//! (with the value to replay), kept failed, or released for a retry.
//!
//! Each resolution is one compare-and-swap on the fence the reconciler saw
//! ([`operations::resolve_as`]): two reconcilers, or a reconciler racing the
//! original holder's late settle, resolve a claim exactly once, nothing
//! ever overwrites a success, and a pending claim whose lease is live (its
//! holder renews it) is never resolved.
//!
//! The reconciler lists only claims of actions it has a probe for, oldest
//! first, a window per pass that moves on from where the last one stopped:
//! a claim whose probe can answer is reached within one cycle, whatever
//! else is in doubt. Probes run in tasks of their own, each bounded by
//! [`Reconciler::probe_timeout`]; a panic or a hang is an unknown, never the
//! end of the loop.
//!
//! [`Disposition::InDoubt`]: crate::Disposition::InDoubt
//! [`OnExpiry::InDoubt`]: crate::OnExpiry::InDoubt

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use futures_util::StreamExt;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::error::Error;
use crate::identity::Identity;
use crate::measure;
#[cfg(feature = "metrics")]
use crate::metrics::MetricsOptions;
use crate::outcome::{Disposition, Outcome};
use crate::store;
use crate::store::operations::{
    self, ClaimRow, ClaimState, NamespaceFilter, ReconcileCursor, ReconcileFilter, Resolved,
    Resolver, ScopeFilter, ToReconcile,
};

/// A claim whose outcome is not known, as a probe sees it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Doubt {
    /// The action and its key parts ([`Identity::action`],
    /// [`Identity::parts`]): what to ask the outside world about.
    pub identity: Identity,
    /// The account (tenant) it was claimed in.
    pub account: String,
    /// Its namespace, if any.
    pub namespace: Option<String>,
    /// Its address, `claim_` + 24 hex digits.
    pub address: String,
    /// The fencing token it was claimed (or taken over) with: what a
    /// downstream system that checks fences saw.
    pub fence: i64,
    /// [`ClaimState::InDoubt`], or [`ClaimState::Pending`] for a claim whose
    /// lease ran out or (without a lease) one older than
    /// [`Reconciler::pending_older_than`].
    pub state: ClaimState,
    /// How it got there: `body_in_doubt` (its body said so),
    /// `lease_expired` (its lease ran out: its holder vanished; in doubt
    /// under `on_expiry = "in_doubt"` once a retry looks, and still pending
    /// until then); `None` for a pending claim without a lease.
    pub reason: Option<String>,
    /// When it was claimed, by the database's clock.
    pub claimed_at: SystemTime,
    /// The [steps](crate::step()) of its body that were begun and never
    /// recorded, by name: its holder was cut off inside them, so nobody
    /// knows what they did. Usually none (the body itself was in doubt) or
    /// one; answer for it with [`Verdict::step_succeeded_with`], or
    /// [`Verdict::NotHappened`] when it did not happen.
    pub steps_in_doubt: Vec<String>,
}

/// What a probe found out about a [`Doubt`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// The effect happened: the claim is settled, and duplicates get
    /// [`AlreadyDone`](crate::Rejected::AlreadyDone) or, with `replay`, the
    /// value given here ([`Verdict::succeeded_with`]).
    Succeeded {
        /// The `Ok` value to replay, as the JSON text `serde_json` writes.
        replay: Option<String>,
    },
    /// It definitely failed: the claim is kept `failed`, and duplicates are
    /// refused [`AlreadyFailed`](crate::Rejected::AlreadyFailed).
    Failed,
    /// It definitely did not happen: the claim is released, and the next
    /// invocation runs the action. Of a body with steps: the steps in doubt
    /// did not happen either (their markers are removed, so the next
    /// invocation runs them); its recorded steps are replayed, as on any
    /// retry.
    ///
    /// Answer it only once the holder's effect can no longer land: a probe
    /// that finds no trace of an effect still on its way (a holder paused,
    /// a statement still running on the server) would let the next
    /// invocation make it a second time. Bound the effect well inside the
    /// lease (a `statement_timeout`, a client timeout), or look again after
    /// that bound; a batch starts each body with at least half its lease
    /// left for this reason. `examples/consumer/` shows one way.
    NotHappened,
    /// The step in doubt (one of [`Doubt::steps_in_doubt`]) happened, and
    /// returned `replay`: it is recorded, and the claim released, so the
    /// next invocation resumes after it ([`Verdict::step_succeeded_with`]).
    StepSucceeded {
        /// The step's name.
        step: String,
        /// Its value, as the JSON text `serde_json` writes.
        replay: String,
    },
    /// Still unknown: the claim is left as it is, and probed again later,
    /// each time after a longer pause. One in doubt stays held. A pending
    /// one whose lease ran out is still subject to its claim's
    /// [`OnExpiry`](crate::OnExpiry) (recorded with it; a retry that says
    /// `in_doubt` holds it too), as with no reconciler: under the default
    /// take-over, the next claim of its identity takes it over and runs; an
    /// action whose probe may not know should use `on_expiry = "in_doubt"`.
    Unknown,
}

impl Verdict {
    /// What this verdict records for the claim, in idem's one outcome
    /// vocabulary: [`Succeeded`](Verdict::Succeeded) settles it,
    /// [`Failed`](Verdict::Failed) keeps it failed
    /// ([`Disposition::Keep`]), [`NotHappened`](Verdict::NotHappened) and
    /// [`StepSucceeded`](Verdict::StepSucceeded) release it
    /// ([`Disposition::Release`]); `None` for [`Unknown`](Verdict::Unknown),
    /// which records nothing.
    pub fn outcome(&self) -> Option<Outcome<Option<&str>>> {
        match self {
            Verdict::Succeeded { replay } => Some(Outcome::Succeeded(replay.as_deref())),
            Verdict::Failed => Some(Outcome::Failed(Disposition::Keep)),
            Verdict::NotHappened | Verdict::StepSucceeded { .. } => {
                Some(Outcome::Failed(Disposition::Release))
            }
            Verdict::Unknown => None,
        }
    }

    /// The effect happened; nothing to replay.
    pub fn succeeded() -> Verdict {
        Verdict::Succeeded { replay: None }
    }

    /// The effect happened, and `value` is the `Ok` value duplicates of a
    /// `replay` function get back: give it as that function's `Ok` type.
    ///
    /// An error when `value` would not read back as itself (see
    /// [`Claim::settle_value`](crate::Claim::settle_value)): say
    /// [`Verdict::succeeded`] instead, and duplicates are refused
    /// `AlreadyDone`.
    pub fn succeeded_with<T: serde::Serialize + serde::de::DeserializeOwned>(
        value: &T,
    ) -> Result<Verdict, serde_json::Error> {
        Ok(Verdict::Succeeded {
            replay: Some(stored(value)?),
        })
    }

    /// The step `step` of the body (one of [`Doubt::steps_in_doubt`])
    /// happened, and `value` is what it returned: it must read back as the
    /// step's `Ok` type. The step is recorded and the claim released; the
    /// next invocation replays it and runs on from there.
    pub fn step_succeeded_with<T: serde::Serialize + serde::de::DeserializeOwned>(
        step: &str,
        value: &T,
    ) -> Result<Verdict, serde_json::Error> {
        Ok(Verdict::StepSucceeded {
            step: step.to_owned(),
            replay: stored(value)?,
        })
    }
}

/// `value` as the JSON a verdict stores, under the rule every stored value
/// follows: it reads back as itself, or it is refused.
fn stored<T: serde::Serialize + serde::de::DeserializeOwned>(
    value: &T,
) -> Result<String, serde_json::Error> {
    crate::stored_value::to_json(value).map_err(<serde_json::Error as serde::ser::Error>::custom)
}

/// What one [`Reconciler::reconcile_once`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Pass {
    /// Claims whose probe was asked.
    pub probed: usize,
    /// Claims this pass resolved (settled, kept failed or released).
    pub resolved: usize,
    /// Claims whose probe said [`Verdict::Unknown`], panicked or did not
    /// answer within [`Reconciler::probe_timeout`]: still held.
    pub unknown: usize,
    /// Claims resolved meanwhile by someone else (another reconciler, an
    /// operator, the holder's late settle), or whose holder renewed its
    /// lease meanwhile: left as they are.
    pub lost: usize,
    /// Always 0 since claims are listed by action: a claim of an action
    /// without a probe is never read, and is left for an operator. Kept so
    /// that code reading it still builds.
    pub without_probe: usize,
    /// Of [`unknown`](Pass::unknown): probes that panicked (logged at
    /// error level with the action and the address).
    pub panicked: usize,
    /// Of [`unknown`](Pass::unknown): probes that did not answer within
    /// [`Reconciler::probe_timeout`] (and were cancelled).
    pub timed_out: usize,
}

impl Pass {
    /// Adds what another part of the pass did.
    fn add(&mut self, other: Pass) {
        let Pass {
            probed,
            resolved,
            unknown,
            lost,
            without_probe,
            panicked,
            timed_out,
        } = other;
        self.probed += probed;
        self.resolved += resolved;
        self.unknown += unknown;
        self.lost += lost;
        self.without_probe += without_probe;
        self.panicked += panicked;
        self.timed_out += timed_out;
    }
}

type Probe = Arc<dyn Fn(Doubt) -> Pin<Box<dyn Future<Output = Verdict> + Send>> + Send + Sync>;

/// Runs the application's probes over claims nobody knows the outcome of.
///
/// Each pass reads the next window of claims (a batch), oldest first, of
/// the actions that have a probe, and moves on from where the last pass
/// stopped, starting over once it reached the newest: a claim whose probe
/// can answer is asked within one cycle (the claims with a probe, divided
/// by the batch, plus one passes), whatever else is in doubt. Each probe
/// runs in a task of its own, under [`probe_timeout`](Reconciler::probe_timeout):
/// a panic or a probe that never answers counts as unknown, and never holds
/// up the shutdown. A pass handles up to
/// [`probe_concurrency`](Reconciler::probe_concurrency) claims at once
/// (4 by default), so a probe that hangs delays only its own claim, until
/// its timeout; a pass whose every probe hangs takes about
/// `batch / probe_concurrency` timeouts.
///
/// A pending claim whose lease ran out is listed as soon as it ran out,
/// whatever [`pending_older_than`](Reconciler::pending_older_than) says:
/// its holder is presumed gone by the lease's own definition, whether it
/// was claimed with `on_expiry = "in_doubt"` (held until resolved, a retry
/// only turning it `in_doubt`) or `"take_over"` (the next invocation runs
/// it again). For a `take_over` claim the probe's answer stands in for the
/// settle the vanished holder never made: `NotHappened` releases it, as the
/// takeover would have run it again anyway; `Succeeded` keeps the effect a
/// takeover would have repeated; `Failed` keeps the failure, as the
/// holder's own settle would have; `Unknown` leaves it to the takeover.
/// A retry that takes it over first raises its fence, and the
/// resolution, made against the fence the reconciler saw, then changes
/// nothing; a holder that renews its lease in time is never resolved.
///
/// ```no_run
/// # async fn demo(pool: idem_runtime::sqlx::PgPool) -> Result<(), idem_runtime::Error> {
/// use std::time::Duration;
/// use idem_runtime::reconcile::{Reconciler, Verdict};
///
/// let reconciler = Reconciler::new(pool)
///     .probe("charge", |doubt| async move {
///         let order = doubt.identity.parts().next().and_then(|p| p.as_text().map(str::to_owned));
///         // Ask the payment provider about the charge of `order`...
///         match order {
///             Some(_) => Verdict::Unknown,
///             None => Verdict::NotHappened,
///         }
///     })
///     .interval(Duration::from_secs(10));
///
/// // One pass, e.g. from a cron job or an admin endpoint:
/// let pass = reconciler.reconcile_once().await?;
/// println!("{} resolved, {} still unknown", pass.resolved, pass.unknown);
///
/// // Or a loop beside the service, until shutdown:
/// let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
/// let task = tokio::spawn(async move { reconciler.run(async { stopped.await.ok(); }).await });
/// // ... on shutdown:
/// let _ = stop.send(());
/// task.await.ok();
/// # Ok(()) }
/// ```
pub struct Reconciler {
    pool: PgPool,
    account: Option<String>,
    probes: HashMap<String, Probe>,
    pending_older_than: Option<Duration>,
    batch: u32,
    interval: Duration,
    probe_timeout: Duration,
    probe_concurrency: usize,
    /// Where the listing is, and what it remembers of the claims it saw.
    memory: Mutex<Memory>,
    /// How its `reconciled` outcomes are labelled.
    #[cfg(feature = "metrics")]
    metrics: MetricsOptions,
}

/// One claim, as the reconciler remembers it: its slot and its fence, so a
/// claim released and claimed anew at the same address (a new fence) starts
/// afresh, with no back-off and no verdict of its predecessor.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ClaimKey {
    account: String,
    namespace: Option<String>,
    address: String,
    fence: i64,
}

impl ClaimKey {
    fn of(row: &ClaimRow) -> ClaimKey {
        ClaimKey {
            account: row.account.clone(),
            namespace: row.namespace.clone(),
            address: row.address.clone(),
            fence: row.fence,
        }
    }
}

/// What the reconciler remembers of one claim between passes.
#[derive(Debug, Clone)]
struct Remembered {
    /// The cycle (one sweep of the listing, oldest to newest) it was last
    /// listed in: an entry not listed for a whole cycle is forgotten, so
    /// the memory holds no more than the claims still there.
    seen: u64,
    /// After an unknown: when to ask again, and the pause after that.
    wait: Option<(Instant, Duration)>,
    /// A verdict the store failed to record: recorded on the next pass
    /// without asking the probe again (a probe may have effects).
    verdict: Option<Verdict>,
    /// A pass is establishing its outcome (asking its probe, recording its
    /// verdict) right now: another pass of this reconciler running at the
    /// same time (`reconcile_once` takes `&self`) leaves it alone, so the
    /// probe is never asked twice at once.
    busy: bool,
}

/// Marks a claim [`Remembered::busy`] while a pass handles it; clears the
/// mark when dropped.
struct Busy<'a> {
    memory: &'a Mutex<Memory>,
    key: &'a ClaimKey,
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        let mut memory = self.memory.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(remembered) = memory.claims.get_mut(self.key) {
            remembered.busy = false;
        }
    }
}

/// The listing's place and the claims it remembers.
#[derive(Debug, Default)]
struct Memory {
    /// Where the next window starts; `None`: from the oldest.
    cursor: Option<ReconcileCursor>,
    /// How many times the listing has started over.
    cycle: u64,
    claims: HashMap<ClaimKey, Remembered>,
}

impl Memory {
    /// `key` was listed in this cycle: remembered (afresh if new).
    fn seen(&mut self, key: &ClaimKey) -> &mut Remembered {
        let cycle = self.cycle;
        let entry = self.claims.entry(key.clone()).or_insert(Remembered {
            seen: cycle,
            wait: None,
            verdict: None,
            busy: false,
        });
        entry.seen = cycle;
        entry
    }

    /// The listing reached the newest claim: the next window starts from
    /// the oldest, and whatever was not listed in the cycle just ended
    /// (resolved, released, taken over) is forgotten.
    fn start_over(&mut self) {
        let cycle = self.cycle;
        self.claims.retain(|_, remembered| remembered.seen == cycle);
        self.cursor = None;
        self.cycle += 1;
    }
}

/// How one probe ended.
enum Asked {
    Answered(Verdict),
    Panicked(String),
    TimedOut,
    /// The shutdown came first: the probe was cancelled, nothing decided.
    Stopped,
}

/// The shutdown a pass watches: polled between claims and raced against
/// each probe, and never polled again once it completed.
struct Stop<'a, S> {
    shutdown: Pin<&'a mut S>,
    done: bool,
}

impl<S: Future<Output = ()>> Stop<'_, S> {
    /// Completes when the shutdown has come (at once if it came before).
    async fn requested(&mut self) {
        if !self.done {
            self.shutdown.as_mut().await;
            self.done = true;
        }
    }
}

/// What a pass did, and what the loop makes of it.
struct Window {
    pass: Pass,
    /// The window was full: more claims may follow at once.
    full: bool,
    /// The shutdown came during the pass.
    stopped: bool,
}

impl Reconciler {
    /// The first pause before a claim whose probe said unknown is probed
    /// again; each further unknown doubles it, up to [`Reconciler::LONGEST_WAIT`].
    pub const FIRST_WAIT: Duration = Duration::from_secs(1);
    /// The longest pause between two probes of one claim.
    pub const LONGEST_WAIT: Duration = Duration::from_secs(300);
    /// The longest pause between passes after the store failed.
    pub const LONGEST_BACKOFF: Duration = Duration::from_secs(60);
    /// How long a probe may take by default ([`Reconciler::probe_timeout`]):
    /// long enough for a provider's API call and its retries, short enough
    /// that one stuck call costs a pass half a minute, not the loop.
    pub const DEFAULT_PROBE_TIMEOUT: Duration = Duration::from_secs(30);
    /// How many probes a pass asks at once by default
    /// ([`Reconciler::probe_concurrency`]).
    pub const DEFAULT_PROBE_CONCURRENCY: usize = 4;
    /// How many times a pass tries to record a verdict the store refused
    /// before it ends (the verdict is kept for the next pass).
    const RESOLVE_ATTEMPTS: u32 = 3;

    /// A reconciler over every account of the store `pool` reaches, with no
    /// probe yet, batches of 100, a pass every 10 seconds, and probes cut
    /// off after [`Reconciler::DEFAULT_PROBE_TIMEOUT`].
    pub fn new(pool: PgPool) -> Reconciler {
        Reconciler {
            pool,
            account: None,
            probes: HashMap::new(),
            pending_older_than: None,
            batch: 100,
            interval: Duration::from_secs(10),
            probe_timeout: Reconciler::DEFAULT_PROBE_TIMEOUT,
            probe_concurrency: Reconciler::DEFAULT_PROBE_CONCURRENCY,
            memory: Mutex::new(Memory::default()),
            #[cfg(feature = "metrics")]
            metrics: MetricsOptions::new(),
        }
    }

    /// Labels the `reconciled` outcomes it counts as `options` say (with
    /// the account of each claim, when asked), as
    /// [`Gate::with_metrics`](crate::Gate::with_metrics) does a gate's.
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    #[must_use]
    pub fn metrics(mut self, options: MetricsOptions) -> Reconciler {
        self.metrics = options;
        self
    }

    /// Only the claims of `account`.
    #[must_use]
    pub fn account(mut self, account: impl Into<String>) -> Reconciler {
        self.account = Some(account.into());
        self
    }

    /// Registers the probe of `action`: asked, for each claim of that action
    /// in doubt, what really happened. Claims of actions without a probe are
    /// never listed, and are left for an operator (`idem claims resolve`).
    ///
    /// A probe runs in a task of its own (so it needs a Tokio runtime): one
    /// that panics, or does not answer within
    /// [`probe_timeout`](Reconciler::probe_timeout) (it is then cancelled),
    /// counts as [`Verdict::Unknown`]; a panic is logged at error level with
    /// the action and the address.
    #[must_use]
    pub fn probe<F, Fut>(mut self, action: impl Into<String>, probe: F) -> Reconciler
    where
        F: Fn(Doubt) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Verdict> + Send + 'static,
    {
        let probe: Probe = Arc::new(move |doubt| Box::pin(probe(doubt)));
        self.probes.insert(action.into(), probe);
        self
    }

    /// How long one probe may take (default
    /// [`Reconciler::DEFAULT_PROBE_TIMEOUT`], 30 seconds; at least a
    /// millisecond): a probe still running then is cancelled, its claim
    /// stays held, and it is asked again after a pause, as after an
    /// unknown.
    #[must_use]
    pub fn probe_timeout(mut self, timeout: Duration) -> Reconciler {
        self.probe_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// How many claims of a pass are handled at once, each probe in a task
    /// of its own (default [`Reconciler::DEFAULT_PROBE_CONCURRENCY`], 4;
    /// at least 1): a probe that hangs holds up its own claim for up to
    /// the [`probe_timeout`](Reconciler::probe_timeout), while the others
    /// go on `probes - 1` at a time. Each claim handled at once may hold a
    /// connection of the pool while it is resolved, and asks your
    /// provider once: size it for both.
    #[must_use]
    pub fn probe_concurrency(mut self, probes: usize) -> Reconciler {
        self.probe_concurrency = probes.max(1);
        self
    }

    /// Also probes `pending` claims without a lease created longer than
    /// `age` ago, whose holder is presumed gone (crashed). (Pending claims
    /// whose lease ran out are probed whatever `age` is, as the type's docs
    /// say.) A pending claim whose lease is live is never probed nor
    /// resolved, whatever its age: its holder is at work and renewing it
    /// (the resolution itself refuses it, should the lease be renewed
    /// after the claim was listed). A claim without a lease cannot show
    /// that, so choose `age` well beyond the longest a
    /// body runs: a probe that answers for a holder still at work races it
    /// (the resolution and the holder's settle are each applied at most
    /// once, but a release lets a retry run while the slow holder may still
    /// act).
    #[must_use]
    pub fn pending_older_than(mut self, age: Duration) -> Reconciler {
        self.pending_older_than = Some(age);
        self
    }

    /// At most `batch` claims are read, and so probed, per pass (at least
    /// 1).
    #[must_use]
    pub fn batch(mut self, batch: u32) -> Reconciler {
        self.batch = batch.max(1);
        self
    }

    /// The pause between two passes of [`run`](Reconciler::run).
    #[must_use]
    pub fn interval(mut self, interval: Duration) -> Reconciler {
        self.interval = interval;
        self
    }

    /// One pass: reads the next window of up to a batch of claims in doubt
    /// (and stale pending ones, if asked) of the actions that have a probe,
    /// oldest first, from where the last pass stopped; asks the probe of
    /// each whose last unknown is not too recent, up to
    /// [`probe_concurrency`](Reconciler::probe_concurrency) at once; and
    /// resolves each as its probe says. An error of the store ends the
    /// pass; a verdict it could not record is recorded by a later pass,
    /// without asking the probe again. Passes of one reconciler that
    /// overlap (a loop and an admin endpoint) never handle one claim at
    /// the same time: its probe is not asked twice at once. A pass dropped
    /// before it ends cancels the probe under way, as a shutdown does.
    pub async fn reconcile_once(&self) -> Result<Pass, Error> {
        let never = std::future::pending::<()>();
        tokio::pin!(never);
        let mut stop = Stop {
            shutdown: never,
            done: false,
        };
        Ok(self.window(&mut stop).await?.pass)
    }

    /// Runs passes until `shutdown` completes: one every
    /// [`interval`](Reconciler::interval), or sooner while full windows
    /// keep coming; after a store error, with a pause that doubles up to
    /// [`Reconciler::LONGEST_BACKOFF`]. The shutdown is watched between
    /// claims and during each probe (a probe under way is cancelled, its
    /// claim left held); a resolution under way is finished first, so none
    /// is cut in half.
    pub async fn run(&self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut stop = Stop {
            shutdown,
            done: false,
        };
        let mut backoff = self.interval;
        loop {
            let pause = match self.window(&mut stop).await {
                Ok(window) if window.stopped => return,
                Ok(window) => {
                    backoff = self.interval;
                    if window.full {
                        Duration::ZERO
                    } else {
                        self.interval
                    }
                }
                Err(error) => {
                    backoff =
                        (backoff * 2).clamp(Reconciler::FIRST_WAIT, Reconciler::LONGEST_BACKOFF);
                    tracing::warn!(
                        target: "idem",
                        error = %error,
                        pause = ?backoff,
                        "reconciler: the pass failed; trying again after a pause"
                    );
                    backoff
                }
            };
            tokio::select! {
                () = stop.requested() => return,
                () = tokio::time::sleep(pause) => {}
            }
        }
    }

    /// One pass over the next window, watching `stop`: up to
    /// [`probe_concurrency`](Reconciler::probe_concurrency) claims at a
    /// time, so a probe that hangs holds up only its own claim. The cursor
    /// moves past the claims handled in listing order, up to the first one
    /// not handled (the shutdown or a store error came first), which the
    /// next pass starts from.
    async fn window<S: Future<Output = ()>>(
        &self,
        stop: &mut Stop<'_, S>,
    ) -> Result<Window, Error> {
        let rows = self.next_window().await?;
        let full = rows.len() >= self.batch as usize;
        // Every claim under way watches it: the shutdown, or a store error
        // that ends the pass, cancels their probes (a resolution under way
        // is finished), and no further claim starts.
        let ending = CancellationToken::new();
        let cursors: Vec<ReconcileCursor> = rows.iter().map(|row| row.cursor.clone()).collect();
        let handled = futures_util::stream::iter(rows.into_iter().enumerate())
            .map(|(index, to_reconcile)| {
                let ending = &ending;
                async move {
                    let mut pass = Pass::default();
                    if ending.is_cancelled() {
                        return (index, pass, None);
                    }
                    let ToReconcile {
                        claim: row,
                        lease_ran_out,
                        ..
                    } = to_reconcile;
                    let done = self.reconcile(&row, lease_ran_out, &mut pass, ending).await;
                    (index, pass, Some(done))
                }
            })
            .buffer_unordered(self.probe_concurrency);
        tokio::pin!(handled);
        let mut pass = Pass::default();
        let mut finished = vec![false; cursors.len()];
        let mut failed = None;
        loop {
            let next = tokio::select! {
                biased;
                () = stop.requested(), if !ending.is_cancelled() => {
                    ending.cancel();
                    continue;
                }
                next = handled.next() => next,
            };
            let Some((index, done, result)) = next else {
                break;
            };
            pass.add(done);
            match result {
                Some(Ok(())) => finished[index] = true,
                None => {}
                Some(Err(error)) => {
                    ending.cancel();
                    failed.get_or_insert(error);
                }
            }
        }
        let handled_in_order = finished.iter().take_while(|&&finished| finished).count();
        let last = handled_in_order
            .checked_sub(1)
            .and_then(|index| cursors.get(index).cloned());
        let stopped = stop.done;
        if let Some(error) = failed {
            self.advance(last, false);
            return Err(error);
        }
        self.advance(last, !full && !stopped);
        Ok(Window {
            pass,
            full,
            stopped,
        })
    }

    /// Moves the cursor past the last claim handled; when the window
    /// reached the newest claim, starts over.
    fn advance(&self, last: Option<ReconcileCursor>, reached_the_end: bool) {
        let mut memory = self.lock_memory();
        if reached_the_end {
            memory.start_over();
        } else if let Some(last) = last {
            memory.cursor = Some(last);
        }
    }

    /// The next window: claims of actions with a probe, after the cursor.
    async fn next_window(&self) -> Result<Vec<ToReconcile>, Error> {
        let mut actions: Vec<Vec<u8>> = self
            .probes
            .keys()
            .map(|action| operations::action_pattern(Identity::new(action.as_str()).canonical()))
            .collect();
        actions.sort();
        if actions.is_empty() {
            return Ok(Vec::new());
        }
        let after = self.lock_memory().cursor.clone();
        let filter = ReconcileFilter {
            scope: ScopeFilter {
                account: self.account.as_deref(),
                namespace: NamespaceFilter::Any,
            },
            actions: &actions,
            pending_older_than: self.pending_older_than,
            after: after.as_ref(),
            limit: self.batch,
        };
        operations::list_to_reconcile(&self.pool, &filter).await
    }

    /// Establishes and records the outcome of one listed claim: the verdict
    /// the store failed to record last time, or its probe's, unless its
    /// last unknown is too recent.
    async fn reconcile(
        &self,
        row: &ClaimRow,
        lease_ran_out: bool,
        pass: &mut Pass,
        ending: &CancellationToken,
    ) -> Result<(), Error> {
        let key = ClaimKey::of(row);
        let remembered = {
            let mut memory = self.lock_memory();
            let remembered = memory.seen(&key);
            if remembered.busy
                || remembered
                    .wait
                    .is_some_and(|(next, _)| next > Instant::now())
            {
                return Ok(());
            }
            remembered.busy = true;
            remembered.clone()
        };
        // Whichever way this ends (answered, recorded, kept, cancelled with
        // the pass), the claim is no longer being handled.
        let _busy = Busy {
            memory: &self.memory,
            key: &key,
        };
        let Some(mut doubt) = doubt_of(row, lease_ran_out) else {
            // Said once, then left alone for a while: an operator's.
            self.lock_memory().seen(&key).wait = Some((
                Instant::now() + Reconciler::LONGEST_WAIT,
                Reconciler::LONGEST_WAIT,
            ));
            return Ok(());
        };
        let Some((action, probe)) = self.probes.get_key_value(doubt.identity.action()) else {
            // Listed by its action's pattern, so never; counted if it were.
            pass.without_probe += 1;
            return Ok(());
        };
        let pending = operations::pending_steps(&self.pool, row.slot()).await?;
        doubt.steps_in_doubt = pending.iter().map(|step| step.name.clone()).collect();
        let verdict = match remembered.verdict {
            Some(verdict) => verdict,
            None => {
                pass.probed += 1;
                match self.ask(action, probe, doubt, ending).await {
                    Asked::Answered(Verdict::Unknown) => {
                        self.unknown(row, pass, &key, "the probe does not know yet");
                        return Ok(());
                    }
                    Asked::Answered(verdict) => verdict,
                    Asked::Panicked(message) => {
                        pass.panicked += 1;
                        tracing::error!(
                            target: "idem",
                            action = %action,
                            account = %row.account,
                            namespace = row.namespace.as_deref(),
                            address = %row.address,
                            fence = row.fence,
                            panic = %message,
                            "reconciler: the probe panicked; the claim stays held and is probed \
                             again later"
                        );
                        self.unknown(row, pass, &key, "the probe panicked");
                        return Ok(());
                    }
                    Asked::TimedOut => {
                        pass.timed_out += 1;
                        tracing::warn!(
                            target: "idem",
                            action = %action,
                            account = %row.account,
                            address = %row.address,
                            timeout = ?self.probe_timeout,
                            "reconciler: the probe did not answer in time and was cancelled"
                        );
                        self.unknown(row, pass, &key, "the probe did not answer in time");
                        return Ok(());
                    }
                    Asked::Stopped => {
                        pass.probed -= 1;
                        return Ok(());
                    }
                }
            }
        };
        self.record(action, row, &key, verdict, &pending, pass)
            .await
    }

    /// Records `verdict` for the claim in `row`, trying again (a bounded
    /// number of times) when the store fails; a verdict still unrecorded
    /// is kept for the next pass, and the error ends this one.
    async fn record(
        &self,
        action: &str,
        row: &ClaimRow,
        key: &ClaimKey,
        verdict: Verdict,
        pending: &[operations::PendingStep],
        pass: &mut Pass,
    ) -> Result<(), Error> {
        // A verdict on a step first: the claim is released after it, so a
        // retry never meets the step still in doubt.
        match &verdict {
            Verdict::StepSucceeded { step, replay } => {
                let Some(pending) = pending.iter().find(|pending| pending.name == *step) else {
                    tracing::warn!(
                        target: "idem",
                        action,
                        account = %row.account,
                        address = %row.address,
                        step = %step,
                        "reconciler: the probe answered for a step that is not in doubt; the \
                         claim stays held"
                    );
                    self.unknown(row, pass, key, "the probe answered for a step not in doubt");
                    return Ok(());
                };
                operations::resolve_step(&self.pool, row.slot(), pending, replay).await?;
            }
            Verdict::NotHappened => {
                for pending in pending {
                    operations::forget_step(&self.pool, row.slot(), pending).await?;
                }
            }
            _ => {}
        }
        // Unknown records nothing: its claim stays held, as it is.
        let Some(outcome) = verdict.outcome() else {
            return Ok(());
        };
        // The fence, not the state: a probe's answer is about the effect of
        // the action under that fence, whether the claim is still pending or
        // has gone in doubt since it was listed.
        let by = Resolver::new("reconciled").expected_fence(row.fence);
        let mut attempt = 1;
        let resolved = loop {
            match operations::resolve_as(&self.pool, row.slot(), outcome, by).await {
                Ok(resolved) => break resolved,
                Err(error) if attempt >= Reconciler::RESOLVE_ATTEMPTS => {
                    tracing::warn!(
                        target: "idem",
                        action,
                        account = %row.account,
                        address = %row.address,
                        error = %error,
                        "reconciler: the store did not record the probe's verdict; a later \
                         pass records it without asking the probe again"
                    );
                    self.lock_memory().seen(key).verdict = Some(verdict);
                    return Err(error);
                }
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(100) * attempt).await;
                    attempt += 1;
                }
            }
        };
        match resolved {
            Resolved::Changed { .. } => {
                pass.resolved += 1;
                measure::reconciled(action, &row.account, self.labels_account());
            }
            _ => pass.lost += 1,
        }
        self.lock_memory().claims.remove(key);
        Ok(())
    }

    /// Asks `probe` about `doubt`, in a task of its own, for at most the
    /// probe timeout, unless the pass ends first (the shutdown came).
    async fn ask(
        &self,
        action: &str,
        probe: &Probe,
        doubt: Doubt,
        ending: &CancellationToken,
    ) -> Asked {
        // Aborted when dropped: with the pass, should its caller drop it
        // mid-probe, the probe goes too, never left running unbounded.
        let mut task = AbortOnDrop(tokio::spawn(probe(doubt)));
        let joined = tokio::select! {
            biased;
            () = ending.cancelled() => return Asked::Stopped,
            joined = tokio::time::timeout(self.probe_timeout, &mut task.0) => joined,
        };
        match joined {
            Err(_elapsed) => Asked::TimedOut,
            Ok(Ok(verdict)) => Asked::Answered(verdict),
            Ok(Err(error)) if error.is_panic() => {
                Asked::Panicked(panic_message(error.into_panic()))
            }
            // Cancelled from outside (the runtime is shutting down): as if
            // it never answered.
            Ok(Err(_)) => {
                tracing::debug!(target: "idem", action, "reconciler: the probe's task was cancelled");
                Asked::TimedOut
            }
        }
    }

    /// The claim stays held: asked again after a pause that doubles.
    fn unknown(&self, row: &ClaimRow, pass: &mut Pass, key: &ClaimKey, why: &'static str) {
        pass.unknown += 1;
        let mut memory = self.lock_memory();
        let remembered = memory.seen(key);
        let pause = remembered
            .wait
            .map_or(Reconciler::FIRST_WAIT, |(_, pause)| {
                (pause * 2).min(Reconciler::LONGEST_WAIT)
            });
        remembered.wait = Some((Instant::now() + pause, pause));
        tracing::debug!(
            target: "idem",
            account = %row.account,
            namespace = row.namespace.as_deref(),
            address = %row.address,
            fence = row.fence,
            pause = ?pause,
            "reconciler: {why}; the claim stays held"
        );
    }

    /// Whether its metrics carry the label `account`.
    fn labels_account(&self) -> bool {
        #[cfg(feature = "metrics")]
        return self.metrics.labels_account();
        #[cfg(not(feature = "metrics"))]
        false
    }

    fn lock_memory(&self) -> std::sync::MutexGuard<'_, Memory> {
        self.memory.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl fmt::Debug for Reconciler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut actions: Vec<_> = self.probes.keys().collect();
        actions.sort();
        f.debug_struct("Reconciler")
            .field("account", &self.account)
            .field("probes", &actions)
            .field("pending_older_than", &self.pending_older_than)
            .field("batch", &self.batch)
            .field("interval", &self.interval)
            .field("probe_timeout", &self.probe_timeout)
            .field("probe_concurrency", &self.probe_concurrency)
            .finish_non_exhaustive()
    }
}

/// A probe's task, aborted when this is dropped (a no-op once it ended).
struct AbortOnDrop(tokio::task::JoinHandle<Verdict>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The text a panic carried, if it carried text.
fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(text) => *text,
        Err(payload) => payload.downcast_ref::<&str>().map_or_else(
            || "a panic without a message".to_owned(),
            |text| (*text).to_owned(),
        ),
    }
}

/// A claim row as its probe sees it; `None` (with a warning) for an
/// identity this build cannot read back. A pending claim whose lease ran
/// out (`lease_ran_out`) got there as one turned in doubt by it did, so it
/// says `lease_expired` too: the row keeps no reason while pending.
fn doubt_of(row: &ClaimRow, lease_ran_out: bool) -> Option<Doubt> {
    let identity = match Identity::from_canonical(&row.identity) {
        Ok(identity) => identity,
        Err(error) => {
            tracing::warn!(
                target: "idem",
                account = %row.account,
                address = %row.address,
                error = %error,
                "reconciler: the claim's identity does not read back; left for an operator"
            );
            return None;
        }
    };
    let since_epoch = Duration::from_micros(u64::try_from(row.created_micros).unwrap_or(0));
    Some(Doubt {
        identity,
        account: row.account.clone(),
        namespace: row.namespace.clone(),
        address: row.address.clone(),
        fence: row.fence,
        state: row.state,
        reason: if lease_ran_out {
            Some(store::LEASE_EXPIRED.to_owned())
        } else {
            row.state_reason.clone()
        },
        claimed_at: SystemTime::UNIX_EPOCH + since_epoch,
        steps_in_doubt: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_action_pattern_matches_its_identities_only() {
        let pattern = operations::action_pattern(Identity::new("a_%\\b").canonical());
        // Every `\`, `%`, `_` of the encoding is escaped, and one `%` ends it.
        let unescaped = pattern
            .iter()
            .zip(pattern.iter().skip(1))
            .filter(|(before, byte)| **before != b'\\' && matches!(**byte, b'%' | b'_'))
            .count();
        assert_eq!(unescaped, 1, "{pattern:?}");
        assert_eq!(pattern.last(), Some(&b'%'));
        // A length byte that is `%` (37) or `_` (95) is escaped too.
        for length in [37, 92, 95] {
            let action = "x".repeat(length);
            let canonical = Identity::new(action.as_str());
            let pattern = operations::action_pattern(canonical.canonical());
            let canonical = canonical.canonical().len();
            assert_eq!(pattern.len(), canonical + 2, "length {length}");
        }
    }

    fn key(address: &str, fence: i64) -> ClaimKey {
        ClaimKey {
            account: "acme".into(),
            namespace: None,
            address: address.into(),
            fence,
        }
    }

    #[test]
    fn the_memory_forgets_what_a_whole_cycle_did_not_list() {
        let mut memory = Memory::default();
        memory.seen(&key("claim_a", 1)).wait = Some((Instant::now(), Reconciler::LONGEST_WAIT));
        memory.seen(&key("claim_b", 2)).verdict = Some(Verdict::Failed);
        memory.start_over();
        // Cycle 1 lists only claim_a: claim_b (resolved, released) goes.
        memory.seen(&key("claim_a", 1));
        memory.start_over();
        assert_eq!(memory.claims.len(), 1);
        assert!(memory.claims.contains_key(&key("claim_a", 1)));
        assert!(memory.cursor.is_none());
        memory.start_over();
        assert!(memory.claims.is_empty());
    }

    #[test]
    fn a_claim_made_anew_at_an_address_starts_without_its_predecessors_back_off() {
        let mut memory = Memory::default();
        let pause = Reconciler::LONGEST_WAIT;
        memory.seen(&key("claim_a", 1)).wait = Some((Instant::now() + pause, pause));
        let fresh = memory.seen(&key("claim_a", 7));
        assert!(fresh.wait.is_none() && fresh.verdict.is_none());
    }

    #[test]
    fn a_panic_message_is_read_whatever_its_payload() {
        assert_eq!(panic_message(Box::new("static text")), "static text");
        assert_eq!(panic_message(Box::new(String::from("owned"))), "owned");
        assert_eq!(panic_message(Box::new(7_u8)), "a panic without a message");
    }
}
