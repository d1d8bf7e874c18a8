//! Expert-streaming gates, bit for bit against the resident (mmap) run on synthetic models:
//! G1 cache off, G2 an evicting cache, G3 selective == reading every expert, S1 several calls
//! in one session, G19 reads ahead (router prediction, an always-wrong one, none) change nothing;
//! qwen3moe, olmoe and a split GGUF. Plus the failure path.
mod common;

use std::path::{Path, PathBuf};

use bmoe_engine::stream::prefetch::Prefetch;
use bmoe_engine::synth::{write_model, Preset, SynthArch, SynthSpec};
use bmoe_engine::{
    CancelToken, DecideRequest, DenseWeights, EngineError, GenerateOptions, LoadOptions, Model,
    StreamOptions,
};

const PROMPTS: [&str; 3] = [
    "Stream the experts, please.",
    "A second prompt routes elsewhere.",
    "And a third, longer one that goes through several ubatch pieces of the prompt.",
];

/// What a run produced, compared bit for bit.
#[derive(Debug, PartialEq)]
struct Outcome {
    generated: Vec<Vec<u8>>,
    nll_bits: u64,
    logp_bits: Vec<u64>,
}

fn stream(cache_mb: u64, read_all: bool) -> Option<StreamOptions> {
    Some(StreamOptions {
        cache_mb,
        io_threads: 2,
        read_all_experts: read_all,
        ..Default::default()
    })
}

/// Runs several generates, a perplexity and a decision in one session (S1 lives here).
fn run(path: &Path, stream: Option<StreamOptions>) -> (Outcome, bmoe_engine::StreamCounters) {
    let lean = stream.as_ref().is_some_and(|s| !s.llama_load);
    let m = Model::load(&LoadOptions {
        stream,
        ..LoadOptions::new(path)
    })
    .expect("load");
    // Every model of the set (the split GGUF too) loads streamed without reading an expert, so
    // the gates hold that load to llama.cpp's, which the resident run uses.
    assert_eq!(m.lean_load().is_some(), lean, "{:?}", m.warnings());
    let mut s = m
        .session(&bmoe_engine::SessionOptions {
            // One compute thread: on a 2-core VM, direct-read interrupts make two threads spin in
            // ggml's barriers for milliseconds per graph split (docs/streaming.md); results are the
            // same, only slower.
            threads: 1,
            // Narrow pieces: with many experts a piece routes to only some of them.
            n_ubatch: 8,
            ..common::session_opts()
        })
        .unwrap();
    let opts = GenerateOptions {
        n_predict: 12,
        ..Default::default()
    };
    let generated = PROMPTS
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
    (out, m.stream_counters())
}

fn gates(path: &Path) {
    let (resident, rc) = run(path, None);
    assert_eq!(rc.read_bytes, 0);

    // G1: no cache, shared slots reused by every layer.
    let (g1, c1) = run(path, stream(0, false));
    assert_eq!(
        g1, resident,
        "G1: streamed (cache off) differs from resident"
    );
    assert!(c1.read_bytes > 0 && c1.cache_hits == 0);

    // G2: a cache smaller than the model's experts, so it must evict.
    let (g2, c2) = run(path, stream(1, false));
    assert_eq!(
        g2, resident,
        "G2: streamed (evicting cache) differs from resident"
    );
    assert!(c2.evictions > 0, "G2 must evict: {c2:?}");
    assert!(c2.cache_hits > 0, "G2 must hit sometimes: {c2:?}");
    assert!(c2.resident_bytes <= 1 << 20);

    // G19: reads ahead never change a result. G2 ran with the router's prediction (the default);
    // a prediction that is always wrong (the experts the next router ranks lowest) and no
    // prediction at all give the same bits, with the same evicting cache.
    assert!(c2.prefetched > 0, "G2 must read ahead: {c2:?}");
    for mode in [Prefetch::Wrong, Prefetch::Off] {
        let (g, c) = run(
            path,
            Some(StreamOptions {
                prefetch: mode,
                ..stream(1, false).unwrap()
            }),
        );
        assert_eq!(g, resident, "G19: prefetch {mode:?} differs from resident");
        match mode {
            Prefetch::Off => assert_eq!(c.prefetched, 0),
            _ => assert!(c.prefetched > 0, "{c:?}"),
        }
        eprintln!(
            "G19 {}: prefetch {mode:?}: {} read ahead, {} misses served by them of {} (router: {} of {})",
            path.display(),
            c.prefetched,
            c.prefetch_used,
            c.cache_misses,
            c2.prefetch_used,
            c2.cache_misses
        );
    }

    // G3: reading every expert gives the same as reading only the routed ones, and reads more.
    let (g3, c3) = run(path, stream(0, true));
    assert_eq!(g3, resident, "G3: reading every expert differs");
    assert!(
        c3.read_bytes > c1.read_bytes,
        "selective must read less: {} vs {}",
        c1.read_bytes,
        c3.read_bytes
    );
}

#[test]
fn gates_qwen3moe() {
    gates(&common::tiny());
}

#[test]
fn gates_olmoe() {
    gates(&common::tiny_olmoe());
}

#[test]
fn gates_many_experts() {
    // 64 experts, top-2: an 8-token piece routes to a minority of them, so reading the ids
    // wrongly (e.g. as if the routing view were contiguous) loads the wrong experts.
    let spec = SynthSpec {
        n_expert: 64,
        ..SynthSpec::preset(Preset::Tiny, SynthArch::Qwen3Moe)
    };
    gates(&common::model("many-experts", &spec));
}

#[test]
fn gates_split_gguf() {
    let dir = common::dir().join("split-stream");
    let r = write_model(
        &SynthSpec {
            split: 3,
            ..SynthSpec::preset(Preset::Tiny, SynthArch::Qwen3Moe)
        },
        &dir.join("m.gguf"),
    )
    .unwrap();
    gates(&r.files[0]);
}

#[test]
fn a_dense_model_is_refused_for_streaming_and_runs_without_it() {
    let p = common::model(
        "dense-llama",
        &SynthSpec::preset(Preset::Tiny, SynthArch::Llama),
    );
    let m = Model::load(&LoadOptions::new(&p)).unwrap();
    assert_eq!((m.info().arch.as_str(), m.info().n_expert), ("llama", 0));
    let e = Model::load(&LoadOptions {
        stream: stream(0, false),
        ..LoadOptions::new(&p)
    })
    .err()
    .unwrap();
    assert!(matches!(e, EngineError::Unsupported(_)), "{e}");
    assert!(e.to_string().contains("mixture-of-experts"), "{e}");
}

#[test]
fn a_cache_below_the_cliff_is_warned_about() {
    let m = Model::load(&LoadOptions {
        stream: stream(0, false),
        ..LoadOptions::new(common::tiny())
    })
    .unwrap();
    assert!(m.warnings().iter().all(|w| !w.contains("cliff")));
    // The tiny model routes 0.4 MiB per token: 1 MiB is above; build a wider one where it is not.
    let spec = SynthSpec {
        n_ff_exp: 512,
        n_embd: 256,
        ..SynthSpec::preset(Preset::Tiny, SynthArch::Qwen3Moe)
    };
    let p = common::model("cliff", &spec);
    let m = Model::load(&LoadOptions {
        stream: stream(1, false),
        ..LoadOptions::new(&p)
    })
    .unwrap();
    assert!(
        m.warnings().iter().any(|w| w.contains("cliff")),
        "{:?}",
        m.warnings()
    );
}

#[test]
fn a_failed_read_stops_the_decode_and_the_session_recovers() {
    let src = common::tiny();
    let p: PathBuf = common::dir().join("will-shrink.gguf");
    std::fs::copy(&src, &p).unwrap();
    let full = std::fs::read(&p).unwrap();
    let opts = GenerateOptions {
        n_predict: 20,
        ..Default::default()
    };
    let resident = Model::load(&LoadOptions::new(&src))
        .unwrap()
        .session(&common::session_opts())
        .unwrap()
        .generate(PROMPTS[0], &opts, &CancelToken::new())
        .unwrap()
        .bytes;
    let m = Model::load(&LoadOptions {
        // Dense weights copied out, so only expert reads touch the file after load.
        stream: Some(StreamOptions {
            dense_weights: DenseWeights::Anon,
            ..stream(0, false).unwrap()
        }),
        ..LoadOptions::new(&p)
    })
    .unwrap();
    let mut s = m.session(&common::session_opts()).unwrap();
    // Cut the file under the engine: expert reads come up short.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(4096)
        .unwrap();
    let e = s
        .generate(PROMPTS[0], &opts, &CancelToken::new())
        .err()
        .unwrap();
    assert!(matches!(e, EngineError::Stream(_)), "{e}");
    assert!(e.to_string().contains("layer"), "{e}");
    // Put the bytes back: the same session works and matches the resident run.
    std::fs::write(&p, &full).unwrap();
    let r = s.generate(PROMPTS[0], &opts, &CancelToken::new()).unwrap();
    assert_eq!(r.bytes, resident);
}
