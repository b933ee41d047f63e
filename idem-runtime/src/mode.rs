//! The opt-in modes of a claim. The default is the plain gate: no lease, no
//! waiting, no fingerprint, fail closed.

use std::time::Duration;

use sha1::{Digest, Sha1};

use crate::identity::{Identity, KeyPart};

/// How a claim behaves beyond the plain gate. Every mode is opt-in.
///
/// ```
/// use std::time::Duration;
/// use idem_runtime::{Fingerprint, Mode, OnUnavailable};
///
/// let mode = Mode::new()
///     .lease(Duration::from_secs(30))
///     .wait(Duration::from_secs(5))
///     .fingerprint(Fingerprint::new().part("4999").part("EUR"));
/// assert_eq!(mode.on_unavailable_policy(), OnUnavailable::Refuse);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Mode {
    lease: Option<Duration>,
    wait: Option<Duration>,
    on_unavailable: OnUnavailable,
    fingerprint: Option<Fingerprint>,
    outcome_commit: OutcomeCommit,
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

/// How the outcome (settle or release) of a claim commits.
///
/// Only the claim must be durable: it is what stops a second run. A settle
/// or release lost in a server crash leaves the row `pending`, which is the
/// fail-closed state, so they may commit without waiting for their WAL to
/// reach the disk. See [`OutcomeCommit::Async`] for the trade-off.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OutcomeCommit {
    /// Settle and release wait for the WAL flush, like every commit by
    /// default. The default.
    #[default]
    Durable,
    /// Settle and release commit with `synchronous_commit = off`, set for
    /// their own transaction inside the statement: they return without
    /// waiting for the disk. The gain is as large as a flush is dear: in
    /// BENCHMARKS.md's full run, where a flush cost 3.5 round trips, 1.21x
    /// the plain gate at concurrency 1 and 1.07x to 1.13x above; about 1.9x
    /// at low concurrency where flushes cost more (pgbench, same machine).
    ///
    /// The trade-off: if the server crashes (not merely the client) within
    /// its WAL writer's delay (by default up to three times
    /// `wal_writer_delay`, 600 ms) after an outcome was recorded, that
    /// outcome is lost and the claim reads as `pending` again: retries of
    /// an action that succeeded are refused as in flight (never run twice),
    /// and retries of an action that failed are refused until an operator
    /// releases the claim (`idem claims release`). Nothing is ever run
    /// twice. A client crash, or a server restart that is not a crash, loses
    /// nothing.
    ///
    /// Ignored (the outcome commits durably) with a lease, where a lost
    /// settle followed by an expired lease would let a duplicate run the
    /// action again, and inside the caller's transaction, whose whole
    /// commit it would otherwise make asynchronous.
    Async,
}

impl Mode {
    /// The plain gate.
    pub fn new() -> Mode {
        Mode::default()
    }

    /// A pending claim expires after `lease`; the next claim then takes it
    /// over with a higher fencing token, and the previous holder's late
    /// settle or release changes nothing. Without a lease, a pending claim
    /// holds until it is resolved.
    #[must_use]
    pub fn lease(mut self, lease: Duration) -> Mode {
        self.lease = Some(lease);
        self
    }

    /// A duplicate that finds the slot in flight waits up to `wait` for it to
    /// resolve (polling with backoff), then returns the outcome: the stored
    /// value (with replay), [`AlreadyDone`](crate::Rejected::AlreadyDone),
    /// or it runs if the holder failed.
    #[must_use]
    pub fn wait(mut self, wait: Duration) -> Mode {
        self.wait = Some(wait);
        self
    }

    /// What to do when the store cannot be reached.
    #[must_use]
    pub fn on_unavailable(mut self, policy: OnUnavailable) -> Mode {
        self.on_unavailable = policy;
        self
    }

    /// A digest of the invocation's payload: a duplicate whose fingerprint
    /// differs is refused with [`KeyReused`](crate::Rejected::KeyReused).
    #[must_use]
    pub fn fingerprint(mut self, fingerprint: Fingerprint) -> Mode {
        self.fingerprint = Some(fingerprint);
        self
    }

    /// How settle and release commit; see [`OutcomeCommit`].
    #[must_use]
    pub fn outcome_commit(mut self, commit: OutcomeCommit) -> Mode {
        self.outcome_commit = commit;
        self
    }

    /// How settle and release commit, as asked ([`OutcomeCommit`] says when
    /// `Async` is ignored).
    pub fn outcome_commit_policy(&self) -> OutcomeCommit {
        self.outcome_commit
    }

    /// The lease, if any.
    pub fn lease_duration(&self) -> Option<Duration> {
        self.lease
    }

    /// How long a duplicate waits, if at all.
    pub fn wait_duration(&self) -> Option<Duration> {
        self.wait
    }

    /// What happens when the store cannot be reached.
    pub fn on_unavailable_policy(&self) -> OnUnavailable {
        self.on_unavailable
    }

    /// The payload fingerprint, if any.
    pub fn payload_fingerprint(&self) -> Option<&Fingerprint> {
        self.fingerprint.as_ref()
    }

    /// The lease in microseconds, as the store takes it.
    pub(crate) fn lease_micros(&self) -> Option<i64> {
        self.lease
            .map(|lease| i64::try_from(lease.as_micros()).unwrap_or(i64::MAX))
    }
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
        assert_eq!(mode.lease_micros(), None);
        assert_eq!(
            Mode::new().lease(Duration::from_secs(2)).lease_micros(),
            Some(2_000_000)
        );
    }
}
