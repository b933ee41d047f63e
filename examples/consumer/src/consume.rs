//! One batch: read the deliveries, run them through the batch guard, and
//! tell JetStream what became of each.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_nats::jetstream::{self, AckKind};
use idem::batch::Batch;
use idem::sqlx::PgPool;
use idem::{Gate, OnExpiry, Rejected};
use serde::Serialize;

use crate::decide::{Decision, Delays, ItemError, ItemResult, decide};
use crate::ledger::{EffectError, Ledger, effect_bound};
use crate::message::Order;

/// What a consumer process needs to apply a batch.
pub struct Applier {
    /// This process's name, written into each ledger row (which consumer
    /// applied it: the test reads it back).
    pub name: String,
    /// The gate, scoped to the consumer's account. `None` runs every
    /// delivery's effect unguarded (`--no-idem`): the control that shows
    /// what at-least-once delivery does without idem.
    pub gate: Option<Gate>,
    /// The ledger's database.
    pub pool: PgPool,
    /// Where the effect goes.
    pub ledger: Ledger,
    /// Each claim's lease: the whole batch's time, and then some.
    pub lease: Duration,
    /// How many bodies of a batch run at once.
    pub concurrency: usize,
    /// How long each body works before its effect (a stand-in for a call
    /// elsewhere; it makes a kill land between effects in the test).
    pub work: Duration,
    /// Nak delays.
    pub delays: Delays,
    /// For tests: the process aborts right after this many effects, before
    /// their batch's outcomes are recorded, as a SIGKILL there would.
    pub abort_after_effects: Option<AtomicUsize>,
}

/// One delivery whose payload is an order.
struct Delivery {
    message: jetstream::Message,
    order: Order,
    stream_sequence: u64,
    delivered: i64,
}

/// What one batch did, printed as one JSON line (the test adds them up).
#[derive(Debug, Default, Serialize)]
pub struct Tally {
    /// Messages received.
    pub deliveries: usize,
    /// Of those, deliveries after the first (JetStream's redeliveries:
    /// an ack wait ran out, or a nak).
    pub redeliveries: usize,
    /// Bodies that ran and applied their effect.
    pub effects: usize,
    /// Refused `AlreadyDone`: a duplicate idem absorbed.
    pub already_done: usize,
    /// Refused `InFlight`.
    pub in_flight: usize,
    /// Refused `InDoubt`.
    pub in_doubt: usize,
    /// Refused `Unavailable`.
    pub unavailable: usize,
    /// Refused `KeyReused` or `AlreadyFailed`.
    pub refused_for_good: usize,
    /// Other refusals, and bodies whose effect failed.
    pub other: usize,
    /// Payloads that are not orders (terminated at once).
    pub poison: usize,
    /// Acks sent.
    pub acked: usize,
    /// Naks sent.
    pub naked: usize,
    /// Terms sent.
    pub termed: usize,
    /// Acknowledgements the client failed to send (the message is
    /// redelivered after its ack wait).
    pub ack_errors: usize,
}

impl Applier {
    /// Applies one batch of messages and acknowledges each.
    pub async fn apply(&self, messages: Vec<jetstream::Message>) -> Tally {
        let mut tally = Tally {
            deliveries: messages.len(),
            ..Tally::default()
        };
        let mut deliveries = Vec::with_capacity(messages.len());
        for message in messages {
            let (stream_sequence, delivered) = match message.info() {
                Ok(info) => (info.stream_sequence, info.delivered),
                Err(_) => (0, 1),
            };
            if delivered > 1 {
                tally.redeliveries += 1;
            }
            match Order::parse(&message.payload) {
                Ok(order) => deliveries.push(Delivery {
                    message,
                    order,
                    stream_sequence,
                    delivered,
                }),
                Err(error) => {
                    tracing::warn!(stream_sequence, %error, "not an order: terminated");
                    tally.poison += 1;
                    send(&message, Decision::Term, &mut tally).await;
                }
            }
        }

        let results = match &self.gate {
            Some(gate) => self.guarded(gate, &deliveries).await,
            None => self.unguarded(&deliveries).await,
        };

        for (delivery, result) in deliveries.iter().zip(&results) {
            count(result, &mut tally);
            if let Err(error) = result {
                tracing::debug!(order = %delivery.order.order, %error, "not applied now");
            }
            send(&delivery.message, decide(result, self.delays), &mut tally).await;
        }
        tally
    }

    /// The inbox pattern: one statement claims the whole batch, the won
    /// items' bodies run, one statement per kind of outcome records them.
    async fn guarded(&self, gate: &Gate, deliveries: &[Delivery]) -> Vec<ItemResult> {
        let mut batch = Batch::new();
        for delivery in deliveries {
            batch.push_fingerprinted(
                delivery,
                delivery.order.identity(),
                delivery.order.fingerprint(),
            );
        }
        // A consumer killed between its effects and their settle leaves
        // its claims pending. When the lease runs out they turn in doubt
        // (never taken over and run again), and the reconciler's probe
        // settles or releases each by looking for its ledger row.
        gate.guard_batch(batch)
            .concurrency(self.concurrency)
            .lease(self.lease)
            .on_expiry(OnExpiry::InDoubt)
            .disposition(ItemError::disposition)
            .run(|delivery| self.effect(delivery))
            .await
    }

    /// The control: every delivery applied, no gate.
    async fn unguarded(&self, deliveries: &[Delivery]) -> Vec<ItemResult> {
        let mut results = Vec::with_capacity(deliveries.len());
        for delivery in deliveries {
            results.push(self.effect(delivery).await);
        }
        results
    }

    /// A body: the work, then the effect.
    async fn effect(&self, delivery: &Delivery) -> ItemResult {
        if !self.work.is_zero() {
            tokio::time::sleep(self.work).await;
        }
        let applied = self
            .ledger
            .apply(
                &self.pool,
                &delivery.order,
                &self.name,
                delivery.stream_sequence,
                delivery.delivered,
            )
            .await;
        if let Err(error) = applied {
            if matches!(error, EffectError::Unknown(_)) {
                // The connection broke, but the server may still be
                // running the statement. Wait out its statement_timeout
                // before the claim is held in doubt: by the time a probe
                // can look, whatever the statement did is done.
                tokio::time::sleep(effect_bound(self.lease)).await;
            }
            return Err(error.into());
        }
        if let Some(left) = &self.abort_after_effects
            && left.fetch_sub(1, Ordering::SeqCst) <= 1
        {
            emit_abort(&self.name);
            std::process::abort();
        }
        Ok(())
    }
}

/// Says, before aborting, that the abort was asked for.
fn emit_abort(name: &str) {
    println!("{}", serde_json::json!({"event": "abort", "name": name}));
}

/// Adds one item's result to the tally.
fn count(result: &ItemResult, tally: &mut Tally) {
    match result {
        Ok(()) => tally.effects += 1,
        Err(ItemError::Rejected(Rejected::AlreadyDone)) => tally.already_done += 1,
        Err(ItemError::Rejected(Rejected::InFlight)) => tally.in_flight += 1,
        Err(ItemError::Rejected(Rejected::InDoubt)) => tally.in_doubt += 1,
        Err(ItemError::Rejected(Rejected::Unavailable { .. })) => tally.unavailable += 1,
        Err(ItemError::Rejected(Rejected::KeyReused | Rejected::AlreadyFailed)) => {
            tally.refused_for_good += 1;
        }
        Err(_) => tally.other += 1,
    }
}

/// Sends `decision` for `message`. A failed send is logged and left to
/// JetStream: the message is redelivered after its ack wait, and the gate
/// answers that delivery truthfully.
async fn send(message: &jetstream::Message, decision: Decision, tally: &mut Tally) {
    let kind = match decision {
        Decision::Ack => {
            tally.acked += 1;
            AckKind::Ack
        }
        Decision::Nak(delay) => {
            tally.naked += 1;
            AckKind::Nak(Some(delay))
        }
        Decision::Term => {
            tally.termed += 1;
            AckKind::Term
        }
    };
    if let Err(error) = message.ack_with(kind).await {
        tally.ack_errors += 1;
        tracing::warn!(%error, "acknowledgement not sent: the message will be redelivered");
    }
}
