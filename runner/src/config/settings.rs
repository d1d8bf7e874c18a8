//! The layered engine values: the profile's `[engine]` and `[prefill]` tables, a job's
//! `[overrides]` and `[sweep]`, `BMOE_*` variables and `--set` all speak these keys.
use std::borrow::Cow;

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};

pub use super::declare::{
    to_engine, EngineValues, PrefillValues, SettingFlags, Settings, DEFAULT_LOAD_TIMEOUT_S, KEYS,
};
pub use super::values::{
    auto_loaders, CacheMb, Count, Cpus, DenseWeights, Prefetch, PrefixReuse, Repack, Runtime,
    AUTO_IO_THREADS,
};

impl Settings {
    /// The prefill device named, if any (none for stock llama.cpp, which has no such device).
    pub fn device_name(&self) -> Option<&str> {
        (!self.device.eq_ignore_ascii_case("none") && !self.device.is_empty() && !self.stock())
            .then_some(self.device.as_str())
    }

    /// Whether routed experts are streamed: `moe_stream`, in bmoe's engine (stock llama.cpp
    /// never streams).
    pub fn streams(&self) -> bool {
        self.moe_stream && !self.stock()
    }

    /// Whether the point runs stock llama.cpp (`runtime = "llama.cpp"`).
    pub fn stock(&self) -> bool {
        self.runtime == Runtime::LlamaCpp
    }

    /// The repack the point runs with: stock llama.cpp's is its default (`auto`).
    pub fn repack_run(&self) -> Repack {
        if self.stock() {
            Repack::Auto
        } else {
            self.repack
        }
    }
}

/// The schema of one layered key (from [`Settings`]'s schema), for overrides, sweeps and `--set`.
pub fn key_schemas(gen: &mut SchemaGenerator) -> serde_json::Map<String, serde_json::Value> {
    let s = Settings::json_schema(gen);
    s.get("properties")
        .and_then(|p| p.as_object())
        .cloned()
        .unwrap_or_default()
}

/// A job's `[overrides]`: any layered key, checked like the profile's.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Overrides(pub serde_json::Map<String, serde_json::Value>);

impl JsonSchema for Overrides {
    fn schema_name() -> Cow<'static, str> {
        "Overrides".into()
    }
    fn json_schema(gen: &mut SchemaGenerator) -> Schema {
        let props = key_schemas(gen);
        json_schema!({
            "description": "Profile values this job overrides (any key of [engine] or [prefill]).",
            "type": "object",
            "additionalProperties": false,
            "properties": props,
        })
    }
}

/// A job's `[sweep]`: for each listed key, the values to run; the job runs once per point of the
/// cartesian product.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Sweep(pub serde_json::Map<String, serde_json::Value>);

impl JsonSchema for Sweep {
    fn schema_name() -> Cow<'static, str> {
        "Sweep".into()
    }
    fn json_schema(gen: &mut SchemaGenerator) -> Schema {
        let props: serde_json::Map<String, serde_json::Value> = key_schemas(gen)
            .into_iter()
            .map(|(k, v)| {
                (
                    k,
                    serde_json::json!({"type": "array", "items": v, "minItems": 1, "maxItems": 64}),
                )
            })
            .collect();
        json_schema!({
            "description": "Values to sweep: each key lists the values to run; one run per point of the cartesian product.",
            "type": "object",
            "additionalProperties": false,
            "properties": props,
        })
    }
}

impl Sweep {
    /// The points of the cartesian product, each a list of (key, value) in key order; one empty
    /// point when nothing is swept.
    pub fn points(&self) -> Vec<Vec<(String, serde_json::Value)>> {
        let mut points: Vec<Vec<(String, serde_json::Value)>> = vec![Vec::new()];
        for (k, vals) in &self.0 {
            let vals = vals.as_array().cloned().unwrap_or_default();
            let mut next = Vec::with_capacity(points.len() * vals.len());
            for p in &points {
                for v in &vals {
                    let mut q = p.clone();
                    q.push((k.clone(), v.clone()));
                    next.push(q);
                }
            }
            points = next;
        }
        points
    }
}

/// A point's label for the CSV: `cache_mb=1500,threads=4`, or `base` when nothing is swept.
pub fn point_label(point: &[(String, serde_json::Value)]) -> String {
    if point.is_empty() {
        return "base".into();
    }
    point
        .iter()
        .map(|(k, v)| match v {
            serde_json::Value::String(s) => format!("{k}={s}"),
            other => format!("{k}={other}"),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The resolved layered values' schema (checks environment and `--set` values).
pub fn settings_schema() -> serde_json::Value {
    super::json_schema::generate::<Settings>("")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keys_match_the_struct() {
        let v = serde_json::to_value(Settings::default()).unwrap();
        let names: Vec<&str> = v.as_object().unwrap().keys().map(|k| k.as_str()).collect();
        assert_eq!(names, KEYS);
    }

    #[test]
    fn cache_mb_parses() {
        assert_eq!(
            serde_json::from_value::<CacheMb>(json!("auto")).unwrap(),
            CacheMb::Auto
        );
        assert_eq!(
            serde_json::from_value::<CacheMb>(json!(12)).unwrap(),
            CacheMb::Mib(12)
        );
        assert_eq!(
            serde_json::from_value::<CacheMb>(json!("12")).unwrap(),
            CacheMb::Mib(12)
        );
        assert!(serde_json::from_value::<CacheMb>(json!("lots")).is_err());
        assert!(serde_json::from_value::<CacheMb>(json!(-1)).is_err());
    }

    #[test]
    fn sweep_points() {
        let s = Sweep(
            json!({"cache_mb": [0, 10], "threads": [1, 2, 4]})
                .as_object()
                .unwrap()
                .clone(),
        );
        let p = s.points();
        assert_eq!(p.len(), 6);
        assert_eq!(point_label(&p[1]), "cache_mb=0,threads=2");
        assert_eq!(point_label(&Sweep::default().points()[0]), "base");
    }
}
