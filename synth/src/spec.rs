//! What a synthetic model looks like: architecture, dimensions, tensor types, router skew.
use ggml_sys as sys;

use super::arch::SynthArch;
use crate::error::{Result, SynthError};
use bmoe_engine::gguf::write as quant;
use bmoe_engine::gguf::write::GgmlType;

/// Tensor data types a synthetic model can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
#[allow(non_camel_case_types)]
pub enum WeightType {
    /// 32-bit float.
    F32,
    /// 16-bit float.
    F16,
    /// 8-bit blocks of 32.
    Q8_0,
    /// 4-bit blocks of 32.
    Q4_0,
    /// 4-bit k-quant, blocks of 256.
    Q4_K,
    /// 6-bit k-quant, blocks of 256 (a type some devices' matmuls refuse).
    Q6_K,
    /// 4-bit microscaling float (gpt-oss experts), blocks of 32.
    MXFP4,
}

impl WeightType {
    /// ggml's enum value.
    pub fn ggml(self) -> GgmlType {
        match self {
            WeightType::F32 => sys::GGML_TYPE_F32,
            WeightType::F16 => sys::GGML_TYPE_F16,
            WeightType::Q8_0 => sys::GGML_TYPE_Q8_0,
            WeightType::Q4_0 => sys::GGML_TYPE_Q4_0,
            WeightType::Q4_K => sys::GGML_TYPE_Q4_K,
            WeightType::Q6_K => sys::GGML_TYPE_Q6_K,
            WeightType::MXFP4 => sys::GGML_TYPE_MXFP4,
        }
    }

    /// Parses `f32`, `f16`, `q8_0`, `q4_0`, `q4_k`, `q6_k`, `mxfp4` (case-insensitive).
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s.to_ascii_lowercase().as_str() {
            "f32" => WeightType::F32,
            "f16" => WeightType::F16,
            "q8_0" => WeightType::Q8_0,
            "q4_0" => WeightType::Q4_0,
            "q4_k" => WeightType::Q4_K,
            "q6_k" => WeightType::Q6_K,
            "mxfp4" => WeightType::MXFP4,
            _ => return None,
        })
    }

    /// The names `parse` accepts.
    pub const NAMES: &'static [&'static str] =
        &["f32", "f16", "q8_0", "q4_0", "q4_k", "q6_k", "mxfp4"];
}

/// Named shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    /// For tests: 4 layers, width 128, 8 experts top-2, expert FFN 128.
    Tiny,
    /// A few hundred MB: 8 layers, width 512, 32 experts top-4.
    Small,
    /// Gigabytes, routed like a real model: 24 layers, width 1024, 64 experts top-8, Q4_0 experts.
    Bench,
}

impl Preset {
    /// Parses `tiny`, `small`, `bench`.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "tiny" => Preset::Tiny,
            "small" => Preset::Small,
            "bench" => Preset::Bench,
            _ => return None,
        })
    }
}

/// Everything that determines a synthetic model's bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthSpec {
    /// Architecture.
    pub arch: SynthArch,
    /// Transformer blocks.
    pub n_layer: u32,
    /// Embedding width.
    pub n_embd: u32,
    /// Attention heads.
    pub n_head: u32,
    /// Key/value heads.
    pub n_head_kv: u32,
    /// Experts per MoE layer.
    pub n_expert: u32,
    /// Experts per token.
    pub n_expert_used: u32,
    /// Expert FFN width.
    pub n_ff_exp: u32,
    /// Training context written to the metadata.
    pub n_ctx: u32,
    /// Type of the routed expert tensors.
    pub expert_type: WeightType,
    /// Type of the other matrices (attention, embeddings, output).
    pub dense_type: WeightType,
    /// 0 = routing about even; larger = a few experts take most tokens, as in real models.
    pub router_skew: f32,
    /// Seed of all tensor data.
    pub seed: u64,
    /// Number of GGUF shards (1 = a single file).
    pub split: u32,
    /// Leave `output.weight` out: the model's output ties to its token embeddings, as many
    /// released models do.
    pub tied_output: bool,
}

impl SynthSpec {
    /// The shape a preset names, on `arch`.
    pub fn preset(p: Preset, arch: SynthArch) -> Self {
        let base = SynthSpec {
            arch,
            n_layer: 4,
            n_embd: 128,
            n_head: 4,
            n_head_kv: 2,
            n_expert: 8,
            n_expert_used: 2,
            n_ff_exp: 128,
            n_ctx: 4096,
            expert_type: WeightType::Q8_0,
            dense_type: WeightType::F32,
            router_skew: 0.0,
            seed: 42,
            split: 1,
            tied_output: false,
        };
        let s = match p {
            Preset::Tiny => base,
            Preset::Small => SynthSpec {
                n_layer: 8,
                n_embd: 512,
                n_head: 8,
                n_head_kv: 4,
                n_expert: 32,
                n_expert_used: 4,
                n_ff_exp: 512,
                expert_type: WeightType::Q4_0,
                dense_type: WeightType::Q8_0,
                router_skew: 1.0,
                ..base
            },
            Preset::Bench => SynthSpec {
                n_layer: 24,
                n_embd: 1024,
                n_head: 16,
                n_head_kv: 4,
                n_expert: 64,
                n_expert_used: 8,
                n_ff_exp: 1024,
                expert_type: WeightType::Q4_0,
                dense_type: WeightType::Q8_0,
                router_skew: 1.5,
                ..base
            },
        };
        s.arch.adjust(s)
    }

    /// Head width.
    pub fn head_dim(&self) -> u32 {
        self.n_embd / self.n_head.max(1)
    }

    /// (head width, heads, key/value heads), as tensor dimensions.
    pub(crate) fn head_shape(&self) -> (i64, i64, i64) {
        (
            i64::from(self.head_dim()),
            i64::from(self.n_head),
            i64::from(self.n_head_kv),
        )
    }

    /// Checks the dimensions against each other and the types' block sizes.
    pub fn validate(&self) -> Result<()> {
        let err = |m: String| Err(SynthError::Invalid(m));
        if self.n_layer == 0 || self.n_embd == 0 || self.n_head == 0 || self.n_expert == 0 {
            return err("layers, width, heads and experts must all be at least 1".into());
        }
        if !self.n_embd.is_multiple_of(self.n_head) {
            return err(format!(
                "width {} is not a multiple of heads {}",
                self.n_embd, self.n_head
            ));
        }
        if self.n_head_kv == 0 || !self.n_head.is_multiple_of(self.n_head_kv) {
            return err(format!(
                "heads {} is not a multiple of kv heads {}",
                self.n_head, self.n_head_kv
            ));
        }
        if !self.head_dim().is_multiple_of(2) {
            return err(format!(
                "head width {} must be even (rope)",
                self.head_dim()
            ));
        }
        if self.n_expert_used == 0 || self.n_expert_used > self.n_expert {
            return err(format!(
                "experts used {} must be between 1 and experts {}",
                self.n_expert_used, self.n_expert
            ));
        }
        if self.split == 0 || self.split > self.n_layer {
            return err(format!(
                "split {} must be between 1 and the layer count {}",
                self.split, self.n_layer
            ));
        }
        for (what, ty, widths) in [
            ("expert", self.expert_type, vec![self.n_embd, self.n_ff_exp]),
            (
                "dense",
                self.dense_type,
                vec![self.n_embd, self.n_head * self.head_dim()],
            ),
        ] {
            let b = quant::block_size(ty.ggml()) as u32;
            for w in widths {
                if !w.is_multiple_of(b) {
                    return err(format!(
                        "{what} type {:?} packs rows in blocks of {b}, but a row is {w} wide",
                        ty
                    ));
                }
            }
            if quant::requires_imatrix(ty.ggml()) {
                return err(format!("{what} type {ty:?} needs an importance matrix"));
            }
        }
        self.arch.validate(self)
    }
}
