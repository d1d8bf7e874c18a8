//! Calls into llama.cpp that can throw go through ggml-sys's C++ shim, which catches the exception
//! and hands back its message; this turns that into a typed error.
use std::ffi::{c_char, CStr};

use ggml_sys::shim::{BMOE_OK, BMOE_THREW};

/// A C++ exception llama.cpp threw inside `call`, caught before it could reach Rust.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("llama.cpp failed in {call}: {what}")]
pub struct Thrown {
    /// The llama.cpp function that threw.
    pub call: &'static str,
    /// The exception's message (`what()`).
    pub what: String,
}

/// The message buffer the shim writes into; long enough for llama.cpp's longest messages.
pub(crate) struct ErrBuf([c_char; 1024]);

impl ErrBuf {
    /// An empty buffer.
    pub(crate) fn new() -> Self {
        Self([0; 1024])
    }

    /// Pointer for the shim.
    pub(crate) fn ptr(&mut self) -> *mut c_char {
        self.0.as_mut_ptr()
    }

    /// Length for the shim.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// `Ok` when the shim returned `BMOE_OK`, else the message it wrote.
    pub(crate) fn check(&self, call: &'static str, rc: i32) -> Result<(), Thrown> {
        if rc == BMOE_OK {
            return Ok(());
        }
        // The shim always NUL-terminates within the buffer; the last byte is forced to NUL anyway
        // so a reader can never run past it.
        let mut bytes = self.0;
        if let Some(last) = bytes.last_mut() {
            *last = 0;
        }
        // SAFETY: `bytes` is a local array whose last element is NUL, so the scan stops inside it.
        let what = unsafe { CStr::from_ptr(bytes.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        let what = if rc == BMOE_THREW {
            what
        } else {
            format!("unexpected shim status {rc}: {what}")
        };
        Err(Thrown { call, what })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thrown_exception_becomes_a_typed_error() {
        let mut e = ErrBuf::new();
        // SAFETY: the buffer is valid for its length.
        let rc = unsafe { ggml_sys::shim::bmoe_shim_selftest(e.ptr(), e.len()) };
        let err = e.check("selftest", rc).unwrap_err();
        assert_eq!(err.call, "selftest");
        assert_eq!(err.what, "bmoe shim self-test");
        assert_eq!(
            err.to_string(),
            "llama.cpp failed in selftest: bmoe shim self-test"
        );
    }
}
