//! Gemma 4 MoE (llama.cpp `gemma4`, `src/models/gemma4.cpp`, the 26B-A4B shape): sliding-window
//! layers with a full-attention layer every few (wider heads, proportional rope through
//! `rope_freqs`), q/k norms and a weightless v norm; in every layer a dense MLP (the shared expert)
//! beside the routed experts, whose gate and up halves are one fused `ffn_gate_up_exps` tensor;
//! the router reads a scaled norm of the attention output (`ffn_gate_inp.scale`), and each expert's
//! output is multiplied by its own scale (`ffn_down_exps.scale`, read by GET_ROWS through a
//! reshape and a REPEAT, not by a matmul); softcapped logits.
use super::{Role, TensorPlan};
use crate::spec::{SynthSpec, WeightType};
use bmoe_engine::gguf::write::GgufBuilder;

/// The window of the sliding layers (the real models: 1024); small so test prompts cross it.
const SLIDING_WINDOW: u32 = 64;

/// One line for `bmoe archs`.
pub(super) const ABOUT: &str = "sliding-window and full layers (wider heads, rope_freqs); shared dense MLP beside fused gate_up experts; router on a scaled norm; per-expert output scale read through a reshape/REPEAT/GET_ROWS; softcapped logits";

/// Every `period`-th layer attends fully, the others slide (the real 26B-A4B: 5 sliding, 1 full).
fn period(s: &SynthSpec) -> u32 {
    if s.n_layer >= 12 {
        6
    } else {
        2
    }
}

fn is_full(s: &SynthSpec, il: u32) -> bool {
    il % period(s) == period(s) - 1
}

/// Width of the shared MLP (the real model's is 3x an expert's).
fn n_ff_shared(s: &SynthSpec) -> u32 {
    2 * s.n_ff_exp
}

/// The real releases quantize experts with k-quants where rows allow (Q4_K: rows of 256).
pub(super) fn adjust(mut s: SynthSpec) -> SynthSpec {
    let q4k_rows = s.n_embd.is_multiple_of(256) && s.n_ff_exp.is_multiple_of(256);
    if s.expert_type != WeightType::F32 && q4k_rows {
        s.expert_type = WeightType::Q4_K;
    }
    s
}

/// The keys `llama_model_gemma4::load_arch_hparams` reads beyond the common ones.
pub(super) fn write_metadata(a: &str, s: &SynthSpec, g: &mut GgufBuilder) {
    let hd = s.head_dim();
    g.set_u32(&format!("{a}.attention.key_length"), 2 * hd);
    g.set_u32(&format!("{a}.attention.value_length"), 2 * hd);
    g.set_u32(&format!("{a}.attention.key_length_swa"), hd);
    g.set_u32(&format!("{a}.attention.value_length_swa"), hd);
    g.set_u32(&format!("{a}.rope.dimension_count"), 2 * hd);
    g.set_u32(&format!("{a}.rope.dimension_count_swa"), hd);
    g.set_f32(&format!("{a}.rope.freq_base_swa"), 10000.0);
    g.set_u32(&format!("{a}.attention.sliding_window"), SLIDING_WINDOW);
    let pattern: Vec<i32> = (0..s.n_layer)
        .map(|il| i32::from(!is_full(s, il)))
        .collect();
    g.set_i32_array(&format!("{a}.attention.sliding_window_pattern"), &pattern);
    g.set_u32(&format!("{a}.embedding_length_per_layer_input"), 0);
    g.set_u32(&format!("{a}.expert_feed_forward_length"), s.n_ff_exp);
    g.set_u32(&format!("{a}.feed_forward_length"), n_ff_shared(s));
    g.set_f32(&format!("{a}.final_logit_softcapping"), 30.0);
}

/// The tensors `llama_model_gemma4::load_arch_tensors` creates for an MoE model without per-layer
/// embeddings. `output.weight` is written although the real models tie it to the embeddings: see
/// `docs/architectures.md` (a lean load cannot follow llama.cpp's fallback to the embeddings).
pub(super) fn tensors(s: &SynthSpec, n_vocab: usize) -> Vec<TensorPlan> {
    let (e, v) = (i64::from(s.n_embd), n_vocab as i64);
    let (h, hkv) = (i64::from(s.n_head), i64::from(s.n_head_kv));
    let (f, x, fs) = (
        i64::from(s.n_ff_exp),
        i64::from(s.n_expert),
        i64::from(n_ff_shared(s)),
    );
    let t = super::plan;
    let full_hd = 2 * i64::from(s.head_dim());
    let mut out = vec![
        t(
            "token_embd.weight".into(),
            vec![e, v],
            Role::Embedding,
            None,
        ),
        t("output_norm.weight".into(), vec![e], Role::Norm, None),
        t("output.weight".into(), vec![e, v], Role::Dense, None),
        // One table for every full layer (llama.cpp creates the later ones as duplicates).
        t(
            "rope_freqs.weight".into(),
            vec![full_hd / 2],
            Role::Norm,
            None,
        ),
    ];
    for il in 0..s.n_layer {
        let l = Some(il);
        let hd = if is_full(s, il) {
            full_hd
        } else {
            i64::from(s.head_dim())
        };
        let w = |suffix: &str| format!("blk.{il}.{suffix}.weight");
        out.extend([
            t(w("attn_norm"), vec![e], Role::Norm, l),
            t(w("attn_q"), vec![e, h * hd], Role::Dense, l),
            t(w("attn_k"), vec![e, hkv * hd], Role::Dense, l),
            t(w("attn_v"), vec![e, hkv * hd], Role::Dense, l),
            t(w("attn_output"), vec![h * hd, e], Role::Dense, l),
            t(w("attn_q_norm"), vec![hd], Role::Norm, l),
            t(w("attn_k_norm"), vec![hd], Role::Norm, l),
            t(w("post_attention_norm"), vec![e], Role::Norm, l),
            t(w("layer_output_scale"), vec![1], Role::Scale, l),
            // The shared expert: a dense GELU MLP every token goes through.
            t(w("ffn_norm"), vec![e], Role::Norm, l),
            t(w("ffn_gate"), vec![e, fs], Role::Dense, l),
            t(w("ffn_up"), vec![e, fs], Role::Dense, l),
            t(w("ffn_down"), vec![fs, e], Role::Dense, l),
            t(w("post_ffw_norm"), vec![e], Role::Norm, l),
            t(w("ffn_gate_inp"), vec![e, x], Role::Router, l),
            t(
                format!("blk.{il}.ffn_gate_inp.scale"),
                vec![e],
                Role::Scale,
                l,
            ),
            t(w("pre_ffw_norm_2"), vec![e], Role::Norm, l),
            t(w("post_ffw_norm_1"), vec![e], Role::Norm, l),
            t(w("post_ffw_norm_2"), vec![e], Role::Norm, l),
            t(w("ffn_gate_up_exps"), vec![e, 2 * f, x], Role::Expert, l),
            t(w("ffn_down_exps"), vec![f, e, x], Role::Expert, l),
            t(
                format!("blk.{il}.ffn_down_exps.scale"),
                vec![x],
                Role::Scale,
                l,
            ),
        ]);
    }
    out
}
