//! The store's statements against a real PostgreSQL, below the gate: each
//! one's plan (`EXPLAIN`), and the transitions of a claim and prune's walks
//! driven statement by statement. They reach the store through
//! `idem::__internal::store` (not a stable API), each in a schema of its
//! own ([`scratch`]).

// The statements' plans: every lookup by address on a partial unique
// index, every listing of open claims on theirs.
mod index_use;
// The batch statements' plans, under statistics that lie.
mod batch_plans;
// Prune and steps, on every walk prune has.
mod prune_steps;
// A claim leaving `pending` without a success.
mod transitions;
// A connection in a schema of its own.
mod scratch;

#[cfg(feature = "metrics")]
use idem::__internal::store::gauges;
use idem::__internal::store::{
    Commit, Engine, Scope, SplitOnNamespace, batch, browse, catalog, claims, metering, operations,
    ordered, prune, steps,
};
