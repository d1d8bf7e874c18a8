//! `bmoe merge A.csv B.csv ... -o ALL.csv`: the CSVs of a sharded run joined into one, checked
//! first (one schema version, one set of jobs, no conflicting duplicates) and written atomically,
//! so a refused merge leaves nothing behind.
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};
use serde::Serialize;

use crate::config::paths::display_path;
use crate::sink::csv::{inspect, HeaderKind};
use crate::sink::key::RowKey;
use crate::sink::lock::is_lock_file;
use crate::sink::output::{check_output, OutputKind};
use crate::sink::read::superseded;
use crate::sink::row::Row;

mod shards;

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
    /// Identical duplicates dropped (the same row, every cell alike, in two inputs or twice in one).
    pub duplicates: usize,
    /// Failed rows dropped because a later row of their key retried them (`run --retry-errors`).
    pub superseded: usize,
    /// Schema version of the inputs.
    pub schema_version: u32,
    /// Run ids in the output.
    pub runs: Vec<String>,
    /// Jobs in the output.
    pub jobs: Vec<String>,
    /// Shards (`K/N of run R`) with no rows that no input without rows could stand for; only
    /// non-empty when `--allow-partial` let the merge go on.
    pub missing_shards: Vec<String>,
}

/// How to merge.
#[derive(Debug, Clone, Default)]
pub struct MergeOptions {
    /// Replace an existing output.
    pub force: bool,
    /// `--expect-shards N`: the run had N shards, whatever the rows say.
    pub expect_shards: Option<u32>,
    /// Merge even when shards are missing.
    pub allow_partial: bool,
}

/// One input CSV with a header.
struct Input {
    path: PathBuf,
    version: u32,
    jobs: BTreeSet<String>,
    rows: Vec<Row>,
}

/// Merges `inputs` into `output`.
pub fn merge(
    inputs: &[PathBuf],
    output: &Path,
    opts: &MergeOptions,
) -> anyhow::Result<MergeReport> {
    check_paths(inputs, output, opts.force)?;
    let read = read_inputs(inputs)?;
    let Some(first) = read.first() else {
        bail!("merge: every input is empty; nothing to merge");
    };
    if let Some(f) = read.iter().find(|i| i.version != first.version) {
        bail!(
            "merge: {} is schema {} but {} is schema {}: merge CSVs written by one bmoe build",
            display_path(&first.path),
            first.version,
            display_path(&f.path),
            f.version
        );
    }
    check_jobs(&read)?;
    let gap = shards::missing(&read_shards(&read)?, opts.expect_shards)?;
    if let Some(g) = &gap {
        if !opts.allow_partial {
            bail!("merge: {}; give every shard's CSV (a shard that drew no item writes a header-only one), or add --allow-partial", g.message);
        }
        eprintln!(
            "warning: merge: {}; merging what is there (--allow-partial)",
            g.message
        );
    }
    let mut rep = MergeReport {
        output: display_path(output),
        inputs: inputs.len(),
        schema_version: first.version,
        missing_shards: gap.map(|g| g.shards).unwrap_or_default(),
        ..MergeReport::default()
    };
    let out = join_rows(read, &mut rep)?;
    rep.rows_out = out.len();
    rep.runs = distinct(out.keys().map(|k| &k.run_id));
    rep.jobs = distinct(out.keys().map(|k| &k.job));
    write_atomic(output, out.values().map(|(_, r)| r))?;
    Ok(rep)
}

fn distinct<'a>(it: impl Iterator<Item = &'a String>) -> Vec<String> {
    it.cloned().collect::<BTreeSet<_>>().into_iter().collect()
}

/// Refuses an output that is also an input, or that exists without `force`.
fn check_paths(inputs: &[PathBuf], output: &Path, force: bool) -> anyhow::Result<()> {
    if inputs.is_empty() {
        bail!("merge: no input CSVs");
    }
    check_output(output, inputs, OutputKind::Csv, "-o", force).context("merge")
}

/// Every input with a header (a file without one is skipped, said on stderr); a newer build's
/// file is refused.
fn read_inputs(inputs: &[PathBuf]) -> anyhow::Result<Vec<Input>> {
    let mut read = Vec::new();
    for i in inputs {
        if !i.exists() {
            bail!("merge: {}: no such file", display_path(i));
        }
        if is_lock_file(i) {
            // A `shard-*` glob took an older build's `shard-0.csv.lock`: it holds no rows.
            eprintln!(
                "warning: merge: skipping {}: a lock file (bmoe run keeps one beside a CSV while it writes), not a CSV",
                display_path(i)
            );
            continue;
        }
        // Every error of the reader names the file already.
        let e = inspect(i).context("merge")?;
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
        let Some(version) = e.schema_version() else {
            eprintln!("bmoe: {}: empty (no header); skipped", display_path(i));
            continue;
        };
        read.push(Input {
            path: i.clone(),
            version,
            jobs: e.rows.iter().map(|r| r.job.clone()).collect(),
            rows: e.rows,
        });
    }
    Ok(read)
}

/// Shards of one run hold the same jobs; a file with no rows (a shard that drew no items) has
/// none and agrees with anything.
fn check_jobs(read: &[Input]) -> anyhow::Result<()> {
    let mut with_rows = read.iter().filter(|i| !i.jobs.is_empty());
    let Some(a) = with_rows.next() else {
        return Ok(());
    };
    if let Some(b) = with_rows.find(|i| i.jobs != a.jobs) {
        let list = |j: &BTreeSet<String>| j.iter().cloned().collect::<Vec<_>>().join(", ");
        bail!(
            "merge: {} holds job(s) {} but {} holds job(s) {}: merge the shards of one job run",
            display_path(&a.path),
            list(&a.jobs),
            display_path(&b.path),
            list(&b.jobs)
        );
    }
    Ok(())
}

/// The `shard` labels of each input's rows, parsed; a label that is not `K/N` is refused.
fn read_shards(read: &[Input]) -> anyhow::Result<Vec<shards::Labels>> {
    read.iter()
        .map(|i| {
            let mut labels = shards::Labels {
                file: display_path(&i.path),
                ..shards::Labels::default()
            };
            for r in i.rows.iter().filter(|r| !r.shard.is_empty()) {
                let (k, n) = shards::parse(&r.shard).ok_or_else(|| {
                    anyhow!(
                        "merge: {}: row of item {} has shard {:?}; expected K/N (K 0-based, below N)",
                        display_path(&i.path),
                        r.item,
                        r.shard
                    )
                })?;
                labels.shards.insert((r.run_id.clone(), k, n));
            }
            Ok(labels)
        })
        .collect()
}

/// Rows keyed by [`RowKey`]: identical duplicates (every cell alike) dropped and counted, rows of
/// one key that differ in any cell refused (the first five named): two measurements of one key
/// cannot both be kept, and neither can be chosen.
fn join_rows(
    read: Vec<Input>,
    rep: &mut MergeReport,
) -> anyhow::Result<BTreeMap<RowKey, (PathBuf, Row)>> {
    let mut out: BTreeMap<RowKey, (PathBuf, Row)> = BTreeMap::new();
    let mut conflicts: Vec<String> = Vec::new();
    // A failed row that `run --retry-errors` ran again gives way to its retry (in any input).
    let all = read.iter().flat_map(|i| i.rows.iter());
    let gone = superseded(all.map(|r| (RowKey::of(r), !r.error.is_empty())));
    let mut at = 0;
    for Input {
        path: file, rows, ..
    } in read
    {
        for r in rows {
            rep.rows_in += 1;
            at += 1;
            if gone.contains(&(at - 1)) {
                rep.superseded += 1;
                continue;
            }
            let key = RowKey::of(&r);
            match out.get(&key) {
                None => {
                    out.insert(key, (file.clone(), r));
                }
                Some((_, r0)) if r0.same_cells(&r) => rep.duplicates += 1,
                Some((f0, r0)) => conflicts.push(format!(
                    "{key}: {} and {} differ ({})",
                    display_path(f0),
                    display_path(&file),
                    r0.difference(&r)
                )),
            }
        }
    }
    if !conflicts.is_empty() {
        let n = conflicts.len();
        conflicts.truncate(5);
        bail!(
            "merge: {n} conflicting duplicate row(s), nothing written:\n  {}{}\nhelp: rows of one key that differ are two measurements of it (a shard run twice, a file edited); neither can be chosen for you: merge one file of each shard",
            conflicts.join("\n  "),
            if n > 5 { "\n  ..." } else { "" }
        );
    }
    Ok(out)
}

/// Header and rows into a temporary file beside `path`, fsynced, then renamed over it. The file
/// is created 0666 less the umask, as any other file the user writes (a temporary file's own
/// 0600 would hide the merge from a dashboard or a colleague on shared storage).
fn write_atomic<'a>(path: &Path, rows: impl Iterator<Item = &'a Row>) -> anyhow::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", display_path(dir)))?;
    let mut tmp = crate::sink::temp_builder()
        .tempfile_in(dir)
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
