//! Decisions for agent replays (issue 10), through the real binary on the tiny model: expected
//! answers and accuracy, whole-choice scoring, prefix reuse from the layered setting, `expected`
//! naming no choice refused by `bmoe check`, and `bmoe compare` reporting an accuracy change.
use crate::common;
use std::collections::HashMap;

use common::{text, Project};

/// The rows of a CSV, each as column -> cell, in file order.
fn rows(p: &Project, rel: &str) -> Vec<HashMap<String, String>> {
    let mut r = csv::Reader::from_path(p.path(rel)).expect("open csv");
    let head: Vec<String> = r.headers().unwrap().iter().map(str::to_string).collect();
    r.records()
        .map(|rec| {
            let rec = rec.unwrap();
            head.iter()
                .cloned()
                .zip(rec.iter().map(str::to_string))
                .collect()
        })
        .collect()
}

/// A decide job over `decisions.jsonl` writing `csv`, with extra top-level lines.
fn job(csv: &str, extra: &str) -> String {
    format!(
        r#"
name = "replay"
model = "../models/tiny.gguf"
kind = "decide"
profile = "../profiles/host.toml"
csv = "../runs/{csv}"
decisions_file = "decisions.jsonl"
{extra}
"#
    )
}

const EXPECTED_JSONL: &str = r#"{"id": "a", "prefix": "Task: archive the newsletter.\n", "suffix": "Buttons: Archive, Reply, Delete", "choices": ["Archive", "Reply", "Delete"], "expected": "Archive", "meta": {"trace": "mail", "step": 1}}
{"id": "b", "prefix": "Task: archive the newsletter.\n", "suffix": "Dialog: OK / Cancel", "choices": ["OK", "Cancel"], "expected": 1}
{"id": "c", "prefix": "Task: archive the newsletter.\n", "suffix": "Done. Close?", "choices": ["Yes", "No"]}
"#;

#[test]
fn expected_answers_write_best_choice_correct_margin_and_accuracy() {
    let p = Project::new();
    p.write("jobs/decisions.jsonl", EXPECTED_JSONL);
    p.write("jobs/job.toml", &job("replay.csv", ""));
    let o = p.bmoe(&["run", "jobs/job.toml", "--quiet"]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    let rs = rows(&p, "runs/replay.csv");
    assert_eq!(rs.len(), 3);
    let mut n_correct = 0;
    for r in &rs {
        let choices: Vec<String> = match r["item"].as_str() {
            "a" => vec!["Archive".into(), "Reply".into(), "Delete".into()],
            "b" => vec!["OK".into(), "Cancel".into()],
            _ => vec!["Yes".into(), "No".into()],
        };
        let best: usize = r["best"].parse().unwrap();
        assert_eq!(r["best_choice"], choices[best], "{r:?}");
        assert_eq!(r["scoring"], "first_token");
        let margin: f64 = r["margin"].parse().expect("margin is a number");
        assert!(margin >= 0.0, "{r:?}");
        assert_eq!(
            r["choice_ntok"],
            format!("[{}]", vec!["1"; choices.len()].join(","))
        );
        match r["item"].as_str() {
            "a" => {
                assert_eq!(r["expected"], "Archive");
                assert_eq!(r["meta"], r#"{"trace":"mail","step":1}"#);
            }
            "b" => assert_eq!(r["expected"], "Cancel", "index 1 names the second choice"),
            _ => {
                assert_eq!(r["expected"], "");
                assert_eq!(r["correct"], "", "no expected, no verdict");
                assert_eq!(r["meta"], "");
                continue;
            }
        }
        let correct = r["best_choice"] == r["expected"];
        assert_eq!(r["correct"], correct.to_string(), "{r:?}");
        n_correct += usize::from(correct);
    }
    assert!(
        out.contains(&format!(
            "accuracy: {n_correct}/2 decisions with an expected answer"
        )),
        "{out}"
    );

    // The JSON summary carries the same counts.
    p.write("jobs/job2.toml", &job("replay2.csv", ""));
    let o = p.bmoe(&["run", "jobs/job2.toml", "--quiet", "--format", "json"]);
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json summary");
    assert_eq!(v["with_expected"], 2, "{v}");
    assert_eq!(v["correct"], n_correct, "{v}");
    assert_eq!(v["accuracy"].as_f64(), Some(n_correct as f64 / 2.0), "{v}");
}

#[test]
fn sum_scoring_takes_choices_sharing_a_first_token_first_token_refuses_them() {
    let p = Project::new();
    p.write(
        "jobs/decisions.jsonl",
        r#"{"id": "f1", "prefix": "You operate a form. Tools: click(target).\n", "suffix": "Buttons: Submit, Cancel. Next action?", "choices": ["click(submit)", "click(cancel)"], "expected": "click(submit)"}
{"id": "f2", "prefix": "You operate a form. Tools: click(target).\n", "suffix": "Pick one letter.", "choices": ["A", "B"]}
"#,
    );
    p.write("jobs/sum.toml", &job("sum.csv", "scoring = \"sum\""));
    p.write("jobs/first.toml", &job("first.csv", ""));
    let o = p.bmoe(&["run", "jobs/sum.toml", "--quiet"]);
    assert!(o.status.success(), "{}", text(&o));
    let rs = rows(&p, "runs/sum.csv");
    assert_eq!(rs[0]["error"], "", "{:?}", rs[0]);
    assert_eq!(rs[0]["scoring"], "sum");
    let ntok: Vec<u32> = serde_json::from_str(&rs[0]["choice_ntok"]).unwrap();
    assert!(
        ntok.iter().all(|&n| n > 1),
        "whole choices scored: {ntok:?}"
    );
    assert!(!rs[0]["correct"].is_empty());

    // first_token refuses the colliding item, and only that one.
    let o = p.bmoe(&["run", "jobs/first.toml", "--quiet"]);
    let out = text(&o);
    let rs = rows(&p, "runs/first.csv");
    assert_eq!(rs.len(), 2, "{out}");
    assert!(
        rs[0]["error"].contains("start with the same token")
            && rs[0]["error"].ends_with("use scoring = \"sum\" (or --scoring sum)"),
        "f1 refused, with the fix: {:?}",
        rs[0]
    );
    assert_eq!(rs[0]["best_choice"], "");
    assert_eq!(rs[0]["correct"], "", "a refused item has no verdict");
    assert_eq!(rs[1]["error"], "", "f2 scored: {:?}", rs[1]);
    assert!(out.contains("1 refused by the engine"), "{out}");
}

#[test]
fn prefix_reuse_from_set_reaches_the_rows() {
    let p = Project::new();
    // A long shared prefix (several hundred tokens) and short suffixes, fed raw so consecutive
    // prompts share their first tokens exactly.
    let prefix = "You are an agent replaying a long trace. History: ".to_string()
        + &"opened the app, scrolled the list, read the item; ".repeat(20);
    let mut jsonl = String::new();
    for i in 1..=4 {
        jsonl.push_str(
            &serde_json::json!({
                "id": format!("s{i}"),
                "prefix": prefix,
                "suffix": format!("Step {i}: which button?"),
                "choices": ["OK", "Cancel"],
            })
            .to_string(),
        );
        jsonl.push('\n');
    }
    p.write("jobs/decisions.jsonl", &jsonl);
    p.write("jobs/off.toml", &job("off.csv", "chat = false"));
    p.write("jobs/on.toml", &job("on.csv", "chat = false"));
    // The profile's context (512) is too small for the prefix.
    for (j, v) in [("jobs/off.toml", "off"), ("jobs/on.toml", "on")] {
        let set = format!("prefix_reuse={v}");
        let o = p.bmoe(&["run", j, "--quiet", "--set", &set, "--set", "context=2048"]);
        assert!(o.status.success(), "{}", text(&o));
    }
    let off = rows(&p, "runs/off.csv");
    assert_eq!(off.len(), 4);
    for r in &off {
        assert_eq!(r["reuse"], "miss", "{r:?}");
        assert_eq!(r["reuse_reason"], "off", "{r:?}");
        assert_eq!(r["n_reused"], "0");
        assert_eq!(r["n_prefilled"], r["n_prompt"]);
    }
    let on = rows(&p, "runs/on.csv");
    assert_eq!(
        on[0]["reuse"], "miss",
        "the first decision finds an empty cache"
    );
    for (r, o) in on.iter().zip(&off).skip(1) {
        assert!(
            r["reuse"] == "extend" || r["reuse"] == "hit",
            "consecutive decisions share the prefix: {r:?}"
        );
        let reused: u32 = r["n_reused"].parse().unwrap();
        let prefilled: u32 = r["n_prefilled"].parse().unwrap();
        let whole: u32 = r["n_prompt"].parse().unwrap();
        assert!(reused > 200, "{r:?}");
        assert_eq!(reused + prefilled, whole);
        assert_eq!(r["n_prompt"], o["n_prompt"], "n_prompt is the whole prompt");
        assert_eq!(r["best"], o["best"], "{r:?} vs {o:?}");
    }
}

#[test]
fn expected_naming_no_choice_is_refused_by_check_with_its_line() {
    let p = Project::new();
    p.write(
        "jobs/decisions.jsonl",
        r#"{"id": "a", "prefix": "P", "suffix": "S", "choices": ["OK", "Cancel"], "expected": "OK"}
{"id": "b", "prefix": "P", "suffix": "S", "choices": ["OK", "Cancel"], "expected": "Maybe"}
{"id": "c", "prefix": "P", "suffix": "S", "choices": ["OK", "Cancel"], "expected": 2}
"#,
    );
    p.write("jobs/job.toml", &job("bad.csv", ""));
    let o = p.bmoe(&["check", "jobs/job.toml"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(out.contains("decisions.jsonl:2"), "{out}");
    assert!(out.contains("\"Maybe\" is not one of the choices"), "{out}");
    assert!(out.contains("decisions.jsonl:3"), "{out}");
    assert!(out.contains("expected: index 2 names no choice"), "{out}");
    assert!(!out.contains("decisions.jsonl:1:"), "line 1 is fine: {out}");
    let o = p.bmoe(&["run", "jobs/job.toml", "--quiet"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(!p.path("runs/bad.csv").exists(), "nothing written");

    // Inline: the TOML line of the bad `expected`; an unknown scoring mode is a schema error.
    p.write(
        "jobs/inline.toml",
        r#"name = "inline"
model = "../models/tiny.gguf"
kind = "decide"
profile = "../profiles/host.toml"
csv = "../runs/inline.csv"
scoring = "best_guess"

[[decisions]]
prefix = "P"
choices = ["OK", "Cancel"]
expected = "Nope"
"#,
    );
    let o = p.bmoe(&["check", "jobs/inline.toml"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(out.contains("inline.toml:6"), "scoring on line 6: {out}");
    assert!(out.contains("first_token"), "what was expected: {out}");
    let fixed = p.read("jobs/inline.toml").replace("best_guess", "sum");
    p.write("jobs/inline.toml", &fixed);
    let o = p.bmoe(&["check", "jobs/inline.toml"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(out.contains("inline.toml:11"), "expected on line 11: {out}");
    assert!(out.contains("\"Nope\" is not one of the choices"), "{out}");
    assert!(!p.path("runs/inline.csv").exists(), "nothing written");
}

/// A choice that adds no token to its prompt cannot be scored: `check` and `run` refuse it at its
/// line, with what was expected, and nothing is written. On the byte-level synthetic vocabulary,
/// `s>` after a raw prompt ending in `<` tokenizes (prompt and choice together, as sum scoring
/// does) into the special `<s>` token, which replaces the prompt's last token.
#[test]
fn a_choice_that_adds_no_token_is_refused_by_check_and_run_with_its_line() {
    let p = Project::new();
    p.write(
        "jobs/decisions.jsonl",
        r#"{"id": "a", "prefix": "Pick <", "choices": ["A", "B"]}
{"id": "b", "prefix": "Pick <", "choices": ["A", "s>"]}
"#,
    );
    p.write(
        "jobs/job.toml",
        &job("merge.csv", "scoring = \"sum\"\nchat = false"),
    );
    for cmd in ["check", "run"] {
        let o = p.bmoe(&[cmd, "jobs/job.toml", "--quiet"]);
        let out = text(&o);
        assert_eq!(o.status.code(), Some(2), "{cmd}: {out}");
        assert!(out.contains("decisions.jsonl:2"), "{cmd}: {out}");
        assert!(
            out.contains("choice 1 (\"s>\") adds no token to the prompt under sum scoring"),
            "{cmd}: {out}"
        );
        assert!(
            out.contains("expected a choice with at least one token of its own"),
            "{cmd}: {out}"
        );
        assert!(!out.contains("decisions.jsonl:1"), "line 1 is fine: {out}");
        assert!(!p.path("runs/merge.csv").exists(), "{cmd}: nothing written");
    }

    // Inline: the TOML line of the choice.
    p.write(
        "jobs/inline.toml",
        r#"name = "inline"
model = "../models/tiny.gguf"
kind = "decide"
profile = "../profiles/host.toml"
csv = "../runs/inline.csv"
scoring = "mean"
chat = false

[[decisions]]
prefix = "Pick <"
choices = ["A", "B"]

[[decisions]]
prefix = "Pick <"
choices = [
  "A",
  "s>",
]
"#,
    );
    let o = p.bmoe(&["check", "jobs/inline.toml"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(out.contains("inline.toml:17:3"), "the choice's line: {out}");
    assert!(out.contains("under mean scoring"), "{out}");

    // The same choice in first_token mode is scored on its own tokens: nothing to refuse.
    let fixed = p.read("jobs/inline.toml").replace("scoring = \"mean\"", "");
    p.write("jobs/inline.toml", &fixed);
    let o = p.bmoe(&["check", "jobs/inline.toml"]);
    assert!(o.status.success(), "{}", text(&o));
}

#[test]
fn compare_reports_the_accuracy_change() {
    let p = Project::new();
    p.write("jobs/decisions.jsonl", EXPECTED_JSONL);
    p.write("jobs/a.toml", &job("a.csv", ""));
    let o = p.bmoe(&["run", "jobs/a.toml", "--quiet"]);
    assert!(o.status.success(), "{}", text(&o));
    let a = rows(&p, "runs/a.csv");
    // B flips item a's verdict: it expects another choice when A's was right, the model's
    // choice when A's was wrong; one decision lost or gained.
    let best_a = a.iter().find(|r| r["item"] == "a").unwrap()["best_choice"].clone();
    let other = if best_a == "Archive" {
        "Reply"
    } else {
        best_a.as_str()
    };
    let b_jsonl = EXPECTED_JSONL.replacen(
        "\"expected\": \"Archive\"",
        &format!("\"expected\": \"{other}\""),
        1,
    );
    p.write("jobs/b/decisions.jsonl", &b_jsonl);
    p.write(
        "jobs/b/b.toml",
        &job("b.csv", "")
            .replace("../models", "../../models")
            .replace("../profiles", "../../profiles")
            .replace("../runs", "../../runs"),
    );
    let o = p.bmoe(&["run", "jobs/b/b.toml", "--quiet"]);
    assert!(o.status.success(), "{}", text(&o));

    let o = p.bmoe(&["compare", "runs/a.csv", "runs/b.csv"]);
    let out = text(&o);
    let ok_b = a.iter().find(|r| r["item"] == "b").unwrap()["correct"] == "true";
    let (ca, cb) = if best_a == "Archive" { (1, 0) } else { (0, 1) };
    let (ca, cb) = (ca + usize::from(ok_b), cb + usize::from(ok_b));
    assert!(
        out.contains(&format!(
            "accuracy over 2 decisions with an expected answer: A {ca}/2"
        )),
        "{out}"
    );
    assert!(out.contains(&format!("B {cb}/2")), "{out}");
    let sign = if cb > ca { "+50.0" } else { "-50.0" };
    assert!(out.contains(&format!("change {sign} points")), "{out}");

    let o = p.bmoe(&["compare", "runs/a.csv", "runs/b.csv", "--format", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let acc = &v["accuracy"];
    assert_eq!(acc["decisions"], 2, "{v}");
    assert_eq!(acc["correct_a"], ca, "{v}");
    assert_eq!(acc["correct_b"], cb, "{v}");
    assert_eq!(
        acc["lost"].as_u64().unwrap() + acc["gained"].as_u64().unwrap(),
        1
    );
}

#[test]
fn decide_cli_takes_raw_scoring_and_expected() {
    let p = Project::new();
    let m = p.path("models/tiny.gguf");
    let m = m.to_str().unwrap();
    let base = [
        "decide",
        "-m",
        m,
        "-t",
        "2",
        "--prefix",
        "You operate a form. ",
        "--suffix",
        "Next?",
        "--choice",
        "click(submit)",
        "--choice",
        "click(cancel)",
    ];
    // first_token refuses choices sharing their first token; sum takes them.
    let o = p.bmoe(&base);
    assert!(!o.status.success(), "{}", text(&o));
    let mut args = base.to_vec();
    args.extend(["--scoring", "sum", "--expected", "click(cancel)", "--raw"]);
    let o = p.bmoe(&args);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    let verdict = if out.contains("best: 1 ") {
        "\ncorrect"
    } else {
        "\nincorrect"
    };
    assert!(
        out.contains(&format!("{verdict} (expected 1: \"click(cancel)\")")),
        "{out}"
    );
    assert!(out.contains("margin: "), "{out}");
    args.push("--json");
    let o = p.bmoe(&args);
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["expected"], 1, "{v}");
    assert_eq!(v["correct"], serde_json::json!(v["best"] == 1), "{v}");
    assert!(v["choice_ntok"][0].as_u64().unwrap() > 1, "{v}");
    // An expected answer naming no choice is refused before the model loads.
    let mut bad = base.to_vec();
    bad.extend(["--scoring", "sum", "--expected", "click(help)"]);
    let o = p.bmoe(&bad);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(out.contains("is not one of the choices"), "{out}");
}
