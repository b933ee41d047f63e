//! What the store holds once a run is over: the claim rows, the effects of
//! transaction-mode bodies and the metered events, read straight from it.

use std::collections::HashMap;

use idem::sqlx;

use super::meter::meter_event;
use super::target::Target;
use super::{ClaimRow, Final, History, MeterRow, address};

pub(super) async fn read_final(target: &Target, history: &History) -> Final {
    let account = target.gate.account_name();
    let admin = &target.admin;
    let identities: HashMap<String, usize> =
        (0..history.guards.len()).map(|n| (address(n), n)).collect();
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT address, state FROM idem_records WHERE account = $1 AND kind = 'claim'",
    )
    .bind(account)
    .fetch_all(admin)
    .await
    .expect("read the claims");
    let claims = rows
        .into_iter()
        .map(|(address, state)| ClaimRow {
            identity: identities.get(&address).copied(),
            address,
            state,
        })
        .collect();
    let effects: Vec<(i64, i64)> =
        sqlx::query_as("SELECT identity, invocation FROM idem_history_effects WHERE account = $1")
            .bind(account)
            .fetch_all(admin)
            .await
            .expect("read the effects");
    let events: HashMap<String, u64> = history
        .batches
        .iter()
        .flatten()
        .map(|metered| (meter_event(*metered).address(), metered.event))
        .collect();
    let meter_rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT address, quantity FROM idem_records WHERE account = $1 AND kind = 'meter_event'",
    )
    .bind(account)
    .fetch_all(admin)
    .await
    .expect("read the metered events");
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
