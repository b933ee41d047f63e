//! The checker: [`check`] holds a history and the store's final state to
//! the gate's promises, offline. One module a rule (the rules are listed in
//! the docs of `history`); [`View`] is what each rule sees of an identity.

mod detached;
mod done_means_done;
mod exclusive;
mod final_rows;
mod invocation;
mod kept;
mod ledger;
mod metering;
mod ordered;
mod steps;
mod true_answers;
mod view;

use std::collections::HashMap;
use std::fmt;

use super::{Final, Guard, History, Invocation, Micros};
use view::View;
pub(super) use view::views; // for the figures

/// How long after a fault an outage may still be reported: a connection
/// the fault broke can be found broken a little later.
/// (Measured: within 6 ms, under load on 2 cores.)
pub(super) const OUTAGE_GRACE: Micros = 250_000;

/// How far apart the database's clock (which expires leases) and ours may
/// read the same instant.
const CLOCK_TOLERANCE: Micros = 10_000;

/// The gate's promises, numbered as in the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Rule {
    /// No two bodies of one identity at once.
    Exclusive = 1,
    /// A success is kept, once.
    Kept = 2,
    /// Nothing runs after a caller was told it is done.
    DoneMeansDone = 3,
    /// Every answer is true and says what to do.
    TrueAnswers = 4,
    /// The rows left are explained.
    FinalRows = 5,
    /// Every acknowledged event is stored once.
    Metering = 6,
    /// The provider charged each key at most once, and the store, the
    /// probes and the callers all tell the ledger's story.
    Ledger = 7,
    /// A request whose client went away still runs to completion.
    Detached = 8,
    /// No step that is not repeatable runs twice.
    Steps = 9,
    /// No event runs beside another of its entity, nor after a newer one
    /// was applied, and a superseded event was truly older.
    Ordered = 10,
}

impl Rule {
    fn title(self) -> &'static str {
        match self {
            Rule::Exclusive => "exclusive",
            Rule::Kept => "kept",
            Rule::DoneMeansDone => "done means done",
            Rule::TrueAnswers => "true answers",
            Rule::FinalRows => "final rows",
            Rule::Metering => "metering",
            Rule::Ledger => "ledger",
            Rule::Detached => "detached",
            Rule::Steps => "steps",
            Rule::Ordered => "ordered",
        }
    }
}

/// A promise the history shows broken.
#[derive(Debug, Clone)]
pub struct Anomaly {
    /// The promise broken.
    pub rule: Rule,
    /// The identity it was broken for, when there is one.
    pub identity: Option<usize>,
    /// What happened.
    pub what: String,
    /// The invocations involved, one line each.
    pub excerpt: Vec<String>,
}

impl fmt::Display for Anomaly {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rule {} ({})", self.rule as u8, self.rule.title())?;
        if let Some(identity) = self.identity {
            write!(f, ", identity {identity}")?;
        }
        write!(f, ": {}", self.what)?;
        for line in &self.excerpt {
            write!(f, "\n    {line}")?;
        }
        Ok(())
    }
}

/// Every anomaly in `history`, whose store ended as `last`.
pub fn check(history: &History, last: &Final) -> Vec<Anomaly> {
    let by_id: HashMap<u64, &Invocation> = history
        .invocations
        .iter()
        .map(|invocation| (invocation.id, invocation))
        .collect();
    let mut anomalies = Vec::new();
    for view in views(history, last, &by_id) {
        let mut found = Found {
            view: &view,
            anomalies: &mut anomalies,
        };
        if view.guard == Guard::Reconciled {
            // Dispositions and resolutions: the ledger judges these.
            found.ledger();
            continue;
        }
        if view.guard == Guard::Stepped {
            // A step in doubt holds its claim, which rules 4 and 5 do not
            // know: the steps' own rule instead.
            found.exclusive();
            found.kept();
            found.done_means_done();
            found.steps();
            continue;
        }
        if view.guard == Guard::Ordered {
            // An event is also refused in flight while another event of its
            // entity runs, which rule 4 does not know: rule 10 judges the
            // entity, below.
            found.exclusive();
            found.kept();
            found.done_means_done();
            found.final_rows();
            continue;
        }
        found.exclusive();
        found.kept();
        found.done_means_done();
        found.true_answers();
        found.final_rows();
        found.detached();
    }
    ordered::ordered(history, &mut anomalies);
    final_rows::stray_rows(last, &mut anomalies);
    metering::metering(history, last, &mut anomalies);
    anomalies
}

/// Checks one identity, collecting anomalies.
struct Found<'a, 'h> {
    view: &'a View<'h>,
    anomalies: &'a mut Vec<Anomaly>,
}

impl Found<'_, '_> {
    fn report(&mut self, rule: Rule, what: String, calls: &[&Invocation]) {
        let anomaly = self.view.anomaly(rule, what, calls);
        self.anomalies.push(anomaly);
    }
}
