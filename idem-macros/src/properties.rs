//! Property tests: whatever a user writes in `#[idempotent(...)]`, the
//! macro answers with an expansion or a compile error, never a panic (a
//! panicking proc macro gives the user an internal error with no span and
//! no advice).
//!
//! Inputs come from three sources: arbitrary strings (mostly rejected by
//! the lexer or the first token), "token soup" drawn from the words the
//! parser knows (which reaches every branch of the option parser), and key
//! specifications made of expression fragments (which reach the key
//! parser and the rooting check).

use proc_macro2::{Span, TokenStream};
use proptest::prelude::*;
use quote::quote;
use syn::LitStr;

use crate::args::{Args, OPTIONS};
use crate::signature::{Parameters, root_of};

/// Enough cases to reach every option's error paths, few enough for CI.
const CASES: u32 = 512;

/// Besides every option name ([`OPTIONS`], so a new option is fuzzed as soon
/// as it exists), the words the option parser and the key parser react to,
/// plus some they must refuse.
const OTHER_WORDS: &[&str] = &[
    "self",
    "order",
    "gate",
    "amount",
    "=",
    "==",
    ",",
    ",",
    ".",
    "..",
    ";",
    ":",
    "::",
    "+",
    "-",
    "*",
    "&",
    "!",
    "?",
    "|",
    "#",
    "@",
    "$",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    "<",
    ">",
    "'a",
    "1",
    "0.5",
    "1e9",
    "true",
    "\"\"",
    "\"a\"",
    "\"a, b\"",
    "\"order.id\"",
    "\"30s\"",
    "\"0s\"",
    "\"7d\"",
    "\"101y\"",
    "\"run\"",
    "\"refuse\"",
    "\"async\"",
    "\"durable\"",
    "\"forever\"",
    "\"a +\"",
    "\"self.x\"",
    "b\"x\"",
    "'c'",
    "r#\"raw\"#",
    "fn",
    "async",
    "move",
    "|x|",
    "x",
    "_",
    "ключ",
    "🦀",
];

/// Fragments of key expressions: valid ones, rootless ones, broken ones.
const KEY_FRAGMENTS: &[&str] = &[
    "order.id",
    "amount",
    "self.tenant",
    "gate",
    "*amount as i64",
    "order.items[0]",
    "f()",
    "\"lit\"",
    "1",
    "crate::X",
    "{ x }",
    "|x| x",
    "a +",
    "(",
    ")",
    "[",
    "]",
    ",",
    ",,",
    "..",
    "'",
    "\\",
    "\"",
    "\0",
    "x.0.1",
    "&&order",
    "-amount",
    "amount / 0",
    "match x {}",
    "if a { b } else { c }",
    "async {}",
    "loop {}",
    "Order { id }",
    "<T>::x",
    "a?",
    "a.await",
    "🦀",
    "ключ",
    " ",
    "\n",
    "/* */",
    "//",
    "r#type",
    "self",
    "Self",
    "super::x",
];

/// The function the attribute is put on: every kind of parameter the
/// rooting check knows, and a receiver.
fn item() -> TokenStream {
    quote! {
        async fn charge(
            &self,
            gate: &Gate,
            order: &Order,
            amount: i64,
            (left, right): (u8, u8),
            tx: &mut Transaction<'_, Postgres>,
        ) -> Result<Receipt, ChargeError> {
            Ok(Receipt)
        }
    }
}

/// Runs the whole attribute on `args` and checks its answer: a panic fails
/// the property by itself; anything else must be an expansion or an error
/// the compiler reports at a span.
fn expand_answers(args: TokenStream) -> Result<(), TestCaseError> {
    let parsed = syn::parse2::<Args>(args.clone());
    let output = crate::expand::idempotent(args, item()).to_string();
    let refused = match parsed {
        Err(error) => Some(error),
        Ok(parsed) => parsed.errors.into_error(),
    };
    if let Some(error) = refused {
        prop_assert!(
            !error.to_string().trim().is_empty(),
            "an error without a message"
        );
        prop_assert!(
            output.contains("compile_error"),
            "a parse error did not become a compile error: {output}"
        );
    }
    // Either the function was guarded (through the facade's glue, under
    // `::idem` or the path given as `crate`), or the user is told why not.
    prop_assert!(
        output.contains("compile_error")
            || (output.contains(":: __private as __idem_glue ;")
                && output.contains("__idem_glue :: Identity :: new")),
        "neither an expansion nor a compile error: {output}"
    );
    Ok(())
}

/// `key = "<spec>"`, with `spec` as the string literal's value.
fn key_attribute(spec: &str) -> TokenStream {
    let literal = LitStr::new(spec, Span::call_site());
    quote!(key = #literal)
}

/// Checks every key part `spec` parses into, as the expansion would.
fn key_parts_are_checked(spec: &str) -> Result<(), TestCaseError> {
    let Ok(args) = syn::parse2::<Args>(key_attribute(spec)) else {
        return Ok(());
    };
    let signature: syn::Signature = syn::parse2(quote! {
        async fn charge(&self, gate: &Gate, order: &Order, amount: i64)
    })
    .map_err(|error| TestCaseError::fail(error.to_string()))?;
    let parameters = Parameters::of(&signature);
    match (args.key, args.errors.into_error()) {
        (Some(key), None) => {
            prop_assert!(!key.parts.is_empty(), "an accepted key with no parts");
            for part in &key.parts {
                let rooted = parameters.check_rooted(part, &key.literal, "key part");
                let known = root_of(part).is_some_and(|root| {
                    root == "self" || parameters.get(&root.to_string()).is_some()
                });
                prop_assert_eq!(rooted.is_ok(), known);
                if let Err(error) = rooted {
                    prop_assert!(error.to_string().contains("key part"), "{}", error);
                }
            }
        }
        (None, Some(error)) => prop_assert!(error.to_string().contains("`key`"), "{}", error),
        (key, error) => prop_assert!(
            false,
            "a key spec must yield parts or an error, got parts: {}, error: {:?}",
            key.is_some(),
            error.map(|e| e.to_string())
        ),
    }
    Ok(())
}

/// Every option name, then [`OTHER_WORDS`].
fn vocabulary() -> Vec<&'static str> {
    OPTIONS.iter().chain(OTHER_WORDS).copied().collect()
}

fn soup(words: Vec<&'static str>) -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(words), 0..24).prop_map(|words| words.join(" "))
}

/// `crate = "..."` points every path of the expansion, in every mode, at
/// the renamed dependency: none is left that needs a crate named `idem`.
#[test]
fn crate_points_every_path_of_the_expansion_at_the_renamed_dependency() {
    let modes = [
        (quote!(key = "order", crate = "renamed"), "renamed"),
        (
            quote!(
                key = "order",
                crate = "renamed",
                replay,
                fingerprint = "amount",
                lease = "30s",
                wait = "1s",
                on_unavailable = "run",
                account = order,
                namespace = "live",
                keep_value_for = "7d",
                keep_slot_for = "31d"
            ),
            "renamed",
        ),
        (
            quote!(
                key = "order",
                crate = "::app::deps::idem",
                outcome_commit = "async"
            ),
            ":: app :: deps :: idem",
        ),
        (
            quote!(key = "order", crate = "renamed", tx = tx, replay),
            "renamed",
        ),
    ];
    for (args, path) in modes {
        let output = crate::expand::idempotent(args.clone(), item()).to_string();
        assert!(!output.contains("compile_error"), "{args}: {output}");
        // The glue is imported once, through the renamed path, and named
        // through that import everywhere else.
        let imports = output.matches(":: __private").count();
        let import = format!("use {path} :: __private as __idem_glue ;");
        assert!(imports == 1 && output.contains(&import), "{args}: {output}");
        assert!(
            output.contains("__idem_glue :: gate_of"),
            "{args}: {output}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: CASES,
        // The tests live in a proc-macro crate's source tree: keep failures
        // in the output rather than in files next to the source.
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn any_string_as_the_argument_list_is_an_expansion_or_a_compile_error(text in any::<String>()) {
        // The lexer may refuse the text: that is the compiler's job in real
        // use, and a returned error here.
        if let Ok(args) = text.parse::<TokenStream>() {
            expand_answers(args)?;
        }
        let _ = syn::parse_str::<Args>(&text);
    }

    #[test]
    fn token_soup_as_the_argument_list_is_an_expansion_or_a_compile_error(text in soup(vocabulary())) {
        if let Ok(args) = text.parse::<TokenStream>() {
            expand_answers(args)?;
        }
    }

    #[test]
    fn any_string_as_the_key_spec_yields_parts_or_an_error(spec in any::<String>()) {
        key_parts_are_checked(&spec)?;
        expand_answers(key_attribute(&spec))?;
    }

    #[test]
    fn key_fragments_as_the_key_spec_yield_parts_or_an_error(
        fragments in prop::collection::vec(prop::sample::select(KEY_FRAGMENTS), 0..8),
        separator in prop::sample::select(&[", ", ",", " ", ". ", " + "][..]),
    ) {
        let spec = fragments.join(separator);
        key_parts_are_checked(&spec)?;
        expand_answers(key_attribute(&spec))?;
    }

    #[test]
    fn any_string_in_any_string_option_is_an_expansion_or_a_compile_error(
        option in prop::sample::select(OPTIONS),
        value in any::<String>(),
    ) {
        let option = syn::Ident::new(option, Span::call_site());
        let literal = LitStr::new(&value, Span::call_site());
        expand_answers(quote!(key = "order", #option = #literal))?;
    }
}
