//! Helpers more than one module of the test suite uses, defined once.

pub(crate) mod bodies;
pub(crate) mod doubt;
pub(crate) mod holders;
#[cfg(all(feature = "tower", feature = "axum"))]
pub(crate) mod http;
pub(crate) mod proxy;
#[cfg(feature = "metrics")]
pub(crate) mod recorder;
pub(crate) mod steps;
