//! `bmoe check`: schema, semantics and placement, then each model probed once in a child process.
use std::path::PathBuf;
use std::process::ExitCode;

use serde::Serialize;

use super::output::{fail, print_json, print_warnings};
use crate::cli::{CheckArgs, Format};
use crate::config::diag::{ConfigErrors, Diagnostic};
use crate::config::paths::display_path;
use crate::load_probe;
use crate::run;
use crate::run::prepare::{prepare, Prepared};

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
                file: display_path(&j.src.path),
                name: j.job.name.clone(),
                kind: j.job.kind.to_string(),
                items: j.items.len(),
                points: units.len(),
                profile: units
                    .first()
                    .map(|u| u.profile.name.clone())
                    .unwrap_or_default(),
                csv: display_path(&j.csv),
            }
        })
        .collect();
    CheckReport {
        ok: true,
        jobs,
        warnings: p.warnings.clone(),
    }
}

/// Runs `bmoe check`.
pub fn check(a: CheckArgs) -> anyhow::Result<ExitCode> {
    let t = &a.t;
    let p = match prepare(&t.target.jobs, &t.target.selection_with(a.load_timeout)) {
        Ok(p) => p,
        Err(e) => return fail(e, t.format),
    };
    let bad = check_models(&p, !a.no_probe)?;
    // Choices tokenized with each model's vocabulary (the models that loaded).
    let choices = run::choices::check(&p.jobs, &|m| bad.contains_key(m), true);
    // A model that cannot load is a broken setup (2), like a configuration error.
    if choices.is_err() || !bad.is_empty() {
        let mut errs = choices.err().unwrap_or(ConfigErrors(Vec::new()));
        if t.format == Format::Json {
            print_warnings(&p);
            for (m, why) in &bad {
                errs.0.push(Diagnostic::file(m, why.clone()));
            }
            return fail(errs.into(), t.format);
        }
        for why in bad.values() {
            eprintln!("error: {why}");
        }
        if !errs.0.is_empty() {
            return Err(errs.into());
        }
    }
    let code = if bad.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    };
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
            let r = load_probe::probe(&j.model, p.load_timeout(&j.model))?;
            match (&r, r.error()) {
                (_, Some(why)) => {
                    bad.insert(j.model.clone(), why.to_string());
                }
                (load_probe::ProbeResult::Ok { seconds }, None) => {
                    eprintln!(
                        "probe: {} loaded in a child process in {seconds:.2} s",
                        display_path(&j.model)
                    );
                }
                _ => {}
            }
        }
    }
    Ok(bad)
}
