//! The lossy routing knobs (`expert_substitute`, `drop_cold`): at a routing node, before any
//! expert is read, each token row's missed experts are either skipped (dropped) or replaced by a
//! cached expert of the same layer whose router score is close (substituted). Both act on misses
//! only, so with every routed expert cached the routing is left as the router chose it.

/// The two knobs, each off at 0.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Knobs {
    /// A missed expert is replaced by the cached expert of the same layer whose router
    /// probability is closest to its own, when within this distance.
    pub substitute: f64,
    /// A missed expert is skipped when its share of the token's selected router weights is
    /// below `drop_cold / n_expert_used` (the specification's `F x 1/top-k`).
    pub drop_cold: f64,
}

impl Knobs {
    /// Whether either knob is on.
    pub fn on(&self) -> bool {
        self.substitute > 0.0 || self.drop_cold > 0.0
    }
}

/// What one routing node's rewrite did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rewrite {
    /// Per slot (rows of `n_used`), whether it was dropped: its id now names an expert the row
    /// keeps, and its weight must be zeroed before the expert matmuls run.
    pub dropped: Vec<bool>,
    /// Slots whose expert was replaced by a cached one.
    pub substituted: u64,
    /// Slots dropped.
    pub n_dropped: u64,
}

/// How a routing node's ids and the router's probabilities are laid out: `n_used` ids a token,
/// and `probs` in rows of `n_expert`, one row per token.
#[derive(Debug, Clone, Copy)]
pub struct Rows<'a> {
    /// Expert ids a token.
    pub n_used: usize,
    /// The router's probabilities, rows of `n_expert`.
    pub probs: &'a [f32],
    /// Experts a row of `probs`.
    pub n_expert: usize,
}

/// Rewrites `ids` (rows of `rows.n_used` expert ids, one row per token, best first) in place:
/// drops the cold misses, then substitutes the remaining misses where a cached expert's
/// probability in `rows.probs` is within `knobs.substitute` of theirs. A row whose
/// probabilities do not give a share (negative or zero total, as with logits) drops none.
/// `twice_ok`: the layer's expert kernel takes one expert twice in a row (see `repoint_dropped`).
pub fn rewrite(
    ids: &mut [i32],
    rows: Rows<'_>,
    knobs: Knobs,
    cached: impl Fn(u32) -> bool,
    twice_ok: bool,
) -> Rewrite {
    let Rows {
        n_used,
        probs,
        n_expert,
    } = rows;
    let mut out = Rewrite {
        dropped: vec![false; ids.len()],
        ..Rewrite::default()
    };
    if n_used == 0 || n_expert == 0 {
        return out;
    }
    for (r, row) in ids.chunks_mut(n_used).enumerate() {
        let Some(p) = probs.get(r * n_expert..(r + 1) * n_expert) else {
            break;
        };
        let drop = &mut out.dropped[r * n_used..r * n_used + row.len()];
        let dropped = drop_cold_misses(row, p, knobs.drop_cold, &cached, drop);
        out.substituted += substitute_misses(row, p, knobs.substitute, &cached, drop);
        out.n_dropped += dropped - repoint_dropped(row, drop, n_expert, &cached, twice_ok);
    }
    out
}

/// The probability of expert `e` in row `p` (0 for an id outside it).
fn prob(p: &[f32], e: i32) -> f64 {
    usize::try_from(e)
        .ok()
        .and_then(|i| p.get(i))
        .map_or(0.0, |&v| f64::from(v))
}

/// Marks in `drop` the missed slots of one row whose share of the row's selected weights is
/// below `s / n_used`; returns how many. The row's best slot is never dropped (its share is at
/// least `1 / n_used`, and `s <= 1`), so a dropped slot always has a kept one to point at.
fn drop_cold_misses(
    row: &[i32],
    p: &[f32],
    s: f64,
    cached: &impl Fn(u32) -> bool,
    drop: &mut [bool],
) -> u64 {
    if s <= 0.0 {
        return 0;
    }
    let w: Vec<f64> = row.iter().map(|&e| prob(p, e)).collect();
    let total: f64 = w.iter().sum();
    // A NaN fails both tests too: no share.
    let share_defined = total > 0.0 && w.iter().all(|&x| x >= 0.0);
    if !share_defined {
        return 0;
    }
    let floor = s / row.len() as f64;
    let mut n = 0;
    for (j, &e) in row.iter().enumerate() {
        let missed = u32::try_from(e).is_ok_and(|e| !cached(e));
        if missed && w[j] / total < floor {
            drop[j] = true;
            n += 1;
        }
    }
    if drop.iter().all(|&d| d) {
        // Only reachable with ties at s = 1: keep the first slot.
        drop[0] = false;
        n -= 1;
    }
    n
}

/// Replaces each kept, missed expert of one row by the cached expert (not already in the row)
/// whose probability is closest to its own, when within `x`; ties go to the lower id. Returns
/// how many were replaced.
fn substitute_misses(
    row: &mut [i32],
    p: &[f32],
    x: f64,
    cached: &impl Fn(u32) -> bool,
    drop: &[bool],
) -> u64 {
    if x <= 0.0 {
        return 0;
    }
    let mut n = 0;
    for j in 0..row.len() {
        let missed = u32::try_from(row[j]).is_ok_and(|e| !cached(e));
        if drop[j] || !missed {
            continue;
        }
        let pe = prob(p, row[j]);
        let best = (0..p.len() as u32)
            .filter(|&c| cached(c) && !row.contains(&(c as i32)))
            .map(|c| (c, (f64::from(p[c as usize]) - pe).abs()))
            .filter(|&(_, d)| d <= x)
            .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
        if let Some((c, _)) = best {
            row[j] = c as i32;
            n += 1;
        }
    }
    n
}

/// Points every dropped slot of one row at an expert that costs no read and, its weight zeroed,
/// changes nothing: a cached expert of the layer outside the row (a different one per slot),
/// else, where the layer's expert kernel takes one expert twice in a row (`twice_ok`), the row's
/// first kept expert. llama.cpp never routes a token to one expert twice, and the CPU's
/// repacked `MUL_MAT_ID` sizes its per-expert row lists for one use per token: a repeat there
/// writes past them (seen: `malloc(): corrupted top size`). A slot with neither is kept (read
/// after all); returns how many were.
fn repoint_dropped(
    row: &mut [i32],
    drop: &mut [bool],
    n_expert: usize,
    cached: &impl Fn(u32) -> bool,
    twice_ok: bool,
) -> u64 {
    let keep = (0..row.len()).find(|&j| !drop[j]).map(|j| row[j]);
    let outside: Vec<i32> = (0..n_expert as u32)
        .filter(|&c| cached(c))
        .map(|c| c as i32)
        .filter(|c| !row.contains(c))
        .collect();
    let mut spare = outside.into_iter();
    let mut kept = 0;
    for j in 0..row.len() {
        if !drop[j] {
            continue;
        }
        match (spare.next(), keep) {
            (Some(c), _) => row[j] = c,
            (None, Some(k)) if twice_ok => row[j] = k,
            _ => {
                drop[j] = false;
                kept += 1;
            }
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: [f32; 6] = [0.40, 0.30, 0.15, 0.10, 0.04, 0.01];

    fn rows(n_used: usize, probs: &[f32], n_expert: usize) -> Rows<'_> {
        Rows {
            n_used,
            probs,
            n_expert,
        }
    }

    fn knobs(substitute: f64, drop_cold: f64) -> Knobs {
        Knobs {
            substitute,
            drop_cold,
        }
    }

    #[test]
    fn all_cached_leaves_the_routing_alone() {
        let mut ids = vec![0, 1, 2, 3];
        let r = rewrite(&mut ids, rows(4, &P, 6), knobs(1.0, 1.0), |_| true, true);
        assert_eq!(ids, vec![0, 1, 2, 3]);
        assert_eq!((r.substituted, r.n_dropped), (0, 0));
    }

    #[test]
    fn a_miss_takes_the_closest_cached_expert_within_the_distance() {
        // Expert 2 (0.15) missed; 3 (0.10) and 4 (0.04) cached: 3 is within 0.06, 4 is not.
        let mut ids = vec![0, 2];
        let r = rewrite(&mut ids, rows(2, &P, 6), knobs(0.06, 0.0), |e| e != 2, true);
        assert_eq!(ids, vec![0, 3]);
        assert_eq!(r.substituted, 1);
        // Too far: left to be read.
        let mut ids = vec![0, 2];
        let r = rewrite(&mut ids, rows(2, &P, 6), knobs(0.01, 0.0), |e| e != 2, true);
        assert_eq!(ids, vec![0, 2]);
        assert_eq!(r.substituted, 0);
        // A cached expert already in the row is never taken twice.
        let mut ids = vec![3, 2];
        rewrite(&mut ids, rows(2, &P, 6), knobs(0.2, 0.0), |e| e != 2, true);
        assert_eq!(ids, vec![3, 4]);
    }

    #[test]
    fn cold_misses_are_dropped_and_pointed_at_a_kept_expert() {
        // Row 0,1,4: shares 0.54, 0.41, 0.054; floor at s = 0.5 is 0.5/3 = 0.167.
        let mut ids = vec![0, 1, 4];
        let r = rewrite(&mut ids, rows(3, &P, 6), knobs(0.0, 0.5), |_| false, true);
        assert_eq!(r.dropped, vec![false, false, true]);
        assert_eq!(r.n_dropped, 1);
        assert_eq!(ids, vec![0, 1, 0]);
        // Where the kernel cannot take an expert twice: a cached expert outside the row...
        let mut ids = vec![0, 1, 4];
        let r = rewrite(
            &mut ids,
            rows(3, &P, 6),
            knobs(0.0, 0.5),
            |e| e >= 3 && e != 4,
            false,
        );
        assert_eq!((r.n_dropped, ids), (1, vec![0, 1, 3]));
        // ... one per dropped slot, else the slot is kept and read.
        let mut ids = vec![0, 4, 5];
        let r = rewrite(&mut ids, rows(3, &P, 6), knobs(0.0, 1.0), |e| e == 3, false);
        assert_eq!(r.dropped, vec![false, true, false]);
        assert_eq!((r.n_dropped, ids), (1, vec![0, 3, 5]));
        let mut ids = vec![0, 4];
        let r = rewrite(&mut ids, rows(2, &P, 6), knobs(0.0, 1.0), |_| false, false);
        assert_eq!((r.n_dropped, ids), (0, vec![0, 4]));
        // A cached cold expert costs no read: kept.
        let mut ids = vec![0, 1, 4];
        let r = rewrite(&mut ids, rows(3, &P, 6), knobs(0.0, 0.5), |e| e == 4, true);
        assert_eq!(r.n_dropped, 0);
        assert_eq!(ids, vec![0, 1, 4]);
    }

    #[test]
    fn rows_are_decided_one_token_at_a_time() {
        let probs: Vec<f32> = P.iter().chain(P.iter().rev()).copied().collect();
        let mut ids = vec![0, 5, 5, 0];
        let r = rewrite(
            &mut ids,
            rows(2, &probs, 6),
            knobs(0.0, 0.5),
            |_| false,
            true,
        );
        assert_eq!(r.dropped, vec![false, true, false, true]);
        assert_eq!(ids, vec![0, 0, 5, 5]);
    }

    #[test]
    fn logits_give_no_share_and_drop_nothing() {
        let logits = [2.0, -1.0, 0.5, -3.0, 0.0, 0.1];
        let mut ids = vec![0, 1];
        let r = rewrite(
            &mut ids,
            rows(2, &logits, 6),
            knobs(0.0, 1.0),
            |_| false,
            true,
        );
        assert_eq!(r.n_dropped, 0);
    }
}
