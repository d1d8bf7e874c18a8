//! gpt-oss (llama.cpp `gpt-oss`, `src/models/openai-moe.cpp`): attention with q/k/v/output biases
//! and a learned sink per head, sliding-window layers alternating with full ones (the first one
//! sliding), a biased router whose weights are a softmax over the chosen experts only, and
//! gate/up/down experts in MXFP4 with per-expert biases that `ADD_ID` reads with the routed ids.
use super::{Role, TensorPlan};
use crate::spec::{SynthSpec, WeightType};
use bmoe_engine::gguf::write::GgufBuilder;

/// The window of the sliding layers. The real models use 128; half of it here so that the test
/// prompts (60 to 160 tokens) cross it.
const SLIDING_WINDOW: u32 = 64;

/// One line for `bmoe archs`.
pub(super) const ABOUT: &str = "q/k/v/output biases, attention sinks, sliding-window layers alternating with full ones; biased router, softmax over the chosen experts; MXFP4 gate/up/down experts with per-expert biases (ADD_ID)";

/// The real releases ship their experts in MXFP4 (blocks of 32, no importance matrix needed), 32
/// of them or more per layer. At least 16 here: MXFP4 packs the tiny preset's 8 experts into less
/// than the smallest cache the gates can ask for (1 MiB), which would then never evict.
pub(super) fn adjust(mut s: SynthSpec) -> SynthSpec {
    s.expert_type = WeightType::MXFP4;
    s.n_expert = s.n_expert.max(16);
    s
}

/// The keys `llama_model_openai_moe::load_arch_hparams` reads beyond the common ones.
pub(super) fn write_metadata(a: &str, s: &SynthSpec, g: &mut GgufBuilder) {
    g.set_u32(&format!("{a}.attention.key_length"), s.head_dim());
    g.set_u32(&format!("{a}.attention.value_length"), s.head_dim());
    g.set_u32(&format!("{a}.expert_feed_forward_length"), s.n_ff_exp);
    g.set_u32(&format!("{a}.feed_forward_length"), s.n_ff_exp);
    g.set_u32(&format!("{a}.attention.sliding_window"), SLIDING_WINDOW);
}

/// The tensors `llama_model_openai_moe::load_arch_tensors` creates (the optional q/k/v biases
/// too: the real checkpoints have them).
pub(super) fn tensors(s: &SynthSpec, n_vocab: usize) -> Vec<TensorPlan> {
    let e = i64::from(s.n_embd);
    let (hd, h, hkv) = s.head_shape();
    let (f, x) = (i64::from(s.n_ff_exp), i64::from(s.n_expert));
    let t = super::plan;
    let mut out = super::globals(s, n_vocab);
    for il in 0..s.n_layer {
        let l = Some(il);
        let w = |suffix: &str| format!("blk.{il}.{suffix}.weight");
        let b = |suffix: &str| format!("blk.{il}.{suffix}.bias");
        out.extend([
            t(w("attn_norm"), vec![e], Role::Norm, l),
            t(w("post_attention_norm"), vec![e], Role::Norm, l),
            t(w("attn_q"), vec![e, h * hd], Role::Dense, l),
            t(b("attn_q"), vec![h * hd], Role::Bias, l),
            t(w("attn_k"), vec![e, hkv * hd], Role::Dense, l),
            t(b("attn_k"), vec![hkv * hd], Role::Bias, l),
            t(w("attn_v"), vec![e, hkv * hd], Role::Dense, l),
            t(b("attn_v"), vec![hkv * hd], Role::Bias, l),
            t(w("attn_output"), vec![h * hd, e], Role::Dense, l),
            t(b("attn_output"), vec![e], Role::Bias, l),
            t(w("attn_sinks"), vec![h], Role::Bias, l),
            t(w("ffn_gate_inp"), vec![e, x], Role::Router, l),
            t(b("ffn_gate_inp"), vec![x], Role::Bias, l),
            t(w("ffn_gate_exps"), vec![e, f, x], Role::Expert, l),
            t(b("ffn_gate_exps"), vec![f, x], Role::Bias, l),
            t(w("ffn_up_exps"), vec![e, f, x], Role::Expert, l),
            t(b("ffn_up_exps"), vec![f, x], Role::Bias, l),
            t(w("ffn_down_exps"), vec![f, e, x], Role::Expert, l),
            t(b("ffn_down_exps"), vec![e, x], Role::Bias, l),
        ]);
    }
    out
}
