//! Counters the engine keeps and the records each call returns.
use serde::Serialize;

/// Expert-streaming counters (zero when streaming is off).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct StreamCounters {
    /// Bytes read from the GGUF for experts.
    pub read_bytes: u64,
    /// Seconds spent in reads (summed over lanes).
    pub read_s: f64,
    /// Seconds the compute threads waited for experts.
    pub stall_s: f64,
    /// (layer, expert) lookups served from the cache.
    pub cache_hits: u64,
    /// (layer, expert) lookups that had to be read.
    pub cache_misses: u64,
    /// Experts evicted from the cache.
    pub evictions: u64,
    /// Seconds the routing nodes spent evicting (moving the evicted pages out, or releasing
    /// them): part of `stall_s`.
    pub evict_s: f64,
    /// Seconds the routing nodes spent moving pages into expert slots (recycled evicted pages,
    /// reads ahead): part of `stall_s`.
    pub move_s: f64,
    /// Bytes of experts resident at the end.
    pub resident_bytes: u64,
    /// Experts read ahead of their routing node (prefetch).
    pub prefetched: u64,
    /// Cache misses served by a read ahead (overlapped with compute).
    pub prefetch_used: u64,
    /// Of the expert slices those reads ahead filled, the ones whose pages were moved into place
    /// (page-aligned expert slices; the rest are copied).
    pub prefetch_moved: u64,
    /// Expert slices read into pages an eviction gave up (moved into place, no page fault).
    pub recycled: u64,
    /// Experts routed to at routing nodes that had a prediction (whatever the cache held).
    pub predicted_routed: u64,
    /// Of those, the ones the prediction named.
    pub predicted_right: u64,
    /// Seconds the compute thread spent predicting (copying the router input, applying the next
    /// layer's router): what `prefetch = router` costs decode when it reads nothing ahead.
    pub predict_s: f64,
    /// Expert slices repacked into the CPU's repacked layout on the threads that read them
    /// (`repack = auto`; reads ahead included).
    pub repacked: u64,
    /// Seconds spent repacking them (summed over threads; reads ahead not included).
    pub repack_s: f64,
    /// Routed experts replaced by a cached one at a cache miss (`expert_substitute`).
    pub substituted: u64,
    /// Routed experts skipped at a cache miss for their small router weight (`drop_cold`).
    pub dropped: u64,
    /// Times memory pressure shrank the cache's budget (`cache_reserve_mb`).
    pub cache_shrinks: u64,
    /// Times the budget grew back after the pressure eased.
    pub cache_grows: u64,
    /// The cache's budget in bytes at the end (its configured size unless pressure shrank it).
    pub budget_bytes: u64,
}

impl StreamCounters {
    /// MiB read.
    pub fn read_mib(&self) -> f64 {
        self.read_bytes as f64 / (1u64 << 20) as f64
    }
    /// Hit rate in percent, `None` when nothing was looked up.
    pub fn cache_hit_pct(&self) -> Option<f64> {
        let n = self.cache_hits + self.cache_misses;
        (n > 0).then(|| 100.0 * self.cache_hits as f64 / n as f64)
    }
    /// `self - before`, for per-call deltas of cumulative counters (resident and budget stay absolute).
    pub fn since(&self, before: &StreamCounters) -> StreamCounters {
        StreamCounters {
            read_bytes: self.read_bytes - before.read_bytes,
            read_s: self.read_s - before.read_s,
            stall_s: self.stall_s - before.stall_s,
            cache_hits: self.cache_hits - before.cache_hits,
            cache_misses: self.cache_misses - before.cache_misses,
            evictions: self.evictions - before.evictions,
            evict_s: self.evict_s - before.evict_s,
            move_s: self.move_s - before.move_s,
            resident_bytes: self.resident_bytes,
            prefetched: self.prefetched - before.prefetched,
            prefetch_used: self.prefetch_used - before.prefetch_used,
            recycled: self.recycled - before.recycled,
            prefetch_moved: self.prefetch_moved - before.prefetch_moved,
            predicted_routed: self.predicted_routed - before.predicted_routed,
            predicted_right: self.predicted_right - before.predicted_right,
            predict_s: self.predict_s - before.predict_s,
            repacked: self.repacked - before.repacked,
            repack_s: self.repack_s - before.repack_s,
            substituted: self.substituted - before.substituted,
            dropped: self.dropped - before.dropped,
            cache_shrinks: self.cache_shrinks - before.cache_shrinks,
            cache_grows: self.cache_grows - before.cache_grows,
            budget_bytes: self.budget_bytes,
        }
    }

    /// Share of cache misses whose read was overlapped with compute (read ahead), in percent;
    /// `None` without misses.
    pub fn overlap_pct(&self) -> Option<f64> {
        (self.cache_misses > 0)
            .then(|| 100.0 * self.prefetch_used as f64 / self.cache_misses as f64)
    }
}

/// Prefill-device counters (zero when no device ran).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PrefillDevCounters {
    /// Prompt tokens the device prefilled.
    pub tokens: u64,
    /// Graph nodes the device computed.
    pub nodes: u64,
    /// Bytes the arena read.
    pub read_bytes: u64,
    /// Seconds the device graph waited on the arena.
    pub stall_s: f64,
    /// (layer, expert) pairs routed on the device.
    pub routed: u64,
    /// Routed pairs read at the routing node (the prediction missed them).
    pub demand: u64,
    /// Layers read whole by the routed-full fallback (the layer before routed to a larger share
    /// of its experts than [`crate::PrefillOptions`]'s whole-layer threshold).
    pub whole_fallback: u64,
    /// Bytes of `read_bytes` the arena read from the GGUF (the rest came from memory).
    pub file_read_bytes: u64,
    /// (layer, expert) pairs the arena took from the CPU-side expert cache instead of the file.
    pub cached_experts: u64,
}

impl PrefillDevCounters {
    /// `self - before`, for per-call deltas.
    pub fn since(&self, before: &PrefillDevCounters) -> PrefillDevCounters {
        PrefillDevCounters {
            tokens: self.tokens - before.tokens,
            nodes: self.nodes - before.nodes,
            read_bytes: self.read_bytes - before.read_bytes,
            stall_s: self.stall_s - before.stall_s,
            routed: self.routed - before.routed,
            demand: self.demand - before.demand,
            whole_fallback: self.whole_fallback - before.whole_fallback,
            file_read_bytes: self.file_read_bytes - before.file_read_bytes,
            cached_experts: self.cached_experts - before.cached_experts,
        }
    }

    /// MiB the arena read.
    pub fn read_mib(&self) -> f64 {
        self.read_bytes as f64 / (1u64 << 20) as f64
    }

    /// MiB the arena read from the GGUF.
    pub fn file_read_mib(&self) -> f64 {
        self.file_read_bytes as f64 / (1u64 << 20) as f64
    }
}

/// Prefill and decode timing of one call.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Timing {
    /// Prompt tokens prefilled.
    pub n_prompt: u32,
    /// Seconds spent prefilling.
    pub prefill_s: f64,
    /// Tokens decoded.
    pub n_decoded: u32,
    /// Seconds spent decoding.
    pub decode_s: f64,
    /// generate: seconds from the call to its first token sampled (tokenizing, prefill and the
    /// first sample); 0 when no token came out.
    pub first_token_s: f64,
}

impl Timing {
    /// Prefill tokens per second (0 when nothing was prefilled).
    pub fn prefill_tps(&self) -> f64 {
        rate(self.n_prompt, self.prefill_s)
    }
    /// Decode tokens per second (0 when nothing was decoded).
    pub fn tok_s(&self) -> f64 {
        rate(self.n_decoded, self.decode_s)
    }
}

fn rate(n: u32, s: f64) -> f64 {
    if n == 0 || s <= 0.0 {
        0.0
    } else {
        n as f64 / s
    }
}

/// Bytes this process has had read from storage so far (`read_bytes` of `/proc/self/io`: page-cache
/// misses of mapped files and direct reads alike); `None` where the kernel does not say.
pub fn storage_read_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/io").ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("read_bytes: "))
        .and_then(|v| v.trim().parse().ok())
}

/// The process's resident memory now, split as the kernel counts it: anonymous (`RssAnon`:
/// heap, engine regions, copies) and file-backed (`RssFile`: mapped pages of files), in bytes;
/// `None` where `/proc/self/status` does not say.
pub fn rss_split() -> Option<(u64, u64)> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb = |key: &str| -> Option<u64> {
        s.lines()
            .find_map(|l| l.strip_prefix(key))?
            .split_whitespace()
            .next()?
            .parse::<u64>()
            .ok()
            .map(|k| k << 10)
    };
    Some((kb("RssAnon:")?, kb("RssFile:")?))
}

/// How a model was loaded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LoadMode {
    /// llama.cpp's own load: the file mapped and read whole at load.
    #[default]
    Llama,
    /// A streamed model's load: the header and dense weights only, no expert.
    Lean,
}

impl LoadMode {
    /// The name used in rows and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            LoadMode::Llama => "llama",
            LoadMode::Lean => "lean",
        }
    }
}

/// What a model load cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct LoadStats {
    /// How it loaded.
    pub mode: LoadMode,
    /// Wall seconds of the load (checks, llama.cpp, capture, streamer and arena setup).
    pub seconds: f64,
    /// Bytes this process had read from storage during the load (`/proc/self/io`); `None`
    /// where the kernel does not say.
    pub read_bytes: Option<u64>,
    /// Nodes of a one-token graph, where the load ran one to learn the graph (streaming, a
    /// prefill device): each is a barrier for the compute threads.
    pub graph_nodes: Option<usize>,
    /// The weights llama.cpp converted into the CPU's repacked layouts (`repack`).
    pub repacked: Repacked,
}

/// Weights held in llama.cpp's repacked CPU layouts (buffer types `CPU_REPACK` and, where the
/// CPU variant has AMX, `AMX`), whose kernels the CPU then runs; zero when the load asked for none or the CPU has none for their types.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Repacked {
    /// Weight tensors repacked.
    pub tensors: usize,
    /// Their bytes in the file's layout.
    pub bytes: u64,
}

/// Why a `generate` stopped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// `n_predict` tokens were generated.
    #[default]
    NPredict,
    /// The model produced an end-of-generation token.
    Eog,
    /// The context filled up: the next token had no cell left.
    ContextFull,
    /// The caller cancelled.
    Cancelled,
}

impl StopReason {
    /// The reason as written in records and CSV cells (`context_full`).
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::NPredict => "n_predict",
            StopReason::Eog => "eog",
            StopReason::ContextFull => "context_full",
            StopReason::Cancelled => "cancelled",
        }
    }
}

/// What one `generate` produced.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct GenerateRecord {
    /// The generated text (bytes decoded lossily as UTF-8).
    pub text: String,
    /// The generated bytes exactly.
    #[serde(skip)]
    pub bytes: Vec<u8>,
    /// The generated token ids.
    pub tokens: Vec<i32>,
    /// Bytes the process read from storage while decoding (any path: mmap faults or streaming).
    pub decode_storage_read_bytes: u64,
    /// Stopped by cancellation.
    pub cancelled: bool,
    /// Stopped at an end-of-generation token.
    pub stopped_eog: bool,
    /// Why generation stopped.
    pub stopped: StopReason,
    /// Timing.
    pub timing: Timing,
    /// Streaming counters for this call.
    pub stream: StreamCounters,
    /// Streaming counters of the decode phase alone (the prompt's reads left out): what decode
    /// speed depends on.
    pub decode_stream: StreamCounters,
    /// Prefill-device counters for this call.
    pub prefill_dev: PrefillDevCounters,
}

/// What one `decide` produced.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct DecideRecord {
    /// Index of the most likely choice.
    pub best: usize,
    /// Each choice's score in request order: its first token's log-probability (`first_token`),
    /// the sum over its tokens (`sum`) or their mean (`mean`).
    pub choice_logp: Vec<f64>,
    /// Each choice's first token id.
    pub choice_tokens: Vec<i32>,
    /// Tokens scored per choice (1 in `first_token` mode).
    pub choice_ntok: Vec<u32>,
    /// Best score minus the second best (nats); infinite with one choice.
    pub margin: f64,
    /// Prompt tokens carried over from the KV cache.
    pub n_reused: u32,
    /// Prompt tokens prefilled by this call.
    pub n_prefilled: u32,
    /// What prefix reuse did.
    pub reuse: ReuseOutcome,
    /// Why nothing was reused (`off`, `empty`, `no common prefix`, ...); empty otherwise.
    pub reuse_reason: String,
    /// Prompt tokens.
    pub n_tokens: u32,
    /// Timing.
    pub timing: Timing,
    /// Streaming counters for this call.
    pub stream: StreamCounters,
    /// Prefill-device counters for this call.
    pub prefill_dev: PrefillDevCounters,
}

/// What prefix reuse did for one decision.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReuseOutcome {
    /// Nothing reused: the cache was cleared (the record says why).
    #[default]
    Miss,
    /// A common prefix was kept (the cache's diverging tail dropped); only the rest was
    /// prefilled.
    Extend,
    /// The cache held exactly this prompt and its last logits: nothing was prefilled.
    Hit,
    /// The memory could not keep the common prefix (a sliding window had dropped cells it
    /// needs, or the memory refuses a partial removal): the state saved where an earlier
    /// prompt's rendered prefix ended was restored, and only the rest prefilled.
    Restore,
}

impl ReuseOutcome {
    /// The outcome as written in CSV cells.
    pub fn as_str(self) -> &'static str {
        match self {
            ReuseOutcome::Miss => "miss",
            ReuseOutcome::Extend => "extend",
            ReuseOutcome::Hit => "hit",
            ReuseOutcome::Restore => "restore",
        }
    }
}

/// What one `perplexity` produced.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PerplexityRecord {
    /// exp(mean NLL).
    pub ppl: f64,
    /// Mean negative log-likelihood in nats.
    pub nll_mean: f64,
    /// Standard error of `nll_mean` over the scored tokens (llama-perplexity's); the perplexity's
    /// is `ppl * nll_stderr`, as it prints `PPL = x +/- y`.
    pub nll_stderr: f64,
    /// Tokens scored.
    pub n_scored: u32,
    /// Tokens in the text.
    pub n_tokens: u32,
    /// Timing (the whole text counts as prefill).
    pub timing: Timing,
    /// Streaming counters for this call.
    pub stream: StreamCounters,
    /// Prefill-device counters for this call.
    pub prefill_dev: PrefillDevCounters,
}
