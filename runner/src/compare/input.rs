//! One side of a comparison: the rows of one run of a CSV by key, and what reading it noticed (a
//! torn last row, duplicate keys) as warnings, so nothing is dropped or doubled silently.
use std::collections::BTreeMap;
use std::path::Path;

use anyhow::anyhow;

use crate::config::diag::display_path;
use crate::sink::csv::inspect;
use crate::sink::read::without_superseded;
use crate::sink::row::Row;

/// How many names a list in a message shows before "and N more".
pub const SHOWN: usize = 10;

/// A row's identity within one run: (job, sweep point, item id, repeat).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Key {
    /// Job name.
    pub job: String,
    /// Sweep point.
    pub point: String,
    /// Item id.
    pub item: String,
    /// Repeat index (0 without repeats).
    pub repeat: u32,
}

impl Key {
    /// The key of a row.
    pub fn of(r: &Row) -> Self {
        Self {
            job: r.job.clone(),
            point: r.point.clone(),
            item: r.item.clone(),
            repeat: r.repeat,
        }
    }

    /// `job/point/item`, `#n` added for repeat n > 0 (so runs without repeats keep the old key).
    pub fn full(&self) -> String {
        self.named(true, true)
    }

    /// The key without the parts every compared row shares (one job, one point): `mail-1`.
    pub fn named(&self, job: bool, point: bool) -> String {
        let mut parts: Vec<&str> = Vec::new();
        if job {
            parts.push(&self.job);
        }
        if point {
            parts.push(&self.point);
        }
        parts.push(&self.item);
        match self.repeat {
            0 => parts.join("/"),
            n => format!("{}#{n}", parts.join("/")),
        }
    }
}

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
        let key = Key::of(&r);
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
            "{file}: {} duplicate row{} in run {run} (a (job, point, item, repeat) key seen before), e.g. {}; the last of each is compared",
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
