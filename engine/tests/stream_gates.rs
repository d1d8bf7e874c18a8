//! Expert-streaming gates, bit for bit against the resident (mmap) run on synthetic models:
//! G1 cache off, G2 an evicting cache, G3 selective == reading every expert, S1 several calls
//! in one session, G19 reads ahead (router prediction, an always-wrong one, none) change nothing;
//! a 64-expert model, page-aligned expert slices and a split GGUF (each architecture's tiny model:
//! tests/archs.rs). Plus the failure path.
mod common;

use std::path::{Path, PathBuf};

use bmoe_engine::{
    CancelToken, DenseWeights, EngineError, GenerateOptions, LoadOptions, Model, Prefetch,
    StreamOptions,
};
use bmoe_synth::{write_model, Preset, SynthArch, SynthSpec};
use common::gates::stream;

const PROMPTS: [&str; 1] = ["Stream the experts, please."];

fn gates(path: &Path) {
    common::gates::stream_gates(path);
}

// The tiny model of every architecture (qwen3moe and olmoe among them) goes through these gates
// in tests/archs.rs.

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
fn gates_page_aligned_experts() {
    // Q4_0 experts 256 x 256: each expert slice is 36,864 bytes, 9 whole pages, so a read ahead's
    // pages are moved into the tensor's region (no copy), and so are an evicted expert's pages
    // for the next miss to be read into; a move to the wrong place or of the wrong length, or a
    // recycled slice not read again, changes the bits.
    let spec = SynthSpec {
        n_embd: 256,
        n_ff_exp: 256,
        n_expert: 16,
        expert_type: bmoe_synth::WeightType::Q4_0,
        ..SynthSpec::preset(Preset::Tiny, SynthArch::Qwen3Moe)
    };
    let path = common::model("page-aligned-experts", &spec);
    gates(&path);
    let eager = StreamOptions {
        prefetch: Prefetch::Eager,
        ..stream(1, false).unwrap()
    };
    let (_, c) = common::gates::stream_run(&path, Some(eager));
    assert!(
        c.prefetch_used > 0 && c.prefetch_moved > 0,
        "reads ahead must be moved into place: {c:?}"
    );
    assert!(
        c.evictions > 0 && c.recycled > 0,
        "evicted experts' pages must take the misses' reads: {c:?}"
    );
}

#[test]
fn gates_tied_output() {
    // No output.weight in the file: llama.cpp ties the output to token_embd; the lean load binds
    // the output tensor llama.cpp creates from the header to the embeddings' bytes, so the model
    // loads lean (asserted by the gates) and matches the resident run.
    let spec = SynthSpec {
        tied_output: true,
        ..SynthSpec::preset(Preset::Tiny, SynthArch::Qwen3Moe)
    };
    gates(&common::model("tied-output", &spec));
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
    // The default size, `auto`, whose floor takes all the memory there is (a tight cgroup cap):
    // no cache at all, which the user did not ask for, so it is said and the way out named.
    let m = Model::load(&LoadOptions {
        stream: Some(StreamOptions {
            cache: bmoe_engine::CacheBudget::Auto { floor_mb: 1 << 30 },
            ..stream(0, false).unwrap()
        }),
        ..LoadOptions::new(&p)
    })
    .unwrap();
    assert!(
        m.warnings()
            .iter()
            .any(|w| w.contains("cache_mb = auto") && w.contains("cache_floor_mb")),
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
    let resident = Model::load(&common::in_file_layout(&src))
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

/// A generate's decode-phase counters count the decode graphs' routing alone: every token decoded
/// after the first routes `n_expert_used` experts in each MoE layer, and the prompt's reads stay
/// in the call's totals only.
#[test]
fn decode_counters_leave_the_prompt_out() {
    let m = Model::load(&LoadOptions {
        stream: stream(1, false),
        ..LoadOptions::new(common::tiny())
    })
    .unwrap();
    let rec = m
        .session(&common::session_opts())
        .unwrap()
        .generate(
            "The prompt's own reads are not decode's.",
            &GenerateOptions {
                n_predict: 6,
                ..Default::default()
            },
            &CancelToken::new(),
        )
        .unwrap();
    let (d, all) = (&rec.decode_stream, &rec.stream);
    let info = m.info();
    let graphs = u64::from(rec.timing.n_decoded - 1);
    assert_eq!(
        d.cache_hits + d.cache_misses,
        graphs * u64::from(info.n_layer) * u64::from(info.n_expert_used),
        "{d:?}"
    );
    assert!(
        all.read_bytes > d.read_bytes && all.cache_misses > d.cache_misses,
        "{all:?} vs {d:?}"
    );
    assert!(d.stall_s <= rec.timing.decode_s, "{d:?}");
}

#[test]
fn a_lean_graph_has_the_ops_of_llama_cpps_own_load() {
    // Built from the header alone, llama.cpp creates every optional tensor (biases, scales) the
    // file may lack; the lean load takes them out of the model's layers again, so its graph is the
    // one llama.cpp's own load of the file builds, node for node (left in, each would be an
    // identity op bound to zeros or ones). The gates show the bits stay the same.
    for name in SynthArch::NAMES {
        let arch = SynthArch::parse(name).unwrap();
        if arch == SynthArch::Llama {
            continue;
        }
        let path = common::model(
            &format!("arch-{}", arch.name()),
            &SynthSpec::preset(Preset::Tiny, arch),
        );
        let nodes = |llama_load: bool| {
            let m = Model::load(&LoadOptions {
                stream: Some(StreamOptions {
                    llama_load,
                    ..stream(0, false).unwrap()
                }),
                ..LoadOptions::new(&path)
            })
            .unwrap();
            let lean = m.lean_load();
            assert_eq!(lean.is_some(), !llama_load, "{name}: {:?}", m.warnings());
            if let Some(l) = lean {
                assert_eq!(l.neutral_tensors, 0, "{name}: {l:?}");
            }
            m.load_stats().graph_nodes.unwrap()
        };
        let (lean, llama) = (nodes(false), nodes(true));
        // The synthetic qwen35moe file holds each layer's gate and up experts apart; built from a
        // header, llama.cpp creates the fused gate_up tensor, which the streamer assembles, and
        // its graph splits one matmul's result where llama.cpp's own load runs two.
        if arch == SynthArch::Qwen35Moe {
            assert!(lean > llama, "{name}: {lean} vs {llama}");
            continue;
        }
        assert_eq!(lean, llama, "{name}: graph nodes, lean vs llama.cpp's load");
    }
}

/// `cache_mb = auto` is one formula: what `Model::load` grants is what the engine's plan
/// (`bmoe_engine::plan`, which the runner's placement and `bmoe plan` use) computes for the same
/// options on this machine. The tiny model's experts fit, so both are every expert, rounded up
/// to whole MiB; the formula before the plan gave all the memory available minus the floor.
#[test]
fn auto_at_load_is_the_plans_cache() {
    let path = common::tiny();
    let load = LoadOptions {
        stream: Some(StreamOptions {
            cache: bmoe_engine::CacheBudget::Auto { floor_mb: 64 },
            ..stream(0, false).unwrap()
        }),
        ..LoadOptions::new(&path)
    };
    let plan = bmoe_engine::plan::plan(
        &load,
        &bmoe_engine::SessionOptions::default(),
        bmoe_engine::plan::Memory::this_machine(64),
    )
    .unwrap();
    assert!(plan.cache_mb > 0, "{}", plan.table());
    let m = Model::load(&load).unwrap();
    assert_eq!(m.stream_budget_bytes(), Some(plan.cache_mb << 20));
}

/// A load given a plan takes it as it is (`Model::load_planned`): an `auto` cache is the plan's
/// `cache_mb` (the one formula, here a value no machine formula gives), and the prefill place is
/// the plan's verdict, not resolved again: a device the caller's policy refused stays refused,
/// in the caller's words. Seen red when the load resolved the device itself again.
#[test]
fn a_load_takes_the_plan_it_is_given() {
    let path = common::tiny();
    let load = LoadOptions {
        stream: Some(StreamOptions {
            cache: bmoe_engine::CacheBudget::Auto { floor_mb: 64 },
            ..stream(0, false).unwrap()
        }),
        prefill: Some(bmoe_engine::PrefillOptions {
            device: "CPU".into(),
            ..Default::default()
        }),
        ..LoadOptions::new(&path)
    };
    let mut plan = bmoe_engine::plan::plan(
        &load,
        &bmoe_engine::SessionOptions::default(),
        bmoe_engine::plan::Memory::this_machine(64),
    )
    .unwrap();
    plan.cache_mb = 3;
    plan.prefill = bmoe_engine::plan::PrefillPlace::on_cpu("refused by the caller's policy".into());
    let m = Model::load_planned(&load, &plan).unwrap();
    assert_eq!(m.stream_budget_bytes(), Some(3 << 20));
    let said = m.warnings().join("\n");
    assert!(
        said.contains("prefill device CPU: refused by the caller's policy"),
        "{said}"
    );
}
