//! What a call across the llama.cpp/ggml boundary fails with. The engine wraps these in its own
//! errors with the context (the file, the tensor, the phase) a user needs.
use super::guard::Thrown;

/// A failed call into llama.cpp or ggml.
#[derive(Debug, Clone, thiserror::Error)]
pub enum FfiError {
    /// A path handed to C holds a NUL byte.
    #[error("the path contains a NUL byte")]
    NulInPath,
    /// llama.cpp threw a C++ exception, caught at the boundary.
    #[error(transparent)]
    Thrown(#[from] Thrown),
    /// A call returned no object; `logged` is what llama.cpp or ggml logged about it.
    #[error("{logged}")]
    NoResult {
        /// The C function.
        call: &'static str,
        /// Its logged reason (or a placeholder when it logged none).
        logged: String,
    },
    /// A call returned a failure code.
    #[error("{call} returned {code}{}", logged.as_ref().map(|r| format!(": {r}")).unwrap_or_default())]
    Status {
        /// The C function.
        call: &'static str,
        /// What it returned.
        code: i32,
        /// Its logged reason, if any.
        logged: Option<String>,
    },
    /// An argument the C API cannot take (too long, out of range, of the wrong shape).
    #[error("{0}")]
    Argument(String),
    /// A device buffer could not be allocated.
    #[error("the device could not allocate {bytes} bytes")]
    Alloc {
        /// Bytes asked for.
        bytes: usize,
    },
    /// A tensor could not be placed in a buffer.
    #[error("binding {tensor} into the arena failed ({status})")]
    Bind {
        /// The tensor's name.
        tensor: String,
        /// ggml's status.
        status: i32,
    },
    /// ggml could not make a tensor or context it was asked for.
    #[error("{0}")]
    Ggml(String),
    /// A mapped page of a model file could not be read (SIGBUS); the compute that met it ran on
    /// zeros and its results were thrown away.
    #[error(transparent)]
    MappedRead(#[from] super::mapped_fault::MappedReadFailed),
    /// The RPC backend (absent, unreachable, a server that would not start or offers nothing).
    #[error("{0}")]
    Rpc(String),
}

impl FfiError {
    /// A call that returned NULL: llama.cpp's most recent logged reason, else `fallback`.
    pub(crate) fn no_result(call: &'static str, fallback: &str) -> Self {
        FfiError::NoResult {
            call,
            logged: super::log::recent_reason().unwrap_or_else(|| fallback.into()),
        }
    }
}
