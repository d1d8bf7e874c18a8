//! What a run continues from: its run id, the keys it already wrote, the models' hashes.
use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};
use sha2::{Digest, Sha256};

use super::RunOptions;
use crate::config::paths::display_path;
use crate::ident::{self};
use crate::run::prepare::Prepared;
use crate::run::select::Shard;
use crate::sink::csv::{resolve, Target};
use crate::sink::key::RowKey;
use crate::sink::row::Row;

/// The default run id ([`ident::default_run_id`]): named for the job, or `run` for several.
pub(super) fn run_id_default(prep: &Prepared, shard: Option<Shard>) -> String {
    let name = match prep.jobs.as_slice() {
        [one] => one.job.name.as_str(),
        _ => "run",
    };
    ident::default_run_id(name, shard.is_some(), chrono::Utc::now())
}

/// Where each CSV's rows go, the run id, the keys the run already has, and
/// under `--retry-errors` the only keys to run (those whose latest row failed); reads each CSV
/// once and refuses a newer or foreign header before anything is written.
pub(super) type State = (
    String,
    HashSet<RowKey>,
    HashMap<PathBuf, Target>,
    Option<HashSet<RowKey>>,
);

pub(super) fn existing_state(prep: &Prepared, opts: &RunOptions) -> anyhow::Result<State> {
    let mut rows_by_csv: HashMap<PathBuf, Vec<Row>> = HashMap::new();
    let mut targets: HashMap<PathBuf, Target> = HashMap::new();
    for j in &prep.jobs {
        if !rows_by_csv.contains_key(&j.csv) {
            let (t, rows) = resolve(&j.csv)?;
            rows_by_csv.insert(j.csv.clone(), rows);
            targets.insert(j.csv.clone(), t);
        }
    }
    let run_id = match (&opts.run_id, opts.resume || opts.retry_errors) {
        (Some(id), _) => id.clone(),
        (None, false) => run_id_default(prep, opts.filter.shard),
        (None, true) => {
            // The latest run of the first job, in its CSV.
            let j = &prep.jobs[0];
            rows_by_csv
                .get(&j.csv)
                .and_then(|rows| rows.iter().rev().find(|r| r.job == j.job.name))
                .map(|r| r.run_id.clone())
                .ok_or_else(|| {
                    let (flag, what) = if opts.retry_errors {
                        ("--retry-errors", "retry")
                    } else {
                        ("--resume", "resume")
                    };
                    anyhow!(
                        "{flag}: {} has no rows of job {} to {what}; run without {flag}",
                        display_path(&j.csv),
                        j.job.name
                    )
                })?
        }
    };
    if run_id.is_empty() || run_id.contains(['\n', '\r', ',']) {
        bail!("run id {run_id:?} must be non-empty and hold no commas or newlines");
    }
    // Each key's latest row decides: a retry that failed again is retried again.
    let mut latest: HashMap<RowKey, bool> = HashMap::new();
    for rows in rows_by_csv.values() {
        for r in rows.iter().filter(|r| r.run_id == run_id) {
            latest.insert(RowKey::of(r), !r.error.is_empty());
        }
    }
    let continues = opts.resume || opts.retry_errors;
    if !(continues || latest.is_empty()) {
        bail!("run id {run_id} already has rows; add --resume to continue it, or choose another --run-id");
    }
    let retry = opts.retry_errors.then(|| {
        let failed = latest.iter().filter(|(_, &f)| f);
        failed.map(|(k, _)| k.clone()).collect::<HashSet<RowKey>>()
    });
    if retry.as_ref().is_some_and(|r| r.is_empty()) {
        // Not an error: `run || run --retry-errors` in CI must pass on a good night.
        eprintln!("bmoe: --retry-errors: run {run_id} has no row whose latest outcome is an error; nothing to retry");
    }
    let done = latest
        .into_iter()
        .filter(|(_, f)| !f)
        .map(|(k, _)| k)
        .collect();
    Ok((run_id, done, targets, retry))
}

/// SHA-256 of the GGUF header (everything before the first tensor's data), 16 hex digits.
pub fn model_hash(path: &Path, data_start: u64) -> anyhow::Result<String> {
    // Bounded so a header we misjudge cannot make us hash gigabytes.
    let n = data_start.clamp(1, 64 << 20);
    let mut f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut buf = Vec::with_capacity(n as usize);
    f.by_ref().take(n).read_to_end(&mut buf)?;
    let digest = Sha256::digest(&buf);
    Ok(digest.iter().take(8).map(|b| format!("{b:02x}")).collect())
}
