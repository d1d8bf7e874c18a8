//! `bmoe report`: tables, plots and the best point per (job, profile, sweep point).
use std::process::ExitCode;

use super::output::write_atomic;
use crate::cli::{ReportArgs, ReportFormat};
use crate::config::paths::display_path;
use crate::sink::output::{check_output, OutputKind};
use crate::{config, report};

/// Runs `bmoe report`.
pub fn report(a: ReportArgs) -> anyhow::Result<ExitCode> {
    // The outputs are checked before anything is read or computed: a refused one leaves nothing.
    let inputs = [a.csvs.clone(), a.profile_files.clone()].concat();
    if let Some(p) = &a.out {
        check_output(p, &inputs, OutputKind::Report, "-o", a.force)?;
    }
    if let Some(p) = &a.write_overrides {
        check_output(
            p,
            &inputs,
            OutputKind::Overlay,
            "--write-overrides",
            a.force,
        )?;
    }
    let format = format_of(&a)?;
    let opts = options(&a)?;
    let rep = report::build(&opts)?;
    for w in &rep.warnings {
        eprintln!("warning: {w}");
    }
    let text = report::render::render(&rep, format);
    // The overlay first: a report naming a winner whose overlay failed would mislead.
    if let Some(path) = &a.write_overrides {
        write_overrides(&a, &rep, path)?;
    }
    match &a.out {
        Some(p) => {
            write_atomic(p, &text)?;
            eprintln!("wrote {} ({} plot(s))", display_path(p), rep.plots.len());
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

/// Without --objective: decode speed where anything decoded, else decisions a second where a
/// decide job ran (prefix reuse raises it, not `prefill_tps`), else prefill speed.
fn default_objective(opts: &report::Options) -> anyhow::Result<String> {
    let probe = report::build(opts)?;
    let measured = |m: &str| probe.groups.iter().any(|g| g.metrics.contains_key(m));
    let first = ["decode_tps", "decisions_per_s"]
        .into_iter()
        .find(|m| measured(m))
        .unwrap_or("prefill_tps");
    Ok(first.to_string())
}

/// `--format`, else the output's extension (`.html`, `.md`, `.json`), else Markdown on stdout;
/// an `-o` extension that is none of these, or not `--format`'s, is refused.
fn format_of(a: &ReportArgs) -> anyhow::Result<report::render::Format> {
    const EXTENSIONS: [(&str, ReportFormat); 3] = [
        ("html", ReportFormat::Html),
        ("md", ReportFormat::Md),
        ("json", ReportFormat::Json),
    ];
    let ext = a.out.as_ref().map(|p| {
        let e = p.extension().and_then(|e| e.to_str()).unwrap_or_default();
        (display_path(p), e.to_ascii_lowercase())
    });
    let by_ext = |e: &str| EXTENSIONS.iter().find(|(x, _)| *x == e).map(|(_, f)| *f);
    let name = |f: ReportFormat| {
        EXTENSIONS
            .iter()
            .find(|(_, x)| *x == f)
            .map_or("", |(e, _)| e)
    };
    let format = match (a.format, ext) {
        // A name without an extension is whatever --format says.
        (Some(f), Some((file, e))) if !e.is_empty() && by_ext(&e) != Some(f) => {
            let or = if by_ext(&e).is_some() {
                format!(", or give --format {e}")
            } else {
                String::new()
            };
            anyhow::bail!(
                "-o {file}: a .{e} name for --format {}; name it .{}{or}",
                name(f),
                name(f)
            )
        }
        (Some(f), _) => f,
        (None, Some((file, e))) => by_ext(&e).ok_or_else(|| {
            anyhow::anyhow!(
                "-o {file}: a report is .html, .md or .json (the extension chooses the format); \
                 rename it, or give --format html, md or json"
            )
        })?,
        (None, None) => ReportFormat::Md,
    };
    Ok(match format {
        ReportFormat::Html => report::render::Format::Html,
        ReportFormat::Md => report::render::Format::Md,
        ReportFormat::Json => report::render::Format::Json,
    })
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
    let schema = config::json_schema::item_schema::<config::settings::Overrides>();
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
    eprintln!("wrote {} (point {})", display_path(path), b.point);
    Ok(())
}
