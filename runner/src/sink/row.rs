//! One CSV row: identity, the resolved configuration that matters, and the telemetry of one
//! decision, prompt or text. The field order is the column order; columns are only ever appended,
//! and rows are read by column name, so a CSV written by an older build (fewer columns) reads with
//! the missing columns at their defaults (empty).
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The version of the column set this build writes (the `schema_version` column). Bump it whenever
/// a column is appended; a file without the column was written by version 1.
pub const SCHEMA_VERSION: u32 = 12;

pub use crate::config::declare::{RECORDED_SETTINGS, SETTINGS_COLUMN};

crate::config::declare::row_with_settings! {
/// One row of the telemetry CSV (see docs/telemetry.md).
///
/// No `deny_unknown_fields`: a newer build's extra columns are ignored when this build reads its
/// file, and `default` fills the columns an older build did not write.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub struct Row {
    /// Run id: `--run-id`, or `<job>-<UTC timestamp>`; `--resume` continues one.
    pub run_id: String,
    /// When the row was written, RFC 3339 UTC.
    pub time: String,
    /// Job name.
    pub job: String,
    /// generate, decide or perplexity.
    pub kind: String,
    /// Profile name.
    pub profile: String,
    /// Sweep point (`cache_mb=1500`), or `base`.
    pub point: String,
    /// Item id (decision id, prompt id).
    pub item: String,
    /// Model path as resolved from the job file.
    pub model: String,
    /// Model size on disk (all shards).
    #[schemars(extend("x-unit" = "bytes"))]
    pub model_bytes: u64,
    /// SHA-256 of the GGUF header (metadata and tensor table), first 16 hex digits.
    pub model_hash: String,
    /// bmoe and engine version.
    pub build: String,
    /// `general.architecture`.
    pub arch: String,
} then {
    /// Model load time of this (job, profile point).
    #[schemars(extend("x-unit" = "s"))]
    pub load_s: f64,
    /// Prompt tokens (the whole prompt; a decide row's `n_prefilled` says how many were prefilled).
    #[schemars(extend("x-unit" = "tokens"))]
    pub n_prompt: u32,
    /// Prefill time.
    #[schemars(extend("x-unit" = "s"))]
    pub prefill_s: f64,
    /// Prefill rate (tokens prefilled / prefill_s).
    #[schemars(extend("x-unit" = "tokens/s"))]
    pub prefill_tps: f64,
    /// Tokens generated.
    #[schemars(extend("x-unit" = "tokens"))]
    pub tokens: u32,
    /// Decode time.
    #[schemars(extend("x-unit" = "s"))]
    pub decode_s: f64,
    /// Decode rate.
    #[schemars(extend("x-unit" = "tokens/s"))]
    pub tok_s: f64,
    /// Expert bytes read from flash, bytes / 2^20.
    #[schemars(extend("x-unit" = "MiB"))]
    pub read_mib: f64,
    /// Time in expert reads, summed over lanes.
    #[schemars(extend("x-unit" = "s"))]
    pub io_s: f64,
    /// Time compute threads waited for experts.
    #[schemars(extend("x-unit" = "s"))]
    pub stall_s: f64,
    /// Expert cache hit rate; empty when nothing was looked up (schema 1 wrote -1).
    #[schemars(extend("x-unit" = "%"))]
    pub cache_hit_pct: Option<f64>,
    /// Experts resident in the cache at the end.
    #[schemars(extend("x-unit" = "MiB"))]
    pub cache_resident_mib: f64,
    /// Experts evicted.
    #[schemars(extend("x-unit" = "count"))]
    pub evictions: u64,
    /// Prompt tokens the prefill device ran.
    #[schemars(extend("x-unit" = "tokens"))]
    pub prefill_dev_tokens: u64,
    /// Graph nodes the device computed.
    #[schemars(extend("x-unit" = "count"))]
    pub prefill_dev_nodes: u64,
    /// Bytes the device arena read.
    #[schemars(extend("x-unit" = "MiB"))]
    pub prefill_dev_read_mib: f64,
    /// Time the device graph waited on the arena.
    #[schemars(extend("x-unit" = "s"))]
    pub prefill_dev_stall_s: f64,
    /// (layer, expert) pairs routed on the device.
    #[schemars(extend("x-unit" = "count"))]
    pub prefill_dev_routed: u64,
    /// Routed pairs the prediction missed (read at the routing node).
    #[schemars(extend("x-unit" = "count"))]
    pub prefill_dev_demand: u64,
    /// decide: index of the most likely choice; empty otherwise.
    pub best: Option<u32>,
    /// decide: JSON array of each choice's first-token log-probability (null = -inf).
    #[schemars(with = "String", extend("x-unit" = "nats"))]
    pub choice_logp: ChoiceLogp,
    /// perplexity: exp(mean NLL); empty otherwise.
    pub ppl: Option<f64>,
    /// perplexity: mean negative log-likelihood; empty otherwise.
    #[schemars(extend("x-unit" = "nats"))]
    pub nll_mean: Option<f64>,
    /// perplexity: tokens scored; empty otherwise.
    #[schemars(extend("x-unit" = "tokens"))]
    pub n_scored: Option<u32>,
    /// generate: stopped by a second Ctrl-C.
    pub cancelled: bool,
    /// generate: stopped at an end-of-generation token.
    pub stopped_eog: bool,
    /// The engine's refusal for this item (colliding choices, prompt too long); empty on success.
    pub error: String,
    /// generate: the text, with `\` `\n` `\r` escaped so every row is one line.
    pub text: String,
    // ---- schema 2 (appended; an older file reads these as empty) ----
    /// Version of the column set that wrote the row; empty in files written by schema 1.
    #[schemars(extend("x-since" = 2))]
    pub schema_version: Option<u32>,
    /// Shard `K/N` of a sharded run (0-based K); empty when the run was not sharded.
    #[schemars(extend("x-since" = 2))]
    pub shard: String,
    /// Git commit bmoe was built from (12 hex digits, `-dirty` when the tree had changes).
    #[schemars(extend("x-since" = 2))]
    pub git_commit: String,
    /// The llama.cpp build: the pinned `llama-cpp-sys-2` crate version that vendors it.
    #[schemars(extend("x-since" = 2))]
    pub llama_cpp: String,
    /// Host name of the machine that ran the item.
    #[schemars(extend("x-since" = 2))]
    pub host: String,
    /// CPU model (`/proc/cpuinfo`: `model name`, else `Hardware`).
    #[schemars(extend("x-since" = 2))]
    pub cpu_model: String,
    /// CPUs this process may use.
    #[schemars(extend("x-since" = 2, "x-unit" = "count"))]
    pub cpu_cores: Option<u32>,
    /// SHA-256 of the profile file's bytes, first 16 hex digits.
    #[schemars(extend("x-since" = 2))]
    pub profile_hash: String,
    /// SHA-256 of the whole model (every shard, in order), 64 hex digits.
    #[schemars(extend("x-since" = 2))]
    pub model_sha256: String,
    /// The planned prefill device (`bmoe plan`), empty for the CPU; `prefill_device` says which
    /// device really ran.
    #[schemars(extend("x-since" = 2))]
    pub prefill_device_plan: String,
    /// generate: sampling temperature (0 = greedy); empty on other kinds.
    #[schemars(extend("x-since" = 2))]
    pub temperature: Option<f64>,
    /// generate: top-k of seeded sampling (0 = off); empty when greedy or on other kinds.
    #[schemars(extend("x-since" = 2))]
    pub top_k: Option<u32>,
    /// generate: top-p of seeded sampling; empty when greedy or on other kinds.
    #[schemars(extend("x-since" = 2, "x-unit" = "fraction"))]
    pub top_p: Option<f64>,
    /// generate: RNG seed of seeded sampling; empty when greedy or on other kinds.
    #[schemars(extend("x-since" = 2))]
    pub seed: Option<u64>,
    /// generate: token limit per prompt; empty on other kinds.
    #[schemars(extend("x-since" = 2, "x-unit" = "tokens"))]
    pub n_predict: Option<u32>,
    /// generate: prompt rendered with the chat template; empty on other kinds.
    #[schemars(extend("x-since" = 2))]
    pub chat: Option<bool>,
    /// Peak resident set of the bmoe process when the row was written (`VmHWM`).
    #[schemars(extend("x-since" = 2, "x-unit" = "MiB"))]
    pub peak_rss_mib: Option<f64>,
    /// The `threads` setting as configured (`auto` or a number); `threads` is what ran.
    #[schemars(extend("x-since" = 2))]
    pub threads_setting: String,
    /// generate: why it stopped (`n_predict`, `eog`, `context_full`, `cancelled`); empty otherwise.
    #[schemars(extend("x-since" = 2))]
    pub stopped: String,
    /// Repeat index of this item at this point, from 0 (the job's `repeat`).
    #[schemars(extend("x-since" = 2, "x-unit" = "count"))]
    pub repeat: u32,
    /// decide: how the choices were scored (`first_token`, `sum`, `mean`); empty otherwise.
    #[schemars(extend("x-since" = 2))]
    pub scoring: String,
    /// decide: the best choice's text; empty otherwise.
    #[schemars(extend("x-since" = 2))]
    pub best_choice: String,
    /// decide: best score minus the second best; empty with one choice or on other kinds.
    #[schemars(extend("x-since" = 2, "x-unit" = "nats"))]
    pub margin: Option<f64>,
    /// decide: the expected choice's text; empty when the decision has no `expected`.
    #[schemars(extend("x-since" = 2))]
    pub expected: String,
    /// decide: the best choice is the expected one; empty without `expected`.
    #[schemars(extend("x-since" = 2))]
    pub correct: Option<bool>,
    /// decide: the decision's `meta` object as JSON; empty without one.
    #[schemars(extend("x-since" = 2))]
    pub meta: String,
    /// decide: JSON array of the tokens scored per choice (1 each with `first_token`).
    #[schemars(extend("x-since" = 2, "x-unit" = "tokens"))]
    pub choice_ntok: String,
    /// decide: prompt tokens carried over from the KV cache (depends on what ran before).
    #[schemars(extend("x-since" = 2, "x-unit" = "tokens"))]
    pub n_reused: Option<u32>,
    /// decide: prompt tokens this item prefilled (`n_prompt - n_reused`).
    #[schemars(extend("x-since" = 2, "x-unit" = "tokens"))]
    pub n_prefilled: Option<u32>,
    /// decide: what prefix reuse did (`hit`, `extend`, `restore`, `miss`).
    #[schemars(extend("x-since" = 2))]
    pub reuse: String,
    /// decide: why nothing was reused (`off`, `empty`, ...), or for `restore` why the cached prefix
    /// could not be kept; empty otherwise.
    #[schemars(extend("x-since" = 2))]
    pub reuse_reason: String,
    // ---- schema 3 ----
    /// How the model of this (job, profile point) was loaded: `lean` (a streamed model: its
    /// header and dense weights, no expert) or `llama` (llama.cpp's load, which reads the whole
    /// file); empty when it did not load.
    #[schemars(extend("x-since" = 3))]
    pub load_mode: String,
    /// Bytes the process read from storage during that load (`/proc/self/io`), / 2^20; 0 when the
    /// model was already loaded for an earlier point; empty where the kernel does not say.
    #[schemars(extend("x-since" = 3, "x-unit" = "MiB"))]
    pub load_read_mib: Option<f64>,
    /// Time to first token: generate, from the call to its first token sampled; decide, from the
    /// call to its scores; empty on other kinds.
    #[schemars(extend("x-since" = 3, "x-unit" = "s"))]
    pub ttft_s: Option<f64>,
    /// Highest anonymous resident memory (`RssAnon`) seen so far, sampled every 10 ms.
    #[schemars(extend("x-since" = 3, "x-unit" = "MiB"))]
    pub peak_rss_anon_mib: Option<f64>,
    /// Highest file-backed resident memory (`RssFile`: mapped pages of files, the model's
    /// included) seen so far, sampled every 10 ms.
    #[schemars(extend("x-since" = 3, "x-unit" = "MiB"))]
    pub peak_rss_file_mib: Option<f64>,
    /// The `prefetch` setting (`router`, `off`).
    #[schemars(extend("x-since" = 3))]
    pub prefetch: String,
    /// Experts read ahead of their routing node for this item.
    #[schemars(extend("x-since" = 3, "x-unit" = "count"))]
    pub prefetched: u64,
    /// Share of this item's expert cache misses whose read was done ahead, overlapped with
    /// compute; empty without misses.
    #[schemars(extend("x-since" = 3, "x-unit" = "%"))]
    pub overlap_pct: Option<f64>,
    /// Layers the device arena read whole by the routed-full fallback (the layer before routed to
    /// a larger share of its experts than the whole-layer threshold).
    #[schemars(extend("x-since" = 3, "x-unit" = "count"))]
    pub prefill_dev_whole_fallback: u64,
    // ---- schema 4 ----
    /// Bytes the device arena read from the GGUF, / 2^20 (the rest of `prefill_dev_read_mib` came
    /// from memory: host weights, converted weights, experts the CPU-side cache held).
    #[schemars(extend("x-since" = 4, "x-unit" = "MiB"))]
    pub prefill_dev_file_read_mib: f64,
    /// (layer, expert) pairs the device arena took from the CPU-side expert cache instead of
    /// reading them from the GGUF.
    #[schemars(extend("x-since" = 4, "x-unit" = "count"))]
    pub prefill_dev_cached_experts: u64,
    // ---- schema 5 ----
    /// The prefill device the settings asked for (`device`), empty for none; beside
    /// `prefill_device_plan` (what placement kept) and `prefill_device` (what ran), so a row that
    /// fell back to the CPU says what it was asked to run on.
    #[schemars(extend("x-since" = 5))]
    pub prefill_device_requested: String,
    /// perplexity: standard error of `nll_mean` over the scored tokens (llama-perplexity's
    /// `+/-` is `ppl * nll_stderr`); empty otherwise.
    #[schemars(extend("x-since" = 5, "x-unit" = "nats"))]
    pub nll_stderr: Option<f64>,
    // ---- schema 6 ----
    /// The CPU kernels that ran: ggml's CPU variant (`armv8.6_1`, `built-in`) and the features it
    /// was compiled for (`armv8.6_1: NEON ARM_FMA FP16_VA DOTPROD MATMUL_INT8 SVE ...`).
    #[schemars(extend("x-since" = 6))]
    pub cpu_variant: String,
    /// What the expert cache does with an evicted expert's pages on this system: `move` (kept
    /// for the next miss) or `release` (the start-up self-check of `MREMAP_DONTUNMAP` failed).
    #[schemars(extend("x-since" = 6))]
    pub page_moves: String,
    // ---- schema 7 ----
    /// The `repack` setting: `auto` (llama.cpp's repacked CPU layouts where the CPU has a kernel
    /// for the type) or `off`.
    #[schemars(extend("x-since" = 7))]
    pub repack: String,
    /// Weight tensors held in one of the CPU's repacked layouts (`CPU_REPACK`; `AMX` where the
    /// CPU variant has it) by the model that ran (in a streamed run, the expert tensors whose
    /// slices are repacked as they are read and the dense matrices repacked at load); 0 = every
    /// kernel ran over the file's own layout; empty when the model did not load.
    #[schemars(extend("x-since" = 7, "x-unit" = "tensors"))]
    pub repacked_tensors: Option<u64>,
    // ---- schema 8 ----
    /// Routed experts of this item replaced at a cache miss by a cached expert of the same layer
    /// with a close router probability (`expert_substitute`; 0 when off).
    #[schemars(extend("x-since" = 8, "x-unit" = "count"))]
    pub experts_substituted: u64,
    /// Routed experts of this item skipped at a cache miss for their small share of the token's
    /// router weight (`drop_cold`; 0 when off).
    #[schemars(extend("x-since" = 8, "x-unit" = "count"))]
    pub experts_dropped: u64,
    // ---- schema 9 ----
    /// Times memory pressure shrank the expert cache during this item (`cache_reserve_mb`; 0
    /// when off). Each is also said once on stderr.
    #[schemars(extend("x-since" = 9, "x-unit" = "count"))]
    pub cache_shrinks: u64,
    /// Times the expert cache's budget grew back during this item after the pressure eased.
    #[schemars(extend("x-since" = 9, "x-unit" = "count"))]
    pub cache_grows: u64,
    /// The expert cache's budget at the end of this item: `cache_mb` unless memory pressure
    /// shrank it, with the reads ahead's staging while they pause (lent to the cache); empty
    /// without a cache.
    #[schemars(extend("x-since" = 9, "x-unit" = "MiB"))]
    pub cache_budget_mib: Option<f64>,
    /// Every layered setting the row ran with, as configured (`"auto"` kept): one JSON object in
    /// declaration order (docs/configuration.md); its JSON Schema, with each setting's range or
    /// enum, is this column's `contentSchema`. Empty in files before schema 10.
    #[schemars(extend("x-since" = 10, "contentMediaType" = "application/json"))]
    pub settings: String,
    /// The first 16 hex digits of the `settings` cell's SHA-256: rows that ran alike share it.
    #[schemars(extend("x-since" = 10))]
    pub settings_hash: String,
    // ---- schema 11 ----
    /// What ran the row: `bmoe` (the engine) or `llama.cpp` (stock llama.cpp, the baseline of
    /// `runtime = "llama.cpp"`). Empty in files before schema 11 (bmoe).
    #[schemars(extend("x-since" = 11))]
    pub runtime: String,
    /// The memory cgroup's limit the point ran under (`memory_limit` resolved); empty without one.
    #[schemars(extend("x-since" = 11, "x-unit" = "MiB"))]
    pub memory_limit_mib: Option<u64>,
    /// True only when the cgroup was made and the point's process ran in it.
    #[schemars(extend("x-since" = 11))]
    pub memory_enforced: bool,
    /// The cgroup's peak usage, page cache included, from the point's start to this row (v1
    /// `memory.max_usage_in_bytes`, v2 `memory.peak`); empty without a limit.
    #[schemars(extend("x-since" = 11, "x-unit" = "MiB"))]
    pub memory_peak_mib: Option<f64>,
    // ---- schema 12 ----
    /// Expert bytes read from storage while this item decoded (its prompt's reads left out),
    /// / 2^20: what decode's speed depends on. Empty without `moe_stream`.
    #[schemars(extend("x-since" = 12, "x-unit" = "MiB"))]
    pub decode_read_mib: Option<f64>,
    /// The storage's random O_DIRECT read rate measured before the point loaded (`disk_probe`),
    /// at `io_threads` reads in flight; empty without the probe.
    #[schemars(extend("x-since" = 12, "x-unit" = "MiB/s"))]
    pub disk_mib_s: Option<f64>,
}
}

impl Row {
    /// The column names, in order.
    pub fn columns() -> Vec<String> {
        let mut w = csv::WriterBuilder::new()
            .has_headers(true)
            .from_writer(Vec::new());
        // Serializing the default row is infallible: every field is a plain scalar.
        let _ = w.serialize(Row::default());
        let bytes = w.into_inner().unwrap_or_default();
        let text = String::from_utf8_lossy(&bytes);
        text.lines()
            .next()
            .unwrap_or_default()
            .split(',')
            .map(str::to_string)
            .collect()
    }

    /// What an item produced, column by column: the columns a rerun of the same item on the same
    /// model must reproduce (not timing, host or build identity).
    fn outcome(&self) -> [(&'static str, String); 11] {
        [
            ("kind", self.kind.clone()),
            ("model_hash", self.model_hash.clone()),
            ("n_prompt", self.n_prompt.to_string()),
            ("tokens", self.tokens.to_string()),
            ("best", format!("{:?}", self.best)),
            (
                "choice_logp",
                format!(
                    "{:?}",
                    self.choice_logp
                        .0
                        .iter()
                        .map(|v| v.to_bits())
                        .collect::<Vec<_>>()
                ),
            ),
            ("ppl", format!("{:?}", self.ppl.map(f64::to_bits))),
            ("nll_mean", format!("{:?}", self.nll_mean.map(f64::to_bits))),
            ("n_scored", format!("{:?}", self.n_scored)),
            ("error", self.error.clone()),
            ("text", self.text.clone()),
        ]
    }

    /// True when two rows of one key are the same result (a duplicate, not a conflict).
    pub fn same_outcome(&self, other: &Row) -> bool {
        self.outcome() == other.outcome()
    }

    /// The first outcome column where two rows differ, its values as the CSV spells them (for
    /// `choice_logp`, the first choice that differs), for messages.
    pub fn outcome_difference(&self, other: &Row) -> String {
        let Some(col) = self
            .outcome()
            .iter()
            .zip(other.outcome().iter())
            .find(|(a, b)| a.1 != b.1)
            .map(|(a, _)| a.0)
        else {
            return "no outcome column differs".into();
        };
        let (a, b) = (self.cell(col), other.cell(col));
        // A list cell (`[-6.5,-1.2,null]`) holds numbers and nulls only, so commas split it.
        let list = |c: &str| -> Option<Vec<String>> {
            let inner = c.strip_prefix('[')?.strip_suffix(']')?;
            Some(inner.split(',').map(str::to_string).collect())
        };
        if let (Some(la), Some(lb)) = (list(&a), list(&b)) {
            if let Some(i) = la.iter().zip(&lb).position(|(x, y)| x != y) {
                return format!("`{col}` choice {i}: {} vs {}", la[i], lb[i]);
            }
        }
        let shown = |c: String| if c.is_empty() { "(empty)".into() } else { c };
        format!("`{col}`: {} vs {}", shown(a), shown(b))
    }

    /// True when every cell of two rows is spelled alike: the same row written twice.
    pub fn same_cells(&self, other: &Row) -> bool {
        matches!((self.to_line(), other.to_line()), (Ok(a), Ok(b)) if a == b)
    }

    /// Where two rows of one key differ, for messages: the first outcome column that differs,
    /// else the first column of any kind.
    pub fn difference(&self, other: &Row) -> String {
        if !self.same_outcome(other) {
            return self.outcome_difference(other);
        }
        let shown = |c: &str| if c.is_empty() { "(empty)" } else { c }.to_string();
        let (a, b) = (self.cells(), other.cells());
        Row::columns()
            .iter()
            .zip(a.iter().zip(b.iter()))
            .find(|(_, (x, y))| x != y)
            .map_or("no column differs".into(), |(c, (x, y))| {
                format!("`{c}`: {} vs {}", shown(x), shown(y))
            })
    }

    /// Every cell as this row's CSV line spells it, in column order (empty when it cannot be
    /// written).
    fn cells(&self) -> csv::StringRecord {
        let Ok(line) = self.to_line() else {
            return csv::StringRecord::new();
        };
        let mut rdr = csv::ReaderBuilder::new()
            .has_headers(false)
            .from_reader(line.as_slice());
        rdr.records()
            .next()
            .and_then(Result::ok)
            .unwrap_or_default()
    }

    /// The cell of `column` as this row's CSV line spells it; empty for an unknown column.
    pub fn cell(&self, column: &str) -> String {
        let Some(i) = Row::columns().iter().position(|c| c == column) else {
            return String::new();
        };
        self.cells().get(i).map(str::to_string).unwrap_or_default()
    }

    /// The header line, with its newline.
    pub fn header_line() -> String {
        format!("{}\n", Row::columns().join(","))
    }

    /// The row as one CSV line, with its newline.
    pub fn to_line(&self) -> anyhow::Result<Vec<u8>> {
        let mut w = csv::WriterBuilder::new()
            .has_headers(false)
            .from_writer(Vec::new());
        w.serialize(self)?;
        w.into_inner().map_err(|e| anyhow::anyhow!("{e}"))
    }
}

/// Escapes text so a CSV row never spans lines (a torn row is then always a line without `\n`).
pub fn escape_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c => out.push(c),
        }
    }
    out
}

/// Each choice's log-probability, kept as numbers until the sink writes the cell: a JSON array
/// (-inf as null), empty when the row is not a decision.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChoiceLogp(pub Vec<f64>);

impl Serialize for ChoiceLogp {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.0.is_empty() {
            s.serialize_str("")
        } else {
            s.serialize_str(&logp_json(&self.0))
        }
    }
}

impl<'de> Deserialize<'de> for ChoiceLogp {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let cell = String::deserialize(d)?;
        if cell.trim().is_empty() {
            return Ok(Self::default());
        }
        parse_logp(&cell).map(Self).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "choice_logp: expected a JSON array of numbers or null, found {cell:?}"
            ))
        })
    }
}

/// `[-0.12,-3.4,null]`: log-probabilities as a JSON array, -inf as null.
pub fn logp_json(v: &[f64]) -> String {
    let items: Vec<serde_json::Value> = v
        .iter()
        .map(|x| {
            serde_json::Number::from_f64(*x)
                .map(serde_json::Value::Number)
                .unwrap_or(serde_json::Value::Null)
        })
        .collect();
    serde_json::Value::Array(items).to_string()
}

/// Parses [`logp_json`]'s output back (null -> -inf).
pub fn parse_logp(s: &str) -> Option<Vec<f64>> {
    let v: Vec<Option<f64>> = serde_json::from_str(s).ok()?;
    Some(
        v.into_iter()
            .map(|x| x.unwrap_or(f64::NEG_INFINITY))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_row() {
        let r = Row {
            text: escape_text("a\nb,\"c\"\\"),
            choice_logp: ChoiceLogp(vec![-0.5, f64::NEG_INFINITY]),
            ..Row::default()
        };
        let line = r.to_line().unwrap();
        assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1);
        assert_eq!(*line.last().unwrap(), b'\n');
        assert_eq!(parse_logp("[-0.5,null]").unwrap()[1], f64::NEG_INFINITY);
        let text = String::from_utf8(line).unwrap();
        assert!(text.contains("\"[-0.5,null]\""), "{text}");
    }

    #[test]
    fn choice_logp_reads_back_as_numbers() {
        let header = Row::columns().join(",");
        let read = |line: &str| {
            csv::Reader::from_reader(format!("{header}\n{line}").as_bytes())
                .deserialize::<Row>()
                .next()
                .unwrap()
        };
        let row = Row {
            choice_logp: ChoiceLogp(vec![-0.25, f64::NEG_INFINITY]),
            ..Row::default()
        };
        let line = String::from_utf8(row.to_line().unwrap()).unwrap();
        assert_eq!(read(&line).unwrap().choice_logp, row.choice_logp);
        let empty = String::from_utf8(Row::default().to_line().unwrap()).unwrap();
        assert!(read(&empty).unwrap().choice_logp.0.is_empty());
        let e = read(&line.replace("[-0.25,null]", "[oops]"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("choice_logp"), "{e}");
    }

    #[test]
    fn columns_start_with_identity() {
        let c = Row::columns();
        assert_eq!(&c[..3], &["run_id", "time", "job"]);
        assert!(c.contains(&"prefill_dev_read_mib".to_string()));
        assert!(c.contains(&"text".to_string()));
    }

    /// Columns are only appended: the header a schema-1 build wrote (the checked-in fixture) is a
    /// prefix of this build's, and `schema_version` is the first column schema 2 added.
    #[test]
    fn columns_only_appended() {
        let fixture = include_str!("../../tests/fixtures/schema1-demo.csv");
        let old: Vec<&str> = fixture.lines().next().unwrap().split(',').collect();
        let c = Row::columns();
        assert_eq!(&c[..old.len()], old.as_slice());
        assert_eq!(c[old.len()], "schema_version");
    }
}
