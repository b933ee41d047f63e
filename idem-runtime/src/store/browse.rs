//! What the operator console reads (`idem::console`): the open claims
//! counted by account, state and action; a page of claims after a keyset
//! cursor; one claim described, its stored values only when asked.
//!
//! Nothing here writes: the console's writes are [`operations::resolve_as`](crate::operations::resolve_as)
//! (super::operations::resolve_as), as the CLI's are.
//!
//! # Two orders, each served by an index
//!
//! A page never skips rows with `OFFSET`: it starts after the last row of
//! the page before, in one of two orders, each of which an index returns
//! already sorted, so a page costs its own rows however deep it is.
//! - **Oldest first**, for a list of one open state (`pending`,
//!   `in_doubt`, `failed`): `(created_at, account, address, namespace)`,
//!   over the index of open claims (`idem_records_open_claims`, `(account,
//!   state, created_at, address) WHERE kind = 'claim' AND state IS DISTINCT
//!   FROM 'success'`), whose predicate the statement spells out
//!   (`open_claims!`). The state is written into the statement, never
//!   bound, so that the index's `state` column narrows the scan. Of one
//!   account it is returned sorted; of every account, the open claims of
//!   that state are read from the index and sorted (they are few: the
//!   successes are not in it).
//! - **By address**, for every other list (successes, or every state):
//!   `(account, address, namespace)`, over the two partial unique indexes,
//!   one branch each, merged. Addresses are digests, so this order says
//!   nothing; it is the order millions of rows can be walked in.

use std::time::Duration;

use sqlx::{AssertSqlSafe, PgPool, Row};

use super::operations::{ClaimState, NamespaceFilter, ScopeFilter, Slot, age_in_seconds};
use super::{SplitOnNamespace, age_since, began_at, open_claims};
use crate::Error;

/// The action of a claim's canonical identity, as bytes (`NULL` when the
/// identity is not in idem's format), over `idem_records r`: the payload
/// of its first field (`idem\x01`, tag `a`, a big-endian `u64` length).
/// Only the length's low 32 bits are read, and at most 1 KiB of the name:
/// a longer name is cut (and shown so).
macro_rules! action_of_identity {
    () => {
        "CASE WHEN substring(r.identity FOR 6) = '\\x6964656d0161'::bytea \
                   AND octet_length(r.identity) >= 14 \
              THEN substring(r.identity FROM 15 FOR least(1024, \
                   (get_byte(r.identity, 10)::int8 << 24) | (get_byte(r.identity, 11)::int8 << 16) \
                   | (get_byte(r.identity, 12)::int8 << 8) | get_byte(r.identity, 13)::int8)::int4) \
         END"
    };
}

/// Claims in each open state, by account and action, with the age of the
/// oldest; `$1` the most groups returned, `$2` one account or NULL for
/// every one. Index: the index of open claims (its predicate is written
/// out), so successes are never read.
pub const OPEN_COUNTS: &str = concat!(
    "SELECT r.account, r.state, ",
    action_of_identity!(),
    " AS action, count(*)::int8 AS claims, \
     floor(extract(epoch FROM now() - min(",
    age_since!(),
    ")))::int8 AS oldest_age_seconds \
     FROM idem_records r WHERE ",
    open_claims!("r."),
    " AND ($2::text IS NULL OR r.account = $2::text) \
     GROUP BY 1, 2, 3 ORDER BY 1, 2, 3 LIMIT $1"
);

/// Claims in each open state, of every account or of one (`$1`, or NULL
/// for every one): the exact totals, whatever [`OPEN_COUNTS`] has room
/// for. Index: the index of open claims (its predicate is written out), so
/// successes are never read.
pub const OPEN_TOTALS: &str = concat!(
    "SELECT r.state, count(*)::int8 AS claims FROM idem_records r WHERE ",
    open_claims!("r."),
    " AND ($1::text IS NULL OR r.account = $1::text) GROUP BY r.state"
);

/// The planner's estimate of the rows in `idem_records` (of every kind),
/// summed over its partitions when it has any: counting them exactly reads
/// the whole table. `-1` (never analysed) counts as unknown.
const ROW_ESTIMATE: &str = "SELECT sum(greatest(c.reltuples, 0))::int8 AS rows, \
            bool_or(c.reltuples >= 0) AS known \
     FROM pg_class c \
     WHERE c.oid = 'idem_records'::regclass \
        OR c.oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'idem_records'::regclass)";

/// One claim as the console shows it, by the names of [`ClaimView`]'s
/// fields, over `idem_records r`: its values (the output to replay, the
/// fingerprint) are not read, only their sizes.
macro_rules! view_columns {
    () => {
        concat!(
            "r.account, r.namespace, r.address, r.state, r.state_reason, r.identity, r.fence, \
             r.first_fence, \
             floor(extract(epoch FROM ",
            began_at!(),
            ") * 1000000)::int8 AS created_micros, \
             floor(extract(epoch FROM r.settled_at) * 1000000)::int8 AS settled_micros, \
             floor(extract(epoch FROM r.in_doubt_since) * 1000000)::int8 AS in_doubt_micros, \
             floor(extract(epoch FROM r.resolved_at) * 1000000)::int8 AS resolved_micros, \
             floor(extract(epoch FROM r.lease_expires_at) * 1000000)::int8 AS lease_expires_micros, \
             coalesce(r.lease_expires_at > now(), false) AS lease_live, \
             floor(extract(epoch FROM now() - ",
            age_since!(),
            "))::int8 AS age_seconds, \
             coalesce(octet_length(r.output_json), octet_length(r.output::text))::int8 \
                 AS output_bytes, \
             r.fingerprint IS NOT NULL AS has_fingerprint"
        )
    };
}

/// One claim, described ([`view_columns!`]). `$1` account, `$2` address,
/// `$3` namespace. Index: the partial unique index of its form.
const DESCRIBE: SplitOnNamespace =
    super::per_row!(concat!("SELECT ", view_columns!(), " FROM idem_records r"));

/// One claim's stored values: the output its retries replay (as JSON
/// text) and the fingerprint of its request (hex). `$1` account, `$2`
/// address, `$3` namespace. Index: the partial unique index of its form.
const STORED_VALUES: SplitOnNamespace = super::per_row!(
    "SELECT coalesce(r.output_json, r.output::text) AS output, \
            encode(r.fingerprint, 'hex') AS fingerprint \
     FROM idem_records r"
);

/// A claim as the console shows it: where it is, its state and lineage,
/// and the sizes of its stored values, not the values.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClaimView {
    /// Tenant scope.
    pub account: String,
    /// Narrower scope, usually none.
    pub namespace: Option<String>,
    /// `claim_` + 24 hex digits.
    pub address: String,
    /// Its state.
    pub state: ClaimState,
    /// How it got there (`body_in_doubt`, `operator`, ...), when written.
    pub state_reason: Option<String>,
    /// The canonical identity
    /// ([`Identity::from_canonical`](crate::Identity::from_canonical)), or,
    /// for a success a prune compacted past its value's window, an 8-byte
    /// check of it ([`is_compacted`](crate::operations::is_compacted)).
    pub identity: Vec<u8>,
    /// The fencing token of its current holder.
    pub fence: i64,
    /// The fence it was first claimed with; a takeover raised `fence`
    /// above it. `None` for rows from before schema version 4, and for a
    /// compacted success never taken over (it equalled `fence`).
    pub first_fence: Option<i64>,
    /// When it was claimed, in microseconds since the Unix epoch. A
    /// compacted success keeps no creation time: when it settled.
    pub created_micros: i64,
    /// When it settled.
    pub settled_micros: Option<i64>,
    /// When it went in doubt.
    pub in_doubt_micros: Option<i64>,
    /// When an operator or a reconciler resolved it.
    pub resolved_micros: Option<i64>,
    /// When the lease of its holder runs out (or ran out).
    pub lease_expires_micros: Option<i64>,
    /// Its lease has not run out: a holder is at work on it.
    pub lease_live: bool,
    /// Seconds since it went in doubt (a claim in doubt) or was claimed.
    pub age_seconds: i64,
    /// The size of the output its retries replay, as JSON text.
    pub output_bytes: Option<i64>,
    /// It keeps the fingerprint of the request that made it.
    pub has_fingerprint: bool,
}

impl ClaimView {
    fn from_row(row: &sqlx::postgres::PgRow) -> Result<Self, sqlx::Error> {
        Ok(ClaimView {
            account: row.try_get("account")?,
            namespace: row.try_get("namespace")?,
            address: row.try_get("address")?,
            state: row.try_get("state")?,
            state_reason: row.try_get("state_reason")?,
            identity: row.try_get("identity")?,
            fence: row.try_get("fence")?,
            first_fence: row.try_get("first_fence")?,
            created_micros: row.try_get("created_micros")?,
            settled_micros: row.try_get("settled_micros")?,
            in_doubt_micros: row.try_get("in_doubt_micros")?,
            resolved_micros: row.try_get("resolved_micros")?,
            lease_expires_micros: row.try_get("lease_expires_micros")?,
            lease_live: row.try_get("lease_live")?,
            age_seconds: row.try_get("age_seconds")?,
            output_bytes: row.try_get("output_bytes")?,
            has_fingerprint: row.try_get("has_fingerprint")?,
        })
    }

    /// Where it lives, to resolve it.
    pub fn slot(&self) -> Slot<'_> {
        Slot::new(&self.account, self.namespace.as_deref(), &self.address)
    }

    /// Where it is in the order its page was read in: the cursor of the
    /// page after it.
    pub fn cursor(&self) -> PageCursor {
        PageCursor {
            created_micros: self.created_micros,
            account: self.account.clone(),
            address: self.address.clone(),
            namespace: self.namespace.clone(),
        }
    }
}

/// The claims of one open state, by account and action.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct OpenCount {
    /// The account.
    pub account: String,
    /// `pending`, `in_doubt` or `failed`.
    pub state: ClaimState,
    /// The action, `None` for identities not in idem's format. Cut at
    /// 1 KiB, and lossily decoded where it is not UTF-8.
    pub action: Option<String>,
    /// How many.
    pub claims: i64,
    /// The age of the oldest, in seconds: since it went in doubt for a
    /// claim in doubt, since it was claimed for the others.
    pub oldest_age_seconds: i64,
}

/// The claims in each open state (pending, in doubt, kept failures), by
/// account and action, in `account` or every account, at most `limit`
/// groups. Reads only open claims, through their index: cheap however many
/// successes the table holds.
pub async fn open_counts(
    pool: &PgPool,
    account: Option<&str>,
    limit: u32,
) -> Result<Vec<OpenCount>, Error> {
    let rows = sqlx::query(OPEN_COUNTS)
        .bind(i64::from(limit))
        .bind(account)
        .fetch_all(pool)
        .await?;
    rows.iter()
        .map(|row| {
            let action: Option<Vec<u8>> = row.try_get("action")?;
            Ok(OpenCount {
                account: row.try_get("account")?,
                state: row.try_get("state")?,
                action: action.map(|bytes| String::from_utf8_lossy(&bytes).into_owned()),
                claims: row.try_get("claims")?,
                oldest_age_seconds: row.try_get("oldest_age_seconds")?,
            })
        })
        .collect::<Result<_, sqlx::Error>>()
        .map_err(Error::from)
}

/// How many claims are in each open state: exact totals, however many
/// groups [`open_counts`] returns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct OpenTotals {
    /// Pending: in flight, or their holder vanished.
    pub pending: i64,
    /// In doubt: held until resolved.
    pub in_doubt: i64,
    /// Kept failures.
    pub failed: i64,
}

impl OpenTotals {
    /// The total of `state`: 0 for a success, which is never open.
    pub fn of(&self, state: ClaimState) -> i64 {
        match state {
            ClaimState::Pending => self.pending,
            ClaimState::InDoubt => self.in_doubt,
            ClaimState::Failed => self.failed,
            ClaimState::Success => 0,
        }
    }
}

/// The claims in each open state (pending, in doubt, kept failures), in
/// `account` or every account, counted exactly. Reads only open claims,
/// through their index, as [`open_counts`] does.
pub async fn open_totals(pool: &PgPool, account: Option<&str>) -> Result<OpenTotals, Error> {
    let rows = sqlx::query(OPEN_TOTALS)
        .bind(account)
        .fetch_all(pool)
        .await?;
    let mut totals = OpenTotals::default();
    for row in &rows {
        let claims: i64 = row.try_get("claims")?;
        match row.try_get::<ClaimState, _>("state")? {
            ClaimState::Pending => totals.pending = claims,
            ClaimState::InDoubt => totals.in_doubt = claims,
            ClaimState::Failed => totals.failed = claims,
            // Not an open state: the statement reads none.
            ClaimState::Success => {}
        }
    }
    Ok(totals)
}

/// The planner's estimate of the rows in `idem_records`, of every kind
/// (`None` before the table was first analysed): an exact count would read
/// the whole table.
pub async fn row_estimate(pool: &PgPool) -> Result<Option<i64>, Error> {
    let row = sqlx::query(ROW_ESTIMATE).fetch_one(pool).await?;
    let known: Option<bool> = row.try_get("known")?;
    let rows: Option<i64> = row.try_get("rows")?;
    Ok(if known == Some(true) { rows } else { None })
}

/// Where a page of [`browse`] starts: after this claim, in its order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageCursor {
    /// `created_at` in microseconds (oldest-first pages).
    pub created_micros: i64,
    /// The account.
    pub account: String,
    /// The address.
    pub address: String,
    /// The namespace; `None`: none.
    pub namespace: Option<String>,
}

/// Which claims [`browse`] returns, and from where.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct BrowseFilter<'a> {
    /// Which accounts and namespaces.
    pub scope: ScopeFilter<'a>,
    /// One state; `None`: every state.
    pub state: Option<ClaimState>,
    /// Only claims of this action.
    pub action: Option<&'a str>,
    /// Only claims older than this ([`ClaimView::age_seconds`]'s rule).
    pub older_than: Option<Duration>,
    /// Start after this claim; `None`: from the first.
    pub after: Option<&'a PageCursor>,
    /// At most this many (at most [`BrowseFilter::MAX_LIMIT`]).
    pub limit: u32,
}

impl<'a> BrowseFilter<'a> {
    /// The largest page.
    pub const MAX_LIMIT: u32 = 500;

    /// Every claim, 50 to a page.
    pub fn new() -> Self {
        BrowseFilter {
            scope: ScopeFilter::new(),
            state: None,
            action: None,
            older_than: None,
            after: None,
            limit: 50,
        }
    }

    /// Which accounts and namespaces.
    pub fn scope(mut self, scope: ScopeFilter<'a>) -> Self {
        self.scope = scope;
        self
    }

    /// One state.
    pub fn state(mut self, state: impl Into<Option<ClaimState>>) -> Self {
        self.state = state.into();
        self
    }

    /// Only claims of this action.
    pub fn action(mut self, action: impl Into<Option<&'a str>>) -> Self {
        self.action = action.into();
        self
    }

    /// Only claims older than `age`.
    pub fn older_than(mut self, age: impl Into<Option<Duration>>) -> Self {
        self.older_than = age.into();
        self
    }

    /// Start after this claim.
    pub fn after(mut self, cursor: impl Into<Option<&'a PageCursor>>) -> Self {
        self.after = cursor.into();
        self
    }

    /// At most this many.
    pub fn limit(mut self, limit: u32) -> Self {
        self.limit = limit;
        self
    }

    /// Pages oldest first (one open state), or by address.
    fn oldest_first(&self) -> Option<&'static str> {
        match self.state {
            Some(state @ (ClaimState::Pending | ClaimState::InDoubt | ClaimState::Failed)) => {
                Some(state.as_str())
            }
            _ => None,
        }
    }
}

impl Default for BrowseFilter<'_> {
    fn default() -> Self {
        Self::new()
    }
}

/// A page of claims, and where the next one starts.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ClaimPage {
    /// The claims, in the page's order.
    pub claims: Vec<ClaimView>,
    /// The cursor of the next page; `None`: this is the last.
    pub next: Option<PageCursor>,
}

/// The filters every page statement shares, over `idem_records r`: `$1`,
/// `$2` the scope (as `idem claims list`'s), `$3` the action's `LIKE`
/// pattern over the identity or NULL, `$4` the minimum age in seconds or
/// NULL.
fn page_filters(scope: &ScopeFilter<'_>) -> String {
    format!(
        "{scope} AND ($3::bytea IS NULL OR r.identity LIKE $3::bytea) \
         AND ($4::float8 IS NULL OR {since} < now() - make_interval(secs => $4::float8))",
        scope = super::operations::scope_test(scope),
        since = age_since!(),
    )
}

/// Where a page statement starts, as far as its text goes: each form is
/// its own statement, so that a cursor's comparison is an index condition
/// in every plan, generic or not (an `$n IS NULL OR ...` is not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// From the first claim; the cursor's parameters are NULL.
    First,
    /// After a claim without a namespace.
    AfterWithout,
    /// After a claim within a namespace.
    AfterWithin,
}

impl Start {
    fn of(after: Option<&PageCursor>) -> Start {
        match after {
            None => Start::First,
            Some(PageCursor {
                namespace: None, ..
            }) => Start::AfterWithout,
            Some(_) => Start::AfterWithin,
        }
    }
}

/// The cursor's parameters, tested as NULL: a one-time filter, which
/// leaves the plan as it is.
const NO_CURSOR: &str =
    "$5::int8 IS NULL AND $6::text IS NULL AND $7::text IS NULL AND $8::text IS NULL";

/// A page of one open state, oldest first: `$5` the cursor's `created_at`
/// in microseconds, `$6`, `$7`, `$8` its account, address and namespace,
/// `$9` the limit. The state is `state`, written in (one of three fixed
/// words), so that the planner uses the index of open claims. The
/// namespace sorts after the address, none first.
pub fn oldest_first_page(scope: &ScopeFilter<'_>, state: &'static str, start: Start) -> String {
    let cursor = match start {
        Start::First => NO_CURSOR,
        Start::AfterWithout | Start::AfterWithin => {
            "(r.created_at, r.account, r.address, r.namespace IS NOT NULL, \
              coalesce(r.namespace, '')) \
             > (timestamptz 'epoch' + $5::int8 * interval '1 microsecond', $6::text, $7::text, \
                $8::text IS NOT NULL, coalesce($8::text, ''))"
        }
    };
    format!(
        "SELECT {columns} FROM idem_records r \
         WHERE {open} AND r.state = '{state}' AND {filters} \
           AND {cursor} \
         ORDER BY r.created_at, r.account, r.address, r.namespace IS NOT NULL, \
                  coalesce(r.namespace, '') \
         LIMIT $9",
        columns = view_columns!(),
        open = open_claims!("r."),
        filters = page_filters(scope),
    )
}

/// A page by address, over both partial unique indexes: at each address,
/// the claim without a namespace, then those within one. `$5` unused
/// (NULL), `$6`, `$7`, `$8` the cursor's account, address and namespace,
/// `$9` the limit, `$10` the state or NULL. Each branch's `WHERE` implies
/// its index's predicate, and each is walked in its index's order; a
/// branch the scope or the cursor rules out is left out.
fn by_address_page(scope: &ScopeFilter<'_>, start: Start) -> String {
    let filters = page_filters(scope);
    let branch = |namespace_test: &str, rank: u8, order: &str, cursor: &str| {
        format!(
            "(SELECT {columns}, {rank} AS namespace_rank FROM idem_records r \
              WHERE r.kind = 'claim' AND {namespace_test} AND {filters} \
                AND ($10::text IS NULL OR r.state = $10::text) AND {cursor} \
              ORDER BY {order} LIMIT $9)",
            columns = view_columns!(),
        )
    };
    let by_address = "r.account, r.kind, r.address";
    let by_namespace = "r.account, r.kind, r.address, r.namespace";
    let without = |cursor| branch("r.namespace IS NULL", 0, by_address, cursor);
    let within = |cursor| branch("r.namespace IS NOT NULL", 1, by_namespace, cursor);
    let after_address = "$5::int8 IS NULL AND $8::text IS NULL \
         AND (r.account, r.kind, r.address) > ($6::text, 'claim', $7::text)";
    let branches = match start {
        Start::First => (without(NO_CURSOR), within(NO_CURSOR)),
        // After a claim without a namespace: the later addresses, and every
        // namespace at its own address.
        Start::AfterWithout => (
            without(after_address),
            within(
                "$5::int8 IS NULL AND $8::text IS NULL \
                 AND (r.account, r.kind, r.address) >= ($6::text, 'claim', $7::text)",
            ),
        ),
        // After one within a namespace: only namespaced claims remain at
        // its address.
        Start::AfterWithin => (
            without(
                "$8::text IS NOT NULL AND $5::int8 IS NULL \
                 AND (r.account, r.kind, r.address) > ($6::text, 'claim', $7::text)",
            ),
            within(
                "$5::int8 IS NULL \
                 AND (r.account, r.kind, r.address, r.namespace) \
                     > ($6::text, 'claim', $7::text, $8::text)",
            ),
        ),
    };
    let (without, within) = branches;
    let branches = match scope.namespace {
        NamespaceFilter::Without => vec![without],
        NamespaceFilter::Named(_) => vec![within],
        NamespaceFilter::Any => vec![without, within],
    };
    format!(
        "SELECT * FROM ({branches}) r \
         ORDER BY r.account, r.address, r.namespace_rank, r.namespace LIMIT $9",
        branches = branches.join(" UNION ALL "),
    )
}

/// A page of the claims `filter` selects, after its cursor, in the order
/// its state calls for (see the module's docs), with the cursor of the
/// next page when there may be one. Never an `OFFSET`: a page costs its own
/// rows (and, under a filter, the rows the filter passes over).
pub async fn browse(pool: &PgPool, filter: &BrowseFilter<'_>) -> Result<ClaimPage, Error> {
    let limit = filter.limit.clamp(1, BrowseFilter::MAX_LIMIT);
    let (account, namespace) = filter.scope.params();
    let pattern = filter
        .action
        .map(|action| super::operations::action_pattern(crate::Identity::new(action).canonical()));
    let oldest_first = filter.oldest_first();
    let after = filter.after;
    let start = Start::of(after);
    let statement = match oldest_first {
        Some(state) => oldest_first_page(&filter.scope, state, start),
        None => by_address_page(&filter.scope, start),
    };
    let query = sqlx::query(AssertSqlSafe(statement))
        .bind(account)
        .bind(namespace)
        .bind(pattern)
        .bind(filter.older_than.map(age_in_seconds))
        .bind(match (oldest_first, after) {
            (Some(_), Some(cursor)) => Some(cursor.created_micros),
            _ => None,
        })
        .bind(after.map(|c| c.account.as_str()))
        .bind(after.map(|c| c.address.as_str()))
        .bind(after.and_then(|c| c.namespace.as_deref()))
        // One more than asked, to know whether a next page exists.
        .bind(i64::from(limit) + 1);
    let query = match oldest_first {
        Some(_) => query,
        None => query.bind(filter.state.map(ClaimState::as_str)),
    };
    let rows = query.fetch_all(pool).await?;
    let mut claims = rows
        .iter()
        .map(ClaimView::from_row)
        .collect::<Result<Vec<_>, _>>()?;
    let next = if claims.len() > limit as usize {
        claims.truncate(limit as usize);
        claims.last().map(ClaimView::cursor)
    } else {
        None
    };
    Ok(ClaimPage { claims, next })
}

/// The claim in `slot`, described; `None` when there is none.
pub async fn describe(pool: &PgPool, slot: Slot<'_>) -> Result<Option<ClaimView>, Error> {
    let scope = slot.scope();
    let row = DESCRIBE
        .for_row(scope, slot.address)
        .fetch_optional(pool)
        .await?;
    Ok(row.as_ref().map(ClaimView::from_row).transpose()?)
}

/// A claim's stored values, read only when an operator asks to see them.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoredValues {
    /// The output its retries replay, as JSON text.
    pub output: Option<String>,
    /// The fingerprint of the request that made it, in hex.
    pub fingerprint: Option<String>,
}

/// The stored values of the claim in `slot`; `None` when there is none.
pub async fn stored_values(pool: &PgPool, slot: Slot<'_>) -> Result<Option<StoredValues>, Error> {
    let scope = slot.scope();
    let row = STORED_VALUES
        .for_row(scope, slot.address)
        .fetch_optional(pool)
        .await?;
    row.map(|row| {
        Ok(StoredValues {
            output: row.try_get("output")?,
            fingerprint: row.try_get("fingerprint")?,
        })
    })
    .transpose()
    .map_err(|e: sqlx::Error| Error::from(e))
}
