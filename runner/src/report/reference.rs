//! Each group against the reference point: agreement on `best`, accuracy and perplexity changes,
//! the speed-up with its interval.
use std::collections::HashMap;

use super::group::{AccuracyChange, Agreement, Group, PplChange, Speedup, Stat, SPEEDUP_METHOD};
use super::input::{Data, Rec};
use super::metrics::metric_values;
use crate::compare::stats::{median_ratio_95, paired_bootstrap, METHOD};

/// Per item of the rows `members`, `value` of its lowest repeat that has one (failed rows left
/// out): what a group answered for an item, however often it was repeated.
pub(super) fn first_repeat<'a, T>(
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
pub(super) fn agreement(d: &Data, out: &mut [Group], idx: &[usize], ref_i: usize) {
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
pub(super) fn accuracy_change(out: &mut [Group], idx: &[usize], ref_i: usize) {
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
pub(super) fn ppl_change(d: &Data, out: &mut [Group], idx: &[usize], ref_i: usize) {
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

/// Speed against the reference for each group in `idx`: decode's where a group decoded, else
/// decisions a second (decide: prefix reuse shortens a decision, not its prefill rate), else
/// prefill's (`speedup`); with decode's, prefill's too where the groups prefilled
/// (`prefill_speedup`: a generate job's two phases, as llama-bench reports both).
pub(super) fn speedup(d: &Data, out: &mut [Group], idx: &[usize], ref_i: usize) {
    let has = |out: &[Group], m: &str| idx.iter().any(|&i| out[i].metrics.contains_key(m));
    let Some(metric) = ["decode_tps", "decisions_per_s", "prefill_tps"]
        .into_iter()
        .find(|m| has(out, m))
    else {
        return;
    };
    for (gi, s) in speedup_of(d, out, idx, ref_i, metric) {
        out[gi].speedup = Some(s);
    }
    if metric == "decode_tps" && has(out, "prefill_tps") {
        for (gi, s) in speedup_of(d, out, idx, ref_i, "prefill_tps") {
            out[gi].prefill_speedup = Some(s);
        }
    }
}

/// `metric`'s median of each group in `idx` over the reference's, with its 95% interval.
fn speedup_of(
    d: &Data,
    out: &[Group],
    idx: &[usize],
    ref_i: usize,
    metric: &str,
) -> Vec<(usize, Speedup)> {
    let Some(base) = out[ref_i].metrics.get(metric).map(|s| s.median) else {
        return Vec::new();
    };
    if base <= 0.0 {
        return Vec::new();
    }
    let base_rows = metric_values(d, &out[ref_i], metric);
    let mut found = Vec::new();
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
        let s = Speedup {
            metric: metric.to_string(),
            reference: out[ref_i].label.clone(),
            value: s.median / base,
            low,
            high,
            interval_method: SPEEDUP_METHOD,
        };
        found.push((gi, s));
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::input::Rec;

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
            stock: false,
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
}
