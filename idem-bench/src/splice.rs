//! Writing the report into a hand-written markdown file: everything between
//! the file's two marker lines is replaced by the report, exactly as it was
//! rendered, and everything outside them is left alone. BENCHMARKS.md holds
//! the method by hand and the report this way, so no figure in it is ever
//! pasted. The matrix, the Citus comparison, River side by side and the
//! prune measurement (`prune_bench`) each have
//! their own pair of markers, so writing one report leaves the others
//! as they were.

use std::fs;
use std::path::Path;

use crate::BoxError;

/// The two lines a report is written between.
#[derive(Debug, Clone, Copy)]
pub struct Markers {
    /// The line after which the report begins.
    pub begin: &'static str,
    /// The line before which the report ends.
    pub end: &'static str,
}

/// The single-PostgreSQL matrix's report.
pub const MATRIX: Markers = Markers {
    begin: "<!-- loadgen report: begin (written by `loadgen --into`; do not edit) -->",
    end: "<!-- loadgen report: end -->",
};

/// The Citus comparison's report (`--citus-url`).
pub const CITUS: Markers = Markers {
    begin: "<!-- loadgen citus report: begin (written by `loadgen --citus-url URL --into`; do not edit) -->",
    end: "<!-- loadgen citus report: end -->",
};

/// River side by side (`--river`).
pub const RIVER: Markers = Markers {
    begin: "<!-- loadgen river report: begin (written by `loadgen --river --into`; do not edit) -->",
    end: "<!-- loadgen river report: end -->",
};

/// The prune measurement (`prune_bench --into`), which includes this module;
/// the load generator itself never writes it.
#[allow(dead_code)]
pub const PRUNE: Markers = Markers {
    begin: "<!-- prune_bench report: begin (written by `prune_bench --into`; do not edit) -->",
    end: "<!-- prune_bench report: end -->",
};

/// Fails unless `path` is readable and holds both `markers`, in order, once.
pub fn check(path: &Path, markers: Markers) -> Result<(), BoxError> {
    let text =
        fs::read_to_string(path).map_err(|error| format!("--into {}: {error}", path.display()))?;
    bounds(&text, markers)
        .map(drop)
        .map_err(|why| format!("--into {}: {why}", path.display()).into())
}

/// Replaces what stands between `markers` in `path` with `report`.
pub fn write(path: &Path, markers: Markers, report: &str) -> Result<(), BoxError> {
    let text = fs::read_to_string(path)?;
    let (before, after) =
        bounds(&text, markers).map_err(|why| format!("{}: {why}", path.display()))?;
    let report = report.trim_end();
    fs::write(path, format!("{before}\n\n{report}\n\n{after}"))?;
    Ok(())
}

/// The text up to and including the begin marker, and from the end marker on.
fn bounds(text: &str, Markers { begin, end }: Markers) -> Result<(&str, &str), String> {
    let missing = || format!("needs the lines\n{begin}\n{end}\nonce each, in this order");
    let from = text.find(begin).ok_or_else(missing)?;
    let to = text.find(end).ok_or_else(missing)?;
    let twice = text.matches(begin).count() > 1 || text.matches(end).count() > 1;
    if to < from || twice {
        return Err(missing());
    }
    Ok((&text[..from + begin.len()], &text[to..]))
}

#[cfg(test)]
mod tests {
    use super::{CITUS, MATRIX, bounds};

    #[test]
    fn what_stands_between_the_markers_is_replaced_and_nothing_else() {
        let (begin, end) = (MATRIX.begin, MATRIX.end);
        let text = format!("# Method\n\n{begin}\n\nold report\n\n{end}\n\n## After\n");
        let (before, after) = bounds(&text, MATRIX).expect("both markers");
        assert_eq!(before, format!("# Method\n\n{begin}"));
        assert_eq!(after, format!("{end}\n\n## After\n"));
    }

    #[test]
    fn a_file_without_both_markers_in_order_is_refused() {
        let (begin, end) = (MATRIX.begin, MATRIX.end);
        assert!(bounds("no markers", MATRIX).is_err());
        assert!(bounds(&format!("{end}\n{begin}\n"), MATRIX).is_err());
        assert!(bounds(&format!("{begin}\n{end}\n{end}\n"), MATRIX).is_err());
    }

    #[test]
    fn each_report_keeps_to_its_own_markers() {
        let text = format!(
            "{}\nmatrix\n{}\n{}\ncitus\n{}\n",
            MATRIX.begin, MATRIX.end, CITUS.begin, CITUS.end
        );
        let (before, after) = bounds(&text, CITUS).expect("the Citus markers");
        assert!(before.contains("\nmatrix\n") && before.ends_with(CITUS.begin));
        assert_eq!(after, format!("{}\n", CITUS.end));
        let (before, after) = bounds(&text, MATRIX).expect("the matrix markers");
        assert_eq!(before, MATRIX.begin);
        assert!(after.contains("\ncitus\n"));
    }
}
