//! The claim race: one winner per identity under real concurrency, the race
//! harness's report, and the defects each pinned by the test that found it.

mod correctness;
mod race_harness;
mod races;
