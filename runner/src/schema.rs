//! The JSON Schemas generated from the config and telemetry types (`bmoe schema`), and the
//! staleness check that keeps the checked-in `schemas/*.json` equal to them.
use std::path::Path;

use anyhow::Context;
use schemars::generate::SchemaSettings;
use schemars::JsonSchema;
use serde_json::Value;

use crate::config::job::Job;
use crate::config::profile::Profile;
use crate::config::settings::Settings;
use crate::sink::row::Row;

/// The files `bmoe schema` writes, and what each holds.
pub const FILES: &[&str] = &[
    "profile.schema.json",
    "job.schema.json",
    "telemetry.schema.json",
];

fn generate<T: JsonSchema>(id: &str) -> Value {
    let mut gen = SchemaSettings::draft2020_12().into_generator();
    let mut v = gen.root_schema_for::<T>().to_value();
    strip_null(&mut v);
    const_lists_to_enum(&mut v);
    if let Value::Object(m) = &mut v {
        if !id.is_empty() {
            m.insert(
                "$id".into(),
                Value::String(format!("https://bmoe.invalid/schemas/{id}")),
            );
        }
    }
    v
}

/// TOML has no null: optional fields are simply absent, so `null` is dropped from the schemas
/// (schemars marks `Option` fields nullable).
fn strip_null(v: &mut Value) {
    match v {
        Value::Object(m) => {
            if let Some(Value::Array(ts)) = m.get_mut("type") {
                ts.retain(|t| t != "null");
                if ts.len() == 1 {
                    let t = ts[0].clone();
                    m.insert("type".into(), t);
                }
            }
            for key in ["anyOf", "oneOf"] {
                if let Some(Value::Array(alts)) = m.get_mut(key) {
                    alts.retain(|a| a.get("type").map(|t| t != "null").unwrap_or(true));
                    if alts.len() == 1 {
                        let only = alts.remove(0);
                        m.remove(key);
                        if let Value::Object(o) = only {
                            for (k, x) in o {
                                m.entry(k).or_insert(x);
                            }
                        }
                    }
                }
            }
            if m.get("default") == Some(&Value::Null) {
                m.remove("default");
            }
            for (_, x) in m.iter_mut() {
                strip_null(x);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(strip_null),
        _ => {}
    }
}

/// A `oneOf` of documented string constants (how schemars writes a Rust enum) becomes a plain
/// `enum`, with each value's doc under `x-taplo.docs.enumValues`: editors using Taplo (Draft 4)
/// offer `enum` values for completion but not `const` alternatives.
fn const_lists_to_enum(v: &mut Value) {
    match v {
        Value::Object(m) => {
            let consts: Option<Vec<(Value, Value)>> =
                m.get("oneOf").and_then(|o| o.as_array()).and_then(|alts| {
                    if alts.len() < 2 {
                        return None;
                    }
                    alts.iter()
                        .map(|a| {
                            let c = a.get("const")?;
                            c.is_string().then(|| {
                                (
                                    c.clone(),
                                    a.get("description").cloned().unwrap_or(Value::Null),
                                )
                            })
                        })
                        .collect()
                });
            if let Some(cs) = consts {
                m.remove("oneOf");
                m.insert("type".into(), Value::String("string".into()));
                m.insert(
                    "enum".into(),
                    Value::Array(cs.iter().map(|(c, _)| c.clone()).collect()),
                );
                m.insert(
                    "x-taplo".into(),
                    serde_json::json!({ "docs": { "enumValues": cs.into_iter().map(|(_, d)| d).collect::<Vec<_>>() } }),
                );
            }
            for (_, x) in m.iter_mut() {
                const_lists_to_enum(x);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(const_lists_to_enum),
        _ => {}
    }
}

/// `schemas/profile.schema.json`.
pub fn profile_schema() -> Value {
    generate::<Profile>("profile.schema.json")
}

/// `schemas/job.schema.json`.
pub fn job_schema() -> Value {
    generate::<Job>("job.schema.json")
}

/// The resolved layered values (checks environment and `--set` values).
pub fn settings_schema() -> Value {
    generate::<Settings>("")
}

/// One JSONL line's schema.
pub fn item_schema<T: JsonSchema>() -> Value {
    generate::<T>("")
}

/// `schemas/telemetry.schema.json`: one CSV row as an object, columns in order under
/// `x-columns`, each with its unit under `x-unit`.
pub fn telemetry_schema() -> Value {
    let mut v = generate::<Row>("telemetry.schema.json");
    if let Value::Object(m) = &mut v {
        m.insert(
            "x-columns".into(),
            Value::Array(Row::columns().into_iter().map(Value::String).collect()),
        );
    }
    v
}

/// The text of each schema file, as written (pretty JSON, trailing newline).
pub fn rendered() -> Vec<(&'static str, String)> {
    let all = [profile_schema(), job_schema(), telemetry_schema()];
    FILES
        .iter()
        .zip(all)
        .map(|(f, v)| {
            (
                *f,
                format!("{}\n", serde_json::to_string_pretty(&v).unwrap_or_default()),
            )
        })
        .collect()
}

/// Writes every schema into `dir`.
pub fn write(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for (name, text) in rendered() {
        let p = dir.join(name);
        std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
        println!("wrote {}", p.display());
    }
    Ok(())
}

/// The files in `dir` that differ from what the code generates (missing counts as different).
pub fn stale(dir: &Path) -> Vec<String> {
    rendered()
        .into_iter()
        .filter(|(name, text)| {
            std::fs::read_to_string(dir.join(name)).ok().as_deref() != Some(text.as_str())
        })
        .map(|(name, _)| name.to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The checked-in schemas must be what the code generates; run `bmoe schema` to refresh them.
    #[test]
    fn checked_in_schemas_are_current() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../schemas");
        let stale = stale(&dir);
        assert!(
            stale.is_empty(),
            "schemas/{stale:?} differ from the code: run `bmoe schema` (writes schemas/) and commit"
        );
    }

    /// Every shipped profile and job names its schema on its first line (Taplo's directive), and
    /// `.taplo.toml` maps both folders to existing schemas.
    #[test]
    fn shipped_tomls_name_their_schema() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        for (dir, schema) in [("profiles", "profile"), ("jobs", "job")] {
            let want = format!("#:schema ../schemas/{schema}.schema.json");
            let mut n = 0;
            for e in std::fs::read_dir(root.join(dir)).unwrap() {
                let p = e.unwrap().path();
                if p.extension().and_then(|x| x.to_str()) != Some("toml") {
                    continue;
                }
                let text = std::fs::read_to_string(&p).unwrap();
                assert_eq!(text.lines().next(), Some(want.as_str()), "{}", p.display());
                n += 1;
            }
            assert!(n > 0, "{dir}");
            assert!(root.join(format!("schemas/{schema}.schema.json")).exists());
        }
        let taplo: toml::Value =
            toml::from_str(&std::fs::read_to_string(root.join(".taplo.toml")).unwrap()).unwrap();
        let rules = taplo["rule"].as_array().unwrap();
        for (glob, path) in [
            ("profiles/**/*.toml", "./schemas/profile.schema.json"),
            ("jobs/**/*.toml", "./schemas/job.schema.json"),
        ] {
            assert!(
                rules.iter().any(|r| r["include"][0].as_str() == Some(glob)
                    && r["schema"]["path"].as_str() == Some(path)),
                "{glob} -> {path}"
            );
        }
    }

    #[test]
    fn enums_are_enum_for_taplo() {
        let j = job_schema();
        assert_eq!(
            j["$defs"]["Kind"]["enum"],
            serde_json::json!(["generate", "decide", "perplexity"])
        );
        assert!(!job_schema().to_string().contains("\"oneOf\""));
        assert!(!profile_schema().to_string().contains("\"oneOf\""));
    }

    #[test]
    fn options_are_not_nullable() {
        let s = job_schema().to_string();
        assert!(!s.contains("\"null\""), "{s}");
    }
}
