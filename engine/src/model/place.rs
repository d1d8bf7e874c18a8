//! Where a load runs: the prefill and offload devices resolved into llama.cpp's device list, and
//! where a session's KV cache goes with the prefill device.
use crate::error::{EngineError, Result};
use crate::ffi::buffer::BufferType;
use crate::ffi::registry::Device;
use crate::options::LoadOptions;
use crate::plan::PrefillPlace;

use super::warning::{KvHome, LoadWarning};

/// The devices a load lists, and what the prefill device brings.
pub(super) struct Placed {
    /// llama.cpp's device list (empty: the CPU alone).
    pub(super) devices: Vec<Device>,
    /// `n_gpu_layers`: 0, or -1 with an offload device.
    pub(super) gpu_layers: i32,
    /// The prefill device's name, when it opened.
    pub(super) prefill_device: Option<String>,
    /// The device the arena fills.
    pub(super) arena_device: Option<Device>,
    /// Where a session's KV cache moves, with that device.
    pub(super) kv_to: Option<BufferType>,
}

/// Where the KV cache and recurrent state of a run with prefill device `d` go, and how that is
/// said once at load. They move into the device's host buffer type only when the device's
/// backend computes on that memory (Hexagon's, an integrated GPU's): a discrete GPU's host buffer
/// is pinned memory it copies from, so moving there gains nothing. `stand_in` (a gate knob)
/// takes the CPU's buffer type where the device offers none, so the move itself runs on a
/// machine without such a device.
fn kv_home(d: Device, stand_in: bool) -> (Option<BufferType>, KvHome) {
    match BufferType::host_of(d) {
        Some(b) if b.computed_on_by(d) => (Some(b), KvHome::Moves(b.name())),
        _ if stand_in => (Some(BufferType::cpu()), KvHome::StandIn),
        Some(b) => (None, KvHome::CopiedFrom(b.name())),
        None => (None, KvHome::NoHostBuffer),
    }
}

/// The device a plan placed prefill on, or why the CPU runs it.
fn planned_device(prefill: &PrefillPlace) -> std::result::Result<(Device, String), String> {
    match &prefill.device {
        Some(name) => Device::by_name(name)
            .map(|d| (d, name.clone()))
            .ok_or_else(|| format!("{name} is not in this build's registry")),
        None => Err(prefill
            .cpu_because
            .clone()
            .unwrap_or_else(|| prefill.reason.clone())),
    }
}

/// Places the prefill device the plan resolved and resolves the offload device into
/// llama.cpp's device list.
pub(super) fn place_devices(
    opts: &LoadOptions,
    prefill: &PrefillPlace,
    cpu: Device,
    warnings: &mut Vec<LoadWarning>,
) -> Result<Placed> {
    // The prefill device joins as the only non-CPU device, with no layer assigned
    // (n_gpu_layers = 0): nothing runs there unless the engine hands it a graph.
    let mut placed = Placed {
        devices: Vec::new(),
        gpu_layers: 0,
        prefill_device: None,
        arena_device: None,
        kv_to: None,
    };
    // The plan resolved the prefill device (it opened there, once): the load takes its verdict.
    if let Some(p) = &opts.prefill {
        match planned_device(prefill) {
            Ok((d, name)) => {
                let (to, home) = kv_home(d, p.gate().kv_stand_in);
                warnings.push(LoadWarning::KvHome {
                    device: name.clone(),
                    home,
                });
                placed.kv_to = to;
                placed.devices.push(d);
                placed.arena_device = Some(d);
                placed.prefill_device = Some(name);
            }
            Err(why) => warnings.push(LoadWarning::PrefillOnCpu {
                device: p.device.clone(),
                why,
            }),
        }
    }
    if let Some(name) = &opts.offload {
        match crate::device::resolve(name) {
            crate::device::Resolution::Device(d, _) => {
                placed.devices.push(d);
                placed.gpu_layers = -1;
            }
            crate::device::Resolution::Cpu(reason) => {
                return Err(EngineError::InvalidOption(format!("offload: {reason}")))
            }
        }
    }
    // The CPU is listed only beside an offload device, where it has always been (llama.cpp
    // splits the offloaded layers over the listed devices). Listed otherwise, it would gain
    // nothing and cost the context a second CPU backend: the scheduler computes on the
    // listed one, which the context's threadpool (`llama_attach_threadpool`, applied to its
    // own `backend_cpu`) never reaches, so every graph a streamed decode is cut into would
    // start and join its worker threads again.
    if placed.gpu_layers != 0 {
        placed.devices.push(cpu);
    }
    Ok(placed)
}
