//! `bmoe profile measure`: measure this machine and write a profile, checked like any other
//! before it replaces anything.
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;

use crate::cli::{MeasureArgs, ProfileCommand};
use crate::config::profile::load_profile;

mod measure;

use measure::{measure, profile_toml, write_scratch, ReadPlan};

/// Runs `bmoe profile ...`.
pub fn profile(c: ProfileCommand) -> anyhow::Result<ExitCode> {
    match c {
        ProfileCommand::Measure(a) => measure_command(a),
    }
}

/// The profile's name: the output's file stem, checked against the name rule of profiles.
fn name_of(a: &MeasureArgs) -> anyhow::Result<String> {
    let stem = a
        .out
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or_default()
        .to_string();
    let ok = stem.len() <= 64
        && stem
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric())
        && stem
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    anyhow::ensure!(
        ok && a.out.extension().is_some_and(|e| e == "toml"),
        "--output {}: expected a file NAME.toml whose NAME is letters, digits, '.', '_' or '-' (the profile's name)",
        a.out.display()
    );
    Ok(stem)
}

/// Runs `bmoe profile measure`.
fn measure_command(a: MeasureArgs) -> anyhow::Result<ExitCode> {
    let name = name_of(&a)?;
    anyhow::ensure!(
        a.force || !a.out.exists(),
        "{} exists: give --force to replace it",
        a.out.display()
    );
    anyhow::ensure!(
        a.seconds > 0.0 && a.seconds <= 60.0,
        "--seconds {}: expected more than 0 and at most 60",
        a.seconds
    );
    let dir = match a.out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    // The scratch file lives on the output's storage and goes when this ends, error or not.
    let scratch = tempfile::Builder::new()
        .prefix(".bmoe-measure-")
        .tempfile_in(&dir)
        .with_context(|| format!("creating a scratch file in {}", dir.display()))?;
    let file = match &a.file {
        Some(f) => f.clone(),
        None => {
            eprintln!(
                "bmoe: writing a {} MiB scratch file in {}",
                a.scratch_mb,
                dir.display()
            );
            write_scratch(scratch.path(), a.scratch_mb << 20)
                .with_context(|| format!("writing {}", scratch.path().display()))?;
            scratch.path().to_path_buf()
        }
    };
    let plan = ReadPlan {
        file,
        read_bytes: (a.read_kib << 10) as usize,
        per_depth: Duration::from_secs_f64(a.seconds),
    };
    eprintln!(
        "bmoe: reading {} at random, {} KiB per read, 1, 2, 4 and 8 in flight",
        plan.file.display(),
        a.read_kib
    );
    let m = measure(&plan)?;
    let text = profile_toml(&name, &m, &plan);
    write_checked(&a.out, &text)?;
    print!("{text}");
    eprintln!("bmoe: wrote {}", a.out.display());
    Ok(ExitCode::SUCCESS)
}

/// Writes `text` to `out` through a temporary file, and only once `bmoe check`'s profile loader
/// takes it.
fn write_checked(out: &std::path::Path, text: &str) -> anyhow::Result<()> {
    let dir = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => std::path::Path::new("."),
    };
    let mut tmp = crate::sink::temp_builder()
        .suffix(".toml")
        .tempfile_in(dir)
        .with_context(|| format!("creating a temporary file beside {}", out.display()))?;
    std::io::Write::write_all(&mut tmp, text.as_bytes())
        .with_context(|| format!("writing {}", tmp.path().display()))?;
    if let Err(e) = load_profile(tmp.path()) {
        anyhow::bail!("the measured profile does not check (a bug in bmoe): {e}");
    }
    tmp.persist(out)
        .with_context(|| format!("writing {}", out.display()))?;
    Ok(())
}
