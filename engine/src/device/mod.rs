//! The prefill device (`prefill_device`): resolving the name to a ggml device that opens, or saying
//! why the run stays on the CPU.
pub mod arena;
pub mod explain;
pub mod loader;
mod slots;

pub use crate::error::DeviceError;
use crate::ffi::registry::{devices, Device, DeviceKind};

/// Where prefill will run.
#[derive(Debug, Clone)]
pub enum Resolution {
    /// The named device, found and opened.
    Device(Device, String),
    /// The run stays on the CPU, for this reason (`HTP0 is not in this build's registry, ...`:
    /// each caller frames it).
    Cpu(String),
}

/// Looks `name` up in the registry and checks it opens.
pub fn resolve(name: &str) -> Resolution {
    let Some(dev) = Device::by_name(name) else {
        let known: Vec<String> = devices().into_iter().map(|d| d.name).collect();
        return Resolution::Cpu(format!(
            "{name} is not in this build's registry, which has: {}",
            known.join(", ")
        ));
    };
    let info = dev.info();
    if info.kind == DeviceKind::Cpu {
        return Resolution::Cpu(format!("{name} is the CPU"));
    }
    if !dev.opens() {
        return Resolution::Cpu(format!("{name} ({}) does not open", info.description));
    }
    Resolution::Device(dev, info.name)
}
