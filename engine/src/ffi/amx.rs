//! Dense weights in ggml-cpu's AMX layout, as the resident load puts them: where this CPU variant
//! has the `AMX` extra buffer type, llama.cpp's loader (`use_extra_bufts`) walks the CPU's extra
//! buffer types in order, AMX first, and gives each weight to the first whose `supports_op`
//! takes the matmul the weight is used in; AMX takes `MUL_MAT` (never `MUL_MAT_ID`: experts go on
//! to `CPU_REPACK`) of Q4_0, Q4_1, Q8_0, K-quants, IQ4_XS and F16 matrices of suitable widths.
//! A streamed load keeps the file's layout, so without this its dense matmuls ran other kernels
//! than the resident load's and computed other bits on such a CPU.
//!
//! The same marker trick as the expert repack (`repack.rs`): a weight bound to a small buffer of
//! the AMX type gets its `extra` (the AMX tensor traits) from `init_tensor` and is converted by
//! that buffer's `set_tensor` into engine memory of the AMX layout's size, which is larger than
//! the file's. The AMX kernels read `data` afresh at compute time and check only the buffer type.
use std::sync::Arc;

use ggml_sys as sys;

use super::error::FfiError;
use super::quiet::Quiet;
use super::region::Region;
use super::registry::Device;
use super::repack::{extra_buft, Marker};
use super::tensor::TensorPtr;

/// The width of the activation batch llama.cpp's loader asks `supports_op` about.
const PROBE_ROWS: i64 = 512;

/// The AMX buffer type's marker, when this build and CPU variant have one.
pub struct DenseAmx {
    buft: sys::ggml_backend_buffer_type_t,
    marker: Arc<Marker>,
}

// SAFETY: the buffer type is a static of ggml-cpu (immutable, process lifetime); the marker's
// only state used after creation is its interface table, and its `set_tensor` writes the tensor
// passed in, never the buffer.
unsafe impl Send for DenseAmx {}
// SAFETY: as above.
unsafe impl Sync for DenseAmx {}

/// A plain 2-D header of `t` (type, shape, strides, name), bound nowhere.
fn header(t: TensorPtr) -> sys::ggml_tensor {
    // SAFETY: `ggml_tensor` is a plain C struct for which all-zero is a valid empty header.
    let mut h: sys::ggml_tensor = unsafe { std::mem::zeroed() };
    // SAFETY: reading the fixed-size name of a live tensor struct.
    h.name = unsafe { (*t.raw()).name };
    h.type_ = t.layout().ty();
    h.ne = t.ne();
    h.nb = t.nb();
    h
}

impl DenseAmx {
    /// The AMX marker; `None` where ggml-cpu has no AMX buffer type (not built, or the variant
    /// in use lacks AMX).
    pub fn new() -> Option<Self> {
        let buft = extra_buft(c"AMX")?;
        Some(Self {
            buft,
            marker: Arc::new(Marker::alloc(buft)?),
        })
    }

    /// The bytes of `t` in the AMX layout when the resident load would put `t` there (as the
    /// matrix of a `MUL_MAT` by an F32 batch, the question llama.cpp's loader asks); `None`
    /// where it stays in another layout.
    pub fn takes(&self, t: TensorPtr) -> Option<usize> {
        let ne = t.ne();
        if ne[2] != 1 || ne[3] != 1 {
            return None;
        }
        let cpu = Device::cpu()?;
        let mut w = header(t);
        w.buffer = self.marker.raw();
        // SAFETY: a plain C struct for which all-zero is a valid empty header.
        let mut b: sys::ggml_tensor = unsafe { std::mem::zeroed() };
        b.type_ = sys::GGML_TYPE_F32;
        b.ne = [ne[0], PROBE_ROWS, 1, 1];
        b.nb = [4, 4 * ne[0] as usize, 4 * (ne[0] * PROBE_ROWS) as usize, 0];
        b.nb[3] = b.nb[2];
        // SAFETY: as above.
        let mut op: sys::ggml_tensor = unsafe { std::mem::zeroed() };
        op.op = sys::GGML_OP_MUL_MAT;
        op.type_ = sys::GGML_TYPE_F32;
        op.ne = [ne[1], PROBE_ROWS, 1, 1];
        op.nb = [4, 4 * ne[1] as usize, 4 * (ne[1] * PROBE_ROWS) as usize, 0];
        op.nb[3] = op.nb[2];
        op.src[0] = &mut w;
        op.src[1] = &mut b;
        // SAFETY: headers on our stack, alive for the call; `supports_op` reads their shapes,
        // types and `src[0]`'s buffer type (the live marker), and allocates nothing.
        let yes = unsafe { sys::ggml_backend_dev_supports_op(cpu.raw(), &op) };
        // SAFETY: a live buffer type; `get_alloc_size` reads the header's type and shape.
        yes.then(|| unsafe { sys::ggml_backend_buft_get_alloc_size(self.buft, &w) })
    }

    /// Converts `t` (a weight [`Self::takes`]) from `src`, its bytes in the file's layout, into
    /// `dst` in the AMX layout and binds it there; `dst` must hold the AMX layout's bytes and
    /// outlive every compute on `t`.
    pub fn convert(
        &self,
        t: TensorPtr,
        src: &[u8],
        dst: &mut Region,
        _quiet: &mut Quiet<'_>,
    ) -> Result<(), FfiError> {
        // SAFETY: a live buffer type; `get_alloc_size` reads the tensor's type and shape.
        let need = unsafe { sys::ggml_backend_buft_get_alloc_size(self.buft, t.raw()) };
        if src.len() != t.nbytes() || dst.len() < need {
            return Err(FfiError::Argument(format!(
                "{}: converting {} bytes into {} for a tensor of {} ({need} in the AMX layout)",
                t.name(),
                src.len(),
                dst.len(),
                t.nbytes()
            )));
        }
        let m = self.marker.raw();
        // SAFETY: field writes on a live tensor struct while no graph computes (`_quiet`); the
        // marker's `init_tensor` only sets `extra` (AMX's static tensor traits); its `set_tensor`
        // packs `src` (exactly `nbytes`, checked; disjoint from `dst`: `&` vs `&mut`) into
        // `data`, which holds the AMX layout's bytes (checked).
        unsafe {
            (*t.raw()).buffer = m;
            (*t.raw()).data = dst.as_mut_slice().as_mut_ptr().cast();
            (*t.raw()).extra = std::ptr::null_mut();
            sys::ggml_backend_buffer_init_tensor(m, t.raw());
            sys::ggml_backend_tensor_set(t.raw(), src.as_ptr().cast(), 0, src.len());
        }
        Ok(())
    }
}
