//! Every statement that finds a row by its address must be served by one of
//! the two partial unique indexes, in both of its forms: a namespace test
//! folded into `IS NOT DISTINCT FROM`, or a predicate the index's does not
//! imply, would turn each call into a scan of the whole table. This test
//! runs `EXPLAIN` on each, with a NULL and with a named namespace (and on
//! the metering totals, which read a range and must not scan the table).
//!
//! Every statement that lists or counts claims of an open state must be
//! served by the index of open claims (schema v9), whatever scope it is
//! given: without it, each reads every success in the table. Those are
//! checked on a table of settled claims with a few open ones, analyzed, with
//! the planner free to scan, as a production table would be.
//!
//! It needs a PostgreSQL (`DATABASE_URL`, or the local default) and fails
//! when none answers: a skipped check would let a scan ship. It sets the
//! schema up through [`catalog`] in a schema of its own, and drops it after.

use idem::sqlx;
use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use sqlx::{AssertSqlSafe, Executor, PgConnection, Postgres, Row};

use super::browse::{self, Start};
use super::catalog::OPEN_CLAIMS_INDEX;
use super::operations::{self, ClaimState, NamespaceFilter, ScopeFilter};
use super::scratch::Scratch;
use super::{SplitOnNamespace, catalog, claims, metering, ordered, prune, steps};

const ACCOUNT: &str = "acme";
const ADDRESS: &str = "claim_0123456789abcdef01234567";

/// A parameter, typed as the statement binds it.
#[derive(Debug, Clone, Copy)]
enum Param {
    Text(Option<&'static str>),
    Bytes,
    /// A `bytea` bound NULL.
    NullBytes,
    Int(i64),
    /// An `int8` bound NULL.
    NullInt,
    Float(Option<f64>),
    Bool(bool),
    TextArray,
    /// A `text[]` bound NULL.
    NullTextArray,
    BytesArray,
    IntArray,
}

/// What the plan of a statement must show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// It finds a row by address: it scans (or arbitrates its insert on) one
    /// of the two partial unique indexes, and never scans the table.
    PartialUniqueIndex,
    /// It looks nothing up: an insert whose conflicts every unique index
    /// arbitrates (`ON CONFLICT DO NOTHING`), and no scan of the table.
    ArbitratedInsert,
    /// It reads a range, not a row: through some index (which one is the
    /// planner's choice, on an empty table), never a scan of the table.
    SomeIndex,
    /// It finds a claim's steps: through the index of a claim's steps
    /// ([`STEPS_OF_CLAIM_INDEX`]), and any claim it looks up through a
    /// partial unique index; no other index, never a scan of the table. A
    /// release is one: it stamps its claim's steps.
    StepsOfClaim,
    /// It lists or counts open claims: through the index of open claims
    /// ([`OPEN_CLAIMS_INDEX`]), never a scan of the table.
    OpenClaims,
}

/// The index of a claim's steps (schema v7): `(account, claim_address)
/// WHERE kind = 'step'`.
const STEPS_OF_CLAIM_INDEX: &str = "idem_records_steps_of_claim";

/// One statement in one form, with its parameters.
struct Case {
    name: &'static str,
    namespace: Option<&'static str>,
    text: String,
    params: Vec<Param>,
    expect: Expect,
}

/// `$1` account, `$2` address, `$3` namespace, as every per-row statement
/// begins.
fn row_params(namespace: Option<&'static str>) -> Vec<Param> {
    vec![
        Param::Text(Some(ACCOUNT)),
        Param::Text(Some(ADDRESS)),
        Param::Text(namespace),
    ]
}

/// Every statement that finds a row by address, in the form for
/// `namespace`.
fn cases(namespace: Option<&'static str>) -> Vec<Case> {
    use Param::{Bool, Bytes, BytesArray, Int, IntArray, NullInt, Text, TextArray};
    let per_row = |name, statement: &SplitOnNamespace, extra: &[Param], expect| Case {
        name,
        namespace,
        text: statement.for_namespace(namespace).to_owned(),
        params: [row_params(namespace), extra.to_vec()].concat(),
        expect,
    };
    let lookup = Expect::PartialUniqueIndex;
    let output = Text(Some("{}"));
    let reason = Text(Some("operator"));
    // The state the resolution read under its lock.
    let open_state = Text(Some("in_doubt"));
    let scope = ScopeFilter::new()
        .account(Some(ACCOUNT))
        .namespace(namespace.map_or(NamespaceFilter::Without, NamespaceFilter::Named));
    let mut record_params = vec![
        Text(Some(ACCOUNT)),
        TextArray,
        BytesArray,
        TextArray,
        IntArray,
        IntArray,
    ];
    record_params.extend(namespace.map(|name| Text(Some(name))));
    let total_params = vec![Text(Some(ACCOUNT)), Int(0), Int(1), Text(namespace)];
    vec![
        per_row(
            "claim",
            &claims::CLAIM,
            &[
                Bytes,
                Bytes,
                Int(1_000),
                Bool(true),
                Int(1_000),
                Int(1_000),
                Bool(true),
            ],
            lookup,
        ),
        // An ordered event's claim: its own row, its entity's (upserted)
        // and the entity's holder's, each through a partial unique index.
        per_row(
            "claim_ordered",
            &ordered::CLAIM_ORDERED,
            &[
                Bytes,
                Bytes,
                Int(1_000),
                Bool(true),
                Int(1_000),
                Int(1_000),
                Text(Some("claim_fedcba9876543210fedcba98")),
                Bytes,
                Int(7),
                Bool(true),
            ],
            lookup,
        ),
        // A pass of a batch's ordered events, in one statement: per event,
        // its own row, its entity's (upserted) and the holder's.
        Case {
            name: "claim_ordered_batch",
            namespace,
            text: ordered::CLAIM_ORDERED_BATCH
                .for_namespace(namespace)
                .to_owned(),
            params: vec![
                Text(Some(ACCOUNT)),
                TextArray,
                Text(namespace),
                BytesArray,
                BytesArray,
                Int(1_000),
                Int(1_000),
                Int(1_000),
                Bool(true),
                TextArray,
                BytesArray,
                IntArray,
            ],
            expect: lookup,
        },
        // On Citus, an ordered event's claim in routed statements: the
        // take reads the event's row, the entity's and its holder's; the
        // two inserts look nothing up.
        per_row(
            "take_entity_routed",
            &ordered::TAKE_ENTITY_ROUTED,
            &[
                Bool(true),
                Text(Some("claim_fedcba9876543210fedcba98")),
                Bytes,
                Int(7),
            ],
            lookup,
        ),
        per_row(
            "create_entity_routed",
            &ordered::CREATE_ENTITY_ROUTED,
            &[Text(Some("claim_fedcba9876543210fedcba98")), Bytes, Int(7)],
            Expect::ArbitratedInsert,
        ),
        per_row(
            "claim_event_routed",
            &ordered::CLAIM_EVENT_ROUTED,
            &[
                Bytes,
                Bytes,
                Int(1_000),
                Int(1_000),
                Int(1_000),
                Bool(true),
                Text(Some("claim_fedcba9876543210fedcba98")),
                Int(7),
            ],
            Expect::ArbitratedInsert,
        ),
        per_row(
            "claim_routed",
            &claims::CLAIM_ROUTED,
            &[Bytes, Bytes, Int(1_000), Int(1_000), Int(1_000), Bool(true)],
            Expect::ArbitratedInsert,
        ),
        per_row("reopen_expired", &claims::REOPEN_EXPIRED, &[Int(1)], lookup),
        per_row(
            "reopen_expired_steps",
            &claims::REOPEN_EXPIRED_STEPS,
            &[Int(1)],
            Expect::StepsOfClaim,
        ),
        per_row("lookup", &claims::LOOKUP, &[Bool(true)], lookup),
        per_row("settle", &claims::SETTLE.durable, &[Int(1), output], lookup),
        per_row(
            "settle_async",
            &claims::SETTLE.asynchronous,
            &[Int(1), output],
            lookup,
        ),
        // A release stamps its claim's steps, found through their index.
        per_row(
            "release",
            &claims::RELEASE.durable,
            &[Int(1)],
            Expect::StepsOfClaim,
        ),
        per_row(
            "release_async",
            &claims::RELEASE.asynchronous,
            &[Int(1)],
            Expect::StepsOfClaim,
        ),
        per_row("extend", &claims::EXTEND, &[Int(1), Int(1_000)], lookup),
        per_row("keep", &claims::KEEP.durable, &[Int(1), reason], lookup),
        per_row(
            "keep_async",
            &claims::KEEP.asynchronous,
            &[Int(1), reason],
            lookup,
        ),
        per_row(
            "hold_in_doubt",
            &claims::HOLD_IN_DOUBT,
            &[Int(1), reason],
            lookup,
        ),
        per_row("mark_awaited", &claims::MARK_AWAITED, &[Int(1)], lookup),
        per_row(
            "expire_in_doubt",
            &claims::EXPIRE_IN_DOUBT,
            &[Int(1)],
            lookup,
        ),
        per_row(
            "take_over",
            &claims::TAKE_OVER,
            &[Int(1), Int(1_000), Bytes],
            lookup,
        ),
        per_row(
            "settle_over",
            &claims::SETTLE_OVER,
            &[Int(1), output, Bytes],
            lookup,
        ),
        per_row(
            "settle_own_hold",
            &claims::SETTLE_OWN_HOLD,
            &[Int(1), output, Bytes],
            lookup,
        ),
        per_row(
            "settle_vacant",
            &claims::SETTLE_VACANT,
            &[
                Bytes,
                Bytes,
                output,
                NullInt,
                Int(60_000_000),
                Text(Some("claim_fedcba9876543210fedcba98")),
                Int(7),
            ],
            Expect::ArbitratedInsert,
        ),
        Case {
            name: "metering record",
            namespace,
            text: metering::RECORD.for_namespace(namespace).to_owned(),
            params: record_params,
            expect: lookup,
        },
        Case {
            name: "metering totals",
            namespace,
            text: metering::TOTALS.for_namespace(namespace).to_owned(),
            params: total_params.clone(),
            expect: Expect::SomeIndex,
        },
        Case {
            name: "metering total of a meter",
            namespace,
            text: metering::TOTAL_OF_METER.for_namespace(namespace).to_owned(),
            params: [total_params, vec![Text(Some("api_calls"))]].concat(),
            expect: Expect::SomeIndex,
        },
        Case {
            name: "operations show",
            namespace,
            text: operations::find_statement(&scope),
            params: vec![Text(Some(ACCOUNT)), Text(namespace), Text(Some(ADDRESS))],
            expect: lookup,
        },
        per_row(
            "operations release",
            &operations::RELEASE_PENDING,
            &[],
            Expect::StepsOfClaim,
        ),
        per_row(
            "operations lock for resolve",
            &operations::LOCK_FOR_RESOLVE,
            &[],
            lookup,
        ),
        per_row(
            "operations resolve succeeded",
            &operations::RESOLVE_SUCCEEDED,
            &[Int(1), open_state, output, reason],
            lookup,
        ),
        per_row(
            "operations resolve failed",
            &operations::RESOLVE_FAILED,
            &[Int(1), open_state, reason],
            lookup,
        ),
        per_row(
            "operations resolve release",
            &operations::RESOLVE_RELEASE,
            &[Int(1), open_state],
            Expect::StepsOfClaim,
        ),
        // `$2` is the claim's address here.
        per_row(
            "operations steps of a claim",
            &operations::STEPS_OF_CLAIM,
            &[],
            Expect::StepsOfClaim,
        ),
        // The same for a run's read of its claim's steps.
        per_row(
            "steps for replay",
            &steps::STEPS_FOR_REPLAY,
            &[Int(1)],
            Expect::StepsOfClaim,
        ),
        // The same for the reconciler's steps in doubt.
        per_row(
            "pending steps of a claim",
            &steps::PENDING_STEPS,
            &[],
            Expect::StepsOfClaim,
        ),
    ]
    .into_iter()
    .chain(prune_cases(namespace))
    .collect()
}

/// The statements of steps inside one claim, in the form for `namespace`:
/// each finds a step, and its claim, by address.
///
/// Checked on a table with steps in it and statistics taken
/// ([`PLANT_STEPS`]), not on the empty one the other cases are: there, the
/// planner finds the index of a claim's steps (`(account, claim_address)
/// WHERE kind = 'step'`, whose predicate a step's lookup implies) as cheap
/// as the partial unique index, and picks it, with only `account` as its
/// condition: every step of the account read for each lookup, as long as
/// the table has never been analyzed.
fn step_cases(namespace: Option<&'static str>) -> Vec<Case> {
    use Param::{Bytes, Int, Text};
    let per_row = |name, statement: &SplitOnNamespace, extra: &[Param], expect| Case {
        name,
        namespace,
        text: statement.for_namespace(namespace).to_owned(),
        params: [row_params(namespace), extra.to_vec()].concat(),
        expect,
    };
    let lookup = Expect::PartialUniqueIndex;
    let claim = Text(Some(ADDRESS));
    vec![
        per_row(
            "begin step",
            &steps::BEGIN_STEP,
            &[Bytes, Int(1), claim],
            Expect::ArbitratedInsert,
        ),
        per_row("lookup step", &steps::LOOKUP_STEP, &[claim], lookup),
        per_row(
            "record step",
            &steps::RECORD_STEP.durable,
            &[Int(1), Text(Some("{}")), claim],
            lookup,
        ),
        per_row(
            "record step async",
            &steps::RECORD_STEP.asynchronous,
            &[Int(1), Text(Some("{}")), claim],
            lookup,
        ),
        per_row(
            "abandon step",
            &steps::ABANDON_STEP.durable,
            &[Int(1), claim],
            lookup,
        ),
        per_row(
            "abandon step async",
            &steps::ABANDON_STEP.asynchronous,
            &[Int(1), claim],
            lookup,
        ),
        per_row(
            "resolve step",
            &steps::RESOLVE_STEP,
            &[Int(1), Text(Some("{}")), claim],
            lookup,
        ),
        per_row(
            "record unmarked step",
            &steps::RECORD_UNMARKED_STEP.durable,
            &[Bytes, Int(1), claim, Text(Some("{}"))],
            Expect::ArbitratedInsert,
        ),
        per_row(
            "record unmarked step async",
            &steps::RECORD_UNMARKED_STEP.asynchronous,
            &[Bytes, Int(1), claim, Text(Some("{}"))],
            Expect::ArbitratedInsert,
        ),
    ]
}

/// Steps and claims in the table, analyzed, for [`step_cases`]: a few
/// thousand steps of one account, three to a claim.
const PLANT_STEPS: &str = "\
    INSERT INTO idem_records (account, kind, address, state, identity, claim_address) \
    SELECT 'acme', 'step', 'step_' || lpad(to_hex(g), 24, '0'), 'success', '\\x00', \
           'claim_' || lpad(to_hex(g / 3), 24, '0') \
    FROM generate_series(1, 3000) AS g; \
    INSERT INTO idem_records (account, kind, address, state, identity) \
    SELECT 'acme', 'claim', 'claim_' || lpad(to_hex(g), 24, '0'), 'success', '\\x00' \
    FROM generate_series(1, 1000) AS g; \
    ANALYZE idem_records";

/// The statements of a batched prune in the lane of claims of `namespace`'s
/// form, walking by account and across accounts: each reads a range of that
/// lane's partial unique index, so a batch never scans the table. Then the
/// lane of steps whose claim is gone, and the deletion of a batch's claims'
/// steps: each through the index of a claim's steps.
fn prune_cases(namespace: Option<&'static str>) -> Vec<Case> {
    use Param::Text;
    let lane = match namespace {
        None => &prune::WITHOUT_NAMESPACE,
        Some(_) => &prune::WITHIN_NAMESPACE,
    };
    let mut cases = lane_cases(lane, namespace, Expect::PartialUniqueIndex);
    // The steps whose claim is gone have a lane of their own, through the
    // index of a claim's steps, whose position has no namespace: checked
    // once, with the claims' lane without one.
    if namespace.is_none() {
        cases.extend(lane_cases(&prune::ORPHAN_STEPS, None, Expect::StepsOfClaim));
    }
    let addresses = Param::TextArray;
    let namespaces = match namespace {
        None => Param::NullTextArray,
        Some(_) => Param::TextArray,
    };
    let steps_of_pruned = &prune::STEPS_OF_PRUNED;
    cases.extend([
        Case {
            name: "prune the steps of pruned claims, by account",
            namespace,
            text: steps_of_pruned
                .by_account
                .for_namespace(namespace)
                .to_owned(),
            params: vec![Text(Some(ACCOUNT)), addresses, namespaces],
            expect: Expect::StepsOfClaim,
        },
        Case {
            name: "prune the steps of pruned claims, across accounts",
            namespace,
            text: steps_of_pruned.across.for_namespace(namespace).to_owned(),
            params: vec![Param::TextArray, addresses, namespaces],
            expect: Expect::StepsOfClaim,
        },
    ]);
    cases
}

/// The statements that walk `lane` by account and across accounts, for
/// rows of `namespace`'s form, each expected to be served as `expect` says.
fn lane_cases(lane: &prune::Lane, namespace: Option<&'static str>, expect: Expect) -> Vec<Case> {
    use Param::{Int, Text};
    let position = vec![Text(Some(ACCOUNT)), Text(Some(ADDRESS)), Text(namespace)];
    let case = |name, text: &str, params: Vec<Param>| Case {
        name,
        namespace,
        text: text.to_owned(),
        params,
        expect,
    };
    let mut cases = vec![
        case("prune first account", lane.first_account, vec![]),
        case(
            "prune next account",
            lane.next_account,
            vec![Text(Some(ACCOUNT))],
        ),
    ];
    for (walk, walker, end_account) in [
        ("by account", &lane.by_account, None),
        ("across accounts", &lane.across, Some(ACCOUNT)),
    ] {
        cases.extend([
            case(
                walk,
                walker.window_end,
                [position.clone(), vec![Int(9_999)]].concat(),
            ),
            case(
                walk,
                walker.delete_window,
                [
                    position.clone(),
                    vec![
                        Text(end_account),
                        Text(Some(ADDRESS)),
                        Text(namespace),
                        Int(0),
                    ],
                ]
                .concat(),
            ),
            case(
                walk,
                walker.delete_rest,
                [
                    position.clone(),
                    vec![Text(None), Text(None), Text(None), Int(0)],
                ]
                .concat(),
            ),
        ]);
    }
    cases
}

/// Every statement that lists or counts claims of an open state, in the
/// form for `namespace`: of one account, and (`namespace` `None`) of every
/// account and every namespace too.
fn open_claims_cases(namespace: Option<&'static str>) -> Vec<Case> {
    use Param::{BytesArray, Float, Int, NullBytes, NullInt, Text};
    let scopes = {
        let of_account = ScopeFilter::new()
            .account(Some(ACCOUNT))
            .namespace(namespace.map_or(NamespaceFilter::Without, NamespaceFilter::Named));
        let mut scopes = vec![(of_account, Text(Some(ACCOUNT)))];
        if namespace.is_none() {
            scopes.push((
                ScopeFilter::new()
                    .account(None)
                    .namespace(NamespaceFilter::Any),
                Text(None),
            ));
        }
        scopes
    };
    let case = |name, text: String, params: Vec<Param>| Case {
        name,
        namespace,
        text,
        params,
        expect: Expect::OpenClaims,
    };
    let mut cases = Vec::new();
    for (scope, account) in scopes {
        let scope_params = vec![account, Text(namespace)];
        let age = Float(Some(60.0));
        let cursor = vec![Text(Some(ACCOUNT)), Text(Some(ADDRESS)), Text(namespace)];
        cases.extend([
            case(
                "reconciler's listing",
                operations::reconcile_statement(&scope),
                [
                    scope_params.clone(),
                    vec![BytesArray, age, Text(None)],
                    vec![Text(None), Text(None), Text(None), Int(100)],
                ]
                .concat(),
            ),
            case(
                "claims list --state in_doubt",
                operations::list_statement(&scope, Some(ClaimState::InDoubt)),
                [
                    scope_params.clone(),
                    vec![Text(Some("in_doubt")), Float(None), Int(100)],
                ]
                .concat(),
            ),
            case(
                "claims list --count --state pending",
                operations::count_statement(&scope, Some(ClaimState::Pending)),
                [scope_params.clone(), vec![Text(Some("pending")), age]].concat(),
            ),
            case(
                "console: first page of claims in doubt",
                browse::oldest_first_page(&scope, "in_doubt", Start::First),
                [
                    scope_params.clone(),
                    vec![NullBytes, Float(None), NullInt],
                    vec![Text(None), Text(None), Text(None), Int(51)],
                ]
                .concat(),
            ),
            case(
                "console: a later page of failed claims",
                browse::oldest_first_page(&scope, "failed", Start::AfterWithout),
                [
                    scope_params.clone(),
                    vec![NullBytes, age, Int(1_000_000)],
                    cursor.clone(),
                    vec![Int(51)],
                ]
                .concat(),
            ),
        ]);
    }
    if namespace.is_none() {
        cases.extend([
            case(
                "console: open claims counted",
                browse::OPEN_COUNTS.to_owned(),
                vec![Int(500), Text(None)],
            ),
            case(
                "console: open claims of an account counted",
                browse::OPEN_COUNTS.to_owned(),
                vec![Int(500), Text(Some(ACCOUNT))],
            ),
            case(
                "console: open claims totalled",
                browse::OPEN_TOTALS.to_owned(),
                vec![Text(None)],
            ),
            case(
                "console: open claims of an account totalled",
                browse::OPEN_TOTALS.to_owned(),
                vec![Text(Some(ACCOUNT))],
            ),
        ]);
        #[cfg(feature = "metrics")]
        cases.extend([
            case(
                "gauges of every account",
                super::gauges::GAUGES_EVERY_ACCOUNT.to_owned(),
                vec![Float(Some(60.0))],
            ),
            case(
                "gauges of an account",
                super::gauges::GAUGES_ONE_ACCOUNT.to_owned(),
                vec![Float(Some(60.0)), Text(Some(ACCOUNT))],
            ),
        ]);
    }
    cases
}

/// Settled claims of a few accounts, some in a namespace, with a few open
/// ones among them, analyzed, for [`open_claims_cases`]: the proportions of
/// a table in use, where the successes are nearly every row.
const PLANT_CLAIMS: &str = "\
    INSERT INTO idem_records (account, kind, address, namespace, state, identity, created_at) \
    SELECT CASE WHEN g % 4 = 0 THEN 'acme' ELSE 'tenant_' || (g % 40) END, 'claim', \
           'claim_' || lpad(to_hex(g), 24, '0'), CASE WHEN g % 5 = 0 THEN 'live' END, \
           CASE WHEN g % 1000 = 1 THEN 'in_doubt' WHEN g % 1000 = 2 THEN 'pending' \
                WHEN g % 1000 = 3 THEN 'failed' ELSE 'success' END, \
           '\\x00', now() - g * interval '1 second' \
    FROM generate_series(10000, 60000) AS g; \
    ANALYZE idem_records";

fn bind<'q>(
    mut query: Query<'q, Postgres, PgArguments>,
    params: &[Param],
) -> Query<'q, Postgres, PgArguments> {
    for param in params {
        query = match *param {
            Param::Text(text) => query.bind(text),
            Param::Bytes => query.bind(&b"\x00"[..]),
            Param::NullBytes => query.bind(None::<Vec<u8>>),
            Param::Int(n) => query.bind(n),
            Param::NullInt => query.bind(None::<i64>),
            Param::Float(x) => query.bind(x),
            Param::Bool(b) => query.bind(b),
            Param::TextArray => query.bind(vec![ADDRESS.to_owned()]),
            Param::NullTextArray => query.bind(None::<Vec<String>>),
            Param::BytesArray => query.bind(vec![vec![0_u8]]),
            Param::IntArray => query.bind(vec![1_i64]),
        };
    }
    query
}

/// What a plan in text form touches.
#[derive(Debug, Default)]
struct Plan {
    /// The indexes it scans, or names as its insert's conflict arbiters.
    indexes: Vec<String>,
    /// It scans a table sequentially.
    sequential: bool,
    /// It inserts with `ON CONFLICT`.
    on_conflict: bool,
}

fn read_plan(lines: &[String]) -> Plan {
    let mut plan = Plan::default();
    for line in lines {
        plan.sequential |= line.contains("Seq Scan");
        plan.on_conflict |= line.contains("Conflict Resolution:");
        for marker in [
            "Index Scan using ",
            "Index Scan Backward using ",
            "Index Only Scan using ",
            "Index Only Scan Backward using ",
            "Bitmap Index Scan on ",
        ] {
            if let Some((_, rest)) = line.split_once(marker) {
                plan.indexes
                    .extend(rest.split_whitespace().next().map(str::to_owned));
            }
        }
        if let Some((_, arbiters)) = line.split_once("Conflict Arbiter Indexes: ") {
            plan.indexes
                .extend(arbiters.split(", ").map(|name| name.trim().to_owned()));
        }
    }
    plan
}

/// Why `case`'s plan falls short, if it does.
async fn shortfall(conn: &mut PgConnection, case: &Case) -> Option<String> {
    let what = format!("{} ({:?})", case.name, case.namespace);
    let explain = format!("EXPLAIN {}", case.text);
    let lines: Vec<String> = match bind(sqlx::query(AssertSqlSafe(explain)), &case.params)
        .fetch_all(&mut *conn)
        .await
    {
        Ok(rows) => rows.iter().map(|row| row.get(0)).collect(),
        Err(error) => return Some(format!("EXPLAIN {what}: {error}")),
    };
    let plan = read_plan(&lines);
    let shown = lines.join("\n");
    if plan.sequential {
        return Some(format!("{what} scans the table:\n{shown}"));
    }
    match case.expect {
        Expect::PartialUniqueIndex if plan.indexes.is_empty() => {
            return Some(format!("{what} uses no index:\n{shown}"));
        }
        Expect::ArbitratedInsert if !plan.on_conflict => {
            return Some(format!("{what} is not an ON CONFLICT insert:\n{shown}"));
        }
        Expect::SomeIndex if plan.indexes.is_empty() => {
            return Some(format!("{what} uses no index:\n{shown}"));
        }
        Expect::SomeIndex => return None,
        Expect::OpenClaims if plan.indexes.iter().any(|i| i == OPEN_CLAIMS_INDEX) => {
            return None;
        }
        Expect::OpenClaims => {
            return Some(format!("{what} does not use {OPEN_CLAIMS_INDEX}:\n{shown}"));
        }
        Expect::StepsOfClaim if !plan.indexes.iter().any(|i| i == STEPS_OF_CLAIM_INDEX) => {
            return Some(format!(
                "{what} does not use {STEPS_OF_CLAIM_INDEX}:\n{shown}"
            ));
        }
        _ => {}
    }
    for index in &plan.indexes {
        if case.expect == Expect::StepsOfClaim && index == STEPS_OF_CLAIM_INDEX {
            continue;
        }
        let definition: Result<String, _> =
            sqlx::query_scalar("SELECT pg_get_indexdef(to_regclass($1))")
                .bind(index)
                .fetch_one(&mut *conn)
                .await;
        let definition = match definition {
            Ok(definition) => definition,
            Err(error) => return Some(format!("the definition of {index}: {error}")),
        };
        let partial_unique = definition.starts_with("CREATE UNIQUE INDEX")
            && (definition.ends_with("WHERE (namespace IS NULL)")
                || definition.ends_with("WHERE (namespace IS NOT NULL)"));
        if !partial_unique {
            return Some(format!("{what} uses {definition}:\n{shown}"));
        }
    }
    None
}

/// Why a batch of the prune's walk in heap order is not bounded work, if it
/// is not: where the server can scan a range of heap pages (PostgreSQL 14
/// and later) the batch must be such a scan, never a scan of the whole
/// table; where it cannot, the walk must not be chosen.
async fn heap_walk_shortfall(conn: &mut PgConnection) -> Option<String> {
    let version: i32 =
        match sqlx::query_scalar("SELECT current_setting('server_version_num')::int4")
            .fetch_one(&mut *conn)
            .await
        {
            Ok(version) => version,
            Err(error) => return Some(format!("the server's version: {error}")),
        };
    if !prune::heap_walk_possible(version) {
        // PostgreSQL 12 and 13: the walk goes through the indexes, whose
        // statements the cases above checked.
        return (version >= 140_000).then(|| format!("version {version} could walk the heap"));
    }
    let explain = format!("EXPLAIN {}", prune::DELETE_HEAP_PAGES);
    let lines: Vec<String> = match sqlx::query(AssertSqlSafe(explain))
        .bind(0_i64)
        .bind(200_i64)
        .bind(0_i64)
        .fetch_all(&mut *conn)
        .await
    {
        Ok(rows) => rows.iter().map(|row| row.get(0)).collect(),
        Err(error) => return Some(format!("EXPLAIN the prune's heap batch: {error}")),
    };
    let shown = lines.join("\n");
    let ranged = lines.iter().any(|line| line.contains("Tid Range Scan"));
    let scans = lines.iter().any(|line| line.contains("Seq Scan"));
    (!ranged || scans).then(|| format!("the prune's heap batch is not a TID range scan:\n{shown}"))
}

#[tokio::test]
async fn every_statement_that_finds_a_row_by_address_uses_a_partial_unique_index() {
    let mut scratch = Scratch::new("idem_index_use").await;
    let conn = &mut scratch.conn;

    let mut failures = Vec::new();
    match catalog::set_up(&mut *conn).await {
        Err(error) => failures.push(format!("set the schema up: {error}")),
        Ok(()) => {
            // Not to force an index: a scan is still chosen when no index
            // can serve the statement. It keeps a small table from being
            // scanned merely because that is cheaper.
            conn.execute("SET enable_seqscan = off")
                .await
                .expect("set enable_seqscan");
            for namespace in [None, Some("live")] {
                for case in cases(namespace) {
                    failures.extend(shortfall(&mut *conn, &case).await);
                }
            }
            failures.extend(heap_walk_shortfall(&mut *conn).await);
            match conn.execute(PLANT_STEPS).await {
                Err(error) => failures.push(format!("plant steps: {error}")),
                Ok(_) => {
                    for namespace in [None, Some("live")] {
                        for case in step_cases(namespace) {
                            failures.extend(shortfall(&mut *conn, &case).await);
                        }
                    }
                }
            }
            // The planner may scan here: the index must be its own choice.
            match conn
                .execute(AssertSqlSafe(format!(
                    "RESET enable_seqscan; {PLANT_CLAIMS}"
                )))
                .await
            {
                Err(error) => failures.push(format!("plant claims: {error}")),
                Ok(_) => {
                    for namespace in [None, Some("live")] {
                        for case in open_claims_cases(namespace) {
                            failures.extend(shortfall(&mut *conn, &case).await);
                        }
                    }
                }
            }
        }
    }
    scratch.drop().await;
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
