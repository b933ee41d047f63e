//! The Idempotency-Key protocol as a tower layer, through real axum, hyper
//! and tonic servers: races, the request the client gave up on, and the red
//! team of the layer and detached calls, and its retention windows.

mod detached;
mod documented_promises;
mod layer;
mod retention;
mod unrouted;
