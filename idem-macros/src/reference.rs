//! The attribute's reference documents every option the parser accepts.
//!
//! The reference is the facade's `src/idempotent.md`, shown on docs.rs on
//! `idem::idempotent`. An option added to the parser without a section there
//! (a `## `name`` heading and an example) fails these tests, and so does a
//! section left behind for an option that is gone.

use crate::args::OPTIONS;

/// The facade's reference. Only these tests read it, so the macro crate
/// still packages on its own.
const REFERENCE: &str = include_str!("../../src/idempotent.md");

/// The parser, read as text: every option it accepts is stored through
/// `Args::set`, so its calls name them all.
const PARSER: &str = include_str!("args.rs");

/// One `## `option`` section of the reference: its name and its text.
struct Section<'a> {
    option: &'a str,
    text: &'a str,
}

fn sections(reference: &str) -> Vec<Section<'_>> {
    let mut sections = Vec::new();
    let mut rest = reference;
    while let Some(start) = rest.find("\n## `") {
        let heading = &rest[start + "\n## `".len()..];
        let Some(end) = heading.find("`\n") else {
            break;
        };
        let body = &heading[end..];
        let next = body.find("\n## ").or_else(|| body.find("\n# "));
        let text = next.map_or(body, |next| &body[..next]);
        sections.push(Section {
            option: &heading[..end],
            text,
        });
        rest = body;
    }
    sections
}

/// The options the parser stores, from its `args.set(name.span, "option", ..)`
/// calls, whatever rustfmt made of their layout.
fn options_the_parser_stores() -> Vec<String> {
    let code: String = PARSER.chars().filter(|c| !c.is_whitespace()).collect();
    let call = "args.set(name.span,\"";
    code.match_indices(call)
        .filter_map(|(at, _)| {
            let name = &code[at + call.len()..];
            name.find('"').map(|end| name[..end].to_owned())
        })
        .collect()
}

#[test]
fn every_option_has_a_section_with_an_example() {
    let sections = sections(REFERENCE);
    for option in OPTIONS {
        let section = sections.iter().find(|s| s.option == *option);
        let Some(section) = section else {
            panic!(
                "src/idempotent.md has no section for the option `{option}`: add a \
                 \"## `{option}`\" heading saying what it does, with an example"
            );
        };
        assert!(
            section.text.contains("```rust"),
            "the section of `{option}` in src/idempotent.md has no example: add a \
             ```rust block (no_run where it needs a database)"
        );
    }
}

#[test]
fn every_section_is_an_option() {
    for section in sections(REFERENCE) {
        assert!(
            OPTIONS.contains(&section.option),
            "src/idempotent.md has a section for `{}`, which is not an option of the parser",
            section.option
        );
    }
}

#[test]
fn the_option_list_is_what_the_parser_accepts() {
    let stored = options_the_parser_stores();
    assert!(
        stored.len() >= OPTIONS.len(),
        "read too few options: {stored:?}"
    );
    for option in &stored {
        assert!(
            OPTIONS.contains(&option.as_str()),
            "the parser accepts `{option}`, which is missing from args::OPTIONS"
        );
    }
    for option in OPTIONS {
        assert!(
            stored.iter().any(|s| s == option),
            "args::OPTIONS lists `{option}`, which the parser does not store"
        );
        let parsed = syn::parse_str::<crate::args::Args>(&format!("{option} = x"));
        if let Ok(args) = parsed
            && let Some(error) = args.errors.into_error()
        {
            assert!(
                !error.to_string().contains("unknown option"),
                "the parser does not know `{option}`: {error}"
            );
        }
    }
}
