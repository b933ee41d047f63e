//! How claims look: the decoded identity, text tables and blocks, JSON.
//!
//! JSON objects for a claim have the same fields everywhere (`list`, `show`
//! (which adds `steps`: each step's `address`, `state`, `fence`,
//! `created_at`, `settled_at`, `output_bytes`, the size of its value, and
//! `released_at`, when its claim was last released),
//! `release`, and `claim` in `resolve`): `account`, `namespace`, `address`,
//! `state`, `state_reason`, `fence`, `created_at`, `age_seconds`,
//! `settled_at` (RFC 3339, UTC), `action`, `identity` (its `Debug`, long
//! parts abbreviated), `identity_hex`, `address_matches_identity`, and
//! `other_columns` (every column beyond the first eight, `fence` and
//! `state_reason` included, as PostgreSQL renders it in JSON).

use idem_runtime::Identity;
use idem_runtime::shown;
use serde::Serialize;

use idem_runtime::operations::{ClaimState, ClaimStep};

use super::{ClaimRow, ResolvedClaim, describe_scope};
use crate::error::CliError;
use crate::output::{self, Format};
use crate::timestamps;

/// `claim claim_… (account acme, no namespace): charge ["ord_1", 4999],
/// created 2h00m ago`: which claim, for the one line that says what was (or
/// would be) done to it.
pub fn describe_claim(claim: &ClaimRow) -> String {
    format!(
        "claim {} ({}): {}, created {} ago",
        claim.address,
        describe_scope(&claim.account, claim.namespace.as_deref()),
        Decoded::of(claim).summary(),
        timestamps::age(claim.age_seconds),
    )
}

/// A claim's identity, read back with [`Identity::from_canonical`].
#[derive(Debug, Clone)]
struct Decoded {
    /// The action, when the identity is canonical.
    action: Option<String>,
    /// The identity's `Debug` (long parts abbreviated), or why it is not one.
    identity: String,
    /// The address is the digest of the stored identity, as idem writes it.
    address_matches: bool,
}

impl Decoded {
    fn of(claim: &ClaimRow) -> Decoded {
        match Identity::from_canonical(&claim.identity) {
            Ok(identity) => Decoded {
                action: Some(identity.action().to_owned()),
                identity: format!("{identity:?}"),
                address_matches: identity.address() == claim.address,
            },
            Err(error) => Decoded {
                action: None,
                identity: format!("<{error}; {} bytes>", claim.identity.len()),
                address_matches: false,
            },
        }
    }

    /// `charge ["ord_1", 4999]`: the action and the `parts` list of the
    /// identity's `Debug`, or the whole `Debug` if it does not have that
    /// shape.
    fn summary(&self) -> String {
        let Some(action) = &self.action else {
            return self.identity.clone();
        };
        let parts = self
            .identity
            .split_once("parts: ")
            .and_then(|(_, rest)| rest.rsplit_once(", absent: "))
            .map(|(parts, _)| parts);
        let action = output::name(action);
        match parts {
            Some(parts) => format!("{action} {parts}"),
            None => self.identity.clone(),
        }
    }
}

/// A claim for JSON output; the same fields everywhere.
#[derive(Debug, Serialize)]
struct ClaimJson<'a> {
    account: &'a str,
    namespace: Option<&'a str>,
    address: &'a str,
    state: &'a str,
    state_reason: Option<&'a str>,
    fence: i64,
    created_at: String,
    age_seconds: i64,
    settled_at: Option<String>,
    action: Option<&'a str>,
    identity: &'a str,
    identity_hex: String,
    address_matches_identity: bool,
    other_columns: &'a serde_json::Map<String, serde_json::Value>,
}

fn to_json<'a>(claim: &'a ClaimRow, decoded: &'a Decoded) -> ClaimJson<'a> {
    ClaimJson {
        account: &claim.account,
        namespace: claim.namespace.as_deref(),
        address: &claim.address,
        state: claim.state.as_str(),
        state_reason: claim.state_reason.as_deref(),
        fence: claim.fence,
        created_at: timestamps::instant(claim.created_micros),
        age_seconds: claim.age_seconds,
        settled_at: claim.settled_micros.map(timestamps::instant),
        action: decoded.action.as_deref(),
        identity: &decoded.identity,
        identity_hex: hex(&claim.identity),
        address_matches_identity: decoded.address_matches,
        other_columns: &claim.other_columns,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The identity column of `claims list` keeps to this many characters.
const IDENTITY_WIDTH: usize = 60;

/// `claims list` output.
pub fn render_list(claims: &[ClaimRow], format: Format) -> Result<String, CliError> {
    let decoded: Vec<Decoded> = claims.iter().map(Decoded::of).collect();
    match format {
        Format::Json => {
            let items: Vec<ClaimJson<'_>> = claims
                .iter()
                .zip(&decoded)
                .map(|(c, d)| to_json(c, d))
                .collect();
            output::json(&items)
        }
        Format::Text if claims.is_empty() => Ok("no claims match\n".to_owned()),
        Format::Text => {
            let rows: Vec<Vec<String>> = claims
                .iter()
                .zip(&decoded)
                .map(|(c, d)| {
                    vec![
                        output::name(&c.account),
                        c.namespace
                            .as_deref()
                            .map_or_else(|| "-".to_owned(), output::name),
                        c.address.clone(),
                        c.state.to_string(),
                        timestamps::age(c.age_seconds),
                        c.settled_micros
                            .map_or_else(|| "-".to_owned(), timestamps::instant_to_second),
                        output::truncate(&d.summary(), IDENTITY_WIDTH),
                    ]
                })
                .collect();
            Ok(output::table(
                &[
                    "ACCOUNT",
                    "NAMESPACE",
                    "ADDRESS",
                    "STATE",
                    "AGE",
                    "SETTLED",
                    "IDENTITY",
                ],
                &rows,
            ))
        }
    }
}

/// `claims list --count` output: the number, or `{"count": N}`.
pub fn render_count(count: u64, format: Format) -> Result<String, CliError> {
    match format {
        Format::Json => output::json(&serde_json::json!({ "count": count })),
        Format::Text => Ok(format!("{count}\n")),
    }
}

/// A claim's step for JSON output: where it is and what it says, and the
/// size of its value rather than the value.
#[derive(Debug, Serialize)]
struct StepJson<'a> {
    /// The step's name; `null` when its row's identity does not read back.
    name: Option<&'a str>,
    address: &'a str,
    state: &'static str,
    fence: i64,
    created_at: String,
    settled_at: Option<String>,
    output_bytes: Option<i64>,
    /// When its claim was last released; `null` when never.
    released_at: Option<String>,
}

/// `claims show` as JSON: the claim's fields, as everywhere, and its steps.
#[derive(Debug, Serialize)]
struct ShownJson<'a> {
    #[serde(flatten)]
    claim: ClaimJson<'a>,
    steps: Vec<StepJson<'a>>,
}

/// The steps block of `claims show`: a line each, in the order they were
/// begun, or a line saying there are none.
fn render_steps(steps: &[ClaimStep]) -> String {
    if steps.is_empty() {
        return "steps:            none\n".to_owned();
    }
    let mut shown = format!("steps:            {}\n", steps.len());
    for step in steps {
        // The name is the body's text, perhaps made from a request's:
        // quoted and escaped, so it can never pass for another field.
        let name = step.name.as_deref().map_or_else(
            || "(unreadable)".to_owned(),
            |name| shown::escaped_rendering(&format!("{name:?}")).into_owned(),
        );
        // Its claim's release, only when there was one: what keeps a
        // recorded step of a claim that is gone from prune.
        let released = step.released_micros.map_or_else(String::new, |micros| {
            format!("  released {}", timestamps::instant(micros))
        });
        shown.push_str(&format!(
            "  {name}  {}  {:<7}  fence {}  begun {}  recorded {}  {}{released}\n",
            step.address,
            step.state.as_str(),
            step.fence,
            timestamps::instant(step.created_micros),
            step.settled_micros
                .map_or_else(|| "-".to_owned(), timestamps::instant),
            step.output_bytes.map_or_else(
                || "no value".to_owned(),
                |bytes| format!("value {bytes} bytes")
            ),
        ));
    }
    shown
}

/// `claims show` output: every field of the row, then its steps.
pub fn render_claim(
    claim: &ClaimRow,
    steps: &[ClaimStep],
    format: Format,
) -> Result<String, CliError> {
    let decoded = Decoded::of(claim);
    if format == Format::Json {
        return output::json(&ShownJson {
            claim: to_json(claim, &decoded),
            steps: steps
                .iter()
                .map(|step| StepJson {
                    name: step.name.as_deref(),
                    address: &step.address,
                    state: step.state.as_str(),
                    fence: step.fence,
                    created_at: timestamps::instant(step.created_micros),
                    settled_at: step.settled_micros.map(timestamps::instant),
                    output_bytes: step.output_bytes,
                    released_at: step.released_micros.map(timestamps::instant),
                })
                .collect(),
        });
    }
    // Text of the row as the command shows a name (output::name); the
    // identity as its `Debug` renders it. Every value is then made one line
    // free of hidden characters below.
    let mut fields: Vec<(String, String)> = vec![
        ("address".into(), output::name(&claim.address)),
        ("account".into(), output::name(&claim.account)),
        (
            "namespace".into(),
            claim
                .namespace
                .as_deref()
                .map_or_else(|| "(none)".into(), output::name),
        ),
        ("kind".into(), output::name(&claim.kind)),
        ("state".into(), claim.state.to_string()),
        (
            "state_reason".into(),
            claim
                .state_reason
                .as_deref()
                .map_or_else(|| "-".into(), output::name),
        ),
        ("fence".into(), claim.fence.to_string()),
        (
            "created_at".into(),
            format!(
                "{} ({} ago){}",
                timestamps::instant(claim.created_micros),
                timestamps::age(claim.age_seconds),
                // A compacted row keeps no creation time; the store reads
                // its settle time for it.
                if idem_runtime::operations::is_compacted(&claim.identity) {
                    ", its settle: a compacted claim keeps no creation time"
                } else {
                    ""
                }
            ),
        ),
        (
            "settled_at".into(),
            claim
                .settled_micros
                .map_or_else(|| "-".to_owned(), timestamps::instant),
        ),
        (
            "action".into(),
            decoded
                .action
                .as_deref()
                .map_or_else(|| "-".into(), output::name),
        ),
        ("identity".into(), decoded.identity.clone()),
        ("identity_hex".into(), hex(&claim.identity)),
        (
            "address_check".into(),
            if decoded.address_matches {
                "the address is the digest of the identity".into()
            } else if idem_runtime::operations::is_compacted(&claim.identity) {
                "compacted past its value's window: the identity is a check of 8 bytes, \
                 which still refuses its duplicates"
                    .into()
            } else {
                "MISMATCH: the address is not the digest of the stored identity \
                 (the row was not written by this idem)"
                    .into()
            },
        ),
    ];
    for (name, value) in &claim.other_columns {
        if fields.iter().any(|(shown, _)| shown == name) {
            continue;
        }
        let shown = match value {
            serde_json::Value::Null => "-".to_owned(),
            serde_json::Value::String(text) => output::name(text),
            other => other.to_string(),
        };
        fields.push((output::name(name), shown));
    }
    let width = fields.iter().map(|(n, _)| n.len()).max().unwrap_or(0) + 1;
    let mut shown: String = fields
        .iter()
        .map(|(name, value)| {
            let value = shown::escaped_rendering(value);
            format!("{:<width$} {value}\n", format!("{name}:"))
        })
        .collect();
    shown.push_str(&render_steps(steps));
    Ok(shown)
}

/// `claims release` output.
pub fn render_released(claim: &ClaimRow, format: Format) -> Result<String, CliError> {
    match format {
        Format::Json => output::json(&to_json(claim, &Decoded::of(claim))),
        Format::Text => Ok(format!("released pending {}\n", describe_claim(claim))),
    }
}

/// A resolution for JSON output.
#[derive(Debug, Serialize)]
struct ResolvedJson<'a> {
    /// `succeeded`, `failed` or `released`.
    resolution: &'static str,
    state_before: &'a str,
    /// `null`: released (deleted).
    state_after: Option<&'static str>,
    /// The claim as it was just before.
    claim: ClaimJson<'a>,
}

/// `claims resolve` output.
pub fn render_resolved(resolved: &ResolvedClaim, format: Format) -> Result<String, CliError> {
    let claim = &resolved.before;
    let resolution = match resolved.after {
        Some(ClaimState::Success) => "succeeded",
        Some(ClaimState::Failed) => "failed",
        None => "released",
        Some(other) => other.as_str(),
    };
    match format {
        Format::Json => output::json(&ResolvedJson {
            resolution,
            state_before: claim.state.as_str(),
            state_after: resolved.after.map(ClaimState::as_str),
            claim: to_json(claim, &Decoded::of(claim)),
        }),
        Format::Text => Ok(format!(
            "resolved {} {}: {}\n{RESOLVED_AND_CACHES}\n",
            claim.state,
            describe_claim(claim),
            match resolved.after {
                Some(ClaimState::Success) => "now success; retries get its outcome",
                Some(ClaimState::Failed) => "now failed; retries are refused",
                None => "released; the next retry runs the action",
                Some(_) => "changed",
            },
        )),
    }
}

/// What a resolution means for them: they never hold a claim pending or in
/// doubt, the only ones a resolution changes.
pub const RESOLVED_AND_CACHES: &str = "Gates with a local outcome cache never hold a claim \
     pending or in doubt: they see this resolution at their next call.";

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(identity: &Identity) -> ClaimRow {
        ClaimRow {
            account: "acme".into(),
            namespace: None,
            kind: "claim".into(),
            address: identity.address(),
            state: ClaimState::Pending,
            identity: identity.canonical().to_vec(),
            created_micros: 1_714_564_800_000_000,
            settled_micros: None,
            age_seconds: 192,
            fence: 7,
            state_reason: None,
            other_columns: serde_json::Map::new(),
        }
    }

    #[test]
    fn identities_are_summarised_as_action_and_parts() {
        let id = Identity::new("charge").part("ord_1").part(4_999);
        let decoded = Decoded::of(&claim(&id));
        assert_eq!(decoded.summary(), r#"charge ["ord_1", 4999]"#);
        assert!(decoded.address_matches);
    }

    #[test]
    fn garbage_identities_say_so_and_fail_the_address_check() {
        let mut row = claim(&Identity::new("x"));
        row.identity = b"nope".to_vec();
        let decoded = Decoded::of(&row);
        assert!(
            decoded
                .identity
                .starts_with("<not a canonical idem identity")
        );
        assert!(!decoded.address_matches);
        assert_eq!(decoded.summary(), decoded.identity);
    }

    #[test]
    fn the_list_is_a_table_with_one_row_per_claim() {
        let id = Identity::new("charge").part("ord_1");
        let shown = render_list(&[claim(&id)], Format::Text).unwrap_or_default();
        let lines: Vec<&str> = shown.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with("ACCOUNT  NAMESPACE  ADDRESS"));
        assert!(lines[1].starts_with("acme     -          claim_"));
        assert!(
            lines[1].ends_with(r#"pending  3m12s  -        charge ["ord_1"]"#),
            "{}",
            lines[1]
        );
    }

    #[test]
    fn show_aligns_every_field_including_columns_from_later_schemas() {
        let mut row = claim(&Identity::new("charge").part(1));
        row.other_columns
            .insert("fence".into(), serde_json::Value::from(7));
        row.other_columns
            .insert("lease_expires_at".into(), serde_json::Value::Null);
        let shown = render_claim(&row, &[], Format::Text).unwrap_or_default();
        assert!(shown.contains("\nstate:            pending\n"), "{shown}");
        assert!(shown.contains("\nfence:            7\n"), "{shown}");
        assert_eq!(shown.matches("\nfence:").count(), 1, "{shown}");
        assert!(shown.contains("\nstate_reason:     -\n"), "{shown}");
        assert!(shown.contains("\nlease_expires_at: -\n"), "{shown}");
        assert!(shown.contains("created_at:       2024-05-01T12:00:00Z (3m12s ago)"));
    }
}
