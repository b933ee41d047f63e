//! The pages' query parameters and forms, read strictly: an unknown or
//! repeated parameter is refused naming the valid ones (a mistyped filter
//! would otherwise show every claim), and every value is checked before a
//! statement sees it.
//!
//! Names (account, namespace, action) and durations travel as the pages
//! show them ([`escaped`]): a hidden character as `\u{..}`, a backslash
//! doubled. Every link and every field the pages write carries them so,
//! and every request is read so ([`unescaped`]): a name shown in a filter
//! box, submitted unchanged, filters on the name itself, and a page holds
//! no hidden character, not even in a field's value. An ordinary name is
//! written as it is; a hidden character written as it is reads as itself.

use std::time::Duration;

use idem_runtime::operations::{
    BrowseFilter, ClaimState, NamespaceFilter, PageCursor, ScopeFilter, Slot,
};
use idem_runtime::shown::{escaped, unescaped};

use super::text::{self, hex, parse_duration, shown, unhex};

/// A request's parameters, each at most once.
#[derive(Debug, Default)]
pub(super) struct Params(Vec<(String, String)>);

/// A parameter the page cannot use, said so that the operator can fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct BadParam(pub String);

impl Params {
    /// Parses `query` (or a form body), refusing names not in `known` and
    /// names given twice.
    pub(super) fn parse(query: Option<&str>, known: &[&str]) -> Result<Params, BadParam> {
        let pairs: Vec<(String, String)> = serde_urlencoded::from_str(query.unwrap_or(""))
            .map_err(|e| BadParam(format!("the parameters cannot be read: {e}")))?;
        for (i, (name, value)) in pairs.iter().enumerate() {
            // PostgreSQL text cannot hold NUL: no account, namespace or
            // action has one, so a value with one is a mistake of the
            // request (and the statement would fail as if the store had).
            if value.contains('\0') || name.contains('\0') {
                return Err(BadParam(format!(
                    "parameter \"{}\" holds a NUL character, which no name can",
                    shown(name)
                )));
            }
            if !known.contains(&name.as_str()) {
                return Err(BadParam(format!(
                    "unknown parameter \"{}\": this page takes {}",
                    shown(name),
                    known.join(", ")
                )));
            }
            if pairs[..i].iter().any(|(earlier, _)| earlier == name) {
                return Err(BadParam(format!("parameter {name} is given twice")));
            }
        }
        Ok(Params(pairs))
    }

    pub(super) fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, v)| v.as_str())
    }

    /// A name (or a duration) as the pages write it ([`escaped`]), read
    /// back; `None` when absent.
    pub(super) fn text(&self, name: &str) -> Result<Option<String>, BadParam> {
        let Some(value) = self.get(name) else {
            return Ok(None);
        };
        let text = unescaped(value).map_err(|error| {
            BadParam(format!(
                "{name} \"{}\" is not written as the console writes names: {error} (copy it \
                 from the page as it is shown)",
                shown(value)
            ))
        })?;
        // Escaped, a NUL gets past the check of the raw request.
        if text.contains('\0') {
            return Err(BadParam(format!(
                "parameter {name} holds a NUL character, which no name can"
            )));
        }
        Ok(Some(text.into_owned()))
    }

    /// A parameter that must be there and not empty.
    pub(super) fn required(&self, name: &str) -> Result<&str, BadParam> {
        match self.get(name) {
            Some(value) if !value.is_empty() => Ok(value),
            _ => Err(BadParam(format!("parameter {name} is required"))),
        }
    }
}

/// Builds a query string (`a=1&b=x%20y`) from pairs, leaving out `None`s;
/// every value as the pages show it ([`escaped`]: only names can change).
pub(super) fn query(pairs: &[(&str, Option<&str>)]) -> String {
    let present: Vec<(&str, std::borrow::Cow<'_, str>)> = pairs
        .iter()
        .filter_map(|(k, v)| v.map(|v| (*k, escaped(v))))
        .collect();
    serde_urlencoded::to_string(present).unwrap_or_default()
}

/// Where a claim lives, from `account`, `address` and `namespace` (present,
/// even empty: the claim has that namespace; absent: it has none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SlotParams {
    pub account: String,
    pub namespace: Option<String>,
    pub address: String,
}

impl SlotParams {
    pub(super) fn read(params: &Params) -> Result<SlotParams, BadParam> {
        let address = params.required("address")?;
        check_address(address)?;
        Ok(SlotParams {
            account: params
                .text("account")?
                .ok_or_else(|| BadParam("parameter account is required".into()))?,
            namespace: params.text("namespace")?,
            address: address.to_owned(),
        })
    }

    pub(super) fn slot(&self) -> Slot<'_> {
        Slot::new(&self.account, self.namespace.as_deref(), &self.address)
    }

    /// `account=..&address=..[&namespace=..]`.
    pub(super) fn query(&self) -> String {
        query(&[
            ("account", Some(&self.account)),
            ("address", Some(&self.address)),
            ("namespace", self.namespace.as_deref()),
        ])
    }
}

/// Refuses text that cannot be a claim address before asking the database:
/// what the schema's CHECK lets in (`[a-z0-9_]+`, any length: a row
/// written by hand may have a longer address than idem makes, and its
/// link must open).
fn check_address(address: &str) -> Result<(), BadParam> {
    if idem_runtime::operations::is_address(address) {
        Ok(())
    } else {
        Err(BadParam(format!(
            "\"{}\" is not a claim address: addresses are claim_ followed by 24 lowercase hex \
             digits",
            shown(address)
        )))
    }
}

/// The list's filters, as given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct ListParams {
    pub state: Option<ClaimState>,
    pub account: Option<String>,
    pub namespace: Option<String>,
    pub without_namespace: bool,
    pub action: Option<String>,
    pub older_than: Option<(String, Duration)>,
    pub limit: u32,
    pub after: Option<PageCursor>,
}

impl ListParams {
    pub(super) const NAMES: &'static [&'static str] = &[
        "state",
        "account",
        "namespace",
        "without_namespace",
        "action",
        "older_than",
        "limit",
        "after",
    ];

    pub(super) fn read(params: &Params) -> Result<ListParams, BadParam> {
        // An empty value is no filter: what a form's empty field sends.
        let given = |name| params.get(name).filter(|v| !v.is_empty());
        let text = |name| {
            params
                .text(name)
                .map(|text| text.filter(|v: &String| !v.is_empty()))
        };
        let state = given("state")
            .map(|s| {
                ClaimState::parse(s).ok_or_else(|| {
                    BadParam(format!(
                        "state \"{}\" is not one: pending, in_doubt, success or failed",
                        shown(s)
                    ))
                })
            })
            .transpose()?;
        let without_namespace = match given("without_namespace") {
            None | Some("0") => false,
            Some("1") => true,
            Some(other) => {
                return Err(BadParam(format!(
                    "without_namespace is 1 or 0, not \"{}\"",
                    shown(other)
                )));
            }
        };
        // The namespace is a filter only when given non-empty; the empty
        // namespace is a namespace too, but a form's empty box is not it.
        let namespace = text("namespace")?;
        if without_namespace && namespace.is_some() {
            return Err(BadParam(
                "give either namespace or without_namespace=1, not both".into(),
            ));
        }
        let older_than = text("older_than")?
            .map(|t| parse_duration(&t).map(|d| (t, d)).map_err(BadParam))
            .transpose()?;
        let limit = match given("limit") {
            None => 50,
            Some(l) => l
                .parse::<u32>()
                .ok()
                .filter(|l| (1..=BrowseFilter::MAX_LIMIT).contains(l))
                .ok_or_else(|| {
                    BadParam(format!(
                        "limit is a number from 1 to {}, not \"{}\"",
                        BrowseFilter::MAX_LIMIT,
                        shown(l)
                    ))
                })?,
        };
        let after = given("after").map(decode_cursor).transpose()?;
        Ok(ListParams {
            state,
            account: text("account")?,
            namespace,
            without_namespace,
            action: text("action")?,
            older_than,
            limit,
            after,
        })
    }

    pub(super) fn filter(&self) -> BrowseFilter<'_> {
        let namespace = match (&self.namespace, self.without_namespace) {
            (Some(name), _) => NamespaceFilter::Named(name),
            (None, true) => NamespaceFilter::Without,
            (None, false) => NamespaceFilter::Any,
        };
        BrowseFilter::new()
            .scope(
                ScopeFilter::new()
                    .account(self.account.as_deref())
                    .namespace(namespace),
            )
            .state(self.state)
            .action(self.action.as_deref())
            .older_than(self.older_than.as_ref().map(|(_, d)| *d))
            .after(self.after.as_ref())
            .limit(self.limit)
    }

    /// The query of this list with `after` (the next page), or of the
    /// first page when `after` is `None`.
    pub(super) fn query(&self, after: Option<&PageCursor>) -> String {
        let limit = (self.limit != 50).then(|| self.limit.to_string());
        let after = after.map(encode_cursor);
        query(&[
            ("state", self.state.map(ClaimState::as_str)),
            ("account", self.account.as_deref()),
            ("namespace", self.namespace.as_deref()),
            ("without_namespace", self.without_namespace.then_some("1")),
            ("action", self.action.as_deref()),
            (
                "older_than",
                self.older_than.as_ref().map(|(t, _)| t.as_str()),
            ),
            ("limit", limit.as_deref()),
            ("after", after.as_deref()),
        ])
    }
}

/// The instants a cursor may name, in microseconds since the Unix epoch:
/// the years 0001 to 9999, well inside PostgreSQL's `timestamptz` (a
/// cursor beyond them can only be damaged, and the statement would fail).
const CURSOR_MICROS: std::ops::RangeInclusive<i64> =
    -62_135_596_800_000_000..=253_402_300_799_999_999;

/// `MICROS.ACCOUNT.ADDRESS.NAMESPACE`: the account and namespace in hex
/// (any text survives), the namespace `-` for none.
fn encode_cursor(cursor: &PageCursor) -> String {
    format!(
        "{}.{}.{}.{}",
        cursor.created_micros,
        hex(cursor.account.as_bytes()),
        cursor.address,
        cursor
            .namespace
            .as_deref()
            .map_or_else(|| "-".to_owned(), |n| format!("n{}", hex(n.as_bytes())))
    )
}

fn decode_cursor(text: &str) -> Result<PageCursor, BadParam> {
    let damaged = || {
        BadParam(
            "the page's cursor (after) is damaged: go back to the first page of the list".into(),
        )
    };
    let mut fields = text.split('.');
    let (Some(micros), Some(account), Some(address), Some(namespace), None) = (
        fields.next(),
        fields.next(),
        fields.next(),
        fields.next(),
        fields.next(),
    ) else {
        return Err(damaged());
    };
    let utf8 = |hex: &str| {
        unhex(hex)
            .and_then(|bytes| String::from_utf8(bytes).ok())
            .filter(|text| !text.contains('\0'))
    };
    check_address(address).map_err(|_| damaged())?;
    let created_micros: i64 = micros.parse().map_err(|_| damaged())?;
    if !CURSOR_MICROS.contains(&created_micros) {
        return Err(damaged());
    }
    Ok(PageCursor {
        created_micros,
        account: utf8(account).ok_or_else(damaged)?,
        address: address.to_owned(),
        namespace: match namespace {
            "-" => None,
            n => Some(n.strip_prefix('n').and_then(utf8).ok_or_else(damaged)?),
        },
    })
}

/// The resolutions a page offers, by their parameter's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Asked {
    Succeeded,
    Failed,
    Release,
}

impl Asked {
    pub(super) fn read(params: &Params) -> Result<Asked, BadParam> {
        match params.required("as")? {
            "succeeded" => Ok(Asked::Succeeded),
            "failed" => Ok(Asked::Failed),
            "release" => Ok(Asked::Release),
            other => Err(BadParam(format!(
                "as is succeeded, failed or release, not \"{}\"",
                text::shown(other)
            ))),
        }
    }

    pub(super) fn as_str(self) -> &'static str {
        match self {
            Asked::Succeeded => "succeeded",
            Asked::Failed => "failed",
            Asked::Release => "release",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_and_repeated_parameters_are_refused() {
        let known = ListParams::NAMES;
        assert!(Params::parse(Some("stat=in_doubt"), known).is_err());
        assert!(Params::parse(Some("state=a&state=b"), known).is_err());
        let params = Params::parse(Some("state=in_doubt&account=a%26b"), known).unwrap();
        let list = ListParams::read(&params).unwrap();
        assert_eq!(list.state, Some(ClaimState::InDoubt));
        assert_eq!(list.account.as_deref(), Some("a&b"));
    }

    #[test]
    fn cursors_round_trip_any_text_and_refuse_damage() {
        for namespace in [None, Some(""), Some("a.b\u{202e}<x>")] {
            let cursor = PageCursor {
                created_micros: -5,
                account: "acme.\u{1}\"".into(),
                address: "claim_0123".into(),
                namespace: namespace.map(str::to_owned),
            };
            assert_eq!(decode_cursor(&encode_cursor(&cursor)), Ok(cursor));
        }
        // A NUL no name can hold, and an instant beyond any timestamp.
        let nul = format!("1.{}.claim_1.-", hex(b"a\0"));
        assert!(decode_cursor(&nul).is_err());
        assert!(decode_cursor(&format!("{}.61.claim_1.-", i64::MAX)).is_err());
        for bad in [
            "",
            "1.2.3",
            "x.61.claim_1.-",
            "1.6.claim_1.-",
            "1.61.CLAIM.-",
            "1.61.claim_1.zz",
        ] {
            assert!(decode_cursor(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_list_s_link_keeps_its_filters() {
        let params = Params::parse(
            Some("state=failed&namespace=live&older_than=2h&limit=10"),
            ListParams::NAMES,
        )
        .unwrap();
        let list = ListParams::read(&params).unwrap();
        let again =
            ListParams::read(&Params::parse(Some(&list.query(None)), ListParams::NAMES).unwrap())
                .unwrap();
        assert_eq!(again, list);
    }

    #[test]
    fn names_travel_as_shown_and_read_back_as_themselves() {
        let name = "a\\b\u{202e}c\u{1b}[2J\u{61c}";
        let list = ListParams {
            account: Some(name.to_owned()),
            namespace: Some(format!("{name}ns")),
            action: Some(format!("{name}act")),
            limit: 50,
            ..ListParams::default()
        };
        let written = list.query(None);
        let decoded: Vec<(String, String)> = serde_urlencoded::from_str(&written).unwrap();
        assert!(
            decoded
                .iter()
                .all(|(_, v)| !v.chars().any(idem_runtime::shown::is_escaped)),
            "{decoded:?}"
        );
        assert!(decoded.contains(&("account".into(), r"a\\b\u{202e}c\u{1b}[2J\u{61c}".into())));
        let again =
            ListParams::read(&Params::parse(Some(&written), ListParams::NAMES).unwrap()).unwrap();
        assert_eq!(again.account.as_deref(), Some(name));
        assert_eq!(again, list);
        // A hidden character written as it is reads as itself; a stray
        // backslash is refused, saying how to write one.
        let raw = ListParams::read(
            &Params::parse(Some("account=a%E2%80%AE"), ListParams::NAMES).unwrap(),
        )
        .unwrap();
        assert_eq!(raw.account.as_deref(), Some("a\u{202e}"));
        let stray = ListParams::read(
            &Params::parse(Some("account=C%3A%5Ctemp"), ListParams::NAMES).unwrap(),
        )
        .unwrap_err();
        assert!(stray.0.contains(r"written \\"), "{}", stray.0);
        let nul = ListParams::read(
            &Params::parse(Some(r"account=a%5Cu%7B0%7D"), ListParams::NAMES).unwrap(),
        )
        .unwrap_err();
        assert!(nul.0.contains("NUL"), "{}", nul.0);
    }
}
