//! Attaching a waiting duplicate to a claim this process holds: the
//! duplicate awaits the holder's outcome as it lands, with no statement,
//! instead of polling the slot (issue 42, item 2).
//!
//! Every gate (and every account or namespace copy of it) shares one
//! [`InFlight`] registry of the claims this process won and has not yet
//! recorded, keyed by the claim's fence: the fence is drawn from one
//! sequence for the whole table, so it names exactly one claim of one
//! slot, and a duplicate that read a pending row knows it. A claim made
//! inside the caller's transaction is never registered: it is not decided
//! until that transaction commits.
//!
//! The holder's cost is one hash insert when the claim is won and one
//! removal when its outcome is recorded (no statement, and no allocation
//! but the map's own growth); the channel a waiter listens on is made only
//! when the first waiter attaches. What lands:
//!
//! - a final fact (a success with the value it kept, a failure kept for
//!   good), judged by the waiter by exactly the rules a row read from the
//!   store is (identity, fingerprint, replay);
//! - a hold in doubt, likewise judged;
//! - a release: the waiter tries the claim again at once;
//! - an outcome with a retention window: the waiter looks at the row (one
//!   statement), as the outcome cache never answers one either.
//!
//! A claim that goes without recording anything of its own (dropped,
//! panicked, lost to a takeover, the store failing) removes its entry as
//! it goes: its waiters find their channel closed and look at the row at
//! once, then fall back to polling. Nobody is left hanging on a channel.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::watch;

use crate::settled::Final;

/// Shards of the registry: claims won at once rarely meet on one lock.
const SHARDS: usize = 16;

/// What a holder recorded, as its waiters are told.
#[derive(Debug)]
pub(crate) enum Landing {
    /// A final fact: settled (with the value kept) or failed for good.
    Final(Final),
    /// Held in doubt, by the claim of this identity and fingerprint.
    InDoubt {
        identity: Box<[u8]>,
        fingerprint: Option<Box<[u8]>>,
    },
    /// Released: the slot is free to a new claim.
    Freed,
    /// Recorded, but not to be answered from: look at the row.
    Look,
}

/// The channel of one claim's waiters: nothing until its outcome lands.
type Waiters = watch::Sender<Option<Arc<Landing>>>;

/// The claims this process holds in flight, by fence. Shared by a gate and
/// its copies.
#[derive(Default)]
pub(crate) struct InFlight {
    shards: [Mutex<HashMap<i64, Option<Waiters>>>; SHARDS],
}

impl std::fmt::Debug for InFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InFlight").finish_non_exhaustive()
    }
}

impl InFlight {
    fn shard(&self, fence: i64) -> std::sync::MutexGuard<'_, HashMap<i64, Option<Waiters>>> {
        // Fences are consecutive: their low bits spread them evenly.
        let index = usize::try_from(fence.rem_euclid(SHARDS as i64)).unwrap_or(0);
        self.shards[index]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers the claim of `fence`, just won: its waiters may attach
    /// until the returned handle lands an outcome or is dropped.
    pub(crate) fn hold(self: &Arc<Self>, fence: i64) -> Held {
        self.shard(fence).insert(fence, None);
        Held {
            registry: Arc::clone(self),
            fence,
            done: AtomicBool::new(false),
        }
    }

    /// Attaches to the claim of `fence`, if this process holds it.
    pub(crate) fn attach(&self, fence: i64) -> Option<Attached> {
        let mut shard = self.shard(fence);
        let waiters = shard.get_mut(&fence)?;
        let receiver = waiters
            .get_or_insert_with(|| watch::channel(None).0)
            .subscribe();
        Some(Attached { receiver })
    }

    /// How many claims this process holds in flight (for tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| shard.lock().unwrap_or_else(PoisonError::into_inner).len())
            .sum()
    }
}

/// A registered claim: removed from the registry when it lands or drops.
pub(crate) struct Held {
    registry: Arc<InFlight>,
    fence: i64,
    done: AtomicBool,
}

impl Held {
    /// The claim's outcome was recorded: tells its waiters, if any, what
    /// `landing` makes (made only when somebody waits), and removes it.
    pub(crate) fn landed(&self, landing: impl FnOnce() -> Landing) {
        if self.done.swap(true, Ordering::AcqRel) {
            return;
        }
        let waiters = self.registry.shard(self.fence).remove(&self.fence);
        if let Some(Some(waiters)) = waiters {
            // Nobody left listening is fine: they gave up their wait.
            let _ = waiters.send(Some(Arc::new(landing())));
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if !self.done.swap(true, Ordering::AcqRel) {
            // Dropping the channel tells its waiters to look for themselves.
            drop(self.registry.shard(self.fence).remove(&self.fence));
        }
    }
}

/// A waiter attached to a claim this process holds.
pub(crate) struct Attached {
    receiver: watch::Receiver<Option<Arc<Landing>>>,
}

impl Attached {
    /// What the holder recorded, once it is; `None`: the holder went
    /// without recording anything of its own (look at the row).
    pub(crate) async fn landed(&mut self) -> Option<Arc<Landing>> {
        match self.receiver.wait_for(Option::is_some).await {
            Ok(landed) => landed.clone(),
            Err(_closed) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_waiter_hears_what_lands_and_the_entry_goes() {
        let registry = Arc::new(InFlight::default());
        let held = registry.hold(7);
        let mut attached = registry.attach(7).expect("held here");
        assert!(registry.attach(8).is_none(), "nothing held under 8");
        held.landed(|| Landing::Freed);
        assert!(matches!(
            attached.landed().await.as_deref(),
            Some(Landing::Freed)
        ));
        assert_eq!(registry.len(), 0);
        drop(held);
        assert_eq!(registry.len(), 0);
    }

    #[tokio::test]
    async fn a_dropped_holder_closes_its_waiters() {
        let registry = Arc::new(InFlight::default());
        let held = registry.hold(-3);
        let mut attached = registry.attach(-3).expect("held here");
        drop(held);
        assert!(attached.landed().await.is_none());
        assert_eq!(registry.len(), 0);
    }

    #[tokio::test]
    async fn nobody_waiting_makes_nothing() {
        let registry = Arc::new(InFlight::default());
        let held = registry.hold(1);
        held.landed(|| unreachable!("made only for a waiter"));
        assert_eq!(registry.len(), 0);
    }
}
