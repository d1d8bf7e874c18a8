//! The `cpus` setting: `auto`, or the CPUs compute threads run on, in the kernel's CPU list
//! format (`0-3,6`) or as a TOML list. Resolved against the machine by `cores`.
use std::fmt;

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};

/// The `cpus` setting: `auto`, or the CPUs to compute on.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Cpus {
    /// The fast cores where the machine has slower ones too; else no pinning.
    #[default]
    Auto,
    /// Exactly these CPUs (ascending, no duplicates).
    List(Vec<usize>),
}

impl fmt::Display for Cpus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cpus::Auto => f.write_str("auto"),
            Cpus::List(l) => f.write_str(&cpulist(l)),
        }
    }
}

/// A CPU list in the kernel's format (`0-3,6`).
pub fn cpulist(cpus: &[usize]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        parts.push(if j > i {
            format!("{}-{}", cpus[i], cpus[j])
        } else {
            cpus[i].to_string()
        });
        i = j + 1;
    }
    parts.join(",")
}

/// Parses the kernel's CPU list format (`0-3,6`; `+` also separates, since a comma on `--set`
/// starts a sweep), ascending without duplicates.
pub fn parse_cpulist(s: &str) -> Result<Vec<usize>, String> {
    let bad =
        || format!("expected \"auto\" or CPU numbers such as \"4-7\" or \"0-3+6\", got {s:?}");
    let mut out = Vec::new();
    for part in s.split([',', '+']).map(str::trim) {
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (a.trim(), b.trim()),
            None => (part, part),
        };
        let lo: usize = lo.parse().map_err(|_| bad())?;
        let hi: usize = hi.parse().map_err(|_| bad())?;
        if lo > hi || hi >= 1024 {
            return Err(bad());
        }
        out.extend(lo..=hi);
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

impl std::str::FromStr for Cpus {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "auto" => Ok(Cpus::Auto),
            t => parse_cpulist(t).map(Cpus::List),
        }
    }
}

impl Serialize for Cpus {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for Cpus {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            One(usize),
            Text(String),
            List(Vec<usize>),
        }
        match Raw::deserialize(d)? {
            Raw::One(c) if c < 1024 => Ok(Cpus::List(vec![c])),
            Raw::One(c) => Err(serde::de::Error::custom(format!(
                "expected a CPU number below 1024, got {c}"
            ))),
            Raw::Text(t) => t.parse().map_err(serde::de::Error::custom),
            Raw::List(l) if l.is_empty() || l.iter().any(|&c| c >= 1024) => Err(
                serde::de::Error::custom("expected a non-empty list of CPU numbers below 1024"),
            ),
            Raw::List(mut l) => {
                l.sort_unstable();
                l.dedup();
                Ok(Cpus::List(l))
            }
        }
    }
}

impl JsonSchema for Cpus {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Cpus".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "CPUs the compute threads run on: \"auto\" (the fast cores where some are slower), a CPU number, a list of them, or a CPU list such as \"4-7\".",
            "anyOf": [
                {"const": "auto"},
                {"type": "integer", "minimum": 0, "maximum": 1023},
                {"type": "string", "pattern": r"^\s*\d+(\s*-\s*\d+)?(\s*[,+]\s*\d+(\s*-\s*\d+)?)*\s*$"},
                {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 1023}, "minItems": 1}
            ]
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpulists_round_trip() {
        assert_eq!(parse_cpulist("0-3,6").unwrap(), vec![0, 1, 2, 3, 6]);
        assert_eq!(cpulist(&[0, 1, 2, 3, 6, 8, 9]), "0-3,6,8-9");
        assert!(parse_cpulist("3-1").is_err() && parse_cpulist("x").is_err());
        let v: Cpus = serde_json::from_value(serde_json::json!([5, 4, 4])).unwrap();
        assert_eq!(v, Cpus::List(vec![4, 5]));
        assert!(serde_json::from_value::<Cpus>(serde_json::json!([])).is_err());
        let v: Cpus = serde_json::from_value(serde_json::json!("4-5")).unwrap();
        assert_eq!(v.to_string(), "4-5");
    }
}
