//! Placement before loading: which device prefills (or why the CPU does), and the memory budget
//! (expert cache, arena slots, compute buffers, KV cache, dense weights) against RAM minus the
//! floor, where `cache_mb = auto` resolves. Reads only the GGUF header, never the weights.
pub mod cores;

use std::path::Path;

use bmoe_engine::gguf::index::GgufIndex;

use crate::config::profile::{Hexagon, Profile};
use crate::config::settings::{CacheMb, Settings};

const MIB: f64 = (1u64 << 20) as f64;

/// Why a configuration cannot be placed.
#[derive(Debug, thiserror::Error)]
pub enum PlacementError {
    /// The model header could not be read.
    #[error("{0}")]
    Model(#[from] bmoe_engine::EngineError),
    /// The budget does not fit.
    #[error("memory budget does not fit on profile {profile}: {detail}\n{table}")]
    Budget {
        /// Profile name.
        profile: String,
        /// The numbers, in one line.
        detail: String,
        /// The whole table.
        table: String,
        /// What would fit (`cache_mb <= N fits, or cache_mb = "auto"`).
        help: String,
    },
    /// `cpus` names cores this process cannot use.
    #[error("{0}")]
    Cpus(String),
}

impl PlacementError {
    /// What would fix it, for a `help:` line.
    pub fn help(&self) -> Option<&str> {
        match self {
            PlacementError::Budget { help, .. } => Some(help),
            PlacementError::Model(_) | PlacementError::Cpus(_) => None,
        }
    }
}

/// The shape of the model, from its GGUF header.
#[derive(Debug, Clone, Default)]
pub struct ModelDims {
    /// `general.architecture`.
    pub arch: String,
    /// Layers.
    pub n_layer: u64,
    /// Embedding width.
    pub n_embd: u64,
    /// Bytes of K and V (f16) per token of context, all layers with an attention cache.
    pub kv_bytes_per_token: u64,
    /// Layers with an attention cache.
    pub n_kv_layers: u64,
    /// Bytes of the recurrent state of one sequence, all state-space layers.
    pub recurrent_bytes: u64,
    /// Layers with a recurrent state (state-space layers).
    pub n_recurrent_layers: u64,
    /// Experts per layer (0 = dense).
    pub n_expert: u64,
    /// Experts per token.
    pub n_expert_used: u64,
    /// Expert FFN width.
    pub n_ff_exp: u64,
    /// Training context.
    pub n_ctx_train: u64,
    /// Upper bound of the vocabulary (token embedding bytes / width).
    pub n_vocab_max: u64,
    /// Bytes on disk.
    pub file_bytes: u64,
    /// Bytes of routed expert tensors.
    pub expert_bytes: u64,
    /// Bytes of the largest layer.
    pub max_layer_bytes: u64,
    /// Bytes of the largest layer's expert matrices.
    pub max_layer_expert_bytes: u64,
    /// Start of the tensor data in the first shard (end of the header).
    pub data_start: u64,
}

/// Reads the model's dimensions from its header.
pub fn model_dims(path: &Path) -> Result<ModelDims, bmoe_engine::EngineError> {
    let idx = GgufIndex::open(path)?;
    let arch = idx.arch().unwrap_or_default();
    let k = |s: &str| idx.get_u64(&format!("{arch}.{s}"));
    let n_embd = k("embedding_length").unwrap_or(0);
    // The engine's reading of the header: which tensors are experts, which layers keep K and V.
    let layers = idx.layers();
    let mut d = ModelDims {
        n_layer: layers.len() as u64,
        n_embd,
        kv_bytes_per_token: layers.iter().map(|l| l.kv_bytes_per_token).sum(),
        n_kv_layers: layers.iter().filter(|l| l.kv_bytes_per_token > 0).count() as u64,
        recurrent_bytes: layers.iter().map(|l| l.recurrent_bytes).sum(),
        n_recurrent_layers: layers.iter().filter(|l| l.recurrent_bytes > 0).count() as u64,
        n_expert: k("expert_count").unwrap_or(0),
        n_expert_used: k("expert_used_count").unwrap_or(0),
        n_ff_exp: k("expert_feed_forward_length").unwrap_or(0),
        n_ctx_train: k("context_length").unwrap_or(0),
        file_bytes: idx.total_file_bytes(),
        expert_bytes: layers.iter().map(|l| l.expert_bytes).sum(),
        max_layer_bytes: layers.iter().map(|l| l.bytes).max().unwrap_or(0),
        max_layer_expert_bytes: layers.iter().map(|l| l.expert_bytes).max().unwrap_or(0),
        arch: arch.clone(),
        ..ModelDims::default()
    };
    if let Some(t) = idx.get("token_embd.weight") {
        d.n_vocab_max = t.size / n_embd.max(1);
    }
    d.data_start = idx
        .tensor_infos()
        .iter()
        .filter_map(|i| idx.get(&i.name))
        .filter(|t| t.file == 0)
        .map(|t| t.offset)
        .min()
        .unwrap_or(0);
    Ok(d)
}

/// Where prefill runs, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct PrefillPlace {
    /// The device kept, or `None` for the CPU.
    pub device: Option<String>,
    /// Why, in words.
    pub reason: String,
    /// Why the CPU runs prefill, when it does (the `reason` without its `CPU (...)` frame).
    pub cpu_because: Option<String>,
}

impl PrefillPlace {
    /// Prefill on the CPU, for this reason.
    fn on_cpu(why: String) -> Self {
        PrefillPlace {
            device: None,
            reason: format!("CPU ({why})"),
            cpu_because: Some(why),
        }
    }
}

/// Decides the prefill device: named in the values, allowed by the profile's NPU generation, and
/// present in this build's device registry.
pub fn place_prefill(profile: &Profile, s: &Settings) -> PrefillPlace {
    let Some(name) = s.device_name() else {
        return PrefillPlace::on_cpu("no prefill device configured".into());
    };
    let cpu = PrefillPlace::on_cpu;
    // ggml names its Hexagon devices HTP<n>; the profile's generation decides whether they can run.
    if name.to_ascii_uppercase().starts_with("HTP") {
        if profile.hexagon == Hexagon::None {
            return cpu(format!(
                "{name} is a Hexagon NPU but profile {} has none (hexagon = \"none\")",
                profile.name
            ));
        }
        if profile.hexagon < Hexagon::MIN_PREFILL {
            return cpu(format!(
                "Hexagon {} is older than {}: {name} refused for prefill",
                profile.hexagon,
                Hexagon::MIN_PREFILL
            ));
        }
    }
    in_registry(name)
}

/// Looks a device name up in this build's ggml registry: the device, or the CPU and why.
pub fn in_registry(name: &str) -> PrefillPlace {
    let devices = bmoe_engine::devices();
    match devices.iter().find(|d| d.name.eq_ignore_ascii_case(name)) {
        None => PrefillPlace::on_cpu(format!(
            "{name} is not in this build's registry, which has: {}",
            devices
                .iter()
                .map(|d| d.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )),
        Some(d) => PrefillPlace {
            device: Some(d.name.clone()),
            reason: format!(
                "{} ({}, {}); a device that fails to open leaves the run on the CPU",
                d.name, d.description, d.backend
            ),
            cpu_because: None,
        },
    }
}

/// What to do when a named prefill device will not run: `Err` (a refusal, exit 2) when the name
/// came from the command line (`--set device=`, `--device`) and the fallback was not allowed, as
/// llama.cpp refuses an unknown `--device`; else the warning to print. `None` when nothing falls
/// back.
pub fn device_fallback(
    asked: Option<&str>,
    origin: &str,
    place: &PrefillPlace,
    allow_cpu_fallback: bool,
) -> Option<Result<String, String>> {
    let name = asked?;
    let why = place.cpu_because.as_deref()?;
    let from_command_line = origin == "--set" || origin == "command-line flags";
    if from_command_line && !allow_cpu_fallback {
        return Some(Err(format!(
            "prefill device {name} (from {origin}) cannot run here: {why}; give --allow-cpu-fallback to run prefill on the CPU instead"
        )));
    }
    Some(Ok(format!(
        "prefill device {name} (from {origin}) is not used: {why}; prefill runs on the CPU"
    )))
}

/// One line of the memory budget.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetLine {
    /// What.
    pub what: &'static str,
    /// MiB.
    pub mib: f64,
    /// Counted against the budget (false: shown for information).
    pub counted: bool,
    /// How it was estimated.
    pub note: String,
}

/// The resolved placement of one (job, profile point).
#[derive(Debug, Clone)]
pub struct Placement {
    /// Prefill device.
    pub prefill: PrefillPlace,
    /// Model shape.
    pub dims: ModelDims,
    /// Context size that will be used.
    pub n_ctx: u64,
    /// Compute threads as configured and as they will run on this machine.
    pub threads: bmoe_engine::limits::ThreadChoice,
    /// The cores compute threads and reader/loader threads run on, and why.
    pub cores: crate::placement::cores::CoreChoice,
    /// Expert cache in MiB after `auto`.
    pub cache_mb: u64,
    /// The budget lines.
    pub budget: Vec<BudgetLine>,
    /// RAM minus the floor.
    pub available_mib: f64,
    /// RAM.
    pub ram_mib: f64,
    /// Floor.
    pub floor_mib: f64,
}

impl Placement {
    /// The budget as an aligned table.
    pub fn table(&self) -> String {
        let mut out = String::new();
        for l in &self.budget {
            out.push_str(&format!(
                "    {:<26} {:>10.1} MiB{}  {}\n",
                l.what,
                l.mib,
                if l.counted { "" } else { " (not counted)" },
                l.note
            ));
        }
        let used: f64 = self
            .budget
            .iter()
            .filter(|l| l.counted)
            .map(|l| l.mib)
            .sum();
        out.push_str(&format!("    {:<26} {:>10.1} MiB\n", "total counted", used));
        out.push_str(&format!(
            "    {:<26} {:>10.1} MiB  (RAM {:.0} MiB - floor {:.0} MiB)",
            "available", self.available_mib, self.ram_mib, self.floor_mib
        ));
        out
    }
}

/// What the bmoe process itself holds apart from the model's buffers, in MiB.
const RUNTIME_MIB: f64 = 20.0;

/// Places one (profile, values) on a model.
pub fn place(profile: &Profile, s: &Settings, model: &Path) -> Result<Placement, PlacementError> {
    let dims = model_dims(model)?;
    let prefill = place_prefill(profile, s);
    let n_ctx = if s.context == 0 {
        dims.n_ctx_train.max(1)
    } else {
        u64::from(s.context)
    };
    let mut budget = state_lines(&dims, n_ctx);
    budget.extend(compute_lines(&dims, s, n_ctx, prefill.device.is_some()));
    budget.extend(weight_lines(&dims, s));
    let ram_mib = profile.ram_mb as f64;
    let floor_mib = s.cache_floor_mb as f64;
    let available_mib = ram_mib - floor_mib;
    let fixed: f64 = budget.iter().filter(|l| l.counted).map(|l| l.mib).sum();
    let (cache_mb, note) = expert_cache(&dims, s, available_mib - fixed);
    budget.push(BudgetLine {
        what: "expert cache",
        mib: cache_mb as f64,
        counted: true,
        note,
    });
    let cores = crate::placement::cores::this_machine(&s.cpus).map_err(PlacementError::Cpus)?;
    let threads = bmoe_engine::limits::ThreadChoice::resolve(
        s.threads.explicit(),
        // Pinned, `auto` is one thread per chosen core, and more than those would share them.
        match cores.compute.len() {
            0 => bmoe_engine::limits::usable_cores(),
            n => n as u32,
        },
    );
    let mut p = Placement {
        prefill,
        dims,
        n_ctx,
        threads,
        cores,
        cache_mb,
        budget,
        available_mib,
        ram_mib,
        floor_mib,
    };
    let total = fixed + cache_mb as f64;
    if total > available_mib || available_mib <= 0.0 {
        return Err(over_budget(profile, s, &p, fixed, total));
    }
    p.budget.shrink_to_fit();
    Ok(p)
}

/// The session's state: the KV cache, and a recurrent model's conv and state.
fn state_lines(dims: &ModelDims, n_ctx: u64) -> Vec<BudgetLine> {
    let mut budget = Vec::new();
    let kv = n_ctx as f64 * dims.kv_bytes_per_token as f64;
    budget.push(BudgetLine {
        what: "KV cache",
        mib: kv / MIB,
        counted: true,
        note: format!(
            "{n_ctx} ctx x {} B per token (K and V, f16) over the {} of {} layers with attention",
            dims.kv_bytes_per_token, dims.n_kv_layers, dims.n_layer
        ),
    });
    if dims.recurrent_bytes > 0 {
        budget.push(BudgetLine {
            what: "recurrent state",
            mib: dims.recurrent_bytes as f64 / MIB,
            counted: true,
            note: format!(
                "{} state-space layers of {}: conv and state (f32), one sequence",
                dims.n_recurrent_layers, dims.n_layer
            ),
        });
    }
    budget
}

/// The process and its compute buffers, on the CPU and (with a prefill device) on the device.
fn compute_lines(dims: &ModelDims, s: &Settings, n_ctx: u64, device: bool) -> Vec<BudgetLine> {
    // llama.cpp picks flash attention on the CPU (flash_attn = auto): no attention-score matrix,
    // only the f16 mask; the MoE intermediates dominate.
    let compute = |ubatch: u64| -> f64 {
        let outputs = ubatch.min(128);
        let act = 8 * dims.n_embd + 3 * dims.n_ff_exp * dims.n_expert_used.max(1);
        (4 * ubatch * act + 2 * ubatch * n_ctx + 4 * outputs * dims.n_vocab_max) as f64
    };
    let mut budget = vec![BudgetLine {
        what: "bmoe itself",
        mib: RUNTIME_MIB,
        counted: true,
        note: "code, libraries, heap (measured: 15-19 MiB with the tiny model)".into(),
    }];
    let ub_cpu = u64::from(s.cpu_ubatch).min(n_ctx);
    budget.push(BudgetLine {
        what: "compute buffers (CPU)",
        mib: compute(ub_cpu) / MIB,
        counted: true,
        note: format!(
            "estimate: ubatch {ub_cpu} x activations (f32) + attention mask (f16) + logits"
        ),
    });
    if device {
        let ub_dev = u64::from(s.device_ubatch).min(n_ctx);
        budget.push(BudgetLine {
            what: "compute buffers (device)",
            mib: compute(ub_dev) / MIB,
            counted: true,
            note: format!(
                "rough: as the CPU's at device ubatch {ub_dev} (shared memory on phones)"
            ),
        });
        budget.push(BudgetLine {
            what: "arena slots",
            mib: 2.0 * dims.max_layer_bytes as f64 / MIB,
            counted: true,
            note: "2 x the largest layer (layer k on slot k mod 2)".into(),
        });
    }
    budget
}

/// The weights held apart from the expert cache: dense weights (or the whole mapping when
/// experts do not stream), the expert slots of a cacheless stream, the prefetch staging.
fn weight_lines(dims: &ModelDims, s: &Settings) -> Vec<BudgetLine> {
    let mut budget = Vec::new();
    let dense = dims.file_bytes.saturating_sub(dims.expert_bytes) as f64 / MIB;
    if s.moe_stream {
        budget.push(BudgetLine {
            what: "dense weights",
            mib: dense,
            counted: true,
            note: format!("non-expert weights stay resident ({})", s.dense_weights),
        });
    } else {
        budget.push(BudgetLine {
            what: "model weights (mmap)",
            mib: dims.file_bytes as f64 / MIB,
            counted: false,
            note: "llama.cpp's mapping: page cache, evictable (moe_stream is off)".into(),
        });
    }
    if s.moe_stream && s.cache_mb == CacheMb::Mib(0) {
        budget.push(BudgetLine {
            what: "expert slots",
            mib: dims.max_layer_expert_bytes as f64 / MIB,
            counted: true,
            note: "cache_mb = 0: one layer's expert matrices, reused by every layer".into(),
        });
    }
    if s.moe_stream && s.prefetch != crate::config::settings::Prefetch::Off {
        let per_expert = dims.max_layer_expert_bytes / dims.n_expert.max(1);
        budget.push(BudgetLine {
            what: "prefetch staging",
            mib: (per_expert * dims.n_expert_used.max(1)) as f64 / MIB,
            counted: true,
            note: "one layer's predicted experts in flight".into(),
        });
    }
    budget
}

/// The expert cache in MiB and how it was chosen; `auto` takes what the other lines leave
/// (`left`), at most every expert.
fn expert_cache(dims: &ModelDims, s: &Settings, left: f64) -> (u64, String) {
    let all_experts = dims.expert_bytes as f64 / MIB;
    match (s.moe_stream, s.cache_mb) {
        (false, _) => (0u64, "moe_stream is off: no expert cache".to_string()),
        (true, CacheMb::Mib(n)) => (n, "cache_mb".to_string()),
        (true, CacheMb::Auto) => {
            let v = left.min(all_experts).max(0.0).floor() as u64;
            (
                v,
                format!("auto: what is left, at most every expert ({all_experts:.1} MiB)"),
            )
        }
    }
}

/// The refusal of a placement that does not fit: every counted line, the table, and what would.
fn over_budget(
    profile: &Profile,
    s: &Settings,
    p: &Placement,
    fixed: f64,
    total: f64,
) -> PlacementError {
    let detail = format!(
        "needs {total:.1} MiB ({}) but RAM {:.0} MiB minus floor {:.0} MiB leaves {:.1} MiB",
        p.budget
            .iter()
            .filter(|l| l.counted)
            .map(|l| format!("{} {:.1}", l.what, l.mib))
            .collect::<Vec<_>>()
            .join(" + "),
        p.ram_mib,
        p.floor_mib,
        p.available_mib
    );
    PlacementError::Budget {
        profile: profile.name.clone(),
        detail,
        table: p.table(),
        help: budget_help(s, fixed, p.available_mib),
    }
}

/// What would fit a budget that does not: the largest explicit expert cache the other counted
/// lines leave room for (they do not depend on it), else what the rest alone needs.
fn budget_help(s: &Settings, fixed: f64, available_mib: f64) -> String {
    let left = (available_mib - fixed).floor();
    match s.cache_mb {
        CacheMb::Mib(n) if s.moe_stream && n > 0 && left >= 1.0 => {
            format!("cache_mb <= {left:.0} fits, or cache_mb = \"auto\"")
        }
        _ => format!(
            "without an expert cache the rest needs {fixed:.1} MiB of the {available_mib:.1} MiB left: lower context, raise the profile's ram_mb or lower cache_floor_mb"
        ),
    }
}

/// The engine options this placement and these values ask for.
pub fn engine_options(
    p: &Placement,
    s: &Settings,
    model: &Path,
) -> (bmoe_engine::LoadOptions, bmoe_engine::SessionOptions) {
    let mut load = bmoe_engine::LoadOptions {
        stream: s.moe_stream.then(|| bmoe_engine::StreamOptions {
            cpus: p.cores.helpers.clone(),
            ..Default::default()
        }),
        prefill: p
            .prefill
            .device
            .as_ref()
            .map(|d| bmoe_engine::PrefillOptions {
                device: d.clone(),
                cpus: p.cores.helpers.clone(),
                ..Default::default()
            }),
        ..bmoe_engine::LoadOptions::new(model)
    };
    let mut session = bmoe_engine::SessionOptions {
        threads: p.threads.used,
        cpus: p.cores.compute.clone(),
        ..bmoe_engine::SessionOptions::default()
    };
    crate::config::settings::to_engine(s, &mut load, &mut session);
    // `auto` was resolved here against the profile's RAM, not the machine this runs on; the
    // context is the one placement sized the budget for.
    if let Some(st) = load.stream.as_mut() {
        st.cache = bmoe_engine::CacheBudget::Mib(p.cache_mb);
    }
    session.n_ctx = p.n_ctx as u32;
    (load, session)
}
