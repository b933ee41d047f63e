//! Rule 1, exclusive: no two bodies of one identity run at once, unless
//! one ran ungated or a lease could have run out; none after a success.

use super::{CLOCK_TOLERANCE, Found, Rule};
use crate::history::{BodyRun, Guard, Invocation};

impl Found<'_, '_> {
    pub(super) fn exclusive(&mut self) {
        let view = self.view;
        let bodies = view.gated_bodies();
        for (i, &(x, x_body)) in bodies.iter().enumerate() {
            for &(y, y_body) in &bodies[i + 1..] {
                let overlap = y_body.start < x_body.end;
                // A transaction that took no effect was rolled back: the
                // slot was free again before its body noticed.
                let excused = y.took_over()
                    || view.lease_may_run_out(x, y, y_body)
                    || (view.guard == Guard::Tx && !view.took_effect(x));
                if overlap && !excused {
                    let what = format!("bodies #{} and #{} ran at once", x.id, y.id);
                    self.report(Rule::Exclusive, what, &view.between(x.start, y.end));
                }
            }
        }
        for &(y, y_body) in bodies.iter().filter(|(y, _)| y.took_over()) {
            self.took_over_in_time(y, y_body);
        }
        for &(x, x_body) in bodies.iter().filter(|(x, _)| view.succeeded(x)) {
            for &(y, y_body) in &bodies {
                if y.id != x.id && y_body.start > x_body.end && !view.may_follow_success(x, y) {
                    let what = format!("body #{} ran after #{} had succeeded", y.id, x.id);
                    self.report(Rule::Exclusive, what, &[x, y]);
                }
            }
        }
    }

    fn took_over_in_time(&mut self, y: &Invocation, y_body: &BodyRun) {
        let view = self.view;
        let Some(lease) = view.guard.lease() else {
            let what = format!("#{} took over a claim without a lease", y.id);
            self.report(Rule::Exclusive, what, &[y]);
            return;
        };
        if let Some((holder, expiry)) = view.earliest_takeover(y, lease)
            && y_body.start + CLOCK_TOLERANCE < expiry
        {
            let early = (expiry - y_body.start) / 1_000;
            let what = format!(
                "#{} took over {early} ms before #{}'s lease could run out",
                y.id, holder.id
            );
            self.report(Rule::Exclusive, what, &[holder, y]);
        }
    }
}
