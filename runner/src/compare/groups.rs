//! Statistics per (job, profile, point): accuracy of each side with the paired change and its 95%
//! interval, McNemar's exact p, the items that flipped each way, the log-prob drift, the speed
//! ratios with their median's 95% interval, and the `--fail-on-regression` gates judged on the
//! intervals: a gate trips only where the whole interval is past its threshold.
use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::input::{capped, Key};
use super::speed::{gate_trips, ratio_interval};
use super::stats::{mcnemar_exact, paired_bootstrap, Drift, MedianInterval, PairedChange, METHOD};
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
    /// Largest accuracy drop A -> B allowed, in percentage points: the gate trips when the whole
    /// 95% interval of the change lies below minus this.
    pub max_accuracy_drop: f64,
    /// Smallest share of decisions agreeing on best.
    pub min_agreement: f64,
    /// Largest median time ratio B/A (prefill, decode per token): the gate trips when the whole
    /// 95% interval of the median lies above it; `None`: speed not gated.
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
    /// The same median with its 95% interval (as the totals' `speed`: bootstrap over rows, or the
    /// whole range of too spread ratios).
    pub prefill_ratio_interval: Option<MedianInterval>,
    /// Median decode time per token ratio B/A.
    pub decode_ratio: Option<f64>,
    /// The same median with its 95% interval.
    pub decode_ratio_interval: Option<MedianInterval>,
    /// The gates this group crossed, in words (empty without `--fail-on-regression`).
    pub regressions: Vec<String>,
    /// The gates whose point estimate crosses but whose 95% interval does not (not a regression:
    /// more items or repeats would tell), in words.
    pub inconclusive: Vec<String>,
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
            prefill_ratio: None,
            prefill_ratio_interval: ratio_interval(&self.prefill).map(|i| i.0),
            decode_ratio: None,
            decode_ratio_interval: ratio_interval(&self.decode).map(|i| i.0),
            regressions: Vec::new(),
            inconclusive: Vec::new(),
        };
        s.prefill_ratio = s.prefill_ratio_interval.map(|i| i.median);
        s.decode_ratio = s.decode_ratio_interval.map(|i| i.median);
        if let Some(g) = gates {
            (s.regressions, s.inconclusive) = s.judge(g);
        }
        s
    }
}

impl GroupStats {
    /// The gates crossed, each in words, and those only the point estimate crosses.
    fn judge(&self, g: &Gates) -> (Vec<String>, Vec<String>) {
        let (mut out, mut unsure) = (Vec::new(), Vec::new());
        if let Some(c) = &self.change {
            judge_accuracy(c, g.max_accuracy_drop, &mut out, &mut unsure);
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
            for (name, iv) in [
                ("prefill_s", self.prefill_ratio_interval),
                ("decode", self.decode_ratio_interval),
            ] {
                let Some(i) = iv else { continue };
                if gate_trips(&i, x) {
                    out.push(format!(
                        "{name} median ratio B/A {:.3}, 95% interval [{:.3}, {:.3}] wholly above --max-slowdown {x}",
                        i.median, i.low, i.high
                    ));
                } else if i.median > x {
                    unsure.push(format!(
                        "{name} median ratio B/A {:.3} is above --max-slowdown {x}, but its 95% interval [{:.3}, {:.3}] is not: not a regression (more rows or --repeat N would tell)",
                        i.median, i.low, i.high
                    ));
                }
            }
        }
        (out, unsure)
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
        let ratio = |r: Option<MedianInterval>| {
            r.map_or("-".to_string(), |i| {
                format!("{:.3} [{:.3}, {:.3}]", i.median, i.low, i.high)
            })
        };
        if self.prefill_ratio.is_some() || self.decode_ratio.is_some() {
            let _ = writeln!(
                s,
                "    speed, median time ratio B/A [95% interval]: prefill {}, decode per token {}",
                ratio(self.prefill_ratio_interval),
                ratio(self.decode_ratio_interval)
            );
        }
        for r in &self.regressions {
            let _ = writeln!(s, "    REGRESSION: {r}");
        }
        for r in &self.inconclusive {
            let _ = writeln!(s, "    inconclusive: {r}");
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

/// The accuracy gate: a regression when the whole 95% interval of the change is below
/// -`max_drop` points, so one flipped decision of eight (interval [-37.5, +0.0]) is not one; a
/// point drop past the threshold whose interval reaches above it is only inconclusive.
fn judge_accuracy(
    c: &PairedChange,
    max_drop: f64,
    out: &mut Vec<String>,
    unsure: &mut Vec<String>,
) {
    let (drop, lo, hi) = (-c.change * 100.0, c.low * 100.0, c.high * 100.0);
    if -hi > max_drop {
        out.push(format!(
            "accuracy fell {drop:.1} points, 95% interval [{lo:+.1}, {hi:+.1}] wholly below -{max_drop} (more than --max-accuracy-drop {max_drop})"
        ));
    } else if drop > max_drop {
        unsure.push(format!(
            "accuracy fell {drop:.1} points, but its 95% interval [{lo:+.1}, {hi:+.1}] reaches above -{max_drop}: not a regression by --max-accuracy-drop {max_drop} (more items would tell)"
        ));
    }
}

/// Every group's statistics, in (job, profile, point) order.
pub fn all(groups: &BTreeMap<GroupKey, GroupData>, gates: Option<&Gates>) -> Vec<GroupStats> {
    groups.iter().map(|(k, d)| d.stats(k, gates)).collect()
}
