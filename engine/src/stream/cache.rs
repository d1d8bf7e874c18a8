//! The expert cache's bookkeeping: resident experts with a byte budget, and which goes when
//! room is needed. By default ([`CachePolicy::NextUse`]) the one whose next use is expected
//! furthest ahead (`next_use`): the rule of the offline optimum with the future estimated from
//! each layer's recent routing.
//!
//! The policy before it ([`CachePolicy::Recency`], kept to compare against) evicts the least
//! recently used, or below the cliff the least used first and the most recent among equals.
//! Recency fails where the cache is smaller than one token's routed experts, as it is ten times
//! larger than memory: decode walks the layers in the same order every token, so by a layer's
//! turn its experts from the token before are the least recent ones, and they are gone (0% hits
//! on bench10 with 450 MiB against 648 MiB a token). There counting uses keeps the experts the
//! router keeps choosing, and halving the counts every [`AGE_EVERY`] uses lets a new prompt's
//! favourites take over. Where the counts are equal (a decode that routes each layer to the same
//! experts every token), the most recent goes: in a cycle the one used last is the one needed
//! furthest ahead (62% decode hits on bench10 at 450 MiB; oldest-first among equals still gave
//! 0%). Above the cliff it keeps recency, which on routing with popular experts and reuse
//! between tokens misses 2.4-3x the optimum (docs/benchmarks.md).
use std::collections::HashMap;

use lru::LruCache;

use super::next_use::NextUse;
use crate::options::CachePolicy;

/// Uses between two halvings of every count.
const AGE_EVERY: u32 = 8192;

/// Decode-sized graphs only (the cache's `decode_sized`, the prefetcher's predictions): wider
/// pieces read nearly every expert on demand anyway.
pub(crate) const MAX_PREFETCH_TOKENS: usize = 4;

/// Whether a routing node of `n_ids` ids (`n_used` a token) is decode-sized: at most
/// `MAX_PREFETCH_TOKENS` tokens. Wider pieces are prompt pieces, after which a layer keeps its
/// popular experts ([`ExpertLru::admit`]).
pub(crate) fn decode_sized(n_ids: usize, n_used: usize) -> bool {
    n_ids <= MAX_PREFETCH_TOKENS * n_used.max(1)
}

/// A routing node's experts, for [`ExpertLru::admit`].
pub(crate) struct Routed<'a> {
    /// Every token's experts (rows of `n_used`).
    pub(crate) ids: &'a [i32],
    /// The cache's budget now.
    pub(crate) budget: u64,
    /// MoE layers of the model.
    pub(crate) n_layers: usize,
    /// Experts a token.
    pub(crate) n_used: usize,
}

/// Resident experts with their bytes, in recency order, and what the policy knows of their use.
pub(crate) struct ExpertLru {
    map: LruCache<(u32, u32), u64>,
    resident: u64,
    /// The next-use estimate (`None`: [`CachePolicy::Recency`]).
    next_use: Option<NextUse>,
    /// The layer of the routing node being served (what [`NextUse::expected`] counts from).
    now: u32,
    /// How often each (layer, expert) was routed to lately, resident or not.
    uses: HashMap<(u32, u32), u32>,
    /// Uses since the counts were last halved.
    since_aging: u32,
    /// With [`CachePolicy::Recency`]: evict the least used first (below the cliff) instead of
    /// the least recent.
    by_use: bool,
}

impl ExpertLru {
    /// An empty cache with `policy` over the MoE `layers`; `by_use`: with recency, evict the
    /// least used first (see [`Self::set_by_use`]).
    pub(crate) fn new(policy: CachePolicy, layers: &[u32], by_use: bool) -> Self {
        Self {
            map: LruCache::unbounded(),
            resident: 0,
            next_use: (policy == CachePolicy::NextUse).then(|| NextUse::new(layers)),
            now: 0,
            uses: HashMap::new(),
            since_aging: 0,
            by_use,
        }
    }

    /// The cache the streamer keeps for `budget` bytes where one token's routed experts take
    /// `token_bytes`: with recency, by use counts below that cliff and by recency above it.
    pub(crate) fn for_budget(
        policy: CachePolicy,
        layers: &[u32],
        budget: u64,
        token_bytes: u64,
    ) -> Self {
        Self::new(policy, layers, budget < token_bytes)
    }

    /// With recency, evicts by use counts (`true`: the budget is below one token's routed
    /// experts) or by recency; the next-use policy needs no switch at the cliff.
    pub(crate) fn set_by_use(&mut self, by_use: bool) {
        self.by_use = by_use;
    }

    /// Marks (layer, expert) used now and counts the use; true when it is resident.
    pub(crate) fn touch(&mut self, layer: u32, expert: u32) -> bool {
        if self.next_use.is_none() {
            self.count_use(layer, expert);
        }
        self.map.get(&(layer, expert)).is_some()
    }

    /// Counts a use for recency's counts, halving them all every [`AGE_EVERY`] uses.
    fn count_use(&mut self, layer: u32, expert: u32) {
        *self.uses.entry((layer, expert)).or_default() += 1;
        self.since_aging += 1;
        if self.since_aging >= AGE_EVERY {
            self.since_aging = 0;
            self.uses.retain(|_, n| {
                *n /= 2;
                *n > 0
            });
        }
    }

    /// Whether (layer, expert) is resident, without marking it used.
    pub(crate) fn contains(&self, layer: u32, expert: u32) -> bool {
        self.map.contains(&(layer, expert))
    }

    /// Records a newly read expert.
    pub(crate) fn insert(&mut self, layer: u32, expert: u32, bytes: u64) {
        if let Some(old) = self.map.put((layer, expert), bytes) {
            self.resident -= old;
        }
        self.resident += bytes;
    }

    /// Evicts entries until `need` more bytes fit in `budget`, calling `release` for each: the
    /// one expected to be used furthest ahead ([`NextUse`]), or with recency the least recently
    /// used first, or with `by_use` the least used (the most recent among equals). Entries
    /// `protect` names (what the current layer routes to, touched last, so at the most recent
    /// end) are never evicted. Returns how many were evicted.
    pub(crate) fn make_room(
        &mut self,
        need: u64,
        budget: u64,
        protect: impl Fn(&(u32, u32)) -> bool,
        mut release: impl FnMut((u32, u32)),
    ) -> u64 {
        let mut n = 0;
        while self.resident + need > budget {
            let victim = if let Some(nu) = &self.next_use {
                // Of equal estimates (experts their layers stopped choosing) the least recent.
                self.map
                    .iter()
                    .map(|(k, _)| *k)
                    .filter(|k| !protect(k))
                    // Each estimate once: `max_by` on the keys would compute both sides of every
                    // comparison.
                    .map(|k| (nu.expected(self.now, k), k))
                    .max_by(|a, b| a.0.total_cmp(&b.0))
                    .map(|(_, k)| k)
            } else if self.by_use {
                // From the most recent end: of equal counts the newest goes (see the module doc).
                self.map
                    .iter()
                    .map(|(k, _)| *k)
                    .filter(|k| !protect(k))
                    .min_by_key(|k| self.uses.get(k).copied().unwrap_or(0))
            } else {
                self.map.peek_lru().map(|(k, _)| *k).filter(|k| !protect(k))
            };
            let Some(k) = victim else {
                break;
            };
            let Some(b) = self.map.pop(&k) else {
                break;
            };
            self.resident -= b;
            release(k);
            n += 1;
        }
        n
    }

    /// After a wide piece's routing node in `layer` (`ids`: every token's experts): keeps the
    /// `share` experts the most tokens routed to where recency would put them, and moves the rest
    /// to the eviction end, fewest tokens last. A prompt routes to far more experts than decode
    /// keeps using; by recency alone the prompt's last layers would fill the cache and push out
    /// what decode needs in the first ones, while the experts many prompt tokens chose are the
    /// ones the next tokens choose again. The piece's own matmuls are done with them by the next
    /// routing node, where evictions happen.
    pub(crate) fn keep_popular(&mut self, layer: u32, ids: &[i32], share: usize) {
        let mut count: std::collections::BTreeMap<u32, usize> = Default::default();
        for &e in ids.iter().filter(|&&e| e >= 0) {
            *count.entry(e as u32).or_default() += 1;
        }
        let mut ranked: Vec<(usize, u32)> = count.into_iter().map(|(e, n)| (n, e)).collect();
        // Most tokens first; ties by expert id, so the order is the same on every run.
        ranked.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        for &(_, e) in ranked.iter().skip(share) {
            self.map.demote(&(layer, e));
        }
    }

    /// One routing node of layer `il` (`wanted`: per expert, whether the node routes to it)
    /// against a budget: touches each wanted expert in id order, then evicts (calling `release`
    /// for each) until the misses' `layer_bytes` each fit, never a wanted expert of the node.
    /// Returns the miss mask and how many were evicted. The streamer and the trace replay
    /// (`sim`) both run this, then [`Self::admit`] once the misses are in memory.
    pub(crate) fn route(
        &mut self,
        il: u32,
        wanted: &[bool],
        layer_bytes: u64,
        budget: u64,
        release: impl FnMut((u32, u32)),
    ) -> (Vec<bool>, u64) {
        self.now = il;
        let mut miss = vec![false; wanted.len()];
        for (e, _) in wanted.iter().enumerate().filter(|(_, &w)| w) {
            miss[e] = !self.touch(il, e as u32);
        }
        let need = miss.iter().filter(|&&m| m).count() as u64 * layer_bytes;
        let protect = |&(l, e): &(u32, u32)| l == il && wanted.get(e as usize) == Some(&true);
        let evicted = self.make_room(need, budget, protect, release);
        (miss, evicted)
    }

    /// After a routing node's reads: its `read` experts (in id order) become resident, and the
    /// node's routing (`node`: its ids, the budget and the model's MoE layers) enters the
    /// next-use estimate; with recency, after a piece wider than decode the layer keeps its share
    /// of the budget for the experts most of its tokens chose ([`Self::keep_popular`]).
    pub(crate) fn admit(&mut self, il: u32, read: &[bool], layer_bytes: u64, node: Routed) {
        for (e, _) in read.iter().enumerate().filter(|(_, &r)| r) {
            self.insert(il, e as u32, layer_bytes);
        }
        let decode = decode_sized(node.ids.len(), node.n_used);
        if let Some(nu) = self.next_use.as_mut() {
            nu.observe(il, node.ids, node.n_used, decode);
        } else if !decode {
            let share = (node.budget / layer_bytes.max(1)) as usize / node.n_layers.max(1);
            self.keep_popular(il, node.ids, share.max(node.n_used));
        }
    }

    /// Bytes resident.
    pub(crate) fn resident_bytes(&self) -> u64 {
        self.resident
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Evicts one entry and says which.
    fn evict_one(lru: &mut ExpertLru) -> (u32, u32) {
        let mut out = None;
        lru.make_room(1, lru.resident_bytes(), |_| false, |k| out = Some(k));
        out.expect("one eviction")
    }

    #[test]
    fn the_least_used_go_first_and_the_newest_among_equals() {
        let mut lru = ExpertLru::new(CachePolicy::Recency, &[0], true);
        for e in 0..4 {
            lru.insert(0, e, 1);
        }
        // Expert 0 is routed to three times, 2 once, 1 and 3 never (3 more recent than 1).
        for e in [0, 0, 2, 0] {
            lru.touch(0, e);
        }
        assert_eq!(evict_one(&mut lru), (0, 3));
        assert_eq!(evict_one(&mut lru), (0, 1));
        assert_eq!(evict_one(&mut lru), (0, 2));
        // A protected entry stays whatever its count.
        let mut out = vec![];
        lru.make_room(1, lru.resident_bytes(), |k| *k == (0, 0), |k| out.push(k));
        assert!(out.is_empty() && lru.contains(0, 0));
    }

    #[test]
    fn counts_halve_so_new_favourites_take_over() {
        let mut lru = ExpertLru::new(CachePolicy::Recency, &[0], true);
        lru.insert(0, 0, 1);
        lru.insert(0, 1, 1);
        for _ in 0..4000 {
            lru.touch(0, 0);
        }
        // Uses of an expert not held age the counts three times: 0's 4000 become 500.
        for _ in 0..AGE_EVERY * 3 {
            lru.touch(0, 2);
        }
        // Expert 1 is used 1000 times, fewer than 0 ever was but more than 0 lately.
        for _ in 0..1000 {
            lru.touch(0, 1);
        }
        assert_eq!(evict_one(&mut lru), (0, 0));
    }

    #[test]
    fn a_wide_piece_keeps_its_most_routed_experts_and_offers_the_rest_first() {
        let mut lru = ExpertLru::new(CachePolicy::Recency, &[0, 1], false);
        // Layer 0 was routed by an earlier piece; layer 1 now, by four tokens of two experts each.
        for e in [0, 1] {
            lru.insert(0, e, 1);
        }
        for e in [2, 3, 5, 7] {
            lru.insert(1, e, 1);
        }
        // Expert 5: four tokens, 7: two, 2: one, 3: one (ties go by id).
        let ids = [5, 7, 5, 2, 5, 3, 5, 7];
        lru.keep_popular(1, &ids, 2);
        // 5 and 7 stay where recency put them; 2 and 3 leave first, the later-ranked 3 before 2,
        // and only then the older layer's experts.
        assert_eq!(evict_one(&mut lru), (1, 3));
        assert_eq!(evict_one(&mut lru), (1, 2));
        assert_eq!(evict_one(&mut lru), (0, 0));
        assert!(lru.contains(1, 5) && lru.contains(1, 7));
    }
}
