//! Rule 9, steps: no step of an identity that is not declared repeatable
//! runs twice in gated bodies, whatever came between (a release, a
//! takeover, a holder cut off inside the step, a reply lost). An ungated
//! body runs its steps unrecorded, by design, and is not counted.

use std::collections::BTreeMap;

use super::{Found, Rule};
use crate::history::Invocation;

impl Found<'_, '_> {
    pub(super) fn steps(&mut self) {
        let mut ran: BTreeMap<&str, Vec<&Invocation>> = BTreeMap::new();
        for (call, body) in self.view.gated_bodies() {
            for step in body.steps.iter().filter(|step| !step.repeatable) {
                ran.entry(step.name).or_default().push(call);
            }
        }
        for (name, calls) in ran {
            if let [first, second, ..] = calls[..] {
                let what = format!(
                    "step {name:?}, not repeatable, ran {} times: in body #{} and again in \
                     body #{}",
                    calls.len(),
                    first.id,
                    second.id
                );
                self.report(Rule::Steps, what, &calls);
            }
        }
    }
}
