//! The two-layer arena: before a wide prefill graph every layer weight is rebound onto slot
//! (layer mod 2) of device memory marked as weights, so the scheduler moves the layer's ops to the
//! device. Loaders fill the slot of layer k+1 while the device computes layer k; the graph waits
//! for a layer's non-expert weights at the last node of the layer before, and for its experts at
//! its routing node, where the routed ids decide what else must be read. After the graph every
//! weight goes back to the host.
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::device::explain::{Explain, ExplainReport, NodeSeen, Side};
use crate::device::loader::{Job, Loaders, Source, Target, Ticket};
use crate::device::slots::{Layer, Placing, SlotPlan};
use crate::device::DeviceError;
use crate::ffi::buffer::{BufferType, WeightsBuffer};
use crate::ffi::registry::Device;
use crate::ffi::tensor;
use crate::graph::{routed_mask, Capture};
use crate::options::{PacingFault, PrefillOptions};
use crate::telemetry::PrefillDevCounters;
use crate::weights::table::{ExpertMatrix, WeightTable};
use crate::weights::{residency, Quiet};

/// The most bytes one host-to-device copy of a run of experts moves: runs stay many enough for
/// every loader to have one, and a remote device's message stays small.
const MAX_RUN_BYTES: usize = 16 << 20;

/// What one wide graph has done so far.
#[derive(Default)]
struct GraphState {
    /// The layer whose last node the graph must reach next.
    expect: u32,
    /// Per layer in flight, which experts are queued.
    queued: HashMap<u32, Vec<bool>>,
    /// Layers to read whole in this graph (the layer before routed to nearly everything).
    whole: Vec<u32>,
    /// Layers whose routing node has run.
    routed_seen: Vec<u32>,
    /// Per layer, the experts the CPU-side expert cache holds (taken from its memory, not read
    /// from the file); stable for the graph, since the streamer stays out of a wide graph.
    cached: HashMap<u32, Vec<bool>>,
}

/// How the arena laid a model out (for diagnostics and tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArenaLayout {
    /// Bytes of each slot of the weights pair.
    pub slot_bytes: usize,
    /// Bytes of each slot of the plain pair.
    pub plain_bytes: usize,
    /// Weights placed in the plain pair (an op other than a matmul reads them).
    pub plain_weights: Vec<String>,
}

/// The arena of one model on one device.
pub struct Arena {
    // First field, so dropped first: the loader threads are joined before the slots they write
    // into are freed.
    loaders: Loaders,
    slots: [WeightsBuffer; 2],
    /// The second pair, plain device memory, for weights non-matmul ops read.
    plain: [WeightsBuffer; 2],
    layers: BTreeMap<u32, Layer>,
    /// Last node name of each layer (the pacing points).
    last_node: HashMap<String, u32>,
    buft: BufferType,
    active: Arc<AtomicBool>,
    n_layer: u32,
    n_expert: usize,
    opts: PrefillOptions,
    graph: GraphState,
    /// Per layer, the experts the previous device graph routed to (the prediction).
    prediction: HashMap<u32, Vec<bool>>,
    /// Cumulative counters (bytes come from the loaders).
    counters: PrefillDevCounters,
    /// Weight types the device's matmul refused and that stay so, with a count and one name.
    refused: BTreeMap<String, (usize, String)>,
    /// (from, to) type names of weights converted for the device, with a count.
    converted: BTreeMap<(String, String), usize>,
    device: Device,
    /// The profiling mode's accumulator (`explain`).
    explain: Option<Explain>,
}

/// Each layer's last node, by name: where the next layer's non-expert weights wait.
fn pacing_nodes(
    capture: &Capture,
    layers: &BTreeMap<u32, Layer>,
    opts: &PrefillOptions,
) -> HashMap<String, u32> {
    let mut last_node: HashMap<String, u32> = capture
        .last_node
        .iter()
        .filter(|(il, _)| layers.contains_key(il))
        .map(|(il, n)| (n.clone(), *il))
        .collect();
    // Gate knob: pacing points mistaken as if the graph skipped or reordered them.
    for f in &opts.gate().pacing_faults {
        match *f {
            PacingFault::DropLast(il) => last_node.retain(|_, l| *l != il),
            PacingFault::SwapLast(a, b) => {
                for l in last_node.values_mut() {
                    if *l == a {
                        *l = b;
                    } else if *l == b {
                        *l = a;
                    }
                }
            }
            PacingFault::DropRouting(_) => {}
        }
    }
    last_node
}

impl Arena {
    /// Lays out every layer's weights in two slots of `device`'s memory. With a `streamer` the
    /// experts are read from the GGUF, on the reader lanes after the streamer's (their host
    /// copies are the streamer's regions, bound before this records them).
    pub fn new(
        capture: &Capture,
        table: &WeightTable,
        device: Device,
        opts: &PrefillOptions,
        streamer: Option<&crate::stream::Streamer>,
    ) -> Result<Self, DeviceError> {
        let lanes = streamer.map(|s| s.later_lanes());
        let streamed = lanes.is_some();
        let buft = BufferType::of_device(device);
        let at = Placing {
            capture,
            table,
            device,
            buft,
            opts,
            streamed,
        };
        let SlotPlan {
            layers,
            sizes,
            plain_sizes,
            refused,
            converted_types,
        } = SlotPlan::of(&at)?;
        let n_expert = table.n_expert();
        let max_read = table.max_expert_bytes();
        let slot_size = sizes.values().copied().max().unwrap_or(0);
        let plain_size = plain_sizes.values().copied().max().unwrap_or(0);
        let n_layer = layers.keys().next_back().map(|l| l + 1).unwrap_or(0);
        let last_node = pacing_nodes(capture, &layers, opts);
        let loaders = Loaders::start(
            opts.loaders,
            lanes,
            max_read,
            Duration::from_millis(opts.gate().loader_delay_ms),
            &opts.cpus,
        )?;
        Ok(Self {
            slots: [
                WeightsBuffer::alloc(buft, slot_size)?,
                WeightsBuffer::alloc(buft, slot_size)?,
            ],
            plain: [
                WeightsBuffer::alloc_plain(buft, plain_size)?,
                WeightsBuffer::alloc_plain(buft, plain_size)?,
            ],
            layers,
            last_node,
            buft,
            active: Arc::new(AtomicBool::new(false)),
            n_layer,
            n_expert,
            opts: opts.clone(),
            loaders,
            graph: GraphState::default(),
            prediction: HashMap::new(),
            counters: PrefillDevCounters::default(),
            refused,
            converted: converted_types,
            device,
            explain: opts.explain.then(Explain::default),
        })
    }

    /// How the model is laid out in the slots.
    pub fn layout(&self) -> ArenaLayout {
        ArenaLayout {
            slot_bytes: self.slots[0].size(),
            plain_bytes: self.plain[0].size(),
            plain_weights: self
                .layers
                .values()
                .flat_map(|l| l.dense.iter().filter(|d| d.plain).map(|d| d.t.name()))
                .collect(),
        }
    }

    /// What the device's matmul refused, in words (empty when it takes every layer matrix).
    pub fn refusals(&self) -> Vec<String> {
        let converted = self.converted.iter().map(|((from, to), n)| {
            format!(
                "the prefill device's matmul does not take {from}: {n} weights are carried to it as {to}, converted once at load (the file and CPU decode are untouched; device results differ from the CPU's)"
            )
        });
        let refused = self.refused.iter().map(|(ty, (n, example))| {
            format!(
                "the prefill device's matmul does not take {ty} ({n} matrices, e.g. {example}, with no type it takes to carry them in): those matmuls run on the CPU inside device graphs"
            )
        });
        converted.chain(refused).collect()
    }

    /// The device's buffer type (to count the nodes it computes).
    pub fn buft(&self) -> BufferType {
        self.buft
    }

    /// Set while a wide graph is bound to the arena; the graph hook reads it without locking.
    pub fn active_flag(&self) -> Arc<AtomicBool> {
        self.active.clone()
    }

    /// The layer whose last node `name` is, when it is a pacing point.
    pub fn pacing_layer(&self, name: &str) -> Option<u32> {
        self.last_node.get(name).copied()
    }

    /// Whether the profiling mode asks for every node.
    pub fn explaining(&self) -> bool {
        self.explain.is_some()
    }

    /// Profiling: the scheduler is about to compute `t` alone.
    pub fn explain_asked(&mut self) {
        if let Some(x) = self.explain.as_mut() {
            x.asked();
        }
    }

    /// Profiling: `t` has been computed; records its op, side, time, inputs from the other side
    /// and, for a CPU node, why the device did not take it.
    pub fn explain_observed(&mut self, t: &ggml_sys::ggml_tensor) {
        let Some(x) = self.explain.as_mut() else {
            return;
        };
        let side_of = |t: &ggml_sys::ggml_tensor| {
            if self.buft.holds(t) {
                Side::Device
            } else {
                Side::Cpu
            }
        };
        let side = side_of(t);
        let inputs = (0..ggml_sys::GGML_MAX_SRC)
            .filter_map(|i| tensor::src(t, i))
            .map(|s| {
                (
                    s as *const _ as usize,
                    tensor::nbytes(s) as u64,
                    tensor::name(s),
                )
            })
            .collect();
        let (supported, unreadable) = if side == Side::Cpu {
            (
                crate::ffi::probe::supports_node(self.device, t),
                crate::ffi::probe::unreadable_inputs(self.device, t),
            )
        } else {
            (true, Vec::new())
        };
        x.observed(NodeSeen {
            op: tensor::op_desc(t),
            name: tensor::name(t),
            side,
            supported,
            unreadable,
            inputs,
        });
    }

    /// The profiling report since the last one (`None` when the mode is off).
    pub fn take_explain(&mut self) -> Option<ExplainReport> {
        self.explain.as_mut().map(Explain::take)
    }

    /// Counts a node the device computes.
    pub fn count_node(&mut self) {
        self.counters.nodes += 1;
    }

    /// Cumulative counters.
    pub fn counters(&self) -> PrefillDevCounters {
        PrefillDevCounters {
            read_bytes: self.loaders.bytes(),
            file_read_bytes: self.loaders.file_bytes(),
            ..self.counters.clone()
        }
    }

    /// A new session starts: its first graph has no prediction and reads whole layers.
    pub fn new_session(&mut self) {
        self.prediction.clear();
    }

    /// Waits for `ticket`, counting the time as the graph's stall.
    fn wait(&mut self, ticket: Ticket) -> Result<(), DeviceError> {
        let t0 = Instant::now();
        let r = self.loaders.wait(ticket);
        self.counters.stall_s += t0.elapsed().as_secs_f64();
        r
    }

    /// The uploads of layer `il`'s experts `which`, weight by weight: a streamed expert the
    /// CPU-side cache does not hold is one read from the GGUF; the others come from host memory,
    /// in runs of neighbours, one copy a run (on a remote device, one message instead of one an
    /// expert).
    fn expert_jobs(&mut self, il: u32, which: &[bool], ticket: Ticket) -> Vec<Job> {
        let Some(layer) = self.layers.get(&il) else {
            return Vec::new();
        };
        let cached = self.graph.cached.get(&il);
        // A streamed expert the CPU-side cache holds is in its region, the host binding.
        let in_cache = |e: usize| cached.is_some_and(|c| c.get(e) == Some(&true));
        if layer.experts.iter().any(|w| w.file.is_some()) {
            let held = (0..which.len())
                .filter(|&e| which[e] && in_cache(e))
                .count();
            self.counters.cached_experts += held as u64;
        }
        let mut jobs = Vec::new();
        for w in &layer.experts {
            let from_file = |e: usize| w.file.is_some() && !in_cache(e);
            let most = (MAX_RUN_BYTES / w.expert_bytes.max(1)).max(1);
            let mut e = 0;
            while e < which.len() {
                if !which[e] {
                    e += 1;
                    continue;
                }
                if let (Some(parts), true) = (&w.file, from_file(e)) {
                    jobs.push(Job {
                        ticket,
                        target: Target::Experts {
                            t: w.t,
                            first: e,
                            count: 1,
                        },
                        source: Source::File(ExpertMatrix::pieces(parts, e).collect()),
                        len: w.expert_bytes,
                    });
                    e += 1;
                    continue;
                }
                let first = e;
                while e < which.len() && which[e] && !from_file(e) && e - first < most {
                    e += 1;
                }
                jobs.push(Job {
                    ticket,
                    target: Target::Experts {
                        t: w.t,
                        first,
                        count: e - first,
                    },
                    source: Source::Host(w.host, first * w.expert_bytes),
                    len: (e - first) * w.expert_bytes,
                });
            }
        }
        jobs
    }

    /// Queues layer `il` into its slot: its non-expert weights, and the experts the prediction
    /// names (all of them without one, or when routed reads are off or the layer is to be read
    /// whole).
    fn enqueue_layer(&mut self, il: u32) {
        let Some(layer) = self.layers.get(&il) else {
            return;
        };
        let mut jobs: Vec<Job> = layer
            .dense
            .iter()
            .map(|d| match &d.converted {
                Some((_, _, bytes)) => Job {
                    ticket: Ticket::Dense(il),
                    target: Target::Whole(d.t),
                    len: bytes.len(),
                    source: Source::Owned(bytes.clone()),
                },
                None => Job {
                    ticket: Ticket::Dense(il),
                    target: Target::Whole(d.t),
                    source: Source::Host(d.host, 0),
                    len: d.t.nbytes(),
                },
            })
            .collect();
        let which = match self.prediction.get(&il) {
            Some(p) if self.opts.routed && layer.routed && !self.graph.whole.contains(&il) => {
                p.clone()
            }
            _ => vec![true; self.n_expert],
        };
        // Without a routing node there is no later point to wait at: experts load with the rest.
        let ticket = if layer.routed {
            Ticket::Experts(il)
        } else {
            Ticket::Dense(il)
        };
        if !layer.experts.is_empty() {
            jobs.extend(self.expert_jobs(il, &which, ticket));
            self.graph.queued.insert(il, which);
        }
        self.loaders.push_back(jobs);
    }

    /// Binds the arena for a wide graph of `tokens` tokens: layers 0 and 1 are queued and layer
    /// 0's non-expert weights awaited; every other wait is at a pacing point.
    pub fn begin(
        &mut self,
        tokens: u64,
        cached: HashMap<u32, Vec<bool>>,
        quiet: &mut Quiet<'_>,
    ) -> Result<(), DeviceError> {
        // A failed earlier graph may have left an error or jobs behind.
        let _ = self.loaders.drain();
        // Every weight points into its slot from the start, so the whole graph is scheduled onto
        // the device; what the slots hold follows the pacing.
        for (il, layer) in &self.layers {
            let slot = &self.slots[(il % 2) as usize];
            let plain = &self.plain[(il % 2) as usize];
            for d in &layer.dense {
                let to = d.converted.as_ref().map(|c| c.0);
                let buffer = if d.plain { plain } else { slot };
                residency::onto_device(d.t, buffer, d.off, to, quiet)?;
            }
            for w in &layer.experts {
                residency::onto_device(w.t, slot, w.off, None, quiet)?;
            }
        }
        self.active.store(true, Ordering::Relaxed);
        self.graph = GraphState {
            cached,
            ..GraphState::default()
        };
        if let Some(x) = self.explain.as_mut() {
            x.begin_graph();
        }
        self.enqueue_layer(0);
        self.enqueue_layer(1);
        self.counters.tokens += tokens;
        self.wait(Ticket::Dense(0))
    }

    /// At the routing node of layer `il`: reads what the prediction missed ahead of everything
    /// else, waits for the layer's experts, and records the routing as the next prediction.
    pub fn on_routing(&mut self, il: u32, ids: &[i32]) -> Result<(), DeviceError> {
        // Gate knob: this routing node is not taken, as if the graph skipped it.
        if self
            .opts
            .gate()
            .pacing_faults
            .contains(&PacingFault::DropRouting(il))
        {
            return Ok(());
        }
        if il != self.graph.expect || self.graph.routed_seen.contains(&il) {
            return Err(DeviceError::PacingSkipped(format!(
                "reached the routing of layer {il} while layer {} was due",
                self.graph.expect
            )));
        }
        self.graph.routed_seen.push(il);
        let routed = routed_mask(il, ids, self.n_expert)?;
        let n_routed = routed.iter().filter(|&&r| r).count();
        self.counters.routed += n_routed as u64;
        let queued = self
            .graph
            .queued
            .get(&il)
            .cloned()
            .unwrap_or_else(|| vec![false; self.n_expert]);
        let missing: Vec<bool> = routed.iter().zip(&queued).map(|(&r, &q)| r && !q).collect();
        let n_missing = missing.iter().filter(|&&m| m).count();
        if n_missing > 0 && !self.opts.gate().skip_demand_reads {
            self.counters.demand += n_missing as u64;
            let jobs = self.expert_jobs(il, &missing, Ticket::Experts(il));
            self.loaders.push_front(jobs);
        }
        // A layer routing to nearly every expert predicts the next one will too: read it whole
        // now instead of paying for a prediction that cannot save anything.
        let next = il + 1;
        if self.opts.routed
            && n_routed as f64 > self.opts.routed_full * self.n_expert as f64
            && self.layers.get(&next).is_some_and(|l| l.routed)
            && !self.graph.whole.contains(&next)
        {
            self.graph.whole.push(next);
            self.counters.whole_fallback += 1;
            if let Some(q) = self.graph.queued.get_mut(&next) {
                let rest: Vec<bool> = q.iter().map(|&x| !x).collect();
                q.fill(true);
                let jobs = self.expert_jobs(next, &rest, Ticket::Experts(next));
                self.loaders.push_back(jobs);
            }
        }
        self.prediction.insert(il, routed);
        // Gate knob: the negative control of this wait (with a slow loader the result changes).
        if self.opts.gate().skip_expert_wait {
            return Ok(());
        }
        self.wait(Ticket::Experts(il))
    }

    /// At the last node of layer `il`: its slot is free, queue layer `il + 2` into it, then wait
    /// for layer `il + 1`'s non-expert weights. A pacing point out of order is an error: the
    /// graph would compute on a slot that did not fill.
    pub fn on_layer_done(&mut self, il: u32) -> Result<(), DeviceError> {
        let routed_needed = self.layers.get(&il).is_some_and(|l| l.routed);
        if il != self.graph.expect || (routed_needed && !self.graph.routed_seen.contains(&il)) {
            return Err(DeviceError::PacingSkipped(format!(
                "reached the end of layer {il} before layer {} was done",
                self.graph.expect
            )));
        }
        self.graph.expect = il + 1;
        self.graph.queued.remove(&il);
        self.enqueue_layer(il + 2);
        // Gate knob `skip_layer_wait`: the negative control of this wait.
        if il + 1 < self.n_layer && !self.opts.gate().skip_layer_wait {
            self.wait(Ticket::Dense(il + 1))?;
        }
        Ok(())
    }

    /// Stops the loaders, puts every weight back on the host; an incomplete graph is an error.
    pub fn end(&mut self, quiet: &mut Quiet<'_>) -> Result<(), DeviceError> {
        let loader_error = self.loaders.drain();
        // Every weight goes back, even past a failed one; the first failure is reported.
        let mut restore_error = None;
        for layer in self.layers.values() {
            let moves = layer
                .dense
                .iter()
                .map(|d| (d.t, d.host, d.converted.as_ref().map(|c| c.1)))
                .chain(layer.experts.iter().map(|w| (w.t, w.host, None)));
            for (t, host, layout) in moves {
                if let Err(e) = residency::back_to_host(t, host, layout, quiet) {
                    restore_error.get_or_insert(e);
                }
            }
        }
        let was = self.active.swap(false, Ordering::Relaxed);
        if let Some(e) = loader_error {
            return Err(e);
        }
        if let Some(e) = restore_error {
            return Err(e.into());
        }
        if was && self.graph.expect < self.n_layer {
            return Err(DeviceError::PacingSkipped(format!(
                "ended after layer {} of {}",
                self.graph.expect, self.n_layer
            )));
        }
        Ok(())
    }
}
