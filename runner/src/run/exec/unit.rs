//! One unit (job, profile point): its model loaded, its warm-up, its items run into rows.
use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use bmoe_engine::{EngineError, GenerateOptions, Model, Sampling, Session};

use super::context::{Ctx, Out};
use super::models::Models;
use super::row::{base_row, fill_common, fill_decision, finish_row, mib, scoring_name};
use super::start_unit;
use super::summary::{count_row, Summary};
use crate::config::item::{Item, Kind, Payload};
use crate::config::job::LoadedJob;
use crate::ident::{self};
use crate::run::prepare::Unit;
use crate::run::progress::Progress;
use crate::run::signals::Stop;
use crate::sink::row::{escape_text, ChoiceLogp, Row};

/// Runs one unit: its model loaded (or kept), warmed up, then every pending item measured. Sets
/// `summary.interrupted` when the run must stop.
pub(super) fn run_unit(
    ctx: &Ctx,
    out: &mut Out,
    models: &mut Models,
    unit: &Unit,
) -> anyhow::Result<()> {
    let Some((lj, write_to, pending)) = start_unit(ctx, out, unit) else {
        return Ok(());
    };
    let mut sess_opts = unit.placement.session.clone();
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
    if cold_start(unit) {
        drop_pages(out, models, &lj.model);
    }
    let disk = probe_disk(out, unit, &lj.model);
    let outcome = models.load(&ctx.rss, &unit.placement, probe_error, &lj.model, limit);
    let reused = outcome.reused;
    let loaded = models.loaded(outcome.result);
    let mut base = unit_base_row(ctx, lj, unit, &loaded, outcome.load_s, reused)?;
    base.disk_mib_s = disk;
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

/// Whether the unit starts cold: `cold_start`, or a memory limit (pages cached before the point
/// were charged to whoever read them first, so a cap over a warm page cache would not bound them).
fn cold_start(unit: &Unit) -> bool {
    let s = &unit.resolved.settings;
    s.cold_start || s.memory_limit != crate::config::values::MemoryLimit::None
}

/// The storage's read rate when the point asks for it (`disk_probe`), at its reader lanes; a
/// probe that cannot run is said and leaves the rows' `disk_mib_s` empty.
fn probe_disk(out: &Out, unit: &Unit, model: &Path) -> Option<f64> {
    let s = &unit.resolved.settings;
    if !s.disk_probe {
        return None;
    }
    let lanes = s.io_threads.or(crate::config::values::AUTO_IO_THREADS) as usize;
    match super::disk_probe::disk_rate(model, lanes) {
        Ok(rate) => Some((rate * 10.0).round() / 10.0),
        Err(e) => {
            let shown = crate::config::paths::display_path(model);
            out.progress
                .println(&format!("bmoe: disk_probe: {shown}: {e}"));
            None
        }
    }
}

/// Drops the model file's pages from the page cache, the held model released first (pages a
/// process maps are not dropped); a failure is said, and the rows' `load_read_mib` shows it.
fn drop_pages(out: &Out, models: &mut Models, model: &Path) {
    models.held = None;
    if let Err(e) = bmoe_engine::drop_file_pages(model) {
        out.progress.println(&format!(
            "bmoe: cold start: cannot drop {}'s cached pages: {e}",
            crate::config::paths::display_path(model)
        ));
    }
}

/// The row every item of a unit starts from: the shared columns, the load's, the machine's.
pub(super) fn unit_base_row(
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
    base.repack = unit.resolved.settings.repack_run().to_string();
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
pub(super) fn refuse_unit(
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
            // A limited point ran in a child: this process's peak is not the point's (its
            // group's peak, `memory_peak_mib`, is).
            peak_rss_mib: base
                .memory_limit_mib
                .is_none()
                .then(ident::peak_rss_mib)
                .flatten(),
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
pub(super) fn warm_up(
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
pub(super) struct Measured<'a> {
    pub(super) lj: &'a LoadedJob,
    pub(super) base: &'a Row,
    pub(super) write_to: &'a Path,
    pub(super) gen_opts: &'a GenerateOptions,
}

/// Runs and writes every pending item of a unit, until the run is stopped.
pub(super) fn measure_items(
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

/// `[prefill] explain`: the unit's profiling report on stderr and as one JSON line in
/// `<csv>.explain.jsonl` (job, profile, sweep point, report).
pub(super) fn report_explain(
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

/// Runs one item into `row`; `Ok(false)` when it was abandoned (not complete).
pub(super) fn run_item(
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
            row.decode_read_mib = row.moe_stream.then(|| r.decode_stream.read_mib());
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

pub(super) fn generate_options(lj: &LoadedJob) -> GenerateOptions {
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
