//! A Citus worker stopped in the middle of races, then started again, on a
//! cluster of this test's own (a coordinator and two workers, so that it
//! can stop one): claims routed to the stopped worker are refused as
//! `Unavailable` and never run, the other worker's accounts keep working,
//! a body that was running when its worker stopped never runs again, and
//! the same gate recovers once the worker is back.
//!
//! Needs Citus installed for the machine's PostgreSQL (`scripts/citus-install`):
//! `scripts/test-citus` runs it (`--ignored`); plain `cargo test` shows it
//! as ignored.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem::sqlx::PgPool;
use idem::sqlx::postgres::PgPoolOptions;
use idem::{Gate, Identity, Rejected, schema, testing};
use idem_test_support::JobError;
use idem_test_support::citus::{self, CitusCluster};
use tokio::sync::Notify;

#[derive(Default)]
struct Ledger(AtomicUsize);

impl Ledger {
    fn run(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }

    fn runs(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// A new account whose shard is on the worker listening on `port`.
async fn account_on(pool: &PgPool, port: u16) -> String {
    let prefix = testing::unique_name("on_worker");
    let there = format!(":{port}");
    for n in 0..10_000 {
        let account = format!("{prefix}_{n}");
        let worker = citus::worker_of(pool, &account)
            .await
            .expect("where the account's shard is");
        if worker.ends_with(&there) {
            return account;
        }
    }
    panic!("no account hashes to the worker on port {port}");
}

fn port_of(url: &str) -> u16 {
    url.rsplit_once(':')
        .and_then(|(_, rest)| rest.split('/').next())
        .and_then(|port| port.parse().ok())
        .unwrap_or_else(|| panic!("no port in {url}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Citus installed (scripts/citus-install): scripts/test-citus runs it"]
async fn a_stopped_worker_refuses_its_accounts_never_runs_twice_and_the_gate_recovers() {
    let dir = std::env::temp_dir().join(testing::unique_name("idem-citus-faults"));
    let citus = tokio::task::spawn_blocking(move || CitusCluster::start(dir, 2))
        .await
        .expect("the start task")
        .unwrap_or_else(|error| panic!("a Citus cluster: {error}"));
    let pool = PgPoolOptions::new()
        .max_connections(16)
        .acquire_timeout(Duration::from_secs(20))
        .connect(&citus.url())
        .await
        .expect("connect to the coordinator");
    schema::set_up_distributed(&pool)
        .await
        .expect("set up distributed");
    let gate = Gate::connect(pool.clone()).await.expect("gate");
    let workers = citus.worker_urls();
    let healthy = gate.account(account_on(&pool, port_of(&workers[0])).await);
    let doomed = gate.account(account_on(&pool, port_of(&workers[1])).await);

    // A race on the doomed worker's account whose winner is running its
    // body when the worker stops: the others are refused, and the body's
    // success cannot be recorded while the worker is down.
    let in_flight = Identity::new("citus_fault").part("in_flight");
    let in_flight_runs = Ledger::default();
    let body_started = Notify::new();
    let stopped = Notify::new();
    let race = testing::race(48, || {
        doomed.run(&in_flight, async {
            in_flight_runs.run();
            body_started.notify_one();
            stopped.notified().await;
            Ok::<_, JobError>(())
        })
    });
    let stop_while_running = async {
        body_started.notified().await;
        let cluster = &citus;
        tokio::task::block_in_place(|| cluster.stop_worker(1)).expect("stop worker 2");
        stopped.notify_one();
    };
    let (report, ()) = tokio::join!(race, stop_while_running);
    assert_eq!(in_flight_runs.runs(), 1, "{report}");
    assert_eq!(report.wins(), 1, "{report}");

    // While it is down: the doomed worker's claims are refused as an
    // outage and never run; the healthy worker's race has one winner.
    let during = Identity::new("citus_fault").part("during");
    let doomed_runs = Ledger::default();
    let healthy_runs = Ledger::default();
    let (refused, served) = tokio::join!(
        testing::race(16, || doomed.run(&during, async {
            doomed_runs.run();
            Ok::<_, JobError>(())
        })),
        testing::race(48, || healthy.run(&during, async {
            healthy_runs.run();
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok::<_, JobError>(())
        })),
    );
    assert_eq!(doomed_runs.runs(), 0, "{refused}");
    for invocation in &refused.invocations {
        let outcome = invocation.outcome.as_ref().expect("no panic");
        assert!(
            matches!(outcome, Err(JobError::Rejected(rejected @ Rejected::Unavailable { .. })) if rejected.is_outage()),
            "a claim routed to the stopped worker is Unavailable: {outcome:?}"
        );
    }
    served.assert_exactly_once();
    assert_eq!(healthy_runs.runs(), 1, "{served}");

    // Back: the same gate serves the worker's accounts again, runs what was
    // refused exactly once, and never runs the body that ran before.
    let cluster = &citus;
    tokio::task::block_in_place(|| cluster.start_worker(1)).expect("start worker 2");
    let mut recovered = None;
    for _ in 0..100 {
        let report = testing::race(48, || {
            doomed.run(&during, async {
                doomed_runs.run();
                tokio::time::sleep(Duration::from_millis(20)).await;
                Ok::<_, JobError>(())
            })
        })
        .await;
        if report.wins() == 1 {
            recovered = Some(report);
            break;
        }
        // Still reconnecting: nothing may have run.
        assert_eq!(doomed_runs.runs(), 0, "{report}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let recovered = recovered.expect("the gate recovers within 10 s of the worker's start");
    recovered.assert_exactly_once();
    assert_eq!(doomed_runs.runs(), 1, "{recovered}");
    let again = doomed
        .run(&in_flight, async {
            in_flight_runs.run();
            Ok::<_, JobError>(())
        })
        .await;
    assert!(
        matches!(
            again,
            Err(JobError::Rejected(
                Rejected::AlreadyDone | Rejected::InFlight
            ))
        ),
        "the body that ran as the worker stopped is done or held, never run again: {again:?}"
    );
    assert_eq!(in_flight_runs.runs(), 1);
    pool.close().await;
}
