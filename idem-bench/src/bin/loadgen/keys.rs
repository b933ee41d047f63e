//! Distinct identities for every operation, and keys shaped like the gate's.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

/// One counter for the whole process: no two operations, in any scenario or
/// run, share an identity, so nothing is refused by accident and the
/// history group never meets its own earlier claims.
static NEXT: AtomicU64 = AtomicU64::new(0);

/// The identity number of the next operation.
pub fn next() -> u64 {
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// `count` identity numbers at once, from the same counter as [`next`]:
/// the messages of one batch, whose identities no other operation (or
/// message) has or will have.
pub fn next_many(count: u64) -> Range<u64> {
    let first = NEXT.fetch_add(count, Ordering::Relaxed);
    first..first + count
}

/// 24 hex digits, spread uniformly over the key space like the gate's sha1
/// digests. Sequential keys would all land on the rightmost leaf of the
/// unique index: cheap with one writer (PostgreSQL's fast path for appends to
/// the rightmost leaf), contended with many, and never what the gate does.
pub fn hex24(n: u64) -> String {
    let high = splitmix64(n);
    let low = splitmix64(!n) >> 32;
    format!("{high:016x}{low:08x}")
}

/// The address a hand-written scenario claims for identity `n`.
pub fn address(n: u64) -> String {
    format!("claim_{}", hex24(n))
}

/// A bijection on u64 with good avalanche (Steele, Lea and Flood's
/// SplitMix64 finaliser): distinct inputs give distinct, scattered outputs.
fn splitmix64(n: u64) -> u64 {
    let mut z = n.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
