//! Batches for message consumers: one statement claims a whole batch, the
//! won items' bodies run, and their outcomes are recorded with one
//! statement per kind.
//!
//! A consumer that reads 100 messages from Kafka, SQS or NATS and must
//! process each at most once (the inbox pattern) would pay two statements
//! per message through [`Guard::run`](crate::Guard::run). A batch guard
//! ([`Gate::guard_batch`](crate::Gate::guard_batch), then [`run`](crate::guard::BatchGuard::run))
//! pays two per batch in the common case:
//!
//! 1. **Claim**: one `INSERT ... SELECT ... ON CONFLICT DO NOTHING` over
//!    every identity of the batch, in address order. Each item is won, or
//!    held by someone; the holders of the lost ones are read in one more
//!    statement, and each is judged by the rules every duplicate is judged
//!    by: in flight, done (or replayed), failed for good, in doubt, another
//!    payload, a lease that ran out (taken over, or turned in doubt).
//!    Should that lookup fail after the claim committed, the won items
//!    still run (their rows are this batch's: left alone they would stay
//!    pending with nobody holding them) and only the lost ones are refused
//!    with the lookup's error ([`Rejected::Unavailable`] for an outage).
//! 2. **Run**: the won items' bodies, at most
//!    [`concurrency`](crate::guard::BatchGuard::concurrency) at a time (one by default, in the
//!    batch's order). A body that is not won is never called. A body never
//!    starts on a claim that may have been taken over: one whose turn opens
//!    with less than half its [`lease`](crate::guard::BatchGuard::lease) left renews it
//!    first (see [`BatchGuard::lease`](crate::guard::BatchGuard::lease)).
//! 3. **Record**: one statement per kind of outcome among the won items
//!    (settle, release, keep, hold in doubt), each matched per item on its
//!    claim's fence, in address order. An item the statement did not match
//!    (its claim was taken over or released meanwhile) is recorded alone,
//!    as [`Guard::run`](crate::Guard::run) records it.
//!
//! Overlapping batches, from any number of consumers, cannot deadlock:
//! every statement visits its rows in address order. Each item's result is
//! what [`Guard::run`](crate::Guard::run) would have returned for it, in the batch's order.
//!
//! # The same identity twice in a batch
//!
//! A later copy of an identity (a message delivered twice into one batch)
//! gets what [`Guard::run`](crate::Guard::run) gives a duplicate made once the earlier copy has
//! finished: the batch runs in passes, the first copy of every slot in the
//! first, the second copies in the next, each pass claimed after the one
//! before it is recorded. So the second copy of a success is told
//! [`Rejected::AlreadyDone`] (or, replayed, handed the value), of a kept
//! failure [`Rejected::AlreadyFailed`], of one held in doubt
//! [`Rejected::InDoubt`]; a copy with another payload is refused
//! [`Rejected::KeyReused`]; and the copy of a failure that released its
//! slot runs, within this batch, as a redelivery would. An outcome cache
//! (feature `cache`) changes none of these answers. A batch without repeats is one pass, and costs what it always
//! did; each further pass costs a claim and its outcomes again.
//!
//! # Ordered events
//!
//! A consumer's batch of events for many entities
//! ([`Batch::push_ordered`]) is guarded as
//! [`Guard::ordered`](crate::Guard::ordered) guards one: each event runs at
//! most once by its own identity, and never after a newer event of its
//! entity was applied (it is refused [`Rejected::Superseded`]). Within the
//! batch, an entity's events are taken one at a time and **oldest first**,
//! whatever their places in the batch (equal orders in the batch's
//! order): events 3, 1, 2 of one entity delivered together all run, 1,
//! then 2, then 3, rather than 3 alone with the others superseded by an
//! event delivered with them. Each is in a pass of its own, after the one
//! before it is recorded, so it sees its predecessor's outcome as a later
//! call would: a success applied (so an older copy is superseded), a
//! released failure not applied. Events of different entities share
//! passes. Answers come back in the items' places, as always.
//!
//! A pass's ordered events are claimed together by one statement of
//! their own, which takes their entities as
//! [`Guard::ordered`](crate::Guard::ordered)'s claim takes one (in
//! entity order, so that overlapping batches lock entities in one order);
//! an event it does not win (its entity held or newer, its own slot taken)
//! is asked again alone, by the single call's statement, which says why.
//! The bodies run and the outcomes are recorded by the batch's statements
//! as for every item (a release frees the event's entity in the same
//! statement). So a batch of new events for distinct entities costs what a
//! batch without them does, two statements, plus one per pass for an
//! entity's further events. Should the statement fail, each of its events
//! is refused as the batch's insert refuses its items ([`Rejected::Unavailable`]
//! for an outage). On Citus, which routes no statement that takes an
//! entity and inserts a claim, each event is claimed alone (up to
//! [`concurrency`](crate::guard::BatchGuard::concurrency) at a time).
//!
//! ```no_run
//! # async fn demo(gate: idem_runtime::Gate) {
//! use idem_runtime::batch::Batch;
//! use idem_runtime::{Identity, Rejected};
//!
//! struct Event { id: String, subscription: String, sequence: i64 }
//! # let events: Vec<Event> = Vec::new();
//!
//! let mut batch: Batch<&Event> = Batch::new();
//! for event in &events {
//!     let subscription = Identity::new("subscription").part(&event.subscription);
//!     let identity = Identity::new("subscription_event").part(&event.id);
//!     batch.push_ordered(event, identity, &subscription, event.sequence);
//! }
//! let results = gate
//!     .guard_batch(batch)
//!     .run(|event| async move { /* apply the event */ Ok::<(), Rejected>(()) })
//!     .await;
//! for (event, result) in events.iter().zip(results) {
//!     match result {
//!         // Applied, already applied, or older than one applied: done.
//!         Ok(()) | Err(Rejected::AlreadyDone | Rejected::Superseded) => { /* acknowledge */ }
//!         Err(_) => { /* redeliver later */ }
//!     }
//! }
//! # }
//! ```
//!
//! # A panicking body
//!
//! A body that panics holds its own item, as under [`Guard::run`](crate::Guard::run): its
//! claim stays `pending` (until its lease, if any, runs out). The other
//! bodies of the batch still run, in every pass, and every outcome that
//! finished is recorded; then the panic resumes, and reaches the caller as
//! it would from [`Guard::run`](crate::Guard::run). (A later copy of the panicked item's
//! identity, or a later event of its entity, is refused
//! [`Rejected::InFlight`] on the way: the panicked claim holds them.) A
//! redelivery finds the finished items done and the panicked one in
//! flight. So does a
//! [`disposition`](crate::guard::BatchGuard::disposition) classifier that
//! panics on an item's error: that item alone is held.
//!
//! ```no_run
//! # async fn demo(gate: idem_runtime::Gate) {
//! use idem_runtime::batch::Batch;
//! use idem_runtime::{Identity, Rejected};
//!
//! struct Message { id: String, amount: i64 }
//! # async fn deliver(_: &Message) -> Result<(), Rejected> { Ok(()) }
//! # let messages: Vec<Message> = Vec::new();
//!
//! // The messages are borrowed: each body gets `&Message`.
//! let batch: Batch<&Message> = messages
//!     .iter()
//!     .map(|message| (message, Identity::new("deliver").part(&message.id)))
//!     .collect();
//! let results = gate
//!     .guard_batch(batch)
//!     .concurrency(8)
//!     .run(|message| async move { deliver(message).await })
//!     .await;
//! for (message, result) in messages.iter().zip(results) {
//!     match result {
//!         Ok(()) | Err(Rejected::AlreadyDone) => { /* acknowledge */ }
//!         // Refused the same way forever: a kept failure, another payload.
//!         Err(Rejected::AlreadyFailed | Rejected::KeyReused) => { /* dead-letter */ }
//!         // Everything else, later: in flight, in doubt, a store down, a
//!         // claim lost after its body ran (its effect may have happened),
//!         // a store that refused a statement. The redelivery asks the gate
//!         // again, and its answer is what the slot holds then.
//!         Err(_) => { /* redeliver later */ }
//!     }
//! }
//! # }
//! ```
//!
//! # Modes
//!
//! A batch takes the guard's options that make sense for many items at
//! once, as methods of its [`BatchGuard`](crate::guard::BatchGuard), with the guard's refusals at
//! compile time: a [`lease`](crate::guard::BatchGuard::lease) and what its expiry means
//! ([`on_expiry`](crate::guard::BatchGuard::on_expiry)), how outcomes commit
//! ([`outcome_commit`](crate::guard::BatchGuard::outcome_commit); not with a lease),
//! [`replay`](crate::guard::BatchGuard::replay) and a
//! [`disposition`](crate::guard::BatchGuard::disposition); a payload [`Fingerprint`]
//! goes with each item ([`Batch::push_fingerprinted`]). The rest are not
//! offered, so asking for
//! them does not compile: a batch does not wait for items in flight (they
//! are refused [`Rejected::InFlight`], for the consumer to redeliver), never
//! fails open (a store down refuses every item [`Rejected::Unavailable`]),
//! and runs outside the caller's transaction.
//!
//! A batch's outcomes are recorded when its last body returns: give a
//! [`lease`](crate::guard::BatchGuard::lease) the whole batch's time, not one body's.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, Mutex, PoisonError};

use futures_util::stream;
use futures_util::{FutureExt, StreamExt};

use crate::acquire::{
    Acquired, Attempt, Concluded, Contender, Fenced, KeptValue, ReadFrom, Undecided, acquire,
};
use crate::claim::Claim;
use crate::error::Rejected;
use crate::identity::Identity;
use crate::measure::Stopwatch;
use crate::mode::{Fingerprint, Mode, Ordered};
use crate::observe::{self, GateEvent};
use crate::order::EventOrder;
use crate::outcome::Outcome;
use crate::retry::{self, SERIALIZATION_BACKOFF};
use crate::run::OutcomeOf;
use crate::scoped_pool::ScopedPool;
use crate::step::Ambient;
use crate::store::{self, Engine, NewBatchItem, NewClaim};
use crate::via::Via;

/// The items of a batch, each a message and the identity it is processed
/// under. Build it with [`push`](Batch::push) or by collecting
/// `(message, identity)` pairs; the options it is claimed and run with are
/// its guard's ([`Gate::guard_batch`](crate::Gate::guard_batch)).
///
/// `M` is what each body is handed: the message itself, or (to keep the
/// messages, say to acknowledge them after) a reference to it.
pub struct Batch<M> {
    items: Vec<Item<M>>,
    /// The claim options its guard was given ([`BatchGuard`](crate::guard::BatchGuard)).
    pub(crate) mode: Mode,
    pub(crate) concurrency: usize,
}

struct Item<M> {
    message: M,
    identity: Identity,
    fingerprint: Option<Fingerprint>,
    ordered: Option<Ordered>,
}

impl<M> Default for Batch<M> {
    fn default() -> Self {
        Batch::new()
    }
}

impl<M> Batch<M> {
    /// An empty batch: no lease, durable outcomes, one body at a time.
    pub fn new() -> Batch<M> {
        Batch {
            items: Vec::new(),
            mode: Mode::new(),
            concurrency: 1,
        }
    }

    /// Adds `message`, to be processed at most once under `identity`.
    pub fn push(&mut self, message: M, identity: Identity) -> &mut Batch<M> {
        self.items.push(Item {
            message,
            identity,
            fingerprint: None,
            ordered: None,
        });
        self
    }

    /// Adds `message` with a digest of its payload: a duplicate whose
    /// fingerprint differs is refused [`Rejected::KeyReused`], as with
    /// [`Guard::fingerprint`](crate::Guard::fingerprint).
    pub fn push_fingerprinted(
        &mut self,
        message: M,
        identity: Identity,
        fingerprint: Fingerprint,
    ) -> &mut Batch<M> {
        self.items.push(Item {
            message,
            identity,
            fingerprint: Some(fingerprint),
            ordered: None,
        });
        self
    }

    /// Adds `message`, an event of `entity` at `order`, to be processed at
    /// most once under `identity` and never after a newer event of
    /// `entity` was applied, as with
    /// [`Guard::ordered`](crate::Guard::ordered) (whose refusals it shares:
    /// an order beyond an `i64`, an absent identity or entity, a batch
    /// that [keeps its slots](crate::guard::BatchGuard::keep_slot_for) for
    /// a window, each refuse the item [`Rejected::InvalidOption`]).
    ///
    /// The batch runs an entity's events one at a time, oldest first
    /// whatever their place in the batch (see
    /// [the module docs](crate::batch#ordered-events)); each answer is
    /// returned in the item's place.
    pub fn push_ordered<O>(
        &mut self,
        message: M,
        identity: Identity,
        entity: &Identity,
        order: O,
    ) -> &mut Batch<M>
    where
        O: TryInto<EventOrder>,
        O::Error: fmt::Display,
    {
        let order = order.try_into().map_err(|error| error.to_string());
        self.items.push(Item {
            message,
            identity,
            fingerprint: None,
            ordered: Some(Ordered {
                entity: entity.clone(),
                order,
            }),
        });
        self
    }

    /// How many items the batch holds.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether the batch holds no items.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

impl<M> FromIterator<(M, Identity)> for Batch<M> {
    fn from_iter<I: IntoIterator<Item = (M, Identity)>>(pairs: I) -> Batch<M> {
        let mut batch = Batch::new();
        batch.extend(pairs);
        batch
    }
}

impl<M> Extend<(M, Identity)> for Batch<M> {
    fn extend<I: IntoIterator<Item = (M, Identity)>>(&mut self, pairs: I) {
        for (message, identity) in pairs {
            self.push(message, identity);
        }
    }
}

impl<M> fmt::Debug for Batch<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batch")
            .field("len", &self.items.len())
            .field("mode", &self.mode)
            .field("concurrency", &self.concurrency)
            .finish_non_exhaustive()
    }
}

/// What becomes of one item before any body runs.
#[allow(
    clippy::large_enum_variant,
    reason = "one fate per item, most of them claims: boxing each would cost an allocation \
              per item to shrink only the answered ones"
)]
enum Fate<R> {
    /// Its body runs under this claim (ungated for an absent identity).
    Run(Claim),
    /// It is answered without running.
    Answered(R),
}

/// The batch's run: claim, run the won bodies, record, one pass for the
/// first copy of each slot, then one for the second copies, and so on. See
/// the module docs.
pub(crate) async fn run<M, R, F, Fut>(
    slots: &ScopedPool,
    batch: Batch<M>,
    outcome: OutcomeOf<'_, R>,
    mut body: F,
) -> Vec<R>
where
    F: FnMut(M) -> Fut,
    Fut: Future<Output = R>,
{
    let Batch {
        items,
        mode,
        concurrency,
    } = batch;
    let mut results: Vec<Option<R>> = (0..items.len()).map(|_| None).collect();
    // The first panic of a body, resumed once every pass has run: the
    // later passes hold other entities' later events too, which it must
    // not stop (those of the panicked item's slot or entity are refused
    // in flight: its claim holds them).
    let mut panicked = None;
    for pass in passes(items) {
        let (answered, panic) =
            run_pass(slots, pass, &mode, &outcome, &mut body, concurrency).await;
        for (index, output) in answered {
            results[index] = Some(output);
        }
        if let Some(panic) = panic {
            panicked.get_or_insert(panic);
        }
    }
    if let Some(panic) = panicked {
        std::panic::resume_unwind(panic);
    }
    results
        .into_iter()
        .map(|result| result.unwrap_or_else(|| unreachable_result(&outcome)))
        .collect()
}

/// An item of a pass: its index in the batch, its message, how it is
/// claimed.
type Queued<M> = (usize, M, Claimed);

/// The batch's items in passes: the first pass holds the first copy of
/// each slot (and every absent identity, which has none), the second the
/// second copies, and so on, each in the batch's order; and no pass holds
/// two events of one entity.
///
/// A later copy of a slot (the same identity twice in a batch, or two
/// identities whose addresses collide) is a duplicate of an earlier one,
/// and gets what [`Guard::run`](crate::Guard::run) gives a duplicate made once the earlier one
/// has finished: its pass is claimed after the earlier pass is recorded,
/// by the same statements, so a settled slot answers it `AlreadyDone` (or,
/// replayed, the value), a kept failure `AlreadyFailed`, a claim in doubt
/// `InDoubt`, another payload `KeyReused`, and a released one runs it again
/// within this batch, as a redelivery would. A batch without repeats is one
/// pass and costs what it always did.
///
/// An entity's events are taken oldest first (equal orders in the batch's
/// order), each in a pass after the one before it: an entity is held by
/// one event at a time, so a second event of it in the same pass would be
/// refused as in flight, and taken newest first the older ones would be
/// superseded by events delivered with them.
fn passes<M>(items: Vec<Item<M>>) -> Vec<Vec<Queued<M>>> {
    let mut passes: Vec<Vec<Queued<M>>> = Vec::new();
    // The next pass free for each slot, and for each entity.
    let mut next_of_slot: HashMap<String, usize> = HashMap::new();
    let mut next_of_entity: HashMap<String, usize> = HashMap::new();
    for (index, item) in oldest_first(items) {
        let pass = if item.identity.is_absent() {
            0
        } else {
            let slot = next_of_slot.entry(item.identity.address()).or_insert(0);
            let entity = item
                .ordered
                .as_ref()
                .filter(|ordered| !ordered.entity.is_absent())
                .map(|ordered| next_of_entity.entry(ordered.entity.address()).or_insert(0));
            let pass = entity
                .as_ref()
                .map_or(*slot, |entity| (*slot).max(**entity));
            *slot = pass + 1;
            if let Some(entity) = entity {
                *entity = pass + 1;
            }
            pass
        };
        if passes.len() <= pass {
            passes.resize_with(pass + 1, Vec::new);
        }
        let digest = item.fingerprint.as_ref().map(Fingerprint::digest);
        let claimed = Claimed {
            identity: item.identity,
            fingerprint: item.fingerprint,
            digest,
            ordered: item.ordered,
        };
        passes[pass].push((index, item.message, claimed));
    }
    for pass in &mut passes {
        pass.sort_by_key(|(index, _, _)| *index);
    }
    passes
}

/// The batch's items with their indexes, in the batch's order except that
/// the events of each entity trade places among themselves to stand
/// oldest first (an order that does not fit first of all: it is refused
/// without touching the entity).
fn oldest_first<M>(items: Vec<Item<M>>) -> Vec<(usize, Item<M>)> {
    let order_of = |item: &Item<M>| {
        item.ordered
            .as_ref()
            .map(|ordered| ordered.order.as_ref().ok().map(|order| order.get()))
    };
    // Per entity, its items' indexes in the batch's order, then the same
    // indexes sorted oldest first (a stable sort: equal orders keep theirs).
    let mut places: HashMap<String, Vec<usize>> = HashMap::new();
    for (index, item) in items.iter().enumerate() {
        if let Some(ordered) = &item.ordered {
            places
                .entry(ordered.entity.address())
                .or_default()
                .push(index);
        }
    }
    let mut taken_by: Vec<usize> = (0..items.len()).collect();
    for indexes in places.values() {
        let mut oldest = indexes.clone();
        oldest.sort_by_key(|&index| order_of(&items[index]));
        for (&place, &index) in indexes.iter().zip(&oldest) {
            taken_by[place] = index;
        }
    }
    let mut items: Vec<Option<Item<M>>> = items.into_iter().map(Some).collect();
    taken_by
        .into_iter()
        .filter_map(|index| items[index].take().map(|item| (index, item)))
        .collect()
}

/// One pass of the batch (no two of its items share a slot): claim, run
/// the won bodies, record. Per item, its index and what the caller gets.
///
/// A body that panics holds its own item (its claim is left pending, as
/// [`Guard::run`](crate::Guard::run) leaves it), every other body of the pass runs and is
/// recorded, and the panic is handed back, for the batch to resume once
/// its last pass is recorded.
async fn run_pass<M, R, F, Fut>(
    slots: &ScopedPool,
    pass: Vec<Queued<M>>,
    mode: &Mode,
    outcome: &OutcomeOf<'_, R>,
    body: &mut F,
    concurrency: usize,
) -> (Vec<(usize, R)>, Option<Box<dyn Any + Send>>)
where
    F: FnMut(M) -> Fut,
    Fut: Future<Output = R>,
{
    let (queued, claimed): (Vec<(usize, M)>, Vec<Claimed>) = pass
        .into_iter()
        .map(|(index, message, claimed)| ((index, message), claimed))
        .unzip();
    let fates = claim(slots, &claimed, mode, outcome, concurrency).await;
    let mut answered = Vec::with_capacity(fates.len());
    let mut won = Vec::new();
    for ((fate, (index, message)), item) in fates.into_iter().zip(queued).zip(&claimed) {
        match fate {
            Fate::Run(claim) => won.push(Won {
                index,
                claim,
                message,
                item,
            }),
            Fate::Answered(answer) => answered.push((index, answer)),
        }
    }
    let Bodies {
        ran,
        answered: refused,
        panicked,
    } = run_bodies(slots, won, body, mode, outcome, concurrency).await;
    answered.extend(refused);
    let (recorded, classifier_panicked) = record(slots, ran, outcome, concurrency).await;
    answered.extend(recorded);
    (answered, panicked.or(classifier_panicked))
}

/// Every item is answered or run and recorded; should one not be, it is
/// refused rather than reported as done.
fn unreachable_result<R>(outcome: &OutcomeOf<'_, R>) -> R {
    outcome.refused(Rejected::InFlight)
}

/// An item as the claim sees it.
struct Claimed {
    identity: Identity,
    fingerprint: Option<Fingerprint>,
    /// The fingerprint's digest, as the store keeps it.
    digest: Option<[u8; 20]>,
    /// The entity and order of an ordered event.
    ordered: Option<Ordered>,
}

impl Claimed {
    /// `mode` with this item's fingerprint and entity: how one claim of it
    /// is made.
    fn alone(&self, mode: &Mode) -> Mode {
        let mode = match &self.fingerprint {
            Some(fingerprint) => mode.clone().fingerprint(fingerprint.clone()),
            None => mode.clone(),
        };
        match &self.ordered {
            Some(ordered) => mode.ordered(ordered.entity.clone(), ordered.order.clone()),
            None => mode,
        }
    }
}

/// The modes a batch cannot honour are not offered by [`Batch`]; what is
/// left to check is the lease and the scope, as one claim checks them.
fn check(slots: &ScopedPool, mode: &Mode) -> Result<(Option<i64>, store::Windows), Rejected> {
    slots.check()?;
    Ok((mode.lease_micros()?, mode.windows()?))
}

/// Claims every item of a pass (no two share a slot or an entity):
/// answers those it can without the store (absent identities run ungated,
/// the outcome cache), claims the rest in one statement, and judges the
/// holders of the lost ones; an ordered event is claimed alone, as
/// [`Guard::ordered`](crate::Guard::ordered) claims it.
async fn claim<R>(
    slots: &ScopedPool,
    items: &[Claimed],
    mode: &Mode,
    outcome: &OutcomeOf<'_, R>,
    concurrency: usize,
) -> Vec<Fate<R>> {
    let contenders: Vec<Contender<'_>> = items
        .iter()
        .map(|item| Contender::new(slots, &item.identity))
        .collect();
    let (lease_micros, windows) = match check(slots, mode) {
        Ok(checked) => checked,
        Err(rejected) => {
            return contenders
                .iter()
                .map(|contender| {
                    contender.refused(&rejected);
                    Fate::Answered(outcome.refused(rejected.clone()))
                })
                .collect();
        }
    };
    let kept_value = KeptValue::read_if(outcome.replays());
    let new = |index: usize| NewClaim {
        identity: items[index].identity.canonical(),
        fingerprint: items[index].digest.as_ref().map(|f| f.as_slice()),
        lease_micros,
        expires_in_doubt: mode.expires_in_doubt(),
        windows,
        // Ordered events are claimed by a statement of their own (below).
        ordered: None,
    };
    let conclude = |index: usize, attempt: Attempt, read: ReadFrom| -> Concluded {
        contenders[index].conclude(attempt, mode, items[index].digest, read)
    };

    let mut fates: Vec<Option<Fate<R>>> = (0..items.len()).map(|_| None).collect();
    // No two items of a pass share a slot, nor an entity (see `passes`).
    let mut to_claim = Vec::new();
    // Ordered events to claim together, with their entities (on
    // PostgreSQL: Citus routes no statement that takes an entity and
    // inserts a claim, so there each is claimed alone).
    let mut ordered = Vec::new();
    // Claimed alone, as one call is: an ordered event that the statement
    // of them did not win (it says why) or that its options refuse, a slot
    // freed under the batch's claim.
    let mut alone = Vec::new();
    for (index, contender) in contenders.iter().enumerate() {
        // An ordered event never runs ungated: its claim refuses an absent
        // identity.
        if items[index].ordered.is_some() && items[index].identity.is_absent() {
            alone.push(index);
            continue;
        }
        if items[index].identity.is_absent() {
            contender.ungated();
            fates[index] = Some(Fate::Run(Claim::ungated()));
            continue;
        }
        if let Some(attempt) = contender.recalled(new(index), kept_value)
            && let Concluded::Acquired(acquired) = conclude(index, attempt, ReadFrom::Cache)
        {
            fates[index] = Some(answer(acquired, &items[index].identity, outcome));
            continue;
        }
        if items[index].ordered.is_none() {
            to_claim.push(index);
        } else if slots.engine() == Engine::PostgreSQL
            && matches!(items[index].alone(mode).ordered_by(), Ok(Some(_)))
        {
            ordered.push(index);
        } else {
            alone.push(index);
        }
    }
    if !ordered.is_empty() {
        match claim_ordered_in_store(slots, &contenders, items, &ordered, &new).await {
            Ok(won) => {
                for index in ordered {
                    let Some(&fence) = won.get(contenders[index].address()) else {
                        alone.push(index);
                        continue;
                    };
                    // Concluded under the item's own mode: its claim knows
                    // its entity (a late success is folded into it).
                    let concluded = contenders[index].conclude(
                        Attempt::Won(Fenced::new(fence)),
                        &items[index].alone(mode),
                        items[index].digest,
                        ReadFrom::Pool,
                    );
                    if let Concluded::Acquired(acquired) = concluded {
                        fates[index] = Some(answer(acquired, &items[index].identity, outcome));
                    }
                }
            }
            Err(rejected) => {
                for index in ordered {
                    contenders[index].refused(&rejected);
                    fates[index] = Some(Fate::Answered(outcome.refused(rejected.clone())));
                }
            }
        }
    }

    if !to_claim.is_empty() {
        let claimed = claim_in_store(slots, &contenders, &to_claim, &new, kept_value, mode).await;
        match claimed {
            Ok(attempts) => {
                for (index, attempt) in attempts {
                    match attempt.map(|attempt| conclude(index, attempt, ReadFrom::Pool)) {
                        Ok(Concluded::Acquired(acquired)) => {
                            fates[index] = Some(answer(acquired, &items[index].identity, outcome));
                        }
                        Ok(Concluded::Undecided(Undecided::HeldByAnother)) => {
                            contenders[index].refused(&Rejected::InFlight);
                            fates[index] =
                                Some(Fate::Answered(outcome.refused(Rejected::InFlight)));
                        }
                        Ok(Concluded::Undecided(Undecided::Freed)) => alone.push(index),
                        Err(rejected) => {
                            fates[index] = Some(Fate::Answered(outcome.refused(rejected)));
                        }
                    }
                }
            }
            Err(rejected) => {
                for &index in &to_claim {
                    contenders[index].refused(&rejected);
                    fates[index] = Some(Fate::Answered(outcome.refused(rejected.clone())));
                }
            }
        }
    }
    // An ordered event, and a slot freed between the batch's insert and its
    // lookup (its holder failed and released it): claimed alone, as one
    // call would be (an ordered event's claim takes its entity with it).
    // At most `concurrency` at a time, as the bodies run: no two share a
    // slot or an entity, so none waits for another.
    let claimed_alone: Vec<(usize, Result<Acquired, Rejected>)> = stream::iter(alone)
        .map(|index| async move {
            let (item, via) = (&items[index], &mut Via::Pool(slots.pool()));
            let acquired = acquire(slots, &item.identity, &item.alone(mode), kept_value, via).await;
            (index, acquired)
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    for (index, acquired) in claimed_alone {
        fates[index] = Some(answer(acquired, &items[index].identity, outcome));
    }
    fates
        .into_iter()
        .map(|fate| fate.unwrap_or_else(|| Fate::Answered(unreachable_result(outcome))))
        .collect()
}

/// A decided claim as an item's fate.
fn answer<R>(
    acquired: Result<Acquired, Rejected>,
    identity: &Identity,
    outcome: &OutcomeOf<'_, R>,
) -> Fate<R> {
    match acquired {
        Ok(Acquired::Won(claim)) => Fate::Run(claim),
        Ok(Acquired::Settled(stored)) => Fate::Answered(outcome.settled(identity, stored)),
        Err(rejected) => Fate::Answered(outcome.refused(rejected)),
    }
}

/// The statement that claims the ordered events `ordered` of a pass (each
/// with its options checked: `Claimed::alone(..).ordered_by()` is
/// `Ok(Some(..))`) and takes their entities: the won addresses and their
/// fences. Repeated after a serialization failure or a deadlock, as the
/// batch's insert is. `Err`: it failed, and no item of it is decided.
async fn claim_ordered_in_store<'i>(
    slots: &ScopedPool,
    contenders: &[Contender<'_>],
    items: &'i [Claimed],
    ordered: &[usize],
    new: &impl Fn(usize) -> NewClaim<'i>,
) -> Result<HashMap<String, i64>, Rejected> {
    let failed = |error: sqlx::Error| batch_failed(slots, ordered.len(), error);
    // Each event with its entity's address (which the items borrow).
    let events: Vec<(usize, String, &[u8], i64)> = ordered
        .iter()
        .filter_map(|&index| {
            let of = items[index].ordered.as_ref()?;
            let order = of.order.as_ref().ok()?.get();
            Some((index, of.entity.address(), of.entity.canonical(), order))
        })
        .collect();
    let batch: Vec<store::NewOrderedItem<'_>> = events
        .iter()
        .map(
            |&(index, ref entity, entity_identity, order)| store::NewOrderedItem {
                item: NewBatchItem {
                    address: contenders[index].address(),
                    identity: new(index).identity,
                    fingerprint: new(index).fingerprint,
                },
                ordered: store::OrderedBy {
                    entity,
                    entity_identity,
                    order,
                },
            },
        )
        .collect();
    let (lease, windows) = (new(ordered[0]).lease(), new(ordered[0]).windows);
    let mut conn = slots.pool().acquire().await.map_err(failed)?;
    let won = retry::repeat!(
        &SERIALIZATION_BACKOFF,
        retry::is_serialization_failure,
        |_, _| observe::record(GateEvent::Retried),
        store::claim_ordered_batch(&mut conn, slots.scope(), &batch, lease, windows).await,
    )
    .map_err(failed)?;
    Ok(won.into_iter().collect())
}

/// The statements of the claim: one insert for every item of `to_claim`,
/// then one lookup of the holders of those it lost, each then judged (which
/// may take a statement of its own: a lease that ran out). Per item, the
/// attempt, or the refusal a statement of its own (or the lookup) met.
/// `Err`: the insert failed, and no item is decided.
async fn claim_in_store<'i>(
    slots: &ScopedPool,
    contenders: &[Contender<'_>],
    to_claim: &[usize],
    new: &impl Fn(usize) -> NewClaim<'i>,
    kept_value: KeptValue,
    mode: &Mode,
) -> Result<Vec<(usize, Result<Attempt, Rejected>)>, Rejected> {
    let failed = |error: sqlx::Error| batch_failed(slots, to_claim.len(), error);
    let scope = slots.scope();
    let mut conn = slots.pool().acquire().await.map_err(failed)?;
    let (lease, windows) = (new(to_claim[0]).lease(), new(to_claim[0]).windows);
    let batch: Vec<NewBatchItem<'_>> = to_claim
        .iter()
        .map(|&index| NewBatchItem {
            address: contenders[index].address(),
            identity: new(index).identity,
            fingerprint: new(index).fingerprint,
        })
        .collect();
    // Rolled back whole by a serialization failure or a deadlock, it is
    // sent again; after a lost connection its effect is unknown, so it is
    // not (the won rows are held, as after one claim's lost reply).
    let won = retry::repeat!(
        &SERIALIZATION_BACKOFF,
        retry::is_serialization_failure,
        |_, _| observe::record(GateEvent::Retried),
        store::claim_batch(&mut *conn, scope, &batch, lease, windows).await,
    )
    .map_err(failed)?;
    let won: HashMap<String, i64> = won.into_iter().collect();
    let lost: Vec<&str> = batch
        .iter()
        .map(|item| item.address)
        .filter(|address| !won.contains_key(*address))
        .collect();
    // The claim committed: the won rows are ours whatever the lookup meets.
    // Should it fail, the won items still run (leaving them pending, with
    // nobody holding them, would strand them) and only the lost ones, whose
    // holders are unknown, are refused.
    let (mut holders, unknown) = if lost.is_empty() {
        (HashMap::new(), None)
    } else {
        match store::lookup_batch(&mut *conn, slots.engine(), scope, &lost, kept_value).await {
            Ok(holders) => (holders.into_iter().collect(), None),
            Err(error) => (
                HashMap::new(),
                Some(lookup_failed(slots, lost.len(), error)),
            ),
        }
    };
    tracing::debug!(
        target: "idem",
        account = slots.account(),
        namespace = slots.namespace(),
        items = to_claim.len(),
        won = won.len(),
        "batch claimed"
    );
    let mut attempts = Vec::with_capacity(to_claim.len());
    for &index in to_claim {
        let contender = &contenders[index];
        let attempt = if let Some(&fence) = won.get(contender.address()) {
            Ok(Attempt::Won(Fenced::new(fence)))
        } else if let Some(rejected) = &unknown {
            contender.refused(rejected);
            Err(rejected.clone())
        } else {
            match holders.remove(contender.address()) {
                Some(existing) => contender
                    .judge(
                        &mut conn,
                        existing,
                        new(index),
                        kept_value,
                        mode.on_expiry_policy(),
                        ReadFrom::Pool,
                    )
                    .await
                    .map_err(|error| contender.store_failed(error)),
                // Released between the insert and the lookup.
                None => Ok(Attempt::Undecided(Undecided::Freed)),
            }
        };
        attempts.push((index, attempt));
    }
    Ok(attempts)
}

/// The batch's claim or lookup failed: no item of it is decided, and each
/// is refused with what this says (an outage, or an error of the request).
fn batch_failed(slots: &ScopedPool, items: usize, error: sqlx::Error) -> Rejected {
    let rejected = Rejected::from_store(error);
    let message = if rejected.is_outage() {
        "store unavailable; failing closed, no body of the batch runs"
    } else {
        "store refused the batch's claim (not an outage); no body of the batch runs"
    };
    tracing::error!(
        target: "idem",
        account = slots.account(),
        namespace = slots.namespace(),
        items,
        error = %rejected,
        "{message}"
    );
    rejected
}

/// The lookup of the holders of a batch's lost items failed, after its
/// claim committed: those items are refused with what this says (an outage,
/// or an error of the request); the won ones run.
fn lookup_failed(slots: &ScopedPool, lost: usize, error: sqlx::Error) -> Rejected {
    let rejected = Rejected::from_store(error);
    tracing::error!(
        target: "idem",
        account = slots.account(),
        namespace = slots.namespace(),
        lost,
        outage = rejected.is_outage(),
        error = %rejected,
        "looking up the holders of the batch's lost items failed: those are refused, \
         the won items run"
    );
    rejected
}

/// A won item, waiting for its body's turn.
struct Won<'a, M> {
    index: usize,
    claim: Claim,
    message: M,
    item: &'a Claimed,
}

/// What became of a pass's won items.
struct Bodies<R> {
    /// Per body that returned: its item's index, its claim, its output and
    /// what its steps saw.
    ran: Vec<Ran<R>>,
    /// Items answered without their body running: their claim was lost
    /// before their turn came (see [`turn_opens`]).
    answered: Vec<(usize, R)>,
    /// The first panic of a body, resumed once the rest is recorded.
    panicked: Option<Box<dyn Any + Send>>,
}

/// A body that returned: its item's index, its claim, its output, and what
/// its steps saw.
type Ran<R> = (usize, Claim, R, Arc<Ambient>);

/// What one won item's turn came to.
#[allow(
    clippy::large_enum_variant,
    reason = "one turn per won item, most of them bodies that ran: boxing each would cost an \
              allocation per item to shrink only the rare others"
)]
enum Turn<R> {
    Ran(Ran<R>),
    Answered(usize, R),
    Panicked(Box<dyn Any + Send>),
}

/// Runs the won bodies, at most `concurrency` at a time, each only on a
/// claim that is still this batch's ([`turn_opens`]). A body that panics
/// (or whose call does) is caught: its claim is dropped, so its row stays
/// pending as after a panic under [`Guard::run`](crate::Guard::run) (until its lease, if any,
/// runs out), and the other bodies run on.
async fn run_bodies<M, R, F, Fut>(
    slots: &ScopedPool,
    won: Vec<Won<'_, M>>,
    body: &mut F,
    mode: &Mode,
    outcome: &OutcomeOf<'_, R>,
    concurrency: usize,
) -> Bodies<R>
where
    F: FnMut(M) -> Fut,
    Fut: Future<Output = R>,
{
    // The body is called as a turn opens (not when the claim was won).
    let body = Mutex::new(body);
    // Each turn is a future of its own, made here and polled only as its
    // turn opens; a named `async fn` rather than a closure's async block,
    // so that the batch's future stays `Send` for every lifetime.
    let turns: Vec<_> = won
        .into_iter()
        .map(|won| take_turn(slots, won, &body, mode, outcome))
        .collect();
    let turns: Vec<Turn<R>> = stream::iter(turns)
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let mut bodies = Bodies {
        ran: Vec::with_capacity(turns.len()),
        answered: Vec::new(),
        panicked: None,
    };
    for turn in turns {
        match turn {
            Turn::Ran(ran) => bodies.ran.push(ran),
            Turn::Answered(index, answer) => bodies.answered.push((index, answer)),
            Turn::Panicked(panic) => {
                bodies.panicked.get_or_insert(panic);
            }
        }
    }
    bodies
}

/// One won item's turn: its claim checked ([`turn_opens`]), then its body,
/// called through `body`'s lock (held only for the call, never across an
/// await), any panic of the call or of the body caught.
async fn take_turn<M, R, F, Fut>(
    slots: &ScopedPool,
    won: Won<'_, M>,
    body: &Mutex<&mut F>,
    mode: &Mode,
    outcome: &OutcomeOf<'_, R>,
) -> Turn<R>
where
    F: FnMut(M) -> Fut,
    Fut: Future<Output = R>,
{
    let Won {
        index,
        claim,
        message,
        item,
    } = won;
    let mut claim = match turn_opens(slots, claim, item, mode, outcome).await {
        Ok(claim) => claim,
        Err(answer) => return Turn::Answered(index, answer),
    };
    claim.body_starts();
    let steps = Ambient::of_claim(claim.held(), &item.identity, slots);
    let called = panic::catch_unwind(AssertUnwindSafe(|| {
        let mut body = body.lock().unwrap_or_else(PoisonError::into_inner);
        let body: &mut F = &mut body;
        body(message)
    }));
    let output = match called {
        Ok(running) => AssertUnwindSafe(steps.around(running)).catch_unwind().await,
        Err(panic) => Err(panic),
    };
    match output {
        Ok(output) => Turn::Ran((index, claim, output, steps)),
        // Its outcome is unknown: the claim is held, as dropped.
        Err(panic) => Turn::Panicked(panic),
    }
}

/// A won item's turn opens: its body may start only on a claim that is still
/// this batch's. The lease ran from the batch's claim, and the body may have
/// waited behind others: with less than half of it left (by this process's
/// clock, which starts it one round trip after the store did, far less than
/// that margin), the claim is first renewed to a whole lease, one statement
/// for that item, matched on its fence. So a body starts with at least half
/// a lease ahead of it, never on a claim that may have been taken over.
///
/// `Err`: what the item gets instead. A claim lost before its body started
/// (taken over, turned in doubt or released) ran nothing of this batch's: the
/// item is claimed again alone, as a [`Guard::run`](crate::Guard::run) made now would be, and
/// runs only if it wins. A claim the store could not renew is released
/// (matched on its fence, so only if still ours; its body never started, so
/// freeing it is safe) and the item refused with the store's error.
async fn turn_opens<R>(
    slots: &ScopedPool,
    claim: Claim,
    item: &Claimed,
    mode: &Mode,
    outcome: &OutcomeOf<'_, R>,
) -> Result<Claim, R> {
    let Some(lease) = mode.lease_duration() else {
        return Ok(claim);
    };
    if claim.lease_left().is_none_or(|left| left >= lease / 2) {
        return Ok(claim);
    }
    match claim.extend(lease).await {
        Ok(()) => Ok(claim),
        Err(Rejected::LeaseLost { .. }) => {
            claim.forget();
            let via = &mut Via::Pool(slots.pool());
            let acquired = acquire(
                slots,
                &item.identity,
                &item.alone(mode),
                KeptValue::read_if(outcome.replays()),
                via,
            )
            .await;
            match answer(acquired, &item.identity, outcome) {
                Fate::Run(claim) => Ok(claim),
                Fate::Answered(answer) => Err(answer),
            }
        }
        Err(rejected) => {
            // Reported by the claim, whatever it meets.
            let _released = claim.release().await;
            Err(outcome.refused(rejected))
        }
    }
}

/// One kind of outcome, and the claims to record it for.
struct Group<R> {
    kind: Outcome,
    /// Per claim: its item's index, the claim, the body's output and the
    /// value to keep (for a settle with replay).
    members: Vec<(usize, Claim, R, Option<String>)>,
}

/// Records the outcome of every body that ran: one statement per kind, and
/// alone (as [`Guard::run`](crate::Guard::run) records) each item that statement did not match,
/// every ungated item (which records nothing), and every item of a
/// statement that failed. Per item, its index and what the caller gets.
///
/// A classifier that panics on an item's output holds that item alone, as
/// a panicking body does: its claim is left pending, every other item is
/// recorded, and the first such panic is handed back to be resumed.
async fn record<R>(
    slots: &ScopedPool,
    ran: Vec<Ran<R>>,
    outcome: &OutcomeOf<'_, R>,
    concurrency: usize,
) -> (Vec<(usize, R)>, Option<Box<dyn Any + Send>>) {
    let mut groups: Vec<Group<R>> = Outcome::KINDS
        .iter()
        .map(|&kind| Group {
            kind,
            members: Vec::new(),
        })
        .collect();
    let mut alone = Vec::new();
    let mut panicked = None;
    // A batch's statements carry no step's record: each body's last one is
    // written on its own before its outcome is chosen.
    for (_, _, _, steps) in &ran {
        steps.land_carried().await;
    }
    for (index, claim, output, steps) in ran {
        let wanted = panic::catch_unwind(AssertUnwindSafe(|| {
            outcome.wanted(claim.address(), &output)
        }));
        // A step whose outcome nobody knows holds a failure in doubt.
        let wanted = wanted.map(|wanted| match wanted {
            Outcome::Failed(disposition) => Outcome::Failed(steps.overrides(disposition)),
            settled => settled,
        });
        let wanted = match wanted {
            Ok(wanted) => wanted,
            Err(panic) => {
                // Left pending, as after a panic under `Guard::run`.
                drop(claim);
                panicked.get_or_insert(panic);
                continue;
            }
        };
        // A success after a step refused to run for a lost claim is not
        // recorded: alone, it is answered with that refusal.
        if !claim.is_gated() || steps.refused().is_some() {
            alone.push((index, claim, output, Some(steps)));
            continue;
        }
        let kind = wanted.kind();
        match groups.iter_mut().find(|group| group.kind == kind) {
            Some(group) => group
                .members
                .push((index, claim, output, wanted.into_value())),
            // A kind no batch statement records: the claim records it.
            None => alone.push((index, claim, output, Some(steps))),
        }
    }
    let mut results = Vec::new();
    let via = Via::Pool(slots.pool());
    // The addresses whose outcome a duplicate in another process waits on,
    // over every group: woken together, by one statement.
    let mut awaited = Vec::new();
    for group in groups.into_iter().filter(|group| !group.members.is_empty()) {
        let recording = Stopwatch::start();
        let changed = record_group(slots, &group).await;
        if let Some(changed) = &changed {
            awaited.extend(
                changed
                    .iter()
                    .filter(|(_, awaited)| **awaited)
                    .map(|(address, _)| address.clone()),
            );
        }
        for (index, claim, output, json) in group.members {
            let matched = changed
                .as_ref()
                .is_some_and(|changed| claim.address().is_some_and(|a| changed.contains_key(a)));
            if matched {
                claim.recorded_in_batch(group.kind.with_value(json.as_deref()), &via, &recording);
                results.push((index, output));
            } else {
                alone.push((index, claim, output, None));
            }
        }
    }
    if !awaited.is_empty() {
        wake(slots, &awaited).await;
    }
    let recorded_alone: Vec<(usize, R)> = stream::iter(alone)
        .map(|(index, claim, output, steps)| async move {
            let via = &mut Via::Pool(slots.pool());
            let steps = steps.as_deref();
            (index, outcome.record(claim, output, steps, via).await)
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    results.extend(recorded_alone);
    (results, panicked)
}

/// Wakes the duplicates waiting in other processes on the claims at
/// `addresses`, just recorded. A wake-up not sent is only lost time: they
/// look for themselves.
async fn wake(slots: &ScopedPool, addresses: &[String]) {
    let woken = async {
        let mut conn = slots.pool().acquire().await?;
        store::wake_all(&mut *conn, addresses).await
    }
    .await;
    if let Err(error) = woken {
        tracing::debug!(
            target: "idem",
            account = slots.account(),
            namespace = slots.namespace(),
            items = addresses.len(),
            error = %error,
            "the wake-up of duplicates waiting in other processes was not sent; they look for \
             themselves"
        );
    }
}

/// The one statement of `group`, repeated after a transient failure (it is
/// matched on each claim's fence, so a repeat changes nothing): the
/// addresses it changed, each with whether a duplicate in another process
/// waits on it, or `None` when it failed (every member is then recorded
/// alone).
async fn record_group<R>(slots: &ScopedPool, group: &Group<R>) -> Option<HashMap<String, bool>> {
    let mut addresses = Vec::with_capacity(group.members.len());
    let mut fences = Vec::with_capacity(group.members.len());
    let mut outputs = Vec::with_capacity(group.members.len());
    let mut commit = store::Commit::Durable;
    for (_, claim, _, json) in &group.members {
        let held = claim.held()?;
        addresses.push(held.address.as_str());
        fences.push(held.fence);
        outputs.push(json.as_deref());
        commit = held.commit;
    }
    let (engine, scope) = (slots.engine(), slots.scope());
    let recorded = retry::repeat!(
        &crate::retry::RECORD_BACKOFF,
        retry::is_transient,
        |_, _| {},
        async {
            let mut conn = slots.pool().acquire().await?;
            store::record_batch(
                &mut *conn, engine, scope, &addresses, &fences, group.kind, &outputs, commit,
            )
            .await
        }
        .await,
    );
    match recorded {
        Ok(changed) => Some(changed.into_iter().collect()),
        Err(error) => {
            tracing::warn!(
                target: "idem",
                account = slots.account(),
                namespace = slots.namespace(),
                items = addresses.len(),
                error = %error,
                "recording a batch's outcomes failed; recording each alone"
            );
            None
        }
    }
}
