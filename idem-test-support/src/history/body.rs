//! The bodies of the guarded action: what each is told to do, the effect a
//! transaction-mode body writes, and the quiet of a planned panic.

use std::sync::{Arc, Once};
use std::time::Duration;

use idem::sqlx::{self, PgConnection, PgPool};

use super::Left;
use super::record::BodyLog;
use crate::error::JobError;

/// What a body is told to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Return `Ok` with its invocation's id.
    Succeed,
    /// Return `Err(JobError::Failed)`.
    Fail,
    /// Panic at the end of its work (contained by the invocation that ran it).
    Panic,
    /// Never return: its caller drops it.
    Hang,
}

/// The payload of a planned panic, which the panic hook keeps quiet.
const PLANNED_PANIC: &str = "a planned panic in a body";

/// A body: it logs its run and does what its plan says.
pub struct Body {
    pub(super) log: Arc<BodyLog>,
    pub(super) plan: Plan,
    pub(super) work: Duration,
    /// Its invocation's id: the value it returns, and its effect's key.
    pub(super) value: u64,
    /// Where a transaction-mode body writes its effect.
    pub(super) effect: Option<(Arc<str>, usize)>,
    /// Its work is two steps ([`Guard::Stepped`](super::Guard::Stepped)).
    pub(super) stepped: bool,
}

impl Body {
    /// Runs the body; a transaction-mode body writes its effect on `tx`.
    pub(super) async fn run(self, tx: Option<&mut PgConnection>) -> Result<u64, JobError> {
        // Held to the end: dropped unfinished, it logs a cancellation or a
        // panic.
        let _inside = self.log.enter();
        if self.stepped {
            if let Err(error) = self.steps().await {
                self.log.leave(Left::Err);
                return Err(error);
            }
        } else {
            tokio::time::sleep(self.work).await;
        }
        match self.plan {
            Plan::Succeed => {
                if let (Some(tx), Some((account, identity))) = (tx, &self.effect) {
                    let written = write_effect(tx, account, *identity, self.value).await;
                    if let Err(error) = written {
                        self.log.leave(Left::Err);
                        return Err(error.into());
                    }
                }
                self.log.leave(Left::Ok(self.value));
                Ok(self.value)
            }
            Plan::Fail => {
                self.log.leave(Left::Err);
                Err(JobError::Failed)
            }
            Plan::Panic => panic!("{PLANNED_PANIC}"),
            Plan::Hang => std::future::pending().await,
        }
    }
}

impl Body {
    /// Its work as two steps: `reserve`, not repeatable, then `notify`,
    /// repeatable, each logging that its future ran. A hanging body hangs
    /// inside one of them (by its value's parity), so that dropping it cuts
    /// a holder off inside a step: a later run must refuse `reserve`, and
    /// may run `notify` again.
    async fn steps(&self) -> Result<(), JobError> {
        let half = self.work / 2;
        let hang = self.plan == Plan::Hang;
        let hang_in_reserve = hang && self.value.is_multiple_of(2);
        let hang_in_notify = hang && !hang_in_reserve;
        idem::step("reserve", async {
            self.log.step("reserve", false);
            tokio::time::sleep(half).await;
            if hang_in_reserve {
                std::future::pending::<()>().await;
            }
            Ok::<u64, JobError>(self.value)
        })
        .await?;
        idem::step("notify", async {
            self.log.step("notify", true);
            tokio::time::sleep(half).await;
            if hang_in_notify {
                std::future::pending::<()>().await;
            }
            Ok::<u64, JobError>(self.value)
        })
        .repeatable()
        .await?;
        Ok(())
    }
}

const EFFECTS_TABLE: &str = "CREATE TABLE IF NOT EXISTS idem_history_effects \
     (account text NOT NULL, identity bigint NOT NULL, invocation bigint NOT NULL)";

pub(super) async fn create_effects_table(admin: &PgPool) {
    // Under an advisory lock: concurrent test binaries racing to create the
    // same table would otherwise collide in the catalog.
    let mut tx = admin.begin().await.expect("begin");
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('idem_history_effects'))")
        .execute(&mut *tx)
        .await
        .expect("lock");
    sqlx::query(EFFECTS_TABLE)
        .execute(&mut *tx)
        .await
        .expect("create the effects table");
    tx.commit().await.expect("commit the effects table");
}

async fn write_effect(
    tx: &mut PgConnection,
    account: &str,
    identity: usize,
    invocation: u64,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO idem_history_effects (account, identity, invocation) VALUES ($1, $2, $3)",
    )
    .bind(account)
    .bind(identity as i64)
    .bind(invocation as i64)
    .execute(tx)
    .await
    .map(drop)
}

/// Keeps planned panics off the test's output; any other panic is printed
/// as usual.
pub(super) fn quiet_planned_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let planned = info
                .payload()
                .downcast_ref::<String>()
                .is_some_and(|message| message == PLANNED_PANIC);
            if !planned {
                default(info);
            }
        }));
    });
}
