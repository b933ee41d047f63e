//! What counting costs (feature `metrics`) on the gate's cheapest path, a
//! duplicate refused from the outcome cache with no round trip, where it
//! weighs the most: ns per refusal with no recorder installed (the facade
//! does nothing), and with a Prometheus recorder, with and without the
//! account label; each printed as a ratio against the first, measured in
//! the same process, rounds interleaved.
//!
//! ```text
//! cargo bench -p idem-bench --features metrics --bench metrics
//! ```
//!
//! A refusal that goes to the store costs a round trip (~100 µs on a local
//! socket) besides: what is added here is the same, and vanishes in it.
//!
//! On the development machine (2 shared cores, PostgreSQL 15), 2026-12-01:
//!
//! ```text
//! a cached refusal, median of 15 runs of 20000:
//!   no recorder                       595 ns/refusal    1.00x
//!   prometheus                       1207 ns/refusal    2.03x
//!   prometheus, account label        1297 ns/refusal    2.18x
//! ```
//!
//! The ~0.6 µs is the recorder's: two metrics looked up in its registry by
//! their key (the name and labels hashed) and updated.

use std::time::{Duration, Instant};

use idem::cache::OutcomeCache;
use idem::metrics::MetricsOptions;
use idem::{Gate, Identity, Rejected};
use metrics_exporter_prometheus::PrometheusBuilder;

/// Refusals per timed run, and runs per variant (interleaved).
const REFUSALS: u32 = 20_000;
const ROUNDS: usize = 15;

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let cache = OutcomeCache::builder()
        .max_entries(1_000)
        .max_bytes(1 << 20)
        .ttl(Duration::from_secs(600))
        .build();
    let gate = runtime.block_on(idem::testing::gate()).with_cache(cache);
    let labelled = gate.with_metrics(MetricsOptions::new().label_account(true));
    let id = Identity::new("charge").part("ord_1001").part(4_999);
    let settled: Result<(), Rejected> = runtime.block_on(gate.run(&id, async { Ok(()) }));
    settled.expect("the first run settles");

    let recorder = PrometheusBuilder::new().build_recorder();
    // The same thread runs every refusal: a local recorder covers them.
    let refusals = |gate: &Gate| {
        runtime.block_on(async {
            let started = Instant::now();
            for _ in 0..REFUSALS {
                let refused: Result<(), Rejected> = gate.run(&id, async { Ok(()) }).await;
                assert!(matches!(refused, Err(Rejected::AlreadyDone)));
            }
            started.elapsed().as_secs_f64() * 1e9 / f64::from(REFUSALS)
        })
    };
    let variants: [(&str, &dyn Fn() -> f64); 3] = [
        ("no recorder", &|| refusals(&gate)),
        ("prometheus", &|| {
            metrics::with_local_recorder(&recorder, || refusals(&gate))
        }),
        ("prometheus, account label", &|| {
            metrics::with_local_recorder(&recorder, || refusals(&labelled))
        }),
    ];
    // Warm up: the cache, the recorder's series, the allocator.
    for (_, run) in &variants {
        run();
    }
    let mut samples: Vec<Vec<f64>> = vec![Vec::with_capacity(ROUNDS); variants.len()];
    for _ in 0..ROUNDS {
        for ((_, run), samples) in variants.iter().zip(&mut samples) {
            samples.push(run());
        }
    }
    let medians: Vec<f64> = samples
        .iter_mut()
        .map(|samples| {
            samples.sort_by(f64::total_cmp);
            samples[samples.len() / 2]
        })
        .collect();
    println!("a cached refusal, median of {ROUNDS} runs of {REFUSALS}:");
    for ((name, _), median) in variants.iter().zip(&medians) {
        println!(
            "  {name:<28} {median:>8.0} ns/refusal   {:>5.2}x",
            median / medians[0]
        );
    }
}
