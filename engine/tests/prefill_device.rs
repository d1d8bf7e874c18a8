//! Prefill-device resolution and placement. The loopback device is an in-process ggml RPC server
//! fronting the CPU backend on 127.0.0.1 (same kernels: placement is the only difference).
mod common;

use bmoe_engine::{
    CancelToken, DecideRequest, GateKnobs, GenerateOptions, LoadOptions, Model, PrefillOptions,
};

fn run(m: &Model) -> (Vec<u8>, Vec<u64>, u64) {
    let mut s = m
        .session(&bmoe_engine::SessionOptions {
            n_ubatch: 16,
            n_ubatch_device: 16,
            ..common::session_opts()
        })
        .unwrap();
    let g = s
        .generate(
            "Prefill placement",
            &GenerateOptions {
                n_predict: 12,
                ..Default::default()
            },
            &CancelToken::new(),
        )
        .unwrap();
    let d = s
        .decide(&DecideRequest {
            prefix: "Choose. ".repeat(10),
            suffix: "A or B?".into(),
            choices: vec!["A".into(), "B".into()],
            ..Default::default()
        })
        .unwrap();
    (
        g.bytes,
        d.choice_logp.iter().map(|v| v.to_bits()).collect(),
        g.prefill_dev.tokens + d.prefill_dev.tokens,
    )
}

fn with_device(name: &str) -> LoadOptions {
    LoadOptions {
        prefill: Some(PrefillOptions {
            device: name.into(),
            min_tokens: 8,
            ..Default::default()
        }),
        ..LoadOptions::new(common::tiny())
    }
}

#[test]
fn an_unknown_device_leaves_the_run_on_the_cpu_and_says_so() {
    let cpu = run(&Model::load(&common::in_file_layout(common::tiny())).unwrap());
    let m = Model::load(&with_device("HTP0")).unwrap();
    assert_eq!(m.info().prefill_device, None);
    assert!(
        m.warnings()
            .iter()
            .any(|w| w.contains("HTP0 is not in this build's registry")),
        "{:?}",
        m.warnings()
    );
    let r = run(&m);
    assert_eq!(r.2, 0, "prefill_dev_tokens must stay 0");
    assert_eq!(r, cpu);
}

use common::gates::{arena_run as run_all, device, load, loopback, narrow};

/// G16/G17 on the resident model: generate bytes, perplexity bits and decision bits of a run
/// whose wide pieces go through the arena on the loopback device equal the all-CPU run.
#[test]
fn g16_g17_arena_on_the_loopback_device_equals_the_cpu() {
    let name = loopback();
    assert!(name.starts_with("RPC"), "{name}");
    let cpu_model = Model::load(&common::in_file_layout(common::tiny())).unwrap();
    let cpu = run(&cpu_model);
    let m = Model::load(&with_device(&name)).unwrap();
    assert_eq!(m.info().prefill_device.as_deref(), Some(name.as_str()));
    // The loopback device takes every matmul (asked with probe ops): the one line says where the
    // KV cache stays (the RPC device offers no host buffer type).
    assert_eq!(
        m.warnings(),
        [format!(
            "prefill device {name}: the KV cache and recurrent state stay in CPU memory (it offers no host buffer type to move them into); device graphs run their attention on the CPU"
        )]
    );
    let dev = run(&m);
    assert!(dev.2 > 0, "wide pieces must run on the device");
    assert_eq!(
        (&dev.0, &dev.1),
        (&cpu.0, &cpu.1),
        "G16/G17: device prefill differs from the CPU"
    );
    let c = m.prefill_dev_counters();
    assert!(c.nodes > 0 && c.read_bytes > 0, "{c:?}");
    // Norm weights are read by MUL, not a matmul: they go to the plain pair; matrices do not.
    let layout = m.arena_layout().unwrap();
    assert!(
        layout
            .plain_weights
            .iter()
            .any(|n| n == "blk.0.attn_norm.weight")
            && !layout
                .plain_weights
                .iter()
                .any(|n| n.contains("attn_q.weight") || n.contains("exps")),
        "{layout:?}"
    );
    assert!(layout.slot_bytes > 0 && layout.plain_bytes > 0);
    // Several calls in one session, and perplexity (every piece wide) too.
    let text = "Perplexity through the arena. ".repeat(4);
    let narrow = bmoe_engine::SessionOptions {
        n_ubatch: 16,
        n_ubatch_device: 16,
        ..common::session_opts()
    };
    let p_cpu = cpu_model
        .session(&narrow)
        .unwrap()
        .perplexity(&text)
        .unwrap();
    let mut s = m.session(&narrow).unwrap();
    for _ in 0..2 {
        let p_dev = s.perplexity(&text).unwrap();
        assert_eq!(
            p_dev.nll_mean.to_bits(),
            p_cpu.nll_mean.to_bits(),
            "G16: perplexity differs"
        );
        assert!(p_dev.prefill_dev.tokens > 0);
    }
    // The arena reads the same bytes for the same work.
    let a = Model::load(&with_device(&name)).unwrap();
    run(&a);
    let b = Model::load(&with_device(&name)).unwrap();
    run(&b);
    assert_eq!(
        a.prefill_dev_counters().read_bytes,
        b.prefill_dev_counters().read_bytes
    );
}

#[test]
fn a_closed_rpc_port_is_refused_before_ggml_sees_it() {
    let e = bmoe_engine::add_rpc_server("127.0.0.1:1")
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("cannot reach"), "{e}");
}

const PROMPTS: [&str; 1] =
    ["The arena holds two layers of the model at a time while the device computes."];

fn streamed(cache_mb: u64) -> Option<bmoe_engine::StreamOptions> {
    common::gates::stream(cache_mb, false)
}

/// G16 on a streamed model: the arena reads the experts from the GGUF. Output, perplexity and
/// decisions equal the all-CPU run with and without an expert cache and with a slowed loader,
/// and whole-layer reads cost the same bytes every time.
#[test]
fn g16_streamed_arena_equals_the_cpu_with_and_without_a_cache_and_a_slow_loader() {
    let name = loopback();
    let path = common::tiny();
    let cpu = run_all(&load(&path, None, None));
    let mut bytes = Vec::new();
    for (cache_mb, delay_ms) in [(0, 0), (16, 0), (0, 3)] {
        let m = load(
            &path,
            streamed(cache_mb),
            Some(PrefillOptions {
                gate: GateKnobs {
                    loader_delay_ms: delay_ms,
                    ..Default::default()
                },
                ..device(&name, false)
            }),
        );
        let out = run_all(&m);
        assert_eq!(
            out, cpu,
            "G16: cache {cache_mb} MiB, loader delay {delay_ms} ms"
        );
        let c = m.prefill_dev_counters();
        assert!(c.tokens > 0 && c.nodes > 0, "{c:?}");
        assert!(m.stream_counters().read_bytes > 0, "decode still streams");
        bytes.push(c.read_bytes);
    }
    assert!(
        bytes.iter().all(|&b| b == bytes[0] && b > 0),
        "whole-layer arena bytes must not depend on the cache or the loader's speed: {bytes:?}"
    );
    // Routed reads (the default) on the same model: identical output too.
    let m = load(&path, streamed(16), Some(device(&name, true)));
    assert_eq!(run_all(&m), cpu, "G16: routed arena");
}

/// 64 experts, top-2: a 16-token piece routes to a minority of each layer's experts.
fn many_experts() -> std::path::PathBuf {
    common::model(
        "tiny-64-experts",
        &bmoe_synth::SynthSpec {
            n_expert: 64,
            ..bmoe_synth::SynthSpec::preset(
                bmoe_synth::Preset::Tiny,
                bmoe_synth::SynthArch::Qwen3Moe,
            )
        },
    )
}

/// G17f: the routed arena with the fallback disabled reads fewer bytes than whole layers and
/// stays identical, for a streamed and for a resident model.
#[test]
fn g17f_routed_arena_reads_less_and_stays_identical() {
    common::gates::g17f(&many_experts());
}

/// G17g, the negative control: skipping the routing-node reads leaves the experts the prediction
/// missed unread, and the perplexity must change.
#[test]
fn g17g_skipping_the_routing_node_reads_changes_the_result() {
    let name = loopback();
    let path = many_experts();
    let text = "Perplexity through a streamed arena, piece by piece. ".repeat(3);
    let narrow = narrow();
    let nll = |m: &Model| m.session(&narrow).unwrap().perplexity(&text).unwrap();
    let cpu = nll(&load(&path, None, None));
    let ok = load(
        &path,
        streamed(0),
        Some(PrefillOptions {
            routed_full: 1.0,
            ..device(&name, true)
        }),
    );
    assert_eq!(nll(&ok).nll_mean.to_bits(), cpu.nll_mean.to_bits());
    let broken = load(
        &path,
        streamed(0),
        Some(PrefillOptions {
            routed_full: 1.0,
            gate: GateKnobs {
                skip_demand_reads: true,
                ..Default::default()
            },
            ..device(&name, true)
        }),
    );
    let b = nll(&broken);
    assert_ne!(
        b.nll_mean.to_bits(),
        cpu.nll_mean.to_bits(),
        "G17g: without the routing-node reads the result must change"
    );
}

/// A failed expert read in the arena fails the call with a device error (no compute on a slot
/// that did not fill, no panic), every weight goes back to the host, and the same session works
/// again once the file is whole.
#[test]
fn a_failed_arena_read_fails_the_call_and_the_session_recovers() {
    let name = loopback();
    let src = common::tiny();
    let p = common::dir().join("arena-will-shrink.gguf");
    std::fs::copy(&src, &p).unwrap();
    let full = std::fs::read(&p).unwrap();
    let cpu = run_all(&load(&src, None, None));
    let m = load(
        &p,
        Some(bmoe_engine::StreamOptions {
            // Dense weights copied out, so only expert reads touch the file after load.
            dense_weights: bmoe_engine::DenseWeights::Anon,
            ..streamed(0).unwrap()
        }),
        Some(device(&name, true)),
    );
    let mut s = m.session(&narrow()).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(4096)
        .unwrap();
    let opts = GenerateOptions {
        n_predict: 8,
        ..Default::default()
    };
    let e = s
        .generate(PROMPTS[0], &opts, &CancelToken::new())
        .expect_err("a short read must fail the call");
    assert!(matches!(e, bmoe_engine::EngineError::Device(_)), "{e}");
    assert!(e.to_string().contains("reading experts"), "{e}");
    std::fs::write(&p, &full).unwrap();
    drop(s);
    assert_eq!(
        run_all(&m),
        cpu,
        "after the failure the model runs as before"
    );
}

/// A matrix type the device's matmul refuses (here made so with the gate knob, since the loopback
/// device takes every type) is carried to the device converted once at load to the nearest type
/// it takes: the run says so, the device computes, the result stays close to the CPU's (not
/// identical: the device copy is F16), and the CPU's own weights are untouched afterwards.
#[test]
fn a_refused_weight_type_is_converted_for_the_device_copy_only() {
    // F32 norms and matrices of the tiny model -> F16.
    converted_gate(&common::tiny(), "f32", "f16");
    // The specification's quantized path: Q6_K dense matrices -> Q8_0.
    let q6k = common::model(
        "tiny-q6k-dense",
        &bmoe_synth::SynthSpec {
            n_embd: 256,
            dense_type: bmoe_synth::WeightType::Q6_K,
            ..bmoe_synth::SynthSpec::preset(
                bmoe_synth::Preset::Tiny,
                bmoe_synth::SynthArch::Qwen3Moe,
            )
        },
    );
    converted_gate(&q6k, "q6_K", "q8_0");
}

/// Loads `path` with the device's matmul made to refuse `from` (gate knob): the device copy is
/// `to`, the device computes, the perplexity stays close to the CPU's, and the CPU's own weights
/// come back bit for bit for the pieces it runs.
fn converted_gate(path: &std::path::Path, from: &str, to: &str) {
    let name = loopback();
    let path = path.to_path_buf();
    let text = "Perplexity through a converted arena, piece by piece. ".repeat(3);
    let narrow = narrow();
    let cpu_model = load(&path, None, None);
    let cpu = cpu_model
        .session(&narrow)
        .unwrap()
        .perplexity(&text)
        .unwrap();
    let m = load(
        &path,
        None,
        Some(PrefillOptions {
            gate: GateKnobs {
                refuse_types: vec![from.into()],
                ..Default::default()
            },
            ..device(&name, true)
        }),
    );
    assert!(
        m.warnings().iter().any(
            |w| w.contains(&format!("does not take {from}")) && w.contains(&format!("as {to}"))
        ),
        "{:?}",
        m.warnings()
    );
    let p = m.session(&narrow).unwrap().perplexity(&text).unwrap();
    assert!(
        p.prefill_dev.tokens > 0 && p.prefill_dev.nodes > 0,
        "{:?}",
        p.prefill_dev
    );
    assert!(
        (p.nll_mean - cpu.nll_mean).abs() < 0.05,
        "converted device copy ({from} -> {to}): nll {} vs CPU {}",
        p.nll_mean,
        cpu.nll_mean
    );
    // Pieces narrower than min_tokens run on the CPU: its weights were restored bit for bit.
    let short = GenerateOptions {
        n_predict: 6,
        chat: false,
        ..Default::default()
    };
    let gen = |m: &Model| {
        m.session(&narrow)
            .unwrap()
            .generate("Hi", &short, &CancelToken::new())
            .unwrap()
            .bytes
    };
    let (a, b) = (gen(&m), gen(&cpu_model));
    assert_eq!(a, b);
    assert_eq!(
        m.prefill_dev_counters().tokens,
        p.prefill_dev.tokens,
        "the short prompt stayed on the CPU"
    );
}

/// G18b on the loopback prefill device: fifty decisions (repeat, extend, shrink, mid-word edits)
/// with reuse, wide pieces through the arena. `auto` equals the all-CPU run without reuse bit
/// for bit; `on` keeps every `best`.
#[test]
fn g18b_prefix_reuse_on_the_loopback_device() {
    use bmoe_engine::{PrefixReuse, SessionOptions};
    let name = loopback();
    let replay = |m: &Model, reuse: PrefixReuse| -> Vec<bmoe_engine::DecideRecord> {
        let mut s = m
            .session(&SessionOptions {
                prefix_reuse: reuse,
                ..narrow()
            })
            .unwrap();
        common::trace()
            .iter()
            .map(|r| s.decide(r).unwrap())
            .collect()
    };
    let cpu = Model::load(&common::in_file_layout(common::tiny())).unwrap();
    let off = replay(&cpu, PrefixReuse::Off);
    drop(cpu);
    let m = load(&common::tiny(), None, Some(device(&name, true)));
    let auto = replay(&m, PrefixReuse::Auto);
    let on = replay(&m, PrefixReuse::On);
    assert!(
        m.prefill_dev_counters().tokens > 0,
        "wide pieces must run on the device"
    );
    for (i, ((a, b), c)) in off.iter().zip(&on).zip(&auto).enumerate() {
        let bits = |r: &bmoe_engine::DecideRecord| -> Vec<u64> {
            r.choice_logp.iter().map(|v| v.to_bits()).collect()
        };
        assert_eq!(
            bits(a),
            bits(c),
            "decision {i}: auto on the device != cpu off"
        );
        assert_eq!(a.best, b.best, "decision {i}: best differs with reuse on");
    }
    assert!(on.iter().map(|r| r.n_reused).sum::<u32>() > 0);
}

/// Milliseconds each loader job sleeps in the wait controls: every layer's reads take several
/// times that, while the device computes a layer of the tiny model in well under one, so a graph
/// that does not wait always computes on a slot that has not filled yet.
const SLOW_LOADER_MS: u64 = 20;

/// G20/G21, the negative controls of the arena's two waits: with a slow loader, skipping the
/// wait at a layer's last node (for the next layer's non-expert weights, G20) or at a routing
/// node (for the layer's experts, G21) must change the perplexity, while the same slow loader
/// with both waits in place gives the CPU's bits. So the waits are what keeps G16/G17 identical,
/// not the loaders' speed: a regression in either cannot pass them by timing luck.
#[test]
fn g20_g21_skipping_either_arena_wait_with_a_slow_loader_changes_the_result() {
    let name = loopback();
    let path = common::tiny();
    let text = "Perplexity through a slow arena, piece by piece. ".repeat(2);
    let narrow = narrow();
    let nll = |m: &Model| {
        let p = m.session(&narrow).unwrap().perplexity(&text).unwrap();
        assert!(p.prefill_dev.tokens > 0, "{:?}", p.prefill_dev);
        p.nll_mean.to_bits()
    };
    let cpu = cpu_nll(&path, &text);
    let slow = |skip_layer_wait, skip_expert_wait| {
        load(
            &path,
            None,
            Some(PrefillOptions {
                gate: GateKnobs {
                    loader_delay_ms: SLOW_LOADER_MS,
                    skip_layer_wait,
                    skip_expert_wait,
                    ..Default::default()
                },
                ..device(&name, false)
            }),
        )
    };
    assert_eq!(
        nll(&slow(false, false)),
        cpu,
        "the slow loader alone must not change the result"
    );
    assert_ne!(
        nll(&slow(true, false)),
        cpu,
        "G20: without the wait at the previous layer's last node the result must change"
    );
    assert_ne!(
        nll(&slow(false, true)),
        cpu,
        "G21: without the wait at the routing node the result must change"
    );
}

/// The all-CPU perplexity of `text` (pieces of 16, one thread), as bits.
fn cpu_nll(path: &std::path::Path, text: &str) -> u64 {
    load(path, None, None)
        .session(&narrow())
        .unwrap()
        .perplexity(text)
        .unwrap()
        .nll_mean
        .to_bits()
}

/// G22: a device graph that skips or reorders a pacing point (a last node or a routing node the
/// arena does not see where it should, made so with the gate knob `pacing_faults`) fails the call
/// with a device error that says so, instead of computing on a slot that did not fill; the weights
/// go back to the host, so the model's CPU pieces give the CPU's bits afterwards.
#[test]
fn g22_a_skipped_or_reordered_pacing_point_fails_the_call() {
    use bmoe_engine::PacingFault;
    let name = loopback();
    let path = common::tiny();
    let cpu_model = load(&path, None, None);
    let n_layer = cpu_model.info().n_layer;
    assert!(n_layer >= 3, "{n_layer}");
    let text = "Perplexity through an arena that loses its place. ".repeat(2);
    let short = GenerateOptions {
        n_predict: 6,
        chat: false,
        ..Default::default()
    };
    let gen = |m: &Model| {
        m.session(&narrow())
            .unwrap()
            .generate("Hi", &short, &CancelToken::new())
            .unwrap()
            .bytes
    };
    let on_cpu = gen(&cpu_model);
    for fault in [
        PacingFault::DropLast(0),
        PacingFault::DropLast(n_layer - 1),
        PacingFault::DropRouting(1),
        PacingFault::SwapLast(0, 1),
        PacingFault::SwapLast(1, 2),
    ] {
        let m = load(
            &path,
            None,
            Some(PrefillOptions {
                gate: GateKnobs {
                    pacing_faults: vec![fault],
                    ..Default::default()
                },
                ..device(&name, true)
            }),
        );
        let Err(e) = m.session(&narrow()).unwrap().perplexity(&text) else {
            panic!("{fault:?}: a skipped or reordered pacing point must fail the call");
        };
        assert!(
            matches!(e, bmoe_engine::EngineError::Device(_))
                && e.to_string().contains("a pacing point was skipped"),
            "{fault:?}: {e}"
        );
        assert_eq!(gen(&m), on_cpu, "{fault:?}: weights back on the host");
    }
}

/// Loads the tiny model with `stream` and `prefill`, checks two generates, a perplexity and a
/// decision give `cpu`'s bits, and returns the arena's counters.
fn counters_of_an_identical_run(
    stream: Option<bmoe_engine::StreamOptions>,
    prefill: PrefillOptions,
    cpu: &common::gates::Outcome,
    what: &str,
) -> bmoe_engine::PrefillDevCounters {
    let m = load(&common::tiny(), stream, Some(prefill));
    assert_eq!(&run_all(&m), cpu, "{what}");
    m.prefill_dev_counters()
}

/// G23, the routed-full fallback: a layer routing to more than `routed_full` of its experts gets
/// the next layer read whole. On the tiny model (8 experts, top-2) a 16-token piece routes to
/// nearly all of them, so with the default 0.85 it fires, is counted (`whole_fallback`), and the
/// result stays identical; with the fallback off (1.0) it never fires and the missed experts are
/// read at the routing nodes instead.
#[test]
fn g23_the_routed_full_fallback_fires_is_counted_and_stays_identical() {
    let name = loopback();
    let path = common::tiny();
    let cpu = run_all(&load(&path, None, None));
    let run = |routed_full: f64| {
        let prefill = PrefillOptions {
            routed_full,
            ..device(&name, true)
        };
        counters_of_an_identical_run(
            streamed(0),
            prefill,
            &cpu,
            &format!("routed_full {routed_full}"),
        )
    };
    let (fallback, off) = (run(0.85), run(1.0));
    assert!(
        fallback.whole_fallback > 0,
        "the fallback must fire: {fallback:?}"
    );
    assert_eq!(off.whole_fallback, 0, "{off:?}");
    assert!(
        fallback.demand < off.demand,
        "layers read whole leave less to read at the routing node: {fallback:?} vs {off:?}"
    );
}

/// llama.cpp's own offload (every layer on the device), the compute floor of
/// `scripts/bench-prefill`: on the loopback device it gives the CPU's bits; combined with
/// streaming or a prefill device it is refused before anything loads.
#[test]
fn offload_to_the_loopback_device_equals_the_cpu_and_collides_with_streaming() {
    let name = loopback();
    let path = common::tiny();
    let cpu = run(&Model::load(&common::in_file_layout(&path)).unwrap());
    let m = Model::load(&LoadOptions {
        offload: Some(name.clone()),
        ..LoadOptions::new(&path)
    })
    .unwrap();
    let off = run(&m);
    assert_eq!(
        (&off.0, &off.1),
        (&cpu.0, &cpu.1),
        "offload differs from the CPU"
    );
    let e = Model::load(&LoadOptions {
        offload: Some(name),
        stream: common::gates::stream(0, false),
        ..LoadOptions::new(&path)
    })
    .err()
    .expect("offload with streaming must be refused");
    assert!(e.to_string().contains("cannot be combined"), "{e}");
    let e = Model::load(&LoadOptions {
        offload: Some("NOPE0".into()),
        ..LoadOptions::new(&path)
    })
    .err()
    .expect("an unknown offload device must be refused");
    assert!(e.to_string().contains("NOPE0"), "{e}");
}

/// The profiling mode (`--explain-prefill`): every node of the device graphs timed alone, per op
/// and backend; on the loopback device nearly every matmul runs there (target: at least 95%),
/// each op left on the CPU comes with a reason, and the result stays the CPU's bit for bit.
#[test]
fn explain_prefill_profiles_device_graphs_and_changes_no_result() {
    let name = loopback();
    let path = common::tiny();
    let cpu = run(&Model::load(&common::in_file_layout(&path)).unwrap());
    let plain = Model::load(&with_device(&name)).unwrap();
    run(&plain);
    assert!(plain.explain_prefill().is_none(), "off unless asked for");
    let m = Model::load(&LoadOptions {
        prefill: Some(PrefillOptions {
            explain: true,
            ..with_device(&name).prefill.unwrap()
        }),
        ..LoadOptions::new(&path)
    })
    .unwrap();
    let dev = run(&m);
    assert_eq!(
        (&dev.0, &dev.1),
        (&cpu.0, &cpu.1),
        "explain changed the result"
    );
    let r = m.explain_prefill().expect("a report");
    eprintln!("{}", r.render());
    assert!(r.graphs > 0 && r.splits >= r.graphs, "{r:?}");
    assert!(r.matmuls > 0, "{r:?}");
    let pct = r.matmul_device_pct().unwrap();
    assert!(pct >= 95.0, "matmuls on the device: {pct:.1}% {r:?}");
    assert!(
        r.ops
            .iter()
            .any(|o| o.op == "MUL_MAT_ID"
                && o.side == Some(bmoe_engine::device::explain::Side::Device)),
        "{r:?}"
    );
    assert!(r.ops.iter().all(|o| o.nodes > 0 && o.seconds >= 0.0));
    assert!(r.cpu_ops.iter().all(|c| !c.reason.is_empty()));
    // Taken: the next report starts over.
    assert_eq!(m.explain_prefill().unwrap().graphs, 0);
}

/// G27, cached experts go to the device from memory: on a streamed model whose expert cache holds
/// every expert (decode and the CPU pieces fill it first), a wide device graph takes its experts
/// from the cache's regions instead of the file (`cached_experts > 0`, fewer bytes read from the
/// GGUF than with shared slots, which cache nothing), and every bit stays the all-CPU run's.
#[test]
fn g27_the_arena_takes_cached_experts_from_memory_and_stays_identical() {
    let name = loopback();
    let path = common::tiny();
    let cpu = run_all(&load(&path, None, None));
    let run = |cache_mb: u64| {
        let what = format!("G27: cache {cache_mb} MiB");
        counters_of_an_identical_run(streamed(cache_mb), device(&name, true), &cpu, &what)
    };
    let (cached, uncached) = (run(64), run(0));
    assert!(cached.cached_experts > 0, "{cached:?}");
    assert_eq!(uncached.cached_experts, 0, "{uncached:?}");
    assert!(
        cached.file_read_bytes < uncached.file_read_bytes,
        "experts the cache holds are not read from the file again: {cached:?} vs {uncached:?}"
    );
    assert!(cached.file_read_bytes < cached.read_bytes, "{cached:?}");
}

/// G28, the KV cache moved into the device's host buffer type: the loopback device offers none, so
/// the gate knob `kv_stand_in` moves it into a CPU buffer of the engine's own, through the same
/// path (the capture decode, the bind and copy, the release of llama.cpp's pages, a rebuilt
/// graph). Every K and V tensor moves, llama.cpp's pages stay released after each call's memory
/// clear (which writes zeros into them), and every bit, resident and streamed, equals the all-CPU
/// run.
#[test]
fn g28_the_kv_cache_moves_out_of_llama_cpps_buffers_and_stays_identical() {
    let name = loopback();
    let path = common::tiny();
    let cpu_model = load(&path, None, None);
    let cpu = run_all(&cpu_model);
    let stand_in = PrefillOptions {
        gate: GateKnobs {
            kv_stand_in: true,
            ..Default::default()
        },
        ..device(&name, true)
    };
    let m = load(&path, None, Some(stand_in.clone()));
    assert_eq!(
        m.warnings(),
        [format!(
            "prefill device {name}: the KV cache and recurrent state move into a stand-in (the CPU buffer type) when a session opens"
        )]
    );
    let mut s = m.session(&narrow()).unwrap();
    let moved = s.moved_memory().expect("G28: the memory must move");
    assert_eq!(
        moved.tensors,
        2 * m.info().n_layer as usize,
        "K and V of every layer: {moved:?}"
    );
    assert!(moved.bytes > 0 && moved.old_bytes > 0, "{moved:?}");
    eprintln!("G28: {moved:?}");
    assert_eq!(
        moved.old_resident_bytes, 0,
        "G28: llama.cpp's pages stay resident: {moved:?}"
    );
    let opts = GenerateOptions {
        n_predict: 8,
        ..Default::default()
    };
    let mut c = cpu_model.session(&narrow()).unwrap();
    for p in [
        "The KV cache, moved.",
        "Again, after a clear of the memory.",
    ] {
        let want = c.generate(p, &opts, &CancelToken::new()).unwrap().bytes;
        let got = s.generate(p, &opts, &CancelToken::new()).unwrap().bytes;
        assert_eq!(got, want, "G28: generate differs after the move");
        let after = s.moved_memory().unwrap();
        assert_eq!(
            after.old_resident_bytes, 0,
            "G28: the memory clear faulted llama.cpp's pages back in: {after:?}"
        );
    }
    assert!(m.session(&narrow()).unwrap().moved_memory().is_some());
    assert_eq!(run_all(&m), cpu, "G28: resident run differs");
    // Streamed: the capture decode leaves the streamer alone, and the results stay identical.
    counters_of_an_identical_run(streamed(64), stand_in, &cpu, "G28: streamed run differs");
    // Without the knob the loopback device moves nothing.
    let plain = load(&path, None, Some(device(&name, true)));
    assert!(plain.session(&narrow()).unwrap().moved_memory().is_none());
}

/// Each test's loopback device is its own (see `common::gates::loopback`): a model loaded and
/// dropped over and over on one device while another decodes on a second device in parallel.
/// On one shared device this aborted the process within a few loads (seen red: both threads
/// given the same `loopback()` name).
#[test]
fn two_loopback_devices_serve_two_threads_at_once() {
    let path = common::tiny();
    let (mine, other) = (loopback(), loopback());
    assert_ne!(mine, other);
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let churn = {
        let (done, path) = (done.clone(), path.clone());
        std::thread::spawn(move || {
            let mut loads = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) || loads < 3 {
                drop(
                    Model::load(&LoadOptions {
                        offload: Some(other.clone()),
                        ..LoadOptions::new(&path)
                    })
                    .unwrap(),
                );
                loads += 1;
            }
            loads
        })
    };
    let m = Model::load(&LoadOptions {
        offload: Some(mine),
        ..LoadOptions::new(&path)
    })
    .unwrap();
    for _ in 0..6 {
        let mut s = m.session(&common::session_opts()).unwrap();
        let g = s
            .generate(
                "Two devices",
                &GenerateOptions {
                    n_predict: 24,
                    ..Default::default()
                },
                &CancelToken::new(),
            )
            .unwrap();
        assert!(!g.bytes.is_empty());
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(churn.join().unwrap() >= 3);
}
