//! A pool through the fault proxy that lets the proxy see every statement:
//! the set-up of the tests of replies lost after a commit
//! (`faults::lost_replies`, `hand_api`).

use std::time::Duration;

use idem::sqlx::PgPool;
use idem::sqlx::postgres::PgPoolOptions;
use idem_test_support::fault_proxy::Proxy;

/// A small pool connected through `proxy`, each statement's SQL in its own
/// Parse message (no statement cache) so the proxy can recognise it.
pub(crate) async fn pool_through(proxy: &Proxy) -> PgPool {
    PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with(proxy.options().statement_cache_capacity(0))
        .await
        .expect("connect through the proxy")
}
