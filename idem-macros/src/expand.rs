//! From a checked attribute and function to the guarded function.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::ext::IdentExt as _;
use syn::spanned::Spanned;
use syn::{AttrStyle, Ident, ItemFn, LitStr, ReturnType};

use crate::args::Args;
use crate::signature::{self, Parameters};

/// The whole attribute: parse, check, generate. On any mistake the function
/// is emitted as written, beside the errors, so one mistake gives one
/// message rather than a cascade.
pub(crate) fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    let function: ItemFn = match syn::parse2(item.clone()) {
        Ok(function) => function,
        Err(_) => {
            let error = syn::Error::new(
                Span::call_site(),
                "#[idempotent] goes on an async fn with a body, e.g. \
                 `async fn charge(gate: &Gate, order: &Order) -> Result<Receipt, ChargeError> { .. }`",
            );
            return with_errors(item, error);
        }
    };
    let checked = syn::parse2(args).and_then(|args| Checked::new(args, &function));
    match checked {
        Ok(checked) => checked.expand(function),
        // The parameters the expansion would have used now look unused:
        // silence that, so the attribute's mistake is the only message.
        Err(error) => with_errors(quote!(#[allow(unused_variables)] #function), error),
    }
}

/// `path` with every token at `span`: the glue path of a call the compiler
/// may report on, so that its error points at the user's token alone, as
/// it would were the path spelt inside `quote_spanned!`.
fn respanned(path: &TokenStream, span: Span) -> TokenStream {
    path.clone()
        .into_iter()
        .map(|mut token| {
            token.set_span(span);
            token
        })
        .collect()
}

fn with_errors(item: TokenStream, error: syn::Error) -> TokenStream {
    let errors = error.into_compile_error();
    quote!(#item #errors)
}

/// Everything the expansion needs, validated against the signature.
struct Checked {
    action: LitStr,
    key: Vec<syn::Expr>,
    key_span: Span,
    gate: TokenStream,
    account: Option<syn::Expr>,
    namespace: Option<syn::Expr>,
    modes: Modes,
    /// Where the facade's glue is: `::idem::__private`, or under the path
    /// given as `crate = "..."`.
    private: TokenStream,
}

/// The opt-in modes, checked.
struct Modes {
    replay: bool,
    fingerprint: Option<(Vec<syn::Expr>, Span)>,
    lease: Option<std::time::Duration>,
    wait: Option<std::time::Duration>,
    fail_open: bool,
    async_outcome: bool,
    /// `disposition = path`: what each `Err` means for the slot.
    disposition: Option<syn::Expr>,
    /// `on_expiry = "in_doubt"`.
    expiry_in_doubt: bool,
    tx: Option<syn::Expr>,
    /// `keep_value_for`: how long the replayed value and the fingerprint
    /// are kept after the outcome.
    keep_value_for: Option<std::time::Duration>,
    /// `keep_slot_for`: how long the slot is held after the outcome.
    keep_slot_for: Option<std::time::Duration>,
    /// `entity` and `order`: an ordered event, its entity's key parts (and
    /// where they were written), and its order.
    ordered: Option<OrderedEvent>,
}

/// `entity = "..."` and `order = "..."`, checked.
struct OrderedEvent {
    entity: Vec<syn::Expr>,
    entity_span: Span,
    order: syn::Expr,
}

impl Checked {
    fn new(args: Args, function: &ItemFn) -> syn::Result<Checked> {
        let Args {
            key,
            action,
            gate,
            account,
            namespace,
            replay,
            fingerprint,
            lease,
            wait,
            on_unavailable,
            outcome_commit,
            disposition,
            on_expiry,
            tx,
            keep_value_for,
            keep_slot_for,
            entity,
            order,
            ordering_written: (entity_written, order_written),
            krate,
            mut errors,
        } = args;
        let signature = &function.sig;
        let parameters = Parameters::of(signature);
        let fail_open = on_unavailable.flatten();
        let async_outcome = outcome_commit.flatten();

        if signature.asyncness.is_none() {
            errors.push(syn::Error::new_spanned(
                signature.fn_token,
                format!(
                    "#[idempotent] needs an async fn: the gate claims the slot in the database \
                     before the body runs; write `async fn {}`",
                    signature.ident
                ),
            ));
        }
        if let ReturnType::Default = signature.output {
            errors.push(syn::Error::new(
                signature.paren_token.span.close(),
                format!(
                    "`{}` returns nothing: an #[idempotent] fn must return Result<T, E> with \
                     E: From<idem::Rejected>, so a refused duplicate can say why; add e.g. \
                     `-> Result<(), MyError>`",
                    signature.ident
                ),
            ));
        }

        let key_span = key.as_ref().map(|k| k.literal.span());
        let key = match key {
            Some(key) => {
                for part in &key.parts {
                    if let Err(error) = parameters.check_rooted(part, &key.literal, "key part") {
                        errors.push(error);
                    }
                }
                Some(key.parts)
            }
            None if errors.is_empty() => {
                errors.push(syn::Error::new(
                    Span::call_site(),
                    "#[idempotent] needs `key`: name the arguments that make one invocation \
                     different from another, e.g. #[idempotent(key = \"order.id, amount_cents\")]",
                ));
                None
            }
            None => None,
        };

        if let Some(fingerprint) = &fingerprint {
            for part in &fingerprint.parts {
                if let Err(error) =
                    parameters.check_rooted(part, &fingerprint.literal, "fingerprint part")
                {
                    errors.push(error);
                }
            }
        }
        if let Some(tx) = &tx {
            check_tx(tx, &parameters, &mut errors);
            // A claim inside the caller's transaction is invisible until it
            // commits: duplicates wait on it already, and nothing can expire.
            let conflicts = [
                ("lease", lease.as_ref().map(|l| l.literal.span())),
                ("wait", wait.as_ref().map(|w| w.literal.span())),
                ("on_unavailable = \"run\"", fail_open),
            ];
            for (option, span) in conflicts {
                if let Some(span) = span {
                    errors.push(syn::Error::new(
                        span,
                        format!(
                            "`{option}` cannot be combined with `tx`: inside your transaction the \
                             claim is invisible until it commits, so duplicates already wait for \
                             it, no lease can run out, and a store that is down has taken your \
                             transaction with it; drop `{option}` or `tx`"
                        ),
                    ));
                }
            }
        }

        // An ordered event names its entity and its order, both or neither.
        for part in entity.iter().flat_map(|entity| &entity.parts) {
            if let Some(entity) = &entity
                && let Err(error) = parameters.check_rooted(part, &entity.literal, "entity part")
            {
                errors.push(error);
            }
        }
        if let Some(order) = &order
            && let Err(error) = parameters.check_rooted(&order.expr, &order.literal, "order")
        {
            errors.push(error);
        }
        let ordered = match (entity, order) {
            (Some(entity), Some(order)) => {
                if let Some(span) = fail_open {
                    errors.push(syn::Error::new(
                        span,
                        "`on_unavailable = \"run\"` cannot be combined with `entity` and `order`: \
                         run unguarded when the store is down, an event would be neither \
                         deduplicated nor ordered; drop `on_unavailable`",
                    ));
                }
                if let Some(slot) = &keep_slot_for {
                    errors.push(syn::Error::new_spanned(
                        &slot.literal,
                        "`keep_slot_for` cannot be combined with `entity` and `order`: an \
                         ordered event keeps its slot for ever, since its entity's order is \
                         judged from it (a slot that reopened could run an old event after a \
                         newer one); drop `keep_slot_for` (`keep_value_for` is allowed)",
                    ));
                }
                Some(OrderedEvent {
                    entity: entity.parts,
                    entity_span: entity.literal.span(),
                    order: order.expr,
                })
            }
            (Some(entity), None) if !order_written => {
                errors.push(syn::Error::new_spanned(
                    &entity.literal,
                    "`entity` needs `order`: an ordered event is refused when an event of its \
                     entity with a newer order was applied; add e.g. order = \"event.sequence\"",
                ));
                None
            }
            (None, Some(order)) if !entity_written => {
                errors.push(syn::Error::new_spanned(
                    &order.literal,
                    "`order` needs `entity`: an event's order is compared with the other events \
                     of its entity; add e.g. entity = \"event.object_id\"",
                ));
                None
            }
            _ => None,
        };

        // Only a lease can expire.
        if let (Some((_, literal)), None) = (&on_expiry, &lease) {
            errors.push(syn::Error::new_spanned(
                literal,
                "`on_expiry` says what a claim whose lease ran out becomes, and this claim has no \
                 lease: add one (e.g. lease = \"30s\") or drop `on_expiry`",
            ));
        }

        // The value is kept in the slot's row: it ends with the slot.
        if let (Some(value), Some(slot)) = (&keep_value_for, &keep_slot_for)
            && value.duration > slot.duration
        {
            errors.push(syn::Error::new_spanned(
                &value.literal,
                format!(
                    "`keep_value_for` ({:?}) is longer than `keep_slot_for` ({:?}): the value \
                     cannot outlive its slot, it ends with the slot; shorten `keep_value_for` \
                     to at most {:?}, or drop it to keep the value as long as the slot",
                    value.literal.value(),
                    slot.literal.value(),
                    slot.literal.value()
                ),
            ));
        }

        // An outcome may commit asynchronously only where losing it in a
        // crash leaves the slot closed: see idem::OutcomeCommit::Async.
        if let Some(span) = async_outcome {
            if tx.is_some() {
                errors.push(syn::Error::new(
                    span,
                    "`outcome_commit = \"async\"` cannot be combined with `tx`: the settle runs in \
                     your transaction, so it would make your whole commit asynchronous, your own \
                     writes included; drop one of them",
                ));
            }
            if lease.is_some() {
                errors.push(syn::Error::new(
                    span,
                    "`outcome_commit = \"async\"` cannot be combined with `lease`: a settle lost in \
                     a server crash leaves the claim pending, and once its lease runs out a \
                     duplicate would run the action again; drop one of them",
                ));
            }
        }

        for (option, expr) in [
            ("`account`", &account),
            ("`namespace`", &namespace),
            ("`gate`", &gate),
        ] {
            let Some(expr) = expr else { continue };
            let uses_self = signature::root_of(expr).is_some_and(|root| root == "self");
            if uses_self
                && !parameters.has_receiver
                && let Err(error) = parameters.check_rooted(expr, expr, option)
            {
                errors.push(error);
            }
        }

        let gate = match gate {
            Some(gate) => Some(quote!(#gate)),
            None => match parameters.get("gate") {
                Some((ident, _)) => Some(quote!(#ident)),
                None => {
                    errors.push(syn::Error::new(
                        signature::function_span(signature),
                        format!(
                            "no gate found: `{}` has no parameter named `gate`; add one \
                             (`gate: &idem::Gate`) or say where the gate is: {}",
                            signature.ident,
                            parameters.gate_hint()
                        ),
                    ));
                    None
                }
            },
        };

        if let Some(error) = errors.into_error() {
            return Err(error);
        }
        let (Some(key), Some(key_span), Some(gate)) = (key, key_span, gate) else {
            // Unreachable: each missing piece pushed an error above.
            return Err(syn::Error::new(
                Span::call_site(),
                "#[idempotent]: incomplete options",
            ));
        };
        // The name as written, less `r#`: `async fn r#move` is the action
        // "move", the name a caller of `Identity::new` would write.
        let action = action.unwrap_or_else(|| {
            LitStr::new(&signature.ident.unraw().to_string(), signature.ident.span())
        });
        Ok(Checked {
            action,
            key,
            key_span,
            gate,
            account,
            namespace,
            modes: Modes {
                replay: replay.is_some(),
                fingerprint: fingerprint.map(|f| (f.parts, f.literal.span())),
                lease: lease.map(|l| l.duration),
                wait: wait.map(|w| w.duration),
                fail_open: fail_open.is_some(),
                async_outcome: async_outcome.is_some(),
                disposition,
                expiry_in_doubt: on_expiry.is_some_and(|(in_doubt, _)| in_doubt.is_some()),
                tx,
                keep_value_for: keep_value_for.map(|k| k.duration),
                keep_slot_for: keep_slot_for.map(|k| k.duration),
                ordered,
            },
            private: match krate {
                Some(path) => quote!(#path::__private),
                None => quote!(::idem::__private),
            },
        })
    }

    fn expand(self, function: ItemFn) -> TokenStream {
        let ItemFn {
            attrs,
            vis,
            sig,
            block,
        } = function;
        let Checked {
            action,
            key,
            key_span,
            gate,
            account,
            namespace,
            modes,
            private,
        } = self;

        // The glue is imported once, under a name of the expansion's own,
        // and named through it everywhere else: a `crate = "..."` path that
        // resolves to nothing is then one error, at the path, rather than
        // one at every place the glue is used.
        let glue_import = {
            let alias = Ident::new("__idem_glue", Span::call_site());
            let import = quote!(use #private as #alias;);
            (import, quote!(#alias))
        };
        let (glue_import, private) = glue_import;

        // Names only the expansion can see.
        let gate_var = Ident::new("__idem_gate", Span::mixed_site());
        let identity_var = Ident::new("__idem_identity", Span::mixed_site());

        let parts = key
            .iter()
            .map(|part| quote_spanned!(key_span=> .part(&(#part))));
        // An ordered event's entity: an identity of the action's name, so
        // the events of one action and entity are ordered together.
        let entity_var = Ident::new("__idem_entity", Span::mixed_site());
        let entity = modes.ordered.as_ref().map(|ordered| {
            let span = ordered.entity_span;
            let parts = ordered
                .entity
                .iter()
                .map(|part| quote_spanned!(span=> .part(&(#part))));
            quote!(let #entity_var = #private::Identity::new(#action) #(#parts)*;)
        });
        let gate_span = gate.span();
        let glue_at = |span: Span| respanned(&private, span);
        let gate_glue = glue_at(gate_span);
        let gate_of = quote_spanned!(gate_span=> #gate_glue::gate_of(&(#gate)));
        let account = account.map(|account| {
            let glue = glue_at(account.span());
            quote_spanned!(account.span()=>
                let #gate_var = #glue::in_account(#gate_var, &(#account));
            )
        });
        let namespace = namespace.map(|namespace| {
            let glue = glue_at(namespace.span());
            quote_spanned!(namespace.span()=>
                let #gate_var = #glue::in_namespace(#gate_var, &(#namespace));
            )
        });

        // The guard, as a caller would write it by hand: the options, then
        // `replay` and the classifier.
        let mut guard = modes.options(&private);
        if let Some(ordered) = &modes.ordered {
            let order = &ordered.order;
            guard.extend(quote_spanned!(order.span()=> .ordered(&#entity_var, #order)));
        }
        if modes.replay {
            guard.extend(quote!(.replay()));
        }
        // In the body, an unreachable early return of the return type fixes
        // the async block's output before the body is checked (as tracing's
        // #[instrument] does), so `?`, `return` and coercions such as
        // &String to &str behave as in the original fn.
        let (output_hint, return_type) = match &sig.output {
            ReturnType::Type(_, ty) if !signature::mentions_impl_trait(ty) => {
                let fake = Ident::new("__idem_fake_return", Span::mixed_site());
                (
                    quote! {
                        #[allow(
                            unreachable_code,
                            clippy::diverging_sub_expression,
                            clippy::empty_loop,
                            clippy::needless_return,
                            clippy::unreachable
                        )]
                        if false {
                            let #fake: #ty = loop {};
                            return #fake;
                        }
                    },
                    Some(ty.clone()),
                )
            }
            _ => (TokenStream::new(), None),
        };
        // `disposition = path`: the path as a `fn(&E) -> Disposition`, `E`
        // the return type's error, so a function of another shape fails
        // where the path is written.
        if let Some(disposition) = &modes.disposition {
            let glue = glue_at(disposition.span());
            let classifier = match &return_type {
                Some(ty) => quote_spanned!(disposition.span()=>
                    #glue::classifier_of::<#ty>(#disposition)
                ),
                None => quote_spanned!(disposition.span()=> #glue::classifier(#disposition)),
            };
            guard.extend(quote!(.disposition(#classifier)));
        }
        // Every bound on the return type is met in `checked`, spanned at the
        // type: a return type that is not `Result<T, E: From<Rejected>>`
        // (or, with `replay`, whose `T` is not serde) fails there, once; the
        // terminal after it (`__run`, or `__enter` in `tx` mode) cannot fail.
        let checked = if modes.replay {
            quote!(checked_replayed)
        } else {
            quote!(checked)
        };
        let guarded = |guard: TokenStream| match &return_type {
            Some(ty) => {
                let glue = glue_at(ty.span());
                quote_spanned!(ty.span()=> #glue::#checked::<#ty, _, _>(#guard))
            }
            None => quote!(#private::#checked(#guard)),
        };
        let call = match &modes.tx {
            None => {
                let checked = guarded(quote!(#gate_var.guard(&#identity_var) #guard));
                quote! {
                #checked.__run(async move {
                    #output_hint
                    #block
                })
                .await
                }
            }
            // The body borrows the transaction, so it runs inline, between a
            // claim and a record on the same connection.
            Some(tx) => {
                let entered_var = Ident::new("__idem_entered", Span::mixed_site());
                let output_var = Ident::new("__idem_output", Span::mixed_site());
                let connection = {
                    let glue = glue_at(tx.span());
                    quote_spanned!(tx.span()=> #glue::connection_of(&mut *#tx))
                };
                let checked =
                    guarded(quote!(#gate_var.guard(&#identity_var).tx(#connection) #guard));
                quote! {
                    let #entered_var = match #checked.__enter().await
                    {
                        ::core::ops::ControlFlow::Continue(entered) => entered,
                        ::core::ops::ControlFlow::Break(refused) => return refused,
                    };
                    let #output_var = #entered_var.__around(async {
                        #output_hint
                        #block
                    })
                    .await;
                    #entered_var.__finish(#output_var, #connection).await
                }
            }
        };

        // syn keeps the body's inner attributes (`#![allow(..)]` as its first
        // line) with the item's: they open the generated body, where they
        // apply to the function as written, and never precede the signature.
        let (inner, outer): (Vec<_>, Vec<_>) = attrs
            .into_iter()
            .partition(|attr| matches!(attr.style, AttrStyle::Inner(_)));
        quote! {
            #(#outer)*
            #vis #sig {
                #(#inner)*
                #glue_import
                let #identity_var = #private::Identity::new(#action) #(#parts)*;
                #entity
                let #gate_var = #gate_of;
                #account
                #namespace
                #call
            }
        }
    }
}

impl Modes {
    /// The guard's option calls these options describe, in the order the
    /// guard's type allows: the lease (and what its expiry means) before
    /// anything that keeps the claim on the pool.
    fn options(&self, private: &TokenStream) -> TokenStream {
        let mut options = TokenStream::new();
        let nanos = |duration: std::time::Duration| {
            let nanos = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
            quote!(#private::Duration::from_nanos(#nanos))
        };
        if let Some(lease) = self.lease {
            let lease = nanos(lease);
            options.extend(quote!(.lease(#lease)));
        }
        if self.expiry_in_doubt {
            options.extend(quote!(.on_expiry(#private::OnExpiry::InDoubt)));
        }
        if let Some(wait) = self.wait {
            let wait = nanos(wait);
            options.extend(quote!(.wait(#wait)));
        }
        if self.fail_open {
            options.extend(quote!(.on_unavailable(#private::OnUnavailable::Run)));
        }
        if self.async_outcome {
            options.extend(quote!(.outcome_commit(#private::OutcomeCommit::Async)));
        }
        if let Some((parts, span)) = &self.fingerprint {
            let parts = parts
                .iter()
                .map(|part| quote_spanned!(*span=> .part(&(#part))));
            options.extend(quote!(.fingerprint(#private::Fingerprint::new() #(#parts)*)));
        }
        if let Some(window) = self.keep_value_for {
            let window = nanos(window);
            options.extend(quote!(.keep_value_for(#window)));
        }
        if let Some(window) = self.keep_slot_for {
            let window = nanos(window);
            options.extend(quote!(.keep_slot_for(#window)));
        }
        options
    }
}

/// `tx = ...` must start from a parameter, and that parameter must be one
/// the claim can write through: not behind a shared reference.
fn check_tx(tx: &syn::Expr, parameters: &Parameters, errors: &mut crate::args::Errors) {
    if let Err(error) = parameters.check_rooted(tx, tx, "`tx`") {
        errors.push(error);
        return;
    }
    let named = match tx {
        syn::Expr::Path(path) => path.path.get_ident(),
        _ => None,
    };
    let parameter = named.and_then(|name| parameters.get(&name.to_string()));
    if let Some((ident, syn::Type::Reference(reference))) = parameter
        && reference.mutability.is_none()
    {
        errors.push(syn::Error::new_spanned(
            reference,
            format!(
                "`tx = {ident}` needs a mutable connection: the claim and its settle run inside \
                 your transaction; take `{ident}: &mut sqlx::Transaction<'_, sqlx::Postgres>` \
                 (or `&mut PgConnection`)"
            ),
        ));
    }
}

#[cfg(test)]
mod tests {
    use proc_macro2::TokenStream;
    use quote::quote;

    fn expand(args: TokenStream) -> String {
        let item = quote! {
            async fn charge(
                gate: &Gate,
                tx: &mut Transaction<'_, Postgres>,
                id: u64,
            ) -> Result<Receipt, Rejected> {
                Ok(Receipt)
            }
        };
        super::idempotent(args, item).to_string()
    }

    /// `keep_value_for` and `keep_slot_for` reach the guard's builder as
    /// `.keep_value_for(Duration)` and `.keep_slot_for(Duration)`, beside
    /// every other option, on the pool and in a transaction.
    #[test]
    fn retention_windows_reach_the_guard() {
        let hour = 3_600_000_000_000_u64;
        let value = format!(". keep_value_for (__idem_glue :: Duration :: from_nanos ({hour}u64))");
        let slot = format!(
            ". keep_slot_for (__idem_glue :: Duration :: from_nanos ({}u64))",
            24 * hour
        );
        for args in [
            quote!(
                key = "id",
                keep_value_for = "1h",
                keep_slot_for = "1d",
                replay
            ),
            quote!(
                key = "id",
                keep_slot_for = "24h",
                keep_value_for = "60m",
                replay,
                fingerprint = "id",
                lease = "30s",
                on_expiry = "in_doubt",
                wait = "1s",
                on_unavailable = "run"
            ),
            quote!(
                key = "id",
                keep_value_for = "1h",
                keep_slot_for = "1d",
                tx = tx
            ),
        ] {
            let output = expand(args.clone());
            assert!(!output.contains("compile_error"), "{args}: {output}");
            assert!(output.contains(&value), "{args}: {output}");
            assert!(output.contains(&slot), "{args}: {output}");
        }

        let only_the_slot = expand(quote!(key = "id", keep_slot_for = "1d"));
        assert!(only_the_slot.contains(&slot), "{only_the_slot}");
        assert!(!only_the_slot.contains("keep_value_for"), "{only_the_slot}");
        let neither = expand(quote!(key = "id", replay));
        assert!(!neither.contains("keep_"), "{neither}");
    }

    /// Equal windows are fine; a value window longer than the slot's is an
    /// error at the value's window, and the function is still emitted.
    #[test]
    fn the_value_cannot_outlive_its_slot() {
        let equal = expand(quote!(
            key = "id",
            keep_value_for = "31d",
            keep_slot_for = "744h"
        ));
        assert!(!equal.contains("compile_error"), "{equal}");

        let longer = expand(quote!(
            key = "id",
            keep_value_for = "32d",
            keep_slot_for = "31d"
        ));
        assert!(longer.contains("compile_error"), "{longer}");
        assert!(
            longer.contains("the value cannot outlive its slot"),
            "{longer}"
        );
        assert!(longer.contains("async fn charge"), "{longer}");
    }
}
