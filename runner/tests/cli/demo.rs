//! scripts/demo's showcase: the jobs the script runs fill every headline column of the report.
use crate::common;
use common::{repo_root, text, Project};

/// The job files scripts/demo runs, as it names them (`jobs/<name>.toml`).
fn demo_jobs() -> Vec<String> {
    let script = std::fs::read_to_string(repo_root().join("scripts/demo")).unwrap();
    let mut jobs: Vec<String> = script
        .split(|c: char| c.is_whitespace() || "()\"'".contains(c))
        .filter(|w| w.starts_with("jobs/") && w.ends_with(".toml"))
        .map(str::to_string)
        .collect();
    jobs.dedup();
    jobs
}

#[test]
fn demo_jobs_stream_reuse_prefixes_and_fill_the_report() {
    let jobs = demo_jobs();
    assert!(!jobs.is_empty(), "scripts/demo names no jobs/*.toml");
    let p = Project::with_examples();
    // Two items per job and point keep the test short: a trace's second decision reuses the first's
    // prefix, and both prompts of the generate job decode.
    let mut args = vec!["run", "--profile", "profiles/host-cpu.toml", "--limit", "2"];
    args.extend(["--run-id", "t", "-q"]);
    args.extend(jobs.iter().map(String::as_str));
    let o = p.bmoe(&args);
    assert!(o.status.success(), "{}", text(&o));

    let csvs: Vec<String> = std::fs::read_dir(p.path("runs"))
        .unwrap()
        .map(|e| format!("runs/{}", e.unwrap().file_name().to_string_lossy()))
        .collect();
    assert!(
        csvs.iter().any(|c| p.read(c).contains(",extend,")),
        "no decision reused a cached prefix"
    );
    let mut args = vec!["report", "--format", "md"];
    args.extend(csvs.iter().map(String::as_str));
    let o = p.bmoe(&args);
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    for h in ["decode tok/s", "MiB read/token", "cache hit %"] {
        assert!(
            !out.contains(&format!("- {h}: no row")),
            "{h} left out:\n{out}"
        );
    }
    assert!(!out.contains("accuracy is left out"), "{out}");
    assert!(out.contains("agreement vs cache_mb=0"), "{out}");
    assert!(out.contains("| cache_mb=1 "), "{out}");
}
