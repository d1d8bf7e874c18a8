//! A model loaded for its vocabulary only (`vocab_only`): no weights, no buffers; cheap enough
//! to tokenize a job's decisions while checking it.
use std::ffi::{CStr, CString};
use std::path::Path;
use std::ptr::NonNull;

use ggml_sys as sys;

use super::error::FfiError;
use super::guard::ErrBuf;
use super::vocab::Vocab;

/// An owned `llama_model` holding only the vocabulary and the metadata.
pub struct VocabModel(NonNull<sys::llama_model>);

// SAFETY: a vocab-only model is never written after load; llama.cpp shares models across threads.
unsafe impl Send for VocabModel {}
// SAFETY: as above.
unsafe impl Sync for VocabModel {}

impl Drop for VocabModel {
    fn drop(&mut self) {
        let mut e = ErrBuf::new();
        // SAFETY: we own the pointer and nothing borrows it past `self` (Vocab's lifetime). The
        // shim catches a throw from a destructor; there is nothing to do about one but go on.
        let _ = unsafe { sys::shim::bmoe_model_free(self.0.as_ptr(), e.ptr(), e.len()) };
    }
}

impl VocabModel {
    /// Loads the vocabulary of `path`; on failure returns what llama.cpp said or logged.
    pub fn load(path: &Path) -> Result<VocabModel, FfiError> {
        super::backend_init();
        let cpath =
            CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| FfiError::NulInPath)?;
        super::log::clear_recent();
        let mut err = ErrBuf::new();
        let mut raw: *mut sys::llama_model = std::ptr::null_mut();
        // SAFETY: default params are plain data; `vocab_only` makes llama.cpp read the metadata
        // and the vocabulary and allocate no tensor. The shim writes `raw` and at most
        // `err.len()` bytes of message.
        let rc = unsafe {
            let mut mp = sys::llama_model_default_params();
            mp.vocab_only = true;
            mp.n_gpu_layers = 0;
            sys::shim::bmoe_model_load_from_file(cpath.as_ptr(), mp, &mut raw, err.ptr(), err.len())
        };
        err.check("llama_model_load_from_file", rc)?;
        NonNull::new(raw).map(VocabModel).ok_or_else(|| {
            FfiError::no_result("llama_model_load_from_file", "no reason was logged")
        })
    }

    /// The model's default chat template, if it carries one.
    pub fn chat_template(&self) -> Option<String> {
        let mut e = ErrBuf::new();
        let mut p: *const std::os::raw::c_char = std::ptr::null();
        // SAFETY: read-only query on a live model; the returned string is owned by the model. A
        // throw leaves `p` NULL: no template.
        let rc = unsafe {
            sys::shim::bmoe_model_chat_template(self.0.as_ptr(), &mut p, e.ptr(), e.len())
        };
        if e.check("llama_model_chat_template", rc).is_err() {
            return None;
        }
        // SAFETY: non-null pointers are NUL-terminated strings living as long as the model.
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }

    /// The vocabulary.
    pub fn vocab(&self) -> Vocab<'_> {
        // SAFETY: the vocab is owned by the model and lives as long as the borrow.
        Vocab::new(unsafe { sys::llama_model_get_vocab(self.0.as_ptr()) })
    }
}
