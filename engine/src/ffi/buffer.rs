//! Device buffers and moving a weight tensor between buffers (the arena's primitives).
use std::ptr::NonNull;

use ggml_sys as sys;

use super::error::FfiError;
use super::registry::Device;
use super::tensor::{Layout, TensorPtr};

/// An owned backend buffer marked as holding weights (so the scheduler moves ops to it).
pub struct WeightsBuffer {
    raw: NonNull<sys::ggml_backend_buffer>,
}

// SAFETY: a backend buffer is used only under the arena's lock, between or inside graph computes
// on the thread running them.
unsafe impl Send for WeightsBuffer {}

impl Drop for WeightsBuffer {
    fn drop(&mut self) {
        // SAFETY: owned buffer freed once; no tensor is bound to it any more (the arena rebinds
        // every weight back to the host before it is dropped).
        unsafe { sys::ggml_backend_buffer_free(self.raw.as_ptr()) }
    }
}

/// A buffer type from the registry (process-global, never freed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferType(sys::ggml_backend_buffer_type_t);

// SAFETY: buffer types are immutable registry objects.
unsafe impl Send for BufferType {}
// SAFETY: as above.
unsafe impl Sync for BufferType {}

impl BufferType {
    /// A device's default buffer type.
    pub fn of_device(d: Device) -> BufferType {
        // SAFETY: registry device handles are process-global.
        BufferType(unsafe { sys::ggml_backend_dev_buffer_type(d.raw()) })
    }

    /// The CPU's buffer type (plain host memory).
    pub fn cpu() -> BufferType {
        // SAFETY: a process-global buffer type, never freed.
        BufferType(unsafe { sys::ggml_backend_cpu_buffer_type() })
    }

    /// A device's host buffer type: host memory the device addresses directly; `None` when it
    /// offers none.
    pub fn host_of(d: Device) -> Option<BufferType> {
        // SAFETY: registry device handles are process-global; NULL means "none".
        let b = unsafe { sys::ggml_backend_dev_host_buffer_type(d.raw()) };
        (!b.is_null()).then_some(BufferType(b))
    }

    /// True when `t` (or the tensor it views) lives in a buffer of this type.
    pub fn holds(&self, t: &sys::ggml_tensor) -> bool {
        let buf = if t.buffer.is_null() && !t.view_src.is_null() {
            // SAFETY: a non-null view source of a live node is a live tensor.
            unsafe { (*t.view_src).buffer }
        } else {
            t.buffer
        };
        // SAFETY: a non-null buffer of a live tensor is a live buffer.
        !buf.is_null() && unsafe { sys::ggml_backend_buffer_get_type(buf) } == self.0
    }

    /// Whether `d`'s backend computes on tensors in this buffer type (the scheduler then runs
    /// their ops there instead of copying them).
    pub fn computed_on_by(&self, d: Device) -> bool {
        // SAFETY: live registry device and buffer type; a pure query.
        unsafe { sys::ggml_backend_dev_supports_buft(d.raw(), self.0) }
    }

    /// ggml's name of the buffer type (`CUDA_Host`, `HTP0-HOST`, `CPU`).
    pub fn name(&self) -> String {
        // SAFETY: a live buffer type; ggml returns a NUL-terminated name it owns.
        let p = unsafe { sys::ggml_backend_buft_name(self.0) };
        if p.is_null() {
            return String::new();
        }
        // SAFETY: non-null, NUL-terminated, valid for the process.
        unsafe { std::ffi::CStr::from_ptr(p) }
            .to_string_lossy()
            .into_owned()
    }

    /// The raw handle.
    pub fn raw(&self) -> sys::ggml_backend_buffer_type_t {
        self.0
    }

    /// Bytes `t` needs in this buffer type (alignment padding included).
    pub fn alloc_size(&self, t: TensorPtr) -> usize {
        // SAFETY: read-only queries on a live buffer type and tensor.
        let (n, a) = unsafe {
            (
                sys::ggml_backend_buft_get_alloc_size(self.0, t.raw()),
                sys::ggml_backend_buft_get_alignment(self.0),
            )
        };
        n.next_multiple_of(a.max(1))
    }

    /// Bytes a tensor of `t`'s shape in `layout`'s type needs in this buffer type, asked of a
    /// header-only copy so `t` itself is not touched.
    pub fn alloc_size_as(&self, t: TensorPtr, layout: Layout) -> Result<usize, FfiError> {
        // SAFETY: plain size query.
        let overhead = unsafe { sys::ggml_tensor_overhead() };
        let params = sys::ggml_init_params {
            mem_size: 2 * overhead,
            mem_buffer: std::ptr::null_mut(),
            no_alloc: true,
        };
        // SAFETY: ggml_init allocates its own arena; NULL means failure. The context holds one
        // header and no data, and is freed before returning; the header is read only in between.
        unsafe {
            let ctx = sys::ggml_init(params);
            if ctx.is_null() {
                return Err(FfiError::Ggml(
                    "ggml could not create a sizing context".into(),
                ));
            }
            let ne = t.ne();
            let h = sys::ggml_new_tensor(ctx, layout.ty(), 4, ne.as_ptr());
            let r = if h.is_null() {
                Err(FfiError::Ggml(format!(
                    "{}: no header in the new type",
                    t.name()
                )))
            } else {
                let n = sys::ggml_backend_buft_get_alloc_size(self.0, h);
                let a = sys::ggml_backend_buft_get_alignment(self.0);
                Ok(n.next_multiple_of(a.max(1)))
            };
            sys::ggml_free(ctx);
            r
        }
    }
}

impl WeightsBuffer {
    /// Allocates `size` bytes in `buft`, usage WEIGHTS.
    pub fn alloc(buft: BufferType, size: usize) -> Result<Self, FfiError> {
        Self::alloc_with(buft, size, true)
    }

    /// Allocates `size` bytes in `buft` left as plain device memory (not marked as weights), for
    /// weights that ops other than matmuls read, and for a context's moved KV cache.
    pub fn alloc_plain(buft: BufferType, size: usize) -> Result<Self, FfiError> {
        Self::alloc_with(buft, size, false)
    }

    fn alloc_with(buft: BufferType, size: usize, weights: bool) -> Result<Self, FfiError> {
        // SAFETY: allocation on a live buffer type; NULL means failure.
        let raw = unsafe { sys::ggml_backend_buft_alloc_buffer(buft.0, size.max(1)) };
        let raw = NonNull::new(raw).ok_or(FfiError::Alloc { bytes: size })?;
        if weights {
            // SAFETY: live buffer we own.
            unsafe {
                sys::ggml_backend_buffer_set_usage(
                    raw.as_ptr(),
                    sys::GGML_BACKEND_BUFFER_USAGE_WEIGHTS,
                )
            };
        }
        Ok(Self { raw })
    }

    /// The raw handle, for the other FFI wrappers.
    pub(super) fn raw(&self) -> sys::ggml_backend_buffer_t {
        self.raw.as_ptr()
    }

    /// The buffer's size in bytes.
    pub fn size(&self) -> usize {
        // SAFETY: read-only query on a live buffer.
        unsafe { sys::ggml_backend_buffer_get_size(self.raw.as_ptr()) }
    }

    /// The buffer's base address (device address space).
    pub fn base(&self) -> usize {
        // SAFETY: read-only query on a live buffer.
        unsafe { sys::ggml_backend_buffer_get_base(self.raw.as_ptr()) as usize }
    }

    /// Points `t` at `offset` inside this buffer (buffer, data and extra are replaced); `Err` when
    /// `t` in its current layout does not fit there.
    pub fn bind(
        &self,
        t: TensorPtr,
        offset: usize,
        quiet: &mut super::quiet::Quiet<'_>,
    ) -> Result<(), FfiError> {
        // SAFETY: pure query of a live buffer type about a live tensor's shape and type.
        let need = unsafe {
            sys::ggml_backend_buft_get_alloc_size(
                sys::ggml_backend_buffer_get_type(self.raw.as_ptr()),
                t.raw(),
            )
        };
        if offset.checked_add(need).is_none_or(|end| end > self.size()) {
            return Err(FfiError::Argument(format!(
                "{}: {need} bytes at offset {offset} do not fit a buffer of {}",
                t.name(),
                self.size()
            )));
        }
        t.detach(quiet);
        // SAFETY: the tensor has no buffer now, `offset + need` lies within the buffer (checked
        // above), and no graph computes (`Quiet`).
        let st = unsafe {
            sys::ggml_backend_tensor_alloc(
                self.raw.as_ptr(),
                t.raw(),
                (self.base() + offset) as *mut _,
            )
        };
        if st != sys::GGML_STATUS_SUCCESS {
            return Err(FfiError::Bind {
                tensor: t.name().to_string(),
                status: st,
            });
        }
        Ok(())
    }
}
