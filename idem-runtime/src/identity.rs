//! Identities and their canonical encoding.
//!
//! An identity is an action name plus ordered key parts. Its canonical
//! encoding is what gets hashed into an address and stored beside the claim,
//! so it is **stable forever**: a changed encoding would silently re-run every
//! action ever settled. The golden vectors in `tests/testsuite/identity/golden.rs` pin it.
//!
//! # Encoding, version 1
//!
//! ```text
//! identity = MAGIC field(b'a', action) field(tag, part)*
//! MAGIC    = b"idem\x01"
//! field    = tag: u8, length: u64 big-endian, payload: [u8; length]
//! ```
//!
//! | tag | kind | payload |
//! |---|---|---|
//! | `a` | the action name | UTF-8 |
//! | `s` | text (`str`, `String`, `char`) | UTF-8 |
//! | `b` | bytes (`[u8]`, `Vec<u8>`) | the bytes |
//! | `i` | integer (every integer type) | ASCII decimal: `0`, `42`, `-7`; no `+`, no leading zeros |
//! | `t` | boolean | one byte, `0` or `1` |
//! | `u` | UUID | the 16 bytes |
//!
//! Every field says how long it is, so the encoding parses one way only:
//! `("ab", "c")` and `("a", "bc")` differ, and so do parts that contain any
//! separator one might have picked. The encoding follows values, not Rust
//! types: `7u8` and `7i64` are the same part (widening a column keeps its
//! slots), `'x'` and `"x"` are the same part, while `7` and `"7"` differ.

//!
//! # Steps and downstream keys
//!
//! ```text
//! step           = identity field(b'p', step name)        -- no key part is tagged `p`
//! step address   = "step_" hex(sha1(step))[..24]
//! downstream key = "idem_" hex(sha1(b"idem-downstream\x01" field(b'A', account)
//!                                   [field(b'N', namespace)] field(b'S', step)))
//! ```
//!
//! A downstream key keeps the whole digest: a provider cannot re-check a key
//! against the identity behind it as the store does. The golden vectors of
//! this module's tests pin both.

use std::fmt;
use std::sync::Arc;

use sha1::{Digest, Sha1};
use sha2::Sha256;

/// The first bytes of every canonical identity: the format and its version.
const MAGIC: &[u8] = b"idem\x01";
const TAG_ACTION: u8 = b'a';
const TAG_TEXT: u8 = b's';
const TAG_BYTES: u8 = b'b';
const TAG_INTEGER: u8 = b'i';
const TAG_BOOLEAN: u8 = b't';
const TAG_UUID: u8 = b'u';
/// A step's name, after the identity's fields ([`Identity::step_canonical`]).
const TAG_STEP: u8 = b'p';
/// The first bytes of what a downstream key hashes: its format and version.
const DOWNSTREAM_MAGIC: &[u8] = b"idem-downstream\x01";
/// In what a downstream key hashes: the account, the namespace (only when
/// there is one) and the step's canonical encoding.
const TAG_ACCOUNT: u8 = b'A';
const TAG_NAMESPACE: u8 = b'N';
const TAG_STEP_IDENTITY: u8 = b'S';
/// Bytes before a field's payload: its tag and its length.
const FIELD_HEADER: usize = 1 + 8;

/// The prefix of every claim address.
pub const ADDRESS_PREFIX: &str = "claim_";
/// The prefix of every step's address.
pub const STEP_ADDRESS_PREFIX: &str = "step_";
/// The prefix of every downstream key.
pub const DOWNSTREAM_KEY_PREFIX: &str = "idem_";
/// How many hex digits of the sha1 digest an address keeps.
pub const ADDRESS_DIGEST_HEX: usize = 24;

/// What makes an action unique: its name plus ordered key parts.
///
/// ```
/// use idem_runtime::Identity;
///
/// let id = Identity::new("charge").part("ord_1001").part(4_999_i64);
/// assert_eq!(id.address().len(), "claim_".len() + 24);
/// assert!(id.address().starts_with("claim_"));
///
/// // Parts are delimited by their lengths, never by a separator.
/// assert_ne!(
///     Identity::new("a").part("ab").part("c").address(),
///     Identity::new("a").part("a").part("bc").address(),
/// );
/// ```
///
/// A part that is `None` makes the identity *absent*: there is then nothing
/// to claim, and the gate runs that invocation ungated (and says so in a
/// tracing event).
///
/// Cloning is cheap: the encoded bytes are shared until one of the clones
/// gains another part.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Identity {
    action: Arc<str>,
    canonical: Arc<Vec<u8>>,
    parts: usize,
    /// Index of the first part that was `None`, if any.
    first_absent: Option<usize>,
}

impl Identity {
    /// Starts an identity for `action`, with no key parts yet.
    pub fn new(action: impl AsRef<str>) -> Self {
        let action = action.as_ref();
        let mut canonical = Vec::with_capacity(MAGIC.len() + FIELD_HEADER + action.len() + 64);
        canonical.extend_from_slice(MAGIC);
        write_field(&mut canonical, TAG_ACTION, action.as_bytes());
        Identity {
            action: Arc::from(action),
            canonical: Arc::new(canonical),
            parts: 0,
            first_absent: None,
        }
    }

    /// Appends a key part: anything that implements [`KeyPart`].
    #[must_use = "`part` returns the extended identity"]
    pub fn part(mut self, part: impl KeyPart) -> Self {
        let writer = PartWriter {
            canonical: Arc::make_mut(&mut self.canonical),
            absent: false,
        };
        let PartWritten { absent } = part.write_key_part(writer);
        if absent && self.first_absent.is_none() {
            self.first_absent = Some(self.parts);
        }
        self.parts += 1;
        self
    }

    /// The action name.
    pub fn action(&self) -> &str {
        &self.action
    }

    /// The action name, shared: a metric's label takes it without copying.
    #[cfg(feature = "metrics")]
    pub(crate) fn shared_action(&self) -> &Arc<str> {
        &self.action
    }

    /// How many key parts were appended, absent ones included.
    pub fn part_count(&self) -> usize {
        self.parts
    }

    /// `true` when a key part was `None`: there is no slot to claim.
    pub fn is_absent(&self) -> bool {
        self.first_absent.is_some()
    }

    /// The position (from 0) of the first key part that was `None`.
    pub fn first_absent_part(&self) -> Option<usize> {
        self.first_absent
    }

    /// The canonical encoding (see the module docs). It is what the address
    /// hashes, and what the store keeps to re-check a hit.
    pub fn canonical(&self) -> &[u8] {
        &self.canonical
    }

    /// Whether `stored`, the identity a claim's row keeps, is this
    /// identity's: its canonical encoding, or, once a prune compacted the
    /// row past its value's window, the [`compacted`] check of it.
    pub(crate) fn is_stored_as(&self, stored: &[u8]) -> bool {
        if stored.len() == COMPACTED_LEN {
            return stored == compacted(&self.canonical);
        }
        stored == &self.canonical[..]
    }

    /// Reads back a canonical encoding, as stored in `idem_records.identity`,
    /// checking that it is one this version of the encoding can produce.
    ///
    /// ```
    /// use idem_runtime::Identity;
    ///
    /// let id = Identity::new("charge").part("ord_1").part(-5);
    /// let back = Identity::from_canonical(id.canonical()).unwrap();
    /// assert_eq!(back, id);
    /// assert_eq!(format!("{back:?}"), r#"Identity { action: "charge", parts: ["ord_1", -5], absent: false }"#);
    /// ```
    pub fn from_canonical(canonical: &[u8]) -> Result<Identity, NotCanonical> {
        if is_compacted(canonical) {
            return Err(NotCanonical(
                "compacted past its value's window: only a check of the identity is kept",
            ));
        }
        let fields = canonical.strip_prefix(MAGIC).ok_or(NotCanonical(
            "it does not start with idem's magic bytes and version 1",
        ))?;
        let mut iter = Fields(fields);
        let mut consumed = MAGIC.len();
        let action = match iter.next() {
            Some(Field {
                tag: TAG_ACTION,
                payload,
            }) => {
                std::str::from_utf8(payload).map_err(|_| NotCanonical("the action is not UTF-8"))?
            }
            _ => return Err(NotCanonical("it does not begin with the action")),
        };
        consumed += FIELD_HEADER + action.len();
        let mut parts = 0;
        for field in iter.by_ref() {
            consumed += FIELD_HEADER + field.payload.len();
            parts += 1;
            let valid = match field.tag {
                TAG_TEXT => std::str::from_utf8(field.payload).is_ok(),
                TAG_BYTES => true,
                TAG_INTEGER => is_canonical_decimal(field.payload),
                TAG_BOOLEAN => matches!(field.payload, [0] | [1]),
                TAG_UUID => field.payload.len() == 16,
                _ => false,
            };
            if !valid {
                return Err(NotCanonical(
                    "a part has an unknown tag or a malformed value",
                ));
            }
        }
        if consumed != canonical.len() {
            return Err(NotCanonical("it ends inside a field"));
        }
        Ok(Identity {
            action: Arc::from(action),
            canonical: Arc::new(canonical.to_vec()),
            parts,
            first_absent: None,
        })
    }

    /// The key parts, read back from the canonical encoding: what a
    /// reconciler's probe needs to ask the outside world about the action
    /// (the order id of a charge, say). Absent parts wrote nothing and are
    /// not listed.
    ///
    /// ```
    /// use idem_runtime::{Identity, PartValue};
    ///
    /// let id = Identity::new("charge").part("ord_1").part(4_999_i64).part(true);
    /// let parts: Vec<PartValue<'_>> = id.parts().collect();
    /// assert_eq!(parts[0].as_text(), Some("ord_1"));
    /// assert_eq!(parts[1].as_i128(), Some(4_999));
    /// assert_eq!(parts[2], PartValue::Boolean(true));
    /// ```
    pub fn parts(&self) -> impl Iterator<Item = PartValue<'_>> {
        // The first field is the action; the encoding was checked when it
        // was written or read back, so every field decodes.
        Fields(&self.canonical[MAGIC.len()..])
            .skip(1)
            .filter_map(|field| PartValue::of(field.tag, field.payload))
    }

    /// `"claim_"` followed by the first 24 lowercase hex digits of the sha1
    /// of the canonical encoding.
    ///
    /// The hash turns a key of any content and length into a legal, fixed
    /// size address; it is not there for secrecy. An absent identity still
    /// has an address, but the gate never claims it.
    pub fn address(&self) -> String {
        self.address_with_prefix(ADDRESS_PREFIX)
    }

    /// `prefix` followed by the same 24 hex digits as [`address`](Self::address):
    /// the address of another kind of record derived from this identity.
    pub(crate) fn address_with_prefix(&self, prefix: &str) -> String {
        digest_address(prefix, &self.canonical, ADDRESS_DIGEST_HEX)
    }

    /// The canonical encoding of step `name` of this identity (see
    /// [`step`](crate::step)): the identity's own, then the name as one more
    /// field, tagged `p`, which no key part uses, so a step's encoding is
    /// never an identity's and two steps (or two identities) never share one.
    /// Stable forever, like the identity's: the golden vectors pin it.
    pub(crate) fn step_canonical(&self, name: &str) -> Vec<u8> {
        let mut canonical = Vec::with_capacity(self.canonical.len() + FIELD_HEADER + name.len());
        canonical.extend_from_slice(&self.canonical);
        write_field(&mut canonical, TAG_STEP, name.as_bytes());
        canonical
    }
}

/// How many bytes a compacted row keeps of its identity ([`compacted`]).
/// No canonical encoding is this short (the magic and the action's field
/// header alone are 14 bytes), so the length says which a row holds.
pub(crate) const COMPACTED_LEN: usize = 8;

/// What a claim's row keeps of its identity once a prune compacted it,
/// past the window in which its value is kept
/// ([`keep_value_for`](crate::Guard::keep_value_for)): the first 8 bytes of
/// the SHA-256 of the canonical encoding, which the database computes
/// itself (`substring(sha256(identity) FROM 1 FOR 8)`, PostgreSQL 11 and
/// later). With the 96 bits of SHA-1 the address holds, a refusal still
/// re-checks 160 bits of two digests, so a digest collision is refused,
/// never merged; the identity itself (the action, the key parts) is gone.
/// Stable forever, like the encoding: the golden vectors pin it.
pub(crate) fn compacted(canonical: &[u8]) -> [u8; COMPACTED_LEN] {
    let digest = Sha256::digest(canonical);
    let mut check = [0; COMPACTED_LEN];
    check.copy_from_slice(&digest[..COMPACTED_LEN]);
    check
}

/// Whether `stored`, the identity a claim's row keeps, is the check a
/// prune leaves of it past the value's window
/// ([`keep_value_for`](crate::Guard::keep_value_for)) rather than its
/// canonical encoding: the row no longer says which action and key it was
/// ([`Identity::from_canonical`] refuses it), though a duplicate of it is
/// still refused.
pub fn is_compacted(stored: &[u8]) -> bool {
    stored.len() == COMPACTED_LEN
}

/// The name of the step whose canonical encoding (as a step's row keeps it
/// in `identity`) is `step_canonical`, and the canonical encoding of its
/// claim's identity: what an operator, a reconciler or `idem claims show`
/// reads back. `None` for bytes that are no step's encoding.
pub(crate) fn split_step_canonical(step_canonical: &[u8]) -> Option<(&[u8], &str)> {
    let fields = step_canonical.strip_prefix(MAGIC)?;
    let mut offset = MAGIC.len();
    let mut last = None;
    for field in Fields(fields) {
        let length = FIELD_HEADER + field.payload.len();
        last = Some((offset, field));
        offset += length;
    }
    let (start, field) = last?;
    if offset != step_canonical.len() || field.tag != TAG_STEP {
        return None;
    }
    let name = std::str::from_utf8(field.payload).ok()?;
    Some((&step_canonical[..start], name))
}

/// The address of a step whose canonical encoding is `step_canonical`:
/// [`STEP_ADDRESS_PREFIX`] and the first 24 hex digits of its sha1.
pub(crate) fn step_address(step_canonical: &[u8]) -> String {
    digest_address(STEP_ADDRESS_PREFIX, step_canonical, ADDRESS_DIGEST_HEX)
}

/// The key a step hands to the outside world ([`downstream_key`](crate::downstream_key)):
/// [`DOWNSTREAM_KEY_PREFIX`] and the whole sha1 (40 hex digits) of the
/// account, the namespace (when there is one) and the step's canonical
/// encoding, each a length-delimited field. The whole digest, not 24 digits:
/// a provider cannot re-check a key against the identity it stands for, as
/// the store does, so two keys must never meet. The account and namespace
/// are in it because a slot is scoped by them: two tenants' identical
/// orders are two actions, and must not be deduplicated as one by a
/// provider both reach with the same credentials.
pub(crate) fn downstream_key(
    account: &str,
    namespace: Option<&str>,
    step_canonical: &[u8],
) -> String {
    let mut input = Vec::with_capacity(
        DOWNSTREAM_MAGIC.len() + 2 * FIELD_HEADER + account.len() + step_canonical.len() + 64,
    );
    input.extend_from_slice(DOWNSTREAM_MAGIC);
    write_field(&mut input, TAG_ACCOUNT, account.as_bytes());
    if let Some(namespace) = namespace {
        write_field(&mut input, TAG_NAMESPACE, namespace.as_bytes());
    }
    write_field(&mut input, TAG_STEP_IDENTITY, step_canonical);
    digest_address(DOWNSTREAM_KEY_PREFIX, &input, 40)
}

/// `prefix` and the first `hex` lowercase hex digits of the sha1 of `bytes`.
fn digest_address(prefix: &str, bytes: &[u8], hex: usize) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digest = Sha1::digest(bytes);
    let mut address = String::with_capacity(prefix.len() + hex);
    address.push_str(prefix);
    for byte in &digest[..hex / 2] {
        address.push(char::from(HEX[usize::from(byte >> 4)]));
        address.push(char::from(HEX[usize::from(byte & 0x0f)]));
    }
    address
}

/// `0`, or an optional `-` and digits without a leading zero (no `-0`).
fn is_canonical_decimal(digits: &[u8]) -> bool {
    let magnitude = digits.strip_prefix(b"-").unwrap_or(digits);
    match magnitude {
        [] => false,
        [b'0'] => digits.len() == 1,
        [b'0', ..] => false,
        _ => magnitude.iter().all(u8::is_ascii_digit) && magnitude.len() <= 39,
    }
}

/// One key part of an [`Identity`], as [`Identity::parts`] reads it back.
/// Equal values of different types were written alike (`5_u8` and `5_i64`
/// are one integer), so the type a part was written from is not kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PartValue<'a> {
    /// Text: a `str`, `String` or `char`.
    Text(&'a str),
    /// Raw bytes.
    Bytes(&'a [u8]),
    /// An integer of any type, as its canonical decimal digits (an optional
    /// `-`, no leading zero): integers up to `u128::MAX` are kept.
    Integer(&'a str),
    /// A boolean.
    Boolean(bool),
    /// A UUID's 16 bytes.
    Uuid([u8; 16]),
}

impl<'a> PartValue<'a> {
    fn of(tag: u8, payload: &'a [u8]) -> Option<PartValue<'a>> {
        Some(match tag {
            TAG_TEXT => PartValue::Text(std::str::from_utf8(payload).ok()?),
            TAG_BYTES => PartValue::Bytes(payload),
            TAG_INTEGER => PartValue::Integer(std::str::from_utf8(payload).ok()?),
            TAG_BOOLEAN => PartValue::Boolean(payload == [1]),
            TAG_UUID => PartValue::Uuid(payload.try_into().ok()?),
            _ => return None,
        })
    }

    /// The text, for a text part.
    pub fn as_text(&self) -> Option<&'a str> {
        match self {
            PartValue::Text(text) => Some(text),
            _ => None,
        }
    }

    /// The integer, for an integer part that fits an `i128`.
    pub fn as_i128(&self) -> Option<i128> {
        match self {
            PartValue::Integer(digits) => digits.parse().ok(),
            _ => None,
        }
    }
}

/// Bytes that are not a canonical identity encoding, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("not a canonical idem identity: {0}")]
pub struct NotCanonical(&'static str);

fn write_field(out: &mut Vec<u8>, tag: u8, payload: &[u8]) {
    out.reserve(FIELD_HEADER + payload.len());
    out.push(tag);
    // usize is at most 64 bits on every target Rust supports.
    out.extend_from_slice(&(payload.len() as u64).to_be_bytes());
    out.extend_from_slice(payload);
}

/// Writes decimal digits of `magnitude` (with a leading `-` if `negative`)
/// into a field, without allocating.
fn write_integer_field(out: &mut Vec<u8>, negative: bool, magnitude: u128) {
    // u128::MAX has 39 digits; one more for the sign.
    let mut buf = [0u8; 40];
    let mut start = buf.len();
    // The same digits either way; a magnitude that fits 64 bits (every
    // integer key but the largest u128s) is divided in hardware, not by
    // the 128-bit division routine, which cost a cached refusal 6% of its
    // CPU when it ran digit by digit.
    match u64::try_from(magnitude) {
        Ok(mut small) => loop {
            start -= 1;
            buf[start] = b'0' + (small % 10) as u8;
            small /= 10;
            if small == 0 {
                break;
            }
        },
        Err(_) => {
            let mut large = magnitude;
            loop {
                start -= 1;
                buf[start] = b'0' + (large % 10) as u8;
                large /= 10;
                if large == 0 {
                    break;
                }
            }
        }
    }
    if negative {
        start -= 1;
        buf[start] = b'-';
    }
    write_field(out, TAG_INTEGER, &buf[start..]);
}

impl fmt::Debug for Identity {
    /// Shows the action and the decoded parts; long parts are abbreviated.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Identity")
            .field("action", &self.action)
            .field("parts", &DebugList(&self.canonical[MAGIC.len()..]))
            .field("absent", &self.is_absent())
            .finish()
    }
}

/// Renders the parts of a canonical encoding as a list.
struct DebugList<'a>(&'a [u8]);

impl fmt::Debug for DebugList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(Fields(self.0).skip(1)).finish()
    }
}

/// One decoded field, for `Debug`.
struct Field<'a> {
    tag: u8,
    payload: &'a [u8],
}

impl fmt::Debug for Field<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN: usize = 64;
        let shown = &self.payload[..self.payload.len().min(SHOWN)];
        let more = self.payload.len() - shown.len();
        match (self.tag, std::str::from_utf8(shown)) {
            (TAG_INTEGER, Ok(digits)) => f.write_str(digits)?,
            (TAG_BOOLEAN, _) => write!(f, "{}", self.payload == [1])?,
            (TAG_TEXT, Ok(text)) => write!(f, "{text:?}")?,
            (TAG_UUID, _) => {
                f.write_str("uuid:")?;
                self.payload.iter().try_for_each(|b| write!(f, "{b:02x}"))?;
            }
            _ => write!(f, "bytes:{shown:02x?}")?,
        }
        if more > 0 {
            write!(f, "…(+{more} bytes)")?;
        }
        Ok(())
    }
}

/// Iterates over the fields of a canonical encoding (after `MAGIC`).
struct Fields<'a>(&'a [u8]);

impl<'a> Iterator for Fields<'a> {
    type Item = Field<'a>;

    fn next(&mut self) -> Option<Field<'a>> {
        let (&tag, rest) = self.0.split_first()?;
        let (len, rest) = rest.split_first_chunk::<8>()?;
        let len = usize::try_from(u64::from_be_bytes(*len)).ok()?;
        let payload = rest.get(..len)?;
        self.0 = &rest[len..];
        Some(Field { tag, payload })
    }
}

/// Proof that a [`KeyPart`] wrote exactly one value. Only the methods of
/// [`PartWriter`] make one.
#[must_use = "return the value that the PartWriter method gave you"]
#[derive(Debug)]
pub struct PartWritten {
    absent: bool,
}

/// Where a [`KeyPart`] writes its single value. Each method consumes the
/// writer, so a part writes exactly one value, in one of idem's canonical
/// forms; an implementation cannot produce an ambiguous encoding.
#[derive(Debug)]
pub struct PartWriter<'a> {
    canonical: &'a mut Vec<u8>,
    absent: bool,
}

impl PartWriter<'_> {
    /// Text. `str`, `String` and `char` write this.
    pub fn text(self, value: &str) -> PartWritten {
        self.field(TAG_TEXT, value.as_bytes())
    }

    /// Raw bytes: any content, NUL included.
    pub fn bytes(self, value: &[u8]) -> PartWritten {
        self.field(TAG_BYTES, value)
    }

    /// A signed integer. Equal values write equal parts whatever their type.
    pub fn signed(self, value: i128) -> PartWritten {
        write_integer_field(self.canonical, value < 0, value.unsigned_abs());
        self.done()
    }

    /// An unsigned integer. Equal values write equal parts whatever their type.
    pub fn unsigned(self, value: u128) -> PartWritten {
        write_integer_field(self.canonical, false, value);
        self.done()
    }

    /// A boolean.
    pub fn boolean(self, value: bool) -> PartWritten {
        self.field(TAG_BOOLEAN, &[u8::from(value)])
    }

    /// A UUID, as its 16 bytes (big-endian, as RFC 9562 lays them out).
    pub fn uuid(self, bytes: [u8; 16]) -> PartWritten {
        self.field(TAG_UUID, &bytes)
    }

    /// No value: the identity becomes absent and its invocation runs ungated.
    pub fn absent(mut self) -> PartWritten {
        self.absent = true;
        self.done()
    }

    fn field(self, tag: u8, payload: &[u8]) -> PartWritten {
        write_field(self.canonical, tag, payload);
        self.done()
    }

    fn done(self) -> PartWritten {
        PartWritten {
            absent: self.absent,
        }
    }
}

/// A value that can be part of an idempotency key.
///
/// Implemented for strings, every integer type, `bool`, `char`, byte slices,
/// references, `Option<T>` (where `None` makes the identity absent) and, with
/// the `uuid` feature, `uuid::Uuid`. Your own types implement it by
/// delegating to one of [`PartWriter`]'s methods:
///
/// ```
/// use idem_runtime::{KeyPart, PartWriter, PartWritten};
///
/// struct OrderId(u64);
///
/// impl KeyPart for OrderId {
///     fn write_key_part(&self, out: PartWriter<'_>) -> PartWritten {
///         out.unsigned(u128::from(self.0))
///     }
/// }
/// ```
///
/// Floats are deliberately not key parts: they have no canonical form
/// (`0.1 + 0.2 != 0.3`, `-0.0 == 0.0`, `NaN != NaN`), so two retries of the
/// same request could address different slots.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be part of an idempotency key",
    label = "`{Self}` is not a key part",
    note = "key parts are strings, integers, bool, char, byte slices, Uuid (feature `uuid`), references and Option of those",
    note = "floats have no canonical form (0.1 + 0.2 != 0.3, -0.0 == 0.0, NaN != NaN), so a retry could miss its slot: key on integer minor units (cents) or on a string",
    note = "for your own type, implement `idem::KeyPart` by delegating to one of `PartWriter`'s methods"
)]
pub trait KeyPart {
    /// Writes this part's single value.
    fn write_key_part(&self, out: PartWriter<'_>) -> PartWritten;
}

impl<T: KeyPart + ?Sized> KeyPart for &T {
    fn write_key_part(&self, out: PartWriter<'_>) -> PartWritten {
        (**self).write_key_part(out)
    }
}

impl<T: KeyPart + ?Sized> KeyPart for &mut T {
    fn write_key_part(&self, out: PartWriter<'_>) -> PartWritten {
        (**self).write_key_part(out)
    }
}

impl<T: KeyPart + ?Sized> KeyPart for Box<T> {
    fn write_key_part(&self, out: PartWriter<'_>) -> PartWritten {
        (**self).write_key_part(out)
    }
}

impl<T: KeyPart + ?Sized> KeyPart for Arc<T> {
    fn write_key_part(&self, out: PartWriter<'_>) -> PartWritten {
        (**self).write_key_part(out)
    }
}

impl<T: KeyPart> KeyPart for Option<T> {
    fn write_key_part(&self, out: PartWriter<'_>) -> PartWritten {
        match self {
            Some(value) => value.write_key_part(out),
            None => out.absent(),
        }
    }
}

impl KeyPart for str {
    fn write_key_part(&self, out: PartWriter<'_>) -> PartWritten {
        out.text(self)
    }
}

impl KeyPart for String {
    fn write_key_part(&self, out: PartWriter<'_>) -> PartWritten {
        out.text(self)
    }
}

impl KeyPart for std::borrow::Cow<'_, str> {
    fn write_key_part(&self, out: PartWriter<'_>) -> PartWritten {
        out.text(self)
    }
}

impl KeyPart for char {
    fn write_key_part(&self, out: PartWriter<'_>) -> PartWritten {
        out.text(self.encode_utf8(&mut [0; 4]))
    }
}

impl KeyPart for bool {
    fn write_key_part(&self, out: PartWriter<'_>) -> PartWritten {
        out.boolean(*self)
    }
}

impl KeyPart for [u8] {
    fn write_key_part(&self, out: PartWriter<'_>) -> PartWritten {
        out.bytes(self)
    }
}

impl<const N: usize> KeyPart for [u8; N] {
    fn write_key_part(&self, out: PartWriter<'_>) -> PartWritten {
        out.bytes(self)
    }
}

impl KeyPart for Vec<u8> {
    fn write_key_part(&self, out: PartWriter<'_>) -> PartWritten {
        out.bytes(self)
    }
}

macro_rules! integer_key_parts {
    ($method:ident as $wide:ty: $($ty:ty),*) => {$(
        impl KeyPart for $ty {
            fn write_key_part(&self, out: PartWriter<'_>) -> PartWritten {
                out.$method(<$wide>::from(*self))
            }
        }
    )*};
}

integer_key_parts!(signed as i128: i8, i16, i32, i64, i128);
integer_key_parts!(unsigned as u128: u8, u16, u32, u64, u128);

impl KeyPart for isize {
    fn write_key_part(&self, out: PartWriter<'_>) -> PartWritten {
        // isize is at most 64 bits on every target Rust supports.
        out.signed(*self as i128)
    }
}

impl KeyPart for usize {
    fn write_key_part(&self, out: PartWriter<'_>) -> PartWritten {
        out.unsigned(*self as u128)
    }
}

macro_rules! nonzero_key_parts {
    ($($ty:ty),*) => {$(
        impl KeyPart for $ty {
            fn write_key_part(&self, out: PartWriter<'_>) -> PartWritten {
                self.get().write_key_part(out)
            }
        }
    )*};
}

nonzero_key_parts!(
    std::num::NonZeroI8,
    std::num::NonZeroI16,
    std::num::NonZeroI32,
    std::num::NonZeroI64,
    std::num::NonZeroI128,
    std::num::NonZeroIsize,
    std::num::NonZeroU8,
    std::num::NonZeroU16,
    std::num::NonZeroU32,
    std::num::NonZeroU64,
    std::num::NonZeroU128,
    std::num::NonZeroUsize
);

#[cfg(feature = "uuid")]
#[cfg_attr(docsrs, doc(cfg(feature = "uuid")))]
impl KeyPart for uuid::Uuid {
    fn write_key_part(&self, out: PartWriter<'_>) -> PartWritten {
        out.uuid(*self.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Golden vectors of steps and downstream keys: stable forever, like an
    // address (a changed step address re-runs every recorded step; a
    // changed downstream key makes a provider charge again). Computed by
    // an implementation of their own (Python's hashlib over the bytes the
    // module docs define), not by this code.
    #[test]
    fn step_addresses_and_downstream_keys_match_their_golden_vectors() {
        let step = Identity::new("checkout")
            .part("ord_1001")
            .step_canonical("charge");
        assert_eq!(step_address(&step), "step_0d95c53feaf638e2be1a20e2");
        let keys = [
            (None, "idem_1b07c195d5ff5856574146a749e0b2018ef1da7c"),
            (
                Some("live"),
                "idem_a40c4858a7e4a251de2af2369609cbd6395112a0",
            ),
            // An empty namespace is a namespace: not the same as none.
            (Some(""), "idem_10f6ab502cf6d482ed223a2c6c48656ea9c6a669"),
        ];
        for (namespace, key) in keys {
            assert_eq!(
                downstream_key("acme", namespace, &step),
                key,
                "{namespace:?}"
            );
        }
    }

    #[test]
    fn a_step_s_encoding_reads_back_as_its_claim_s_and_its_name() {
        let id = Identity::new("checkout").part("ord_1001").part(7);
        let step = id.step_canonical("ship: parcel 1");
        assert_eq!(
            split_step_canonical(&step),
            Some((id.canonical(), "ship: parcel 1"))
        );
        // An identity is no step; neither is a step with bytes after it.
        assert_eq!(split_step_canonical(id.canonical()), None);
        let mut longer = step.clone();
        longer.push(0);
        assert_eq!(split_step_canonical(&longer), None);
        // Two steps of two identities never share an encoding, even where
        // the name could be read as a key part.
        let a = Identity::new("a").part("b").step_canonical("c");
        let b = Identity::new("a").step_canonical("b");
        assert_ne!(a, b);
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn integer_fields_are_the_decimal_digits_on_both_sides_of_64_bits() {
        let boundaries = [
            0,
            9,
            10,
            u128::from(u32::MAX),
            u128::from(u64::MAX) - 1,
            u128::from(u64::MAX),
            u128::from(u64::MAX) + 1,
            u128::MAX,
        ];
        for magnitude in boundaries {
            for negative in [false, true] {
                let mut field = Vec::new();
                write_integer_field(&mut field, negative, magnitude);
                let sign = if negative { "-" } else { "" };
                let mut expected = Vec::new();
                write_field(
                    &mut expected,
                    TAG_INTEGER,
                    format!("{sign}{magnitude}").as_bytes(),
                );
                assert_eq!(field, expected, "{sign}{magnitude}");
            }
        }
    }

    #[test]
    fn integers_encode_by_value_not_by_type() {
        let a = Identity::new("x").part(7u8);
        let b = Identity::new("x").part(7i64);
        let c = Identity::new("x").part(std::num::NonZeroU32::new(7));
        assert_eq!(a.canonical(), b.canonical());
        assert_eq!(a.canonical(), c.canonical());
    }

    #[test]
    fn extreme_integers_are_exact_decimals() {
        let min = Identity::new("x").part(i128::MIN);
        let max = Identity::new("x").part(u128::MAX);
        let tail = |id: &Identity| id.canonical()[id.canonical().len() - 40..].to_vec();
        assert!(tail(&min).ends_with(b"-170141183460469231731687303715884105728"));
        assert!(tail(&max).ends_with(b"340282366920938463463374607431768211455"));
    }

    #[test]
    fn text_and_integer_of_the_same_digits_differ() {
        assert_ne!(
            Identity::new("x").part(7).address(),
            Identity::new("x").part("7").address()
        );
    }

    #[test]
    fn char_and_one_char_string_are_the_same_part() {
        assert_eq!(
            Identity::new("x").part('é').canonical(),
            Identity::new("x").part("é").canonical()
        );
    }

    #[test]
    fn none_makes_the_identity_absent_and_remembers_where() {
        let id = Identity::new("x").part(1).part(None::<&str>).part(Some(3));
        assert!(id.is_absent());
        assert_eq!(id.first_absent_part(), Some(1));
        assert_eq!(id.part_count(), 3);
        assert!(!Identity::new("x").part(Some(1)).is_absent());
    }

    #[test]
    fn clones_share_bytes_until_one_grows() {
        let base = Identity::new("x").part("shared");
        let grown = base.clone().part(1);
        assert_ne!(base.canonical(), grown.canonical());
        assert!(grown.canonical().starts_with(base.canonical()));
    }

    #[test]
    fn layout_is_tag_length_payload() {
        let id = Identity::new("ab").part(true);
        assert_eq!(
            hex(id.canonical()),
            "6964656d01\
             61000000000000000261 62\
             74000000000000000101"
                .replace(' ', "")
        );
    }

    /// The check a compacted row keeps: pinned as the encoding is, since a
    /// changed check would refuse every compacted duplicate as a collision.
    /// (`substring(sha256(identity) FROM 1 FOR 8)`, as the database
    /// computes it; the testsuite's retention::compaction proves the two
    /// agree.)
    #[test]
    fn a_compacted_identity_is_a_golden_check_of_8_bytes_and_matches_only_its_identity() {
        let id = Identity::new("charge").part("ord_1");
        assert_eq!(id.address(), "claim_7e00c387c43cf6e870502615");
        let check = compacted(id.canonical());
        assert_eq!(hex(&check), "9d24828078834630");
        assert!(is_compacted(&check));
        assert!(id.is_stored_as(&check));
        assert!(id.is_stored_as(id.canonical()));
        let other = Identity::new("charge").part("ord_2");
        assert!(!other.is_stored_as(&check));
        assert!(!other.is_stored_as(id.canonical()));
        // The shortest canonical encoding is longer than a check.
        assert!(Identity::new("").canonical().len() > COMPACTED_LEN);
        assert!(!is_compacted(Identity::new("").canonical()));
        let refused = Identity::from_canonical(&check).expect_err("a check is no identity");
        assert!(refused.to_string().contains("compacted"), "{refused}");
    }

    #[test]
    fn canonical_encodings_read_back_and_garbage_does_not() {
        let id = Identity::new("x")
            .part("a\0b")
            .part(u128::MAX)
            .part(i128::MIN)
            .part(true)
            .part(&[0u8, 255][..])
            .part(crate::identity::tests::Uuid16);
        assert_eq!(Identity::from_canonical(id.canonical()), Ok(id.clone()));
        let mut truncated = id.canonical().to_vec();
        truncated.pop();
        assert!(Identity::from_canonical(&truncated).is_err());
        for bad in [&b""[..], b"idem\x02", b"idem\x01s\0\0\0\0\0\0\0\0"] {
            assert!(Identity::from_canonical(bad).is_err(), "{bad:?}");
        }
        let mut leading_zero = Identity::new("x").canonical().to_vec();
        leading_zero.extend_from_slice(b"i\0\0\0\0\0\0\0\x0207");
        assert!(Identity::from_canonical(&leading_zero).is_err());
    }

    struct Uuid16;

    impl KeyPart for Uuid16 {
        fn write_key_part(&self, out: PartWriter<'_>) -> PartWritten {
            out.uuid([7; 16])
        }
    }

    #[test]
    fn debug_decodes_the_parts() {
        let id = Identity::new("charge").part("ord_1").part(-5).part(false);
        let shown = format!("{id:?}");
        assert!(shown.contains(r#"["ord_1", -5, false]"#), "{shown}");
    }
}
