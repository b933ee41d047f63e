//! Rule 6, metering: every event of an acknowledged batch is stored exactly
//! once with its quantity, and reported inserted at most once.

use std::collections::BTreeMap;

use super::{Anomaly, Rule};
use crate::history::{Final, History, Reported};

pub(super) fn metering(history: &History, last: &Final, anomalies: &mut Vec<Anomaly>) {
    let mut report = |what: String| {
        anomalies.push(Anomaly {
            rule: Rule::Metering,
            identity: None,
            what,
            excerpt: Vec::new(),
        });
    };
    let mut stored: BTreeMap<u64, Vec<i64>> = BTreeMap::new();
    for row in &last.meter_rows {
        match row.event {
            Some(event) => stored.entry(event).or_default().push(row.quantity),
            None => report("a metered row of no event sent".to_owned()),
        }
    }
    let mut inserted: BTreeMap<u64, usize> = BTreeMap::new();
    let mut acknowledged = vec![false; history.batches.len()];
    for attempt in &history.attempts {
        let Some(reported) = &attempt.reported else {
            continue;
        };
        acknowledged[attempt.batch] = true;
        for (metered, outcome) in history.batches[attempt.batch].iter().zip(reported) {
            match outcome {
                Reported::Inserted => *inserted.entry(metered.event).or_default() += 1,
                Reported::Deduplicated => {}
                Reported::Other(other) => {
                    report(format!(
                        "event {} of an identical re-send: {other}",
                        metered.event
                    ));
                }
            }
        }
    }
    for (event, count) in inserted.iter().filter(|(_, count)| **count > 1) {
        report(format!("event {event} reported inserted {count} times"));
    }
    let sent = history.batches.iter().zip(&acknowledged);
    for metered in sent
        .filter(|(_, acked)| **acked)
        .flat_map(|(batch, _)| batch)
    {
        let rows = stored.get(&metered.event).map_or(&[][..], Vec::as_slice);
        if rows != [metered.quantity] {
            report(format!(
                "event {} (quantity {}) is stored as {rows:?}",
                metered.event, metered.quantity
            ));
        }
    }
}
