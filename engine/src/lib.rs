//! bmoe's engine: runs (mixture-of-experts) GGUF models on the real llama.cpp through FFI.
//!
//! Data flows one way: typed options in ([`LoadOptions`], [`SessionOptions`]), records out
//! ([`GenerateRecord`], [`DecideRecord`], [`PerplexityRecord`]). The engine never reads the
//! environment or a config file.
//!
//! This file is the whole public API: the re-exports below, and the modules a caller names by
//! path (`device` for the explain report, `gguf` for writing and checking files, `io`, `settings`
//! for every setting's range, `plan`, `telemetry`). Every other module is private.
mod chat;
pub mod device;
mod error;
mod ffi;
#[doc(hidden)]
pub mod fuzzing;
pub mod gguf;
mod graph;
pub mod io;
mod model;
mod options;
pub mod plan;
mod session;
pub mod settings;
mod stream;
pub mod telemetry;
mod tokenizer;
mod weights;

pub use error::{EngineError, Result};
pub use ffi::affinity::{current_thread_cpus, process_cpus};
pub use ffi::cpu_variant::{backend_modules, cpu_variant, BackendModules, CpuVariant};
pub use ffi::error::FfiError;
pub use ffi::heap::trim_free_heap;
pub use ffi::log::set_verbose as set_log_verbose;
pub use ffi::page_cache::drop_file_pages;
pub use ffi::registry::{backend_names, devices, system_info, Device, DeviceInfo, DeviceKind};
pub use ffi::repack::cpu_repack_available;
pub use ffi::rpc::add_server as add_rpc_server;
pub use model::{LeanLoadInfo, Model, ModelInfo};
pub use options::{
    CacheBudget, CachePolicy, DecideRequest, DenseWeights, GateKnobs, GenerateOptions, LoadOptions,
    PacingFault, Prefetch, PrefillOptions, PrefixCache, PrefixReuse, Repack, Sampling, Scoring,
    SessionOptions, StreamOptions,
};
pub use session::{log_softmax, CancelToken, MovedMemoryInfo, Session};
pub use stream::page_moves::{page_moves, PageMoves};
pub use stream::{routing_stats, sim, trace};
pub use telemetry::{
    rss_split, DecideRecord, GenerateRecord, LoadMode, LoadStats, PerplexityRecord,
    PrefillDevCounters, Repacked, ReuseOutcome, StopReason, StreamCounters, Timing,
};
pub use tokenizer::Tokenizer;

/// The engine's version, as recorded in telemetry.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// What tests need and users never do: a loopback RPC server (the device the gates run on).
#[cfg(feature = "test-support")]
pub mod test_support {
    pub use crate::ffi::rpc::start_loopback_server;
    pub use crate::ffi::stock_reference;
}
