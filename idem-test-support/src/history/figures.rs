//! The figures line of a run, and the assertion that prints it (with every
//! anomaly) and fails the test on any.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use super::check::{Anomaly, check, views};
use super::drive::Run;
use super::{Event, FaultKind, Guard, Left, ProbeVerdict};

/// What a run did, in one line: calls, bodies, answers, faults, rows and
/// anomalies.
pub struct Figures<'a> {
    /// The test's name.
    pub name: &'a str,
    /// The environment variable that replays the run's seed.
    pub seed_variable: &'a str,
    /// The run.
    pub run: &'a Run,
    /// What the checker found.
    pub anomalies: &'a [Anomaly],
}

fn count_by<T, K: Ord>(
    items: impl Iterator<Item = T>,
    key: impl Fn(T) -> Option<K>,
) -> BTreeMap<K, usize> {
    let mut counts = BTreeMap::new();
    for k in items.filter_map(key) {
        *counts.entry(k).or_default() += 1;
    }
    counts
}

impl Figures<'_> {
    fn bodies(&self) -> String {
        let calls = &self.run.history.invocations;
        let bodies = calls.iter().filter_map(|call| call.body.as_ref());
        let left = count_by(bodies, |body| {
            Some(match body.left {
                Left::Ok(_) => "ok",
                Left::Err => "err",
                Left::Panicked => "panicked",
                Left::Cancelled => "cancelled",
            })
        });
        let ungated = calls.iter().filter(|call| call.ungated()).count();
        format!("bodies {left:?} ({ungated} of them ungated)")
    }

    fn answers(&self) -> String {
        let calls = &self.run.history.invocations;
        let replayed = calls.iter().filter(|c| c.has(&Event::Replayed)).count();
        let refused = count_by(calls.iter(), |call| call.got.reason());
        let events = count_by(
            calls.iter().flat_map(|call| &call.events),
            |event| match event {
                Event::TookOver => Some("took_over".to_owned()),
                Event::Retried => Some("retried".to_owned()),
                Event::Unrecorded(reason) => Some(format!("unrecorded_{reason}")),
                _ => None,
            },
        );
        format!("replayed {replayed}; refused {refused:?}; events {events:?}")
    }

    fn faults(&self) -> String {
        let faults = &self.run.history.faults;
        let kinds = count_by(faults.iter(), |fault| Some(fault.kind.name()));
        let backends: i64 = faults
            .iter()
            .map(|fault| match fault.kind {
                FaultKind::BackendsTerminated(killed) => killed,
                _ => 0,
            })
            .sum();
        format!("faults injected {kinds:?} ({backends} backends terminated)")
    }

    fn rows(&self) -> String {
        let last = &self.run.last;
        let rows = count_by(last.claims.iter(), |row| Some(row.state.as_str()));
        format!(
            "rows {rows:?}, of them {} async outcomes lost in crashes",
            self.lost_in_crashes()
        )
    }

    /// Rows of asynchronous outcomes left `pending` although the last
    /// invocation that won reported its outcome recorded: a crash lost it.
    fn lost_in_crashes(&self) -> usize {
        let history = &self.run.history;
        let by_id = HashMap::new();
        let views = views(history, &self.run.last, &by_id);
        let lost = views.iter().filter(|view| {
            let last_winner = view.calls.iter().rev().find(|call| call.won());
            view.guard == Guard::AsyncOutcome
                && view.row() == Some("pending")
                && last_winner.is_some_and(|call| call.settled() || call.released())
        });
        lost.count()
    }

    fn metering(&self) -> String {
        let history = &self.run.history;
        let acknowledged = history.attempts.iter().filter(|a| a.reported.is_some());
        format!(
            "metering {} batches, {} of {} attempts acknowledged",
            history.batches.len(),
            acknowledged.count(),
            history.attempts.len()
        )
    }
}

impl Figures<'_> {
    /// How many step futures ran, by name, and how many of those ran again
    /// for an identity (repeatable ones may; rule 9 holds the rest to once).
    fn steps(&self) -> String {
        let calls = &self.run.history.invocations;
        let mut per_identity: BTreeMap<(usize, &str), usize> = BTreeMap::new();
        for call in calls {
            for step in call.body.iter().flat_map(|body| &body.steps) {
                *per_identity.entry((call.identity, step.name)).or_default() += 1;
            }
        }
        let mut ran: BTreeMap<&str, usize> = BTreeMap::new();
        let mut again: BTreeMap<&str, usize> = BTreeMap::new();
        for (&(_, name), &count) in &per_identity {
            *ran.entry(name).or_default() += count;
            if count > 1 {
                *again.entry(name).or_default() += count - 1;
            }
        }
        format!("steps ran {ran:?}, ran again for an identity {again:?}")
    }

    fn ledger(&self) -> String {
        let history = &self.run.history;
        let keys = count_by(history.charges.iter(), |charge| Some(charge.identity));
        let verdicts = count_by(history.probes.iter(), |probed| {
            Some(match probed.verdict {
                ProbeVerdict::Charged(_) => "charged",
                ProbeVerdict::Failed => "failed",
                ProbeVerdict::NotHappened => "not_happened",
                ProbeVerdict::Unknown => "unknown",
            })
        });
        format!(
            "ledger {} charges of {} keys; probes answered {verdicts:?}",
            history.charges.len(),
            keys.len()
        )
    }
}

impl fmt::Display for Figures<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (run, history) = (self.run, &self.run.history);
        let guards = count_by(history.guards.iter(), |guard| Some(guard.name()));
        let seed = run.workload.seed;
        write!(
            f,
            "{}: {} calls by {} tasks over {} identities {guards:?} in {:.1} s ({}={seed} \
             replays its choices); {}; {}; {}; {}",
            self.name,
            history.invocations.len(),
            run.workload.tasks,
            history.guards.len(),
            run.elapsed.as_secs_f64(),
            self.seed_variable,
            self.bodies(),
            self.answers(),
            self.faults(),
            self.rows(),
        )?;
        if !history.batches.is_empty() {
            write!(f, "; {}", self.metering())?;
        }
        if history.guards.contains(&Guard::Stepped) {
            write!(f, "; {}", self.steps())?;
        }
        if !history.charges.is_empty() || !history.probes.is_empty() {
            write!(f, "; {}", self.ledger())?;
        }
        write!(f, "; anomalies found: {}", self.anomalies.len())
    }
}

/// Checks `run`, prints its figures (and every anomaly), and fails the test
/// on any anomaly. `seed_variable` is what replays its seed.
pub fn assert_no_anomalies(run: &Run, name: &str, seed_variable: &str) {
    let anomalies = check(&run.history, &run.last);
    let figures = Figures {
        name,
        seed_variable,
        run,
        anomalies: &anomalies,
    };
    println!("{figures}");
    if !anomalies.is_empty() {
        let seed = run.workload.seed;
        let listed: Vec<String> = anomalies.iter().take(30).map(ToString::to_string).collect();
        panic!(
            "{} anomalies in {name} ({seed_variable}={seed} replays its choices):\n{}",
            anomalies.len(),
            listed.join("\n")
        );
    }
}
