//! One-shot commands that drive the engine directly: `devices`, `archs`, `synth`, `generate`, `decide`, `ppl`.
mod args;
mod devices;
mod run;
mod synth;

pub use args::{ArchsArgs, DecideArgs, DevicesArgs, GenerateArgs, PplArgs, SynthArgs};
pub use devices::run_devices;
pub use run::{run_decide, run_generate, run_ppl};
pub use synth::{run_archs, run_synth};
