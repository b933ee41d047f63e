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

/// Evaluates `$statement` (an expression that awaits one store statement)
/// until it succeeds, fails in a way `$repeatable` does not accept, or the
/// pauses of `$backoff` are used up: the one retry loop of the store's
/// callers. `$on_repeat` hears of each failure that is repeated and of the
/// pause before the repeat.
///
/// A macro rather than a function taking an async closure: the statement
/// borrows the caller's connection mutably on every attempt, and a future
/// built from an async closure that does so is not provably `Send`, which
/// every guarded function's future must be.
macro_rules! repeat {
    ($backoff:expr, $repeatable:expr, $on_repeat:expr, $statement:expr $(,)?) => {{
        let mut pauses = $backoff.iter();
        loop {
            match $statement {
                Err(error) if $repeatable(&error) => match pauses.next() {
                    Some(&pause) => {
                        $on_repeat(&error, pause);
                        tokio::time::sleep(pause).await;
                    }
                    None => break Err(error),
                },
                done => break done,
            }
        }
    }};
}
pub(crate) use repeat;

/// Pauses between attempts to record an outcome (settle or release, a
/// step's begin or record), which are idempotent and worth a retry when a
/// pooled connection died under them.
pub(crate) const RECORD_BACKOFF: [Duration; 2] =
    [Duration::from_millis(25), Duration::from_millis(100)];

/// Runs one statement of a holder on a connection of `$via`, repeated after
/// a transient failure while [`RECORD_BACKOFF`] lasts (none inside the
/// caller's transaction). For statements matched on the claim's fence, or
/// plain reads, which a repeat cannot apply twice.
macro_rules! repeat_recording {
    ($via:expr, |$conn:ident| $statement:expr) => {
        $crate::retry::repeat!(
            $via.backoff(&$crate::retry::RECORD_BACKOFF),
            $crate::retry::is_transient,
            |_, _| {},
            async {
                let mut $conn = $via.connection().await?;
                $statement
            }
            .await,
        )
    };
}
pub(crate) use repeat_recording;

/// Errors that a fresh connection, or a fresh snapshot, may not meet again:
/// worth repeating a statement that is safe to repeat (matched on its
/// fence, or a plain read). Not a pool timeout: the pool has already waited
/// its whole acquire timeout.
pub(crate) fn is_transient(error: &sqlx::Error) -> bool {
    match error {
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
/// failure or deadlock (a claim, a metering batch), repeated only after
/// [`is_serialization_failure`]. The first retry is
/// immediate: a serialization failure means the conflicting write has
/// committed, so a new statement (with a new snapshot) sees it at once.
pub(crate) const SERIALIZATION_BACKOFF: [Duration; 3] = [
    Duration::ZERO,
    Duration::from_millis(10),
    Duration::from_millis(50),
];

/// A serialization failure (40001) or deadlock (40P01): PostgreSQL rolled the
/// statement back whole, so repeating it cannot apply it twice.
pub(crate) fn is_serialization_failure(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(db)
        if db.code().is_some_and(|code| code == "40001" || code == "40P01"))
}
