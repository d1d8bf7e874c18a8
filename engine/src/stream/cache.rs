//! The expert cache's bookkeeping: an LRU over (layer, expert) with a byte budget.
use lru::LruCache;

/// LRU of resident experts with their bytes.
pub(crate) struct ExpertLru {
    map: LruCache<(u32, u32), u64>,
    resident: u64,
}

impl ExpertLru {
    pub(crate) fn new() -> Self {
        Self {
            map: LruCache::unbounded(),
            resident: 0,
        }
    }

    /// Marks (layer, expert) used now; true when it is resident.
    pub(crate) fn touch(&mut self, layer: u32, expert: u32) -> bool {
        self.map.get(&(layer, expert)).is_some()
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

    /// Drops an entry without releasing memory (its read failed).
    pub(crate) fn forget(&mut self, layer: u32, expert: u32) {
        if let Some(b) = self.map.pop(&(layer, expert)) {
            self.resident -= b;
        }
    }

    /// Evicts least recently used entries until `need` more bytes fit in `budget`, calling
    /// `release` for each. Entries `protect` names (what the current layer routes to, touched
    /// last, so at the MRU end) are never evicted. Returns how many were evicted.
    pub(crate) fn make_room(
        &mut self,
        need: u64,
        budget: u64,
        protect: impl Fn(&(u32, u32)) -> bool,
        mut release: impl FnMut((u32, u32)),
    ) -> u64 {
        let mut n = 0;
        while self.resident + need > budget {
            match self.map.peek_lru() {
                Some((k, _)) if !protect(k) => {}
                _ => break,
            }
            let Some((k, b)) = self.map.pop_lru() else {
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
    fn a_wide_piece_keeps_its_most_routed_experts_and_offers_the_rest_first() {
        let mut lru = ExpertLru::new();
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
