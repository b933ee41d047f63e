//! The identity encoding: golden vectors that pin it forever, and hostile
//! input by property.

mod golden;
mod properties;
