//! Hostile input, by property: the identity encoding is injective, every
//! address has one shape, and keys, accounts and namespaces of any content
//! either work end to end against PostgreSQL or are refused with a reason,
//! never run twice.
//!
//! Case counts are modest so that CI stays fast; `PROPTEST_CASES=100000`
//! runs more.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use idem::sqlx;
use idem::{Gate, Identity, KeyPart, PartWriter, PartWritten, Rejected};
use idem_test_support::XorShift;
use proptest::prelude::*;

/// A key part as a test generates it: every kind of value `KeyPart` knows,
/// in several Rust types that must encode alike when their values agree.
#[derive(Debug, Clone)]
enum Part {
    Text(String),
    Char(char),
    Bytes(Vec<u8>),
    Signed(i128),
    Unsigned(u128),
    Small(i8),
    Wide(u64),
    Bool(bool),
    Uuid([u8; 16]),
}

/// What a part means, which is what the encoding must follow: `'x'` and
/// `"x"` are one value, and so are `7u8` and `7i128`; `7` and `"7"` are not.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Value {
    Text(String),
    Bytes(Vec<u8>),
    /// Sign and magnitude, so that every integer type compares by value.
    Integer(bool, u128),
    Bool(bool),
    Uuid([u8; 16]),
}

impl Part {
    fn value(&self) -> Value {
        let integer = |value: i128| Value::Integer(value < 0, value.unsigned_abs());
        match self {
            Part::Text(text) => Value::Text(text.clone()),
            Part::Char(c) => Value::Text(c.to_string()),
            Part::Bytes(bytes) => Value::Bytes(bytes.clone()),
            Part::Signed(n) => integer(*n),
            Part::Unsigned(n) => Value::Integer(false, *n),
            Part::Small(n) => integer(i128::from(*n)),
            Part::Wide(n) => Value::Integer(false, u128::from(*n)),
            Part::Bool(b) => Value::Bool(*b),
            Part::Uuid(bytes) => Value::Uuid(*bytes),
        }
    }
}

/// A UUID through the public writer, so this runs without the `uuid` feature.
struct RawUuid([u8; 16]);

impl KeyPart for RawUuid {
    fn write_key_part(&self, out: PartWriter<'_>) -> PartWritten {
        out.uuid(self.0)
    }
}

fn identity(action: &str, parts: &[Part]) -> Identity {
    parts
        .iter()
        .fold(Identity::new(action), |id, part| match part {
            Part::Text(text) => id.part(text.as_str()),
            Part::Char(c) => id.part(*c),
            Part::Bytes(bytes) => id.part(bytes.as_slice()),
            Part::Signed(n) => id.part(*n),
            Part::Unsigned(n) => id.part(*n),
            Part::Small(n) => id.part(*n),
            Part::Wide(n) => id.part(*n),
            Part::Bool(b) => id.part(*b),
            Part::Uuid(bytes) => id.part(RawUuid(*bytes)),
        })
}

/// Short strings over a few characters collide often (which is what an
/// injectivity test needs); `any::<String>()` covers the rest of Unicode.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[ab,:|\\\\\0\"' 7-]{0,4}",
        any::<String>(),
        prop::collection::vec(any::<u8>(), 0..16)
            .prop_map(|bytes| String::from_utf8_lossy(&bytes).into_owned()),
    ]
}

fn part() -> impl Strategy<Value = Part> {
    prop_oneof![
        4 => text().prop_map(Part::Text),
        1 => any::<char>().prop_map(Part::Char),
        1 => prop_oneof![Just('a'), Just('7'), Just('\0')].prop_map(Part::Char),
        2 => prop::collection::vec(prop_oneof![Just(b'a'), Just(0u8), any::<u8>()], 0..8)
            .prop_map(Part::Bytes),
        2 => prop_oneof![any::<i128>(), -3i128..3].prop_map(Part::Signed),
        1 => prop_oneof![any::<u128>(), 0u128..3].prop_map(Part::Unsigned),
        1 => any::<i8>().prop_map(Part::Small),
        1 => prop_oneof![any::<u64>(), 0u64..3].prop_map(Part::Wide),
        1 => any::<bool>().prop_map(Part::Bool),
        1 => any::<[u8; 16]>().prop_map(Part::Uuid),
    ]
}

fn parts() -> impl Strategy<Value = Vec<Part>> {
    prop::collection::vec(part(), 0..5)
}

fn action() -> impl Strategy<Value = String> {
    prop_oneof![Just("charge".to_owned()), Just(String::new()), text()]
}

/// How the second identity of a pair is made from the first: where an
/// ambiguous encoding would make two different identities collide.
#[derive(Debug, Clone)]
enum Tweak {
    /// The very same parts, through fresh values.
    Same,
    /// Two neighbouring text parts joined and split elsewhere:
    /// `("ab", "c")` against `("a", "bc")`.
    Resplit(prop::sample::Index, prop::sample::Index),
    /// One part's digits or bytes under another kind: `7` against `"7"`,
    /// `"ab"` against `b"ab"`, `true` against `1`.
    Retype(prop::sample::Index),
    /// One part more.
    Push(Part),
    /// One part less.
    Pop,
    /// The action's tail moved into a first part: `"ab"` against `"a", "b"`.
    ActionIntoPart,
    /// Another identity altogether.
    Other(String, Vec<Part>),
}

fn tweak() -> impl Strategy<Value = Tweak> {
    prop_oneof![
        Just(Tweak::Same),
        (any::<prop::sample::Index>(), any::<prop::sample::Index>())
            .prop_map(|(at, cut)| Tweak::Resplit(at, cut)),
        any::<prop::sample::Index>().prop_map(Tweak::Retype),
        part().prop_map(Tweak::Push),
        Just(Tweak::Pop),
        Just(Tweak::ActionIntoPart),
        (action(), parts()).prop_map(|(action, parts)| Tweak::Other(action, parts)),
    ]
}

fn apply(action: &str, parts: &[Part], tweak: Tweak) -> (String, Vec<Part>) {
    let mut action = action.to_owned();
    let mut parts = parts.to_vec();
    match tweak {
        Tweak::Same => {}
        Tweak::Resplit(at, cut) => {
            let pairs: Vec<usize> = (0..parts.len().saturating_sub(1))
                .filter(|&i| matches!((&parts[i], &parts[i + 1]), (Part::Text(_), Part::Text(_))))
                .collect();
            if !pairs.is_empty() {
                let i = pairs[at.index(pairs.len())];
                if let (Part::Text(left), Part::Text(right)) = (&parts[i], &parts[i + 1]) {
                    let joined = format!("{left}{right}");
                    let boundaries: Vec<usize> = (0..=joined.len())
                        .filter(|&b| joined.is_char_boundary(b))
                        .collect();
                    let b = boundaries[cut.index(boundaries.len())];
                    parts[i] = Part::Text(joined[..b].to_owned());
                    parts[i + 1] = Part::Text(joined[b..].to_owned());
                }
            }
        }
        Tweak::Retype(at) if !parts.is_empty() => {
            let i = at.index(parts.len());
            parts[i] = match &parts[i] {
                Part::Text(text) => Part::Bytes(text.clone().into_bytes()),
                Part::Bytes(bytes) => Part::Text(String::from_utf8_lossy(bytes).into_owned()),
                Part::Signed(n) => Part::Text(n.to_string()),
                Part::Unsigned(n) => Part::Signed(i128::try_from(*n).unwrap_or(-1)),
                Part::Small(n) => Part::Signed(i128::from(*n)),
                Part::Wide(n) => Part::Unsigned(u128::from(*n)),
                Part::Char(c) => Part::Text(c.to_string()),
                Part::Bool(b) => Part::Unsigned(u128::from(*b)),
                Part::Uuid(bytes) => Part::Bytes(bytes.to_vec()),
            };
        }
        Tweak::Retype(_) => {}
        Tweak::Push(part) => parts.push(part),
        Tweak::Pop => {
            parts.pop();
        }
        Tweak::ActionIntoPart => {
            let split = action
                .char_indices()
                .nth(1)
                .map_or(action.len(), |(i, _)| i);
            parts.insert(0, Part::Text(action[split..].to_owned()));
            action.truncate(split);
        }
        Tweak::Other(other_action, other_parts) => return (other_action, other_parts),
    }
    (action, parts)
}

/// `^claim_[0-9a-f]{24}$`, spelt out.
fn is_claim_address(address: &str) -> bool {
    address.strip_prefix("claim_").is_some_and(|digest| {
        digest.len() == 24
            && digest
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, failure_persistence: None, ..ProptestConfig::default() })]

    /// Two identities encode alike exactly when their actions and part
    /// values agree, and their addresses agree exactly when their encodings do.
    #[test]
    fn the_encoding_is_injective(
        (action_a, parts_a, tweak) in (action(), parts(), tweak()),
    ) {
        let (action_b, parts_b) = apply(&action_a, &parts_a, tweak);
        let a = identity(&action_a, &parts_a);
        let b = identity(&action_b, &parts_b);
        let same_values = action_a == action_b
            && parts_a.iter().map(Part::value).eq(parts_b.iter().map(Part::value));
        prop_assert_eq!(a.canonical() == b.canonical(), same_values, "{:?} vs {:?}", a, b);
        prop_assert_eq!(a.address() == b.address(), same_values, "{:?} vs {:?}", a, b);
    }

    /// Every encoding reads back as the identity it came from: decoding
    /// undoes encoding, so no two identities share an encoding.
    #[test]
    fn every_encoding_reads_back((action, parts) in (action(), parts())) {
        let id = identity(&action, &parts);
        let back = Identity::from_canonical(id.canonical());
        prop_assert_eq!(back.as_ref(), Ok(&id));
        prop_assert_eq!(id.part_count(), parts.len());
    }

    #[test]
    fn every_address_is_claim_and_24_lowercase_hex((action, parts) in (action(), parts())) {
        let address = identity(&action, &parts).address();
        prop_assert!(is_claim_address(&address), "{}", address);
    }

    /// Stored bytes are read back by the CLI: arbitrary bytes are refused
    /// with a reason or accepted only when they re-encode to themselves.
    #[test]
    fn arbitrary_bytes_never_decode_to_something_else(
        tail in prop::collection::vec(any::<u8>(), 0..64),
        magic in any::<bool>(),
    ) {
        let mut bytes = if magic { b"idem\x01".to_vec() } else { Vec::new() };
        bytes.extend_from_slice(&tail);
        if let Ok(id) = Identity::from_canonical(&bytes) {
            prop_assert_eq!(id.canonical(), bytes.as_slice());
        }
    }
}

/// One runtime and one gate for every case of the end-to-end properties.
struct Shared {
    runtime: tokio::runtime::Runtime,
    gate: Gate,
}

fn shared() -> &'static Shared {
    static SHARED: OnceLock<Shared> = OnceLock::new();
    SHARED.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let gate = runtime
            .block_on(async { idem::testing::gate_on(idem::testing::pool_with(4).await).await });
        Shared { runtime, gate }
    })
}

/// Runs `id` twice in `gate`'s scope and checks the row it leaves.
async fn runs_once(gate: &Gate, id: &Identity) -> Result<(), TestCaseError> {
    let runs = AtomicUsize::new(0);
    let body = || async {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, Rejected>(())
    };
    let first = gate.run(id, body()).await;
    if gate.account_name().contains('\0') || gate.namespace_name().is_some_and(|n| n.contains('\0'))
    {
        prop_assert!(
            matches!(first, Err(Rejected::InvalidScope { .. })),
            "{:?}",
            first
        );
        prop_assert_eq!(runs.load(Ordering::SeqCst), 0);
        return Ok(());
    }
    prop_assert!(first.is_ok(), "{:?} in {:?}", first, gate);
    let again = gate.run(id, body()).await;
    prop_assert!(matches!(again, Err(Rejected::AlreadyDone)), "{:?}", again);
    prop_assert_eq!(runs.load(Ordering::SeqCst), 1);
    let stored: Vec<(String, Option<String>, String, Vec<u8>)> = sqlx::query_as(
        "SELECT account, namespace, state, identity FROM idem_records \
         WHERE kind = 'claim' AND address = $1 AND account = $2",
    )
    .bind(id.address())
    .bind(gate.account_name())
    .fetch_all(gate.pool())
    .await
    .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let expected = (
        gate.account_name().to_owned(),
        gate.namespace_name().map(str::to_owned),
        "success".to_owned(),
        id.canonical().to_vec(),
    );
    prop_assert_eq!(stored, vec![expected]);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, failure_persistence: None, ..ProptestConfig::default() })]

    /// Keys of any parts (bytes with NUL, SQL text, emoji, empty), in
    /// accounts and namespaces of any content: each runs once, is refused
    /// after, and its row holds exactly its scope and identity. A NUL in a
    /// scope name is refused before the body.
    #[test]
    fn any_key_in_any_scope_runs_once_end_to_end(
        parts in parts(),
        sql in prop::sample::select(&[
            "'; DROP TABLE idem_records; --",
            "\\x00') ON CONFLICT DO UPDATE SET state = 'success' --",
            "$1 $$ $tag$ E'\\\\'",
        ][..]),
        account in text(),
        namespace in prop::option::of(text()),
    ) {
        let shared = shared();
        // Unique per case (proptest may generate, and shrinking replays, the
        // same inputs twice), whatever the generated name: the table is shared.
        let case = idem::testing::unique_name(shared.gate.account_name());
        let gate = shared.gate.account(format!("{case}/{account}"));
        let gate = match &namespace {
            Some(namespace) => gate.namespace(namespace),
            None => gate,
        };
        let id = identity("hostile", &parts).part(sql);
        shared.runtime.block_on(runs_once(&gate, &id))?;
    }
}

/// An account or namespace name too long for PostgreSQL's unique index
/// (a btree entry holds at most 2704 bytes, and both names are in the key)
/// can never be claimed. The body must not run (it does not), and the
/// refusal must say so for good rather than send the caller retrying a
/// store that is up: today it is `Unavailable` ("retry when the database is
/// reachable"), with `is_retryable() == true`, which retries forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scope_name_too_long_to_index_is_refused_for_good() {
    let gate = idem::testing::gate().await;
    // Incompressible, so PostgreSQL cannot shrink it under the limit.
    let mut rng = XorShift::new(7);
    let long: String = (0..3000)
        .map(|_| char::from(b'a' + rng.below(26) as u8))
        .collect();
    let runs = AtomicUsize::new(0);
    let body = || async {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, Rejected>(())
    };
    let in_account = gate.account(format!("{}/{long}", gate.account_name()));
    let in_namespace = gate.namespace(&long);
    for scoped in [in_account, in_namespace] {
        let result = scoped.run(&Identity::new("long").part(1), body()).await;
        assert_eq!(runs.load(Ordering::SeqCst), 0, "the body must not run");
        let rejected = result.expect_err("a scope PostgreSQL cannot index is refused");
        assert!(
            !rejected.is_retryable() && !matches!(rejected, Rejected::Unavailable { .. }),
            "a name that can never be stored is reported as a store outage, so callers retry \
             forever: {rejected}"
        );
    }
}
