//! Writing the report into a hand-written markdown file: everything between
//! the file's two marker lines is replaced by the report, exactly as it was
//! rendered, and everything outside them is left alone. BENCHMARKS.md holds
//! the method by hand and the report this way, so no figure in it is ever
//! pasted.

use std::fs;
use std::path::Path;

use crate::BoxError;

/// The line after which the report begins.
pub const BEGIN: &str = "<!-- loadgen report: begin (written by `loadgen --into`; do not edit) -->";
/// The line before which the report ends.
pub const END: &str = "<!-- loadgen report: end -->";

/// Fails unless `path` is readable and holds both markers, in order, once.
pub fn check(path: &Path) -> Result<(), BoxError> {
    let text =
        fs::read_to_string(path).map_err(|error| format!("--into {}: {error}", path.display()))?;
    bounds(&text)
        .map(drop)
        .map_err(|why| format!("--into {}: {why}", path.display()).into())
}

/// Replaces what stands between the markers of `path` with `report`.
pub fn write(path: &Path, report: &str) -> Result<(), BoxError> {
    let text = fs::read_to_string(path)?;
    let (before, after) = bounds(&text).map_err(|why| format!("{}: {why}", path.display()))?;
    let report = report.trim_end();
    fs::write(path, format!("{before}\n\n{report}\n\n{after}"))?;
    Ok(())
}

/// The text up to and including the begin marker, and from the end marker on.
fn bounds(text: &str) -> Result<(&str, &str), String> {
    let missing = || format!("needs the lines\n{BEGIN}\n{END}\nonce each, in this order");
    let begin = text.find(BEGIN).ok_or_else(missing)?;
    let end = text.find(END).ok_or_else(missing)?;
    let twice = text.matches(BEGIN).count() > 1 || text.matches(END).count() > 1;
    if end < begin || twice {
        return Err(missing());
    }
    Ok((&text[..begin + BEGIN.len()], &text[end..]))
}

#[cfg(test)]
mod tests {
    use super::{BEGIN, END, bounds};

    #[test]
    fn what_stands_between_the_markers_is_replaced_and_nothing_else() {
        let text = format!("# Method\n\n{BEGIN}\n\nold report\n\n{END}\n\n## After\n");
        let (before, after) = bounds(&text).expect("both markers");
        assert_eq!(before, format!("# Method\n\n{BEGIN}"));
        assert_eq!(after, format!("{END}\n\n## After\n"));
    }

    #[test]
    fn a_file_without_both_markers_in_order_is_refused() {
        assert!(bounds("no markers").is_err());
        assert!(bounds(&format!("{END}\n{BEGIN}\n")).is_err());
        assert!(bounds(&format!("{BEGIN}\n{END}\n{END}\n")).is_err());
    }
}
