//! The metering task: meters batches of events alongside the calls, and
//! re-sends them, as a client that lost its acknowledgement would.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use idem::meter::{Event as MeterEvent, EventOutcome};

use super::context::Context;
use super::{MeterAttempt, Metered, Reported};
use crate::rng::XorShift;

const METER: &str = "history";

pub(super) fn meter_event(metered: Metered) -> MeterEvent {
    // The same content every time it is sent: a re-send is a duplicate.
    let occurred_at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + metered.event);
    MeterEvent::new(metered.event, METER, metered.quantity, occurred_at)
}

/// Meters batches of new events, re-sends some, and once the faults are
/// over re-sends every batch until each has been acknowledged.
pub(super) async fn meter_batches(context: Arc<Context>, seed: u64) {
    let mut rng = XorShift::new(seed);
    let mut next_event = 0;
    let mut acknowledged = Vec::new();
    while !context.stopped() {
        let resend = !acknowledged.is_empty() && rng.below(100) < 30;
        let batch = if resend {
            rng.below(acknowledged.len() as u64) as usize
        } else {
            let size = 1 + rng.below(8);
            let events = (0..size)
                .map(|k| Metered {
                    event: next_event + k,
                    quantity: 1 + rng.below(5) as i64,
                })
                .collect();
            next_event += size;
            acknowledged.push(false);
            context.recorder.batch(events)
        };
        acknowledged[batch] |= send(&context, batch).await;
        tokio::time::sleep(Duration::from_millis(rng.below(20))).await;
    }
    for (batch, done) in acknowledged.iter().enumerate() {
        for _ in 0..50 {
            if *done || send(&context, batch).await {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Sends one batch and records the attempt; `true` if acknowledged.
async fn send(context: &Context, batch: usize) -> bool {
    let events: Vec<MeterEvent> = context
        .recorder
        .batch_events(batch)
        .into_iter()
        .map(meter_event)
        .collect();
    let start = context.recorder.now();
    let report = context.target.gate.meter().record(&events).await;
    let reported = report.ok().map(|report| {
        report
            .outcomes
            .iter()
            .map(|outcome| match outcome {
                EventOutcome::Inserted => Reported::Inserted,
                EventOutcome::Deduplicated => Reported::Deduplicated,
                other => Reported::Other(format!("{other:?}")),
            })
            .collect()
    });
    let acknowledged = reported.is_some();
    context.recorder.attempt(MeterAttempt {
        batch,
        start,
        end: context.recorder.now(),
        reported,
    });
    acknowledged
}
