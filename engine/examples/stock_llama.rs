//! Stock llama.cpp, for side-by-side benchmarks (`scripts/bench-repack`): `llama.h` calls alone on
//! the same vendored libraries bmoe links, with llama.cpp's default model and context parameters
//! (mapped file, CPU repack on): load, one prefill, greedy decode. Prints the prefill and decode
//! rates in the lines `bmoe generate` prints; with `--json`, also one JSON object on stdout whose
//! `timing` has the fields of `bmoe generate --format json`'s, so one reader reads both.
//!
//!   stock_llama -m MODEL -p PROMPT [-n 64] [-t THREADS] [--ubatch N] [--no-repack] [--json]
//!
//! `--no-repack` loads with `use_extra_bufts = false` (no CPU_REPACK buffer type), as bmoe did
//! before issue 32. `--cpu-variant NAME` (a build with the CPU variants): load
//! `libggml-cpu-NAME.so` (and the RPC module) from the build's module folder instead of letting
//! `ggml_backend_load_all` score them, whose choice here (sapphirerapids, by cpuid) traps.
use std::ffi::CString;
use std::process::ExitCode;
use std::time::Instant;

use ggml_sys as sys;

/// The command line.
struct Args {
    model: String,
    prompt: String,
    n_predict: usize,
    threads: i32,
    ubatch: Option<u32>,
    repack: bool,
    cpu_variant: Option<String>,
    json: bool,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        model: String::new(),
        prompt: String::new(),
        n_predict: 64,
        threads: 2,
        ubatch: None,
        repack: true,
        cpu_variant: None,
        json: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        let number = |v: String| {
            v.parse::<u32>()
                .map_err(|_| format!("{flag}: not a number: {v}"))
        };
        match flag.as_str() {
            "-m" => a.model = value()?,
            "-p" => a.prompt = value()?,
            "-n" => a.n_predict = number(value()?)? as usize,
            "-t" => a.threads = number(value()?)? as i32,
            "--ubatch" => a.ubatch = Some(number(value()?)?),
            "--no-repack" => a.repack = false,
            "--cpu-variant" => a.cpu_variant = Some(value()?),
            "--json" => a.json = true,
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    if a.model.is_empty() || a.prompt.is_empty() {
        return Err(
            "usage: stock_llama -m MODEL -p PROMPT [-n 64] [-t THREADS] [--ubatch N] [--no-repack] [--cpu-variant NAME] [--json]"
                .into(),
        );
    }
    Ok(a)
}

/// The prompt's tokens (special tokens added and parsed, as `bmoe generate` tokenizes).
unsafe fn tokenize(vocab: *const sys::llama_vocab, text: &str) -> Result<Vec<i32>, String> {
    let mut out = vec![0i32; text.len() + 8];
    loop {
        let n = sys::llama_tokenize(
            vocab,
            text.as_ptr().cast(),
            text.len() as i32,
            out.as_mut_ptr(),
            out.len() as i32,
            true,
            true,
        );
        if n >= 0 {
            out.truncate(n as usize);
            return Ok(out);
        }
        // A negative count is the size the tokens need.
        if (n.unsigned_abs() as usize) <= out.len() {
            return Err("tokenize failed".into());
        }
        out.resize(n.unsigned_abs() as usize, 0);
    }
}

/// llama.cpp's log: errors only, so that the two rate lines stand out.
unsafe extern "C" fn errors_only(
    level: sys::ggml_log_level,
    text: *const std::os::raw::c_char,
    _: *mut std::os::raw::c_void,
) {
    if level == sys::GGML_LOG_LEVEL_ERROR && !text.is_null() {
        eprint!("{}", std::ffi::CStr::from_ptr(text).to_string_lossy());
    }
}

/// Decodes `tokens` from `pos0` in one batch (llama.cpp cuts it into ubatches), logits for the
/// last one; the argmax of those logits (the first maximum, as llama.cpp's greedy sampler).
unsafe fn step(
    ctx: *mut sys::llama_context,
    tokens: &[i32],
    pos0: usize,
    n_vocab: usize,
) -> Result<i32, String> {
    let mut b = sys::llama_batch_init(tokens.len() as i32, 0, 1);
    for (i, &t) in tokens.iter().enumerate() {
        *b.token.add(i) = t;
        *b.pos.add(i) = (pos0 + i) as i32;
        *b.n_seq_id.add(i) = 1;
        *(*b.seq_id.add(i)) = 0;
        *b.logits.add(i) = i8::from(i + 1 == tokens.len());
    }
    b.n_tokens = tokens.len() as i32;
    let rc = sys::llama_decode(ctx, b);
    sys::llama_batch_free(b);
    if rc != 0 {
        return Err(format!("llama_decode returned {rc}"));
    }
    let p = sys::llama_get_logits_ith(ctx, -1);
    if p.is_null() {
        return Err("no logits".into());
    }
    let row = std::slice::from_raw_parts(p, n_vocab);
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    Ok(best as i32)
}

/// Load, prefill, decode; the two rate lines on stderr.
unsafe fn run(a: &Args) -> Result<(), String> {
    sys::llama_log_set(Some(errors_only), std::ptr::null_mut());
    if let Some(v) = &a.cpu_variant {
        let dir = sys::BACKENDS_DIR.ok_or("--cpu-variant needs a build with the CPU variants")?;
        for f in ["libggml-rpc.so".to_string(), format!("libggml-cpu-{v}.so")] {
            let p = CString::new(format!("{dir}/{f}")).map_err(|_| "NUL in the module path")?;
            if sys::ggml_backend_load(p.as_ptr()).is_null() {
                return Err(format!("{dir}/{f} did not load"));
            }
        }
    }
    sys::llama_backend_init();
    let path = CString::new(a.model.as_str()).map_err(|_| "NUL in the model path")?;
    let mut mp = sys::llama_model_default_params();
    mp.use_extra_bufts = a.repack;
    let m = sys::llama_model_load_from_file(path.as_ptr(), mp);
    if m.is_null() {
        return Err(format!("{}: llama.cpp could not load it", a.model));
    }
    let vocab = sys::llama_model_get_vocab(m);
    let n_vocab = sys::llama_vocab_n_tokens(vocab) as usize;
    let prompt = tokenize(vocab, &a.prompt)?;
    let mut cp = sys::llama_context_default_params();
    cp.n_ctx = (prompt.len() + a.n_predict + 16) as u32;
    cp.n_batch = cp.n_batch.max(prompt.len() as u32);
    if let Some(u) = a.ubatch {
        cp.n_ubatch = u;
    }
    cp.n_threads = a.threads;
    cp.n_threads_batch = a.threads;
    let ctx = sys::llama_init_from_model(m, cp);
    if ctx.is_null() {
        return Err("llama_init_from_model failed".into());
    }
    let t0 = Instant::now();
    let mut tok = step(ctx, &prompt, 0, n_vocab)?;
    let prefill_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let mut n_decoded = 0;
    while n_decoded < a.n_predict && !sys::llama_vocab_is_eog(vocab, tok) {
        tok = step(ctx, &[tok], prompt.len() + n_decoded, n_vocab)?;
        n_decoded += 1;
    }
    let decode_s = t1.elapsed().as_secs_f64();
    eprintln!(
        "prefill: {} tokens in {prefill_s:.3} s ({:.1} tok/s)",
        prompt.len(),
        prompt.len() as f64 / prefill_s
    );
    eprintln!(
        "decode: {n_decoded} tokens in {decode_s:.3} s ({:.2} tok/s)",
        n_decoded as f64 / decode_s
    );
    if a.json {
        // For scripts: the numbers of the lines above, named as in bmoe's own records.
        let timing = serde_json::json!({
            "n_prompt": prompt.len(),
            "prefill_s": prefill_s,
            "n_decoded": n_decoded,
            "decode_s": decode_s,
        });
        println!("{}", serde_json::json!({ "timing": timing }));
    }
    sys::llama_free(ctx);
    sys::llama_model_free(m);
    Ok(())
}

fn main() -> ExitCode {
    let a = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("stock_llama: {e}");
            return ExitCode::from(2);
        }
    };
    // SAFETY: llama.h calls in their documented order, each result checked before use; the
    // batch and token buffers are sized for what is written into them.
    match unsafe { run(&a) } {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stock_llama: {e}");
            ExitCode::from(1)
        }
    }
}
