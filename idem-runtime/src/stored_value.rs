//! The one rule for every value idem keeps to hand back later (a replayed
//! `Ok` value, a step's result, a reconciler's verdict): it is kept only
//! if it reads back as the same value.
//!
//! JSON cannot say everything serde can. `Some(())`, `Some(None)` in an
//! `Option<Option<_>>` and `Some(f64::NAN)` are all written `null`, which
//! reads back as `None`: a duplicate handed that would get another value
//! than the first caller got. So a value is checked when it is stored,
//! while its outcome can still be recorded without it, never when it is
//! read, when all a duplicate could get is a different answer.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// `value` as the JSON text idem stores, checked to read back as the same
/// value of `T`; otherwise why it cannot be kept.
///
/// The two values are compared through `serde_value`, which keeps what
/// JSON loses (and holds a NaN equal to itself); a type it cannot
/// represent (`i128`) is only checked to read back.
pub(crate) fn to_json<T: Serialize + DeserializeOwned>(value: &T) -> Result<String, Unstorable> {
    let json = serde_json::to_string(value).map_err(|error| Unstorable(error.to_string()))?;
    let back: T = serde_json::from_str(&json)
        .map_err(|error| Unstorable(format!("it does not read back as its type: {error}")))?;
    match (serde_value::to_value(value), serde_value::to_value(&back)) {
        (Ok(before), Ok(after)) if before != after => Err(Unstorable(format!(
            "it reads back as another value ({json}): JSON cannot say it (a NaN or infinite \
             float, Some(()) or Some(None), is written as null)"
        ))),
        _ => Ok(json),
    }
}

/// Why a value cannot be stored to be handed back as itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unstorable(String);

impl std::fmt::Display for Unstorable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// `value` as the JSON a success keeps for replay; `None`, with a tracing
/// error, when it cannot be kept as itself. The success is then settled
/// without a value (a success is never lost to its value), and duplicates
/// are refused `AlreadyDone` rather than handed another value.
pub(crate) fn for_replay<T: Serialize + DeserializeOwned>(
    address: Option<&str>,
    value: &T,
) -> Option<String> {
    match to_json(value) {
        Ok(json) => Some(json),
        Err(why) => {
            tracing::error!(
                target: "idem",
                address,
                error = %why,
                "the value cannot be kept for replay as itself; settling without it, so \
                 duplicates are refused as already done instead of handed another value"
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::to_json;

    #[test]
    fn a_value_that_reads_back_as_itself_is_kept() {
        assert_eq!(to_json(&Some(3u32)).as_deref(), Ok("3"));
        assert_eq!(to_json(&()).as_deref(), Ok("null"));
        assert_eq!(to_json(&None::<()>).as_deref(), Ok("null"));
        assert_eq!(to_json(&Some(Some(1u8))).as_deref(), Ok("1"));
        assert_eq!(to_json(&f64::MAX).as_deref(), Ok("1.7976931348623157e+308"));
        assert_eq!(to_json(&vec!["a".to_owned()]).as_deref(), Ok(r#"["a"]"#));
        assert!(
            to_json(&u128::MAX).is_ok(),
            "beyond serde_value, only read back"
        );
    }

    #[test]
    fn a_value_json_cannot_say_is_refused() {
        for refused in [
            to_json(&Some(())),
            to_json(&Some(None::<u32>)),
            to_json(&Some(f64::NAN)),
            to_json(&Some(f64::INFINITY)),
            to_json(&vec![Some(())]),
        ] {
            let why = refused.expect_err("JSON writes it as null, which reads back as None");
            assert!(
                why.to_string().contains("reads back as another value"),
                "{why}"
            );
        }
        let why = to_json(&f64::NAN).expect_err("null does not read back as an f64");
        assert!(why.to_string().contains("does not read back"), "{why}");
    }
}
