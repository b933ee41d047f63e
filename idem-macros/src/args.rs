//! The options of `#[idempotent(...)]`, parsed and checked on their own.

use proc_macro2::Span;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{Expr, Ident, LitStr, Token};

mod kw {
    syn::custom_keyword!(key);
    syn::custom_keyword!(action);
    syn::custom_keyword!(gate);
    syn::custom_keyword!(account);
    syn::custom_keyword!(namespace);
    syn::custom_keyword!(replay);
    syn::custom_keyword!(fingerprint);
    syn::custom_keyword!(lease);
    syn::custom_keyword!(wait);
    syn::custom_keyword!(on_unavailable);
    syn::custom_keyword!(outcome_commit);
    syn::custom_keyword!(disposition);
    syn::custom_keyword!(on_expiry);
    syn::custom_keyword!(tx);
    syn::custom_keyword!(keep_value_for);
    syn::custom_keyword!(keep_slot_for);
    syn::custom_keyword!(entity);
    syn::custom_keyword!(order);
}

/// Every option, in the order the docs list them.
pub(crate) const OPTIONS: &[&str] = &[
    "key",
    "action",
    "gate",
    "account",
    "namespace",
    "replay",
    "fingerprint",
    "lease",
    "wait",
    "on_unavailable",
    "outcome_commit",
    "disposition",
    "on_expiry",
    "tx",
    "keep_value_for",
    "keep_slot_for",
    "entity",
    "order",
    "crate",
];

/// The parsed options. Mistakes that do not stop parsing are collected in
/// `errors`, so one attribute reports all of its mistakes at once.
pub(crate) struct Args {
    pub key: Option<Key>,
    pub action: Option<LitStr>,
    pub gate: Option<Expr>,
    pub account: Option<Expr>,
    pub namespace: Option<Expr>,
    /// `replay`: where it was written.
    pub replay: Option<Span>,
    pub fingerprint: Option<Key>,
    pub lease: Option<Timed>,
    pub wait: Option<Timed>,
    /// `on_unavailable`: `Some(Some(span))` for `"run"` (where it was
    /// written), `Some(None)` for an explicit `"refuse"`, the default.
    pub on_unavailable: Option<Option<Span>>,
    /// `outcome_commit`: `Some(Some(span))` for `"async"` (where it was
    /// written), `Some(None)` for an explicit `"durable"`, the default.
    pub outcome_commit: Option<Option<Span>>,
    /// `disposition = path`: a `fn(&E) -> Disposition`.
    pub disposition: Option<Expr>,
    /// `on_expiry`: `Some((Some(span), literal))` for `"in_doubt"`,
    /// `Some((None, literal))` for an explicit `"take_over"`, the default.
    pub on_expiry: Option<(Option<Span>, LitStr)>,
    pub tx: Option<Expr>,
    /// `keep_value_for = "7d"`: how long the replayed value and the
    /// fingerprint are kept after the outcome.
    pub keep_value_for: Option<Timed>,
    /// `keep_slot_for = "31d"`: how long the slot is held after the outcome.
    pub keep_slot_for: Option<Timed>,
    /// `entity = "event.object_id"`: the entity an ordered event belongs to.
    pub entity: Option<Key>,
    /// `order = "event.sequence"`: the event's order within its entity.
    pub order: Option<Ordered>,
    /// `entity` and `order` as written, valid or not: a mistake in one is
    /// not also reported as the other's missing partner.
    pub ordering_written: (bool, bool),
    /// `crate = "..."`: the path to idem where it is renamed.
    pub krate: Option<syn::Path>,
    pub errors: Errors,
}

/// A duration option: its value and the literal it came from.
pub(crate) struct Timed {
    pub duration: std::time::Duration,
    pub literal: LitStr,
}

/// `order = "event.sequence"`: the literal, and the expression in it.
pub(crate) struct Ordered {
    pub literal: LitStr,
    pub expr: Expr,
}

/// `key = "a.b, c"`: the literal, and the expressions written in it.
pub(crate) struct Key {
    pub literal: LitStr,
    pub parts: Vec<Expr>,
}

/// Collected compile errors.
#[derive(Default)]
pub(crate) struct Errors(Option<syn::Error>);

impl Errors {
    pub fn push(&mut self, error: syn::Error) {
        match &mut self.0 {
            Some(existing) => existing.combine(error),
            None => self.0 = Some(error),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    pub fn into_error(self) -> Option<syn::Error> {
        self.0
    }
}

/// The option name closest to a misspelt one, if any is close.
pub(crate) fn closest<'a>(
    wrong: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|candidate| (strsim::jaro_winkler(wrong, candidate), candidate))
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, candidate)| candidate)
}

impl Parse for Args {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let mut args = Args {
            key: None,
            action: None,
            gate: None,
            account: None,
            namespace: None,
            replay: None,
            fingerprint: None,
            lease: None,
            wait: None,
            on_unavailable: None,
            outcome_commit: None,
            disposition: None,
            on_expiry: None,
            tx: None,
            keep_value_for: None,
            keep_slot_for: None,
            entity: None,
            order: None,
            ordering_written: (false, false),
            krate: None,
            errors: Errors::default(),
        };
        while !input.is_empty() {
            let lookahead = input.lookahead1();
            if lookahead.peek(kw::key) {
                let name: kw::key = input.parse()?;
                let value =
                    parse_value(input, name.span, "key", "key = \"order.id, amount_cents\"")?;
                let key = value.and_then(|value| args.check_string(value, "key", KEY_EXAMPLE));
                let key = key.and_then(|literal| args.check_key(literal));
                args.set(name.span, "key", key, |a| &mut a.key);
            } else if lookahead.peek(kw::action) {
                let name: kw::action = input.parse()?;
                let value = parse_value(input, name.span, "action", "action = \"charge\"")?;
                let action = value
                    .and_then(|value| args.check_string(value, "action", "action = \"charge\""));
                let action = action.and_then(|literal| args.check_action(literal));
                args.set(name.span, "action", action, |a| &mut a.action);
            } else if lookahead.peek(kw::gate) {
                let name: kw::gate = input.parse()?;
                let value = parse_value(input, name.span, "gate", "gate = self.gate")?;
                args.set(name.span, "gate", value, |a| &mut a.gate);
            } else if lookahead.peek(kw::account) {
                let name: kw::account = input.parse()?;
                let value = parse_value(input, name.span, "account", "account = tenant.id")?;
                args.set(name.span, "account", value, |a| &mut a.account);
            } else if lookahead.peek(kw::namespace) {
                let name: kw::namespace = input.parse()?;
                let value = parse_value(input, name.span, "namespace", "namespace = \"live\"")?;
                args.set(name.span, "namespace", value, |a| &mut a.namespace);
            } else if lookahead.peek(kw::replay) {
                let name: kw::replay = input.parse()?;
                if input.peek(Token![=]) {
                    input.parse::<Token![=]>()?;
                    let value: Expr = input.parse()?;
                    args.errors.push(syn::Error::new_spanned(
                        value,
                        "`replay` takes no value: write `replay` to keep the Ok value for duplicates",
                    ));
                } else {
                    args.set(name.span, "replay", Some(name.span), |a| &mut a.replay);
                }
            } else if lookahead.peek(kw::fingerprint) {
                let name: kw::fingerprint = input.parse()?;
                let example = "fingerprint = \"amount_cents, currency\"";
                let value = parse_value(input, name.span, "fingerprint", example)?;
                let value =
                    value.and_then(|value| args.check_string(value, "fingerprint", example));
                let value =
                    value.and_then(|literal| args.check_exprs(literal, "fingerprint", example));
                args.set(name.span, "fingerprint", value, |a| &mut a.fingerprint);
            } else if lookahead.peek(kw::lease) {
                let name: kw::lease = input.parse()?;
                let value = parse_value(input, name.span, "lease", "lease = \"30s\"")?;
                let value =
                    value.and_then(|value| args.check_string(value, "lease", "lease = \"30s\""));
                let value = value.and_then(|literal| args.check_duration(literal, "lease"));
                args.set(name.span, "lease", value, |a| &mut a.lease);
            } else if lookahead.peek(kw::wait) {
                let name: kw::wait = input.parse()?;
                let value = parse_value(input, name.span, "wait", "wait = \"5s\"")?;
                let value =
                    value.and_then(|value| args.check_string(value, "wait", "wait = \"5s\""));
                let value = value.and_then(|literal| args.check_duration(literal, "wait"));
                args.set(name.span, "wait", value, |a| &mut a.wait);
            } else if lookahead.peek(kw::on_unavailable) {
                let name: kw::on_unavailable = input.parse()?;
                let example = "on_unavailable = \"run\"";
                let value = parse_value(input, name.span, "on_unavailable", example)?;
                let value =
                    value.and_then(|value| args.check_string(value, "on_unavailable", example));
                let value = value.and_then(|literal| match literal.value().as_str() {
                    "run" => Some(Some(literal.span())),
                    "refuse" => Some(None),
                    other => {
                        args.errors.push(syn::Error::new_spanned(
                            &literal,
                            format!(
                                "`on_unavailable` is \"refuse\" (the default: the body does not run \
                                 when the store is down) or \"run\" (fail open, for actions where a \
                                 duplicate is harmless), not {other:?}"
                            ),
                        ));
                        None
                    }
                });
                args.set(name.span, "on_unavailable", value, |a| {
                    &mut a.on_unavailable
                });
            } else if lookahead.peek(kw::outcome_commit) {
                let name: kw::outcome_commit = input.parse()?;
                let example = "outcome_commit = \"async\"";
                let value = parse_value(input, name.span, "outcome_commit", example)?;
                let value =
                    value.and_then(|value| args.check_string(value, "outcome_commit", example));
                let value = value.and_then(|literal| match literal.value().as_str() {
                    "async" => Some(Some(literal.span())),
                    "durable" => Some(None),
                    other => {
                        args.errors.push(syn::Error::new_spanned(
                            &literal,
                            format!(
                                "`outcome_commit` is \"durable\" (the default: settle and release \
                                 wait for the disk) or \"async\" (they commit with \
                                 synchronous_commit off; a server crash can lose one, leaving the \
                                 claim pending), not {other:?}"
                            ),
                        ));
                        None
                    }
                });
                args.set(name.span, "outcome_commit", value, |a| {
                    &mut a.outcome_commit
                });
            } else if lookahead.peek(kw::disposition) {
                let name: kw::disposition = input.parse()?;
                let example = "disposition = ChargeError::disposition";
                let value = parse_value(input, name.span, "disposition", example)?;
                args.set(name.span, "disposition", value, |a| &mut a.disposition);
            } else if lookahead.peek(kw::on_expiry) {
                let name: kw::on_expiry = input.parse()?;
                let example = "on_expiry = \"in_doubt\"";
                let value = parse_value(input, name.span, "on_expiry", example)?;
                let value = value.and_then(|value| args.check_string(value, "on_expiry", example));
                let value = value.and_then(|literal| match literal.value().as_str() {
                    "in_doubt" => Some((Some(literal.span()), literal)),
                    "take_over" => Some((None, literal)),
                    other => {
                        args.errors.push(syn::Error::new_spanned(
                            &literal,
                            format!(
                                "`on_expiry` is \"take_over\" (the default: the next claim takes \
                                 an expired claim over and runs the body) or \"in_doubt\" (the \
                                 expired claim is held in doubt until it is resolved, never run \
                                 again blindly), not {other:?}"
                            ),
                        ));
                        None
                    }
                });
                args.set(name.span, "on_expiry", value, |a| &mut a.on_expiry);
            } else if lookahead.peek(kw::tx) {
                let name: kw::tx = input.parse()?;
                let value = parse_value(input, name.span, "tx", "tx = tx")?;
                args.set(name.span, "tx", value, |a| &mut a.tx);
            } else if lookahead.peek(kw::keep_value_for) {
                let name: kw::keep_value_for = input.parse()?;
                let example = "keep_value_for = \"7d\"";
                let value = parse_value(input, name.span, "keep_value_for", example)?;
                let value =
                    value.and_then(|value| args.check_string(value, "keep_value_for", example));
                let value =
                    value.and_then(|literal| args.check_duration(literal, "keep_value_for"));
                args.set(name.span, "keep_value_for", value, |a| {
                    &mut a.keep_value_for
                });
            } else if lookahead.peek(kw::keep_slot_for) {
                let name: kw::keep_slot_for = input.parse()?;
                let example = "keep_slot_for = \"31d\"";
                let value = parse_value(input, name.span, "keep_slot_for", example)?;
                let value =
                    value.and_then(|value| args.check_string(value, "keep_slot_for", example));
                let value = value.and_then(|literal| args.check_duration(literal, "keep_slot_for"));
                args.set(name.span, "keep_slot_for", value, |a| &mut a.keep_slot_for);
            } else if lookahead.peek(kw::entity) {
                let name: kw::entity = input.parse()?;
                args.ordering_written.0 = true;
                let example = "entity = \"event.object_id\"";
                let value = parse_value(input, name.span, "entity", example)?;
                let value = value.and_then(|value| args.check_string(value, "entity", example));
                let value = value.and_then(|literal| args.check_exprs(literal, "entity", example));
                args.set(name.span, "entity", value, |a| &mut a.entity);
            } else if lookahead.peek(kw::order) {
                let name: kw::order = input.parse()?;
                args.ordering_written.1 = true;
                let example = "order = \"event.sequence\"";
                let value = parse_value(input, name.span, "order", example)?;
                let value = value.and_then(|value| args.check_string(value, "order", example));
                let value = value.and_then(|literal| args.check_order(literal));
                args.set(name.span, "order", value, |a| &mut a.order);
            } else if lookahead.peek(Token![crate]) {
                let name: Token![crate] = input.parse()?;
                let example = "crate = \"idem\"";
                let value = parse_value(input, name.span, "crate", example)?;
                let value = value.and_then(|value| args.check_string(value, "crate", example));
                let value = value.and_then(|literal| args.check_crate(literal));
                args.set(name.span, "crate", value, |a| &mut a.krate);
            } else if input.peek(Ident) {
                let name: Ident = input.parse()?;
                let hint = match closest(&name.to_string(), OPTIONS.iter().copied()) {
                    Some(option) => format!("did you mean `{option}`? "),
                    None => String::new(),
                };
                args.errors.push(syn::Error::new_spanned(
                    &name,
                    format!(
                        "unknown option `{name}` for #[idempotent]: {hint}the options are {}",
                        OPTIONS
                            .iter()
                            .map(|o| format!("`{o}`"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
                if input.peek(Token![=]) {
                    input.parse::<Token![=]>()?;
                    input.parse::<Expr>()?;
                }
            } else {
                return Err(lookahead.error());
            }
            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>()?;
        }
        Ok(args)
    }
}

const KEY_EXAMPLE: &str = "key = \"order.id, amount_cents\"";

/// `= value` after an option's name. A missing `=` is a mistake of its own.
fn parse_value(
    input: ParseStream<'_>,
    name: Span,
    option: &str,
    example: &str,
) -> syn::Result<Option<Expr>> {
    if !input.peek(Token![=]) {
        return Err(syn::Error::new(
            name,
            format!("`{option}` needs a value: write {example}"),
        ));
    }
    input.parse::<Token![=]>()?;
    input.parse().map(Some)
}

impl Args {
    /// Stores an option's value, refusing a second one.
    fn set<T>(
        &mut self,
        name: Span,
        option: &str,
        value: Option<T>,
        slot: impl Fn(&mut Args) -> &mut Option<T>,
    ) {
        if slot(self).is_some() {
            self.errors.push(syn::Error::new(
                name,
                format!("duplicate option `{option}`: give it once"),
            ));
        } else if let Some(value) = value {
            *slot(self) = Some(value);
        }
    }

    fn check_string(&mut self, value: Expr, option: &str, example: &str) -> Option<LitStr> {
        match value {
            Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(literal),
                ..
            }) => Some(literal),
            other => {
                self.errors.push(syn::Error::new_spanned(
                    other,
                    format!("`{option}` takes a string literal: write {example}"),
                ));
                None
            }
        }
    }

    fn check_key(&mut self, literal: LitStr) -> Option<Key> {
        self.check_exprs(literal, "key", KEY_EXAMPLE)
    }

    /// A string of comma-separated expressions (`key`, `fingerprint`).
    fn check_exprs(&mut self, literal: LitStr, option: &str, example: &str) -> Option<Key> {
        let parsed = literal.parse_with(Punctuated::<Expr, Token![,]>::parse_terminated);
        match parsed {
            Ok(parts) if parts.is_empty() => {
                let what = match option {
                    "key" => "name what makes one invocation different from another",
                    "entity" => "name what the event belongs to",
                    _ => "name the arguments that make up the payload",
                };
                self.errors.push(syn::Error::new_spanned(
                    &literal,
                    format!("`{option}` is empty: {what}, e.g. {example}"),
                ));
                None
            }
            Ok(parts) => Some(Key {
                literal,
                parts: parts.into_iter().collect(),
            }),
            Err(error) => {
                self.errors.push(syn::Error::new_spanned(
                    &literal,
                    format!(
                        "`{option}` must be a comma-separated list of Rust expressions on the \
                         function's parameters ({error}): write e.g. {example}"
                    ),
                ));
                None
            }
        }
    }

    /// `order = "..."`: one Rust expression.
    fn check_order(&mut self, literal: LitStr) -> Option<Ordered> {
        match literal.parse::<Expr>() {
            Ok(expr) => Some(Ordered { literal, expr }),
            Err(error) => {
                self.errors.push(syn::Error::new_spanned(
                    &literal,
                    format!(
                        "`order` must be one Rust expression on the function's parameters, an \
                         integer or a SystemTime ({error}): write e.g. order = \"event.sequence\""
                    ),
                ));
                None
            }
        }
    }

    /// A humane duration such as "30s", "5m" or "1h 30m", more than zero;
    /// a lease or a retention window at most 100 years.
    fn check_duration(&mut self, literal: LitStr, option: &str) -> Option<Timed> {
        // A retention window: what it keeps, for the messages.
        let kept = window(option);
        match humantime::parse_duration(&literal.value()) {
            Ok(duration) if option == "lease" && duration > MAX_LEASE => {
                self.errors.push(syn::Error::new_spanned(
                    &literal,
                    "`lease` may be at most 100 years (\"100y\", idem::MAX_LEASE); \
                     for a claim that never expires, leave `lease` out",
                ));
                None
            }
            Ok(duration) if duration > MAX_WINDOW && kept.is_some() => {
                let kept = kept.unwrap_or_default();
                self.errors.push(syn::Error::new_spanned(
                    &literal,
                    format!(
                        "`{option}` may be at most 100 years (\"100y\", idem::MAX_WINDOW); \
                         to keep {kept} for ever, leave `{option}` out"
                    ),
                ));
                None
            }
            Ok(duration) if !duration.is_zero() => Some(Timed { duration, literal }),
            Ok(_) => {
                let message = match kept {
                    Some(kept) => format!(
                        "`{option}` must be longer than zero: a window of zero would keep \
                         nothing; omit the option to keep {kept} for ever"
                    ),
                    None => format!("`{option}` must be longer than zero; leave it out instead"),
                };
                self.errors.push(syn::Error::new_spanned(&literal, message));
                None
            }
            Err(error) => {
                let examples = match kept {
                    Some(_) => "\"24h\", \"7d\", \"31d\" or \"1y\"",
                    None => "\"30s\", \"5m\", \"1h 30m\" or \"500ms\"",
                };
                self.errors.push(syn::Error::new_spanned(
                    &literal,
                    format!(
                        "`{option}` takes a duration such as {examples}, not {:?} ({error})",
                        literal.value()
                    ),
                ));
                None
            }
        }
    }

    /// `crate = "..."`: a path, as the user's crate names idem.
    fn check_crate(&mut self, literal: LitStr) -> Option<syn::Path> {
        match literal.parse::<syn::Path>() {
            Ok(path) => Some(path),
            Err(_) => {
                self.errors.push(syn::Error::new_spanned(
                    &literal,
                    format!(
                        "`crate` takes the path to idem as your crate names it, e.g. \
                         crate = \"idem1\" after `idem1 = {{ package = \"idem-pg\", ... }}` in \
                         Cargo.toml; {:?} is not a path",
                        literal.value()
                    ),
                ));
                None
            }
        }
    }

    fn check_action(&mut self, literal: LitStr) -> Option<LitStr> {
        if literal.value().trim().is_empty() {
            self.errors.push(syn::Error::new_spanned(
                &literal,
                "`action` is empty: name the action, e.g. action = \"charge\"; \
                 leave it out to use the function's name",
            ));
            return None;
        }
        Some(literal)
    }
}

/// What a retention window keeps, for its messages; `None` for an option
/// that is not a window.
fn window(option: &str) -> Option<&'static str> {
    match option {
        "keep_value_for" => Some("the value"),
        "keep_slot_for" => Some("the slot"),
        _ => None,
    }
}

/// The longest retention window (`keep_value_for`, `keep_slot_for`), as
/// the runtime's `MAX_WINDOW`, which is its `MAX_LEASE`;
/// `tests/ui/keep_slot_for_out_of_range.rs` and its passing twin pin the
/// two together.
const MAX_WINDOW: std::time::Duration = MAX_LEASE;

/// The longest lease, as the runtime's `MAX_LEASE` (100 years of
/// 365.25 days); `tests/ui/lease_out_of_range.rs` and its passing twin pin
/// the two together.
const MAX_LEASE: std::time::Duration = std::time::Duration::from_secs(3_155_760_000);

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(attr: &str) -> syn::Result<Args> {
        syn::parse_str(attr)
    }

    fn errors(attr: &str) -> String {
        match parse(attr) {
            Ok(args) => args
                .errors
                .into_error()
                .map(|e| e.to_string())
                .unwrap_or_default(),
            Err(error) => error.to_string(),
        }
    }

    #[test]
    fn every_option_parses() {
        let args = parse(
            r#"key = "order.id, amount", action = "charge", gate = self.gate, account = t.id, namespace = "live""#,
        )
        .unwrap();
        assert!(args.errors.is_empty());
        assert_eq!(args.key.map(|k| k.parts.len()), Some(2));
        assert_eq!(args.action.map(|a| a.value()).as_deref(), Some("charge"));
        assert!(args.gate.is_some() && args.account.is_some() && args.namespace.is_some());
    }

    #[test]
    fn a_trailing_comma_is_fine() {
        assert!(parse(r#"key = "a,","#).unwrap().errors.is_empty());
    }

    #[test]
    fn mistakes_are_named() {
        assert!(errors(r#"key = "a", keys = "b""#).contains("did you mean `key`?"));
        assert!(errors(r#"key = "a", key = "b""#).contains("duplicate option `key`"));
        assert!(errors(r#"key = """#).contains("`key` is empty"));
        assert!(errors(r#"key = "a +""#).contains("comma-separated list of Rust expressions"));
        assert!(errors("key = a").contains("takes a string literal"));
        assert!(errors("key").contains("`key` needs a value"));
        assert!(errors(r#"key = "a", action = """#).contains("`action` is empty"));
        assert!(errors(r#"key = "a", lease = "101y""#).contains("at most 100 years"));
        assert!(parse(r#"key = "a", lease = "100y""#).is_ok());
        let renamed = parse(r#"key = "a", crate = "::my_app::deps::idem""#).expect("a path");
        assert_eq!(
            renamed.krate.map(|path| quote::quote!(#path).to_string()),
            Some(":: my_app :: deps :: idem".to_owned())
        );
        assert!(errors(r#"key = "a", crate = "not a path""#).contains("`crate` takes the path"));
    }

    #[test]
    fn retention_windows_parse_as_durations_up_to_100_years() {
        let args = parse(r#"key = "a", keep_value_for = "7d", keep_slot_for = "100y""#).unwrap();
        assert!(args.errors.is_empty());
        let day = 24 * 60 * 60;
        assert_eq!(
            args.keep_value_for.map(|w| w.duration.as_secs()),
            Some(7 * day)
        );
        assert_eq!(args.keep_slot_for.map(|w| w.duration), Some(MAX_WINDOW));

        for option in ["keep_value_for", "keep_slot_for"] {
            let zero = errors(&format!(r#"key = "a", {option} = "0s""#));
            assert!(zero.contains("must be longer than zero"), "{zero}");
            assert!(zero.contains("omit the option to keep"), "{zero}");
            let long = errors(&format!(r#"key = "a", {option} = "100y 1day""#));
            assert!(long.contains("at most 100 years"), "{long}");
            assert!(long.contains("idem::MAX_WINDOW"), "{long}");
            let malformed = errors(&format!(r#"key = "a", {option} = "a week""#));
            assert!(
                malformed.contains("takes a duration such as"),
                "{malformed}"
            );
            assert!(
                errors(&format!(r#"key = "a", {option} = 7"#)).contains("takes a string literal")
            );
            assert!(errors(&format!(r#"key = "a", {option}"#)).contains("needs a value"));
            let twice = errors(&format!(r#"key = "a", {option} = "1d", {option} = "2d""#));
            assert!(twice.contains("duplicate option"), "{twice}");
        }
        assert!(
            errors(r#"key = "a", keep_slot_fr = "1d""#).contains("did you mean `keep_slot_for`?")
        );
    }

    #[test]
    fn closest_suggests_only_near_misses() {
        assert_eq!(closest("acount", OPTIONS.iter().copied()), Some("account"));
        assert_eq!(
            closest("namespce", OPTIONS.iter().copied()),
            Some("namespace")
        );
        assert_eq!(closest("retries", OPTIONS.iter().copied()), None);
    }
}
