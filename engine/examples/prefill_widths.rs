//! Prefill throughput per piece width, to choose the prompt grid (docs/benchmarks.md, "Exact
//! reuse on a 128-token grid"): `cargo run -p bmoe-engine --example prefill_widths -- small`.
//!
//! `prefill_widths MODEL [THREADS] [TOKENS] [ROUNDS] [WIDTHS...]`
//!
//! Each round primes the same prompt once per width, widths interleaved, so a load that comes
//! and goes on a shared machine weighs on every width alike; the best round per width is printed.
use std::time::Instant;

use bmoe_engine::{LoadOptions, Model, SessionOptions};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut model = args.first().cloned().unwrap_or("models/small.gguf".into());
    let num = |i: usize, d: usize| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let threads = num(1, 2) as u32;
    let n = num(2, 1536);
    let rounds = num(3, 3);
    let mut widths: Vec<u32> = args.iter().skip(4).filter_map(|s| s.parse().ok()).collect();
    if widths.is_empty() {
        widths = vec![32, 64, 128, 256, 512];
    }
    if !std::path::Path::new(&model).exists() {
        // A preset name: the synthetic model, written once.
        let preset = bmoe_synth::Preset::parse(&model).expect("a GGUF path or a preset name");
        let spec = bmoe_synth::SynthSpec::preset(preset, bmoe_synth::SynthArch::Qwen3Moe);
        let path = format!("models/{model}.gguf");
        std::fs::create_dir_all("models").expect("models/");
        bmoe_synth::write_model(&spec, std::path::Path::new(&path)).expect("write model");
        model = path;
    }
    let m = Model::load(&LoadOptions::new(&model)).expect("load");
    let text: String = "An agent on a phone reads the screen and taps. "
        .chars()
        .cycle()
        .take(n * 3 / 4)
        .collect();
    let tokens = m.tokenize(&text, true).expect("tokenize");
    println!(
        "model {model}, {threads} threads, {} tokens, {rounds} rounds",
        tokens.len()
    );
    let mut best = vec![f64::MAX; widths.len()];
    for _ in 0..rounds {
        for (i, &w) in widths.iter().enumerate() {
            let opts = SessionOptions {
                threads,
                n_ctx: (tokens.len() as u32 + 64).next_multiple_of(256),
                n_ubatch: w,
                ..Default::default()
            };
            let mut s = m.session(&opts).expect("session");
            let t0 = Instant::now();
            s.prime(&tokens).expect("prefill");
            best[i] = best[i].min(t0.elapsed().as_secs_f64());
        }
    }
    println!("| width | best s | tokens/s | vs 512 |");
    println!("|---:|---:|---:|---:|");
    let base = widths.iter().position(|&w| w == 512).map(|i| best[i]);
    for (w, s) in widths.iter().zip(&best) {
        let rel = base.map_or("-".into(), |b| format!("{:.2}", b / s));
        println!("| {w} | {s:.2} | {:.0} | {rel} |", tokens.len() as f64 / s);
    }
}
