//! The store failing under the gate: connections terminated and the server
//! restarted, replies lost after a commit, the store down, serialization
//! failures and deadlocks, and failures around the body (fail closed).

mod connections;
mod gate_failures;
mod lost_replies;
mod serialization;
mod store_down;
