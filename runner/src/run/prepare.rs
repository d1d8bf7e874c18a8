//! From job files to units of work: every job, profile and sweep point checked, layered and placed
//! before anything loads or is written. Errors of all files are gathered and reported together.
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::config::diag::{ConfigErrors, Diagnostic};
use crate::config::job::{load_job, LoadedJob};
use crate::config::layers::{self, parse_set, resolve, set_value, LayerInputs, Resolved, SetSweep};
use crate::config::paths::display_path;
use crate::config::profile::{load_profile, Profile};
use crate::config::settings::{point_label, Overrides};
use crate::placement::{place, Placement};

use super::no_effect;

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

impl Unit {
    /// What the checks of settings without effect read of it.
    fn point(&self) -> no_effect::Point<'_> {
        no_effect::Point {
            job: self.job,
            profile: &self.profile.name,
            point: &self.point,
            resolved: &self.resolved,
            threads: self.placement.threads.used,
        }
    }
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

impl Prepared {
    /// How long a load of `model` may take: the largest `load_timeout_s` of the units that use it
    /// (the probe loads it once for all of them).
    pub fn load_timeout(&self, model: &Path) -> std::time::Duration {
        let s = self
            .units
            .iter()
            .filter(|u| self.jobs.get(u.job).is_some_and(|j| j.model == model))
            .map(|u| u.resolved.settings.load_timeout_s)
            .max()
            .unwrap_or(crate::config::settings::DEFAULT_LOAD_TIMEOUT_S);
        std::time::Duration::from_secs(s)
    }
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
    /// `--repeat N`: replaces each job's `repeat`.
    pub repeat: Option<u32>,
    /// `--warmup N`: replaces each job's `warmup`.
    pub warmup: Option<u32>,
    /// `--allow-identical-points`: sweep points that resolve to one configuration run anyway.
    pub allow_identical_points: bool,
}

/// What the command line adds to the files: the layers' inputs, a `--set` sweep, and the job and
/// profile an `--overrides` file says it was written for.
struct CommandLine {
    inputs: LayerInputs,
    sweep: SetSweep,
    overlay_for: Option<(String, String)>,
}

/// Loads, checks, layers and places everything; the error lists every problem found.
pub fn prepare(job_paths: &[PathBuf], sel: &Selection) -> anyhow::Result<Prepared> {
    let mut diags: Vec<Diagnostic> = Vec::new();
    let mut warnings = layers::unknown_env(std::env::vars());
    let cl = command_line(sel, &mut diags);
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
            Ok(mut j) => {
                j.job.repeat = sel.repeat.unwrap_or(j.job.repeat);
                j.job.warmup = sel.warmup.unwrap_or(j.job.warmup);
                diags.extend(sweep_conflicts(&j, &cl.sweep));
                jobs.push(j);
            }
            Err(mut e) => diags.append(&mut e.0),
        }
    }
    let profiles = job_profiles(&jobs, sel, shared_profile, &mut diags);
    if !diags.is_empty() {
        return Err(ConfigErrors(unique(diags)).into());
    }
    if let (Some(path), Some(made_for)) = (&sel.overrides, &cl.overlay_for) {
        warnings.extend(overlay_mismatches(path, made_for, &jobs, &profiles));
    }
    let mut units = Vec::new();
    let mut placement_errors = Vec::new();
    for (ji, (j, prof)) in jobs.iter().zip(profiles).enumerate() {
        let Some((profile, profile_path)) = prof else {
            continue;
        };
        for (point, set_point) in points(j, &cl.sweep) {
            let mut inputs = cl.inputs.clone();
            inputs.sets.extend(set_point.iter().cloned());
            let ctx = UnitCtx {
                ji,
                j,
                profile: &profile,
                profile_path: &profile_path,
                sel,
                n_points: j.job.sweep.points().len(),
            };
            match ctx.unit(&point, &set_point, &inputs, &mut warnings) {
                Ok(Ok(u)) => units.push(u),
                Ok(Err(d)) => placement_errors.push(d),
                Err(mut e) => diags.append(&mut e.0),
            }
        }
    }
    if !diags.is_empty() {
        return Err(ConfigErrors(unique(diags)).into());
    }
    if !placement_errors.is_empty() {
        return Err(ConfigErrors(unique(placement_errors)).into());
    }
    let points: Vec<no_effect::Point> = units.iter().map(Unit::point).collect();
    warnings.extend(no_effect::warnings(&points, &jobs));
    let identical = no_effect::identical_points(&points, &jobs);
    if !(identical.is_empty() || sel.allow_identical_points) {
        return Err(ConfigErrors(identical).into());
    }
    Ok(Prepared {
        jobs,
        units,
        warnings,
    })
}

/// `--set` (plain values and comma-list sweeps) and `--overrides FILE`, checked.
fn command_line(sel: &Selection, diags: &mut Vec<Diagnostic>) -> CommandLine {
    let mut inputs = LayerInputs::default();
    for s in &sel.sets {
        match parse_set(s) {
            Ok(kv) => inputs.sets.push(kv),
            Err(d) => diags.push(d),
        }
    }
    let sweep = SetSweep::split(&mut inputs.sets).unwrap_or_else(|mut e| {
        diags.append(&mut e);
        SetSweep::default()
    });
    let mut overlay_for = None;
    if let Some(path) = &sel.overrides {
        match crate::config::load::load::<Overrides>(
            path,
            "overrides",
            &crate::config::json_schema::item_schema::<Overrides>(),
        ) {
            Ok((o, src)) => {
                inputs.overlay = Some((format!("overrides {}", display_path(path)), o.0));
                overlay_for = written_for(&src.text);
            }
            Err(mut e) => diags.append(&mut e.0),
        }
    }
    CommandLine {
        inputs,
        sweep,
        overlay_for,
    }
}

/// The job and profile named by the header `bmoe report --write-overrides` writes
/// (`# Written by ...: the best point of job J on profile P.`).
fn written_for(text: &str) -> Option<(String, String)> {
    text.lines()
        .take_while(|l| l.starts_with('#') || l.trim().is_empty())
        .find_map(|l| {
            let rest = l.split_once("the best point of job ")?.1;
            let (job, profile) = rest.split_once(" on profile ")?;
            let profile = profile.trim().trim_end_matches('.');
            Some((job.trim().to_string(), profile.to_string()))
        })
}

/// A warning for each (job, profile) the overrides file was not written for.
fn overlay_mismatches(
    path: &Path,
    (job, profile): &(String, String),
    jobs: &[LoadedJob],
    profiles: &[Option<(Profile, PathBuf)>],
) -> Vec<String> {
    let mut out = Vec::new();
    for (j, p) in jobs.iter().zip(profiles) {
        let Some((p, _)) = p else { continue };
        if &j.job.name == job && &p.name == profile {
            continue;
        }
        let w = format!(
            "overrides {} was written for job {job} on profile {profile}, but is applied to job {} on profile {}: its values were chosen for another setup",
            display_path(path),
            j.job.name,
            p.name
        );
        if !out.contains(&w) {
            out.push(w);
        }
    }
    out
}

/// A key swept both by the job's `[sweep]` and by a `--set` comma list: refused at the job's key.
fn sweep_conflicts(j: &LoadedJob, sweep: &SetSweep) -> Vec<Diagnostic> {
    sweep
        .0
        .iter()
        .filter(|(k, _)| j.job.sweep.0.contains_key(k))
        .map(|(k, vals)| {
            j.src.diag(
                &format!("/sweep/{k}"),
                true,
                format!(
                    "`{k}` is swept here and by `--set {k}={}`: sweep it in one place (drop it from [sweep], or give --set one value)",
                    vals.join(",")
                ),
            )
        })
        .collect()
}

/// The profile of each job: --profile for all, else each job's own.
fn job_profiles(
    jobs: &[LoadedJob],
    sel: &Selection,
    shared: Option<(Profile, PathBuf)>,
    diags: &mut Vec<Diagnostic>,
) -> Vec<Option<(Profile, PathBuf)>> {
    let mut profiles = Vec::new();
    for j in jobs {
        if sel.profile.is_some() {
            profiles.push(shared.clone());
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
    profiles
}

/// Each point of a job: its `[sweep]` point crossed with the `--set` sweep's.
type Point = (Vec<(String, Value)>, Vec<(String, String)>);

fn points(j: &LoadedJob, sweep: &SetSweep) -> Vec<Point> {
    let set_points = sweep.points();
    j.job
        .sweep
        .points()
        .into_iter()
        .flat_map(|p| set_points.iter().map(move |s| (p.clone(), s.clone())))
        .collect()
}

/// One job on one profile, for making its units.
struct UnitCtx<'a> {
    ji: usize,
    j: &'a LoadedJob,
    profile: &'a Profile,
    profile_path: &'a Path,
    sel: &'a Selection,
    /// Points of the job's own `[sweep]`.
    n_points: usize,
}

impl UnitCtx<'_> {
    /// The unit of one point: `Err` for a configuration error, `Ok(Err)` for one that does not
    /// place (memory budget, a prefill device that cannot run).
    fn unit(
        &self,
        point: &[(String, Value)],
        set_point: &[(String, String)],
        inputs: &LayerInputs,
        warnings: &mut Vec<String>,
    ) -> Result<Result<Unit, Diagnostic>, ConfigErrors> {
        let j = self.j;
        let resolved = resolve(
            self.profile,
            self.profile_path,
            &j.src.path,
            &j.job.overrides.0,
            point,
            inputs,
        )?;
        self.sweep_warnings(point, inputs, &resolved, warnings);
        let mut labelled = point.to_vec();
        labelled.extend(set_point.iter().map(|(k, v)| (k.clone(), set_value(v))));
        let label = point_label(&labelled);
        let placement = match place(self.profile, &resolved.settings, &j.model) {
            Ok(p) => p,
            Err(e) => {
                let help = e.help().map(str::to_string);
                return Ok(Err(Diagnostic::other(
                    format!(
                        "{} ({}, point {label})",
                        display_path(&j.src.path),
                        display_path(self.profile_path),
                    ),
                    "",
                    e.to_string(),
                )
                .with_help(help)));
            }
        };
        match crate::placement::device_fallback(
            resolved.settings.device_name(),
            resolved.origin("device"),
            &placement.plan.prefill,
            self.sel.allow_cpu_fallback,
        ) {
            Some(Err(e)) => {
                let src = format!("{} on profile {}", j.job.name, self.profile.name);
                return Ok(Err(Diagnostic::other(src, "", e)));
            }
            Some(Ok(w)) => warnings.push(format!(
                "{} on profile {} (point {label}): {w}",
                j.job.name, self.profile.name
            )),
            None => {}
        }
        if resolved.settings.explain && placement.plan.prefill.device.is_none() {
            warnings.push(format!(
                "{} on profile {} (point {label}): explain ({}) profiles device prefill, and no prefill device runs: it does nothing",
                j.job.name,
                self.profile.name,
                resolved.origin("explain")
            ));
        }
        if let Some(note) = placement.threads.capped_note() {
            let w = format!(
                "{} ({}): {note}",
                display_path(self.profile_path),
                resolved.origin("threads")
            );
            push_once(warnings, w);
        }
        Ok(Ok(Unit {
            job: self.ji,
            profile: self.profile.clone(),
            profile_path: self.profile_path.to_path_buf(),
            point: label,
            resolved,
            placement,
        }))
    }

    /// A swept key that another layer overrides runs the same value at every point: say so.
    fn sweep_warnings(
        &self,
        point: &[(String, Value)],
        inputs: &LayerInputs,
        resolved: &Resolved,
        warnings: &mut Vec<String>,
    ) {
        let job = display_path(&self.j.src.path);
        for (k, _) in point {
            if let Some((name, vals)) = &inputs.overlay {
                if vals.contains_key(k) {
                    let w = format!(
                        "{job}: the sweep over {k} wins over {name}: each point runs its own {k}"
                    );
                    push_once(warnings, w);
                }
            }
            let o = resolved.origin(k);
            if !o.contains("[sweep]") && self.n_points > 1 {
                let w = format!("{job}: sweep over {k} is overridden by {o}: every point runs with the same {k}");
                push_once(warnings, w);
            }
        }
    }
}

fn push_once(v: &mut Vec<String>, s: String) {
    if !v.contains(&s) {
        v.push(s);
    }
}

/// `diags` without repeats (one bad `--set` fails every point the same way), in order.
fn unique(diags: Vec<Diagnostic>) -> Vec<Diagnostic> {
    let mut out: Vec<Diagnostic> = Vec::with_capacity(diags.len());
    for d in diags {
        if !out.contains(&d) {
            out.push(d);
        }
    }
    out
}
