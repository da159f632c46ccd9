//! Label selectors, for opting Services in by label (`--k8s-selector proxima=on`).
//!
//! The equality- and existence-based forms of Kubernetes' label-selector syntax, joined by
//! commas (all must hold): `key=value`, `key==value`, `key!=value`, `key`, `!key`.
//! Set-based forms (`key in (a,b)`) are not supported and are rejected when parsed, so a
//! typo never silently selects nothing.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// A parsed label selector; the empty selector matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    Exists(String),
    NotExists(String),
}

/// Why a selector could not be parsed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid label selector {selector:?}: {reason} (expected comma-separated key=value, key!=value, key or !key)")]
pub struct SelectorError {
    /// The selector as given.
    pub selector: String,
    /// What is wrong with it.
    pub reason: String,
}

impl LabelSelector {
    /// Whether `labels` satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| match r {
            Requirement::Equals(k, v) => labels.get(k) == Some(v),
            Requirement::NotEquals(k, v) => labels.get(k) != Some(v),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::NotExists(k) => !labels.contains_key(k),
        })
    }
}

impl FromStr for LabelSelector {
    type Err = SelectorError;

    fn from_str(selector: &str) -> Result<Self, Self::Err> {
        let error = |reason: &str| SelectorError {
            selector: selector.to_string(),
            reason: reason.to_string(),
        };
        let mut requirements = Vec::new();
        for term in selector.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            if term.contains('(') || term.contains(' ') {
                return Err(error("set-based requirements are not supported"));
            }
            let requirement = if let Some((k, v)) = term.split_once("!=") {
                Requirement::NotEquals(valid_key(k, &error)?, valid_value(v, &error)?)
            } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                Requirement::Equals(valid_key(k, &error)?, valid_value(v, &error)?)
            } else if let Some(k) = term.strip_prefix('!') {
                Requirement::NotExists(valid_key(k, &error)?)
            } else {
                Requirement::Exists(valid_key(term, &error)?)
            };
            requirements.push(requirement);
        }
        Ok(Self { requirements })
    }
}

fn valid_key(key: &str, error: &dyn Fn(&str) -> SelectorError) -> Result<String, SelectorError> {
    let ok = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    ok.then(|| key.to_string())
        .ok_or_else(|| error(&format!("bad key {key:?}")))
}

fn valid_value(
    value: &str,
    error: &dyn Fn(&str) -> SelectorError,
) -> Result<String, SelectorError> {
    let ok = value
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    ok.then(|| value.to_string())
        .ok_or_else(|| error(&format!("bad value {value:?}")))
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let terms: Vec<String> = self
            .requirements
            .iter()
            .map(|r| match r {
                Requirement::Equals(k, v) => format!("{k}={v}"),
                Requirement::NotEquals(k, v) => format!("{k}!={v}"),
                Requirement::Exists(k) => k.clone(),
                Requirement::NotExists(k) => format!("!{k}"),
            })
            .collect();
        f.write_str(&terms.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn equality_and_existence() {
        let s: LabelSelector = "proxima=on, tier!=batch,app.kubernetes.io/name,!legacy"
            .parse()
            .unwrap();
        assert!(s.matches(&labels(&[
            ("proxima", "on"),
            ("app.kubernetes.io/name", "web")
        ])));
        assert!(!s.matches(&labels(&[
            ("proxima", "off"),
            ("app.kubernetes.io/name", "web")
        ])));
        assert!(!s.matches(&labels(&[
            ("proxima", "on"),
            ("app.kubernetes.io/name", "web"),
            ("tier", "batch")
        ])));
        assert!(!s.matches(&labels(&[("proxima", "on")])));
        assert!(!s.matches(&labels(&[
            ("proxima", "on"),
            ("app.kubernetes.io/name", "web"),
            ("legacy", "")
        ])));
        assert_eq!(
            s.to_string(),
            "proxima=on,tier!=batch,app.kubernetes.io/name,!legacy"
        );
    }

    #[test]
    fn double_equals_and_empty() {
        let s: LabelSelector = "a==b".parse().unwrap();
        assert!(s.matches(&labels(&[("a", "b")])));
        let empty: LabelSelector = "".parse().unwrap();
        assert!(empty.matches(&labels(&[])));
    }

    #[test]
    fn rejects_set_based_and_garbage() {
        assert!("env in (a,b)".parse::<LabelSelector>().is_err());
        assert!("=x".parse::<LabelSelector>().is_err());
        assert!("a=b c".parse::<LabelSelector>().is_err());
        let e = "a=$".parse::<LabelSelector>().unwrap_err();
        assert!(e.to_string().contains("key=value"), "{e}");
    }
}
