//! The gate: a pool and a scope (account, namespace), where every guard
//! starts. Claim before the body, settle after success, release after
//! failure.
//!
//! The reading path goes down from its [`guard`](crate::guard) (the
//! options): [`run`](crate::run) (the loop), [`acquire`](crate::acquire)
//! (winning a slot), [`claim`](crate::claim) (the won slot's handle),
//! [`store`](crate::store) (the SQL).

use std::fmt;
use std::time::Duration;

use sqlx::PgPool;

use crate::claim::Claim;
use crate::error::{Error, Rejected};
use crate::identity::Identity;
use crate::schema;
use crate::scoped_pool::{self, ScopedPool};

/// Runs actions at most once per identity, with PostgreSQL as the arbiter.
///
/// A gate is a pool plus a scope: an account (tenant) and an optional
/// namespace. [`Gate::account`] and [`Gate::namespace`] return scoped copies;
/// cloning is cheap and every copy shares the pool.
///
/// ```no_run
/// # async fn demo(pool: idem_runtime::sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// use idem_runtime::{Gate, Identity, Rejected};
///
/// let gate = Gate::connect(pool).await?; // sets up and verifies the schema
/// let id = Identity::new("charge").part("ord_1001").part(4_999);
///
/// let receipt: Result<&str, Rejected> = gate.run(&id, async { Ok("charged") }).await;
/// assert_eq!(receipt?, "charged");
/// assert!(matches!(gate.run(&id, async { Ok("again") }).await, Err(Rejected::AlreadyDone)));
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Gate {
    slots: ScopedPool,
}

impl Gate {
    /// The account a gate starts in.
    pub const DEFAULT_ACCOUNT: &'static str = "default";

    /// The longest account or namespace name, in bytes. Both lead the unique
    /// indexes, whose entries PostgreSQL caps at about 2.7 kB; a longer name
    /// could never be claimed, so it is refused as
    /// [`Rejected::InvalidScope`] rather than reported as an outage.
    pub const MAX_SCOPE_NAME_BYTES: usize = scoped_pool::MAX_NAME_BYTES;

    /// Sets up idem's schema if needed, verifies it, and returns a gate in the
    /// default account with no namespace.
    ///
    /// Fails with [`Error::Schema`], naming what is missing, when
    /// `idem_records` lacks either partial unique index or its predicate:
    /// a gate without them would let duplicates through.
    pub async fn connect(pool: PgPool) -> Result<Gate, Error> {
        schema::set_up(&pool).await?;
        Gate::connect_without_setup(pool).await
    }

    /// Verifies the schema without ever running DDL: for run-time roles
    /// without DDL rights, and for users who apply
    /// [`SCHEMA_SQL`](crate::schema::SCHEMA_SQL) with their own migrations.
    pub async fn connect_without_setup(pool: PgPool) -> Result<Gate, Error> {
        let (problems, engine) = schema::verify_for_gate(&pool).await?;
        if let Some(problems) = problems {
            return Err(Error::Schema(problems));
        }
        let slots = ScopedPool::new(pool, engine, Gate::DEFAULT_ACCOUNT);
        #[cfg(feature = "cache")]
        let slots = {
            let store = cached_store(&slots).await?;
            slots.in_store(store)
        };
        Ok(Gate { slots })
    }

    /// A copy of this gate scoped to `account`. Claims of one account never
    /// block or see another's.
    #[must_use = "`account` returns a scoped copy and leaves this gate as it was"]
    pub fn account(&self, account: impl AsRef<str>) -> Gate {
        Gate {
            slots: self.slots.in_account(account.as_ref()),
        }
    }

    /// A copy of this gate scoped to `namespace` within its account.
    #[must_use = "`namespace` returns a scoped copy and leaves this gate as it was"]
    pub fn namespace(&self, namespace: impl AsRef<str>) -> Gate {
        Gate {
            slots: self.slots.in_namespace(Some(namespace.as_ref())),
        }
    }

    /// A copy of this gate with no namespace (the default).
    #[must_use = "`without_namespace` returns a scoped copy and leaves this gate as it was"]
    pub fn without_namespace(&self) -> Gate {
        Gate {
            slots: self.slots.in_namespace(None),
        }
    }

    /// A copy of this gate that answers duplicates of outcomes it has seen
    /// settled (or failed for good) from `cache`, with no round trip. Its
    /// [`account`](Gate::account) and [`namespace`](Gate::namespace)
    /// copies share the cache: an entry answers only in the scope it was
    /// learned in, and only on the store (cluster, database, schema) this
    /// gate connected to, so one cache may serve gates on several stores.
    /// See [`cache`](crate::cache) for what it holds and what
    /// pruning means for it.
    #[cfg(feature = "cache")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cache")))]
    #[must_use = "`with_cache` returns a copy and leaves this gate as it was"]
    pub fn with_cache(&self, cache: crate::cache::OutcomeCache) -> Gate {
        Gate {
            slots: self.slots.with_cache(Some(cache)),
        }
    }

    /// A copy of this gate that neither asks nor fills an outcome cache:
    /// for an action whose settled rows are pruned or deleted while its
    /// duplicates may still come, so that they must be seen at once.
    #[cfg(feature = "cache")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cache")))]
    #[must_use = "`without_cache` returns a copy and leaves this gate as it was"]
    pub fn without_cache(&self) -> Gate {
        Gate {
            slots: self.slots.with_cache(None),
        }
    }

    /// The outcome cache this gate answers from, if any.
    #[cfg(feature = "cache")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cache")))]
    pub fn outcome_cache(&self) -> Option<&crate::cache::OutcomeCache> {
        self.slots.cache()
    }

    /// A copy of this gate whose metrics are labelled as `options` say
    /// (every gate counts; see [`metrics`](crate::metrics) for the metrics
    /// and their labels). Its [`account`](Gate::account) and
    /// [`namespace`](Gate::namespace) copies keep the options.
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    #[must_use = "`with_metrics` returns a copy and leaves this gate as it was"]
    pub fn with_metrics(&self, options: crate::metrics::MetricsOptions) -> Gate {
        Gate {
            slots: self.slots.with_metrics(options),
        }
    }

    /// How this gate's metrics are labelled.
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn metrics_options(&self) -> crate::metrics::MetricsOptions {
        self.slots.metrics()
    }

    /// A copy of this gate whose steps' records wait at most `wait` to ride
    /// with the run's next statement (20 ms unless set; see
    /// [`step`](crate::step), **Cost**). Its [`account`](Gate::account) and
    /// [`namespace`](Gate::namespace) copies keep it.
    ///
    /// Longer suits a body that does work of its own between steps: its
    /// records still ride with the next step, so N steps keep costing
    /// N + 2 statements. `Duration::ZERO` writes every record on its own
    /// as the step ends (2N + 2 statements): no moment in which a process
    /// killed after a step leaves that step in doubt rather than recorded.
    /// Either way nothing runs twice: a step whose record never landed is
    /// held in doubt, as one cut off inside it.
    #[must_use = "`with_step_record_wait` returns a copy and leaves this gate as it was"]
    pub fn with_step_record_wait(&self, wait: Duration) -> Gate {
        Gate {
            slots: self.slots.with_step_record_wait(wait),
        }
    }

    /// The account this gate claims in.
    pub fn account_name(&self) -> &str {
        self.slots.account()
    }

    /// The namespace this gate claims in, if any.
    pub fn namespace_name(&self) -> Option<&str> {
        self.slots.namespace()
    }

    /// The pool the gate uses.
    pub fn pool(&self) -> &PgPool {
        self.slots.pool()
    }

    /// Where this gate claims, for the run loop and the glue.
    pub(crate) fn slots(&self) -> &ScopedPool {
        &self.slots
    }

    /// Refuses an account or namespace no claim could be made under
    /// ([`Rejected::InvalidScope`]).
    pub(crate) fn check_scope(&self) -> Result<(), Rejected> {
        self.slots.check()
    }

    /// Claims the slot of `identity`: inserts a pending row, autocommitted.
    ///
    /// `Ok` means this caller won and must run the action, then
    /// [`Claim::settle`] or [`Claim::release`] it. A conflict is refused with
    /// [`Rejected::InFlight`] or [`Rejected::AlreadyDone`]; a store error with
    /// [`Rejected::Unavailable`] (fail closed). An absent identity (a `None`
    /// key part) yields an ungated claim whose settle and release do nothing.
    ///
    /// It is [`guard`](Gate::guard) with no option, then `claim()`: for a
    /// lease, a wait, a fingerprint, replay or a claim inside a
    /// transaction, build the guard.
    pub async fn claim(&self, identity: &Identity) -> Result<Claim, Rejected> {
        self.guard(identity).claim().await
    }

    /// Runs `body` if this call wins the claim on `identity`: settles the
    /// claim when the body returns `Ok`, releases it when the body returns
    /// `Err` (so a retry can run), and refuses duplicates with
    /// [`Rejected`] converted into `E`.
    ///
    /// It is [`guard`](Gate::guard) with no option, then
    /// [`run(body)`](crate::Guard::run), whose docs say what happens when
    /// the body panics, its future is dropped, the store fails to record
    /// the outcome, or somebody else recorded it meanwhile.
    pub async fn run<T, E, F>(&self, identity: &Identity, body: F) -> Result<T, E>
    where
        F: Future<Output = Result<T, E>>,
        E: From<Rejected>,
    {
        self.guard(identity).run(body).await
    }
}

/// The identity of the store `slots` reach, keying the outcome cache's
/// entries. An engine that cannot say which cluster it is (no
/// `pg_control_system`) gets one of its own for this gate alone: its
/// entries then answer only this gate and its scoped copies, never a gate
/// connected elsewhere.
#[cfg(feature = "cache")]
async fn cached_store(slots: &ScopedPool) -> Result<String, Error> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static UNNAMED: AtomicU64 = AtomicU64::new(0);
    match crate::store::store_id::store_id(slots.pool()).await {
        Ok(store) => Ok(store),
        Err(error) if crate::fault::classify(&error) == crate::fault::Fault::Outage => {
            Err(Error::Database(error))
        }
        Err(error) => {
            tracing::debug!(
                target: "idem",
                error = %error,
                "the store cannot say which cluster it is; its outcome cache entries answer \
                 this gate only"
            );
            Ok(format!(
                "unnamed/{}",
                UNNAMED.fetch_add(1, Ordering::Relaxed)
            ))
        }
    }
}

impl fmt::Debug for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gate")
            .field("account", &self.account_name())
            .field("namespace", &self.namespace_name())
            .finish_non_exhaustive()
    }
}
