//! A small evaluator of Bicep expressions over the tree-sitter syntax tree, enough to compute
//! what the deployment will create: resource names, the container app's settings, the
//! termination grace. Parameters take the parameters file's values (or any other), variables
//! and module parameters are followed to their source, and what is only known at deployment
//! (module outputs, resource properties) stays a symbolic [`Value::Unknown`] naming its
//! expression, so tests can still compare where two settings come from.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tree_sitter::{Node, Parser, Tree};

use crate::check::Deployment;

/// What `uniqueString(…)` evaluates to: 13 characters of `[a-z0-9]`, as Azure's function returns.
pub(crate) const UNIQUE_STRING: &str = "u7c3k9x2m4q1z";
/// What `resourceGroup().id` stands for in computed resource ids.
pub(crate) const RESOURCE_GROUP_ID: &str = "/subscriptions/s/resourceGroups/rg";
/// What `guid(…)` evaluates to.
pub(crate) const GUID: &str = "0f8fad5b-d9cb-469f-a165-70867728950e";

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    Str(String),
    Int(i64),
    Bool(bool),
    Null,
    Array(Vec<Value>),
    Object(BTreeMap<String, Value>),
    /// Known only at deployment: the expression's text.
    Unknown(String),
    /// `fail(message)` evaluated: the deployment stops with this message.
    Failed(String),
}

impl Value {
    pub(crate) fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Object(map) => map.get(key),
            _ => None,
        }
    }

    /// `a.b.c` through objects.
    pub(crate) fn path(&self, path: &str) -> Option<&Value> {
        path.split('.').try_fold(self, |v, key| v.get(key))
    }

    pub(crate) fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub(crate) fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(n) => Some(*n),
            _ => None,
        }
    }

    pub(crate) fn items(&self) -> &[Value] {
        match self {
            Value::Array(items) => items,
            _ => &[],
        }
    }

    fn from_json(json: &serde_json::Value) -> Value {
        match json {
            serde_json::Value::Null => Value::Null,
            serde_json::Value::Bool(b) => Value::Bool(*b),
            serde_json::Value::Number(n) => n.as_i64().map_or(Value::Null, Value::Int),
            serde_json::Value::String(s) => Value::Str(s.clone()),
            serde_json::Value::Array(a) => Value::Array(a.iter().map(Value::from_json).collect()),
            serde_json::Value::Object(o) => Value::Object(
                o.iter()
                    .map(|(k, v)| (k.clone(), Value::from_json(v)))
                    .collect(),
            ),
        }
    }

    /// Text inside an interpolation: unknown parts as `⟨expression⟩`.
    fn interpolated(&self) -> String {
        match self {
            Value::Str(s) => s.clone(),
            Value::Int(n) => n.to_string(),
            Value::Bool(b) => b.to_string(),
            Value::Null => String::new(),
            Value::Unknown(e) => format!("⟨{e}⟩"),
            other => format!("{other:?}"),
        }
    }
}

/// One parsed file with the values of its parameters.
pub(crate) struct Scope<'d> {
    source: &'d str,
    tree: Tree,
    params: BTreeMap<String, Value>,
    /// Loop variables of the `[for … in …: …]` being evaluated.
    locals: RefCell<BTreeMap<String, Value>>,
}

/// One `resource` declaration, evaluated.
#[derive(Debug)]
pub(crate) struct Resource {
    pub(crate) file: PathBuf,
    pub(crate) symbol: String,
    /// `Microsoft.App/containerApps` (no API version).
    pub(crate) kind: String,
    pub(crate) existing: bool,
    /// `if (…)`: whether the deployment creates it (`Bool(true)` when unconditional).
    pub(crate) condition: Value,
    /// The body object (`name`, `properties`, …).
    pub(crate) body: Value,
}

fn parse(source: &str) -> Tree {
    let mut parser = Parser::new();
    parser
        .set_language(&tree_sitter_bicep::LANGUAGE.into())
        .unwrap();
    parser.parse(source, None).unwrap()
}

fn text<'s>(node: Node<'_>, src: &'s str) -> &'s str {
    &src[node.byte_range()]
}

fn unquote(s: &str) -> String {
    s.trim().trim_matches('\'').to_owned()
}

fn declarations(root: Node<'_>) -> Vec<Node<'_>> {
    let mut cursor = root.walk();
    root.named_children(&mut cursor)
        .map(|n| {
            if n.kind() == "declaration" {
                n.named_child(0).unwrap_or(n)
            } else {
                n
            }
        })
        .collect()
}

fn identifier<'s>(decl: Node<'_>, src: &'s str) -> &'s str {
    let mut cursor = decl.walk();
    decl.named_children(&mut cursor)
        .find(|c| c.kind() == "identifier")
        .map_or("", |n| text(n, src))
}

/// The last named child that is the declaration's value (`= …`), unwrapping `if (…) {…}` and
/// `[for … : {…}]` to the object.
fn value_node(decl: Node<'_>) -> Option<Node<'_>> {
    let mut cursor = decl.walk();
    let last = decl.named_children(&mut cursor).last()?;
    match last.kind() {
        "if_statement" | "for_statement" => body_object(last),
        _ => Some(last),
    }
}

/// The object of `if (…) {…}` or `[for … : {…}]`, also `[for … : if (…) {…}]`.
fn body_object(node: Node<'_>) -> Option<Node<'_>> {
    let mut inner = node.walk();
    let last = node.named_children(&mut inner).last()?;
    match last.kind() {
        "object" => Some(last),
        "if_statement" => body_object(last),
        _ => None,
    }
}

impl<'d> Scope<'d> {
    /// `source` with `values` for its parameters (defaults fill the others).
    pub(crate) fn new(source: &'d str, values: BTreeMap<String, Value>) -> Self {
        let tree = parse(source);
        let mut scope = Scope {
            source,
            tree,
            params: BTreeMap::new(),
            locals: RefCell::new(BTreeMap::new()),
        };
        let root = scope.tree.root_node();
        let mut params = values;
        for decl in declarations(root) {
            if decl.kind() == "parameter_declaration" {
                let name = identifier(decl, source).to_owned();
                if params.contains_key(&name) {
                    continue;
                }
                let mut cursor = decl.walk();
                let children: Vec<Node<'_>> = decl.children(&mut cursor).collect();
                let default = children
                    .iter()
                    .position(|c| c.kind() == "=")
                    .and_then(|i| children.get(i + 1).copied());
                let value =
                    default.map_or(Value::Unknown(format!("param {name}")), |d| scope.eval(d));
                params.insert(name, value);
            }
        }
        scope.params = params;
        scope
    }

    /// The entry file with the parameters file's values.
    pub(crate) fn main(deployment: &'d Deployment) -> Self {
        Self::main_with(deployment, BTreeMap::new())
    }

    /// As [`Scope::main`], with `overrides` replacing parameter values.
    pub(crate) fn main_with(
        deployment: &'d Deployment,
        overrides: BTreeMap<String, Value>,
    ) -> Self {
        let mut values: BTreeMap<String, Value> = deployment
            .parameter_values()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), Value::from_json(v)))
            .collect();
        values.extend(overrides);
        Scope::new(&deployment.bicep[Path::new("main.bicep")], values)
    }

    /// The scope of the module file `path` as this file calls it (the first call).
    pub(crate) fn module(&self, deployment: &'d Deployment, path: &str) -> Scope<'d> {
        let root = self.tree.root_node();
        for decl in declarations(root) {
            if decl.kind() != "module_declaration" {
                continue;
            }
            let mut cursor = decl.walk();
            let target = decl
                .named_children(&mut cursor)
                .find(|c| c.kind() == "string")
                .map(|n| unquote(text(n, self.source)));
            if target.as_deref() != Some(path) {
                continue;
            }
            let body = value_node(decl).map_or(Value::Null, |n| self.eval(n));
            let params = match body.get("params") {
                Some(Value::Object(map)) => map.clone(),
                _ => BTreeMap::new(),
            };
            return Scope::new(&deployment.bicep[Path::new(path)], params);
        }
        panic!("no module call to {path}");
    }

    pub(crate) fn param(&self, name: &str) -> &Value {
        &self.params[name]
    }

    /// The `@minValue`/`@maxValue` decorator argument of parameter `name`.
    pub(crate) fn decorator(&self, name: &str, decorator: &str) -> Option<i64> {
        let root = self.tree.root_node();
        let decls = declarations(root);
        let at = decls.iter().position(|d| {
            d.kind() == "parameter_declaration" && identifier(*d, self.source) == name
        })?;
        let previous = at.checked_sub(1).map(|i| decls[i])?;
        if previous.kind() != "decorators" {
            return None;
        }
        let prefix = format!("@{decorator}(");
        text(previous, self.source).lines().find_map(|line| {
            line.trim()
                .strip_prefix(&prefix)?
                .strip_suffix(')')?
                .trim()
                .parse()
                .ok()
        })
    }

    /// Every resource declaration of this file, evaluated; a `[for …]` declaration once per
    /// item of its collection (none for an empty one).
    pub(crate) fn resources(&self, file: &Path) -> Vec<Resource> {
        let root = self.tree.root_node();
        let mut out = Vec::new();
        for decl in declarations(root)
            .into_iter()
            .filter(|d| d.kind() == "resource_declaration")
        {
            let mut cursor = decl.walk();
            let kind = decl
                .named_children(&mut cursor)
                .find(|c| c.kind() == "string")
                .map(|n| unquote(text(n, self.source)))
                .unwrap_or_default();
            let kind = kind.split('@').next().unwrap_or_default().to_owned();
            let mut cursor = decl.walk();
            let existing = decl.children(&mut cursor).any(|c| c.kind() == "existing");
            let symbol = identifier(decl, self.source).to_owned();
            let each = |locals: BTreeMap<String, Value>| {
                *self.locals.borrow_mut() = locals;
                let resource = Resource {
                    file: file.to_path_buf(),
                    symbol: symbol.clone(),
                    kind: kind.clone(),
                    existing,
                    condition: self.condition(decl),
                    body: value_node(decl).map_or(Value::Null, |n| self.eval(n)),
                };
                self.locals.borrow_mut().clear();
                resource
            };
            match self.loop_items(decl) {
                Some(items) => out.extend(items.into_iter().map(each)),
                None => out.push(each(BTreeMap::new())),
            }
        }
        out
    }

    /// For `[for x in c: …]` / `[for (x, i) in c: …]`: the loop variables of each item of `c`.
    fn loop_items(&self, decl: Node<'_>) -> Option<Vec<BTreeMap<String, Value>>> {
        let mut cursor = decl.walk();
        let last = decl.named_children(&mut cursor).last()?;
        if last.kind() != "for_statement" {
            return None;
        }
        let mut cursor = last.walk();
        let parts: Vec<Node<'_>> = last.named_children(&mut cursor).collect();
        let variables = parts.first()?;
        let names: Vec<String> = if variables.kind() == "identifier" {
            vec![text(*variables, self.source).to_owned()]
        } else {
            // `(item, index)`: the grammar names the two loop_variable / loop_enumerator.
            let mut cursor = variables.walk();
            variables
                .named_children(&mut cursor)
                .map(|n| text(n, self.source).trim().to_owned())
                .collect()
        };
        let collection = self.eval(*parts.get(1)?);
        Some(
            collection
                .items()
                .iter()
                .enumerate()
                .map(|(i, item)| {
                    let mut locals = BTreeMap::new();
                    if let Some(name) = names.first() {
                        locals.insert(name.clone(), item.clone());
                    }
                    if let Some(index) = names.get(1) {
                        locals.insert(index.clone(), Value::Int(i64::try_from(i).unwrap_or(0)));
                    }
                    locals
                })
                .collect(),
        )
    }

    /// The value of output `name` of this file.
    pub(crate) fn output(&self, name: &str) -> Value {
        let root = self.tree.root_node();
        declarations(root)
            .into_iter()
            .find(|d| d.kind() == "output_declaration" && identifier(*d, self.source) == name)
            .and_then(|d| {
                let mut cursor = d.walk();
                d.named_children(&mut cursor).last()
            })
            .map_or_else(|| panic!("no output {name}"), |n| self.eval(n))
    }

    /// The resource named `symbol` in this file.
    pub(crate) fn resource(&self, symbol: &str) -> Value {
        self.resource_declared(symbol).body
    }

    /// The resource named `symbol` in this file, with its condition.
    pub(crate) fn resource_declared(&self, symbol: &str) -> Resource {
        self.resources(Path::new(""))
            .into_iter()
            .find(|r| r.symbol == symbol)
            .unwrap_or_else(|| panic!("no resource {symbol}"))
    }

    /// The value of a declaration's `if (…)`, `Bool(true)` without one.
    fn condition(&self, decl: Node<'_>) -> Value {
        let mut cursor = decl.walk();
        let Some(mut last) = decl.named_children(&mut cursor).last() else {
            return Value::Bool(true);
        };
        if last.kind() == "for_statement" {
            let mut inner = last.walk();
            match last.named_children(&mut inner).last() {
                Some(body) => last = body,
                None => return Value::Bool(true),
            }
        }
        if last.kind() != "if_statement" {
            return Value::Bool(true);
        }
        let mut inner = last.walk();
        last.named_children(&mut inner)
            .find(|c| c.kind() != "object")
            .map_or(Value::Bool(true), |c| self.eval(c))
    }

    /// The `dependsOn` symbols of module call `symbol`.
    pub(crate) fn module_depends_on(&self, symbol: &str) -> Vec<String> {
        let root = self.tree.root_node();
        for decl in declarations(root) {
            if decl.kind() == "module_declaration" && identifier(decl, self.source) == symbol {
                let Some(body) = value_node(decl) else {
                    return Vec::new();
                };
                let mut cursor = body.walk();
                for property in body.named_children(&mut cursor) {
                    if property.kind() == "object_property"
                        && property
                            .named_child(0)
                            .is_some_and(|k| text(k, self.source) == "dependsOn")
                    {
                        let list = property.named_child(1).unwrap();
                        let mut items = list.walk();
                        return list
                            .named_children(&mut items)
                            .map(|n| text(n, self.source).to_owned())
                            .collect();
                    }
                }
            }
        }
        Vec::new()
    }

    fn variable(&self, name: &str) -> Option<Value> {
        let root = self.tree.root_node();
        declarations(root)
            .into_iter()
            .find(|d| d.kind() == "variable_declaration" && identifier(*d, self.source) == name)
            .and_then(value_node)
            .map(|n| self.eval(n))
    }

    fn unknown(&self, node: Node<'_>) -> Value {
        Value::Unknown(
            text(node, self.source)
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" "),
        )
    }

    pub(crate) fn eval(&self, node: Node<'_>) -> Value {
        let src = self.source;
        match node.kind() {
            "number" => text(node, src).parse().map_or(Value::Null, Value::Int),
            "boolean" | "true" | "false" => Value::Bool(text(node, src) == "true"),
            "null" => Value::Null,
            "string" => self.string(node),
            "multiline_string" => Value::Str(
                text(node, src)
                    .trim_start_matches("'''")
                    .trim_end_matches("'''")
                    .to_owned(),
            ),
            "identifier" => {
                let name = text(node, src);
                if let Some(value) = self.locals.borrow().get(name) {
                    return value.clone();
                }
                if let Some(value) = self.params.get(name) {
                    return value.clone();
                }
                self.variable(name)
                    .unwrap_or_else(|| Value::Unknown(name.to_owned()))
            }
            "parenthesized_expression" => node.named_child(0).map_or(Value::Null, |n| self.eval(n)),
            "object" => {
                let mut map = BTreeMap::new();
                let mut cursor = node.walk();
                for property in node.named_children(&mut cursor) {
                    if property.kind() != "object_property" {
                        continue;
                    }
                    let (Some(key), Some(value)) = (
                        property.named_child(0),
                        property.named_child(property.named_child_count() - 1),
                    ) else {
                        continue;
                    };
                    map.insert(unquote(text(key, src)), self.eval(value));
                }
                Value::Object(map)
            }
            "array" => {
                let mut cursor = node.walk();
                Value::Array(
                    node.named_children(&mut cursor)
                        .filter(|n| n.kind() != "comment")
                        .map(|n| self.eval(n))
                        .collect(),
                )
            }
            "member_expression" => {
                let object = node.child_by_field_name("object").map(|n| self.eval(n));
                let property = node
                    .child_by_field_name("property")
                    .map(|n| text(n, src).to_owned());
                match (object, property) {
                    (Some(object @ Value::Object(_)), Some(p)) => object
                        .get(&p)
                        .cloned()
                        .unwrap_or_else(|| self.unknown(node)),
                    _ => self.unknown(node),
                }
            }
            "subscript_expression" => {
                let mut cursor = node.walk();
                let parts: Vec<Node<'_>> = node.named_children(&mut cursor).collect();
                match (
                    parts.first().map(|n| self.eval(*n)),
                    parts.get(1).map(|n| self.eval(*n)),
                ) {
                    (Some(Value::Array(items)), Some(Value::Int(i))) => usize::try_from(i)
                        .ok()
                        .and_then(|i| items.get(i).cloned())
                        .unwrap_or_else(|| self.unknown(node)),
                    // `o[k]`, and `o[?k]` (null when absent; `??` then gives the fallback).
                    (Some(Value::Object(map)), Some(Value::Str(k))) => match map.get(&k) {
                        Some(value) => value.clone(),
                        None if text(node, src).contains("[?") => Value::Null,
                        None => self.unknown(node),
                    },
                    _ => self.unknown(node),
                }
            }
            "unary_expression" => match node.named_child(0).map(|n| self.eval(n)) {
                Some(Value::Bool(b)) if text(node, src).trim_start().starts_with('!') => {
                    Value::Bool(!b)
                }
                Some(Value::Int(n)) if text(node, src).trim_start().starts_with('-') => {
                    Value::Int(-n)
                }
                _ => self.unknown(node),
            },
            "binary_expression" => self.binary(node),
            "ternary_expression" => {
                match node.child_by_field_name("condition").map(|n| self.eval(n)) {
                    Some(Value::Bool(true)) => node
                        .child_by_field_name("consequence")
                        .map_or(Value::Null, |n| self.eval(n)),
                    Some(Value::Bool(false)) => node
                        .child_by_field_name("alternative")
                        .map_or(Value::Null, |n| self.eval(n)),
                    _ => self.unknown(node),
                }
            }
            "call_expression" => self.call(node),
            _ => self.unknown(node),
        }
    }

    fn string(&self, node: Node<'_>) -> Value {
        let src = self.source;
        let mut out = String::new();
        let mut cursor = node.walk();
        for part in node.named_children(&mut cursor) {
            match part.kind() {
                "string_content" => out.push_str(text(part, src)),
                "escape_sequence" => out.push_str(match text(part, src) {
                    "\\'" => "'",
                    "\\\\" => "\\",
                    "\\n" => "\n",
                    "\\$" => "$",
                    other => other,
                }),
                "interpolation" => {
                    let value = part.named_child(0).map_or(Value::Null, |n| self.eval(n));
                    out.push_str(&value.interpolated());
                }
                _ => {}
            }
        }
        Value::Str(out)
    }

    fn binary(&self, node: Node<'_>) -> Value {
        let (Some(left), Some(right)) = (
            node.child_by_field_name("left"),
            node.child_by_field_name("right"),
        ) else {
            return self.unknown(node);
        };
        let operator = node
            .child_by_field_name("operator")
            .map(|o| text(o, self.source).to_owned())
            .unwrap_or_else(|| {
                let after = &self.source[left.end_byte()..right.start_byte()];
                after.trim().to_owned()
            });
        let (l, r) = (self.eval(left), self.eval(right));
        use Value::{Bool, Int, Str};
        match (operator.as_str(), &l, &r) {
            ("+", Int(a), Int(b)) => Int(a + b),
            ("-", Int(a), Int(b)) => Int(a - b),
            ("*", Int(a), Int(b)) => Int(a * b),
            ("/", Int(a), Int(b)) if *b != 0 => Int(a / b),
            ("%", Int(a), Int(b)) if *b != 0 => Int(a % b),
            ("<", Int(a), Int(b)) => Bool(a < b),
            ("<=", Int(a), Int(b)) => Bool(a <= b),
            (">", Int(a), Int(b)) => Bool(a > b),
            (">=", Int(a), Int(b)) => Bool(a >= b),
            ("&&", Bool(a), Bool(b)) => Bool(*a && *b),
            ("||", Bool(a), Bool(b)) => Bool(*a || *b),
            ("==", a, b) if !matches!(a, Value::Unknown(_)) && !matches!(b, Value::Unknown(_)) => {
                Bool(a == b)
            }
            ("!=", a, b) if !matches!(a, Value::Unknown(_)) && !matches!(b, Value::Unknown(_)) => {
                Bool(a != b)
            }
            ("??", Value::Null, b) => b.clone(),
            ("??", a, _) if !matches!(a, Value::Unknown(_)) => a.clone(),
            ("+", Str(a), Str(b)) => Str(format!("{a}{b}")),
            _ => self.unknown(node),
        }
    }

    fn call(&self, node: Node<'_>) -> Value {
        let src = self.source;
        let name = node
            .child_by_field_name("function")
            .map_or("", |n| text(n, src));
        let args: Vec<Value> = node
            .child_by_field_name("arguments")
            .map(|a| {
                let mut cursor = a.walk();
                a.named_children(&mut cursor)
                    .filter(|n| n.kind() != "comment")
                    .map(|n| self.eval(n))
                    .collect()
            })
            .unwrap_or_default();
        let str_arg = |i: usize| args.get(i).and_then(Value::as_str);
        let int_arg = |i: usize| args.get(i).and_then(Value::as_int);
        match name {
            "uniqueString" => Value::Str(UNIQUE_STRING.to_owned()),
            "guid" => Value::Str(GUID.to_owned()),
            "toLower" => {
                str_arg(0).map_or_else(|| self.unknown(node), |s| Value::Str(s.to_lowercase()))
            }
            "trim" => {
                str_arg(0).map_or_else(|| self.unknown(node), |s| Value::Str(s.trim().to_owned()))
            }
            "startsWith" => match (str_arg(0), str_arg(1)) {
                (Some(s), Some(prefix)) => {
                    Value::Bool(s.to_lowercase().starts_with(&prefix.to_lowercase()))
                }
                _ => self.unknown(node),
            },
            "toUpper" => {
                str_arg(0).map_or_else(|| self.unknown(node), |s| Value::Str(s.to_uppercase()))
            }
            "string" => match args.first() {
                Some(Value::Int(n)) => Value::Str(n.to_string()),
                Some(Value::Str(s)) => Value::Str(s.clone()),
                Some(Value::Bool(b)) => Value::Str(b.to_string()),
                _ => self.unknown(node),
            },
            "take" => match (args.first(), int_arg(1)) {
                (Some(Value::Str(s)), Some(n)) => {
                    Value::Str(s.chars().take(usize::try_from(n).unwrap_or(0)).collect())
                }
                _ => self.unknown(node),
            },
            "replace" => match (str_arg(0), str_arg(1), str_arg(2)) {
                (Some(s), Some(from), Some(to)) => Value::Str(s.replace(from, to)),
                _ => self.unknown(node),
            },
            "empty" => match args.first() {
                Some(Value::Str(s)) => Value::Bool(s.is_empty()),
                Some(Value::Array(a)) => Value::Bool(a.is_empty()),
                Some(Value::Object(o)) => Value::Bool(o.is_empty()),
                Some(Value::Null) => Value::Bool(true),
                _ => self.unknown(node),
            },
            "concat" if args.iter().all(|a| matches!(a, Value::Array(_))) => Value::Array(
                args.iter()
                    .flat_map(|a| a.items().iter().cloned())
                    .collect(),
            ),
            "union" if args.iter().all(|a| matches!(a, Value::Object(_))) => {
                let mut map = BTreeMap::new();
                for arg in &args {
                    if let Value::Object(o) = arg {
                        map.extend(o.clone());
                    }
                }
                Value::Object(map)
            }
            "split" => match (str_arg(0), str_arg(1)) {
                (Some(s), Some(separator)) => Value::Array(
                    s.split(separator)
                        .map(|part| Value::Str(part.to_owned()))
                        .collect(),
                ),
                _ => self.unknown(node),
            },
            "last" => match args.first() {
                Some(Value::Array(items)) => items.last().cloned().unwrap_or(Value::Null),
                Some(Value::Str(s)) => s
                    .chars()
                    .last()
                    .map_or(Value::Null, |c| Value::Str(c.to_string())),
                _ => self.unknown(node),
            },
            // The public cloud's values (AzureCloud).
            "environment" => Value::Object(BTreeMap::from([
                ("name".to_owned(), Value::Str("AzureCloud".to_owned())),
                (
                    "suffixes".to_owned(),
                    Value::Object(BTreeMap::from([
                        (
                            "acrLoginServer".to_owned(),
                            Value::Str(".azurecr.io".to_owned()),
                        ),
                        (
                            "sqlServerHostname".to_owned(),
                            Value::Str(".database.windows.net".to_owned()),
                        ),
                    ])),
                ),
            ])),
            // resourceId('NS/type/child', name, childName) in this resource group.
            "resourceId" if args.iter().all(|a| a.as_str().is_some()) && args.len() >= 2 => {
                let strings: Vec<&str> = args.iter().filter_map(Value::as_str).collect();
                let mut types = strings[0].split('/');
                let namespace = types.next().unwrap_or_default();
                let mut id = format!("{RESOURCE_GROUP_ID}/providers/{namespace}");
                for (kind, name) in types.zip(&strings[1..]) {
                    id.push_str(&format!("/{kind}/{name}"));
                }
                Value::Str(id)
            }
            // Stops the deployment with its message: kept as a value tests can look for.
            "fail" => Value::Failed(str_arg(0).unwrap_or_default().to_owned()),
            "min" if args.iter().all(|a| a.as_int().is_some()) => args
                .iter()
                .filter_map(Value::as_int)
                .min()
                .map_or(Value::Null, Value::Int),
            "max" if args.iter().all(|a| a.as_int().is_some()) => args
                .iter()
                .filter_map(Value::as_int)
                .max()
                .map_or(Value::Null, Value::Int),
            _ => self.unknown(node),
        }
    }
}
