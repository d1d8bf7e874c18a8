//! A loaded llama.cpp model.
use std::ffi::{CStr, CString};
use std::path::Path;
use std::ptr::NonNull;

use ggml_sys as sys;

use super::error::FfiError;
use super::guard::{ErrBuf, Thrown};
use super::registry::Device;

/// A metadata override applied at load (`llama_model_kv_override`).
#[derive(Debug, Clone, PartialEq)]
pub enum KvOverride {
    /// An integer value.
    Int(String, i64),
}

/// How llama.cpp should load the weights.
#[derive(Debug, Clone)]
pub struct RawLoadParams {
    /// The devices the model may use, CPU included; never empty.
    pub devices: Vec<Device>,
    /// Map the file (true) or read it into allocated buffers (false).
    pub mmap: bool,
    /// Metadata overrides.
    pub kv_overrides: Vec<KvOverride>,
    /// Layers on the first non-CPU device (`n_gpu_layers`; -1 = all).
    pub gpu_layers: i32,
    /// Let llama.cpp's CPU extra buffer types take the weights they repack (`use_extra_bufts`).
    /// Only `load` honours it: the other loads must leave the weights in the file's layout.
    pub repack: bool,
}

impl RawLoadParams {
    /// The CPU alone, mapped, no override: the plain load the ffi tests start from.
    #[cfg(test)]
    pub(crate) fn cpu_only() -> RawLoadParams {
        RawLoadParams {
            devices: vec![Device::cpu().expect("cpu device")],
            mmap: true,
            kv_overrides: vec![],
            gpu_layers: 0,
            repack: false,
        }
    }
}

/// An owned `llama_model`.
pub struct LlamaModel {
    raw: NonNull<sys::llama_model>,
    /// Held by every decode on a context of this model and by every move of its weights.
    exec: super::quiet::ExecLock,
}

// SAFETY: llama.cpp models are immutable after load apart from weight data the engine itself
// manages, and llama.cpp documents sharing one model across contexts and threads.
unsafe impl Send for LlamaModel {}
// SAFETY: as above.
unsafe impl Sync for LlamaModel {}

impl Drop for LlamaModel {
    fn drop(&mut self) {
        let mut e = ErrBuf::new();
        // SAFETY: we own the pointer; every context borrowing it has been dropped (lifetimes). The
        // shim catches a throw from a destructor; there is nothing to do about one but go on.
        let _ = unsafe { sys::shim::bmoe_model_free(self.raw.as_ptr(), e.ptr(), e.len()) };
    }
}

fn c_string_lossy(buf: &[u8]) -> String {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

impl LlamaModel {
    /// Loads `path`; on failure returns what llama.cpp logged.
    pub fn load(path: &Path, p: &RawLoadParams) -> Result<LlamaModel, FfiError> {
        super::backend_init();
        let cpath =
            CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| FfiError::NulInPath)?;
        let (mut devs, kvs) = raw_lists(p)?;
        super::mapped_fault::register(path);
        super::log::clear_recent();
        let mut err = ErrBuf::new();
        let mut raw: *mut sys::llama_model = std::ptr::null_mut();
        // SAFETY: default params are plain data; the pointers we store (devices, overrides) outlive
        // the load call, which copies what it keeps. The shim writes `raw` and at most `err.len()`
        // bytes of message.
        let rc = unsafe {
            let mut mp = model_params(&mut devs, &kvs, p);
            mp.use_extra_bufts = p.repack;
            sys::shim::bmoe_model_load_from_file(cpath.as_ptr(), mp, &mut raw, err.ptr(), err.len())
        };
        let model = NonNull::new(raw).map(LlamaModel::own);
        // A weight page that failed to read during the load (the CPU repack reads them all) was
        // read as zeros: the model is dropped (its mapping with it) rather than kept so.
        if let Some(f) = super::mapped_fault::take(super::mapped_fault::AfterFault::Discard) {
            drop(model);
            return Err(FfiError::MappedRead(f));
        }
        err.check("llama_model_load_from_file", rc)?;
        model.ok_or_else(|| {
            FfiError::no_result("llama_model_load_from_file", "no reason was logged")
        })
    }

    /// Runs llama.cpp's own load of `path` up to the tensor table and stops before any weight is
    /// allocated or read (`no_alloc`, no mapping): the shape and count checks of the resident load
    /// (`check_tensor_dims`: "wrong shape", "missing tensor", "wrong number of tensors"), which a
    /// model built from the header alone never meets. A tensor llama.cpp derives from a damaged
    /// hyper-parameter gets a dimension below 1 there and `GGML_ASSERT`s (issue 37); here it is
    /// compared with the file's tensor first, and refused with an exception the shim catches.
    pub(crate) fn check_shapes(path: &Path, p: &RawLoadParams) -> Result<(), FfiError> {
        super::backend_init();
        let cpath =
            CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| FfiError::NulInPath)?;
        let (mut devs, kvs) = raw_lists(p)?;
        super::log::clear_recent();
        let mut err = ErrBuf::new();
        let mut raw: *mut sys::llama_model = std::ptr::null_mut();
        // SAFETY: as in `load`. With `no_alloc` llama.cpp gives every weight a zero-sized dummy
        // buffer and returns before it maps or reads the file's data.
        let rc = unsafe {
            let mut mp = model_params(&mut devs, &kvs, p);
            mp.load_mode = sys::LLAMA_LOAD_MODE_NONE;
            mp.no_alloc = true;
            sys::shim::bmoe_model_load_from_file(cpath.as_ptr(), mp, &mut raw, err.ptr(), err.len())
        };
        err.check("llama_model_load_from_file", rc)?;
        // Dropped at once: only the checks were wanted.
        NonNull::new(raw)
            .map(LlamaModel::own)
            .map(drop)
            .ok_or_else(|| {
                FfiError::no_result("llama_model_load_from_file", "no reason was logged")
            })
    }

    /// Builds the model from `meta` (the GGUF's header) without reading or mapping any tensor
    /// data: llama.cpp allocates its weight buffers and leaves them untouched (virtual memory, no
    /// page committed), and every weight tensor it created is returned so that the caller binds
    /// each one to its bytes. Tensors the architecture creates that the file does not hold come
    /// back too (the caller must refuse those).
    pub(crate) fn load_unfilled(
        meta: &dyn super::gguf::GgufMeta,
        p: &RawLoadParams,
    ) -> Result<(LlamaModel, Vec<super::tensor::TensorPtr>), FfiError> {
        super::backend_init();
        let (mut devs, kvs) = raw_lists(p)?;
        let mut created: Vec<super::tensor::TensorPtr> = Vec::new();
        super::log::clear_recent();
        let mut err = ErrBuf::new();
        let mut raw: *mut sys::llama_model = std::ptr::null_mut();
        // SAFETY: as in `load`; `meta` outlives the call (llama.cpp reads it only while loading);
        // `created` outlives the call and `record_tensor` is the only code that touches it through
        // the user-data pointer, on this thread, while the call runs.
        let rc = unsafe {
            let mut mp = model_params(&mut devs, &kvs, p);
            mp.load_mode = sys::LLAMA_LOAD_MODE_NONE;
            sys::shim::bmoe_model_init_from_user(
                meta.raw(),
                Some(record_tensor),
                (&mut created as *mut Vec<super::tensor::TensorPtr>).cast(),
                mp,
                &mut raw,
                err.ptr(),
                err.len(),
            )
        };
        err.check("llama_model_init_from_user", rc)?;
        let model = NonNull::new(raw).map(LlamaModel::own).ok_or_else(|| {
            FfiError::no_result("llama_model_init_from_user", "no reason was logged")
        })?;
        Ok((model, created))
    }

    /// Leaves `absent` (tensors built from the header that the file does not hold) out of the
    /// model's layers, so that its graphs skip their ops as after llama.cpp's own load of the
    /// file. The tensors themselves stay allocated. `None`: declined, nothing changed (the
    /// model's structures were not what the shim checks for).
    pub(crate) fn unlink_absent(&mut self, absent: &[super::tensor::TensorPtr]) -> Option<usize> {
        let ptrs: Vec<*mut sys::ggml_tensor> = absent.iter().map(|t| t.raw()).collect();
        let mut n = 0usize;
        // SAFETY: `&mut self` holds the model exclusively and no context computes on it yet (this
        // runs during the load); the pointer list is valid for the call, and the shim only clears
        // pointer fields of the model's own structures after checking that every slot it reads
        // holds one of the model's tensors.
        let rc = unsafe {
            sys::shim::bmoe_model_unlink_absent(self.raw(), ptrs.as_ptr(), ptrs.len(), &mut n)
        };
        (rc == sys::shim::UNLINK_OK).then_some(n)
    }

    fn own(raw: NonNull<sys::llama_model>) -> LlamaModel {
        LlamaModel {
            raw,
            exec: super::quiet::ExecLock::default(),
        }
    }

    /// The raw pointer, for the other wrappers.
    pub fn raw(&self) -> *mut sys::llama_model {
        self.raw.as_ptr()
    }

    /// The model's execution lock: decodes and weight moves take it.
    pub fn exec(&self) -> &super::quiet::ExecLock {
        &self.exec
    }

    /// A metadata value as a string, `None` when the key is absent.
    pub fn meta(&self, key: &str) -> Option<String> {
        let ckey = CString::new(key).ok()?;
        let mut buf = vec![0u8; 256];
        loop {
            // SAFETY: buffer and key are valid for the call; llama writes at most `len` bytes.
            let n = unsafe {
                sys::llama_model_meta_val_str(
                    self.raw(),
                    ckey.as_ptr(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                )
            };
            if n < 0 {
                return None;
            }
            if (n as usize) < buf.len() {
                return Some(c_string_lossy(&buf));
            }
            buf.resize(n as usize + 1, 0);
        }
    }

    /// The weight tensors llama.cpp holds in one of the CPU's repacked layouts (buffer types
    /// `CPU_REPACK` and `AMX`) and their bytes in the file's layout; `(0, 0)` when the count
    /// could not be taken.
    pub fn repacked(&self) -> (usize, u64) {
        let (mut n, mut bytes) = (0usize, 0u64);
        for buft in [c"CPU_REPACK", c"AMX"] {
            let (mut k, mut b) = (0usize, 0u64);
            // SAFETY: a live model; the shim reads tensor pointers and buffer-type names only,
            // writes the two counts, and catches whatever throws.
            let rc = unsafe {
                sys::shim::bmoe_model_weights_in(self.raw(), buft.as_ptr(), &mut k, &mut b)
            };
            if rc != 0 {
                return (0, 0);
            }
            n += k;
            bytes += b;
        }
        (n, bytes)
    }

    /// llama.cpp's one-line description (`qwen3moe ?B Q4_0`).
    pub fn desc(&self) -> String {
        let mut buf = vec![0u8; 256];
        // SAFETY: buffer valid for its length.
        unsafe { sys::llama_model_desc(self.raw(), buf.as_mut_ptr().cast(), buf.len()) };
        c_string_lossy(&buf)
    }

    /// Layers.
    pub fn n_layer(&self) -> u32 {
        // SAFETY: read-only query on a live model.
        unsafe { sys::llama_model_n_layer(self.raw()) as u32 }
    }

    /// Sliding-window width of the attention layers that have one (0 = none).
    pub fn n_swa(&self) -> u32 {
        // SAFETY: read-only query on a live model.
        unsafe { sys::llama_model_n_swa(self.raw()).max(0) as u32 }
    }

    /// Whether the model's memory keeps a recurrent state per sequence (a recurrent or hybrid
    /// model): such a memory holds one state per sequence, at its last position, so it cannot
    /// drop the tail of a sequence nor copy part of one (llama-memory-recurrent.cpp:198-213,
    /// 261-296).
    pub fn has_recurrent_state(&self) -> bool {
        // SAFETY: read-only queries on a live model.
        unsafe {
            sys::llama_model_is_recurrent(self.raw()) || sys::llama_model_is_hybrid(self.raw())
        }
    }

    /// Training context length.
    pub fn n_ctx_train(&self) -> u32 {
        // SAFETY: read-only query on a live model.
        unsafe { sys::llama_model_n_ctx_train(self.raw()) as u32 }
    }

    /// Embedding width.
    pub fn n_embd(&self) -> u32 {
        // SAFETY: read-only query on a live model.
        unsafe { sys::llama_model_n_embd(self.raw()) as u32 }
    }

    /// Total bytes of weights.
    pub fn size(&self) -> u64 {
        // SAFETY: read-only query on a live model.
        unsafe { sys::llama_model_size(self.raw()) }
    }

    /// The model's default chat template, if it carries one.
    pub fn chat_template(&self) -> Option<String> {
        let mut e = ErrBuf::new();
        let mut p: *const std::os::raw::c_char = std::ptr::null();
        // SAFETY: read-only query; the returned string is owned by the model. A throw (an
        // allocation failure building the key) leaves `p` NULL: no template.
        let rc =
            unsafe { sys::shim::bmoe_model_chat_template(self.raw(), &mut p, e.ptr(), e.len()) };
        if e.check("llama_model_chat_template", rc).is_err() {
            return None;
        }
        // SAFETY: non-null pointers are NUL-terminated strings living as long as the model.
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }

    /// The vocabulary.
    pub fn vocab(&self) -> super::vocab::Vocab<'_> {
        // SAFETY: the vocab is owned by the model and lives as long as the borrow.
        super::vocab::Vocab::new(unsafe { sys::llama_model_get_vocab(self.raw()) })
    }
}

/// The NULL-terminated device list and the zero-terminated override list of `p`.
fn raw_lists(
    p: &RawLoadParams,
) -> Result<
    (
        Vec<sys::ggml_backend_dev_t>,
        Vec<sys::llama_model_kv_override>,
    ),
    FfiError,
> {
    let mut devs: Vec<sys::ggml_backend_dev_t> = p.devices.iter().map(|d| d.raw()).collect();
    devs.push(std::ptr::null_mut());
    let mut kvs: Vec<sys::llama_model_kv_override> = Vec::with_capacity(p.kv_overrides.len() + 1);
    for o in &p.kv_overrides {
        // SAFETY: the override struct is plain old data; zero is a valid bit pattern.
        let mut kv: sys::llama_model_kv_override = unsafe { std::mem::zeroed() };
        match o {
            KvOverride::Int(key, v) => {
                if key.len() >= kv.key.len() {
                    return Err(FfiError::Argument(format!(
                        "metadata key {key} is too long"
                    )));
                }
                for (d, s) in kv.key.iter_mut().zip(key.bytes()) {
                    *d = s as std::os::raw::c_char;
                }
                kv.tag = sys::LLAMA_KV_OVERRIDE_TYPE_INT;
                kv.__bindgen_anon_1.val_i64 = *v;
            }
        }
        kvs.push(kv);
    }
    // SAFETY: a zeroed override (empty key) terminates the list, as llama.cpp expects.
    kvs.push(unsafe { std::mem::zeroed() });
    Ok((devs, kvs))
}

/// llama.cpp's model parameters for `p`, pointing into `devs` and `kvs` (which must outlive the
/// load call).
fn model_params(
    devs: &mut [sys::ggml_backend_dev_t],
    kvs: &[sys::llama_model_kv_override],
    p: &RawLoadParams,
) -> sys::llama_model_params {
    // SAFETY: returns plain data.
    let mut mp = unsafe { sys::llama_model_default_params() };
    mp.devices = devs.as_mut_ptr();
    mp.load_mode = if p.mmap {
        sys::LLAMA_LOAD_MODE_MMAP
    } else {
        sys::LLAMA_LOAD_MODE_NONE
    };
    mp.lazy_mode = sys::LLAMA_LAZY_MODE_OFF;
    // Weights stay in the file's byte layout (every mechanism that moves them needs it) unless
    // the one load that may repack turns this on.
    mp.use_extra_bufts = false;
    mp.n_gpu_layers = p.gpu_layers;
    mp.kv_overrides = if p.kv_overrides.is_empty() {
        std::ptr::null()
    } else {
        kvs.as_ptr()
    };
    mp
}

/// llama.cpp's per-tensor callback of `load_unfilled`: records the tensor, fills nothing.
extern "C" fn record_tensor(t: *mut sys::ggml_tensor, ud: *mut std::os::raw::c_void) {
    if t.is_null() || ud.is_null() {
        return;
    }
    // SAFETY: `ud` is the `Vec` `load_unfilled` passed, alive and otherwise untouched for the
    // duration of the load call that invokes this; `t` is a live tensor of the model being built.
    let created = unsafe { &mut *ud.cast::<Vec<super::tensor::TensorPtr>>() };
    // SAFETY: non-null, live for the model's lifetime.
    created.push(super::tensor::TensorPtr::of_model(unsafe { &*t }));
}

/// Renders one user message with a chat template; `Ok(None)` when llama.cpp does not know the
/// template (or the text holds a NUL byte), an error when llama.cpp threw.
pub fn apply_chat_template(template: &str, user: &str) -> Result<Option<String>, Thrown> {
    let (Ok(tmpl), Ok(content)) = (CString::new(template), CString::new(user)) else {
        return Ok(None);
    };
    let role = c"user";
    let msg = sys::llama_chat_message {
        role: role.as_ptr(),
        content: content.as_ptr(),
    };
    let mut buf = vec![0u8; user.len() * 2 + 256];
    loop {
        let len = i32::try_from(buf.len()).unwrap_or(i32::MAX);
        let mut n = 0i32;
        let mut e = ErrBuf::new();
        // SAFETY: all pointers are valid NUL-terminated strings for the call; buffer valid for
        // `len` bytes (never more than its length); the shim writes `n` and the message.
        let rc = unsafe {
            sys::shim::bmoe_chat_apply_template(
                tmpl.as_ptr(),
                &msg,
                1,
                true,
                buf.as_mut_ptr().cast(),
                len,
                &mut n,
                e.ptr(),
                e.len(),
            )
        };
        e.check("llama_chat_apply_template", rc)?;
        if n < 0 {
            return Ok(None);
        }
        if (n as usize) <= buf.len() {
            buf.truncate(n as usize);
            return Ok(Some(String::from_utf8_lossy(&buf).into_owned()));
        }
        buf.resize(n as usize, 0);
    }
}
