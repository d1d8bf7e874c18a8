//! The two-layer arena: before a wide prefill graph every layer weight is rebound onto slot
//! (layer mod 2) of device memory marked as weights, so the scheduler moves the layer's ops to the
//! device; the slot of layer k+2 is filled when the last node of layer k has run (pacing), and
//! after the graph every weight goes back to the host.
use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use crate::ffi::buffer::{BufferType, WeightsBuffer};
use crate::ffi::registry::Device;
use crate::ffi::tensor::{Binding, TensorPtr};
use crate::hook::{layer_of, Capture};
use crate::telemetry::PrefillDevCounters;

struct LayerWeights {
    /// (tensor, offset in its slot, host binding).
    tensors: Vec<(TensorPtr, usize, Binding)>,
}

/// The arena of one model on one device.
pub struct Arena {
    slots: [WeightsBuffer; 2],
    layers: BTreeMap<u32, LayerWeights>,
    /// Last node name of each layer (the pacing points).
    last_node: HashMap<String, u32>,
    buft: BufferType,
    active: bool,
    /// The layer whose last node the graph must reach next.
    expect: u32,
    n_layer: u32,
    /// Cumulative counters.
    pub counters: PrefillDevCounters,
}

impl Arena {
    /// Lays out every layer's weights in two slots of `device`'s memory.
    pub fn new(capture: &Capture, device: Device) -> Result<Self, String> {
        let buft = BufferType::of_device(device);
        let mut layers: BTreeMap<u32, LayerWeights> = BTreeMap::new();
        let mut sizes: BTreeMap<u32, usize> = BTreeMap::new();
        for (name, &t) in &capture.weights {
            let Some((il, _)) = layer_of(name) else {
                continue;
            };
            let b = t.binding();
            if !b.is_host() {
                return Err(format!("weight {name} is not in host memory"));
            }
            let off = sizes.entry(il).or_default();
            layers
                .entry(il)
                .or_insert(LayerWeights {
                    tensors: Vec::new(),
                })
                .tensors
                .push((t, *off, b));
            *off += buft.alloc_size(t);
        }
        let slot_size = sizes.values().copied().max().unwrap_or(0);
        let n_layer = layers.keys().next_back().map(|l| l + 1).unwrap_or(0);
        let last_node = capture
            .last_node
            .iter()
            .filter(|(il, _)| layers.contains_key(il))
            .map(|(il, n)| (n.clone(), *il))
            .collect();
        Ok(Self {
            slots: [
                WeightsBuffer::alloc(buft, slot_size)?,
                WeightsBuffer::alloc(buft, slot_size)?,
            ],
            layers,
            last_node,
            buft,
            active: false,
            expect: 0,
            n_layer,
            counters: PrefillDevCounters::default(),
        })
    }

    /// The device's buffer type (to count the nodes it computes).
    pub fn buft(&self) -> BufferType {
        self.buft
    }

    /// True while a wide graph is bound to the arena.
    pub fn active(&self) -> bool {
        self.active
    }

    /// The layer whose last node `name` is, when it is a pacing point.
    pub fn pacing_layer(&self, name: &str) -> Option<u32> {
        self.last_node.get(name).copied()
    }

    fn load(&mut self, il: u32) -> Result<(), String> {
        let t0 = Instant::now();
        let Some(layer) = self.layers.get(&il) else {
            return Ok(());
        };
        let slot = &self.slots[(il % 2) as usize];
        for (t, off, host) in &layer.tensors {
            slot.bind(*t, *off)?;
            let n = t.nbytes();
            let src = host
                .host_bytes(n)
                .ok_or_else(|| format!("{}: host bytes unavailable", t.name()))?;
            t.upload(src);
            self.counters.read_bytes += n as u64;
        }
        self.counters.stall_s += t0.elapsed().as_secs_f64();
        Ok(())
    }

    /// Binds the arena for a wide graph of `tokens` tokens: layers 0 and 1 are filled now, every
    /// other layer waits for its pacing point.
    pub fn begin(&mut self, tokens: u64) -> Result<(), String> {
        // Every weight points into its slot from the start, so the whole graph is scheduled onto
        // the device; what the slots hold follows the pacing.
        for (il, layer) in &self.layers {
            for (t, off, _) in &layer.tensors {
                self.slots[(il % 2) as usize].bind(*t, *off)?;
            }
        }
        self.active = true;
        self.expect = 0;
        self.load(0)?;
        self.load(1)?;
        self.counters.tokens += tokens;
        Ok(())
    }

    /// At the last node of layer `il`: its slot is free, fill it with layer `il + 2`. A pacing
    /// point out of order is an error: the graph would compute on a slot that did not fill.
    pub fn on_layer_done(&mut self, il: u32) -> Result<(), String> {
        if il != self.expect {
            return Err(format!(
                "the device graph reached the end of layer {il} before layer {}: a pacing point was skipped",
                self.expect
            ));
        }
        self.expect = il + 1;
        self.load(il + 2)
    }

    /// Puts every weight back on the host; an incomplete graph is an error.
    pub fn end(&mut self) -> Result<(), String> {
        for layer in self.layers.values() {
            for (t, _, host) in &layer.tensors {
                t.restore(*host);
            }
        }
        let was = self.active;
        self.active = false;
        if was && self.expect < self.n_layer {
            return Err(format!(
                "the device graph ended after layer {} of {}: a pacing point was skipped",
                self.expect, self.n_layer
            ));
        }
        Ok(())
    }
}
