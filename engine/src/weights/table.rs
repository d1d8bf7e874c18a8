//! The model's expert matrices, found once from the capture and the GGUF index: which weight is
//! an expert matrix, its role, its experts' size in memory, and where each expert's bytes are in
//! the file. The streamer and the arena both read it instead of each working it out.
use std::collections::BTreeMap;

use crate::error::ExpertsNotInFile;
use crate::ffi::tensor::TensorPtr;
use crate::gguf::index::{ExpertPart, GgufIndex};
use crate::graph::{Capture, ExpertRole};

/// One 3-D expert weight of one layer.
#[derive(Debug, Clone)]
pub struct ExpertMatrix {
    /// Which matrix of the expert FFN it is.
    pub role: ExpertRole,
    /// The tensor.
    pub tensor: TensorPtr,
    /// Experts it holds (`ne[2]`).
    pub n_expert: usize,
    /// Bytes of one expert in memory (`nb[2]`).
    pub expert_bytes: usize,
    /// Each expert's pieces in the GGUF (one piece unless the file stores a fused tensor as its
    /// parts); empty when the file does not hold the experts in a form read expert by expert.
    parts: Vec<ExpertPart>,
}

impl ExpertMatrix {
    /// The expert's pieces in the file, or why it cannot be read from there.
    pub fn parts(&self) -> Result<&[ExpertPart], ExpertsNotInFile> {
        if self.parts.is_empty() {
            return Err(ExpertsNotInFile {
                tensor: self.tensor.name(),
                n_expert: self.n_expert as i64,
                expert_bytes: self.expert_bytes,
            });
        }
        Ok(&self.parts)
    }

    /// Expert `e`'s pieces in the file: `(file, offset, bytes)` in memory order; none when the
    /// file does not hold them (`parts` says why; callers that read check it once first).
    pub fn pieces_of(&self, e: usize) -> impl Iterator<Item = (usize, u64, usize)> + '_ {
        Self::pieces(&self.parts, e)
    }

    /// Where expert `e`'s bytes are: `(file, offset, bytes)` per piece, in memory order.
    pub fn pieces(
        parts: &[ExpertPart],
        e: usize,
    ) -> impl Iterator<Item = (usize, u64, usize)> + '_ {
        parts
            .iter()
            .map(move |p| (p.file, p.offset + (e * p.bytes) as u64, p.bytes))
    }
}

/// Every expert matrix of a model, by layer.
#[derive(Debug, Default)]
pub struct WeightTable {
    experts: BTreeMap<u32, Vec<ExpertMatrix>>,
}

impl WeightTable {
    /// The expert matrices the capture found, each located in `index`.
    pub fn new(capture: &Capture, index: &GgufIndex) -> WeightTable {
        let experts = capture
            .experts
            .iter()
            .map(|(&il, roles)| {
                let matrices = roles
                    .iter()
                    .map(|(&role, &t)| {
                        let ne = t.ne();
                        let expert_bytes = t.nb()[2];
                        let n_expert = ne[2] as usize;
                        let parts = index
                            .expert_parts(
                                &t.name(),
                                t.layout().ty(),
                                ne[0],
                                n_expert as u64,
                                expert_bytes,
                            )
                            // Experts laid out back to back, nothing else in the tensor.
                            .filter(|_| t.nbytes() == expert_bytes * n_expert)
                            .unwrap_or_default();
                        ExpertMatrix {
                            role,
                            tensor: t,
                            n_expert,
                            expert_bytes,
                            parts,
                        }
                    })
                    .collect();
                (il, matrices)
            })
            .collect();
        WeightTable { experts }
    }

    /// Layers with expert matrices, and theirs.
    pub fn layers(&self) -> impl Iterator<Item = (u32, &[ExpertMatrix])> {
        self.experts.iter().map(|(&il, m)| (il, m.as_slice()))
    }

    /// The expert matrix `t` is, if it is one.
    pub fn expert(&self, il: u32, t: TensorPtr) -> Option<&ExpertMatrix> {
        self.experts.get(&il)?.iter().find(|m| m.tensor == t)
    }

    /// Experts per layer (the largest `ne[2]`).
    pub fn n_expert(&self) -> usize {
        self.all().map(|m| m.n_expert).max().unwrap_or(0)
    }

    /// Bytes of the largest single expert: the largest read made at once.
    pub fn max_expert_bytes(&self) -> usize {
        self.all().map(|m| m.expert_bytes).max().unwrap_or(0)
    }

    fn all(&self) -> impl Iterator<Item = &ExpertMatrix> {
        self.experts.values().flatten()
    }
}
