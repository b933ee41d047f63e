//! Can a key of a unique index be NULL in a row the index covers?
//!
//! A key is **safe** when one of these proves it non-NULL; otherwise it is
//! nullable and the index is a finding:
//!
//! 1. The index predicate rules out a NULL key: the predicate cannot be TRUE
//!    in a row where the key is NULL (see [`predicate_excludes_null`]).
//! 2. The key is a column declared `NOT NULL`, or a validated `CHECK`
//!    constraint of the table rejects every row where the key is NULL: a
//!    check passes when it is TRUE *or NULL*, so it must be certainly FALSE
//!    then (`CHECK (c IS NOT NULL)`, the usual way to add NOT NULL without a
//!    long lock, does; `CHECK (c > 0)` does not). `NOT VALID` checks are
//!    ignored: existing rows may break them.
//! 3. The key is an expression that cannot be NULL: a non-NULL constant, a
//!    `COALESCE` with at least one argument that cannot be NULL, a cast that
//!    keeps NULLness (binary-compatible, or to `text`), or a call of a function
//!    in [`NEVER_NULL_FUNCTIONS`] whose arguments all cannot be NULL. A column
//!    inside the expression is non-NULL by rule 1 or 2.
//!
//! Rule 3 does not trust `pg_proc.proisstrict`: strict means NULL in, NULL
//! out, and says nothing about non-NULL input. `jsonb ->> 'email'` is strict
//! and returns NULL for every row without that key, so a unique index on it
//! over a `NOT NULL` jsonb column enforces nothing for those rows. PostgreSQL
//! records no "never returns NULL" property, so only the functions listed
//! here count; any other call, `CASE`, `NULLIF`, a subscript, a field access
//! and every node kind we do not know make the key nullable. This can report
//! an index that is in fact safe (say, over a user function that never
//! returns NULL): the report names the function, and the fix is cheap.
//!
//! Strictness does matter for rule 1, in the other direction: a strict
//! function or operator of a NULL is NULL, and a predicate that is NULL or
//! FALSE excludes the row. So `WHERE c > 0`, `WHERE c <> ''`,
//! `WHERE c IN ('a', 'b')` and `WHERE lower(c) LIKE 'x%'` all exclude rows
//! where `c` is NULL, as do `c IS NOT NULL`, any `AND` containing one of
//! those, and an `OR` whose every branch is one of those. An `OR` with a
//! branch that says nothing about `c` (`c IS NOT NULL OR archived`) does not.
//!
//! The same evaluation runs under a [`Given`] shape of row (these keys NULL,
//! those present), which is how the audit decides whether a NULL pattern of
//! an index can occur at all ([`row_possible`]) and whether a key is present
//! in every row of a pattern ([`not_null_given`]). For that it also computes
//! a few built-ins ([`Known`]): `=`/`<>` of two booleans, so
//! `CHECK ((a IS NULL) <> (b IS NULL))` says exactly one is NULL, and
//! `num_nulls`/`num_nonnulls` compared with a small integer constant.

use std::collections::HashMap;

use super::node_tree::{BoolTestKind, Expr};

/// Functions (in `pg_catalog`, by name and argument types as `oidvectortypes`
/// prints them) that return a non-NULL value whenever all their arguments are
/// non-NULL. Kept short on purpose: each entry is a claim we have checked.
/// `lower(anyrange)` is missing deliberately: it is NULL for an empty range.
pub const NEVER_NULL_FUNCTIONS: &[&str] = &[
    "lower(text)",
    "upper(text)",
    "initcap(text)",
    "btrim(text)",
    "btrim(text, text)",
    "ltrim(text)",
    "ltrim(text, text)",
    "rtrim(text)",
    "rtrim(text, text)",
    "md5(text)",
    "textcat(text, text)",
    "anytextcat(anynonarray, text)",
    "textanycat(text, anynonarray)",
    "date(timestamp with time zone)",
    "date(timestamp without time zone)",
    "date_trunc(text, timestamp with time zone)",
    "date_trunc(text, timestamp without time zone)",
];

/// What the audit knows about a function, from `pg_proc`.
#[derive(Debug, Clone)]
pub struct Function {
    /// `proname(argument types)`, for messages.
    pub signature: String,
    /// `proisstrict`: NULL in any argument gives NULL without a call.
    pub strict: bool,
    /// In `pg_catalog` and in [`NEVER_NULL_FUNCTIONS`].
    pub never_null: bool,
    /// A built-in the audit evaluates in `CHECK` constraints, if it is one.
    pub known: Option<Known>,
}

/// Built-in functions whose value the audit computes, so that the usual ways
/// to say "exactly one of these is set" are understood:
/// `CHECK ((a IS NULL) <> (b IS NULL))`, `CHECK (num_nonnulls(a, b) = 1)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Known {
    /// `booleq` (`equal`) or `boolne` of two booleans.
    BooleanEquality {
        /// `=` rather than `<>`.
        equal: bool,
    },
    /// `int4eq`, `int4ne`, `int4lt`, `int4le`, `int4gt`, `int4ge`.
    IntegerComparison(Comparison),
    /// `num_nulls` (`nulls`) or `num_nonnulls`: never NULL itself.
    CountNulls {
        /// Counts the NULL arguments rather than the others.
        nulls: bool,
    },
}

/// An integer comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Comparison {
    /// `=`
    Eq,
    /// `<>`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
}

impl Known {
    /// The built-in `pg_catalog` function with this signature (as
    /// [`Function::signature`] spells it), if the audit evaluates it.
    pub fn of(signature: &str) -> Option<Known> {
        Some(match signature {
            "booleq(boolean, boolean)" => Known::BooleanEquality { equal: true },
            "boolne(boolean, boolean)" => Known::BooleanEquality { equal: false },
            "int4eq(integer, integer)" => Known::IntegerComparison(Comparison::Eq),
            "int4ne(integer, integer)" => Known::IntegerComparison(Comparison::Ne),
            "int4lt(integer, integer)" => Known::IntegerComparison(Comparison::Lt),
            "int4le(integer, integer)" => Known::IntegerComparison(Comparison::Le),
            "int4gt(integer, integer)" => Known::IntegerComparison(Comparison::Gt),
            "int4ge(integer, integer)" => Known::IntegerComparison(Comparison::Ge),
            "num_nulls(\"any\")" => Known::CountNulls { nulls: true },
            "num_nonnulls(\"any\")" => Known::CountNulls { nulls: false },
            _ => return None,
        })
    }
}

/// What a row is assumed to hold: these expressions are NULL in it, those
/// are not. Sound reasoning under the assumption says what a row of that
/// shape can make a predicate or a check evaluate to.
#[derive(Debug, Clone, Copy, Default)]
pub struct Given<'e> {
    /// NULL in the row.
    pub null: &'e [&'e Expr],
    /// Not NULL in the row.
    pub not_null: &'e [&'e Expr],
}

/// Everything a proof may use about one index.
#[derive(Debug)]
pub struct Facts<'a> {
    /// Columns of the table: attribute number to (name as SQL, `NOT NULL`).
    pub columns: &'a HashMap<i16, (String, bool)>,
    /// Functions the index's expressions and predicate call, by OID.
    pub functions: &'a HashMap<u32, Function>,
    /// The index predicate, if the index is partial.
    pub predicate: Option<&'a Expr>,
    /// The table's validated `CHECK` constraints.
    pub checks: &'a [Expr],
}

impl Facts<'_> {
    fn strict(&self, function: u32) -> bool {
        self.functions.get(&function).is_some_and(|f| f.strict)
    }

    fn known(&self, function: u32) -> Option<Known> {
        self.functions.get(&function).and_then(|f| f.known)
    }
}

/// Why `key` can be NULL in a row the index covers: one reason per source of
/// NULL, empty when the key is proven non-NULL.
pub fn why_nullable(key: &Expr, facts: &Facts<'_>) -> Vec<String> {
    if facts
        .predicate
        .is_some_and(|predicate| predicate_excludes_null(predicate, key, facts))
        || facts
            .checks
            .iter()
            .any(|check| check_rejects_null(check, key, facts))
    {
        return Vec::new();
    }
    match key {
        Expr::Column(attnum) => match facts.columns.get(attnum) {
            Some((_, true)) => Vec::new(),
            Some((name, false)) => vec![format!("{name} allows NULL")],
            None => vec![format!("column number {attnum} is unknown")],
        },
        Expr::Const { is_null: true, .. } => vec!["a NULL constant".to_owned()],
        Expr::Const { is_null: false, .. } => Vec::new(),
        Expr::Cast(arg) => why_nullable(arg, facts),
        Expr::Coalesce(args) => {
            let reasons: Vec<Vec<String>> = args.iter().map(|a| why_nullable(a, facts)).collect();
            if reasons.iter().any(Vec::is_empty) {
                Vec::new()
            } else {
                dedup(reasons.into_iter().flatten())
            }
        }
        Expr::Call { function, args, .. } => match facts.functions.get(function) {
            Some(f) if f.never_null => dedup(args.iter().flat_map(|a| why_nullable(a, facts))),
            Some(f) => vec![format!(
                "{} may return NULL (not known never to)",
                f.signature
            )],
            None => vec![format!("function {function} is unknown")],
        },
        other => vec![format!("{} can be NULL", describe(other))],
    }
}

/// `true` when `predicate` cannot be TRUE in a row where `key` is NULL, so
/// such rows are not in the index.
pub fn predicate_excludes_null(predicate: &Expr, key: &Expr, facts: &Facts<'_>) -> bool {
    let null = [key];
    !outcomes(predicate, &given_null(&null), facts).can_be_true
}

/// `true` when the `CHECK` constraint `check` fails in every row where `key`
/// is NULL, so no such row exists.
pub fn check_rejects_null(check: &Expr, key: &Expr, facts: &Facts<'_>) -> bool {
    let null = [key];
    check_rejects(check, &given_null(&null), facts)
}

fn given_null<'e>(null: &'e [&'e Expr]) -> Given<'e> {
    Given {
        null,
        not_null: &[],
    }
}

/// `true` when `check` fails in every row shaped as `given`: a check passes
/// when TRUE or NULL, so it must be certainly FALSE.
fn check_rejects(check: &Expr, given: &Given<'_>, facts: &Facts<'_>) -> bool {
    let o = outcomes(check, given, facts);
    !o.can_be_true && !o.can_be_null
}

/// `true` when a row shaped as `given` can be in the index: the predicate
/// can be TRUE for it and no validated `CHECK` rejects it. `false` is a
/// proof that no such row exists.
pub fn row_possible(given: &Given<'_>, facts: &Facts<'_>) -> bool {
    facts
        .predicate
        .is_none_or(|predicate| outcomes(predicate, given, facts).can_be_true)
        && !facts
            .checks
            .iter()
            .any(|check| check_rejects(check, given, facts))
}

/// `true` when `expr` is proven non-NULL in every row of the index shaped as
/// `given`: assumed so, non-NULL by [`why_nullable`]'s rules, or because
/// a row shaped as `given` with `expr` NULL as well cannot exist.
pub fn not_null_given(expr: &Expr, given: &Given<'_>, facts: &Facts<'_>) -> bool {
    if given.not_null.iter().any(|e| same(e, expr)) || why_nullable(expr, facts).is_empty() {
        return true;
    }
    let mut null: Vec<&Expr> = given.null.to_vec();
    null.push(expr);
    !row_possible(
        &Given {
            null: &null,
            not_null: given.not_null,
        },
        facts,
    )
}

/// `true` when `predicate` is TRUE in every row of the index shaped as
/// `given`: each of its conjuncts is certainly TRUE there, or is also a
/// conjunct of the index's own predicate.
pub fn holds_given(predicate: &Expr, given: &Given<'_>, facts: &Facts<'_>) -> bool {
    let own: Vec<&Expr> = facts.predicate.map(conjuncts).unwrap_or_default();
    conjuncts(predicate).into_iter().all(|conjunct| {
        own.iter().any(|o| same(o, conjunct)) || {
            let o = outcomes(conjunct, given, facts);
            o.can_be_true && !o.can_be_false && !o.can_be_null
        }
    })
}

fn conjuncts(expr: &Expr) -> Vec<&Expr> {
    match expr {
        Expr::And(args) => args.iter().flat_map(conjuncts).collect(),
        other => vec![other],
    }
}

/// The values a boolean expression may take in a row where `key` is NULL.
/// Sound over-approximation: a value we cannot rule out is possible.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Outcomes {
    can_be_true: bool,
    can_be_false: bool,
    can_be_null: bool,
}

impl Outcomes {
    const ANY: Outcomes = Outcomes {
        can_be_true: true,
        can_be_false: true,
        can_be_null: true,
    };
    const NULL: Outcomes = Outcomes {
        can_be_true: false,
        can_be_false: false,
        can_be_null: true,
    };
    const fn exactly(value: bool) -> Outcomes {
        Outcomes {
            can_be_true: value,
            can_be_false: !value,
            can_be_null: false,
        }
    }
    /// A test that is TRUE when `when_true`, else FALSE, never NULL.
    const fn test(when_true: bool, when_false: bool) -> Outcomes {
        Outcomes {
            can_be_true: when_true,
            can_be_false: when_false,
            can_be_null: false,
        }
    }
}

fn outcomes(expr: &Expr, key: &Given<'_>, facts: &Facts<'_>) -> Outcomes {
    if null_when_null(expr, key, facts) {
        return Outcomes::NULL;
    }
    match expr {
        Expr::And(args) => {
            args.iter()
                .map(|a| outcomes(a, key, facts))
                .fold(Outcomes::exactly(true), |acc, o| Outcomes {
                    can_be_true: acc.can_be_true && o.can_be_true,
                    can_be_false: acc.can_be_false || o.can_be_false,
                    can_be_null: acc.can_be_null || o.can_be_null,
                })
        }
        Expr::Or(args) => {
            args.iter()
                .map(|a| outcomes(a, key, facts))
                .fold(Outcomes::exactly(false), |acc, o| Outcomes {
                    can_be_true: acc.can_be_true || o.can_be_true,
                    can_be_false: acc.can_be_false && o.can_be_false,
                    can_be_null: acc.can_be_null || o.can_be_null,
                })
        }
        Expr::Not(arg) => {
            let o = outcomes(arg, key, facts);
            Outcomes {
                can_be_true: o.can_be_false,
                can_be_false: o.can_be_true,
                can_be_null: o.can_be_null,
            }
        }
        Expr::NullTest { arg, is_null } if null_when_null(arg, key, facts) => {
            Outcomes::exactly(*is_null)
        }
        Expr::NullTest { arg, is_null } if not_null_when(arg, key, facts) => {
            Outcomes::exactly(!*is_null)
        }
        Expr::NullTest { .. } => Outcomes::test(true, true),
        Expr::Call { function, args, .. } => match (facts.known(*function), &args[..]) {
            (Some(Known::BooleanEquality { equal }), [left, right]) => compare_booleans(
                outcomes(left, key, facts),
                outcomes(right, key, facts),
                equal,
            ),
            (Some(Known::IntegerComparison(comparison)), [left, right]) => {
                match (range(left, key, facts), range(right, key, facts)) {
                    (Some(left), Some(right)) => compare_ranges(comparison, left, right),
                    _ => Outcomes::ANY,
                }
            }
            _ => Outcomes::ANY,
        },
        Expr::BoolTest { arg, test } => {
            let o = outcomes(arg, key, facts);
            let (is_true, is_false, is_unknown) = (o.can_be_true, o.can_be_false, o.can_be_null);
            match test {
                BoolTestKind::True => Outcomes::test(is_true, is_false || is_unknown),
                BoolTestKind::NotTrue => Outcomes::test(is_false || is_unknown, is_true),
                BoolTestKind::False => Outcomes::test(is_false, is_true || is_unknown),
                BoolTestKind::NotFalse => Outcomes::test(is_true || is_unknown, is_false),
                BoolTestKind::Unknown => Outcomes::test(is_unknown, is_true || is_false),
                BoolTestKind::NotUnknown => Outcomes::test(is_true || is_false, is_unknown),
            }
        }
        // PostgreSQL returns the default (FALSE for ANY, TRUE for ALL) for
        // an empty array before it looks at the scalar; for any other array a
        // NULL scalar under a strict operator gives NULL.
        Expr::ArrayComparison {
            function,
            any,
            scalar,
            array,
        } if facts.strict(*function) && null_when_null(scalar, key, facts) => match &**array {
            Expr::Array(elements) if !elements.is_empty() => Outcomes::NULL,
            _ => Outcomes {
                can_be_true: !any,
                can_be_false: *any,
                can_be_null: true,
            },
        },
        _ => Outcomes::ANY,
    }
}

/// `a = b` (`equal`) or `a <> b` of two booleans: strict, so NULL when
/// either is.
fn compare_booleans(a: Outcomes, b: Outcomes, equal: bool) -> Outcomes {
    let values = |o: Outcomes| {
        [(o.can_be_true, true), (o.can_be_false, false)]
            .into_iter()
            .filter(|(possible, _)| *possible)
            .map(|(_, value)| value)
            .collect::<Vec<bool>>()
    };
    let mut result = Outcomes {
        can_be_true: false,
        can_be_false: false,
        can_be_null: a.can_be_null || b.can_be_null,
    };
    for x in values(a) {
        for y in values(b) {
            if (x == y) == equal {
                result.can_be_true = true;
            } else {
                result.can_be_false = true;
            }
        }
    }
    result
}

/// The values an integer expression can take in a row shaped as `given`, as
/// an interval, when it is a small constant or a `num_nulls`/`num_nonnulls`
/// count; `None` otherwise (it may then also be NULL).
fn range(expr: &Expr, given: &Given<'_>, facts: &Facts<'_>) -> Option<(i64, i64)> {
    match expr {
        Expr::Const {
            is_null: false,
            value,
        } => small_integer(value).map(|v| (v, v)),
        Expr::Call { function, args, .. } => match facts.known(*function)? {
            Known::CountNulls { nulls } => {
                let certainly_null = args.iter().filter(|a| null_when_null(a, given, facts));
                let certainly_null = i64::try_from(certainly_null.count()).ok()?;
                let present = args.iter().filter(|a| not_null_when(a, given, facts));
                let present = i64::try_from(present.count()).ok()?;
                let all = i64::try_from(args.len()).ok()?;
                Some(if nulls {
                    (certainly_null, all - present)
                } else {
                    (present, all - certainly_null)
                })
            }
            _ => None,
        },
        _ => None,
    }
}

/// An `integer` constant from 0 to 127, as the stored tree holds it
/// (`23 4 [ v 0 0 0 0 0 0 0 ]`: type, the type's length, the datum's bytes). Only this shape
/// is read, which means the same on little- and big-endian servers (a
/// big-endian server stores such a value with the byte last); anything else
/// is `None`, and proves nothing.
fn small_integer(value: &str) -> Option<i64> {
    let mut words = value.split_whitespace();
    if words.next()? != "23" {
        return None;
    }
    let length: usize = words.next()?.parse().ok()?;
    let bytes: Vec<&str> = words.collect();
    let [open, first, rest @ .., close] = bytes.as_slice() else {
        return None;
    };
    let v: i64 = first.parse().ok()?;
    (*open == "["
        && *close == "]"
        && length == 4
        // A by-value datum is printed whole: 8 bytes, or 4 on a 32-bit server.
        && (rest.len() + 1 == 8 || rest.len() + 1 == 4)
        && (0..=127).contains(&v)
        && rest.iter().all(|b| *b == "0"))
    .then_some(v)
}

/// The outcomes of comparing a value in `left` with one in `right`: both
/// are never NULL.
fn compare_ranges(comparison: Comparison, left: (i64, i64), right: (i64, i64)) -> Outcomes {
    let ((a_lo, a_hi), (b_lo, b_hi)) = (left, right);
    let overlap = a_lo <= b_hi && b_lo <= a_hi;
    let single_equal = a_lo == a_hi && b_lo == b_hi && a_lo == b_lo;
    let (when_true, when_false) = match comparison {
        Comparison::Eq => (overlap, !single_equal),
        Comparison::Ne => (!single_equal, overlap),
        Comparison::Lt => (a_lo < b_hi, a_hi >= b_lo),
        Comparison::Le => (a_lo <= b_hi, a_hi > b_lo),
        Comparison::Gt => (a_hi > b_lo, a_lo <= b_hi),
        Comparison::Ge => (a_hi >= b_lo, a_lo < b_hi),
    };
    Outcomes::test(when_true, when_false)
}

/// `true` when `expr` is certainly not NULL in a row shaped as `given`:
/// assumed so, a non-NULL constant, or a `NOT NULL` column.
fn not_null_when(expr: &Expr, given: &Given<'_>, facts: &Facts<'_>) -> bool {
    match expr {
        Expr::Const { is_null, .. } => !is_null,
        Expr::Column(attnum) if facts.columns.get(attnum).is_some_and(|(_, nn)| *nn) => true,
        Expr::Cast(arg) => not_null_when(arg, given, facts),
        _ => given.not_null.iter().any(|e| same(e, expr)),
    }
}

/// `true` when `expr` is certainly NULL in a row shaped as `given`.
fn null_when_null(expr: &Expr, key: &Given<'_>, facts: &Facts<'_>) -> bool {
    if key.null.iter().any(|null| same(expr, null)) {
        return true;
    }
    match expr {
        Expr::Call { function, args, .. } => {
            facts.strict(*function) && args.iter().any(|a| null_when_null(a, key, facts))
        }
        Expr::Cast(arg) => null_when_null(arg, key, facts),
        Expr::Coalesce(args) => args.iter().all(|a| null_when_null(a, key, facts)),
        _ => false,
    }
}

/// Structural equality of two expressions; an opaque one equals nothing, so
/// a key we cannot read is never matched by a predicate (conservative).
pub fn same(a: &Expr, b: &Expr) -> bool {
    let all_same =
        |x: &[Expr], y: &[Expr]| x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same(x, y));
    match (a, b) {
        (Expr::Column(x), Expr::Column(y)) => x == y,
        (
            Expr::Const {
                is_null: x,
                value: xv,
            },
            Expr::Const {
                is_null: y,
                value: yv,
            },
        ) => x == y && xv == yv,
        (
            Expr::Call {
                function: fx,
                collation: cx,
                args: ax,
            },
            Expr::Call {
                function: fy,
                collation: cy,
                args: ay,
            },
        ) => fx == fy && cx == cy && *fx != 0 && all_same(ax, ay),
        (Expr::Cast(x), Expr::Cast(y)) | (Expr::Not(x), Expr::Not(y)) => same(x, y),
        (Expr::Coalesce(x), Expr::Coalesce(y))
        | (Expr::And(x), Expr::And(y))
        | (Expr::Or(x), Expr::Or(y)) => all_same(x, y),
        (
            Expr::NullTest {
                arg: x,
                is_null: nx,
            },
            Expr::NullTest {
                arg: y,
                is_null: ny,
            },
        ) => nx == ny && same(x, y),
        (Expr::BoolTest { arg: x, test: tx }, Expr::BoolTest { arg: y, test: ty }) => {
            tx == ty && same(x, y)
        }
        _ => false,
    }
}

fn describe(expr: &Expr) -> String {
    match expr {
        Expr::Opaque(tag) => match tag.as_str() {
            "CASEEXPR" => "a CASE expression".to_owned(),
            "NULLIFEXPR" => "NULLIF".to_owned(),
            "SUBSCRIPTINGREF" => "a subscript".to_owned(),
            "FIELDSELECT" => "a field of a composite value".to_owned(),
            "VARIADIC" => "a call with VARIADIC arguments".to_owned(),
            tag => format!("a {} expression", tag.to_lowercase()),
        },
        Expr::ArrayComparison { .. } => "an ANY/ALL comparison".to_owned(),
        Expr::Array(_) => "an array".to_owned(),
        Expr::And(_) | Expr::Or(_) | Expr::Not(_) => "a boolean combination".to_owned(),
        Expr::BoolTest { .. } | Expr::NullTest { .. } => "a test".to_owned(),
        _ => "the expression".to_owned(),
    }
}

fn dedup(reasons: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for reason in reasons {
        if !out.contains(&reason) {
            out.push(reason);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const GT: u32 = 147; // int4gt, strict
    const LOWER: u32 = 870; // lower(text), strict, never NULL
    const JSON_FIELD: u32 = 3214; // jsonb ->> text, strict, may be NULL
    const NOT_STRICT: u32 = 9999;
    const BOOLEQ: u32 = 60;
    const BOOLNE: u32 = 84;
    const INT4EQ: u32 = 65;
    const INT4LE: u32 = 149;
    const NUM_NULLS: u32 = 438;
    const NUM_NONNULLS: u32 = 440;

    fn col(n: i16) -> Expr {
        Expr::Column(n)
    }
    fn konst(v: &str) -> Expr {
        Expr::Const {
            is_null: false,
            value: v.to_owned(),
        }
    }
    fn call(function: u32, args: Vec<Expr>) -> Expr {
        Expr::Call {
            function,
            collation: 0,
            args,
        }
    }
    fn is_not_null(e: Expr) -> Expr {
        Expr::NullTest {
            arg: Box::new(e),
            is_null: false,
        }
    }
    fn is_null(e: Expr) -> Expr {
        Expr::NullTest {
            arg: Box::new(e),
            is_null: true,
        }
    }

    struct World {
        columns: HashMap<i16, (String, bool)>,
        functions: HashMap<u32, Function>,
    }

    impl World {
        fn new() -> World {
            let f = |signature: &str, strict, never_null| Function {
                signature: signature.to_owned(),
                strict,
                never_null,
                known: None,
            };
            World {
                // 1: id NOT NULL, 2: email NULL, 3: flag NULL, 4: data NOT NULL
                columns: HashMap::from([
                    (1, ("id".to_owned(), true)),
                    (2, ("email".to_owned(), false)),
                    (3, ("flag".to_owned(), false)),
                    (4, ("data".to_owned(), true)),
                ]),
                functions: HashMap::from([
                    (GT, f("int4gt(integer, integer)", true, false)),
                    (LOWER, f("lower(text)", true, true)),
                    (
                        JSON_FIELD,
                        f("jsonb_object_field_text(jsonb, text)", true, false),
                    ),
                    (NOT_STRICT, f("mine(text)", false, false)),
                    (
                        BOOLEQ,
                        Function {
                            known: Known::of("booleq(boolean, boolean)"),
                            ..f("booleq(boolean, boolean)", true, false)
                        },
                    ),
                    (
                        BOOLNE,
                        Function {
                            known: Known::of("boolne(boolean, boolean)"),
                            ..f("boolne(boolean, boolean)", true, false)
                        },
                    ),
                    (
                        INT4EQ,
                        Function {
                            known: Known::of("int4eq(integer, integer)"),
                            ..f("int4eq(integer, integer)", true, false)
                        },
                    ),
                    (
                        INT4LE,
                        Function {
                            known: Known::of("int4le(integer, integer)"),
                            ..f("int4le(integer, integer)", true, false)
                        },
                    ),
                    (
                        NUM_NONNULLS,
                        Function {
                            known: Known::of("num_nonnulls(\"any\")"),
                            ..f("num_nonnulls(\"any\")", false, false)
                        },
                    ),
                    (
                        NUM_NULLS,
                        Function {
                            known: Known::of("num_nulls(\"any\")"),
                            ..f("num_nulls(\"any\")", false, false)
                        },
                    ),
                ]),
            }
        }

        fn why(&self, key: &Expr, predicate: Option<&Expr>) -> Vec<String> {
            self.why_checked(key, predicate, &[])
        }

        fn why_checked(
            &self,
            key: &Expr,
            predicate: Option<&Expr>,
            checks: &[Expr],
        ) -> Vec<String> {
            why_nullable(
                key,
                &Facts {
                    columns: &self.columns,
                    functions: &self.functions,
                    predicate,
                    checks,
                },
            )
        }

        fn excludes(&self, predicate: &Expr, key: &Expr) -> bool {
            self.why(key, Some(predicate)).is_empty()
        }
    }

    #[test]
    fn columns_are_safe_when_not_null_or_excluded_by_the_predicate() {
        let w = World::new();
        assert!(w.why(&col(1), None).is_empty());
        assert_eq!(w.why(&col(2), None), vec!["email allows NULL"]);
        assert!(w.excludes(&is_not_null(col(2)), &col(2)));
        assert!(!w.excludes(&is_null(col(2)), &col(2)));
        assert!(!w.excludes(&is_not_null(col(3)), &col(2)));
    }

    #[test]
    fn conjunctions_need_one_excluding_branch_and_disjunctions_need_all() {
        let w = World::new();
        let strict = call(GT, vec![col(2), konst("0")]);
        let unrelated = is_null(col(3));
        assert!(w.excludes(&Expr::And(vec![unrelated.clone(), strict.clone()]), &col(2)));
        assert!(!w.excludes(&Expr::Or(vec![unrelated.clone(), strict.clone()]), &col(2)));
        assert!(w.excludes(
            &Expr::Or(vec![strict.clone(), is_not_null(col(2))]),
            &col(2)
        ));
        assert!(!w.excludes(&Expr::And(vec![unrelated]), &col(2)));
    }

    #[test]
    fn strict_operators_exclude_null_and_non_strict_ones_do_not() {
        let w = World::new();
        assert!(w.excludes(&call(GT, vec![col(2), konst("0")]), &col(2)));
        assert!(w.excludes(
            &call(GT, vec![call(LOWER, vec![col(2)]), konst("0")]),
            &col(2)
        ));
        assert!(!w.excludes(&call(NOT_STRICT, vec![col(2)]), &col(2)));
        assert!(
            !w.excludes(&call(9, vec![col(2)]), &col(2)),
            "unknown function"
        );
    }

    #[test]
    fn negations_and_boolean_tests_are_followed() {
        let w = World::new();
        assert!(w.excludes(&Expr::Not(Box::new(is_null(col(2)))), &col(2)));
        assert!(!w.excludes(&Expr::Not(Box::new(is_not_null(col(2)))), &col(2)));
        let test = |test, arg| Expr::BoolTest {
            arg: Box::new(arg),
            test,
        };
        assert!(w.excludes(&test(BoolTestKind::True, col(3)), &col(3)));
        assert!(w.excludes(&test(BoolTestKind::False, col(3)), &col(3)));
        assert!(!w.excludes(&test(BoolTestKind::NotTrue, col(3)), &col(3)));
        assert!(!w.excludes(&test(BoolTestKind::Unknown, col(3)), &col(3)));
        assert!(w.excludes(&test(BoolTestKind::NotUnknown, col(3)), &col(3)));
    }

    #[test]
    fn in_lists_exclude_null_and_all_over_an_unknown_array_does_not() {
        let w = World::new();
        let compare = |any, array| Expr::ArrayComparison {
            function: GT,
            any,
            scalar: Box::new(col(2)),
            array: Box::new(array),
        };
        let list = Expr::Array(vec![konst("1"), konst("2")]);
        let unknown = Expr::Opaque("CONST".to_owned());
        assert!(w.excludes(&compare(true, list.clone()), &col(2)));
        assert!(w.excludes(&compare(false, list), &col(2)));
        assert!(w.excludes(&compare(true, unknown.clone()), &col(2)));
        // x <> ALL ('{}') is TRUE even for a NULL x.
        assert!(!w.excludes(&compare(false, unknown), &col(2)));
        assert!(!w.excludes(&compare(false, Expr::Array(vec![])), &col(2)));
    }

    #[test]
    fn expressions_are_safe_only_through_never_null_functions() {
        let w = World::new();
        assert!(w.why(&call(LOWER, vec![col(1)]), None).is_empty());
        assert_eq!(
            w.why(&call(LOWER, vec![col(2)]), None),
            vec!["email allows NULL"]
        );
        assert_eq!(
            w.why(&call(JSON_FIELD, vec![col(4), konst("'email'")]), None),
            vec!["jsonb_object_field_text(jsonb, text) may return NULL (not known never to)"]
        );
        assert!(
            w.why(&Expr::Coalesce(vec![col(2), konst("''")]), None)
                .is_empty(),
            "coalesce with a constant"
        );
        assert!(
            !w.why(&Expr::Coalesce(vec![col(2), col(3)]), None)
                .is_empty()
        );
        assert!(w.why(&Expr::Cast(Box::new(col(1))), None).is_empty());
        assert!(!w.why(&Expr::Opaque("CASEEXPR".into()), None).is_empty());
    }

    #[test]
    fn only_checks_that_are_false_for_a_null_key_make_it_safe() {
        let w = World::new();
        let checked = |check: Expr| w.why_checked(&col(2), None, &[check]).is_empty();
        assert!(checked(is_not_null(col(2))));
        assert!(checked(Expr::And(vec![
            is_not_null(col(2)),
            is_null(col(3))
        ])));
        // A check that is NULL passes: NULL keys still get in.
        assert!(!checked(call(GT, vec![col(2), konst("0")])));
        assert!(!checked(Expr::Or(vec![
            is_not_null(col(2)),
            is_null(col(3))
        ])));
        assert!(!checked(is_null(col(2))));
    }

    #[test]
    fn predicates_make_expressions_safe_by_column_or_by_the_whole_expression() {
        let w = World::new();
        let lower_email = call(LOWER, vec![col(2)]);
        assert!(w.excludes(&is_not_null(col(2)), &lower_email));
        assert!(w.excludes(&is_not_null(lower_email.clone()), &lower_email));
        let json = call(JSON_FIELD, vec![col(4), konst("'email'")]);
        assert!(w.excludes(&is_not_null(json.clone()), &json));
        assert!(!w.excludes(&is_not_null(col(4)), &json));
        let case = Expr::Opaque("CASEEXPR".into());
        assert!(
            !w.excludes(&is_not_null(case.clone()), &case),
            "opaque never matches"
        );
    }

    /// `(email IS NULL) <> (flag IS NULL)`: exactly one of them is NULL.
    fn exactly_one_null() -> Expr {
        call(BOOLNE, vec![is_null(col(2)), is_null(col(3))])
    }

    fn possible(w: &World, checks: &[Expr], null: &[&Expr], not_null: &[&Expr]) -> bool {
        row_possible(
            &Given { null, not_null },
            &Facts {
                columns: &w.columns,
                functions: &w.functions,
                predicate: None,
                checks,
            },
        )
    }

    #[test]
    fn boolean_equality_of_null_tests_rules_patterns_out() {
        let w = World::new();
        let (email, flag) = (col(2), col(3));
        let check = [exactly_one_null()];
        assert!(!possible(&w, &check, &[], &[&email, &flag]), "both present");
        assert!(!possible(&w, &check, &[&email, &flag], &[]), "both NULL");
        assert!(possible(&w, &check, &[&email], &[&flag]));
        assert!(possible(&w, &check, &[&flag], &[&email]));
        // `=` instead of `<>`: both or neither.
        let same = [call(BOOLEQ, vec![is_null(col(2)), is_null(col(3))])];
        assert!(possible(&w, &same, &[], &[&email, &flag]));
        assert!(!possible(&w, &same, &[&email], &[&flag]));
        // Unknown about flag: nothing ruled out.
        assert!(possible(&w, &check, &[], &[&email]));
        // A NOT NULL column is present without being assumed so.
        let with_id = [call(BOOLNE, vec![is_null(col(2)), is_null(col(1))])];
        assert!(!possible(&w, &with_id, &[], &[&email]));
    }

    #[test]
    fn a_check_that_may_be_null_rules_nothing_out() {
        let w = World::new();
        let (email, flag) = (col(2), col(3));
        // `email > 0 <> flag IS NULL` is NULL when email is: the check passes.
        let check = [call(
            BOOLNE,
            vec![call(GT, vec![col(2), konst("0")]), is_null(col(3))],
        )];
        assert!(possible(&w, &check, &[&email], &[&flag]));
        assert!(possible(&w, &check, &[&email, &flag], &[]));
    }

    #[test]
    fn keys_tied_by_a_check_are_present_where_the_other_is_null() {
        let w = World::new();
        let checks = [exactly_one_null()];
        let facts = Facts {
            columns: &w.columns,
            functions: &w.functions,
            predicate: None,
            checks: &checks,
        };
        let (email, flag) = (col(2), col(3));
        let null_email = [&email];
        let given = Given {
            null: &null_email,
            not_null: &[],
        };
        assert!(not_null_given(&flag, &given, &facts));
        assert!(not_null_given(&col(1), &given, &facts), "NOT NULL column");
        let nothing = Given::default();
        assert!(!not_null_given(&flag, &nothing, &facts));
        let at_most_one = [Expr::Or(vec![is_null(col(2)), is_null(col(3))])];
        let facts = Facts {
            checks: &at_most_one,
            ..facts
        };
        assert!(!not_null_given(&flag, &given, &facts));
    }

    #[test]
    fn a_predicate_holds_when_each_conjunct_is_certain_or_the_indexs_own() {
        let w = World::new();
        let own = Expr::And(vec![is_null(col(3)), call(GT, vec![col(1), konst("0")])]);
        let facts = Facts {
            columns: &w.columns,
            functions: &w.functions,
            predicate: Some(&own),
            checks: &[],
        };
        let email = col(2);
        let null_email = [&email];
        let given = Given {
            null: &null_email,
            not_null: &[],
        };
        assert!(holds_given(&is_null(col(2)), &given, &facts));
        assert!(!holds_given(&is_not_null(col(2)), &given, &facts));
        assert!(holds_given(
            &Expr::And(vec![is_null(col(2)), call(GT, vec![col(1), konst("0")])]),
            &given,
            &facts
        ));
        assert!(
            !holds_given(&call(GT, vec![col(1), konst("1")]), &given, &facts),
            "not the index's own"
        );
    }

    fn int(v: u8) -> Expr {
        konst(&format!("23 4 [ {v} 0 0 0 0 0 0 0 ]"))
    }

    #[test]
    fn counts_of_nulls_compared_with_small_constants_rule_patterns_out() {
        let w = World::new();
        let (email, flag) = (col(2), col(3));
        let exactly_one = [call(
            INT4EQ,
            vec![call(NUM_NONNULLS, vec![col(2), col(3)]), int(1)],
        )];
        assert!(!possible(&w, &exactly_one, &[], &[&email, &flag]));
        assert!(!possible(&w, &exactly_one, &[&email, &flag], &[]));
        assert!(possible(&w, &exactly_one, &[&email], &[&flag]));
        assert!(possible(&w, &exactly_one, &[&email], &[]), "flag unknown");
        let at_most_one_null = [call(
            INT4LE,
            vec![call(NUM_NULLS, vec![col(2), col(3)]), int(1)],
        )];
        assert!(!possible(&w, &at_most_one_null, &[&email, &flag], &[]));
        assert!(possible(&w, &at_most_one_null, &[&email], &[]));
        assert!(possible(&w, &at_most_one_null, &[], &[&email, &flag]));
    }

    #[test]
    fn only_small_integer_constants_in_the_shape_both_byte_orders_share_are_read() {
        assert_eq!(small_integer("23 4 [ 1 0 0 0 0 0 0 0 ]"), Some(1));
        assert_eq!(small_integer("23 4 [ 0 0 0 0 0 0 0 0 ]"), Some(0));
        assert_eq!(small_integer("23 4 [ 2 0 0 0 ]"), Some(2), "32-bit datum");
        assert_eq!(small_integer("23 4 [ 0 0 0 0 0 0 0 1 ]"), None);
        assert_eq!(
            small_integer("23 4 [ 255 255 255 255 255 255 255 255 ]"),
            None
        );
        assert_eq!(small_integer("23 4 [ 0 1 0 0 0 0 0 0 ]"), None);
        assert_eq!(small_integer("20 8 [ 1 0 0 0 0 0 0 0 ]"), None, "bigint");
        assert_eq!(small_integer("23 4 [ 1 0 0 ]"), None);
    }
}
