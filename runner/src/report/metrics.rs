//! The report's metrics by name: the per-row metrics and their direction, a row's value, a group's
//! scalar (for `--objective` and `--require`), and the hint for a name that is none of them.

use super::group::{Group, Stat};
use super::input::{Data, Rec};
use crate::compare::stats::{bootstrap_95, mean, MedianInterval};

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
        "decisions_per_s",
        "decisions/s",
        "decide: decisions per second, 1 / `ttft_s` (the call to its scores; prefix reuse shortens it, where `prefill_tps` counts only the tokens prefilled)",
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
    ) || (name.ends_with("_s") && !name.ends_with("_per_s"))
        || name.ends_with("_mib")
        || name.ends_with("_mib_p10")
        || name.ends_with("_mib_p90")
        || name.ends_with("_bytes")
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
        // Only a decide row has `n_reused`; a generate row's `ttft_s` is its first token's.
        "decisions_per_s" => {
            d.num(r, "n_reused")?;
            let s = d.num(r, "ttft_s")?;
            (s > 0.0).then(|| 1.0 / s)
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

/// The values of one of [`METRICS`] over a group's rows that did not fail.
pub(super) fn metric_values(d: &Data, g: &Group, name: &str) -> Vec<f64> {
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
pub(super) fn edit_distance(a: &str, b: &str) -> usize {
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
        // A rate a second, not a time: `--best` had picked the slowest point by it.
        assert!(!lower_is_better("decisions_per_s"));
        assert!(lower_is_better("ttft_s"));
    }
}
