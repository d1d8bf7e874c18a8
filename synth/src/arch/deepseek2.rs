//! DeepSeek-V3 (`deepseek2`): multi-head latent attention (queries through a low-rank latent
//! `attn_q_a`/`attn_q_b`, keys and values through one compressed latent `attn_kv_a_mqa` with the
//! absorbed per-head `attn_k_b`/`attn_v_b`, cached as one KV head), a leading dense layer, then MoE
//! layers with a shared expert; routing is a sigmoid whose top-k is chosen among the best expert
//! groups with a per-expert selection bias (`exp_probs_b`), renormalised and scaled.
//! `models/deepseek2.cpp` in the pinned llama.cpp.
//!
//! The routed gate and up matrices are written fused (`ffn_gate_up_exps`, the layout of
//! `convert_hf_to_gguf.py --fuse-gate-up-exps`): llama.cpp's metadata-only load, which the lean
//! streamed load uses, creates that optional tensor whatever the file holds
//! (`create_tensor_gate_up_exps`, llama-model.cpp:3405, and the file-less branch of
//! `create_tensor`, llama-model-loader.cpp:1292-1330), so a file with separate gate/up experts
//! loads the llama.cpp way instead. The NextN/MTP block is left out for the reason given in
//! `glm4moe.rs`.
use super::{plan, Role, TensorPlan};
use crate::error::{Result, SynthError};
use crate::spec::SynthSpec;
use bmoe_engine::gguf::write::GgufBuilder;

/// What sets it apart (`bmoe archs`).
pub(super) const ABOUT: &str = "MLA attention (q and kv latents, absorbed k_b/v_b, one cached KV head); leading dense layer; shared expert; grouped sigmoid top-k with a selection bias (exp_probs_b), renormalised and scaled; fused gate/up experts";

/// Dense layers before the first MoE layer (DeepSeek-V3: 3 of 61).
const DENSE_LEAD: u32 = 1;
/// Expert groups, and how many of them a token's experts come from (V3: 8 and 4).
const GROUPS: u32 = 4;
const GROUPS_USED: u32 = 2;

/// The latent and head widths, scaled from V3's (7168 wide: q latent 1536, kv latent 512, heads
/// of 128 + 64 rotary for keys and 128 for values).
struct Mla {
    q_lora: u32,
    kv_lora: u32,
    nope: u32,
    rope: u32,
    v: u32,
}

fn mla(s: &SynthSpec) -> Mla {
    let hd = s.head_dim();
    Mla {
        q_lora: s.n_embd / 2,
        kv_lora: s.n_embd / 2,
        nope: hd,
        rope: hd / 2,
        v: hd,
    }
}

/// The dense layers' FFN width (V3's is eight routed widths).
fn n_ff_dense(s: &SynthSpec) -> u32 {
    s.n_ff_exp * s.n_expert_used
}

/// MLA caches one latent "head": the preset's KV head count means nothing here.
pub(super) fn adjust(mut s: SynthSpec) -> SynthSpec {
    s.n_head_kv = 1;
    s
}

/// The grouped top-k needs whole groups of at least two experts (the group score is the sum of a
/// group's best two, llama-graph.cpp:2126), and enough experts in the chosen groups.
pub(super) fn validate(s: &SynthSpec) -> Result<()> {
    let per_group = s.n_expert / GROUPS;
    if !s.n_expert.is_multiple_of(GROUPS) || per_group < 2 {
        return Err(SynthError::Invalid(format!(
            "deepseek2 needs experts in {GROUPS} groups of at least 2 (got {} experts)",
            s.n_expert
        )));
    }
    if s.n_expert_used > per_group * GROUPS_USED {
        return Err(SynthError::Invalid(format!(
            "deepseek2 picks {} experts from {GROUPS_USED} groups of {per_group}",
            s.n_expert_used
        )));
    }
    if s.n_layer <= DENSE_LEAD {
        return Err(SynthError::Invalid(format!(
            "deepseek2 needs more than its {DENSE_LEAD} leading dense layers"
        )));
    }
    Ok(())
}

/// The keys beyond the common ones `load_arch_hparams` reads (deepseek2.cpp:3-50).
pub(super) fn metadata(s: &SynthSpec, g: &mut GgufBuilder) {
    let a = "deepseek2";
    let m = mla(s);
    // With MLA the cache holds [kv latent | rotary part] per token as one head, the values being
    // the latent (what llama.cpp's converter writes for V3).
    g.set_u32(&format!("{a}.attention.head_count_kv"), 1);
    g.set_u32(&format!("{a}.attention.key_length"), m.kv_lora + m.rope);
    g.set_u32(&format!("{a}.attention.value_length"), m.kv_lora);
    g.set_u32(&format!("{a}.attention.key_length_mla"), m.nope + m.rope);
    g.set_u32(&format!("{a}.attention.value_length_mla"), m.v);
    g.set_u32(&format!("{a}.attention.q_lora_rank"), m.q_lora);
    g.set_u32(&format!("{a}.attention.kv_lora_rank"), m.kv_lora);
    g.set_u32(&format!("{a}.rope.dimension_count"), m.rope);
    g.set_u32(&format!("{a}.feed_forward_length"), n_ff_dense(s));
    g.set_u32(&format!("{a}.leading_dense_block_count"), DENSE_LEAD);
    g.set_u32(&format!("{a}.expert_feed_forward_length"), s.n_ff_exp);
    g.set_u32(&format!("{a}.expert_shared_count"), 1);
    g.set_f32(&format!("{a}.expert_weights_scale"), 2.5);
    g.set_bool(&format!("{a}.expert_weights_norm"), true);
    // LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID.
    g.set_u32(&format!("{a}.expert_gating_func"), 2);
    g.set_u32(&format!("{a}.expert_group_count"), GROUPS);
    g.set_u32(&format!("{a}.expert_group_used_count"), GROUPS_USED);
}

/// The tensors `load_arch_tensors` creates for the main blocks (deepseek2.cpp:53-150).
pub(super) fn tensors(s: &SynthSpec, n_vocab: usize) -> Vec<TensorPlan> {
    let e = i64::from(s.n_embd);
    let m = mla(s);
    let h = i64::from(s.n_head);
    let (q_lora, kv_lora) = (i64::from(m.q_lora), i64::from(m.kv_lora));
    let (nope, rope, vd) = (i64::from(m.nope), i64::from(m.rope), i64::from(m.v));
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
            t("attn_q_a_norm.weight", vec![q_lora], Role::Norm),
            t("attn_kv_a_norm.weight", vec![kv_lora], Role::Norm),
            t("attn_q_a.weight", vec![e, q_lora], Role::Dense),
            t(
                "attn_q_b.weight",
                vec![q_lora, h * (nope + rope)],
                Role::Dense,
            ),
            t("attn_kv_a_mqa.weight", vec![e, kv_lora + rope], Role::Dense),
            t("attn_k_b.weight", vec![nope, kv_lora, h], Role::Dense),
            t("attn_v_b.weight", vec![kv_lora, vd, h], Role::Dense),
            t("attn_output.weight", vec![h * vd, e], Role::Dense),
            t("ffn_norm.weight", vec![e], Role::Norm),
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
                t("ffn_gate_up_exps.weight", vec![e, 2 * f, x], Role::Expert),
                t("ffn_down_exps.weight", vec![f, e, x], Role::Expert),
                t("ffn_gate_shexp.weight", vec![e, f], Role::Dense),
                t("ffn_up_shexp.weight", vec![e, f], Role::Dense),
                t("ffn_down_shexp.weight", vec![f, e], Role::Dense),
            ]);
        }
    }
    out
}
