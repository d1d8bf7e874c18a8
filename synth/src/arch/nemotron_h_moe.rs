//! `nemotron_h_moe` (Nemotron-H MoE, Nemotron 3): blocks that are each one of a Mamba2 mixer (a
//! recurrent state per sequence), a NoPE attention mixer or an MoE feed-forward. The MoE has
//! up/down experts with no gate (ReLU squared), sigmoid routing with a selection bias
//! (`exp_probs_b`), a shared up/down expert, and latent projections around the routed experts
//! (the experts work at `moe_latent_size`, not the model width). llama.cpp tells the block kinds
//! apart by per-layer `head_count_kv` and `feed_forward_length` (both 0: Mamba2; kv heads only:
//! attention; a feed-forward width: MoE). Keys and tensors: `src/models/nemotron-h.cpp`
//! (`load_arch_hparams`, `load_arch_tensors`, the graph), `src/models/mamba-base.cpp`.
use super::{Role, TensorPlan};
use crate::error::{Result, SynthError};
use crate::spec::{SynthSpec, WeightType};
use bmoe_engine::gguf::write as quant;
use bmoe_engine::gguf::write::GgufBuilder;

/// One line for `bmoe archs`.
pub(crate) const ABOUT: &str = "hybrid: Mamba2 (recurrent state), attention and MoE blocks; up/down experts without a gate (ReLU squared), sigmoid routing with a selection bias, latent projections, a shared expert";

/// The Mamba2 convolution's kernel width (4 in the released models).
const CONV_KERNEL: u32 = 4;

/// What block `il` is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Block {
    /// A Mamba2 mixer.
    Mamba,
    /// A self-attention mixer (no rotary embedding).
    Attention,
    /// A routed-expert feed-forward.
    Moe,
}

/// The block pattern: every odd block is MoE, the even ones alternate Mamba2 and attention
/// (`M E * E M E * E ...`), so even the 4-block tiny preset has each kind and two routed layers
/// (the released 30B-A3B has 23 Mamba2, 23 MoE and 6 attention blocks).
pub(crate) fn block(il: u32) -> Block {
    match il % 4 {
        1 | 3 => Block::Moe,
        2 => Block::Attention,
        _ => Block::Mamba,
    }
}

/// The Mamba2 mixer's shape, from the spec: inner width = model width, heads = attention heads,
/// groups = kv heads, state = the attention head width (the released 30B-A3B: 64 heads of 64,
/// 8 groups, state 128).
struct Mamba {
    inner: i64,
    heads: i64,
    groups: i64,
    state: i64,
}

impl Mamba {
    fn of(s: &SynthSpec) -> Self {
        Self {
            inner: i64::from(s.n_embd),
            heads: i64::from(s.n_head),
            groups: i64::from(s.n_head_kv),
            state: i64::from(s.head_dim()),
        }
    }
    /// Width of the convolved `x, B, C`.
    fn conv(&self) -> i64 {
        self.inner + 2 * self.groups * self.state
    }
}

/// The routed experts' width (`moe_latent_size`): three quarters of the model width (the
/// released Super has a quarter; wider here so the tiny model's experts outgrow the 1 MiB cache
/// the eviction gate G2 runs with).
pub(crate) fn latent(s: &SynthSpec) -> u32 {
    s.n_embd / 4 * 3
}

/// The shared expert's width: twice a routed expert's, as released (3712 vs 1856).
fn shared_ff(s: &SynthSpec) -> u32 {
    2 * s.n_ff_exp
}

/// The released GGUFs (Q4_K_M) keep routed experts in Q4_K: a preset asking for Q4_0 experts
/// gets Q4_K where every expert row is a whole number of its 256-wide blocks.
pub(crate) fn adjust(mut s: SynthSpec) -> SynthSpec {
    // Many small experts, as released (128, top-6): four times the preset's count.
    s.n_expert *= 4;
    if s.expert_type == WeightType::Q4_0 && [latent(&s), s.n_ff_exp].iter().all(|w| w % 256 == 0) {
        s.expert_type = WeightType::Q4_K;
    }
    s
}

/// The widths the shared checks do not see: the experts' latent rows, the latent and shared
/// projections' rows.
pub(crate) fn validate(s: &SynthSpec) -> Result<()> {
    let rows = [
        (s.expert_type, latent(s), "expert (latent)"),
        (s.dense_type, latent(s), "dense (latent)"),
        (s.dense_type, shared_ff(s), "dense (shared expert)"),
    ];
    for (ty, w, what) in rows {
        let b = quant::block_size(ty.ggml()) as u32;
        if w == 0 || !w.is_multiple_of(b) {
            return Err(SynthError::Invalid(format!(
                "nemotron_h_moe: {what} type {ty:?} packs rows in blocks of {b}, but a row is {w} wide"
            )));
        }
    }
    Ok(())
}

pub(crate) fn write_metadata(s: &SynthSpec, g: &mut GgufBuilder) {
    let a = "nemotron_h_moe";
    let m = Mamba::of(s);
    let blocks: Vec<Block> = (0..s.n_layer).map(block).collect();
    let kv: Vec<i32> = blocks
        .iter()
        .map(|b| {
            if *b == Block::Attention {
                s.n_head_kv as i32
            } else {
                0
            }
        })
        .collect();
    let ff: Vec<i32> = blocks
        .iter()
        .map(|b| {
            if *b == Block::Moe {
                s.n_ff_exp as i32
            } else {
                0
            }
        })
        .collect();
    // Per-layer arrays: these decide each block's kind (the scalar written before is replaced).
    g.set_i32_array(&format!("{a}.attention.head_count_kv"), &kv);
    g.set_i32_array(&format!("{a}.feed_forward_length"), &ff);
    g.set_u32(&format!("{a}.attention.key_length"), s.head_dim());
    g.set_u32(&format!("{a}.attention.value_length"), s.head_dim());
    g.set_f32(&format!("{a}.attention.layer_norm_epsilon"), 1e-5);
    g.set_u32(&format!("{a}.expert_feed_forward_length"), s.n_ff_exp);
    g.set_u32(
        &format!("{a}.expert_shared_feed_forward_length"),
        shared_ff(s),
    );
    g.set_u32(&format!("{a}.expert_shared_count"), 1);
    g.set_bool(&format!("{a}.expert_weights_norm"), true);
    g.set_f32(&format!("{a}.expert_weights_scale"), 2.5);
    g.set_u32(&format!("{a}.moe_latent_size"), latent(s));
    g.set_u32(&format!("{a}.ssm.conv_kernel"), CONV_KERNEL);
    g.set_u32(&format!("{a}.ssm.inner_size"), m.inner as u32);
    g.set_u32(&format!("{a}.ssm.state_size"), m.state as u32);
    g.set_u32(&format!("{a}.ssm.time_step_rank"), m.heads as u32);
    g.set_u32(&format!("{a}.ssm.group_count"), m.groups as u32);
}

pub(crate) fn tensors(s: &SynthSpec, n_vocab: usize) -> Vec<TensorPlan> {
    let e = i64::from(s.n_embd);
    let (hd, h, hkv) = s.head_shape();
    let (f, x) = (i64::from(s.n_ff_exp), i64::from(s.n_expert));
    let (lat, fs) = (i64::from(latent(s)), i64::from(shared_ff(s)));
    let m = Mamba::of(s);
    let t = super::plan;
    let mut out = super::globals(s, n_vocab);
    for il in 0..s.n_layer {
        let l = Some(il);
        let n = |suffix: &str| format!("blk.{il}.{suffix}");
        out.push(t(n("attn_norm.weight"), vec![e], Role::Norm, l));
        match block(il) {
            Block::Mamba => {
                let in_proj = 2 * m.inner + 2 * m.groups * m.state + m.heads;
                out.extend([
                    t(n("ssm_in.weight"), vec![e, in_proj], Role::Dense, l),
                    t(
                        n("ssm_conv1d.weight"),
                        vec![i64::from(CONV_KERNEL), m.conv()],
                        Role::Small,
                        l,
                    ),
                    // Optional for the loader, but the graph adds it unconditionally.
                    t(n("ssm_conv1d.bias"), vec![m.conv()], Role::Small, l),
                    t(n("ssm_dt.bias"), vec![m.heads], Role::Small, l),
                    t(n("ssm_a"), vec![1, m.heads], Role::Decay, l),
                    t(n("ssm_d"), vec![1, m.heads], Role::Norm, l),
                    t(
                        n("ssm_norm.weight"),
                        vec![m.inner / m.groups, m.groups],
                        Role::Norm,
                        l,
                    ),
                    t(n("ssm_out.weight"), vec![m.inner, e], Role::Dense, l),
                ]);
            }
            Block::Attention => out.extend([
                t(n("attn_q.weight"), vec![e, h * hd], Role::Dense, l),
                t(n("attn_k.weight"), vec![e, hkv * hd], Role::Dense, l),
                t(n("attn_v.weight"), vec![e, hkv * hd], Role::Dense, l),
                t(n("attn_output.weight"), vec![h * hd, e], Role::Dense, l),
            ]),
            Block::Moe => out.extend([
                t(n("ffn_gate_inp.weight"), vec![e, x], Role::Router, l),
                t(n("exp_probs_b.bias"), vec![x], Role::Small, l),
                t(n("ffn_latent_down.weight"), vec![e, lat], Role::Dense, l),
                t(n("ffn_latent_up.weight"), vec![lat, e], Role::Dense, l),
                t(n("ffn_up_exps.weight"), vec![lat, f, x], Role::Expert, l),
                t(n("ffn_down_exps.weight"), vec![f, lat, x], Role::Expert, l),
                t(n("ffn_up_shexp.weight"), vec![e, fs], Role::Dense, l),
                t(n("ffn_down_shexp.weight"), vec![fs, e], Role::Dense, l),
            ]),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_pattern_has_every_kind_in_four() {
        let b: Vec<Block> = (0..4).map(block).collect();
        assert_eq!(b, [Block::Mamba, Block::Moe, Block::Attention, Block::Moe]);
    }
}
