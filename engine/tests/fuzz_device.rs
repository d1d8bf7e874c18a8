//! Damaged models through the device path: each case loads a damaged copy of a tiny model with
//! prefill on a loopback RPC device (an in-process ggml RPC server fronting the CPU), resident or
//! streamed, and generates two tokens. The runner cannot reach an RPC device, so the child is this
//! test binary itself (`device_child`, driven by `FUZZ_DEVICE_MODEL`), judged from outside like
//! the runner's fuzz: no signal, no panic, no hang, every failure an `error:` line.
//!
//! CI: a few dozen seeded cases. Long runs: `scripts/fuzz` sets `FUZZ_DEVICE_ITERS`,
//! `FUZZ_DEVICE_ARCHS`, `FUZZ_SEED`.
mod common;
#[path = "../../runner/tests/cli/hostile/mod.rs"]
mod hostile;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bmoe_engine::test_support::start_loopback_server;
use bmoe_engine::{
    CancelToken, Device, GenerateOptions, LoadOptions, Model, PrefillOptions, StreamOptions,
};
use bmoe_synth::{write_model, Preset, SynthArch, SynthSpec};
use hostile::{apply, mutate, patches_text, run_judged_with, walk, Rng, Verdict};

fn env_or<T: std::str::FromStr>(k: &str, d: T) -> T {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

/// The child's work: one load on the loopback device and two tokens; `Err` is the refusal.
fn load_and_generate(path: &Path, stream: bool) -> Result<(), String> {
    let cpu = Device::cpu().ok_or("no CPU device")?;
    let endpoint = start_loopback_server(cpu, 1).map_err(|e| e.to_string())?;
    let devs = bmoe_engine::add_rpc_server(&endpoint).map_err(|e| e.to_string())?;
    let opts = LoadOptions {
        prefill: Some(PrefillOptions {
            device: devs[0].name.clone(),
            min_tokens: 4,
            ..Default::default()
        }),
        stream: stream.then(StreamOptions::default),
        ..LoadOptions::new(path.to_path_buf())
    };
    let m = Model::load(&opts).map_err(|e| e.to_string())?;
    let mut s = m
        .session(&bmoe_engine::SessionOptions {
            n_ubatch: 8,
            n_ubatch_device: 8,
            n_ctx: 128,
            ..common::session_opts()
        })
        .map_err(|e| e.to_string())?;
    let g = GenerateOptions {
        n_predict: 2,
        ..Default::default()
    };
    let r = s
        .generate(
            "A prompt long enough for the device to prefill.",
            &g,
            &CancelToken::new(),
        )
        .map_err(|e| e.to_string())?;
    eprintln!("device prefill tokens: {}", r.prefill_dev.tokens);
    Ok(())
}

/// The child: does nothing unless `FUZZ_DEVICE_MODEL` names a model (the parent sets it).
#[test]
fn device_child() {
    let Ok(path) = std::env::var("FUZZ_DEVICE_MODEL") else {
        return;
    };
    let stream = std::env::var("FUZZ_DEVICE_STREAM").is_ok_and(|v| v == "1");
    match load_and_generate(Path::new(&path), stream) {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}

fn tiny(arch: &str, dir: &Path) -> Vec<u8> {
    let a = SynthArch::parse(arch).expect("architecture");
    let p = dir.join(format!("{arch}.gguf"));
    write_model(&SynthSpec::preset(Preset::Tiny, a), &p).expect("write the tiny model");
    std::fs::read(&p).expect("read the tiny model")
}

/// One child per case, resident and streamed in turn.
fn campaign(
    arch: &str,
    seed: u64,
    iters: usize,
    deadline: Instant,
    out: &Option<PathBuf>,
) -> ([usize; 3], Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let b = tiny(arch, dir.path());
    let (fields, header_end) = walk(&b).expect("the tiny model's header walks");
    let exe = std::env::current_exe().expect("this test binary");
    let (mut counts, mut crashes) = ([0usize; 3], Vec::new());
    for i in 0..iters {
        if Instant::now() > deadline {
            break;
        }
        let mut rng = Rng::new(seed.wrapping_mul(1_000_033).wrapping_add(i as u64));
        let patches = mutate(&b, &fields, header_end, &mut rng);
        let p = dir.path().join("case.gguf");
        std::fs::write(&p, apply(&b, &patches)).unwrap();
        let stream = i % 2 == 1;
        let model = p.to_string_lossy();
        let env = [
            ("FUZZ_DEVICE_MODEL", model.as_ref()),
            ("FUZZ_DEVICE_STREAM", if stream { "1" } else { "0" }),
        ];
        let args = [
            "device_child",
            "--exact",
            "--nocapture",
            "--test-threads",
            "1",
        ];
        let (v, o) = run_judged_with(&exe, &args, &env, Duration::from_secs(60));
        match v {
            Verdict::Ran => counts[0] += 1,
            Verdict::Refused => counts[1] += 1,
            Verdict::Crash(why) => {
                counts[2] += 1;
                let err = String::from_utf8_lossy(&o.stderr);
                let tail: Vec<&str> = err.lines().rev().take(3).collect();
                let recipe = format!(
                    "# device seed {seed} iteration {i}: {why}\n# {}\n# arch: {arch}\n# mode: {}\n{}",
                    tail.join(" / "),
                    if stream { "stream" } else { "resident" },
                    patches_text(&patches)
                );
                if let Some(o) = out {
                    let _ = std::fs::create_dir_all(o);
                    let _ = std::fs::write(
                        o.join(format!("crash-device-{arch}-{seed}-{i}.patch")),
                        &recipe,
                    );
                }
                crashes.push(recipe);
            }
        }
    }
    (counts, crashes)
}

/// Seeded damaged models of a few architectures through the loopback device.
#[test]
fn fuzz_device_path_never_crashes() {
    if std::env::var("FUZZ_DEVICE_MODEL").is_ok() {
        return; // a child
    }
    let seed: u64 = env_or("FUZZ_SEED", 15);
    let iters: usize = env_or("FUZZ_DEVICE_ITERS", 8);
    let secs: u64 = env_or("FUZZ_DEVICE_SECS", 60);
    let archs =
        std::env::var("FUZZ_DEVICE_ARCHS").unwrap_or_else(|_| "qwen3moe gemma4 deepseek2".into());
    let out = std::env::var("FUZZ_OUT").ok().map(PathBuf::from);
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut all = Vec::new();
    for arch in archs.split_whitespace() {
        let t0 = Instant::now();
        let (c, crashes) = campaign(arch, seed, iters, deadline, &out);
        let n: usize = c.iter().sum();
        eprintln!(
            "fuzz device: {arch} seed {seed}: {n} damaged models: {} loaded and ran, {} refused with an error, {} crashed ({:.1} cases/s)",
            c[0],
            c[1],
            c[2],
            n as f64 / t0.elapsed().as_secs_f64().max(1e-9)
        );
        all.extend(crashes);
    }
    assert!(
        all.is_empty(),
        "{} crash(es):\n{}",
        all.len(),
        all.join("\n")
    );
}
