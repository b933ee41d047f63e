//! Guarding by hand: what a claim's holder is told, the outcome cache across
//! stores, and the red team of both.

#[cfg(feature = "metrics")]
mod documented_promises;
mod holder;
