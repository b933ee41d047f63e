//! The targets for the matrix: each a ratio of two scenarios the
//! report judges ([`crate::report`]), and whose two sides the plan runs
//! back to back ([`crate::scenarios::plan`]), so that each round divides
//! two runs measured one after the other.
//!
//! Comparing two ways of doing one thing in the same run is a target here
//! and a scenario in [`crate::scenarios`]: the target's line below is all
//! the plan and the report need to run its two sides back to back and
//! judge their ratio.

use crate::flags::Flags;
use crate::scenarios::{BASELINE, Group};

/// A scenario of the matrix, as a target names it: its group and name.
pub type Side = (Group, &'static str);

/// One of the targets: `scenario` must reach `at_least` × `baseline`.
pub struct Target {
    pub what: String,
    pub scenario: Side,
    pub baseline: Side,
    pub at_least: f64,
    /// Concurrencies where the target says nothing (shown, not judged).
    pub judged: fn(u32, &Flags) -> bool,
}

impl Target {
    /// `scenario` must reach `at_least` × `baseline`, both of `group`, at
    /// every concurrency: what all but two targets are.
    fn within(
        group: Group,
        scenario: &'static str,
        baseline: &'static str,
        at_least: f64,
    ) -> Target {
        Target {
            what: String::new(),
            scenario: (group, scenario),
            baseline: (group, baseline),
            at_least,
            judged: every_concurrency,
        }
    }

    /// The target, as the report's table names it.
    fn named(self, what: impl Into<String>) -> Target {
        Target {
            what: what.into(),
            ..self
        }
    }

    /// Whether the note that the target is not judged at `concurrency`
    /// replaces its verdict.
    pub fn judged_at(&self, concurrency: u32, flags: &Flags) -> bool {
        (self.judged)(concurrency, flags)
    }
}

fn every_concurrency(_: u32, _: &Flags) -> bool {
    true
}

/// A held connection costs only when workers outnumber connections; below
/// that, both designs wait on the body alike.
fn pool_smaller_than_workers(concurrency: u32, flags: &Flags) -> bool {
    concurrency > flags.slow_pool
}

/// Every target, in the order the report lists them (and the plan places
/// their sides: the first ones are surest to be back to back).
pub fn all(flags: &Flags) -> Vec<Target> {
    let (noop, batch, dup) = (Group::NoOp, Group::Batch, Group::Duplicates);
    let mut targets = vec![
        Target::within(noop, "gate", BASELINE, 0.90).named("gate ≥ 0.90× floor"),
        Target::within(noop, "gate", "on-conflict", 0.90)
            .named("gate ≥ 0.90× on-conflict (the gate's own client work)"),
        Target::within(dup, "gate", BASELINE, 0.90).named("duplicate refusal ≥ 0.90× its floor"),
        Target::within(dup, "gate-cached", BASELINE, 50.0)
            .named("cached duplicate refusal ≥ 50× its floor"),
        Target::within(noop, "gate", "brandur", 1.2).named("gate ≥ 1.2× brandur"),
        // The attribute expands to the builder: by hand costs the same.
        Target::within(noop, "guard-by-hand", "gate", 0.90)
            .named("guard by hand ≥ 0.90× the #[idempotent] fn"),
        Target::within(batch, "gate-batch", "gate", 10.0).named(format!(
            "gate-batch ≥ 10× gate, per message (batches of {})",
            flags.batch_size
        )),
        Target {
            judged: pool_smaller_than_workers,
            ..Target::within(Group::SlowBody, "gate", "advisory", 2.0).named(format!(
                "gate ≥ 2× advisory, {} ms body",
                flags.slow_body_ms
            ))
        },
    ];
    // Its two sides need different tables, so they run in different parts
    // of the round: paired within the round, not back to back.
    for size in flags.history_sizes() {
        let rows = crate::scenarios::count(size);
        let history = Group::History(size);
        targets.push(Target {
            scenario: (history, "gate"),
            ..Target::within(noop, "gate", "gate", 0.85).named(format!(
                "gate on {rows} rows ≥ 0.85× gate on an empty table"
            ))
        });
        targets.push(Target {
            scenario: (history, "gate-batch"),
            ..Target::within(batch, "gate-batch", "gate-batch", 0.85).named(format!(
                "gate-batch on {rows} rows ≥ 0.85× gate-batch on an empty table"
            ))
        });
        targets.push(Target {
            scenario: (history, "dup-gate"),
            ..Target::within(Group::Duplicates, "gate", "gate", 0.85).named(format!(
                "refused duplicate on {rows} rows ≥ 0.85× refused duplicate without them"
            ))
        });
    }
    targets
}

/// A ratio the report shows without judging it: two ways of doing one
/// thing, measured in the same run, where the issue asks what it costs and
/// sets no figure to reach.
pub struct Comparison {
    pub what: &'static str,
    pub scenario: Side,
    pub baseline: Side,
}

/// Every such ratio, in the order the report lists them: what steps inside
/// one claim cost (issue 27), against the same phases as recovery points by
/// hand and against the guard with no steps.
pub fn compared() -> Vec<Comparison> {
    let steps = Group::Steps;
    let compare = |what, scenario, baseline| Comparison {
        what,
        scenario: (steps, scenario),
        baseline: (steps, baseline),
    };
    vec![
        compare(
            "three steps ÷ recovery points by hand",
            "three",
            "recovery-points",
        ),
        compare("three steps ÷ the guard with no steps", "three", "gate"),
        compare(
            "three steps, async outcome ÷ recovery points by hand",
            "three-async",
            "recovery-points",
        ),
        compare(
            "three steps, async outcome ÷ the guard with no steps, async outcome",
            "three-async",
            "gate-async",
        ),
        compare(
            "three repeatable steps ÷ recovery points by hand",
            "three-repeatable",
            "recovery-points",
        ),
        compare(
            "three repeatable steps, async outcome ÷ recovery points by hand",
            "three-repeatable-async",
            "recovery-points",
        ),
        compare(
            "sketch: steps in the claim's row ÷ recovery points by hand",
            "in-row-sketch",
            "recovery-points",
        ),
    ]
}

/// The pairs of scenarios the plan runs back to back: each target's
/// scenario and baseline (those of two groups cannot be, and are left to
/// the plan to skip), then each comparison's.
pub fn adjacent(flags: &Flags) -> Vec<(Side, Side)> {
    let targets = all(flags)
        .into_iter()
        .map(|target| (target.scenario, target.baseline));
    let compared = compared()
        .into_iter()
        .map(|comparison| (comparison.scenario, comparison.baseline));
    targets.chain(compared).collect()
}
