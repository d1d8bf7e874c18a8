//! A point's memory limit (`memory_limit`, issue 53), for real: the point runs in a child process
//! inside a cgroup v1 memory group of the limit's size, its rows say so with the group's peak; a
//! point over its limit is killed by the kernel's OOM killer and gets error rows saying so, and
//! the next point still runs; a limit that cannot be enforced refuses the run before anything
//! runs; `cold_start` drops the model's pages so the load reads from storage. The tests that
//! need root and the v1 memory controller skip, saying so, where they are missing.
use std::path::PathBuf;

use bmoe_synth::{write_model, Preset, SynthArch, SynthSpec};

use crate::common::cgroup::Group;
use crate::common::{cell as mib, csv_rows, text, Project};

/// Whether this machine can make memory groups (root, cgroup v1's memory controller).
fn cgroups_here() -> bool {
    let ok = Group::new("memory-limit", 256 << 20).is_some();
    if !ok {
        eprintln!("skipped: needs root and the cgroup v1 memory controller");
    }
    ok
}

/// A perplexity job over `n` short texts on `model`, swept over `sweep` (a `[sweep]` line).
fn job(p: &Project, model: &str, n: usize, sweep: &str) {
    let texts: Vec<String> = (0..n)
        .map(|i| format!("{{ id = \"t{i}\", text = \"Text {i}: the phone has little memory, and the model must fit in it.\" }}"))
        .collect();
    p.write(
        "jobs/ml.toml",
        &format!(
            r#"
name = "ml"
model = "../models/{model}"
kind = "perplexity"
profile = "../profiles/host.toml"
csv = "../runs/ml.csv"
prompts = [{}]

[sweep]
{sweep}
"#,
            texts.join(", ")
        ),
    );
}

/// A model of about 223 MiB (the small preset with wide experts: 0.84 MiB an expert).
fn big_model(p: &Project) -> PathBuf {
    let path = p.path("models/big.gguf");
    let spec = SynthSpec {
        n_ff_exp: 1024,
        ..SynthSpec::preset(Preset::Small, SynthArch::Qwen3Moe)
    };
    write_model(&spec, &path).expect("write the model");
    path
}

#[test]
fn a_point_runs_inside_its_memory_limit_and_its_rows_say_so() {
    if !cgroups_here() {
        return;
    }
    let p = Project::new();
    // A number and the profile's RAM (host.toml: ram_mb = 4096).
    job(&p, "tiny.gguf", 2, r#"memory_limit = [512, "profile"]"#);
    let o = p.bmoe(&["run", "jobs/ml.toml", "-q"]);
    assert!(o.status.success(), "{}", text(&o));
    let rows = csv_rows(&p.read("runs/ml.csv"));
    assert_eq!(rows.len(), 4, "{rows:?}");
    for r in &rows {
        assert_eq!(r["error"], "", "{r:?}");
        assert_eq!(r["memory_enforced"], "true", "{r:?}");
        let limit = mib(r, "memory_limit_mib");
        let peak = mib(r, "memory_peak_mib");
        assert!(
            peak > 0.0 && peak <= limit,
            "peak {peak} vs limit {limit}: {r:?}"
        );
        // The limit's own cold start charged the model's pages to the group.
        assert!(
            mib(r, "load_read_mib") > 0.0 || r["load_s"] == "0.0",
            "{r:?}"
        );
    }
    let limits: Vec<&str> = rows
        .iter()
        .map(|r| r["memory_limit_mib"].as_str())
        .collect();
    assert_eq!(limits, ["512", "512", "4096", "4096"]);
    assert!(
        rows[0]["settings"].contains(r#""memory_limit":512"#),
        "{:?}",
        rows[0]
    );
    assert!(rows[2]["settings"].contains(r#""memory_limit":"profile""#));
}

#[test]
fn a_point_over_its_limit_gets_error_rows_and_the_next_point_runs() {
    if !cgroups_here() {
        return;
    }
    let p = Project::new();
    big_model(&p);
    // Streamed with an expert cache larger than the limit: the cache's anonymous pages cannot be
    // reclaimed (a resident load would page its weights from the file, slowly, not die).
    job(
        &p,
        "big.gguf",
        3,
        "memory_limit = [96, 1024]\n\n[overrides]\nmoe_stream = true\ncache_mb = 200",
    );
    let o = p.bmoe(&["run", "jobs/ml.toml", "-q"]);
    let out = text(&o);
    // Items refused: exit 1, not a crash of the run.
    assert_eq!(o.status.code(), Some(1), "{out}");
    let rows = csv_rows(&p.read("runs/ml.csv"));
    assert_eq!(
        rows.len(),
        6,
        "a row for every item of both points:\n{out}\n{rows:?}"
    );
    let (over, under): (Vec<_>, Vec<_>) = rows.iter().partition(|r| r["memory_limit_mib"] == "96");
    assert_eq!(over.len(), 3);
    for r in &over {
        assert!(
            r["error"].starts_with("over the memory limit: killed by the kernel's OOM killer at the 96 MiB memory_limit"),
            "{r:?}"
        );
        assert_eq!(r["memory_enforced"], "true", "{r:?}");
        assert!(mib(r, "memory_peak_mib") <= 96.0, "{r:?}");
        // The parent's own peak is not the killed point's.
        assert_eq!(r["peak_rss_mib"], "", "{r:?}");
    }
    for r in &under {
        assert_eq!(r["error"], "", "{r:?}");
        assert_eq!(r["memory_enforced"], "true", "{r:?}");
        // The model's pages, read cold into the group, are in its peak.
        assert!(mib(r, "memory_peak_mib") > 96.0, "{r:?}");
    }
    assert!(out.contains("over the memory limit"), "{out}");
}

#[test]
fn a_limit_that_cannot_be_enforced_refuses_the_run() {
    let p = Project::new();
    job(&p, "tiny.gguf", 1, "");
    // No such folder: where a cgroup cannot be made.
    let o = p
        .cmd(&["run", "jobs/ml.toml", "-q", "--memory-limit", "256"])
        .env("BMOE_CGROUP_ROOT", p.path("no-cgroups"))
        .output()
        .unwrap();
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(
        out.contains("profile host [base]: memory_limit = 256 (256 MiB) cannot be enforced"),
        "{out}"
    );
    assert!(out.contains("making the memory cgroup"), "{out}");
    assert!(!p.path("runs/ml.csv").exists(), "nothing ran");
    // A cgroup v2 folder that does not delegate the memory controller.
    p.write("v2/cgroup.controllers", "cpu io memory\n");
    p.write("v2/cgroup.subtree_control", "cpu\n");
    let o = p
        .cmd(&["run", "jobs/ml.toml", "-q", "--set", "memory_limit=profile"])
        .env("BMOE_CGROUP_ROOT", p.path("v2"))
        .output()
        .unwrap();
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(out.contains("memory_limit = profile (4096 MiB)"), "{out}");
    assert!(
        out.contains("cgroup.subtree_control lacks `memory`"),
        "{out}"
    );
    assert!(!p.path("runs/ml.csv").exists(), "nothing ran");
}

#[test]
fn a_limit_too_small_to_be_a_phone_is_a_configuration_error() {
    let p = Project::new();
    job(&p, "tiny.gguf", 1, "memory_limit = [8]");
    let o = p.bmoe(&["check", "jobs/ml.toml", "--no-probe"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(out.contains("memory_limit"), "{out}");
    assert!(out.contains("between 64 and"), "{out}");
}

#[test]
fn cold_start_reads_the_model_from_storage() {
    let p = Project::new();
    job(&p, "tiny.gguf", 1, "cold_start = [false, true]");
    // The file's pages warm: the first point reads nothing, the cold one reads it again.
    std::fs::read(p.path("models/tiny.gguf")).unwrap();
    let o = p.bmoe(&["run", "jobs/ml.toml", "-q"]);
    assert!(o.status.success(), "{}", text(&o));
    let rows = csv_rows(&p.read("runs/ml.csv"));
    assert_eq!(rows.len(), 2, "{rows:?}");
    let read = |i: usize| mib(&rows[i], "load_read_mib");
    let file_mib = std::fs::metadata(p.path("models/tiny.gguf")).unwrap().len() as f64 / 1048576.0;
    assert!(read(0) < file_mib / 2.0, "warm: {rows:?}");
    assert!(read(1) >= file_mib / 2.0, "cold: {rows:?}");
    for r in &rows {
        assert_eq!(r["memory_enforced"], "false", "{r:?}");
        assert_eq!(r["memory_limit_mib"], "", "{r:?}");
    }
}
