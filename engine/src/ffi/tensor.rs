//! Weight tensors seen through the graph: their identity, layout, and the one write the engine
//! makes to them (rebinding `data`).
use std::ffi::CStr;

use ggml_sys as sys;

/// A model weight tensor found by the capture pass; valid as long as its model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TensorPtr(*mut sys::ggml_tensor);

// SAFETY: weight tensor structs live in the model's ggml context for the model's lifetime; the
// engine mutates them only between graph computes, under the model's execution lock.
unsafe impl Send for TensorPtr {}
// SAFETY: as above.
unsafe impl Sync for TensorPtr {}

/// A tensor's name.
pub fn name(t: &sys::ggml_tensor) -> &str {
    // SAFETY: ggml keeps `name` NUL-terminated within its 64 bytes.
    unsafe { CStr::from_ptr(t.name.as_ptr()) }
        .to_str()
        .unwrap_or("")
}

/// The `i`th source of a node, if any.
pub fn src(t: &sys::ggml_tensor, i: usize) -> Option<&sys::ggml_tensor> {
    let p = *t.src.get(i)?;
    // SAFETY: non-null sources of a live graph node are live tensors.
    (!p.is_null()).then(|| unsafe { &*p })
}

/// True when `t` lives in a weights buffer (a model weight, not an activation).
pub fn is_weight(t: &sys::ggml_tensor) -> bool {
    // SAFETY: a non-null buffer of a live tensor is a live buffer.
    !t.buffer.is_null()
        && unsafe { sys::ggml_backend_buffer_get_usage(t.buffer) }
            == sys::GGML_BACKEND_BUFFER_USAGE_WEIGHTS
}

/// True when `t` (or the tensor it views) lives in a buffer of type `buft`.
pub fn on_buft(t: &sys::ggml_tensor, buft: super::buffer::BufferType) -> bool {
    let buf = if t.buffer.is_null() && !t.view_src.is_null() {
        // SAFETY: a non-null view source of a live node is a live tensor.
        unsafe { (*t.view_src).buffer }
    } else {
        t.buffer
    };
    // SAFETY: a non-null buffer of a live tensor is a live buffer.
    !buf.is_null() && unsafe { sys::ggml_backend_buffer_get_type(buf) } == buft.raw()
}

/// Reads the I32 ids of a routing node `[n_used, n_tokens]`, honouring its strides (it is a
/// non-contiguous view of the argsort). `None` when the tensor is not host-readable I32.
pub fn read_ids(t: &sys::ggml_tensor) -> Option<Vec<i32>> {
    if t.type_ != sys::GGML_TYPE_I32 || t.data.is_null() || t.buffer.is_null() {
        return None;
    }
    // SAFETY: checked non-null buffer of a live tensor.
    if !unsafe { sys::ggml_backend_buffer_is_host(t.buffer) } {
        return None;
    }
    let (n0, n1) = (t.ne[0] as usize, t.ne[1] as usize);
    let (nb0, nb1) = (t.nb[0], t.nb[1]);
    let mut out = Vec::with_capacity(n0 * n1);
    for j in 0..n1 {
        for i in 0..n0 {
            // SAFETY: (i, j) is inside the view's extent, so `data + j*nb1 + i*nb0` is inside the
            // computed argsort buffer; host memory, computed before the observe callback runs.
            out.push(unsafe { *(t.data as *const u8).add(j * nb1 + i * nb0).cast::<i32>() });
        }
    }
    Some(out)
}

/// Where a tensor's bytes live: its buffer, data address and backend extra.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Binding {
    buffer: sys::ggml_backend_buffer_t,
    data: *mut std::ffi::c_void,
    extra: *mut std::ffi::c_void,
}

// SAFETY: plain addresses of model-lifetime objects, used under the arena's lock.
unsafe impl Send for Binding {}

impl Binding {
    /// True when the bytes are in host memory.
    pub fn is_host(&self) -> bool {
        // SAFETY: a non-null buffer of a live tensor is a live buffer.
        !self.buffer.is_null() && unsafe { sys::ggml_backend_buffer_is_host(self.buffer) }
    }

    /// The `len` host bytes at this binding; `None` unless `is_host`.
    pub fn host_bytes(&self, len: usize) -> Option<&[u8]> {
        // SAFETY: host buffers of model weights are readable for `len` = the tensor's nbytes at
        // `data` for the model's lifetime (the mapping or engine memory).
        self.is_host()
            .then(|| unsafe { std::slice::from_raw_parts(self.data as *const u8, len) })
    }
}

impl TensorPtr {
    /// The raw pointer, for the other FFI wrappers.
    pub fn raw(&self) -> *mut sys::ggml_tensor {
        self.0
    }

    /// The tensor's buffer.
    pub fn buffer(&self) -> sys::ggml_backend_buffer_t {
        self.get().buffer
    }

    /// Where the tensor lives now.
    pub fn binding(&self) -> Binding {
        let t = self.get();
        Binding {
            buffer: t.buffer,
            data: t.data,
            extra: t.extra,
        }
    }

    /// Puts the tensor back where `b` says. Call only between graph computes.
    pub fn restore(&self, b: Binding) {
        // SAFETY: field writes on a live tensor struct while no graph runs; `b` was read from
        // this tensor earlier and its buffer still exists (the model's or the engine's).
        unsafe {
            (*self.0).buffer = b.buffer;
            (*self.0).data = b.data;
            (*self.0).extra = b.extra;
        }
    }

    /// Clears buffer, data and extra (before `ggml_backend_tensor_alloc`).
    pub fn detach(&self) {
        // SAFETY: as `restore`.
        unsafe {
            (*self.0).buffer = std::ptr::null_mut();
            (*self.0).data = std::ptr::null_mut();
            (*self.0).extra = std::ptr::null_mut();
        }
    }

    /// Copies `src` (exactly `nbytes()`) into the tensor wherever it lives.
    pub fn upload(&self, src: &[u8]) {
        assert_eq!(src.len(), self.nbytes(), "upload size");
        // SAFETY: the tensor is bound to a live buffer and `src` holds nbytes bytes; this is a
        // synchronous copy done between graph computes or at a synchronised callback point.
        unsafe { sys::ggml_backend_tensor_set(self.0, src.as_ptr().cast(), 0, src.len()) }
    }

    /// Wraps a weight seen in the graph.
    pub fn from_graph(t: &sys::ggml_tensor) -> Self {
        TensorPtr(t as *const _ as *mut _)
    }

    fn get(&self) -> &sys::ggml_tensor {
        // SAFETY: see the type's Send/Sync note: the struct outlives every TensorPtr use.
        unsafe { &*self.0 }
    }

    /// The name.
    pub fn name(&self) -> String {
        name(self.get()).to_string()
    }

    /// Dimensions.
    pub fn ne(&self) -> [i64; 4] {
        self.get().ne
    }

    /// Strides in bytes.
    pub fn nb(&self) -> [usize; 4] {
        self.get().nb
    }

    /// Total bytes.
    pub fn nbytes(&self) -> usize {
        // SAFETY: pure function of the tensor's shape and type.
        unsafe { sys::ggml_nbytes(self.0) }
    }

    /// The current data address.
    pub fn data(&self) -> *mut u8 {
        self.get().data.cast()
    }

    /// The tensor's bytes where they are now (host memory: the mapping or an engine region).
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: weights of a CPU model are host memory of `nbytes()` bytes at `data`, readable
        // for the model's lifetime (mapped file or engine region).
        unsafe { std::slice::from_raw_parts(self.data(), self.nbytes()) }
    }

    /// Points the tensor at `data`, which must hold `nbytes()` bytes in the tensor's layout for as
    /// long as the tensor is computed on. Call only between graph computes.
    pub fn rebind(&self, data: *mut u8) {
        // SAFETY: writing the `data` field of a live tensor struct; the engine calls this only
        // while no graph runs (load time or under the execution lock between decodes), and the
        // CPU backend reads `data` afresh at compute time.
        unsafe { (*self.0).data = data.cast() };
    }
}
