//! The capture pass: one decode with a hook that asks for every node, recording which weights
//! each op reads, the expert matrices and routers per layer, and the graph's order.
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use ggml_sys as sys;

use super::names::{expert_role, layer_of, node_layer, ExpertRole};
use crate::ffi::context::EvalHook;
use crate::ffi::tensor::{self, TensorPtr};

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
            let router = tensor::src(t, 0).map(tensor::view_root);
            if let Some(w) = router.and_then(TensorPtr::weight) {
                if t.op == sys::GGML_OP_MUL_MAT {
                    c.routers.insert(il, w);
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
            let Some(w) = TensorPtr::weight(s) else {
                continue;
            };
            let sname = tensor::name(s);
            c.weights.insert(sname.to_string(), w);
            let matmul = i == 0 && matches!(t.op, sys::GGML_OP_MUL_MAT | sys::GGML_OP_MUL_MAT_ID);
            if !matmul && !view_op {
                c.non_matmul.insert(sname.to_string());
            }
            if i == 0 && t.op == sys::GGML_OP_MUL_MAT_ID {
                if let Some((il, role)) =
                    layer_of(sname).and_then(|(il, suf)| Some((il, expert_role(suf)?)))
                {
                    c.experts.entry(il).or_default().insert(role, w);
                }
            }
        }
        false
    }

    fn observe(&mut self, _t: &sys::ggml_tensor) {}
}
