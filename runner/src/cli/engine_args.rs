//! Command-line arguments of the one-shot commands.
use std::path::PathBuf;

use bmoe_engine::settings;
use clap::Args;

use super::Format;
use crate::config::declare::{float_in, int_in};
use crate::config::settings::SettingFlags;

fn n_predict_arg(s: &str) -> Result<u32, String> {
    int_in(s, &settings::N_PREDICT)
}
fn top_k_arg(s: &str) -> Result<i32, String> {
    int_in(s, &settings::TOP_K).map(|v| v as i32)
}
fn temp_arg(s: &str) -> Result<f32, String> {
    float_in(s, &settings::TEMPERATURE).map(|v| v as f32)
}
fn top_p_arg(s: &str) -> Result<f32, String> {
    float_in(s, &settings::TOP_P).map(|v| v as f32)
}

/// `--format text|json` (the one [`Format`] every command shares), with `--json` kept for old
/// scripts.
#[derive(Debug, Args)]
pub struct FormatFlag {
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    format: Format,
    /// The same as --format json (the older spelling).
    #[arg(long, hide = true)]
    json: bool,
}

impl FormatFlag {
    /// Whether JSON was asked for, in either spelling.
    pub fn json(&self) -> bool {
        self.json || self.format == Format::Json
    }
}

/// `bmoe devices`.
#[derive(Debug, Args)]
pub struct DevicesArgs {
    #[command(flatten)]
    pub out: FormatFlag,
}

/// `bmoe archs`.
#[derive(Debug, Args)]
pub struct ArchsArgs {
    #[command(flatten)]
    pub out: FormatFlag,
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
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(bmoe_synth::SynthArch::NAMES), default_value = "qwen3moe")]
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
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(bmoe_synth::WeightType::NAMES))]
    pub expert_type: Option<String>,
    /// Type of the other matrices.
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(bmoe_synth::WeightType::NAMES))]
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
    /// Replace an existing output that is not a GGUF file (a GGUF is replaced anyway).
    #[arg(long)]
    pub force: bool,
}

/// Model and session options shared by generate, decide and ppl. A setting flag is the profile
/// key of the same name (old spellings stay as aliases) and has no default of its own: an unset
/// flag takes its value from the layers below it, as `bmoe run` does (defaults < `--profile` <
/// `BMOE_*` < `--set` < flags).
#[derive(Debug, Args)]
pub struct EngineArgs {
    /// The GGUF model (the first shard of a split model).
    #[arg(short = 'm', long)]
    pub model: PathBuf,
    /// A device profile (profiles/*.toml): its [engine] and [prefill] values apply, and `auto`
    /// values are resolved against its RAM as in `bmoe run`. Without one, against this machine.
    #[arg(long)]
    pub profile: Option<PathBuf>,
    /// Any profile key as KEY=VALUE (repeatable), over the profile and BMOE_* and under the flags.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub sets: Vec<String>,
    #[command(flatten)]
    pub settings: SettingFlags,
    /// With --moe-stream: load through llama.cpp's own loader, which reads the whole file
    /// (experts included) at load, instead of the header and dense weights only. For comparison.
    #[arg(long, help_heading = "Expert streaming", display_order = 14)]
    pub llama_load: bool,
    /// Print llama.cpp's log on stderr: set from the global `-v`.
    #[arg(skip)]
    pub verbose: bool,
    /// A --device this build or machine lacks runs prefill on the CPU with a `bmoe:` line,
    /// instead of being an error.
    #[arg(long, help_heading = "Prefill device")]
    pub allow_cpu_fallback: bool,
    #[command(flatten)]
    pub out: FormatFlag,
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
    /// The sum divided by the choice's length in characters (lm-eval's acc_norm).
    Norm,
    /// The sum minus the choice's log-likelihood after the BOS token alone (lm-eval's
    /// acc_mutual_info).
    Calibrated,
}

impl ScoringArg {
    /// The engine's value.
    pub fn engine(self) -> bmoe_engine::Scoring {
        match self {
            ScoringArg::FirstToken => bmoe_engine::Scoring::FirstToken,
            ScoringArg::Sum => bmoe_engine::Scoring::Sum,
            ScoringArg::Mean => bmoe_engine::Scoring::Mean,
            ScoringArg::Norm => bmoe_engine::Scoring::Norm,
            ScoringArg::Calibrated => bmoe_engine::Scoring::Calibrated,
        }
    }
}

/// `bmoe generate`.
#[derive(Debug, Args)]
#[command(after_long_help = "Examples:
  bmoe generate -m models/tiny.gguf -p \"Hello\" -n 32
  bmoe generate -m models/tiny.gguf -p \"Hello\" --moe-stream --cache-mb 1   # experts streamed from the GGUF
  bmoe generate -m models/tiny.gguf -p \"Hello\" --seed 7 --temp 0.8   # sampled
  bmoe generate -m models/tiny.gguf -p \"Hello\" --profile profiles/host-cpu.toml --json")]
pub struct GenerateArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// The prompt.
    #[arg(short = 'p', long)]
    pub prompt: String,
    /// Tokens to generate at most.
    #[arg(short = 'n', long, default_value_t = settings::N_PREDICT.default_u32(), value_parser = n_predict_arg)]
    pub n_predict: u32,
    /// Sample with this seed instead of greedy decoding.
    #[arg(long)]
    pub seed: Option<u32>,
    /// Sampling temperature (with --seed).
    #[arg(long, default_value_t = settings::TEMPERATURE.default as f32, value_parser = temp_arg)]
    pub temp: f32,
    /// Top-k (with --seed; 0 = off).
    #[arg(long, default_value_t = settings::TOP_K.default_u32() as i32, value_parser = top_k_arg)]
    pub top_k: i32,
    /// Top-p (with --seed; 1 = off), in (0, 1].
    #[arg(long, default_value_t = settings::TOP_P.default as f32, value_parser = top_p_arg)]
    pub top_p: f32,
    /// Feed the prompt as is, without the model's chat template.
    #[arg(long)]
    pub raw: bool,
}

/// `bmoe decide`.
#[derive(Debug, Args)]
#[command(after_long_help = "Examples:
  bmoe decide -m models/tiny.gguf --prefix \"Task: reply.\" --suffix \"Which button?\" --choice OK --choice Cancel
  bmoe decide -m models/tiny.gguf --prefix \"...\" --choice \"click(submit)\" --choice \"click(cancel)\" --scoring sum --expected 0
  bmoe decide -m models/tiny.gguf --prefix \"...\" --choice A --choice B --raw --prefix-reuse off")]
pub struct DecideArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// The part of the prompt that repeats across decisions.
    #[arg(long, default_value = "")]
    pub prefix: String,
    /// The part that changes.
    #[arg(long, default_value = "")]
    pub suffix: String,
    /// A choice (repeat for each; at least one, checked before the model loads).
    #[arg(long = "choice", required = true)]
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
