//! Test fixtures: synthetic models written once per test binary.
#![allow(dead_code)]
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

pub mod gates;

use bmoe_synth::{write_model, Preset, SynthArch, SynthSpec, WeightType};

static DIR: OnceLock<PathBuf> = OnceLock::new();
static MODELS: OnceLock<Mutex<HashMap<String, PathBuf>>> = OnceLock::new();

/// The folder this test process shares its models in (the next run removes it).
pub fn dir() -> PathBuf {
    DIR.get_or_init(|| {
        bmoe_synth::process_folder(&std::env::temp_dir()).expect("the process's fixture folder")
    })
    .clone()
}

/// Writes (once) the model `spec` under `key` and returns its path.
pub fn model(key: &str, spec: &SynthSpec) -> PathBuf {
    let m = MODELS.get_or_init(|| Mutex::new(HashMap::new()));
    let mut m = m.lock().unwrap();
    m.entry(key.to_string())
        .or_insert_with(|| {
            let p = dir().join(format!("{key}.gguf"));
            write_model(spec, &p).expect("write synthetic model").files[0].clone()
        })
        .clone()
}

/// A resident load of `path` in the file's own layout (`repack = off`): the reference a streamed
/// or device run, which computes on the file's layout, is compared with bit for bit. (On x86
/// the tiny model's types have no repacked kernel; on ARM its Q8_0 experts do.)
pub fn in_file_layout(path: impl Into<PathBuf>) -> bmoe_engine::LoadOptions {
    bmoe_engine::LoadOptions {
        repack: bmoe_engine::Repack::Off,
        ..bmoe_engine::LoadOptions::new(path)
    }
}

/// The tiny shape, 256 wide, with the bench preset's types: Q4_0 experts, Q8_0 dense matrices
/// (both have repacked kernels: Q4_0 on AVX2 and ARM, Q8_0 on ARM), so llama.cpp's default
/// repack runs on it. At width 128 the repacked kernels gave the same bits as the plain ones, so
/// the logits alone could not tell them apart; at 256 they differ.
pub fn tiny_q4_0() -> PathBuf {
    model(
        "w256-q4_0-experts",
        &SynthSpec {
            expert_type: WeightType::Q4_0,
            dense_type: WeightType::Q8_0,
            n_embd: 256,
            n_ff_exp: 256,
            ..SynthSpec::preset(Preset::Tiny, SynthArch::Qwen3Moe)
        },
    )
}

/// The tiny qwen3moe model.
pub fn tiny() -> PathBuf {
    model(
        "tiny-qwen3moe",
        &SynthSpec::preset(Preset::Tiny, SynthArch::Qwen3Moe),
    )
}

/// The tiny olmoe model.
pub fn tiny_olmoe() -> PathBuf {
    model(
        "tiny-olmoe",
        &SynthSpec::preset(Preset::Tiny, SynthArch::Olmoe),
    )
}

/// Session options for tests: 1 thread, a 1024-token context. One thread because the test harness
/// runs two tests at once on a 2-core machine, and two compute threads per test spun in ggml's
/// barrier waiting for a core (session.rs: 44 s with 2 threads, 0.1 s with 1). Results do not
/// depend on the thread count (real_model.rs checks 1 against 2 threads).
pub fn session_opts() -> bmoe_engine::SessionOptions {
    bmoe_engine::SessionOptions {
        threads: 1,
        n_ctx: 1024,
        ..Default::default()
    }
}

/// An agent-like prefix: instructions, a task, the start of a history.
pub const PREFIX: &str = "System: you operate a phone for the user. Task: book a table for two at an Italian place tonight. History: opened the maps app; searched for restaurants; ";

/// A decision over the choices A, B, C.
pub fn req(prefix: &str, suffix: &str) -> bmoe_engine::DecideRequest {
    bmoe_engine::DecideRequest {
        prefix: prefix.into(),
        suffix: suffix.into(),
        choices: vec!["A".into(), "B".into(), "C".into()],
        ..Default::default()
    }
}

/// Fifty decisions shaped like an agent trace: the history grows, repeats, shrinks, and is edited
/// in the middle of a word; a generate after the 20th and a perplexity after the 35th.
pub fn trace() -> Vec<bmoe_engine::DecideRequest> {
    let steps = [
        "tapped Search; ",
        "typed pizza; ",
        "scrolled down; ",
        "opened Luigi's; ",
        "read reviews; ",
        "went back; ",
        "opened Marco's; ",
    ];
    let mut history: Vec<String> = Vec::new();
    let mut out = Vec::new();
    for i in 0..50 {
        match i % 7 {
            // Shrink: the agent undid a step.
            5 if !history.is_empty() => {
                history.pop();
            }
            // Repeat: the same decision again (the agent retried).
            3 if !out.is_empty() => {
                let last: bmoe_engine::DecideRequest = out.last().cloned().unwrap();
                out.push(last);
                continue;
            }
            _ => history.push(steps[i % steps.len()].to_string()),
        }
        let mut h = history.concat();
        if i % 11 == 4 && h.len() > 20 {
            // Diverge in the middle of a word.
            let mid = h.len() / 2;
            h.replace_range(mid..mid + 1, "x");
        }
        out.push(req(
            &format!("{PREFIX}{h}"),
            &format!("Screen {}: which button? A, B or C.", i % 4),
        ));
    }
    out
}

/// Gemma 3 270M (a real model), when `scripts/get-gemma3` wrote it or BMOE_GEMMA3 names a copy;
/// `None` with a SKIPPED line otherwise.
pub fn gemma3() -> Option<PathBuf> {
    let p = std::env::var_os("BMOE_GEMMA3")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/gemma3-270m.gguf")
        });
    if p.is_file() {
        Some(p)
    } else {
        eprintln!(
            "SKIPPED: {} is not there (scripts/get-gemma3 writes it; BMOE_GEMMA3 names another copy)",
            p.display()
        );
        None
    }
}

/// A decision's choice log-probabilities as bits, for bit-for-bit comparisons.
pub fn logp_bits(r: &bmoe_engine::DecideRecord) -> Vec<u64> {
    r.choice_logp.iter().map(|v| v.to_bits()).collect()
}
