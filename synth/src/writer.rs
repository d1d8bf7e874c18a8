//! Writes a synthetic model: header through the gguf API, then each tensor's bytes at the offset
//! gguf assigned, generated and quantized one tensor (or expert) at a time.
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use super::arch::{Role, TensorPlan};
use super::rng::Rng;
use super::spec::SynthSpec;
use super::vocab;
use crate::error::{Result, SynthError};
use bmoe_engine::gguf::write as quant;
use bmoe_engine::gguf::write::GgufBuilder;
use ggml_sys as sys;

/// What `write_model` wrote.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SynthReport {
    /// The files written (the first is what to load).
    pub files: Vec<PathBuf>,
    /// Bytes on disk, all shards.
    pub bytes: u64,
    /// Tensors written.
    pub n_tensors: usize,
    /// Bytes of one expert (gate + up + down) in one layer.
    pub expert_bytes: u64,
    /// Bytes of routed experts one decode token reads when nothing is cached.
    pub routed_bytes_per_token: u64,
}

fn io_err(path: &Path, e: std::io::Error) -> SynthError {
    SynthError::Io {
        path: path.to_path_buf(),
        source: e,
    }
}

/// The shard file names for `path` (`x.gguf` -> `x-00001-of-00002.gguf`, ...).
pub fn shard_paths(path: &Path, n: u32) -> Vec<PathBuf> {
    if n == 1 {
        return vec![path.to_path_buf()];
    }
    let stem = path
        .file_name()
        .and_then(|s| s.to_str())
        .map(|s| s.strip_suffix(".gguf").unwrap_or(s).to_string())
        .unwrap_or_else(|| "model".into());
    (1..=n)
        .map(|i| path.with_file_name(format!("{stem}-{i:05}-of-{n:05}.gguf")))
        .collect()
}

fn tensor_type(spec: &SynthSpec, role: Role) -> sys::ggml_type {
    match role {
        Role::Norm | Role::Router | Role::Bias | Role::Scale | Role::Small | Role::Decay => {
            sys::GGML_TYPE_F32
        }
        Role::Embedding | Role::Dense => spec.dense_type.ggml(),
        Role::Expert => spec.expert_type.ggml(),
    }
}

/// The f32 values of one 2-D slice (a whole 2-D tensor, or slice `index` along `ne2` of a 3-D
/// one: an expert of an expert tensor).
fn slice_values(spec: &SynthSpec, t: &TensorPlan, index: u64, perm: &[usize]) -> Vec<f32> {
    let ne0 = t.ne[0] as usize;
    let rows: usize = t.ne[1..]
        .iter()
        .take(1)
        .map(|&n| n as usize)
        .product::<usize>()
        .max(1);
    let mut rng = Rng::for_stream(spec.seed, &t.name, index);
    match t.role {
        Role::Norm => vec![1.0; ne0 * rows],
        // Large enough to move every result they enter, small enough to keep activations sane.
        Role::Bias => rng.fill(ne0 * rows, 0.1),
        Role::Scale => rng
            .fill(ne0 * rows, 0.25)
            .into_iter()
            .map(|v| 1.0 + v)
            .collect(),
        Role::Embedding => {
            // A shared offset gives hidden states a consistent direction the router skew acts on.
            let dc = if spec.router_skew > 0.0 { 0.5 } else { 0.0 };
            rng.fill(ne0 * rows, 3f32.sqrt())
                .into_iter()
                .map(|v| v + dc)
                .collect()
        }
        Role::Dense | Role::Expert => rng.fill(ne0 * rows, (3.0 / ne0 as f32).sqrt()),
        // Small beside what they act on: a selection bias of this size reorders close experts
        // without picking the same few for every token.
        Role::Small => rng.fill(ne0 * rows, 0.1),
        // In [-1, -0.25): every step keeps between about a third and most of the state.
        Role::Decay => rng
            .fill(ne0 * rows, 1.0)
            .into_iter()
            .map(|u| -0.25 - 0.75 * u.abs())
            .collect(),
        Role::Router => {
            let mut v = rng.fill(ne0 * rows, (3.0 / ne0 as f32).sqrt());
            if spec.router_skew > 0.0 {
                // Column e is expert e; its preference rank in this layer is perm[e]. The offset
                // shifts its logit by about -skew * ln(1 + rank).
                for (e, col) in v.chunks_mut(ne0).enumerate() {
                    let c = -spec.router_skew * (1.0 + perm[e] as f32).ln() / (0.45 * ne0 as f32);
                    col.iter_mut().for_each(|w| *w += c);
                }
            }
            v
        }
    }
}

/// A per-layer permutation of expert preference, so the popular experts differ by layer.
fn layer_perm(spec: &SynthSpec, layer: u32) -> Vec<usize> {
    let n = spec.n_expert as usize;
    let mut p: Vec<usize> = (0..n).collect();
    let mut rng = Rng::for_stream(spec.seed, "router-perm", u64::from(layer));
    for i in (1..n).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        p.swap(i, j);
    }
    p
}

fn tensor_bytes(spec: &SynthSpec, t: &TensorPlan) -> Vec<u8> {
    let ty = tensor_type(spec, t.role);
    let ne0 = t.ne[0] as usize;
    let perm = t.layer.map(|l| layer_perm(spec, l)).unwrap_or_default();
    // 3-D tensors (experts, MLA's per-head matrices) are made and quantized a slice at a time.
    if t.ne.len() > 2 {
        let n = t.ne[2] as u64;
        let parts: Vec<Vec<u8>> = (0..n)
            .into_par_iter()
            .map(|e| quant::quantize(ty, &slice_values(spec, t, e, &perm), ne0))
            .collect();
        parts.concat()
    } else {
        quant::quantize(ty, &slice_values(spec, t, 0, &perm), ne0)
    }
}

/// The tensor types pack whole rows: each row's width a multiple of its type's block.
fn check_blocks(spec: &SynthSpec, plans: &[TensorPlan]) -> Result<()> {
    for t in plans {
        let ty = tensor_type(spec, t.role);
        let b = quant::block_size(ty) as i64;
        if t.ne[0] % b != 0 {
            return Err(SynthError::Invalid(format!(
                "tensor {}: type {} packs rows in blocks of {b}, but a row is {} wide",
                t.name,
                quant::type_name(ty),
                t.ne[0]
            )));
        }
    }
    Ok(())
}

/// One file of a (possibly split) model.
struct Shard<'a> {
    /// Its number, from 0 (the first holds the metadata).
    index: usize,
    path: &'a Path,
    /// The tensors it holds.
    tensors: &'a [&'a TensorPlan],
    /// Tensors of the whole model.
    n_tensors: usize,
}

/// Writes one shard under a temporary name, then renames it; its bytes, padded.
fn write_shard(spec: &SynthSpec, shard: &Shard<'_>) -> Result<u64> {
    let mut g = GgufBuilder::new(shard.tensors.len());
    if shard.index == 0 {
        spec.arch.write_metadata(spec, &mut g);
        vocab::write(&mut g);
    }
    if spec.split > 1 {
        g.set_u16("split.no", shard.index as u16);
        g.set_u16("split.count", spec.split as u16);
        g.set_i32("split.tensors.count", shard.n_tensors as i32);
    }
    for t in shard.tensors {
        g.add_tensor(&t.name, tensor_type(spec, t.role), &t.ne);
    }
    let meta = g.meta_bytes();
    let table = g.tensors();
    let p = shard.path;
    let tmp = p.with_extension("gguf.partial");
    if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
    }
    let f = File::create(&tmp).map_err(|e| io_err(&tmp, e))?;
    f.write_all_at(&meta, 0).map_err(|e| io_err(&tmp, e))?;
    let base = meta.len() as u64;
    let mut end = base;
    for (t, (name, off, size)) in shard.tensors.iter().zip(&table) {
        debug_assert_eq!(&t.name, name);
        let data = tensor_bytes(spec, t);
        if data.len() as u64 != *size {
            return Err(SynthError::Invalid(format!(
                "tensor {name}: produced {} bytes, the header expects {size}",
                data.len()
            )));
        }
        f.write_all_at(&data, base + off)
            .map_err(|e| io_err(&tmp, e))?;
        end = end.max(base + off + size);
    }
    let padded = end.div_ceil(ggml_sys::GGUF_DEFAULT_ALIGNMENT as u64)
        * ggml_sys::GGUF_DEFAULT_ALIGNMENT as u64;
    f.set_len(padded).map_err(|e| io_err(&tmp, e))?;
    f.sync_all().map_err(|e| io_err(&tmp, e))?;
    std::fs::rename(&tmp, p).map_err(|e| io_err(p, e))?;
    Ok(padded)
}

/// One expert of one MoE layer in bytes (its slice of every expert tensor of that layer, whatever
/// the architecture's matrices and widths are), and the MoE layers.
fn expert_sizes(spec: &SynthSpec, plans: &[TensorPlan]) -> (u64, u64) {
    let ety = spec.expert_type.ggml();
    let first_moe = plans
        .iter()
        .find(|t| t.role == Role::Expert)
        .and_then(|t| t.layer);
    let expert_bytes: u64 = plans
        .iter()
        .filter(|t| t.role == Role::Expert && t.layer == first_moe)
        .map(|t| (quant::row_size(ety, t.ne[0] as usize) * t.ne[1] as usize) as u64)
        .sum();
    let n_moe_layers = plans
        .iter()
        .filter(|t| t.role == Role::Expert)
        .filter_map(|t| t.layer)
        .collect::<std::collections::BTreeSet<_>>()
        .len() as u64;
    (expert_bytes, n_moe_layers)
}

/// Writes the model `spec` describes to `path` (or its shards); the files appear complete or not
/// at all (written under a temporary name, then renamed).
pub fn write_model(spec: &SynthSpec, path: &Path) -> Result<SynthReport> {
    spec.validate()?;
    bmoe_engine::gguf::write::backend_init();
    let mut plans = spec.arch.tensors(spec, vocab::N_VOCAB);
    if spec.tied_output {
        plans.retain(|t| t.name != "output.weight");
    }
    check_blocks(spec, &plans)?;
    let paths = shard_paths(path, spec.split);
    let per_shard = spec.n_layer.div_ceil(spec.split);
    let shard_of = |t: &TensorPlan| t.layer.map(|l| l / per_shard).unwrap_or(0) as usize;
    let mut bytes = 0;
    for (si, p) in paths.iter().enumerate() {
        let mine: Vec<&TensorPlan> = plans.iter().filter(|t| shard_of(t) == si).collect();
        let shard = Shard {
            index: si,
            path: p,
            tensors: &mine,
            n_tensors: plans.len(),
        };
        bytes += write_shard(spec, &shard)?;
    }
    let (expert_bytes, n_moe_layers) = expert_sizes(spec, &plans);
    Ok(SynthReport {
        files: paths,
        bytes,
        n_tensors: plans.len(),
        expert_bytes,
        routed_bytes_per_token: expert_bytes * u64::from(spec.n_expert_used) * n_moe_layers,
    })
}
