//! Stock llama.cpp written out with `llama.h` calls alone, llama.cpp's defaults wherever the
//! caller does not choose (as `examples/stock_llama.rs` runs it): the reference the engine's
//! stock runtime (`LoadOptions::stock`) is gated against, bit for bit. Test support only.
use std::ffi::CString;
use std::path::Path;

use ggml_sys as sys;

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
    // SAFETY: llama.h calls in their documented order, each result checked before use; the model
    // and context are freed before returning on every path; the batch is sized for the tokens
    // written into it, and the logits row read is the model's vocabulary wide.
    unsafe {
        sys::llama_backend_init();
        let mut mp = sys::llama_model_default_params();
        // The CPU alone, as the stock runtime runs (a registered device would otherwise take
        // every layer, llama.cpp's default).
        mp.n_gpu_layers = 0;
        let m = sys::llama_model_load_from_file(c_path.as_ptr(), mp);
        if m.is_null() {
            return Err(format!("{}: llama.cpp could not load it", path.display()));
        }
        let mut cp = sys::llama_context_default_params();
        cp.n_ctx = n_ctx;
        cp.n_batch = cp.n_batch.max(tokens.len() as u32);
        cp.n_ubatch = n_ubatch;
        cp.n_threads = threads;
        cp.n_threads_batch = threads;
        let ctx = sys::llama_init_from_model(m, cp);
        if ctx.is_null() {
            sys::llama_model_free(m);
            return Err("llama_init_from_model failed".into());
        }
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
        let rc = sys::llama_decode(ctx, b);
        sys::llama_batch_free(b);
        let p = sys::llama_get_logits_ith(ctx, -1);
        let out = if rc != 0 {
            Err(format!("llama_decode returned {rc}"))
        } else if p.is_null() {
            Err("no logits".into())
        } else {
            Ok(std::slice::from_raw_parts(p, n_vocab).to_vec())
        };
        sys::llama_free(ctx);
        sys::llama_model_free(m);
        out
    }
}
