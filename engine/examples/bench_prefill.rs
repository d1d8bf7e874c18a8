//! Prefill on a device vs on the CPU, side by side in one run: CPU prefill, device prefill reading
//! whole layers into the arena, and device prefill reading only the routed experts. Run through
//! `scripts/bench-prefill`.
//!
//! `bench_prefill MODEL [THREADS] [DEVICE] [stream|resident] [UBATCH]`
//!
//! Next to each measured time it prints two floors: the read-bound floor (the routed arena's bytes
//! over the disk's O_DIRECT bandwidth, which `scripts/bench-prefill` measures in the same run and
//! passes as `BMOE_DIRECT_MIBS`), and the compute floor: llama.cpp's own prefill of the same prompt
//! with every layer on the device (`LoadOptions::offload`, the model resident there).
//!
//! DEVICE `loopback` (the default) starts an in-process ggml RPC server fronting this CPU: the
//! same kernels on both sides, so the numbers are the mechanism's own cost (arena traffic, graph
//! transfer over loopback TCP), not a speed-up. Any other name (`CUDA0`) is a real device.
//!
//! Each prompt length runs twice per configuration in one session, a warm-up prompt then the
//! measured one, as consecutive agent decisions do: the routed arena predicts from the graph
//! before, and the first graph of a session has no prediction.
use std::time::Instant;

use bmoe_engine::test_support::start_loopback_server;
use bmoe_engine::Device;
use bmoe_engine::{
    CancelToken, GenerateOptions, GenerateRecord, LoadOptions, Model, PrefillOptions,
    SessionOptions, StreamOptions,
};

fn prompt(n: usize, seed: &str) -> String {
    // The synthetic vocabulary is byte-level and a space becomes "▁" (3 bytes): about three
    // quarters of n characters make n tokens.
    seed.chars().cycle().take(n * 3 / 4).collect()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| args.get(i).map(String::as_str);
    let model = arg(0).unwrap_or("models/small.gguf").to_string();
    let threads: u32 = arg(1).and_then(|s| s.parse().ok()).unwrap_or(2);
    let device = arg(2).unwrap_or("loopback");
    let streamed = arg(3).unwrap_or("stream") != "resident";
    let ubatch: u32 = arg(4).and_then(|s| s.parse().ok()).unwrap_or(2048);
    let direct_mibs: Option<f64> = std::env::var("BMOE_DIRECT_MIBS")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|&v: &f64| v > 0.0);
    let loopback = device == "loopback";
    let dev = if loopback {
        let endpoint = start_loopback_server(Device::cpu().expect("cpu"), threads as usize)
            .expect("loopback server");
        bmoe_engine::add_rpc_server(&endpoint).expect("add server")[0]
            .name
            .clone()
    } else {
        device.to_string()
    };
    let stream = streamed.then(|| StreamOptions {
        cache: bmoe_engine::CacheBudget::Mib(0),
        io_threads: 4,
        ..Default::default()
    });
    let load = |prefill: Option<PrefillOptions>| {
        let t0 = Instant::now();
        let m = Model::load(&LoadOptions {
            stream: stream.clone(),
            prefill,
            ..LoadOptions::new(&model)
        })
        .expect("load");
        for w in m.warnings() {
            eprintln!("bmoe: {w}");
        }
        eprintln!("loaded in {:.1} s", t0.elapsed().as_secs_f64());
        m
    };
    let on_dev = |routed: bool| {
        Some(PrefillOptions {
            device: dev.clone(),
            min_tokens: 32,
            routed,
            ..Default::default()
        })
    };
    let cpu = load(None);
    let whole = load(on_dev(false));
    let routed = load(on_dev(true));
    // llama.cpp's own path with every layer on the device: the compute floor.
    let offloaded = Model::load(&LoadOptions {
        offload: Some(dev.clone()),
        ..LoadOptions::new(&model)
    })
    .expect("load with every layer on the device");
    assert!(
        whole.info().prefill_device.is_some(),
        "device {dev} did not join the run"
    );
    let sess = SessionOptions {
        threads,
        n_ctx: 4096,
        n_ubatch: 512,
        n_ubatch_device: ubatch,
        ..Default::default()
    };
    println!("build: {}", bmoe_engine::system_info());
    println!(
        "model {model} ({}), {threads} threads, CPU ubatch 512, device ubatch {ubatch}, device {dev}{}",
        if streamed { "moe_stream, no expert cache" } else { "resident" },
        if loopback {
            " (loopback RPC: measures the mechanism's overhead, not a speed-up)"
        } else {
            ""
        }
    );
    println!(
        "{:>6} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7} {:>7} {:>7} {:>7} {:>9} {:>10} {:>7} {:>7} {:>7} {:>6} {:>5}",
        "tokens",
        "cpu s",
        "whole s",
        "routed s",
        "floor rd",
        "floor cp",
        "r/rd",
        "r/cp",
        "cpu/w",
        "cpu/r",
        "whole MiB",
        "routed MiB",
        "stall w",
        "stall r",
        "routed%",
        "miss%",
        "same"
    );
    let opts = GenerateOptions {
        n_predict: 1,
        chat: false,
        ..Default::default()
    };
    let n_expert = cpu.info().n_expert.max(1) as f64;
    let n_layer = cpu.info().n_layer as f64;
    for n in [100usize, 500, 2000] {
        let warm = prompt(
            n,
            "An earlier screen of the agent, routed much like the next. ",
        );
        let measured = prompt(
            n,
            "The arena moves weights per graph, two layers at a time. ",
        );
        let run = |m: &Model| -> GenerateRecord {
            let mut s = m.session(&sess).expect("session");
            s.generate(&warm, &opts, &CancelToken::new())
                .expect("warm-up");
            s.generate(&measured, &opts, &CancelToken::new())
                .expect("measured")
        };
        let (c, w, r) = (run(&cpu), run(&whole), run(&routed));
        let o = {
            let mut s = offloaded
                .session(&SessionOptions {
                    n_ubatch: ubatch,
                    ..sess.clone()
                })
                .expect("session");
            s.generate(&warm, &opts, &CancelToken::new())
                .expect("warm-up");
            s.generate(&measured, &opts, &CancelToken::new())
                .expect("measured")
        };
        // The read-bound floor applies to a streamed model (a resident one reads nothing).
        let floor_rd = direct_mibs
            .filter(|_| streamed)
            .map(|bw| r.prefill_dev.read_mib() / bw);
        let floor_cp = o.timing.prefill_s;
        let fmt_s = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.3}"));
        let fmt_x = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}x"));
        let same = c.tokens == w.tokens && c.tokens == r.tokens;
        if loopback {
            assert!(same, "the loopback device must match the CPU bit for bit");
        }
        let pct = |a: f64, b: f64| if b > 0.0 { 100.0 * a / b } else { 0.0 };
        // Device graphs of the measured prompt: full pieces, and a tail at least 32 wide.
        let (np, ub) = (c.timing.n_prompt as u64, u64::from(ubatch));
        let graphs = (np / ub + u64::from(np % ub >= 32)).max(1) as f64;
        println!(
            "{:>6} {:>8.3} {:>8.3} {:>8.3} {:>8} {:>8.3} {:>7} {:>7} {:>6.2}x {:>6.2}x {:>9.1} {:>10.1} {:>6.0}% {:>6.0}% {:>6.0}% {:>5.0}% {:>5}",
            c.timing.n_prompt,
            c.timing.prefill_s,
            w.timing.prefill_s,
            r.timing.prefill_s,
            fmt_s(floor_rd),
            floor_cp,
            fmt_x(floor_rd.map(|f| r.timing.prefill_s / f)),
            fmt_x(Some(r.timing.prefill_s / floor_cp)),
            c.timing.prefill_s / w.timing.prefill_s,
            c.timing.prefill_s / r.timing.prefill_s,
            w.prefill_dev.read_mib(),
            r.prefill_dev.read_mib(),
            pct(w.prefill_dev.stall_s, w.timing.prefill_s),
            pct(r.prefill_dev.stall_s, r.timing.prefill_s),
            pct(r.prefill_dev.routed as f64, graphs * n_layer * n_expert),
            pct(r.prefill_dev.demand as f64, r.prefill_dev.routed as f64),
            if same { "yes" } else { "no" }
        );
    }
    println!(
        "floor rd: the routed arena's bytes over the disk's O_DIRECT bandwidth ({}; streamed only). floor cp: llama.cpp's own prefill with every layer on the device (model resident there). r/rd, r/cp: routed device prefill over each floor. cpu/w, cpu/r: CPU prefill time over device prefill time (whole layers, routed). stall: share of device prefill spent waiting on the arena. routed%: experts routed per layer per device graph. miss%: routed experts the prediction missed (read at the routing node). same: the generated token equals the CPU's.",
        direct_mibs.map_or("not measured".to_string(), |v| format!("{v:.0} MiB/s"))
    );
}
