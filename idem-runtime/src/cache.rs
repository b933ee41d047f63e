//! A local cache of settled outcomes (feature `cache`): a duplicate of an
//! action this process has seen settled, or failed for good, is answered
//! with no round trip to PostgreSQL.
//!
//! In idem a settled success (with its value to replay, if any) and a kept
//! failure never change while their row exists. A process that has seen
//! one can therefore refuse (or replay to) the next duplicate by itself,
//! in microseconds instead of a round trip. The cache is opt-in, per gate:
//! [`Gate::with_cache`](crate::Gate::with_cache) returns a copy of the gate
//! that uses it (and every [`account`](crate::Gate::account) or
//! [`namespace`](crate::Gate::namespace) copy made from that one shares it:
//! an entry is keyed by account, namespace and address, so it never answers
//! across them). [`Gate::without_cache`](crate::Gate::without_cache) opts
//! one action (or one call) out.
//!
//! ```no_run
//! # async fn demo(pool: idem_runtime::sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use idem_runtime::cache::OutcomeCache;
//! use idem_runtime::{Gate, Identity, Rejected};
//!
//! let cache = OutcomeCache::builder()
//!     .max_entries(100_000)
//!     .max_bytes(64 << 20)
//!     .ttl(Duration::from_secs(300))
//!     .build();
//! let gate = Gate::connect(pool).await?.with_cache(cache);
//! let id = Identity::new("charge").part("ord_1001");
//!
//! let first: Result<&str, Rejected> = gate.run(&id, async { Ok("charged") }).await;
//! assert_eq!(first?, "charged");
//! // Answered from the cache: no statement is sent.
//! let again: Result<&str, Rejected> = gate.run(&id, async { Ok("charged") }).await;
//! assert!(matches!(again, Err(Rejected::AlreadyDone)));
//! # Ok(()) }
//! ```
//!
//! # What it holds
//!
//! Only final facts: settled successes (with their value to replay, when
//! known) and kept failures ([`Disposition::Keep`](crate::Disposition)),
//! never a claim pending, in flight or in doubt. An entry is made when the
//! store tells a claim the slot is settled or failed, and when this
//! process's own settle (or kept failure) commits on the gate's pool;
//! never from a settle inside the caller's transaction
//! ([`Claim::settle_in`](crate::Claim::settle_in), `in_transaction`), which
//! may still roll back, nor from a row read inside one.
//!
//! A hit is judged by exactly the rules a row read from the store is: a
//! different identity at the same address is a
//! [`Rejected::Collision`](crate::Rejected::Collision), a different
//! fingerprint [`Rejected::KeyReused`](crate::Rejected::KeyReused), and a
//! kept value is replayed only to a caller whose payload is known to match.
//! A replaying caller that meets an entry made without the value (read by
//! a caller that did not replay) asks the store, and the entry is replaced
//! by one that knows it. A hit reports the same
//! [`GateEvent`](crate::GateEvent) a refusal from the store does, and its
//! tracing event carries `cached = true`.
//!
//! # Bounds, and what the time to live means
//!
//! The cache holds at most [`max_entries`](OutcomeCacheBuilder::max_entries)
//! entries and about [`max_bytes`](OutcomeCacheBuilder::max_bytes) bytes
//! (keys, identities, fingerprints and replay values), evicting the least
//! useful first, and forgets each entry [`ttl`](OutcomeCacheBuilder::ttl)
//! after it was learned (a hit does not extend it).
//!
//! The time to live bounds how long a change the store's rules allow,
//! made elsewhere, goes unseen by this process:
//!
//! - **Pruning** (`idem prune`,
//!   [`operations::prune`](crate::operations::prune)) deletes settled rows,
//!   after which a retry runs the action again. A process that cached one
//!   of them keeps refusing its duplicates for up to its TTL after the
//!   prune. Prune only what can no longer be retried (as without a cache),
//!   or call [`OutcomeCache::clear`] after pruning.
//! - **Resolving by hand** (`idem claims resolve`,
//!   [`operations::resolve`](crate::operations::resolve)) changes only
//!   claims pending or in doubt, which are never cached: every gate sees a
//!   resolution at its next call. The one exception is a success settled
//!   with [`OutcomeCommit::Async`](crate::OutcomeCommit) and lost in a
//!   server crash (the row reads as pending again, though the action
//!   succeeded): a process that cached it answers "already done" for up to
//!   its TTL, whatever the row is resolved as.
//! - **Deleting rows by hand** (or restoring an older backup) is pruning:
//!   bounded by the TTL too.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::settled::{Fact, Final, Replay};

/// What every entry costs besides its heap bytes: the key's and the value's
/// fixed parts and the cache's own bookkeeping, roughly.
const ENTRY_OVERHEAD_BYTES: u64 = 160;

/// The longest time to live taken: the cache refuses longer ones, and no
/// answer should outlive this by far.
const MAX_TTL: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// A bounded, expiring cache of settled outcomes, shared by the gates it is
/// given to (cloning it is cheap and shares the entries). See the
/// [module documentation](self).
#[derive(Clone)]
pub struct OutcomeCache {
    // Behind one pointer: every gate and every claim it hands out carries
    // an `Option` of it.
    shared: Arc<Shared>,
}

struct Shared {
    entries: moka::sync::Cache<Key, Arc<Final>>,
    ttl: Duration,
}

/// Where a final fact was found: it answers only there.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    pub(crate) account: Arc<str>,
    pub(crate) namespace: Option<Arc<str>>,
    pub(crate) address: Box<str>,
}

impl Key {
    fn heap_bytes(&self) -> usize {
        self.account.len() + self.namespace.as_deref().map_or(0, str::len) + self.address.len()
    }
}

/// Builds an [`OutcomeCache`]; see [`OutcomeCache::builder`].
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct OutcomeCacheBuilder {
    max_entries: u64,
    max_bytes: u64,
    ttl: Duration,
}

impl OutcomeCache {
    /// At most 10,000 entries and 16 MiB, each kept one minute, unless
    /// the builder says otherwise.
    pub fn builder() -> OutcomeCacheBuilder {
        OutcomeCacheBuilder {
            max_entries: 10_000,
            max_bytes: 16 << 20,
            ttl: Duration::from_secs(60),
        }
    }

    /// How long an entry is kept after it was learned.
    pub fn ttl(&self) -> Duration {
        self.shared.ttl
    }

    /// How many entries the cache holds, once the evictions and expiries
    /// it has pending are done (it does them lazily, as it is used).
    pub fn entry_count(&self) -> u64 {
        self.shared.entries.run_pending_tasks();
        self.shared.entries.entry_count()
    }

    /// Forgets every entry: for a process that has just pruned claims (or
    /// been told so) and wants its gates to see it at once.
    pub fn clear(&self) {
        self.shared.entries.invalidate_all();
        self.shared.entries.run_pending_tasks();
    }

    /// The final fact known for `key`, if any.
    pub(crate) fn recall(&self, key: &Key) -> Option<Arc<Final>> {
        self.shared.entries.get(key)
    }

    /// Remembers `fact` for `key`, unless it would forget a replay value
    /// already known there for the same identity and fingerprint (a caller
    /// that does not replay reads the row without it).
    pub(crate) fn remember(&self, key: Key, fact: Final) {
        if matches!(fact.fact, Fact::Success(Replay::Unknown))
            && self.shared.entries.get(&key).is_some_and(|known| {
                matches!(known.fact, Fact::Success(Replay::Known(_)))
                    && known.identity == fact.identity
                    && known.fingerprint == fact.fingerprint
            })
        {
            return;
        }
        self.shared.entries.insert(key, Arc::new(fact));
    }
}

impl OutcomeCacheBuilder {
    /// Holds at most `entries` outcomes (0: none at all).
    pub fn max_entries(mut self, entries: u64) -> OutcomeCacheBuilder {
        self.max_entries = entries;
        self
    }

    /// Holds at most about `bytes` bytes: each entry counts its account,
    /// namespace, address, identity, fingerprint and replay value, plus a
    /// fixed overhead. An entry larger than this is not kept.
    pub fn max_bytes(mut self, bytes: u64) -> OutcomeCacheBuilder {
        self.max_bytes = bytes;
        self
    }

    /// Forgets each entry `ttl` after it was learned; a hit does not extend
    /// it. This bounds how long a pruned row (or one deleted by hand) can
    /// still be answered from the cache. At most 100 years.
    pub fn ttl(mut self, ttl: Duration) -> OutcomeCacheBuilder {
        self.ttl = ttl;
        self
    }

    /// The cache.
    pub fn build(self) -> OutcomeCache {
        let ttl = self.ttl.min(MAX_TTL);
        // One capacity bounds both: each entry weighs its bytes, but never
        // less than its share of the capacity among `max_entries`, so that
        // neither bound can be passed. (A weight is a `u32`: a share larger
        // than that lowers the capacity to keep the count bounded.)
        let capacity = self
            .max_bytes
            .min(self.max_entries.saturating_mul(u64::from(u32::MAX)));
        let share = capacity.div_ceil(self.max_entries.max(1)).max(1);
        let entries = moka::sync::Cache::builder()
            .max_capacity(capacity)
            .time_to_live(ttl)
            .weigher(move |key: &Key, fact: &Arc<Final>| {
                let bytes = u64::try_from(key.heap_bytes() + fact.heap_bytes())
                    .unwrap_or(u64::MAX)
                    .saturating_add(ENTRY_OVERHEAD_BYTES);
                u32::try_from(bytes.max(share)).unwrap_or(u32::MAX)
            })
            .build();
        OutcomeCache {
            shared: Arc::new(Shared { entries, ttl }),
        }
    }
}

impl fmt::Debug for OutcomeCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutcomeCache")
            .field("ttl", &self.shared.ttl)
            .field("entries", &self.shared.entries.entry_count())
            .field("weighted_bytes", &self.shared.entries.weighted_size())
            .finish_non_exhaustive()
    }
}
