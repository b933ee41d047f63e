//! The runtime of idem: identities, the PostgreSQL record store and the
//! [`Gate`]. Use it through the `idem-pg` package (its library is `idem`),
//! which adds the `#[idempotent]` attribute; this crate is its engine room.
//!
//! What it implements is the insert that is the lock: the `idem` crate's
//! docs (*The insert is the lock*) say how.

// docs.rs: mark what a feature brings (`--cfg docsrs`, set by its metadata).
#![cfg_attr(docsrs, feature(doc_cfg))]
// Library code never unwraps: bad input gets an error that says what to do.
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

// The reading path, top down: guard → run → acquire → claim → store
// (the gate is the scope and the pool a guard starts from).
#[doc(hidden)]
#[path = "internal.rs"]
pub mod __internal;
mod acquire;
mod attach;
pub mod batch;
#[cfg(feature = "cache")]
#[cfg_attr(docsrs, doc(cfg(feature = "cache")))]
pub mod cache;
mod claim;
mod decision;
pub mod detach;
mod error;
#[doc(hidden)]
pub mod expansion;
mod fault;
mod gate;
pub mod guard;
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub mod http;
mod identity;
mod measure;
pub mod meter;
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;
mod mode;
mod observe;
mod order;
mod outcome;
pub mod reconcile;
mod retry;
mod run;
pub mod schema;
mod scoped_pool;
mod settled;
pub mod shown;
mod step;
mod store;
mod stored_value;
mod via;
mod wakeup;

pub use claim::Claim;
pub use detach::{Detached, Shutdown};
pub use error::{Error, Rejected, SchemaProblem, SchemaProblems};
pub use gate::Gate;
pub use guard::{ClaimOrReplay, Guard, TxClaim};
pub use identity::{
    ADDRESS_DIGEST_HEX, ADDRESS_PREFIX, Identity, KeyPart, NotCanonical, PartValue, PartWriter,
    PartWritten,
};
pub use mode::{
    Disposition, Fingerprint, MAX_LEASE, MAX_WINDOW, OnExpiry, OnUnavailable, OutcomeCommit,
};
pub use order::{EventOrder, OrderOutOfRange};
pub use outcome::Outcome;
pub use step::{Step, downstream_key, step};

pub use store::operations;

/// The sqlx this crate was built with, so users need not match versions.
pub use sqlx;
