//! `#[idempotent]`: what it expands to, exercised, and its compile errors
//! (trybuild cases in `tests/ui/`).

mod expansion;
mod ui;
