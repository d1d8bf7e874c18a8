//! Groups by (job, profile, point) and their summaries: quantiles of the per-row metrics, accuracy,
//! and agreement on `best` with a reference point.
use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use super::error::ReportError;
use super::input::{point_params, Data, Rec, SPLIT};
use crate::compare::stats::{
    bootstrap_95, mean, median_ratio_95, paired_bootstrap, MedianInterval, PairedChange, METHOD,
};

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
    (
        "peak_rss_mib",
        "peak RSS MiB",
        "the point's peak resident memory: per run, the largest `peak_rss_mib` of its rows (schema 10 and later reset the process's high-water mark when a point starts, its model load included; older files hold the process's running maximum, which grows with the order of the points)",
    ),
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
        "read_mib_per_token"
            | "dev_wait_share"
            | "ppl"
            | "ppl_change"
            | "nll_mean"
            | "evictions"
            | "errors"
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

/// Accuracy over items: each item's repeats are averaged first, so an item counts once however
/// often it ran, and the standard error is lm-eval's `mean_stderr` over the per-item scores
/// (`sample_stddev / sqrt(n)`, which is `sqrt(p(1-p)/(n-1))` when every item scores 0 or 1).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Fraction {
    /// The share, 0..=1.
    pub value: f64,
    /// Items it was computed over.
    pub n: usize,
    /// Standard error of the mean over items; absent with one item.
    pub stderr: Option<f64>,
}

impl Fraction {
    /// The mean and lm-eval's standard error of per-item scores; `None` when there are none.
    pub fn of_items(scores: &[f64]) -> Option<Fraction> {
        if scores.is_empty() {
            return None;
        }
        let n = scores.len() as f64;
        let mean = scores.iter().sum::<f64>() / n;
        let stderr = (scores.len() > 1).then(|| {
            let var = scores.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
            (var / n).sqrt()
        });
        Some(Fraction {
            value: mean,
            n: scores.len(),
            stderr,
        })
    }
}

/// Accuracy against the reference point's, paired over the items both have: the change of the
/// mean per-item score with the 95% interval `bmoe compare` gives (`compare::stats`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AccuracyChange {
    /// The reference point's label.
    pub reference: String,
    /// This group minus the reference, per item, with its interval.
    pub change: PairedChange,
    /// How the interval was computed.
    pub interval_method: &'static str,
}

/// A speed against the reference point's.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Speedup {
    /// The metric compared (`decode_tps` where the pair decodes, else `prefill_tps`).
    pub metric: String,
    /// The reference point's label.
    pub reference: String,
    /// This group's median over the reference's.
    pub value: f64,
    /// Lower end of its 95% interval ([`SPEEDUP_METHOD`]); absent on the reference itself.
    pub low: Option<f64>,
    /// Upper end of its 95% interval.
    pub high: Option<f64>,
    /// How the interval was computed.
    pub interval_method: &'static str,
}

/// How a speed-up's interval is computed: the two groups' rows resampled apart, since points
/// may hold other items or repeat counts, and the statistic is the ratio of the two medians the
/// table shows.
pub const SPEEDUP_METHOD: &str = "bootstrap of the ratio of medians, each group's rows resampled apart, 2000 resamples, SplitMix64 seed 20250933, percentile 95%";

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

/// Perplexity against the reference point, paired by item: how a person prices a prefill device
/// whose kernels compute differently (docs/vulkan.md).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PplChange {
    /// The reference point's label.
    pub reference: String,
    /// Median over the items both scored of this group's `ppl` over the reference's, minus 1.
    pub value: f64,
    /// The largest such change in magnitude, signed.
    pub worst: f64,
    /// Items compared.
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
    /// The group's label: the point, with what sets it apart from the point's other groups
    /// (`cache_mb=0 [threads=1]`) when the point's rows differ in settings, host, commit or model.
    pub label: String,
    /// The settings, host, commit or model that differ between this point's groups, with this
    /// group's values (empty when the point is one group).
    pub differs: BTreeMap<String, String>,
    /// The point's swept values (numbers and booleans typed in JSON).
    #[serde(serialize_with = "typed_params")]
    pub params: BTreeMap<String, String>,
    /// Rows in the group (a duplicated row counted once).
    pub rows: usize,
    /// Distinct items.
    pub items: usize,
    /// Rows whose item the engine refused (left out of the metrics).
    pub errors: usize,
    /// Distinct run ids.
    pub runs: Vec<String>,
    /// Highest repeat index + 1, when rows carry `repeat`.
    pub repeats: Option<u32>,
    /// Median `cache_mb` of the rows (the resolved cache budget).
    pub cache_mb: Option<f64>,
    /// The layered settings the group's rows ran with, as configured (from the `settings`
    /// column; empty for files before schema 10): what an overlay of this point depends on.
    #[serde(skip)]
    pub settings: BTreeMap<String, String>,
    /// Summaries of [`METRICS`], absent when no row measured it.
    pub metrics: BTreeMap<String, Stat>,
    /// Share of decisions answered right, where rows carry `correct` (or `expected`).
    pub accuracy: Option<Fraction>,
    /// Agreement on `best` with the reference point.
    pub agreement: Option<Agreement>,
    /// Accuracy against the reference point's, with a 95% interval (not on the reference).
    pub accuracy_change: Option<AccuracyChange>,
    /// (item, mean of its repeats' verdicts), in item order (not serialized).
    #[serde(skip)]
    pub item_scores: BTreeMap<String, f64>,
    /// Speed against the reference point.
    pub speedup: Option<Speedup>,
    /// Perplexity against the reference point.
    pub ppl_change: Option<PplChange>,
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

/// Serializes swept values as JSON numbers and booleans where they read as such.
pub fn typed_params<S: serde::Serializer>(
    params: &BTreeMap<String, String>,
    s: S,
) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut m = s.serialize_map(Some(params.len()))?;
    for (k, v) in params {
        match serde_json::from_str::<serde_json::Value>(v) {
            Ok(x @ (serde_json::Value::Number(_) | serde_json::Value::Bool(_))) => {
                m.serialize_entry(k, &x)?
            }
            _ => m.serialize_entry(k, v)?,
        }
    }
    m.end()
}

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
    let mut metrics = BTreeMap::new();
    for (name, _, _) in METRICS {
        let v: Vec<f64> = match *name {
            "peak_rss_mib" => run_peaks(d, &ok),
            _ => ok.iter().filter_map(|r| row_metric(d, r, name)).collect(),
        };
        if let Some(s) = Stat::of(v) {
            metrics.insert(name.to_string(), s);
        }
    }
    // Per item: the mean of its repeats' verdicts, in first-seen item order.
    let mut per_item: Vec<(&str, f64, f64)> = Vec::new();
    for r in &ok {
        let Some(c) = r.correct else { continue };
        match per_item.iter_mut().find(|(i, _, _)| *i == r.item) {
            Some(e) => {
                e.1 += f64::from(u8::from(c));
                e.2 += 1.0;
            }
            None => per_item.push((r.item.as_str(), f64::from(u8::from(c)), 1.0)),
        }
    }
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
/// point for agreement and speed-up (default: each (job, profile)'s first point, which is the
/// sweep's first).
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
            None => idx.first().copied(),
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
        ppl_change(d, &mut out, &idx, ref_i);
    }
    Ok(out)
}

/// Per item of the rows `members`, `value` of its lowest repeat that has one (failed rows left
/// out): what a group answered for an item, however often it was repeated.
fn first_repeat<'a, T>(
    d: &'a Data,
    members: &[usize],
    value: impl Fn(&'a Rec) -> Option<T>,
) -> HashMap<&'a str, T> {
    let mut m: HashMap<&str, (u32, T)> = HashMap::new();
    for &i in members {
        let r = &d.recs[i];
        let Some(v) = value(r).filter(|_| !r.failed) else {
            continue;
        };
        let rep = r.repeat.unwrap_or(0);
        if m.get(r.item.as_str()).is_none_or(|(kept, _)| rep < *kept) {
            m.insert(r.item.as_str(), (rep, v));
        }
    }
    m.into_iter().map(|(k, (_, v))| (k, v)).collect()
}

/// Agreement on `best` of each group in `idx` with the group `ref_i`.
fn agreement(d: &Data, out: &mut [Group], idx: &[usize], ref_i: usize) {
    let answer = first_repeat(d, &out[ref_i].members, |r| r.best);
    let ref_label = out[ref_i].label.clone();
    for &gi in idx {
        let (mut same, mut n) = (0usize, 0usize);
        for &m in &out[gi].members {
            let r = &d.recs[m];
            if r.failed {
                continue;
            }
            if let (Some(b), Some(a)) = (r.best, answer.get(r.item.as_str())) {
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

/// Each group's accuracy change against the reference group, paired over the items both scored.
fn accuracy_change(out: &mut [Group], idx: &[usize], ref_i: usize) {
    let reference = out[ref_i].label.clone();
    for &gi in idx.iter().filter(|&&gi| gi != ref_i) {
        let diffs: Vec<f64> = out[gi]
            .item_scores
            .iter()
            .filter_map(|(item, s)| out[ref_i].item_scores.get(item).map(|r| s - r))
            .collect();
        out[gi].accuracy_change = paired_bootstrap(&diffs).map(|change| AccuracyChange {
            reference: reference.clone(),
            change,
            interval_method: METHOD,
        });
    }
}

/// Each group's perplexity against the reference group's, item by item (first repeat of each).
fn ppl_change(d: &Data, out: &mut [Group], idx: &[usize], ref_i: usize) {
    let per_item = |g: &Group| first_repeat(d, &g.members, |r| d.num(r, "ppl"));
    let base = per_item(&out[ref_i]);
    if base.is_empty() {
        return;
    }
    let reference = out[ref_i].label.clone();
    // The reference too (0 against itself), as agreement does, so `--require` can keep it.
    for &gi in idx {
        let changes: Vec<f64> = per_item(&out[gi])
            .iter()
            .filter_map(|(item, p)| base.get(item).map(|b| p / b - 1.0))
            .filter(|c| c.is_finite())
            .collect();
        let worst = changes
            .iter()
            .copied()
            .fold(0f64, |a, c| if c.abs() > a.abs() { c } else { a });
        if let Some(s) = Stat::of(changes.clone()) {
            out[gi].ppl_change = Some(PplChange {
                reference: reference.clone(),
                value: s.median,
                worst,
                n: changes.len(),
            });
        }
    }
}

/// Each group's median speed over the reference group's, with its 95% interval: decode where the
/// pair decodes, else prefill.
fn speedup(d: &Data, out: &mut [Group], idx: &[usize], ref_i: usize) {
    let metric = ["decode_tps", "prefill_tps"]
        .into_iter()
        .find(|m| idx.iter().any(|&i| out[i].metrics.contains_key(*m)));
    let Some(metric) = metric else { return };
    let Some(base) = out[ref_i].metrics.get(metric).map(|s| s.median) else {
        return;
    };
    if base <= 0.0 {
        return;
    }
    let reference = out[ref_i].label.clone();
    let base_rows = metric_values(d, &out[ref_i], metric);
    for &gi in idx {
        let Some(s) = out[gi].metrics.get(metric) else {
            continue;
        };
        let (low, high) = if gi == ref_i {
            (None, None)
        } else {
            let (lo, hi) = median_ratio_95(&metric_values(d, &out[gi], metric), &base_rows);
            (Some(lo), Some(hi))
        };
        out[gi].speedup = Some(Speedup {
            metric: metric.to_string(),
            reference: reference.clone(),
            value: s.median / base,
            low,
            high,
            interval_method: SPEEDUP_METHOD,
        });
    }
}

/// The values of one of [`METRICS`] over a group's rows that did not fail.
fn metric_values(d: &Data, g: &Group, name: &str) -> Vec<f64> {
    g.members
        .iter()
        .map(|&i| &d.recs[i])
        .filter(|r| !r.failed)
        .filter_map(|r| row_metric(d, r, name))
        .collect()
}

/// The 95% interval (low, high) of what [`scalar`] gives for `name`, where one is cheap: the
/// bootstrap of a median over the group's rows (a metric or a numeric column), or of the mean over
/// items (`accuracy`). `None` for counts, agreement, perplexity change and quantiles.
pub fn scalar_interval(d: &Data, g: &Group, name: &str) -> Option<(f64, f64)> {
    let values: Vec<f64> = match name {
        "accuracy" => {
            let s: Vec<f64> = g.item_scores.values().copied().collect();
            return (!s.is_empty()).then(|| bootstrap_95(&s, |v| mean(v)));
        }
        "rows" | "errors" | "agreement" | "ppl_change" => return None,
        _ if METRICS.iter().any(|(m, _, _)| *m == name) => metric_values(d, g, name),
        _ if name.ends_with("_p10") || name.ends_with("_p90") => return None,
        _ => g
            .members
            .iter()
            .map(|&i| &d.recs[i])
            .filter(|r| !r.failed)
            .filter_map(|r| d.num(r, name))
            .collect(),
    };
    MedianInterval::of(&values).map(|m| (m.low, m.high))
}

/// The scalar a `--objective` or `--require` name means for a group: a metric's median (or
/// `_p10` / `_p90`), `accuracy`, `agreement`, `rows`, `errors`, or any numeric column's median.
pub fn scalar(d: &Data, g: &Group, name: &str) -> Option<f64> {
    match name {
        "rows" => return Some(g.rows as f64),
        "errors" => return Some(g.errors as f64),
        "accuracy" => return g.accuracy.as_ref().map(|a| a.value),
        "agreement" => return g.agreement.as_ref().map(|a| a.value),
        "ppl_change" => return g.ppl_change.as_ref().map(|p| p.value),
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
    ["rows", "errors", "accuracy", "agreement", "ppl_change"].contains(&name)
        || METRICS.iter().any(|(m, _, _)| *m == name || *m == base)
        || d.has(name)
}

/// What to say about a name [`scalar`] does not know: the nearest names (edit distance at most
/// 2, as clap and cargo suggest), else the metrics and where the full list is.
pub fn unknown_name_hint(d: &Data, name: &str) -> String {
    let mut names: Vec<String> = METRICS.iter().map(|(m, _, _)| m.to_string()).collect();
    for (m, _, _) in METRICS {
        names.push(format!("{m}_p10"));
        names.push(format!("{m}_p90"));
    }
    names.extend(["accuracy", "agreement", "rows", "errors"].map(String::from));
    names.extend(
        d.columns
            .iter()
            .filter(|c| d.recs.iter().any(|r| d.num(r, c).is_some()))
            .cloned(),
    );
    let mut near: Vec<(usize, &String)> = names
        .iter()
        .map(|n| (edit_distance(name, n), n))
        .filter(|(dist, _)| *dist <= 2)
        .collect();
    near.sort();
    near.dedup_by(|a, b| a.1 == b.1);
    if !near.is_empty() {
        let shown: Vec<&str> = near.iter().take(3).map(|(_, n)| n.as_str()).collect();
        return format!("did you mean {}?", shown.join(" or "));
    }
    format!(
        "expected a metric ({}; a metric with _p10/_p90 for a quantile), accuracy, agreement, rows, errors, or a numeric column of the CSVs (docs/report.md lists them)",
        METRICS.iter().map(|(m, _, _)| *m).collect::<Vec<_>>().join(", ")
    )
}

/// Levenshtein distance over characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
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
    fn accuracy_stderr_is_lm_evals() {
        // Eight items, six right: sqrt(p(1-p)/(n-1)) = sqrt(0.75 * 0.25 / 7).
        let f = Fraction::of_items(&[1., 1., 1., 0., 1., 1., 0., 1.]).unwrap();
        assert_eq!(f.value, 0.75);
        assert_eq!(f.n, 8);
        assert!((f.stderr.unwrap() - (0.75f64 * 0.25 / 7.0).sqrt()).abs() < 1e-12);
        assert_eq!(Fraction::of_items(&[1.0]).unwrap().stderr, None);
    }

    #[test]
    fn an_items_answer_is_its_lowest_repeat_that_did_not_fail() {
        let rec = |item: &str, repeat: u32, best: i64, failed: bool| Rec {
            run_id: String::new(),
            job: String::new(),
            profile: String::new(),
            point: String::new(),
            item: item.into(),
            repeat: Some(repeat),
            best: Some(best),
            correct: None,
            moe_stream: None,
            failed,
            nums: Vec::new(),
            split: Vec::new(),
            prov: Vec::new(),
        };
        let mut d = Data::default();
        // Repeats out of order; item b's lowest repeat failed.
        d.recs = vec![
            rec("a", 2, 20, false),
            rec("a", 0, 0, false),
            rec("a", 1, 10, false),
            rec("b", 0, 5, true),
            rec("b", 3, 7, false),
        ];
        let got = first_repeat(&d, &[0, 1, 2, 3, 4], |r| r.best);
        assert_eq!(got.len(), 2);
        assert_eq!(got["a"], 0);
        assert_eq!(got["b"], 7);
        // Only the rows given count.
        assert_eq!(first_repeat(&d, &[0, 2], |r| r.best)["a"], 10);
    }

    #[test]
    fn edit_distances() {
        assert_eq!(edit_distance("decode_tp", "decode_tps"), 1);
        assert_eq!(edit_distance("", "ab"), 2);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }

    #[test]
    fn directions() {
        assert!(lower_is_better("peak_rss_mib"));
        assert!(lower_is_better("prefill_s"));
        assert!(!lower_is_better("decode_tps"));
        assert!(!lower_is_better("agreement"));
    }
}
