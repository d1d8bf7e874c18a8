//! GLM-4.5 (`glm4moe`): a leading dense layer, then MoE layers with one shared expert beside the
//! routed ones; routing is a sigmoid whose top-k is chosen with a per-expert selection bias
//! (`exp_probs_b`) but weighted without it, renormalised and scaled; attention with q/k/v biases
//! and per-head q/k norms, rotary on half of each head. `models/glm4-moe.cpp` in the pinned
//! llama.cpp.
//!
//! The NextN/MTP block the real files append (`nextn_predict_layers = 1`, one more block) is left
//! out: llama.cpp's metadata-only load, which the lean streamed load uses, asserts on it
//! (`llama-model-loader.cpp:1329`, a skipped tensor with no file), and the main graph never
//! reads it.
use super::{plan, Role, TensorPlan};
use crate::error::{Result, SynthError};
use crate::spec::SynthSpec;
use bmoe_engine::gguf::write::GgufBuilder;

/// What sets it apart (`bmoe archs`).
pub(super) const ABOUT: &str = "leading dense layer; shared expert; sigmoid top-k with a selection bias (exp_probs_b), renormalised and scaled; q/k/v biases, per-head q/k norms, partial rotary";

/// Dense layers before the first MoE layer (GLM-4.5 and -Air: 1 of 46/92).
const DENSE_LEAD: u32 = 1;

/// The dense layers' FFN width (GLM-4.5's is eight routed widths).
fn n_ff_dense(s: &SynthSpec) -> u32 {
    s.n_ff_exp * s.n_expert_used
}

/// Rotary on half a head needs an even half; MoE needs a layer after the dense ones.
pub(super) fn validate(s: &SynthSpec) -> Result<()> {
    if !s.head_dim().is_multiple_of(4) {
        return Err(SynthError::Invalid(format!(
            "glm4moe rotates half of each head: head width {} must be a multiple of 4",
            s.head_dim()
        )));
    }
    if s.n_layer <= DENSE_LEAD {
        return Err(SynthError::Invalid(format!(
            "glm4moe needs more than its {DENSE_LEAD} leading dense layers"
        )));
    }
    Ok(())
}

/// The keys beyond the common ones `load_arch_hparams` reads (glm4-moe.cpp:3-19).
pub(super) fn metadata(s: &SynthSpec, g: &mut GgufBuilder) {
    let a = "glm4moe";
    let hd = s.head_dim();
    g.set_u32(&format!("{a}.attention.key_length"), hd);
    g.set_u32(&format!("{a}.attention.value_length"), hd);
    // partial_rotary_factor 0.5.
    g.set_u32(&format!("{a}.rope.dimension_count"), hd / 2);
    g.set_u32(&format!("{a}.feed_forward_length"), n_ff_dense(s));
    g.set_u32(&format!("{a}.expert_feed_forward_length"), s.n_ff_exp);
    g.set_u32(&format!("{a}.expert_shared_count"), 1);
    g.set_u32(&format!("{a}.leading_dense_block_count"), DENSE_LEAD);
    g.set_f32(&format!("{a}.expert_weights_scale"), 2.5);
    g.set_bool(&format!("{a}.expert_weights_norm"), true);
    // LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID.
    g.set_u32(&format!("{a}.expert_gating_func"), 2);
    // One group: no group selection (as the real files say).
    g.set_u32(&format!("{a}.expert_group_count"), 1);
    g.set_u32(&format!("{a}.expert_group_used_count"), 1);
}

/// The tensors `load_arch_tensors` creates for the main blocks (glm4-moe.cpp:28-118).
pub(super) fn tensors(s: &SynthSpec, n_vocab: usize) -> Vec<TensorPlan> {
    let e = i64::from(s.n_embd);
    let hd = i64::from(s.head_dim());
    let (q, kv) = (hd * i64::from(s.n_head), hd * i64::from(s.n_head_kv));
    let (f, x, fd) = (
        i64::from(s.n_ff_exp),
        i64::from(s.n_expert),
        i64::from(n_ff_dense(s)),
    );
    let mut out = super::globals(s, n_vocab);
    for il in 0..s.n_layer {
        let t =
            |name: &str, ne: Vec<i64>, role| plan(format!("blk.{il}.{name}"), ne, role, Some(il));
        out.extend([
            t("attn_norm.weight", vec![e], Role::Norm),
            t("attn_q.weight", vec![e, q], Role::Dense),
            t("attn_k.weight", vec![e, kv], Role::Dense),
            t("attn_v.weight", vec![e, kv], Role::Dense),
            t("attn_q.bias", vec![q], Role::Bias),
            t("attn_k.bias", vec![kv], Role::Bias),
            t("attn_v.bias", vec![kv], Role::Bias),
            t("attn_output.weight", vec![q, e], Role::Dense),
            t("attn_q_norm.weight", vec![hd], Role::Norm),
            t("attn_k_norm.weight", vec![hd], Role::Norm),
            t("post_attention_norm.weight", vec![e], Role::Norm),
        ]);
        if il < DENSE_LEAD {
            out.extend([
                t("ffn_gate.weight", vec![e, fd], Role::Dense),
                t("ffn_up.weight", vec![e, fd], Role::Dense),
                t("ffn_down.weight", vec![fd, e], Role::Dense),
            ]);
        } else {
            out.extend([
                t("ffn_gate_inp.weight", vec![e, x], Role::Router),
                t("exp_probs_b.bias", vec![x], Role::Bias),
                t("ffn_gate_exps.weight", vec![e, f, x], Role::Expert),
                t("ffn_up_exps.weight", vec![e, f, x], Role::Expert),
                t("ffn_down_exps.weight", vec![f, e, x], Role::Expert),
                t("ffn_gate_shexp.weight", vec![e, f], Role::Dense),
                t("ffn_up_shexp.weight", vec![e, f], Role::Dense),
                t("ffn_down_shexp.weight", vec![f, e], Role::Dense),
            ]);
        }
    }
    out
}
