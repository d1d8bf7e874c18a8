//! `bmoe run`: the jobs' items selected, executed, and one CSV row each; the run's summary.
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};

use super::output::print_warnings;
use super::{EXIT_DIFF, EXIT_STOPPED};
use crate::cli::{Format, RunArgs};
use crate::config::item::Kind;
use crate::config::paths::display_path;
use crate::load_probe;
use crate::run;
use crate::run::prepare::{prepare, Prepared};

/// `--csv PATH`: every job's rows go there, `{shard}` replaced by the shard index. Checked before
/// anything runs: a template without a shard, or a path not ending `.csv`, is refused.
pub(crate) fn csv_override(
    template: &str,
    shard: Option<run::select::Shard>,
) -> anyhow::Result<PathBuf> {
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

/// Runs `bmoe run`.
pub fn run(a: RunArgs, quiet: bool) -> anyhow::Result<ExitCode> {
    // First of all: a SIGTERM while the jobs load or the probe runs (a scheduler stopping a task
    // that just started) must stop the run the clean way, exit 130 before any item, not kill it
    // with the signal's default action (a status a Slurm entrypoint does not requeue).
    let stop = run::signals::Stop::install();
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
    let mut p = match prepare(&a.target.jobs, &selection(&a)) {
        Ok(p) => p,
        Err(e) => return super::output::fail(e, a.format),
    };
    if let Some(c) = &csv {
        for j in &mut p.jobs {
            j.csv = c.clone();
        }
    }
    check_selection(&filter, &p, a.allow_empty)?;
    print_warnings(&p);
    // Test hook: another folder for the memory cgroups (a run refused where none can be made).
    let cgroup_root = std::env::var_os("BMOE_CGROUP_ROOT").map(PathBuf::from);
    let cgroups = run::exec::check_limits(&p, cgroup_root.as_deref())?;
    let probed = probe_decide_models(&p, a.no_probe)?;
    let skip = |m: &Path| matches!(probed.get(m), Some(Some(_)));
    if let Err(e) = run::choices::check(&p.jobs, &skip, false) {
        return super::output::fail(e.into(), a.format);
    }
    let opts = run::exec::RunOptions {
        probed,
        run_id: a.run_id.clone(),
        resume: a.resume,
        retry_errors: a.retry_errors,
        machine: a.machine,
        quiet,
        filter,
        probe: !a.no_probe,
        cgroups,
        child_args: std::env::args_os().skip(1).collect(),
    };
    let s = run::exec::execute(&p, &opts, &stop)?;
    print_summary(&s, a.format, opts.machine)?;
    if s.interrupted {
        eprintln!("{}", resume_hint(&a, &s));
        return Ok(ExitCode::from(EXIT_STOPPED));
    }
    if s.failed > 0 {
        return Ok(ExitCode::from(EXIT_DIFF));
    }
    Ok(ExitCode::SUCCESS)
}

/// The run's layers: the target's, with `--load-timeout`, `--memory-limit` and `--cold-start` as
/// the highest layer of their settings.
pub(crate) fn selection(a: &RunArgs) -> crate::run::prepare::Selection {
    let mut sel = a.target.selection_with(a.load_timeout);
    if let Some(m) = a.memory_limit {
        sel.sets.push(format!("memory_limit={m}"));
    }
    if a.cold_start {
        sel.sets.push("cold_start=true".into());
    }
    sel
}

/// Refuses a selection (shard, `--items`, `--limit`) that takes no item, unless `--allow-empty`
/// says so, and then only says it.
fn check_selection(
    filter: &run::select::Filter,
    p: &Prepared,
    allow_empty: bool,
) -> anyhow::Result<()> {
    let jobs: Vec<(&str, Vec<(&str, &str)>)> = p
        .jobs
        .iter()
        .map(|j| {
            let items = j
                .items
                .iter()
                .map(|it| (it.id.as_str(), it.shard_key()))
                .collect();
            (j.job.name.as_str(), items)
        })
        .collect();
    if let Err(e) = filter.refuse_empty_keyed(&jobs) {
        if !allow_empty {
            return Err(e.into());
        }
        eprintln!("bmoe: {} (--allow-empty)", e.selection_line());
    }
    Ok(())
}

/// Decision choices are checked against the tokenizer before anything is written; the models of
/// decide jobs are probed first, so a model that aborts llama.cpp kills the probe's child, not
/// this process. The run keeps the verdicts (model -> the probe's error).
fn probe_decide_models(
    p: &Prepared,
    no_probe: bool,
) -> anyhow::Result<HashMap<PathBuf, Option<String>>> {
    let mut probed = HashMap::new();
    if !no_probe {
        for j in p.jobs.iter().filter(|j| j.job.kind == Kind::Decide) {
            if !probed.contains_key(&j.model) {
                let r = load_probe::probe(&j.model, p.load_timeout(&j.model))?;
                probed.insert(j.model.clone(), r.error().map(str::to_string));
            }
        }
    }
    Ok(probed)
}

/// Prints the run's summary; with --machine, stdout belongs to the row lines, so it goes to
/// stderr.
fn print_summary(s: &run::exec::Summary, format: Format, machine: bool) -> anyhow::Result<()> {
    if format == Format::Json {
        let json = serde_json::to_string_pretty(s).context("writing the summary as JSON")?;
        if machine {
            eprintln!("{json}");
        } else {
            println!("{json}");
        }
    } else {
        let out = summary_text(s);
        if machine {
            eprint!("{out}");
        } else {
            print!("{out}");
        }
    }
    Ok(())
}

/// The command that continues an interrupted run.
fn resume_hint(a: &RunArgs, s: &run::exec::Summary) -> String {
    format!(
        "bmoe: interrupted; continue with: bmoe run {} --resume --run-id {}{}{}",
        a.target
            .jobs
            .iter()
            .map(|j| display_path(j))
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
    )
}

/// `n thing` or `n things`.
fn count(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// `what: N tokens in S s (R tok/s)`, or nothing when no token was counted.
fn tokens_line(what: &str, tokens: u64, seconds: f64) -> String {
    if tokens == 0 {
        return String::new();
    }
    format!(
        "{what}: {} in {seconds:.3} s ({})\n",
        count(tokens, "token", "tokens"),
        rate(tokens, seconds)
    )
}

/// A rate with three significant digits, in the unit llama.cpp's tools print (`tok/s`).
fn rate(tokens: u64, seconds: f64) -> String {
    if seconds <= 0.0 {
        return "- tok/s".into();
    }
    let r = tokens as f64 / seconds;
    let decimals = if r >= 100.0 {
        0
    } else if r >= 10.0 {
        1
    } else {
        2
    };
    format!("{r:.decimals$} tok/s")
}

/// The run's summary for people: rows per CSV, then what each kind of job measured.
fn summary_text(s: &run::exec::Summary) -> String {
    let mut out = String::new();
    let shard = s
        .shard
        .as_ref()
        .map(|k| format!(" shard {k}"))
        .unwrap_or_default();
    for w in &s.written {
        out.push_str(&format!(
            "run {}{shard}: {} appended to {}\n",
            s.run_id,
            count(w.rows, "row", "rows"),
            w.csv
        ));
    }
    if s.skipped > 0 || s.failed > 0 {
        out.push_str(&format!(
            "skipped {} already in the run, {} refused by the engine\n",
            count(s.skipped, "item", "items"),
            s.failed
        ));
    }
    out.push_str(&tokens_line("prefill", s.prefill_tokens, s.prefill_s));
    out.push_str(&tokens_line("decode", s.decode_tokens, s.decode_s));
    if let Some(ppl) = s.ppl {
        out.push_str(&format!(
            "perplexity: {ppl:.4} +/- {:.4} over {} (mean NLL {:.4} nats)\n",
            s.ppl_stderr.unwrap_or(0.0),
            count(s.ppl_tokens, "scored token", "scored tokens"),
            s.nll_sum / s.ppl_tokens as f64
        ));
    }
    if s.decisions > 0 {
        out.push_str(&format!(
            "decisions: {}\n",
            count(s.decisions, "decision", "decisions")
        ));
    }
    if let Some(acc) = s.accuracy {
        out.push_str(&format!(
            "accuracy: {}/{} decisions with an expected answer correct ({:.1}%)\n",
            s.correct,
            s.with_expected,
            acc * 100.0
        ));
    }
    out
}
