//! The telemetry row's JSON Schema: the CSV columns as `bmoe schema` publishes them.
use serde_json::Value;

use super::row::Row;
use crate::config::schema::generate;

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
    with_settings_content(&mut v);
    v
}

/// The `settings` column's `contentSchema`: the resolved settings' own schema (every key with
/// its type, range or enum), so a reader can check the JSON the cell holds.
fn with_settings_content(v: &mut Value) {
    let mut inner = generate::<crate::config::settings::Settings>("settings");
    if let Value::Object(m) = &mut inner {
        m.remove("$schema");
        m.remove("$id");
    }
    if let Some(Value::Object(col)) = v.pointer_mut("/properties/settings") {
        col.insert("contentSchema".into(), inner);
    }
}
