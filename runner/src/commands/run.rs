//! `bmoe run`: the jobs' items selected, executed, and one CSV row each; the run's summary.
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};

use super::output::print_warnings;
use super::{EXIT_DIFF, EXIT_STOPPED};
use crate::cli::{Format, RunArgs};
use crate::config::job::Kind;
use crate::probe;
use crate::run;
use crate::run::prepare::{prepare, shown};

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

/// Runs `bmoe run`.
pub fn run(a: RunArgs, quiet: bool) -> anyhow::Result<ExitCode> {
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
    let mut p = match prepare(&a.target.jobs, &a.target.selection()) {
        Ok(p) => p,
        Err(e) => return super::output::fail(e, a.format),
    };
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
    let skip = |m: &std::path::Path| matches!(probed.get(m), Some(Some(_)));
    if let Err(e) = run::choices::check(&p.jobs, &skip, false) {
        return super::output::fail(e.into(), a.format);
    }
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
