//! `bmoe run`: one engine session per (job, profile point), one record and one CSV row per item,
//! resumable by run id, stoppable between rows.
use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use anyhow::{anyhow, bail, Context};
use bmoe_engine::{EngineError, GenerateOptions, Model, Sampling, Session};
use sha2::{Digest, Sha256};

use super::machine;
use super::prepare::{Prepared, Unit};
use super::progress::Progress;
use super::select::{Filter, Shard};
use super::signals::Stop;
use crate::config::diag::display_path;
use crate::config::item::{Decision, Item, Kind, Payload};
use crate::config::job::LoadedJob;
use crate::ident::{self, Machine};
use crate::sink::csv::{resolve, CsvSink, Target};
use crate::sink::key::RowKey;
use crate::sink::lock::CsvLocks;
use crate::sink::row::{escape_text, ChoiceLogp, Row, SCHEMA_VERSION};

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
}

/// Rows written to one CSV.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Written {
    /// The file, as the user would name it.
    pub csv: String,
    /// Rows appended.
    pub rows: u64,
}

/// What a run did.
#[derive(Debug, Default, Serialize)]
pub struct Summary {
    /// The run id.
    pub run_id: String,
    /// This process's shard (`K/N`), when sharded.
    pub shard: Option<String>,
    /// Rows written, per CSV.
    pub written: Vec<Written>,
    /// Items skipped because the run already had them.
    pub skipped: u64,
    /// Rows whose item the engine refused.
    pub failed: u64,
    /// Stopped by Ctrl-C.
    pub interrupted: bool,
    /// Decide rows that succeeded.
    pub decisions: u64,
    /// Of those, the ones whose decision carries an expected answer.
    pub with_expected: u64,
    /// Of those, the ones whose best choice is the expected one.
    pub correct: u64,
    /// `correct / with_expected`; `None` when no decision carries an expected answer.
    pub accuracy: Option<f64>,
    /// Sum of prefill seconds.
    pub prefill_s: f64,
    /// Sum of prefilled tokens (without the prefix tokens decisions reused).
    pub prefill_tokens: u64,
    /// generate: tokens decoded, over the rows without an error.
    pub decode_tokens: u64,
    /// generate: seconds spent decoding them.
    pub decode_s: f64,
    /// perplexity: tokens scored, over the rows without an error.
    pub ppl_tokens: u64,
    /// perplexity: the sum of their negative log-likelihoods (nats).
    pub nll_sum: f64,
    /// perplexity: the sum of their squares.
    pub nll_sq_sum: f64,
    /// perplexity: the standard error of `ppl` (`ppl` times the mean NLL's standard error, as
    /// llama-perplexity prints `+/-`).
    pub ppl_stderr: Option<f64>,
    /// perplexity: exp(nll_sum / ppl_tokens), as llama-perplexity pools a whole text; `None`
    /// when nothing was scored.
    pub ppl: Option<f64>,
}

impl Summary {
    /// Counts what a row of any kind measured: decode tokens and time, scored tokens and NLL.
    fn add_outcome(&mut self, row: &Row) {
        if !row.error.is_empty() {
            return;
        }
        if row.tokens > 0 {
            self.decode_tokens += u64::from(row.tokens);
            self.decode_s += row.decode_s;
        }
        if let (Some(n), Some(nll)) = (row.n_scored, row.nll_mean) {
            let n_f = f64::from(n);
            self.ppl_tokens += u64::from(n);
            self.nll_sum += nll * n_f;
            // The sum of squares back from the row's mean and standard error (its variance is
            // stderr^2 (n - 1)), so texts pool as one would.
            let se = row.nll_stderr.unwrap_or(0.0);
            self.nll_sq_sum += n_f * (se * se * (n_f - 1.0).max(0.0) + nll * nll);
        }
    }
}

/// The default run id ([`ident::default_run_id`]): named for the job, or `run` for several.
fn run_id_default(prep: &Prepared, shard: Option<Shard>) -> String {
    let name = match prep.jobs.as_slice() {
        [one] => one.job.name.as_str(),
        _ => "run",
    };
    ident::default_run_id(name, shard.is_some(), chrono::Utc::now())
}

/// Where each CSV's rows go, the run id, the keys the run already has, and
/// under `--retry-errors` the only keys to run (those whose latest row failed); reads each CSV
/// once and refuses a newer or foreign header before anything is written.
type State = (
    String,
    HashSet<RowKey>,
    HashMap<PathBuf, Target>,
    Option<HashSet<RowKey>>,
);

fn existing_state(prep: &Prepared, opts: &RunOptions) -> anyhow::Result<State> {
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

/// What every unit of a run shares, fixed before the first unit.
struct Ctx<'a> {
    prep: &'a Prepared,
    opts: &'a RunOptions,
    stop: &'a Stop,
    run_id: String,
    /// The keys the run already has.
    done: HashSet<RowKey>,
    /// Under `--retry-errors`, the only keys to run.
    retry: Option<HashSet<RowKey>>,
    targets: HashMap<PathBuf, Target>,
    machine_id: Machine,
    model_sha: HashMap<PathBuf, String>,
    build: String,
    rss: ident::RssPeaks,
}

impl Ctx<'_> {
    /// The file a CSV's rows are written to (a rotated CSV's next file, or the CSV itself).
    fn write_to(&self, csv: &Path) -> PathBuf {
        self.targets
            .get(csv)
            .map(|t| t.write.clone())
            .unwrap_or_else(|| csv.to_path_buf())
    }
}

/// What a run writes and counts as it goes.
struct Out {
    summary: Summary,
    progress: Progress,
    sinks: HashMap<PathBuf, CsvSink>,
    written: HashMap<PathBuf, u64>,
    /// Each row also goes to stdout as a JSON line.
    machine: bool,
}

impl Out {
    /// Writes one row to its CSV, and to stdout when the run is machine-read.
    fn emit(&mut self, csv: &Path, row: &Row) -> anyhow::Result<()> {
        append_row(&mut self.sinks, &mut self.written, csv, row)?;
        if self.machine {
            machine::emit(row)?;
        }
        Ok(())
    }
}

/// The model kept between units, and the probe's verdicts per model.
struct Models {
    /// The model of the last unit, kept while the next units load it with the same options
    /// (sweep points and profiles that differ only in session settings): one load per model.
    held: Option<(bmoe_engine::LoadOptions, Model)>,
    /// Model -> the probe's error, `None` when it passed.
    probed: HashMap<PathBuf, Option<String>>,
}

/// How a unit's model came to be (or not): the load's outcome, its seconds, and whether the held
/// model was reused.
struct LoadOutcome {
    result: Result<(), String>,
    load_s: f64,
    reused: bool,
}

impl Models {
    /// The probe's verdict on `model` (run once per model, before its first load here; kept for
    /// the model's other units); `None` when it passed or is not asked for.
    fn probe_error(
        &mut self,
        opts: &RunOptions,
        model: &Path,
        limit: std::time::Duration,
    ) -> anyhow::Result<Option<String>> {
        if !opts.probe {
            return Ok(None);
        }
        if !self.probed.contains_key(model) {
            let r = crate::probe::probe(model, limit)?;
            self.probed
                .insert(model.to_path_buf(), r.error().map(str::to_string));
        }
        Ok(self.probed.get(model).cloned().flatten())
    }

    /// Keeps the held model when it was loaded with `load_opts` (and may be used); otherwise
    /// releases it, since the previous model goes before the next one loads: two need not fit
    /// together. True when it is kept.
    fn release_unless(&mut self, load_opts: &bmoe_engine::LoadOptions, usable: bool) -> bool {
        let keep = usable && self.held.as_ref().is_some_and(|(o, _)| o == load_opts);
        if !keep {
            self.held = None;
        }
        keep
    }

    /// Loads a unit's model, or keeps the held one when it was loaded with the same options;
    /// the memory peaks (`rss` and the process's) start again before the load.
    fn load(
        &mut self,
        rss: &ident::RssPeaks,
        load_opts: &bmoe_engine::LoadOptions,
        probe_error: Option<String>,
        model: &Path,
        limit: std::time::Duration,
    ) -> LoadOutcome {
        let reused = self.release_unless(load_opts, probe_error.is_none());
        // The point's memory is measured from here: its model load included, the previous
        // point's model (released above unless kept) and peaks not. What the allocator kept of
        // the previous point's session and model would count too (3-4 MiB on the tiny model,
        // scripts/bench-point-memory): it goes back to the kernel first.
        bmoe_engine::trim_free_heap();
        ident::reset_peak_rss();
        rss.reset();
        let t0 = Instant::now();
        let result: Result<(), String> = match probe_error {
            _ if reused => Ok(()),
            Some(why) => Err(why),
            None => load_within(load_opts, limit, model)
                .map(|m| self.held = Some((load_opts.clone(), m))),
        };
        let load_s = if reused {
            0.0
        } else {
            t0.elapsed().as_secs_f64()
        };
        LoadOutcome {
            result,
            load_s,
            reused,
        }
    }

    /// The held model after a load, or why there is none.
    fn loaded(&self, result: Result<(), String>) -> Result<&Model, String> {
        match (result, self.held.as_ref()) {
            (Ok(()), Some((_, m))) => Ok(m),
            (Ok(()), None) => Err("the model is not loaded".to_string()),
            (Err(why), _) => Err(why),
        }
    }
}

/// Runs `f` on a thread named `name` and waits at most `limit` for it: `None` when it is still
/// running then. Work that storage leaves hanging (a read that never returns) cannot be
/// cancelled, so it is abandoned: its thread stays blocked, holding what it allocated, and what
/// it returns later is dropped there (the receiver is gone).
fn within<T: Send + 'static>(
    limit: std::time::Duration,
    name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<Option<T>> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let _ = tx.send(f());
        })?;
    Ok(rx.recv_timeout(limit).ok())
}

/// Loads a model on a thread of its own and waits at most `limit` for it. A load still running
/// then (a storage read that never returns, a loop in llama.cpp) is abandoned ([`within`]), and
/// the unit's items fail saying so; the run goes on.
fn load_within(
    load_opts: &bmoe_engine::LoadOptions,
    limit: std::time::Duration,
    model: &Path,
) -> Result<Model, String> {
    let opts = load_opts.clone();
    let loaded = within(limit, "bmoe-load", move || Model::load(&opts)).map_err(|e| {
        format!(
            "loading {}: starting the load thread: {e}",
            display_path(model)
        )
    })?;
    match loaded {
        Some(r) => r.map_err(|e| {
            let msg = e.to_string();
            // Most load errors name the file already; the others get it in front.
            if msg.contains(&model.display().to_string()) {
                msg
            } else {
                format!("loading {}: {msg}", display_path(model))
            }
        }),
        None => Err(format!(
            "loading {}: the load did not finish within {} s (load_timeout_s); abandoned",
            display_path(model),
            limit.as_secs()
        )),
    }
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
        build: format!(
            "bmoe {} (engine {})",
            env!("CARGO_PKG_VERSION"),
            bmoe_engine::VERSION
        ),
        rss: ident::RssPeaks::start(),
    };
    let mut models = Models {
        held: None,
        probed: opts.probed.clone(),
    };
    for unit in &prep.units {
        run_unit(&ctx, &mut out, &mut models, unit)?;
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

/// Runs one unit: its model loaded (or kept), warmed up, then every pending item measured. Sets
/// `summary.interrupted` when the run must stop.
fn run_unit(ctx: &Ctx, out: &mut Out, models: &mut Models, unit: &Unit) -> anyhow::Result<()> {
    let lj = &ctx.prep.jobs[unit.job];
    let write_to = ctx.write_to(&lj.csv);
    let pending = pending_items(ctx, lj, unit, &mut out.summary);
    let label = format!("{} on {} [{}]", lj.job.name, unit.profile.name, unit.point);
    if pending.is_empty() {
        out.progress.end_unit();
        return Ok(());
    }
    if ctx.stop.requested() {
        out.summary.interrupted = true;
        return Ok(());
    }
    out.progress.start_unit(&label, pending.len() as u64);
    let (load_opts, mut sess_opts) = (unit.placement.load.clone(), unit.placement.session.clone());
    let sha = ctx.model_sha.get(&lj.model).map_or("", String::as_str);
    if sha.is_empty() {
        // Without the model's hash (abandoned), entries could not be told from another model's.
        sess_opts.prefix_cache = None;
    }
    if let Some(pc) = sess_opts.prefix_cache.as_mut() {
        pc.key = ident::prefix_key(sha, &unit.resolved.settings);
    }
    let limit = ctx.prep.load_timeout(&lj.model);
    let probe_error = models.probe_error(ctx.opts, &lj.model, limit)?;
    let outcome = models.load(&ctx.rss, &load_opts, probe_error, &lj.model, limit);
    let reused = outcome.reused;
    let loaded = models.loaded(outcome.result);
    let base = unit_base_row(ctx, lj, unit, &loaded, outcome.load_s, reused)?;
    let model = match loaded {
        Ok(m) => m,
        Err(why) => return refuse_unit(out, &write_to, pending, &base, &why),
    };
    if !reused {
        for w in model.warnings() {
            out.progress.println(&format!("bmoe: {w}"));
        }
    }
    let mut session = model.session(&sess_opts).context("opening a session")?;
    let gen_opts = generate_options(lj);
    warm_up(ctx, &mut session, lj, &base, &gen_opts, &mut out.summary);
    if out.summary.interrupted {
        out.progress.end_unit();
        return Ok(());
    }
    // The profiling report covers the measured items only.
    let _ = model.explain_prefill();
    let run = Measured {
        lj,
        base: &base,
        write_to: &write_to,
        gen_opts: &gen_opts,
    };
    measure_items(ctx, out, &mut session, &run, pending)?;
    if let Some(r) = model.explain_prefill() {
        report_explain(&out.progress, &write_to, &base, &r)?;
    }
    out.progress.end_unit();
    Ok(())
}

/// The row every item of a unit starts from: the shared columns, the load's, the machine's.
fn unit_base_row(
    ctx: &Ctx,
    lj: &LoadedJob,
    unit: &Unit,
    loaded: &Result<&Model, String>,
    load_s: f64,
    reused: bool,
) -> anyhow::Result<Row> {
    let mut base = base_row(
        &ctx.run_id,
        lj,
        unit,
        loaded.as_ref().ok().copied(),
        load_s,
        &ctx.build,
    );
    if let Ok(m) = loaded {
        let st = m.load_stats();
        base.repacked_tensors = Some(st.repacked.tensors as u64);
        // What the model reports it got, not what was planned: the device that joined, the
        // cache the streamer was granted.
        base.prefill_device = m.info().prefill_device.clone().unwrap_or_default();
        base.cache_mb = m.stream_budget_bytes().map_or(0, |b| b >> 20);
        base.load_mode = st.mode.as_str().to_string();
        base.load_read_mib = if reused {
            Some(0.0)
        } else {
            st.read_bytes.map(mib)
        };
    }
    base.repack = unit.resolved.settings.repack.to_string();
    base.shard = ctx.opts.filter.shard.map(|s| s.label()).unwrap_or_default();
    base.host = ctx.machine_id.host.clone();
    base.cpu_model = ctx.machine_id.cpu_model.clone();
    base.cpu_cores = ctx.machine_id.cpu_cores;
    base.cpu_variant = ctx.machine_id.cpu_variant.clone();
    base.page_moves = ctx.machine_id.page_moves.clone();
    base.model_sha256 = ctx.model_sha.get(&lj.model).cloned().unwrap_or_default();
    base.profile_hash = ident::file_hash16(&unit.profile_path)?;
    Ok(base)
}

/// The model cannot run: every pending item gets an error row, and the run goes on with the
/// next unit.
fn refuse_unit(
    out: &mut Out,
    write_to: &Path,
    pending: Vec<(&Item, u32)>,
    base: &Row,
    why: &str,
) -> anyhow::Result<()> {
    out.progress.println(&format!("error: {why}"));
    for (item, rep) in pending {
        let row = Row {
            item: item.id.clone(),
            repeat: rep,
            error: why.to_string(),
            prefill_device: String::new(),
            peak_rss_mib: ident::peak_rss_mib(),
            time: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            ..base.clone()
        };
        out.emit(write_to, &row)?;
        out.summary.failed += 1;
        out.progress.item_done(0);
    }
    out.progress.end_unit();
    Ok(())
}

/// Warmup: `warmup` items run on the fresh session and are thrown away, so the measured rows
/// start with a warm expert cache. They are taken cycling through the list so that the last one
/// is the list's last item: the first measured item then follows what it follows in every later
/// pass, never itself (whose prompt would already be in the KV cache).
fn warm_up(
    ctx: &Ctx,
    session: &mut Session<'_>,
    lj: &LoadedJob,
    base: &Row,
    gen_opts: &GenerateOptions,
    summary: &mut Summary,
) {
    let n_warm = if lj.items.is_empty() {
        0
    } else {
        lj.job.warmup as usize
    };
    for i in 0..n_warm {
        if ctx.stop.requested() {
            summary.interrupted = true;
            break;
        }
        let len = lj.items.len();
        let item = &lj.items[(i + len - n_warm % len) % len];
        let mut scratch = base.clone();
        match run_item(
            session,
            lj.job.kind,
            &item.payload,
            gen_opts,
            ctx.stop,
            &mut scratch,
        ) {
            Ok(true) => {}
            Ok(false) | Err(EngineError::Cancelled) => {
                summary.interrupted = true;
                break;
            }
            // A refused item is reported on its measured run; warmup only warms.
            Err(_) => {}
        }
    }
}

/// What the measured items of a unit share.
struct Measured<'a> {
    lj: &'a LoadedJob,
    base: &'a Row,
    write_to: &'a Path,
    gen_opts: &'a GenerateOptions,
}

/// Runs and writes every pending item of a unit, until the run is stopped.
fn measure_items(
    ctx: &Ctx,
    out: &mut Out,
    session: &mut Session<'_>,
    m: &Measured,
    pending: Vec<(&Item, u32)>,
) -> anyhow::Result<()> {
    for (item, rep) in pending {
        if ctx.stop.requested() {
            out.summary.interrupted = true;
            break;
        }
        let mut row = Row {
            item: item.id.clone(),
            repeat: rep,
            ..m.base.clone()
        };
        let outcome = run_item(
            session,
            m.lj.job.kind,
            &item.payload,
            m.gen_opts,
            ctx.stop,
            &mut row,
        );
        match outcome {
            Ok(true) => {}
            // Abandoned by a second Ctrl-C: not complete, so not written.
            Ok(false) | Err(EngineError::Cancelled) => {
                out.summary.interrupted = true;
                break;
            }
            Err(e) => {
                out.summary.failed += 1;
                row.error = e.to_string();
                out.progress
                    .println(&format!("bmoe: {} item {}: {e}", m.lj.job.name, item.id));
            }
        }
        finish_row(ctx, &mut row);
        out.emit(m.write_to, &row)?;
        count_row(&mut out.summary, m.lj.job.kind, &row);
        // What was prefilled: a decision that reused a cached prefix prefilled only the rest.
        let prefilled = row.n_prefilled.unwrap_or(row.n_prompt);
        out.progress.item_done(u64::from(prefilled));
    }
    Ok(())
}

/// The columns a measured row gets once its item ran: the time, the device that did prefill,
/// the memory peaks.
fn finish_row(ctx: &Ctx, row: &mut Row) {
    row.time = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    // The device column says who ran prefill, not who was planned to.
    if row.prefill_dev_tokens == 0 {
        row.prefill_device.clear();
    }
    row.peak_rss_mib = ident::peak_rss_mib();
    (row.peak_rss_anon_mib, row.peak_rss_file_mib) = ctx.rss.peaks_mib();
}

/// Adds a written row to the run's totals.
fn count_row(summary: &mut Summary, kind: Kind, row: &Row) {
    if kind == Kind::Decide && row.error.is_empty() {
        summary.decisions += 1;
        if let Some(ok) = row.correct {
            summary.with_expected += 1;
            summary.correct += u64::from(ok);
        }
    }
    summary.add_outcome(row);
    summary.prefill_s += row.prefill_s;
    summary.prefill_tokens += u64::from(row.n_prefilled.unwrap_or(row.n_prompt));
}

/// The totals computed from the sums: accuracy, perplexity and its standard error.
fn finish_totals(summary: &mut Summary) {
    summary.accuracy =
        (summary.with_expected > 0).then(|| summary.correct as f64 / summary.with_expected as f64);
    summary.ppl =
        (summary.ppl_tokens > 0).then(|| (summary.nll_sum / summary.ppl_tokens as f64).exp());
    summary.ppl_stderr = summary.ppl.map(|ppl| {
        let n = summary.ppl_tokens as f64;
        let mean = summary.nll_sum / n;
        let var = (summary.nll_sq_sum / n - mean * mean).max(0.0);
        ppl * if n > 1.0 {
            (var / (n - 1.0)).sqrt()
        } else {
            0.0
        }
    });
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

/// `[prefill] explain`: the unit's profiling report on stderr and as one JSON line in
/// `<csv>.explain.jsonl` (job, profile, sweep point, report).
fn report_explain(
    progress: &Progress,
    csv: &Path,
    base: &Row,
    r: &bmoe_engine::device::explain::ExplainReport,
) -> anyhow::Result<()> {
    progress.println(&format!(
        "{} / {} {}:\n{}",
        base.job,
        base.profile,
        base.point,
        r.render().trim_end()
    ));
    let mut path = csv.as_os_str().to_owned();
    path.push(".explain.jsonl");
    let line = serde_json::json!({
        "job": base.job,
        "profile": base.profile,
        "point": base.point,
        "run_id": base.run_id,
        "report": r,
    });
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .with_context(|| format!("opening {}", Path::new(&path).display()))?;
    std::io::Write::write_all(&mut f, format!("{line}\n").as_bytes())
        .with_context(|| format!("writing {}", Path::new(&path).display()))?;
    Ok(())
}

fn generate_options(lj: &LoadedJob) -> GenerateOptions {
    let s = &lj.job.sampling;
    GenerateOptions {
        n_predict: lj.job.n_predict,
        chat: lj.job.chat,
        sampling: if s.temperature <= 0.0 {
            Sampling::Greedy
        } else {
            Sampling::Seeded {
                seed: s.seed,
                temperature: s.temperature,
                top_k: s.top_k,
                top_p: s.top_p,
            }
        },
    }
}

/// Appends `row` to `csv` (opening the sink on first use) and counts it.
fn append_row(
    sinks: &mut HashMap<PathBuf, CsvSink>,
    written: &mut HashMap<PathBuf, u64>,
    csv: &Path,
    row: &Row,
) -> anyhow::Result<()> {
    if !sinks.contains_key(csv) {
        sinks.insert(csv.to_path_buf(), CsvSink::open(csv)?);
    }
    if let Some(s) = sinks.get_mut(csv) {
        s.append(row)?;
    }
    *written.entry(csv.to_path_buf()).or_default() += 1;
    Ok(())
}

/// The columns every row of a unit shares; without a model (it failed to load) the model's
/// columns come from the header read at placement.
fn base_row(
    run_id: &str,
    lj: &LoadedJob,
    u: &Unit,
    model: Option<&Model>,
    load_s: f64,
    build: &str,
) -> Row {
    let s = &u.resolved.settings;
    let d = &u.placement.plan.dims;
    let (file_bytes, arch, n_expert_used) = match model {
        Some(m) => {
            let i = m.info();
            (i.file_bytes, i.arch.clone(), i.n_expert_used)
        }
        None => (
            d.file_bytes,
            d.arch.clone(),
            u32::try_from(d.n_expert_used).unwrap_or(u32::MAX),
        ),
    };
    // The hash only labels rows; a file that cannot be read again gets an empty one, not a
    // failed run.
    let hash = model_hash(&lj.model, d.data_start).unwrap_or_default();
    crate::config::declare::with_recorded_settings!(s => Row {
        run_id: run_id.to_string(),
        job: lj.job.name.clone(),
        kind: lj.job.kind.to_string(),
        profile: u.profile.name.clone(),
        point: u.point.clone(),
        model: display_path(&lj.model),
        model_bytes: file_bytes,
        model_hash: hash,
        build: build.to_string(),
        arch,
        threads: u.placement.threads.used,
        context: u.placement.plan.n_ctx as u32,
        cache_mb: u.placement.plan.cache_mb,
        prefill_device: u.placement.plan.prefill.device.clone().unwrap_or_default(),
        prefill_device_plan: u.placement.plan.prefill.device.clone().unwrap_or_default(),
        n_expert_used,
        load_s,
        schema_version: Some(SCHEMA_VERSION),
        git_commit: ident::GIT_COMMIT.to_string(),
        llama_cpp: ident::LLAMA_CPP.to_string(),
        ..sampling_columns(lj)
    })
}

/// The sampling columns of a generate row; empty on other kinds, and the seeded-only ones empty
/// when greedy.
fn sampling_columns(lj: &LoadedJob) -> Row {
    if lj.job.kind != Kind::Generate {
        return Row::default();
    }
    let s = &lj.job.sampling;
    let seeded = s.temperature > 0.0;
    Row {
        temperature: Some(plain_f64(s.temperature)),
        top_k: seeded.then(|| u32::try_from(s.top_k.max(0)).unwrap_or(0)),
        top_p: seeded.then_some(plain_f64(s.top_p)),
        seed: seeded.then_some(u64::from(s.seed)),
        n_predict: Some(lj.job.n_predict),
        chat: Some(lj.job.chat),
        ..Row::default()
    }
}

/// An f32 as the f64 a person wrote (0.8, not 0.800000011920929): through its shortest text.
fn plain_f64(x: f32) -> f64 {
    x.to_string().parse().unwrap_or(f64::from(x))
}

/// Runs one item into `row`; `Ok(false)` when it was abandoned (not complete).
fn run_item(
    session: &mut Session<'_>,
    kind: Kind,
    payload: &Payload,
    gen: &GenerateOptions,
    stop: &Stop,
    row: &mut Row,
) -> Result<bool, EngineError> {
    match (kind, payload) {
        (Kind::Decide, Payload::Decide(d)) => {
            // Written even when the engine refuses the item, so a refused row still says what
            // it was asked.
            let choices = &d.req.choices;
            row.scoring = scoring_name(d.req.scoring).to_string();
            row.meta = d.meta.clone();
            row.expected = d
                .expected
                .and_then(|e| choices.get(e).cloned())
                .unwrap_or_default();
            let called = Instant::now();
            let r = session.decide(&d.req)?;
            row.ttft_s = Some(called.elapsed().as_secs_f64());
            fill_common(row, &r.timing, &r.stream, &r.prefill_dev);
            // timing.n_prompt counts the prefilled tokens; the column keeps the whole prompt so
            // it does not change with what ran before.
            row.n_prompt = r.n_tokens;
            row.best = Some(r.best as u32);
            row.choice_logp = ChoiceLogp(r.choice_logp.clone());
            fill_decision(row, d, &r);
        }
        (Kind::Generate, Payload::Text(prompt)) => {
            let r = session.generate(prompt, gen, &stop.cancel)?;
            if r.cancelled {
                return Ok(false);
            }
            fill_common(row, &r.timing, &r.stream, &r.prefill_dev);
            row.ttft_s = (r.timing.n_decoded > 0).then_some(r.timing.first_token_s);
            row.stopped_eog = r.stopped_eog;
            row.stopped = r.stopped.as_str().to_string();
            row.text = escape_text(&r.text);
        }
        (Kind::Perplexity, Payload::Text(text)) => {
            let r = session.perplexity(text)?;
            fill_common(row, &r.timing, &r.stream, &r.prefill_dev);
            row.ppl = Some(r.ppl);
            row.nll_mean = Some(r.nll_mean);
            row.n_scored = Some(r.n_scored);
            row.nll_stderr = Some(r.nll_stderr);
        }
        // load_job pairs kinds with payloads; a mismatch is a bug, reported as a refusal.
        _ => {
            return Err(EngineError::InvalidOption(format!(
                "{kind} job with the wrong kind of item"
            )))
        }
    }
    Ok(true)
}

/// The decide columns that come from the engine's record, beyond `best` and `choice_logp`.
fn fill_decision(row: &mut Row, d: &Decision, r: &bmoe_engine::DecideRecord) {
    row.best_choice = d.req.choices.get(r.best).cloned().unwrap_or_default();
    row.margin = r.margin.is_finite().then_some(r.margin);
    row.correct = d.expected.map(|e| e == r.best);
    row.choice_ntok = serde_json::Value::from(r.choice_ntok.clone()).to_string();
    row.n_reused = Some(r.n_reused);
    row.n_prefilled = Some(r.n_prefilled);
    row.reuse = r.reuse.as_str().to_string();
    row.reuse_reason = r.reuse_reason.clone();
}

/// The job-file name of a scoring mode.
fn scoring_name(s: bmoe_engine::Scoring) -> &'static str {
    match s {
        bmoe_engine::Scoring::FirstToken => "first_token",
        bmoe_engine::Scoring::Sum => "sum",
        bmoe_engine::Scoring::Mean => "mean",
        bmoe_engine::Scoring::Norm => "norm",
        bmoe_engine::Scoring::Calibrated => "calibrated",
    }
}

fn fill_common(
    row: &mut Row,
    t: &bmoe_engine::Timing,
    s: &bmoe_engine::StreamCounters,
    d: &bmoe_engine::PrefillDevCounters,
) {
    row.n_prompt = t.n_prompt;
    row.prefill_s = t.prefill_s;
    row.prefill_tps = t.prefill_tps();
    row.tokens = t.n_decoded;
    row.decode_s = t.decode_s;
    row.tok_s = t.tok_s();
    row.read_mib = s.read_mib();
    row.io_s = s.read_s;
    row.stall_s = s.stall_s;
    row.cache_hit_pct = s.cache_hit_pct();
    row.cache_resident_mib = s.resident_bytes as f64 / (1u64 << 20) as f64;
    row.evictions = s.evictions;
    row.experts_substituted = s.substituted;
    row.experts_dropped = s.dropped;
    row.cache_shrinks = s.cache_shrinks;
    row.cache_grows = s.cache_grows;
    row.cache_budget_mib =
        (s.budget_bytes > 0).then(|| s.budget_bytes as f64 / (1u64 << 20) as f64);
    row.prefetched = s.prefetched;
    row.overlap_pct = s.overlap_pct();
    row.prefill_dev_tokens = d.tokens;
    row.prefill_dev_nodes = d.nodes;
    row.prefill_dev_read_mib = d.read_mib();
    row.prefill_dev_stall_s = d.stall_s;
    row.prefill_dev_routed = d.routed;
    row.prefill_dev_demand = d.demand;
    row.prefill_dev_whole_fallback = d.whole_fallback;
    row.prefill_dev_file_read_mib = d.file_read_mib();
    row.prefill_dev_cached_experts = d.cached_experts;
}

/// Bytes as MiB.
fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}
