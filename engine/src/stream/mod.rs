//! Expert streaming for CPU decode (`moe_stream`): expert tensors rebound onto engine-owned
//! address ranges, filled at each routing node with only the routed experts, read from the GGUF
//! by the direct reader, kept in an LRU within `cache_mb`.
//!
//! [`Streamer::ensure`] orchestrates four owners, each in its own file: the expert cache and its
//! budget under memory pressure (`expert_cache.rs`), the page moves into and out of the expert
//! regions (`pages.rs`), the reads (`reads.rs`), and prediction with reads ahead
//! (`read_ahead.rs`). The layers and the memory they are bound to are in `layers.rs`, the
//! routing trace the streamer writes in `tracing.rs`.
mod cache;
mod expert_cache;
mod layers;
pub(crate) mod lean_load;
pub mod lossy;
pub mod memory;
pub(crate) mod next_use;
pub mod page_moves;
mod pages;
pub mod prefetch;
pub mod pressure;
mod read_ahead;
mod read_threads;
mod reads;
mod repacked;
pub mod routing_stats;
pub mod sim;
pub mod trace;
mod tracing;

use std::collections::BTreeMap;
use std::time::Instant;

pub use crate::error::StreamError;
use crate::error::{EngineError, Result};
use crate::ffi::region::Region;
use crate::ffi::tensor::TensorPtr;
use crate::graph::{Capture, ExpertRole};
use crate::io::DirectReader;
use crate::options::{DenseWeights, StreamOptions};
use crate::telemetry::StreamCounters;
use crate::weights::table::WeightTable;
use crate::weights::Quiet;

use expert_cache::ExpertCache;
use layers::Layer;
use pages::Pages;
use read_ahead::ReadAhead;
use reads::Reads;
use tracing::Tracing;

pub(crate) use cache::MAX_PREFETCH_TOKENS;

/// The layer whose routing node dropped slots last, and which: its weight nodes zero them.
struct Dropped {
    layer: u32,
    /// Slots a token.
    n_used: usize,
    /// Per slot, whether it was dropped.
    slots: Vec<bool>,
}

/// What a streamer is built over: the model's captured graph, its expert matrices and where
/// their experts are in the file, and the experts a token routes to.
pub struct Experts<'a> {
    /// The one-token graph the load captured.
    pub capture: &'a Capture,
    /// The expert matrices found in it.
    pub table: &'a WeightTable,
    /// Experts a token routes to.
    pub n_expert_used: u32,
}

/// The streamer of one model.
pub struct Streamer {
    layers: BTreeMap<u32, Layer>,
    /// Shared slots reused by every layer when there is no cache, by role.
    shared: BTreeMap<ExpertRole, Region>,
    /// Copies of the dense weights (`dense_weights = anon`), kept alive here, with the weight
    /// bound to each.
    dense: Vec<(TensorPtr, Region)>,
    /// The CPU's repack marker, held while weights are tagged with it: a dense copy's tensor
    /// points at its buffer, and when no expert slice holds it too (experts in a type the CPU
    /// does not repack) it would otherwise be freed under the graph (issue 37's fuzz, seed 4:
    /// `GGML_ASSERT(buft)` at random in the scheduler).
    repack: Option<crate::ffi::repack::CpuRepack>,
    /// The AMX marker, held likewise while dense weights are converted to its layout.
    amx: Option<crate::ffi::amx::DenseAmx>,
    n_expert: u32,
    n_expert_used: usize,
    read_all: bool,
    counters: StreamCounters,
    /// Which experts stay resident, within a budget memory pressure moves.
    cache: ExpertCache,
    /// Page moves into and out of the expert regions.
    pages: Pages,
    /// The reads from the file.
    reads: Reads,
    /// Prediction and reads ahead.
    ahead: ReadAhead,
    /// The lossy routing knobs (both off by default).
    knobs: lossy::Knobs,
    dropped: Option<Dropped>,
    /// The routing trace being written (`routing_trace`).
    trace: Option<Tracing>,
}

/// A setup step's I/O failure, as the engine's error.
fn setup_err(what: &'static str) -> impl Fn(std::io::Error) -> EngineError + Copy {
    move |source| EngineError::Stream(StreamError::Setup { what, source })
}

/// Refuses a graph the streamer cannot serve: no expert matmul, or an MoE layer without a
/// routing node to read its ids at.
fn check_streamable(capture: &Capture) -> Result<()> {
    if capture.experts.is_empty() {
        return Err(EngineError::Unsupported(
            "expert streaming needs a mixture-of-experts model: this graph has no expert matmul (MUL_MAT_ID)".into(),
        ));
    }
    if let Some(il) = capture
        .experts
        .keys()
        .find(|il| !capture.routing.contains(il))
    {
        return Err(EngineError::Unsupported(format!(
            "expert streaming needs a routing node (ffn_moe_topk-<layer>) in every MoE layer; layer {il} has none in this architecture's graph"
        )));
    }
    Ok(())
}

impl Streamer {
    /// Reader lanes the streamer reads on (lanes `0..` of the model's reader): one per I/O thread,
    /// and the read-ahead lanes when a predictor runs.
    pub fn lanes(capture: &Capture, opts: &StreamOptions) -> usize {
        let prefetch = prefetch::Predictor::possible(&capture.routers, opts.prefetch);
        opts.io_threads + read_ahead::lanes(prefetch)
    }

    /// Rebinds the captured expert tensors (and, with `anon`, the dense weights) and prepares the
    /// reads, on lanes `0..Streamer::lanes()` of the model's `reader`. `budget_bytes` is the
    /// resolved cache size.
    pub fn new(
        src: Experts<'_>,
        opts: &StreamOptions,
        budget_bytes: u64,
        reader: std::sync::Arc<DirectReader>,
        quiet: &mut Quiet<'_>,
    ) -> Result<Self> {
        let Experts {
            capture,
            table,
            n_expert_used,
        } = src;
        check_streamable(capture)?;
        let found = layers::expert_layers(table, n_expert_used)?;
        let mut layers = found.layers;
        let shared = layers::bind_regions(&mut layers, budget_bytes, quiet)?;
        let dense = match opts.dense_weights {
            DenseWeights::Anon => layers::copy_dense(capture, &layers, |_| true, quiet)?,
            _ => Vec::new(),
        };
        let predictor = prefetch::Predictor::new(&capture.routers, opts.prefetch, quiet);
        let lanes_needed = opts.io_threads + read_ahead::lanes(predictor.is_some());
        Reads::check(&reader, lanes_needed, table.max_expert_bytes())?;
        let ahead = ReadAhead::start(predictor, &reader, opts)?;
        // What `Model::load` sized the reader by: the arena's lanes start after these.
        let reads = Reads::start(reader, opts, Self::lanes(capture, opts))?;
        let pages = Pages::new(&layers, page_moves::page_moves().moves());
        let shape = tracing::Shape {
            layers: layers
                .iter()
                .map(|(&il, l)| (il, l.expert_bytes()))
                .collect(),
            n_expert: found.n_expert,
            n_used: n_expert_used,
        };
        // One layer's predicted experts in flight, as the plan's "prefetch staging" line.
        let staging = match ahead.prefetched() {
            Some(_) => {
                layers.values().map(Layer::expert_bytes).max().unwrap_or(0)
                    * u64::from(n_expert_used)
            }
            None => 0,
        };
        let moe_layers: Vec<u32> = layers.keys().copied().collect();
        let cache = ExpertCache::new(budget_bytes, found.token_bytes, &moe_layers, opts)
            .with_staging(staging, !ahead.reading());
        let trace = Tracing::start(opts, shape, cache.budget())?;
        Ok(Self {
            layers,
            shared,
            dense,
            repack: None,
            amx: None,
            n_expert: found.n_expert,
            n_expert_used: n_expert_used as usize,
            read_all: opts.read_all_experts,
            counters: StreamCounters::default(),
            cache,
            pages,
            reads,
            ahead,
            knobs: lossy::Knobs {
                substitute: opts.expert_substitute,
                drop_cold: opts.drop_cold,
            },
            dropped: None,
            trace,
        })
    }

    /// The reader's lanes after the streamer's own, for the arena's loaders. Only a built
    /// streamer hands them out, so an arena that reads streamed experts is built after the
    /// streamer and records the streamer's bindings as the host ones it restores.
    pub fn later_lanes(&self) -> crate::io::Lanes {
        self.reads.later_lanes()
    }

    /// Bytes of routed experts one token reads when nothing is cached.
    pub fn token_bytes(&self) -> u64 {
        self.cache.token_bytes()
    }

    /// The cache budget in bytes as configured (0 = shared slots).
    pub fn budget_bytes(&self) -> u64 {
        self.cache.budget_bytes()
    }

    /// Whether each file is read with O_DIRECT.
    pub fn direct(&self) -> &[bool] {
        self.reads.direct()
    }

    /// The cache's budget now: its configured size, or less while memory pressure shrank it.
    pub fn budget(&self) -> u64 {
        self.cache.budget()
    }

    /// Samples memory pressure (at most every `pressure::POLL`) and moves the budget; the next
    /// evictions act on it. Each resize is said once and counted.
    fn watch_memory(&mut self, now: Instant) {
        let Some(r) = self.cache.watch(now) else {
            return;
        };
        match r {
            pressure::Resize::Shrink { .. } => self.counters.cache_shrinks += 1,
            pressure::Resize::Grow { .. } => self.counters.cache_grows += 1,
        }
        if let Some(t) = self.trace.as_mut() {
            t.budget(self.cache.budget());
        }
        eprintln!("bmoe: {r}");
    }

    /// Per layer, the experts the cache holds now (none without a cache: shared slots keep
    /// nothing from one layer to the next).
    pub fn cached_experts(&self) -> std::collections::HashMap<u32, Vec<bool>> {
        if !self.cache.is_on() {
            return Default::default();
        }
        self.layers
            .keys()
            .map(|&il| {
                let held = (0..self.n_expert)
                    .map(|e| self.cache.contains(il, e))
                    .collect();
                (il, held)
            })
            .collect()
    }

    /// Cumulative counters.
    pub fn counters(&self) -> StreamCounters {
        let mut c = self.counters.clone();
        if let Some((issued, used)) = self.ahead.prefetched() {
            c.prefetched = issued;
            c.prefetch_used = used;
            c.prefetch_moved = self.pages.adopted();
        }
        c.budget_bytes = self.budget();
        c.resident_bytes = self.cache.resident_bytes();
        c
    }

    /// `repack = auto` on a CPU decode: tags every expert matrix for the CPU's repacked
    /// `MUL_MAT_ID` where ggml chooses a repack for it, so each expert read from now on is
    /// repacked into its slot on the thread that reads it. Before any expert is read (a slot
    /// holds one layout or the other). The dense weights read only as a matmul's matrix (not in
    /// `capture.non_matmul`) are repacked in place once, where ggml chooses: the `anon` copies,
    /// or with mapped dense weights a copy of each one ggml chooses a layout for (the rest stay
    /// mapped, in the file's layout). Returns the weights tagged.
    pub fn repack_weights(&mut self, capture: &Capture, quiet: &mut Quiet<'_>) -> Result<usize> {
        let non_matmul = &capture.non_matmul;
        let mapped = self.dense.is_empty();
        // AMX first, as llama.cpp's loader walks the CPU's extra buffer types.
        let amx = repacked::amx_dense(capture, &self.layers, &mut self.dense, quiet)?;
        let in_amx: Vec<TensorPtr> = amx.as_ref().map(|a| a.1.clone()).unwrap_or_default();
        self.amx = amx.map(|a| a.0);
        let Some(cpu) = crate::ffi::repack::CpuRepack::new() else {
            return Ok(in_amx.len());
        };
        // Mapped dense weights cannot take another layout: those the CPU has a repacked kernel
        // for are copied first (as `anon` would), so every weight the resident load repacks is
        // repacked here too and streamed == resident holds (on ARM, Q8_0 has such kernels).
        if mapped {
            let layers = &self.layers;
            let wanted = |w: TensorPtr| {
                !non_matmul.contains(&w.name()) && !in_amx.contains(&w) && cpu.chooses(w)
            };
            // Beside the AMX copies made above.
            let copies = layers::copy_dense(capture, layers, wanted, quiet)?;
            self.dense.extend(copies);
        }
        let mut n = in_amx.len();
        for layer in self.layers.values_mut() {
            layer.repacks = repacked::tag_all(&cpu, &layer.tensors, quiet);
            n += layer.repacks.iter().flatten().count();
        }
        for (w, region) in &mut self.dense {
            if !non_matmul.contains(&w.name()) && !in_amx.contains(w) {
                n += usize::from(repacked::repack_copy(&cpu, *w, region, quiet)?);
            }
        }
        self.repack = Some(cpu);
        Ok(n)
    }

    /// The lossy routing knobs; off (`read_all_experts`, the reference of gate G3, reads every
    /// expert whatever they say).
    pub fn knobs(&self) -> lossy::Knobs {
        if self.read_all {
            return lossy::Knobs::default();
        }
        self.knobs
    }

    /// Replaces the lossy routing knobs (engine tests: `Model::set_lossy`).
    #[cfg(feature = "test-support")]
    pub fn set_knobs(&mut self, knobs: lossy::Knobs) {
        self.knobs = knobs;
    }

    /// Applies the lossy knobs to layer `il`'s routing `ids` (rows of `n_used`) in place before
    /// they are made resident: misses dropped or replaced by a cached expert whose probability in
    /// `probs` (rows of `n_expert`) is close, counted; only where a miss would evict (or there is
    /// no cache), never while the cache has room for the node's misses ([`Self::absorbs`]).
    /// Dropped slots are kept for the layer's weight nodes (`dropped_slots`). Returns whether any id changed.
    pub fn reroute(
        &mut self,
        il: u32,
        ids: &mut [i32],
        n_used: usize,
        probs: &[f32],
        n_expert: usize,
    ) -> bool {
        if self.absorbs(il, ids) {
            self.dropped = None;
            return false;
        }
        let cache = &self.cache;
        let cached = |e: u32| cache.contains(il, e);
        // The CPU's repacked kernels take each expert once per token (`lossy::repoint_dropped`).
        let twice_ok = self
            .layers
            .get(&il)
            .is_some_and(|l| l.repacks.iter().all(Option::is_none));
        let rows = lossy::Rows {
            n_used,
            probs,
            n_expert,
        };
        let r = lossy::rewrite(ids, rows, self.knobs(), cached, twice_ok);
        self.counters.substituted += r.substituted;
        self.counters.dropped += r.n_dropped;
        let changed = r.substituted > 0 || r.n_dropped > 0;
        self.dropped = (r.n_dropped > 0).then_some(Dropped {
            layer: il,
            n_used,
            slots: r.dropped,
        });
        changed
    }

    /// Whether the cache takes every expert `ids` misses in layer `il` without evicting: a cold
    /// miss while the cache fills is read once and kept, so the lossy knobs leave such a node as
    /// the router chose it (with the knobs, a 64 MiB cache on the tiny model substituted 31
    /// experts while it filled, each a lasting change for a read it had room for). Without a
    /// cache every miss is a read that is not kept: never.
    fn absorbs(&self, il: u32, ids: &[i32]) -> bool {
        self.layers
            .get(&il)
            .is_some_and(|layer| self.cache.absorbs(il, ids, layer.expert_bytes()))
    }

    /// The slots layer `il`'s routing node dropped (rows of the returned slots per token),
    /// whose weights are zeroed before its expert matmuls run.
    pub fn dropped_slots(&self, il: u32) -> Option<(usize, &[bool])> {
        match &self.dropped {
            Some(d) if d.layer == il => Some((d.n_used, &d.slots)),
            _ => None,
        }
    }

    /// Whether a routing trace is being written: the hook then reads the router's
    /// probabilities for it ([`Self::note_probs`]).
    pub fn tracing(&self) -> bool {
        self.trace.is_some()
    }

    /// Says whether the routing nodes served from now on are a prompt's or decode's (the trace
    /// records it).
    pub fn set_phase(&mut self, phase: trace::Phase) {
        if let Some(t) = self.trace.as_mut() {
            t.phase = phase;
        }
    }

    /// The router's probabilities at layer `il`'s routing node (rows of `n_expert`), for the
    /// trace's next node.
    pub fn note_probs(&mut self, il: u32, n_expert: usize, probs: Vec<f32>) {
        if let Some(t) = self.trace.as_mut() {
            t.note_probs(il, n_expert, probs);
        }
    }

    /// Writes what the trace has buffered (at the end of each generate, so a trace can be read
    /// while its model stays loaded).
    pub fn flush_trace(&mut self) -> std::result::Result<(), StreamError> {
        match self.trace.as_mut() {
            Some(t) => t.flush(),
            None => Ok(()),
        }
    }

    /// Whether `ids` (one routing node's experts, `n_expert_used` per token) come from a
    /// decode-sized graph: at most `MAX_PREFETCH_TOKENS` tokens.
    fn decode_sized(&self, ids: &[i32]) -> bool {
        cache::decode_sized(ids.len(), self.n_expert_used)
    }

    /// Makes the experts `ids` routes to in layer `il` resident before its matmuls run: which are
    /// wanted, which the cache lacks (evicting to make room), those read ahead or recycled, then
    /// the rest read from the file.
    pub fn ensure(&mut self, il: u32, ids: &[i32]) -> std::result::Result<(), StreamError> {
        let t0 = Instant::now();
        self.watch_memory(t0);
        let decode_sized = self.decode_sized(ids);
        let Some(layer_bytes) = self.layers.get(&il).map(Layer::expert_bytes) else {
            return Ok(());
        };
        // How good the last prediction for this layer was, whatever the cache made of it.
        let prediction = self.ahead.take_prediction(il);
        let wanted = self.wanted(il, ids, prediction.as_ref())?;
        if let Some(t) = self.trace.as_mut() {
            t.node(il, ids, self.n_expert_used.max(1))?;
        }
        let mut misses = self.cache_misses(il, &wanted, layer_bytes);
        // Score the candidates against the real misses, whether or not they were read ahead.
        if let Some(p) = &prediction {
            self.ahead.score(p, &misses);
        }
        let missed = misses.clone();
        let read = self.fill_misses(il, &mut misses, decode_sized);
        if self.cache.is_on() {
            // Nothing partially read may count as resident: after a failed read only what was
            // read ahead (cleared from `misses`) is.
            let admitted: Vec<bool> = match &read {
                Ok(()) => missed,
                Err(_) => missed.iter().zip(&misses).map(|(&m, &r)| m && !r).collect(),
            };
            let node = cache::Routed {
                ids,
                budget: self.budget(),
                n_layers: self.layers.len(),
                n_used: self.n_expert_used,
            };
            self.cache.admit(il, &admitted, layer_bytes, node);
        }
        self.counters.stall_s += t0.elapsed().as_secs_f64();
        self.ahead.time_node(t0, decode_sized);
        read.map_err(|source| StreamError::Read { layer: il, source })
    }

    /// The experts layer `il` routes to (every one with `read_all`), remembered for the
    /// predictors and scored against the last prediction.
    fn wanted(
        &mut self,
        il: u32,
        ids: &[i32],
        prediction: Option<&read_ahead::Prediction>,
    ) -> std::result::Result<Vec<bool>, StreamError> {
        if self.read_all {
            return Ok(vec![true; self.n_expert as usize]);
        }
        let wanted = crate::graph::routed_mask(il, ids, self.n_expert as usize)?;
        let routed: Vec<u32> = (0..wanted.len() as u32)
            .filter(|&e| wanted[e as usize])
            .collect();
        self.ahead
            .routed(il, routed, prediction, &mut self.counters);
        Ok(wanted)
    }

    /// Which wanted experts must be read: all of them without a cache; with one, those the cache
    /// lacks, after evicting (and keeping the pages of, within the move bound) enough for them.
    fn cache_misses(&mut self, il: u32, wanted: &[bool], layer_bytes: u64) -> Vec<bool> {
        let n_wanted = wanted.iter().filter(|&&w| w).count() as u64;
        let (layers, pages) = (&mut self.layers, &mut self.pages);
        let t0 = Instant::now();
        let evict = |(l, e): (u32, u32)| {
            if let Some(layer) = layers.get_mut(&l) {
                pages.evict(layer, e);
            }
        };
        let Some((miss, evicted)) = self.cache.route(il, wanted, layer_bytes, evict) else {
            self.counters.cache_misses += n_wanted;
            return wanted.to_vec();
        };
        let n_miss = miss.iter().filter(|&&m| m).count() as u64;
        self.counters.cache_misses += n_miss;
        self.counters.cache_hits += n_wanted - n_miss;
        self.counters.evictions += evicted;
        self.counters.evict_s += t0.elapsed().as_secs_f64();
        miss
    }

    /// Puts the missed experts of layer `il` into their regions: those read ahead moved in (and
    /// cleared from `misses`), evicted pages recycled for the rest, which are then read.
    fn fill_misses(
        &mut self,
        il: u32,
        misses: &mut [bool],
        decode_sized: bool,
    ) -> std::io::Result<()> {
        let layer = self.layers.get_mut(&il).expect("layer checked by ensure");
        let (mut pairs, reps) = layers::bound_pairs(layer, &mut self.shared, self.cache.is_on());
        let mut moves = self.pages.moves(&mut self.counters);
        if let Some(p) = self.ahead.prefetcher_mut() {
            moves.read_ahead(p, il, &mut pairs, &reps, misses);
        }
        moves.recycle(&mut pairs, misses);
        let jobs = reads::read_jobs(pairs, &reps, misses);
        self.reads.run(jobs, decode_sized, &mut self.counters)
    }

    /// After layer `il`'s routing node: reads ahead what the next MoE layer is predicted to route
    /// to, from the router input `router_input` gives (`n_embd` and the rows of `n_embd` values
    /// this layer's router read; asked for only when a prediction is made). Only for a few tokens
    /// at a time (decode): a wide prefill piece routes to nearly every expert anyway.
    pub fn prefetch_after(
        &mut self,
        il: u32,
        router_input: impl FnOnce() -> Option<(usize, Vec<f32>)>,
    ) {
        self.ahead.count_delivered();
        let Some(next) = self.ahead.next_layer(il) else {
            return;
        };
        // Reads ahead that start again take their staging back from the cache; the next routing
        // node evicts for it, so the first reads wait one node and never exceed the plan.
        let reading = self.ahead.reading();
        let moved = self.cache.lend(!reading);
        if let (true, Some(t)) = (moved, self.trace.as_mut()) {
            t.budget(self.cache.budget());
        }
        let took_back = moved && reading;
        let Some(layer) = self.layers.get(&next) else {
            return;
        };
        let cache = &self.cache;
        let dims = (self.n_expert, self.n_expert_used);
        let resident = |e: u32| cache.contains(next, e);
        let Some(experts) =
            self.ahead
                .predict(next, router_input, dims, resident, &mut self.counters)
        else {
            return;
        };
        if took_back {
            return;
        }
        let sources: Vec<prefetch::Source> = layer
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| prefetch::Source {
                parts: t.parts().map(<[_]>::to_vec).unwrap_or_default(),
                expert_bytes: t.expert_bytes,
                repack: layer.repacks.get(i).cloned().flatten(),
            })
            .collect();
        self.ahead.issue(next, &experts, &sources);
    }
}
