//! The statistics of a paired comparison: a percentile paired bootstrap of the mean per-item
//! score change (fixed seed, so the interval is the same on every run and can be recomputed
//! elsewhere), the same bootstrap of a median (the speed ratios' interval), McNemar's exact test
//! on the discordant pairs, and quantiles of a drift.
use serde::Serialize;

/// Bootstrap resamples.
pub const RESAMPLES: usize = 2000;

/// The bootstrap's fixed seed (SplitMix64's initial state).
pub const SEED: u64 = 20_250_933;

/// What produced an interval, as the output names it.
pub const METHOD: &str =
    "paired bootstrap, 2000 resamples, SplitMix64 seed 20250933, percentile 95%";

/// SplitMix64 (Steele, Lea and Flood 2014): a tiny generator any language reproduces exactly.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// A paired change of a mean score (B - A) with its 95% interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PairedChange {
    /// Items paired.
    pub n: usize,
    /// Mean of B's per-item scores minus A's.
    pub change: f64,
    /// Lower end of the 95% interval.
    pub low: f64,
    /// Upper end of the 95% interval.
    pub high: f64,
}

/// One resample of `values`: n draws with replacement, index = next() mod n, into `buf`.
fn resample(rng: &mut SplitMix64, values: &[f64], buf: &mut Vec<f64>) {
    let n = values.len() as u64;
    buf.clear();
    buf.extend((0..n).map(|_| values[(rng.next() % n) as usize]));
}

/// The percentile 95% interval of [`RESAMPLES`] bootstrap statistics: sorted, the nearest ranks
/// round(0.025) and round(0.975 ).
fn percentile_95(mut stats: Vec<f64>) -> (f64, f64) {
    stats.sort_by(|a, b| a.total_cmp(b));
    let rank = |q: f64| ((stats.len() - 1) as f64 * q).round() as usize;
    (stats[rank(0.025)], stats[rank(0.975)])
}

/// The mean of `diffs` (per item, B - A, in a fixed order) and its percentile paired-bootstrap
/// 95% interval: [`RESAMPLES`] resamples of n items drawn with replacement (index = next() mod n
/// from a SplitMix64 seeded with [`SEED`]), their means sorted, the nearest ranks
/// round(0.025) and round(0.975 ). `None` without items.
pub fn paired_bootstrap(diffs: &[f64]) -> Option<PairedChange> {
    let n = diffs.len();
    if n == 0 {
        return None;
    }
    let (low, high) = bootstrap_95(diffs, |v| mean(v));
    Some(PairedChange {
        n,
        change: mean(diffs),
        low,
        high,
    })
}

/// The percentile bootstrap 95% interval of `stat` over `values` ([`RESAMPLES`] resamples from
/// SplitMix64 seeded with [`SEED`]); `values` must not be empty.
pub fn bootstrap_95(values: &[f64], mut stat: impl FnMut(&mut [f64]) -> f64) -> (f64, f64) {
    let mut rng = SplitMix64(SEED);
    let mut buf = Vec::with_capacity(values.len());
    let stats = (0..RESAMPLES)
        .map(|_| {
            resample(&mut rng, values, &mut buf);
            stat(&mut buf)
        })
        .collect();
    percentile_95(stats)
}

/// The bootstrap 95% interval of median(a) / median(b) for two independent samples: each
/// resample draws n values of `a`, then m of `b` (each sorted ascending), from the one SplitMix64
/// stream seeded with [`SEED`]. Neither may be empty.
pub fn median_ratio_95(a: &[f64], b: &[f64]) -> (f64, f64) {
    let sorted = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(|x, y| x.total_cmp(y));
        v
    };
    let (a, b) = (sorted(a), sorted(b));
    let mut rng = SplitMix64(SEED);
    let (mut ca, mut cb) = (vec![0u32; a.len()], vec![0u32; b.len()]);
    let stats = (0..RESAMPLES)
        .map(|_| {
            let top = resampled_median(&mut rng, &a, &mut ca);
            top / resampled_median(&mut rng, &b, &mut cb)
        })
        .collect();
    percentile_95(stats)
}

/// The bootstrap 95% interval of median(t) / (median(r) + median(base)), for `rows` of (t, r)
/// pairs (a row's time and its floor's part of its own) and an independent sample `base`: each
/// resample draws n rows whole, then m values of `base`, from the one SplitMix64 stream seeded
/// with [`SEED`]. Neither may be empty.
pub fn floor_ratio_95(rows: &[(f64, f64)], base: &[f64]) -> (f64, f64) {
    let mut rng = SplitMix64(SEED);
    let (mut t, mut r, mut b) = (Vec::new(), Vec::new(), Vec::new());
    let n = rows.len() as u64;
    let stats = (0..RESAMPLES)
        .map(|_| {
            t.clear();
            r.clear();
            for _ in 0..n {
                let (ti, ri) = rows[(rng.next() % n) as usize];
                t.push(ti);
                r.push(ri);
            }
            resample(&mut rng, base, &mut b);
            median(&mut t) / (median(&mut r) + median(&mut b))
        })
        .collect();
    percentile_95(stats)
}

/// The mean, summed in order from 0 (so the bootstrap's means are reproducible elsewhere); NaN
/// when empty.
pub fn mean(v: &[f64]) -> f64 {
    v.iter().fold(0.0, |s, x| s + x) / v.len() as f64
}

/// The median: the middle value, or the mean of the two middle values for an even count (no
/// upward lean, which a gate on the interval's lower bound would feel). Reorders `v`; NaN when
/// empty.
pub fn median(v: &mut [f64]) -> f64 {
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    let (left, mid, _) = v.select_nth_unstable_by(n / 2, |a, b| a.total_cmp(b));
    let hi = *mid;
    if n % 2 == 1 {
        return hi;
    }
    let lo = left.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (lo + hi) / 2.0
}

/// A median with its 95% interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct MedianInterval {
    /// Values.
    pub n: usize,
    /// Their median ([`median`]).
    pub median: f64,
    /// Lower end of the 95% interval of the median.
    pub low: f64,
    /// Upper end.
    pub high: f64,
}

impl MedianInterval {
    /// The median of `values` and its percentile-bootstrap 95% interval: [`RESAMPLES`] resamples
    /// of n values drawn with replacement from the values sorted ascending (index = next() mod n
    /// from SplitMix64 seeded with [`SEED`]), each resample's [`median`], the nearest ranks
    /// round(0.025) and round(0.975 ). `None` without values.
    pub fn of(values: &[f64]) -> Option<Self> {
        if values.is_empty() {
            return None;
        }
        let mut sorted = values.to_vec();
        sorted.sort_by(|a, b| a.total_cmp(b));
        let mut rng = SplitMix64(SEED);
        let mut counts = vec![0u32; sorted.len()];
        let medians = (0..RESAMPLES)
            .map(|_| resampled_median(&mut rng, &sorted, &mut counts))
            .collect();
        let (low, high) = percentile_95(medians);
        Some(Self {
            n: values.len(),
            median: median(&mut sorted),
            low,
            high,
        })
    }
}

/// The median of one resample of `sorted` (ascending), found by counting how often each index
/// is drawn and walking to the middle: O(n) without moving values, so 2000 resamples of 20,000
/// rows take a fraction of a second.
fn resampled_median(rng: &mut SplitMix64, sorted: &[f64], counts: &mut [u32]) -> f64 {
    let n = sorted.len();
    counts.fill(0);
    for _ in 0..n {
        counts[(rng.next() % n as u64) as usize] += 1;
    }
    // The two middle ranks (0-based): one and the same for an odd count.
    let (k1, k2) = ((n - 1) / 2, n / 2);
    let (mut lo, mut seen) = (f64::NAN, 0usize);
    for (i, &c) in counts.iter().enumerate() {
        seen += c as usize;
        if lo.is_nan() && seen > k1 {
            lo = sorted[i];
        }
        if seen > k2 {
            return (lo + sorted[i]) / 2.0;
        }
    }
    lo
}

/// McNemar's exact test: the two-sided p-value of `lost` right->wrong against `gained`
/// wrong->right flips under "no change" (each flip either way with probability 1/2):
/// min(1, 2 P(X <= min(lost, gained))), X ~ Binomial(lost + gained, 1/2). 1 without flips.
pub fn mcnemar_exact(lost: usize, gained: usize) -> f64 {
    let n = lost + gained;
    let k = lost.min(gained);
    // P(X = j) from ln C(n, j) - n ln 2, summed up to k: no overflow for any n.
    let mut ln_c = 0.0f64;
    let mut tail = 0.0;
    for j in 0..=k {
        if j > 0 {
            ln_c += ((n - j + 1) as f64 / j as f64).ln();
        }
        tail += (ln_c - n as f64 * std::f64::consts::LN_2).exp();
    }
    (2.0 * tail).min(1.0)
}

/// Nearest-rank quantiles of a drift (absolute differences).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Drift {
    /// Values.
    pub n: usize,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
}

impl Drift {
    /// The quantiles (nearest rank, round((n-1) q)), or `None` without values.
    pub fn of(values: &[f64]) -> Option<Self> {
        if values.is_empty() {
            return None;
        }
        let mut v = values.to_vec();
        v.sort_by(|a, b| a.total_cmp(b));
        let q = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
        Some(Self {
            n: v.len(),
            p50: q(0.5),
            p90: q(0.9),
            p99: q(0.99),
            max: q(1.0),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_matches_its_reference_values() {
        // The first outputs for seed 1234567 given with the reference implementation.
        let mut r = SplitMix64(1_234_567);
        assert_eq!(r.next(), 6_457_827_717_110_365_317);
        assert_eq!(r.next(), 3_203_168_211_198_807_973);
    }

    #[test]
    fn mcnemar_closed_forms() {
        assert_eq!(mcnemar_exact(0, 0), 1.0);
        // 0 vs 5: 2 / 2^5.
        assert!((mcnemar_exact(0, 5) - 0.0625).abs() < 1e-15);
        // 1 vs 4: 2 (1 + 5) / 32.
        assert!((mcnemar_exact(4, 1) - 0.375).abs() < 1e-15);
    }

    #[test]
    fn medians_and_their_intervals() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&mut []).is_nan());
        let m = MedianInterval::of(&[1.0; 7]).unwrap();
        assert_eq!((m.median, m.low, m.high), (1.0, 1.0, 1.0));
        // Few values: the interval of the median spans nearly all of them.
        let m = MedianInterval::of(&[0.8, 1.3, 0.9, 1.2, 1.0]).unwrap();
        assert_eq!((m.low, m.high), (0.8, 1.3));
        let (lo, hi) = median_ratio_95(&[2.0; 5], &[1.0; 5]);
        assert_eq!((lo, hi), (2.0, 2.0));
        // Counting draws gives the median a sort of the resample gives.
        let sorted = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0];
        let (mut a, mut b) = (SplitMix64(5), SplitMix64(5));
        let mut counts = [0u32; 6];
        for _ in 0..50 {
            let got = resampled_median(&mut a, &sorted, &mut counts);
            let mut draw: Vec<f64> = (0..6).map(|_| sorted[(b.next() % 6) as usize]).collect();
            assert_eq!(got, median(&mut draw));
        }
    }

    #[test]
    fn bootstrap_of_no_change_is_zero() {
        let c = paired_bootstrap(&[0.0; 10]).unwrap();
        assert_eq!((c.change, c.low, c.high), (0.0, 0.0, 0.0));
        let c = paired_bootstrap(&[1.0, -1.0, 0.0, 0.0]).unwrap();
        assert!(c.low < 0.0 && c.high > 0.0 && c.change == 0.0);
    }
}
