//! Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): attention with q/k/v biases, softmax top-k
//! without renormalisation, and in every layer a shared expert scaled by its own sigmoid gate
//! (`ffn_gate_inp_shexp`, one weight per embedding column). `models/qwen2moe.cpp` in the pinned
//! llama.cpp.
use super::{plan, Role, TensorPlan};
use crate::spec::SynthSpec;
use bmoe_engine::gguf::write::GgufBuilder;

/// What sets it apart (`bmoe archs`).
pub(super) const ABOUT: &str = "shared expert behind its own sigmoid gate (ffn_gate_inp_shexp); q/k/v biases; softmax top-k, not renormalised";

/// The shared expert's width: Qwen2-57B-A14B's is the routed width times the experts used
/// (20480 = 8 x 2560).
fn n_ff_shexp(s: &SynthSpec) -> u32 {
    s.n_ff_exp * s.n_expert_used
}

/// The keys beyond the common ones `load_arch_hparams` reads (qwen2moe.cpp:3-7).
pub(super) fn metadata(s: &SynthSpec, g: &mut GgufBuilder) {
    let a = "qwen2moe";
    g.set_u32(&format!("{a}.expert_feed_forward_length"), s.n_ff_exp);
    g.set_u32(
        &format!("{a}.expert_shared_feed_forward_length"),
        n_ff_shexp(s),
    );
    g.set_u32(&format!("{a}.feed_forward_length"), n_ff_shexp(s));
}

/// The tensors `load_arch_tensors` creates (qwen2moe.cpp:16-56), q/k/v biases included.
pub(super) fn tensors(s: &SynthSpec, n_vocab: usize) -> Vec<TensorPlan> {
    let e = i64::from(s.n_embd);
    let kv = i64::from(s.n_head_kv * s.head_dim());
    let (f, x, fs) = (
        i64::from(s.n_ff_exp),
        i64::from(s.n_expert),
        i64::from(n_ff_shexp(s)),
    );
    let mut out = super::globals(s, n_vocab);
    for il in 0..s.n_layer {
        let t =
            |name: &str, ne: Vec<i64>, role| plan(format!("blk.{il}.{name}"), ne, role, Some(il));
        out.extend([
            t("attn_norm.weight", vec![e], Role::Norm),
            t("attn_q.weight", vec![e, e], Role::Dense),
            t("attn_k.weight", vec![e, kv], Role::Dense),
            t("attn_v.weight", vec![e, kv], Role::Dense),
            t("attn_q.bias", vec![e], Role::Bias),
            t("attn_k.bias", vec![kv], Role::Bias),
            t("attn_v.bias", vec![kv], Role::Bias),
            t("attn_output.weight", vec![e, e], Role::Dense),
            t("ffn_norm.weight", vec![e], Role::Norm),
            t("ffn_gate_inp.weight", vec![e, x], Role::Router),
            t("ffn_gate_exps.weight", vec![e, f, x], Role::Expert),
            t("ffn_up_exps.weight", vec![e, f, x], Role::Expert),
            t("ffn_down_exps.weight", vec![f, e, x], Role::Expert),
            // One F32 column, as the real files keep it (llama.cpp quantizes no 1-D tensor).
            t("ffn_gate_inp_shexp.weight", vec![e], Role::Router),
            t("ffn_gate_shexp.weight", vec![e, fs], Role::Dense),
            t("ffn_up_shexp.weight", vec![e, fs], Role::Dense),
            t("ffn_down_shexp.weight", vec![fs, e], Role::Dense),
        ]);
    }
    out
}
