//! Rule 10, ordered: across the ordered identities of one entity
//! ([`Guard::Ordered`]), no two bodies run at once; no body runs after an
//! event of the entity with a newer order was settled (the caller saw
//! `Settled` before the body began); and an event refused `superseded` is
//! older than an event of its entity whose gated body had succeeded by
//! then. Lenient where a fault hides the truth: a success whose settle was
//! not seen is not counted as applied, and any succeeded body may have
//! superseded.

use std::collections::BTreeMap;

use super::{Anomaly, Rule};
use crate::history::{Event, Guard, History, Invocation, entity_of, order_of};

/// Every anomaly of rule 10 in `history`.
pub(super) fn ordered(history: &History, anomalies: &mut Vec<Anomaly>) {
    let mut entities: BTreeMap<usize, Vec<&Invocation>> = BTreeMap::new();
    for call in &history.invocations {
        if history.guards.get(call.identity) == Some(&Guard::Ordered) {
            entities
                .entry(entity_of(call.identity))
                .or_default()
                .push(call);
        }
    }
    for (entity, calls) in entities {
        let mut report = |what: String, involved: &[&Invocation]| {
            anomalies.push(Anomaly {
                rule: Rule::Ordered,
                identity: involved.first().map(|call| call.identity),
                what: format!("entity {entity}: {what}"),
                excerpt: involved.iter().map(ToString::to_string).collect(),
            });
        };
        for (index, &a) in calls.iter().enumerate() {
            let Some(a_body) = a.gated_body() else {
                continue;
            };
            for &b in &calls[index + 1..] {
                let Some(b_body) = b.gated_body() else {
                    continue;
                };
                if a.identity != b.identity
                    && a_body.start < b_body.end
                    && b_body.start < a_body.end
                {
                    report(
                        format!(
                            "the bodies of events {} and {} ran at once",
                            a.identity, b.identity
                        ),
                        &[a, b],
                    );
                }
            }
        }
        for &b in &calls {
            let Some(b_body) = b.gated_body() else {
                continue;
            };
            let newer_applied = calls.iter().find(|a| {
                a.has(&Event::Settled)
                    && a.end < b_body.start
                    && order_of(a.identity) > order_of(b.identity)
            });
            if let Some(&a) = newer_applied {
                report(
                    format!(
                        "event {} (order {}) ran after event {} (order {}) was applied",
                        b.identity,
                        order_of(b.identity),
                        a.identity,
                        order_of(a.identity)
                    ),
                    &[a, b],
                );
            }
        }
        for &call in &calls {
            if !call.has(&Event::Refused("superseded")) {
                continue;
            }
            let newer_succeeded = calls.iter().any(|a| {
                order_of(a.identity) > order_of(call.identity)
                    && a.gated_success().is_some_and(|body| body.end < call.end)
            });
            if !newer_succeeded {
                report(
                    format!(
                        "event {} (order {}) was refused superseded, and no newer event of its \
                         entity had succeeded",
                        call.identity,
                        order_of(call.identity)
                    ),
                    &[call],
                );
            }
        }
    }
}
