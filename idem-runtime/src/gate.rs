//! The gate: the public face of the claim loop. Claim before the body,
//! settle after success, release after failure.
//!
//! The reading path goes down from here: [`run`](crate::run) (the loop),
//! [`acquire`](crate::acquire) (winning a slot), [`claim`](crate::claim)
//! (the won slot's handle), [`store`](crate::store) (the SQL).

use std::fmt;

use sqlx::PgPool;

use crate::acquire::{Acquired, acquire};
use crate::claim::Claim;
use crate::detach::{self, Detached};
use crate::error::{Error, Rejected};
use crate::identity::Identity;
use crate::mode::{Disposed, Mode, OnUnavailable};
use crate::run::{self, outcome_of, replayed_outcome_of};
use crate::schema;
use crate::scoped_pool::{self, ScopedPool};
use crate::via::Via;

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

    /// [`claim`](Gate::claim) with the opt-in modes of `mode`: a lease, a
    /// wait for an in-flight duplicate, a payload fingerprint, failing open.
    /// A duplicate of a settled action is refused with
    /// [`Rejected::AlreadyDone`]; to get its stored value instead, use
    /// [`run_replayed`](Gate::run_replayed).
    #[deprecated(
        note = "use `gate.guard(&identity)`, the mode's options as its methods (`.lease(..)`, `.wait(..)`, ...), then `.claim()`"
    )]
    pub async fn claim_with(&self, identity: &Identity, mode: &Mode) -> Result<Claim, Rejected> {
        match acquire(
            &self.slots,
            identity,
            mode,
            false,
            &mut Via::Pool(self.pool()),
        )
        .await?
        {
            Acquired::Won(claim) => Ok(claim),
            Acquired::Settled(_) => Err(Rejected::AlreadyDone),
        }
    }

    /// [`claim_with`](Gate::claim_with) inside the caller's transaction on
    /// `connection`: the claim, the body's own writes and the settle (with
    /// [`Claim::settle_in`]) commit together or not at all.
    ///
    /// A concurrent duplicate in another transaction waits for this one to
    /// finish, then is refused if it committed, or claims the slot if it
    /// rolled back. Under `REPEATABLE READ` or `SERIALIZABLE`, such a
    /// duplicate fails with a serialization error instead, reported as
    /// [`Rejected::Unavailable`]: retry its whole transaction.
    ///
    /// A `mode` with a [lease](Mode::lease), a [wait](Mode::wait) or
    /// [`OnUnavailable::Run`] is refused with [`Rejected::InvalidOption`]
    /// before any statement (as `#[idempotent]` refuses them beside `tx` at
    /// compile time): inside the transaction the claim is invisible until it
    /// commits, so duplicates already wait for it, no lease can run out,
    /// and a store that is down has taken the transaction with it.
    ///
    /// Record the outcome of such a claim inside the same transaction, with
    /// [`Claim::settle_in`], [`Claim::release_in`] or [`Claim::dispose_in`]:
    /// [`Claim::settle`] and its kin would wait on the row this open
    /// transaction holds, so they fail at once, naming the method to call.
    #[deprecated(
        note = "use `gate.guard(&identity).tx(&mut *tx).claim()`: its `TxClaim` records on the transaction, and `tx` with a lease, a wait or fail-open does not compile"
    )]
    pub async fn claim_in(
        &self,
        connection: &mut sqlx::PgConnection,
        identity: &Identity,
        mode: &Mode,
    ) -> Result<Claim, Rejected> {
        refuse_outside_a_transaction(mode)?;
        let via = &mut Via::Transaction(connection);
        match acquire(&self.slots, identity, mode, false, via).await? {
            Acquired::Won(claim) => Ok(claim),
            Acquired::Settled(_) => Err(Rejected::AlreadyDone),
        }
    }

    /// Runs `body` if this call wins the claim on `identity`: settles the
    /// claim when the body returns `Ok`, releases it when the body returns
    /// `Err` (so a retry can run), and refuses duplicates with
    /// [`Rejected`] converted into `E`.
    ///
    /// The body is not polled unless the claim is won. If it panics, or its
    /// future is dropped, the claim stays pending: the outcome is unknown, so
    /// retries are refused (fail closed). If the store fails to record the
    /// success, the body's `Ok` value is still returned, the claim stays
    /// pending, and a tracing error says so. If the claim was no longer this
    /// call's when the body succeeded (its lease ran out and another call
    /// took it over, or someone released it), the success is still kept in
    /// the slot, but the call returns [`Rejected::LeaseLost`] or
    /// [`Rejected::ClaimLost`] instead of the value: another call may have
    /// run the action too, so check the side effect before acting on it.
    /// If somebody else recorded the claim's outcome meanwhile (a reconciler
    /// or an operator resolved it, an earlier holder's late success settled
    /// it), the call returns [`Rejected::NotRecorded`]: the slot keeps that
    /// outcome, and every duplicate is told it, not this body's value. So
    /// does an `Err` that was to hold the slot ([`Disposition::Keep`](crate::Disposition::Keep) or
    /// [`Disposition::InDoubt`](crate::Disposition::InDoubt), with a guard's
    /// [`disposition`](crate::Guard::disposition));
    /// an `Err` that releases it said nothing happened, and is returned as
    /// it is.
    ///
    /// It is [`guard`](Gate::guard) with no option, then `run(body)`: for
    /// every option the attribute has, build the guard.
    pub async fn run<T, E, F>(&self, identity: &Identity, body: F) -> Result<T, E>
    where
        F: Future<Output = Result<T, E>>,
        E: From<Rejected>,
    {
        self.guard(identity).run(body).await
    }

    /// [`run`](Gate::run) with the opt-in modes of `mode`.
    #[deprecated(
        note = "use `gate.guard(&identity)`, the mode's options as its methods (`.lease(..)`, `.wait(..)`, ...), then `.run(body)`"
    )]
    pub async fn run_with<T, E, F>(&self, identity: &Identity, mode: &Mode, body: F) -> Result<T, E>
    where
        F: Future<Output = Result<T, E>>,
        E: From<Rejected>,
    {
        run::run(&self.slots, identity, mode, outcome_of(), body).await
    }

    /// [`run_with`](Gate::run_with), with a body that runs to completion
    /// whatever its caller does: the claim, the body and the record run as
    /// a task of `detached`'s, so dropping this future (a client that
    /// disconnected, a timeout around it, a `select!` that chose another
    /// branch) does not cancel the body wherever it was. Its outcome is
    /// recorded as `run_with` records it, and a retry gets it (here:
    /// [`Rejected::AlreadyDone`] after a success, a run after a failure).
    ///
    /// A body that runs on past [`detached.bound()`](Detached::bound)
    /// after its caller left is stopped and its claim held in doubt
    /// (`state_reason` [`detach::PAST_BOUND`](crate::detach::PAST_BOUND)),
    /// never released; so are those still running when
    /// [`Detached::shutdown`]'s grace runs out. A body that panics holds
    /// its claim in doubt ([`detach::PANICKED`](crate::detach::PANICKED))
    /// and the panic is resumed here if the caller is still waiting. The
    /// body must be `'static + Send` (it outlives the call); it needs a
    /// tokio runtime.
    ///
    /// Without it, a dropped [`run`](Gate::run) future cancels the body
    /// at its next `.await` and leaves the claim `pending`: refusing every
    /// retry until its lease runs out (or forever, without one).
    ///
    /// ```no_run
    /// # async fn demo(gate: idem_runtime::Gate) -> Result<(), idem_runtime::Rejected> {
    /// use idem_runtime::{Detached, Identity, Mode};
    ///
    /// let detached = Detached::new(); // one per service; await its shutdown
    /// let id = Identity::new("charge").part("ord_1001");
    /// let receipt: Result<String, idem_runtime::Rejected> = gate
    ///     .run_detached(&id, &Mode::new(), &detached, async move { Ok("r_1".to_owned()) })
    ///     .await;
    /// # let _ = receipt?; Ok(()) }
    /// ```
    #[deprecated(note = "use `gate.guard(&identity).run_detached(&detached, body)`")]
    pub async fn run_detached<T, E, F>(
        &self,
        identity: &Identity,
        mode: &Mode,
        detached: &Detached,
        body: F,
    ) -> Result<T, E>
    where
        F: Future<Output = Result<T, E>> + Send + 'static,
        T: Send + 'static,
        E: From<Rejected> + Send + 'static,
    {
        detach::run_detached(
            detached,
            self.slots.clone(),
            identity.clone(),
            mode.clone(),
            outcome_of(),
            body,
        )
        .await
    }

    /// [`run_with`](Gate::run_with), recording each failure as its error
    /// says ([`Disposed`]): released (a retry runs), kept as a definite
    /// failure (duplicates are refused [`Rejected::AlreadyFailed`]), or
    /// held in doubt (duplicates are refused [`Rejected::InDoubt`] until a
    /// reconciler or an operator resolves it). A panic or a dropped future
    /// leaves the claim pending, which is in doubt too: retries are refused
    /// until its lease (if any) runs out.
    #[deprecated(note = "use `gate.guard(&identity).disposition(E::disposition).run(body)`")]
    pub async fn run_disposed<T, E, F>(
        &self,
        identity: &Identity,
        mode: &Mode,
        body: F,
    ) -> Result<T, E>
    where
        F: Future<Output = Result<T, E>>,
        E: From<Rejected> + Disposed,
    {
        let outcome = outcome_of().disposed_by(run::disposition_by_trait::<T, E>);
        run::run(&self.slots, identity, mode, outcome, body).await
    }

    /// [`run_with`](Gate::run_with), keeping the `Ok` value (as JSON, in the
    /// same statement as the settle) so that a later duplicate returns it
    /// without running the body. A duplicate while the first is in flight is
    /// still refused (or waits, with [`Mode::wait`]).
    ///
    /// The value is kept as the text `serde_json` writes, so any value it can
    /// write is kept (NUL characters too). A value that fails to serialize,
    /// or that the store refuses (larger than PostgreSQL takes), never loses
    /// the success: the claim is settled without a value, a tracing error
    /// says so, and duplicates are refused with [`Rejected::AlreadyDone`].
    /// So is a duplicate whose stored value no longer deserializes into `T`,
    /// and one whose fingerprint differs in presence from the stored one (a
    /// value goes only to a caller that gave the same fingerprint, or that
    /// gave none when none was stored).
    #[deprecated(note = "use `gate.guard(&identity).replay().run(body)`")]
    pub async fn run_replayed<T, E, F>(
        &self,
        identity: &Identity,
        mode: &Mode,
        body: F,
    ) -> Result<T, E>
    where
        F: Future<Output = Result<T, E>>,
        T: serde::Serialize + serde::de::DeserializeOwned,
        E: From<Rejected>,
    {
        run::run(&self.slots, identity, mode, replayed_outcome_of(), body).await
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

/// Refuses the options of `mode` a claim inside the caller's transaction
/// cannot honour ([`Gate::claim_in`] says why), naming the first found.
fn refuse_outside_a_transaction(mode: &Mode) -> Result<(), Rejected> {
    let refused = if let Some(lease) = mode.lease_duration() {
        Some(("lease", format!("{lease:?}")))
    } else if let Some(wait) = mode.wait_duration() {
        Some(("wait", format!("{wait:?}")))
    } else if mode.on_unavailable_policy() == OnUnavailable::Run {
        Some(("on_unavailable", "Run".to_owned()))
    } else {
        None
    };
    match refused {
        Some((option, value)) => Err(Rejected::InvalidOption {
            option,
            value,
            reason: "a claim inside the caller's transaction (claim_in) is invisible until the \
                     transaction commits, so duplicates already wait for it, no lease can run \
                     out, and a store that is down has taken the transaction with it; drop the \
                     option, or claim outside the transaction with claim_with",
        }),
        None => Ok(()),
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
