//! Every llama.cpp entry point the engine calls goes through the exception-catching shim
//! (`ggml-sys/shim/bmoe_shim.cpp`) unless it is on the list below of calls that cannot throw, each
//! with the reason read in the pinned source. The entry points are found the way a reviewer
//! would: every `sys::llama_*` / `sys::ggml_*` / `sys::gguf_*` name in the engine's source.
use std::collections::BTreeSet;
use std::path::Path;

/// llama.cpp calls made directly (not through the shim), and why none can throw into Rust.
const DIRECT: &[(&str, &str)] = &[
    ("llama_attach_threadpool", "stores two pointers"),
    (
        "llama_backend_init",
        "ggml_time_init and a static ggml context, C",
    ),
    ("llama_batch_free", "free()"),
    ("llama_batch_init", "malloc(), C"),
    ("llama_context_default_params", "returns a struct"),
    (
        "llama_get_logits_ith",
        "catches std::exception itself, returns NULL",
    ),
    ("llama_get_memory", "getter"),
    ("llama_log_set", "stores a callback"),
    (
        "llama_memory_seq_pos_min",
        "reads cells; no throw, no allocation",
    ),
    ("llama_model_default_params", "returns a struct"),
    ("llama_model_desc", "snprintf into the caller's buffer"),
    ("llama_model_get_vocab", "getter"),
    ("llama_model_is_hybrid", "switch on the architecture"),
    ("llama_model_is_recurrent", "switch on the architecture"),
    ("llama_model_meta_val_str", "map find + snprintf"),
    ("llama_model_n_ctx_train", "getter"),
    ("llama_model_n_embd", "getter"),
    ("llama_model_n_layer", "getter"),
    ("llama_model_n_swa", "getter"),
    ("llama_model_size", "sums tensor sizes"),
    ("llama_n_batch", "getter"),
    ("llama_n_ctx", "getter"),
    ("llama_n_seq_max", "getter"),
    ("llama_n_ubatch", "getter"),
    (
        "llama_print_system_info",
        "a static std::string (bad_alloc only), called once for --version",
    ),
    ("llama_sampler_free", "a destructor (noexcept)"),
    ("llama_vocab_bos", "getter (a stored token id)"),
    ("llama_vocab_eos", "getter (a stored token id)"),
    ("llama_vocab_is_eog", "set lookup"),
    ("llama_vocab_n_tokens", "getter"),
];

/// Calls that must never be made directly: each can throw (a `throw`, `.at()` or allocation on
/// the path without a catch-all), so the shim wraps it.
const WRAPPED: &[&str] = &[
    "llama_model_load_from_file",
    "llama_model_init_from_user",
    "llama_init_from_model",
    "llama_decode",
    "llama_tokenize",
    "llama_token_to_piece",
    "llama_chat_apply_template",
    "llama_model_chat_template",
    "llama_sampler_sample",
    "llama_model_free",
    "llama_free",
    "llama_memory_clear",
    "llama_state_seq_get_size",
    "llama_state_seq_get_data",
    "llama_state_seq_set_data",
    "llama_memory_seq_rm",
    "llama_memory_seq_cp",
    "llama_set_adapter_cvec",
];

fn sources(dir: &Path, out: &mut Vec<(String, String)>) {
    for e in std::fs::read_dir(dir).expect("read engine/src") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            let t = std::fs::read_to_string(&p).expect("read source");
            out.push((p.display().to_string(), t));
        }
    }
}

/// Every `sys::<prefix>name(` in `text` (the bindings the engine calls).
fn called(text: &str, prefix: &str) -> BTreeSet<String> {
    let pat = format!("sys::{prefix}");
    let mut found = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find(&pat) {
        let tail = &rest[i + pat.len()..];
        let n = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        // A call, not a type or a constant: the name is followed by its arguments.
        if tail[n..].starts_with('(') {
            found.insert(format!("{prefix}{}", &tail[..n]));
        }
        rest = &tail[n..];
    }
    found
}

#[test]
fn every_llama_entry_point_is_shimmed_or_cannot_throw() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    sources(&root.join("src"), &mut files);
    let mut direct = BTreeSet::new();
    for (path, text) in &files {
        for f in called(text, "llama_") {
            assert!(
                !WRAPPED.contains(&f.as_str()),
                "{path} calls {f} directly: it can throw; call its sys::shim::bmoe_ wrapper"
            );
            assert!(
                DIRECT.iter().any(|(n, _)| *n == f),
                "{path} calls {f} directly: wrap it in ggml-sys/shim/bmoe_shim.cpp, or add it to \
                 DIRECT with the reason it cannot throw (read in the pinned source)"
            );
            direct.insert(f);
        }
    }
    let stale: Vec<_> = DIRECT
        .iter()
        .filter(|(n, _)| !direct.contains(*n))
        .collect();
    assert!(stale.is_empty(), "listed but no longer called: {stale:?}");
    // Each wrapped call has its wrapper in the shim, and the engine uses the wrapper.
    let shim: String = ["bmoe_shim.cpp", "bmoe_unlink.cpp", "bmoe_weights.cpp"]
        .iter()
        .map(|f| std::fs::read_to_string(root.join("../ggml-sys/shim").join(f)).unwrap())
        .collect();
    let all: String = files.iter().map(|(_, t)| t.as_str()).collect();
    for f in WRAPPED {
        let call = format!("{f}(");
        assert!(shim.contains(&call), "the shim never calls {f}");
    }
    for w in called(&all, "shim::bmoe_") {
        let w = w.trim_start_matches("shim::");
        assert!(
            shim.contains(&format!("int {w}(")),
            "{w} is bound but not defined"
        );
    }
    eprintln!(
        "{} llama.cpp entry points called directly (cannot throw), {} through the shim",
        direct.len(),
        WRAPPED.len()
    );
}

/// ggml and gguf are C APIs (gguf's C++ reader catches its own exceptions and returns NULL); no
/// llama.cpp symbol is reached through a name that does not start with `llama_`.
#[test]
fn the_other_entry_points_are_ggml_and_gguf_c_calls() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    sources(&root.join("src"), &mut files);
    let all: String = files.iter().map(|(_, t)| t.as_str()).collect();
    let ggml = called(&all, "ggml_");
    let gguf = called(&all, "gguf_");
    assert!(!ggml.is_empty() && !gguf.is_empty());
    eprintln!("ggml: {} calls, gguf: {} calls", ggml.len(), gguf.len());
}
