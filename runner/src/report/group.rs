//! A group of rows, one (job, profile, point), and what the report says of it: quantiles of its
//! metrics, its accuracy, and its change against the reference point.
use std::collections::BTreeMap;

use serde::Serialize;

use crate::compare::stats::PairedChange;

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

/// A streamed point's decode time a token against its floor: decode's own reads a token at the
/// storage rate probed before the point (`disk_probe`), plus the reference point's decode time a
/// token (its compute, with every expert in memory).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Floor {
    /// The reference point's label (the compute floor).
    pub reference: String,
    /// This point's median decode time a token over (median read floor + the reference's
    /// median decode time a token): 1.0 is the floor itself.
    pub value: f64,
    /// Lower end of its 95% interval ([`FLOOR_METHOD`]).
    pub low: f64,
    /// Upper end of its 95% interval.
    pub high: f64,
    /// This point's median decode time a token, ms.
    pub decode_ms: f64,
    /// Median over its rows of decode's reads a token at the row's probed rate, ms.
    pub read_ms: f64,
    /// The reference's median decode time a token, ms.
    pub compute_ms: f64,
    /// How the interval was computed.
    pub interval_method: &'static str,
}

/// How the floor ratio's interval is computed.
pub const FLOOR_METHOD: &str = "bootstrap of median(decode s/token) / (median(read s/token) + the reference's median decode s/token), the point's rows resampled whole and the reference's apart, 2000 resamples, SplitMix64 seed 20250933, percentile 95%";

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
    /// Speed against the reference point: decode's where the point decoded, else prefill's.
    pub speedup: Option<Speedup>,
    /// Prefill's speed against the reference point, beside decode's in `speedup` (a generate
    /// job's points); absent where `speedup` is prefill's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefill_speedup: Option<Speedup>,
    /// Decode against its floor (a streamed point with `disk_probe` on; not on the reference).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub floor: Option<Floor>,
    /// Perplexity against the reference point.
    pub ppl_change: Option<PplChange>,
    /// Row indices into [`Data::recs`] (not serialized).
    #[serde(skip)]
    pub members: Vec<usize>,
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
}
