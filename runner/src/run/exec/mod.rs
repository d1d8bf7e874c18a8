//! `bmoe run`: one engine session per (job, profile point), one record and one CSV row per item,
//! resumable by run id, stoppable between rows. The run's steps, each in its file: what a resumed
//! run already has (`resume.rs`), what every unit shares (`context.rs`), the model kept between
//! units (`models.rs`), the storage's rate before a point loads (`disk_probe.rs`), one unit's
//! items run (`unit.rs`), a row filled (`row.rs`), the totals
//! (`summary.rs`); a limited point in a child process inside its memory cgroup (`isolated.rs`,
//! the child's side in `child.rs`, what they say to each other in `wire.rs`).
mod child;
mod context;
mod disk_probe;
mod isolated;
mod models;
mod resume;
mod row;
mod summary;
mod unit;
mod wire;

pub use child::run_child;
pub use isolated::{check_limits, limit_mib};
pub use resume::model_hash;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
pub use summary::{Summary, Written};
pub use wire::CHILD_ARG;

use anyhow::Context;

use crate::config::item::Item;
use crate::config::job::LoadedJob;
use crate::config::paths::display_path;
use crate::ident::{self, Machine};
use crate::run::prepare::{Prepared, Unit};
use crate::run::progress::Progress;
use crate::run::select::Filter;
use crate::run::signals::Stop;
use crate::sink::csv::CsvSink;
use crate::sink::key::RowKey;
use crate::sink::lock::CsvLocks;
use context::{Ctx, Out};
use models::{within, Models};
use resume::{existing_state, State};
use summary::finish_totals;
use unit::run_unit;

/// How to run.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Explicit run id.
    pub run_id: Option<String>,
    /// Continue a run: skip the items it already wrote.
    pub resume: bool,
    /// Run again only the items whose latest row in the run carries an error (implies `resume`).
    pub retry_errors: bool,
    /// Print each row as a JSON line on stdout.
    pub machine: bool,
    /// No progress bars or progress lines.
    pub quiet: bool,
    /// Which items to take (shard, glob, limit).
    pub filter: Filter,
    /// Load each model once in a child process before the first load here (the probe).
    pub probe: bool,
    /// Probe verdicts already known (model -> the probe's error, `None` when it passed).
    pub probed: HashMap<PathBuf, Option<String>>,
    /// Where limited points' memory cgroups are made ([`check_limits`]); `None` without one.
    pub cgroups: Option<crate::run::cgroup::Hierarchy>,
    /// This `bmoe run`'s arguments, which a limited point's child prepares the run from.
    pub child_args: Vec<std::ffi::OsString>,
}

/// Runs every unit; returns what was done (an interrupted run is `Ok` with `interrupted`).
pub fn execute(prep: &Prepared, opts: &RunOptions, stop: &Stop) -> anyhow::Result<Summary> {
    let machine_id = Machine::detect();
    // Held until this function returns (the kernel drops them if the process dies first).
    let (_locks, (run_id, done, targets, retry)) = lock_and_read(prep, opts, &machine_id.host)?;
    let summary = Summary {
        run_id: run_id.clone(),
        shard: opts.filter.shard.map(|s| s.label()),
        ..Summary::default()
    };
    // Hashed before the bars start, so the hash's own bar does not fight them for the terminal.
    let model_sha = hash_models(prep, opts.quiet)?;
    let mut out = Out {
        summary,
        progress: Progress::new(prep.units.len() as u64, opts.quiet),
        sinks: HashMap::new(),
        written: HashMap::new(),
        machine: opts.machine,
        to_parent: false,
    };
    let ctx = Ctx {
        prep,
        opts,
        stop,
        run_id,
        done,
        retry,
        targets,
        machine_id,
        model_sha,
        build: context::build_label(),
        rss: ident::RssPeaks::start(),
    };
    let mut models = Models {
        held: None,
        probed: opts.probed.clone(),
    };
    for unit in &prep.units {
        match limit_mib(unit) {
            Some(limit) => isolated::run_isolated(&ctx, &mut out, &mut models, unit, limit)?,
            None => run_unit(&ctx, &mut out, &mut models, unit)?,
        }
        if out.summary.interrupted {
            break;
        }
    }
    out.progress.finish();
    finish_totals(&mut out.summary);
    out.summary.written = written_list(&ctx, &out.sinks, out.written)?;
    Ok(out.summary)
}

/// Locks every CSV before it is read, so what a resume skips cannot change under it, then reads
/// the run's state and locks the files the rows will go to.
fn lock_and_read(
    prep: &Prepared,
    opts: &RunOptions,
    host: &str,
) -> anyhow::Result<(CsvLocks, State)> {
    let mut locks = CsvLocks::default();
    for j in &prep.jobs {
        locks.take(&j.csv, host)?;
    }
    let state = existing_state(prep, opts)?;
    for t in state.2.values() {
        locks.take(&t.write, host)?;
    }
    for t in state.2.values() {
        if let Some(n) = &t.note {
            eprintln!("{n}");
        }
    }
    Ok((locks, state))
}

/// Each job's model, hashed once (the `model_sha256` column), within the model's load time limit:
/// a hash that the storage leaves hanging is abandoned on its thread with a `bmoe:` line, and that
/// model's rows carry no hash (nor does it get a prefix cache, whose key needs the hash).
fn hash_models(prep: &Prepared, quiet: bool) -> anyhow::Result<HashMap<PathBuf, String>> {
    let mut model_sha: HashMap<PathBuf, String> = HashMap::new();
    for j in &prep.jobs {
        if model_sha.contains_key(&j.model) {
            continue;
        }
        let limit = prep.load_timeout(&j.model);
        let path = j.model.clone();
        let hashed = within(limit, "bmoe-hash", move || {
            ident::model_sha256(&path, quiet)
        })
        .context("starting the hash thread")?;
        let sha = match hashed {
            Some(r) => r?,
            None => {
                eprintln!(
                    "bmoe: hashing {} did not finish within {} s (load_timeout_s); abandoned: its rows carry no model_sha256 and it gets no prefix cache",
                    display_path(&j.model),
                    limit.as_secs()
                );
                String::new()
            }
        };
        model_sha.insert(j.model.clone(), sha);
    }
    Ok(model_sha)
}

/// What a started unit works with: its job, the CSV it writes, the items it still has to run.
type Started<'a> = (&'a LoadedJob, PathBuf, Vec<(&'a Item, u32)>);

/// A unit's start, in-process or in a child alike, with its progress bar started; `None` when it
/// has nothing to run or the run is stopping (then `summary.interrupted` is set).
fn start_unit<'a>(ctx: &Ctx<'a>, out: &mut Out, unit: &Unit) -> Option<Started<'a>> {
    let lj = &ctx.prep.jobs[unit.job];
    let write_to = ctx.write_to(&lj.csv);
    let pending = pending_items(ctx, lj, unit, &mut out.summary);
    if pending.is_empty() {
        out.progress.end_unit();
        return None;
    }
    if ctx.stop.requested() {
        out.summary.interrupted = true;
        return None;
    }
    let label = format!("{} on {} [{}]", lj.job.name, unit.profile.name, unit.point);
    out.progress.start_unit(&label, pending.len() as u64);
    Some((lj, write_to, pending))
}

/// The (item, repeat) pairs a unit still has to run, counting the ones the run already has as
/// skipped.
fn pending_items<'j>(
    ctx: &Ctx,
    lj: &'j LoadedJob,
    unit: &Unit,
    summary: &mut Summary,
) -> Vec<(&'j Item, u32)> {
    let chosen: HashSet<&str> = ctx
        .opts
        .filter
        .apply_keyed(lj.items.iter().map(|it| (it.id.as_str(), it.shard_key())))
        .into_iter()
        .collect();
    let taken: Vec<_> = lj
        .items
        .iter()
        .filter(|it| chosen.contains(it.id.as_str()))
        .collect();
    // Repeat-major: the whole list once, then again, so a repeat never follows its own item
    // (which would find the prompt already in the KV cache and the experts already read).
    let mut pending = Vec::new();
    for r in 0..lj.job.repeat.max(1) {
        for &it in &taken {
            let key = RowKey {
                run_id: ctx.run_id.clone(),
                job: lj.job.name.clone(),
                profile: unit.profile.name.clone(),
                point: unit.point.clone(),
                item: it.id.clone(),
                repeat: r,
            };
            let not_retried = ctx.retry.as_ref().is_some_and(|r| !r.contains(&key));
            if ctx.done.contains(&key) || not_retried {
                summary.skipped += 1;
            } else {
                pending.push((it, r));
            }
        }
    }
    pending
}

/// Rows written per CSV. Names every CSV a job points at, even one that got no new rows (all
/// skipped, or a shard that drew no item); a CSV that does not exist yet gets its header, so
/// "0 rows appended to" names a file and `shard-*.csv` finds an empty shard.
fn written_list(
    ctx: &Ctx,
    sinks: &HashMap<PathBuf, CsvSink>,
    written: HashMap<PathBuf, u64>,
) -> anyhow::Result<Vec<Written>> {
    let mut w: Vec<(PathBuf, u64)> = written.into_iter().collect();
    w.sort();
    for j in &ctx.prep.jobs {
        let to = ctx.write_to(&j.csv);
        if !w.iter().any(|(p, _)| p == &to) {
            if !sinks.contains_key(&to) && !to.exists() {
                CsvSink::open(&to)?;
            }
            w.push((to, 0));
        }
    }
    Ok(w.into_iter()
        .map(|(p, rows)| Written {
            csv: display_path(&p),
            rows,
        })
        .collect())
}
