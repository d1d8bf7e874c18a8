//! Who may write a CSV and what a fleet's files must add up to: one `bmoe run` per CSV (a second
//! is refused while the first holds the lock, and a dead writer's lock blocks nothing); a selection
//! that takes no item is an error unless allowed, and an allowed empty shard writes a header-only
//! CSV; `merge` refuses a set of shards with a gap, creates its output as any file (umask), and
//! names a conflict's values as the CSV spells them; default run ids differ within a second.
use crate::common;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{data_lines, text, Project, DECIDE_JOB};

/// A decide job over `n` decisions (ids d1..dn) into runs/decide.csv.
fn decide_project(n: usize) -> Project {
    Project::deciding(n, DECIDE_JOB)
}

/// Waits until the CSV has at least one row (the writer holds its lock by then).
fn wait_for_a_row(p: &Project, csv: &str) {
    let t0 = Instant::now();
    while data_lines(&p.read(csv)).is_empty() {
        assert!(t0.elapsed() < Duration::from_secs(120), "no rows in {csv}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_second_writer_is_refused_while_the_first_runs_and_each_item_is_written_once() {
    const N: usize = 150;
    let p = decide_project(N);
    let first = p
        .cmd(&["run", "jobs/job.toml", "--run-id", "c3", "--quiet"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_a_row(&p, "runs/decide.csv");
    // The same run resumed, and another run id: both would append to the file being written.
    for args in [
        vec!["--run-id", "c3", "--resume"],
        vec!["--run-id", "other"],
    ] {
        let mut a = vec!["run", "jobs/job.toml", "--quiet", "--no-probe"];
        a.extend(args);
        let o = p.bmoe(&a);
        let out = text(&o);
        assert_eq!(o.status.code(), Some(2), "{a:?}: {out}");
        let holder = format!(
            "error: runs/decide.csv is being written by pid {} on host ",
            first.id()
        );
        assert!(out.contains(&holder), "{a:?}: {out}");
        assert!(out.contains("(started 20"), "{out}");
    }
    let o = first.wait_with_output().unwrap();
    assert!(
        o.status.success(),
        "the first run ended before the second started, or failed: {}",
        text(&o)
    );
    let csv = p.read("runs/decide.csv");
    let mut items: Vec<&str> = data_lines(&csv)
        .iter()
        .map(|l| {
            assert!(l.starts_with("c3,"), "only the first run wrote: {l}");
            l.split(',').nth(6).unwrap()
        })
        .collect();
    assert_eq!(items.len(), N, "every decision once");
    items.sort();
    items.dedup();
    assert_eq!(items.len(), N, "every decision once");
}

#[test]
fn a_killed_writers_lock_file_blocks_nothing() {
    let p = decide_project(60);
    let mut first = p
        .cmd(&["run", "jobs/job.toml", "--run-id", "k", "--quiet"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_a_row(&p, "runs/decide.csv");
    first.kill().unwrap();
    first.wait().unwrap();
    let stale = p.read("runs/.decide.csv.lock");
    assert!(
        stale.starts_with(&format!("pid {} on host ", first.id())),
        "{stale}"
    );
    let o = p.bmoe(&["run", "jobs/job.toml", "--run-id", "k", "--resume", "-q"]);
    assert!(o.status.success(), "{}", text(&o));
    // A lock file naming a process that is long gone, with no flock held: no obstacle either.
    p.write(
        "runs/.decide.csv.lock",
        "pid 999999 on host gone (started 2020)\n",
    );
    let o = p.bmoe(&[
        "run",
        "jobs/job.toml",
        "--run-id",
        "k2",
        "--limit",
        "1",
        "-q",
    ]);
    assert!(o.status.success(), "{}", text(&o));
}

#[test]
fn an_empty_selection_is_an_error_unless_allowed_and_then_writes_a_header_only_csv() {
    let p = decide_project(3);
    let o = p.bmoe(&["run", "jobs/job.toml", "--items", "nomatch-*", "-q"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(
        out.contains("error: --items 'nomatch-*' matched none of the 3 items of job decide; the ids look like d1, d2, d3"),
        "{out}"
    );
    assert!(!p.path("runs/decide.csv").exists(), "nothing written");
    let o = p.bmoe(&["run", "jobs/job.toml", "--limit", "0", "-q"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));

    let o = p.bmoe(&[
        "run",
        "jobs/job.toml",
        "--items",
        "nomatch-*",
        "--allow-empty",
        "-q",
    ]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("0 rows appended to runs/decide.csv"), "{out}");
    let csv = p.read("runs/decide.csv");
    assert!(
        csv.starts_with("run_id,") && data_lines(&csv).is_empty(),
        "{csv:?}"
    );
}

/// Two decisions over three shards: d1 is shard 1, d2 shard 0, shard 2 draws none.
fn three_shards(p: &Project) {
    for k in 0..3 {
        let shard = format!("{k}/3");
        let mut a = vec![
            "run",
            "jobs/job.toml",
            "--shard",
            &shard,
            "--run-id",
            "e",
            "--csv",
            "runs/shard-{shard}.csv",
            "-q",
        ];
        if k == 2 {
            let o = p.bmoe(&a);
            let out = text(&o);
            assert_eq!(o.status.code(), Some(2), "{out}");
            assert!(
                out.contains("--shard 2/3 matched none of the 2 items of job decide; a shard of a fleet may draw no item: add --allow-empty"),
                "{out}"
            );
            a.push("--allow-empty");
        }
        let o = p.bmoe(&a);
        let out = text(&o);
        assert_eq!(o.status.code(), Some(0), "{out}");
        let rows = usize::from(k < 2);
        assert!(
            out.contains(&format!(
                "run e shard {k}/3: {rows} {} appended to runs/shard-{k}.csv",
                if rows == 1 { "row" } else { "rows" }
            )),
            "{out}"
        );
        let csv = p.read(&format!("runs/shard-{k}.csv"));
        assert!(csv.starts_with("run_id,"), "shard {k}: {csv:?}");
        assert_eq!(data_lines(&csv).len(), rows);
    }
}

#[test]
fn merge_refuses_a_set_of_shards_with_a_gap() {
    let p = decide_project(2);
    three_shards(&p);
    let merge = |inputs: &[&str], extra: &[&str]| {
        let mut a = vec!["merge"];
        a.extend(inputs);
        a.extend(["-o", "runs/all.csv", "--force"]);
        a.extend(extra);
        p.bmoe(&a)
    };
    let all = ["runs/shard-0.csv", "runs/shard-1.csv", "runs/shard-2.csv"];
    let o = merge(&all, &[]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("2 rows written to runs/all.csv"), "{out}");
    let o = merge(&all, &["--expect-shards", "3"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));

    // The empty shard forgotten: the rows say 0/3 and 1/3, so 2/3 is missing.
    std::fs::remove_file(p.path("runs/all.csv")).unwrap();
    let o = merge(&all[..2], &[]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(
        out.contains("error: merge: shard(s) 2/3 of run e have no rows; give every shard's CSV (a shard that drew no item writes a header-only one), or add --allow-partial"),
        "{out}"
    );
    assert!(!p.path("runs/all.csv").exists(), "nothing written");
    // One shard with rows and the empty one: the header-only file stands for one missing shard,
    // not two.
    let o = merge(&[all[0], all[2]], &[]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(
        out.contains("shard(s) 1/3 of run e, 2/3 of run e have no rows; the 1 input(s) without rows (runs/shard-2.csv) stand for only 1 of them"),
        "{out}"
    );
    let o = merge(&all[..2], &["--allow-partial", "--format", "json"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(
        out.contains("warning: merge: shard(s) 2/3 of run e have no rows"),
        "{out}"
    );
    let rep: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(rep["missing_shards"], serde_json::json!(["2/3 of run e"]));
    // --expect-shards disagrees with the rows; or the rows say nothing and inputs are too few.
    let o = merge(&all, &["--expect-shards", "4"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(
        out.contains(
            "--expect-shards 4, but the rows of run e in runs/shard-0.csv are shards of 3"
        ),
        "{out}"
    );
    let o = merge(&[all[2]], &["--expect-shards", "2"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let o = merge(&[all[2]], &["--expect-shards", "1"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

#[test]
fn a_merged_csv_is_created_as_the_umask_says() {
    use std::os::unix::fs::PermissionsExt;
    let p = decide_project(2);
    let o = p.bmoe(&["run", "jobs/job.toml", "--run-id", "u", "-q"]);
    assert!(o.status.success(), "{}", text(&o));
    for (umask, mode) in [("022", 0o644), ("027", 0o640)] {
        let out = format!("runs/merged-{umask}.csv");
        let mut c = Command::new("sh");
        common::clean_env(&mut c);
        let o = c
            .current_dir(p.dir.path())
            .args(["-c", &format!("umask {umask} && exec \"$@\""), "sh"])
            .arg(env!("CARGO_BIN_EXE_bmoe"))
            .args(["merge", "runs/decide.csv", "-o", &out])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
        let m = std::fs::metadata(p.path(&out))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(m, mode, "umask {umask}: {m:o}");
    }
}

#[test]
fn a_merge_conflict_shows_the_values_as_the_csv_spells_them() {
    let p = decide_project(2);
    let o = p.bmoe(&["run", "jobs/job.toml", "--run-id", "x", "-q"]);
    assert!(o.status.success(), "{}", text(&o));
    // The first choice's log-probability of the first row, its last digit changed.
    let csv = p.read("runs/decide.csv");
    let mut rdr = csv::Reader::from_reader(csv.as_bytes());
    let header = rdr.headers().unwrap().clone();
    let col = header.iter().position(|h| h == "choice_logp").unwrap();
    let mut recs: Vec<csv::StringRecord> = rdr.records().map(Result::unwrap).collect();
    let cell = recs[0][col].to_string();
    let first = cell[1..].split(',').next().unwrap().to_string();
    let last = first.chars().last().unwrap();
    let other = format!(
        "{}{}",
        &first[..first.len() - 1],
        if last == '1' { '2' } else { '1' }
    );
    let changed = cell.replacen(&first, &other, 1);
    let mut fields: Vec<String> = recs[0].iter().map(String::from).collect();
    fields[col] = changed;
    recs[0] = csv::StringRecord::from(fields);
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record(&header).unwrap();
    for r in &recs {
        w.write_record(r).unwrap();
    }
    p.write(
        "runs/conflict.csv",
        &String::from_utf8(w.into_inner().unwrap()).unwrap(),
    );
    let o = p.bmoe(&[
        "merge",
        "runs/decide.csv",
        "runs/conflict.csv",
        "-o",
        "runs/bad.csv",
    ]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(
        out.contains(&format!("(`choice_logp` choice 0: {first} vs {other})")),
        "{out}"
    );
}

#[test]
fn default_run_ids_have_milliseconds() {
    let p = decide_project(1);
    let mut ids = Vec::new();
    for _ in 0..2 {
        let o = p.bmoe(&["run", "jobs/job.toml", "-q", "--format", "json"]);
        assert!(o.status.success(), "{}", text(&o));
        let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        ids.push(s["run_id"].as_str().unwrap().to_string());
    }
    for id in &ids {
        // decide-20261203T192928.123Z
        let ts = id.strip_prefix("decide-").unwrap();
        let b = ts.as_bytes();
        assert!(
            ts.len() == 20
                && b[8] == b'T'
                && b[15] == b'.'
                && b[19] == b'Z'
                && ts.chars().filter(char::is_ascii_digit).count() == 17,
            "{id}"
        );
    }
    assert_ne!(ids[0], ids[1]);
}

/// A swept decide run (2 points) in runs/decide.csv, for reports and overlays.
fn swept_project() -> Project {
    let p = decide_project(2);
    let o = p.bmoe(&[
        "run",
        "jobs/job.toml",
        "-q",
        "--set",
        "moe_stream=true",
        "--set",
        "cache_mb=0,1",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    p
}

/// Asserts a refusal: exit 2, the message holds each of `says`, and `file` is as it was.
fn refused(p: &Project, args: &[&str], says: &[&str], file: &str, before: &[u8]) {
    let o = p.bmoe(args);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {out}");
    for s in says {
        assert!(out.contains(s), "{args:?} should say {s:?}: {out}");
    }
    let now = std::fs::read(p.path(file)).unwrap_or_default();
    assert!(now == before, "{args:?} changed {file}");
}

#[test]
fn report_and_overlay_outputs_never_replace_an_input_or_a_foreign_file() {
    let p = swept_project();
    let csv = std::fs::read(p.path("runs/decide.csv")).unwrap();
    let input = ["is also an input", "runs/decide.csv"];
    refused(
        &p,
        &[
            "report",
            "runs/decide.csv",
            "-o",
            "runs/decide.csv",
            "--format",
            "md",
        ],
        &input,
        "runs/decide.csv",
        &csv,
    );
    // The same file by another spelling.
    refused(
        &p,
        &[
            "report",
            "runs/decide.csv",
            "-o",
            "runs/../runs/decide.csv",
            "--format",
            "html",
        ],
        &["is also an input"],
        "runs/decide.csv",
        &csv,
    );
    refused(
        &p,
        &[
            "report",
            "runs/decide.csv",
            "--best",
            "--write-overrides",
            "runs/decide.csv",
        ],
        &input,
        "runs/decide.csv",
        &csv,
    );

    // A file that is not a bmoe report (or overlay) is replaced only with --force.
    let job = std::fs::read(p.path("jobs/job.toml")).unwrap();
    refused(
        &p,
        &[
            "report",
            "runs/decide.csv",
            "--best",
            "--write-overrides",
            "jobs/job.toml",
        ],
        &["jobs/job.toml", "not an overlay", "--force"],
        "jobs/job.toml",
        &job,
    );
    p.write("notes.html", "<p>my notes</p>\n");
    refused(
        &p,
        &["report", "runs/decide.csv", "-o", "notes.html"],
        &["notes.html", "not a bmoe report", "--force"],
        "notes.html",
        b"<p>my notes</p>\n",
    );
    let o = p.bmoe(&["report", "runs/decide.csv", "-o", "notes.html", "--force"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(p.read("notes.html").contains("<title>bmoe report</title>"));

    // bmoe's own reports and overlays are replaced as before, in every format.
    for out in ["r.html", "r.md", "r.json"] {
        for _ in 0..2 {
            let o = p.bmoe(&["report", "runs/decide.csv", "-o", out]);
            assert!(o.status.success(), "{out}: {}", text(&o));
        }
    }
    for _ in 0..2 {
        let o = p.bmoe(&[
            "report",
            "runs/decide.csv",
            "--best",
            "--write-overrides",
            "best.toml",
        ]);
        assert!(o.status.success(), "{}", text(&o));
    }
}

#[test]
fn a_report_extension_must_match_its_format() {
    let p = swept_project();
    refused(
        &p,
        &["report", "runs/decide.csv", "-o", "r.txt"],
        &["r.txt", ".html", ".md", ".json", "--format"],
        "r.txt",
        b"",
    );
    refused(
        &p,
        &["report", "runs/decide.csv", "-o", "r.csv"],
        &["r.csv", ".html, .md or .json"],
        "r.csv",
        b"",
    );
    refused(
        &p,
        &[
            "report",
            "runs/decide.csv",
            "-o",
            "r.md",
            "--format",
            "html",
        ],
        &["r.md", "--format html", ".html"],
        "r.md",
        b"",
    );
    assert!(!p.path("r.txt").exists() && !p.path("r.md").exists());
    let o = p.bmoe(&["report", "runs/decide.csv", "-o", "r.HTML"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(p.read("r.HTML").contains("<!DOCTYPE html>"));
}

#[test]
fn synth_and_man_replace_only_their_own_files() {
    let p = Project::new();
    p.write("notes.txt", "keep me\n");
    refused(
        &p,
        &["synth", "--preset", "tiny", "-o", "notes.txt"],
        &["notes.txt", "not a GGUF", "--force"],
        "notes.txt",
        b"keep me\n",
    );
    let o = p.bmoe(&["synth", "--preset", "tiny", "-o", "notes.txt", "--force"]);
    assert!(o.status.success(), "{}", text(&o));
    // A GGUF is synth's own kind: replaced as before.
    let o = p.bmoe(&["synth", "--preset", "tiny", "-o", "models/tiny.gguf"]);
    assert!(o.status.success(), "{}", text(&o));

    p.write("man/bmoe-run.1", "my own notes\n");
    refused(
        &p,
        &["man", "-o", "man"],
        &["man/bmoe-run.1", "not a man page", "--force"],
        "man/bmoe-run.1",
        b"my own notes\n",
    );
    assert!(!p.path("man/bmoe.1").exists(), "nothing written");
    let o = p.bmoe(&["man", "-o", "man", "--force"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = p.bmoe(&["man", "-o", "man"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(p.read("man/bmoe-run.1").contains(".TH"));
}

/// The lock file is hidden (`runs/.x.csv.lock`: a `shard-*` glob does not take it) and gone when
/// the run ends; one given to merge anyway (an older build's `shard-0.csv.lock`) is skipped, said.
#[test]
fn the_lock_file_is_hidden_gone_after_the_run_and_skipped_by_merge() {
    let p = decide_project(2);
    let o = p.bmoe(&[
        "run",
        "jobs/job.toml",
        "-q",
        "--csv",
        "runs/night/shard-0.csv",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let names: Vec<String> = std::fs::read_dir(p.path("runs/night"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["shard-0.csv"], "only the CSV is left");
    p.write(
        "runs/night/shard-0.csv.lock",
        "pid 1 on host h (started 2026)\n",
    );
    let o = p.bmoe(&[
        "merge",
        "runs/night/shard-0.csv",
        "runs/night/shard-0.csv.lock",
        "-o",
        "all.csv",
    ]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains("warning: merge: skipping runs/night/shard-0.csv.lock: a lock file"),
        "{out}"
    );
    assert_eq!(data_lines(&p.read("all.csv")).len(), 2);
}
