//! One load per model in a run: sweep points that differ only in session settings keep the loaded
//! model (`load_s = 0`, `load_read_mib = 0` on the later points), points that change how the model
//! loads (the expert cache) load it again. Streamed rows say the model loaded the lean way.
use crate::common;

use common::{csv_rows, text, Project};

#[test]
fn session_only_points_share_one_load() {
    let p = Project::new();
    p.write(
        "jobs/sweep.toml",
        r#"
name = "sweep"
model = "../models/tiny.gguf"
kind = "generate"
profile = "../profiles/host.toml"
csv = "../runs/sweep.csv"
prompts = ["One load, please."]
n_predict = 2

[overrides]
moe_stream = true
cache_mb = 1

[sweep]
threads = [1, 2]
prefetch = ["router", "off"]
cache_mb = [1, 2]
"#,
    );
    let o = p.bmoe(&["run", "jobs/sweep.toml", "-q"]);
    assert!(o.status.success(), "{}", text(&o));
    let rows = csv_rows(&p.read("runs/sweep.csv"));
    assert_eq!(rows.len(), 8);
    let mut loads = 0;
    for r in &rows {
        assert_eq!(r["load_mode"], "lean", "{r:?}");
        assert!(!r["ttft_s"].is_empty(), "{r:?}");
        let load_s: f64 = r["load_s"].parse().unwrap();
        if load_s > 0.0 {
            loads += 1;
        } else {
            assert_eq!(r["load_read_mib"], "0.0", "{r:?}");
        }
    }
    // prefetch and cache_mb are load options, threads a session setting: a point loads exactly
    // when its load options differ from the point before it.
    let mut expected = 0;
    let mut last: Option<(String, String)> = None;
    for r in &rows {
        let key = (r["cache_mb"].clone(), r["prefetch"].clone());
        if last.as_ref() != Some(&key) {
            expected += 1;
        }
        last = Some(key);
    }
    assert_eq!(loads, expected, "one load per change of load options");
    assert!(loads < rows.len(), "some points must share a load");
}
