//! `bmoe compare`: two runs of one job agree everywhere; a run with another n_expert_used differs.
use crate::common;
use common::{text, Project, DECIDE_JOB};

#[test]
fn same_job_twice_is_identical_and_top_k_changes_are_reported() {
    let p = Project::new();
    p.decisions("jobs/decisions.jsonl", 6);
    p.write("jobs/job.toml", DECIDE_JOB);
    p.write(
        "jobs/other.toml",
        &DECIDE_JOB.replace("decide.csv", "decide-b.csv"),
    );
    p.write(
        "jobs/topk.toml",
        &DECIDE_JOB.replace("decide.csv", "decide-k1.csv"),
    );

    for (job, extra) in [
        ("jobs/job.toml", None),
        ("jobs/other.toml", None),
        ("jobs/topk.toml", Some("n_expert_used=1")),
    ] {
        let mut args = vec!["run", job, "--quiet"];
        if let Some(s) = extra {
            args.extend(["--set", s]);
        }
        let o = p.bmoe(&args);
        assert!(o.status.success(), "{}", text(&o));
    }

    let o = p.bmoe(&[
        "compare",
        "runs/decide.csv",
        "runs/decide-b.csv",
        "--fail-on-diff",
    ]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("decisions: 6/6 agree on best"), "{out}");
    assert!(
        out.contains("largest choice_logp difference: 0.000000"),
        "{out}"
    );
    assert!(out.contains("result: all 6 rows identical"), "{out}");
    assert!(out.contains("prefill_s ratio B/A over 6 rows"), "{out}");

    let o = p.bmoe(&["compare", "runs/decide.csv", "runs/decide-k1.csv"]);
    let out = text(&o);
    assert_eq!(
        o.status.code(),
        Some(1),
        "a difference exits 1, as diff does: {out}"
    );
    assert!(out.contains("rows differ"), "{out}");
    let o = p.bmoe(&[
        "compare",
        "runs/decide.csv",
        "runs/decide-k1.csv",
        "--fail-on-diff",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    // The CSV records the effective top-k.
    assert!(p
        .read("runs/decide-k1.csv")
        .lines()
        .nth(1)
        .unwrap()
        .contains(",1,"));
}

#[test]
fn machine_lines_and_schema_check() {
    let p = Project::new();
    p.decisions("jobs/decisions.jsonl", 2);
    p.write("jobs/job.toml", DECIDE_JOB);
    let o = p.bmoe(&["run", "jobs/job.toml", "--machine"]);
    assert!(o.status.success(), "{}", text(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    // Plain JSON Lines whose keys are the CSV's column names, with the CSV's values.
    let csv = p.read("runs/decide.csv");
    let mut rdr = csv::Reader::from_reader(csv.as_bytes());
    let header: Vec<String> = rdr.headers().unwrap().iter().map(String::from).collect();
    let records: Vec<csv::StringRecord> = rdr.records().map(|r| r.unwrap()).collect();
    for (l, rec) in lines.iter().zip(&records) {
        let v: serde_json::Value = serde_json::from_str(l).expect(l);
        let obj = v.as_object().unwrap();
        assert_eq!(
            obj.keys().cloned().collect::<Vec<_>>(),
            header,
            "JSON keys are the CSV columns, in order"
        );
        assert!(v["best"].is_u64() && v["prefill_s"].is_f64(), "{v}");
        let col = |name: &str| &rec[header.iter().position(|h| h == name).unwrap()];
        assert_eq!(v["item"].as_str().unwrap(), col("item"));
        assert_eq!(v["choice_logp"].as_str().unwrap(), col("choice_logp"));
        assert_eq!(
            v["prefill_s"].as_f64().unwrap().to_string(),
            col("prefill_s")
        );
        assert!(v["cache_hit_pct"].is_null(), "n/a is null, not -1: {v}");
    }
    // The schema-staleness check through the binary: current in the repo, stale after an edit.
    let repo_schemas = common::repo_root().join("schemas");
    let o = p.bmoe(&["schema", "--check", "--out", repo_schemas.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let o = p.bmoe(&["schema", "--out", "schemas"]);
    assert!(o.status.success(), "{}", text(&o));
    let job = p.read("schemas/job.schema.json").replacen(
        "\"maximum\": 1048576",
        "\"maximum\": 1048575",
        1,
    );
    p.write("schemas/job.schema.json", &job);
    let o = p.bmoe(&["schema", "--check", "--out", "schemas"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o).contains("job.schema.json differ from the code"),
        "{}",
        text(&o)
    );
}

/// A run compared with itself (the same file twice, or a copy of it) compares nothing: a
/// mis-set baseline path must not pass CI as "identical".
#[test]
fn a_run_compared_with_itself_is_refused() {
    let p = Project::new();
    p.decisions("jobs/decisions.jsonl", 2);
    p.write("jobs/job.toml", DECIDE_JOB);
    let o = p.bmoe(&["run", "jobs/job.toml", "--quiet"]);
    assert!(o.status.success(), "{}", text(&o));
    p.write("runs/copy.csv", &p.read("runs/decide.csv"));
    for b in ["runs/decide.csv", "./runs/decide.csv", "runs/copy.csv"] {
        for format in ["text", "json"] {
            let o = p.bmoe(&["compare", "runs/decide.csv", b, "--format", format]);
            let out = text(&o);
            assert_eq!(o.status.code(), Some(2), "{b} {format}: {out}");
            assert!(
                out.contains("warning: A and B are the same run (run decide-")
                    && out.contains("nothing was compared"),
                "{b} {format}: {out}"
            );
        }
    }
}
