//! `bmoe compare A.csv B.csv`: rows matched by their key within a run (job, profile, sweep point,
//! item id, repeat; the profile left out when each side ran on one) between one run of each file; agreement on `best`, the largest `choice_logp` difference, generated text, perplexity,
//! what changed between the runs (settings, commit, model, host), and the time ratios B/A with the
//! median's 95% interval, a verdict and an optional gate on the interval. Files are read by column name, so a CSV from an older build
//! compares with a newer one (columns it lacks read as empty).
mod changed;
pub mod groups;
pub mod input;
mod render;
pub mod speed;
pub mod stats;

use std::cell::OnceCell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::Serialize;

pub use changed::Change;
pub use groups::{Gates, GroupStats};
pub use input::Key;
pub use speed::{Metric, RatioStats, Timings};

use crate::sink::row::Row;
use input::Side;

/// What to compare.
#[derive(Debug, Clone, Default)]
pub struct CompareOptions {
    /// Run id to take from A (default: its last run).
    pub run_a: Option<String>,
    /// Run id to take from B (default: its last run).
    pub run_b: Option<String>,
    /// Largest |choice_logp| or |ppl| difference still called identical.
    pub tolerance: f64,
    /// `--max-slowdown`: the median time ratio B/A whose 95% interval must lie wholly above it to
    /// fail; `None`: no gate.
    pub max_slowdown: Option<f64>,
    /// `--fail-on-regression`'s thresholds: with them the exit status says only whether a group
    /// crossed one.
    pub gates: Option<Gates>,
}

/// The outcome, as the exit status says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Every row matched and agrees, no speed gate tripped (exit 0).
    Same,
    /// A row differs or is unmatched, or a speed gate tripped (exit 1).
    Differ,
    /// No row matches: another job, or no common item (exit 2).
    NothingInCommon,
    /// `--fail-on-regression`: no group crossed a threshold (exit 0), whatever else differs.
    NoRegression,
    /// `--fail-on-regression`: a group crossed a threshold (exit 1).
    Regression,
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

/// What the matched rows' results say, A against B.
#[derive(Debug, Default)]
pub struct Outcomes {
    /// Decide rows matched.
    pub decisions: usize,
    /// Decide rows whose best agrees.
    pub best_agree: usize,
    /// Largest |Δ choice_logp| and where.
    pub max_logp_diff: Option<(f64, Key)>,
    /// Generate rows matched / with identical text.
    pub texts: (usize, usize),
    /// Largest |Δ ppl| and where.
    pub max_ppl_diff: Option<(f64, Key)>,
    /// Accuracy counts: (decisions with `correct` on both sides, correct in A, correct in B, lost,
    /// gained).
    pub accuracy: (usize, usize, usize, usize, usize),
}

/// The comparison.
#[derive(Debug, Default)]
pub struct Report {
    /// Run ids compared.
    pub runs: (String, String),
    /// The jobs each run holds.
    pub jobs: (BTreeSet<String>, BTreeSet<String>),
    /// Rows present in both.
    pub matched: usize,
    /// Keys only in A.
    pub only_a: Vec<Key>,
    /// Keys only in B.
    pub only_b: Vec<Key>,
    /// What the matched rows' results say: decisions, texts, perplexities, accuracy.
    pub outcomes: Outcomes,
    /// Prefill times of the matched rows and their ratios B/A.
    pub prefill: Timings,
    /// Decode times, and ratios B/A of decode time per generated token.
    pub decode: Timings,
    /// Keys of the matched rows that differ.
    pub differing: Vec<Key>,
    /// Settings, commit, model or host that differ between the runs.
    pub changed: Vec<Change>,
    /// The `--max-slowdown` gate, if any.
    pub max_slowdown: Option<f64>,
    /// What reading the files noticed (torn rows, duplicate keys), for stderr.
    pub warnings: Vec<String>,
    /// Whether row names in the text show (job, point): not when all rows share one.
    pub naming: (bool, bool),
    /// The matched rows' data per (job, profile, point), for the statistics.
    pub groups: BTreeMap<groups::GroupKey, groups::GroupData>,
    /// `--fail-on-regression`'s thresholds.
    pub gates: Option<Gates>,
    /// [`Report::speed`], computed once: its bootstrap is the costly part of a large comparison.
    speed_once: OnceCell<Vec<Metric>>,
    /// [`Report::group_stats`], computed once.
    groups_once: OnceCell<Vec<GroupStats>>,
    /// Matched pairs that are one row (every cell equal, run id and write time included): the
    /// same run read twice.
    pub same_rows: usize,
}

impl Report {
    /// True when every matched row is identical and nothing is unmatched (speed aside).
    pub fn identical(&self) -> bool {
        self.differing.is_empty() && self.only_a.is_empty() && self.only_b.is_empty()
    }

    /// Whether A and B are the same run (one file twice, or a whole copy): every row matched,
    /// and every matched pair is one row, so nothing was compared.
    pub fn same_run(&self) -> bool {
        self.matched > 0
            && self.same_rows == self.matched
            && self.only_a.is_empty()
            && self.only_b.is_empty()
    }

    /// Why nothing can be compared (no row matched), or `None`.
    pub fn nothing_in_common(&self) -> Option<String> {
        if self.matched > 0 {
            return None;
        }
        let jobs = |j: &BTreeSet<String>| {
            input::list("job", "jobs", &j.iter().cloned().collect::<Vec<_>>())
        };
        Some(if self.jobs.0 != self.jobs.1 {
            format!(
                "A holds {}, B holds {}",
                jobs(&self.jobs.0),
                jobs(&self.jobs.1)
            )
        } else {
            format!(
                "A and B both hold {}, but no (point, item) of one is in the other",
                jobs(&self.jobs.0)
            )
        })
    }

    /// The time metrics measured on both sides, judged and gated (computed on the first call).
    pub fn speed(&self) -> &[Metric] {
        self.speed_once
            .get_or_init(|| speed::metrics(&self.prefill, &self.decode, self.max_slowdown))
    }

    /// The statistics per (job, profile, point), judged by the gates when given (computed on the
    /// first call).
    pub fn group_stats(&self) -> &[GroupStats] {
        self.groups_once
            .get_or_init(|| groups::all(&self.groups, self.gates.as_ref()))
    }

    /// Same, differ, or nothing in common; under `--fail-on-regression`, regression or not.
    pub fn verdict(&self) -> Verdict {
        if self.nothing_in_common().is_some() {
            Verdict::NothingInCommon
        } else if self.gates.is_some() {
            if self.group_stats().iter().any(|g| !g.regressions.is_empty()) {
                Verdict::Regression
            } else {
                Verdict::NoRegression
            }
        } else if !self.identical() || self.speed().iter().any(|m| m.gate_tripped) {
            Verdict::Differ
        } else {
            Verdict::Same
        }
    }

    /// Accuracy of each side and the change, or `None` when no matched row carries `correct`.
    pub fn accuracy(&self) -> Option<AccuracyChange> {
        let (n, a, b, lost, gained) = self.outcomes.accuracy;
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
}

/// Compares two CSVs.
pub fn compare(a: &Path, b: &Path, o: &CompareOptions) -> anyhow::Result<Report> {
    let sa = input::load(a, o.run_a.as_deref())?;
    let sb = input::load(b, o.run_b.as_deref())?;
    let (sa, sb) = input::pair_keys(sa, sb);
    let jobs = |s: &Side| s.rows.keys().map(|k| k.job.clone()).collect();
    let mut rep = Report {
        runs: (sa.run.clone(), sb.run.clone()),
        jobs: (jobs(&sa), jobs(&sb)),
        changed: changed::changes(sa.rows.values(), sb.rows.values()),
        max_slowdown: o.max_slowdown,
        gates: o.gates,
        ..Report::default()
    };
    rep.warnings = [sa.warnings.clone(), sb.warnings.clone()].concat();
    let distinct = |f: fn(&Key) -> &String| {
        let all = sa.rows.keys().chain(sb.rows.keys()).map(f);
        all.collect::<BTreeSet<_>>().len() > 1
    };
    rep.naming = (distinct(|k| &k.job), distinct(|k| &k.point));
    rep.only_a = sa
        .rows
        .keys()
        .filter(|k| !sb.rows.contains_key(*k))
        .cloned()
        .collect();
    rep.only_b = sb
        .rows
        .keys()
        .filter(|k| !sa.rows.contains_key(*k))
        .cloned()
        .collect();
    for (k, x) in &sa.rows {
        if let Some(y) = sb.rows.get(k) {
            compare_row(&mut rep, k, x, y, o.tolerance);
        }
    }
    Ok(rep)
}

/// Adds one matched pair to the report.
fn compare_row(rep: &mut Report, k: &Key, x: &Row, y: &Row, tolerance: f64) {
    rep.matched += 1;
    // Every cell equal, run id and write time included: the same row, read twice.
    if x == y {
        rep.same_rows += 1;
    }
    let mut same = x.error == y.error;
    if x.kind == "decide" {
        rep.groups
            .entry(group_of(x))
            .or_default()
            .add_decision(k, x, y);
        same &= compare_decision(rep, k, x, y, tolerance);
    }
    if x.kind == "generate" {
        rep.outcomes.texts.0 += 1;
        if x.text == y.text {
            rep.outcomes.texts.1 += 1;
        } else {
            same = false;
        }
    }
    if let (Some(p), Some(q)) = (x.ppl, y.ppl) {
        let d = (p - q).abs();
        if d > tolerance {
            same = false;
        }
        if rep
            .outcomes
            .max_ppl_diff
            .as_ref()
            .map(|m| d > m.0)
            .unwrap_or(true)
        {
            rep.outcomes.max_ppl_diff = Some((d, k.clone()));
        }
    }
    let g = rep.groups.entry(group_of(x)).or_default();
    if x.prefill_s > 0.0 && y.prefill_s > 0.0 {
        rep.prefill
            .push(x.prefill_s, y.prefill_s, y.prefill_s / x.prefill_s);
        g.prefill.push(y.prefill_s / x.prefill_s);
    }
    // Per token: two runs whose texts differ in length still compare their decode speed.
    if x.decode_s > 0.0 && y.decode_s > 0.0 && x.tokens > 0 && y.tokens > 0 {
        let per = |r: &Row| r.decode_s / f64::from(r.tokens);
        rep.decode.push(x.decode_s, y.decode_s, per(y) / per(x));
        g.decode.push(per(y) / per(x));
    }
    if !same {
        rep.differing.push(k.clone());
    }
}

/// A row's (job, profile, point).
fn group_of(r: &Row) -> groups::GroupKey {
    (r.job.clone(), r.profile.clone(), r.point.clone())
}

/// Adds a matched decision; false when it differs.
fn compare_decision(rep: &mut Report, k: &Key, x: &Row, y: &Row, tolerance: f64) -> bool {
    rep.outcomes.decisions += 1;
    let mut same = true;
    // Only `correct` is compared here: n_reused, n_prefilled, reuse and the prefill times
    // depend on the order the decisions ran in, not on the result.
    if let (Some(ca), Some(cb)) = (x.correct, y.correct) {
        rep.outcomes.accuracy.0 += 1;
        rep.outcomes.accuracy.1 += usize::from(ca);
        rep.outcomes.accuracy.2 += usize::from(cb);
        rep.outcomes.accuracy.3 += usize::from(ca && !cb);
        rep.outcomes.accuracy.4 += usize::from(!ca && cb);
    }
    if x.best == y.best {
        rep.outcomes.best_agree += 1;
    } else {
        same = false;
    }
    let (la, lb) = (&x.choice_logp.0, &y.choice_logp.0);
    if la.len() != lb.len() {
        same = false;
    }
    for (p, q) in la.iter().zip(lb) {
        let d = if p == q { 0.0 } else { (p - q).abs() };
        if d > tolerance || d.is_nan() {
            same = false;
        }
        if rep
            .outcomes
            .max_logp_diff
            .as_ref()
            .map(|m| d > m.0)
            .unwrap_or(true)
        {
            rep.outcomes.max_logp_diff = Some((d, k.clone()));
        }
    }
    same
}
