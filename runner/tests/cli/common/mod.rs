//! Shared fixtures: a scratch project folder with the tiny synthetic model, profiles and jobs, and
//! a way to run the real `bmoe` binary in it.
#![allow(dead_code)]
pub mod cgroup;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use bmoe_synth::{write_model, Preset, SynthArch, SynthSpec};

/// A scratch project: `models/tiny.gguf`, `profiles/host.toml`, and whatever a test writes.
pub struct Project {
    pub dir: tempfile::TempDir,
}

/// The folder this test process shares its fixtures in (the next run removes it).
pub fn shared_dir() -> &'static Path {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        bmoe_synth::process_folder(&std::env::temp_dir()).expect("the process's fixture folder")
    })
}

/// The tiny model, written once per test process into the shared folder (it takes well under
/// 1 s, but every test needs it).
fn tiny_model() -> PathBuf {
    static ONCE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        let p = shared_dir().join("tiny.gguf");
        write_model(&SynthSpec::preset(Preset::Tiny, SynthArch::Qwen3Moe), &p)
            .expect("write tiny model");
        p
    })
    .clone()
}

/// The tests' profile. One compute thread: the harness runs two tests at once on a 2-core
/// machine, and two bmoe processes of two threads each spin in ggml's barriers and its pool's
/// polling waiting for a core. With 2 threads this test binary's tests took 336-407 s, with 1
/// thread 160 s (AMD EPYC, 2 cores; docs/bench-data/cli-suite-threads-2026-12-07.txt). The
/// engine's gates check that results do not depend on the thread count (two_threads.rs).
pub const HOST_PROFILE: &str = r#"
name = "host"
hexagon = "none"
ram_mb = 4096

[engine]
threads = 1
context = 512
cache_floor_mb = 512
"#;

pub const DECIDE_JOB: &str = r#"
name = "decide"
model = "../models/tiny.gguf"
kind = "decide"
profile = "../profiles/host.toml"
csv = "../runs/decide.csv"
decisions_file = "decisions.jsonl"
"#;

/// A perplexity job `ppl` over `n` short texts (ids t0..), writing `runs/ppl.csv`, swept as
/// `sweep` (a `[sweep]` line such as `device = ["none", "Vulkan0"]`).
pub fn ppl_sweep_job(n: usize, sweep: &str) -> String {
    let texts: Vec<String> = (0..n)
        .map(|i| {
            format!("{{ id = \"t{i}\", text = \"Text {i}: the quick brown fox jumps over the lazy dog, again and again.\" }}")
        })
        .collect();
    format!(
        r#"
name = "ppl"
model = "../models/tiny.gguf"
kind = "perplexity"
profile = "../profiles/host.toml"
csv = "../runs/ppl.csv"
prompts = [{}]

[sweep]
{sweep}
"#,
        texts.join(", ")
    )
}

impl Project {
    /// A fresh project with the model and the host profile.
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("models")).unwrap();
        std::fs::copy(tiny_model(), dir.path().join("models/tiny.gguf")).unwrap();
        let p = Project { dir };
        p.write("profiles/host.toml", HOST_PROFILE);
        p
    }

    /// A fresh project with the repository's profiles/ and jobs/ beside models/tiny.gguf.
    pub fn with_examples() -> Self {
        let p = Project::new();
        for dir in ["profiles", "jobs"] {
            std::fs::create_dir_all(p.path(dir)).unwrap();
            for e in std::fs::read_dir(repo_root().join(dir)).unwrap() {
                let e = e.unwrap();
                let to = p.path(&format!("{dir}/{}", e.file_name().to_string_lossy()));
                std::fs::copy(e.path(), to).unwrap();
            }
        }
        p
    }

    /// A fresh project with `n` decisions in `jobs/decisions.jsonl` and `job` as `jobs/job.toml`.
    pub fn deciding(n: usize, job: &str) -> Self {
        let p = Project::new();
        p.decisions("jobs/decisions.jsonl", n);
        p.write("jobs/job.toml", job);
        p
    }

    /// An absolute path inside the project.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// Writes a file (creating folders).
    pub fn write(&self, rel: &str, text: &str) {
        let p = self.path(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    /// Reads a file, or "" when absent.
    pub fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.path(rel)).unwrap_or_default()
    }

    /// `n` decisions as JSONL, ids d1..dn.
    pub fn decisions(&self, rel: &str, n: usize) {
        let mut s = String::new();
        for i in 1..=n {
            s.push_str(&format!(
                "{{\"id\": \"d{i}\", \"prefix\": \"Task {i}: pick the right button.\\n\", \"suffix\": \"Screen {i}: OK, Cancel, Help\", \"choices\": [\"OK\", \"Cancel\", \"Help\"]}}\n"
            ));
        }
        self.write(rel, &s);
    }

    /// A `bmoe` command in the project folder ([`bmoe_command`]).
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = bmoe_command();
        // The model-hash cache goes into the project, not the user's ~/.cache.
        c.current_dir(self.dir.path())
            .args(args)
            .env("XDG_CACHE_HOME", self.dir.path().join(".cache"));
        c
    }

    /// Runs `bmoe` to completion.
    pub fn bmoe(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("run bmoe")
    }
}

/// Strips what the shell running the tests may set and a run would read: BMOE_* settings and the
/// scheduler's array-task variables (a shard index). RUST_BACKTRACE=1 so a panic would show.
pub fn clean_env(c: &mut Command) -> &mut Command {
    c.env("RUST_BACKTRACE", "1");
    for k in [
        "JOB_COMPLETION_INDEX",
        "SLURM_ARRAY_TASK_ID",
        "SLURM_ARRAY_TASK_MIN",
        "SLURM_ARRAY_TASK_COUNT",
    ] {
        c.env_remove(k);
    }
    for (k, _) in std::env::vars() {
        if k.starts_with("BMOE_") {
            c.env_remove(k);
        }
    }
    c
}

/// The real `bmoe` binary in a clean environment ([`clean_env`]).
pub fn bmoe_command() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_bmoe"));
    clean_env(&mut c);
    c
}

/// stdout + stderr as text, without the line about a CPU variant skipped at start (about the
/// machine, not the command: on one whose AMX traps, the first command after the machine state
/// changed prints it, whichever test that is; `direct_cli::a_cpu_variant_that_traps_is_skipped_for_the_next_best`
/// and `the_probe_verdicts_are_remembered_and_said_once` check it).
pub fn text(o: &Output) -> String {
    let err = String::from_utf8_lossy(&o.stderr);
    let err: String = err
        .split_inclusive('\n')
        .filter(|l| !l.starts_with("bmoe: CPU variant "))
        .collect();
    format!("{}{err}", String::from_utf8_lossy(&o.stdout))
}

/// Data rows of a CSV (header excluded).
pub fn data_lines(csv: &str) -> Vec<&str> {
    csv.lines().skip(1).collect()
}

/// Copies the repository's example tree (profiles/, jobs/) next to a model, for the examples test.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The shared tiny model's path.
pub fn model_path() -> PathBuf {
    tiny_model()
}

/// A CSV's rows as maps from column name to cell, in file order.
pub fn csv_rows(csv: &str) -> Vec<BTreeMap<String, String>> {
    let mut rdr = csv::Reader::from_reader(csv.as_bytes());
    let h: Vec<String> = rdr.headers().unwrap().iter().map(String::from).collect();
    rdr.records()
        .map(|r| {
            let r = r.unwrap();
            h.iter().cloned().zip(r.iter().map(String::from)).collect()
        })
        .collect()
}

/// Stdout as JSON (the output must be one JSON document).
pub fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}", text(o)))
}

/// The group of a `bmoe report --format json` document whose `field` (`label` or `point`) is
/// `value`; panics naming it, with the document.
pub fn report_group<'a>(
    doc: &'a serde_json::Value,
    field: &str,
    value: &str,
) -> &'a serde_json::Value {
    doc["groups"]
        .as_array()
        .and_then(|gs| gs.iter().find(|g| g[field] == value))
        .unwrap_or_else(|| panic!("no group with {field} {value}: {doc}"))
}

/// The median, computed independently of the report's quantile code (the mean of the two middle
/// values for an even count).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// A numeric cell of a row from [`csv_rows`]; panics, naming the column, where it is not one.
pub fn cell(r: &BTreeMap<String, String>, col: &str) -> f64 {
    r[col]
        .parse()
        .unwrap_or_else(|_| panic!("{col} is not a number: {r:?}"))
}
