//! The dispatcher installed on every session: llama.cpp's `cb_eval` asks it about each node, and
//! it hands the routing nodes' ids to the expert streamer or, inside a wide device graph, to the
//! prefill arena.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use ggml_sys as sys;

use crate::device::arena::Arena;
use crate::device::DeviceError;
use crate::error::EngineError;
use crate::ffi::context::EvalHook;
use crate::ffi::{routing, tensor};
use crate::graph::node_layer;
use crate::stream::{StreamError, Streamer};

/// The dispatcher installed on every session of a streamed model: isolates each routing node and
/// hands its ids to the streamer. A failed read sets the abort flag, so the decode stops before
/// any expert matmul runs on unread data.
pub struct EngineHook {
    /// The expert streamer, when streaming.
    pub streamer: Option<Arc<Mutex<Streamer>>>,
    /// The prefill arena, when a device runs wide graphs.
    pub arena: Option<Arc<Mutex<Arena>>>,
    /// The arena's "a wide graph is bound" flag.
    pub arena_active: Arc<AtomicBool>,
    /// Collects the memory tensors while the session moves them (see `memory_home`).
    pub memory: Arc<super::memory_home::MemoryCapture>,
    /// The context's abort flag.
    pub abort: Arc<AtomicBool>,
    /// Where a failure is kept for the session to report.
    pub error: Arc<Mutex<Option<EngineError>>>,
}

impl EvalHook for EngineHook {
    fn ask(&mut self, t: &sys::ggml_tensor) -> bool {
        // The capture decode: nothing but collecting; its result is thrown away.
        if self.memory.capturing() {
            self.memory.collect(t);
            return false;
        }
        // Cheap: a byte-prefix test on every node of every graph.
        let topk = t.name[..13].iter().map(|&c| c as u8).eq(*b"ffn_moe_topk-");
        if let Some(arena) = &self.arena {
            // Lock-free outside wide graphs: decode asks never touch the arena's lock.
            if self.arena_active.load(Ordering::Relaxed) {
                let Ok(mut a) = arena.lock() else {
                    return false;
                };
                // Nodes whose result lives in device memory are the nodes the device computes.
                if a.buft().holds(t) {
                    a.count_node();
                }
                // Profiling: every node, so the scheduler computes and the hook times each alone.
                if a.explaining() {
                    a.explain_asked();
                    return true;
                }
                return topk || a.pacing_layer(tensor::name(t)).is_some();
            }
        }
        (topk && self.streamer.is_some()) || self.drops_at(t)
    }

    fn observe(&mut self, t: &sys::ggml_tensor) {
        let fail = |err: EngineError| {
            if let Ok(mut e) = self.error.lock() {
                e.get_or_insert(err);
            }
            self.abort.store(true, Ordering::Relaxed);
        };
        let name = tensor::name(t);
        let routing = node_layer(name, "ffn_moe_topk");
        if let Some(arena) = &self.arena {
            if self.arena_active.load(Ordering::Relaxed) {
                // In a wide graph the experts come from the arena; the streamer stays out of it.
                let r = match arena.lock() {
                    Ok(mut a) => {
                        // Profiling (a no-op otherwise): the node just computed, timed alone.
                        a.explain_observed(t);
                        match (routing, a.pacing_layer(name)) {
                            (Some(il), _) => match tensor::read_ids_anywhere(t) {
                                Some(ids) => a.on_routing(il, &ids),
                                None => Err(DeviceError::UnreadableRouting(il)),
                            },
                            (None, Some(il)) => a.on_layer_done(il),
                            (None, None) => Ok(()),
                        }
                    }
                    Err(_) => Err(DeviceError::Poisoned),
                };
                if let Err(e) = r {
                    fail(EngineError::Device(e));
                }
                return;
            }
        }
        let Some(streamer) = &self.streamer else {
            return;
        };
        let Some(il) = routing else {
            if let Some(il) = weights_layer(name) {
                if let Err(e) = zero_dropped(streamer, il, t) {
                    fail(EngineError::Stream(e));
                }
            }
            return;
        };
        let Some(mut ids) = tensor::read_ids(t) else {
            return fail(EngineError::Stream(StreamError::UnreadableRouting(il)));
        };
        let r = match streamer.lock() {
            Ok(mut s) => reroute(&mut s, il, t, &mut ids)
                .and_then(|()| s.ensure(il, &ids))
                .map(|()| {
                    // Decode-sized graphs only (ne[1] = tokens): the copy of a wide piece's rows
                    // would cost more than any read ahead saves.
                    if t.ne[1] as usize <= crate::stream::MAX_PREFETCH_TOKENS {
                        s.prefetch_after(il, || tensor::router_input(t));
                    }
                }),
            Err(_) => Err(StreamError::Poisoned),
        };
        if let Err(e) = r {
            fail(EngineError::Stream(e));
        }
    }
}

/// The router-weight nodes of a layer, in graph order: a dropped slot's weight is zeroed in each
/// (zeroed before the model's own normalisation, the rest are renormalised by it; zeroed after a
/// softmax over the selected weights, it stays 0).
const WEIGHT_NODES: [&str; 4] = [
    "ffn_moe_weights",
    "ffn_moe_weights_softmax",
    "ffn_moe_weights_norm",
    "ffn_moe_weights_scaled",
];

/// The layer of a router-weight node (`WEIGHT_NODES`), if `name` is one.
fn weights_layer(name: &str) -> Option<u32> {
    if !name.starts_with("ffn_moe_weights") {
        return None;
    }
    WEIGHT_NODES.iter().find_map(|p| node_layer(name, p))
}

impl EngineHook {
    /// Whether `t` is a router-weight node the streamer must see (`drop_cold` is on).
    fn drops_at(&self, t: &sys::ggml_tensor) -> bool {
        let Some(streamer) = &self.streamer else {
            return false;
        };
        // Cheap first: a byte-prefix test before the name is decoded or the lock taken.
        if !t.name[..15]
            .iter()
            .map(|&c| c as u8)
            .eq(*b"ffn_moe_weights")
        {
            return false;
        }
        weights_layer(tensor::name(t)).is_some()
            && streamer.lock().is_ok_and(|s| s.knobs().drop_cold > 0.0)
    }
}

/// The lossy knobs at a routing node: the router's probabilities read (also for a routing
/// trace), the ids rewritten where a knob changed them (written back into the node, which the
/// weights and the expert matmuls read next).
fn reroute(
    s: &mut Streamer,
    il: u32,
    t: &sys::ggml_tensor,
    ids: &mut [i32],
) -> Result<(), StreamError> {
    if s.tracing() {
        if let Some((n_expert, probs)) = routing::router_probs(t) {
            s.note_probs(il, n_expert, probs);
        }
    }
    if !s.knobs().on() {
        return Ok(());
    }
    let (n_expert, probs) = routing::router_probs(t).ok_or(StreamError::NoRouterProbs(il))?;
    let n_used = t.ne[0] as usize;
    if s.reroute(il, ids, n_used, &probs, n_expert) && !routing::write_ids(t, ids) {
        return Err(StreamError::UnwritableRouting(il));
    }
    Ok(())
}

/// Zeroes, in a router-weight node of layer `il`, the weights of the slots its routing node
/// dropped.
fn zero_dropped(
    streamer: &Mutex<Streamer>,
    il: u32,
    t: &sys::ggml_tensor,
) -> Result<(), StreamError> {
    let s = streamer.lock().map_err(|_| StreamError::Poisoned)?;
    let Some((n_used, dropped)) = s.dropped_slots(il) else {
        return Ok(());
    };
    if routing::zero_slots(t, n_used, dropped) {
        Ok(())
    } else {
        Err(StreamError::UnwritableRouting(il))
    }
}
