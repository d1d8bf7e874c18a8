//! Speed between two runs: time ratios B/A per matched row, their spread, the median ratio with a
//! bootstrap 95% interval, a verdict only where the interval clears a noise band, the
//! `--max-slowdown` gate on the interval's lower bound, and warnings about timings too short or
//! too spread to judge.
//!
//! Why the median of paired ratios: a matched row is the same item on both sides, so its ratio
//! B/A cancels what the item itself costs (a 10-token and a 1000-token prompt), which a ratio of
//! the two sides' medians would carry into its spread. The median, not the mean: one row stalled
//! by a page-cache miss or another process moves a mean of ratios as far as it likes and a median
//! hardly at all. Its interval resamples rows, each pair kept together (a paired bootstrap, as the
//! accuracy interval). Rows see only the noise within a run; a shift every row of one run shares
//! (thermal state, a night of other load) is what [`NOISE_BAND`] is for, and a load that came and
//! went while a run ran is what the range fallback of [`ratio_interval`] is for.
use serde::Serialize;

use super::stats::{median, MedianInterval};

/// A median time ratio whose interval lies within 1 ± this is "same": run-to-run noise on one
/// machine (thermal state, page cache, other load) moves medians by a few percent, and resampling
/// the rows of one run does not see it.
pub const NOISE_BAND: f64 = 0.05;

/// Rows below which no verdict is given and no gate trips: one row has no spread to judge by.
pub const MIN_ROWS: usize = 2;

/// A median time per row below this (seconds) is warned about: under 5 ms timer resolution and
/// scheduling dominate (hyperfine warns at the same bound).
pub const SHORT_S: f64 = 0.005;

/// A ratio spread p90/p10 above this is warned about, and the interval becomes the whole range:
/// the middle 80% of rows disagree by a factor of two on one and the same comparison.
pub const NOISY_SPREAD: f64 = 2.0;

/// How the speed interval is computed, as the output names it.
pub const METHOD: &str = "bootstrap of the median over rows (pairs kept together), 2000 resamples, SplitMix64 seed 20250933, percentile 95%";

/// How it is computed when the ratios spread too far for the bootstrap.
pub const RANGE_METHOD: &str =
    "the ratios' whole range: p90/p10 is over 2x, too spread for the bootstrap over rows";

/// One time measured on both sides of the matched rows.
#[derive(Debug, Clone, Default)]
pub struct Timings {
    /// Per matched row, B's time over A's.
    pub ratios: Vec<f64>,
    /// A's time per row, seconds (for the short-timing warning).
    pub a: Vec<f64>,
    /// B's time per row, seconds.
    pub b: Vec<f64>,
}

impl Timings {
    /// Adds one matched row: the two times as measured, and the ratio compared (which may be per
    /// token).
    pub fn push(&mut self, a: f64, b: f64, ratio: f64) {
        self.a.push(a);
        self.b.push(b);
        self.ratios.push(ratio);
    }
}

/// The spread of time ratios B/A.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RatioStats {
    /// Rows with a time on both sides.
    pub rows: usize,
    /// Smallest ratio.
    pub min: f64,
    /// 10th percentile (nearest rank).
    pub p10: f64,
    /// Median (the mean of the two middle ratios for an even count).
    pub median: f64,
    /// 90th percentile (nearest rank).
    pub p90: f64,
    /// Largest ratio.
    pub max: f64,
}

impl RatioStats {
    /// The spread, or `None` without ratios.
    pub fn of(ratios: &[f64]) -> Option<Self> {
        if ratios.is_empty() {
            return None;
        }
        let mut r = ratios.to_vec();
        r.sort_by(|a, b| a.total_cmp(b));
        let q = |p: f64| r[((r.len() - 1) as f64 * p).round() as usize];
        Some(Self {
            rows: r.len(),
            min: q(0.0),
            p10: q(0.1),
            median: median(&mut r.clone()),
            p90: q(0.9),
            max: q(1.0),
        })
    }
}

/// B against A, from the median time ratio's 95% interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SpeedVerdict {
    /// The whole interval below 1 - [`NOISE_BAND`].
    Faster,
    /// The whole interval within 1 ± [`NOISE_BAND`].
    Same,
    /// The whole interval above 1 + [`NOISE_BAND`].
    Slower,
    /// The interval reaches across an edge of the band (or fewer than [`MIN_ROWS`] rows): the
    /// rows cannot tell.
    Inconclusive,
}

impl SpeedVerdict {
    /// The verdict for the median ratio's interval.
    pub fn of(i: &MedianInterval) -> Self {
        let (lo, hi) = (1.0 - NOISE_BAND, 1.0 + NOISE_BAND);
        if i.n < MIN_ROWS {
            Self::Inconclusive
        } else if i.high < lo {
            Self::Faster
        } else if i.low > hi {
            Self::Slower
        } else if i.low >= lo && i.high <= hi {
            Self::Same
        } else {
            Self::Inconclusive
        }
    }
}

/// One measured time: its ratios, the median's interval, verdict, gate and warnings.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Metric {
    /// `prefill_s`, or `decode_s_per_token` (decode_s / tokens).
    pub name: &'static str,
    /// The spread of the ratios B/A.
    pub ratio: RatioStats,
    /// The median ratio B/A with its 95% interval.
    pub interval: MedianInterval,
    /// How the interval was computed ([`METHOD`], or [`RANGE_METHOD`] for too spread ratios).
    pub interval_method: &'static str,
    /// The noise band the verdict needs the interval to clear (0.05: ±5%).
    pub noise_band: f64,
    /// From the interval: faster, same, slower or inconclusive.
    pub verdict: SpeedVerdict,
    /// The interval's lower bound exceeds `--max-slowdown`.
    pub gate_tripped: bool,
    /// Timings too short or too spread to judge, with the fix (also on stderr).
    pub warnings: Vec<String>,
}

impl Metric {
    /// Two lines: the spread, then the median's interval and the verdict.
    pub fn render(&self) -> String {
        let r = &self.ratio;
        let i = &self.interval;
        format!(
            "{} ratio B/A over {} rows: min {:.3}  p10 {:.3}  median {:.3}  p90 {:.3}  max {:.3}\n  median's 95% interval [{:.3}, {:.3}]: {}",
            self.name,
            r.rows,
            r.min,
            r.p10,
            r.median,
            r.p90,
            r.max,
            i.low,
            i.high,
            self.verdict_text()
        )
    }

    /// The verdict and what it rests on.
    fn verdict_text(&self) -> String {
        let pct = (self.interval.median - 1.0) * 100.0;
        let band = NOISE_BAND * 100.0;
        match self.verdict {
            SpeedVerdict::Slower => format!(
                "B slower (median {pct:+.1}%; the whole interval is above the ±{band:.0}% noise band)"
            ),
            SpeedVerdict::Faster => format!(
                "B faster (median {pct:+.1}%; the whole interval is below the ±{band:.0}% noise band)"
            ),
            SpeedVerdict::Same => format!(
                "same speed (median {pct:+.1}%; the whole interval is inside the ±{band:.0}% noise band)"
            ),
            SpeedVerdict::Inconclusive if self.interval.n < MIN_ROWS => {
                "inconclusive (one row has no spread to judge by; use --repeat N)".into()
            }
            SpeedVerdict::Inconclusive => format!(
                "inconclusive (median {pct:+.1}%, but the interval is not clear of the ±{band:.0}% noise band; more rows or --repeat N would tell)"
            ),
        }
    }
}

/// The measured metrics (those with ratios), each judged and gated by `max_slowdown`.
pub fn metrics(prefill: &Timings, decode: &Timings, max_slowdown: Option<f64>) -> Vec<Metric> {
    [("prefill_s", prefill), ("decode_s_per_token", decode)]
        .into_iter()
        .filter_map(|(name, t)| {
            let ratio = RatioStats::of(&t.ratios)?;
            let (interval, interval_method) = ratio_interval(&t.ratios)?;
            Some(Metric {
                name,
                ratio,
                interval,
                interval_method,
                noise_band: NOISE_BAND,
                verdict: SpeedVerdict::of(&interval),
                gate_tripped: max_slowdown.is_some_and(|x| gate_trips(&interval, x)),
                warnings: warnings(name, t, &ratio),
            })
        })
        .collect()
}

/// The median ratio and its 95% interval, with how it was computed: the paired bootstrap, or the
/// ratios' whole min..max range when p90/p10 is over [`NOISY_SPREAD`]. A real change of code moves
/// rows alike; ratios that disagree this much say the machine's load changed while a run ran (a
/// burst slows the rows it overlaps), which a bootstrap treating rows as independent draws cannot
/// see: it would call such a burst in B a slowdown. Then only a slowdown every row shows counts.
pub fn ratio_interval(ratios: &[f64]) -> Option<(MedianInterval, &'static str)> {
    let r = RatioStats::of(ratios)?;
    if too_spread(&r) {
        let range = MedianInterval {
            n: r.rows,
            median: r.median,
            low: r.min,
            high: r.max,
        };
        return Some((range, RANGE_METHOD));
    }
    Some((MedianInterval::of(ratios)?, METHOD))
}

/// Whether the ratios spread over [`NOISY_SPREAD`] from p10 to p90.
fn too_spread(r: &RatioStats) -> bool {
    r.rows >= MIN_ROWS && r.p90 > NOISY_SPREAD * r.p10
}

/// Whether a median ratio's interval clears `--max-slowdown X`: its lower bound is above X, so
/// noise that only widens the interval cannot trip the gate.
pub fn gate_trips(i: &MedianInterval, x: f64) -> bool {
    i.n >= MIN_ROWS && i.low > x
}

/// What makes these timings hard to judge, each with its fix.
fn warnings(name: &str, t: &Timings, r: &RatioStats) -> Vec<String> {
    let mut out = Vec::new();
    if r.rows < MIN_ROWS {
        out.push(format!(
            "{name}: one matched row, no spread to judge a speed by: run more items or --repeat N"
        ));
    }
    let (ma, mb) = (median(&mut t.a.clone()), median(&mut t.b.clone()));
    if ma.min(mb) < SHORT_S {
        let longer = if name == "prefill_s" {
            "longer prompts"
        } else {
            "a larger n_predict"
        };
        out.push(format!(
            "{name}: timings are short (median {:.2} ms a row in A, {:.2} ms in B; under {:.0} ms timer resolution and scheduling dominate): use longer items ({longer}) or --repeat N",
            ma * 1e3,
            mb * 1e3,
            SHORT_S * 1e3
        ));
    }
    if too_spread(r) {
        out.push(format!(
            "{name}: timings are noisy (ratio B/A p90/p10 = {:.1}x over {} rows, so the interval is their whole range): use --warmup N (one-time costs land in the first rows) and --repeat N, on a quiet machine",
            r.p90 / r.p10,
            r.rows
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timings(ratios: &[f64]) -> Timings {
        let mut t = Timings::default();
        for &r in ratios {
            t.push(1.0, r, r);
        }
        t
    }

    #[test]
    fn verdict_from_the_interval() {
        let iv = |low, high| MedianInterval {
            n: 8,
            median: (low + high) / 2.0,
            low,
            high,
        };
        assert_eq!(SpeedVerdict::of(&iv(0.97, 1.04)), SpeedVerdict::Same);
        assert_eq!(SpeedVerdict::of(&iv(0.80, 0.90)), SpeedVerdict::Faster);
        assert_eq!(SpeedVerdict::of(&iv(1.10, 1.30)), SpeedVerdict::Slower);
        assert_eq!(
            SpeedVerdict::of(&iv(0.90, 1.30)),
            SpeedVerdict::Inconclusive
        );
        assert_eq!(
            SpeedVerdict::of(&iv(1.02, 1.30)),
            SpeedVerdict::Inconclusive
        );
        let one = MedianInterval {
            n: 1,
            ..iv(2.0, 2.0)
        };
        assert_eq!(SpeedVerdict::of(&one), SpeedVerdict::Inconclusive);
    }

    #[test]
    fn the_gate_needs_the_lower_bound_above_x() {
        let m = metrics(&timings(&[2.0; 6]), &Timings::default(), Some(1.10));
        assert_eq!(m.len(), 1, "decode not measured: no metric");
        assert!(m[0].gate_tripped);
        assert_eq!(m[0].verdict, SpeedVerdict::Slower);
        // Median 1.3 over 1.1, but two of five rows at or under 1: the interval reaches down.
        let m = metrics(
            &timings(&[0.9, 1.0, 1.3, 1.4, 1.5]),
            &Timings::default(),
            Some(1.10),
        );
        assert!(m[0].interval.median > 1.10 && !m[0].gate_tripped, "{m:?}");
        assert_eq!(m[0].verdict, SpeedVerdict::Inconclusive);
    }

    #[test]
    fn too_spread_ratios_take_their_whole_range() {
        // The review's two runs of one configuration: a median of 20.7, p10 1.16 over 1.1.
        let r = [0.408, 1.158, 12.0, 20.654, 25.0, 30.0, 44.442, 111.079];
        let (i, how) = ratio_interval(&r).unwrap();
        assert_eq!((i.low, i.high, how), (0.408, 111.079, RANGE_METHOD));
        let m = &metrics(&timings(&r), &Timings::default(), Some(1.1))[0];
        assert_eq!(m.verdict, SpeedVerdict::Inconclusive);
        assert!(!m.gate_tripped);
        assert_eq!(ratio_interval(&[1.0, 1.1, 1.2]).unwrap().1, METHOD);
    }

    #[test]
    fn short_and_spread_timings_are_warned_about() {
        let m = &metrics(&timings(&[0.5, 1.0, 2.0, 4.0]), &Timings::default(), None)[0];
        assert!(m.warnings.iter().any(|w| w.contains("noisy")), "{m:?}");
        assert!(!m.warnings.iter().any(|w| w.contains("short")), "{m:?}");
        let mut t = Timings::default();
        t.push(0.001, 0.001, 1.0);
        t.push(0.001, 0.001, 1.0);
        let m = &metrics(&t, &Timings::default(), None)[0];
        assert!(m.warnings.iter().any(|w| w.contains("short")), "{m:?}");
    }
}
