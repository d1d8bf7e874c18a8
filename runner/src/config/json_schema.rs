//! The JSON Schemas of the config files (profile, job, settings, JSONL items), generated from
//! their types (each config file publishes its own through [`generate`]): the files are checked
//! against them, and `bmoe schema` publishes them.
use schemars::generate::SchemaSettings;
use schemars::JsonSchema;
use serde_json::Value;

// Nothing from the other config files: each of them publishes its own type's schema through
// [`generate`] (`job::job_schema`, ...), so this file sits below them all.

/// `T`'s JSON Schema (Draft 2020-12) as the config files and the telemetry row publish it,
/// with `$id` set when `id` is not empty.
pub fn generate<T: JsonSchema>(id: &str) -> Value {
    let mut gen = SchemaSettings::draft2020_12().into_generator();
    let mut v = gen.root_schema_for::<T>().to_value();
    strip_null(&mut v);
    finish(v, id)
}

/// [`generate`] with `Option` fields left nullable (`["number", "null"]`): the telemetry row,
/// whose empty cells are `null` in JSON.
pub fn generate_nullable<T: JsonSchema>(id: &str) -> Value {
    let mut gen = SchemaSettings::draft2020_12().into_generator();
    finish(gen.root_schema_for::<T>().to_value(), id)
}

/// Constant lists as `enum`, and `$id` set when `id` is not empty.
fn finish(mut v: Value, id: &str) -> Value {
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

/// One JSONL line's schema.
pub fn item_schema<T: JsonSchema>() -> Value {
    generate::<T>("")
}
