//! The telemetry row's JSON Schema: the CSV columns as `bmoe schema` publishes them.
use serde_json::{json, Value};

use super::row::{Row, SCHEMA_VERSION};
use crate::config::json_schema::generate_nullable;

/// The string columns every row fills (its identity): the only ones that are never empty, so
/// never `null` in a machine line.
pub const ALWAYS_FILLED: &[&str] = &[
    "run_id", "time", "job", "kind", "profile", "point", "item", "model", "build",
];

/// `schemas/telemetry.schema.json`: one row as an object (a `--machine` line, or a CSV row read
/// as typed values), the version of the column set under `x-schema-version`, columns in order
/// under `x-columns`, each with its unit under `x-unit`. A column that can be empty is nullable
/// (`["number", "null"]`): an empty cell is `null`.
pub fn telemetry_schema() -> Value {
    let mut v = generate_nullable::<Row>("telemetry.schema.json");
    if let Some(props) = v.get_mut("properties").and_then(Value::as_object_mut) {
        for (name, p) in props.iter_mut() {
            if p["type"] == "string" && !ALWAYS_FILLED.contains(&name.as_str()) {
                p["type"] = json!(["string", "null"]);
                p["default"] = Value::Null;
            }
        }
    }
    if let Value::Object(m) = &mut v {
        m.insert("x-schema-version".into(), json!(SCHEMA_VERSION));
        m.insert(
            "x-columns".into(),
            Value::Array(Row::columns().into_iter().map(Value::String).collect()),
        );
    }
    with_settings_content(&mut v);
    v
}

/// The `settings` column's `contentSchema`: the resolved settings' own schema (every key with
/// its type, range or enum), so a reader can check the JSON the cell holds.
fn with_settings_content(v: &mut Value) {
    let mut inner =
        crate::config::json_schema::generate::<crate::config::settings::Settings>("settings");
    if let Value::Object(m) = &mut inner {
        m.remove("$schema");
        m.remove("$id");
    }
    if let Some(Value::Object(col)) = v.pointer_mut("/properties/settings") {
        col.insert("contentSchema".into(), inner);
    }
}

#[cfg(test)]
/// A column's type as docs/telemetry.md writes it: `number`, or `number or null` for a column
/// that can be empty.
pub fn type_words(p: &Value) -> String {
    match &p["type"] {
        Value::String(t) => t.clone(),
        Value::Array(ts) => ts
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(" or "),
        _ => String::new(),
    }
}

/// Whether the schema types a column as a number (integer or number, nullable or not).
pub fn is_numeric(p: &Value) -> bool {
    let of = |t: &Value| matches!(t.as_str(), Some("integer" | "number"));
    match &p["type"] {
        Value::Array(ts) => ts.iter().any(of),
        t => of(t),
    }
}
