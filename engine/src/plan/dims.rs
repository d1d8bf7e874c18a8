//! The shape of a model, from its GGUF header alone: what the memory plan counts.
use std::path::Path;

use crate::error::Result;
use crate::gguf::index::GgufIndex;

/// The shape of the model, from its GGUF header.
#[derive(Debug, Clone, Default)]
pub struct ModelDims {
    /// `general.architecture`.
    pub arch: String,
    /// Layers.
    pub n_layer: u64,
    /// Embedding width.
    pub n_embd: u64,
    /// Bytes of K and V (f16) per token of context, all layers with an attention cache.
    pub kv_bytes_per_token: u64,
    /// Layers with an attention cache.
    pub n_kv_layers: u64,
    /// Bytes of the recurrent state of one sequence, all state-space layers.
    pub recurrent_bytes: u64,
    /// Layers with a recurrent state (state-space layers).
    pub n_recurrent_layers: u64,
    /// Experts per layer (0 = dense).
    pub n_expert: u64,
    /// Experts per token.
    pub n_expert_used: u64,
    /// Expert FFN width.
    pub n_ff_exp: u64,
    /// Training context.
    pub n_ctx_train: u64,
    /// Upper bound of the vocabulary (token embedding bytes / width).
    pub n_vocab_max: u64,
    /// Bytes on disk.
    pub file_bytes: u64,
    /// Bytes of routed expert tensors.
    pub expert_bytes: u64,
    /// Bytes of the largest layer.
    pub max_layer_bytes: u64,
    /// Bytes of the largest layer's expert matrices.
    pub max_layer_expert_bytes: u64,
    /// Start of the tensor data in the first shard (end of the header).
    pub data_start: u64,
}

impl ModelDims {
    /// Reads the model's dimensions from its header (never the weights).
    pub fn read(path: &Path) -> Result<ModelDims> {
        Ok(Self::of(&GgufIndex::open(path)?))
    }

    /// The dimensions of an opened header.
    pub(crate) fn of(idx: &GgufIndex) -> ModelDims {
        let arch = idx.arch().unwrap_or_default();
        let k = |s: &str| idx.get_u64(&format!("{arch}.{s}"));
        let n_embd = k("embedding_length").unwrap_or(0);
        // The engine's reading of the header: which tensors are experts, which layers keep K, V.
        let layers = idx.layers();
        let mut d = ModelDims {
            n_layer: layers.len() as u64,
            n_embd,
            // Saturating: a damaged header's per-layer sizes may add up past u64.
            kv_bytes_per_token: sum(layers.iter().map(|l| l.kv_bytes_per_token)),
            n_kv_layers: layers.iter().filter(|l| l.kv_bytes_per_token > 0).count() as u64,
            recurrent_bytes: sum(layers.iter().map(|l| l.recurrent_bytes)),
            n_recurrent_layers: layers.iter().filter(|l| l.recurrent_bytes > 0).count() as u64,
            n_expert: k("expert_count").unwrap_or(0),
            n_expert_used: k("expert_used_count").unwrap_or(0),
            n_ff_exp: k("expert_feed_forward_length").unwrap_or(0),
            n_ctx_train: k("context_length").unwrap_or(0),
            file_bytes: idx.total_file_bytes(),
            expert_bytes: sum(layers.iter().map(|l| l.expert_bytes)),
            max_layer_bytes: layers.iter().map(|l| l.bytes).max().unwrap_or(0),
            max_layer_expert_bytes: layers.iter().map(|l| l.expert_bytes).max().unwrap_or(0),
            arch: arch.clone(),
            ..ModelDims::default()
        };
        if let Some(t) = idx.get("token_embd.weight") {
            d.n_vocab_max = t.size / n_embd.max(1);
        }
        d.data_start = idx
            .tensor_infos()
            .iter()
            .filter_map(|i| idx.get(&i.name))
            .filter(|t| t.file == 0)
            .map(|t| t.offset)
            .min()
            .unwrap_or(0);
        d
    }
}

/// The saturating sum of `v`.
fn sum(v: impl Iterator<Item = u64>) -> u64 {
    v.fold(0, u64::saturating_add)
}
