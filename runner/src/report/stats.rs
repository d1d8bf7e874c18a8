//! Groups by (job, profile, point) and their summaries: quantiles of the per-row metrics, accuracy,
//! and agreement on `best` with a reference point.
use std::collections::{BTreeMap, HashMap};

use super::error::ReportError;
use super::group::{Fraction, Group, Stat};
use super::input::{point_params, Data, Rec, SPLIT};
use super::metrics::{row_metric, METRICS};
use super::reference::{accuracy_change, agreement, ppl_change, speedup};

/// A value as a group label shows it: a model hash shortened to 12 digits.
fn shown_value(col: &str, v: &str) -> String {
    match (col, v) {
        (_, "") => "?".into(),
        ("model_sha256", v) => v.chars().take(12).collect(),
        _ => v.to_string(),
    }
}

/// Splits one point's rows by the [`SPLIT`] columns whose values differ among them; each part
/// comes with the differing columns and its values (none when the point is one part).
fn split_point(d: &Data, members: &[usize]) -> Vec<(BTreeMap<String, String>, Vec<usize>)> {
    let differing: Vec<usize> = (0..SPLIT.len())
        .filter(|&c| {
            let mut vals = members.iter().map(|&i| d.recs[i].split[c].as_str());
            let first = vals.next();
            vals.any(|v| Some(v) != first)
        })
        .collect();
    let mut parts: Vec<(Vec<&str>, Vec<usize>)> = Vec::new();
    for &i in members {
        let key: Vec<&str> = differing
            .iter()
            .map(|&c| d.recs[i].split[c].as_str())
            .collect();
        match parts.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => v.push(i),
            None => parts.push((key, vec![i])),
        }
    }
    parts
        .into_iter()
        .map(|(key, rows)| {
            let differs = differing
                .iter()
                .zip(key)
                .map(|(&c, v)| (SPLIT[c].to_string(), shown_value(SPLIT[c], v)))
                .collect();
            (differs, rows)
        })
        .collect()
}

/// A point's peak memory once per run: the largest `peak_rss_mib` of the run's rows (each row
/// holds the peak since its point started, so the point's last row holds the point's peak).
fn run_peaks(d: &Data, rows: &[&Rec]) -> Vec<f64> {
    let mut peaks: BTreeMap<&str, f64> = BTreeMap::new();
    for r in rows {
        if let Some(v) = d.num(r, "peak_rss_mib") {
            let p = peaks.entry(r.run_id.as_str()).or_insert(v);
            *p = p.max(v);
        }
    }
    peaks.into_values().collect()
}

/// Each metric's quantiles over the group's rows that did not fail (peak memory per run).
fn metric_stats(d: &Data, ok: &[&Rec]) -> BTreeMap<String, Stat> {
    let mut metrics = BTreeMap::new();
    for (name, _, _) in METRICS {
        let v: Vec<f64> = match *name {
            "peak_rss_mib" => run_peaks(d, ok),
            _ => ok.iter().filter_map(|r| row_metric(d, r, name)).collect(),
        };
        if let Some(s) = Stat::of(v) {
            metrics.insert(name.to_string(), s);
        }
    }
    metrics
}

/// Per item: (item, correct repeats, repeats with a verdict), in first-seen item order.
fn item_verdicts<'r>(ok: &[&'r Rec]) -> Vec<(&'r str, f64, f64)> {
    let mut per_item: Vec<(&str, f64, f64)> = Vec::new();
    for r in ok {
        let Some(c) = r.correct else { continue };
        match per_item.iter_mut().find(|(i, _, _)| *i == r.item) {
            Some(e) => {
                e.1 += f64::from(u8::from(c));
                e.2 += 1.0;
            }
            None => per_item.push((r.item.as_str(), f64::from(u8::from(c)), 1.0)),
        }
    }
    per_item
}

/// Summarises one group's rows.
fn summarise(
    d: &Data,
    (job, profile, point): &(String, String, String),
    differs: BTreeMap<String, String>,
    members: Vec<usize>,
) -> Group {
    let ok: Vec<&Rec> = members
        .iter()
        .map(|&i| &d.recs[i])
        .filter(|r| !r.failed)
        .collect();
    let metrics = metric_stats(d, &ok);
    let per_item = item_verdicts(&ok);
    let scores: Vec<f64> = per_item.iter().map(|(_, s, n)| s / n).collect();
    let mut runs: Vec<String> = Vec::new();
    let mut items: Vec<&str> = Vec::new();
    for r in members.iter().map(|&i| &d.recs[i]) {
        if !runs.contains(&r.run_id) {
            runs.push(r.run_id.clone());
        }
        if !items.contains(&r.item.as_str()) {
            items.push(r.item.as_str());
        }
    }
    let cache = Stat::of(ok.iter().filter_map(|r| d.num(r, "cache_mb")).collect());
    let label = if differs.is_empty() {
        point.clone()
    } else {
        let what: Vec<String> = differs.iter().map(|(k, v)| format!("{k}={v}")).collect();
        format!("{point} [{}]", what.join(", "))
    };
    Group {
        job: job.clone(),
        profile: profile.clone(),
        point: point.clone(),
        label,
        differs,
        params: point_params(point).into_iter().collect(),
        rows: members.len(),
        items: items.len(),
        errors: members.len() - ok.len(),
        runs,
        repeats: members
            .iter()
            .filter_map(|&i| d.recs[i].repeat)
            .max()
            .map(|m| m + 1),
        cache_mb: cache.map(|s| s.median),
        metrics,
        accuracy: Fraction::of_items(&scores),
        agreement: None,
        accuracy_change: None,
        item_scores: per_item
            .iter()
            .map(|(i, s, n)| (i.to_string(), s / n))
            .collect(),
        speedup: None,
        prefill_speedup: None,
        floor: None,
        ppl_change: None,
        settings: configured_settings(d, &members),
        members,
    }
}

/// The settings the group's rows were configured with (`settings.<key>` of [`SPLIT`], which
/// every row of a group shares), by key; empty for files before schema 10.
fn configured_settings(d: &Data, members: &[usize]) -> BTreeMap<String, String> {
    let Some(&first) = members.first() else {
        return BTreeMap::new();
    };
    SPLIT
        .iter()
        .zip(&d.recs[first].split)
        .filter_map(|(name, v)| {
            let key = name.strip_prefix("settings.")?;
            (!v.is_empty()).then(|| (key.to_string(), v.clone()))
        })
        .collect()
}

/// Groups the rows in first-seen order and summarises each; `reference` picks the reference
/// point for agreement and speed-up (default: each (job, profile)'s stock llama.cpp point, the
/// baseline, where it has one; else its first point, which is the sweep's first).
pub fn groups(d: &Data, reference: Option<&str>) -> Result<Vec<Group>, ReportError> {
    let mut order: Vec<(String, String, String)> = Vec::new();
    let mut by_key: HashMap<(String, String, String), Vec<usize>> = HashMap::new();
    for (i, r) in d.recs.iter().enumerate() {
        let k = (r.job.clone(), r.profile.clone(), r.point.clone());
        by_key
            .entry(k.clone())
            .or_insert_with(|| {
                order.push(k);
                Vec::new()
            })
            .push(i);
    }
    let mut out = Vec::new();
    for k in &order {
        let members = by_key.get(k).cloned().unwrap_or_default();
        for (differs, part) in split_point(d, &members) {
            out.push(summarise(d, k, differs, part));
        }
    }
    let mut pairs: Vec<(String, String)> = Vec::new();
    for g in &out {
        let p = (g.job.clone(), g.profile.clone());
        if !pairs.contains(&p) {
            pairs.push(p);
        }
    }
    for (job, profile) in pairs {
        let idx: Vec<usize> = (0..out.len())
            .filter(|&i| out[i].job == job && out[i].profile == profile)
            .collect();
        let ref_i = match reference {
            None => idx
                .iter()
                .copied()
                .find(|&i| out[i].members.iter().any(|&m| d.recs[m].stock))
                .or_else(|| idx.first().copied()),
            Some(label) => idx
                .iter()
                .copied()
                .find(|&i| out[i].label == label)
                .or_else(|| idx.iter().copied().find(|&i| out[i].point == label)),
        };
        let Some(ref_i) = ref_i else {
            // Only reached with an explicit --reference: say which points exist.
            return Err(ReportError::NoReference {
                point: reference.unwrap_or_default().to_string(),
                job,
                profile,
                points: idx
                    .iter()
                    .map(|&i| out[i].label.clone())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        };
        agreement(d, &mut out, &idx, ref_i);
        accuracy_change(&mut out, &idx, ref_i);
        speedup(d, &mut out, &idx, ref_i);
        super::floor::floor(d, &mut out, &idx, ref_i);
        ppl_change(d, &mut out, &idx, ref_i);
    }
    Ok(out)
}
