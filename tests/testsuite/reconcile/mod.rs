//! Outcomes in doubt established after the fact: the reconciler against a
//! timing-out provider, its bounds, resolving by hand, and the red team of
//! both.

mod bounds;
mod documented_promises;
mod probes;
mod reconciler;
mod resolve;
