//! `idem claims list | show | release` and `idem prune`: reading and
//! deleting claim rows (`kind = 'claim'`) in `idem_records`.
//!
//! Only two deletions exist, each guarded in its own `WHERE`: `release`
//! deletes one claim only while it is `pending`, and `prune` deletes only
//! `success` claims settled before a given instant. Both refuse to run without
//! `--yes` and then say what they would delete.

mod render;

use jiff::Timestamp;
use serde::Serialize;
use sqlx::{PgPool, Row};

use crate::error::CliError;
use crate::timestamps;

pub use render::{render_claim, render_list, render_pruned, render_released};

/// Which claims, by account and namespace.
#[derive(Debug, Clone, Copy)]
pub struct Scope<'a> {
    /// Only this account.
    pub account: Option<&'a str>,
    /// Which namespaces.
    pub namespace: NamespaceFilter<'a>,
}

/// A filter on the namespace column, which is NULL for most claims.
#[derive(Debug, Clone, Copy)]
pub enum NamespaceFilter<'a> {
    /// Any namespace, or none.
    Any,
    /// Only claims without a namespace.
    Without,
    /// Only this namespace.
    Named(&'a str),
}

impl NamespaceFilter<'_> {
    /// The three query parameters: the name, and whether to require NULL.
    fn params(&self) -> (Option<&str>, bool) {
        match self {
            NamespaceFilter::Any => (None, false),
            NamespaceFilter::Without => (None, true),
            NamespaceFilter::Named(name) => (Some(name), false),
        }
    }
}

/// What `claims list` selects.
#[derive(Debug, Clone, Copy)]
pub struct ListFilter<'a> {
    /// Account and namespace.
    pub scope: Scope<'a>,
    /// `pending` or `success`.
    pub state: Option<&'a str>,
    /// Created longer ago than this many seconds.
    pub older_than_seconds: Option<f64>,
    /// At most this many.
    pub limit: u32,
}

/// One claim row.
#[derive(Debug, Clone)]
pub struct ClaimRow {
    /// Tenant scope.
    pub account: String,
    /// Narrower scope, usually none.
    pub namespace: Option<String>,
    /// Always `claim` here.
    pub kind: String,
    /// `claim_` + 24 hex digits.
    pub address: String,
    /// `pending` or `success`.
    pub state: String,
    /// The canonical identity encoding.
    pub identity: Vec<u8>,
    /// `created_at`, in microseconds since the epoch.
    pub created_micros: i64,
    /// `settled_at`, in microseconds since the epoch.
    pub settled_micros: Option<i64>,
    /// Seconds since `created_at`, by the database's clock.
    pub age_seconds: i64,
    /// Every other column of the row (later schema versions add some), as
    /// PostgreSQL renders it in JSON.
    pub other_columns: serde_json::Map<String, serde_json::Value>,
}

/// The select list for [`ClaimRow`], over `idem_records r`.
macro_rules! claim_columns {
    () => {
        "r.account, r.namespace, r.kind, r.address, r.state, r.identity,
         floor(extract(epoch FROM r.created_at) * 1000000)::int8 AS created_micros,
         floor(extract(epoch FROM r.settled_at) * 1000000)::int8 AS settled_micros,
         floor(extract(epoch FROM now() - r.created_at))::int8 AS age_seconds,
         (to_jsonb(r) - ARRAY['account', 'namespace', 'kind', 'address', 'state', 'identity',
                              'created_at', 'settled_at'])::text AS other_columns"
    };
}

const LIST: &str = concat!(
    "SELECT ",
    claim_columns!(),
    " FROM idem_records r
      WHERE r.kind = 'claim'
        AND ($1::text IS NULL OR r.account = $1)
        AND ($2::text IS NULL OR r.namespace = $2)
        AND (NOT $3::bool OR r.namespace IS NULL)
        AND ($4::text IS NULL OR r.state = $4)
        AND ($5::float8 IS NULL OR r.created_at < now() - make_interval(secs => $5::float8))
      ORDER BY r.created_at DESC, r.account, r.namespace NULLS FIRST, r.address
      LIMIT $6"
);

const BY_ADDRESS: &str = concat!(
    "SELECT ",
    claim_columns!(),
    " FROM idem_records r
      WHERE r.kind = 'claim' AND r.address = $1
        AND ($2::text IS NULL OR r.account = $2)
        AND ($3::text IS NULL OR r.namespace = $3)
        AND (NOT $4::bool OR r.namespace IS NULL)
      ORDER BY r.account, r.namespace NULLS FIRST"
);

/// Deletes the claim only if it is still pending: it may have settled since
/// it was read.
const RELEASE: &str = concat!(
    "DELETE FROM idem_records r
      WHERE r.kind = 'claim' AND r.address = $1 AND r.account = $2
        AND r.namespace IS NOT DISTINCT FROM $3 AND r.state = 'pending'
      RETURNING ",
    claim_columns!()
);

const COUNT_SETTLED: &str = "SELECT count(*) FROM idem_records \
     WHERE kind = 'claim' AND state = 'success' AND settled_at < $1::timestamptz \
       AND ($2::text IS NULL OR account = $2)";

const PRUNE_SETTLED: &str = "DELETE FROM idem_records \
     WHERE kind = 'claim' AND state = 'success' AND settled_at < $1::timestamptz \
       AND ($2::text IS NULL OR account = $2)";

fn claim_row(row: &sqlx::postgres::PgRow) -> Result<ClaimRow, sqlx::Error> {
    let other: String = row.try_get("other_columns")?;
    let other_columns = match serde_json::from_str(&other) {
        Ok(serde_json::Value::Object(map)) => map,
        _ => serde_json::Map::new(),
    };
    Ok(ClaimRow {
        account: row.try_get("account")?,
        namespace: row.try_get("namespace")?,
        kind: row.try_get("kind")?,
        address: row.try_get("address")?,
        state: row.try_get("state")?,
        identity: row.try_get("identity")?,
        created_micros: row.try_get("created_micros")?,
        settled_micros: row.try_get("settled_micros")?,
        age_seconds: row.try_get("age_seconds")?,
        other_columns,
    })
}

/// Fails, saying what to do, when `idem_records` is not on the search path.
pub async fn ensure_table(pool: &PgPool) -> Result<(), CliError> {
    let (table, search_path): (Option<String>, String) =
        sqlx::query_as("SELECT to_regclass('idem_records')::text, current_setting('search_path')")
            .fetch_one(pool)
            .await
            .map_err(CliError::database("look for idem_records"))?;
    match table {
        Some(_) => Ok(()),
        None => Err(CliError::Usage(format!(
            "there is no idem_records table on the search_path ({search_path}): run \
             `idem migrate` to create it, or pass --schema with the schema that holds it"
        ))),
    }
}

/// Refuses text that cannot be a claim address, before asking the database.
pub fn check_address(address: &str) -> Result<(), CliError> {
    let valid = !address.is_empty()
        && address
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if valid {
        Ok(())
    } else {
        Err(CliError::Usage(format!(
            "{address:?} is not a claim address: addresses are claim_ followed by 24 lowercase \
             hex digits; `idem claims list` shows them"
        )))
    }
}

/// Claims matching `filter`, newest first.
pub async fn list(pool: &PgPool, filter: &ListFilter<'_>) -> Result<Vec<ClaimRow>, CliError> {
    let (namespace, without_namespace) = filter.scope.namespace.params();
    let rows = sqlx::query(LIST)
        .bind(filter.scope.account)
        .bind(namespace)
        .bind(without_namespace)
        .bind(filter.state)
        .bind(filter.older_than_seconds)
        .bind(i64::from(filter.limit))
        .fetch_all(pool)
        .await
        .map_err(CliError::database("list the claims"))?;
    rows.iter()
        .map(claim_row)
        .collect::<Result<_, _>>()
        .map_err(CliError::database("read the claims"))
}

/// The one claim at `address` in `scope`: an error when there is none, or
/// when the address is claimed in several scopes and `scope` does not say
/// which.
pub async fn find(pool: &PgPool, address: &str, scope: &Scope<'_>) -> Result<ClaimRow, CliError> {
    let (namespace, without_namespace) = scope.namespace.params();
    let rows = sqlx::query(BY_ADDRESS)
        .bind(address)
        .bind(scope.account)
        .bind(namespace)
        .bind(without_namespace)
        .fetch_all(pool)
        .await
        .map_err(CliError::database("look up the claim"))?;
    let mut claims: Vec<ClaimRow> = rows
        .iter()
        .map(claim_row)
        .collect::<Result<_, _>>()
        .map_err(CliError::database("read the claim"))?;
    match claims.len() {
        0 => Err(CliError::NotFound(format!(
            "no claim has address {address}{}; `idem claims list` shows the claims there are",
            match (scope.account, scope.namespace) {
                (None, NamespaceFilter::Any) => String::new(),
                (account, namespace) => format!(" in {}", describe_filter(account, namespace)),
            }
        ))),
        1 => Ok(claims.remove(0)),
        n => {
            let scopes: Vec<String> = claims
                .iter()
                .map(|c| format!("  {}", describe_scope(&c.account, c.namespace.as_deref())))
                .collect();
            Err(CliError::Usage(format!(
                "address {address} is claimed in {n} scopes:\n{}\nsay which with --account and \
                 --namespace NAME (or --no-namespace)",
                scopes.join("\n")
            )))
        }
    }
}

/// Releases the pending claim at `address` in `scope`, after `yes`.
pub async fn release(
    pool: &PgPool,
    address: &str,
    scope: &Scope<'_>,
    yes: bool,
) -> Result<ClaimRow, CliError> {
    let claim = find(pool, address, scope).await?;
    let what = format!(
        "claim {} ({}): {}, created {} ago",
        claim.address,
        describe_scope(&claim.account, claim.namespace.as_deref()),
        render::summary(&claim),
        timestamps::age(claim.age_seconds),
    );
    if claim.state != "pending" {
        return Err(CliError::Refused(format!(
            "{what}: it is settled ({}{}), and idem never releases a settled claim, because a \
             retry would then run its action a second time. To forget settled claims, see \
             `idem prune`.",
            claim.state,
            claim
                .settled_micros
                .map(|m| format!(" since {}", timestamps::instant_to_second(m)))
                .unwrap_or_default(),
        )));
    }
    if !yes {
        return Err(CliError::NeedsConfirmation(format!(
            "would release pending {what}.\nReleasing lets the next retry run the action again: \
             do it only when the invocation holding the claim is gone (crashed, killed, \
             cancelled). Re-run with --yes to release it."
        )));
    }
    let released = sqlx::query(RELEASE)
        .bind(&claim.address)
        .bind(&claim.account)
        .bind(&claim.namespace)
        .fetch_optional(pool)
        .await
        .map_err(CliError::database("release the claim"))?;
    match released {
        Some(row) => claim_row(&row).map_err(CliError::database("read the released claim")),
        None => Err(CliError::Refused(format!(
            "{what}, changed while we looked (it settled, or was released): nothing released; \
             `idem claims show {}` shows it now",
            claim.address
        ))),
    }
}

/// How many settled claims `prune` removed (or would remove).
#[derive(Debug, Serialize)]
pub struct Pruned {
    /// Claims deleted.
    pub deleted: u64,
    /// The cut-off, RFC 3339 in UTC.
    pub settled_before: String,
    /// The account pruned, or null for all.
    pub account: Option<String>,
}

/// Deletes claims settled before `before` (in `account`, if given), after
/// `yes`; without it, fails with the count it would delete.
pub async fn prune(
    pool: &PgPool,
    before: Timestamp,
    account: Option<&str>,
    yes: bool,
) -> Result<Pruned, CliError> {
    let before_text = before.to_string();
    let within = match account {
        Some(account) => format!("in account {account}"),
        None => "in every account".to_owned(),
    };
    if !yes {
        let count: i64 = sqlx::query_scalar(COUNT_SETTLED)
            .bind(&before_text)
            .bind(account)
            .fetch_one(pool)
            .await
            .map_err(CliError::database("count the settled claims"))?;
        return Err(CliError::NeedsConfirmation(format!(
            "would delete {count} settled claim{} (settled before {before_text}, {within}).\n\
             A retry of a pruned action runs it again: prune only what can no longer be retried. \
             Re-run with --yes to delete them.",
            if count == 1 { "" } else { "s" }
        )));
    }
    let deleted = sqlx::query(PRUNE_SETTLED)
        .bind(&before_text)
        .bind(account)
        .execute(pool)
        .await
        .map_err(CliError::database("delete the settled claims"))?
        .rows_affected();
    Ok(Pruned {
        deleted,
        settled_before: before_text,
        account: account.map(str::to_owned),
    })
}

/// "account acme, no namespace" / "account acme, namespace live".
pub(crate) fn describe_scope(account: &str, namespace: Option<&str>) -> String {
    match namespace {
        Some(namespace) => format!("account {account}, namespace {namespace}"),
        None => format!("account {account}, no namespace"),
    }
}

fn describe_filter(account: Option<&str>, namespace: NamespaceFilter<'_>) -> String {
    let account = account.map_or_else(|| "any account".to_owned(), |a| format!("account {a}"));
    match namespace {
        NamespaceFilter::Any => account,
        NamespaceFilter::Without => format!("{account}, no namespace"),
        NamespaceFilter::Named(n) => format!("{account}, namespace {n}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_checked_before_any_query() {
        assert!(check_address("claim_0123456789abcdef01234567").is_ok());
        for bad in ["", "Claim_X", "claim-1", "claim_1; DROP TABLE x"] {
            assert!(check_address(bad).is_err(), "{bad}");
        }
    }
}
