//! Establishing outcomes nobody knows: the application's probes, run over
//! claims in doubt (and, if asked, over pending claims old enough that their
//! holder is presumed gone).
//!
//! A body that cannot tell whether its effect happened (a payment call that
//! timed out) returns an error of [`Disposition::InDoubt`]; a lease that
//! runs out under [`OnExpiry::InDoubt`] does the same for a holder that
//! vanished. Either way the slot is held and duplicates are refused, never
//! run. A [`Reconciler`] finds those claims, asks the probe registered for
//! their action what really happened (the payment provider, by a reference
//! derived from the key), and resolves each as the probe says: settled (with
//! the value to replay), kept failed, or released for a retry.
//!
//! Each resolution is one compare-and-swap on the fence the reconciler saw
//! ([`operations::resolve_as`]): two reconcilers, or a reconciler racing the
//! original holder's late settle, resolve a claim exactly once, and nothing
//! ever overwrites a success.
//!
//! [`Disposition::InDoubt`]: crate::Disposition::InDoubt
//! [`OnExpiry::InDoubt`]: crate::OnExpiry::InDoubt

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use sqlx::PgPool;

use crate::error::Error;
use crate::identity::Identity;
use crate::measure;
#[cfg(feature = "metrics")]
use crate::metrics::MetricsOptions;
use crate::store::operations::{
    self, ClaimRow, ClaimState, ListFilter, NamespaceFilter, Resolution, Resolved, Resolver,
    ScopeFilter,
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
    /// [`ClaimState::InDoubt`], or [`ClaimState::Pending`] for a claim older
    /// than [`Reconciler::pending_older_than`].
    pub state: ClaimState,
    /// How it got there: `body_in_doubt` (its body said so),
    /// `lease_expired` (its holder vanished under `on_expiry = "in_doubt"`);
    /// `None` for a pending claim.
    pub reason: Option<String>,
    /// When it was claimed, by the database's clock.
    pub claimed_at: SystemTime,
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
    /// invocation runs the action.
    NotHappened,
    /// Still unknown: the claim stays held, and is probed again later, each
    /// time after a longer pause.
    Unknown,
}

impl Verdict {
    /// The effect happened; nothing to replay.
    pub fn succeeded() -> Verdict {
        Verdict::Succeeded { replay: None }
    }

    /// The effect happened, and `value` is the `Ok` value duplicates of a
    /// `replay` function get back: it must read back as that function's
    /// `Ok` type.
    pub fn succeeded_with<T: serde::Serialize + ?Sized>(
        value: &T,
    ) -> Result<Verdict, serde_json::Error> {
        Ok(Verdict::Succeeded {
            replay: Some(serde_json::to_string(value)?),
        })
    }
}

/// What one [`Reconciler::reconcile_once`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Pass {
    /// Claims whose probe was asked.
    pub probed: usize,
    /// Claims this pass resolved (settled, kept failed or released).
    pub resolved: usize,
    /// Claims whose probe said [`Verdict::Unknown`]: still held.
    pub unknown: usize,
    /// Claims resolved meanwhile by someone else (another reconciler, an
    /// operator, the holder's late settle): left as they are.
    pub lost: usize,
    /// Claims of actions with no probe registered: left for an operator.
    pub without_probe: usize,
}

type Probe = Arc<dyn Fn(Doubt) -> Pin<Box<dyn Future<Output = Verdict> + Send>> + Send + Sync>;

/// Runs the application's probes over claims nobody knows the outcome of.
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
    /// Claims whose probe said unknown: when to ask again, and the pause
    /// after that.
    waiting: Mutex<HashMap<String, (Instant, Duration)>>,
    /// How its `reconciled` outcomes are labelled.
    #[cfg(feature = "metrics")]
    metrics: MetricsOptions,
}

impl Reconciler {
    /// The first pause before a claim whose probe said unknown is probed
    /// again; each further unknown doubles it, up to [`Reconciler::LONGEST_WAIT`].
    pub const FIRST_WAIT: Duration = Duration::from_secs(1);
    /// The longest pause between two probes of one claim.
    pub const LONGEST_WAIT: Duration = Duration::from_secs(300);
    /// The longest pause between passes after the store failed.
    pub const LONGEST_BACKOFF: Duration = Duration::from_secs(60);

    /// A reconciler over every account of the store `pool` reaches, with no
    /// probe yet, batches of 100 and a pass every 10 seconds.
    pub fn new(pool: PgPool) -> Reconciler {
        Reconciler {
            pool,
            account: None,
            probes: HashMap::new(),
            pending_older_than: None,
            batch: 100,
            interval: Duration::from_secs(10),
            waiting: Mutex::new(HashMap::new()),
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
    /// left for an operator (`idem claims resolve`).
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

    /// Also probes `pending` claims created longer than `age` ago, whose
    /// holder is presumed gone (crashed without a lease). Choose `age` well
    /// beyond the longest a body runs: a probe that answers for a holder
    /// still at work races it (the resolution and the holder's settle are
    /// each applied at most once, but a release lets a retry run while the
    /// slow holder may still act).
    #[must_use]
    pub fn pending_older_than(mut self, age: Duration) -> Reconciler {
        self.pending_older_than = Some(age);
        self
    }

    /// At most `batch` claims are probed per pass (at least 1).
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

    /// One pass: finds up to a batch of claims in doubt (and stale pending
    /// ones, if asked) whose action has a probe and whose last unknown is
    /// not too recent, asks their probes one after the other, and resolves
    /// each as its probe says. An error of the store ends the pass.
    pub async fn reconcile_once(&self) -> Result<Pass, Error> {
        let mut pass = Pass::default();
        let candidates = self.candidates().await?;
        let now = Instant::now();
        for row in candidates {
            if pass.probed == self.batch as usize {
                break;
            }
            let key = waiting_key(&row);
            if self
                .lock_waiting()
                .get(&key)
                .is_some_and(|(next, _)| *next > now)
            {
                continue;
            }
            let Some(doubt) = doubt_of(&row) else {
                // Said once, then left alone for a while: an operator's.
                self.lock_waiting().insert(
                    key,
                    (now + Reconciler::LONGEST_WAIT, Reconciler::LONGEST_WAIT),
                );
                continue;
            };
            let Some((action, probe)) = self.probes.get_key_value(doubt.identity.action()) else {
                pass.without_probe += 1;
                continue;
            };
            pass.probed += 1;
            let verdict = probe(doubt).await;
            let resolution = match &verdict {
                Verdict::Succeeded { replay } => Resolution::Succeeded {
                    output_json: replay.as_deref(),
                },
                Verdict::Failed => Resolution::Failed,
                Verdict::NotHappened => Resolution::Release,
                Verdict::Unknown => {
                    pass.unknown += 1;
                    self.wait_longer(key);
                    tracing::debug!(
                        target: "idem",
                        account = %row.account,
                        namespace = row.namespace.as_deref(),
                        address = %row.address,
                        fence = row.fence,
                        "reconciler: the probe does not know yet; the claim stays held"
                    );
                    continue;
                }
            };
            let by = Resolver {
                reason: "reconciled",
                expected_fence: Some(row.fence),
            };
            match operations::resolve_as(&self.pool, row.slot(), resolution, by).await? {
                Resolved::Changed { .. } => {
                    pass.resolved += 1;
                    measure::reconciled(action, &row.account, self.labels_account());
                }
                _ => pass.lost += 1,
            }
            self.lock_waiting().remove(&key);
        }
        Ok(pass)
    }

    /// Runs passes until `shutdown` completes: one every
    /// [`interval`](Reconciler::interval), or sooner while full batches
    /// keep coming; after a store error, with a pause that doubles up to
    /// [`Reconciler::LONGEST_BACKOFF`]. A pass under way when `shutdown`
    /// completes is finished first, so no resolution is cut in half.
    pub async fn run(&self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut backoff = self.interval;
        loop {
            let pause = match self.reconcile_once().await {
                Ok(pass) => {
                    backoff = self.interval;
                    if pass.probed == self.batch as usize {
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
                () = &mut shutdown => return,
                () = tokio::time::sleep(pause) => {}
            }
        }
    }

    /// Claims in doubt, then stale pending ones, oldest first.
    async fn candidates(&self) -> Result<Vec<ClaimRow>, Error> {
        // More than a batch: some are waiting after an unknown, or have no
        // probe here.
        let limit = self.batch.saturating_mul(4);
        let scope = ScopeFilter {
            account: self.account.as_deref(),
            namespace: NamespaceFilter::Any,
        };
        let mut rows = operations::list(
            &self.pool,
            &ListFilter {
                scope,
                state: Some(ClaimState::InDoubt),
                older_than: None,
                limit,
            },
        )
        .await?;
        if let Some(age) = self.pending_older_than {
            let pending = ListFilter {
                scope,
                state: Some(ClaimState::Pending),
                older_than: Some(age),
                limit,
            };
            rows.extend(operations::list(&self.pool, &pending).await?);
        }
        rows.sort_by_key(|row| row.created_micros);
        Ok(rows)
    }

    /// Whether its metrics carry the label `account`.
    fn labels_account(&self) -> bool {
        #[cfg(feature = "metrics")]
        return self.metrics.labels_account();
        #[cfg(not(feature = "metrics"))]
        false
    }

    fn wait_longer(&self, key: String) {
        let mut waiting = self.lock_waiting();
        let pause = waiting
            .get(&key)
            .map_or(Reconciler::FIRST_WAIT, |(_, pause)| {
                (*pause * 2).min(Reconciler::LONGEST_WAIT)
            });
        waiting.insert(key, (Instant::now() + pause, pause));
    }

    fn lock_waiting(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Instant, Duration)>> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
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
            .finish_non_exhaustive()
    }
}

/// A claim row as its probe sees it; `None` (with a warning) for an
/// identity this build cannot read back.
fn doubt_of(row: &ClaimRow) -> Option<Doubt> {
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
        state: ClaimState::parse(&row.state).unwrap_or(ClaimState::InDoubt),
        reason: row.state_reason.clone(),
        claimed_at: SystemTime::UNIX_EPOCH + since_epoch,
    })
}

fn waiting_key(row: &ClaimRow) -> String {
    format!(
        "{}\u{0}{}\u{0}{}",
        row.account,
        row.namespace.as_deref().unwrap_or("\u{0}"),
        row.address
    )
}
