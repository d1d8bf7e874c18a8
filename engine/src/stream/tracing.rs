//! The routing trace a streamer writes (`routing_trace`, format in `trace.rs`): its header at
//! the start, then each routing node served, with the phase, the piece's first token and the
//! router's probabilities where the hook read them.
use crate::error::{EngineError, Result, StreamError};
use crate::options::StreamOptions;

use super::trace;

/// What the trace's header says about the model: each MoE layer with its bytes per expert, and
/// the experts per layer and per token.
pub(super) struct Shape {
    /// Each MoE layer with the bytes one of its experts takes.
    pub(super) layers: Vec<(u32, u64)>,
    /// Experts per MoE layer (the most any layer has).
    pub(super) n_expert: u32,
    /// Experts a token routes to.
    pub(super) n_used: u32,
}

/// A routing trace being written, and what it records besides the ids `ensure` gets.
pub(super) struct Tracing {
    out: trace::Writer,
    /// Prompt or decode (`Streamer::set_phase`).
    pub(super) phase: trace::Phase,
    /// Tokens seen at the first MoE layer.
    tokens: u64,
    /// The first token of the piece being served.
    piece: u64,
    first_layer: u32,
    /// The router's probabilities at the routing node being served.
    probs: Option<Probs>,
}

/// The router's probabilities at one routing node.
struct Probs {
    layer: u32,
    /// Experts a row.
    n_expert: usize,
    /// Rows of `n_expert` probabilities.
    rows: Vec<f32>,
}

impl Tracing {
    /// The routing trace `opts.routing_trace` names, its header written (`shape`, the budget),
    /// or `None` where none is asked for.
    pub(super) fn start(
        opts: &StreamOptions,
        shape: Shape,
        budget_bytes: u64,
    ) -> Result<Option<Tracing>> {
        let Some(path) = &opts.routing_trace else {
            return Ok(None);
        };
        let first_layer = shape.layers.first().map_or(0, |(il, _)| *il);
        let header = trace::Header {
            bmoe_routing_trace: trace::VERSION,
            n_expert: shape.n_expert,
            n_expert_used: shape.n_used,
            token_bytes: shape
                .layers
                .iter()
                .map(|(_, b)| b * u64::from(shape.n_used))
                .sum(),
            layers: shape.layers,
            budget_bytes,
            prefetch: format!("{:?}", opts.prefetch).to_lowercase(),
            cache_policy: opts.cache_policy.name().into(),
        };
        let out = trace::Writer::create(path, &header).map_err(|source| {
            EngineError::Stream(StreamError::Trace {
                path: path.clone(),
                source,
            })
        })?;
        Ok(Some(Tracing {
            out,
            phase: trace::Phase::Prompt,
            tokens: 0,
            piece: 0,
            first_layer,
            probs: None,
        }))
    }

    /// Notes the router's probabilities at layer `il`'s routing node (rows of `n_expert`), for
    /// the next node.
    pub(super) fn note_probs(&mut self, il: u32, n_expert: usize, rows: Vec<f32>) {
        self.probs = Some(Probs {
            layer: il,
            n_expert,
            rows,
        });
    }

    /// Appends layer `il`'s routing node (`ids`, as made resident, `k` a token) with each id's
    /// router probability where the hook read them.
    pub(super) fn node(&mut self, il: u32, ids: &[i32], k: usize) -> Result<(), StreamError> {
        if il == self.first_layer {
            self.piece = self.tokens;
            self.tokens += (ids.len() / k) as u64;
        }
        let probs = match self.probs.take() {
            Some(p) if p.layer == il && p.rows.len() >= p.n_expert * ids.len() / k => ids
                .iter()
                .enumerate()
                .map(|(i, &e)| {
                    p.rows
                        .get((i / k) * p.n_expert + e.max(0) as usize)
                        .copied()
                        .unwrap_or(0.0)
                })
                .collect(),
            _ => Vec::new(),
        };
        let node = trace::Event::Node(trace::Node {
            phase: self.phase,
            token: self.piece,
            layer: il,
            ids: ids.to_vec(),
            probs,
        });
        self.write(&node)
    }

    /// Records that memory pressure moved the budget to `budget_bytes`. A write that fails here
    /// fails again at the next node's, which reports it.
    pub(super) fn budget(&mut self, budget_bytes: u64) {
        let _ = self.out.event(&trace::Event::Budget { budget_bytes });
    }

    fn write(&mut self, e: &trace::Event) -> Result<(), StreamError> {
        self.out.event(e).map_err(|source| self.error(source))
    }

    /// Writes what the trace has buffered.
    pub(super) fn flush(&mut self) -> Result<(), StreamError> {
        self.out.flush().map_err(|source| self.error(source))
    }

    fn error(&self, source: std::io::Error) -> StreamError {
        StreamError::Trace {
            path: self.out.path().to_path_buf(),
            source,
        }
    }
}
