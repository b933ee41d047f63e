//! Which store errors are worth another try, and when.
//!
//! Only statements that are safe to repeat are retried, and only after
//! failures that a repeat may not meet again: a settle, release or lease
//! extension (matched on the fence, so a repeat changes nothing) after a
//! lost connection or a serialization failure; a claim or a metering batch
//! only after a serialization failure or deadlock, which PostgreSQL rolled
//! back whole (after a lost connection their effect is unknown). Nothing is
//! retried inside the caller's transaction, which the failure has already
//! aborted.

use std::time::Duration;

/// When to retry an idempotent store operation (settle, release, extend):
/// after the next pause of `backoff`, when the statement failed
/// transiently ([`is_transient`]); not when the pool was closed on purpose,
/// and not once the pauses are used up.
pub(crate) fn retry_after<T>(
    attempt: &Result<T, sqlx::Error>,
    backoff: &mut std::slice::Iter<'_, Duration>,
) -> Option<Duration> {
    match attempt {
        Err(error) if is_transient(error) => backoff.next().copied(),
        _ => None,
    }
}

/// Errors that a fresh connection, or a fresh snapshot, may not meet again.
pub(crate) fn is_transient(error: &sqlx::Error) -> bool {
    match error {
        // Not PoolTimedOut: the pool has already waited its whole acquire timeout.
        sqlx::Error::Io(_) | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            // 08: connection exception; 57P01-57P03: shutdown, crash, starting up;
            // 40001/40P01: serialization failure, deadlock.
            code.starts_with("08") || code.starts_with("57P") || code == "40001" || code == "40P01"
        }),
        _ => false,
    }
}

/// Pauses between attempts of a statement rolled back by a serialization
/// failure or deadlock (a claim, a metering batch). The first retry is
/// immediate: a serialization failure means the conflicting write has
/// committed, so a new statement (with a new snapshot) sees it at once.
pub(crate) const SERIALIZATION_BACKOFF: [Duration; 3] = [
    Duration::ZERO,
    Duration::from_millis(10),
    Duration::from_millis(50),
];

/// When to send a statement again that may only be repeated after a
/// serialization failure or deadlock ([`is_serialization_failure`]): after
/// the next pause of `backoff`, until the pauses are used up.
pub(crate) fn retry_after_serialization_failure<T>(
    attempt: &Result<T, sqlx::Error>,
    backoff: &mut std::slice::Iter<'_, Duration>,
) -> Option<Duration> {
    match attempt {
        Err(error) if is_serialization_failure(error) => backoff.next().copied(),
        _ => None,
    }
}

/// A serialization failure (40001) or deadlock (40P01): PostgreSQL rolled the
/// statement back whole, so repeating it cannot apply it twice.
pub(crate) fn is_serialization_failure(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(db)
        if db.code().is_some_and(|code| code == "40001" || code == "40P01"))
}
