//! A device profile (`profiles/*.toml`): one phone or machine, and the engine values tuned for it.
use std::fmt;
use std::path::Path;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::diag::ConfigErrors;
use super::load::{load, SourceFile};
use super::settings::{EngineValues, PrefillValues};

/// Hexagon NPU generation of the SoC, or `none`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Hexagon {
    /// No Hexagon NPU (or not a Qualcomm SoC).
    #[default]
    None,
    /// Snapdragon 855 era.
    V66,
    /// Snapdragon 888 era.
    V68,
    /// Snapdragon 8 Gen 1.
    V69,
    /// Snapdragon 8 Gen 2.
    V73,
    /// Snapdragon 8 Gen 3.
    V75,
    /// Snapdragon 8 Elite.
    V79,
    /// Snapdragon 8 Elite Gen 5.
    V81,
}

impl Hexagon {
    /// The oldest generation the prefill device supports.
    pub const MIN_PREFILL: Hexagon = Hexagon::V73;
}

impl fmt::Display for Hexagon {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = serde_json::to_value(self)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        f.write_str(&s)
    }
}

/// One phone or machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// Short name, written to the CSV's `profile` column.
    #[schemars(regex(pattern = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"), length(max = 64))]
    pub name: String,
    /// Free text.
    #[serde(default)]
    pub description: String,
    /// System on chip, free text (e.g. "Snapdragon 8 Elite").
    #[serde(default)]
    pub soc: String,
    /// Hexagon NPU generation: v66 .. v81, or none. Prefill on the NPU needs v73 or newer.
    #[serde(default)]
    pub hexagon: Hexagon,
    /// Physical RAM in MiB.
    #[schemars(range(min = 256, max = 16777216))]
    pub ram_mb: u64,
    /// Storage, free text (e.g. "UFS 4.0").
    #[serde(default)]
    pub storage: String,
    /// CPU-side engine values.
    #[serde(default)]
    pub engine: EngineValues,
    /// Prefill device and prompt-piece values.
    #[serde(default)]
    pub prefill: PrefillValues,
    /// What `bmoe profile measure` measured on the machine itself (absent in a typed-in profile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured: Option<Measured>,
}

/// The `[measured]` table `bmoe profile measure` writes: the machine as measured, not typed in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Measured {
    /// When and by which bmoe build (free text).
    pub by: String,
    /// MemAvailable of /proc/meminfo when measured, MiB.
    pub ram_available_mb: u64,
    /// Each usable core's maximum frequency in MHz (0 = the kernel does not say), by CPU number.
    pub core_max_mhz: Vec<u64>,
    /// The kernel's page size in bytes.
    pub page_size: u64,
    /// The kernel release (`uname -r`).
    pub kernel: String,
    /// Whether evicted expert pages are moved (`move`, mremap MREMAP_DONTUNMAP works) or released.
    #[schemars(regex(pattern = r"^(move|release)$"))]
    pub page_moves: String,
    /// Size of each O_DIRECT random read the rates were measured at, KiB (an expert slice).
    #[schemars(range(min = 4, max = 1048576))]
    pub read_kib: u64,
    /// O_DIRECT random-read rate in MiB/s with 1, 2, 4 and 8 reads in flight.
    #[schemars(length(min = 1, max = 8))]
    pub read_mib_s: Vec<f64>,
    /// Hexagon NPU access seen: `/dev/fastrpc-*` nodes and `libcdsprpc.so` copies found.
    #[serde(default)]
    pub npu_seen: Vec<String>,
    /// `/sys/devices/soc0/soc_id` (Qualcomm SoC id), empty when absent.
    #[serde(default)]
    pub soc_id: String,
}

impl Measured {
    /// Reads in flight for each entry of `read_mib_s`.
    pub const IN_FLIGHT: [usize; 4] = [1, 2, 4, 8];

    /// The best measured rate and the reads in flight it took.
    pub fn best_read(&self) -> Option<(usize, f64)> {
        Self::IN_FLIGHT
            .iter()
            .zip(&self.read_mib_s)
            .map(|(&n, &r)| (n, r))
            .max_by(|a, b| a.1.total_cmp(&b.1))
    }
}

/// Reads and checks a profile file.
pub fn load_profile(path: &Path) -> Result<(Profile, SourceFile), ConfigErrors> {
    load(path, "profile", &profile_schema())
}

/// `schemas/profile.schema.json`.
pub fn profile_schema() -> serde_json::Value {
    super::json_schema::generate::<Profile>("profile.schema.json")
}
