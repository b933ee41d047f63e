//! One identity's part of the history and of the final state, and what the
//! rules ask of it: when a claim may have stood, which answers were true.

use std::collections::HashMap;
use std::time::Duration;

use super::{Anomaly, CLOCK_TOLERANCE, OUTAGE_GRACE, Rule};
use crate::history::{
    BodyRun, Charge, Fault, FaultKind, Final, Guard, History, Invocation, Left, Micros, Probed,
    WAIT,
};

/// One identity's part of the history and of the final state.
pub(crate) struct View<'h> {
    identity: usize,
    pub(crate) guard: Guard,
    /// By start.
    pub(crate) calls: Vec<&'h Invocation>,
    pub(super) rows: Vec<&'h str>,
    pub(super) effects: Vec<u64>,
    /// The provider's charges of this identity, in order.
    pub(super) charges: Vec<&'h Charge>,
    /// What probes answered about it, in order.
    pub(super) probes: Vec<&'h Probed>,
    faults: &'h [Fault],
    pub(super) by_id: &'h HashMap<u64, &'h Invocation>,
}

pub(crate) fn views<'h>(
    history: &'h History,
    last: &'h Final,
    by_id: &'h HashMap<u64, &'h Invocation>,
) -> Vec<View<'h>> {
    let mut views: Vec<View> = (0..history.guards.len())
        .map(|identity| View {
            identity,
            guard: history.guards[identity],
            calls: Vec::new(),
            rows: Vec::new(),
            effects: Vec::new(),
            charges: Vec::new(),
            probes: Vec::new(),
            faults: &history.faults,
            by_id,
        })
        .collect();
    for invocation in &history.invocations {
        views[invocation.identity].calls.push(invocation);
    }
    for view in &mut views {
        view.calls.sort_by_key(|call| (call.start, call.id));
    }
    for row in &last.claims {
        if let Some(identity) = row.identity {
            views[identity].rows.push(&row.state);
        }
    }
    for &(identity, invocation) in &last.effects {
        views[identity].effects.push(invocation);
    }
    for charge in &history.charges {
        views[charge.identity].charges.push(charge);
    }
    for probed in &history.probes {
        views[probed.identity].probes.push(probed);
    }
    views
}

impl<'h> View<'h> {
    /// Gated bodies, by start.
    pub(super) fn gated_bodies(&self) -> Vec<(&'h Invocation, &'h BodyRun)> {
        let mut bodies: Vec<_> = self
            .calls
            .iter()
            .filter_map(|&call| call.gated_body().map(|body| (call, body)))
            .collect();
        bodies.sort_by_key(|(call, body)| (body.start, call.id));
        bodies
    }

    pub(super) fn took_effect(&self, call: &Invocation) -> bool {
        self.effects.contains(&call.id)
    }

    /// Its body succeeded, and (in a transaction) took effect.
    pub(super) fn succeeded(&self, call: &Invocation) -> bool {
        call.gated_success().is_some() && (self.guard != Guard::Tx || self.took_effect(call))
    }

    pub(crate) fn row(&self) -> Option<&'h str> {
        self.rows.first().copied()
    }

    /// A fault was active between `start` and `end`, or had just been.
    pub(super) fn outage_during(&self, start: Micros, end: Micros) -> bool {
        self.faults
            .iter()
            .any(|fault| fault.start <= end && start <= fault.end + OUTAGE_GRACE)
    }

    /// `call`'s outcome commits asynchronously, and a crash came after its
    /// body: the outcome may be lost, the row pending again.
    pub(super) fn crash_may_undo(&self, call: &Invocation) -> bool {
        let since = call.body.as_ref().map_or(call.start, |body| body.end);
        self.guard == Guard::AsyncOutcome
            && self
                .faults
                .iter()
                .any(|fault| fault.kind == FaultKind::Crash && fault.end >= since)
    }

    /// Its settle or release is known to have landed for good.
    fn outcome_durable(&self, call: &Invocation) -> bool {
        (call.settled() || call.released()) && !self.crash_may_undo(call)
    }

    /// Its claim row may be pending still: it may have written one, and no
    /// outcome of its own is known to have replaced it. (A transaction's
    /// row never outlives it pending.)
    fn outcome_unknown(&self, call: &Invocation) -> bool {
        call.may_hold()
            && self.guard != Guard::Tx
            && (call.claim_failed() || !(self.outcome_durable(call) || call.lost_claim()))
    }

    /// Until when `call`'s claim row may have stood `pending`: its end, or,
    /// with its outcome unknown, until its lease ran out (forever without).
    fn pending_until(&self, call: &Invocation) -> Micros {
        if !self.outcome_unknown(call) {
            return call.end;
        }
        match self.guard.lease() {
            Some(lease) => {
                let expired = call.last_write() + lease.as_micros() as Micros + CLOCK_TOLERANCE;
                expired.max(call.end)
            }
            None => Micros::MAX,
        }
    }

    /// A success of `call` is recorded for good by the time it ends: settled,
    /// or (a stale holder's) kept in the slot.
    fn success_kept(&self, call: &Invocation) -> bool {
        call.gated_success().is_some() && (call.settled() || call.lost_claim())
    }

    /// `y`'s body may start after `x`'s succeeded: only under a lease, and
    /// only while `x`'s success was not recorded yet (or never was).
    pub(super) fn may_follow_success(&self, x: &Invocation, y: &Invocation) -> bool {
        self.guard.lease().is_some() && (!self.success_kept(x) || y.start < x.end)
    }

    /// When a takeover by `y` was possible at the earliest: the row it took
    /// over was written no earlier than the start of any invocation that
    /// had won before `y` began, so its lease ran out no earlier than that
    /// plus the lease. That invocation, and the time.
    pub(super) fn earliest_takeover(
        &self,
        y: &Invocation,
        lease: Duration,
    ) -> Option<(&'h Invocation, Micros)> {
        self.calls
            .iter()
            .filter(|w| w.id != y.id && w.won() && !w.ungated())
            .filter(|w| w.body.as_ref().is_some_and(|body| body.start < y.start))
            .map(|&w| (w, w.lease_runs_out(lease, y.start)))
            .max_by_key(|&(_, expiry)| expiry)
    }

    /// `x`'s lease may have run out before `y` claimed (at the latest when
    /// its body started): then `x`'s claim may have been taken over, by `y`
    /// or by another that released it for `y` to claim anew, and both
    /// bodies may run at once.
    pub(super) fn lease_may_run_out(
        &self,
        x: &Invocation,
        y: &Invocation,
        y_body: &BodyRun,
    ) -> bool {
        self.guard
            .lease()
            .is_some_and(|lease| x.lease_runs_out(lease, y.start) <= y_body.start + CLOCK_TOLERANCE)
    }

    /// Why replaying `value` to `call` is false, if it is: the value must
    /// be what a gated body of the same identity and the same payload
    /// returned before the replay ended.
    pub(super) fn false_replay(&self, call: &Invocation, value: u64) -> Option<String> {
        if !self.guard.replays() {
            return Some(format!("#{} was replayed a value without replay", call.id));
        }
        let Some(source) = self.by_id.get(&value) else {
            return Some(format!(
                "#{} was replayed {value}, which no invocation made",
                call.id
            ));
        };
        let returned_it = source
            .gated_success()
            .is_some_and(|body| body.left == Left::Ok(value) && body.end < call.end);
        if source.identity != call.identity || !returned_it {
            return Some(format!(
                "#{} was replayed {value}, which no earlier success of this identity returned",
                call.id
            ));
        }
        (source.fingerprint != call.fingerprint).then(|| {
            format!(
                "#{} (payload {:?}) was replayed the value of #{} (payload {:?})",
                call.id, call.fingerprint, source.id, source.fingerprint
            )
        })
    }

    /// Whether the refusal `reason` was true for `call`.
    pub(super) fn refusal_true(&self, call: &Invocation, reason: &str) -> bool {
        match reason {
            // Some body succeeded before; with replay, one whose value could
            // not go to this caller (one of them gave a payload, the other
            // not): a matching one is replayed, another payload refused.
            "already_done" => self.calls.iter().any(|x| {
                self.succeeded(x)
                    && x.gated_success().is_some_and(|body| body.end < call.end)
                    && (!self.guard.replays()
                        || x.fingerprint.is_some() != call.fingerprint.is_some())
            }),
            // Some claim may have stood pending while `call` ran (lenient
            // where a fault makes it unknowable: see `pending_until`); a
            // waiting duplicate gives up only once its wait ran out.
            "in_flight" => {
                let waited_out = self.guard != Guard::Wait
                    || call.end - call.start + CLOCK_TOLERANCE >= WAIT.as_micros() as Micros;
                waited_out
                    && self.calls.iter().any(|w| {
                        w.id != call.id
                            && w.may_hold()
                            && w.start < call.end
                            && self.pending_until(w) > call.start
                    })
            }
            "key_reused" => self.payload_differs(call),
            "unavailable" => self.outage_during(call.start, call.end),
            _ => false,
        }
    }

    /// Another payload's claim may have stood in the slot while `call` ran.
    fn payload_differs(&self, call: &Invocation) -> bool {
        let Some(ours) = call.fingerprint else {
            return false;
        };
        self.calls.iter().any(|w| {
            w.fingerprint.is_some_and(|theirs| theirs != ours)
                && w.may_hold()
                && w.start < call.end
                && !(w.released() && w.end < call.start)
        })
    }

    /// Whether `call`'s outcome was truly not recorded for `reason`.
    pub(super) fn unrecorded_true(&self, call: &Invocation, reason: &str) -> bool {
        match reason {
            "unavailable" => {
                let since = call.body.as_ref().map_or(call.start, |body| body.end);
                self.outage_during(since, call.end)
            }
            "lease_lost" | "claim_lost" => {
                self.guard.lease().is_some() && self.taken_over_from(call)
            }
            "not_recorded" => self.late_success_over(call),
            _ => false,
        }
    }

    /// An earlier holder, whose claim was lost while its body ran, recorded
    /// its success late, over the row of `call`, which had replaced its
    /// claim: the slot records that success, not `call`'s. "Earlier" is
    /// when each won its claim (its body began), not when it was called: a
    /// caller can start first, be refused in flight, and take the claim
    /// over only after a later caller held it.
    fn late_success_over(&self, call: &Invocation) -> bool {
        let won_at = |x: &Invocation| x.body.as_ref().map_or(x.start, |body| body.start);
        self.calls.iter().any(|y| {
            y.id != call.id
                && y.lost_claim()
                && y.gated_success().is_some()
                && won_at(y) < won_at(call)
                && y.end > won_at(call)
        })
    }

    /// Another invocation took the claim over while `call` held it (or
    /// tried to, and may have committed before its reply was lost).
    fn taken_over_from(&self, call: &Invocation) -> bool {
        self.calls.iter().any(|y| {
            let decided = y.body.as_ref().map_or(y.end, |body| body.start);
            y.id != call.id
                && (y.took_over() || y.claim_failed())
                && y.start < call.end
                && decided > call.start
        })
    }

    /// Some holder's outcome is unknown, and no holder after it recorded an
    /// outcome for good.
    pub(super) fn pending_explained(&self) -> bool {
        self.calls.iter().any(|w| {
            self.outcome_unknown(w)
                && !self
                    .calls
                    .iter()
                    .any(|d| d.start > w.end && d.won() && self.outcome_durable(d))
        })
    }

    /// The invocations that ran at some time between `start` and `end`.
    pub(super) fn between(&self, start: Micros, end: Micros) -> Vec<&'h Invocation> {
        let calls = self.calls.iter().copied();
        calls
            .filter(|call| call.start < end && start < call.end)
            .collect()
    }

    /// The invocations that could have made `call`'s answer true: the last
    /// few that began before it ended, `call` among them.
    pub(super) fn before(&self, call: &'h Invocation) -> Vec<&'h Invocation> {
        let earlier: Vec<&Invocation> = self
            .calls
            .iter()
            .copied()
            .filter(|other| other.start < call.end)
            .collect();
        earlier[earlier.len().saturating_sub(16)..].to_vec()
    }

    pub(super) fn anomaly(&self, rule: Rule, what: String, calls: &[&Invocation]) -> Anomaly {
        Anomaly {
            rule,
            identity: Some(self.identity),
            what: format!("{what} ({})", self.guard.name()),
            // Enough to see what happened; a whole identity can be long.
            excerpt: calls.iter().take(24).map(ToString::to_string).collect(),
        }
    }
}
