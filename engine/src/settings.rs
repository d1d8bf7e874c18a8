//! Every numeric setting defined once: its name, default, unit and valid range. The engine's
//! option defaults, the runner's layered defaults, the CLI, the profile and job schemas and
//! `docs/configuration.md` all read (or are checked against) these constants, so a value is
//! refused by name wherever it is typed and a default cannot differ between two front ends.
use crate::error::{EngineError, Result};

/// An integer setting's default: a number, or `auto` (resolved where the setting is used).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntDefault {
    /// Resolved at run time (the usable cores, the memory budget, ...).
    Auto,
    /// This number.
    N(u64),
}

/// One integer setting: its name, default, unit and valid range (both ends included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntRange {
    /// The setting's name in profiles, jobs and `--set`.
    pub name: &'static str,
    /// Its default.
    pub default: IntDefault,
    /// Its unit, as the docs write it.
    pub unit: &'static str,
    /// Smallest valid value.
    pub min: u64,
    /// Largest valid value.
    pub max: u64,
}

impl IntRange {
    /// The numeric default (`None` for `auto`).
    pub const fn default_n(&self) -> Option<u64> {
        match self.default {
            IntDefault::Auto => None,
            IntDefault::N(n) => Some(n),
        }
    }

    /// The numeric default of a setting whose default is a number (0 for `auto`, which such a
    /// setting never has: the settings-agreement test holds every caller to that).
    pub const fn default_u32(&self) -> u32 {
        match self.default {
            IntDefault::Auto => 0,
            IntDefault::N(n) => n as u32,
        }
    }

    /// `v` when it is in range, else an error naming the setting and the range.
    pub fn check(&self, v: u64) -> Result<u64> {
        if v < self.min || v > self.max {
            return Err(EngineError::OutOfRange {
                setting: self.name,
                value: v.to_string(),
                expected: format!("an integer from {} to {}", self.min, self.max),
            });
        }
        Ok(v)
    }

    /// [`IntRange::check`] for a value that arrived as text (a CLI flag, `--set`).
    pub fn parse(&self, s: &str) -> Result<u64> {
        let v = s
            .trim()
            .parse::<u64>()
            .map_err(|_| EngineError::OutOfRange {
                setting: self.name,
                value: s.to_string(),
                expected: format!("an integer from {} to {}", self.min, self.max),
            })?;
        self.check(v)
    }
}

/// One real-valued setting: its name, default and valid range.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FloatRange {
    /// The setting's name in profiles, jobs and `--set`.
    pub name: &'static str,
    /// Its default.
    pub default: f64,
    /// Lower bound.
    pub min: f64,
    /// Whether `min` itself is excluded.
    pub min_exclusive: bool,
    /// Upper bound (included).
    pub max: f64,
}

impl FloatRange {
    /// `v` when it is finite and in range, else an error naming the setting and the range.
    pub fn check(&self, v: f64) -> Result<f64> {
        let low_ok = if self.min_exclusive {
            v > self.min
        } else {
            v >= self.min
        };
        if !v.is_finite() || !low_ok || v > self.max {
            return Err(EngineError::OutOfRange {
                setting: self.name,
                value: v.to_string(),
                expected: self.expected(),
            });
        }
        Ok(v)
    }

    /// [`FloatRange::check`] for a value that arrived as text.
    pub fn parse(&self, s: &str) -> Result<f64> {
        let v = s
            .trim()
            .parse::<f64>()
            .map_err(|_| EngineError::OutOfRange {
                setting: self.name,
                value: s.to_string(),
                expected: self.expected(),
            })?;
        self.check(v)
    }

    /// The range in words: `a number in (0, 1]`.
    pub fn expected(&self) -> String {
        let open = if self.min_exclusive { '(' } else { '[' };
        format!("a number in {open}{}, {}]", self.min, self.max)
    }
}

/// Compute threads (an explicit count; `auto` resolves to the usable cores).
pub const THREADS: IntRange = IntRange {
    name: "threads",
    default: IntDefault::Auto,
    unit: "threads",
    min: 1,
    max: 1024,
};
/// Context size in tokens (0 = the model's training context).
pub const CONTEXT: IntRange = IntRange {
    name: "context",
    default: IntDefault::N(4096),
    unit: "tokens",
    min: 0,
    max: 1 << 20,
};
/// Prompt piece width on the CPU.
pub const CPU_UBATCH: IntRange = IntRange {
    name: "cpu_ubatch",
    default: IntDefault::N(512),
    unit: "tokens",
    min: 1,
    max: 8192,
};
/// Prompt piece width on the prefill device. At least 2: a one-token device piece would have the
/// shape of a decode step, and llama.cpp's graph reuse could then run a decode with a graph
/// scheduled for the device while the weights are back on the host.
pub const DEVICE_UBATCH: IntRange = IntRange {
    name: "device_ubatch",
    default: IntDefault::N(512),
    unit: "tokens",
    min: 2,
    max: 8192,
};
/// Narrowest piece sent to the prefill device (at least 2, for the reason above).
pub const MIN_TOKENS: IntRange = IntRange {
    name: "min_tokens",
    default: IntDefault::N(32),
    unit: "tokens",
    min: 2,
    max: 8192,
};
/// Expert-read lanes.
pub const IO_THREADS: IntRange = IntRange {
    name: "io_threads",
    default: IntDefault::Auto,
    unit: "lanes",
    min: 1,
    max: 64,
};
/// Arena loader threads.
pub const LOADERS: IntRange = IntRange {
    name: "loaders",
    default: IntDefault::Auto,
    unit: "threads",
    min: 1,
    max: 64,
};
/// Experts used per token override (0 = the model's own).
pub const N_EXPERT_USED: IntRange = IntRange {
    name: "n_expert_used",
    default: IntDefault::N(0),
    unit: "experts",
    min: 0,
    max: 1024,
};
/// Expert cache budget in MiB.
pub const CACHE_MB: IntRange = IntRange {
    name: "cache_mb",
    default: IntDefault::Auto,
    unit: "MiB",
    min: 0,
    max: 1 << 30,
};
/// MiB of RAM the automatic cache size leaves to everything else.
pub const CACHE_FLOOR_MB: IntRange = IntRange {
    name: "cache_floor_mb",
    default: IntDefault::N(1024),
    unit: "MiB",
    min: 0,
    max: 1 << 30,
};
/// MiB of memory the expert cache keeps free while it runs (0 = the cache keeps its size).
pub const CACHE_RESERVE_MB: IntRange = IntRange {
    name: "cache_reserve_mb",
    default: IntDefault::N(0),
    unit: "MiB",
    min: 0,
    max: 1 << 30,
};
/// MiB the expert cache never shrinks below under memory pressure.
pub const CACHE_MIN_MB: IntRange = IntRange {
    name: "cache_min_mb",
    default: IntDefault::N(0),
    unit: "MiB",
    min: 0,
    max: 1 << 30,
};
/// Size limit of the prefix cache folder (`prefix_cache`): the least recently used entries go.
pub const PREFIX_CACHE_MB: IntRange = IntRange {
    name: "prefix_cache_mb",
    default: IntDefault::N(4096),
    unit: "MiB",
    min: 1,
    max: 1 << 30,
};
/// Tokens to generate at most.
pub const N_PREDICT: IntRange = IntRange {
    name: "n_predict",
    default: IntDefault::N(32),
    unit: "tokens",
    min: 1,
    max: 1 << 20,
};
/// Top-k sampling (0 = off).
pub const TOP_K: IntRange = IntRange {
    name: "top_k",
    default: IntDefault::N(40),
    unit: "tokens",
    min: 0,
    max: 1 << 20,
};
/// Sampling temperature (0 = greedy).
pub const TEMPERATURE: FloatRange = FloatRange {
    name: "temperature",
    default: 0.8,
    min: 0.0,
    min_exclusive: false,
    max: 100.0,
};
/// Top-p nucleus sampling (1 = off).
pub const TOP_P: FloatRange = FloatRange {
    name: "top_p",
    default: 0.95,
    min: 0.0,
    min_exclusive: true,
    max: 1.0,
};
/// Share of a layer's experts above which the routed arena reads the next layer whole.
pub const ROUTED_FULL: FloatRange = FloatRange {
    name: "routed_full",
    default: 0.85,
    min: 0.0,
    min_exclusive: true,
    max: 1.0,
};

/// Lossy: the router-probability distance within which a cached expert replaces a missed one
/// (0 = off).
pub const EXPERT_SUBSTITUTE: FloatRange = FloatRange {
    name: "expert_substitute",
    default: 0.0,
    min: 0.0,
    min_exclusive: false,
    max: 1.0,
};
/// Lossy: a missed expert whose share of the token's selected router weights is below this
/// times `1 / n_expert_used` is skipped (0 = off).
pub const DROP_COLD: FloatRange = FloatRange {
    name: "drop_cold",
    default: 0.0,
    min: 0.0,
    min_exclusive: false,
    max: 1.0,
};

/// What `io_threads = auto` resolves to: lanes block in the kernel rather than spin, so they are
/// not tied to the cores.
pub const AUTO_IO_THREADS: u32 = 4;

/// What `loaders = auto` resolves to on this machine: the usable cores, at most 8.
pub fn auto_loaders() -> u32 {
    usable_cores().clamp(1, 8)
}

/// The cores this process may run on: the CPU affinity mask and the cgroup CPU quota (a
/// Kubernetes pod's CPU limit, a Slurm allocation) both count, as Rust's
/// `available_parallelism` reads them. ggml's compute threads spin at barriers, so more threads
/// than this crawl instead of helping.
///
/// Read once, at the first call: a session pinned to chosen CPUs pins its calling thread, which
/// would then count only its own CPU.
pub fn usable_cores() -> u32 {
    static CORES: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| {
        std::thread::available_parallelism()
            .map(|n| n.get() as u32)
            .unwrap_or(1)
    })
}

/// Compute threads as asked and as used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadChoice {
    /// What the configuration said (`None` = `auto`).
    pub asked: Option<u32>,
    /// What runs: `asked` capped to the usable cores, or the usable cores for `auto`.
    pub used: u32,
    /// The usable cores at resolution time.
    pub cores: u32,
}

impl ThreadChoice {
    /// Resolves `asked` (`None` = `auto`) against `cores` usable cores.
    pub fn resolve(asked: Option<u32>, cores: u32) -> Self {
        let cores = cores.max(1);
        let used = asked.map_or(cores, |n| n.clamp(1, cores));
        Self { asked, used, cores }
    }

    /// The one `bmoe:` line to print when the count was capped, else `None`.
    pub fn capped_note(&self) -> Option<String> {
        match self.asked {
            Some(n) if n > self.used => Some(format!(
                "threads = {n} is more than the {} cores this process may use (CPU affinity and cgroup quota); running {} threads",
                self.cores, self.used
            )),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_refuse_by_name() {
        assert_eq!(THREADS.check(1).unwrap(), 1);
        let e = THREADS.check(0).unwrap_err().to_string();
        assert!(e.contains("threads") && e.contains("from 1 to 1024"), "{e}");
        assert!(TOP_P.check(0.0).is_err());
        assert!(TOP_P.check(2.0).is_err());
        assert!(TOP_P.check(f64::NAN).is_err());
        assert_eq!(TOP_P.check(1.0).unwrap(), 1.0);
        assert!(TEMPERATURE.check(0.0).is_ok());
        assert!(TEMPERATURE.check(-0.1).is_err());
        assert!(CPU_UBATCH
            .parse("x")
            .unwrap_err()
            .to_string()
            .contains("cpu_ubatch"));
    }

    #[test]
    fn threads_capped_to_cores() {
        let t = ThreadChoice::resolve(Some(64), 2);
        assert_eq!(t.used, 2);
        assert!(t.capped_note().unwrap().contains("64"));
        let t = ThreadChoice::resolve(None, 3);
        assert_eq!((t.used, t.capped_note()), (3, None));
        assert_eq!(ThreadChoice::resolve(Some(1), 8).used, 1);
    }
}
