//! Rule 5, final rows: a row stays `pending` only where a holder's outcome
//! is unknown, no claim is in another state than `pending` or `success`,
//! and every row belongs to an identity.

use super::{Anomaly, Found, Rule};
use crate::history::Final;

impl Found<'_, '_> {
    pub(super) fn final_rows(&mut self) {
        let view = self.view;
        for state in &view.rows {
            if !matches!(*state, "pending" | "success") {
                self.report(Rule::FinalRows, format!("a claim in state {state:?}"), &[]);
            }
        }
        if view.row() == Some("pending") && !view.pending_explained() {
            let what = "pending, and no holder's outcome is unknown".to_owned();
            self.report(Rule::FinalRows, what, &view.calls);
        }
    }
}

/// Claim rows that belong to no identity of the history.
pub(super) fn stray_rows(last: &Final, anomalies: &mut Vec<Anomaly>) {
    for row in last.claims.iter().filter(|row| row.identity.is_none()) {
        anomalies.push(Anomaly {
            rule: Rule::FinalRows,
            identity: None,
            what: format!("a row of no identity: {} ({})", row.address, row.state),
            excerpt: Vec::new(),
        });
    }
}
