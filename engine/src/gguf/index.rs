//! Where every tensor of a GGUF lives: tensor name -> (shard file, absolute offset, size), split
//! GGUFs (`-00001-of-0000N`) included, checked against the files' real lengths.
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::error::{EngineError, Result};
use crate::ffi::gguf::{GgufFile, TensorInfo};
use crate::gguf::check_gguf_file;

/// One tensor's bytes on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorLocation {
    /// Index into [`GgufIndex::files`].
    pub file: usize,
    /// Absolute byte offset in that file.
    pub offset: u64,
    /// Bytes.
    pub size: u64,
}

/// One piece of every expert of an expert tensor on disk: expert `e`'s piece is `bytes` long at
/// `offset + e * bytes` of file `file`. An expert's bytes in memory are its pieces in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertPart {
    /// Index into [`GgufIndex::files`].
    pub file: usize,
    /// Absolute offset of expert 0's piece.
    pub offset: u64,
    /// Bytes of one expert's piece.
    pub bytes: usize,
}

/// Suffixes of a fused expert tensor and of the stored tensors it concatenates, in row order
/// (llama.cpp's `build_moe_ffn` reads the gate rows first, then the up rows: llama-graph.cpp
/// 2234-2237).
const FUSED_EXPERTS: &[(&str, &[&str])] = &[(
    "ffn_gate_up_exps.weight",
    &["ffn_gate_exps.weight", "ffn_up_exps.weight"],
)];

/// One layer of a model as its header describes it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LayerShape {
    /// Bytes of all the layer's tensors.
    pub bytes: u64,
    /// Bytes of its routed expert tensors (`*_exps.*`).
    pub expert_bytes: u64,
    /// Bytes of K and V (f16) one token of context takes (0: no attention cache).
    pub kv_bytes_per_token: u64,
    /// Bytes of the recurrent state of one sequence (f32; 0: not a state-space layer).
    pub recurrent_bytes: u64,
}

/// The tensor table of a (possibly split) GGUF.
pub struct GgufIndex {
    files: Vec<(PathBuf, u64)>,
    tensors: HashMap<String, TensorLocation>,
    /// Every tensor's type and shape, all shards.
    infos: Vec<TensorInfo>,
    first: GgufFile,
}

/// The shard paths of a split GGUF named like `name-00001-of-00003.gguf`, or `None`.
fn split_paths(path: &Path, count: u32) -> Option<Vec<PathBuf>> {
    let name = path.file_name()?.to_str()?;
    let stem = name.strip_suffix(".gguf")?;
    let (prefix, tail) = stem.rsplit_once("-of-")?;
    let (prefix, _) = prefix.rsplit_once('-')?;
    let width = tail.len();
    Some(
        (1..=count)
            .map(|i| path.with_file_name(format!("{prefix}-{i:0width$}-of-{count:0width$}.gguf")))
            .collect(),
    )
}

/// The shard count a GGUF's header gives (`split.count`) and every shard's path, each checked to
/// exist.
fn shard_paths(path: &Path, first: &GgufFile) -> Result<(u32, Vec<std::path::PathBuf>)> {
    let count = match first.get_i64("split.count") {
        None => 1,
        // The shard names carry the count in five digits (`-00001-of-00003`).
        Some(c @ 1..=99_999) => c as u32,
        Some(c) => {
            return Err(EngineError::Invalid {
                path: path.to_path_buf(),
                what: format!("split.count = {c}: expected 1..=99999 shards"),
            })
        }
    };
    let mut paths = vec![path.to_path_buf()];
    if count > 1 {
        paths = split_paths(path, count).ok_or_else(|| EngineError::ModelLoad {
            path: path.to_path_buf(),
            reason: format!(
                "the file says it is shard of a {count}-way split, but its name does not follow <name>-00001-of-{count:05}.gguf"
            ),
        })?;
        for (i, p) in paths.iter().enumerate() {
            if !p.exists() {
                return Err(EngineError::MissingShard {
                    path: path.to_path_buf(),
                    shard: i as u32 + 1,
                    count,
                    missing: p.clone(),
                });
            }
        }
    }
    Ok((count, paths))
}

/// A shard's own `split.no` and `split.count` agree with its place in the split.
fn check_shard_number(p: &Path, g: &GgufFile, i: usize, count: u32) -> Result<()> {
    if count <= 1 {
        return Ok(());
    }
    let no = g.get_i64("split.count");
    let idx = g.get_i64("split.no");
    if no != Some(i64::from(count)) || idx != Some(i as i64) {
        return Err(EngineError::Invalid {
            path: p.to_path_buf(),
            what: format!(
                "shard {} of {count}: split.no = {}, split.count = {}: expected split.no = {i} and split.count = {count}",
                i + 1,
                idx.map(|v| v.to_string()).unwrap_or_else(|| "(absent)".into()),
                no.map(|v| v.to_string()).unwrap_or_else(|| "(absent)".into()),
            ),
        });
    }
    Ok(())
}

/// A header ggml could not read. Where ggml's message names no key or tensor (it logs only the
/// section for a file that ends under it), the walk names the one that runs past the end.
fn unreadable(path: &Path, reason: impl std::fmt::Display) -> EngineError {
    let mut reason = reason.to_string();
    if !reason.contains('\'') {
        if let Some(problem) = super::walk::header_problem(path) {
            reason = format!("{reason}; {problem}");
        }
    }
    EngineError::ModelLoad {
        path: path.to_path_buf(),
        reason: format!("unreadable GGUF header: {reason}"),
    }
}

/// A tensor name held twice, across shards or within one as ggml reads names (up to a NUL byte):
/// llama.cpp's own load refuses the file ("tensor is duplicated"), and a header rebuilt from it
/// would abort ggml's writer (`duplicate tensor name`).
fn duplicate_tensor(paths: &[PathBuf], name: &str, first: usize, again: usize) -> EngineError {
    let shard = |i: usize| paths[i].display().to_string();
    let where_ = if first == again {
        "twice in this file (names that differ only after a NUL byte)".to_string()
    } else {
        format!("in {} and again in this shard", shard(first))
    };
    EngineError::Invalid {
        path: paths[again].clone(),
        what: format!("tensor {name:?} appears {where_}"),
    }
}

impl GgufIndex {
    /// Indexes `path` and, for a split GGUF, every shard; a missing shard or a tensor past the end
    /// of its file is an error.
    pub fn open(path: &Path) -> Result<Self> {
        let len = check_gguf_file(path)?;
        let first = GgufFile::open(path).map_err(|reason| unreadable(path, reason))?;
        let (count, paths) = shard_paths(path, &first)?;
        let mut files = Vec::new();
        let mut tensors = HashMap::new();
        let mut infos = Vec::new();
        for (i, p) in paths.iter().enumerate() {
            let (len, header) = if i == 0 && p == path {
                (len, None)
            } else {
                let len = check_gguf_file(p)?;
                let g = GgufFile::open(p).map_err(|reason| unreadable(p, reason))?;
                (len, Some(g))
            };
            let g = header.as_ref().unwrap_or(&first);
            check_shard_number(p, g, i, count)?;
            infos.extend(g.tensor_infos());
            let base = g.data_offset();
            for (name, off, size) in g.tensors() {
                let end = base.saturating_add(off).saturating_add(size);
                if end > len {
                    return Err(EngineError::ModelLoad {
                        path: p.clone(),
                        reason: format!(
                            "the file is truncated: tensor {name} ends at byte {end} but the file has {len} bytes"
                        ),
                    });
                }
                let at = TensorLocation {
                    file: i,
                    offset: base + off,
                    size,
                };
                if let Some(first) = tensors.insert(name.clone(), at) {
                    return Err(duplicate_tensor(&paths, &name, first.file, i));
                }
            }
            files.push((p.clone(), len));
        }
        if count > 1 {
            if let Some(want) = first.get_i64("split.tensors.count") {
                if want != tensors.len() as i64 {
                    return Err(EngineError::Invalid {
                        path: path.to_path_buf(),
                        what: format!(
                            "split.tensors.count = {want}: the {count} shards hold {} tensors",
                            tensors.len()
                        ),
                    });
                }
            }
        }
        Ok(Self {
            files,
            tensors,
            infos,
            first,
        })
    }

    /// The shard files and their lengths.
    pub fn files(&self) -> &[(PathBuf, u64)] {
        &self.files
    }

    /// Bytes of all shards.
    pub fn total_file_bytes(&self) -> u64 {
        self.files.iter().map(|(_, l)| l).sum()
    }

    /// Every tensor's name, type and shape, all shards, in file order.
    pub fn tensor_infos(&self) -> &[TensorInfo] {
        &self.infos
    }

    /// Every layer's weights and cache, from the header alone (budgets made before a load).
    pub fn layers(&self) -> Vec<LayerShape> {
        let arch = self.arch().unwrap_or_default();
        let key = |s: &str| format!("{arch}.{s}");
        // At most llama.cpp's layer limit: the header's count sizes the answer before any check
        // has looked at it (a count of 2^40 took the fuzzer's 10 s and gigabytes; issue 55).
        let n_layer = self
            .get_u64(&key("block_count"))
            .unwrap_or(0)
            .min(crate::gguf::MAX_LAYERS as u64) as usize;
        let n_embd = self.get_u64(&key("embedding_length")).unwrap_or(0);
        let n_head = self
            .get_u64(&key("attention.head_count"))
            .unwrap_or(1)
            .max(1);
        // Per layer where the model varies it (0 marks a layer without attention).
        let kv_heads: Vec<u64> = match self.first.get_int_array(&key("attention.head_count_kv")) {
            Some(a) => a.iter().map(|&h| h.max(0) as u64).collect(),
            None => {
                let h = self
                    .get_u64(&key("attention.head_count_kv"))
                    .unwrap_or(n_head);
                vec![h; n_layer]
            }
        };
        let k_len = self
            .get_u64(&key("attention.key_length"))
            .unwrap_or(n_embd / n_head);
        let v_len = self
            .get_u64(&key("attention.value_length"))
            .unwrap_or(k_len);
        let ssm = |s: &str| self.get_u64(&key(&format!("ssm.{s}"))).unwrap_or(0);
        let (inner, state, groups, conv) = (
            ssm("inner_size"),
            ssm("state_size"),
            ssm("group_count").max(1),
            ssm("conv_kernel"),
        );
        let mut out = vec![LayerShape::default(); n_layer];
        let mut attention = vec![false; n_layer];
        let mut recurrent = vec![false; n_layer];
        for (name, loc) in &self.tensors {
            let Some((il, suffix)) = name
                .strip_prefix("blk.")
                .and_then(|r| r.split_once('.'))
                .and_then(|(il, s)| Some((il.parse::<usize>().ok()?, s)))
            else {
                continue;
            };
            let Some(l) = out.get_mut(il) else { continue };
            l.bytes += loc.size;
            if suffix.contains("_exps.") {
                l.expert_bytes += loc.size;
            }
            if suffix.starts_with("ssm_") {
                recurrent[il] = true;
            } else if ["attn_q", "attn_k", "attn_qkv", "attn_kv"]
                .iter()
                .any(|p| suffix.starts_with(p))
            {
                attention[il] = true;
            }
        }
        for (il, l) in out.iter_mut().enumerate() {
            let heads = kv_heads.get(il).copied().unwrap_or(0);
            // A layer with a state space (Mamba, gated delta net) keeps a recurrent state in
            // place of K and V, even where its fused input projection is named like attention's.
            if recurrent[il] {
                let conv_state = conv.saturating_sub(1) * (inner + 2 * groups * state);
                l.recurrent_bytes = 4 * (conv_state + inner * state);
            } else if attention[il] && heads > 0 {
                l.kv_bytes_per_token = 2 * heads * (k_len + v_len);
            }
        }
        out
    }

    /// Where a tensor lives.
    pub fn get(&self, name: &str) -> Option<&TensorLocation> {
        self.tensors.get(name)
    }

    /// Where the experts of the expert tensor `name` (`n_expert` experts of `expert_bytes`, type
    /// `ty`, `ne0` wide) lie on disk: the tensor itself, or, for a fused tensor the file stores
    /// as its separate parts, each part. llama.cpp creates a fused gate/up tensor whenever it
    /// builds a model from a header alone (`create_tensor_gate_up_exps` marks it optional but not
    /// `TENSOR_SKIP_IF_VIRTUAL`: llama-model.cpp:3406, llama-model-loader.cpp:1292), while the
    /// released GGUFs of those architectures store gate and up apart. `None` when neither fits.
    pub fn expert_parts(
        &self,
        name: &str,
        ty: crate::ffi::gguf::GgmlType,
        ne0: i64,
        n_expert: u64,
        expert_bytes: usize,
    ) -> Option<Vec<ExpertPart>> {
        let part = |n: &str| {
            let loc = self.tensors.get(n)?;
            let info = self.infos.iter().find(|i| i.name == n)?;
            let per = loc.size.checked_div(n_expert)?;
            (info.ty == ty && info.ne[0] == ne0 && info.ne[2] as u64 == n_expert)
                .then_some(ExpertPart {
                    file: loc.file,
                    offset: loc.offset,
                    bytes: per as usize,
                })
                .filter(|_| per * n_expert == loc.size)
        };
        let parts = match part(name) {
            Some(p) => vec![p],
            None => {
                let (il, suffix) = name.strip_prefix("blk.")?.split_once('.')?;
                let (_, parts) = FUSED_EXPERTS.iter().find(|(f, _)| *f == suffix)?;
                parts
                    .iter()
                    .map(|p| part(&format!("blk.{il}.{p}")))
                    .collect::<Option<Vec<_>>>()?
            }
        };
        (parts.iter().map(|p| p.bytes).sum::<usize>() == expert_bytes).then_some(parts)
    }

    /// The fused expert tensors the file stores only as their parts (name, type, shape): a
    /// model built from the header alone is given these too, so llama.cpp creates each fused
    /// tensor in its parts' type (it takes F32 for a tensor the header lacks:
    /// llama-model-loader.cpp:1296-1300).
    pub fn fused_infos(&self) -> Vec<TensorInfo> {
        let mut out = Vec::new();
        for info in &self.infos {
            let Some((il, suffix)) = info
                .name
                .strip_prefix("blk.")
                .and_then(|r| r.split_once('.'))
                // Only a layer number llama.cpp itself would print: the fused name is then one
                // it creates, and short enough for a ggml name (a longer one would be cut short
                // into another tensor's name).
                .filter(|(il, _)| il.parse::<u32>().is_ok_and(|n| n.to_string() == *il))
            else {
                continue;
            };
            for (fused, parts) in FUSED_EXPERTS {
                if parts.first() != Some(&suffix) {
                    continue;
                }
                let name = format!("blk.{il}.{fused}");
                let infos: Option<Vec<&TensorInfo>> = parts
                    .iter()
                    .map(|p| {
                        let n = format!("blk.{il}.{p}");
                        self.infos.iter().find(|i| i.name == n)
                    })
                    .collect();
                let Some(infos) = infos else { continue };
                let same = infos
                    .iter()
                    .all(|i| i.ty == info.ty && i.ne[0] == info.ne[0] && i.ne[2..] == info.ne[2..]);
                if same && !self.tensors.contains_key(&name) {
                    let mut ne = info.ne;
                    ne[1] = infos.iter().map(|i| i.ne[1]).sum();
                    out.push(TensorInfo {
                        name,
                        ty: info.ty,
                        ne,
                    });
                }
            }
        }
        out
    }

    /// Tensors indexed.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// True when the file holds no tensors.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// `general.architecture`.
    pub fn arch(&self) -> Option<String> {
        self.first.get_str("general.architecture")
    }

    /// The first shard's header.
    pub fn header(&self) -> &GgufFile {
        &self.first
    }

    /// An integer metadata value of the first shard.
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.first.get_u64(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_names() {
        let p = split_paths(Path::new("/m/x-00001-of-00003.gguf"), 3).unwrap();
        assert_eq!(p[2], PathBuf::from("/m/x-00003-of-00003.gguf"));
        assert!(split_paths(Path::new("/m/x.gguf"), 3).is_none());
    }

    #[test]
    fn a_fused_expert_tensor_is_found_as_its_stored_parts() {
        use bmoe_synth::{write_model, Preset, SynthArch, SynthSpec};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        let spec = SynthSpec::preset(Preset::Tiny, SynthArch::Qwen35Moe);
        write_model(&spec, &path).unwrap();
        let ix = GgufIndex::open(&path).unwrap();
        let (ty, x) = (spec.expert_type.ggml(), u64::from(spec.n_expert));
        let (e, f) = (i64::from(spec.n_embd), spec.n_ff_exp as usize);
        let row = crate::ffi::quant::row_size(ty, e as usize);
        let gate = ix.get("blk.1.ffn_gate_exps.weight").unwrap().clone();
        let up = ix.get("blk.1.ffn_up_exps.weight").unwrap().clone();
        // Stored as such: one piece.
        let one = ix.expert_parts("blk.1.ffn_up_exps.weight", ty, e, x, f * row);
        assert_eq!(one.unwrap()[0].offset, up.offset);
        // Not stored, fused: gate rows then up rows of each expert.
        let parts = ix
            .expert_parts("blk.1.ffn_gate_up_exps.weight", ty, e, x, 2 * f * row)
            .unwrap();
        assert_eq!(
            parts
                .iter()
                .map(|p| (p.offset, p.bytes))
                .collect::<Vec<_>>(),
            [(gate.offset, f * row), (up.offset, f * row)]
        );
        // A shape or type the parts do not have is not theirs.
        assert!(ix
            .expert_parts("blk.1.ffn_gate_up_exps.weight", ty, e, x, f * row)
            .is_none());
        let f32 = ggml_sys::GGML_TYPE_F32;
        assert!(ix
            .expert_parts("blk.1.ffn_gate_up_exps.weight", f32, e, x, 2 * f * row)
            .is_none());
        assert!(ix
            .expert_parts("blk.1.ffn_down_up_exps.weight", ty, e, x, 2 * f * row)
            .is_none());
        let fused = ix.fused_infos();
        assert_eq!(fused.len(), spec.n_layer as usize);
        assert_eq!(fused[1].name, "blk.1.ffn_gate_up_exps.weight");
        assert_eq!(
            (fused[1].ty, fused[1].ne),
            (ty, [e, 2 * f as i64, x as i64, 1])
        );
    }
}
