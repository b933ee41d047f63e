//! Ordered events: the claim of an event that belongs to an entity and has
//! an order (`Guard::ordered`), and what its outcomes do to the entity.
//!
//! An entity is a row of its own (`kind = 'entity'`, schema version 12) at
//! its own address, in the event's account and namespace, found through the
//! same two partial unique indexes as every claim. It says which event
//! holds it (`held_by`, with that event's `event_order`: one that
//! runs, or may have run) and the newest order applied (`applied_order`).
//! An event's claim row names its entity (`entity`) and its order.
//!
//! **Why a row, upserted.** Under READ COMMITTED a statement reads the
//! table as of its start, so two events of one entity claimed at the same
//! instant would each see the other's claim missing. `INSERT ... ON
//! CONFLICT DO UPDATE` is the one read PostgreSQL makes of a row's latest
//! version: it locks the entity's row (waiting for a transaction that holds
//! it) and evaluates its update on what is committed now. So the entity
//! row decides, one event at a time, and in the same statement the event's
//! own claim is inserted only if it took the entity.
//!
//! **What each outcome does.** The hold is judged from the holder's claim
//! row when the next event of the entity comes, so no outcome statement
//! has to touch the entity (a settle costs what it did):
//! - a success (a settle, a late success, a reconciler's or an operator's)
//!   is applied: the next claim folds the holder's order into
//!   `applied_order` and frees the hold;
//! - a kept failure is not applied: the next claim frees the hold and
//!   `applied_order` stays;
//! - pending or in doubt holds the entity: every other event of it is
//!   refused as in flight, never run beside it, until its outcome is in
//!   (a lease that runs out leaves the hold with the event, whose own
//!   retry takes its claim over);
//! - a release (the holder's, an operator's, a reconciler's) deletes the
//!   claim row, and frees the hold in the same statement
//!   (`stamping_released_steps!`): a row that is gone cannot be told apart
//!   from one inserted after the statement's snapshot, so a claim that
//!   finds its holder's row missing takes it as still held;
//! - a claim inside the caller's transaction that rolls back takes the
//!   entity's change back with it;
//! - a success recorded into the event's vacant slot, after its claim was
//!   released under it, is folded into the entity by that statement
//!   (`SETTLE_VACANT`), since no later claim reads that row as a holder's;
//! - a prune passes over a claim its entity still names
//!   (`not_holding_an_entity!`), for the same reason a release frees it.
//!
//! The holder's row is read with the statement's snapshot, so a success
//! committed after it was taken reads as pending: the event is refused as
//! in flight, a retry then sees the success. Never the other way. A claim
//! whose snapshot predates the entity's holder (it waited for the
//! entity's lock) says so (`stale`), and is asked again at once.
//!
//! **On Citus** ([`Engine::Citus`](super::Engine::Citus)) the one statement does not run at all:
//! Citus plans its two inserting CTEs as steps on the coordinator, and the
//! upsert's look at the holder's row, sent to the worker inside the entity's
//! `ON CONFLICT` clause, names the distributed table, which a worker refuses
//! ("cannot execute a distributed query from a query on a shard"). Citus
//! routes an `UPDATE` (or a `SELECT` whose CTEs update) whose rows are all
//! in one account, and an `INSERT ... VALUES` without CTEs or subqueries, to
//! the account's worker whole, so the claim is said there in routed
//! statements, one transaction: [`TAKE_ENTITY_ROUTED`] looks for the
//! event's own row and, when there is none, updates the entity row as the
//! upsert would ([`CLAIM_ORDERED`]'s `DO UPDATE`: an `UPDATE` under READ
//! COMMITTED also locks the row and re-reads its latest version);
//! [`CREATE_ENTITY_ROUTED`] inserts an entity that is not there yet (then
//! the take is said again if another claim inserted it first); and
//! [`CLAIM_EVENT_ROUTED`] inserts the event's claim once it took its
//! entity. The entity is taken and the event claimed in one commit, as on
//! PostgreSQL, so no entity is ever held by a claim that was never made:
//! on the gate's pool the claim opens its own transaction (two round trips
//! more than the statements: `BEGIN` and `COMMIT`); inside the caller's
//! transaction it is the caller's commit.

use sqlx::postgres::PgRow;
use sqlx::{Connection, FromRow, PgConnection, Row};

use super::claims::{ClaimAnswer, Existing, KeptValue, NewClaim, Within, existing_columns};
use super::{Scope, SplitOnNamespace};

/// The entity and order of an event's claim (`Guard::ordered`).
#[derive(Debug, Clone, Copy)]
pub struct OrderedBy<'a> {
    /// The entity's address (`Identity::address` of the entity's identity).
    pub entity: &'a str,
    /// The entity identity's canonical encoding: a colliding address of
    /// another entity is refused, never shared.
    pub entity_identity: &'a [u8],
    /// The event's order: greater is newer.
    pub order: i64,
}

/// What taking an entity writes (the `SET` of [`CLAIM_ORDERED`]'s
/// `ON CONFLICT DO UPDATE` and of [`TAKE_ENTITY_ROUTED`]'s `UPDATE`, on the
/// entity row `e`), one text for both so that the two engines decide
/// alike: the holder's claim row is read once (`$holder_namespace_test`;
/// `OFFSET 0` fences the subquery, which the planner would otherwise
/// inline into each of the five places its state is used: five probes of
/// the holder's row per claim, measured with `EXPLAIN (ANALYZE, BUFFERS)`),
/// a succeeded holder's order is folded into `applied_order`, and
/// the event (`$event`, its `$order` and its entity's `$identity`, as the
/// statement has them) takes the entity when it is free (no holder, or a
/// holder settled or kept failed) and nothing newer than it was applied;
/// else the entity is left held, its fold written all the same.
macro_rules! taking_the_entity {
    ($event:literal, $order:literal, $identity:literal, $holder_namespace_test:literal) => {
        concat!(
            "(held_by, event_order, applied_order) = ( \
             SELECT CASE WHEN takes THEN ",
            $event,
            "            WHEN holder IN ('success', 'failed') THEN NULL \
                         ELSE e.held_by END, \
                    CASE WHEN takes THEN ",
            $order,
            "            WHEN holder IN ('success', 'failed') THEN NULL \
                         ELSE e.event_order END, \
                    folded \
             FROM (SELECT folded, holder, \
                          e.identity = ",
            $identity,
            "             AND (e.held_by IS NULL OR holder IN ('success', 'failed')) \
                          AND coalesce(folded <= ",
            $order,
            ", true) AS takes \
                   FROM (SELECT holder, \
                                CASE WHEN holder = 'success' \
                                     THEN greatest(e.applied_order, e.event_order) \
                                     ELSE e.applied_order END AS folded \
                         FROM (SELECT (SELECT h.state FROM idem_records h \
                                       WHERE h.account = $1 AND h.kind = 'claim' \
                                         AND h.address = e.held_by AND ",
            $holder_namespace_test,
            ") AS holder OFFSET 0) AS held) AS judged) AS decided)"
        )
    };
}

/// The text of [`CLAIM_ORDERED`] with its namespace tests: of the event's
/// row and of the holder's (`$namespace_test`), of the entity's conflict
/// target (`$conflict_target`).
///
/// `existing` looks for the event's own row first, as [`CLAIM`]'s does: a
/// duplicate of an event is answered by its own slot (done, in flight, in
/// doubt), and the entity is not touched. Otherwise `taken` upserts the
/// entity: a new entity is held by this event at once; an existing one is
/// taken when it is free (no holder, or a holder whose claim row reads
/// settled or kept failed) and nothing newer than this event was applied
/// (`applied_order`, with a succeeded holder's order folded in, at most
/// `$12`), and is otherwise left held (its fold written all the same).
/// `RETURNING` reads the row the update wrote, from its latest version, so
/// what it says is current: whether this event holds it, what was
/// applied, whether the identity is the entity's. Then `claimed` inserts
/// the event's claim if this event holds the entity, arbitrated by the
/// partial unique indexes as every claim is.
///
/// `stale` says that the entity's holder changed after the statement's
/// snapshot was taken (or the entity was made after it): the holder's row
/// was read from that snapshot, so "held" may be the past (a claim that
/// waited on a transaction holding the entity reads it as it was before
/// the wait), and the caller asks again with a new statement.
///
/// The final select returns one row: the claim won; the event's own row;
/// or, when the entity was not taken, what the entity says. None at all
/// when the claim's insert met a row it cannot see ([`ClaimAnswer::Hidden`]).
///
/// [`CLAIM`]: super::claims::CLAIM
macro_rules! claim_ordered_statement {
    ($namespace_test:literal, $holder_namespace_test:literal, $entity_namespace_test:literal,
     $conflict_target:literal) => {
        concat!(
            "WITH existing AS ( \
                 SELECT ",
            existing_columns!(),
            ", CASE WHEN $7 THEN coalesce(output_json, output::text) END AS output \
                 FROM idem_records \
                 WHERE account = $1 AND kind = 'claim' AND address = $2 AND ",
            $namespace_test,
            " ), taken AS ( \
                 INSERT INTO idem_records AS e \
                   (account, kind, address, namespace, state, identity, held_by, event_order) \
                 SELECT $1, 'entity', $10, $3, 'entity', $11, $2, $12 \
                 WHERE NOT EXISTS (SELECT FROM existing) \
                 ON CONFLICT ",
            $conflict_target,
            " DO UPDATE SET ",
            taking_the_entity!(
                "EXCLUDED.held_by",
                "EXCLUDED.event_order",
                "EXCLUDED.identity",
                $holder_namespace_test
            ),
            " RETURNING held_by IS NOT DISTINCT FROM $2 \
                           AND event_order IS NOT DISTINCT FROM $12 AS took, \
                           applied_order, identity = $11 AS same_entity, \
                           NOT EXISTS (SELECT FROM idem_records x \
                                       WHERE x.account = $1 AND x.kind = 'entity' \
                                         AND x.address = $10 AND ",
            $entity_namespace_test,
            " AND x.held_by IS NOT DISTINCT FROM e.held_by) AS stale \
             ), claimed AS ( \
                 INSERT INTO idem_records \
                   (account, kind, address, namespace, state, identity, fingerprint, \
                    lease_expires_at, value_kept_for, slot_kept_for, entity, event_order, \
                    expires_in_doubt) \
                 SELECT $1, 'claim', $2, $3, 'pending', $4, $5, \
                        now() + $6 * interval '1 microsecond', \
                        $8 * interval '1 microsecond', $9 * interval '1 microsecond', $10, $12, \
                        $13 \
                 WHERE EXISTS (SELECT FROM taken WHERE took) \
                 ON CONFLICT DO NOTHING \
                 RETURNING fence \
             ) \
             SELECT true AS won, fence, NULL::bigint AS lineage, NULL::boolean AS settled, \
                    NULL::text AS state, NULL::bytea AS identity, NULL::bytea AS fingerprint, \
                    NULL::boolean AS lease_expired, NULL::boolean AS expires_in_doubt, \
                    NULL::boolean AS resolved, \
                    NULL::text AS reason, NULL::text AS output, NULL::boolean AS slot_expired, \
                    NULL::boolean AS value_expired, NULL::boolean AS windowed, \
                    NULL::boolean AS entity_refused, NULL::bigint AS applied_order, \
                    NULL::boolean AS same_entity, NULL::boolean AS stale \
             FROM claimed \
             UNION ALL \
             SELECT false, fence, lineage, settled, state, identity, fingerprint, lease_expired, \
                    expires_in_doubt, resolved, reason, output, slot_expired, value_expired, \
                    windowed, false, NULL, NULL, NULL \
             FROM existing \
             UNION ALL \
             SELECT false, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, \
                    NULL, NULL, NULL, true, applied_order, same_entity, stale \
             FROM taken WHERE NOT took"
        )
    };
}

/// Claims an event's slot and takes its entity, or says why not, in one
/// statement (see `claim_ordered_statement!`). `$1`–`$9` as
/// [`CLAIM`](super::claims::CLAIM)'s; `$10` the entity's address, `$11`
/// its identity, `$12` the event's order, `$13` as `CLAIM`'s `$10`.
/// Index: the partial unique index of its form, for the event's row, the
/// entity's and its holder's.
pub const CLAIM_ORDERED: SplitOnNamespace = SplitOnNamespace {
    without_namespace: claim_ordered_statement!(
        "namespace IS NULL AND $3::text IS NULL",
        "h.namespace IS NULL AND $3::text IS NULL",
        "x.namespace IS NULL AND $3::text IS NULL",
        "(account, kind, address) WHERE namespace IS NULL"
    ),
    within_namespace: claim_ordered_statement!(
        "namespace = $3",
        "h.namespace = $3",
        "x.namespace = $3",
        "(account, kind, address, namespace) WHERE namespace IS NOT NULL"
    ),
};

/// The text of [`CLAIM_ORDERED_BATCH`] with its namespace tests: of an
/// event's own row (`$namespace_test`), of a holder's
/// (`$holder_namespace_test`), of the entities' conflict target
/// (`$conflict_target`).
///
/// `fresh` keeps the events whose own row is not there (a duplicate is
/// answered by its own slot, and its entity is not touched), each looked
/// up through a `LATERAL ... LIMIT 1`, which the planner cannot turn into
/// a join: as `NOT EXISTS`, on statistics never taken it read the whole
/// account's index into an anti-join for every batch (4.3 s for 100
/// events on 300,000 rows, measured), as `per_batch!`'s module docs warn; `taken`
/// upserts their entities, in address order (so that overlapping batches
/// lock them in one order), each taken or left held as
/// [`CLAIM_ORDERED`]'s `DO UPDATE` decides ([`taking_the_entity!`]); then
/// the claim of each event that took its entity is inserted, arbitrated by
/// the partial unique indexes. The events it returns are won; any other
/// (held, superseded, a collision, a stale view, its own row) is asked
/// again alone, by [`CLAIM_ORDERED`], which says why.
macro_rules! claim_ordered_batch_statement {
    ($namespace_test:literal, $holder_namespace_test:literal, $conflict_target:literal) => {
        concat!(
            "WITH fresh AS ( \
                 SELECT item.* \
                 FROM unnest($2::text[], $4::bytea[], $5::bytea[], $10::text[], $11::bytea[], \
                             $12::bigint[]) \
                      AS item(address, identity, fingerprint, entity, entity_identity, \
                              event_order) \
                 LEFT JOIN LATERAL (SELECT true AS found FROM idem_records r \
                                    WHERE r.account = $1 AND r.kind = 'claim' \
                                      AND r.address = item.address AND ",
            $namespace_test,
            "                       LIMIT 1) AS own ON true \
                 WHERE own.found IS NULL \
             ), taken AS ( \
                 INSERT INTO idem_records AS e \
                   (account, kind, address, namespace, state, identity, held_by, event_order) \
                 SELECT $1, 'entity', fresh.entity, $3, 'entity', fresh.entity_identity, \
                        fresh.address, fresh.event_order \
                 FROM fresh ORDER BY fresh.entity \
                 ON CONFLICT ",
            $conflict_target,
            " DO UPDATE SET ",
            taking_the_entity!(
                "EXCLUDED.held_by",
                "EXCLUDED.event_order",
                "EXCLUDED.identity",
                $holder_namespace_test
            ),
            " RETURNING e.address, e.held_by, e.event_order \
             ) \
             INSERT INTO idem_records \
               (account, kind, address, namespace, state, identity, fingerprint, \
                lease_expires_at, value_kept_for, slot_kept_for, expires_in_doubt, entity, \
                event_order) \
             SELECT $1, 'claim', fresh.address, $3, 'pending', fresh.identity, fresh.fingerprint, \
                    now() + $6 * interval '1 microsecond', $7 * interval '1 microsecond', \
                    $8 * interval '1 microsecond', $9, fresh.entity, fresh.event_order \
             FROM fresh \
             JOIN taken ON taken.address = fresh.entity AND taken.held_by = fresh.address \
                       AND taken.event_order = fresh.event_order \
             ORDER BY fresh.address \
             ON CONFLICT DO NOTHING \
             RETURNING address, fence"
        )
    };
}

/// Claims a pass of a batch's ordered events (no two of one slot or of
/// one entity) in one statement, on PostgreSQL (see
/// `claim_ordered_batch_statement!`): the won addresses and their fences.
/// `$1`–`$9` as [`CLAIM_BATCH`](super::batch::CLAIM_BATCH)'s; `$10` the
/// entities' addresses, `$11` their identities, `$12` the events' orders
/// (pairwise with the addresses). Index: per event, the partial unique
/// index of its form for its own row, its entity's and its holder's.
pub const CLAIM_ORDERED_BATCH: SplitOnNamespace = SplitOnNamespace {
    without_namespace: claim_ordered_batch_statement!(
        "r.namespace IS NULL AND $3::text IS NULL",
        "h.namespace IS NULL AND $3::text IS NULL",
        "(account, kind, address) WHERE namespace IS NULL"
    ),
    within_namespace: claim_ordered_batch_statement!(
        "r.namespace = $3",
        "h.namespace = $3",
        "(account, kind, address, namespace) WHERE namespace IS NOT NULL"
    ),
};

/// An ordered event of a batch, as [`claim_ordered_batch`] claims it: a
/// batch's item, and its entity and order.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NewOrderedItem<'a> {
    pub item: super::NewBatchItem<'a>,
    pub ordered: OrderedBy<'a>,
}

/// Claims the ordered events `items` of a pass in one statement
/// ([`CLAIM_ORDERED_BATCH`]): the won addresses with their fences. An
/// event missing from the answer was not won: the caller claims it alone.
pub(crate) async fn claim_ordered_batch(
    conn: &mut PgConnection,
    scope: Scope<'_>,
    items: &[NewOrderedItem<'_>],
    lease: super::batch::BatchLease,
    windows: super::Windows,
) -> Result<Vec<(String, i64)>, sqlx::Error> {
    let entities: Vec<&str> = items.iter().map(|item| item.ordered.entity).collect();
    let entity_identities: Vec<&[u8]> = items
        .iter()
        .map(|item| item.ordered.entity_identity)
        .collect();
    let orders: Vec<i64> = items.iter().map(|item| item.ordered.order).collect();
    let query = super::batch::claims_bound(
        CLAIM_ORDERED_BATCH.for_namespace(scope.namespace),
        scope,
        items.iter().map(|item| &item.item),
        lease,
        windows,
    )
    .bind(entities)
    .bind(entity_identities)
    .bind(orders);
    super::batch::won(query.fetch_all(conn).await?)
}

/// The text of [`TAKE_ENTITY_ROUTED`] with its namespace tests: of the
/// event's row (`$namespace_test`), of the holder's
/// (`$holder_namespace_test`), of the entity's (`$entity_namespace_test`).
///
/// `existing` looks for the event's own row, as [`CLAIM_ORDERED`]'s does.
/// When there is none, `taken` updates the entity row with what
/// [`CLAIM_ORDERED`]'s `DO UPDATE` writes: taken by this event when it is
/// free and nothing newer was applied, else left held (its fold written
/// all the same). Under READ COMMITTED the `UPDATE` locks the row, waiting
/// for a transaction that holds it, and then evaluates its `SET` on the
/// row's latest version (the holder's row still read with the statement's
/// snapshot), as the upsert does. `held` is fenced (`OFFSET 0`) so that the
/// holder's row is read once, not once for each place its state is used.
///
/// The final select returns one row: the event's own row; or what the
/// entity says (`took`, and when not, why not). None when the entity row is
/// not there (nor the event's): [`CREATE_ENTITY_ROUTED`] inserts it.
macro_rules! take_entity_statement {
    ($namespace_test:literal, $holder_namespace_test:literal, $entity_namespace_test:literal,
     $stale_namespace_test:literal) => {
        concat!(
            "WITH existing AS ( \
                 SELECT ",
            existing_columns!(),
            ", CASE WHEN $4 THEN coalesce(output_json, output::text) END AS output \
                 FROM idem_records \
                 WHERE account = $1 AND kind = 'claim' AND address = $2 AND ",
            $namespace_test,
            " ), taken AS ( \
                 UPDATE idem_records e SET ",
            taking_the_entity!("$2", "$7::bigint", "$6", $holder_namespace_test),
            " WHERE e.account = $1 AND e.kind = 'entity' AND e.address = $5 AND ",
            $entity_namespace_test,
            " AND NOT EXISTS (SELECT FROM existing) \
                 RETURNING e.held_by IS NOT DISTINCT FROM $2 \
                           AND e.event_order IS NOT DISTINCT FROM $7 AS took, \
                           e.applied_order, e.identity = $6 AS same_entity, \
                           NOT EXISTS (SELECT FROM idem_records x \
                                       WHERE x.account = $1 AND x.kind = 'entity' \
                                         AND x.address = $5 AND ",
            $stale_namespace_test,
            " AND x.held_by IS NOT DISTINCT FROM e.held_by) AS stale \
             ) \
             SELECT fence, lineage, settled, state, identity, fingerprint, lease_expired, \
                    expires_in_doubt, resolved, reason, output, slot_expired, value_expired, \
                    windowed, false AS entity_refused, NULL::boolean AS took, \
                    NULL::bigint AS applied_order, NULL::boolean AS same_entity, \
                    NULL::boolean AS stale \
             FROM existing \
             UNION ALL \
             SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, \
                    NULL, NULL, NOT took, took, applied_order, same_entity, stale \
             FROM taken"
        )
    };
}

/// On Citus, the first statement of an event's claim: looks for the
/// event's own row and, when there is none, takes the entity if it is
/// free (see `take_entity_statement!`). Citus routes it whole to the
/// account's worker (a `SELECT` whose one modifying CTE is an `UPDATE`,
/// every row in one account). `$1`–`$3` account, event address,
/// namespace; `$4` whether to return the stored output; `$5` the entity's
/// address, `$6` its identity, `$7` the event's order. Index: the partial
/// unique index of its form, for the event's row, the entity's and its
/// holder's.
pub const TAKE_ENTITY_ROUTED: SplitOnNamespace = SplitOnNamespace {
    without_namespace: take_entity_statement!(
        "namespace IS NULL AND $3::text IS NULL",
        "h.namespace IS NULL AND $3::text IS NULL",
        "e.namespace IS NULL AND $3::text IS NULL",
        "x.namespace IS NULL AND $3::text IS NULL"
    ),
    within_namespace: take_entity_statement!(
        "namespace = $3",
        "h.namespace = $3",
        "e.namespace = $3",
        "x.namespace = $3"
    ),
};

/// On Citus, after [`TAKE_ENTITY_ROUTED`] found no entity: inserts it,
/// held by this event (`RETURNING` a row), or nothing when another claim
/// inserted it first (committed, or waited for: the take is then said
/// again). An `INSERT ... VALUES`, routed to the account's worker. `$1`
/// account, `$2` the event's address, `$3` namespace, `$4` the entity's
/// address, `$5` its identity, `$6` the event's order. One text serves
/// both forms: the insert is arbitrated by whichever partial unique index
/// the new row's namespace falls under.
pub const CREATE_ENTITY_ROUTED: SplitOnNamespace = SplitOnNamespace {
    without_namespace: CREATE_ENTITY_ROUTED_STATEMENT,
    within_namespace: CREATE_ENTITY_ROUTED_STATEMENT,
};

/// The text of [`CREATE_ENTITY_ROUTED`].
const CREATE_ENTITY_ROUTED_STATEMENT: &str = "INSERT INTO idem_records \
       (account, kind, address, namespace, state, identity, held_by, event_order) \
     VALUES ($1, 'entity', $4, $3, 'entity', $5, $2, $6) \
     ON CONFLICT DO NOTHING \
     RETURNING true AS took";

/// On Citus, once the event took its entity: inserts the event's claim,
/// naming its entity and order, as [`CLAIM_ORDERED`]'s `claimed` does
/// (`RETURNING fence`; nothing when a row holds the slot, which the caller
/// then looks up). An `INSERT ... VALUES`, routed to the account's worker.
/// `$1`–`$9` as [`CLAIM_ROUTED`](super::claims::CLAIM_ROUTED)'s; `$10` the
/// entity's address, `$11` the event's order. One text serves both forms,
/// as for [`CREATE_ENTITY_ROUTED`].
pub const CLAIM_EVENT_ROUTED: SplitOnNamespace = SplitOnNamespace {
    without_namespace: CLAIM_EVENT_ROUTED_STATEMENT,
    within_namespace: CLAIM_EVENT_ROUTED_STATEMENT,
};

/// The text of [`CLAIM_EVENT_ROUTED`].
const CLAIM_EVENT_ROUTED_STATEMENT: &str = "INSERT INTO idem_records \
       (account, kind, address, namespace, state, identity, fingerprint, lease_expires_at, \
        value_kept_for, slot_kept_for, expires_in_doubt, entity, event_order) \
     VALUES ($1, 'claim', $2, $3, 'pending', $4, $5, now() + $6 * interval '1 microsecond', \
             $7 * interval '1 microsecond', $8 * interval '1 microsecond', $9, $10, $11) \
     ON CONFLICT DO NOTHING \
     RETURNING fence";

/// Claims an event's slot and takes its entity, or says why not, with
/// [`CLAIM_ORDERED`] (on PostgreSQL).
pub(super) async fn claim_ordered(
    conn: &mut PgConnection,
    scope: Scope<'_>,
    address: &str,
    claim: NewClaim<'_>,
    ordered: OrderedBy<'_>,
    kept_value: KeptValue,
) -> Result<ClaimAnswer, sqlx::Error> {
    let row = CLAIM_ORDERED
        .for_row(scope, address)
        .bind(claim.identity)
        .bind(claim.fingerprint)
        .bind(claim.lease_micros)
        .bind(kept_value.is_read())
        .bind(claim.windows.value_micros)
        .bind(claim.windows.slot_micros)
        .bind(ordered.entity)
        .bind(ordered.entity_identity)
        .bind(ordered.order)
        .bind(claim.expires_in_doubt())
        .fetch_optional(conn)
        .await?;
    let Some(row) = row else {
        return Ok(ClaimAnswer::Hidden);
    };
    if row.try_get::<bool, _>("won")? {
        return Ok(ClaimAnswer::Won(row.try_get("fence")?));
    }
    if !row.try_get::<bool, _>("entity_refused")? {
        return Existing::from_row(&row).map(ClaimAnswer::Holder);
    }
    refused(&row, ordered)
}

/// Claims an event's slot and takes its entity, or says why not, on
/// Citus: with the routed statements (`claim_ordered_in`), in one
/// transaction, the caller's or (`Within::Autocommit`) one of its own, so
/// that should the connection die between the statements the entity is not
/// left held by a claim never made.
pub(super) async fn claim_ordered_routed(
    conn: &mut PgConnection,
    within: Within,
    scope: Scope<'_>,
    address: &str,
    claim: NewClaim<'_>,
    ordered: OrderedBy<'_>,
    kept_value: KeptValue,
) -> Result<ClaimAnswer, sqlx::Error> {
    match within {
        Within::CallersTransaction => {
            claim_ordered_in(conn, scope, address, claim, ordered, kept_value).await
        }
        Within::Autocommit => {
            let mut tx = conn.begin().await?;
            let answer =
                claim_ordered_in(&mut tx, scope, address, claim, ordered, kept_value).await?;
            tx.commit().await?;
            Ok(answer)
        }
    }
}

/// Claims an event's slot on Citus, on a connection inside a transaction:
/// [`TAKE_ENTITY_ROUTED`] (after [`CREATE_ENTITY_ROUTED`], when the entity
/// is not there yet), then [`CLAIM_EVENT_ROUTED`] once the event took its
/// entity. Each statement is routed to the account's worker.
async fn claim_ordered_in(
    conn: &mut PgConnection,
    scope: Scope<'_>,
    address: &str,
    claim: NewClaim<'_>,
    ordered: OrderedBy<'_>,
    kept_value: KeptValue,
) -> Result<ClaimAnswer, sqlx::Error> {
    // Once inserted by another claim, the entity is there for the next
    // take (it is never deleted); a take that still finds none is refused
    // as held, and its caller tries again.
    let mut insert_tried = false;
    loop {
        let taken = TAKE_ENTITY_ROUTED
            .for_row(scope, address)
            .bind(kept_value.is_read())
            .bind(ordered.entity)
            .bind(ordered.entity_identity)
            .bind(ordered.order)
            .fetch_optional(&mut *conn)
            .await?;
        match taken {
            Some(row) if !row.try_get::<bool, _>("entity_refused")? => {
                if row.try_get::<Option<bool>, _>("took")?.is_none() {
                    return Existing::from_row(&row).map(ClaimAnswer::Holder);
                }
                break;
            }
            Some(row) => return refused(&row, ordered),
            // Inserted by another claim after this take's snapshot: the
            // next statement sees it.
            None if insert_tried => return Ok(ClaimAnswer::EntityHeld { stale: true }),
            None => {
                insert_tried = true;
                let inserted = CREATE_ENTITY_ROUTED
                    .for_row(scope, address)
                    .bind(ordered.entity)
                    .bind(ordered.entity_identity)
                    .bind(ordered.order)
                    .fetch_optional(&mut *conn)
                    .await?;
                if inserted.is_some() {
                    break;
                }
            }
        }
    }
    let fence = CLAIM_EVENT_ROUTED
        .for_row(scope, address)
        .bind(claim.identity)
        .bind(claim.fingerprint)
        .bind(claim.lease_micros)
        .bind(claim.windows.value_micros)
        .bind(claim.windows.slot_micros)
        .bind(claim.expires_in_doubt())
        .bind(ordered.entity)
        .bind(ordered.order)
        .fetch_optional(&mut *conn)
        .await?;
    match fence {
        Some(row) => Ok(ClaimAnswer::Won(row.try_get("fence")?)),
        // The event's own row, committed after the take's snapshot: the
        // entity stays with this event, whose row says what became of it,
        // as [`CLAIM_ORDERED`] leaves it when its `claimed` meets a row.
        None => Ok(ClaimAnswer::Hidden),
    }
}

/// Why an event did not take its entity, from a row whose `entity_refused`
/// is true: another entity's identity holds its address, something newer
/// was applied, or another event holds it.
fn refused(row: &PgRow, ordered: OrderedBy<'_>) -> Result<ClaimAnswer, sqlx::Error> {
    if !row.try_get::<bool, _>("same_entity")? {
        return Ok(ClaimAnswer::EntityCollision);
    }
    let applied: Option<i64> = row.try_get("applied_order")?;
    Ok(match applied {
        Some(applied) if applied > ordered.order => ClaimAnswer::Superseded { applied },
        _ => ClaimAnswer::EntityHeld {
            stale: row.try_get("stale")?,
        },
    })
}
