//! The streamer's expert cache: which experts stay resident between routing nodes, within a
//! budget that memory pressure may move (`cache_reserve_mb`). Without a cache (`cache_mb = 0`)
//! nothing stays: every layer's experts are read into shared slots.
use std::time::Instant;

use crate::options::StreamOptions;

use super::cache::{ExpertLru, Routed};
use super::pressure;

/// The expert cache and its budget.
pub(super) struct ExpertCache {
    /// Resident experts (`None`: no cache, shared slots).
    lru: Option<ExpertLru>,
    /// The cache budget in bytes (0 = shared slots).
    budget_bytes: u64,
    /// Bytes of routed experts one token reads when nothing is cached.
    token_bytes: u64,
    /// The budget as memory pressure moves it (`cache_reserve_mb`; `None`: it stays
    /// `budget_bytes`).
    pressure: Option<pressure::Watch>,
    /// The reads ahead's staging (planned apart from the cache), lent to the cache while they
    /// pause: a read-ahead that reads nothing costs the cache nothing.
    staging: u64,
    /// Whether `staging` is lent now.
    lending: bool,
}

impl ExpertCache {
    /// A cache of `budget_bytes` (none for 0) over the MoE `layers`, where one token's routed
    /// experts take `token_bytes`, with `opts`' policy, watched for memory pressure as `opts`
    /// says.
    pub(super) fn new(
        budget_bytes: u64,
        token_bytes: u64,
        layers: &[u32],
        opts: &StreamOptions,
    ) -> Self {
        let policy = opts.cache_policy;
        Self {
            lru: (budget_bytes > 0)
                .then(|| ExpertLru::for_budget(policy, layers, budget_bytes, token_bytes)),
            budget_bytes,
            token_bytes,
            pressure: (budget_bytes > 0 && opts.cache_reserve_mb > 0).then(|| {
                pressure::Watch::new(
                    budget_bytes,
                    opts.cache_min_mb << 20,
                    opts.cache_reserve_mb << 20,
                )
            }),
            staging: 0,
            lending: false,
        }
    }

    /// Lends the cache the reads ahead's `staging` bytes while they pause (from `lending`
    /// on); nothing without a cache, whose shared slots hold no more for it.
    pub(super) fn with_staging(mut self, staging: u64, lending: bool) -> Self {
        if self.is_on() {
            (self.staging, self.lending) = (staging, lending);
        }
        self
    }

    /// Lends the staging to the cache (`on`) or takes it back; whether the budget moved. Taken
    /// back, it is freed by the next routing node's evictions, before anything is read ahead.
    pub(super) fn lend(&mut self, on: bool) -> bool {
        let moved = self.lending != on && self.staging > 0;
        self.lending = on;
        moved
    }

    /// Whether experts stay resident between routing nodes (a budget above 0).
    pub(super) fn is_on(&self) -> bool {
        self.lru.is_some()
    }

    /// The configured budget in bytes (0 = shared slots).
    pub(super) fn budget_bytes(&self) -> u64 {
        self.budget_bytes
    }

    /// Bytes of routed experts one token reads when nothing is cached.
    pub(super) fn token_bytes(&self) -> u64 {
        self.token_bytes
    }

    /// The budget now: its configured size, or less while memory pressure shrank it, and the
    /// reads ahead's staging while it is lent.
    pub(super) fn budget(&self) -> u64 {
        let base = self
            .pressure
            .as_ref()
            .map_or(self.budget_bytes, pressure::Watch::budget);
        base + if self.lending { self.staging } else { 0 }
    }

    /// Whether expert `e` of layer `il` is resident (never without a cache).
    pub(super) fn contains(&self, il: u32, e: u32) -> bool {
        self.lru.as_ref().is_some_and(|l| l.contains(il, e))
    }

    /// Bytes resident (0 without a cache).
    pub(super) fn resident_bytes(&self) -> u64 {
        self.lru.as_ref().map_or(0, ExpertLru::resident_bytes)
    }

    /// Samples memory pressure (at most every `pressure::POLL`) and moves the budget, evicting
    /// by use counts from then on where it fell below one token's routed experts; the resize,
    /// when there was one.
    pub(super) fn watch(&mut self, now: Instant) -> Option<pressure::Resize> {
        let (Some(w), Some(lru)) = (self.pressure.as_mut(), self.lru.as_mut()) else {
            return None;
        };
        let r = w.poll(now, lru.resident_bytes())?;
        lru.set_by_use(w.budget() < self.token_bytes);
        Some(r)
    }

    /// Whether the cache takes every expert `ids` misses in layer `il` (experts of
    /// `layer_bytes`) without evicting. Without a cache every miss is a read that is not kept:
    /// never.
    pub(super) fn absorbs(&self, il: u32, ids: &[i32], layer_bytes: u64) -> bool {
        let Some(lru) = &self.lru else {
            return false;
        };
        let mut missed: Vec<u32> = ids
            .iter()
            .filter_map(|&e| u32::try_from(e).ok())
            .filter(|&e| !lru.contains(il, e))
            .collect();
        missed.sort_unstable();
        missed.dedup();
        lru.resident_bytes() + missed.len() as u64 * layer_bytes <= self.budget()
    }

    /// One routing node of layer `il` against the budget now (see [`ExpertLru::route`]): the
    /// miss mask and how many were evicted, `release` called for each; `None` without a cache.
    pub(super) fn route(
        &mut self,
        il: u32,
        wanted: &[bool],
        layer_bytes: u64,
        release: impl FnMut((u32, u32)),
    ) -> Option<(Vec<bool>, u64)> {
        let budget = self.budget();
        let lru = self.lru.as_mut()?;
        Some(lru.route(il, wanted, layer_bytes, budget, release))
    }

    /// After a routing node's reads: its `read` experts become resident (see
    /// [`ExpertLru::admit`]); nothing without a cache.
    pub(super) fn admit(&mut self, il: u32, read: &[bool], layer_bytes: u64, node: Routed) {
        if let Some(lru) = self.lru.as_mut() {
            lru.admit(il, read, layer_bytes, node);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(reserve_mb: u64) -> StreamOptions {
        StreamOptions {
            cache_reserve_mb: reserve_mb,
            ..StreamOptions::default()
        }
    }

    /// A decode node of one token routing to `ids`.
    fn node(ids: &[i32]) -> Routed<'_> {
        Routed {
            ids,
            budget: 30,
            n_layers: 2,
            n_used: ids.len(),
        }
    }

    #[test]
    fn no_budget_no_cache() {
        let mut c = ExpertCache::new(0, 100, &[0, 1], &opts(64));
        assert!(!c.is_on());
        assert_eq!(c.budget(), 0);
        assert!(!c.absorbs(0, &[1, 2], 10));
        assert!(c.route(0, &[true], 10, |_| {}).is_none());
        assert!(!c.contains(0, 0));
        assert!(c.watch(Instant::now()).is_none());
    }

    #[test]
    fn a_node_is_absorbed_while_its_misses_fit_the_budget() {
        let mut c = ExpertCache::new(30, 20, &[0, 1], &opts(0));
        assert!(c.is_on());
        // Two distinct misses of 10 bytes each fit 30; three repeated ids count once.
        assert!(c.absorbs(0, &[1, 2, 2, -1], 10));
        let (miss, evicted) = c
            .route(0, &[false, true, true], 10, |_| {})
            .expect("a cache");
        assert_eq!((miss, evicted), (vec![false, true, true], 0));
        c.admit(0, &[false, true, true], 10, node(&[1, 2]));
        assert!(c.contains(0, 1) && c.contains(0, 2));
        assert_eq!(c.resident_bytes(), 20);
        // Resident experts cost nothing; two new ones would take 40 bytes of 30.
        assert!(c.absorbs(0, &[1, 2], 10));
        assert!(c.absorbs(0, &[1, 3], 10));
        assert!(!c.absorbs(0, &[3, 4], 10));
    }

    #[test]
    fn the_staging_is_lent_while_reads_ahead_pause() {
        let mut c = ExpertCache::new(30, 20, &[0, 1], &opts(0)).with_staging(20, true);
        assert_eq!(c.budget(), 50);
        // Four experts of 10 fit while the staging is lent.
        c.route(0, &[true, true, true, true], 10, |_| {});
        c.admit(0, &[true, true, true, true], 10, node(&[0, 1, 2, 3]));
        assert_eq!(c.resident_bytes(), 40);
        // Taken back, the next routing node evicts down to the cache's own 30 (and room for its
        // miss) before anything is read ahead.
        assert!(c.lend(false));
        assert!(!c.lend(false));
        assert_eq!(c.budget(), 30);
        let (_, evicted) = c.route(1, &[true], 10, |_| {}).expect("a cache");
        assert_eq!((evicted, c.resident_bytes()), (2, 20));
        // Without a cache there is nothing to lend to.
        let c = ExpertCache::new(0, 20, &[0, 1], &opts(0)).with_staging(20, true);
        assert_eq!(c.budget(), 0);
    }

    #[test]
    fn evictions_are_released_to_the_caller() {
        let mut c = ExpertCache::new(20, 20, &[0, 1], &opts(0));
        c.route(0, &[true, true], 10, |_| {});
        c.admit(0, &[true, true], 10, node(&[0, 1]));
        let mut released = Vec::new();
        let (miss, evicted) = c
            .route(1, &[true], 10, |k| released.push(k))
            .expect("a cache");
        assert_eq!((miss, evicted), (vec![true], 1));
        assert_eq!(released.len(), 1);
    }
}
