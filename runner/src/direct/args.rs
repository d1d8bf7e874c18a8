//! Command-line arguments of the one-shot commands.
use std::path::PathBuf;

use bmoe_engine::limits::{self, FloatRange, IntRange, ThreadChoice};
use bmoe_engine::{DenseWeights, LoadOptions, PrefillOptions, SessionOptions, StreamOptions};
use clap::{Args, ValueEnum};

use crate::config::settings::{auto_loaders, Count, AUTO_IO_THREADS};

/// A flag's integer value, checked against the setting's range in `limits`.
fn int_in(s: &str, r: &IntRange) -> Result<u32, String> {
    r.parse(s)
        .map_err(|e| e.to_string())
        .and_then(|v| u32::try_from(v).map_err(|_| format!("{v} does not fit in 32 bits")))
}

/// A flag's count (`auto` or a number in the setting's range).
fn count_in(s: &str, r: &IntRange) -> Result<Count, String> {
    let c: Count = s.parse()?;
    if let Count::N(n) = c {
        r.check(u64::from(n)).map_err(|e| e.to_string())?;
    }
    Ok(c)
}

fn float_in(s: &str, r: &FloatRange) -> Result<f64, String> {
    r.parse(s).map_err(|e| e.to_string())
}

fn threads_arg(s: &str) -> Result<Count, String> {
    count_in(s, &limits::THREADS)
}
fn io_threads_arg(s: &str) -> Result<Count, String> {
    count_in(s, &limits::IO_THREADS)
}
fn loaders_arg(s: &str) -> Result<Count, String> {
    count_in(s, &limits::LOADERS)
}
fn ctx_arg(s: &str) -> Result<u32, String> {
    int_in(s, &limits::CONTEXT)
}
fn ubatch_arg(s: &str) -> Result<u32, String> {
    int_in(s, &limits::CPU_UBATCH)
}
fn device_ubatch_arg(s: &str) -> Result<u32, String> {
    int_in(s, &limits::DEVICE_UBATCH)
}
fn min_tokens_arg(s: &str) -> Result<u32, String> {
    int_in(s, &limits::MIN_TOKENS)
}
fn n_expert_used_arg(s: &str) -> Result<u32, String> {
    int_in(s, &limits::N_EXPERT_USED)
}
fn cache_floor_arg(s: &str) -> Result<u64, String> {
    limits::CACHE_FLOOR_MB.parse(s).map_err(|e| e.to_string())
}
fn routed_full_arg(s: &str) -> Result<f64, String> {
    float_in(s, &limits::ROUTED_FULL)
}
fn n_predict_arg(s: &str) -> Result<u32, String> {
    int_in(s, &limits::N_PREDICT)
}
fn top_k_arg(s: &str) -> Result<i32, String> {
    int_in(s, &limits::TOP_K).map(|v| v as i32)
}
fn temp_arg(s: &str) -> Result<f32, String> {
    float_in(s, &limits::TEMPERATURE).map(|v| v as f32)
}
fn top_p_arg(s: &str) -> Result<f32, String> {
    float_in(s, &limits::TOP_P).map(|v| v as f32)
}

/// `bmoe devices`.
#[derive(Debug, Args)]
pub struct DevicesArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `bmoe archs`.
#[derive(Debug, Args)]
pub struct ArchsArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `bmoe synth`: write a synthetic MoE GGUF.
#[derive(Debug, Args)]
pub struct SynthArgs {
    /// Output path (`.gguf`; with --split N, shards named `<stem>-0000i-of-0000N.gguf`).
    #[arg(short, long)]
    pub output: PathBuf,
    /// Size preset.
    #[arg(long, value_parser = ["tiny", "small", "bench"], default_value = "tiny")]
    pub preset: String,
    /// Architecture.
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(bmoe_engine::synth::SynthArch::NAMES), default_value = "qwen3moe")]
    pub arch: String,
    /// Transformer blocks.
    #[arg(long)]
    pub layers: Option<u32>,
    /// Embedding width.
    #[arg(long)]
    pub embd: Option<u32>,
    /// Attention heads.
    #[arg(long)]
    pub heads: Option<u32>,
    /// Key/value heads.
    #[arg(long)]
    pub heads_kv: Option<u32>,
    /// Experts per layer.
    #[arg(long)]
    pub experts: Option<u32>,
    /// Experts per token.
    #[arg(long)]
    pub experts_used: Option<u32>,
    /// Expert FFN width.
    #[arg(long)]
    pub ff: Option<u32>,
    /// Training context written to the metadata.
    #[arg(long)]
    pub ctx: Option<u32>,
    /// Type of the routed experts.
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(bmoe_engine::synth::WeightType::NAMES))]
    pub expert_type: Option<String>,
    /// Type of the other matrices.
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(bmoe_engine::synth::WeightType::NAMES))]
    pub dense_type: Option<String>,
    /// Router skew: 0 = even routing, larger = a few experts take most tokens.
    #[arg(long)]
    pub router_skew: Option<f32>,
    /// Seed of the tensor data.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Write this many GGUF shards.
    #[arg(long)]
    pub split: Option<u32>,
    /// Leave the output matrix out (tied to the token embeddings, as many released models are).
    #[arg(long)]
    pub tied_output: bool,
}

/// How the weights that are not routed experts are held while streaming.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum DenseArg {
    /// Left in llama.cpp's mapping.
    Mmap,
    /// Copied once into engine-owned memory.
    Anon,
}

/// Expert prefetch while streaming.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PrefetchArg {
    /// The next layer's router on this layer's router input.
    Router,
    /// The experts the next layer routed to on the previous token.
    Repeat,
    /// Every miss is read at its routing node.
    Off,
}

/// Model and session options shared by generate, decide and ppl.
#[derive(Debug, Args)]
pub struct EngineArgs {
    /// The GGUF model (the first shard of a split model).
    #[arg(short = 'm', long)]
    pub model: PathBuf,
    /// Compute threads, or `auto`: the cores this process may use (affinity, cgroup quota); more is capped to them.
    #[arg(short = 't', long, default_value = "auto", value_parser = threads_arg)]
    pub threads: Count,
    /// Context size in tokens (0 = the model's training context).
    #[arg(short = 'c', long, default_value_t = 4096, value_parser = ctx_arg)]
    pub ctx: u32,
    /// Prompt piece width on the CPU.
    #[arg(long, default_value_t = 512, value_parser = ubatch_arg)]
    pub ubatch: u32,
    /// Override the model's experts per token.
    #[arg(long, value_parser = n_expert_used_arg)]
    pub n_expert_used: Option<u32>,
    /// Stream routed experts from the GGUF instead of relying on the page cache.
    #[arg(long)]
    pub moe_stream: bool,
    /// Expert cache budget in MiB when streaming (0 = no cache, `auto` = available memory minus the floor).
    #[arg(long, default_value = "0")]
    pub cache_mb: CacheArg,
    /// With `--cache-mb auto`: MiB left to everything else.
    #[arg(long, default_value_t = 1024, value_parser = cache_floor_arg)]
    pub cache_floor_mb: u64,
    /// Read lanes when streaming, or `auto` (4).
    #[arg(long, default_value = "auto", value_parser = io_threads_arg)]
    pub io_threads: Count,
    /// Dense weights when streaming.
    #[arg(long, value_enum, default_value = "mmap")]
    pub dense_weights: DenseArg,
    /// With --moe-stream: read ahead the experts the next layer is predicted to route to
    /// (`router`: the next layer's router on this layer's input; `repeat`: what it routed to on
    /// the previous token) or not (`off`).
    #[arg(long, value_enum, default_value = "router")]
    pub prefetch: PrefetchArg,
    /// With --moe-stream: load through llama.cpp's own loader, which reads the whole file
    /// (experts included) at load, instead of the header and dense weights only. For comparison.
    #[arg(long, requires = "moe_stream")]
    pub llama_load: bool,
    /// Run wide prefill pieces on this ggml device (e.g. HTP0, CUDA0).
    #[arg(long)]
    pub prefill_device: Option<String>,
    /// Pieces at least this wide run on the prefill device.
    #[arg(long, default_value_t = 32, value_parser = min_tokens_arg)]
    pub prefill_min_tokens: u32,
    /// Prompt piece width on the prefill device (default: --ubatch).
    #[arg(long, value_parser = device_ubatch_arg)]
    pub prefill_ubatch: Option<u32>,
    /// Threads filling the prefill device's arena (apart from --io-threads), or `auto` (the usable cores, at most 8).
    #[arg(long, default_value = "auto", value_parser = loaders_arg)]
    pub prefill_loaders: Count,
    /// Read whole layers into the arena instead of only the routed experts.
    #[arg(long)]
    pub no_prefill_routed: bool,
    /// A layer routing to more than this share of its experts gets the next layer read whole.
    #[arg(long, default_value_t = 0.85, value_parser = routed_full_arg)]
    pub prefill_routed_full: f64,
    /// Profile device prefill: every node of a device graph timed alone, per op and backend,
    /// bytes copied between CPU and device, splits, and why each op left on the CPU is there
    /// (slows prefill; needs --prefill-device).
    #[arg(long, requires = "prefill_device")]
    pub explain_prefill: bool,
    /// Prefix reuse between consecutive decisions: auto (bit-identical to a fresh prefill), on
    /// (whole common prefix, fastest) or off.
    #[arg(long, value_enum, default_value = "auto")]
    pub prefix_reuse: PrefixReuseArg,
    /// Print llama.cpp's log on stderr: set from the global `-v`.
    #[arg(skip)]
    pub verbose: bool,
    /// Print the record as JSON.
    #[arg(long)]
    pub json: bool,
}

impl EngineArgs {
    /// The engine's load options.
    pub fn load_options(&self) -> LoadOptions {
        LoadOptions {
            path: self.model.clone(),
            // llama.cpp's own offload is a benchmark baseline (engine/examples/bench_prefill.rs).
            offload: None,
            n_expert_used: self.n_expert_used,
            stream: self.moe_stream.then(|| StreamOptions {
                cache_mb: match self.cache_mb {
                    CacheArg::Mb(n) => n,
                    CacheArg::Auto => 0,
                },
                auto_cache_floor_mb: (self.cache_mb == CacheArg::Auto)
                    .then_some(self.cache_floor_mb),
                io_threads: self.io_threads.or(AUTO_IO_THREADS) as usize,
                dense_weights: match self.dense_weights {
                    DenseArg::Mmap => DenseWeights::Mmap,
                    DenseArg::Anon => DenseWeights::Anon,
                },
                read_all_experts: false,
                llama_load: self.llama_load,
                prefetch: match self.prefetch {
                    PrefetchArg::Router => bmoe_engine::Prefetch::Router,
                    PrefetchArg::Repeat => bmoe_engine::Prefetch::Repeat,
                    PrefetchArg::Off => bmoe_engine::Prefetch::Off,
                },
            }),
            prefill: self.prefill_device.as_ref().map(|d| PrefillOptions {
                device: d.clone(),
                min_tokens: self.prefill_min_tokens,
                loaders: self.prefill_loaders.or(auto_loaders()) as usize,
                routed: !self.no_prefill_routed,
                routed_full: self.prefill_routed_full,
                explain: self.explain_prefill,
                ..PrefillOptions::default()
            }),
        }
    }

    /// Compute threads as asked and as they will run here.
    pub fn threads(&self) -> ThreadChoice {
        ThreadChoice::resolve(self.threads.explicit(), limits::usable_cores())
    }

    /// The engine's session options.
    pub fn session_options(&self) -> SessionOptions {
        let d = SessionOptions::default();
        SessionOptions {
            threads: self.threads().used,
            n_ctx: self.ctx,
            n_ubatch: self.ubatch,
            n_ubatch_device: self.prefill_ubatch.unwrap_or(self.ubatch),
            prefix_reuse: match self.prefix_reuse {
                PrefixReuseArg::Auto => bmoe_engine::PrefixReuse::Auto,
                PrefixReuseArg::On => bmoe_engine::PrefixReuse::On,
                PrefixReuseArg::Off => bmoe_engine::PrefixReuse::Off,
            },
            ..d
        }
    }
}

/// `--prefix-reuse`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PrefixReuseArg {
    /// Reuse cut back to a piece boundary (bit-identical to a fresh prefill).
    Auto,
    /// Reuse the whole common prefix.
    On,
    /// Never reuse.
    Off,
}

/// `--scoring` of `bmoe decide`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ScoringArg {
    /// Each choice's first token (choices must differ in it).
    #[value(name = "first_token")]
    FirstToken,
    /// Sum of every token's log-probability.
    Sum,
    /// The sum divided by the choice's token count.
    Mean,
}

impl ScoringArg {
    /// The engine's value.
    pub fn engine(self) -> bmoe_engine::Scoring {
        match self {
            ScoringArg::FirstToken => bmoe_engine::Scoring::FirstToken,
            ScoringArg::Sum => bmoe_engine::Scoring::Sum,
            ScoringArg::Mean => bmoe_engine::Scoring::Mean,
        }
    }
}

/// `--cache-mb`: a number of MiB or `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheArg {
    /// A fixed budget.
    Mb(u64),
    /// Available memory minus the floor, sized at load.
    Auto,
}

impl std::str::FromStr for CacheArg {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "auto" {
            return Ok(CacheArg::Auto);
        }
        s.parse()
            .map(CacheArg::Mb)
            .map_err(|_| format!("expected a number of MiB or `auto`, got {s:?}"))
    }
}

/// `bmoe generate`.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// The prompt.
    #[arg(short = 'p', long)]
    pub prompt: String,
    /// Tokens to generate at most.
    #[arg(short = 'n', long, default_value_t = 64, value_parser = n_predict_arg)]
    pub n_predict: u32,
    /// Sample with this seed instead of greedy decoding.
    #[arg(long)]
    pub seed: Option<u32>,
    /// Sampling temperature (with --seed).
    #[arg(long, default_value_t = 0.8, value_parser = temp_arg)]
    pub temp: f32,
    /// Top-k (with --seed; 0 = off).
    #[arg(long, default_value_t = 40, value_parser = top_k_arg)]
    pub top_k: i32,
    /// Top-p (with --seed; 1 = off), in (0, 1].
    #[arg(long, default_value_t = 0.95, value_parser = top_p_arg)]
    pub top_p: f32,
    /// Feed the prompt as is, without the model's chat template.
    #[arg(long)]
    pub raw: bool,
}

/// `bmoe decide`.
#[derive(Debug, Args)]
pub struct DecideArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// The part of the prompt that repeats across decisions.
    #[arg(long, default_value = "")]
    pub prefix: String,
    /// The part that changes.
    #[arg(long, default_value = "")]
    pub suffix: String,
    /// A choice (repeat for each).
    #[arg(long = "choice")]
    pub choices: Vec<String>,
    /// Feed prefix + suffix as is, without the model's chat template.
    #[arg(long)]
    pub raw: bool,
    /// How choices are scored: first_token (their first token), sum or mean (every token).
    #[arg(long, value_enum, default_value = "first_token")]
    pub scoring: ScoringArg,
    /// The right answer: a choice's text, or its 0-based index; prints correct or incorrect.
    #[arg(long)]
    pub expected: Option<String>,
}

/// `bmoe ppl`.
#[derive(Debug, Args)]
pub struct PplArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// The text file to score.
    pub file: PathBuf,
}
