//! The streamed expert matrices, layer by layer, and the memory they are bound to: each tensor's
//! own region with a cache, or one slot per role shared by every layer without one; and, with
//! `dense_weights = anon`, the engine's copies of the other weights.
use std::collections::BTreeMap;

use crate::error::{EngineError, Result, StreamError};
use crate::ffi::region::Region;
use crate::ffi::repack::ExpertRepack;
use crate::ffi::tensor::TensorPtr;
use crate::graph::{Capture, ExpertRole};
use crate::weights::table::{ExpertMatrix, WeightTable};
use crate::weights::{residency, Quiet};

use super::setup_err;

/// One MoE layer's expert matrices and where they are bound.
pub(super) struct Layer {
    /// The layer's expert matrices, each checked to be readable expert by expert from the file.
    pub(super) tensors: Vec<ExpertMatrix>,
    /// One region per tensor (cache mode); empty in shared-slot mode.
    pub(super) regions: Vec<Region>,
    /// Per tensor, how its experts are repacked for the CPU's repacked kernels (`repack =
    /// auto`); empty, or `None`, where they stay in the file's layout.
    pub(super) repacks: Vec<Option<ExpertRepack>>,
}

impl Layer {
    /// Bytes of one expert of this layer, all its matrices together.
    pub(super) fn expert_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.expert_bytes as u64).sum()
    }
}

/// The layers found in a weight table ([`expert_layers`]).
pub(super) struct Found {
    pub(super) layers: BTreeMap<u32, Layer>,
    /// The most experts a layer has.
    pub(super) n_expert: u32,
    /// Bytes one token's routed experts take.
    pub(super) token_bytes: u64,
}

/// Each layer's expert matrices (their parts checked to be in the file), the most experts a
/// layer has, and the bytes one token's routed experts take.
pub(super) fn expert_layers(table: &WeightTable, n_expert_used: u32) -> Result<Found> {
    let mut layers = BTreeMap::new();
    let mut n_expert = 0u32;
    let mut token_bytes = 0u64;
    for (il, matrices) in table.layers() {
        let mut tensors = Vec::new();
        let mut layer_expert_bytes = 0u64;
        for m in matrices {
            m.parts()
                .map_err(|e| EngineError::Stream(StreamError::NotInFile(e)))?;
            n_expert = n_expert.max(m.n_expert as u32);
            layer_expert_bytes += m.expert_bytes as u64;
            tensors.push(m.clone());
        }
        token_bytes += layer_expert_bytes * u64::from(n_expert_used);
        layers.insert(
            il,
            Layer {
                tensors,
                regions: Vec::new(),
                repacks: Vec::new(),
            },
        );
    }
    Ok(Found {
        layers,
        n_expert,
        token_bytes,
    })
}

/// Binds every expert tensor onto reserved memory: its own region with a cache, or without one
/// a slot per role shared by every layer (sized for the largest); returns the shared slots.
pub(super) fn bind_regions(
    layers: &mut BTreeMap<u32, Layer>,
    budget_bytes: u64,
    quiet: &mut Quiet<'_>,
) -> Result<BTreeMap<ExpertRole, Region>> {
    let io_err = setup_err("reserving expert memory");
    let mut shared = BTreeMap::new();
    if budget_bytes > 0 {
        for layer in layers.values_mut() {
            for t in &layer.tensors {
                let r = Region::reserve(t.tensor.nbytes()).map_err(io_err)?;
                residency::onto_region(t.tensor, &r, quiet).map_err(EngineError::Weight)?;
                layer.regions.push(r);
            }
        }
        return Ok(shared);
    }
    for layer in layers.values() {
        for t in &layer.tensors {
            let need = t.tensor.nbytes();
            let fits = shared
                .get(&t.role)
                .is_some_and(|r: &Region| r.len() >= need);
            if !fits {
                shared.insert(t.role, Region::reserve(need).map_err(io_err)?);
            }
        }
    }
    for layer in layers.values() {
        for t in &layer.tensors {
            residency::onto_region(t.tensor, &shared[&t.role], quiet)
                .map_err(EngineError::Weight)?;
        }
    }
    Ok(shared)
}

/// Every layer's expert matrices (what is not a dense weight).
pub(super) fn expert_tensors(layers: &BTreeMap<u32, Layer>) -> Vec<TensorPtr> {
    layers
        .values()
        .flat_map(|l| l.tensors.iter().map(|t| t.tensor))
        .collect()
}

/// `dense_weights = anon`: every other weight the graph reads copied into engine-owned memory.
pub(super) fn copy_dense(
    capture: &Capture,
    layers: &BTreeMap<u32, Layer>,
    wanted: impl Fn(TensorPtr) -> bool,
    quiet: &mut Quiet<'_>,
) -> Result<Vec<(TensorPtr, Region)>> {
    let io_err = setup_err("reserving expert memory");
    let expert_ptrs = expert_tensors(layers);
    let mut dense = Vec::new();
    for w in capture
        .weights
        .values()
        .filter(|w| !expert_ptrs.contains(w) && wanted(**w))
    {
        let mut r = Region::reserve(w.nbytes()).map_err(io_err)?;
        residency::copied_into(*w, &mut r, quiet).map_err(EngineError::Weight)?;
        dense.push((*w, r));
    }
    Ok(dense)
}

/// Each expert matrix of `layer` with the region it is bound to, in the layer's order: its own
/// (cache mode, `cached`), or its role's shared slot; and how it is repacked.
pub(super) fn bound_pairs<'a>(
    layer: &'a mut Layer,
    shared: &'a mut BTreeMap<ExpertRole, Region>,
    cached: bool,
) -> (
    Vec<(&'a ExpertMatrix, &'a mut Region)>,
    Vec<Option<&'a ExpertRepack>>,
) {
    let repacks = &layer.repacks;
    let rep = |i: usize| repacks.get(i).and_then(Option::as_ref);
    if cached {
        layer
            .tensors
            .iter()
            .zip(layer.regions.iter_mut())
            .enumerate()
            .map(|(i, p)| (p, rep(i)))
            .unzip()
    } else {
        let mut by_role: BTreeMap<ExpertRole, &mut Region> =
            shared.iter_mut().map(|(&role, r)| (role, r)).collect();
        layer
            .tensors
            .iter()
            .enumerate()
            .filter_map(|(i, t)| by_role.remove(&t.role).map(|r| ((t, r), rep(i))))
            .unzip()
    }
}
