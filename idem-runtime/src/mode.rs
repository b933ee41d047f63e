//! The opt-in modes of a claim. The default is the plain gate: no lease, no
//! waiting, no fingerprint, fail closed.

use std::time::Duration;

use sha1::{Digest, Sha1};

use crate::error::Rejected;
use crate::identity::{Identity, KeyPart};
use crate::order::EventOrder;
use crate::store::Windows;

/// How a claim behaves beyond the plain gate, as the guard's option
/// methods ([`Guard`](crate::Guard)) set it: the one vocabulary the
/// attribute, the guard, the batch guard and the tower layer share, whose
/// types refuse what does not go together.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Mode {
    lease: Option<Duration>,
    wait: Option<Duration>,
    on_unavailable: OnUnavailable,
    fingerprint: Option<Fingerprint>,
    outcome_commit: OutcomeCommit,
    on_expiry: OnExpiry,
    keep_value_for: Option<Duration>,
    keep_slot_for: Option<Duration>,
    ordered: Option<Ordered>,
}

/// An ordered event's entity and order ([`Guard::ordered`](crate::Guard::ordered)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ordered {
    /// The entity the event belongs to.
    pub(crate) entity: Identity,
    /// Its order, or the order as given when it does not fit.
    pub(crate) order: Result<EventOrder, String>,
}

pub use crate::outcome::Disposition;

/// What a pending claim whose lease ran out becomes, when the next claim of
/// its slot finds it (only with a lease).
///
/// The policy is recorded with the claim, and the stricter one wins: the
/// claim is held in doubt when either it or the duplicate that finds it was
/// made with [`InDoubt`](OnExpiry::InDoubt), and taken over only when both
/// say [`TakeOver`](OnExpiry::TakeOver). A deploy that changes the option,
/// or a call site that never set it, cannot run again what a holder made
/// with `InDoubt` may have done.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnExpiry {
    /// The next claim takes it over with a higher fencing token and runs
    /// the body: right when running twice is safe (the effect is fenced by
    /// the token, or idempotent downstream). The default, as leases always
    /// behaved.
    #[default]
    TakeOver,
    /// The expired claim turns `in_doubt`: nobody runs it until a
    /// reconciler or an operator establishes what happened, and duplicates
    /// are refused with [`Rejected::InDoubt`](crate::Rejected::InDoubt).
    /// What money-moving code wants: a holder that crashed mid-charge may
    /// have charged.
    InDoubt,
}

/// What to do when the store cannot be reached.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnUnavailable {
    /// Refuse with [`Rejected::Unavailable`](crate::Rejected::Unavailable):
    /// the body does not run. The default.
    #[default]
    Refuse,
    /// Run the body unguarded (fail open), with a tracing warning. Only for
    /// actions where a duplicate is harmless, such as cache warming.
    Run,
}

/// How the outcome of a claim (a settle, a release, a kept failure)
/// commits.
///
/// Only the claim must be durable: it is what stops a second run. An
/// outcome lost in a server crash leaves the row `pending`, which is the
/// fail-closed state (duplicates are refused, never run), so it may commit
/// without waiting for its WAL to reach the disk. See
/// [`OutcomeCommit::Async`] for the trade-off.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OutcomeCommit {
    /// Every outcome waits for the WAL flush, like every commit by default.
    /// The default.
    #[default]
    Durable,
    /// Settle, release and keep (a failure kept as definite,
    /// [`Disposition::Keep`]) commit with `synchronous_commit = off`, set
    /// for their own transaction inside the statement: they return without
    /// waiting for the disk. Holding a claim in doubt
    /// ([`Disposition::InDoubt`], a panic, a dropped future) still commits
    /// durably. The gain is as large as a flush is dear, and
    /// largest at low concurrency, where no commit shares another's flush:
    /// BENCHMARKS.md measures it against the plain gate.
    ///
    /// The trade-off: if the server crashes (not merely the client), or
    /// fails over, within its WAL writer's delay (by default up to three
    /// times `wal_writer_delay`, 600 ms; with synchronous replication, also
    /// what the standby had not confirmed) after an outcome was recorded,
    /// that outcome is lost and the claim reads as `pending` again (with
    /// `replay`, the stored value is lost too). That is safe because
    /// `pending` fails closed: retries of an action that succeeded are
    /// refused as in flight (never run twice), and retries of an action
    /// whose failure was released or kept are refused as in flight too (not
    /// run, not told `AlreadyFailed`) until an operator releases the claim
    /// (`idem claims release`). Nothing is ever run twice. A client crash,
    /// or a server restart that is not a crash, loses nothing.
    ///
    /// **Not with a lease**: a settle lost in a crash would leave a pending
    /// row whose lease still runs out, and the next retry would take it
    /// over and run the action a second time, the opposite of failing
    /// closed (a lost release is harmless either way). Neither the
    /// attribute nor the guard ([`Guard::lease`](crate::Guard::lease),
    /// [`Guard::outcome_commit`](crate::Guard::outcome_commit)), and so
    /// neither the batch guard nor the tower layer, takes both; should a
    /// lease reach an asynchronous outcome anyway, it is ignored and the
    /// outcome commits durably. Not inside the caller's transaction either
    /// ([why](crate::Guard::tx)): it is ignored there too. Lease extension
    /// and takeover always commit durably: a takeover is a claim, and a
    /// lost extension would shorten the lease under a live holder. Ignored
    /// on a table Citus distributes too: the setting would be made on the
    /// coordinator while the worker that writes the row commits durably all
    /// the same, and the extra step costs round trips (BENCHMARKS.md
    /// measures it).
    Async,
}

/// The longest lease a claim may have: 100 years (of 365.25 days, as the
/// attribute's `lease = "100y"` counts them). Far beyond any body's run,
/// and far inside what PostgreSQL's timestamps can hold; a claim that
/// should never expire wants no lease at all.
pub const MAX_LEASE: Duration = Duration::from_secs(3_155_760_000);

impl Mode {
    /// The plain gate.
    pub(crate) fn new() -> Mode {
        Mode::default()
    }

    /// A pending claim expires after `lease`; the next claim then takes it
    /// over with a higher fencing token. The previous holder's late release
    /// changes nothing, and its late settle only ever records the success
    /// it reports (never undoing one), then tells it
    /// [`LeaseLost`](crate::Rejected::LeaseLost). Without a lease, a pending
    /// claim holds until it is resolved.
    ///
    /// `lease` must be more than zero (a lease of zero would let every
    /// duplicate take the claim over at once) and at most
    /// [`MAX_LEASE`]; otherwise every claim with this mode is refused
    /// with [`Rejected::InvalidOption`](crate::Rejected::InvalidOption)
    /// before any statement runs (never as an outage, so never failing
    /// open).
    #[must_use]
    pub(crate) fn lease(mut self, lease: Duration) -> Mode {
        self.lease = Some(lease);
        self
    }

    /// A duplicate that finds the slot in flight waits up to `wait` for it to
    /// resolve (attached, woken or polling: `acquire`), then returns the outcome: the stored
    /// value (with replay), [`AlreadyDone`](crate::Rejected::AlreadyDone),
    /// or it runs if the holder failed.
    #[must_use]
    pub(crate) fn wait(mut self, wait: Duration) -> Mode {
        self.wait = Some(wait);
        self
    }

    /// What to do when the store cannot be reached.
    #[must_use]
    pub(crate) fn on_unavailable(mut self, policy: OnUnavailable) -> Mode {
        self.on_unavailable = policy;
        self
    }

    /// A digest of the invocation's payload: a duplicate whose fingerprint
    /// differs is refused with [`KeyReused`](crate::Rejected::KeyReused).
    #[must_use]
    pub(crate) fn fingerprint(mut self, fingerprint: Fingerprint) -> Mode {
        self.fingerprint = Some(fingerprint);
        self
    }

    /// How settle and release commit; see [`OutcomeCommit`].
    #[must_use]
    pub(crate) fn outcome_commit(mut self, commit: OutcomeCommit) -> Mode {
        self.outcome_commit = commit;
        self
    }

    /// What a claim whose lease ran out becomes; see [`OnExpiry`]. Only
    /// meaningful with a [`lease`](Mode::lease).
    #[must_use]
    pub(crate) fn on_expiry(mut self, on_expiry: OnExpiry) -> Mode {
        self.on_expiry = on_expiry;
        self
    }

    /// How long after its outcome a settled claim's value (and what else
    /// is kept with it: the payload's fingerprint) stays kept; see
    /// [`Guard::keep_value_for`](crate::Guard::keep_value_for).
    #[must_use]
    pub(crate) fn keep_value_for(mut self, window: Duration) -> Mode {
        self.keep_value_for = Some(window);
        self
    }

    /// How long after its outcome a settled claim still holds its slot;
    /// see [`Guard::keep_slot_for`](crate::Guard::keep_slot_for).
    #[must_use]
    pub(crate) fn keep_slot_for(mut self, window: Duration) -> Mode {
        self.keep_slot_for = Some(window);
        self
    }

    /// An ordered event of `entity`, at `order` (or the order as given,
    /// when it does not fit); see [`Guard::ordered`](crate::Guard::ordered).
    #[must_use]
    pub(crate) fn ordered(mut self, entity: Identity, order: Result<EventOrder, String>) -> Mode {
        self.ordered = Some(Ordered { entity, order });
        self
    }

    /// Whether the call is an ordered event ([`Mode::ordered`]).
    pub(crate) fn is_ordered(&self) -> bool {
        self.ordered.is_some()
    }

    /// The entity and order of an ordered event, or why they cannot be
    /// used: an order beyond an `i64`, an absent entity (a `None` part), or
    /// a slot window (an event whose slot reopened could run again after a
    /// newer one, and a prune could delete the success its entity has not
    /// yet counted), or failing open (run unguarded, it would be neither
    /// deduplicated nor ordered).
    pub(crate) fn ordered_by(&self) -> Result<Option<(&Identity, EventOrder)>, Rejected> {
        let Some(ordered) = &self.ordered else {
            return Ok(None);
        };
        let order = ordered
            .order
            .clone()
            .map_err(|value| Rejected::InvalidOption {
                option: "order",
                value,
                reason: "an event's order is an i64 (or a time): give one that fits",
            })?;
        if ordered.entity.is_absent() {
            return Err(Rejected::InvalidOption {
                option: "entity",
                value: format!("{:?}", ordered.entity),
                reason: "the entity's identity is absent (a part is None): an ordered event \
                         needs its entity; give every part, or do not order the event",
            });
        }
        if self.on_unavailable == OnUnavailable::Run {
            return Err(Rejected::InvalidOption {
                option: "on_unavailable",
                value: "run".to_owned(),
                reason: "an ordered event cannot fail open: run unguarded, it would be neither \
                         deduplicated nor ordered; drop on_unavailable",
            });
        }
        if let Some(window) = self.keep_slot_for {
            return Err(Rejected::InvalidOption {
                option: "keep_slot_for",
                value: format!("{window:?}"),
                reason: "an ordered event keeps its slot for ever: its entity's order is judged \
                         from it; drop keep_slot_for (keep_value_for is allowed)",
            });
        }
        Ok(Some((&ordered.entity, order)))
    }

    /// The windows in microseconds, as the store takes them, or why they
    /// cannot be used.
    pub(crate) fn windows(&self) -> Result<Windows, Rejected> {
        Ok(Windows {
            value_micros: self
                .keep_value_for
                .map(|window| window_micros("keep_value_for", window))
                .transpose()?,
            slot_micros: self
                .keep_slot_for
                .map(|window| window_micros("keep_slot_for", window))
                .transpose()?,
        })
    }

    /// The slot's window, if it has one (the HTTP layer states it).
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    pub(crate) fn slot_window(&self) -> Option<Duration> {
        self.keep_slot_for
    }

    /// What a claim whose lease ran out becomes.
    pub(crate) fn on_expiry_policy(&self) -> OnExpiry {
        self.on_expiry
    }

    /// Whether a claim made in this mode records that its lease, run out,
    /// holds the slot in doubt: asked for, and a lease to run out.
    pub(crate) fn expires_in_doubt(&self) -> bool {
        self.lease.is_some() && self.on_expiry == OnExpiry::InDoubt
    }

    /// How settle and release commit, as asked ([`OutcomeCommit`] says when
    /// `Async` is ignored).
    pub(crate) fn outcome_commit_policy(&self) -> OutcomeCommit {
        self.outcome_commit
    }

    /// The lease, if any.
    pub(crate) fn lease_duration(&self) -> Option<Duration> {
        self.lease
    }

    /// How long a duplicate waits, if at all.
    pub(crate) fn wait_duration(&self) -> Option<Duration> {
        self.wait
    }

    /// What happens when the store cannot be reached.
    pub(crate) fn on_unavailable_policy(&self) -> OnUnavailable {
        self.on_unavailable
    }

    /// The payload fingerprint, if any.
    pub(crate) fn payload_fingerprint(&self) -> Option<&Fingerprint> {
        self.fingerprint.as_ref()
    }

    /// The lease in microseconds, as the store takes it, or why it cannot
    /// be used.
    pub(crate) fn lease_micros(&self) -> Result<Option<i64>, Rejected> {
        self.lease.map(lease_micros).transpose()
    }
}

/// The longest window a claim may keep its value or its slot for: 100
/// years, as [`MAX_LEASE`]. A slot that should never expire wants no
/// window at all (the default).
pub const MAX_WINDOW: Duration = MAX_LEASE;

/// `window` in microseconds, when it is more than zero and at most
/// [`MAX_WINDOW`]; `option` names it in the refusal.
fn window_micros(option: &'static str, window: Duration) -> Result<i64, Rejected> {
    let invalid = |reason| Rejected::InvalidOption {
        option,
        value: format!("{window:?}"),
        reason,
    };
    if window.is_zero() {
        return Err(invalid(
            "a window of zero would keep nothing: every duplicate would run again (or find \
             nothing to replay); omit the option to keep it for ever",
        ));
    }
    if window > MAX_WINDOW {
        return Err(invalid(
            "it is longer than idem::MAX_WINDOW (100 years); to keep it for ever, omit the \
             option",
        ));
    }
    i64::try_from(window.as_micros()).map_err(|_| invalid("it does not fit in microseconds"))
}

/// `lease` in microseconds, as the store takes it, when it is more than zero
/// and at most [`MAX_LEASE`]: the one check for a lease, whether it is
/// set by a guard's [`lease`](crate::Guard::lease) or by [`Claim::extend`](crate::Claim::extend).
pub(crate) fn lease_micros(lease: Duration) -> Result<i64, Rejected> {
    let invalid = |reason| Rejected::InvalidOption {
        option: "lease",
        value: format!("{lease:?}"),
        reason,
    };
    if lease.is_zero() {
        return Err(invalid(
            "a lease of zero expires at once, so every duplicate would take the claim over; \
             give the body time to finish, or use no lease",
        ));
    }
    if lease > MAX_LEASE {
        return Err(invalid(
            "it is longer than idem::MAX_LEASE (100 years); for a claim that never expires, \
             use no lease",
        ));
    }
    // At most 100 years of microseconds: far inside an i64.
    i64::try_from(lease.as_micros()).map_err(|_| invalid("it does not fit in microseconds"))
}

/// A digest of the arguments that make up an invocation's payload, encoded
/// like an [`Identity`]'s key parts (so any [`KeyPart`] can be one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprint {
    parts: Identity,
}

impl Default for Fingerprint {
    fn default() -> Self {
        Fingerprint::new()
    }
}

impl Fingerprint {
    /// A fingerprint with no parts yet.
    pub fn new() -> Fingerprint {
        Fingerprint {
            parts: Identity::new("idem.fingerprint"),
        }
    }

    /// Appends a part of the payload.
    #[must_use = "`part` returns the extended fingerprint"]
    pub fn part(self, part: impl KeyPart) -> Fingerprint {
        Fingerprint {
            parts: self.parts.part(part),
        }
    }

    /// The 20-byte sha1 digest that the store keeps.
    pub fn digest(&self) -> [u8; 20] {
        Sha1::digest(self.parts.canonical()).into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_differ_with_their_payload() {
        let a = Fingerprint::new().part(4999).part("EUR");
        assert_eq!(
            a.digest(),
            Fingerprint::new().part(4999_i64).part("EUR").digest()
        );
        assert_ne!(
            a.digest(),
            Fingerprint::new().part(5000).part("EUR").digest()
        );
        assert_ne!(a.digest(), Fingerprint::new().part("4999EUR").digest());
    }

    #[test]
    fn the_default_mode_is_the_plain_gate() {
        let mode = Mode::new();
        assert_eq!(mode.lease_duration(), None);
        assert_eq!(mode.wait_duration(), None);
        assert_eq!(mode.on_unavailable_policy(), OnUnavailable::Refuse);
        assert_eq!(mode.lease_micros().ok(), Some(None));
        assert_eq!(
            Mode::new()
                .lease(Duration::from_secs(2))
                .lease_micros()
                .ok(),
            Some(Some(2_000_000))
        );
    }

    #[test]
    fn a_lease_is_more_than_zero_and_at_most_the_maximum() {
        assert!(lease_micros(MAX_LEASE).is_ok());
        assert!(lease_micros(Duration::from_micros(1)).is_ok());
        for lease in [
            Duration::ZERO,
            MAX_LEASE + Duration::from_nanos(1),
            Duration::MAX,
        ] {
            let refused = lease_micros(lease).expect_err("refused");
            assert_eq!(refused.reason(), "invalid_option");
            assert!(!refused.is_retryable());
        }
    }
}
