//! A llama.cpp context: KV cache, compute buffers, decode, logits; the eval-callback and abort seams.
use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use ggml_sys as sys;

use super::batch::Batch;
use super::error::FfiError;
use super::guard::{ErrBuf, Thrown};
use super::model::LlamaModel;
use super::quiet::ExecGuard;

/// The one graph seam: llama.cpp's `cb_eval`, split into its two phases.
pub trait EvalHook: Send {
    /// Ask phase: return true to have the scheduler compute up to `t`, sync, and call `observe`.
    fn ask(&mut self, t: &sys::ggml_tensor) -> bool;
    /// Observe phase: `t` and everything before it in its split are computed. Return value is
    /// ignored by design (llama.cpp does not abort on false): fail through the abort flag.
    fn observe(&mut self, t: &sys::ggml_tensor);
}

/// Pins a threadpool's threads to the set `cpus`, one thread per CPU (ggml's `strict_cpu`): workers
/// 1.. on the set's CPUs in ascending order, the calling thread (worker 0) on the next one, wrapping
/// around when there are more threads than CPUs. An empty set leaves the default (no mask).
/// Returns whether anything was pinned.
fn pin_pool(tp: &mut sys::ggml_threadpool_params, cpus: &[usize]) -> bool {
    let mut any = false;
    for &c in cpus {
        if let Some(bit) = tp.cpumask.get_mut(c) {
            *bit = true;
            any = true;
        }
    }
    tp.strict_cpu = any;
    any
}

/// llama.cpp's limit on sequences per context (`LLAMA_MAX_SEQ`).
pub const MAX_SEQ: u32 = 256;

/// Context creation parameters.
pub struct ContextParams {
    /// Context size in tokens.
    pub n_ctx: u32,
    /// Largest batch submitted to one decode.
    pub n_batch: u32,
    /// Physical batch (graph width).
    pub n_ubatch: u32,
    /// Cap on output rows per ubatch.
    pub n_outputs_max: u32,
    /// Compute threads.
    pub threads: u32,
    /// The graph hook, if any.
    pub hook: Option<Box<dyn EvalHook>>,
    /// Set to make the running decode stop (polled by the CPU backend between nodes).
    pub abort: Arc<AtomicBool>,
    /// Keep one CPU threadpool for the context's life instead of one per compute call.
    pub persistent_threads: bool,
    /// CPUs the persistent pool's threads run on, one thread per CPU (ggml's `strict_cpu`);
    /// empty = wherever the kernel puts them.
    pub cpus: Vec<usize>,
    /// Sequences the KV cache can hold at once (1 + the choices scored side by side). The cache
    /// stays unified, so sequences share the cells of a common prefix.
    pub n_seq_max: u32,
}

struct Callbacks {
    hook: Option<Box<dyn EvalHook>>,
    abort: Arc<AtomicBool>,
}

/// An owned `llama_context` borrowing its model.
pub struct LlamaContext<'m> {
    raw: NonNull<sys::llama_context>,
    // A persistent CPU threadpool: without one ggml creates and joins its worker threads on every
    // compute call, and the graph hook cuts each decode into one call per routing node.
    threadpool: sys::ggml_threadpool_t,
    // Boxed so the pointer handed to llama.cpp stays put; never read here, only owned until the
    // context is freed.
    _callbacks: Box<Callbacks>,
    _model: &'m LlamaModel,
}

// SAFETY: a context is used from one thread at a time (it is not Sync); moving it between
// threads is fine because llama.cpp keeps no thread-local state per context.
unsafe impl Send for LlamaContext<'_> {}

impl Drop for LlamaContext<'_> {
    fn drop(&mut self) {
        let mut e = ErrBuf::new();
        // SAFETY: we own the context and the threadpool; the context is freed first, so nothing
        // computes on the pool when it goes; callbacks outlive both (dropped after this). A throw
        // from a destructor is caught by the shim; there is nothing to do about it but go on.
        unsafe {
            let _ = sys::shim::bmoe_free(self.raw.as_ptr(), e.ptr(), e.len());
            if !self.threadpool.is_null() {
                sys::ggml_threadpool_free(self.threadpool);
            }
        }
    }
}

extern "C" fn eval_trampoline(t: *mut sys::ggml_tensor, ask: bool, ud: *mut c_void) -> bool {
    // SAFETY: `ud` is the boxed `Callbacks` of a live context (set at creation, freed after the
    // context), and llama.cpp calls this on the thread running `llama_decode`, which holds the
    // context mutably, so no other reference to the callbacks exists during the call.
    let cb = unsafe { &mut *(ud as *mut Callbacks) };
    let Some(hook) = cb.hook.as_mut() else {
        return false;
    };
    // SAFETY: the scheduler passes a live graph node.
    let t = unsafe { &*t };
    if ask {
        hook.ask(t)
    } else {
        hook.observe(t);
        true
    }
}

extern "C" fn abort_trampoline(ud: *mut c_void) -> bool {
    // SAFETY: `ud` points to the `AtomicBool` inside the boxed callbacks' Arc, alive as long as
    // the context; atomics may be read from any thread.
    let flag = unsafe { &*(ud as *const AtomicBool) };
    flag.load(Ordering::Relaxed)
}

/// Result of one `decode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeStatus {
    /// Computed.
    Ok,
    /// Stopped by the abort flag.
    Aborted,
}

impl<'m> LlamaContext<'m> {
    /// Creates a context over `model`.
    pub fn new(model: &'m LlamaModel, p: ContextParams) -> Result<Self, FfiError> {
        Self::with_swa_cache(model, p, true)
    }

    /// As `new`; `swa_full` gives sliding-window layers a cache as large as the context
    /// (llama.cpp's default), else the window's cells (`n_swa * n_seq_max + n_ubatch`, padded;
    /// what llama.cpp's own tools use), whose oldest cells new tokens overwrite.
    pub fn with_swa_cache(
        model: &'m LlamaModel,
        p: ContextParams,
        swa_full: bool,
    ) -> Result<Self, FfiError> {
        let has_hook = p.hook.is_some();
        let mut callbacks = Box::new(Callbacks {
            hook: p.hook,
            abort: p.abort,
        });
        super::log::clear_recent();
        let mut raw: *mut sys::llama_context = std::ptr::null_mut();
        let mut err = ErrBuf::new();
        // SAFETY: default params are plain data; the callback user data points into `callbacks`,
        // which this struct owns and drops after the context. The shim writes `raw` and the
        // message.
        let rc = unsafe {
            let mut cp = sys::llama_context_default_params();
            cp.n_ctx = p.n_ctx;
            cp.n_batch = p.n_batch;
            cp.n_ubatch = p.n_ubatch;
            cp.n_seq_max = p.n_seq_max.clamp(1, MAX_SEQ);
            // One buffer for every sequence: copies of the prompt's sequence share its cells.
            cp.kv_unified = true;
            cp.swa_full = swa_full;
            cp.n_outputs_max = p.n_outputs_max;
            cp.n_threads = p.threads as i32;
            cp.n_threads_batch = p.threads as i32;
            cp.no_perf = true;
            cp.op_offload = false;
            if has_hook {
                cp.cb_eval = Some(eval_trampoline);
                cp.cb_eval_user_data = (&mut *callbacks as *mut Callbacks).cast();
            }
            cp.abort_callback = Some(abort_trampoline);
            cp.abort_callback_data = Arc::as_ptr(&callbacks.abort) as *mut c_void;
            sys::shim::bmoe_init_from_model(model.raw(), cp, &mut raw, err.ptr(), err.len())
        };
        err.check("llama_init_from_model", rc)?;
        let raw = NonNull::new(raw)
            .ok_or_else(|| FfiError::no_result("llama_init_from_model", "no reason was logged"))?;
        let threadpool = if p.persistent_threads {
            // SAFETY: default params are plain data, and the mask is written inside its fixed-size
            // array; a NULL pool (creation failed) leaves llama.cpp's per-call pools in place.
            // Attached to a live context, freed after it.
            unsafe {
                let mut tp = sys::ggml_threadpool_params_default(p.threads as i32);
                if !pin_pool(&mut tp, &p.cpus) {
                    // An earlier pinned pool left this thread on one CPU; an unpinned session
                    // computes wherever the process may.
                    let _ = super::affinity::pin_current_thread(super::affinity::process_cpus());
                }
                let pool = sys::ggml_threadpool_new(&mut tp);
                if !pool.is_null() {
                    sys::llama_attach_threadpool(raw.as_ptr(), pool, pool);
                }
                pool
            }
        } else {
            std::ptr::null_mut()
        };
        Ok(Self {
            raw,
            threadpool,
            _callbacks: callbacks,
            _model: model,
        })
    }

    pub(super) fn raw(&self) -> *mut sys::llama_context {
        self.raw.as_ptr()
    }

    /// The context size.
    pub fn n_ctx(&self) -> u32 {
        // SAFETY: read-only query.
        unsafe { sys::llama_n_ctx(self.raw()) }
    }

    /// The batch size llama.cpp took (clamped to the requested context).
    pub fn n_batch(&self) -> u32 {
        // SAFETY: read-only query on a live context.
        unsafe { sys::llama_n_batch(self.raw()) }
    }

    /// The ubatch size llama.cpp took (clamped to the batch).
    pub fn n_ubatch(&self) -> u32 {
        // SAFETY: read-only query on a live context.
        unsafe { sys::llama_n_ubatch(self.raw()) }
    }

    /// Runs the batch, under `exec`, the model's held execution lock (no weight moves while the
    /// graph computes). Errors carry llama.cpp's return code and logged reason.
    pub fn decode(
        &mut self,
        batch: &Batch,
        exec: &mut ExecGuard<'_>,
    ) -> Result<DecodeStatus, FfiError> {
        if !exec.holds(self._model.exec()) {
            return Err(FfiError::Argument(
                "decode called without its own model's execution lock".into(),
            ));
        }
        super::log::clear_recent();
        let mut rc = 0i32;
        let mut e = ErrBuf::new();
        // SAFETY: the batch is valid and sized for its token count; the context is live and
        // exclusively borrowed; the shim writes `rc` and the message.
        let status =
            unsafe { sys::shim::bmoe_decode(self.raw(), batch.raw(), &mut rc, e.ptr(), e.len()) };
        // A weight page the storage failed to give was read as zeros: whatever the decode
        // computed is garbage, whatever it returned.
        if let Some(f) = super::mapped_fault::take(super::mapped_fault::AfterFault::Restore) {
            return Err(FfiError::MappedRead(f));
        }
        e.check("llama_decode", status)?;
        match rc {
            0 => Ok(DecodeStatus::Ok),
            2 => Ok(DecodeStatus::Aborted),
            _ => Err(FfiError::Status {
                call: "llama_decode",
                code: rc,
                logged: super::log::recent_reason(),
            }),
        }
    }

    /// Makes the next decode reserve the compute buffers again, for the graph shapes and weight
    /// placement it then finds. llama.cpp reserves once, at creation; the only public call that
    /// asks for a new reservation without changing anything else is clearing the control vector
    /// (none is ever set here), which marks the scheduler for a reserve at the next decode.
    pub fn reserve_at_next_decode(&mut self) {
        let (mut e, mut rc) = (ErrBuf::new(), 0i32);
        // SAFETY: live context, exclusively borrowed (no decode running). With NULL data llama.cpp
        // only disables the control vector and sets its reserve flag; the shim catches anything
        // that throws anyway. The reservation itself runs inside the next decode (shimmed too).
        let st = unsafe {
            sys::shim::bmoe_set_adapter_cvec(
                self.raw(),
                std::ptr::null(),
                0,
                0,
                0,
                0,
                &mut rc,
                e.ptr(),
                e.len(),
            )
        };
        // Nothing to report: at worst the next decode reuses the reservation it has.
        let _ = e.check("llama_set_adapter_cvec", st);
    }

    /// The logits of output row `i` of the last decode (-1 = last), one per vocabulary entry.
    pub fn logits(&self, i: i32) -> Option<&[f32]> {
        let n_vocab = self._model.vocab().n_tokens();
        // SAFETY: llama returns NULL for an invalid row, otherwise a pointer to one float per
        // entry of the model's vocabulary (`n_vocab`, asked of the same model), owned by the
        // context and valid until the next decode (which needs `&mut self`).
        unsafe {
            let p = sys::llama_get_logits_ith(self.raw(), i);
            (!p.is_null()).then(|| std::slice::from_raw_parts(p, n_vocab))
        }
    }

    /// Drops positions `[p0, p1)` of sequence `seq` (`p1 < 0`: to the end). False when the
    /// memory cannot drop part of a sequence (recurrent state) or llama.cpp threw.
    pub fn seq_rm(&mut self, seq: i32, p0: i32, p1: i32) -> bool {
        let (mut e, mut ok) = (ErrBuf::new(), false);
        // SAFETY: live context; the memory handle is owned by it; no decode is running (&mut).
        let rc = unsafe {
            sys::shim::bmoe_memory_seq_rm(self.raw(), seq, p0, p1, &mut ok, e.ptr(), e.len())
        };
        e.check("llama_memory_seq_rm", rc).is_ok() && ok
    }

    /// Makes sequence `dst` share positions `[p0, p1)` of `src` (`p1 < 0`: to the end).
    pub fn seq_cp(&mut self, src: i32, dst: i32, p0: i32, p1: i32) -> Result<(), Thrown> {
        let mut e = ErrBuf::new();
        // SAFETY: as above; sequence ids are below n_seq_max (the callers' invariant, checked by
        // llama.cpp, which logs and ignores an invalid id).
        let rc = unsafe {
            sys::shim::bmoe_memory_seq_cp(self.raw(), src, dst, p0, p1, e.ptr(), e.len())
        };
        e.check("llama_memory_seq_cp", rc)
    }

    /// The smallest position sequence `seq` holds, -1 when it is empty.
    pub fn seq_pos_min(&self, seq: i32) -> i32 {
        // SAFETY: read-only query on a live context.
        unsafe { sys::llama_memory_seq_pos_min(sys::llama_get_memory(self.raw()), seq) }
    }

    /// Sequence `seq`'s state (its cells' positions and per-layer K/V rows, llama.cpp's own
    /// format), `None` when llama.cpp failed (it logs why).
    pub fn state_seq_get(&mut self, seq: i32) -> Option<Vec<u8>> {
        let (mut e, mut size) = (ErrBuf::new(), 0usize);
        // SAFETY: live context, exclusively borrowed (no decode running). llama.cpp catches
        // std::exception inside; the shim catches the rest (synchronize, allocation).
        let rc = unsafe {
            sys::shim::bmoe_state_seq_get_size(self.raw(), seq, &mut size, e.ptr(), e.len())
        };
        if e.check("llama_state_seq_get_size", rc).is_err() || size == 0 {
            return None;
        }
        let mut buf = vec![0u8; size];
        let mut n = 0usize;
        // SAFETY: `buf` is valid for `size` bytes, the size llama.cpp asked for.
        let rc = unsafe {
            let p = buf.as_mut_ptr();
            sys::shim::bmoe_state_seq_get_data(self.raw(), p, size, seq, &mut n, e.ptr(), e.len())
        };
        (e.check("llama_state_seq_get_data", rc).is_ok() && n == size).then_some(buf)
    }

    /// Restores a state `state_seq_get` returned into sequence `seq` (empty it first); false when
    /// llama.cpp refused it (wrong magic, other types or sizes, no room).
    pub fn state_seq_set(&mut self, seq: i32, data: &[u8]) -> bool {
        let (mut e, mut n) = (ErrBuf::new(), 0usize);
        // SAFETY: live context, exclusively borrowed; `data` valid for its length. llama.cpp
        // catches std::exception and discards what it read; the shim catches the rest.
        let rc = unsafe {
            let (p, len) = (data.as_ptr(), data.len());
            sys::shim::bmoe_state_seq_set_data(self.raw(), p, len, seq, &mut n, e.ptr(), e.len())
        };
        e.check("llama_state_seq_set_data", rc).is_ok() && n == data.len()
    }

    /// Sequences this context can hold.
    pub fn n_seq_max(&self) -> u32 {
        // SAFETY: read-only query on a live context.
        unsafe { sys::llama_n_seq_max(self.raw()) }
    }

    /// Empties the KV cache.
    pub fn clear_memory(&mut self) -> Result<(), Thrown> {
        let mut e = ErrBuf::new();
        // SAFETY: live context, exclusively borrowed; the memory handle is owned by it.
        let rc = unsafe { sys::shim::bmoe_memory_clear(self.raw(), e.ptr(), e.len()) };
        e.check("llama_memory_clear", rc)
    }
}
