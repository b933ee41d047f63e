//! The duplicates group through a gate with the local outcome cache
//! (feature `cache`, issue 17 part 1): a hot duplicate refused with no
//! round trip, against the same bare-`SELECT` floor.
//!
//! The gate's cache is sized to hold every settled identity of the group
//! and warmed before the run (each refused once, through the store), so
//! the measured window sees the steady state of a process that has seen
//! its duplicates settle: every refusal a hit.

use std::sync::Arc;
use std::time::Duration;

use idem::Gate;
use idem::cache::OutcomeCache;

use crate::BoxError;
use crate::workload::{Work, Workload};

/// Long enough that no entry expires during a run.
const TTL: Duration = Duration::from_secs(3600);

/// Workers that warm the cache.
const WARMERS: u64 = 16;

/// The gate `work` runs through: with a cache for every settled identity
/// (`settled` of them, with room to spare: the cache's capacity is split
/// among shards, which the identities' hashes do not fill evenly) when it
/// is the cached refusal, else `gate` as it is.
pub fn gate_for(work: Work, gate: &Gate, settled: u64) -> Gate {
    if work != Work::RefuseThroughCachedGate {
        return gate.clone();
    }
    gate.with_cache(
        OutcomeCache::builder()
            .max_entries(settled.saturating_mul(2))
            .max_bytes(settled.saturating_mul(2048))
            .ttl(TTL)
            .build(),
    )
}

/// Refuses each of the `settled` identities once, through the store, so
/// that the cached refusal's measured window sees only hits.
pub async fn warm(workload: &Arc<Workload>, settled: u64) -> Result<(), BoxError> {
    if workload.work != Work::RefuseThroughCachedGate {
        return Ok(());
    }
    let warmers: Vec<_> = (0..WARMERS)
        .map(|first| {
            let workload = Arc::clone(workload);
            tokio::spawn(async move {
                for n in (first..settled).step_by(WARMERS as usize) {
                    workload.run(n).await?;
                }
                Ok::<(), BoxError>(())
            })
        })
        .collect();
    for warmer in warmers {
        warmer.await??;
    }
    Ok(())
}
