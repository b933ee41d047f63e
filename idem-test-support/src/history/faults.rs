//! The fault injector: terminates the gate's backends, cuts its
//! connections, loses replies, restarts or crashes its cluster; and records
//! each fault that happened.

use std::sync::Arc;
use std::time::Duration;

use super::FaultKind;
use super::context::Context;
use crate::connections::terminate_backends;
use crate::fault_proxy::Statement;
use crate::rng::XorShift;

/// Faults to inject while a workload runs.
#[derive(Debug, Clone)]
pub struct Faults {
    /// Each fault is drawn from these, by weight.
    pub kinds: Vec<(u64, Inject)>,
    /// Pause before each fault, in milliseconds.
    pub pause: std::ops::Range<u64>,
    /// At most this many.
    pub limit: usize,
}

/// A kind of fault to inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inject {
    /// Terminate the gate's backends.
    Terminate,
    /// Cut every connection through the proxy for a while.
    Cut,
    /// Lose the reply to an armed statement, after it committed.
    LoseReply,
    /// Restart the server cleanly.
    Restart,
    /// Crash the server and start it again.
    Crash,
}

/// Injects faults until the workload stops, and records each one that
/// actually happened (a lost reply is recorded when it fires, see [`run`](super::run)).
pub(super) async fn inject(context: Arc<Context>, faults: Faults, seed: u64) {
    let mut rng = XorShift::new(seed);
    let total: u64 = faults.kinds.iter().map(|(weight, _)| weight).sum();
    for _ in 0..faults.limit {
        let spread = faults.pause.end.saturating_sub(faults.pause.start).max(1);
        let pause = faults.pause.start + rng.below(spread);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        if context.stopped() {
            return;
        }
        let mut roll = rng.below(total);
        let kind = faults
            .kinds
            .iter()
            .find(|(weight, _)| {
                let hit = roll < *weight;
                roll = roll.saturating_sub(*weight);
                hit
            })
            .map(|(_, kind)| *kind)
            .expect("weights cover the roll");
        inject_one(&context, kind, &mut rng).await;
    }
}

async fn inject_one(context: &Context, kind: Inject, rng: &mut XorShift) {
    let target = &context.target;
    let recorder = &context.recorder;
    let start = recorder.now();
    let happened = match kind {
        Inject::Terminate => {
            let killed = terminate_backends(&target.admin, &target.application_name).await;
            (killed > 0).then_some(FaultKind::BackendsTerminated(killed))
        }
        Inject::Cut => match &target.proxy {
            Some(proxy) => {
                proxy.cut_for(Duration::from_millis(rng.below(300))).await;
                Some(FaultKind::ConnectionsCut)
            }
            None => None,
        },
        Inject::LoseReply => {
            let statement = Statement::ALL[rng.below(Statement::ALL.len() as u64) as usize];
            if let Some(proxy) = &target.proxy {
                proxy.lose_next_reply(statement);
            }
            None // recorded when it fires
        }
        Inject::Restart | Inject::Crash => match &target.cluster {
            Some(cluster) => {
                let (cluster, down) = (cluster.clone(), Duration::from_millis(rng.below(300)));
                tokio::task::spawn_blocking(move || match kind {
                    Inject::Restart => cluster.restart(),
                    _ => cluster.crash(down),
                })
                .await
                .expect("pg_ctl");
                Some(if kind == Inject::Restart {
                    FaultKind::Restart
                } else {
                    FaultKind::Crash
                })
            }
            None => None,
        },
    };
    if let Some(fault) = happened {
        recorder.fault(fault, start, recorder.now());
    }
}
