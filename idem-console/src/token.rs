//! How much guessing a console token resists, and the rule a token must
//! pass: [`check_token`].

use std::fmt;

/// The least a console token must resist, in bits of guessing: 128, what
/// 32 random hex digits or 22 random letters and digits carry.
pub const TOKEN_MIN_BITS: u32 = 128;

/// How many bits of guessing `token` can resist at most, as written: its
/// length in characters times what one character of the smallest alphabet
/// holding all of them carries: decimal digits 3.32; hex digits of one case
/// 4; digits and letters of one case 5.16; letters and digits 5.95; those
/// and `-`, `_`, `+`, `/`, `=` (base64) 6; anything else 6.56. An estimate
/// from above: a token not drawn at random (a word, a repeated character)
/// resists far less, and nothing here can tell.
pub fn token_bits(token: &str) -> u32 {
    let all = |holds: fn(&char) -> bool| token.chars().all(|c| holds(&c));
    let one_case = all(|c| !c.is_ascii_lowercase()) || all(|c| !c.is_ascii_uppercase());
    let per_character = if all(char::is_ascii_digit) {
        3.32
    } else if all(char::is_ascii_hexdigit) && one_case {
        4.0
    } else if all(char::is_ascii_alphanumeric) && one_case {
        5.16
    } else if all(char::is_ascii_alphanumeric) {
        5.95
    } else if all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '+' | '/' | '=')) {
        6.0
    } else {
        6.56
    };
    // A floor, and no overflow: a token is one header value, far shorter
    // than 2^32 / 7 characters.
    (token.chars().count() as f64 * per_character).floor() as u32
}

/// A token too short to resist guessing (see [`check_token`]): how many
/// bits it carries at most, and the rule, said with how to make one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct WeakToken {
    /// What [`token_bits`] counts in it.
    pub bits: u32,
}

impl fmt::Display for WeakToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.bits == 0 {
            f.write_str("the token is empty")?;
        } else {
            write!(
                f,
                "the token is too short to resist guessing: it carries at most {} bits",
                self.bits
            )?;
        }
        write!(
            f,
            ", and a console token needs {TOKEN_MIN_BITS} bits (32 random hex digits, or 22 \
             random letters and digits). Make one with `openssl rand -hex 32` (256 bits)"
        )
    }
}

impl std::error::Error for WeakToken {}

/// Whether `token` may guard a console: it must carry at least
/// [`TOKEN_MIN_BITS`] as [`token_bits`] counts them (32 hex digits, 22
/// letters and digits, ...), so that nobody guesses it; `openssl rand -hex
/// 32` makes one. The `idem` command refuses to start with a token that
/// fails; [`Console::token`](super::Console::token) takes any, and warns.
pub fn check_token(token: &str) -> Result<(), WeakToken> {
    let bits = token_bits(token);
    if bits < TOKEN_MIN_BITS {
        Err(WeakToken { bits })
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_counted_in_the_smallest_alphabet_that_holds_them() {
        for (token, bits) in [
            ("", 0),
            ("a", 4),
            ("0123456789", 33),
            ("0123456789abcdef0123456789abcdef", 128),
            ("0123456789ABCDEF0123456789ABCDEF", 128),
            ("0123456789abcdef0123456789abcde", 124),
            ("s3cret-token", 72),
            ("Zq8rT1vW3xY5aB7cD9eFgH", 130),
            ("Zq8rT1vW3xY5aB7cD9eFg", 124),
            ("zq8rt1vw3xy5ab7cd9efgh", 113),
        ] {
            assert_eq!(token_bits(token), bits, "{token:?}");
        }
        assert!(check_token("5d41402abc4b2a76b9719d911017c592").is_ok());
        assert!(check_token("Zq8rT1vW3xY5aB7cD9eFgH").is_ok());
        let weak = check_token("a").unwrap_err();
        let said = weak.to_string();
        assert!(said.contains("128 bits") && said.contains("openssl rand -hex 32"));
        assert!(
            check_token("")
                .unwrap_err()
                .to_string()
                .starts_with("the token is empty")
        );
    }
}
