//! Guarding by hand: what a claim's holder is told, the outcome cache across
//! stores, and the red team of both; and the entry points the guard builder
//! replaces, which keep working for one release (`deprecated`).

mod deprecated;
mod holder;
#[cfg(feature = "metrics")]
mod redteam;
