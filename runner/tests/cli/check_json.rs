//! `bmoe check` finds what `run` would refuse and says what would fix it (issue 34): errors as
//! JSON, "did you mean", first-token collisions at their line, JSONL duplicate ids at their line,
//! a memory budget's fix, an overrides file written for another setup, and sweeps, repeats and
//! warm-ups from the command line. Through the real binary on the tiny model.
use crate::common;
use common::{data_lines, json, text, Project, DECIDE_JOB};

/// A decide project over `jobs/decisions.jsonl` (3 good decisions) with `job` as jobs/job.toml.
fn project(job: &str) -> Project {
    let p = Project::new();
    p.decisions("jobs/decisions.jsonl", 3);
    p.write("jobs/job.toml", job);
    p
}

#[test]
fn broken_configuration_is_a_json_error_document_in_check_plan_and_run() {
    let typo = DECIDE_JOB.replace("model =", "modle =");
    let p = project(&typo);
    for cmd in ["check", "plan", "run"] {
        let o = p.bmoe(&[cmd, "jobs/job.toml", "--format", "json"]);
        assert_eq!(o.status.code(), Some(2), "{cmd}: {}", text(&o));
        let v = json(&o);
        assert_eq!(v["ok"], false, "{cmd}: {v}");
        let errs = v["errors"].as_array().expect("errors");
        let typo = errs
            .iter()
            .find(|e| e["key"] == "modle")
            .unwrap_or_else(|| panic!("{cmd}: no error for modle: {v}"));
        assert_eq!(typo["file"], "jobs/job.toml", "{v}");
        assert_eq!(typo["line"], 3, "{v}");
        assert_eq!(typo["column"], 1, "{v}");
        assert_eq!(
            typo["message"], "unknown key `modle`: did you mean `model`?",
            "{v}"
        );
        assert!(
            errs.iter().any(|e| e["key"] == "model"
                && e["message"]
                    .as_str()
                    .unwrap()
                    .starts_with("missing required key `model`")),
            "{v}"
        );
        // The text still goes to stderr.
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("jobs/job.toml:3:1: modle: unknown key"),
            "{err}"
        );
        assert!(!p.path("runs").exists(), "{cmd} wrote runs/");
    }
    // A budget that does not fit is an error document too, with its fix.
    let p = project(DECIDE_JOB);
    let o = p.bmoe(&[
        "check",
        "jobs/job.toml",
        "--format",
        "json",
        "--set",
        "moe_stream=true",
        "--set",
        "cache_mb=60000",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let v = json(&o);
    let e = &v["errors"][0];
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .starts_with("memory budget does not fit"),
        "{v}"
    );
    assert!(
        e["help"].as_str().unwrap().starts_with("cache_mb <= "),
        "{v}"
    );
}

#[test]
fn unknown_names_get_the_nearest_valid_one() {
    let p = project(&format!("{DECIDE_JOB}[overides]\ncache_mb = 3\n"));
    let o = p.bmoe(&["check", "jobs/job.toml"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(
        out.contains(
            "jobs/job.toml:8:2: overides: unknown key `overides`: did you mean `overrides`?"
        ),
        "{out}"
    );
    assert!(
        !out.contains("expected one of"),
        "no list when a name is close: {out}"
    );

    let p = project(DECIDE_JOB);
    let o = p.bmoe(&["check", "jobs/job.toml", "--set", "cachemb=3"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(
        out.contains("--set cachemb=3: cachemb: unknown key `cachemb`: did you mean `cache_mb`?"),
        "{out}"
    );
    assert!(!out.contains("expected one of"), "{out}");
    let o = p.bmoe(&["check", "jobs/job.toml", "--set", "zzzzzz=3"]);
    let out = text(&o);
    assert!(
        out.contains("unknown key `zzzzzz`\nhelp: expected one of threads, context,"),
        "no close name: the list as help: {out}"
    );

    // An environment variable naming no setting was ignored without a word.
    let o = p
        .cmd(&["check", "jobs/job.toml", "--no-probe"])
        .env("BMOE_CACHEMB", "3")
        .output()
        .unwrap();
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains(
            "warning: environment BMOE_CACHEMB names no setting: did you mean BMOE_CACHE_MB?"
        ),
        "{out}"
    );
}

const COLLIDING: &str = r#"{"id": "ok", "prefix": "Pick one.", "choices": ["A", "B"]}
{"id": "f1", "prefix": "Pick one.", "choices": ["click(submit)", "click(cancel)"]}
"#;

#[test]
fn check_reports_colliding_first_tokens_at_their_line_with_the_fix() {
    let p = project(DECIDE_JOB);
    p.write("jobs/decisions.jsonl", COLLIDING);
    let o = p.bmoe(&["check", "jobs/job.toml", "--no-probe"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "check said ok: {out}");
    assert!(
        out.contains("jobs/decisions.jsonl:2:1: choices[1]: choices 0 (\"click(submit)\") and 1 (\"click(cancel)\") start with the same token"),
        "{out}"
    );
    assert!(
        out.contains("help: use scoring = \"sum\" (or --scoring sum)"),
        "{out}"
    );
    assert!(!out.contains("decisions.jsonl:1"), "line 1 is fine: {out}");
    // With sum scoring the same decisions check clean.
    p.write("jobs/sum.toml", &format!("{DECIDE_JOB}scoring = \"sum\"\n"));
    let o = p.bmoe(&["check", "jobs/sum.toml", "--no-probe"]);
    assert!(o.status.success(), "{}", text(&o));

    // Inline: at the TOML line of the choice.
    p.write(
        "jobs/inline.toml",
        r#"name = "inline"
model = "../models/tiny.gguf"
kind = "decide"
profile = "../profiles/host.toml"
csv = "../runs/inline.csv"

[[decisions]]
prefix = "Pick one."
choices = ["click(submit)",
  "click(cancel)"]
"#,
    );
    let o = p.bmoe(&["check", "jobs/inline.toml", "--no-probe"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(
        out.contains("jobs/inline.toml:10:3: decisions[0].choices[1]: choices 0"),
        "{out}"
    );

    // `bmoe decide` gives the same fix.
    let o = p.bmoe(&[
        "decide",
        "-m",
        "models/tiny.gguf",
        "--prefix",
        "x",
        "--choice",
        "click(submit)",
        "--choice",
        "click(cancel)",
    ]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(
        out.contains(
            "first-token scoring cannot tell them apart; use scoring = \"sum\" (or --scoring sum)"
        ),
        "{out}"
    );
}

#[test]
fn jsonl_duplicate_id_is_at_its_line_with_the_schema_errors() {
    let p = project(DECIDE_JOB);
    p.write(
        "jobs/decisions.jsonl",
        r#"{"id": "mail-1", "prefix": "a", "choices": ["A", "B"]}
{"id": "mail-2", "prefix": "a", "choices": "A"}
{"id": "mail-1", "prefix": "b", "choices": ["A", "B"]}
"#,
    );
    let o = p.bmoe(&["check", "jobs/job.toml", "--no-probe"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(
        out.contains("jobs/decisions.jsonl:2:1: choices: expected"),
        "{out}"
    );
    assert!(
        out.contains(
            "jobs/decisions.jsonl:3:1: id: id \"mail-1\" is already used on line 1: ids must be unique"
        ),
        "both in one pass, at the JSONL line: {out}"
    );
    assert!(!out.contains("jobs/job.toml"), "not at the job file: {out}");
}

#[test]
fn a_budget_that_does_not_fit_says_which_cache_would() {
    let p = project(DECIDE_JOB);
    let check = |cache: &str| {
        let set = format!("cache_mb={cache}");
        p.bmoe(&[
            "check",
            "jobs/job.toml",
            "--no-probe",
            "--set",
            "moe_stream=true",
            "--set",
            &set,
        ])
    };
    let o = check("6000");
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    let help = out
        .lines()
        .find_map(|l| l.strip_prefix("help: cache_mb <= "))
        .unwrap_or_else(|| panic!("no help line: {out}"));
    assert!(help.ends_with(" fits, or cache_mb = \"auto\""), "{out}");
    let n: u64 = help.split(' ').next().unwrap().parse().unwrap();
    // The largest cache that fits, exactly.
    assert!(check(&n.to_string()).status.success(), "{n} fits");
    assert_eq!(check(&(n + 1).to_string()).status.code(), Some(2));
}

#[test]
fn overrides_written_for_another_job_or_profile_warn() {
    let p = project(DECIDE_JOB);
    let best = "# Written by `bmoe report --best`: the best point of job other on profile phone.\n# Point cache_mb=0: decode_tps = 1 (highest).\ncache_mb = 0\n";
    p.write("best.toml", best);
    for cmd in ["check", "plan", "run"] {
        let mut args = vec![cmd, "jobs/job.toml", "--overrides", "best.toml"];
        if cmd != "plan" {
            args.push("--no-probe");
        }
        let o = p.bmoe(&args);
        let out = text(&o);
        assert!(o.status.success(), "{cmd}: {out}");
        assert!(
            out.contains("warning: overrides best.toml was written for job other on profile phone, but is applied to job decide on profile host"),
            "{cmd}: {out}"
        );
    }
    p.write(
        "mine.toml",
        &best.replace("job other on profile phone", "job decide on profile host"),
    );
    let o = p.bmoe(&["plan", "jobs/job.toml", "--overrides", "mine.toml"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(!text(&o).contains("warning: overrides"), "{}", text(&o));
}

#[test]
fn comma_lists_in_set_sweep_and_repeat_warmup_flags_replace_the_job_keys() {
    let p = project(DECIDE_JOB);
    let o = p.bmoe(&[
        "plan",
        "jobs/job.toml",
        "--format",
        "json",
        "--set",
        "moe_stream=true",
        "--set",
        "cache_mb=0,16,32",
        "--repeat",
        "3",
        "--warmup",
        "1",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let v = json(&o);
    let units = v["units"].as_array().unwrap();
    let points: Vec<&str> = units.iter().map(|u| u["point"].as_str().unwrap()).collect();
    assert_eq!(points, ["cache_mb=0", "cache_mb=16", "cache_mb=32"], "{v}");
    assert_eq!(units[1]["cache_mb"], 16, "{v}");
    assert_eq!(units[0]["repeat"], 3, "{v}");
    assert_eq!(units[0]["warmup"], 1, "{v}");
    let cache = units[2]["values"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["key"] == "cache_mb")
        .unwrap();
    assert_eq!(cache["origin"], "--set", "{v}");

    // A key the job already sweeps is refused at the job's [sweep] key.
    p.write(
        "jobs/swept.toml",
        &format!("{DECIDE_JOB}[sweep]\ncache_mb = [0, 8]\n"),
    );
    let o = p.bmoe(&["plan", "jobs/swept.toml", "--set", "cache_mb=0,16"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(
        out.contains("jobs/swept.toml:9:1: sweep.cache_mb: `cache_mb` is swept here and by `--set cache_mb=0,16`: sweep it in one place"),
        "{out}"
    );

    // A run: 3 decisions x 2 points x 2 repeats, warm-up rows not written.
    let o = p.bmoe(&[
        "run",
        "jobs/job.toml",
        "--quiet",
        "--set",
        "threads=1,2",
        "--repeat",
        "2",
        "--warmup",
        "1",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let csv = p.read("runs/decide.csv");
    let rows = data_lines(&csv);
    assert_eq!(rows.len(), 12, "{csv}");
    assert!(rows.iter().any(|r| r.contains("threads=2")), "{csv}");
}
