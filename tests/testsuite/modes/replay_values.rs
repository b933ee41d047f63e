//! Replay of stored values, every value JSON cannot say through every path.
//!
//! src/idempotent.md (`replay`): "A duplicate gets exactly the first
//! caller's value or a refusal, never another value [...] The success is
//! never lost for the value's sake". `Claim::settle_value`: "A duplicate
//! gets exactly this value or nothing". `Verdict::succeeded_with`: "An
//! error when `value` would not read back as itself".
//!
//! Every value below goes through every path that keeps one: the guard's
//! `run`, `claim_or_replay` + `Claim::settle_value`, `.tx(..).replay().run`,
//! `TxClaim::settle_value`, `run_detached`, a batch, and the reconciler's
//! `Verdict::succeeded_with`. For each: the first caller gets its own value,
//! the claim ends a success, and a duplicate gets the same value or
//! `AlreadyDone`, never runs.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem::batch::Batch;
use idem::reconcile::{Reconciler, Verdict};
use idem::testing;
use idem::{ClaimOrReplay, Detached, Disposition, Gate, Identity, Rejected};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::support::doubt::state_of;

type Same<T> = fn(&T, &T) -> bool;

fn debug_same<T: Debug>(a: &T, b: &T) -> bool {
    format!("{a:?}") == format!("{b:?}")
}

/// What a duplicate was told, judged: the same value, or AlreadyDone.
fn judge<T: Debug>(
    broken: &mut Vec<String>,
    path: &str,
    label: &str,
    first: &T,
    dup: Result<T, Rejected>,
    same: Same<T>,
) {
    match dup {
        Ok(v) if same(&v, first) => {}
        Ok(v) => broken.push(format!(
            "{path} [{label}]: a duplicate got ANOTHER value {v:?}, the first caller's was {first:?} \
             (\"A duplicate gets exactly the first caller's value or a refusal, never another value\")"
        )),
        Err(Rejected::AlreadyDone) => {}
        Err(other) => broken.push(format!(
            "{path} [{label}]: a duplicate was told {other:?}, neither the value nor AlreadyDone"
        )),
    }
}

async fn settled(broken: &mut Vec<String>, gate: &Gate, id: &Identity, path: &str, label: &str) {
    let state = state_of(gate, id).await.map(|(s, _)| s);
    if state.as_deref() != Some("success") {
        broken.push(format!(
            "{path} [{label}]: the claim is {state:?} after the first caller's success, not a \
             success (\"The success is never lost for the value's sake\")"
        ));
    }
}

/// Runs `value` through every path that keeps a value; the promises broken.
async fn every_path<T>(gate: &Gate, label: &str, value: T, same: Same<T>) -> Vec<String>
where
    T: Serialize + DeserializeOwned + Debug + Clone + Send + Sync + 'static,
{
    let mut broken = Vec::new();
    let tag = testing::unique_name("v");
    let runs = Arc::new(AtomicUsize::new(0));

    // 1. gate.guard(&id).replay().run
    {
        let id = Identity::new("rv_replay_run").part(tag.as_str());
        let body = |v: T| {
            let runs = runs.clone();
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<T, Rejected>(v)
            }
        };
        let first = gate.guard(&id).replay().run(body(value.clone())).await;
        match &first {
            Ok(v) if same(v, &value) => {}
            other => broken.push(format!(
                "guard.run [{label}]: the first caller got {other:?}, not its own value {value:?}"
            )),
        }
        settled(&mut broken, gate, &id, "guard.run", label).await;
        let before = runs.load(Ordering::SeqCst);
        let dup = gate.guard(&id).replay().run(body(value.clone())).await;
        if runs.load(Ordering::SeqCst) != before {
            broken.push(format!("guard.run [{label}]: the duplicate's body ran"));
        }
        judge(&mut broken, "guard.run", label, &value, dup, same);
        // A duplicate through claim_or_replay reads the same row.
        let dup = match gate.guard(&id).replay().claim_or_replay::<T>().await {
            Ok(ClaimOrReplay::Replayed(v)) => Ok(v),
            Ok(ClaimOrReplay::Won(_)) => {
                broken.push(format!(
                    "guard.run [{label}]: a duplicate WON the settled claim"
                ));
                Err(Rejected::AlreadyDone)
            }
            Err(e) => Err(e),
        };
        judge(
            &mut broken,
            "guard.run then claim_or_replay",
            label,
            &value,
            dup,
            same,
        );
    }

    // 2. claim_or_replay + Claim::settle_value
    {
        let id = Identity::new("rv_replay_claim").part(tag.as_str());
        match gate.guard(&id).replay().claim_or_replay::<T>().await {
            Ok(ClaimOrReplay::Won(claim)) => {
                if let Err(e) = claim.settle_value(&value).await {
                    broken.push(format!(
                        "Claim::settle_value [{label}]: the settle failed: {e:?} (the success is never lost to its value)"
                    ));
                }
            }
            other => broken.push(format!(
                "Claim::settle_value [{label}]: no claim won: {other:?}"
            )),
        }
        settled(&mut broken, gate, &id, "Claim::settle_value", label).await;
        let dup = match gate.guard(&id).replay().claim_or_replay::<T>().await {
            Ok(ClaimOrReplay::Replayed(v)) => Ok(v),
            Ok(ClaimOrReplay::Won(_)) => {
                broken.push(format!("Claim::settle_value [{label}]: a duplicate WON"));
                Err(Rejected::AlreadyDone)
            }
            Err(e) => Err(e),
        };
        judge(&mut broken, "Claim::settle_value", label, &value, dup, same);
    }

    // 3. .tx(&mut tx).replay().run
    {
        let id = Identity::new("rv_replay_tx").part(tag.as_str());
        let mut tx = gate.pool().begin().await.expect("begin");
        let v = value.clone();
        let first = gate
            .guard(&id)
            .tx(&mut tx)
            .replay()
            .run(async move |_c: &mut idem::sqlx::PgConnection| Ok::<T, Rejected>(v))
            .await;
        tx.commit().await.expect("commit");
        match &first {
            Ok(v) if same(v, &value) => {}
            other => broken.push(format!(
                "tx.replay.run [{label}]: the first caller got {other:?}, not {value:?}"
            )),
        }
        settled(&mut broken, gate, &id, "tx.replay.run", label).await;
        let mut tx = gate.pool().begin().await.expect("begin");
        let ran = AtomicUsize::new(0);
        let v = value.clone();
        let dup = gate
            .guard(&id)
            .tx(&mut tx)
            .replay()
            .run(async |_c: &mut idem::sqlx::PgConnection| {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<T, Rejected>(v)
            })
            .await;
        tx.rollback().await.expect("rollback");
        if ran.load(Ordering::SeqCst) != 0 {
            broken.push(format!("tx.replay.run [{label}]: the duplicate's body ran"));
        }
        judge(&mut broken, "tx.replay.run", label, &value, dup, same);
    }

    // 4. TxClaim::settle_value
    {
        let id = Identity::new("rv_replay_txclaim").part(tag.as_str());
        let mut tx = gate.pool().begin().await.expect("begin");
        let won = gate
            .guard(&id)
            .tx(&mut tx)
            .replay()
            .claim_or_replay::<T>()
            .await;
        match won {
            Ok(ClaimOrReplay::Won(claim)) => {
                if let Err(e) = claim.settle_value(&mut tx, &value).await {
                    broken.push(format!(
                        "TxClaim::settle_value [{label}]: the settle failed: {e:?}"
                    ));
                }
            }
            other => broken.push(format!(
                "TxClaim::settle_value [{label}]: no claim: {other:?}"
            )),
        }
        tx.commit().await.expect("commit");
        settled(&mut broken, gate, &id, "TxClaim::settle_value", label).await;
        let mut tx = gate.pool().begin().await.expect("begin");
        let dup = match gate
            .guard(&id)
            .tx(&mut tx)
            .replay()
            .claim_or_replay::<T>()
            .await
        {
            Ok(ClaimOrReplay::Replayed(v)) => Ok(v),
            Ok(ClaimOrReplay::Won(_)) => {
                broken.push(format!("TxClaim::settle_value [{label}]: a duplicate WON"));
                Err(Rejected::AlreadyDone)
            }
            Err(e) => Err(e),
        };
        tx.rollback().await.expect("rollback");
        judge(
            &mut broken,
            "TxClaim::settle_value",
            label,
            &value,
            dup,
            same,
        );
    }

    // 5. run_detached
    {
        let id = Identity::new("rv_replay_detached").part(tag.as_str());
        let detached = Detached::with_bound(Duration::from_secs(10));
        let v = value.clone();
        let first = gate
            .guard(&id)
            .replay()
            .run_detached(&detached, async move { Ok::<T, Rejected>(v) })
            .await;
        match &first {
            Ok(v) if same(v, &value) => {}
            other => broken.push(format!(
                "run_detached [{label}]: the first caller got {other:?}, not {value:?}"
            )),
        }
        settled(&mut broken, gate, &id, "run_detached", label).await;
        let v = value.clone();
        let runs2 = runs.clone();
        let before = runs.load(Ordering::SeqCst);
        let dup = gate
            .guard(&id)
            .replay()
            .run_detached(&detached, async move {
                runs2.fetch_add(1, Ordering::SeqCst);
                Ok::<T, Rejected>(v)
            })
            .await;
        if runs.load(Ordering::SeqCst) != before {
            broken.push(format!("run_detached [{label}]: the duplicate's body ran"));
        }
        judge(&mut broken, "run_detached", label, &value, dup, same);
        detached.shutdown(Duration::from_secs(1)).await;
    }

    // 6. a batch with replay
    {
        let id = Identity::new("rv_replay_batch").part(tag.as_str());
        let other = Identity::new("rv_replay_batch").part(format!("{tag}_2"));
        let mut batch = Batch::new();
        batch.push(1u8, id.clone());
        batch.push(2u8, other.clone());
        let v = value.clone();
        let outs: Vec<Result<T, Rejected>> = gate
            .guard_batch(batch)
            .replay()
            .run(|_m| {
                let v = v.clone();
                async move { Ok::<T, Rejected>(v) }
            })
            .await;
        for out in &outs {
            match out {
                Ok(v) if same(v, &value) => {}
                other => broken.push(format!(
                    "batch [{label}]: a first caller got {other:?}, not {value:?}"
                )),
            }
        }
        settled(&mut broken, gate, &id, "batch", label).await;
        settled(&mut broken, gate, &other, "batch", label).await;
        let mut batch = Batch::new();
        batch.push(1u8, id.clone());
        batch.push(2u8, other.clone());
        let ran = AtomicUsize::new(0);
        let v = value.clone();
        let outs: Vec<Result<T, Rejected>> = gate
            .guard_batch(batch)
            .replay()
            .run(|_m| {
                ran.fetch_add(1, Ordering::SeqCst);
                let v = v.clone();
                async move { Ok::<T, Rejected>(v) }
            })
            .await;
        if ran.load(Ordering::SeqCst) != 0 {
            broken.push(format!("batch [{label}]: a duplicate's body ran"));
        }
        for out in outs {
            judge(&mut broken, "batch", label, &value, out, same);
        }
        // A single duplicate after the batch.
        let dup = gate
            .guard(&id)
            .replay()
            .run(async { Ok::<T, Rejected>(value.clone()) })
            .await;
        judge(
            &mut broken,
            "batch then guard.run",
            label,
            &value,
            dup,
            same,
        );
    }

    // 7. the reconciler's Verdict::succeeded_with
    {
        let action = testing::unique_name("rv_rv");
        let id = Identity::new(action.as_str()).part(tag.as_str());
        let claim = gate.claim(&id).await.expect("claim");
        claim
            .dispose(Disposition::InDoubt)
            .await
            .expect("held in doubt");
        match Verdict::succeeded_with(&value) {
            Err(_) => {
                // Refused: fine, as long as the value would not read back.
            }
            Ok(verdict) => {
                let reconciler = Reconciler::new(gate.pool().clone())
                    .account(gate.account_name())
                    .probe(action.clone(), move |_d| {
                        let verdict = verdict.clone();
                        async move { verdict }
                    });
                let pass = reconciler.reconcile_once().await.expect("a pass");
                let _ = pass;
                settled(&mut broken, gate, &id, "Verdict::succeeded_with", label).await;
                let dup = gate
                    .guard(&id)
                    .replay()
                    .run(async { Ok::<T, Rejected>(value.clone()) })
                    .await;
                judge(
                    &mut broken,
                    "Verdict::succeeded_with",
                    label,
                    &value,
                    dup,
                    same,
                );
            }
        }
    }
    broken
}

/// Runs a list of (label, value) through every path; fails with every
/// promise broken.
macro_rules! check_values {
    ($gate:expr, $same:expr, [$(($label:expr, $value:expr)),* $(,)?]) => {{
        let mut broken: Vec<String> = Vec::new();
        $( broken.extend(every_path(&$gate, $label, $value, $same).await); )*
        broken
    }};
}

fn report(broken: Vec<String>) {
    assert!(
        broken.is_empty(),
        "{} promise(s) of replay broke:\n{}",
        broken.len(),
        broken.join("\n")
    );
}

fn bits_same(a: &f64, b: &f64) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// Floats JSON cannot say (NaN, infinities) and ones it can only just say
/// (-0.0, 1e308, the smallest subnormal, f64::MAX): compared bit for bit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_floats_are_the_first_callers_bit_for_bit_or_refused() {
    let gate = testing::gate().await;
    let broken = check_values!(
        gate,
        bits_same,
        [
            ("NaN", f64::NAN),
            ("+inf", f64::INFINITY),
            ("-inf", f64::NEG_INFINITY),
            ("-0.0", -0.0f64),
            ("1e308", 1e308f64),
            ("min subnormal", f64::from_bits(1)),
            ("f64::MAX", f64::MAX),
            ("f64::MIN_POSITIVE", f64::MIN_POSITIVE),
            ("0.1+0.2", 0.1f64 + 0.2f64),
        ]
    );
    let mut broken = broken;
    broken.extend(check_values!(
        gate,
        debug_same::<Option<f64>>,
        [
            ("Some(NaN)", Some(f64::NAN)),
            ("Some(inf)", Some(f64::INFINITY)),
            ("Some(-0.0)", Some(-0.0f64)),
        ]
    ));
    broken.extend(check_values!(
        gate,
        debug_same::<Vec<f32>>,
        [
            ("[f32 NaN]", vec![f32::NAN]),
            ("[0.1f32, -0.0f32, f32::MAX]", vec![0.1f32, -0.0, f32::MAX]),
        ]
    ));
    report(broken);
}

/// A float serde_json's default parser may not read back exactly (its fast
/// path is not exact for every input without `float_roundtrip`): every
/// such float found among many is either replayed bit for bit or refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_floats_serde_json_does_not_read_back_exactly_are_never_replayed_wrong() {
    // Find floats whose text does not parse back to the same bits.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut lossy = Vec::new();
    for _ in 0..2_000_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let f = f64::from_bits(x);
        if !f.is_finite() {
            continue;
        }
        let text = serde_json::to_string(&f).unwrap();
        let back: f64 = serde_json::from_str(&text).unwrap();
        if back.to_bits() != f.to_bits() {
            lossy.push(f);
            if lossy.len() >= 3 {
                break;
            }
        }
    }
    eprintln!(
        "{} floats serde_json does not read back: {lossy:?}",
        lossy.len()
    );
    let gate = testing::gate().await;
    let mut broken = Vec::new();
    for f in lossy {
        broken.extend(every_path(&gate, &format!("lossy {f:e}"), f, bits_same).await);
    }
    report(broken);
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct UnitStruct;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum Colour {
    Red,
    Green,
    Rgb(u8, u8, u8),
}

/// `Some(())`, `Some(None)`, `Some(Value::Null)`, `Some(UnitStruct)`: all
/// written `null`, which reads back `None`: never replayed as `None`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_values_json_writes_as_null_are_never_replayed_as_none() {
    let gate = testing::gate().await;
    let mut broken = check_values!(
        gate,
        debug_same::<Option<()>>,
        [("Some(())", Some(())), ("None::<()>", None),]
    );
    broken.extend(check_values!(
        gate,
        debug_same::<Option<Option<i32>>>,
        [
            ("Some(None)", Some(None)),
            ("Some(Some(1))", Some(Some(1))),
            ("None", None),
        ]
    ));
    broken.extend(check_values!(
        gate,
        debug_same::<Option<serde_json::Value>>,
        [("Some(Value::Null)", Some(serde_json::Value::Null)),]
    ));
    broken.extend(check_values!(
        gate,
        debug_same::<Option<UnitStruct>>,
        [("Some(UnitStruct)", Some(UnitStruct)),]
    ));
    broken.extend(check_values!(
        gate,
        debug_same::<Vec<Option<()>>>,
        [("[Some(()), None]", vec![Some(()), None]),]
    ));
    broken.extend(check_values!(
        gate,
        debug_same::<BTreeMap<String, Option<Option<u8>>>>,
        [(
            "{a: Some(None)}",
            BTreeMap::from([("a".to_owned(), Some(None))])
        ),]
    ));
    report(broken);
}

/// Values JSON says exactly, which "any value it can write is kept" covers:
/// the unit, a unit struct, unit variants, u128/i128 extremes, NUL
/// characters, a long string, `serde_json::Value`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_values_json_says_exactly_are_replayed_or_refused_never_changed() {
    let gate = testing::gate().await;
    let mut broken = check_values!(gate, debug_same::<()>, [("()", ())]);
    broken.extend(check_values!(
        gate,
        debug_same::<UnitStruct>,
        [("UnitStruct", UnitStruct)]
    ));
    broken.extend(check_values!(
        gate,
        debug_same::<Colour>,
        [
            ("Colour::Red", Colour::Red),
            ("Colour::Rgb", Colour::Rgb(1, 2, 3)),
        ]
    ));
    broken.extend(check_values!(
        gate,
        debug_same::<u128>,
        [("u128::MAX", u128::MAX), ("2^64", 1u128 << 64),]
    ));
    broken.extend(check_values!(
        gate,
        debug_same::<i128>,
        [("i128::MIN", i128::MIN)]
    ));
    broken.extend(check_values!(
        gate,
        debug_same::<String>,
        [
            ("NULs", "a\0b\0\u{7f}\u{2028}\u{feff}".to_owned()),
            ("1 MiB", "x".repeat(1 << 20)),
        ]
    ));
    broken.extend(check_values!(gate, debug_same::<char>, [("'\\0'", '\0')]));
    broken.extend(check_values!(gate, debug_same::<serde_json::Value>, [
        ("Value::Null", serde_json::Value::Null),
        ("Value obj", serde_json::json!({"z": 1, "a": [null, "\u{0}", 1.5, -0.0, 18446744073709551615u64]})),
    ]));
    report(broken);
}

/// Whether a replayed value keeps everything its author kept: a value
/// whose text would read back as something else is "not kept".
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
enum Untagged {
    Float(f64),
    Int(i64),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct WithSkipped {
    shown: u32,
    #[serde(skip)]
    hidden: u32,
}

/// `#[serde(untagged)]`: `Int(1)` is written `1`, which reads back as
/// `Float(1.0)`: "another value" if replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_untagged_enum_that_reads_back_as_another_variant_is_never_replayed() {
    let gate = testing::gate().await;
    let broken = check_values!(
        gate,
        debug_same::<Untagged>,
        [
            ("Untagged::Int(1)", Untagged::Int(1)),
            ("Untagged::Float(1.5)", Untagged::Float(1.5)),
        ]
    );
    report(broken);
}

/// src/idempotent.md (`replay`): a value is replayed "as its type's serde
/// implementation writes and reads it: a field serde skips
/// (`#[serde(skip)]`) comes back as its default". idem cannot see what
/// serde never writes; the docs say so, and this pins it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_a_serde_skip_field_comes_back_as_its_default_as_documented() {
    let gate = testing::gate().await;
    let id = Identity::new("rv_replay_skip").part(testing::unique_name("s").as_str());
    let first: Result<WithSkipped, Rejected> = gate
        .guard(&id)
        .replay()
        .run(async {
            Ok(WithSkipped {
                shown: 1,
                hidden: 7,
            })
        })
        .await;
    assert_eq!(
        first.as_ref().map(|v| (v.shown, v.hidden)).ok(),
        Some((1, 7))
    );
    let again: Result<WithSkipped, Rejected> = gate
        .guard(&id)
        .replay()
        .run(async { panic!("a duplicate of a settled call never runs") })
        .await;
    assert_eq!(
        again.as_ref().map(|v| (v.shown, v.hidden)).ok(),
        Some((1, 0))
    );
}

fn map_same(a: &HashMap<i32, String>, b: &HashMap<i32, String>) -> bool {
    a == b
}

/// Maps: non-string keys JSON writes as strings (kept); a `HashMap` of
/// many keys, whose order a new map does not keep; keys that fail to
/// serialize (a tuple): the success is not lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_maps_with_non_string_keys_are_kept_or_refused_and_never_lose_the_success() {
    let gate = testing::gate().await;
    let many: HashMap<i32, String> = (0..40).map(|i| (i, format!("v{i}"))).collect();
    let mut broken = check_values!(gate, map_same, [("HashMap<i32,_> of 40", many.clone())]);
    broken.extend(check_values!(
        gate,
        debug_same::<BTreeMap<bool, u8>>,
        [(
            "BTreeMap<bool,_>",
            BTreeMap::from([(false, 0u8), (true, 1)])
        ),]
    ));
    broken.extend(check_values!(
        gate,
        debug_same::<BTreeMap<(i32, i32), u8>>,
        [(
            "tuple keys (fail to serialize)",
            BTreeMap::from([((1, 2), 3u8)])
        ),]
    ));
    report(broken);
}

/// Whether a HashMap of many keys is kept at all: "any value it can
/// write is kept" (src/idempotent.md, `replay`). A refusal here is
/// allowed by the first promise but breaks this one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_a_hashmap_of_many_keys_is_kept() {
    let gate = testing::gate().await;
    let many: HashMap<String, u32> = (0..40).map(|i| (format!("k{i}"), i)).collect();
    let id = Identity::new("rv_replay_hashmap").part(testing::unique_name("m").as_str());
    let first: Result<HashMap<String, u32>, Rejected> = gate
        .guard(&id)
        .replay()
        .run(async { Ok(many.clone()) })
        .await;
    assert_eq!(first.as_ref().ok(), Some(&many));
    let dup: Result<HashMap<String, u32>, Rejected> = gate
        .guard(&id)
        .replay()
        .run(async { Ok(HashMap::new()) })
        .await;
    assert!(
        matches!(&dup, Ok(v) if *v == many),
        "\"It is kept as the text serde_json wrote, so any value it can write is kept\": a \
         HashMap of 40 keys was not replayed: {:?}",
        dup.map(|m| m.len())
    );
}

/// Box<RawValue>: kept "as the text serde_json wrote": a duplicate gets
/// the same text, whitespace and key order included, or a refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_raw_json_is_replayed_as_the_same_text_or_refused() {
    use serde_json::value::RawValue;
    let gate = testing::gate().await;
    let raw: Box<RawValue> =
        RawValue::from_string("{ \"z\" : 1 ,\"a\":[1.0, -0.0, 1e400] , \"z\": 2 }".to_owned())
            .expect("raw json");
    #[allow(
        clippy::borrowed_box,
        reason = "compared as the type every path hands back"
    )]
    fn same_text(a: &Box<RawValue>, b: &Box<RawValue>) -> bool {
        a.get() == b.get()
    }
    let broken = every_path(&gate, "RawValue", raw, same_text).await;
    report(broken);
}

/// `Verdict::succeeded_with`: "An error when `value` would not read back
/// as itself (see Claim::settle_value)". The same values Claim refuses.
#[test]
fn replay_succeeded_with_refuses_every_value_that_would_not_read_back() {
    let mut broken = Vec::new();
    if Verdict::succeeded_with(&f64::NAN).is_ok() {
        broken.push("NaN");
    }
    if Verdict::succeeded_with(&Some(())).is_ok() {
        broken.push("Some(())");
    }
    if Verdict::succeeded_with(&Some(None::<u8>)).is_ok() {
        broken.push("Some(None)");
    }
    if Verdict::succeeded_with(&Some(f64::INFINITY)).is_ok() {
        broken.push("Some(inf)");
    }
    if Verdict::succeeded_with(&Untagged::Int(1)).is_ok() {
        broken.push("Untagged::Int(1)");
    }
    if Verdict::step_succeeded_with("s", &Some(())).is_ok() {
        broken.push("step Some(())");
    }
    assert!(
        broken.is_empty(),
        "Verdict::succeeded_with took values that do not read back as themselves: {broken:?}"
    );
}

// The attribute's `replay`, for the values JSON cannot say.

#[idem::idempotent(key = "k", replay)]
async fn attr_opt_unit(
    gate: &Gate,
    k: &str,
    v: Option<()>,
    runs: &AtomicUsize,
) -> Result<Option<()>, Rejected> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(v)
}

#[idem::idempotent(key = "k", replay)]
async fn attr_opt_float(
    gate: &Gate,
    k: &str,
    v: Option<f64>,
    runs: &AtomicUsize,
) -> Result<Option<f64>, Rejected> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(v)
}

#[idem::idempotent(key = "k", replay)]
async fn attr_untagged(
    gate: &Gate,
    k: &str,
    v: Untagged,
    runs: &AtomicUsize,
) -> Result<Untagged, Rejected> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(v)
}

/// src/idempotent.md (`replay`), through `#[idempotent(replay)]`: the first
/// caller gets its own value, a duplicate the same or `AlreadyDone`, and
/// the success is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_through_the_attribute_never_hands_another_value() {
    let gate = testing::gate().await;
    let runs = AtomicUsize::new(0);
    let mut broken = Vec::new();
    let k = testing::unique_name("a");
    let first = attr_opt_unit(&gate, &k, Some(()), &runs).await;
    if !matches!(first, Ok(Some(()))) {
        broken.push(format!("Some(()): the first caller got {first:?}"));
    }
    let dup = attr_opt_unit(&gate, &k, None, &runs).await;
    judge(
        &mut broken,
        "attribute",
        "Some(())",
        &Some(()),
        dup,
        debug_same,
    );
    let first = attr_opt_float(&gate, &k, Some(f64::NAN), &runs).await;
    if !matches!(first, Ok(Some(f)) if f.is_nan()) {
        broken.push(format!("Some(NaN): the first caller got {first:?}"));
    }
    let dup = attr_opt_float(&gate, &k, Some(1.0), &runs).await;
    judge(
        &mut broken,
        "attribute",
        "Some(NaN)",
        &Some(f64::NAN),
        dup,
        debug_same,
    );
    let first = attr_untagged(&gate, &k, Untagged::Int(7), &runs).await;
    if !matches!(first, Ok(Untagged::Int(7))) {
        broken.push(format!("Untagged::Int(7): the first caller got {first:?}"));
    }
    let dup = attr_untagged(&gate, &k, Untagged::Int(8), &runs).await;
    judge(
        &mut broken,
        "attribute",
        "Untagged::Int(7)",
        &Untagged::Int(7),
        dup,
        debug_same,
    );
    assert_eq!(runs.load(Ordering::SeqCst), 3, "a duplicate's body ran");
    report(broken);
}

/// A step whose value JSON cannot say: "the body still gets the value"
/// (src/idempotent.md, steps): a body gets `Some(NaN)`, not `None`, from
/// its own step, and a retry is never handed `None` for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_a_step_value_json_cannot_say_reaches_its_own_body_intact() {
    let gate = testing::gate().await;
    let id = Identity::new("rv_step_nan").part(testing::unique_name("s").as_str());
    let seen: Result<Option<f64>, Rejected> = gate
        .guard(&id)
        .run(async {
            let v: Option<f64> = idem::step("nan", async { Ok::<_, Rejected>(Some(f64::NAN)) })
                .repeatable()
                .await?;
            Ok::<Option<f64>, Rejected>(v)
        })
        .await;
    assert!(
        matches!(seen, Ok(Some(f)) if f.is_nan()),
        "the body got {seen:?} from its own step, not Some(NaN)"
    );
}
