//! The settings-agreement test: every setting is defined once (`bmoe_engine::settings` for name,
//! default, unit and range; `Settings::default()` reads them), and everything that shows or uses
//! a setting agrees with that definition: the engine's option defaults, the runner's layered
//! defaults, the job defaults, the CLI flags, the JSON Schemas and the table in
//! `docs/configuration.md`. Change a default in one place and this fails.
use std::collections::BTreeMap;

use bmoe_engine::settings::{self, IntDefault, IntRange};
use clap::CommandFactory;
use serde_json::Value;

use super::settings::{Settings, KEYS};

/// The integer settings by name.
fn int_ranges() -> BTreeMap<&'static str, IntRange> {
    [
        settings::THREADS,
        settings::CONTEXT,
        settings::CPU_UBATCH,
        settings::DEVICE_UBATCH,
        settings::MIN_TOKENS,
        settings::IO_THREADS,
        settings::LOADERS,
        settings::N_EXPERT_USED,
        settings::CACHE_MB,
        settings::CACHE_FLOOR_MB,
        settings::CACHE_RESERVE_MB,
        settings::CACHE_MIN_MB,
        settings::N_PREDICT,
        settings::TOP_K,
    ]
    .into_iter()
    .map(|r| (r.name, r))
    .collect()
}

/// A definition's default as the layered settings serialise it.
fn int_default_json(r: &IntRange) -> Value {
    match r.default {
        IntDefault::Auto => Value::String("auto".into()),
        IntDefault::N(n) => Value::from(n),
    }
}

fn defaults() -> serde_json::Map<String, Value> {
    match serde_json::to_value(Settings::default()) {
        Ok(Value::Object(m)) => m,
        other => panic!("Settings serialise to an object, got {other:?}"),
    }
}

#[test]
fn layered_defaults_are_the_definitions() {
    let d = defaults();
    for (name, r) in int_ranges() {
        if let Some(v) = d.get(name) {
            assert_eq!(v, &int_default_json(&r), "Settings::default().{name}");
        }
    }
}

#[test]
fn engine_option_defaults_are_the_definitions() {
    let s = Settings::default();
    // Every option a declaration maps is checked by config/declare.rs's
    // `engine_option_defaults_are_the_declared_defaults`; threads are placement's.
    let session = bmoe_engine::SessionOptions::default();
    assert_eq!(
        session.threads,
        s.threads
            .or(settings::usable_cores())
            .min(settings::usable_cores())
    );
    let generate = bmoe_engine::GenerateOptions::default();
    let job_default: super::job::Job = toml::from_str(
        "name = \"j\"\nmodel = \"m.gguf\"\nkind = \"generate\"\ncsv = \"o.csv\"\nprompts = [\"a\"]\n",
    )
    .expect("a minimal job parses");
    assert_eq!(
        generate.n_predict, job_default.n_predict,
        "engine vs job n_predict"
    );
    assert_eq!(
        job_default.sampling.top_k as u32,
        settings::TOP_K.default_u32(),
        "job top_k"
    );
    assert_eq!(
        f64::from(job_default.sampling.top_p),
        settings::TOP_P.default as f32 as f64
    );
}

#[test]
fn schema_ranges_are_the_definitions() {
    let schema = super::settings::settings_schema();
    let props = schema["properties"].as_object().expect("properties");
    let names: Vec<&str> = props.keys().map(|k| k.as_str()).collect();
    assert_eq!(names, KEYS, "schema keys");
    let ranges = int_ranges();
    for (k, p) in props {
        // A `$ref` property's range is in its definition.
        let def = p["$ref"]
            .as_str()
            .and_then(|r| r.strip_prefix("#/$defs/"))
            .map(|d| schema["$defs"][d].to_string())
            .unwrap_or_default();
        let text = format!("{p}{def}");
        assert!(
            text.contains("\"description\""),
            "{k} has no description in the schema"
        );
        if let Some(r) = ranges.get(k.as_str()) {
            assert!(
                text.contains(&format!("\"minimum\":{}", r.min))
                    && text.contains(&format!("\"maximum\":{}", r.max)),
                "schema range of {k} is not {}..{}: {text}",
                r.min,
                r.max
            );
        }
    }
}

/// The long flags of `bmoe generate`, with their default values.
fn generate_flags() -> BTreeMap<String, Vec<String>> {
    let cmd = crate::cli::Cli::command();
    let gen = cmd
        .get_subcommands()
        .find(|c| c.get_name() == "generate")
        .expect("generate subcommand");
    gen.get_arguments()
        .filter_map(|a| {
            let long = a.get_long()?.to_string();
            let defaults = a
                .get_default_values()
                .iter()
                .map(|v| v.to_string_lossy().into_owned())
                .collect();
            Some((long, defaults))
        })
        .collect()
}

#[test]
fn every_setting_is_a_flag_of_its_own_name_without_a_default() {
    let flags = generate_flags();
    // The load time limit, the memory limit, the cold start and the disk probe are the runner's
    // (`run` keeps `--load-timeout`, `--memory-limit`, `--cold-start`; `--set disk_probe=true`):
    // the one-shot commands load in-process.
    let runners = ["load_timeout_s", "memory_limit", "cold_start", "disk_probe"];
    for k in KEYS.iter().filter(|k| !runners.contains(k)) {
        let flag = match *k {
            // A bool that defaults to true is turned off by its flag.
            "routed" => "no-routed".to_string(),
            k => k.replace('_', "-"),
        };
        let Some(d) = flags.get(&flag) else {
            panic!("setting {k} has no flag --{flag} on the one-shot commands");
        };
        let is_switch = matches!(*k, "moe_stream" | "routed" | "explain");
        if !is_switch {
            assert!(
                d.is_empty(),
                "--{flag} has a default of its own ({d:?}): the layers give it one"
            );
        }
    }
    assert_eq!(
        flags["n-predict"],
        vec![settings::N_PREDICT.default_u32().to_string()]
    );
    assert_eq!(
        flags["top-k"],
        vec![settings::TOP_K.default_u32().to_string()]
    );
    assert_eq!(
        flags["top-p"],
        vec![(settings::TOP_P.default as f32).to_string()]
    );
    assert_eq!(
        flags["temp"],
        vec![(settings::TEMPERATURE.default as f32).to_string()]
    );
}

/// The `| table | `key` | type | default | ... |` rows of docs/configuration.md's settings table.
fn documented() -> BTreeMap<String, (String, String)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/configuration.md");
    let text = std::fs::read_to_string(path).expect("docs/configuration.md");
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // ["", table, `key`, type, default, option, meaning, ""]
        if cells.len() >= 7 && matches!(cells[1], "engine" | "prefill") {
            let key = cells[2].trim_matches('`').to_string();
            out.insert(key, (cells[3].to_string(), cells[4].to_string()));
        }
    }
    out
}

#[test]
fn the_documented_table_is_the_definitions() {
    let docs = documented();
    let d = defaults();
    let ranges = int_ranges();
    for k in KEYS {
        let Some((ty, default)) = docs.get(*k) else {
            panic!("docs/configuration.md has no row for {k}");
        };
        // The default cell: `"auto"`, `"auto"` (4), 4096, true, `mmap`.
        let shown = default
            .split(" (")
            .next()
            .unwrap_or_default()
            .trim_matches('`')
            .trim_matches('"');
        let want = match &d[*k] {
            Value::String(s) => s.clone(),
            v => v.to_string(),
        };
        assert_eq!(shown, want, "docs/configuration.md default of {k}");
        if let Some(r) = ranges.get(*k) {
            assert!(
                ty.contains(&format!("{}..{}", r.min, r.max)),
                "docs/configuration.md range of {k} is {ty:?}, the definition {}..{}",
                r.min,
                r.max
            );
        }
    }
    assert_eq!(
        docs.len(),
        KEYS.len(),
        "docs rows vs settings: {:?}",
        docs.keys()
    );
}
