//! The comparison as text (for people and CI logs) and as JSON (`--format json`, the same numbers,
//! unrounded).
use std::fmt::Write as _;

use serde::Serialize;

use super::input::{capped, Key};
use super::{AccuracyChange, Change, Gates, GroupStats, Metric, RatioStats, Report, Verdict};

/// A largest difference and the row key where it was found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MaxDiff {
    /// The absolute difference.
    pub diff: f64,
    /// `job/point/item`.
    pub key: String,
}

/// The comparison as JSON (`--format json`): the same numbers the text shows.
#[derive(Debug, Serialize)]
pub struct JsonReport<'a> {
    /// same (exit 0), differ (exit 1), nothing_in_common (exit 2).
    pub verdict: Verdict,
    /// Why nothing could be compared, when the verdict is nothing_in_common.
    pub nothing_in_common: Option<String>,
    /// Run id taken from A.
    pub run_a: &'a str,
    /// Run id taken from B.
    pub run_b: &'a str,
    /// Rows in both.
    pub matched: usize,
    /// Keys only in A (count).
    pub only_a: usize,
    /// Keys only in B (count).
    pub only_b: usize,
    /// Keys only in A (`job/point/item`).
    pub only_a_keys: Vec<String>,
    /// Keys only in B.
    pub only_b_keys: Vec<String>,
    /// Settings, commit, model or host that differ between the runs.
    pub changed: &'a [Change],
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
    /// Each measured time (prefill_s, decode_s_per_token): ratios, the median's 95% `interval`,
    /// `verdict` (faster, same, slower, inconclusive), `gate_tripped` and timing `warnings`.
    pub speed: &'a [Metric],
    /// `--max-slowdown`: a metric fails when its median ratio's 95% interval lies wholly above it.
    pub max_slowdown: Option<f64>,
    /// Keys of the rows that differ.
    pub differing: Vec<String>,
    /// True when every row matched and none differs (speed aside: see `verdict`).
    pub identical: bool,
    /// Per (job, profile, point): accuracy with the paired change's 95% interval, McNemar's p,
    /// flipped items, log-prob drift, speed ratios, and the gates crossed.
    pub groups: &'a [GroupStats],
    /// `--fail-on-regression`'s thresholds, when given.
    pub gates: Option<Gates>,
    /// What reading the files noticed (also on stderr).
    pub warnings: &'a [String],
}

impl Report {
    /// The report as JSON: the numbers of [`Report::render`], unrounded.
    pub fn json(&self) -> JsonReport<'_> {
        let md = |m: &Option<(f64, Key)>| {
            m.as_ref().map(|(d, k)| MaxDiff {
                diff: *d,
                key: k.full(),
            })
        };
        let keys = |v: &[Key]| v.iter().map(Key::full).collect();
        JsonReport {
            verdict: self.verdict(),
            nothing_in_common: self.nothing_in_common(),
            run_a: &self.runs.0,
            run_b: &self.runs.1,
            matched: self.matched,
            only_a: self.only_a.len(),
            only_b: self.only_b.len(),
            only_a_keys: keys(&self.only_a),
            only_b_keys: keys(&self.only_b),
            changed: &self.changed,
            decisions: self.outcomes.decisions,
            best_agree: self.outcomes.best_agree,
            max_logp_diff: md(&self.outcomes.max_logp_diff),
            generations: self.outcomes.texts.0,
            identical_texts: self.outcomes.texts.1,
            max_ppl_diff: md(&self.outcomes.max_ppl_diff),
            accuracy: self.accuracy(),
            prefill_s_ratio: RatioStats::of(&self.prefill.ratios),
            speed: self.speed(),
            max_slowdown: self.max_slowdown,
            differing: keys(&self.differing),
            identical: self.identical(),
            groups: self.group_stats(),
            gates: self.gates,
            warnings: &self.warnings,
        }
    }

    /// The report as text.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "runs: A = {}, B = {}", self.runs.0, self.runs.1);
        let _ = writeln!(
            s,
            "rows: {} matched by (job, profile, point, item, repeat); {} only in A, {} only in B",
            self.matched,
            self.only_a.len(),
            self.only_b.len()
        );
        self.render_changed(&mut s);
        self.render_outcomes(&mut s);
        for m in self.speed() {
            let _ = writeln!(s, "{}", m.render());
        }
        self.render_groups(&mut s);
        let _ = writeln!(s, "result: {}", self.result_line());
        s
    }

    /// The "what changed" block.
    fn render_changed(&self, s: &mut String) {
        if self.changed.is_empty() {
            let _ = writeln!(
                s,
                "what changed: nothing (settings, commit, model and host agree)"
            );
            return;
        }
        let _ = writeln!(s, "what changed (A -> B):");
        for c in &self.changed {
            let _ = writeln!(s, "  {}", c.render());
        }
    }

    /// Decisions, accuracy, generations, perplexity.
    fn render_outcomes(&self, s: &mut String) {
        if self.outcomes.decisions > 0 {
            let _ = writeln!(
                s,
                "decisions: {}/{} agree on best",
                self.outcomes.best_agree, self.outcomes.decisions
            );
            if let Some((d, k)) = &self.outcomes.max_logp_diff {
                let _ = writeln!(
                    s,
                    "largest choice_logp difference: {d:.6} nats ({})",
                    self.name(k)
                );
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
        if self.outcomes.texts.0 > 0 {
            let _ = writeln!(
                s,
                "generations: {}/{} identical text",
                self.outcomes.texts.1, self.outcomes.texts.0
            );
        }
        if let Some((d, k)) = &self.outcomes.max_ppl_diff {
            let _ = writeln!(
                s,
                "largest perplexity difference: {d:.6} ({})",
                self.name(k)
            );
        }
    }

    /// The statistics per (job, profile, point).
    fn render_groups(&self, s: &mut String) {
        let groups = self.group_stats();
        if groups.is_empty() {
            return;
        }
        let _ = writeln!(s, "per (job, profile, point):");
        for g in groups {
            g.render(s);
        }
    }

    /// What the exit status says, in words: each reason it is not 0.
    fn result_line(&self) -> String {
        if let Some(why) = self.nothing_in_common() {
            return format!("nothing in common: {why}");
        }
        if self.gates.is_some() {
            let crossed: Vec<String> = self
                .group_stats()
                .iter()
                .flat_map(|g| {
                    g.regressions
                        .iter()
                        .map(move |r| format!("{}: {r}", g.name()))
                })
                .collect();
            return if crossed.is_empty() {
                "no regression (--fail-on-regression)".into()
            } else {
                format!("regression: {}", crossed.join("; "))
            };
        }
        let mut parts = Vec::new();
        let rows = |n: usize| format!("{n} row{}", if n == 1 { "" } else { "s" });
        if !self.differing.is_empty() {
            let n = self.differing.len();
            let verb = if n == 1 { "differs" } else { "differ" };
            parts.push(format!(
                "{} {verb}: {}",
                rows(n),
                self.names(&self.differing)
            ));
        }
        for (side, keys) in [("A", &self.only_a), ("B", &self.only_b)] {
            if !keys.is_empty() {
                parts.push(format!(
                    "{} only in {side} ({})",
                    rows(keys.len()),
                    self.names(keys)
                ));
            }
        }
        for m in self.speed().iter().filter(|m| m.gate_tripped) {
            parts.push(format!(
                "--max-slowdown {} tripped: {} median ratio B/A {:.3}, 95% interval [{:.3}, {:.3}] wholly above it",
                self.max_slowdown.unwrap_or_default(),
                m.name,
                m.interval.median,
                m.interval.low,
                m.interval.high
            ));
        }
        if parts.is_empty() {
            return format!("all {} identical", rows(self.matched));
        }
        parts.join("; ")
    }

    /// A key without the parts all compared rows share (one job, one sweep point).
    fn name(&self, k: &Key) -> String {
        k.named(self.naming.0, self.naming.1)
    }

    /// `mail-1, maps-2 and 3 more`.
    fn names(&self, keys: &[Key]) -> String {
        capped(&keys.iter().map(|k| self.name(k)).collect::<Vec<_>>())
    }
}
