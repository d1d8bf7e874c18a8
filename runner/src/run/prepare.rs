//! From job files to units of work: every job, profile and sweep point checked, layered and placed
//! before anything loads or is written. Errors of all files are gathered and reported together.
use std::path::{Path, PathBuf};

use anyhow::anyhow;

use crate::config::diag::{display_path, ConfigErrors, Diagnostic};
use crate::config::job::{load_job, LoadedJob};
use crate::config::layers::{parse_set, resolve, LayerInputs, Resolved};
use crate::config::profile::{load_profile, Profile};
use crate::config::settings::{point_label, Overrides};
use crate::placement::{place, Placement};

/// One engine session's worth of work: a job on a profile at one sweep point.
pub struct Unit {
    /// Index into [`Prepared::jobs`].
    pub job: usize,
    /// The profile.
    pub profile: Profile,
    /// Its path.
    pub profile_path: PathBuf,
    /// Sweep point label (`base` when nothing is swept).
    pub point: String,
    /// Resolved values with their origins.
    pub resolved: Resolved,
    /// Placement and memory budget.
    pub placement: Placement,
}

/// Everything a command needs.
pub struct Prepared {
    /// The jobs, in command-line order.
    pub jobs: Vec<LoadedJob>,
    /// The units, job by job, point by point.
    pub units: Vec<Unit>,
    /// Warnings (a swept key overridden by the environment, ...).
    pub warnings: Vec<String>,
}

/// What the user passed besides the job files.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// `--profile`: replaces each job's default profile.
    pub profile: Option<PathBuf>,
    /// `--set key=value`.
    pub sets: Vec<String>,
    /// `--overrides FILE`: a TOML overlay of layered keys, above the job's `[overrides]` and below
    /// its sweep.
    pub overrides: Option<PathBuf>,
    /// `--allow-cpu-fallback`: a prefill device named on the command line that cannot run here
    /// is a warning, not an error.
    pub allow_cpu_fallback: bool,
}

/// Loads, checks, layers and places everything; the error lists every problem found.
pub fn prepare(job_paths: &[PathBuf], sel: &Selection) -> anyhow::Result<Prepared> {
    let mut diags: Vec<Diagnostic> = Vec::new();
    let mut inputs = LayerInputs::default();
    for s in &sel.sets {
        match parse_set(s) {
            Ok(kv) => inputs.sets.push(kv),
            Err(d) => diags.push(d),
        }
    }
    if let Some(path) = &sel.overrides {
        match crate::config::load::load::<Overrides>(
            path,
            "overrides",
            &crate::schema::item_schema::<Overrides>(),
        ) {
            Ok((o, _)) => {
                inputs.overlay = Some((format!("overrides {}", display_path(path)), o.0));
            }
            Err(mut e) => diags.append(&mut e.0),
        }
    }
    // A --profile is checked even when a job fails, so one pass shows the errors of both.
    let shared_profile = match &sel.profile {
        Some(path) => match load_profile(path) {
            Ok((p, _)) => Some((p, path.clone())),
            Err(mut e) => {
                diags.append(&mut e.0);
                None
            }
        },
        None => None,
    };
    let mut jobs = Vec::new();
    for p in job_paths {
        match load_job(p) {
            Ok(j) => jobs.push(j),
            Err(mut e) => diags.append(&mut e.0),
        }
    }
    // Profiles: --profile for all, else each job's own.
    let mut profiles: Vec<Option<(Profile, PathBuf)>> = Vec::new();
    for j in &jobs {
        if sel.profile.is_some() {
            profiles.push(shared_profile.clone());
            continue;
        }
        let Some(path) = j.profile.clone() else {
            diags.push(Diagnostic::file(
                &j.src.path,
                "no profile: give `profile = \"...\"` in the job or --profile".into(),
            ));
            profiles.push(None);
            continue;
        };
        match load_profile(&path) {
            Ok((p, _)) => profiles.push(Some((p, path))),
            Err(mut e) => {
                // Several jobs sharing one bad profile: report it once.
                e.0.retain(|d| !diags.contains(d));
                diags.append(&mut e.0);
                profiles.push(None);
            }
        }
    }
    if !diags.is_empty() {
        return Err(ConfigErrors(diags).into());
    }
    let mut units = Vec::new();
    let mut warnings = Vec::new();
    let mut placement_errors = Vec::new();
    for (ji, (j, prof)) in jobs.iter().zip(profiles).enumerate() {
        let Some((profile, profile_path)) = prof else {
            continue;
        };
        let points = j.job.sweep.points();
        for point in &points {
            let resolved = match resolve(
                &profile,
                &profile_path,
                &j.src.path,
                &j.job.overrides.0,
                point,
                &inputs,
            ) {
                Ok(r) => r,
                Err(mut e) => {
                    diags.append(&mut e.0);
                    continue;
                }
            };
            for (k, _) in point {
                if let Some((name, vals)) = &inputs.overlay {
                    if vals.contains_key(k) {
                        let w = format!(
                            "{}: the sweep over {k} wins over {name}: each point runs its own {k}",
                            display_path(&j.src.path)
                        );
                        if !warnings.contains(&w) {
                            warnings.push(w);
                        }
                    }
                }
                let o = resolved.origin(k);
                if !o.contains("[sweep]") && points.len() > 1 {
                    let w = format!("{}: sweep over {k} is overridden by {o}: every point runs with the same {k}", display_path(&j.src.path));
                    if !warnings.contains(&w) {
                        warnings.push(w);
                    }
                }
            }
            match place(&profile, &resolved.settings, &j.model) {
                Ok(placement) => {
                    match crate::placement::device_fallback(
                        resolved.settings.device_name(),
                        resolved.origin("device"),
                        &placement.prefill,
                        sel.allow_cpu_fallback,
                    ) {
                        Some(Err(e)) => {
                            let e = format!("{} on profile {}: {e}", j.job.name, profile.name);
                            if !placement_errors.contains(&e) {
                                placement_errors.push(e);
                            }
                        }
                        Some(Ok(w)) => warnings.push(format!(
                            "{} on profile {} (point {}): {w}",
                            j.job.name,
                            profile.name,
                            point_label(point)
                        )),
                        None => {}
                    }
                    if resolved.settings.explain && placement.prefill.device.is_none() {
                        warnings.push(format!(
                            "{} on profile {} (point {}): explain ({}) profiles device prefill, and no prefill device runs: it does nothing",
                            j.job.name,
                            profile.name,
                            point_label(point),
                            resolved.origin("explain")
                        ));
                    }
                    if let Some(note) = placement.threads.capped_note() {
                        let w = format!(
                            "{} ({}): {note}",
                            display_path(&profile_path),
                            resolved.origin("threads")
                        );
                        if !warnings.contains(&w) {
                            warnings.push(w);
                        }
                    }
                    units.push(Unit {
                        job: ji,
                        profile: profile.clone(),
                        profile_path: profile_path.clone(),
                        point: point_label(point),
                        resolved,
                        placement,
                    })
                }
                Err(e) => placement_errors.push(format!(
                    "{} ({}, point {}): {e}",
                    display_path(&j.src.path),
                    display_path(&profile_path),
                    point_label(point)
                )),
            }
        }
    }
    if !diags.is_empty() {
        return Err(ConfigErrors(diags).into());
    }
    if !placement_errors.is_empty() {
        return Err(anyhow!(placement_errors.join("\nerror: ")));
    }
    Ok(Prepared {
        jobs,
        units,
        warnings,
    })
}

/// `path` for messages.
pub fn shown(p: &Path) -> String {
    display_path(p)
}
