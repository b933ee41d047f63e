//! Cutting a holder off inside a step: the set-up of every test of a step
//! whose outcome nobody knows; and what the store says of a claim's steps.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem::operations::{self, Slot};
use idem::{Gate, Identity, Rejected};
use idem_test_support::fault_proxy::Proxy;

/// The lease of the red teams' holders that get cut off.
pub(crate) const LEASE: Duration = Duration::from_millis(200);

/// Waits for a lease of [`LEASE`] to run out.
pub(crate) async fn past_the_lease() {
    tokio::time::sleep(LEASE + Duration::from_millis(150)).await;
}

/// The steps of `id`'s claim in `gate`'s account and namespace.
pub(crate) async fn steps_of(gate: &Gate, id: &Identity) -> Vec<operations::ClaimStep> {
    let address = id.address();
    operations::steps(
        gate.pool(),
        Slot::new(gate.account_name(), gate.namespace_name(), &address),
    )
    .await
    .expect("list the steps")
}

/// The steps of `id`'s claim begun and never recorded.
pub(crate) async fn pending_of(gate: &Gate, id: &Identity) -> Vec<operations::PendingStep> {
    let address = id.address();
    operations::pending_steps(
        gate.pool(),
        Slot::new(gate.account_name(), gate.namespace_name(), &address),
    )
    .await
    .expect("list the pending steps")
}

/// Runs `id` once under `lease`, its step `name` counting into `ran` and
/// then never finishing, and drops the run once the step began: its holder
/// is cut off inside the step, its marker left for the next holder.
pub(crate) async fn cut_off_inside(
    gate: &Gate,
    id: &Identity,
    name: &str,
    lease: Duration,
    ran: &Arc<AtomicUsize>,
) {
    cut_off_inside_step(gate, id, name, lease, ran, false).await;
}

/// The same, the step declared repeatable: it leaves no marker.
pub(crate) async fn cut_off_inside_repeatable(
    gate: &Gate,
    id: &Identity,
    name: &str,
    lease: Duration,
    ran: &Arc<AtomicUsize>,
) {
    cut_off_inside_step(gate, id, name, lease, ran, true).await;
}

async fn cut_off_inside_step(
    gate: &Gate,
    id: &Identity,
    name: &str,
    lease: Duration,
    ran: &Arc<AtomicUsize>,
    repeatable: bool,
) {
    let began = Arc::new(tokio::sync::Notify::new());
    let run = gate.guard(id).lease(lease).run({
        let (began, ran, name) = (Arc::clone(&began), Arc::clone(ran), name.to_owned());
        async move {
            let step = idem::step(name, async move {
                ran.fetch_add(1, Ordering::SeqCst);
                began.notify_one();
                std::future::pending::<()>().await;
                Ok::<u64, Rejected>(1)
            });
            if repeatable {
                step.repeatable().await
            } else {
                step.await
            }
        }
    });
    tokio::select! {
        _ = run => panic!("the step never finishes"),
        () = began.notified() => {}
    }
}

/// Whether `gate`'s steps carry their records with the run's next
/// statement: on one PostgreSQL, not where Citus distributes
/// `idem_records` (each record is a statement of its own there).
pub(crate) async fn records_are_carried(gate: &Gate) -> bool {
    let citus: bool = idem::sqlx::query_scalar(
        "SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus')",
    )
    .fetch_one(gate.pool())
    .await
    .expect("read the extensions");
    if !citus {
        return true;
    }
    let distributed: bool = idem::sqlx::query_scalar(
        "SELECT EXISTS (SELECT FROM pg_dist_partition \
                        WHERE logicalrelid = to_regclass('idem_records'))",
    )
    .fetch_one(gate.pool())
    .await
    .expect("read Citus's distributed tables");
    !distributed
}

/// A gate on `proxy` for a test that counts statements: its steps' records
/// wait 5 s to ride with the run's next statement, so that a loaded
/// machine's pause between two steps never writes one on its own and the
/// count says what the design costs, not what the scheduler did. (A lease
/// of 20 s or more still carries them: it leaves four waits' margin.)
pub(crate) async fn counting_gate(proxy: &Proxy) -> Gate {
    idem::testing::gate_on(proxy.pool(2).await)
        .await
        .with_step_record_wait(Duration::from_secs(5))
}

/// The statements `proxy` saw while `run` ran, and what it returned.
pub(crate) async fn statements_of<T>(
    proxy: &Proxy,
    run: impl std::future::Future<Output = T>,
) -> (T, u64) {
    let before = proxy.executions();
    let output = run.await;
    (output, proxy.executions() - before)
}

/// The recorded value (JSON) of `id`'s step `name`, if recorded.
pub(crate) async fn recorded(gate: &Gate, id: &Identity, name: &str) -> Option<String> {
    let steps = steps_of(gate, id).await;
    let step = steps.iter().find(|s| s.name.as_deref() == Some(name))?;
    idem::sqlx::query_scalar(
        "SELECT output_json FROM idem_records WHERE account = $1 AND kind = 'step' \
         AND address = $2 AND state = 'success' \
         AND namespace IS NOT DISTINCT FROM $3",
    )
    .bind(gate.account_name())
    .bind(&step.address)
    .bind(gate.namespace_name())
    .fetch_optional(gate.pool())
    .await
    .expect("the step's record")
    .flatten()
}
