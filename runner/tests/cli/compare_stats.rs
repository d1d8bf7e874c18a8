//! `bmoe compare`'s statistics per (job, profile, point): the paired accuracy change's 95%
//! interval and McNemar's p agree with an independent computation in Python's standard library
//! (same seed), the flipped items are listed, and `--fail-on-regression` exits 1 on a lossy
//! replay (`n_expert_used` halved) and 0 against itself.
use crate::common;
use common::{data_lines, json, repo_root, report_group, text, Project};

/// A decide job over `n` decisions that carry an expected answer, each with its own four
/// choices (so halving the experts changes some `best`).
fn project(n: usize) -> Project {
    let p = Project::new();
    let words = [
        "open", "save", "close", "edit", "send", "copy", "paste", "undo", "print", "share",
        "reply", "archive", "delete", "star", "move", "search",
    ];
    let mut s = String::new();
    for i in 1..=n {
        let ch: Vec<&str> = (0..4).map(|k| words[(i * 3 + k * 5) % 16]).collect();
        let quoted: Vec<String> = ch.iter().map(|c| format!("\"{c}\"")).collect();
        s.push_str(&format!(
            "{{\"id\": \"d{i:02}\", \"prefix\": \"Task {i}: do step {}.\\n\", \"suffix\": \"Screen: {}\", \"choices\": [{}], \"expected\": \"{}\"}}\n",
            i * 7,
            ch.join(", "),
            quoted.join(", "),
            ch[i % 4]
        ));
    }
    p.write("jobs/decisions.jsonl", &s);
    p.write(
        "jobs/job.toml",
        "name = \"decide\"\nmodel = \"../models/tiny.gguf\"\nkind = \"decide\"\nprofile = \"../profiles/host.toml\"\ncsv = \"../runs/decide.csv\"\ndecisions_file = \"decisions.jsonl\"\nscoring = \"sum\"\n",
    );
    p
}

/// Runs the job into `csv` with extra `--set` values.
fn replay(p: &Project, csv: &str, set: &[&str]) {
    let mut args = vec!["run", "jobs/job.toml", "--quiet", "--csv", csv];
    for s in set {
        args.extend(["--set", s]);
    }
    let o = p.bmoe(&args);
    assert!(o.status.success(), "{}", text(&o));
}

/// `g`, bmoe's statistics of `a` against `b`, equal those `paired_stats.py` computes from the two
/// CSVs alone with Python's standard library.
fn check_against_python(p: &Project, (a, b): (&str, &str), g: &serde_json::Value, name: &str) {
    let py = std::process::Command::new("python3")
        .arg(repo_root().join("runner/tests/fixtures/paired_stats.py"))
        .arg(p.path(a))
        .arg(p.path(b))
        .output()
        .expect("python3");
    assert!(py.status.success(), "{}", text(&py));
    let want: serde_json::Value = serde_json::from_slice(&py.stdout).unwrap();
    let want = &want[name];
    for f in ["change", "low", "high"] {
        assert_eq!(
            g["change"][f].as_f64(),
            want[f].as_f64(),
            "{f}: {g} vs {want}"
        );
    }
    let (got_p, want_p) = (
        g["mcnemar_p"].as_f64().unwrap(),
        want["mcnemar_p"].as_f64().unwrap(),
    );
    assert!(
        (got_p - want_p).abs() <= 1e-12 * want_p,
        "{got_p} vs {want_p}"
    );
    assert_eq!(g["right_to_wrong"], want["right_to_wrong"], "{g}");
    assert_eq!(g["wrong_to_right"], want["wrong_to_right"], "{g}");
}

#[test]
fn interval_and_flips_match_python_and_the_gate_trips_on_a_lossy_replay() {
    let p = project(24);
    replay(&p, "runs/a.csv", &[]);
    replay(&p, "runs/b.csv", &["n_expert_used=1"]);

    let o = p.bmoe(&["compare", "runs/a.csv", "runs/b.csv", "--format", "json"]);
    let v = json(&o);
    let groups = v["groups"].as_array().expect("groups");
    assert_eq!(groups.len(), 1, "{v}");
    let g = &groups[0];
    let name = format!(
        "{}/{}/{}",
        g["job"].as_str().unwrap(),
        g["profile"].as_str().unwrap(),
        g["point"].as_str().unwrap()
    );

    check_against_python(&p, ("runs/a.csv", "runs/b.csv"), g, &name);
    assert!(g["change"]["low"].as_f64() <= g["change"]["change"].as_f64());
    assert!(
        g["logp_drift"]["max"].as_f64().unwrap() > 0.0,
        "halving the experts moves scores: {g}"
    );
    assert!(g["agreement"].as_f64().unwrap() < 1.0, "{g}");

    // Many items and flips both ways (a.csv's rows copied 20 times under new ids, B's `correct`
    // toggled on a pattern): an interval on a fine grid, which another seed or rank would move.
    let body = p.read("runs/a.csv");
    let mut rdr = csv::Reader::from_reader(body.as_bytes());
    let header = rdr.headers().unwrap().clone();
    let at = |n: &str| header.iter().position(|h| h == n).unwrap();
    let (c, item) = (at("correct"), at("item"));
    let rows: Vec<Vec<String>> = rdr
        .records()
        .map(|r| r.unwrap().iter().map(String::from).collect())
        .collect();
    let (mut wa, mut wb) = (
        csv::Writer::from_writer(Vec::new()),
        csv::Writer::from_writer(Vec::new()),
    );
    wa.write_record(&header).unwrap();
    wb.write_record(&header).unwrap();
    for k in 0..20 {
        for (i, r) in rows.iter().enumerate() {
            let mut cells = r.clone();
            cells[item] = format!("{}-{k:02}", cells[item]);
            wa.write_record(&cells).unwrap();
            if (i * 7 + k) % 3 == 0 || (i + k) % 5 == 0 {
                cells[c] = if cells[c] == "true" { "false" } else { "true" }.into();
            }
            wb.write_record(&cells).unwrap();
        }
    }
    p.write(
        "runs/big-a.csv",
        &String::from_utf8(wa.into_inner().unwrap()).unwrap(),
    );
    p.write(
        "runs/big-b.csv",
        &String::from_utf8(wb.into_inner().unwrap()).unwrap(),
    );
    let o = p.bmoe(&[
        "compare",
        "runs/big-a.csv",
        "runs/big-b.csv",
        "--format",
        "json",
    ]);
    let v = json(&o);
    let g2 = &v["groups"][0];
    check_against_python(&p, ("runs/big-a.csv", "runs/big-b.csv"), g2, &name);
    assert_eq!(g2["scored"], 480, "{g2}");
    let (lo, hi) = (
        g2["change"]["low"].as_f64().unwrap(),
        g2["change"]["high"].as_f64().unwrap(),
    );
    assert!(hi - lo > 0.05, "{g2}");

    // report: the same pair as two points of one file; the second point's accuracy change
    // against the reference (the first) carries the same interval.
    let both = format!(
        "{}{}",
        p.read("runs/big-a.csv"),
        data_lines(&p.read("runs/big-b.csv"))
            .iter()
            .map(|l| format!("{}\n", l.replace(",base,", ",lossy,")))
            .collect::<String>()
    );
    p.write("runs/points.csv", &both);
    let o = p.bmoe(&["report", "runs/points.csv", "--format", "json"]);
    let v = json(&o);
    let lossy = report_group(&v, "point", "lossy");
    let c = &lossy["accuracy_change"];
    assert_eq!(c["reference"], "base", "{c}");
    for f in ["change", "low", "high"] {
        assert_eq!(c["change"][f], g2["change"][f], "{f}: {c} vs {g2}");
    }

    // The text says the same, with the method and the flips.
    let o = p.bmoe(&["compare", "runs/a.csv", "runs/b.csv"]);
    let out = text(&o);
    assert!(out.contains("95% interval ["), "{out}");
    assert!(out.contains("paired bootstrap, 2000 resamples"), "{out}");
    assert!(out.contains("right->wrong ("), "{out}");
    assert!(out.contains("wrong->right ("), "{out}");

    // The gate: the lossy replay regresses (exit 1), a replay against itself does not (exit 0).
    let o = p.bmoe(&[
        "compare",
        "runs/a.csv",
        "runs/b.csv",
        "--fail-on-regression",
    ]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains("result: regression: "), "{out}");
    p.write(
        "runs/a-copy.csv",
        &p.read("runs/a.csv").replace("\ndecide-", "\ncopy-"),
    );
    let o = p.bmoe(&[
        "compare",
        "runs/a.csv",
        "runs/a-copy.csv",
        "--fail-on-regression",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("result: no regression"), "{}", text(&o));

    // Thresholds loose enough let the lossy replay through.
    let o = p.bmoe(&[
        "compare",
        "runs/a.csv",
        "runs/b.csv",
        "--fail-on-regression",
        "--max-accuracy-drop",
        "100",
        "--min-agreement",
        "0",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

#[test]
fn gate_thresholds_are_checked_and_need_fail_on_regression() {
    let p = Project::new();
    for args in [
        vec![
            "compare",
            "a.csv",
            "b.csv",
            "--fail-on-regression",
            "--min-agreement",
            "1.5",
        ],
        vec![
            "compare",
            "a.csv",
            "b.csv",
            "--fail-on-regression",
            "--max-accuracy-drop",
            "-1",
        ],
        vec!["compare", "a.csv", "b.csv", "--min-agreement", "0.9"],
    ] {
        let o = p.bmoe(&args);
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    }
}
