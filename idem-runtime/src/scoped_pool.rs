//! Where a gate claims: a pool, and the scope (an account and an optional
//! namespace) its claims are made in, with what was read once about the
//! store the pool reaches.
//!
//! The gate's public API, its run loop and every claim it hands out carry
//! one of these. It sits below them all, so that none of them needs the
//! [`Gate`](crate::Gate) type itself to reach the store.

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;

use crate::attach::InFlight;
#[cfg(feature = "cache")]
use crate::cache::{Key, KeyRef, OutcomeCache};
use crate::error::Rejected;
#[cfg(feature = "metrics")]
use crate::metrics::MetricsOptions;
use crate::settled::Final;
use crate::store::{Engine, Scope};
use crate::wakeup::Wakeups;

/// The longest account or namespace name, in bytes. Both lead the unique
/// indexes, whose entries PostgreSQL caps at about 2.7 kB; a longer name
/// could never be claimed.
pub(crate) const MAX_NAME_BYTES: usize = 1024;

/// How long a step's record waits for the run's next statement to carry
/// it (`step::Carried`), unless the gate says otherwise: long enough for a
/// body's next step or its outcome to follow at once, short enough that a
/// process killed meanwhile rarely leaves a finished step in doubt.
pub(crate) const STEP_RECORD_WAIT: Duration = Duration::from_millis(20);

/// A pool plus the scope claims are made in (and the gate's cache and
/// metrics options, which every scoped copy shares). Cloning is cheap.
#[derive(Clone)]
pub(crate) struct ScopedPool {
    pool: PgPool,
    /// What the table is on, read once when the gate connected: it picks
    /// the claim statement's shape.
    engine: Engine,
    account: Arc<str>,
    namespace: Option<Arc<str>>,
    /// Final outcomes this process has seen, answered without a round
    /// trip; shared by every scoped copy (its key includes the scope).
    #[cfg(feature = "cache")]
    cache: Option<OutcomeCache>,
    /// Which store the pool reaches (cluster, database, table), read once
    /// when the gate connected: a cache shared with gates on other stores
    /// never answers from theirs (its key includes this).
    /// (An `Arc<String>`, one pointer wide: every claim carries its scoped pool.)
    #[cfg(feature = "cache")]
    store: Arc<String>,
    /// How this gate's metrics are labelled.
    #[cfg(feature = "metrics")]
    metrics: MetricsOptions,
    /// How long a finished step's record may wait to ride with the run's
    /// next statement (`Gate::with_step_record_wait`).
    step_record_wait: Duration,
    /// The claims this process holds in flight, which a waiting duplicate
    /// attaches to instead of polling; shared by every scoped copy (keyed
    /// by fence, unique across the table).
    in_flight: Arc<InFlight>,
    /// The duplicates of this process waiting on claims of other
    /// processes, and the listener that wakes them; shared likewise.
    wakeups: Wakeups,
}

impl ScopedPool {
    pub(crate) fn new(pool: PgPool, engine: Engine, account: &str) -> ScopedPool {
        ScopedPool {
            pool,
            engine,
            account: Arc::from(account),
            namespace: None,
            #[cfg(feature = "cache")]
            cache: None,
            #[cfg(feature = "cache")]
            store: Arc::default(),
            #[cfg(feature = "metrics")]
            metrics: MetricsOptions::new(),
            step_record_wait: STEP_RECORD_WAIT,
            in_flight: Arc::default(),
            wakeups: Wakeups::default(),
        }
    }

    /// The claims this process holds in flight on this gate.
    pub(crate) fn in_flight(&self) -> &Arc<InFlight> {
        &self.in_flight
    }

    /// The waiters of this process on claims of other processes.
    pub(crate) fn wakeups(&self) -> &Wakeups {
        &self.wakeups
    }

    pub(crate) fn with_step_record_wait(&self, wait: Duration) -> ScopedPool {
        ScopedPool {
            step_record_wait: wait,
            ..self.clone()
        }
    }

    pub(crate) fn step_record_wait(&self) -> Duration {
        self.step_record_wait
    }

    /// This scoped pool, in the store named `store` (see [`Key::store`]).
    #[cfg(feature = "cache")]
    pub(crate) fn in_store(self, store: String) -> ScopedPool {
        ScopedPool {
            store: Arc::new(store),
            ..self
        }
    }

    #[cfg(feature = "metrics")]
    pub(crate) fn with_metrics(&self, metrics: MetricsOptions) -> ScopedPool {
        ScopedPool {
            metrics,
            ..self.clone()
        }
    }

    #[cfg(feature = "metrics")]
    pub(crate) fn metrics(&self) -> MetricsOptions {
        self.metrics
    }

    /// The account, shared: a metric's label takes it without copying.
    #[cfg(feature = "metrics")]
    pub(crate) fn shared_account(&self) -> &Arc<str> {
        &self.account
    }

    #[cfg(feature = "cache")]
    pub(crate) fn with_cache(&self, cache: Option<OutcomeCache>) -> ScopedPool {
        ScopedPool {
            cache,
            ..self.clone()
        }
    }

    #[cfg(feature = "cache")]
    pub(crate) fn cache(&self) -> Option<&OutcomeCache> {
        self.cache.as_ref()
    }

    pub(crate) fn in_account(&self, account: &str) -> ScopedPool {
        ScopedPool {
            account: Arc::from(account),
            ..self.clone()
        }
    }

    pub(crate) fn in_namespace(&self, namespace: Option<&str>) -> ScopedPool {
        ScopedPool {
            namespace: namespace.map(Arc::from),
            ..self.clone()
        }
    }

    pub(crate) fn pool(&self) -> &PgPool {
        &self.pool
    }

    pub(crate) fn engine(&self) -> Engine {
        self.engine
    }

    pub(crate) fn account(&self) -> &str {
        &self.account
    }

    pub(crate) fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    /// The scope as the store's statements take it.
    pub(crate) fn scope(&self) -> Scope<'_> {
        Scope {
            account: &self.account,
            namespace: self.namespace.as_deref(),
        }
    }

    /// Refuses names no claim could be made under, as an error of the
    /// request ([`Rejected::InvalidScope`]) rather than a store outage:
    /// PostgreSQL `text` cannot hold NUL, and an index entry has a size cap.
    pub(crate) fn check(&self) -> Result<(), Rejected> {
        let names = [
            ("account", Some(self.account())),
            ("namespace", self.namespace()),
        ];
        for (scope, name) in names {
            let Some(name) = name else { continue };
            let reason = if name.contains('\0') {
                "it contains a NUL character, which PostgreSQL text cannot hold"
            } else if name.len() > MAX_NAME_BYTES {
                "it is longer than 1024 bytes, more than a unique index entry can hold"
            } else {
                continue;
            };
            return Err(Rejected::InvalidScope {
                scope,
                name: name.to_owned(),
                reason,
            });
        }
        Ok(())
    }

    /// The final fact this process knows for `address` in this scope, if
    /// it caches outcomes and knows one.
    #[cfg(feature = "cache")]
    pub(crate) fn recall(&self, address: &str) -> Option<Arc<Final>> {
        self.cache.as_ref()?.recall(&KeyRef {
            store: &self.store,
            account: &self.account,
            namespace: self.namespace.as_deref(),
            address,
        })
    }

    /// Remembers a final fact for `address` in this scope, if this gate
    /// caches outcomes. `fact` is made only then.
    #[cfg(feature = "cache")]
    pub(crate) fn remember(&self, address: &str, fact: impl FnOnce() -> Option<Final>) {
        if let Some(cache) = &self.cache
            && let Some(fact) = fact()
        {
            cache.remember(self.key(address), fact);
        }
    }

    #[cfg(feature = "cache")]
    fn key(&self, address: &str) -> Key {
        Key {
            store: Arc::clone(&self.store),
            account: Arc::clone(&self.account),
            namespace: self.namespace.clone(),
            address: address.into(),
        }
    }

    /// Without the `cache` feature nothing is ever known.
    #[cfg(not(feature = "cache"))]
    pub(crate) fn recall(&self, _address: &str) -> Option<Arc<Final>> {
        None
    }

    /// Without the `cache` feature nothing is remembered.
    #[cfg(not(feature = "cache"))]
    pub(crate) fn remember(&self, _address: &str, _fact: impl FnOnce() -> Option<Final>) {}
}
