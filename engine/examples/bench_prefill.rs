//! Prefill on a device vs on the CPU, side by side in one run, on the loopback RPC device (an
//! in-process ggml RPC server fronting this CPU). Same kernels on both sides, so the difference is
//! the mechanism's own cost: arena uploads and graph transfer over loopback TCP. Run through
//! `scripts/bench-prefill`.
use std::time::Instant;

use bmoe_engine::ffi::registry::Device;
use bmoe_engine::ffi::rpc;
use bmoe_engine::{
    CancelToken, GenerateOptions, LoadOptions, Model, PrefillOptions, SessionOptions,
};

fn main() {
    let mut args = std::env::args().skip(1);
    let model = args.next().unwrap_or_else(|| "models/bench.gguf".into());
    let threads: u32 = args.next().and_then(|s| s.parse().ok()).unwrap_or(2);
    let lengths = [100usize, 500, 2000];
    let endpoint = rpc::start_loopback_server(Device::cpu().expect("cpu"), threads as usize)
        .expect("loopback server");
    let dev = rpc::add_server(&endpoint).expect("add server")[0]
        .name
        .clone();
    let sess = SessionOptions {
        threads,
        n_ctx: 4096,
        n_ubatch: 512,
        n_ubatch_device: 512,
        ..Default::default()
    };
    let t0 = Instant::now();
    let cpu = Model::load(&LoadOptions::new(&model)).expect("load");
    eprintln!("loaded {model} in {:.1} s", t0.elapsed().as_secs_f64());
    let on_dev = Model::load(&LoadOptions {
        prefill: Some(PrefillOptions {
            device: dev.clone(),
            min_tokens: 32,
            ..Default::default()
        }),
        ..LoadOptions::new(&model)
    })
    .expect("load with device");
    println!("model {model}, {threads} threads, ubatch 512, loopback device {dev} ({endpoint})");
    println!(
        "{:>7} {:>10} {:>10} {:>8} {:>12} {:>10} {:>8}",
        "tokens", "cpu s", "device s", "dev/cpu", "arena MiB", "stall s", "stall %"
    );
    let opts = GenerateOptions {
        n_predict: 1,
        chat: false,
        ..Default::default()
    };
    for n in lengths {
        // The synthetic vocabulary is byte-level and a space becomes "▁" (3 bytes): about three
        // quarters of n characters make n tokens.
        let prompt: String = "The arena moves weights per graph. "
            .chars()
            .cycle()
            .take(n * 3 / 4)
            .collect();
        let c = cpu
            .session(&sess)
            .unwrap()
            .generate(&prompt, &opts, &CancelToken::new())
            .expect("cpu");
        let d = on_dev
            .session(&sess)
            .unwrap()
            .generate(&prompt, &opts, &CancelToken::new())
            .expect("device");
        assert_eq!(c.tokens, d.tokens, "device and CPU disagree");
        let (cs, ds) = (c.timing.prefill_s, d.timing.prefill_s);
        println!(
            "{:>7} {:>10.3} {:>10.3} {:>7.2}x {:>12.1} {:>10.3} {:>7.1}%",
            c.timing.n_prompt,
            cs,
            ds,
            ds / cs,
            d.prefill_dev.read_mib(),
            d.prefill_dev.stall_s,
            100.0 * d.prefill_dev.stall_s / ds
        );
    }
}
