//! A streamed model's load that reads what it needs: llama.cpp builds the model from the GGUF's
//! header alone (`llama_model_init_from_user`) and fills no tensor; the engine then binds the dense
//! weights to its own read-only mapping of the file (faulted in from exactly their ranges) and the
//! streamer binds the experts to its regions. llama.cpp's own load maps the whole file with
//! `MAP_POPULATE` and so reads every expert byte before the first token (findings 5.6).
use std::collections::HashMap;
use std::fs::File;

use crate::error::{EngineError, Result};
use crate::ffi::file_map::FileMap;
use crate::ffi::gguf::{GgufBuilder, GgufMeta, TensorInfo};
use crate::ffi::model::{LlamaModel, RawLoadParams};
use crate::ffi::region::Region;
use crate::ffi::tensor::TensorPtr;
use crate::gguf::index::GgufIndex;
use crate::graph::Capture;
use crate::weights::residency;

/// A model whose weights are bound to nothing real yet: every tensor points at one shared range
/// of never-written anonymous memory (reads give zeros, no page is committed), enough for the
/// capture pass, which only looks at the graph.
pub(crate) struct Unfilled {
    pub(crate) raw: LlamaModel,
    tensors: Vec<(TensorPtr, crate::gguf::index::TensorLocation)>,
    /// Tensors the architecture created that the file does not hold (optional ones llama.cpp's
    /// own load would have left out).
    absent: Vec<TensorPtr>,
    /// Fused expert tensors the architecture created whose parts the file holds apart (see
    /// `GgufIndex::expert_parts`): the streamer assembles each expert from its parts.
    assembled: Vec<TensorPtr>,
    zeros: Region,
}

/// The read-only mappings of the model's files that the dense weights point into; kept alive as
/// long as the model.
pub(crate) struct DenseMaps {
    // Held, not read: the dense tensors point into the maps, absent optional tensors into the
    // zero and one ranges.
    _maps: Vec<FileMap>,
    _neutral: [Region; 2],
    dense_bytes: u64,
    n_neutral: usize,
    /// The optional tensors the file lacks, kept for `unlink_absent`.
    absent: Vec<TensorPtr>,
    unlinked: Option<usize>,
}

/// (tensor the architecture creates, file tensor that stands in for it when the file lacks it):
/// llama.cpp's convention for tied weights, the same for every architecture.
const TIED: &[(&str, &str)] = &[("output.weight", "token_embd.weight")];

fn load_err(index: &GgufIndex, reason: String) -> EngineError {
    EngineError::ModelLoad {
        path: index.files()[0].0.clone(),
        reason,
    }
}

/// Why llama.cpp's metadata-only load cannot build this model, when it cannot: a model that
/// declares NextN/MTP blocks (`<arch>.nextn_predict_layers`, GLM-4.5, DeepSeek-V3) aborts the
/// process there, the skipped MTP tensors having no file to be skipped from
/// (`GGML_ASSERT(buft != nullptr)`, llama-model-loader.cpp:1329).
pub(crate) fn unsupported(index: &GgufIndex, arch: &str) -> Option<String> {
    let key = format!("{arch}.nextn_predict_layers");
    if let Some(n) = index.get_u64(&key).filter(|&n| n > 0) {
        return Some(format!(
            "{key} = {n}: llama.cpp's load from the header alone asserts on MTP blocks"
        ));
    }
    // Built from the header alone, a weight's absent optional scale and bias are both tensors
    // (absent ones are unlinked only after the first graph), and llama.cpp's graph asserts on an
    // NVFP4 weight that has both (llama-graph.cpp: `!down_s || !down_b || ... != NVFP4`; issue
    // 37's fuzz, seed 4, llama). The whole-file load leaves them out and takes it.
    index
        .tensor_infos()
        .iter()
        .find(|t| crate::ffi::quant::is_nvfp4(t.ty))
        .map(|t| {
            format!(
                "tensor {} is NVFP4, which the load from the header alone cannot build",
                t.name
            )
        })
}

/// The one header llama.cpp is given for a split GGUF or one whose fused expert tensors are
/// stored as parts: the first shard's key-values as llama.cpp looks them up, every shard's tensor
/// table and the fused tensors. Everything handed to ggml's writer here was read by ggml's own
/// reader and the index (keys, types, shapes, unique names), so its asserts cannot fire (the
/// `gguf_rebuild` fuzz target drives this with any header). A tensor with a dimension of 0 is
/// refused: ggml's writer drops a trailing 0 from its shape (`ggml_n_dims` counts dimensions
/// above 1) but places the next tensor after its 0 bytes, so its reader, sizing the shorter
/// shape, finds every later offset wrong (a fuzz case: `[128, 128, 0]` read back as `[128, 128]`).
pub(crate) fn rebuilt_header(index: &GgufIndex) -> std::result::Result<GgufBuilder, String> {
    let fused = index.fused_infos();
    if let Some(t) = index
        .tensor_infos()
        .iter()
        .chain(&fused)
        .find(|t| t.ne.contains(&0))
    {
        return Err(format!(
            "tensor {} has a dimension of 0 ({:?}): expected every dimension at least 1",
            t.name, t.ne
        ));
    }
    let mut b = GgufBuilder::new(index.tensor_infos().len() + fused.len());
    // What the copy leaves out (keys no lookup can find) llama.cpp's own load never reads either.
    let _ = b.copy_kv(index.header());
    for t in index.tensor_infos().iter().chain(&fused) {
        let rank = t.ne.iter().rposition(|&n| n != 1).map_or(1, |i| i + 1);
        b.add_tensor(&t.name, t.ty, &t.ne[..rank]);
    }
    Ok(b)
}

/// Builds the model without reading tensor data. For a split GGUF llama.cpp is given one header
/// holding the first shard's metadata and every shard's tensor table (llama.cpp types each
/// tensor it creates from the header it is given).
///
/// A fused expert tensor the file stores as its parts is added to that header (see
/// `GgufIndex::fused_infos`): llama.cpp creates it from a header alone whatever the file holds.
pub(crate) fn load_unfilled(index: &GgufIndex, params: &RawLoadParams) -> Result<Unfilled> {
    // The resident load's shape checks first: built from the header alone, llama.cpp sizes each
    // tensor from the hyper-parameters without comparing it with the file (issue 37).
    LlamaModel::check_shapes(&index.files()[0].0, params)
        .map_err(|reason| load_err(index, reason.to_string()))?;
    let fused = index.fused_infos();
    let built = (index.files().len() > 1 || !fused.is_empty())
        .then(|| rebuilt_header(index))
        .transpose()
        .map_err(|reason| load_err(index, reason))?;
    let meta: &dyn GgufMeta = match &built {
        Some(b) => b,
        None => index.header(),
    };
    let (raw, created) = LlamaModel::load_unfilled(meta, params)
        .map_err(|reason| load_err(index, reason.to_string()))?;
    let Matched {
        tensors,
        largest,
        absent,
        assembled,
    } = match_created(index, created)?;
    let zeros = Region::reserve(largest)
        .map_err(|e| load_err(index, format!("reserving address space: {e}")))?;
    {
        let mut exec = raw.exec().lock();
        let mut quiet = exec.quiet();
        for t in tensors
            .iter()
            .map(|(t, _)| t)
            .chain(&absent)
            .chain(&assembled)
        {
            residency::onto_region(*t, &zeros, &mut quiet).map_err(EngineError::Weight)?;
        }
    }
    Ok(Unfilled {
        raw,
        tensors,
        absent,
        assembled,
        zeros,
    })
}

/// The tensors llama.cpp created from the header, matched with the file's.
struct Matched {
    /// Each tensor the file holds (or a tied stand-in), with where it lies.
    tensors: Vec<(TensorPtr, crate::gguf::index::TensorLocation)>,
    /// The largest tensor's bytes.
    largest: usize,
    /// Tensors the file does not hold.
    absent: Vec<TensorPtr>,
    /// Fused expert tensors the file holds as parts.
    assembled: Vec<TensorPtr>,
}

/// Finds each tensor llama.cpp `created` in the file (or its tied stand-in), checked as
/// llama.cpp's own load checks it; the rest absent or assembled from parts.
fn match_created(index: &GgufIndex, created: Vec<TensorPtr>) -> Result<Matched> {
    let infos: HashMap<String, TensorInfo> = index
        .tensor_infos()
        .iter()
        .map(|t| (t.name.clone(), t.clone()))
        .collect();
    let mut m = Matched {
        tensors: Vec::with_capacity(created.len()),
        largest: 0,
        absent: Vec::new(),
        assembled: Vec::new(),
    };
    for t in created {
        let name = t.name();
        let found = match (index.get(&name), infos.get(&name)) {
            (Some(loc), Some(info)) => Some((loc, info)),
            // Tied embeddings: a file without an output matrix uses the token embeddings
            // (llama.cpp's file load creates the output as their duplicate; built from a header
            // it creates a separate tensor the file does not hold). Same shape and type only.
            _ => TIED
                .iter()
                .find(|(absent, _)| *absent == name)
                .and_then(|(_, from)| index.get(from).zip(infos.get(*from)))
                .filter(|(_, info)| info.ne == t.ne() && info.ty == t.layout().ty()),
        };
        let Some((loc, info)) = found else {
            m.largest = m.largest.max(t.nbytes());
            let (ne, nb) = (t.ne(), t.nb());
            let parts = index.expert_parts(&name, t.layout().ty(), ne[0], ne[2] as u64, nb[2]);
            if parts.is_some_and(|p| p.len() > 1) {
                m.assembled.push(t);
            } else {
                m.absent.push(t);
            }
            continue;
        };
        // What llama.cpp's own load checks (shape and type from the header, size in the file).
        if info.ne != t.ne() || info.ty != t.layout().ty() || loc.size != t.nbytes() as u64 {
            return Err(load_err(
                index,
                format!(
                    "tensor {name}: the file holds type {} shape {:?} ({} bytes); the architecture expects type {} shape {:?} ({} bytes)",
                    crate::ffi::quant::type_name(info.ty),
                    info.ne,
                    loc.size,
                    crate::ffi::quant::type_name(t.layout().ty()),
                    t.ne(),
                    t.nbytes()
                ),
            ));
        }
        m.largest = m.largest.max(t.nbytes());
        m.tensors.push((t, loc.clone()));
    }
    Ok(m)
}

/// The value an absent optional tensor must hold so that the ops reading it change nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Neutral {
    /// Added (a bias): zeros.
    Zero,
    /// Multiplied (a scale): ones.
    One,
}

/// Why no value makes an absent tensor's op an identity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum NotNeutral {
    /// It weights a norm the graph may compute only because the tensor exists.
    #[error("it weights a norm, which the graph may compute only because the tensor exists")]
    WeightsANorm,
    /// An op with no neutral operand reads it.
    #[error("ggml op {op} reads it (source {slot})")]
    ReadBy {
        /// The ggml op.
        op: ggml_sys::ggml_op,
        /// The source slot.
        slot: usize,
    },
    /// One op adds it and another multiplies by it.
    #[error("one op adds it and another multiplies by it")]
    AddedAndMultiplied,
}

/// Why the lean load gives way to llama.cpp's own load (a warning, not an error).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Fallback {
    /// An absent tensor that would have to be ones is not F32.
    #[error("the architecture creates {0}, which the file does not hold, as a non-F32 scale")]
    NonF32Scale(String),
    /// An absent tensor has no neutral value.
    #[error("the architecture creates {tensor}, which the file does not hold, and {why}")]
    NoNeutral {
        /// The tensor.
        tensor: String,
        /// Why no value is neutral.
        why: NotNeutral,
    },
    /// A tensor assembled from parts that no expert matmul reads (only the streamer fills one).
    #[error("the architecture creates {0}, which the file holds as separate parts, and no expert matmul reads it")]
    AssembledNotStreamed(String),
}

/// What `t` must hold for its graph to compute as if it did not exist, found by following its
/// uses in the captured graph through ops that only move values (views, copies, repeats, row
/// gathers) to the arithmetic that consumes them. `Ok(None)`: nothing reads it. `Err(op)`: an op
/// for which no value is neutral (a matmul, a norm, ...).
fn neutral_value(
    capture: &Capture,
    t: TensorPtr,
) -> std::result::Result<Option<Neutral>, NotNeutral> {
    let op_of: std::collections::HashMap<usize, ggml_sys::ggml_op> =
        capture.nodes.iter().map(|n| (n.addr, n.op)).collect();
    let mut found = None;
    let mut stack = vec![t.raw() as usize];
    let mut seen = std::collections::HashSet::new();
    while let Some(addr) = stack.pop() {
        if !seen.insert(addr) {
            continue;
        }
        for n in &capture.nodes {
            for (slot, _) in n.srcs.iter().enumerate().filter(|(_, s)| **s == Some(addr)) {
                let need = match (n.op, slot) {
                    (
                        ggml_sys::GGML_OP_VIEW
                        | ggml_sys::GGML_OP_RESHAPE
                        | ggml_sys::GGML_OP_PERMUTE
                        | ggml_sys::GGML_OP_TRANSPOSE
                        | ggml_sys::GGML_OP_CONT
                        | ggml_sys::GGML_OP_DUP
                        | ggml_sys::GGML_OP_REPEAT,
                        0,
                    )
                    | (ggml_sys::GGML_OP_GET_ROWS, 0) => {
                        stack.push(n.addr);
                        continue;
                    }
                    (ggml_sys::GGML_OP_ADD, _) | (ggml_sys::GGML_OP_ADD_ID, 1) => Neutral::Zero,
                    // The weight of a norm: llama.cpp's graph builders often apply the norm only
                    // when its weight exists (`if (attn_q_norm) Qcur = build_norm(..)`), so ones
                    // would leave a normalisation llama.cpp's own load does not compute.
                    (ggml_sys::GGML_OP_MUL, _)
                        if n.srcs.iter().flatten().any(|s| {
                            matches!(
                                op_of.get(s),
                                Some(
                                    &(ggml_sys::GGML_OP_RMS_NORM
                                        | ggml_sys::GGML_OP_NORM
                                        | ggml_sys::GGML_OP_L2_NORM
                                        | ggml_sys::GGML_OP_GROUP_NORM)
                                )
                            )
                        }) =>
                    {
                        return Err(NotNeutral::WeightsANorm);
                    }
                    (ggml_sys::GGML_OP_MUL, _) => Neutral::One,
                    (op, slot) => {
                        return Err(NotNeutral::ReadBy { op, slot });
                    }
                };
                match found {
                    Some(f) if f != need => return Err(NotNeutral::AddedAndMultiplied),
                    _ => found = Some(need),
                }
            }
        }
    }
    Ok(found)
}

impl Unfilled {
    /// Binds every tensor that is not an expert matrix of `capture` to its bytes in a read-only
    /// mapping of the file and asks the kernel to read those ranges now; expert matrices stay on
    /// the zero range until the streamer rebinds them. The file is mapped `MADV_RANDOM`, so a
    /// fault near an expert range does not read ahead into it.
    ///
    /// An optional tensor the architecture created but the file lacks (llama.cpp's own load
    /// leaves it out, and the graph skips the op that would read it) gets the value that makes
    /// its op an identity: zeros for a bias, ones for a scale. `Ok(Err(reason))` when some absent
    /// tensor has no such value: the caller loads the llama.cpp way.
    pub(crate) fn bind_dense(
        self,
        index: &GgufIndex,
        capture: &Capture,
    ) -> Result<std::result::Result<(LlamaModel, DenseMaps), Fallback>> {
        let (ones_needed, n_neutral) = match self.neutral_values(capture) {
            Ok(found) => found,
            Err(why) => return Ok(Err(why)),
        };
        let ones_len = ones_needed.iter().map(|t| t.nbytes()).max().unwrap_or(0);
        let mut ones = Region::reserve(ones_len)
            .map_err(|e| load_err(index, format!("reserving address space: {e}")))?;
        for c in ones.as_mut_slice()[..ones_len].chunks_exact_mut(4) {
            c.copy_from_slice(&1.0f32.to_ne_bytes());
        }
        let mut exec = self.raw.exec().lock();
        let mut quiet = exec.quiet();
        for t in &ones_needed {
            residency::onto_region(*t, &ones, &mut quiet).map_err(EngineError::Weight)?;
        }
        let experts: Vec<TensorPtr> = capture
            .experts
            .values()
            .flat_map(|roles| roles.values().copied())
            .collect();
        // Only the streamer fills an assembled tensor, and only the expert matrices it streams.
        if let Some(t) = self.assembled.iter().find(|t| !experts.contains(t)) {
            return Ok(Err(Fallback::AssembledNotStreamed(t.name().to_string())));
        }
        let maps = map_files(index)?;
        let mut dense_bytes = 0u64;
        for (t, loc) in &self.tensors {
            if experts.contains(t) {
                continue;
            }
            let m = maps[loc.file].bytes();
            let off = loc.offset as usize;
            let end = off + loc.size as usize;
            if end > m.len() {
                return Err(load_err(
                    index,
                    format!("tensor {} lies past the end of the file", t.name()),
                ));
            }
            residency::onto_file(*t, &m[off..end], &mut quiet).map_err(EngineError::Weight)?;
            maps[loc.file].will_need(off, end - off);
            dense_bytes += loc.size;
        }
        drop(exec);
        Ok(Ok((
            self.raw,
            DenseMaps {
                _maps: maps,
                _neutral: [self.zeros, ones],
                dense_bytes,
                n_neutral,
                absent: self.absent,
                unlinked: None,
            },
        )))
    }
    /// The absent tensors that need ones (f32 scales), and how many absent ones have a neutral
    /// value; the reason to load the llama.cpp way when one has none.
    fn neutral_values(
        &self,
        capture: &Capture,
    ) -> std::result::Result<(Vec<TensorPtr>, usize), Fallback> {
        let mut ones_needed = Vec::new();
        let mut n_neutral = 0;
        for &t in &self.absent {
            let value = neutral_value(capture, t);
            n_neutral += usize::from(matches!(value, Ok(Some(_))));
            match value {
                Ok(None | Some(Neutral::Zero)) => {}
                Ok(Some(Neutral::One)) if t.layout().ty() == ggml_sys::GGML_TYPE_F32 => {
                    ones_needed.push(t)
                }
                Ok(Some(Neutral::One)) => return Err(Fallback::NonF32Scale(t.name().to_string())),
                Err(why) => {
                    return Err(Fallback::NoNeutral {
                        tensor: t.name().to_string(),
                        why,
                    })
                }
            }
        }
        Ok((ones_needed, n_neutral))
    }
}

/// A read-only mapping of each of the model's files.
fn map_files(index: &GgufIndex) -> Result<Vec<FileMap>> {
    let mut maps = Vec::new();
    for (path, _) in index.files() {
        let f = File::open(path)
            .map_err(|e| load_err(index, format!("opening {} to map it: {e}", path.display())))?;
        // Its dense weights are mapped: a page the storage fails to give is then an error.
        crate::ffi::mapped_fault::register(path);
        let m = FileMap::map(&f)
            .map_err(|e| load_err(index, format!("mapping {}: {e}", path.display())))?;
        maps.push(m);
    }
    Ok(maps)
}

impl DenseMaps {
    /// Hands back the pages of the file mappings once the dense weights live elsewhere
    /// (`dense_weights = anon`): they leave the process's resident set instead of staying
    /// mapped beside their copies. Anything that still read the mapping would fault the file's
    /// bytes back in, so this is safe even if a weight was missed.
    pub(crate) fn release_file_pages(&self) {
        for m in &self._maps {
            m.release_pages();
        }
    }

    /// Bytes of dense weights bound into the mappings.
    pub(crate) fn dense_bytes(&self) -> u64 {
        self.dense_bytes
    }

    /// Optional tensors the architecture created that the file lacks and the graph still reads,
    /// bound to neutral values.
    pub(crate) fn n_neutral(&self) -> usize {
        self.n_neutral
    }

    /// References to such tensors cleared from the model's layers; `None` when declined.
    pub(crate) fn unlinked(&self) -> Option<usize> {
        self.unlinked
    }

    /// Clears the model's references to the absent tensors, as llama.cpp's own load leaves them
    /// (the graph builders skip an optional tensor's op when the tensor is missing; left in, each
    /// is an identity op and a graph node of its own). Only after `bind_dense` found a neutral
    /// value for every one of them: an absent tensor that is not optional (a tied output of
    /// another type, a required weight a damaged file lacks) would leave a graph builder reading
    /// a null tensor. Returns how many references were cleared (0 when declined).
    pub(crate) fn unlink_absent(&mut self, raw: &mut LlamaModel) -> usize {
        self.unlinked = raw.unlink_absent(&self.absent);
        self.unlinked.unwrap_or(0)
    }

    /// Counts again the absent tensors the graph still reads, in the graph built after
    /// `unlink_absent`.
    pub(crate) fn recount_neutral(&mut self, capture: &Capture) {
        self.n_neutral = self
            .absent
            .iter()
            .filter(|&&t| matches!(neutral_value(capture, t), Ok(Some(_))))
            .count();
    }
}
