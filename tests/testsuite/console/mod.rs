//! The operator console (`idem::console`, feature `console`), through its
//! router, request by request: what each page shows, what it hides, who
//! gets in, and that a write changes a claim once, fenced, or not at all.
//! The same pages in a real browser: `idem-cli/tests/console_browser.rs`.

mod access;
mod audit;
mod documented_promises;
mod operator_promises;
mod pages;
mod shown;
mod support;
mod writes;
