//! The gate: claim before the body, settle after success, release after failure.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;

use crate::error::{Error, Rejected};
use crate::identity::Identity;
use crate::observe::{self, GateEvent};
use crate::schema;
use crate::store::{self, Scope};

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
    pool: PgPool,
    account: Arc<str>,
    namespace: Option<Arc<str>>,
}

/// How often a claim re-tries when the slot it lost is free again by the time
/// it looks (the holder failed and released in between).
const CLAIM_ATTEMPTS: usize = 3;

/// Pauses between attempts to record an outcome (settle or release), which
/// are idempotent and worth a retry when a pooled connection died under them.
const RECORD_BACKOFF: [Duration; 2] = [Duration::from_millis(25), Duration::from_millis(100)];

impl Gate {
    /// The account a gate starts in.
    pub const DEFAULT_ACCOUNT: &'static str = "default";

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
        if let Some(problems) = schema::verify(&pool).await? {
            return Err(Error::Schema(problems));
        }
        Ok(Gate {
            pool,
            account: Arc::from(Gate::DEFAULT_ACCOUNT),
            namespace: None,
        })
    }

    /// A copy of this gate scoped to `account`. Claims of one account never
    /// block or see another's.
    #[must_use = "`account` returns a scoped copy and leaves this gate as it was"]
    pub fn account(&self, account: impl AsRef<str>) -> Gate {
        Gate {
            account: Arc::from(account.as_ref()),
            ..self.clone()
        }
    }

    /// A copy of this gate scoped to `namespace` within its account.
    #[must_use = "`namespace` returns a scoped copy and leaves this gate as it was"]
    pub fn namespace(&self, namespace: impl AsRef<str>) -> Gate {
        Gate {
            namespace: Some(Arc::from(namespace.as_ref())),
            ..self.clone()
        }
    }

    /// A copy of this gate with no namespace (the default).
    #[must_use = "`without_namespace` returns a scoped copy and leaves this gate as it was"]
    pub fn without_namespace(&self) -> Gate {
        Gate {
            namespace: None,
            ..self.clone()
        }
    }

    /// The account this gate claims in.
    pub fn account_name(&self) -> &str {
        &self.account
    }

    /// The namespace this gate claims in, if any.
    pub fn namespace_name(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    /// The pool the gate uses.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    fn scope(&self) -> Scope<'_> {
        Scope {
            account: &self.account,
            namespace: self.namespace.as_deref(),
        }
    }

    /// PostgreSQL `text` cannot hold NUL; everything else is a fine name.
    fn check_scope(&self) -> Result<(), Rejected> {
        let names = [
            ("account", Some(&*self.account)),
            ("namespace", self.namespace.as_deref()),
        ];
        for (scope, name) in names {
            if let Some(name) = name.filter(|name| name.contains('\0')) {
                return Err(Rejected::InvalidScope {
                    scope,
                    name: name.to_owned(),
                });
            }
        }
        Ok(())
    }

    /// Claims the slot of `identity`: inserts a pending row, autocommitted.
    ///
    /// `Ok` means this caller won and must run the action, then
    /// [`Claim::settle`] or [`Claim::release`] it. A conflict is refused with
    /// [`Rejected::InFlight`] or [`Rejected::AlreadyDone`]; a store error with
    /// [`Rejected::Unavailable`] (fail closed). An absent identity (a `None`
    /// key part) yields an ungated claim whose settle and release do nothing.
    pub async fn claim(&self, identity: &Identity) -> Result<Claim, Rejected> {
        if identity.is_absent() {
            tracing::info!(
                target: "idem",
                account = %self.account,
                namespace = self.namespace.as_deref(),
                action = identity.action(),
                absent_part = identity.first_absent_part(),
                "ungated: a key part is None, so there is no slot to claim and the body runs unguarded"
            );
            observe::record(GateEvent::Ungated);
            return Ok(Claim { held: None });
        }
        let address = identity.address();
        self.check_scope()
            .inspect_err(|rejected| self.refused(identity, &address, rejected))?;
        let scope = self.scope();
        for _ in 0..CLAIM_ATTEMPTS {
            let won = store::insert_pending(&self.pool, scope, &address, identity.canonical())
                .await
                .map_err(|error| self.unavailable(identity, &address, error))?;
            if won {
                tracing::debug!(
                    target: "idem",
                    account = %self.account,
                    namespace = self.namespace.as_deref(),
                    action = identity.action(),
                    address = %address,
                    "claim won"
                );
                observe::record(GateEvent::Won);
                return Ok(Claim {
                    held: Some(Held {
                        gate: self.clone(),
                        action: identity.action().into(),
                        address,
                    }),
                });
            }
            // Lost: the lookup is only here to tell the caller why.
            let existing = store::lookup(&self.pool, scope, &address)
                .await
                .map_err(|error| self.unavailable(identity, &address, error))?;
            let Some(existing) = existing else {
                // The holder failed and released between our insert and our
                // lookup: the slot is free again, so try to win it.
                continue;
            };
            let rejected = if existing.identity != identity.canonical() {
                Rejected::Collision {
                    address: address.clone(),
                }
            } else if existing.settled {
                Rejected::AlreadyDone
            } else {
                Rejected::InFlight
            };
            self.refused(identity, &address, &rejected);
            return Err(rejected);
        }
        // The slot changed hands on every attempt: somebody is working on it.
        self.refused(identity, &address, &Rejected::InFlight);
        Err(Rejected::InFlight)
    }

    /// Runs `body` if this call wins the claim on `identity`: settles the
    /// claim when the body returns `Ok`, releases it when the body returns
    /// `Err` (so a retry can run), and refuses duplicates with
    /// [`Rejected`] converted into `E`.
    ///
    /// The body is not polled unless the claim is won. If it panics, or its
    /// future is dropped, the claim stays pending: the outcome is unknown, so
    /// retries are refused (fail closed). If recording the success fails, the
    /// body's `Ok` value is still returned, the claim stays pending, and a
    /// tracing error says so.
    pub async fn run<T, E, F>(&self, identity: &Identity, body: F) -> Result<T, E>
    where
        F: Future<Output = Result<T, E>>,
        E: From<Rejected>,
    {
        crate::expansion::run(self, identity, body).await
    }

    fn refused(&self, identity: &Identity, address: &str, rejected: &Rejected) {
        tracing::info!(
            target: "idem",
            account = %self.account,
            namespace = self.namespace.as_deref(),
            action = identity.action(),
            address,
            reason = rejected.reason(),
            "claim refused: {rejected}"
        );
        observe::record(GateEvent::Refused(rejected.clone()));
    }

    fn unavailable(&self, identity: &Identity, address: &str, error: sqlx::Error) -> Rejected {
        tracing::error!(
            target: "idem",
            account = %self.account,
            namespace = self.namespace.as_deref(),
            action = identity.action(),
            address,
            error = %error,
            "store unavailable; failing closed, the body does not run"
        );
        let rejected = Rejected::unavailable(error);
        observe::record(GateEvent::Refused(rejected.clone()));
        rejected
    }
}

impl fmt::Debug for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gate")
            .field("account", &self.account)
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

/// A won slot (or, for an absent identity, no slot at all). Record the
/// outcome with [`settle`](Claim::settle) or [`release`](Claim::release);
/// dropping it unresolved leaves the row pending, which refuses every retry
/// until an operator (or, later, a lease) resolves it.
#[must_use = "a claim must be settled or released; dropped, it keeps its slot pending forever"]
pub struct Claim {
    held: Option<Held>,
}

struct Held {
    gate: Gate,
    action: Arc<str>,
    address: String,
}

impl Claim {
    /// `false` for the claim of an absent identity: nothing was claimed.
    pub fn is_gated(&self) -> bool {
        self.held.is_some()
    }

    /// The claimed address, if anything was claimed.
    pub fn address(&self) -> Option<&str> {
        self.held.as_ref().map(|held| held.address.as_str())
    }

    /// Records success: the row becomes `success` and keeps the slot forever.
    ///
    /// On error the row stays `pending` (fail closed): retries are refused
    /// rather than risk running the action twice.
    pub async fn settle(mut self) -> Result<(), Rejected> {
        let Some(held) = self.held.take() else {
            return Ok(());
        };
        let pool = &held.gate.pool;
        let scope = held.gate.scope();
        let settled = with_retries(|| store::settle(pool, scope, &held.address)).await;
        let settled = match settled {
            // A retried settle may find its own earlier attempt committed.
            Ok(false) => store::lookup(pool, scope, &held.address)
                .await
                .map(|row| row.is_some_and(|row| row.settled)),
            other => other,
        };
        match settled {
            Ok(true) => {
                held.event(tracing::Level::DEBUG, "settled", None);
                Ok(())
            }
            Ok(false) => {
                let lost = Rejected::ClaimLost {
                    address: held.address.clone(),
                };
                held.event(
                    tracing::Level::ERROR,
                    "settle found no pending claim",
                    Some(&lost),
                );
                Err(lost)
            }
            Err(error) => {
                let unavailable = Rejected::unavailable(error);
                held.event(
                    tracing::Level::ERROR,
                    "settle failed; the slot stays pending (fail closed) until resolved",
                    Some(&unavailable),
                );
                Err(unavailable)
            }
        }
    }

    /// Records failure: the row is deleted, so a retry can run the action.
    ///
    /// On error the row stays `pending` (fail closed).
    pub async fn release(mut self) -> Result<(), Rejected> {
        let Some(held) = self.held.take() else {
            return Ok(());
        };
        let pool = &held.gate.pool;
        let scope = held.gate.scope();
        match with_retries(|| store::release(pool, scope, &held.address)).await {
            // `false`: already gone, perhaps by an earlier attempt. The slot is free.
            Ok(_) => {
                held.event(tracing::Level::DEBUG, "released", None);
                Ok(())
            }
            Err(error) => {
                let unavailable = Rejected::unavailable(error);
                held.event(
                    tracing::Level::ERROR,
                    "release failed; the slot stays pending (fail closed) until resolved",
                    Some(&unavailable),
                );
                Err(unavailable)
            }
        }
    }
}

impl Held {
    fn event(&self, level: tracing::Level, message: &str, rejected: Option<&Rejected>) {
        let account = &*self.gate.account;
        let namespace = self.gate.namespace.as_deref();
        let action = &*self.action;
        let address = &*self.address;
        let error = rejected.map(tracing::field::display);
        match level {
            tracing::Level::ERROR => tracing::error!(
                target: "idem", account, namespace, action, address, error, "{message}"
            ),
            tracing::Level::WARN => tracing::warn!(
                target: "idem", account, namespace, action, address, error, "{message}"
            ),
            _ => tracing::debug!(
                target: "idem", account, namespace, action, address, error, "{message}"
            ),
        }
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if let Some(held) = &self.held {
            held.event(
                tracing::Level::WARN,
                "claim dropped before its outcome was recorded (panic, cancellation or \
                 a forgotten settle); the slot stays pending and refuses retries",
                None,
            );
        }
    }
}

impl fmt::Debug for Claim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Claim")
            .field("address", &self.address())
            .finish()
    }
}

/// Runs an idempotent store operation, retrying when the connection failed
/// under it (a killed backend, a restarting server), not when the pool was
/// closed on purpose.
async fn with_retries<T, F, Fut>(mut operation: F) -> Result<T, sqlx::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, sqlx::Error>>,
{
    let mut backoff = RECORD_BACKOFF.iter();
    loop {
        match operation().await {
            Err(error) if is_transient(&error) => match backoff.next() {
                Some(pause) => tokio::time::sleep(*pause).await,
                None => return Err(error),
            },
            done => return done,
        }
    }
}

/// Errors that a fresh connection may not meet again.
fn is_transient(error: &sqlx::Error) -> bool {
    match error {
        // Not PoolTimedOut: the pool has already waited its whole acquire timeout.
        sqlx::Error::Io(_) | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            // 08: connection exception; 57P01-57P03: shutdown, crash, starting up;
            // 40001/40P01: serialization failure, deadlock.
            code.starts_with("08") || code.starts_with("57P") || code == "40001" || code == "40P01"
        }),
        _ => false,
    }
}
