//! Stock llama.cpp written out with `llama.h` calls alone, llama.cpp's defaults wherever the
//! caller does not choose (as `examples/stock_llama.rs` runs it): the reference the engine's
//! stock runtime (`LoadOptions::stock`) is gated against, bit for bit. Test support only.
use std::ffi::CString;
use std::path::Path;

use ggml_sys as sys;

use super::guard::ErrBuf;

/// The logits after the last of `tokens`, decoded from an empty cache in one `llama_decode`
/// call (llama.cpp cuts it into pieces of `n_ubatch`) on a context of `n_ctx` cells.
pub fn last_logits(
    path: &Path,
    tokens: &[i32],
    n_ctx: u32,
    n_ubatch: u32,
    threads: i32,
) -> Result<Vec<f32>, String> {
    if tokens.is_empty() {
        return Err("no tokens".into());
    }
    let c_path = CString::new(path.to_string_lossy().as_bytes()).map_err(|_| "NUL in the path")?;
    let thrown = |call: &'static str, e: &ErrBuf, rc: i32| {
        e.check(call, rc).map_err(|t| format!("{call}: {t}"))
    };
    let mut e = ErrBuf::new();
    // SAFETY: llama.h calls (through the shim, which catches what they throw) in their documented
    // order, each result checked before use; the model and context are freed before returning on
    // every path; the batch is sized for the tokens written into it, and the logits row read is
    // the model's vocabulary wide.
    unsafe {
        sys::llama_backend_init();
        let mut mp = sys::llama_model_default_params();
        // The CPU alone, as the stock runtime runs (a registered device would otherwise take
        // every layer, llama.cpp's default).
        mp.n_gpu_layers = 0;
        let mut m: *mut sys::llama_model = std::ptr::null_mut();
        let rc =
            sys::shim::bmoe_model_load_from_file(c_path.as_ptr(), mp, &mut m, e.ptr(), e.len());
        thrown("llama_model_load_from_file", &e, rc)?;
        if m.is_null() {
            return Err(format!("{}: llama.cpp could not load it", path.display()));
        }
        let mut cp = sys::llama_context_default_params();
        cp.n_ctx = n_ctx;
        cp.n_batch = cp.n_batch.max(tokens.len() as u32);
        cp.n_ubatch = n_ubatch;
        cp.n_threads = threads;
        cp.n_threads_batch = threads;
        let mut ctx: *mut sys::llama_context = std::ptr::null_mut();
        let rc = sys::shim::bmoe_init_from_model(m, cp, &mut ctx, e.ptr(), e.len());
        let out = match thrown("llama_init_from_model", &e, rc) {
            Err(why) => Err(why),
            Ok(()) if ctx.is_null() => Err("llama_init_from_model failed".into()),
            Ok(()) => {
                let r = decode_last(ctx, m, tokens);
                let _ = sys::shim::bmoe_free(ctx, e.ptr(), e.len());
                r
            }
        };
        let _ = sys::shim::bmoe_model_free(m, e.ptr(), e.len());
        out
    }
}

/// `tokens` decoded from position 0 in one call; the logits of the last.
///
/// # Safety
/// `ctx` is a live context of the live model `m`.
unsafe fn decode_last(
    ctx: *mut sys::llama_context,
    m: *mut sys::llama_model,
    tokens: &[i32],
) -> Result<Vec<f32>, String> {
    let n_vocab = sys::llama_vocab_n_tokens(sys::llama_model_get_vocab(m)) as usize;
    let mut b = sys::llama_batch_init(tokens.len() as i32, 0, 1);
    for (i, &t) in tokens.iter().enumerate() {
        *b.token.add(i) = t;
        *b.pos.add(i) = i as i32;
        *b.n_seq_id.add(i) = 1;
        *(*b.seq_id.add(i)) = 0;
        *b.logits.add(i) = i8::from(i + 1 == tokens.len());
    }
    b.n_tokens = tokens.len() as i32;
    let (mut rc, mut e) = (0i32, ErrBuf::new());
    let status = sys::shim::bmoe_decode(ctx, b, &mut rc, e.ptr(), e.len());
    sys::llama_batch_free(b);
    e.check("llama_decode", status)
        .map_err(|t| format!("llama_decode: {t}"))?;
    if rc != 0 {
        return Err(format!("llama_decode returned {rc}"));
    }
    let p = sys::llama_get_logits_ith(ctx, -1);
    if p.is_null() {
        return Err("no logits".into());
    }
    Ok(std::slice::from_raw_parts(p, n_vocab).to_vec())
}
