//! `disk_probe` and the report's floor (issue 53, the ten-times job): a point that probes the
//! storage records its O_DIRECT read rate, a streamed row its decode's own reads, and `bmoe
//! report` puts each streamed point's decode against (its reads at that rate + the reference's
//! decode time a token), a value recomputed here from the rows.
use crate::common::{csv_rows, text, Project};

/// A generate job on the tiny model, resident against streamed with no expert cache (every
/// routed expert read each token), both probing the disk.
const JOB: &str = r#"
name = "floor"
model = "../models/tiny.gguf"
kind = "generate"
profile = "../profiles/host.toml"
csv = "../runs/floor.csv"
n_predict = 8
prompts = [{ id = "a", text = "The phone reads its experts from flash." }, { id = "b", text = "Two prompts, so the medians have rows." }]

[sweep]
moe_stream = [false, true]

[overrides]
cache_mb = 0
disk_probe = true
"#;

fn num(r: &std::collections::BTreeMap<String, String>, col: &str) -> f64 {
    r[col]
        .parse()
        .unwrap_or_else(|_| panic!("{col} is not a number: {r:?}"))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[test]
fn a_probed_streamed_point_is_put_against_its_floor() {
    let p = Project::new();
    p.write("jobs/floor.toml", JOB);
    let o = p.bmoe(&["run", "jobs/floor.toml", "-q"]);
    assert!(o.status.success(), "{}", text(&o));
    let rows = csv_rows(&p.read("runs/floor.csv"));
    assert_eq!(rows.len(), 4, "{rows:?}");
    let (resident, streamed): (Vec<_>, Vec<_>) =
        rows.iter().partition(|r| r["moe_stream"] == "false");
    for r in &rows {
        assert!(num(r, "disk_mib_s") > 0.0, "no probed rate: {r:?}");
        assert_eq!(r["schema_version"], "12");
    }
    for r in &resident {
        assert_eq!(r["decode_read_mib"], "", "resident reads nothing: {r:?}");
    }
    for r in &streamed {
        // Without a cache the prompt reads experts too: decode's share is less than the whole.
        let read = num(r, "decode_read_mib");
        assert!(read > 0.0 && read < num(r, "read_mib"), "{r:?}");
    }

    let o = p.bmoe(&["report", "runs/floor.csv", "--format", "json"]);
    assert!(o.status.success(), "{}", text(&o));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).expect("report JSON");
    let groups = doc["groups"].as_array().expect("groups");
    let point = |label: &str| {
        groups
            .iter()
            .find(|g| g["label"] == label)
            .unwrap_or_else(|| panic!("no group {label}: {doc}"))
    };
    assert!(point("moe_stream=false").get("floor").is_none());
    let f = &point("moe_stream=true")["floor"];
    // Recomputed from the rows: the medians of decode's time a token and of its reads' time at
    // each row's probed rate, and the reference's decode time a token.
    let ms = |r: &&std::collections::BTreeMap<String, String>| 1e3 / num(r, "tok_s");
    let decode = median(streamed.iter().map(ms).collect());
    let compute = median(resident.iter().map(ms).collect());
    let read = median(
        streamed
            .iter()
            .map(|r| 1e3 * num(r, "decode_read_mib") / num(r, "tokens") / num(r, "disk_mib_s"))
            .collect(),
    );
    let close = |got: &serde_json::Value, want: f64| {
        let got = got.as_f64().expect("a number");
        assert!(
            (got - want).abs() <= 1e-6 * want.abs().max(1.0),
            "{got} != {want}: {f}"
        );
    };
    close(&f["decode_ms"], decode);
    close(&f["compute_ms"], compute);
    close(&f["read_ms"], read);
    close(&f["value"], decode / (read + compute));
    let (v, lo, hi) = (f["value"].as_f64(), f["low"].as_f64(), f["high"].as_f64());
    assert!(lo <= v && v <= hi, "interval {lo:?}..{hi:?} misses {v:?}");
    assert_eq!(f["reference"], "moe_stream=false");

    let o = p.bmoe(&["report", "runs/floor.csv"]);
    let md = String::from_utf8_lossy(&o.stdout);
    assert!(
        md.contains("decode x floor (read + moe_stream=false)"),
        "{md}"
    );
}
