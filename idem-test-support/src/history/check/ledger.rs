//! Rule 7, the ledger: under dispositions and reconcilers, the fake
//! provider's ledger is the truth. It charged each key at most once; no
//! two bodies ran at once while the earlier one's lease was live (renewed
//! or not); every probe's verdict, the final row and every caller's answer
//! agree with it; and every caller of a key was told one story (its value
//! the charging body's, or the probe's receipt, never both).

use std::collections::BTreeSet;

use super::{Found, Rule};
use crate::history::{Got, Invocation, ProbeVerdict, receipt};

impl Found<'_, '_> {
    pub(super) fn ledger(&mut self) {
        self.charged_once();
        self.no_live_holder_beside();
        self.probes_read_the_ledger();
        self.row_tells_the_ledger();
        self.one_story();
        self.answers_tell_the_ledger();
    }

    fn charged_once(&mut self) {
        let view = self.view;
        if view.charges.len() > 1 {
            let chargers: Vec<&Invocation> = view
                .charges
                .iter()
                .filter_map(|charge| view.by_id.get(&charge.invocation).copied())
                .collect();
            let what = format!("the provider charged {} times", view.charges.len());
            self.report(Rule::Ledger, what, &chargers);
        }
    }

    /// No body starts while another holds a live lease (one that cannot
    /// have run out, counting its renewals).
    fn no_live_holder_beside(&mut self) {
        let view = self.view;
        let bodies = view.gated_bodies();
        for (i, &(x, x_body)) in bodies.iter().enumerate() {
            for &(y, y_body) in &bodies[i + 1..] {
                if y_body.start < x_body.end && !view.lease_may_run_out(x, y, y_body) {
                    let what = format!(
                        "bodies #{} and #{} ran at once, #{}'s lease still live",
                        x.id, y.id, x.id
                    );
                    self.report(Rule::Ledger, what, &view.between(x.start, y.end));
                }
            }
        }
    }

    fn probes_read_the_ledger(&mut self) {
        let view = self.view;
        for probed in &view.probes {
            let charged_by_then = view.charges.iter().find(|charge| charge.at <= probed.at);
            let agrees = match (probed.verdict, charged_by_then) {
                (ProbeVerdict::Charged(value), Some(charge)) => value == receipt(charge.invocation),
                (ProbeVerdict::Charged(_), None) => false,
                (ProbeVerdict::Failed | ProbeVerdict::NotHappened, charge) => charge.is_none(),
                (ProbeVerdict::Unknown, _) => true,
            };
            if !agrees {
                let what = format!(
                    "a probe answered {:?}, and the ledger had {charged_by_then:?}",
                    probed.verdict
                );
                self.report(Rule::Ledger, what, &[]);
            }
        }
    }

    /// Settled only if charged, kept failed only if not; a charge never
    /// forgotten (a released slot would charge again on the next retry).
    fn row_tells_the_ledger(&mut self) {
        let view = self.view;
        let charged = !view.charges.is_empty();
        let what = match (view.row(), charged) {
            (Some("success"), false) => Some("settled, and the provider charged nothing"),
            (Some("failed"), true) => Some("kept failed, and the provider charged"),
            (None, true) => Some("released, and the provider charged: a retry charges again"),
            _ => None,
        };
        if let Some(what) = what {
            self.report(Rule::Ledger, what.to_owned(), &view.calls);
        }
    }

    /// Every value handed out for the key is one value, and a charge's.
    fn one_story(&mut self) {
        let view = self.view;
        let valued: Vec<(&Invocation, u64)> = view
            .calls
            .iter()
            .filter_map(|&call| match call.got {
                Got::Value(value) => Some((call, value)),
                _ => None,
            })
            .collect();
        // A holder whose outcome was reported unrecorded (its settle failed
        // in an outage: its `Ok` is its body's, and its events say the
        // slot may tell another) is not a story the slot told.
        let told: Vec<&(&Invocation, u64)> = valued
            .iter()
            .filter(|(call, _)| call.unrecorded().is_none())
            .collect();
        let values: BTreeSet<u64> = told.iter().map(|&&(_, value)| value).collect();
        let calls: Vec<&Invocation> = told.iter().map(|&&(call, _)| call).collect();
        if values.len() > 1 {
            let what = format!("callers were told {} stories: {values:?}", values.len());
            self.report(Rule::Ledger, what, &calls);
        }
        let made = |value: u64| {
            view.charges
                .iter()
                .any(|charge| value == charge.invocation || value == receipt(charge.invocation))
        };
        for &(call, value) in valued.iter().filter(|&&(_, value)| !made(value)) {
            let what = format!("#{} was handed {value}, which no charge made", call.id);
            self.report(Rule::Ledger, what, &[call]);
        }
    }

    /// Done (or replayed) only once charged; failed for good only if the
    /// provider never charged.
    fn answers_tell_the_ledger(&mut self) {
        let view = self.view;
        for &call in &view.calls {
            let charged_before = view.charges.iter().any(|charge| charge.at < call.end);
            let what = match call.got.reason() {
                Some("already_done") if !charged_before => Some("told already_done"),
                Some("already_failed") if !view.charges.is_empty() => {
                    Some("told already_failed, and the provider charged")
                }
                _ => None,
            };
            if let Some(what) = what {
                self.report(Rule::Ledger, format!("#{} was {what}", call.id), &[call]);
            }
        }
    }
}
