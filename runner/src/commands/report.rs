//! `bmoe report`: tables, plots and the best point per (job, profile, sweep point).
use std::process::ExitCode;

use super::output::write_atomic;
use crate::cli::{ReportArgs, ReportFormat};
use crate::run::prepare::shown;
use crate::{config, report};

/// Runs `bmoe report`.
pub fn report(a: ReportArgs) -> anyhow::Result<ExitCode> {
    let opts = options(&a)?;
    let rep = report::build(&opts)?;
    for w in &rep.warnings {
        eprintln!("warning: {w}");
    }
    let text = report::render::render(&rep, format_of(&a));
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

/// The report's options from the command line, `--best`'s spec included when asked for.
fn options(a: &ReportArgs) -> anyhow::Result<report::Options> {
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
            None => default_objective(&opts)?,
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
    Ok(opts)
}

/// Without --objective: decode speed where anything decoded, else prefill speed.
fn default_objective(opts: &report::Options) -> anyhow::Result<String> {
    let probe = report::build(opts)?;
    let decoded = probe
        .groups
        .iter()
        .any(|g| g.metrics.contains_key("decode_tps"));
    Ok(if decoded { "decode_tps" } else { "prefill_tps" }.to_string())
}

/// `--format`, else the output's extension, else Markdown.
fn format_of(a: &ReportArgs) -> report::render::Format {
    let format = match (a.format, &a.out) {
        (Some(f), _) => f,
        (None, Some(p)) => match p.extension().and_then(|e| e.to_str()) {
            Some("md") => ReportFormat::Md,
            Some("json") => ReportFormat::Json,
            _ => ReportFormat::Html,
        },
        (None, None) => ReportFormat::Md,
    };
    match format {
        ReportFormat::Html => report::render::Format::Html,
        ReportFormat::Md => report::render::Format::Md,
        ReportFormat::Json => report::render::Format::Json,
    }
}

/// `--write-overrides`: the one winner's point as an overlay, checked as `--overrides` will
/// read it, so a file that `bmoe check` would refuse is never written.
fn write_overrides(
    a: &ReportArgs,
    rep: &report::Report,
    path: &std::path::Path,
) -> anyhow::Result<()> {
    use anyhow::Context;
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
