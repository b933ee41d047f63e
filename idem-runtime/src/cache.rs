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
//! an entry is keyed by store, account, namespace and address, so it never
//! answers across them). The store is the cluster, the database and the
//! `idem_records` table a gate's pool reaches, read once by
//! [`Gate::connect`](crate::Gate::connect): one cache may be shared by
//! gates on several databases, schemas or servers, and answers each only
//! from what it learned there. [`Gate::without_cache`](crate::Gate::without_cache) opts
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
//! (a guard's [`tx`](crate::Guard::tx), `in_transaction`), which
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
//! `testing::GateEvent` a refusal from the store does, and its
//! tracing event carries `cached = true`.
//!
//! # Bounds, and what the time to live means
//!
//! The cache holds at most [`max_entries`](OutcomeCacheBuilder::max_entries)
//! entries and about [`max_bytes`](OutcomeCacheBuilder::max_bytes) bytes
//! (keys, identities, fingerprints and replay values), evicting the least
//! useful first, and forgets each entry [`ttl`](OutcomeCacheBuilder::ttl)
//! after it was learned (a hit does not extend it). The capacity is split
//! among a few shards (each of at least 1 MiB, or all of `max_bytes` when
//! that is less), so that concurrent lookups rarely meet on one lock; an
//! entry heavier than its shard (a value to replay of more than about a
//! MiB) is not kept, and its duplicates ask the store. Keys spread over
//! the shards by their hash, not evenly, so a full cache may evict a few
//! percent before it holds `max_entries`: size it with room to spare.
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
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::settled::{Fact, Final, StoredOutput};

/// What every entry costs besides its heap bytes: the key's and the value's
/// fixed parts and the cache's own bookkeeping, roughly.
const ENTRY_OVERHEAD_BYTES: u64 = 160;

/// The least capacity a shard of the cache gets: the largest entry always
/// kept (a value to replay of up to about this size), unless `max_bytes`
/// is smaller.
const MIN_SHARD_BYTES: u64 = 1 << 20;

/// The most shards: enough that threads rarely meet on one lock.
const MAX_SHARDS: usize = 32;

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
    entries: quick_cache::sync::Cache<Key, Entry, Weight>,
    ttl: Duration,
}

/// A final fact, and when this process learned it: the time to live is
/// counted from then, and checked when the entry is read.
#[derive(Clone)]
struct Entry {
    fact: Arc<Final>,
    learned: Instant,
}

/// What an entry weighs against the capacity: its bytes, but never less
/// than its share of the capacity among `max_entries`, so that neither
/// bound can be passed.
#[derive(Clone)]
struct Weight {
    share: u64,
}

impl quick_cache::Weighter<Key, Entry> for Weight {
    fn weight(&self, key: &Key, entry: &Entry) -> u64 {
        let bytes = u64::try_from(key.heap_bytes() + entry.fact.heap_bytes()).unwrap_or(u64::MAX);
        bytes.saturating_add(ENTRY_OVERHEAD_BYTES).max(self.share)
    }
}

/// Where a final fact was found: it answers only there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Key {
    /// The store the fact was read from or written to (the cluster, the
    /// database and the table, as the gate found them when it connected):
    /// the same scope and address in another store is another slot.
    pub(crate) store: Arc<String>,
    pub(crate) account: Arc<str>,
    pub(crate) namespace: Option<Arc<str>>,
    pub(crate) address: Box<str>,
}

impl Key {
    fn heap_bytes(&self) -> usize {
        self.store.len()
            + self.account.len()
            + self.namespace.as_deref().map_or(0, str::len)
            + self.address.len()
    }

    fn borrowed(&self) -> KeyRef<'_> {
        KeyRef {
            store: &self.store,
            account: &self.account,
            namespace: self.namespace.as_deref(),
            address: &self.address,
        }
    }
}

/// A [`Key`] borrowed from the caller's scope and address: a lookup
/// allocates nothing. Hashed as the key it stands for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KeyRef<'a> {
    pub(crate) store: &'a str,
    pub(crate) account: &'a str,
    pub(crate) namespace: Option<&'a str>,
    pub(crate) address: &'a str,
}

/// Whether two strings are equal, first by where they are: a gate's
/// lookups borrow the store and the account from the same allocations its
/// entries were made with, so a hit compares the address alone.
fn same(a: &str, b: &str) -> bool {
    core::ptr::eq(a, b) || a == b
}

impl PartialEq for KeyRef<'_> {
    fn eq(&self, other: &Self) -> bool {
        same(self.address, other.address)
            && same(self.account, other.account)
            && match (self.namespace, other.namespace) {
                (None, None) => true,
                (Some(a), Some(b)) => same(a, b),
                _ => false,
            }
            && same(self.store, other.store)
    }
}

impl Eq for KeyRef<'_> {}

/// The store is left out of the hash: a process rarely reaches more than
/// one, so it would spread nothing, and hashing its ~45 bytes cost every
/// lookup. Equality still compares it.
impl Hash for KeyRef<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.address.hash(state);
        self.account.hash(state);
        self.namespace.hash(state);
    }
}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.borrowed().hash(state);
    }
}

impl quick_cache::Equivalent<Key> for KeyRef<'_> {
    fn equivalent(&self, key: &Key) -> bool {
        *self == key.borrowed()
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

    /// How many entries the cache holds (an entry past its time to live
    /// counts until it is next read or evicted).
    pub fn entry_count(&self) -> u64 {
        u64::try_from(self.shared.entries.len()).unwrap_or(u64::MAX)
    }

    /// Forgets every entry: for after a prune, so that no pruned outcome is
    /// answered from here any more.
    pub fn clear(&self) {
        self.shared.entries.clear();
    }

    /// The final fact known at `key`, if it is not older than the time to
    /// live (an older one is forgotten here).
    pub(crate) fn recall(&self, key: &KeyRef<'_>) -> Option<Arc<Final>> {
        let entry = self.shared.entries.get(key)?;
        if entry.learned.elapsed() < self.shared.ttl {
            return Some(entry.fact);
        }
        self.shared.entries.remove(key);
        None
    }

    /// Remembers `fact` for `key`, unless it would forget a replay value
    /// already known there for the same identity and fingerprint (a caller
    /// that does not replay reads the row without it).
    pub(crate) fn remember(&self, key: Key, fact: Final) {
        if matches!(fact.fact, Fact::Success(StoredOutput::Unknown))
            && self.recall(&key.borrowed()).is_some_and(|known| {
                matches!(known.fact, Fact::Success(StoredOutput::Known(_)))
                    && known.identity == fact.identity
                    && known.fingerprint == fact.fingerprint
            })
        {
            return;
        }
        let entry = Entry {
            fact: Arc::new(fact),
            learned: Instant::now(),
        };
        self.shared.entries.insert(key, entry);
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
        // less than its share of the capacity among `max_entries`.
        let max_entries = self.max_entries.max(1);
        let max_bytes = self.max_bytes.max(1);
        let weight = Weight {
            share: max_bytes.div_ceil(max_entries).max(1),
        };
        let items = usize::try_from(max_entries).unwrap_or(usize::MAX);
        // The capacity is split among shards, and an entry heavier than
        // its shard is not kept: no more shards than leave each at least
        // MIN_SHARD_BYTES (or the whole capacity, when it is smaller).
        let shards = usize::try_from(max_bytes / MIN_SHARD_BYTES)
            .unwrap_or(usize::MAX)
            .clamp(1, MAX_SHARDS);
        let options = quick_cache::OptionsBuilder::new()
            .estimated_items_capacity(items)
            .weight_capacity(max_bytes)
            .shards(shards)
            .build();
        let entries = match options {
            Ok(options) => quick_cache::sync::Cache::with_options(
                options,
                weight,
                quick_cache::DefaultHashBuilder::default(),
                quick_cache::sync::DefaultLifecycle::default(),
            ),
            // Only a capacity left unset is refused, and both are set.
            Err(_) => quick_cache::sync::Cache::with_weighter(items, max_bytes, weight),
        };
        OutcomeCache {
            shared: Arc::new(Shared { entries, ttl }),
        }
    }
}

impl fmt::Debug for OutcomeCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutcomeCache")
            .field("ttl", &self.shared.ttl)
            .field("entries", &self.shared.entries.len())
            .field("weighted_bytes", &self.shared.entries.weight())
            .finish_non_exhaustive()
    }
}
