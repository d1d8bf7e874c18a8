//! `disk_probe` and the report's floor (issue 53, the ten-times job): a point that probes the
//! storage records its O_DIRECT read rate, a streamed row its decode's own reads, and `bmoe
//! report` puts each streamed point's decode against (its reads at that rate + the reference's
//! decode time a token), a value recomputed here from the rows.
use crate::common::{cell as num, csv_rows, json, median, report_group, text, Project};

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
    let doc = json(&o);
    let point = |label: &str| report_group(&doc, "label", label);
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

/// A hand-written CSV: a streamed point with its probe, and three references, of which only the
/// resident one without a memory limit below its model is a compute floor.
#[test]
fn only_a_resident_reference_is_a_compute_floor() {
    let p = Project::new();
    let mut csv = String::from(
        "job,profile,point,item,run_id,moe_stream,tokens,tok_s,decode_read_mib,disk_mib_s,memory_limit_mib,model_bytes\n",
    );
    for run in ["r1", "r2", "r3"] {
        // Streamed: 100 ms a token, 80 MiB a token read at 1000 MiB/s (80 ms).
        csv += &format!("j,p,streamed,a,{run},true,10,10,800,1000,1200,4000000000\n");
        // Resident, 20 ms a token: the floor is 100 / (80 + 20) = 1.0x.
        csv += &format!("j,p,resident,a,{run},false,10,50,,1000,,4000000000\n");
        // llama.cpp's mmap path under a 1200 MiB cap, and a streamed reference.
        csv += &format!("j,p,mmap,a,{run},false,10,0.1,,1000,1200,4000000000\n");
        csv += &format!("j,p,streamed2,a,{run},true,10,12,700,1000,,4000000000\n");
    }
    p.write("runs/hand.csv", &csv);
    let floor_of = |reference: &str| {
        let o = p.bmoe(&[
            "report",
            "runs/hand.csv",
            "--format",
            "json",
            "--reference",
            reference,
        ]);
        assert!(o.status.success(), "{}", text(&o));
        report_group(&json(&o), "label", "streamed")["floor"].clone()
    };
    let f = floor_of("resident");
    assert!((f["value"].as_f64().unwrap() - 1.0).abs() < 1e-9, "{f}");
    assert!((f["read_ms"].as_f64().unwrap() - 80.0).abs() < 1e-9, "{f}");
    assert!(
        floor_of("mmap").is_null(),
        "a capped mmap path is no compute floor"
    );
    assert!(
        floor_of("streamed2").is_null(),
        "a streamed point is no compute floor"
    );
}
