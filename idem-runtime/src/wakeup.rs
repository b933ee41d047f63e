//! Waking a waiting duplicate whose slot a claim of another process holds
//! (issue 42, item 2, across processes): a notification its holder sends
//! only when somebody waits, with looking at the slot kept as the fallback.
//!
//! A waiter in this process, told the slot is held by a claim it cannot
//! attach to (`attach`: not this process's), subscribes to the slot's
//! address here, makes sure this gate's listener is `LISTEN`ing on
//! [`LANDED_CHANNEL`], then marks the pending row it waits on
//! (`store::MARK_AWAITED`, compared on the holder's fence). The holder's
//! outcome statement returns the mark, and only then does the holder send
//! the notification (`store::WAKE`), whose payload is the address. A
//! settle nobody waits on pays nothing: one more column in its `RETURNING`.
//!
//! The order is what makes it race-free: the listener listens before the
//! mark is written, so either the holder's outcome statement (which locks
//! the row after the mark, or before it) sees the mark and notifies a
//! listener that is there to hear it, or the mark finds the row no longer
//! pending under that fence, and the waiter looks at once.
//!
//! One listener per gate (shared by its account and namespace copies), on a
//! connection of its own (not one of the gate's pool, which it would hold
//! for as long as it listens), started by the first waiter and stopped
//! once nobody has waited for [`IDLE`]. A notification is dispatched by
//! address: two slots of one address in other accounts only cost a waiter
//! a look. Whenever the listener's connection drops, every waiter is woken
//! to look for itself once it listens anew (a notification may have been
//! lost meanwhile), and at once as well when it cannot listen again
//! straight away; a waiter whose listener stopped under it (its runtime
//! shut down) starts another; and a waiter looks once a second anyway, so
//! a lost notification costs at most that.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use tokio::sync::watch;

use crate::store::LANDED_CHANNEL;

/// How long the listener stays with nobody waiting before it stops (and
/// gives its connection back).
const IDLE: Duration = Duration::from_secs(10);

/// How often a quiet listener sees whether anybody still waits.
const IDLE_CHECK: Duration = Duration::from_secs(1);

/// How long a waiter waits for the listener to be listening before it
/// polls instead, this time (the listener goes on starting).
const READY_WITHIN: Duration = Duration::from_millis(250);

/// The pause before the listener tries again after it failed to connect.
const RECONNECT_PAUSE: Duration = Duration::from_millis(500);

/// The name the listener's connection gives itself, for operators reading
/// `pg_stat_activity`: this, after the pool's own application name if it
/// has one (`billing (idem wake-up)`).
const APPLICATION_NAME: &str = "idem wake-up";

/// This gate's waiters on claims of other processes, and its listener;
/// shared by its copies.
#[derive(Default, Clone)]
pub(crate) struct Wakeups {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Wakeups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wakeups").finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The waiters of each address: a channel every one of them watches
    /// (its value counts the wake-ups), and the fence a waiter of this
    /// process has already marked, so that a crowd of them marks it once.
    waiting: HashMap<Box<str>, Slot>,
    /// The listener, while one runs: which one (each is numbered), and
    /// whether it is listening now.
    listener: Option<(u64, watch::Receiver<bool>)>,
    /// How many listeners were started: the next one's number.
    started: u64,
}

struct Slot {
    woken: watch::Sender<u64>,
    marked: Option<i64>,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl State {
    /// Wakes every waiter: the listener may have missed a notification.
    fn wake_all(&self) {
        for slot in self.waiting.values() {
            slot.woken
                .send_modify(|count| *count = count.wrapping_add(1));
        }
    }
}

impl Wakeups {
    /// Subscribes a waiter to the slot at `address` and makes sure the
    /// listener is listening; `None` when it is not within
    /// [`READY_WITHIN`] (poll this time; it goes on starting).
    pub(crate) async fn listen(&self, pool: &PgPool, address: &str) -> Option<Listening> {
        let (woken, mut ready) = {
            let mut state = self.shared.state();
            let woken = state
                .waiting
                .entry(Box::from(address))
                .or_insert_with(|| Slot {
                    woken: watch::channel(0).0,
                    marked: None,
                })
                .woken
                .subscribe();
            let ready = match &state.listener {
                Some((_, ready)) => ready.clone(),
                None => {
                    let (tell, ready) = watch::channel(false);
                    let number = state.started;
                    state.started = number.wrapping_add(1);
                    state.listener = Some((number, ready.clone()));
                    let stopped = Stopped {
                        shared: Arc::clone(&self.shared),
                        number,
                        ready: tell,
                    };
                    tokio::spawn(listen(stopped, pool.clone()));
                    ready
                }
            };
            (woken, ready)
        };
        let listening = Listening {
            shared: Arc::clone(&self.shared),
            address: Box::from(address),
            woken,
        };
        match tokio::time::timeout(READY_WITHIN, ready.wait_for(|ready| *ready)).await {
            Ok(Ok(_)) => Some(listening),
            // Not yet, or the listener stopped: dropping `listening` leaves.
            Ok(Err(_)) | Err(_) => None,
        }
    }
}

/// A waiter subscribed to one address, while its listener listens.
pub(crate) struct Listening {
    shared: Arc<Shared>,
    address: Box<str>,
    woken: watch::Receiver<u64>,
}

impl Listening {
    /// Whether a waiter of this process has marked the claim of `fence`.
    pub(crate) fn marked(&self, fence: i64) -> bool {
        self.shared
            .state()
            .waiting
            .get(&*self.address)
            .is_some_and(|slot| slot.marked == Some(fence))
    }

    /// Whether no listener runs for it any more (the runtime that started
    /// it shut down): subscribe anew, which starts one.
    pub(crate) fn orphaned(&self) -> bool {
        self.shared.state().listener.is_none()
    }

    /// Says the claim of `fence` is marked.
    pub(crate) fn mark(&self, fence: i64) {
        if let Some(slot) = self.shared.state().waiting.get_mut(&*self.address) {
            slot.marked = Some(fence);
        }
    }

    /// Resolves at the next wake-up: a notification for the address, or
    /// the listener's connection dropped or came back (look either way).
    pub(crate) async fn woken(&mut self) {
        if self.woken.changed().await.is_err() {
            // The entry went (cannot while this waiter holds a receiver);
            // never resolve, the waiter's own look comes round.
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for Listening {
    fn drop(&mut self) {
        let mut state = self.shared.state();
        // The last waiter of the address takes its entry with it.
        if let Some(slot) = state.waiting.get(&*self.address)
            && slot.woken.receiver_count() <= 1
        {
            state.waiting.remove(&*self.address);
        }
    }
}

/// Says the listener is gone when its task ends or is dropped (its
/// runtime shut down): the next waiter starts another, and every waiter
/// looks for itself.
struct Stopped {
    shared: Arc<Shared>,
    /// Which listener this is: one that stopped for want of waiters may
    /// already have a successor, which its end must leave alone.
    number: u64,
    ready: watch::Sender<bool>,
}

impl Stopped {
    /// Takes this listener out of the state, if it is still there.
    fn leave(&self, state: &mut State) {
        if state
            .listener
            .as_ref()
            .is_some_and(|(number, _)| *number == self.number)
        {
            state.listener = None;
        }
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let mut state = self.shared.state();
        self.leave(&mut state);
        state.wake_all();
        self.ready.send_replace(false);
    }
}

/// The listener: connects (on a connection of its own, with the gate's
/// pool's options), listens, and dispatches what it hears, until nobody
/// has waited for [`IDLE`] (however many notifications for other slots it
/// hears meanwhile: they do not keep it open).
async fn listen(stopped: Stopped, pool: PgPool) {
    let shared = Arc::clone(&stopped.shared);
    let own = PgPoolOptions::new()
        .max_connections(1)
        .min_connections(0)
        .connect_lazy_with(named((*pool.connect_options()).clone()));
    let mut listener = None;
    // Since when nobody has waited, if nobody does.
    let mut idle_since: Option<Instant> = None;
    loop {
        {
            let mut state = shared.state();
            if !state.waiting.is_empty() {
                idle_since = None;
            } else if idle_since.get_or_insert_with(Instant::now).elapsed() >= IDLE {
                stopped.leave(&mut state);
                // `stopped` takes the lock again as it drops.
                drop(state);
                return;
            }
        }
        let Some(connected) = listener.as_mut() else {
            match connect(&own).await {
                Ok(connected) => {
                    listener = Some(connected);
                    stopped.ready.send_replace(true);
                    // It may have missed a notification while it was not
                    // listening: everyone looks.
                    shared.state().wake_all();
                }
                Err(error) => {
                    tracing::debug!(target: "idem", error = %error,
                        "the listener for waiting duplicates could not listen; they look for themselves");
                    tokio::time::sleep(RECONNECT_PAUSE).await;
                }
            }
            continue;
        };
        match tokio::time::timeout(IDLE_CHECK, connected.try_recv()).await {
            Ok(Ok(Some(notification))) => {
                let state = shared.state();
                if let Some(slot) = state.waiting.get(notification.payload()) {
                    slot.woken
                        .send_modify(|count| *count = count.wrapping_add(1));
                }
            }
            // The connection dropped; sqlx made it again and listens before
            // it says so. What was sent meanwhile is lost: everyone looks.
            Ok(Ok(None)) => shared.state().wake_all(),
            // It dropped and could not be made again: everyone looks now,
            // and again once it listens.
            Ok(Err(error)) => {
                tracing::debug!(target: "idem", error = %error,
                    "the listener for waiting duplicates lost its connection; they look for themselves");
                stopped.ready.send_replace(false);
                shared.state().wake_all();
                listener = None;
                tokio::time::sleep(RECONNECT_PAUSE).await;
            }
            // Quiet: see whether anybody still waits.
            Err(_quiet) => {}
        }
    }
}

/// `options` with the listener's application name: the pool's own, if it
/// has one, then [`APPLICATION_NAME`] in brackets, shortened so that the
/// whole fits in PostgreSQL's 63 bytes with the brackets kept.
fn named(options: PgConnectOptions) -> PgConnectOptions {
    const LIMIT: usize = 63;
    let name = match options.get_application_name() {
        Some(application) => {
            let room = LIMIT - APPLICATION_NAME.len() - " ()".len();
            let mut end = application.len().min(room);
            while !application.is_char_boundary(end) {
                end -= 1;
            }
            format!("{} ({APPLICATION_NAME})", &application[..end])
        }
        None => APPLICATION_NAME.to_owned(),
    };
    options.application_name(&name)
}

async fn connect(own: &PgPool) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(own).await?;
    listener.ignore_pool_close_event(true);
    listener.listen(LANDED_CHANNEL).await?;
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name_of(application: &str) -> String {
        named(PgConnectOptions::new().application_name(application))
            .get_application_name()
            .unwrap_or_default()
            .to_owned()
    }

    #[test]
    fn the_listener_is_named_after_its_pool_within_postgresql_s_63_bytes() {
        assert_eq!(name_of("billing"), "billing (idem wake-up)");
        // Cut on a character boundary, the suffix kept whole.
        let long = "é".repeat(40);
        let name = name_of(&long);
        assert!(name.len() <= 63, "{} bytes: {name}", name.len());
        assert!(name.ends_with(" (idem wake-up)"), "{name}");
        assert!(name.starts_with("éé"), "{name}");
    }
}
