//! Output shared by the commands: the `--format` choice, aligned text
//! tables and JSON.
//!
//! How text the command did not write is shown (names of accounts,
//! namespaces and actions, key parts) is [`idem_runtime::shown`]'s one
//! rule, which the console follows too: a name goes through
//! [`shown::escaped`] where it is put into a line, and everything printed
//! in text goes through [`shown::escaped_lines`] on its way out (`main`),
//! so that no hidden character reaches the terminal, whatever a message
//! forgot. JSON output needs none of this: it carries names losslessly, as
//! JSON strings, for scripts.

use idem_runtime::shown;
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
/// two spaces apart, no trailing spaces. Names in the cells are the
/// caller's to [`shown::escaped`]; every cell is made one line free of
/// hidden characters here ([`shown::escaped_rendering`], which leaves the
/// backslashes of an escaped name or of a `Debug` rendering alone).
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            row.iter()
                .map(|cell| shown::escaped_rendering(cell).into_owned())
                .collect()
        })
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

/// A name (an account, a namespace, an action) as the command prints it:
/// [`shown::escaped`], owned.
pub fn name(text: &str) -> String {
    shown::escaped(text).into_owned()
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
    fn hidden_characters_are_escaped_as_the_console_escapes_them() {
        assert_eq!(
            name("acme\u{1b}[2J\r\n\u{202e}\u{61c}é\\"),
            r"acme\u{1b}[2J\u{d}\u{a}\u{202e}\u{61c}é\\"
        );
        assert_eq!(name(r#"ord "1" é"#), r#"ord "1" é"#);
        // Every cell one line, free of hidden characters; an escaped name's
        // backslashes are not doubled again.
        assert_eq!(
            table(&["A"], &[vec!["a\tb\u{200b}".to_owned()]]),
            "A\na\\u{9}b\\u{200b}\n"
        );
        assert_eq!(table(&["A"], &[vec![name("c\\d")]]), "A\nc\\\\d\n");
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
