//! `bmoe`: the declarative batch runner over the bmoe engine (`check`, `plan`, `run`, `compare`,
//! `schema`). The only place that reads the environment (`BMOE_*`, through the layering).
mod compare;
mod config;
mod direct;
mod placement;
mod probe;
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
    /// Check job and profile files (schema, then semantics, then placement), then load each model
    /// once in a child process (the probe; --no-probe skips it).
    Check(CheckArgs),
    /// Print each resolved value and where it came from, the placement and the memory budget.
    Plan(Target),
    /// Run jobs: one CSV row per decision, prompt or text.
    Run(RunArgs),
    /// Compare two telemetry CSVs (one run of each), for nightly regression checks.
    Compare(CompareArgs),
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
    /// The probe's child process: load a model, generate one token (used by check and run).
    #[command(name = "__probe", hide = true)]
    Probe {
        /// The GGUF model.
        model: PathBuf,
    },
}

#[derive(Args)]
struct CheckArgs {
    #[command(flatten)]
    target: Target,
    /// Do not load the models in a child process (trusted files); only their headers are checked.
    #[arg(long)]
    no_probe: bool,
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
}

impl Target {
    fn selection(&self) -> Selection {
        Selection {
            profile: self.profile.clone(),
            sets: self.sets.clone(),
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
    /// Exit with status 1 when any row differs or is unmatched (for CI).
    #[arg(long)]
    fail_on_diff: bool,
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
        Command::Probe { model } => done(probe::run_child(&model)),
        Command::Check(a) => {
            let t = &a.target;
            let p = prepare(&t.jobs, &t.selection())?;
            print_warnings(&p);
            let bad = check_models(&p, !a.no_probe)?;
            for j in &p.jobs {
                if let Some(why) = bad.get(&j.model) {
                    eprintln!("error: {why}");
                    continue;
                }
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
            Ok(if bad.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Plan(t) => {
            let p = prepare(&t.jobs, &t.selection())?;
            print_warnings(&p);
            print_plan(&p);
            Ok(ExitCode::SUCCESS)
        }
        Command::Run(a) => run_cmd(a),
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
        if let Err(e) = bmoe_engine::gguf_check::check_file(&j.model) {
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
        probe: !a.no_probe,
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
