//! `bmoe report`: tables, plots and the best point per (job, profile, sweep point).
use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;

use super::output::write_atomic;
use crate::cli::{ReportArgs, ReportFormat};
use crate::run::prepare::shown;
use crate::{config, report};

/// Runs `bmoe report`.
pub fn report(a: ReportArgs) -> anyhow::Result<ExitCode> {
    let ram = profile_ram(&a)?;
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
    let want_best =
        a.best || a.objective.is_some() || !a.requires.is_empty() || a.write_overrides.is_some();
    if want_best {
        opts.best = Some(best_spec(&a, &opts, requires)?);
    }
    let rep = report::build(&opts)?;
    for w in &rep.warnings {
        eprintln!("warning: {w}");
    }
    let text = report::render::render(
        &rep,
        match report_format(&a) {
            ReportFormat::Html => report::render::Format::Html,
            ReportFormat::Md => report::render::Format::Md,
            ReportFormat::Json => report::render::Format::Json,
        },
    );
    // The overlay first: a report naming a winner whose overlay failed would mislead.
    if let Some(path) = &a.write_overrides {
        write_overrides(&a, &rep, path)?;
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

/// Each `--profile-file`'s RAM by profile name (the report's memory lines).
fn profile_ram(a: &ReportArgs) -> anyhow::Result<BTreeMap<String, f64>> {
    let mut ram = BTreeMap::new();
    for f in &a.profile_files {
        let (p, _) = config::profile::load_profile(f)?;
        ram.insert(p.name, p.ram_mb as f64);
    }
    Ok(ram)
}

/// What `--best` optimizes: the objective asked for or the default one, and its direction.
fn best_spec(
    a: &ReportArgs,
    opts: &report::Options,
    requires: Vec<report::best::Require>,
) -> anyhow::Result<report::best::BestSpec> {
    let objective = match &a.objective {
        Some(o) => o.clone(),
        None => {
            // Without --objective: decode speed where anything decoded, else prefill speed.
            let probe = report::build(opts)?;
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
    Ok(report::best::BestSpec {
        objective,
        minimize,
        requires,
    })
}

/// The format asked for, else the one `--out`'s extension names, else Markdown.
fn report_format(a: &ReportArgs) -> ReportFormat {
    match (a.format, &a.out) {
        (Some(f), _) => f,
        (None, Some(p)) => match p.extension().and_then(|e| e.to_str()) {
            Some("md") => ReportFormat::Md,
            Some("json") => ReportFormat::Json,
            _ => ReportFormat::Html,
        },
        (None, None) => ReportFormat::Md,
    }
}

/// `--write-overrides`: the one winner's point as an overrides file, checked as `--overrides`
/// will check it before it is written.
fn write_overrides(a: &ReportArgs, rep: &report::Report, path: &Path) -> anyhow::Result<()> {
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
    let schema = config::schema::item_schema::<config::settings::Overrides>();
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
    Ok(())
}
