//! Quoting the names the audit makes up (the new indexes of a fix) and the
//! schema names of its summary.
//!
//! Names in the catalog rows are quoted by the server (`quote_ident`) in the
//! catalog query. A new name is made here, so it is quoted here, by the rule of
//! PostgreSQL's `quote_identifier`: it stays bare only when it is lowercase
//! letters, digits and underscores, starts with a letter or underscore, and is
//! not a keyword the server reserves in any way. The keywords come from the
//! server being audited (`pg_get_keywords()`), so a keyword added by a newer
//! PostgreSQL is quoted too.

use std::collections::HashSet;

/// The longest identifier PostgreSQL keeps (`NAMEDATALEN - 1` bytes); longer
/// ones are silently truncated, which could make two new names collide.
pub const MAX_IDENTIFIER_BYTES: usize = 63;

/// Quotes identifiers the way the audited server would.
#[derive(Debug, Clone, Default)]
pub struct Quoter {
    /// Keywords that are not `UNRESERVED` on the server, lowercase.
    keywords: HashSet<String>,
}

impl Quoter {
    /// A quoter for a server whose non-unreserved keywords are `keywords`.
    pub fn new(keywords: impl IntoIterator<Item = String>) -> Self {
        Quoter {
            keywords: keywords.into_iter().collect(),
        }
    }

    /// `name` as an SQL identifier: bare when that is unambiguous, else in
    /// double quotes with every inner double quote doubled.
    pub fn quote(&self, name: &str) -> String {
        let bare = name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            && !self.keywords.contains(name);
        if bare {
            name.to_owned()
        } else {
            format!("\"{}\"", name.replace('"', "\"\""))
        }
    }
}

/// `base` followed by `suffix`, with `base` cut (at a character boundary) so
/// the whole fits in [`MAX_IDENTIFIER_BYTES`] and the suffix survives.
pub fn name_with_suffix(base: &str, suffix: &str) -> String {
    let room = MAX_IDENTIFIER_BYTES.saturating_sub(suffix.len());
    let mut cut = base.len().min(room);
    while !base.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}{suffix}", &base[..cut])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quoter() -> Quoter {
        Quoter::new(["select".to_owned(), "user".to_owned(), "order".to_owned()])
    }

    #[test]
    fn plain_lowercase_names_stay_bare() {
        assert_eq!(quoter().quote("users_email_key_nnd"), "users_email_key_nnd");
        assert_eq!(quoter().quote("_x1"), "_x1");
    }

    #[test]
    fn hostile_names_are_quoted_and_inner_quotes_doubled() {
        let q = quoter();
        assert_eq!(q.quote("Order Items"), r#""Order Items""#);
        assert_eq!(q.quote(r#"a"b"#), r#""a""b""#);
        assert_eq!(q.quote(r#"""#), r#""""""#);
        assert_eq!(q.quote("1abc"), r#""1abc""#);
        assert_eq!(q.quote("émoji_ü"), r#""émoji_ü""#);
        assert_eq!(q.quote("a$b"), r#""a$b""#);
        assert_eq!(q.quote(""), r#""""#);
        assert_eq!(q.quote("x; DROP TABLE t; --"), r#""x; DROP TABLE t; --""#);
    }

    #[test]
    fn keywords_are_quoted() {
        assert_eq!(quoter().quote("select"), r#""select""#);
        assert_eq!(quoter().quote("user"), r#""user""#);
        assert_eq!(quoter().quote("users"), "users");
    }

    #[test]
    fn long_names_are_cut_before_the_suffix_at_a_character_boundary() {
        let long = "a".repeat(70);
        let named = name_with_suffix(&long, "_nnd");
        assert_eq!(named.len(), MAX_IDENTIFIER_BYTES);
        assert!(named.ends_with("_nnd"));
        // 'é' is two bytes: the cut must not split it.
        let accented = "é".repeat(40);
        let named = name_with_suffix(&accented, "_n01");
        assert!(named.len() <= MAX_IDENTIFIER_BYTES);
        assert!(named.ends_with("_n01"));
        assert_eq!(name_with_suffix("short", "_nnd"), "short_nnd");
    }
}
