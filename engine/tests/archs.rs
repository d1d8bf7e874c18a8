//! Every architecture `synth` writes, through every gate, one test per architecture: it loads,
//! generates (the same bytes twice), decides, computes perplexity, and passes G1/G2(+G19)/G3/S1
//! (streamed == resident), G16/G17f (the device arena on the loopback device == the CPU) and G28
//! (the memory moved out of llama.cpp's buffers), bit for bit. Each cell's result is written to `<CARGO_TARGET_TMPDIR>/arch-coverage/<arch>.tsv`;
//! `scripts/arch-coverage` turns those files into `docs/architectures.md`.
//!
//! A cell an architecture cannot pass is listed in `GAPS` with the reason; it still runs (unless
//! it would abort the process) and must still fail, so a gap that closes is noticed.
mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use bmoe_engine::{CancelToken, GenerateOptions, LoadOptions, Model};
use bmoe_synth::{Preset, SynthArch, SynthSpec};
use common::gates;

/// The cells of the coverage table, in column order.
pub const CELLS: [&str; 10] = [
    "loads",
    "generate",
    "decide",
    "perplexity",
    "G1",
    "G2",
    "G3",
    "G16",
    "G17f",
    "G28",
];

/// A cell an architecture does not pass: (arch, cell, runs, reason). `runs = false` for a cell
/// that would abort the test process (llama.cpp's `GGML_ABORT`), so it is not attempted.
const GAPS: &[(&str, &str, bool, &str)] = &[];

/// The tiny model of `arch`.
fn tiny(arch: SynthArch) -> PathBuf {
    common::model(
        &format!("arch-{}", arch.name()),
        &SynthSpec::preset(Preset::Tiny, arch),
    )
}

/// `arch` with 64 experts, top-2: a 16-token piece routes to a minority of each layer's experts.
fn many_experts(arch: SynthArch) -> PathBuf {
    let base = SynthSpec::preset(Preset::Tiny, arch);
    common::model(
        &format!("arch-{}-64", arch.name()),
        &SynthSpec {
            n_expert: 64,
            n_expert_used: 2,
            ..base
        },
    )
}

fn generate(path: &Path) -> Vec<u8> {
    let m = Model::load(&LoadOptions::new(path)).expect("load");
    let mut s = m.session(&common::session_opts()).unwrap();
    s.generate(
        "The architecture under test",
        &GenerateOptions {
            n_predict: 16,
            ..Default::default()
        },
        &CancelToken::new(),
    )
    .unwrap()
    .bytes
}

/// What several cells share, computed once per architecture: the resident run the stream gates
/// compare against, and G1's counters (G3 compares its reads with them).
#[derive(Default)]
struct Shared {
    resident: Option<gates::Outcome>,
    g1: Option<bmoe_engine::StreamCounters>,
}

impl Shared {
    fn resident(&mut self, path: &Path) -> &gates::Outcome {
        self.resident.get_or_insert_with(|| gates::resident(path))
    }

    fn g1(&mut self, path: &Path) -> bmoe_engine::StreamCounters {
        if self.g1.is_none() {
            let r = self.resident.get_or_insert_with(|| gates::resident(path));
            self.g1 = Some(gates::g1(path, r));
        }
        self.g1.clone().unwrap_or_default()
    }
}

/// Runs one cell; `Err` carries the panic message.
fn cell(arch: SynthArch, name: &str, shared: &mut Shared) -> Result<(), String> {
    let path = tiny(arch);
    let run = || match name {
        "loads" => {
            let m = Model::load(&LoadOptions::new(&path)).expect("load");
            assert_eq!(m.info().arch, arch.name());
            assert!(m.info().n_expert > 0, "{:?}", m.info());
        }
        "generate" => {
            let a = generate(&path);
            assert!(!a.is_empty());
            assert_eq!(a, generate(&path), "greedy output must be stable");
        }
        "decide" => {
            let m = Model::load(&LoadOptions::new(&path)).expect("load");
            let d = m
                .session(&common::session_opts())
                .unwrap()
                .decide(&common::req(common::PREFIX, "Which button? A, B or C."))
                .unwrap();
            assert_eq!(d.choice_logp.len(), 3);
            assert!(
                d.choice_logp.iter().all(|v| v.is_finite() && *v <= 0.0),
                "{d:?}"
            );
        }
        "perplexity" => {
            let m = Model::load(&LoadOptions::new(&path)).expect("load");
            let p = m
                .session(&common::session_opts())
                .unwrap()
                .perplexity(&"Perplexity of a synthetic model. ".repeat(4))
                .unwrap();
            assert!(p.nll_mean.is_finite() && p.nll_mean > 0.0, "{p:?}");
        }
        "G1" => {
            shared.g1(&path);
        }
        "G2" => {
            let r = shared.resident(&path);
            gates::g2(&path, r)
        }
        "G3" => {
            let c1 = shared.g1(&path);
            let r = shared.resident(&path);
            gates::g3(&path, r, &c1);
        }
        "G16" => gates::g16(&path),
        "G17f" => gates::g17f(&many_experts(arch)),
        "G28" => gates::g28(&path),
        other => panic!("unknown cell {other}"),
    };
    catch_unwind(AssertUnwindSafe(run)).map_err(|e| {
        e.downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panicked".into())
    })
}

/// Runs every cell of `arch`, writes its row, and fails on a cell that failed without a gap or
/// passed despite one.
fn coverage(arch: SynthArch) {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("arch-coverage");
    std::fs::create_dir_all(&dir).unwrap();
    let mut rows = String::new();
    let mut wrong = Vec::new();
    let mut shared = Shared::default();
    for name in CELLS {
        let started = std::time::Instant::now();
        let gap = GAPS
            .iter()
            .find(|(a, c, _, _)| *a == arch.name() && *c == name);
        let (status, note) = match gap {
            Some((_, _, false, why)) => ("not run", why.to_string()),
            _ => match (cell(arch, name, &mut shared), gap) {
                (Ok(()), None) => ("ok", String::new()),
                (Err(e), Some((_, _, _, why))) => {
                    ("gap", format!("{why} (fails: {})", first_line(&e)))
                }
                (Ok(()), Some(_)) => {
                    wrong.push(format!(
                        "{name}: passes although GAPS lists it; remove the gap"
                    ));
                    ("ok", String::new())
                }
                (Err(e), None) => {
                    wrong.push(format!("{name}: {e}"));
                    ("FAILED", first_line(&e))
                }
            },
        };
        // The cell's wall time, so a slow suite shows which gate costs it (not asserted).
        let secs = started.elapsed().as_secs_f64();
        eprintln!("{} {name}: {status} {note} ({secs:.1} s)", arch.name());
        rows.push_str(&format!("{}\t{name}\t{status}\t{note}\n", arch.name()));
    }
    std::fs::write(dir.join(format!("{}.tsv", arch.name())), rows).unwrap();
    assert!(wrong.is_empty(), "{}: {wrong:#?}", arch.name());
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or("").replace('\t', " ")
}

#[test]
fn qwen3moe() {
    coverage(SynthArch::Qwen3Moe);
}

#[test]
fn olmoe() {
    coverage(SynthArch::Olmoe);
}

#[test]
fn gpt_oss() {
    coverage(SynthArch::GptOss);
}

#[test]
fn gemma4() {
    coverage(SynthArch::Gemma4);
}

#[test]
fn qwen35moe() {
    coverage(SynthArch::Qwen35Moe);
}

#[test]
fn nemotron_h_moe() {
    coverage(SynthArch::NemotronHMoe);
}

#[test]
fn qwen2moe() {
    coverage(SynthArch::Qwen2Moe);
}

#[test]
fn glm4moe() {
    coverage(SynthArch::Glm4Moe);
}

#[test]
fn deepseek2() {
    coverage(SynthArch::Deepseek2);
}
