//! "What changed" between two runs: the provenance (commit, build, model, host) and resolved
//! settings every row carries, compared as the set of values each run holds, so a sweep that
//! varies `cache_mb` within both runs is no change, and `n_expert_used 2 -> 1` is one.
use std::collections::BTreeSet;

use serde::Serialize;

use crate::config::declare::settings_values;
use crate::sink::row::{Row, RECORDED_SETTINGS, SETTINGS_COLUMN};

/// The provenance columns compared, before the settings ([`RECORDED_SETTINGS`]).
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

/// The names compared, provenance first, then the settings as resolved and as configured
/// (`settings.<key>`), then the outcome columns.
fn columns() -> impl Iterator<Item = &'static str> {
    let settings = RECORDED_SETTINGS.iter().map(String::as_str);
    PROVENANCE
        .iter()
        .copied()
        .chain(settings)
        .chain(OUTCOME.iter().copied())
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
    let all: Vec<Change> = names
        .iter()
        .zip(ta.into_iter().zip(tb))
        .filter(|(_, (x, y))| x != y)
        .map(|(c, (x, y))| Change {
            column: c.to_string(),
            a: x.into_iter().collect(),
            b: y.into_iter().collect(),
        })
        .collect();
    // A setting whose resolved column already changed (`cache_mb`) is said once.
    let said = |c: &Change| {
        let key = c.column.strip_prefix(SETTINGS_PREFIX.as_str());
        key.is_some_and(|k| all.iter().any(|o| o.column == k))
    };
    all.iter().filter(|c| !said(c)).cloned().collect()
}

/// `settings.`: the prefix of a name read from the `settings` cell.
static SETTINGS_PREFIX: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| format!("{SETTINGS_COLUMN}."));

/// Per compared column (in [`columns`] order, then prefix_reuse), the distinct values of the rows.
fn table<'a>(rows: impl Iterator<Item = &'a Row>) -> Vec<BTreeSet<String>> {
    let n = columns().count();
    let mut t = vec![BTreeSet::new(); n + 1];
    for r in rows {
        // By column name through serde: the names are the CSV's, so this list reads like the
        // CSV header and cannot drift from the fields.
        let v = serde_json::to_value(r).unwrap_or_default();
        let configured = settings_values(&r.settings);
        for (i, c) in columns().enumerate() {
            let value = match c.strip_prefix(SETTINGS_PREFIX.as_str()) {
                Some(key) => configured.get(key).cloned().unwrap_or_default(),
                None => cell(&v[c]),
            };
            t[i].insert(value);
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
        for c in columns().filter(|c| !c.starts_with(SETTINGS_PREFIX.as_str())) {
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

    /// A lossy knob has no column of its own: it is read from the `settings` cell.
    #[test]
    fn a_changed_lossy_knob_is_named() {
        use crate::config::declare::settings_cell;
        use crate::config::settings::Settings;
        let row = |drop_cold: f64| Row {
            settings: settings_cell(&Settings {
                drop_cold,
                ..Settings::default()
            }),
            ..Row::default()
        };
        let c = changes([row(0.0)].iter(), [row(0.5)].iter());
        let shown: Vec<String> = c.iter().map(Change::render).collect();
        assert_eq!(shown, ["settings.drop_cold 0.0 -> 0.5"]);
    }
}
