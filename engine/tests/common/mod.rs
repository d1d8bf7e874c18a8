//! Test fixtures: synthetic models written once per test binary.
#![allow(dead_code)]
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use bmoe_engine::synth::{write_model, Preset, SynthArch, SynthSpec};

static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
static MODELS: OnceLock<Mutex<HashMap<String, PathBuf>>> = OnceLock::new();

/// A folder that lives as long as the test binary.
pub fn dir() -> PathBuf {
    DIR.get_or_init(|| tempfile::tempdir().expect("tempdir"))
        .path()
        .to_path_buf()
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

/// Session options for tests: 2 threads, a 1024-token context.
pub fn session_opts() -> bmoe_engine::SessionOptions {
    bmoe_engine::SessionOptions {
        threads: 2,
        n_ctx: 1024,
        ..Default::default()
    }
}
