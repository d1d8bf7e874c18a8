//! `qwen35moe` (Qwen3.5 / Qwen3.6 MoE): a hybrid of Gated-DeltaNet layers (a recurrent state per
//! sequence) and gated full-attention layers (every `full_attention_interval`-th), each followed
//! by routed experts (softmax top-k, renormalised) plus a shared expert behind a sigmoid gate.
//! Keys and tensors as llama.cpp reads them: `src/models/qwen35moe.cpp` (`load_arch_hparams`,
//! `load_arch_tensors`, the graph) and `src/models/delta-net-base.cpp`.
use super::{Role, TensorPlan};
use crate::spec::{SynthSpec, WeightType};
use bmoe_engine::gguf::write::GgufBuilder;

/// One line for `bmoe archs`.
pub(crate) const ABOUT: &str = "hybrid: Gated-DeltaNet (recurrent state) layers and gated attention every 4th; gate/up/down experts (softmax top-k renormalised) plus a sigmoid-gated shared expert";

/// Every `FULL_ATTENTION_INTERVAL`-th layer is full attention, the rest Gated DeltaNet (the
/// released models use 4, which is also llama.cpp's default).
pub(crate) const FULL_ATTENTION_INTERVAL: u32 = 4;

/// The DeltaNet convolution's kernel width (4 in the released models).
const CONV_KERNEL: u32 = 4;

/// Whether layer `il` is a Gated-DeltaNet (recurrent) layer.
pub(crate) fn is_recurrent(il: u32) -> bool {
    !(il + 1).is_multiple_of(FULL_ATTENTION_INTERVAL)
}

/// The DeltaNet's shape, derived from the spec so every preset stays consistent: key heads =
/// kv heads, value heads = heads, head width = the attention head width (the released 35B-A3B
/// has 16 key heads, 32 value heads, width 128).
struct DeltaNet {
    head_dim: i64,
    k_heads: i64,
    v_heads: i64,
}

impl DeltaNet {
    fn of(s: &SynthSpec) -> Self {
        Self {
            head_dim: i64::from(s.head_dim()),
            k_heads: i64::from(s.n_head_kv),
            v_heads: i64::from(s.n_head),
        }
    }
    fn key_dim(&self) -> i64 {
        self.head_dim * self.k_heads
    }
    fn value_dim(&self) -> i64 {
        self.head_dim * self.v_heads
    }
}

/// Rotary sections (text positions use the first three the same way): a quarter of the head is
/// rotated, as in the released models (`partial_rotary_factor` 0.25, sections 11/11/10 of 32).
fn rope_dims(s: &SynthSpec) -> (u32, [i32; 4]) {
    let n_rot = (s.head_dim() / 4).max(2);
    let pairs = n_rot / 2;
    let a = pairs.div_ceil(3);
    let b = (pairs - a).div_ceil(2);
    (n_rot, [a as i32, b as i32, (pairs - a - b) as i32, 0])
}

/// The released GGUFs (Q4_K_M) keep routed experts in Q4_K: a preset asking for Q4_0 experts
/// gets Q4_K where every expert row is a whole number of its 256-wide blocks.
pub(crate) fn adjust(mut s: SynthSpec) -> SynthSpec {
    if s.expert_type == WeightType::Q4_0 && [s.n_embd, s.n_ff_exp].iter().all(|w| w % 256 == 0) {
        s.expert_type = WeightType::Q4_K;
    }
    s
}

pub(crate) fn write_metadata(s: &SynthSpec, g: &mut GgufBuilder) {
    let a = "qwen35moe";
    let d = DeltaNet::of(s);
    let (n_rot, sections) = rope_dims(s);
    g.set_u32(&format!("{a}.attention.key_length"), s.head_dim());
    g.set_u32(&format!("{a}.attention.value_length"), s.head_dim());
    g.set_u32(&format!("{a}.rope.dimension_count"), n_rot);
    g.set_i32_array(&format!("{a}.rope.dimension_sections"), &sections);
    g.set_u32(&format!("{a}.expert_feed_forward_length"), s.n_ff_exp);
    g.set_u32(
        &format!("{a}.expert_shared_feed_forward_length"),
        s.n_ff_exp,
    );
    g.set_u32(&format!("{a}.feed_forward_length"), s.n_ff_exp);
    g.set_u32(
        &format!("{a}.full_attention_interval"),
        FULL_ATTENTION_INTERVAL,
    );
    g.set_u32(&format!("{a}.ssm.conv_kernel"), CONV_KERNEL);
    g.set_u32(&format!("{a}.ssm.state_size"), d.head_dim as u32);
    g.set_u32(&format!("{a}.ssm.group_count"), d.k_heads as u32);
    g.set_u32(&format!("{a}.ssm.time_step_rank"), d.v_heads as u32);
    g.set_u32(&format!("{a}.ssm.inner_size"), d.value_dim() as u32);
}

pub(crate) fn tensors(s: &SynthSpec, n_vocab: usize) -> Vec<TensorPlan> {
    let e = i64::from(s.n_embd);
    let (hd, h, hkv) = s.head_shape();
    let (f, x) = (i64::from(s.n_ff_exp), i64::from(s.n_expert));
    let d = DeltaNet::of(s);
    let t = super::plan;
    let mut out = super::globals(s, n_vocab);
    for il in 0..s.n_layer {
        let l = Some(il);
        let n = |suffix: &str| format!("blk.{il}.{suffix}");
        out.extend([
            t(n("attn_norm.weight"), vec![e], Role::Norm, l),
            t(n("post_attention_norm.weight"), vec![e], Role::Norm, l),
        ]);
        if is_recurrent(il) {
            let conv = 2 * d.key_dim() + d.value_dim();
            out.extend([
                t(n("attn_qkv.weight"), vec![e, conv], Role::Dense, l),
                t(
                    n("attn_gate.weight"),
                    vec![e, d.value_dim()],
                    Role::Dense,
                    l,
                ),
                t(
                    n("ssm_conv1d.weight"),
                    vec![i64::from(CONV_KERNEL), conv],
                    Role::Small,
                    l,
                ),
                t(n("ssm_dt.bias"), vec![d.v_heads], Role::Small, l),
                t(n("ssm_a"), vec![d.v_heads], Role::Decay, l),
                t(n("ssm_beta.weight"), vec![e, d.v_heads], Role::Dense, l),
                t(n("ssm_alpha.weight"), vec![e, d.v_heads], Role::Dense, l),
                t(n("ssm_norm.weight"), vec![d.head_dim], Role::Norm, l),
                t(n("ssm_out.weight"), vec![d.value_dim(), e], Role::Dense, l),
            ]);
        } else {
            // The query projection also yields the output gate: twice the query width.
            out.extend([
                t(n("attn_q.weight"), vec![e, 2 * h * hd], Role::Dense, l),
                t(n("attn_k.weight"), vec![e, hkv * hd], Role::Dense, l),
                t(n("attn_v.weight"), vec![e, hkv * hd], Role::Dense, l),
                t(n("attn_output.weight"), vec![h * hd, e], Role::Dense, l),
                t(n("attn_q_norm.weight"), vec![hd], Role::Norm, l),
                t(n("attn_k_norm.weight"), vec![hd], Role::Norm, l),
            ]);
        }
        out.extend([
            t(n("ffn_gate_inp.weight"), vec![e, x], Role::Router, l),
            t(n("ffn_gate_exps.weight"), vec![e, f, x], Role::Expert, l),
            t(n("ffn_up_exps.weight"), vec![e, f, x], Role::Expert, l),
            t(n("ffn_down_exps.weight"), vec![f, e, x], Role::Expert, l),
            // The shared expert: its gate is one row (a sigmoid scalar per token), F32 as released.
            t(n("ffn_gate_inp_shexp.weight"), vec![e], Role::Small, l),
            t(n("ffn_gate_shexp.weight"), vec![e, f], Role::Dense, l),
            t(n("ffn_up_shexp.weight"), vec![e, f], Role::Dense, l),
            t(n("ffn_down_shexp.weight"), vec![f, e], Role::Dense, l),
        ]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fourth_layer_attends() {
        let r: Vec<bool> = (0..8).map(is_recurrent).collect();
        assert_eq!(r, [true, true, true, false, true, true, true, false]);
    }

    #[test]
    fn rope_sections_cover_the_rotated_pairs() {
        for hd in [32u32, 64, 128, 256] {
            let s = SynthSpec {
                n_embd: hd * 4,
                n_head: 4,
                ..SynthSpec::preset(crate::Preset::Tiny, crate::SynthArch::Qwen3Moe)
            };
            let (n_rot, sec) = rope_dims(&s);
            assert_eq!(sec.iter().sum::<i32>() as u32, n_rot / 2, "{hd}");
        }
    }
}
