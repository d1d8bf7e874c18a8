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

    /// Bytes resident.
    pub(crate) fn resident_bytes(&self) -> u64 {
        self.resident
    }
}
