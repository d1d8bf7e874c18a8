//! Command-line arguments of the one-shot commands.
use std::path::PathBuf;

use bmoe_engine::limits::{self, ThreadChoice};
use bmoe_engine::{LoadOptions, SessionOptions};
use clap::Args;

use crate::config::declare::{float_in, int_in};
use crate::config::layers::{self, LayerInputs};
use crate::config::profile::load_profile;
use crate::config::settings::{SettingFlags, Settings};
use crate::placement;

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

/// `--format text|json`, the spelling every command shares, with `--json` kept for old scripts.
#[derive(Debug, Args)]
pub struct FormatFlag {
    /// Output format.
    #[arg(long, value_parser = ["text", "json"], default_value = "text")]
    format: String,
    /// The same as --format json (the older spelling).
    #[arg(long, hide = true)]
    json: bool,
}

impl FormatFlag {
    /// Whether JSON was asked for, in either spelling.
    pub fn json(&self) -> bool {
        self.json || self.format == "json"
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

/// What a one-shot command runs with: the resolved values and the engine options they give.
#[derive(Debug)]
pub struct Direct {
    /// The engine's load options.
    pub load: LoadOptions,
    /// The engine's session options.
    pub session: SessionOptions,
    /// Compute threads as asked and as they run here.
    pub threads: ThreadChoice,
}

impl EngineArgs {
    /// Says so for each flag given that has no effect with the other settings (the rule of
    /// [`crate::config::inert`], shared with check/plan/run).
    fn warn_idle_flags(&self, s: &Settings) {
        if s.moe_stream {
            // A `bmoe:` line where evicted pages cannot be moved (old kernels, qemu-user).
            crate::ident::page_moves_verdict();
        }
        let flags = self.settings.layer();
        for (key, why) in crate::config::inert::inert_keys(flags.keys().map(String::as_str), s) {
            eprintln!(
                "bmoe: --{} has no effect ({why}): ignored",
                key.replace('_', "-")
            );
        }
    }

    /// Refuses a prefill device named on the command line that will not run here (unless
    /// `--allow-cpu-fallback`), before anything loads; says so for one named by the profile.
    fn check_device(
        &self,
        s: &Settings,
        profile: Option<&crate::config::profile::Profile>,
        origin: &str,
    ) -> anyhow::Result<()> {
        let Some(name) = s.device_name() else {
            return Ok(());
        };
        let place = match profile {
            Some(pr) => placement::place_prefill(pr, s),
            None => bmoe_engine::plan::PrefillPlace::resolve(name),
        };
        match placement::device_fallback(Some(name), origin, &place, self.allow_cpu_fallback) {
            Some(Err(e)) => anyhow::bail!(e),
            // Without a profile the engine's own line at load says it; a profile's policy
            // (a Hexagon generation) is the runner's to say.
            Some(Ok(w)) if profile.is_some() => eprintln!("bmoe: {w}"),
            _ => {}
        }
        Ok(())
    }

    /// Resolves the layers (defaults < `--profile` < `BMOE_*` < `--set` < flags) and the engine
    /// options: through the profile's placement when one is given, else against this machine.
    pub fn resolve(&self) -> anyhow::Result<Direct> {
        let mut inputs = LayerInputs {
            flags: self.settings.layer(),
            ..LayerInputs::default()
        };
        for s in &self.sets {
            inputs
                .sets
                .push(layers::parse_set(s).map_err(|d| anyhow::anyhow!("{d}"))?);
        }
        let profile = match &self.profile {
            Some(p) => Some(load_profile(p).map_err(|e| anyhow::anyhow!("{e}"))?.0),
            None => None,
        };
        let base = match (&profile, &self.profile) {
            (Some(pr), Some(path)) => vec![layers::profile_layer(pr, path)],
            _ => Vec::new(),
        };
        let r = layers::resolve_layers(base, &inputs).map_err(|e| anyhow::anyhow!("{e}"))?;
        let device_origin = r.origin("device").to_string();
        let s = r.settings;
        self.check_device(&s, profile.as_ref(), &device_origin)?;
        self.warn_idle_flags(&s);
        if self.llama_load && !s.moe_stream {
            anyhow::bail!(
                "--llama-load needs moe_stream (--moe-stream): it is how a streamed model loads"
            );
        }
        if s.explain && s.device_name().is_none() {
            anyhow::bail!(
                "--explain profiles device prefill: it needs a prefill device (--device)"
            );
        }
        let (mut load, session, threads) = match &profile {
            Some(pr) => {
                let p = placement::place(pr, &s, &self.model)?;
                (p.load, p.session, p.threads)
            }
            None => machine_options(&s, &self.model)?,
        };
        if let Some(st) = load.stream.as_mut() {
            st.llama_load = self.llama_load;
        }
        let mut session = session;
        if let Some(pc) = session.prefix_cache.as_mut() {
            let sha = crate::ident::model_sha256(&self.model, true)?;
            pc.key = crate::ident::prefix_key(&sha, &s);
        }
        Ok(Direct {
            load,
            session,
            threads,
        })
    }
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
    #[arg(short = 'n', long, default_value_t = limits::N_PREDICT.default_u32(), value_parser = n_predict_arg)]
    pub n_predict: u32,
    /// Sample with this seed instead of greedy decoding.
    #[arg(long)]
    pub seed: Option<u32>,
    /// Sampling temperature (with --seed).
    #[arg(long, default_value_t = limits::TEMPERATURE.default as f32, value_parser = temp_arg)]
    pub temp: f32,
    /// Top-k (with --seed; 0 = off).
    #[arg(long, default_value_t = limits::TOP_K.default_u32() as i32, value_parser = top_k_arg)]
    pub top_k: i32,
    /// Top-p (with --seed; 1 = off), in (0, 1].
    #[arg(long, default_value_t = limits::TOP_P.default as f32, value_parser = top_p_arg)]
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
