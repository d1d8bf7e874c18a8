//! The probe: `bmoe check` and `bmoe run` load each model once in a child process first; a child
//! that dies (llama.cpp aborting) becomes `error: <file>: llama.cpp aborted while loading: ...`,
//! and `run` writes error rows and goes on with the next job.
use crate::common;
use common::{data_lines, text, Project, DECIDE_JOB};

fn project() -> Project {
    let p = Project::new();
    p.decisions("jobs/decisions.jsonl", 2);
    p.write("jobs/job.toml", DECIDE_JOB);
    p
}

#[test]
fn check_probes_the_model() {
    let p = project();
    let o = p.bmoe(&["check", "jobs/job.toml"]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains("probe: ") && out.contains("loaded in a child process"),
        "{out}"
    );
    let o = p.bmoe(&["check", "jobs/job.toml", "--no-probe"]);
    assert!(o.status.success());
    assert!(!text(&o).contains("probe: "));
}

#[test]
fn an_aborting_probe_is_an_error_line() {
    let p = project();
    let o = p
        .cmd(&["check", "jobs/job.toml"])
        .env("BMOE_PROBE_SELFTEST", "abort")
        .output()
        .unwrap();
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(
        out.contains("error: models/tiny.gguf: llama.cpp aborted while loading (SIGABRT): ")
            && out.contains("bmoe probe self-test"),
        "{out}"
    );
    assert!(!out.contains("panicked"), "{out}");
}

#[test]
fn run_writes_error_rows_for_an_aborting_model_and_goes_on() {
    let p = project();
    // A second job on another copy of the model, run after the first: both get their rows.
    std::fs::copy(p.path("models/tiny.gguf"), p.path("models/other.gguf")).unwrap();
    p.write(
        "jobs/other.toml",
        &DECIDE_JOB
            .replace("name = \"decide\"", "name = \"other\"")
            .replace("tiny.gguf", "other.gguf"),
    );
    let o = p
        .cmd(&["run", "jobs/job.toml", "jobs/other.toml", "-q"])
        .env("BMOE_PROBE_SELFTEST", "abort")
        .output()
        .unwrap();
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains("llama.cpp aborted while loading"), "{out}");
    let csv = p.read("runs/decide.csv");
    let rows = data_lines(&csv);
    assert_eq!(rows.len(), 4, "{csv}");
    assert!(
        rows.iter()
            .all(|r| r.contains("llama.cpp aborted while loading")),
        "{csv}"
    );
    // Without the probe the same run loads in-process (the hook only acts in the probe child).
    let o = p.bmoe(&[
        "run",
        "jobs/job.toml",
        "-q",
        "--no-probe",
        "--run-id",
        "trusted",
    ]);
    assert!(o.status.success(), "{}", text(&o));
}

#[test]
fn run_writes_error_rows_for_a_refused_model_and_goes_on() {
    let p = project();
    let mut b = std::fs::read(p.path("models/tiny.gguf")).unwrap();
    let i = b.windows(6).position(|w| w == b"<0x41>").unwrap();
    b[i..i + 6].copy_from_slice(b"<0x42>");
    std::fs::write(p.path("models/bad.gguf"), b).unwrap();
    p.write(
        "jobs/bad.toml",
        &DECIDE_JOB
            .replace("name = \"decide\"", "name = \"bad\"")
            .replace("tiny.gguf", "bad.gguf"),
    );
    for probe in [true, false] {
        let run_id = if probe { "probed" } else { "unprobed" };
        let mut args = vec![
            "run",
            "jobs/bad.toml",
            "jobs/job.toml",
            "-q",
            "--run-id",
            run_id,
        ];
        if !probe {
            args.push("--no-probe");
        }
        let o = p.bmoe(&args);
        let out = text(&o);
        assert_eq!(o.status.code(), Some(1), "{out}");
        assert!(
            out.contains("error: ") && out.contains("tokens 68 and 69 are both"),
            "{out}"
        );
        let csv = p.read("runs/decide.csv");
        let rows: Vec<&str> = data_lines(&csv)
            .into_iter()
            .filter(|r| r.contains(run_id))
            .collect();
        assert_eq!(rows.len(), 4, "{csv}");
        let bad = rows
            .iter()
            .filter(|r| r.contains("tokens 68 and 69"))
            .count();
        assert_eq!(bad, 2, "the bad model's two items are error rows: {csv}");
    }
    // check names the model too, with or without the probe.
    for extra in [None, Some("--no-probe")] {
        let mut args = vec!["check", "jobs/bad.toml"];
        args.extend(extra);
        let o = p.bmoe(&args);
        let out = text(&o);
        assert_eq!(o.status.code(), Some(2), "{out}");
        assert!(
            out.contains("bad.gguf: tokenizer.ggml.tokens: tokens 68 and 69"),
            "{out}"
        );
    }
}

/// A probe's child that never ends (the self-test hook hangs after the load) is killed at
/// `--load-timeout` (`load_timeout_s`'s one-shot form): `check` fails and `run` writes error
/// rows, both saying so.
#[test]
fn a_hanging_probe_is_killed_at_the_load_timeout() {
    let p = project();
    let want = "the load did not finish within 1 s (load_timeout_s); the probe's child was killed";
    let o = p
        .cmd(&["check", "jobs/job.toml", "--load-timeout", "1"])
        .env("BMOE_PROBE_SELFTEST", "hang")
        .output()
        .unwrap();
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(
        out.contains(want) && out.contains("hanging as a stuck load would"),
        "{out}"
    );
    let o = p
        .cmd(&["run", "jobs/job.toml", "-q", "--load-timeout", "1"])
        .env("BMOE_PROBE_SELFTEST", "hang")
        .output()
        .unwrap();
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    let csv = p.read("runs/decide.csv");
    let rows = data_lines(&csv);
    assert_eq!(rows.len(), 2, "{csv}");
    assert!(rows.iter().all(|r| r.contains(want)), "{csv}");
}

/// `load_timeout_s` is a setting: from a profile's `[engine]` table or a job's `[overrides]`,
/// it limits the probe's child; `--load-timeout` is the highest layer over both.
#[test]
fn the_load_timeout_is_a_setting() {
    let p = project();
    p.write(
        "profiles/host.toml",
        &format!("{}load_timeout_s = 2\n", common::HOST_PROFILE),
    );
    let killed = |s: u64| {
        format!(
            "the load did not finish within {s} s (load_timeout_s); the probe's child was killed"
        )
    };
    let hang = |args: &[&str]| {
        let o = p
            .cmd(args)
            .env("BMOE_PROBE_SELFTEST", "hang")
            .output()
            .unwrap();
        (o.status.code(), text(&o))
    };
    // From the profile.
    let (code, out) = hang(&["check", "jobs/job.toml"]);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains(&killed(2)), "{out}");
    // The job's [overrides] over the profile.
    p.write(
        "jobs/job.toml",
        &format!("{DECIDE_JOB}\n[overrides]\nload_timeout_s = 1\n"),
    );
    let (code, out) = hang(&["run", "jobs/job.toml", "-q"]);
    assert_eq!(code, Some(1), "{out}");
    let csv = p.read("runs/decide.csv");
    let rows = data_lines(&csv);
    assert_eq!(rows.len(), 2, "{csv}");
    assert!(rows.iter().all(|r| r.contains(&killed(1))), "{csv}");
    // --set and --load-timeout over the job.
    let (_, out) = hang(&["check", "jobs/job.toml", "--set", "load_timeout_s=3"]);
    assert!(out.contains(&killed(3)), "{out}");
    let (_, out) = hang(&["check", "jobs/job.toml", "--load-timeout", "2"]);
    assert!(out.contains(&killed(2)), "{out}");
    // Out of range: a configuration error naming the key.
    let o = p.bmoe(&[
        "check",
        "jobs/job.toml",
        "--set",
        "load_timeout_s=0",
        "--no-probe",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("load_timeout_s"), "{}", text(&o));
}
