//! What idem's tests, the CLI's tests, the examples and the benchmarks share;
//! not published.
//!
//! - a real PostgreSQL: the server binaries ([`binaries`]), a throwaway
//!   cluster of one's own ([`cluster`]), a Citus cluster of one's own
//!   ([`citus`]), a database for an example to use ([`database`]), and the
//!   `pg-cluster` tool the scripts call;
//! - on the shared test server: schemas of a test's own ([`schemas`]),
//!   connections a test can tell apart and kill ([`connections`]), the claim
//!   rows the gate left ([`rows`]);
//! - faults and their bookkeeping: a TCP proxy that cuts, stalls and drops
//!   replies ([`fault_proxy`]), the history recorder and checker of the
//!   randomized tests ([`history`]), a seeded generator ([`rng`]);
//! - what guarded test functions return ([`JobError`], and [`ChargeError`]
//!   for a payment with a disposition) and what `tracing` printed
//!   ([`Captured`]);
//! - a real browser for the operator console's pages: headless Chromium
//!   over WebDriver, and screenshots for the docs ([`browser`]).
//!
//! The examples' own guarded code stays in the examples, with their tests
//! (`examples/quickstart/`, `examples/payments/`).

pub mod answer;
pub mod binaries;
pub mod browser;
pub mod capture;
pub mod citus;
pub mod cluster;
pub mod connections;
pub mod database;
pub mod error;
pub mod fault_proxy;
pub mod history;
pub mod process;
pub mod rng;
pub mod rows;
pub mod schemas;

pub use capture::Captured;
pub use cluster::Cluster;
pub use error::{ChargeError, JobError};
pub use fault_proxy::Proxy;
pub use rng::XorShift;
