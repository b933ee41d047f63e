//! Cutting a holder off inside a step: the set-up of every test of a step
//! whose outcome nobody knows.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem::{Gate, Identity, Rejected};

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
    let began = Arc::new(tokio::sync::Notify::new());
    let run = gate.guard(id).lease(lease).run({
        let (began, ran, name) = (Arc::clone(&began), Arc::clone(ran), name.to_owned());
        async move {
            idem::step(name, async move {
                ran.fetch_add(1, Ordering::SeqCst);
                began.notify_one();
                std::future::pending::<()>().await;
                Ok::<u64, Rejected>(1)
            })
            .await
        }
    });
    tokio::select! {
        _ = run => panic!("the step never finishes"),
        () = began.notified() => {}
    }
}
