//! Routing traces (`routing_trace`): one JSON line per routing node the streamer served (phase,
//! first token of the piece, layer, the experts made resident for each token and their router
//! probabilities), after a header line with what a replay needs (experts per layer, each
//! layer's bytes per expert, the cache budget). `sim` replays a trace through the streamer's own
//! cache policy and through the offline optimum.
use std::io::{BufRead, BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The format's version, the header's `bmoe_routing_trace`.
pub const VERSION: u32 = 1;

/// Whether a routing node belongs to a prompt (prefill, scoring) or to decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Prefill pieces (and anything that is not a generate's decode loop).
    #[default]
    Prompt,
    /// A generate's decode steps.
    Decode,
}

/// The first line: what a replay needs to know about the model and the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Header {
    /// The format's version ([`VERSION`]).
    pub bmoe_routing_trace: u32,
    /// Experts per MoE layer (the most any layer has).
    pub n_expert: u32,
    /// Experts a token routes to.
    pub n_expert_used: u32,
    /// Each MoE layer with the bytes one of its experts takes (all its expert tensors).
    pub layers: Vec<(u32, u64)>,
    /// Bytes of one token's routed experts when nothing is cached.
    pub token_bytes: u64,
    /// The cache budget the run started with (0: no cache, shared slots).
    pub budget_bytes: u64,
    /// The run's read-ahead mode (a replay matches the run's counts with `off`, or where
    /// nothing was read ahead).
    pub prefetch: String,
    /// The run's cache policy (`next_use`, `recency`); traces written before the setting
    /// existed ran `recency`.
    #[serde(default = "recency")]
    pub cache_policy: String,
}

impl Header {
    /// The cache policy the run had (checked when the trace is read).
    pub fn policy(&self) -> Option<crate::options::CachePolicy> {
        crate::options::CachePolicy::from_name(&self.cache_policy)
    }
}

fn recency() -> String {
    crate::options::CachePolicy::Recency.name().into()
}

/// One routing node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Node {
    /// Prompt or decode.
    pub phase: Phase,
    /// The piece's first token, counted from the model's load.
    pub token: u64,
    /// The layer.
    pub layer: u32,
    /// The experts made resident, `n_expert_used` per token (after the lossy knobs).
    pub ids: Vec<i32>,
    /// The router's probability of each of `ids` (empty where the graph's probabilities were
    /// not readable).
    #[serde(default)]
    pub probs: Vec<f32>,
}

/// A line after the header.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Event {
    /// A routing node.
    Node(Node),
    /// Memory pressure moved the budget (`cache_reserve_mb`).
    Budget {
        /// The new budget.
        budget_bytes: u64,
    },
}

/// A whole trace, read back.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    /// The header.
    pub header: Header,
    /// The lines after it, in order.
    pub events: Vec<Event>,
}

/// Why a trace could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The file could not be opened or read.
    #[error("reading {path}: {source}")]
    Io {
        /// The trace.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A line is not what the format says.
    #[error("{path}:{line}: {why}")]
    Bad {
        /// The trace.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong, naming the field.
        why: String,
    },
}

/// Writes a trace as the streamer serves routing nodes.
pub(crate) struct Writer {
    out: BufWriter<std::fs::File>,
    path: PathBuf,
}

impl Writer {
    /// Creates (or truncates) `path` and writes the header.
    pub(crate) fn create(path: &Path, header: &Header) -> std::io::Result<Self> {
        let mut w = Writer {
            out: BufWriter::new(std::fs::File::create(path)?),
            path: path.to_path_buf(),
        };
        w.line(header)?;
        Ok(w)
    }

    /// The file written.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one event.
    pub(crate) fn event(&mut self, e: &Event) -> std::io::Result<()> {
        self.line(e)
    }

    fn line(&mut self, v: &impl Serialize) -> std::io::Result<()> {
        serde_json::to_writer(&mut self.out, v).map_err(std::io::Error::from)?;
        self.out.write_all(b"\n")
    }

    /// Writes what is buffered (also done on drop, where an error cannot be reported).
    pub(crate) fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

impl Trace {
    /// Reads and checks a trace: the header first, then nodes whose layers are the header's,
    /// whose ids are rows of `n_expert_used` experts below `n_expert`, with a probability each
    /// or none.
    pub fn read(path: &Path) -> Result<Trace, TraceError> {
        let io = |source| TraceError::Io {
            path: path.to_path_buf(),
            source,
        };
        let bad = |line: usize, why: String| TraceError::Bad {
            path: path.to_path_buf(),
            line,
            why,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let mut lines = std::io::BufReader::new(file).lines();
        let first = lines.next().transpose().map_err(io)?.ok_or_else(|| {
            bad(
                1,
                "empty: a routing trace starts with its header line".into(),
            )
        })?;
        let header: Header = serde_json::from_str(&first)
            .map_err(|e| bad(1, format!("not a routing trace header: {e}")))?;
        if header.bmoe_routing_trace != VERSION {
            return Err(bad(
                1,
                format!(
                    "bmoe_routing_trace: version {} (this build reads {VERSION})",
                    header.bmoe_routing_trace
                ),
            ));
        }
        check_header(&header).map_err(|why| bad(1, why))?;
        let mut events = Vec::new();
        for (i, l) in lines.enumerate() {
            let (line, text) = (i + 2, l.map_err(io)?);
            if text.trim().is_empty() {
                continue;
            }
            let e: Event = serde_json::from_str(&text).map_err(|e| bad(line, e.to_string()))?;
            match &e {
                Event::Node(n) => check_node(&header, n).map_err(|why| bad(line, why))?,
                Event::Budget { budget_bytes } => {
                    check_bytes("budget_bytes", *budget_bytes).map_err(|why| bad(line, why))?
                }
            }
            events.push(e);
        }
        Ok(Trace { header, events })
    }

    /// The bytes one expert of `layer` takes (0 for a layer the header lacks).
    pub fn layer_bytes(&self, layer: u32) -> u64 {
        self.header
            .layers
            .iter()
            .find(|(l, _)| *l == layer)
            .map_or(0, |&(_, b)| b)
    }
}

/// llama.cpp's limits: no model a run could have traced has more.
const MAX_EXPERTS: u32 = crate::gguf::MAX_EXPERTS as u32;
const MAX_LAYERS: usize = crate::gguf::MAX_LAYERS as usize;
/// The most bytes a trace may give an expert, a token or a budget (1 PiB): sums of a node's misses
/// and of a run's nodes then stay far inside 64 bits.
const MAX_BYTES: u64 = 1 << 50;

fn check_bytes(field: &str, v: u64) -> Result<(), String> {
    if v > MAX_BYTES {
        return Err(format!("{field}: {v} bytes: expected at most {MAX_BYTES}"));
    }
    Ok(())
}

/// What is wrong with a header, naming the field: counts a model can have, each MoE layer once
/// with a size, sizes a machine can hold.
fn check_header(h: &Header) -> Result<(), String> {
    if !(1..=MAX_EXPERTS).contains(&h.n_expert) {
        return Err(format!(
            "n_expert: {}: expected 1..={MAX_EXPERTS}",
            h.n_expert
        ));
    }
    if !(1..=h.n_expert).contains(&h.n_expert_used) {
        return Err(format!(
            "n_expert_used: {}: expected 1..=n_expert ({})",
            h.n_expert_used, h.n_expert
        ));
    }
    if h.layers.len() > MAX_LAYERS {
        return Err(format!(
            "layers: {} layers: expected at most {MAX_LAYERS}",
            h.layers.len()
        ));
    }
    for (i, &(layer, bytes)) in h.layers.iter().enumerate() {
        if h.layers[..i].iter().any(|(l, _)| *l == layer) {
            return Err(format!("layers: layer {layer} is listed twice"));
        }
        if bytes == 0 {
            return Err(format!("layers: layer {layer} has experts of 0 bytes"));
        }
        check_bytes(&format!("layers: layer {layer}"), bytes)?;
    }
    check_bytes("token_bytes", h.token_bytes)?;
    check_bytes("budget_bytes", h.budget_bytes)?;
    if h.policy().is_none() {
        return Err(format!(
            "cache_policy: {:?}: expected \"next_use\" or \"recency\"",
            h.cache_policy
        ));
    }
    Ok(())
}

/// What is wrong with a node against its header, naming the field.
fn check_node(h: &Header, n: &Node) -> Result<(), String> {
    if !h.layers.iter().any(|(l, _)| *l == n.layer) {
        return Err(format!(
            "layer: {} is not one of the header's layers",
            n.layer
        ));
    }
    let k = h.n_expert_used.max(1) as usize;
    // A graph of no tokens (a capture pass) serves a node of no ids.
    if !n.ids.len().is_multiple_of(k) {
        return Err(format!(
            "ids: {} ids, not rows of n_expert_used = {k}",
            n.ids.len()
        ));
    }
    if let Some(e) = n.ids.iter().find(|&&e| e < 0 || e as u32 >= h.n_expert) {
        return Err(format!("ids: expert {e} outside 0..{}", h.n_expert));
    }
    if !n.probs.is_empty() && n.probs.len() != n.ids.len() {
        return Err(format!(
            "probs: {} probabilities for {} ids",
            n.probs.len(),
            n.ids.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Header {
        Header {
            bmoe_routing_trace: VERSION,
            n_expert: 4,
            n_expert_used: 2,
            layers: vec![(0, 100), (1, 100)],
            token_bytes: 400,
            budget_bytes: 300,
            prefetch: "off".into(),
            cache_policy: "next_use".into(),
        }
    }

    fn write(lines: &[&str]) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        for l in lines {
            writeln!(f, "{l}").unwrap();
        }
        f
    }

    #[test]
    fn a_written_trace_reads_back() {
        let f = tempfile::NamedTempFile::new().unwrap();
        let node = Event::Node(Node {
            phase: Phase::Decode,
            token: 7,
            layer: 1,
            ids: vec![3, 0],
            probs: vec![0.5, 0.25],
        });
        let mut w = Writer::create(f.path(), &header()).unwrap();
        w.event(&node).unwrap();
        w.event(&Event::Budget { budget_bytes: 200 }).unwrap();
        w.flush().unwrap();
        let t = Trace::read(f.path()).unwrap();
        assert_eq!(t.header, header());
        assert_eq!(t.events, vec![node, Event::Budget { budget_bytes: 200 }]);
    }

    #[test]
    fn bad_lines_name_their_line_and_field() {
        let h = serde_json::to_string(&header()).unwrap();
        let cases = [
            (
                r#"{"kind":"node","phase":"decode","token":0,"layer":5,"ids":[0,1]}"#,
                "layer: 5",
            ),
            (
                r#"{"kind":"node","phase":"decode","token":0,"layer":0,"ids":[0]}"#,
                "ids: 1 ids",
            ),
            (
                r#"{"kind":"node","phase":"decode","token":0,"layer":0,"ids":[0,9]}"#,
                "expert 9",
            ),
            (
                r#"{"kind":"node","phase":"prompt","token":0,"layer":0,"ids":[0,1],"probs":[1]}"#,
                "probs",
            ),
            (
                r#"{"kind":"node","phase":"later","token":0,"layer":0,"ids":[0,1]}"#,
                "later",
            ),
            (
                r#"{"kind":"node","token":0,"layer":0,"ids":[0,1]}"#,
                "phase",
            ),
        ];
        for (line, want) in cases {
            let f = write(&[&h, line]);
            let e = Trace::read(f.path()).unwrap_err().to_string();
            assert!(e.contains(":2: ") && e.contains(want), "{line}: {e}");
        }
    }

    #[test]
    fn bad_headers_name_their_field() {
        type Change = fn(&mut Header);
        let header_cases: [(Change, &str); 7] = [
            (
                |h| h.cache_policy = "lfu".into(),
                "cache_policy: \"lfu\": expected \"next_use\" or \"recency\"",
            ),
            (|h| h.n_expert = 4_000_000_000, "n_expert: 4000000000"),
            (|h| h.n_expert_used = 5, "n_expert_used: 5"),
            (
                |h| h.layers = vec![(0, 100), (0, 100)],
                "layer 0 is listed twice",
            ),
            (|h| h.layers = vec![(0, 0)], "0 bytes"),
            (
                |h| h.layers = vec![(0, u64::MAX)],
                "layers: layer 0: 18446744073709551615",
            ),
            (
                |h| h.budget_bytes = u64::MAX,
                "budget_bytes: 18446744073709551615",
            ),
        ];
        for (change, want) in header_cases {
            let mut h = header();
            change(&mut h);
            let f = write(&[&serde_json::to_string(&h).unwrap()]);
            let e = Trace::read(f.path()).unwrap_err().to_string();
            assert!(e.contains(":1: ") && e.contains(want), "{want}: {e}");
        }
    }

    #[test]
    fn odd_files_are_refused_or_read_as_written_before() {
        let h = serde_json::to_string(&header()).unwrap();
        let f = write(&[
            &h,
            r#"{"kind":"budget","budget_bytes":18446744073709551615}"#,
        ]);
        let e = Trace::read(f.path()).unwrap_err().to_string();
        assert!(e.contains(":2: budget_bytes"), "{e}");
        // A header written before the policy was recorded ran recency.
        let mut old: serde_json::Value = serde_json::to_value(header()).unwrap();
        old.as_object_mut().unwrap().remove("cache_policy");
        let f = write(&[&old.to_string()]);
        let t = Trace::read(f.path()).unwrap();
        assert_eq!(
            t.header.policy(),
            Some(crate::options::CachePolicy::Recency)
        );
        let f = write(&[r#"{"n_expert":4}"#]);
        let e = Trace::read(f.path()).unwrap_err().to_string();
        assert!(e.contains(":1: not a routing trace header"), "{e}");
        let f = write(&[]);
        assert!(Trace::read(f.path())
            .unwrap_err()
            .to_string()
            .contains("empty"));
    }
}
