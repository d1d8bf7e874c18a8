//! Typed configuration the engine takes: the runner builds these, the engine reads nothing else.
use std::path::PathBuf;

use crate::error::{EngineError, Result};
use crate::settings;

/// How the weights that are not routed experts are held while streaming.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DenseWeights {
    /// Left in llama.cpp's read-only mapping of the file.
    #[default]
    Mmap,
    /// Copied once into engine-owned anonymous memory.
    Anon,
}

/// Whether llama.cpp may convert weights into the CPU's repacked layouts at load (`repack`):
/// its extra buffer types (`CPU_REPACK`: Q4_0 -> `q4_0_8x8` on AVX2, `q4_0_4x8` with i8mm, ...),
/// whose GEMMs run faster than the kernels over the file's own layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Repack {
    /// Repacked wherever nothing moves the weights after the load: a resident run, no expert
    /// streaming, no prefill device, no offload (a repacked tensor takes only whole-tensor
    /// writes). A repacked tensor is a copy in anonymous memory even from a mapped file, so a
    /// resident model larger than memory no longer pages from the file: its weights must fit.
    /// With expert streaming on the CPU (no prefill device), each expert read from the file is
    /// repacked into its slot on the thread that read it, where ggml repacks that matrix; the
    /// dense matrices the resident load repacks (`CPU_REPACK`, or `AMX` first where the CPU
    /// variant has it) are repacked once at load, copied out of the mapping where mapped. A prefill device keeps the file's layout
    /// everywhere (its arena must never receive the CPU's repacked bytes).
    #[default]
    Auto,
    /// Never: the kernels over the file's own layout everywhere.
    Off,
}

/// How much memory the expert cache may hold (`cache_mb`).
///
/// One value, so a budget can never be set and then silently overridden by an automatic size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheBudget {
    /// `cache_mb = "auto"`: what the load's plan (the engine's `plan` module) leaves of the memory
    /// available at load minus `floor_mb` MiB, after the dense weights, KV cache and compute
    /// buffers, at most every expert: the same formula a profile's placement uses.
    Auto {
        /// MiB left to everything else (`cache_floor_mb`).
        floor_mb: u64,
    },
    /// A fixed budget in MiB; 0 = no cache (shared slots reused by every layer).
    Mib(u64),
}

/// Expert streaming settings (`moe_stream`).
#[derive(Debug, Clone, PartialEq)]
pub struct StreamOptions {
    /// Expert cache budget.
    pub cache: CacheBudget,
    /// Positioned-read lanes, each with its own descriptor.
    pub io_threads: usize,
    /// Dense weights placement.
    pub dense_weights: DenseWeights,
    /// Read every expert of a layer instead of only the routed ones (gate G3's reference).
    pub read_all_experts: bool,
    /// Load through llama.cpp's own loader, which maps the file with `MAP_POPULATE` and so reads
    /// all of it, experts included (the comparison the load benchmark and its test make). By
    /// default a streamed model's load reads only its header and dense weights.
    pub llama_load: bool,
    /// Read ahead the experts the next layer is predicted to route to.
    pub prefetch: Prefetch,
    /// Which resident expert the cache evicts to make room.
    pub cache_policy: CachePolicy,
    /// CPUs the read-ahead threads run on (off the compute threads' cores); empty = anywhere.
    pub cpus: Vec<usize>,
    /// Lossy (0 = off): at a cache miss, a cached expert of the same layer whose router
    /// probability is within this of the missed expert's is used instead.
    pub expert_substitute: f64,
    /// Lossy (0 = off): a missed routed expert whose share of the token's selected router weights
    /// is below `drop_cold / n_expert_used` is skipped (in `(0, 1]`).
    pub drop_cold: f64,
    /// MiB of memory the cache keeps free while it runs (`stream::pressure`): below it, or while
    /// memory stalls, the cache shrinks; 0 = the cache keeps its size.
    pub cache_reserve_mb: u64,
    /// MiB the cache never shrinks below under pressure.
    pub cache_min_mb: u64,
    /// Where to write the routing trace (`stream::trace`): every routing node's experts, for
    /// `bmoe cache-sim`; `None` = none.
    pub routing_trace: Option<std::path::PathBuf>,
}

impl Default for StreamOptions {
    fn default() -> Self {
        Self {
            cache: match settings::CACHE_MB.default_n() {
                Some(n) => CacheBudget::Mib(n),
                None => CacheBudget::Auto {
                    floor_mb: u64::from(settings::CACHE_FLOOR_MB.default_u32()),
                },
            },
            io_threads: settings::IO_THREADS
                .default_n()
                .map_or(settings::AUTO_IO_THREADS as usize, |n| n as usize),
            dense_weights: DenseWeights::Mmap,
            read_all_experts: false,
            llama_load: false,
            prefetch: Prefetch::Router,
            cache_policy: CachePolicy::NextUse,
            cpus: Vec::new(),
            expert_substitute: 0.0,
            drop_cold: 0.0,
            cache_reserve_mb: settings::CACHE_RESERVE_MB.default_u32().into(),
            cache_min_mb: settings::CACHE_MIN_MB.default_u32().into(),
            routing_trace: None,
        }
    }
}

/// A pacing point the arena mistakes (gate knob [`GateKnobs::pacing_faults`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PacingFault {
    /// The last node of this layer is not taken as a pacing point (the graph skipped it).
    DropLast(u32),
    /// The routing node of this layer is not taken as a pacing point (the graph skipped it).
    DropRouting(u32),
    /// The last nodes of these two layers are taken for each other's (the graph reordered them).
    SwapLast(u32, u32),
}

/// Prefill-device settings (`prefill_device`).
#[derive(Debug, Clone, PartialEq)]
pub struct PrefillOptions {
    /// ggml device name (`HTP0`, `CUDA0`, ...).
    pub device: String,
    /// Pieces at least this wide run on the device.
    pub min_tokens: u32,
    /// Loader threads filling the arena.
    pub loaders: usize,
    /// Read only routed experts (true) or whole layers (false).
    pub routed: bool,
    /// A layer routing to more than this share of its experts gets the next layer read whole.
    pub routed_full: f64,
    /// Profiling mode (`--explain-prefill`): every node of a device graph computed and timed
    /// alone, per op and backend, with why each op left on the CPU is there (slows the graph).
    pub explain: bool,
    /// CPUs the loader threads run on (off the compute threads' cores); empty = anywhere.
    pub cpus: Vec<usize>,
    /// Ways to break the arena on purpose, so a gate can be seen failing: only the engine's own
    /// tests set them (the `test-support` feature), never a user.
    #[cfg(feature = "test-support")]
    pub gate: GateKnobs,
}

/// Gate knobs: each one breaks a mechanism of the arena, so its gate can be seen failing.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GateKnobs {
    /// Milliseconds each loader job sleeps first (a slow loader must change no result).
    pub loader_delay_ms: u64,
    /// Skip the reads at the routing node (the negative control: the result must change).
    pub skip_demand_reads: bool,
    /// Skip the wait at a layer's last node for the next layer's non-expert weights (the negative
    /// control of that wait: with a slow loader the result must change).
    pub skip_layer_wait: bool,
    /// Skip the wait at a routing node for the layer's experts (the negative control of that
    /// wait: with a slow loader the result must change).
    pub skip_expert_wait: bool,
    /// Pacing points the arena mistakes, as if the graph skipped or reordered them (the call must
    /// fail, not compute on a slot that did not fill).
    pub pacing_faults: Vec<PacingFault>,
    /// ggml type names (`f32`) to treat as refused by the device's matmul, to exercise the
    /// conversion on a device that takes every type.
    pub refuse_types: Vec<String>,
    /// Keep llama.cpp's first reservation of the compute buffers (made with every weight on the
    /// CPU) instead of reserving again at the first device graph: the baseline the
    /// `compute_buffers` benchmark compares against.
    pub keep_first_reserve: bool,
    /// Move the KV cache and recurrent state into the CPU's buffer type where the device offers
    /// no host buffer type it computes on: the move, the release of llama.cpp's pages and the
    /// clears run here as they would into a device's host memory.
    pub kv_stand_in: bool,
}

/// No knob set: what every build without `test-support` runs with.
#[cfg(not(feature = "test-support"))]
static NO_GATE_KNOBS: GateKnobs = GateKnobs {
    loader_delay_ms: 0,
    skip_demand_reads: false,
    skip_layer_wait: false,
    skip_expert_wait: false,
    pacing_faults: Vec::new(),
    refuse_types: Vec::new(),
    keep_first_reserve: false,
    kv_stand_in: false,
};

impl PrefillOptions {
    /// The gate knobs in force (none outside the engine's tests).
    pub(crate) fn gate(&self) -> &GateKnobs {
        #[cfg(feature = "test-support")]
        {
            &self.gate
        }
        #[cfg(not(feature = "test-support"))]
        {
            &NO_GATE_KNOBS
        }
    }
}

impl Default for PrefillOptions {
    fn default() -> Self {
        Self {
            device: String::new(),
            min_tokens: settings::MIN_TOKENS.default_u32(),
            loaders: settings::LOADERS
                .default_n()
                .map_or(settings::auto_loaders() as usize, |n| n as usize),
            routed: true,
            routed_full: settings::ROUTED_FULL.default,
            explain: false,
            cpus: Vec::new(),
            #[cfg(feature = "test-support")]
            gate: GateKnobs::default(),
        }
    }
}

/// What to load and how.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LoadOptions {
    /// The GGUF (the first shard of a split GGUF).
    pub path: PathBuf,
    /// Override of the model's experts-per-token (top-k).
    pub n_expert_used: Option<u32>,
    /// Expert streaming; `None` = llama.cpp's own mmap path.
    pub stream: Option<StreamOptions>,
    /// Prefill device; `None` = everything on the CPU.
    pub prefill: Option<PrefillOptions>,
    /// Every layer on this device, llama.cpp's own offload (`n_gpu_layers` = all): the compute
    /// floor device-prefill benchmarks compare against. Not with `stream` or `prefill`.
    pub offload: Option<String>,
    /// Whether weights may be repacked for the CPU's faster kernels.
    pub repack: Repack,
    /// Stock llama.cpp, the baseline a person would run instead (the runner's `runtime =
    /// "llama.cpp"`): llama.cpp's default load (mapped file, its CPU repack wherever a kernel
    /// exists, no check that the copies fit), and sessions that cut a prompt as llama.cpp does
    /// (pieces of the batch width, no grid, no padding) and keep nothing between calls. Not with
    /// `stream`, `prefill`, `offload` or `n_expert_used`.
    pub stock: bool,
}

impl LoadOptions {
    /// Checks every value against its range in [`settings`](crate::settings) (before anything is loaded).
    pub fn validate(&self) -> Result<()> {
        if let Some(k) = self.n_expert_used {
            settings::N_EXPERT_USED.check(u64::from(k))?;
        }
        if let Some(so) = &self.stream {
            settings::IO_THREADS.check(so.io_threads as u64)?;
            settings::EXPERT_SUBSTITUTE.check(so.expert_substitute)?;
            settings::DROP_COLD.check(so.drop_cold)?;
            settings::CACHE_RESERVE_MB.check(so.cache_reserve_mb)?;
            settings::CACHE_MIN_MB.check(so.cache_min_mb)?;
            match so.cache {
                CacheBudget::Mib(n) => settings::CACHE_MB.check(n)?,
                CacheBudget::Auto { floor_mb } => settings::CACHE_FLOOR_MB.check(floor_mb)?,
            };
        }
        if self.stock {
            let bmoe_only = [
                (self.stream.is_some(), "moe_stream"),
                (self.prefill.is_some(), "a prefill device"),
                (self.offload.is_some(), "offload"),
                (self.n_expert_used.is_some(), "n_expert_used"),
            ];
            if let Some((_, what)) = bmoe_only.iter().find(|(on, _)| *on) {
                return Err(EngineError::InvalidOption(format!(
                    "stock llama.cpp (runtime = \"llama.cpp\") loads the model as llama.cpp does; it cannot be combined with {what}"
                )));
            }
        }
        if let Some(dev) = &self.offload {
            if self.stream.is_some() || self.prefill.is_some() {
                return Err(EngineError::InvalidOption(format!(
                    "offload to {dev} puts every layer on that device; it cannot be combined with moe_stream or a prefill device"
                )));
            }
        }
        if let Some(p) = &self.prefill {
            settings::MIN_TOKENS.check(u64::from(p.min_tokens))?;
            settings::LOADERS.check(p.loaders as u64)?;
            settings::ROUTED_FULL.check(p.routed_full)?;
        }
        Ok(())
    }

    /// Whether the load asks llama.cpp for its repacked layouts (`use_extra_bufts`): `repack =
    /// auto` (or stock llama.cpp, whose default it is) on a load whose weights nothing moves
    /// afterwards.
    pub fn repacks(&self) -> bool {
        (self.repack == Repack::Auto || self.stock)
            && self.stream.is_none()
            && self.prefill.is_none()
            && self.offload.is_none()
    }

    /// Whether streamed experts are repacked for the CPU's kernels as they are read: `repack =
    /// auto` on a streamed load with no prefill device.
    pub fn repacks_streamed_experts(&self) -> bool {
        self.repack == Repack::Auto && self.stream.is_some() && self.prefill.is_none()
    }

    /// Load `path` on the CPU with llama.cpp's mmap path.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            ..Self::default()
        }
    }
}

/// Whether a decision reuses what the KV cache holds from the previous call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PrefixReuse {
    /// Reuse the common prefix cut back to a prompt-piece boundary (a multiple of the ubatch),
    /// so every piece has the bounds a fresh prefill would give it and the scores are bit for
    /// bit those of a fresh prefill, whatever ran before (a replay's numbers do not depend on
    /// the order or the sharding of its decisions).
    #[default]
    Auto,
    /// Reuse the whole common prefix: the fewest tokens prefilled; scores may differ from a
    /// fresh prefill in the last bits (same `best` in every gate so far).
    On,
    /// Every decision starts from an empty cache.
    Off,
}

/// How a decision's choices are scored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scoring {
    /// The log-probability of each choice's first token (choices must differ in it).
    #[default]
    FirstToken,
    /// The sum of the log-probabilities of every token of the choice.
    Sum,
    /// `Sum` divided by the choice's token count.
    Mean,
    /// `Sum` divided by the choice's length in characters: lm-evaluation-harness's `acc_norm`
    /// (`lls / completion_len`, `completion_len = len(choice)` of the Python string).
    Norm,
    /// `Sum` minus the choice's log-likelihood after the neutral context alone (the BOS token, else
    /// EOS): lm-evaluation-harness's `acc_mutual_info` (its unconditional request `("", choice)`).
    Calibrated,
}

/// Per-session settings (one llama.cpp context).
#[derive(Debug, Clone, PartialEq)]
pub struct SessionOptions {
    /// Compute threads.
    pub threads: u32,
    /// Context size in tokens (0 = the model's training context).
    pub n_ctx: u32,
    /// Prompt piece width on the CPU (the ubatch).
    pub n_ubatch: u32,
    /// Prompt piece width on the prefill device.
    pub n_ubatch_device: u32,
    /// Cap on logit rows per ubatch (bounds the compute buffer).
    pub n_outputs_max: u32,
    /// Reuse the KV cache's common prefix between decisions.
    pub prefix_reuse: PrefixReuse,
    /// CPUs the compute threads run on, one thread per CPU in turn (the big cores of a phone);
    /// empty = wherever the kernel puts them.
    pub cpus: Vec<usize>,
    /// Prefix state on disk, shared by processes (off by default).
    pub prefix_cache: Option<PrefixCache>,
}

/// A folder of saved prefix states (session/disk.rs).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PrefixCache {
    /// The folder.
    pub dir: std::path::PathBuf,
    /// Size limit of its entries; the least recently used go first.
    pub max_bytes: u64,
    /// What the states depend on beyond the engine's own part: the model's content hash, every
    /// setting that changes numerics, the llama.cpp pin.
    pub key: String,
}

impl Default for SessionOptions {
    fn default() -> Self {
        Self {
            threads: settings::THREADS
                .default_n()
                .map_or(settings::usable_cores(), |n| n as u32),
            n_ctx: settings::CONTEXT.default_u32(),
            n_ubatch: settings::CPU_UBATCH.default_u32(),
            n_ubatch_device: settings::DEVICE_UBATCH.default_u32(),
            n_outputs_max: 128,
            prefix_reuse: PrefixReuse::Auto,
            cpus: Vec::new(),
            prefix_cache: None,
        }
    }
}

impl SessionOptions {
    /// Checks every value against its range, and against the prefill settings it is used with
    /// (`prefill`: the load's, if a device runs wide pieces): a combination that cannot work is
    /// refused with the settings named and a value that would work.
    pub fn validate(&self, prefill: Option<&PrefillOptions>) -> Result<()> {
        settings::THREADS.check(u64::from(self.threads))?;
        settings::CONTEXT.check(u64::from(self.n_ctx))?;
        settings::CPU_UBATCH.check(u64::from(self.n_ubatch))?;
        if self.n_outputs_max == 0 {
            return Err(EngineError::OutOfRange {
                setting: "n_outputs_max",
                value: "0".into(),
                expected: "at least 1".into(),
            });
        }
        if let Some(p) = prefill {
            settings::DEVICE_UBATCH.check(u64::from(self.n_ubatch_device))?;
            if p.min_tokens > self.n_ubatch_device {
                return Err(EngineError::Conflict(format!(
                    "min_tokens = {} is wider than device_ubatch = {}: no prompt piece would ever reach the prefill device; set min_tokens <= {} or device_ubatch >= {}",
                    p.min_tokens, self.n_ubatch_device, self.n_ubatch_device, p.min_tokens
                )));
            }
            if self.n_ctx != 0 && p.min_tokens > self.n_ctx {
                return Err(EngineError::Conflict(format!(
                    "min_tokens = {} is wider than context = {}: no prompt piece would ever reach the prefill device; set min_tokens <= {} or context >= {}",
                    p.min_tokens, self.n_ctx, self.n_ctx, p.min_tokens
                )));
            }
        }
        Ok(())
    }
}

/// Token selection for `generate`.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Sampling {
    /// Argmax: deterministic, what gates compare.
    #[default]
    Greedy,
    /// Seeded stochastic sampling.
    Seeded {
        /// RNG seed.
        seed: u32,
        /// Temperature.
        temperature: f32,
        /// Top-k (0 = off).
        top_k: i32,
        /// Top-p (1.0 = off).
        top_p: f32,
    },
}

/// Options for one `generate` call.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateOptions {
    /// Tokens to generate at most.
    pub n_predict: u32,
    /// Token selection.
    pub sampling: Sampling,
    /// Render the prompt with the model's chat template as one user message.
    pub chat: bool,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        Self {
            n_predict: settings::N_PREDICT.default_u32(),
            sampling: Sampling::Greedy,
            chat: true,
        }
    }
}

impl GenerateOptions {
    /// Checks `n_predict` and the sampling values against their ranges.
    pub fn validate(&self) -> Result<()> {
        settings::N_PREDICT.check(u64::from(self.n_predict))?;
        if let Sampling::Seeded {
            temperature,
            top_k,
            top_p,
            ..
        } = self.sampling
        {
            settings::TEMPERATURE.check(f64::from(temperature))?;
            settings::TOP_P.check(f64::from(top_p))?;
            if top_k < 0 {
                return Err(EngineError::OutOfRange {
                    setting: settings::TOP_K.name,
                    value: top_k.to_string(),
                    expected: format!("an integer from 0 to {}", settings::TOP_K.max),
                });
            }
            settings::TOP_K.check(top_k as u64)?;
        }
        Ok(())
    }
}

/// One decision: `prefix + suffix` as one user message (or raw), scored over `choices`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DecideRequest {
    /// The part that repeats across calls (instructions, history).
    pub prefix: String,
    /// The part that changes (the current screen).
    pub suffix: String,
    /// The options.
    pub choices: Vec<String>,
    /// How the choices are scored.
    pub scoring: Scoring,
    /// Feed `prefix + suffix` as is, without the model's chat template.
    pub raw: bool,
}

/// Which resident expert the expert cache evicts to make room (`stream::cache`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CachePolicy {
    /// The one whose next use is expected furthest ahead: the layers until its layer's next
    /// routing node, plus the tokens until its expert is chosen again there, estimated from how
    /// often that layer chose it lately (`stream::next_use`).
    #[default]
    NextUse,
    /// The least recently used; below one token's routed experts, the least used (the policy
    /// before `NextUse`, kept to compare against).
    Recency,
}

impl CachePolicy {
    /// The name settings, traces and `cache-sim` use.
    pub fn name(self) -> &'static str {
        match self {
            CachePolicy::NextUse => "next_use",
            CachePolicy::Recency => "recency",
        }
    }

    /// The policy of that [`Self::name`].
    pub fn from_name(name: &str) -> Option<Self> {
        [CachePolicy::NextUse, CachePolicy::Recency]
            .into_iter()
            .find(|p| p.name() == name)
    }
}

/// How experts are predicted for prefetch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Prefetch {
    /// No prefetch: every miss is read at its routing node.
    Off,
    /// The next layer's router on this layer's router input; reads ahead only once enough of its
    /// recent candidates turned out to be misses (scored from the first decode token on).
    #[default]
    Router,
    /// The router's prediction, read ahead from the first token on and never paused: for a disk
    /// and cores idle enough that a wrong read costs nothing that matters.
    Eager,
    /// The experts the next layer routed to on the previous token.
    Repeat,
    /// The experts the next router ranks lowest: a prediction that is always wrong (gate G19's
    /// control: output must not change, only bandwidth is spent).
    Wrong,
}
