//! `bmoe run --retry-errors`: runs again only the items whose latest row in the run failed (here a
//! prompt too long for the context, then fixed in the input); the new row supersedes the failed
//! one in `compare`, `merge` and `report`, and with nothing failed there is nothing to do (exit 0,
//! said: a CI step `run || run --retry-errors` passes on a good night).
use crate::common;
use common::{data_lines, text, Project, DECIDE_JOB};

/// Three decisions; `d2`'s prompt is `words` words long.
fn decisions(p: &Project, words: usize) {
    let long = "scroll ".repeat(words);
    let mut s = String::new();
    for (id, prefix) in [
        ("d1", "Task 1. "),
        ("d2", long.as_str()),
        ("d3", "Task 3. "),
    ] {
        s.push_str(&format!(
            "{{\"id\": \"{id}\", \"prefix\": \"{prefix}\", \"suffix\": \"Screen: OK, Cancel\", \"choices\": [\"OK\", \"Cancel\"], \"expected\": 0}}\n"
        ));
    }
    p.write("jobs/decisions.jsonl", &s);
}

fn rows(p: &Project) -> Vec<serde_json::Map<String, serde_json::Value>> {
    let body = p.read("runs/decide.csv");
    let mut rdr = csv::Reader::from_reader(body.as_bytes());
    let h: Vec<String> = rdr.headers().unwrap().iter().map(String::from).collect();
    rdr.records()
        .map(|r| {
            let r = r.unwrap();
            h.iter()
                .zip(r.iter())
                .map(|(k, v)| (k.clone(), serde_json::Value::from(v)))
                .collect()
        })
        .collect()
}

#[test]
fn retry_errors_reruns_only_the_failed_item_and_its_row_supersedes() {
    let p = Project::new();
    p.write("jobs/job.toml", DECIDE_JOB);
    // 2000 words: far over the profile's 512-token context.
    decisions(&p, 2000);
    let o = p.bmoe(&["run", "jobs/job.toml", "--quiet", "--run-id", "r1"]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "a refused item exits 1: {}",
        text(&o)
    );
    let before = rows(&p);
    assert_eq!(before.len(), 3);
    let failed: Vec<_> = before.iter().filter(|r| r["error"] != "").collect();
    assert_eq!(failed.len(), 1, "{before:?}");
    assert_eq!(failed[0]["item"], "d2");
    assert!(
        failed[0]["error"].as_str().unwrap().contains("context"),
        "{failed:?}"
    );

    // The input fixed; only d2 runs again, in the same run.
    decisions(&p, 5);
    let o = p.bmoe(&[
        "run",
        "jobs/job.toml",
        "--quiet",
        "--retry-errors",
        "--run-id",
        "r1",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let after = rows(&p);
    assert_eq!(after.len(), 4, "one new row: {}", p.read("runs/decide.csv"));
    assert_eq!(after[3]["item"], "d2");
    assert_eq!(after[3]["run_id"], "r1");
    assert_eq!(after[3]["error"], "", "{:?}", after[3]);

    // Nothing failed any more: nothing to retry, and nothing wrong with that.
    let o = p.bmoe(&[
        "run",
        "jobs/job.toml",
        "--quiet",
        "--retry-errors",
        "--run-id",
        "r1",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("nothing to retry"), "{}", text(&o));
    assert_eq!(rows(&p).len(), 4, "no row written");

    // compare (against a copy under another run id: a run against itself compares nothing): d2
    // is matched once, with its retry's outcome, and no duplicate is reported.
    p.write(
        "runs/other.csv",
        &p.read("runs/decide.csv").replace("\nr1,", "\nr2,"),
    );
    let o = p.bmoe(&[
        "compare",
        "runs/decide.csv",
        "runs/other.csv",
        "--format",
        "json",
    ]);
    let v: serde_json::Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{}", text(&o)));
    assert_eq!(v["matched"], 3, "{v}");
    assert_eq!(v["warnings"].as_array().unwrap().len(), 0, "{v}");
    assert_eq!(v["verdict"], "same", "{v}");

    // merge: the failed row gives way to its retry instead of conflicting with it.
    let o = p.bmoe(&["merge", "runs/decide.csv", "-o", "runs/merged.csv"]);
    assert!(o.status.success(), "{}", text(&o));
    let merged = p.read("runs/merged.csv");
    assert_eq!(data_lines(&merged).len(), 3, "{merged}");
    assert!(
        text(&o).contains("1 failed row(s) superseded by their retry"),
        "{}",
        text(&o)
    );

    // report: three rows, none refused.
    let o = p.bmoe(&["report", "runs/decide.csv", "--format", "json"]);
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{}", text(&o)));
    let g = &v["groups"][0];
    assert_eq!(g["rows"], 3, "{g}");
    assert_eq!(g["errors"], 0, "{g}");
}

#[test]
fn retry_errors_needs_a_run_and_excludes_resume() {
    let p = Project::new();
    p.write("jobs/job.toml", DECIDE_JOB);
    decisions(&p, 5);
    let o = p.bmoe(&["run", "jobs/job.toml", "--quiet", "--retry-errors"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--retry-errors"), "{}", text(&o));
    let o = p.bmoe(&["run", "jobs/job.toml", "--retry-errors", "--resume"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}
