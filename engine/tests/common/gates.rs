//! The gates every architecture goes through, shared by the gate tests and the architecture
//! coverage test: G1/G2/G3/S1/G19 (streamed == resident) and G16/G17f (the device arena on the
//! loopback device == the CPU) and G28 (the KV cache and recurrent state moved out of llama.cpp's
//! buffers), bit for bit.
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};

use bmoe_engine::test_support::start_loopback_server;
use bmoe_engine::Device;
use bmoe_engine::Prefetch;
use bmoe_engine::Repack;
use bmoe_engine::{
    CancelToken, DecideRequest, GateKnobs, GenerateOptions, LoadOptions, Model, PrefillOptions,
    SessionOptions, StreamCounters, StreamOptions,
};

/// What a run produced, compared bit for bit.
#[derive(Debug, PartialEq)]
pub struct Outcome {
    pub generated: Vec<Vec<u8>>,
    pub nll_bits: u64,
    pub logp_bits: Vec<u64>,
}

const STREAM_PROMPTS: [&str; 3] = [
    "Stream the experts, please.",
    "A second prompt routes elsewhere.",
    "And a third, longer one that goes through several ubatch pieces of the prompt.",
];

/// Streaming options for the gates: `cache_mb` (0 = shared slots), two reader lanes.
pub fn stream(cache_mb: u64, read_all: bool) -> Option<StreamOptions> {
    Some(StreamOptions {
        cache: bmoe_engine::CacheBudget::Mib(cache_mb),
        io_threads: 2,
        read_all_experts: read_all,
        ..Default::default()
    })
}

/// Compute threads of every gate session. One by default: the harness runs two tests at once on
/// this 2-core machine, and four compute threads on two cores spin in ggml's barriers waiting for
/// a core (docs/benchmarks.md, "The test suite, cold"). A binary whose one test runs alone sets 2
/// (tests/two_threads.rs), so the gates also hold where the threads split each graph's work.
static THREADS: AtomicU32 = AtomicU32::new(1);

/// Sets the compute threads of every gate session in this test process.
pub fn set_threads(n: u32) {
    THREADS.store(n, Ordering::Relaxed);
}

/// Runs several generates, a perplexity and a decision in one session (S1 lives here), with
/// every weight in the file's layout (`repack = off`).
pub fn stream_run(path: &Path, stream: Option<StreamOptions>) -> (Outcome, StreamCounters) {
    let (out, c, _) = stream_run_repack(path, stream, Repack::Off);
    (out, c)
}

/// `stream_run` with `repack` as given; also the weight tensors the load left in the CPU's
/// repacked layout (`LoadStats::repacked`).
pub fn stream_run_repack(
    path: &Path,
    stream: Option<StreamOptions>,
    repack: Repack,
) -> (Outcome, StreamCounters, usize) {
    let lean = stream.as_ref().is_some_and(|s| !s.llama_load);
    let m = Model::load(&LoadOptions {
        stream,
        repack,
        ..LoadOptions::new(path)
    })
    .expect("load");
    // Every model of the set loads streamed without reading an expert, so the gates hold that
    // load to llama.cpp's, which the resident run uses.
    assert_eq!(m.lean_load().is_some(), lean, "{:?}", m.warnings());
    let mut s = m
        .session(&SessionOptions {
            threads: THREADS.load(Ordering::Relaxed),
            // Narrow pieces: with many experts a piece routes to only some of them.
            n_ubatch: 8,
            ..super::session_opts()
        })
        .unwrap();
    let opts = GenerateOptions {
        n_predict: 12,
        ..Default::default()
    };
    let generated = STREAM_PROMPTS
        .iter()
        .map(|p| s.generate(p, &opts, &CancelToken::new()).unwrap().bytes)
        .collect();
    let ppl = s
        .perplexity(&"Perplexity text for the gate. ".repeat(3))
        .unwrap();
    let d = s
        .decide(&DecideRequest {
            prefix: "Choose. ".into(),
            suffix: "A, B or C?".into(),
            choices: vec!["A".into(), "B".into(), "C".into()],
            ..Default::default()
        })
        .unwrap();
    let out = Outcome {
        generated,
        nll_bits: ppl.nll_mean.to_bits(),
        logp_bits: d.choice_logp.iter().map(|v| v.to_bits()).collect(),
    };
    (out, m.stream_counters(), m.load_stats().repacked.tensors)
}

/// The resident run the stream gates compare against.
pub fn resident(path: &Path) -> Outcome {
    let (r, c) = stream_run(path, None);
    assert_eq!(c.read_bytes, 0);
    r
}

/// G1: no cache, shared slots reused by every layer. Returns the counters.
pub fn g1(path: &Path, resident: &Outcome) -> StreamCounters {
    let (g1, c1) = stream_run(path, stream(0, false));
    assert_eq!(
        &g1, resident,
        "G1: streamed (cache off) differs from resident"
    );
    assert!(c1.read_bytes > 0 && c1.cache_hits == 0);
    c1
}

/// G2: a cache smaller than the model's experts, so it must evict; and G19: reads ahead (the
/// router's prediction read from the first token on, an always-wrong one, none) never change a
/// result. The default `router` reads only once its candidates prove mostly misses, which the
/// random routing of the tiny presets rarely does.
pub fn g2(path: &Path, resident: &Outcome) {
    let (g2, c2) = stream_run(path, stream(1, false));
    assert_eq!(
        &g2, resident,
        "G2: streamed (evicting cache) differs from resident"
    );
    assert!(c2.evictions > 0, "G2 must evict: {c2:?}");
    assert!(c2.cache_hits > 0, "G2 must hit sometimes: {c2:?}");
    // The budget now: 1 MiB, and while `router` pauses its reads ahead, their staging (one
    // layer's routed experts, well under 1 MiB on the tiny presets) lent to the cache.
    assert!(
        c2.resident_bytes <= c2.budget_bytes && c2.budget_bytes < 2 << 20,
        "{c2:?}"
    );
    assert!(c2.predicted_routed > 0, "G2 must score predictions: {c2:?}");
    assert!(c2.predict_s > 0.0, "G2's predictions must be timed: {c2:?}");
    for mode in [Prefetch::Eager, Prefetch::Wrong, Prefetch::Off] {
        let (g, c) = stream_run(
            path,
            Some(StreamOptions {
                prefetch: mode,
                ..stream(1, false).unwrap()
            }),
        );
        assert_eq!(&g, resident, "G19: prefetch {mode:?} differs from resident");
        match mode {
            Prefetch::Off => {
                assert_eq!(c.prefetched, 0);
                assert_eq!(c.predict_s, 0.0, "prefetch off must not predict: {c:?}");
            }
            _ => assert!(c.prefetched > 0, "{c:?}"),
        }
        eprintln!(
            "G19 {}: prefetch {mode:?}: {} read ahead, {} misses served by them of {} (router: {} read ahead, {} of {})",
            path.display(),
            c.prefetched,
            c.prefetch_used,
            c.cache_misses,
            c2.prefetched,
            c2.prefetch_used,
            c2.cache_misses
        );
    }
}

/// G3: reading every expert gives the same as reading only the routed ones, and reads more.
pub fn g3(path: &Path, resident: &Outcome, g1: &StreamCounters) {
    let (g3, c3) = stream_run(path, stream(0, true));
    assert_eq!(&g3, resident, "G3: reading every expert differs");
    assert!(
        c3.read_bytes > g1.read_bytes,
        "selective must read less: {} vs {}",
        g1.read_bytes,
        c3.read_bytes
    );
}

/// G1, G2 (with G19), G3 and S1 on one model.
pub fn stream_gates(path: &Path) {
    let r = resident(path);
    let c1 = g1(path, &r);
    g2(path, &r);
    g3(path, &r, &c1);
}

/// A loopback device of the calling test's own: an in-process ggml RPC server fronting the CPU
/// backend on 127.0.0.1 (same kernels: placement is the only difference).
///
/// One server per test, never shared: ggml's RPC client keeps one connection per server for the
/// whole process and replays a device's last graph by its id, while the server drops its stored
/// graphs whenever any buffer on that connection is freed. Two tests running in parallel on one
/// server therefore abort the process ("Remote RPC server crashed or returned malformed
/// response") as soon as one frees a buffer between the other's two identical decode graphs; the
/// clean-clone CI on ddd5aff did. bmoe runs one model at a time on a device, as each test now does.
pub fn loopback() -> String {
    // One server thread: the client computes its own pieces beside it, and on a 2-core machine
    // a second server thread spun in ggml's barrier waiting for a core (85% of the samples;
    // the device gates ran 4x slower). The kernels give the same bits at any thread count.
    let endpoint = start_loopback_server(Device::cpu().unwrap(), 1).expect("loopback server");
    let devs = bmoe_engine::add_rpc_server(&endpoint).expect("add server");
    assert_eq!(devs.len(), 1);
    assert_eq!(devs[0].description, endpoint);
    devs[0].name.clone()
}

const ARENA_PROMPTS: [&str; 2] = [
    "The arena holds two layers of the model at a time while the device computes.",
    "A second prompt in the same session, routed a little differently from the first one.",
];

/// Pieces of 16 on both sides, one compute thread (see `stream_run`).
pub fn narrow() -> SessionOptions {
    SessionOptions {
        threads: 1,
        n_ubatch: 16,
        n_ubatch_device: 16,
        ..super::session_opts()
    }
}

/// Two generates, a perplexity and a decision in one session, pieces of 16 (wide ones on the
/// device when it has one).
pub fn arena_run(m: &Model) -> Outcome {
    let mut s = m.session(&narrow()).unwrap();
    let opts = GenerateOptions {
        n_predict: 8,
        ..Default::default()
    };
    let generated = ARENA_PROMPTS
        .iter()
        .map(|p| s.generate(p, &opts, &CancelToken::new()).unwrap().bytes)
        .collect();
    let ppl = s
        .perplexity(&"Perplexity through a streamed arena, piece by piece. ".repeat(3))
        .unwrap();
    let d = s
        .decide(&DecideRequest {
            prefix: "Choose one of the letters below, then stop. ".repeat(2),
            suffix: "A, B or C?".into(),
            choices: vec!["A".into(), "B".into(), "C".into()],
            ..Default::default()
        })
        .unwrap();
    Outcome {
        generated,
        nll_bits: ppl.nll_mean.to_bits(),
        logp_bits: d.choice_logp.iter().map(|v| v.to_bits()).collect(),
    }
}

/// Prefill on `name`, pieces of at least 8 tokens, three loaders, routed reads or whole layers.
pub fn device(name: &str, routed: bool) -> PrefillOptions {
    PrefillOptions {
        device: name.into(),
        min_tokens: 8,
        loaders: 3,
        routed,
        ..Default::default()
    }
}

/// Loads `path` with the given streaming and prefill options.
pub fn load(path: &Path, stream: Option<StreamOptions>, p: Option<PrefillOptions>) -> Model {
    Model::load(&LoadOptions {
        stream,
        prefill: p,
        // The all-CPU reference in the file's layout, as the arena's runs compute (issue 32).
        repack: Repack::Off,
        ..LoadOptions::new(path)
    })
    .expect("load")
}

/// G16: wide pieces through the arena on the loopback device equal the all-CPU run, resident
/// and streamed (with and without a cache), whole layers and routed reads.
pub fn g16(path: &Path) {
    let name = loopback();
    let cpu = arena_run(&load(path, None, None));
    for (stream, routed) in [
        (None, false),
        (None, true),
        (stream(0, false), false),
        (stream(16, false), true),
    ] {
        let m = load(path, stream.clone(), Some(device(&name, routed)));
        assert_eq!(
            m.info().prefill_device.as_deref(),
            Some(name.as_str()),
            "{:?}",
            m.warnings()
        );
        assert_eq!(
            arena_run(&m),
            cpu,
            "G16: device prefill differs from the CPU (stream {stream:?}, routed {routed})"
        );
        let c = m.prefill_dev_counters();
        assert!(c.tokens > 0 && c.nodes > 0 && c.read_bytes > 0, "{c:?}");
    }
}

/// G28 on any model: with the gate knob `kv_stand_in` every session moves its memory (K/V, and
/// R/S of recurrent layers) out of llama.cpp's buffers, whose pages stay released after a call's
/// memory clear, and the results equal the CPU's, resident and streamed.
pub fn g28(path: &Path) {
    let name = loopback();
    let cpu = arena_run(&load(path, None, None));
    for stream in [None, stream(16, false)] {
        let p = PrefillOptions {
            gate: GateKnobs {
                kv_stand_in: true,
                ..Default::default()
            },
            ..device(&name, true)
        };
        let m = load(path, stream.clone(), Some(p));
        assert_eq!(
            arena_run(&m),
            cpu,
            "G28: a run with the memory moved differs from the CPU (stream {stream:?})"
        );
        let mut s = m.session(&narrow()).unwrap();
        let opts = GenerateOptions {
            n_predict: 2,
            ..Default::default()
        };
        s.generate("G28", &opts, &CancelToken::new()).unwrap();
        let moved = s.moved_memory().expect("G28: the memory must move");
        assert!(
            moved.tensors > 0 && moved.old_resident_bytes == 0,
            "G28: {moved:?}"
        );
    }
}

/// G17f: the routed arena with the fallback disabled reads fewer bytes than whole layers and
/// stays identical, for a streamed and for a resident model. `path` must route a piece to a
/// minority of each layer's experts (many experts, few used).
pub fn g17f(path: &Path) {
    let name = loopback();
    let cpu = arena_run(&load(path, None, None));
    for stream in [stream(0, false), None] {
        let whole = load(path, stream.clone(), Some(device(&name, false)));
        assert_eq!(
            arena_run(&whole),
            cpu,
            "G17: whole layers, stream {stream:?}"
        );
        let routed = load(
            path,
            stream.clone(),
            Some(PrefillOptions {
                routed_full: 1.0,
                ..device(&name, true)
            }),
        );
        assert_eq!(arena_run(&routed), cpu, "G17f: routed, stream {stream:?}");
        let (w, r) = (whole.prefill_dev_counters(), routed.prefill_dev_counters());
        assert!(
            r.read_bytes < w.read_bytes,
            "G17f: routed read {} bytes, whole layers {}",
            r.read_bytes,
            w.read_bytes
        );
        assert!(r.routed > 0 && r.demand > 0, "{r:?}");
        assert_eq!(
            w.demand, 0,
            "whole layers leave nothing to read at the routing node"
        );
    }
}
