//! The `memory_limit` setting's value: no limit, the profile's RAM, or a number of MiB; its text
//! form, its TOML/JSON forms and its schema. Enforcing it is `run::cgroup`'s job.
use std::borrow::Cow;
use std::fmt;

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};

/// The smallest limit taken: below it not even the runner's own code and a tiny model fit, so a
/// smaller number is a typo (KiB or GiB meant), not a phone.
pub const MEMORY_LIMIT_MIN_MIB: u64 = 64;

/// The largest limit taken (16 TiB, the profiles' largest `ram_mb`).
pub const MEMORY_LIMIT_MAX_MIB: u64 = 16 << 20;

/// A point's memory limit: a memory cgroup of this size around the point's process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MemoryLimit {
    /// No limit: the point runs in the runner's own process.
    #[default]
    None,
    /// The profile's `ram_mb`.
    Profile,
    /// A number of MiB.
    Mib(u64),
}

impl MemoryLimit {
    /// The limit in MiB for a profile with `ram_mb` of RAM; `None` when there is no limit.
    pub fn mib(self, ram_mb: u64) -> Option<u64> {
        match self {
            MemoryLimit::None => None,
            MemoryLimit::Profile => Some(ram_mb),
            MemoryLimit::Mib(n) => Some(n),
        }
    }
}

impl fmt::Display for MemoryLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemoryLimit::None => f.write_str("none"),
            MemoryLimit::Profile => f.write_str("profile"),
            MemoryLimit::Mib(n) => write!(f, "{n}"),
        }
    }
}

/// What a value that is not a limit gets told.
fn expected() -> String {
    format!(
        "`none`, `profile` or a number of MiB from {MEMORY_LIMIT_MIN_MIB} to {MEMORY_LIMIT_MAX_MIB}"
    )
}

/// A number of MiB, checked against the range.
fn in_range(n: u64) -> Result<MemoryLimit, String> {
    if (MEMORY_LIMIT_MIN_MIB..=MEMORY_LIMIT_MAX_MIB).contains(&n) {
        Ok(MemoryLimit::Mib(n))
    } else {
        Err(format!("expected {}, got {n}", expected()))
    }
}

impl std::str::FromStr for MemoryLimit {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "none" => Ok(MemoryLimit::None),
            "profile" => Ok(MemoryLimit::Profile),
            t => match t.parse::<u64>() {
                Ok(n) => in_range(n),
                Err(_) => Err(format!("expected {}, got {s:?}", expected())),
            },
        }
    }
}

impl Serialize for MemoryLimit {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            MemoryLimit::Mib(n) => s.serialize_u64(*n),
            other => s.serialize_str(&other.to_string()),
        }
    }
}

impl<'de> Deserialize<'de> for MemoryLimit {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = MemoryLimit;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(&expected())
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<MemoryLimit, E> {
                in_range(v).map_err(E::custom)
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<MemoryLimit, E> {
                u64::try_from(v)
                    .map_err(|_| E::custom(format!("expected {}, got {v}", expected())))
                    .and_then(|n| in_range(n).map_err(E::custom))
            }
            // Environment variables and --set arrive as text.
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<MemoryLimit, E> {
                v.parse().map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

impl JsonSchema for MemoryLimit {
    fn schema_name() -> Cow<'static, str> {
        "MemoryLimit".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "A memory cgroup around the point's process, page cache included: \"none\", \"profile\" (the profile's ram_mb) or a number of MiB.",
            "anyOf": [
                {"type": "integer", "minimum": MEMORY_LIMIT_MIN_MIB, "maximum": MEMORY_LIMIT_MAX_MIB},
                {"enum": ["none", "profile"]}
            ]
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_three_forms_and_refuses_the_rest() {
        assert_eq!("none".parse(), Ok(MemoryLimit::None));
        assert_eq!("profile".parse(), Ok(MemoryLimit::Profile));
        assert_eq!("256".parse(), Ok(MemoryLimit::Mib(256)));
        assert!("63".parse::<MemoryLimit>().is_err());
        assert!("lots".parse::<MemoryLimit>().is_err());
        let v: MemoryLimit = serde_json::from_str("512").unwrap();
        assert_eq!(v, MemoryLimit::Mib(512));
        let v: MemoryLimit = serde_json::from_str("\"profile\"").unwrap();
        assert_eq!(v.mib(7680), Some(7680));
        assert!(serde_json::from_str::<MemoryLimit>("-1").is_err());
        assert_eq!(serde_json::to_string(&MemoryLimit::Mib(64)).unwrap(), "64");
        assert_eq!(
            serde_json::to_string(&MemoryLimit::None).unwrap(),
            "\"none\""
        );
    }
}
