//! Rule 8, detached: a request whose client went away (a disconnect, a
//! proxy's timeout) still runs to completion, its outcome recorded, so that
//! the retry gets the stored response; its handler is never cancelled
//! where it may already have taken effect.

use super::{Found, Rule};
use crate::history::{Entry, Left};

impl Found<'_, '_> {
    pub(super) fn detached(&mut self) {
        let view = self.view;
        for &call in view.calls.iter().filter(|call| call.entry == Entry::Http) {
            if call
                .body
                .as_ref()
                .is_some_and(|body| body.left == Left::Cancelled)
            {
                let what = format!(
                    "the handler of #{} was cancelled when its client went away",
                    call.id
                );
                self.report(Rule::Detached, what, &[call]);
            }
        }
    }
}
