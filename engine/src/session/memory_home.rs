//! Moving a session's KV cache and recurrent state into the prefill device's host buffer type
//! when the session opens (the specification's "once, at load": llama.cpp creates the memory with
//! the context, so each context's is moved once).
//!
//! llama.cpp names no memory tensor through its API, so one token runs through the new context
//! with the hook only collecting the tensors the graph reads (`cache_k_l0`, ...); the streamer and
//! the arena sit that decode out, and its result is thrown away with a memory clear.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use ggml_sys as sys;

use crate::device::DeviceError;
use crate::error::{EngineError, Result};
use crate::ffi::batch::Batch;
use crate::ffi::buffer::BufferType;
use crate::ffi::context::LlamaContext;
use crate::ffi::kv::{memory_tensor, MovedMemory};
use crate::ffi::tensor::{src, TensorPtr};
use crate::model::Model;

/// Where a session's KV cache and recurrent state went (`Session::moved_memory`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MovedMemoryInfo {
    /// Memory tensors moved (K and V per attention layer, R and S per recurrent one).
    pub tensors: usize,
    /// Bytes of the buffer they moved into.
    pub bytes: usize,
    /// Bytes of the whole pages of llama.cpp's own buffers, which nothing reads after the move.
    pub old_bytes: usize,
    /// Of those, the bytes still resident (0 once released).
    pub old_resident_bytes: usize,
}

impl MovedMemoryInfo {
    pub(crate) fn of(m: &MovedMemory) -> Self {
        Self {
            tensors: m.tensors(),
            bytes: m.bytes(),
            old_bytes: m.old_page_bytes(),
            old_resident_bytes: m.old_resident_bytes(),
        }
    }
}

/// The hook's side of the move: while `on`, every memory tensor a node reads is collected.
#[derive(Default)]
pub(crate) struct MemoryCapture {
    on: AtomicBool,
    found: Mutex<Vec<TensorPtr>>,
}

impl MemoryCapture {
    /// Whether a capture decode runs (the hook then asks for nothing else).
    pub(crate) fn capturing(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Collects the memory tensors `t` is or reads.
    pub(crate) fn collect(&self, t: &sys::ggml_tensor) {
        let Ok(mut found) = self.found.lock() else {
            return;
        };
        let srcs = (0..sys::GGML_MAX_SRC).filter_map(|i| src(t, i));
        for m in std::iter::once(t).chain(srcs).filter_map(memory_tensor) {
            if !found.contains(&m) {
                found.push(m);
            }
        }
    }
}

/// Runs the capture decode on `ctx` (a fresh context of `model`), moves what it found into
/// `buft`, empties the memory, and makes the next decode build its graphs anew (the old ones
/// address the old buffers).
pub(crate) fn move_memory(
    model: &Model,
    ctx: &mut LlamaContext<'_>,
    capture: &MemoryCapture,
    buft: BufferType,
) -> Result<MovedMemory> {
    let mut exec = model.raw.exec().lock();
    let mut b = Batch::new(1);
    b.push(0, 0, false);
    capture.on.store(true, Ordering::Relaxed);
    let ran = ctx.decode(&b, &mut exec);
    capture.on.store(false, Ordering::Relaxed);
    ran.map_err(EngineError::Decode)?;
    ctx.clear_memory()?;
    let failed = |why: String| {
        EngineError::Device(DeviceError::MemoryMove {
            buft: buft.name(),
            why,
        })
    };
    let found = std::mem::take(
        &mut *capture
            .found
            .lock()
            .map_err(|_| EngineError::HookPoisoned)?,
    );
    if found.is_empty() {
        return Err(failed(
            "the graph reads no memory tensor this engine recognises (cache_k_l<il>, ...)".into(),
        ));
    }
    let moved = MovedMemory::move_into(buft, &found, &mut exec.quiet())
        .map_err(|e| failed(e.to_string()))?;
    ctx.reserve_at_next_decode();
    Ok(moved)
}
