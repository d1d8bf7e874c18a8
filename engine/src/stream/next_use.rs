//! When each expert will be routed to next, estimated online for the expert cache's `next_use`
//! policy: the offline optimum (Belady's) evicts the expert used again furthest ahead, and this
//! is that rule with the future guessed.
//!
//! Decode visits the MoE layers in one order, token after token. An expert of layer `l` can be
//! used again no sooner than `l`'s next routing node, `d` nodes ahead; if its layer chooses it at
//! a token with probability `q`, the tokens until it is chosen again are geometric, so its next
//! use is expected `d + L (1 - q) / q` nodes ahead (`L` MoE layers). `q` is how often the layer
//! chose it over its recent tokens, decayed by [`DECAY`] a token. In a decode that routes every
//! layer alike each token (q = 1), this evicts the layer just visited, the optimum's choice
//! there, where recency evicts the next layer's (0% hits on bench10 below its cliff); with
//! popular experts and reuse between tokens it keeps both, where recency keeps neither
//! (docs/benchmarks.md, "The expert cache against the offline optimum").
use std::collections::HashMap;

/// How much of an expert's rate one token keeps: rates follow about the last ten tokens. Chosen
/// in the simulator on three traces between 0.5 and 0.95 (docs/benchmarks.md): lower forgets
/// the popular experts between their uses, higher holds on to the prompt's.
pub(crate) const DECAY: f64 = 0.9;

/// How much of a layer's rates its first decode-sized node after a prompt piece keeps: decode
/// follows its own routing more than the prompt's (many different tokens), and with the plain
/// decay the experts decode starts on ranked below the prompt's favourites and were read again
/// for several tokens (a greedy trace: 75, 67, 48 misses on decode's first tokens where recency
/// had 76, 6, 12; with the handover at 0.5, 5.80x of the optimum at 595 MiB became 4.53x, the
/// sampled traces alike or better; docs/benchmarks.md).
pub(crate) const HANDOVER_KEEP: f64 = 0.5;

/// Each layer's recent routing rates and the layers' visiting order.
pub(crate) struct NextUse {
    /// The MoE layers in the order a token visits them.
    order: Vec<u32>,
    /// Per layer: the share of recent tokens that chose each expert.
    rates: HashMap<u32, Rates>,
}

/// One layer's rates, and whether its last node was a prompt piece.
#[derive(Default)]
struct Rates {
    per_expert: Vec<f64>,
    after_wide: bool,
}

impl NextUse {
    /// Rates all zero for the MoE `layers` (any order).
    pub(crate) fn new(layers: &[u32]) -> Self {
        let mut order = layers.to_vec();
        order.sort_unstable();
        order.dedup();
        Self {
            order,
            rates: HashMap::new(),
        }
    }

    /// A routing node of `layer` over `ids` (rows of `n_used` a token; negative ids are empty
    /// slots; `decode`: a decode-sized node, not a prompt piece): each expert's rate moves
    /// towards the share of the node's tokens that chose it, by one token's decay per token
    /// ([`HANDOVER_KEEP`] at decode's first node after a prompt piece).
    pub(crate) fn observe(&mut self, layer: u32, ids: &[i32], n_used: usize, decode: bool) {
        let tokens = (ids.len() / n_used.max(1)).max(1);
        let layer_rates = self.rates.entry(layer).or_default();
        let keep = match (decode, layer_rates.after_wide) {
            (true, true) => HANDOVER_KEEP,
            _ => DECAY.powi(tokens.min(i32::MAX as usize) as i32),
        };
        layer_rates.after_wide = !decode;
        let rates = &mut layer_rates.per_expert;
        let mut counts = vec![0u32; rates.len()];
        for e in ids.iter().filter_map(|&e| usize::try_from(e).ok()) {
            if e >= counts.len() {
                counts.resize(e + 1, 0);
                rates.resize(e + 1, 0.0);
            }
            counts[e] += 1;
        }
        for (r, &c) in rates.iter_mut().zip(&counts) {
            *r = keep * *r + (1.0 - keep) * f64::from(c) / tokens as f64;
        }
    }

    /// The routing nodes until (layer, expert) is expected to be used again, seen from a node of
    /// layer `now`: infinite for an expert its layer has not chosen lately.
    pub(crate) fn expected(&self, now: u32, (layer, expert): (u32, u32)) -> f64 {
        let n = self.order.len().max(1);
        let pos = |l: u32| self.order.binary_search(&l).unwrap_or_else(|i| i);
        // The node itself is at distance 0: its experts are protected, so its layer is next a
        // whole round ahead.
        let d = match (pos(layer) + n - pos(now) % n) % n {
            0 => n,
            d => d,
        };
        let q = self
            .rates
            .get(&layer)
            .and_then(|r| r.per_expert.get(expert as usize))
            .copied()
            .unwrap_or(0.0);
        if q <= 0.0 {
            return f64::INFINITY;
        }
        d as f64 + n as f64 * (1.0 - q) / q
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_layer_comes_before_the_one_just_visited() {
        let mut nu = NextUse::new(&[0, 1, 2, 3]);
        for l in 0..4 {
            nu.observe(l, &[0], 1, true);
        }
        // Equal rates: from layer 1's node, layer 2 is one node away, 1 itself four, 0 three.
        let at = |l| nu.expected(1, (l, 0));
        assert!(
            at(2) < at(3) && at(3) < at(0) && at(0) < at(1),
            "{:?}",
            (0..4).map(at).collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_rarely_chosen_expert_is_expected_later_and_an_unchosen_one_never() {
        let mut nu = NextUse::new(&[0]);
        // Expert 0 every token, 1 every fourth; 2 never.
        for t in 0..40 {
            let ids = if t % 4 == 0 { [0, 1] } else { [0, -1] };
            nu.observe(0, &ids, 2, true);
        }
        assert!(nu.expected(0, (0, 0)) < nu.expected(0, (0, 1)));
        assert_eq!(nu.expected(0, (0, 2)), f64::INFINITY);
        // A wide piece counts its tokens: 10 tokens all on expert 2 move its rate near 1 - 0.9^10.
        nu.observe(0, &[2; 10], 1, false);
        // One layer: the next node is one away, so the expected distance is 1 / q.
        let q = 1.0 / nu.expected(0, (0, 2));
        assert!((q - (1.0 - 0.9f64.powi(10))).abs() < 1e-9, "{q}");
        // The first decode-sized node after that piece moves the rates halfway to its own.
        nu.observe(0, &[3], 1, true);
        let q3 = 1.0 / nu.expected(0, (0, 3));
        assert!((q3 - HANDOVER_KEEP).abs() < 1e-9, "{q3}");
        // Then a token's decay again.
        nu.observe(0, &[3], 1, true);
        let q3 = 1.0 / nu.expected(0, (0, 3));
        assert!((q3 - (1.0 - 0.9 * HANDOVER_KEEP)).abs() < 1e-9, "{q3}");
    }
}
