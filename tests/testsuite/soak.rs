//! Soak: many tasks invoke a few hundred identities thousands of times,
//! half through `#[idempotent]` and half through `Gate::run`, with bodies
//! that succeed, fail or are cancelled mid-body at random. Every invocation
//! is recorded in a history, which the shared checker holds to the gate's
//! promises afterwards, against the final rows of `idem_records` (see
//! `idem-test-support/src/history/`): no body ran twice, every success was
//! kept, every refusal was true, a `pending` row only where a body was
//! cancelled.
//!
//! The default size (4,800 calls over 800 identities) takes about ten
//! seconds. `IDEM_SOAK_CALLS` sets the number of calls (identities follow,
//! one per six calls, unless `IDEM_SOAK_IDENTITIES` says otherwise);
//! `cargo test --test testsuite soak:: -- --ignored --nocapture` runs the long soak of
//! 200,000 calls. Every run prints its seed, and `IDEM_SOAK_SEED` replays
//! its choices (the interleaving is the scheduler's).

use std::time::Duration;

use idem_test_support::XorShift;
use idem_test_support::history::{self, Entry, Plans, Target, Workload, count_from_env};

/// Concurrent invokers; twice the pool, so claims also queue for connections.
const TASKS: usize = 32;
const POOL_CONNECTIONS: u32 = 16;
/// The CI size: 32 tasks × 150 calls, 6 per identity on average (so most
/// identities see failures and retries before a success or a cancellation).
const CALLS: usize = 4_800;
const CALLS_PER_IDENTITY: usize = 6;
/// The long soak's size, for the ignored test.
const LONG_CALLS: usize = 200_000;
const SEED_VARIABLE: &str = "IDEM_SOAK_SEED";

/// The plain gate, through `#[idempotent]` and `Gate::run`, every identity
/// called at random: bodies succeed (45 %), fail (37 %) or hang until their
/// caller drops them (18 %).
fn soak_of(calls: usize) -> Workload {
    let calls = count_from_env("IDEM_SOAK_CALLS", calls);
    let identities = count_from_env("IDEM_SOAK_IDENTITIES", (calls / CALLS_PER_IDENTITY).max(1));
    let plans = Plans {
        hang: 18,
        work: Duration::from_micros(1_500),
        ..Plans::succeed_or_fail(37)
    };
    let seed = XorShift::seed_from_env(SEED_VARIABLE);
    Workload {
        entries: vec![Entry::Attribute, Entry::Run],
        ..Workload::plain(TASKS, calls, identities, plans, seed)
    }
}

async fn soak(calls: usize) {
    let target = Target::direct(POOL_CONNECTIONS).await;
    let run = history::run(&target, &soak_of(calls), None).await;
    history::assert_no_anomalies(&run, "soak", SEED_VARIABLE);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_soak_of_random_outcomes_keeps_every_promise() {
    soak(CALLS).await;
}

/// The long soak: `cargo test --test testsuite soak:: -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the long soak (minutes): run it with -- --ignored"]
async fn a_long_soak_of_random_outcomes_keeps_every_promise() {
    soak(LONG_CALLS).await;
}
