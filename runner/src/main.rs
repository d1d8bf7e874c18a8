//! `bmoe`: the declarative batch runner over the bmoe engine (`check`, `plan`, `run`, `compare`,
//! `merge`, `schema`). The only place that reads the environment (`BMOE_*`, through the layering,
//! and the schedulers' shard variables).
//!
//! Exit status: 0 ok; 1 differences found (`compare`, `schema --check`) or items refused (`run`);
//! 2 usage, configuration or I/O error (clap's usage errors are 2 as well); 130 stopped by a signal.
mod compare;
mod config;
mod direct;
mod ident;
mod merge;
mod placement;
mod probe;
mod report;
mod run;
mod schema;
mod sink;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::{Args, CommandFactory, Parser, Subcommand, ValueEnum};
use serde::Serialize;

use config::job::Kind;
use run::prepare::{prepare, shown, Prepared, Selection};

/// Differences found (compare, schema --check) or items refused (run).
const EXIT_DIFF: u8 = 1;
/// Usage, configuration or I/O error.
const EXIT_ERROR: u8 = 2;
/// Stopped by Ctrl-C, SIGTERM or SIGHUP (the row in flight finished; resume with --resume).
const EXIT_STOPPED: u8 = 130;

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
struct Cli {
    /// Less output: no progress bars or progress lines.
    #[arg(short, long, global = true)]
    quiet: bool,
    /// More output: llama.cpp's own log on stderr (in runs too).
    #[arg(short, long, global = true)]
    verbose: bool,
    #[command(subcommand)]
    command: Command,
}

/// How a command prints its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
enum Format {
    /// Lines for people.
    #[default]
    Text,
    /// One JSON document on stdout.
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Check job and profile files (schema, then semantics, then placement), then load each model
    /// once in a child process (the probe; --no-probe skips it).
    Check(CheckArgs),
    /// Print each resolved value and where it came from, the placement and the memory budget.
    Plan(FormattedTarget),
    /// Run jobs: one CSV row per decision, prompt or text.
    Run(RunArgs),
    /// Compare two telemetry CSVs (one run of each), for nightly regression checks.
    Compare(CompareArgs),
    /// Merge the CSVs of a sharded run into one (checked, de-duplicated, written atomically).
    Merge(MergeArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(CompletionsArgs),
    /// Print the man page (roff), or write one page per command into a folder.
    Man(ManArgs),
    /// Summarise telemetry CSVs per (job, profile, sweep point): tables, plots, the best point.
    Report(ReportArgs),
    /// Write the JSON Schemas (profile, job, telemetry) generated from the code.
    Schema(SchemaArgs),
    /// List the ggml backends and devices of this build.
    Devices(direct::DevicesArgs),
    /// Write a synthetic MoE GGUF.
    Synth(direct::SynthArgs),
    /// List the model architectures this build writes and checks (coverage: docs/architectures.md).
    Archs(direct::ArchsArgs),
    /// Generate text once.
    Generate(direct::GenerateArgs),
    /// Score choices after a prompt (one prefill, no decode).
    Decide(direct::DecideArgs),
    /// Perplexity of a text file.
    Ppl(direct::PplArgs),
    /// The probe's child process: load a model, generate one token (used by check and run).
    #[command(name = "__probe", hide = true)]
    Probe {
        /// The GGUF model.
        model: PathBuf,
    },
}

/// Jobs and how to configure them.
#[derive(Args)]
struct Target {
    /// Job files (TOML).
    #[arg(required = true)]
    jobs: Vec<PathBuf>,
    /// Device profile; replaces each job's default `profile`.
    #[arg(long, short = 'p')]
    profile: Option<PathBuf>,
    /// Override a profile value (highest layer), e.g. --set cache_mb=auto; repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
    /// A TOML file of layered keys (e.g. from `bmoe report --best --write-overrides`): a layer
    /// above each job's [overrides], below its [sweep].
    #[arg(long, value_name = "FILE")]
    overrides: Option<PathBuf>,
}

/// `bmoe check`: a target, an output format, and whether to probe the models.
#[derive(Args)]
struct CheckArgs {
    #[command(flatten)]
    t: FormattedTarget,
    /// Do not load the models in a child process (trusted files); only their headers are checked.
    #[arg(long)]
    no_probe: bool,
}

/// A target plus an output format.
#[derive(Args)]
struct FormattedTarget {
    #[command(flatten)]
    target: Target,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
}

impl Target {
    fn selection(&self) -> Selection {
        Selection {
            profile: self.profile.clone(),
            sets: self.sets.clone(),
            overrides: self.overrides.clone(),
        }
    }
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    target: Target,
    /// Run id written to every row (default: <job>-<UTC timestamp>; with --shard <job>-<UTC date>,
    /// the same in every shard started that day).
    #[arg(long)]
    run_id: Option<String>,
    /// Continue a run: skip items already in the CSV for this run id (default: the job's last run).
    #[arg(long)]
    resume: bool,
    /// Print each row as one JSON object per line on stdout (JSON Lines, the CSV's column names).
    #[arg(long)]
    machine: bool,
    /// Run one shard: K/N with K 0-based (0/3, 1/3, 2/3), or N with K from JOB_COMPLETION_INDEX
    /// (Kubernetes Indexed Job) or SLURM_ARRAY_TASK_ID (Slurm array; SLURM_ARRAY_TASK_COUNT alone
    /// also shards). An item's shard depends only on its id.
    #[arg(long, value_name = "K/N")]
    shard: Option<String>,
    /// Write rows here instead of each job's `csv`; `{shard}` becomes the shard index K.
    #[arg(long, value_name = "PATH")]
    csv: Option<String>,
    /// Take at most N items of each job (after --shard and --items), for smoke runs.
    #[arg(long, value_name = "N")]
    limit: Option<usize>,
    /// Take only the items whose id matches this glob (`d1*`, `{open,close}-*`).
    #[arg(long, value_name = "GLOB")]
    items: Option<String>,
    /// Format of the summary printed at the end (rows always go to the CSV).
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
    /// Do not load each model once in a child process first (trusted files): a model that makes
    /// llama.cpp abort then ends the whole run instead of writing error rows.
    #[arg(long)]
    no_probe: bool,
}

#[derive(Args)]
struct CompareArgs {
    /// The baseline CSV.
    a: PathBuf,
    /// The CSV compared with it.
    b: PathBuf,
    /// Run id to take from A (default: its last run).
    #[arg(long)]
    run_a: Option<String>,
    /// Run id to take from B (default: its last run).
    #[arg(long)]
    run_b: Option<String>,
    /// Largest choice_logp / perplexity difference still counted as identical.
    #[arg(long, default_value_t = 0.0)]
    tolerance: f64,
    /// Kept for old scripts: a difference always exits 1 now (as diff does).
    #[arg(long, hide = true)]
    fail_on_diff: bool,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
}

#[derive(Args)]
struct MergeArgs {
    /// The CSVs to merge (the shards of one run).
    #[arg(required = true)]
    inputs: Vec<PathBuf>,
    /// The merged CSV (refused when it exists, unless --force).
    #[arg(short, long)]
    output: PathBuf,
    /// Replace the output when it exists.
    #[arg(long)]
    force: bool,
    /// Output format of the report.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
}

#[derive(Args)]
struct CompletionsArgs {
    /// The shell.
    shell: clap_complete::Shell,
}

#[derive(Args)]
struct ManArgs {
    /// Write bmoe.1 and one bmoe-<command>.1 per command into this folder instead of printing.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Report formats.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ReportFormat {
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
struct ReportArgs {
    /// Telemetry CSVs; read by column name, so files of different builds mix.
    #[arg(required = true)]
    csvs: Vec<PathBuf>,
    /// Write the report here (atomically) instead of stdout.
    #[arg(long, short = 'o', value_name = "FILE")]
    out: Option<PathBuf>,
    /// Output format (default: from the -o extension, else md).
    #[arg(long, value_enum)]
    format: Option<ReportFormat>,
    /// Reference point for agreement on `best` (default: each job and profile's first point).
    #[arg(long, value_name = "POINT")]
    reference: Option<String>,
    /// Only rows of this job.
    #[arg(long)]
    job: Option<String>,
    /// Only rows of this profile (by name).
    #[arg(long)]
    profile: Option<String>,
    /// Only rows of these runs; repeatable.
    #[arg(long = "run-id", value_name = "ID")]
    run_ids: Vec<String>,
    /// Profile files whose ram_mb is drawn on the peak RSS plot; repeatable.
    #[arg(long = "profile-file", value_name = "FILE")]
    profile_files: Vec<PathBuf>,
    /// Pick the best point of each job and profile (implied by --objective, --require,
    /// --write-overrides).
    #[arg(long)]
    best: bool,
    /// Metric or column to optimise (default: decode_tps where measured, else prefill_tps).
    #[arg(long, value_name = "NAME")]
    objective: Option<String>,
    /// A requirement on a metric or column, e.g. "peak_rss_mib<=6000"; repeatable.
    #[arg(long = "require", value_name = "NAME<=N")]
    requires: Vec<String>,
    /// Lower objective wins (default: lower for times, MiB and read per token).
    #[arg(long, conflicts_with = "maximize")]
    minimize: bool,
    /// Higher objective wins.
    #[arg(long)]
    maximize: bool,
    /// Write the best point as a TOML overlay for `--overrides` on check/plan/run.
    #[arg(long, value_name = "FILE")]
    write_overrides: Option<PathBuf>,
}

#[derive(Args)]
struct SchemaArgs {
    /// Folder to write into.
    #[arg(long, default_value = "schemas")]
    out: PathBuf,
    /// Write nothing; exit 1 when the files in --out differ from the code.
    #[arg(long)]
    check: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // llama.cpp's log is noise unless asked for; -v asks, in one-shot commands and runs alike.
    bmoe_engine::set_log_verbose(cli.verbose);
    match dispatch(cli.command, cli.quiet, cli.verbose) {
        Ok(code) => code,
        Err(e) => {
            // Display, never Debug: no backtrace on user input, whatever RUST_BACKTRACE says.
            eprintln!("error: {e:#}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}

/// Prints a value as pretty JSON on stdout.
fn print_json<T: Serialize>(v: &T) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, v).context("writing JSON to stdout")?;
    writeln!(out).context("writing JSON to stdout")
}

/// One job as `check --format json` reports it.
#[derive(Serialize)]
struct CheckedJob {
    file: String,
    name: String,
    kind: String,
    items: usize,
    points: usize,
    profile: String,
    csv: String,
}

/// `check --format json`.
#[derive(Serialize)]
struct CheckReport {
    ok: bool,
    jobs: Vec<CheckedJob>,
    warnings: Vec<String>,
}

fn check_report(p: &Prepared) -> CheckReport {
    let jobs = p
        .jobs
        .iter()
        .enumerate()
        .map(|(ji, j)| {
            let units: Vec<_> = p.units.iter().filter(|u| u.job == ji).collect();
            CheckedJob {
                file: shown(&j.src.path),
                name: j.job.name.clone(),
                kind: j.job.kind.to_string(),
                items: j.items.len(),
                points: units.len(),
                profile: units
                    .first()
                    .map(|u| u.profile.name.clone())
                    .unwrap_or_default(),
                csv: shown(&j.csv),
            }
        })
        .collect();
    CheckReport {
        ok: true,
        jobs,
        warnings: p.warnings.clone(),
    }
}

fn dispatch(cmd: Command, quiet: bool, verbose: bool) -> anyhow::Result<ExitCode> {
    let done = |r: anyhow::Result<()>| r.map(|()| ExitCode::SUCCESS);
    match cmd {
        Command::Devices(a) => done(direct::run_devices(a)),
        Command::Synth(a) => done(direct::run_synth(a)),
        Command::Archs(a) => done(direct::run_archs(a)),
        Command::Generate(mut a) => {
            a.engine.verbose = verbose;
            done(direct::run_generate(a))
        }
        Command::Decide(mut a) => {
            a.engine.verbose = verbose;
            done(direct::run_decide(a))
        }
        Command::Ppl(mut a) => {
            a.engine.verbose = verbose;
            done(direct::run_ppl(a))
        }
        Command::Probe { model } => done(probe::run_child(&model)),
        Command::Check(a) => {
            let t = &a.t;
            let p = prepare(&t.target.jobs, &t.target.selection())?;
            let bad = check_models(&p, !a.no_probe)?;
            // Choices tokenized with each model's vocabulary (the models that loaded).
            if let Err(e) = run::choices::check(&p.jobs, &|m| bad.contains_key(m)) {
                for why in bad.values() {
                    eprintln!("error: {why}");
                }
                return Err(e.into());
            }
            // A model that cannot load is a broken setup (2), like a configuration error.
            let code = if bad.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(2)
            };
            for why in bad.values() {
                eprintln!("error: {why}");
            }
            let rep = check_report(&p);
            if t.format == Format::Json {
                print_json(&rep)?;
                return Ok(code);
            }
            print_warnings(&p);
            for (j, lj) in rep.jobs.iter().zip(&p.jobs) {
                if bad.contains_key(&lj.model) {
                    continue;
                }
                println!(
                    "ok: {} ({} {} items, {} point(s), profile {}, csv {})",
                    j.file, j.items, j.kind, j.points, j.profile, j.csv
                );
            }
            Ok(code)
        }
        Command::Plan(t) => {
            let p = prepare(&t.target.jobs, &t.target.selection())?;
            if t.format == Format::Json {
                print_json(&plan_report(&p))?;
                return Ok(ExitCode::SUCCESS);
            }
            print_warnings(&p);
            print_plan(&p);
            Ok(ExitCode::SUCCESS)
        }
        Command::Run(a) => run_cmd(a, quiet),
        Command::Merge(a) => {
            let rep = merge::merge(&a.inputs, &a.output, a.force)?;
            if a.format == Format::Json {
                print_json(&rep)?;
            } else {
                println!(
                    "merged {} file(s): {} rows in, {} identical duplicate(s) dropped, {} rows written to {} (schema {}; run(s) {}; job(s) {})",
                    rep.inputs,
                    rep.rows_in,
                    rep.duplicates,
                    rep.rows_out,
                    rep.output,
                    rep.schema_version,
                    rep.runs.join(", "),
                    rep.jobs.join(", ")
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Completions(a) => {
            let mut cmd = Cli::command();
            clap_complete::generate(a.shell, &mut cmd, "bmoe", &mut std::io::stdout());
            Ok(ExitCode::SUCCESS)
        }
        Command::Man(a) => {
            write_man(a.out.as_deref())?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Report(a) => report_cmd(a),
        Command::Compare(a) => {
            let rep = compare::compare(
                &a.a,
                &a.b,
                &compare::CompareOptions {
                    run_a: a.run_a,
                    run_b: a.run_b,
                    tolerance: a.tolerance,
                },
            )?;
            if a.format == Format::Json {
                print_json(&rep.json())?;
            } else {
                print!("{}", rep.render());
            }
            // As diff: 1 when the runs differ, so CI tells a regression (1) from trouble (2).
            let _ = a.fail_on_diff;
            if !rep.identical() {
                return Ok(ExitCode::from(EXIT_DIFF));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Schema(a) => {
            if a.check {
                let stale = schema::stale(&a.out);
                if stale.is_empty() {
                    println!("schemas in {} are current", a.out.display());
                    return Ok(ExitCode::SUCCESS);
                }
                eprintln!(
                    "error: {} differ from the code in {}: run `bmoe schema --out {}`",
                    stale.join(", "),
                    a.out.display(),
                    a.out.display()
                );
                return Ok(ExitCode::from(EXIT_DIFF));
            }
            schema::write(&a.out)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Each distinct model of the jobs, checked: its header against what llama.cpp asserts on, then
/// (with `probe`) loaded once in a child process. Returns the models that failed, with why.
fn check_models(
    p: &Prepared,
    probe: bool,
) -> anyhow::Result<std::collections::HashMap<PathBuf, String>> {
    let mut bad = std::collections::HashMap::new();
    let mut seen = std::collections::HashSet::new();
    for j in &p.jobs {
        if !seen.insert(j.model.clone()) {
            continue;
        }
        if let Err(e) = bmoe_engine::gguf::check::check_file(&j.model) {
            bad.insert(j.model.clone(), e.to_string());
            continue;
        }
        if probe {
            let r = probe::probe(&j.model)?;
            match (&r, r.error()) {
                (_, Some(why)) => {
                    bad.insert(j.model.clone(), why.to_string());
                }
                (probe::ProbeResult::Ok { seconds }, None) => {
                    eprintln!(
                        "probe: {} loaded in a child process in {seconds:.2} s",
                        shown(&j.model)
                    );
                }
                _ => {}
            }
        }
    }
    Ok(bad)
}

fn print_warnings(p: &Prepared) {
    for w in &p.warnings {
        eprintln!("warning: {w}");
    }
}

fn print_plan(p: &Prepared) {
    for u in &p.units {
        let j = &p.jobs[u.job];
        let d = &u.placement.dims;
        println!(
            "job {} ({}) on profile {} ({}), point {}",
            j.job.name,
            shown(&j.src.path),
            u.profile.name,
            shown(&u.profile_path),
            u.point
        );
        println!(
            "  model: {} ({}, {} layers, {} experts top-{}, {:.1} MiB)",
            shown(&j.model),
            d.arch,
            d.n_layer,
            d.n_expert,
            d.n_expert_used,
            d.file_bytes as f64 / (1u64 << 20) as f64
        );
        println!("  items: {} {}", j.items.len(), j.job.kind);
        println!("  values:");
        for (k, v, o) in &u.resolved.origins {
            let shown_v = if k == "cache_mb" && v == "auto" {
                format!("auto -> {}", u.placement.cache_mb)
            } else {
                v.clone()
            };
            println!("    {k:<15} {shown_v:<14} {o}");
        }
        let t = &u.placement.threads;
        match t.asked {
            Some(n) if n > t.used => println!(
                "  threads: {n} asked, {} used (capped to the {} cores this process may use)",
                t.used, t.cores
            ),
            Some(n) => println!("  threads: {n} ({} cores usable)", t.cores),
            None => println!(
                "  threads: auto -> {} (the cores this process may use)",
                t.used
            ),
        }
        println!("  prefill: {}", u.placement.prefill.reason);
        let s = &u.resolved.settings;
        match &u.placement.prefill.device {
            Some(dev) => println!(
                "  ubatch: {dev} {} (pieces >= {} tokens), CPU {}",
                s.device_ubatch, s.min_tokens, s.cpu_ubatch
            ),
            None => println!("  ubatch: CPU {}", s.cpu_ubatch),
        }
        println!("  memory budget (context {} tokens):", u.placement.n_ctx);
        println!("{}", u.placement.table());
        println!();
    }
}

/// One resolved value and its origin, for `plan --format json`.
#[derive(Serialize)]
struct PlanValue {
    key: String,
    value: String,
    origin: String,
}

/// One budget line.
#[derive(Serialize)]
struct PlanBudgetLine {
    what: String,
    mib: f64,
    counted: bool,
    note: String,
}

/// One (job, profile point) as `plan --format json` reports it: the numbers the text shows.
#[derive(Serialize)]
struct PlanUnit {
    job: String,
    file: String,
    profile: String,
    profile_file: String,
    point: String,
    model: String,
    arch: String,
    n_layer: u64,
    n_expert: u64,
    n_expert_used: u64,
    model_mib: f64,
    kind: String,
    items: usize,
    values: Vec<PlanValue>,
    prefill_device: Option<String>,
    prefill_reason: String,
    device_ubatch: Option<u32>,
    min_tokens: Option<u32>,
    cpu_ubatch: u32,
    context: u64,
    cache_mb: u64,
    budget: Vec<PlanBudgetLine>,
    counted_mib: f64,
    available_mib: f64,
    ram_mib: f64,
    floor_mib: f64,
}

/// `plan --format json`.
#[derive(Serialize)]
struct PlanReport {
    units: Vec<PlanUnit>,
    warnings: Vec<String>,
}

fn plan_report(p: &Prepared) -> PlanReport {
    let units = p
        .units
        .iter()
        .map(|u| {
            let j = &p.jobs[u.job];
            let d = &u.placement.dims;
            let s = &u.resolved.settings;
            let dev = u.placement.prefill.device.clone();
            PlanUnit {
                job: j.job.name.clone(),
                file: shown(&j.src.path),
                profile: u.profile.name.clone(),
                profile_file: shown(&u.profile_path),
                point: u.point.clone(),
                model: shown(&j.model),
                arch: d.arch.clone(),
                n_layer: d.n_layer,
                n_expert: d.n_expert,
                n_expert_used: d.n_expert_used,
                model_mib: d.file_bytes as f64 / (1u64 << 20) as f64,
                kind: j.job.kind.to_string(),
                items: j.items.len(),
                values: u
                    .resolved
                    .origins
                    .iter()
                    .map(|(k, v, o)| PlanValue {
                        key: k.clone(),
                        value: v.clone(),
                        origin: o.clone(),
                    })
                    .collect(),
                device_ubatch: dev.as_ref().map(|_| s.device_ubatch),
                min_tokens: dev.as_ref().map(|_| s.min_tokens),
                prefill_device: dev,
                prefill_reason: u.placement.prefill.reason.clone(),
                cpu_ubatch: s.cpu_ubatch,
                context: u.placement.n_ctx,
                cache_mb: u.placement.cache_mb,
                counted_mib: u
                    .placement
                    .budget
                    .iter()
                    .filter(|l| l.counted)
                    .map(|l| l.mib)
                    .sum(),
                budget: u
                    .placement
                    .budget
                    .iter()
                    .map(|l| PlanBudgetLine {
                        what: l.what.to_string(),
                        mib: l.mib,
                        counted: l.counted,
                        note: l.note.clone(),
                    })
                    .collect(),
                available_mib: u.placement.available_mib,
                ram_mib: u.placement.ram_mib,
                floor_mib: u.placement.floor_mib,
            }
        })
        .collect();
    PlanReport {
        units,
        warnings: p.warnings.clone(),
    }
}

/// The man pages, from the same clap definition as `--help`.
fn write_man(out: Option<&Path>) -> anyhow::Result<()> {
    let cmd = Cli::command();
    let Some(dir) = out else {
        let mut stdout = std::io::stdout().lock();
        clap_mangen::Man::new(cmd)
            .render(&mut stdout)
            .context("writing the man page to stdout")?;
        return Ok(());
    };
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut pages = vec![("bmoe".to_string(), cmd.clone())];
    for sub in cmd.get_subcommands() {
        let name = format!("bmoe-{}", sub.get_name());
        pages.push((name.clone(), sub.clone().name(name)));
    }
    for (name, c) in pages {
        let path = dir.join(format!("{name}.1"));
        let mut buf = Vec::new();
        clap_mangen::Man::new(c)
            .render(&mut buf)
            .with_context(|| format!("rendering {name}.1"))?;
        std::fs::write(&path, buf).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// `--csv PATH`: every job's rows go there, `{shard}` replaced by the shard index. Checked before
/// anything runs: a template without a shard, or a path not ending `.csv`, is refused.
fn csv_override(template: &str, shard: Option<run::select::Shard>) -> anyhow::Result<PathBuf> {
    let path = if template.contains("{shard}") {
        let Some(s) = shard else {
            bail!("--csv {template:?}: the {{shard}} template needs a shard: give --shard K/N (or run in a Kubernetes Indexed Job or Slurm array with --shard N)");
        };
        template.replace("{shard}", &s.k.to_string())
    } else {
        template.to_string()
    };
    if !path.ends_with(".csv") {
        bail!("--csv {template:?}: expected a path ending in .csv");
    }
    Ok(PathBuf::from(path))
}

fn run_cmd(a: RunArgs, quiet: bool) -> anyhow::Result<ExitCode> {
    // Everything the command line decides is checked before the jobs load, so a bad flag writes
    // nothing.
    let env = |k: &str| std::env::var(k).ok();
    let shard = run::select::Shard::resolve(a.shard.as_deref(), &env)?;
    let csv = a
        .csv
        .as_deref()
        .map(|t| csv_override(t, shard))
        .transpose()?;
    let filter = run::select::Filter::new(shard, a.items.as_deref(), a.limit)?;
    let mut p = prepare(&a.target.jobs, &a.target.selection())?;
    if let Some(c) = &csv {
        for j in &mut p.jobs {
            j.csv = c.clone();
        }
    }
    print_warnings(&p);
    // Decision choices are checked against the tokenizer before anything is written; the models
    // of decide jobs are probed first, so a model that aborts llama.cpp kills the probe's child,
    // not this process. The run keeps the verdicts.
    let mut probed = std::collections::HashMap::new();
    if !a.no_probe {
        for j in p.jobs.iter().filter(|j| j.job.kind == Kind::Decide) {
            if !probed.contains_key(&j.model) {
                let r = probe::probe(&j.model)?;
                probed.insert(j.model.clone(), r.error().map(str::to_string));
            }
        }
    }
    run::choices::check(&p.jobs, &|m| matches!(probed.get(m), Some(Some(_))))?;
    let stop = run::signals::Stop::install();
    let opts = run::exec::RunOptions {
        probed,
        run_id: a.run_id,
        resume: a.resume,
        machine: a.machine,
        quiet,
        filter,
        probe: !a.no_probe,
    };
    let s = run::exec::execute(&p, &opts, &stop)?;
    // With --machine, stdout belongs to the row lines.
    if a.format == Format::Json {
        let json = serde_json::to_string_pretty(&s).context("writing the summary as JSON")?;
        if opts.machine {
            eprintln!("{json}");
        } else {
            println!("{json}");
        }
    } else {
        let mut out = String::new();
        for w in &s.written {
            out.push_str(&format!(
                "run {}{}: {} rows appended to {}\n",
                s.run_id,
                s.shard
                    .as_ref()
                    .map(|k| format!(" shard {k}"))
                    .unwrap_or_default(),
                w.rows,
                w.csv
            ));
        }
        out.push_str(&format!(
            "skipped {} items already in the run, {} refused by the engine\n",
            s.skipped, s.failed
        ));
        if s.prefill_tokens > 0 {
            out.push_str(&format!(
                "prefill: {} tokens in {:.3} s ({:.1} tokens/s)\n",
                s.prefill_tokens,
                s.prefill_s,
                if s.prefill_s > 0.0 {
                    s.prefill_tokens as f64 / s.prefill_s
                } else {
                    0.0
                }
            ));
        }
        if s.decisions > 0 {
            out.push_str(&format!("decisions: {}\n", s.decisions));
        }
        if let Some(acc) = s.accuracy {
            out.push_str(&format!(
                "accuracy: {}/{} decisions with an expected answer correct ({:.1}%)\n",
                s.correct,
                s.with_expected,
                acc * 100.0
            ));
        }
        if opts.machine {
            eprint!("{out}");
        } else {
            print!("{out}");
        }
    }
    if s.interrupted {
        eprintln!(
            "bmoe: interrupted; continue with: bmoe run {} --resume --run-id {}{}{}",
            a.target
                .jobs
                .iter()
                .map(|j| shown(j))
                .collect::<Vec<_>>()
                .join(" "),
            s.run_id,
            s.shard
                .as_ref()
                .map(|k| format!(" --shard {k}"))
                .unwrap_or_default(),
            a.csv
                .as_ref()
                .map(|c| format!(" --csv '{c}'"))
                .unwrap_or_default()
        );
        return Ok(ExitCode::from(EXIT_STOPPED));
    }
    if s.failed > 0 {
        return Ok(ExitCode::from(EXIT_DIFF));
    }
    Ok(ExitCode::SUCCESS)
}

/// Writes `text` to `path` through a temporary file in the same folder, so a failure leaves
/// nothing half-written.
fn write_atomic(path: &std::path::Path, text: &str) -> anyhow::Result<()> {
    use anyhow::Context;
    use std::io::Write;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    // Like a job's CSV, an output's folder is created on first use.
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut tmp = tempfile::NamedTempFile::new_in(&dir)
        .with_context(|| format!("creating a temporary file in {}", dir.display()))?;
    tmp.write_all(text.as_bytes())
        .with_context(|| format!("writing {}", path.display()))?;
    // A temporary file is private (0600); a report or overlay is an ordinary file.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = tmp
            .as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o644));
    }
    tmp.persist(path)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

fn report_cmd(a: ReportArgs) -> anyhow::Result<ExitCode> {
    use anyhow::Context;
    let mut ram = std::collections::BTreeMap::new();
    for f in &a.profile_files {
        let (p, _) = config::profile::load_profile(f)?;
        ram.insert(p.name, p.ram_mb as f64);
    }
    let want_best =
        a.best || a.objective.is_some() || !a.requires.is_empty() || a.write_overrides.is_some();
    let mut requires = Vec::new();
    for r in &a.requires {
        requires.extend(report::best::parse_requires(r)?);
    }
    let mut opts = report::Options {
        csvs: a.csvs.clone(),
        reference: a.reference.clone(),
        job: a.job.clone(),
        profile: a.profile.clone(),
        run_ids: a.run_ids.clone(),
        ram,
        best: None,
    };
    if want_best {
        let objective = match &a.objective {
            Some(o) => o.clone(),
            None => {
                // Without --objective: decode speed where anything decoded, else prefill speed.
                let probe = report::build(&opts)?;
                if probe
                    .groups
                    .iter()
                    .any(|g| g.metrics.contains_key("decode_tps"))
                {
                    "decode_tps".to_string()
                } else {
                    "prefill_tps".to_string()
                }
            }
        };
        let minimize = if a.minimize {
            true
        } else if a.maximize {
            false
        } else {
            report::best::default_minimize(&objective)
        };
        opts.best = Some(report::best::BestSpec {
            objective,
            minimize,
            requires,
        });
    }
    let rep = report::build(&opts)?;
    for n in rep.notes.iter().filter(|n| n.starts_with("left out:")) {
        eprintln!("warning: {n}");
    }
    let format = match (a.format, &a.out) {
        (Some(f), _) => f,
        (None, Some(p)) => match p.extension().and_then(|e| e.to_str()) {
            Some("md") => ReportFormat::Md,
            Some("json") => ReportFormat::Json,
            _ => ReportFormat::Html,
        },
        (None, None) => ReportFormat::Md,
    };
    let text = report::render::render(
        &rep,
        match format {
            ReportFormat::Html => report::render::Format::Html,
            ReportFormat::Md => report::render::Format::Md,
            ReportFormat::Json => report::render::Format::Json,
        },
    );
    // The overlay first: a report naming a winner whose overlay failed would mislead.
    if let Some(path) = &a.write_overrides {
        let b = match rep.best.as_slice() {
            [one] => one,
            many => {
                return Err(report::ReportError::SeveralPairs {
                    pairs: many
                        .iter()
                        .map(|b| format!("{}/{}", b.job, b.profile))
                        .collect::<Vec<_>>()
                        .join(", "),
                }
                .into())
            }
        };
        let how = format!(
            "bmoe report --best --objective {}{}",
            b.objective,
            a.requires
                .iter()
                .map(|r| format!(" --require \"{r}\""))
                .collect::<String>()
        );
        let toml = report::best::overlay_toml(b, &how)?;
        // The values come from a CSV's point label: check them as `--overrides` will, so a file
        // that `bmoe check` would refuse is never written.
        let value = toml::from_str::<toml::Value>(&toml)
            .map_err(anyhow::Error::from)
            .and_then(|v| serde_json::to_value(v).map_err(anyhow::Error::from))
            .context("--write-overrides: the overlay does not read back")?;
        let schema = schema::item_schema::<config::settings::Overrides>();
        let bad = config::validate::validate(&schema, &value);
        if !bad.is_empty() {
            anyhow::bail!(
                "--write-overrides: point {} does not make a valid overlay: {}",
                b.point,
                bad.iter()
                    .map(|v| format!("{}: {}", v.field, v.message))
                    .collect::<Vec<_>>()
                    .join("; ")
            );
        }
        write_atomic(path, &toml).context("--write-overrides")?;
        eprintln!("wrote {} (point {})", shown(path), b.point);
    }
    match &a.out {
        Some(p) => {
            write_atomic(p, &text)?;
            eprintln!("wrote {} ({} plot(s))", shown(p), rep.plots.len());
            if !rep.best.is_empty() {
                print!("{}", report::best::render(&rep.best));
            }
        }
        None => {
            print!("{text}");
            // Markdown and JSON already carry the winner; say it on stderr only for md piping.
        }
    }
    Ok(ExitCode::SUCCESS)
}
