//! The profiling mode of device prefill (`explain`): every node of a wide graph is asked for, so
//! the scheduler computes the graph one node at a time and the hook times each; per op and
//! backend it counts nodes and time, the bytes of inputs that cross between the CPU and the
//! device, how often a graph changes backend (its splits), and for every op left on the CPU, why.
//! Timing node by node is slower than the normal run: the report says so.
use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use serde::Serialize;

/// Which side computed a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Side {
    /// The prefill device.
    Device,
    /// The CPU.
    Cpu,
}

/// One op type on one side.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct OpRow {
    /// ggml op (`MUL_MAT`, `MUL_MAT_ID`, ...).
    pub op: String,
    /// Where it ran.
    pub side: Option<Side>,
    /// Nodes.
    pub nodes: u64,
    /// Seconds, summed over the nodes (each timed alone).
    pub seconds: f64,
}

/// Ops the CPU computed in device graphs, with the reason and one node's name.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CpuOp {
    /// ggml op.
    pub op: String,
    /// Why the device did not compute it.
    pub reason: String,
    /// Nodes.
    pub nodes: u64,
    /// One of them, for finding it in the graph.
    pub example: String,
}

/// What the profiling mode found over the device graphs since the last report.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ExplainReport {
    /// Device graphs profiled.
    pub graphs: u64,
    /// Per op and side: nodes and time.
    pub ops: Vec<OpRow>,
    /// Bytes of node inputs that live on the other side (copied by the scheduler).
    pub copied_bytes: u64,
    /// Backend changes along the graphs' node order, plus one per graph: the graph splits.
    pub splits: u64,
    /// Matmul nodes (`MUL_MAT`, `MUL_MAT_ID`) and how many of them the device computed.
    pub matmuls: u64,
    /// Of `matmuls`, on the device.
    pub matmuls_on_device: u64,
    /// Every op left on the CPU, with why.
    pub cpu_ops: Vec<CpuOp>,
    /// How to read the times.
    pub note: String,
}

impl ExplainReport {
    /// Share of matmul nodes the device computed, in percent (`None` without matmuls).
    pub fn matmul_device_pct(&self) -> Option<f64> {
        (self.matmuls > 0).then(|| 100.0 * self.matmuls_on_device as f64 / self.matmuls as f64)
    }

    /// A table for people.
    pub fn render(&self) -> String {
        let mut s = format!(
            "explain-prefill: {} device graph(s), {} splits, {:.1} MiB copied between CPU and device, matmuls on the device: {}/{}{}\n",
            self.graphs,
            self.splits,
            self.copied_bytes as f64 / 1048576.0,
            self.matmuls_on_device,
            self.matmuls,
            self.matmul_device_pct()
                .map_or(String::new(), |p| format!(" ({p:.1}%)"))
        );
        s.push_str(&format!(
            "  {:<20} {:<7} {:>7} {:>10}\n",
            "op", "backend", "nodes", "ms"
        ));
        for r in &self.ops {
            let side = match r.side {
                Some(Side::Device) => "device",
                Some(Side::Cpu) | None => "cpu",
            };
            s.push_str(&format!(
                "  {:<20} {:<7} {:>7} {:>10.2}\n",
                r.op,
                side,
                r.nodes,
                r.seconds * 1e3
            ));
        }
        for c in &self.cpu_ops {
            s.push_str(&format!(
                "  on the CPU: {} x{} ({}), e.g. {}\n",
                c.op, c.nodes, c.reason, c.example
            ));
        }
        s.push_str(&format!("  {}\n", self.note));
        s
    }
}

/// Why a CPU node is there: its op unsupported, else a weight or input the device cannot read
/// (the scheduler's own copies to the CPU are a consequence, not a cause), else the scheduler's
/// choice to keep it next to its inputs.
fn cpu_reason(n: &NodeSeen) -> String {
    if !n.supported {
        return "op unsupported by the device for these types and shapes".into();
    }
    let cause = n
        .unreadable
        .iter()
        .filter(|(name, _)| !is_split_copy(name))
        .min_by_key(|(_, weight)| !weight);
    match cause {
        Some((name, true)) => format!("weight {name} is in a buffer the device cannot read"),
        Some((name, false)) => format!("input {name} is in a buffer the device cannot read"),
        None => "kept on the CPU by the scheduler, next to its inputs".into(),
    }
}

/// True for the scheduler's copy of a split input (`CPU#Qcur-0#0`).
fn is_split_copy(name: &str) -> bool {
    let parts: Vec<&str> = name.split('#').collect();
    parts.len() >= 3
        && !parts[0].is_empty()
        && parts
            .last()
            .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
}

/// `reason` with layer numbers (`-3` in `norm-3`) replaced by `-<il>`, so one row covers every
/// layer.
fn per_layer(reason: &str) -> String {
    let mut out = String::with_capacity(reason.len());
    let mut chars = reason.chars().peekable();
    while let Some(c) = chars.next() {
        out.push(c);
        let marks_layer = c == '-' || (c == 'l' && out.ends_with("_l"));
        if marks_layer && chars.peek().is_some_and(char::is_ascii_digit) {
            while chars.peek().is_some_and(char::is_ascii_digit) {
                chars.next();
            }
            out.push_str("<il>");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_copies_and_layer_numbers() {
        assert!(is_split_copy("CPU#Qcur-0 (view) (permuted)#0"));
        assert!(is_split_copy("RPC[127.0.0.1:1]#norm#12"));
        assert!(!is_split_copy("norm-0"));
        assert!(!is_split_copy("a#b"));
        assert!(!is_split_copy("a#b#"));
        assert_eq!(
            per_layer("input CPU#Qcur-12#0 of node_3"),
            "input CPU#Qcur-<il>#0 of node_3"
        );
        assert_eq!(
            per_layer("input cache_k_l12 (view)"),
            "input cache_k_l<il> (view)"
        );
    }
}

/// The accumulator the arena keeps while profiling.
#[derive(Debug, Default)]
pub(crate) struct Explain {
    graphs: u64,
    ops: BTreeMap<(String, Side), (u64, Duration)>,
    cpu_ops: BTreeMap<(String, String), (u64, String)>,
    copied_bytes: u64,
    splits: u64,
    matmuls: u64,
    matmuls_on_device: u64,
    /// The node asked for last and when.
    asked: Option<Instant>,
    last_side: Option<Side>,
    /// Inputs already counted as copied to a side in this graph.
    copied: HashSet<(usize, Side)>,
}

/// One computed node, as the hook saw it.
pub(crate) struct NodeSeen<'a> {
    pub op: &'a str,
    pub name: &'a str,
    pub side: Side,
    /// Whether the device supports the op for these types and shapes (CPU nodes).
    pub supported: bool,
    /// Inputs in buffers the device cannot read: (name, is a weight) (CPU nodes).
    pub unreadable: Vec<(String, bool)>,
    /// (address, bytes, name) of each input.
    pub inputs: Vec<(usize, u64, &'a str)>,
}

impl Explain {
    /// A device graph starts.
    pub(crate) fn begin_graph(&mut self) {
        self.graphs += 1;
        self.splits += 1;
        self.last_side = None;
        self.copied.clear();
        self.asked = None;
    }

    /// The scheduler is about to compute a node (it computes it alone, then calls `observed`).
    pub(crate) fn asked(&mut self) {
        self.asked = Some(Instant::now());
    }

    /// The node asked for last has been computed.
    pub(crate) fn observed(&mut self, n: NodeSeen) {
        let dt = self.asked.take().map(|t| t.elapsed()).unwrap_or_default();
        let e = self
            .ops
            .entry((n.op.to_string(), n.side))
            .or_insert((0, Duration::ZERO));
        e.0 += 1;
        e.1 += dt;
        if self.last_side.is_some_and(|s| s != n.side) {
            self.splits += 1;
        }
        self.last_side = Some(n.side);
        if n.op == "MUL_MAT" || n.op == "MUL_MAT_ID" {
            self.matmuls += 1;
            if n.side == Side::Device {
                self.matmuls_on_device += 1;
            }
        }
        // The scheduler's copies of a split's inputs are tensors named `<backend>#<name>#<n>`.
        for &(addr, bytes, name) in &n.inputs {
            if is_split_copy(name) && self.copied.insert((addr, n.side)) {
                self.copied_bytes += bytes;
            }
        }
        if n.side == Side::Cpu {
            let reason = per_layer(&cpu_reason(&n));
            let e = self
                .cpu_ops
                .entry((n.op.to_string(), reason))
                .or_insert((0, n.name.to_string()));
            e.0 += 1;
        }
    }

    /// The report so far; the accumulator starts over.
    pub(crate) fn take(&mut self) -> ExplainReport {
        let me = std::mem::take(self);
        ExplainReport {
            graphs: me.graphs,
            ops: me
                .ops
                .into_iter()
                .map(|((op, side), (nodes, t))| OpRow {
                    op,
                    side: Some(side),
                    nodes,
                    seconds: t.as_secs_f64(),
                })
                .collect(),
            copied_bytes: me.copied_bytes,
            splits: me.splits,
            matmuls: me.matmuls,
            matmuls_on_device: me.matmuls_on_device,
            cpu_ops: me
                .cpu_ops
                .into_iter()
                .map(|((op, reason), (nodes, example))| CpuOp {
                    op,
                    reason,
                    nodes,
                    example,
                })
                .collect(),
            note: "every node was computed and timed alone (explain mode): the graph ran slower than without it, and a node right after a backend change also carries the copy and synchronisation of its inputs".into(),
        }
    }
}
