//! One reader of bmoe CSVs (issue 30, item 6): `run`, `compare`, `merge` and `report` read a file
//! the same way: a foreign file refused in the same words, a bad cell named by the file's own
//! line, and a refused file leaving nothing of itself behind.
use crate::common;

use common::{text, Project, DECIDE_JOB};

const HEAD: &str = "run_id,job,profile,point,item,cache_mb,n_prompt,prefill_s,prefill_tps,best\n";

/// Rows of one run, items 0..n.
fn rows(run: &str, n: usize) -> String {
    let mut s = String::from(HEAD);
    for item in 0..n {
        s.push_str(&format!("{run},tune,phone,base,{item},0,100,1.0,100.0,1\n"));
    }
    s
}

#[test]
fn a_foreign_file_is_refused_the_same_way_by_every_command() {
    let p = Project::new();
    p.write("good.csv", &rows("r1", 2));
    p.write("runs/decide.csv", "name,score\nalice,3\n");
    p.decisions("jobs/decisions.jsonl", 2);
    p.write("jobs/job.toml", DECIDE_JOB);
    let want = "runs/decide.csv: not a bmoe telemetry CSV: no column job, profile, point, item \
                (expected the bmoe columns job, profile, point, item of docs/telemetry.md; its \
                header is `name,score`)";
    let runs: [&[&str]; 4] = [
        &["compare", "good.csv", "runs/decide.csv"],
        &["merge", "good.csv", "runs/decide.csv", "-o", "all.csv"],
        &["report", "runs/decide.csv"],
        &["run", "jobs/job.toml", "--quiet"],
    ];
    for args in runs {
        let o = p.bmoe(args);
        let t = text(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {t}");
        assert!(t.contains(want), "{args:?}: {t}");
    }
    assert_eq!(p.read("runs/decide.csv"), "name,score\nalice,3\n");
}

/// A quoted cell may hold a newline (a hand edit, another tool's export), and a spreadsheet or
/// Python's csv module ends lines with CRLF: the line named is the file's (as `grep -n` counts),
/// in the same words in `compare`, `merge` and `report`, and the file is named once.
#[test]
fn a_bad_cell_is_named_by_the_files_own_line() {
    let p = Project::new();
    p.write("good.csv", &rows("r1", 2));
    for eol in ["\n", "\r\n"] {
        let mut bad = String::from(HEAD);
        bad.push_str("r1,tune,phone,base,\"two\nlines\",0,100,1.0,100.0,1\n");
        bad.push_str("r1,tune,phone,base,1,0,100,banana,100.0,1\n");
        p.write(
            "bad.csv",
            &bad.replace('\n', eol).replace("two\r\n", "two\n"),
        );
        let mut flat = String::from(HEAD);
        flat.push_str("r1,tune,phone,base,0,0,100,1.0,100.0,1\n");
        flat.push_str("r1,tune,phone,base,1,0,100,1.0,100.0,1\n");
        flat.push_str("r1,tune,phone,base,2,0,100,banana,100.0,1\n");
        p.write("flat.csv", &flat.replace('\n', eol));
        for file in ["bad.csv", "flat.csv"] {
            let want = format!("{file} line 4, column prefill_s: \"banana\" is not a number");
            let runs: [&[&str]; 3] = [
                &["compare", "good.csv", file],
                &["merge", file, "-o", "all.csv"],
                &["report", file],
            ];
            for args in runs {
                let o = p.bmoe(args);
                let t = text(&o);
                assert_eq!(o.status.code(), Some(2), "{eol:?} {args:?}: {t}");
                assert!(t.contains(&want), "{eol:?} {args:?}: {t}");
                assert_eq!(t.matches(file).count(), 1, "{file} named once: {t}");
            }
        }
    }
}

/// A file the report leaves out (a bad cell) leaves nothing behind: its rows before the bad one
/// do not make a good file's same rows duplicates.
#[test]
fn a_left_out_file_does_not_make_duplicates() {
    let p = Project::new();
    let good = rows("r1", 3);
    p.write("good.csv", &good);
    p.write(
        "bad.csv",
        &(good.clone() + "r1,tune,phone,base,9,0,100,x,1,1\n"),
    );
    let o = p.bmoe(&["report", "bad.csv", "good.csv"]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("warning: left out: bad.csv"), "{t}");
    assert!(!t.contains("repeat an earlier row"), "{t}");
}
