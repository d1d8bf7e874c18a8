//! `bmoe compare A.csv B.csv`: rows matched by (job, sweep point, item id) between one run of each
//! file; agreement on `best`, the largest `choice_logp` difference, generated text, perplexity, and
//! the distribution of prefill-time ratios B/A. Files are read by column name, so a CSV from an
//! older build compares with a newer one (columns it lacks read as empty).
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{anyhow, Context};
use serde::Serialize;

use crate::sink::csv::inspect;
use crate::sink::row::Row;

/// What to compare.
#[derive(Debug, Clone, Default)]
pub struct CompareOptions {
    /// Run id to take from A (default: its last run).
    pub run_a: Option<String>,
    /// Run id to take from B (default: its last run).
    pub run_b: Option<String>,
    /// Largest |choice_logp| or |ppl| difference still called identical.
    pub tolerance: f64,
}

/// The spread of the prefill-time ratios B/A.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RatioStats {
    /// Rows with a prefill time on both sides.
    pub rows: usize,
    /// Smallest ratio.
    pub min: f64,
    /// 10th percentile (nearest rank).
    pub p10: f64,
    /// Median (nearest rank).
    pub median: f64,
    /// 90th percentile (nearest rank).
    pub p90: f64,
    /// Largest ratio.
    pub max: f64,
}

/// A largest difference and the row key where it was found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MaxDiff {
    /// The absolute difference.
    pub diff: f64,
    /// `job/point/item`.
    pub key: String,
}

/// Accuracy of each side on the matched decisions with an expected answer, and how it changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct AccuracyChange {
    /// Matched decide rows carrying `correct` on both sides.
    pub decisions: usize,
    /// Correct in A.
    pub correct_a: usize,
    /// Correct in B.
    pub correct_b: usize,
    /// correct_a / decisions.
    pub accuracy_a: f64,
    /// correct_b / decisions.
    pub accuracy_b: f64,
    /// accuracy_b - accuracy_a.
    pub change: f64,
    /// Right in A, wrong in B.
    pub lost: usize,
    /// Wrong in A, right in B.
    pub gained: usize,
}

/// The comparison as JSON (`--format json`): the same numbers the text shows.
#[derive(Debug, Serialize)]
pub struct JsonReport<'a> {
    /// Run id taken from A.
    pub run_a: &'a str,
    /// Run id taken from B.
    pub run_b: &'a str,
    /// Rows in both.
    pub matched: usize,
    /// Keys only in A.
    pub only_a: usize,
    /// Keys only in B.
    pub only_b: usize,
    /// Decide rows matched.
    pub decisions: usize,
    /// Decide rows agreeing on best.
    pub best_agree: usize,
    /// Largest |Δ choice_logp| (nats).
    pub max_logp_diff: Option<MaxDiff>,
    /// Generate rows matched.
    pub generations: usize,
    /// Generate rows with identical text.
    pub identical_texts: usize,
    /// Largest |Δ ppl|.
    pub max_ppl_diff: Option<MaxDiff>,
    /// Accuracy on the matched decisions that carry an expected answer on both sides.
    pub accuracy: Option<AccuracyChange>,
    /// prefill_s ratio B/A.
    pub prefill_s_ratio: Option<RatioStats>,
    /// Keys of the rows that differ.
    pub differing: &'a [String],
    /// True when every row matched and none differs.
    pub identical: bool,
}

/// The comparison.
#[derive(Debug, Default)]
pub struct Report {
    /// Run ids compared.
    pub runs: (String, String),
    /// Rows present in both.
    pub matched: usize,
    /// Keys only in A / only in B.
    pub only_a: usize,
    /// Keys only in B.
    pub only_b: usize,
    /// Decide rows matched / agreeing on best.
    pub decisions: usize,
    /// Decide rows whose best agrees.
    pub best_agree: usize,
    /// Largest |Δ choice_logp| and where.
    pub max_logp_diff: Option<(f64, String)>,
    /// Generate rows matched / with identical text.
    pub texts: (usize, usize),
    /// Largest |Δ ppl| and where.
    pub max_ppl_diff: Option<(f64, String)>,
    /// Accuracy counts: (decisions with `correct` on both sides, correct in A, correct in B, lost,
    /// gained).
    pub accuracy: (usize, usize, usize, usize, usize),
    /// Prefill-time ratios B/A.
    pub ratios: Vec<f64>,
    /// Keys of the rows that differ.
    pub differing: Vec<String>,
}

impl Report {
    /// True when every matched row is identical and nothing is unmatched.
    pub fn identical(&self) -> bool {
        self.differing.is_empty() && self.only_a == 0 && self.only_b == 0
    }

    /// The ratio spread (nearest-rank quantiles), or `None` without ratios.
    pub fn ratio_stats(&self) -> Option<RatioStats> {
        if self.ratios.is_empty() {
            return None;
        }
        let mut r = self.ratios.clone();
        r.sort_by(|a, b| a.total_cmp(b));
        let q = |p: f64| r[((r.len() - 1) as f64 * p).round() as usize];
        Some(RatioStats {
            rows: r.len(),
            min: q(0.0),
            p10: q(0.1),
            median: q(0.5),
            p90: q(0.9),
            max: q(1.0),
        })
    }

    /// Accuracy of each side and the change, or `None` when no matched row carries `correct`.
    pub fn accuracy(&self) -> Option<AccuracyChange> {
        let (n, a, b, lost, gained) = self.accuracy;
        if n == 0 {
            return None;
        }
        let (accuracy_a, accuracy_b) = (a as f64 / n as f64, b as f64 / n as f64);
        Some(AccuracyChange {
            decisions: n,
            correct_a: a,
            correct_b: b,
            accuracy_a,
            accuracy_b,
            change: accuracy_b - accuracy_a,
            lost,
            gained,
        })
    }

    /// The report as JSON: the numbers of [`Report::render`], unrounded.
    pub fn json(&self) -> JsonReport<'_> {
        let md = |m: &Option<(f64, String)>| {
            m.as_ref().map(|(d, k)| MaxDiff {
                diff: *d,
                key: k.clone(),
            })
        };
        JsonReport {
            run_a: &self.runs.0,
            run_b: &self.runs.1,
            matched: self.matched,
            only_a: self.only_a,
            only_b: self.only_b,
            decisions: self.decisions,
            best_agree: self.best_agree,
            max_logp_diff: md(&self.max_logp_diff),
            generations: self.texts.0,
            identical_texts: self.texts.1,
            max_ppl_diff: md(&self.max_ppl_diff),
            accuracy: self.accuracy(),
            prefill_s_ratio: self.ratio_stats(),
            differing: &self.differing,
            identical: self.identical(),
        }
    }

    /// The report as text.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "runs: A = {}, B = {}", self.runs.0, self.runs.1);
        let _ = writeln!(
            s,
            "rows: {} matched by (job, point, item); {} only in A, {} only in B",
            self.matched, self.only_a, self.only_b
        );
        if self.decisions > 0 {
            let _ = writeln!(
                s,
                "decisions: {}/{} agree on best",
                self.best_agree, self.decisions
            );
            if let Some((d, k)) = &self.max_logp_diff {
                let _ = writeln!(s, "largest choice_logp difference: {d:.6} nats ({k})");
            }
            if let Some(a) = self.accuracy() {
                let _ = writeln!(
                    s,
                    "accuracy over {} decisions with an expected answer: A {}/{} ({:.1}%), B {}/{} ({:.1}%), change {:+.1} points ({} lost, {} gained)",
                    a.decisions,
                    a.correct_a,
                    a.decisions,
                    a.accuracy_a * 100.0,
                    a.correct_b,
                    a.decisions,
                    a.accuracy_b * 100.0,
                    a.change * 100.0,
                    a.lost,
                    a.gained
                );
            }
        }
        if self.texts.0 > 0 {
            let _ = writeln!(
                s,
                "generations: {}/{} identical text",
                self.texts.1, self.texts.0
            );
        }
        if let Some((d, k)) = &self.max_ppl_diff {
            let _ = writeln!(s, "largest perplexity difference: {d:.6} ({k})");
        }
        if let Some(r) = self.ratio_stats() {
            let _ = writeln!(
                s,
                "prefill_s ratio B/A over {} rows: min {:.3}  p10 {:.3}  median {:.3}  p90 {:.3}  max {:.3}",
                r.rows, r.min, r.p10, r.median, r.p90, r.max
            );
        }
        if self.identical() {
            let _ = writeln!(s, "result: all {} rows identical", self.matched);
        } else {
            let shown: Vec<&str> = self.differing.iter().take(10).map(|k| k.as_str()).collect();
            let _ = writeln!(
                s,
                "result: {} rows differ{}{}",
                self.differing.len(),
                if shown.is_empty() {
                    String::new()
                } else {
                    format!(": {}", shown.join(", "))
                },
                if self.differing.len() > shown.len() {
                    ", ..."
                } else {
                    ""
                }
            );
        }
        s
    }
}

/// The rows of one run of a CSV, by key.
fn run_rows(path: &Path, run: Option<&str>) -> anyhow::Result<(String, BTreeMap<String, Row>)> {
    if !path.exists() {
        return Err(anyhow!("{}: no such file", path.display()));
    }
    let e = inspect(path).with_context(|| format!("reading {}", path.display()))?;
    let run_id = match run {
        Some(r) => r.to_string(),
        None => e
            .rows
            .last()
            .map(|r| r.run_id.clone())
            .ok_or_else(|| anyhow!("{}: no rows", path.display()))?,
    };
    let mut out = BTreeMap::new();
    for r in e.rows.into_iter().filter(|r| r.run_id == run_id) {
        // A resumed run may hold a row twice only if edited by hand; the last one wins.
        // Repeats are separate rows; repeat 0 keeps the old key so runs without repeats match.
        let key = match r.repeat {
            0 => format!("{}/{}/{}", r.job, r.point, r.item),
            n => format!("{}/{}/{}#{n}", r.job, r.point, r.item),
        };
        out.insert(key, r);
    }
    if out.is_empty() {
        return Err(anyhow!("{}: no rows of run {run_id}", path.display()));
    }
    Ok((run_id, out))
}

/// Compares two CSVs.
pub fn compare(a: &Path, b: &Path, o: &CompareOptions) -> anyhow::Result<Report> {
    let (ra, rows_a) = run_rows(a, o.run_a.as_deref())?;
    let (rb, rows_b) = run_rows(b, o.run_b.as_deref())?;
    let mut rep = Report {
        runs: (ra, rb),
        ..Report::default()
    };
    rep.only_a = rows_a.keys().filter(|k| !rows_b.contains_key(*k)).count();
    rep.only_b = rows_b.keys().filter(|k| !rows_a.contains_key(*k)).count();
    for (k, x) in &rows_a {
        let Some(y) = rows_b.get(k) else { continue };
        rep.matched += 1;
        let mut same = x.error == y.error;
        if x.kind == "decide" {
            rep.decisions += 1;
            // Only `correct` is compared here: n_reused, n_prefilled, reuse and the prefill times
            // depend on the order the decisions ran in, not on the result.
            if let (Some(ca), Some(cb)) = (x.correct, y.correct) {
                rep.accuracy.0 += 1;
                rep.accuracy.1 += usize::from(ca);
                rep.accuracy.2 += usize::from(cb);
                rep.accuracy.3 += usize::from(ca && !cb);
                rep.accuracy.4 += usize::from(!ca && cb);
            }
            if x.best == y.best {
                rep.best_agree += 1;
            } else {
                same = false;
            }
            let (la, lb) = (&x.choice_logp.0, &y.choice_logp.0);
            if la.len() != lb.len() {
                same = false;
            }
            for (p, q) in la.iter().zip(lb) {
                let d = if p == q { 0.0 } else { (p - q).abs() };
                if d > o.tolerance || d.is_nan() {
                    same = false;
                }
                if rep.max_logp_diff.as_ref().map(|m| d > m.0).unwrap_or(true) {
                    rep.max_logp_diff = Some((d, k.clone()));
                }
            }
        }
        if x.kind == "generate" {
            rep.texts.0 += 1;
            if x.text == y.text {
                rep.texts.1 += 1;
            } else {
                same = false;
            }
        }
        if let (Some(p), Some(q)) = (x.ppl, y.ppl) {
            let d = (p - q).abs();
            if d > o.tolerance {
                same = false;
            }
            if rep.max_ppl_diff.as_ref().map(|m| d > m.0).unwrap_or(true) {
                rep.max_ppl_diff = Some((d, k.clone()));
            }
        }
        if x.prefill_s > 0.0 && y.prefill_s > 0.0 {
            rep.ratios.push(y.prefill_s / x.prefill_s);
        }
        if !same {
            rep.differing.push(k.clone());
        }
    }
    Ok(rep)
}
