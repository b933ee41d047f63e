//! What idem's benchmark programs share. Each program is in `src/bin/`;
//! this library holds only the pieces more than one of them uses.

pub mod splice;

/// Any error, for programs that only report it.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
