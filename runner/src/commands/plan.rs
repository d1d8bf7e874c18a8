//! `bmoe plan`: each resolved value and its origin, the placement and the memory budget.
use std::process::ExitCode;

use serde::Serialize;

use super::output::{fail, print_json, print_warnings};
use crate::cli::{Format, FormattedTarget};
use crate::config::paths::display_path;
use crate::run::prepare::{prepare, Prepared};

/// Runs `bmoe plan`.
pub fn plan(t: FormattedTarget) -> anyhow::Result<ExitCode> {
    let p = match prepare(&t.target.jobs, &t.target.selection()) {
        Ok(p) => p,
        Err(e) => return fail(e, t.format),
    };
    if t.format == Format::Json {
        print_json(&plan_report(&p))?;
        return Ok(ExitCode::SUCCESS);
    }
    print_warnings(&p);
    print_plan(&p);
    Ok(ExitCode::SUCCESS)
}

fn print_plan(p: &Prepared) {
    for u in &p.units {
        let j = &p.jobs[u.job];
        let d = &u.placement.plan.dims;
        println!(
            "job {} ({}) on profile {} ({}), point {}",
            j.job.name,
            display_path(&j.src.path),
            u.profile.name,
            display_path(&u.profile_path),
            u.point
        );
        println!(
            "  model: {} ({}, {} layers, {} experts top-{}, {:.1} MiB)",
            display_path(&j.model),
            d.arch,
            d.n_layer,
            d.n_expert,
            d.n_expert_used,
            d.file_bytes as f64 / (1u64 << 20) as f64
        );
        println!(
            "  items: {} {}, repeat {}, warmup {}",
            j.items.len(),
            j.job.kind,
            j.job.repeat,
            j.job.warmup
        );
        println!("  values:");
        for (k, v, o) in &u.resolved.origins {
            let shown_v = if k == "cache_mb" && v == "auto" {
                format!("auto -> {}", u.placement.plan.cache_mb)
            } else {
                v.clone()
            };
            println!("    {k:<15} {shown_v:<14} {o}");
        }
        let t = &u.placement.threads;
        match t.asked {
            Some(n) if n > t.used => println!(
                "  threads: {n} asked, {} used (capped to the {} cores this process may use)",
                t.used, t.cores
            ),
            Some(n) => println!("  threads: {n} ({} cores usable)", t.cores),
            None => println!(
                "  threads: auto -> {} (the cores this process may use)",
                t.used
            ),
        }
        println!("  cores: {}", cores_line(&u.placement.cores));
        if let Some(line) = read_floor_line(&u.profile, &u.placement.plan.dims) {
            println!("  read floor: {line}");
        }
        println!("  prefill: {}", u.placement.plan.prefill.reason);
        let s = &u.resolved.settings;
        match &u.placement.plan.prefill.device {
            Some(dev) => println!(
                "  ubatch: {dev} {} (pieces >= {} tokens), CPU {}",
                s.device_ubatch, s.min_tokens, s.cpu_ubatch
            ),
            None => println!("  ubatch: CPU {}", s.cpu_ubatch),
        }
        println!(
            "  memory budget (context {} tokens):",
            u.placement.plan.n_ctx
        );
        println!("{}", u.placement.plan.table());
        println!();
    }
}

/// One resolved value and its origin, for `plan --format json`.
#[derive(Serialize)]
struct PlanValue {
    key: String,
    value: String,
    origin: String,
}

/// One budget line.
#[derive(Serialize)]
struct PlanBudgetLine {
    what: String,
    mib: f64,
    counted: bool,
    note: String,
}

/// One (job, profile point) as `plan --format json` reports it: the numbers the text shows.
#[derive(Serialize)]
struct PlanUnit {
    job: String,
    file: String,
    profile: String,
    profile_file: String,
    point: String,
    model: String,
    arch: String,
    n_layer: u64,
    n_expert: u64,
    n_expert_used: u64,
    model_mib: f64,
    kind: String,
    items: usize,
    values: Vec<PlanValue>,
    repeat: u32,
    warmup: u32,
    prefill_device: Option<String>,
    prefill_reason: String,
    device_ubatch: Option<u32>,
    min_tokens: Option<u32>,
    cpu_ubatch: u32,
    context: u64,
    cache_mb: u64,
    budget: Vec<PlanBudgetLine>,
    counted_mib: f64,
    available_mib: f64,
    ram_mib: f64,
    floor_mib: f64,
}

/// `plan --format json`.
#[derive(Serialize)]
struct PlanReport {
    units: Vec<PlanUnit>,
    warnings: Vec<String>,
}

fn plan_report(p: &Prepared) -> PlanReport {
    let units = p
        .units
        .iter()
        .map(|u| {
            let j = &p.jobs[u.job];
            let d = &u.placement.plan.dims;
            let s = &u.resolved.settings;
            let dev = u.placement.plan.prefill.device.clone();
            PlanUnit {
                job: j.job.name.clone(),
                file: display_path(&j.src.path),
                profile: u.profile.name.clone(),
                profile_file: display_path(&u.profile_path),
                point: u.point.clone(),
                model: display_path(&j.model),
                arch: d.arch.clone(),
                n_layer: d.n_layer,
                n_expert: d.n_expert,
                n_expert_used: d.n_expert_used,
                model_mib: d.file_bytes as f64 / (1u64 << 20) as f64,
                kind: j.job.kind.to_string(),
                items: j.items.len(),
                repeat: j.job.repeat,
                warmup: j.job.warmup,
                values: u
                    .resolved
                    .origins
                    .iter()
                    .map(|(k, v, o)| PlanValue {
                        key: k.clone(),
                        value: v.clone(),
                        origin: o.clone(),
                    })
                    .collect(),
                device_ubatch: dev.as_ref().map(|_| s.device_ubatch),
                min_tokens: dev.as_ref().map(|_| s.min_tokens),
                prefill_device: dev,
                prefill_reason: u.placement.plan.prefill.reason.clone(),
                cpu_ubatch: s.cpu_ubatch,
                context: u.placement.plan.n_ctx,
                cache_mb: u.placement.plan.cache_mb,
                counted_mib: u.placement.plan.total_mib(),
                budget: u
                    .placement
                    .plan
                    .budget
                    .iter()
                    .map(|l| PlanBudgetLine {
                        what: l.what.to_string(),
                        mib: l.mib,
                        counted: l.counted,
                        note: l.note.clone(),
                    })
                    .collect(),
                available_mib: u.placement.plan.available_mib,
                ram_mib: u.placement.plan.ram_mib,
                floor_mib: u.placement.plan.floor_mib,
            }
        })
        .collect();
    PlanReport {
        units,
        warnings: p.warnings.clone(),
    }
}

/// The cores line of a plan: where compute, readers and loaders run, and why.
fn cores_line(c: &crate::placement::cores::CoreChoice) -> String {
    use crate::config::cpus::cpulist;
    match (c.compute.is_empty(), c.helpers.is_empty()) {
        (true, _) => c.why.clone(),
        (false, true) => format!(
            "compute on {}; readers and loaders anywhere; {}",
            cpulist(&c.compute),
            c.why
        ),
        (false, false) => format!(
            "compute on {}, readers and loaders on {}; {}",
            cpulist(&c.compute),
            cpulist(&c.helpers),
            c.why
        ),
    }
}

/// What one expert miss costs at the storage rate `bmoe profile measure` recorded in the profile:
/// the floor of a streamed decode that misses.
fn read_floor_line(
    profile: &crate::config::profile::Profile,
    dims: &bmoe_engine::plan::ModelDims,
) -> Option<String> {
    let m = profile.measured.as_ref()?;
    let (depth, rate) = m.best_read()?;
    if dims.n_expert == 0 || rate <= 0.0 {
        return None;
    }
    let slice = dims.max_layer_expert_bytes as f64 / dims.n_expert as f64;
    Some(format!(
        "one expert of a layer ({:.0} KiB) per {:.2} ms at the profile's measured {:.0} MiB/s ({} KiB reads, {depth} in flight)",
        slice / 1024.0,
        1e3 * slice / (rate * (1u64 << 20) as f64),
        rate,
        m.read_kib
    ))
}
