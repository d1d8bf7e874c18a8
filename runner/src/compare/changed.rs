//! "What changed" between two runs: the provenance (commit, build, model, host) and resolved
//! settings every row carries, compared as the set of values each run holds, so a sweep that
//! varies `cache_mb` within both runs is no change, and `n_expert_used 2 -> 1` is one.
use std::collections::BTreeSet;

use serde::Serialize;

use crate::sink::row::{Row, SETTING_COLUMNS};

/// The provenance columns compared, before the settings ([`SETTING_COLUMNS`]).
const PROVENANCE: &[&str] = &[
    "git_commit",
    "build",
    "llama_cpp",
    "model",
    "model_sha256",
    "model_hash",
    "model_bytes",
    "arch",
    "host",
    "cpu_model",
    "cpu_cores",
    "profile",
    "profile_hash",
];

/// What a run did beside its settings: the device that ran prefill and how the model loaded.
const OUTCOME: &[&str] = &["prefill_device", "load_mode"];

/// The columns compared, provenance first, then the settings as resolved.
fn columns() -> impl Iterator<Item = &'static str> {
    PROVENANCE
        .iter()
        .chain(SETTING_COLUMNS)
        .chain(OUTCOME)
        .copied()
}

/// The name of the one setting not stored as a column: read from `reuse_reason` (`off` when
/// prefix reuse was off) of decide rows.
const PREFIX_REUSE: &str = "prefix_reuse";

/// One column whose values differ between the runs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Change {
    /// The column (or `prefix_reuse`).
    pub column: String,
    /// The distinct values in A, sorted; "" where the row left it empty.
    pub a: Vec<String>,
    /// The distinct values in B.
    pub b: Vec<String>,
}

impl Change {
    /// `n_expert_used 2 -> 1`.
    pub fn render(&self) -> String {
        format!("{} {} -> {}", self.column, values(&self.a), values(&self.b))
    }
}

/// `2`, `512, 1024`, `(empty)`: a side's values for a message.
fn values(v: &[String]) -> String {
    let shown: Vec<&str> = v
        .iter()
        .map(|s| if s.is_empty() { "(empty)" } else { s.as_str() })
        .collect();
    match shown.len() {
        0 => "(no rows)".into(),
        _ => shown.join(", "),
    }
}

/// The columns whose set of values differs between the rows of A and of B.
pub fn changes<'a>(
    a: impl Iterator<Item = &'a Row>,
    b: impl Iterator<Item = &'a Row>,
) -> Vec<Change> {
    let (ta, tb) = (table(a), table(b));
    let mut names: Vec<&str> = columns().collect();
    names.push(PREFIX_REUSE);
    names
        .iter()
        .zip(ta.into_iter().zip(tb))
        .filter(|(_, (x, y))| x != y)
        .map(|(c, (x, y))| Change {
            column: c.to_string(),
            a: x.into_iter().collect(),
            b: y.into_iter().collect(),
        })
        .collect()
}

/// Per compared column (in [`columns`] order, then prefix_reuse), the distinct values of the rows.
fn table<'a>(rows: impl Iterator<Item = &'a Row>) -> Vec<BTreeSet<String>> {
    let n = columns().count();
    let mut t = vec![BTreeSet::new(); n + 1];
    for r in rows {
        // By column name through serde: the names are the CSV's, so this list reads like the
        // CSV header and cannot drift from the fields.
        let v = serde_json::to_value(r).unwrap_or_default();
        for (i, c) in columns().enumerate() {
            t[i].insert(cell(&v[c]));
        }
        if r.kind == "decide" && !r.reuse.is_empty() {
            let on = if r.reuse_reason == "off" { "off" } else { "on" };
            t[n].insert(on.to_string());
        }
    }
    t
}

/// A JSON value as its CSV cell: strings bare, null empty.
fn cell(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::Null => String::new(),
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every compared name is a CSV column: a renamed field would silently compare nothing.
    #[test]
    fn columns_exist() {
        let cols = Row::columns();
        for c in columns() {
            assert!(cols.iter().any(|x| x == c), "{c} is not a column");
        }
    }

    #[test]
    fn a_changed_top_k_is_named_and_a_shared_sweep_is_not() {
        let row = |k: u32, cache: u64| Row {
            n_expert_used: k,
            cache_mb: cache,
            ..Row::default()
        };
        let a = [row(2, 512), row(2, 1024)];
        let b = [row(1, 512), row(1, 1024)];
        let c = changes(a.iter(), b.iter());
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!(c[0].render(), "n_expert_used 2 -> 1");
    }
}
