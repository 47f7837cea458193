//! What the checks need from a Bicep file, read from the tree-sitter-bicep syntax tree: parse
//! errors, parameters (and whether they are required), module calls and outputs.

use tree_sitter::{Node, Parser};

/// One `param` declaration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Param {
    pub(crate) name: String,
    /// No default value and not a nullable type: a caller must supply it.
    pub(crate) required: bool,
    /// The default when it is an integer literal (for the retention check).
    pub(crate) int_default: Option<i64>,
}

/// One `module NAME 'PATH' = { params: { … } }` call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ModuleCall {
    pub(crate) symbol: String,
    pub(crate) path: String,
    /// The keys of `params`, or `None` when `params` is not an object literal.
    pub(crate) params: Option<Vec<String>>,
    pub(crate) line: usize,
}

/// A `module.outputs.name` reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OutputRef {
    pub(crate) symbol: String,
    pub(crate) output: String,
    pub(crate) line: usize,
}

/// The declarations of one file.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct BicepFile {
    pub(crate) params: Vec<Param>,
    pub(crate) modules: Vec<ModuleCall>,
    pub(crate) outputs: Vec<String>,
    /// Every `symbol.outputs.name` in the file (module outputs used).
    pub(crate) output_refs: Vec<OutputRef>,
}

impl BicepFile {
    pub(crate) fn param(&self, name: &str) -> Option<&Param> {
        self.params.iter().find(|p| p.name == name)
    }
}

/// Parses `source`; returns every ERROR or MISSING node (as `line:column: …`) as an error.
pub(crate) fn parse(source: &str) -> Result<BicepFile, Vec<String>> {
    let mut parser = Parser::new();
    parser
        .set_language(&tree_sitter_bicep::LANGUAGE.into())
        .expect("the Bicep grammar matches the tree-sitter version");
    let tree = parser
        .parse(source, None)
        .expect("parsing without a timeout or cancellation returns a tree");
    let root = tree.root_node();
    let src = source.as_bytes();

    let mut problems = Vec::new();
    collect_errors(root, src, &mut problems);
    if !problems.is_empty() {
        return Err(problems);
    }

    let mut file = BicepFile::default();
    let mut cursor = root.walk();
    for statement in root.named_children(&mut cursor) {
        // `declaration` is a supertype in the grammar; accept it wrapped or not.
        let decl = if statement.kind() == "declaration" {
            match statement.named_child(0) {
                Some(inner) => inner,
                None => continue,
            }
        } else {
            statement
        };
        match decl.kind() {
            "parameter_declaration" => file.params.push(param(decl, src)),
            "module_declaration" => file.modules.push(module(decl, src)),
            "output_declaration" => {
                if let Some(name) = first_named(decl, "identifier") {
                    file.outputs.push(text(name, src));
                }
            }
            _ => {}
        }
    }
    collect_output_refs(root, src, &mut file.output_refs);
    Ok(file)
}

fn collect_output_refs(node: Node<'_>, src: &[u8], out: &mut Vec<OutputRef>) {
    if node.kind() == "member_expression" {
        let text = text(node, src);
        let parts: Vec<&str> = text.split('.').map(str::trim).collect();
        if let [symbol, "outputs", output] = parts.as_slice() {
            out.push(OutputRef {
                symbol: (*symbol).to_owned(),
                output: (*output).to_owned(),
                line: node.start_position().row + 1,
            });
            return;
        }
    }
    let mut cursor = node.walk();
    for child in node.named_children(&mut cursor) {
        collect_output_refs(child, src, out);
    }
}

fn collect_errors(node: Node<'_>, src: &[u8], out: &mut Vec<String>) {
    if node.is_error() || node.is_missing() {
        let at = node.start_position();
        let what = if node.is_missing() {
            format!("missing {}", node.kind())
        } else {
            let snippet: String = text(node, src).chars().take(40).collect();
            format!("syntax error near `{snippet}`")
        };
        out.push(format!("{}:{}: {what}", at.row + 1, at.column + 1));
        return;
    }
    if !node.has_error() {
        return;
    }
    let mut cursor = node.walk();
    for child in node.children(&mut cursor) {
        collect_errors(child, src, out);
    }
}

fn param(decl: Node<'_>, src: &[u8]) -> Param {
    let name = first_named(decl, "identifier").map_or_else(String::new, |n| text(n, src));
    let mut cursor = decl.walk();
    let children: Vec<Node<'_>> = decl.children(&mut cursor).collect();
    let eq = children.iter().position(|c| c.kind() == "=");
    let default = eq.and_then(|i| children.get(i + 1).copied());
    let nullable = children.iter().any(|c| {
        c.kind() == "nullable_type" || (c.kind() == "type" && text(*c, src).ends_with('?'))
    });
    let int_default = default.and_then(|d| text(d, src).trim().parse::<i64>().ok());
    Param {
        name,
        required: default.is_none() && !nullable,
        int_default,
    }
}

fn module(decl: Node<'_>, src: &[u8]) -> ModuleCall {
    let symbol = first_named(decl, "identifier").map_or_else(String::new, |n| text(n, src));
    let path = first_named(decl, "string").map_or_else(String::new, |n| unquote(&text(n, src)));
    let body = find_object(decl);
    let params = body
        .and_then(|object| property(object, "params", src))
        .and_then(|value| {
            (value.kind() == "object").then(|| {
                let mut cursor = value.walk();
                value
                    .named_children(&mut cursor)
                    .filter(|p| p.kind() == "object_property")
                    .filter_map(|p| p.named_child(0).map(|key| unquote(&text(key, src))))
                    .collect()
            })
        });
    ModuleCall {
        symbol,
        path,
        params,
        line: decl.start_position().row + 1,
    }
}

/// The module body: the object itself, or the object inside `if (…) {…}` / `[for … : {…}]`.
fn find_object(decl: Node<'_>) -> Option<Node<'_>> {
    let mut cursor = decl.walk();
    let last = decl.named_children(&mut cursor).last()?;
    if last.kind() == "object" {
        return Some(last);
    }
    let mut inner = last.walk();
    last.named_children(&mut inner)
        .filter(|c| c.kind() == "object")
        .last()
}

/// The value of `key` in an object literal.
fn property<'t>(object: Node<'t>, key: &str, src: &[u8]) -> Option<Node<'t>> {
    let mut cursor = object.walk();
    object
        .named_children(&mut cursor)
        .filter(|p| p.kind() == "object_property")
        .find(|p| {
            p.named_child(0)
                .is_some_and(|k| unquote(&text(k, src)) == key)
        })
        .and_then(|p| p.named_child(p.named_child_count().saturating_sub(1)))
}

fn first_named<'t>(node: Node<'t>, kind: &str) -> Option<Node<'t>> {
    let mut cursor = node.walk();
    node.named_children(&mut cursor).find(|c| c.kind() == kind)
}

fn text(node: Node<'_>, src: &[u8]) -> String {
    node.utf8_text(src).unwrap_or_default().to_owned()
}

fn unquote(s: &str) -> String {
    s.trim().trim_matches('\'').to_owned()
}
