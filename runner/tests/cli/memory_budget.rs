//! `bmoe plan`'s memory budget against what a streamed run really holds: the budget's total and
//! the run's peak resident set (`peak_rss_mib`) agree within 15%, and the same run's model loaded
//! without reading an expert (`load_mode = lean`) and split its memory as the budget says (the
//! expert cache anonymous, the dense weights file-backed).
use crate::common;

use bmoe_synth::{write_model, Preset, SynthArch, SynthSpec};
use common::{text, Project};

const JOB: &str = r#"
name = "budget"
model = "../models/small.gguf"
kind = "generate"
profile = "../profiles/host.toml"
csv = "../runs/budget.csv"
n_predict = 4
prompts = ["Summarise the state of mixture-of-experts inference on small devices in one paragraph. Then list the ways a phone can run a model larger than its memory, the costs of each, what the page cache does, why direct reads help, how an expert cache is sized, what a routing node is, and when prefetch pays off. Answer in detail, with numbers where you have them, and end with a recommendation for a nightly batch job that replays agent decisions."]

[overrides]
moe_stream = true
cache_mb = 32
context = 2048
threads = 1
"#;

#[test]
fn the_plan_budget_is_within_15_percent_of_the_measured_peak() {
    // The small preset: 115 MiB, 32 experts top-4 in 8 layers; a 600-token prompt routes to
    // nearly every expert, so a 32 MiB cache fills.
    plan_against_peak(SynthArch::Qwen3Moe);
}

/// A hybrid model: most layers keep a recurrent state instead of K and V, which the budget must
/// not count as attention (it once did: +78% on this architecture's bench preset).
#[test]
fn the_plan_budget_of_a_hybrid_model_is_within_15_percent_of_the_measured_peak() {
    plan_against_peak(SynthArch::NemotronHMoe);
}

fn plan_against_peak(arch: SynthArch) {
    let p = Project::new();
    let small = write_model(
        &SynthSpec::preset(Preset::Small, arch),
        &p.path("models/small.gguf"),
    )
    .unwrap();
    let file_mib = small.bytes as f64 / f64::from(1 << 20);
    p.write("jobs/budget.toml", JOB);
    let o = p.bmoe(&["plan", "jobs/budget.toml", "--format", "json"]);
    assert!(o.status.success(), "{}", text(&o));
    let plan: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    eprintln!(
        "{}",
        serde_json::to_string_pretty(&plan["units"][0]["budget"]).unwrap()
    );
    let budget = plan["units"][0]["counted_mib"].as_f64().unwrap();
    // The recurrent-state line counts the state-space layers only (a hybrid's MoE-only layers
    // have neither a state nor K and V).
    let n_ssm = bmoe_engine::gguf::index::GgufIndex::open(&p.path("models/small.gguf"))
        .unwrap()
        .tensor_infos()
        .iter()
        .filter(|t| t.name.ends_with(".ssm_in.weight"))
        .count();
    let state_line = plan["units"][0]["budget"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["what"] == "recurrent state");
    match state_line {
        Some(l) => assert!(
            l["note"]
                .as_str()
                .unwrap()
                .starts_with(&format!("{n_ssm} state-space layers of ")),
            "{l}: the file has {n_ssm} state-space layers"
        ),
        None => assert_eq!(
            n_ssm, 0,
            "no recurrent-state line for {n_ssm} state-space layers"
        ),
    }

    let o = p.bmoe(&["run", "jobs/budget.toml", "-q"]);
    assert!(o.status.success(), "{}", text(&o));
    let csv = p.read("runs/budget.csv");
    let mut rdr = csv::Reader::from_reader(csv.as_bytes());
    let row: std::collections::HashMap<String, String> = rdr.deserialize().next().unwrap().unwrap();
    let num = |k: &str| {
        row[k]
            .parse::<f64>()
            .unwrap_or_else(|_| panic!("{k}: {:?}", row[k]))
    };
    let peak = num("peak_rss_mib");
    eprintln!(
        "{}: plan {budget:.1} MiB, measured peak {peak:.1} MiB (anonymous {:.1}, file-backed {:.1}), cache resident {:.1} MiB",
        arch.name(),
        num("peak_rss_anon_mib"),
        num("peak_rss_file_mib"),
        num("cache_resident_mib"),
    );
    assert_eq!(row["load_mode"], "lean");
    assert!(
        num("cache_resident_mib") > 28.0,
        "the cache must fill for the peak to mean anything"
    );
    assert!(
        (peak - budget).abs() <= 0.15 * peak,
        "plan says {budget:.1} MiB, the run peaked at {peak:.1} MiB"
    );
    // The expert cache is anonymous memory; the model file is not resident beyond its dense part.
    assert!(num("peak_rss_anon_mib") >= 32.0);
    assert!(num("peak_rss_file_mib") < 0.5 * file_mib);
}
