//! The telemetry as its consumers read it: every `--machine` line and every CSV row of every kind
//! of job (decide, generate, perplexity; resident and streamed; a refused item; a shard) validates
//! against the shipped `schemas/telemetry.schema.json` with Python's `jsonschema` (Draft 2020-12),
//! and a dashboard reading this build's CSVs beside the previous schema version's (and schema 1's)
//! with DuckDB gets every documented number as a number.
//!
//! The Python packages come from `scripts/py-tools` (a virtual environment outside the clone,
//! which `scripts/test` makes); without them these tests fail naming the script, unless
//! `BMOE_TEST_PYTHON=0` says to skip them.
use std::path::PathBuf;
use std::process::Command;

use crate::common;
use common::{repo_root, text, Project};

/// The Python of `scripts/py-tools`' environment, or `None` when `BMOE_TEST_PYTHON=0` and it is
/// missing; a missing environment otherwise fails the test, saying how to make it.
fn py_tools() -> Option<PathBuf> {
    let env = std::env::var_os("BMOE_PYENV")
        .map(PathBuf::from)
        .or_else(|| {
            let cache = std::env::var_os("XDG_CACHE_HOME")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
            Some(cache.join("bmoe/pyenv"))
        })
        .unwrap_or_default();
    let python = env.join("bin/python");
    let ok = Command::new(&python)
        .args(["-c", "import jsonschema, duckdb"])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        return Some(python);
    }
    if std::env::var("BMOE_TEST_PYTHON").as_deref() == Ok("0") {
        eprintln!(
            "BMOE_TEST_PYTHON=0: skipping (no jsonschema/duckdb in {})",
            env.display()
        );
        return None;
    }
    panic!(
        "{} lacks the Python packages jsonschema and duckdb: run scripts/py-tools (it pip-installs \
         them there), or set BMOE_TEST_PYTHON=0 to skip the tests that need them",
        env.display()
    );
}

/// Runs a script of runner/tests/fixtures with `python`; its stdout on success.
fn python(python: &PathBuf, script: &str, args: &[String]) -> String {
    let o = Command::new(python)
        .arg(repo_root().join("runner/tests/fixtures").join(script))
        .args(args)
        .output()
        .expect("python");
    assert!(o.status.success(), "{script}: {}", text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn schema_path() -> String {
    repo_root()
        .join("schemas/telemetry.schema.json")
        .display()
        .to_string()
}

/// A project with a job of each kind: decide (with expected answers and meta), generate (with a
/// prompt longer than the context: a refused row), perplexity.
fn project() -> Project {
    let p = Project::new();
    p.write(
        "jobs/decisions.jsonl",
        concat!(
            r#"{"id": "a", "prefix": "Task: archive the newsletter.\n", "suffix": "Buttons: Archive, Reply, Delete", "choices": ["Archive", "Reply", "Delete"], "expected": "Archive", "meta": {"trace": "mail", "step": 1}}"#,
            "\n",
            r#"{"id": "b", "prefix": "Task: archive the newsletter.\n", "suffix": "Dialog: OK / Cancel", "choices": ["OK", "Cancel"]}"#,
            "\n"
        ),
    );
    p.write(
        "jobs/decide.toml",
        "name = \"decide\"\nmodel = \"../models/tiny.gguf\"\nkind = \"decide\"\nprofile = \"../profiles/host.toml\"\ncsv = \"../runs/decide.csv\"\ndecisions_file = \"decisions.jsonl\"\n",
    );
    let long = "many words again ".repeat(400);
    p.write(
        "jobs/generate.toml",
        &format!("name = \"generate\"\nmodel = \"../models/tiny.gguf\"\nkind = \"generate\"\nprofile = \"../profiles/host.toml\"\ncsv = \"../runs/generate.csv\"\nn_predict = 4\nprompts = [\"Hello\", {{ id = \"long\", text = \"{long}\" }}]\n"),
    );
    p.write(
        "jobs/perplexity.toml",
        "name = \"perplexity\"\nmodel = \"../models/tiny.gguf\"\nkind = \"perplexity\"\nprofile = \"../profiles/host.toml\"\ncsv = \"../runs/perplexity.csv\"\nprompts = [{ id = \"fox\", text = \"The quick brown fox jumps over the lazy dog, again and again.\" }]\n",
    );
    p
}

/// Runs `job` into `csv` with `--machine`, writing its lines to `jsonl`; a refused item (exit
/// 1) is expected of the generate job only.
fn run_machine(p: &Project, job: &str, csv: &str, jsonl: &str, extra: &[&str]) {
    let mut args = vec!["run", job, "--machine", "-q", "--csv", csv];
    args.extend(extra);
    let o = p.bmoe(&args);
    let want = if job.contains("generate") { 1 } else { 0 };
    assert_eq!(o.status.code(), Some(want), "{args:?}: {}", text(&o));
    p.write(jsonl, &String::from_utf8_lossy(&o.stdout));
}

/// Every kind, resident and streamed, and one shard: the machine lines and the CSV rows.
fn run_every_kind(p: &Project) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for kind in ["decide", "generate", "perplexity"] {
        for (how, extra) in [
            ("resident", &[][..]),
            (
                "streamed",
                &["--set", "moe_stream=true", "--set", "cache_mb=1"][..],
            ),
        ] {
            let (csv, jsonl) = (
                format!("runs/{kind}-{how}.csv"),
                format!("runs/{kind}-{how}.jsonl"),
            );
            run_machine(p, &format!("jobs/{kind}.toml"), &csv, &jsonl, extra);
            out.push((csv, jsonl));
        }
    }
    let (csv, jsonl) = ("runs/shard.csv".to_string(), "runs/shard.jsonl".to_string());
    run_machine(
        p,
        "jobs/decide.toml",
        &csv,
        &jsonl,
        &["--shard", "0/1", "--allow-empty"],
    );
    out.push((csv, jsonl));
    out
}

#[test]
fn machine_lines_and_csv_rows_validate_against_the_shipped_schema() {
    let Some(py) = py_tools() else { return };
    let p = project();
    let files = run_every_kind(&p);
    let mut args = vec![schema_path(), "--pairs".to_string()];
    for (csv, jsonl) in &files {
        args.extend([
            "--jsonl".into(),
            p.path(jsonl).display().to_string(),
            "--csv".into(),
            p.path(csv).display().to_string(),
        ]);
    }
    let out = python(&py, "telemetry_check.py", &args);
    let summary: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(
        summary["kinds"],
        serde_json::json!(["decide", "generate", "perplexity"]),
        "{out}"
    );
    // 2 decisions, 2 prompts, 1 text; each resident and streamed; the shard's 2 decisions.
    assert_eq!(summary["machine_lines"], 12, "{out}");
    assert_eq!(summary["csv_rows"], 12, "{out}");
}

/// The schema version this build writes, from the shipped schema.
fn current_version() -> u64 {
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(schema_path()).unwrap()).unwrap();
    s["x-schema-version"]
        .as_u64()
        .expect("schemas/telemetry.schema.json has no x-schema-version")
}

#[test]
fn a_dashboard_reads_this_and_older_schema_versions_with_duckdb() {
    let Some(py) = py_tools() else { return };
    let p = project();
    run_every_kind(&p);
    let current = current_version();
    let mut args = vec![schema_path()];
    for f in [
        "decide-streamed",
        "generate-resident",
        "perplexity-resident",
    ] {
        args.push(p.path(&format!("runs/{f}.csv")).display().to_string());
    }
    let fixtures = repo_root().join("runner/tests/fixtures");
    let mut previous = 0;
    for e in std::fs::read_dir(&fixtures).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        let Some(v) = name
            .strip_prefix("schema")
            .and_then(|r| r.split('-').next())
            .and_then(|v| v.parse::<u64>().ok())
        else {
            continue;
        };
        if !name.ends_with(".csv") {
            continue;
        }
        // The newest fixture is the version before this build's once SCHEMA_VERSION moves on
        // (written by that build: schema9-*.csv by be26907).
        assert!(v <= current, "{name}: a fixture of a newer schema version");
        previous = previous.max(v);
        let want = if v == 1 { "none".into() } else { v.to_string() };
        args.push(format!("{}={want}", fixtures.join(&name).display()));
    }
    assert!(previous >= 9, "no fixture of schema 9 or later");
    let out = python(&py, "dashboard.py", &args);
    let summary: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let groups = summary["groups"].as_array().unwrap();
    for (kind, version) in [
        ("decide", current),
        ("generate", current),
        ("perplexity", current),
        ("decide", previous),
    ] {
        assert!(
            groups
                .iter()
                .any(|g| g[0] == kind && g[1].as_u64() == Some(version)),
            "no {kind} rows of schema {version}: {out}"
        );
    }
}
