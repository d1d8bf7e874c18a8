//! Streamed experts in the CPU's repacked layout: a weight tagged with ggml-cpu's `CPU_REPACK`
//! buffer type (and the repack `extra` ggml chose for it) runs the repacked `MUL_MAT_ID` kernel,
//! which reads expert `e` at `data + e * nb[2]` in the repacked layout of that expert's rows
//! alone; so each expert slice is repacked on its own, straight into the slot the graph reads.
//!
//! The buffer type is found through the CPU registry's `ggml_backend_dev_get_extra_bufts`, as
//! llama.cpp's loader finds it; one small buffer of that type serves as the marker every tagged
//! tensor points at (its `init_tensor` sets `extra`, its `set_tensor` repacks). No llama.cpp
//! patch: the marker's `set_tensor` checks only the offset and the size, never that `data` lies
//! in the buffer, and the CPU backend reads `data` afresh at compute time.
use std::ffi::CStr;
use std::ptr::NonNull;
use std::sync::Arc;

use ggml_sys as sys;

use super::error::FfiError;
use super::quiet::Quiet;
use super::registry::Device;
use super::tensor::TensorPtr;

/// The name of ggml-cpu's repacking extra buffer type.
const REPACK_BUFT: &CStr = c"CPU_REPACK";

/// Bytes of the marker buffer: never written (tensors tagged with it keep their own `data`), but
/// a zero-sized buffer would get no `init_tensor` or `set_tensor` at all.
const MARKER_BYTES: usize = 64;

/// The owned marker buffer.
pub(super) struct Marker(NonNull<sys::ggml_backend_buffer>);

impl Marker {
    /// A marker buffer of `buft`, marked as weights (as llama.cpp marks its own, so that the
    /// scheduler and the engine's capture treat tensors bound to it as weights).
    pub(super) fn alloc(buft: sys::ggml_backend_buffer_type_t) -> Option<Self> {
        // SAFETY: a live buffer type; NULL means the allocation failed.
        let b = unsafe { sys::ggml_backend_buft_alloc_buffer(buft, MARKER_BYTES) };
        let b = NonNull::new(b)?;
        // SAFETY: our own live buffer.
        unsafe {
            sys::ggml_backend_buffer_set_usage(b.as_ptr(), sys::GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
        };
        Some(Self(b))
    }

    /// The raw buffer.
    pub(super) fn raw(&self) -> sys::ggml_backend_buffer_t {
        self.0.as_ptr()
    }
}

// SAFETY: the buffer's only state used after creation is its interface table (immutable); its
// `set_tensor` writes the tensor passed in, never the buffer.
unsafe impl Send for Marker {}
// SAFETY: as above.
unsafe impl Sync for Marker {}

impl Drop for Marker {
    fn drop(&mut self) {
        // SAFETY: owned buffer freed once, after every `ExpertRepack` and every tensor tag that
        // holds it (the tags are undone first by `CpuRepack`'s owner, see `untag`).
        unsafe { sys::ggml_backend_buffer_free(self.0.as_ptr()) }
    }
}

/// The CPU's repacked layout, when this build and CPU have one.
pub struct CpuRepack {
    marker: Arc<Marker>,
}

/// How the expert slices of one tagged 3-D weight are repacked: one expert's 2-D shape and the
/// repack ggml chose for the weight (its `extra`).
#[derive(Clone)]
pub struct ExpertRepack {
    marker: Arc<Marker>,
    ty: sys::ggml_type,
    ne: [i64; 2],
    nb: [usize; 2],
    extra: *mut std::ffi::c_void,
    name: [std::ffi::c_char; 64],
}

impl std::fmt::Debug for ExpertRepack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExpertRepack")
            .field("ty", &self.ty)
            .field("ne", &self.ne)
            .finish()
    }
}

// SAFETY: `extra` points at one of ggml-cpu's static repack trait objects (immutable, process
// lifetime); the marker is shared as above.
unsafe impl Send for ExpertRepack {}
// SAFETY: as above.
unsafe impl Sync for ExpertRepack {}

/// ggml-cpu's extra buffer type named `CPU_REPACK`, from the CPU registry's list.
fn repack_buft() -> Option<sys::ggml_backend_buffer_type_t> {
    extra_buft(REPACK_BUFT)
}

/// ggml-cpu's extra buffer type named `name` (`CPU_REPACK`, `AMX`), from the CPU registry's
/// list, which llama.cpp's loader walks in order.
pub(super) fn extra_buft(name: &CStr) -> Option<sys::ggml_backend_buffer_type_t> {
    let cpu = Device::cpu()?;
    // SAFETY: a live registry device; its registry is process-global.
    let reg = unsafe { sys::ggml_backend_dev_backend_reg(cpu.raw()) };
    if reg.is_null() {
        return None;
    }
    // SAFETY: `reg` is live; the name is NUL-terminated; NULL when absent.
    let f = unsafe {
        sys::ggml_backend_reg_get_proc_address(reg, c"ggml_backend_dev_get_extra_bufts".as_ptr())
    };
    if f.is_null() {
        return None;
    }
    // SAFETY: ggml-cpu registers this name as `ggml_backend_dev_get_extra_bufts_t`.
    let get: sys::ggml_backend_dev_get_extra_bufts_t = unsafe { std::mem::transmute(f) };
    // SAFETY: returns a static NULL-terminated array of buffer types.
    let mut p = unsafe { get?(cpu.raw()) };
    // SAFETY: walks the array up to its NULL terminator; each entry is a live buffer type whose
    // name is a static NUL-terminated string.
    unsafe {
        while !p.is_null() && !(*p).is_null() {
            let n = sys::ggml_backend_buft_name(*p);
            if !n.is_null() && CStr::from_ptr(n) == name {
                return Some(*p);
            }
            p = p.add(1);
        }
    }
    None
}

/// Whether this build's CPU backend offers llama.cpp's repacked layouts (the `CPU_REPACK`
/// buffer type), which `repack = "auto"` uses for the types it has kernels for on this CPU.
pub fn cpu_repack_available() -> bool {
    repack_buft().is_some()
}

/// A header-only 2-D tensor of one expert of `t` (type, shape, strides, name), bound nowhere.
fn expert_header(t: TensorPtr) -> sys::ggml_tensor {
    let (ne, nb) = (t.ne(), t.nb());
    // SAFETY: `ggml_tensor` is a plain C struct for which all-zero is a valid empty header.
    let mut h: sys::ggml_tensor = unsafe { std::mem::zeroed() };
    // SAFETY: reading the fixed-size name of a live tensor struct.
    h.name = unsafe { (*t.raw()).name };
    h.type_ = t.layout().ty();
    h.ne = [ne[0], ne[1], 1, 1];
    h.nb = [nb[0], nb[1], nb[2], nb[2]];
    h
}

impl CpuRepack {
    /// The marker buffer of the CPU's repacked layout; `None` where ggml-cpu has none.
    pub fn new() -> Option<Self> {
        Some(Self {
            marker: Arc::new(Marker::alloc(repack_buft()?)?),
        })
    }

    /// Whether ggml would choose a repacked layout for the 2-D weight `t` on this CPU (its type,
    /// its shape), asked of a header copy: `t` itself is left untouched.
    pub fn chooses(&self, t: TensorPtr) -> bool {
        let (ne, nb) = (t.ne(), t.nb());
        if ne[2] != 1 || ne[3] != 1 || ne[0] % 8 != 0 {
            return false;
        }
        let mut h = expert_header(t);
        h.nb = [nb[0], nb[1], nb[2], nb[3]];
        h.buffer = self.marker.0.as_ptr();
        // SAFETY: a header on our stack bound to the live marker buffer; `init_tensor` only sets
        // `extra` from the header's type and shape.
        unsafe { sys::ggml_backend_buffer_init_tensor(h.buffer, &mut h) };
        !h.extra.is_null()
    }

    /// Tags the 3-D expert weight `t` for the repacked `MUL_MAT_ID` when ggml chooses a repack
    /// for it (the choice the resident load makes: `init_tensor` sets a non-null `extra`) and
    /// one expert alone gets the same; else leaves it untouched (`None`: the file's layout).
    /// From then on `t`'s bytes must be repacked expert by expert (`ExpertRepack::repack`).
    pub fn tag(&self, t: TensorPtr, quiet: &mut Quiet<'_>) -> Option<ExpertRepack> {
        let (ne, nb) = (t.ne(), t.nb());
        // A repack over rows that are not whole 8-wide groups of blocks fails inside
        // `set_tensor`, which aborts: such a tensor stays in the file's layout, as does one whose
        // experts are not each a contiguous run of rows.
        if ne[3] != 1 || ne[0] % 8 != 0 || nb[2] != nb[1] * ne[1] as usize {
            return None;
        }
        let before = t.binding();
        let m = self.marker.0.as_ptr();
        // SAFETY: field writes on a live tensor struct while no graph computes (`quiet`); the
        // marker's `init_tensor` only sets `extra` from the tensor's type and shape.
        let extra = unsafe {
            (*t.raw()).buffer = m;
            (*t.raw()).extra = std::ptr::null_mut();
            sys::ggml_backend_buffer_init_tensor(m, t.raw());
            (*t.raw()).extra
        };
        let mut one = expert_header(t);
        one.buffer = m;
        // SAFETY: a header on our stack with the marker buffer, as above.
        unsafe { sys::ggml_backend_buffer_init_tensor(m, &mut one) };
        if extra.is_null() || one.extra != extra {
            let _ = t.restore(before, quiet);
            return None;
        }
        Some(ExpertRepack {
            marker: self.marker.clone(),
            ty: one.type_,
            ne: [one.ne[0], one.ne[1]],
            nb: [one.nb[0], one.nb[1]],
            extra,
            name: one.name,
        })
    }
}

impl ExpertRepack {
    /// Bytes of one expert.
    pub fn expert_bytes(&self) -> usize {
        self.nb[1] * self.ne[1] as usize
    }

    /// Writes `src`, one expert in the file's layout, into `dst` in the repacked layout (the
    /// same size). `dst` must not overlap `src`: the repack reads later rows after writing.
    pub fn repack(&self, src: &[u8], dst: &mut [u8]) -> Result<(), FfiError> {
        let n = self.expert_bytes();
        if src.len() != n || dst.len() != n {
            return Err(FfiError::Argument(format!(
                "repacking an expert of {n} bytes from {} into {} bytes",
                src.len(),
                dst.len()
            )));
        }
        // SAFETY: a plain C struct for which all-zero is a valid empty header.
        let mut h: sys::ggml_tensor = unsafe { std::mem::zeroed() };
        h.type_ = self.ty;
        h.ne = [self.ne[0], self.ne[1], 1, 1];
        h.nb = [self.nb[0], self.nb[1], n, n];
        h.name = self.name;
        h.buffer = self.marker.0.as_ptr();
        h.extra = self.extra;
        h.data = dst.as_mut_ptr().cast();
        // SAFETY: the header describes exactly `n` bytes at `dst` (checked), bound to the
        // marker, whose `set_tensor` repacks `src` (`n` bytes, checked; disjoint: `&` vs
        // `&mut`) into `data` with the repack `extra` names, chosen by `tag` for this shape.
        unsafe { sys::ggml_backend_tensor_set(&mut h, src.as_ptr().cast(), 0, n) };
        Ok(())
    }
}
