//! What a routing trace's decode looks like, in the terms papers on real MoE models report:
//! per-layer popularity skew, reuse between consecutive tokens, how much of decode goes to
//! experts its prompt used. Each has its uniform-random baseline beside it.
use std::collections::{BTreeMap, HashSet};

use serde::Serialize;

use super::trace::{Event, Node, Phase, Trace};

/// Decode's routing statistics, averaged over layers (and token pairs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct RoutingStats {
    /// Decode tokens (rows at the first layer).
    pub decode_tokens: u64,
    /// Share of a layer's decode routings that go to its most-used quarter of experts
    /// (uniform: 0.25).
    pub top_quarter_share: f64,
    /// Token t+1's first choice equals token t's, same layer (uniform: 1 / n_expert). Mixtral's
    /// paper reports this rate per layer.
    pub first_repeat: f64,
    /// Token t+1's experts that token t also chose, as a share of top-k (uniform: k / n_expert).
    pub reuse: f64,
    /// Token t+1's top-2 shares an expert with token t's top-2 (uniform: 1 - C(n-2,2)/C(n,2)).
    pub top2_overlap: f64,
    /// Share of decode's routings that go to an expert the last prompt routed to in that layer.
    pub prompt_coverage: f64,
    /// Uniform-random baselines of the four rates above, in order.
    pub uniform: [f64; 4],
}

/// Per layer: decode rows in order (each token's experts, best first; an empty row between two
/// generates), how often each expert was chosen, and the experts the last prompt chose.
#[derive(Default)]
struct Layer {
    rows: Vec<Vec<i32>>,
    counts: BTreeMap<i32, u64>,
    prompt: HashSet<i32>,
    covered: u64,
    in_decode: bool,
}

impl Layer {
    fn add(&mut self, n: &Node, k: usize) {
        if n.phase == Phase::Prompt {
            // A prompt after a decode starts a new prompt set; its pieces add up.
            if self.in_decode {
                self.prompt.clear();
                self.rows.push(Vec::new());
                self.in_decode = false;
            }
            self.prompt.extend(n.ids.iter().copied());
            return;
        }
        self.in_decode = true;
        for row in n.ids.chunks(k.max(1)) {
            for &e in row {
                *self.counts.entry(e).or_default() += 1;
                self.covered += u64::from(self.prompt.contains(&e));
            }
            self.rows.push(row.to_vec());
        }
    }
}

/// Averages of `f` over consecutive row pairs of every layer (0 without pairs).
fn pair_mean(layers: &BTreeMap<u32, Layer>, f: impl Fn(&[i32], &[i32]) -> f64) -> f64 {
    let (mut sum, mut n) = (0.0, 0u64);
    for l in layers.values() {
        for w in l
            .rows
            .windows(2)
            .filter(|w| !w[0].is_empty() && !w[1].is_empty())
        {
            sum += f(&w[0], &w[1]);
            n += 1;
        }
    }
    if n == 0 {
        0.0
    } else {
        sum / n as f64
    }
}

/// Decode's statistics over the whole trace.
pub fn stats(t: &Trace) -> RoutingStats {
    let k = t.header.n_expert_used.max(1) as usize;
    let n = t.header.n_expert.max(1) as f64;
    let mut layers: BTreeMap<u32, Layer> = BTreeMap::new();
    for e in &t.events {
        if let Event::Node(node) = e {
            layers.entry(node.layer).or_default().add(node, k);
        }
    }
    let routed: u64 = layers
        .values()
        .flat_map(|l| &l.rows)
        .map(|r| r.len() as u64)
        .sum();
    let quarter = (n / 4.0).ceil() as usize;
    let top: u64 = layers
        .values()
        .map(|l| {
            let mut c: Vec<u64> = l.counts.values().copied().collect();
            c.sort_unstable_by(|a, b| b.cmp(a));
            c.iter().take(quarter).sum::<u64>()
        })
        .sum();
    let share = |x: u64| {
        if routed == 0 {
            0.0
        } else {
            x as f64 / routed as f64
        }
    };
    let top2 = |r: &[i32]| r.iter().take(2).copied().collect::<Vec<_>>();
    let pairs = n * (n - 1.0) / 2.0;
    RoutingStats {
        decode_tokens: layers.values().next().map_or(0, |l| {
            l.rows.iter().filter(|r| !r.is_empty()).count() as u64
        }),
        top_quarter_share: share(top),
        first_repeat: pair_mean(&layers, |a, b| f64::from(u8::from(a.first() == b.first()))),
        reuse: pair_mean(&layers, |a, b| {
            b.iter().filter(|e| a.contains(e)).count() as f64 / k as f64
        }),
        top2_overlap: pair_mean(&layers, |a, b| {
            f64::from(u8::from(top2(b).iter().any(|e| top2(a).contains(e))))
        }),
        prompt_coverage: share(layers.values().map(|l| l.covered).sum()),
        uniform: [
            quarter as f64 / n,
            1.0 / n,
            k as f64 / n,
            1.0 - (n - 2.0) * (n - 3.0) / 2.0 / pairs.max(1.0),
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::super::trace::{Header, VERSION};
    use super::*;

    fn node(phase: Phase, ids: &[i32]) -> Event {
        Event::Node(Node {
            phase,
            token: 0,
            layer: 0,
            ids: ids.to_vec(),
            probs: vec![],
        })
    }

    #[test]
    fn a_repeating_decode_reuses_everything() {
        let header = Header {
            bmoe_routing_trace: VERSION,
            n_expert: 8,
            n_expert_used: 2,
            layers: vec![(0, 1)],
            token_bytes: 2,
            budget_bytes: 0,
            prefetch: "off".into(),
            cache_policy: "next_use".into(),
        };
        let mut events = vec![node(Phase::Prompt, &[0, 1, 2, 3])];
        events.extend((0..4).map(|_| node(Phase::Decode, &[0, 5])));
        let s = stats(&Trace { header, events });
        assert_eq!(s.decode_tokens, 4);
        assert_eq!((s.first_repeat, s.reuse, s.top2_overlap), (1.0, 1.0, 1.0));
        // Experts 0 and 5 take every routing; the top quarter (2 of 8) is them.
        assert_eq!(s.top_quarter_share, 1.0);
        // Half of decode goes to expert 0, which the prompt used.
        assert_eq!(s.prompt_coverage, 0.5);
        // Two random pairs of 8 share an expert with probability 1 - 15/28.
        assert!(
            (s.uniform[3] - 13.0 / 28.0).abs() < 1e-12,
            "{:?}",
            s.uniform
        );
    }
}
