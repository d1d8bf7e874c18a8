//! `runtime = "llama.cpp"`: stock llama.cpp as a point of a sweep, beside bmoe's engine. Its rows
//! are ordinary rows that say what ran, bmoe's own settings are inert there (and said so), and
//! `report` measures every other point against it by default (speed-up, agreement on `best`).
use crate::common;

use common::{csv_rows, json, report_group, text, Project};

/// Decisions that share a long prefix: bmoe's engine reuses it, stock llama.cpp prefills each.
const JOB: &str = r#"
name = "versus"
model = "../models/tiny.gguf"
kind = "decide"
profile = "../profiles/host.toml"
csv = "../runs/versus.csv"

[overrides]
moe_stream = true

[sweep]
runtime = ["bmoe", "llama.cpp"]

[[decisions]]
id = "a"
prefix = "You operate a phone for the user. Task: turn on airplane mode, then open the camera. History: opened settings; "
suffix = "Screen: Network, Display, Sound. Which row?"
choices = ["Network", "Display", "Sound"]

[[decisions]]
id = "b"
prefix = "You operate a phone for the user. Task: turn on airplane mode, then open the camera. History: opened settings; tapped Network; "
suffix = "Screen: Airplane mode is off. Tap it?"
choices = ["yes", "no"]

[[decisions]]
id = "c"
prefix = "You operate a phone for the user. Task: turn on airplane mode, then open the camera. History: opened settings; tapped Network; tapped Airplane mode; "
suffix = "Screen: Airplane mode is on. Next?"
choices = ["Home", "Back"]
"#;

#[test]
fn a_llama_cpp_point_runs_beside_bmoe_and_report_measures_against_it() {
    let p = Project::new();
    p.write("jobs/versus.toml", JOB);
    let o = p.bmoe(&["run", "jobs/versus.toml", "-q"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("moe_stream (from job") && text(&o).contains("runtime is \"llama.cpp\""),
        "the inert setting is said: {}",
        text(&o)
    );
    let rows = csv_rows(&p.read("runs/versus.csv"));
    assert_eq!(rows.len(), 6);
    let of = |rt: &str| -> Vec<_> { rows.iter().filter(|r| r["runtime"] == rt).collect() };
    let (stock, bmoe) = (of("llama.cpp"), of("bmoe"));
    assert_eq!((stock.len(), bmoe.len()), (3, 3));
    for r in &stock {
        assert_eq!(r["point"], "runtime=llama.cpp");
        assert_eq!(r["moe_stream"], "false", "stock llama.cpp never streams");
        assert_eq!(
            r["n_reused"], "0",
            "stock llama.cpp keeps nothing: {}",
            r["item"]
        );
        assert!(r["error"].is_empty() && !r["best"].is_empty(), "{r:?}");
    }
    assert!(bmoe.iter().all(|r| r["moe_stream"] == "true"));
    assert!(
        bmoe.iter().any(|r| r["n_reused"] != "0"),
        "bmoe's engine reuses the shared prefix"
    );
    let same = stock
        .iter()
        .filter(|s| {
            bmoe.iter()
                .any(|b| b["item"] == s["item"] && b["best"] == s["best"])
        })
        .count();

    let o = p.bmoe(&["report", "runs/versus.csv", "--format", "json"]);
    assert!(o.status.success(), "{}", text(&o));
    let doc = json(&o);
    let g = report_group(&doc, "point", "runtime=bmoe");
    // The default reference is the stock point, though the sweep lists bmoe first.
    assert_eq!(g["agreement"]["reference"], "runtime=llama.cpp", "{g}");
    assert_eq!(g["agreement"]["value"].as_f64(), Some(same as f64 / 3.0));
    assert_eq!(g["speedup"]["reference"], "runtime=llama.cpp", "{g}");
    assert!(g["speedup"]["value"].as_f64().unwrap() > 0.0);
    let o = p.bmoe(&["report", "runs/versus.csv"]);
    assert!(
        text(&o).contains("speed-up vs runtime=llama.cpp"),
        "{}",
        text(&o)
    );
}

#[test]
fn the_one_shot_commands_take_the_runtime_and_say_what_it_ignores() {
    let p = Project::new();
    let o = p.bmoe(&[
        "generate",
        "-m",
        "models/tiny.gguf",
        "-p",
        "hello",
        "-n",
        "4",
        "--runtime",
        "llama.cpp",
        "--moe-stream",
        "--cache-mb",
        "8",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("--moe-stream has no effect (runtime is \"llama.cpp\""),
        "{}",
        text(&o)
    );
    let o = p.bmoe(&[
        "generate",
        "-m",
        "models/tiny.gguf",
        "-p",
        "x",
        "--runtime",
        "llamacpp",
    ]);
    assert!(!o.status.success());
    assert!(text(&o).contains("llama.cpp"), "{}", text(&o));
}
