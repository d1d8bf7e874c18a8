//! Device prefill on a device with kernels of its own: ggml's Vulkan backend on Mesa's lavapipe
//! (built by scripts/build-vulkan, run by scripts/test-vulkan). The loopback device computes with
//! the CPU's kernels, so its gates compare bit for bit; Vulkan computes its matmuls in fp16, so
//! these gates compare within the tolerance `fp16_budget` derives (docs/vulkan.md), and check
//! what must still be exact: where the pieces ran and what the arena read.
mod common;

use std::path::{Path, PathBuf};
use std::sync::Once;

use bmoe_engine::{GateKnobs, Model, PrefillOptions};
use common::gates::{device, load, loopback, narrow, stream};

/// The Vulkan device's registry name (`Vulkan0`). lavapipe is a CPU-type Vulkan device, which
/// ggml-vulkan lists only when `GGML_VK_VISIBLE_DEVICES` names it; set here before the registry
/// starts, for a plain `cargo test` too.
fn vulkan() -> String {
    static ENV: Once = Once::new();
    ENV.call_once(|| {
        if std::env::var_os("GGML_VK_VISIBLE_DEVICES").is_none() {
            std::env::set_var("GGML_VK_VISIBLE_DEVICES", "0");
        }
    });
    let d = bmoe_engine::devices()
        .into_iter()
        .find(|d| d.backend == "Vulkan")
        .expect("no Vulkan device: is Mesa's lavapipe (mesa-vulkan-drivers) installed?");
    d.name
}

/// fp16's unit roundoff, 2^-11.
const U16: f64 = 1.0 / 2048.0;
/// Standard deviations allowed: each rounding is modelled as an independent error uniform in
/// [-u, u] (standard deviation u / sqrt(3)), so a sum of n of them has a standard deviation of
/// u * sqrt(n / 3) (Higham and Mary's probabilistic analysis); six of those.
const LAMBDA: f64 = 6.0;
/// Matmuls in sequence in a layer on the way to the logits: Q/K/V, K*Q, KQ*V, the output
/// projection; the experts' gate/up and down.
const CHAIN_PER_LAYER: f64 = 6.0;

/// The relative error budget of the logits when every matmul rounds its inputs to fp16 and
/// accumulates in fp16 (ggml-vulkan's default precision on a device with fp16, as Hexagon's
/// matrix engine): the path from the input to a logit (n_layer layers of chained matmuls, then
/// the output matmul, each a sum of `k` terms) as one sum of chain * k rounded terms. Derived
/// from the arithmetic and the model's shape, never from a device's result (docs/vulkan.md).
fn fp16_budget(n_layer: u32, k: u32) -> f64 {
    let chain = CHAIN_PER_LAYER * n_layer as f64 + 1.0;
    LAMBDA * U16 * (chain * k as f64 / 3.0).sqrt()
}

/// The tiny qwen3moe with every expert used per token: its routing cannot flip (a top-k choice
/// is a step function, and an fp16 rounding of a router logit near a tie changes which experts a
/// token gets, far beyond any rounding budget), so the model is a continuous function of its
/// weights and the fp16 budget applies; and that budget.
fn continuous() -> (PathBuf, f64) {
    tiny_with_budget("tiny-all-experts", |s| s.n_expert_used = 8)
}

/// The tiny qwen3moe changed by `edit`, written as `name`, and its fp16 budget.
fn tiny_with_budget(name: &str, edit: impl FnOnce(&mut bmoe_synth::SynthSpec)) -> (PathBuf, f64) {
    let mut spec =
        bmoe_synth::SynthSpec::preset(bmoe_synth::Preset::Tiny, bmoe_synth::SynthArch::Qwen3Moe);
    edit(&mut spec);
    let k = spec.n_embd.max(spec.n_ff_exp);
    (common::model(name, &spec), fp16_budget(spec.n_layer, k))
}

/// The tiny qwen3moe with 64 experts, 2 per token, even routing: a piece routes to a minority of
/// each layer's experts, and near-ties in the router are common.
fn routed() -> PathBuf {
    routed_with_budget().0
}

/// [`routed`] and its fp16 budget.
fn routed_with_budget() -> (PathBuf, f64) {
    tiny_with_budget("tiny-64-experts", |s| s.n_expert = 64)
}

/// Mean NLL of each next token of `TEXT`, from every position's logits.
fn nll(m: &Model, rows: &[Vec<f32>]) -> f64 {
    let toks = m.tokenize(&TEXT.repeat(2), true).unwrap();
    let sum: f64 = (0..rows.len() - 1)
        .map(|i| -bmoe_engine::log_softmax(&rows[i])[toks[i + 1] as usize])
        .sum();
    sum / (rows.len() - 1) as f64
}

const TEXT: &str = "A prefill device computes with kernels of its own; the arena moves the \
                    weights in. ";

/// Every position's logits of `TEXT` (pieces of 16, on the device when it has one).
fn logits(m: &Model) -> Vec<Vec<f32>> {
    let mut s = m.session(&narrow()).unwrap();
    let toks = m.tokenize(&TEXT.repeat(2), true).unwrap();
    s.eval_logits(&toks).unwrap()
}

/// The largest logit difference relative to the CPU's largest logit magnitude; infinite where
/// the device gave a NaN or an infinity (`f64::max` would pass over a NaN: a broken run that
/// computed on uninitialised slots read as equal in one CI run).
fn rel_diff(cpu: &[Vec<f32>], dev: &[Vec<f32>]) -> f64 {
    assert_eq!(cpu.len(), dev.len());
    let scale = cpu
        .iter()
        .flatten()
        .fold(0f64, |a, &z| a.max(z.abs() as f64));
    let diff = cpu
        .iter()
        .flatten()
        .zip(dev.iter().flatten())
        .map(|(&c, &d)| (c as f64 - d as f64).abs())
        .fold(0f64, |a, e| {
            if e.is_finite() {
                a.max(e)
            } else {
                f64::INFINITY
            }
        });
    diff / scale
}

fn on(path: &Path, s: Option<bmoe_engine::StreamOptions>, p: PrefillOptions) -> Model {
    let m = load(path, s, Some(p));
    assert_eq!(
        m.info().prefill_device.as_deref(),
        Some(p_name(&m).as_str()),
        "{:?}",
        m.warnings()
    );
    m
}

fn p_name(m: &Model) -> String {
    m.info().prefill_device.clone().unwrap_or_default()
}

/// G16v: wide pieces on Vulkan0, resident and streamed, whole layers and routed reads: the
/// logits within the fp16 budget of the CPU's (and so the mean NLL within twice the budget times
/// the logits' scale), the same pieces on the device, and the arena's bytes equal to what the
/// loopback device's arena read for the same text and settings.
#[test]
#[ignore = "needs the Vulkan module and lavapipe: scripts/test-vulkan"]
fn g16v_vulkan_prefill_is_within_the_fp16_budget_and_reads_the_loopback_bytes() {
    let vk = vulkan();
    let lo = loopback();
    let (path, budget) = continuous();
    let cpu_m = load(&path, None, None);
    let cpu = logits(&cpu_m);
    let scale = cpu
        .iter()
        .flatten()
        .fold(0f64, |a, &z| a.max(z.abs() as f64));
    let cpu_nll = nll(&cpu_m, &cpu);
    for (s, routed) in [
        (None, false),
        (None, true),
        (stream(0, false), false),
        (stream(16, false), true),
    ] {
        let m = on(&path, s.clone(), device(&vk, routed));
        assert_eq!(p_name(&m), vk);
        let dev = logits(&m);
        let d = rel_diff(&cpu, &dev);
        let dn = nll(&m, &dev) - cpu_nll;
        eprintln!(
            "G16v stream {s:?} routed {routed}: logits differ by {d:.3e} of their scale {scale:.3} (budget {budget:.3e}); mean NLL {dn:+.3e} (allowed {:.3e})",
            2.0 * budget * scale
        );
        assert!(d <= budget, "G16v: {d:.3e} > {budget:.3e}");
        assert!(dn.abs() <= 2.0 * budget * scale, "G16v: NLL {dn:+.3e}");
        let c = m.prefill_dev_counters();
        assert!(c.tokens > 0 && c.nodes > 0 && c.read_bytes > 0, "{c:?}");
        let l = on(&path, s.clone(), device(&lo, routed));
        logits(&l);
        let lc = l.prefill_dev_counters();
        assert_eq!(c.tokens, lc.tokens, "the same pieces on the device");
        assert_eq!(
            (c.read_bytes, c.routed, c.demand),
            (lc.read_bytes, lc.routed, lc.demand),
            "the arena reads what it read on the loopback device"
        );
    }
}

/// Where routing is a top-k of many experts, whole-layer reads still equal the loopback
/// device's bytes (they do not depend on the routing); routed reads follow the device's own
/// routing, printed beside the loopback's.
#[test]
#[ignore = "needs the Vulkan module and lavapipe: scripts/test-vulkan"]
fn whole_layers_read_the_loopback_bytes_on_a_routed_model() {
    let vk = vulkan();
    let lo = loopback();
    let path = routed();
    for routed in [false, true] {
        let m = on(&path, stream(0, false), device(&vk, routed));
        logits(&m);
        let l = on(&path, stream(0, false), device(&lo, routed));
        logits(&l);
        let (c, lc) = (m.prefill_dev_counters(), l.prefill_dev_counters());
        eprintln!(
            "routed {routed}: {} bytes, {} pairs, {} demand (loopback {}, {}, {})",
            c.read_bytes, c.routed, c.demand, lc.read_bytes, lc.routed, lc.demand
        );
        assert_eq!(c.tokens, lc.tokens);
        if !routed {
            assert_eq!(c.read_bytes, lc.read_bytes, "whole layers: the same bytes");
        }
    }
}

/// The negative control of the budget: the device computing on arena slots the loader has not
/// filled (the waits for a layer's weights and its experts skipped, a slow loader) leaves it.
#[test]
#[ignore = "needs the Vulkan module and lavapipe: scripts/test-vulkan"]
fn unfilled_arena_slots_leave_the_fp16_budget() {
    let vk = vulkan();
    let (path, budget) = continuous();
    let cpu = logits(&load(&path, None, None));
    let broken = on(
        &path,
        None,
        PrefillOptions {
            gate: GateKnobs {
                skip_layer_wait: true,
                skip_expert_wait: true,
                // As G20/G21: a layer's reads take several times this, the device's compute of
                // a tiny layer far less.
                loader_delay_ms: 20,
                ..Default::default()
            },
            ..device(&vk, false)
        },
    );
    let dev = logits(&broken);
    assert!(
        broken.prefill_dev_counters().tokens > 0,
        "the device must compute"
    );
    let d = rel_diff(&cpu, &dev);
    let bad = dev.iter().flatten().filter(|z| !z.is_finite()).count();
    eprintln!(
        "unfilled slots on Vulkan: {d:.3e} of the scale (budget {budget:.3e}); {bad} logits not finite"
    );
    assert!(
        d > budget,
        "the broken run stayed within the budget: {d:.3e}"
    );
}

/// G17g's knob on Vulkan (routing-node reads skipped, on the routed model): the result leaves
/// the fp16 budget and differs from the healthy device run's. On this model the healthy run
/// leaves the budget too, through routing flips, which no rounding budget bounds: so the mean
/// NLL of both is printed, and `unfilled_arena_slots_leave_the_fp16_budget` is the budget's
/// discriminating control (docs/vulkan.md).
#[test]
#[ignore = "needs the Vulkan module and lavapipe: scripts/test-vulkan"]
fn g17g_vulkan_skipped_routing_node_reads_change_the_result() {
    let vk = vulkan();
    let (path, budget) = routed_with_budget();
    let cpu_m = load(&path, None, None);
    let cpu = logits(&cpu_m);
    let p = |skip: bool| PrefillOptions {
        routed_full: 1.0,
        gate: GateKnobs {
            skip_demand_reads: skip,
            ..Default::default()
        },
        ..device(&vk, true)
    };
    let ok_m = on(&path, stream(0, false), p(false));
    let ok = logits(&ok_m);
    let broken_m = on(&path, stream(0, false), p(true));
    let broken = logits(&broken_m);
    assert!(
        ok_m.prefill_dev_counters().demand > 0,
        "the healthy run reads at routing nodes"
    );
    let base = nll(&cpu_m, &cpu);
    eprintln!(
        "G17g on Vulkan: mean NLL {:+.3e} (healthy device {:+.3e}); logits {:.3e} of the scale (healthy {:.3e})",
        nll(&broken_m, &broken) - base,
        nll(&ok_m, &ok) - base,
        rel_diff(&cpu, &broken),
        rel_diff(&cpu, &ok)
    );
    assert_ne!(
        broken, ok,
        "G17g: without the routing-node reads the result must change"
    );
    let d = rel_diff(&cpu, &broken);
    assert!(d > budget, "G17g: {d:.3e} within the budget {budget:.3e}");
}

/// The profiling mode on Vulkan0: at least 95% of a device piece's matmul nodes on the device,
/// every op left on the CPU named with its reason, and the result unchanged by the profiling.
#[test]
#[ignore = "needs the Vulkan module and lavapipe: scripts/test-vulkan"]
fn explain_puts_the_matmuls_on_vulkan() {
    let vk = vulkan();
    let path = routed();
    let plain = logits(&on(&path, None, device(&vk, true)));
    let m = on(
        &path,
        None,
        PrefillOptions {
            explain: true,
            ..device(&vk, true)
        },
    );
    assert_eq!(logits(&m), plain, "explain changed the result");
    let r = m.explain_prefill().expect("a report");
    eprintln!("{}", r.render());
    let pct = r.matmul_device_pct().expect("device matmuls");
    assert!(pct >= 95.0, "matmuls on {vk}: {pct:.1}%\n{}", r.render());
    for op in &r.cpu_ops {
        assert!(!op.reason.is_empty() && !op.example.is_empty(), "{op:?}");
    }
}

/// A replay of the tests' decision trace keeps every `best` the CPU chose when its wide pieces run
/// on Vulkan0; the log-prob drift is printed, as `bmoe compare` prices it. The trace's first
/// [`ON_VULKAN`] decisions hold every case it has (growing histories, two repeats, two shrinks,
/// two mid-word divergences) at a third of the whole trace's time on lavapipe (47 s against
/// 159 s); the CPU replays all 50 in decide_gates.rs.
#[test]
#[ignore = "needs the Vulkan module and lavapipe: scripts/test-vulkan"]
fn trace_decisions_on_vulkan_keep_the_cpus_best() {
    let vk = vulkan();
    let path = routed();
    let replay = |m: &Model| {
        let mut s = m.session(&narrow()).unwrap();
        common::trace()
            .iter()
            .take(ON_VULKAN)
            .map(|r| s.decide(r).unwrap())
            .collect::<Vec<_>>()
    };
    let cpu = replay(&load(&path, None, None));
    let m = on(&path, None, device(&vk, true));
    let dev = replay(&m);
    assert!(m.prefill_dev_counters().tokens > 0);
    assert_eq!(cpu.len(), ON_VULKAN);
    let drift = cpu
        .iter()
        .zip(&dev)
        .flat_map(|(c, d)| c.choice_logp.iter().zip(&d.choice_logp))
        .fold(0f64, |a, (c, d)| a.max((c - d).abs()));
    let min_margin = cpu.iter().fold(f64::INFINITY, |a, c| a.min(c.margin));
    eprintln!("{ON_VULKAN} decisions on {vk}: log-prob drift up to {drift:.3e}; smallest CPU margin {min_margin:.3e}");
    let flipped: Vec<usize> = (0..ON_VULKAN)
        .filter(|&i| cpu[i].best != dev[i].best)
        .collect();
    assert!(flipped.is_empty(), "best changed on {flipped:?}");
}

/// How many of the trace's decisions the Vulkan replay runs.
const ON_VULKAN: usize = 16;
