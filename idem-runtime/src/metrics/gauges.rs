//! The claim gauges: what is stuck, from one query on an interval the
//! application opts into.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use ::metrics::{Label, gauge};
use sqlx::PgPool;

use super::names;
use crate::error::Error;
use crate::store::gauges::{ClaimGauges, claim_gauges};

/// Samples the claim gauges (`idem_stale_pending_claims`,
/// `idem_claims_in_doubt` and the oldest ages) with one query, on an
/// interval.
///
/// The counters tell what happened; these tell what is stuck now: claims
/// pending longer than any body should run (a holder that crashed without
/// a lease) and claims in doubt (refused until resolved). The query reads
/// every open claim of one account, or of every account, through the index
/// of open claims (schema version 9), never the successes; that is still a
/// pass over every claim pending, in doubt or kept failed, so sample every
/// minute or so, not per request, and from one process, not from each
/// replica.
///
/// ```no_run
/// # async fn demo(pool: idem_runtime::sqlx::PgPool) -> Result<(), idem_runtime::Error> {
/// use std::time::Duration;
/// use idem_runtime::metrics::Gauges;
///
/// let gauges = Gauges::new(pool, Duration::from_secs(600)).account("acme");
/// let sample = gauges.sample_once().await?; // sets the gauges, and says what it read
/// if sample.in_doubt > 0 {
///     println!("{} claims in doubt, the oldest for {:?}", sample.in_doubt, sample.oldest_in_doubt_age);
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Gauges {
    pool: PgPool,
    account: Option<String>,
    pending_older_than: Duration,
    interval: Duration,
}

/// What one [`Gauges::sample_once`] read, as it set the gauges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct GaugeSample {
    /// Pending claims older than [`Gauges::new`]'s `pending_older_than`.
    pub stale_pending: u64,
    /// Claims in doubt.
    pub in_doubt: u64,
    /// The age of the oldest pending claim, if any.
    pub oldest_pending_age: Option<Duration>,
    /// How long the oldest claim in doubt has been in doubt, if any.
    pub oldest_in_doubt_age: Option<Duration>,
}

impl Gauges {
    /// Gauges over every account of the store `pool` reaches, counting as
    /// stale the pending claims older than `pending_older_than` (choose it
    /// beyond the longest a body runs, e.g. the longest lease), sampled
    /// every 60 seconds by [`run`](Gauges::run).
    pub fn new(pool: PgPool, pending_older_than: Duration) -> Gauges {
        Gauges {
            pool,
            account: None,
            pending_older_than,
            interval: Duration::from_secs(60),
        }
    }

    /// Only the claims of `account`; the gauges then carry the label
    /// `account`.
    #[must_use]
    pub fn account(mut self, account: impl Into<String>) -> Gauges {
        self.account = Some(account.into());
        self
    }

    /// The pause between two samples of [`run`](Gauges::run).
    #[must_use]
    pub fn interval(mut self, interval: Duration) -> Gauges {
        self.interval = interval;
        self
    }

    /// Reads the gauges with one query and sets them in the recorder.
    /// An error of the store leaves them as they were.
    pub async fn sample_once(&self) -> Result<GaugeSample, Error> {
        let read = claim_gauges(
            &self.pool,
            self.account.as_deref(),
            self.pending_older_than.as_secs_f64(),
        )
        .await?;
        let sample = GaugeSample::from(read);
        self.set(&sample);
        Ok(sample)
    }

    /// Samples until `shutdown` completes: one every
    /// [`interval`](Gauges::interval); after a store error (said once per
    /// failure by tracing), the gauges keep their last values until the
    /// next sample.
    pub async fn run(&self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        loop {
            if let Err(error) = self.sample_once().await {
                tracing::warn!(
                    target: "idem",
                    account = self.account.as_deref(),
                    error = %error,
                    "gauges: the sample failed; the gauges keep their last values"
                );
            }
            tokio::select! {
                () = &mut shutdown => return,
                () = tokio::time::sleep(self.interval) => {}
            }
        }
    }

    fn set(&self, sample: &GaugeSample) {
        let labels: Vec<Label> = self
            .account
            .iter()
            .map(|account| Label::new(names::ACCOUNT, account.clone()))
            .collect();
        let seconds = |age: Option<Duration>| age.map_or(0.0, |age| age.as_secs_f64());
        // Counts far beyond 2^53 lose their last digits as f64: harmless.
        #[allow(clippy::cast_precision_loss)]
        let (stale_pending, in_doubt) = (sample.stale_pending as f64, sample.in_doubt as f64);
        gauge!(names::STALE_PENDING_CLAIMS, labels.clone()).set(stale_pending);
        gauge!(names::CLAIMS_IN_DOUBT, labels.clone()).set(in_doubt);
        gauge!(names::OLDEST_PENDING_CLAIM_AGE_SECONDS, labels.clone())
            .set(seconds(sample.oldest_pending_age));
        gauge!(names::OLDEST_IN_DOUBT_CLAIM_AGE_SECONDS, labels)
            .set(seconds(sample.oldest_in_doubt_age));
    }
}

impl From<ClaimGauges> for GaugeSample {
    fn from(read: ClaimGauges) -> GaugeSample {
        // The database's clock may run behind the row's: an age below zero
        // is none.
        let age = |seconds: Option<f64>| {
            seconds.map(|seconds| Duration::try_from_secs_f64(seconds).unwrap_or(Duration::ZERO))
        };
        GaugeSample {
            stale_pending: u64::try_from(read.pending_older).unwrap_or(0),
            in_doubt: u64::try_from(read.in_doubt).unwrap_or(0),
            oldest_pending_age: age(read.oldest_pending_seconds),
            oldest_in_doubt_age: age(read.oldest_in_doubt_seconds),
        }
    }
}

impl fmt::Debug for Gauges {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gauges")
            .field("account", &self.account)
            .field("pending_older_than", &self.pending_older_than)
            .field("interval", &self.interval)
            .finish_non_exhaustive()
    }
}
