//! The Idempotency-Key protocol as a tower layer, through real axum, hyper
//! and tonic servers: races, the request the client gave up on, and the red
//! team of the layer and detached calls.

mod detached;
mod documented_promises;
mod layer;
mod unrouted;
