//! `bmoe compare`'s verdict matches its text and exit status: nothing in common is 2, missing rows
//! are named and exit 1, what changed is shown, a speed gate trips, torn rows and duplicate keys
//! are warned about, a bad cell is named by line, column and value (compare and merge alike), and a
//! wrong run id lists the runs the file holds.
use crate::common;
use common::{json, text, Project, DECIDE_JOB};

/// A project with one decide run of 6 decisions in `runs/decide.csv` (run id `r1`).
fn decided() -> Project {
    let p = Project::new();
    p.decisions("jobs/decisions.jsonl", 6);
    p.write("jobs/job.toml", DECIDE_JOB);
    let o = p.bmoe(&["run", "jobs/job.toml", "--quiet", "--run-id", "r1"]);
    assert!(o.status.success(), "{}", text(&o));
    p
}

/// Copies `src` to `dst` through `edit`, which gets the header and the data records.
fn edit_csv(p: &Project, src: &str, dst: &str, edit: impl Fn(&[String], &mut Vec<Vec<String>>)) {
    let body = p.read(src);
    let mut rdr = csv::Reader::from_reader(body.as_bytes());
    let header: Vec<String> = rdr.headers().unwrap().iter().map(String::from).collect();
    let mut rows: Vec<Vec<String>> = rdr
        .records()
        .map(|r| r.unwrap().iter().map(String::from).collect())
        .collect();
    edit(&header, &mut rows);
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record(&header).unwrap();
    for r in &rows {
        w.write_record(r).unwrap();
    }
    p.write(dst, &String::from_utf8(w.into_inner().unwrap()).unwrap());
}

/// The index of a column.
fn col(header: &[String], name: &str) -> usize {
    header.iter().position(|h| h == name).unwrap()
}

#[test]
fn another_job_or_no_common_item_is_nothing_in_common_exit_2() {
    let p = decided();
    p.write(
        "jobs/other.toml",
        &DECIDE_JOB
            .replace("name = \"decide\"", "name = \"demo\"")
            .replace("decide.csv", "demo.csv"),
    );
    let o = p.bmoe(&["run", "jobs/other.toml", "--quiet"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = p.bmoe(&["compare", "runs/decide.csv", "runs/demo.csv"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(
        out.contains("result: nothing in common: A holds job decide, B holds job demo"),
        "{out}"
    );

    // Same job, but every item renamed: still nothing to compare.
    edit_csv(&p, "runs/decide.csv", "runs/renamed.csv", |h, rows| {
        let i = col(h, "item");
        for r in rows {
            r[i] = format!("x-{}", r[i]);
        }
    });
    let o = p.bmoe(&[
        "compare",
        "runs/decide.csv",
        "runs/renamed.csv",
        "--format",
        "json",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["verdict"], "nothing_in_common", "{v}");
}

#[test]
fn rows_only_in_one_side_are_counted_named_and_exit_1() {
    let p = decided();
    edit_csv(&p, "runs/decide.csv", "runs/partial.csv", |h, rows| {
        let i = col(h, "item");
        rows.retain(|r| r[i] != "d2" && r[i] != "d5");
    });
    let o = p.bmoe(&["compare", "runs/decide.csv", "runs/partial.csv"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains("result: 2 rows only in A (d2, d5)"), "{out}");
    assert!(!out.contains("0 rows differ"), "{out}");

    let o = p.bmoe(&["compare", "runs/partial.csv", "runs/decide.csv"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains("result: 2 rows only in B (d2, d5)"), "{out}");
}

#[test]
fn what_changed_names_the_setting() {
    let p = decided();
    p.write(
        "jobs/topk.toml",
        &DECIDE_JOB.replace("decide.csv", "decide-k1.csv"),
    );
    let o = p.bmoe(&[
        "run",
        "jobs/topk.toml",
        "--quiet",
        "--set",
        "n_expert_used=1",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let o = p.bmoe(&["compare", "runs/decide.csv", "runs/decide-k1.csv"]);
    let out = text(&o);
    assert!(out.contains("what changed (A -> B):\n"), "{out}");
    assert!(out.contains("  n_expert_used 2 -> 1\n"), "{out}");
    let o = p.bmoe(&[
        "compare",
        "runs/decide.csv",
        "runs/decide-k1.csv",
        "--format",
        "json",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let changed = v["changed"].as_array().unwrap();
    assert!(
        changed.iter().any(|c| c["column"] == "n_expert_used"
            && c["a"] == serde_json::json!(["2"])
            && c["b"] == serde_json::json!(["1"])),
        "{v}"
    );

    // A copy of the run under another run id (the run itself compares nothing): nothing changed.
    edit_csv(&p, "runs/decide.csv", "runs/copy.csv", |h, rows| {
        let i = col(h, "run_id");
        for r in rows {
            r[i] = "copy".into();
        }
    });
    let o = p.bmoe(&["compare", "runs/decide.csv", "runs/copy.csv"]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("what changed: nothing"), "{out}");
}

#[test]
fn max_slowdown_gate_trips_on_a_slower_b() {
    let p = decided();
    edit_csv(&p, "runs/decide.csv", "runs/slow.csv", |h, rows| {
        let i = col(h, "prefill_s");
        for r in rows {
            r[i] = (r[i].parse::<f64>().unwrap() * 2.0).to_string();
        }
    });
    let o = p.bmoe(&["compare", "runs/decide.csv", "runs/slow.csv"]);
    let out = text(&o);
    assert!(o.status.success(), "no gate, same results: {out}");
    assert!(out.contains("median 2.000"), "{out}");
    assert!(out.contains(": B slower (median +100.0%"), "{out}");

    let args = ["compare", "runs/decide.csv", "runs/slow.csv"];
    let o = p.bmoe(&[&args[..], &["--max-slowdown", "1.10"]].concat());
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains("result: --max-slowdown 1.1 tripped: prefill_s median ratio B/A 2.000"),
        "{out}"
    );
    let o = p.bmoe(&[&args[..], &["--max-slowdown", "2.5"]].concat());
    assert!(o.status.success(), "{}", text(&o));
    let o = p.bmoe(&[&args[..], &["--max-slowdown", "0"]].concat());
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

#[test]
fn torn_last_row_and_duplicate_keys_are_warned_about() {
    let p = decided();
    let full = p.read("runs/decide.csv");
    let last = full.trim_end().rfind('\n').unwrap();
    let torn = format!("{}{}", &full[..last + 1], &full[last + 1..last + 40]);
    p.write("runs/torn.csv", &torn);
    let o = p.bmoe(&["compare", "runs/decide.csv", "runs/torn.csv"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains(
            "warning: runs/torn.csv: ignoring a torn last row (39 bytes without a newline)"
        ),
        "{out}"
    );
    assert!(out.contains("1 row only in A (d6)"), "{out}");

    // A row of d3 again, written later (the same row at the same time would make B a copy of A:
    // the same run, which compares nothing).
    let mut second: Vec<&str> = full.lines().nth(3).unwrap().splitn(3, ',').collect();
    second[1] = "2000-01-01T00:00:00.000Z";
    p.write("runs/dup.csv", &format!("{full}{}\n", second.join(",")));
    let o = p.bmoe(&["compare", "runs/decide.csv", "runs/dup.csv"]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains("warning: runs/dup.csv: 1 duplicate row in run r1 (a (job, profile, point, item, repeat) key seen before), e.g. decide/host/base/d3"),
        "{out}"
    );
}

#[test]
fn a_bad_cell_is_named_by_line_column_and_value() {
    let p = decided();
    edit_csv(&p, "runs/decide.csv", "runs/garbled.csv", |h, rows| {
        rows[2][col(h, "prefill_s")] = "banana".into();
    });
    let want = "runs/garbled.csv line 4, column prefill_s: \"banana\" is not a number";
    let o = p.bmoe(&["compare", "runs/decide.csv", "runs/garbled.csv"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains(want), "{}", text(&o));
    // merge reads through the same reader.
    let o = p.bmoe(&["merge", "runs/garbled.csv", "-o", "runs/all.csv"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains(want), "{}", text(&o));
}

#[test]
fn an_unknown_run_id_lists_the_runs_the_file_holds() {
    let p = decided();
    let o = p.bmoe(&["run", "jobs/job.toml", "--quiet", "--run-id", "r2"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = p.bmoe(&[
        "compare",
        "runs/decide.csv",
        "runs/decide.csv",
        "--run-a",
        "nope",
    ]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(
        out.contains("runs/decide.csv: no rows of run nope; it holds runs r1, r2"),
        "{out}"
    );
}

#[test]
fn decode_time_per_token_is_judged_and_gated() {
    let p = Project::new();
    p.write(
        "jobs/gen.toml",
        r#"
name = "gen"
model = "../models/tiny.gguf"
kind = "generate"
profile = "../profiles/host.toml"
csv = "../runs/gen.csv"
prompts = ["Say something.", "Say more."]
n_predict = 4
"#,
    );
    let o = p.bmoe(&["run", "jobs/gen.toml", "-q"]);
    assert!(o.status.success(), "{}", text(&o));
    edit_csv(&p, "runs/gen.csv", "runs/slow.csv", |h, rows| {
        let i = col(h, "decode_s");
        for r in rows {
            r[i] = (r[i].parse::<f64>().unwrap() * 1.5).to_string();
        }
    });
    let o = p.bmoe(&[
        "compare",
        "runs/gen.csv",
        "runs/slow.csv",
        "--max-slowdown",
        "1.2",
    ]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains("decode_s_per_token ratio B/A over 2 rows: min 1.500"),
        "{out}"
    );
    assert!(
        out.contains(
            "result: --max-slowdown 1.2 tripped: decode_s_per_token median ratio B/A 1.500"
        ),
        "{out}"
    );
    assert!(
        !out.contains("prefill_s median"),
        "prefill did not slow down: {out}"
    );
}

/// Writes `dst`: `n` copies of `runs/decide.csv`'s first row under items `t00`.., each passed to
/// `set` with its index and the header: timings or answers of a known distribution, no
/// measurement involved (so no assertion rests on how loaded the machine is).
fn synthetic(p: &Project, dst: &str, n: usize, set: impl Fn(usize, &[String], &mut Vec<String>)) {
    edit_csv(p, "runs/decide.csv", dst, |h, rows| {
        let first = rows[0].clone();
        *rows = (0..n)
            .map(|i| {
                let mut r = first.clone();
                r[col(h, "item")] = format!("t{i:02}");
                set(i, h, &mut r);
                r
            })
            .collect();
    });
}

/// `runs/{name}.csv` with these prefill times, one row each.
fn timed(p: &Project, name: &str, times: &[f64]) {
    synthetic(p, &format!("runs/{name}.csv"), times.len(), |i, h, r| {
        r[col(h, "prefill_s")] = times[i].to_string();
    });
}

/// SplitMix64's next output as a uniform draw in [0, 1).
fn uniform(state: &mut u64) -> f64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
}

/// Two runs of `n` rows from one noisy distribution (a busy machine): 50 ms times e^u, u uniform
/// on [-w, w], A's rows then B's from one SplitMix64 stream seeded with `seed`.
fn noisy_pair(seed: u64, w: f64, n: usize) -> (Vec<f64>, Vec<f64>) {
    let mut s = seed;
    let mut draw = |_| 0.05 * (w * (2.0 * uniform(&mut s) - 1.0)).exp();
    let a = (0..n).map(&mut draw).collect();
    let b = (0..n).map(&mut draw).collect();
    (a, b)
}

/// The median of the ratios B/A, as an independent check of the draw.
fn median_ratio(a: &[f64], b: &[f64]) -> f64 {
    let mut r: Vec<f64> = a.iter().zip(b).map(|(x, y)| y / x).collect();
    r.sort_by(f64::total_cmp);
    (r[r.len() / 2 - 1] + r[r.len() / 2]) / 2.0
}

#[test]
fn two_runs_of_one_noisy_distribution_are_inconclusive_and_trip_no_gate() {
    let p = decided();
    // Two draws whose bare median ratio is over 1.1 (the old verdict said "B slower" and the old
    // gate tripped), though A and B come from one distribution: a mild one (ratios within 2x,
    // judged by the bootstrap) and a wild one (p90/p10 over 40x, as the review's loaded machine,
    // judged by the whole range).
    for (seed, w, method) in [(11, 0.3, "bootstrap"), (6, 1.6, "whole range")] {
        let (a, b) = noisy_pair(seed, w, 12);
        assert!(median_ratio(&a, &b) > 1.1, "{a:?} {b:?}");
        timed(&p, "a", &a);
        timed(&p, "b", &b);
        let args = [
            "compare",
            "runs/a.csv",
            "runs/b.csv",
            "--max-slowdown",
            "1.1",
        ];
        let o = p.bmoe(&args);
        let out = text(&o);
        assert_eq!(o.status.code(), Some(0), "{out}");
        assert!(out.contains("result: all 12 rows identical"), "{out}");
        assert!(out.contains(": inconclusive (median +"), "{out}");

        let v = json(&p.bmoe(&[&args[..], &["--format", "json"]].concat()));
        let m = &v["speed"][0];
        assert_eq!(m["verdict"], "inconclusive", "{m}");
        assert_eq!(m["gate_tripped"], false, "{m}");
        assert!(
            m["interval_method"].as_str().unwrap().contains(method),
            "{m}"
        );
        let (lo, hi) = (
            m["interval"]["low"].as_f64().unwrap(),
            m["interval"]["high"].as_f64().unwrap(),
        );
        assert!(lo < 1.0 && hi > 1.0, "{m}");

        // The regression gate judges the same interval.
        let o = p.bmoe(&[&args[..], &["--fail-on-regression"]].concat());
        let out = text(&o);
        assert_eq!(o.status.code(), Some(0), "{out}");
        assert!(out.contains("result: no regression"), "{out}");
        assert!(
            out.contains("inconclusive: prefill_s median ratio B/A 1."),
            "{out}"
        );
    }
    // The wild draw is warned about, with the fix.
    let out = text(&p.bmoe(&["compare", "runs/a.csv", "runs/b.csv"]));
    assert!(
        out.contains("warning: prefill_s: timings are noisy (ratio B/A p90/p10 = "),
        "{out}"
    );
    assert!(out.contains("--warmup N"), "{out}");
}

#[test]
fn a_clear_threefold_slowdown_is_slower_and_trips_the_gate() {
    let p = decided();
    // Items of different lengths (20 to 200 ms), each 3x slower in B, within ±2%.
    let mut s = 7u64;
    let a: Vec<f64> = (0..10).map(|i| 0.02 * f64::from(i + 1)).collect();
    let b: Vec<f64> = a
        .iter()
        .map(|t| 3.0 * t * (1.0 + 0.04 * (uniform(&mut s) - 0.5)))
        .collect();
    timed(&p, "a", &a);
    timed(&p, "b", &b);
    let args = ["compare", "runs/a.csv", "runs/b.csv"];
    let o = p.bmoe(&[&args[..], &["--max-slowdown", "1.5"]].concat());
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains(": B slower (median +"), "{out}");
    assert!(
        out.contains("result: --max-slowdown 1.5 tripped: prefill_s median ratio B/A 2.9"),
        "{out}"
    );
    assert!(!out.contains("warning:"), "nothing noisy or short: {out}");
    let v = json(&p.bmoe(&[&args[..], &["--format", "json", "--max-slowdown", "1.5"]].concat()));
    let m = &v["speed"][0];
    assert_eq!(m["verdict"], "slower", "{m}");
    assert_eq!(m["gate_tripped"], true, "{m}");
    assert!(m["interval"]["low"].as_f64().unwrap() > 2.9, "{m}");
    assert_eq!(m["warnings"], serde_json::json!([]), "{m}");
    // Above the interval: no trip.
    let o = p.bmoe(&[&args[..], &["--max-slowdown", "3.5"]].concat());
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

#[test]
fn short_timings_and_a_single_row_are_warned_about() {
    let p = decided();
    timed(&p, "a", &[0.001, 0.0012, 0.0009, 0.0011]);
    timed(&p, "b", &[0.001, 0.0011, 0.001, 0.0011]);
    let o = p.bmoe(&["compare", "runs/a.csv", "runs/b.csv", "--format", "json"]);
    let v = json(&o);
    let w = v["speed"][0]["warnings"].to_string();
    assert!(
        w.contains("prefill_s: timings are short (median 1.05 ms a row in A"),
        "{w}"
    );
    assert!(w.contains("use longer items"), "{w}");
    assert!(
        text(&o).contains("warning: prefill_s: timings are short"),
        "{}",
        text(&o)
    );

    timed(&p, "a1", &[0.5]);
    timed(&p, "b1", &[2.0]);
    let o = p.bmoe(&[
        "compare",
        "runs/a1.csv",
        "runs/b1.csv",
        "--max-slowdown",
        "1.1",
    ]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "one row trips nothing: {out}");
    assert!(out.contains("inconclusive (one row has no spread"), "{out}");
    assert!(out.contains("warning: prefill_s: one matched row"), "{out}");
}

#[test]
fn the_accuracy_gate_needs_the_interval_past_the_threshold() {
    let p = decided();
    let answers = |dst: &str, n: usize, wrong: usize| {
        synthetic(&p, dst, n, |i, h, r| {
            r[col(h, "correct")] = (i >= wrong).to_string();
        });
    };
    // One flipped decision of eight: change -12.5 points, interval [-37.5, +0.0].
    answers("runs/a.csv", 8, 0);
    answers("runs/b.csv", 8, 1);
    let gate = |b: &str| p.bmoe(&["compare", "runs/a.csv", b, "--fail-on-regression"]);
    let o = gate("runs/b.csv");
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(!out.contains("REGRESSION"), "{out}");
    assert!(
        out.contains("inconclusive: accuracy fell 12.5 points, but its 95% interval [-37.5, +0.0] reaches above -1"),
        "{out}"
    );
    // Half of 24 wrong: the whole interval is far below -1 point.
    answers("runs/a.csv", 24, 0);
    answers("runs/b.csv", 24, 12);
    let o = gate("runs/b.csv");
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains("REGRESSION: accuracy fell 50.0 points, 95% interval ["),
        "{out}"
    );
}
