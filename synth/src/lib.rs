//! Synthetic MoE GGUFs: deterministic models written through the gguf C API, their tensor data
//! quantized by ggml itself, one tensor at a time so a multi-GB model never sits in memory.
//!
//! A crate of its own: the engine runs models and never writes one; the CLI (`bmoe synth`) and the
//! tests write them through the engine's safe GGUF writer (`bmoe_engine::gguf::write`).
mod arch;
mod error;
mod process_folder;
mod rng;
mod spec;
mod vocab;
mod writer;

pub use arch::SynthArch;
pub use error::{Result, SynthError};
pub use process_folder::process_folder;
pub use spec::{Preset, SynthSpec, WeightType};
pub use writer::{shard_paths, write_model, SynthReport};
