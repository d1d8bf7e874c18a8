//! The value types of the layered settings (a cache size, a thread count, the named modes), each
//! with its text form and schema: what the declarations in `declare.rs` are typed with.
use std::borrow::Cow;
use std::fmt;

use bmoe_engine::settings;
use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};

pub use super::cpus::Cpus;
pub use super::memory_limit::MemoryLimit;

/// Expert cache size: a number of MiB, or `auto` (what the memory budget leaves).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheMb {
    /// Resolved by placement from the memory budget.
    Auto,
    /// A fixed budget in MiB (0 = no cache).
    Mib(u64),
}

impl fmt::Display for CacheMb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CacheMb::Auto => f.write_str("auto"),
            CacheMb::Mib(n) => write!(f, "{n}"),
        }
    }
}

impl std::str::FromStr for CacheMb {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "auto" => Ok(CacheMb::Auto),
            t => t
                .parse()
                .map(CacheMb::Mib)
                .map_err(|_| format!("expected a number of MiB or `auto`, got {s:?}")),
        }
    }
}

impl Serialize for CacheMb {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            CacheMb::Auto => s.serialize_str("auto"),
            CacheMb::Mib(n) => s.serialize_u64(*n),
        }
    }
}

impl<'de> Deserialize<'de> for CacheMb {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = CacheMb;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a non-negative integer or \"auto\"")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<CacheMb, E> {
                Ok(CacheMb::Mib(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<CacheMb, E> {
                u64::try_from(v)
                    .map(CacheMb::Mib)
                    .map_err(|_| E::invalid_value(serde::de::Unexpected::Signed(v), &self))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<CacheMb, E> {
                match v {
                    "auto" => Ok(CacheMb::Auto),
                    // Environment variables and --set arrive as text.
                    _ => v
                        .parse()
                        .map(CacheMb::Mib)
                        .map_err(|_| E::invalid_value(serde::de::Unexpected::Str(v), &self)),
                }
            }
        }
        d.deserialize_any(V)
    }
}

impl JsonSchema for CacheMb {
    fn schema_name() -> Cow<'static, str> {
        "CacheMb".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "Expert cache budget in MiB (0 = no cache), or \"auto\": what the memory budget leaves.",
            "anyOf": [
                {"type": "integer", "minimum": settings::CACHE_MB.min, "maximum": settings::CACHE_MB.max},
                {"const": "auto"}
            ]
        })
    }
}

/// A thread or lane count: a number, or `auto` (what each setting documents: the usable cores for
/// `threads`, 4 lanes for `io_threads`, the usable cores up to 8 for `loaders`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Count {
    /// Resolved against the machine that runs.
    #[default]
    Auto,
    /// Exactly this many (compute threads are still capped to the usable cores).
    N(u32),
}

impl Count {
    /// The explicit number, `None` for `auto`.
    pub fn explicit(self) -> Option<u32> {
        match self {
            Count::Auto => None,
            Count::N(n) => Some(n),
        }
    }

    /// The number, or `auto_value` for `auto`.
    pub fn or(self, auto_value: u32) -> u32 {
        self.explicit().unwrap_or(auto_value)
    }
}

impl fmt::Display for Count {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Count::Auto => f.write_str("auto"),
            Count::N(n) => write!(f, "{n}"),
        }
    }
}

impl std::str::FromStr for Count {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "auto" => Ok(Count::Auto),
            t => t
                .parse()
                .map(Count::N)
                .map_err(|_| format!("expected a positive integer or `auto`, got {s:?}")),
        }
    }
}

impl Serialize for Count {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Count::Auto => s.serialize_str("auto"),
            Count::N(n) => s.serialize_u32(*n),
        }
    }
}

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Count;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a positive integer or \"auto\"")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Count, E> {
                u32::try_from(v)
                    .map(Count::N)
                    .map_err(|_| E::invalid_value(serde::de::Unexpected::Unsigned(v), &self))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Count, E> {
                u32::try_from(v)
                    .map(Count::N)
                    .map_err(|_| E::invalid_value(serde::de::Unexpected::Signed(v), &self))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Count, E> {
                // Environment variables and --set arrive as text.
                v.parse()
                    .map_err(|_| E::invalid_value(serde::de::Unexpected::Str(v), &self))
            }
        }
        d.deserialize_any(V)
    }
}

/// The schema of a [`Count`] setting with `r`'s range.
fn count_schema(r: &bmoe_engine::settings::IntRange, doc: &str) -> Schema {
    json_schema!({
        "description": doc,
        "anyOf": [
            {"type": "integer", "minimum": r.min, "maximum": r.max},
            {"type": "string", "enum": ["auto"]}
        ]
    })
}

/// The schema of the setting's values (its range from the engine's `settings`).
pub fn threads_schema(_: &mut SchemaGenerator) -> Schema {
    count_schema(
        &bmoe_engine::settings::THREADS,
        "Compute threads, or \"auto\" (the cores this process may use: CPU affinity and cgroup quota). A number above those cores is capped to them.",
    )
}

/// The schema of the setting's values (its range from the engine's `settings`).
pub fn io_threads_schema(_: &mut SchemaGenerator) -> Schema {
    count_schema(
        &bmoe_engine::settings::IO_THREADS,
        "Expert-read lanes, or \"auto\" (4). Lanes block in the kernel rather than spin, so they are not capped to the cores.",
    )
}

/// The schema of the setting's values (its range from the engine's `settings`).
pub fn loaders_schema(_: &mut SchemaGenerator) -> Schema {
    count_schema(
        &bmoe_engine::settings::LOADERS,
        "Arena loader threads, or \"auto\" (the usable cores, at most 8).",
    )
}

pub use bmoe_engine::settings::{auto_loaders, AUTO_IO_THREADS};

/// Where dense (non-expert) weights live while streaming.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum DenseWeights {
    /// Left in the read-only mapping of the GGUF.
    #[default]
    Mmap,
    /// Copied once into engine-owned memory.
    Anon,
}

impl DenseWeights {
    /// The engine's value.
    pub fn engine(self) -> bmoe_engine::DenseWeights {
        match self {
            DenseWeights::Mmap => bmoe_engine::DenseWeights::Mmap,
            DenseWeights::Anon => bmoe_engine::DenseWeights::Anon,
        }
    }
}

impl fmt::Display for DenseWeights {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DenseWeights::Mmap => "mmap",
            DenseWeights::Anon => "anon",
        })
    }
}

/// Expert reads ahead while streaming (the engine's `Prefetch`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum Prefetch {
    /// At each routing node, the next layer's router on this layer's input predicts what to read
    /// ahead; reads start once at least half of its recent candidates turned out to be misses.
    #[default]
    Router,
    /// The router's prediction, read ahead from the first token on and never paused.
    Eager,
    /// The experts the next layer routed to on the previous token.
    Repeat,
    /// Every miss is read at its routing node.
    Off,
}

impl Prefetch {
    /// The engine's value.
    pub fn engine(self) -> bmoe_engine::Prefetch {
        match self {
            Prefetch::Router => bmoe_engine::Prefetch::Router,
            Prefetch::Eager => bmoe_engine::Prefetch::Eager,
            Prefetch::Repeat => bmoe_engine::Prefetch::Repeat,
            Prefetch::Off => bmoe_engine::Prefetch::Off,
        }
    }
}

impl fmt::Display for Prefetch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Prefetch::Router => "router",
            Prefetch::Eager => "eager",
            Prefetch::Repeat => "repeat",
            Prefetch::Off => "off",
        })
    }
}

/// Which resident expert the cache evicts to make room (the engine's `CachePolicy`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema, clap::ValueEnum,
)]
#[serde(rename_all = "snake_case")]
pub enum CachePolicy {
    /// The one whose next use is expected furthest ahead, from its layer's recent routing.
    #[default]
    #[value(name = "next_use")]
    NextUse,
    /// The least recently used (below one token's routed experts, the least used): the policy
    /// before `next_use`.
    Recency,
}

impl CachePolicy {
    /// The engine's value.
    pub fn engine(self) -> bmoe_engine::CachePolicy {
        match self {
            CachePolicy::NextUse => bmoe_engine::CachePolicy::NextUse,
            CachePolicy::Recency => bmoe_engine::CachePolicy::Recency,
        }
    }
}

impl fmt::Display for CachePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.engine().name())
    }
}

/// Whether weights may take llama.cpp's repacked CPU layouts (the engine's `Repack`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum Repack {
    /// Repacked wherever the CPU has a repacked kernel for the type and the weights fit in memory.
    #[default]
    Auto,
    /// The kernels over the file's own layout everywhere.
    Off,
}

impl Repack {
    /// The engine's value.
    pub fn engine(self) -> bmoe_engine::Repack {
        match self {
            Repack::Auto => bmoe_engine::Repack::Auto,
            Repack::Off => bmoe_engine::Repack::Off,
        }
    }
}

impl fmt::Display for Repack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Repack::Auto => "auto",
            Repack::Off => "off",
        })
    }
}

/// What runs a point: bmoe's engine, or stock llama.cpp as a person runs it (the baseline).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema, clap::ValueEnum,
)]
pub enum Runtime {
    /// bmoe's engine: streaming, a prefill device, prefix reuse, as the other settings say.
    #[default]
    #[serde(rename = "bmoe")]
    #[value(name = "bmoe")]
    Bmoe,
    /// Stock llama.cpp on the same vendored library: its mapped load with its default CPU repack,
    /// prompts cut at the batch width, nothing kept between calls, no streaming, no device.
    #[serde(rename = "llama.cpp")]
    #[value(name = "llama.cpp")]
    LlamaCpp,
}

impl fmt::Display for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Runtime::Bmoe => "bmoe",
            Runtime::LlamaCpp => "llama.cpp",
        })
    }
}

/// Prefix reuse between consecutive decisions of a session (the engine's `PrefixReuse`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum PrefixReuse {
    /// Reuse the common prefix cut back to a prompt-piece boundary: scores bit for bit those of a
    /// fresh prefill, whatever ran before.
    #[default]
    Auto,
    /// Reuse the whole common prefix: fewest tokens prefilled; scores may differ in the last bits.
    On,
    /// Every decision prefills from an empty cache.
    Off,
}

impl PrefixReuse {
    /// The engine's value.
    pub fn engine(self) -> bmoe_engine::PrefixReuse {
        match self {
            PrefixReuse::Auto => bmoe_engine::PrefixReuse::Auto,
            PrefixReuse::On => bmoe_engine::PrefixReuse::On,
            PrefixReuse::Off => bmoe_engine::PrefixReuse::Off,
        }
    }
}

impl fmt::Display for PrefixReuse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PrefixReuse::Auto => "auto",
            PrefixReuse::On => "on",
            PrefixReuse::Off => "off",
        })
    }
}
