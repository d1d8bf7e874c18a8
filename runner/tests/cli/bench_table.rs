//! docs/benchmarks.md's "Current results" table is what its CSVs give: each row's ratio and
//! interval, CPU, commit and date are recomputed by `bmoe report --format json` from the CSV the
//! row names (docs/bench-data/), and its job is a file under bench/. A row against `floor (read +
//! `REFERENCE`)` is a streamed point's decode against its floor (`disk_probe`), the `floor` of
//! its group.
use crate::common;

use common::{json, repo_root, report_group, text};

/// One row of the table, its cells trimmed of their backquotes.
struct Claim {
    job: String,
    point: String,
    reference: String,
    /// Against the floor (read + the reference's decode) rather than the reference's speed.
    floor: bool,
    phase: String,
    ratio: String,
    cpu: String,
    commit: String,
    date: String,
    csv: String,
}

/// The rows of the "Current results" table.
fn claims(doc: &str) -> Vec<Claim> {
    let section = doc
        .split("\n## Current results")
        .nth(1)
        .expect("docs/benchmarks.md has a \"Current results\" section");
    let section = section.split("\n## ").next().unwrap_or_default();
    let plain = |c: &str| c.trim().trim_matches('`').to_string();
    section
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| claim") && !l.contains("---"))
        .map(|l| {
            let c: Vec<&str> = l.trim().trim_matches('|').split(" | ").collect();
            assert_eq!(c.len(), 9, "a row of 9 cells: {l}");
            let (point, reference) = c[2].split_once(" vs ").expect("`point` vs `reference`");
            let floor = reference.strip_prefix("floor (read + ");
            let reference = floor.map_or(reference, |r| r.trim_end_matches(')'));
            Claim {
                job: plain(c[1]),
                point: plain(point),
                reference: plain(reference),
                floor: floor.is_some(),
                phase: plain(c[3]),
                ratio: plain(c[4]),
                cpu: plain(c[5]),
                commit: plain(c[6]),
                date: plain(c[7]),
                csv: plain(c[8]),
            }
        })
        .collect()
}

#[test]
fn every_current_result_is_what_its_csv_gives() {
    let root = repo_root();
    let doc = std::fs::read_to_string(root.join("docs/benchmarks.md")).unwrap();
    let rows = claims(&doc);
    assert!(!rows.is_empty(), "the table has rows");
    for c in &rows {
        assert!(root.join(&c.job).is_file(), "{}: no such job", c.job);
        let mut cmd = common::bmoe_command();
        cmd.current_dir(&root)
            .args(["report", &c.csv, "--format", "json"]);
        let o = cmd.args(["--reference", &c.reference]).output().unwrap();
        assert!(o.status.success(), "{}: {}", c.csv, text(&o));
        let d = json(&o);
        let g = report_group(&d, "label", &c.point);
        // The phase column names the metric: prefill and decode rates, decide's decisions.
        let metric = match c.phase.as_str() {
            "decision" => "decisions_per_s".to_string(),
            phase => format!("{phase}_tps"),
        };
        let s = if c.floor {
            assert_eq!(c.phase, "decode", "a floor is decode's: {}", c.point);
            let f = &g["floor"];
            assert!(f.is_object(), "{}: {} has no floor", c.csv, c.point);
            f
        } else {
            ["speedup", "prefill_speedup"]
                .iter()
                .map(|k| &g[*k])
                .find(|s| s["metric"] == metric.as_str())
                .unwrap_or_else(|| panic!("{}: {} has no {metric} speed-up", c.csv, c.point))
        };
        let f = |k: &str| s[k].as_f64().unwrap();
        let ratio = format!("{:.2}x [{:.2}, {:.2}]", f("value"), f("low"), f("high"));
        assert_eq!(c.ratio, ratio, "{} {} {}", c.csv, c.point, c.phase);
        let p = &d["provenance"];
        let joined = |k: &str| {
            let v: Vec<&str> = p[k]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap())
                .collect();
            v.join("; ")
        };
        assert_eq!(c.cpu, joined("cpus"), "{}", c.csv);
        assert_eq!(c.commit, joined("commits"), "{}", c.csv);
        assert_eq!(c.date, p["to"].as_str().unwrap()[..10], "{}", c.csv);
    }
}
