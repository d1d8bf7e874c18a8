//! Where the compute buffers of a run with a prefill device are, as llama.cpp reports them (its
//! `compute buffer size` log lines): once with llama.cpp's first reservation kept (every weight
//! on the CPU when it was made; the gate knob `keep_first_reserve`), once reserved again at the
//! first device graph with the weights in the arena. Each run prints the reservations it made and,
//! when its context is freed, the sizes held after the device pieces, the CPU's tail and a decode
//! token. Run through `scripts/bench-compute-buffers`:
//!
//! `compute_buffers MODEL [DEVICE_UBATCH] [CPU_UBATCH]`
//!
//! The device is an in-process loopback RPC server fronting this CPU (its buffers are host memory
//! too, so the process's RSS does not show the split; llama.cpp's lines do).
use bmoe_engine::test_support::start_loopback_server;
use bmoe_engine::{
    CancelToken, Device, GateKnobs, GenerateOptions, LoadOptions, Model, PrefillOptions,
    SessionOptions, StreamOptions,
};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let model = args.first().map_or("models/small.gguf", String::as_str);
    let device_ubatch: u32 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(2048);
    let cpu_ubatch: u32 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(512);
    let endpoint = start_loopback_server(Device::cpu().expect("cpu"), 1).expect("loopback server");
    let dev = bmoe_engine::add_rpc_server(&endpoint).expect("add server")[0]
        .name
        .clone();
    let prompt: String = "The quick brown fox jumps over the lazy dog. "
        .chars()
        .cycle()
        .take(1500)
        .collect();
    for keep_first_reserve in [true, false] {
        bmoe_engine::set_log_verbose(false);
        let m = Model::load(&LoadOptions {
            stream: Some(StreamOptions::default()),
            prefill: Some(PrefillOptions {
                device: dev.clone(),
                min_tokens: 32,
                gate: GateKnobs {
                    keep_first_reserve,
                    ..Default::default()
                },
                ..Default::default()
            }),
            ..LoadOptions::new(model)
        })
        .expect("load");
        eprintln!(
            "== {} (device ubatch {device_ubatch}, CPU ubatch {cpu_ubatch})",
            if keep_first_reserve {
                "before: llama.cpp's first reservation kept"
            } else {
                "after: reserved again at the first device graph"
            }
        );
        // llama.cpp's own log from here on: the reservations are its INFO lines.
        bmoe_engine::set_log_verbose(true);
        let mut s = m
            .session(&SessionOptions {
                n_ctx: 4096,
                n_ubatch: cpu_ubatch,
                n_ubatch_device: device_ubatch,
                ..Default::default()
            })
            .expect("session");
        eprintln!(
            "-- a 2000-token prompt: device pieces, then the CPU's tail and one decode token"
        );
        s.generate(
            &prompt,
            &GenerateOptions {
                n_predict: 1,
                chat: false,
                ..Default::default()
            },
            &CancelToken::new(),
        )
        .expect("generate");
        eprintln!("-- held when the context is freed");
        drop(s);
    }
}
