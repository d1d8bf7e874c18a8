//! Groups by (job, profile, point) and their summaries: quantiles of the per-row metrics, accuracy,
//! and agreement on `best` with a reference point.
use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use super::input::{point_params, Data, Rec};
use super::ReportError;

/// The per-row metrics the report summarises, in table order: (name, heading, what it is).
pub const METRICS: &[(&str, &str, &str)] = &[
    (
        "prefill_tps",
        "prefill tok/s",
        "prompt tokens per second (rows that prefilled)",
    ),
    (
        "decode_tps",
        "decode tok/s",
        "generated tokens per second (`decode_tps`, else `tok_s`; rows that generated)",
    ),
    (
        "read_mib_per_token",
        "MiB read/token",
        "expert MiB read from flash per processed token: read_mib / (tokens prefilled + tokens) (rows with moe_stream on; a decide row prefilled n_prefilled)",
    ),
    (
        "cache_hit_pct",
        "cache hit %",
        "expert cache hit rate (rows that looked anything up)",
    ),
    ("peak_rss_mib", "peak RSS MiB", "peak resident memory"),
    (
        "dev_wait_share",
        "dev wait share",
        "share of the prefill time the device graph waited on the arena: prefill_dev_stall_s / prefill_s (rows with device tokens)",
    ),
];

/// Names that are better when lower (the objective's default direction).
pub fn lower_is_better(name: &str) -> bool {
    matches!(
        name,
        "read_mib_per_token" | "dev_wait_share" | "ppl" | "nll_mean" | "evictions" | "errors"
    ) || name.ends_with("_s")
        || name.ends_with("_mib")
        || name.ends_with("_mib_p10")
        || name.ends_with("_mib_p90")
        || name.ends_with("_bytes")
}

/// Median, p10 and p90 of a set of values (linear interpolation between order statistics, as
/// numpy's default), with their count.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Stat {
    /// Values summarised.
    pub n: usize,
    /// 50th percentile.
    pub median: f64,
    /// 10th percentile.
    pub p10: f64,
    /// 90th percentile.
    pub p90: f64,
}

/// The `p` quantile (0..=1) of sorted values.
pub fn quantile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let h = (sorted.len() - 1) as f64 * p.clamp(0.0, 1.0);
    let lo = h.floor() as usize;
    let hi = (lo + 1).min(sorted.len() - 1);
    sorted[lo] + (h - lo as f64) * (sorted[hi] - sorted[lo])
}

impl Stat {
    /// Summarises `v`; `None` when it is empty.
    pub fn of(mut v: Vec<f64>) -> Option<Stat> {
        if v.is_empty() {
            return None;
        }
        v.sort_by(|a, b| a.total_cmp(b));
        Some(Stat {
            n: v.len(),
            median: quantile(&v, 0.5),
            p10: quantile(&v, 0.1),
            p90: quantile(&v, 0.9),
        })
    }
}

/// A fraction with what it was computed over.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Fraction {
    /// The share, 0..=1.
    pub value: f64,
    /// Rows it was computed over.
    pub n: usize,
}

/// Agreement on `best` with the reference point.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Agreement {
    /// The reference point's label.
    pub reference: String,
    /// Share of compared rows whose `best` equals the reference's for the same item.
    pub value: f64,
    /// Rows compared (rows with a `best` whose item the reference also has).
    pub n: usize,
}

/// One (job, profile, point).
#[derive(Debug, Clone, Serialize)]
pub struct Group {
    /// Job name.
    pub job: String,
    /// Profile name.
    pub profile: String,
    /// Sweep point label.
    pub point: String,
    /// The point's swept values.
    pub params: BTreeMap<String, String>,
    /// Rows in the group.
    pub rows: usize,
    /// Rows whose item the engine refused (left out of the metrics).
    pub errors: usize,
    /// Distinct run ids.
    pub runs: Vec<String>,
    /// Highest repeat index + 1, when rows carry `repeat`.
    pub repeats: Option<u32>,
    /// Median `cache_mb` of the rows (the resolved cache budget).
    pub cache_mb: Option<f64>,
    /// Summaries of [`METRICS`], absent when no row measured it.
    pub metrics: BTreeMap<String, Stat>,
    /// Share of decisions answered right, where rows carry `correct` (or `expected`).
    pub accuracy: Option<Fraction>,
    /// Agreement on `best` with the reference point.
    pub agreement: Option<Agreement>,
    /// Row indices into [`Data::recs`] (not serialized).
    #[serde(skip)]
    pub members: Vec<usize>,
}

/// The per-row value of one of [`METRICS`], `None` where the row did not measure it.
pub fn row_metric(d: &Data, r: &Rec, name: &str) -> Option<f64> {
    // Tokens this row prefilled: a decide row that reused a cached prefix processed only
    // `n_prefilled` of its `n_prompt` (older files lack the column).
    let n_prompt = d.num(r, "n_prefilled").or_else(|| d.num(r, "n_prompt"));
    let tokens = d.num(r, "tokens");
    match name {
        "prefill_tps" => {
            let v = d.num(r, "prefill_tps")?;
            (n_prompt.unwrap_or(1.0) > 0.0 && v > 0.0).then_some(v)
        }
        "decode_tps" => {
            let v = d.num(r, "decode_tps").or_else(|| d.num(r, "tok_s"))?;
            (tokens.unwrap_or(1.0) > 0.0 && v > 0.0).then_some(v)
        }
        // Without streaming nothing is read from flash: not a measurement of zero.
        "read_mib_per_token" if r.moe_stream == Some(false) => None,
        "read_mib_per_token" => {
            let t = n_prompt.unwrap_or(0.0) + tokens.unwrap_or(0.0);
            let v = d.num(r, "read_mib")?;
            (t > 0.0).then_some(v / t)
        }
        // -1 means nothing was looked up.
        "cache_hit_pct" => d.num(r, "cache_hit_pct").filter(|v| *v >= 0.0),
        "peak_rss_mib" => d.num(r, "peak_rss_mib"),
        "dev_wait_share" => {
            let dev = d.num(r, "prefill_dev_tokens")?;
            let s = d.num(r, "prefill_s")?;
            let w = d.num(r, "prefill_dev_stall_s")?;
            (dev > 0.0 && s > 0.0).then_some(w / s)
        }
        _ => None,
    }
}

/// Groups the rows in first-seen order and summarises each; `reference` picks the agreement
/// reference point (default: each (job, profile)'s first point, which is the sweep's first).
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
        let ok: Vec<&Rec> = members
            .iter()
            .map(|&i| &d.recs[i])
            .filter(|r| !r.failed)
            .collect();
        let mut metrics = BTreeMap::new();
        for (name, _, _) in METRICS {
            let v: Vec<f64> = ok.iter().filter_map(|r| row_metric(d, r, name)).collect();
            if let Some(s) = Stat::of(v) {
                metrics.insert(name.to_string(), s);
            }
        }
        let judged: Vec<bool> = ok.iter().filter_map(|r| r.correct).collect();
        let accuracy = (!judged.is_empty()).then(|| Fraction {
            value: judged.iter().filter(|c| **c).count() as f64 / judged.len() as f64,
            n: judged.len(),
        });
        let mut runs: Vec<String> = Vec::new();
        for r in members.iter().map(|&i| &d.recs[i]) {
            if !runs.contains(&r.run_id) {
                runs.push(r.run_id.clone());
            }
        }
        let cache = Stat::of(ok.iter().filter_map(|r| d.num(r, "cache_mb")).collect());
        out.push(Group {
            job: k.0.clone(),
            profile: k.1.clone(),
            point: k.2.clone(),
            params: point_params(&k.2).into_iter().collect(),
            rows: members.len(),
            errors: members.len() - ok.len(),
            runs,
            repeats: members
                .iter()
                .filter_map(|&i| d.recs[i].repeat)
                .max()
                .map(|m| m + 1),
            cache_mb: cache.map(|s| s.median),
            metrics,
            accuracy,
            agreement: None,
            members,
        });
    }
    // Agreement against the reference point of the same (job, profile).
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
            None => idx.first().copied(),
            Some(label) => idx.iter().copied().find(|&i| out[i].point == label),
        };
        let Some(ref_i) = ref_i else {
            // Only reached with an explicit --reference: say which points exist.
            return Err(ReportError::NoReference {
                point: reference.unwrap_or_default().to_string(),
                job,
                profile,
                points: idx
                    .iter()
                    .map(|&i| out[i].point.clone())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        };
        // The reference's answer per item: its lowest repeat's `best`.
        let mut answer: HashMap<&str, (u32, i64)> = HashMap::new();
        for &m in &out[ref_i].members {
            let r = &d.recs[m];
            if let (false, Some(b)) = (r.failed, r.best) {
                let rep = r.repeat.unwrap_or(0);
                let e = answer.entry(r.item.as_str()).or_insert((rep, b));
                if rep < e.0 {
                    *e = (rep, b);
                }
            }
        }
        let ref_label = out[ref_i].point.clone();
        for &gi in &idx {
            let (mut same, mut n) = (0usize, 0usize);
            for &m in &out[gi].members {
                let r = &d.recs[m];
                if r.failed {
                    continue;
                }
                if let (Some(b), Some((_, a))) = (r.best, answer.get(r.item.as_str())) {
                    n += 1;
                    same += usize::from(b == *a);
                }
            }
            if n > 0 {
                out[gi].agreement = Some(Agreement {
                    reference: ref_label.clone(),
                    value: same as f64 / n as f64,
                    n,
                });
            }
        }
    }
    Ok(out)
}

/// The scalar a `--objective` or `--require` name means for a group: a metric's median (or
/// `_p10` / `_p90`), `accuracy`, `agreement`, `rows`, `errors`, or any numeric column's median.
pub fn scalar(d: &Data, g: &Group, name: &str) -> Option<f64> {
    match name {
        "rows" => return Some(g.rows as f64),
        "errors" => return Some(g.errors as f64),
        "accuracy" => return g.accuracy.as_ref().map(|a| a.value),
        "agreement" => return g.agreement.as_ref().map(|a| a.value),
        _ => {}
    }
    if let Some(s) = g.metrics.get(name) {
        return Some(s.median);
    }
    for (suffix, pick) in [("_p10", 0usize), ("_p90", 1usize)] {
        if let Some(base) = name.strip_suffix(suffix) {
            if METRICS.iter().any(|(m, _, _)| *m == base) {
                return g.metrics.get(base).map(|s| [s.p10, s.p90][pick]);
            }
        }
    }
    if METRICS.iter().any(|(m, _, _)| *m == name) {
        return None;
    }
    let v: Vec<f64> = g
        .members
        .iter()
        .map(|&i| &d.recs[i])
        .filter(|r| !r.failed)
        .filter_map(|r| d.num(r, name))
        .collect();
    Stat::of(v).map(|s| s.median)
}

/// Whether `name` means anything to [`scalar`] for these inputs.
pub fn known_name(d: &Data, name: &str) -> bool {
    let base = name
        .strip_suffix("_p10")
        .or_else(|| name.strip_suffix("_p90"))
        .unwrap_or(name);
    ["rows", "errors", "accuracy", "agreement"].contains(&name)
        || METRICS.iter().any(|(m, _, _)| *m == name || *m == base)
        || d.has(name)
}

/// The names [`scalar`] takes, for error messages.
pub fn known_names(d: &Data) -> String {
    let mut v: Vec<String> = METRICS.iter().map(|(m, _, _)| m.to_string()).collect();
    v.extend(["accuracy", "agreement", "rows", "errors"].map(String::from));
    let numeric: Vec<String> = d
        .columns
        .iter()
        .filter(|c| d.recs.iter().any(|r| d.num(r, c).is_some()))
        .cloned()
        .collect();
    format!(
        "{} (or a metric with _p10/_p90), or a numeric column: {}",
        v.join(", "),
        numeric.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate() {
        let s = Stat::of(vec![4.0, 1.0, 3.0, 2.0]).unwrap();
        assert_eq!(s.median, 2.5);
        assert!((s.p10 - 1.3).abs() < 1e-12);
        assert!((s.p90 - 3.7).abs() < 1e-12);
        assert_eq!(Stat::of(vec![7.0]).unwrap().p90, 7.0);
        assert!(Stat::of(vec![]).is_none());
    }

    #[test]
    fn directions() {
        assert!(lower_is_better("peak_rss_mib"));
        assert!(lower_is_better("prefill_s"));
        assert!(!lower_is_better("decode_tps"));
        assert!(!lower_is_better("agreement"));
    }
}
