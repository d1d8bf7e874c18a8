//! Statistics per (job, profile, point): accuracy of each side with the paired change and its 95%
//! interval, McNemar's exact p, the items that flipped each way, the log-prob drift, the speed
//! ratios, and the `--fail-on-regression` gates judged on them.
use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::input::{capped, Key};
use super::stats::{mcnemar_exact, paired_bootstrap, Drift, PairedChange, METHOD};
use crate::sink::row::Row;

/// Default `--max-accuracy-drop` under `--fail-on-regression`: percentage points.
pub const DEFAULT_MAX_ACCURACY_DROP: f64 = 1.0;
/// Default `--min-agreement` under `--fail-on-regression`: share of decisions agreeing on best.
pub const DEFAULT_MIN_AGREEMENT: f64 = 0.95;

/// (job, profile, point).
pub type GroupKey = (String, String, String);

/// What one group's matched rows hold, as collected.
#[derive(Debug, Default, Clone)]
pub struct GroupData {
    /// Decide rows matched.
    pub decisions: usize,
    /// Of them, agreeing on best.
    pub agree: usize,
    /// (key, correct in A, correct in B) of the decisions carrying `correct` on both sides.
    pub pairs: Vec<(Key, bool, bool)>,
    /// |Δ choice_logp| of every matched choice.
    pub drift: Vec<f64>,
    /// prefill_s ratios B/A.
    pub prefill: Vec<f64>,
    /// Decode time per token ratios B/A.
    pub decode: Vec<f64>,
}

/// The thresholds `--fail-on-regression` judges each group by.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Gates {
    /// Largest accuracy drop A -> B allowed, in percentage points.
    pub max_accuracy_drop: f64,
    /// Smallest share of decisions agreeing on best.
    pub min_agreement: f64,
    /// Largest median time ratio B/A (prefill, decode per token); `None`: speed not gated.
    pub max_slowdown: Option<f64>,
}

/// One group's statistics.
#[derive(Debug, Clone, Serialize)]
pub struct GroupStats {
    /// Job name.
    pub job: String,
    /// Profile name.
    pub profile: String,
    /// Sweep point.
    pub point: String,
    /// Decide rows matched.
    pub decisions: usize,
    /// Share of them agreeing on best.
    pub agreement: Option<f64>,
    /// Decisions with `correct` on both sides.
    pub scored: usize,
    /// Accuracy of A.
    pub accuracy_a: Option<f64>,
    /// Accuracy of B.
    pub accuracy_b: Option<f64>,
    /// B - A with its 95% interval.
    pub change: Option<PairedChange>,
    /// How the interval was computed.
    pub interval_method: &'static str,
    /// McNemar's exact two-sided p on the flips.
    pub mcnemar_p: Option<f64>,
    /// Items right in A, wrong in B.
    pub right_to_wrong: Vec<String>,
    /// Items wrong in A, right in B.
    pub wrong_to_right: Vec<String>,
    /// |Δ choice_logp| quantiles.
    pub logp_drift: Option<Drift>,
    /// Median prefill_s ratio B/A.
    pub prefill_ratio: Option<f64>,
    /// Median decode time per token ratio B/A.
    pub decode_ratio: Option<f64>,
    /// The gates this group crossed, in words (empty without `--fail-on-regression`).
    pub regressions: Vec<String>,
}

impl GroupData {
    /// Adds a matched pair's decision data.
    pub fn add_decision(&mut self, k: &Key, x: &Row, y: &Row) {
        self.decisions += 1;
        self.agree += usize::from(x.best == y.best);
        if let (Some(a), Some(b)) = (x.correct, y.correct) {
            self.pairs.push((k.clone(), a, b));
        }
        for (p, q) in x.choice_logp.0.iter().zip(&y.choice_logp.0) {
            self.drift.push(if p == q { 0.0 } else { (p - q).abs() });
        }
    }

    /// The statistics, judged by `gates` when given.
    pub fn stats(&self, key: &GroupKey, gates: Option<&Gates>) -> GroupStats {
        let n = self.pairs.len();
        let share = |c: usize| (n > 0).then(|| c as f64 / n as f64);
        let diffs: Vec<f64> = self
            .pairs
            .iter()
            .map(|&(_, a, b)| f64::from(u8::from(b)) - f64::from(u8::from(a)))
            .collect();
        let flips = |want: (bool, bool)| -> Vec<String> {
            let hit = self.pairs.iter().filter(|(_, a, b)| (*a, *b) == want);
            hit.map(|(k, _, _)| k.named(false, false)).collect()
        };
        let (lost, gained) = (flips((true, false)), flips((false, true)));
        let mut s = GroupStats {
            job: key.0.clone(),
            profile: key.1.clone(),
            point: key.2.clone(),
            decisions: self.decisions,
            agreement: (self.decisions > 0).then(|| self.agree as f64 / self.decisions as f64),
            scored: n,
            accuracy_a: share(self.pairs.iter().filter(|p| p.1).count()),
            accuracy_b: share(self.pairs.iter().filter(|p| p.2).count()),
            change: paired_bootstrap(&diffs),
            interval_method: METHOD,
            mcnemar_p: (n > 0).then(|| mcnemar_exact(lost.len(), gained.len())),
            right_to_wrong: lost,
            wrong_to_right: gained,
            logp_drift: Drift::of(&self.drift),
            prefill_ratio: Drift::of(&self.prefill).map(|d| d.p50),
            decode_ratio: Drift::of(&self.decode).map(|d| d.p50),
            regressions: Vec::new(),
        };
        if let Some(g) = gates {
            s.regressions = s.judge(g);
        }
        s
    }
}

impl GroupStats {
    /// The gates crossed, each in words.
    fn judge(&self, g: &Gates) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(c) = &self.change {
            if -c.change * 100.0 > g.max_accuracy_drop {
                out.push(format!(
                    "accuracy fell {:.1} points (more than --max-accuracy-drop {})",
                    -c.change * 100.0,
                    g.max_accuracy_drop
                ));
            }
        }
        if let Some(a) = self.agreement {
            if a < g.min_agreement {
                out.push(format!(
                    "agreement on best {:.3} (below --min-agreement {})",
                    a, g.min_agreement
                ));
            }
        }
        if let Some(x) = g.max_slowdown {
            for (name, r) in [
                ("prefill_s", self.prefill_ratio),
                ("decode", self.decode_ratio),
            ] {
                if let Some(r) = r.filter(|&r| r > x) {
                    out.push(format!(
                        "{name} median ratio B/A {r:.3} (above --max-slowdown {x})"
                    ));
                }
            }
        }
        out
    }

    /// `job/profile/point`.
    pub fn name(&self) -> String {
        format!("{}/{}/{}", self.job, self.profile, self.point)
    }

    /// The group as text lines.
    pub fn render(&self, s: &mut String) {
        let _ = writeln!(s, "  {}:", self.name());
        if let Some(a) = self.agreement {
            let _ = writeln!(
                s,
                "    agreement on best: {:.1}% of {} decisions",
                a * 100.0,
                self.decisions
            );
        }
        self.render_accuracy(s);
        if let Some(d) = &self.logp_drift {
            let _ = writeln!(
                s,
                "    |Δ choice_logp| over {} choices: p50 {:.3e}  p90 {:.3e}  p99 {:.3e}  max {:.3e}",
                d.n, d.p50, d.p90, d.p99, d.max
            );
        }
        let ratio = |r: Option<f64>| r.map_or("-".to_string(), |r| format!("{r:.3}"));
        if self.prefill_ratio.is_some() || self.decode_ratio.is_some() {
            let _ = writeln!(
                s,
                "    speed, median time ratio B/A: prefill {}, decode per token {}",
                ratio(self.prefill_ratio),
                ratio(self.decode_ratio)
            );
        }
        for r in &self.regressions {
            let _ = writeln!(s, "    REGRESSION: {r}");
        }
    }

    /// Accuracy, change, interval, p and flips.
    fn render_accuracy(&self, s: &mut String) {
        let (Some(a), Some(b), Some(c)) = (self.accuracy_a, self.accuracy_b, &self.change) else {
            return;
        };
        let _ = writeln!(
            s,
            "    accuracy over {} decisions: A {:.1}%, B {:.1}%, change {:+.1} points, 95% interval [{:+.1}, {:+.1}] ({}); McNemar exact p = {:.3}",
            self.scored,
            a * 100.0,
            b * 100.0,
            c.change * 100.0,
            c.low * 100.0,
            c.high * 100.0,
            self.interval_method,
            self.mcnemar_p.unwrap_or(1.0)
        );
        for (what, items) in [
            ("right->wrong", &self.right_to_wrong),
            ("wrong->right", &self.wrong_to_right),
        ] {
            // At most ten names, as every list in compare's text; JSON carries them all.
            let list = if items.is_empty() {
                "none".to_string()
            } else {
                capped(items)
            };
            let _ = writeln!(s, "    {what} ({}): {list}", items.len());
        }
    }
}

/// Every group's statistics, in (job, profile, point) order.
pub fn all(groups: &BTreeMap<GroupKey, GroupData>, gates: Option<&Gates>) -> Vec<GroupStats> {
    groups.iter().map(|(k, d)| d.stats(k, gates)).collect()
}
