//! What a load tells the user, one variant per kind: the prose lives here, apart from the load's
//! logic, and the model keeps each rendered once ([`crate::Model::warnings`]).
use std::fmt;

/// One thing the user should know about a load.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum LoadWarning {
    /// Where the prefill device keeps the KV cache and recurrent state (said once at load).
    KvHome {
        /// The prefill device's name.
        device: String,
        /// Where the KV cache goes.
        home: KvHome,
    },
    /// The prefill device asked for did not open; the run stays on the CPU.
    PrefillOnCpu {
        /// The device as asked for.
        device: String,
        /// Why it did not open.
        why: String,
    },
    /// The lean load cannot build this model: llama.cpp's load reads the whole file.
    WholeFile {
        /// Why the lean load declined.
        why: String,
    },
    /// Optional tensors the file lacks stay in the graph as identity ops.
    NeutralTensors {
        /// How many.
        n: usize,
    },
    /// Repacking would copy more than the memory available: the file's layout stays.
    RepackOff {
        /// Bytes of the model's files.
        need: u64,
        /// Bytes of memory available.
        left: u64,
    },
    /// The expert cache is below one token's routed experts.
    BelowCliff {
        /// The cache's budget in bytes.
        budget: u64,
        /// Bytes of one token's routed experts.
        token_bytes: u64,
    },
    /// O_DIRECT is not usable: expert reads go through the page cache.
    NoDirect,
    /// `cache_reserve_mb` without an expert cache does nothing.
    ReserveWithoutCache {
        /// The setting's value.
        reserve_mb: u64,
    },
    /// `cache_mb = auto` left no expert cache.
    AutoNoCache {
        /// MiB available at load.
        available_mib: f64,
        /// `cache_floor_mb`.
        floor_mb: u64,
        /// MiB the rest of the plan holds.
        fixed_mib: f64,
        /// Bytes of one token's routed experts.
        token_bytes: u64,
    },
    /// What the prefill arena refused, in its own words.
    Arena(String),
}

/// Where a prefill device's run keeps the KV cache and recurrent state.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum KvHome {
    /// In the device's host buffer type, which it computes on (named).
    Moves(String),
    /// In the CPU's buffer type, standing in (a gate knob).
    StandIn,
    /// In CPU memory: the device's host buffer type (named) is memory it copies from.
    CopiedFrom(String),
    /// In CPU memory: the device offers no host buffer type.
    NoHostBuffer,
}

/// Bytes as MiB with one decimal.
fn mib(bytes: u64) -> f64 {
    bytes as f64 / 1048576.0
}

impl fmt::Display for LoadWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::KvHome { device, home } => kv_home(f, device, home),
            Self::PrefillOnCpu { device, why } => write!(
                f,
                "prefill device {device}: {why}; the whole run stays on the CPU"
            ),
            Self::WholeFile { why } => write!(
                f,
                "loading the whole file the llama.cpp way ({why}): the load reads every expert once"
            ),
            Self::NeutralTensors { n } => write!(
                f,
                "{n} optional tensors the file lacks stay in the graph as identity ops (zeros, ones): this llama.cpp's model structures were not what the engine checks for"
            ),
            Self::RepackOff { need, left } => write!(
                f,
                "repack off: the model's {} MiB would be copied into memory, and {} MiB are available; its weights page from the file in their own layout",
                need >> 20,
                left >> 20
            ),
            Self::BelowCliff {
                budget,
                token_bytes,
            } => write!(
                f,
                "expert cache of {} MiB is below one token's routed experts ({:.1} MiB): past this cliff a token reads most of its experts, and only the most used ones stay cached",
                budget >> 20,
                mib(*token_bytes),
            ),
            Self::NoDirect => f.write_str(
                "O_DIRECT is not usable on the model's file system; expert reads go through the page cache",
            ),
            Self::ReserveWithoutCache { reserve_mb } => write!(
                f,
                "cache_reserve_mb = {reserve_mb} does nothing without an expert cache (cache_mb = 0): there is nothing to give back"
            ),
            Self::AutoNoCache {
                available_mib,
                floor_mb,
                fixed_mib,
                token_bytes,
            } => write!(
                f,
                "cache_mb = auto: {available_mib:.0} MiB available at load, minus cache_floor_mb = {floor_mb} MiB left to everything else and {fixed_mib:.0} MiB the rest of the plan holds (dense weights, KV cache, compute buffers), leaves no expert cache, below one token's routed experts ({:.1} MiB): every token reads all its experts; set cache_mb, or a cache_floor_mb that leaves room",
                mib(*token_bytes),
            ),
            Self::Arena(s) => f.write_str(s),
        }
    }
}

/// The line that says where a prefill device's run keeps its KV cache.
fn kv_home(f: &mut fmt::Formatter<'_>, name: &str, home: &KvHome) -> fmt::Result {
    let stays = |f: &mut fmt::Formatter<'_>, why: &str| {
        write!(
            f,
            "prefill device {name}: the KV cache and recurrent state stay in CPU memory ({why}); device graphs run their attention on the CPU"
        )
    };
    match home {
        KvHome::Moves(buft) => write!(
            f,
            "prefill device {name}: the KV cache and recurrent state move into its host buffer type {buft} when a session opens"
        ),
        KvHome::StandIn => write!(
            f,
            "prefill device {name}: the KV cache and recurrent state move into a stand-in (the CPU buffer type) when a session opens"
        ),
        KvHome::CopiedFrom(buft) => stays(
            f,
            &format!("its host buffer type {buft} is memory it copies from, not memory it computes on"),
        ),
        KvHome::NoHostBuffer => stays(f, "it offers no host buffer type to move them into"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warnings_read_as_before() {
        let cliff = LoadWarning::BelowCliff {
            budget: 64 << 20,
            token_bytes: 3 << 19,
        };
        assert!(cliff
            .to_string()
            .starts_with("expert cache of 64 MiB is below one token's routed experts (1.5 MiB)"));
        let home = LoadWarning::KvHome {
            device: "GPU0".into(),
            home: KvHome::NoHostBuffer,
        };
        assert_eq!(
            home.to_string(),
            "prefill device GPU0: the KV cache and recurrent state stay in CPU memory (it offers no host buffer type to move them into); device graphs run their attention on the CPU"
        );
        assert_eq!(LoadWarning::Arena("x".into()).to_string(), "x");
    }
}
