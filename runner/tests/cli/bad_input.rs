//! Bad input: each case exits non-zero with a clear, positioned error, no panic or backtrace, and
//! writes nothing (no runs/ folder, no CSV).
use crate::common;
use common::{text, Project, DECIDE_JOB};

/// Runs `bmoe run jobs/job.toml` (plus `extra`) and checks the failure: exit 2 (configuration error), every `expect`
/// fragment in the message, no panic, nothing written. Returns the output.
fn fails(p: &Project, extra: &[&str], expect: &[&str]) -> String {
    for cmd in ["check", "run"] {
        let mut args = vec![cmd, "jobs/job.toml"];
        args.extend_from_slice(extra);
        let o = p.bmoe(&args);
        let out = text(&o);
        assert_eq!(o.status.code(), Some(2), "{cmd}: {out}");
        for e in expect {
            assert!(out.contains(e), "{cmd}: expected {e:?} in:\n{out}");
        }
        assert!(out.starts_with("error: "), "{out}");
        assert!(
            !out.contains("panicked") && !out.contains("stack backtrace"),
            "{out}"
        );
        assert!(!p.path("runs").exists(), "{cmd} wrote runs/ on bad input");
    }
    let o = p.bmoe(&["check", "jobs/job.toml"]);
    text(&o)
}

fn decide_project(job: &str) -> Project {
    Project::deciding(3, job)
}

#[test]
fn malformed_toml() {
    let p = decide_project("name = \"x\"\nmodel = \nkind = \"decide\"\n");
    fails(&p, &[], &["jobs/job.toml:2:9: malformed TOML"]);
}

#[test]
fn wrong_type() {
    let p = decide_project(&format!("{DECIDE_JOB}n_predict = \"many\"\n"));
    fails(&p, &[], &["jobs/job.toml:8:13: n_predict: expected an integer between 1 and 1048576, found \"many\""]);
}

#[test]
fn unknown_key() {
    let p = decide_project(&format!("{DECIDE_JOB}[overrides]\ncache_size = 3\n"));
    // Nothing is near `cache_size`: the valid keys come as help.
    fails(
        &p,
        &[],
        &[
            "jobs/job.toml:9:1: overrides.cache_size: unknown key `cache_size`\n",
            "help: expected one of threads,",
        ],
    );
}

#[test]
fn value_out_of_range() {
    let p = decide_project(&format!("{DECIDE_JOB}[overrides]\nio_threads = 65\n"));
    fails(&p, &[], &["jobs/job.toml:9:14: overrides.io_threads: expected an integer between 1 and 64 or \"auto\", found 65"]);
}

#[test]
fn all_errors_of_a_file_together() {
    let p = decide_project(&format!(
        "{DECIDE_JOB}colour = \"blue\"\n[overrides]\ncache_mb = \"lots\"\nthreads = 0\n"
    ));
    let out = fails(
        &p,
        &[],
        &[
            "jobs/job.toml:8:1: colour: unknown key `colour`",
            "jobs/job.toml:10:12: overrides.cache_mb: expected an integer between 0 and 1073741824 or \"auto\", found \"lots\"",
            "jobs/job.toml:11:11: overrides.threads: expected an integer between 1 and 1024 or \"auto\", found 0",
            "3 configuration errors",
        ],
    );
    assert_eq!(out.matches("error: ").count(), 3, "{out}");
}

#[test]
fn missing_model() {
    let p = decide_project(&DECIDE_JOB.replace("tiny.gguf", "absent.gguf"));
    fails(
        &p,
        &[],
        &[
            "jobs/job.toml:3:9: model: model file",
            "absent.gguf does not exist",
        ],
    );
}

#[test]
fn missing_profile() {
    let p = decide_project(&DECIDE_JOB.replace("host.toml", "phone.toml"));
    fails(
        &p,
        &[],
        &[
            "jobs/job.toml:5:11: profile: profile file",
            "phone.toml does not exist",
        ],
    );
    let p = decide_project(DECIDE_JOB);
    fails(
        &p,
        &["--profile", "profiles/nope.toml"],
        &["profiles/nope.toml: profile file does not exist"],
    );
}

#[test]
fn invalid_jsonl_line() {
    let p = decide_project(DECIDE_JOB);
    let mut lines = p.read("jobs/decisions.jsonl");
    lines.push_str("{\"id\": \"d4\", \"prefix\": \"x\", \"choices\": [\"a\" \"b\"]}\n");
    lines.push_str("{\"id\": \"d5\", \"prefix\": 5, \"choices\": [\"a\"]}\n");
    p.write("jobs/decisions.jsonl", &lines);
    fails(
        &p,
        &[],
        &[
            "jobs/decisions.jsonl:4:45: not valid JSON",
            "jobs/decisions.jsonl:5:1: prefix: expected a string, found 5",
        ],
    );
}

#[test]
fn impossible_memory_budget() {
    let p = decide_project(DECIDE_JOB);
    p.write(
        "profiles/host.toml",
        "name = \"tight\"\nram_mb = 512\n[engine]\nmoe_stream = true\ncache_mb = 600\ncache_floor_mb = 256\n",
    );
    fails(
        &p,
        &[],
        &[
            "memory budget does not fit on profile tight",
            "expert cache 600.0",
            "leaves 256.0 MiB",
            "KV cache",
        ],
    );
}

#[test]
fn unknown_hexagon_version() {
    let p = decide_project(DECIDE_JOB);
    p.write(
        "profiles/host.toml",
        "name = \"phone\"\nhexagon = \"v77\"\nram_mb = 8192\n",
    );
    fails(
        &p,
        &[],
        &[
            "profiles/host.toml:2:11: hexagon: expected one of \"none\", \"v66\"",
            "\"v81\", found \"v77\"",
        ],
    );
}

#[test]
fn bad_environment_and_set_values_name_their_source() {
    let p = decide_project(DECIDE_JOB);
    let o = p
        .cmd(&[
            "run",
            "jobs/job.toml",
            "--set",
            "threads=x",
            "--set",
            "nope=1",
        ])
        .env("BMOE_CACHE_MB", "lots")
        .output()
        .unwrap();
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(out.contains("environment BMOE_CACHE_MB: cache_mb: expected an integer between 0 and 1073741824 or \"auto\", found \"lots\""), "{out}");
    assert!(
        out.contains(
            "--set: threads: expected an integer between 1 and 1024 or \"auto\", found \"x\""
        ),
        "{out}"
    );
    assert!(out.contains("unknown key `nope`"), "{out}");
    assert!(!p.path("runs").exists());
}

#[test]
fn a_csv_with_another_header_is_refused_and_untouched() {
    let p = decide_project(DECIDE_JOB);
    p.write("runs/decide.csv", "when,what\n1,2\n");
    let o = p.bmoe(&["run", "jobs/job.toml"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(
        out.contains("runs/decide.csv: not a bmoe telemetry CSV: no column job, profile, point, item (expected the bmoe columns job, profile, point, item of docs/telemetry.md; its header is `when,what`)"),
        "{out}"
    );
    assert_eq!(p.read("runs/decide.csv"), "when,what\n1,2\n");
}
