//! The memory budget's lines: what a run holds besides the expert cache, estimated from the
//! model's shape and the options, and the cache `auto` makes of what they leave.
use super::dims::ModelDims;
use crate::options::{CacheBudget, DenseWeights, Prefetch, StreamOptions};

pub(crate) const MIB: f64 = (1u64 << 20) as f64;

/// What the bmoe process itself holds apart from the model's buffers, in MiB.
const RUNTIME_MIB: f64 = 20.0;

/// One line of the memory budget.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetLine {
    /// What.
    pub what: &'static str,
    /// MiB.
    pub mib: f64,
    /// Counted against the budget (false: shown for information).
    pub counted: bool,
    /// How it was estimated.
    pub note: String,
}

/// The session's state: the KV cache, and a recurrent model's conv and state.
pub(crate) fn state_lines(dims: &ModelDims, n_ctx: u64) -> Vec<BudgetLine> {
    let mut budget = Vec::new();
    let kv = n_ctx as f64 * dims.kv_bytes_per_token as f64;
    budget.push(BudgetLine {
        what: "KV cache",
        mib: kv / MIB,
        counted: true,
        note: format!(
            "{n_ctx} ctx x {} B per token (K and V, f16) over the {} of {} layers with attention",
            dims.kv_bytes_per_token, dims.n_kv_layers, dims.n_layer
        ),
    });
    if dims.recurrent_bytes > 0 {
        budget.push(BudgetLine {
            what: "recurrent state",
            mib: dims.recurrent_bytes as f64 / MIB,
            counted: true,
            note: format!(
                "{} state-space layers of {}: conv and state (f32), one sequence",
                dims.n_recurrent_layers, dims.n_layer
            ),
        });
    }
    budget
}

/// The process and its compute buffers, on the CPU and (with a prefill device) on the device.
pub(crate) fn compute_lines(
    dims: &ModelDims,
    n_ctx: u64,
    ubatch: (u32, u32),
    device: bool,
) -> Vec<BudgetLine> {
    // llama.cpp picks flash attention on the CPU (flash_attn = auto): no attention-score matrix,
    // only the f16 mask; the MoE intermediates dominate.
    // In f64: a damaged header's widths would overflow integers, and this is an estimate.
    let compute = |ubatch: u64| -> f64 {
        let (ub, outputs) = (ubatch as f64, ubatch.min(128) as f64);
        let act = 8.0 * dims.n_embd as f64
            + 3.0 * dims.n_ff_exp as f64 * dims.n_expert_used.max(1) as f64;
        4.0 * ub * act + 2.0 * ub * n_ctx as f64 + 4.0 * outputs * dims.n_vocab_max as f64
    };
    let mut budget = vec![BudgetLine {
        what: "bmoe itself",
        mib: RUNTIME_MIB,
        counted: true,
        note: "code, libraries, heap (measured: 15-19 MiB with the tiny model)".into(),
    }];
    let ub_cpu = u64::from(ubatch.0).min(n_ctx);
    budget.push(BudgetLine {
        what: "compute buffers (CPU)",
        mib: compute(ub_cpu) / MIB,
        counted: true,
        note: format!(
            "estimate: ubatch {ub_cpu} x activations (f32) + attention mask (f16) + logits"
        ),
    });
    if device {
        let ub_dev = u64::from(ubatch.1).min(n_ctx);
        budget.push(BudgetLine {
            what: "compute buffers (device)",
            mib: compute(ub_dev) / MIB,
            counted: true,
            note: format!(
                "rough: as the CPU's at device ubatch {ub_dev} (shared memory on phones)"
            ),
        });
        budget.push(BudgetLine {
            what: "arena slots",
            mib: 2.0 * dims.max_layer_bytes as f64 / MIB,
            counted: true,
            note: "2 x the largest layer (layer k on slot k mod 2)".into(),
        });
    }
    budget
}

/// The weights held apart from the expert cache: dense weights (or the whole mapping when
/// experts do not stream), the expert slots of a cacheless stream, the prefetch staging.
pub(crate) fn weight_lines(dims: &ModelDims, stream: Option<&StreamOptions>) -> Vec<BudgetLine> {
    let mut budget = Vec::new();
    let dense = dims.file_bytes.saturating_sub(dims.expert_bytes) as f64 / MIB;
    let Some(so) = stream else {
        budget.push(BudgetLine {
            what: "model weights (mmap)",
            mib: dims.file_bytes as f64 / MIB,
            counted: false,
            note: "llama.cpp's mapping: page cache, evictable (moe_stream is off)".into(),
        });
        return budget;
    };
    budget.push(BudgetLine {
        what: "dense weights",
        mib: dense,
        counted: true,
        note: format!(
            "non-expert weights stay resident ({})",
            match so.dense_weights {
                DenseWeights::Mmap => "mmap",
                DenseWeights::Anon => "anon",
            }
        ),
    });
    if so.cache == CacheBudget::Mib(0) {
        budget.push(BudgetLine {
            what: "expert slots",
            mib: dims.max_layer_expert_bytes as f64 / MIB,
            counted: true,
            note: "cache_mb = 0: one layer's expert matrices, reused by every layer".into(),
        });
    }
    if so.prefetch != Prefetch::Off {
        let per_expert = dims.max_layer_expert_bytes / dims.n_expert.max(1);
        budget.push(BudgetLine {
            what: "prefetch staging",
            mib: per_expert as f64 * dims.n_expert_used.max(1) as f64 / MIB,
            counted: true,
            note: "one layer's predicted experts in flight; lent to the expert cache while reads ahead pause".into(),
        });
    }
    budget
}

/// The expert cache in MiB and how it was chosen. `auto` (the one formula, whoever plans) takes
/// what the counted lines leave of the memory planned for (`left`), at most every expert.
pub(crate) fn expert_cache(
    dims: &ModelDims,
    stream: Option<&StreamOptions>,
    left: f64,
) -> (u64, String) {
    let all_experts = dims.expert_bytes as f64 / MIB;
    match stream.map(|s| s.cache) {
        None => (0u64, "moe_stream is off: no expert cache".to_string()),
        Some(CacheBudget::Mib(n)) => (n, "cache_mb".to_string()),
        Some(CacheBudget::Auto { .. }) => {
            // Every expert, rounded up: a model whose experts are under 1 MiB still caches them.
            let v = left.floor().min(all_experts.ceil()).max(0.0) as u64;
            (
                v,
                format!("auto: what is left, at most every expert ({all_experts:.1} MiB)"),
            )
        }
    }
}
