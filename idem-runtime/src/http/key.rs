//! The `Idempotency-Key` request header, validated.

use std::fmt;
use std::str::FromStr;

use http::{HeaderMap, HeaderName, StatusCode};

use super::{IDEMPOTENCY_KEY, Problem};
use crate::identity::{KeyPart, PartWriter, PartWritten};

/// The client's key for one request: the `Idempotency-Key` header, 1 to 255
/// visible ASCII characters (`!` to `~`).
///
/// As an extractor it refuses a request without the header (or with it
/// twice, or with a bad value) with a 400 and a problem+json body saying
/// which; `Option<IdempotencyKey>` accepts a request without it (`None`) and
/// still refuses a bad one. It is a [`KeyPart`], so `#[idempotent(key =
/// "key")]` can name the parameter directly; a `None` key then runs the
/// request ungated, deliberately, with a tracing event.
///
/// Spaces are refused like every other invisible character: keys are
/// machine-made (UUIDs, random tokens), and proxies may trim or fold
/// whitespace, which would give one request two keys. The draft sends the
/// key as a quoted structured-field string; such a value is taken as it
/// comes, quotes included (they are visible ASCII), so a client that always
/// quotes its keys is deduplicated as well as one that never does.
///
/// ```
/// use idem_runtime::http::{IdempotencyKey, KeyRejection};
///
/// let key: IdempotencyKey = "8e03978e-40d5-43e8-bc93-6894a57f9324".parse()?;
/// assert_eq!(key.as_str(), "8e03978e-40d5-43e8-bc93-6894a57f9324");
/// assert_eq!("".parse::<IdempotencyKey>(), Err(KeyRejection::Empty));
/// assert_eq!(
///     "two words".parse::<IdempotencyKey>(),
///     Err(KeyRejection::NotVisibleAscii { offset: 3, byte: b' ' })
/// );
/// # Ok::<(), KeyRejection>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// The longest key accepted, in bytes (= characters: keys are ASCII).
    pub const MAX_LEN: usize = 255;

    /// Validates a header value's bytes as a key.
    pub fn from_bytes(value: &[u8]) -> Result<IdempotencyKey, KeyRejection> {
        if value.is_empty() {
            return Err(KeyRejection::Empty);
        }
        if value.len() > IdempotencyKey::MAX_LEN {
            return Err(KeyRejection::TooLong {
                length: value.len(),
            });
        }
        let invisible = value
            .iter()
            .enumerate()
            .find(|(_, byte)| !byte.is_ascii_graphic());
        if let Some((offset, &byte)) = invisible {
            return Err(KeyRejection::NotVisibleAscii { offset, byte });
        }
        // Visible ASCII only, so this is valid UTF-8 byte for byte.
        Ok(IdempotencyKey(
            value.iter().map(|&b| char::from(b)).collect(),
        ))
    }

    /// The key, as the client sent it.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key of a request's headers: `Ok(None)` without the header, an
    /// error when it is repeated or malformed. What every framework's
    /// extractor calls.
    pub fn from_headers(headers: &HeaderMap) -> Result<Option<IdempotencyKey>, KeyRejection> {
        IdempotencyKey::from_header_named(headers, &IDEMPOTENCY_KEY)
    }

    /// [`from_headers`](IdempotencyKey::from_headers) for a service that
    /// takes its key under another header name (the tower layer's `header`
    /// option). The refusals' messages still say `Idempotency-Key`, the
    /// protocol's name.
    pub fn from_header_named(
        headers: &HeaderMap,
        name: &HeaderName,
    ) -> Result<Option<IdempotencyKey>, KeyRejection> {
        let mut values = headers.get_all(name).iter();
        let Some(value) = values.next() else {
            return Ok(None);
        };
        // Two keys for one request: neither can be trusted to be the one
        // its retries will carry.
        let more = values.count();
        if more > 0 {
            return Err(KeyRejection::Repeated { count: more + 1 });
        }
        IdempotencyKey::from_bytes(value.as_bytes()).map(Some)
    }
}

impl FromStr for IdempotencyKey {
    type Err = KeyRejection;

    fn from_str(value: &str) -> Result<IdempotencyKey, KeyRejection> {
        IdempotencyKey::from_bytes(value.as_bytes())
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for IdempotencyKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl KeyPart for IdempotencyKey {
    /// The key as text: the same slot as the `&str` it holds.
    fn write_key_part(&self, out: PartWriter<'_>) -> PartWritten {
        out.text(&self.0)
    }
}

/// Why a request's `Idempotency-Key` was refused: each a 400 whose
/// problem+json detail is this message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyRejection {
    /// The header is missing and the handler requires it.
    #[error(
        "The request has no Idempotency-Key header. Send one with a value unique to this \
         request (a UUID, say), and send the same value with every retry of it."
    )]
    Missing,

    /// The header appears more than once.
    #[error(
        "The request has {count} Idempotency-Key headers. Send exactly one, with the same \
         value on every retry."
    )]
    Repeated {
        /// How many there were.
        count: usize,
    },

    /// The header is there but empty.
    #[error(
        "The Idempotency-Key header is empty. Send a value unique to this request (a UUID, \
         say)."
    )]
    Empty,

    /// The key is longer than [`IdempotencyKey::MAX_LEN`].
    #[error(
        "The Idempotency-Key is {length} bytes long; at most 255 are accepted. Send a shorter \
         key (a UUID has 36 characters)."
    )]
    TooLong {
        /// Its length in bytes.
        length: usize,
    },

    /// The key holds a byte that is not visible ASCII (`!` to `~`): a
    /// space, a control character or a non-ASCII byte.
    #[error(
        "The Idempotency-Key has byte 0x{byte:02x} at offset {offset}; only visible ASCII \
         characters (! to ~, no spaces) are accepted. Send a key made of letters, digits and \
         punctuation (a UUID, say)."
    )]
    NotVisibleAscii {
        /// Where the first such byte is, counting from 0.
        offset: usize,
        /// The byte.
        byte: u8,
    },
}

impl From<&KeyRejection> for Problem {
    fn from(rejection: &KeyRejection) -> Problem {
        let (slug, title) = match rejection {
            KeyRejection::Missing => ("missing-idempotency-key", "Idempotency-Key missing"),
            _ => ("invalid-idempotency-key", "Idempotency-Key invalid"),
        };
        Problem::idem(StatusCode::BAD_REQUEST, slug, title, rejection.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Identity;

    #[test]
    fn keys_are_one_to_255_visible_ascii_bytes() {
        assert!(IdempotencyKey::from_bytes(b"a").is_ok());
        assert!(IdempotencyKey::from_bytes(&[b'~'; 255]).is_ok());
        assert!(IdempotencyKey::from_bytes(b"!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~").is_ok());
        assert_eq!(IdempotencyKey::from_bytes(b""), Err(KeyRejection::Empty));
        assert_eq!(
            IdempotencyKey::from_bytes(&[b'a'; 256]),
            Err(KeyRejection::TooLong { length: 256 })
        );
        for (value, offset, byte) in [
            (&b"a b"[..], 1, b' '),
            (b"ab\t", 2, b'\t'),
            (b"\x7f", 0, 0x7f),
            (b"caf\xc3\xa9", 3, 0xc3),
        ] {
            assert_eq!(
                IdempotencyKey::from_bytes(value),
                Err(KeyRejection::NotVisibleAscii { offset, byte })
            );
        }
    }

    #[test]
    fn a_key_addresses_the_same_slot_as_its_text() {
        let key: IdempotencyKey = "k_1".parse().unwrap();
        assert_eq!(
            Identity::new("charge").part(&key).address(),
            Identity::new("charge").part("k_1").address()
        );
    }
}
