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

/// A SIGTERM that arrives while the run is still reading its inputs, before any item (a scheduler
/// stopping a task that just started), stops it the clean way: exit 130 with the resume hint,
/// nothing run, and the resume runs everything. Before, the handler was installed only after the
/// jobs, the choices check and the probe, so the signal's default action killed bmoe (status 143
/// in a shell, which deploy/entrypoint.sh does not requeue); the soak (scripts/soak) met it in 6 of
/// 21 SIGTERMs. The decisions file is a FIFO, which holds the run inside its input reading until
/// this test writes it: no timing involved.
#[test]
fn sigterm_while_the_inputs_load_stops_cleanly() {
    use std::io::Write;
    use std::os::unix::process::ExitStatusExt;
    let p = Project::new();
    p.write("jobs/job.toml", DECIDE_JOB);
    p.decisions("jobs/later.jsonl", 3);
    let fifo = p.path("jobs/decisions.jsonl");
    let st = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(st.success());
    let mut child = p
        .cmd(&["run", "jobs/job.toml", "--run-id", "night-1", "--quiet"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Opening the FIFO for writing returns once the run has opened it for reading.
    let mut w = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
    let st = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    // The run is killed by then (the old behaviour) or reads on: either way the pipe closes.
    let _ = w.write_all(p.read("jobs/later.jsonl").as_bytes());
    drop(w);
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > Duration::from_secs(120) {
            child.kill().unwrap();
            panic!("the run did not end within 120 s of its SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        o.status.code(),
        Some(130),
        "killed by signal {:?}; {err}",
        o.status.signal()
    );
    assert!(err.contains("interrupted; continue with"), "{err}");
    // Nothing ran; the resume runs all three.
    std::fs::remove_file(&fifo).unwrap();
    std::fs::rename(p.path("jobs/later.jsonl"), &fifo).unwrap();
    let o = p.bmoe(&["run", "jobs/job.toml", "--resume", "--run-id", "night-1"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(data_lines(&p.read("runs/decide.csv")).len(), 3);
}
