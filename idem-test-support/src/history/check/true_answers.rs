//! Rule 4, true answers: every refusal, value, event and message a caller
//! got is true.

use super::{Found, Rule};
use crate::history::{Event, Got, Guard, Invocation, Left};

impl Found<'_, '_> {
    pub(super) fn true_answers(&mut self) {
        let view = self.view;
        for &call in &view.calls {
            if let Got::Value(value) = call.got {
                self.true_value(call, value);
            }
            for event in &call.events {
                if let Some(what) = self.false_event(call, event) {
                    self.report(Rule::TrueAnswers, what, &view.before(call));
                }
            }
            if let Some(what) = self.false_got(call) {
                self.report(Rule::TrueAnswers, what, &[call]);
            }
        }
    }

    fn true_value(&mut self, call: &Invocation, value: u64) {
        let view = self.view;
        let what = match &call.body {
            Some(body) if body.left != Left::Ok(value) => Some(format!(
                "#{} got {value}, which its body did not return",
                call.id
            )),
            Some(_) => None,
            None if !call.has(&Event::Replayed) => Some(format!(
                "#{} got {value}, though no body ran and nothing was replayed",
                call.id
            )),
            None => view.false_replay(call, value),
        };
        if let Some(what) = what {
            let source = view.by_id.get(&value).copied();
            let calls: Vec<&Invocation> = [Some(call), source].into_iter().flatten().collect();
            self.report(Rule::TrueAnswers, what, &calls);
        }
    }

    fn false_event(&self, call: &Invocation, event: &Event) -> Option<String> {
        let view = self.view;
        match event {
            Event::Refused(reason) if !view.refusal_true(call, reason) => Some(format!(
                "#{} was refused {reason}, which was not true",
                call.id
            )),
            Event::Unrecorded(reason) if !view.unrecorded_true(call, reason) => Some(format!(
                "#{}'s outcome was not recorded as {reason}, which was not true",
                call.id
            )),
            Event::Ungated if view.guard != Guard::FailOpen => {
                Some(format!("#{} ran ungated without failing open", call.id))
            }
            Event::Ungated if !view.outage_during(call.start, call.end) => {
                Some(format!("#{} failed open while the store was up", call.id))
            }
            Event::Kept | Event::InDoubt if view.guard != Guard::Reconciled => Some(format!(
                "#{} was kept or held in doubt, though no body of it has a disposition",
                call.id
            )),
            Event::Other(event) => Some(format!("#{} reported an unknown event {event}", call.id)),
            _ => None,
        }
    }

    fn false_got(&self, call: &Invocation) -> Option<String> {
        let view = self.view;
        match &call.got {
            Got::Failed if call.body.as_ref().is_none_or(|body| body.left != Left::Err) => {
                Some(format!(
                    "#{} got its body's error, and its body returned none",
                    call.id
                ))
            }
            Got::Refused {
                says_what_to_do: false,
                reason,
            } => Some(format!(
                "#{}'s refusal ({reason}) does not say what to do",
                call.id
            )),
            Got::Refused { reason, .. }
                if !call.has(&Event::Refused(reason)) && !call.has(&Event::Unrecorded(reason)) =>
            {
                Some(format!(
                    "#{} got {reason}, which the gate never reported",
                    call.id
                ))
            }
            // A stale holder learns its claim was lost only with a success:
            // its failure is its own, and the new holder decides.
            Got::Refused {
                reason: reason @ ("lease_lost" | "claim_lost"),
                ..
            } if call.gated_success().is_none() => Some(format!(
                "#{} got {reason}, though its body did not succeed",
                call.id
            )),
            Got::StoreError if !view.outage_during(call.start, call.end) => Some(format!(
                "#{}'s transaction failed while the store was up",
                call.id
            )),
            _ => None,
        }
    }
}
