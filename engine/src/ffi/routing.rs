//! Rewriting a routing node in the eval callback (the lossy knobs): the router's probabilities
//! read at `ffn_moe_topk-<il>`, the ids written back into it, and dropped slots' weights zeroed
//! in the `ffn_moe_weights*` nodes, all before the layer's expert matmuls run.
use ggml_sys as sys;

use super::tensor::{name, src};

/// Whether `t` is a computed F32/I32 tensor (of type `ty`) in host memory.
fn host_of(t: &sys::ggml_tensor, ty: sys::ggml_type) -> bool {
    let buf = if t.buffer.is_null() && !t.view_src.is_null() {
        // SAFETY: a non-null view source of a live node is a live tensor.
        unsafe { (*t.view_src).buffer }
    } else {
        t.buffer
    };
    // SAFETY: checked non-null buffer of a live tensor.
    t.type_ == ty
        && !t.data.is_null()
        && !buf.is_null()
        && unsafe { sys::ggml_backend_buffer_is_host(buf) }
}

/// The router's probabilities a routing node chose from: `ffn_moe_topk` is a view of an argsort
/// of `ffn_moe_probs` (or of it plus a selection bias, whose unbiased probabilities are what the
/// weights are taken from). Rows of `n_expert` values, one per token, with `n_expert`; `None`
/// where the graph selects from something else (logits, masked expert groups).
pub fn router_probs(topk: &sys::ggml_tensor) -> Option<(usize, Vec<f32>)> {
    let argsort = src(topk, 0)?;
    if argsort.op != sys::GGML_OP_ARGSORT {
        return None;
    }
    let mut p = src(argsort, 0)?;
    if !name(p).starts_with("ffn_moe_probs-") {
        let biased = p.op == sys::GGML_OP_ADD && name(p).starts_with("ffn_moe_probs_biased-");
        p = src(p, 0).filter(|s| biased && name(s).starts_with("ffn_moe_probs-"))?;
    }
    if !host_of(p, sys::GGML_TYPE_F32) || p.ne[2] != 1 || p.ne[3] != 1 {
        return None;
    }
    let (n0, n1) = (p.ne[0] as usize, p.ne[1] as usize);
    let (nb0, nb1) = (p.nb[0], p.nb[1]);
    let mut out = Vec::with_capacity(n0 * n1);
    for j in 0..n1 {
        for i in 0..n0 {
            // SAFETY: element (i, j) of a host F32 tensor computed before the routing node and
            // still live (the weights' get_rows reads it after the callback), addressed with its
            // own strides.
            out.push(unsafe { *((p.data as *const u8).add(j * nb1 + i * nb0) as *const f32) });
        }
    }
    Some((n0, out))
}

/// Writes `ids` (rows of `ne[0]`) back into a routing node, with its strides; false where the
/// node is not a host I32 tensor of that many ids.
pub fn write_ids(topk: &sys::ggml_tensor, ids: &[i32]) -> bool {
    let (n0, n1) = (topk.ne[0] as usize, topk.ne[1] as usize);
    if !host_of(topk, sys::GGML_TYPE_I32) || ids.len() != n0 * n1 || topk.ne[2] != 1 {
        return false;
    }
    for j in 0..n1 {
        for i in 0..n0 {
            let at = j * topk.nb[1] + i * topk.nb[0];
            // SAFETY: element (i, j) of the routing node's host buffer (the argsort it views),
            // computed before this callback; the nodes that read the ids (the weights' get_rows,
            // the expert matmuls) run after it returns, on this thread's graph.
            unsafe { *((topk.data as *mut u8).add(at) as *mut i32) = ids[i + j * n0] };
        }
    }
    true
}

/// Zeroes the weights of the dropped slots (`dropped`, rows of `n_used`) in a router-weights
/// node, shaped `[1, n_used, n_tokens]` or `[n_used, n_tokens]`; false where it is neither or not
/// host F32.
pub fn zero_slots(w: &sys::ggml_tensor, n_used: usize, dropped: &[bool]) -> bool {
    let (slot_nb, row_nb, rows) = if w.ne[0] == 1 && w.ne[1] as usize == n_used {
        (w.nb[1], w.nb[2], w.ne[2] as usize)
    } else if w.ne[0] as usize == n_used && w.ne[2] == 1 {
        (w.nb[0], w.nb[1], w.ne[1] as usize)
    } else {
        return false;
    };
    if !host_of(w, sys::GGML_TYPE_F32) || w.ne[3] != 1 || dropped.len() != rows * n_used {
        return false;
    }
    for (k, _) in dropped.iter().enumerate().filter(|(_, &d)| d) {
        let at = (k / n_used) * row_nb + (k % n_used) * slot_nb;
        // SAFETY: element (slot, row) of a host F32 node just computed, addressed with its own
        // strides; the next node in graph order reads it after this callback returns.
        unsafe { *((w.data as *mut u8).add(at) as *mut f32) = 0.0 };
    }
    true
}
