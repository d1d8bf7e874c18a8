//! Speed between two runs: time ratios B/A per matched row, their spread, a verdict against a
//! noise band, and the `--max-slowdown` gate on the median.
use serde::Serialize;

/// A median time ratio within 1 ± this is "same": run-to-run noise on one machine (thermal state,
/// page cache, other load) moves medians by a few percent.
pub const NOISE_BAND: f64 = 0.05;

/// The spread of time ratios B/A.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RatioStats {
    /// Rows with a time on both sides.
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

impl RatioStats {
    /// The spread (nearest-rank quantiles), or `None` without ratios.
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
            median: q(0.5),
            p90: q(0.9),
            max: q(1.0),
        })
    }
}

/// B against A, from the median time ratio.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SpeedVerdict {
    /// Median ratio below 1 - [`NOISE_BAND`].
    Faster,
    /// Within the band.
    Same,
    /// Median ratio above 1 + [`NOISE_BAND`].
    Slower,
}

impl SpeedVerdict {
    /// The verdict for a median time ratio B/A.
    pub fn of(median: f64) -> Self {
        if median < 1.0 - NOISE_BAND {
            Self::Faster
        } else if median > 1.0 + NOISE_BAND {
            Self::Slower
        } else {
            Self::Same
        }
    }

    /// `faster` / `same` / `slower`.
    pub fn word(self) -> &'static str {
        match self {
            Self::Faster => "faster",
            Self::Same => "same",
            Self::Slower => "slower",
        }
    }
}

/// One measured time: its ratios, verdict and gate.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Metric {
    /// `prefill_s`, or `decode_s_per_token` (decode_s / tokens).
    pub name: &'static str,
    /// The spread of the ratios B/A.
    pub ratio: RatioStats,
    /// From the median.
    pub verdict: SpeedVerdict,
    /// The median exceeds `--max-slowdown`.
    pub gate_tripped: bool,
}

impl Metric {
    /// `prefill_s ratio B/A over 6 rows: min ... max 1.200: slower (+15.0%, noise band ±5%)`.
    pub fn render(&self) -> String {
        let r = &self.ratio;
        format!(
            "{} ratio B/A over {} rows: min {:.3}  p10 {:.3}  median {:.3}  p90 {:.3}  max {:.3}: B {} (median {:+.1}%, noise band ±{:.0}%)",
            self.name,
            r.rows,
            r.min,
            r.p10,
            r.median,
            r.p90,
            r.max,
            self.verdict.word(),
            (r.median - 1.0) * 100.0,
            NOISE_BAND * 100.0
        )
    }
}

/// The measured metrics (those with ratios), each judged and gated by `max_slowdown`.
pub fn metrics(prefill: &[f64], decode: &[f64], max_slowdown: Option<f64>) -> Vec<Metric> {
    [("prefill_s", prefill), ("decode_s_per_token", decode)]
        .into_iter()
        .filter_map(|(name, r)| {
            let ratio = RatioStats::of(r)?;
            Some(Metric {
                name,
                ratio,
                verdict: SpeedVerdict::of(ratio.median),
                gate_tripped: max_slowdown.is_some_and(|x| ratio.median > x),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn band_and_gate() {
        assert_eq!(SpeedVerdict::of(1.04), SpeedVerdict::Same);
        assert_eq!(SpeedVerdict::of(0.90), SpeedVerdict::Faster);
        assert_eq!(SpeedVerdict::of(1.20), SpeedVerdict::Slower);
        let m = metrics(&[1.0, 2.0, 2.0], &[], Some(1.10));
        assert_eq!(m.len(), 1, "decode not measured: no metric");
        assert!(m[0].gate_tripped);
        assert!(!metrics(&[1.0, 1.05, 1.2], &[], Some(1.10))[0].gate_tripped);
    }
}
