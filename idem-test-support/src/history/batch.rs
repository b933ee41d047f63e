//! The batch workload: consumers calling `gate.guard_batch(..).run(..)`
//! (with or without `.replay()`) at one barrier over overlapping windows of the
//! same message ids, some ids twice in one batch, under the same faults.
//!
//! Each item is recorded as an [`Invocation`] of [`Entry::Batch`]: its
//! body's run, what its caller got, and the events its answer shows. The
//! gate reports a batch's events to the batch as a whole, not per item, so
//! an item's are read off its answer, and only as far as the answer proves
//! them: a value its own body returned was settled (`Won`, `Settled`), one
//! it did not was replayed; a refusal without a body was the gate's; an
//! error after a body is its outcome unrecorded; a body's own failure was
//! released. Where the batch reported an outcome it could not record (of
//! an item it does not name), every item's own outcome is unknown: a value
//! its body returned is unrecorded (returned `Ok` all the same, as
//! `Gate::run` returns it), a failure's release unknown, and the checker
//! gives the benefit of the doubt.

use std::sync::Arc;
use std::time::Duration;

use idem::batch::Batch;
use idem::{Fingerprint, Gate, testing};
use tokio::sync::Barrier;

use super::body::{Body, Plan};
use super::context::Context;
use super::drive::{Run, start};
use super::faults::Faults;
use super::invoke::Ending;
use super::record::BodyLog;
use super::target::Target;
use super::workload::Workload;
use super::{Entry, Event, Got, Guard, Invocation, identity};
use crate::error::JobError;
use crate::rng::XorShift;

/// What the consumers do.
#[derive(Debug, Clone)]
pub struct Batches {
    /// Consumers at once, each with a batch per round.
    pub consumers: usize,
    /// Rounds, each fired at one barrier.
    pub rounds: usize,
    /// Message ids a round's batches are drawn from: a block of the ids,
    /// one guard for all of it, a new block every few rounds.
    pub block: usize,
    /// Rounds on one block before the next.
    pub rounds_per_block: usize,
    /// Items in a batch, at most.
    pub size: usize,
    /// Percent of items pushed a second time into the same batch.
    pub duplicates: u64,
    /// Percent of bodies that fail (and are released).
    pub fail: u64,
    /// Percent of batches sent through the target's cached gate (when it
    /// has one): the cache must never change a batch's answers.
    pub cached: u64,
    /// Longest work of a body.
    pub work: Duration,
    /// Each block's guard is drawn from these: `Plain` (`guard_batch`),
    /// `Replay` (`guard_batch(..).replay()`), `Fingerprint` (replayed, with
    /// payloads 1 and 2), `Ordered` (replayed, each item an ordered event
    /// of `history::entity_of(n)`, `Batch::push_ordered`).
    pub guards: Vec<Guard>,
    /// Stop this long after the start, whatever `rounds` says.
    pub until: Option<Duration>,
    /// The seed of every random choice.
    pub seed: u64,
}

impl Batches {
    /// The figures' description of the run, as a [`Workload`].
    fn workload(&self) -> Workload {
        Workload {
            tasks: self.consumers,
            calls: self.rounds * self.consumers * self.size,
            identities: self.identities(),
            in_play: self.block,
            guards: self.guards.clone(),
            entries: vec![Entry::Batch],
            plans: super::Plans::succeed_or_fail(self.fail),
            metering: false,
            cached: self.cached,
            until: self.until,
            seed: self.seed,
        }
    }

    fn identities(&self) -> usize {
        self.rounds.div_ceil(self.rounds_per_block.max(1)) * self.block
    }
}

/// One item of a batch, as drawn.
struct Item {
    identity: usize,
    fingerprint: Option<u8>,
    plan: Plan,
    work: Duration,
}

/// Runs the consumers against `target` while `faults` (if any) are
/// injected, then reads the store's final state.
pub async fn run_batches(target: &Target, batches: &Batches, faults: Option<&Faults>) -> Run {
    let mut seeds = XorShift::new(batches.seed);
    let blocks = batches.identities() / batches.block;
    let guards: Vec<Guard> = (0..blocks)
        .flat_map(|_| {
            let guard = batches.guards[seeds.below(batches.guards.len() as u64) as usize];
            std::iter::repeat_n(guard, batches.block)
        })
        .collect();
    let started = start(target, &batches.workload(), guards, faults, &mut seeds);
    let barrier = Arc::new(Barrier::new(batches.consumers));
    let consumers: Vec<_> = (0..batches.consumers)
        .map(|_| {
            let (context, barrier) = (started.context.clone(), barrier.clone());
            tokio::spawn(consume(context, batches.clone(), barrier, seeds.next_u64()))
        })
        .collect();
    for consumer in consumers {
        consumer.await.expect("a consumer panicked");
    }
    started.finish().await
}

async fn consume(context: Arc<Context>, batches: Batches, barrier: Arc<Barrier>, seed: u64) {
    let mut rng = XorShift::new(seed);
    for round in 0..batches.rounds {
        // Every consumer goes through every round's barrier, so that none
        // waits for one that stopped: a stopped run sends empty batches.
        let stopped = context.stopped();
        let items = if stopped {
            Vec::new()
        } else {
            draw(&context, &batches, round, &mut rng)
        };
        barrier.wait().await;
        if !items.is_empty() {
            let gate = match &context.target.cached {
                Some(cached) if rng.below(100) < batches.cached => cached,
                _ => &context.target.gate,
            };
            one_batch(&context, gate, items, 1 + rng.below(4) as usize).await;
        }
        if rng.below(100) < 10 {
            tokio::time::sleep(Duration::from_millis(rng.below(20))).await;
        }
    }
}

/// A window of the round's block, at an offset of its own, so that the
/// consumers' windows overlap; some items pushed twice.
fn draw(context: &Context, batches: &Batches, round: usize, rng: &mut XorShift) -> Vec<Item> {
    let first = round / batches.rounds_per_block.max(1) * batches.block;
    let size = 1 + rng.below(batches.size as u64) as usize;
    let offset = rng.below(batches.block.saturating_sub(size).max(1) as u64) as usize;
    let mut identities: Vec<usize> =
        (first + offset..first + (offset + size).min(batches.block)).collect();
    let copies: Vec<usize> = identities
        .iter()
        .copied()
        .filter(|_| rng.below(100) < batches.duplicates)
        .collect();
    for copy in copies {
        let at = rng.below(identities.len() as u64 + 1) as usize;
        identities.insert(at, copy);
    }
    identities
        .into_iter()
        .map(|identity| {
            let fingerprint = match context.guards[identity] {
                Guard::Fingerprint => [Some(1), Some(1), Some(2)][rng.below(3) as usize],
                _ => None,
            };
            let plan = if rng.below(100) < batches.fail {
                Plan::Fail
            } else {
                Plan::Succeed
            };
            let work = Duration::from_micros(rng.below(batches.work.as_micros() as u64 + 1));
            Item {
                identity,
                fingerprint,
                plan,
                work,
            }
        })
        .collect()
}

/// One batch: claims, runs, records, and each item's invocation.
async fn one_batch(context: &Context, gate: &Gate, items: Vec<Item>, concurrency: usize) {
    let recorder = &context.recorder;
    let guard = context.guards[items[0].identity];
    let ids: Vec<u64> = items.iter().map(|_| recorder.next_id()).collect();
    let logs: Vec<Arc<BodyLog>> = items.iter().map(|_| BodyLog::new(recorder)).collect();
    let mut batch = Batch::new();
    for ((item, &id), log) in items.iter().zip(&ids).zip(&logs) {
        let body = Body {
            log: log.clone(),
            plan: item.plan,
            work: item.work,
            value: id,
            effect: None,
            stepped: false,
        };
        match item.fingerprint {
            // An ordered event of `history::entity_of(n)` at
            // `history::order_of(n)`, as the single calls give them.
            None if guard == Guard::Ordered => batch.push_ordered(
                body,
                identity(item.identity),
                &super::entity_identity(item.identity),
                super::order_of(item.identity),
            ),
            Some(payload) => batch.push_fingerprinted(
                body,
                identity(item.identity),
                Fingerprint::new().part(payload),
            ),
            None => batch.push(body, identity(item.identity)),
        };
    }
    let start = recorder.now();
    let (results, events) = testing::observe(async {
        let run = |body: Body| body.run(None);
        if guard == Guard::Plain {
            gate.guard_batch(batch)
                .concurrency(concurrency)
                .run(run)
                .await
        } else {
            gate.guard_batch(batch)
                .concurrency(concurrency)
                .replay()
                .run(run)
                .await
        }
    })
    .await;
    let end = recorder.now();
    let events: Vec<Event> = events.iter().map(Event::from).collect();
    // An outcome the batch could not record, of some item it does not
    // say: every item's own outcome is then unknown as far as its answer
    // goes (a success is still returned `Ok`, as `Gate::run` returns it).
    let unrecorded = events.iter().find_map(|event| match event {
        Event::Unrecorded(reason) => Some(*reason),
        _ => None,
    });
    // What the batch reported that no item's answer can show: passed on
    // to its first item, for the checker to judge.
    let unexpected: Vec<Event> = events
        .iter()
        .filter(|e| matches!(e, Event::Other(_) | Event::Ungated | Event::TookOver))
        .cloned()
        .collect();
    for (index, (((item, id), log), result)) in items
        .into_iter()
        .zip(ids)
        .zip(logs)
        .zip(results)
        .enumerate()
    {
        let body = log.take();
        let mut events = item_events(&result, body.is_some(), unrecorded);
        if index == 0 {
            events.extend(unexpected.iter().cloned());
        }
        recorder.push(Invocation {
            id,
            identity: item.identity,
            fingerprint: item.fingerprint,
            entry: Entry::Batch,
            start,
            end,
            body,
            got: Got::from(Ending::Returned(result)),
            events,
        });
    }
}

/// The events an item's answer proves (see the module docs).
fn item_events(
    result: &Result<u64, JobError>,
    ran: bool,
    unrecorded: Option<&'static str>,
) -> Vec<Event> {
    match (result, ran, unrecorded) {
        (Ok(_), true, Some(reason)) => vec![Event::Won, Event::Unrecorded(reason)],
        (Ok(_), true, None) => vec![Event::Won, Event::Settled],
        (Ok(_), false, _) => vec![Event::Replayed],
        (Err(JobError::Failed), _, Some(_)) => vec![Event::Won],
        (Err(JobError::Failed), _, None) => vec![Event::Won, Event::Released],
        (Err(JobError::Rejected(rejected)), true, _) => {
            vec![Event::Won, Event::Unrecorded(rejected.reason())]
        }
        (Err(JobError::Rejected(rejected)), false, _) => {
            vec![Event::Refused(rejected.reason())]
        }
        (Err(JobError::Store(_)), _, _) => Vec::new(),
    }
}
