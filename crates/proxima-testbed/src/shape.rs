//! The shape of a scenario file, checked before anything else with the line of every
//! problem: unknown keys (with the keys accepted there), and values of the wrong kind
//! (with the forms accepted there). Every problem is reported, one message each.
//!
//! The document is read into a tree that keeps each node's line (`serde-saphyr`'s
//! `Spanned`), so later checks can also say where a path such as
//! `events[2].do[0].join` is ([`Lines::of`]).

use std::collections::HashMap;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::Spanned;

/// A YAML node with the line of every child.
#[derive(Debug)]
enum Node {
    Scalar(String),
    Null,
    Seq(Vec<Spanned<Node>>),
    Map(Vec<(Spanned<Node>, Spanned<Node>)>),
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Node;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any YAML value")
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Node, E> {
                Ok(Node::Scalar(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Node, E> {
                Ok(Node::Scalar(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Node, E> {
                Ok(Node::Scalar(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Node, E> {
                Ok(Node::Scalar(v.to_string()))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Node, E> {
                Ok(Node::Scalar(v.to_string()))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Node, E> {
                Ok(Node::Null)
            }
            fn visit_none<E: de::Error>(self) -> Result<Node, E> {
                Ok(Node::Null)
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
                Node::deserialize(d)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(Node::Seq(items))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
                let mut entries = Vec::new();
                while let Some((k, v)) = map.next_entry()? {
                    entries.push((k, v));
                }
                Ok(Node::Map(entries))
            }
        }
        d.deserialize_any(V)
    }
}

/// What a value may look like.
#[derive(Debug)]
pub(crate) enum Shape {
    /// A single value (text, number, boolean).
    Scalar,
    /// A list of two single values.
    Pair,
    List(&'static Shape),
    /// A mapping with these keys (all optional here; required ones are checked later).
    Map(&'static [(&'static str, Shape)]),
    /// A mapping of any keys to single values.
    Settings,
    /// One of these forms.
    OneOf(&'static [Shape]),
}

impl Shape {
    fn describe(&self) -> String {
        match self {
            Shape::Scalar => "a single value".into(),
            Shape::Pair => "a list of two names, e.g. [edge-1, \"*\"]".into(),
            Shape::List(_) => "a list".into(),
            Shape::Map(keys) => format!(
                "a mapping with {}",
                keys.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(", ")
            ),
            Shape::Settings => "a mapping of keys to values".into(),
            Shape::OneOf(forms) => forms
                .iter()
                .map(Shape::describe)
                .collect::<Vec<_>>()
                .join(", or "),
        }
    }

    fn accepts(&self, node: &Node) -> bool {
        matches!(
            (self, node),
            (Shape::Scalar, Node::Scalar(_))
                | (Shape::Pair, Node::Seq(_))
                | (Shape::List(_), Node::Seq(_))
                | (Shape::Map(_), Node::Map(_))
                | (Shape::Settings, Node::Map(_))
        ) || matches!(self, Shape::OneOf(forms) if forms.iter().any(|f| f.accepts(node)))
    }
}

const DURATION: Shape = Shape::Scalar;
const USAGE: Shape = Shape::Map(&[("cpu", Shape::Scalar), ("ram", Shape::Scalar)]);
const NODE: Shape = Shape::Map(&[
    ("name", Shape::Scalar),
    ("zone", Shape::Scalar),
    ("region", Shape::Scalar),
    ("cores", Shape::Scalar),
    ("usage", USAGE),
]);
const LATENCY: Shape = Shape::Map(&[
    ("unit", Shape::Scalar),
    ("default", DURATION),
    ("local", DURATION),
    (
        "pairs",
        Shape::List(&Shape::Map(&[
            ("between", Shape::Pair),
            ("delay", DURATION),
        ])),
    ),
    (
        "matrix",
        Shape::Map(&[
            ("nodes", Shape::List(&Shape::Scalar)),
            ("rows", Shape::List(&Shape::List(&Shape::Scalar))),
        ]),
    ),
]);
const INSTANCE: Shape = Shape::Map(&[
    ("name", Shape::Scalar),
    ("node", Shape::Scalar),
    ("count", Shape::Scalar),
    ("processing", Shape::Scalar),
    ("workers", Shape::Scalar),
    ("start", Shape::Scalar),
]);
const SERVICE: Shape = Shape::Map(&[
    ("name", Shape::Scalar),
    ("namespace", Shape::Scalar),
    ("protocol", Shape::Scalar),
    ("settings", Shape::Settings),
    ("instances", Shape::List(&INSTANCE)),
]);
const CLIENT: Shape = Shape::Map(&[
    ("name", Shape::Scalar),
    ("node", Shape::Scalar),
    ("latency", DURATION),
    ("service", Shape::Scalar),
    ("requests", Shape::Scalar),
    ("duration", DURATION),
    ("concurrency", Shape::Scalar),
    ("rate", Shape::Scalar),
    ("method", Shape::Scalar),
    ("path", Shape::Scalar),
    ("body", Shape::Scalar),
    ("timeout", DURATION),
    ("protocol", Shape::Scalar),
]);
const BETWEEN: Shape = Shape::Map(&[("between", Shape::Pair)]);
const ACTION: Shape = Shape::Map(&[
    ("join", Shape::Scalar),
    ("leave", Shape::Scalar),
    (
        "fail",
        Shape::OneOf(&[
            Shape::Scalar,
            Shape::Map(&[("instance", Shape::Scalar), ("remove-after", DURATION)]),
        ]),
    ),
    (
        "overload",
        Shape::Map(&[
            ("instance", Shape::Scalar),
            ("add", DURATION),
            ("processing", Shape::Scalar),
        ]),
    ),
    (
        "errors",
        Shape::Map(&[("instance", Shape::Scalar), ("status", Shape::Scalar)]),
    ),
    (
        "reset",
        Shape::Map(&[("between", Shape::Pair), ("instance", Shape::Scalar)]),
    ),
    (
        "link",
        Shape::Map(&[
            ("between", Shape::Pair),
            ("add", DURATION),
            ("delay", DURATION),
        ]),
    ),
    ("blackhole", BETWEEN),
    (
        "node-down",
        Shape::OneOf(&[
            Shape::Scalar,
            Shape::Map(&[("node", Shape::Scalar), ("remove-after", DURATION)]),
        ]),
    ),
    ("node-up", Shape::Scalar),
    ("proxy-restart", Shape::Scalar),
    (
        "usage",
        Shape::Map(&[
            ("node", Shape::Scalar),
            ("cpu", Shape::Scalar),
            ("ram", Shape::Scalar),
        ]),
    ),
    (
        "busy-host",
        Shape::OneOf(&[Shape::Scalar, Shape::Map(&[("cores", Shape::Scalar)])]),
    ),
]);
const EVENT: Shape = Shape::Map(&[
    ("name", Shape::Scalar),
    ("at", Shape::Scalar),
    ("do", Shape::List(&ACTION)),
]);
const STRATEGY: Shape = Shape::OneOf(&[
    Shape::Scalar,
    Shape::Map(&[("label", Shape::Scalar), ("spec", Shape::Scalar)]),
]);
const TESTBED: Shape = Shape::Map(&[
    ("discovery-interval", DURATION),
    ("peer-probe-interval", DURATION),
    ("usage-interval", DURATION),
    ("usage-window", DURATION),
    ("warmup-timeout", DURATION),
    ("drain", DURATION),
    ("client-timeout", DURATION),
    ("peer-share-bytes", Shape::Scalar),
    ("peer-sample", Shape::Scalar),
    ("peer-coordinates", Shape::Scalar),
]);
/// The whole document.
pub(crate) const SCENARIO: Shape = Shape::Map(&[
    ("name", Shape::Scalar),
    ("description", Shape::Scalar),
    ("seed", Shape::Scalar),
    ("nodes", Shape::List(&NODE)),
    ("latency", LATENCY),
    ("services", Shape::List(&SERVICE)),
    ("clients", Shape::List(&CLIENT)),
    ("events", Shape::List(&EVENT)),
    ("strategies", Shape::List(&STRATEGY)),
    ("testbed", TESTBED),
    ("variants", Shape::List(&Shape::Settings)),
]);

/// Required keys, by the shape they belong to: checked here so that a missing one is
/// reported with its place like the rest.
fn required(shape: &Shape) -> &'static [&'static str] {
    let same = |s: &Shape| std::ptr::eq(shape, s);
    if same(&SCENARIO) {
        &["name", "nodes", "services", "clients"]
    } else if same(&NODE) || same(&SERVICE) {
        &["name"]
    } else if same(&INSTANCE) || same(&CLIENT) {
        &["node"]
    } else if same(&EVENT) {
        &["at", "do"]
    } else {
        &[]
    }
}

/// Lines of the document's paths (`events[2].do[0].join`), for placing messages.
#[derive(Debug, Default)]
pub struct Lines(HashMap<String, u64>);

impl Lines {
    /// The line of `path`, or of the nearest enclosing path that has one.
    pub fn of(&self, path: &str) -> Option<u64> {
        let mut p = path;
        loop {
            if let Some(line) = self.0.get(p) {
                return Some(*line);
            }
            let cut = p.rfind(['.', '['])?;
            p = &p[..cut];
        }
    }

    /// `message` (`path: what`) prefixed with the line of its path.
    pub fn place(&self, message: &str) -> String {
        let path = message.split(": ").next().unwrap_or("");
        match self.of(path) {
            Some(line) if !path.contains(' ') => format!("line {line}: {message}"),
            _ => message.to_string(),
        }
    }
}

/// Read `text` and check its shape against `SCENARIO`. `Err` holds every problem
/// (one for a syntax error); `Ok` the line of every path.
pub fn check(text: &str) -> Result<Lines, Vec<String>> {
    let root: Spanned<Node> = serde_saphyr::from_str(text).map_err(|e| {
        // The first line carries the message and its place; the rest is a snippet.
        let text = e.to_string();
        vec![text.lines().next().unwrap_or("not YAML").to_string()]
    })?;
    let mut lines = Lines::default();
    let mut problems = Vec::new();
    walk(&root, &SCENARIO, "", &mut lines, &mut problems);
    if problems.is_empty() {
        Ok(lines)
    } else {
        Err(problems)
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn walk(
    node: &Spanned<Node>,
    shape: &Shape,
    path: &str,
    lines: &mut Lines,
    problems: &mut Vec<String>,
) {
    let line = node.referenced.line();
    lines.0.insert(path.to_string(), line);
    let shown = if path.is_empty() {
        "the document"
    } else {
        path
    };
    if !shape.accepts(&node.value) {
        // A key given without a value (`usage:`) is taken as absent.
        if !matches!(node.value, Node::Null) || path.is_empty() {
            problems.push(format!(
                "line {line}: {shown}: expected {}",
                shape.describe()
            ));
        }
        return;
    }
    match (shape, &node.value) {
        (Shape::OneOf(forms), _) => {
            if let Some(form) = forms.iter().find(|f| f.accepts(&node.value)) {
                walk(node, form, path, lines, problems);
            }
        }
        (Shape::List(item), Node::Seq(items)) => {
            for (i, it) in items.iter().enumerate() {
                walk(it, item, &format!("{path}[{i}]"), lines, problems);
            }
        }
        (Shape::Pair, Node::Seq(items))
            if items.len() != 2 || items.iter().any(|i| !matches!(i.value, Node::Scalar(_))) =>
        {
            problems.push(format!(
                "line {line}: {shown}: expected {}",
                shape.describe()
            ));
        }
        (Shape::Settings, Node::Map(entries)) => {
            for (k, v) in entries {
                let key = key_text(k);
                let p = join(path, &key);
                lines.0.insert(p.clone(), k.referenced.line());
                if !matches!(v.value, Node::Scalar(_)) {
                    problems.push(format!(
                        "line {}: {p}: expected a single value",
                        v.referenced.line()
                    ));
                }
            }
        }
        (Shape::Map(keys), Node::Map(entries)) => {
            let mut seen = Vec::new();
            for (k, v) in entries {
                let key = key_text(k);
                let p = join(path, &key);
                let key_line = k.referenced.line();
                if seen.contains(&key) {
                    problems.push(format!("line {key_line}: {p}: given twice"));
                    continue;
                }
                seen.push(key.clone());
                match keys.iter().find(|(name, _)| *name == key) {
                    Some((_, inner)) => {
                        lines.0.insert(p.clone(), key_line);
                        walk(v, inner, &p, lines, problems);
                    }
                    None => problems.push(format!(
                        "line {key_line}: {p}: unknown key; accepted here: {}",
                        keys.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(", ")
                    )),
                }
            }
            for needed in required(shape) {
                let given = entries
                    .iter()
                    .any(|(k, v)| key_text(k) == *needed && !matches!(v.value, Node::Null));
                if !given {
                    problems.push(format!("line {line}: {}: `{needed}` is required", shown));
                }
            }
        }
        _ => {}
    }
}

fn key_text(k: &Spanned<Node>) -> String {
    match &k.value {
        Node::Scalar(s) => s.clone(),
        Node::Null => "~".to_string(),
        _ => "(a complex key)".to_string(),
    }
}
