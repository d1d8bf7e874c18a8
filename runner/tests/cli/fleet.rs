//! Nightly replays on many machines: an older build's CSV stays readable, comparable and
//! appendable; shards run as separate processes merge into what one run writes; SIGTERM stops
//! cleanly and resumes; exit codes 0/1/2/130; JSON outputs carry the numbers of the text; bad
//! fleet input is refused before anything is written.
use crate::common;
use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{csv_rows, data_lines, text, Project, DECIDE_JOB};

/// The repository's demo job and host-cpu profile, beside the tiny model: what wrote the fixture.
fn demo_project() -> Project {
    let p = Project::new();
    for f in [
        "jobs/demo.toml",
        "jobs/generate.toml",
        "profiles/host-cpu.toml",
    ] {
        p.write(
            f,
            &std::fs::read_to_string(common::repo_root().join(f)).unwrap(),
        );
    }
    p
}

fn fixture(name: &str) -> String {
    std::fs::read_to_string(common::repo_root().join("runner/tests/fixtures").join(name)).unwrap()
}

/// Rows of a CSV by (run, job, point, item), each as column -> value.
fn rows_by_key(csv: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for m in csv_rows(csv) {
        let key = format!("{}/{}/{}/{}", m["run_id"], m["job"], m["point"], m["item"]);
        assert!(out.insert(key.clone(), m).is_none(), "duplicate {key}");
    }
    out
}

#[test]
fn an_older_builds_csv_is_compared_resumed_and_appended_to() {
    let p = demo_project();
    let old = fixture("schema1-demo.csv");
    p.write("runs/demo.csv", &old);

    // Resume the old run by id: its rows are read by name, so nothing is left to do.
    let o = p.bmoe(&[
        "run",
        "jobs/demo.toml",
        "--resume",
        "--run-id",
        "schema1-demo",
    ]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("skipped 3 items"), "{out}");

    // A new run goes to a new file next to the old one, said once; the old file is untouched.
    let o = p.bmoe(&["run", "jobs/demo.toml", "--run-id", "new"]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    let note = "runs/demo.csv was written by an older bmoe (schema 1); this build writes schema 12: appending to runs/demo.v12.csv instead";
    assert_eq!(out.matches(note).count(), 1, "{out}");
    assert!(
        out.contains("3 rows appended to runs/demo.v12.csv"),
        "{out}"
    );
    assert_eq!(
        p.read("runs/demo.csv"),
        old,
        "the older file is never written"
    );
    let new = p.read("runs/demo.v12.csv");
    assert_eq!(data_lines(&new).len(), 3);
    let rows = rows_by_key(&new);
    let devices = p.bmoe(&["devices", "--json"]);
    let devices: serde_json::Value = serde_json::from_slice(&devices.stdout).unwrap();
    let variant = devices["cpu_variant"]["variant"]
        .as_str()
        .unwrap()
        .to_string();
    for r in rows.values() {
        assert_eq!(r["schema_version"], "12");
        // Schema 10: every layered setting in one JSON cell, and its hash.
        assert!(
            r["settings"].starts_with("{\"threads\":"),
            "{}",
            r["settings"]
        );
        assert_eq!(r["settings_hash"].len(), 16);
        // Schema 9: the cache's resizes under memory pressure (none: no reserve, no stream).
        assert_eq!(r["cache_shrinks"], "0");
        assert_eq!(r["cache_budget_mib"], "", "no cache, no budget");
        // Schema 7: the repack setting and the weights held repacked (the tiny model's types
        // have no repacked kernel on x86).
        assert_eq!(r["repack"], "auto");
        assert!(r["repacked_tensors"].parse::<u64>().is_ok(), "{r:?}");
        // Schema 6: the CPU kernels that ran and the page-move verdict, on every row: the
        // variant module bmoe chose (the default x86 build), or the linked-in backend.
        assert!(
            r["cpu_variant"].starts_with(&format!("{variant}:")),
            "{} vs {variant}",
            r["cpu_variant"]
        );
        assert_eq!(r["page_moves"], "move");
        assert_eq!(r["cache_hit_pct"], "", "n/a is empty, not -1");
        assert_eq!(r["prefill_device"], "", "the CPU ran prefill");
        assert_eq!(r["model_sha256"].len(), 64);
        assert!(!r["host"].is_empty() && !r["git_commit"].is_empty());
        assert!(r["llama_cpp"].starts_with("llama-cpp-sys-2 "), "{r:?}");
        assert!(r["peak_rss_mib"].parse::<f64>().unwrap() > 1.0);
        assert_eq!(
            r["temperature"], "",
            "sampling columns are for generate rows"
        );
    }

    // Old against new and new against old: every decision agrees on best. Not bit for bit: the
    // older build prefilled in 512-wide pieces, this one on the 64-token grid (docs/benchmarks.md,
    // "Exact reuse on a 64-token grid, padded tails"), which rounds a longer prompt differently.
    for (a, b) in [
        ("runs/demo.csv", "runs/demo.v12.csv"),
        ("runs/demo.v12.csv", "runs/demo.csv"),
    ] {
        let o = p.bmoe(&["compare", a, b]);
        let out = text(&o);
        assert!(matches!(o.status.code(), Some(0 | 1)), "{out}");
        assert!(out.contains("decisions: 3/3 agree on best"), "{out}");
    }

    // A second run appends to the versioned file without a second note about it being new.
    let o = p.bmoe(&["run", "jobs/demo.toml", "--run-id", "new2", "-q"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(data_lines(&p.read("runs/demo.v12.csv")).len(), 6);

    // Generate rows of the older build compare too (text identical), and carry sampling now.
    // The fixture was written by the AVX2 build and its text is compared bit for bit, so this run
    // computes with the same kernels: another CPU variant sums in another order, and on the
    // AVX-512 one (zen4) one of the two greedy generations takes another token.
    p.write("runs/generate.csv", &fixture("schema1-generate.csv"));
    let o = p
        .cmd(&["run", "jobs/generate.toml", "--run-id", "g2", "-q"])
        .env("BMOE_CPU_VARIANT", "haswell")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let o = p.bmoe(&["compare", "runs/generate.csv", "runs/generate.v12.csv"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("generations: 2/2 identical text"), "{out}");
    for r in rows_by_key(&p.read("runs/generate.v12.csv")).values() {
        assert_eq!(
            (
                r["temperature"].as_str(),
                r["n_predict"].as_str(),
                r["seed"].as_str()
            ),
            ("0.0", "8", ""),
            "greedy: the seed does not apply"
        );
    }
}

/// Timing, process and shard columns: what may differ between two runs of the same items.
const VOLATILE: &[&str] = &[
    "time",
    "load_s",
    "prefill_s",
    "prefill_tps",
    "decode_s",
    "tok_s",
    "io_s",
    "stall_s",
    "prefill_dev_stall_s",
    "peak_rss_mib",
    "peak_rss_anon_mib",
    "peak_rss_file_mib",
    "load_read_mib",
    "ttft_s",
    "prefetched",
    "overlap_pct",
    "shard",
    // Prefix reuse depends on the decision that ran before in the same session.
    "n_reused",
    "n_prefilled",
    "reuse",
    "reuse_reason",
];

#[test]
fn three_shards_as_separate_processes_merge_into_one_run() {
    const N: usize = 24;
    let p = Project::new();
    p.decisions("jobs/decisions.jsonl", N);
    p.write("jobs/job.toml", DECIDE_JOB);
    let o = p.bmoe(&[
        "run",
        "jobs/job.toml",
        "--run-id",
        "night",
        "--csv",
        "runs/all.csv",
    ]);
    assert!(o.status.success(), "{}", text(&o));

    // The three ways to name a shard: explicit, a Kubernetes Indexed Job, a 1-based Slurm array.
    let c0 = p.cmd(&["run", "jobs/job.toml", "--shard", "0/3"]);
    let mut c1 = p.cmd(&["run", "jobs/job.toml", "--shard", "3"]);
    c1.env("JOB_COMPLETION_INDEX", "1");
    let mut c2 = p.cmd(&["run", "jobs/job.toml"]);
    c2.env("SLURM_ARRAY_TASK_ID", "3")
        .env("SLURM_ARRAY_TASK_MIN", "1")
        .env("SLURM_ARRAY_TASK_COUNT", "3");
    let children: Vec<_> = [c0, c1, c2]
        .iter_mut()
        .map(|c| {
            c.args([
                "--run-id",
                "night",
                "--csv",
                "runs/shard-{shard}.csv",
                "--quiet",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
        })
        .collect();
    let mut sizes = Vec::new();
    for (k, ch) in children.into_iter().enumerate() {
        let o = ch.wait_with_output().unwrap();
        assert!(o.status.success(), "shard {k}: {}", text(&o));
        assert!(
            text(&o).contains(&format!("run night shard {k}/3")),
            "{}",
            text(&o)
        );
        let rows = rows_by_key(&p.read(&format!("runs/shard-{k}.csv")));
        assert!(rows.values().all(|r| r["shard"] == format!("{k}/3")));
        sizes.push(rows.len());
    }
    assert_eq!(sizes.iter().sum::<usize>(), N, "{sizes:?}");
    assert!(sizes.iter().all(|&s| s > 0), "{sizes:?}");

    // shard-0 twice: identical duplicates are dropped, not refused.
    let o = p.bmoe(&[
        "merge",
        "runs/shard-0.csv",
        "runs/shard-1.csv",
        "runs/shard-2.csv",
        "runs/shard-0.csv",
        "-o",
        "runs/merged.csv",
    ]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains(&format!(
            "{} identical duplicate(s) dropped, {N} rows written to runs/merged.csv",
            sizes[0]
        )),
        "{out}"
    );
    let all = rows_by_key(&p.read("runs/all.csv"));
    let merged = rows_by_key(&p.read("runs/merged.csv"));
    assert_eq!(
        all.keys().collect::<Vec<_>>(),
        merged.keys().collect::<Vec<_>>()
    );
    for (k, a) in &all {
        let m = &merged[k];
        for (col, v) in a {
            if !VOLATILE.contains(&col.as_str()) {
                assert_eq!(v, &m[col], "{k}: column {col}");
            }
        }
    }
    let o = p.bmoe(&["compare", "runs/all.csv", "runs/merged.csv"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));

    // A conflicting duplicate (same key, another result) is refused, and nothing is written.
    let conflict =
        p.read("runs/shard-1.csv")
            .replacen(",false,false,,", ",false,false,refused,", 1);
    p.write("runs/conflict.csv", &conflict);
    let o = p.bmoe(&[
        "merge",
        "runs/shard-1.csv",
        "runs/conflict.csv",
        "-o",
        "runs/bad.csv",
        "--allow-partial",
    ]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(
        out.contains("conflicting duplicate row(s), nothing written")
            && out.contains("`error`: (empty) vs refused"),
        "{out}"
    );
    assert!(!p.path("runs/bad.csv").exists());
    // An existing output is not replaced without --force.
    let o = p.bmoe(&["merge", "runs/shard-1.csv", "-o", "runs/merged.csv"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("exists; choose another -o, or add --force"));
}

#[test]
fn sigterm_finishes_the_row_then_resume_gives_every_item_once() {
    const N: usize = 40;
    let p = Project::new();
    p.decisions("jobs/decisions.jsonl", N);
    p.write("jobs/job.toml", DECIDE_JOB);
    let child = p
        .cmd(&["run", "jobs/job.toml", "--run-id", "night-1", "--quiet"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while data_lines(&p.read("runs/decide.csv")).len() < 3 {
        assert!(t0.elapsed() < Duration::from_secs(120), "no rows");
        std::thread::sleep(Duration::from_millis(5));
    }
    let st = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let o = child.wait_with_output().unwrap();
    let out = text(&o);
    assert_eq!(
        o.status.code(),
        Some(130),
        "a clean stop, not a kill: {out}"
    );
    assert!(
        out.contains("continue with: bmoe run jobs/job.toml --resume --run-id night-1"),
        "{out}"
    );
    let csv = p.read("runs/decide.csv");
    assert!(csv.ends_with('\n'), "the row in flight was finished");
    let before = data_lines(&csv).len();
    assert!(before < N, "finished before the signal ({before} rows)");

    let o = p.bmoe(&[
        "run",
        "jobs/job.toml",
        "--resume",
        "--run-id",
        "night-1",
        "-q",
    ]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(!out.contains("torn"), "SIGTERM tears nothing: {out}");
    assert!(out.contains(&format!("skipped {before} items")), "{out}");
    let rows = rows_by_key(&p.read("runs/decide.csv"));
    assert_eq!(rows.len(), N, "every decision exactly once");
}

#[test]
fn exit_codes() {
    let p = Project::new();
    p.decisions("jobs/decisions.jsonl", 2);
    // A third decision whose choices share their first token: the engine refuses it.
    let mut jsonl = p.read("jobs/decisions.jsonl");
    jsonl.push_str(
        "{\"id\": \"clash\", \"prefix\": \"x\", \"suffix\": \"y\", \"choices\": [\"Apple\", \"Avocado\"]}\n",
    );
    p.write("jobs/decisions.jsonl", &jsonl);
    p.write("jobs/job.toml", DECIDE_JOB);
    // 1: items refused (their rows written with `error`, the run goes on).
    let o = p.bmoe(&["run", "jobs/job.toml", "--run-id", "a", "-q"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains("1 refused by the engine"), "{out}");
    assert_eq!(data_lines(&p.read("runs/decide.csv")).len(), 3);
    // 0: the same run without the refused item.
    let o = p.bmoe(&[
        "run",
        "jobs/job.toml",
        "--run-id",
        "b",
        "--items",
        "d*",
        "-q",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    // compare: 1 when rows differ or are unmatched (b lacks `clash`), 0 when identical.
    let o = p.bmoe(&[
        "compare",
        "runs/decide.csv",
        "runs/decide.csv",
        "--run-a",
        "a",
        "--run-b",
        "b",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("1 only in A"), "{}", text(&o));
    // Run b against a copy of itself under another run id (b against b compares nothing: 2).
    p.write(
        "runs/copy.csv",
        &p.read("runs/decide.csv").replace("\nb,", "\nc,"),
    );
    let o = p.bmoe(&[
        "compare",
        "runs/decide.csv",
        "runs/copy.csv",
        "--run-a",
        "b",
        "--run-b",
        "c",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    // 2: usage (clap), configuration, I/O.
    for (args, needle) in [
        (vec!["run"], "required arguments were not provided"),
        (vec!["run", "jobs/nope.toml"], "jobs/nope.toml"),
        (
            vec!["compare", "runs/decide.csv", "runs/none.csv"],
            "runs/none.csv: no such file",
        ),
        (
            vec!["compare", "jobs/job.toml", "runs/decide.csv"],
            "not a bmoe telemetry CSV",
        ),
    ] {
        let o = p.bmoe(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(text(&o).contains(needle), "{args:?}: {}", text(&o));
    }
}

#[test]
fn json_outputs_parse_and_carry_the_numbers_of_the_text() {
    let p = Project::new();
    p.decisions("jobs/decisions.jsonl", 4);
    p.write("jobs/job.toml", DECIDE_JOB);
    p.write(
        "jobs/other.toml",
        &DECIDE_JOB.replace("decide.csv", "decide-b.csv"),
    );
    let json = |args: &[&str]| -> serde_json::Value {
        let o = p.bmoe(args);
        assert!(o.status.code() == Some(0), "{args:?}: {}", text(&o));
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}: {}", text(&o)))
    };

    let v = json(&["check", "jobs/job.toml", "--format", "json"]);
    let t = text(&p.bmoe(&["check", "jobs/job.toml"]));
    let j = &v["jobs"][0];
    assert_eq!(v["ok"], true);
    assert!(
        t.contains(&format!(
            "ok: {} ({} {} items, {} point(s), profile {}, csv {})",
            j["file"].as_str().unwrap(),
            j["items"],
            j["kind"].as_str().unwrap(),
            j["points"],
            j["profile"].as_str().unwrap(),
            j["csv"].as_str().unwrap()
        )),
        "{t}\n{v}"
    );

    let v = json(&[
        "plan",
        "jobs/job.toml",
        "--format",
        "json",
        "--set",
        "threads=3",
    ]);
    let t = text(&p.bmoe(&["plan", "jobs/job.toml", "--set", "threads=3"]));
    let u = &v["units"][0];
    let threads = u["values"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["key"] == "threads")
        .unwrap();
    assert_eq!(
        (threads["value"].as_str(), threads["origin"].as_str()),
        (Some("3"), Some("--set"))
    );
    assert!(t.contains("threads         3              --set"), "{t}");
    assert!(
        t.contains(&format!(
            "{:<26} {:>10.1} MiB  (RAM",
            "available",
            u["available_mib"].as_f64().unwrap()
        )),
        "{t}"
    );
    assert!(
        t.contains(&format!(
            "{:<26} {:>10.1} MiB\n",
            "total counted",
            u["counted_mib"].as_f64().unwrap()
        )),
        "{t}"
    );

    let v = json(&[
        "run",
        "jobs/job.toml",
        "--run-id",
        "r1",
        "--format",
        "json",
        "-q",
    ]);
    assert_eq!(v["run_id"], "r1");
    assert_eq!(v["written"][0]["rows"], 4);
    assert_eq!(v["written"][0]["csv"], "runs/decide.csv");
    assert_eq!(v["decisions"], 4);
    let rows = rows_by_key(&p.read("runs/decide.csv"));
    let tokens: u64 = rows
        .values()
        .map(|r| r["n_prompt"].parse::<u64>().unwrap())
        .sum();
    assert_eq!(v["prefill_tokens"], tokens);
    let o = p.bmoe(&["run", "jobs/other.toml", "--run-id", "r2", "-q"]);
    assert!(o.status.success());

    let v = json(&[
        "compare",
        "runs/decide.csv",
        "runs/decide-b.csv",
        "--format",
        "json",
    ]);
    let t = text(&p.bmoe(&["compare", "runs/decide.csv", "runs/decide-b.csv"]));
    let r = &v["prefill_s_ratio"];
    for line in [
        format!("runs: A = {}, B = {}", v["run_a"].as_str().unwrap(), v["run_b"].as_str().unwrap()),
        format!("rows: {} matched by (job, profile, point, item, repeat); {} only in A, {} only in B", v["matched"], v["only_a"], v["only_b"]),
        format!("decisions: {}/{} agree on best", v["best_agree"], v["decisions"]),
        format!(
            "prefill_s ratio B/A over {} rows: min {:.3}  p10 {:.3}  median {:.3}  p90 {:.3}  max {:.3}",
            r["rows"],
            r["min"].as_f64().unwrap(),
            r["p10"].as_f64().unwrap(),
            r["median"].as_f64().unwrap(),
            r["p90"].as_f64().unwrap(),
            r["max"].as_f64().unwrap()
        ),
    ] {
        assert!(t.contains(&line), "{line:?} not in\n{t}");
    }
    assert_eq!(v["identical"], true);

    let v = json(&[
        "merge",
        "runs/decide.csv",
        "-o",
        "runs/m.csv",
        "--format",
        "json",
    ]);
    assert_eq!(
        (v["rows_in"].as_u64(), v["rows_out"].as_u64()),
        (Some(4), Some(4))
    );
}

#[test]
fn bad_fleet_input_is_refused_before_anything_is_written() {
    let p = Project::new();
    p.decisions("jobs/decisions.jsonl", 3);
    p.write("jobs/job.toml", DECIDE_JOB);
    for (args, needle) in [
        (
            vec!["--shard", "3/2"],
            "--shard 3/2: K is 0-based and must be below N (valid: 0/2 .. 1/2)",
        ),
        (vec!["--shard", "0/0"], "--shard 0/0: N must be at least 1"),
        (vec!["--shard", "x"], "expected K/N (K 0-based"),
        (vec!["--shard", "4"], "--shard 4: no shard index"),
        (
            vec!["--csv", "runs/s-{shard}.csv"],
            "the {shard} template needs a shard",
        ),
        (
            vec!["--csv", "runs/out.txt"],
            "expected a path ending in .csv",
        ),
        (vec!["--items", "d["], "--items \"d[\": not a glob"),
    ] {
        let mut a = vec!["run", "jobs/job.toml"];
        a.extend(args.iter().copied());
        let o = p.bmoe(&a);
        let out = text(&o);
        assert_eq!(o.status.code(), Some(2), "{a:?}: {out}");
        assert!(out.contains(needle), "{a:?}: expected {needle:?} in {out}");
        assert!(!out.contains("panicked"), "{out}");
        assert!(!p.path("runs").exists(), "{a:?} wrote runs/");
    }
    // A merge of two jobs' CSVs.
    p.write("runs/a.csv", &fixture("schema1-demo.csv"));
    p.write(
        "runs/b.csv",
        &fixture("schema1-demo.csv").replace(",demo,decide,", ",other,decide,"),
    );
    let o = p.bmoe(&["merge", "runs/a.csv", "runs/b.csv", "-o", "runs/all.csv"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(
        out.contains("runs/a.csv holds job(s) demo but runs/b.csv holds job(s) other: merge the shards of one job run"),
        "{out}"
    );
    assert!(!p.path("runs/all.csv").exists());
    // A merge across schema versions.
    p.write(
        "runs/c.csv",
        &p.read("runs/a.csv"), // schema 1
    );
    let o = p.bmoe(&["run", "jobs/job.toml", "--csv", "runs/d.csv", "-q"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = p.bmoe(&["merge", "runs/c.csv", "runs/d.csv", "-o", "runs/all.csv"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).contains("runs/c.csv is schema 1 but runs/d.csv is schema 12"),
        "{}",
        text(&o)
    );
    assert!(!p.path("runs/all.csv").exists());
}

#[test]
fn limit_items_progress_lines_completions_and_man() {
    let p = Project::new();
    p.decisions("jobs/decisions.jsonl", 12);
    p.write("jobs/job.toml", DECIDE_JOB);
    let o = p.bmoe(&["run", "jobs/job.toml", "--items", "d1*", "--run-id", "g"]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    // Off a terminal, plain progress lines replace the bars (here: the unit's last item).
    assert!(
        out.contains("bmoe: progress: decide on host [base] 4/4 items"),
        "{out}"
    );
    let ids: Vec<String> = rows_by_key(&p.read("runs/decide.csv"))
        .values()
        .map(|r| r["item"].clone())
        .collect();
    assert_eq!(ids, ["d1", "d10", "d11", "d12"]);
    let o = p.bmoe(&[
        "run",
        "jobs/job.toml",
        "--limit",
        "2",
        "--run-id",
        "l",
        "-q",
    ]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(!out.contains("bmoe: progress"), "-q: {out}");
    assert!(out.contains("2 rows appended"), "{out}");

    let o = p.bmoe(&["completions", "bash"]);
    assert!(o.status.success());
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(s.contains("_bmoe()") && s.contains("--shard"), "{s}");
    let o = p.bmoe(&["man"]);
    assert!(o.status.success());
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(s.starts_with(".ie") || s.contains(".TH bmoe"), "{s}");
    let o = p.bmoe(&["man", "--out", "man"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(p.read("man/bmoe-run.1").contains("shard"));
}
