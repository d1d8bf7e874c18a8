//! Per-architecture knowledge of synthetic models, in one place (this folder): metadata keys and
//! the tensors each architecture's llama.cpp graph creates. An architecture with more than a few
//! lines of its own lives in a file here named for it; this module dispatches.
mod gemma4;
mod gpt_oss;
mod nemotron_h_moe;
mod qwen35moe;

use super::spec::SynthSpec;
use crate::error::{Result, SynthError};
use bmoe_engine::gguf::write::GgufBuilder;

mod deepseek2;
mod glm4moe;
mod qwen2moe;

/// Architectures `synth` can write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SynthArch {
    /// Qwen3-MoE: per-head q/k norms, softmax routing with renormalised weights.
    Qwen3Moe,
    /// OLMoE: full-width q/k norms, softmax routing without renormalisation.
    Olmoe,
    /// Llama: a dense model (no experts), for the paths that must refuse or ignore experts.
    Llama,
    /// gpt-oss: attention sinks, sliding-window layers, biased router, MXFP4 experts with biases.
    GptOss,
    /// Gemma 4 MoE: a shared MLP beside fused gate_up experts with a per-expert scale.
    Gemma4,
    /// Qwen3.5/3.6 MoE: Gated-DeltaNet (recurrent) and gated attention layers, a shared expert.
    Qwen35Moe,
    /// Nemotron-H MoE: Mamba2, attention and MoE blocks; ungated ReLU² experts, latent projections.
    NemotronHMoe,
    /// Qwen2-MoE: a shared expert behind its own sigmoid gate.
    Qwen2Moe,
    /// GLM-4.5: leading dense layer, shared expert, biased sigmoid routing.
    Glm4Moe,
    /// DeepSeek-V3: MLA attention, leading dense layer, shared expert, grouped biased routing.
    Deepseek2,
}

/// What a tensor holds, which decides how its data is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// Norm weights: ones, F32.
    Norm,
    /// Token embeddings (with the offset that makes router skew work).
    Embedding,
    /// A dense matrix in the dense type.
    Dense,
    /// The router, F32.
    Router,
    /// Routed experts `[ne0, ne1, n_expert]` in the expert type.
    Expert,
    /// Biases and attention sinks: small values around zero, F32.
    Bias,
    /// Scales some op multiplies by: values around one, F32.
    Scale,
    /// Small F32 values, for what a non-matmul op reads (convolution kernels, biases, gates).
    Small,
    /// Negative F32 values: a recurrent layer's decay rates (`A`), so its state fades.
    Decay,
}

/// One tensor to write.
#[derive(Debug, Clone)]
pub(crate) struct TensorPlan {
    pub name: String,
    pub ne: Vec<i64>,
    pub role: Role,
    /// The layer, for sharding (`None` = goes with the first shard).
    pub layer: Option<u32>,
}

/// A `TensorPlan`.
/// The tensors outside the blocks every architecture here has: token embeddings, the final norm
/// and the output matrix.
pub(super) fn globals(s: &SynthSpec, n_vocab: usize) -> Vec<TensorPlan> {
    let (e, v) = (i64::from(s.n_embd), n_vocab as i64);
    vec![
        plan(
            "token_embd.weight".into(),
            vec![e, v],
            Role::Embedding,
            None,
        ),
        plan("output_norm.weight".into(), vec![e], Role::Norm, None),
        plan("output.weight".into(), vec![e, v], Role::Dense, None),
    ]
}

pub(super) fn plan(name: String, ne: Vec<i64>, role: Role, layer: Option<u32>) -> TensorPlan {
    TensorPlan {
        name,
        ne,
        role,
        layer,
    }
}

impl SynthArch {
    /// llama.cpp's architecture string.
    pub fn name(self) -> &'static str {
        match self {
            SynthArch::Qwen3Moe => "qwen3moe",
            SynthArch::Olmoe => "olmoe",
            SynthArch::Llama => "llama",
            SynthArch::GptOss => "gpt-oss",
            SynthArch::Gemma4 => "gemma4",
            SynthArch::Qwen35Moe => "qwen35moe",
            SynthArch::NemotronHMoe => "nemotron_h_moe",
            SynthArch::Qwen2Moe => "qwen2moe",
            SynthArch::Glm4Moe => "glm4moe",
            SynthArch::Deepseek2 => "deepseek2",
        }
    }

    /// Parses an architecture string.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "qwen3moe" => SynthArch::Qwen3Moe,
            "olmoe" => SynthArch::Olmoe,
            "llama" => SynthArch::Llama,
            "gpt-oss" => SynthArch::GptOss,
            "gemma4" => SynthArch::Gemma4,
            "qwen35moe" => SynthArch::Qwen35Moe,
            "nemotron_h_moe" => SynthArch::NemotronHMoe,
            "qwen2moe" => SynthArch::Qwen2Moe,
            "glm4moe" => SynthArch::Glm4Moe,
            "deepseek2" => SynthArch::Deepseek2,
            _ => return None,
        })
    }

    /// The names `parse` accepts.
    pub const NAMES: &'static [&'static str] = &[
        "qwen3moe",
        "olmoe",
        "llama",
        "gpt-oss",
        "gemma4",
        "qwen35moe",
        "nemotron_h_moe",
        "qwen2moe",
        "glm4moe",
        "deepseek2",
    ];

    /// What sets this architecture apart, in one line (`bmoe archs`).
    pub fn about(self) -> &'static str {
        match self {
            SynthArch::Qwen3Moe => {
                "attention with per-head q/k norms; gate/up/down experts, softmax top-k renormalised"
            }
            SynthArch::Olmoe => {
                "attention with full-width q/k norms; gate/up/down experts, softmax top-k"
            }
            SynthArch::Llama => "dense (no experts): the paths that must refuse or ignore experts",
            SynthArch::GptOss => gpt_oss::ABOUT,
            SynthArch::Gemma4 => gemma4::ABOUT,
            SynthArch::Qwen35Moe => qwen35moe::ABOUT,
            SynthArch::NemotronHMoe => nemotron_h_moe::ABOUT,
            SynthArch::Qwen2Moe => qwen2moe::ABOUT,
            SynthArch::Glm4Moe => glm4moe::ABOUT,
            SynthArch::Deepseek2 => deepseek2::ABOUT,
        }
    }

    /// Makes a preset shape legal for this architecture.
    pub(crate) fn adjust(self, mut s: SynthSpec) -> SynthSpec {
        match self {
            SynthArch::GptOss => return gpt_oss::adjust(s),
            SynthArch::Gemma4 => return gemma4::adjust(s),
            _ => {}
        }
        if self == SynthArch::Olmoe {
            // OLMoE normalises q/k over the full width before splitting heads: no GQA.
            s.n_head_kv = s.n_head;
        }
        match self {
            SynthArch::Qwen35Moe => qwen35moe::adjust(s),
            SynthArch::NemotronHMoe => nemotron_h_moe::adjust(s),
            SynthArch::Qwen2Moe | SynthArch::Glm4Moe | SynthArch::Deepseek2 => {
                let s = real_release_types(s);
                if self == SynthArch::Deepseek2 {
                    deepseek2::adjust(s)
                } else {
                    s
                }
            }
            _ => s,
        }
    }

    pub(crate) fn validate(self, s: &SynthSpec) -> Result<()> {
        if self == SynthArch::Olmoe && s.n_head_kv != s.n_head {
            return Err(SynthError::Invalid(format!(
                "olmoe needs kv heads == heads (got {} and {})",
                s.n_head_kv, s.n_head
            )));
        }
        match self {
            SynthArch::NemotronHMoe => nemotron_h_moe::validate(s),
            SynthArch::Glm4Moe => glm4moe::validate(s),
            SynthArch::Deepseek2 => deepseek2::validate(s),
            _ => Ok(()),
        }
    }

    pub(crate) fn write_metadata(self, s: &SynthSpec, g: &mut GgufBuilder) {
        let a = self.name();
        g.set_str("general.architecture", a);
        g.set_str("general.name", &format!("bmoe synthetic {a}"));
        g.set_u32(&format!("{a}.context_length"), s.n_ctx);
        g.set_u32(&format!("{a}.embedding_length"), s.n_embd);
        g.set_u32(&format!("{a}.block_count"), s.n_layer);
        g.set_u32(&format!("{a}.attention.head_count"), s.n_head);
        g.set_u32(&format!("{a}.attention.head_count_kv"), s.n_head_kv);
        g.set_f32(&format!("{a}.attention.layer_norm_rms_epsilon"), 1e-6);
        if self != SynthArch::Llama {
            g.set_u32(&format!("{a}.expert_count"), s.n_expert);
            g.set_u32(&format!("{a}.expert_used_count"), s.n_expert_used);
        }
        g.set_f32(&format!("{a}.rope.freq_base"), 10000.0);
        match self {
            SynthArch::Qwen3Moe => {
                g.set_u32(&format!("{a}.attention.key_length"), s.head_dim());
                g.set_u32(&format!("{a}.attention.value_length"), s.head_dim());
                g.set_u32(&format!("{a}.expert_feed_forward_length"), s.n_ff_exp);
                g.set_u32(
                    &format!("{a}.feed_forward_length"),
                    s.n_ff_exp * s.n_expert_used,
                );
            }
            SynthArch::Olmoe | SynthArch::Llama => {
                g.set_u32(&format!("{a}.feed_forward_length"), s.n_ff_exp);
            }
            SynthArch::GptOss => gpt_oss::write_metadata(a, s, g),
            SynthArch::Gemma4 => gemma4::write_metadata(a, s, g),
            SynthArch::Qwen35Moe => qwen35moe::write_metadata(s, g),
            SynthArch::NemotronHMoe => nemotron_h_moe::write_metadata(s, g),
            SynthArch::Qwen2Moe => qwen2moe::metadata(s, g),
            SynthArch::Glm4Moe => glm4moe::metadata(s, g),
            SynthArch::Deepseek2 => deepseek2::metadata(s, g),
        }
    }

    pub(crate) fn tensors(self, s: &SynthSpec, n_vocab: usize) -> Vec<TensorPlan> {
        match self {
            SynthArch::GptOss => return gpt_oss::tensors(s, n_vocab),
            SynthArch::Gemma4 => return gemma4::tensors(s, n_vocab),
            SynthArch::Qwen35Moe => return qwen35moe::tensors(s, n_vocab),
            SynthArch::NemotronHMoe => return nemotron_h_moe::tensors(s, n_vocab),
            SynthArch::Qwen2Moe => return qwen2moe::tensors(s, n_vocab),
            SynthArch::Glm4Moe => return glm4moe::tensors(s, n_vocab),
            SynthArch::Deepseek2 => return deepseek2::tensors(s, n_vocab),
            _ => {}
        }
        let e = i64::from(s.n_embd);
        let (hd, h, hkv) = s.head_shape();
        let (f, x) = (i64::from(s.n_ff_exp), i64::from(s.n_expert));
        let t = plan;
        let mut out = globals(s, n_vocab);
        // q/k norms: per head for qwen3moe, over the full width for olmoe, none for llama.
        let qk_norm = match self {
            SynthArch::Qwen3Moe => Some((hd, hd)),
            SynthArch::Olmoe => Some((h * hd, hkv * hd)),
            _ => None,
        };
        for il in 0..s.n_layer {
            let l = Some(il);
            let n = |suffix: &str| format!("blk.{il}.{suffix}.weight");
            out.extend([
                t(n("attn_norm"), vec![e], Role::Norm, l),
                t(n("attn_q"), vec![e, h * hd], Role::Dense, l),
                t(n("attn_k"), vec![e, hkv * hd], Role::Dense, l),
                t(n("attn_v"), vec![e, hkv * hd], Role::Dense, l),
                t(n("attn_output"), vec![h * hd, e], Role::Dense, l),
            ]);
            if let Some((q, k)) = qk_norm {
                out.push(t(n("attn_q_norm"), vec![q], Role::Norm, l));
                out.push(t(n("attn_k_norm"), vec![k], Role::Norm, l));
            }
            out.push(t(n("ffn_norm"), vec![e], Role::Norm, l));
            if self == SynthArch::Llama {
                out.extend([
                    t(n("ffn_gate"), vec![e, f], Role::Dense, l),
                    t(n("ffn_up"), vec![e, f], Role::Dense, l),
                    t(n("ffn_down"), vec![f, e], Role::Dense, l),
                ]);
            } else {
                out.extend([
                    t(n("ffn_gate_inp"), vec![e, x], Role::Router, l),
                    t(n("ffn_gate_exps"), vec![e, f, x], Role::Expert, l),
                    t(n("ffn_up_exps"), vec![e, f, x], Role::Expert, l),
                    t(n("ffn_down_exps"), vec![f, e, x], Role::Expert, l),
                ]);
            }
        }
        out
    }
}

/// The types of the real Q4_K_M releases where the preset's shapes allow them: Q4_K experts when
/// their rows come in whole 256-blocks (the presets' Q4_0 stands in for it otherwise).
fn real_release_types(mut s: SynthSpec) -> SynthSpec {
    let k = bmoe_engine::gguf::write::block_size(super::spec::WeightType::Q4_K.ggml()) as u32;
    if s.expert_type == super::spec::WeightType::Q4_0
        && s.n_embd.is_multiple_of(k)
        && s.n_ff_exp.is_multiple_of(k)
    {
        s.expert_type = super::spec::WeightType::Q4_K;
    }
    s
}
