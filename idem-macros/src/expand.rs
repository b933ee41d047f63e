//! From a checked attribute and function to the guarded function.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Ident, ItemFn, LitStr, ReturnType};

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
}

impl Checked {
    fn new(args: Args, function: &ItemFn) -> syn::Result<Checked> {
        let Args {
            key,
            action,
            gate,
            account,
            namespace,
            mut errors,
        } = args;
        let signature = &function.sig;
        let parameters = Parameters::of(signature);

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
        let action = action
            .unwrap_or_else(|| LitStr::new(&signature.ident.to_string(), signature.ident.span()));
        Ok(Checked {
            action,
            key,
            key_span,
            gate,
            account,
            namespace,
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
        } = self;

        // Names only the expansion can see.
        let gate_var = Ident::new("__idem_gate", Span::mixed_site());
        let identity_var = Ident::new("__idem_identity", Span::mixed_site());

        let parts = key
            .iter()
            .map(|part| quote_spanned!(key_span=> .part(&(#part))));
        let gate_span = gate.span();
        let gate_of = quote_spanned!(gate_span=> ::idem::__private::gate_of(&(#gate)));
        let account = account.map(|account| {
            quote_spanned!(account.span()=>
                let #gate_var = ::idem::__private::in_account(#gate_var, &(#account));
            )
        });
        let namespace = namespace.map(|namespace| {
            quote_spanned!(namespace.span()=>
                let #gate_var = ::idem::__private::in_namespace(#gate_var, &(#namespace));
            )
        });

        // Naming the return type at the call points a wrong return type's
        // error at the type itself. In the body, an unreachable early return
        // of that type fixes the async block's output before the body is
        // checked (as tracing's #[instrument] does), so `?`, `return` and
        // coercions such as &String to &str behave as in the original fn.
        // `outcome_of::<ReturnType>()` carries the return type's span: a
        // return type that is not `Result<T, E: From<Rejected>>` fails there,
        // once. In the body, an unreachable early return of that type fixes
        // the async block's output before the body is checked (as tracing's
        // #[instrument] does), so `?`, `return` and coercions such as &String
        // to &str behave as in the original function.
        let (outcome, output_hint) = match &sig.output {
            ReturnType::Type(_, ty) if !signature::mentions_impl_trait(ty) => {
                let fake = Ident::new("__idem_fake_return", Span::mixed_site());
                (
                    quote_spanned!(ty.span()=> ::idem::__private::outcome_of::<#ty>()),
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
                )
            }
            _ => (quote!(::idem::__private::outcome_of()), TokenStream::new()),
        };
        let call = quote! {
            ::idem::__private::run_with(&#gate_var, &#identity_var, #outcome, async move {
                #output_hint
                #block
            })
            .await
        };

        quote! {
            #(#attrs)*
            #vis #sig {
                let #identity_var = ::idem::Identity::new(#action) #(#parts)*;
                let #gate_var = #gate_of;
                #account
                #namespace
                #call
            }
        }
    }
}
