//! A duplicate waiting on a claim of another process (another gate, as far
//! as idem can tell: its registry of claims in flight is not the holder's)
//! is woken by a notification its holder sends only when somebody waits,
//! and still looks once a second, so a lost wake-up costs at most that.
//!
//! The holder and the waiters run on gates of their own, each behind a
//! proxy of its own that counts its statements.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use idem::sqlx::postgres::PgPoolOptions;
use idem::sqlx::{self, PgPool};
use idem::{Disposition, Gate, Identity, Rejected, testing};
use idem_test_support::JobError;
use idem_test_support::fault_proxy::Proxy;
use tokio::sync::{Barrier, Notify};

use super::held_until;

/// A gate behind a proxy of its own in `account`, its pool named
/// `application` (its wake-up listener is then `application (idem
/// wake-up)`).
pub(super) async fn gate_in(account: &str, application: &str, connections: u32) -> (Proxy, Gate) {
    let proxy = Proxy::start().await;
    let pool = PgPoolOptions::new()
        .max_connections(connections)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with(proxy.options().application_name(application))
        .await
        .expect("connect through the proxy");
    let gate = Gate::connect(pool)
        .await
        .expect("the gate starts")
        .account(account);
    (proxy, gate)
}

/// A pool straight to the database, for the test's own reads.
pub(super) async fn direct() -> PgPool {
    testing::pool_with(2).await
}

/// Waits until the pending claim at `address` is marked as waited on,
/// failing the test past 10 s.
pub(super) async fn marked(pool: &PgPool, account: &str, address: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let awaited: Option<Option<bool>> = sqlx::query_scalar(
            "SELECT awaited FROM idem_records WHERE account = $1 AND kind = 'claim' AND address = $2",
        )
        .bind(account)
        .bind(address)
        .fetch_optional(pool)
        .await
        .expect("read the claim");
        if awaited == Some(Some(true)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no waiter marked the claim within 10 s: {awaited:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// One claim held in one process and waited on in another: `holder`
/// claims `id` (replaying) and holds it; `waiter` waits on it (replaying,
/// for up to `wait`) and marks it; then `meanwhile` runs, and when it ends
/// the holder returns `value`. What the holder and the waiter were
/// answered (a waiter that ran its own body would answer
/// `JobError::Failed`), and what `meanwhile` returned.
pub(super) async fn held_and_awaited_elsewhere<M: Future>(
    (holder, waiter): (&Gate, &Gate),
    direct: &PgPool,
    id: &Identity,
    (value, wait): (i64, Duration),
    meanwhile: M,
) -> (Result<i64, JobError>, Result<i64, JobError>, M::Output) {
    let (entered, go) = (Notify::new(), Notify::new());
    let held = holder
        .guard(id)
        .replay()
        .run(held_until(&entered, &go, Ok::<_, JobError>(value)));
    let waiting = async {
        entered.notified().await;
        let waited = waiter
            .guard(id)
            .replay()
            .wait(wait)
            .run(async { Err::<i64, _>(JobError::Failed) });
        let conduct = async {
            marked(direct, holder.account_name(), &id.address()).await;
            let said = meanwhile.await;
            go.notify_one();
            said
        };
        tokio::join!(within("the waiter", waited), conduct)
    };
    let (held, (waited, said)) = tokio::join!(held, waiting);
    (held, waited, said)
}

/// The waiter's answer, or the test fails instead of hanging.
pub(super) async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), future)
        .await
        .unwrap_or_else(|_| panic!("{what}: still waiting after 30 s (left hanging)"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_in_another_process_is_woken_by_its_holder_not_by_polling() {
    let account = testing::unique_name("wake");
    let (holder_proxy, holder_gate) = gate_in(&account, "wake_holder", 2).await;
    let (waiter_proxy, waiter_gate) = gate_in(&account, "wake_waiter", 2).await;
    let direct = direct().await;
    let id = Identity::new("wake").part("ord_1");
    let held_a_while = async {
        let from = (holder_proxy.executions(), waiter_proxy.executions());
        // Long enough for polling (every 250 ms at most) to look ten
        // times; a listening waiter looks once a second.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        from
    };
    let (held, waited, (holder_from, waiter_from)) = held_and_awaited_elsewhere(
        (&holder_gate, &waiter_gate),
        &direct,
        &id,
        (42, Duration::from_secs(60)),
        held_a_while,
    )
    .await;
    assert_eq!(held.expect("the holder succeeds"), 42);
    assert_eq!(waited.expect("replayed"), 42);
    assert_eq!(
        holder_proxy.executions() - holder_from,
        2,
        "the holder's settle, then its wake-up (somebody waited)"
    );
    // Looks once a second while held (2 or 3), then once when woken: at
    // most 4 looks of at most 2 statements (Citus: the routed insert and
    // the lookup). Polling would have looked at least 10 times.
    let statements = waiter_proxy.executions() - waiter_from;
    assert!(
        statements <= 8,
        "the waiter polled instead of listening: {statements} statements in 2.5 s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outcome_nobody_waits_on_sends_no_wake_up() {
    let account = testing::unique_name("wake_none");
    let (proxy, gate) = gate_in(&account, "wake_alone", 2).await;
    let direct = direct().await;
    for (n, outcome) in [
        None,
        Some(Disposition::Release),
        Some(Disposition::Keep),
        Some(Disposition::InDoubt),
    ]
    .into_iter()
    .enumerate()
    {
        let id = Identity::new("wake_none").part(n);
        let from = proxy.executions();
        let _ = gate
            .guard(&id)
            .disposition(move |_: &JobError| outcome.unwrap_or(Disposition::Release))
            .run(async move {
                match outcome {
                    None => Ok(()),
                    Some(_) => Err(JobError::Failed),
                }
            })
            .await;
        assert_eq!(
            proxy.executions() - from,
            2,
            "{outcome:?}: the claim and the outcome's statement, no wake-up"
        );
        let awaited: Option<Option<bool>> = sqlx::query_scalar(
            "SELECT awaited FROM idem_records WHERE account = $1 AND kind = 'claim' AND address = $2",
        )
        .bind(&account)
        .bind(id.address())
        .fetch_optional(&direct)
        .await
        .expect("read the claim");
        assert!(
            matches!(awaited, None | Some(None)),
            "{outcome:?}: nobody marked it: {awaited:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_listener_leaves_no_waiter_hanging() {
    let account = testing::unique_name("wake_cut");
    let application = testing::unique_name("wake_cut");
    let (_holder_proxy, holder_gate) = gate_in(&account, "wake_cut_holder", 2).await;
    let (_waiter_proxy, waiter_gate) = gate_in(&account, &application, 2).await;
    let direct = direct().await;
    let listener = format!("{application} (idem wake-up)");
    for round in 0..3 {
        let id = Identity::new("wake_cut").part(round);
        // The listener's backend terminated, then at once the outcome
        // lands: its wake-up is sent while nobody listens.
        let cut = async {
            let terminated: i64 = sqlx::query_scalar(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE application_name = $1",
            )
            .bind(&listener)
            .fetch_one(&direct)
            .await
            .expect("terminate the listener");
            assert_eq!(terminated, 1, "round {round}: one listener, terminated");
        };
        let (held, waited, ()) = held_and_awaited_elsewhere(
            (&holder_gate, &waiter_gate),
            &direct,
            &id,
            (round, Duration::from_secs(60)),
            cut,
        )
        .await;
        assert_eq!(held.expect("the holder succeeds"), round);
        assert_eq!(
            waited.expect("replayed"),
            round,
            "round {round}: the waiter got the holder's value"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_waiters_in_two_processes_and_exactly_one_runs() {
    const PER_GATE: usize = 3;
    let account = testing::unique_name("wake_release");
    let (_holder_proxy, holder_gate) = gate_in(&account, "wake_release_holder", 2).await;
    let (_a, first) = gate_in(&account, "wake_release_a", PER_GATE as u32 + 1).await;
    let (_b, second) = gate_in(&account, "wake_release_b", PER_GATE as u32 + 1).await;
    let direct = direct().await;
    let id = Identity::new("wake_release").part("ord_3");
    let (entered, go) = (Notify::new(), Notify::new());
    let ran = AtomicUsize::new(0);
    let holder = holder_gate.guard(&id).replay().run(held_until(
        &entered,
        &go,
        Err::<String, _>(JobError::Failed),
    ));
    let barrier = Arc::new(Barrier::new(2 * PER_GATE));
    let waiters = [&first, &second]
        .into_iter()
        .flat_map(|gate| std::iter::repeat_n(gate, PER_GATE))
        .map(|gate| {
            let (barrier, id, ran) = (Arc::clone(&barrier), &id, &ran);
            async move {
                barrier.wait().await;
                gate.guard(id)
                    .replay()
                    .wait(Duration::from_secs(60))
                    .run(async {
                        ran.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, JobError>("a waiter's".to_owned())
                    })
                    .await
            }
        });
    let waiting = async {
        entered.notified().await;
        let release = async {
            marked(&direct, &account, &id.address()).await;
            go.notify_one();
        };
        tokio::join!(
            within(
                "waiters woken by a release",
                futures_util::future::join_all(waiters)
            ),
            release
        )
        .0
    };
    let (held, results) = tokio::join!(holder, waiting);
    assert!(matches!(held, Err(JobError::Failed)), "{held:?}");
    assert_eq!(
        ran.load(Ordering::SeqCst),
        1,
        "exactly one waiter ran: {results:?}"
    );
    for result in results {
        assert_eq!(result.expect("run once, then replayed"), "a waiter's");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_in_doubt_or_failed_wakes_its_waiter_with_that_refusal() {
    let account = testing::unique_name("wake_refused");
    let (_holder_proxy, holder_gate) = gate_in(&account, "wake_refused_holder", 2).await;
    let (_waiter_proxy, waiter_gate) = gate_in(&account, "wake_refused_waiter", 2).await;
    let direct = direct().await;
    for (n, disposition) in [Disposition::InDoubt, Disposition::Keep]
        .into_iter()
        .enumerate()
    {
        let id = Identity::new("wake_refused").part(n);
        let (entered, go) = (Notify::new(), Notify::new());
        let holder = holder_gate
            .guard(&id)
            .disposition(move |_: &JobError| disposition)
            .run(held_until(&entered, &go, Err::<(), _>(JobError::Failed)));
        let waiting = async {
            entered.notified().await;
            let waited = waiter_gate
                .guard(&id)
                .wait(Duration::from_secs(60))
                .run(async { Ok::<_, JobError>(()) });
            let release = async {
                marked(&direct, &account, &id.address()).await;
                go.notify_one();
            };
            tokio::join!(within("a refused waiter", waited), release).0
        };
        let (held, waited) = tokio::join!(holder, waiting);
        assert!(matches!(held, Err(JobError::Failed)), "{held:?}");
        match disposition {
            Disposition::InDoubt => assert!(
                matches!(waited, Err(JobError::Rejected(Rejected::InDoubt))),
                "{waited:?}"
            ),
            _ => assert!(
                matches!(waited, Err(JobError::Rejected(Rejected::AlreadyFailed))),
                "{waited:?}"
            ),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_wakes_the_waiters_of_its_items_with_one_statement() {
    let account = testing::unique_name("wake_batch");
    let (holder_proxy, holder_gate) = gate_in(&account, "wake_batch_holder", 2).await;
    let (_waiter_proxy, waiter_gate) = gate_in(&account, "wake_batch_waiter", 4).await;
    let direct = direct().await;
    let ids: Vec<Identity> = (0..3)
        .map(|n| Identity::new("wake_batch").part(n))
        .collect();
    let mut batch = idem::batch::Batch::new();
    for id in &ids {
        batch.push("item", id.clone());
    }
    // Every item is claimed before any body runs; the bodies (run one at
    // a time or together) all wait for `go`.
    let entered = Notify::new();
    let (go, gone) = tokio::sync::watch::channel(false);
    let holder = holder_gate.guard_batch(batch).run(|_| {
        let mut gone = gone.clone();
        let entered = &entered;
        async move {
            entered.notify_one();
            let _ = gone.wait_for(|go| *go).await;
            Ok::<_, JobError>(())
        }
    });
    let waiting = async {
        entered.notified().await;
        let waited = futures_util::future::join_all(ids[..2].iter().map(|id| {
            waiter_gate
                .guard(id)
                .wait(Duration::from_secs(60))
                .run(async { Ok::<_, JobError>(()) })
        }));
        let release = async {
            for id in &ids[..2] {
                marked(&direct, &account, &id.address()).await;
            }
            let from = holder_proxy.executions();
            go.send_replace(true);
            from
        };
        tokio::join!(within("waiters of a batch's items", waited), release)
    };
    let (held, (waited, from)) = tokio::join!(holder, waiting);
    assert!(held.iter().all(Result::is_ok), "{held:?}");
    for answer in &waited {
        assert!(
            matches!(answer, Err(JobError::Rejected(Rejected::AlreadyDone))),
            "{waited:?}"
        );
    }
    assert_eq!(
        holder_proxy.executions() - from,
        2,
        "the batch's settle, then one wake-up for both waited items"
    );
}
