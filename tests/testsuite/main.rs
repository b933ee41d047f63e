//! idem's integration tests, one binary, one module per behaviour.
//!
//! `tests/README.md` is the index: which module holds which behaviour, how
//! to run one (`cargo test --test testsuite modes::lease`), and what each
//! needs (a PostgreSQL; the ignored Citus and soak runs). One crate links
//! once, where a binary per file linked every dependency again for each.

// The claim race at the heart of the gate, its harness, and the defects
// pinned by a test each.
mod gate;
// The attribute's opt-in modes: replay, fingerprint, lease, wait,
// on_unavailable, in a transaction, outcome_commit and dispositions.
mod modes;
// Guarding by hand with the builder: every end, raced, in and out of a
// transaction.
mod guard;
// The red team of the guard: each promise of its docs attacked (races,
// faults, misuse, hostile input), and the attribute against the same guard
// by hand.
mod guard_redteam;
// Guarding by hand: claims, what their holders are told, the connection
// discipline (the outcome cache across stores is part of it).
#[cfg(feature = "cache")]
mod hand_api;
// Steps inside one claim: replayed on a retry, in doubt when cut off,
// fenced, refused where they cannot work; downstream keys.
mod steps;
// The proof of steps: a three-step checkout against a fake provider, many
// clients per key, faults at every point, the provider's ledgers checked;
// and the same workload without steps, which repeats effects.
mod steps_under_faults;
// The red team of steps: each promise of their docs attacked (races at a
// barrier, faults, misuse, hostile names, scopes, the reconciler's verdicts).
mod steps_redteam;
// A second red team of steps.
mod steps_breaks;
// A red team of repeatable steps, which write no marker: stale holders,
// wrong connections, declarations that change between runs, joined steps.
mod steps_repeatable_breaks;
// A red team of what a body's steps do once one finds the claim lost: a
// stale or released holder's later steps, one value per step, a success
// that went on without its steps, wrong connections in a transaction.
mod steps_lost_breaks;
// Steps whose claim a reconciler or an operator resolved, or released,
// while the body ran: what each step and the holder are told.
mod steps_resolved;
// Batch claims for message consumers.
mod batches;
// The tower layer and detached calls, through real servers.
#[cfg(all(feature = "tower", feature = "axum"))]
mod http;
// The local outcome cache.
#[cfg(feature = "cache")]
mod cache;
// Outcome metrics through the `metrics` facade.
#[cfg(feature = "metrics")]
mod metrics;
// The operator console's pages, access and writes (feature `console`).
#[cfg(feature = "console")]
mod console;
// Usage metering by address.
mod metering;
// Establishing an outcome in doubt: the reconciler, resolving by hand, and
// the reconciler's bounds.
mod reconcile;
// The store failing: connections cut, replies lost, the server down,
// serialization failures, and failures around the body.
mod faults;
// Schema set-up and verification, least privilege, the partitioned layout,
// and a rolling deploy beside the previous release.
mod schema;
// The identity encoding: golden vectors and hostile input.
mod identity;
// What `#[idempotent]` expands to, and its compile errors (trybuild).
mod attribute;
// Randomized histories under faults, checked against the gate's promises.
mod history;
// A Citus cluster (ignored: `scripts/test-citus`).
mod citus;
// The long soak of the plain gate (ignored).
mod soak;
// Helpers more than one module uses.
mod support;
