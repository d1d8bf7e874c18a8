//! One side of a comparison: the rows of one run of a CSV by key, and what reading it noticed (a
//! torn last row, duplicate keys) as warnings, so nothing is dropped or doubled silently.
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::anyhow;

use crate::config::paths::display_path;
use crate::sink::csv::inspect;
use crate::sink::read::without_superseded;
use crate::sink::row::Row;

/// How many names a list in a message shows before "and N more".
pub const SHOWN: usize = 10;

/// A row's identity within one run: the one key type ([`crate::sink::key::RowKey`]) with the
/// run left out, so two runs' rows of one measurement pair up.
pub use crate::sink::key::RowKey as Key;

/// The rows of one run of one file.
#[derive(Debug, Default)]
pub struct Side {
    /// The run id taken.
    pub run: String,
    /// Its rows by key (of duplicates, the last in the file).
    pub rows: BTreeMap<Key, Row>,
    /// What reading noticed: a torn last row, duplicate keys.
    pub warnings: Vec<String>,
}

impl Side {
    /// The profiles the run's rows ran on.
    fn profiles(&self) -> BTreeSet<&str> {
        self.rows.keys().map(|k| k.profile.as_str()).collect()
    }

    /// The rows keyed without their profile.
    fn without_profile(self) -> Side {
        let rows = self.rows.into_iter();
        Side {
            rows: rows.map(|(k, r)| (k.without_profile(), r)).collect(),
            ..self
        }
    }
}

/// Two sides keyed alike: where each ran on one profile, rows pair up whatever the profiles'
/// names (a phone against another is a comparison people make; the profile is then among what
/// changed); where a side ran several, the profile stays in the key, so they do not collide.
pub fn pair_keys(a: Side, b: Side) -> (Side, Side) {
    if a.profiles().len() <= 1 && b.profiles().len() <= 1 {
        (a.without_profile(), b.without_profile())
    } else {
        (a, b)
    }
}

/// Reads one run of `path` (`run`, else the file's last run).
pub fn load(path: &Path, run: Option<&str>) -> anyhow::Result<Side> {
    let file = display_path(path);
    if !path.exists() {
        return Err(anyhow!("{file}: no such file"));
    }
    // Every error of the reader names the file already.
    let e = inspect(path)?;
    let mut warnings = Vec::new();
    if e.torn_bytes > 0 {
        // merge's wording: the same file reads the same in both commands.
        warnings.push(format!(
            "{file}: ignoring a torn last row ({} bytes without a newline)",
            e.torn_bytes
        ));
    }
    let run = match run {
        Some(r) => r.to_string(),
        None => e
            .rows
            .last()
            .map(|r| r.run_id.clone())
            .ok_or_else(|| anyhow!("{file}: no rows"))?,
    };
    let ids = run_ids(&e.rows);
    let mut rows = BTreeMap::new();
    let mut duplicates: Vec<Key> = Vec::new();
    // A failed row that `run --retry-errors` ran again is replaced by its retry, not a duplicate.
    for r in without_superseded(e.rows)
        .into_iter()
        .filter(|r| r.run_id == run)
    {
        let key = Key::of(&r).within_run();
        if rows.insert(key.clone(), r).is_some() {
            duplicates.push(key);
        }
    }
    if rows.is_empty() {
        return Err(anyhow!(
            "{file}: no rows of run {run}; it holds {}",
            list("run", "runs", &ids)
        ));
    }
    if let Some(k) = duplicates.first() {
        warnings.push(format!(
            "{file}: {} duplicate row{} in run {run} (a (job, profile, point, item, repeat) key seen before), e.g. {}; the last of each is compared",
            duplicates.len(),
            if duplicates.len() == 1 { "" } else { "s" },
            k.full()
        ));
    }
    Ok(Side {
        run,
        rows,
        warnings,
    })
}

/// The run ids of a file, in file order, each once.
fn run_ids(rows: &[Row]) -> Vec<String> {
    let mut ids: Vec<String> = Vec::new();
    for r in rows {
        if ids.last() != Some(&r.run_id) && !ids.contains(&r.run_id) {
            ids.push(r.run_id.clone());
        }
    }
    ids
}

/// `run a` / `runs a, b, c and 4 more`: names with their noun, capped at [`SHOWN`].
pub fn list(one: &str, many: &str, names: &[String]) -> String {
    let noun = if names.len() == 1 { one } else { many };
    format!("{noun} {}", capped(names))
}

/// `a, b, c and 4 more`, capped at [`SHOWN`] names.
pub fn capped(names: &[String]) -> String {
    let shown = names
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    match names.len().saturating_sub(SHOWN) {
        0 => shown,
        n => format!("{shown} and {n} more"),
    }
}
