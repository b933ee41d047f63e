//! A history of claims with a slot window, prune racing them: tasks call
//! a handful of identities at random, bodies succeed or fail (and
//! release), and a pruner deletes the slots past their window as fast as
//! it can. Checked afterwards: no identity's effect happened twice inside
//! its window (the next success began at least a window after the one
//! before it ended: its slot's window runs from its settle, which follows
//! its end), and windows did expire and reopen meanwhile, so the rule was
//! put to the test.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use idem::operations::{self, PruneFilter};
use idem::{Identity, Rejected, testing};
use idem_test_support::XorShift;

const WINDOW: Duration = Duration::from_millis(300);
const IDENTITIES: u64 = 12;
const TASKS: usize = 8;
const RUN_FOR: Duration = Duration::from_secs(5);

/// An effect that happened: the body of a success, from its start to its
/// end, by the system clock (the database's, on this machine).
#[derive(Debug, Clone, Copy)]
struct Effect {
    began: SystemTime,
    ended: SystemTime,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_prune_racing_the_claims_no_identity_runs_twice_inside_its_window() {
    let gate = testing::gate_on(testing::pool_with(TASKS as u32 + 2).await).await;
    let account = gate.account_name().to_owned();
    let seed = XorShift::seed_from_env("IDEM_HISTORY_SEED");
    let effects: Arc<Mutex<HashMap<u64, Vec<Effect>>>> = Arc::default();
    let stop_at = Instant::now() + RUN_FOR;

    let pruner = {
        let pool = gate.pool().clone();
        let account = account.clone();
        tokio::spawn(async move {
            let mut pruned = 0;
            while Instant::now() < stop_at {
                let filter = PruneFilter::expired().account(account.as_str());
                pruned += operations::prune(&pool, &filter).await.expect("prune");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            pruned
        })
    };
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let gate = gate.clone();
            let effects = Arc::clone(&effects);
            tokio::spawn(async move {
                let mut rng = XorShift::new(seed.wrapping_add(task as u64));
                let mut refused = 0_usize;
                while Instant::now() < stop_at {
                    let which = rng.below(IDENTITIES);
                    let id = Identity::new("windowed_history").part(which);
                    let work = Duration::from_millis(rng.below(20));
                    let fails = rng.below(5) == 0;
                    let effects = Arc::clone(&effects);
                    let outcome = gate
                        .guard(&id)
                        .keep_slot_for(WINDOW)
                        .run(async move {
                            let began = SystemTime::now();
                            tokio::time::sleep(work).await;
                            if fails {
                                // Released: nothing happened, a retry may run.
                                return Err(Rejected::InFlight);
                            }
                            let ended = SystemTime::now();
                            effects
                                .lock()
                                .unwrap_or_else(PoisonError::into_inner)
                                .entry(which)
                                .or_default()
                                .push(Effect { began, ended });
                            Ok(())
                        })
                        .await;
                    match outcome {
                        Ok(()) => {}
                        Err(Rejected::AlreadyDone | Rejected::InFlight) => refused += 1,
                        Err(other) => panic!("identity {which}: {other:?}"),
                    }
                    tokio::time::sleep(Duration::from_millis(rng.below(15))).await;
                }
                refused
            })
        })
        .collect();
    let mut refused = 0;
    for task in tasks {
        refused += task.await.expect("task");
    }
    let pruned = pruner.await.expect("pruner");

    let effects = effects.lock().unwrap_or_else(PoisonError::into_inner);
    let mut reopened = 0;
    for (which, runs) in effects.iter() {
        let mut runs = runs.clone();
        runs.sort_by_key(|effect| effect.began);
        for pair in runs.windows(2) {
            let gap = pair[1]
                .began
                .duration_since(pair[0].ended)
                .unwrap_or_else(|early| {
                    panic!(
                        "identity {which}: a success began {:?} before the one before it ended",
                        early.duration()
                    )
                });
            assert!(
                gap >= WINDOW,
                "identity {which} ran twice inside its window: the next success began {gap:?} \
                 after the one before ended ({runs:?})"
            );
            reopened += 1;
        }
    }
    eprintln!(
        "{} identities, {reopened} slots reopened past their window, {refused} refusals, \
         {pruned} pruned by the racing prune",
        effects.len()
    );
    assert!(
        reopened >= IDENTITIES as usize,
        "too few windows expired to test the rule: {reopened}"
    );
    assert!(
        pruned > 0,
        "the prune never won a race: the history tested no prune"
    );
}
