//! Reads PostgreSQL's stored expression trees (`pg_node_tree`, as in
//! `pg_index.indexprs` and `pg_index.indpred`) into the few node kinds the
//! audit reasons about.
//!
//! Why the stored tree rather than the deparsed SQL of `pg_get_expr`: the
//! tree names every function and operator by OID (so strictness is looked up,
//! not guessed from a name that a user's function could shadow), distinguishes
//! `IS DISTINCT FROM` and `NULLIF` from the operator they are spelled with,
//! and needs no SQL parser. Its text form is `nodeToString`'s output; the
//! tokens follow `pg_strtok` in PostgreSQL's `read.c`: whitespace separates
//! them, each of `(`, `)`, `{`, `}` is a token of its own, and a backslash
//! makes the next character literal.
//!
//! Every node kind not listed in [`Expr`], and every node missing a field we
//! expect, becomes [`Expr::Opaque`], which proves nothing: the audit then
//! reports the index rather than assume it is safe.

/// An expression, reduced to what decides whether it can be NULL.
#[derive(Debug, Clone)]
pub enum Expr {
    /// A column of the indexed table, by attribute number (`VAR`).
    Column(i16),
    /// A constant (`CONST`); `value` is its stored datum, for comparisons.
    Const {
        /// `true` for a NULL constant.
        is_null: bool,
        /// The type and datum as stored, so two constants compare equal only
        /// when they are the same value of the same type.
        value: String,
    },
    /// A function call or an operator (`FUNCEXPR`, `OPEXPR`): the function
    /// by OID, and the collation it runs under.
    Call {
        /// `pg_proc.oid`, 0 when the tree did not record it.
        function: u32,
        /// The input collation, part of what makes two calls the same.
        collation: u32,
        /// The arguments, in order.
        args: Vec<Expr>,
    },
    /// `scalar op ANY (array)` or `scalar op ALL (array)`, which `IN (...)`
    /// and `NOT IN (...)` become (`SCALARARRAYOPEXPR`).
    ArrayComparison {
        /// The operator's function, by OID.
        function: u32,
        /// `true` for `ANY`, `false` for `ALL`.
        any: bool,
        /// The left-hand side.
        scalar: Box<Expr>,
        /// The array.
        array: Box<Expr>,
    },
    /// `ARRAY[...]` with its elements (`ARRAYEXPR`, one dimension).
    Array(Vec<Expr>),
    /// `a AND b AND ...`
    And(Vec<Expr>),
    /// `a OR b OR ...`
    Or(Vec<Expr>),
    /// `NOT a`
    Not(Box<Expr>),
    /// `arg IS NULL` (`is_null`) or `arg IS NOT NULL` (`NULLTEST`).
    NullTest {
        /// What is tested.
        arg: Box<Expr>,
        /// `true` for `IS NULL`, `false` for `IS NOT NULL`.
        is_null: bool,
    },
    /// `arg IS [NOT] TRUE | FALSE | UNKNOWN` (`BOOLEANTEST`).
    BoolTest {
        /// What is tested.
        arg: Box<Expr>,
        /// Which test.
        test: BoolTestKind,
    },
    /// `COALESCE(...)` (`COALESCEEXPR`).
    Coalesce(Vec<Expr>),
    /// A cast that is NULL exactly when its argument is: a binary-compatible
    /// one (`RELABELTYPE`), or one to `text` through the types' text forms
    /// (`COERCEVIAIO`; an output function never yields NULL, nor does `text`'s
    /// input function).
    Cast(Box<Expr>),
    /// Anything else, by node tag (`CASEEXPR`, `NULLIFEXPR`, ...): it proves
    /// nothing and is never the same as another expression.
    Opaque(String),
}

/// The six forms of `BOOLEANTEST`, in `BoolTestType` order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BoolTestKind {
    /// `IS TRUE`
    True,
    /// `IS NOT TRUE`
    NotTrue,
    /// `IS FALSE`
    False,
    /// `IS NOT FALSE`
    NotFalse,
    /// `IS UNKNOWN`
    Unknown,
    /// `IS NOT UNKNOWN`
    NotUnknown,
}

/// `text`'s type OID: a cast to it through I/O is NULL exactly when its
/// argument is.
const TEXT_TYPE: u32 = 25;

/// Reads one expression (`indpred`). Anything unreadable is [`Expr::Opaque`].
pub fn parse_expr(tree: &str) -> Expr {
    match parse_value(tree) {
        Some(Value::List(items)) => Expr::And(items.iter().map(to_expr).collect()),
        Some(value) => to_expr(&value),
        None => Expr::Opaque("unreadable expression".to_owned()),
    }
}

/// One expression key of an index (an element of `indexprs`).
#[derive(Debug, Clone)]
pub struct IndexExpression {
    /// The expression.
    pub expr: Expr,
    /// The collation the expression has by itself (`exprCollation`), `None`
    /// when its node kind is not one we know: an index collation that differs
    /// from it must be spelled out to be kept.
    pub collation: Option<u32>,
}

/// Reads a list of expressions (`indexprs`), or `None` when the text is not
/// one: the caller must then treat every expression column as unknown.
pub fn parse_expr_list(tree: &str) -> Option<Vec<IndexExpression>> {
    match parse_value(tree)? {
        Value::List(items) => Some(
            items
                .iter()
                .map(|item| IndexExpression {
                    expr: to_expr(item),
                    collation: result_collation(item),
                })
                .collect(),
        ),
        _ => None,
    }
}

/// The OIDs of every function an expression calls, operators included.
pub fn functions_called(expr: &Expr, out: &mut Vec<u32>) {
    match expr {
        Expr::Call { function, args, .. } => {
            out.push(*function);
            args.iter().for_each(|a| functions_called(a, out));
        }
        Expr::ArrayComparison {
            function,
            scalar,
            array,
            ..
        } => {
            out.push(*function);
            functions_called(scalar, out);
            functions_called(array, out);
        }
        Expr::Array(items) | Expr::And(items) | Expr::Or(items) | Expr::Coalesce(items) => {
            items.iter().for_each(|a| functions_called(a, out));
        }
        Expr::Not(arg)
        | Expr::NullTest { arg, .. }
        | Expr::BoolTest { arg, .. }
        | Expr::Cast(arg) => functions_called(arg, out),
        Expr::Column(_) | Expr::Const { .. } | Expr::Opaque(_) => {}
    }
}

/// The field that holds a node's result collation, for the node kinds an
/// index expression commonly has at its top (PostgreSQL's `exprCollation`).
/// Boolean-valued nodes have none and yield `Some(0)`.
fn result_collation(value: &Value) -> Option<u32> {
    const FIELDS: &[&str] = &[
        "varcollid",
        "constcollid",
        "funccollid",
        "opcollid",
        "coalescecollid",
        "resultcollid",
        "collOid",
        "casecollid",
        "array_collid",
        "minmaxcollid",
        "refcollid",
    ];
    const BOOLEAN: &[&str] = &["BOOLEXPR", "NULLTEST", "BOOLEANTEST", "SCALARARRAYOPEXPR"];
    let Value::Node(node) = value else {
        return None;
    };
    if BOOLEAN.contains(&node.tag.as_str()) {
        return Some(0);
    }
    FIELDS.iter().find_map(|field| node.number(field))
}

/// One piece of `nodeToString` output, before we know what it means.
#[derive(Debug, Clone, PartialEq)]
enum Value {
    /// `{TAG :field value... :field value...}`
    Node(Node),
    /// `(value ...)`
    List(Vec<Value>),
    /// Any other token: a number, a name, `true`, `<>`, `[`, ...
    Word(String),
}

#[derive(Debug, Clone, PartialEq)]
struct Node {
    tag: String,
    /// Each field with the values that follow its `:name` (a datum such as
    /// `4 [ 1 0 0 0 ]` is several words).
    fields: Vec<(String, Vec<Value>)>,
}

impl Node {
    fn field(&self, name: &str) -> Option<&[Value]> {
        self.fields
            .iter()
            .find(|(field, _)| field == name)
            .map(|(_, values)| values.as_slice())
    }

    fn word(&self, name: &str) -> Option<&str> {
        match self.field(name)? {
            [Value::Word(word)] => Some(word),
            _ => None,
        }
    }

    fn number<T: std::str::FromStr>(&self, name: &str) -> Option<T> {
        self.word(name)?.parse().ok()
    }

    fn flag(&self, name: &str) -> Option<bool> {
        match self.word(name)? {
            "true" => Some(true),
            "false" => Some(false),
            _ => None,
        }
    }

    fn child(&self, name: &str) -> Option<Expr> {
        match self.field(name)? {
            [value @ Value::Node(_)] => Some(to_expr(value)),
            _ => None,
        }
    }

    fn children(&self, name: &str) -> Option<Vec<Expr>> {
        match self.field(name)? {
            [Value::List(items)] => Some(items.iter().map(to_expr).collect()),
            _ => None,
        }
    }
}

fn to_expr(value: &Value) -> Expr {
    match value {
        Value::Node(node) => node_to_expr(node).unwrap_or_else(|| Expr::Opaque(node.tag.clone())),
        Value::List(items) => Expr::And(items.iter().map(to_expr).collect()),
        Value::Word(word) => Expr::Opaque(word.clone()),
    }
}

/// The node as an [`Expr`], or `None` when it is not a kind we reason about
/// or lacks a field we need.
fn node_to_expr(node: &Node) -> Option<Expr> {
    let expr = match node.tag.as_str() {
        // varlevelsup is 0 and varno 1 in an index; anything else is not a
        // column of the indexed table.
        "VAR" if node.number::<u32>("varlevelsup")? == 0 => Expr::Column(node.number("varattno")?),
        "CONST" => {
            let datum: Vec<&str> = node
                .field("constvalue")?
                .iter()
                .map(|v| match v {
                    Value::Word(w) => Some(w.as_str()),
                    _ => None,
                })
                .collect::<Option<_>>()?;
            Expr::Const {
                is_null: node.flag("constisnull")?,
                value: format!("{} {}", node.word("consttype")?, datum.join(" ")),
            }
        }
        // `f(VARIADIC array)` passes one array for many arguments: the
        // arguments in the tree are not the function's (num_nonnulls would
        // count the array as one), so it proves nothing.
        "FUNCEXPR" if node.flag("funcvariadic") == Some(true) => {
            Expr::Opaque("VARIADIC".to_owned())
        }
        "FUNCEXPR" => Expr::Call {
            function: node.number("funcid")?,
            collation: node.number("inputcollid")?,
            args: node.children("args")?,
        },
        "OPEXPR" => Expr::Call {
            function: node.number("opfuncid")?,
            collation: node.number("inputcollid")?,
            args: node.children("args")?,
        },
        "SCALARARRAYOPEXPR" => {
            let mut args = node.children("args")?.into_iter();
            let (scalar, array) = (args.next()?, args.next()?);
            Expr::ArrayComparison {
                function: node.number("opfuncid")?,
                any: node.flag("useOr")?,
                scalar: Box::new(scalar),
                array: Box::new(array),
            }
        }
        // PostgreSQL before 15 names some nodes by their SQL keyword
        // (`ARRAY`, `COALESCE`) rather than their struct.
        "ARRAYEXPR" | "ARRAY" if !node.flag("multidims")? => {
            Expr::Array(node.children("elements")?)
        }
        "BOOLEXPR" => {
            let args = node.children("args")?;
            match node.word("boolop")? {
                "and" => Expr::And(args),
                "or" => Expr::Or(args),
                "not" => Expr::Not(Box::new(args.into_iter().next()?)),
                _ => return None,
            }
        }
        "NULLTEST" => Expr::NullTest {
            arg: Box::new(node.child("arg")?),
            // NullTestType: IS_NULL = 0, IS_NOT_NULL = 1.
            is_null: match node.number::<u8>("nulltesttype")? {
                0 => true,
                1 => false,
                _ => return None,
            },
        },
        "BOOLEANTEST" => Expr::BoolTest {
            arg: Box::new(node.child("arg")?),
            test: match node.number::<u8>("booltesttype")? {
                0 => BoolTestKind::True,
                1 => BoolTestKind::NotTrue,
                2 => BoolTestKind::False,
                3 => BoolTestKind::NotFalse,
                4 => BoolTestKind::Unknown,
                5 => BoolTestKind::NotUnknown,
                _ => return None,
            },
        },
        "COALESCEEXPR" | "COALESCE" => Expr::Coalesce(node.children("args")?),
        "RELABELTYPE" => Expr::Cast(Box::new(node.child("arg")?)),
        "COERCEVIAIO" if node.number::<u32>("resulttype")? == TEXT_TYPE => {
            Expr::Cast(Box::new(node.child("arg")?))
        }
        _ => return None,
    };
    Some(expr)
}

/// Parses the whole text as one value; `None` if it is not exactly one.
fn parse_value(text: &str) -> Option<Value> {
    let mut tokens = Tokens::new(text);
    let first = tokens.next()?;
    let value = read_value(&mut tokens, first)?;
    tokens.next().is_none().then_some(value)
}

fn read_value(tokens: &mut Tokens<'_>, first: Token) -> Option<Value> {
    match first {
        Token::OpenNode => read_node(tokens).map(Value::Node),
        Token::OpenList => {
            let mut items = Vec::new();
            loop {
                match tokens.next()? {
                    Token::CloseList => return Some(Value::List(items)),
                    token => items.push(read_value(tokens, token)?),
                }
            }
        }
        Token::Word(word) => Some(Value::Word(word)),
        Token::CloseNode | Token::CloseList => None,
    }
}

fn read_node(tokens: &mut Tokens<'_>) -> Option<Node> {
    let Token::Word(tag) = tokens.next()? else {
        return None;
    };
    let mut node = Node {
        tag,
        fields: Vec::new(),
    };
    loop {
        match tokens.next()? {
            Token::CloseNode => return Some(node),
            Token::Word(word) if word.starts_with(':') => {
                node.fields.push((word[1..].to_owned(), Vec::new()));
            }
            token => {
                let value = read_value(tokens, token)?;
                // A value before any field name is malformed.
                node.fields.last_mut()?.1.push(value);
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    OpenNode,
    CloseNode,
    OpenList,
    CloseList,
    Word(String),
}

/// `pg_strtok`, as an iterator.
struct Tokens<'a> {
    rest: &'a str,
}

impl<'a> Tokens<'a> {
    fn new(text: &'a str) -> Self {
        Tokens { rest: text }
    }
}

impl Iterator for Tokens<'_> {
    type Item = Token;

    fn next(&mut self) -> Option<Token> {
        self.rest = self.rest.trim_start_matches([' ', '\n', '\t', '\r']);
        let mut chars = self.rest.char_indices();
        let (_, first) = chars.next()?;
        let single = match first {
            '{' => Some(Token::OpenNode),
            '}' => Some(Token::CloseNode),
            '(' => Some(Token::OpenList),
            ')' => Some(Token::CloseList),
            _ => None,
        };
        if let Some(token) = single {
            self.rest = &self.rest[1..];
            return Some(token);
        }
        let mut word = String::new();
        let mut escaped = false;
        let mut end = self.rest.len();
        for (at, c) in self.rest.char_indices() {
            if escaped {
                word.push(c);
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if matches!(c, ' ' | '\n' | '\t' | '\r' | '{' | '}' | '(' | ')') {
                end = at;
                break;
            } else {
                word.push(c);
            }
        }
        self.rest = &self.rest[end..];
        Some(Token::Word(word))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `WHERE email IS NOT NULL AND a > 0`, as PostgreSQL 15 stores it.
    const AND_PREDICATE: &str = "{BOOLEXPR :boolop and :args ({NULLTEST :arg {VAR :varno 1 \
        :varattno 2 :vartype 25 :vartypmod -1 :varcollid 100 :varlevelsup 0 :varnosyn 1 \
        :varattnosyn 2 :location 49} :nulltesttype 1 :argisrow false :location 55} {OPEXPR \
        :opno 521 :opfuncid 147 :opresulttype 16 :opretset false :opcollid 0 :inputcollid 0 \
        :args ({VAR :varno 1 :varattno 4 :vartype 23 :vartypmod -1 :varcollid 0 :varlevelsup 0 \
        :varnosyn 1 :varattnosyn 4 :location 71} {CONST :consttype 23 :consttypmod -1 \
        :constcollid 0 :constlen 4 :constbyval true :constisnull false :location 75 \
        :constvalue 4 [ 0 0 0 0 0 0 0 0 ]}) :location 73}) :location -1}";

    #[test]
    fn reads_a_conjunction_of_a_null_test_and_an_operator() {
        let Expr::And(args) = parse_expr(AND_PREDICATE) else {
            panic!("not an AND: {:?}", parse_expr(AND_PREDICATE));
        };
        assert!(matches!(
            &args[0],
            Expr::NullTest { arg, is_null: false } if matches!(**arg, Expr::Column(2))
        ));
        let Expr::Call {
            function, args: op, ..
        } = &args[1]
        else {
            panic!("not a call: {:?}", args[1]);
        };
        assert_eq!(*function, 147);
        assert!(matches!(op[0], Expr::Column(4)));
        assert!(
            matches!(&op[1], Expr::Const { is_null: false, value } if value == "23 4 [ 0 0 0 0 0 0 0 0 ]")
        );
    }

    #[test]
    fn reads_expression_lists_and_keeps_unknown_nodes_opaque() {
        let list = "({NULLIFEXPR :opno 98 :opfuncid 67 :args ({VAR :varno 1 :varattno 5 \
            :varlevelsup 0}) :location 1} {COALESCEEXPR :coalescetype 25 :args ({VAR \
            :varattno 5 :varlevelsup 0} {CONST :consttype 25 :constisnull false :constvalue 4 \
            [ 16 0 0 0 ]}) :location 47})";
        let exprs = parse_expr_list(list).unwrap_or_default();
        assert_eq!(exprs.len(), 2);
        assert!(matches!(&exprs[0].expr, Expr::Opaque(tag) if tag == "NULLIFEXPR"));
        assert_eq!(exprs[0].collation, None, "no opcollid field given");
        assert!(matches!(&exprs[1].expr, Expr::Coalesce(args) if args.len() == 2));
        assert_eq!(exprs[1].collation, None, "no coalescecollid field given");
        let collated =
            parse_expr_list("({FUNCEXPR :funcid 870 :funccollid 950 :inputcollid 100 :args ()})");
        assert_eq!(collated.map(|e| e[0].collation), Some(Some(950)));
    }

    #[test]
    fn variadic_calls_prove_nothing_as_their_arguments_are_not_the_trees() {
        let call = |variadic: &str| {
            parse_expr(&format!(
                "{{FUNCEXPR :funcid 440 :funcvariadic {variadic} :inputcollid 0 :args ({{VAR \
                 :varno 1 :varattno 1}})}}"
            ))
        };
        assert!(matches!(call("true"), Expr::Opaque(tag) if tag == "VARIADIC"));
        assert!(matches!(call("false"), Expr::Call { function: 440, .. }));
    }

    #[test]
    fn reads_the_node_names_of_postgresql_before_15() {
        // Printed by PostgreSQL 12.22 for (coalesce(email, '')) and
        // n = ANY (ARRAY[n, 3]).
        let list = "({COALESCE :coalescetype 25 :coalescecollid 100 :args ({VAR :varno 1 \
            :varattno 1 :vartype 25 :vartypmod -1 :varcollid 100 :varlevelsup 0 :varnoold 1 \
            :varoattno 1 :location 66} {CONST :consttype 25 :consttypmod -1 :constcollid 100 \
            :constlen -1 :constbyval false :constisnull false :location 73 :constvalue 4 \
            [ 16 0 0 0 ]}) :location 57})";
        let exprs = parse_expr_list(list).unwrap_or_default();
        assert!(matches!(&exprs[0].expr, Expr::Coalesce(args) if args.len() == 2));
        assert_eq!(exprs[0].collation, Some(100));
        let array = parse_expr(
            "{ARRAY :array_typeid 1007 :array_collid 0 :element_typeid 23 :elements \
             ({VAR :varno 1 :varattno 2 :varlevelsup 0} {CONST :consttype 23 :constisnull false \
             :constvalue 4 [ 3 0 0 0 0 0 0 0 ]}) :multidims false :location 90}",
        );
        assert!(
            matches!(&array, Expr::Array(elements) if elements.len() == 2),
            "{array:?}"
        );
    }

    #[test]
    fn escaped_brackets_are_part_of_a_word() {
        let tokens: Vec<Token> = Tokens::new(r"{X :name a\ b\{c\) :n <>}").collect();
        assert_eq!(
            tokens,
            vec![
                Token::OpenNode,
                Token::Word("X".into()),
                Token::Word(":name".into()),
                Token::Word("a b{c)".into()),
                Token::Word(":n".into()),
                Token::Word("<>".into()),
                Token::CloseNode,
            ]
        );
    }

    #[test]
    fn malformed_trees_prove_nothing() {
        for bad in [
            "",
            "{VAR :varattno 1",
            "{VAR :varattno}",
            "()) extra",
            "{ }",
            "{VAR 1}",
        ] {
            assert!(
                matches!(parse_expr(bad), Expr::Opaque(_)),
                "{bad:?} gave {:?}",
                parse_expr(bad)
            );
        }
        assert!(parse_expr_list("{VAR :varattno 1 :varlevelsup 0}").is_none());
    }

    #[test]
    fn casts_to_text_through_io_keep_nullness_and_others_do_not() {
        let to_text = "{COERCEVIAIO :arg {VAR :varattno 1 :varlevelsup 0} :resulttype 25}";
        let to_int = "{COERCEVIAIO :arg {VAR :varattno 1 :varlevelsup 0} :resulttype 23}";
        assert!(matches!(parse_expr(to_text), Expr::Cast(_)));
        assert!(matches!(parse_expr(to_int), Expr::Opaque(_)));
    }
}
