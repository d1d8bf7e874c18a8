//! Page moves into and out of the expert regions (`Region::adopt`, `Region::take_out`): an
//! evicted expert's pages kept for the next misses, pages read ahead moved in, all within the
//! bound the process's map limit sets.
use std::collections::BTreeMap;
use std::time::Instant;

use crate::ffi::region::Region;
use crate::ffi::repack::ExpertRepack;
use crate::telemetry::StreamCounters;
use crate::weights::table::ExpertMatrix;

use super::layers::Layer;
use super::prefetch::Prefetcher;

/// Page moves into and out of expert regions when a model has too many expert slices for the
/// bound below: each move may add two mappings, and a process may hold about 65,000
/// (`vm.max_map_count`).
const MAX_MOVES: u64 = 12_000;

/// Page moves a streamer may make over its life. Every mapping boundary a move leaves inside an
/// expert region lies at a slice edge (moves are whole slices), so a region never splits into
/// more mappings than it has slices: when all the slices together stay within half the
/// process's map limit (`map_limit`), moves need no count. Otherwise they stop after
/// `MAX_MOVES`.
fn move_allowance(slices: u64, map_limit: u64) -> u64 {
    if slices <= map_limit / 2 {
        u64::MAX
    } else {
        MAX_MOVES
    }
}

/// The process's map limit (`vm.max_map_count`, the kernel's default where unreadable).
fn map_limit() -> u64 {
    std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(65_530)
}

/// The streamer's page moves: what is left of the bound, the pages evictions gave up, and how
/// many slices came in from reads ahead.
pub(super) struct Pages {
    /// Page moves left (`u64::MAX` where the regions' mappings are bounded by their slices).
    moves_left: u64,
    /// Evicted pages are moved out and kept for the next misses (`page_moves`' self-check
    /// passed); otherwise they are released.
    keep_evicted: bool,
    /// Pages the evictions of the current routing node gave up, already faulted in, for its
    /// misses to be read into (whole-page expert slices only).
    spare: Vec<Region>,
    /// Expert slices whose pages were moved in from a read ahead.
    adopted: u64,
}

impl Pages {
    /// The page moves of a streamer over `layers`, kept where `keep_evicted` (the self-check
    /// passed).
    pub(super) fn new(layers: &BTreeMap<u32, Layer>, keep_evicted: bool) -> Self {
        let slices: u64 = layers
            .values()
            .flat_map(|l| l.tensors.iter().map(|t| t.n_expert as u64))
            .sum();
        Self {
            moves_left: move_allowance(slices, map_limit()),
            keep_evicted,
            spare: Vec::new(),
            adopted: 0,
        }
    }

    /// Expert slices whose pages were moved in from a read ahead.
    pub(super) fn adopted(&self) -> u64 {
        self.adopted
    }

    /// Gives up expert `e` of `layer`'s regions: its pages moved out and kept for this node's
    /// misses (within the bound), else released.
    pub(super) fn evict(&mut self, layer: &mut Layer, e: u32) {
        for (t, r) in layer.tensors.iter().zip(layer.regions.iter_mut()) {
            let (at, eb) = (e as usize * t.expert_bytes, t.expert_bytes);
            // Faulted-in pages kept for this node's misses: a fresh page costs a fault and its
            // zeroing, which on a small machine is most of a miss's CPU time besides the read.
            match (self.keep_evicted && self.moves_left > 0)
                .then(|| r.take_out(at, eb))
                .flatten()
            {
                Some(pages) => {
                    self.moves_left -= 1;
                    self.spare.push(pages);
                }
                None => {
                    r.release(at, eb);
                }
            }
        }
    }

    /// The moves of one routing node, counted in `counters`.
    pub(super) fn moves<'a>(&'a mut self, counters: &'a mut StreamCounters) -> Moves<'a> {
        Moves {
            pages: self,
            counters,
        }
    }
}

/// Page moves into one layer's regions, and what they count.
pub(super) struct Moves<'a> {
    pages: &'a mut Pages,
    counters: &'a mut StreamCounters,
}

impl Moves<'_> {
    /// Misses read ahead go straight in (their pages moved where the bound allows, else copied),
    /// cleared from `misses` (the caller admits them to the cache with the others).
    pub(super) fn read_ahead(
        &mut self,
        p: &mut Prefetcher,
        il: u32,
        pairs: &mut [(&ExpertMatrix, &mut Region)],
        reps: &[Option<&ExpertRepack>],
        misses: &mut [bool],
    ) {
        for (e, m) in misses.iter_mut().enumerate() {
            if !*m {
                continue;
            }
            let Some(bytes) = p.take(il, e as u32) else {
                continue;
            };
            for (((t, r), chunk), rp) in pairs.iter_mut().zip(bytes).zip(reps) {
                let (at, eb) = (e * t.expert_bytes, t.expert_bytes);
                // Repacked on the read-ahead lane that read it (`Source::repack`).
                self.counters.repacked += u64::from(rp.is_some());
                // Moving the pages in costs no copy and no page faults here.
                let t0 = Instant::now();
                let moved = if self.pages.moves_left > 0 {
                    r.adopt(at, eb, chunk)
                } else {
                    Err(chunk)
                };
                match moved {
                    Ok(()) => {
                        self.pages.adopted += 1;
                        self.pages.moves_left -= 1;
                    }
                    Err(mut chunk) => {
                        r.as_mut_slice()[at..at + eb].copy_from_slice(&chunk.as_mut_slice()[..eb])
                    }
                }
                self.counters.move_s += t0.elapsed().as_secs_f64();
                self.counters.read_bytes += eb as u64;
            }
            *m = false;
        }
    }

    /// The other misses go into the evicted experts' pages where a slice of the same size was
    /// given up; what is left of those is released.
    pub(super) fn recycle(&mut self, pairs: &mut [(&ExpertMatrix, &mut Region)], misses: &[bool]) {
        let t0 = Instant::now();
        let spare = &mut self.pages.spare;
        for (t, r) in pairs.iter_mut() {
            let eb = t.expert_bytes;
            for e in (0..misses.len()).filter(|&e| misses[e]) {
                let Some(i) = spare.iter().position(|p| p.len() == eb) else {
                    break;
                };
                if r.adopt(e * eb, eb, spare.swap_remove(i)).is_ok() {
                    self.counters.recycled += 1;
                    // The move out and this one in: each may split a mapping.
                    self.pages.moves_left = self.pages.moves_left.saturating_sub(1);
                }
            }
        }
        self.counters.move_s += t0.elapsed().as_secs_f64();
        self.pages.spare.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moves_are_counted_only_where_slices_could_exceed_the_map_limit() {
        assert_eq!(move_allowance(32_000, 65_530), u64::MAX);
        assert_eq!(move_allowance(32_766, 65_530), MAX_MOVES);
        assert_eq!(move_allowance(0, 0), u64::MAX);
    }
}
