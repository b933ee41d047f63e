//! Rule 2, kept: at most one success row per identity, only after a body
//! succeeded, and no body's success silently lost.

use super::{Found, Rule};
use crate::history::{Got, Guard, Invocation};

impl Found<'_, '_> {
    pub(super) fn kept(&mut self) {
        let view = self.view;
        let success_rows = view
            .rows
            .iter()
            .filter(|state| **state == "success")
            .count();
        if success_rows > 1 {
            self.report(Rule::Kept, format!("{success_rows} success rows"), &[]);
        }
        let succeeded: Vec<&Invocation> = view
            .calls
            .iter()
            .copied()
            .filter(|call| view.succeeded(call))
            .collect();
        if view.row() == Some("success") && succeeded.is_empty() {
            let what = "a success row, and no body succeeded".to_owned();
            self.report(Rule::Kept, what, &view.calls);
        }
        if view.guard == Guard::Tx {
            self.effects_match_the_row();
            return;
        }
        for call in succeeded {
            if let Some(what) = self.success_lost(call) {
                self.report(Rule::Kept, what, &[call]);
            }
        }
    }

    /// How `call`'s success was lost, if it was: neither kept in the row
    /// nor reported.
    fn success_lost(&self, call: &Invocation) -> Option<String> {
        let view = self.view;
        let row = view.row();
        if call.settled() {
            let lost_in_a_crash = row == Some("pending") && view.crash_may_undo(call);
            (row != Some("success") && !lost_in_a_crash)
                .then(|| format!("#{} was settled, and the row is {row:?}", call.id))
        } else if call.lost_claim() {
            // A stale holder's success is kept in the slot all the same.
            (row != Some("success")).then(|| {
                format!(
                    "#{}'s success was reported lost and not kept: the row is {row:?}",
                    call.id
                )
            })
        } else if call.unrecorded().is_some() || call.got == Got::Cancelled {
            None // reported to its caller, or its caller is gone
        } else {
            Some(format!(
                "#{}'s success was neither settled nor reported",
                call.id
            ))
        }
    }

    /// In a transaction, the body's effect and the settle commit together:
    /// one effect at most, and a success row exactly where there is one.
    fn effects_match_the_row(&mut self) {
        let view = self.view;
        let effects: Vec<&Invocation> = view
            .effects
            .iter()
            .filter_map(|id| view.by_id.get(id).copied())
            .collect();
        let what = if view.effects.len() > 1 {
            Some(format!("{} effects committed", view.effects.len()))
        } else if (view.effects.len() == 1) != (view.row() == Some("success")) {
            Some(format!(
                "{} effects, and the row is {:?}",
                view.effects.len(),
                view.row()
            ))
        } else if effects.iter().any(|call| call.gated_success().is_none()) {
            Some("an effect of a body that did not succeed".to_owned())
        } else {
            None
        };
        if let Some(what) = what {
            self.report(Rule::Kept, what, &effects);
        }
    }
}
