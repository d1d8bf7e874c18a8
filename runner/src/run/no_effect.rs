//! Settings that do nothing where a job sets them ([`crate::config::inert`]'s rule), said before
//! anything runs: a value given by the job, an overlay, a sweep, `BMOE_*` or `--set` that has no
//! effect is a warning; sweep points that resolve to the same configuration are refused, since
//! their rows would only measure noise.
use serde_json::Value;

use crate::config::diag::Diagnostic;
use crate::config::inert::{effective, why_inert};
use crate::config::job::LoadedJob;
use crate::config::layers::Resolved;
use crate::config::paths::display_path;
use crate::config::settings::KEYS;

/// What these checks read of a unit of work (a job on a profile at one sweep point).
pub struct Point<'a> {
    /// Index of the job.
    pub job: usize,
    /// Profile name.
    pub profile: &'a str,
    /// Sweep point label.
    pub point: &'a str,
    /// The resolved values with their origins.
    pub resolved: &'a Resolved,
    /// Compute threads as they run here.
    pub threads: u32,
}

/// One warning per (job, key, origin) whose value has no effect; a profile's values are not
/// named (a profile describes a device for every job that runs on it).
pub fn warnings(units: &[Point], jobs: &[LoadedJob]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for u in units {
        let s = &u.resolved.settings;
        for key in KEYS {
            let origin = u.resolved.origin(key);
            if origin == "default" || origin.starts_with("profile ") {
                continue;
            }
            let Some(why) = why_inert(key, s) else {
                continue;
            };
            let w = format!(
                "job {}: {key} (from {origin}) has no effect: {why}",
                jobs[u.job].job.name
            );
            if !out.contains(&w) {
                out.push(w);
            }
        }
    }
    out
}

/// What a unit runs: the settings with every inert key at its default and the threads as they
/// run here (a count above the usable cores is capped to them).
fn configuration(u: &Point) -> Value {
    let mut v = effective(&u.resolved.settings);
    v["threads"] = Value::from(u.threads);
    v
}

/// The keys two units set differently, each with why it makes no difference.
fn why_same(a: &Point, b: &Point) -> Vec<String> {
    let (va, vb) = (
        serde_json::to_value(&a.resolved.settings).unwrap_or_default(),
        serde_json::to_value(&b.resolved.settings).unwrap_or_default(),
    );
    KEYS.iter()
        .filter(|k| va[**k] != vb[**k])
        .map(|k| match why_inert(k, &a.resolved.settings) {
            Some(why) => format!("{k} has no effect ({why})"),
            None => format!(
                "{k} runs as {} thread(s) at both points (the cores this process may use)",
                a.threads
            ),
        })
        .collect()
}

/// An error for each sweep point that resolves to the configuration of an earlier point of the
/// same job and profile.
pub fn identical_points(units: &[Point], jobs: &[LoadedJob]) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    for (i, u) in units.iter().enumerate() {
        let same = units[..i].iter().find(|e| {
            e.job == u.job && e.profile == u.profile && configuration(e) == configuration(u)
        });
        let Some(e) = same else { continue };
        let j = &jobs[u.job];
        out.push(
            Diagnostic::other(
                display_path(&j.src.path),
                "sweep",
                format!(
                    "sweep points {} and {} of job {} on profile {} resolve to the same configuration: {}",
                    e.point,
                    u.point,
                    j.job.name,
                    u.profile,
                    why_same(e, u).join("; ")
                ),
            )
            .with_help(Some(
                "sweep a key that acts here or make it act (e.g. --set moe_stream=true for the cache keys); to measure one configuration again use --repeat, or add --allow-identical-points"
                    .into(),
            )),
        );
    }
    out
}
