//! What `bmoe generate`, `bmoe decide` and `bmoe ppl` share: the flags resolved into engine options,
//! the model loaded with its lines, the counters printed.
use bmoe_engine::plan::{Plan, PrefillPlace};
use bmoe_engine::settings::ThreadChoice;
use bmoe_engine::{LoadOptions, Model, PrefillDevCounters, SessionOptions, StreamCounters, Timing};

use serde::Serialize;

use crate::cli::engine_args::EngineArgs;
use crate::config::layers::{self, LayerInputs};
use crate::config::profile::load_profile;
use crate::config::settings::Settings;
use crate::placement;

/// What a one-shot command runs with: the resolved values and the engine options they give.
#[derive(Debug)]
pub struct Direct {
    /// The engine's load options.
    pub load: LoadOptions,
    /// The engine's session options.
    pub session: SessionOptions,
    /// Compute threads as asked and as they run here.
    pub threads: ThreadChoice,
    /// The plan the load takes, or the prefill place its plan on this machine takes.
    pub plan: Planned,
}

/// What a one-shot load is planned on.
#[derive(Debug)]
pub enum Planned {
    /// The profile's placement.
    Profile(Box<Plan>),
    /// This machine's memory at load, with the prefill place decided here.
    Here(PrefillPlace),
}

/// Says so for each flag given that has no effect with the other settings (the rule of
/// [`crate::config::inert`], shared with check/plan/run).
fn warn_idle_flags(e: &EngineArgs, s: &Settings) {
    if s.streams() {
        // A `bmoe:` line where evicted pages cannot be moved (old kernels, qemu-user).
        crate::ident::page_moves_verdict();
    }
    let flags = e.settings.layer();
    for (key, why) in crate::config::inert::inert_keys(flags.keys().map(String::as_str), s) {
        eprintln!(
            "bmoe: --{} has no effect ({why}): ignored",
            key.replace('_', "-")
        );
    }
    // The runner's settings: a one-shot command runs in this process, so neither can apply.
    if s.memory_limit != crate::config::values::MemoryLimit::None || s.cold_start {
        eprintln!(
            "bmoe: memory_limit and cold_start apply to `bmoe run` points only (a child process in a memory cgroup); this command runs without them"
        );
    }
}

/// The prefill place of `s`: the profile's policy over the device, or the device resolved
/// here (it opens, once: the load takes this verdict and does not open it again).
fn prefill_place(s: &Settings, profile: Option<&crate::config::profile::Profile>) -> PrefillPlace {
    match (profile, s.device_name()) {
        (Some(pr), _) => placement::place_prefill(pr, s),
        (None, Some(name)) => PrefillPlace::resolve(name),
        (None, None) => PrefillPlace::on_cpu("no prefill device configured".into()),
    }
}

/// Refuses a prefill device named on the command line that will not run here (unless
/// `--allow-cpu-fallback`), before anything loads; says so for one named by the profile.
fn check_device(
    e: &EngineArgs,
    s: &Settings,
    place: &PrefillPlace,
    by_profile: bool,
    origin: &str,
) -> anyhow::Result<()> {
    let Some(name) = s.device_name() else {
        return Ok(());
    };
    match placement::device_fallback(Some(name), origin, place, e.allow_cpu_fallback) {
        Some(Err(e)) => anyhow::bail!(e),
        // Without a profile the engine's own line at load says it; a profile's policy
        // (a Hexagon generation) is the runner's to say.
        Some(Ok(w)) if by_profile => eprintln!("bmoe: {w}"),
        _ => {}
    }
    Ok(())
}

/// Resolves the layers (defaults < `--profile` < `BMOE_*` < `--set` < flags) and the engine
/// options: through the profile's placement when one is given, else against this machine.
fn resolve(e: &EngineArgs) -> anyhow::Result<Direct> {
    let mut inputs = LayerInputs {
        flags: e.settings.layer(),
        ..LayerInputs::default()
    };
    for s in &e.sets {
        inputs
            .sets
            .push(layers::parse_set(s).map_err(|d| anyhow::anyhow!("{d}"))?);
    }
    let profile = match &e.profile {
        Some(p) => Some(load_profile(p).map_err(|e| anyhow::anyhow!("{e}"))?.0),
        None => None,
    };
    let base = match (&profile, &e.profile) {
        (Some(pr), Some(path)) => vec![layers::profile_layer(pr, path)],
        _ => Vec::new(),
    };
    let r = layers::resolve_layers(base, &inputs).map_err(|e| anyhow::anyhow!("{e}"))?;
    let device_origin = r.origin("device").to_string();
    let s = r.settings;
    let place = prefill_place(&s, profile.as_ref());
    check_device(e, &s, &place, profile.is_some(), &device_origin)?;
    warn_idle_flags(e, &s);
    if e.llama_load && !s.streams() {
        anyhow::bail!(
            "--llama-load needs moe_stream (--moe-stream): it is how a streamed model loads"
        );
    }
    if s.explain && s.device_name().is_none() {
        anyhow::bail!("--explain profiles device prefill: it needs a prefill device (--device)");
    }
    let (mut load, session, threads, plan) = match &profile {
        Some(pr) => {
            let p = placement::place_with(pr, &s, &e.model, place)?;
            (
                p.load,
                p.session,
                p.threads,
                Planned::Profile(Box::new(p.plan)),
            )
        }
        None => {
            let (load, session, threads) = machine_options(&s, &e.model)?;
            (load, session, threads, Planned::Here(place))
        }
    };
    if let Some(st) = load.stream.as_mut() {
        st.llama_load = e.llama_load;
    }
    let mut session = session;
    if let Some(pc) = session.prefix_cache.as_mut() {
        let sha = crate::ident::model_sha256(&e.model, true)?;
        pc.key = crate::ident::prefix_key(&sha, &s);
    }
    Ok(Direct {
        load,
        session,
        threads,
        plan,
    })
}

/// The engine options for `s` on this machine (no profile): `cache_mb = "auto"` stays `auto`,
/// which the engine resolves at load with the same plan against this machine's memory.
fn machine_options(
    s: &Settings,
    model: &std::path::Path,
) -> anyhow::Result<(LoadOptions, SessionOptions, ThreadChoice)> {
    let (threads, cores) = placement::threads_and_cores(s).map_err(|e| anyhow::anyhow!("{e}"))?;
    let (load, session) = placement::requested_options(s, model, threads.used, &cores);
    Ok((load, session, threads))
}

pub(super) fn load(e: &EngineArgs) -> anyhow::Result<(Model, SessionOptions)> {
    bmoe_engine::set_log_verbose(e.verbose);
    // Every value and every combination is checked before the model is read.
    let d = resolve(e)?;
    d.load.validate()?;
    d.session.validate(d.load.prefill.as_ref())?;
    if let Some(note) = d.threads.capped_note() {
        eprintln!("bmoe: {note}");
    }
    // The plan was made for this call's own context (an `auto` cache leaves room for it), and
    // its prefill place is the one checked above.
    let m = match &d.plan {
        Planned::Profile(plan) => Model::load_planned(&d.load, plan)?,
        Planned::Here(place) => Model::load_for_placed(&d.load, &d.session, place)?,
    };
    for w in m.warnings() {
        eprintln!("bmoe: {w}");
    }
    let st = m.load_stats();
    let read = st
        .read_bytes
        .map(|b| format!("{:.1} MiB", b as f64 / 1048576.0))
        .unwrap_or_else(|| "?".into());
    match (st.mode, m.lean_load()) {
        (bmoe_engine::LoadMode::Lean, Some(l)) => eprintln!(
            "load: {:.2} s, {read} read from storage (header and {:.1} MiB of dense weights; no expert){}",
            st.seconds,
            l.dense_bytes as f64 / 1048576.0,
            match l.unlinked_tensors {
                Some(n) if n > 0 => format!("; {n} optional tensors the file lacks left out of the graph"),
                _ => String::new(),
            }
        ),
        _ => eprintln!(
            "load: {:.2} s, {read} read from storage (llama.cpp's load: the whole file)",
            st.seconds
        ),
    }
    if st.repacked.tensors > 0 {
        eprintln!(
            "repack: {} weight tensors ({:.1} MiB) in the CPU's repacked layout",
            st.repacked.tensors,
            st.repacked.bytes as f64 / 1048576.0
        );
    }
    if let Some(b) = m.stream_budget_bytes() {
        eprintln!("moe-stream: on, expert cache {} MiB", b >> 20);
    }
    Ok((m, d.session))
}

/// What `generate`, `decide` and `ppl --format json` print: the engine's record with every number
/// the lines on stderr show beside it (what the load cost, the expert cache it set, generate's
/// peak resident set), so a script reads the document and never the lines.
#[derive(Serialize)]
pub(super) struct Doc<'a, R: Serialize> {
    /// The engine's record, its fields at the top level (as before these were added).
    #[serde(flatten)]
    pub record: &'a R,
    /// What the load cost: its mode, seconds, bytes read from storage, weights repacked (the
    /// `load:` and `repack:` lines).
    pub load: bmoe_engine::LoadStats,
    /// The expert cache's budget in bytes as the load set it (`moe-stream: on, expert cache`);
    /// null when the model is not streamed.
    pub expert_cache_bytes: Option<u64>,
    /// generate's peak resident set (the `storage:` line); absent for decide and ppl.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_rss: Option<PeakRss>,
}

impl<'a, R: Serialize> Doc<'a, R> {
    /// `record` with what `model`'s load cost and set.
    pub(super) fn new(record: &'a R, model: &Model) -> Self {
        Doc {
            record,
            load: model.load_stats(),
            expert_cache_bytes: model.stream_budget_bytes(),
            peak_rss: None,
        }
    }
}

/// The process's peak resident set in MiB, whole and split as the kernel counts it; each null
/// where `/proc` does not say.
#[derive(Serialize)]
pub(super) struct PeakRss {
    /// `VmHWM`.
    pub mib: Option<f64>,
    /// The largest `RssAnon` seen.
    pub anon_mib: Option<f64>,
    /// The largest `RssFile` seen.
    pub file_mib: Option<f64>,
}

/// A share for the CLI's lines: one decimal and a percent sign, `n/a` when there was nothing to
/// share.
fn pct(v: Option<f64>) -> String {
    v.map(|p| format!("{p:.1}%"))
        .unwrap_or_else(|| "n/a".into())
}

/// The decode phase's own streaming counters: what decode speed depends on, apart from the
/// prompt's reads.
pub(super) fn print_decode_stream(rec: &bmoe_engine::GenerateRecord) {
    let (t, d) = (&rec.timing, &rec.decode_stream);
    if t.n_decoded > 0 && d.cache_hits + d.cache_misses > 0 {
        eprintln!(
            "moe-stream decode: {:.1} MiB read ({:.2} MiB/token), stall {:.3} s of {:.3} s decoding ({:.1}%), cache hit {}",
            d.read_mib(),
            d.read_mib() / f64::from(t.n_decoded),
            d.stall_s,
            t.decode_s,
            100.0 * d.stall_s / t.decode_s.max(1e-9),
            pct(d.cache_hit_pct()),
        );
        print_stall_parts(d);
        if d.predict_s > 0.0 {
            // What `prefetch = router` costs decode even when it reads nothing ahead.
            eprintln!(
                "prefetch decode: predicting took {:.1} ms ({:.3} ms a token, {:.2}% of decoding)",
                1e3 * d.predict_s,
                1e3 * d.predict_s / f64::from(t.n_decoded),
                100.0 * d.predict_s / t.decode_s.max(1e-9),
            );
        }
    }
}

/// What decode's stall at routing nodes was made of: reads and repacks (summed over the threads
/// that ran them, so with reads on several lanes at once they can add up to more than the stall),
/// page moves, and the rest (the cache's bookkeeping, waits for reads ahead).
fn print_stall_parts(d: &StreamCounters) {
    if d.cache_misses == 0 {
        return;
    }
    let parts = d.read_s + d.repack_s + d.evict_s + d.move_s;
    let rest = if parts <= d.stall_s {
        format!("{:.3} s", d.stall_s - parts)
    } else {
        "n/a (reads overlapped on lanes)".into()
    };
    eprintln!(
        "moe-stream decode stall: reads {:.3} s, repacking {:.3} s, evicting {:.3} s, moving pages in {:.3} s, the rest {rest}",
        d.read_s, d.repack_s, d.evict_s, d.move_s,
    );
}

/// The profiling report of `--explain-prefill`, when it ran.
pub(super) fn print_explain(m: &bmoe_engine::Model) {
    if let Some(r) = m.explain_prefill() {
        eprint!("{}", r.render());
    }
}

pub(super) fn print_counters(t: &Timing, s: &StreamCounters, d: &PrefillDevCounters) {
    eprintln!(
        "prefill: {} tokens in {:.3} s ({:.1} tok/s)",
        t.n_prompt,
        t.prefill_s,
        t.prefill_tps()
    );
    if t.n_decoded > 0 {
        eprintln!(
            "decode: {} tokens in {:.3} s ({:.2} tok/s)",
            t.n_decoded,
            t.decode_s,
            t.tok_s()
        );
    }
    if s.read_bytes > 0 || s.cache_hits + s.cache_misses > 0 {
        let per_tok = f64::from((t.n_decoded + t.n_prompt).max(1));
        eprintln!(
            "moe-stream: {:.1} MiB read ({:.2} MiB/token) in {:.3} s, stall {:.3} s, cache hit {}, {} evictions ({} expert slices read into their pages), {:.1} MiB resident{}",
            s.read_mib(),
            s.read_mib() / per_tok,
            s.read_s,
            s.stall_s,
            pct(s.cache_hit_pct()),
            s.evictions,
            s.recycled,
            s.resident_bytes as f64 / 1048576.0,
            match s.repacked {
                0 => String::new(),
                n => format!(", {n} expert slices repacked as read"),
            }
        );
    }
    if s.substituted + s.dropped > 0 {
        eprintln!(
            "lossy: {} routed experts replaced by cached ones at a miss (expert_substitute), {} skipped (drop_cold)",
            s.substituted, s.dropped
        );
    }
    if s.cache_shrinks + s.cache_grows > 0 {
        eprintln!(
            "memory pressure: the expert cache shrank {} times and grew back {} times; its budget is {:.0} MiB at the end",
            s.cache_shrinks,
            s.cache_grows,
            s.budget_bytes as f64 / 1048576.0
        );
    }
    if s.predicted_routed > 0 {
        eprintln!(
            "prefetch: {} experts read ahead, {} misses served by them (overlap {}); prediction named {} of {} routed experts ({:.1}%)",
            s.prefetched,
            s.prefetch_used,
            pct(s.overlap_pct()),
            s.predicted_right,
            s.predicted_routed,
            100.0 * s.predicted_right as f64 / s.predicted_routed.max(1) as f64
        );
    }
    if d.tokens > 0 {
        eprintln!(
            "prefill-device: {} tokens, {} nodes, {:.1} MiB read ({:.1} MiB from the file, {} experts from the cache), stall {:.3} s, routed {}, demand {}, whole_fallback {}",
            d.tokens,
            d.nodes,
            d.read_mib(),
            d.file_read_mib(),
            d.cached_experts,
            d.stall_s,
            d.routed,
            d.demand,
            d.whole_fallback
        );
    }
}
