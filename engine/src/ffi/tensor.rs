//! Weight tensors seen through the graph: their identity, layout, and the one write the engine
//! makes to them (rebinding `data`).
use std::ffi::CStr;

use super::error::FfiError;
use super::quiet::Quiet;
use ggml_sys as sys;

/// A model weight tensor found by the capture pass; valid as long as its model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TensorPtr(*mut sys::ggml_tensor);

// SAFETY: weight tensor structs live in the model's ggml context for the model's lifetime; every
// write to one takes a `Quiet`, which only the model's held execution lock lends, and decodes hold
// that lock too.
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

/// The tensor `t` views (ggml keeps the root, not a chain), or `t` itself.
pub fn view_root(t: &sys::ggml_tensor) -> &sys::ggml_tensor {
    if t.view_src.is_null() {
        t
    } else {
        // SAFETY: a non-null view source of a live tensor is a live tensor.
        unsafe { &*t.view_src }
    }
}

/// ggml's name of `t`'s op (`MUL_MAT`, ...; unary ops by their own name).
pub fn op_desc(t: &sys::ggml_tensor) -> &'static str {
    // SAFETY: `t` is a live tensor; ggml_op_desc returns a pointer into a static name table.
    let p = unsafe { sys::ggml_op_desc(t) };
    if p.is_null() {
        return "?";
    }
    // SAFETY: a NUL-terminated static string.
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_str()
        .unwrap_or("?")
}

/// Bytes of `t`'s data.
pub fn nbytes(t: &sys::ggml_tensor) -> usize {
    // SAFETY: `t` is a live tensor; ggml_nbytes only reads its shape and type.
    unsafe { sys::ggml_nbytes(t) }
}

/// True when `t` lives in a weights buffer (a model weight, not an activation).
pub fn is_weight(t: &sys::ggml_tensor) -> bool {
    // SAFETY: a non-null buffer of a live tensor is a live buffer.
    !t.buffer.is_null()
        && unsafe { sys::ggml_backend_buffer_get_usage(t.buffer) }
            == sys::GGML_BACKEND_BUFFER_USAGE_WEIGHTS
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
    // SAFETY: pure function of the node's shape and strides: the bytes from its first element to
    // its last.
    let extent = unsafe { sys::ggml_nbytes(t) };
    // SAFETY: host memory of the computed argsort buffer, `extent` bytes from the view's first
    // element (ggml's own extent of the view), computed before the observe callback runs.
    let raw = unsafe { std::slice::from_raw_parts(t.data as *const u8, extent) };
    decode_ids(t, raw)
}

/// How many first sources `router_input` follows from a routing node before giving up.
const ROUTER_DEPTH: usize = 16;

/// The input a routing node's router read: following `ffn_moe_topk`'s first sources down to the
/// matmul whose matrix is a weight (the router), that matmul's activation, as f32 rows of
/// `ne[0]` values (one per token), when it is a contiguous host F32 tensor. It is still live at
/// the routing node: the expert matmuls that follow read it too.
pub fn router_input(topk: &sys::ggml_tensor) -> Option<(usize, Vec<f32>)> {
    let mut t = topk;
    // Plain softmax routing puts 3 nodes between the top-k and the router's matmul; a selection
    // bias and top-k over expert groups (reshape, fill, set_rows, reshape, add, sigmoid) put 8.
    for _ in 0..ROUTER_DEPTH {
        if t.op == sys::GGML_OP_MUL_MAT && src(t, 0).is_some_and(|w| is_weight(view_root(w))) {
            let x = src(t, 1)?;
            if x.type_ != sys::GGML_TYPE_F32 || x.data.is_null() || x.buffer.is_null() {
                return None;
            }
            // SAFETY: checked non-null buffer of a live tensor.
            if !unsafe { sys::ggml_backend_buffer_is_host(x.buffer) || !sys::ggml_is_contiguous(x) }
            {
                return None;
            }
            // SAFETY: pure function of a live tensor's shape.
            let n = unsafe { sys::ggml_nelements(x) } as usize;
            // SAFETY: a contiguous host F32 tensor of `n` elements, computed earlier in this graph
            // and not yet overwritten (the expert matmuls after the routing node read it).
            let v = unsafe { std::slice::from_raw_parts(x.data as *const f32, n) };
            return Some((x.ne[0] as usize, v.to_vec()));
        }
        t = src(t, 0)?;
    }
    None
}

/// The I32 ids of a `[n_used, n_tokens]` view, read with its strides from `raw`, the bytes from
/// its first element to its last.
fn decode_ids(t: &sys::ggml_tensor, raw: &[u8]) -> Option<Vec<i32>> {
    let (n0, n1) = (t.ne[0] as usize, t.ne[1] as usize);
    let (nb0, nb1) = (t.nb[0], t.nb[1]);
    let mut out = Vec::with_capacity(n0 * n1);
    for j in 0..n1 {
        for i in 0..n0 {
            let at = j * nb1 + i * nb0;
            let b = raw.get(at..at + 4)?;
            out.push(i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
        }
    }
    Some(out)
}

/// Where a tensor's bytes live: its buffer, data address and backend extra, and how many bytes
/// it had there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Binding {
    buffer: sys::ggml_backend_buffer_t,
    data: *mut std::ffi::c_void,
    extra: *mut std::ffi::c_void,
    nbytes: usize,
}

// SAFETY: plain addresses of model-lifetime objects, used under the arena's lock.
unsafe impl Send for Binding {}

impl Binding {
    /// True when the bytes are in host memory.
    pub fn is_host(&self) -> bool {
        // SAFETY: a non-null buffer of a live tensor is a live buffer.
        !self.buffer.is_null() && unsafe { sys::ggml_backend_buffer_is_host(self.buffer) }
    }

    /// The host address of the bytes (meaningful when `is_host`).
    pub fn host_address(&self) -> usize {
        self.data as usize
    }

    /// The tensor's bytes at this binding; `None` unless `is_host`.
    pub fn host_bytes(&self) -> Option<&[u8]> {
        // SAFETY: `nbytes` is the tensor's size when the binding was read, and a host binding of a
        // model weight stays readable for that many bytes at `data` for the model's lifetime (the
        // file mapping, llama.cpp's buffer or an engine region, all dropped after the bindings'
        // users: see `Model`'s drop).
        self.is_host()
            .then(|| unsafe { std::slice::from_raw_parts(self.data as *const u8, self.nbytes) })
    }
}

/// A tensor's element type and strides: what changes when a weight is carried to a device in
/// another type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    ty: sys::ggml_type,
    nb: [usize; 4],
}

impl Layout {
    /// The contiguous layout of a tensor of shape `ne` in type `ty`.
    pub fn contiguous(ty: sys::ggml_type, ne: [i64; 4]) -> Layout {
        // SAFETY: pure lookups in ggml's type-traits table.
        let (ts, row) = unsafe { (sys::ggml_type_size(ty), sys::ggml_row_size(ty, ne[0])) };
        let nb1 = row;
        let nb2 = nb1 * ne[1] as usize;
        let nb3 = nb2 * ne[2] as usize;
        Layout {
            ty,
            nb: [ts, nb1, nb2, nb3],
        }
    }

    /// The element type.
    pub fn ty(&self) -> sys::ggml_type {
        self.ty
    }
}

impl TensorPtr {
    /// The current type and strides.
    pub fn layout(&self) -> Layout {
        let t = self.get();
        Layout {
            ty: t.type_,
            nb: t.nb,
        }
    }

    /// Sets type and strides: before the tensor is bound to a buffer sized for the new layout,
    /// and back before it returns to its host binding.
    pub fn set_layout(&self, l: Layout, _quiet: &mut Quiet<'_>) {
        // SAFETY: field writes on a live tensor struct while no graph computes (`Quiet`).
        unsafe {
            (*self.0).type_ = l.ty;
            (*self.0).nb = l.nb;
        }
    }

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
            nbytes: self.nbytes(),
        }
    }

    /// Puts the tensor back where `b` says; `Err` when `b` held fewer bytes than the tensor has
    /// now (a binding of another tensor, or read under another layout).
    pub fn restore(&self, b: Binding, _quiet: &mut Quiet<'_>) -> Result<(), FfiError> {
        if b.nbytes < self.nbytes() {
            return Err(FfiError::Argument(format!(
                "{}: restoring a binding of {} bytes onto a tensor of {}",
                self.name(),
                b.nbytes,
                self.nbytes()
            )));
        }
        // SAFETY: field writes on a live tensor struct while no graph computes (`Quiet`); `b`
        // holds the tensor's bytes (checked above) in a buffer that lives as long as the model.
        unsafe {
            (*self.0).buffer = b.buffer;
            (*self.0).data = b.data;
            (*self.0).extra = b.extra;
        }
        Ok(())
    }

    /// Clears buffer, data and extra (before `ggml_backend_tensor_alloc`).
    pub(super) fn detach(&self, _quiet: &mut Quiet<'_>) {
        // SAFETY: field writes on a live tensor struct while no graph computes (`Quiet`).
        unsafe {
            (*self.0).buffer = std::ptr::null_mut();
            (*self.0).data = std::ptr::null_mut();
            (*self.0).extra = std::ptr::null_mut();
        }
    }

    /// Copies `src` (exactly `nbytes()`) into the tensor wherever it lives.
    pub fn upload(&self, src: &[u8]) -> Result<(), FfiError> {
        if src.len() != self.nbytes() || self.buffer().is_null() {
            return Err(FfiError::Argument(format!(
                "{}: uploading {} bytes to a tensor of {}{}",
                self.name(),
                src.len(),
                self.nbytes(),
                if self.buffer().is_null() {
                    " bound to no buffer"
                } else {
                    ""
                }
            )));
        }
        // SAFETY: the tensor is bound to a live buffer (checked non-null; the arena binds it to
        // its slot before queuing the upload and drains the loaders before it unbinds) and `src`
        // holds exactly its bytes; ggml checks the copy against the tensor's extent.
        unsafe { sys::ggml_backend_tensor_set(self.0, src.as_ptr().cast(), 0, src.len()) };
        Ok(())
    }

    /// The weight `t` is, when it lives in a weights buffer: only a model's weights live as long
    /// as their model (a graph's activations go with the graph).
    pub fn weight(t: &sys::ggml_tensor) -> Option<Self> {
        is_weight(t).then_some(TensorPtr(t as *const _ as *mut _))
    }

    /// Wraps a tensor llama.cpp created as a weight of the model it is building (before any
    /// buffer holds it).
    pub(super) fn of_model(t: &sys::ggml_tensor) -> Self {
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

    /// The tensor's bytes where they are now, `None` unless in host memory. Borrowed from the
    /// proof, so no move of any weight can happen while the slice lives.
    pub fn bytes<'q>(&self, _quiet: &'q Quiet<'_>) -> Option<&'q [u8]> {
        let t = self.get();
        if t.data.is_null() || !self.binding().is_host() {
            return None;
        }
        // SAFETY: a host binding of a weight holds `nbytes()` bytes at `data`, readable for the
        // model's lifetime; no move can change `data` while `_quiet` is borrowed.
        Some(unsafe { std::slice::from_raw_parts(self.data(), self.nbytes()) })
    }

    /// Points the tensor's data at `mem`, host memory holding its bytes in its layout; `Err`
    /// unless `mem` has at least `nbytes()` bytes. `mem`'s owner must outlive every compute on
    /// the tensor: the engine keeps such owners in `Model`, dropped before the raw model.
    pub fn rebind(&self, mem: &[u8], _quiet: &mut Quiet<'_>) -> Result<(), FfiError> {
        if mem.len() < self.nbytes() {
            return Err(FfiError::Argument(format!(
                "{}: binding {} bytes to a tensor of {}",
                self.name(),
                mem.len(),
                self.nbytes()
            )));
        }
        // SAFETY: writing the `data` field of a live tensor struct while no graph computes
        // (`Quiet`); `mem` holds the tensor's bytes (checked above). The CPU backend reads `data`
        // afresh at compute time, and weights are never written through it.
        unsafe { (*self.0).data = mem.as_ptr().cast_mut().cast() };
        Ok(())
    }
}

/// Reads the I32 ids of a routing node `[n_used, n_tokens]` wherever it lives: straight from host
/// memory, else with `ggml_backend_tensor_get` over the view's extent (a device graph computes it
/// in device memory).
pub fn read_ids_anywhere(t: &sys::ggml_tensor) -> Option<Vec<i32>> {
    if let Some(ids) = read_ids(t) {
        return Some(ids);
    }
    let buf = if t.buffer.is_null() && !t.view_src.is_null() {
        // SAFETY: a non-null view source of a live node is a live tensor.
        unsafe { (*t.view_src).buffer }
    } else {
        t.buffer
    };
    if t.type_ != sys::GGML_TYPE_I32 || t.data.is_null() || buf.is_null() {
        return None;
    }
    // SAFETY: pure function of the node's shape and strides: the bytes from its first element to
    // its last.
    let extent = unsafe { sys::ggml_nbytes(t) };
    let mut raw = vec![0u8; extent];
    // SAFETY: the node was computed and synchronised before the observe callback; `raw` holds
    // `extent` bytes, which ggml checks against the tensor's own extent.
    unsafe {
        sys::ggml_backend_tensor_get(
            t as *const _ as *mut sys::ggml_tensor,
            raw.as_mut_ptr().cast(),
            0,
            extent,
        )
    };
    decode_ids(t, &raw)
}

/// A small ggml context for views of runs of experts of a weight, one per loader thread: handing a
/// backend a run of experts as a whole tensor lets a repacking backend repack it there, in
/// parallel across loaders, where a partial write would make it stage the whole tensor.
pub struct ViewScratch(std::ptr::NonNull<sys::ggml_context>);

// SAFETY: the context is owned by one loader thread at a time and holds only view headers.
unsafe impl Send for ViewScratch {}

impl Drop for ViewScratch {
    fn drop(&mut self) {
        // SAFETY: owned context freed once; no view created in it is used after this.
        unsafe { sys::ggml_free(self.0.as_ptr()) }
    }
}

impl ViewScratch {
    /// A context with room for a few tensor headers and no data.
    pub fn new() -> Result<Self, FfiError> {
        // SAFETY: plain size query.
        let overhead = unsafe { sys::ggml_tensor_overhead() };
        let params = sys::ggml_init_params {
            mem_size: 8 * overhead,
            mem_buffer: std::ptr::null_mut(),
            no_alloc: true,
        };
        // SAFETY: ggml_init allocates its own arena; NULL means failure.
        let ctx = unsafe { sys::ggml_init(params) };
        std::ptr::NonNull::new(ctx)
            .map(ViewScratch)
            .ok_or_else(|| FfiError::Ggml("ggml could not create a view context".into()))
    }

    /// The context, for header-only tensors (probe ops) that live until the next reset.
    pub(crate) fn ctx(&mut self) -> *mut sys::ggml_context {
        // SAFETY: resetting our own context; nothing created in it before is used afterwards.
        unsafe { sys::ggml_reset(self.0.as_ptr()) };
        self.0.as_ptr()
    }

    /// Writes `src` as experts `first..first + count` of the 3-D weight `t`, through a view of
    /// those experts alone: one copy (one message on a remote device) for the run.
    pub fn upload_experts(
        &mut self,
        t: TensorPtr,
        first: usize,
        count: usize,
        src: &[u8],
    ) -> Result<(), FfiError> {
        let ne = t.ne();
        let nb = t.nb();
        if t.buffer().is_null() {
            return Err(FfiError::Argument(format!(
                "{}: experts {first}..{} uploaded to a tensor bound to no buffer",
                t.name(),
                first + count
            )));
        }
        if count == 0 || (first + count) as i64 > ne[2] || src.len() != count * nb[2] {
            return Err(FfiError::Argument(format!(
                "{}: {count} experts from {first} in {} bytes asked, the tensor has {} experts \
                 of {} bytes",
                t.name(),
                src.len(),
                ne[2],
                nb[2]
            )));
        }
        // SAFETY: the context is ours; the view lies inside `t` (first + count <= ne[2], with t's
        // own strides, so it covers count * nb[2] bytes from first * nb[2]); `t` is bound to a
        // buffer (checked non-null; the arena binds it before queuing this upload and drains the
        // loaders before unbinding), which `ggml_backend_view_init` requires; `src` holds exactly
        // the view's bytes (checked). The copy is synchronous, and the slot it writes is not
        // computed on until the arena's wait returns.
        unsafe {
            sys::ggml_reset(self.0.as_ptr());
            let v = sys::ggml_view_3d(
                self.0.as_ptr(),
                t.raw(),
                ne[0],
                ne[1],
                count as i64,
                nb[1],
                nb[2],
                first * nb[2],
            );
            if v.is_null() {
                return Err(FfiError::Ggml(format!(
                    "{}: no view of experts {first}..{}",
                    t.name(),
                    first + count
                )));
            }
            let st = sys::ggml_backend_view_init(v);
            if st != sys::GGML_STATUS_SUCCESS {
                return Err(FfiError::Bind {
                    tensor: format!("{} (view of experts {first}..{})", t.name(), first + count),
                    status: st,
                });
            }
            sys::ggml_backend_tensor_set(v, src.as_ptr().cast(), 0, src.len());
        }
        Ok(())
    }
}
