//! The one graph hook (llama.cpp's `cb_eval`): a capture pass that learns the graph, and the
//! dispatcher that afterwards asks only for the routing nodes.
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use ggml_sys as sys;

use crate::device::arena::Arena;
use crate::ffi::context::EvalHook;
use crate::ffi::tensor::{self, TensorPtr};
use crate::stream::Streamer;

/// Which expert matrix a `MUL_MAT_ID` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ExpertRole {
    /// `ffn_gate_exps`.
    Gate,
    /// `ffn_up_exps`.
    Up,
    /// `ffn_down_exps`.
    Down,
    /// Fused `ffn_gate_up_exps`.
    GateUp,
}

/// `blk.<il>.<suffix>` -> (il, suffix).
pub fn layer_of(name: &str) -> Option<(u32, &str)> {
    let rest = name.strip_prefix("blk.")?;
    let (il, suffix) = rest.split_once('.')?;
    Some((il.parse().ok()?, suffix))
}

/// `<prefix>-<il>` node names -> il.
pub fn node_layer(name: &str, prefix: &str) -> Option<u32> {
    name.strip_prefix(prefix)?.strip_prefix('-')?.parse().ok()
}

fn expert_role(suffix: &str) -> Option<ExpertRole> {
    Some(match suffix {
        "ffn_gate_exps.weight" => ExpertRole::Gate,
        "ffn_up_exps.weight" => ExpertRole::Up,
        "ffn_down_exps.weight" => ExpertRole::Down,
        "ffn_gate_up_exps.weight" => ExpertRole::GateUp,
        _ => return None,
    })
}

/// What the capture pass learned about the model's graph.
#[derive(Debug, Default)]
pub struct Capture {
    /// Per layer, the expert matrices its `MUL_MAT_ID`s read.
    pub experts: BTreeMap<u32, BTreeMap<ExpertRole, TensorPtr>>,
    /// Layers with a routing node `ffn_moe_topk-<il>`.
    pub routing: BTreeSet<u32>,
    /// Every weight some node reads, by name.
    pub weights: BTreeMap<String, TensorPtr>,
    /// Per layer, the name of its last node in graph order.
    pub last_node: BTreeMap<u32, String>,
    /// Weights some op reads other than as the matrix of a `MUL_MAT`/`MUL_MAT_ID` (through views
    /// too): a backend may hold weight buffers in a form only its matmuls address.
    pub non_matmul: BTreeSet<String>,
    /// Per MoE layer, its router matrix (the weight of the `ffn_moe_logits-<il>` matmul).
    pub routers: BTreeMap<u32, TensorPtr>,
    /// Every node in graph order: its address, op and source addresses (`None` for an empty
    /// slot). Addresses identify tensors within this one pass only.
    pub nodes: Vec<CapturedNode>,
}

/// One node of the captured graph.
#[derive(Debug, Clone)]
pub struct CapturedNode {
    /// The node's address.
    pub addr: usize,
    /// Its ggml op.
    pub op: sys::ggml_op,
    /// Its sources' addresses, by slot.
    pub srcs: [Option<usize>; sys::GGML_MAX_SRC],
}

/// The capture pass: sees every node once (ask phase), isolates none.
pub struct CaptureHook(pub Arc<Mutex<Capture>>);

impl EvalHook for CaptureHook {
    fn ask(&mut self, t: &sys::ggml_tensor) -> bool {
        let Ok(mut c) = self.0.lock() else {
            return false;
        };
        let name = tensor::name(t);
        if let Some(il) = node_layer(name, "ffn_moe_topk") {
            c.routing.insert(il);
        }
        if let Some(il) = node_layer(name, "ffn_moe_logits") {
            if let Some(w) = tensor::src(t, 0).map(tensor::view_root) {
                if t.op == sys::GGML_OP_MUL_MAT && tensor::is_weight(w) {
                    c.routers.insert(il, TensorPtr::from_graph(w));
                }
            }
        }
        if let Some((il, _)) = name
            .rsplit_once('-')
            .and_then(|(_, n)| n.parse::<u32>().ok().map(|n| (n, ())))
        {
            c.last_node.insert(il, name.to_string());
        }
        let mut srcs = [None; sys::GGML_MAX_SRC];
        for (i, slot) in srcs.iter_mut().enumerate() {
            *slot = tensor::src(t, i).map(|s| s as *const sys::ggml_tensor as usize);
        }
        c.nodes.push(CapturedNode {
            addr: t as *const sys::ggml_tensor as usize,
            op: t.op,
            srcs,
        });
        // A view of a weight is not itself a use: its consumer is, and sees the view as a source.
        let view_op = matches!(
            t.op,
            sys::GGML_OP_VIEW
                | sys::GGML_OP_RESHAPE
                | sys::GGML_OP_PERMUTE
                | sys::GGML_OP_TRANSPOSE
        );
        for i in 0..sys::GGML_MAX_SRC {
            let Some(s) = tensor::src(t, i) else { continue };
            // Views share their source's buffer: the weight is the tensor they view.
            let s = tensor::view_root(s);
            if !tensor::is_weight(s) {
                continue;
            }
            let sname = tensor::name(s);
            c.weights
                .insert(sname.to_string(), TensorPtr::from_graph(s));
            let matmul = i == 0 && matches!(t.op, sys::GGML_OP_MUL_MAT | sys::GGML_OP_MUL_MAT_ID);
            if !matmul && !view_op {
                c.non_matmul.insert(sname.to_string());
            }
            if i == 0 && t.op == sys::GGML_OP_MUL_MAT_ID {
                if let Some((il, role)) =
                    layer_of(sname).and_then(|(il, suf)| Some((il, expert_role(suf)?)))
                {
                    c.experts
                        .entry(il)
                        .or_default()
                        .insert(role, TensorPtr::from_graph(s));
                }
            }
        }
        false
    }

    fn observe(&mut self, _t: &sys::ggml_tensor) {}
}

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
    /// The context's abort flag.
    pub abort: Arc<AtomicBool>,
    /// Where a failure is kept for the session to report.
    pub error: Arc<Mutex<Option<String>>>,
}

impl EvalHook for EngineHook {
    fn ask(&mut self, t: &sys::ggml_tensor) -> bool {
        // Cheap: a byte-prefix test on every node of every graph.
        let topk = t.name[..13].iter().map(|&c| c as u8).eq(*b"ffn_moe_topk-");
        if let Some(arena) = &self.arena {
            // Lock-free outside wide graphs: decode asks never touch the arena's lock.
            if self.arena_active.load(Ordering::Relaxed) {
                let Ok(mut a) = arena.lock() else {
                    return false;
                };
                // Nodes whose result lives in device memory are the nodes the device computes.
                if tensor::on_buft(t, a.buft()) {
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
        topk && self.streamer.is_some()
    }

    fn observe(&mut self, t: &sys::ggml_tensor) {
        let fail = |msg: String| {
            if let Ok(mut e) = self.error.lock() {
                e.get_or_insert(msg);
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
                                None => {
                                    Err(format!("routing node of layer {il} is not readable I32"))
                                }
                            },
                            (None, Some(il)) => a.on_layer_done(il),
                            (None, None) => Ok(()),
                        }
                    }
                    Err(_) => Err("the arena panicked earlier".into()),
                };
                if let Err(e) = r {
                    fail(e);
                }
                return;
            }
        }
        let Some(streamer) = &self.streamer else {
            return;
        };
        let Some(il) = routing else {
            return;
        };
        let Some(ids) = tensor::read_ids(t) else {
            return fail(format!(
                "routing node of layer {il} is not readable host I32"
            ));
        };
        let r = match streamer.lock() {
            Ok(mut s) => s.ensure(il, &ids).map(|()| {
                // Decode-sized graphs only (ne[1] = tokens): the copy of a wide piece's rows
                // would cost more than any read ahead saves.
                if t.ne[1] as usize <= crate::stream::MAX_PREFETCH_TOKENS {
                    if !s.wants_router_input() {
                        s.prefetch_after(il, &[], 0);
                    } else if let Some((n_embd, x)) = tensor::router_input(t) {
                        s.prefetch_after(il, &x, n_embd);
                    }
                }
            }),
            Err(_) => Err("the expert streamer panicked earlier".into()),
        };
        if let Err(e) = r {
            fail(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(
            layer_of("blk.12.ffn_up_exps.weight"),
            Some((12, "ffn_up_exps.weight"))
        );
        assert_eq!(layer_of("token_embd.weight"), None);
        assert_eq!(node_layer("ffn_moe_topk-3", "ffn_moe_topk"), Some(3));
        assert_eq!(node_layer("ffn_moe_topk-3 (view)", "ffn_moe_topk"), None);
        assert_eq!(
            expert_role("ffn_gate_up_exps.weight"),
            Some(ExpertRole::GateUp)
        );
    }
}
