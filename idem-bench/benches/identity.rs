//! Identity encoding and address derivation, in ns per identity: what the
//! gate spends on the client before its claim leaves for the database.
//!
//! ```text
//! cargo bench -p idem-bench --bench identity
//! cargo bench -p idem-bench --bench identity -- --warm-up-time 1 --measurement-time 2   # quicker, noisier
//! ```
//!
//! For 1, 4 and 16 short parts (mixed text and integers, as real keys are)
//! and one 1 MiB part, each measured twice: encoding alone
//! (`Identity::new(..).part(..)`), and encoding plus `.address()` (sha1 over
//! the encoding, then hex). The target is under 2 µs for 4 short parts.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use idem::Identity;

/// The parts of a typical key, cycled for longer ones: an order id, an
/// amount in cents, a currency, a customer id.
enum ShortPart {
    Text(&'static str),
    Integer(i64),
}

const SHORT_PARTS: [ShortPart; 4] = [
    ShortPart::Text("ord_1001"),
    ShortPart::Integer(4_999),
    ShortPart::Text("EUR"),
    ShortPart::Integer(7_340_225),
];

/// An identity of `count` short parts.
fn short_identity(count: usize) -> Identity {
    SHORT_PARTS.iter().cycle().take(count).fold(
        Identity::new("charge"),
        |identity, part| match part {
            ShortPart::Text(text) => identity.part(black_box(*text)),
            ShortPart::Integer(integer) => identity.part(black_box(*integer)),
        },
    )
}

fn short_parts(c: &mut Criterion) {
    let mut group = c.benchmark_group("short parts");
    for count in [1, 4, 16] {
        group.bench_with_input(BenchmarkId::new("encode", count), &count, |b, &count| {
            b.iter(|| short_identity(count))
        });
        group.bench_with_input(
            BenchmarkId::new("encode + address", count),
            &count,
            |b, &count| b.iter(|| short_identity(count).address()),
        );
    }
    group.finish();
}

fn one_mebibyte_part(c: &mut Criterion) {
    let part = vec![0xa5_u8; 1 << 20];
    let mut group = c.benchmark_group("one 1 MiB part");
    group.throughput(Throughput::Bytes(part.len() as u64));
    group.bench_function("encode", |b| {
        b.iter(|| Identity::new("upload").part(black_box(part.as_slice())))
    });
    group.bench_function("encode + address", |b| {
        b.iter(|| {
            Identity::new("upload")
                .part(black_box(part.as_slice()))
                .address()
        })
    });
    group.finish();
}

/// Modest samples, so the whole bench takes about a minute; the command
/// line's `--warm-up-time` and `--measurement-time` still override these.
fn config() -> Criterion {
    Criterion::default()
        .sample_size(50)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
}

criterion_group! {
    name = benches;
    config = config();
    targets = short_parts, one_mebibyte_part
}
criterion_main!(benches);
