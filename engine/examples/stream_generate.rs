//! A streamed generate with the engine's `repack` option on the command line, for side-by-side
//! benchmarks of the repacked streamed experts (`scripts/bench-repack --stream`) until the
//! runner has a setting of its own. Prints the prefill and decode rates in the lines
//! `bmoe generate` prints, and what repacking cost; with `--json`, also one JSON object on stdout
//! with the measured run's `timing`, `stream`, `decode_stream` and `load`, named as in
//! `bmoe generate --format json`, so one reader reads both.
//!
//!   stream_generate -m MODEL -p PROMPT [-n 64] [-t THREADS] [--cache-mb 0] [--repack auto|off]
//!                   [--warm N] [--json]
//!
//! `--warm N` runs the same generate N times first, each in a session of its own on the same model
//! (so the same expert cache): with a cache that holds every expert, the measured run then routes
//! only to cached experts ("streamed with every expert cached"; its misses are printed).
use std::process::ExitCode;

use bmoe_engine::{
    CacheBudget, CancelToken, GenerateOptions, LoadOptions, Model, Repack, SessionOptions,
    StreamOptions,
};

/// The command line.
struct Args {
    model: String,
    prompt: String,
    n_predict: u32,
    threads: u32,
    cache_mb: u64,
    repack: Repack,
    warm: u32,
    json: bool,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        model: String::new(),
        prompt: String::new(),
        n_predict: 64,
        threads: 2,
        cache_mb: 0,
        repack: Repack::Auto,
        warm: 0,
        json: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--json" {
            a.json = true;
            continue;
        }
        let v = it.next().ok_or(format!("{flag} needs a value"))?;
        let number = |v: &str| {
            v.parse::<u64>()
                .map_err(|_| format!("{flag}: not a number: {v}"))
        };
        match flag.as_str() {
            "-m" => a.model = v,
            "-p" => a.prompt = v,
            "-n" => a.n_predict = number(&v)? as u32,
            "-t" => a.threads = number(&v)? as u32,
            "--cache-mb" => a.cache_mb = number(&v)?,
            "--warm" => a.warm = number(&v)? as u32,
            "--repack" => {
                a.repack = match v.as_str() {
                    "auto" => Repack::Auto,
                    "off" => Repack::Off,
                    _ => return Err(format!("--repack: expected auto or off, got {v}")),
                }
            }
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    if a.model.is_empty() || a.prompt.is_empty() {
        return Err("usage: stream_generate -m MODEL -p PROMPT [-n 64] [-t 2] [--cache-mb 0] [--repack auto|off] [--warm N] [--json]".into());
    }
    Ok(a)
}

fn run(a: &Args) -> Result<(), String> {
    let m = Model::load(&LoadOptions {
        stream: Some(StreamOptions {
            cache: CacheBudget::Mib(a.cache_mb),
            ..Default::default()
        }),
        repack: a.repack,
        ..LoadOptions::new(&a.model)
    })
    .map_err(|e| e.to_string())?;
    let opts = GenerateOptions {
        n_predict: a.n_predict,
        chat: false,
        ..Default::default()
    };
    // A session of its own per run: nothing of the prompt is reused, only the expert cache.
    let generate = || {
        m.session(&SessionOptions {
            threads: a.threads,
            ..Default::default()
        })
        .and_then(|mut s| s.generate(&a.prompt, &opts, &CancelToken::new()))
        .map_err(|e| e.to_string())
    };
    for _ in 0..a.warm {
        generate()?;
    }
    let g = generate()?;
    let t = &g.timing;
    eprintln!(
        "prefill: {} tokens in {:.3} s ({:.1} tok/s)",
        t.n_prompt,
        t.prefill_s,
        t.prefill_tps()
    );
    eprintln!(
        "decode: {} tokens in {:.3} s ({:.2} tok/s)",
        t.n_decoded,
        t.decode_s,
        t.tok_s()
    );
    let d = &g.decode_stream;
    eprintln!(
        "repack: {} weight tensors tagged; decode repacked {} expert slices in {:.3} s summed over the threads that repacked ({:.1}% of decode's wall time; lanes repacking at once on shared cores add up past it), read {:.3} s (summed likewise), stall {:.3} s",
        m.load_stats().repacked.tensors,
        d.repacked,
        d.repack_s,
        100.0 * d.repack_s / t.decode_s.max(1e-9),
        d.read_s,
        d.stall_s
    );
    eprintln!(
        "measured run: {} expert misses in all, {} in decode",
        g.stream.cache_misses, d.cache_misses
    );
    if a.json {
        let doc = serde_json::json!({
            "timing": t,
            "stream": g.stream,
            "decode_stream": d,
            "load": m.load_stats(),
        });
        println!("{doc}");
    }
    Ok(())
}

fn main() -> ExitCode {
    match parse().and_then(|a| run(&a)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stream_generate: {e}");
            ExitCode::from(2)
        }
    }
}
