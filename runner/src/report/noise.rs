//! Warnings about speed timings too short or too spread to judge, naming the fix, as hyperfine
//! gives them: the tables' medians and the speed-up's interval say what the rows hold, these say
//! when the rows are the problem.
use super::group::{Group, Stat};
use super::input::Data;
use crate::compare::speed::SHORT_S;

/// A speed's p90/p10 over one point's rows above this is warned about. Higher than compare's
/// paired bound (2x): rows of one point are different items, and a short prompt's tok/s is
/// legitimately lower than a long one's.
pub const NOISY_SPREAD: f64 = 3.0;

/// How many groups a warning names before "and N more".
const SHOWN: usize = 3;

/// One warning for short prefill times and one for spread speeds, each naming the groups.
pub fn timing_warnings(d: &Data, groups: &[Group]) -> Vec<String> {
    let (mut short, mut noisy) = (Vec::new(), Vec::new());
    for g in groups {
        let name = format!("{}/{}/{}", g.job, g.profile, g.label);
        let prefill = g
            .members
            .iter()
            .map(|&i| &d.recs[i])
            .filter(|r| !r.failed)
            .filter_map(|r| d.num(r, "prefill_s"))
            .filter(|s| *s > 0.0)
            .collect();
        if let Some(s) = Stat::of(prefill).filter(|s| s.median < SHORT_S) {
            short.push(format!("{name} {:.2} ms", s.median * 1e3));
        }
        for m in ["prefill_tps", "decode_tps"] {
            if let Some(s) = g.metrics.get(m).filter(|s| spread(s) > NOISY_SPREAD) {
                noisy.push(format!("{name} {m} {:.1}x", spread(s)));
            }
        }
    }
    let mut out = Vec::new();
    if !short.is_empty() {
        out.push(format!(
            "timings are short: median prefill_s under {:.0} ms in {} of {} groups ({}): timer resolution and scheduling dominate; use longer items (longer prompts, a larger n_predict) or --repeat N",
            SHORT_S * 1e3,
            short.len(),
            groups.len(),
            capped(&short)
        ));
    }
    if !noisy.is_empty() {
        out.push(format!(
            "timings are noisy: a speed's p90/p10 is over {NOISY_SPREAD:.0}x in {} of {} groups ({}): use --warmup N (one-time costs land in the first rows) and --repeat N, on a quiet machine",
            noisy.len(),
            groups.len(),
            capped(&noisy)
        ));
    }
    out
}

/// p90 over p10 of a speed (tok/s, always above 0 where measured); 1 with one row.
fn spread(s: &Stat) -> f64 {
    if s.n < 2 || s.p10 <= 0.0 {
        return 1.0;
    }
    s.p90 / s.p10
}

/// `a, b, c and 2 more`.
fn capped(names: &[String]) -> String {
    let shown = names[..names.len().min(SHOWN)].join(", ");
    match names.len().saturating_sub(SHOWN) {
        0 => shown,
        n => format!("{shown} and {n} more"),
    }
}
