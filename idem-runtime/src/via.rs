//! Where a claim's statements run: a pooled connection each (autocommit),
//! or the caller's transaction.

use std::ops::{Deref, DerefMut};
use std::time::Duration;

use sqlx::{PgConnection, PgPool};

use crate::store::guarded::Guarded;

/// Where the statements run.
pub(crate) enum Via<'c> {
    /// Each statement on a connection of its own from the pool, autocommitted.
    Pool(&'c PgPool),
    /// Every statement inside the caller's transaction on this connection.
    Transaction(&'c mut PgConnection),
}

/// A connection for one statement.
pub(crate) enum Conn<'a> {
    Pooled(Guarded),
    Borrowed(&'a mut PgConnection),
}

impl Conn<'_> {
    /// Whether a pooled connection is closed, not returned to the pool,
    /// if dropped now ([`Guarded::close_if_dropped`]); the caller's
    /// connection is the caller's.
    pub(crate) fn close_if_dropped(&mut self, close: bool) {
        if let Conn::Pooled(pooled) = self {
            pooled.close_if_dropped(close);
        }
    }
}

impl Via<'_> {
    pub(crate) async fn connection(&mut self) -> Result<Conn<'_>, sqlx::Error> {
        match self {
            Via::Pool(pool) => Guarded::acquire(pool).await.map(Conn::Pooled),
            Via::Transaction(connection) => Ok(Conn::Borrowed(connection)),
        }
    }

    pub(crate) fn in_transaction(&self) -> bool {
        matches!(self, Via::Transaction(_))
    }

    /// The pauses before repeating a statement sent this way: `pauses`, or
    /// none inside the caller's transaction, which a failed statement has
    /// aborted (only the caller can retry it, whole).
    pub(crate) fn backoff(&self, pauses: &'static [Duration]) -> &'static [Duration] {
        if self.in_transaction() { &[] } else { pauses }
    }
}

impl Deref for Conn<'_> {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        match self {
            Conn::Pooled(pooled) => pooled,
            Conn::Borrowed(connection) => connection,
        }
    }
}

impl DerefMut for Conn<'_> {
    fn deref_mut(&mut self) -> &mut PgConnection {
        match self {
            Conn::Pooled(pooled) => pooled,
            Conn::Borrowed(connection) => connection,
        }
    }
}
