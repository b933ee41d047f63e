//! Ratios paired within a round: what every ratio of the three reports is
//! made of, and how a target is judged from it.
//!
//! With `--rounds N` the whole plan runs N times. A ratio is divided
//! within each round, from that round's run of each side (the two nearest
//! in the round's order; the plan puts a target's two sides back to back),
//! so a drift in the machine between rounds never lands on one side only.
//! The report gives the median of those per-round ratios and their range,
//! and judges a target on the median only when the rounds agree: not when
//! the largest ratio is more than [`TOO_WIDE`] times the smallest, nor when
//! the rounds fall on both sides of the target.
//!
//! Pure: no database, so the pairing, the median and the rule are tested
//! here on figures made up for the purpose.

use std::fmt::Write as _;

use crate::report::divided;
use crate::runner::Measured;

/// Rounds whose largest ratio exceeds their smallest by more than this
/// factor disagree too much for any target to be judged: the machine, not
/// the code, decided them.
pub const TOO_WIDE: f64 = 1.5;

/// Every round's runs, in the order each round ran them, and each planned
/// run's name (runs of one scenario at one concurrency share a name, also
/// when the plan runs it twice in a round).
pub struct Rounds<T> {
    names: Vec<String>,
    rounds: Vec<Vec<T>>,
}

impl<T: Measured + Clone> Rounds<T> {
    /// No round yet, for a plan whose runs are `names`, in order.
    pub fn new(names: Vec<String>) -> Rounds<T> {
        Rounds {
            names,
            rounds: Vec::new(),
        }
    }

    /// Appends `measured`, the next run of the plan, to the current round,
    /// starting a new round when the current one is complete.
    pub fn push(&mut self, measured: T) {
        match self.rounds.last_mut() {
            Some(round) if round.len() < self.names.len() => round.push(measured),
            _ => self.rounds.push(vec![measured]),
        }
    }

    /// Each round's runs, in the order they ran (the last one short when a
    /// run failed part way).
    pub fn each(&self) -> &[Vec<T>] {
        &self.rounds
    }

    /// One run per name, the one whose throughput is the median of every
    /// run of that name over all rounds (the lower middle one of an even
    /// number), in the order the plan first names them: the figures a
    /// results table shows. Never a ratio: those are [`paired`].
    pub fn medians(&self) -> Vec<T> {
        let mut kept = Vec::new();
        for (place, name) in self.names.iter().enumerate() {
            if self.names[..place].contains(name) {
                continue;
            }
            let runs: Vec<&T> = self
                .rounds
                .iter()
                .flat_map(|round| {
                    round
                        .iter()
                        .zip(&self.names)
                        .filter(|(_, named)| *named == name)
                        .map(|(run, _)| run)
                })
                .collect();
            if let Some(median) = median_run(runs) {
                kept.push(median.clone());
            }
        }
        kept
    }
}

/// The run whose throughput is the median (the lower middle one of an even
/// number), if any was measured.
fn median_run<T: Measured>(mut runs: Vec<&T>) -> Option<&T> {
    if runs.is_empty() {
        return None;
    }
    runs.sort_by(|a, b| a.throughput().total_cmp(&b.throughput()));
    Some(runs[(runs.len() - 1) / 2])
}

/// `value` of the run `of` picks over `value` of the run `over` picks, in
/// each round where both ran (and the divisor measured something): of each
/// side's runs in the round, the two nearest in its order.
pub fn paired<T>(
    rounds: &[Vec<T>],
    of: impl Fn(&T) -> bool,
    over: impl Fn(&T) -> bool,
    value: impl Fn(&T) -> f64,
) -> Paired {
    let per_round = rounds
        .iter()
        .filter_map(|round| {
            let (a, b) = nearest(round, &of, &over)?;
            divided(value(a), value(b))
        })
        .collect();
    Paired { per_round }
}

/// The run `of` picks and the run `over` picks that stand nearest each
/// other in `round` (the earliest such pair on a tie).
fn nearest<'r, T>(
    round: &'r [T],
    of: &impl Fn(&T) -> bool,
    over: &impl Fn(&T) -> bool,
) -> Option<(&'r T, &'r T)> {
    let places = |pick: &dyn Fn(&T) -> bool| -> Vec<usize> {
        round
            .iter()
            .enumerate()
            .filter(|(_, run)| pick(run))
            .map(|(place, _)| place)
            .collect()
    };
    let (ofs, overs) = (places(of), places(over));
    let mut best: Option<(usize, usize)> = None;
    for &a in &ofs {
        for &b in &overs {
            if best.is_none_or(|(x, y)| a.abs_diff(b) < x.abs_diff(y)) {
                best = Some((a, b));
            }
        }
    }
    best.map(|(a, b)| (&round[a], &round[b]))
}

/// One ratio over the rounds: each round's, in the order the rounds ran.
#[derive(Debug, Clone, PartialEq)]
pub struct Paired {
    pub per_round: Vec<f64>,
}

/// What a target's median paired ratio says.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Verdict {
    Met,
    Missed,
    /// The rounds' largest ratio over their smallest: more than
    /// [`TOO_WIDE`].
    TooWide(f64),
    /// The rounds fall on both sides of the target.
    Straddles,
}

impl Verdict {
    /// How the targets table says it.
    pub fn text(self, at_least: f64) -> String {
        match self {
            Verdict::Met => "met".to_owned(),
            Verdict::Missed => "**missed**".to_owned(),
            Verdict::TooWide(spread) => {
                format!("cannot judge: the rounds differ {spread:.1}× (more than {TOO_WIDE}×)")
            }
            Verdict::Straddles => {
                format!("cannot judge: the rounds fall on both sides of {at_least:.2}")
            }
        }
    }
}

impl Paired {
    /// The median of the rounds' ratios (the mean of the middle two of an
    /// even number), none when no round had both sides.
    pub fn median(&self) -> Option<f64> {
        let mut sorted = self.per_round.clone();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        match n {
            0 => None,
            _ if n % 2 == 1 => Some(sorted[n / 2]),
            _ => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2.0),
        }
    }

    /// The smallest and the largest of the rounds' ratios.
    pub fn range(&self) -> Option<(f64, f64)> {
        let min = self.per_round.iter().copied().reduce(f64::min)?;
        let max = self.per_round.iter().copied().reduce(f64::max)?;
        Some((min, max))
    }

    /// The largest ratio over the smallest: 1 when the rounds agree
    /// exactly (or there is one), infinite when one round's is zero.
    pub fn spread(&self) -> Option<f64> {
        let (min, max) = self.range()?;
        Some(if max == min { 1.0 } else { max / min })
    }

    /// Whether the median reaches `at_least`, none when no round had both
    /// sides. Judged only when the rounds agree: not when they differ by
    /// more than [`TOO_WIDE`], nor when some fall below `at_least` and
    /// some reach it.
    pub fn judge(&self, at_least: f64) -> Option<Verdict> {
        let median = self.median()?;
        let (min, max) = self.range()?;
        let spread = self.spread()?;
        Some(if spread > TOO_WIDE {
            Verdict::TooWide(spread)
        } else if min < at_least && max >= at_least {
            Verdict::Straddles
        } else if median >= at_least {
            Verdict::Met
        } else {
            Verdict::Missed
        })
    }

    /// `0.95 (0.90–0.99)`: the median and, from two rounds on, the range;
    /// a dash when no round had both sides.
    pub fn shown(&self) -> String {
        let Some(median) = self.median() else {
            return "–".to_owned();
        };
        match self.range() {
            Some((min, max)) if self.per_round.len() > 1 => {
                format!("{median:.2} ({min:.2}–{max:.2})")
            }
            _ => format!("{median:.2}"),
        }
    }

    /// `0.95, 0.11, 0.93`: every round's ratio, in the order they ran.
    pub fn each_round(&self) -> String {
        let mut out = String::new();
        for (place, ratio) in self.per_round.iter().enumerate() {
            let comma = if place == 0 { "" } else { ", " };
            // Writing to a String cannot fail.
            let _ = write!(out, "{comma}{ratio:.2}");
        }
        if out.is_empty() {
            out.push('–');
        }
        out
    }
}

/// How the ratios were made, for a report to state under its ratios.
pub fn method(rounds: usize) -> String {
    match rounds {
        0 | 1 => format!(
            "Each ratio divides two runs of the same round. One round: no range, so nothing \
             says how far the machine moved the figures; `--rounds 3` or more gives each \
             ratio a range, and a target whose rounds differ by more than {TOO_WIDE}× or fall \
             on both sides of it is then not judged.\n"
        ),
        n => format!(
            "Each ratio is divided within a round, from its two sides' runs in that round \
             (a target's two sides run back to back), then the median of the {n} rounds' \
             ratios is shown with their range (min–max). A target is judged on that median, \
             and not at all (\"cannot judge\") when its rounds' largest ratio is more than \
             {TOO_WIDE}× their smallest or its rounds fall on both sides of it.\n"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::{Paired, Rounds, TOO_WIDE, Verdict, paired};
    use crate::runner::Measured;

    /// A run of scenario `name` that did `throughput`.
    #[derive(Debug, Clone, PartialEq)]
    struct Run(&'static str, f64);

    impl Measured for Run {
        fn progress(&self) -> String {
            String::new()
        }

        fn throughput(&self) -> f64 {
            self.1
        }
    }

    fn of(per_round: &[f64]) -> Paired {
        Paired {
            per_round: per_round.to_vec(),
        }
    }

    fn ratio(rounds: &[Vec<Run>], a: &'static str, b: &'static str) -> Paired {
        paired(rounds, |r| r.0 == a, |r| r.0 == b, |r| r.1)
    }

    /// The case the issue saw: each side's median run came from another
    /// round, 0.68 where the rounds alone said 0.95 and 0.11.
    #[test]
    fn a_ratio_is_divided_within_each_round_never_across() {
        let rounds = vec![
            vec![Run("floor", 60.0), Run("gate", 57.0)],
            vec![Run("floor", 10.0), Run("gate", 1.1)],
            vec![Run("floor", 40.0), Run("gate", 38.0)],
        ];
        let ratio = ratio(&rounds, "gate", "floor");
        assert_eq!(ratio.each_round(), "0.95, 0.11, 0.95");
        assert_eq!(ratio.median(), Some(0.95));
        assert_eq!(ratio.shown(), "0.95 (0.11–0.95)");
        assert!(matches!(ratio.judge(0.90), Some(Verdict::TooWide(s)) if s > 8.0));
        // The median runs divided apart would have said 38 ÷ 40 here, and
        // 0.68-like figures in general: nothing the rounds themselves show.
    }

    #[test]
    fn the_nearest_runs_of_a_round_are_paired_when_a_side_runs_twice() {
        // The gate runs twice in the round: once next to the floor, once
        // next to on-conflict.
        let rounds = vec![vec![
            Run("floor", 100.0),
            Run("gate", 90.0),
            Run("on-conflict", 99.0),
            Run("brandur", 50.0),
            Run("gate", 80.0),
        ]];
        assert_eq!(ratio(&rounds, "gate", "floor").per_round, [0.9]);
        assert_eq!(ratio(&rounds, "gate", "brandur").per_round, [1.6]);
        // Both gate runs are one away from on-conflict: the earlier wins.
        assert_eq!(ratio(&rounds, "on-conflict", "gate").per_round, [1.1]);
    }

    #[test]
    fn a_round_without_one_side_or_with_a_divisor_of_nothing_gives_no_ratio() {
        let rounds = vec![
            vec![Run("floor", 0.0), Run("gate", 5.0)],
            vec![Run("floor", 10.0), Run("gate", 5.0)],
            // A run failed: the last round is short.
            vec![Run("floor", 10.0)],
        ];
        let ratio = ratio(&rounds, "gate", "floor");
        assert_eq!(ratio.per_round, [0.5]);
        assert_eq!(ratio.shown(), "0.50");
        assert_eq!(self::ratio(&rounds, "gate", "brandur").shown(), "–");
        assert_eq!(self::ratio(&rounds, "gate", "brandur").judge(1.0), None);
    }

    #[test]
    fn the_median_of_an_even_number_of_rounds_is_the_mean_of_the_middle_two() {
        assert_eq!(of(&[1.0, 4.0, 2.0, 3.0]).median(), Some(2.5));
        assert_eq!(of(&[3.0, 1.0, 2.0]).median(), Some(2.0));
        assert_eq!(of(&[]).median(), None);
        assert_eq!(of(&[1.0, 4.0, 2.0]).range(), Some((1.0, 4.0)));
    }

    #[test]
    fn a_target_is_judged_on_the_median_only_when_the_rounds_agree() {
        // All rounds on one side, close together.
        assert_eq!(of(&[0.93, 0.95, 0.97]).judge(0.90), Some(Verdict::Met));
        assert_eq!(of(&[0.80, 0.85, 0.82]).judge(0.90), Some(Verdict::Missed));
        // Close together but on both sides of the target.
        assert_eq!(
            of(&[0.88, 0.91, 0.93]).judge(0.90),
            Some(Verdict::Straddles)
        );
        // Far from the target, but the rounds disagree more than the rule
        // allows: the machine decided them.
        let wide = of(&[60.0, 95.0, 100.0]).judge(50.0);
        assert!(matches!(wide, Some(Verdict::TooWide(s)) if s > TOO_WIDE));
        // Exactly the rule's factor is still judged.
        assert_eq!(of(&[2.0, 3.0]).judge(1.0), Some(Verdict::Met));
        // One round: judged on it (the report says it has no range).
        assert_eq!(of(&[0.95]).judge(0.90), Some(Verdict::Met));
    }

    #[test]
    fn the_verdicts_say_why_they_cannot_judge() {
        assert_eq!(
            Verdict::TooWide(6.04).text(0.9),
            "cannot judge: the rounds differ 6.0× (more than 1.5×)"
        );
        assert_eq!(
            Verdict::Straddles.text(0.9),
            "cannot judge: the rounds fall on both sides of 0.90"
        );
        assert_eq!(Verdict::Missed.text(0.9), "**missed**");
    }

    #[test]
    fn each_name_keeps_its_median_run_over_every_round_and_repeat() {
        let names = ["floor", "gate", "brandur", "gate"]
            .map(String::from)
            .to_vec();
        let mut rounds = Rounds::new(names);
        let runs = [
            ("floor", 10.0),
            ("gate", 1.0),
            ("brandur", 5.0),
            ("gate", 2.0),
            ("floor", 30.0),
            ("gate", 3.0),
            ("brandur", 6.0),
            ("gate", 4.0),
            ("floor", 20.0),
        ];
        for (name, throughput) in runs {
            rounds.push(Run(name, throughput));
        }
        assert_eq!(rounds.each().len(), 3);
        assert_eq!(rounds.each()[2].len(), 1);
        assert_eq!(
            rounds.medians(),
            [Run("floor", 20.0), Run("gate", 2.0), Run("brandur", 5.0)]
        );
    }
}
