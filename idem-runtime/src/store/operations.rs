//! What operators do to claims, outside any gate: list them, show one (and
//! its [`steps`]), release a pending one, resolve one in doubt, prune
//! settled ones (with their steps).
//!
//! The `idem` command (`idem claims list | show | release | resolve`, `idem
//! prune`) is built on these, and writes no SQL of its own.
//!
//! Every deletion and every resolution is guarded in its own `WHERE`:
//! [`release_pending`] deletes one claim only while it is `pending`,
//! [`resolve`] changes one only while it is `pending` or `in_doubt` (never a
//! success, never a kept failure), and [`prune`] deletes only `success`
//! claims settled before a given instant, in batches that each commit on
//! their own ([`Pruning`], one batch at a time, for a caller that paces,
//! reports or stops them). Deciding whether to run them (and
//! asking for confirmation) is the caller's business.
//!
//! ```no_run
//! # async fn demo(pool: sqlx::PgPool) -> Result<(), idem_runtime::Error> {
//! use std::time::Duration;
//! use idem_runtime::operations::{self, ClaimState, ListFilter, NamespaceFilter, ScopeFilter};
//!
//! // Pending claims of acme older than ten minutes: crashed holders, perhaps.
//! let filter = ListFilter::new()
//!     .scope(ScopeFilter::new().account("acme").namespace(NamespaceFilter::Any))
//!     .state(ClaimState::Pending)
//!     .older_than(Duration::from_secs(600))
//!     .limit(100);
//! let stuck = operations::list(&pool, &filter).await?;
//! for claim in &stuck {
//!     // Once sure that its holder is gone:
//!     operations::release_pending(&pool, claim.slot()).await?;
//! }
//! # Ok(()) }
//! ```

use std::time::Duration;

use sqlx::error::BoxDynError;
use sqlx::postgres::{PgTypeInfo, PgValueRef};
use sqlx::{AssertSqlSafe, FromRow, PgPool, Postgres};

use super::{Scope, SplitOnNamespace, age_since, began_at, open_claims, per_row};

pub use super::browse::{
    BrowseFilter, ClaimPage, ClaimView, OpenCount, OpenTotals, PageCursor, StoredValues, browse,
    describe, open_counts, open_totals, row_estimate, stored_values,
};
pub use super::prune::{
    DEFAULT_BATCH_SIZE, PruneFilter, Pruning, count_compactable, count_prunable,
    count_prunable_by_account, prune,
};
use crate::error::Error;
pub use crate::identity::is_compacted;
use crate::outcome::{Disposition, Outcome};

/// Which claims, by account and namespace: every account and namespace
/// unless narrowed.
///
/// Built with [`ScopeFilter::new`] and its methods, so that a later filter
/// (by kind, say) is not a breaking change.
#[derive(Debug, Clone, Copy, Default)]
#[non_exhaustive]
pub struct ScopeFilter<'a> {
    /// Only this account; `None`: every account.
    pub account: Option<&'a str>,
    /// Which namespaces.
    pub namespace: NamespaceFilter<'a>,
}

impl<'a> ScopeFilter<'a> {
    /// Every account, any namespace.
    pub fn new() -> Self {
        Self::default()
    }

    /// Only this account (`Some`), or every account (`None`).
    pub fn account(mut self, account: impl Into<Option<&'a str>>) -> Self {
        self.account = account.into();
        self
    }

    /// Only these namespaces.
    pub fn namespace(mut self, namespace: NamespaceFilter<'a>) -> Self {
        self.namespace = namespace;
        self
    }
}

/// A filter on the namespace, which most claims do not have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NamespaceFilter<'a> {
    /// Any namespace, or none.
    #[default]
    Any,
    /// Only claims without a namespace.
    Without,
    /// Only claims in this namespace.
    Named(&'a str),
}

/// The state of a claim, as stored in `idem_records.state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClaimState {
    /// Claimed, outcome not recorded yet: running, or its holder crashed.
    Pending,
    /// Settled: the action succeeded, and the slot stays taken.
    Success,
    /// The outcome is unknown (the body said so, panicked or was dropped,
    /// or its lease ran out): the slot is held, and nobody runs the action
    /// until a reconciler or an operator [`resolve`]s it.
    InDoubt,
    /// A definite failure, kept: duplicates are refused, never run.
    Failed,
}

impl ClaimState {
    /// As stored: `"pending"`, `"success"`, `"in_doubt"`, `"failed"`.
    pub fn as_str(self) -> &'static str {
        match self {
            ClaimState::Pending => "pending",
            ClaimState::Success => "success",
            ClaimState::InDoubt => "in_doubt",
            ClaimState::Failed => "failed",
        }
    }

    /// The state a slot is left in by `outcome`; `None`: it is deleted
    /// (released).
    pub fn after<V>(outcome: &Outcome<V>) -> Option<ClaimState> {
        match outcome {
            Outcome::Succeeded(_) => Some(ClaimState::Success),
            Outcome::Failed(Disposition::Keep) => Some(ClaimState::Failed),
            Outcome::Failed(Disposition::InDoubt) => Some(ClaimState::InDoubt),
            Outcome::Failed(Disposition::Release) => None,
        }
    }

    /// The state stored as `text`, if this build knows it.
    pub fn parse(text: &str) -> Option<ClaimState> {
        [
            ClaimState::Pending,
            ClaimState::Success,
            ClaimState::InDoubt,
            ClaimState::Failed,
        ]
        .into_iter()
        .find(|state| state.as_str() == text)
    }

    /// Whether [`resolve`] may change a claim in this state: `pending` or
    /// `in_doubt`, never a success or a kept failure.
    pub fn is_resolvable(self) -> bool {
        matches!(self, ClaimState::Pending | ClaimState::InDoubt)
    }
}

/// As stored ([`ClaimState::as_str`]).
impl std::fmt::Display for ClaimState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Read from `idem_records.state` as text.
impl sqlx::Type<Postgres> for ClaimState {
    fn type_info() -> PgTypeInfo {
        <&str as sqlx::Type<Postgres>>::type_info()
    }

    fn compatible(ty: &PgTypeInfo) -> bool {
        <&str as sqlx::Type<Postgres>>::compatible(ty)
    }
}

/// Where a row's state is parsed, once, as it is read: a state this build
/// does not know (written by a later version) is an error of the row that
/// holds it, never taken for another state.
impl<'r> sqlx::Decode<'r, Postgres> for ClaimState {
    fn decode(value: PgValueRef<'r>) -> Result<ClaimState, BoxDynError> {
        let text = <&str as sqlx::Decode<'r, Postgres>>::decode(value)?;
        ClaimState::parse(text).ok_or_else(|| {
            format!(
                "the claim state {text:?} is not one this build of idem knows (pending, \
                 success, in_doubt, failed): a later version wrote it; upgrade idem"
            )
            .into()
        })
    }
}

/// Which claims [`list`] returns: by default every claim in every account,
/// at most [`ListFilter::DEFAULT_LIMIT`] of them.
///
/// Built with [`ListFilter::new`] and its methods, so that a later filter
/// is not a breaking change.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct ListFilter<'a> {
    /// Account and namespace.
    pub scope: ScopeFilter<'a>,
    /// Only claims in this state.
    pub state: Option<ClaimState>,
    /// Only claims older than this, by the database's clock: claims in
    /// doubt by how long they have been in doubt (`in_doubt_since`; for a
    /// claim that turned before schema version 6, since it was created),
    /// every other claim by how long ago it was created (or taken over).
    pub older_than: Option<Duration>,
    /// At most this many.
    pub limit: u32,
}

impl Default for ListFilter<'_> {
    fn default() -> Self {
        ListFilter {
            scope: ScopeFilter::new(),
            state: None,
            older_than: None,
            limit: ListFilter::DEFAULT_LIMIT,
        }
    }
}

impl<'a> ListFilter<'a> {
    /// How many claims [`ListFilter::new`] returns at most.
    pub const DEFAULT_LIMIT: u32 = 100;

    /// Every claim, at most [`ListFilter::DEFAULT_LIMIT`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Only claims in this account and these namespaces.
    pub fn scope(mut self, scope: ScopeFilter<'a>) -> Self {
        self.scope = scope;
        self
    }

    /// Only claims in this state (`Some`), or in any (`None`).
    pub fn state(mut self, state: impl Into<Option<ClaimState>>) -> Self {
        self.state = state.into();
        self
    }

    /// Only claims older than this (`Some`; see the field for how age is
    /// measured), or of any age (`None`).
    pub fn older_than(mut self, age: impl Into<Option<Duration>>) -> Self {
        self.older_than = age.into();
        self
    }

    /// At most this many.
    pub fn limit(mut self, limit: u32) -> Self {
        self.limit = limit;
        self
    }
}

/// Where one claim lives: the row [`release_pending`] deletes, or
/// [`resolve`] changes. [`ClaimRow::slot`] gives a listed claim's;
/// [`Slot::new`] builds one from its parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Slot<'a> {
    /// Its account.
    pub account: &'a str,
    /// Its namespace; `None` for a claim without one.
    pub namespace: Option<&'a str>,
    /// `claim_` + 24 hex digits.
    pub address: &'a str,
}

impl<'a> Slot<'a> {
    /// Its account and namespace, as the statements over one row take them.
    pub(super) fn scope(&self) -> Scope<'a> {
        Scope {
            account: self.account,
            namespace: self.namespace,
        }
    }

    /// The claim at `address` in `account`, in `namespace` (`None` for a
    /// claim without one).
    pub fn new(account: &'a str, namespace: Option<&'a str>, address: &'a str) -> Self {
        Slot {
            account,
            namespace,
            address,
        }
    }
}

/// `text` could be the address of a row of `idem_records`: what the
/// schema's CHECK lets in (`[a-z0-9_]+`, of any length; idem's own claims
/// are `claim_` and 24 hex digits, a row written by hand may be longer).
/// Checked before a statement is sent, so that a mistyped address is told
/// apart from a claim that is not there.
pub fn is_address(text: &str) -> bool {
    !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// One claim row, as operators see it (decoded by column name).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct ClaimRow {
    /// Tenant scope.
    pub account: String,
    /// Narrower scope, usually none.
    pub namespace: Option<String>,
    /// Always `claim` here.
    pub kind: String,
    /// `claim_` + 24 hex digits.
    pub address: String,
    /// Its state. A row in a state this build does not know (written by a
    /// later version) is not read: the call that meets it fails, saying so.
    pub state: ClaimState,
    /// The canonical identity encoding
    /// ([`Identity::from_canonical`](crate::Identity::from_canonical) reads
    /// it back), or, for a success a prune compacted past its value's
    /// window, an 8-byte check of it ([`is_compacted`]).
    pub identity: Vec<u8>,
    /// `created_at`, in microseconds since the Unix epoch. A compacted
    /// success ([`is_compacted`]) keeps no creation time: its `settled_at`.
    pub created_micros: i64,
    /// `settled_at`, in microseconds since the Unix epoch.
    pub settled_micros: Option<i64>,
    /// Seconds since `created_at` (`settled_at` for a compacted success),
    /// by the database's clock.
    pub age_seconds: i64,
    /// The fencing token of the claim's current holder: a takeover raises
    /// it, so a resolution made against a fence that was seen
    /// ([`Resolver::expected_fence`]) changes nothing once it moved on.
    pub fence: i64,
    /// How the claim got to its state (`body_in_doubt`, `lease_expired`,
    /// `kept_failure`, `operator`, `reconciled`, ...), as the runtime wrote
    /// it; `None` for pending and settled claims, and rows from before
    /// schema version 5.
    pub state_reason: Option<String>,
    /// Every column of the row but the eight above `fence` (so `fence` and
    /// `state_reason` too, and whatever later schema versions add), as
    /// PostgreSQL renders it in JSON: what scripts that read it before
    /// those two had fields of their own still find there.
    #[sqlx(json)]
    pub other_columns: serde_json::Map<String, serde_json::Value>,
}

impl ClaimRow {
    /// Where this claim lives, to [`release_pending`] it.
    pub fn slot(&self) -> Slot<'_> {
        Slot {
            account: &self.account,
            namespace: self.namespace.as_deref(),
            address: &self.address,
        }
    }
}

/// The select list of a [`ClaimRow`], over `idem_records r`, by the names
/// of its fields.
macro_rules! claim_columns {
    () => {
        concat!(
            "r.account, r.namespace, r.kind, r.address, r.state, r.identity, \
             floor(extract(epoch FROM ",
            began_at!(),
            ") * 1000000)::int8 AS created_micros, \
             floor(extract(epoch FROM r.settled_at) * 1000000)::int8 AS settled_micros, \
             floor(extract(epoch FROM now() - ",
            began_at!(),
            "))::int8 AS age_seconds, \
             r.fence, r.state_reason, \
             (to_jsonb(r) - ARRAY['account', 'namespace', 'kind', 'address', 'state', 'identity', \
                                  'created_at', 'settled_at']) AS other_columns"
        )
    };
}

/// The test that selects the claims of a [`ScopeFilter`], over
/// `idem_records r`: `$1` the account, `$2` the namespace. Each parameter
/// the filter does not use is bound NULL and tested as NULL, so that both
/// keep their numbers and types; each one it uses is tested spelled out
/// (`r.namespace IS NULL`, `r.namespace = $2`), so that a statement which
/// also names the kind and address can be served by the partial unique
/// index whose predicate that implies.
pub(super) fn scope_test(scope: &ScopeFilter<'_>) -> &'static str {
    match (scope.account.is_some(), scope.namespace) {
        (true, NamespaceFilter::Any) => "r.account = $1 AND $2::text IS NULL",
        (true, NamespaceFilter::Without) => {
            "r.account = $1 AND r.namespace IS NULL AND $2::text IS NULL"
        }
        (true, NamespaceFilter::Named(_)) => "r.account = $1 AND r.namespace = $2",
        (false, NamespaceFilter::Any) => "$1::text IS NULL AND $2::text IS NULL",
        (false, NamespaceFilter::Without) => {
            "$1::text IS NULL AND r.namespace IS NULL AND $2::text IS NULL"
        }
        (false, NamespaceFilter::Named(_)) => "$1::text IS NULL AND r.namespace = $2",
    }
}

impl ScopeFilter<'_> {
    /// The values of `$1` and `$2` in [`scope_test`].
    pub(super) fn params(&self) -> (Option<&str>, Option<&str>) {
        let namespace = match self.namespace {
            NamespaceFilter::Named(name) => Some(name),
            NamespaceFilter::Any | NamespaceFilter::Without => None,
        };
        (self.account, namespace)
    }
}

/// The claims of a scope that [`list`] and [`count`] read, over
/// `idem_records r`. `$1`, `$2` the scope ([`scope_test`]); `$3` the state
/// or NULL; `$4` the minimum age in seconds or NULL: for a claim in doubt,
/// since it went in doubt (`in_doubt_since`, or `created_at` for a row that
/// turned before that column existed), else since it was created.
///
/// Index: for a list of an open `state` (`$3` then binds it), the index of
/// open claims, whose predicate is written in (`open_claims!`), so that the
/// successes are never read; otherwise none serves the order, and within
/// an account the partial unique indexes' leading `(account, kind)`
/// narrows the rows read.
fn list_conditions(scope: &ScopeFilter<'_>, state: Option<ClaimState>) -> String {
    let kind = match state {
        Some(ClaimState::Success) | None => "r.kind = 'claim'",
        Some(ClaimState::Pending | ClaimState::InDoubt | ClaimState::Failed) => {
            open_claims!("r.")
        }
    };
    format!(
        "{kind} AND {scope} \
         AND ($3::text IS NULL OR r.state = $3) \
         AND ($4::float8 IS NULL \
              OR {since} < now() - make_interval(secs => $4::float8))",
        scope = scope_test(scope),
        since = age_since!(),
    )
}

/// Lists the claims of a scope, newest first ([`list_conditions`]); `$5`
/// the limit. Index: as [`list_conditions`] says.
pub(crate) fn list_statement(scope: &ScopeFilter<'_>, state: Option<ClaimState>) -> String {
    format!(
        "SELECT {columns} FROM idem_records r WHERE {conditions} \
         ORDER BY {began} DESC, r.account, r.namespace NULLS FIRST, r.address \
         LIMIT $5",
        columns = claim_columns!(),
        began = began_at!(),
        conditions = list_conditions(scope, state),
    )
}

/// Counts the claims [`list_statement`] would list without a limit
/// ([`list_conditions`]). Index: as [`list_statement`].
pub(crate) fn count_statement(scope: &ScopeFilter<'_>, state: Option<ClaimState>) -> String {
    format!(
        "SELECT count(*) FROM idem_records r WHERE {conditions}",
        conditions = list_conditions(scope, state),
    )
}

/// Where a reconciler's listing stopped: the sort key of the last claim it
/// handled ([`list_to_reconcile`] lists the claims after it). `created_at`
/// as PostgreSQL prints it (ISO, with its offset and every microsecond), so
/// it reads back exactly, whatever the server's version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReconcileCursor {
    created_at: String,
    account: String,
    address: String,
    /// The namespace, `""` for none: the order sorts them together, and
    /// a tie on the whole key (one address claimed without a namespace
    /// and in the namespace `""`, in the same microsecond) is the only
    /// case a window boundary can pass over; the next cycle finds it.
    namespace: String,
}

/// The claims a reconciler probes: of the actions it has probes for, in
/// doubt, pending with a lease that ran out (whatever their age), or
/// pending without a lease and older than `pending_older_than`, after
/// `after` in the order (oldest first), at most `limit`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReconcileFilter<'a> {
    pub(crate) scope: ScopeFilter<'a>,
    /// [`action_pattern`] of each action with a probe.
    pub(crate) actions: &'a [Vec<u8>],
    pub(crate) pending_older_than: Option<Duration>,
    pub(crate) after: Option<&'a ReconcileCursor>,
    pub(crate) limit: u32,
}

/// A `LIKE` pattern (over `bytea`) that the canonical identity of every
/// claim of an action matches, and no other, from `action_alone`: the
/// canonical encoding of the action with no key parts
/// (`Identity::new(action).canonical()`), which is the prefix of each of
/// its identities (its length is part of it, so `charge` never matches
/// `charge_refund`). `\`, `%` and `_` are escaped wherever they fall (in
/// the name, or in its length's bytes). The caller encodes: the store
/// names no layer above the error vocabulary.
pub(crate) fn action_pattern(action_alone: &[u8]) -> Vec<u8> {
    let mut pattern = Vec::with_capacity(action_alone.len() + 8);
    for &byte in action_alone {
        if matches!(byte, b'\\' | b'%' | b'_') {
            pattern.push(b'\\');
        }
        pattern.push(byte);
    }
    pattern.push(b'%');
    pattern
}

/// The text of [`list_to_reconcile`]. `$1`, `$2` the scope
/// ([`scope_test`]); `$3` the actions' patterns; `$4` the minimum age of a
/// pending claim in seconds, or NULL for none; `$5`..`$8` the cursor
/// (`$5` NULL: from the start); `$9` the limit.
///
/// Oldest first, by a keyset cursor, so that a window moves on across
/// passes: claims whose probe keeps saying unknown cannot fill it every
/// time, and the claims of actions without a probe are never read at all.
/// A pending claim whose lease is live has a living holder and is not
/// listed (and the resolution refuses it anyway: `NO_LIVE_LEASE`). One
/// whose lease ran out is listed whatever `$4` says: by the lease's own
/// definition its holder is presumed gone, and under `on_expiry =
/// "in_doubt"` (`expires_in_doubt`) it is in doubt but stays `pending`
/// until a retry turns it, which may never come; waiting for `$4` would
/// leave it unprobed. (Under `take_over` a probe's answer stands in for the
/// settle the vanished holder never made, as `Reconciler`'s docs explain.) A
/// renewal between the listing and the resolution is safe: the
/// resolution's compare-and-swap refuses a live lease. A pending claim
/// without a lease can never show its holder gone, so only `$4` lists it.
/// `lease_ran_out` says which kind of pending claim a row is.
///
/// Index: the index of open claims (`open_claims!`), so a pass reads the
/// claims not settled and never the successes, of every account or of
/// one (its leading column); the cursor and the limit bound what is
/// sorted and sent.
pub(crate) fn reconcile_statement(scope: &ScopeFilter<'_>) -> String {
    format!(
        "SELECT {columns}, r.created_at::text AS cursor_created_at, \
                coalesce(r.state = 'pending' AND r.lease_expires_at <= now(), false) \
                  AS lease_ran_out \
         FROM idem_records r \
         WHERE {open} AND {scope} \
           AND r.identity LIKE ANY ($3::bytea[]) \
           AND (r.state = 'in_doubt' \
                OR (r.state = 'pending' AND r.lease_expires_at <= now()) \
                OR ($4::float8 IS NOT NULL AND r.state = 'pending' \
                    AND r.lease_expires_at IS NULL \
                    AND r.created_at < now() - make_interval(secs => $4::float8))) \
           AND ($5::timestamptz IS NULL \
                OR (r.created_at, r.account, r.address, coalesce(r.namespace, '')) \
                   > ($5::timestamptz, $6::text, $7::text, $8::text)) \
         ORDER BY r.created_at, r.account, r.address, coalesce(r.namespace, '') \
         LIMIT $9",
        columns = claim_columns!(),
        open = open_claims!("r."),
        scope = scope_test(scope),
    )
}

/// The claims at one address in a scope (several when the scope leaves the
/// account or the namespace open). `$1`, `$2` the scope ([`scope_test`]);
/// `$3` the address. Index: with the account and a namespace filter
/// (`Without` or `Named`), the partial unique index that filter implies;
/// with either left open, a scan.
pub(crate) fn find_statement(scope: &ScopeFilter<'_>) -> String {
    format!(
        "SELECT {columns} FROM idem_records r \
         WHERE r.kind = 'claim' AND r.address = $3 AND {scope} \
         ORDER BY r.account, r.namespace NULLS FIRST",
        columns = claim_columns!(),
        scope = scope_test(scope),
    )
}

/// A claim's steps (`idem::step`), as operators see them: where each one
/// is and what it says, not what it returned ([`ClaimStep::output_bytes`]
/// says how much that is). A step's name is not stored, only the digest of
/// its identity and name in its address.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClaimStep {
    /// Its name, as the body gave it (read back from the identity the row
    /// keeps); `None` for a row whose identity is no step's.
    pub name: Option<String>,
    /// `step_` + 24 hex digits.
    pub address: String,
    /// Its state.
    pub state: StepState,
    /// The fence of the claim holder that began it (or last retook it).
    pub fence: i64,
    /// `created_at` (when it was begun), in microseconds since the Unix
    /// epoch.
    pub created_micros: i64,
    /// `settled_at` (when its result was recorded), in microseconds since
    /// the Unix epoch; `None` while pending.
    pub settled_micros: Option<i64>,
    /// The size of its recorded value (JSON text), in bytes; `None` while
    /// pending.
    pub output_bytes: Option<i64>,
    /// `released_at` (when its claim was last released, its retry yet to
    /// replay it), in microseconds since the Unix epoch; `None` when its
    /// claim was never released. Prune counts the age of a step whose
    /// claim is gone from the later of this and `settled_micros`.
    pub released_micros: Option<i64>,
}

/// The state of a step, as stored in `idem_records.state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StepState {
    /// Begun and not recorded: its holder runs it, or was cut off inside it
    /// (a retry is then refused `StepInDoubt`, unless the step is
    /// repeatable).
    Pending,
    /// Recorded: a retry of the claim replays its value.
    Success,
}

impl StepState {
    /// The state stored in the column `state` of `row`, parsed: a state
    /// this build does not know (written by a later version) fails the
    /// read, saying to upgrade.
    pub(crate) fn of_row(row: &sqlx::postgres::PgRow) -> Result<StepState, sqlx::Error> {
        use sqlx::Row;
        let state: String = row.try_get("state")?;
        match state.as_str() {
            "pending" => Ok(StepState::Pending),
            "success" => Ok(StepState::Success),
            other => Err(sqlx::Error::ColumnDecode {
                index: "state".into(),
                source: format!(
                    "the step state {other:?} is not one this build of idem knows \
                     (pending, success): a later version wrote it; upgrade idem"
                )
                .into(),
            }),
        }
    }

    /// As stored: `"pending"`, `"success"`.
    pub fn as_str(self) -> &'static str {
        match self {
            StepState::Pending => "pending",
            StepState::Success => "success",
        }
    }
}

/// As stored ([`StepState::as_str`]).
impl std::fmt::Display for StepState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromRow<'_, sqlx::postgres::PgRow> for ClaimStep {
    fn from_row(row: &sqlx::postgres::PgRow) -> Result<Self, sqlx::Error> {
        use sqlx::Row;
        let identity: Vec<u8> = row.try_get("identity")?;
        Ok(ClaimStep {
            name: crate::identity::split_step_canonical(&identity).map(|(_, name)| name.to_owned()),
            address: row.try_get("address")?,
            state: StepState::of_row(row)?,
            fence: row.try_get("fence")?,
            created_micros: row.try_get("created_micros")?,
            settled_micros: row.try_get("settled_micros")?,
            output_bytes: row.try_get("output_bytes")?,
            released_micros: row.try_get("released_micros")?,
        })
    }
}

/// The text of [`STEPS_OF_CLAIM`] with its namespace test.
macro_rules! steps_of_claim {
    ($namespace_test:literal) => {
        concat!(
            "SELECT address, identity, state, fence, \
                    floor(extract(epoch FROM created_at) * 1000000)::int8 AS created_micros, \
                    floor(extract(epoch FROM settled_at) * 1000000)::int8 AS settled_micros, \
                    octet_length(output_json)::int8 AS output_bytes, \
                    floor(extract(epoch FROM released_at) * 1000000)::int8 AS released_micros \
             FROM idem_records \
             WHERE account = $1 AND kind = 'step' AND claim_address = $2 AND ",
            $namespace_test,
            " ORDER BY created_at, address"
        )
    };
}

/// The steps of the claim at `$2` in account `$1` and namespace `$3`, in
/// the order they were begun. Index: the index of a claim's steps,
/// `(account, claim_address) WHERE kind = 'step'`; the namespace is tested
/// on the rows it finds, spelled out as everywhere.
pub(crate) const STEPS_OF_CLAIM: SplitOnNamespace = SplitOnNamespace {
    without_namespace: steps_of_claim!("namespace IS NULL AND $3::text IS NULL"),
    within_namespace: steps_of_claim!("namespace = $3"),
};

/// The steps of the claim in `slot` (`idem::step`), in the order they were
/// begun: none for a claim whose body ran no step. A released claim keeps
/// its steps (its retry replays the finished ones), so the steps of a
/// `slot` with no claim can be listed too.
pub async fn steps(pool: &PgPool, slot: Slot<'_>) -> Result<Vec<ClaimStep>, Error> {
    let scope = slot.scope();
    Ok(
        sqlx::query_as(STEPS_OF_CLAIM.for_namespace(scope.namespace))
            .bind(scope.account)
            .bind(slot.address)
            .bind(scope.namespace)
            .fetch_all(pool)
            .await?,
    )
}

/// Deletes a claim only while it is pending (it may have settled since it
/// was read) and not in doubt in all but name (made with `on_expiry =
/// "in_doubt"`, its lease run out: its holder is gone and may have done the
/// action, and only a retry's look has not turned it `in_doubt` yet), stamps
/// its steps released
/// ([`stamping_released_steps!`](super::stamping_released_steps)), and
/// returns it. `$1` account, `$2` address, `$3` namespace. Index: the
/// partial unique index of its form; the steps', for the stamp.
///
/// The row is described outside the `DELETE`: its age reads `now()`, which
/// Citus refuses in the `RETURNING` list of a distributed table ("non-
/// IMMUTABLE functions are not allowed in the RETURNING clause"). For the
/// same reason the predicate spells its `NULL`s out with `IS` and `OR`:
/// Citus refuses `now()` inside `CASE` or `coalesce` in a modification's
/// `WHERE` too.
pub(crate) const RELEASE_PENDING: SplitOnNamespace = per_row!(
    "WITH released AS (DELETE FROM idem_records",
    "state = 'pending' \
     AND (expires_in_doubt IS NOT TRUE OR lease_expires_at IS NULL OR lease_expires_at > now())";
    released("*", claim_columns!())
);

/// Locks the claim at one address for the rest of the transaction and
/// returns it as it is now, so that [`resolve`] can say exactly what it
/// found and what it changed. `$1` account, `$2` address, `$3` namespace.
/// Index: the partial unique index of its form.
pub(crate) const LOCK_FOR_RESOLVE: SplitOnNamespace = per_row!(
    concat!("SELECT ", claim_columns!(), " FROM idem_records r");
    "FOR UPDATE"
);

/// The test, in a resolution's `WHERE`, that its claim is not a pending one
/// whose lease is live: such a claim has a living holder, which renews it,
/// and may settle it at any moment; resolving it (above all releasing it)
/// would let a retry run beside that holder. A claim in doubt has no lease
/// (it was cleared when it turned); a pending claim without one (`NULL`)
/// can never show its holder alive, so it is left to the resolver's
/// judgement (`pending_older_than`, an operator). The statement decides,
/// under the row's lock, not the listing that chose the claim: the lease may
/// have been renewed in between.
///
/// (Spelled out in each statement, which `per_row!` wants as one literal; a
/// unit test checks that each carries it.)
#[cfg(test)]
const NO_LIVE_LEASE: &str =
    "(state = 'in_doubt' OR lease_expires_at IS NULL OR lease_expires_at <= now())";

/// Every resolution is a compare-and-swap matched on `state IN ('pending',
/// 'in_doubt') AND state = $5 AND fence = $4`: still pending or in doubt
/// (never a success, never a kept failure), in the state and under the
/// fence that were read; and never a pending claim whose lease is live
/// (`NO_LIVE_LEASE`).
///
/// Resolves a claim as a success: the slot keeps `$6` (the output to
/// replay, as JSON text, or NULL) forever. `$4` the fence, `$5` the state;
/// `$7` how it got there (`state_reason`). Index: the partial unique index
/// of its form.
pub(crate) const RESOLVE_SUCCEEDED: SplitOnNamespace = per_row!(
    "UPDATE idem_records \
     SET state = 'success', settled_at = now(), resolved_at = now(), lease_expires_at = NULL, \
         output_json = $6, state_reason = $7",
    "state IN ('pending', 'in_doubt') AND state = $5::text AND fence = $4 \
     AND (state = 'in_doubt' OR lease_expires_at IS NULL OR lease_expires_at <= now())"
);

/// Resolves a claim as a definite failure, kept: duplicates are refused.
/// `$4` the fence, `$5` the state; `$6` how it got there (`state_reason`).
/// Index: the partial unique index of its form.
pub(crate) const RESOLVE_FAILED: SplitOnNamespace = per_row!(
    "UPDATE idem_records \
     SET state = 'failed', settled_at = now(), resolved_at = now(), lease_expires_at = NULL, \
         state_reason = $6",
    "state IN ('pending', 'in_doubt') AND state = $5::text AND fence = $4 \
     AND (state = 'in_doubt' OR lease_expires_at IS NULL OR lease_expires_at <= now())"
);

/// Resolves a claim by deleting it: nothing happened, and the next
/// invocation runs the action. Its steps are stamped released
/// ([`stamping_released_steps!`](super::stamping_released_steps)). `$4`
/// the fence, `$5` the state. Index: the partial unique index of its form;
/// the steps', for the stamp.
pub(crate) const RESOLVE_RELEASE: SplitOnNamespace = per_row!(
    "WITH released AS (DELETE FROM idem_records",
    "state IN ('pending', 'in_doubt') AND state = $5::text AND fence = $4 \
     AND (state = 'in_doubt' OR lease_expires_at IS NULL OR lease_expires_at <= now())";
    released("1", "")
);

/// The longest age a statement is asked about, in seconds (about 317
/// years): `now()` minus more than PostgreSQL's timestamps reach is an
/// error ("timestamp out of range"), and no claim is older than this.
const LONGEST_AGE_SECONDS: f64 = 1e10;

/// `age` in seconds for `make_interval`, at most [`LONGEST_AGE_SECONDS`]:
/// an age beyond any claim's (`Duration::MAX`, `--older-than 100000years`)
/// matches none, rather than failing the statement.
pub(super) fn age_in_seconds(age: Duration) -> f64 {
    age.as_secs_f64().min(LONGEST_AGE_SECONDS)
}

/// The claims matching `filter`, newest first, at most `filter.limit` of
/// them: [`count`] says how many match in all.
pub async fn list(pool: &PgPool, filter: &ListFilter<'_>) -> Result<Vec<ClaimRow>, Error> {
    let (account, namespace) = filter.scope.params();
    let statement = list_statement(&filter.scope, filter.state);
    Ok(sqlx::query_as(AssertSqlSafe(statement))
        .bind(account)
        .bind(namespace)
        .bind(filter.state.map(ClaimState::as_str))
        .bind(filter.older_than.map(age_in_seconds))
        .bind(i64::from(filter.limit))
        .fetch_all(pool)
        .await?)
}

/// How many claims match `filter`, whatever its limit: what [`list`]
/// would return without one.
pub async fn count(pool: &PgPool, filter: &ListFilter<'_>) -> Result<u64, Error> {
    let (account, namespace) = filter.scope.params();
    let count: i64 =
        sqlx::query_scalar(AssertSqlSafe(count_statement(&filter.scope, filter.state)))
            .bind(account)
            .bind(namespace)
            .bind(filter.state.map(ClaimState::as_str))
            .bind(filter.older_than.map(age_in_seconds))
            .fetch_one(pool)
            .await?;
    Ok(u64::try_from(count).unwrap_or(0))
}

/// A claim [`list_to_reconcile`] listed.
#[derive(Debug, Clone)]
pub(crate) struct ToReconcile {
    pub(crate) claim: ClaimRow,
    /// Pending with a lease that ran out: its holder is presumed gone
    /// (the row cannot say whether under `on_expiry = "in_doubt"`).
    pub(crate) lease_ran_out: bool,
    /// Lists the claims after this one.
    pub(crate) cursor: ReconcileCursor,
}

/// The claims a reconciler asks its probes about ([`ReconcileFilter`]),
/// oldest first.
pub(crate) async fn list_to_reconcile(
    pool: &PgPool,
    filter: &ReconcileFilter<'_>,
) -> Result<Vec<ToReconcile>, Error> {
    let (account, namespace) = filter.scope.params();
    let after = filter.after;
    let rows = sqlx::query(AssertSqlSafe(reconcile_statement(&filter.scope)))
        .bind(account)
        .bind(namespace)
        .bind(filter.actions)
        .bind(filter.pending_older_than.map(age_in_seconds))
        .bind(after.map(|c| c.created_at.as_str()))
        .bind(after.map(|c| c.account.as_str()))
        .bind(after.map(|c| c.address.as_str()))
        .bind(after.map(|c| c.namespace.as_str()))
        .bind(i64::from(filter.limit))
        .fetch_all(pool)
        .await?;
    rows.iter()
        .map(|row| {
            let claim = ClaimRow::from_row(row)?;
            let cursor = ReconcileCursor {
                created_at: sqlx::Row::try_get(row, "cursor_created_at")?,
                account: claim.account.clone(),
                address: claim.address.clone(),
                namespace: claim.namespace.clone().unwrap_or_default(),
            };
            Ok(ToReconcile {
                lease_ran_out: sqlx::Row::try_get(row, "lease_ran_out")?,
                claim,
                cursor,
            })
        })
        .collect::<Result<_, sqlx::Error>>()
        .map_err(Error::from)
}

/// Every claim at `address` in `scope`, by account then namespace: none,
/// one, or several when `scope` leaves the account or the namespace open
/// and the address is claimed in more than one.
pub async fn find(
    pool: &PgPool,
    address: &str,
    scope: &ScopeFilter<'_>,
) -> Result<Vec<ClaimRow>, Error> {
    let (account, namespace) = scope.params();
    Ok(sqlx::query_as(AssertSqlSafe(find_statement(scope)))
        .bind(account)
        .bind(namespace)
        .bind(address)
        .fetch_all(pool)
        .await?)
}

/// Releases (deletes) the claim in `slot` if it is still pending, and
/// returns it as it was; `None` when there is no pending claim there (it
/// settled, or was released, meanwhile), or when the one there is in doubt
/// in all but its state: made with `on_expiry = "in_doubt"`, its lease run
/// out (its holder may have done the action: [`resolve`] it once you know).
/// The next invocation with its
/// identity runs the action again: release only a claim whose holder is
/// gone. Its [`steps`] are kept: the retry replays the finished ones, and
/// runs only what is left.
pub async fn release_pending(pool: &PgPool, slot: Slot<'_>) -> Result<Option<ClaimRow>, Error> {
    let scope = slot.scope();
    let row = RELEASE_PENDING
        .for_row(scope, slot.address)
        .fetch_optional(pool)
        .await?;
    Ok(row.as_ref().map(ClaimRow::from_row).transpose()?)
}

/// Who resolves a claim, and what they saw of it: [`Resolver::new`], or
/// [`Resolver::OPERATOR`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Resolver<'a> {
    /// Written to `state_reason`: `operator`, `reconciled`, ...
    pub reason: &'a str,
    /// Resolve only while the claim's fence is still this one (the fence
    /// the resolver saw when it decided); `None`: whatever its fence.
    pub expected_fence: Option<i64>,
    /// Resolve only while the claim is still in this state (the state the
    /// resolver saw when it decided: a claim shown pending may go in doubt
    /// at the same fence); `None`: pending or in doubt, whichever it is.
    pub expected_state: Option<ClaimState>,
}

impl Resolver<'static> {
    /// An operator, by hand, whatever the claim's fence: what [`resolve`]
    /// uses.
    pub const OPERATOR: Resolver<'static> = Resolver {
        reason: "operator",
        expected_fence: None,
        expected_state: None,
    };
}

impl<'a> Resolver<'a> {
    /// A resolver that writes `reason` to `state_reason` (`operator`,
    /// `reconciled`, ...), whatever the claim's fence and state.
    pub fn new(reason: &'a str) -> Self {
        Resolver {
            reason,
            expected_fence: None,
            expected_state: None,
        }
    }

    /// Resolve only while the claim's fence is still this one (`Some`: the
    /// fence seen when deciding), or whatever it is (`None`).
    pub fn expected_fence(mut self, fence: impl Into<Option<i64>>) -> Self {
        self.expected_fence = fence.into();
        self
    }

    /// Resolve only while the claim is still in this state (`Some`: the
    /// state seen when deciding), or pending or in doubt, whichever it is
    /// (`None`). What an operator confirmed for a claim pending (its holder
    /// gone) is not what they would confirm for it in doubt: a release of a
    /// claim whose outcome became unknown lets a retry run it again.
    pub fn expected_state(mut self, state: impl Into<Option<ClaimState>>) -> Self {
        self.expected_state = state.into();
        self
    }
}

/// What [`resolve`] did.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Resolved {
    /// The claim was resolved.
    Changed {
        /// The claim as it was just before.
        before: ClaimRow,
        /// Its state now; `None`: deleted (released).
        after: Option<ClaimState>,
    },
    /// No claim is at that address in that scope (never claimed, released,
    /// or pruned).
    Missing,
    /// The claim is neither pending nor in doubt (a success or a kept
    /// failure, or a state of a later version): nothing was changed. Its
    /// state is in the row.
    NotResolvable(ClaimRow),
    /// The claim's fence is no longer the one the resolver expected (it was
    /// taken over, or released and claimed anew): nothing was changed.
    FenceMoved {
        /// The claim as it is now.
        current: ClaimRow,
        /// The fence the resolver expected.
        expected: i64,
    },
    /// The claim is still under the fence the resolver expected, but no
    /// longer in the state it expected (a pending claim went in doubt, say):
    /// nothing was changed.
    StateChanged {
        /// The claim as it is now.
        current: ClaimRow,
        /// The state the resolver expected.
        expected: ClaimState,
    },
    /// The claim is pending and its lease is live: its holder is at work
    /// (it renews the lease, or still may) and can settle it at any moment,
    /// so nothing was changed. A claim whose holder is gone stops renewing:
    /// resolve it once its lease has run out.
    LeaseLive(ClaimRow),
}

/// Why `Outcome::Failed(Disposition::InDoubt)` is refused as a resolution.
const NOT_A_RESOLUTION: &str = "holding a claim in doubt is not a resolution: resolve it as \
     succeeded (Outcome::Succeeded), failed (Outcome::Failed(Disposition::Keep)) or released \
     (Outcome::Failed(Disposition::Release)), or leave it for a reconciler";

/// Resolves the claim in `slot` as an operator would: `state_reason`
/// `operator`, whatever its fence ([`Resolver::OPERATOR`]). See
/// [`resolve_as`].
pub async fn resolve(
    pool: &PgPool,
    slot: Slot<'_>,
    outcome: Outcome<Option<&str>>,
) -> Result<Resolved, Error> {
    resolve_as(pool, slot, outcome, Resolver::OPERATOR).await
}

/// Resolves the claim in `slot` as `outcome` says (a success, a kept
/// failure or a release; [`Disposition::InDoubt`] resolves nothing and is
/// refused, [`Error::Refused`]), only while it is
/// `pending` or `in_doubt` (and, if `resolver` expects them, under that
/// fence and in that state): exactly once, however many resolvers race,
/// and never over a success or a kept failure. A pending claim whose lease
/// is live has a living holder and is never changed
/// ([`Resolved::LeaseLive`]).
///
/// The claim is locked and read, then changed by a statement matched on
/// what was read (its state, its fence), in one transaction: what comes
/// back is exactly what was there and what it became, and a racing
/// resolver, the original holder's late settle, or a retry turning it in
/// doubt, waits for the lock and then finds the claim resolved (or the
/// resolution finds it changed, and changes nothing).
///
/// ```no_run
/// # async fn demo(pool: sqlx::PgPool) -> Result<(), idem_runtime::Error> {
/// use idem_runtime::operations::{self, ClaimState, ListFilter, NamespaceFilter};
/// use idem_runtime::operations::{Resolved, Resolver, ScopeFilter};
/// use idem_runtime::Outcome;
///
/// let filter = ListFilter::new()
///     .scope(ScopeFilter::new().account("acme").namespace(NamespaceFilter::Any))
///     .state(ClaimState::InDoubt)
///     .limit(100);
/// let held = operations::list(&pool, &filter).await?;
/// for claim in &held {
///     // Asked the payment provider: the charge went through.
///     let outcome = Outcome::Succeeded(Some(r#"{"receipt":"r_1"}"#));
///     let by = Resolver::new("reconciled").expected_fence(claim.fence);
///     match operations::resolve_as(&pool, claim.slot(), outcome, by).await? {
///         Resolved::Changed { .. } => {}  // resolved by this call, exactly once
///         _ => {}                         // another resolver, or its holder, got there first
///     }
/// }
/// # Ok(()) }
/// ```
pub async fn resolve_as(
    pool: &PgPool,
    slot: Slot<'_>,
    outcome: Outcome<Option<&str>>,
    resolver: Resolver<'_>,
) -> Result<Resolved, Error> {
    if outcome == Outcome::Failed(Disposition::InDoubt) {
        return Err(Error::Refused(NOT_A_RESOLUTION));
    }
    let scope = slot.scope();
    let mut conn = super::guarded::Guarded::acquire(pool).await?;
    let mut tx = conn.begin().await?;
    let found = LOCK_FOR_RESOLVE
        .for_row(scope, slot.address)
        .fetch_optional(&mut *tx)
        .await?;
    let Some(before) = found.as_ref().map(ClaimRow::from_row).transpose()? else {
        return Ok(Resolved::Missing);
    };
    if !before.state.is_resolvable() {
        return Ok(Resolved::NotResolvable(before));
    }
    if let Some(expected) = resolver.expected_fence
        && expected != before.fence
    {
        return Ok(Resolved::FenceMoved {
            current: before,
            expected,
        });
    }
    if let Some(expected) = resolver.expected_state
        && expected != before.state
    {
        return Ok(Resolved::StateChanged {
            current: before,
            expected,
        });
    }
    // Matched on the state and fence just read, not on any open state: the
    // statement itself changes nothing but what was checked.
    let state = before.state.as_str();
    let statement = match outcome {
        Outcome::Succeeded(output_json) => RESOLVE_SUCCEEDED
            .for_row(scope, slot.address)
            .bind(before.fence)
            .bind(state)
            .bind(output_json)
            .bind(resolver.reason),
        Outcome::Failed(Disposition::Keep) => RESOLVE_FAILED
            .for_row(scope, slot.address)
            .bind(before.fence)
            .bind(state)
            .bind(resolver.reason),
        Outcome::Failed(Disposition::InDoubt) => return Err(Error::Refused(NOT_A_RESOLUTION)),
        Outcome::Failed(Disposition::Release) => RESOLVE_RELEASE
            .for_row(scope, slot.address)
            .bind(before.fence)
            .bind(state),
    };
    // Under the lock, the row is the one just read, its state and fence
    // checked above: only a live lease makes the match miss (the statement
    // decides it, by the database's clock, whatever the listing saw).
    // Nothing is committed then, and the caller hears so.
    if statement.execute(&mut *tx).await?.rows_affected() != 1 {
        return Ok(Resolved::LeaseLive(before));
    }
    tx.commit().await?;
    let after = ClaimState::after(&outcome);
    tracing::info!(
        target: "idem",
        account = slot.account,
        namespace = slot.namespace,
        address = slot.address,
        fence = before.fence,
        from = %before.state,
        to = after.map_or("released", ClaimState::as_str),
        reason = resolver.reason,
        "idem claim resolved"
    );
    Ok(Resolved::Changed { before, after })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_resolution_refuses_a_pending_claim_whose_lease_is_live() {
        for statement in [RESOLVE_SUCCEEDED, RESOLVE_FAILED, RESOLVE_RELEASE] {
            for text in [statement.without_namespace, statement.within_namespace] {
                assert!(text.contains(NO_LIVE_LEASE), "{text}");
            }
        }
    }

    #[test]
    fn every_scope_filter_binds_both_parameters_with_a_type() {
        let named = NamespaceFilter::Named("live");
        for account in [None, Some("acme")] {
            for namespace in [NamespaceFilter::Any, NamespaceFilter::Without, named] {
                let test = scope_test(&ScopeFilter { account, namespace });
                assert!(test.contains("$1") && test.contains("$2"), "{test}");
                assert!(!test.contains("DISTINCT"), "{test}");
            }
        }
    }
}

/// A [step](crate::step()) of a claim's body begun and never recorded: its
/// holder was cut off inside it, and nobody knows what it did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PendingStep {
    /// The step's name, as its body gave it.
    pub name: String,
    /// Its address, `step_` + 24 hex digits.
    pub address: String,
    /// The fence of the holder that began it.
    pub fence: i64,
}

/// The steps of the claim at `slot` begun and never recorded, oldest first.
/// A step whose stored identity no longer reads back as a step's is left
/// out, with a warning.
pub async fn pending_steps(pool: &PgPool, slot: Slot<'_>) -> Result<Vec<PendingStep>, Error> {
    let scope = slot.scope();
    let rows = super::pending_steps(pool, scope, slot.address).await?;
    Ok(rows
        .into_iter()
        .filter_map(|row| {
            let name = crate::identity::split_step_canonical(&row.identity).map(|(_, name)| name);
            if name.is_none() {
                tracing::warn!(
                    target: "idem",
                    account = slot.account,
                    address = %row.address,
                    "a step's identity does not read back; left for an operator"
                );
            }
            Some(PendingStep {
                name: name?.to_owned(),
                address: row.address,
                fence: row.fence,
            })
        })
        .collect())
}

/// Records `step` of the claim at `slot` as finished with `output_json`
/// (its value as JSON text), for someone who found out that it happened: a
/// compare-and-swap on the fence it was begun with. `false`: it is no
/// longer pending under that fence (recorded or removed meanwhile).
pub async fn resolve_step(
    pool: &PgPool,
    slot: Slot<'_>,
    step: &PendingStep,
    output_json: &str,
) -> Result<bool, Error> {
    let scope = slot.scope();
    let claim = slot.address;
    Ok(super::resolve_step(pool, scope, &step.address, step.fence, claim, output_json).await?)
}

/// Removes the marker of `step` of the claim at `slot`, for someone who
/// found out that it did not happen: the next run of the claim's identity
/// runs it. `false`: it is no longer pending under the fence it was begun
/// with.
pub async fn forget_step(pool: &PgPool, slot: Slot<'_>, step: &PendingStep) -> Result<bool, Error> {
    let scope = slot.scope();
    let commit = super::Commit::Durable;
    let claim = slot.address;
    Ok(super::abandon_step(pool, scope, &step.address, step.fence, claim, commit).await?)
}
