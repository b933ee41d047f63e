//! What the function's signature offers the attribute: its parameters, its
//! receiver, and where each key expression is rooted.

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::{Expr, FnArg, Ident, Pat, Signature, Type};

/// The names a key expression may start from.
pub(crate) struct Parameters {
    /// Every name bound by the parameter patterns, with its parameter's type.
    pub names: Vec<(Ident, Type)>,
    /// `true` for methods with a `self` receiver.
    pub has_receiver: bool,
    /// The function's name, for messages.
    pub function: Ident,
}

impl Parameters {
    pub fn of(signature: &Signature) -> Self {
        let mut names = Vec::new();
        let mut has_receiver = false;
        for input in &signature.inputs {
            match input {
                FnArg::Receiver(_) => has_receiver = true,
                FnArg::Typed(typed) => bind_names(&typed.pat, &typed.ty, &mut names),
            }
        }
        Parameters {
            names,
            has_receiver,
            function: signature.ident.clone(),
        }
    }

    pub fn get(&self, name: &str) -> Option<&(Ident, Type)> {
        self.names.iter().find(|(ident, _)| ident == name)
    }

    /// The names, for a message: "`gate`, `order`" or "none".
    pub fn listed(&self) -> String {
        let mut listed: Vec<String> = Vec::new();
        if self.has_receiver {
            listed.push("`self`".to_owned());
        }
        listed.extend(self.names.iter().map(|(ident, _)| format!("`{ident}`")));
        if listed.is_empty() {
            "none".to_owned()
        } else {
            listed.join(", ")
        }
    }

    /// Checks that `expr` starts from a parameter (or `self` in a method).
    /// `what` names the expression in messages ("key part", "`gate`").
    pub fn check_rooted(&self, expr: &Expr, span: &dyn ToTokens, what: &str) -> syn::Result<()> {
        let Some(root) = root_of(expr) else {
            return Err(syn::Error::new_spanned(
                span,
                format!(
                    "{what} `{}` does not start from a parameter of `{}`: key parts are \
                     expressions on the arguments, such as `order.id` or `self.tenant`; a \
                     constant belongs in `action`",
                    expr.to_token_stream(),
                    self.function
                ),
            ));
        };
        if root == "self" {
            if self.has_receiver {
                return Ok(());
            }
            return Err(syn::Error::new_spanned(
                span,
                format!(
                    "{what} `{}` uses `self`, but `{}` is not a method with a `self` receiver: \
                     start from one of its parameters ({})",
                    expr.to_token_stream(),
                    self.function,
                    self.listed()
                ),
            ));
        }
        if self.get(&root.to_string()).is_some() {
            return Ok(());
        }
        let known = self
            .names
            .iter()
            .map(|(ident, _)| ident.to_string())
            .collect::<Vec<_>>();
        let hint = match crate::args::closest(&root.to_string(), known.iter().map(String::as_str)) {
            Some(close) => format!("did you mean `{close}`?"),
            None => format!("its parameters are {}", self.listed()),
        };
        Err(syn::Error::new_spanned(
            span,
            format!(
                "{what} `{}` starts from `{root}`, but `{}` has no parameter named `{root}`: {hint}",
                expr.to_token_stream(),
                self.function
            ),
        ))
    }

    /// A hint for a function with no gate: a parameter whose type mentions
    /// `Gate`, or `self.gate` for a method.
    pub fn gate_hint(&self) -> String {
        let typed_gate = self.names.iter().find(|(_, ty)| {
            ty.to_token_stream()
                .into_iter()
                .any(|token| token.to_string() == "Gate")
        });
        match (typed_gate, self.has_receiver) {
            (Some((ident, _)), _) => format!("#[idempotent(..., gate = {ident})]"),
            (None, true) => "#[idempotent(..., gate = self.gate)]".to_owned(),
            (None, false) => "#[idempotent(..., gate = MY_GATE.get())]".to_owned(),
        }
    }
}

/// Collects every name a parameter pattern binds.
fn bind_names(pat: &Pat, ty: &Type, names: &mut Vec<(Ident, Type)>) {
    match pat {
        Pat::Ident(binding) => {
            names.push((binding.ident.clone(), ty.clone()));
            if let Some((_, sub)) = &binding.subpat {
                bind_names(sub, ty, names);
            }
        }
        Pat::Reference(reference) => bind_names(&reference.pat, ty, names),
        Pat::Struct(structure) => {
            for field in &structure.fields {
                bind_names(&field.pat, ty, names);
            }
        }
        Pat::Tuple(tuple) => tuple.elems.iter().for_each(|p| bind_names(p, ty, names)),
        Pat::TupleStruct(tuple) => tuple.elems.iter().for_each(|p| bind_names(p, ty, names)),
        Pat::Slice(slice) => slice.elems.iter().for_each(|p| bind_names(p, ty, names)),
        Pat::Paren(paren) => bind_names(&paren.pat, ty, names),
        Pat::Type(typed) => bind_names(&typed.pat, ty, names),
        _ => {}
    }
}

/// The variable an expression starts from: `order` in `order.items[0].sku`,
/// `self` in `self.tenant.id()`, `amount` in `*amount as i64` or
/// `amount / 100`. `None` for expressions that do not start from a variable
/// (function calls, literals, macros, blocks).
pub(crate) fn root_of(expr: &Expr) -> Option<&Ident> {
    match expr {
        Expr::Path(path) if path.qself.is_none() => path.path.get_ident(),
        Expr::Field(field) => root_of(&field.base),
        Expr::MethodCall(call) => root_of(&call.receiver),
        Expr::Index(index) => root_of(&index.expr),
        Expr::Reference(reference) => root_of(&reference.expr),
        Expr::Paren(paren) => root_of(&paren.expr),
        Expr::Group(group) => root_of(&group.expr),
        Expr::Unary(unary) => root_of(&unary.expr),
        Expr::Cast(cast) => root_of(&cast.expr),
        // `amount_cents / 100`, `order.total > LIMIT`: rooted through either side.
        Expr::Binary(binary) => root_of(&binary.left).or_else(|| root_of(&binary.right)),
        _ => None,
    }
}

/// A `Span` to point at the function when nothing narrower is to blame.
pub(crate) fn function_span(signature: &Signature) -> Span {
    signature.ident.span()
}

/// `true` when a type mentions `impl Trait`, which no turbofish may name.
pub(crate) fn mentions_impl_trait(ty: &Type) -> bool {
    fn walk(tokens: TokenStream) -> bool {
        tokens.into_iter().any(|token| match token {
            proc_macro2::TokenTree::Ident(ident) => ident == "impl",
            proc_macro2::TokenTree::Group(group) => walk(group.stream()),
            _ => false,
        })
    }
    walk(ty.to_token_stream())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root(expr: &str) -> Option<String> {
        let expr: Expr = syn::parse_str(expr).unwrap();
        root_of(&expr).map(Ident::to_string)
    }

    #[test]
    fn roots_follow_fields_methods_indexes_and_operators() {
        assert_eq!(root("order.items[0].sku").as_deref(), Some("order"));
        assert_eq!(root("self.tenant.id()").as_deref(), Some("self"));
        assert_eq!(root("*amount as i64").as_deref(), Some("amount"));
        assert_eq!(root("&(order.id)").as_deref(), Some("order"));
        assert_eq!(root("amount_cents / 100").as_deref(), Some("amount_cents"));
        assert_eq!(root("100 * amount").as_deref(), Some("amount"));
    }

    #[test]
    fn calls_literals_macros_and_paths_have_no_root() {
        for expr in [
            "tenant()",
            "\"v2\"",
            "format!(\"{}\", x)",
            "crate::ID",
            "{ x }",
        ] {
            assert_eq!(root(expr), None, "{expr}");
        }
    }

    #[test]
    fn parameters_include_every_bound_name() {
        let sig: Signature = syn::parse_str(
            "async fn f(&self, gate: &Gate, Order { id, customer: who }: Order, (a, b): (u8, u8))",
        )
        .unwrap();
        let parameters = Parameters::of(&sig);
        assert!(parameters.has_receiver);
        let names: Vec<String> = parameters
            .names
            .iter()
            .map(|(i, _)| i.to_string())
            .collect();
        assert_eq!(names, ["gate", "id", "who", "a", "b"]);
        assert_eq!(parameters.gate_hint(), "#[idempotent(..., gate = gate)]");
    }
}
