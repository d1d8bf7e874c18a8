//! The shipped examples (profiles/, jobs/) check, plan and run against the tiny model.
mod common;
use common::{text, Project};

/// Puts the repository's profiles/ and jobs/ into a scratch project beside models/tiny.gguf.
fn project_with_examples() -> Project {
    let p = Project::new();
    for dir in ["profiles", "jobs"] {
        for e in std::fs::read_dir(common::repo_root().join(dir)).unwrap() {
            let e = e.unwrap();
            std::fs::copy(
                e.path(),
                p.path(&format!("{dir}/{}", e.file_name().to_string_lossy())),
            )
            .ok();
            if !p.path(dir).exists() {
                std::fs::create_dir_all(p.path(dir)).unwrap();
                std::fs::copy(
                    e.path(),
                    p.path(&format!("{dir}/{}", e.file_name().to_string_lossy())),
                )
                .unwrap();
            }
        }
    }
    p
}

#[test]
fn every_example_job_checks_with_every_profile() {
    let p = project_with_examples();
    let jobs: Vec<String> = std::fs::read_dir(p.path("jobs"))
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".toml"))
        .map(|n| format!("jobs/{n}"))
        .collect();
    assert!(jobs.len() >= 3, "{jobs:?}");
    let profiles: Vec<String> = std::fs::read_dir(p.path("profiles"))
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| format!("profiles/{}", e.file_name().to_string_lossy()))
        .filter(|n| n.ends_with(".toml"))
        .collect();
    assert!(profiles.len() >= 5, "{profiles:?}");
    for prof in &profiles {
        let mut args = vec!["check", "--profile", prof.as_str()];
        args.extend(jobs.iter().map(|s| s.as_str()));
        let o = p.bmoe(&args);
        assert!(o.status.success(), "{prof}: {}", text(&o));
    }
}

#[test]
fn demo_job_runs_and_writes_its_csv() {
    let p = project_with_examples();
    let o = p.bmoe(&["run", "jobs/demo.toml"]);
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    assert!(out.contains("3 rows appended to runs/demo.csv"), "{out}");
    assert_eq!(common::data_lines(&p.read("runs/demo.csv")).len(), 3);
}

#[test]
fn plan_explains_values_placement_and_budget() {
    let p = project_with_examples();
    let o = p.bmoe(&[
        "plan",
        "jobs/agent-replay.toml",
        "--profile",
        "profiles/galaxy-s22.toml",
        "--set",
        "threads=3",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    // Origins of values: default, profile, job overrides, --set.
    assert!(
        out.contains("threads         3              --set"),
        "{out}"
    );
    assert!(
        out.contains("job jobs/agent-replay.toml [overrides]"),
        "{out}"
    );
    assert!(out.contains("profile profiles/galaxy-s22.toml"), "{out}");
    // Hexagon v69 refuses the NPU with a reason.
    assert!(out.contains("CPU (Hexagon v69 is older than v73"), "{out}");
    assert!(out.contains("KV cache"), "{out}");
    assert!(out.contains("auto -> "), "{out}");
}

#[test]
fn an_unregistered_device_leaves_prefill_on_the_cpu() {
    let p = project_with_examples();
    let o = p.bmoe(&[
        "plan",
        "jobs/demo.toml",
        "--profile",
        "profiles/oneplus-15.toml",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("CPU (HTP0 is not in this build's registry)"),
        "{}",
        text(&o)
    );
}
