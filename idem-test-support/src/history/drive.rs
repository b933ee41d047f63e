//! The driver: runs a workload's invokers, with the fault injector and the
//! metering task alongside, then reads the store's final state; and checks
//! that the gate serves again afterwards.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use idem::Rejected;
use idem::sqlx::{self, PgPool};

use super::body::quiet_planned_panics;
use super::context::Context;
use super::faults::{Faults, inject};
use super::final_state::read_final;
use super::invoke::invoke;
use super::meter::meter_batches;
use super::record::Recorder;
use super::target::Target;
use super::workload::Workload;
use super::{FaultKind, Final, Got, History, Keys, identity};
use crate::rng::XorShift;

/// A finished run: what it did, its history and the store's final state.
pub struct Run {
    /// What it was asked to do.
    pub workload: Workload,
    /// What happened.
    pub history: History,
    /// The store's rows at the end.
    pub last: Final,
    /// How long it took.
    pub elapsed: Duration,
}

/// Runs `workload` against `target` while `faults` (if any) are injected,
/// then waits until the store answers again and reads its final state.
pub async fn run(target: &Target, workload: &Workload, faults: Option<&Faults>) -> Run {
    let mut seeds = XorShift::new(workload.seed);
    let guards = (0..workload.identities)
        .map(|_| workload.guards[seeds.below(workload.guards.len() as u64) as usize])
        .collect();
    let started = start(target, workload, guards, faults, &mut seeds);
    let invokers: Vec<_> = (0..workload.tasks)
        .map(|task| {
            let share = workload.calls / workload.tasks
                + usize::from(task < workload.calls % workload.tasks);
            tokio::spawn(invoker(started.context.clone(), seeds.next_u64(), share))
        })
        .collect();
    for invoker in invokers {
        invoker.await.expect("an invoker panicked");
    }
    started.finish().await
}

/// A run under way, for a workload whose callers live outside this crate
/// (the tower layer's, whose server needs features this crate does not
/// enable): its recorder, its target, and whether it should stop.
#[derive(Clone)]
pub struct Session(Arc<Context>);

impl Session {
    /// What every caller records to.
    pub fn recorder(&self) -> &Recorder {
        &self.0.recorder
    }

    /// Where the run happens.
    pub fn target(&self) -> &Target {
        &self.0.target
    }

    /// The run is over: stop calling.
    pub fn stopped(&self) -> bool {
        self.0.stopped()
    }
}

/// Runs `callers` (given the run's [`Session`]) over identities guarded by
/// `guards` and keyed as `keys` says, while `faults` (if any) are
/// injected; then waits until the store answers again and reads its final
/// state. `workload` describes the run in its figures.
pub async fn run_outside<F, Fut>(
    target: &Target,
    workload: &Workload,
    guards: Vec<super::Guard>,
    keys: Keys,
    faults: Option<&Faults>,
    callers: F,
) -> Run
where
    F: FnOnce(Session) -> Fut,
    Fut: Future<Output = ()>,
{
    let mut seeds = XorShift::new(workload.seed);
    let mut started = start(target, workload, guards, faults, &mut seeds);
    started.keys = keys;
    callers(Session(started.context.clone())).await;
    started.finish().await
}

/// A run under way: what its callers share, and the tasks beside them.
pub(super) struct Started {
    pub(super) context: Arc<Context>,
    keys: Keys,
    injector: Option<tokio::task::JoinHandle<()>>,
    metering: Option<tokio::task::JoinHandle<()>>,
}

/// Starts a run of `workload` over identities guarded by `guards`: the
/// fault injector and the metering task, if asked; the callers are the
/// caller's to spawn (each workload has its own), then [`Started::finish`].
pub(super) fn start(
    target: &Target,
    workload: &Workload,
    guards: Vec<super::Guard>,
    faults: Option<&Faults>,
    seeds: &mut XorShift,
) -> Started {
    quiet_planned_panics();
    let context = Arc::new(Context {
        target: target.clone(),
        recorder: Recorder::new(),
        workload: workload.clone(),
        guards,
        started: Instant::now(),
        calls_made: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
    });
    let injector = faults
        .map(|faults| tokio::spawn(inject(context.clone(), faults.clone(), seeds.next_u64())));
    let metering = workload
        .metering
        .then(|| tokio::spawn(meter_batches(context.clone(), seeds.next_u64())));
    Started {
        context,
        keys: Keys::Numbers,
        injector,
        metering,
    }
}

impl Started {
    /// Once the callers are done: stops the faults, waits until the store
    /// answers again, and reads its final state.
    pub(super) async fn finish(self) -> Run {
        let Started {
            context,
            keys,
            injector,
            metering,
        } = self;
        let target = &context.target;
        context.stop.store(true, Ordering::SeqCst);
        if let Some(injector) = injector {
            injector.await.expect("the fault injector panicked");
        }
        if let Some(proxy) = &target.proxy {
            proxy.disarm();
        }
        await_store(&target.admin).await;
        if let Some(metering) = metering {
            metering.await.expect("the metering task panicked");
        }
        let elapsed = context.started.elapsed();
        if let Some(proxy) = &target.proxy {
            for lost in proxy.take_lost_replies() {
                let at = context.recorder.at(lost.at);
                context
                    .recorder
                    .fault(FaultKind::ReplyLost(lost.statement), at, at);
            }
        }
        let mut history = context.recorder.history(context.guards.clone());
        history.keys = keys;
        let last = read_final(target, &history).await;
        Run {
            workload: context.workload.clone(),
            history,
            last,
            elapsed,
        }
    }
}

async fn invoker(context: Arc<Context>, seed: u64, calls: usize) {
    let mut rng = XorShift::new(seed);
    for _ in 0..calls {
        if context.stopped() {
            break;
        }
        let call = context.draw(&mut rng);
        let gate = match &context.target.cached {
            Some(cached) if rng.below(100) < context.workload.cached => cached,
            _ => &context.target.gate,
        };
        let got = invoke(gate, &context.recorder, call).await;
        // A caller backs off while the store is down.
        if matches!(got, Got::StoreError) || got.reason() == Some("unavailable") {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Waits until the store answers again (after a crash, a restart).
async fn await_store(admin: &PgPool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while sqlx::query("SELECT 1").execute(admin).await.is_err() {
        assert!(Instant::now() < deadline, "the store did not come back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Asserts that the gate serves again: a fresh identity, in an account of
/// its own, runs once (retrying while the pool reconnects).
pub async fn assert_recovers(target: &Target) {
    let fresh = target
        .gate
        .account(format!("{}-after", target.gate.account_name()));
    let deadline = Instant::now() + Duration::from_secs(30);
    for n in 0.. {
        match fresh
            .run(&identity(n), async { Ok::<_, Rejected>(()) })
            .await
        {
            Ok(()) if n >= 8 => return,
            Ok(()) => {}
            Err(Rejected::Unavailable { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(rejected) => panic!("the gate did not recover after the faults: {rejected}"),
        }
    }
}
