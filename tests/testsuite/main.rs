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
// A waiting duplicate attached to its holder in this process: the outcome
// as it lands, with no statement and no polling.
mod attach;
// Guarding by hand with the builder: every end, raced, in and out of a
// transaction; each promise of its docs attacked, and the attribute
// against the same guard by hand.
mod guard;
// Guarding by hand: claims, what their holders are told, the connection
// discipline (the outcome cache across stores is part of it).
#[cfg(feature = "cache")]
mod by_hand;
// Steps inside one claim: replayed on a retry, in doubt when cut off,
// fenced, repeatable, after the claim was lost or resolved, under faults.
mod steps;
// Batch claims for message consumers.
mod batches;
// Ordered events: an older event never runs after a newer one of its
// entity, and events of one entity never run at once.
mod ordered_events;
// How long a claim keeps its value and its slot: windows, their expiry,
// prune enforcing them, and a history with prune racing the claims.
mod retention;
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
// The store's statements below the gate: their plans (`EXPLAIN`), a
// claim's transitions, prune's walks.
mod store;
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
