//! The rows people consume say what they measured: merge keeps every repeat of a sharded run
//! (one row key everywhere), a lossy setting without a column of its own is recorded and shows in
//! compare and report, and a sweep point's peak memory is its own, whatever ran before it.
use crate::common;
use std::collections::BTreeMap;

use common::{csv_rows, data_lines, text, Project, DECIDE_JOB};

/// Seen red at be26907: merge keyed rows by (run, job, point, item), so two shards of a job run
/// with `--repeat 3` (24 rows) merged into 8, the other 16 dropped as "identical duplicates".
#[test]
fn merge_keeps_every_repeat_of_every_shard() {
    let p = Project::new();
    p.decisions("jobs/decisions.jsonl", 8);
    p.write("jobs/job.toml", DECIDE_JOB);
    for k in ["0/2", "1/2"] {
        let o = p.bmoe(&[
            "run",
            "jobs/job.toml",
            "--shard",
            k,
            "--run-id",
            "night",
            "--repeat",
            "3",
            "--csv",
            "runs/shard-{shard}.csv",
            "-q",
        ]);
        assert!(o.status.success(), "{}", text(&o));
    }
    let shards = ["runs/shard-0.csv", "runs/shard-1.csv"];
    let n: usize = shards.iter().map(|s| data_lines(&p.read(s)).len()).sum();
    assert_eq!(n, 24, "8 decisions x 3 repeats over two shards");
    let o = p.bmoe(&["merge", shards[0], shards[1], "-o", "runs/all.csv"]);
    assert!(o.status.success(), "{}", text(&o));
    let all = csv_rows(&p.read("runs/all.csv"));
    assert_eq!(all.len(), 24, "{}", text(&o));
    let mut keys: Vec<(String, String)> = all
        .iter()
        .map(|r| (r["item"].clone(), r["repeat"].clone()))
        .collect();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), 24, "every (item, repeat) once");

    // The same file twice: its rows are alike in every cell, so they are duplicates.
    let o = p.bmoe(&[
        "merge",
        shards[0],
        shards[1],
        shards[0],
        "-o",
        "runs/again.csv",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(data_lines(&p.read("runs/again.csv")).len(), 24);
    // One key measured twice (another time, another speed) is no duplicate: refused.
    let text0 = p.read(shards[0]);
    let mut remeasured = csv_rows(&text0);
    let first = &mut remeasured[0];
    let old = first["prefill_s"].clone();
    let line = data_lines(&text0)[0];
    let changed = line.replacen(&format!(",{old},"), ",123.5,", 1);
    assert_ne!(changed, line, "prefill_s {old} is in the line");
    p.write("runs/remeasured.csv", &text0.replacen(line, &changed, 1));
    let o = p.bmoe(&[
        "merge",
        "runs/remeasured.csv",
        shards[0],
        shards[1],
        "-o",
        "runs/bad.csv",
    ]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(out.contains("conflicting duplicate row(s)"), "{out}");
    assert!(
        out.contains("repeat 0") && out.contains("`prefill_s`"),
        "{out}"
    );
    assert!(!p.path("runs/bad.csv").exists());
}

/// A streamed decide job, run lossless and then lossy into two CSVs.
fn lossless_and_lossy(p: &Project) {
    p.decisions("jobs/decisions.jsonl", 4);
    p.write("jobs/job.toml", DECIDE_JOB);
    let stream = ["--set", "moe_stream=true", "--set", "cache_mb=1", "-q"];
    let o = p.bmoe(
        &[
            &["run", "jobs/job.toml", "--csv", "runs/lossless.csv"],
            &stream[..],
        ]
        .concat(),
    );
    assert!(o.status.success(), "{}", text(&o));
    let lossy = [
        "run",
        "jobs/job.toml",
        "--csv",
        "runs/lossy.csv",
        "--set",
        "drop_cold=1",
        "--set",
        "expert_substitute=0.1",
    ];
    let o = p.bmoe(&[&lossy[..], &stream[..]].concat());
    assert!(o.status.success(), "{}", text(&o));
}

/// Seen red at be26907: the lossy knobs had no column, so compare said "what changed: nothing"
/// while rows differed, and report pooled the two runs in one group.
#[test]
fn lossy_settings_are_recorded_compared_and_split() {
    let p = Project::new();
    lossless_and_lossy(&p);
    for r in csv_rows(&p.read("runs/lossy.csv")) {
        let s: serde_json::Value = serde_json::from_str(&r["settings"]).expect("settings is JSON");
        assert_eq!(
            (s["drop_cold"].as_f64(), s["expert_substitute"].as_f64()),
            (Some(1.0), Some(0.1))
        );
        assert_eq!(r["settings_hash"].len(), 16);
    }
    let o = p.bmoe(&["compare", "runs/lossless.csv", "runs/lossy.csv"]);
    let out = text(&o);
    assert!(out.contains("settings.drop_cold 0.0 -> 1.0"), "{out}");
    assert!(
        out.contains("settings.expert_substitute 0.0 -> 0.1"),
        "{out}"
    );
    assert!(!out.contains("what changed: nothing"), "{out}");

    // Both runs in one file: report splits the point by the knobs.
    let both =
        p.read("runs/lossless.csv") + &data_lines(&p.read("runs/lossy.csv")).join("\n") + "\n";
    p.write("runs/both.csv", &both);
    let o = p.bmoe(&[
        "report",
        "runs/both.csv",
        "--format",
        "md",
        "-o",
        "runs/both.md",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let md = p.read("runs/both.md");
    assert!(md.contains("is split into 2 groups"), "{md}");
    assert!(md.contains("settings.drop_cold"), "{md}");
}

/// Seen red at be26907: `peak_rss_mib` was the process's running maximum, so a sweep's later
/// points carried the earlier points' peaks. The 32768-token point's KV cache alone is 32 MiB
/// (4 layers x K and V x 32768 tokens x 64 dims x 2 bytes); run first, it must not show in the
/// 256-token point after it. Half of it is the margin: heap the allocator keeps after a model is
/// released stays resident (about 3 MiB here), the KV cache does not.
#[test]
fn a_points_peak_memory_is_its_own_whatever_ran_before() {
    let p = Project::new();
    p.decisions("jobs/decisions.jsonl", 2);
    let job = |order: &str, csv: &str| {
        format!("{DECIDE_JOB}\n[sweep]\ncontext = {order}\n").replace("../runs/decide.csv", csv)
    };
    p.write(
        "jobs/big-first.toml",
        &job("[32768, 256]", "../runs/big-first.csv"),
    );
    p.write(
        "jobs/small-first.toml",
        &job("[256, 32768]", "../runs/small-first.csv"),
    );
    let mut peak: BTreeMap<(String, String), f64> = BTreeMap::new();
    for name in ["big-first", "small-first"] {
        let o = p.bmoe(&["run", &format!("jobs/{name}.toml"), "-q"]);
        assert!(o.status.success(), "{}", text(&o));
        for r in csv_rows(&p.read(&format!("runs/{name}.csv"))) {
            let v: f64 = r["peak_rss_mib"].parse().unwrap();
            let e = peak
                .entry((name.to_string(), r["point"].clone()))
                .or_insert(v);
            *e = e.max(v);
        }
    }
    let at = |run: &str, point: &str| peak[&(run.to_string(), point.to_string())];
    let kv_half = 16.0;
    for run in ["big-first", "small-first"] {
        assert!(
            at(run, "context=256") < at(run, "context=32768") - kv_half,
            "{run}: {peak:?}"
        );
    }
}
