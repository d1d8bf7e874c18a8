//! A run killed with SIGKILL part way, then resumed: every decision exactly once, no torn row.
use crate::common;
use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{data_lines, text, Project, DECIDE_JOB};

const N: usize = 40;

#[test]
fn sigkill_then_resume_gives_each_decision_once() {
    let p = Project::new();
    p.decisions("jobs/decisions.jsonl", N);
    p.write("jobs/job.toml", DECIDE_JOB);
    let mut child = p
        .cmd(&["run", "jobs/job.toml", "--run-id", "night-1", "--quiet"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Kill once a few rows have landed, well before the end.
    let t0 = Instant::now();
    loop {
        let n = data_lines(&p.read("runs/decide.csv")).len();
        if n >= 3 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "no rows after 120 s"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "run ended before it could be killed"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let before = data_lines(&p.read("runs/decide.csv")).len();
    assert!(
        before < N,
        "the run finished before the kill ({before} rows)"
    );

    // Simulate the worst case too: a row torn mid-write.
    let mut csv = p.read("runs/decide.csv");
    csv.push_str("night-1,2026-01-01T00:00:00Z,decide,decide,host,base,d999,models/ti");
    p.write("runs/decide.csv", &csv);

    let o = p.bmoe(&["run", "jobs/job.toml", "--resume"]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("the last row was torn"), "{out}");
    assert!(out.contains(&format!("skipped {before} items")), "{out}");

    let csv = p.read("runs/decide.csv");
    assert!(csv.ends_with('\n'));
    assert_eq!(csv.matches("run_id,").count(), 1, "header written once");
    let mut rdr = csv::Reader::from_reader(csv.as_bytes());
    let headers = rdr.headers().unwrap().clone();
    let item = headers.iter().position(|h| h == "item").unwrap();
    let run = headers.iter().position(|h| h == "run_id").unwrap();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for rec in rdr.records() {
        let rec = rec.expect("every row parses");
        assert_eq!(rec.len(), headers.len(), "no torn row");
        assert_eq!(&rec[run], "night-1");
        *seen.entry(rec[item].to_string()).or_default() += 1;
    }
    assert_eq!(seen.len(), N, "{seen:?}");
    assert!(seen.values().all(|&c| c == 1), "{seen:?}");

    // A second resume has nothing left to do.
    let o = p.bmoe(&["run", "jobs/job.toml", "--resume", "--run-id", "night-1"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains(&format!("skipped {N} items")),
        "{}",
        text(&o)
    );
    // Reusing a run id without --resume is refused.
    let o = p.bmoe(&["run", "jobs/job.toml", "--run-id", "night-1"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).contains("already has rows; add --resume"),
        "{}",
        text(&o)
    );
}
