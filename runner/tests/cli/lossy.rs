//! The lossy speed knobs (`expert_substitute`, `drop_cold`) end to end: the example sweep on a
//! phone profile counted per row, priced by `bmoe report --best --require "agreement>=0.95"`, and
//! the one-shot flags counted in the commands' JSON stream stats.
use crate::common;
use std::collections::BTreeMap;

use common::{text, Project};

/// Per sweep point: (rows, experts substituted, experts dropped), summed from the CSV.
fn counts_per_point(csv: &str) -> BTreeMap<String, (usize, u64, u64)> {
    let mut rdr = csv::Reader::from_reader(csv.as_bytes());
    let h = rdr.headers().unwrap().clone();
    let col = |name: &str| h.iter().position(|c| c == name).expect(name);
    let (point, sub, drop) = (
        col("point"),
        col("experts_substituted"),
        col("experts_dropped"),
    );
    let mut out = BTreeMap::new();
    for r in rdr.records() {
        let r = r.unwrap();
        let e = out.entry(r[point].to_string()).or_insert((0, 0, 0));
        e.0 += 1;
        e.1 += r[sub].parse::<u64>().unwrap();
        e.2 += r[drop].parse::<u64>().unwrap();
    }
    out
}

#[test]
fn the_lossy_sweep_counts_each_point_and_report_picks_the_fastest_that_agrees() {
    let p = Project::with_examples();
    // Three decisions per point keep it short: the later ones extend a reused prefix in new
    // pieces, where some experts are cached and others miss.
    let o = p.bmoe(&["run", "jobs/lossy-sweep.toml", "--limit", "3", "-q"]);
    assert!(o.status.success(), "{}", text(&o));
    let per_point = counts_per_point(&p.read("runs/lossy-sweep.csv"));
    assert_eq!(per_point.len(), 9, "{per_point:?}");
    for (label, &(rows, substituted, dropped)) in &per_point {
        assert_eq!(rows, 3, "{label}");
        let on = |key: &str| {
            !label.contains(&format!("{key}=0,")) && !label.ends_with(&format!("{key}=0"))
        };
        assert_eq!(
            (substituted > 0, dropped > 0),
            (on("expert_substitute"), on("drop_cold")),
            "{label}: {substituted} substituted, {dropped} dropped"
        );
    }
    let o = p.bmoe(&[
        "report",
        "runs/lossy-sweep.csv",
        "--best",
        "--require",
        "agreement>=0.95",
    ]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains("agreement vs drop_cold=0,expert_substitute=0"),
        "agreement is measured against the lossless point: {out}"
    );
    let best = out
        .lines()
        .find_map(|l| l.strip_prefix("best point for job lossy-sweep on profile oneplus-13: "))
        .unwrap_or_else(|| panic!("no best point: {out}"));
    assert!(per_point.contains_key(best), "{best}: {out}");
    let meets = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("meets agreement>=0.95: "))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no requirement line: {out}"));
    assert!(meets >= 0.95, "{out}");
}

#[test]
fn one_shot_flags_count_in_the_json_stream_stats() {
    let m = common::model_path();
    let m = m.to_str().unwrap();
    let json = |args: &[&str]| -> serde_json::Value {
        let o = common::bmoe_command().args(args).output().unwrap();
        assert!(o.status.success(), "{}", text(&o));
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)))
    };
    let stream = [
        "--moe-stream",
        "--cache-mb",
        "1",
        "-t",
        "1",
        "--format",
        "json",
    ];
    // No cache hit before a layer's first routing node: nothing to substitute in a one-piece
    // decision, but every routed expert is a miss there, so the cold ones are dropped.
    let mut a = vec![
        "decide",
        "-m",
        m,
        "--prefix",
        "Pick one. ",
        "--suffix",
        "A or B?",
    ];
    a.extend(["--choice", "A", "--choice", "B", "--drop-cold", "1"]);
    a.extend(stream);
    let v = json(&a);
    assert!(v["stream"]["dropped"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(v["stream"]["substituted"].as_u64(), Some(0), "{v}");
    // Decoding token by token through an evicting cache: misses with cached neighbours.
    let mut a = vec![
        "generate",
        "-m",
        m,
        "-p",
        "Stream the experts, please.",
        "-n",
        "16",
    ];
    a.extend(["--expert-substitute", "0.1"]);
    a.extend(stream);
    let v = json(&a);
    assert!(v["stream"]["substituted"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(v["stream"]["dropped"].as_u64(), Some(0), "{v}");
    let text_file = std::env::temp_dir().join(format!("bmoe-lossy-{}.txt", std::process::id()));
    std::fs::write(
        &text_file,
        "one two three four five six seven eight nine ten ".repeat(4),
    )
    .unwrap();
    let mut a = vec![
        "ppl",
        "-m",
        m,
        text_file.to_str().unwrap(),
        "--drop-cold",
        "1",
    ];
    a.extend(stream);
    let v = json(&a);
    let _ = std::fs::remove_file(&text_file);
    assert!(v["stream"]["dropped"].as_u64().unwrap() > 0, "{v}");
    // Out of range: a usage error naming the flag's range, before anything loads.
    let o = common::bmoe_command()
        .args([
            "generate",
            "-m",
            m,
            "-p",
            "x",
            "--moe-stream",
            "--drop-cold",
            "1.5",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("drop_cold"), "{}", text(&o));
}
