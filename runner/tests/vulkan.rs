//! The Vulkan module through the default build's binary (scripts/test-vulkan, docs/vulkan.md): `bmoe devices`
//! lists the device with its memory and host buffer, and a replay of decisions and a
//! perplexity job swept over `device = none, Vulkan0` record the device that ran each row, while
//! `bmoe report` prices the device path: agreement on `best` and the perplexity change against
//! the CPU.
#[path = "cli/common/mod.rs"]
mod common;

use common::{text, Project};

/// lavapipe is a CPU-type Vulkan device, listed only when this names it.
const VISIBLE: (&str, &str) = ("GGML_VK_VISIBLE_DEVICES", "0");

/// `bmoe` with the device visible. Mesa's compiled shaders are kept in one folder for the
/// whole test run (the project's own cache folder is new in each test): lavapipe compiles each
/// ggml pipeline with LLVM on first use, seconds per run.
fn bmoe(p: &Project, args: &[&str]) -> std::process::Output {
    p.cmd(args)
        .env(VISIBLE.0, VISIBLE.1)
        .env(
            "MESA_SHADER_CACHE_DIR",
            std::env::temp_dir().join("bmoe-test-mesa-shader-cache"),
        )
        .output()
        .expect("run bmoe")
}

#[test]
#[ignore = "needs the Vulkan module and lavapipe: scripts/test-vulkan"]
fn devices_lists_vulkan0_with_its_memory_and_host_buffer() {
    let p = Project::new();
    let o = bmoe(&p, &["devices"]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    let line = out
        .lines()
        .find(|l| l.starts_with("Vulkan0"))
        .unwrap_or_else(|| panic!("no Vulkan0 line: {out}"));
    // name, kind, backend, memory MiB, host buffer, description
    let cols: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(cols[2], "Vulkan", "{line}");
    assert!(cols[3].parse::<u64>().unwrap() > 0, "{line}");
    assert!(
        line.contains("llvmpipe"),
        "lavapipe describes itself: {line}"
    );
    assert!(
        out.contains("\nvulkan: Vulkan0 (`--device Vulkan0`"),
        "{out}"
    );
    // Without the variable the build says why it lists no device.
    let o = p
        .cmd(&["devices"])
        .env_remove(VISIBLE.0)
        .output()
        .expect("run bmoe");
    assert!(
        text(&o).contains("\nvulkan: module loaded, no device found"),
        "{}",
        text(&o)
    );
}

/// 6 decisions over growing histories (prompts of about 60-150 tokens, device pieces from 16;
/// lavapipe prefills a few dozen tokens a second): enough for the rows and the report's pricing,
/// which is what this test checks (45 s; 24 decisions took 122 s). The replay that gates `best`
/// on Vulkan is the engine's `trace_decisions_on_vulkan_keep_the_cpus_best`.
fn decisions(p: &Project) {
    let mut s = String::new();
    let mut history = String::new();
    for i in 1..=N_DECISIONS {
        history.push_str(&format!("step {i}: opened screen {}; ", i % 7));
        s.push_str(&format!(
            "{{\"id\": \"d{i}\", \"prefix\": \"Task: file the report. History: {history}\\n\", \"suffix\": \"Screen {i}: OK, Cancel, Help?\", \"choices\": [\"OK\", \"Cancel\", \"Help\"]}}\n"
        ));
        if history.len() > 100 {
            history.clear();
        }
    }
    p.write("jobs/decisions.jsonl", &s);
}

const N_DECISIONS: usize = 6;

/// The shared host profile, with device pieces from 16 tokens, 64 wide.
fn profile() -> String {
    format!(
        "{}\n[prefill]\nmin_tokens = 16\ndevice_ubatch = 64\n",
        common::HOST_PROFILE
    )
}

#[test]
#[ignore = "needs the Vulkan module and lavapipe: scripts/test-vulkan"]
fn a_sweep_over_the_device_records_where_rows_ran_and_the_report_prices_it() {
    let p = Project::new();
    p.write("profiles/host.toml", &profile());
    decisions(&p);
    p.write(
        "jobs/replay.toml",
        r#"
name = "replay"
model = "../models/tiny.gguf"
kind = "decide"
profile = "../profiles/host.toml"
csv = "../runs/replay.csv"
decisions_file = "decisions.jsonl"

[sweep]
device = ["none", "Vulkan0"]
"#,
    );
    p.write(
        "jobs/ppl.toml",
        &common::ppl_sweep_job(4, r#"device = ["none", "Vulkan0"]"#),
    );
    for job in ["jobs/replay.toml", "jobs/ppl.toml"] {
        let o = bmoe(&p, &["run", job, "--quiet"]);
        assert!(o.status.success(), "{job}: {}", text(&o));
    }
    for (csv, n) in [("runs/replay.csv", N_DECISIONS), ("runs/ppl.csv", 4)] {
        let mut r = csv::Reader::from_path(p.path(csv)).unwrap();
        let h = r.headers().unwrap().clone();
        let col = |name: &str| h.iter().position(|c| c == name).unwrap();
        let (dev, req, tok) = (
            col("prefill_device"),
            col("prefill_device_requested"),
            col("prefill_dev_tokens"),
        );
        let rows: Vec<csv::StringRecord> = r.records().map(Result::unwrap).collect();
        assert_eq!(rows.len(), 2 * n, "{csv}");
        let on_vk: Vec<_> = rows.iter().filter(|r| &r[req] == "Vulkan0").collect();
        assert_eq!(on_vk.len(), n, "{csv}");
        assert!(
            on_vk.iter().all(|r| &r[dev] == "Vulkan0"),
            "{csv}: the device that ran"
        );
        assert!(on_vk.iter().all(|r| r[tok].parse::<u64>().unwrap() > 0));
    }
    let o = bmoe(
        &p,
        &[
            "report",
            "runs/replay.csv",
            "runs/ppl.csv",
            "--format",
            "md",
        ],
    );
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    eprintln!("{out}");
    let row = |point: &str| {
        out.lines()
            .filter(|l| l.starts_with(&format!("| {point}")))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let vk = row("device=Vulkan0");
    assert_eq!(vk.len(), 2, "{out}");
    assert!(
        vk[0].contains(&format!("1.000 (n={N_DECISIONS})")),
        "agreement on best: {out}"
    );
    assert!(out.contains("ppl vs device=none"), "{out}");
    assert!(vk[1].contains("n=4)"), "ppl change over 4 texts: {out}");
}
