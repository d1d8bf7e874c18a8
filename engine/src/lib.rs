//! bmoe's engine: runs (mixture-of-experts) GGUF models on the real llama.cpp through FFI.
//!
//! Data flows one way: typed options in ([`LoadOptions`], [`SessionOptions`]), records out
//! ([`GenerateRecord`], [`DecideRecord`], [`PerplexityRecord`]). The engine never reads the
//! environment or a config file.
pub mod device;
pub mod error;
pub mod ffi;
pub mod gguf_check;
pub mod gguf_index;
pub mod hook;
pub mod io;
pub mod limits;
pub mod model;
pub mod options;
pub mod session;
pub mod stream;
pub mod synth;
pub mod telemetry;
pub mod tokenizer;

pub use error::{EngineError, Result};
pub use ffi::log::set_verbose as set_log_verbose;
pub use ffi::registry::{backend_names, devices, system_info, Device, DeviceInfo, DeviceKind};
pub use model::{LeanLoadInfo, Model, ModelInfo};
pub use options::{
    DecideRequest, DenseWeights, GenerateOptions, LoadOptions, PacingFault, PrefillOptions,
    PrefixReuse, Sampling, Scoring, SessionOptions, StreamOptions,
};
pub use session::{log_softmax, CancelToken, Session};
pub use telemetry::{
    rss_split, DecideRecord, GenerateRecord, LoadMode, LoadStats, PerplexityRecord,
    PrefillDevCounters, ReuseOutcome, StopReason, StreamCounters, Timing,
};
pub use tokenizer::Tokenizer;

/// The engine's version, as recorded in telemetry.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
