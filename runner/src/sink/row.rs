//! One CSV row: identity, the resolved configuration that matters, and the telemetry of one
//! decision, prompt or text. The field order is the column order; columns are only ever appended.
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One row of the telemetry CSV (see docs/telemetry.md).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
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
    /// Compute threads.
    pub threads: u32,
    /// Context size the session got.
    #[schemars(extend("x-unit" = "tokens"))]
    pub context: u32,
    /// Expert streaming on.
    pub moe_stream: bool,
    /// Expert cache budget after `auto` resolved (0 when not streaming).
    #[schemars(extend("x-unit" = "MiB"))]
    pub cache_mb: u64,
    /// Expert-read lanes.
    pub io_threads: u32,
    /// Dense weights placement.
    pub dense_weights: String,
    /// Prefill device placement kept, empty for the CPU.
    pub prefill_device: String,
    /// ubatch on the device.
    #[schemars(extend("x-unit" = "tokens"))]
    pub device_ubatch: u32,
    /// ubatch on the CPU.
    #[schemars(extend("x-unit" = "tokens"))]
    pub cpu_ubatch: u32,
    /// Narrowest piece sent to the device.
    #[schemars(extend("x-unit" = "tokens"))]
    pub min_tokens: u32,
    /// Arena loader threads.
    pub loaders: u32,
    /// Routed arena on.
    pub routed: bool,
    /// Whole-layer threshold of the routed arena.
    #[schemars(extend("x-unit" = "fraction"))]
    pub routed_full: f64,
    /// Experts used per token (effective top-k).
    pub n_expert_used: u32,
    /// Model load time of this (job, profile point).
    #[schemars(extend("x-unit" = "s"))]
    pub load_s: f64,
    /// Prompt tokens prefilled.
    #[schemars(extend("x-unit" = "tokens"))]
    pub n_prompt: u32,
    /// Prefill time.
    #[schemars(extend("x-unit" = "s"))]
    pub prefill_s: f64,
    /// Prefill rate.
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
    /// Expert cache hit rate; -1 when nothing was looked up.
    #[schemars(extend("x-unit" = "%"))]
    pub cache_hit_pct: f64,
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
    #[schemars(extend("x-unit" = "nats"))]
    pub choice_logp: String,
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
    /// Repeat index of this item at this point, from 0 (the job's `repeat`).
    #[schemars(extend("x-unit" = "count"))]
    pub repeat: u32,
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
            choice_logp: logp_json(&[-0.5, f64::NEG_INFINITY]),
            ..Row::default()
        };
        let line = r.to_line().unwrap();
        assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1);
        assert_eq!(*line.last().unwrap(), b'\n');
        assert_eq!(parse_logp("[-0.5,null]").unwrap()[1], f64::NEG_INFINITY);
    }

    #[test]
    fn columns_start_with_identity() {
        let c = Row::columns();
        assert_eq!(&c[..3], &["run_id", "time", "job"]);
        assert!(c.contains(&"prefill_dev_read_mib".to_string()));
        assert!(c.contains(&"text".to_string()));
        assert_eq!(c.last().unwrap(), "repeat");
    }
}
