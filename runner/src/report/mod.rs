//! `bmoe report`: telemetry CSVs (read by column name) grouped by (job, profile, sweep point) into
//! tables and plots (HTML, Markdown or JSON), and optionally the best point under an objective
//! and requirements, written back as a TOML overlay.
pub mod best;
mod error;
mod floor;
pub mod group;
pub mod input;
pub mod metrics;
mod noise;
pub mod plots;
pub mod provenance;
mod reference;
pub mod render;
pub mod stats;

use std::collections::BTreeMap;
use std::path::PathBuf;

use best::{Best, BestSpec};
use group::Group;
use input::Data;
use plots::Plot;
use provenance::Provenance;

pub use error::ReportError;

/// What to report on.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The CSVs.
    pub csvs: Vec<PathBuf>,
    /// Agreement and speed-up reference point (default: each (job, profile)'s stock llama.cpp
    /// point, else its first).
    pub reference: Option<String>,
    /// Only this job.
    pub job: Option<String>,
    /// Only this profile (by name).
    pub profile: Option<String>,
    /// Only these run ids (all when empty).
    pub run_ids: Vec<String>,
    /// Profile name -> RAM in MiB, from `--profile-file`.
    pub ram: BTreeMap<String, f64>,
    /// Pick the best point.
    pub best: Option<BestSpec>,
}

/// One input as the report describes it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct InputSummary {
    /// The path.
    pub path: String,
    /// Data rows read.
    pub rows: usize,
    /// Rows left out (field count differs from the header).
    pub skipped: usize,
    /// Number of columns in its header.
    pub columns: usize,
    /// `schema_version` values found.
    pub schema_versions: Vec<String>,
    /// Rows left out as duplicates of an earlier row's key.
    pub duplicates: usize,
}

/// A finished report, ready to render.
#[derive(Debug)]
pub struct Report {
    /// The inputs read.
    pub inputs: Vec<InputSummary>,
    /// Inputs that could not be read, and what was left out and why.
    pub notes: Vec<String>,
    /// The notes that are also printed as `warning:` on stderr.
    pub warnings: Vec<String>,
    /// Where the rows came from.
    pub provenance: Provenance,
    /// The groups.
    pub groups: Vec<Group>,
    /// The plots.
    pub plots: Vec<Plot>,
    /// The winners, with `--best`.
    pub best: Vec<Best>,
    /// Profile RAM used for the RSS plot.
    pub ram: BTreeMap<String, f64>,
}

/// Reads, groups, plots and (with `--best`) chooses.
pub fn build(opts: &Options) -> Result<Report, ReportError> {
    let mut data = Data::default();
    let mut notes = Vec::new();
    let mut problems = Vec::new();
    for p in &opts.csvs {
        if let Err(e) = data.add_file(p) {
            problems.push(e);
        }
    }
    if data.files.is_empty() {
        if problems.len() == 1 {
            if let Some(e) = problems.pop() {
                return Err(e);
            }
        }
        return Err(ReportError::NothingToReport {
            problems: problems
                .iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("; "),
        });
    }
    let mut warnings: Vec<String> = problems.iter().map(|e| format!("left out: {e}")).collect();
    if data.recs.is_empty() {
        return Err(ReportError::NoRows {
            what: format!(
                "{} hold(s) a header but no rows",
                data.files
                    .iter()
                    .map(|f| f.path.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        });
    }
    filter(&mut data, opts)?;
    warnings.extend(duplicate_warnings(&data));
    notes.extend(warnings.iter().cloned());
    describe_inputs(&data, &mut notes);

    let ram = profile_ram(&data, &opts.ram);
    let groups = stats::groups(&data, opts.reference.as_deref())?;
    metric_notes(&groups, opts, &mut notes);
    split_notes(&groups, &mut notes);
    let noisy = noise::timing_warnings(&data, &groups);
    notes.extend(noisy.iter().cloned());
    warnings.extend(noisy);
    let best = match &opts.best {
        Some(spec) => best::choose(&data, &groups, spec)?,
        None => Vec::new(),
    };
    let (plots, plot_notes) = plots::plots(&data, &groups, &ram, &best)?;
    notes.extend(plot_notes);
    Ok(Report {
        inputs: data
            .files
            .iter()
            .map(|f| InputSummary {
                path: f.path.display().to_string(),
                rows: f.rows,
                skipped: f.skipped,
                columns: f.columns.len(),
                schema_versions: f.schema_versions.clone(),
                duplicates: f.duplicates.rows,
            })
            .collect(),
        provenance: Provenance::of(&data),
        notes,
        warnings,
        groups,
        plots,
        best,
        ram,
    })
}

/// One warning per input that repeated an earlier row's key (two runs appending to one CSV at
/// once, or a file given twice): the repeated rows are counted once.
fn duplicate_warnings(data: &Data) -> Vec<String> {
    data.files
        .iter()
        .filter(|f| f.duplicates.rows > 0)
        .map(|f| {
            format!(
                "{}: {} row(s) repeat an earlier row's (run, job, profile, point, item, repeat) and are counted once (first: {})",
                f.path.display(),
                f.duplicates.rows,
                f.duplicates.example.as_deref().unwrap_or("-")
            )
        })
        .collect()
}

/// Notes on what the tables leave out: metrics no row measured, accuracy without `correct` or
/// `expected`, and which reference agreement is measured against.
fn metric_notes(groups: &[Group], opts: &Options, notes: &mut Vec<String>) {
    for (m, h, _) in metrics::METRICS {
        if *m != "peak_rss_mib" && groups.iter().all(|g| !g.metrics.contains_key(*m)) {
            let why = match *m {
                "decode_tps" => {
                    "no row generated tokens (decide and perplexity rows do not decode)"
                }
                "dev_wait_share" => "no row ran prefill on a device",
                "cache_hit_pct" => "no row looked up the expert cache (moe_stream off)",
                "read_mib_per_token" => "no row streamed experts (moe_stream off)",
                _ => "no row measured it",
            };
            notes.push(format!("{h}: {why}, so the column is left out"));
        }
    }
    if groups.iter().all(|g| g.accuracy.is_none()) {
        notes.push(
            "accuracy: no row carries `correct` or `expected`, so accuracy is left out".into(),
        );
    }
    if let Some(g) = groups.iter().find(|g| g.agreement.is_some()) {
        if let Some(a) = &g.agreement {
            notes.push(format!(
                "agreement: share of rows whose `best` equals the reference point's for the same item (reference: {}{})",
                a.reference,
                if opts.reference.is_some() { "" } else { ", the stock llama.cpp point of each job and profile where there is one (runtime = \"llama.cpp\"), else its first point" }
            ));
        }
    }
}

/// A note per point whose rows were split because they differ in settings, host, commit or model.
fn split_notes(groups: &[Group], notes: &mut Vec<String>) {
    let mut seen: Vec<(&str, &str, &str)> = Vec::new();
    for g in groups.iter().filter(|g| !g.differs.is_empty()) {
        let k = (g.job.as_str(), g.profile.as_str(), g.point.as_str());
        if seen.contains(&k) {
            continue;
        }
        seen.push(k);
        let parts: Vec<&Group> = groups
            .iter()
            .filter(|o| (o.job.as_str(), o.profile.as_str(), o.point.as_str()) == k)
            .collect();
        let cols: Vec<&String> = g.differs.keys().collect();
        let values: Vec<String> = cols
            .iter()
            .map(|c| {
                let vs: Vec<&str> = parts
                    .iter()
                    .filter_map(|p| p.differs.get(*c))
                    .map(String::as_str)
                    .collect();
                format!("{c} ({})", vs.join(", "))
            })
            .collect();
        notes.push(format!(
            "job {} on profile {}: point {} is split into {} groups: its rows differ in {}; rows are pooled only when their settings, host, commit and model agree",
            g.job,
            g.profile,
            g.point,
            parts.len(),
            values.join(", ")
        ));
    }
}

/// Applies `--job`, `--profile` and `--run-id`, refusing a filter that leaves nothing.
fn filter(data: &mut Data, opts: &Options) -> Result<(), ReportError> {
    let distinct = |data: &Data, f: &dyn Fn(&input::Rec) -> String| {
        let mut v: Vec<String> = Vec::new();
        for r in &data.recs {
            let x = f(r);
            if !v.contains(&x) {
                v.push(x);
            }
        }
        v.join(", ")
    };
    if let Some(j) = &opts.job {
        let present = distinct(data, &|r| r.job.clone());
        data.recs.retain(|r| &r.job == j);
        if data.recs.is_empty() {
            return Err(ReportError::NoRows {
                what: format!("no rows of --job {j} (jobs present: {present})"),
            });
        }
    }
    if let Some(p) = &opts.profile {
        let present = distinct(data, &|r| r.profile.clone());
        data.recs.retain(|r| &r.profile == p);
        if data.recs.is_empty() {
            return Err(ReportError::NoRows {
                what: format!("no rows of --profile {p} (profiles present: {present})"),
            });
        }
    }
    if !opts.run_ids.is_empty() {
        let present = distinct(data, &|r| r.run_id.clone());
        data.recs.retain(|r| opts.run_ids.contains(&r.run_id));
        if data.recs.is_empty() {
            return Err(ReportError::NoRows {
                what: format!(
                    "no rows of --run-id {} (runs present: {present})",
                    opts.run_ids.join(", ")
                ),
            });
        }
    }
    Ok(())
}

/// Notes on what each input lacks and on mixed schema versions.
fn describe_inputs(data: &Data, notes: &mut Vec<String>) {
    for f in &data.files {
        if f.skipped > 0 {
            notes.push(format!(
                "{}: {} row(s) left out: their field count differs from the header (a torn last row?)",
                f.path.display(),
                f.skipped
            ));
        }
    }
    let versions: Vec<String> = data
        .files
        .iter()
        .map(|f| {
            if f.schema_versions.is_empty() {
                format!("{}: none", f.path.display())
            } else {
                format!("{}: {}", f.path.display(), f.schema_versions.join("/"))
            }
        })
        .collect();
    let mut distinct: Vec<&Vec<String>> = data.files.iter().map(|f| &f.schema_versions).collect();
    distinct.dedup();
    if distinct.len() > 1 {
        notes.push(format!(
            "the inputs come from different schema versions ({}); every file is read by column name",
            versions.join(", ")
        ));
    }
    for (col, what) in [
        ("peak_rss_mib", "peak RSS"),
        ("repeat", "the repeat index"),
        ("prefill_dev_stall_s", "the device's arena wait"),
    ] {
        let without = data.files_without(col);
        if without.len() == data.files.len() {
            notes.push(format!(
                "{what}: no input has a `{col}` column, so it is left out"
            ));
        } else if !without.is_empty() {
            notes.push(format!(
                "{what}: {} lack(s) a `{col}` column; their rows count as not measured",
                without.join(", ")
            ));
        }
    }
}

/// RAM per profile name: `--profile-file` first, else the median of a `ram_mb` or
/// `mem_total_mib` column over that profile's rows.
fn profile_ram(data: &Data, given: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    let mut out = given.clone();
    for col in ["ram_mb", "mem_total_mib"] {
        let mut by: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        for r in &data.recs {
            if let Some(v) = data.num(r, col) {
                by.entry(r.profile.clone()).or_default().push(v);
            }
        }
        for (p, v) in by {
            if let (false, Some(s)) = (out.contains_key(&p), group::Stat::of(v)) {
                out.insert(p, s.median);
            }
        }
    }
    out
}
