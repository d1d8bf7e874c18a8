//! Replays a routing trace (`trace`) through the streamer's own cache policy (`ExpertLru::route`
//! and `ExpertLru::admit`, the calls `Streamer::ensure` makes) at any budget, and through
//! Belady's offline optimum, counting misses and their bytes per token, prompt and decode apart.
//! Reads ahead are not replayed: with `prefetch = off` (or where nothing was read ahead) the
//! replay at the run's budget counts the misses the run counted.
use std::collections::{BTreeSet, HashMap};

use serde::Serialize;

use super::cache::{ExpertLru, Routed};
use super::trace::{Event, Node, Phase, Trace};
use crate::options::CachePolicy;

/// One phase's counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct PhaseStats {
    /// Tokens (counted at the trace's first MoE layer).
    pub tokens: u64,
    /// Routed experts looked up (one per distinct expert a node routes to).
    pub routed: u64,
    /// Of those, not resident: read.
    pub misses: u64,
    /// The misses' bytes.
    pub miss_bytes: u64,
}

impl PhaseStats {
    /// Misses per token (0 without tokens).
    pub fn misses_per_token(&self) -> f64 {
        per(self.misses, self.tokens)
    }

    /// Bytes read per token (0 without tokens).
    pub fn bytes_per_token(&self) -> f64 {
        per(self.miss_bytes, self.tokens)
    }
}

fn per(n: u64, tokens: u64) -> f64 {
    if tokens == 0 {
        0.0
    } else {
        n as f64 / tokens as f64
    }
}

/// A replay's counts at one budget.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SimResult {
    /// The streamer's policy replayed (`next_use`, `recency`) or `belady` (the offline optimum).
    pub policy: &'static str,
    /// The budget replayed.
    pub cache_bytes: u64,
    /// Prompt nodes.
    pub prompt: PhaseStats,
    /// Decode nodes.
    pub decode: PhaseStats,
}

impl SimResult {
    fn new(policy: &'static str, cache_bytes: u64) -> Self {
        SimResult {
            policy,
            cache_bytes,
            prompt: PhaseStats::default(),
            decode: PhaseStats::default(),
        }
    }

    /// Both phases' misses.
    pub fn misses(&self) -> u64 {
        self.prompt.misses + self.decode.misses
    }

    /// Counts one node: its distinct experts, how many missed, and its tokens where `first`
    /// (the trace's first layer).
    fn count(&mut self, n: &Node, wanted: &[bool], miss: &[bool], layer_bytes: u64, k: usize) {
        let s = match n.phase {
            Phase::Prompt => &mut self.prompt,
            Phase::Decode => &mut self.decode,
        };
        let misses = miss.iter().filter(|&&m| m).count() as u64;
        s.routed += wanted.iter().filter(|&&w| w).count() as u64;
        s.misses += misses;
        s.miss_bytes += misses * layer_bytes;
        s.tokens += n.ids.len().checked_div(k).unwrap_or(0) as u64;
    }
}

/// Per expert of the trace's widest layer, whether node `n` routes to it.
fn wanted(t: &Trace, n: &Node) -> Vec<bool> {
    let mut w = vec![false; t.header.n_expert as usize];
    for &e in &n.ids {
        if let Some(x) = usize::try_from(e).ok().and_then(|i| w.get_mut(i)) {
            *x = true;
        }
    }
    w
}

/// The trace's first MoE layer: its nodes count the tokens.
fn first_layer(t: &Trace) -> Option<u32> {
    t.header.layers.iter().map(|(l, _)| *l).min()
}

/// The streamer's `policy` at `budget` bytes (`follow`: also take the trace's budget changes, as
/// the run that recorded it did under memory pressure). A budget of 0 is the streamer without a
/// cache: every routed expert is read.
pub fn replay(t: &Trace, budget: u64, follow: bool, policy: CachePolicy) -> SimResult {
    let mut out = SimResult::new(policy.name(), budget);
    let (mut budget, token_bytes) = (budget, t.header.token_bytes);
    let layers: Vec<u32> = t.header.layers.iter().map(|(l, _)| *l).collect();
    let mut lru = ExpertLru::for_budget(policy, &layers, budget, token_bytes);
    let (first, k) = (first_layer(t), t.header.n_expert_used as usize);
    let n_layers = t.header.layers.len();
    for e in &t.events {
        let n = match e {
            Event::Node(n) => n,
            Event::Budget { budget_bytes } if follow && budget > 0 => {
                budget = *budget_bytes;
                lru.set_by_use(budget < token_bytes);
                continue;
            }
            Event::Budget { .. } => continue,
        };
        let (lb, w) = (t.layer_bytes(n.layer), wanted(t, n));
        let miss = if budget == 0 {
            w.clone()
        } else {
            let (miss, _) = lru.route(n.layer, &w, lb, budget, |_| {});
            let node = Routed {
                ids: &n.ids,
                budget,
                n_layers,
                n_used: k,
            };
            lru.admit(n.layer, &miss, lb, node);
            miss
        };
        out.count(n, &w, &miss, lb, if Some(n.layer) == first { k } else { 0 });
    }
    out
}

/// For each node, the index of the next node that routes to each of its experts (`usize::MAX`
/// where none does), keyed by (layer, expert).
fn next_uses(t: &Trace, nodes: &[&Node]) -> Vec<HashMap<u32, usize>> {
    let mut next: HashMap<(u32, u32), usize> = HashMap::new();
    let mut out = vec![HashMap::new(); nodes.len()];
    for (i, n) in nodes.iter().enumerate().rev() {
        let w = wanted(t, n);
        for e in (0..w.len() as u32).filter(|&e| w[e as usize]) {
            let j = next.insert((n.layer, e), i).unwrap_or(usize::MAX);
            out[i].insert(e, j);
        }
    }
    out
}

/// Belady's offline optimum at `budget` bytes: on a miss that does not fit, the resident expert
/// used again furthest in the future goes (never one the current node routes to, as in the
/// streamer). Optimal where every expert takes the same bytes (one size per model, as in every
/// model so far); with layers of different sizes it is the classic furthest-next-use rule.
pub fn belady(t: &Trace, budget: u64) -> SimResult {
    let mut out = SimResult::new("belady", budget);
    let nodes: Vec<&Node> = t
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Node(n) => Some(n),
            Event::Budget { .. } => None,
        })
        .collect();
    let next = next_uses(t, &nodes);
    let (first, k) = (first_layer(t), t.header.n_expert_used as usize);
    // Resident experts by their next use, and each one's next use and bytes.
    let mut by_next: BTreeSet<(usize, u32, u32)> = BTreeSet::new();
    let mut resident: HashMap<(u32, u32), (usize, u64)> = HashMap::new();
    let mut bytes = 0u64;
    for (i, n) in nodes.iter().enumerate() {
        let (lb, w) = (t.layer_bytes(n.layer), wanted(t, n));
        let mut miss = vec![false; w.len()];
        for (&e, &j) in &next[i] {
            match resident.get_mut(&(n.layer, e)) {
                Some(r) => {
                    by_next.remove(&(r.0, n.layer, e));
                    r.0 = j;
                    by_next.insert((j, n.layer, e));
                }
                None => miss[e as usize] = true,
            }
        }
        let need = miss.iter().filter(|&&m| m).count() as u64 * lb;
        let protected = |&&(_, l, e): &&(usize, u32, u32)| l == n.layer && w[e as usize];
        while bytes + need > budget {
            let Some(&v) = by_next.iter().rev().find(|v| !protected(v)) else {
                break;
            };
            by_next.remove(&v);
            bytes -= resident.remove(&(v.1, v.2)).map_or(0, |r| r.1);
        }
        for e in (0..miss.len() as u32).filter(|&e| miss[e as usize]) {
            let j = next[i][&e];
            resident.insert((n.layer, e), (j, lb));
            by_next.insert((j, n.layer, e));
            bytes += lb;
        }
        out.count(n, &w, &miss, lb, if Some(n.layer) == first { k } else { 0 });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::trace::{Header, VERSION};
    use super::*;

    /// A trace of one layer, one expert a token, of `ids` in decode.
    fn trace(ids: &[i32], n_expert: u32) -> Trace {
        Trace {
            header: Header {
                bmoe_routing_trace: VERSION,
                n_expert,
                n_expert_used: 1,
                layers: vec![(0, 1)],
                token_bytes: 1,
                budget_bytes: 2,
                prefetch: "off".into(),
                cache_policy: "next_use".into(),
            },
            events: ids
                .iter()
                .enumerate()
                .map(|(i, &e)| {
                    Event::Node(Node {
                        phase: Phase::Decode,
                        token: i as u64,
                        layer: 0,
                        ids: vec![e],
                        probs: vec![],
                    })
                })
                .collect(),
        }
    }

    #[test]
    fn belady_keeps_what_comes_back_soonest() {
        // A cycle of three in a cache of two: recency misses every time, the optimum every other
        // time after the first three (it keeps the one needed next).
        let t = trace(&[0, 1, 2, 0, 1, 2, 0, 1, 2], 3);
        let (lru, opt) = (replay(&t, 2, false, CachePolicy::Recency), belady(&t, 2));
        assert_eq!(lru.decode.misses, 9);
        assert_eq!(opt.decode.misses, 6);
        assert_eq!((opt.decode.tokens, opt.decode.routed), (9, 9));
        // Room for all three: only the first reads.
        assert_eq!(belady(&t, 3).decode.misses, 3);
        assert_eq!(replay(&t, 3, false, CachePolicy::Recency).decode.misses, 3);
        // No cache: every routed expert is read.
        assert_eq!(replay(&t, 0, false, CachePolicy::Recency).decode.misses, 9);
    }

    #[test]
    fn belady_is_never_worse_than_the_engine_policy() {
        // A skewed pseudo-random routing over 16 experts, two layers' worth in one.
        let mut x = 12345u64;
        let ids: Vec<i32> = (0..2000)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let u = (x >> 33) as f64 / (1u64 << 31) as f64;
                (16.0 * u * u) as i32
            })
            .collect();
        let t = trace(&ids, 16);
        for b in 1..16 {
            for p in [CachePolicy::NextUse, CachePolicy::Recency] {
                let (lru, opt) = (replay(&t, b, false, p), belady(&t, b));
                assert!(
                    opt.misses() <= lru.misses(),
                    "budget {b}: {opt:?} vs {lru:?}"
                );
            }
        }
    }

    /// A decode trace of `n_layers` layers, `k` experts a token of 1 byte each: `rows[t * n_layers
    /// + l]` are token t's experts at layer l.
    fn layered(n_layers: u32, k: u32, n_expert: u32, rows: Vec<Vec<i32>>) -> Trace {
        let mut t = trace(&[], n_expert);
        t.header.n_expert_used = k;
        t.header.layers = (0..n_layers).map(|l| (l, 1)).collect();
        t.header.token_bytes = u64::from(n_layers * k);
        t.events = rows
            .into_iter()
            .enumerate()
            .map(|(i, ids)| {
                Event::Node(Node {
                    phase: Phase::Decode,
                    token: (i / n_layers as usize) as u64,
                    layer: i as u32 % n_layers,
                    ids,
                    probs: vec![],
                })
            })
            .collect();
        t
    }

    #[test]
    fn next_use_keeps_what_a_cycle_of_layers_needs_soonest() {
        // Four layers, each routing to its expert 0 every token, in a cache of three: the
        // optimum keeps three layers' experts and reads one a node after the first four; once
        // the rates have settled next_use does the same (the misses the last 50 tokens add).
        let misses = |tokens: usize, opt: bool| {
            let t = layered(4, 1, 1, vec![vec![0]; 4 * tokens]);
            match opt {
                true => belady(&t, 3).decode.misses,
                false => replay(&t, 3, false, CachePolicy::NextUse).decode.misses,
            }
        };
        let steady = |opt| misses(100, opt) - misses(50, opt);
        // 200 nodes, a read every third.
        assert_eq!(steady(true), 67);
        assert_eq!(steady(false), steady(true));
    }

    #[test]
    fn next_use_keeps_popular_experts_where_recency_drops_them() {
        // Two layers of 16 experts, two a token, drawn with a strong skew to the low ids, in
        // caches of 5 to 12 (above one token's 4): recency keeps what came last, next_use what
        // its layer keeps choosing.
        let mut x = 7u64;
        let mut draw = || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u = (x >> 33) as f64 / (1u64 << 31) as f64;
            (16.0 * u * u * u) as i32
        };
        let rows = (0..2 * 500)
            .map(|_| {
                let a = draw();
                let b = std::iter::repeat_with(&mut draw).find(|&b| b != a).unwrap();
                vec![a, b]
            })
            .collect();
        let t = layered(2, 2, 16, rows);
        for b in 5..=12 {
            let nu = replay(&t, b, false, CachePolicy::NextUse).decode.misses;
            let recency = replay(&t, b, false, CachePolicy::Recency).decode.misses;
            let opt = belady(&t, b).decode.misses;
            assert!(
                opt <= nu && nu < recency,
                "{b}: next_use {nu}, recency {recency}, optimum {opt}"
            );
        }
    }
}
