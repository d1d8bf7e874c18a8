//! Header values that only the first graph asserts on, checked per architecture before any graph
//! is built: the rope dimensions against the head size they rotate (`GGML_ASSERT(n_dims <= ne0)`
//! and `GGML_ASSERT(n_dims % 2 == 0)` in the CPU rope op, ggml-cpu/ops.cpp:6354, at the first
//! decode). llama.cpp's loader reads these keys without comparing them with anything.
use std::path::Path;

use crate::error::{EngineError, Result};
use crate::ffi::gguf::{GgufFile, KvType};

/// Architectures whose rope turns a slice of its own (`n_rot` wide, split off the head: MLA), so
/// the rope dimensions are bounded by the part of the key that is not the latent one.
const MLA: &[&str] = &[
    "deepseek2",
    "deepseek2ocr",
    "deepseek32",
    "glm_moe_dsa",
    "kimi_linear",
];

fn invalid(path: &Path, what: String) -> EngineError {
    EngineError::Invalid {
        path: path.to_path_buf(),
        what,
    }
}

fn uint(g: &GgufFile, key: &str) -> Option<i64> {
    match g.kv_type(key) {
        Some(KvType::Scalar(_)) => g.get_i64(key),
        _ => None,
    }
}

/// One rope width (`rope_key`) against the head size it turns (`head`, named `head_key`).
fn check_rope(path: &Path, rope_key: &str, rot: i64, head_key: &str, head: i64) -> Result<()> {
    if rot % 2 != 0 || rot < 0 {
        return Err(invalid(
            path,
            format!("{rope_key} = {rot}: expected an even number (rope turns pairs of values)"),
        ));
    }
    if rot > head {
        return Err(invalid(
            path,
            format!(
                "{rope_key} = {rot}: expected at most the head size it turns ({head_key} = {head})"
            ),
        ));
    }
    Ok(())
}

/// The rope dimensions of `arch` (full and sliding-window layers) against their head sizes, with
/// llama.cpp's defaults for absent keys (`load_hparams`: key length = embedding / heads, rope =
/// key length, the SWA values = the full ones). Nothing to check without attention heads.
pub(crate) fn check(
    path: &Path,
    g: &GgufFile,
    arch: &str,
    n_head: i64,
    n_embd: Option<i64>,
) -> Result<()> {
    check_gating(path, g, arch)?;
    check_delta_net(path, g, arch)?;
    check_attention_interval(path, g, arch)?;
    if n_head <= 0 {
        return Ok(());
    }
    let k = |s: &str| format!("{arch}.{s}");
    let kl_key = k("attention.key_length");
    let kl = uint(g, &kl_key).unwrap_or(n_embd.unwrap_or(0) / n_head);
    let rot_key = k("rope.dimension_count");
    let rot = uint(g, &rot_key).unwrap_or(kl);
    check_rot_nonzero(path, &rot_key, rot, arch)?;
    if MLA.contains(&arch) {
        check_rope(path, &rot_key, rot, &kl_key, kl)?;
        return check_mla(path, g, arch, rot);
    }
    check_rope(path, &rot_key, rot, &kl_key, kl)?;
    check_sections(path, g, arch, &kl_key, kl)?;
    let kl_swa_key = k("attention.key_length_swa");
    let kl_swa = uint(g, &kl_swa_key).unwrap_or(kl);
    let rot_swa_key = k("rope.dimension_count_swa");
    match uint(g, &rot_swa_key) {
        Some(rot_swa) => {
            check_rot_nonzero(path, &rot_swa_key, rot_swa, arch)?;
            check_rope(path, &rot_swa_key, rot_swa, &kl_swa_key, kl_swa)
        }
        // Absent: the SWA layers turn the full rope width over their own head size.
        None if g.kv_type(&kl_swa_key).is_some() => {
            check_rope(path, &rot_key, rot, &kl_swa_key, kl_swa)
        }
        None => Ok(()),
    }
}

/// A rope width of 0 turns nothing, which only a graph without rope takes: the first decode spun
/// for minutes on qwen35moe's multi-section rope (issue 37's fuzz, seed 3) and on gemma4's
/// sliding-window layers (`rope.dimension_count_swa`, seed 4).
fn check_rot_nonzero(path: &Path, key: &str, rot: i64, arch: &str) -> Result<()> {
    if rot == 0 && !NO_ROPE.contains(&arch) {
        return Err(invalid(
            path,
            format!("{key} = 0: expected a positive even number ({arch}'s attention turns its keys with rope)"),
        ));
    }
    Ok(())
}

/// Architectures whose attention applies no rope (Nemotron-H's attention layers have no position
/// encoding), where a rope dimension count of 0 is harmless.
const NO_ROPE: &[&str] = &["nemotron_h", "nemotron_h_moe"];

/// Architectures with gated delta-net layers whose tensors are sized by `ssm.state_size` and
/// `ssm.time_step_rank` while the graph splits the convolution's channels by `ssm.inner_size`.
const DELTA_NET: &[&str] = &["qwen35moe", "qwen35", "qwen3next"];

/// Gated delta-net layers (qwen35moe and kin): llama.cpp sizes the value heads of the tensors as
/// `ssm.state_size` x `ssm.time_step_rank` but cuts the convolution's channels with
/// `ssm.inner_size`; unequal, `ggml_concat` asserts at the first graph (ggml.c:
/// `a->ne[d] == b->ne[d]`; issue 37's fuzz, qwen35moe, resident and streamed).
fn check_delta_net(path: &Path, g: &GgufFile, arch: &str) -> Result<()> {
    if !DELTA_NET.contains(&arch) {
        return Ok(());
    }
    let k = |s: &str| format!("{arch}.ssm.{s}");
    let (Some(inner), Some(state), Some(rank)) = (
        uint(g, &k("inner_size")),
        uint(g, &k("state_size")),
        uint(g, &k("time_step_rank")),
    ) else {
        return Ok(());
    };
    if state.checked_mul(rank) != Some(inner) {
        return Err(invalid(
            path,
            format!(
                "{arch}.ssm.inner_size = {inner}: expected ssm.state_size x ssm.time_step_rank = {state} x {rank} (the value heads the tensors are sized by)"
            ),
        ));
    }
    Ok(())
}

/// Architectures whose loader picks the full-attention layers as `(il + 1) % full_attention_interval`
/// (llama.cpp's models/qwen35moe.cpp and kin, an unsigned modulo).
const ATTENTION_INTERVAL: &[&str] = &["qwen35moe", "qwen35", "qwen3next", "qwen4exp", "minimax-01"];

/// `full_attention_interval = 0` divides by zero in the loader: SIGFPE, resident and streamed
/// alike (issue 37's fuzz, seed 4, qwen35moe).
fn check_attention_interval(path: &Path, g: &GgufFile, arch: &str) -> Result<()> {
    let key = format!("{arch}.full_attention_interval");
    match uint(g, &key) {
        Some(0) if ATTENTION_INTERVAL.contains(&arch) => Err(invalid(
            path,
            format!(
                "{key} = 0: expected at least 1 (every how many layers one has full attention)"
            ),
        )),
        _ => Ok(()),
    }
}

/// Multi-section rope (`rope.dimension_sections`, qwen35moe and kin): the CPU rope cycles through
/// the sections' pairs across the head (`(i0/2) % sect_dims`, a division by zero when they sum to
/// 0) and asserts they fit it (`GGML_ASSERT(sect_dims <= ne0)`, ggml-cpu/ops.cpp), at the first
/// graph. llama.cpp reads four (`get_key_or_arr`): an array's, or one scalar for all four (issue
/// 55's structural fuzz: a scalar -1 or 5e8 aborted the first graph).
fn check_sections(path: &Path, g: &GgufFile, arch: &str, head_key: &str, head: i64) -> Result<()> {
    let key = format!("{arch}.rope.dimension_sections");
    let s: Vec<i64> = match (g.get_int_array(&key), uint(g, &key)) {
        (Some(all), _) => all.into_iter().take(4).collect(),
        (None, Some(one)) => vec![one; 4],
        (None, None) => return Ok(()),
    };
    // Saturating: a u64 scalar reads as up to i64::MAX, four of them overflow a plain sum.
    let sum = s.iter().fold(0i64, |a, v| a.saturating_add((*v).max(0)));
    if s.iter().any(|&v| v < 0) || sum < 1 || sum > head {
        return Err(invalid(
            path,
            format!(
                "{key} = {s:?}: expected sections of at least 0 summing to 1 .. the head size they turn ({head_key} = {head})"
            ),
        ));
    }
    Ok(())
}

/// MLA (`attention.key_length_mla` present): the key splits into a rope part and a part without
/// (`GGML_ASSERT(n_embd_head_qk_nope >= 1)`, models/deepseek2.cpp:77), and the latent KV cache
/// holds one head (another `head_count_kv` fails the graph's matmul shapes,
/// `GGML_ASSERT(a->ne[0] == b->ne[0])`, ggml.c:4014, when the first graph is built).
fn check_mla(path: &Path, g: &GgufFile, arch: &str, rot: i64) -> Result<()> {
    let k = |s: &str| format!("{arch}.{s}");
    let mla_key = k("attention.key_length_mla");
    let Some(mla) = uint(g, &mla_key) else {
        return Ok(());
    };
    if rot >= mla {
        return Err(invalid(
            path,
            format!(
                "{} = {rot}: expected below {mla_key} ({mla}), which holds the rope part and the rest",
                k("rope.dimension_count")
            ),
        ));
    }
    // The latent cache's key is the compressed KV plus the rope part, its value the compressed
    // KV (convert_hf_to_gguf writes them so); another width fails the graph's matmul shapes.
    let lora_key = k("attention.kv_lora_rank");
    if let Some(lora) = uint(g, &lora_key) {
        let (kl_key, vl_key) = (k("attention.key_length"), k("attention.value_length"));
        let (kl, vl) = (uint(g, &kl_key), uint(g, &vl_key));
        // Checked: both are header values, up to i64::MAX each.
        let want = lora.checked_add(rot);
        if want.is_none() || kl != want || vl != Some(lora) {
            return Err(invalid(
                path,
                format!(
                    "{kl_key} = {}, {vl_key} = {}: expected {} and {lora} ({lora_key} {lora} plus the rope dimensions {rot}, and {lora_key})",
                    kl.map_or("(missing)".into(), |v| v.to_string()),
                    vl.map_or("(missing)".into(), |v| v.to_string()),
                    want.map_or("(beyond 64 bits)".into(), |v| v.to_string())
                ),
            ));
        }
    }
    let kv_key = k("attention.head_count_kv");
    match uint(g, &kv_key) {
        Some(1) => Ok(()),
        other => Err(invalid(
            path,
            format!(
                "{kv_key} = {}: expected 1 (the latent KV cache of MLA holds one head)",
                other.map_or("(missing)".to_string(), |v| v.to_string())
            ),
        )),
    }
}

/// `expert_gating_func`: the graph's switch over it aborts on a value it does not know
/// (`GGML_ABORT("fatal error")`, llama-graph.cpp:2109): none, softmax, sigmoid, softmax of the
/// weights, sqrt-softplus (`LLAMA_EXPERT_GATING_FUNC_TYPE_*`, llama-hparams.h).
fn check_gating(path: &Path, g: &GgufFile, arch: &str) -> Result<()> {
    let key = format!("{arch}.expert_gating_func");
    match (g.kv_type(&key), uint(g, &key)) {
        (None, _) | (_, Some(0..=4)) => Ok(()),
        (_, v) => Err(invalid(
            path,
            format!(
                "{key} = {}: expected 0..=4 (none, softmax, sigmoid, softmax_weight, sqrt_softplus)",
                v.map_or("(not an integer)".into(), |v| v.to_string())
            ),
        )),
    }
}
