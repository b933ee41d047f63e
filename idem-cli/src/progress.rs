//! How far a long command has got, on stderr: a progress bar when stderr is
//! a terminal, plain lines at a bounded rate when it is a file or a pipe
//! (a log, CI, `2>prune.log`), where a bar's redraws would be noise.

use std::io::{IsTerminal as _, Write as _};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// At most one plain line this often (and one when done).
const LINE_INTERVAL: Duration = Duration::from_secs(5);

/// Progress over an estimated total: rows pruned of the rows counted
/// before starting (an estimate: the workload settles and claims rows
/// meanwhile).
#[derive(Debug)]
pub struct Progress {
    /// What is counted, in the plural: "pruned" in "pruned 120000 of ...".
    verb: &'static str,
    /// The estimated total.
    total: u64,
    done: u64,
    started: Instant,
    shown: Shown,
}

/// Where progress goes.
#[derive(Debug)]
enum Shown {
    /// A bar, redrawn by indicatif (at most 20 times a second).
    Bar(ProgressBar),
    /// Plain lines, the last one written at that instant.
    Lines { last: Instant },
}

impl Progress {
    /// Progress toward about `total`, shown as a bar when stderr is a
    /// terminal, else as lines.
    pub fn new(verb: &'static str, total: u64) -> Progress {
        let started = Instant::now();
        let shown = if std::io::stderr().is_terminal() {
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            // A fixed template: were it to fail to parse, the
            // default style is still a bar.
            if let Ok(style) = ProgressStyle::with_template(&format!(
                "{{wide_bar}} {verb} {{human_pos}} of ~{{human_len}} ({{percent}}%), \
                 {{elapsed}} so far, eta {{eta}}"
            )) {
                bar.set_style(style);
            }
            Shown::Bar(bar)
        } else {
            Shown::Lines { last: started }
        };
        Progress {
            verb,
            total,
            done: 0,
            started,
            shown,
        }
    }

    /// `rows` more are done.
    pub fn advance(&mut self, rows: u64) {
        self.done += rows;
        match &mut self.shown {
            Shown::Bar(bar) => {
                // More than the estimate: the workload settled more meanwhile.
                if self.done > self.total {
                    bar.set_length(self.done);
                }
                bar.set_position(self.done);
            }
            Shown::Lines { last } => {
                if last.elapsed() >= LINE_INTERVAL {
                    *last = Instant::now();
                    line(&self.line());
                }
            }
        }
    }

    /// Says `text` on its own line, above the bar if there is one; free of
    /// hidden characters (a database error may quote a value).
    pub fn note(&self, text: &str) {
        let text = idem_runtime::shown::escaped_lines(text);
        let text = text.as_ref();
        match &self.shown {
            Shown::Bar(bar) => bar.println(format!("idem: {text}")),
            Shown::Lines { .. } => line(text),
        }
    }

    /// How many are done so far.
    pub fn done(&self) -> u64 {
        self.done
    }

    /// Clears the bar (or writes the last line): the command's own output
    /// follows.
    pub fn finish(self) {
        match &self.shown {
            Shown::Bar(bar) => bar.finish_and_clear(),
            Shown::Lines { .. } => line(&self.line()),
        }
    }

    /// "pruned 120000 of ~5000000 (2.4%), 31000 rows/s".
    fn line(&self) -> String {
        let seconds = self.started.elapsed().as_secs_f64();
        let rate = if seconds > 0.0 {
            self.done as f64 / seconds
        } else {
            0.0
        };
        let percent = if self.total == 0 {
            100.0
        } else {
            self.done as f64 * 100.0 / self.total as f64
        };
        format!(
            "{} {} of ~{} ({percent:.1}%), {rate:.0} rows/s",
            self.verb, self.done, self.total
        )
    }
}

/// One line on stderr, `idem: ` first; a stderr that cannot be written to loses it, as
/// progress is not the command's result.
fn line(text: &str) {
    let _ = writeln!(std::io::stderr().lock(), "idem: {text}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_says_how_far_of_the_estimate() {
        let mut progress = Progress {
            verb: "pruned",
            total: 5_000_000,
            done: 0,
            started: Instant::now(),
            shown: Shown::Lines {
                last: Instant::now(),
            },
        };
        progress.advance(120_000);
        let line = progress.line();
        assert!(
            line.starts_with("pruned 120000 of ~5000000 (2.4%), "),
            "{line}"
        );
        assert!(line.ends_with(" rows/s"), "{line}");
    }
}
