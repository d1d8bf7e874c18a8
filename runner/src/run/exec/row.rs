//! A row filled: the unit's columns, an item's record, the sampling and timing columns.

use bmoe_engine::Model;

use super::context::Ctx;
use super::resume::model_hash;
use crate::config::item::{Decision, Kind};
use crate::config::job::LoadedJob;
use crate::config::paths::display_path;
use crate::ident::{self};
use crate::run::prepare::Unit;
use crate::sink::row::{Row, SCHEMA_VERSION};

/// The columns a measured row gets once its item ran: the time, the device that did prefill,
/// the memory peaks.
pub(super) fn finish_row(ctx: &Ctx, row: &mut Row) {
    row.time = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    // The device column says who ran prefill, not who was planned to.
    if row.prefill_dev_tokens == 0 {
        row.prefill_device.clear();
    }
    row.peak_rss_mib = ident::peak_rss_mib();
    (row.peak_rss_anon_mib, row.peak_rss_file_mib) = ctx.rss.peaks_mib();
}

/// The columns every row of a unit shares; without a model (it failed to load) the model's
/// columns come from the header read at placement.
pub(super) fn base_row(
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
pub(super) fn sampling_columns(lj: &LoadedJob) -> Row {
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
pub(super) fn plain_f64(x: f32) -> f64 {
    x.to_string().parse().unwrap_or(f64::from(x))
}

/// The decide columns that come from the engine's record, beyond `best` and `choice_logp`.
pub(super) fn fill_decision(row: &mut Row, d: &Decision, r: &bmoe_engine::DecideRecord) {
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
pub(super) fn scoring_name(s: bmoe_engine::Scoring) -> &'static str {
    match s {
        bmoe_engine::Scoring::FirstToken => "first_token",
        bmoe_engine::Scoring::Sum => "sum",
        bmoe_engine::Scoring::Mean => "mean",
        bmoe_engine::Scoring::Norm => "norm",
        bmoe_engine::Scoring::Calibrated => "calibrated",
    }
}

pub(super) fn fill_common(
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
pub(super) fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}
