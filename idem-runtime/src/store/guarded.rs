//! A pooled connection that is closed, rather than handed back to the
//! pool, when the work on it is dropped part-way through a transaction's
//! `BEGIN`.
//!
//! sqlx counts a transaction (`transaction_depth`) only once `BEGIN`'s
//! answer has come back, and its cancellation guard rolls back only what
//! it counts. So a future dropped while `BEGIN` is in flight (an aborted
//! task, a `select!` that chose another branch, a client gone from the
//! console) leaves the connection inside a transaction sqlx does not know
//! of, and the pool hands it out again: every "autocommitted" statement
//! made on it afterwards, a settle among them, is never committed, and is
//! rolled back when the connection closes. Found by
//! `ordered_events::at_the_edges::dropping_the_claim_in_flight_never_strands_the_entity`
//! on Citus, where an ordered event's claim is a transaction on the
//! gate's pool: a settle that reported success vanished, and the entity
//! stayed held by a pending claim.
//!
//! [`Guarded::begin`] closes the connection (gracefully, on drop) should it
//! be dropped before `BEGIN` is answered; [`Guarded::close_if_dropped`]
//! does the same around any other stretch of work.

use std::ops::{Deref, DerefMut};

use sqlx::pool::PoolConnection;
use sqlx::{Connection, PgConnection, PgPool, Postgres, Transaction};

/// A connection of the pool, closed on drop while armed.
pub(crate) struct Guarded {
    conn: PoolConnection<Postgres>,
    close_if_dropped: bool,
}

impl Guarded {
    /// A connection from `pool`, unarmed.
    pub(crate) async fn acquire(pool: &PgPool) -> Result<Guarded, sqlx::Error> {
        pool.acquire().await.map(Guarded::from)
    }

    /// Opens a transaction, closing the connection should this be dropped
    /// before `BEGIN` is answered (see the module docs). Once it is, sqlx
    /// rolls the transaction back should it be dropped.
    pub(crate) async fn begin(&mut self) -> Result<Transaction<'_, Postgres>, sqlx::Error> {
        self.close_if_dropped = true;
        // An error leaves it armed: a connection whose `BEGIN` failed is in
        // a state nobody knows.
        let tx = self.conn.begin().await?;
        self.close_if_dropped = false;
        Ok(tx)
    }

    /// Whether the connection is closed, not returned to the pool, if it
    /// is dropped now: arm before work that may leave it inside a
    /// transaction when cut short, disarm once it is done.
    pub(crate) fn close_if_dropped(&mut self, close: bool) {
        self.close_if_dropped = close;
    }
}

impl From<PoolConnection<Postgres>> for Guarded {
    fn from(conn: PoolConnection<Postgres>) -> Guarded {
        Guarded {
            conn,
            close_if_dropped: false,
        }
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        if self.close_if_dropped {
            self.conn.close_on_drop();
        }
    }
}

impl Deref for Guarded {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        &self.conn
    }
}

impl DerefMut for Guarded {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.conn
    }
}
