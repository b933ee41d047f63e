//! What the store holds once a run is over: the claim rows, the effects of
//! transaction-mode bodies and the metered events, read straight from it.

use std::collections::HashMap;

use idem::sqlx::postgres::PgRow;
use idem::sqlx::{self, FromRow, PgPool};

use super::meter::meter_event;
use super::target::Target;
use super::{ClaimRow, Final, History, MeterRow, address_of};

pub(super) async fn read_final(target: &Target, history: &History) -> Final {
    let account = target.gate.account_name();
    let admin = &target.admin;
    let identities: HashMap<String, usize> = (0..history.guards.len())
        .map(|n| (address_of(history.keys, n), n))
        .collect();
    let rows: Vec<(String, String)> = of_account(
        admin,
        "SELECT address, state FROM idem_records WHERE account = $1 AND kind = 'claim'",
        account,
    )
    .await;
    let claims = rows
        .into_iter()
        .map(|(address, state)| ClaimRow {
            identity: identities.get(&address).copied(),
            address,
            state,
        })
        .collect();
    let effects: Vec<(i64, i64)> = of_account(
        admin,
        "SELECT identity, invocation FROM idem_history_effects WHERE account = $1",
        account,
    )
    .await;
    let events: HashMap<String, u64> = history
        .batches
        .iter()
        .flatten()
        .map(|metered| (meter_event(*metered).address(), metered.event))
        .collect();
    let meter_rows: Vec<(String, i64)> = of_account(
        admin,
        "SELECT address, quantity FROM idem_records WHERE account = $1 AND kind = 'meter_event'",
        account,
    )
    .await;
    Final {
        claims,
        effects: effects
            .into_iter()
            .map(|(identity, invocation)| (identity as usize, invocation as u64))
            .collect(),
        meter_rows: meter_rows
            .into_iter()
            .map(|(address, quantity)| MeterRow {
                event: events.get(&address).copied(),
                quantity,
            })
            .collect(),
    }
}

/// The rows `sql` selects for `account` (its `$1`).
///
/// # Panics
/// When the statement fails, showing it.
async fn of_account<T>(admin: &PgPool, sql: &'static str, account: &str) -> Vec<T>
where
    T: for<'r> FromRow<'r, PgRow> + Send + Unpin,
{
    sqlx::query_as(sql)
        .bind(account)
        .fetch_all(admin)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}
