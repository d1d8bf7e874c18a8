//! Where each layer weight of a wide graph goes in the prefill device's slots: its slot pair,
//! its offset, and the type the device takes it in (converted once at load where its matmul
//! refuses the file's).
use std::collections::BTreeMap;
use std::sync::Arc;

use crate::device::DeviceError;
use crate::ffi::buffer::BufferType;
use crate::ffi::probe::device_takes_matmul_of;
use crate::ffi::quant;
use crate::ffi::registry::Device;
use crate::ffi::tensor::{Binding, Layout, TensorPtr};
use crate::graph::{layer_of, Capture};
use crate::options::PrefillOptions;
use crate::weights::residency;
use crate::weights::table::WeightTable;

/// A non-expert weight of a layer: copied from its host binding.
pub(super) struct DenseWeight {
    pub(super) t: TensorPtr,
    pub(super) off: usize,
    pub(super) host: Binding,
    /// In the plain slot pair (some op other than a matmul reads it).
    pub(super) plain: bool,
    /// When the device's matmul refuses the weight's type, its converted copy.
    pub(super) converted: Option<Converted>,
}

/// An expert matrix of a layer: each expert is one upload.
pub(super) struct ExpertWeight {
    pub(super) t: TensorPtr,
    pub(super) off: usize,
    pub(super) host: Binding,
    pub(super) expert_bytes: usize,
    /// Each expert's pieces in the GGUF when experts are streamed: read from the file, not the
    /// host (one piece unless the tensor is a fused one the file stores as its parts).
    pub(super) file: Option<Vec<crate::gguf::index::ExpertPart>>,
}

/// One layer's weights and where each goes.
pub(super) struct Layer {
    pub(super) dense: Vec<DenseWeight>,
    pub(super) experts: Vec<ExpertWeight>,
    /// Whether the graph has a routing node for this layer (else its experts load with the rest).
    pub(super) routed: bool,
}

/// The type the device copy of a refused matrix takes: the nearest the device's matmul accepts
/// (Q8_0 for a quantized grid, F16 then F32 for a float one), asked with probe ops.
fn device_type(device: Device, t: TensorPtr, refuse: &[String]) -> Option<Layout> {
    let from = t.layout().ty();
    let candidates: &[ggml_sys::ggml_type] = if quant::is_quantized(from) {
        &[
            ggml_sys::GGML_TYPE_Q8_0,
            ggml_sys::GGML_TYPE_F16,
            ggml_sys::GGML_TYPE_F32,
        ]
    } else {
        &[ggml_sys::GGML_TYPE_F16, ggml_sys::GGML_TYPE_F32]
    };
    let ne = t.ne();
    candidates
        .iter()
        .copied()
        .filter(|&ty| ty != from && !refuse.contains(&quant::type_name(ty)))
        .filter(|&ty| (ne[0] as usize).is_multiple_of(quant::block_size(ty)))
        .find(|&ty| device_takes_matmul_of(device, ty, ne, false))
        .map(|ty| Layout::contiguous(ty, ne))
}

/// `t`'s host bytes in `to` (dequantized with ggml, then quantized with ggml).
fn convert(t: TensorPtr, host: Binding, to: Layout) -> Result<Vec<u8>, DeviceError> {
    let n: usize = t.ne().iter().map(|&d| d as usize).product();
    let bytes = host
        .host_bytes()
        .ok_or_else(|| DeviceError::NotOnHost(t.name().to_string()))?;
    let from = t.layout().ty();
    let f = quant::to_f32(from, bytes, n).ok_or_else(|| DeviceError::NoDequantizer {
        tensor: t.name().to_string(),
        ty: quant::type_name(from).to_string(),
    })?;
    Ok(quant::quantize(to.ty(), &f, t.ne()[0] as usize))
}

/// Where each layer weight goes in the device's slots, built weight by weight.
#[derive(Default)]
pub(super) struct SlotPlan {
    pub(super) layers: BTreeMap<u32, Layer>,
    /// Bytes of each layer's weights pair slot.
    pub(super) sizes: BTreeMap<u32, usize>,
    /// Bytes of each layer's plain slot (weights a non-matmul op reads).
    pub(super) plain_sizes: BTreeMap<u32, usize>,
    /// Types the device's matmul refuses: how many weights, and the first one's name.
    pub(super) refused: BTreeMap<String, (usize, String)>,
    /// (from, to) type conversions made for the device, counted.
    pub(super) converted_types: BTreeMap<(String, String), usize>,
}

/// What the weights are placed against: the graph and its expert table, the device, its
/// buffer type, the prefill settings, and whether experts are read from the file (streamed).
pub(super) struct Placing<'a> {
    pub(super) capture: &'a Capture,
    pub(super) table: &'a WeightTable,
    pub(super) device: Device,
    /// The device's buffer type the slots are allocated in.
    pub(super) buft: BufferType,
    pub(super) opts: &'a PrefillOptions,
    /// Experts are read from the file (streamed), not copied from the host.
    pub(super) streamed: bool,
}

/// A dense weight's device copy where the device's matmul refuses its type: (device layout, host
/// layout, the weight converted once at load to the device layout).
type Converted = (Layout, Layout, Arc<Vec<u8>>);

impl SlotPlan {
    /// Places every weight of the graph `at` names.
    pub(super) fn of(at: &Placing<'_>) -> Result<Self, DeviceError> {
        let mut plan = Self::default();
        for (name, &t) in &at.capture.weights {
            plan.add(at, name, t)?;
        }
        Ok(plan)
    }

    /// Places one weight of the graph (a layer's: others stay on the host): its slot, offset,
    /// and the type the device takes it in.
    fn add(&mut self, at: &Placing<'_>, name: &String, t: TensorPtr) -> Result<(), DeviceError> {
        let Some((il, _)) = layer_of(name) else {
            return Ok(());
        };
        let host = t.binding();
        if !host.is_host() {
            return Err(DeviceError::NotOnHost(format!("weight {name}")));
        }
        let expert = at.table.expert(il, t);
        let is_expert = expert.is_some();
        // Expert matrices stay in the weights pair: MUL_MAT_ID follows them to the device.
        let plain = !is_expert && at.capture.non_matmul.contains(name);
        let converted = match plain {
            true => None,
            false => self.device_copy(at, name, t, is_expert)?,
        };
        let off = if plain {
            self.plain_sizes.entry(il).or_default()
        } else {
            self.sizes.entry(il).or_default()
        };
        let layer = self.layers.entry(il).or_insert(Layer {
            dense: Vec::new(),
            experts: Vec::new(),
            routed: at.capture.routing.contains(&il),
        });
        if let Some(m) = expert {
            let file = match at.streamed {
                true => Some(m.parts()?.to_vec()),
                false => None,
            };
            layer.experts.push(ExpertWeight {
                t,
                off: *off,
                host,
                expert_bytes: m.expert_bytes,
                file,
            });
        } else {
            layer.dense.push(DenseWeight {
                t,
                off: *off,
                host,
                plain,
                converted: converted.clone(),
            });
        }
        // The slot holds the device copy: sized in its layout.
        *off += residency::device_bytes(t, at.buft, converted.as_ref().map(|c| c.0))?;
        Ok(())
    }

    /// A matrix the device's matmul refuses (asked with a probe op, not a list): a dense one is
    /// carried to the device in the nearest type it takes, counted; an expert matrix stays
    /// refused and is reported.
    fn device_copy(
        &mut self,
        at: &Placing<'_>,
        name: &str,
        t: TensorPtr,
        is_expert: bool,
    ) -> Result<Option<Converted>, DeviceError> {
        let refuse = &at.opts.gate().refuse_types;
        let type_name = crate::ffi::probe::type_name(t);
        let takes = !refuse.contains(&type_name)
            && crate::ffi::probe::device_takes_matmul(at.device, t, is_expert);
        let to = (!takes && !is_expert)
            .then(|| device_type(at.device, t, refuse))
            .flatten();
        match to {
            Some(to) => {
                let bytes = convert(t, t.binding(), to)?;
                *self
                    .converted_types
                    .entry((type_name, quant::type_name(to.ty())))
                    .or_default() += 1;
                Ok(Some((to, t.layout(), Arc::new(bytes))))
            }
            None if !takes => {
                let first = (0, name.to_string());
                self.refused.entry(type_name).or_insert(first).0 += 1;
                Ok(None)
            }
            None => Ok(None),
        }
    }
}
