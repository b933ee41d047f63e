//! What one invocation shows: the events it saw, whether it may hold the
//! slot, when its lease ran out at the earliest; and its line in an
//! anomaly's excerpt.

use std::fmt;
use std::time::Duration;

use crate::history::{BodyRun, Entry, Event, Invocation, Left, Micros};

impl Invocation {
    pub(crate) fn has(&self, event: &Event) -> bool {
        self.events.contains(event)
    }

    pub(crate) fn won(&self) -> bool {
        self.has(&Event::Won)
    }

    pub(super) fn took_over(&self) -> bool {
        self.has(&Event::TookOver)
    }

    pub(crate) fn ungated(&self) -> bool {
        self.has(&Event::Ungated)
    }

    pub(crate) fn settled(&self) -> bool {
        self.has(&Event::Settled)
    }

    pub(crate) fn released(&self) -> bool {
        self.has(&Event::Released)
    }

    /// The body ran under a claim.
    pub(super) fn gated_body(&self) -> Option<&BodyRun> {
        self.body.as_ref().filter(|_| !self.ungated())
    }

    /// The body returned `Ok` under a claim.
    pub(super) fn gated_success(&self) -> Option<&BodyRun> {
        self.gated_body()
            .filter(|body| matches!(body.left, Left::Ok(_)))
    }

    /// The claim statement failed, and may have committed all the same:
    /// the caller was refused as unavailable, or (failing open) ran its
    /// body ungated; or the caller went away before it knew. (No identity of these workloads is absent, so ungated
    /// always means a failed claim.)
    pub(super) fn claim_failed(&self) -> bool {
        !self.won()
            && (self.has(&Event::Refused("unavailable"))
                || self.ungated()
                || self.has(&Event::Abandoned))
    }

    /// It may have written the slot's claim row.
    pub(super) fn may_hold(&self) -> bool {
        (self.won() && !self.ungated()) || self.claim_failed()
    }

    /// Its outcome was found no longer its own: another took the claim over.
    pub(super) fn lost_claim(&self) -> bool {
        ["lease_lost", "claim_lost"]
            .into_iter()
            .any(|reason| self.has(&Event::Unrecorded(reason)) || self.got.reason() == Some(reason))
    }

    pub(super) fn unrecorded(&self) -> Option<&'static str> {
        self.events.iter().find_map(|event| match event {
            Event::Unrecorded(reason) => Some(*reason),
            _ => None,
        })
    }

    /// When its lease ran out at the earliest, as seen by an invocation that
    /// began at `seen_at`: the claim was written no earlier than this one's
    /// start, and renewed no earlier than the start of any renewal that had
    /// succeeded by then.
    pub(super) fn lease_runs_out(&self, lease: Duration, seen_at: Micros) -> Micros {
        let renewals = self.body.iter().flat_map(|body| &body.extensions);
        let renewed = renewals.filter(|e| e.renewed && e.end < seen_at);
        renewed.map(|e| e.start).fold(self.start, Micros::max) + lease.as_micros() as Micros
    }

    /// When its claim row was last written, at the latest: by the claim,
    /// before the body; through [`Entry::Claim`], by a lease renewal, which
    /// may have been under way (unrecorded) until the invocation ended.
    pub(super) fn last_write(&self) -> Micros {
        match (&self.body, self.entry) {
            (Some(body), Entry::Attribute | Entry::Run) => body.start,
            _ => self.end,
        }
    }
}

impl fmt::Display for Invocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let seconds = |micros: Micros| micros as f64 / 1e6;
        write!(f, "#{} ", self.id)?;
        if let Some(payload) = self.fingerprint {
            write!(f, "payload {payload} ")?;
        }
        write!(
            f,
            "{:?} {:.6}-{:.6} s",
            self.entry,
            seconds(self.start),
            seconds(self.end)
        )?;
        if let Some(body) = &self.body {
            write!(
                f,
                "; body {:.6}-{:.6} {:?}",
                seconds(body.start),
                seconds(body.end),
                body.left
            )?;
            for extension in &body.extensions {
                let renewed = if extension.renewed {
                    "renewed"
                } else {
                    "failed"
                };
                write!(f, " (extend {:.6} {renewed})", seconds(extension.start))?;
            }
        }
        write!(f, "; got {:?}; events {:?}", self.got, self.events)
    }
}
