//! The command line's types: every command, flag and output format, in one place (clap derive).
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::run::prepare::Selection;

pub mod engine_args;

/// bmoe: run mixture-of-experts models as declarative batch jobs.
#[derive(Parser)]
#[command(
    name = "bmoe",
    version,
    about,
    propagate_version = true,
    after_long_help = "Exit status: 0 ok; 1 differences found (compare) or items refused (run); \
2 usage, configuration or I/O error; 130 stopped by a signal (resume with --resume)."
)]
pub struct Cli {
    /// Less output: no progress bars or progress lines.
    #[arg(short, long, global = true, help_heading = "Global options")]
    pub quiet: bool,
    /// More output: llama.cpp's own log on stderr (in runs too).
    #[arg(short, long, global = true, help_heading = "Global options")]
    pub verbose: bool,
    #[command(subcommand)]
    pub command: Command,
}

/// How a command prints its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum Format {
    /// Lines for people.
    #[default]
    Text,
    /// One JSON document on stdout.
    Json,
}

#[derive(Subcommand)]
pub enum Command {
    /// Check job and profile files (schema, then semantics, then placement), then load each model
    /// once in a child process (the probe; --no-probe skips it).
    #[command(after_long_help = "Examples:
  bmoe check jobs/agent-replay.toml --profile profiles/oneplus-13.toml
  bmoe check jobs/*.toml --format json          # {\"ok\": false, \"errors\": [...]} on a broken job
  bmoe check jobs/demo.toml --set cache_mb=0,1  # a sweep from the command line, checked")]
    Check(CheckArgs),
    /// Print each resolved value and where it came from, the placement and the memory budget.
    #[command(after_long_help = "Examples:
  bmoe plan jobs/agent-replay.toml --profile profiles/oneplus-13.toml
  bmoe plan jobs/demo.toml --set cache_mb=auto --overrides best.toml
  bmoe plan jobs/demo.toml --format json | jq '.units[0].budget'")]
    Plan(FormattedTarget),
    /// Run jobs: one CSV row per decision, prompt or text.
    #[command(after_long_help = "Examples:
  bmoe run jobs/agent-replay.toml --profile profiles/oneplus-13.toml
  bmoe run jobs/agent-replay.toml --limit 5 --items 'mail-*' --csv runs/smoke.csv
  bmoe run jobs/agent-replay.toml --shard 0/4 --run-id night-1 --csv 'runs/night-1/shard-{shard}.csv'
  bmoe run jobs/agent-replay.toml --resume --run-id night-1     # continue a stopped run
  bmoe run jobs/sweep-cache.toml --repeat 3 --warmup 1          # repeats for the report's spread")]
    Run(RunArgs),
    /// Compare two telemetry CSVs (one run of each), for nightly regression checks.
    #[command(after_long_help = "Examples:
  bmoe compare runs/monday.csv runs/tuesday.csv               # 0 same, 1 differ, 2 nothing in common
  bmoe compare runs/monday.csv runs/tuesday.csv --max-slowdown 1.10
  bmoe compare runs/all.csv runs/all.csv --run-a night-1 --run-b night-2 --format json")]
    Compare(CompareArgs),
    /// Merge the CSVs of a sharded run into one (checked, de-duplicated, written atomically).
    #[command(after_long_help = "Examples:
  bmoe merge runs/night-1/shard-*.csv -o runs/night-1/all.csv
  bmoe merge runs/night-1/shard-*.csv --expect-shards 4 -o runs/night-1/all.csv
  bmoe merge runs/night-1/shard-0.csv runs/night-1/shard-1.csv --allow-partial -o partial.csv")]
    Merge(MergeArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    #[command(after_long_help = "Examples:
  bmoe completions bash > ~/.local/share/bash-completion/completions/bmoe
  bmoe completions zsh > ~/.zfunc/_bmoe")]
    Completions(CompletionsArgs),
    /// Print the man page (roff), or write one page per command into a folder.
    #[command(after_long_help = "Examples:
  bmoe man | man -l -
  bmoe man -o man/                                            # bmoe.1, bmoe-run.1, ...")]
    Man(ManArgs),
    /// Summarise telemetry CSVs per (job, profile, sweep point): tables, plots, the best point.
    Report(ReportArgs),
    /// Write the JSON Schemas (profile, job, telemetry) generated from the code.
    #[command(after_long_help = "Examples:
  bmoe schema                  # writes schemas/*.schema.json
  bmoe schema --check          # exit 1 when the files differ from the code")]
    Schema(SchemaArgs),
    /// List the ggml backends and devices of this build.
    #[command(after_long_help = "Examples:
  bmoe devices
  bmoe devices --format json")]
    Devices(engine_args::DevicesArgs),
    /// Device profiles: `measure` writes one for the machine it runs on.
    #[command(subcommand)]
    Profile(ProfileCommand),
    /// Write a synthetic MoE GGUF.
    #[command(after_long_help = "Examples:
  bmoe synth --preset tiny -o models/tiny.gguf
  bmoe synth --preset small --arch gemma4 -o models/gemma4-small.gguf
  bmoe synth --preset bench --expert-type q4_0 -o models/bench.gguf")]
    Synth(engine_args::SynthArgs),
    /// List the model architectures this build writes and checks (coverage: docs/architectures.md).
    Archs(engine_args::ArchsArgs),
    /// Generate text once.
    Generate(engine_args::GenerateArgs),
    /// Score choices after a prompt (one prefill, no decode).
    Decide(engine_args::DecideArgs),
    /// Perplexity of a text file.
    #[command(after_long_help = "Examples:
  bmoe ppl -m models/tiny.gguf text.txt
  bmoe ppl -m models/tiny.gguf text.txt --moe-stream --cache-mb 1 --format json")]
    Ppl(engine_args::PplArgs),
    /// Replay a routing trace (--routing-trace) through the expert cache's policy and through
    /// the offline optimum: misses and bytes per token, prompt and decode apart.
    #[command(after_long_help = "Examples:
  bmoe generate -m models/bench.gguf --moe-stream --cache-mb 600 --routing-trace run.trace -p hi
  bmoe cache-sim run.trace                          # at the cache size the run had
  bmoe cache-sim run.trace --cache-mb 150,300,600 --format json")]
    CacheSim(CacheSimArgs),
}

/// `bmoe cache-sim`: a trace and the cache sizes to replay it at.
#[derive(Args)]
pub struct CacheSimArgs {
    /// The routing trace (JSON lines, written by a run with `routing_trace`).
    pub trace: PathBuf,
    /// Cache sizes in MiB, comma-separated (default: the size the run had, following its
    /// budget's changes under memory pressure).
    #[arg(long, value_delimiter = ',', value_parser = cache_mib)]
    pub cache_mb: Vec<f64>,
    /// The streamer's cache policies to replay, comma-separated (default: both, next_use first).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub policy: Vec<crate::config::values::CachePolicy>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
}

/// `--cache-mb` of cache-sim: MiB, 0 or more (0: no cache, every routed expert read).
fn cache_mib(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(x) if x.is_finite() && x >= 0.0 => Ok(x),
        _ => Err(format!(
            "expected a cache size in MiB (0 or more), not {s:?}"
        )),
    }
}

/// Jobs and how to configure them.
#[derive(Args)]
pub struct Target {
    /// Job files (TOML).
    #[arg(required = true)]
    pub jobs: Vec<PathBuf>,
    /// Device profile; replaces each job's default `profile`.
    #[arg(long, short = 'p')]
    pub profile: Option<PathBuf>,
    /// Override a profile value (highest layer), e.g. --set cache_mb=auto; repeatable. A comma
    /// list sweeps it: --set cache_mb=0,512,1024 runs three points.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub sets: Vec<String>,
    /// A TOML file of layered keys (e.g. from `bmoe report --best --write-overrides`): a layer
    /// above each job's [overrides], below its [sweep].
    #[arg(long, value_name = "FILE")]
    pub overrides: Option<PathBuf>,
    /// A prefill device named with --set that this build or machine lacks runs prefill on the
    /// CPU with a warning, instead of being an error.
    #[arg(long)]
    pub allow_cpu_fallback: bool,
    /// Times each item runs per point; replaces each job's `repeat`.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub repeat: Option<u32>,
    /// Item runs before the measured rows of each point; replaces each job's `warmup`.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=100000))]
    pub warmup: Option<u32>,
    /// Run sweep points that resolve to the same configuration (a swept key with no effect
    /// there) instead of refusing them.
    #[arg(long)]
    pub allow_identical_points: bool,
}

/// `bmoe check`: a target, an output format, and whether to probe the models.
#[derive(Args)]
pub struct CheckArgs {
    #[command(flatten)]
    pub t: FormattedTarget,
    /// Do not load the models in a child process (trusted files); only their headers are checked.
    #[arg(long)]
    pub no_probe: bool,
    /// Seconds a model load may take (the probe's child, and each load in a run) before it is
    /// abandoned and the check or the model's items fail saying so: the one-shot form of the
    /// load_timeout_s setting (default 3600).
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub load_timeout: Option<u64>,
}

/// A target plus an output format.
#[derive(Args)]
pub struct FormattedTarget {
    #[command(flatten)]
    pub target: Target,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
}

impl Target {
    /// The selection, with `load_timeout` (a `--load-timeout`) as the highest layer of
    /// `load_timeout_s`.
    pub fn selection_with(&self, load_timeout: Option<u64>) -> Selection {
        let mut s = self.selection();
        if let Some(n) = load_timeout {
            s.sets.push(format!("load_timeout_s={n}"));
        }
        s
    }

    pub fn selection(&self) -> Selection {
        Selection {
            profile: self.profile.clone(),
            sets: self.sets.clone(),
            overrides: self.overrides.clone(),
            allow_cpu_fallback: self.allow_cpu_fallback,
            repeat: self.repeat,
            warmup: self.warmup,
            allow_identical_points: self.allow_identical_points,
        }
    }
}

/// `bmoe run`: the target, the run id, selections, sharding and output.
#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub target: Target,
    /// Run id written to every row (default: <job>-<UTC timestamp>; with --shard <job>-<UTC date>,
    /// the same in every shard started that day).
    #[arg(long)]
    pub run_id: Option<String>,
    /// Continue a run: skip items already in the CSV for this run id (default: the job's last run).
    #[arg(long)]
    pub resume: bool,
    /// Run again only the items whose latest row in the run (--run-id, default: the job's last
    /// run) carries an error; the new row supersedes the failed one in merge, compare and report.
    #[arg(long, conflicts_with = "resume")]
    pub retry_errors: bool,
    /// Print each row as one JSON object per line on stdout (JSON Lines, the CSV's column names).
    #[arg(long)]
    pub machine: bool,
    /// Run one shard: K/N with K 0-based (0/3, 1/3, 2/3), or N with K from JOB_COMPLETION_INDEX
    /// (Kubernetes Indexed Job) or SLURM_ARRAY_TASK_ID (Slurm array; SLURM_ARRAY_TASK_COUNT alone
    /// also shards). An item's shard depends only on its id.
    #[arg(long, value_name = "K/N")]
    pub shard: Option<String>,
    /// Write rows here instead of each job's `csv`; `{shard}` becomes the shard index K.
    #[arg(long, value_name = "PATH")]
    pub csv: Option<String>,
    /// Take at most N items of each job (after --shard and --items), for smoke runs.
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
    /// Take only the items whose id matches this glob (`d1*`, `{open,close}-*`).
    #[arg(long, value_name = "GLOB")]
    pub items: Option<String>,
    /// Run even when --shard, --items or --limit leave no item in any job (exit 0, a header-only
    /// CSV); without it that is an error (exit 2). For the shards of a fleet, which may draw none.
    #[arg(long)]
    pub allow_empty: bool,
    /// Format of the summary printed at the end (rows always go to the CSV).
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Do not load each model once in a child process first (trusted files): a model that makes
    /// llama.cpp abort then ends the whole run instead of writing error rows.
    #[arg(long)]
    pub no_probe: bool,
    /// Seconds a model load may take (the probe's child, and each load in a run) before it is
    /// abandoned and the check or the model's items fail saying so: the one-shot form of the
    /// load_timeout_s setting (default 3600).
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub load_timeout: Option<u64>,
    /// Run each point in a child process inside a memory cgroup of this size, page cache
    /// included: `profile` (the profile's ram_mb), MiB, or `none`; the one-shot form of the
    /// memory_limit setting (needs root or a delegated cgroup; refused where none can be made).
    #[arg(long, value_name = "MIB|profile|none", value_parser = |s: &str| s.parse::<crate::config::values::MemoryLimit>())]
    pub memory_limit: Option<crate::config::values::MemoryLimit>,
    /// Drop each point's model file from the page cache before it loads: the one-shot form of
    /// the cold_start setting.
    #[arg(long)]
    pub cold_start: bool,
}

/// `bmoe compare`: two CSVs, the runs to take from each, tolerances and gates.
#[derive(Args)]
pub struct CompareArgs {
    /// The baseline CSV.
    pub a: PathBuf,
    /// The CSV compared with it.
    pub b: PathBuf,
    /// Run id to take from A (default: its last run).
    #[arg(long)]
    pub run_a: Option<String>,
    /// Run id to take from B (default: its last run).
    #[arg(long)]
    pub run_b: Option<String>,
    /// Largest choice_logp / perplexity difference still counted as identical.
    #[arg(long, default_value_t = 0.0)]
    pub tolerance: f64,
    /// Exit 1 when the 95% interval of B's median time ratio B/A (prefill, or decode per token)
    /// lies wholly above X (e.g. 1.10): noise widens the interval rather than tripping the gate.
    #[arg(long, value_name = "X", value_parser = slowdown_ratio)]
    pub max_slowdown: Option<f64>,
    /// Kept for old scripts: a difference always exits 1 now (as diff does).
    #[arg(long, hide = true)]
    pub fail_on_diff: bool,
    /// Exit 1 only when a (job, profile, point) regresses past a threshold (accuracy, agreement,
    /// --max-slowdown), 0 otherwise, however the rows differ.
    #[arg(long)]
    pub fail_on_regression: bool,
    /// With --fail-on-regression: the largest accuracy drop A -> B allowed, in percentage points
    /// (default 1.0); a group fails when the whole 95% interval of its change is below minus this.
    #[arg(long, value_name = "POINTS", requires = "fail_on_regression", value_parser = accuracy_points)]
    pub max_accuracy_drop: Option<f64>,
    /// With --fail-on-regression: the smallest share of decisions whose best agrees (default 0.95).
    #[arg(long, value_name = "SHARE", requires = "fail_on_regression", value_parser = share)]
    pub min_agreement: Option<f64>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
}

/// `--max-accuracy-drop`: percentage points, 0 to 100.
fn accuracy_points(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if (0.0..=100.0).contains(&x) => Ok(x),
        _ => Err(format!(
            "expected percentage points from 0 to 100, such as 1.0, not {s:?}"
        )),
    }
}

/// `--min-agreement`: a share from 0 to 1.
fn share(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if (0.0..=1.0).contains(&x) => Ok(x),
        _ => Err(format!(
            "expected a share from 0 to 1, such as 0.95, not {s:?}"
        )),
    }
}

/// `--max-slowdown`: a ratio above 0 (1.10 allows B 10% slower than A).
fn slowdown_ratio(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 => Ok(x),
        _ => Err(format!(
            "expected a time ratio B/A above 0, such as 1.10 (B at most 10% slower), not {s:?}"
        )),
    }
}

/// `bmoe merge`: the shard CSVs, the output, and how complete the set must be.
#[derive(Args)]
pub struct MergeArgs {
    /// The CSVs to merge (the shards of one run).
    #[arg(required = true)]
    pub inputs: Vec<PathBuf>,
    /// The merged CSV (refused when it exists, unless --force).
    #[arg(short, long)]
    pub output: PathBuf,
    /// Replace the output when it exists.
    #[arg(long)]
    pub force: bool,
    /// The run had N shards: refuse (exit 2) unless N are present, even when the rows do not say
    /// N (each input without sharded rows, such as an empty shard's header-only CSV, counts as one).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub expect_shards: Option<u32>,
    /// Merge even when shards of a K/N set are missing (said on stderr) instead of refusing.
    #[arg(long)]
    pub allow_partial: bool,
    /// Output format of the report.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
}

/// `bmoe completions`: the shell.
#[derive(Args)]
pub struct CompletionsArgs {
    /// The shell.
    pub shell: clap_complete::Shell,
}

/// `bmoe man`: print, or write one page per command.
#[derive(Args)]
pub struct ManArgs {
    /// Write bmoe.1 and one bmoe-<command>.1 per command into this folder instead of printing.
    #[arg(short = 'o', long = "output", alias = "out", value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Replace files in the folder that are not man pages (bmoe's own pages are replaced anyway).
    #[arg(long, requires = "out")]
    pub force: bool,
}

/// Report formats.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ReportFormat {
    /// One self-contained HTML page (inline SVG plots).
    Html,
    /// Markdown tables.
    Md,
    /// JSON, for dashboards.
    Json,
}

#[derive(Args)]
#[command(after_long_help = "Examples:
  bmoe report runs/sweep-cache.csv                       # Markdown tables on stdout
  bmoe report runs/sweep-cache.csv -o report.html        # one HTML page with plots
  bmoe report runs/sweep-cache.csv --best --objective prefill_tps \\
      --require \"agreement>=0.99\" --write-overrides best.toml
  bmoe plan jobs/agent-replay.toml --overrides best.toml  # the winner as its own layer")]
pub struct ReportArgs {
    /// Telemetry CSVs; read by column name, so files of different builds mix.
    #[arg(required = true)]
    pub csvs: Vec<PathBuf>,
    /// Write the report here (atomically) instead of stdout.
    #[arg(short = 'o', long = "output", alias = "out", value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Output format (default: from the -o extension, .html, .md or .json; else md on stdout).
    #[arg(long, value_enum)]
    pub format: Option<ReportFormat>,
    /// Reference point for agreement on `best` and speed-up (default: each job and profile's
    /// stock llama.cpp point, `runtime = "llama.cpp"`, else its first point).
    #[arg(long, value_name = "POINT")]
    pub reference: Option<String>,
    /// Only rows of this job.
    #[arg(long)]
    pub job: Option<String>,
    /// Only rows of this profile (by name).
    #[arg(long)]
    pub profile: Option<String>,
    /// Only rows of these runs; repeatable.
    #[arg(long = "run-id", value_name = "ID")]
    pub run_ids: Vec<String>,
    /// Profile files whose ram_mb is drawn on the peak RSS plot; repeatable.
    #[arg(long = "profile-file", value_name = "FILE")]
    pub profile_files: Vec<PathBuf>,
    /// Pick the best point of each job and profile (implied by --objective, --require,
    /// --write-overrides).
    #[arg(long)]
    pub best: bool,
    /// Metric or column to optimise (default: the first measured of decode_tps, decisions_per_s,
    /// prefill_tps).
    #[arg(long, value_name = "NAME")]
    pub objective: Option<String>,
    /// A requirement on a metric or column, e.g. "peak_rss_mib<=6000"; repeatable.
    #[arg(long = "require", value_name = "NAME<=N")]
    pub requires: Vec<String>,
    /// Lower objective wins (default: lower for times, MiB and read per token).
    #[arg(long, conflicts_with = "maximize")]
    pub minimize: bool,
    /// Higher objective wins.
    #[arg(long)]
    pub maximize: bool,
    /// Write the best point as a TOML overlay for `--overrides` on check/plan/run.
    #[arg(long, value_name = "FILE")]
    pub write_overrides: Option<PathBuf>,
    /// Replace an existing -o or --write-overrides file that is not a bmoe report or overlay
    /// (those are replaced anyway; an input never is).
    #[arg(long)]
    pub force: bool,
}

/// `bmoe profile ...`.
#[derive(clap::Subcommand)]
pub enum ProfileCommand {
    /// Measure this machine (RAM, cores, page size, kernel, page moves, the storage's O_DIRECT
    /// random-read rate, what is visible of a Hexagon NPU) and write a profile `bmoe check` takes.
    #[command(after_long_help = "Examples:
  bmoe profile measure -o profiles/my-phone.toml
  bmoe profile measure -o profiles/box.toml --file models/small.gguf --seconds 2")]
    Measure(MeasureArgs),
}

/// `bmoe profile measure`.
#[derive(Args)]
pub struct MeasureArgs {
    /// The profile to write (its file name without `.toml` is the profile's name).
    #[arg(short = 'o', long = "output", alias = "out", value_name = "FILE")]
    pub out: PathBuf,
    /// Read this file for the storage rate (a model on the storage bmoe will read); default: a
    /// scratch file of --scratch-mb written beside the output and removed after.
    #[arg(long, value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// Size of the scratch file, MiB.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(8..=65536))]
    pub scratch_mb: u64,
    /// Bytes of each read, KiB (an expert slice: 576 KiB is a Q4_0 expert of a 2048-wide model).
    #[arg(long, default_value_t = 576, value_parser = clap::value_parser!(u64).range(4..=65536))]
    pub read_kib: u64,
    /// Seconds of reading at each count of reads in flight (1, 2, 4, 8).
    #[arg(long, default_value_t = 1.0)]
    pub seconds: f64,
    /// Replace an existing output file.
    #[arg(long)]
    pub force: bool,
}

/// `bmoe schema`: where the schemas go, or check them.
#[derive(Args)]
pub struct SchemaArgs {
    /// Folder to write into.
    #[arg(
        short = 'o',
        long = "output",
        alias = "out",
        value_name = "DIR",
        default_value = "schemas"
    )]
    pub out: PathBuf,
    /// Write nothing; exit 1 when the files in --out differ from the code.
    #[arg(long)]
    pub check: bool,
}
