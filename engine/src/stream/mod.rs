//! Expert streaming for CPU decode (`moe_stream`): expert tensors rebound onto engine-owned
//! address ranges, filled at each routing node with only the routed experts, read from the GGUF
//! by the direct reader, kept in an LRU within `cache_mb`.
mod cache;
pub(crate) mod lean_load;
pub mod lossy;
pub mod memory;
pub mod page_moves;
pub mod prefetch;
pub mod pressure;
mod read_threads;
mod repacked;
pub mod routing_stats;
pub mod sim;
pub mod trace;

use std::collections::BTreeMap;
use std::time::Instant;

use rayon::prelude::*;

pub use crate::error::StreamError;
use crate::error::{EngineError, Result};
use crate::ffi::region::Region;
use crate::ffi::repack::ExpertRepack;
use crate::ffi::tensor::TensorPtr;
use crate::graph::{Capture, ExpertRole};
use crate::io::DirectReader;
use crate::options::{DenseWeights, Prefetch, StreamOptions};
use crate::telemetry::StreamCounters;
use crate::weights::table::{ExpertMatrix, WeightTable};
use crate::weights::{residency, Quiet};

use cache::ExpertLru;

/// Reader lanes (and threads) of their own for reads ahead.
const PREFETCH_LANES: usize = 2;

/// Reads ahead stop while fewer than this share of recent candidates were misses.
const MIN_PRECISION: f64 = 0.5;
/// Candidates scored before the share is trusted.
const CANDIDATE_WARMUP: f64 = 64.0;
/// The candidates' counts are halved past this, so the share follows recent routing.
const CANDIDATE_WINDOW: f64 = 512.0;

/// While reads ahead are paused, predictions are still made and scored, on one routing node in
/// this many (prime, so the sampled layers rotate from token to token): a prediction costs a
/// copy of the router input and a matrix-vector product on the compute thread, most of a
/// percent of decode each on a small machine, for reads that are not issued.
const PAUSED_SAMPLE: u64 = 7;

pub(crate) use cache::MAX_PREFETCH_TOKENS;

/// Page moves into and out of expert regions (`Region::adopt`, `Region::take_out`) when a model
/// has too many expert slices for the bound below: each move may add two mappings, and a process
/// may hold about 65,000 (`vm.max_map_count`).
const MAX_MOVES: u64 = 12_000;

/// Below this many bytes per routing node, reads run on the calling thread.
const INLINE_READ_BYTES: usize = 1 << 20;

/// A decode-sized routing node with fewer expert slices than this to read reads them on the
/// calling thread; with more, on the lanes. A model that mostly hits its cache misses an expert
/// or two per layer (3-6 slices), where waking the lanes costs more than it saves; ten times
/// larger than its memory, a layer misses most of its eight experts (about 24 slices), and
/// random 576 KiB `O_DIRECT` reads four at a time ran at 1.45x the rate of one at a time here
/// (`scripts/bench-disk`).
const DECODE_INLINE_SLICES: usize = 8;

/// What reads ahead delivered is multiplied by this at each sampled node while they are paused.
const AHEAD_FADE: f64 = 0.99;

/// Weight of the newest decode-sized routing node in the read share (an exponential average over
/// about this many nodes' inverse).
const READ_SHARE_WEIGHT: f64 = 1.0 / 32.0;

struct Layer {
    /// The layer's expert matrices, each checked to be readable expert by expert from the file.
    tensors: Vec<ExpertMatrix>,
    /// One region per tensor (cache mode); empty in shared-slot mode.
    regions: Vec<Region>,
    /// Per tensor, how its experts are repacked for the CPU's repacked kernels (`repack =
    /// auto`); empty, or `None`, where they stay in the file's layout.
    repacks: Vec<Option<ExpertRepack>>,
}

/// The streamer of one model.
pub struct Streamer {
    layers: BTreeMap<u32, Layer>,
    /// Shared slots reused by every layer when there is no cache, by role.
    shared: BTreeMap<ExpertRole, Region>,
    reader: std::sync::Arc<DirectReader>,
    pool: rayon::ThreadPool,
    /// Two read buffers a decode node's repacked slices are read into, each repacked out of one
    /// while the next is read into the other (`repacked::run_pipelined`).
    pipe: Vec<Region>,
    /// The thread that repacks out of `pipe`.
    repacker: rayon::ThreadPool,
    predictor: Option<prefetch::Predictor>,
    prefetcher: Option<prefetch::Prefetcher>,
    /// Per layer, the experts its last routing node chose (the `repeat` predictor).
    last_routed: BTreeMap<u32, Vec<u32>>,
    /// The last prediction made: (layer, experts, the ones not resident then), scored at that
    /// layer's routing node.
    prediction: Option<(u32, Vec<u32>, Vec<u32>)>,
    /// Recent reads-ahead candidates and how many of them turned out to be misses, decayed: reads
    /// ahead are issued only while enough of them pay (see `worth_reading_ahead`).
    candidates: (f64, f64),
    /// Routing nodes seen while reads ahead were paused (see `PAUSED_SAMPLE`).
    paused_nodes: u64,
    /// Experts read ahead and how many of them served a miss, decayed like `candidates`: what
    /// reads ahead really delivered, and `(issued, used)` of the prefetcher when last counted.
    ahead: (f64, f64),
    ahead_seen: (u64, u64),
    /// Decode's wait at routing nodes (reads) and compute between them, in seconds, each averaged
    /// over recent decode-sized nodes: wait / (wait + compute) is how read-bound decode is (see
    /// `worth_reading_ahead`).
    read_share: (f64, f64),
    /// When the last decode-sized routing node was done (`None` after a wider piece), to time
    /// the compute between nodes.
    last_node_end: Option<Instant>,
    n_expert_used: usize,
    lru: Option<ExpertLru>,
    n_expert: u32,
    read_all: bool,
    counters: StreamCounters,
    /// Expert slices whose pages were moved in from a read ahead.
    adopted: u64,
    /// Page moves left (`u64::MAX` where the regions' mappings are bounded by their slices).
    moves_left: u64,
    /// Evicted pages are moved out and kept for the next misses (`page_moves`' self-check
    /// passed); otherwise they are released.
    keep_evicted: bool,
    /// Pages the evictions of the current routing node gave up, already faulted in, for its
    /// misses to be read into (whole-page expert slices only).
    spare: Vec<Region>,
    /// Copies of the dense weights (`dense_weights = anon`), kept alive here, with the weight
    /// bound to each.
    dense: Vec<(TensorPtr, Region)>,
    /// The CPU's repack marker, held while weights are tagged with it: a dense copy's tensor
    /// points at its buffer, and when no expert slice holds it too (experts in a type the CPU
    /// does not repack) it would otherwise be freed under the graph (issue 37's fuzz, seed 4:
    /// `GGML_ASSERT(buft)` at random in the scheduler).
    repack: Option<crate::ffi::repack::CpuRepack>,
    /// Bytes of routed experts one token reads when nothing is cached.
    pub token_bytes: u64,
    /// The cache budget in bytes (0 = shared slots).
    pub budget_bytes: u64,
    /// The budget as memory pressure moves it (`cache_reserve_mb`; `None`: it stays
    /// `budget_bytes`).
    pressure: Option<pressure::Watch>,
    /// Whether each file is read with O_DIRECT.
    pub direct: Vec<bool>,
    /// Reader lanes this streamer reads on (`0..own_lanes`).
    own_lanes: usize,
    /// The lossy routing knobs (both off by default).
    knobs: lossy::Knobs,
    /// The layer whose routing node dropped slots last, and which: its weight nodes zero them.
    dropped: Option<(u32, usize, Vec<bool>)>,
    /// The routing trace being written (`routing_trace`), and what it records.
    trace: Option<Tracing>,
}

/// What a routing trace records besides the ids `ensure` gets.
struct Tracing {
    out: trace::Writer,
    /// Prompt or decode (`Streamer::set_phase`).
    phase: trace::Phase,
    /// Tokens seen at the first MoE layer, and the first token of the piece being served.
    tokens: u64,
    piece: u64,
    first_layer: u32,
    /// The router's probabilities at the routing node being served: (layer, experts a row,
    /// rows of them).
    probs: Option<(u32, usize, Vec<f32>)>,
}

/// Page moves a streamer may make over its life. Every mapping boundary a move leaves inside an
/// expert region lies at a slice edge (moves are whole slices), so a region never splits into
/// more mappings than it has slices: when all the slices together stay within half the
/// process's map limit, moves need no count. Otherwise they stop after `MAX_MOVES`.
fn move_allowance(layers: &BTreeMap<u32, Layer>) -> u64 {
    let slices: u64 = layers
        .values()
        .flat_map(|l| l.tensors.iter().map(|t| t.n_expert as u64))
        .sum();
    let map_limit = std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(65_530);
    if slices <= map_limit / 2 {
        u64::MAX
    } else {
        MAX_MOVES
    }
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

/// Each layer's expert matrices (their parts checked to be in the file), the most experts a
/// layer has, and the bytes one token's routed experts take.
fn expert_layers(
    table: &WeightTable,
    n_expert_used: u32,
) -> Result<(BTreeMap<u32, Layer>, u32, u64)> {
    let mut layers = BTreeMap::new();
    let mut n_expert = 0u32;
    let mut token_bytes = 0u64;
    for (il, matrices) in table.layers() {
        let mut tensors = Vec::new();
        let mut layer_expert_bytes = 0u64;
        for m in matrices {
            m.parts()
                .map_err(|e| EngineError::Stream(StreamError::NotInFile(e)))?;
            n_expert = n_expert.max(m.n_expert as u32);
            layer_expert_bytes += m.expert_bytes as u64;
            tensors.push(m.clone());
        }
        token_bytes += layer_expert_bytes * u64::from(n_expert_used);
        layers.insert(
            il,
            Layer {
                tensors,
                regions: Vec::new(),
                repacks: Vec::new(),
            },
        );
    }
    Ok((layers, n_expert, token_bytes))
}

/// Binds every expert tensor onto reserved memory: its own region with a cache, or without one
/// a slot per role shared by every layer (sized for the largest); returns the shared slots.
fn bind_regions(
    layers: &mut BTreeMap<u32, Layer>,
    budget_bytes: u64,
    quiet: &mut Quiet<'_>,
) -> Result<BTreeMap<ExpertRole, Region>> {
    let io_err = setup_err("reserving expert memory");
    let mut shared = BTreeMap::new();
    if budget_bytes > 0 {
        for layer in layers.values_mut() {
            for t in &layer.tensors {
                let r = Region::reserve(t.tensor.nbytes()).map_err(io_err)?;
                residency::onto_region(t.tensor, &r, quiet).map_err(EngineError::Weight)?;
                layer.regions.push(r);
            }
        }
        return Ok(shared);
    }
    for layer in layers.values() {
        for t in &layer.tensors {
            let need = t.tensor.nbytes();
            let fits = shared
                .get(&t.role)
                .is_some_and(|r: &Region| r.len() >= need);
            if !fits {
                shared.insert(t.role, Region::reserve(need).map_err(io_err)?);
            }
        }
    }
    for layer in layers.values() {
        for t in &layer.tensors {
            residency::onto_region(t.tensor, &shared[&t.role], quiet)
                .map_err(EngineError::Weight)?;
        }
    }
    Ok(shared)
}

/// `dense_weights = anon`: every other weight the graph reads copied into engine-owned memory.
fn copy_dense(
    capture: &Capture,
    layers: &BTreeMap<u32, Layer>,
    wanted: impl Fn(TensorPtr) -> bool,
    quiet: &mut Quiet<'_>,
) -> Result<Vec<(TensorPtr, Region)>> {
    let io_err = setup_err("reserving expert memory");
    let expert_ptrs: Vec<TensorPtr> = layers
        .values()
        .flat_map(|l| l.tensors.iter().map(|t| t.tensor))
        .collect();
    let mut dense = Vec::new();
    for w in capture
        .weights
        .values()
        .filter(|w| !expert_ptrs.contains(w) && wanted(**w))
    {
        let mut r = Region::reserve(w.nbytes()).map_err(io_err)?;
        residency::copied_into(*w, &mut r, quiet).map_err(EngineError::Weight)?;
        dense.push((*w, r));
    }
    Ok(dense)
}

/// The read-ahead threads (when a predictor runs) and the reader lanes' pool, on a reader
/// checked to have the lanes and the bounce buffer they need.
fn start_readers(
    reader: &std::sync::Arc<DirectReader>,
    opts: &StreamOptions,
    predicts: bool,
    max_read: usize,
) -> Result<(Option<prefetch::Prefetcher>, rayon::ThreadPool)> {
    let prefetch_lanes = if predicts { PREFETCH_LANES } else { 0 };
    if reader.lanes() < opts.io_threads + prefetch_lanes || reader.max_read() < max_read {
        return Err(setup_err("sharing the model's reader")(
            std::io::Error::other(
                "the reader has fewer lanes or a smaller bounce buffer than the streamer needs",
            ),
        ));
    }
    let prefetcher = if predicts {
        Some(
            prefetch::Prefetcher::new(reader.clone(), opts.io_threads, prefetch_lanes, &opts.cpus)
                .map_err(setup_err("starting prefetch threads"))?,
        )
    } else {
        None
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(opts.io_threads.max(1))
        .thread_name(|i| format!("bmoe-io-{i}"))
        // Off the compute threads' cores where the caller named others; a failed pin leaves
        // the thread where the kernel put it (slower at worst, never wrong).
        .start_handler({
            let cpus = opts.cpus.clone();
            move |_| {
                let _ = crate::ffi::affinity::pin_current_thread(&cpus);
            }
        })
        .build()
        .map_err(|e| setup_err("starting reader threads")(std::io::Error::other(e)))?;
    Ok((prefetcher, pool))
}

/// The routing trace `opts.routing_trace` names, its header written: each layer's bytes per
/// expert, the experts per layer and per token, the budget.
fn start_trace(
    opts: &StreamOptions,
    layers: &BTreeMap<u32, Layer>,
    (n_expert, n_used): (u32, u32),
    budget_bytes: u64,
) -> Result<Option<Tracing>> {
    let Some(path) = &opts.routing_trace else {
        return Ok(None);
    };
    let per_layer: Vec<(u32, u64)> = layers
        .iter()
        .map(|(&il, l)| (il, l.tensors.iter().map(|t| t.expert_bytes as u64).sum()))
        .collect();
    let header = trace::Header {
        bmoe_routing_trace: trace::VERSION,
        n_expert,
        n_expert_used: n_used,
        token_bytes: per_layer.iter().map(|(_, b)| b * u64::from(n_used)).sum(),
        layers: per_layer,
        budget_bytes,
        prefetch: format!("{:?}", opts.prefetch).to_lowercase(),
    };
    let out = trace::Writer::create(path, &header).map_err(|source| {
        EngineError::Stream(StreamError::Trace {
            path: path.clone(),
            source,
        })
    })?;
    Ok(Some(Tracing {
        out,
        phase: trace::Phase::Prompt,
        tokens: 0,
        piece: 0,
        first_layer: layers.keys().next().copied().unwrap_or(0),
        probs: None,
    }))
}

/// Page moves into a layer's regions, bounded (each may split a mapping in two, and the kernel's
/// map count is limited), and what they count.
struct Moves<'a> {
    left: &'a mut u64,
    adopted: &'a mut u64,
    counters: &'a mut StreamCounters,
}

impl Moves<'_> {
    /// Misses read ahead go straight in (their pages moved where the bound allows, else copied),
    /// cleared from `misses` (the caller admits them to the cache with the others).
    fn read_ahead(
        &mut self,
        p: &mut prefetch::Prefetcher,
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
                let moved = if *self.left > 0 {
                    r.adopt(at, eb, chunk)
                } else {
                    Err(chunk)
                };
                match moved {
                    Ok(()) => {
                        *self.adopted += 1;
                        *self.left -= 1;
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
    /// given up.
    fn recycle(
        &mut self,
        spare: &mut Vec<Region>,
        pairs: &mut [(&ExpertMatrix, &mut Region)],
        misses: &[bool],
    ) {
        let t0 = Instant::now();
        for (t, r) in pairs.iter_mut() {
            let eb = t.expert_bytes;
            for e in (0..misses.len()).filter(|&e| misses[e]) {
                let Some(i) = spare.iter().position(|p| p.len() == eb) else {
                    break;
                };
                if r.adopt(e * eb, eb, spare.swap_remove(i)).is_ok() {
                    self.counters.recycled += 1;
                    // The move out and this one in: each may split a mapping.
                    *self.left = self.left.saturating_sub(1);
                }
            }
        }
        self.counters.move_s += t0.elapsed().as_secs_f64();
    }
}

/// The reads of each missed expert: one positioned read per piece in the file's layout, or one
/// job per expert (all its pieces, then its repack) where the matrix is repacked.
fn read_jobs<'a>(
    pairs: Vec<(&ExpertMatrix, &'a mut Region)>,
    reps: &[Option<&'a ExpertRepack>],
    misses: &[bool],
) -> Vec<repacked::Job<'a>> {
    let mut jobs = Vec::new();
    for ((t, region), rp) in pairs.into_iter().zip(reps) {
        let eb = t.expert_bytes;
        for (e, dst) in region
            .as_mut_slice()
            .chunks_mut(eb)
            .enumerate()
            .take(misses.len())
        {
            if !misses[e] {
                continue;
            }
            if rp.is_some() {
                jobs.push(repacked::Job {
                    dst,
                    pieces: t.pieces_of(e).collect(),
                    repack: *rp,
                });
                continue;
            }
            let mut rest = dst;
            for (file, offset, len) in t.pieces_of(e) {
                let (piece, tail) = rest.split_at_mut(len);
                jobs.push(repacked::Job {
                    dst: piece,
                    pieces: vec![(file, offset, len)],
                    repack: None,
                });
                rest = tail;
            }
        }
    }
    jobs
}

/// Reads the jobs and counts their time and bytes; the first error, if any, after all ran.
fn read_all(
    reader: &DirectReader,
    pool: &rayon::ThreadPool,
    jobs: Vec<repacked::Job<'_>>,
    (decode_sized, pipe, repacker): (bool, &mut [Region], &rayon::ThreadPool),
    counters: &mut StreamCounters,
) -> std::io::Result<()> {
    let total: usize = jobs.iter().map(|j| j.dst.len()).sum();
    // Small batches, and a decode-sized graph's few misses, are read on the calling thread,
    // whose compute threads wait for them anyway. Waking the lanes costs more than it saves
    // there: rayon's idle lanes spin and yield for a while after each batch, on the very cores
    // the next graph's compute threads need. Many misses (`DECODE_INLINE_SLICES`) go to the
    // lanes, where reads in flight together run faster.
    let results: Vec<std::io::Result<repacked::Done>> = if total < INLINE_READ_BYTES
        || jobs.len() < 2
        || (decode_sized && jobs.len() < DECODE_INLINE_SLICES)
    {
        // A decode node's few repacked slices: each repacked while the next is read.
        if decode_sized && pipe.len() >= 2 && repacked::pipelines(&jobs) {
            repacked::run_pipelined(reader, 0, jobs, pipe, repacker)
        } else {
            jobs.into_iter().map(|j| j.run(reader, 0)).collect()
        }
    } else {
        pool.install(|| {
            jobs.into_par_iter()
                .map(|j| j.run(reader, rayon::current_thread_index().unwrap_or(0)))
                .collect()
        })
    };
    let mut first_err = None;
    for r in results {
        match r {
            Ok(d) => {
                counters.read_s += d.read_s;
                counters.read_bytes += d.bytes as u64;
                if let Some(s) = d.repack_s {
                    counters.repacked += 1;
                    counters.repack_s += s;
                }
            }
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    first_err.map_or(Ok(()), Err)
}

impl Streamer {
    /// Reader lanes the streamer reads on (lanes `0..` of the model's reader): one per I/O thread,
    /// and the read-ahead lanes when a predictor runs.
    pub fn lanes(capture: &Capture, opts: &StreamOptions) -> usize {
        let prefetch = prefetch::Predictor::possible(&capture.routers, opts.prefetch);
        opts.io_threads + if prefetch { PREFETCH_LANES } else { 0 }
    }

    /// Rebinds the captured expert tensors (and, with `anon`, the dense weights) and prepares the
    /// reads, on lanes `0..Streamer::lanes()` of the model's `reader`. `budget_bytes` is the
    /// resolved cache size.
    pub fn new(
        capture: &Capture,
        table: &WeightTable,
        opts: &StreamOptions,
        budget_bytes: u64,
        n_expert_used: u32,
        reader: std::sync::Arc<DirectReader>,
        quiet: &mut Quiet<'_>,
    ) -> Result<Self> {
        check_streamable(capture)?;
        let max_read = table.max_expert_bytes();
        let (mut layers, n_expert, token_bytes) = expert_layers(table, n_expert_used)?;
        let shared = bind_regions(&mut layers, budget_bytes, quiet)?;
        let dense = match opts.dense_weights {
            DenseWeights::Anon => copy_dense(capture, &layers, |_| true, quiet)?,
            _ => Vec::new(),
        };
        let predictor = prefetch::Predictor::new(&capture.routers, opts.prefetch, quiet);
        let (prefetcher, pool) = start_readers(&reader, opts, predictor.is_some(), max_read)?;
        let direct = reader.direct().to_vec();
        let pipe = (0..2)
            .map(|_| reader.bounce())
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(setup_err("reserving read buffers"))?;
        let moves_left = move_allowance(&layers);
        let keep_evicted = page_moves::page_moves().moves();
        let trace = start_trace(opts, &layers, (n_expert, n_expert_used), budget_bytes)?;
        Ok(Self {
            layers,
            shared,
            reader,
            pool,
            pipe,
            repacker: rayon::ThreadPoolBuilder::new()
                .num_threads(1)
                .thread_name(|_| "bmoe-repack".into())
                .build()
                .map_err(|e| {
                    setup_err("starting the repacking thread")(std::io::Error::other(e))
                })?,
            predictor,
            prefetcher,
            last_routed: BTreeMap::new(),
            prediction: None,
            candidates: (0.0, 0.0),
            paused_nodes: 0,
            read_share: (0.0, 0.0),
            ahead: (0.0, 0.0),
            ahead_seen: (0, 0),
            last_node_end: None,
            n_expert_used: n_expert_used as usize,
            lru: (budget_bytes > 0).then(|| ExpertLru::for_budget(budget_bytes, token_bytes)),
            n_expert,
            read_all: opts.read_all_experts,
            counters: StreamCounters::default(),
            adopted: 0,
            moves_left,
            keep_evicted,
            spare: Vec::new(),
            dense,
            repack: None,
            token_bytes,
            budget_bytes,
            pressure: (budget_bytes > 0 && opts.cache_reserve_mb > 0).then(|| {
                pressure::Watch::new(
                    budget_bytes,
                    opts.cache_min_mb << 20,
                    opts.cache_reserve_mb << 20,
                )
            }),
            direct,
            // What `Model::load` sized the reader by: the arena's lanes start after these.
            own_lanes: Self::lanes(capture, opts),
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
        crate::io::Lanes::new(self.reader.clone(), self.own_lanes)
    }

    /// The cache's budget now: its configured size, or less while memory pressure shrank it.
    pub fn budget(&self) -> u64 {
        self.pressure
            .as_ref()
            .map_or(self.budget_bytes, pressure::Watch::budget)
    }

    /// Samples memory pressure (at most every `pressure::POLL`) and moves the budget; the next
    /// evictions act on it. Each resize is said once and counted.
    fn watch_memory(&mut self, now: Instant) {
        let (Some(w), Some(lru)) = (self.pressure.as_mut(), self.lru.as_ref()) else {
            return;
        };
        let Some(r) = w.poll(now, lru.resident_bytes()) else {
            return;
        };
        match r {
            pressure::Resize::Shrink { .. } => self.counters.cache_shrinks += 1,
            pressure::Resize::Grow { .. } => self.counters.cache_grows += 1,
        }
        let (budget_bytes, below_cliff) = (w.budget(), w.budget() < self.token_bytes);
        if let Some(lru) = self.lru.as_mut() {
            lru.set_by_use(below_cliff);
        }
        if let Some(t) = self.trace.as_mut() {
            // A write that fails here fails again at the next node's, which reports it.
            let _ = t.out.event(&trace::Event::Budget { budget_bytes });
        }
        eprintln!("bmoe: {r}");
    }

    /// Per layer, the experts the cache holds now (none without a cache: shared slots keep
    /// nothing from one layer to the next).
    pub fn cached_experts(&self) -> std::collections::HashMap<u32, Vec<bool>> {
        let Some(lru) = &self.lru else {
            return Default::default();
        };
        self.layers
            .keys()
            .map(|&il| {
                let held = (0..self.n_expert).map(|e| lru.contains(il, e)).collect();
                (il, held)
            })
            .collect()
    }

    /// Cumulative counters.
    pub fn counters(&self) -> StreamCounters {
        let mut c = self.counters.clone();
        if let Some(p) = &self.prefetcher {
            c.prefetched = p.issued;
            c.prefetch_used = p.used;
            c.prefetch_moved = self.adopted;
        }
        c.budget_bytes = self.budget();
        c.resident_bytes = match &self.lru {
            Some(l) => l.resident_bytes(),
            None => 0,
        };
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
        let Some(cpu) = crate::ffi::repack::CpuRepack::new() else {
            return Ok(0);
        };
        // Mapped dense weights cannot take another layout: those the CPU has a repacked kernel
        // for are copied first (as `anon` would), so every weight the resident load repacks is
        // repacked here too and streamed == resident holds (on ARM, Q8_0 has such kernels).
        if self.dense.is_empty() {
            let layers = &self.layers;
            let wanted = |w: TensorPtr| !non_matmul.contains(&w.name()) && cpu.chooses(w);
            self.dense = copy_dense(capture, layers, wanted, quiet)?;
        }
        let mut n = 0;
        for layer in self.layers.values_mut() {
            layer.repacks = repacked::tag_all(&cpu, &layer.tensors, quiet);
            n += layer.repacks.iter().flatten().count();
        }
        for (w, region) in &mut self.dense {
            if !non_matmul.contains(&w.name()) {
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
    /// no cache), never while the cache has room for the node's misses ([`Self::absorbs`]). Dropped slots are kept for the layer's
    /// weight nodes (`dropped_slots`). Returns whether any id changed.
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
        let lru = self.lru.as_ref();
        let cached = |e: u32| lru.is_some_and(|l| l.contains(il, e));
        // The CPU's repacked kernels take each expert once per token (`lossy::repoint_dropped`).
        let twice_ok = self
            .layers
            .get(&il)
            .is_some_and(|l| l.repacks.iter().all(Option::is_none));
        let r = lossy::rewrite(ids, n_used, probs, n_expert, self.knobs(), cached, twice_ok);
        self.counters.substituted += r.substituted;
        self.counters.dropped += r.n_dropped;
        let changed = r.substituted > 0 || r.n_dropped > 0;
        self.dropped = (r.n_dropped > 0).then_some((il, n_used, r.dropped));
        changed
    }

    /// Whether the cache takes every expert `ids` misses in layer `il` without evicting: a cold
    /// miss while the cache fills is read once and kept, so the lossy knobs leave such a node as
    /// the router chose it (with the knobs, a 64 MiB cache on the tiny model substituted 31
    /// experts while it filled, each a lasting change for a read it had room for). Without a
    /// cache every miss is a read that is not kept: never.
    fn absorbs(&self, il: u32, ids: &[i32]) -> bool {
        let (Some(lru), Some(layer)) = (&self.lru, self.layers.get(&il)) else {
            return false;
        };
        let layer_bytes: u64 = layer.tensors.iter().map(|t| t.expert_bytes as u64).sum();
        let mut missed: Vec<u32> = ids
            .iter()
            .filter_map(|&e| u32::try_from(e).ok())
            .filter(|&e| !lru.contains(il, e))
            .collect();
        missed.sort_unstable();
        missed.dedup();
        lru.resident_bytes() + missed.len() as u64 * layer_bytes <= self.budget()
    }

    /// The slots layer `il`'s routing node dropped (rows of the returned slots per token),
    /// whose weights are zeroed before its expert matmuls run.
    pub fn dropped_slots(&self, il: u32) -> Option<(usize, &[bool])> {
        match &self.dropped {
            Some((l, n, d)) if *l == il => Some((*n, d)),
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
            t.probs = Some((il, n_expert, probs));
        }
    }

    /// Appends layer `il`'s routing node (`ids`, as made resident) to the trace, with each id's
    /// router probability where the hook read them.
    fn trace_node(&mut self, il: u32, ids: &[i32]) -> std::result::Result<(), StreamError> {
        let k = self.n_expert_used.max(1);
        let Some(t) = self.trace.as_mut() else {
            return Ok(());
        };
        if il == t.first_layer {
            t.piece = t.tokens;
            t.tokens += (ids.len() / k) as u64;
        }
        let probs = match t.probs.take() {
            Some((l, n, p)) if l == il && p.len() >= n * ids.len() / k => ids
                .iter()
                .enumerate()
                .map(|(i, &e)| {
                    p.get((i / k) * n + e.max(0) as usize)
                        .copied()
                        .unwrap_or(0.0)
                })
                .collect(),
            _ => Vec::new(),
        };
        let node = trace::Event::Node(trace::Node {
            phase: t.phase,
            token: t.piece,
            layer: il,
            ids: ids.to_vec(),
            probs,
        });
        Self::trace_write(t, &node)
    }

    fn trace_write(t: &mut Tracing, e: &trace::Event) -> std::result::Result<(), StreamError> {
        t.out.event(e).map_err(|source| StreamError::Trace {
            path: t.out.path().to_path_buf(),
            source,
        })
    }

    /// Writes what the trace has buffered (at the end of each generate, so a trace can be read
    /// while its model stays loaded).
    pub fn flush_trace(&mut self) -> std::result::Result<(), StreamError> {
        match self.trace.as_mut() {
            Some(t) => t.out.flush().map_err(|source| StreamError::Trace {
                path: t.out.path().to_path_buf(),
                source,
            }),
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
        let Some(layer_bytes) = self
            .layers
            .get(&il)
            .map(|l| l.tensors.iter().map(|t| t.expert_bytes as u64).sum::<u64>())
        else {
            return Ok(());
        };
        // How good the last prediction for this layer was, whatever the cache made of it.
        let prediction = self.prediction.take().filter(|(l, _, _)| *l == il);
        let wanted = self.wanted(il, ids, prediction.as_ref())?;
        self.trace_node(il, ids)?;
        let mut misses = self.cache_misses(il, &wanted, layer_bytes);
        // Score the candidates (predicted, not resident when predicted) against the real misses,
        // whether or not they were read ahead.
        if let Some((_, _, cands)) = &prediction {
            self.score_candidates(cands, &misses);
        }
        let missed = misses.clone();
        let read = self.fill_misses(il, &mut misses, decode_sized);
        let (budget, n_layers, n_used) = (self.budget(), self.layers.len(), self.n_expert_used);
        if let Some(lru) = self.lru.as_mut() {
            // Nothing partially read may count as resident: after a failed read only what was
            // read ahead (cleared from `misses`) is.
            let admitted: Vec<bool> = match &read {
                Ok(()) => missed,
                Err(_) => missed.iter().zip(&misses).map(|(&m, &r)| m && !r).collect(),
            };
            let wide = (!decode_sized).then_some(cache::Wide {
                ids,
                budget,
                n_layers,
                n_used,
            });
            lru.admit(il, &admitted, layer_bytes, wide);
        }
        self.counters.stall_s += t0.elapsed().as_secs_f64();
        self.time_node(t0, decode_sized);
        read.map_err(|source| StreamError::Read { layer: il, source })
    }

    /// The share of recent decode time spent waiting at routing nodes, 0 before any was timed.
    fn read_bound(&self) -> f64 {
        let (w, c) = self.read_share;
        if w + c > 0.0 {
            w / (w + c)
        } else {
            0.0
        }
    }

    /// Folds one routing node (begun at `t0`) into the read share: its wait against the compute
    /// since the node before it. Only between decode-sized nodes: a prompt piece's compute is
    /// not what reads ahead would overlap.
    fn time_node(&mut self, t0: Instant, decode_sized: bool) {
        let end = Instant::now();
        if let (true, Some(before)) = (decode_sized, self.last_node_end) {
            let (wait, compute) = (
                end.duration_since(t0).as_secs_f64(),
                t0.duration_since(before).as_secs_f64(),
            );
            // A gap of a second or more is the caller's (the next call), not compute. Wait and
            // compute are averaged apart and divided after: a mean of per-node shares would
            // weigh a node that hit everything as much as one that waited 50 ms.
            if compute < 1.0 {
                let (w, c) = &mut self.read_share;
                *w += READ_SHARE_WEIGHT * (wait - *w);
                *c += READ_SHARE_WEIGHT * (compute - *c);
            }
        }
        self.last_node_end = decode_sized.then_some(end);
    }

    /// The experts layer `il` routes to (every one with `read_all`), remembered for the
    /// predictors and scored against the last prediction.
    fn wanted(
        &mut self,
        il: u32,
        ids: &[i32],
        prediction: Option<&(u32, Vec<u32>, Vec<u32>)>,
    ) -> std::result::Result<Vec<bool>, StreamError> {
        if self.read_all {
            return Ok(vec![true; self.n_expert as usize]);
        }
        let wanted = crate::graph::routed_mask(il, ids, self.n_expert as usize)?;
        let routed: Vec<u32> = (0..wanted.len() as u32)
            .filter(|&e| wanted[e as usize])
            .collect();
        if let Some((_, p, _)) = prediction {
            self.counters.predicted_routed += routed.len() as u64;
            self.counters.predicted_right += routed.iter().filter(|e| p.contains(e)).count() as u64;
        }
        self.last_routed.insert(il, routed);
        Ok(wanted)
    }

    /// Which wanted experts must be read: all of them without a cache; with one, those the LRU
    /// lacks, after evicting (and keeping the pages of, within the move bound) enough for them.
    fn cache_misses(&mut self, il: u32, wanted: &[bool], layer_bytes: u64) -> Vec<bool> {
        let budget = self.budget();
        let Some(lru) = self.lru.as_mut() else {
            self.counters.cache_misses += wanted.iter().filter(|&&w| w).count() as u64;
            return wanted.to_vec();
        };
        let (layers, spare, moves_left) = (&mut self.layers, &mut self.spare, &mut self.moves_left);
        let keep = self.keep_evicted;
        let t0 = Instant::now();
        let (miss, evicted) = lru.route(il, wanted, layer_bytes, budget, |(l, e)| {
            if let Some(layer) = layers.get_mut(&l) {
                for (t, r) in layer.tensors.iter().zip(layer.regions.iter_mut()) {
                    let (at, eb) = (e as usize * t.expert_bytes, t.expert_bytes);
                    // Faulted-in pages kept for this node's misses: a fresh page costs a fault
                    // and its zeroing, which on a small machine is most of a miss's CPU time
                    // besides the read.
                    match (keep && *moves_left > 0)
                        .then(|| r.take_out(at, eb))
                        .flatten()
                    {
                        Some(pages) => {
                            *moves_left -= 1;
                            spare.push(pages);
                        }
                        None => {
                            r.release(at, eb);
                        }
                    }
                }
            }
        });
        let n_miss = miss.iter().filter(|&&m| m).count() as u64;
        self.counters.cache_misses += n_miss;
        self.counters.cache_hits += wanted.iter().filter(|&&w| w).count() as u64 - n_miss;
        self.counters.evictions += evicted;
        self.counters.evict_s += t0.elapsed().as_secs_f64();
        miss
    }

    /// Counts how many of a prediction's candidates turned out misses (a window, halved as it
    /// fills), which decides whether reads ahead pay.
    fn score_candidates(&mut self, cands: &[u32], misses: &[bool]) {
        let useful = cands.iter().filter(|&&e| misses[e as usize]).count();
        let (n, u) = &mut self.candidates;
        *n += cands.len() as f64;
        *u += useful as f64;
        if *n > CANDIDATE_WINDOW {
            *n /= 2.0;
            *u /= 2.0;
        }
    }

    /// Puts the missed experts of layer `il` into their regions: those read ahead moved in (and
    /// cleared from `misses`), evicted pages recycled for the rest, which are then read.
    fn fill_misses(
        &mut self,
        il: u32,
        misses: &mut [bool],
        decode_sized: bool,
    ) -> std::io::Result<()> {
        let Self {
            layers,
            shared,
            lru,
            prefetcher,
            moves_left,
            adopted,
            counters,
            spare,
            reader,
            pool,
            pipe,
            repacker,
            ..
        } = self;
        let layer = layers.get_mut(&il).expect("layer checked by ensure");
        let rep = |i: usize| layer.repacks.get(i).and_then(Option::as_ref);
        // Each expert matrix with the region it is bound to, in the layer's order: its own (cache
        // mode), or its role's shared slot; and how it is repacked.
        let (mut pairs, reps): (Vec<(&ExpertMatrix, &mut Region)>, Vec<_>) = if lru.is_some() {
            layer
                .tensors
                .iter()
                .zip(layer.regions.iter_mut())
                .enumerate()
                .map(|(i, p)| (p, rep(i)))
                .unzip()
        } else {
            let mut by_role: BTreeMap<ExpertRole, &mut Region> =
                shared.iter_mut().map(|(&role, r)| (role, r)).collect();
            layer
                .tensors
                .iter()
                .enumerate()
                .filter_map(|(i, t)| by_role.remove(&t.role).map(|r| ((t, r), rep(i))))
                .unzip()
        };
        let mut moves = Moves {
            left: moves_left,
            adopted,
            counters,
        };
        if let Some(p) = prefetcher.as_mut() {
            moves.read_ahead(p, il, &mut pairs, &reps, misses);
        }
        moves.recycle(spare, &mut pairs, misses);
        spare.clear();
        let jobs = read_jobs(pairs, &reps, misses);
        read_all(reader, pool, jobs, (decode_sized, pipe, repacker), counters)
    }
    /// Whether reads ahead pay: at least `MIN_PRECISION` of the recent candidates were misses
    /// (each wrong one costs a read and CPU time for its copy, which on a small machine competes
    /// with compute), and more than the share of decode spent waiting for reads (`read_share`).
    /// A read ahead can hide at most the compute it overlaps, C per node, while the storage
    /// still reads every byte; a candidate that is not used adds its read to the R a node
    /// already waits for. With a share p of candidates used, the waste per useful read is
    /// (1 - p) / p of it, so reads ahead pay only where C / R > (1 - p) / p, that is where p is
    /// above R / (R + C), the read share. Ten times larger than its memory (bench10), decode
    /// waited for reads 81-92% of the time, and reads ahead on made it 1.5-1.8x slower.
    /// Nothing is read until `CANDIDATE_WARMUP` candidates were scored: reading while the share
    /// is unknown cost the bench preset 65 wasted reads (1.0 MiB a token over 64 tokens) on
    /// routing too scattered to predict. Predictions keep being scored while reads are off, so
    /// they come back when the routing becomes predictable. `eager` and the always-wrong control
    /// read regardless.
    ///
    /// The same bar holds for what the reads ahead really delivered (`ahead`: experts read ahead
    /// and how many served a miss), once `CANDIDATE_WARMUP` were read: a candidate scored as a
    /// miss is not always served in time, and on bench10 at 52% cache hits, 80% of candidates
    /// were misses, over the 74% read share, while 62% of the reads ahead were used, and decode
    /// ran 1.43x slower than with reads ahead off. While paused that record fades (see
    /// `prefetch_after`), so reads ahead are tried again now and then.
    fn worth_reading_ahead(
        candidates: (f64, f64),
        ahead: (f64, f64),
        read_share: f64,
        mode: Prefetch,
    ) -> bool {
        let bar = MIN_PRECISION.max(read_share);
        let ((n, u), (r, used)) = (candidates, ahead);
        matches!(mode, Prefetch::Wrong | Prefetch::Eager)
            || (n >= CANDIDATE_WARMUP && u >= bar * n && (r < CANDIDATE_WARMUP || used >= bar * r))
    }

    /// Folds what the reads ahead delivered since the last count into `ahead`.
    fn count_ahead(&mut self) {
        let Some(p) = &self.prefetcher else {
            return;
        };
        let (issued, used) = (p.issued, p.used);
        let (r, u) = &mut self.ahead;
        *r += (issued - self.ahead_seen.0) as f64;
        *u += (used - self.ahead_seen.1) as f64;
        self.ahead_seen = (issued, used);
        if *r > CANDIDATE_WINDOW {
            *r /= 2.0;
            *u /= 2.0;
        }
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
        self.count_ahead();
        let read_bound = self.read_bound();
        let (Some(pred), Some(pf)) = (&self.predictor, self.prefetcher.as_mut()) else {
            return;
        };
        let Some(next) = pred.next_layer(il) else {
            return;
        };
        let Some(layer) = self.layers.get(&next) else {
            return;
        };
        let reading =
            Self::worth_reading_ahead(self.candidates, self.ahead, read_bound, pred.mode());
        // While warming up every node predicts, so the share is known within a few tokens.
        let warm = self.candidates.0 >= CANDIDATE_WARMUP;
        if !reading && warm {
            self.paused_nodes += 1;
            if !self.paused_nodes.is_multiple_of(PAUSED_SAMPLE) {
                return;
            }
            // What reads ahead delivered fades while they are off (from the window's 512 below
            // the 64 that count in about 200 sampled nodes), so they are tried again.
            self.ahead.0 *= AHEAD_FADE;
            self.ahead.1 *= AHEAD_FADE;
        }
        let t0 = Instant::now();
        let predicted = match pred.mode() {
            Prefetch::Repeat => self.last_routed.get(&next).cloned().unwrap_or_default(),
            _ => match router_input() {
                Some((n_embd, x)) if n_embd > 0 && x.len() / n_embd <= MAX_PREFETCH_TOKENS => {
                    pred.predict(next, &x, n_embd, self.n_expert_used)
                }
                _ => return,
            },
        };
        self.counters.predict_s += t0.elapsed().as_secs_f64();
        let experts: Vec<u32> = predicted
            .iter()
            .copied()
            .filter(|&e| {
                e < self.n_expert && !self.lru.as_ref().is_some_and(|l| l.contains(next, e))
            })
            .collect();
        self.prediction = Some((next, predicted, experts.clone()));
        if !reading {
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
        pf.issue(next, &experts, &sources);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::Prefetch;

    #[test]
    fn reads_ahead_pause_while_few_candidates_turn_out_misses() {
        let worth = |c, mode| Streamer::worth_reading_ahead(c, (0.0, 0.0), 0.1, mode);
        // Until 64 candidates were scored the share is not trusted, and nothing is read.
        assert!(!worth(
            (CANDIDATE_WARMUP - 1.0, CANDIDATE_WARMUP - 1.0),
            Prefetch::Router
        ));
        // Then at least half of them must have been misses.
        assert!(!worth((100.0, 49.0), Prefetch::Router));
        assert!(worth((100.0, 50.0), Prefetch::Router));
        assert!(!worth((100.0, 10.0), Prefetch::Repeat));
        // `eager` and the always-wrong control read regardless.
        assert!(worth((100.0, 0.0), Prefetch::Wrong));
        assert!(worth((0.0, 0.0), Prefetch::Eager));
        // Read-bound (85% of decode waiting): 80% of candidates used is not enough, 90% is.
        let bound =
            |u| Streamer::worth_reading_ahead((100.0, u), (0.0, 0.0), 0.85, Prefetch::Router);
        assert!(!bound(80.0));
        assert!(bound(90.0));
        // Candidates that pass, reads ahead that did not deliver: paused; too few read to tell,
        // or delivering: on.
        let ahead = |a| Streamer::worth_reading_ahead((100.0, 80.0), a, 0.74, Prefetch::Router);
        assert!(!ahead((100.0, 62.0)));
        assert!(ahead((60.0, 0.0)));
        assert!(ahead((100.0, 80.0)));
    }
}
