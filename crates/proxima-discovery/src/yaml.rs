//! YAML as the project reads it (topology files, the demo's topology, the testbed's
//! scenarios): with serde-saphyr, whose errors carry their line and column, and
//! serde_path_to_error, which adds the path of the value (`services[0].ports[0].port`).

use std::fmt;

use serde::Deserialize;
use serde_path_to_error::Segment;
use serde_saphyr::MessageFormatter;

/// A path into a document: `services[0].settings.timeout`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Path(String);

impl Path {
    /// The path of the value at `key` of this mapping.
    pub fn key(&self, key: &str) -> Self {
        match self.0.as_str() {
            "" => Self(key.to_string()),
            path => Self(format!("{path}.{key}")),
        }
    }

    /// The path of the element at `index` of this sequence.
    pub fn index(&self, index: usize) -> Self {
        Self(format!("{}[{index}]", self.0))
    }

    /// serde_path_to_error sees a `Spanned` value as a mapping with the key `value` (not
    /// the file's: a user's key `value`, in `labels`, is left out too), and a key not
    /// read yet (a key written twice) as `?`.
    fn of_error(path: &serde_path_to_error::Path) -> Self {
        path.iter()
            .fold(Self::default(), |path, segment| match segment {
                Segment::Seq { index } => path.index(*index),
                Segment::Map { key } | Segment::Enum { variant: key } if key != "value" => {
                    path.key(key)
                }
                _ => path,
            })
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<Path> for String {
    fn from(path: Path) -> String {
        path.0
    }
}

/// Why a document could not be read: shown as `line 4: services[0].ports[0].port:
/// invalid value "http": expected u16 (column 15)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// Path of the offending value; empty for the document itself.
    pub path: Path,
    /// What is wrong, with the column when it is not the first.
    pub message: String,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(line) = self.line {
            write!(f, "line {line}: ")?;
        }
        if !self.path.0.is_empty() {
            write!(f, "{}: ", self.path)?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

/// Booleans are `true` and `false` only, as in YAML 1.2 and as serde_yaml read them, so
/// `off` or `yes` in a setting or a label stays text (serde-saphyr's default takes YAML
/// 1.1's `yes`, `no`, `on`, `off`, `y` and `n` for booleans). A key written twice in a
/// mapping is an error (serde-saphyr's default).
///
/// A topology file may be large: serde-saphyr's default budget (250,000 nodes, a
/// million events) refuses one of 5,000 Services of 10 pods (about 260,000 nodes),
/// which an edge cluster's proxy must read (issue 29). The budget allows 16 times
/// that, about 1.6 million endpoints of one line each; its limits on aliases and
/// anchors, which are what stops a small file from expanding without bound, stay
/// serde-saphyr's.
pub fn options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        strict_booleans: true,
        budget: serde_saphyr::budget! {
            max_nodes: MAX_NODES,
            max_events: MAX_NODES * 4,
        },
    }
}

/// The most YAML nodes (sequences, mappings and scalars) a document may hold (see
/// [`options`]).
pub const MAX_NODES: usize = 4_000_000;

/// Read one YAML document into `T`.
pub fn from_str<'de, T: Deserialize<'de>>(text: &'de str) -> Result<T, Error> {
    let mut path = Path::default();
    serde_saphyr::with_deserializer_from_str_with_options(text, options(), |d| {
        serde_path_to_error::deserialize(d).map_err(|e| {
            path = Path::of_error(e.path());
            e.into_inner()
        })
    })
    .map_err(|e| {
        let (line, message) = line_and_message(text, &e);
        Error {
            line,
            path,
            message,
        }
    })
}

/// The line of an error and its message without the place, plus the column when it is
/// not the first.
fn line_and_message(text: &str, e: &serde_saphyr::Error) -> (Option<usize>, String) {
    let location = e.location();
    let span = location.and_then(|l| {
        let start = usize::try_from(l.span().byte_offset()?).ok()?;
        Some(start..start + usize::try_from(l.span().byte_len()?).ok()?)
    });
    let mut message = match e.without_snippet() {
        // serde-saphyr 2.0 says only `invalid u16`: name the value, as serde_yaml did.
        serde_saphyr::Error::InvalidScalar { ty, .. } => {
            let value = span.clone().and_then(|s| text.get(s)).unwrap_or_default();
            format!("invalid value {value:?}: expected {ty}")
        }
        e => serde_saphyr::UserMessageFormatter
            .format_message(e)
            .into_owned(),
    };
    let Some(location) = location else {
        return (None, message);
    };
    let (mut line, mut column) = (location.line(), location.column());
    // A tab that ends a plain scalar is reported at the scalar's start (granit-parser
    // 2.1): show the tab's own place, where it is to be removed.
    if message.contains("found a tab") {
        let start = span.map_or(0, |s| s.start);
        if let Some(tab) = text.get(start..).and_then(|rest| rest.find('\t')) {
            let before = &text[..start + tab];
            line = before.matches('\n').count() as u64 + 1;
            column = before.chars().rev().take_while(|&c| c != '\n').count() as u64 + 1;
        }
    }
    if column > 1 {
        message.push_str(&format!(" (column {column})"));
    }
    (usize::try_from(line).ok(), message)
}
