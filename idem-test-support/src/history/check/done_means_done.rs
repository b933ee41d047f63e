//! Rule 3, done means done: no body starts after a caller of its identity
//! was told `AlreadyDone` or handed a replayed value.

use super::{Found, Rule};
use crate::history::Event;

impl Found<'_, '_> {
    pub(super) fn done_means_done(&mut self) {
        let view = self.view;
        let told_done = view
            .calls
            .iter()
            .filter(|call| call.got.reason() == Some("already_done") || call.has(&Event::Replayed));
        for &told in told_done {
            for (later, body) in view.gated_bodies() {
                if body.start > told.end {
                    let what = format!(
                        "body #{} ran after #{} was told it was done",
                        later.id, told.id
                    );
                    self.report(Rule::DoneMeansDone, what, &[told, later]);
                }
            }
        }
    }
}
