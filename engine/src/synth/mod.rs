//! Synthetic MoE GGUFs: deterministic models written through the gguf C API, their tensor data
//! quantized by ggml itself, one tensor at a time so a multi-GB model never sits in memory.
mod arch;
mod rng;
mod spec;
mod vocab;
mod writer;

pub use arch::SynthArch;
pub use spec::{Preset, SynthSpec, WeightType};
pub use writer::{write_model, SynthReport};
