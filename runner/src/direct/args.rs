//! Command-line arguments of the one-shot commands.
use std::path::PathBuf;

use bmoe_engine::{DenseWeights, LoadOptions, PrefillOptions, SessionOptions, StreamOptions};
use clap::{Args, ValueEnum};

/// `bmoe devices`.
#[derive(Debug, Args)]
pub struct DevicesArgs {
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
    #[arg(long, value_parser = ["qwen3moe", "olmoe", "llama"], default_value = "qwen3moe")]
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
    #[arg(long, value_parser = ["f32", "f16", "q8_0", "q4_0", "q4_k"])]
    pub expert_type: Option<String>,
    /// Type of the other matrices.
    #[arg(long, value_parser = ["f32", "f16", "q8_0", "q4_0", "q4_k"])]
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
}

/// How the weights that are not routed experts are held while streaming.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum DenseArg {
    /// Left in llama.cpp's mapping.
    Mmap,
    /// Copied once into engine-owned memory.
    Anon,
}

/// Model and session options shared by generate, decide and ppl.
#[derive(Debug, Args)]
pub struct EngineArgs {
    /// The GGUF model (the first shard of a split model).
    #[arg(short = 'm', long)]
    pub model: PathBuf,
    /// Compute threads (default: all cores).
    #[arg(short = 't', long)]
    pub threads: Option<u32>,
    /// Context size in tokens.
    #[arg(short = 'c', long, default_value_t = 4096)]
    pub ctx: u32,
    /// Prompt piece width on the CPU.
    #[arg(long, default_value_t = 512)]
    pub ubatch: u32,
    /// Override the model's experts per token.
    #[arg(long)]
    pub n_expert_used: Option<u32>,
    /// Stream routed experts from the GGUF instead of relying on the page cache.
    #[arg(long)]
    pub moe_stream: bool,
    /// Expert cache budget in MiB when streaming (0 = no cache, `auto` = available memory minus the floor).
    #[arg(long, default_value = "0")]
    pub cache_mb: CacheArg,
    /// With `--cache-mb auto`: MiB left to everything else.
    #[arg(long, default_value_t = 1024)]
    pub cache_floor_mb: u64,
    /// Read lanes when streaming.
    #[arg(long, default_value_t = 4)]
    pub io_threads: usize,
    /// Dense weights when streaming.
    #[arg(long, value_enum, default_value = "mmap")]
    pub dense_weights: DenseArg,
    /// Run wide prefill pieces on this ggml device (e.g. HTP0, CUDA0).
    #[arg(long)]
    pub prefill_device: Option<String>,
    /// Pieces at least this wide run on the prefill device.
    #[arg(long, default_value_t = 32)]
    pub prefill_min_tokens: u32,
    /// Prompt piece width on the prefill device (default: --ubatch).
    #[arg(long)]
    pub prefill_ubatch: Option<u32>,
    /// Threads filling the prefill device's arena (apart from --io-threads).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub prefill_loaders: u32,
    /// Read whole layers into the arena instead of only the routed experts.
    #[arg(long)]
    pub no_prefill_routed: bool,
    /// A layer routing to more than this share of its experts gets the next layer read whole.
    #[arg(long, default_value_t = 0.85)]
    pub prefill_routed_full: f64,
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
            n_expert_used: self.n_expert_used,
            stream: self.moe_stream.then(|| StreamOptions {
                cache_mb: match self.cache_mb {
                    CacheArg::Mb(n) => n,
                    CacheArg::Auto => 0,
                },
                auto_cache_floor_mb: (self.cache_mb == CacheArg::Auto)
                    .then_some(self.cache_floor_mb),
                io_threads: self.io_threads,
                dense_weights: match self.dense_weights {
                    DenseArg::Mmap => DenseWeights::Mmap,
                    DenseArg::Anon => DenseWeights::Anon,
                },
                read_all_experts: false,
            }),
            prefill: self.prefill_device.as_ref().map(|d| PrefillOptions {
                device: d.clone(),
                min_tokens: self.prefill_min_tokens,
                loaders: self.prefill_loaders as usize,
                routed: !self.no_prefill_routed,
                routed_full: self.prefill_routed_full,
                ..PrefillOptions::default()
            }),
        }
    }

    /// The engine's session options.
    pub fn session_options(&self) -> SessionOptions {
        let d = SessionOptions::default();
        SessionOptions {
            threads: self.threads.unwrap_or(d.threads),
            n_ctx: self.ctx,
            n_ubatch: self.ubatch,
            n_ubatch_device: self.prefill_ubatch.unwrap_or(self.ubatch),
            ..d
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
    #[arg(short = 'n', long, default_value_t = 64)]
    pub n_predict: u32,
    /// Sample with this seed instead of greedy decoding.
    #[arg(long)]
    pub seed: Option<u32>,
    /// Sampling temperature (with --seed).
    #[arg(long, default_value_t = 0.8)]
    pub temp: f32,
    /// Top-k (with --seed; 0 = off).
    #[arg(long, default_value_t = 40)]
    pub top_k: i32,
    /// Top-p (with --seed; 1 = off).
    #[arg(long, default_value_t = 0.95)]
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
}

/// `bmoe ppl`.
#[derive(Debug, Args)]
pub struct PplArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// The text file to score.
    pub file: PathBuf,
}
