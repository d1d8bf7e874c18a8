//! What llama.cpp's loader would assert on (abort the process), checked in Rust before a file
//! reaches it: the vocabulary (array lengths, unique token strings, byte-fallback tokens), the
//! hyper-parameters llama.cpp asserts on, and tensor shapes against the hyper-parameters. Each
//! failure names the file, the key or tensor, and what was expected.
//!
//! The checks mirror the pinned llama.cpp (`llama-vocab.cpp` `impl::load`, `llama-model.cpp`
//! `load_hparams`, the graph builders' head-size asserts); where llama.cpp only throws (a clean
//! error already), a check is made when it makes the message clearer and costs nothing.
use std::collections::HashMap;
use std::path::Path;

use ggml_sys as sys;

use crate::error::{EngineError, Result};
use crate::ffi::gguf::{GgufFile, KvType, TensorInfo};
use crate::gguf::{MAX_EXPERTS, MAX_LAYERS};

/// The rope scaling types llama.cpp knows (`LLAMA_ROPE_SCALING_TYPES`); another value asserts.
const ROPE_SCALING_TYPES: &[&str] = &["none", "linear", "yarn", "longrope"];
/// Architectures whose graphs need `attention.key_length == attention.value_length` (not the rope's
/// dimensions): see `check_head_sizes`.
const KEY_EQUALS_VALUE: &[&str] = &["gpt-oss"];
/// Architectures whose graph builder asserts `n_embd_head_v == n_embd_head_k == n_rot`
/// (`GGML_ASSERT(n_embd_head == n_rot)` in `models/<arch>.cpp`), by GGUF architecture name.
const HEAD_SIZE_ASSERTING: &[&str] = &[
    "llama",
    "llama4",
    "qwen2",
    "qwen2moe",
    "qwen2vl",
    "qwen3",
    "qwen3moe",
    "qwen3vl",
    "qwen3vlmoe",
    "olmo",
    "olmo2",
    "olmoe",
    "granite",
    "granitemoe",
    "dbrx",
    "grok",
    "deepseek",
    "internlm2",
    "exaone",
    "exaone4",
    "starcoder2",
    "mistral3",
    "baichuan",
    "falcon",
    "orion",
    "xverse",
    "arctic",
    "deci",
    "smollm3",
    "seed_oss",
    "ernie4_5",
    "ernie4_5-moe",
    "dots1",
    "hunyuan-moe",
    "minimax-m2",
];

fn invalid(path: &Path, what: String) -> EngineError {
    EngineError::Invalid {
        path: path.to_path_buf(),
        what,
    }
}

/// Opens `path` (every shard of a split model) and checks it as [`check`] does.
pub fn check_file(path: &Path) -> Result<()> {
    let index = crate::gguf::index::GgufIndex::open(path)?;
    check(path, index.header())
}

/// Checks the header of `path` (already opened as `g`) before llama.cpp loads it.
pub fn check(path: &Path, g: &GgufFile) -> Result<()> {
    let arch = match g.kv_type("general.architecture") {
        Some(KvType::Scalar(t)) if t == sys::GGUF_TYPE_STRING => {
            g.get_str("general.architecture").unwrap_or_default()
        }
        Some(_) => return Err(invalid(path, "general.architecture is not a string".into())),
        None => {
            return Err(invalid(
                path,
                "general.architecture is missing: expected the model's architecture name".into(),
            ))
        }
    };
    let n_vocab = check_vocab(path, g)?;
    let hp = check_hparams(path, g, &arch)?;
    check_tensors(path, g, &hp, n_vocab)?;
    Ok(())
}

/// The hyper-parameters the tensor checks use.
#[derive(Debug, Default)]
struct Hparams {
    n_layer: i64,
    n_embd: Option<i64>,
    n_expert: i64,
}

/// An integer key that may be a scalar or a per-layer array; `None` when absent.
fn scalar_or_array(path: &Path, g: &GgufFile, key: &str, n_layer: i64) -> Result<Option<Vec<i64>>> {
    match g.kv_type(key) {
        None => Ok(None),
        Some(KvType::Scalar(_)) => match g.get_i64(key) {
            Some(v) => Ok(Some(vec![v])),
            None => Err(invalid(path, format!("{key} is not an integer"))),
        },
        Some(KvType::Array(_, n)) => {
            if i64::try_from(n).ok() != Some(n_layer) {
                return Err(invalid(
                    path,
                    format!("{key} is an array of {n} values: expected one per layer ({n_layer})"),
                ));
            }
            g.get_int_array(key)
                .map(Some)
                .ok_or_else(|| invalid(path, format!("{key} is an array but not of integers")))
        }
    }
}

fn int_key(path: &Path, g: &GgufFile, key: &str) -> Result<Option<i64>> {
    match g.kv_type(key) {
        None => Ok(None),
        Some(KvType::Scalar(_)) => g
            .get_i64(key)
            .map(Some)
            .ok_or_else(|| invalid(path, format!("{key} is not an integer"))),
        Some(KvType::Array(..)) => Err(invalid(
            path,
            format!("{key} is an array: expected one integer"),
        )),
    }
}

/// The hyper-parameters llama.cpp asserts on (aborting the process), each checked with the key
/// and the range it expects.
fn check_hparams(path: &Path, g: &GgufFile, arch: &str) -> Result<Hparams> {
    let n_layer = check_layers(path, g, arch)?;
    let n_embd = check_embd(path, g, arch)?;
    let n_expert = check_experts(path, g, arch, n_layer)?;
    let heads = check_heads(path, g, arch, n_layer)?;
    check_head_sizes(path, g, arch, &heads, n_embd)?;
    let n_head = heads.iter().copied().find(|&h| h > 0).unwrap_or(0);
    super::graph_check::check(path, g, arch, n_head, n_embd)?;
    check_floats(path, g, arch)?;
    check_rope_scaling(path, g, arch)?;
    Ok(Hparams {
        n_layer,
        n_embd,
        n_expert,
    })
}

/// `block_count` (and `nextn_predict_layers` within it).
fn check_layers(path: &Path, g: &GgufFile, arch: &str) -> Result<i64> {
    let k = |s: &str| format!("{arch}.{s}");
    let n_layer = int_key(path, g, &k("block_count"))?.ok_or_else(|| {
        invalid(
            path,
            format!(
                "{} is missing: expected the number of layers",
                k("block_count")
            ),
        )
    })?;
    if !(1..=MAX_LAYERS).contains(&n_layer) {
        return Err(invalid(
            path,
            format!(
                "{} = {n_layer}: expected 1..={MAX_LAYERS}",
                k("block_count")
            ),
        ));
    }
    if let Some(v) = int_key(path, g, &k("nextn_predict_layers"))? {
        if !(0..=n_layer).contains(&v) {
            return Err(invalid(
                path,
                format!(
                    "{} = {v}: expected 0..={n_layer} (block_count)",
                    k("nextn_predict_layers")
                ),
            ));
        }
    }
    Ok(n_layer)
}

/// `embedding_length`, when present.
fn check_embd(path: &Path, g: &GgufFile, arch: &str) -> Result<Option<i64>> {
    let k = |s: &str| format!("{arch}.{s}");
    let n_embd = int_key(path, g, &k("embedding_length"))?;
    if let Some(e) = n_embd {
        if e <= 0 || e > i64::from(i32::MAX) {
            return Err(invalid(
                path,
                format!("{} = {e}: expected a positive width", k("embedding_length")),
            ));
        }
    }
    Ok(n_embd)
}

/// The expert counts: experts, experts used per token (per layer), expert groups.
fn check_experts(path: &Path, g: &GgufFile, arch: &str, n_layer: i64) -> Result<i64> {
    let k = |s: &str| format!("{arch}.{s}");
    // Experts: llama.cpp asserts each of these in load_hparams.
    let n_expert = int_key(path, g, &k("expert_count"))?.unwrap_or(0);
    if !(0..=MAX_EXPERTS).contains(&n_expert) {
        return Err(invalid(
            path,
            format!(
                "{} = {n_expert}: expected 0..={MAX_EXPERTS}",
                k("expert_count")
            ),
        ));
    }
    let used = scalar_or_array(path, g, &k("expert_used_count"), n_layer)?.unwrap_or_default();
    let used_max = used.iter().copied().max().unwrap_or(0);
    if let Some(bad) = used.iter().find(|&&u| u < 0) {
        return Err(invalid(
            path,
            format!(
                "{} = {bad}: expected 1..={n_expert} (expert_count)",
                k("expert_used_count")
            ),
        ));
    }
    let groups = int_key(path, g, &k("expert_group_count"))?.unwrap_or(0);
    let group_used = int_key(path, g, &k("expert_group_used_count"))?.unwrap_or(0);
    if n_expert > 0 {
        if used_max < 1 || used_max > n_expert {
            return Err(invalid(
                path,
                format!(
                    "{} = {used_max}: expected 1..={n_expert} (expert_count)",
                    k("expert_used_count")
                ),
            ));
        }
        if groups < 0 || groups >= n_expert {
            return Err(invalid(
                path,
                format!(
                    "{} = {groups}: expected 0..{n_expert} (below expert_count)",
                    k("expert_group_count")
                ),
            ));
        }
        if groups > 1 && (n_expert % groups != 0 || group_used <= 0 || group_used >= groups) {
            return Err(invalid(
                path,
                format!(
                    "{} = {groups} with {} = {group_used}: expected groups dividing expert_count ({n_expert}) and 1..{groups} groups used",
                    k("expert_group_count"),
                    k("expert_group_used_count")
                ),
            ));
        }
    } else if used_max != 0 || groups != 0 {
        return Err(invalid(
            path,
            format!(
                "{} = {used_max} and {} = {groups} but the model has no experts ({} absent or 0): expected 0",
                k("expert_used_count"),
                k("expert_group_count"),
                k("expert_count")
            ),
        ));
    }
    Ok(n_expert)
}

/// The attention heads per layer, and KV heads that divide them; returns the heads.
fn check_heads(path: &Path, g: &GgufFile, arch: &str, n_layer: i64) -> Result<Vec<i64>> {
    let k = |s: &str| format!("{arch}.{s}");
    // Attention heads: n_embd / n_head is taken when there are heads; the KV heads must divide
    // the heads (the attention's broadcast matmul asserts it when the graph is built).
    let heads = scalar_or_array(path, g, &k("attention.head_count"), n_layer)?.unwrap_or_default();
    let heads_kv = scalar_or_array(path, g, &k("attention.head_count_kv"), n_layer)?;
    let kv_per_layer = matches!(
        g.kv_type(&k("attention.head_count_kv")),
        Some(KvType::Array(..))
    );
    for (il, &h) in heads.iter().enumerate() {
        if h < 0 || h > i64::from(u16::MAX) {
            return Err(invalid(
                path,
                format!("{} = {h}: expected 0..=65535", k("attention.head_count")),
            ));
        }
        if let Some(kv) = &heads_kv {
            let per_layer = kv_per_layer;
            let hk = if per_layer {
                kv.get(il).copied().unwrap_or(0)
            } else {
                kv[0]
            };
            // A per-layer 0 is a layer without attention (a hybrid model's recurrent or
            // feed-forward block: llama.cpp's nemotron-h.cpp:14 tells them apart by it); such a
            // layer builds no attention, so nothing divides by it.
            if per_layer && hk == 0 {
                continue;
            }
            if h > 0 && (hk <= 0 || h % hk != 0) {
                return Err(invalid(
                    path,
                    format!(
                        "{} = {hk} with {} heads: expected a divisor of the head count",
                        k("attention.head_count_kv"),
                        h
                    ),
                ));
            }
        }
    }
    Ok(heads)
}

/// Key, value and rope sizes, equal where the architecture's graph asserts it.
fn check_head_sizes(
    path: &Path,
    g: &GgufFile,
    arch: &str,
    heads: &[i64],
    n_embd: Option<i64>,
) -> Result<()> {
    let k = |s: &str| format!("{arch}.{s}");
    let n_head = heads.first().copied().unwrap_or(0);
    if n_head > 0 && HEAD_SIZE_ASSERTING.contains(&arch) {
        let default = n_embd.map(|e| e / n_head).unwrap_or(0);
        let kl = int_key(path, g, &k("attention.key_length"))?.unwrap_or(default);
        let vl = int_key(path, g, &k("attention.value_length"))?.unwrap_or(default);
        let rot = int_key(path, g, &k("rope.dimension_count"))?.unwrap_or(kl);
        if kl != vl || vl != rot {
            return Err(invalid(
                path,
                format!(
                    "{arch}: attention.key_length = {kl}, attention.value_length = {vl}, rope.dimension_count = {rot}: this architecture needs all three equal"
                ),
            ));
        }
    }
    // gpt-oss's graph sizes the KV cache's V rows from `value_length` but the V projection from
    // the key's head size: unequal, the first decode aborts storing V (ggml_set_rows,
    // `a->ne[0] == b->ne[0]`; issue 37's fuzz), resident and streamed alike.
    if n_head > 0 && KEY_EQUALS_VALUE.contains(&arch) {
        let kl = int_key(path, g, &k("attention.key_length"))?;
        let vl = int_key(path, g, &k("attention.value_length"))?;
        if let (Some(kl), Some(vl)) = (kl, vl) {
            if kl != vl {
                return Err(invalid(
                    path,
                    format!(
                        "{arch}: attention.key_length = {kl}, attention.value_length = {vl}: this architecture needs them equal"
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Float hyper-parameters: a NaN or an infinity is never meant, and the norms assert `eps >= 0`
/// when the first graph computes.
fn check_floats(path: &Path, g: &GgufFile, arch: &str) -> Result<()> {
    let prefix = format!("{arch}.");
    for key in g.keys().iter().filter(|key| key.starts_with(&prefix)) {
        let Some(v) = g.get_f64(key) else { continue };
        if !v.is_finite() {
            return Err(invalid(
                path,
                format!("{key} = {v}: expected a finite number"),
            ));
        }
        if key.contains("epsilon") && v < 0.0 {
            return Err(invalid(
                path,
                format!("{key} = {v}: expected a non-negative epsilon"),
            ));
        }
    }
    Ok(())
}

/// `rope.scaling.type`, one of the names llama.cpp knows.
fn check_rope_scaling(path: &Path, g: &GgufFile, arch: &str) -> Result<()> {
    let k = |s: &str| format!("{arch}.{s}");
    if let Some(t) = g.kv_type(&k("rope.scaling.type")) {
        let v = match t {
            KvType::Scalar(t) if t == sys::GGUF_TYPE_STRING => g.get_str(&k("rope.scaling.type")),
            _ => None,
        };
        match v {
            Some(v) if ROPE_SCALING_TYPES.contains(&v.as_str()) => {}
            other => {
                return Err(invalid(
                    path,
                    format!(
                        "{} = {:?}: expected one of {}",
                        k("rope.scaling.type"),
                        other.unwrap_or_else(|| "(not a string)".into()),
                        ROPE_SCALING_TYPES.join(", ")
                    ),
                ))
            }
        }
    }
    Ok(())
}

/// Checks the tokenizer arrays; returns the vocabulary size (`None` without a token list).
fn check_vocab(path: &Path, g: &GgufFile) -> Result<Option<usize>> {
    let model = match g.kv_type("tokenizer.ggml.model") {
        None => return Ok(None),
        Some(KvType::Scalar(t)) if t == sys::GGUF_TYPE_STRING => {
            g.get_str("tokenizer.ggml.model").unwrap_or_default()
        }
        Some(_) => return Err(invalid(path, "tokenizer.ggml.model is not a string".into())),
    };
    if model == "no_vocab" || model == "none" {
        return Ok(None);
    }
    let tokens = g.get_str_array("tokenizer.ggml.tokens").ok_or_else(|| {
        invalid(
            path,
            format!("tokenizer.ggml.tokens is missing or not an array of strings: a \"{model}\" tokenizer needs its token list"),
        )
    })?;
    let n = tokens.len();
    if n == 0 || n > i32::MAX as usize {
        return Err(invalid(
            path,
            format!(
                "tokenizer.ggml.tokens has {n} tokens: expected 1..={}",
                i32::MAX
            ),
        ));
    }
    check_token_arrays(path, g, n)?;
    let seen = unique_tokens(path, &tokens)?;
    if model == "llama" {
        check_byte_tokens(path, &seen)?;
    }
    Ok(Some(n))
}

/// The per-token arrays beside the token list (scores, token types): the right type, and one
/// entry per token of the `n`.
fn check_token_arrays(path: &Path, g: &GgufFile, n: usize) -> Result<()> {
    for (key, ok_types) in [
        (
            "tokenizer.ggml.scores",
            &[sys::GGUF_TYPE_FLOAT32, sys::GGUF_TYPE_INT32][..],
        ),
        ("tokenizer.ggml.token_type", &[sys::GGUF_TYPE_INT32][..]),
    ] {
        match g.kv_type(key) {
            None => {}
            Some(KvType::Array(t, len)) if ok_types.contains(&t) && len < n => {
                return Err(invalid(
                    path,
                    format!("{key} has {len} entries: expected one per token ({n}, the length of tokenizer.ggml.tokens)"),
                ));
            }
            Some(KvType::Array(t, _)) if ok_types.contains(&t) => {}
            Some(_) => {
                return Err(invalid(
                    path,
                    format!(
                        "{key} is not an array of {}",
                        if ok_types.len() == 2 {
                            "numbers"
                        } else {
                            "int32"
                        }
                    ),
                ))
            }
        }
    }
    Ok(())
}

/// Every token string unique, as llama.cpp asserts; each name with its id.
fn unique_tokens(path: &Path, tokens: &[Vec<u8>]) -> Result<HashMap<Vec<u8>, usize>> {
    // llama.cpp maps each string to its id and asserts that no two ids share one (an empty token
    // is renamed "[EMPTY_<id>]" first, so the check is made on the names it uses).
    let mut seen: HashMap<Vec<u8>, usize> = HashMap::with_capacity(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        let name = if t.is_empty() {
            format!("[EMPTY_{i}]").into_bytes()
        } else {
            t.clone()
        };
        if let Some(first) = seen.insert(name, i) {
            return Err(invalid(
                path,
                format!(
                    "tokenizer.ggml.tokens: tokens {first} and {i} are both {:?}: expected every token string to be unique",
                    String::from_utf8_lossy(t)
                ),
            ));
        }
    }
    Ok(seen)
}

/// The SentencePiece ("llama") tokenizer's byte tokens, every byte's by name or as itself: it
/// spells a piece it has no token for as bytes, looking up "<0xXX>" (or the byte itself) for
/// each, and a missing one throws in the middle of tokenizing.
fn check_byte_tokens(path: &Path, seen: &HashMap<Vec<u8>, usize>) -> Result<()> {
    let missing: Vec<String> = (0..=255u8)
        .filter(|&b| {
            !seen.contains_key(format!("<0x{b:02X}>").as_bytes()) && !seen.contains_key(&vec![b])
        })
        .map(|b| format!("<0x{b:02X}>"))
        .collect();
    if let Some(first) = missing.first() {
        return Err(invalid(
            path,
            format!(
                "tokenizer.ggml.tokens: the SentencePiece (\"llama\") tokenizer falls back to byte tokens, but {first} is missing ({} of 256 byte tokens missing)",
                missing.len()
            ),
        ));
    }
    Ok(())
}

/// A tensor's type is one ggml's CPU kernels take in its place: a weight in a float or quantized
/// type, a vector (norm, bias, scale) in f32.
fn check_tensor_type(path: &Path, t: &TensorInfo) -> Result<()> {
    // ggml's CPU kernels take no weight in an integer or f64 type: an i32 norm weight, say,
    // stops the first decode on "binary_op: unsupported types" (an abort).
    if matches!(
        t.ty,
        sys::GGML_TYPE_I8
            | sys::GGML_TYPE_I16
            | sys::GGML_TYPE_I32
            | sys::GGML_TYPE_I64
            | sys::GGML_TYPE_F64
            // Intermediate types of the dot products, never a stored weight: a Q8_K matrix
            // faults in the CPU matmul (SIGSEGV, issue 37).
            | sys::GGML_TYPE_Q8_1
            | sys::GGML_TYPE_Q8_K
    ) {
        return Err(invalid(
            path,
            format!(
                "tensor {} has type {}: expected a float or quantized weight type",
                t.name,
                crate::ffi::quant::type_name(t.ty)
            ),
        ));
    }
    // Vectors (at most one dimension above 1: norms, biases, scales) feed ggml's add and mul, whose CPU
    // kernels take them in F32 only ("binary_op: unsupported types ... src1: f16", an abort at
    // the first decode); converters and quantizers always keep them F32. So do biases of any
    // shape: an expert's bias ([n_embd, n_expert], gpt-oss) feeds `add_id`, which asserts F32
    // (ops.cpp: GGML_ASSERT(src1->type == GGML_TYPE_F32), issue 37's fuzz).
    let vector = t.ne.iter().filter(|&&n| n > 1).count() <= 1 || t.name.ends_with(".bias");
    if vector && t.ty != sys::GGML_TYPE_F32 {
        return Err(invalid(
            path,
            format!(
                "tensor {} is a vector with type {}: expected f32 (a norm, bias or scale)",
                t.name,
                crate::ffi::quant::type_name(t.ty)
            ),
        ));
    }
    Ok(())
}

fn check_tensors(path: &Path, g: &GgufFile, hp: &Hparams, n_vocab: Option<usize>) -> Result<()> {
    let shape = |t: &TensorInfo| format!("{:?}", t.ne);
    for t in g.tensor_infos() {
        let layer = t
            .name
            .strip_prefix("blk.")
            .and_then(|r| r.split('.').next())
            .and_then(|n| n.parse::<i64>().ok());
        if let Some(il) = layer {
            if il >= hp.n_layer {
                return Err(invalid(
                    path,
                    format!(
                        "tensor {} belongs to layer {il}: the model has {} layers (block_count)",
                        t.name, hp.n_layer
                    ),
                ));
            }
        }
        check_tensor_type(path, &t)?;
        let base = t.name.strip_suffix(".weight").unwrap_or(&t.name);
        let suffix = base.rsplit('.').next().unwrap_or(base);
        // Embedding rows and vocabulary: llama.cpp creates these tensors at [n_embd, n_vocab].
        if matches!(base, "token_embd" | "output") {
            if let Some(e) = hp.n_embd {
                if t.ne[0] != e {
                    return Err(invalid(
                        path,
                        format!(
                            "tensor {} has shape {}: expected rows of embedding_length = {e}",
                            t.name,
                            shape(&t)
                        ),
                    ));
                }
            }
            if let Some(v) = n_vocab {
                if t.ne[1] != v as i64 {
                    return Err(invalid(
                        path,
                        format!("tensor {} has shape {}: expected {v} rows, one per token of tokenizer.ggml.tokens", t.name, shape(&t)),
                    ));
                }
            }
        }
        // Expert tensors: one slice per expert along ne2; the router has one column per expert.
        if hp.n_expert > 0 {
            let experts_dim = match suffix {
                "ffn_gate_exps" | "ffn_up_exps" | "ffn_down_exps" | "ffn_gate_up_exps" => {
                    Some(t.ne[2])
                }
                "ffn_gate_inp" => Some(t.ne[1]),
                _ => None,
            };
            if let Some(x) = experts_dim {
                if x != hp.n_expert {
                    return Err(invalid(
                        path,
                        format!(
                            "tensor {} has shape {}: expected {} experts (expert_count)",
                            t.name,
                            shape(&t),
                            hp.n_expert
                        ),
                    ));
                }
            }
        }
    }
    Ok(())
}
