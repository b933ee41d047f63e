//! Output shared by the commands: the `--format` choice, aligned text
//! tables and JSON.

use serde::Serialize;

use crate::error::CliError;

/// `--format`: for people, or for scripts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Aligned tables and readable blocks.
    Text,
    /// JSON with stable field names.
    Json,
}

/// A table: a header row, then one row per entry, columns padded to line up,
/// two spaces apart, no trailing spaces; every cell [`escape`]d.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|row| row.iter().map(|cell| escape(cell)).collect())
        .collect();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = headers.iter().map(|h| (*h).to_owned()).collect();
    for row in std::iter::once(&header).chain(&rows) {
        let mut line = String::new();
        for (cell, width) in row.iter().zip(&widths) {
            line.push_str(cell);
            let pad = width - cell.chars().count() + 2;
            line.extend(std::iter::repeat_n(' ', pad));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// `text` safe to print on a terminal: control characters (a newline, an
/// escape sequence's ESC, a carriage return that overwrites the line) and
/// the Unicode controls that reorder text (bidirectional overrides and
/// isolates) written as Rust escapes (`\n`, `\u{1b}`), everything else as
/// it is. Names come from the database, where anyone who can make a claim
/// chose them: printed raw, they could rewrite what the operator sees.
/// JSON output needs none of this (its encoder escapes control characters).
pub fn escape(text: &str) -> String {
    let mut shown = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() || is_reordering(c) {
            shown.extend(c.escape_default());
        } else {
            shown.push(c);
        }
    }
    shown
}

/// The Unicode formatting characters that change the order in which text
/// is displayed: embeddings, overrides, isolates, and the marks.
fn is_reordering(c: char) -> bool {
    matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `text` cut to at most `max` characters, ending in `…` when cut.
pub fn truncate(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut cut: String = text.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// `value` as pretty JSON, with a final newline.
pub fn json<T: Serialize + ?Sized>(value: &T) -> Result<String, CliError> {
    serde_json::to_string_pretty(value)
        .map(|mut text| {
            text.push('\n');
            text
        })
        .map_err(|e| CliError::Output(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_columns_by_characters_and_trim_line_ends() {
        let rows = vec![
            vec!["acme".to_owned(), "é".to_owned(), "x".to_owned()],
            vec!["a".to_owned(), "long value".to_owned(), String::new()],
        ];
        assert_eq!(
            table(&["ACCOUNT", "NS", "LAST"], &rows),
            "ACCOUNT  NS          LAST\n\
             acme     é           x\n\
             a        long value\n"
        );
    }

    #[test]
    fn control_and_reordering_characters_are_escaped_and_the_rest_kept() {
        assert_eq!(
            escape("acme\u{1b}[2J\r\n\u{202e}é"),
            r"acme\u{1b}[2J\r\n\u{202e}é"
        );
        assert_eq!(escape(r#"ord "1" \ é"#), r#"ord "1" \ é"#);
        assert_eq!(table(&["A"], &[vec!["a\tb".to_owned()]]), "A\na\\tb\n");
    }

    #[test]
    fn an_empty_table_is_its_header() {
        assert_eq!(table(&["A", "B"], &[]), "A  B\n");
    }

    #[test]
    fn truncation_counts_characters_and_marks_the_cut() {
        assert_eq!(truncate("short", 10), "short");
        assert_eq!(truncate("ééééé", 3), "éé…");
        assert_eq!(truncate("abcdef", 6), "abcdef");
    }
}
