//! `bmoe merge A.csv B.csv ... -o ALL.csv`: the CSVs of a sharded run joined into one, checked
//! first (one schema version, one set of jobs, no conflicting duplicates) and written atomically,
//! so a refused merge leaves nothing behind.
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};
use serde::Serialize;

use crate::config::diag::display_path;
use crate::sink::csv::{inspect, HeaderKind};
use crate::sink::row::Row;

/// What a merge did.
#[derive(Debug, Default, Serialize)]
pub struct MergeReport {
    /// The output file.
    pub output: String,
    /// Input files read.
    pub inputs: usize,
    /// Rows read from all inputs.
    pub rows_in: usize,
    /// Rows written.
    pub rows_out: usize,
    /// Identical duplicates dropped (the same row in two inputs, or twice in one).
    pub duplicates: usize,
    /// Schema version of the inputs.
    pub schema_version: u32,
    /// Run ids in the output.
    pub runs: Vec<String>,
    /// Jobs in the output.
    pub jobs: Vec<String>,
}

/// (run, job, point, item): a row's identity.
type Key = (String, String, String, String);

/// Merges `inputs` into `output` (refused when it exists, unless `force`).
pub fn merge(inputs: &[PathBuf], output: &Path, force: bool) -> anyhow::Result<MergeReport> {
    if inputs.is_empty() {
        bail!("merge: no input CSVs");
    }
    for i in inputs {
        if same_file(i, output) {
            bail!(
                "merge: the output {} is also an input; write to another file",
                display_path(output)
            );
        }
    }
    if output.exists() && !force {
        bail!(
            "merge: {} exists; choose another -o, or add --force to replace it",
            display_path(output)
        );
    }
    // (file, version, jobs, rows) of every input with a header.
    let mut read: Vec<(PathBuf, u32, BTreeSet<String>, Vec<Row>)> = Vec::new();
    for i in inputs {
        if !i.exists() {
            bail!("merge: {}: no such file", display_path(i));
        }
        let e = inspect(i).with_context(|| format!("merge: reading {}", display_path(i)))?;
        if e.kind == Some(HeaderKind::Newer) {
            bail!(
                "merge: {} was written by a newer bmoe (schema {}); merge with that build",
                display_path(i),
                e.schema_version().unwrap_or(0)
            );
        }
        if e.torn_bytes > 0 {
            eprintln!(
                "bmoe: {}: ignoring a torn last row ({} bytes without a newline)",
                display_path(i),
                e.torn_bytes
            );
        }
        let Some(v) = e.schema_version() else {
            eprintln!("bmoe: {}: empty (no header); skipped", display_path(i));
            continue;
        };
        let jobs: BTreeSet<String> = e.rows.iter().map(|r| r.job.clone()).collect();
        read.push((i.clone(), v, jobs, e.rows));
    }
    let Some((first, v0, _, _)) = read.first() else {
        bail!("merge: every input is empty; nothing to merge");
    };
    if let Some((f, v, _, _)) = read.iter().find(|(_, v, _, _)| v != v0) {
        bail!(
            "merge: {} is schema {v0} but {} is schema {v}: merge CSVs written by one bmoe build",
            display_path(first),
            display_path(f)
        );
    }
    // Shards of one run hold the same jobs; a file with no rows (a shard that drew no items) has
    // none and agrees with anything.
    let with_rows: Vec<_> = read.iter().filter(|(_, _, j, _)| !j.is_empty()).collect();
    if let Some((fa, _, ja, _)) = with_rows.first() {
        if let Some((fb, _, jb, _)) = with_rows.iter().find(|(_, _, j, _)| j != ja) {
            bail!(
                "merge: {} holds job(s) {} but {} holds job(s) {}: merge the shards of one job run",
                display_path(fa),
                ja.iter().cloned().collect::<Vec<_>>().join(", "),
                display_path(fb),
                jb.iter().cloned().collect::<Vec<_>>().join(", ")
            );
        }
    }
    let mut rep = MergeReport {
        output: display_path(output),
        inputs: inputs.len(),
        schema_version: *v0,
        ..MergeReport::default()
    };
    let mut out: BTreeMap<Key, (PathBuf, Row)> = BTreeMap::new();
    let mut conflicts: Vec<String> = Vec::new();
    for (file, _, _, rows) in read {
        for r in rows {
            rep.rows_in += 1;
            let key = (
                r.run_id.clone(),
                r.job.clone(),
                r.point.clone(),
                r.item.clone(),
            );
            match out.get(&key) {
                None => {
                    out.insert(key, (file.clone(), r));
                }
                Some((f0, r0)) => {
                    if r0.same_outcome(&r) {
                        rep.duplicates += 1;
                    } else {
                        conflicts.push(format!(
                            "run {} job {} point {} item {}: {} and {} differ ({})",
                            key.0,
                            key.1,
                            key.2,
                            key.3,
                            display_path(f0),
                            display_path(&file),
                            r0.outcome_difference(&r)
                        ));
                    }
                }
            }
        }
    }
    if !conflicts.is_empty() {
        let n = conflicts.len();
        conflicts.truncate(5);
        return Err(anyhow!(
            "merge: {n} conflicting duplicate row(s), nothing written:\n  {}{}",
            conflicts.join("\n  "),
            if n > 5 { "\n  ..." } else { "" }
        ));
    }
    rep.rows_out = out.len();
    rep.runs = out
        .keys()
        .map(|k| k.0.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    rep.jobs = out
        .keys()
        .map(|k| k.1.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    write_atomic(output, out.values().map(|(_, r)| r))?;
    Ok(rep)
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}

/// Header and rows into a temporary file beside `path`, fsynced, then renamed over it.
fn write_atomic<'a>(path: &Path, rows: impl Iterator<Item = &'a Row>) -> anyhow::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", display_path(dir)))?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("creating a file in {}", display_path(dir)))?;
    let w = |e: std::io::Error| anyhow!("writing {}: {e}", display_path(path));
    tmp.write_all(Row::header_line().as_bytes()).map_err(w)?;
    for r in rows {
        tmp.write_all(&r.to_line()?).map_err(w)?;
    }
    tmp.as_file().sync_all().map_err(w)?;
    tmp.persist(path)
        .map_err(|e| anyhow!("writing {}: {}", display_path(path), e.error))?;
    Ok(())
}
