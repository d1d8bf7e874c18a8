//! Loading a model: checks the file before llama.cpp sees it, picks the devices, reports why a load
//! failed in words.
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use crate::error::{EngineError, Result};
use crate::ffi::batch::Batch;
use crate::ffi::buffer::BufferType;
use crate::ffi::context::{ContextParams, LlamaContext};
use crate::ffi::model::{KvOverride, LlamaModel, RawLoadParams};
use crate::ffi::registry::Device;
use crate::graph::{Capture, CaptureHook};
use crate::io::DirectReader;
use crate::options::LoadOptions;
use crate::stream::lean_load::{self, DenseMaps};
use crate::stream::Streamer;
use crate::telemetry::{LoadMode, LoadStats};
use crate::weights::table::WeightTable;

/// What a loaded model is.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ModelInfo {
    /// The file loaded.
    pub path: PathBuf,
    /// Bytes on disk (all shards).
    pub file_bytes: u64,
    /// `general.architecture`.
    pub arch: String,
    /// llama.cpp's description.
    pub desc: String,
    /// Layers.
    pub n_layer: u32,
    /// Embedding width.
    pub n_embd: u32,
    /// Vocabulary size.
    pub n_vocab: u32,
    /// Training context.
    pub n_ctx_train: u32,
    /// Experts per MoE layer (0 for dense models).
    pub n_expert: u32,
    /// Experts used per token, after any override (0 for dense models).
    pub n_expert_used: u32,
    /// Bytes of weights.
    pub weight_bytes: u64,
    /// Whether the model carries a chat template.
    pub has_chat_template: bool,
    /// The prefill device that joined the run, if one was asked for and opened.
    pub prefill_device: Option<String>,
}

/// What a load that read no expert did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeanLoadInfo {
    /// Bytes of dense weights bound to the engine's own mapping of the file.
    pub dense_bytes: u64,
    /// Optional tensors the architecture created that the file lacks and the graph still reads,
    /// bound to the value that makes their op an identity (zeros for a bias, ones for a scale).
    pub neutral_tensors: usize,
    /// References to such tensors cleared from the model's layers, so that the graph leaves
    /// their ops out as after llama.cpp's own load; `None` when the engine declined to (the
    /// neutral values then stand in for all of them).
    pub unlinked_tensors: Option<usize>,
}

/// A loaded model; sessions borrow it.
pub struct Model {
    // Dropped first: its regions back tensors of `raw`, which must not be computed on afterwards.
    pub(crate) stream: Option<Arc<Mutex<Streamer>>>,
    /// The prefill arena, when a device runs wide graphs (dropped before the model too).
    pub(crate) arena: Option<Arc<Mutex<crate::device::arena::Arena>>>,
    /// The prefill settings, when a device joined (sessions check their widths against them).
    pub(crate) prefill: Option<crate::options::PrefillOptions>,
    /// Where sessions move their KV cache and recurrent state (the prefill device's host buffer
    /// type), when the device computes on it.
    pub(crate) kv_home: Option<BufferType>,
    /// Pieces at least this wide run on the prefill device.
    pub(crate) prefill_min_tokens: usize,
    pub(crate) raw: LlamaModel,
    // After `raw`: the dense weights of a streamed load point into these mappings.
    dense_maps: Option<DenseMaps>,
    pub(crate) info: ModelInfo,
    pub(crate) template: Option<String>,
    warnings: Vec<String>,
    load_stats: LoadStats,
}

/// Runs one token through a throwaway context with the capture hook: learns every layer's
/// weights, expert matrices, routing and last nodes.
fn capture_graph(raw: &LlamaModel) -> Result<Capture> {
    let cap = Arc::new(Mutex::new(Capture::default()));
    let mut ctx = LlamaContext::new(
        raw,
        ContextParams {
            n_ctx: 256,
            n_batch: 1,
            n_ubatch: 1,
            n_outputs_max: 1,
            threads: 1,
            hook: Some(Box::new(CaptureHook(cap.clone()))),
            abort: Arc::new(AtomicBool::new(false)),
            persistent_threads: false,
            cpus: Vec::new(),
            n_seq_max: 1,
        },
    )
    .map_err(EngineError::Context)?;
    let mut b = Batch::new(1);
    b.push(0, 0, true);
    ctx.decode(&b, &mut raw.exec().lock())
        .map_err(EngineError::Decode)?;
    drop(ctx);
    let c = std::mem::take(&mut *cap.lock().map_err(|_| EngineError::HookPoisoned)?);
    Ok(c)
}

/// Where the KV cache and recurrent state of a run with prefill device `d` (named `name`) go,
/// and the line that says so once at load. They move into the device's host buffer type only
/// when the device's backend computes on that memory (Hexagon's, an integrated GPU's): a
/// discrete GPU's host buffer is pinned memory it copies from, so moving there gains nothing.
/// `stand_in` (a gate knob) takes the CPU's buffer type where the device offers none, so the move
/// itself runs on a machine without such a device.
fn kv_home(d: Device, name: &str, stand_in: bool) -> (Option<BufferType>, String) {
    let stays = |why: &str| {
        format!(
            "prefill device {name}: the KV cache and recurrent state stay in CPU memory ({why}); device graphs run their attention on the CPU"
        )
    };
    match BufferType::host_of(d) {
        Some(b) if b.computed_on_by(d) => (
            Some(b),
            format!(
                "prefill device {name}: the KV cache and recurrent state move into its host buffer type {} when a session opens",
                b.name()
            ),
        ),
        _ if stand_in => (
            Some(BufferType::cpu()),
            format!(
                "prefill device {name}: the KV cache and recurrent state move into a stand-in (the CPU buffer type) when a session opens"
            ),
        ),
        Some(b) => (
            None,
            stays(&format!(
                "its host buffer type {} is memory it copies from, not memory it computes on",
                b.name()
            )),
        ),
        None => (None, stays("it offers no host buffer type to move them into")),
    }
}

/// The devices a load lists, and what the prefill device brings.
struct Placed {
    /// llama.cpp's device list (empty: the CPU alone).
    devices: Vec<Device>,
    /// `n_gpu_layers`: 0, or -1 with an offload device.
    gpu_layers: i32,
    /// The prefill device's name, when it opened.
    prefill_device: Option<String>,
    /// The device the arena fills.
    arena_device: Option<Device>,
    /// Where a session's KV cache moves, with that device.
    kv_to: Option<BufferType>,
}

/// What llama.cpp's model became: the raw model, the dense mappings and capture of a lean load.
type Loaded = (LlamaModel, Option<DenseMaps>, Option<Capture>);

/// The streamer and the arena, shared with the sessions.
type Mechanisms = (
    Option<Arc<Mutex<Streamer>>>,
    Option<Arc<Mutex<crate::device::arena::Arena>>>,
);

/// `cache_mb = "auto"` on this machine: the plan's one formula ([`crate::plan`]) against the
/// memory available before the load, for sessions of the shape the caller will run.
#[derive(Debug, Clone, Copy)]
struct AutoCache {
    floor_mb: u64,
    available_mib: f64,
    fixed_mib: f64,
}

/// `opts` with an `auto` expert cache resolved to MiB by the plan, and how, when it was `auto`.
fn resolve_auto_cache(
    opts: &LoadOptions,
    session: &crate::options::SessionOptions,
    index: &crate::gguf::index::GgufIndex,
    placed: &Placed,
) -> (LoadOptions, Option<AutoCache>) {
    let mut resolved = opts.clone();
    let Some(st) = resolved.stream.as_mut() else {
        return (resolved, None);
    };
    let crate::options::CacheBudget::Auto { floor_mb } = st.cache else {
        return (resolved, None);
    };
    let prefill = match &placed.prefill_device {
        Some(d) => crate::plan::PrefillPlace {
            device: Some(d.clone()),
            reason: String::new(),
            cpu_because: None,
        },
        None => crate::plan::PrefillPlace::on_cpu(String::new()),
    };
    let plan = crate::plan::plan_with(
        crate::plan::ModelDims::of(index),
        prefill,
        opts,
        session,
        crate::plan::Memory::this_machine(floor_mb),
    );
    st.cache = crate::options::CacheBudget::Mib(plan.cache_mb);
    let auto = AutoCache {
        floor_mb,
        available_mib: plan.ram_mib,
        fixed_mib: plan.fixed_mib(),
    };
    (resolved, Some(auto))
}

/// The default, so the one a user may not know chose for them: under a tight memory cap the
/// floor and the rest of the plan can take everything and leave no cache at all.
fn auto_cache_warning(a: &AutoCache, st: &Streamer, warnings: &mut Vec<String>) {
    if st.budget_bytes > 0 {
        return;
    }
    warnings.push(format!(
        "cache_mb = auto: {:.0} MiB available at load, minus cache_floor_mb = {} MiB left to everything else and {:.0} MiB the rest of the plan holds (dense weights, KV cache, compute buffers), leaves no expert cache, below one token's routed experts ({:.1} MiB): every token reads all its experts; set cache_mb, or a cache_floor_mb that leaves room",
        a.available_mib,
        a.floor_mb,
        a.fixed_mib,
        st.token_bytes as f64 / 1048576.0,
    ));
}

/// Whether this load repacks (`LoadOptions::repacks`), and only where the weights fit: a repacked
/// tensor is an anonymous copy, so a resident model larger than the memory left would no longer
/// page from its file but be killed. Such a load keeps the file's layout and says so.
fn repack_fits(
    opts: &LoadOptions,
    index: &crate::gguf::index::GgufIndex,
    warnings: &mut Vec<String>,
) -> bool {
    if !opts.repacks() {
        return false;
    }
    let (need, left) = (
        index.total_file_bytes(),
        crate::stream::memory::available_bytes(),
    );
    if need > left {
        warnings.push(format!(
            "repack off: the model's {} MiB would be copied into memory, and {} MiB are available; its weights page from the file in their own layout",
            need >> 20,
            left >> 20
        ));
        return false;
    }
    true
}

/// `n_expert_used` as a metadata override, checked against the model's experts.
fn expert_override(
    opts: &LoadOptions,
    index: &crate::gguf::index::GgufIndex,
    arch: &str,
) -> Result<Vec<KvOverride>> {
    let Some(k) = opts.n_expert_used else {
        return Ok(Vec::new());
    };
    let n_expert = index.get_u64(&format!("{arch}.expert_count")).unwrap_or(0);
    if n_expert == 0 {
        return Err(EngineError::InvalidOption(format!(
            "n_expert_used = {k} but {} is not a mixture-of-experts model",
            opts.path.display()
        )));
    }
    if k == 0 || u64::from(k) > n_expert {
        return Err(EngineError::InvalidOption(format!(
            "n_expert_used = {k} is out of range: the model has {n_expert} experts"
        )));
    }
    Ok(vec![KvOverride::Int(
        format!("{arch}.expert_used_count"),
        i64::from(k),
    )])
}

/// Resolves the prefill and offload devices into llama.cpp's device list.
fn place_devices(opts: &LoadOptions, cpu: Device, warnings: &mut Vec<String>) -> Result<Placed> {
    // The prefill device joins as the only non-CPU device, with no layer assigned
    // (n_gpu_layers = 0): nothing runs there unless the engine hands it a graph.
    let mut placed = Placed {
        devices: Vec::new(),
        gpu_layers: 0,
        prefill_device: None,
        arena_device: None,
        kv_to: None,
    };
    if let Some(p) = &opts.prefill {
        match crate::device::resolve(&p.device) {
            crate::device::Resolution::Device(d, name) => {
                let (home, line) = kv_home(d, &name, p.gate().kv_stand_in);
                warnings.push(line);
                placed.kv_to = home;
                placed.devices.push(d);
                placed.arena_device = Some(d);
                placed.prefill_device = Some(name);
            }
            crate::device::Resolution::Cpu(why) => warnings.push(format!(
                "prefill device {}: {why}; the whole run stays on the CPU",
                p.device
            )),
        }
    }
    if let Some(name) = &opts.offload {
        match crate::device::resolve(name) {
            crate::device::Resolution::Device(d, _) => {
                placed.devices.push(d);
                placed.gpu_layers = -1;
            }
            crate::device::Resolution::Cpu(reason) => {
                return Err(EngineError::InvalidOption(format!("offload: {reason}")))
            }
        }
    }
    // The CPU is listed only beside an offload device, where it has always been (llama.cpp
    // splits the offloaded layers over the listed devices). Listed otherwise, it would gain
    // nothing and cost the context a second CPU backend: the scheduler computes on the
    // listed one, which the context's threadpool (`llama_attach_threadpool`, applied to its
    // own `backend_cpu`) never reaches, so every graph a streamed decode is cut into would
    // start and join its worker threads again.
    if placed.gpu_layers != 0 {
        placed.devices.push(cpu);
    }
    Ok(placed)
}

/// The lean load of a streamed model (header and dense weights, no expert), or `None` where
/// that path cannot build the model and the llama.cpp load must read the whole file.
fn load_lean(
    opts: &LoadOptions,
    index: &crate::gguf::index::GgufIndex,
    arch: &str,
    params: &RawLoadParams,
    warnings: &mut Vec<String>,
) -> Result<Option<(LlamaModel, DenseMaps, Capture)>> {
    let whole_file = |why: &str| {
        format!(
            "loading the whole file the llama.cpp way ({why}): the load reads every expert once"
        )
    };
    let unfilled = match &opts.stream {
        Some(so) if !so.llama_load => match lean_load::unsupported(index, arch) {
            None => lean_load::load_unfilled(index, params)?,
            Some(why) => {
                warnings.push(whole_file(&why));
                return Ok(None);
            }
        },
        _ => return Ok(None),
    };
    let capture = capture_graph(&unfilled.raw)?;
    let (mut raw, mut maps) = match unfilled.bind_dense(index, &capture)? {
        Ok(bound) => bound,
        Err(why) => {
            warnings.push(whole_file(&why.to_string()));
            return Ok(None);
        }
    };
    // Every absent tensor is optional: out of the graph with them, and the graph captured
    // again, as the sessions will build it.
    let capture = if maps.unlink_absent(&mut raw) > 0 {
        let c = capture_graph(&raw)?;
        maps.recount_neutral(&c);
        c
    } else {
        capture
    };
    if maps.unlinked().is_none() && maps.n_neutral() > 0 {
        warnings.push(format!(
            "{} optional tensors the file lacks stay in the graph as identity ops (zeros, ones): this llama.cpp's model structures were not what the engine checks for",
            maps.n_neutral()
        ));
    }
    Ok(Some((raw, maps, capture)))
}

/// The model as llama.cpp holds it: lean where it can be (a streamed model), else llama.cpp's
/// own load, which reads the whole file.
fn load_raw(
    opts: &LoadOptions,
    index: &crate::gguf::index::GgufIndex,
    arch: &str,
    params: &RawLoadParams,
    warnings: &mut Vec<String>,
) -> Result<Loaded> {
    if let Some((raw, maps, capture)) = load_lean(opts, index, arch, params, warnings)? {
        return Ok((raw, Some(maps), Some(capture)));
    }
    // Every shard llama.cpp maps: a page the storage fails to give is then an error.
    for (path, _) in index.files() {
        crate::ffi::mapped_fault::register(path);
    }
    let raw = LlamaModel::load(&opts.path, params).map_err(|reason| EngineError::ModelLoad {
        path: opts.path.clone(),
        reason: reason.to_string(),
    })?;
    Ok((raw, None, None))
}

/// One direct reader per model: the streamer's lanes first, then the arena loaders'.
fn open_reader(
    opts: &LoadOptions,
    index: &crate::gguf::index::GgufIndex,
    capture: &Capture,
    table: &WeightTable,
    arena_device: Option<Device>,
) -> Result<Option<Arc<DirectReader>>> {
    let Some(so) = &opts.stream else {
        return Ok(None);
    };
    let stream_lanes = Streamer::lanes(capture, so);
    let loader_lanes = match (arena_device, &opts.prefill) {
        (Some(_), Some(p)) => p.loaders.max(1),
        _ => 0,
    };
    let paths: Vec<_> = index.files().iter().map(|(p, _)| p.clone()).collect();
    let r = DirectReader::open(
        &paths,
        stream_lanes + loader_lanes,
        table.max_expert_bytes(),
    )
    .map_err(|source| {
        EngineError::Stream(crate::error::StreamError::Setup {
            what: "opening the model for direct reads",
            source,
        })
    })?;
    Ok(Some(Arc::new(r)))
}

/// What the user should know about the cache a streamer was given.
fn cache_warnings(st: &Streamer, budget: u64, warnings: &mut Vec<String>) {
    if budget > 0 && budget < st.token_bytes {
        warnings.push(format!(
            "expert cache of {} MiB is below one token's routed experts ({:.1} MiB): past this cliff a token reads most of its experts, and only the most used ones stay cached",
            budget >> 20,
            st.token_bytes as f64 / 1048576.0,
        ));
    }
    if st.direct.iter().any(|d| !d) {
        warnings.push("O_DIRECT is not usable on the model's file system; expert reads go through the page cache".into());
    }
}

/// The expert streamer over the model's regions, when the model streams.
#[allow(clippy::too_many_arguments)]
fn build_streamer(
    opts: &LoadOptions,
    raw: &LlamaModel,
    capture: &Capture,
    table: &WeightTable,
    reader: &Arc<DirectReader>,
    n_expert_used: u32,
    dense_maps: Option<&DenseMaps>,
    warnings: &mut Vec<String>,
) -> Result<Option<Arc<Mutex<Streamer>>>> {
    let Some(so) = &opts.stream else {
        return Ok(None);
    };
    // `auto` was resolved by the plan at the start of the load (`resolve_auto_cache`).
    let budget = so.cache.bytes(crate::stream::memory::available_bytes());
    let mut exec = raw.exec().lock();
    let mut st = Streamer::new(
        capture,
        table,
        so,
        budget,
        n_expert_used,
        reader.clone(),
        &mut exec.quiet(),
    )?;
    if opts.repacks_streamed_experts() {
        st.repack_weights(capture, &mut exec.quiet())?;
    }
    cache_warnings(&st, budget, warnings);
    if budget == 0 && so.cache_reserve_mb > 0 {
        warnings.push(format!(
            "cache_reserve_mb = {} does nothing without an expert cache (cache_mb = 0): there is nothing to give back",
            so.cache_reserve_mb
        ));
    }
    if so.dense_weights == crate::options::DenseWeights::Anon {
        if let Some(m) = dense_maps {
            m.release_file_pages();
        }
    }
    Ok(Some(Arc::new(Mutex::new(st))))
}

/// The streamer, then the prefill device's arena: after the streamer, since the host bindings
/// the arena restores are the streamer's.
#[allow(clippy::too_many_arguments)]
fn build_mechanisms(
    opts: &LoadOptions,
    raw: &LlamaModel,
    capture: Option<&Capture>,
    table: Option<&WeightTable>,
    reader: Option<&Arc<DirectReader>>,
    arena_device: Option<Device>,
    n_expert_used: u32,
    dense_maps: Option<&DenseMaps>,
    warnings: &mut Vec<String>,
) -> Result<Mechanisms> {
    let (Some(c), Some(table)) = (capture, table) else {
        return Ok((None, None));
    };
    let stream = match reader {
        Some(r) => build_streamer(opts, raw, c, table, r, n_expert_used, dense_maps, warnings)?,
        None => None,
    };
    let arena = match (arena_device, &opts.prefill) {
        (Some(d), Some(p)) => {
            let streamer = match &stream {
                Some(s) => Some(
                    s.lock()
                        .map_err(|_| EngineError::Stream(crate::error::StreamError::Poisoned))?,
                ),
                None => None,
            };
            let a = crate::device::arena::Arena::new(c, table, d, p, streamer.as_deref())
                .map_err(EngineError::Device)?;
            warnings.extend(a.refusals());
            Some(Arc::new(Mutex::new(a)))
        }
        _ => None,
    };
    Ok((stream, arena))
}

/// A count from the model's metadata (`<arch>.<key>`), 0 when absent.
fn meta_u32(raw: &LlamaModel, arch: &str, key: &str) -> u32 {
    raw.meta(&format!("{arch}.{key}"))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

impl Model {
    /// Loads a model as `opts` says, for sessions of the default shape ([`Model::load_for`]).
    pub fn load(opts: &LoadOptions) -> Result<Model> {
        Self::load_for(opts, &crate::options::SessionOptions::default())
    }

    /// Loads a model as `opts` says: the file checked, the devices placed, llama.cpp's model
    /// (lean or whole), the capture and weight table, then the streamer and the arena. An `auto`
    /// expert cache is planned for sessions of `session`'s shape (its context, batch and output
    /// rows size the KV cache and compute buffers the cache leaves room for).
    pub fn load_for(opts: &LoadOptions, session: &crate::options::SessionOptions) -> Result<Model> {
        let started = std::time::Instant::now();
        let read_before = crate::telemetry::storage_read_bytes();
        opts.validate()?;
        let path = &opts.path;
        let index = crate::gguf::index::GgufIndex::open(path)?;
        // What llama.cpp would assert on (abort the process) is refused here, with a reason.
        crate::gguf::check::check(path, index.header())?;
        let arch = index.arch().unwrap_or_default();
        let cpu = Device::cpu().ok_or_else(|| EngineError::ModelLoad {
            path: path.clone(),
            reason: "this build has no CPU backend".into(),
        })?;
        let kv_overrides = expert_override(opts, &index, &arch)?;
        let mut warnings = Vec::new();
        let placed = place_devices(opts, cpu, &mut warnings)?;
        let (resolved, auto_cache) = resolve_auto_cache(opts, session, &index, &placed);
        let opts = &resolved;
        let params = RawLoadParams {
            devices: placed.devices.clone(),
            mmap: true,
            kv_overrides,
            gpu_layers: placed.gpu_layers,
            repack: repack_fits(opts, &index, &mut warnings),
        };
        let (raw, dense_maps, lean_capture) =
            load_raw(opts, &index, &arch, &params, &mut warnings)?;
        let n_expert_used = opts
            .n_expert_used
            .unwrap_or_else(|| meta_u32(&raw, &arch, "expert_used_count"));
        let capture = match lean_capture {
            Some(c) => Some(c),
            None if opts.stream.is_some() || placed.arena_device.is_some() => {
                Some(capture_graph(&raw)?)
            }
            None => None,
        };
        // The expert matrices and where their experts are in the file, found once for the
        // streamer and the arena both.
        let table = capture.as_ref().map(|c| WeightTable::new(c, &index));
        let reader = match (&capture, &table) {
            (Some(c), Some(t)) => open_reader(opts, &index, c, t, placed.arena_device)?,
            _ => None,
        };
        let (stream, arena) = build_mechanisms(
            opts,
            &raw,
            capture.as_ref(),
            table.as_ref(),
            reader.as_ref(),
            placed.arena_device,
            n_expert_used,
            dense_maps.as_ref(),
            &mut warnings,
        )?;
        if let (Some(a), Some(st)) = (auto_cache, &stream) {
            if let Ok(st) = st.lock() {
                auto_cache_warning(&a, &st, &mut warnings);
            }
        }
        let load_stats = LoadStats {
            mode: if dense_maps.is_some() {
                LoadMode::Lean
            } else {
                LoadMode::Llama
            },
            seconds: started.elapsed().as_secs_f64(),
            read_bytes: read_before
                .zip(crate::telemetry::storage_read_bytes())
                .map(|(a, b)| b.saturating_sub(a)),
            graph_nodes: capture.as_ref().map(|c| c.nodes.len()),
            repacked: {
                let (tensors, bytes) = raw.repacked();
                crate::telemetry::Repacked { tensors, bytes }
            },
        };
        Ok(Self::assemble(
            opts,
            &index,
            arch,
            placed,
            raw,
            dense_maps,
            (stream, arena),
            n_expert_used,
            warnings,
            load_stats,
        ))
    }

    /// The loaded parts put together, with what the model reports about itself.
    #[allow(clippy::too_many_arguments)]
    fn assemble(
        opts: &LoadOptions,
        index: &crate::gguf::index::GgufIndex,
        arch: String,
        placed: Placed,
        raw: LlamaModel,
        dense_maps: Option<DenseMaps>,
        (stream, arena): Mechanisms,
        n_expert_used: u32,
        warnings: Vec<String>,
        load_stats: LoadStats,
    ) -> Model {
        let prefill_device_joined = arena.is_some();
        let template = raw.chat_template();
        let info = ModelInfo {
            path: opts.path.clone(),
            file_bytes: index.total_file_bytes(),
            n_expert: meta_u32(&raw, &arch, "expert_count"),
            arch,
            desc: raw.desc(),
            n_layer: raw.n_layer(),
            n_embd: raw.n_embd(),
            n_vocab: raw.vocab().n_tokens() as u32,
            n_ctx_train: raw.n_ctx_train(),
            n_expert_used,
            weight_bytes: raw.size(),
            has_chat_template: template.is_some(),
            prefill_device: placed.prefill_device,
        };
        Model {
            stream,
            arena,
            prefill: opts.prefill.clone().filter(|_| prefill_device_joined),
            kv_home: placed.kv_to.filter(|_| prefill_device_joined),
            prefill_min_tokens: opts
                .prefill
                .as_ref()
                .map(|p| p.min_tokens.max(1) as usize)
                .unwrap_or(usize::MAX),
            raw,
            dense_maps,
            info,
            template,
            warnings,
            load_stats,
        }
    }

    /// What was loaded.
    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    /// Things the user should know about this load (a cache below the cliff, no O_DIRECT, where
    /// prefill runs).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The device-prefill profiling report since the last call (`explain`); `None` when the
    /// mode is off or no device joined.
    pub fn explain_prefill(&self) -> Option<crate::device::explain::ExplainReport> {
        self.arena
            .as_ref()
            .and_then(|a| a.lock().ok().and_then(|mut a| a.take_explain()))
    }

    /// Cumulative expert-streaming counters (zero when not streaming).
    pub fn stream_counters(&self) -> crate::telemetry::StreamCounters {
        self.stream
            .as_ref()
            .and_then(|s| s.lock().ok().map(|s| s.counters()))
            .unwrap_or_default()
    }

    /// Tells the expert streamer whether what runs next is a prompt or decode (its routing
    /// trace records it); at the end of a decode, writes out what the trace has buffered.
    pub fn set_stream_phase(&self, phase: crate::stream::trace::Phase) -> crate::error::Result<()> {
        let Some(s) = &self.stream else {
            return Ok(());
        };
        let mut s = s
            .lock()
            .map_err(|_| EngineError::Stream(crate::stream::StreamError::Poisoned))?;
        s.set_phase(phase);
        if phase == crate::stream::trace::Phase::Prompt {
            s.flush_trace().map_err(EngineError::Stream)?;
        }
        Ok(())
    }

    /// Changes the lossy routing knobs of a streamed model between calls, checked against their
    /// ranges: a gate warms the cache with them off, then turns them on (engine tests only).
    #[cfg(feature = "test-support")]
    pub fn set_lossy(&self, expert_substitute: f64, drop_cold: f64) -> crate::error::Result<()> {
        let knobs = crate::stream::lossy::Knobs {
            substitute: crate::limits::EXPERT_SUBSTITUTE.check(expert_substitute)?,
            drop_cold: crate::limits::DROP_COLD.check(drop_cold)?,
        };
        if let Some(s) = &self.stream {
            if let Ok(mut s) = s.lock() {
                s.set_knobs(knobs);
            }
        }
        Ok(())
    }

    /// Cumulative prefill-device counters (zero when no device runs graphs).
    pub fn prefill_dev_counters(&self) -> crate::telemetry::PrefillDevCounters {
        self.arena
            .as_ref()
            .and_then(|a| a.lock().ok().map(|a| a.counters()))
            .unwrap_or_default()
    }

    /// How the prefill arena laid the model out, when a device runs wide graphs.
    pub fn arena_layout(&self) -> Option<crate::device::arena::ArenaLayout> {
        self.arena
            .as_ref()
            .and_then(|a| a.lock().ok().map(|a| a.layout()))
    }

    /// What the load cost and how it ran.
    pub fn load_stats(&self) -> LoadStats {
        self.load_stats
    }

    /// How a streamed model loaded without reading its experts (`None`: llama.cpp's load ran).
    pub fn lean_load(&self) -> Option<LeanLoadInfo> {
        self.dense_maps.as_ref().map(|m| LeanLoadInfo {
            dense_bytes: m.dense_bytes(),
            neutral_tensors: m.n_neutral(),
            unlinked_tensors: m.unlinked(),
        })
    }

    /// The expert cache budget in bytes (0 = none), when streaming.
    pub fn stream_budget_bytes(&self) -> Option<u64> {
        self.stream
            .as_ref()
            .and_then(|s| s.lock().ok().map(|s| s.budget_bytes))
    }

    /// Tokenizes `text` (BOS added where the model asks for it).
    pub fn tokenize(&self, text: &str, add_special: bool) -> Result<Vec<i32>> {
        self.raw
            .vocab()
            .tokenize(text, add_special, add_special)
            .map_err(EngineError::Tokenize)
    }

    /// The bytes a token sequence stands for.
    pub fn detokenize(&self, tokens: &[i32]) -> Result<Vec<u8>> {
        Ok(self.raw.vocab().detokenize(tokens, false)?)
    }

    /// The chat template, if the model carries one.
    pub fn chat_template(&self) -> Option<&str> {
        self.template.as_deref()
    }

    /// Renders `user` as one user message with the model's template, reasoning off where the
    /// template has a thinking block; the text unchanged when the model has no usable template.
    pub fn render_user_message(&self, user: &str) -> Result<String> {
        crate::chat::render_user_message(self.template.as_deref(), user)
    }
}
