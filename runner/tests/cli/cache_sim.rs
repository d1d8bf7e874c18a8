//! `--routing-trace` then `bmoe cache-sim`: a generate's trace replayed at the run's own cache size
//! counts the decode reads the run printed; a damaged trace is refused naming its line and field.
use crate::common;

use common::{text, Project};

#[test]
fn a_traced_generate_replays_to_its_own_reads() {
    let p = Project::new();
    let o = p.bmoe(&[
        "generate",
        "-m",
        "models/tiny.gguf",
        "-p",
        "Trace the routing, please.",
        "-n",
        "12",
        "--moe-stream",
        "--cache-mb",
        "1",
        "--prefetch",
        "off",
        "--routing-trace",
        "run.trace",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    // `moe-stream decode: X MiB read (...)`: the decode phase's reads.
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    let line = err
        .lines()
        .find(|l| l.starts_with("moe-stream decode:"))
        .expect("decode line");
    let read_mib: f64 = line.split_whitespace().nth(2).unwrap().parse().unwrap();
    let o = p.bmoe(&["cache-sim", "run.trace", "--format", "json"]);
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let pt = &v["points"][0];
    assert_eq!(pt["cache_mb"], 1.0);
    // Both policies, the run's own (next_use, the default) first.
    assert_eq!(v["cache_policy"], "next_use");
    assert_eq!(pt["engine"][1]["policy"], "recency");
    let engine = &pt["engine"][0]["decode"];
    let sim_mib = engine["miss_bytes"].as_f64().unwrap() / 1048576.0;
    assert!(
        (sim_mib - read_mib).abs() < 0.05,
        "{sim_mib} vs {read_mib}: {line}"
    );
    let belady = pt["belady"]["decode"]["misses"].as_u64().unwrap();
    assert!(belady <= engine["misses"].as_u64().unwrap(), "{pt}");
    // Text: a row per size and policy.
    let o = p.bmoe(&["cache-sim", "run.trace", "--cache-mb", "0.5,2"]);
    let out = text(&o);
    let rows = |p: &str| out.matches(&format!(" {p} ")).count();
    assert!(
        o.status.success() && (rows("belady"), rows("next_use"), rows("recency")) == (2, 2, 2),
        "{out}"
    );
    let o = p.bmoe(&["cache-sim", "run.trace", "--policy", "recency"]);
    let out = text(&o);
    assert!(
        o.status.success() && out.contains(" recency ") && !out.contains(" next_use "),
        "{out}"
    );
}

#[test]
fn a_damaged_trace_names_its_line_and_field() {
    let p = Project::new();
    p.write(
        "bad.trace",
        concat!(
            r#"{"bmoe_routing_trace":1,"n_expert":8,"n_expert_used":2,"layers":[[0,10]],"token_bytes":20,"budget_bytes":100,"prefetch":"off"}"#,
            "\n",
            r#"{"kind":"node","phase":"decode","token":0,"layer":0,"ids":[1,9]}"#,
            "\n"
        ),
    );
    let o = p.bmoe(&["cache-sim", "bad.trace"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(
        out.contains("bad.trace:2: ids: expert 9 outside 0..8"),
        "{out}"
    );
}
