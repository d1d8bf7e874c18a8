//! A model's load, phase by phase: the file checked and the devices placed ([`Loader::open`]),
//! llama.cpp's model built (lean, or llama.cpp's own load), the graph captured and its weight
//! table found, then the streamer and the prefill arena, put together into a [`Model`].
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::device::arena::Arena;
use crate::error::{EngineError, Result, StreamError};
use crate::ffi::batch::Batch;
use crate::ffi::context::{ContextParams, LlamaContext};
use crate::ffi::model::{KvOverride, LlamaModel, RawLoadParams};
use crate::ffi::registry::Device;
use crate::gguf::index::GgufIndex;
use crate::graph::{Capture, CaptureHook};
use crate::io::DirectReader;
use crate::options::{CacheBudget, LoadOptions, SessionOptions};
use crate::plan::{Plan, PrefillPlace};
use crate::stream::lean_load::{self, DenseMaps};
use crate::stream::{Experts, Streamer};
use crate::telemetry::{LoadMode, LoadStats};
use crate::weights::table::WeightTable;

use super::place::{place_devices, Placed};
use super::warning::LoadWarning;
use super::{Model, ModelInfo};

/// A load under way: what the first phase found, and what the user should hear about it.
pub(super) struct Loader {
    /// The options, with an `auto` expert cache resolved to MiB.
    opts: LoadOptions,
    index: GgufIndex,
    /// `general.architecture`.
    arch: String,
    placed: Placed,
    /// How the cache was planned, when it was `auto`.
    auto_cache: Option<AutoCache>,
    /// What llama.cpp's load is asked for.
    params: RawLoadParams,
    warnings: Vec<LoadWarning>,
    started: Instant,
    /// Bytes read from storage before the load, where the kernel says.
    read_before: Option<u64>,
}

/// What llama.cpp's model became: the raw model, and with a lean load the dense weights'
/// mappings and the graph captured on the way.
struct Raw {
    model: LlamaModel,
    dense_maps: Option<DenseMaps>,
    capture: Option<Capture>,
}

/// What the streamer and the arena are built over: the graph, its expert matrices and where
/// their experts are in the file (found once for both), and the model's direct reader when it
/// streams.
struct Graph {
    capture: Capture,
    table: WeightTable,
    reader: Option<Arc<DirectReader>>,
}

/// The streamer and the arena, shared with the sessions.
struct Mechanisms {
    stream: Option<Arc<Mutex<Streamer>>>,
    arena: Option<Arc<Mutex<Arena>>>,
}

/// `cache_mb = "auto"` on this machine: the plan's one formula ([`crate::plan`]) against the
/// memory available before the load, for sessions of the shape the caller will run.
#[derive(Debug, Clone, Copy)]
struct AutoCache {
    floor_mb: u64,
    available_mib: f64,
    fixed_mib: f64,
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

/// Where a load's plan comes from.
pub(super) enum PlanSource<'a> {
    /// Made before the load (a profile's placement): taken as given.
    Given(&'a Plan),
    /// Made at the start of the load, against this machine's memory, for sessions of this shape;
    /// the prefill place as decided by the caller, or resolved then.
    ThisMachine(&'a SessionOptions, Option<&'a PrefillPlace>),
}

impl PlanSource<'_> {
    /// The plan: the given one, or one made now from the file's header (the prefill device
    /// resolved here, once, and not again by the load).
    fn plan(&self, opts: &LoadOptions, index: &GgufIndex) -> Plan {
        match self {
            PlanSource::Given(p) => (*p).clone(),
            PlanSource::ThisMachine(session, prefill) => crate::plan::plan_here(
                crate::plan::ModelDims::of(index),
                prefill.map_or_else(|| PrefillPlace::of(opts), |p| p.clone()),
                opts,
                session,
            ),
        }
    }
}

/// `opts` with an `auto` expert cache resolved to the plan's `cache_mb`, and how, when it was
/// `auto`: the one formula ([`crate::plan`]), never a second one at the streamer.
fn resolve_auto_cache(opts: &LoadOptions, plan: &Plan) -> (LoadOptions, Option<AutoCache>) {
    let mut resolved = opts.clone();
    let Some(st) = resolved.stream.as_mut() else {
        return (resolved, None);
    };
    let CacheBudget::Auto { floor_mb } = st.cache else {
        return (resolved, None);
    };
    st.cache = CacheBudget::Mib(plan.cache_mb);
    let auto = AutoCache {
        floor_mb,
        available_mib: plan.ram_mib,
        fixed_mib: plan.fixed_mib(),
    };
    (resolved, Some(auto))
}

/// Whether this load repacks (`LoadOptions::repacks`), and only where the weights fit: a repacked
/// tensor is an anonymous copy, so a resident model larger than the memory left would no longer
/// page from its file but be killed. Such a load keeps the file's layout and says so.
fn repack_fits(opts: &LoadOptions, index: &GgufIndex, warnings: &mut Vec<LoadWarning>) -> bool {
    if !opts.repacks() {
        return false;
    }
    // Stock llama.cpp repacks whatever the memory left: the baseline is what it really does.
    if opts.stock {
        return true;
    }
    let (need, left) = (
        index.total_file_bytes(),
        crate::stream::memory::available_bytes(),
    );
    if need > left {
        warnings.push(LoadWarning::RepackOff { need, left });
        return false;
    }
    true
}

/// `n_expert_used` as a metadata override, checked against the model's experts.
fn expert_override(opts: &LoadOptions, index: &GgufIndex, arch: &str) -> Result<Vec<KvOverride>> {
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

/// A count from the model's metadata (`<arch>.<key>`), 0 when absent.
fn meta_u32(raw: &LlamaModel, arch: &str, key: &str) -> u32 {
    raw.meta(&format!("{arch}.{key}"))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

impl Loader {
    /// The first phase: the options checked, the file indexed and checked before llama.cpp sees
    /// it, the devices placed, an `auto` expert cache planned for sessions of `session`'s shape,
    /// and what llama.cpp's load will be asked for.
    pub(super) fn open(opts: &LoadOptions, source: PlanSource) -> Result<Self> {
        let started = Instant::now();
        let read_before = crate::telemetry::storage_read_bytes();
        opts.validate()?;
        let path = &opts.path;
        let index = GgufIndex::open(path)?;
        // What llama.cpp would assert on (abort the process) is refused here, with a reason.
        crate::gguf::check::check(path, index.header())?;
        let arch = index.arch().unwrap_or_default();
        let cpu = Device::cpu().ok_or_else(|| EngineError::ModelLoad {
            path: path.clone(),
            reason: "this build has no CPU backend".into(),
        })?;
        let kv_overrides = expert_override(opts, &index, &arch)?;
        let mut warnings = Vec::new();
        let plan = source.plan(opts, &index);
        let placed = place_devices(opts, &plan.prefill, cpu, &mut warnings)?;
        let (opts, auto_cache) = resolve_auto_cache(opts, &plan);
        let params = RawLoadParams {
            devices: placed.devices.clone(),
            mmap: true,
            kv_overrides,
            gpu_layers: placed.gpu_layers,
            repack: repack_fits(&opts, &index, &mut warnings),
        };
        Ok(Self {
            opts,
            index,
            arch,
            placed,
            auto_cache,
            params,
            warnings,
            started,
            read_before,
        })
    }

    /// The rest of the load: llama.cpp's model (lean or whole), the capture and weight table,
    /// then the streamer and the arena.
    pub(super) fn load(mut self) -> Result<Model> {
        let mut raw = self.load_raw()?;
        let n_expert_used = self
            .opts
            .n_expert_used
            .unwrap_or_else(|| meta_u32(&raw.model, &self.arch, "expert_used_count"));
        let graph = self.graph(&mut raw)?;
        let mechanisms = match &graph {
            Some(g) => self.mechanisms(&raw, g, n_expert_used)?,
            None => Mechanisms {
                stream: None,
                arena: None,
            },
        };
        self.warn_auto_cache(&mechanisms);
        let load_stats = self.stats(&raw, graph.as_ref());
        Ok(self.assemble(raw, mechanisms, n_expert_used, load_stats))
    }

    /// The lean load of a streamed model (header and dense weights, no expert), or `None` where
    /// that path cannot build the model and the llama.cpp load must read the whole file.
    fn load_lean(&mut self) -> Result<Option<Raw>> {
        let unfilled = match &self.opts.stream {
            Some(so) if !so.llama_load => match lean_load::unsupported(&self.index, &self.arch) {
                None => lean_load::load_unfilled(&self.index, &self.params)?,
                Some(why) => {
                    self.warnings.push(LoadWarning::WholeFile { why });
                    return Ok(None);
                }
            },
            _ => return Ok(None),
        };
        let capture = capture_graph(&unfilled.raw)?;
        let (mut raw, mut maps) = match unfilled.bind_dense(&self.index, &capture)? {
            Ok(bound) => bound,
            Err(why) => {
                let why = why.to_string();
                self.warnings.push(LoadWarning::WholeFile { why });
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
            let n = maps.n_neutral();
            self.warnings.push(LoadWarning::NeutralTensors { n });
        }
        Ok(Some(Raw {
            model: raw,
            dense_maps: Some(maps),
            capture: Some(capture),
        }))
    }

    /// The model as llama.cpp holds it: lean where it can be (a streamed model), else llama.cpp's
    /// own load, which reads the whole file.
    fn load_raw(&mut self) -> Result<Raw> {
        if let Some(lean) = self.load_lean()? {
            return Ok(lean);
        }
        // Every shard llama.cpp maps: a page the storage fails to give is then an error.
        for (path, _) in self.index.files() {
            crate::ffi::mapped_fault::register(path);
        }
        let path = &self.opts.path;
        let model =
            LlamaModel::load(path, &self.params).map_err(|reason| EngineError::ModelLoad {
                path: path.clone(),
                reason: reason.to_string(),
            })?;
        Ok(Raw {
            model,
            dense_maps: None,
            capture: None,
        })
    }

    /// The graph (the lean load's capture, or one captured now) and its weight table, where the
    /// model streams or a prefill device joins; and the direct reader when it streams.
    fn graph(&self, raw: &mut Raw) -> Result<Option<Graph>> {
        let capture = match raw.capture.take() {
            Some(c) => c,
            None if self.opts.stream.is_some() || self.placed.arena_device.is_some() => {
                capture_graph(&raw.model)?
            }
            None => return Ok(None),
        };
        let table = WeightTable::new(&capture, &self.index);
        let reader = self.open_reader(&capture, &table)?;
        Ok(Some(Graph {
            capture,
            table,
            reader,
        }))
    }

    /// One direct reader per model: the streamer's lanes first, then the arena loaders'.
    fn open_reader(
        &self,
        capture: &Capture,
        table: &WeightTable,
    ) -> Result<Option<Arc<DirectReader>>> {
        let Some(so) = &self.opts.stream else {
            return Ok(None);
        };
        let stream_lanes = Streamer::lanes(capture, so);
        let loader_lanes = match (self.placed.arena_device, &self.opts.prefill) {
            (Some(_), Some(p)) => p.loaders.max(1),
            _ => 0,
        };
        let paths: Vec<_> = self.index.files().iter().map(|(p, _)| p.clone()).collect();
        let r = DirectReader::open(
            &paths,
            stream_lanes + loader_lanes,
            table.max_expert_bytes(),
        )
        .map_err(|source| {
            EngineError::Stream(StreamError::Setup {
                what: "opening the model for direct reads",
                source,
            })
        })?;
        Ok(Some(Arc::new(r)))
    }

    /// The streamer, then the prefill device's arena: after the streamer, since the host bindings
    /// the arena restores are the streamer's.
    fn mechanisms(&mut self, raw: &Raw, graph: &Graph, n_expert_used: u32) -> Result<Mechanisms> {
        let stream = match &graph.reader {
            Some(r) => self.build_streamer(raw, graph, r, n_expert_used)?,
            None => None,
        };
        let arena = self.build_arena(graph, stream.as_ref())?;
        Ok(Mechanisms { stream, arena })
    }

    /// The expert streamer over the model's regions, when the model streams.
    fn build_streamer(
        &mut self,
        raw: &Raw,
        graph: &Graph,
        reader: &Arc<DirectReader>,
        n_expert_used: u32,
    ) -> Result<Option<Arc<Mutex<Streamer>>>> {
        let Some(so) = &self.opts.stream else {
            return Ok(None);
        };
        // `auto` was resolved by the plan at the start of the load (`resolve_auto_cache`).
        let CacheBudget::Mib(mib) = so.cache else {
            return Err(EngineError::InvalidOption(
                "cache_mb = auto reached the streamer without a plan".into(),
            ));
        };
        let budget = mib << 20;
        let anon = so.dense_weights == crate::options::DenseWeights::Anon;
        let mut exec = raw.model.exec().lock();
        let experts = Experts {
            capture: &graph.capture,
            table: &graph.table,
            n_expert_used,
        };
        let mut st = Streamer::new(experts, so, budget, reader.clone(), &mut exec.quiet())?;
        if self.opts.repacks_streamed_experts() {
            st.repack_weights(&graph.capture, &mut exec.quiet())?;
        }
        self.cache_warnings(&st, budget);
        if anon {
            if let Some(m) = &raw.dense_maps {
                m.release_file_pages();
            }
        }
        Ok(Some(Arc::new(Mutex::new(st))))
    }

    /// What the user should know about the cache a streamer was given.
    fn cache_warnings(&mut self, st: &Streamer, budget: u64) {
        let token_bytes = st.token_bytes();
        if budget > 0 && budget < token_bytes {
            let w = LoadWarning::BelowCliff {
                budget,
                token_bytes,
            };
            self.warnings.push(w);
        }
        if st.direct().iter().any(|d| !d) {
            self.warnings.push(LoadWarning::NoDirect);
        }
        let reserve_mb = self
            .opts
            .stream
            .as_ref()
            .map_or(0, |so| so.cache_reserve_mb);
        if budget == 0 && reserve_mb > 0 {
            self.warnings
                .push(LoadWarning::ReserveWithoutCache { reserve_mb });
        }
    }

    /// The prefill device's arena, when a device joined.
    fn build_arena(
        &mut self,
        graph: &Graph,
        stream: Option<&Arc<Mutex<Streamer>>>,
    ) -> Result<Option<Arc<Mutex<Arena>>>> {
        let (Some(d), Some(p)) = (self.placed.arena_device, &self.opts.prefill) else {
            return Ok(None);
        };
        let streamer = match stream {
            Some(s) => Some(
                s.lock()
                    .map_err(|_| EngineError::Stream(StreamError::Poisoned))?,
            ),
            None => None,
        };
        let a = Arena::new(&graph.capture, &graph.table, d, p, streamer.as_deref())
            .map_err(EngineError::Device)?;
        self.warnings
            .extend(a.refusals().into_iter().map(LoadWarning::Arena));
        Ok(Some(Arc::new(Mutex::new(a))))
    }

    /// `cache_mb = auto` left no cache: the default, so the one a user may not know chose for
    /// them; under a tight memory cap the floor and the rest of the plan can take everything.
    fn warn_auto_cache(&mut self, mechanisms: &Mechanisms) {
        let (Some(a), Some(st)) = (self.auto_cache, &mechanisms.stream) else {
            return;
        };
        let Ok(st) = st.lock() else {
            return;
        };
        if st.budget_bytes() > 0 {
            return;
        }
        self.warnings.push(LoadWarning::AutoNoCache {
            available_mib: a.available_mib,
            floor_mb: a.floor_mb,
            fixed_mib: a.fixed_mib,
            token_bytes: st.token_bytes(),
        });
    }

    /// What the load cost and how it ran.
    fn stats(&self, raw: &Raw, graph: Option<&Graph>) -> LoadStats {
        LoadStats {
            mode: if raw.dense_maps.is_some() {
                LoadMode::Lean
            } else {
                LoadMode::Llama
            },
            seconds: self.started.elapsed().as_secs_f64(),
            read_bytes: self
                .read_before
                .zip(crate::telemetry::storage_read_bytes())
                .map(|(a, b)| b.saturating_sub(a)),
            graph_nodes: graph.map(|g| g.capture.nodes.len()),
            repacked: {
                let (tensors, bytes) = raw.model.repacked();
                crate::telemetry::Repacked { tensors, bytes }
            },
        }
    }

    /// The loaded parts put together, with what the model reports about itself.
    fn assemble(
        self,
        raw: Raw,
        Mechanisms { stream, arena }: Mechanisms,
        n_expert_used: u32,
        load_stats: LoadStats,
    ) -> Model {
        let opts = &self.opts;
        let prefill_device_joined = arena.is_some();
        let raw_model = raw.model;
        let template = raw_model.chat_template();
        let info = ModelInfo {
            path: opts.path.clone(),
            file_bytes: self.index.total_file_bytes(),
            n_expert: meta_u32(&raw_model, &self.arch, "expert_count"),
            arch: self.arch,
            desc: raw_model.desc(),
            n_layer: raw_model.n_layer(),
            n_embd: raw_model.n_embd(),
            n_vocab: raw_model.vocab().n_tokens() as u32,
            n_ctx_train: raw_model.n_ctx_train(),
            n_expert_used,
            weight_bytes: raw_model.size(),
            has_chat_template: template.is_some(),
            prefill_device: self.placed.prefill_device,
        };
        Model {
            stream,
            arena,
            prefill: opts.prefill.clone().filter(|_| prefill_device_joined),
            kv_home: self.placed.kv_to.filter(|_| prefill_device_joined),
            prefill_min_tokens: opts
                .prefill
                .as_ref()
                .map(|p| p.min_tokens.max(1) as usize)
                .unwrap_or(usize::MAX),
            raw: raw_model,
            stock: opts.stock,
            dense_maps: raw.dense_maps,
            info,
            template,
            warnings: self.warnings.iter().map(ToString::to_string).collect(),
            load_stats,
        }
    }
}
