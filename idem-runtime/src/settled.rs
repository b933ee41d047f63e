//! A final fact about a slot: what a process may remember of it without
//! asking the store again.
//!
//! A settled success (with its value to replay, if any) and a kept failure
//! never change while their row exists, so they are the only states the
//! outcome cache (feature `cache`) holds. Nothing else can be made into a
//! [`Final`]: a pending claim, or one in doubt, has no constructor here.

use crate::store::{ClaimState, Existing};

/// What the slot of one address holds for good: the identity and
/// fingerprint it was claimed with (so a recalled fact is judged by the
/// same rules as a row read from the store) and its final state.
#[derive(Debug)]
pub(crate) struct Final {
    pub(crate) identity: Box<[u8]>,
    pub(crate) fingerprint: Option<Box<[u8]>>,
    pub(crate) fact: Fact,
}

/// The final state of a slot.
#[derive(Debug)]
pub(crate) enum Fact {
    /// Settled: the action succeeded.
    Success(StoredOutput),
    /// A failure kept for good.
    Failed,
}

/// The value a settled action kept for replay (its row's `output_json`), as
/// far as it is known.
#[derive(Debug)]
pub(crate) enum StoredOutput {
    /// The row was read without its value (the reader did not replay):
    /// whether it holds one, and which, is not known here.
    Unknown,
    /// The value the row holds (`None`: it holds none).
    Known(Option<Box<str>>),
}

impl Final {
    /// The final fact `row` states, if it states one. `output_read`: the
    /// row was read with its stored value (a replaying caller's read), so
    /// its `output` says whether there is one.
    pub(crate) fn of_row(row: &Existing, output_read: bool) -> Option<Final> {
        let fact = if row.settled {
            Fact::Success(if output_read {
                StoredOutput::Known(row.output.as_deref().map(Box::from))
            } else {
                StoredOutput::Unknown
            })
        } else if row.state == ClaimState::Failed {
            Fact::Failed
        } else {
            return None;
        };
        Some(Final {
            identity: row.identity.as_slice().into(),
            fingerprint: row.fingerprint.as_deref().map(Box::from),
            fact,
        })
    }

    /// A success this process just recorded over its own claim, with the
    /// value it wrote (`None`: none).
    pub(crate) fn settled(
        identity: &[u8],
        fingerprint: Option<&[u8]>,
        output: Option<&str>,
    ) -> Final {
        Final {
            identity: identity.into(),
            fingerprint: fingerprint.map(Box::from),
            fact: Fact::Success(StoredOutput::Known(output.map(Box::from))),
        }
    }

    /// A failure this process just kept over its own claim.
    pub(crate) fn failed(identity: &[u8], fingerprint: Option<&[u8]>) -> Final {
        Final {
            identity: identity.into(),
            fingerprint: fingerprint.map(Box::from),
            fact: Fact::Failed,
        }
    }

    /// The bytes this fact holds on the heap, for a cache bounded by memory.
    #[cfg(feature = "cache")]
    pub(crate) fn heap_bytes(&self) -> usize {
        let output = match &self.fact {
            Fact::Success(StoredOutput::Known(Some(output))) => output.len(),
            _ => 0,
        };
        self.identity.len() + self.fingerprint.as_deref().map_or(0, <[u8]>::len) + output
    }
}
