//! `bmoe`: the declarative batch runner over the bmoe engine (`check`, `plan`, `run`, `compare`,
//! `schema`). The only place that reads the environment (`BMOE_*`, through the layering).
mod compare;
mod config;
mod direct;
mod placement;
mod report;
mod run;
mod schema;
mod sink;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use run::prepare::{prepare, shown, Prepared, Selection};

/// bmoe: run mixture-of-experts models as declarative batch jobs.
#[derive(Parser)]
#[command(name = "bmoe", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check job and profile files (schema, then semantics, then placement); loads no model.
    Check(Target),
    /// Print each resolved value and where it came from, the placement and the memory budget.
    Plan(Target),
    /// Run jobs: one CSV row per decision, prompt or text.
    Run(RunArgs),
    /// Compare two telemetry CSVs (one run of each), for nightly regression checks.
    Compare(CompareArgs),
    /// Summarise telemetry CSVs per (job, profile, sweep point): tables, plots, the best point.
    Report(ReportArgs),
    /// Write the JSON Schemas (profile, job, telemetry) generated from the code.
    Schema(SchemaArgs),
    /// List the ggml backends and devices of this build.
    Devices(direct::DevicesArgs),
    /// Write a synthetic MoE GGUF.
    Synth(direct::SynthArgs),
    /// Generate text once.
    Generate(direct::GenerateArgs),
    /// Score choices after a prompt (one prefill, no decode).
    Decide(direct::DecideArgs),
    /// Perplexity of a text file.
    Ppl(direct::PplArgs),
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
    /// Run id written to every row (default: <job>-<UTC timestamp>).
    #[arg(long)]
    run_id: Option<String>,
    /// Continue a run: skip items already in the CSV for this run id (default: the job's last run).
    #[arg(long)]
    resume: bool,
    /// Print BMOE_DECIDE / BMOE_DONE JSON lines on stdout, one per row.
    #[arg(long)]
    machine: bool,
    /// No progress bars (they are drawn only on a terminal anyway).
    #[arg(long, short = 'q')]
    quiet: bool,
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
    /// Exit with status 1 when any row differs or is unmatched (for CI).
    #[arg(long)]
    fail_on_diff: bool,
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
    bmoe_engine::set_log_verbose(false);
    match dispatch(cli.command) {
        Ok(code) => code,
        Err(e) => {
            // Display, never Debug: no backtrace on user input, whatever RUST_BACKTRACE says.
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn dispatch(cmd: Command) -> anyhow::Result<ExitCode> {
    let done = |r: anyhow::Result<()>| r.map(|()| ExitCode::SUCCESS);
    match cmd {
        Command::Devices(a) => done(direct::run_devices(a)),
        Command::Synth(a) => done(direct::run_synth(a)),
        Command::Generate(a) => done(direct::run_generate(a)),
        Command::Decide(a) => done(direct::run_decide(a)),
        Command::Ppl(a) => done(direct::run_ppl(a)),
        Command::Check(t) => {
            let p = prepare(&t.jobs, &t.selection())?;
            print_warnings(&p);
            for j in &p.jobs {
                let units: Vec<_> = p
                    .units
                    .iter()
                    .filter(|u| std::ptr::eq(&p.jobs[u.job], j))
                    .collect();
                let profile = units
                    .first()
                    .map(|u| u.profile.name.clone())
                    .unwrap_or_default();
                println!(
                    "ok: {} ({} {} items, {} point(s), profile {}, csv {})",
                    shown(&j.src.path),
                    j.items.len(),
                    j.job.kind,
                    units.len(),
                    profile,
                    shown(&j.csv)
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Plan(t) => {
            let p = prepare(&t.jobs, &t.selection())?;
            print_warnings(&p);
            print_plan(&p);
            Ok(ExitCode::SUCCESS)
        }
        Command::Run(a) => run_cmd(a),
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
            print!("{}", rep.render());
            if a.fail_on_diff && !rep.identical() {
                eprintln!("error: the runs differ (--fail-on-diff)");
                return Ok(ExitCode::FAILURE);
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
                return Ok(ExitCode::FAILURE);
            }
            schema::write(&a.out)?;
            Ok(ExitCode::SUCCESS)
        }
    }
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

fn run_cmd(a: RunArgs) -> anyhow::Result<ExitCode> {
    let p = prepare(&a.target.jobs, &a.target.selection())?;
    print_warnings(&p);
    let stop = run::signals::Stop::install();
    let opts = run::exec::RunOptions {
        run_id: a.run_id,
        resume: a.resume,
        machine: a.machine,
        quiet: a.quiet,
    };
    let s = run::exec::execute(&p, &opts, &stop)?;
    let mut out = String::new();
    for (csv, n) in &s.written {
        out.push_str(&format!(
            "run {}: {n} rows appended to {}\n",
            s.run_id,
            shown(csv)
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
    // With --machine, stdout belongs to the BMOE_* lines.
    if opts.machine {
        eprint!("{out}");
    } else {
        print!("{out}");
    }
    if s.interrupted {
        eprintln!(
            "bmoe: interrupted; continue with: bmoe run {} --resume --run-id {}",
            a.target
                .jobs
                .iter()
                .map(|j| shown(j))
                .collect::<Vec<_>>()
                .join(" "),
            s.run_id
        );
        return Ok(ExitCode::from(130));
    }
    if s.failed > 0 {
        return Ok(ExitCode::FAILURE);
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
